//! The whole kjob stack as real processes — redis-server (AOF on), kjob-sim, kjob-queue, one or
//! more kjob-watchers (Lease-elected) and kjob-workers — with per-process control for fault
//! and load tests: SIGKILL, SIGTERM, restart on the same port and data directory, workers added
//! and removed, the leading watcher found through the Lease it holds in kjob-sim.
//!
//! Every process writes stdout and stderr to `<run dir>/logs/<name>.log` (appended across
//! restarts) and dies with the [`Stack`]. All methods block; call them from a plain thread or
//! through `tokio::task::block_in_place`.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::args::{ExtraArgs, Program};
use crate::faults::ApiFaults;
use crate::process::{free_port, kill_and_reap, reap_by, send_sigterm, wait_for_tcp};
use crate::proxy::FaultProxy;

/// How long a process may take to listen on its port: cold debug binaries on a loaded 2-core
/// machine take a few seconds.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long each process gets to drain after SIGTERM in [`Stack::stop`] before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// Connect/read/write timeout of the small HTTP client talking to kjob-sim.
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest HTTP answer read from kjob-sim (a Lease or a hook answer; `/metrics` is bigger).
const HTTP_MAX_BODY: u64 = 64 << 20;

/// Name of the redis-server process.
pub const REDIS: &str = "redis-server";
/// Name of the kjob-sim process.
pub const SIM: &str = "kjob-sim";
/// Name of the kjob-queue process.
pub const QUEUE: &str = "kjob-queue";
/// Prefix of watcher process names (`kjob-watcher-1`, ...); each uses its name as Lease identity.
pub const WATCHER_PREFIX: &str = "kjob-watcher-";
/// Prefix of worker process names (`kjob-worker-1`, ...); each uses its name as worker id.
pub const WORKER_PREFIX: &str = "kjob-worker-";
/// Namespace of the watchers' Lease.
pub const LEASE_NAMESPACE: &str = "default";
/// Name of the watchers' Lease.
pub const LEASE_NAME: &str = "kjob-watcher";

/// The folder (under [`Stack::cert_dir`]) and Secret name of kjob-queue's certificate.
pub const QUEUE_SECRET: &str = "kjob-queue-tls";
/// The watcher role's certificate.
pub const WATCHER_SECRET: &str = "kjob-watcher-tls";
/// The worker role's certificate.
pub const WORKER_SECRET: &str = "kjob-worker-tls";
/// The read-only inspector role's certificate.
pub const INSPECTOR_SECRET: &str = "kjob-inspector-tls";
/// The file (in the run folder) holding the Redis password of kjob's ACL user, with `redis_tls`.
pub const REDIS_PASSWORD: &str = "redis-password";

/// The kjob binaries a stack runs, all built by `cargo build --bins`.
pub const BINARIES: [&str; 4] = ["kjob-sim", "kjob-queue", "kjob-watcher", "kjob-worker"];

/// A real kube-apiserver for the stack instead of kjob-sim: the watcher and the workers run on
/// their own ServiceAccounts' kubeconfigs (RBAC enforced), tests use the admin one.
#[derive(Debug, Clone)]
pub struct RealServer {
    /// Cluster-admin kubeconfig (what the test itself uses; [`Stack::kubeconfig`]).
    pub admin_kubeconfig: PathBuf,
    /// The watcher's ServiceAccount kubeconfig.
    pub watcher_kubeconfig: PathBuf,
    /// The workers' ServiceAccount kubeconfig.
    pub worker_kubeconfig: PathBuf,
    /// The kubectl binary (Lease lookups).
    pub kubectl: PathBuf,
    /// Namespace the watcher is limited to (one stack per test namespace on a shared server).
    pub namespace: Option<String>,
    /// Name of the watchers' Lease in `kjob-system` (unique per stack on a shared server).
    pub lease_name: String,
    /// Route the watchers' and workers' traffic through a [`FaultProxy`], so
    /// [`Stack::inject`] and [`Stack::close_watches`] work (off for benchmarks: no extra hop).
    pub fault_proxy: bool,
}

impl RealServer {
    /// The real server of a control plane run folder (see [`crate::cluster`]), one namespace.
    pub fn from_cluster(info: &crate::cluster::ClusterInfo, namespace: &str) -> Self {
        Self {
            admin_kubeconfig: info.kubeconfig.clone(),
            watcher_kubeconfig: info.watcher_kubeconfig.clone(),
            worker_kubeconfig: info.worker_kubeconfig.clone(),
            kubectl: info.bin_dir.join("kubectl"),
            namespace: Some(namespace.to_string()),
            lease_name: format!("kjob-watcher-{namespace}"),
            fault_proxy: false,
        }
    }
}

