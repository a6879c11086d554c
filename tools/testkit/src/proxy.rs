//! A fault-injecting HTTP proxy in front of kube-apiserver: what kjob-sim's `/sim/faults` and
//! `/sim/close-watches` hooks do, for the real server. It listens on plain HTTP on
//! `127.0.0.1:0`, forwards every request over TLS (the cluster CA) to the apiserver with the
//! client's own headers (its bearer token, so RBAC and the audit log see the same user),
//! streams every answer (watches included), and injects [`ApiFaults`] and cut watches on
//! command. The services run on kubeconfigs written by [`FaultProxy::write_kubeconfig`] and
//! never know a proxy is there.
//!
//! It runs on a runtime of its own thread, so a test blocking its own runtime (a `Stack` call,
//! a sleep in a drop) never stalls the API traffic of the services it tests.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;

use crate::faults::{ApiFaults, Decision, PPM, classify, decide, status_body};

/// How long connecting to the apiserver may take (loopback: anything longer is a dead server).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest request body forwarded (kube-apiserver's own limit is 3 MiB per object).
const MAX_REQUEST_BODY: usize = 16 << 20;
/// How long reading a request body from a client may take.
const REQUEST_BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// Counters of what the proxy did, for tests that check a fault really happened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Requests forwarded to the apiserver.
    pub forwarded: u64,
    /// Requests answered with an injected error.
    pub refused: u64,
    /// Watch streams ended by [`FaultProxy::close_watches`].
    pub watches_cut: u64,
}

#[derive(Debug, Default)]
struct Counters {
    forwarded: AtomicU64,
    refused: AtomicU64,
    watches_cut: AtomicU64,
    /// Forwarded requests by the client's User-Agent product (`kjob-worker`, …).
    by_agent: Mutex<std::collections::HashMap<String, u64>>,
}

#[derive(Debug)]
struct Shared {
    faults: Mutex<ApiFaults>,
    // Bumped by close_watches; every open watch stream ends when it changes.
    cut: tokio::sync::watch::Sender<u64>,
    counters: Counters,
    upstream: String,
    client: reqwest::Client,
}

/// The running proxy. Dropping it stops it (open connections are dropped).
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
}

/// Server URL and CA file of `kubeconfig`'s current context.
fn upstream_of(kubeconfig: &Path) -> anyhow::Result<(String, PathBuf)> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let ctx_name = kc.current_context.clone().context("kubeconfig has no current-context")?;
    let ctx = kc
        .contexts
        .iter()
        .find(|c| c.name == ctx_name)
        .and_then(|c| c.context.as_ref())
        .context("current context not found")?;
    let cluster = kc
        .clusters
        .iter()
        .find(|c| c.name == ctx.cluster)
        .and_then(|c| c.cluster.as_ref())
        .context("context's cluster not found")?;
    let server = cluster.server.clone().context("cluster has no server")?;
    let ca = cluster
        .certificate_authority
        .clone()
        .context("cluster has no certificate-authority file (the proxy needs its CA)")?;
    Ok((server.trim_end_matches('/').to_string(), PathBuf::from(ca)))
}

impl FaultProxy {
    /// Starts a proxy to the apiserver of `kubeconfig` (its server URL and CA file; the
    /// credentials stay with each client).
    pub fn start(kubeconfig: &Path) -> anyhow::Result<Self> {
        let (upstream, ca) = upstream_of(kubeconfig)?;
        let pem = std::fs::read(&ca).with_context(|| format!("reading {}", ca.display()))?;
        let client = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&pem)?)
            .tls_built_in_root_certs(false)
            .no_proxy()
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .context("building the proxy's HTTPS client")?;
        let (cut, _) = tokio::sync::watch::channel(0u64);
        let shared = Arc::new(Shared {
            faults: Mutex::new(ApiFaults::none()),
            cut,
            counters: Counters::default(),
            upstream,
            client,
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("kjob-fault-proxy")
            .enable_all()
            .build()?;
        let accept_shared = shared.clone();
        runtime.spawn(async move {
            let listener = match tokio::net::TcpListener::from_std(listener) {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!(error = %e, "fault proxy cannot listen");
                    return;
                }
            };
            accept_loop(listener, accept_shared).await;
        });
        Ok(Self { addr, shared, runtime: Some(runtime) })
    }

    /// Its URL (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Replaces the injected faults.
    pub fn set_faults(&self, faults: ApiFaults) {
        *self.shared.faults.lock() = faults;
    }

    /// The injected faults.
    pub fn faults(&self) -> ApiFaults {
        self.shared.faults.lock().clone()
    }

    /// Ends every open watch stream (clients see the stream end and watch again).
    pub fn close_watches(&self) {
        self.shared.cut.send_modify(|n| *n += 1);
    }

    /// What it did so far.
    pub fn stats(&self) -> ProxyStats {
        let c = &self.shared.counters;
        ProxyStats {
            forwarded: c.forwarded.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            watches_cut: c.watches_cut.load(Ordering::Relaxed),
        }
    }

    /// Requests forwarded to the apiserver from clients whose User-Agent product is `agent`
    /// (`kjob-worker` for `kjob-worker/0.1.0`): what the apiserver received from them.
    pub fn forwarded_from(&self, agent: &str) -> u64 {
        self.shared.counters.by_agent.lock().get(agent).copied().unwrap_or(0)
    }

    /// Writes to `to` the kubeconfig `from` with its server replaced by the proxy (same user
    /// and token, no CA: the proxy speaks plain HTTP on loopback).
    pub fn write_kubeconfig(&self, from: &Path, to: &Path) -> anyhow::Result<()> {
        let mut kc = kube::config::Kubeconfig::read_from(from)
            .with_context(|| format!("reading {}", from.display()))?;
        for c in &mut kc.clusters {
            if let Some(cluster) = c.cluster.as_mut() {
                cluster.server = Some(self.url());
                cluster.certificate_authority = None;
                cluster.certificate_authority_data = None;
            }
        }
        std::fs::write(to, serde_json::to_string_pretty(&kc)?)
            .with_context(|| format!("writing {}", to.display()))
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Not a blocking shutdown: the proxy is often dropped inside a test's runtime.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

async fn accept_loop(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // Out of file descriptors and the like: wait instead of spinning.
                tracing::warn!(error = %e, "fault proxy accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(shared.clone(), req));
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "fault proxy connection ended");
            }
        });
    }
}

