//! The lease loop: lease keys in batches, run up to `concurrency` syncs at once, renew long
//! syncs, and finish every lease with exactly one Done.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kjob_core::JOB_QUEUE;
use kjob_queue_client::{ClientError, Outcome, QueueClient, v1};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::metrics::{Metrics, OutcomeLabels};
use crate::sync::BACKOFF_RECORD;
use crate::worker::{SyncOutcome, Worker};

/// Long-poll wait of one Lease call: long enough to keep idle workers quiet, short enough that
/// a lost connection is noticed soon.
const LEASE_WAIT: Duration = Duration::from_secs(5);
/// Pause after a failed Lease call, doubled up to [`LEASE_ERROR_BACKOFF_MAX`].
const LEASE_ERROR_BACKOFF: Duration = Duration::from_millis(200);
/// Longest pause between failed Lease calls.
const LEASE_ERROR_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// A lease is treated as lost locally this long before its deadline (at most a tenth of the
/// lease) when renewals keep failing, so a worker cut off from the queue stops writing before
/// another worker can take the key.
const RENEW_SAFETY_MARGIN: Duration = Duration::from_millis(500);
/// After the shutdown grace, a sync gets this long to wind down (no new pod calls, one status
/// write) before it is dropped outright.
const WIND_DOWN_LIMIT: Duration = Duration::from_secs(10);

/// Settings of one lease loop.
#[derive(Debug, Clone)]
pub struct LeaseSettings {
    /// Queue name.
    pub queue: &'static str,
    /// Syncs in flight at once.
    pub concurrency: usize,
    /// Lease duration asked for (and renewed at a third of it).
    pub lease: Duration,
    /// Identity shown by the queue's Inspect.
    pub worker_id: String,
    /// How long in-flight syncs may run after shutdown before being handed back.
    pub shutdown_grace: Duration,
}

/// Leases keys of `settings.queue` and syncs them until `shutdown`, then drains.
pub async fn lease_loop(
    worker: Arc<Worker>,
    queue: QueueClient,
    settings: LeaseSettings,
    shutdown: CancellationToken,
) {
    let concurrency = settings.concurrency.max(1);
    let permits = Arc::new(Semaphore::new(concurrency));
    let hand_back = CancellationToken::new();
    let mut tasks = JoinSet::new();
    let mut backoff = LEASE_ERROR_BACKOFF;
    let labels = Metrics::queue(settings.queue);
    loop {
        reap(&mut tasks);
        // Wait for a free slot first: leasing keys nobody can work on would only let them expire.
        let first = tokio::select! {
            _ = shutdown.cancelled() => break,
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
        };
        let mut slots = vec![first];
        while let Ok(p) = permits.clone().try_acquire_owned() {
            slots.push(p);
        }
        let asked = u32::try_from(slots.len()).unwrap_or(u32::MAX);
        // Shutdown abandons a waiting Lease call so the drain starts at once. Should the server
        // have leased keys in that instant, they come back when their lease expires: late,
        // never lost.
        let lease = async {
            if settings.queue == JOB_QUEUE {
                let records = [BACKOFF_RECORD];
                queue
                    .lease_with_views(
                        settings.queue,
                        asked,
                        settings.lease,
                        LEASE_WAIT,
                        &settings.worker_id,
                        &records,
                    )
                    .await
            } else {
                queue
                    .lease(settings.queue, asked, settings.lease, LEASE_WAIT, &settings.worker_id)
                    .await
            }
        };
        let res = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = lease => r,
        };
        let items = match res {
            Ok(items) => {
                backoff = LEASE_ERROR_BACKOFF;
                items
            }
            Err(e) => {
                tracing::warn!(queue = settings.queue, error = %e, ?backoff, "lease failed; retrying");
                drop(slots);
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(LEASE_ERROR_BACKOFF_MAX);
                continue;
            }
        };
        let now_ms = unix_ms();
        for item in items {
            let Some(slot) = slots.pop() else {
                // The server never returns more than asked; hand back anything extra.
                tracing::error!(key = item.key, "lease returned more keys than asked");
                finish(&queue, settings.queue, &item, Outcome::RequeueAfter(Duration::ZERO)).await;
                continue;
            };
            worker.metrics.leases_held.get_or_create(&labels).inc();
            let wait_s = (now_ms - item.enqueued_unix_ms).max(0) as f64 / 1000.0;
            worker.metrics.lease_wait.get_or_create(&labels).observe(wait_s);
            if shutdown.is_cancelled() {
                hand_back_now(&worker, &queue, settings.queue, &item).await;
                drop(slot);
                continue;
            }
            let span = tracing::info_span!("sync", queue = settings.queue, key = %item.key);
            tasks.spawn(
                process(
                    worker.clone(),
                    queue.clone(),
                    settings.clone(),
                    item,
                    slot,
                    hand_back.clone(),
                )
                .instrument(span),
            );
        }
    }
    drain(tasks, hand_back, settings.shutdown_grace, settings.queue).await;
}

