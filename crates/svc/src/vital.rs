//! Supervision of a service's vital tasks: the service runs only while every one of them runs.
//!
//! A vital task that ends before shutdown was asked for (returns, fails or panics) is logged
//! with its name, marks the service not ready, and cancels the shutdown token so the others
//! drain; [`Vital::run`] then returns an error naming it, so `main` exits with a non-zero status.
//! After shutdown was asked for, tasks are expected to end and [`Vital::run`] waits for all.

use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};

use crate::{AdminState, Shutdown};

/// How a vital task ended early.
#[derive(Debug, thiserror::Error)]
#[error("vital task {task:?} {reason}")]
pub struct VitalTaskError {
    /// The task's name, as given to [`Vital::task`] or [`Vital::guard`].
    pub task: &'static str,
    /// What happened: "ended before shutdown", "failed: …" or "panicked: …".
    pub reason: String,
}

type Ended = Result<anyhow::Result<()>, String>;

/// What a vital task is: a future that ends with `Ok` (or an error saying why it failed).
pub trait VitalFuture<'a>: Future<Output = anyhow::Result<()>> + Send + 'a {}

impl<'a, F: Future<Output = anyhow::Result<()>> + Send + 'a> VitalFuture<'a> for F {}

/// A set of vital tasks run together in the caller's task (they may borrow from it).
pub struct Vital<'a> {
    shutdown: Shutdown,
    readiness: Option<AdminState>,
    tasks: FuturesUnordered<BoxFuture<'a, (&'static str, Ended)>>,
    guards: FuturesUnordered<BoxFuture<'a, (&'static str, Ended)>>,
}

fn supervised<'a>(
    name: &'static str,
    fut: impl VitalFuture<'a>,
) -> BoxFuture<'a, (&'static str, Ended)> {
    async move {
        let ended = AssertUnwindSafe(fut).catch_unwind().await.map_err(panic_message);
        (name, ended)
    }
    .boxed()
}

/// A panic's message, when it has one.
fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

/// A spawned vital task, aborted when its supervision is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<anyhow::Result<()>>);

