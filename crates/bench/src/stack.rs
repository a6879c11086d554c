//! The processes of one benchmark stack: redis-server, kjob-sim, kjob-queue, kjob-watcher and
//! N kjob-workers, each logging to `<run dir>/logs/<name>.log` and killed with the [`Stack`].

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use kjob_testkit::{free_port, wait_for_tcp};

/// How long a process may take to listen: first starts on a loaded 2-core machine are slow.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long each process gets to drain after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// The kjob binaries a stack runs.
pub const BINARIES: [&str; 4] = ["kjob-sim", "kjob-queue", "kjob-watcher", "kjob-worker"];

/// What to start.
#[derive(Debug, Clone)]
pub struct StackOpts {
    /// Folder holding the (release) kjob binaries.
    pub bin_dir: PathBuf,
    /// The redis-server executable.
    pub redis_server: PathBuf,
    /// Folder for logs and Redis data of this stack.
    pub run_dir: PathBuf,
    /// kjob-worker processes; 0 starts kjob-sim alone (without its kubelet) for the limit run.
    pub workers: usize,
    /// Latency kjob-sim adds before every write.
    pub write_latency: Duration,
    /// `spec.managedBy` value kjob answers to.
    pub controller_name: String,
}

struct Proc {
    name: String,
    log: PathBuf,
    child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running stack.
pub struct Stack {
    procs: Vec<Proc>,
    /// kjob-sim's base URL.
    pub sim_url: String,
    /// Redis URL (empty for a sim-only stack).
    pub redis_url: String,
    /// Base URLs of the workers' admin ports (`/metrics`).
    pub worker_admin: Vec<String>,
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

impl Stack {
    /// Starts the processes in dependency order, waiting for each to listen.
    pub fn start(o: &StackOpts) -> anyhow::Result<Self> {
        let missing: Vec<_> = BINARIES.iter().filter(|b| !o.bin_dir.join(b).is_file()).collect();
        if !missing.is_empty() {
            bail!(
                "missing {missing:?} in {} (cargo build --release -p kjob-sim -p kjob-queue -p kjob-watcher -p kjob-worker --bins)",
                o.bin_dir.display()
            );
        }
        let log_dir = o.run_dir.join("logs");
        let redis_dir = o.run_dir.join("redis");
        // Fresh data every run: an old AOF would replay keys of Jobs the new sim lacks.
        let _ = std::fs::remove_dir_all(&redis_dir);
        for d in [&log_dir, &redis_dir] {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        let mut s = Stack {
            procs: Vec::new(),
            sim_url: String::new(),
            redis_url: String::new(),
            worker_admin: vec![],
        };
        let bin = |name: &str| Command::new(o.bin_dir.join(name));
        let kubeconfig = o.run_dir.join("kubeconfig");

        let mut cmd = bin("kjob-sim");
        cmd.args(["--listen", "127.0.0.1:0", "--kubeconfig-out"]).arg(&kubeconfig);
        cmd.arg(format!("--write-latency={}ms", o.write_latency.as_millis()));
        cmd.args(["--kubelet", if o.workers == 0 { "off" } else { "auto" }]);
        // The report is about throughput: keep the services' logs to warnings.
        cmd.env("RUST_LOG", "warn");
        s.spawn("kjob-sim", &mut cmd, &log_dir, true)?;
        s.sim_url = s.read_sim_url()?;
        if o.workers == 0 {
            return Ok(s);
        }

        let redis_port = free_port();
        let mut cmd = Command::new(&o.redis_server);
        cmd.args(["--port", &redis_port.to_string(), "--bind", "127.0.0.1", "--dir"])
            .arg(&redis_dir)
            // As deployed: AOF with a fsync a second.
            .args(["--appendonly", "yes", "--appendfsync", "everysec", "--save", ""]);
        s.spawn("redis-server", &mut cmd, &log_dir, false)?;
        s.wait_listening("redis-server", redis_port)?;
        s.redis_url = format!("redis://127.0.0.1:{redis_port}");

        let grpc = free_port();
        let mut cmd = bin("kjob-queue");
        cmd.arg(format!("--listen=127.0.0.1:{grpc}"))
            .arg(format!("--redis-url={}", s.redis_url))
            .arg(format!("--admin-listen=127.0.0.1:{}", free_port()))
            .env("RUST_LOG", "warn");
        s.spawn("kjob-queue", &mut cmd, &log_dir, false)?;
        s.wait_listening("kjob-queue", grpc)?;
        let queue_url = format!("http://127.0.0.1:{grpc}");

        let admin = free_port();
        let mut cmd = bin("kjob-watcher");
        cmd.arg(format!("--queue-url={queue_url}"))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--admin-listen=127.0.0.1:{admin}"))
            .arg(format!("--controller-name={}", o.controller_name))
            .args(["--lease-namespace=default", "--identity=kjob-bench-watcher"])
            .env("RUST_LOG", "warn");
        s.spawn("kjob-watcher", &mut cmd, &log_dir, false)?;
        s.wait_listening("kjob-watcher", admin)?;

        for i in 1..=o.workers {
            let name = format!("kjob-worker-{i}");
            let admin = free_port();
            let mut cmd = bin("kjob-worker");
            cmd.arg(format!("--queue-url={queue_url}"))
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .arg(format!("--admin-listen=127.0.0.1:{admin}"))
                .arg(format!("--controller-name={}", o.controller_name))
                .arg(format!("--worker-id={name}"))
                .env("RUST_LOG", "warn");
            s.spawn(&name, &mut cmd, &log_dir, false)?;
            s.wait_listening(&name, admin)?;
            s.worker_admin.push(format!("http://127.0.0.1:{admin}"));
        }
        Ok(s)
    }

    fn spawn(
        &mut self,
        name: &str,
        cmd: &mut Command,
        log_dir: &Path,
        pipe_stdout: bool,
    ) -> anyhow::Result<()> {
        let log = log_dir.join(format!("{name}.log"));
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        cmd.stdin(Stdio::null()).stderr(out.try_clone()?);
        if pipe_stdout {
            cmd.stdout(Stdio::piped());
        } else {
            cmd.stdout(out);
        }
        let child = cmd.spawn().with_context(|| format!("starting {name} ({cmd:?})"))?;
        self.procs.push(Proc { name: name.to_string(), log, child });
        Ok(())
    }

    fn wait_listening(&mut self, name: &str, port: u16) -> anyhow::Result<()> {
        let deadline = Instant::now() + LISTEN_TIMEOUT;
        loop {
            self.check_alive()?;
            if wait_for_tcp(loopback(port), Duration::from_millis(250)).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{name} does not listen on 127.0.0.1:{port} after {LISTEN_TIMEOUT:?}");
            }
        }
    }

