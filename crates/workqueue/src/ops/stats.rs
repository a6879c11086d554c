//! STATS and INSPECT: reading a queue's depths and where keys are.

use redis::Value;

use crate::WqError;
use crate::keys::queue_prelude;
use crate::lua::Lua;
use crate::lua::queue_fns;
use crate::lua::{Arg, argv};
use crate::reply::{Fields, Reply};
use crate::store::{KeyState, KeyView, QueueStats, Store};

/// KEYS: the [`QueueKeys`] of one shard.
/// ARGV[1] -> max_leases (how many lease records to read).
/// Reply: [`QueueStats`] `{now, ready, delayed, leased, dirty, oldest_ready, failing,
/// unfinished_ms, oldest_started}`.
const STATS: &str = concat!(
    queue_prelude!(),
    queue_fns!(),
    r#"
-- Every namespace with ready items: its depth and oldest ready time.
local ready, oldest_ready = 0, -1
for _, ns in ipairs(redis.call('LRANGE', RR, 0, -1)) do
  local k = rkey(ns)
  ready = ready + redis.call('ZCARD', k)
  local head = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
  -- The next key to lease: its ready time (the score less a priority head start, added back).
  local at = #head > 0 and tonumber(head[2]) + head_start(head[1])
  if at and (oldest_ready < 0 or at < oldest_ready) then oldest_ready = at end
end
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
return {now, ready, redis.call('ZCARD', DELAYED), leased,
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
    /// Depths of `queue`: every shard's, summed (one script per shard, run concurrently).
    pub async fn stats(&self, queue: &str) -> Result<QueueStats, WqError> {
        // Lease records read per shard for the unfinished-work gauge and the dirty count;
        // in-flight items are bounded by the total worker concurrency, this only caps a
        // pathological backlog.
        const MAX_LEASES: u32 = 10_000;
        let calls = (0..self.layout().shards()).map(|shard| async move {
            let keys = self.queue_keys(queue, shard).to_vec();
            self.run::<QueueStats>(&STATS_SCRIPT, &keys, argv![MAX_LEASES]).await
        });
        let min = |a: Option<i64>, b: Option<i64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut out = QueueStats::default();
        for r in futures::future::join_all(calls).await {
            let s = r?;
            out.now_ms = out.now_ms.max(s.now_ms);
            out.ready += s.ready;
            out.delayed += s.delayed;
            out.leased += s.leased;
            out.dirty += s.dirty;
            out.failing += s.failing;
            out.unfinished_ms += s.unfinished_ms;
            out.oldest_ready_ms = min(out.oldest_ready_ms, s.oldest_ready_ms);
            out.oldest_started_ms = min(out.oldest_started_ms, s.oldest_started_ms);
        }
        Ok(out)
    }
}

/// KEYS: the [`QueueKeys`] of one shard.
/// ARGV: items (of that shard).
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
    tonumber(ready_score(item) or -1),
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
        let mut by_shard: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
        for (at, k) in keys.iter().enumerate() {
            by_shard.entry(self.layout().shard_of(k)).or_default().push(at);
        }
        let mut out: Vec<Option<KeyView>> = vec![None; keys.len()];
        for (shard, order) in by_shard {
            let args = order.iter().map(|at| keys[*at].arg()).collect();
            let qk = self.queue_keys(queue, shard).to_vec();
            let v: Value = self.run(&INSPECT_SCRIPT, &qk, args).await?;
            let rows = Fields::new("inspect", &v)?.rest("inspect row")?;
            if rows.len() != order.len() {
                return Err(WqError::Protocol(format!(
                    "inspect: {} rows for {} keys",
                    rows.len(),
                    order.len()
                )));
            }
            for (at, row) in order.into_iter().zip(rows) {
                out[at] = Some(KeyView::parse(&keys[at], row)?);
            }
        }
        Ok(out.into_iter().flatten().collect())
    }
}
