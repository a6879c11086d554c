//! Prompt wake-ups of waiting lessees, across replicas, and the hand-off to the local ones.
//!
//! Hand-off: a lessee that found nothing offers itself to its replica before it waits. An Add
//! that this replica serves ([`Waker::add`]) claims the offers (oldest first) and its ADD script
//! leases what became ready to them in the same atomic script; the replica hands the leases
//! over in-process. The enqueue→lease path is then one script, with no wake marker and no
//! LEASE. What the local lessees leave is announced to the other replicas through the marker
//! as before. A lessee that went away after its offer was claimed (it disconnected, or the
//! server drains) does not lose the items: they go back to ready at once (RELEASE), or, should
//! that fail, when their lease expires.
//!
//! A durable marker goes onto `{wq:<name>}:wake` whenever items become ready (the MARK after a
//! shard's script, see `ops::shards`). While a
//! replica has local waiters on a queue it keeps one dedicated connection blocked in `BLPOP` on
//! that marker; a pop wakes its waiters, who run LEASE, which re-pushes the marker while items
//! remain so the next replica wakes in turn. A marker pushed between "LEASE found nothing" and
//! "BLPOP" stays in Redis, so no wake-up is lost. Every waiter also re-runs LEASE at the due time
//! of the earliest delayed item and at least every [`SAFETY_POLL`], which covers lost markers
//! (a Redis restart) and a broken blocking connection.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use crate::conn::{self, Conn, RedisTarget};
use crate::epoch::Fence;
use crate::keys::IndexKeys;
use crate::ops::Taker;
use crate::store::{AddOutcome, Enqueue, LeaseBatch, Leased};
use crate::{Store, WqError};

/// Longest a waiter sleeps without re-running LEASE, whatever the markers say.
pub const SAFETY_POLL: Duration = Duration::from_secs(1);
/// Timeout of one BLPOP; short so the loop notices shutdown and a lost connection promptly.
const BLOCK_TIMEOUT: Duration = Duration::from_secs(1);
/// Extra time the blocking connection allows beyond the BLPOP timeout before calling it dead.
const BLOCK_SLACK: Duration = Duration::from_secs(2);
/// Pause after a failed blocking call before reconnecting (Redis down: no hot loop).
const RECONNECT_PAUSE: Duration = Duration::from_millis(500);

#[derive(Default)]
struct QueueWake {
    /// Woken on every marker pop and every blocking timeout.
    notify: Notify,
    /// Local waiters; the blocking loop only pops markers while there are some.
    waiters: AtomicUsize,
    /// Permit-style signal that the first waiter arrived.
    arrived: Notify,
    /// Waiting lessees an Add may lease to directly, oldest first.
    offers: Mutex<VecDeque<Offer>>,
    /// Ids of offers (to withdraw one).
    next_offer: AtomicU64,
}

/// A waiting lessee's offer to take items leased by an Add of this replica.
struct Offer {
    id: u64,
    taker: Taker,
    tx: oneshot::Sender<Handed>,
}

/// What an Add leased to a waiting lessee.
struct Handed {
    now_ms: i64,
    items: Vec<Leased>,
}

impl QueueWake {
    fn offers(&self) -> std::sync::MutexGuard<'_, VecDeque<Offer>> {
        self.offers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Offers a waiting lessee for a hand-off; the id withdraws it.
    fn offer(&self, taker: Taker, tx: oneshot::Sender<Handed>) -> u64 {
        let id = self.next_offer.fetch_add(1, Ordering::Relaxed);
        let mut offers = self.offers();
        // Lessees that went away while waiting leave a closed offer behind.
        offers.retain(|o| !o.tx.is_closed());
        offers.push_back(Offer { id, taker, tx });
        id
    }

    /// Withdraws offer `id`; `false` when an Add already claimed it (its hand-off will come).
    fn withdraw(&self, id: u64) -> bool {
        let mut offers = self.offers();
        let before = offers.len();
        offers.retain(|o| o.id != id);
        offers.len() < before
    }

