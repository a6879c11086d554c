//! The processes of one benchmark stack, started by `kjob_testkit::stack` (the same launcher
//! the chaos suite and the end-to-end tests use): redis-server, kjob-sim, kjob-queue, one
//! kjob-watcher and N kjob-workers, each logging to `<run dir>/logs/<name>.log`.

use std::path::PathBuf;
use std::time::Duration;

use kjob_testkit::Program;
pub use kjob_testkit::stack::Stack;
use kjob_testkit::stack::{REDIS, StackConfig};

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
    /// `RUST_LOG` of the kjob services.
    pub service_log: String,
    /// Extra kjob-worker flags.
    pub worker_args: Vec<String>,
}

impl StackOpts {
    /// The launcher's configuration for these options.
    pub fn config(&self) -> StackConfig {
        let mut cfg = StackConfig::new(
            self.bin_dir.clone(),
            self.redis_server.clone(),
            self.run_dir.clone(),
            self.workers,
        );
        cfg.controller_name = self.controller_name.clone();
        cfg.extra_args.add(Program::Worker, self.worker_args.iter().cloned());
        let latency = format!("--write-latency={}ms", self.write_latency.as_millis());
        cfg.extra_args.add(Program::Sim, [latency]);
        if self.workers == 0 {
            cfg.sim_only = true;
            cfg.extra_args.add(Program::Sim, ["--kubelet=off"]);
        }
        // The report is about throughput: by default the services log warnings only.
        cfg.env = vec![("RUST_LOG".into(), self.service_log.clone())];
        cfg
    }
}

/// Starts the stack of `o` (blocking; called from the async harness through `block_in_place`).
pub fn start(o: &StackOpts) -> anyhow::Result<Stack> {
    let cfg = o.config();
    tokio::task::block_in_place(|| Stack::start(cfg))
}

/// Base URLs of the admin servers (`/metrics`) of the running workers.
pub fn worker_admin_urls(stack: &Stack) -> Vec<String> {
    stack.workers().iter().filter_map(|w| stack.admin_url(w)).collect()
}

/// A client of the stack's Redis (over TLS as its admin user when the stack runs Redis as
/// deploy/ does), unless it runs kjob-sim alone.
pub fn redis_client(stack: &Stack) -> anyhow::Result<Option<redis::Client>> {
    if stack.pid(REDIS).is_none() {
        return Ok(None);
    }
    let url = stack.redis_url.as_str();
    Ok(Some(match &stack.redis_ca {
        None => redis::Client::open(url)?,
        Some(ca) => redis::Client::build_with_tls(
            url,
            redis::TlsCertificates { client_tls: None, root_cert: Some(std::fs::read(ca)?) },
        )?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_only_without_workers_and_quiet_logs() {
        let mut o = StackOpts {
            bin_dir: "bin".into(),
            redis_server: "redis-server".into(),
            run_dir: "run".into(),
            workers: 0,
            write_latency: Duration::from_millis(10),
            controller_name: "kjob.io/job-controller".into(),
            service_log: "warn".into(),
            worker_args: vec!["--kube-qps=1000".into()],
        };
        let cfg = o.config();
        assert!(cfg.sim_only);
        assert_eq!(cfg.extra_args.of(Program::Sim), ["--write-latency=10ms", "--kubelet=off"]);
        assert!(cfg.env.iter().any(|(k, v)| k == "RUST_LOG" && v == "warn"));
        o.workers = 2;
        let cfg = o.config();
        assert!(!cfg.sim_only);
        assert_eq!(cfg.workers, 2);
        assert_eq!(cfg.extra_args.of(Program::Sim), ["--write-latency=10ms"]);
        assert_eq!(cfg.extra_args.of(Program::Worker), ["--kube-qps=1000"]);
    }
}
