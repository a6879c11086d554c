//! The queue's shard index (`IndexKeys`, under the queue's own tag): MARK after a shard's script
//! created work, CANDIDATES before a lease, SETTLE after one, REWAKE for a marker nobody took.
//!
//! No script can touch a shard and the index at once (two slots), so the index is advisory and
//! only ever errs towards an extra probe: a mark lowers a shard's time (`ZADD LT`) and bumps its
//! version; a lessee raises or drops a shard's entry only if the version is still the one it
//! read before leasing (no mark it did not see came in between). A mark lost to a crash between
//! a shard's script and its MARK is repaired by the next sweep, which marks every shard.

use redis::Value;

use crate::WqError;
use crate::keys::{IndexKeys, QueueKeys};
use crate::lua::Lua;
use crate::lua::argv;
use crate::reply::Fields;
use crate::store::Store;

/// KEYS: the [`IndexKeys`].
/// ARGV[1] -> shard, ARGV[2] -> at (ms), ARGV[3] -> woke (0/1).
/// Reply: 0.
const MARK: &str = r#"
redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
redis.call('ZADD', KEYS[1], 'LT', ARGV[2], ARGV[1])
if ARGV[3] == '1' and redis.call('LLEN', KEYS[3]) == 0 then redis.call('RPUSH', KEYS[3], '1') end
return 0
"#;

static MARK_SCRIPT: Lua = Lua::new("mark_shard", MARK);

/// KEYS: the [`IndexKeys`].
/// Reply: `{now, next (-1 = none), {shard, version}…}`: the shards whose time has come, and the
/// earliest time of the others.
const CANDIDATES: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE')
local later = redis.call('ZRANGE', KEYS[1], '(' .. now, '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
local next = -1
if #later > 0 then next = tonumber(later[2]) end
local out = {now, next}
if #due > 0 then
  local v = redis.call('HMGET', KEYS[2], unpack(due))
  for i, s in ipairs(due) do out[#out + 1] = {tonumber(s), v[i] or '0'} end
end
return out
"#;

static CANDIDATES_SCRIPT: Lua = Lua::new("shard_candidates", CANDIDATES);

/// KEYS: the [`IndexKeys`].
/// ARGV[1] -> shard, ARGV[2] -> version read by CANDIDATES, ARGV[3] -> wake_at (-1 = nothing
/// pending), ARGV[4] -> chain (0/1: items remain ready after a lease that took some: wake
/// another replica's waiters).
/// Reply: 0.
const SETTLE: &str = r#"
if ARGV[4] == '1' and redis.call('LLEN', KEYS[3]) == 0 then redis.call('RPUSH', KEYS[3], '1') end
if (redis.call('HGET', KEYS[2], ARGV[1]) or '0') ~= ARGV[2] then return 0 end
if tonumber(ARGV[3]) < 0 then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
end
return 0
"#;

static SETTLE_SCRIPT: Lua = Lua::new("settle_shard", SETTLE);

/// KEYS: the [`IndexKeys`].
/// Reply: 0. Re-pushes the wake marker when a shard has ready work and none is there (a
/// replica popped it but its waiters had already gone).
const REWAKE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if #redis.call('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, 1) > 0
  and redis.call('LLEN', KEYS[3]) == 0 then
  redis.call('RPUSH', KEYS[3], '1')
end
return 0
"#;

static REWAKE_SCRIPT: Lua = Lua::new("rewake", REWAKE);

/// A shard a lessee may lease from, with the index version it was read at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub shard: u32,
    pub version: i64,
}

/// CANDIDATES' reply.
pub(crate) struct Candidates {
    /// Redis time (of the index's node).
    pub now_ms: i64,
    /// The earliest time of a shard that is not due yet.
    pub next_ms: Option<i64>,
    /// The due shards, by shard number.
    pub due: Vec<Candidate>,
}

impl Store {
    /// The keys of shard `shard` of `queue`.
    pub(crate) fn queue_keys(&self, queue: &str, shard: u32) -> QueueKeys {
        QueueKeys::new(&self.layout().tag(queue, shard))
    }

    /// Tells `queue`'s index that shard `shard` may have work at `at` (Redis ms), and wakes
    /// waiting lessees when `woke`. Nothing to do for `at < 0`.
    pub(crate) async fn mark(
        &self,
        queue: &str,
        shard: u32,
        at: i64,
        woke: bool,
    ) -> Result<(), WqError> {
        if at < 0 {
            return Ok(());
        }
        let args = argv![shard, at, u8::from(woke)];
        self.run::<i64>(&MARK_SCRIPT, &IndexKeys::new(queue).to_vec(), args).await.map(|_| ())
    }

    /// The shards of `queue` whose time has come.
    pub(crate) async fn candidates(&self, queue: &str) -> Result<Candidates, WqError> {
        let v: Value =
            self.run(&CANDIDATES_SCRIPT, &IndexKeys::new(queue).to_vec(), Vec::new()).await?;
        let mut f = Fields::new("shard_candidates", &v)?;
        let now_ms = f.int("now")?;
        let next_ms = f.opt("next")?;
        let mut due = Vec::new();
        for mut c in f.rest("candidate")? {
            let shard = u32::try_from(c.int("shard")?).unwrap_or(u32::MAX);
            let version = c.string("version")?.parse().unwrap_or(-1);
            if shard < self.layout().shards() {
                due.push(Candidate { shard, version });
            }
        }
        due.sort_by_key(|c| c.shard);
        Ok(Candidates { now_ms, next_ms, due })
    }

    /// After a lease from `c`: records when the shard has work next (if no mark came in since
    /// the candidates were read) and wakes another replica's waiters when `chain`.
    pub(crate) async fn settle(
        &self,
        queue: &str,
        c: Candidate,
        wake_at: i64,
        chain: bool,
    ) -> Result<(), WqError> {
        let args = argv![c.shard, c.version, wake_at, u8::from(chain)];
        self.run::<i64>(&SETTLE_SCRIPT, &IndexKeys::new(queue).to_vec(), args).await.map(|_| ())
    }

    /// Re-pushes the wake marker of `queue` if a shard has ready work.
    pub async fn rewake(&self, queue: &str) -> Result<(), WqError> {
        self.run::<i64>(&REWAKE_SCRIPT, &IndexKeys::new(queue).to_vec(), Vec::new())
            .await
            .map(|_| ())
    }
}

/// `mark_at` and `woke` as every shard script returns them (see `queue_fns!`).
pub(crate) fn read_mark(f: &mut Fields<'_>) -> Result<(i64, bool), WqError> {
    Ok((f.int("mark_at")?, f.flag("woke")?))
}
