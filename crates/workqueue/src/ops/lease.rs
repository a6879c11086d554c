//! LEASE and RENEW: taking ready items and keeping them.

use std::time::Duration;

use redis::Value;

use crate::WqError;
use crate::keys::{QueueKeys, queue_prelude};
use crate::lua::Lua;
use crate::lua::queue_fns;
use crate::lua::{Arg, argv};
use crate::reply::{Fields, Reply};
use crate::store::{LeaseBatch, Leased, Store};

/// KEYS: the [`QueueKeys`].
/// ARGV[1] -> worker, ARGV[2] -> n, ARGV[3] -> lease_ms, ARGV[4] -> promote_limit, ARGV[5] ->
/// reap_limit, ARGV[6] -> poison_after, ARGV[7] -> base_ms, ARGV[8] -> max_ms.
/// Reply: [`LeaseBatch`] `{now, next_due, promoted, reaped, poisoned, {item, lease_id,
/// requeues, deadline, added_at, expiries}…}`.
const LEASE: &str = concat!(
    queue_prelude!(),
    queue_fns!(),
    r#"
local worker, n, lease_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local promoted = promote(tonumber(ARGV[4]))
local reaped, poisoned = reap(tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]))
local out = {now, next_due(), promoted, reaped, poisoned}
local count = grant(worker, n, lease_ms, out)
-- Chain the wake-up so another replica's waiters take what is left.
if count > 0 and redis.call('ZCARD', READY) > 0 then wake() end
return out
"#
);

static LEASE_SCRIPT: Lua = Lua::new("lease", LEASE);

impl Reply for LeaseBatch {
    fn read(what: &'static str, v: &Value) -> Result<Self, WqError> {
        let mut f = Fields::new(what, v)?;
        let now_ms = f.int("now")?;
        let next_due_ms = f.opt("next_due")?;
        let promoted = f.count("promoted")?;
        let reaped = f.count("reaped")?;
        let poisoned = f.count("poisoned")?;
        let items =
            f.rest("lease item")?.iter_mut().map(Leased::parse).collect::<Result<_, _>>()?;
        Ok(Self { now_ms, next_due_ms, promoted, reaped, poisoned, items })
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
    /// Also promotes due delayed items and reaps expired leases first.
    pub async fn lease(
        &self,
        queue: &str,
        worker: &str,
        n: u32,
        lease: Duration,
    ) -> Result<LeaseBatch, WqError> {
        let c = self.config();
        let args = argv![
            worker,
            n,
            lease,
            c.promote_limit,
            c.reap_limit,
            c.poison_after,
            c.limiter.base,
            c.limiter.max
        ];
        self.run(&LEASE_SCRIPT, &QueueKeys::new(queue).to_vec(), args).await
    }
}

/// KEYS: the [`QueueKeys`].
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
        match self.run(&RENEW_SCRIPT, &QueueKeys::new(queue).to_vec(), args).await? {
            -1 => Ok(None),
            d => Ok(Some(d)),
        }
    }
}

/// KEYS: the [`QueueKeys`].
/// ARGV: per lease, item, lease_id, added_at.
/// Reply: how many leases were still held under those ids and went back to ready.
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
      redis.call('ZADD', READY, 'NX', at, item)
      back = back + 1
    end
  end
end
if back > 0 then wake() end
return back
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
        let mut args = Vec::with_capacity(leases.len() * 3);
        for l in leases {
            args.push(l.key.arg());
            args.push(l.lease_id.arg());
            args.push(l.enqueued_ms.arg());
        }
        self.run(&RELEASE_SCRIPT, &QueueKeys::new(queue).to_vec(), args).await
    }
}
