//! What every kjob binary's `main` does, written once: parse the flags (the log flags are added
//! to every binary's own here), install logging, run the body on a multi-threaded tokio
//! runtime; and binding a listener with an error that says which one failed.

use std::ffi::OsString;
use std::future::Future;
use std::net::SocketAddr;

use anyhow::Context;
use clap::{Args as _, FromArgMatches as _};
use tokio::net::TcpListener;

use crate::LogArgs;

/// Binds `addr` for `what` ("the admin port", "the gRPC port"), naming both in the error.
pub async fn bind(addr: SocketAddr, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.with_context(|| format!("binding {what} {addr}"))
}

/// Parses `argv` as the flags of `A` plus the log flags ([`LogArgs`]) every binary takes.
pub fn try_parse_from<A, I, T>(argv: I) -> Result<(LogArgs, A), clap::Error>
where
    A: clap::Parser,
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let matches = LogArgs::augment_args(A::command()).try_get_matches_from(argv)?;
    Ok((LogArgs::from_arg_matches(&matches)?, A::from_arg_matches(&matches)?))
}

/// The `main` of a kjob binary: parses `A` and the log flags (help, version and bad flags exit
/// as clap makes them), installs logging ([`crate::init_logging`]) and runs `body` on a
/// multi-threaded tokio runtime.
///
/// The body runs as a spawned task on the runtime's worker threads, not in `block_on` on the
/// main thread: a future polled by `block_on` is woken from the worker that drives the sockets
/// by a cross-thread unpark, so a service loop there (the watcher's event loop, fed by every
/// watch event) paid a context switch per event, and every task it woke was handed back across
/// threads again.
pub fn main<A, F, Fut>(body: F) -> anyhow::Result<()>
where
    A: clap::Parser,
    F: FnOnce(A) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let (log, args) = try_parse_from::<A, _, _>(std::env::args_os()).unwrap_or_else(|e| e.exit());
    crate::init_logging(&log)?;
    run_on_workers(body(args))
}

/// Runs `body` to its end as a task on the worker threads of a new multi-threaded runtime (see
/// [`main`]); a panic in it is an error.
pub fn run_on_workers<Fut>(body: Fut) -> anyhow::Result<()>
where
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let task = rt.spawn(body);
    rt.block_on(task).context("the service's main task panicked")?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LogFormat;

    /// A binary's own flags.
    #[derive(Debug, clap::Parser)]
    #[command(name = "kjob-test")]
    struct Flags {
        /// A flag of its own.
        #[arg(long, default_value_t = 1)]
        n: u32,
    }

    #[test]
    fn the_body_runs_on_a_worker_thread_and_a_panic_is_an_error() {
        let main_thread = std::thread::current().id();
        let on = std::sync::Arc::new(std::sync::Mutex::new(None));
        let seen = on.clone();
        run_on_workers(async move {
            *seen.lock().unwrap() = Some(std::thread::current().id());
            Ok(())
        })
        .unwrap();
        let ran_on = on.lock().unwrap().expect("the body ran");
        assert_ne!(ran_on, main_thread, "the body ran in block_on on the calling thread");
        let err = run_on_workers(async { panic!("boom") }).unwrap_err();
        assert!(format!("{err:#}").contains("panicked"), "{err:#}");
        let err = run_on_workers(async { anyhow::bail!("refused") }).unwrap_err();
        assert_eq!(format!("{err}"), "refused");
    }

    #[test]
    fn every_binary_takes_the_log_flags() {
        let (log, flags): (LogArgs, Flags) =
            try_parse_from(["kjob-test", "--n", "3", "--log-format", "json"]).unwrap();
        assert_eq!((flags.n, log.log_format, log.log_level.as_str()), (3, LogFormat::Json, "info"));
        let (log, flags): (LogArgs, Flags) = try_parse_from(["kjob-test"]).unwrap();
        assert_eq!((flags.n, log.log_format), (1, LogFormat::Plain));
        assert!(try_parse_from::<Flags, _, _>(["kjob-test", "--log-format", "xml"]).is_err());
        assert!(try_parse_from::<Flags, _, _>(["kjob-test", "--nope"]).is_err());
    }

    #[tokio::test]
    async fn bind_names_what_failed() {
        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap();
        let err = bind(addr, "the admin port").await.unwrap_err();
        assert!(err.to_string().starts_with(&format!("binding the admin port {addr}")), "{err}");
        let free = bind("127.0.0.1:0".parse().unwrap(), "the gRPC port").await.unwrap();
        assert_ne!(free.local_addr().unwrap().port(), 0);
    }
}
