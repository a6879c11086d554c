//! kjob-bench: starts the whole kjob stack as processes (release binaries) and measures
//! throughput, latency, cost, scale-out and kjob-sim's raw limit in one run; writes a Markdown
//! report and PNG plots.

mod stack;
mod workload;

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use k8s_openapi::api::batch::v1::Job;
use kjob_bench::cli::RunArgs;
use kjob_bench::report::{BenchReport, PhaseResult, Plot, Provenance, render_markdown};
use kjob_bench::{plot, stats};
use tokio::task::JoinSet;

use crate::stack::StackOpts;
use kjob_bench::harness::{NAMESPACE, Recorder, job};

use crate::workload::{Phase, measure_limit, run_phase};

/// Timeouts of the harness's own kube client (watches keep the client's long read timeout).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most points drawn per CDF line.
const CDF_POINTS: usize = 400;

/// Whole-stack benchmark of kjob (issue 8).
#[derive(Debug, Parser)]
#[command(name = "kjob-bench", version, args_override_self = true)]
struct Args {
    #[command(flatten)]
    run: RunArgs,
    /// A small run for smoke tests (overrides every size flag).
    #[arg(long)]
    quick: bool,
    /// Workers of the main (throughput and latency) stack.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Single-pod Jobs of the throughput phase.
    #[arg(long, default_value_t = 5000)]
    jobs: usize,
    /// Completions of the Indexed Job (0 skips it).
    #[arg(long, default_value_t = 20_000)]
    indexed_completions: i32,
    /// Parallelism of the Indexed Job.
    #[arg(long, default_value_t = 500)]
    indexed_parallelism: i32,
    /// How long each simulated pod runs.
    #[arg(long, value_parser = kjob_svc::parse_duration, default_value = "100ms")]
    pod_run_time: Duration,
    /// Single-pod Jobs of the latency phase, created at a steady rate (0 skips it).
    #[arg(long, default_value_t = 600)]
    latency_jobs: usize,
    /// Jobs/s offered in the latency phase; 0 means half the single-pod phase's measured
    /// Jobs/s (at least 1).
    #[arg(long, default_value_t = 0.0)]
    latency_rate: f64,
    /// Worker counts of the scale-out runs, comma-separated (an empty value skips them).
    #[arg(long, value_parser = parse_counts, default_value = "1,2,4")]
    scale_workers: Counts,
    /// Single-pod Jobs per scale-out run.
    #[arg(long, default_value_t = 300)]
    scale_jobs: usize,
    /// Latency kjob-sim adds before every write in the scale-out runs. Large enough that the
    /// API's latency, not this 2-core machine's CPU, bounds what one worker can do: the
    /// question the runs answer is whether adding workers adds throughput when the API
    /// server is slow.
    #[arg(long, value_parser = kjob_svc::parse_duration, default_value = "100ms")]
    write_latency: Duration,
    /// Pods created by the raw sim-limit loop (0 skips it).
    #[arg(long, default_value_t = 4000)]
    limit_pods: u64,
    /// Concurrent clients of the sim-limit loop and of the harness's Job creation.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Deadline of each main-stack phase (a phase that hits it is reported as timed out, with
    /// its rates over what finished); the defaults keep the whole run near 10 minutes.
    #[arg(long, value_parser = kjob_svc::parse_duration, default_value = "180s")]
    phase_timeout: Duration,
    /// Deadline of each scale-out run.
    #[arg(long, value_parser = kjob_svc::parse_duration, default_value = "120s")]
    scale_timeout: Duration,
    /// `spec.managedBy` of the benchmark Jobs (and the controller name given to kjob).
    #[arg(long, default_value = kjob_core::DEFAULT_CONTROLLER_NAME)]
    controller_name: String,
    /// `--kube-qps` of every kjob-worker: the client-side rate limit, not the sim, would
    /// otherwise set the figures (the worker's default is 100).
    #[arg(long, default_value_t = 1000)]
    worker_kube_qps: u32,
    /// `--kube-burst` of every kjob-worker.
    #[arg(long, default_value_t = 2000)]
    worker_kube_burst: u32,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    kjob_svc::init_logging(&args.run.log)?;
    if args.quick {
        args.jobs = 100;
        args.indexed_completions = 400;
        args.indexed_parallelism = 50;
        args.scale_jobs = 60;
        args.latency_jobs = 40;
        args.scale_workers = Counts(vec![1, 2]);
        args.limit_pods = 400;
        args.phase_timeout = Duration::from_secs(60);
        args.scale_timeout = Duration::from_secs(60);
    }
    let report = run(args).await?;
    // The binary's product: where the report is and the verdicts, on stdout.
    for t in kjob_bench::report::targets(&report) {
        println!("{:<70} {:>12}  goal {}", t.what, t.actual, t.goal);
    }
    Ok(())
}

