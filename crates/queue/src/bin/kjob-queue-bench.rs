//! `kjob-queue-bench`: load tools for kjob-queue.
//!
//! `kjob-queue-bench run` (build with `--release`) starts its own redis-server on a free
//! loopback port and kjob-queue in process, then reports Add→Lease→Done items/s, Redis commands
//! and Redis CPU µs per item (INFO commandstats / INFO cpu deltas), enqueue-to-lease latency
//! p50/p99 with 1 and 8 waiting lessees, and `redis-benchmark` ZADD ops/s as the ceiling.
//!
//! `kjob-queue-bench lessee` is a lessee process for crash and load tests: it leases keys and
//! either finishes them (Done/Forget) as fast as it can, or, with `--hold`, keeps the leases
//! without renewing them until it is killed (a worker that hung or died mid-sync).

use std::io::Write;
use std::time::Duration;

use clap::{Parser, Subcommand};
use kjob_queue_client::{Outcome, QueueClient};
use kjob_svc::LogArgs;

/// Load tools for kjob-queue.
#[derive(Debug, Parser)]
#[command(name = "kjob-queue-bench", version)]
struct Args {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    log: LogArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the benchmark against a private redis-server and an in-process kjob-queue.
    Run(bench::BenchArgs),
    /// Lease keys; print each leased key on stdout.
    Lessee {
        /// URL of a kjob-queue server.
        #[arg(long, env = "KJOB_QUEUE_URL", default_value = "http://127.0.0.1:50051")]
        queue_url: String,
        /// Queue name.
        #[arg(long, default_value = kjob_core::JOB_QUEUE)]
        queue: String,
        /// Lease duration.
        #[arg(long, value_parser = kjob_svc::parse_duration, default_value = "30s")]
        lease: Duration,
        /// Stop leasing after this many keys (0 = no limit).
        #[arg(long, default_value_t = 0)]
        count: u64,
        /// Keep the leases (never Done, never renew) and wait to be killed.
        #[arg(long)]
        hold: bool,
        /// Worker id shown by inspect.
        #[arg(long, default_value = "bench-lessee")]
        worker_id: String,
    },
}