    /// Claims the oldest live offers until they take `items` items together.
    fn claim(&self, items: usize) -> Vec<Offer> {
        let mut offers = self.offers();
        let (mut claimed, mut takes) = (Vec::new(), 0usize);
        while takes < items {
            let Some(o) = offers.pop_front() else { break };
            if o.tx.is_closed() {
                continue;
            }
            takes += o.taker.n as usize;
            claimed.push(o);
        }
        claimed
    }
}

/// What a lessee asks of [`Waker::lease_for`].
#[derive(Debug, Clone, Copy)]
pub struct LeaseAsk<'a> {
    /// The lessee's worker id.
    pub worker: &'a str,
    /// Most items to lease.
    pub n: u32,
    /// Lease duration.
    pub lease: Duration,
    /// Longest wait for the first item.
    pub wait: Duration,
    /// Records to read with each hand-off's view (job queue); `None`: no views.
    pub view_records: Option<&'a [String]>,
}

/// Wake-up hub of one replica; cheap to clone.
#[derive(Clone)]
pub struct Waker {
    target: RedisTarget,
    queues: Arc<HashMap<String, Arc<QueueWake>>>,
    /// Holds every lease after Redis lost writes ([`crate::epoch`]).
    fence: Fence,
}

impl std::fmt::Debug for Waker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waker").field("queues", &self.queues.keys().collect::<Vec<_>>()).finish()
    }
}

struct WaiterGuard(Arc<QueueWake>);

