//! kjob-bench-upstream: kjob side by side with kube-controller-manager's Job controller on a
//! real control plane (issue 16). Every run — one configuration, one workload — gets a fresh
//! control plane; configurations interleave and the second pass runs them in reverse. Writes
//! `upstream.md`, `upstream.json` and PNG charts into `--out`.

mod run;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use kjob_bench::cli::RunArgs;
use kjob_bench::upstream::{
    self, BASELINE, Chart, ConfigFigures, Configuration, UpstreamReport, Workload,
};
use kjob_bench::{chart, stats};
use serde_json::json;
use tracing::Instrument;

use crate::run::{Env, Spec};
use kjob_bench::harness::Observed;

/// Most points drawn per CDF line.
const CDF_POINTS: usize = 300;
/// Seed of the bootstrap (fixed: the same runs give the same intervals).
const BOOTSTRAP_SEED: u64 = 0x6b6a_6f62;

/// kjob vs upstream's Job controller on a real kube-apiserver.
#[derive(Debug, Parser)]
#[command(name = "kjob-bench-upstream", version, args_override_self = true)]
struct Args {
    #[command(flatten)]
    run: RunArgs,
    /// Folder of etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl;
    /// unset runs cluster/build.sh (which builds them once and caches them).
    #[arg(long)]
    cluster_bin_dir: Option<PathBuf>,
    /// One pass with small workloads (200 burst Jobs, an Indexed Job of 500 with parallelism
    /// 50, 60 steady Jobs); explicit size flags still win.
    #[arg(long)]
    quick: bool,
    /// Configurations in first-pass order: a (upstream defaults), b (upstream tuned),
    /// bj (upstream tuned talking JSON), b2 (upstream with the total budget of kjob's two
    /// workers), c (kjob, 1 worker), d (kjob, 2 workers); m<N> (kjob, N workers each at
    /// upstream's default budget: QPS 20, burst 30, 5 syncs) and mt<N> (N such workers sharing
    /// one such budget), N from 1 to 16 (`make bench-scale`); f1 and cf (m1 and c with
    /// kjob-queue's `--lease-order fifo`, fairness off: `make bench-fairness`).
    #[arg(long, value_delimiter = ',', default_value = "a,c,b,d,b2,bj")]
    configs: Vec<String>,
    /// Passes; even passes run the configurations in reverse (default 4, 1 with --quick): four
    /// runs per configuration and workload are what the bootstrap intervals need to resolve a
    /// 10 % difference on two cores.
    #[arg(long)]
    passes: Option<usize>,
    /// Workloads to run: burst, indexed, steady, flood (`make bench-fairness`).
    #[arg(long, value_delimiter = ',', default_value = "burst,indexed,steady")]
    workloads: Vec<String>,
    /// Single-pod Jobs created at once (default 2000; 200 with --quick).
    #[arg(long)]
    burst_jobs: Option<usize>,
    /// Concurrent clients creating the burst's Jobs.
    #[arg(long, default_value_t = 8)]
    creators: usize,
    /// Completions of the Indexed Job (default 5000; 500 with --quick).
    #[arg(long)]
    indexed_completions: Option<i32>,
    /// Parallelism of the Indexed Job (default 500; 50 with --quick).
    #[arg(long)]
    indexed_parallelism: Option<i32>,
    /// Single-pod Jobs created at a steady rate (default 300; 60 with --quick).
    #[arg(long)]
    steady_jobs: Option<usize>,
    /// Single-pod Jobs the flood workload's flooding namespace creates at once (default 2000;
    /// 300 with --quick).
    #[arg(long)]
    flood_jobs: Option<usize>,
    /// Quiet namespaces of the flood workload, each creating a Job every --quiet-every until
    /// the flood has drained.
    #[arg(long, default_value_t = 10)]
    quiet_namespaces: usize,
    /// How often each quiet namespace creates a Job during the flood. At upstream's default
    /// budget (QPS 20) a Job controller finishes about 3.3 single-pod Jobs/s; ten namespaces
    /// every 2 s would offer 5 Jobs/s by themselves, more than the whole budget, and no
    /// controller could keep their waits bounded. Every 10 s they offer 1 Job/s.
    #[arg(long, value_parser = kjob_svc::parse_duration, default_value = "10s")]
    quiet_every: Duration,
    /// Jobs/s of the steady workload; 0 means half of (b)'s Jobs/s in the first burst run.
    #[arg(long, default_value_t = 0.0)]
    steady_rate: f64,
    /// How long each pod runs.
    #[arg(long, value_parser = kjob_svc::parse_duration, default_value = "100ms")]
    pod_run_time: Duration,
    /// Fake nodes.
    #[arg(long, default_value_t = 3)]
    nodes: u32,
    /// Deadline of each run (default 1200s: upstream at its defaults needs about 10 minutes for
    /// the 2,000-Job burst on 2 cores; 180s with --quick); a run that hits it is reported as
    /// timed out, with its rates over what finished.
    #[arg(long, value_parser = kjob_svc::parse_duration)]
    run_timeout: Option<Duration>,
    /// `--kube-qps` of each kjob-worker.
    #[arg(long, default_value_t = 200)]
    worker_kube_qps: u32,
    /// `--kube-burst` of each kjob-worker.
    #[arg(long, default_value_t = 400)]
    worker_kube_burst: u32,
    /// Profile kube-apiserver's CPU through every run (Go's pprof, in 5 s pieces kept in the
    /// run's cluster folder) and report where it went; `false` leaves profiling off.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    apiserver_profile: bool,
    /// Run kjob secured as deploy/ runs it: kjob-queue over mTLS, sealed views with a view key,
    /// Redis over TLS with kjob's ACL user; `false` runs every link in plaintext
    /// (`--insecure-no-auth`, plain Redis).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    kjob_secure: bool,
}

