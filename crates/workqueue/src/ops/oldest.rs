//! OLDEST READY: the keys of a queue that have waited longest in its ready sets, for the
//! "Jobs waiting longest" metric and `kjob-queue inspect --namespace`.

use redis::Value;

use crate::WqError;
use crate::keys::queue_prelude;
use crate::lua::queue_fns;
use crate::lua::{Lua, argv};
use crate::reply::{Fields, Reply};
use crate::store::Store;

/// KEYS: the [`QueueKeys`](crate::keys::QueueKeys) of one shard.
/// ARGV[1] -> n (keys wanted), ARGV[2] -> most namespaces read, ARGV[3] -> one namespace, or ''
/// for every namespace with ready work in the shard.
/// Reply: `{now, key, score, key, score…}`, at most n keys, lowest score (longest waiting) first.
///
/// Each namespace's ready set is ordered by score, so without priorities its n longest waiting
/// keys are its head: one `ZRANGE` of n per namespace and at most n comparisons per key read,
/// never a walk of the ready sets (about 1 ms for 100 namespaces). A key's age is from its ready
/// time (its score plus its priority head start); where priorities are set, the head is the
/// n first in lease order, so an older key of low priority behind n keys of higher priority that
/// became ready within [`crate::PRIORITY_AGING`] after it is not among them.
const OLDEST_READY: &str = concat!(
    queue_prelude!(),
    queue_fns!(),
    r#"
local n, max, only = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local nss
if only ~= '' then nss = {only} else nss = redis.call('LRANGE', RR, 0, max - 1) end
-- The n best so far, kept sorted by (score, key) by insertion: O(n) per candidate, no sort of
-- every namespace's head.
local best = {}
local function better(a, b) return a[2] < b[2] or (a[2] == b[2] and a[1] < b[1]) end
for _, ns in ipairs(nss) do
  local head = redis.call('ZRANGE', rkey(ns), 0, n - 1, 'WITHSCORES')
  for i = 1, #head, 2 do
    local c = {head[i], tonumber(head[i + 1]) + head_start(head[i])}
    local missed = #best >= n and not better(c, best[#best])
    -- Without priorities a namespace's head is in ready order: once one of its keys misses
    -- the n best, the rest do.
    if missed and not has_prio() then break end
    if not missed then
      local at = #best + 1
      while at > 1 and better(c, best[at - 1]) do at = at - 1 end
      table.insert(best, at, c)
      if #best > n then best[#best] = nil end
    end
  end
end
local out = {now}
for _, c in ipairs(best) do
  out[#out + 1] = c[1]
  out[#out + 1] = c[2]
end
return out
"#
);

static OLDEST_READY_SCRIPT: Lua = Lua::new("oldest ready", OLDEST_READY);

/// Most namespaces [`Store::oldest_ready`] reads per shard when asked for every namespace: bounds
/// its Redis time (each costs one `ZRANGE` of n); namespaces past it in a shard's round robin are
/// not looked at.
pub const OLDEST_READY_MAX_NAMESPACES: u32 = 1000;

/// Most keys [`Store::oldest_ready`] returns.
pub const OLDEST_READY_MAX_KEYS: u32 = 100;

/// A ready key and how long it has waited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingKey {
    /// The key, `namespace/name`.
    pub key: String,
    /// When it became ready (its order score plus its priority head start; Unix ms).
    pub ready_ms: i64,
}

/// The longest waiting ready keys of a queue.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OldestReady {
    /// Redis time of the read.
    pub now_ms: i64,
    /// Longest waiting first.
    pub keys: Vec<WaitingKey>,
}

impl Reply for OldestReady {
    fn read(what: &'static str, v: &Value) -> Result<Self, WqError> {
        let mut f = Fields::new(what, v)?;
        let now_ms = f.int("now")?;
        let mut keys = Vec::new();
        while f.remaining() > 0 {
            keys.push(WaitingKey { key: f.string("key")?, ready_ms: f.int("score")? });
        }
        Ok(Self { now_ms, keys })
    }
}

impl Store {
    /// The `n` (at most [`OLDEST_READY_MAX_KEYS`]) keys of `queue` that have been ready longest,
    /// over every shard (one script per shard), of `namespace` only if given; ages from each
    /// key's ready time (see the script's note on priorities).
    pub async fn oldest_ready(
        &self,
        queue: &str,
        namespace: Option<&str>,
        n: u32,
    ) -> Result<OldestReady, WqError> {
        let n = n.min(OLDEST_READY_MAX_KEYS);
        if n == 0 {
            return Ok(OldestReady::default());
        }
        let only = namespace.unwrap_or("");
        let calls = (0..self.layout().shards()).map(|shard| {
            let keys = self.queue_keys(queue, shard).to_vec();
            async move {
                self.run::<OldestReady>(
                    &OLDEST_READY_SCRIPT,
                    &keys,
                    argv![n, OLDEST_READY_MAX_NAMESPACES, only],
                )
                .await
            }
        });
        let mut out = OldestReady::default();
        for r in futures::future::join_all(calls).await {
            let shard = r?;
            out.now_ms = out.now_ms.max(shard.now_ms);
            out.keys.extend(shard.keys);
        }
        out.keys.sort_by(|a, b| a.ready_ms.cmp(&b.ready_ms).then_with(|| a.key.cmp(&b.key)));
        out.keys.truncate(n as usize);
        Ok(out)
    }
}
