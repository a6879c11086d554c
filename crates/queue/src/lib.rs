//! kjob-queue: the gRPC queue service over the Redis workqueue.
//!
//! [`run`] serves the `Queue` and `Expectations` services, grpc.health.v1 and server reflection
//! on one listener, keeps readiness and gauges fresh, and reaps expired leases; several replicas
//! may run against one Redis (every operation is one atomic script). [`inspect`] is the
//! `kjob-queue inspect` subcommand.

pub mod batch;
pub mod metrics;
pub mod service;
pub mod validate;

use std::time::Duration;

use anyhow::Context;
use kjob_proto::v1::expectations_server::ExpectationsServer;
use kjob_proto::v1::queue_server::QueueServer;
use kjob_svc::{AdminState, Shutdown};
use kjob_workqueue::{Store, StoreConfig, Waker};
use prometheus_client::registry::Registry;
use rand::Rng;
use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tonic_health::ServingStatus;

pub use metrics::Metrics;
pub use service::QueueService;

/// How often the reaper promotes due items and puts expired leases back. Every replica runs it;
/// the script is atomic and idempotent, so concurrent sweeps are harmless.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// How often readiness (a Redis PING) and the Redis-derived gauges are refreshed.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// Pause between attempts to reach Redis at start-up.
const CONNECT_RETRY: Duration = Duration::from_secs(1);
/// Concurrent calls per client connection; each worker holds a few (one long poll plus Done/Renew).
const MAX_CONCURRENT_PER_CONN: usize = 256;
/// HTTP/2 keepalive pings notice dead clients (their long polls are then dropped).
const KEEPALIVE: Duration = Duration::from_secs(20);

/// Configuration of [`run`].
#[derive(Debug)]
pub struct Config {
    /// Redis URL: `redis://host:port` or `redis+cluster://host:port,host:port`.
    pub redis_url: String,
    /// Listener of the admin HTTP port (`/metrics`, `/livez`, `/readyz`), if any.
    pub admin_listener: Option<TcpListener>,
    /// Store tunables.
    pub store: StoreConfig,
}

/// Serves kjob-queue on `listener` until `shutdown` is cancelled, then drains: long polls
/// answer empty, in-flight calls finish, background loops stop.
pub async fn run(listener: TcpListener, config: Config, shutdown: Shutdown) -> anyhow::Result<()> {
    let Config { redis_url, admin_listener, store: store_config } = config;
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let admin = AdminState::new(registry);
    let admin_task = admin_listener.map(|l| {
        let (admin, shutdown) = (admin.clone(), shutdown.clone());
        tokio::spawn(async move { kjob_svc::serve_admin(l, admin, shutdown).await })
    });

    let Some(store) = connect(&redis_url, store_config, &shutdown).await? else {
        return Ok(());
    };
    let waker = Waker::new(&store, kjob_core::QUEUES);
    let (health, health_service) = tonic_health::server::health_reporter();
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(kjob_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("building the reflection service")?;
    let (dones, batch_loops) = batch::DoneBatcher::new(kjob_core::QUEUES);
    let service =
        QueueService::new(store.clone(), waker.clone(), dones, metrics.clone(), shutdown.clone());
    // The loops end when the server has dropped every service clone, i.e. after the drain.
    let batch_loops =
        futures::future::join_all(batch_loops.into_iter().map(|l| batch::run(store.clone(), l)));

    tracing::info!(addr = %listener.local_addr()?, redis = %redis_url, "kjob-queue serving");
    let server = tonic::transport::Server::builder()
        .concurrency_limit_per_connection(MAX_CONCURRENT_PER_CONN)
        .http2_keepalive_interval(Some(KEEPALIVE))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(QueueServer::new(service.clone()))
        .add_service(ExpectationsServer::new(service))
        .serve_with_incoming_shutdown(
            // Small request/response messages: without TCP_NODELAY, Nagle's algorithm and
            // delayed ACKs add tens of ms to a lone call (tonic sets it only on listeners it
            // binds itself).
            TcpListenerStream::new(listener).map(|conn| {
                if let Ok(c) = &conn
                    && let Err(e) = c.set_nodelay(true)
                {
                    tracing::debug!(error = %e, "setting TCP_NODELAY failed");
                }
                conn
            }),
            shutdown.clone().cancelled_owned(),
        );

    let (served, _, (), (), ()) = tokio::join!(
        server,
        batch_loops,
        waker.run(store.clone(), shutdown.clone().cancelled_owned()),
        reaper(&store, &metrics, &shutdown),
        probe(&store, &metrics, &admin, &health, &shutdown),
    );
    admin.set_ready(false);
    served.context("gRPC server failed")?;
    if let Some(t) = admin_task {
        t.await.context("admin task panicked")?.context("admin server failed")?;
    }
    tracing::info!("kjob-queue stopped");
    Ok(())
}

/// Connects to Redis, retrying while it is unreachable; configuration errors are fatal.
async fn connect(
    url: &str,
    config: StoreConfig,
    shutdown: &Shutdown,
) -> anyhow::Result<Option<Store>> {
    loop {
        match Store::connect(url, config.clone()).await {
            Ok(s) => return Ok(Some(s)),
            Err(e) if e.is_unavailable() => {
                tracing::warn!(error = %e, "redis not reachable yet; retrying");
            }
            Err(e) => return Err(e).context("connecting to redis"),
        }
        tokio::select! {
            _ = tokio::time::sleep(CONNECT_RETRY) => {}
            _ = shutdown.cancelled() => return Ok(None),
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
                    metrics.adds.get_or_create(&Metrics::q(q)).inc_by(u64::from(r.promoted));
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

async fn probe(
    store: &Store,
    metrics: &Metrics,
    admin: &AdminState,
    health: &tonic_health::server::HealthReporter,
    shutdown: &Shutdown,
) {
    let mut was_ready = None;
    loop {
        let ready = store.ping().await.is_ok();
        if was_ready != Some(ready) {
            let status = if ready { ServingStatus::Serving } else { ServingStatus::NotServing };
            health.set_service_status("", status).await;
            health.set_service_status("kjob.queue.v1.Queue", status).await;
            health.set_service_status("kjob.queue.v1.Expectations", status).await;
            admin.set_ready(ready);
            if ready {
                tracing::info!("redis reachable: ready");
            } else {
                tracing::warn!("redis unreachable: not ready");
            }
            was_ready = Some(ready);
        }
        if ready {
            for q in kjob_core::QUEUES {
                if let Ok(s) = store.stats(q).await {
                    metrics.set_stats(q, &s);
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(PROBE_INTERVAL) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// `kjob-queue inspect`: prints the stats of `queue` and the state of `keys` for a person.
pub async fn inspect(
    queue_url: &str,
    queue: &str,
    keys: Vec<String>,
    out: &mut impl std::io::Write,
) -> anyhow::Result<()> {
    use kjob_queue_client::{QueueClient, RetryPolicy};
    let client = QueueClient::connect_lazy(queue_url)?
        .with_retry_policy(RetryPolicy { max_retries: Some(3), ..RetryPolicy::default() });
    let s = client.stats(queue).await?;
    writeln!(out, "queue {queue}")?;
    writeln!(out, "  ready    {:>8}   (oldest waiting {} ms)", s.ready, s.oldest_ready_age_ms)?;
    writeln!(out, "  delayed  {:>8}", s.delayed)?;
    writeln!(out, "  leased   {:>8}   (dirty: added again while leased: {})", s.leased, s.dirty)?;
    writeln!(out, "  failing  {:>8}   (keys with rate-limited requeues)", s.failing)?;
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