/// A comma-separated list of counts; empty means none.
#[derive(Debug, Clone, PartialEq)]
struct Counts(Vec<usize>);

fn parse_counts(s: &str) -> Result<Counts, String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<usize>().map_err(|e| format!("{p:?}: {e}")))
        .collect::<Result<Vec<_>, _>>()
        .map(Counts)
}

async fn kube_client(sim_url: &str) -> anyhow::Result<kube::Client> {
    let mut config = kube::Config::new(sim_url.parse().context("sim URL")?);
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.write_timeout = Some(CONNECT_TIMEOUT);
    Ok(kube::Client::try_from(config)?)
}

async fn run(args: Args) -> anyhow::Result<BenchReport> {
    let Args {
        run: RunArgs { bin_dir, redis_server, out, service_log, log: _ },
        quick: _,
        workers,
        jobs,
        indexed_completions,
        indexed_parallelism,
        latency_jobs,
        latency_rate,
        pod_run_time,
        scale_workers,
        scale_jobs,
        write_latency,
        limit_pods,
        clients,
        phase_timeout,
        scale_timeout,
        controller_name,
        worker_kube_qps,
        worker_kube_burst,
    } = args;
    let started = Instant::now();
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let ticks = kjob_bench::procfs::clock_ticks();
    let http = reqwest::Client::builder().connect_timeout(CONNECT_TIMEOUT).build()?;
    let mut report = BenchReport { run: Provenance::now(), ..Default::default() };
    let opts = |workers: usize, latency: Duration, dir: &str| StackOpts {
        bin_dir: bin_dir.clone(),
        redis_server: redis_server.clone(),
        run_dir: out.join("run").join(dir),
        workers,
        write_latency: latency,
        controller_name: controller_name.clone(),
        service_log: service_log.clone(),
        worker_args: vec![
            format!("--kube-qps={worker_kube_qps}"),
            format!("--kube-burst={worker_kube_burst}"),
        ],
    };

    if limit_pods > 0 {
        tracing::info!(pods = limit_pods, clients, "measuring kjob-sim's raw write throughput");
        let stack = stack::start(&opts(0, Duration::ZERO, "limit"))?;
        report.limit = Some(measure_limit(&stack.sim_url, &http, limit_pods, clients).await?);
    }

    // Each throughput phase gets a fresh stack, so a phase that timed out leaves no backlog
    // (and no stored objects) behind to slow the next one down.
    // (phase label, first-pod latencies, counted latencies) for the CDF plot.
    let mut samples: Vec<(String, Vec<f64>, Vec<f64>)> = Vec::new();
    let mut main_phases: Vec<(&str, Phase)> = Vec::new();
    // `n` single-pod Jobs named `<prefix>-00000`, `<prefix>-00001`, ….
    let single_pod_jobs = |prefix: &str, n: usize| -> Vec<Job> {
        let make =
            |i| job(&format!("{prefix}-{i:05}"), Some(&controller_name), 1, 1, false, pod_run_time);
        (0..n).map(make).collect()
    };
    if jobs > 0 {
        let name = format!("{jobs} single-pod Jobs");
        let phase = Phase::burst(name, single_pod_jobs("single", jobs), clients, phase_timeout);
        main_phases.push(("main-single", phase));
    }
    if indexed_completions > 0 {
        let j = job(
            "indexed",
            Some(&controller_name),
            indexed_completions,
            indexed_parallelism,
            true,
            pod_run_time,
        );
        let name = format!(
            "Indexed Job, {indexed_completions} completions, parallelism {indexed_parallelism}"
        );
        let phase = Phase::burst(name, vec![j], 1, phase_timeout);
        main_phases.push(("main-indexed", phase));
    }
    for (dir, phase) in main_phases {
        tracing::info!(workers, phase = %phase.name, "main stack: throughput and latency");
        let (mut r, first, counted) =
            run_on_fresh_stack(&opts(workers, Duration::ZERO, dir), &http, ticks, phase).await?;
        r.workers = workers;
        let label = if dir == "main-single" { "single-pod Jobs" } else { "Indexed Job" };
        samples.push((label.to_string(), first, counted));
        if dir == "main-single" {
            report.single = Some(r);
        } else {
            report.indexed = Some(r);
        }
    }

    if latency_jobs > 0 {
        let rate = if latency_rate > 0.0 {
            latency_rate
        } else {
            report.single.as_ref().map_or(1.0, |s| (s.counts.jobs_per_sec() / 2.0).max(1.0))
        };
        report.latency_rate = rate;
        let name = format!("{latency_jobs} single-pod Jobs at {rate:.1}/s");
        // The creation alone takes jobs/rate; the deadline covers it plus the drain.
        let timeout = phase_timeout + Duration::from_secs_f64(latency_jobs as f64 / rate);
        let list = single_pod_jobs("paced", latency_jobs);
        let phase = Phase { pace: Some(rate), ..Phase::burst(name, list, clients, timeout) };
        tracing::info!(workers, phase = %phase.name, "main stack: latency at a steady rate");
        let o = opts(workers, Duration::ZERO, "main-latency");
        let (mut r, first, counted) = run_on_fresh_stack(&o, &http, ticks, phase).await?;
        r.workers = workers;
        samples.push((format!("single-pod Jobs at {rate:.1}/s"), first, counted));
        report.latency = Some(r);
    }

    for &w in &scale_workers.0 {
        tracing::info!(workers = w, ?write_latency, "scale-out run");
        let name = format!("scale-out: {scale_jobs} Jobs, {w} worker(s)");
        let phase =
            Phase::burst(name, single_pod_jobs("scale", scale_jobs), clients, scale_timeout);
        let o = opts(w, write_latency, &format!("scale-{w}"));
        let (mut r, _, _) = run_on_fresh_stack(&o, &http, ticks, phase).await?;
        r.workers = w;
        r.write_latency_ms = write_latency.as_millis() as u64;
        report.scale.push(r);
    }

    report.plots = draw_plots(&out, &report, &samples)?;
    report.total_secs = started.elapsed().as_secs_f64();
    let md = out.join("report.md");
    std::fs::write(&md, render_markdown(&report))
        .with_context(|| format!("writing {}", md.display()))?;
    tracing::info!(report = %md.display(), secs = report.total_secs, "benchmark done");
    Ok(report)
}

