//! LEASE and RENEW: taking ready items and keeping them.

use std::time::Duration;

use redis::Value;

use crate::WqError;
use crate::keys::queue_prelude;
use crate::lua::Lua;
use crate::lua::queue_fns;
use crate::lua::{Arg, argv};
use crate::reply::{Fields, Reply};
use crate::store::{LeaseBatch, Leased, Store};

/// KEYS: the [`QueueKeys`] of one shard.
/// ARGV[1] -> worker, ARGV[2] -> n, ARGV[3] -> lease_ms, ARGV[4] -> promote_limit, ARGV[5] ->
/// reap_limit, ARGV[6] -> poison_after, ARGV[7] -> base_ms, ARGV[8] -> max_ms, ARGV[9] ->
/// weights (`ns=w,…`, see [`Store::set_namespace_weight`]), ARGV[10] -> the shard's number.
/// On a single server (no slots to respect) KEYS[7..=9] are the queue's
/// [`IndexKeys`](crate::keys::IndexKeys), and the script does SETTLE's work itself, atomically
/// (no version needed): one round trip per shard instead of two.
/// Reply: [`ShardLease`] `{now, next_due, promoted, reaped, poisoned, more, wake_at, {item,
/// lease_id, requeues, deadline, added_at, expiries}…}` (more: items remain ready; wake_at: as
/// `wake_at()` returns it after the lease).
const LEASE: &str = concat!(
    queue_prelude!(),
    queue_fns!(),
    r#"
local worker, n, lease_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
load_weights(ARGV[9])
local promoted = promote(tonumber(ARGV[4]))
local reaped, poisoned = reap(tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]))
local got = {}
grant(worker, n, lease_ms, got)
local more = 0
if any_ready() then more = 1 end
local at = wake_at()
if KEYS[7] then
  local shard = ARGV[10]
  if at < 0 then redis.call('ZREM', KEYS[7], shard) else redis.call('ZADD', KEYS[7], at, shard) end
  redis.call('HINCRBY', KEYS[8], shard, 1)
  -- Chain the wake-up so another replica's waiters take what is left.
  if #got > 0 and more == 1 and redis.call('LLEN', KEYS[9]) == 0 then
    redis.call('RPUSH', KEYS[9], '1')
  end
end
local out = {now, next_due(), promoted, reaped, poisoned, more, at}
for _, g in ipairs(got) do out[#out + 1] = g end
return out
"#
);

static LEASE_SCRIPT: Lua = Lua::new("lease", LEASE);

/// LEASE's reply: one shard's part of a [`LeaseBatch`].
struct ShardLease {
    batch: LeaseBatch,
    more: bool,
    wake_at: i64,
}

impl Reply for ShardLease {
    fn read(what: &'static str, v: &Value) -> Result<Self, WqError> {
        let mut f = Fields::new(what, v)?;
        let now_ms = f.int("now")?;
        let next_due_ms = f.opt("next_due")?;
        let promoted = f.count("promoted")?;
        let reaped = f.count("reaped")?;
        let poisoned = f.count("poisoned")?;
        let more = f.flag("more")?;
        let wake_at = f.int("wake_at")?;
        let items =
            f.rest("lease item")?.iter_mut().map(Leased::parse).collect::<Result<_, _>>()?;
        let batch = LeaseBatch { now_ms, next_due_ms, promoted, reaped, poisoned, items };
        Ok(Self { batch, more, wake_at })
    }
}

impl Leased {
    /// One `{item, lease_id, requeues, deadline, added_at, expiries}` of a lease reply.
    pub(crate) fn parse(f: &mut Fields<'_>) -> Result<Self, WqError> {
        Ok(Self {
            key: f.string("item")?,
            lease_id: f.string("lease_id")?,
            requeues: f.count("requeues")?,
            deadline_ms: f.int("deadline")?,
            enqueued_ms: f.int("added_at")?,
            expiries: f.count("expiries")?,
            view: None,
        })
    }
}

