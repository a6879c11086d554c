//! Kube client flags: kubeconfig found the usual way (KUBECONFIG, ~/.kube/config, in-cluster),
//! and the client kjob's services talk to kube-apiserver with.

use std::time::Duration;

use kube::client::ConfigExt;
use tower::{BoxError, ServiceBuilder};

/// How often an idle HTTP/2 connection is pinged, and how long a ping may go unanswered before
/// the connection is dropped (client-go's `ReadIdleTimeout` and `PingTimeout`): a dead API
/// server is noticed within 45 s even by a quiet watch.
const H2_PING_INTERVAL: Duration = Duration::from_secs(30);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(15);
/// HTTP/2 flow-control windows (client-go's transport allows 4 MiB a stream too): one large
/// LIST or watch burst does not stall on window updates, nor starve the other streams.
const H2_STREAM_WINDOW: u32 = 4 << 20;
const H2_CONNECTION_WINDOW: u32 = 32 << 20;
/// Longest wait behind the request that goes alone (see [`FirstAlone`]).
const ALONE_WAIT: Duration = Duration::from_secs(5);

/// Kube client flags shared by the watcher and the worker.
#[derive(Debug, Clone, clap::Args)]
pub struct KubeClientArgs {
    /// Path to a kubeconfig; unset = KUBECONFIG, then ~/.kube/config, then in-cluster config.
    #[arg(long, env = "KJOB_KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Connect and write timeout of API requests, in seconds. Reads keep kube's default (longer
    /// than the server's watch timeout) so watches are not cut.
    #[arg(long, env = "KJOB_KUBE_TIMEOUT_SECONDS", default_value_t = 30)]
    pub kube_timeout_seconds: u64,
    /// Speak HTTP/1.1 to kube-apiserver even when it offers HTTP/2 (one connection per request
    /// in flight, as kube-rs's own client): for a proxy in between that mishandles HTTP/2.
    #[arg(long, env = "KJOB_KUBE_HTTP1_ONLY")]
    pub kube_http1_only: bool,
}

impl KubeClientArgs {
    /// The kube configuration [`KubeClientArgs::client`] builds its client from, for callers
    /// that adjust it first (e.g. switch kube's retry layer off).
    pub async fn config(&self) -> anyhow::Result<kube::Config> {
        let mut config = match &self.kubeconfig {
            Some(path) => {
                let kc = kube::config::Kubeconfig::read_from(path)?;
                kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
            }
            None => kube::Config::infer().await?,
        };
        let timeout = std::time::Duration::from_secs(self.kube_timeout_seconds);
        config.write_timeout = Some(timeout);
        config.connect_timeout = Some(timeout);
        Ok(config)
    }

    /// Builds a client from the flags (see [`client`]).
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        client(self.config().await?, self.kube_http1_only)
    }
}

/// A kube client for `config` that speaks HTTP/2 to a server offering it over TLS (ALPN, as
/// kube-apiserver does) and HTTP/1.1 otherwise (always, with `http1_only`). kube's own client
/// speaks HTTP/1.1 only, so every request in flight holds a connection of its own: a sync creating 256 pods at once opens up to
/// 256 TLS connections, and each handshake costs kube-apiserver CPU and the request its latency.
/// Over HTTP/2 requests and watches share one connection, as client-go's do, until it has no
/// free stream; then another is opened ([`Spread`]). The layers are
/// kube's default stack's (base URI, kube's retry when `config.default_retry`, auth, extra
/// headers) with the same connect, read and write timeouts.
pub fn client(config: kube::Config, http1_only: bool) -> anyhow::Result<kube::Client> {
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    // HTTP/2 writes a request's HEADERS and DATA frames apart; with Nagle's algorithm on, the
    // second waits for the server's delayed ACK (40 ms). Go's dialer turns it off too.
    http.set_nodelay(true);
    let tls = config.rustls_client_config()?;
    let https = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_or_http();
    let https = match config.tls_server_name.as_deref() {
        Some(name) => https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(
            name.to_owned().try_into()?,
        )),
        None => https,
    };
    let https = match http1_only {
        true => https.enable_http1().wrap_connector(http),
        false => https.enable_all_versions().wrap_connector(http),
    };
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let spread = Spread::new(connector);
    let retry = config
        .default_retry
        .then(|| tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry()));
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(FirstAlone::new(spread));
    Ok(kube::Client::new(service, config.default_namespace))
}

