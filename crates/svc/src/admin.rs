//! The admin port: `/metrics` (Prometheus text), `/livez`, `/readyz`, and whatever routes a
//! service adds (kjob-queue's read-only explain API).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::Shutdown;

/// Admin flags shared by every binary.
#[derive(Debug, Clone, clap::Args)]
pub struct AdminArgs {
    /// Address of the admin HTTP server (/metrics, /livez, /readyz).
    #[arg(long, env = "KJOB_ADMIN_LISTEN", default_value = "0.0.0.0:9090")]
    pub admin_listen: SocketAddr,
}

impl AdminArgs {
    /// Binds the admin port.
    pub async fn bind(&self) -> anyhow::Result<TcpListener> {
        crate::bind(self.admin_listen, "the admin port").await
    }
}

/// What the admin port serves: a metrics registry and a readiness flag the service sets.
#[derive(Clone)]
pub struct AdminState {
    registry: Arc<Registry>,
    ready: Arc<watch::Sender<bool>>,
}

impl AdminState {
    /// Wraps a finished registry; the service starts not ready.
    pub fn new(registry: Registry) -> Self {
        Self { registry: Arc::new(registry), ready: Arc::new(watch::Sender::new(false)) }
    }

    /// Marks the service ready (or not) for `/readyz`.
    pub fn set_ready(&self, ready: bool) {
        self.ready.send_if_modified(|r| std::mem::replace(r, ready) != ready);
    }

