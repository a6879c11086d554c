//! kjob-queue: the gRPC queue service over the Redis workqueue.
//!
//! [`run`] serves the `Queue` and `Expectations` services, grpc.health.v1 and server reflection
//! (v1 and v1alpha) on one listener, keeps readiness and gauges fresh, and reaps expired leases; several replicas
//! may run against one Redis (every operation is one atomic script). [`inspect`] is the
//! `kjob-queue inspect` subcommand.

pub mod auth;
pub mod batch;
pub mod certs;
pub mod config;
pub mod explain;
pub mod limits;
pub mod metrics;
pub mod service;
pub mod tenants;
pub mod ui;
pub mod validate;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures::FutureExt;
use kjob_proto::v1::job_state_server::JobStateServer;
use kjob_proto::v1::queue_server::QueueServer;
use kjob_svc::{AdminServer, AdminState, Backoff, Shutdown, Vital};
use kjob_workqueue::{RedisOptions, RedisTarget, Store, StoreConfig, Waker, redact};
use prometheus_client::registry::Registry;
use rand::Rng;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use tonic_health::ServingStatus;

pub use config::{Args, Command};
pub use metrics::Metrics;
pub use service::QueueService;

/// How often the reaper promotes due items and puts expired leases back. Every replica runs it;
/// the script is atomic and idempotent, so concurrent sweeps are harmless.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// How often readiness (a Redis PING and `INFO memory`) and the Redis-derived gauges are
/// refreshed.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// How long after Redis refused a write for lack of memory this replica stays not ready, even
/// when `INFO memory` already reads below `maxmemory` (the refused request's own bytes can be
/// what crossed it): a few probe beats, so a full Redis does not flap ready and not ready.
const OOM_HOLD: Duration = Duration::from_secs(5);
/// Attempts to reach Redis at start-up: quick at first, then once a second.
const CONNECT_BACKOFF: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
/// Concurrent calls per client connection, queued past it (tonic's limit): each worker holds a
/// few (one long poll plus one call per sync slot); the global limit, which refuses, is
/// `--max-concurrent-calls`.
const MAX_CONCURRENT_PER_CONN: usize = 256;
/// HTTP/2 keepalive pings notice dead clients (their long polls are then dropped).
const KEEPALIVE: Duration = Duration::from_secs(20);

/// Configuration of [`run`]. Printing it shows the URL and the password redacted.
#[derive(Clone)]
pub struct QueueConfig {
    /// Redis URL: `redis[s]://[user:password@]host:port` or
    /// `redis[s]+cluster://host:port,host:port`.
    pub redis_url: String,
    /// Credentials and TLS files beyond the URL.
    pub redis: RedisOptions,
    /// Store tunables.
    pub store: StoreConfig,
    /// Who may call, and over what.
    pub security: Security,
    /// Most calls handled at once across every connection; more are refused with
    /// RESOURCE_EXHAUSTED (`--max-concurrent-calls`).
    pub max_concurrent_calls: usize,
    /// Namespaces with their own per-namespace gauges, the deepest (`--namespace-metrics-top`).
    pub namespace_metrics_top: usize,
}

/// How kjob-queue secures its gRPC port.
#[derive(Clone)]
pub enum Security {
    /// TLS with this serving certificate and key (PEM); callers present a certificate signed by
    /// `client_ca` whose CN is their role ([`auth`]), or are refused.
    Tls {
        /// Serving certificate chain, PEM.
        cert: Vec<u8>,
        /// Its private key, PEM.
        key: Vec<u8>,
        /// The CA of callers' certificates, PEM.
        client_ca: Vec<u8>,
    },
    /// `--insecure-no-auth`: plaintext, every caller allowed (development only).
    InsecureNoAuth,
}

impl std::fmt::Debug for Security {
    // Never prints the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Security::Tls { .. } => "Tls",
            Security::InsecureNoAuth => "InsecureNoAuth",
        })
    }
}