type Connector = hyper_timeout::TimeoutConnector<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
>;
type HyperClient = hyper_util::client::legacy::Client<Connector, kube::client::Body>;

/// Builds one hyper client (one connection pool) with the HTTP/2 settings client-go uses.
/// `http2_only` skips the wait for ALPN, so a burst of first requests shares one connection.
fn hyper_client(connector: Connector, http2_only: bool) -> HyperClient {
    hyper_util::client::legacy::Builder::new(hyper_util::rt::TokioExecutor::new())
        .timer(hyper_util::rt::TokioTimer::new())
        .http2_only(http2_only)
        .http2_keep_alive_interval(H2_PING_INTERVAL)
        .http2_keep_alive_timeout(H2_PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .http2_initial_stream_window_size(H2_STREAM_WINDOW)
        .http2_initial_connection_window_size(H2_CONNECTION_WINDOW)
        .build(connector)
}

/// Spreads requests over more HTTP/2 connections when one is full, as Go's HTTP/2 transport
/// (client-go's) does. hyper keeps one HTTP/2 connection per server and queues every request
/// beyond the streams the server allows on it — kube-apiserver allows
/// [`STREAMS_PER_CONNECTION`] by default — so a sync creating 256 pods, or patching 300, would
/// have at most 100 in flight and the rest wait for a free stream. Here a request goes to the
/// first connection with a free stream, and a new connection is opened (up to
/// [`MAX_CONNECTIONS`]) when every one is full; past that, to the least busy. A request holds
/// its stream until its response body is dropped (a watch for as long as it runs). Over
/// HTTP/1.1 hyper's pool already opens a connection per request in flight: one pool is used.
#[derive(Clone)]
struct Spread {
    inner: std::sync::Arc<SpreadInner>,
}

struct SpreadInner {
    connector: Connector,
    slots: std::sync::Mutex<Vec<Slot>>,
    /// A response came over HTTP/2: the server speaks it, and extra pools may assume it.
    h2: std::sync::atomic::AtomicBool,
}

#[derive(Clone)]
struct Slot {
    client: HyperClient,
    in_flight: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// Streams kube-apiserver allows on one HTTP/2 connection unless `--http2-max-streams-per-
/// connection` says otherwise (also Go's initial limit before the server's SETTINGS).
const STREAMS_PER_CONNECTION: usize = 100;
/// Most HTTP/2 connections one client opens to the server.
const MAX_CONNECTIONS: usize = 8;

impl Spread {
    fn new(connector: Connector) -> Self {
        let first =
            Slot { client: hyper_client(connector.clone(), false), in_flight: Default::default() };
        let inner = SpreadInner {
            connector,
            slots: std::sync::Mutex::new(vec![first]),
            h2: Default::default(),
        };
        Self { inner: std::sync::Arc::new(inner) }
    }

    /// The pool the next request goes to, its stream counted.
    fn pick(&self) -> (HyperClient, InFlight) {
        use std::sync::atomic::Ordering::{Acquire, Relaxed};
        let mut slots = self.inner.slots.lock().unwrap_or_else(|e| e.into_inner());
        let free = |s: &&Slot| s.in_flight.load(Relaxed) < STREAMS_PER_CONNECTION;
        let slot = if !self.inner.h2.load(Acquire) {
            slots[0].clone()
        } else if let Some(s) = slots.iter().find(free) {
            s.clone()
        } else if slots.len() < MAX_CONNECTIONS {
            let client = hyper_client(self.inner.connector.clone(), true);
            let s = Slot { client, in_flight: Default::default() };
            slots.push(s.clone());
            s
        } else {
            slots
                .iter()
                .min_by_key(|s| s.in_flight.load(Relaxed))
                .cloned()
                .unwrap_or_else(|| slots[0].clone())
        };
        slot.in_flight.fetch_add(1, Relaxed);
        (slot.client, InFlight(slot.in_flight))
    }
}

impl tower::Service<http::Request<kube::client::Body>> for Spread {
    type Response = http::Response<Counted<hyper::body::Incoming>>;
    type Error = hyper_util::client::legacy::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        // hyper's client is always ready: it queues in its pool.
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let (client, stream) = self.pick();
        let inner = self.inner.clone();
        Box::pin(async move {
            let response = client.request(req).await?;
            if response.version() == http::Version::HTTP_2 {
                inner.h2.store(true, std::sync::atomic::Ordering::Release);
            }
            Ok(response.map(|body| Counted { body, _stream: stream }))
        })
    }
}

/// A request's hold on its connection's stream count.
struct InFlight(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A response body that holds its request's stream until it is dropped.
pub struct Counted<B> {
    body: B,
    _stream: InFlight,
}

impl<B: hyper::body::Body + Unpin> hyper::body::Body for Counted<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// Sends a request alone while no connection is known to work, the rest after its response.
/// Which protocol a server speaks is known only once a TLS handshake has negotiated it, so
/// hyper's pool opens a connection for every request that finds none idle: a burst at start
/// (or after the server went away) would open a connection per request, HTTP/2 or not. With
/// the first request alone, the burst finds the one HTTP/2 connection it opened. A failed
/// request (no response: connect, TLS or I/O error) closes the gate again. The others wait for
/// the lone request at most [`ALONE_WAIT`]: against a server that does not answer (a connect
/// timeout is 30 s) they go on together rather than one after another.
#[derive(Clone)]
struct FirstAlone<S> {
    inner: S,
    gate: std::sync::Arc<Gate>,
}

#[derive(Default)]
struct Gate {
    /// A response arrived since the last failure.
    open: std::sync::atomic::AtomicBool,
    /// Held by the request that goes alone.
    alone: tokio::sync::Mutex<()>,
}

impl<S> FirstAlone<S> {
    fn new(inner: S) -> Self {
        Self { inner, gate: Default::default() }
    }
}

impl<S, Req> tower::Service<Req> for FirstAlone<S>
where
    S: tower::Service<Req> + Clone + Send + 'static,
    S::Future: Send,
    Req: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        use std::sync::atomic::Ordering;
        // The service polled ready is the one that is called (tower's contract).
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        let gate = self.gate.clone();
        Box::pin(async move {
            let alone = match gate.open.load(Ordering::Acquire) {
                true => None,
                false => match tokio::time::timeout(ALONE_WAIT, gate.alone.lock()).await {
                    Ok(held) => (!gate.open.load(Ordering::Acquire)).then_some(held),
                    Err(_) => None,
                },
            };
            let result = inner.call(req).await;
            gate.open.store(result.is_ok(), Ordering::Release);
            drop(alone);
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBECONFIG: &str = r#"
apiVersion: v1
kind: Config
clusters:
- name: sim
  cluster: {server: "http://127.0.0.1:40123"}
users:
- name: sim
  user: {token: "t"}
contexts:
- name: sim
  context: {cluster: sim, user: sim, namespace: work}
current-context: sim
"#;

    #[tokio::test]
    async fn config_reads_the_kubeconfig_and_sets_the_timeouts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, KUBECONFIG).unwrap();
        let args = KubeClientArgs {
            kubeconfig: Some(path),
            kube_timeout_seconds: 7,
            kube_http1_only: false,
        };
        let config = args.config().await.unwrap();
        assert_eq!(config.cluster_url.to_string(), "http://127.0.0.1:40123/");
        assert_eq!(config.default_namespace, "work");
        let seven = Some(std::time::Duration::from_secs(7));
        assert_eq!((config.connect_timeout, config.write_timeout), (seven, seven));
        assert!(config.default_retry, "kube's retry layer stays on unless a caller turns it off");
        args.client().await.unwrap();
    }

    #[tokio::test]
    async fn config_reports_a_missing_kubeconfig() {
        let args = KubeClientArgs {
            kubeconfig: Some("/nonexistent/kjob-kubeconfig".into()),
            kube_timeout_seconds: 30,
            kube_http1_only: false,
        };
        assert!(args.config().await.is_err());
    }
}
