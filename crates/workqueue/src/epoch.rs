//! Telling a Redis that may have lost writes from one that did not, and holding leasing until
//! every lease granted before the loss has ended (fencing).
//!
//! Why: a lease is what keeps two workers off one Job. A Redis restarted empty, restarted from
//! an AOF missing its last second (`appendfsync everysec`), or a promoted replica that missed
//! the last writes has lost leases; a key whose lease is lost can be leased again while its
//! first worker still syncs it, and two syncs of one Job at once can create a pod twice. The
//! first workers stop on their own: their next Renew is refused (the lease is gone), at the
//! latest a third of their lease duration after the loss, or their lease runs out locally. So
//! after a loss kjob-queue grants no lease for the longest lease duration it has granted or
//! renewed (the *hold*), and every replica learns the others' holds through Redis.
//!
//! Detection: each replica polls [`Fence::check`] every [`POLL`]: one script per shard of the
//! job queue returns that shard's *epoch* — a random token kept under `<shard tag>:epoch`, set
//! when absent — and the run id of the Redis node holding it. Any of them changing since the
//! last poll means writes may be lost: a wipe loses the tokens, and any restart or failover
//! changes a run id (a promoted replica is another process). The shards' tags cover the slot
//! space evenly, so on a Cluster every master holds some shard's epoch and a failover of any
//! of them is seen. Between a loss and the check that sees it, leasing waits too: a Redis
//! that restarted or failed over broke every connection to it, and after any command failed on
//! a broken connection ([`crate::RedisTarget::connection_breaks`]) nothing is leased until a
//! check made after that failure has answered.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::WqError;
use crate::lua::{Lua, argv};
use crate::reply::Fields;
use crate::store::Store;

/// How often a replica checks the epoch: the longest a loss goes unnoticed.
pub const POLL: Duration = Duration::from_millis(200);

/// A check with no answer after this long means the connection may be stuck on a node that is
/// gone: the cluster connection is rebuilt (a healthy cluster answers a check in milliseconds,
/// a loaded 2-core machine in well under this).
pub const STALLED_AFTER: Duration = Duration::from_secs(1);

/// The bound of a check on a single server: its commands' own ([`crate::conn::RESPONSE_TIMEOUT`]
/// each), with room for the two rounds of a check that found a loss.
const RESPONSE_BOUND: Duration = Duration::from_secs(11);

/// The keys of one shard's epoch token and of the Redis time (ms) until which no replica grants
/// a lease (a hold is published to every shard, so it survives the loss of any one master).
fn epoch_keys(tag: &str) -> [String; 2] {
    [format!("{tag}:epoch"), format!("{tag}:hold")]
}

/// KEYS[1] -> the epoch token, KEYS[2] -> the hold (Redis ms until which nothing is leased).
/// ARGV[1] -> a fresh token, kept when the epoch is gone; ARGV[2] -> a hold to publish, in ms
/// from now (0: none; a longer hold already there stays).
/// Reply: {epoch token, run id, ms left of the hold (0: none)}.
const EPOCH: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
local epoch = redis.call('GET', KEYS[1])
if not epoch then
  epoch = ARGV[1]
  redis.call('SET', KEYS[1], epoch)
end
local until_ms = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local hold = tonumber(ARGV[2])
if hold > 0 and now + hold > until_ms then
  until_ms = now + hold
  redis.call('SET', KEYS[2], until_ms)
  redis.call('PEXPIRE', KEYS[2], hold)
end
return {epoch, run, math.max(until_ms - now, 0)}
"#;

static EPOCH_SCRIPT: Lua = Lua::new("epoch", EPOCH);

/// This machine's Unix time in ms, for a reply made without asking Redis (an empty lease while
/// the fence holds).
pub(crate) fn local_unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// What one epoch check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochSample {
    /// The data set's token.
    pub epoch: String,
    /// The run id of the node that holds it.
    pub run: String,
    /// Time left of the hold any replica published.
    pub hold_left: Duration,
}

impl Store {
    /// Reads every shard's epoch (setting `fresh` where it is gone) and publishes a hold of
    /// `hold` (zero: none) to each; one sample per shard, in shard order.
    pub async fn epoch(&self, fresh: &str, hold: Duration) -> Result<Vec<EpochSample>, WqError> {
        let layout = *self.layout();
        let checks = (0..layout.shards()).map(|shard| async move {
            let keys = epoch_keys(&layout.tag(kjob_core::JOB_QUEUE, shard));
            let v: redis::Value = self.run(&EPOCH_SCRIPT, &keys, argv![fresh, hold]).await?;
            let mut f = Fields::new("epoch", &v)?;
            Ok::<_, WqError>(EpochSample {
                epoch: f.string("epoch")?,
                run: f.string("run")?,
                hold_left: Duration::from_millis(f.u64("hold_left")?),
            })
        });
        futures::future::try_join_all(checks).await
    }
}

/// The longest hold any shard holds.
fn hold_left(samples: &[EpochSample]) -> Duration {
    samples.iter().map(|s| s.hold_left).max().unwrap_or_default()
}

/// What [`Fence::check`] concluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// The same data set as at the last check (or the first check).
    Same,
    /// The epoch or the run id changed: writes may be lost; leasing is held.
    Lost,
}

/// One replica's fencing state; cheap to clone (clones share it).
#[derive(Debug, Clone, Default)]
pub struct Fence {
    inner: Arc<FenceInner>,
}

