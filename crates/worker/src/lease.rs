//! The lease loop: lease keys in batches, run up to `concurrency` syncs at once, renew long
//! syncs, and finish every lease with exactly one Done.
//!
//! A finished sync leaves its Done with the loop (see [`Carry`]), and the Lease call that
//! refills the freed slot carries it: one call instead of two per sync. A sync that ends while
//! a Lease call is in flight waits for its answer only when it is expected soon (the previous
//! call found keys for every slot) and at most [`CARRY_HOLD`]; during a long poll it sends its
//! own Done at once, so a finished lease is never held back for long.
//!
//! The loop meets the queue service through [`LeaseSource`] and the syncs through [`Syncer`]
//! ([`QueueClient`] and `Worker` in the service): it parses each leased key once, hands the
//! sync a [`LeasedJob`] and makes the Done of the [`SyncResult`] it returns, knowing nothing
//! of how a sync works. Its timing (renew margin, shutdown grace,
//! wind-down) is tested on tokio's paused clock without a process.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::FutureExt;
use kjob_core::{MAX_DONE_BATCH, ObjectKey};
use kjob_queue_client::{
    ClientError, Done, FinalizerRemovals, JobView, LeaseCall, Leased, Outcome, QueueClient,
    SetExpectations, ViewWriteBack,
};
use kjob_svc::{Backoff, Shutdown};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::context::{LeasedJob, Owed, SyncOutcome, SyncResult};
use crate::metrics::{Metrics, OutcomeLabels};

/// Long-poll wait of one Lease call: long enough to keep idle workers quiet, short enough that
/// a lost connection is noticed soon.
const LEASE_WAIT: Duration = Duration::from_secs(5);
/// Pause after a failed Lease call: 200 ms, doubled up to 5 s.
const LEASE_ERROR_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
/// A lease is treated as lost locally this long before its deadline (at most a tenth of the
/// lease) when renewals keep failing, so a worker cut off from the queue stops writing before
/// another worker can take the key.
const RENEW_SAFETY_MARGIN: Duration = Duration::from_millis(500);
/// Longest a finished sync's Done waits for the Lease call in flight to answer so that it can
/// ride the next one; past it the Done goes on its own. A Lease answers in milliseconds when
/// keys are ready, so only a long poll or a struggling server outlasts it.
const CARRY_HOLD: Duration = Duration::from_millis(50);
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
    /// Bring each leased key's shared view with these per-Job records (Job queue only;
    /// `None`: no views).
    pub view_records: Option<&'static [&'static str]>,
    /// With `view_records`: the worker's cache of decoded views, whose most recently used a
    /// Lease names so that their views come as deltas (`None`: views come whole).
    pub view_cache: Option<std::sync::Arc<crate::view_cache::ViewCache>>,
}

/// What a lease's Done writes before it ends the lease (Job queue only).
#[derive(Debug, Clone, Default)]
pub struct WriteBack {
    /// The Job object the sync wrote last, for the shared view.
    pub view: Option<ViewWriteBack>,
    /// The expectations the sync raised after creating pods (see [`Raised`]).
    pub expectations: Option<SetExpectations>,
    /// The finalizer removals the sync expects after making them (see [`Raised`]).
    pub removals: Option<FinalizerRemovals>,
    /// Why the sync failed (empty when it did not), for the key's history in kjob-queue.
    pub error: String,
}

/// A lease whose sync has ended, waiting for its Done.
#[derive(Debug, Clone)]
pub struct Finished {
    /// The leased key (its view already taken).
    pub item: Leased,
    /// How the lease ends.
    pub outcome: Outcome,
    /// The Job object to write into the shared view first.
    pub back: WriteBack,
}

impl Finished {
    /// At least the bytes its Done takes in a request: the Job written back, the pod UIDs
    /// of its expectations and removals, and a generous allowance for the rest.
    pub fn wire_bytes(&self) -> usize {
        let uids = |v: &[String]| v.iter().map(|u| u.len() + 6).sum::<usize>();
        let back = &self.back;
        1024 + self.item.key.len()
            + back.view.as_ref().map_or(0, |v| v.job.len() + v.job_uid.len() + 64)
            + back.expectations.as_ref().map_or(0, |e| uids(&e.created_pod_uids))
            + back.removals.as_ref().map_or(0, |r| uids(&r.pod_uids))
    }
}

/// Most bytes of Dones one Lease call carries: half of kjob-queue's request limit, so the
/// call stays within it with room to spare; the rest go on their own.
const MAX_CARRIED_BYTES: usize = kjob_core::MAX_REQUEST_BYTES / 2;

/// A call to the queue service.
pub trait Call<T>: Future<Output = Result<T, ClientError>> + Send {}
impl<T, F: Future<Output = Result<T, ClientError>> + Send> Call<T> for F {}

/// One sync of a leased key.
pub trait SyncFuture: Future<Output = SyncResult> + Send {}
impl<F: Future<Output = SyncResult> + Send> SyncFuture for F {}