/// Sizes after `--quick` and the explicit flags.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    burst_jobs: usize,
    indexed_completions: i32,
    indexed_parallelism: i32,
    steady_jobs: usize,
    flood_jobs: usize,
    passes: usize,
    timeout: Duration,
}

fn sizes(a: &Args) -> Sizes {
    let q = a.quick;
    Sizes {
        burst_jobs: a.burst_jobs.unwrap_or(if q { 200 } else { 2000 }),
        indexed_completions: a.indexed_completions.unwrap_or(if q { 500 } else { 5000 }),
        indexed_parallelism: a.indexed_parallelism.unwrap_or(if q { 50 } else { 500 }),
        steady_jobs: a.steady_jobs.unwrap_or(if q { 60 } else { 300 }),
        flood_jobs: a.flood_jobs.unwrap_or(if q { 300 } else { 2000 }),
        passes: a.passes.unwrap_or(if q { 1 } else { 4 }),
        timeout: a.run_timeout.unwrap_or(Duration::from_secs(if q { 180 } else { 1200 })),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    kjob_svc::init_logging(&args.run.log)?;
    let report = bench(args).await?;
    // The binary's product on stdout: the figures and the verdicts.
    println!("{}", summary(&report));
    Ok(())
}

async fn bench(args: Args) -> anyhow::Result<UpstreamReport> {
    let sz = sizes(&args);
    let Args {
        run: RunArgs { bin_dir, redis_server, out, service_log, log: _ },
        cluster_bin_dir,
        quick: _,
        configs,
        passes: _,
        workloads,
        burst_jobs: _,
        creators,
        indexed_completions: _,
        indexed_parallelism: _,
        steady_jobs: _,
        flood_jobs: _,
        quiet_namespaces,
        quiet_every,
        steady_rate: steady_flag,
        pod_run_time,
        nodes,
        run_timeout: _,
        worker_kube_qps,
        worker_kube_burst,
        apiserver_profile,
        kjob_secure,
    } = args;
    let configs: Vec<Configuration> = configs
        .iter()
        .map(|id| {
            Configuration::by_id(id.trim(), worker_kube_qps, worker_kube_burst).with_context(|| {
                format!("unknown configuration {id:?} (a, b, bj, b2, c, d, m<N>, mt<N>, f1, cf)")
            })
        })
        .collect::<anyhow::Result<_>>()?;
    let workloads: Vec<Workload> = workloads
        .iter()
        .map(|w| {
            Workload::parse(w.trim())
                .with_context(|| format!("unknown workload {w:?} (burst, indexed, steady, flood)"))
        })
        .collect::<anyhow::Result<_>>()?;
    for b in ["kjob-queue", "kjob-watcher", "kjob-worker", "kjob-sim", "kjob-node-agent"] {
        if !bin_dir.join(b).is_file() {
            bail!("{} lacks {b}: build with `make bench-upstream`", bin_dir.display());
        }
    }
    let cluster_bins = match cluster_bin_dir {
        Some(d) => d,
        None => tokio::task::block_in_place(kjob_testkit::cluster::build_binaries)?,
    };
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    // Absolute, so the kubeconfigs' certificate paths hold from any working directory.
    let out = out.canonicalize()?;
    let bin_dir = bin_dir.canonicalize()?;
    let env = Env {
        bin_dir,
        cluster_bins,
        redis_server,
        nodes,
        pod_run_time,
        timeout: sz.timeout,
        service_log,
        ticks: kjob_bench::procfs::clock_ticks(),
        apiserver_profile,
        kjob_secure,
    };
    let started = Instant::now();
    let mut report = UpstreamReport {
        run: kjob_bench::report::Provenance::now(),
        kubernetes_version: kjob_testkit::cluster::KUBERNETES_VERSION.into(),
        passes: sz.passes,
        configurations: configs.clone(),
        ..Default::default()
    };
    report.workloads = BTreeMap::from([
        (
            "burst".into(),
            json!(format!(
                "{} single-pod Jobs created at once by {creators} clients",
                sz.burst_jobs
            )),
        ),
        (
            "indexed".into(),
            json!(format!(
                "one Indexed Job, {} completions, parallelism {}",
                sz.indexed_completions, sz.indexed_parallelism
            )),
        ),
        ("steady".into(), json!(format!("{} single-pod Jobs at a steady rate", sz.steady_jobs))),
        (
            "flood".into(),
            json!(format!(
                "{} single-pod Jobs created at once in one namespace by {creators} clients, while \
                 {quiet_namespaces} other namespaces each create one every {:.1} s until it has drained",
                sz.flood_jobs,
                quiet_every.as_secs_f64()
            )),
        ),
        (
            "pods".into(),
            json!(format!("run {} ms each on {nodes} fake nodes", pod_run_time.as_millis())),
        ),
        (
            "kjob security".into(),
            json!(if env.kjob_secure {
                "as deployed: kjob-queue over mTLS, sealed views, Redis over TLS as kjob's ACL user"
            } else {
                "off: plaintext gRPC (--insecure-no-auth) and plain Redis"
            }),
        ),
    ]);
    let slots = upstream::schedule(configs.len(), &workloads, sz.passes);
    // (config id, workload) → what the harness observed, for the latency charts.
    let mut observed: Vec<(String, Workload, Observed)> = Vec::new();
    let mut rate: Option<f64> = None;
    for (i, slot) in slots.iter().enumerate() {
        let cfg = &configs[slot.config];
        let spec = match slot.workload {
            Workload::Burst => Spec::Burst { jobs: sz.burst_jobs, creators },
            Workload::Indexed => Spec::Indexed {
                completions: sz.indexed_completions,
                parallelism: sz.indexed_parallelism,
            },
            Workload::Flood => {
                Spec::Flood { jobs: sz.flood_jobs, creators, quiet_namespaces, quiet_every }
            }
            Workload::Steady => {
                let r = *rate.get_or_insert_with(|| {
                    let bursts = |id: Option<&str>| -> Vec<f64> {
                        report
                            .runs
                            .iter()
                            .filter(|r| r.workload == "burst" && id.is_none_or(|id| r.config == id))
                            .map(|r| r.counts.jobs_per_sec())
                            .collect()
                    };
                    let base = bursts(Some(BASELINE)).first().copied();
                    upstream::steady_rate(steady_flag, base, &bursts(None))
                });
                report.steady_rate = Some(r);
                Spec::Steady { jobs: sz.steady_jobs, rate: r }
            }
        };
        let name = format!("{}-{}-{}", slot.pass, slot.workload.name(), cfg.id);
        let dir = out.join("upstream-runs").join(&name);
        let span = tracing::info_span!("run", n = i + 1, of = slots.len(), run = %name);
        tracing::info!(parent: &span, config = %cfg.label, "starting");
        match run::run(&env, cfg, spec, slot.pass, &dir).instrument(span.clone()).await {
            Ok((fig, obs)) => {
                tracing::info!(
                    parent: &span,
                    pods_per_s = fig.counts.pods_per_sec(),
                    jobs_per_s = fig.counts.jobs_per_sec(),
                    timed_out = fig.counts.timed_out,
                    "done"
                );
                report.runs.push(fig);
                observed.push((cfg.id.clone(), slot.workload, obs));
            }
            // One broken run (a control plane that did not start) should not cost the others.
            Err(e) => {
                tracing::error!(parent: &span, error = format!("{e:#}"), "run failed; going on")
            }
        }
    }
    report.figures = upstream::summarize_all(&configs, &report.runs);
    report.ratios = upstream::ratios(&report.figures);
    let per_pass = upstream::ratios_per_pass(&configs, &report.runs);
    report.intervals = upstream::bootstrap_intervals(
        &configs,
        &report.runs,
        upstream::BOOTSTRAP_RESAMPLES,
        BOOTSTRAP_SEED,
    );
    report.verdicts = upstream::verdicts(&report.ratios, &per_pass, &report.intervals);
    report.charts = draw_charts(&out, &report.figures, &observed).unwrap_or_else(|e| {
        tracing::error!(error = %e, "charts not drawn");
        Vec::new()
    });
    report.total_secs = started.elapsed().as_secs_f64();
    let md = out.join("upstream.md");
    std::fs::write(&md, upstream::render_markdown(&report))
        .with_context(|| format!("writing {}", md.display()))?;
    let js = out.join("upstream.json");
    std::fs::write(&js, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", js.display()))?;
    tracing::info!(report = %md.display(), json = %js.display(), "benchmark done");
    if report.runs.is_empty() {
        bail!("every run failed (see the log above)");
    }
    Ok(report)
}

fn draw_charts(
    out: &Path,
    figures: &[ConfigFigures],
    observed: &[(String, Workload, Observed)],
) -> anyhow::Result<Vec<Chart>> {
    let mut charts = Vec::new();
    type Bar = (&'static str, &'static str, &'static str, fn(&ConfigFigures) -> Option<f64>);
    let bars: [Bar; 6] = [
        ("upstream-pods-per-s.png", "Pods created per second (burst)", "pods/s", |f| f.pods_per_s),
        ("upstream-jobs-per-s.png", "Jobs finished per second (burst)", "Jobs/s", |f| f.jobs_per_s),
        ("upstream-indexed-complete.png", "Indexed Job: created to Complete", "seconds", |f| {
            f.indexed_time_to_complete_secs
        }),
        (
            "upstream-apiserver-etcd-cpu.png",
            "kube-apiserver + etcd CPU per 1,000 pods",
            "CPU seconds",
            |f| f.apiserver_etcd_cpu_per_1k_pods,
        ),
        (
            "upstream-bytes-per-pod.png",
            "Bytes kube-apiserver sent per pod (responses + watch events)",
            "KiB per pod",
            |f| f.bytes_sent_per_pod.map(|b| b / 1024.0),
        ),
        (
            "upstream-controller-cpu.png",
            "Marginal Job controller CPU per 1,000 pods",
            "CPU seconds",
            |f| f.marginal_controller_cpu_per_1k_pods,
        ),
    ];
    for (file, title, unit, get) in bars {
        let values: Vec<(String, f64)> = figures
            .iter()
            .filter_map(|f| get(f).map(|v| (format!("({}) {}", f.id, f.label), v)))
            .collect();
        if values.is_empty() {
            continue;
        }
        chart::bar_chart(&out.join(file), title, unit, &values)?;
        charts.push(Chart {
            file: file.into(),
            caption: format!(
                "{title}, {unit}: {}.",
                values
                    .iter()
                    .map(|(n, v)| format!("{n} {}", chart::format_value(*v)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        });
    }
    type Cdf = (&'static str, &'static str, fn(&Observed) -> &Vec<f64>);
    let cdfs: [Cdf; 2] = [
        ("upstream-first-pod-cdf.png", "Job created to first pod, steady rate", |o| &o.first_pod),
        ("upstream-counted-cdf.png", "Pod finished to counted in Job status, steady rate", |o| {
            &o.counted
        }),
    ];
    for (file, title, get) in cdfs {
        let mut series = Vec::new();
        for f in figures {
            let mut samples: Vec<f64> = observed
                .iter()
                .filter(|(id, w, _)| *id == f.id && *w == Workload::Steady)
                .flat_map(|(_, _, o)| get(o).iter().copied())
                .collect();
            samples.sort_by(f64::total_cmp);
            if !samples.is_empty() {
                series.push((
                    format!("({}) {}", f.id, f.label),
                    stats::cdf_points(&samples, CDF_POINTS),
                ));
            }
        }
        if series.is_empty() {
            continue;
        }
        chart::cdf_chart(&out.join(file), title, "latency (seconds)", &series)?;
        charts.push(Chart {
            file: file.into(),
            caption: format!("{title}: cumulative distribution per configuration."),
        });
    }
    Ok(charts)
}

/// What the binary prints: per configuration the headline figures, then the verdicts.
fn summary(r: &UpstreamReport) -> String {
    let mut s = String::new();
    let opt = |v: Option<f64>, d: usize| v.map_or("-".to_string(), |v| format!("{v:.d$}"));
    s.push_str(&format!(
        "{:<26} {:>8} {:>8} {:>9} {:>9} {:>10} {:>9} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9}\n",
        "configuration",
        "pods/s",
        "Jobs/s",
        "p99 1st",
        "p99 cnt",
        "indexed s",
        "req/pod",
        "B/pod",
        "api+etcd",
        "ctrl CPU",
        "machine",
        "quiet p99",
        "drain s"
    ));
    for f in &r.figures {
        s.push_str(&format!(
            "{:<26} {:>8} {:>8} {:>9} {:>9} {:>10} {:>9} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9}\n",
            format!("({}) {}", f.id, f.label),
            opt(f.pods_per_s, 1),
            opt(f.jobs_per_s, 1),
            opt(f.first_pod_p99, 3),
            opt(f.counted_p99, 3),
            opt(f.indexed_time_to_complete_secs, 1),
            opt(f.requests_per_pod_total, 2),
            opt(f.bytes_sent_per_pod, 0),
            opt(f.apiserver_etcd_cpu_per_1k_pods, 1),
            opt(f.marginal_controller_cpu_per_1k_pods, 1),
            opt(f.machine_cpu_per_1k_pods, 1),
            opt(f.flood_quiet_first_pod_p99, 2),
            opt(f.flood_drain_secs, 1),
        ));
    }
    s.push_str(
        "(p99 1st/cnt: steady rate, pooled, s; api+etcd, ctrl (marginal) and machine: CPU s per \
         1,000 pods; quiet p99: the flood's quiet namespaces' Job created → first pod, s)\n\n",
    );
    for v in &r.verdicts {
        let interval = v.interval.map_or(String::new(), |(lo, hi)| format!("[{lo:.2}–{hi:.2}]"));
        s.push_str(&format!(
            "{:<40} {:>8} {:<13} goal {:<7} {}\n",
            v.key,
            opt(v.ratio, 2),
            interval,
            v.goal,
            match (v.met, v.decided) {
                (_, false) => "undecided",
                (true, true) => "met",
                (false, true) => "not met",
            }
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_shrinks_sizes_and_explicit_flags_win() {
        let a = Args::try_parse_from(["x", "--quick", "--burst-jobs=50"]).unwrap();
        let s = sizes(&a);
        assert_eq!(
            (s.burst_jobs, s.indexed_completions, s.steady_jobs, s.passes),
            (50, 500, 60, 1)
        );
        let a = Args::try_parse_from(["x"]).unwrap();
        let s = sizes(&a);
        assert_eq!((s.burst_jobs, s.indexed_completions, s.indexed_parallelism), (2000, 5000, 500));
        assert_eq!((s.steady_jobs, s.passes), (300, 4));
        assert_eq!(a.configs, ["a", "c", "b", "d", "b2", "bj"]);
    }

    /// `make bench-upstream` passes `--bin-dir` and `--out` before `BENCH_ARGS`: the user's
    /// flags must win, not be refused as given twice.
    #[test]
    fn a_flag_given_again_overrides_the_first() {
        let a =
            Args::try_parse_from(["x", "--out", "target/bench", "--out", "/tmp/b", "--passes=1"])
                .unwrap();
        assert_eq!(a.run.out, std::path::PathBuf::from("/tmp/b"));
        let a =
            Args::try_parse_from(["x", "--bin-dir", "target/release", "--bin-dir", "/opt/kjob"])
                .unwrap();
        assert_eq!(a.run.bin_dir, std::path::PathBuf::from("/opt/kjob"));
    }
}
