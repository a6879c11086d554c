//! kjob-watcher: informer events to enqueue requests, as the upstream Job controller handlers
//! decide them.
//!
//! Pipeline: kube-runtime watchers (Jobs, then Pods) → [`informer::Informer`] (last-seen store,
//! relist tombstones) → [`handlers`] (pure upstream decisions) → bounded channel →
//! [`sender`] (batched, retried `Add` calls to kjob-queue). [`leader`] decides whether this
//! process emits anything; standbys keep warm caches.

pub mod cache;
pub mod config;
pub mod handlers;
pub mod informer;
pub mod kube_proto;
pub mod leader;
pub mod metrics;
pub mod pod_watch;
pub mod priority;
pub mod sender;
mod settle;
pub mod view;
pub mod weights;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kjob_queue_client::{QueueClient, RetryPolicy};
use kjob_svc::{AdminServer, AdminState, KubeClientArgs, Shutdown};
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, watch};

use crate::cache::{JobInfo, PodInfo};
use crate::handlers::{Enqueue, HandlerConfig};
use crate::informer::{Informer, map_event};
use crate::leader::{LeaderElector, LeaseConfig};
use crate::metrics::{KindLabels, Metrics, OutcomeLabels};

pub use config::{Args, WatchEncoding};

/// Everything `run` needs, already parsed.
#[derive(Debug, Clone)]
pub struct WatcherConfig {
    /// kjob-queue gRPC URL, e.g. `http://127.0.0.1:50051`.
    pub queue_url: String,
    /// How to reach kjob-queue (mTLS for `https://`, or plaintext when allowed).
    pub queue_tls: kjob_queue_client::QueueTlsArgs,
    /// The key that seals the view entries this watcher writes.
    pub view_key: kjob_svc::ViewKeyArgs,
    /// `spec.managedBy` value this controller owns.
    pub controller_name: String,
    /// Also take Jobs without managedBy.
    pub manage_all: bool,
    /// Watch only this namespace (all namespaces when `None`).
    pub namespace: Option<String>,
    /// Leader election.
    pub lease: LeaseConfig,
    /// Interval of the "enqueue every managed Job" resync.
    pub resync_period: Duration,
    /// How pods are listed and watched.
    pub watch_encoding: WatchEncoding,
    /// Kube client flags.
    pub kube: KubeClientArgs,
}

/// The sockets a watcher serves on (its admin port only), bound by the caller.
pub type Listeners = kjob_svc::AdminListeners;

