//! A real Redis Cluster on loopback, owned by one test: three masters, and optionally one
//! replica each with a short node timeout so a killed master fails over in seconds.

use std::path::{Path, PathBuf};

use anyhow::Context;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::redis::{RedisSecurity, RedisServer, redis_server_binary};

/// How long the cluster may take to report `cluster_state:ok` on every node.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// How long a replica may take to finish its first sync with its master.
const SYNC_TIMEOUT: Duration = Duration::from_secs(20);
/// `cluster-node-timeout` of a cluster without replicas: nothing fails over, so the default
/// margin against a slow test machine matters more than detection speed.
const NODE_TIMEOUT_MS: u64 = 5000;
/// `cluster-node-timeout` of a replicated cluster: a killed master is marked failed after it
/// and a replica elected a moment later, so a failover takes a few seconds in a test.
pub const REPLICATED_NODE_TIMEOUT_MS: u64 = 1000;

/// `redis-server --cluster-enabled yes` processes joined with `redis-cli --cluster create`.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// How many of `nodes` are masters at creation (the first ones).
    masters: usize,
    cli: Cli,
    tls: bool,
}

/// The redis-cli beside redis-server (or on PATH).
pub fn redis_cli() -> anyhow::Result<PathBuf> {
    let server = redis_server_binary()?;
    let beside = server.with_file_name("redis-cli");
    if beside.is_file() {
        return Ok(beside);
    }
    Ok(PathBuf::from("redis-cli"))
}