impl QueueConfig {
    /// Redis at `redis_url`, no options beyond the URL, default tunables, gRPC secured as
    /// `security` says.
    pub fn new(redis_url: impl Into<String>, security: Security) -> Self {
        Self {
            redis_url: redis_url.into(),
            redis: RedisOptions::default(),
            store: Default::default(),
            security,
            max_concurrent_calls: limits::DEFAULT_MAX_CONCURRENT_CALLS,
            namespace_metrics_top: tenants::DEFAULT_NAMESPACE_METRICS_TOP,
        }
    }
}

impl std::fmt::Debug for QueueConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueConfig")
            .field("redis_url", &redact(&self.redis_url))
            .field("redis", &self.redis)
            .field("store", &self.store)
            .field("security", &self.security)
            .field("max_concurrent_calls", &self.max_concurrent_calls)
            .field("namespace_metrics_top", &self.namespace_metrics_top)
            .finish()
    }
}

/// The sockets kjob-queue serves on, bound by the caller (tests bind `127.0.0.1:0`).
#[derive(Debug)]
pub struct Listeners {
    /// The gRPC port (`Queue`, `Expectations`, health, reflection).
    pub grpc: TcpListener,
    /// The admin port (`/metrics`, `/livez`, `/readyz`); `None` serves none.
    pub admin: Option<TcpListener>,
}

impl Listeners {
    /// A gRPC listener without an admin port.
    pub fn grpc(grpc: TcpListener) -> Self {
        Self { grpc, admin: None }
    }
}

/// Serves kjob-queue on `listeners.grpc` until `shutdown` is cancelled, then drains: long polls
/// answer empty, in-flight calls finish, background loops stop; the admin port answers until
/// the end.
///
/// The gRPC server, the Done batch loops, the wake-up loop, the reaper, the readiness probe, the
/// gRPC health mirror and the admin server are vital: if one of them ends before shutdown (a listener that cannot
/// accept any more ends the server), the service goes not ready, drains and returns an error
/// naming it, so the process exits with a non-zero status.
pub async fn run(
    listeners: Listeners,
    config: QueueConfig,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let Listeners { grpc: listener, admin } = listeners;
    let QueueConfig {
        redis_url,
        redis,
        store: store_config,
        security,
        max_concurrent_calls,
        namespace_metrics_top,
    } = config;
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry, &kjob_core::QUEUES, &service::RPCS);
    let api = explain::ExplainApi::default();
    let ui = ui::Ui::default();
    let routes = api.router().merge(ui.router());
    kjob_svc::with_admin_routes(admin, registry, routes, async move |admin: &mut AdminServer| {
        // Unusable settings fail here: nothing to serve, and nothing left behind.
        let target = RedisTarget::new(&redis_url, &redis)
            .with_context(|| format!("redis URL {}", redact(&redis_url)))?;
        let Some(store) = connect(target, store_config, &shutdown).await? else {
            return Ok(());
        };
        api.serve_from(store.clone());
        ui.serve_from(store.clone());
        let limit = limits::LimitLayer::new(max_concurrent_calls, metrics.limits());
        metrics.set_namespace_top(namespace_metrics_top);
        serve(listener, &security, limit, store, metrics, &ui, admin, &shutdown).await
    })
    .await?;
    tracing::info!("kjob-queue stopped");
    Ok(())
}