/// Where things are, how many of each process to run, and extra flags per binary.
#[derive(Debug, Clone)]
pub struct StackConfig {
    /// Folder holding the kjob binaries.
    pub bin_dir: PathBuf,
    /// The redis-server executable.
    pub redis_server: PathBuf,
    /// Working folder: `logs/`, `redis/` and the kubeconfig go here.
    pub run_dir: PathBuf,
    /// Number of kjob-worker processes at start.
    pub workers: usize,
    /// Number of kjob-watcher processes (one leads, the others wait on the Lease).
    pub watchers: usize,
    /// `spec.managedBy` value kjob answers to.
    pub controller_name: String,
    /// Extra flags of kjob-sim (e.g. `--write-latency=10ms`), kjob-queue, every watcher (e.g.
    /// `--resync-period=30s`) and every worker (e.g. `--lease-duration=5s`).
    pub extra_args: ExtraArgs,
    /// Environment variables for the kjob processes (e.g. `RUST_LOG=warn` for a benchmark).
    pub env: Vec<(String, String)>,
    /// Start kjob-sim alone (no redis, queue, watchers or workers): a bare API server.
    pub sim_only: bool,
    /// Put every process in its own process group, so a terminal's Ctrl-C reaches only the
    /// program driving the stack, which then stops it in order. Off for tests: a test
    /// runner that kills its test's process group should take the children along.
    pub own_process_groups: bool,
    /// Run against this real API server instead of starting kjob-sim.
    pub real: Option<RealServer>,
    /// Serve kjob-queue with mTLS (certificates from `kjob-queue certs` in `<run dir>/certs`,
    /// the watchers and workers on their roles' certificates, an `https://` queue URL) instead
    /// of `--insecure-no-auth`.
    pub tls: bool,
    /// Redis as deploy/ runs it (with `tls`): TLS only, the `default` user off, kjob-queue as
    /// the ACL user `kjob` with exactly kjob's commands ([`kjob_workqueue::acl::ACL_RULES`]) and
    /// its password from a file. [`Stack::redis_url`] then names an admin user, and
    /// [`Stack::redis_ca`] the CA its certificate is signed by.
    pub redis_tls: bool,
}

impl StackConfig {
    /// One watcher, `workers` workers, default flags, the default controller name.
    pub fn new(bin_dir: PathBuf, redis_server: PathBuf, run_dir: PathBuf, workers: usize) -> Self {
        Self {
            bin_dir,
            redis_server,
            run_dir,
            workers,
            watchers: 1,
            controller_name: kjob_core::DEFAULT_CONTROLLER_NAME.into(),
            extra_args: ExtraArgs::default(),
            env: Vec::new(),
            sim_only: false,
            own_process_groups: false,
            real: None,
            tls: false,
            redis_tls: false,
        }
    }
}

/// How to (re)start one process and how to tell it is up.
#[derive(Debug, Clone)]
struct Spec {
    program: PathBuf,
    args: Vec<String>,
    /// A TCP port the process listens on once ready.
    ready_port: u16,
    /// Port of the admin server (`/metrics`, `/livez`, `/readyz`), for kjob services.
    admin_port: Option<u16>,
    env: Vec<(String, String)>,
    own_process_group: bool,
}

/// One process slot: its spec, log and (while running) child.
#[derive(Debug)]
struct Proc {
    spec: Spec,
    log: PathBuf,
    child: Option<Child>,
    starts: u32,
}