/// The queue service as the lease loop uses it.
pub trait LeaseSource: Clone + Send + Sync + 'static {
    /// Finishes the leases of `finished` (each as [`Self::done`] would), then leases up to
    /// `max_items` keys of `settings.queue`, waiting up to [`LEASE_WAIT`] for the first, in one
    /// call. Returns the leased keys.
    fn lease(
        &self,
        settings: &LeaseSettings,
        max_items: u32,
        finished: &[Finished],
    ) -> impl Call<Vec<Leased>>;
    /// Extends the lease of `item` by `lease`.
    fn renew(&self, queue: &str, item: &Leased, lease: Duration) -> impl Call<()>;
    /// Finishes the lease of `item` with `end`, writing `back` into the Job's view first.
    fn done(&self, q: &str, item: &Leased, end: Outcome, back: WriteBack) -> impl Call<()>;
}

impl LeaseSource for QueueClient {
    /// Job keys come with their shared view (and the backoff record), so most syncs plan
    /// without another call.
    fn lease(
        &self,
        settings: &LeaseSettings,
        max_items: u32,
        finished: &[Finished],
    ) -> impl Call<Vec<Leased>> {
        let LeaseSettings { queue, lease, worker_id, view_records, view_cache, .. } = settings;
        let cached = view_cache
            .as_ref()
            .filter(|c| c.enabled() && view_records.is_some())
            .map(|c| c.cached_views(crate::view_cache::LEASE_CACHED_VIEWS));
        let dones = finished
            .iter()
            .map(|f| done_writing(queue, &f.item, f.outcome, f.back.clone()))
            .collect();
        let ends: Vec<Outcome> = finished.iter().map(|f| f.outcome).collect();
        async move {
            let call = LeaseCall {
                queue,
                max_items,
                lease: *lease,
                wait: LEASE_WAIT,
                worker_id,
                records: *view_records,
                cached: cached.as_deref(),
            };
            let (items, results) = self.lease_finishing(call, dones).await?;
            for (outcome, r) in ends.into_iter().zip(results) {
                log_done(outcome, r.map(drop));
            }
            Ok(items)
        }
    }

    fn renew(&self, queue: &str, item: &Leased, lease: Duration) -> impl Call<()> {
        QueueClient::renew(self, queue, &item.key, &item.lease_id, lease).map(|r| r.map(drop))
    }

    fn done(&self, q: &str, item: &Leased, end: Outcome, back: WriteBack) -> impl Call<()> {
        let request = done_writing(q, item, end, back);
        async move { self.done_as(&request).await.map(drop) }
    }
}

/// The Done of `item` with what the sync writes first.
fn done_writing(queue: &str, item: &Leased, end: Outcome, back: WriteBack) -> Done {
    Done {
        view_write_back: back.view,
        expectations: back.expectations,
        finalizer_removals: back.removals,
        error: back.error,
        ..Done::new(queue, &item.key, &item.lease_id, end)
    }
}

/// What the lease loop runs for each leased key.
pub trait Syncer: Send + Sync + 'static {
    /// Syncs `job` of `queue`; once `wind_down` fires it makes no more pod calls.
    fn run(&self, queue: &str, job: LeasedJob, wind_down: &Shutdown) -> impl SyncFuture;
    /// Where the loop counts leases and renewals.
    fn metrics(&self) -> &Metrics;
}

/// Leases keys of `settings.queue` and syncs them until `shutdown`, then drains.
pub async fn lease_loop<S: Syncer, Q: LeaseSource>(
    worker: Arc<S>,
    queue: Q,
    settings: LeaseSettings,
    shutdown: CancellationToken,
) {
    let concurrency = settings.concurrency.max(1);
    let permits = Arc::new(Semaphore::new(concurrency));
    let hand_back = CancellationToken::new();
    let mut tasks = JoinSet::new();
    let mut failures = 0u32;
    let labels = Metrics::queue(settings.queue);
    let carry = Arc::new(Carry::default());
    // Dones handed to a Lease call that was abandoned at shutdown: maybe not applied.
    let mut unsure = Vec::new();
    // The last Lease call filled every slot it asked for: more keys are likely ready, so the
    // next call should answer at once rather than long-poll.
    let mut backlog = false;
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
        let Start { carried: finished, overflow, hold } = carry.start_lease(backlog);
        if !overflow.is_empty() {
            tokio::spawn(finish_all(queue.clone(), settings.queue, overflow));
        }
        let res = {
            let lease = queue.lease(&settings, asked, &finished);
            tokio::pin!(lease);
            // Dones of syncs ending meanwhile wait for this call's answer and ride the next
            // one, unless it is still out after CARRY_HOLD (a long poll, or a slow server).
            let give_up = tokio::time::sleep(CARRY_HOLD);
            tokio::pin!(give_up);
            let mut holding = hold;
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break None,
                    r = &mut lease => break Some(r),
                    () = &mut give_up, if holding => {
                        holding = false;
                        let held = carry.stop_holding();
                        if !held.is_empty() {
                            tokio::spawn(finish_all(queue.clone(), settings.queue, held));
                        }
                    }
                }
            }
        };
        let Some(res) = res else {
            unsure = finished;
            break;
        };
        carry.end_lease();
        let items = match res {
            Ok(items) => {
                failures = 0;
                backlog = items.len() >= slots.len();
                let carried = worker.metrics().dones_carried.get_or_create(&labels);
                carried.inc_by(finished.len() as u64);
                items
            }
            Err(e) => {
                // Applied or not, they go again on their own (a repeat comes back stale), with
                // those held for this call; until the next call every Done goes on its own.
                let mut all = finished;
                all.extend(carry.pause());
                tokio::spawn(finish_all(queue.clone(), settings.queue, all));
                backlog = false;
                let backoff = LEASE_ERROR_BACKOFF.delay(failures);
                tracing::warn!(queue = settings.queue, error = %e, ?backoff, "lease failed; retrying");
                drop(slots);
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
                carry.end_lease();
                failures = failures.saturating_add(1);
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
            worker.metrics().leases_held.get_or_create(&labels).inc();
            let wait_s = (now_ms - item.enqueued_unix_ms).max(0) as f64 / 1000.0;
            worker.metrics().lease_wait.get_or_create(&labels).observe(wait_s);
            if shutdown.is_cancelled() {
                hand_back_now(worker.metrics(), &queue, settings.queue, &item).await;
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
                    carry.clone(),
                )
                .instrument(span),
            );
        }
    }
    // From here every sync sends its own Done; what was waiting for a Lease goes now.
    unsure.extend(carry.close());
    finish_all(queue.clone(), settings.queue, unsure).await;
    drain(tasks, hand_back, settings.shutdown_grace, settings.queue).await;
}

