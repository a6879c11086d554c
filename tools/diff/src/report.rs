//! target/diff/report.md and report.json, and the summary line.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;
use serde_json::json;

use crate::case::Case;
use crate::compare::{self, Difference, Observed, PARTS};

/// The verdict of one case, or of one part of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// No difference.
    Identical,
    /// Every difference is an accepted one.
    Accepted,
    /// Some difference is neither fixed nor accepted.
    Different,
}

/// One compared case.
#[derive(Debug, Clone, Serialize)]
pub struct CaseResult {
    /// The case as run.
    pub case: Case,
    /// Verdict per part (in [`PARTS`] order) and overall.
    pub parts: Vec<(String, Verdict)>,
    /// The case's verdict.
    pub verdict: Verdict,
    /// Every difference, with the accepted one's name when it is one.
    pub differences: Vec<(Difference, Option<String>)>,
    /// Both runs as compared.
    pub upstream: Observed,
    /// See `upstream`.
    pub kjob: Observed,
    /// Seconds each run took (timing is reported, never a difference).
    pub seconds: (f64, f64),
    /// Earlier attempts of a case that was different and ran again, oldest first.
    pub earlier: Vec<Attempt>,
}

/// An earlier attempt of a case: what differed then.
#[derive(Debug, Clone, Serialize)]
pub struct Attempt {
    /// Its verdict.
    pub verdict: Verdict,
    /// Its differences.
    pub differences: Vec<(Difference, Option<String>)>,
}

impl Attempt {
    /// The attempt `r` was.
    pub fn of(r: &CaseResult) -> Self {
        Self { verdict: r.verdict, differences: r.differences.clone() }
    }
}

fn verdict_of<'a>(ds: impl Iterator<Item = &'a (Difference, Option<String>)>) -> Verdict {
    let mut v = Verdict::Identical;
    for (_, acc) in ds {
        v = match (v, acc) {
            (_, None) => return Verdict::Different,
            _ => Verdict::Accepted,
        };
    }
    v
}

/// Compares the two runs of `case`.
pub fn judge(case: &Case, upstream: Observed, kjob: Observed, seconds: (f64, f64)) -> CaseResult {
    let differences = compare::judge(&upstream, &kjob);
    let parts = PARTS
        .iter()
        .map(|p| (p.to_string(), verdict_of(differences.iter().filter(|(d, _)| d.part == *p))))
        .collect();
    let verdict = verdict_of(differences.iter());
    CaseResult {
        case: case.clone(),
        parts,
        verdict,
        differences,
        upstream,
        kjob,
        seconds,
        earlier: Vec::new(),
    }
}

/// `(N, I, D, A)`: cases, identical, different, accepted.
pub fn counts(results: &[CaseResult]) -> (usize, usize, usize, usize) {
    let n = |v| results.iter().filter(|r| r.verdict == v).count();
    (results.len(), n(Verdict::Identical), n(Verdict::Different), n(Verdict::Accepted))
}

/// The last line the binary prints.
pub fn summary(results: &[CaseResult]) -> String {
    let (n, i, d, a) = counts(results);
    format!("diff-upstream: {n} cases, {i} identical, {d} different, {a} accepted")
}

/// How much later (positive) or earlier kjob reached one kind of state change than upstream,
/// over the cases where both runs reached it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Timing {
    /// The kind of state change (`condition Complete`, `pod 1 created`, ...).
    pub kind: String,
    /// Cases where both runs reached it.
    pub cases: usize,
    /// Median of kjob's time minus upstream's, seconds.
    pub p50_s: f64,
    /// 99th percentile (nearest rank), seconds.
    pub p99_s: f64,
    /// Median time upstream took to reach it after the Job's creation, seconds.
    pub upstream_p50_s: f64,
}

/// Nearest-rank percentile of sorted `xs` (`q` in 0..=1).
fn percentile(xs: &[f64], q: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let rank = ((q * xs.len() as f64).ceil() as usize).clamp(1, xs.len());
    xs[rank - 1]
}

/// Per kind of state change, kjob's delay behind upstream (p50, p99).
pub fn timings(results: &[CaseResult]) -> Vec<Timing> {
    let mut by_kind: BTreeMap<&str, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    for r in results {
        for (kind, u) in &r.upstream.milestones {
            if let Some(k) = r.kjob.milestones.get(kind) {
                let e = by_kind.entry(kind).or_default();
                e.0.push(k - u);
                e.1.push(*u);
            }
        }
    }
    by_kind
        .into_iter()
        .map(|(kind, (mut d, mut u))| {
            d.sort_by(f64::total_cmp);
            u.sort_by(f64::total_cmp);
            Timing {
                kind: kind.to_string(),
                cases: d.len(),
                p50_s: percentile(&d, 0.5),
                p99_s: percentile(&d, 0.99),
                upstream_p50_s: percentile(&u, 0.5),
            }
        })
        .collect()
}

