//! What every kjob binary's `main` does, written once: parse the flags (the log and runtime flags
//! are added to every binary's own here), install logging, run the body on a multi-threaded tokio
//! runtime of the chosen size; and binding a listener with an error that says which one failed.

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

// The size of a binary's tokio runtime: the `--runtime-threads` flag every binary takes. (A plain
// comment, as on `LogArgs`: a doc comment would replace each binary's own --help description.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
pub struct RuntimeArgs {
    /// Worker threads of the async runtime; 0 = one per CPU the process may use (tokio's
    /// default, which follows a container's CPU limit). Unset: 1 for kjob-queue, kjob-watcher
    /// and kjob-worker (they scale out by replicas, and one thread spares the cross-thread
    /// wake-ups), 0 for the other binaries.
    #[arg(long, env = "KJOB_RUNTIME_THREADS")]
    pub runtime_threads: Option<usize>,
}

/// A binary's runtime size when `--runtime-threads` is not given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// One worker thread: the services, which scale out by replicas.
    One,
    /// One per CPU the process may use: tools and simulators that serve many clients at once.
    PerCpu,
}

impl RuntimeArgs {
    /// Worker threads to start; `None` leaves it to tokio (one per usable CPU).
    pub fn worker_threads(&self, default: Threads) -> Option<usize> {
        match (self.runtime_threads, default) {
            (Some(0), _) | (None, Threads::PerCpu) => None,
            (Some(n), _) => Some(n),
            (None, Threads::One) => Some(1),
        }
    }
}

/// Parses `argv` as the flags of `A` plus the log and runtime flags ([`LogArgs`],
/// [`RuntimeArgs`]) every binary takes.
pub fn try_parse_from<A, I, T>(argv: I) -> Result<(LogArgs, RuntimeArgs, A), clap::Error>
where
    A: clap::Parser,
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let matches = command::<A>().try_get_matches_from(argv)?;
    Ok((
        LogArgs::from_arg_matches(&matches)?,
        RuntimeArgs::from_arg_matches(&matches)?,
        A::from_arg_matches(&matches)?,
    ))
}

/// The command line of `A` with the flags every binary takes added.
fn command<A: clap::Parser>() -> clap::Command {
    RuntimeArgs::augment_args(LogArgs::augment_args(A::command()))
}

/// The `main` of a kjob binary: parses `A` and the log and runtime flags (help, version and bad
/// flags exit as clap makes them), installs logging ([`crate::init_logging`]) and runs `body` on
/// a multi-threaded tokio runtime of `--runtime-threads` worker threads (`default` when unset).
///
/// The body runs as a spawned task on the runtime's worker threads, not in `block_on` on the
/// main thread: a future polled by `block_on` is woken from the worker that drives the sockets
/// by a cross-thread unpark, so a service loop there (the watcher's event loop, fed by every
/// watch event) paid a context switch per event, and every task it woke was handed back across
/// threads again.
pub fn main<A, F, Fut>(default: Threads, body: F) -> anyhow::Result<()>
where
    A: clap::Parser,
    F: FnOnce(A) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let (log, runtime, args) =
        try_parse_from::<A, _, _>(std::env::args_os()).unwrap_or_else(|e| e.exit());
    crate::init_logging(&log)?;
    run_on_workers(runtime.worker_threads(default), body(args))
}

/// Runs `body` to its end as a task on the worker threads of a new multi-threaded runtime (see
/// [`main`]) with `threads` of them (`None`: one per usable CPU); a panic in it is an error.
pub fn run_on_workers<T, Fut>(threads: Option<usize>, body: Fut) -> anyhow::Result<T>
where
    T: Send + 'static,
    Fut: Future<Output = anyhow::Result<T>> + Send + 'static,
{
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = threads {
        rt.worker_threads(n);
    }
    let rt = rt.enable_all().build().context("starting the tokio runtime")?;
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
        run_on_workers(Some(1), async move {
            *seen.lock().unwrap() = Some(std::thread::current().id());
            Ok(())
        })
        .unwrap();
        let ran_on = on.lock().unwrap().expect("the body ran");
        assert_ne!(ran_on, main_thread, "the body ran in block_on on the calling thread");
        let err = run_on_workers::<(), _>(None, async { panic!("boom") }).unwrap_err();
        assert!(format!("{err:#}").contains("panicked"), "{err:#}");
        let err = run_on_workers::<(), _>(None, async { anyhow::bail!("refused") }).unwrap_err();
        assert_eq!(format!("{err}"), "refused");
    }

    #[test]
    fn the_runtime_has_the_threads_asked_for() {
        for (threads, want) in [(Some(1), 1), (Some(3), 3)] {
            let n = run_on_workers(threads, async {
                Ok(tokio::runtime::Handle::current().metrics().num_workers())
            })
            .unwrap();
            assert_eq!(n, want);
        }
    }

    #[test]
    fn the_help_describes_the_binary_not_the_shared_flags() {
        let about = command::<Flags>().get_about().map(ToString::to_string);
        assert_eq!(about.as_deref(), Some("A binary's own flags"));
    }

    #[test]
    fn runtime_threads_default_per_binary_and_zero_means_per_cpu() {
        let parse = |argv: &[&str]| try_parse_from::<Flags, _, _>(argv.iter().copied()).unwrap().1;
        let unset = parse(&["kjob-test"]);
        assert_eq!(unset.runtime_threads, None);
        assert_eq!(unset.worker_threads(Threads::One), Some(1));
        assert_eq!(unset.worker_threads(Threads::PerCpu), None);
        let four = parse(&["kjob-test", "--runtime-threads", "4"]);
        assert_eq!(four.worker_threads(Threads::One), Some(4));
        assert_eq!(four.worker_threads(Threads::PerCpu), Some(4));
        let zero = parse(&["kjob-test", "--runtime-threads=0"]);
        assert_eq!(zero.worker_threads(Threads::One), None);
        assert!(try_parse_from::<Flags, _, _>(["kjob-test", "--runtime-threads", "x"]).is_err());
    }

    #[test]
    fn every_binary_takes_the_log_flags() {
        let (log, _, flags): (LogArgs, RuntimeArgs, Flags) =
            try_parse_from(["kjob-test", "--n", "3", "--log-format", "json"]).unwrap();
        assert_eq!((flags.n, log.log_format, log.log_level.as_str()), (3, LogFormat::Json, "info"));
        let (log, _, flags): (LogArgs, RuntimeArgs, Flags) = try_parse_from(["kjob-test"]).unwrap();
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