/// How a Lease call starts (see [`Carry::start_lease`]).
struct Start {
    /// The Dones it carries (at most [`MAX_DONE_BATCH`]).
    carried: Vec<Finished>,
    /// Dones beyond that, to be sent on their own.
    overflow: Vec<Finished>,
    /// Whether Dones of syncs ending meanwhile wait for it (up to [`CARRY_HOLD`]).
    hold: bool,
}

/// Dones waiting for the loop's next Lease call.
#[derive(Default)]
struct Carry {
    state: Mutex<CarryState>,
}

#[derive(Default)]
struct CarryState {
    /// A Lease call is in flight (or the loop backs off after a failed one).
    leasing: bool,
    /// The Lease call in flight is expected to answer soon: a Done now waits for it and rides
    /// the next one. Otherwise (a long poll) it goes on its own.
    hold: bool,
    /// No more Lease calls will carry Dones (shutdown).
    closed: bool,
    pending: Vec<Finished>,
}

impl Carry {
    /// Leaves `f` for the next Lease call; gives it back when it must go on its own. The
    /// caller frees its slot afterwards, which wakes the loop for that call.
    fn offer(&self, f: Finished) -> Option<Finished> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.closed || (st.leasing && !st.hold) {
            return Some(f);
        }
        st.pending.push(f);
        None
    }

    /// A Lease call begins, after one that filled every slot (`backlog`) or not.
    fn start_lease(&self, backlog: bool) -> Start {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut carried = std::mem::take(&mut st.pending);
        // Within the count and the bytes one call may carry (the first always goes).
        let mut bytes = 0;
        let fit = carried
            .iter()
            .take(MAX_DONE_BATCH)
            .take_while(|f| {
                bytes += f.wire_bytes();
                bytes <= MAX_CARRIED_BYTES
            })
            .count()
            .max(1)
            .min(carried.len());
        let overflow = carried.split_off(fit);
        let hold = backlog;
        st.leasing = true;
        st.hold = hold;
        Start { carried, overflow, hold }
    }

    /// The Lease call in flight is slow: Dones stop waiting for it; returns those that did.
    fn stop_holding(&self) -> Vec<Finished> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.hold = false;
        std::mem::take(&mut st.pending)
    }

    /// No Lease call for a while (backing off): Dones go on their own; returns those waiting.
    fn pause(&self) -> Vec<Finished> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.leasing = true;
        st.hold = false;
        std::mem::take(&mut st.pending)
    }

    /// The Lease call has answered (or the backoff after a failed one is over).
    fn end_lease(&self) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.leasing = false;
        st.hold = false;
    }

    /// Stops carrying; returns what was waiting.
    fn close(&self) -> Vec<Finished> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.closed = true;
        std::mem::take(&mut st.pending)
    }
}

/// Sends each of `finished` as its own Done, concurrently.
async fn finish_all<Q: LeaseSource>(queue: Q, qname: &str, finished: Vec<Finished>) {
    let queue = &queue;
    let calls = finished.into_iter().map(|f| async move {
        finish_writing_back(queue, qname, &f.item, f.outcome, f.back).await
    });
    futures::future::join_all(calls).await;
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
    Finished(Outcome, Box<WriteBack>),
    LeaseLost,
    HandedBack,
}

