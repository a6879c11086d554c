//! kjob-diff-upstream: see the crate docs of `kjob_diff`.

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use futures::StreamExt;
use kjob_diff::compare::RawRun;
use kjob_diff::{case, compare, jobset, kueue, report, run};
use kjob_testkit::addons::Addon;
use kjob_testkit::cluster::JobController;

/// Runs cases under the upstream Job controller and under kjob and compares them.
#[derive(Debug, Parser)]
#[command(args_override_self = true)]
struct Args {
    /// Seed of the generated cases.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Number of generated cases (after the built-in ones).
    #[arg(long, default_value_t = 0)]
    cases: usize,
    /// Run only this case (built-in or generated, `gen-<seed>-<i>`), or with a trailing `*`
    /// every built-in case whose name starts so (`kueue-quota-*`); several, comma-separated.
    #[arg(long)]
    case: Option<String>,
    /// Which Jobs kjob takes on its control plane: `all` (upstream's Job controller off, the
    /// watcher and workers with `--manage-all-jobs`) or `managed-by` (the Jobs name kjob in
    /// `spec.managedBy`, upstream's controller runs beside it and must write nothing to them).
    #[arg(long, value_enum, default_value_t = KjobTakes::All)]
    kjob_takes: KjobTakes,
    /// Cases in flight at once (each on both control planes at the same time).
    #[arg(long, default_value_t = 12)]
    parallel: usize,
    /// Runs a different case gets again (in fresh namespaces): a difference that does not
    /// come back is a race of the machine's timing, reported but not counted.
    #[arg(long, default_value_t = 3)]
    reruns: usize,
    /// Folder of the reports.
    #[arg(long, default_value = "target/diff")]
    out: PathBuf,
    /// Folder of the kjob binaries (kjob-queue, kjob-watcher, kjob-worker, kjob-node-agent).
    #[arg(long, default_value = "target/debug")]
    bin_dir: PathBuf,
}

/// The two ways kjob takes Jobs (docs/ecosystem.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum KjobTakes {
    /// Every Job; upstream's Job controller off.
    All,
    /// The Jobs whose `spec.managedBy` names kjob; upstream's on beside it.
    ManagedBy,
}

/// Runs `cases` on both benches, `parallel` at a time; each case's two runs with their
/// events and writes (read once all ran: later ones of a finished case, from a controller
/// that keeps writing or an event recorder still flushing, count too) and seconds.
/// One case's run on each control plane (upstream, kjob), each with its seconds.
type CaseRuns = ((RawRun, f64), (RawRun, f64));

/// Whether a case belongs to the scenarios checked beside the comparison (Kueue, JobSet).
fn scenario(c: &case::Case) -> bool {
    c.kueue.is_some() || c.jobset.is_some()
}

/// The violations of the Kueue groups and of the JobSet cases' expectations among `runs`, on
/// each control plane.
fn scenario_violations(runs: &[(case::Case, CaseRuns)]) -> Vec<String> {
    let mut out = Vec::new();
    let cases: Vec<case::Case> = runs.iter().map(|(c, _)| c.clone()).collect();
    for (side, pick) in [("upstream", 0), ("kjob", 1)] {
        let side_raws: Vec<&RawRun> =
            runs.iter().map(|(_, (u, k))| if pick == 0 { &u.0 } else { &k.0 }).collect();
        out.extend(kueue::check_groups(side, &cases, &side_raws));
        out.extend(jobset::check(side, &cases, &side_raws));
    }
    out
}