/// Every write `(verb resource)` summed over all cases: (upstream, kjob).
pub fn write_totals(results: &[CaseResult]) -> BTreeMap<String, (u64, u64)> {
    let mut t: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for r in results {
        for (k, n) in &r.upstream.write_counts {
            t.entry(k.clone()).or_default().0 += n;
        }
        for (k, n) in &r.kjob.write_counts {
            t.entry(k.clone()).or_default().1 += n;
        }
    }
    t
}

fn short(v: &serde_json::Value) -> String {
    if v.is_null() { "—".into() } else { format!("`{v}`") }
}

/// The Markdown report.
pub fn markdown(results: &[CaseResult], seed: u64, seconds: f64) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# diff-upstream report\n\nseed {seed}; {}; {seconds:.0} s in all\n",
        summary(results)
    );
    let _ = writeln!(
        md,
        "Compared parts: {} (writes: exact counts of pod creates, deletes and patches; \
         presence of every other verb and resource).\n",
        PARTS.join(", ")
    );
    let _ = writeln!(
        md,
        "## Timing (not compared)\n\nkjob's time minus upstream's to reach each kind of state \
         change, seconds after the Job's creation (positive: kjob later), over the cases where \
         both runs reached it.\n\n| state change | cases | p50 | p99 | upstream p50 |\n|---|---|---|---|---|"
    );
    for t in timings(results) {
        let _ = writeln!(
            md,
            "| {} | {} | {:+.2} | {:+.2} | {:.2} |",
            t.kind, t.cases, t.p50_s, t.p99_s, t.upstream_p50_s
        );
    }
    let _ = writeln!(
        md,
        "\n## API writes, all cases (counts reported; see the writes part for what is compared)\n\n\
         | write | upstream | kjob |\n|---|---|---|"
    );
    for (k, (u, kj)) in write_totals(results) {
        let _ = writeln!(md, "| {k} | {u} | {kj} |");
    }
    let reran: Vec<&CaseResult> = results.iter().filter(|r| !r.earlier.is_empty()).collect();
    if !reran.is_empty() {
        let _ = writeln!(
            md,
            "\n## Re-run after a difference\n\nA different case runs again in fresh namespaces; \
             one whose difference does not come back lost a race of the machine's timing (its \
             verdict is the last attempt's). Differences of the earlier attempts:\n"
        );
        for r in reran {
            let _ = writeln!(
                md,
                "* **{}**: {} earlier attempt(s), now {:?}",
                r.case.name,
                r.earlier.len(),
                r.verdict
            );
            for (n, a) in r.earlier.iter().enumerate() {
                for (d, acc) in a.differences.iter().filter(|(_, acc)| acc.is_none()).take(12) {
                    let _ = writeln!(
                        md,
                        "  * attempt {}: {} {}: upstream {} kjob {}{}",
                        n + 1,
                        d.part,
                        d.path,
                        short(&d.upstream),
                        short(&d.kjob),
                        acc.as_deref().map(|a| format!(" ({a})")).unwrap_or_default()
                    );
                }
            }
        }
    }
    let _ = writeln!(md, "\n## Cases\n");
    let _ = writeln!(md, "| case | {} | verdict | upstream s | kjob s |", PARTS.join(" | "));
    let _ = writeln!(md, "|---|{}---|---|---|", "---|".repeat(PARTS.len()));
    for r in results {
        let parts: Vec<String> =
            r.parts.iter().map(|(_, v)| format!("{v:?}").to_lowercase()).collect();
        let _ = writeln!(
            md,
            "| {} | {} | {:?} | {:.1} | {:.1} |",
            r.case.name,
            parts.join(" | "),
            r.verdict,
            r.seconds.0,
            r.seconds.1
        );
    }
    for r in results.iter().filter(|r| !r.differences.is_empty()) {
        let _ = writeln!(md, "\n## {}\n\n```json\n{}\n```\n", r.case.name, json!(r.case));
        let _ = writeln!(md, "| part | path | upstream | kjob | accepted |\n|---|---|---|---|---|");
        for (d, a) in &r.differences {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} |",
                d.part,
                d.path,
                short(&d.upstream).replace('|', "\\|"),
                short(&d.kjob).replace('|', "\\|"),
                a.as_deref().unwrap_or("")
            );
        }
    }
    md
}

/// Writes report.md and report.json into `dir`.
pub fn write(dir: &Path, results: &[CaseResult], seed: u64, seconds: f64) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("report.md"), markdown(results, seed, seconds))?;
    let (n, i, d, a) = counts(results);
    let writes: BTreeMap<String, serde_json::Value> = write_totals(results)
        .into_iter()
        .map(|(k, (u, kj))| (k, json!({"upstream": u, "kjob": kj})))
        .collect();
    let j = json!({"seed": seed, "cases": n, "identical": i, "different": d, "accepted": a,
        "seconds": seconds, "parts": PARTS,
        "reran": results.iter().filter(|r| !r.earlier.is_empty()).count(), "timing": timings(results), "writes": writes,
        "results": results});
    std::fs::write(dir.join("report.json"), serde_json::to_string_pretty(&j)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&xs, 0.5), 50.0);
        assert_eq!(percentile(&xs, 0.99), 99.0);
        assert_eq!(percentile(&[3.0], 0.99), 3.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
