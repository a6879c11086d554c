//! kjob-sim: a simulated Kubernetes API server and kubelet for tests, demos and benchmarks
//!
//! [`run`] serves the API on a listener until shutdown; [`testing::TestSim`] runs one
//! in-process for tests. Behaviour follows `apiserver-semantics.md` of the shared reference.
pub mod admission;
pub mod kubelet;
pub mod patch;
pub mod selector;

pub mod admit;
pub mod discovery;
pub mod error;
pub mod gc;
pub mod hooks;
pub mod image;
pub mod kubeconfig;
pub mod ownership;
pub mod registry;
pub mod resources;
pub mod server;
pub mod store;
pub mod subresources;
pub mod table;
pub mod testing;
pub mod watch;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::response::Response;
use jiff::Timestamp;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use server::App;

/// Whether the simulated kubelet runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum KubeletMode {
    /// Drive pods through their lifecycle.
    Auto,
    /// No kubelet: tests write pod status themselves.
    #[default]
    Off,
}

/// Settings of one simulator instance.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Whether to run the simulated kubelet.
    pub kubelet: KubeletMode,
    /// Latency added before every write.
    pub write_latency: Duration,
    /// Latency added before every read.
    pub read_latency: Duration,
    /// Period of watch bookmarks.
    pub bookmark_interval: Duration,
    /// Watch events kept for watches resuming from an older revision.
    pub history_window: usize,
    /// Settings of the simulated kubelet (used with [`KubeletMode::Auto`]).
    pub kubelet_settings: kubelet::KubeletConfig,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            kubelet: KubeletMode::Off,
            write_latency: Duration::ZERO,
            read_latency: Duration::ZERO,
            bookmark_interval: Duration::from_secs(60),
            history_window: 10_000,
            kubelet_settings: kubelet::KubeletConfig::default(),
        }
    }
}

/// Pause/resume control of a running kubelet, for the `/sim/kubelet/*` hooks.
pub struct KubeletControl {
    pause: Box<dyn Fn() + Send + Sync>,
    resume: Box<dyn Fn() + Send + Sync>,
}

impl KubeletControl {
    /// Wraps the pause and resume actions of a kubelet.
    pub fn new(
        pause: impl Fn() + Send + Sync + 'static,
        resume: impl Fn() + Send + Sync + 'static,
    ) -> Self {
        Self { pause: Box::new(pause), resume: Box::new(resume) }
    }

    /// Stops advancing pods.
    pub fn pause(&self) {
        (self.pause)();
    }

    /// Resumes advancing pods.
    pub fn resume(&self) {
        (self.resume)();
    }
}

/// Namespaces every cluster starts with.
pub const BOOTSTRAP_NAMESPACES: [&str; 4] =
    ["default", "kube-system", "kube-public", "kube-node-lease"];

/// The HTTP router of an instance (the whole API, hooks and metrics on one port).
pub fn router(app: Arc<App>) -> Router {
    async fn entry(State(app): State<Arc<App>>, req: Request) -> Response {
        server::handle(app, req).await
    }
    Router::new().fallback(entry).with_state(app)
}

/// Builds an instance: state, bootstrap namespaces, and the GC task.
pub fn start_app(config: SimConfig, shutdown: CancellationToken) -> anyhow::Result<Arc<App>> {
    let app = Arc::new(App::new(config, shutdown.clone()));
    let ns_res = resources::StoreKind::Namespace.resource();
    for ns in BOOTSTRAP_NAMESPACES {
        registry::create(
            &app.store,
            ns_res,
            None,
            json!({"metadata": {"name": ns}}),
            &Default::default(),
            Timestamp::now(),
        )
        .map_err(|e| anyhow::anyhow!("bootstrapping namespace {ns}: {e}"))?;
    }
    let pc_res = resources::StoreKind::PriorityClass.resource();
    for (name, value, description) in admit::SYSTEM_PRIORITY_CLASSES {
        registry::create(
            &app.store,
            pc_res,
            None,
            json!({"metadata": {"name": name}, "value": value, "description": description}),
            &Default::default(),
            Timestamp::now(),
        )
        .map_err(|e| anyhow::anyhow!("bootstrapping PriorityClass {name}: {e}"))?;
    }
    tokio::spawn(gc::run(app.store.clone(), shutdown.child_token()));
    Ok(app)
}

/// Starts the simulated kubelet against the server at `url` when the config asks for it.
pub fn start_kubelet(app: &App, url: &str) -> Result<(), kubelet::KubeletError> {
    if app.config.kubelet != KubeletMode::Auto {
        return Ok(());
    }
    let handle = Arc::new(kubelet::spawn(
        url.to_owned(),
        app.config.kubelet_settings.clone(),
        app.shutdown.child_token(),
    )?);
    let (p, r) = (handle.clone(), handle);
    *app.kubelet.lock() = Some(KubeletControl::new(move || p.pause(), move || r.resume()));
    Ok(())
}

/// The URL clients use for a listener (a wildcard address is reached through loopback).
pub fn url_for(addr: std::net::SocketAddr) -> String {
    if addr.ip().is_unspecified() {
        format!("http://127.0.0.1:{}", addr.port())
    } else {
        format!("http://{addr}")
    }
}

/// Serves the simulator on `listener` until `shutdown` is cancelled.
pub async fn run(
    listener: TcpListener,
    config: SimConfig,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let app = start_app(config, shutdown.clone())?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "kjob-sim serving");
    start_kubelet(&app, &url_for(addr))?;
    serve(listener, app, shutdown).await
}

/// Serves an already built instance on `listener` until `shutdown` is cancelled.
pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let done = shutdown.clone();
    axum::serve(listener, router(app))
        .with_graceful_shutdown(async move { done.cancelled().await })
        .await?;
    Ok(())
}
