//! The processes of the demo: redis-server, kjob-sim, kjob-queue, kjob-watcher, kjob-workers.
//! Each writes its output to `<log dir>/<name>.log`; every process dies with the [`Stack`].

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use kjob_testkit::{free_port, wait_for_tcp};

/// How long a process may take to listen on its port: cold debug binaries on a loaded 2-core
/// machine take a few seconds.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long kjob-sim may take to print its URL.
const SIM_URL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long each process gets to drain after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// How many processes, started first, are servers (redis-server, kjob-sim, kjob-queue).
const SERVERS: usize = 3;

/// The binaries the demo runs, all built by `cargo build --bins`.
pub const BINARIES: [&str; 4] = ["kjob-sim", "kjob-queue", "kjob-watcher", "kjob-worker"];

/// Where things are and how many workers to run.
#[derive(Debug, Clone)]
pub struct StackConfig {
    /// Folder holding the kjob binaries.
    pub bin_dir: PathBuf,
    /// The redis-server executable.
    pub redis_server: PathBuf,
    /// Working folder: logs/, redis/ and the kubeconfig go here.
    pub run_dir: PathBuf,
    /// Number of kjob-worker processes.
    pub workers: usize,
    /// `spec.managedBy` value kjob answers to.
    pub controller_name: String,
}

/// One child process, killed on drop.
struct Proc {
    name: String,
    log: PathBuf,
    child: Child,
}