/// Tries of a case whose run failed with an error (an API request the loaded control plane
/// refused or timed out, or an add-on's webhook briefly unreachable) before the suite gives up:
/// each again in fresh namespaces, so one transient error does not end a 7-minute run.
const CASE_ATTEMPTS: usize = 3;
/// Pause before a case's second try (doubled before its third).
const CASE_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs `cases` on both benches, `parallel` at a time; returns, per case, the case as last run
/// (renamed when an error made it run again) with its two runs.
async fn run_all(
    upstream: &run::Bench,
    kjob: &run::Bench,
    cases: &[case::Case],
    parallel: usize,
) -> anyhow::Result<Vec<(case::Case, CaseRuns)>> {
    let total = cases.len();
    let mut raws = futures::stream::iter(cases.iter().enumerate())
        .map(|(i, c)| async move {
            let mut c = c.clone();
            for attempt in 1.. {
                let t = Instant::now();
                let (u, k) = tokio::join!(
                    async { (upstream.run_case(&c).await, t.elapsed().as_secs_f64()) },
                    async { (kjob.run_case(&c).await, t.elapsed().as_secs_f64()) },
                );
                eprintln!(
                    "diff-upstream: [{}/{total}] {}: upstream {:.1} s, kjob {:.1} s",
                    i + 1,
                    c.name,
                    u.1,
                    k.1
                );
                match (u.0, k.0) {
                    (Ok(ur), Ok(kr)) => return anyhow::Ok((i, c, ((ur, u.1), (kr, k.1)))),
                    (ur, kr) => {
                        let side = if ur.is_err() { "upstream" } else { "kjob" };
                        let e = ur.err().or(kr.err()).expect("one side failed");
                        if attempt >= CASE_ATTEMPTS {
                            return Err(e.context(format!(
                                "case {} failed on {side} {attempt} times",
                                c.name
                            )));
                        }
                        eprintln!(
                            "diff-upstream: {} failed on {side} ({e:#}); running it again in fresh \
                             namespaces",
                            c.name
                        );
                        // A pause first, growing: an add-on's webhook restarting or an
                        // overloaded server needs a moment, which an immediate retry lacks.
                        tokio::time::sleep(CASE_RETRY_PAUSE * attempt as u32).await;
                        c = cases[i].rerun_after_error(attempt);
                    }
                }
            }
            unreachable!("the loop returns")
        })
        // Unordered: a long case does not hold back the start of the ones after it.
        .buffer_unordered(parallel.max(1))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<_>>>()?;
    raws.sort_by_key(|(i, _, _)| *i);
    let (uw, kw) = (upstream.writes()?, kjob.writes()?);
    let (ue, ke) = tokio::try_join!(upstream.events(), kjob.events())?;
    Ok(raws
        .into_iter()
        .map(|(_, c, ((mut u, us), (mut k, ks)))| {
            let ns = c.namespace();
            u.writes = uw.get(&ns).cloned().unwrap_or_default();
            k.writes = kw.get(&ns).cloned().unwrap_or_default();
            u.events = ue.get(&ns).cloned().unwrap_or_default();
            k.events = ke.get(&ns).cloned().unwrap_or_default();
            (c, ((u, us), (k, ks)))
        })
        .collect())
}

fn judge_all(runs: Vec<(case::Case, CaseRuns)>) -> Vec<report::CaseResult> {
    runs.into_iter()
        .map(|(c, ((u, us), (k, ks)))| {
            report::judge(&c, compare::observe(&u), compare::observe(&k), (us, ks))
        })
        .collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    // The error as its chain of causes on the last line, without a backtrace: CI keeps only
    // the tail of the output, and a backtrace there hid which case failed and why.
    let code = run().await.unwrap_or_else(|e| {
        eprintln!("diff-upstream: failed: {e:#}");
        2
    });
    std::process::exit(code);
}

