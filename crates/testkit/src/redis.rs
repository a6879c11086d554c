//! A real `redis-server` on a free loopback port, owned by one test.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::process::{ChildGuard, free_port, wait_for_tcp};

/// How long a redis-server may take to accept connections after spawn.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Finds the redis-server binary (`KJOB_REDIS_SERVER`, then PATH, then /usr/bin).
pub fn redis_server_binary() -> anyhow::Result<PathBuf> {
    if let Ok(p) = std::env::var("KJOB_REDIS_SERVER") {
        return Ok(PathBuf::from(p));
    }
    for dir in std::env::var("PATH").unwrap_or_default().split(':').chain(["/usr/bin", "/usr/sbin"])
    {
        let p = Path::new(dir).join("redis-server");
        if p.is_file() {
            return Ok(p);
        }
    }
    anyhow::bail!(
        "redis-server not found: run `make test` (it installs it) or apt-get install redis-server"
    )
}

/// A redis-server process with its own port and data directory.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: tempfile::TempDir,
    aof: bool,
    extra: Vec<String>,
    child: ChildGuard,
}

impl RedisServer {
    /// Starts a plain server (no persistence) on a free port.
    pub fn start() -> anyhow::Result<Self> {
        Self::start_with(false, &[])
    }

    /// Starts a server with AOF on (`appendfsync everysec`), so a restart keeps its data.
    pub fn start_with_aof() -> anyhow::Result<Self> {
        Self::start_with(true, &[])
    }

    /// Starts a server with extra `redis-server` arguments (e.g. `--cluster-enabled yes`).
    pub fn start_with(aof: bool, extra: &[&str]) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let port = free_port();
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let child = spawn(port, dir.path(), aof, &extra)?;
        Ok(Self { port, dir, aof, extra, child })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Its data directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills the server with SIGKILL (a crash).
    pub fn kill(&mut self) {
        self.child.kill();
    }

    /// Starts the server again on the same port and data directory (after [`Self::kill`]).
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.child.kill();
        self.child = spawn(self.port, self.dir.path(), self.aof, &self.extra)?;
        Ok(())
    }
}

fn spawn(port: u16, dir: &Path, aof: bool, extra: &[String]) -> anyhow::Result<ChildGuard> {
    let bin = redis_server_binary()?;
    let mut cmd = Command::new(bin);
    cmd.arg("--port")
        .arg(port.to_string())
        .arg("--bind")
        .arg("127.0.0.1")
        .arg("--dir")
        .arg(dir)
        .arg("--save")
        .arg("")
        .arg("--appendonly")
        .arg(if aof { "yes" } else { "no" })
        .arg("--appendfsync")
        .arg("everysec")
        .arg("--maxmemory-policy")
        .arg("noeviction")
        .arg("--daemonize")
        .arg("no")
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let child = ChildGuard::spawn(format!("redis-server:{port}"), &mut cmd)?;
    wait_for_tcp(SocketAddr::from(([127, 0, 0, 1], port)), START_TIMEOUT)?;
    Ok(child)
}