/// Runs one sync with its renewer and finishes the lease.
async fn process<S: Syncer, Q: LeaseSource>(
    worker: Arc<S>,
    queue: Q,
    settings: LeaseSettings,
    mut item: Leased,
    _slot: OwnedSemaphorePermit,
    hand_back: CancellationToken,
    carry: Arc<Carry>,
) {
    let qname = settings.queue;
    let view = item.view.take();
    // The previous lessee's lease expired mid-sync: it may have created pods whose expectations
    // it never raised (they go with the Done), so the view cannot be trusted to show them; this
    // sync reads the API server.
    let view = match item.lease_expiries {
        0 => view,
        _ => Some(JobView { trusted: false, ..Default::default() }),
    };
    // The key is parsed here, once; one that does not parse is dropped (retrying cannot fix it).
    let Ok(key) = ObjectKey::parse(&item.key)
        .inspect_err(|e| tracing::error!(key = item.key, error = %e, "dropping malformed key"))
    else {
        let f = Finished { item, outcome: Outcome::Forget, back: WriteBack::default() };
        if let Some(f) = carry.offer(f) {
            finish_writing_back(&queue, qname, &f.item, f.outcome, f.back).await
        }
        count_finished(worker.metrics(), qname, Outcome::Forget.label());
        return;
    };
    let job = LeasedJob::new(key, view);
    // Kept for a sync dropped below: it returns nothing, yet still owes its Done.
    let journal = job.journal();
    let ending = {
        let sync = worker.run(qname, job, &hand_back);
        let renew = renew_until_lost(worker.metrics(), &queue, qname, &item, settings.lease);
        let hard_stop = async {
            hand_back.cancelled().await;
            tokio::time::sleep(WIND_DOWN_LIMIT).await;
        };
        tokio::select! {
            SyncResult { outcome, write_back, owed } = sync => {
                let mut error = String::new();
                let end = match outcome {
                    Ok(SyncOutcome::Done) => Outcome::Forget,
                    Ok(SyncOutcome::RequeueAfter(d)) => Outcome::RequeueAfter(d),
                    Err(e) => {
                        tracing::warn!(error = %e, "sync failed; requeueing with backoff");
                        error = e.to_string();
                        Outcome::RateLimited
                    }
                };
                Ending::Finished(end, Box::new(WriteBack {
                    view: write_back,
                    expectations: owed.expectations,
                    removals: owed.removals,
                    error,
                }))
            }
            // Dropping the sync future stops every write it had in flight or planned.
            () = renew => Ending::LeaseLost,
            // A sync that cannot wind down in time is dropped; its key is handed back as is.
            () = hard_stop => Ending::HandedBack,
        }
    };
    let outcome_label = match &ending {
        Ending::Finished(outcome, ..) => outcome.label(),
        Ending::LeaseLost => "lease_lost",
        Ending::HandedBack => "handed_back",
    };
    match ending {
        Ending::Finished(outcome, back) => {
            let back = *back;
            if let Some(f) = carry.offer(Finished { item, outcome, back }) {
                finish_writing_back(&queue, qname, &f.item, f.outcome, f.back).await
            }
        }
        Ending::HandedBack => {
            // Pods the dropped sync created, or removed the finalizers of, still get their
            // expectations.
            let Owed { expectations, removals } = journal.take();
            let back = WriteBack { view: None, expectations, removals, error: String::new() };
            let outcome = Outcome::RequeueAfter(Duration::ZERO);
            finish_writing_back(&queue, qname, &item, outcome, back).await
        }
        Ending::LeaseLost => tracing::warn!("lease lost; sync abandoned"),
    }
    count_finished(worker.metrics(), qname, outcome_label);
}

/// A lease ended (`outcome` is the label of how).
fn count_finished(metrics: &Metrics, qname: &str, outcome: &str) {
    metrics.leases_held.get_or_create(&Metrics::queue(qname)).dec();
    metrics
        .leases_finished
        .get_or_create(&OutcomeLabels { queue: qname.to_string(), outcome: outcome.into() })
        .inc();
}

/// Keys leased while shutting down go straight back.
async fn hand_back_now(metrics: &Metrics, queue: &impl LeaseSource, qname: &str, item: &Leased) {
    finish(queue, qname, item, Outcome::RequeueAfter(Duration::ZERO)).await;
    count_finished(metrics, qname, "handed_back");
}

/// Sends the one Done of a lease. A refused Done means the lease expired meanwhile; the key is
/// then back in the queue already, so there is nothing more to do.
async fn finish(queue: &impl LeaseSource, qname: &str, item: &Leased, outcome: Outcome) {
    finish_writing_back(queue, qname, item, outcome, WriteBack::default()).await
}

/// [`finish`] that writes the sync's last Job object back into the shared view first, in the
/// same call.
async fn finish_writing_back(
    queue: &impl LeaseSource,
    qname: &str,
    item: &Leased,
    outcome: Outcome,
    write_back: WriteBack,
) {
    log_done(outcome, queue.done(qname, item, outcome, write_back).await);
}

/// Logs how a Done went. A refused Done means the lease expired meanwhile; the key is then
/// back in the queue already, so there is nothing more to do.
fn log_done(outcome: Outcome, res: Result<(), ClientError>) {
    match res {
        Ok(()) => tracing::debug!(?outcome, "lease done"),
        Err(ClientError::LeaseLost(msg)) => {
            tracing::warn!(?outcome, %msg, "done refused: the lease had expired")
        }
        Err(e) => tracing::warn!(?outcome, error = %e, "done failed; the lease will expire"),
    }
}