type ProxyBody = BoxBody<Bytes, std::io::Error>;

fn full(code: u16, body: serde_json::Value, retry_after: Option<u64>) -> Response<ProxyBody> {
    let bytes = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
    let mut resp = Response::new(Full::new(bytes).map_err(|never| match never {}).boxed());
    *resp.status_mut() = http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::BAD_GATEWAY);
    let headers = resp.headers_mut();
    headers.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    if let Some(s) = retry_after {
        headers.insert(http::header::RETRY_AFTER, http::HeaderValue::from(s));
    }
    resp
}

// Headers of one connection, not of the request (RFC 9110 §7.6.1); hyper and reqwest set their
// own framing.
fn hop_by_hop(name: &http::HeaderName) -> bool {
    use http::header::*;
    [CONNECTION, TE, TRAILER, TRANSFER_ENCODING, UPGRADE, PROXY_AUTHORIZATION, HOST, CONTENT_LENGTH]
        .contains(name)
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
}

fn bad_gateway(message: String) -> Response<ProxyBody> {
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": "ServiceUnavailable", "code": 502,
    });
    full(502, body, None)
}

async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let (parts, body) = req.into_parts();
    let path_and_query = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    let class = classify(parts.method.as_str(), parts.uri.path(), parts.uri.query().unwrap_or(""));
    if let Some(class) = &class {
        let faults = shared.faults.lock().clone();
        match decide(&faults, class, rand::random_range(0..PPM)) {
            Decision::Refuse(code) => {
                shared.counters.refused.fetch_add(1, Ordering::Relaxed);
                let (body, retry) = status_body(code);
                return Ok(full(code, body, retry));
            }
            Decision::Forward(latency) if !latency.is_zero() => tokio::time::sleep(latency).await,
            Decision::Forward(_) => {}
        }
    }
    let body = match tokio::time::timeout(
        REQUEST_BODY_TIMEOUT,
        http_body_util::Limited::new(body, MAX_REQUEST_BODY).collect(),
    )
    .await
    {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(e)) => return Ok(bad_gateway(format!("reading the request body: {e}"))),
        Err(_) => return Ok(bad_gateway("timed out reading the request body".into())),
    };
    let watch = class.as_ref().is_some_and(|c| c.is_watch());
    // Subscribed before forwarding, so a cut during the request's flight still ends it.
    let mut cut = shared.cut.subscribe();
    cut.mark_unchanged();
    let mut upstream_req =
        shared.client.request(parts.method.clone(), format!("{}{path_and_query}", shared.upstream));
    for (name, value) in &parts.headers {
        if !hop_by_hop(name) {
            upstream_req = upstream_req.header(name, value);
        }
    }
    let upstream = match upstream_req.body(body).send().await {
        Ok(r) => r,
        Err(e) => return Ok(bad_gateway(format!("forwarding to the apiserver: {e}"))),
    };
    shared.counters.forwarded.fetch_add(1, Ordering::Relaxed);
    *shared
        .counters
        .by_agent
        .lock()
        .entry(kjob_sim::hooks::agent_of(&parts.headers))
        .or_default() += 1;
    let mut resp = Response::builder().status(upstream.status());
    for (name, value) in upstream.headers() {
        if !hop_by_hop(name) {
            resp = resp.header(name, value);
        }
    }
    let stream = upstream.bytes_stream().map_err(std::io::Error::other);
    let body: ProxyBody = if watch {
        let counters = shared.clone();
        let ended = async move {
            if cut.changed().await.is_ok() {
                counters.counters.watches_cut.fetch_add(1, Ordering::Relaxed);
            }
        };
        BodyExt::boxed(StreamBody::new(stream.take_until(ended).map_ok(Frame::data)))
    } else {
        BodyExt::boxed(StreamBody::new(stream.map_ok(Frame::data)))
    };
    Ok(resp.body(body).unwrap_or_else(|e| bad_gateway(format!("building the answer: {e}"))))
}