/// The service proper, between the admin port's start and stop.
// Each argument is one part the loops below run over; a struct of them would only rename them.
#[allow(clippy::too_many_arguments)]
async fn serve(
    listener: TcpListener,
    security: &Security,
    limit: limits::LimitLayer,
    store: Store,
    metrics: Metrics,
    ui: &ui::Ui,
    admin: &mut AdminServer,
    shutdown: &Shutdown,
) -> anyhow::Result<()> {
    let ready = admin.state().clone();
    let fence = kjob_workqueue::Fence::for_target(store.target());
    let waker = Waker::new(&store, kjob_core::QUEUES).with_fence(fence.clone());
    let (health, health_service) = tonic_health::server::health_reporter();
    let (dones, batch_loops) = batch::DoneBatcher::new(kjob_core::QUEUES);
    let syncs = Arc::new(kjob_workqueue::SyncCounter::default());
    let service = QueueService::new(
        store.clone(),
        waker.clone(),
        dones,
        metrics.clone(),
        shutdown.clone(),
        syncs.clone(),
    );

    let mut builder = tonic::transport::Server::builder();
    let auth = match security {
        Security::Tls { cert, key, client_ca } => {
            // Optional at the TLS layer, so a caller without a certificate gets a gRPC answer
            // (UNAUTHENTICATED, counted) rather than a failed handshake; one that presents a
            // certificate must chain to `client_ca`.
            let tls = ServerTlsConfig::new()
                .identity(Identity::from_pem(cert, key))
                .client_ca_root(Certificate::from_pem(client_ca))
                .client_auth_optional(true);
            builder = builder.tls_config(tls).context("kjob-queue's TLS settings")?;
            auth::AuthLayer::roles(metrics.auth_refused())
        }
        Security::InsecureNoAuth => {
            tracing::warn!(
                "--insecure-no-auth: plaintext gRPC, and every caller may call every RPC \
                 (development only)"
            );
            auth::AuthLayer::allow_all()
        }
    };
    tracing::info!(addr = %listener.local_addr()?, redis = %store.target(), security = ?security, "kjob-queue serving");
    let server = builder
        .concurrency_limit_per_connection(MAX_CONCURRENT_PER_CONN)
        .http2_keepalive_interval(Some(KEEPALIVE))
        // Authorization first: a refused caller never holds one of the limit's slots.
        .layer(auth)
        .layer(limit)
        .add_service(health_service)
        .add_service(reflection().build_v1().context("building the reflection service")?)
        // Older grpcurl, Postman and the Python gRPC client ask for v1alpha.
        .add_service(reflection().build_v1alpha().context("building the reflection service")?)
        .add_service(
            QueueServer::new(service.clone())
                .max_decoding_message_size(validate::MAX_REQUEST_BYTES)
                .max_encoding_message_size(validate::MAX_REPLY_BYTES),
        )
        .add_service(
            JobStateServer::new(service)
                .max_decoding_message_size(validate::MAX_REQUEST_BYTES)
                .max_encoding_message_size(validate::MAX_REPLY_BYTES),
        )
        .serve_with_incoming_shutdown(
            kjob_svc::tcp_incoming(listener),
            shutdown.clone().cancelled_owned(),
        );

    let mut vital = Vital::new(shutdown).readiness(&ready);
    vital.task("gRPC server", async { server.await.context("gRPC server") });
    // The loops run as tasks of their own: each queue's Done batches, the wake-ups and the
    // reaper are scheduled independently of one another and of the server's accept loop.
    for l in batch_loops {
        // A loop ends when the server has dropped every service clone, i.e. after the drain.
        vital.spawn("Done batch loop", batch::run(store.clone(), l).map(Ok));
    }
    let (w, s, stop) = (waker.clone(), store.clone(), shutdown.clone());
    vital.spawn("wake-up loop", async move {
        w.run(s, stop.cancelled_owned()).await;
        Ok(())
    });
    let (s, m, stop) = (store.clone(), metrics.clone(), shutdown.clone());
    vital.spawn("lease reaper", async move {
        reaper(&s, &m, &stop).await;
        Ok(())
    });
    let (s, u, stop) = (store.clone(), ui.clone(), shutdown.clone());
    vital.spawn("web view's depth sampler", async move {
        u.sample(&s, &stop).await;
        Ok(())
    });
    let (s, stop) = (store.clone(), shutdown.clone());
    vital.spawn("sync-rate publisher", async move {
        publish_sync_rates(&s, &syncs, &stop).await;
        Ok(())
    });
    let (s, m, stop) = (store.clone(), metrics.clone(), shutdown.clone());
    vital.spawn("per-namespace gauges", async move {
        tenants::publish(&s, &m, &stop).await;
        Ok(())
    });
    let (s, m, stop) = (store.clone(), metrics.clone(), shutdown.clone());
    vital.spawn("Redis data-loss fence", async move {
        fence
            .run(&s, stop.cancelled_owned(), || {
                m.redis_data_lost.inc();
            })
            .await;
        Ok(())
    });
    vital.task("readiness probe", probe(&store, &metrics, &ready, shutdown).map(Ok));
    vital.task("gRPC health", mirror_health(ready.subscribe(), health, shutdown).map(Ok));
    vital.guard("admin server", admin.watch());
    Ok(vital.run().await?)
}

