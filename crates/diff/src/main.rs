//! kjob-diff-upstream: see the crate docs of `kjob_diff`.

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use kjob_diff::{case, compare, report, run};
use kjob_testkit::cluster::JobController;

/// Runs cases under the upstream Job controller and under kjob and compares them.
#[derive(Debug, Parser)]
struct Args {
    /// Seed of the generated cases.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Number of generated cases (after the built-in ones).
    #[arg(long, default_value_t = 0)]
    cases: usize,
    /// Run only this case (built-in or generated, `gen-<seed>-<i>`).
    #[arg(long)]
    case: Option<String>,
    /// Folder of the reports.
    #[arg(long, default_value = "target/diff")]
    out: PathBuf,
    /// Folder of the kjob binaries (kjob-queue, kjob-watcher, kjob-worker, kjob-node-agent).
    #[arg(long, default_value = "target/debug")]
    bin_dir: PathBuf,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let Args { seed, cases, case, out, bin_dir } = Args::parse();
    let bin_dir = std::fs::canonicalize(&bin_dir)?;
    let cases = case::select(seed, cases, case.as_deref())?;
    let mut observed = Vec::new();
    for mode in [JobController::Upstream, JobController::Kjob] {
        let name = run::mode_name(mode);
        eprintln!("diff-upstream: starting a control plane with the {name} Job controller");
        let bench = run::Bench::start(mode, &bin_dir).await?;
        let mut runs = Vec::new();
        for c in &cases {
            let t = Instant::now();
            let raw = bench.run_case(c).await?;
            let secs = t.elapsed().as_secs_f64();
            eprintln!("diff-upstream: {name}: {} in {secs:.1} s", c.name);
            runs.push((compare::observe(&raw), secs));
        }
        observed.push(runs);
    }
    let kjob = observed.pop().unwrap_or_default();
    let upstream = observed.pop().unwrap_or_default();
    let results: Vec<_> = cases
        .iter()
        .zip(upstream)
        .zip(kjob)
        .map(|((c, (u, us)), (k, ks))| report::judge(c, u, k, (us, ks)))
        .collect();
    report::write(&out, &results, seed)?;
    for r in results.iter().filter(|r| r.verdict == report::Verdict::Different) {
        for (d, _) in r.differences.iter().filter(|(_, a)| a.is_none()) {
            eprintln!(
                "  {} {} {}: upstream {} kjob {}",
                r.case.name, d.part, d.path, d.upstream, d.kjob
            );
        }
    }
    eprintln!("diff-upstream: report in {}", out.join("report.md").display());
    println!("{}", report::summary(&results));
    let (_, _, different, _) = report::counts(&results);
    std::process::exit(if different > 0 { 1 } else { 0 });
}
