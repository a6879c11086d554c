//! The watcher's CPU per pod event, protobuf against JSON (`--watch-encoding`), on the real
//! control plane (`make bench-watcher`).
//!
//! Each run starts kjob-queue (with Redis) and one kjob-watcher from `--bin-dir` (release
//! builds) on kube-apiserver, scoped to a namespace of its own, with the given encoding; creates
//! a managed, suspended Job (nothing else reconciles it, so only the test writes its pods) and
//! `--pods` pods it controls; writes each pod's status `--updates` times (what a kubelet sends:
//! a phase, a condition, a container status); deletes them; and waits until the watcher has
//! counted every event (`kjob_watcher_events_total{kind="pod"}`). The watcher's CPU time
//! (`/proc/<pid>/stat`, user + system) over that window, divided by the pod events it counted,
//! is the figure. Runs alternate the encodings, `--passes` of each; the report gives every run
//! and each encoding's mean with the min–max interval.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kjob_bench::procfs;
use kjob_testkit::server::TestServer;
use kjob_testkit::{Program, StackConfig};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};

#[derive(Debug, Parser)]
#[command(name = "kjob-watcher-bench")]
struct Args {
    /// Folder with release builds of kjob-queue and kjob-watcher (and the other stack binaries).
    #[arg(long, default_value = "target/release")]
    bin_dir: PathBuf,
    /// Pods per run.
    #[arg(long, default_value_t = 2000)]
    pods: usize,
    /// Status writes per pod.
    #[arg(long, default_value_t = 3)]
    updates: usize,
    /// Runs per encoding (interleaved).
    #[arg(long, default_value_t = 3)]
    passes: usize,
    /// Where the runs' logs go.
    #[arg(long, default_value = "target/bench/watcher")]
    out: PathBuf,
}

/// Writes in flight at once: enough to keep kube-apiserver busy on two cores.
const IN_FLIGHT: usize = 32;
/// How long the watcher's idle CPU is measured before each window.
const IDLE_WINDOW: Duration = Duration::from_secs(10);
/// Longest wait for the watcher to count every event of a run.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Copy)]
enum Encoding {
    Protobuf,
    Json,
}

impl Encoding {
    fn flag(self) -> &'static str {
        match self {
            Encoding::Protobuf => "protobuf",
            Encoding::Json => "json",
        }
    }
}

struct Run {
    encoding: Encoding,
    events: f64,
    /// The watcher's CPU over the window.
    cpu_secs: f64,
    /// Less its idle rate over the window.
    net_cpu_secs: f64,
    wall_secs: f64,
}

impl Run {
    fn us_per_event(&self) -> f64 {
        self.cpu_secs * 1e6 / self.events
    }

