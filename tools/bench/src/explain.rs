//! `kjob-queue-bench explain`: how fast the admin port's explain API answers with a full queue.
//!
//! Starts a private redis-server and an in-process kjob-queue with its admin port, fills the job
//! queue with `--jobs` Jobs over `--namespaces` namespaces (most ready, some delayed after a
//! failed sync with an error in their history, some leased), then reads
//! `GET /api/v1/jobs/{ns}/{name}` for random Jobs one at a time over one keep-alive connection,
//! as an operator's tool does, and `GET /api/v1/namespaces` a few times, and prints p50/p99/max
//! of each against the target (explain < 10 ms p99 with 10,000 queued Jobs).

use std::time::{Duration, Instant};

use anyhow::Context;
use kjob_queue::{Listeners, QueueConfig, Security};
use kjob_svc::Shutdown;
use kjob_testkit::RedisServer;
use kjob_workqueue::{Done, Enqueue, LeaseOutcome, Store, StoreConfig};
use tokio::net::TcpListener;

use crate::stats::{Summary, summarize};

/// The target of issue 47: explain answers in < 10 ms at p99.
const TARGET_P99: Duration = Duration::from_millis(10);
/// Items per Add or Done call while filling (the watcher's batches are of this order).
const FILL_BATCH: usize = 500;
/// Lease of the Jobs left leased: longer than any run, so none expires mid-measurement.
const LEASE: Duration = Duration::from_secs(600);

/// Flags of `kjob-queue-bench explain`.
#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    /// Jobs queued before measuring.
    #[arg(long, default_value_t = 10_000)]
    pub jobs: usize,
    /// Namespaces they are spread over.
    #[arg(long, default_value_t = 20)]
    pub namespaces: usize,
    /// Explain requests measured (after a discarded warm-up of a tenth of them).
    #[arg(long, default_value_t = 2_000)]
    pub requests: usize,
    /// Namespaces requests measured.
    #[arg(long, default_value_t = 50)]
    pub namespace_requests: usize,
}

fn key(i: usize, namespaces: usize) -> String {
    format!("ns-{}/job-{i}", i % namespaces.max(1))
}

/// Fills the queue: every Job enqueued; a tenth leased and failed once (delayed, with an error
/// in its history); another tenth leased and held.
async fn fill(store: &Store, jobs: usize, namespaces: usize) -> anyhow::Result<()> {
    let q = kjob_core::JOB_QUEUE;
    let keys: Vec<String> = (0..jobs).map(|i| key(i, namespaces)).collect();
    for chunk in keys.chunks(FILL_BATCH) {
        let items: Vec<Enqueue> = chunk.iter().map(Enqueue::now).collect();
        store.add(q, &items).await?;
    }
    let failing = jobs / 10;
    let mut leased = 0;
    while leased < failing {
        let n = u32::try_from((failing - leased).min(FILL_BATCH)).unwrap_or(u32::MAX);
        let b = store.lease(q, "bench-failing", n, LEASE).await?;
        anyhow::ensure!(!b.items.is_empty(), "nothing left to lease after {leased}");
        leased += b.items.len();
        let dones: Vec<Done> = b
            .items
            .iter()
            .map(|l| Done {
                key: l.key.clone(),
                lease_id: l.lease_id.clone(),
                outcome: LeaseOutcome::RateLimited,
                error: "pods \"x\" is forbidden: exceeded quota".into(),
            })
            .collect();
        for chunk in dones.chunks(kjob_workqueue::MAX_DONE_BATCH) {
            store.done_many(q, chunk).await?;
        }
    }
    let held = u32::try_from(jobs / 10).unwrap_or(u32::MAX);
    let mut got = 0;
    while got < held {
        let n = (held - got).min(FILL_BATCH as u32);
        let b = store.lease(q, "bench-holder", n, LEASE).await?;
        anyhow::ensure!(!b.items.is_empty(), "nothing left to hold after {got}");
        got += u32::try_from(b.items.len()).unwrap_or(u32::MAX);
    }
    Ok(())
}

/// `requests` GETs of the URLs `url(i)`, one at a time; their latencies in seconds.
async fn measure(
    http: &reqwest::Client,
    requests: usize,
    mut url: impl FnMut(usize) -> String,
) -> anyhow::Result<Vec<f64>> {
    let mut samples = Vec::with_capacity(requests);
    for i in 0..requests {
        let u = url(i);
        let t = Instant::now();
        let resp = http.get(&u).send().await.with_context(|| format!("GET {u}"))?;
        let status = resp.status();
        let body = resp.bytes().await?;
        samples.push(t.elapsed().as_secs_f64());
        anyhow::ensure!(
            status.is_success(),
            "GET {u}: {status}: {}",
            String::from_utf8_lossy(&body)
        );
    }
    Ok(samples)
}

fn line(what: &str, s: &Summary) -> String {
    format!(
        "{what:<22} n={:<5} p50 {:>7.3} ms   p99 {:>7.3} ms   max {:>7.3} ms",
        s.count,
        s.p50 * 1e3,
        s.p99 * 1e3,
        s.max * 1e3
    )
}

/// Runs the explain benchmark and prints its report.
pub async fn run(args: ExplainArgs) -> anyhow::Result<()> {
    let ExplainArgs { jobs, namespaces, requests, namespace_requests } = args;
    let redis = RedisServer::start().context("redis-server")?;
    let store = Store::connect(&redis.url(), StoreConfig::default()).await?;
    let grpc = TcpListener::bind("127.0.0.1:0").await?;
    let admin = TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", admin.local_addr()?);
    let shutdown = Shutdown::new();
    let config = QueueConfig::new(redis.url(), Security::InsecureNoAuth);
    let task = tokio::spawn(kjob_queue::run(
        Listeners { grpc, admin: Some(admin) },
        config,
        shutdown.clone(),
    ));

    let t = Instant::now();
    fill(&store, jobs, namespaces).await?;
    let stats = store.stats(kjob_core::JOB_QUEUE).await?;
    println!(
        "queue filled in {:.1}s: {} ready, {} delayed, {} leased ({} Jobs in {namespaces} namespaces)",
        t.elapsed().as_secs_f64(),
        stats.ready,
        stats.delayed,
        stats.leased,
        stats.ready + stats.delayed + stats.leased
    );

    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
    // Waits for kjob-queue to have connected (503 before).
    let deadline = Instant::now() + Duration::from_secs(20);
    while !http
        .get(format!("{base}/api/v1/namespaces"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        anyhow::ensure!(Instant::now() < deadline, "the explain API never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A fixed stride over the Jobs visits every state in turn without a random number source.
    let pick = |i: usize| key(i.wrapping_mul(7919) % jobs.max(1), namespaces);
    let job_url = |i: usize| format!("{base}/api/v1/jobs/{}", pick(i));
    measure(&http, requests / 10, job_url).await?;
    let mut explain = measure(&http, requests, |i| job_url(i + requests)).await?;
    let mut ns =
        measure(&http, namespace_requests, |_| format!("{base}/api/v1/namespaces")).await?;

    let e = summarize(&mut explain).context("no explain samples")?;
    println!("{}", line("GET /api/v1/jobs/…", &e));
    if let Some(n) = summarize(&mut ns) {
        println!("{}", line("GET /api/v1/namespaces", &n));
    }
    let met = Duration::from_secs_f64(e.p99) < TARGET_P99;
    println!(
        "target: explain p99 < {} ms with {jobs} queued Jobs: {}",
        TARGET_P99.as_millis(),
        if met { "met" } else { "MISSED" }
    );

    shutdown.cancel();
    task.await??;
    Ok(())
}
