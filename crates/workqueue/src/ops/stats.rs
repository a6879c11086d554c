//! STATS and INSPECT: reading a queue's depths and where keys are.

use redis::Value;

use crate::WqError;
use crate::keys::{QueueKeys, queue_prelude};
use crate::lua::Lua;
use crate::lua::queue_fns;
use crate::lua::{Arg, argv};
use crate::reply::{Fields, Reply};
use crate::store::{KeyState, KeyView, QueueStats, Store};

/// KEYS: the [`QueueKeys`].
/// ARGV[1] -> max_leases (how many lease records to read).
/// Reply: [`QueueStats`] `{now, ready, delayed, leased, dirty, oldest_ready, failing,
/// unfinished_ms, oldest_started}`.
const STATS: &str = concat!(
    queue_prelude!(),
    queue_fns!(),
    r#"
local oldest = redis.call('ZRANGE', READY, 0, 0, 'WITHSCORES')
local oldest_ready = -1
if #oldest > 0 then oldest_ready = tonumber(oldest[2]) end
local leased = redis.call('ZCARD', LEASES)
local recs
if leased <= tonumber(ARGV[1]) then
  recs = redis.call('HVALS', LEASE)
else
  -- A pathological backlog of leases: sample one page rather than block the server.
  local page = redis.call('HSCAN', LEASE, 0, 'COUNT', ARGV[1])[2]
  recs = {}
  for i = 2, #page, 2 do recs[#recs + 1] = page[i] end
end
local unfinished, oldest_started, dirty = 0, -1, 0
for _, v in ipairs(recs) do
  local _, s, _, _, dt = unpack_lease(v)
  unfinished = unfinished + (now - s)
  if oldest_started < 0 or s < oldest_started then oldest_started = s end
  if dt >= 0 then dirty = dirty + 1 end
end
local expiring = tonumber(redis.call('HGET', STATS, 'expiring') or 0)
return {now, redis.call('ZCARD', READY), redis.call('ZCARD', DELAYED), leased,
  dirty, oldest_ready, redis.call('HLEN', FAILURES) - expiring, unfinished, oldest_started}
"#
);

static STATS_SCRIPT: Lua = Lua::new("stats", STATS);

impl Reply for QueueStats {
    fn read(what: &'static str, v: &Value) -> Result<Self, WqError> {
        let mut f = Fields::new(what, v)?;
        Ok(Self {
            now_ms: f.int("now")?,
            ready: f.u64("ready")?,
            delayed: f.u64("delayed")?,
            leased: f.u64("leased")?,
            dirty: f.u64("dirty")?,
            oldest_ready_ms: f.opt("oldest_ready")?,
            // HLEN minus a counter: a counter that drifted (a Redis restart between the two
            // writes) must not fail the gauge.
            failing: u64::try_from(f.int("failing")?).unwrap_or(0),
            unfinished_ms: f.int("unfinished_ms")?,
            oldest_started_ms: f.opt("oldest_started")?,
        })
    }
}

impl Store {
    /// Depths of `queue`.
    pub async fn stats(&self, queue: &str) -> Result<QueueStats, WqError> {
        // Lease records read for the unfinished-work gauge and the dirty count; in-flight items
        // are bounded by the total worker concurrency, this only caps a pathological backlog.
        const MAX_LEASES: u32 = 10_000;
        let args = argv![MAX_LEASES];
        self.run(&STATS_SCRIPT, &QueueKeys::new(queue).to_vec(), args).await
    }
}

/// KEYS: the [`QueueKeys`].
/// ARGV: items.
/// Reply: per item `{ready, delayed, deadline, dirty, failures, holder, expiries}` (-1 / '' =
/// none), read by [`KeyView::parse`].
const INSPECT: &str = concat!(
    queue_prelude!(),
    queue_fns!(),
    r#"
local out = {}
for _, item in ipairs(ARGV) do
  local v = redis.call('HGET', LEASE, item)
  local dirty, holder = 0, ''
  if v then
    local _, _, _, _, dt, wk = unpack_lease(v)
    if dt >= 0 then dirty = 1 end
    holder = wk
  end
  table.insert(out, {
    tonumber(redis.call('ZSCORE', READY, item) or -1),
    tonumber(redis.call('ZSCORE', DELAYED, item) or -1),
    tonumber(redis.call('ZSCORE', LEASES, item) or -1),
    dirty,
    tonumber(redis.call('HGET', FAILURES, item) or 0),
    holder,
    tonumber(redis.call('HGET', FAILURES, xfield(item)) or 0),
  })
end
return out
"#
);

static INSPECT_SCRIPT: Lua = Lua::new("inspect", INSPECT);

impl KeyView {
    fn parse(key: &str, mut f: Fields<'_>) -> Result<Self, WqError> {
        let ready = f.opt("ready")?;
        let delayed = f.opt("delayed")?;
        let deadline = f.opt("deadline")?;
        let state = if deadline.is_some() {
            KeyState::Leased
        } else if ready.is_some() {
            KeyState::Ready
        } else if delayed.is_some() {
            KeyState::Delayed
        } else {
            KeyState::Absent
        };
        Ok(Self {
            key: key.to_string(),
            state,
            ready_ms: ready,
            delayed_ms: delayed,
            lease_deadline_ms: deadline,
            dirty: f.flag("dirty")?,
            requeues: f.count("failures")?,
            holder: f.string("holder")?,
            expiries: f.count("expiries")?,
        })
    }
}

impl Store {
    /// What `queue` knows about `keys`.
    pub async fn inspect(&self, queue: &str, keys: &[String]) -> Result<Vec<KeyView>, WqError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let args = keys.iter().map(Arg::arg).collect();
        let v: Value = self.run(&INSPECT_SCRIPT, &QueueKeys::new(queue).to_vec(), args).await?;
        let rows = Fields::new("inspect", &v)?.rest("inspect row")?;
        if rows.len() != keys.len() {
            return Err(WqError::Protocol(format!(
                "inspect: {} rows for {} keys",
                rows.len(),
                keys.len()
            )));
        }
        keys.iter().zip(rows).map(|(k, row)| KeyView::parse(k, row)).collect()
    }
}
