//! target/diff/report.md and report.json, and the summary line.

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
    CaseResult { case: case.clone(), parts, verdict, differences, upstream, kjob, seconds }
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

fn short(v: &serde_json::Value) -> String {
    if v.is_null() { "—".into() } else { format!("`{v}`") }
}

/// The Markdown report.
pub fn markdown(results: &[CaseResult], seed: u64) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# diff-upstream report\n\nseed {seed}; {}\n", summary(results));
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
pub fn write(dir: &Path, results: &[CaseResult], seed: u64) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("report.md"), markdown(results, seed))?;
    let (n, i, d, a) = counts(results);
    let j = json!({"seed": seed, "cases": n, "identical": i, "different": d, "accepted": a,
        "results": results});
    std::fs::write(dir.join("report.json"), serde_json::to_string_pretty(&j)?)?;
    Ok(())
}