/// Long-poll wait of each Lease call.
const WAIT: Duration = Duration::from_secs(5);
/// Keys leased per call.
const BATCH: u32 = 10;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Args { command, log } = Args::parse();
    kjob_svc::init_logging(&log)?;
    match command {
        Command::Run(args) => bench::run(args).await,
        Command::Lessee { queue_url, queue, lease, count, hold, worker_id } => {
            let client = QueueClient::connect_lazy(&queue_url)?;
            let mut leased = 0u64;
            let mut out = std::io::stdout().lock();
            while count == 0 || leased < count {
                let want = if count == 0 { BATCH } else { BATCH.min((count - leased) as u32) };
                let items = client.lease(&queue, want, lease, WAIT, &worker_id).await?;
                for it in items {
                    writeln!(out, "{}", it.key)?;
                    out.flush()?;
                    leased += 1;
                    if !hold {
                        match client.done(&queue, &it.key, &it.lease_id, Outcome::Forget).await {
                            Ok(_) | Err(kjob_queue_client::ClientError::LeaseLost(_)) => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                }
            }
            if hold {
                // Hold the leases until killed: this process plays a worker that died mid-sync.
                std::future::pending::<()>().await;
            }
            Ok(())
        }
    }
}

mod bench {
    use std::net::{SocketAddr, TcpStream};
    use std::process::{Child, Command, Stdio};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use anyhow::Context;
    use kjob_queue_client::{Outcome, QueueClient, v1};
    use parking_lot::Mutex;

    /// Flags of `kjob-queue-bench run`.
    #[derive(Debug, clap::Args)]
    pub struct BenchArgs {
        /// redis-server binary.
        #[arg(long, default_value = "redis-server")]
        redis_server: String,
        /// redis-benchmark binary (for the ZADD ceiling).
        #[arg(long, default_value = "redis-benchmark")]
        redis_benchmark: String,
        /// Items in the throughput round.
        #[arg(long, default_value_t = 50_000)]
        items: usize,
        /// Lessees in the throughput round.
        #[arg(long, default_value_t = 8)]
        lessees: usize,
        /// Items per latency round.
        #[arg(long, default_value_t = 1_000)]
        latency_items: usize,
        /// Offered rate of the latency rounds, items/s.
        #[arg(long, default_value_t = 500)]
        latency_rate: u64,
        /// Requests of the redis-benchmark ZADD round.
        #[arg(long, default_value_t = 100_000)]
        zadd_requests: u64,
    }

    /// Add batch size of the throughput round.
    const ADD_BATCH: usize = 100;
    /// Keys per Lease call in the throughput round.
    const LEASE_BATCH: u32 = 50;
    const LEASE: Duration = Duration::from_secs(30);
    /// How long the whole benchmark may take before it is declared stuck.
    const ROUND_TIMEOUT: Duration = Duration::from_secs(300);

    struct Redis {
        child: Child,
        port: u16,
    }

    impl Drop for Redis {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    fn start_redis(bin: &str) -> anyhow::Result<Redis> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(bin)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "no", "--maxmemory-policy", "noeviction"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {bin}"))?;
        let redis = Redis { child, port };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            anyhow::ensure!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(redis)
    }

    /// Total commands run (scripts' inner commands included) and CPU seconds used by Redis.
    async fn redis_counters(
        conn: &mut redis::aio::MultiplexedConnection,
    ) -> anyhow::Result<(u64, f64)> {
        let stats: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await?;
        let calls = stats
            .lines()
            .filter_map(|l| l.split("calls=").nth(1))
            .filter_map(|r| r.split(',').next()?.parse::<u64>().ok())
            .sum();
        let cpu: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
        let secs = cpu
            .lines()
            .filter(|l| l.starts_with("used_cpu_sys:") || l.starts_with("used_cpu_user:"))
            .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
            .sum();
        Ok((calls, secs))
    }

    fn percentile(sorted: &[Duration], p: f64) -> Duration {
        if sorted.is_empty() {
            return Duration::ZERO;
        }
        let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
        sorted[i.min(sorted.len() - 1)]
    }

    async fn throughput(c: &QueueClient, items: usize, lessees: usize) -> anyhow::Result<Duration> {
        let done = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for w in 0..lessees {
            let (c, done) = (c.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                while done.load(Ordering::SeqCst) < items as u64 {
                    let got = c
                        .lease(
                            "job",
                            LEASE_BATCH,
                            LEASE,
                            Duration::from_millis(100),
                            &format!("bench-{w}"),
                        )
                        .await?;
                    let dones =
                        got.iter().map(|it| c.done("job", &it.key, &it.lease_id, Outcome::Forget));
                    for r in futures::future::join_all(dones).await {
                        r?;
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                }
                anyhow::Ok(())
            }));
        }
        let keys: Vec<String> =
            (0..items).map(|i| format!("bench-{:02}/job-{i:07}", i % 50)).collect();
        for chunk in keys.chunks(ADD_BATCH) {
            let batch = chunk
                .iter()
                .map(|k| v1::AddItem { queue: "job".into(), key: k.clone(), ..Default::default() })
                .collect();
            c.add(batch).await?;
        }
        for t in tasks {
            tokio::time::timeout(ROUND_TIMEOUT, t).await.context("throughput round stuck")???;
        }
        Ok(start.elapsed())
    }

    async fn latency(
        c: &QueueClient,
        items: usize,
        lessees: usize,
        rate: u64,
    ) -> anyhow::Result<Vec<Duration>> {
        let sent: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; items]));
        let got: Arc<Mutex<Vec<Duration>>> = Arc::new(Mutex::new(Vec::with_capacity(items)));
        let mut tasks = Vec::new();
        for w in 0..lessees {
            let (c, sent, got) = (c.clone(), sent.clone(), got.clone());
            tasks.push(tokio::spawn(async move {
                while got.lock().len() < items {
                    let leased = c
                        .lease("job", 1, LEASE, Duration::from_millis(500), &format!("lat-{w}"))
                        .await?;
                    let now = Instant::now();
                    for it in leased {
                        let idx: usize =
                            it.key.rsplit('-').next().and_then(|s| s.parse().ok()).unwrap_or(0);
                        if let Some(t0) = sent.lock()[idx] {
                            got.lock().push(now - t0);
                        }
                        c.done("job", &it.key, &it.lease_id, Outcome::Forget).await?;
                    }
                }
                anyhow::Ok(())
            }));
        }
        // Let every lessee reach its long poll before the first item.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(1) as f64));
        for i in 0..items {
            tick.tick().await;
            sent.lock()[i] = Some(Instant::now());
            let key = format!("lat-{lessees}/item-{i}");
            c.add(vec![v1::AddItem { queue: "job".into(), key, ..Default::default() }]).await?;
        }
        for t in tasks {
            tokio::time::timeout(ROUND_TIMEOUT, t).await.context("latency round stuck")???;
        }
        let mut v = got.lock().clone();
        v.sort();
        Ok(v)
    }

    fn redis_benchmark_zadd(bin: &str, port: u16, requests: u64) -> String {
        let out = Command::new(bin)
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-n",
                &requests.to_string(),
                "-c",
                "50",
                "-t",
                "zadd",
                "-q",
            ])
            .output();
        match out {
            Ok(o) if o.status.success() => {
                let text = String::from_utf8_lossy(&o.stdout);
                // -q prints "ZADD: 123456.79 requests per second, p50=…" (after \r progress).
                text.rsplit('\r')
                    .flat_map(|s| s.lines())
                    .find(|l| l.starts_with("ZADD"))
                    .map(|l| l.trim().to_string())
                    .unwrap_or_else(|| format!("unparsed output: {}", text.trim()))
            }
            Ok(o) => {
                format!("redis-benchmark failed: {}", String::from_utf8_lossy(&o.stderr).trim())
            }
            Err(e) => format!("redis-benchmark not run ({bin}: {e})"),
        }
    }

    /// Runs every round and prints the report on stdout.
    pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
        let BenchArgs {
            redis_server,
            redis_benchmark,
            items,
            lessees,
            latency_items,
            latency_rate,
            zadd_requests,
        } = args;
        anyhow::ensure!(items > 0 && lessees > 0 && latency_items > 0, "counts must be positive");
        let redis = start_redis(&redis_server)?;
        let redis_url = format!("redis://127.0.0.1:{}", redis.port);
        let mut conn =
            redis::Client::open(redis_url.as_str())?.get_multiplexed_async_connection().await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let queue_url = format!("http://{}", listener.local_addr()?);
        let shutdown = kjob_svc::Shutdown::new();
        let config =
            kjob_queue::Config { redis_url, admin_listener: None, store: Default::default() };
        let server = tokio::spawn(kjob_queue::run(listener, config, shutdown.clone()));
        let c = QueueClient::connect_lazy(&queue_url)?;
        c.stats("job").await?; // waits (with retries) until the server is up

        println!(
            "kjob-queue-bench: {items} items, {lessees} lessees, lease batch {LEASE_BATCH}, add batch {ADD_BATCH}"
        );
        let (calls0, cpu0) = redis_counters(&mut conn).await?;
        let took = throughput(&c, items, lessees).await?;
        let (calls1, cpu1) = redis_counters(&mut conn).await?;
        let n = items as f64;
        println!(
            "add→lease→done       {:>10.0} items/s   ({items} items in {took:.2?})",
            n / took.as_secs_f64()
        );
        println!("redis commands/item  {:>10.2}", (calls1 - calls0) as f64 / n);
        println!("redis CPU µs/item    {:>10.2}", (cpu1 - cpu0) * 1e6 / n);
        for l in [1usize, 8] {
            let v = latency(&c, latency_items, l, latency_rate).await?;
            println!(
                "enqueue→lease, {l} waiting lessee(s) at {latency_rate}/s: p50 {:.2?} p99 {:.2?} max {:.2?} ({} items)",
                percentile(&v, 0.5),
                percentile(&v, 0.99),
                v.last().copied().unwrap_or_default(),
                v.len()
            );
        }
        let s = c.stats("job").await?;
        anyhow::ensure!(s.ready + s.delayed + s.leased == 0, "queue not empty at the end: {s:?}");
        println!(
            "redis-benchmark ZADD (ceiling): {}",
            redis_benchmark_zadd(&redis_benchmark, redis.port, zadd_requests)
        );
        shutdown.cancel();
        server.await??;
        Ok(())
    }
}
