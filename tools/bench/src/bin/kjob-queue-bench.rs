//! `kjob-queue-bench`: load tools for kjob-queue.
//!
//! `kjob-queue-bench run` (build with `--release`) is the whole queue benchmark in one report, on
//! one private redis-server (pinned to core 0; this process, the BullMQ driver and
//! redis-benchmark pinned to core 1): redis-benchmark ZADD/LPUSH as the raw ceiling, then
//! interleaved rounds (forward, reverse, …) of kjob-queue in gRPC service mode with 1 and N
//! lessees and of BullMQ 6.7.0 (`tools/bench/bullmq`, Worker concurrency 100, no-op processor), each
//! after a warm-up, reporting items/s, Redis commands and CPU µs per item (INFO commandstats /
//! INFO cpu deltas) and the per-round ratios with their min–max spread; then enqueue→lease
//! latency p50/p99 with waiting lessees. Correctness gates (every key processed, none held by
//! two lessees at once, queues empty) fail the run.
//!
//! `--topology single,cluster` adds kjob-queue's rounds on a private 3-master Redis Cluster
//! (testkit's, every master pinned to core 0 like the single server), interleaved with the
//! single-server rounds: items/s against one Redis per round, Redis CPU per item summed over
//! the masters, and each master's share of kjob's keys (DBSIZE with the queue filled) and of
//! its commands (INFO commandstats deltas per master). BullMQ stays on the single server.
//!
//! `--security both` (the default) runs every system twice: plain (no TLS, no passwords) and
//! secured as deploy/ runs kjob (Redis over TLS with ACL users, kjob-queue over mTLS with a
//! worker certificate; BullMQ's ioredis over the same TLS as its own ACL user), and reports what
//! TLS and authentication cost per item and per call.
//!
//! `kjob-queue-bench explain` fills the job queue (10,000 Jobs by default) under an in-process
//! kjob-queue and prints p50/p99 of its admin port's explain API (`kjob_bench::explain`).
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
    /// Fill the job queue and measure the admin port's explain API (p50/p99).
    Explain(kjob_bench::explain::ExplainArgs),
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

fn main() -> anyhow::Result<()> {
    let Args { command, log } = Args::parse();
    kjob_svc::init_logging(&log)?;
    // The runtime the kjob-queue binary runs on (`kjob_svc::main` with `Threads::One`): one
    // worker thread, the body a task on it. The in-process kjob-queue is measured as deployed,
    // not on tokio's default of a thread per CPU, which would put two threads on the clients'
    // single core and make every hand-over between them a context switch.
    match command {
        Command::Run(args) => kjob_svc::binary::run_on_workers(Some(1), bench::run(args)),
        other => tokio::runtime::Runtime::new()?.block_on(tools(other)),
    }
}

