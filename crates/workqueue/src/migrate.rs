//! The upgrade from the unsharded layout (every key under `{wq:<queue>}`, before issue 45): run
//! once per data set, by the first kjob-queue of this version to start on it, before it serves.
//!
//! * Queue items move page by page: EXPORT reads a page of the old ready, delayed and leased
//!   sets (with lease records and failure counts), IMPORT writes each item into its shard, then
//!   REMOVE drops the page from the old keys. Leases keep their ids, so a worker holding one
//!   finishes it normally; a key is never in two places that a lease would take it from twice.
//! * Per-Job keys (expectations, records, views, event state) move with DUMP/RESTORE to their
//!   shard's names; a key that already exists under the new name (written since) wins.
//! * The view session is not moved: views become untrusted, and the watcher's next write learns
//!   it must begin a session (a new snapshot).
//!
//! Every step is idempotent (an import never overwrites, a removal only removes what was
//! imported), so a crash part way is finished by the next start. `{wq:migrated}` records that it
//! is done. Old-version replicas must be stopped first (they would write the old keys after).

use std::collections::BTreeMap;

use redis::Value;

use crate::WqError;
use crate::keys::queue_prelude;
use crate::lua::queue_fns;
use crate::lua::{Arg, Lua, argv};
use crate::reply::Fields;
use crate::store::Store;

/// Set once the data set holds nothing of the unsharded layout.
pub(crate) const MIGRATED_KEY: &str = "{wq:migrated}";
/// Items or keys moved per script call (a script blocks the whole server).
const PAGE: usize = 500;

/// KEYS: the old `{wq:<queue>}:` ready, delayed, leases, lease, failures.
/// ARGV[1] -> page size.
/// Reply: `{kind, item, score, lease record, failures, expiries}…` (kind `r` ready, `d` delayed,
/// `l` leased; '' for a missing record or count).
const EXPORT: &str = r#"
local page, out = tonumber(ARGV[1]), {}
local function emit(kind, list)
  for i = 1, #list, 2 do
    local item = list[i]
    local f = redis.call('HMGET', KEYS[5], item, '!x|' .. item)
    local rec = ''
    if kind == 'l' then rec = redis.call('HGET', KEYS[4], item) or '' end
    out[#out + 1] = {kind, item, list[i + 1], rec, f[1] or '', f[2] or ''}
  end
end
emit('r', redis.call('ZRANGE', KEYS[1], 0, page - 1, 'WITHSCORES'))
emit('d', redis.call('ZRANGE', KEYS[2], 0, page - 1, 'WITHSCORES'))
emit('l', redis.call('ZRANGE', KEYS[3], 0, page - 1, 'WITHSCORES'))
return out
"#;

static EXPORT_SCRIPT: Lua = Lua::new("migrate_export", EXPORT);

/// KEYS: the [`QueueKeys`](crate::keys::QueueKeys) of one shard.
/// ARGV: EXPORT's rows of that shard's items, six fields each.
/// Reply: `{mark_at, woke}`. Never overwrites: a key already leased or ready in the shard keeps
/// its place, a failure count already there stays.
const IMPORT: &str = concat!(
    queue_prelude!(),
    queue_fns!(),
    r#"
for i = 1, #ARGV, 6 do
  local kind, item, score, rec = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3]
  local fails, expiries = ARGV[i + 4], ARGV[i + 5]
  local leased = redis.call('HGET', LEASE, item)
  if kind == 'd' then
    if redis.call('ZADD', DELAYED, 'LT', 'CH', score, item) == 1 then mark(score) end
  elseif kind == 'l' and rec ~= '' then
    if not leased then
      redis.call('HSET', LEASE, item, rec)
      redis.call('ZADD', LEASES, score, item)
      mark(score)
    end
  elseif not leased then
    if ready_add(item, score) == 1 then wake() end
  end
  if fails ~= '' and not redis.call('HGET', FAILURES, item) then
    redis.call('HSET', FAILURES, item, fails)
  end
  if expiries ~= '' and not redis.call('HGET', FAILURES, xfield(item)) then
    redis.call('HSET', FAILURES, xfield(item), expiries)
    redis.call('HINCRBY', STATS, 'expiring', 1)
  end
end
return {mark_at, woke}
"#
);

