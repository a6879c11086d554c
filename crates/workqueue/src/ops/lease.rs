//! LEASE and RENEW: taking ready items and keeping them.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};

use super::{ms_arg, num_arg};
use crate::WqError;
use crate::keys::{QueueKeys, queue_prelude};
use crate::lua::queue_fns;
use crate::reply::{self, Fields};
use crate::store::{LeaseBatch, Leased, Store};

/// KEYS: the [`QueueKeys`].
/// ARGV[1] -> worker, ARGV[2] -> n, ARGV[3] -> lease_ms, ARGV[4] -> promote_limit, ARGV[5] ->
/// reap_limit, ARGV[6] -> poison_after, ARGV[7] -> base_ms, ARGV[8] -> max_ms.
/// Reply: [`LeaseBatch`] `{now, next_due, promoted, reaped, poisoned, {item, lease_id,
/// requeues, deadline, added_at}…}`.
const LEASE: &str = concat!(
    queue_prelude!(),
    queue_fns!(),
    r#"
local worker, n, lease_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local promoted = promote(tonumber(ARGV[4]))
local reaped, poisoned = reap(tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]))
local popped = redis.call('ZPOPMIN', READY, n)
local out = {now, next_due(), promoted, reaped, poisoned}
local count = #popped / 2
if count > 0 then
  -- One sequence bump, one HMGET, one ZADD and one HSET for the whole batch.
  local last = redis.call('HINCRBY', STATS, 'lease_seq', count)
  local fields = {}
  for i = 1, count do
    local item = popped[2 * i - 1]
    fields[2 * i - 1] = item
    fields[2 * i] = xfield(item)
  end
  local fail = redis.call('HMGET', FAILURES, unpack(fields))
  local deadline = now + lease_ms
  local zargs, hargs = {}, {}
  for i = 1, count do
    local item, added = popped[2 * i - 1], popped[2 * i]
    -- The time part keeps ids unique even if Redis lost the sequence (restart without AOF).
    local id = (last - count + i) .. '-' .. now
    local req, ex = tonumber(fail[2 * i - 1] or 0), tonumber(fail[2 * i] or 0)
    zargs[2 * i - 1], zargs[2 * i] = deadline, item
    hargs[2 * i - 1] = item
    hargs[2 * i] = id .. '|' .. now .. '|' .. req .. '|' .. ex .. '|-1|' .. worker
    out[#out + 1] = {item, id, req, deadline, tonumber(added)}
  end
  redis.call('ZADD', LEASES, unpack(zargs))
  redis.call('HSET', LEASE, unpack(hargs))
end
-- Chain the wake-up so another replica's waiters take what is left.
if count > 0 and redis.call('ZCARD', READY) > 0 then wake() end
return out
"#
);

static LEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(LEASE));

impl LeaseBatch {
    fn parse(v: &Value) -> Result<Self, WqError> {
        let mut f = Fields::new("lease", v)?;
        let now_ms = f.int("now")?;
        let next_due_ms = f.opt("next_due")?;
        let promoted = f.count("promoted")?;
        let reaped = f.count("reaped")?;
        let poisoned = f.count("poisoned")?;
        let items =
            f.rest("lease item")?.into_iter().map(Leased::parse).collect::<Result<_, _>>()?;
        Ok(Self { now_ms, next_due_ms, promoted, reaped, poisoned, items })
    }
}

impl Leased {
    /// One `{item, lease_id, requeues, deadline, added_at}` of a lease reply.
    pub(crate) fn parse(mut f: Fields<'_>) -> Result<Self, WqError> {
        Ok(Self {
            key: f.string("item")?,
            lease_id: f.string("lease_id")?,
            requeues: f.count("requeues")?,
            deadline_ms: f.int("deadline")?,
            enqueued_ms: f.int("added_at")?,
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
        let args = vec![
            worker.as_bytes().to_vec(),
            num_arg(n),
            ms_arg(lease),
            num_arg(c.promote_limit),
            num_arg(c.reap_limit),
            num_arg(c.poison_after),
            ms_arg(c.limiter.base),
            ms_arg(c.limiter.max),
        ];
        let v = self.eval("lease", &LEASE_SCRIPT, &QueueKeys::new(queue).to_vec(), args).await?;
        LeaseBatch::parse(&v)
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

static RENEW_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW));

impl Store {
    /// Extends a lease; `None` when `lease_id` is stale (nothing changed).
    pub async fn renew(
        &self,
        queue: &str,
        key: &str,
        lease_id: &str,
        lease: Duration,
    ) -> Result<Option<i64>, WqError> {
        let args = vec![key.as_bytes().to_vec(), lease_id.as_bytes().to_vec(), ms_arg(lease)];
        let v = self.eval("renew", &RENEW_SCRIPT, &QueueKeys::new(queue).to_vec(), args).await?;
        match reply::int("renew", &v)? {
            -1 => Ok(None),
            d => Ok(Some(d)),
        }
    }
}