impl Proc {
    fn spawn(&mut self) -> anyhow::Result<()> {
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let mut cmd = Command::new(&self.spec.program);
        cmd.args(&self.spec.args).stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out);
        cmd.envs(self.spec.env.iter().map(|(k, v)| (k, v)));
        if self.spec.own_process_group {
            std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        }
        let child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
        self.child = Some(child);
        self.starts += 1;
        Ok(())
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill_and_reap(&mut c);
        }
    }

    fn send_term(&mut self) {
        if let Some(c) = self.child.as_mut()
            && matches!(c.try_wait(), Ok(None))
        {
            send_sigterm(c.id());
        }
    }

    /// Waits for exit until `deadline`, then SIGKILL. Returns the status if it exited itself.
    fn reap_by(&mut self, deadline: Instant) -> Option<ExitStatus> {
        reap_by(&mut self.child.take()?, deadline)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The running stack. Dropping it kills every process.
#[derive(Debug)]
pub struct Stack {
    cfg: StackConfig,
    procs: BTreeMap<String, Proc>,
    next_worker: usize,
    sim_addr: SocketAddr,
    /// kjob-sim's base URL (`http://127.0.0.1:PORT`).
    pub sim_url: String,
    /// Kubeconfig pointing at kjob-sim.
    pub kubeconfig: PathBuf,
    /// kjob-queue's gRPC URL.
    pub queue_url: String,
    /// redis-server's URL (for the stack's own readers: with `redis_tls`, a `rediss://` URL
    /// with an admin user's credentials).
    pub redis_url: String,
    /// With `redis_tls`: the CA that signed Redis's certificate.
    pub redis_ca: Option<PathBuf>,
    /// Folder of the log files.
    pub log_dir: PathBuf,
    /// The proxy the services reach the real server through ([`RealServer::fault_proxy`]).
    proxy: Option<FaultProxy>,
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
    pub fn start(cfg: StackConfig) -> anyhow::Result<Self> {
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
        let kubeconfig = match &cfg.real {
            Some(real) => real.admin_kubeconfig.clone(),
            None => cfg.run_dir.join("kubeconfig"),
        };
        if cfg.real.is_none() {
            let _ = std::fs::remove_file(&kubeconfig);
        }
        let (redis_port, sim_port, grpc_port) = (free_port(), free_port(), free_port());
        let scheme = if cfg.tls { "https" } else { "http" };
        let mut stack = Stack {
            procs: BTreeMap::new(),
            next_worker: 0,
            sim_addr: loopback(sim_port),
            sim_url: format!("http://127.0.0.1:{sim_port}"),
            kubeconfig: kubeconfig.clone(),
            queue_url: format!("{scheme}://127.0.0.1:{grpc_port}"),
            redis_url: format!("redis://127.0.0.1:{redis_port}"),
            redis_ca: None,
            log_dir,
            cfg: cfg.clone(),
            proxy: None,
        };
        if let Some(real) = stack.cfg.real.as_mut().filter(|r| r.fault_proxy) {
            let proxy = FaultProxy::start(&real.admin_kubeconfig)?;
            let watcher = cfg.run_dir.join("watcher.proxied.kubeconfig");
            let worker = cfg.run_dir.join("worker.proxied.kubeconfig");
            proxy.write_kubeconfig(&real.watcher_kubeconfig, &watcher)?;
            proxy.write_kubeconfig(&real.worker_kubeconfig, &worker)?;
            (real.watcher_kubeconfig, real.worker_kubeconfig) = (watcher, worker);
            stack.proxy = Some(proxy);
        }

        let mut args_redis: Vec<String> = if cfg.redis_tls {
            stack.secure_redis_args(redis_port)?
        } else {
            vec!["--port".into(), redis_port.to_string()]
        };
        args_redis.extend(["--bind", "127.0.0.1", "--dir"].map(String::from));
        args_redis.push(redis_dir.display().to_string());
        args_redis.extend(
            ["--appendonly", "yes", "--appendfsync", "everysec", "--save", ""]
                .into_iter()
                .chain(["--maxmemory-policy", "noeviction", "--daemonize", "no"])
                .map(String::from),
        );
        if cfg.real.is_none() {
            stack.start_sim(sim_port)?;
            if cfg.sim_only {
                return Ok(stack);
            }
        }
        stack.start_kjob(args_redis, redis_port, grpc_port)?;
        Ok(stack)
    }

    fn start_sim(&mut self, sim_port: u16) -> anyhow::Result<()> {
        let cfg = self.cfg.clone();
        let kubeconfig = self.kubeconfig.clone();
        // A fixed port (not :0) so a restarted sim keeps its URL and the kubeconfig stays valid.
        let mut args = vec![
            format!("--listen=127.0.0.1:{sim_port}"),
            format!("--kubeconfig-out={}", kubeconfig.display()),
        ];
        // The autopilot kubelet unless the caller chose (clap refuses a repeated flag).
        if !cfg.extra_args.of(Program::Sim).iter().any(|a| a.starts_with("--kubelet")) {
            args.push("--kubelet=auto".into());
        }
        args.extend(cfg.extra_args.of(Program::Sim).iter().cloned());
        let spec = self.spec(cfg.bin_dir.join(SIM), args, sim_port, None);
        self.launch(SIM, spec)?;
        self.wait_file(&kubeconfig)
    }

    fn start_kjob(
        &mut self,
        args_redis: Vec<String>,
        redis_port: u16,
        grpc_port: u16,
    ) -> anyhow::Result<()> {
        let cfg = self.cfg.clone();
        let stack = self;
        let mut spec = stack.spec(cfg.redis_server.clone(), args_redis, redis_port, None);
        // redis-server gets no kjob environment.
        spec.env.clear();
        stack.launch(REDIS, spec)?;

        let admin = free_port();
        let mut args = vec![
            format!("--listen=127.0.0.1:{grpc_port}"),
            format!("--admin-listen=127.0.0.1:{admin}"),
        ];
        match &stack.redis_ca {
            Some(ca) => args.extend([
                format!("--redis-url=rediss://127.0.0.1:{redis_port}"),
                "--redis-username=kjob".into(),
                format!("--redis-password-file={}", cfg.run_dir.join(REDIS_PASSWORD).display()),
                format!("--redis-ca-file={}", ca.display()),
            ]),
            None => args.push(format!("--redis-url={}", stack.redis_url)),
        }
        args.extend(stack.queue_security_flags()?);
        args.extend(cfg.extra_args.of(Program::Queue).iter().cloned());
        let spec = stack.spec(cfg.bin_dir.join(QUEUE), args, grpc_port, Some(admin));
        stack.launch(QUEUE, spec)?;

        let (lease_ns, lease_name) = stack.lease();
        let watcher_kubeconfig = match &cfg.real {
            Some(r) => r.watcher_kubeconfig.clone(),
            None => stack.kubeconfig.clone(),
        };
        for i in 1..=cfg.watchers {
            let name = format!("{WATCHER_PREFIX}{i}");
            let admin = free_port();
            let mut args = vec![
                format!("--queue-url={}", stack.queue_url),
                format!("--kubeconfig={}", watcher_kubeconfig.display()),
                format!("--admin-listen=127.0.0.1:{admin}"),
                format!("--controller-name={}", cfg.controller_name),
                format!("--lease-namespace={lease_ns}"),
                format!("--lease-name={lease_name}"),
                format!("--identity={name}"),
            ];
            args.extend(stack.client_flags(WATCHER_SECRET));
            if let Some(ns) = cfg.real.as_ref().and_then(|r| r.namespace.as_ref()) {
                args.push(format!("--namespace={ns}"));
            }
            args.extend(cfg.extra_args.of(Program::Watcher).iter().cloned());
            let spec = stack.spec(cfg.bin_dir.join("kjob-watcher"), args, admin, Some(admin));
            stack.launch(&name, spec)?;
        }
        for _ in 0..cfg.workers {
            stack.add_worker()?;
        }
        Ok(())
    }

    /// The folder of the stack's certificates (`ca.crt`, and one folder per Secret with
    /// `tls.crt`, `tls.key`, `ca.crt`), when it serves mTLS.
    pub fn cert_dir(&self) -> Option<PathBuf> {
        self.cfg.tls.then(|| self.cfg.run_dir.join("certs"))
    }

    /// redis-server's flags for `redis_tls`: TLS only on `port` with kjob-queue's serving
    /// certificate (it names 127.0.0.1), and an aclfile with `default` off, an admin user for
    /// the stack's readers and kjob's user, whose password goes to a file for kjob-queue.
    fn secure_redis_args(&mut self, port: u16) -> anyhow::Result<Vec<String>> {
        let dir = self.certs()?.context("Redis over TLS needs the stack's certificates (`tls`)")?;
        let kjob_password = format!("{:032x}", rand::random::<u128>());
        let admin_password = format!("{:032x}", rand::random::<u128>());
        let run_dir = &self.cfg.run_dir;
        std::fs::write(run_dir.join(REDIS_PASSWORD), &kjob_password)?;
        let acl = [
            "user default off".to_string(),
            format!("user admin on >{admin_password} ~* &* +@all"),
            kjob_workqueue::acl::acl_user_line("kjob", &format!(">{kjob_password}")),
        ];
        let aclfile = run_dir.join("redis-users.acl");
        std::fs::write(&aclfile, acl.join("\n") + "\n")?;
        let server = dir.join(QUEUE_SECRET);
        let ca = dir.join("ca.crt");
        self.redis_url = format!("rediss://admin:{admin_password}@127.0.0.1:{port}");
        self.redis_ca = Some(ca.clone());
        let path = |p: PathBuf| p.display().to_string();
        Ok(vec![
            "--port".into(),
            "0".into(),
            "--tls-port".into(),
            port.to_string(),
            "--tls-cert-file".into(),
            path(server.join("tls.crt")),
            "--tls-key-file".into(),
            path(server.join("tls.key")),
            "--tls-ca-cert-file".into(),
            path(ca),
            "--tls-auth-clients".into(),
            "no".into(),
            "--aclfile".into(),
            path(aclfile),
        ])
    }

    /// The stack's certificate folder with `kjob-queue certs`' files written on first use, or
    /// `None` when the stack serves plaintext.
    fn certs(&self) -> anyhow::Result<Option<PathBuf>> {
        let Some(dir) = self.cert_dir() else { return Ok(None) };
        if !dir.join("ca.crt").is_file() {
            let out = Command::new(self.cfg.bin_dir.join(QUEUE))
                .args(["certs", "--host=127.0.0.1", "--host=localhost"])
                .arg(format!("--out={}", dir.display()))
                .stdin(Stdio::null())
                .output()
                .context("running kjob-queue certs")?;
            if !out.status.success() {
                bail!("kjob-queue certs: {}", String::from_utf8_lossy(&out.stderr).trim());
            }
        }
        Ok(Some(dir))
    }

    /// kjob-queue's security flags: its certificates or `--insecure-no-auth`.
    fn queue_security_flags(&self) -> anyhow::Result<Vec<String>> {
        let Some(dir) = self.certs()? else { return Ok(vec!["--insecure-no-auth".into()]) };
        let s = dir.join(QUEUE_SECRET);
        Ok(vec![
            format!("--tls-cert-file={}", s.join("tls.crt").display()),
            format!("--tls-key-file={}", s.join("tls.key").display()),
            format!("--client-ca-file={}", dir.join("ca.crt").display()),
        ])
    }

    /// The flags a kjob-queue client (watcher, worker, `kjob-queue inspect`) needs to reach
    /// this stack's queue with the certificate of Secret `secret` (e.g. [`WORKER_SECRET`]), or
    /// `--insecure-no-auth` when the stack serves plaintext.
    pub fn client_flags(&self, secret: &str) -> Vec<String> {
        let Some(dir) = self.cert_dir() else { return vec!["--insecure-no-auth".into()] };
        let s = dir.join(secret);
        let mut flags = vec![
            format!("--queue-ca-file={}", s.join("ca.crt").display()),
            format!("--queue-cert-file={}", s.join("tls.crt").display()),
            format!("--queue-key-file={}", s.join("tls.key").display()),
        ];
        if secret == WATCHER_SECRET || secret == WORKER_SECRET {
            flags.push(format!("--view-key-file={}", self.view_key_file(&dir).display()));
        }
        flags
    }

    /// The view key the stack's watcher and workers share (the `kjob-view-key` Secret of a
    /// deploy), written on first use: 32 random bytes.
    fn view_key_file(&self, dir: &Path) -> PathBuf {
        let path = dir.join("view.key");
        if !path.is_file() {
            let key: [u8; 32] = rand::random();
            std::fs::create_dir_all(dir).expect("the stack's certificate folder");
            std::fs::write(&path, key).expect("writing the stack's view key");
        }
        path
    }

    /// Namespace and name of the watchers' Lease.
    fn lease(&self) -> (String, String) {
        match &self.cfg.real {
            Some(r) => (crate::cluster::KJOB_NAMESPACE.to_string(), r.lease_name.clone()),
            None => (LEASE_NAMESPACE.to_string(), LEASE_NAME.to_string()),
        }
    }

    fn spec(
        &self,
        program: PathBuf,
        args: Vec<String>,
        ready_port: u16,
        admin_port: Option<u16>,
    ) -> Spec {
        Spec {
            program,
            args,
            ready_port,
            admin_port,
            env: self.cfg.env.clone(),
            own_process_group: self.cfg.own_process_groups,
        }
    }

    fn launch(&mut self, name: &str, spec: Spec) -> anyhow::Result<()> {
        let log = self.log_dir.join(format!("{name}.log"));
        let mut p = Proc { spec, log, child: None, starts: 0 };
        p.spawn()?;
        self.procs.insert(name.to_string(), p);
        self.wait_ready(name)
    }

    /// Waits for the process's port, failing early (with the log path) if it dies meanwhile.
    fn wait_ready(&mut self, name: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + LISTEN_TIMEOUT;
        let p = self.procs.get_mut(name).with_context(|| format!("no process {name}"))?;
        let port = p.spec.ready_port;
        loop {
            if let Some(st) = p.exited() {
                bail!("{name} exited ({st}) while starting; see {}", p.log.display());
            }
            if wait_for_tcp(loopback(port), Duration::from_millis(250)).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{name} does not listen on 127.0.0.1:{port} after {LISTEN_TIMEOUT:?}");
            }
        }
    }

    fn wait_file(&self, path: &Path) -> anyhow::Result<()> {
        let deadline = Instant::now() + LISTEN_TIMEOUT;
        while !path.is_file() {
            if Instant::now() > deadline {
                bail!("{} not written after {LISTEN_TIMEOUT:?}", path.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    fn proc(&mut self, name: &str) -> anyhow::Result<&mut Proc> {
        self.procs.get_mut(name).with_context(|| format!("no process named {name}"))
    }

    /// Names of every process slot (running or killed), sorted.
    pub fn names(&self) -> Vec<String> {
        self.procs.keys().cloned().collect()
    }

    /// Names of the worker processes currently running.
    pub fn workers(&self) -> Vec<String> {
        self.running_with_prefix(WORKER_PREFIX)
    }

    /// Names of the watcher processes currently running.
    pub fn watchers(&self) -> Vec<String> {
        self.running_with_prefix(WATCHER_PREFIX)
    }

    fn running_with_prefix(&self, prefix: &str) -> Vec<String> {
        self.procs
            .iter()
            .filter(|(n, p)| n.starts_with(prefix) && p.child.is_some())
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The OS process id of `name`, while it runs.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.procs.get(name)?.child.as_ref().map(Child::id)
    }

    /// Every running process with its OS process id, by name.
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.procs
            .iter()
            .filter_map(|(n, p)| p.child.as_ref().map(|c| (n.clone(), c.id())))
            .collect()
    }

    /// Base URL of the admin server (`/metrics`, `/livez`, `/readyz`) of kjob service `name`.
    pub fn admin_url(&self, name: &str) -> Option<String> {
        let port = self.procs.get(name)?.spec.admin_port?;
        Some(format!("http://127.0.0.1:{port}"))
    }

    /// How many times `name` has been started (1 after [`Stack::start`]).
    pub fn starts(&self, name: &str) -> u32 {
        self.procs.get(name).map_or(0, |p| p.starts)
    }

    /// The log file of `name`.
    pub fn log_path(&self, name: &str) -> PathBuf {
        self.log_dir.join(format!("{name}.log"))
    }

    /// Kills `name` with SIGKILL (a crash) and reaps it; the slot stays for [`Stack::restart`].
    pub fn kill(&mut self, name: &str) -> anyhow::Result<()> {
        self.proc(name)?.kill();
        Ok(())
    }

    /// Sends SIGTERM to `name` and waits up to `grace` (then SIGKILL). Returns the exit status
    /// if it exited by itself.
    pub fn terminate(&mut self, name: &str, grace: Duration) -> anyhow::Result<Option<ExitStatus>> {
        let p = self.proc(name)?;
        p.send_term();
        Ok(p.reap_by(Instant::now() + grace))
    }

    /// Starts `name` again with the same flags, port and data directory (SIGKILL first if it
    /// still runs), and waits until it listens. Restarting kjob-sim loses its objects.
    pub fn restart(&mut self, name: &str) -> anyhow::Result<()> {
        let p = self.proc(name)?;
        p.kill();
        p.spawn()?;
        self.wait_ready(name)
    }

    /// Redis loses everything: SIGKILL, its data folder emptied (no AOF, no RDB), and started
    /// again empty on its port.
    pub fn wipe_redis(&mut self) -> anyhow::Result<()> {
        self.kill(REDIS)?;
        let dir = self.redis_dir()?;
        std::fs::remove_dir_all(&dir).with_context(|| format!("emptying {}", dir.display()))?;
        std::fs::create_dir_all(&dir)?;
        self.restart(REDIS)
    }

    /// The data folder of the running redis-server (its `--dir`).
    fn redis_dir(&mut self) -> anyhow::Result<PathBuf> {
        let args = &self.proc(REDIS)?.spec.args;
        let i = args.iter().position(|a| a == "--dir").context("redis-server has no --dir")?;
        Ok(PathBuf::from(&args[i + 1]))
    }

    /// Redis fails over to a replica that missed the last writes: a replica is started and
    /// synced, its replication is cut `lag` before the master dies (SIGKILL), and it is
    /// promoted and takes the master's address — as a Service or a Sentinel-managed address
    /// moves to a new master. It keeps its own data folder (AOF on) from then on, so a later
    /// restart or wipe acts on it.
    pub fn fail_over_redis_lagging(&mut self, lag: Duration) -> anyhow::Result<()> {
        /// How long the new replica may take to load the master's data and rewrite its AOF.
        const SYNC_TIMEOUT: Duration = Duration::from_secs(20);
        let master = self.proc(REDIS)?.spec.clone();
        let port = master.ready_port;
        let replica_port = free_port();
        let dir = self.cfg.run_dir.join(format!("redis-{replica_port}"));
        std::fs::create_dir_all(&dir)?;
        let mut args = master.args.clone();
        for (flag, value) in
            [("--port", replica_port.to_string()), ("--dir", dir.display().to_string())]
        {
            let i = args.iter().position(|a| a == flag).with_context(|| format!("no {flag}"))?;
            args[i + 1] = value;
        }
        let mut replica_args = args.clone();
        replica_args.extend(["--replicaof".into(), "127.0.0.1".into(), port.to_string()]);
        let spec = Spec { args: replica_args, ready_port: replica_port, ..master.clone() };
        let name = format!("{REDIS}-replica");
        self.launch(&name, spec)?;
        let cli = crate::redis_cluster::redis_cli()?;
        let ask = |p: u16, cmd: &[&str]| -> anyhow::Result<String> {
            let out = Command::new(&cli)
                .args(["-p", &p.to_string()])
                .args(cmd)
                .output()
                .context("running redis-cli")?;
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        };
        // Synced: the link is up, the initial load is done and the AOF rewrite after it ended.
        let deadline = Instant::now() + SYNC_TIMEOUT;
        loop {
            let repl = ask(replica_port, &["info", "replication"])?;
            let pers = ask(replica_port, &["info", "persistence"])?;
            if repl.contains("master_link_status:up")
                && !repl.contains("master_sync_in_progress:1")
                && pers.contains("aof_rewrite_in_progress:0")
                && pers.contains("aof_rewrite_scheduled:0")
                && pers.contains("loading:0")
            {
                break;
            }
            if Instant::now() > deadline {
                bail!("the replica did not sync in {SYNC_TIMEOUT:?}: {repl}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Replication stops here: what the master takes from now on, the replica misses.
        let r = ask(replica_port, &["replicaof", "no", "one"])?;
        anyhow::ensure!(r.trim() == "OK", "REPLICAOF NO ONE: {r}");
        std::thread::sleep(lag);
        self.kill(REDIS)?;
        let r = ask(replica_port, &["config", "set", "port", &port.to_string()])?;
        anyhow::ensure!(r.trim() == "OK", "moving the promoted replica to port {port}: {r}");
        // The promoted replica is the Redis from now on, on the master's port and its own data.
        let mut promoted = self.procs.remove(&name).context("the replica's slot")?;
        let i = args.iter().position(|a| a == "--port").context("no --port")?;
        args[i + 1] = port.to_string();
        promoted.spec = Spec { args, ready_port: port, ..master };
        self.procs.insert(REDIS.to_string(), promoted);
        self.wait_ready(REDIS)
    }

    /// Starts one more worker (`kjob-worker-N`, N never reused) and returns its name.
    pub fn add_worker(&mut self) -> anyhow::Result<String> {
        self.next_worker += 1;
        let name = format!("{WORKER_PREFIX}{}", self.next_worker);
        let admin = free_port();
        let worker_kubeconfig = match &self.cfg.real {
            Some(r) => r.worker_kubeconfig.clone(),
            None => self.kubeconfig.clone(),
        };
        let mut args = vec![
            format!("--queue-url={}", self.queue_url),
            format!("--kubeconfig={}", worker_kubeconfig.display()),
            format!("--admin-listen=127.0.0.1:{admin}"),
            format!("--controller-name={}", self.cfg.controller_name),
            format!("--worker-id={name}"),
        ];
        args.extend(self.client_flags(WORKER_SECRET));
        args.extend(self.cfg.extra_args.of(Program::Worker).iter().cloned());
        let spec = self.spec(self.cfg.bin_dir.join("kjob-worker"), args, admin, Some(admin));
        self.launch(&name, spec)?;
        Ok(name)
    }

    /// Stops worker `name` (SIGKILL when `crash`, else SIGTERM with `grace`) and forgets it.
    pub fn remove_worker(
        &mut self,
        name: &str,
        crash: bool,
        grace: Duration,
    ) -> anyhow::Result<()> {
        if !name.starts_with(WORKER_PREFIX) {
            bail!("{name} is not a worker");
        }
        if crash {
            self.kill(name)?;
        } else {
            self.terminate(name, grace)?;
        }
        self.procs.remove(name);
        Ok(())
    }

    /// The holder identity of the watchers' Lease (`None` when unheld or absent).
    pub fn lease_holder(&self) -> anyhow::Result<Option<String>> {
        let (ns, name) = self.lease();
        let path = format!("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}");
        let body = match &self.cfg.real {
            Some(r) => {
                let out = Command::new(&r.kubectl)
                    .arg(format!("--kubeconfig={}", r.admin_kubeconfig.display()))
                    .args(["get", "--raw", &path])
                    .stdin(Stdio::null())
                    .output()
                    .with_context(|| format!("running {}", r.kubectl.display()))?;
                if !out.status.success() {
                    if String::from_utf8_lossy(&out.stderr).contains("NotFound") {
                        return Ok(None);
                    }
                    bail!("GET {path}: {}", String::from_utf8_lossy(&out.stderr).trim());
                }
                out.stdout
            }
            None => {
                let (status, body) = http_request(self.sim_addr, "GET", &path, None)?;
                if status == 404 {
                    return Ok(None);
                }
                if status != 200 {
                    bail!("GET {path}: HTTP {status}");
                }
                body
            }
        };
        let v: serde_json::Value = serde_json::from_slice(&body).context("decoding the Lease")?;
        Ok(v.pointer("/spec/holderIdentity")
            .and_then(serde_json::Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string))
    }

    /// The running watcher that holds the Lease, if any (identities are process names).
    pub fn leader_watcher(&self) -> anyhow::Result<Option<String>> {
        let holder = self.lease_holder()?;
        Ok(holder.filter(|h| self.watchers().contains(h)))
    }

    /// Waits until a running watcher holds the Lease and returns its name.
    pub fn wait_for_leader(&self, timeout: Duration) -> anyhow::Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            // A transient error (the sim answering an injected 500) is worth a retry.
            if let Ok(Some(l)) = self.leader_watcher() {
                return Ok(l);
            }
            if Instant::now() > deadline {
                bail!("no running watcher holds the Lease after {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `GET` on kjob-sim (e.g. `/metrics`, `/sim/state`): HTTP status and body.
    pub fn sim_get(&self, path: &str) -> anyhow::Result<(u16, Vec<u8>)> {
        http_request(self.sim_addr, "GET", path, None)
    }

    /// `POST` a JSON body to kjob-sim (e.g. `/sim/faults`, `/sim/close-watches`): status and body.
    pub fn sim_post(&self, path: &str, json: &str) -> anyhow::Result<(u16, Vec<u8>)> {
        http_request(self.sim_addr, "POST", path, Some(json))
    }

    /// Sets the faults the services' API traffic meets from now on (replacing earlier ones):
    /// kjob-sim's `/sim/faults`, or the fault proxy in front of the real server.
    pub fn inject(&self, faults: &ApiFaults) -> anyhow::Result<()> {
        if self.cfg.real.is_none() {
            let (code, body) = self.sim_post("/sim/faults", &faults.sim_json())?;
            anyhow::ensure!(
                code == 200,
                "POST /sim/faults: {code} {}",
                String::from_utf8_lossy(&body)
            );
            return Ok(());
        }
        self.fault_proxy()?.set_faults(faults.clone());
        Ok(())
    }

    /// Ends every open watch stream of the services (they watch again).
    pub fn close_watches(&self) -> anyhow::Result<()> {
        if self.cfg.real.is_none() {
            let (code, _) = self.sim_post("/sim/close-watches", "{}")?;
            anyhow::ensure!(code == 200, "POST /sim/close-watches: {code}");
            return Ok(());
        }
        self.fault_proxy()?.close_watches();
        Ok(())
    }

    /// The fault proxy in front of the real server.
    pub fn fault_proxy(&self) -> anyhow::Result<&FaultProxy> {
        self.proxy.as_ref().context("this stack runs on the real server without a fault proxy")
    }

    /// An error naming the first process that exited by itself, with its log file.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        for (name, p) in &mut self.procs {
            if let Some(status) = p.exited() {
                bail!("{name} exited ({status}); see {}", p.log.display());
            }
        }
        Ok(())
    }

    /// Stops every process in two tiers: first watchers and workers (so they hand back their
    /// leases while the queue still answers), then the servers; each tier drains in parallel
    /// for at most [`STOP_GRACE`].
    pub fn stop(&mut self) {
        let is_server = |n: &str| [REDIS, SIM, QUEUE].contains(&n);
        for servers in [false, true] {
            let deadline = Instant::now() + STOP_GRACE;
            let tier: Vec<&mut Proc> = self
                .procs
                .iter_mut()
                .filter(|(n, _)| is_server(n) == servers)
                .map(|(_, p)| p)
                .collect();
            let mut tier = tier;
            tier.iter_mut().for_each(|p| p.send_term());
            tier.iter_mut().for_each(|p| {
                p.reap_by(deadline);
            });
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A minimal HTTP/1.0 client for kjob-sim: HTTP/1.0 makes the server close the connection and
/// send no chunked encoding, so the body is simply everything after the headers.
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    json: Option<&str>,
) -> anyhow::Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT)
        .with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(HTTP_TIMEOUT))?;
    s.set_write_timeout(Some(HTTP_TIMEOUT))?;
    let body = json.unwrap_or("");
    let mut req = format!("{method} {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: */*\r\n");
    if json.is_some() {
        req.push_str("Content-Type: application/json\r\n");
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes())?;
    let mut buf = Vec::new();
    s.take(HTTP_MAX_BODY).read_to_end(&mut buf).with_context(|| format!("{method} {path}"))?;
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .with_context(|| format!("{method} {path}: no HTTP header end"))?;
    let head = String::from_utf8_lossy(&buf[..split]);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .with_context(|| format!("{method} {path}: bad status line {head:?}"))?;
    Ok((status, buf[split + 4..].to_vec()))
}