/// The reflection services' contents: kjob's protos and grpc.health.v1.
fn reflection() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(kjob_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
}

/// Connects to Redis, retrying while it is unreachable; configuration errors are fatal.
async fn connect(
    target: RedisTarget,
    config: StoreConfig,
    shutdown: &Shutdown,
) -> anyhow::Result<Option<Store>> {
    let mut attempts = CONNECT_BACKOFF.attempts();
    loop {
        match Store::connect_to(target.clone(), config.clone()).await {
            Ok(s) => return Ok(Some(s)),
            Err(e) if e.is_unavailable() => {
                tracing::warn!(redis = %target, error = %e, "redis not reachable yet; retrying");
            }
            Err(e) => return Err(e).with_context(|| format!("connecting to redis {target}")),
        }
        tokio::select! {
            _ = tokio::time::sleep(attempts.next_delay()) => {}
            _ = shutdown.cancelled() => return Ok(None),
        }
    }
}

/// Publishes this replica's Dones per second per namespace of the job queue every
/// [`kjob_workqueue::SYNC_PUBLISH_PERIOD`], under an id of its own, so the namespaces API of
/// any replica sums every live replica's (counting in memory spares Redis a write per Done).
async fn publish_sync_rates(
    store: &Store,
    syncs: &kjob_workqueue::SyncCounter,
    shutdown: &Shutdown,
) {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "kjob-queue".into());
    // The host name alone could repeat (two processes on one machine): a random suffix.
    let replica = format!("{host}-{:08x}", rand::rng().random::<u32>());
    loop {
        tokio::select! {
            _ = tokio::time::sleep(kjob_workqueue::SYNC_PUBLISH_PERIOD) => {}
            _ = shutdown.cancelled() => return,
        }
        let now_ms = jiff::Timestamp::now().as_millisecond();
        let rates = syncs.rates(now_ms);
        if let Err(e) = store.publish_sync_rates(kjob_core::JOB_QUEUE, &replica, &rates).await {
            tracing::warn!(error = %e, "publishing the sync rates failed");
        }
    }
}

async fn reaper(store: &Store, metrics: &Metrics, shutdown: &Shutdown) {
    loop {
        // Jitter spreads the replicas' sweeps over the interval.
        let pause = SWEEP_INTERVAL.mul_f64(rand::rng().random_range(0.8..1.2));
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.cancelled() => return,
        }
        for q in kjob_core::QUEUES {
            match store.sweep(q).await {
                Ok(r) => {
                    metrics.count_reaped(q, r.reaped, r.poisoned);
                    metrics.queue(q).adds.inc_by(u64::from(r.promoted));
                    if r.reaped > 0 {
                        tracing::info!(
                            queue = q,
                            reaped = r.reaped,
                            poisoned = r.poisoned,
                            "expired leases put back"
                        );
                    }
                }
                Err(e) => tracing::warn!(queue = q, error = %e, "sweep failed"),
            }
        }
    }
}