/// Waits for in-flight syncs up to `grace`, then asks the rest to hand their keys back.
async fn drain(mut tasks: JoinSet<()>, hand_back: CancellationToken, grace: Duration, queue: &str) {
    let in_flight = tasks.len();
    if in_flight > 0 {
        tracing::info!(queue, in_flight, ?grace, "draining in-flight syncs");
    }
    let all_done = async {
        while let Some(r) = tasks.join_next().await {
            log_join(r);
        }
    };
    if tokio::time::timeout(grace, all_done).await.is_err() {
        tracing::warn!(queue, remaining = tasks.len(), "shutdown grace over; handing keys back");
        hand_back.cancel();
        while let Some(r) = tasks.join_next().await {
            log_join(r);
        }
    }
}

fn reap(tasks: &mut JoinSet<()>) {
    while let Some(r) = tasks.try_join_next() {
        log_join(r);
    }
}

fn log_join(r: Result<(), tokio::task::JoinError>) {
    if let Err(e) = r {
        // A panicking sync loses its Done; the lease expires and the key comes back.
        tracing::error!(error = %e, "sync task failed");
    }
}

/// How one lease ended, for logs and metrics.
enum Ending {
    Finished(Outcome),
    LeaseLost,
    HandedBack,
}

/// Runs one sync with its renewer and finishes the lease.
async fn process(
    worker: Arc<Worker>,
    queue: QueueClient,
    settings: LeaseSettings,
    mut item: v1::LeasedItem,
    _slot: OwnedSemaphorePermit,
    hand_back: CancellationToken,
) {
    let qname = settings.queue;
    let view = item.view.take();
    let mut write_back = None;
    let ending = {
        let sync = worker.sync_leased(qname, &item.key, view, &hand_back, &mut write_back);
        let renew = renew_until_lost(&worker, &queue, qname, &item, settings.lease);
        let hard_stop = async {
            hand_back.cancelled().await;
            tokio::time::sleep(WIND_DOWN_LIMIT).await;
        };
        tokio::select! {
            r = sync => Ending::Finished(match r {
                Ok(SyncOutcome::Done) => Outcome::Forget,
                Ok(SyncOutcome::RequeueAfter(d)) => Outcome::RequeueAfter(d),
                Err(e) => {
                    tracing::warn!(error = %e, "sync failed; requeueing with backoff");
                    Outcome::RateLimited
                }
            }),
            // Dropping the sync future stops every write it had in flight or planned.
            () = renew => Ending::LeaseLost,
            // A sync that cannot wind down in time is dropped; its key is handed back as is.
            () = hard_stop => Ending::HandedBack,
        }
    };
    let outcome_label = match &ending {
        Ending::Finished(Outcome::Forget) => "forget",
        Ending::Finished(Outcome::RateLimited) => "rate_limited",
        Ending::Finished(Outcome::RequeueAfter(_)) => "requeue_after",
        Ending::LeaseLost => "lease_lost",
        Ending::HandedBack => "handed_back",
    };
    match ending {
        Ending::Finished(outcome) => {
            finish_writing_back(&queue, qname, &item, outcome, write_back).await
        }
        Ending::HandedBack => {
            finish(&queue, qname, &item, Outcome::RequeueAfter(Duration::ZERO)).await
        }
        Ending::LeaseLost => tracing::warn!("lease lost; sync abandoned"),
    }
    worker.metrics.leases_held.get_or_create(&Metrics::queue(qname)).dec();
    worker
        .metrics
        .leases_finished
        .get_or_create(&OutcomeLabels { queue: qname.to_string(), outcome: outcome_label.into() })
        .inc();
}