/// Errors that end the watcher.
#[derive(Debug, thiserror::Error)]
pub enum WatcherError {
    /// Bad settings.
    #[error(transparent)]
    Leader(#[from] leader::LeaderError),
    /// The queue URL is unusable.
    #[error("queue client: {0}")]
    Queue(#[from] kjob_queue_client::ClientError),
    /// A watch stream ended, which kube-runtime's watcher never does on its own.
    #[error("the {0} watch stream ended")]
    StreamEnded(&'static str),
    /// The sender task is gone, so nothing can be delivered.
    #[error("the sender stopped unexpectedly")]
    SenderGone,
    /// Buffered items could not be delivered at shutdown.
    #[error(transparent)]
    Send(#[from] sender::SendError),
    /// A task panicked.
    #[error("task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// Runs the watcher until `shutdown`: serves the admin port, elects a leader, and while leading
/// turns Job/Pod events into kjob-queue Adds. On shutdown it stops watching, flushes what is
/// buffered (bounded by [`sender::DRAIN_TIMEOUT`]) and releases the Lease; the admin port
/// answers until the end.
pub async fn run(
    listeners: Listeners,
    config: WatcherConfig,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    // Exported at zero from the start, so dashboards and alerts find the series before the
    // first finished Job.
    for outcome in ["sent", "settled"] {
        metrics.orphan_rechecks.get_or_create(&OutcomeLabels { outcome }).inc_by(0);
    }
    let admin_addr = match &listeners.admin {
        Some(l) => l.local_addr()?.to_string(),
        None => "none".into(),
    };
    // The watcher proper, between the admin port's start and stop.
    kjob_svc::with_admin(listeners.admin, registry, async move |admin: &mut AdminServer| {
        let WatcherConfig {
            queue_url,
            queue_tls,
            view_key,
            controller_name,
            manage_all,
            namespace,
            lease,
            resync_period,
            watch_encoding,
            kube,
        } = config;
        lease.validate()?;
        let view_key = view_key.key(queue_tls.insecure_no_auth)?;
        let client = kube.client().await.context("building the kube client")?;
        let identity = &lease.identity;
        tracing::info!(%identity, admin = %admin_addr, %queue_url, "kjob-watcher starting");
        // Retries happen in the sender, which counts them and bounds them at shutdown.
        let queue =
            queue_tls.connect_lazy(&queue_url)?.with_retry_policy(RetryPolicy::no_retries());
        let (tx, rx) = sender::channel();
        let queue_ok = Arc::new(AtomicBool::new(false));
        let view_lost = Arc::new(tokio::sync::Notify::new());
        let sender_task = tokio::spawn(sender::run_sender(
            rx,
            queue.clone(),
            metrics.clone(),
            queue_ok.clone(),
            view_lost.clone(),
            view_key,
            shutdown.clone(),
        ));

        // Namespace weights go beside the Adds, on their own task: rare, whole-set replacements
        // that must never wait behind (or hold up) a batch of enqueues.
        let (weights_tx, weights_rx) = watch::channel(None);
        let pusher_stop = Shutdown::new();
        let pusher_task = tokio::spawn(weights::run_pusher(
            queue.clone().with_retry_policy(WEIGHTS_RETRY),
            weights_rx,
            pusher_stop.clone(),
        ));

        let (leading_tx, leading_rx) = watch::channel(false);
        let elector_stop = Shutdown::new();
        let elector = LeaderElector::new(client.clone(), lease.clone(), metrics.clone());
        let elector_task = tokio::spawn(elector.run(leading_tx, elector_stop.clone()));

        let synced = Arc::new(AtomicBool::new(false));
        let readiness_stop = Shutdown::new();
        let readiness_task = tokio::spawn(readiness_loop(
            admin.state().clone(),
            queue,
            synced.clone(),
            queue_ok,
            leading_rx.clone(),
            readiness_stop.clone(),
        ));

        let cfg = HandlerConfig { controller_name, manage_all };
        // Unique per process: the Lease identity is the pod name, which a restarted pod reuses.
        let started_ms = jiff::Timestamp::now().as_millisecond();
        let view_identity = format!("{}-{started_ms}", lease.identity);
        let loop_result = event_loop(
            client,
            cfg,
            View { identity: view_identity, lost: view_lost },
            namespace,
            resync_period,
            watch_encoding,
            tx,
            weights_tx,
            leading_rx,
            synced,
            metrics,
            shutdown.clone(),
        )
        .await;
        pusher_stop.cancel();
        pusher_task.await?;
        if loop_result.is_err() {
            // Nothing more will be produced; let the sender flush and stop.
            shutdown.cancel();
        }
        // The channel is closed now (the loop owned the only sender): flush, then hand the Lease
        // back, so a new leader never runs while our last items are still in flight.
        let send_result = sender_task.await?;
        elector_stop.cancel();
        elector_task.await?;
        readiness_stop.cancel();
        readiness_task.await?;
        shutdown.cancel();
        loop_result?;
        send_result?;
        Ok(())
    })
    .await?;
    tracing::info!("kjob-watcher stopped");
    Ok(())
}

/// Retries of one weights update: a few, with the client's backoff; a set that still fails
/// waits for the next change or resync rather than retrying forever.
const WEIGHTS_RETRY: RetryPolicy = RetryPolicy {
    initial_backoff: Duration::from_millis(100),
    max_backoff: Duration::from_secs(5),
    max_retries: Some(5),
};

/// How often readiness is re-evaluated (and, when leading, the queue probed).
const READINESS_INTERVAL: Duration = Duration::from_secs(2);

/// Ready once the caches are synced and, while leading, kjob-queue answers.
async fn readiness_loop(
    admin: AdminState,
    queue: QueueClient,
    synced: Arc<AtomicBool>,
    queue_ok: Arc<AtomicBool>,
    leading: watch::Receiver<bool>,
    stop: Shutdown,
) {
    kjob_svc::probe_readiness(&admin, "caches and queue", READINESS_INTERVAL, &stop, || async {
        let is_leader = *leading.borrow();
        if is_leader {
            queue_ok.store(queue.answers().await, Ordering::Relaxed);
        }
        synced.load(Ordering::Relaxed) && (!is_leader || queue_ok.load(Ordering::Relaxed))
    })
    .await;
}

/// A failed list or watch of either encoding (the stream retries it with backoff).
type StreamError = Box<dyn std::error::Error + Send + Sync>;

/// The shared view's settings for the event loop.
struct View {
    /// Unique per process: session ids are `identity-<n>`.
    identity: String,
    /// Poked by the sender when kjob-queue's Redis lost the session.
    lost: Arc<tokio::sync::Notify>,
}

/// The informer loop: Jobs first, Pods once the Job list is complete; leadership changes and
/// the resync timer in the same loop, so every decision sees one consistent store.
#[allow(clippy::too_many_arguments)]
async fn event_loop(
    client: kube::Client,
    cfg: HandlerConfig,
    view: View,
    namespace: Option<String>,
    resync_period: Duration,
    watch_encoding: WatchEncoding,
    tx: mpsc::Sender<Enqueue>,
    weights_tx: watch::Sender<weights::Published>,
    mut leading: watch::Receiver<bool>,
    synced_flag: Arc<AtomicBool>,
    metrics: Metrics,
    shutdown: Shutdown,
) -> Result<(), WatcherError> {
    // Jobs in JSON, decoded lean: managedFields are skipped while parsing (the view keeps the
    // whole Job, which the worker creates pods from).
    let jobs_api: Api<view::WatchedJob> = match &namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let mut jobs = watcher(jobs_api, watcher::Config::default())
        .default_backoff()
        .map(|r| r.map(|ev| map_event(ev, |j| JobInfo::from_job(&j.into_job()))))
        .boxed();
    // Namespaces, for their queue weights; not when watching one namespace, where there is
    // nobody to be fair to (and the watcher may lack the cluster-wide permission).
    let mut namespaces = match &namespace {
        Some(_) => futures::stream::pending().boxed(),
        None => watcher(Api::<Namespace>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .map(|r| r.map(|ev| map_event(ev, |n| weights::NamespaceWeight::from_namespace(&n))))
            .boxed(),
    };
    // PriorityClasses, for the priority each Job enqueue carries (cluster-scoped: watched in
    // every mode).
    let mut priority_classes =
        watcher(Api::<PriorityClass>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .map(|r| r.map(|ev| map_event(ev, |c| priority::ClassInfo::from_class(&c))))
            .boxed();
    // Pods, most of the events: each is decoded straight into what the watcher keeps (the
    // handlers' metadata, and what syncJob reads for the view), so the store never holds whole
    // pods; in protobuf by default, as kube-controller-manager's informers.
    let pod_info = |ev| map_event(ev, PodInfo::from_watched);
    let mut pods = match watch_encoding {
        WatchEncoding::Protobuf => pod_watch::watch_pods(client, namespace.as_deref(), true)
            .default_backoff()
            .map(|r| r.map(pod_info).map_err(StreamError::from))
            .boxed(),
        WatchEncoding::Json => {
            let pods_api: Api<view::WatchedPod> = match &namespace {
                Some(ns) => Api::namespaced(client, ns),
                None => Api::all(client),
            };
            watcher(pods_api, watcher::Config::default())
                .default_backoff()
                .map(|r| r.map(pod_info).map_err(StreamError::from))
                .boxed()
        }
    };
    let mut ns_weights = weights::NamespaceWeights::default();
    let mut classes = priority::PriorityClasses::default();
    // Sends the whole set of weights (once the Namespaces are listed): kjob-queue replaces its
    // set with it, so a resend after a Redis wipe or a missed update repairs it.
    let publish = |w: &weights::NamespaceWeights| {
        if w.synced() {
            weights_tx.send_replace(Some(Arc::new(w.weights().clone())));
        }
    };
    let View { identity, lost: view_lost } = view;
    let mut informer = Informer::new(cfg, metrics.clone()).with_view(identity);
    let mut resync = tokio::time::interval_at(
        tokio::time::Instant::now() + resync_period.max(Duration::from_millis(10)),
        resync_period.max(Duration::from_millis(10)),
    );
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut is_leader = *leading.borrow_and_update();
    // Set when leadership was gained: every Job is enqueued once the caches are synced.
    let mut takeover_pending = is_leader;
    // Orphan entries of Jobs that just finished, waiting for their pods' finalizer removals.
    let mut settling = settle::Settling::default();
    let restart = |kind: &'static str, e: &dyn std::fmt::Display| {
        metrics.watch_restarts.get_or_create(&KindLabels { kind }).inc();
        tracing::warn!(kind, error = %e, "watch failed; retrying with backoff");
    };
    loop {
        // Unbiased: a busy Job stream must not starve the Pod stream (or the reverse).
        let mut out = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            changed = leading.changed() => {
                if changed.is_err() {
                    // The elector is gone (it only stops after this loop): wait for shutdown.
                    shutdown.cancelled().await;
                    return Ok(());
                }
                let now_leader = *leading.borrow_and_update();
                if now_leader && !is_leader {
                    takeover_pending = true;
                    // A new leader's weights may be newer than what the last one sent.
                    publish(&ns_weights);
                }
                is_leader = now_leader;
                vec![]
            }
            _ = view_lost.notified() => {
                // kjob-queue's Redis lost the session (wiped, restarted or failed over): end it
                // so a new one begins below, with a fresh snapshot. The same loss may have taken
                // queued keys, delayed requeues and the orphan queue with it: enqueue every Job
                // and point out every cached pod that still needs its finalizer removed, as a
                // takeover does, rather than waiting for the periodic resync.
                takeover_pending = is_leader;
                informer.end_view()
            }
            _ = resync.tick() => {
                if is_leader {
                    publish(&ns_weights);
                }
                if is_leader && informer.synced() {
                    tracing::debug!(jobs = informer.store().job_count(), "periodic resync");
                    informer.resync()
                } else {
                    vec![]
                }
            }
            _ = tokio::time::sleep_until(
                settling.next_due().unwrap_or_else(|| tokio::time::Instant::now() + resync_period)
            ), if settling.len() > 0 => {
                let due = settling.take_due(tokio::time::Instant::now());
                let mut out = Vec::new();
                for (key, uid) in due {
                    // A watcher that stopped leading leaves them to the next leader's takeover,
                    // which points out every finished Job's pod that kept its finalizer.
                    let entry = if is_leader {
                        handlers::recheck_settled(informer.store(), &key, &uid)
                    } else {
                        None
                    };
                    let outcome = if entry.is_some() { "sent" } else { "settled" };
                    metrics.orphan_rechecks.get_or_create(&OutcomeLabels { outcome }).inc();
                    out.extend(entry);
                }
                out
            }
            ev = jobs.next() => match ev {
                Some(Ok(ev)) => informer.job_event(ev, is_leader, jiff::Timestamp::now()),
                Some(Err(e)) => { restart("job", &e); vec![] }
                None => return Err(WatcherError::StreamEnded("job")),
            },
            ev = priority_classes.next() => match ev {
                Some(Ok(ev)) => { classes.apply(ev); vec![] }
                Some(Err(e)) => { restart("priorityclass", &e); vec![] }
                None => return Err(WatcherError::StreamEnded("priorityclass")),
            },
            ev = namespaces.next() => match ev {
                Some(Ok(ev)) => {
                    if ns_weights.apply(ev) && is_leader {
                        publish(&ns_weights);
                    }
                    vec![]
                }
                Some(Err(e)) => { restart("namespace", &e); vec![] }
                None => return Err(WatcherError::StreamEnded("namespace")),
            },
            ev = pods.next(), if informer.jobs_synced() => match ev {
                Some(Ok(ev)) => informer.pod_event(ev, is_leader),
                Some(Err(e)) => { restart("pod", &e); vec![] }
                None => return Err(WatcherError::StreamEnded("pod")),
            },
        };
        let now = tokio::time::Instant::now();
        out.retain(|e| {
            if !e.settle {
                return true;
            }
            if let Some(pod) = informer.store().pod(&e.key) {
                settling.push(now + handlers::ORPHAN_SETTLE, e.key.clone(), pod.uid.clone());
            }
            false
        });
        // The shared view: a session while leading with synced caches (begun after a takeover
        // and after every relist), ended when leadership is lost.
        if informer.view_wanted(is_leader) && !informer.view_active() {
            out.extend(informer.begin_view());
        } else if !is_leader && informer.view_active() {
            out.extend(informer.end_view());
        }
        // After the view's snapshot, so the syncs it starts read a committed view.
        if takeover_pending && is_leader && informer.synced() {
            takeover_pending = false;
            tracing::info!(
                jobs = informer.store().job_count(),
                pods = informer.store().pod_count(),
                "leading: enqueueing every Job and the cached pods' orphan cleanups"
            );
            out.extend(informer.take_over());
        }
        synced_flag.store(informer.synced(), Ordering::Relaxed);
        // Every enqueue of a cached Job carries its pods' priority, as the classes say now: a
        // changed PriorityClass reaches a Job with its next enqueue.
        for e in out.iter_mut().filter(|e| e.queue == kjob_core::JOB_QUEUE && !e.observe_only) {
            e.priority = informer.store().job(&e.key).and_then(|j| classes.of(j));
        }
        for item in out {
            tokio::select! {
                // Backpressure: a full buffer holds the watch streams here.
                r = tx.send(item) => r.map_err(|_| WatcherError::SenderGone)?,
                _ = shutdown.cancelled() => return Ok(()),
            }
        }
    }
}
