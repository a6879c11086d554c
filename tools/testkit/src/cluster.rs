//! A real Kubernetes control plane on loopback, built from Go modules by `cluster/build.sh`:
//! etcd (data on tmpfs, no fsync), kube-apiserver (TLS, token authentication, Node+RBAC
//! authorization, service-account signing, OwnerReferencesPermissionEnforcement on top of the
//! default admission plugins, an audit log of kjob's ServiceAccounts), kube-controller-manager
//! (the Job controller off unless asked for), kube-scheduler and `kjob-node-agent` (fake nodes
//! `kjob-node-<i>` and, unless the kubelet is off, the kubelet stages kjob-sim uses).
//!
//! [`ControlPlane::start`] owns its processes and stops them on drop (tests);
//! [`ControlPlane::start`] with [`ClusterOptions::detach`] leaves them running and records their
//! pids in the run folder, for `make cluster-up`; [`down`] stops such a cluster.
//!
//! The run folder gets `kubeconfig` (cluster-admin), `kjob.kubeconfig` (the `kjob`
//! ServiceAccount of `kjob-system`, bound to deploy/base's ClusterRoles and nothing more),
//! `watcher.kubeconfig` and `worker.kubeconfig` (one ServiceAccount per service, bound as
//! deploy/base binds them), `audit.log`, `logs/` and `cluster.json` (ports and paths).

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::addons::{Addon, build_addons};
use crate::args::{ExtraArgs, Program};
use crate::process::{free_port, reap_by, send_sigterm, wait_for_tcp, workspace_root};

/// Version of the upstream binaries `cluster/build.sh` builds.
pub const KUBERNETES_VERSION: &str = "v1.37.2";
/// Prefix of the fake nodes' names (`kjob-node-0`, …).
pub const NODE_PREFIX: &str = "kjob-node";
/// Namespace of kjob's ServiceAccounts.
pub const KJOB_NAMESPACE: &str = "kjob-system";
/// The upstream binaries a control plane needs.
pub const CONTROL_PLANE_BINARIES: [&str; 5] =
    ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"];
/// The user kube-controller-manager's Job controller acts as (`--use-service-account-credentials`);
/// the audit log records its requests (every verb, as for kjob's ServiceAccounts: one policy for
/// both sides), so `make diff-upstream` and the benchmarks count them beside kjob's.
pub const UPSTREAM_JOB_CONTROLLER_USER: &str = "system:serviceaccount:kube-system:job-controller";
/// How long the whole start may take (a cold apiserver on a loaded 2-core machine).
const START_TIMEOUT: Duration = Duration::from_secs(180);
/// How long each process gets after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// Lifetime of the ServiceAccount tokens written into kubeconfigs.
const TOKEN_DURATION: &str = "48h";
/// Controllers of kube-controller-manager besides the Job controller: garbage collection
/// (Job deletion propagation), pod GC, namespaces, ServiceAccounts (the `default` one pods
/// need), node lifecycle (removes the not-ready taint new Nodes get), taint eviction, TTL after
/// finished, ResourceQuota usage, the root CA ConfigMap and ClusterRole aggregation.
const CONTROLLERS: &str = "garbage-collector-controller,pod-garbage-collector-controller,\
namespace-controller,serviceaccount-controller,node-lifecycle-controller,taint-eviction-controller,\
ttl-after-finished-controller,resourcequota-controller,root-ca-certificate-publisher-controller,\
clusterrole-aggregation-controller";

/// Which Job controller runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobController {
    /// kube-controller-manager's own is off: kjob (started by the caller) owns Jobs.
    Kjob,
    /// kube-controller-manager's own Job controller is on (side-by-side runs).
    Upstream,
}

/// What to start and where.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Run folder (kubeconfigs, PKI, logs, audit log).
    pub dir: PathBuf,
    /// Folder holding the upstream binaries; `None` runs `cluster/build.sh` to find or build them.
    pub bin_dir: Option<PathBuf>,
    /// The `kjob-node-agent` binary.
    pub node_agent: PathBuf,
    /// Number of fake nodes.
    pub nodes: u32,
    /// Run kube-scheduler and the node agent's kubelet (off: nodes stay Ready, nothing touches pods).
    pub kubelet: bool,
    /// Which Job controller runs.
    pub job_controller: JobController,
    /// Extra flags of kube-apiserver, kube-controller-manager (e.g.
    /// `--concurrent-job-syncs=50`) and kjob-node-agent (e.g. `--pod-run-time=100ms`).
    pub extra_args: ExtraArgs,
    /// Leave the processes running when the [`ControlPlane`] is dropped (`make cluster-up`).
    pub detach: bool,
    /// Batch add-ons started once the control plane is settled (`make cluster-up ADDONS=…`).
    pub addons: Vec<Addon>,
    /// Folder of the built add-ons; `None` runs `cluster/build-addons.sh` when `addons` is not
    /// empty.
    pub addons_dir: Option<PathBuf>,
}

