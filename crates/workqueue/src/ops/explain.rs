//! EXPLAIN and NAMESPACES: read-only answers to "why is this key where it is" and "what is each
//! namespace waiting on", for the admin port's explain API. Neither writes anything.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use redis::Value;

use crate::keys::{hist_key, queue_prelude, syncs_index_key, syncs_key};
use crate::lua::Lua;
use crate::lua::argv;
use crate::lua::queue_fns;
use crate::reply::{Fields, Reply};
use crate::store::{KeyState, Store, live_record};
use crate::{ExpectationRecord, WqError};

/// Newest history entries kept per item (the `HIST_MAX` of `queue_fns!`'s `hist`): enough
/// for the last few dozen troubles of a Job, while a failing Job's list stays a few KiB.
pub const HISTORY_MAX_ENTRIES: usize = 50;

/// How long a history outlives its newest entry (the `HIST_TTL_MS` of `queue_fns!`): a week,
/// the default idle life of a Job's other keys.
pub const HISTORY_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// One generation of the last-Done hashes (the `LAST_GEN_MS` of `queue_fns!`): a Job's last
/// Done stays readable one to two generations after it, while a hash holds only the Jobs that
/// finished a lease in the last two days.
pub const LAST_SYNC_GENERATION: Duration = Duration::from_secs(24 * 3600);

/// KEYS: the [`QueueKeys`](crate::keys::QueueKeys) of the item's shard, then the five
/// [`ExpKeys`](crate::keys::ExpKeys) of the item (KEYS[7..=11]), then its history key
/// ([`hist_key`], KEYS[12]).
/// ARGV[1] -> item, ARGV[2] -> history entries to read.
/// Reply: [`Explain`] `{now, ready score (-1 = not ready), rank in its namespace's ready set of
/// the shard (-1), that set's size, namespaces in the shard's round robin, the namespace's place
/// in it (1-based, 0 = none), its deficit, due, deadline, lease record ('' = none), failures,
/// expiries, {uid, add, del, ts} ('' = none), {record name, value}… flat, {history entry}…,
/// last Done ('' = none), priority (`hs|priority`, '' = none: 0)}`.
const EXPLAIN: &str = concat!(
    queue_prelude!(),
    queue_fns!(),
    r#"
local item = ARGV[1]
local ns = ns_of(item)
local rk = rkey(ns)
local score = redis.call('ZSCORE', rk, item)
local ready, rank = -1, -1
if score then
  ready = tonumber(score)
  rank = redis.call('ZRANK', rk, item)
end
-- O(namespaces of the shard): the round robin is a short list of namespaces with ready work.
local rr = redis.call('LRANGE', RR, 0, -1)
local rr_at = 0
for i, n in ipairs(rr) do
  if n == ns then
    rr_at = i
    break
  end
end
local exp = redis.call('HMGET', KEYS[7], 'uid', 'add', 'del', 'ts')
local e = {}
for i = 1, 4 do e[i] = exp[i] or '' end
local lk, generation = last_key_now()
local last = redis.call('HGET', lk, item) or redis.call('HGET', last_key(generation - 1), item) or ''
return {now, ready, rank, redis.call('ZCARD', rk), #rr, rr_at,
  tonumber(redis.call('HGET', DRR, ns) or 0),
  tonumber(redis.call('ZSCORE', DELAYED, item) or -1),
  tonumber(redis.call('ZSCORE', LEASES, item) or -1),
  redis.call('HGET', LEASE, item) or '',
  tonumber(redis.call('HGET', FAILURES, item) or 0),
  tonumber(redis.call('HGET', FAILURES, xfield(item)) or 0),
  e, redis.call('HGETALL', KEYS[10]), redis.call('LRANGE', KEYS[12], -tonumber(ARGV[2]), -1),
  last, redis.call('HGET', PRIO, item) or ''}
"#
);

static EXPLAIN_SCRIPT: Lua = Lua::new("explain", EXPLAIN);

/// KEYS: the [`QueueKeys`](crate::keys::QueueKeys) of one shard.
/// ARGV[1] -> namespace, ARGV[2] -> order score (-1 = none).
/// Reply: `{ready keys of the namespace in the shard, those with a lower score}`.
const NS_DEPTH: &str = concat!(
    queue_prelude!(),
    queue_fns!(),
    r#"
local rk = rkey(ARGV[1])
local below = 0
if tonumber(ARGV[2]) >= 0 then below = redis.call('ZCOUNT', rk, '-inf', '(' .. ARGV[2]) end
return {redis.call('ZCARD', rk), below}
"#
);