/// Ready while Redis answers and has room to write: a node at its `maxmemory` refuses every
/// write (`noeviction`), so Adds would fail, and the replica says so. The queue gauges and the
/// Redis memory gauges are refreshed on the same beat.
async fn probe(store: &Store, metrics: &Metrics, ready: &AdminState, shutdown: &Shutdown) {
    kjob_svc::probe_readiness(ready, "redis", PROBE_INTERVAL, shutdown, || async {
        if store.ping().await.is_err() {
            return false;
        }
        let room = match store.memory().await {
            Ok(nodes) => {
                metrics.set_redis_memory(&nodes);
                // (The probe logs the change to not ready; the gauges say which node.)
                !nodes.iter().any(|n| n.is_full()) && !store.refused_for_memory_within(OOM_HOLD)
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading redis memory failed");
                false
            }
        };
        for q in kjob_core::QUEUES {
            if let Ok(s) = store.stats(q).await {
                metrics.set_stats(q, &s);
            }
        }
        room
    })
    .await;
}

/// grpc.health.v1 says what `/readyz` says, for the whole server and each service.
async fn mirror_health(
    mut ready: watch::Receiver<bool>,
    health: tonic_health::server::HealthReporter,
    shutdown: &Shutdown,
) {
    loop {
        let status = if *ready.borrow_and_update() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for service in ["", service::QUEUE_SERVICE, service::JOB_STATE_SERVICE] {
            health.set_service_status(service, status).await;
        }
        tokio::select! {
            changed = ready.changed() => if changed.is_err() { return },
            _ = shutdown.cancelled() => return,
        }
    }
}

/// `kjob-queue certs`: writes the CA and certificates into `out` and prints the commands
/// that load them as Secrets.
pub fn certs(
    out_dir: &std::path::Path,
    hosts: Vec<String>,
    namespace: &str,
    out: &mut impl std::io::Write,
) -> anyhow::Result<()> {
    let hosts =
        if hosts.is_empty() { certs::DEFAULT_HOSTS.map(String::from).into() } else { hosts };
    certs::write(out_dir, &hosts)?;
    writeln!(
        out,
        "# wrote a kjob CA and the certificates of {} into {}",
        hosts.join(","),
        out_dir.display()
    )?;
    writeln!(
        out,
        "# load them (the inspector's is for `kjob-queue inspect`; keep ca.key offline):"
    )?;
    for c in certs::kubectl_commands(out_dir, namespace) {
        writeln!(out, "{c}")?;
    }
    Ok(())
}

/// What `kjob-queue inspect` shows.
#[derive(Debug, Clone, Default)]
pub struct InspectArgs {
    /// The queue.
    pub queue: String,
    /// Keys (`namespace/name`) whose state to print.
    pub keys: Vec<String>,
    /// Namespaces in the per-namespace table, deepest first (0: no table).
    pub top: u32,
    /// Only this namespace: its row and its longest waiting ready keys.
    pub namespace: Option<String>,
}

/// Longest waiting ready keys `kjob-queue inspect --namespace` lists.
const INSPECT_OLDEST_KEYS: u32 = 20;

