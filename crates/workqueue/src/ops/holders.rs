//! LEASE HOLDERS: which workers hold leases of a queue, how many each and which keys, for the
//! web view's overview. Read-only.

use std::collections::BTreeMap;

use redis::Value;

use crate::WqError;
use crate::keys::queue_prelude;
use crate::lua::Lua;
use crate::lua::argv;
use crate::lua::queue_fns;
use crate::reply::{Fields, Reply};
use crate::store::Store;

/// Most lease records [`Store::lease_holders`] reads per shard: leases are bounded by the
/// workers' total concurrency, this only caps the script's time on a pathological backlog
/// (past it the counts are a sample and say so).
pub const HOLDERS_MAX_SCAN: u32 = 10_000;

/// Most keys listed per worker (its oldest leases): a page shows a few, the count says the rest.
pub const HOLDERS_MAX_KEYS: u32 = 10;

/// KEYS: the [`QueueKeys`](crate::keys::QueueKeys) of one shard.
/// ARGV[1] -> max_scan (lease records read), ARGV[2] -> max_keys (keys listed per worker).
/// Reply: `{now, truncated, {worker, leases, {key, started}… flat}…}`; a worker's keys are its
/// oldest leases (by start), at most max_keys of them.
const HOLDERS: &str = concat!(
    queue_prelude!(),
    queue_fns!(),
    r#"
local max, max_keys = tonumber(ARGV[1]), tonumber(ARGV[2])
local pairs_, truncated = nil, 0
if redis.call('HLEN', LEASE) <= max then
  pairs_ = redis.call('HGETALL', LEASE)
else
  -- A pathological backlog of leases: sample one page rather than block the server.
  pairs_ = redis.call('HSCAN', LEASE, 0, 'COUNT', max)[2]
  truncated = 1
end
local acc, order = {}, {}
for i = 1, #pairs_, 2 do
  local _, st, _, _, _, wk = unpack_lease(pairs_[i + 1])
  local a = acc[wk]
  if not a then
    a = {wk, 0, {}}
    acc[wk] = a
    order[#order + 1] = a
  end
  a[2] = a[2] + 1
  local keys = a[3]
  keys[#keys + 1] = {st, pairs_[i]}
end
local out = {now, truncated}
for _, a in ipairs(order) do
  table.sort(a[3], function(x, y) return x[1] < y[1] end)
  local flat = {}
  for j = 1, math.min(#a[3], max_keys) do
    flat[#flat + 1] = a[3][j][2]
    flat[#flat + 1] = a[3][j][1]
  end
  out[#out + 1] = {a[1], a[2], flat}
end
return out
"#
);

static HOLDERS_SCRIPT: Lua = Lua::new("lease holders", HOLDERS);

/// One worker's leases of a queue.
#[derive(Debug, Clone, PartialEq)]
pub struct Holder {
    /// The worker id it leased with.
    pub worker: String,
    /// Leases it holds.
    pub leases: u64,
    /// Its oldest leases: key and lease start (Redis Unix ms), oldest first, at most
    /// [`HOLDERS_MAX_KEYS`].
    pub keys: Vec<(String, i64)>,
}

/// Who holds a queue's leases.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LeaseHolders {
    /// Redis time of the read.
    pub now_ms: i64,
    /// A shard held more than [`HOLDERS_MAX_SCAN`] leases: counts are from a sample.
    pub truncated: bool,
    /// Workers holding leases, most leases first, then by id.
    pub workers: Vec<Holder>,
}

/// One shard's answer to HOLDERS.
struct ShardHolders {
    now_ms: i64,
    truncated: bool,
    workers: Vec<Holder>,
}

impl Reply for ShardHolders {
    fn read(what: &'static str, v: &Value) -> Result<Self, WqError> {
        let mut f = Fields::new(what, v)?;
        let now_ms = f.int("now")?;
        let truncated = f.flag("truncated")?;
        let mut workers = Vec::new();
        for mut row in f.rest("holder")? {
            let worker = row.string("worker")?;
            let leases = row.u64("leases")?;
            let mut flat = row.array("keys")?;
            let mut keys = Vec::new();
            while flat.remaining() > 0 {
                keys.push((flat.string("key")?, flat.int("started")?));
            }
            workers.push(Holder { worker, leases, keys });
        }
        Ok(Self { now_ms, truncated, workers })
    }
}

impl Store {
    /// Which workers hold leases of `queue`, how many each and their oldest keys, over every
    /// shard (one script per shard, run concurrently).
    pub async fn lease_holders(&self, queue: &str) -> Result<LeaseHolders, WqError> {
        let calls = (0..self.layout().shards()).map(|shard| {
            let keys = self.queue_keys(queue, shard).to_vec();
            async move {
                self.run::<ShardHolders>(
                    &HOLDERS_SCRIPT,
                    &keys,
                    argv![HOLDERS_MAX_SCAN, HOLDERS_MAX_KEYS],
                )
                .await
            }
        });
        let mut by_worker: BTreeMap<String, Holder> = BTreeMap::new();
        let mut out = LeaseHolders::default();
        for r in futures::future::join_all(calls).await {
            let shard = r?;
            out.now_ms = out.now_ms.max(shard.now_ms);
            out.truncated |= shard.truncated;
            for h in shard.workers {
                let e = by_worker.entry(h.worker.clone()).or_insert_with(|| Holder {
                    worker: h.worker.clone(),
                    leases: 0,
                    keys: Vec::new(),
                });
                e.leases += h.leases;
                e.keys.extend(h.keys);
            }
        }
        out.workers = by_worker
            .into_values()
            .map(|mut h| {
                h.keys.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
                h.keys.truncate(HOLDERS_MAX_KEYS as usize);
                h
            })
            .collect();
        out.workers.sort_by(|a, b| b.leases.cmp(&a.leases).then_with(|| a.worker.cmp(&b.worker)));
        Ok(out)
    }
}