static NS_DEPTH_SCRIPT: Lua = Lua::new("ns depth", NS_DEPTH);

/// Everything the queue holds about one key, read in one script (one consistent moment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explain {
    /// The key.
    pub key: String,
    /// Redis time of the read (Unix ms).
    pub now_ms: i64,
    /// Where the key is (leased wins over ready wins over delayed).
    pub state: KeyState,
    /// When it became ready, if ready.
    pub ready_ms: Option<i64>,
    /// The Job's pod priority the queue holds for it (0 when none was sent).
    pub priority: i32,
    /// The head start that priority gives it in its namespace's order (its order score is
    /// `ready_ms` less this; see [`crate::PRIORITY_AGING`]).
    pub head_start: Duration,
    /// If ready: how many ready keys of its namespace are ahead of it, over every shard.
    pub ready_position: Option<u64>,
    /// Ready keys of its namespace, over every shard (the namespace's depth).
    pub namespace_ready: u64,
    /// Its namespace's turn in the deficit round robin of its shard.
    pub round_robin: RoundRobin,
    /// Due time of its delayed entry, if any.
    pub due_ms: Option<i64>,
    /// Its lease, if leased.
    pub lease: Option<LeaseInfo>,
    /// Rate-limited failures since the last success (requeues after an error).
    pub requeues: u32,
    /// The delay the rate limiter gives its next error (the DONE script's formula).
    pub next_delay: Duration,
    /// Leases that expired in a row without a Done.
    pub expiries: u32,
    /// Its expectation record (job queue), if any.
    pub expectations: Option<ExpectationRecord>,
    /// Its records that have not expired (name, value), e.g. the pod-failure backoff.
    pub records: Vec<(String, Vec<u8>)>,
    /// Its newest history entries, oldest first (only what was off the happy path).
    pub history: Vec<HistoryEntry>,
    /// Its last Done (a [`HistoryEntry::Synced`]), if one came in the last day or two.
    pub last_sync: Option<HistoryEntry>,
}

/// A namespace's place in the deficit round robin of one shard (leases take from the head).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundRobin {
    /// Namespaces with ready work in the shard.
    pub namespaces: u32,
    /// The namespace's 0-based place in that list (0 = served next), if it is in it.
    pub position: Option<u32>,
    /// What is left of its deficit from an unfinished turn.
    pub deficit: i64,
}

/// A lease as explain shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInfo {
    /// The worker holding it.
    pub worker: String,
    /// Its fencing id.
    pub lease_id: String,
    /// When it was granted (Unix ms).
    pub started_ms: i64,
    /// Its deadline (Unix ms).
    pub deadline_ms: i64,
    /// When the key was added again while leased (its Done puts it back), if it was.
    pub dirty_ms: Option<i64>,
}

/// How a recorded sync ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncEnd {
    /// Success: the key's failures were forgotten.
    Forget,
    /// Error: requeued through the rate limiter.
    Error,
    /// Success asking for another sync after a delay.
    RequeueAfter,
}

impl SyncEnd {
    /// The lowercase name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            SyncEnd::Forget => "forget",
            SyncEnd::Error => "error",
            SyncEnd::RequeueAfter => "requeue_after",
        }
    }
}

/// One event of a key's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HistoryEntry {
    /// An Add enqueued the key.
    Enqueued {
        /// When (Unix ms).
        at_ms: i64,
        /// The delay asked for (0 = now).
        delay_ms: i64,
        /// Expectation observations the Add carried (more than zero: a pod event).
        observations: u32,
    },
    /// A lease of the key ended with a Done.
    Synced {
        /// When the Done came (Unix ms).
        at_ms: i64,
        /// When the lease began.
        leased_ms: i64,
        /// The worker that held it.
        worker: String,
        /// How it ended.
        end: SyncEnd,
        /// The delay of the requeue it asked for or the rate limiter gave, if any.
        delay_ms: Option<i64>,
        /// The sync's error (truncated), empty when none was given.
        error: String,
    },
    /// A lease of the key expired without a Done (the lease reaper put it back).
    Expired {
        /// When the reaper found it (Unix ms).
        at_ms: i64,
        /// When the lease began (-1 = unknown).
        leased_ms: i64,
        /// Expiries in a row without a Done, this one included.
        expiries: u32,
        /// The expiries reached the poison threshold: requeued through the rate limiter.
        poisoned: bool,
        /// The worker that held it.
        worker: String,
    },
}