impl Future for AbortOnDrop {
    type Output = Result<anyhow::Result<()>, tokio::task::JoinError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<'a> Vital<'a> {
    /// An empty set; an early end cancels `shutdown`.
    pub fn new(shutdown: &Shutdown) -> Self {
        Self {
            shutdown: shutdown.clone(),
            readiness: None,
            tasks: FuturesUnordered::new(),
            guards: FuturesUnordered::new(),
        }
    }

    /// Marks `state` not ready as soon as a vital task ends early.
    pub fn readiness(mut self, state: &AdminState) -> Self {
        self.readiness = Some(state.clone());
        self
    }

    /// Adds a task that must run until shutdown, and then end; [`Vital::run`] waits for it.
    pub fn task(&mut self, name: &'static str, fut: impl VitalFuture<'a>) -> &mut Self {
        self.tasks.push(supervised(name, fut));
        self
    }

    /// Like [`Vital::task`], but `fut` runs as a tokio task of its own (on the runtime's worker
    /// threads), so it is scheduled independently of every other vital task: one that keeps
    /// its poller busy, or a stall in the future that drives them all, cannot hold it up.
    /// Aborted if [`Vital::run`] is dropped before it ends.
    pub fn spawn(
        &mut self,
        name: &'static str,
        fut: impl Future<Output = anyhow::Result<()>> + Send + 'static,
    ) -> &mut Self {
        let handle = AbortOnDrop(tokio::spawn(fut));
        self.tasks.push(
            async move {
                let ended = match handle.await {
                    Ok(r) => Ok(r),
                    Err(e) if e.is_panic() => Err(panic_message(e.into_panic())),
                    Err(e) => Err(format!("was cancelled: {e}")),
                };
                (name, ended)
            }
            .boxed(),
        );
        self
    }

    /// Adds a task that must outlive the others (e.g. the admin server, which answers probes
    /// through the drain): its end at any time is a failure, and [`Vital::run`] does not wait
    /// for it (the guard future is dropped; the caller stops what it watches afterwards).
    pub fn guard(&mut self, name: &'static str, fut: impl VitalFuture<'a>) -> &mut Self {
        self.guards.push(supervised(name, fut));
        self
    }

    /// Runs every task until all [`Vital::task`]s have ended; the first early end is the error.
    pub async fn run(self) -> Result<(), VitalTaskError> {
        let Vital { shutdown, readiness, mut tasks, mut guards } = self;
        let mut first: Option<VitalTaskError> = None;
        loop {
            let (name, ended, is_guard) = tokio::select! {
                next = tasks.next() => match next {
                    Some((name, ended)) => (name, ended, false),
                    None => break,
                },
                Some((name, ended)) = guards.next(), if !guards.is_empty() => (name, ended, true),
            };
            let reason = match ended {
                Ok(Ok(())) if !is_guard && shutdown.is_cancelled() => {
                    tracing::debug!(task = name, "task stopped");
                    continue;
                }
                Ok(Ok(())) => "ended before shutdown".to_string(),
                Ok(Err(e)) => format!("failed: {e:#}"),
                Err(panic) => format!("panicked: {panic}"),
            };
            tracing::error!(task = name, %reason, "vital task ended; stopping the service");
            if let Some(r) = &readiness {
                r.set_ready(false);
            }
            shutdown.cancel();
            first.get_or_insert(VitalTaskError { task: name, reason });
        }
        first.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prometheus_client::registry::Registry;

    use super::*;

    /// A well-behaved vital task: runs until shutdown, then ends.
    fn until_shutdown(shutdown: &Shutdown) -> impl VitalFuture<'static> + use<> {
        let s = shutdown.clone();
        async move {
            s.cancelled().await;
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn all_tasks_end_after_shutdown() {
        let shutdown = Shutdown::new();
        let mut v = Vital::new(&shutdown);
        for name in ["a", "b"] {
            v.task(name, until_shutdown(&shutdown));
        }
        v.guard("guard", std::future::pending());
        let stop = shutdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            stop.cancel();
        });
        v.run().await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn an_early_end_stops_the_others_and_names_the_task() {
        let shutdown = Shutdown::new();
        let state = AdminState::new(Registry::default());
        state.set_ready(true);
        let mut v = Vital::new(&shutdown).readiness(&state);
        v.task("drains", until_shutdown(&shutdown));
        v.task("server", async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok(())
        });
        let err = v.run().await.unwrap_err();
        assert_eq!(err.task, "server");
        assert_eq!(err.to_string(), "vital task \"server\" ended before shutdown");
        assert!(shutdown.is_cancelled() && !state.is_ready());
    }

    #[tokio::test(start_paused = true)]
    async fn failures_panics_and_guards_are_reported() {
        let shutdown = Shutdown::new();
        let mut v = Vital::new(&shutdown);
        v.task("fails", async { Err(anyhow::anyhow!("boom")) });
        let err = v.run().await.unwrap_err();
        assert_eq!(err.reason, "failed: boom");

        let shutdown = Shutdown::new();
        let mut v = Vital::new(&shutdown);
        v.task("panics", async { panic!("oops") });
        assert_eq!(v.run().await.unwrap_err().reason, "panicked: oops");

        let shutdown = Shutdown::new();
        let mut v = Vital::new(&shutdown);
        v.task("waits", until_shutdown(&shutdown));
        v.guard("admin", async { Ok(()) });
        let err = v.run().await.unwrap_err();
        assert_eq!((err.task, err.reason.as_str()), ("admin", "ended before shutdown"));
    }

    #[tokio::test(start_paused = true)]
    async fn spawned_tasks_are_supervised_alike() {
        let shutdown = Shutdown::new();
        let mut v = Vital::new(&shutdown);
        v.spawn("drains", until_shutdown(&shutdown));
        v.spawn("panics", async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            panic!("spawned oops")
        });
        let err = v.run().await.unwrap_err();
        assert_eq!((err.task, err.reason.as_str()), ("panics", "panicked: spawned oops"));
        assert!(shutdown.is_cancelled(), "the others were told to drain");

        let shutdown = Shutdown::new();
        let mut v = Vital::new(&shutdown);
        v.spawn("fails", async { Err(anyhow::anyhow!("boom")) });
        assert_eq!(v.run().await.unwrap_err().reason, "failed: boom");
    }

    #[tokio::test(start_paused = true)]
    async fn a_spawned_task_runs_while_the_supervising_future_is_not_polled() {
        let shutdown = Shutdown::new();
        let mut v = Vital::new(&shutdown);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let s = shutdown.clone();
        v.spawn("ticks", async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let _ = tx.send(());
            s.cancelled().await;
            Ok(())
        });
        // Nobody polls `run` yet: a spawned task makes progress all the same.
        tokio::time::timeout(Duration::from_secs(5), rx).await.unwrap().unwrap();
        // Dropping the supervision aborts what it spawned.
        let (done_tx, mut done_rx) = tokio::sync::oneshot::channel::<()>();
        v.spawn("held", async move {
            let _keep = done_tx;
            std::future::pending::<()>().await;
            Ok(())
        });
        drop(v);
        tokio::task::yield_now().await;
        assert!(
            matches!(done_rx.try_recv(), Err(tokio::sync::oneshot::error::TryRecvError::Closed)),
            "the aborted task dropped its state"
        );
    }
}
