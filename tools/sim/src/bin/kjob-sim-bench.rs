//! kjob-sim-bench: throughput of the simulator over HTTP.
//!
//! * `classic`: creates/s, status updates/s and watch events/s with 1, 4 and 16 concurrent
//!   clients, with 100,000 pods stored, and the server's RSS.
//! * `loaded`: the requests kjob makes (GET, per-Job labelSelector LIST, pod create, pod status
//!   update) with pod and Job watches open, on an empty store and on one pre-filled with Jobs
//!   and their labelled pods, side by side: the sim must not slow down as objects pile up.
//!
//! Run with `cargo run --release -p kjob-sim --bin kjob-sim-bench [-- --scenario loaded]`.
//! It starts the `kjob-sim` binary found next to itself (`--kubelet off`), a fresh one per store.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Parser;
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::json;

/// Timeout of every benchmark request: a stuck server fails the run instead of hanging it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const NS: &str = "bench";

/// Which measurements to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Scenario {
    /// Creates, status updates and watch fan-out with 1/4/16 clients.
    Classic,
    /// kjob's request mix on an empty and on a pre-filled store.
    Loaded,
    /// Both.
    All,
}

#[derive(Debug, Parser)]
struct Args {
    /// Which measurements to run.
    #[arg(long, value_enum, default_value = "all")]
    scenario: Scenario,
    /// Pods stored before the update and watch phases (classic).
    #[arg(long, default_value_t = 100_000)]
    pods: u64,
    /// Jobs pre-filled for the loaded store.
    #[arg(long, default_value_t = 5_000)]
    loaded_jobs: u64,
    /// Pods per pre-filled Job (labelled and owned like kjob's).
    #[arg(long, default_value_t = 4)]
    pods_per_job: u64,
    /// Namespaces the pre-filled Jobs spread over.
    #[arg(long, default_value_t = 4)]
    namespaces: u64,
    /// Concurrent clients of the loaded scenario's phases.
    #[arg(long, default_value_t = 4)]
    clients: u64,
    /// Length of each measured phase.
    #[arg(long, value_parser = kjob_svc::parse_duration, default_value = "3s")]
    seconds: Duration,
    /// Path of the kjob-sim binary (default: next to this one).
    #[arg(long)]
    sim: Option<PathBuf>,
}

type Http = Client<HttpConnector, Full<Bytes>>;

/// A kjob-sim child process and its base URL.
struct Running {
    _guard: Sim,
    pid: u32,
    base: String,
}

fn start_sim(sim_bin: &PathBuf) -> anyhow::Result<Running> {
    let mut child = Command::new(sim_bin)
        .args(["--listen", "127.0.0.1:0", "--kubelet", "off", "--log-level", "warn"])
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", sim_bin.display()))?;
    let stdout = child.stdout.take().context("sim stdout")?;
    let pid = child.id();
    let guard = Sim(child);
    let mut url = String::new();
    BufReader::new(stdout).read_line(&mut url)?;
    Ok(Running { _guard: guard, pid, base: url.trim().to_owned() })
}

struct Sim(Child);

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn call(
    http: &Http,
    method: &str,
    url: &str,
    ct: &str,
    body: Vec<u8>,
) -> anyhow::Result<u16> {
    Ok(call_body(http, method, url, ct, body).await?.0)
}

/// Sends one request; an answer other than `want` is an error saying `what` answered it.
async fn expect(
    http: &Http,
    (method, url, ct): (&str, &str, &str),
    body: Vec<u8>,
    want: u16,
    what: &str,
) -> anyhow::Result<()> {
    let code = call(http, method, url, ct, body).await?;
    if code != want {
        bail!("{what} answered {code}");
    }
    Ok(())
}

/// Sends one request and returns its code and whole body.
async fn call_body(
    http: &Http,
    method: &str,
    url: &str,
    ct: &str,
    body: Vec<u8>,
) -> anyhow::Result<(u16, Bytes)> {
    let req = http::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", ct)
        .body(Full::new(Bytes::from(body)))?;
    let resp = tokio::time::timeout(REQUEST_TIMEOUT, async {
        let resp = http.request(req).await?;
        let code = resp.status().as_u16();
        // Reading the body also lets the connection be reused.
        let body = resp.into_body().collect().await?.to_bytes();
        anyhow::Ok((code, body))
    })
    .await
    .context("request timed out")??;
    Ok(resp)
}