impl Proc {
    /// Spawns `cmd` with stderr (and stdout unless `pipe_stdout`) into `<log_dir>/<name>.log`.
    fn spawn(
        name: &str,
        cmd: &mut Command,
        log_dir: &Path,
        pipe_stdout: bool,
    ) -> anyhow::Result<Self> {
        let log = log_dir.join(format!("{name}.log"));
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        cmd.stdin(Stdio::null()).stderr(out.try_clone()?);
        if pipe_stdout {
            cmd.stdout(Stdio::piped());
        } else {
            cmd.stdout(out);
        }
        // Own process group: a terminal's Ctrl-C goes to kjob-demo alone, which then stops
        // the stack in order (workers first) instead of every process aborting at once.
        cmd.process_group(0);
        let child = cmd.spawn().with_context(|| format!("starting {name} ({cmd:?})"))?;
        Ok(Self { name: name.to_string(), log, child })
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Sends SIGTERM (a no-op once exited).
    fn terminate(&mut self) {
        if self.exited().is_none() {
            let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        }
    }

    /// Kills the process if it has not exited by `deadline`.
    fn reap_by(&mut self, deadline: Instant) {
        while Instant::now() < deadline {
            if self.exited().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The running stack.
pub struct Stack {
    procs: Vec<Proc>,
    /// kjob-sim's base URL.
    pub sim_url: String,
    /// Kubeconfig pointing at kjob-sim.
    pub kubeconfig: PathBuf,
    /// kjob-queue's gRPC URL.
    pub queue_url: String,
    /// Folder of the log files.
    pub log_dir: PathBuf,
}

/// The binaries of [`BINARIES`] missing from `bin_dir`.
pub fn missing_binaries(bin_dir: &Path) -> Vec<&'static str> {
    BINARIES.into_iter().filter(|b| !bin_dir.join(b).is_file()).collect()
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

impl Stack {
    /// Starts every process in dependency order, waiting for each to listen.
    pub fn start(cfg: &StackConfig, mut progress: impl FnMut(&str)) -> anyhow::Result<Self> {
        let missing = missing_binaries(&cfg.bin_dir);
        if !missing.is_empty() {
            bail!(
                "missing binaries in {}: {} (run `cargo build --bins`)",
                cfg.bin_dir.display(),
                missing.join(", ")
            );
        }
        let log_dir = cfg.run_dir.join("logs");
        let redis_dir = cfg.run_dir.join("redis");
        // A fresh run every time: stale AOF data would replay keys of Jobs the new sim lacks.
        let _ = std::fs::remove_dir_all(&redis_dir);
        for d in [&log_dir, &redis_dir] {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        let kubeconfig = cfg.run_dir.join("kubeconfig");
        let mut stack = Stack {
            procs: Vec::new(),
            sim_url: String::new(),
            kubeconfig: kubeconfig.clone(),
            queue_url: String::new(),
            log_dir: log_dir.clone(),
        };
        let bin = |name: &str| Command::new(cfg.bin_dir.join(name));

        let redis_port = free_port();
        progress(&format!("starting redis-server on 127.0.0.1:{redis_port}"));
        let mut cmd = Command::new(&cfg.redis_server);
        cmd.args(["--port", &redis_port.to_string(), "--bind", "127.0.0.1", "--dir"])
            .arg(&redis_dir)
            .args(["--appendonly", "yes", "--appendfsync", "everysec", "--save", ""])
            .args(["--maxmemory-policy", "noeviction", "--daemonize", "no"]);
        stack.push("redis-server", &mut cmd)?;
        stack.wait_listening("redis-server", redis_port)?;

        progress("starting kjob-sim (simulated API server and kubelet)");
        let mut cmd = bin("kjob-sim");
        cmd.args(["--listen", "127.0.0.1:0", "--kubelet", "auto", "--kubeconfig-out"])
            .arg(&kubeconfig);
        stack.push("kjob-sim", &mut cmd)?;
        stack.sim_url = stack.read_sim_url()?;

        let grpc = free_port();
        progress(&format!("starting kjob-queue on 127.0.0.1:{grpc}"));
        let mut cmd = bin("kjob-queue");
        cmd.arg(format!("--listen=127.0.0.1:{grpc}"))
            .arg(format!("--redis-url=redis://127.0.0.1:{redis_port}"))
            .arg(format!("--admin-listen=127.0.0.1:{}", free_port()));
        stack.push("kjob-queue", &mut cmd)?;
        stack.wait_listening("kjob-queue", grpc)?;
        stack.queue_url = format!("http://127.0.0.1:{grpc}");

        progress("starting kjob-watcher");
        let admin = free_port();
        let mut cmd = bin("kjob-watcher");
        cmd.arg(format!("--queue-url={}", stack.queue_url))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--admin-listen=127.0.0.1:{admin}"))
            .arg(format!("--controller-name={}", cfg.controller_name))
            .args(["--lease-namespace=default", "--identity=kjob-demo-watcher"]);
        stack.push("kjob-watcher", &mut cmd)?;
        stack.wait_listening("kjob-watcher", admin)?;

        for i in 1..=cfg.workers {
            let name = format!("kjob-worker-{i}");
            progress(&format!("starting {name}"));
            let admin = free_port();
            let mut cmd = bin("kjob-worker");
            cmd.arg(format!("--queue-url={}", stack.queue_url))
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .arg(format!("--admin-listen=127.0.0.1:{admin}"))
                .arg(format!("--controller-name={}", cfg.controller_name))
                .arg(format!("--worker-id={name}"));
            stack.push(&name, &mut cmd)?;
            stack.wait_listening(&name, admin)?;
        }
        Ok(stack)
    }

    fn push(&mut self, name: &str, cmd: &mut Command) -> anyhow::Result<()> {
        // kjob-sim prints its URL on stdout; everyone else's stdout is just log.
        let p = Proc::spawn(name, cmd, &self.log_dir, name == "kjob-sim")?;
        self.procs.push(p);
        Ok(())
    }

    /// Waits for `port`, failing early (with the log path) if the process dies meanwhile.
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

    /// Reads kjob-sim's first stdout line (its URL); the rest of stdout goes to its log.
    fn read_sim_url(&mut self) -> anyhow::Result<String> {
        let p = self.procs.last_mut().context("kjob-sim not started")?;
        let stdout = p.child.stdout.take().context("kjob-sim stdout not piped")?;
        let mut log = std::fs::OpenOptions::new().append(true).open(&p.log)?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        // A thread, not a task: the copy must go on for the sim's whole life, and a blocking
        // read would stall the runtime.
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let first = lines.next();
            let _ = tx.send(first);
            for line in lines.map_while(Result::ok) {
                let _ = writeln!(log, "{line}");
            }
        });
        match rx.recv_timeout(SIM_URL_TIMEOUT) {
            Ok(Some(Ok(url))) if url.starts_with("http") => Ok(url.trim().to_string()),
            Ok(other) => {
                self.check_alive()?;
                bail!("kjob-sim printed {other:?} instead of its URL")
            }
            Err(_) => {
                self.check_alive()?;
                bail!("kjob-sim printed no URL within {SIM_URL_TIMEOUT:?}")
            }
        }
    }

    /// An error naming the first process that exited, with its log file.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        for p in &mut self.procs {
            if let Some(status) = p.exited() {
                bail!("{} exited ({status}); see {}", p.name, p.log.display());
            }
        }
        Ok(())
    }

    /// Stops every process in two tiers: first the watcher and workers (so they hand back
    /// their leases while the queue still answers), then the servers. Each tier drains in
    /// parallel for at most [`STOP_GRACE`].
    pub fn stop(&mut self) {
        let servers = self.procs.len().min(SERVERS);
        let clients = self.procs.split_off(servers);
        for mut tier in [clients, std::mem::take(&mut self.procs)] {
            tier.iter_mut().for_each(Proc::terminate);
            let deadline = Instant::now() + STOP_GRACE;
            tier.iter_mut().for_each(|p| p.reap_by(deadline));
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.stop();
    }
}
