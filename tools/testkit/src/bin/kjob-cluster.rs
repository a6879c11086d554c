//! kjob-cluster: start (`up`) or stop (`down`) the real control plane of `make cluster-up` in
//! the background, built from Go modules by cluster/build.sh.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use kjob_testkit::Program;
use kjob_testkit::addons::{self, Addon};
use kjob_testkit::cluster::{self, ClusterOptions, ControlPlane, JobController};
use kjob_testkit::stack::{RealServer, Stack, StackConfig};

/// The real Kubernetes control plane kjob is tested against, on loopback.
#[derive(Debug, Parser)]
#[command(name = "kjob-cluster", version)]
struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OnOff {
    On,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Controller {
    /// kube-controller-manager's Job controller off (kjob's services own Jobs).
    Kjob,
    /// kube-controller-manager's Job controller on.
    Upstream,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Start etcd, kube-apiserver, kube-controller-manager, kube-scheduler and the node agent
    /// in the background; return once the apiserver is ready and the nodes are Ready.
    Up {
        /// Run folder: kubeconfig, kjob.kubeconfig, logs/, audit.log.
        #[arg(long, default_value = "target/cluster")]
        dir: PathBuf,
        /// Fake nodes (`kjob-node-0`, …).
        #[arg(long, default_value_t = 3)]
        nodes: u32,
        /// off: no scheduler and nothing touches pods (nodes stay Ready, Leases renewed).
        #[arg(long, value_enum, default_value = "on")]
        kubelet: OnOff,
        /// Which Job controller runs.
        #[arg(long, value_enum, default_value = "kjob")]
        job_controller: Controller,
        /// Folder of the upstream binaries (default: build or find them with cluster/build.sh).
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        /// The kjob-node-agent binary (default: beside this binary).
        #[arg(long)]
        node_agent: Option<PathBuf>,
        /// Extra kube-controller-manager flag (repeatable), e.g. --kcm-arg=--concurrent-job-syncs=50.
        #[arg(long = "kcm-arg", allow_hyphen_values = true)]
        kcm_args: Vec<String>,
        /// Extra kube-apiserver flag (repeatable).
        #[arg(long = "apiserver-arg", allow_hyphen_values = true)]
        apiserver_args: Vec<String>,
        /// Extra kjob-node-agent flag (repeatable), e.g. --agent-arg=--pod-run-time=100ms.
        #[arg(long = "agent-arg", allow_hyphen_values = true)]
        agent_args: Vec<String>,
        /// Batch add-ons to start beside it, comma-separated: kueue, jobset (built by
        /// cluster/build-addons.sh; see docs/ecosystem.md).
        #[arg(long, default_value = "")]
        addons: String,
        /// Start kjob beside it too: Redis, kjob-queue, one watcher and this many workers (0:
        /// none), on kjob's ServiceAccounts with mTLS and Redis ACL/TLS as deploy/ runs them,
        /// in the background like the cluster (stopped by `down`). They take every Job when
        /// upstream's Job controller is off, else only the Jobs naming kjob in spec.managedBy.
        #[arg(long, default_value_t = 0)]
        kjob_workers: usize,
    },
    /// Summarise kjob's requests in the audit log; exit 1 if RBAC refused any (a `forbid`
    /// decision) or the server rejected any write as invalid (422).
    Audit {
        /// Run folder given to `up`.
        #[arg(long, default_value = "target/cluster")]
        dir: PathBuf,
    },
    /// Stop every process of the cluster in `--dir` and remove its data.
    Down {
        /// Run folder given to `up`.
        #[arg(long, default_value = "target/cluster")]
        dir: PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    match Args::parse().command {
        Cmd::Up {
            dir,
            nodes,
            kubelet,
            job_controller,
            bin_dir,
            node_agent,
            kcm_args,
            apiserver_args,
            agent_args,
            addons,
            kjob_workers,
        } => {
            let node_agent = match node_agent {
                Some(p) => p,
                None => std::env::current_exe()?.with_file_name("kjob-node-agent"),
            };
            std::fs::create_dir_all(&dir)?;
            let dir = dir.canonicalize()?;
            let mut opts = ClusterOptions::new(dir.clone(), node_agent);
            opts.bin_dir = bin_dir;
            opts.nodes = nodes;
            opts.kubelet = kubelet == OnOff::On;
            opts.job_controller = match job_controller {
                Controller::Kjob => JobController::Kjob,
                Controller::Upstream => JobController::Upstream,
            };
            opts.extra_args
                .add(Program::KubeControllerManager, kcm_args)
                .add(Program::KubeApiserver, apiserver_args)
                .add(Program::NodeAgent, agent_args);
            opts.detach = true;
            opts.addons = Addon::parse_list(&addons)?;
            let opts_addons = opts.addons.clone();
            let started = std::time::Instant::now();
            let cp = ControlPlane::start(opts)?;
            println!(
                "cluster up in {:.1}s: {} (Kubernetes {}, kubelet {}, job controller {})",
                started.elapsed().as_secs_f64(),
                cp.server,
                cluster::KUBERNETES_VERSION,
                if kubelet == OnOff::On { "on" } else { "off" },
                match job_controller {
                    Controller::Kjob => "kjob (upstream's off)",
                    Controller::Upstream => "upstream",
                }
            );
            for a in &opts_addons {
                let v = match a {
                    Addon::Kueue => addons::KUEUE_VERSION,
                    Addon::JobSet => addons::JOBSET_VERSION,
                };
                println!(
                    "  addon:  {} {v} (log: {})",
                    a.name(),
                    cp.log_dir.join(format!("{}.log", a.name())).display()
                );
            }
            if kjob_workers > 0 {
                let logs = start_kjob(&dir, kjob_workers, job_controller == Controller::Kjob)?;
                println!(
                    "  stack:  redis, kjob-queue, a watcher and {kjob_workers} worker(s), taking {} (logs: {})",
                    if job_controller == Controller::Kjob {
                        "every Job"
                    } else {
                        "the Jobs naming kjob.io/job-controller"
                    },
                    logs.display()
                );
            }
            println!("  admin:  {}", cp.kubeconfig.display());
            println!("  kjob:   {}", cp.kjob_kubeconfig.display());
            println!("  logs:   {}", cp.log_dir.display());
            println!("  stop:   make cluster-down");
            Ok(())
        }
        Cmd::Audit { dir } => {
            let summary = cluster::audit_summary(&dir.join("audit.log"))?;
            println!(
                "kjob's requests in {}: {} ({} refused by RBAC, {} rejected as invalid)",
                dir.join("audit.log").display(),
                summary.requests,
                summary.forbidden.len(),
                summary.invalid.len()
            );
            for line in summary.forbidden.iter().chain(&summary.invalid).take(20) {
                println!("  {line}");
            }
            if summary.forbidden.is_empty() && summary.invalid.is_empty() {
                Ok(())
            } else {
                std::process::exit(1)
            }
        }
        Cmd::Down { dir } => {
            cluster::down(&dir)?;
            println!("cluster in {} stopped and its data removed", dir.display());
            Ok(())
        }
    }
}

/// Starts kjob's stack on the cluster in `dir`, secured as deploy/ runs it, and leaves it
/// running: its processes' pids go beside the cluster's, so `down` stops them too. Returns the
/// folder of its logs.
fn start_kjob(dir: &std::path::Path, workers: usize, manage_all: bool) -> anyhow::Result<PathBuf> {
    let info = cluster::ClusterInfo::read(dir)?;
    let bin_dir = std::env::current_exe()?
        .parent()
        .map(PathBuf::from)
        .ok_or_else(|| anyhow::anyhow!("kjob-cluster has no folder"))?;
    let redis = kjob_testkit::redis::redis_server_binary()?;
    let mut cfg = StackConfig::new(bin_dir, redis, dir.join("kjob"), workers);
    let mut real = RealServer::from_cluster(&info, "unused");
    // Every namespace: the watcher lists Jobs and pods cluster-wide, as deployed.
    real.namespace = None;
    real.lease_name = "kjob-watcher".into();
    cfg.real = Some(real);
    cfg.tls = true;
    cfg.redis_tls = true;
    // Not the terminal's process group: a Ctrl-C after `make cluster-up` must not reach them.
    cfg.own_process_groups = true;
    if manage_all {
        cfg.extra_args
            .add(Program::Watcher, ["--manage-all-jobs"])
            .add(Program::Worker, ["--manage-all-jobs"]);
    }
    let stack = Stack::start(cfg)?;
    for (name, pid) in stack.pids() {
        std::fs::write(dir.join("pids").join(format!("stack-{name}")), pid.to_string())?;
    }
    let logs = stack.log_dir.clone();
    // Left running; `kjob-cluster down` stops them by their pids.
    std::mem::forget(stack);
    Ok(logs)
}