/// Creates pod `p-{n}` at `pods_url`: stored pods are named so that later phases can address
/// any of them.
async fn create_pod(http: &Http, pods_url: &str, n: u64) -> anyhow::Result<()> {
    let body = pod_body(&format!("p-{n}"));
    expect(http, ("POST", pods_url, "application/json"), body, 201, "create").await
}

/// The item (of `n`) client `w` addresses in its call `seq`: spread over all of them.
fn spread(w: u64, seq: u64, n: u64) -> u64 {
    (w * 7919 + seq * 104_729) % n
}

fn pod_body(name: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"metadata": {"name": name, "labels": {"app": "bench"}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox:1.36"}]}}))
    .unwrap_or_default()
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).map(str::to_owned))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// Runs `clients` workers until `dur` elapses; each calls `op(worker, seq)`; returns ops/s.
async fn phase<F, Fut>(clients: u64, dur: Duration, op: F) -> anyhow::Result<f64>
where
    F: Fn(u64, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let op = Arc::new(op);
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..clients {
        let (op, done) = (op.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut seq = 0;
            while start.elapsed() < dur {
                op(w, seq).await?;
                seq += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let sim_bin = match &args.sim {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name("kjob-sim"),
    };
    if matches!(args.scenario, Scenario::Loaded | Scenario::All) {
        loaded(&args, &sim_bin).await?;
    }
    if matches!(args.scenario, Scenario::Classic | Scenario::All) {
        classic(args.pods, args.seconds, &sim_bin).await?;
    }
    Ok(())
}

async fn classic(pods: u64, seconds: Duration, sim_bin: &PathBuf) -> anyhow::Result<()> {
    let Running { _guard, pid, base } = start_sim(sim_bin)?;
    let http: Http = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let code = call(
        &http,
        "POST",
        &format!("{base}/api/v1/namespaces"),
        "application/json",
        serde_json::to_vec(&json!({"metadata": {"name": NS}}))?,
    )
    .await?;
    if code != 201 {
        bail!("creating the namespace answered {code}");
    }
    let pods_url = format!("{base}/api/v1/namespaces/{NS}/pods");
    println!("kjob-sim-bench: {base}, phases of {seconds:?}");

    // Creates/s.
    let created = Arc::new(AtomicU64::new(0));
    for clients in [1u64, 4, 16] {
        let (http, url, created) = (http.clone(), pods_url.clone(), created.clone());
        let rate = phase(clients, seconds, move |w, seq| {
            let (http, url, created) = (http.clone(), url.clone(), created.clone());
            async move {
                // Pods are named p-0, p-1, ... so later phases can address any stored pod.
                let _ = (w, seq);
                create_pod(&http, &url, created.fetch_add(1, Ordering::Relaxed)).await
            }
        })
        .await?;
        println!("creates/s        clients={clients:<2} {rate:>10.0}");
    }

    // Fill the store up to `pods` with 16 clients.
    let have = created.load(Ordering::Relaxed);
    let fill_start = Instant::now();
    if have < pods {
        let next = Arc::new(AtomicU64::new(have));
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let (http, url, next) = (http.clone(), pods_url.clone(), next.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= pods {
                        return anyhow::Ok(());
                    }
                    create_pod(&http, &url, i).await?;
                }
            }));
        }
        for t in tasks {
            t.await??;
        }
    }
    println!(
        "stored pods: {} (fill took {:.1}s), server RSS {} MiB",
        pods.max(have),
        fill_start.elapsed().as_secs_f64(),
        rss_kib(pid) / 1024
    );

    // Status updates/s (merge patch of /status on stored pods; every patch changes something,
    // since a no-op write is cheaper and emits no event).
    let stored = pods.max(have);
    for clients in [1u64, 4, 16] {
        let (http, url) = (http.clone(), pods_url.clone());
        let rate = phase(clients, seconds, move |w, seq| {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let i = spread(w, seq, stored);
                let body = serde_json::to_vec(
                    &json!({"status": {"phase": "Running", "message": format!("u{clients}-{w}-{seq}")}}),
                )?;
                expect(&http, ("PATCH", &format!("{url}/p-{i}/status"), "application/merge-patch+json"), body, 200, "status patch").await?;
                Ok(())
            }
        })
        .await?;
        println!("status updates/s clients={clients:<2} {rate:>10.0}");
    }

    // Watch events/s delivered: W watchers, 16 writers.
    for watchers in [1u64, 4, 16] {
        let received = Arc::new(AtomicU64::new(0));
        let stop = tokio_util::sync::CancellationToken::new();
        let mut tasks = Vec::new();
        for _ in 0..watchers {
            // Start each watch at a fresh list revision: only new changes are counted.
            let list_rv = {
                let req = http::Request::builder()
                    .uri(format!("{pods_url}?limit=1"))
                    .body(Full::new(Bytes::new()))?;
                let resp = http.request(req).await?;
                let body = resp.into_body().collect().await?.to_bytes();
                let v: serde_json::Value = serde_json::from_slice(&body)?;
                v["metadata"]["resourceVersion"].as_str().unwrap_or("0").to_owned()
            };
            let url = format!("{pods_url}?watch=true&resourceVersion={list_rv}");
            tasks.push(open_watch(&http, &url, received.clone(), stop.clone()).await?);
        }
        let (http2, url) = (http.clone(), pods_url.clone());
        let start = Instant::now();
        let writes = phase(16, seconds, move |w, seq| {
            let (http, url) = (http2.clone(), url.clone());
            async move {
                let i = spread(w, seq, stored);
                let body = serde_json::to_vec(
                    &json!({"status": {"message": format!("w{watchers}-{w}-{seq}")}}),
                )?;
                call(
                    &http,
                    "PATCH",
                    &format!("{url}/p-{i}/status"),
                    "application/merge-patch+json",
                    body,
                )
                .await?;
                Ok(())
            }
        })
        .await?;
        // Let the watchers drain what was written.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let elapsed = start.elapsed().as_secs_f64();
        stop.cancel();
        for t in tasks {
            let _ = t.await;
        }
        let events = received.load(Ordering::Relaxed) as f64;
        println!(
            "watch events/s   watchers={watchers:<2} {:>10.0} delivered (writes {writes:.0}/s)",
            events / elapsed
        );
    }
    println!("server RSS at end: {} MiB", rss_kib(pid) / 1024);
    Ok(())
}

