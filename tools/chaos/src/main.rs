//! `kjob-chaos`: the fault suite (see the library docs).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use kjob_chaos::{ChaosConfig, run};

use kjob_svc::parse_duration;

/// Runs mixed Jobs through the real kjob processes under seeded faults; exits 1 on any violation.
#[derive(Debug, Parser)]
#[command(name = "kjob-chaos", version, args_override_self = true)]
struct Args {
    /// Seed of the workload and the fault schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Number of Jobs.
    #[arg(long, default_value_t = 300)]
    jobs: usize,
    /// How long faults are injected.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    duration: Duration,
    /// Pause between two faults.
    #[arg(long, default_value = "4s", value_parser = parse_duration)]
    fault_interval: Duration,
    /// Fault kinds to inject, comma-separated (default: all): kill-worker, restart-queue,
    /// restart-redis, kill-leader-watcher, wipe-redis, failover-lagging, api-429-500,
    /// close-watches.
    #[arg(long, value_delimiter = ',')]
    faults: Vec<kjob_chaos::Fault>,
    /// Worker processes.
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// Folder of the kjob binaries (default: this binary's folder).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Folder for logs and redis data (default: a fresh temporary folder, kept on failure).
    #[arg(long)]
    run_dir: Option<PathBuf>,
    /// How long Jobs may take to finish after the last fault.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    converge_timeout: Duration,
    /// Base run time of each pod.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pod_run_time: Duration,
    /// Run on the real control plane of this `make cluster-up` folder instead of kjob-sim (the
    /// API-error and cut-watch faults then come from a fault proxy in front of kube-apiserver).
    #[arg(long)]
    cluster: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    kjob_svc::main(kjob_svc::Threads::PerCpu, chaos)
}

async fn chaos(args: Args) -> anyhow::Result<()> {
    let bin_dir = match args.bin_dir {
        Some(d) => d,
        None => std::env::current_exe()?.parent().context("binary folder")?.to_path_buf(),
    };
    let run_dir = match args.run_dir {
        Some(d) => d,
        None => tempfile::Builder::new().prefix("kjob-chaos-").tempdir()?.keep(),
    };
    let faults = if args.faults.is_empty() { kjob_chaos::Fault::ALL.into() } else { args.faults };
    let cluster = args.cluster.as_deref().map(kjob_testkit::cluster::ClusterInfo::read);
    let cfg = ChaosConfig {
        redis_server: kjob_testkit::redis::redis_server_binary()?,
        run_dir: run_dir.clone(),
        cluster: cluster.transpose()?,
        faults,
        bin_dir,
        // The run's size and pace, as given.
        seed: args.seed,
        jobs: args.jobs,
        duration: args.duration,
        fault_interval: args.fault_interval,
        workers: args.workers,
        converge_timeout: args.converge_timeout,
        pod_run_time: args.pod_run_time,
    };
    let report = run(cfg).await?;
    print!("{report}");
    println!("logs: {}", run_dir.join("logs").display());
    if !report.violations.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}