impl ClusterOptions {
    /// Defaults: 3 nodes, kubelet on, kjob owns Jobs, binaries from `cluster/build.sh`.
    pub fn new(dir: PathBuf, node_agent: PathBuf) -> Self {
        Self {
            dir,
            bin_dir: None,
            node_agent,
            nodes: 3,
            kubelet: true,
            job_controller: JobController::Kjob,
            extra_args: ExtraArgs::default(),
            detach: false,
            addons: Vec::new(),
            addons_dir: None,
        }
    }
}

/// Runs `cluster/build.sh` (which builds the binaries once per go.sum and caches them outside
/// the repo) and returns the folder holding them.
pub fn build_binaries() -> anyhow::Result<PathBuf> {
    run_build_script("cluster/build.sh", "the real control plane")
}

/// Runs the build script at `script` (relative to the workspace root), which prints the folder
/// it built into on stdout; `what` names what it builds in the error.
pub(crate) fn run_build_script(script: &str, what: &str) -> anyhow::Result<PathBuf> {
    let script = workspace_root().join(script);
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed ({}): {what} could not be built", script.display(), out.status);
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Helm's command, built from the Go module pinned in `cluster/helm` (cached like the control
/// plane; `cluster/build-helm.sh`), for the chart's tests.
pub fn build_helm() -> anyhow::Result<PathBuf> {
    run_build_script("cluster/build-helm.sh", "Helm")
}

/// Whether a Go toolchain is on PATH (without one the real control plane cannot be built).
pub fn go_available() -> bool {
    Command::new("go")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// One started process.
#[derive(Debug)]
struct Proc {
    name: String,
    child: Child,
}

/// A running control plane.
#[derive(Debug)]
pub struct ControlPlane {
    /// Run folder.
    pub dir: PathBuf,
    /// Folder of the upstream binaries.
    pub bin_dir: PathBuf,
    /// `https://127.0.0.1:<port>`.
    pub server: String,
    /// Cluster-admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// The `kjob` ServiceAccount's kubeconfig (watcher and worker roles).
    pub kjob_kubeconfig: PathBuf,
    /// The `kjob-watcher` ServiceAccount's kubeconfig.
    pub watcher_kubeconfig: PathBuf,
    /// The `kjob-worker` ServiceAccount's kubeconfig.
    pub worker_kubeconfig: PathBuf,
    /// Audit log of every request by a `kjob-system` ServiceAccount (JSON lines).
    pub audit_log: PathBuf,
    /// Folder of the processes' logs.
    pub log_dir: PathBuf,
    procs: Vec<Proc>,
    etcd_data: PathBuf,
    detach: bool,
}

fn random_token() -> anyhow::Result<String> {
    let mut buf = [0u8; 16];
    fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

fn run(cmd: &mut Command, what: &str) -> anyhow::Result<String> {
    let out =
        cmd.stdin(Stdio::null()).output().with_context(|| format!("{what}: starting {cmd:?}"))?;
    if !out.status.success() {
        bail!("{what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `bin_dir`'s kubectl on `kubeconfig`; stdout on success.
fn kubectl(bin_dir: &Path, kubeconfig: &Path, args: &[&str]) -> anyhow::Result<String> {
    run(
        Command::new(bin_dir.join("kubectl"))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(args),
        &format!("kubectl {}", args.join(" ")),
    )
}

/// Makes the PKI once per run folder: a CA, the apiserver's serving certificate, the
/// service-account signing key pair.
fn make_pki(pki: &Path) -> anyhow::Result<()> {
    if pki.join("sa.pub").is_file() {
        return Ok(());
    }
    fs::create_dir_all(pki)?;
    let openssl = |args: &[&str], what: &str| {
        run(Command::new("openssl").args(args).current_dir(pki), what).map(|_| ())
    };
    openssl(
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "3650",
            "-subj",
            "/CN=kjob-test-ca",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
        ],
        "making the CA",
    )?;
    openssl(
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=kube-apiserver",
            "-keyout",
            "apiserver.key",
            "-out",
            "apiserver.csr",
        ],
        "making the apiserver key",
    )?;
    fs::write(
        pki.join("apiserver.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.0.0.1,DNS:kubernetes,DNS:kubernetes.default,\
DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth\n",
    )?;
    openssl(
        &[
            "x509",
            "-req",
            "-in",
            "apiserver.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "3650",
            "-extfile",
            "apiserver.ext",
            "-out",
            "apiserver.crt",
        ],
        "signing the apiserver certificate",
    )?;
    openssl(&["genrsa", "-out", "sa.key", "2048"], "making the service-account key")?;
    openssl(
        &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"],
        "deriving the service-account public key",
    )?;
    Ok(())
}

/// A kubeconfig for `server` with a bearer token.
fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &Path,
    user: &str,
    token: &str,
) -> anyhow::Result<()> {
    let cfg = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kjob-real", "cluster": {"server": server, "certificate-authority": ca}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "kjob-real", "context": {"cluster": "kjob-real", "user": user}}],
        "current-context": "kjob-real",
    });
    fs::write(path, serde_json::to_string_pretty(&cfg)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// The tmpfs folder for etcd's data, or the run folder when there is no /dev/shm.
fn etcd_data_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() { shm.to_path_buf() } else { dir.to_path_buf() };
    Ok(base.join(format!("kjob-etcd-{}", random_token()?)))
}

impl ControlPlane {
    /// Starts every component in order and returns once the apiserver is ready, the `default`
    /// ServiceAccount exists (kube-controller-manager runs) and every node is Ready and untainted.
    /// A component that finds its port taken (the ports are picked free, but another process's
    /// connection can take one before the component binds it) makes the whole start begin again
    /// on new ports, up to [`START_ATTEMPTS`] times.
    pub fn start(opts: ClusterOptions) -> anyhow::Result<Self> {
        let mut attempt = 1;
        loop {
            match Self::start_once(&opts) {
                Err(e) if attempt < START_ATTEMPTS && port_taken(&e) => {
                    eprintln!(
                        "kjob-cluster: a port was taken while the control plane started (attempt \
                         {attempt} of {START_ATTEMPTS}); starting again on new ports"
                    );
                    if opts.detach {
                        // A detached start leaves its processes running when it fails.
                        down(&opts.dir)?;
                    }
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    fn start_once(opts: &ClusterOptions) -> anyhow::Result<Self> {
        let started = Instant::now();
        let bin_dir = match &opts.bin_dir {
            Some(d) => d.clone(),
            None => build_binaries()?,
        };
        for b in CONTROL_PLANE_BINARIES {
            if !bin_dir.join(b).is_file() {
                bail!("{} lacks {b}: run cluster/build.sh", bin_dir.display());
            }
        }
        // Built before anything starts, so a failed build leaves no process behind.
        let addons_dir = match (&opts.addons_dir, opts.addons.is_empty()) {
            (_, true) => None,
            (Some(d), false) => Some(d.clone()),
            (None, false) => Some(build_addons()?),
        };
        if !opts.node_agent.is_file() {
            bail!("{} not found: run `cargo build -p kjob-sim --bins`", opts.node_agent.display());
        }
        let dir = opts.dir.clone();
        if dir.join("cluster.json").is_file() {
            // A previous detached cluster (or a crashed run) in the same folder: stop it first.
            down(&dir)?;
        }
        let log_dir = dir.join("logs");
        let pids = dir.join("pids");
        for d in [&dir, &log_dir, &pids] {
            fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        let pki = dir.join("pki");
        make_pki(&pki)?;
        let admin_token = random_token()?;
        let kcm_token = random_token()?;
        let sched_token = random_token()?;
        let agent_token = random_token()?;
        fs::write(
            pki.join("tokens.csv"),
            format!(
                "{admin_token},kjob-admin,u-admin,\"system:masters\"\n\
                 {kcm_token},system:kube-controller-manager,u-kcm\n\
                 {sched_token},system:kube-scheduler,u-sched\n\
                 {agent_token},kjob-node-agent,u-agent,\"system:masters\"\n"
            ),
        )?;
        let (etcd_port, peer_port, api_port) = (free_port(), free_port(), free_port());
        let server = format!("https://127.0.0.1:{api_port}");
        let ca = pki.join("ca.crt");
        let kubeconfig = dir.join("kubeconfig");
        write_kubeconfig(&kubeconfig, &server, &ca, "kjob-admin", &admin_token)?;
        let kcm_kubeconfig = dir.join("controller-manager.kubeconfig");
        write_kubeconfig(&kcm_kubeconfig, &server, &ca, "kube-controller-manager", &kcm_token)?;
        let sched_kubeconfig = dir.join("scheduler.kubeconfig");
        write_kubeconfig(&sched_kubeconfig, &server, &ca, "kube-scheduler", &sched_token)?;
        let agent_kubeconfig = dir.join("node-agent.kubeconfig");
        write_kubeconfig(&agent_kubeconfig, &server, &ca, "kjob-node-agent", &agent_token)?;
        let audit_policy = dir.join("audit-policy.yaml");
        fs::write(
            &audit_policy,
            format!(
                "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n\
                 - level: Metadata\n  userGroups: [\"system:serviceaccounts:{KJOB_NAMESPACE}\"]\n\
                 - level: Metadata\n  users: [\"{UPSTREAM_JOB_CONTROLLER_USER}\"]\n\
                 - level: None\n"
            ),
        )?;
        let audit_log = dir.join("audit.log");
        let _ = fs::remove_file(&audit_log);
        let etcd_data = etcd_data_dir(&dir)?;
        fs::write(dir.join("etcd-data"), etcd_data.display().to_string())?;

        let mut cp = ControlPlane {
            dir: dir.clone(),
            bin_dir: bin_dir.clone(),
            server: server.clone(),
            kubeconfig: kubeconfig.clone(),
            kjob_kubeconfig: dir.join("kjob.kubeconfig"),
            watcher_kubeconfig: dir.join("watcher.kubeconfig"),
            worker_kubeconfig: dir.join("worker.kubeconfig"),
            audit_log: audit_log.clone(),
            log_dir: log_dir.clone(),
            procs: Vec::new(),
            etcd_data: etcd_data.clone(),
            detach: opts.detach,
        };
        let p = |s: &Path| s.display().to_string();
        cp.spawn(
            "etcd",
            bin_dir.join("etcd"),
            vec![
                "--name=kjob0".into(),
                format!("--data-dir={}", p(&etcd_data)),
                format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"),
                format!("--advertise-client-urls=http://127.0.0.1:{etcd_port}"),
                format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-cluster=kjob0=http://127.0.0.1:{peer_port}"),
                "--unsafe-no-fsync=true".into(),
                "--auto-compaction-retention=1".into(),
                "--quota-backend-bytes=8589934592".into(),
                "--log-level=warn".into(),
            ],
        )?;
        wait_for_tcp(([127, 0, 0, 1], etcd_port).into(), Duration::from_secs(30))
            .context("etcd did not listen")?;

        let mut api_args = vec![
            format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={api_port}"),
            format!("--cert-dir={}", p(&pki)),
            format!("--tls-cert-file={}", p(&pki.join("apiserver.crt"))),
            format!("--tls-private-key-file={}", p(&pki.join("apiserver.key"))),
            format!("--client-ca-file={}", p(&ca)),
            format!("--token-auth-file={}", p(&pki.join("tokens.csv"))),
            "--authorization-mode=Node,RBAC".into(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", p(&pki.join("sa.pub"))),
            format!("--service-account-signing-key-file={}", p(&pki.join("sa.key"))),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--endpoint-reconciler-type=none".into(),
            "--allow-privileged=true".into(),
            "--enable-admission-plugins=OwnerReferencesPermissionEnforcement".into(),
            "--profiling=false".into(),
            format!("--audit-policy-file={}", p(&audit_policy)),
            format!("--audit-log-path={}", p(&audit_log)),
            "--audit-log-format=json".into(),
            "--audit-log-mode=blocking".into(),
        ];
        api_args.extend(opts.extra_args.of(Program::KubeApiserver).iter().cloned());
        cp.spawn("kube-apiserver", bin_dir.join("kube-apiserver"), api_args)?;
        cp.wait_ready(started)?;

        cp.bootstrap_kjob_rbac()?;

        let mut controllers = CONTROLLERS.to_string();
        if opts.job_controller == JobController::Upstream {
            controllers.push_str(",job-controller");
        }
        let mut kcm_args = vec![
            format!("--kubeconfig={}", p(&kcm_kubeconfig)),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
            "--use-service-account-credentials=true".into(),
            format!("--root-ca-file={}", p(&ca)),
            format!("--service-account-private-key-file={}", p(&pki.join("sa.key"))),
            format!("--controllers={controllers}"),
        ];
        kcm_args.extend(opts.extra_args.of(Program::KubeControllerManager).iter().cloned());
        cp.spawn("kube-controller-manager", bin_dir.join("kube-controller-manager"), kcm_args)?;

        if opts.kubelet {
            let sched_config = dir.join("scheduler.yaml");
            // Client QPS well above the default 50, so binding never limits a benchmark.
            fs::write(
                &sched_config,
                format!(
                    "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n\
                     clientConnection:\n  kubeconfig: {}\n  qps: 1000\n  burst: 2000\n\
                     leaderElection:\n  leaderElect: false\n",
                    p(&sched_kubeconfig)
                ),
            )?;
            cp.spawn(
                "kube-scheduler",
                bin_dir.join("kube-scheduler"),
                vec![
                    format!("--config={}", p(&sched_config)),
                    format!("--authentication-kubeconfig={}", p(&sched_kubeconfig)),
                    format!("--authorization-kubeconfig={}", p(&sched_kubeconfig)),
                    "--bind-address=127.0.0.1".into(),
                    format!("--secure-port={}", free_port()),
                ],
            )?;
        }
        let mut agent_args = vec![
            format!("--kubeconfig={}", p(&agent_kubeconfig)),
            format!("--nodes={}", opts.nodes),
            format!("--node-prefix={NODE_PREFIX}"),
            format!("--kubelet={}", if opts.kubelet { "on" } else { "off" }),
        ];
        agent_args.extend(opts.extra_args.of(Program::NodeAgent).iter().cloned());
        cp.spawn("kjob-node-agent", opts.node_agent.clone(), agent_args)?;
        cp.wait_settled(opts.nodes, started)?;
        if let Some(d) = &addons_dir {
            cp.start_addons(&opts.addons, d, &kubeconfig)?;
        }
        fs::write(
            dir.join("cluster.json"),
            serde_json::to_string_pretty(&json!({
                "server": server,
                "version": KUBERNETES_VERSION,
                "kubelet": opts.kubelet,
                "jobController": match opts.job_controller { JobController::Kjob => "kjob", JobController::Upstream => "upstream" },
                "nodes": opts.nodes,
                "etcdData": etcd_data,
                "binDir": bin_dir,
                "addons": opts.addons.iter().map(|a| a.name()).collect::<Vec<_>>(),
                "pids": cp.procs.iter().map(|p| json!({"name": p.name, "pid": p.child.id()})).collect::<Vec<_>>(),
            }))?,
        )?;
        Ok(cp)
    }

    pub(crate) fn spawn(
        &mut self,
        name: &str,
        program: PathBuf,
        args: Vec<String>,
    ) -> anyhow::Result<()> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_dir.join(format!("{name}.log")))?;
        let mut cmd = Command::new(&program);
        cmd.args(&args).stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
        if self.detach {
            // Its own process group: a Ctrl-C in the terminal that ran `make cluster-up` does
            // not reach the cluster.
            std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        }
        let child = cmd.spawn().with_context(|| format!("starting {}", program.display()))?;
        fs::write(self.dir.join("pids").join(name), child.id().to_string())?;
        self.procs.push(Proc { name: name.into(), child });
        Ok(())
    }

    /// Fails with the log tail of any process that already exited.
    pub(crate) fn check_alive(&mut self) -> anyhow::Result<()> {
        for p in &mut self.procs {
            if let Ok(Some(st)) = p.child.try_wait() {
                let log = fs::read_to_string(self.log_dir.join(format!("{}.log", p.name)))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                bail!("{} exited ({st}) during start:\n{}", p.name, tail.join("\n"));
            }
        }
        Ok(())
    }

    /// Runs the built kubectl with the admin kubeconfig.
    pub fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        kubectl(&self.bin_dir, &self.kubeconfig, args)
    }

    fn wait_ready(&mut self, started: Instant) -> anyhow::Result<()> {
        loop {
            self.check_alive()?;
            if self.kubectl(&["get", "--raw=/readyz"]).is_ok_and(|s| s.trim() == "ok") {
                return Ok(());
            }
            if started.elapsed() > START_TIMEOUT {
                bail!(
                    "kube-apiserver not ready after {START_TIMEOUT:?} (logs in {})",
                    self.log_dir.display()
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// ServiceAccounts and RBAC from deploy/base, and a token kubeconfig for each.
    fn bootstrap_kjob_rbac(&self) -> anyhow::Result<()> {
        let root = workspace_root();
        let mut manifest =
            format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {KJOB_NAMESPACE}\n---\n");
        for sa in ["kjob", "kjob-watcher", "kjob-worker"] {
            manifest.push_str(&format!(
                "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {sa}\n  namespace: {KJOB_NAMESPACE}\n---\n"
            ));
        }
        // `kjob` holds both services' roles (one token runs the whole stack); bound to exactly
        // the ClusterRoles and Role of deploy/base.
        for (kind, name) in [
            ("ClusterRoleBinding", "kjob-watcher"),
            ("ClusterRoleBinding", "kjob-worker"),
            ("RoleBinding", "kjob-watcher-leader-election"),
        ] {
            let (role_kind, ns) = if kind == "RoleBinding" {
                ("Role", format!("\n  namespace: {KJOB_NAMESPACE}"))
            } else {
                ("ClusterRole", String::new())
            };
            manifest.push_str(&format!(
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: {kind}\nmetadata:\n  name: kjob-all-{name}{ns}\n\
                 roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: {role_kind}\n  name: {name}\n\
                 subjects:\n- kind: ServiceAccount\n  name: kjob\n  namespace: {KJOB_NAMESPACE}\n---\n"
            ));
        }
        let file = self.dir.join("kjob-rbac.yaml");
        fs::write(&file, manifest)?;
        self.kubectl(&["apply", "-f", &file.display().to_string()])?;
        for f in ["watcher-rbac.yaml", "worker-rbac.yaml"] {
            let path = root.join("deploy/base").join(f);
            self.kubectl(&["apply", "-n", KJOB_NAMESPACE, "-f", &path.display().to_string()])?;
        }
        let ca = self.dir.join("pki/ca.crt");
        for (sa, path) in [
            ("kjob", &self.kjob_kubeconfig),
            ("kjob-watcher", &self.watcher_kubeconfig),
            ("kjob-worker", &self.worker_kubeconfig),
        ] {
            let token = self.kubectl(&[
                "create",
                "token",
                sa,
                "-n",
                KJOB_NAMESPACE,
                &format!("--duration={TOKEN_DURATION}"),
            ])?;
            write_kubeconfig(
                path,
                &self.server,
                &ca,
                &format!("system:serviceaccount:{KJOB_NAMESPACE}:{sa}"),
                token.trim(),
            )?;
        }
        Ok(())
    }

    /// Waits for the `default` ServiceAccount (kube-controller-manager is running) and for every
    /// node to be Ready without taints (node-lifecycle lifted the not-ready one).
    fn wait_settled(&mut self, nodes: u32, started: Instant) -> anyhow::Result<()> {
        loop {
            self.check_alive()?;
            let sa = self
                .kubectl(&["get", "serviceaccount", "default", "-n", "default", "-o", "name"])
                .is_ok();
            let ready = self
                .kubectl(&["get", "nodes", "-o", "json"])
                .ok()
                .and_then(|s| serde_json::from_str::<Value>(&s).ok())
                .map(|v| {
                    let items = v["items"].as_array().cloned().unwrap_or_default();
                    items
                        .iter()
                        .filter(|n| {
                            let ready = n["status"]["conditions"].as_array().is_some_and(|cs| {
                                cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True")
                            });
                            let tainted =
                                n["spec"]["taints"].as_array().is_some_and(|t| !t.is_empty());
                            ready && !tainted
                        })
                        .count()
                })
                .unwrap_or(0);
            if sa && ready >= nodes as usize {
                return Ok(());
            }
            if started.elapsed() > START_TIMEOUT {
                bail!(
                    "control plane not settled after {START_TIMEOUT:?}: default ServiceAccount {}, {ready}/{nodes} nodes Ready and untainted (logs in {})",
                    if sa { "present" } else { "missing" },
                    self.log_dir.display()
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Audit entries of requests by kjob's ServiceAccounts that RBAC refused.
    pub fn forbidden_requests(&self) -> anyhow::Result<Vec<Value>> {
        forbidden_in_audit_log(&self.audit_log)
    }

    /// Stops every process (newest first) and removes etcd's data.
    pub fn stop(&mut self) {
        while let Some(mut p) = self.procs.pop() {
            send_sigterm(p.child.id());
            reap_by(&mut p.child, Instant::now() + STOP_GRACE);
            let _ = fs::remove_file(self.dir.join("pids").join(&p.name));
        }
        let _ = fs::remove_dir_all(&self.etcd_data);
        let _ = fs::remove_file(self.dir.join("cluster.json"));
    }
}

/// Attempts at starting a control plane whose components find a port taken.
pub const START_ATTEMPTS: usize = 3;

/// Whether a failed start failed because a component could not bind its port.
fn port_taken(e: &anyhow::Error) -> bool {
    format!("{e:#}").contains("address already in use")
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if !self.detach {
            self.stop();
        }
    }
}

/// Audit entries with `authorization.k8s.io/decision: forbid` in a JSON-lines audit log.
pub fn forbidden_in_audit_log(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| {
            is_kjob_user(e) && e["annotations"]["authorization.k8s.io/decision"] == "forbid"
        })
        .collect())
}

/// Whether an audit entry is a request by one of kjob's ServiceAccounts (the log also holds
/// the upstream Job controller's writes).
fn is_kjob_user(e: &Value) -> bool {
    e["user"]["username"]
        .as_str()
        .and_then(|u| u.strip_prefix("system:serviceaccount:"))
        .is_some_and(|u| u.starts_with(&format!("{KJOB_NAMESPACE}:")))
}

/// What kjob's ServiceAccounts did, from an audit log.
#[derive(Debug, Default)]
pub struct AuditSummary {
    /// Requests logged.
    pub requests: usize,
    /// `user verb resource namespace/name` of each request RBAC refused.
    pub forbidden: Vec<String>,
    /// The same for each request answered 422 (a write the server found invalid).
    pub invalid: Vec<String>,
}

/// Reads a JSON-lines audit log of kjob's ServiceAccounts.
pub fn audit_summary(path: &Path) -> anyhow::Result<AuditSummary> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = AuditSummary::default();
    for e in text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).filter(is_kjob_user)
    {
        out.requests += 1;
        let o = &e["objectRef"];
        let line = format!(
            "{} {} {}{} {}/{}",
            e["user"]["username"].as_str().unwrap_or_default(),
            e["verb"].as_str().unwrap_or_default(),
            o["resource"].as_str().unwrap_or_default(),
            o["subresource"].as_str().map(|s| format!("/{s}")).unwrap_or_default(),
            o["namespace"].as_str().unwrap_or_default(),
            o["name"].as_str().unwrap_or_default(),
        );
        if e["annotations"]["authorization.k8s.io/decision"] == "forbid" {
            out.forbidden.push(line);
        } else if e["responseStatus"]["code"] == 422 {
            out.invalid.push(format!(
                "{line}: {}",
                e["responseStatus"]["message"].as_str().unwrap_or_default()
            ));
        }
    }
    Ok(out)
}

/// Stops a detached cluster recorded in `dir` (pids under `dir/pids`) and removes its data:
/// etcd's tmpfs folder, the PKI, kubeconfigs, logs and the audit log.
pub fn down(dir: &Path) -> anyhow::Result<()> {
    let pids_dir = dir.join("pids");
    let mut pids: Vec<(String, u32)> = Vec::new();
    if let Ok(entries) = fs::read_dir(&pids_dir) {
        for e in entries.flatten() {
            if let Ok(s) = fs::read_to_string(e.path())
                && let Ok(pid) = s.trim().parse::<u32>()
            {
                pids.push((e.file_name().to_string_lossy().into_owned(), pid));
            }
        }
    }
    let alive = |pid: u32| Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(pid);
    for (_, pid) in &pids {
        let _ =
            Command::new("kill").arg("-TERM").arg(pid.to_string()).stderr(Stdio::null()).status();
    }
    let deadline = Instant::now() + STOP_GRACE;
    while Instant::now() < deadline && pids.iter().any(|(_, p)| alive(*p)) {
        std::thread::sleep(Duration::from_millis(100));
    }
    for (_, pid) in &pids {
        if alive(*pid) {
            let _ = Command::new("kill")
                .arg("-KILL")
                .arg(pid.to_string())
                .stderr(Stdio::null())
                .status();
        }
    }
    if let Ok(s) = fs::read_to_string(dir.join("etcd-data")) {
        let _ = fs::remove_dir_all(s.trim());
    }
    for sub in ["pids", "pki", "logs"] {
        let _ = fs::remove_dir_all(dir.join(sub));
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.path().is_file() {
                let _ = fs::remove_file(e.path());
            }
        }
    }
    Ok(())
}

fn is_zombie(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next().map(|r| r.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

/// What a test needs of a running control plane: its kubeconfigs, audit log and binaries.
#[derive(Debug, Clone)]
pub struct ClusterInfo {
    /// Run folder.
    pub dir: PathBuf,
    /// Folder of the upstream binaries (kubectl among them).
    pub bin_dir: PathBuf,
    /// Cluster-admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// The `kjob` ServiceAccount's kubeconfig.
    pub kjob_kubeconfig: PathBuf,
    /// The `kjob-watcher` ServiceAccount's kubeconfig.
    pub watcher_kubeconfig: PathBuf,
    /// The `kjob-worker` ServiceAccount's kubeconfig.
    pub worker_kubeconfig: PathBuf,
    /// Audit log of kjob's ServiceAccounts.
    pub audit_log: PathBuf,
    /// Whether pods are run by the node agent (and scheduled by kube-scheduler).
    pub kubelet: bool,
    /// Whether kube-controller-manager's Job controller runs.
    pub upstream_job_controller: bool,
    /// Names of the batch add-ons running (`kueue`, `jobset`).
    pub addons: Vec<String>,
}

impl ClusterInfo {
    /// Reads the `cluster.json` a started control plane wrote into `dir`.
    pub fn read(dir: &Path) -> anyhow::Result<Self> {
        let path = dir.join("cluster.json");
        let v: Value = serde_json::from_str(
            &fs::read_to_string(&path)
                .with_context(|| format!("reading {} (is the cluster up?)", path.display()))?,
        )?;
        Ok(Self {
            dir: dir.to_path_buf(),
            bin_dir: PathBuf::from(v["binDir"].as_str().unwrap_or_default()),
            kubeconfig: dir.join("kubeconfig"),
            kjob_kubeconfig: dir.join("kjob.kubeconfig"),
            watcher_kubeconfig: dir.join("watcher.kubeconfig"),
            worker_kubeconfig: dir.join("worker.kubeconfig"),
            audit_log: dir.join("audit.log"),
            kubelet: v["kubelet"].as_bool().unwrap_or(true),
            upstream_job_controller: v["jobController"] == "upstream",
            addons: v["addons"]
                .as_array()
                .map(|a| a.iter().filter_map(|n| n.as_str().map(String::from)).collect())
                .unwrap_or_default(),
        })
    }

    /// Runs the cluster's kubectl with the admin kubeconfig; stdout on success.
    pub fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        kubectl(&self.bin_dir, &self.kubeconfig, args)
    }

    /// Creates namespace `ns` and waits for its `default` ServiceAccount (the ServiceAccount
    /// admission plugin refuses pods until the serviceaccount controller made it).
    pub fn create_namespace(&self, ns: &str) -> anyhow::Result<()> {
        self.kubectl(&["create", "namespace", ns])?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.kubectl(&["get", "serviceaccount", "default", "-n", ns, "-o", "name"]).is_err() {
            if Instant::now() > deadline {
                bail!("namespace {ns} got no default ServiceAccount within 30 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// Audit entries of requests by kjob's ServiceAccounts that RBAC refused.
    pub fn forbidden_requests(&self) -> anyhow::Result<Vec<Value>> {
        forbidden_in_audit_log(&self.audit_log)
    }
}

/// Environment variable naming the run folder of a control plane shared by every test
/// (`make test` starts one); unset, a test starts a control plane of its own.
pub const SHARED_CLUSTER_ENV: &str = "KJOB_TEST_CLUSTER";

/// The control plane a test runs on.
#[derive(Debug)]
pub enum TestCluster {
    /// Shared with other tests (started by `make test`); the test owns only its namespace.
    Shared(ClusterInfo),
    /// Started for this test alone; stopped when dropped.
    Owned(Box<ControlPlane>, ClusterInfo),
}

impl TestCluster {
    /// Its kubeconfigs and binaries.
    pub fn info(&self) -> &ClusterInfo {
        match self {
            TestCluster::Shared(i) | TestCluster::Owned(_, i) => i,
        }
    }
}

/// The control plane for a real-server test: the shared one named by [`SHARED_CLUSTER_ENV`],
/// else one started for this test (kubelet on, kjob owns Jobs). `Ok(None)` only when no Go
/// toolchain exists at all, so the real control plane cannot be built; the caller skips
/// visibly. A failed build or start is an error, never a skip.
pub fn test_cluster() -> anyhow::Result<Option<TestCluster>> {
    if let Some(dir) = std::env::var_os(SHARED_CLUSTER_ENV) {
        return Ok(Some(TestCluster::Shared(ClusterInfo::read(Path::new(&dir))?)));
    }
    if !go_available() {
        eprintln!(
            "SKIP real-server test: no Go toolchain on PATH, so the real control plane cannot be built"
        );
        return Ok(None);
    }
    let dir = tempfile::Builder::new().prefix("kjob-cluster-").tempdir()?.keep();
    let agent = crate::process::bin_path("kjob-node-agent")?;
    let cp = ControlPlane::start(ClusterOptions::new(dir.clone(), agent))?;
    let info = ClusterInfo::read(&dir)?;
    Ok(Some(TestCluster::Owned(Box::new(cp), info)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_port_is_told_apart_from_other_start_failures() {
        // As kube-apiserver reported it in a benchmark run (2026-12-04), inside check_alive's
        // error.
        let taken = anyhow::anyhow!(
            "kube-apiserver exited (exit status: 1) during start:\nE1204 22:50:59.984086 14609 \
             run.go:72] \"command failed\" err=\"failed to create listener: failed to listen on \
             127.0.0.1:38383: listen tcp 127.0.0.1:38383: bind: address already in use\""
        );
        assert!(port_taken(&taken));
        assert!(port_taken(&taken.context("starting the control plane")));
        let other =
            anyhow::anyhow!("etcd exited (exit status: 1) during start:\npermission denied");
        assert!(!port_taken(&other));
    }
}