/// The labels, owner and spec kjob puts on a Job's pod.
fn job_pod_body(name: &str, job: &str, uid: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"metadata": {"name": name,
            "labels": {"batch.kubernetes.io/controller-uid": uid, "controller-uid": uid,
                "batch.kubernetes.io/job-name": job, "job-name": job},
            "finalizers": ["batch.kubernetes.io/job-tracking"],
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": uid,
                "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox:1.36"}]}}))
    .unwrap_or_default()
}

fn job_body(name: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"metadata": {"name": name},
        "spec": {"template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox:1.36"}]}}}}))
    .unwrap_or_default()
}

/// A Job stored for the loaded scenario: where it lives and the uid its pods are selected by.
#[derive(Debug, Clone)]
struct StoredJob {
    ns: String,
    name: String,
    uid: String,
}

/// Creates `jobs` Jobs (spread over `namespaces`) with `per_job` labelled pods each, 16 clients.
async fn fill(
    http: &Http,
    base: &str,
    prefix: &str,
    jobs: u64,
    per_job: u64,
    namespaces: u64,
) -> anyhow::Result<Vec<StoredJob>> {
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (http, base, next, prefix) =
            (http.clone(), base.to_owned(), next.clone(), prefix.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut made = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs {
                    return anyhow::Ok(made);
                }
                let ns = format!("{NS}-{}", i % namespaces.max(1));
                let name = format!("{prefix}job-{i}");
                let (code, body) = call_body(
                    &http,
                    "POST",
                    &format!("{base}/apis/batch/v1/namespaces/{ns}/jobs"),
                    "application/json",
                    job_body(&name),
                )
                .await?;
                if code != 201 {
                    bail!("job create answered {code}: {}", String::from_utf8_lossy(&body));
                }
                let job: serde_json::Value = serde_json::from_slice(&body)?;
                let uid = job["metadata"]["uid"].as_str().context("job uid")?.to_owned();
                for p in 0..per_job {
                    let url = format!("{base}/api/v1/namespaces/{ns}/pods");
                    let body = job_pod_body(&format!("{name}-{p}"), &name, &uid);
                    expect(&http, ("POST", &url, "application/json"), body, 201, "pod create")
                        .await?;
                }
                made.push(StoredJob { ns, name, uid });
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    Ok(all)
}

/// Opens the watch `url` (with its query) and counts the lines it delivers until `stop`.
async fn open_watch(
    http: &Http,
    url: &str,
    received: Arc<AtomicU64>,
    stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let req = http::Request::builder().uri(url).body(Full::new(Bytes::new()))?;
    let resp = tokio::time::timeout(REQUEST_TIMEOUT, http.request(req)).await??;
    if resp.status() != 200 {
        bail!("watch {url} answered {}", resp.status());
    }
    Ok(tokio::spawn(async move {
        let mut body = resp.into_body().into_data_stream();
        loop {
            tokio::select! {
                chunk = body.next() => match chunk {
                    Some(Ok(b)) => { received.fetch_add(b.iter().filter(|c| **c == b'\n').count() as u64, Ordering::Relaxed); }
                    _ => return,
                },
                _ = stop.cancelled() => return,
            }
        }
    }))
}

/// Rates of kjob's request mix on one store.
#[derive(Debug, Default, Clone, Copy)]
struct Mix {
    get: f64,
    list: f64,
    status: f64,
    create: f64,
}

/// Where the mix sends its requests: the server, and the Jobs it addresses.
#[derive(Clone)]
struct Target {
    http: Http,
    base: String,
    jobs: Arc<Vec<StoredJob>>,
}

impl Target {
    /// The Job client `w` addresses in its call `seq`, spread over all of them.
    fn pick(&self, w: u64, seq: u64) -> &StoredJob {
        &self.jobs[spread(w, seq, self.jobs.len() as u64) as usize]
    }
}

/// [`phase`] against `target`: every call gets its own handle on it.
async fn target_phase<F, Fut>(
    target: &Target,
    clients: u64,
    dur: Duration,
    op: F,
) -> anyhow::Result<f64>
where
    F: Fn(Target, u64, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let target = target.clone();
    phase(clients, dur, move |w, seq| op(target.clone(), w, seq)).await
}

/// Measures the mix against the Jobs in `jobs` (their pods exist), `clients` at a time.
async fn measure_mix(
    http: &Http,
    base: &str,
    jobs: Arc<Vec<StoredJob>>,
    per_job: u64,
    clients: u64,
    seconds: Duration,
) -> anyhow::Result<Mix> {
    let target = Target { http: http.clone(), base: base.to_owned(), jobs };
    let get = target_phase(&target, clients, seconds, |t, w, seq| async move {
        let job = t.pick(w, seq);
        let url = format!("{}/api/v1/namespaces/{}/pods/{}-0", t.base, job.ns, job.name);
        let code = call(&t.http, "GET", &url, "application/json", Vec::new()).await?;
        if code != 200 {
            bail!("get answered {code}");
        }
        Ok(())
    })
    .await?;
    let list = target_phase(&target, clients, seconds, move |t, w, seq| async move {
        let job = t.pick(w, seq);
        let url = format!(
            "{}/api/v1/namespaces/{}/pods?labelSelector=batch.kubernetes.io%2Fcontroller-uid%3D{}",
            t.base, job.ns, job.uid
        );
        let (code, body) = call_body(&t.http, "GET", &url, "application/json", Vec::new()).await?;
        if code != 200 {
            bail!("list answered {code}");
        }
        // The client shares the machine's cores with the server: decode one answer in
        // eight to check it, not all of them.
        if seq % 8 != 0 {
            return Ok(());
        }
        let v: serde_json::Value = serde_json::from_slice(&body)?;
        let got = v["items"].as_array().map_or(0, Vec::len) as u64;
        if got < per_job {
            bail!("list of {} returned {got} pods, want at least {per_job}", job.name);
        }
        Ok(())
    })
    .await?;
    let status = target_phase(&target, clients, seconds, |t, w, seq| async move {
        let job = t.pick(w, seq);
        let url = format!("{}/api/v1/namespaces/{}/pods/{}-0/status", t.base, job.ns, job.name);
        let body = serde_json::to_vec(
            &json!({"status": {"phase": "Running", "message": format!("s-{w}-{seq}")}}),
        )?;
        expect(&t.http, ("PATCH", &url, "application/merge-patch+json"), body, 200, "status patch")
            .await?;
        Ok(())
    })
    .await?;
    // Creates last: they add pods, and the other phases should see the store as filled.
    let made = Arc::new(AtomicU64::new(0));
    let create = target_phase(&target, clients, seconds, move |t, w, seq| {
        let made = made.clone();
        async move {
            let job = t.pick(w, seq);
            let i = made.fetch_add(1, Ordering::Relaxed);
            let url = format!("{}/api/v1/namespaces/{}/pods", t.base, job.ns);
            let body = job_pod_body(&format!("{}-x{i}", job.name), &job.name, &job.uid);
            expect(&t.http, ("POST", &url, "application/json"), body, 201, "create").await?;
            Ok(())
        }
    })
    .await?;
    Ok(Mix { get, list, status, create })
}

/// One store for the loaded scenario: namespaces, `jobs` Jobs with their pods, two pod watches
/// and one Job watch draining events; returns the mix's rates.
async fn run_store(args: &Args, sim_bin: &PathBuf, jobs: u64) -> anyhow::Result<(Mix, u64)> {
    let Running { _guard, pid, base } = start_sim(sim_bin)?;
    let http: Http = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    for i in 0..args.namespaces.max(1) {
        let body = serde_json::to_vec(&json!({"metadata": {"name": format!("{NS}-{i}")}}))?;
        let code =
            call(&http, "POST", &format!("{base}/api/v1/namespaces"), "application/json", body)
                .await?;
        if code != 201 {
            bail!("creating a namespace answered {code}");
        }
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let received = Arc::new(AtomicU64::new(0));
    let mut watches = Vec::new();
    for url in [
        format!("{base}/api/v1/pods"),
        format!("{base}/api/v1/pods"),
        format!("{base}/apis/batch/v1/jobs"),
    ] {
        let url = format!("{url}?watch=true&allowWatchBookmarks=true");
        watches.push(open_watch(&http, &url, received.clone(), stop.clone()).await?);
    }
    let fill_start = Instant::now();
    // The empty store still needs a few Jobs to address; they are the only objects.
    let stored = fill(&http, &base, "", jobs.max(16), args.pods_per_job, args.namespaces).await?;
    if jobs > 0 {
        println!(
            "  filled {} Jobs + {} pods in {:.1}s, server RSS {} MiB",
            stored.len(),
            stored.len() as u64 * args.pods_per_job,
            fill_start.elapsed().as_secs_f64(),
            rss_kib(pid) / 1024
        );
    }
    let mix =
        measure_mix(&http, &base, Arc::new(stored), args.pods_per_job, args.clients, args.seconds)
            .await?;
    stop.cancel();
    for w in watches {
        let _ = w.await;
    }
    Ok((mix, received.load(Ordering::Relaxed)))
}

async fn loaded(args: &Args, sim_bin: &PathBuf) -> anyhow::Result<()> {
    println!(
        "kjob-sim-bench loaded: {} clients, phases of {:?}, 2 pod watches + 1 Job watch open",
        args.clients, args.seconds
    );
    println!("empty store (16 Jobs x {} pods):", args.pods_per_job);
    let (empty, _) = run_store(args, sim_bin, 0).await?;
    println!("loaded store:");
    let (loaded, events) = run_store(args, sim_bin, args.loaded_jobs).await?;
    println!("  watch events delivered during the loaded run: {events}");
    println!("{:<44} {:>10} {:>10} {:>7}", "request", "empty/s", "loaded/s", "ratio");
    let rows = [
        ("GET pod", empty.get, loaded.get),
        ("LIST pods by controller-uid (per-Job selector)", empty.list, loaded.list),
        ("PATCH pod status", empty.status, loaded.status),
        ("POST pod", empty.create, loaded.create),
    ];
    for (name, e, l) in rows {
        let ratio = if e > 0.0 { l / e } else { 0.0 };
        println!("{name:<44} {e:>10.0} {l:>10.0} {ratio:>7.2}");
    }
    println!(
        "LIST (loaded) / GET (empty) time ratio: {:.2}",
        if loaded.list > 0.0 { empty.get / loaded.list } else { f64::INFINITY }
    );
    Ok(())
}