/// `kjob-queue inspect`: prints the stats of the queue, its namespaces by depth (or one
/// namespace and its longest waiting keys) and the state of particular keys, for a person.
pub async fn inspect(
    queue_url: &str,
    tls: &kjob_queue_client::QueueTlsArgs,
    args: InspectArgs,
    out: &mut impl std::io::Write,
) -> anyhow::Result<()> {
    use kjob_queue_client::RetryPolicy;
    let InspectArgs { queue, keys, top, namespace } = args;
    let queue = queue.as_str();
    let client = tls
        .connect_lazy(queue_url)?
        .with_retry_policy(RetryPolicy { max_retries: Some(3), ..RetryPolicy::default() });
    let s = client.stats(queue).await?;
    writeln!(out, "queue {queue}")?;
    writeln!(out, "  ready    {:>8}   (oldest waiting {} ms)", s.ready, s.oldest_ready_age_ms)?;
    writeln!(out, "  delayed  {:>8}", s.delayed)?;
    writeln!(out, "  leased   {:>8}   (dirty: added again while leased: {})", s.leased, s.dirty)?;
    writeln!(out, "  failing  {:>8}   (keys with rate-limited requeues)", s.failing)?;
    if top > 0 || namespace.is_some() {
        let only = namespace.as_deref().unwrap_or("");
        let oldest = if namespace.is_some() { INSPECT_OLDEST_KEYS } else { 0 };
        writeln!(out)?;
        match client.namespaces(queue, only, top.max(1), oldest).await {
            Ok(n) => print_namespaces(&n, namespace.as_deref(), out)?,
            // A kjob-queue older than this inspect: the rest is still worth printing.
            Err(kjob_queue_client::ClientError::Status(s))
                if s.code() == tonic::Code::Unimplemented =>
            {
                writeln!(out, "(this kjob-queue has no per-namespace table: upgrade it)")?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    if keys.is_empty() {
        return Ok(());
    }
    let r = client.inspect(queue, keys).await?;
    writeln!(out)?;
    writeln!(
        out,
        "{:<40} {:<8} {:>15} {:>8} {:>5} {:<20} {:>15}",
        "KEY", "STATE", "READY_AT_MS", "REQUEUES", "DIRTY", "HOLDER", "DEADLINE_MS"
    )?;
    for k in r.keys {
        let t = |v: i64| if v == 0 { "-".to_string() } else { v.to_string() };
        writeln!(
            out,
            "{:<40} {:<8} {:>15} {:>8} {:>5} {:<20} {:>15}",
            k.key,
            k.state,
            t(k.ready_unix_ms),
            k.requeues,
            k.dirty,
            if k.lease_holder.is_empty() { "-" } else { &k.lease_holder },
            t(k.lease_deadline_unix_ms)
        )?;
    }
    Ok(())
}

/// The per-namespace table of `kjob-queue inspect` (and one namespace's longest waiting keys).
fn print_namespaces(
    n: &kjob_proto::v1::NamespacesResponse,
    only: Option<&str>,
    out: &mut impl std::io::Write,
) -> anyhow::Result<()> {
    let secs = |ms: u64| format!("{:.1}s", ms as f64 / 1000.0);
    writeln!(
        out,
        "{:<40} {:>8} {:>8} {:>8} {:>12} {:>10}",
        "NAMESPACE", "READY", "DELAYED", "LEASED", "OLDEST_READY", "SYNCS/S"
    )?;
    for r in &n.namespaces {
        writeln!(
            out,
            "{:<40} {:>8} {:>8} {:>8} {:>12} {:>10.2}",
            r.namespace,
            r.ready,
            r.delayed,
            r.leased,
            if r.ready == 0 { "-".to_string() } else { secs(r.oldest_ready_age_ms) },
            r.syncs_per_second
        )?;
    }
    match only {
        Some(ns) if n.namespaces.is_empty() => {
            writeln!(out, "(namespace {ns} has no keys queued)")?
        }
        Some(_) => {}
        None => {
            let shown = n.namespaces.len();
            let total = n.total_namespaces as usize;
            if total > shown {
                writeln!(out, "({} more namespaces; --top shows more)", total - shown)?;
            }
        }
    }
    if n.truncated {
        writeln!(out, "(a set held more than one read covers: counts are lower bounds)")?;
    }
    if let Some(ns) = only
        && !n.oldest_ready.is_empty()
    {
        writeln!(out)?;
        writeln!(out, "longest waiting ready keys of {ns}:")?;
        writeln!(out, "{:<60} {:>12}", "KEY", "WAITING")?;
        for k in &n.oldest_ready {
            writeln!(out, "{:<60} {:>12}", k.key, secs(k.ready_age_ms))?;
        }
    }
    Ok(())
}