impl Store {
    /// Leases up to `n` ready items for `lease`, without waiting (see [`crate::Waker::lease`]).
    /// Also promotes due delayed items and reaps expired leases first, in each shard it visits.
    ///
    /// It visits only the shards the index says have work by now (CANDIDATES), starting one
    /// shard further on each call so every shard gets its turn, and after each tells the index
    /// when that shard has work next (SETTLE). `next_due_ms` is the earliest time a shard it did
    /// not lease from has work (a delayed item, a lease to reap).
    pub async fn lease(
        &self,
        queue: &str,
        worker: &str,
        n: u32,
        lease: Duration,
    ) -> Result<LeaseBatch, WqError> {
        // On a single server the lease script settles the index itself; with one shard there
        // is nothing to choose, so no CANDIDATES either: one script per lease, as unsharded.
        let inline = !self.target().is_cluster();
        let cands = if inline && self.layout().shards() == 1 {
            let due = vec![super::shards::Candidate { shard: 0, version: 0 }];
            super::shards::Candidates { now_ms: 0, next_ms: None, due }
        } else {
            self.candidates(queue).await?
        };
        let mut out = LeaseBatch {
            now_ms: cands.now_ms,
            next_due_ms: cands.next_ms,
            promoted: 0,
            reaped: 0,
            poisoned: 0,
            items: Vec::new(),
        };
        let start = self.next_start() % self.layout().shards();
        let split = cands.due.partition_point(|c| c.shard < start);
        let c = self.config();
        let weights = self.weights_arg().await?;
        for cand in cands.due[split..].iter().chain(&cands.due[..split]) {
            let need = n.saturating_sub(u32::try_from(out.items.len()).unwrap_or(u32::MAX));
            if need == 0 {
                break;
            }
            let args = argv![
                worker,
                need,
                lease,
                c.promote_limit,
                c.reap_limit,
                c.poison_after,
                c.limiter.base,
                c.limiter.max,
                &weights,
                cand.shard
            ];
            let mut keys = self.queue_keys(queue, cand.shard).to_vec();
            if inline {
                keys.extend(crate::keys::IndexKeys::new(queue).to_vec());
            }
            let r: ShardLease = self.run(&LEASE_SCRIPT, &keys, args).await?;
            if !inline {
                // Chain the wake-up so another replica's waiters take what is left.
                let chain = r.more && !r.batch.items.is_empty();
                self.settle(queue, *cand, r.wake_at, chain).await?;
            }
            if !r.more && r.wake_at >= 0 {
                out.next_due_ms = Some(out.next_due_ms.map_or(r.wake_at, |d| d.min(r.wake_at)));
            }
            out.now_ms = out.now_ms.max(r.batch.now_ms);
            out.promoted += r.batch.promoted;
            out.reaped += r.batch.reaped;
            out.poisoned += r.batch.poisoned;
            out.items.extend(r.batch.items);
        }
        Ok(out)
    }
}

/// KEYS: the [`QueueKeys`] of the item's shard.
/// ARGV[1] -> item, ARGV[2] -> lease_id, ARGV[3] -> lease_ms.
/// Reply: the new deadline, or -1 for a stale id.
const RENEW: &str = concat!(
    queue_prelude!(),
    queue_fns!(),
    r#"
local v = redis.call('HGET', LEASE, ARGV[1])
if not v or unpack_lease(v) ~= ARGV[2] then
  redis.call('HINCRBY', STATS, 'stale_total', 1)
  return -1
end
local deadline = now + tonumber(ARGV[3])
redis.call('ZADD', LEASES, 'XX', deadline, ARGV[1])
return deadline
"#
);

static RENEW_SCRIPT: Lua = Lua::new("renew", RENEW);

impl Store {
    /// Extends a lease; `None` when `lease_id` is stale (nothing changed).
    pub async fn renew(
        &self,
        queue: &str,
        key: &str,
        lease_id: &str,
        lease: Duration,
    ) -> Result<Option<i64>, WqError> {
        let args = argv![key, lease_id, lease];
        let keys = self.queue_keys(queue, self.layout().shard_of(key)).to_vec();
        match self.run(&RENEW_SCRIPT, &keys, args).await? {
            -1 => Ok(None),
            d => Ok(Some(d)),
        }
    }
}

/// KEYS: the [`QueueKeys`] of one shard.
/// ARGV: per lease, item, lease_id, added_at.
/// Reply: `{back, mark_at, woke}`: how many leases were still held under those ids and went
/// back to ready.
///
/// Gives back leases nobody will work on (an Add leased items to a waiting lessee of this
/// replica that disconnected before they reached it), as if they had never been leased: each
/// goes back to ready at its first add time (or at the time it became dirty, if earlier),
/// without counting an expiry, and waiters are woken.
const RELEASE: &str = concat!(
    queue_prelude!(),
    queue_fns!(),
    r#"
local back = 0
for i = 1, #ARGV, 3 do
  local item, id, at = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local v = redis.call('HGET', LEASE, item)
  if v then
    local lid, _, _, _, dt = unpack_lease(v)
    if lid == id then
      if dt >= 0 and dt < at then at = dt end
      redis.call('HDEL', LEASE, item)
      redis.call('ZREM', LEASES, item)
      ready_add(item, at)
      back = back + 1
    end
  end
end
if back > 0 then wake() end
return {back, mark_at, woke}
"#
);

static RELEASE_SCRIPT: Lua = Lua::new("release", RELEASE);

impl Store {
    /// Puts leases nobody will work on back into ready (fenced by their ids, so a lease that
    /// expired or was finished meanwhile is left alone); returns how many went back.
    pub(crate) async fn release(&self, queue: &str, leases: &[Leased]) -> Result<u32, WqError> {
        if leases.is_empty() {
            return Ok(0);
        }
        let mut by_shard: std::collections::BTreeMap<u32, Vec<Vec<u8>>> = Default::default();
        for l in leases {
            let args = by_shard.entry(self.layout().shard_of(&l.key)).or_default();
            args.push(l.key.arg());
            args.push(l.lease_id.arg());
            args.push(l.enqueued_ms.arg());
        }
        let mut back = 0;
        for (shard, args) in by_shard {
            let keys = self.queue_keys(queue, shard).to_vec();
            let v: Value = self.run(&RELEASE_SCRIPT, &keys, args).await?;
            let mut f = Fields::new("release", &v)?;
            back += f.count("back")?;
            let (at, woke) = super::shards::read_mark(&mut f)?;
            self.mark(queue, shard, at, woke).await?;
        }
        Ok(back)
    }
}