/// Starts a stack for `o`, watches it, runs `phase` on it and stops it: the figures and the raw
/// latency samples (first-pod, counted).
async fn run_on_fresh_stack(
    o: &StackOpts,
    http: &reqwest::Client,
    ticks: f64,
    phase: Phase,
) -> anyhow::Result<(PhaseResult, Vec<f64>, Vec<f64>)> {
    let mut stack = stack::start(o)?;
    let client = kube_client(&stack.sim_url).await?;
    let rec = Recorder::default();
    let mut watches = JoinSet::new();
    rec.start(client.clone(), Some(NAMESPACE), &mut watches).await?;
    let out = run_phase(&mut stack, &client, &rec, http, ticks, phase).await;
    watches.abort_all();
    out
}

fn draw_plots(
    out: &std::path::Path,
    r: &BenchReport,
    samples: &[(String, Vec<f64>, Vec<f64>)],
) -> anyhow::Result<Vec<Plot>> {
    let mut plots = Vec::new();
    if !r.scale.is_empty() {
        let measured: Vec<(f64, f64)> =
            r.scale.iter().map(|p| (p.workers as f64, p.counts.jobs_per_sec())).collect();
        let base = r.scale.iter().find(|p| p.workers == 1).map(|p| p.counts.jobs_per_sec());
        let ideal: Vec<(f64, f64)> =
            base.map(|b| measured.iter().map(|&(w, _)| (w, w * b)).collect()).unwrap_or_default();
        let x_max = measured.iter().map(|p| p.0).fold(0.0, f64::max) + 1.0;
        let y_max = measured.iter().chain(ideal.iter()).map(|p| p.1).fold(0.0, f64::max) * 1.1;
        plot::line_plot(
            &out.join("throughput-vs-workers.png"),
            x_max,
            y_max,
            &[measured.clone(), ideal],
        )?;
        plots.push(Plot {
            file: "throughput-vs-workers.png".into(),
            caption: format!(
                "x: workers (0 to {x_max:.0}, grid every {:.1}); y: single-pod Jobs finished/s (0 to {y_max:.1}, grid every {:.1}). \
                 Blue: measured; red: linear scaling from 1 worker. Points: {}.",
                x_max / 10.0,
                y_max / 10.0,
                measured.iter().map(|(w, j)| format!("{w:.0} -> {j:.1}")).collect::<Vec<_>>().join(", ")
            ),
        });
    }
    let mut series = Vec::new();
    let mut names = Vec::new();
    let colours = ["blue", "red", "green", "grey"];
    // With a paced phase, plot it alone: the burst phases' backlog (tens of seconds) would
    // squash its sub-second curve against the axis.
    let paced = r.latency.as_ref().map(|_| samples.len().saturating_sub(1));
    for (i, (phase, first, counted)) in samples.iter().enumerate() {
        if paced.is_some_and(|p| p != i) {
            continue;
        }
        if first.len() > 1 {
            names
                .push(format!("{}: Job created -> first pod ({phase})", colours[series.len() % 4]));
            series.push(stats::cdf_points(first, CDF_POINTS));
        }
        if !counted.is_empty() {
            names.push(format!("{}: pod finished -> counted ({phase})", colours[series.len() % 4]));
            series.push(stats::cdf_points(counted, CDF_POINTS));
        }
    }
    if !series.is_empty() {
        let x_max = series.iter().flatten().map(|p| p.0).fold(0.0, f64::max) * 1.05;
        plot::line_plot(&out.join("latency-cdf.png"), x_max, 1.0, &series)?;
        plots.push(Plot {
            file: "latency-cdf.png".into(),
            caption: format!(
                "Latency CDF. x: seconds (0 to {x_max:.2}, grid every {:.3} s); y: fraction of samples (grid every 0.1). {}.",
                x_max / 10.0,
                names.join("; ")
            ),
        });
    }
    Ok(plots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_workers_list_may_be_empty() {
        assert_eq!(parse_counts("1,2,4"), Ok(Counts(vec![1, 2, 4])));
        assert_eq!(parse_counts(""), Ok(Counts(vec![])));
        assert!(parse_counts("1,x").is_err());
        let args = Args::try_parse_from(["kjob-bench", "--scale-workers", ""]).unwrap();
        assert_eq!(args.scale_workers, Counts(vec![]));
    }
}