    /// Reads kjob-sim's first stdout line (its URL) and copies the rest into its log.
    fn read_sim_url(&mut self) -> anyhow::Result<String> {
        let p = self.procs.last_mut().context("kjob-sim not started")?;
        let stdout = p.child.stdout.take().context("kjob-sim stdout not piped")?;
        let mut log = std::fs::OpenOptions::new().append(true).open(&p.log)?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        // A thread: the copy lasts the sim's whole life and the read blocks.
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let _ = tx.send(lines.next());
            for line in lines.map_while(Result::ok) {
                let _ = writeln!(log, "{line}");
            }
        });
        match rx.recv_timeout(LISTEN_TIMEOUT) {
            Ok(Some(Ok(url))) if url.starts_with("http") => Ok(url.trim().to_string()),
            other => {
                self.check_alive()?;
                bail!("kjob-sim printed {other:?} instead of its URL")
            }
        }
    }

    /// Names and pids of the processes.
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.procs.iter().map(|p| (p.name.clone(), p.child.id())).collect()
    }

    /// An error naming the first process that exited, with its log file.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        for p in &mut self.procs {
            if let Ok(Some(status)) = p.child.try_wait() {
                bail!("{} exited ({status}); see {}", p.name, p.log.display());
            }
        }
        Ok(())
    }

    /// SIGTERM to clients first (they hand back leases while the queue answers), then servers.
    pub fn stop(&mut self) {
        let servers = self.procs.iter().take_while(|p| !p.name.starts_with("kjob-watcher")).count();
        let clients = self.procs.split_off(servers);
        for mut tier in [clients, std::mem::take(&mut self.procs)] {
            for p in &mut tier {
                let _ = Command::new("kill").arg("-TERM").arg(p.child.id().to_string()).status();
            }
            let deadline = Instant::now() + STOP_GRACE;
            for p in &mut tier {
                while Instant::now() < deadline && matches!(p.child.try_wait(), Ok(None)) {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            // Dropping kills whatever is left.
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.stop();
    }
}
