//! A real 3-node Redis Cluster on loopback (no replicas), owned by one test.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::redis::{RedisServer, redis_server_binary};

/// How long the cluster may take to report `cluster_state:ok` on every node.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// Three `redis-server --cluster-enabled yes` processes joined with `redis-cli --cluster create`.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
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
fn start_node() -> anyhow::Result<RedisServer> {
    const BUS_ATTEMPTS: usize = 3;
    let mut attempt = 1;
    loop {
        let bus = crate::free_port().to_string();
        let args =
            ["--cluster-enabled", "yes", "--cluster-node-timeout", "5000", "--cluster-port", &bus];
        match RedisServer::start_with(false, &args) {
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

impl RedisCluster {
    /// Starts three nodes on free ports, assigns all slots and waits until the cluster is ok.
    pub fn start() -> anyhow::Result<Self> {
        let mut nodes = Vec::new();
        for _ in 0..3 {
            nodes.push(start_node()?);
        }
        let cli = redis_cli()?;
        let addrs: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())).collect();
        let out = Command::new(&cli)
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .map_err(|e| anyhow::anyhow!("running {}: {e}", cli.display()))?;
        if !out.status.success() {
            anyhow::bail!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let cluster = Self { nodes };
        cluster.wait_ok(&cli)?;
        Ok(cluster)
    }

    fn wait_ok(&self, cli: &PathBuf) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let all_ok = self.nodes.iter().all(|n| {
                Command::new(cli)
                    .args(["-p", &n.port().to_string(), "cluster", "info"])
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).contains("cluster_state:ok"))
                    .unwrap_or(false)
            });
            if all_ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                anyhow::bail!("redis cluster not ok after {READY_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3` (the kjob-queue cluster form).
    pub fn url(&self) -> String {
        let nodes: Vec<String> =
            self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())).collect();
        format!("redis+cluster://{}", nodes.join(","))
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }
}
