//! A real `redis-server` on a free loopback port, owned by one test.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{ChildGuard, free_port};

/// How long a redis-server may take to accept connections after spawn.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Fresh ports tried when a new server exits before it listens: [`free_port`] frees the port
/// it found before redis-server binds it, so a test starting in parallel (or an outgoing
/// connection's ephemeral port) can take it in between.
const START_ATTEMPTS: usize = 5;
/// Last lines of a failed server's log quoted in the error.
const LOG_TAIL_LINES: usize = 5;
/// What redis-server logs once it listens.
const READY_MARKER: &[u8] = b"Ready to accept connections";

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

/// How a test redis-server authenticates and encrypts: TLS only (no plain port), and ACL
/// users from an aclfile.
#[derive(Debug, Clone, Default)]
pub struct RedisSecurity {
    /// Serve TLS only, with the server certificate of this CA's directory
    /// ([`crate::TestPki`] files: `ca.crt`, `server.crt`, `server.key`).
    pub tls: Option<PathBuf>,
    /// With TLS: ask clients for a certificate signed by the CA (`tls-auth-clients yes`).
    pub tls_auth_clients: bool,
    /// aclfile lines (e.g. `user default off`, `user kjob on >pw ~{wq:* …`); empty: no aclfile.
    pub acl: Vec<String>,
}

/// A redis-server process with its own port and data directory.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: tempfile::TempDir,
    aof: bool,
    extra: Vec<String>,
    tls: bool,
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
    /// A server that exits before it listens (its port was taken meanwhile) is started again
    /// on another port, up to [`START_ATTEMPTS`] times.
    pub fn start_with(aof: bool, extra: &[&str]) -> anyhow::Result<Self> {
        let extra = extra.iter().map(|s| s.to_string()).collect();
        Self::start_in(tempfile::tempdir()?, aof, extra, false)
    }

    /// Starts a server with TLS and/or ACL users (see [`RedisSecurity`]) and extra arguments.
    pub fn start_secured(security: &RedisSecurity, extra: &[&str]) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let mut args: Vec<String> = Vec::new();
        if let Some(pki) = &security.tls {
            let f = |name: &str| pki.join(name).display().to_string();
            args.extend([
                "--tls-cert-file".into(),
                f("server.crt"),
                "--tls-key-file".into(),
                f("server.key"),
                "--tls-ca-cert-file".into(),
                f("ca.crt"),
                "--tls-auth-clients".into(),
                if security.tls_auth_clients { "yes" } else { "no" }.into(),
            ]);
        }
        if !security.acl.is_empty() {
            let aclfile = dir.path().join("users.acl");
            std::fs::write(&aclfile, security.acl.join("\n") + "\n")?;
            args.extend(["--aclfile".into(), aclfile.display().to_string()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        Self::start_in(dir, false, args, security.tls.is_some())
    }

    fn start_in(
        dir: tempfile::TempDir,
        aof: bool,
        extra: Vec<String>,
        tls: bool,
    ) -> anyhow::Result<Self> {
        let mut attempt = 1;
        loop {
            let port = free_port();
            match spawn(port, dir.path(), aof, tls, &extra) {
                Ok(child) => return Ok(Self { port, dir, aof, extra, tls, child }),
                Err(Start::Exited(why)) if attempt < START_ATTEMPTS => {
                    eprintln!(
                        "redis-server on port {port} exited before listening ({why}); another port"
                    );
                    attempt += 1;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT` (`rediss://` for a TLS server).
    pub fn url(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Every key with its DUMP, so two equal snapshots mean no key was added, removed or
    /// changed (what "a refused request changes nothing" tests compare). A server without TLS
    /// or ACL users ([`Self::start`], [`Self::start_with`]).
    pub async fn snapshot(&self) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
        let client = redis::Client::open(self.url())?;
        let mut c = client.get_multiplexed_async_connection().await?;
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut c).await?;
        let mut out = BTreeMap::new();
        for k in keys {
            let dump: Vec<u8> = redis::cmd("DUMP").arg(&k).query_async(&mut c).await?;
            out.insert(k, dump);
        }
        Ok(out)
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
        self.child = spawn(self.port, self.dir.path(), self.aof, self.tls, &self.extra)?;
        Ok(())
    }
}

/// Why a redis-server did not come up.
#[derive(Debug)]
enum Start {
    /// It exited before accepting connections (most often: its port was taken); its log tail.
    Exited(String),
    /// It could not be spawned, or it runs but does not listen in time.
    Other(anyhow::Error),
}

impl From<anyhow::Error> for Start {
    fn from(e: anyhow::Error) -> Self {
        Self::Other(e)
    }
}

impl std::fmt::Display for Start {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exited(log) => write!(f, "redis-server exited before listening (log: {log})"),
            Self::Other(e) => write!(f, "{e:#}"),
        }
    }
}

impl std::error::Error for Start {}

/// Starts redis-server on `port` (its TLS port, with no plain port, when `tls`) and waits until
/// it listens; its log goes to `redis.log` in `dir` (appended across restarts).
fn spawn(
    port: u16,
    dir: &Path,
    aof: bool,
    tls: bool,
    extra: &[String],
) -> Result<ChildGuard, Start> {
    let bin = redis_server_binary()?;
    let log = dir.join("redis.log");
    let mut cmd = Command::new(bin);
    if tls {
        cmd.arg("--port").arg("0").arg("--tls-port").arg(port.to_string());
    } else {
        cmd.arg("--port").arg(port.to_string());
    }
    cmd.arg("--bind")
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
        .arg("--logfile")
        .arg(&log)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // A restart appends to the log of the run before: only what this run wrote counts.
    let from = std::fs::metadata(&log).map(|m| m.len() as usize).unwrap_or(0);
    let mut child = ChildGuard::spawn(format!("redis-server:{port}"), &mut cmd)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        // Ready by its own log, not by a connect alone: whoever took the port would accept too.
        let ready = std::fs::read(&log)
            .map(|b| b.get(from..).is_some_and(|new| contains(new, READY_MARKER)))
            .unwrap_or(false);
        if ready && TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(child);
        }
        if child.has_exited() {
            return Err(Start::Exited(log_tail(&log)));
        }
        if Instant::now() > deadline {
            return Err(Start::Other(anyhow::anyhow!(
                "nothing listens on {addr} after {START_TIMEOUT:?} (redis-server log: {})",
                log_tail(&log)
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The last lines of a server's log, joined (empty when there is none).
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server whose port is taken exits at once; that is told apart from a slow start (so
    /// `start_with` tries another port) and its log says why.
    #[test]
    fn a_server_whose_port_is_taken_is_reported_as_exited_with_its_log() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let dir = tempfile::tempdir().unwrap();
        let started = Instant::now();
        match spawn(port, dir.path(), false, false, &[]) {
            Err(Start::Exited(log)) => {
                assert!(log.contains(&port.to_string()), "log names the port: {log}");
            }
            other => panic!("expected an early exit, got {other:?}"),
        }
        assert!(started.elapsed() < START_TIMEOUT, "reported before the start timeout");
    }

    #[test]
    fn start_with_gives_a_listening_server_and_keeps_its_log_in_its_directory() {
        let server = RedisServer::start().unwrap();
        assert!(TcpStream::connect(("127.0.0.1", server.port())).is_ok());
        let log = std::fs::read_to_string(server.dir().join("redis.log")).unwrap();
        assert!(log.contains("Ready to accept connections"), "{log}");
    }
}