#[derive(Debug, Default)]
struct FenceInner {
    /// The target's count of commands failed on a broken connection.
    breaks: Arc<AtomicU64>,
    /// That count as it was before the last check that answered.
    confirmed_breaks: AtomicU64,
    /// Each shard's epoch and run id, as seen last.
    seen: Mutex<Option<Vec<(String, String)>>>,
    /// No lease until then.
    held_until: Mutex<Option<Instant>>,
    /// Longest lease duration granted or renewed by this replica, in ms.
    longest_ms: AtomicU64,
    /// Losses detected.
    losses: AtomicU64,
}

impl Fence {
    /// A fence that holds nothing until a loss is detected (and sees no connection breaks:
    /// for tests of the hold alone).
    pub fn new() -> Self {
        Self::default()
    }

    /// The fence of connections to `target`: a broken connection holds leasing until the next
    /// check has answered.
    pub fn for_target(target: &crate::RedisTarget) -> Self {
        let inner = FenceInner { breaks: target.breaks_counter(), ..FenceInner::default() };
        Self { inner: Arc::new(inner) }
    }

    /// Notes a lease of `lease` granted or renewed: a loss holds leasing at least this long.
    pub fn note_lease(&self, lease: Duration) {
        let ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        self.inner.longest_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// The end of the hold, while leasing is held. After a connection broke and before a check
    /// has answered since, the hold lasts one more [`POLL`] at a time.
    pub fn held(&self) -> Option<Instant> {
        let now = Instant::now();
        let breaks = self.inner.breaks.load(Ordering::SeqCst);
        if breaks > self.inner.confirmed_breaks.load(Ordering::SeqCst) {
            return Some(now + POLL);
        }
        let until = *self.inner.held_until.lock().unwrap_or_else(PoisonError::into_inner);
        until.filter(|u| *u > now)
    }

    /// Losses detected since start.
    pub fn losses(&self) -> u64 {
        self.inner.losses.load(Ordering::Relaxed)
    }

    fn hold_for(&self, left: Duration) {
        if left.is_zero() {
            return;
        }
        let until = Instant::now() + left;
        let mut held = self.inner.held_until.lock().unwrap_or_else(PoisonError::into_inner);
        if held.is_none_or(|h| h < until) {
            *held = Some(until);
        }
    }

    /// Checks the epoch once; on a loss publishes this replica's hold and holds leasing.
    pub async fn check(&self, store: &Store) -> Result<Check, WqError> {
        let fresh = format!("{:016x}", rand::random::<u64>());
        // Read before the call: a break after it is not confirmed by this answer.
        let breaks = self.inner.breaks.load(Ordering::SeqCst);
        let mut s = store.epoch(&fresh, Duration::ZERO).await?;
        let now: Vec<(String, String)> =
            s.iter().map(|x| (x.epoch.clone(), x.run.clone())).collect();
        let prev = self.inner.seen.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let lost = prev.is_some_and(|p| p != now);
        if lost {
            let longest = Duration::from_millis(self.inner.longest_ms.load(Ordering::Relaxed));
            s = store.epoch(&fresh, longest).await?;
            self.inner.losses.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                hold_ms = hold_left(&s).as_millis() as u64,
                "Redis lost writes or failed over (its epoch or run id changed): no lease is \
                 granted until every lease granted before has ended"
            );
        }
        let left = hold_left(&s);
        *self.inner.seen.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(s.into_iter().map(|x| (x.epoch, x.run)).collect());
        self.hold_for(left);
        self.inner.confirmed_breaks.fetch_max(breaks, Ordering::SeqCst);
        Ok(if lost { Check::Lost } else { Check::Same })
    }

    /// Checks every [`POLL`] until `shutdown` completes; `on_loss` runs after each loss found.
    pub async fn run(
        &self,
        store: &Store,
        shutdown: impl std::future::Future<Output = ()>,
        on_loss: impl Fn(),
    ) {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut failing = false;
        loop {
            // On a Cluster only: a single server's connection reconnects by itself.
            let bound = if store.target().is_cluster() { STALLED_AFTER } else { RESPONSE_BOUND };
            let checked = match tokio::time::timeout(bound, self.check(store)).await {
                Ok(r) => r,
                Err(_) => {
                    // Dropping the check changes nothing: its state is written at its end.
                    store.nudge();
                    Err(WqError::Unavailable(format!("epoch: no reply in {STALLED_AFTER:?}")))
                }
            };
            match checked {
                Ok(Check::Lost) => on_loss(),
                Ok(Check::Same) => failing = false,
                // Unreachable Redis: the readiness probe says so; the next answer is compared
                // with the last one seen, so a loss while it was down is still found.
                Err(e) if !failing => {
                    failing = true;
                    tracing::debug!(error = %e, "epoch check failed");
                }
                Err(_) => {}
            }
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                _ = &mut shutdown => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_hold_only_grows_and_ends() {
        let f = Fence::new();
        assert!(f.held().is_none());
        f.hold_for(Duration::from_millis(300));
        let first = f.held().unwrap();
        f.hold_for(Duration::from_millis(10));
        assert_eq!(f.held(), Some(first), "a shorter hold does not shorten it");
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert!(f.held().is_none());
    }

    /// A command that failed on a broken connection holds leasing until a check answers.
    #[tokio::test]
    async fn a_broken_connection_holds_until_a_check_answers() {
        let target = crate::RedisTarget::parse("redis://127.0.0.1:1").unwrap();
        let f = Fence::for_target(&target);
        assert!(f.held().is_none());
        target.breaks_counter().fetch_add(1, Ordering::SeqCst);
        assert!(f.held().is_some(), "unsure after a break");
        f.inner.confirmed_breaks.store(1, Ordering::SeqCst);
        assert!(f.held().is_none(), "a check that answered after the break clears it");
    }
}