/// The whole run; its exit code (1 when a case differs or a Kueue group failed its check).
async fn run() -> anyhow::Result<i32> {
    let Args { seed, cases, case, kjob_takes, parallel, reruns, out, bin_dir } = Args::parse();
    let managed_by = kjob_takes == KjobTakes::ManagedBy;
    let bin_dir = std::fs::canonicalize(&bin_dir)?;
    let cases = case::select(seed, cases, case.as_deref())?;
    let t0 = Instant::now();
    eprintln!("diff-upstream: starting a control plane per Job controller (upstream, kjob)");
    // Kueue beside both control planes only when a case queues its Job there.
    let mut addons = Vec::new();
    if cases.iter().any(|c| c.kueue.is_some()) {
        addons.push(Addon::Kueue);
    }
    // JobSet's controller beside both when a case is a JobSet.
    if cases.iter().any(|c| c.jobset.is_some()) {
        addons.push(Addon::JobSet);
    }
    let (upstream_bench, kjob_bench) = tokio::try_join!(
        run::Bench::start(JobController::Upstream, bin_dir.clone(), addons.clone(), false),
        run::Bench::start(JobController::Kjob, bin_dir.clone(), addons, managed_by),
    )?;
    eprintln!(
        "diff-upstream: control planes up in {:.0} s; {} cases, {parallel} at a time",
        t0.elapsed().as_secs_f64(),
        cases.len()
    );
    let (upstream, kjob) = (&upstream_bench, &kjob_bench);
    let raws = run_all(upstream, kjob, &cases, parallel).await?;
    // Each Kueue group's quota and order, and each JobSet case's expected status, on each
    // control plane (first runs only: a rerun case runs without the rest of its group).
    let mut group_violations = scenario_violations(&raws);
    // A violation runs them again (all Kueue and JobSet cases, in fresh namespaces), as a different case
    // does: one that holds on a rerun was a race of the machine's timing (a loaded 2-core
    // machine can delay one Job's pod past the next one's), reported but not counted.
    let mut group_races = Vec::new();
    for attempt in 1..=reruns {
        if group_violations.is_empty() {
            break;
        }
        let queued: Vec<case::Case> =
            cases.iter().filter(|c| scenario(c)).map(|c| c.rerun_scenario(attempt)).collect();
        eprintln!(
            "diff-upstream: re-running the Kueue and JobSet scenarios ({} violation(s)), attempt {attempt}",
            group_violations.len()
        );
        let now = scenario_violations(&run_all(upstream, kjob, &queued, parallel).await?);
        group_races.append(&mut std::mem::replace(&mut group_violations, now));
    }
    let mut results = judge_all(raws);
    for attempt in 1..=reruns {
        let again: Vec<usize> = (0..results.len())
            .filter(|&i| results[i].verdict == report::Verdict::Different)
            .collect();
        if again.is_empty() {
            break;
        }
        eprintln!("diff-upstream: re-running {} different case(s), attempt {attempt}", again.len());
        let rerun: Vec<case::Case> = again.iter().map(|&i| cases[i].rerun(attempt)).collect();
        let judged = judge_all(run_all(upstream, kjob, &rerun, parallel).await?);
        for (i, mut r) in again.into_iter().zip(judged) {
            let earlier = std::mem::take(&mut results[i].earlier);
            r.earlier = earlier;
            r.earlier.push(report::Attempt::of(&results[i]));
            r.case = cases[i].clone();
            results[i] = r;
        }
    }
    // Where kjob takes only the Jobs naming it, upstream's controller beside it must not have
    // written to any case's namespace (its own writes are elsewhere: none).
    let foreign: Vec<String> = kjob
        .foreign_writes()?
        .into_iter()
        .filter(|(ns, _)| ns.starts_with("diff-"))
        .map(|(ns, w)| format!("{ns}: {w:?}"))
        .collect();
    // Stop both control planes now: the exit below runs no destructors.
    tokio::task::block_in_place(|| drop((upstream_bench, kjob_bench)));
    report::write(&out, &results, seed, t0.elapsed().as_secs_f64())?;
    for r in results.iter().filter(|r| r.verdict == report::Verdict::Different) {
        for (d, _) in r.differences.iter().filter(|(_, a)| a.is_none()) {
            eprintln!(
                "  {} {} {}: upstream {} kjob {}",
                r.case.name, d.part, d.path, d.upstream, d.kjob
            );
        }
    }
    eprintln!(
        "diff-upstream: report in {} ({:.0} s in all)",
        out.join("report.md").display(),
        t0.elapsed().as_secs_f64()
    );
    println!("{}", report::summary(&results));
    if cases.iter().any(scenario) {
        println!(
            "Kueue groups and JobSets (quota held, completed in creation order or preempted by priority, flavors and partial admission applied, evicted while not ready; JobSet statuses as expected; on each control plane): {}",
            if group_violations.is_empty() {
                "held".to_string()
            } else {
                format!("{} violation(s)", group_violations.len())
            }
        );
    }
    let earlier = if group_violations.is_empty() {
        "held on a rerun: a race of the machine's timing"
    } else {
        "an earlier attempt"
    };
    for v in &group_races {
        eprintln!("  ({earlier}) {v}");
    }
    for v in &group_violations {
        eprintln!("  {v}");
    }
    if managed_by {
        println!(
            "kjob took the Jobs naming it in spec.managedBy; upstream's Job controller beside it wrote to {} case namespace(s)",
            foreign.len()
        );
        for f in &foreign {
            eprintln!("  upstream's Job controller wrote in {f}");
        }
    }
    let (_, _, different, _) = report::counts(&results);
    Ok(if different > 0 || !group_violations.is_empty() || !foreign.is_empty() { 1 } else { 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `make diff-upstream` passes `--bin-dir` and `--out` before `DIFF_ARGS`: the user's flags
    /// must win, not be refused as given twice.
    #[test]
    fn a_flag_given_again_overrides_the_first() {
        let a = Args::try_parse_from(["x", "--out", "target/diff", "--out", "/tmp/d"]).unwrap();
        assert_eq!(a.out, PathBuf::from("/tmp/d"));
        let a = Args::try_parse_from(["x", "--cases", "300", "--cases", "5"]).unwrap();
        assert_eq!(a.cases, 5);
    }
}
