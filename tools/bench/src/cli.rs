//! The flags both benchmark binaries take: where the binaries are, where the report goes, how the
//! services log.

use std::path::PathBuf;

/// Binaries, output and logging of a benchmark run.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Folder of the release builds of the kjob binaries (kjob-sim, kjob-queue, kjob-watcher,
    /// kjob-worker, and kjob-node-agent for the run against upstream).
    #[arg(long, default_value = "target/release")]
    pub bin_dir: PathBuf,
    /// The redis-server executable.
    #[arg(long, env = "KJOB_REDIS_SERVER", default_value = "redis-server")]
    pub redis_server: PathBuf,
    /// Where the report, its charts and the runs' folders (with the process logs) go.
    #[arg(long, default_value = "target/bench")]
    pub out: PathBuf,
    /// `RUST_LOG` of the kjob services (their logs go to the runs' folders under `--out`).
    #[arg(long, default_value = "warn")]
    pub service_log: String,
    /// The benchmark's own logging.
    #[command(flatten)]
    pub log: kjob_svc::LogArgs,
}