impl HistoryEntry {
    /// When it happened (Unix ms).
    pub fn at_ms(&self) -> i64 {
        match self {
            HistoryEntry::Enqueued { at_ms, .. }
            | HistoryEntry::Synced { at_ms, .. }
            | HistoryEntry::Expired { at_ms, .. } => *at_ms,
        }
    }

    /// Reads one entry as the scripts write it (see `hist_fn!`); `None` for a form this version
    /// does not know (a newer writer), which is skipped rather than failing the whole read.
    pub(crate) fn parse(raw: &[u8]) -> Option<Self> {
        let s = std::str::from_utf8(raw).ok()?;
        let mut p = s.splitn(7, '|');
        match p.next()? {
            "e" => Some(HistoryEntry::Enqueued {
                at_ms: p.next()?.parse().ok()?,
                delay_ms: p.next()?.parse().ok()?,
                observations: p.next()?.parse().ok()?,
            }),
            "d" => {
                let at_ms = p.next()?.parse().ok()?;
                let leased_ms = p.next()?.parse().ok()?;
                let end = match p.next()? {
                    "1" => SyncEnd::Forget,
                    "2" => SyncEnd::Error,
                    "3" => SyncEnd::RequeueAfter,
                    _ => return None,
                };
                let delay: i64 = p.next()?.parse().ok()?;
                let worker_len: usize = p.next()?.parse().ok()?;
                let rest = p.next()?;
                let worker = rest.get(..worker_len)?.to_string();
                let error = rest.get(worker_len..)?.to_string();
                Some(HistoryEntry::Synced {
                    at_ms,
                    leased_ms,
                    worker,
                    end,
                    delay_ms: (delay >= 0).then_some(delay),
                    error,
                })
            }
            "x" => Some(HistoryEntry::Expired {
                at_ms: p.next()?.parse().ok()?,
                leased_ms: p.next()?.parse().ok()?,
                expiries: p.next()?.parse().ok()?,
                poisoned: p.next()? == "1",
                // The worker goes last: it is free-form.
                worker: p.collect::<Vec<_>>().join("|"),
            }),
            _ => None,
        }
    }
}

/// Reads a nested array of strings.
fn strings(f: &mut Fields<'_>, what: &'static str) -> Result<Vec<Vec<u8>>, WqError> {
    let mut a = f.array(what)?;
    let mut out = Vec::with_capacity(a.remaining());
    while a.remaining() > 0 {
        out.push(a.bytes(what)?);
    }
    Ok(out)
}

