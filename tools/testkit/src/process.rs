//! Child processes that die with the test, and free ports.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// A free TCP port on 127.0.0.1 (bound then released; the OS will not hand it out again soon).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local addr").port()
}

/// Waits until something accepts TCP connections on `addr`.
pub fn wait_for_tcp(addr: SocketAddr, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!("nothing listens on {addr} after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The workspace root (where the top-level Cargo.toml is).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("workspace root")
}

/// How often a process being stopped is checked for its exit.
const EXIT_POLL: Duration = Duration::from_millis(20);

/// Sends SIGTERM to the process `pid` (nothing happens when it is gone).
pub fn send_sigterm(pid: u32) {
    let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
}

/// Kills `child` with SIGKILL and reaps it.
pub fn kill_and_reap(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Waits until `deadline` for `child` to exit, then kills and reaps it. Returns the exit
/// status if it exited by itself.
pub fn reap_by(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(EXIT_POLL);
    }
    kill_and_reap(child);
    None
}

/// A child process killed (SIGKILL) and reaped on drop.
#[derive(Debug)]
pub struct ChildGuard {
    name: String,
    child: Option<Child>,
}

impl ChildGuard {
    /// Spawns `cmd`, naming the process for error messages.
    pub fn spawn(name: impl Into<String>, cmd: &mut Command) -> anyhow::Result<Self> {
        let name = name.into();
        let child = cmd.spawn().map_err(|e| anyhow::anyhow!("spawning {name}: {e}"))?;
        Ok(Self { name, child: Some(child) })
    }

    /// The OS process id, if still running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the process with SIGKILL and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill_and_reap(&mut c);
        }
    }

    /// Sends SIGTERM and waits up to `timeout` for the process to exit; SIGKILL after that.
    /// Returns the exit status if it exited by itself.
    pub fn terminate(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let mut c = self.child.take()?;
        send_sigterm(c.id());
        reap_by(&mut c, Instant::now() + timeout)
    }

    /// Whether the process has exited (without reaping a running one).
    pub fn has_exited(&mut self) -> bool {
        match self.child.as_mut() {
            None => true,
            Some(c) => matches!(c.try_wait(), Ok(Some(_))),
        }
    }

    /// The process name given at spawn.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Path of a workspace binary built by `cargo build` (e.g. `kjob-queue`), honouring
/// `CARGO_TARGET_DIR`. `make test` builds every binary before the tests run.
pub fn bin_path(name: &str) -> anyhow::Result<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    for profile in ["debug", "release"] {
        let p = target.join(profile).join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    anyhow::bail!(
        "binary {name} not found under {}: run `cargo build --bins` first",
        target.display()
    )
}

/// Fails, naming them, when any of the workspace binaries `names` is not built.
pub fn require_bins(names: &[&str]) -> anyhow::Result<()> {
    let missing: Vec<&str> = names.iter().copied().filter(|b| bin_path(b).is_err()).collect();
    if !missing.is_empty() {
        anyhow::bail!("binaries not built: {} (run `cargo build --bins`)", missing.join(", "));
    }
    Ok(())
}

/// How long a test's kjob-queue may take to listen.
const QUEUE_START_TIMEOUT: Duration = Duration::from_secs(15);

/// Starts the built kjob-queue binary on `127.0.0.1:port` over `redis_url` (admin port free,
/// stdout discarded, `--insecure-no-auth`: plaintext, every caller allowed) and returns once it
/// accepts connections.
pub fn start_queue(redis_url: &str, port: u16) -> anyhow::Result<ChildGuard> {
    let mut cmd = Command::new(bin_path("kjob-queue")?);
    cmd.arg(format!("--listen=127.0.0.1:{port}"))
        .arg(format!("--redis-url={redis_url}"))
        .arg("--admin-listen=127.0.0.1:0")
        .arg("--insecure-no-auth")
        .stdout(std::process::Stdio::null());
    let child = ChildGuard::spawn("kjob-queue", &mut cmd)?;
    wait_for_tcp(SocketAddr::from(([127, 0, 0, 1], port)), QUEUE_START_TIMEOUT)?;
    Ok(child)
}
