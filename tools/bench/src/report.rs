//! The benchmark's results as plain data, the issue-8 targets judged against them, and the
//! Markdown report.

use std::fmt::Write;

use crate::harness::Counts;
use crate::stats::{Summary, rate};

/// Resource use of one process over a run.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessUsage {
    /// Process name (`kjob-worker-1`, `redis-server`, …).
    pub name: String,
    /// CPU seconds (user + system) used during the phase.
    pub cpu_secs: f64,
    /// Peak resident set size since the process started, in bytes.
    pub peak_rss: u64,
}

/// The figures of one workload run on one stack configuration.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PhaseResult {
    /// What ran ("5000 single-pod Jobs").
    pub name: String,
    /// kjob-worker processes.
    pub workers: usize,
    /// Latency kjob-sim added before every write, in milliseconds.
    pub write_latency_ms: u64,
    /// Jobs submitted and finished, pods created, and in how long.
    pub counts: Counts,
    /// Job created → its first pod created, seconds.
    pub first_pod_latency: Option<Summary>,
    /// Pod finished → counted in its Job's status, seconds.
    pub counted_latency: Option<Summary>,
    /// API requests seen by kjob-sim from every client: (verb, resource, count).
    pub api_all: Vec<(String, String, u64)>,
    /// API requests the workers made: (verb, resource, count).
    pub api_workers: Vec<(String, String, u64)>,
    /// Job syncs run by the workers.
    pub syncs: u64,
    /// Redis commands by name during the phase.
    pub redis_commands: Vec<(String, u64)>,
    /// CPU and memory of each process.
    pub processes: Vec<ProcessUsage>,
    /// Errors of the harness's own Job and Pod watches during the run (each followed by a
    /// re-list); non-zero means its timestamps may be late.
    pub watch_errors: u64,
}

impl PhaseResult {
    /// Worker API calls per pod created.
    pub fn worker_calls_per_pod(&self) -> f64 {
        rate(self.api_workers.iter().map(|a| a.2).sum(), self.counts.pods_created as f64)
    }
    /// Redis commands per Job sync (commandstats also counts commands run inside scripts).
    pub fn redis_per_sync(&self) -> f64 {
        rate(self.redis_commands.iter().map(|c| c.1).sum(), self.syncs as f64)
    }
    /// Lua script calls (`evalsha`, `eval`) per Job sync: the queue's round trips to Redis.
    pub fn scripts_per_sync(&self) -> f64 {
        let scripts = self
            .redis_commands
            .iter()
            .filter(|c| c.0 == "evalsha" || c.0 == "eval")
            .map(|c| c.1)
            .sum();
        rate(scripts, self.syncs as f64)
    }
}

/// kjob-sim's raw write throughput, measured with a direct create-pods loop.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LimitResult {
    /// Concurrent clients.
    pub clients: usize,
    /// Pods created.
    pub pods: u64,
    /// Failed requests.
    pub errors: u64,
    /// Seconds the loop took.
    pub secs: f64,
}

impl LimitResult {
    /// Pods created per second.
    pub fn pods_per_sec(&self) -> f64 {
        rate(self.pods, self.secs)
    }
}

/// A plot written next to the report.
#[derive(Debug, Clone, PartialEq)]
pub struct Plot {
    /// File name inside the report folder.
    pub file: String,
    /// What the axes and colours mean (the PNG has no text).
    pub caption: String,
}

/// Which run produced a report: its command line, start and machine.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Provenance {
    /// The command line that produced the report.
    pub command: String,
    /// When the run started (RFC 3339).
    pub started: String,
    /// CPUs the machine has.
    pub cpus: usize,
}