impl Store {
    /// What the queue knows about `key` of `queue` (its place, lease, failures, expectations,
    /// records and history) read in one script on its shard, with its namespace's depth and the
    /// key's position read from every other shard; `None` when nothing at all is known about it
    /// (never queued, or forgotten long enough for every trace to expire).
    pub async fn explain(&self, queue: &str, key: &str) -> Result<Option<Explain>, WqError> {
        let shard = self.layout().shard_of(key);
        let tag = self.layout().tag(queue, shard);
        let mut keys = self.queue_keys(queue, shard).to_vec();
        keys.extend(crate::keys::ExpKeys::new(&tag, key).to_vec());
        keys.push(hist_key(&tag, key));
        let args = argv![key, HISTORY_MAX_ENTRIES];
        let v: Value = self.run(&EXPLAIN_SCRIPT, &keys, args).await?;
        let mut f = Fields::new("explain", &v)?;
        let now_ms = f.int("now")?;
        let score = f.opt("ready")?;
        let rank = f.opt("ready_rank")?;
        let mut namespace_ready = f.u64("namespace_ready")?;
        let rr_len = f.count("round_robin")?;
        let rr_at = f.count("round_robin_at")?;
        let deficit = f.int("deficit")?;
        let due_ms = f.opt("due")?;
        let deadline = f.opt("deadline")?;
        let lease_rec = f.string("lease record")?;
        let requeues = f.count("failures")?;
        let expiries = f.count("expiries")?;
        let exp = strings(&mut f, "expectations")?;
        let recs = strings(&mut f, "records")?;
        let hist = strings(&mut f, "history")?;
        let last = f.bytes("last sync")?;
        let prio = f.string("priority")?;
        let (head_start, priority) = match prio.split_once('|') {
            Some((hs, p)) => {
                (Duration::from_millis(hs.parse().unwrap_or(0)), p.parse().unwrap_or(0))
            }
            None => (Duration::ZERO, 0),
        };
        let ready_ms = score.map(|s| s + head_start.as_millis() as i64);

        // Keys of its namespace in the other shards: their count, and those ahead of it.
        let mut ready_position = rank.map(i64::unsigned_abs);
        let ns = key.split_once('/').map_or("", |(ns, _)| ns);
        let others = (0..self.layout().shards()).filter(|s| *s != shard).map(|s| {
            let keys = self.queue_keys(queue, s).to_vec();
            let args = argv![ns, score.unwrap_or(-1)];
            async move { self.run::<Value>(&NS_DEPTH_SCRIPT, &keys, args).await }
        });
        for r in futures::future::join_all(others).await {
            let v = r?;
            let mut f = Fields::new("ns depth", &v)?;
            namespace_ready += f.u64("ready")?;
            let below = f.u64("below")?;
            if let Some(p) = ready_position.as_mut() {
                *p += below;
            }
        }

        let lease = match deadline {
            Some(deadline_ms) => Some(parse_lease(&lease_rec, deadline_ms)?),
            None => None,
        };
        let expectations = match exp.as_slice() {
            [uid, add, del, ts] if !ts.is_empty() => {
                let num = |b: &[u8], what| {
                    std::str::from_utf8(b).ok().and_then(|s| s.parse().ok()).ok_or_else(|| {
                        WqError::Protocol(format!("explain: expectation {what} {b:?}"))
                    })
                };
                Some(ExpectationRecord {
                    job_uid: String::from_utf8_lossy(uid).into_owned(),
                    add: num(add, "add")?,
                    del: num(del, "del")?,
                    set_at_ms: num(ts, "ts")?,
                })
            }
            _ => None,
        };
        let records: Vec<(String, Vec<u8>)> = recs
            .chunks_exact(2)
            .filter_map(|kv| {
                let value = live_record(&kv[1], now_ms)?;
                Some((String::from_utf8_lossy(&kv[0]).into_owned(), value))
            })
            .collect();
        let history: Vec<HistoryEntry> =
            hist.iter().filter_map(|h| HistoryEntry::parse(h)).collect();
        let last_sync = HistoryEntry::parse(&last);
        let state = if lease.is_some() {
            KeyState::Leased
        } else if ready_ms.is_some() {
            KeyState::Ready
        } else if due_ms.is_some() {
            KeyState::Delayed
        } else {
            KeyState::Absent
        };
        let known = state != KeyState::Absent
            || requeues > 0
            || expiries > 0
            || expectations.is_some()
            || !records.is_empty()
            || !history.is_empty()
            || last_sync.is_some();
        if !known {
            return Ok(None);
        }
        Ok(Some(Explain {
            key: key.to_string(),
            now_ms,
            state,
            ready_ms,
            priority,
            head_start,
            ready_position,
            namespace_ready,
            round_robin: RoundRobin { namespaces: rr_len, position: rr_at.checked_sub(1), deficit },
            due_ms,
            lease,
            requeues,
            next_delay: self.config().limiter.when(requeues),
            expiries,
            expectations,
            records,
            history,
            last_sync,
        }))
    }
}

/// Reads a lease record `id|start|requeues|expiries|dirtyAt|worker`.
fn parse_lease(rec: &str, deadline_ms: i64) -> Result<LeaseInfo, WqError> {
    let bad = || WqError::Protocol(format!("explain: lease record {rec:?}"));
    let mut p = rec.splitn(6, '|');
    let lease_id = p.next().ok_or_else(bad)?.to_string();
    let started_ms = p.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    let _requeues = p.next().ok_or_else(bad)?;
    let _expiries = p.next().ok_or_else(bad)?;
    let dirty: i64 = p.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    let worker = p.next().ok_or_else(bad)?.to_string();
    Ok(LeaseInfo {
        worker,
        lease_id,
        started_ms,
        deadline_ms,
        dirty_ms: (dirty >= 0).then_some(dirty),
    })
}

