//! The Redis keys of a queue and of a Job's expectations: named once here, with the Lua that
//! binds them to `KEYS[i]` beside the Rust that puts them there, so the order cannot drift.
//!
//! The layout is sharded (docs/decisions/redis-key-layout.md): a queue is split into
//! [`Layout::shards`] shards; a key belongs to shard `fnv1a64(key) mod S`, and every key of
//! that shard (its part of the queue, and each of its Jobs' expectations, records, view and
//! event state) carries the shard's hash tag, so one Job's scripts touch one Cluster slot while
//! different Jobs spread over the slots. Beside the shards, each queue keeps a small index under
//! its own tag `{wq:<queue>}` ([`IndexKeys`]): which shards may have work, and the wake marker.

/// Default of [`Layout::shards`]: divisible by 2, 3, 4, 6, 8 and 12, so a cluster of that many
/// masters with contiguous slot ranges (as `redis-cli --cluster create` assigns them) holds the
/// same number of shards on each; few enough that upkeep over every shard (sweeps, stats, view
/// sessions) stays cheap.
pub const DEFAULT_SHARDS: u32 = 24;
/// Most shards a layout may have (the index and a probe of every shard stay small).
pub const MAX_SHARDS: u32 = 1024;
/// Redis Cluster's slot count.
const SLOTS: u32 = 16_384;

/// How a data set's keys are laid out: the number of shards, fixed for the life of the data set
/// (changing it is a migration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    shards: u32,
}

impl Default for Layout {
    fn default() -> Self {
        Self { shards: DEFAULT_SHARDS }
    }
}

impl Layout {
    /// A layout of `shards` shards (1 ..= [`MAX_SHARDS`]).
    pub fn new(shards: u32) -> Result<Self, crate::WqError> {
        if shards == 0 || shards > MAX_SHARDS {
            return Err(crate::WqError::Config(format!(
                "{shards} queue shards; 1 to {MAX_SHARDS} are allowed"
            )));
        }
        Ok(Self { shards })
    }

    /// The number of shards.
    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// The shard of key `key` (`namespace/name`): the same on every replica.
    pub fn shard_of(&self, key: &str) -> u32 {
        u32::try_from(fnv1a64(key.as_bytes()) % u64::from(self.shards)).unwrap_or(0)
    }

    /// The hash tag of shard `shard` of `queue`, braces included: `{wq:<queue>:<i>.<n>}` where
    /// `n` is the smallest integer that puts the tag's slot in the `i`-th of S equal slices of
    /// the slot space, so the shards cover the slots evenly and every master of a cluster with
    /// contiguous slot ranges gets an even share of them.
    pub fn tag(&self, queue: &str, shard: u32) -> String {
        let (lo, hi) = (shard * SLOTS / self.shards, (shard + 1) * SLOTS / self.shards);
        // Each try lands in the slice with probability 1/S: S tries on average.
        for n in 0u32.. {
            let inner = format!("wq:{queue}:{shard}.{n}");
            let slot = u32::from(crc16(inner.as_bytes())) % SLOTS;
            if (lo..hi).contains(&slot) {
                return format!("{{{inner}}}");
            }
        }
        unreachable!("some n puts the tag in its slice")
    }

    /// The tag of key `key`'s shard of the `job` queue, which its per-Job keys carry.
    pub fn job_tag(&self, key: &str) -> String {
        self.tag(kjob_core::JOB_QUEUE, self.shard_of(key))
    }
}

/// The layout of a new data set on a single Redis (`cluster` false) or a Cluster: one shard on
/// a single server, where shards add no capacity and a batch spread over S shards costs S
/// scripts; [`DEFAULT_SHARDS`] on a Cluster.
pub fn auto_layout(cluster: bool) -> Layout {
    Layout { shards: if cluster { DEFAULT_SHARDS } else { 1 } }
}

/// The key recording a data set's layout (its shard count), written by the first kjob-queue
/// that starts on it.
pub(crate) const LAYOUT_KEY: &str = "{wq:layout}";

/// KEYS[1] -> [`LAYOUT_KEY`]. ARGV[1] -> shards wanted for a new data set.
/// Reply: the recorded shard count (ARGV[1] if none was recorded: it is now).
const RECORD_LAYOUT: &str = r#"
redis.call('SET', KEYS[1], ARGV[1], 'NX')
return tonumber(redis.call('GET', KEYS[1]))
"#;