    /// Whether `/readyz` currently answers 200.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Readiness as a watch, for what must follow it (e.g. gRPC health statuses): it changes
    /// only when readiness does.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.ready.subscribe()
    }

    /// Renders the registry in the OpenMetrics text format.
    pub fn render_metrics(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// The admin router, for services that want to serve it on a listener of their own.
pub fn admin_router(state: AdminState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Serves the admin router on `listener` until `shutdown` is cancelled.
pub async fn serve_admin(
    listener: TcpListener,
    state: AdminState,
    shutdown: Shutdown,
) -> std::io::Result<()> {
    axum::serve(listener, admin_router(state))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

/// The admin port of a service from start to the very end: it outlives the drain, so probes
/// and metrics answer until [`AdminServer::stop`].
pub struct AdminServer {
    state: AdminState,
    stop: Shutdown,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl AdminServer {
    /// Serves `registry` and readiness on `listener`; without one (in-process tests that do
    /// not look) only the state is kept.
    pub fn start(listener: Option<TcpListener>, registry: Registry) -> Self {
        Self::start_with(listener, registry, Router::new())
    }

    /// [`AdminServer::start`], serving the service's own `routes` beside the standard ones.
    pub fn start_with(listener: Option<TcpListener>, registry: Registry, routes: Router) -> Self {
        let state = AdminState::new(registry);
        let stop = Shutdown::new();
        let task = listener.map(|l| {
            let app = admin_router(state.clone()).merge(routes);
            let stop = stop.clone();
            tokio::spawn(async move {
                axum::serve(l, app)
                    .with_graceful_shutdown(async move { stop.cancelled().await })
                    .await
            })
        });
        Self { state, stop, task }
    }

    /// What the server serves (readiness and metrics).
    pub fn state(&self) -> &AdminState {
        &self.state
    }

    /// Resolves only when the server has stopped on its own, which it should never do before
    /// [`AdminServer::stop`]: supervise it with [`crate::Vital::guard`].
    pub async fn watch(&mut self) -> anyhow::Result<()> {
        let Some(task) = self.task.as_mut() else {
            return std::future::pending().await;
        };
        let ended = task.await;
        self.task = None;
        ended??;
        Ok(())
    }

    /// Marks the service not ready, stops serving and waits for the server to finish.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.state.set_ready(false);
        self.stop.cancel();
        if let Some(task) = self.task {
            task.await??;
        }
        Ok(())
    }
}

/// The sockets of a service that serves nothing but its admin port (the watcher, the worker),
/// bound by the caller (tests bind `127.0.0.1:0`).
#[derive(Debug)]
pub struct AdminListeners {
    /// The admin port (`/metrics`, `/livez`, `/readyz`); `None` serves none.
    pub admin: Option<TcpListener>,
}

/// The admin port's lifecycle around a service, written once: serves `registry` on `listener`
/// from before `body` starts until after it has ended (probes and metrics answer through the
/// drain), then stops it. The body's error is the one returned; a failed stop comes second.
pub async fn with_admin(
    listener: Option<TcpListener>,
    registry: Registry,
    body: impl AsyncFnOnce(&mut AdminServer) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    with_admin_routes(listener, registry, Router::new(), body).await
}

/// [`with_admin`], the admin port also serving the service's own `routes`.
pub async fn with_admin_routes(
    listener: Option<TcpListener>,
    registry: Registry,
    routes: Router,
    body: impl AsyncFnOnce(&mut AdminServer) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    if let Some(l) = &listener {
        tracing::info!(addr = %l.local_addr()?, "admin port listening");
    }
    let mut admin = AdminServer::start_with(listener, registry, routes);
    let served = body(&mut admin).await;
    let stopped = admin.stop().await.context("admin server");
    served?;
    stopped
}

/// Keeps readiness in step with `check`, evaluated every `period` until `stop` (which leaves
/// the service not ready); each change is logged with `probe` naming what is checked.
pub async fn probe_readiness<F, Fut>(
    state: &AdminState,
    probe: &'static str,
    period: Duration,
    stop: &Shutdown,
    mut check: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let mut was = None;
    loop {
        let ready = tokio::select! {
            ok = check() => ok,
            _ = stop.cancelled() => break,
        };
        if was != Some(ready) {
            if ready {
                tracing::info!(probe, "ready");
            } else {
                tracing::warn!(probe, "not ready");
            }
            state.set_ready(ready);
            was = Some(ready);
        }
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = stop.cancelled() => break,
        }
    }
    state.set_ready(false);
}

async fn metrics(State(state): State<AdminState>) -> impl IntoResponse {
    match state.render_metrics() {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
            body,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    if state.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    #[tokio::test]
    async fn serves_metrics_and_probes() {
        let mut registry = Registry::default();
        let c: Counter = Counter::default();
        registry.register("kjob_test_things", "Things", c.clone());
        c.inc();
        let state = AdminState::new(registry);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = Shutdown::new();
        let server = tokio::spawn(serve_admin(listener, state.clone(), shutdown.clone()));
        let base = format!("http://{addr}");
        let http = reqwest::Client::new();
        let get = |p: &str| http.get(format!("{base}{p}")).send();
        assert_eq!(get("/livez").await.unwrap().status(), 200);
        assert_eq!(get("/readyz").await.unwrap().status(), 503);
        state.set_ready(true);
        assert_eq!(get("/readyz").await.unwrap().status(), 200);
        let body = get("/metrics").await.unwrap().text().await.unwrap();
        assert!(body.contains("kjob_test_things_total 1"), "{body}");
        shutdown.cancel();
        server.await.unwrap().unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn readiness_follows_the_probe_and_ends_not_ready() {
        let server = AdminServer::start(None, Registry::default());
        let state = server.state().clone();
        let mut changes = state.subscribe();
        let stop = Shutdown::new();
        let answers = std::sync::Mutex::new(vec![false, true, true, false, true].into_iter());
        let probe = probe_readiness(&state, "test", Duration::from_secs(1), &stop, || {
            let next = answers.lock().unwrap().next();
            async move { next.unwrap_or(true) }
        });
        let watcher = async {
            let mut seen = Vec::new();
            while seen.len() < 3 && changes.changed().await.is_ok() {
                seen.push(*changes.borrow_and_update());
            }
            stop.cancel();
            changes.changed().await.unwrap();
            seen.push(*changes.borrow_and_update());
            seen
        };
        let ((), seen) = tokio::join!(probe, watcher);
        // Only changes are published (the first false is the start value), then stop: false.
        assert_eq!(seen, vec![true, false, true, false]);
        assert!(!state.is_ready());
        server.stop().await.unwrap();
    }

    #[tokio::test]
    async fn with_admin_serves_around_the_body_and_returns_its_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let readyz = format!("http://{addr}/readyz");
        let served = with_admin(Some(listener), Registry::default(), async |admin| {
            admin.state().set_ready(true);
            assert_eq!(reqwest::get(&readyz).await?.status(), 200);
            anyhow::bail!("the body failed")
        })
        .await;
        assert_eq!(served.unwrap_err().to_string(), "the body failed");
        assert!(reqwest::get(&readyz).await.is_err(), "stopped once the body ended");
        with_admin(None, Registry::default(), async |_| Ok(())).await.unwrap();
    }

    #[tokio::test]
    async fn admin_server_serves_until_stopped() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut server = AdminServer::start(Some(listener), Registry::default());
        server.state().set_ready(true);
        let watched = tokio::time::timeout(Duration::from_millis(200), server.watch()).await;
        assert!(watched.is_err(), "a healthy admin server does not end on its own");
        let resp = reqwest::get(format!("http://{addr}/readyz")).await.unwrap();
        assert_eq!(resp.status(), 200);
        let state = server.state().clone();
        server.stop().await.unwrap();
        assert!(!state.is_ready());
        assert!(reqwest::get(format!("http://{addr}/readyz")).await.is_err());
    }
}