impl Drop for WaiterGuard {
    fn drop(&mut self) {
        self.0.waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Waker {
    /// A hub for `queues` on the Redis of `store`.
    pub fn new<'a>(store: &Store, queues: impl IntoIterator<Item = &'a str>) -> Self {
        let queues =
            queues.into_iter().map(|q| (q.to_string(), Arc::new(QueueWake::default()))).collect();
        Self { target: store.target().clone(), queues: Arc::new(queues), fence: Fence::new() }
    }

    /// The fence this hub honours.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// The same hub, leasing nothing while `fence` holds (after Redis lost writes).
    pub fn with_fence(self, fence: Fence) -> Self {
        Self { fence, ..self }
    }

    /// Wakes up to `ready` local waiters of `queue` (after a local Add or Done made `ready`
    /// items ready). Waking more would only make the extra waiters run a LEASE that finds
    /// nothing: each waiter takes a batch, and a LEASE that leaves items ready re-pushes the
    /// marker, which wakes the next one.
    pub fn poke(&self, queue: &str, ready: u32) {
        if let Some(q) = self.queues.get(queue) {
            let waiting = q.waiters.load(Ordering::SeqCst);
            for _ in 0..waiting.min(ready as usize) {
                q.notify.notify_one();
            }
        }
    }

    /// Lessees of `queue` waiting on this replica with an offer an Add may take.
    pub fn waiting(&self, queue: &str) -> usize {
        self.queues
            .get(queue)
            .map_or(0, |q| q.offers().iter().filter(|o| !o.tx.is_closed()).count())
    }

    /// Leases up to `n` items of `queue`, waiting up to `wait` for the first one. The batch's
    /// `promoted`, `reaped` and `poisoned` add up every attempt made while waiting (for metrics).
    pub async fn lease(
        &self,
        store: &Store,
        queue: &str,
        worker: &str,
        n: u32,
        lease: Duration,
        wait: Duration,
    ) -> Result<LeaseBatch, WqError> {
        let ask = LeaseAsk { worker, n, lease, wait, view_records: None };
        self.lease_for(store, queue, ask).await
    }

    /// [`Waker::lease`] for `ask`: with `view_records`, an Add that hands items over reads the
    /// views of those it wrote views for in the same script ([`Leased::view`]).
    pub async fn lease_for(
        &self,
        store: &Store,
        queue: &str,
        ask: LeaseAsk<'_>,
    ) -> Result<LeaseBatch, WqError> {
        let LeaseAsk { worker, n, lease, wait, view_records } = ask;
        let deadline = Instant::now() + wait;
        let q = self.queues.get(queue).cloned();
        let _guard = match (&q, wait.is_zero()) {
            (Some(q), false) => {
                q.waiters.fetch_add(1, Ordering::SeqCst);
                q.arrived.notify_one();
                Some(WaiterGuard(q.clone()))
            }
            _ => None,
        };
        let (mut promoted, mut reaped, mut poisoned) = (0, 0, 0);
        loop {
            // Register interest before looking, so a wake-up between LEASE and the wait counts.
            let notified = q.as_ref().map(|q| q.notify.notified());
            let mut notified = std::pin::pin!(notified);
            if let Some(n) = notified.as_mut().as_pin_mut() {
                n.enable();
            }
            // After a loss of Redis writes no lease is granted until every earlier one ended.
            if let Some(until) = self.fence.held() {
                if until >= deadline {
                    tokio::time::sleep_until(deadline).await;
                    let now_ms = crate::epoch::local_unix_ms();
                    let items = Vec::new();
                    return Ok(LeaseBatch {
                        now_ms,
                        next_due_ms: None,
                        promoted,
                        reaped,
                        poisoned,
                        items,
                    });
                }
                tokio::time::sleep_until(until).await;
                continue;
            }
            let batch = store.lease(queue, worker, n, lease).await?;
            if !batch.items.is_empty() {
                self.fence.note_lease(lease);
            }
            promoted += batch.promoted;
            reaped += batch.reaped;
            poisoned += batch.poisoned;
            let now = Instant::now();
            if !batch.items.is_empty() || now >= deadline {
                return Ok(LeaseBatch { promoted, reaped, poisoned, ..batch });
            }
            let LeaseBatch { next_due_ms, now_ms, .. } = batch;
            let mut until = deadline.min(now + SAFETY_POLL);
            if let Some(due) = next_due_ms {
                let in_ms = u64::try_from(due.saturating_sub(now_ms).max(0)).unwrap_or(0);
                until = until.min(now + Duration::from_millis(in_ms + 1));
            }
            let (Some(q), Some(notified)) = (&q, notified.as_mut().as_pin_mut()) else {
                tokio::time::sleep_until(until).await;
                continue;
            };
            // Offer ourselves to this replica's Adds; a wake-up (another replica's Add, a Done,
            // a due item) or the timer makes us look again ourselves.
            let (tx, mut rx) = oneshot::channel();
            let view_records = view_records.map(<[String]>::to_vec);
            let taker = Taker { worker: worker.to_string(), n, lease, view_records };
            let id = q.offer(taker, tx);
            let handed = tokio::select! {
                h = &mut rx => h.ok(),
                _ = notified => None,
                _ = tokio::time::sleep_until(until) => None,
            };
            let handed = match handed {
                Some(h) => Some(h),
                // Claimed meanwhile: its Add is running and answers within its timeout.
                None if !q.withdraw(id) => rx.await.ok(),
                None => None,
            };
            if let Some(h) = handed.filter(|h| !h.items.is_empty()) {
                let items = h.items;
                return Ok(LeaseBatch {
                    now_ms: h.now_ms,
                    next_due_ms: None,
                    promoted,
                    reaped,
                    poisoned,
                    items,
                });
            }
        }
    }

    /// Adds a batch to `queue` (see [`Store::add`]), leasing what becomes ready to this
    /// replica's waiting lessees in the same script and handing it to them; the rest wakes
    /// other waiters as usual.
    pub async fn add(
        &self,
        store: &Store,
        queue: &str,
        items: Vec<Enqueue>,
    ) -> Result<AddOutcome, WqError> {
        let Some(q) = self.queues.get(queue) else { return store.add(queue, &items).await };
        let immediate =
            items.iter().filter(|e| !e.observe_only && crate::store::ms(e.delay) == 0).count();
        // No hand-off while the fence holds leasing; the items wait in ready.
        let claimed = if immediate > 0 && self.fence.held().is_none() {
            q.claim(immediate)
        } else {
            Vec::new()
        };
        if claimed.is_empty() {
            let r = store.add(queue, &items).await?;
            self.poke(queue, r.accepted_now);
            return Ok(r);
        }
        // Leases are granted in Redis by the script: finish the hand-off even if the caller
        // goes away meanwhile (its Add RPC dropped), or the lessees would wait for their
        // leases to expire. The caller still gets the result when it waits for it.
        let (this, store, queue) = (self.clone(), store.clone(), queue.to_string());
        tokio::spawn(async move { this.add_handing(&store, &queue, &items, claimed).await })
            .await
            .map_err(|e| WqError::Unavailable(format!("add: hand-off task failed: {e}")))?
    }

    async fn add_handing(
        &self,
        store: &Store,
        queue: &str,
        items: &[Enqueue],
        claimed: Vec<Offer>,
    ) -> Result<AddOutcome, WqError> {
        let takers: Vec<Taker> = claimed.iter().map(|o| o.taker.clone()).collect();
        for t in &takers {
            self.fence.note_lease(t.lease);
        }
        // On an error the claimed offers drop here: their lessees look again themselves.
        let r = store.add_handing(queue, items, &takers).await?;
        let mut handed = 0;
        let mut undelivered = Vec::new();
        for (offer, items) in claimed.into_iter().zip(r.handed) {
            handed += items.len();
            if let Err(h) = offer.tx.send(Handed { now_ms: r.now_ms, items }) {
                undelivered.extend(h.items);
            }
        }
        if !undelivered.is_empty() {
            // The lessee went away between its offer's claim and the hand-off.
            match store.release(queue, &undelivered).await {
                Ok(back) => self.poke(queue, back),
                Err(e) => tracing::warn!(
                    queue,
                    error = %e,
                    items = undelivered.len(),
                    "giving back undelivered leases failed; they come back when they expire"
                ),
            }
        }
        let left = r.outcome.accepted_now.saturating_sub(u32::try_from(handed).unwrap_or(u32::MAX));
        self.poke(queue, left);
        Ok(r.outcome)
    }

    /// Runs the blocking loops of every queue until `shutdown` completes.
    pub async fn run(&self, store: Store, shutdown: impl Future<Output = ()>) {
        let loops = self.queues.iter().map(|(name, q)| {
            block_loop(self.target.clone(), store.clone(), name.clone(), q.clone())
        });
        tokio::select! {
            _ = futures::future::join_all(loops) => {}
            _ = shutdown => {}
        }
    }
}

async fn block_loop(target: RedisTarget, store: Store, queue: String, q: Arc<QueueWake>) {
    let key = IndexKeys::new(&queue).wake;
    let mut conn: Option<Conn> = None;
    // Whether the connection sat unused since its last BLPOP. The connection is kept while
    // nobody waits: a lessee that alternates between waiting and working would otherwise pay a
    // new connection (over TLS: a handshake and a read of the system's CA store) each time it
    // waits again, which cost a single lessee over TLS nearly half its lease rate.
    let mut idle = false;
    loop {
        if q.waiters.load(Ordering::SeqCst) == 0 {
            // Consume no marker while nobody here waits: another replica's waiters need it.
            q.arrived.notified().await;
            idle = true;
            continue;
        }
        let c = match &mut conn {
            Some(c) => c,
            None => match conn::connect(&target, BLOCK_TIMEOUT + BLOCK_SLACK).await {
                Ok(c) => conn.insert(c),
                Err(e) => {
                    tracing::warn!(queue, error = %e, "wake connection failed; retrying");
                    tokio::time::sleep(RECONNECT_PAUSE).await;
                    continue;
                }
            },
        };
        let mut cmd = redis::cmd("BLPOP");
        cmd.arg(&key).arg(BLOCK_TIMEOUT.as_secs_f64());
        let pop = cmd.query_async::<Option<(String, String)>>(c);
        let was_idle = std::mem::take(&mut idle);
        match tokio::time::timeout(BLOCK_TIMEOUT + BLOCK_SLACK, pop).await {
            Ok(Ok(Some(_))) => {
                // One marker, one waiter: its LEASE re-pushes the marker if items remain.
                q.notify.notify_one();
                if q.waiters.load(Ordering::SeqCst) == 0 {
                    // Our waiters left meanwhile: hand the marker on to other replicas.
                    if let Err(e) = store.rewake(&queue).await {
                        tracing::debug!(queue, error = %e, "re-pushing wake marker failed");
                    }
                }
            }
            Ok(Ok(None)) => q.notify.notify_waiters(),
            Ok(Err(e)) if was_idle => {
                // A connection kept idle may have been closed meanwhile (Redis's `timeout`, a
                // proxy): reconnect at once, and pause only if that one fails too.
                tracing::debug!(queue, error = %e, "idle wake connection was closed; reconnecting");
                conn = None;
            }
            Ok(Err(e)) => {
                tracing::warn!(queue, error = %e, "BLPOP failed; reconnecting");
                conn = None;
                q.notify.notify_waiters();
                tokio::time::sleep(RECONNECT_PAUSE).await;
            }
            Err(_) => {
                tracing::warn!(queue, "BLPOP watchdog fired; reconnecting");
                conn = None;
                q.notify.notify_waiters();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KeyState, StoreConfig};

    /// A throwaway redis-server on a free loopback port, killed on drop. The shared harness
    /// (tools/testkit) is a tool crate, which a shipping crate does not depend on; this one
    /// test needs only a plain server.
    struct Redis(std::process::Child, u16);

    impl Redis {
        fn start() -> Self {
            let port =
                std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let bin = std::env::var("KJOB_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
            let child = std::process::Command::new(bin)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
                .args(["--appendonly", "no", "--maxmemory-policy", "noeviction"])
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("redis-server (make test installs it)");
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(std::time::Instant::now() < deadline, "redis-server did not listen");
                std::thread::sleep(Duration::from_millis(20));
            }
            Self(child, port)
        }

        fn url(&self) -> String {
            format!("redis://127.0.0.1:{}", self.1)
        }
    }

    impl Drop for Redis {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// The lessee goes away after an Add claimed its offer and before the hand-off reaches it:
    /// the item goes back to ready at once (no expiry counted) for the next lessee.
    #[tokio::test]
    async fn a_hand_off_nobody_receives_goes_back_to_ready() {
        let server = Redis::start();
        let s = Store::connect(&server.url(), StoreConfig::default()).await.unwrap();
        let waker = Waker::new(&s, ["job"]);
        let q = waker.queues.get("job").unwrap().clone();
        let (tx, rx) = oneshot::channel();
        let lease = Duration::from_secs(30);
        q.offer(Taker { worker: "gone".into(), n: 1, lease, view_records: None }, tx);
        assert_eq!(waker.waiting("job"), 1);
        let claimed = q.claim(1);
        assert_eq!((claimed.len(), waker.waiting("job")), (1, 0));
        drop(rx);
        let r = waker.add_handing(&s, "job", &[Enqueue::now("ns/a")], claimed).await.unwrap();
        assert_eq!(r.accepted_now, 1);
        let v = &s.inspect("job", &["ns/a".to_string()]).await.unwrap()[0];
        assert_eq!((v.state, v.holder.as_str(), v.expiries), (KeyState::Ready, "", 0));
        let got = s.lease("job", "next", 1, lease).await.unwrap().items;
        assert_eq!(got.len(), 1);
        assert_eq!(s.stats("job").await.unwrap().ready, 0);
    }
}