/// Keys leased while shutting down go straight back.
async fn hand_back_now(worker: &Worker, queue: &QueueClient, qname: &str, item: &v1::LeasedItem) {
    finish(queue, qname, item, Outcome::RequeueAfter(Duration::ZERO)).await;
    worker.metrics.leases_held.get_or_create(&Metrics::queue(qname)).dec();
    worker
        .metrics
        .leases_finished
        .get_or_create(&OutcomeLabels { queue: qname.to_string(), outcome: "handed_back".into() })
        .inc();
}

/// Sends the one Done of a lease. A refused Done means the lease expired meanwhile; the key is
/// then back in the queue already, so there is nothing more to do.
async fn finish(queue: &QueueClient, qname: &str, item: &v1::LeasedItem, outcome: Outcome) {
    finish_writing_back(queue, qname, item, outcome, None).await
}

/// [`finish`] that writes the sync's last Job object back into the shared view first, in the
/// same call.
async fn finish_writing_back(
    queue: &QueueClient,
    qname: &str,
    item: &v1::LeasedItem,
    outcome: Outcome,
    write_back: Option<v1::PutJobViewRequest>,
) {
    match queue.done_writing_back(qname, &item.key, &item.lease_id, outcome, write_back).await {
        Ok(_) => tracing::debug!(?outcome, "lease done"),
        Err(ClientError::LeaseLost(msg)) => {
            tracing::warn!(?outcome, %msg, "done refused: the lease had expired")
        }
        Err(e) => tracing::warn!(?outcome, error = %e, "done failed; the lease will expire"),
    }
}

/// Renews the lease every third of its duration; returns once it is lost (refused, or not
/// renewed in time).
async fn renew_until_lost(
    worker: &Worker,
    queue: &QueueClient,
    qname: &str,
    item: &v1::LeasedItem,
    lease: Duration,
) {
    let period = (lease / 3).max(Duration::from_millis(50));
    let margin = RENEW_SAFETY_MARGIN.min(lease / 10);
    // The server's deadline is on the Redis clock; keep a local monotonic one instead.
    let mut deadline = Instant::now() + lease;
    loop {
        let local_expiry = deadline.checked_sub(margin).unwrap_or(deadline);
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = tokio::time::sleep_until(local_expiry) => {
                worker.metrics.renew_failures.get_or_create(&Metrics::queue(qname)).inc();
                tracing::warn!("lease could not be renewed before its deadline");
                return;
            }
        }
        let asked_at = Instant::now();
        let renew = queue.renew(qname, &item.key, &item.lease_id, lease);
        let res = tokio::select! {
            r = renew => r,
            _ = tokio::time::sleep_until(local_expiry) => Err(ClientError::Unavailable("renew timed out".into())),
        };
        match res {
            Ok(_) => deadline = asked_at + lease,
            Err(ClientError::LeaseLost(msg)) => {
                worker.metrics.renew_failures.get_or_create(&Metrics::queue(qname)).inc();
                tracing::warn!(%msg, "renew refused");
                return;
            }
            Err(e) => {
                worker.metrics.renew_failures.get_or_create(&Metrics::queue(qname)).inc();
                tracing::warn!(error = %e, "renew failed; will retry");
            }
        }
    }
}

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