impl Provenance {
    /// This process's command line, started now, on this machine.
    pub fn now() -> Self {
        Self {
            command: std::env::args().collect::<Vec<_>>().join(" "),
            started: jiff::Timestamp::now().to_string(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// Everything one benchmark run measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BenchReport {
    /// Which run this is.
    pub run: Provenance,
    /// Wall-clock seconds of the whole run.
    pub total_secs: f64,
    /// kjob-sim's raw write throughput.
    pub limit: Option<LimitResult>,
    /// Single-pod Jobs on the main stack.
    pub single: Option<PhaseResult>,
    /// The Indexed Job on the main stack.
    pub indexed: Option<PhaseResult>,
    /// Single-pod Jobs created at a fixed rate below the measured throughput, for latency
    /// without a backlog (the throughput phase creates every Job at once, so its
    /// latencies are mostly queueing behind the burst).
    pub latency: Option<PhaseResult>,
    /// Jobs/s offered in the latency phase.
    pub latency_rate: f64,
    /// The scale-out runs (1, 2, 4 workers under injected write latency).
    pub scale: Vec<PhaseResult>,
    /// Plots written.
    pub plots: Vec<Plot>,
}

/// One issue-8 target and how the run fared.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// What is measured.
    pub what: &'static str,
    /// The goal, as written in the issue.
    pub goal: &'static str,
    /// The measured figure.
    pub actual: String,
    /// Met, missed, or not measured in this run.
    pub met: Option<bool>,
}

/// Seconds allowed for the whole run (issue 8).
pub const RUN_BUDGET_SECS: f64 = 600.0;

/// Judges the issue-8 targets.
pub fn targets(r: &BenchReport) -> Vec<Target> {
    let main: Vec<&PhaseResult> = r.single.iter().chain(r.indexed.iter()).collect();
    let mut out = Vec::new();
    let (pods, secs) = main
        .iter()
        .fold((0, 0.0), |(p, s), ph| (p + ph.counts.pods_created, s + ph.counts.pods_window_secs));
    let pods_rate = rate(pods, secs);
    out.push(Target {
        what: "pods created/s, both throughput phases, main stack",
        goal: ">= 100",
        actual: if main.is_empty() { "-".into() } else { format!("{pods_rate:.1}") },
        met: (!main.is_empty()).then_some(pods_rate >= 100.0),
    });
    out.push(Target {
        what: "single-pod Jobs finished/s, main stack",
        goal: ">= 50",
        actual: r.single.as_ref().map_or("-".into(), |s| format!("{:.1}", s.counts.jobs_per_sec())),
        met: r.single.as_ref().map(|s| s.counts.jobs_per_sec() >= 50.0),
    });
    // The paced phase when it ran: p99 under a burst only measures the burst's backlog.
    let p99 =
        r.latency.as_ref().or(r.single.as_ref()).and_then(|s| s.first_pod_latency).map(|l| l.p99);
    out.push(Target {
        what: if r.latency.is_some() {
            "p99 Job created -> first pod created (single-pod Jobs, paced)"
        } else {
            "p99 Job created -> first pod created (single-pod Jobs)"
        },
        goal: "<= 1.5 s",
        actual: p99.map_or("-".into(), |v| format!("{v:.3} s")),
        met: p99.map(|v| v <= 1.5),
    });
    // The steady path is the pods of one long-running Job; without the Indexed Job, use all.
    let steady: Vec<&PhaseResult> = match &r.indexed {
        Some(ix) => vec![ix],
        None => main.clone(),
    };
    let calls: u64 = steady.iter().flat_map(|p| p.api_workers.iter()).map(|a| a.2).sum();
    let pods: u64 = steady.iter().map(|p| p.counts.pods_created).sum();
    let per_pod = rate(calls, pods as f64);
    out.push(Target {
        what: "worker API calls per pod, steady path (Indexed Job)",
        goal: "<= 2.5",
        actual: if pods == 0 { "-".into() } else { format!("{per_pod:.2}") },
        met: (pods > 0).then_some(per_pod <= 2.5),
    });
    let by_workers =
        |n: usize| r.scale.iter().find(|p| p.workers == n).map(|p| p.counts.jobs_per_sec());
    let ratio = match (by_workers(1), by_workers(4)) {
        (Some(one), Some(four)) if one > 0.0 => Some(four / one),
        _ => None,
    };
    out.push(Target {
        what: "scale-out: Jobs/s with 4 workers / with 1 (injected write latency)",
        goal: ">= 3x",
        actual: ratio.map_or("-".into(), |v| format!("{v:.2}x")),
        met: ratio.map(|v| v >= 3.0),
    });
    out.push(Target {
        what: "whole run wall-clock time",
        goal: "< 600 s",
        actual: format!("{:.0} s", r.total_secs),
        met: Some(r.total_secs < RUN_BUDGET_SECS),
    });
    out
}

fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "**missed**",
        None => "not measured",
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn latency_cell(s: Option<Summary>) -> String {
    s.map_or("-".into(), |s| format!("{:.3} / {:.3} / {:.3} (n={})", s.p50, s.p99, s.max, s.count))
}

/// Renders the report as Markdown.
pub fn render_markdown(r: &BenchReport) -> String {
    let mut md = String::new();
    // Writing into a String cannot fail; `let _` keeps clippy quiet about the Result.
    let _ = writeln!(md, "# kjob benchmark\n");
    let _ = writeln!(md, "* command: `{}`", r.run.command);
    let _ = writeln!(
        md,
        "* started: {}; {} CPUs; whole run {:.0} s\n",
        r.run.started, r.run.cpus, r.total_secs
    );

    let _ = writeln!(
        md,
        "## Targets (issue 8)\n\n| what | goal | measured | verdict |\n|---|---|---|---|"
    );
    for t in targets(r) {
        let _ = writeln!(md, "| {} | {} | {} | {} |", t.what, t.goal, t.actual, verdict(t.met));
    }

    if let Some(l) = &r.limit {
        let _ = writeln!(md, "\n## The limit: kjob-sim raw write throughput\n");
        let _ = writeln!(
            md,
            "{} concurrent clients created {} pods in {:.2} s ({} errors): **{:.0} pods/s**.",
            l.clients,
            l.pods,
            l.secs,
            l.errors,
            l.pods_per_sec()
        );
        for p in r.single.iter().chain(r.indexed.iter()) {
            let _ = writeln!(
                md,
                "* {}: {:.1} pods/s = {:.1}% of the limit",
                p.name,
                p.counts.pods_per_sec(),
                100.0 * p.counts.pods_per_sec() / l.pods_per_sec().max(f64::MIN_POSITIVE)
            );
        }
    }

    let phases: Vec<&PhaseResult> = r
        .single
        .iter()
        .chain(r.indexed.iter())
        .chain(r.latency.iter())
        .chain(r.scale.iter())
        .collect();
    if !phases.is_empty() {
        let _ = writeln!(
            md,
            "\n## Throughput and latency\n\nLatencies in seconds as p50 / p99 / max, timestamps taken when watch events reach the harness.\n"
        );
        if let Some(l) = &r.latency {
            let _ = writeln!(
                md,
                "The throughput phases create every Job at once, so their latencies are mostly waiting behind that burst. \
                 The latency target is judged on \"{}\": single-pod Jobs created at a steady {:.1} Jobs/s (about half the throughput phase's rate).\n",
                l.name, r.latency_rate
            );
        }
        let _ = writeln!(
            md,
            "| run | workers | write latency | Jobs done | pods | time to all finished | pods/s | Jobs/s | Job created -> first pod | pod finished -> counted |\n|---|---|---|---|---|---|---|---|---|---|"
        );
        for p in &phases {
            let _ = writeln!(
                md,
                "| {} | {} | {} ms | {}/{}{} | {} | {:.1} s | {:.1} | {:.1} | {} | {} |",
                p.name,
                p.workers,
                p.write_latency_ms,
                p.counts.jobs_finished,
                p.counts.jobs,
                if p.counts.timed_out { " (timed out)" } else { "" },
                p.counts.pods_created,
                p.counts.elapsed_secs,
                p.counts.pods_per_sec(),
                p.counts.jobs_per_sec(),
                latency_cell(p.first_pod_latency),
                latency_cell(p.counted_latency),
            );
        }
        for p in phases.iter().filter(|p| p.watch_errors > 0) {
            let _ = writeln!(
                md,
                "\n{}: the harness's watches failed {} time(s) and re-listed; timestamps of events missed in between are late.",
                p.name, p.watch_errors
            );
        }

        let _ = writeln!(md, "\n## Cost\n");
        let _ = writeln!(
            md,
            "| run | worker API calls/pod | Job syncs | Redis commands/sync (incl. inside scripts) | Lua scripts/sync | worker calls by verb | all API requests (sim) by verb |\n|---|---|---|---|---|---|---|"
        );
        let fmt_calls = |v: &[(String, String, u64)], pods: u64| {
            v.iter()
                .map(|(verb, res, n)| {
                    format!("{verb} {res}: {n} ({:.2}/pod)", rate(*n, pods as f64))
                })
                .collect::<Vec<_>>()
                .join("<br>")
        };
        for p in &phases {
            let _ = writeln!(
                md,
                "| {} | {:.2} | {} | {:.1} | {:.1} | {} | {} |",
                p.name,
                p.worker_calls_per_pod(),
                p.syncs,
                p.redis_per_sync(),
                p.scripts_per_sync(),
                fmt_calls(&p.api_workers, p.counts.pods_created),
                fmt_calls(&p.api_all, p.counts.pods_created),
            );
        }
        let _ = writeln!(
            md,
            "\nThe sim's counts include the kubelet (pod binding creates, pod status updates) and the harness (Job creates, watches); \
             the worker columns come from each worker's own `kjob_worker_api_calls_total`. \
             Redis `INFO commandstats` counts the commands run inside Lua scripts too.\n\nRedis commands per run:\n"
        );
        for p in &phases {
            let cmds = p.redis_commands.iter().map(|(c, n)| format!("{c} {n}")).collect::<Vec<_>>();
            let _ = writeln!(md, "* {}: {}", p.name, cmds.join(", "));
        }
        let _ = writeln!(md, "\nCPU seconds used during the run / peak RSS (VmHWM) per process:\n");
        let _ = writeln!(
            md,
            "| run | process | CPU s | CPU share of wall time | peak RSS MiB |\n|---|---|---|---|---|"
        );
        for p in &phases {
            for u in &p.processes {
                let _ = writeln!(
                    md,
                    "| {} | {} | {:.1} | {:.0}% | {:.1} |",
                    p.name,
                    u.name,
                    u.cpu_secs,
                    100.0 * u.cpu_secs / p.counts.elapsed_secs.max(f64::MIN_POSITIVE),
                    mib(u.peak_rss)
                );
            }
        }
    }

    if !r.scale.is_empty() {
        let _ = writeln!(md, "\n## Scale-out\n");
        let base = r.scale.iter().find(|p| p.workers == 1).map(|p| p.counts.jobs_per_sec());
        for p in &r.scale {
            let speedup = base.filter(|b| *b > 0.0).map(|b| p.counts.jobs_per_sec() / b);
            let _ = writeln!(
                md,
                "* {} workers, {} ms write latency: {:.1} Jobs/s, {:.1} pods/s{}",
                p.workers,
                p.write_latency_ms,
                p.counts.jobs_per_sec(),
                p.counts.pods_per_sec(),
                speedup.map_or(String::new(), |s| format!(" ({s:.2}x of 1 worker)"))
            );
        }
    }

    if !r.plots.is_empty() {
        let _ = writeln!(md, "\n## Plots\n");
        for p in &r.plots {
            let _ = writeln!(md, "![{}]({})\n\n{}\n", p.file, p.file, p.caption);
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(name: &str, workers: usize, jobs: u64, pods: u64, secs: f64) -> PhaseResult {
        PhaseResult {
            name: name.into(),
            workers,
            counts: Counts {
                jobs,
                jobs_finished: jobs,
                pods_created: pods,
                elapsed_secs: secs,
                pods_window_secs: secs,
                jobs_window_secs: secs,
                timed_out: false,
            },
            api_workers: vec![
                ("create".into(), "pods".into(), pods),
                ("get".into(), "jobs".into(), pods),
            ],
            syncs: 10,
            redis_commands: vec![("evalsha".into(), 40)],
            ..Default::default()
        }
    }

    #[test]
    fn targets_judge_the_figures() {
        let mut r = BenchReport {
            total_secs: 420.0,
            single: Some(PhaseResult {
                first_pod_latency: Some(Summary {
                    count: 10,
                    p50: 0.9,
                    p99: 1.2,
                    max: 1.3,
                    mean: 1.0,
                }),
                ..phase("single", 2, 5000, 5000, 50.0)
            }),
            indexed: Some(phase("indexed", 2, 1, 20_000, 100.0)),
            scale: vec![phase("s1", 1, 100, 100, 10.0), phase("s4", 4, 100, 100, 4.0)],
            ..Default::default()
        };
        let t = targets(&r);
        assert_eq!(t[0].actual, "166.7");
        assert_eq!(t[0].met, Some(true));
        assert_eq!((t[1].actual.as_str(), t[1].met), ("100.0", Some(true)));
        assert_eq!((t[2].actual.as_str(), t[2].met), ("1.200 s", Some(true)));
        // Two calls per pod in every phase.
        assert_eq!((t[3].actual.as_str(), t[3].met), ("2.00", Some(true)));
        assert_eq!((t[4].actual.as_str(), t[4].met), ("2.50x", Some(false)));
        assert_eq!(t[5].met, Some(true));
        // A paced phase, when present, is what the latency target judges.
        r.latency = Some(PhaseResult {
            first_pod_latency: Some(Summary { count: 5, p50: 1.0, p99: 2.0, max: 2.1, mean: 1.2 }),
            ..phase("paced", 2, 100, 100, 10.0)
        });
        let t = targets(&r);
        assert!(t[2].what.contains("paced"));
        assert_eq!((t[2].actual.as_str(), t[2].met), ("2.000 s", Some(false)));
        r.latency = None;
        r.single = None;
        r.scale.clear();
        r.total_secs = 700.0;
        let t = targets(&r);
        assert_eq!(t[1].met, None);
        assert_eq!(t[2].met, None);
        assert_eq!(t[4].met, None);
        assert_eq!(t[5].met, Some(false));
    }

    #[test]
    fn phase_rates() {
        let p = phase("x", 2, 100, 400, 8.0);
        assert_eq!(p.counts.pods_per_sec(), 50.0);
        assert_eq!(p.counts.jobs_per_sec(), 12.5);
        assert_eq!(p.worker_calls_per_pod(), 2.0);
        assert_eq!(p.redis_per_sync(), 4.0);
        assert_eq!(p.scripts_per_sync(), 4.0);
        assert_eq!(PhaseResult::default().redis_per_sync(), 0.0);
    }

    #[test]
    fn markdown_has_every_section() {
        let r = BenchReport {
            run: Provenance { command: "kjob-bench --quick".into(), ..Default::default() },
            limit: Some(LimitResult { clients: 8, pods: 1000, errors: 0, secs: 2.0 }),
            single: Some(phase("single", 2, 50, 50, 5.0)),
            scale: vec![phase("s1", 1, 10, 10, 2.0), phase("s2", 2, 10, 10, 1.0)],
            plots: vec![Plot { file: "cdf.png".into(), caption: "x: seconds".into() }],
            ..Default::default()
        };
        let md = render_markdown(&r);
        for needle in [
            "`kjob-bench --quick`",
            "**500 pods/s**",
            "single: 10.0 pods/s = 2.0% of the limit",
            "| single | 2 | 0 ms | 50/50 | 50 | 5.0 s | 10.0 | 10.0 |",
            "create pods: 50 (1.00/pod)",
            "evalsha 40",
            "2 workers, 0 ms write latency: 10.0 Jobs/s, 10.0 pods/s (2.00x of 1 worker)",
            "![cdf.png](cdf.png)",
            "| **missed** |",
        ] {
            assert!(md.contains(needle), "missing {needle:?} in\n{md}");
        }
    }
}