/// KEYS: the [`QueueKeys`](crate::keys::QueueKeys) of one shard.
/// ARGV[1] -> most members read from each of delayed and leases, and most namespaces.
/// Reply: [`ShardNamespaces`] `{now, truncated (0/1), {ns, ready, delayed, leased, oldest_ready
/// (-1 = none)}…}`.
///
/// Ready counts cost O(namespaces) (a set per namespace, listed in the round robin); delayed
/// and leased keys share one set per shard, which is walked: O(items) of Redis time (a few ms
/// for 10,000), an operator's page, not a probe.
const NAMESPACES: &str = concat!(
    queue_prelude!(),
    queue_fns!(),
    r#"
local max = tonumber(ARGV[1])
local acc, order = {}, {}
local function get(ns)
  local a = acc[ns]
  if not a then
    a = {ns, 0, 0, 0, -1}
    acc[ns] = a
    order[#order + 1] = a
  end
  return a
end
local truncated = 0
if redis.call('LLEN', RR) > max then truncated = 1 end
for _, ns in ipairs(redis.call('LRANGE', RR, 0, max - 1)) do
  local a = get(ns)
  local k = rkey(ns)
  a[2] = redis.call('ZCARD', k)
  local head = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
  -- The next key's ready time: its score plus its priority head start.
  if #head > 0 then a[5] = tonumber(head[2]) + head_start(head[1]) end
end
local function walk(key, field)
  if redis.call('ZCARD', key) > max then truncated = 1 end
  for _, item in ipairs(redis.call('ZRANGE', key, 0, max - 1)) do
    local a = get(ns_of(item))
    a[field] = a[field] + 1
  end
end
walk(DELAYED, 3)
walk(LEASES, 4)
local out = {now, truncated}
for _, a in ipairs(order) do out[#out + 1] = a end
return out
"#
);

static NAMESPACES_SCRIPT: Lua = Lua::new("namespaces", NAMESPACES);

/// Most members [`Store::namespaces`] reads from each set of a shard (and most namespaces):
/// bounds the time the script holds Redis (about 1 ms per 10,000); past it the counts are a
/// lower bound and say so.
pub const NAMESPACES_MAX_SCAN: u32 = 200_000;

/// One namespace's share of a queue.
#[derive(Debug, Clone, PartialEq)]
pub struct NamespaceStats {
    /// The namespace.
    pub namespace: String,
    /// Keys ready.
    pub ready: u64,
    /// Keys delayed.
    pub delayed: u64,
    /// Keys leased.
    pub leased: u64,
    /// Ready time of the key leased next in the namespace (the lowest order score, with its
    /// priority head start added back): the oldest ready key unless priorities reorder them.
    pub oldest_ready_ms: Option<i64>,
    /// Dones per second, summed over the kjob-queue replicas that published theirs in the
    /// last [`SYNC_RATE_STALE`].
    pub syncs_per_second: f64,
}

/// A queue's namespaces.
#[derive(Debug, Clone, PartialEq)]
pub struct Namespaces {
    /// Redis time of the read.
    pub now_ms: i64,
    /// A set held more than [`NAMESPACES_MAX_SCAN`] members: counts are lower bounds.
    pub truncated: bool,
    /// Namespaces with a key in the queue or recent syncs, by name.
    pub namespaces: Vec<NamespaceStats>,
    /// kjob-queue replicas whose sync rates are counted.
    pub replicas: u32,
}

/// One shard's answer to NAMESPACES.
struct ShardNamespaces {
    now_ms: i64,
    truncated: bool,
    rows: Vec<NamespaceStats>,
}

impl Reply for ShardNamespaces {
    fn read(what: &'static str, v: &Value) -> Result<Self, WqError> {
        let mut f = Fields::new(what, v)?;
        let now_ms = f.int("now")?;
        let truncated = f.flag("truncated")?;
        let mut rows = Vec::new();
        for mut row in f.rest("namespace")? {
            rows.push(NamespaceStats {
                namespace: row.string("namespace")?,
                ready: row.u64("ready")?,
                delayed: row.u64("delayed")?,
                leased: row.u64("leased")?,
                oldest_ready_ms: row.opt("oldest_ready")?,
                syncs_per_second: 0.0,
            });
        }
        Ok(Self { now_ms, truncated, rows })
    }
}

/// Dones per second from a namespace's `window|count|previous count` at `now_ms`: the sliding
/// estimate `(previous · (1 − elapsed share of the window) + count) / window`, which weighs the
/// last full window by how much of it the last `window` still covers.
fn sliding_rate(w: i64, cur: u64, prev: u64, now_ms: i64, window: Duration) -> f64 {
    let w_ms = crate::store::ms(window).max(1);
    let now_w = now_ms.div_euclid(w_ms);
    let (cur, prev) = match now_w - w {
        0 => (cur, prev),
        1 => (0, cur),
        _ => return 0.0,
    };
    let share = now_ms.rem_euclid(w_ms) as f64 / w_ms as f64;
    (prev as f64 * (1.0 - share) + cur as f64) / window.as_secs_f64()
}

/// Length of one window of a replica's per-namespace Done counts: the rate is read over the
/// last full window and the current one, so it follows a change within about this long.
pub const SYNC_WINDOW: Duration = Duration::from_secs(10);

/// Most namespaces a replica counts Dones of (the busiest are published): bounds its memory
/// and its publication whatever the number of namespaces.
pub const SYNC_MAX_NAMESPACES: usize = 1000;

/// How often a kjob-queue replica publishes its per-namespace Done rates to Redis: one write
/// per replica per period instead of one per Done, fresh enough for an operator's page.
pub const SYNC_PUBLISH_PERIOD: Duration = Duration::from_secs(5);

/// A replica's publication older than this is no longer counted (it stopped or lost Redis),
/// and expires: three periods, so one late publication is not a gap.
pub const SYNC_RATE_STALE: Duration = Duration::from_secs(15);

/// The Dones per namespace one kjob-queue replica finished, kept in its memory (no Redis write
/// per Done) and published every [`SYNC_PUBLISH_PERIOD`] with [`Store::publish_sync_rates`].
#[derive(Debug, Default)]
pub struct SyncCounter {
    counts: Mutex<HashMap<String, (i64, u64, u64)>>,
}

impl SyncCounter {
    /// Counts `n` Dones of namespace `ns` at `now_ms` (Unix ms). A namespace beyond
    /// [`SYNC_MAX_NAMESPACES`] is not counted until a quiet one is dropped.
    pub fn record(&self, ns: &str, n: u64, now_ms: i64) {
        let w = now_ms.div_euclid(crate::store::ms(SYNC_WINDOW).max(1));
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if !counts.contains_key(ns) {
            if counts.len() >= SYNC_MAX_NAMESPACES {
                counts.retain(|_, (pw, _, _)| *pw >= w - 1);
                if counts.len() >= SYNC_MAX_NAMESPACES {
                    return;
                }
            }
            counts.insert(ns.to_string(), (w, 0, 0));
        }
        if let Some((pw, cur, prev)) = counts.get_mut(ns) {
            if *pw == w {
                *cur += n;
            } else {
                (*prev, *cur) = if *pw == w - 1 { (*cur, n) } else { (0, n) };
                *pw = w;
            }
        }
    }

    /// Dones per second of each namespace with any in the last two windows, at `now_ms`;
    /// quieter namespaces are forgotten.
    pub fn rates(&self, now_ms: i64) -> Vec<(String, f64)> {
        let w = now_ms.div_euclid(crate::store::ms(SYNC_WINDOW).max(1));
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.retain(|_, (pw, _, _)| *pw >= w - 1);
        let mut out: Vec<(String, f64)> = counts
            .iter()
            .map(|(ns, (pw, cur, prev))| {
                (ns.clone(), sliding_rate(*pw, *cur, *prev, now_ms, SYNC_WINDOW))
            })
            .filter(|(_, r)| *r > 0.0)
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// KEYS[1] -> the replicas' index ([`syncs_index_key`]), KEYS[2] -> this replica's rates
/// ([`syncs_key`]).
/// ARGV[1] -> replica, ARGV[2] -> stale_ms, then namespace, rate pairs.
/// Reply: now.
const PUBLISH_SYNCS: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local stale = tonumber(ARGV[2])
redis.call('DEL', KEYS[2])
if #ARGV > 2 then
  redis.call('HSET', KEYS[2], unpack(ARGV, 3))
  redis.call('PEXPIRE', KEYS[2], stale)
end
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - stale)
redis.call('PEXPIRE', KEYS[1], stale)
return now
"#;

static PUBLISH_SYNCS_SCRIPT: Lua = Lua::new("publish syncs", PUBLISH_SYNCS);

/// KEYS[1] -> the replicas' index ([`syncs_index_key`]); each replica's rates are the key
/// `KEYS[1] .. ':' .. replica` ([`syncs_key`]), in the same slot.
/// ARGV[1] -> stale_ms.
/// Reply: `{replica, {namespace, rate}… flat}…` flat.
const READ_SYNCS: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for _, r in ipairs(redis.call('ZRANGE', KEYS[1], now - tonumber(ARGV[1]), '+inf', 'BYSCORE')) do
  out[#out + 1] = r
  out[#out + 1] = redis.call('HGETALL', KEYS[1] .. ':' .. r)
end
return out
"#;

static READ_SYNCS_SCRIPT: Lua = Lua::new("read syncs", READ_SYNCS);

impl Store {
    /// Publishes replica `replica`'s Dones per second per namespace of `queue` (replacing its
    /// last publication), for [`Store::namespaces`] to sum over the live replicas.
    pub async fn publish_sync_rates(
        &self,
        queue: &str,
        replica: &str,
        rates: &[(String, f64)],
    ) -> Result<(), WqError> {
        let keys = vec![syncs_index_key(queue), syncs_key(queue, replica)];
        let mut args = argv![replica, SYNC_RATE_STALE];
        for (ns, r) in rates.iter().take(SYNC_MAX_NAMESPACES) {
            args.push(ns.as_bytes().to_vec());
            args.push(format!("{r:.3}").into_bytes());
        }
        let _: Value = self.run(&PUBLISH_SYNCS_SCRIPT, &keys, args).await?;
        Ok(())
    }

    /// Per namespace of `queue`: ready, delayed and leased keys and its oldest ready key (one
    /// script per shard) and its syncs per second (summed over the replicas' publications), so
    /// any replica answers alike.
    pub async fn namespaces(&self, queue: &str) -> Result<Namespaces, WqError> {
        self.namespaces_within(queue, NAMESPACES_MAX_SCAN).await
    }

    /// [`Store::namespaces`] reading at most `max_scan` members of each set of a shard (and
    /// at most that many namespaces): a periodic reader bounds how long each script holds
    /// Redis below [`NAMESPACES_MAX_SCAN`]; past the bound the counts are lower bounds and
    /// [`Namespaces::truncated`] says so.
    pub async fn namespaces_within(
        &self,
        queue: &str,
        max_scan: u32,
    ) -> Result<Namespaces, WqError> {
        let max_scan = max_scan.max(1);
        let calls =
            (0..self.layout().shards()).map(|shard| {
                let keys = self.queue_keys(queue, shard).to_vec();
                async move {
                    self.run::<ShardNamespaces>(&NAMESPACES_SCRIPT, &keys, argv![max_scan]).await
                }
            });
        let mut by_ns: BTreeMap<String, NamespaceStats> = BTreeMap::new();
        let (mut now_ms, mut truncated) = (0, false);
        for r in futures::future::join_all(calls).await {
            let shard = r?;
            now_ms = now_ms.max(shard.now_ms);
            truncated |= shard.truncated;
            for row in shard.rows {
                let e = by_ns.entry(row.namespace.clone()).or_insert_with(|| NamespaceStats {
                    namespace: row.namespace.clone(),
                    ready: 0,
                    delayed: 0,
                    leased: 0,
                    oldest_ready_ms: None,
                    syncs_per_second: 0.0,
                });
                e.ready += row.ready;
                e.delayed += row.delayed;
                e.leased += row.leased;
                e.oldest_ready_ms = match (e.oldest_ready_ms, row.oldest_ready_ms) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
        }
        let v: Value =
            self.run(&READ_SYNCS_SCRIPT, &[syncs_index_key(queue)], argv![SYNC_RATE_STALE]).await?;
        let mut f = Fields::new("read syncs", &v)?;
        let mut replicas = 0;
        while f.remaining() > 0 {
            let _replica = f.bytes("replica")?;
            replicas += 1;
            for kv in strings(&mut f, "rates")?.chunks_exact(2) {
                let ns = String::from_utf8_lossy(&kv[0]).into_owned();
                let rate: f64 = std::str::from_utf8(&kv[1])
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .filter(|r: &f64| r.is_finite() && *r >= 0.0)
                    .unwrap_or(0.0);
                by_ns
                    .entry(ns.clone())
                    .or_insert_with(|| NamespaceStats {
                        namespace: ns,
                        ready: 0,
                        delayed: 0,
                        leased: 0,
                        oldest_ready_ms: None,
                        syncs_per_second: 0.0,
                    })
                    .syncs_per_second += rate;
            }
        }
        Ok(Namespaces { now_ms, truncated, namespaces: by_ns.into_values().collect(), replicas })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_entries_read_back_and_unknown_ones_are_skipped() {
        assert_eq!(
            HistoryEntry::parse(b"e|1000|1000|2"),
            Some(HistoryEntry::Enqueued { at_ms: 1000, delay_ms: 1000, observations: 2 })
        );
        assert_eq!(
            HistoryEntry::parse(b"d|2000|1500|2|4000|4|w|1aerror: x|y"),
            Some(HistoryEntry::Synced {
                at_ms: 2000,
                leased_ms: 1500,
                worker: "w|1a".into(),
                end: SyncEnd::Error,
                delay_ms: Some(4000),
                error: "error: x|y".into(),
            })
        );
        assert_eq!(HistoryEntry::parse(b"d|2000|1500|1|-1|1|w").map(|e| e.at_ms()), Some(2000));
        assert_eq!(HistoryEntry::parse(b"z|1"), None);
        assert_eq!(HistoryEntry::parse(b"d|2000|1500|9|-1|1|w"), None);
        assert_eq!(HistoryEntry::parse(b"d|2000|1500|1|-1|5|w"), None);
    }

    #[test]
    fn lease_records_read_back() {
        let l = parse_lease("7-100|100|0|1|-1|worker|a", 500).unwrap();
        assert_eq!((l.worker.as_str(), l.started_ms, l.dirty_ms), ("worker|a", 100, None));
        assert_eq!(parse_lease("7-100|100|0|1|300|w", 500).unwrap().dirty_ms, Some(300));
        assert!(parse_lease("junk", 1).is_err());
    }

    #[test]
    fn the_scripts_keep_what_the_reader_expects() {
        let lua = crate::lua::queue_fns!();
        let line = format!("local HIST_MAX = {HISTORY_MAX_ENTRIES}\n");
        assert!(lua.contains(&line), "queue_fns! defines {line:?}");
        let line = format!("local HIST_TTL_MS = {}\n", HISTORY_TTL.as_millis());
        assert!(lua.contains(&line), "queue_fns! defines {line:?}");
        let line = format!("local LAST_GEN_MS = {}\n", LAST_SYNC_GENERATION.as_millis());
        assert!(lua.contains(&line), "queue_fns! defines {line:?}");
        // READ_SYNCS names each replica's key as `syncs_key` does.
        assert_eq!(syncs_key("job", "r"), format!("{}:r", syncs_index_key("job")));
    }

    #[test]
    fn expiries_read_back() {
        assert_eq!(
            HistoryEntry::parse(b"x|3000|1000|2|1|w|1"),
            Some(HistoryEntry::Expired {
                at_ms: 3000,
                leased_ms: 1000,
                expiries: 2,
                poisoned: true,
                worker: "w|1".into(),
            })
        );
        assert_eq!(HistoryEntry::parse(b"x|3000|1000"), None);
    }

    #[test]
    fn the_sync_rate_slides_over_two_windows() {
        let w = Duration::from_secs(10);
        // Window 5 (50 s–60 s): 20 now, 100 in the window before; at its start the previous
        // window counts whole, half-way through half of it.
        assert!((sliding_rate(5, 20, 100, 50_000, w) - 12.0).abs() < 1e-9);
        assert!((sliding_rate(5, 20, 100, 55_000, w) - 7.0).abs() < 1e-9);
        // The next window: the stored current becomes the previous.
        assert!((sliding_rate(5, 20, 100, 60_000, w) - 2.0).abs() < 1e-9);
        // Two windows later nothing is recent.
        assert_eq!(sliding_rate(5, 20, 100, 70_000, w), 0.0);
    }

    #[test]
    fn a_replica_counts_dones_per_namespace_in_memory() {
        let c = SyncCounter::default();
        // 100 Dones of `a` in window 5, 20 in window 6; `b` once in window 4.
        c.record("b", 1, 45_000);
        c.record("a", 100, 51_000);
        c.record("a", 20, 62_000);
        let r = c.rates(65_000);
        assert_eq!(r.len(), 1, "b is two windows old: {r:?}");
        assert_eq!(r[0].0, "a");
        assert!((r[0].1 - 7.0).abs() < 1e-9, "{r:?}");
        assert!(c.rates(90_000).is_empty());
        // The namespace bound: one more is refused while all are recent.
        let c = SyncCounter::default();
        for i in 0..SYNC_MAX_NAMESPACES {
            c.record(&format!("n{i}"), 1, 1_000);
        }
        c.record("late", 1, 1_000);
        assert_eq!(c.rates(1_000).len(), SYNC_MAX_NAMESPACES);
        assert!(c.rates(1_000).iter().all(|(ns, _)| ns != "late"));
        // Once they are quiet, a new one takes a place.
        c.record("late", 1, 40_000);
        assert_eq!(c.rates(40_000), vec![("late".to_string(), 0.1)]);
    }
}