static IMPORT_SCRIPT: Lua = Lua::new("migrate_import", IMPORT);

/// KEYS: as EXPORT's.
/// ARGV: per exported row, kind and item.
/// Reply: 0. Drops the imported rows from the old keys.
const REMOVE: &str = r#"
for i = 1, #ARGV, 2 do
  local kind, item = ARGV[i], ARGV[i + 1]
  if kind == 'r' then redis.call('ZREM', KEYS[1], item)
  elseif kind == 'd' then redis.call('ZREM', KEYS[2], item)
  else
    redis.call('ZREM', KEYS[3], item)
    redis.call('HDEL', KEYS[4], item)
  end
  redis.call('HDEL', KEYS[5], item, '!x|' .. item)
end
return 0
"#;

static REMOVE_SCRIPT: Lua = Lua::new("migrate_remove", REMOVE);

/// KEYS[1] -> any key under the old `{wq:job}` tag (it routes the script to that slot's node).
/// ARGV[1] -> SCAN cursor, ARGV[2] -> count.
/// Reply: `{cursor, {key, pttl, dump}…}` for the old per-Job keys (`exp:`, `view:`, `ev:`) the
/// SCAN step found, and DELs the old view session (not moved: views become untrusted).
const SCAN_OLD: &str = r#"
local r = redis.call('SCAN', ARGV[1], 'MATCH', '{wq:job}:*', 'COUNT', ARGV[2])
local out = {r[1]}
for _, k in ipairs(r[2]) do
  local rest = string.sub(k, #'{wq:job}:' + 1)
  if rest == 'view-session' or rest == 'view-run' then
    redis.call('DEL', k)
  elseif string.match(rest, '^exp:') or string.match(rest, '^view:') or string.match(rest, '^ev:') then
    local dump = redis.call('DUMP', k)
    if dump then out[#out + 1] = {k, redis.call('PTTL', k), dump} end
  end
end
return out
"#;

static SCAN_OLD_SCRIPT: Lua = Lua::new("migrate_scan", SCAN_OLD);

/// KEYS[1] -> the new key. ARGV[1] -> pttl (-1 = none), ARGV[2] -> DUMP payload.
/// Reply: 1 when restored (0: the new key exists already and wins).
const RESTORE: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local ttl = tonumber(ARGV[1])
if ttl < 0 then ttl = 0 end
redis.call('RESTORE', KEYS[1], ttl, ARGV[2])
return 1
"#;

static RESTORE_SCRIPT: Lua = Lua::new("migrate_restore", RESTORE);

/// KEYS[1] -> the old key. Reply: 0.
const DEL: &str = "redis.call('DEL', KEYS[1]) return 0";

static DEL_SCRIPT: Lua = Lua::new("migrate_del", DEL);

/// What a migration moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Migrated {
    /// Queue entries (ready, delayed or leased items) moved.
    pub items: u64,
    /// Per-Job keys moved (or dropped because a newer key of that name existed).
    pub keys: u64,
}

/// One EXPORT row.
struct Row {
    kind: String,
    item: String,
    fields: Vec<Vec<u8>>,
}

impl Store {
    /// Moves whatever the data set holds of the unsharded layout into the shards, unless that
    /// was done (see the module docs). Run at start, before serving.
    pub(crate) async fn migrate_unsharded(&self) -> Result<Migrated, WqError> {
        let mut get = redis::cmd("GET");
        get.arg(MIGRATED_KEY);
        if self.command::<Option<String>>("migrated", &mut get).await?.is_some() {
            return Ok(Migrated::default());
        }
        let mut done = Migrated::default();
        for queue in kjob_core::QUEUES {
            done.items += self.migrate_queue(queue).await?;
        }
        done.keys = self.migrate_job_keys().await?;
        let mut set = redis::cmd("SET");
        set.arg(MIGRATED_KEY).arg("1");
        self.command::<()>("migrated", &mut set).await?;
        if done != Migrated::default() {
            tracing::info!(
                items = done.items,
                keys = done.keys,
                "moved the unsharded layout's items and keys into the shards"
            );
        }
        Ok(done)
    }

    async fn migrate_queue(&self, queue: &str) -> Result<u64, WqError> {
        let old = |s: &str| format!("{{wq:{queue}}}:{s}");
        let keys = [old("ready"), old("delayed"), old("leases"), old("lease"), old("failures")];
        let mut moved = 0;
        loop {
            let v: Value = self.run(&EXPORT_SCRIPT, &keys, argv![PAGE]).await?;
            let mut rows = Vec::new();
            for mut r in Fields::new("migrate_export", &v)?.rest("row")? {
                let kind = r.string("kind")?;
                let item = r.string("item")?;
                let mut fields = vec![kind.arg(), item.arg()];
                for name in ["score", "record", "failures", "expiries"] {
                    fields.push(r.bytes(name)?);
                }
                rows.push(Row { kind, item, fields });
            }
            if rows.is_empty() {
                break;
            }
            let mut by_shard: BTreeMap<u32, Vec<Vec<u8>>> = BTreeMap::new();
            for r in &rows {
                by_shard
                    .entry(self.layout().shard_of(&r.item))
                    .or_default()
                    .extend(r.fields.iter().cloned());
            }
            for (shard, args) in by_shard {
                let qk = self.queue_keys(queue, shard).to_vec();
                let v: Value = self.run(&IMPORT_SCRIPT, &qk, args).await?;
                let mut f = Fields::new("migrate_import", &v)?;
                let (at, woke) = crate::ops::read_mark(&mut f)?;
                self.mark(queue, shard, at, woke).await?;
            }
            let args = rows.iter().flat_map(|r| [r.kind.arg(), r.item.arg()]).collect();
            self.run::<i64>(&REMOVE_SCRIPT, &keys, args).await?;
            moved += rows.len() as u64;
        }
        let mut del = redis::cmd("DEL");
        del.arg(old("stats"));
        self.command::<i64>("migrate_stats", &mut del).await?;
        Ok(moved)
    }

    async fn migrate_job_keys(&self) -> Result<u64, WqError> {
        let route = [format!("{{wq:{}}}:ready", kjob_core::JOB_QUEUE)];
        let (mut cursor, mut moved) = ("0".to_string(), 0);
        loop {
            let v: Value = self.run(&SCAN_OLD_SCRIPT, &route, argv![&cursor, PAGE]).await?;
            let mut f = Fields::new("migrate_scan", &v)?;
            cursor = f.string("cursor")?;
            for mut k in f.rest("key")? {
                let old = k.string("key")?;
                let ttl = k.int("pttl")?;
                let dump = k.bytes("dump")?;
                let Some(new) = self.new_name(&old) else { continue };
                self.run::<i64>(&RESTORE_SCRIPT, &[new], argv![ttl, &dump]).await?;
                self.run::<i64>(&DEL_SCRIPT, &[old], Vec::new()).await?;
                moved += 1;
            }
            if cursor == "0" {
                return Ok(moved);
            }
        }
    }

    /// The sharded name of old per-Job key `old` (`{wq:job}:<kind>:<ns/name>[:<suffix>]`).
    fn new_name(&self, old: &str) -> Option<String> {
        let rest = old.strip_prefix("{wq:job}:")?;
        let key = rest.split(':').nth(1)?;
        Some(format!("{}:{rest}", self.layout().job_tag(key)))
    }
}
