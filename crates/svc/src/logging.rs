//! `--log-format plain|json` plus `RUST_LOG`.

use tracing_subscriber::EnvFilter;

/// Output format of the logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Plain,
    /// One JSON object per line (for log shippers).
    Json,
}

// Log flags shared by every binary. (A plain comment: a doc comment here would become the `about`
// line of every binary's --help in place of its own.)
#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// Log format.
    #[arg(long, env = "KJOB_LOG_FORMAT", value_enum, default_value = "plain")]
    pub log_format: LogFormat,
    /// Log filter when RUST_LOG is unset (tracing-subscriber EnvFilter syntax).
    #[arg(long, env = "KJOB_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
}

/// Installs the global subscriber: `RUST_LOG` wins over `--log-level`. Logs go to stderr so
/// stdout stays free for machine-readable output (e.g. kjob-sim prints its URL there).
pub fn init_logging(args: &LogArgs) -> anyhow::Result<()> {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&args.log_level))
        .map_err(|e| anyhow::anyhow!("invalid log filter {:?}: {e}", args.log_level))?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let res = match args.log_format {
        LogFormat::Plain => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(true).try_init(),
    };
    res.map_err(|e| anyhow::anyhow!("installing the log subscriber: {e}"))
}
