//! Prompt wake-ups of waiting lessees, across replicas.
//!
//! Scripts push a durable marker onto `{wq:<name>}:wake` whenever items become ready. While a
//! replica has local waiters on a queue it keeps one dedicated connection blocked in `BLPOP` on
//! that marker; a pop wakes its waiters, who run LEASE, which re-pushes the marker while items
//! remain so the next replica wakes in turn. A marker pushed between "LEASE found nothing" and
//! "BLPOP" stays in Redis, so no wake-up is lost. Every waiter also re-runs LEASE at the due time
//! of the earliest delayed item and at least every [`SAFETY_POLL`], which covers lost markers
//! (a Redis restart) and a broken blocking connection.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::conn::{self, Conn, RedisTarget};
use crate::keys::QueueKeys;
use crate::store::LeaseBatch;
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
}

/// Wake-up hub of one replica; cheap to clone.
#[derive(Clone)]
pub struct Waker {
    target: RedisTarget,
    queues: Arc<HashMap<String, Arc<QueueWake>>>,
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
        Self { target: store.target().clone(), queues: Arc::new(queues) }
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
            let batch = store.lease(queue, worker, n, lease).await?;
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
            match notified.as_mut().as_pin_mut() {
                Some(n) => {
                    tokio::select! {
                        _ = n => {}
                        _ = tokio::time::sleep_until(until) => {}
                    }
                }
                None => tokio::time::sleep_until(until).await,
            }
        }
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
    let key = QueueKeys::new(&queue).wake;
    let mut conn: Option<Conn> = None;
    loop {
        if q.waiters.load(Ordering::SeqCst) == 0 {
            // Consume no marker while nobody here waits: another replica's waiters need it.
            conn = None;
            q.arrived.notified().await;
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