/// Renews the lease every third of its duration; returns once it is lost (refused, or not
/// renewed in time).
async fn renew_until_lost(
    metrics: &Metrics,
    queue: &impl LeaseSource,
    qname: &str,
    item: &Leased,
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
                metrics.renew_failures.get_or_create(&Metrics::queue(qname)).inc();
                tracing::warn!("lease could not be renewed before its deadline");
                return;
            }
        }
        let asked_at = Instant::now();
        let renew = queue.renew(qname, item, lease);
        let res = tokio::select! {
            r = renew => r,
            _ = tokio::time::sleep_until(local_expiry) => Err(ClientError::Unavailable("renew timed out".into())),
        };
        match res {
            Ok(_) => deadline = asked_at + lease,
            Err(ClientError::LeaseLost(msg)) => {
                metrics.renew_failures.get_or_create(&Metrics::queue(qname)).inc();
                tracing::warn!(%msg, "renew refused");
                return;
            }
            Err(e) => {
                metrics.renew_failures.get_or_create(&Metrics::queue(qname)).inc();
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

#[cfg(test)]
mod tests {
    //! The lease loop on tokio's paused clock: a scripted queue and syncs that take a set time,
    //! so every renewal, Done and drop lands at an exact instant.

    use std::collections::VecDeque;
    use std::sync::Mutex;

    use prometheus_client::registry::Registry;

    use kjob_core::JOB_QUEUE;

    use super::*;

    /// A Lease call carries Dones up to the byte budget (the first always), the rest go on
    /// their own: a Lease request stays within kjob-queue's request limit.
    #[test]
    fn a_lease_carries_dones_within_the_byte_budget() {
        let carry = Carry::default();
        let done = |key: &str, job_bytes: usize| Finished {
            item: Leased { key: key.into(), lease_id: "1".into(), ..Default::default() },
            outcome: Outcome::Forget,
            back: WriteBack {
                view: Some(ViewWriteBack {
                    key: key.into(),
                    job_uid: "u".into(),
                    job: vec![b'x'; job_bytes],
                    resource_version: "1".into(),
                }),
                ..Default::default()
            },
        };
        let mib = 1024 * 1024;
        for (i, size) in [mib, mib, mib, 2 * mib, 10].into_iter().enumerate() {
            assert!(carry.offer(done(&format!("ns/k{i}"), size)).is_none());
        }
        let start = carry.start_lease(false);
        let keys = |v: &[Finished]| v.iter().map(|f| f.item.key.clone()).collect::<Vec<_>>();
        assert_eq!(keys(&start.carried), ["ns/k0", "ns/k1", "ns/k2"]);
        assert_eq!(keys(&start.overflow), ["ns/k3", "ns/k4"]);
        let carried: usize = start.carried.iter().map(Finished::wire_bytes).sum();
        assert!(carried <= MAX_CARRIED_BYTES);
        // One Done larger than the budget still goes, alone.
        let carry = Carry::default();
        assert!(carry.offer(done("ns/huge", 5 * mib)).is_none());
        assert_eq!(keys(&carry.start_lease(false).carried), ["ns/huge"]);
    }

    /// What the loop did, and when (time since the test began).
    #[derive(Debug, Clone, PartialEq)]
    enum Ev {
        Lease,
        Renew(String),
        /// A Done sent on its own.
        Done(String, Outcome),
        /// A Done carried by the Lease call recorded next.
        Carried(String, Outcome),
        /// A sync future was dropped before it finished.
        Dropped(String),
        /// A sync saw the wind-down signal.
        WindDown(String),
        /// A Done (on its own or carried) raised this many expected creations.
        Raised(String, i64),
        /// A sync was told its view cannot be trusted.
        Untrusted(String),
    }

    type Log = Arc<Mutex<Vec<(Duration, Ev)>>>;

    fn record(log: &Log, start: Instant, call: Ev) {
        log.lock().unwrap().push((start.elapsed(), call));
    }

    /// The name part of a test key (every key lives in namespace `t`).
    fn short(key: &str) -> String {
        key.strip_prefix("t/").unwrap_or(key).to_string()
    }

    /// A queue that hands out `items` once, then has nothing; Lease fails `lease_errors` times
    /// first (and each of the first `carrying_errors` calls that carry Dones), and Renew always
    /// fails unless `renew_ok`.
    #[derive(Clone)]
    struct FakeQueue {
        items: Arc<Mutex<VecDeque<Leased>>>,
        lease_errors: Arc<Mutex<u32>>,
        carrying_errors: Arc<Mutex<u32>>,
        renew_ok: bool,
        /// How long every Lease call takes to answer (before any long poll).
        lease_takes: Duration,
        log: Log,
        start: Instant,
    }

    /// Takes one from `n` if it is above zero: whether it was.
    fn take_one(n: &Mutex<u32>) -> bool {
        let mut n = n.lock().unwrap();
        let some = *n > 0;
        *n = n.saturating_sub(1);
        some
    }

    impl LeaseSource for FakeQueue {
        fn lease(
            &self,
            _: &LeaseSettings,
            max_items: u32,
            finished: &[Finished],
        ) -> impl Call<Vec<Leased>> {
            let failed = take_one(&self.lease_errors)
                || (!finished.is_empty() && take_one(&self.carrying_errors));
            if !failed {
                for f in finished {
                    record(&self.log, self.start, Ev::Carried(short(&f.item.key), f.outcome));
                    if let Some(e) = &f.back.expectations {
                        record(&self.log, self.start, Ev::Raised(short(&f.item.key), e.add));
                    }
                }
            }
            record(&self.log, self.start, Ev::Lease);
            let takes = self.lease_takes;
            let items: Vec<_> = {
                let mut q = self.items.lock().unwrap();
                let n = if failed { 0 } else { q.len().min(max_items as usize) };
                q.drain(..n).collect()
            };
            async move {
                if failed {
                    return Err(ClientError::Unavailable("queue down".into()));
                }
                tokio::time::sleep(takes).await;
                if items.is_empty() {
                    tokio::time::sleep(LEASE_WAIT).await;
                }
                Ok(items)
            }
        }

        fn renew(&self, _: &str, item: &Leased, _: Duration) -> impl Call<()> {
            record(&self.log, self.start, Ev::Renew(short(&item.key)));
            let down = ClientError::Unavailable("queue down".into());
            std::future::ready(if self.renew_ok { Ok(()) } else { Err(down) })
        }

        fn done(&self, _: &str, item: &Leased, end: Outcome, b: WriteBack) -> impl Call<()> {
            record(&self.log, self.start, Ev::Done(short(&item.key), end));
            if let Some(e) = b.expectations {
                record(&self.log, self.start, Ev::Raised(short(&item.key), e.add));
            }
            std::future::ready(Ok(()))
        }
    }

    /// Syncs that take `run_for`; keys starting with `polite` stop at the wind-down signal.
    struct FakeSync {
        metrics: Metrics,
        run_for: Duration,
        log: Log,
        start: Instant,
    }

    /// Records a drop of the sync future that holds it, unless disarmed.
    struct DropGuard(Option<(Log, Instant, String)>);

    impl DropGuard {
        /// The sync finished: nothing to record.
        fn disarm(&mut self) {
            self.0 = None;
        }
    }

    impl Drop for DropGuard {
        fn drop(&mut self) {
            if let Some((log, start, key)) = self.0.take() {
                record(&log, start, Ev::Dropped(key));
            }
        }
    }

    impl Syncer for FakeSync {
        fn run(&self, _: &str, job: LeasedJob, wind_down: &Shutdown) -> impl SyncFuture {
            let key = job.key.name.clone();
            let mut guard = DropGuard(Some((self.log.clone(), self.start, key.clone())));
            if job.view.as_ref().is_some_and(|v| !v.trusted) {
                record(&self.log, self.start, Ev::Untrusted(key.clone()));
            }
            // Keys starting with `creating` owe their Done a record of two creations.
            let journal = job.journal();
            if key.starts_with("creating") {
                *journal.owed() = Some(SetExpectations {
                    key: job.key.to_string(),
                    add: 2,
                    ..Default::default()
                });
            }
            let polite = key.starts_with("polite");
            // Keys starting with `late` take twice as long; `name-msN` takes N ms (keys are
            // Kubernetes names, so no other separator is allowed).
            let run_for = match key.rsplit_once("-ms") {
                Some((_, ms)) => Duration::from_millis(ms.parse().unwrap()),
                None if key.starts_with("late") => self.run_for * 2,
                None => self.run_for,
            };
            async move {
                tokio::select! {
                    _ = tokio::time::sleep(run_for) => {}
                    _ = wind_down.cancelled(), if polite => {
                        record(&self.log, self.start, Ev::WindDown(key.clone()));
                    }
                }
                guard.disarm();
                SyncResult {
                    outcome: Ok(SyncOutcome::Done),
                    write_back: None,
                    owed: journal.take(),
                }
            }
        }

        fn metrics(&self) -> &Metrics {
            &self.metrics
        }
    }

    struct Setup {
        keys: &'static [&'static str],
        lease: Duration,
        run_for: Duration,
        renew_ok: bool,
        lease_errors: u32,
        carrying_errors: u32,
        lease_takes: Duration,
        /// Syncs at once (default: one per key).
        concurrency: Option<usize>,
        grace: Duration,
        /// When shutdown is asked for.
        shutdown_at: Duration,
    }

    impl Default for Setup {
        fn default() -> Self {
            Self {
                keys: &["a"],
                lease: Duration::from_secs(3),
                run_for: Duration::from_secs(1),
                renew_ok: true,
                lease_errors: 0,
                carrying_errors: 0,
                lease_takes: Duration::ZERO,
                concurrency: None,
                grace: Duration::from_secs(30),
                shutdown_at: Duration::from_secs(60),
            }
        }
    }

    /// Runs one lease loop until it has drained; returns what happened (Lease calls only up to
    /// the first that found nothing, to keep the idle polling out) and the metrics.
    async fn run(setup: Setup) -> (Vec<(Duration, Ev)>, Metrics) {
        let start = Instant::now();
        let log: Log = Arc::default();
        // Keys starting with `expired` come after a lease that expired.
        let items = setup.keys.iter().map(|k| Leased {
            key: format!("t/{k}"),
            lease_id: format!("id-{k}"),
            lease_expiries: u32::from(k.starts_with("expired")),
            ..Default::default()
        });
        let queue = FakeQueue {
            items: Arc::new(Mutex::new(items.collect())),
            lease_errors: Arc::new(Mutex::new(setup.lease_errors)),
            carrying_errors: Arc::new(Mutex::new(setup.carrying_errors)),
            renew_ok: setup.renew_ok,
            lease_takes: setup.lease_takes,
            log: log.clone(),
            start,
        };
        let metrics = Metrics::new(&mut Registry::default());
        let sync =
            FakeSync { metrics: metrics.clone(), run_for: setup.run_for, log: log.clone(), start };
        let settings = LeaseSettings {
            queue: JOB_QUEUE,
            concurrency: setup.concurrency.unwrap_or(setup.keys.len()),
            lease: setup.lease,
            worker_id: "w".into(),
            shutdown_grace: setup.grace,
            view_records: Some(&[]),
            view_cache: None,
        };
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let at = setup.shutdown_at;
        tokio::spawn(async move {
            tokio::time::sleep(at).await;
            stop.cancel();
        });
        lease_loop(Arc::new(sync), queue, settings, shutdown).await;
        let mut calls = log.lock().unwrap().clone();
        // The idle Lease calls after the last event (one every LEASE_WAIT) say nothing.
        let last = calls.iter().rposition(|(_, c)| *c != Ev::Lease).map_or(0, |i| i + 1);
        calls.truncate(last);
        (calls, metrics)
    }

    /// Whole milliseconds, so that times compare exactly.
    fn s(secs: f64) -> Duration {
        Duration::from_millis((secs * 1000.0).round() as u64)
    }

    fn finished(m: &Metrics, outcome: &str) -> u64 {
        let labels = OutcomeLabels { queue: JOB_QUEUE.into(), outcome: outcome.into() };
        m.leases_finished.get_or_create(&labels).get()
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_sync_is_renewed_every_third_of_its_lease() {
        let (calls, m) =
            run(Setup { run_for: s(9.5), shutdown_at: s(20.0), ..Default::default() }).await;
        let renews: Vec<Duration> =
            calls.iter().filter(|(_, c)| *c == Ev::Renew("a".into())).map(|(t, _)| *t).collect();
        assert_eq!(renews, (1..=9).map(|i| s(f64::from(i))).collect::<Vec<_>>());
        // The sync freed the loop's only slot: its Done rides the Lease call that refills it.
        assert_eq!(calls.last(), Some(&(s(9.5), Ev::Carried("a".into(), Outcome::Forget))));
        assert_eq!(finished(&m, "forget"), 1);
        assert_eq!(m.leases_held.get_or_create(&Metrics::queue(JOB_QUEUE)).get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_that_cannot_be_renewed_is_given_up_before_its_deadline() {
        // Lease 3 s: renewals every 1 s, all failing; the margin is min(500 ms, 3 s / 10).
        let (calls, m) =
            run(Setup { run_for: s(100.0), renew_ok: false, ..Default::default() }).await;
        let want = vec![
            (s(0.0), Ev::Lease),
            (s(1.0), Ev::Renew("a".into())),
            (s(2.0), Ev::Renew("a".into())),
            (s(2.7), Ev::Dropped("a".into())),
        ];
        assert_eq!(calls, want, "no Done: the key comes back when its lease expires");
        assert_eq!(m.renew_failures.get_or_create(&Metrics::queue(JOB_QUEUE)).get(), 3);
        assert_eq!(finished(&m, "lease_lost"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn syncs_finish_within_the_shutdown_grace() {
        let setup = Setup {
            lease: s(30.0),
            run_for: s(3.0),
            grace: s(5.0),
            shutdown_at: s(1.0),
            ..Default::default()
        };
        let (calls, _) = run(setup).await;
        assert_eq!(
            calls,
            vec![(s(0.0), Ev::Lease), (s(3.0), Ev::Done("a".into(), Outcome::Forget))]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn after_the_grace_syncs_wind_down_or_are_dropped_and_handed_back() {
        // The stubborn sync has created pods: it owes its Done their expectations.
        let setup = Setup {
            keys: &["polite", "creating-stubborn"],
            lease: s(30.0),
            run_for: s(100.0),
            grace: s(2.0),
            shutdown_at: s(1.0),
            ..Default::default()
        };
        let (mut calls, m) = run(setup).await;
        calls.retain(|(_, c)| !matches!(c, Ev::Lease | Ev::Renew(_)));
        let back = Outcome::RequeueAfter(Duration::ZERO);
        let want = vec![
            // Grace over at 3 s: the polite sync stops and ends its lease as it decides.
            (s(3.0), Ev::WindDown("polite".into())),
            (s(3.0), Ev::Done("polite".into(), Outcome::Forget)),
            // The stubborn one gets WIND_DOWN_LIMIT more, then is dropped and handed back; the
            // hand-back Done still raises the record.
            (s(13.0), Ev::Dropped("creating-stubborn".into())),
            (s(13.0), Ev::Done("creating-stubborn".into(), back)),
            (s(13.0), Ev::Raised("creating-stubborn".into(), 2)),
        ];
        assert_eq!(calls, want);
        assert_eq!((finished(&m, "forget"), finished(&m, "handed_back")), (1, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_finished_sync_raises_what_it_owes_and_an_expired_lease_distrusts_the_view() {
        // Only the key whose previous lease expired reads the API server.
        let setup = Setup { keys: &["creating", "expired"], lease: s(30.0), ..Default::default() };
        let (mut calls, _) = run(setup).await;
        calls.retain(|(_, c)| !matches!(c, Ev::Lease | Ev::Renew(_)));
        calls.sort_by_key(|(t, c)| (*t, format!("{c:?}")));
        let want = vec![
            (s(0.0), Ev::Untrusted("expired".into())),
            (s(1.0), Ev::Carried("creating".into(), Outcome::Forget)),
            (s(1.0), Ev::Carried("expired".into(), Outcome::Forget)),
            (s(1.0), Ev::Raised("creating".into(), 2)),
        ];
        assert_eq!(calls, want);
    }

    #[tokio::test(start_paused = true)]
    async fn failed_lease_calls_back_off() {
        let setup =
            Setup { lease_errors: 3, run_for: s(0.5), shutdown_at: s(10.0), ..Default::default() };
        let (calls, _) = run(setup).await;
        let leases: Vec<Duration> =
            calls.iter().filter(|(_, c)| *c == Ev::Lease).map(|(t, _)| *t).collect();
        // 200 ms, then doubled; the fourth call leases the key.
        assert_eq!(leases, vec![s(0.0), s(0.2), s(0.6), s(1.4)]);
        assert_eq!(calls.last(), Some(&(s(1.9), Ev::Carried("a".into(), Outcome::Forget))));
    }

    /// The calls of `calls` from `from` on, Renews left out.
    fn after(calls: &[(Duration, Ev)], from: Duration) -> Vec<(Duration, Ev)> {
        calls.iter().filter(|(t, c)| *t >= from && !matches!(c, Ev::Renew(_))).cloned().collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_done_rides_the_next_lease_unless_a_lease_is_in_flight() {
        let setup = Setup { keys: &["a", "late"], shutdown_at: s(10.0), ..Default::default() };
        let (calls, m) = run(setup).await;
        let forget = Outcome::Forget;
        let want = vec![
            // "a" frees a slot at 1 s: the Lease refilling it carries a's Done, finds nothing
            // and waits (LEASE_WAIT)...
            (s(1.0), Ev::Carried("a".into(), forget)),
            (s(1.0), Ev::Lease),
            // ...so "late", done at 2 s, sends its own Done at once rather than waiting for it.
            (s(2.0), Ev::Done("late".into(), forget)),
        ];
        assert_eq!(after(&calls, s(1.0)), want);
        assert_eq!(finished(&m, "forget"), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_done_waits_briefly_for_a_lease_call_expected_soon() {
        // Two slots, four keys; every Lease call takes 40 ms to answer.
        let setup = Setup {
            keys: &["a-ms1000", "b-ms1030", "c-ms1000", "d-ms1000"],
            concurrency: Some(2),
            lease_takes: s(0.04),
            shutdown_at: s(10.0),
            ..Default::default()
        };
        let (calls, m) = run(setup).await;
        let carried = |k: &str| Ev::Carried(k.into(), Outcome::Forget);
        let want = vec![
            // a and b run from 0.04 s. a ends at 1.04: the refill carries its Done...
            (s(1.04), carried("a-ms1000")),
            (s(1.04), Ev::Lease),
            // ...b ends at 1.07 while that call is out; it was expected soon (the one before
            // filled every slot), so b's Done waited for its answer (c, at 1.08) and rides
            // the next one.
            (s(1.08), carried("b-ms1030")),
            (s(1.08), Ev::Lease),
            // c (from 1.08) ends at 2.08: the refill carries its Done, finds the queue empty
            // and long-polls. d (from 1.12) ends at 2.12 and waits for it, but only until
            // CARRY_HOLD after the call began: at 2.13 its Done goes on its own.
            (s(2.08), carried("c-ms1000")),
            (s(2.08), Ev::Lease),
            (s(2.13), Ev::Done("d-ms1000".into(), Outcome::Forget)),
        ];
        assert_eq!(after(&calls, s(1.0)), want);
        assert_eq!(m.dones_carried.get_or_create(&Metrics::queue(JOB_QUEUE)).get(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn dones_of_a_failed_lease_call_are_sent_on_their_own() {
        let setup = Setup { carrying_errors: 1, shutdown_at: s(10.0), ..Default::default() };
        let (calls, _) = run(setup).await;
        let want = vec![(s(1.0), Ev::Lease), (s(1.0), Ev::Done("a".into(), Outcome::Forget))];
        assert_eq!(after(&calls, s(1.0)), want);
    }

    #[tokio::test(start_paused = true)]
    async fn at_shutdown_no_done_waits_for_a_lease_call() {
        // Shutdown at 0.5 s, while the Lease call the loop made at 0 s... has returned and
        // the sync runs: the loop stops leasing, so the Done at 1 s goes on its own.
        let setup = Setup { shutdown_at: s(0.5), ..Default::default() };
        let (calls, _) = run(setup).await;
        let want = vec![(s(0.0), Ev::Lease), (s(1.0), Ev::Done("a".into(), Outcome::Forget))];
        assert_eq!(after(&calls, s(0.0)), want);
    }
}
