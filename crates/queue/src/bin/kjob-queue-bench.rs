//! `kjob-queue-bench`: load tools for kjob-queue.
//!
//! `kjob-queue-bench lessee` is a lessee process for crash and load tests: it leases keys and
//! either finishes them (Done/Forget) as fast as it can, or, with `--hold`, keeps the leases
//! without renewing them until it is killed (a worker that hung or died mid-sync).

use std::io::Write;
use std::time::Duration;

use clap::{Parser, Subcommand};
use kjob_queue_client::{Outcome, QueueClient};
use kjob_svc::LogArgs;

/// Load tools for kjob-queue.
#[derive(Debug, Parser)]
#[command(name = "kjob-queue-bench", version)]
struct Args {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    log: LogArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Lease keys; print each leased key on stdout.
    Lessee {
        /// URL of a kjob-queue server.
        #[arg(long, env = "KJOB_QUEUE_URL", default_value = "http://127.0.0.1:50051")]
        queue_url: String,
        /// Queue name.
        #[arg(long, default_value = kjob_core::JOB_QUEUE)]
        queue: String,
        /// Lease duration.
        #[arg(long, value_parser = kjob_svc::parse_duration, default_value = "30s")]
        lease: Duration,
        /// Stop leasing after this many keys (0 = no limit).
        #[arg(long, default_value_t = 0)]
        count: u64,
        /// Keep the leases (never Done, never renew) and wait to be killed.
        #[arg(long)]
        hold: bool,
        /// Worker id shown by inspect.
        #[arg(long, default_value = "bench-lessee")]
        worker_id: String,
    },
}

/// Long-poll wait of each Lease call.
const WAIT: Duration = Duration::from_secs(5);
/// Keys leased per call.
const BATCH: u32 = 10;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Args { command, log } = Args::parse();
    kjob_svc::init_logging(&log)?;
    match command {
        Command::Lessee { queue_url, queue, lease, count, hold, worker_id } => {
            let client = QueueClient::connect_lazy(&queue_url)?;
            let mut leased = 0u64;
            let mut out = std::io::stdout().lock();
            while count == 0 || leased < count {
                let want = if count == 0 { BATCH } else { BATCH.min((count - leased) as u32) };
                let items = client.lease(&queue, want, lease, WAIT, &worker_id).await?;
                for it in items {
                    writeln!(out, "{}", it.key)?;
                    out.flush()?;
                    leased += 1;
                    if !hold {
                        match client.done(&queue, &it.key, &it.lease_id, Outcome::Forget).await {
                            Ok(_) | Err(kjob_queue_client::ClientError::LeaseLost(_)) => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                }
            }
            if hold {
                // Hold the leases until killed: this process plays a worker that died mid-sync.
                std::future::pending::<()>().await;
            }
            Ok(())
        }
    }
}