/// The layout recorded in the data set behind `conn`, recording `wanted` if there is none: every
/// replica, whatever its flags, uses the layout the data set was created with (keys of another
/// layout would be in other shards, unseen).
pub(crate) async fn recorded_layout(
    conn: &crate::conn::Conn,
    wanted: Layout,
) -> Result<Layout, crate::WqError> {
    let script = redis::Script::new(RECORD_LAYOUT);
    let mut inv = script.prepare_invoke();
    inv.key(LAYOUT_KEY).arg(wanted.shards);
    let mut conn = conn.clone();
    let reply =
        tokio::time::timeout(crate::conn::RESPONSE_TIMEOUT, inv.invoke_async::<i64>(&mut conn))
            .await
            .map_err(|_| {
                crate::WqError::Unavailable("recording the key layout: no reply".into())
            })??;
    Layout::new(u32::try_from(reply).unwrap_or(0))
}

/// FNV-1a, 64 bit: a stable hash every replica computes the same.
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// CRC16-CCITT (XMODEM), the hash Redis Cluster maps keys to slots with.
pub(crate) fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for b in bytes {
        crc ^= u16::from(*b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

/// The Cluster slot of `key` (its hash tag's, when it has one).
pub fn slot_of(key: &str) -> u16 {
    let b = key.as_bytes();
    let hashed = match b.iter().position(|c| *c == b'{') {
        Some(open) => match b[open + 1..].iter().position(|c| *c == b'}') {
            Some(len) if len > 0 => &b[open + 1..open + 1 + len],
            _ => b,
        },
        None => b,
    };
    crc16(hashed) % 16_384
}

/// The per-queue index beside the shards, under the queue's own tag `{wq:<queue>}`: advisory
/// (a wrong entry costs an empty probe or a sweep period, never an item), since no script can
/// update it together with a shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IndexKeys {
    /// ZSET shard → the earliest time it may have ready work (ready now, a delayed item due, a
    /// lease deadline); a shard with nothing pending is absent.
    pub shards: String,
    /// HASH shard → version, bumped by every mark, so a lessee's "this shard is empty" cannot
    /// erase a mark it did not see.
    pub versions: String,
    /// LIST holding at most one wake marker (see [`crate::wake`]).
    pub wake: String,
}

impl IndexKeys {
    /// The index of `queue`.
    pub(crate) fn new(queue: &str) -> Self {
        let k = |s: &str| format!("{{wq:{queue}}}:{s}");
        Self { shards: k("shards"), versions: k("shardver"), wake: k("wake") }
    }

    pub(crate) fn to_vec(&self) -> Vec<String> {
        vec![self.shards.clone(), self.versions.clone(), self.wake.clone()]
    }
}

/// The keys of one shard of a queue, all under the shard's hash tag (one Cluster slot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueueKeys {
    /// ZSET item → first add time (FIFO by that time).
    pub ready: String,
    /// ZSET item → due time (written with `ZADD LT`: the earliest wins).
    pub delayed: String,
    /// ZSET item → lease deadline.
    pub leases: String,
    /// HASH item → `id|start|requeues|expiries|dirtyAt|worker`: one field per leased item, so
    /// a lease costs one HSET.
    pub lease: String,
    /// HASH item → rate-limited failures, and `!x|item` → lease expiries without a Done.
    pub failures: String,
    /// HASH of sequences and counters.
    pub stats: String,
}

impl QueueKeys {
    /// The keys of the shard whose tag is `tag` (see [`Layout::tag`]).
    pub(crate) fn new(tag: &str) -> Self {
        let k = |s: &str| format!("{tag}:{s}");
        Self {
            ready: k("ready"),
            delayed: k("delayed"),
            leases: k("leases"),
            lease: k("lease"),
            failures: k("failures"),
            stats: k("stats"),
        }
    }

    /// KEYS[1..=6] of every script that starts with [`queue_prelude!`], in its order.
    pub(crate) fn to_vec(&self) -> Vec<String> {
        vec![
            self.ready.clone(),
            self.delayed.clone(),
            self.leases.clone(),
            self.lease.clone(),
            self.failures.clone(),
            self.stats.clone(),
        ]
    }
}

/// The bounded history of Job (or pod) `key` (LIST of entries, see `hist` in
/// `crate::lua::queue_fns!`), under `tag`, its shard's: the scripts that write it (ADD, DONE,
/// the lease reaper) already touch that slot. The scripts build the same name as
/// `SHARD .. ':hist:' .. item` (a test checks they agree).
pub(crate) fn hist_key(tag: &str, key: &str) -> String {
    format!("{tag}:hist:{key}")
}

// HASH item → its last Done (a history `d|…` entry): `<tag>:last:<generation>`, generation =
// Redis ms ÷ `crate::ops::LAST_SYNC_GENERATION`. Only scripts name it (`last_key` in
// `crate::lua::queue_fns!`: the generation comes from Redis time); one HSET per Done batch
// writes it, and a generation expires whole, so no Job's entry outlives two generations.