    fn net_us_per_event(&self) -> f64 {
        self.net_cpu_secs * 1e6 / self.events
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let missing = kjob_testkit::stack::missing_binaries(&args.bin_dir);
    anyhow::ensure!(missing.is_empty(), "missing in {}: {missing:?}", args.bin_dir.display());
    let server = TestServer::real().await.context("the real control plane needs Go")?;
    let mut runs = Vec::new();
    for pass in 0..args.passes {
        let order = if pass % 2 == 0 {
            [Encoding::Protobuf, Encoding::Json]
        } else {
            [Encoding::Json, Encoding::Protobuf]
        };
        for encoding in order {
            let run = one_run(&server, &args, encoding, pass).await?;
            println!(
                "pass {pass} {:<8} {:>6} pod events  {:>6.3} CPU s ({:.3} net of idle)  {:>5.1} s  \
                 {:>6.1} µs/event ({:.1} net)",
                encoding.flag(),
                run.events,
                run.cpu_secs,
                run.net_cpu_secs,
                run.wall_secs,
                run.us_per_event(),
                run.net_us_per_event()
            );
            runs.push(run);
        }
    }
    println!(
        "\nwatcher CPU per pod event ({} pods, {} status writes each):",
        args.pods, args.updates
    );
    let mut means = Vec::new();
    for (what, f) in
        [("whole", Run::us_per_event as fn(&Run) -> f64), ("net of idle", Run::net_us_per_event)]
    {
        for encoding in [Encoding::Protobuf, Encoding::Json] {
            let v: Vec<f64> =
                runs.iter().filter(|r| r.encoding.flag() == encoding.flag()).map(f).collect();
            let mean = v.iter().sum::<f64>() / v.len() as f64;
            let (lo, hi) = v.iter().fold((f64::MAX, f64::MIN), |(l, h), x| (l.min(*x), h.max(*x)));
            println!(
                "  {what:<12} {:<8} {mean:>6.1} µs  [{lo:.1}–{hi:.1}]  ({} runs)",
                encoding.flag(),
                v.len()
            );
            means.push(mean);
        }
    }
    println!(
        "  protobuf ÷ json, whole: {:.2}; net of idle: {:.2}",
        means[0] / means[1],
        means[2] / means[3]
    );
    Ok(())
}

async fn one_run(
    server: &TestServer,
    args: &Args,
    encoding: Encoding,
    pass: usize,
) -> anyhow::Result<Run> {
    let ns = server.namespace(&format!("wbench-{}-{pass}", encoding.flag()));
    let redis = kjob_testkit::redis::redis_server_binary()?;
    let run_dir = args.out.join(&ns);
    std::fs::create_dir_all(&run_dir)?;
    let mut cfg = StackConfig::new(args.bin_dir.clone(), redis, run_dir, 0);
    cfg.extra_args.add(Program::Watcher, ["--watch-encoding", encoding.flag()]);
    let mut stack = server.start_stack(&ns, cfg).await?;
    let result = measure(server, &stack, &ns, args).await;
    stack.stop();
    let (events, cpu_secs, net_cpu_secs, wall_secs) = result?;
    Ok(Run { encoding, events, cpu_secs, net_cpu_secs, wall_secs })
}

/// Pod events the watcher has counted.
fn pod_events(admin: &str) -> anyhow::Result<f64> {
    let addr = admin.trim_start_matches("http://").parse()?;
    let (_, body) = kjob_testkit::stack::http_request(addr, "GET", "/metrics", None)?;
    let text = String::from_utf8_lossy(&body);
    let by = kjob_bench::promtext::sum_by(&text, "kjob_watcher_events_total", &["kind"]);
    Ok(by.get(&vec!["pod".to_string()]).copied().unwrap_or(0.0))
}

async fn measure(
    server: &TestServer,
    stack: &kjob_testkit::Stack,
    ns: &str,
    args: &Args,
) -> anyhow::Result<(f64, f64, f64, f64)> {
    let leader = stack.wait_for_leader(Duration::from_secs(60))?;
    let pid = stack.pid(&leader).context("the watcher's pid")?;
    let admin = stack.admin_url(&leader).context("the watcher's admin port")?;
    let client = server.client();
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let job: Job = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "bench"},
        "spec": {"managedBy": kjob_core::DEFAULT_CONTROLLER_NAME, "suspend": true,
                 "template": {"spec": {"restartPolicy": "Never",
                   "containers": [{"name": "main", "image": "busybox"}]}}}
    }))?;
    let job = jobs.create(&PostParams::default(), &job).await?;
    let uid = job.metadata.uid.clone().unwrap_or_default();
    // Let the watcher settle on the Job, then take its idle CPU rate (Lease renewals, the
    // queue's readiness probe, HTTP/2 pings), which the window's CPU is net of.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ticks = procfs::clock_ticks();
    let idle_start = (Instant::now(), procfs::read_usage(pid, ticks)?.cpu_secs);
    tokio::time::sleep(IDLE_WINDOW).await;
    let events_before = pod_events(&admin)?;
    let cpu_before = procfs::read_usage(pid, ticks)?.cpu_secs;
    let idle_rate = (cpu_before - idle_start.1) / idle_start.0.elapsed().as_secs_f64();
    let start = Instant::now();

    let pods: Api<Pod> = Api::namespaced(client, ns);
    let names: Vec<String> = (0..args.pods).map(|i| format!("bench-{i:05}")).collect();
    for_each(&names, |name| {
        let (pods, uid) = (pods.clone(), uid.clone());
        async move {
            let pod: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name,
                    "labels": {"batch.kubernetes.io/job-name": "bench"},
                    "annotations": {"batch.kubernetes.io/job-completion-index": "0"},
                    "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "bench",
                        "uid": uid, "controller": true, "blockOwnerDeletion": true}]},
                // A scheduler nobody runs: no node agent touches the pod, only this bench.
                "spec": {"schedulerName": "kjob-bench-nobody",
                    "containers": [{"name": "main", "image": "busybox",
                        "command": ["sh", "-c", "sleep 1"],
                        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}
            }))?;
            pods.create(&PostParams::default(), &pod).await?;
            Ok(())
        }
    })
    .await?;
    for step in 0..args.updates {
        for_each(&names, |name| {
            let pods = pods.clone();
            async move {
                let t = format!("2026-12-01T10:00:{step:02}Z");
                let status = serde_json::json!({"status": {
                    "phase": "Running",
                    "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": t,
                                    "lastProbeTime": null}],
                    "containerStatuses": [{"name": "main", "image": "busybox", "imageID": "",
                        "ready": false, "restartCount": step, "started": true,
                        "state": {"running": {"startedAt": t}}}]}});
                pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await?;
                Ok(())
            }
        })
        .await?;
    }
    for_each(&names, |name| {
        let pods = pods.clone();
        async move {
            let now = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
            pods.delete(&name, &now).await?;
            Ok(())
        }
    })
    .await?;
    // Every pod: its add, its status writes, its delete (unbound and without finalizers, a
    // pod goes at once).
    let want = events_before + (args.pods * (args.updates + 2)) as f64;
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    while pod_events(&admin)? < want {
        anyhow::ensure!(Instant::now() < deadline, "the watcher did not count every event");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen = pod_events(&admin)?;
    let cpu = procfs::read_usage(pid, ticks)?.cpu_secs - cpu_before;
    let events = seen - events_before;
    anyhow::ensure!(events > 0.0, "the watcher counted no pod event");
    let wall = start.elapsed().as_secs_f64();
    Ok((events, cpu, (cpu - idle_rate * wall).max(0.0), wall))
}

/// Runs `f` on every name, [`IN_FLIGHT`] at a time.
async fn for_each<F, Fut>(names: &[String], f: F) -> anyhow::Result<()>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    use futures::TryStreamExt as _;
    futures::stream::iter(names.iter().cloned().map(f))
        .buffer_unordered(IN_FLIGHT)
        .try_collect::<Vec<()>>()
        .await
        .map(|_| ())
}