/// The other subcommands, on tokio's default runtime.
async fn tools(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run(args) => bench::run(args).await,
        Command::Explain(args) => kjob_bench::explain::run(args).await,
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
    use std::collections::HashMap;
    use std::net::{SocketAddr, TcpStream};
    use std::path::PathBuf;
    use std::process::{Child, Command, Stdio};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use anyhow::Context;
    use kjob_queue_client::{AddItem, Done, DoneItem, LeaseCall, Outcome, QueueClient};
    use parking_lot::Mutex;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    /// Flags of `kjob-queue-bench run`.
    #[derive(Debug, clap::Args)]
    pub struct BenchArgs {
        /// redis-server binary.
        #[arg(long, default_value = "redis-server")]
        redis_server: String,
        /// redis-benchmark binary (for the raw ceiling).
        #[arg(long, default_value = "redis-benchmark")]
        redis_benchmark: String,
        /// Items per measured throughput round (each system, each round).
        #[arg(long, default_value_t = 20_000)]
        items: usize,
        /// Items of the discarded warm-up before each measured round.
        #[arg(long, default_value_t = 1_000)]
        warmup: usize,
        /// Throughput rounds; odd rounds run the systems in reverse order (ABBA).
        #[arg(long, default_value_t = 4)]
        rounds: usize,
        /// Lessees of the many-lessee kjob configuration (the other one has a single lessee).
        #[arg(long, default_value_t = 8)]
        lessees: usize,
        /// Items per latency round.
        #[arg(long, default_value_t = 1_000)]
        latency_items: usize,
        /// Offered rate of the latency rounds, items/s: low enough that a single sequential
        /// lessee (Lease 1, Done, Lease again) is still waiting when an item arrives.
        #[arg(long, default_value_t = 200)]
        latency_rate: u64,
        /// Requests of each redis-benchmark round.
        #[arg(long, default_value_t = 100_000)]
        zadd_requests: u64,
        /// node binary for the BullMQ peer.
        #[arg(long, default_value = "node")]
        node: String,
        /// Directory of the BullMQ driver (package.json, package-lock.json, bench.js); `npm ci`
        /// runs there first if its node_modules are missing.
        #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/bullmq"))]
        bullmq_dir: PathBuf,
        /// Leave BullMQ out (kjob rounds only).
        #[arg(long)]
        skip_bullmq: bool,
        /// Do not pin Redis to core 0 and the clients to core 1.
        #[arg(long)]
        no_pin: bool,
        /// Plain (no TLS, no passwords), TLS (Redis over TLS with ACL users, kjob-queue over
        /// mTLS), or both one after the other.
        #[arg(long, value_enum, default_value_t = SecurityMode::Both)]
        security: SecurityMode,
        /// Where kjob-queue's rounds run, comma-separated: `single` (one redis-server) and/or
        /// `cluster` (a 3-master Redis Cluster, plain only, masters pinned to core 0 like the
        /// single server); cluster rounds are interleaved with the single ones and report each
        /// master's share of kjob's keys and commands. BullMQ always runs on the single server.
        #[arg(long, value_enum, value_delimiter = ',', default_value = "single")]
        topology: Vec<Topology>,
        /// Shards of kjob-queue's data set on the cluster (its `--queue-shards`); default
        /// kjob-queue's own (24 on a Cluster).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
        cluster_shards: Option<u32>,
    }

    /// `--topology`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
    pub enum Topology {
        /// One redis-server.
        Single,
        /// Three masters (made with redis-cli's cluster create, no replicas), kjob-queue at its
        /// default 24 shards.
        Cluster,
    }

    /// What one row of the report runs.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Kind {
        /// kjob-queue with this many lessees, on the single server or on the cluster.
        Kjob { lessees: usize, cluster: bool },
        /// The BullMQ driver (single server only: BullMQ keeps a queue under one hash tag).
        Bull,
    }

    type Systems = [(String, Kind)];

    /// Masters of the cluster (`Topology::Cluster`).
    const CLUSTER_MASTERS: usize = 3;
    /// A master's fair share, and the issue's tolerances around it (percentage points): keys
    /// ±8, commands ±10.
    const FAIR_SHARE: f64 = 100.0 / CLUSTER_MASTERS as f64;
    const KEY_SHARE_TOLERANCE: f64 = 8.0;
    const COMMAND_SHARE_TOLERANCE: f64 = 10.0;
    /// Cluster items/s ÷ single-Redis items/s the issue asks for (same cores, so the cluster
    /// can only show what it costs, not the capacity it adds).
    const CLUSTER_RATIO_TARGET: f64 = 0.9;
    /// Namespaces the bench's keys spread over (`<prefix>-00` … `<prefix>-49`, round robin), as
    /// a real cluster's Jobs would.
    const NAMESPACES: usize = 50;

    /// `--security`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
    pub enum SecurityMode {
        /// No TLS, no passwords.
        Plain,
        /// Redis over TLS with ACL users; kjob-queue over mTLS.
        Tls,
        /// Plain, then TLS.
        Both,
    }

    /// Passwords of the TLS Redis's ACL users (a private server on loopback for one run).
    const KJOB_PASSWORD: &str = "kjob-bench-password";
    const BULL_PASSWORD: &str = "bull-bench-password";
    const ADMIN_PASSWORD: &str = "admin-bench-password";

    /// Add batch size (BullMQ's addBulk gets the same).
    const ADD_BATCH: usize = 100;
    /// Keys per Lease call in the throughput rounds.
    const LEASE_BATCH: u32 = 50;
    const LEASE: Duration = Duration::from_secs(30);
    /// BullMQ Worker concurrency (the issue's reference configuration).
    const BULL_CONCURRENCY: u32 = 100;
    /// How long one round may take before it is declared stuck.
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

    /// `bin` on `core` when pinning, else plain.
    fn pinned(pin: bool, core: u32, bin: &str) -> Command {
        if pin {
            let mut c = Command::new("taskset");
            c.args(["-c", &core.to_string(), bin]);
            c
        } else {
            Command::new(bin)
        }
    }

    /// What a secured run adds: the Redis CA and server certificate (testkit's PKI, which also
    /// holds the aclfile) and kjob-queue's CA with its serving and a worker's certificate.
    struct Secured {
        redis_pki: kjob_testkit::TestPki,
        queue_ca: String,
        queue_server: kjob_queue::certs::Issued,
        queue_worker: kjob_queue::certs::Issued,
    }

    impl Secured {
        fn new() -> anyhow::Result<Self> {
            let redis_pki = kjob_testkit::TestPki::generate("kjob-queue-bench redis")?;
            let ca = kjob_queue::certs::Ca::new("kjob-queue-bench")?;
            let acl = [
                "user default off".to_string(),
                format!("user admin on >{ADMIN_PASSWORD} ~* &* +@all"),
                kjob_workqueue::acl::acl_user_line("kjob", &format!(">{KJOB_PASSWORD}")),
                // BullMQ documents no minimal command list; its user may run everything.
                format!("user bull on >{BULL_PASSWORD} ~* &* +@all"),
            ];
            std::fs::write(redis_pki.dir().join("users.acl"), acl.join("\n") + "\n")?;
            Ok(Self {
                queue_server: ca.server(&["127.0.0.1".to_string()])?,
                queue_worker: ca.client(kjob_queue::auth::Role::Worker.name())?,
                queue_ca: ca.own().cert_pem(),
                redis_pki,
            })
        }
    }

    /// One private redis-server and how each side reaches it, and (plain only, with
    /// `--topology cluster`) the private cluster kjob's cluster rounds use.
    struct Setup {
        redis: Redis,
        secured: Option<Secured>,
        cluster: Option<Cluster>,
    }

    /// A private 3-master Redis Cluster (testkit's: redis-server processes joined by
    /// `redis-cli --cluster create`), each master pinned to core 0 when pinning.
    struct Cluster {
        cluster: kjob_testkit::RedisCluster,
        /// `--cluster-shards`.
        shards: Option<u32>,
    }

    impl Cluster {
        /// Starts the cluster; when pinning, moves every master (all its threads, by the
        /// `process_id` its INFO reports) to core 0, where the single server runs.
        async fn start(pin: bool, shards: Option<u32>) -> anyhow::Result<Self> {
            let cluster = kjob_testkit::RedisCluster::start()?;
            anyhow::ensure!(cluster.nodes().len() == CLUSTER_MASTERS, "expected 3 masters");
            let me = Self { cluster, shards };
            if pin {
                for mut conn in me.admin().await? {
                    let info: String =
                        redis::cmd("INFO").arg("server").query_async(&mut conn).await?;
                    let pid = info
                        .lines()
                        .find_map(|l| l.strip_prefix("process_id:"))
                        .context("no process_id in INFO server")?
                        .trim()
                        .to_string();
                    let st =
                        Command::new("taskset").args(["-a", "-p", "-c", "0", &pid]).output()?;
                    anyhow::ensure!(st.status.success(), "taskset on redis-server {pid} failed");
                }
            }
            Ok(me)
        }

        fn ports(&self) -> Vec<u16> {
            self.cluster.nodes().iter().map(|n| n.port()).collect()
        }

        /// One direct connection per master (keyless commands: INFO, DBSIZE, SCAN, FLUSHALL).
        async fn admin(&self) -> anyhow::Result<Vec<Conn>> {
            let mut conns = Vec::new();
            for port in self.ports() {
                let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
                conns.push(client.get_multiplexed_async_connection().await?);
            }
            Ok(conns)
        }
    }

    impl Setup {
        fn name(&self) -> &'static str {
            if self.secured.is_some() { "TLS + auth" } else { "plain" }
        }

        /// The bench's own connection (counters, FLUSHALL).
        async fn admin(&self) -> anyhow::Result<Conn> {
            let port = self.redis.port;
            let client = match &self.secured {
                None => redis::Client::open(format!("redis://127.0.0.1:{port}"))?,
                Some(s) => redis::Client::build_with_tls(
                    format!("rediss://admin:{ADMIN_PASSWORD}@127.0.0.1:{port}"),
                    redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(std::fs::read(s.redis_pki.ca())?),
                    },
                )?,
            };
            Ok(client.get_multiplexed_async_connection().await?)
        }

        /// kjob-queue's configuration (on the single server, or on the cluster when
        /// `on_cluster`), the URL its clients dial and their security.
        fn kjob(
            &self,
            grpc: SocketAddr,
            on_cluster: bool,
        ) -> anyhow::Result<(kjob_queue::QueueConfig, String, kjob_queue_client::QueueSecurity)>
        {
            let port = self.redis.port;
            if on_cluster {
                let c = self.cluster.as_ref().context("no cluster in this setup")?;
                anyhow::ensure!(self.secured.is_none(), "the cluster rounds run plain only");
                let mut config = kjob_queue::QueueConfig::new(
                    c.cluster.url(),
                    kjob_queue::Security::InsecureNoAuth,
                );
                config.store.shards = c.shards;
                return Ok((
                    config,
                    format!("http://{grpc}"),
                    kjob_queue_client::QueueSecurity::Insecure,
                ));
            }
            Ok(match &self.secured {
                None => (
                    kjob_queue::QueueConfig::new(
                        format!("redis://127.0.0.1:{port}"),
                        kjob_queue::Security::InsecureNoAuth,
                    ),
                    format!("http://{grpc}"),
                    kjob_queue_client::QueueSecurity::Insecure,
                ),
                Some(s) => {
                    let mut config = kjob_queue::QueueConfig::new(
                        format!("rediss://127.0.0.1:{port}"),
                        kjob_queue::Security::Tls {
                            cert: s.queue_server.cert_pem().into_bytes(),
                            key: s.queue_server.key_pem().into_bytes(),
                            client_ca: s.queue_ca.clone().into_bytes(),
                        },
                    );
                    config.redis = kjob_workqueue::RedisOptions {
                        username: Some("kjob".into()),
                        password: Some(KJOB_PASSWORD.into()),
                        tls: kjob_workqueue::RedisTls {
                            ca_file: Some(s.redis_pki.ca()),
                            ..Default::default()
                        },
                    };
                    let client = kjob_queue_client::QueueSecurity::Tls {
                        ca: s.queue_ca.clone().into_bytes(),
                        cert: s.queue_worker.cert_pem().into_bytes(),
                        key: s.queue_worker.key_pem().into_bytes(),
                    };
                    (config, format!("https://{grpc}"), client)
                }
            })
        }

        /// The BullMQ driver's connection flags.
        fn bull_args(&self) -> Vec<String> {
            let mut a = vec!["--port".to_string(), self.redis.port.to_string()];
            if let Some(s) = &self.secured {
                a.extend(["--tls-ca".into(), s.redis_pki.ca().display().to_string()]);
                a.extend(["--username".into(), "bull".into(), "--password".into()]);
                a.push(BULL_PASSWORD.into());
            }
            a
        }
    }

    /// Starts redis-server on a free port: plain, or (with `secured`) TLS only with its ACL users.
    fn start_redis(bin: &str, pin: bool, secured: Option<Secured>) -> anyhow::Result<Setup> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut cmd = pinned(pin, 0, bin);
        match &secured {
            None => {
                cmd.args(["--port", &port.to_string()]);
            }
            Some(s) => {
                let f = |p: PathBuf| p.display().to_string();
                cmd.args(["--port", "0", "--tls-port", &port.to_string()])
                    .args(["--tls-cert-file", &f(s.redis_pki.server_cert())])
                    .args(["--tls-key-file", &f(s.redis_pki.server_key())])
                    .args(["--tls-ca-cert-file", &f(s.redis_pki.ca())])
                    .args(["--tls-auth-clients", "no"])
                    .args(["--aclfile", &f(s.redis_pki.dir().join("users.acl"))]);
            }
        }
        let child = cmd
            .args(["--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "no", "--maxmemory-policy", "noeviction"])
            .args(["--io-threads", "1"])
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
        Ok(Setup { redis, secured, cluster: None })
    }

    type Conn = redis::aio::MultiplexedConnection;

    /// Total commands run (scripts' inner commands included), CPU seconds used by Redis, and
    /// (calls, µs) per command name.
    #[derive(Debug, Clone, Default)]
    struct Counters {
        calls: u64,
        cpu_s: f64,
        by_command: HashMap<String, (u64, u64)>,
    }

    async fn counters(conn: &mut Conn) -> anyhow::Result<Counters> {
        let stats: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await?;
        let mut c = Counters::default();
        for l in stats.lines() {
            let Some((name, rest)) = l.strip_prefix("cmdstat_").and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            let field = |f: &str| {
                rest.split(f)
                    .nth(1)
                    .and_then(|r| r.split(',').next()?.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            let calls = field("calls=");
            c.calls += calls;
            c.by_command.insert(name.to_string(), (calls, field("usec=")));
        }
        let cpu: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
        c.cpu_s = cpu
            .lines()
            .filter(|l| l.starts_with("used_cpu_sys:") || l.starts_with("used_cpu_user:"))
            .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
            .sum();
        Ok(c)
    }

    /// [`counters`] of every node (one for the single server, each master of the cluster).
    async fn counters_all(conns: &mut [Conn]) -> anyhow::Result<Vec<Counters>> {
        let mut v = Vec::with_capacity(conns.len());
        for c in conns {
            v.push(counters(c).await?);
        }
        Ok(v)
    }

    /// The counters of several nodes added up (a cluster's CPU and commands summed over its
    /// masters).
    fn merged(nodes: &[Counters]) -> Counters {
        let mut m = Counters::default();
        for n in nodes {
            m.calls += n.calls;
            m.cpu_s += n.cpu_s;
            for (k, (calls, us)) in &n.by_command {
                let e = m.by_command.entry(k.clone()).or_insert((0, 0));
                e.0 += calls;
                e.1 += us;
            }
        }
        m
    }

    /// Commands a node ran between two snapshots, without the bench's own INFO calls.
    fn node_calls(before: &Counters, after: &Counters) -> u64 {
        let info = |c: &Counters| c.by_command.get("info").map_or(0, |v| v.0);
        let all = after.calls.saturating_sub(before.calls);
        all.saturating_sub(info(after).saturating_sub(info(before)))
    }

    async fn reset_all(conns: &mut [Conn]) -> anyhow::Result<()> {
        for c in conns {
            reset(c).await?;
        }
        Ok(())
    }

    async fn reset(conn: &mut Conn) -> anyhow::Result<()> {
        redis::cmd("FLUSHALL").query_async::<()>(conn).await?;
        redis::cmd("CONFIG").arg("RESETSTAT").query_async::<()>(conn).await?;
        Ok(())
    }

    /// One measured throughput round.
    #[derive(Debug, Clone)]
    struct Round {
        items_per_s: f64,
        cmds_per_item: f64,
        cpu_us_per_item: f64,
        /// CPU of the client side per item: this process for kjob (kjob-queue and its callers,
        /// in process), the driver for BullMQ (its producer and Worker).
        client_cpu_us_per_item: f64,
        /// RPCs per item (kjob only: Add, Lease and DoneBatch calls).
        calls_per_item: Option<f64>,
        /// The commands that took most time: (name, calls per item, µs per item).
        top: Vec<(String, f64, f64)>,
        /// Commands each node ran in the round (one entry on the single server, one per master
        /// on the cluster), the bench's own INFO calls left out.
        node_calls: Vec<u64>,
    }

    fn round(
        items: usize,
        took: Duration,
        before: &[Counters],
        after: &[Counters],
        client_cpu_s: f64,
        calls: Option<u64>,
    ) -> Round {
        let node_calls = before.iter().zip(after).map(|(b, a)| node_calls(b, a)).collect();
        let (before, after) = (&merged(before), &merged(after));
        let n = items as f64;
        let mut top: Vec<(String, f64, f64)> = after
            .by_command
            .iter()
            .map(|(k, (calls, us))| {
                let (c0, u0) = before.by_command.get(k).copied().unwrap_or((0, 0));
                (k.clone(), calls.saturating_sub(c0) as f64 / n, us.saturating_sub(u0) as f64 / n)
            })
            .collect();
        top.sort_by(|a, b| b.2.total_cmp(&a.2));
        top.truncate(4);
        Round {
            items_per_s: n / took.as_secs_f64(),
            cmds_per_item: (after.calls.saturating_sub(before.calls)) as f64 / n,
            cpu_us_per_item: (after.cpu_s - before.cpu_s) * 1e6 / n,
            client_cpu_us_per_item: client_cpu_s * 1e6 / n,
            calls_per_item: calls.map(|c| c as f64 / n),
            top,
            node_calls,
        }
    }

    fn percentile(sorted: &[Duration], p: f64) -> Duration {
        if sorted.is_empty() {
            return Duration::ZERO;
        }
        let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
        sorted[i.min(sorted.len() - 1)]
    }

    /// Who holds what: a key held twice at once or never processed fails the run.
    #[derive(Default)]
    struct Ledger {
        held: HashMap<String, bool>,
        processed: HashMap<String, u32>,
        overlaps: u64,
    }

    /// A kjob-queue served in this process for one round.
    struct Service {
        client: QueueClient,
        shutdown: kjob_svc::Shutdown,
        task: tokio::task::JoinHandle<anyhow::Result<()>>,
    }

    impl Service {
        async fn start(setup: &Setup, on_cluster: bool) -> anyhow::Result<Self> {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let (config, url, security) = setup.kjob(listener.local_addr()?, on_cluster)?;
            let shutdown = kjob_svc::Shutdown::new();
            let listeners = kjob_queue::Listeners::grpc(listener);
            let task = tokio::spawn(kjob_queue::run(listeners, config, shutdown.clone()));
            let client = QueueClient::connect_lazy_with(&url, &security)?;
            client.stats("job").await?; // waits (with retries) until the server is up
            Ok(Self { client, shutdown, task })
        }

        async fn stop(self) -> anyhow::Result<()> {
            self.shutdown.cancel();
            self.task.await??;
            Ok(())
        }
    }

    /// Adds `items` keys in batches while `lessees` lease (batches of 50) and finish them;
    /// returns the time until every key was processed and the RPCs it took.
    async fn throughput(
        c: &QueueClient,
        items: usize,
        lessees: usize,
        prefix: &str,
    ) -> anyhow::Result<(Duration, u64)> {
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let unique = Arc::new(AtomicU64::new(0));
        let calls = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for w in 0..lessees {
            let (c, ledger, unique, calls) =
                (c.clone(), ledger.clone(), unique.clone(), calls.clone());
            tasks.push(tokio::spawn(async move {
                let worker = format!("bench-{w}");
                // The leases finished since the last call: each batch's Dones ride on the
                // Lease that refills it (`lease_finishing`), as kjob's worker hands them in;
                // BullMQ's Worker, too, completes a job and fetches the next in one call.
                let mut finished: Vec<Done> = Vec::new();
                while unique.load(Ordering::SeqCst) < items as u64 {
                    let call = LeaseCall {
                        queue: "job",
                        max_items: LEASE_BATCH,
                        lease: LEASE,
                        wait: Duration::from_millis(100),
                        worker_id: &worker,
                        records: None,
                        cached: None,
                    };
                    let (got, results) =
                        c.lease_finishing(call, std::mem::take(&mut finished)).await?;
                    calls.fetch_add(1, Ordering::Relaxed);
                    for r in results {
                        r?;
                    }
                    let mut l = ledger.lock();
                    for it in &got {
                        if l.held.insert(it.key.clone(), true) == Some(true) {
                            l.overlaps += 1;
                        }
                        let n = l.processed.entry(it.key.clone()).or_insert(0);
                        *n += 1;
                        if *n == 1 {
                            unique.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    // Processed: no longer held once its Done is on its way.
                    finished = got
                        .iter()
                        .map(|it| {
                            l.held.insert(it.key.clone(), false);
                            Done::new("job", &it.key, &it.lease_id, Outcome::Forget)
                        })
                        .collect();
                }
                // The last batch's Dones, with nothing more to lease.
                if !finished.is_empty() {
                    let dones: Vec<DoneItem> = finished
                        .iter()
                        .map(|d| DoneItem {
                            queue: d.queue.clone(),
                            key: d.key.clone(),
                            lease_id: d.lease_id.clone(),
                            outcome: d.outcome,
                        })
                        .collect();
                    calls.fetch_add(1, Ordering::Relaxed);
                    for r in c.done_many(&dones).await? {
                        r?;
                    }
                }
                anyhow::Ok(())
            }));
        }
        let keys: Vec<String> = (0..items).map(|i| bench_key(prefix, i)).collect();
        for chunk in keys.chunks(ADD_BATCH) {
            let batch = chunk
                .iter()
                .map(|k| AddItem { queue: "job".into(), key: k.clone(), ..Default::default() })
                .collect();
            c.add(batch).await?;
            calls.fetch_add(1, Ordering::Relaxed);
        }
        for t in tasks {
            tokio::time::timeout(ROUND_TIMEOUT, t).await.context("throughput round stuck")???;
        }
        let took = start.elapsed();
        let (overlaps, missing) = {
            let l = ledger.lock();
            (l.overlaps, keys.iter().filter(|k| !l.processed.contains_key(*k)).count())
        };
        anyhow::ensure!(overlaps == 0, "GATE: {overlaps} keys were held by two lessees at once");
        anyhow::ensure!(missing == 0, "GATE: {missing} keys were never processed");
        let s = c.stats("job").await?;
        anyhow::ensure!(
            s.ready + s.delayed + s.leased == 0,
            "GATE: queue not empty after the round: {s:?}"
        );
        Ok((took, calls.load(Ordering::Relaxed)))
    }

    /// Key `i` of a round: Jobs spread round robin over [`NAMESPACES`] namespaces
    /// (`<prefix>-00` … `<prefix>-49`), so a sharded queue sees many namespaces in every shard.
    fn bench_key(prefix: &str, i: usize) -> String {
        format!("{prefix}-{:02}/job-{i:07}", i % NAMESPACES)
    }

    /// CPU seconds `pid` has used so far.
    fn cpu_of(pid: u32) -> anyhow::Result<f64> {
        Ok(kjob_bench::procfs::read_usage(pid, kjob_bench::procfs::clock_ticks())?.cpu_secs)
    }

    /// One kjob round on `conns` (the single server's connection, or one per cluster master).
    async fn kjob_round(
        setup: &Setup,
        conns: &mut [Conn],
        items: usize,
        warmup: usize,
        lessees: usize,
        on_cluster: bool,
    ) -> anyhow::Result<Round> {
        reset_all(conns).await?;
        let svc = Service::start(setup, on_cluster).await?;
        throughput(&svc.client, warmup, lessees, "warm").await?;
        let before = counters_all(conns).await?;
        let cpu0 = cpu_of(std::process::id())?;
        let (took, calls) = throughput(&svc.client, items, lessees, "bench").await?;
        let cpu = cpu_of(std::process::id())? - cpu0;
        let after = counters_all(conns).await?;
        svc.stop().await?;
        Ok(round(items, took, &before, &after, cpu, Some(calls)))
    }

    /// Each cluster master's part of kjob's data while the queue holds keys.
    #[derive(Debug, Default)]
    struct KeySpread {
        /// DBSIZE of each master: every key there is kjob's (the cluster is private).
        keys: Vec<u64>,
        /// Queued entries in each master's ready sets (ZCARD of its `…:ready…` ZSETs).
        entries: Vec<u64>,
    }

    /// Adds `items` keys ([`bench_key`], over [`NAMESPACES`] namespaces) to kjob-queue on the
    /// cluster with no lessee, counts each master's keys and queued entries, then leases every
    /// key back and finishes it. Gates: each key leased exactly once, the queue empty after.
    async fn key_spread(
        setup: &Setup,
        conns: &mut [Conn],
        items: usize,
    ) -> anyhow::Result<KeySpread> {
        reset_all(conns).await?;
        let svc = Service::start(setup, true).await?;
        let keys: Vec<String> = (0..items).map(|i| bench_key("fill", i)).collect();
        for chunk in keys.chunks(ADD_BATCH) {
            let batch = chunk
                .iter()
                .map(|k| AddItem { queue: "job".into(), key: k.clone(), ..Default::default() })
                .collect();
            svc.client.add(batch).await?;
        }
        let mut spread = KeySpread::default();
        for c in conns.iter_mut() {
            spread.keys.push(redis::cmd("DBSIZE").query_async(c).await?);
            let (mut cursor, mut entries) = (0u64, 0u64);
            loop {
                let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg("*:ready*")
                    .arg("COUNT")
                    .arg(1000)
                    .arg("TYPE")
                    .arg("zset")
                    .query_async(c)
                    .await?;
                for k in batch {
                    entries += redis::cmd("ZCARD").arg(&k).query_async::<u64>(c).await?;
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
            spread.entries.push(entries);
        }
        anyhow::ensure!(
            spread.entries.iter().sum::<u64>() == items as u64,
            "GATE: the masters' ready sets hold {:?} entries, not {items}",
            spread.entries
        );
        let mut leased = std::collections::HashSet::new();
        let deadline = Instant::now() + ROUND_TIMEOUT;
        while leased.len() < items {
            anyhow::ensure!(Instant::now() < deadline, "key-spread drain stuck");
            let got = svc
                .client
                .lease("job", LEASE_BATCH, LEASE, Duration::from_millis(100), "spread")
                .await?;
            let mut dones = Vec::with_capacity(got.len());
            for it in got {
                anyhow::ensure!(leased.insert(it.key.clone()), "GATE: {} leased twice", it.key);
                dones.push(DoneItem {
                    queue: "job".into(),
                    key: it.key,
                    lease_id: it.lease_id,
                    outcome: Outcome::Forget,
                });
            }
            for r in svc.client.done_many(&dones).await? {
                r?;
            }
        }
        let missing = keys.iter().filter(|k| !leased.contains(*k)).count();
        anyhow::ensure!(missing == 0, "GATE: {missing} keys were never leased");
        let s = svc.client.stats("job").await?;
        anyhow::ensure!(
            s.ready + s.delayed + s.leased == 0,
            "GATE: queue not empty after the drain: {s:?}"
        );
        svc.stop().await?;
        Ok(spread)
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
        // Open loop: each send waits for its slot in the schedule and does not wait for earlier
        // replies, so a slow reply does not delay later sends (no coordinated omission). The
        // latency is measured from the moment the send starts, as the BullMQ driver measures
        // it (`performance.now()` at `queue.add`): the timer that wakes the sender fires
        // 1-2 ms after the slot on these machines, and that lag is the bench's, not the queue's.
        let start = tokio::time::Instant::now();
        let interval = Duration::from_secs_f64(1.0 / rate.max(1) as f64);
        let mut sends = Vec::with_capacity(items);
        for i in 0..items {
            let slot = start + interval * i as u32;
            tokio::time::sleep_until(slot).await;
            let key = format!("lat-{lessees}/item-{i}");
            sent.lock()[i] = Some(Instant::now());
            let c = c.clone();
            sends.push(tokio::spawn(async move {
                c.add(vec![AddItem { queue: "job".into(), key, ..Default::default() }]).await
            }));
        }
        for s in sends {
            s.await??;
        }
        for t in tasks {
            tokio::time::timeout(ROUND_TIMEOUT, t).await.context("latency round stuck")???;
        }
        let mut v = got.lock().clone();
        anyhow::ensure!(v.len() == items, "GATE: {} of {items} latency items leased", v.len());
        v.sort();
        Ok(v)
    }

    /// The BullMQ driver process of one round.
    struct Node {
        child: tokio::process::Child,
        stdin: tokio::process::ChildStdin,
        lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    }

    impl Node {
        fn spawn(args: &BenchArgs, pin: bool, mode_args: &[String]) -> anyhow::Result<Self> {
            let mut cmd = tokio::process::Command::from(pinned(pin, 1, &args.node));
            let mut child = cmd
                .arg("bench.js")
                .args(mode_args)
                .current_dir(&args.bullmq_dir)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("starting {} bench.js", args.node))?;
            let stdin = child.stdin.take().context("node stdin")?;
            let stdout = child.stdout.take().context("node stdout")?;
            Ok(Self { child, stdin, lines: BufReader::new(stdout).lines() })
        }

        async fn line(&mut self) -> anyhow::Result<String> {
            let l = tokio::time::timeout(ROUND_TIMEOUT, self.lines.next_line())
                .await
                .context("BullMQ driver stuck")??;
            l.context("BullMQ driver exited early")
        }

        /// Waits for `ready`, snapshots the Redis counters, says `go`; returns the counters
        /// before, the result line and the driver's CPU seconds in between.
        async fn run(&mut self, conn: &mut Conn) -> anyhow::Result<(Counters, String, f64)> {
            let ready = self.line().await?;
            anyhow::ensure!(ready == "ready", "BullMQ driver said {ready:?}");
            let before = counters(conn).await?;
            let pid = self.child.id().context("BullMQ driver's pid")?;
            let cpu0 = cpu_of(pid)?;
            self.stdin.write_all(b"go\n").await?;
            self.stdin.flush().await?;
            let result = self.line().await?;
            Ok((before, result, cpu_of(pid)? - cpu0))
        }

        async fn finish(self) -> anyhow::Result<()> {
            let Self { mut child, stdin, .. } = self;
            drop(stdin);
            let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
                .await
                .context("BullMQ driver did not exit")??;
            anyhow::ensure!(status.success(), "BullMQ driver failed: {status}");
            Ok(())
        }
    }

    /// A number field of the driver's one-line, flat JSON result (`{"a":1,"b":2.5}`).
    pub(crate) fn num(v: &str, field: &str) -> anyhow::Result<f64> {
        let key = format!("\"{field}\":");
        v.split(&key)
            .nth(1)
            .and_then(|r| r.split([',', '}']).next()?.trim().parse().ok())
            .with_context(|| format!("no number {field} in the BullMQ result {v}"))
    }

    fn bull_gates(v: &str, items: usize) -> anyhow::Result<()> {
        anyhow::ensure!(num(v, "unique")? as usize == items, "GATE: BullMQ processed {v}");
        anyhow::ensure!(num(v, "overlaps")? == 0.0, "GATE: BullMQ ran a job twice at once: {v}");
        anyhow::ensure!(num(v, "left")? == 0.0, "GATE: BullMQ queue not empty: {v}");
        Ok(())
    }

    async fn bull_round(
        args: &BenchArgs,
        pin: bool,
        setup: &Setup,
        conn: &mut Conn,
    ) -> anyhow::Result<Round> {
        reset(conn).await?;
        let mode = ["throughput".to_string()]
            .into_iter()
            .chain(setup.bull_args())
            .chain(["--items".to_string(), args.items.to_string()])
            .chain(["--warmup".to_string(), args.warmup.to_string()])
            .chain(["--batch".to_string(), ADD_BATCH.to_string()])
            .chain(["--concurrency".to_string(), BULL_CONCURRENCY.to_string()])
            .collect::<Vec<_>>();
        let mut node = Node::spawn(args, pin, &mode)?;
        let (before, v, cpu) = node.run(conn).await?;
        let after = counters(conn).await?;
        node.finish().await?;
        bull_gates(&v, args.items)?;
        let took = Duration::from_secs_f64(num(&v, "elapsed_ms")? / 1000.0);
        Ok(round(args.items, took, &[before], &[after], cpu, None))
    }

    async fn bull_latency(
        args: &BenchArgs,
        pin: bool,
        setup: &Setup,
        conn: &mut Conn,
    ) -> anyhow::Result<[f64; 3]> {
        reset(conn).await?;
        let mode = ["latency".to_string()]
            .into_iter()
            .chain(setup.bull_args())
            .chain(["--items".to_string(), args.latency_items.to_string()])
            .chain(["--rate".to_string(), args.latency_rate.to_string()])
            .chain(["--concurrency".to_string(), BULL_CONCURRENCY.to_string()])
            .collect::<Vec<_>>();
        let mut node = Node::spawn(args, pin, &mode)?;
        let (_, v, _) = node.run(conn).await?;
        node.finish().await?;
        bull_gates(&v, args.latency_items)?;
        Ok([num(&v, "p50_ms")?, num(&v, "p99_ms")?, num(&v, "max_ms")?])
    }

    /// `redis-benchmark -t <test>` ops/s on the bench's Redis, pinned beside the clients.
    fn redis_benchmark(bin: &str, pin: bool, port: u16, test: &str, requests: u64) -> Option<f64> {
        let out = pinned(pin, 1, bin)
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-n", &requests.to_string()])
            .args(["-c", "50", "-t", test, "--csv"])
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        // --csv: a header line, then "ZADD","123456.79",...
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        text.lines()
            .find(|l| l.to_ascii_lowercase().contains(&format!("\"{test}")))?
            .split(',')
            .nth(1)?
            .trim_matches('"')
            .parse()
            .ok()
    }

    fn npm_ci(dir: &std::path::Path) -> anyhow::Result<()> {
        if dir.join("node_modules/bullmq/package.json").exists() {
            return Ok(());
        }
        eprintln!("installing the BullMQ driver's pinned packages (npm ci) in {}", dir.display());
        let status = Command::new("npm")
            .args(["ci", "--ignore-scripts", "--no-audit", "--no-fund"])
            .current_dir(dir)
            .status()
            .context("running npm ci")?;
        anyhow::ensure!(status.success(), "npm ci failed in {}", dir.display());
        Ok(())
    }

    /// Median, min and max.
    pub(crate) fn spread(v: &[f64]) -> (f64, f64, f64) {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        if s.is_empty() {
            return (f64::NAN, f64::NAN, f64::NAN);
        }
        let mid = if s.len() % 2 == 1 {
            s[s.len() / 2]
        } else {
            (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0
        };
        (mid, s[0], s[s.len() - 1])
    }

    fn fmt_spread(v: &[f64], prec: usize) -> String {
        let (m, lo, hi) = spread(v);
        format!("{m:.prec$} [{lo:.prec$}–{hi:.prec$}]")
    }

    /// Runs every round and prints the report on stdout.
    pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
        anyhow::ensure!(
            args.items > 0 && args.lessees > 0 && args.latency_items > 0 && args.rounds > 0,
            "counts must be positive"
        );
        anyhow::ensure!(!args.topology.is_empty(), "--topology needs single, cluster or both");
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let pin = !args.no_pin && cores >= 2 && Command::new("taskset").arg("-V").output().is_ok();
        if pin {
            // This process (load generator and in-process kjob-queue) on core 1, every thread.
            let me = std::process::id().to_string();
            let st = Command::new("taskset").args(["-a", "-p", "-c", "1", &me]).output()?;
            anyhow::ensure!(st.status.success(), "taskset on self failed");
        }
        if !args.skip_bullmq {
            npm_ci(&args.bullmq_dir)?;
        }
        let mut setups = Vec::new();
        if args.security != SecurityMode::Tls {
            setups.push(start_redis(&args.redis_server, pin, None)?);
        }
        if args.security != SecurityMode::Plain {
            setups.push(start_redis(&args.redis_server, pin, Some(Secured::new()?))?);
        }
        if args.topology.contains(&Topology::Cluster) {
            anyhow::ensure!(
                setups[0].secured.is_none(),
                "the cluster rounds run plain only: --topology cluster needs --security plain or both"
            );
            setups[0].cluster = Some(Cluster::start(pin, args.cluster_shards).await?);
        }
        let mut conn = setups[0].admin().await?;
        let version: String = redis::cmd("INFO").arg("server").query_async(&mut conn).await?;
        let version = version
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("?")
            .to_string();

        println!("# kjob-queue-bench");
        println!(
            "Redis {version} {}; {} items per throughput round after a {}-item warm-up; {} rounds in ABBA order; Add batches of {ADD_BATCH}, Lease batches of {LEASE_BATCH}, each batch's Dones carried by the Lease that refills it (as kjob's worker does; BullMQ's Worker completes a job and fetches the next in one call)",
            if pin { "pinned to core 0, every client pinned to core 1" } else { "unpinned" },
            args.items,
            args.warmup,
            args.rounds
        );
        println!(
            "Keys `<prefix>-NN/job-NNNNNNN` round robin over {NAMESPACES} namespaces; kjob-queue at 1 shard on one server, {} on the Cluster{}",
            args.cluster_shards.unwrap_or(kjob_workqueue::DEFAULT_SHARDS),
            if args.cluster_shards.is_some() { " (--cluster-shards)" } else { " (its default)" }
        );
        if let Some(c) = &setups[0].cluster {
            println!(
                "Redis Cluster: {CLUSTER_MASTERS} masters (no replicas) on ports {:?}, {} like the single server (plain only); its rounds run interleaved with the single server's",
                c.ports(),
                if pin { "every master pinned to core 0" } else { "unpinned" },
            );
        }
        let plain = setups.iter().find(|s| s.secured.is_none());
        let bench = |test| {
            let port = plain?.redis.port;
            redis_benchmark(&args.redis_benchmark, pin, port, test, args.zadd_requests)
        };
        let (zadd, lpush) = (bench("zadd"), bench("lpush"));
        let show = |v: Option<f64>| v.map(|v| format!("{v:.0} ops/s")).unwrap_or("not run".into());
        println!("redis-benchmark ZADD (raw ceiling): {}; LPUSH: {}", show(zadd), show(lpush));

        let many = args.lessees;
        let single = args.topology.contains(&Topology::Single);
        let mut systems: Vec<(String, Kind)> = Vec::new();
        // Each cluster configuration right after its single-server twin: the pairs run back to
        // back in every round, so the cluster ÷ single ratio is taken per round.
        for lessees in [1, many] {
            let n =
                if lessees == 1 { "1 lessee".to_string() } else { format!("{lessees} lessees") };
            if single {
                systems.push((
                    format!("kjob, {n} (gRPC service)"),
                    Kind::Kjob { lessees, cluster: false },
                ));
            }
            if setups[0].cluster.is_some() {
                systems.push((
                    format!("kjob, {n}, 3-master cluster"),
                    Kind::Kjob { lessees, cluster: true },
                ));
            }
        }
        if !args.skip_bullmq {
            systems
                .push((format!("BullMQ 6.7.0, Worker concurrency {BULL_CONCURRENCY}"), Kind::Bull));
        }
        // The TLS setup has no cluster: its rows are the single-server ones.
        let tls_systems: Vec<(String, Kind)> = systems
            .iter()
            .filter(|(_, k)| !matches!(k, Kind::Kjob { cluster: true, .. }))
            .cloned()
            .collect();
        let mut all: Vec<Vec<Vec<Round>>> = Vec::new();
        let mut fill = None;
        for setup in &setups {
            let systems = if setup.cluster.is_some() { &systems[..] } else { &tls_systems[..] };
            let mut conn = setup.admin().await?;
            let mut masters = match &setup.cluster {
                Some(c) => c.admin().await?,
                None => Vec::new(),
            };
            let mut results: Vec<Vec<Round>> = vec![Vec::new(); systems.len()];
            for r in 0..args.rounds {
                let mut order: Vec<usize> = (0..systems.len()).collect();
                if r % 2 == 1 {
                    order.reverse();
                }
                for i in order {
                    let (items, warmup) = (args.items, args.warmup);
                    let res = match systems[i].1 {
                        Kind::Kjob { lessees, cluster: false } => {
                            let conns = std::slice::from_mut(&mut conn);
                            kjob_round(setup, conns, items, warmup, lessees, false).await?
                        }
                        Kind::Kjob { lessees, cluster: true } => {
                            kjob_round(setup, &mut masters, items, warmup, lessees, true).await?
                        }
                        Kind::Bull => bull_round(&args, pin, setup, &mut conn).await?,
                    };
                    eprintln!(
                        "{} round {r}: {}: {:.0} items/s",
                        setup.name(),
                        systems[i].0,
                        res.items_per_s
                    );
                    results[i].push(res);
                }
            }
            if setup.cluster.is_some() {
                fill = Some(key_spread(setup, &mut masters, args.items).await?);
            }
            report(setup, systems, &results, if setup.secured.is_none() { zadd } else { None });
            if let (Some(c), Some(fill)) = (&setup.cluster, &fill) {
                cluster_report(&c.ports(), systems, &results, fill, args.items);
            }
            println!();
            println!(
                "enqueue→lease latency, {} items at {}/s, lessees waiting, single server (target p99 ≤ 5 ms):",
                args.latency_items, args.latency_rate
            );
            for l in [1usize, many] {
                reset(&mut conn).await?;
                let svc = Service::start(setup, false).await?;
                let v = latency(&svc.client, args.latency_items, l, args.latency_rate).await?;
                svc.stop().await?;
                println!(
                    "  kjob, {l} waiting lessee(s): p50 {:.2?} p99 {:.2?} max {:.2?}",
                    percentile(&v, 0.5),
                    percentile(&v, 0.99),
                    v.last().copied().unwrap_or_default(),
                );
            }
            if !args.skip_bullmq {
                let [p50, p99, max] = bull_latency(&args, pin, setup, &mut conn).await?;
                println!(
                    "  BullMQ, Worker concurrency {BULL_CONCURRENCY} waiting: p50 {p50:.2}ms p99 {p99:.2}ms max {max:.2}ms"
                );
            }
            all.push(results);
        }
        if let [plain, secured] = &all[..] {
            security_cost(&systems, plain, &tls_systems, secured);
        }
        println!();
        println!(
            "correctness gates passed: every key processed, none held twice at once, queues empty"
        );
        Ok(())
    }

    /// The throughput table, the costliest commands and the ratios against BullMQ of one setup.
    fn report(setup: &Setup, systems: &Systems, results: &[Vec<Round>], zadd: Option<f64>) {
        println!();
        println!("## {}", setup.name());
        if setup.secured.is_some() {
            println!(
                "Redis serves TLS only (ACL users, `default` off; kjob as deploy's user with exactly its commands, BullMQ as a user allowed every command); kjob-queue serves mTLS and its callers present a kjob-worker certificate; BullMQ's ioredis speaks TLS to the same Redis."
            );
        }
        println!();
        println!(
            "{:<44} {:>24} {:>14} {:>20} {:>18} {:>12}",
            "system",
            "items/s med [min–max]",
            "Redis cmds/item",
            "Redis CPU µs/item",
            "client CPU µs/item",
            "÷ ZADD ops/s"
        );
        for (i, (name, kind)) in systems.iter().enumerate() {
            let of = |f: fn(&Round) -> f64| results[i].iter().map(f).collect::<Vec<f64>>();
            let ips = of(|r| r.items_per_s);
            // The ceiling is the single server's: no fraction for the cluster's rows.
            let zadd = zadd.filter(|_| !matches!(kind, Kind::Kjob { cluster: true, .. }));
            let frac = zadd.map(|z| format!("{:.3}", spread(&ips).0 / z)).unwrap_or("-".into());
            println!(
                "{name:<44} {:>24} {:>14.2} {:>20} {:>18} {frac:>12}",
                fmt_spread(&ips, 0),
                spread(&of(|r| r.cmds_per_item)).0,
                fmt_spread(&of(|r| r.cpu_us_per_item), 1),
                fmt_spread(&of(|r| r.client_cpu_us_per_item), 1),
            );
        }
        println!();
        println!(
            "costliest Redis commands, calls and µs per item (last round; INFO commandstats, a script's time includes its inner commands):"
        );
        for (i, (name, _)) in systems.iter().enumerate() {
            if let Some(r) = results[i].last() {
                let top: Vec<String> =
                    r.top.iter().map(|(k, c, u)| format!("{k} {c:.2}× {u:.1}µs")).collect();
                println!("  {name}: {}", top.join(", "));
            }
        }
        let Some(bull) = systems.iter().position(|(_, kind)| *kind == Kind::Bull) else {
            return;
        };
        println!();
        println!("ratios per round (pairs run back to back), median [min–max]:");
        let single_kjob = systems
            .iter()
            .enumerate()
            .filter(|(_, (_, kind))| matches!(kind, Kind::Kjob { cluster: false, .. }));
        for (k, _) in single_kjob {
            let pair = |f: fn(&Round, &Round) -> f64| {
                results[k].iter().zip(&results[bull]).map(|(a, b)| f(a, b)).collect::<Vec<f64>>()
            };
            println!(
                "  {}: items/s ×{} of BullMQ (target ≥ 3); Redis CPU per item BullMQ ÷ kjob = {} (target ≥ 3)",
                systems[k].0,
                fmt_spread(&pair(|a, b| a.items_per_s / b.items_per_s), 2),
                fmt_spread(&pair(|a, b| b.cpu_us_per_item / a.cpu_us_per_item), 2)
            );
        }
    }

    /// `v` in percent of `total`.
    fn pct(v: u64, total: u64) -> f64 {
        if total == 0 { f64::NAN } else { v as f64 * 100.0 / total as f64 }
    }

    fn verdict(ok: bool) -> &'static str {
        if ok { "met" } else { "NOT met" }
    }

    /// The cluster's figures: items/s against the single server per round, and each master's
    /// share of kjob's keys (from [`key_spread`]) and commands (INFO commandstats per master,
    /// per round), each against the issue's target.
    fn cluster_report(
        ports: &[u16],
        systems: &Systems,
        results: &[Vec<Round>],
        fill: &KeySpread,
        items: usize,
    ) {
        println!();
        println!("## Redis Cluster ({CLUSTER_MASTERS} masters) against one Redis");
        println!();
        println!(
            "cluster ÷ single items/s per round (pairs run back to back), median [min–max] (target ≥ {CLUSTER_RATIO_TARGET}; both on core 0, so this shows what the cluster costs, not the capacity it adds):"
        );
        for (c, (name, kind)) in systems.iter().enumerate() {
            let Kind::Kjob { lessees, cluster: true } = *kind else { continue };
            let twin =
                systems.iter().position(|(_, k)| *k == Kind::Kjob { lessees, cluster: false });
            let Some(s) = twin else {
                println!("  {name}: no single-server rounds to compare with");
                continue;
            };
            let ratios: Vec<f64> = results[c]
                .iter()
                .zip(&results[s])
                .map(|(a, b)| a.items_per_s / b.items_per_s)
                .collect();
            let cpu: Vec<f64> = results[c]
                .iter()
                .zip(&results[s])
                .map(|(a, b)| a.cpu_us_per_item / b.cpu_us_per_item)
                .collect();
            println!(
                "  {name}: ×{} — {}; Redis CPU per item (summed over masters) ×{} of one Redis",
                fmt_spread(&ratios, 2),
                verdict(spread(&ratios).0 >= CLUSTER_RATIO_TARGET),
                fmt_spread(&cpu, 2),
            );
        }
        println!();
        let (klo, khi) = (FAIR_SHARE - KEY_SHARE_TOLERANCE, FAIR_SHARE + KEY_SHARE_TOLERANCE);
        let (clo, chi) =
            (FAIR_SHARE - COMMAND_SHARE_TOLERANCE, FAIR_SHARE + COMMAND_SHARE_TOLERANCE);
        println!(
            "per master, with {items} keys queued over {NAMESPACES} namespaces: share of kjob's keys (DBSIZE; target {klo:.0}–{khi:.0} %) and of the queued entries (ZCARD of its ready sets), then share of kjob's commands in each system's rounds (INFO commandstats deltas, scripts' inner commands included; median [min–max] over rounds; target {clo:.0}–{chi:.0} %):"
        );
        let (keys, entries) = (fill.keys.iter().sum(), fill.entries.iter().sum());
        let mut all_met = true;
        for (m, port) in ports.iter().enumerate() {
            let key_share = pct(fill.keys[m], keys);
            let key_ok = (klo..=khi).contains(&key_share);
            let mut line = format!(
                "  master 127.0.0.1:{port}: keys {} of {keys} = {key_share:.1} % ({}), entries {:.1} %",
                fill.keys[m],
                verdict(key_ok),
                pct(fill.entries[m], entries),
            );
            all_met &= key_ok;
            for (c, (name, kind)) in systems.iter().enumerate() {
                if !matches!(kind, Kind::Kjob { cluster: true, .. }) {
                    continue;
                }
                let shares: Vec<f64> = results[c]
                    .iter()
                    .map(|r| pct(r.node_calls[m], r.node_calls.iter().sum()))
                    .collect();
                let (med, lo, hi) = spread(&shares);
                let ok = (clo..=chi).contains(&lo) && (clo..=chi).contains(&hi);
                all_met &= ok;
                line +=
                    &format!("; commands ({name}): {med:.1} % [{lo:.1}–{hi:.1}] ({})", verdict(ok));
            }
            println!("{line}");
        }
        println!("cluster share targets: {}", if all_met { "all met" } else { "NOT all met" });
    }

    /// What TLS and authentication cost each system: throughput and CPU, secured against plain
    /// (medians of each setup's rounds), and for kjob the added CPU per RPC.
    fn security_cost(
        plain_systems: &Systems,
        plain: &[Vec<Round>],
        systems: &Systems,
        tls: &[Vec<Round>],
    ) {
        let med =
            |rs: &[Round], f: fn(&Round) -> f64| spread(&rs.iter().map(f).collect::<Vec<_>>()).0;
        println!();
        println!("## what TLS and authentication cost (medians, TLS + auth against plain)");
        println!();
        println!(
            "{:<44} {:>14} {:>24} {:>24} {:>26}",
            "system",
            "items/s ratio",
            "Redis CPU µs/item",
            "client CPU µs/item",
            "added CPU µs per RPC"
        );
        for (i, (name, _)) in systems.iter().enumerate() {
            let Some(pi) = plain_systems.iter().position(|(n, _)| n == name) else {
                continue;
            };
            let (p, t) = (&plain[pi][..], &tls[i][..]);
            let redis = (med(p, |r| r.cpu_us_per_item), med(t, |r| r.cpu_us_per_item));
            let client =
                (med(p, |r| r.client_cpu_us_per_item), med(t, |r| r.client_cpu_us_per_item));
            let per_call = med(t, |r| r.calls_per_item.unwrap_or(f64::NAN));
            let per_rpc = if per_call.is_finite() && per_call > 0.0 {
                format!(
                    "{:.0} (kjob side) + {:.0} (Redis)",
                    (client.1 - client.0) / per_call,
                    (redis.1 - redis.0) / per_call
                )
            } else {
                "-".to_string()
            };
            println!(
                "{name:<44} {:>14} {:>24} {:>24} {per_rpc:>26}",
                format!("×{:.2}", med(t, |r| r.items_per_s) / med(p, |r| r.items_per_s)),
                format!("{:.1} → {:.1}", redis.0, redis.1),
                format!("{:.1} → {:.1}", client.0, client.1),
            );
        }
        println!(
            "kjob's client CPU is this process: kjob-queue and its callers in one process, so each RPC's TLS is paid on both ends; BullMQ's is its driver (producer and Worker); an RPC here is an Add of {ADD_BATCH} keys, a Lease of up to {LEASE_BATCH} carrying the previous batch's Dones (a DoneBatch for the last)."
        );
    }
}

#[cfg(test)]
mod tests {
    use super::bench::{num, spread};

    #[test]
    fn parses_driver_results() {
        let v = r#"{"items":500,"p50_ms":56.9,"p99_ms":289.7,"unique":500,"left":0}"#;
        assert_eq!(num(v, "p50_ms").unwrap(), 56.9);
        assert_eq!(num(v, "left").unwrap(), 0.0);
        assert_eq!(num(v, "items").unwrap(), 500.0);
        assert!(num(v, "max_ms").is_err());
    }

    #[test]
    fn median_and_range() {
        assert_eq!(spread(&[3.0, 1.0, 2.0]), (2.0, 1.0, 3.0));
        assert_eq!(spread(&[4.0, 1.0, 2.0, 3.0]), (2.5, 1.0, 4.0));
        assert!(spread(&[]).0.is_nan());
    }
}