/// Starts one cluster node. Its bus port is a free port of its own (the default, port + 10000,
/// may not exist for a high free port); the bus port can be taken before the node binds it as
/// the client port can ([`RedisServer::start_with`] retries that one), so a node that never came
/// up is started again with another bus port.
///
/// A TLS node serves TLS only and speaks TLS on the cluster bus and to its master too
/// (`tls-cluster`, `tls-replication`). Without `tls-cluster yes` a node whose plain port is 0
/// announces itself as `host:0`, so `CLUSTER SLOTS` names port 0 for every slot: redis-cli's
/// `--cluster create` never sees the cluster agree, and a client following the slot map dials
/// port 0 again and again. And the bus always asks the connecting node for a client
/// certificate (whatever `tls-auth-clients` says): a node presenting its server certificate
/// (extended key usage serverAuth only) is refused, the nodes never meet, and `--cluster create`
/// waits for them forever. Each node therefore presents the PKI's client certificate
/// (`tls-client-cert-file`). Those two were the hang an earlier TLS cluster here ran into.
fn start_node(node_timeout_ms: u64, tls: Option<&Path>) -> anyhow::Result<RedisServer> {
    const BUS_ATTEMPTS: usize = 3;
    let mut attempt = 1;
    let timeout = node_timeout_ms.to_string();
    let in_pki = |f: &str| tls.map(|p| p.join(f).display().to_string()).unwrap_or_default();
    let (client_cert, client_key) = (in_pki("client.crt"), in_pki("client.key"));
    loop {
        let bus = crate::free_port().to_string();
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-node-timeout",
            &timeout,
            "--cluster-port",
            &bus,
        ];
        let started = match tls {
            Some(pki) => {
                args.extend(["--tls-cluster", "yes", "--tls-replication", "yes"]);
                args.extend([
                    "--tls-client-cert-file",
                    &client_cert,
                    "--tls-client-key-file",
                    &client_key,
                ]);
                let security = RedisSecurity { tls: Some(pki.to_path_buf()), ..Default::default() };
                RedisServer::start_secured(&security, &args)
            }
            None => RedisServer::start_with(false, &args),
        };
        match started {
            Ok(node) => return Ok(node),
            Err(e) if attempt < BUS_ATTEMPTS => {
                eprintln!(
                    "cluster node with bus port {bus} did not come up ({e:#}); another bus port"
                );
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Runs `cmd` to its end, or kills it after `timeout`: `redis-cli --cluster create` waits
/// forever for nodes that cannot meet.
fn output_within(mut cmd: Command, timeout: Duration) -> anyhow::Result<std::process::Output> {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running redis-cli")?;
    let deadline = Instant::now() + timeout;
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output()?;
            anyhow::bail!(
                "redis-cli --cluster create did not finish in {timeout:?} (the nodes never met): {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(child.wait_with_output()?)
}

/// redis-cli with the flags that reach the cluster's nodes (TLS and its CA for a TLS cluster).
#[derive(Debug, Clone)]
struct Cli {
    path: PathBuf,
    tls: Vec<String>,
}

impl Cli {
    fn new(tls: Option<&Path>) -> anyhow::Result<Self> {
        let tls = match tls {
            Some(pki) => {
                vec!["--tls".into(), "--cacert".into(), pki.join("ca.crt").display().to_string()]
            }
            None => Vec::new(),
        };
        Ok(Self { path: redis_cli()?, tls })
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.path);
        c.args(&self.tls);
        c
    }

    /// `redis-cli -p port args…`'s output ("" when it cannot run or the node is down).
    fn ask(&self, port: u16, args: &[&str]) -> String {
        self.command()
            .args(["-p", &port.to_string()])
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }
}

impl RedisCluster {
    /// Starts three masters on free ports, assigns all slots and waits until the cluster is ok.
    pub fn start() -> anyhow::Result<Self> {
        Self::start_nodes(0, NODE_TIMEOUT_MS, None)
    }

    /// Three masters with one replica each ([`REPLICATED_NODE_TIMEOUT_MS`]), every replica
    /// synced.
    pub fn start_replicated() -> anyhow::Result<Self> {
        Self::start_nodes(1, REPLICATED_NODE_TIMEOUT_MS, None)
    }

    /// [`Self::start_replicated`] serving TLS only, with the server certificate of `pki` (a
    /// [`crate::TestPki`] folder), on the cluster bus and between replicas too.
    pub fn start_replicated_tls(pki: &Path) -> anyhow::Result<Self> {
        Self::start_nodes(1, REPLICATED_NODE_TIMEOUT_MS, Some(pki))
    }

    fn start_nodes(
        replicas: usize,
        node_timeout_ms: u64,
        tls: Option<&Path>,
    ) -> anyhow::Result<Self> {
        const MASTERS: usize = 3;
        let mut nodes = Vec::new();
        for _ in 0..MASTERS * (1 + replicas) {
            nodes.push(start_node(node_timeout_ms, tls)?);
        }
        let cli = Cli::new(tls)?;
        let addrs: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())).collect();
        let mut create = cli.command();
        create.arg("--cluster").arg("create").args(&addrs).args([
            "--cluster-replicas",
            &replicas.to_string(),
            "--cluster-yes",
        ]);
        let out = output_within(create, READY_TIMEOUT)?;
        if !out.status.success() {
            anyhow::bail!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let cluster = Self { nodes, masters: MASTERS, cli, tls: tls.is_some() };
        cluster.wait_ok()?;
        if replicas > 0 {
            cluster.wait_replicas_synced()?;
        }
        Ok(cluster)
    }

    fn wait_replicas_synced(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + SYNC_TIMEOUT;
        for n in &self.nodes[self.masters..] {
            loop {
                let info = self.cli.ask(n.port(), &["info", "replication"]);
                if info.contains("role:slave") && info.contains("master_link_status:up") {
                    break;
                }
                if Instant::now() > deadline {
                    anyhow::bail!("replica {} not synced after {SYNC_TIMEOUT:?}: {info}", n.port());
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    /// The port of the master that serves `key`'s slot now.
    pub fn master_of(&self, key: &str) -> anyhow::Result<u16> {
        let live = self.live_port().context("no live node")?;
        let slot: u16 = self.cli.ask(live, &["cluster", "keyslot", key]).trim().parse()?;
        let nodes = self.cli.ask(live, &["cluster", "nodes"]);
        // `<id> <ip:port@bus> <flags> <master> <ping> <pong> <epoch> <state> <slots…>`
        for line in nodes.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 9 || !f[2].contains("master") || f[2].contains("fail") {
                continue;
            }
            let serves = f[8..].iter().any(|r| match r.split_once('-') {
                Some((a, b)) => {
                    a.parse::<u16>().is_ok_and(|a| a <= slot)
                        && b.parse::<u16>().is_ok_and(|b| slot <= b)
                }
                None => r.parse::<u16>().is_ok_and(|s| s == slot),
            });
            if serves {
                let port = f[1].split('@').next().and_then(|a| a.rsplit(':').next());
                return port.and_then(|p| p.parse().ok()).context("node address");
            }
        }
        anyhow::bail!("no live master serves slot {slot}:\n{nodes}")
    }

    /// Waits until every byte the master on `port` has taken is on its replica: what Redis
    /// acknowledged before then survives a failover.
    pub fn wait_replicated(&self, port: u16) -> anyhow::Result<()> {
        let deadline = Instant::now() + SYNC_TIMEOUT;
        loop {
            let info = self.cli.ask(port, &["info", "replication"]);
            let field = |name: &str| {
                info.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim().to_string())
            };
            let master = field("master_repl_offset:").and_then(|v| v.parse::<u64>().ok());
            // `slave0:ip=…,port=…,state=online,offset=N,lag=…`
            let replica = field("slave0:").and_then(|v| {
                v.split(',').find_map(|kv| kv.strip_prefix("offset=")?.parse::<u64>().ok())
            });
            if let (Some(m), Some(r)) = (master, replica)
                && r >= m
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                anyhow::bail!("replica of {port} did not catch up in {SYNC_TIMEOUT:?}: {info}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills (SIGKILL) the node listening on `port`.
    pub fn kill(&mut self, port: u16) -> anyhow::Result<()> {
        let n = self.nodes.iter_mut().find(|n| n.port() == port).context("no such node")?;
        n.kill();
        Ok(())
    }

    /// Waits until `port` is no longer the master of `key` and the cluster is ok again on a
    /// live node; returns the new master's port.
    pub fn wait_failover(&self, key: &str, port: u16, timeout: Duration) -> anyhow::Result<u16> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(p) = self.master_of(key)
                && p != port
                && self.cli.ask(p, &["cluster", "info"]).contains("cluster_state:ok")
            {
                return Ok(p);
            }
            if Instant::now() > deadline {
                anyhow::bail!("no failover of {key}'s master {port} after {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn live_port(&self) -> Option<u16> {
        self.nodes.iter().map(|n| n.port()).find(|p| self.cli.ask(*p, &["ping"]).contains("PONG"))
    }

    fn wait_ok(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let all_ok = self
                .nodes
                .iter()
                .all(|n| self.cli.ask(n.port(), &["cluster", "info"]).contains("cluster_state:ok"));
            if all_ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                anyhow::bail!("redis cluster not ok after {READY_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,…` (the kjob-queue cluster form; every node
    /// is a seed), `rediss+cluster://` for a TLS cluster.
    pub fn url(&self) -> String {
        let nodes: Vec<String> =
            self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())).collect();
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}+cluster://{}", nodes.join(","))
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }
}

/// A redis-server or a 3-master Redis Cluster, running while held: for suites that run the
/// same tests on both (and a TLS server's certificates, which must outlive it).
pub enum TestRedis {
    /// One plain redis-server.
    Single(RedisServer),
    /// A 3-master Redis Cluster.
    Cluster(RedisCluster),
    /// A TLS redis-server and the certificates it was started with.
    Secured(RedisServer, crate::TestPki),
}

impl TestRedis {
    /// Starts one plain redis-server.
    pub fn single() -> anyhow::Result<Self> {
        RedisServer::start().map(Self::Single)
    }

    /// Starts a Redis Cluster on a blocking thread (it waits for the cluster to form).
    pub async fn cluster() -> anyhow::Result<Self> {
        tokio::task::spawn_blocking(RedisCluster::start).await?.map(Self::Cluster)
    }

    /// The URL a client connects with (a cluster's first node).
    pub fn url(&self) -> String {
        match self {
            Self::Single(s) | Self::Secured(s, _) => s.url(),
            Self::Cluster(c) => c.url(),
        }
    }
}
