//! The Redis keys of a queue and of a Job's expectations: named once here, with the Lua that
//! binds them to `KEYS[i]` beside the Rust that puts them there, so the order cannot drift.

/// The keys of one queue, all under its hash tag `{wq:<name>}` (one Cluster slot).
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
    /// LIST holding at most one wake marker (see [`crate::wake`]).
    pub wake: String,
}

impl QueueKeys {
    /// The keys of `queue`.
    pub(crate) fn new(queue: &str) -> Self {
        let k = |s: &str| format!("{{wq:{queue}}}:{s}");
        Self {
            ready: k("ready"),
            delayed: k("delayed"),
            leases: k("leases"),
            lease: k("lease"),
            failures: k("failures"),
            stats: k("stats"),
            wake: k("wake"),
        }
    }

    /// KEYS[1..=7] of every script that starts with [`queue_prelude!`], in its order.
    pub(crate) fn to_vec(&self) -> Vec<String> {
        vec![
            self.ready.clone(),
            self.delayed.clone(),
            self.leases.clone(),
            self.lease.clone(),
            self.failures.clone(),
            self.stats.clone(),
            self.wake.clone(),
        ]
    }
}

/// Binds `now` (Redis `TIME`, ms) and the [`QueueKeys`] as [`QueueKeys::to_vec`] orders them.
macro_rules! queue_prelude {
    () => {
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local READY, DELAYED, LEASES, LEASE, FAILURES, STATS, WAKE =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
"#
    };
}
pub(crate) use queue_prelude;

/// The four expectation keys of one Job. They carry the hash tag of the `job` queue, so an Add
/// to that queue applies an item's observations and its enqueue in one script, also on a
/// Cluster (where every key of a script must hash to one slot). The price: all expectations
/// live on the job queue's shard, which the queue's own traffic already bounds.
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
    /// The keys of Job `key`.
    pub(crate) fn new(key: &str) -> Self {
        let t = format!("{{wq:{}}}:exp:{key}", kjob_core::JOB_QUEUE);
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
        let k = QueueKeys::new("job").to_vec();
        assert_eq!(k.len(), 7, "ADD's extra keys start at KEYS[8]");
        assert_eq!(k[0], "{wq:job}:ready");
        assert_eq!(k[6], "{wq:job}:wake");
        assert!(k.iter().all(|k| k.starts_with("{wq:job}:")));
        let e = ExpKeys::new("ns/a").to_vec();
        assert_eq!(
            e,
            [
                "{wq:job}:exp:ns/a",
                "{wq:job}:exp:ns/a:seen",
                "{wq:job}:exp:ns/a:fin",
                "{wq:job}:exp:ns/a:rec",
                "{wq:job}:exp:ns/a:finseen"
            ]
        );
    }
}