/// ZSET replica → when it last published its Dones per namespace (Unix ms), under `queue`'s
/// index tag (see [`crate::ops::SYNC_PUBLISH_PERIOD`]).
pub(crate) fn syncs_index_key(queue: &str) -> String {
    format!("{{wq:{queue}}}:syncs")
}

/// HASH namespace → Dones per second seen by kjob-queue replica `replica` on `queue`, under
/// the queue's index tag so one script reads every replica's.
pub(crate) fn syncs_key(queue: &str, replica: &str) -> String {
    format!("{{wq:{queue}}}:syncs:{replica}")
}

/// Binds `now` (Redis `TIME`, ms) and the [`QueueKeys`] as [`QueueKeys::to_vec`] orders them.
macro_rules! queue_prelude {
    () => {
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- `now` as text, for the records and arguments that carry it: Lua turns a number into text
-- through printf's floating-point path, about 1 µs each, more than the rest of a record.
local now_s = string.format('%d', now)
local READY, DELAYED, LEASES, LEASE, FAILURES, STATS =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
"#
    };
}
pub(crate) use queue_prelude;

/// The four expectation keys of one Job. They carry the hash tag of the Job's shard of the
/// `job` queue, so an Add to that queue applies an item's observations and its enqueue in one
/// script, also on a Cluster (where every key of a script must hash to one slot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExpKeys {
    /// HASH `uid`, `add`, `del`, `ts`: the expectation record.
    pub exp: String,
    /// SET of observed `kind:podUID` (makes a re-sent observation idempotent).
    pub seen: String,
    /// HASH podUID → jobUID: tracking-finalizer removals in flight.
    pub fin: String,
    /// HASH name → `expiry|bytes`: the Job's records.
    pub rec: String,
    /// SET of podUIDs the watcher saw without the tracking finalizer while they were not in
    /// `fin`: removals observed before the Done that expects them (emptied by that Done).
    pub fin_seen: String,
}

impl ExpKeys {
    /// The keys of Job `key` under `tag`, its shard's (see [`Layout::job_tag`]).
    pub(crate) fn new(tag: &str, key: &str) -> Self {
        let t = format!("{tag}:exp:{key}");
        Self {
            seen: format!("{t}:seen"),
            fin: format!("{t}:fin"),
            rec: format!("{t}:rec"),
            fin_seen: format!("{t}:finseen"),
            exp: t,
        }
    }
    /// KEYS[1..=5] of every script that starts with [`exp_prelude!`] (and the five keys ADD
    /// takes per observing item), in that order.
    pub(crate) fn to_vec(&self) -> Vec<String> {
        vec![
            self.exp.clone(),
            self.seen.clone(),
            self.fin.clone(),
            self.rec.clone(),
            self.fin_seen.clone(),
        ]
    }
}

/// Binds `now` and the [`ExpKeys`] as [`ExpKeys::to_vec`] orders them.
macro_rules! exp_prelude {
    () => {
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local EXP, SEEN, FIN, REC, FINSEEN = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
"#
    };
}
pub(crate) use exp_prelude;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_of_a_queue_shares_its_hash_tag_in_the_preludes_order() {
        let l = Layout::default();
        let tag = l.job_tag("ns/a");
        let k = QueueKeys::new(&tag).to_vec();
        assert_eq!(k.len(), 6, "ADD's extra keys start at KEYS[7]");
        assert_eq!(k[0], format!("{tag}:ready"));
        assert!(k.iter().all(|k| slot_of(k) == slot_of(&tag)));
        let e = ExpKeys::new("{t}", "ns/a").to_vec();
        assert_eq!(
            e,
            [
                "{t}:exp:ns/a",
                "{t}:exp:ns/a:seen",
                "{t}:exp:ns/a:fin",
                "{t}:exp:ns/a:rec",
                "{t}:exp:ns/a:finseen"
            ]
        );
        assert_eq!(hist_key("{t}", "ns/a"), "{t}:hist:ns/a");
        assert_eq!(syncs_key("job", "r1"), "{wq:job}:syncs:r1");
        assert_eq!(slot_of(&syncs_key("job", "r1")), slot_of(&syncs_index_key("job")));
        // The scripts build the per-Job names from their shard's tag the same way.
        let lua = crate::lua::queue_fns!();
        assert!(lua.contains("SHARD .. ':hist:' .. item"));
        assert!(lua.contains("SHARD .. ':last:' .. generation"));
    }
}
