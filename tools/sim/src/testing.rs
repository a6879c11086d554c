//! An in-process simulator for tests of this and other crates.
//!
//! ```no_run
//! # async fn demo() {
//! let sim = kjob_sim::testing::TestSim::start(Default::default()).await;
//! let client = sim.client();
//! # let _ = client;
//! # }
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::{App, SimConfig};

/// A simulator serving on 127.0.0.1 (a free port) inside the test's runtime. Dropping it shuts
/// the server down.
pub struct TestSim {
    url: String,
    app: Arc<App>,
    shutdown: CancellationToken,
    kubeconfig: PathBuf,
    // Keeps the kubeconfig's directory alive as long as the simulator.
    _dir: tempfile::TempDir,
}

impl TestSim {
    /// Starts a simulator; panics when it cannot (tests want a loud failure).
    pub async fn start(config: SimConfig) -> TestSim {
        Self::try_start(config).await.expect("starting kjob-sim")
    }

    /// Starts a simulator.
    pub async fn try_start(config: SimConfig) -> anyhow::Result<TestSim> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let shutdown = CancellationToken::new();
        let app = crate::start_app(config, shutdown.clone())?;
        let dir = tempfile::tempdir()?;
        let kubeconfig = dir.path().join("kubeconfig");
        crate::kubeconfig::write(&kubeconfig, &url)?;
        crate::start_kubelet(&app, &url)?;
        let serve_app = app.clone();
        let token = shutdown.clone();
        tokio::spawn(async move {
            if let Err(e) = crate::serve(listener, serve_app, token).await {
                tracing::error!(error = %e, "kjob-sim server failed");
            }
        });
        Ok(TestSim { url, app, shutdown, kubeconfig, _dir: dir })
    }

    /// Base URL, e.g. `http://127.0.0.1:40123`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Path of a kubeconfig pointing at this simulator (namespace `default`).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// A kube client for this simulator (default namespace `default`).
    pub fn client(&self) -> kube::Client {
        let uri = self.url.parse().expect("simulator URL is a valid URI");
        let config = kube::Config::new(uri);
        kube::Client::try_from(config).expect("building a kube client")
    }

    /// The instance state (store, hooks, metrics) for assertions.
    pub fn app(&self) -> &Arc<App> {
        &self.app
    }

    /// Drops the watch history: watches from older revisions get a 410 ERROR.
    pub fn compact(&self) {
        self.app.store.compact();
    }

    /// Ends every open watch stream.
    pub fn close_watches(&self) {
        self.app.close_watches();
    }

    /// Pauses the simulated kubelet (no-op when it is off).
    pub fn pause_kubelet(&self) {
        if let Some(k) = self.app.kubelet.lock().as_ref() {
            k.pause();
        }
    }

    /// Resumes the simulated kubelet (no-op when it is off).
    pub fn resume_kubelet(&self) {
        if let Some(k) = self.app.kubelet.lock().as_ref() {
            k.resume();
        }
    }
}

impl Drop for TestSim {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The string `field` of every element of the array `list`, for assertions; panics when `list`
/// is not an array or an element has no such string.
pub fn field_of_each<'a>(list: &'a serde_json::Value, field: &str) -> Vec<&'a str> {
    let items = list.as_array().unwrap_or_else(|| panic!("not an array: {list}"));
    items
        .iter()
        .map(|item| item[field].as_str().unwrap_or_else(|| panic!("no string {field}: {item}")))
        .collect()
}
