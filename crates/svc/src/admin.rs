//! The admin port: `/metrics` (Prometheus text), `/livez`, `/readyz`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::Shutdown;

/// Admin flags shared by every binary.
#[derive(Debug, Clone, clap::Args)]
pub struct AdminArgs {
    /// Address of the admin HTTP server (/metrics, /livez, /readyz).
    #[arg(long, env = "KJOB_ADMIN_LISTEN", default_value = "0.0.0.0:9090")]
    pub admin_listen: SocketAddr,
}

/// What the admin port serves: a metrics registry and a readiness flag the service sets.
#[derive(Clone)]
pub struct AdminState {
    registry: Arc<Registry>,
    ready: Arc<AtomicBool>,
}

impl AdminState {
    /// Wraps a finished registry; the service starts not ready.
    pub fn new(registry: Registry) -> Self {
        Self { registry: Arc::new(registry), ready: Arc::new(AtomicBool::new(false)) }
    }

    /// Marks the service ready (or not) for `/readyz`.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// Whether `/readyz` currently answers 200.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
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
}
