//! The shared expectations of each Job: set by workers, lowered by the watcher's observations,
//! read before a sync; and the in-flight tracking-finalizer removals beside them.
//!
//! Every script here takes the five [`ExpKeys`](crate::keys::ExpKeys) of one Job (bound by `exp_prelude!`), except
//! EXPECT_FIN_DONE, which takes two of them per Job for several Jobs.

use redis::Value;

use crate::expectations::{ExpectationRecord, Expectations};
use crate::keys::exp_prelude;
use crate::lua::Lua;
use crate::lua::observe_fn;
use crate::lua::{Arg, argv};
use crate::reply::Fields;
use crate::store::{Store, push_observations};
use crate::{Observation, WqError};

/// KEYS: the [`ExpKeys`](crate::keys::ExpKeys).
/// ARGV[1] -> uid, ARGV[2] -> add, ARGV[3] -> del, ARGV[4] -> gc_ms.
/// Reply: 1. Replaces the record and stamps the time.
const SET: &str = concat!(
    exp_prelude!(),
    r#"
redis.call('DEL', EXP, SEEN)
redis.call('HSET', EXP, 'uid', ARGV[1], 'add', ARGV[2], 'del', ARGV[3], 'ts', now)
redis.call('PEXPIRE', EXP, ARGV[4])
return 1
"#
);

static SET_SCRIPT: Lua = Lua::new("set_expectations", SET);

impl Store {
    /// Replaces the expectations of Job `key` and stamps the time (client-go `SetExpectations`).
    pub async fn set_expectations(
        &self,
        key: &str,
        job_uid: &str,
        add: i64,
        del: i64,
    ) -> Result<(), WqError> {
        let args = argv![job_uid, add, del, self.config().idle_gc];
        let keys = self.exp_keys(key).to_vec();
        self.run(&SET_SCRIPT, &keys, args).await
    }
}

/// KEYS: the [`ExpKeys`](crate::keys::ExpKeys).
/// ARGV[1] -> uid, ARGV[2] -> add, ARGV[3] -> del, ARGV[4] -> gc_ms, ARGV[5..] -> UIDs of pods
/// already created.
/// Reply: the creations the record expects.
///
/// SET for a sync that raises its record after creating the pods rather than before: the
/// created pods the watcher has observed already (their creations are in SEEN, recorded with
/// or without a record) are not expected. SEEN starts afresh, as with SET, except for those
/// pods: a re-sent observation of one of them must not lower the new record. (So SEEN holds
/// what the current record has seen, and does not grow with the Job's pods.)
const SET_CREATED: &str = concat!(
    exp_prelude!(),
    r#"
local add = tonumber(ARGV[2])
local seen = {}
for i = 5, #ARGV do
  local s = '1:' .. ARGV[i]
  if redis.call('SISMEMBER', SEEN, s) == 1 then
    add = add - 1
    seen[#seen + 1] = s
  end
end
redis.call('DEL', EXP, SEEN)
if #seen > 0 then
  redis.call('SADD', SEEN, unpack(seen))
  redis.call('PEXPIRE', SEEN, ARGV[4])
end
redis.call('HSET', EXP, 'uid', ARGV[1], 'add', add, 'del', ARGV[3], 'ts', now)
redis.call('PEXPIRE', EXP, ARGV[4])
return add
"#
);

static SET_CREATED_SCRIPT: Lua = Lua::new("set_expectations_created", SET_CREATED);

impl Store {
    /// Replaces the expectations of Job `key` after its sync created pods (`created`: their
    /// UIDs): `add` creations (the created pods and any whose outcome is unknown) and `del`
    /// deletions, less the created pods already observed. Returns the creations expected.
    /// With no `created`, the same as [`Self::set_expectations`].
    pub async fn set_expectations_created(
        &self,
        key: &str,
        job_uid: &str,
        add: i64,
        del: i64,
        created: &[String],
    ) -> Result<i64, WqError> {
        let mut args = argv![job_uid, add, del, self.config().idle_gc];
        args.extend(created.iter().map(Arg::arg));
        let keys = self.exp_keys(key).to_vec();
        self.run(&SET_CREATED_SCRIPT, &keys, args).await
    }
}

/// KEYS: the [`ExpKeys`](crate::keys::ExpKeys).
/// ARGV[1] -> uid, ARGV[2] -> add_delta, ARGV[3] -> del_delta (already negated).
/// Reply: 1 when an existing record of that UID was lowered, else 0.
const LOWER: &str = concat!(
    exp_prelude!(),
    r#"
if redis.call('EXISTS', EXP) == 0 then return 0 end
if ARGV[1] ~= '' and redis.call('HGET', EXP, 'uid') ~= ARGV[1] then return 0 end
redis.call('HINCRBY', EXP, 'add', ARGV[2])
redis.call('HINCRBY', EXP, 'del', ARGV[3])
return 1
"#
);

static LOWER_SCRIPT: Lua = Lua::new("lower_expectations", LOWER);

impl Store {
    /// Lowers an existing record of that UID by `add`/`del`; `false` when there was none.
    pub async fn lower_expectations(
        &self,
        key: &str,
        job_uid: &str,
        add: i64,
        del: i64,
    ) -> Result<bool, WqError> {
        let args = argv![job_uid, add.saturating_neg(), del.saturating_neg()];
        let keys = self.exp_keys(key).to_vec();
        self.run(&LOWER_SCRIPT, &keys, args).await
    }
}

/// KEYS: the [`ExpKeys`](crate::keys::ExpKeys).
/// Reply: `{exists, uid, add, del, ts, now, {podUID, jobUID}…}`, read by
/// [`Store::expectations_reply`] (GET_VIEW returns the same shape).
const GET: &str = concat!(
    exp_prelude!(),
    r#"
local fin = redis.call('HGETALL', FIN)
if redis.call('EXISTS', EXP) == 0 then return {0, '', 0, 0, 0, now, fin} end
local r = redis.call('HMGET', EXP, 'uid', 'add', 'del', 'ts')
return {1, r[1] or '', tonumber(r[2] or 0), tonumber(r[3] or 0), tonumber(r[4] or 0), now, fin}
"#
);

static GET_SCRIPT: Lua = Lua::new("get_expectations", GET);

/// A GET reply read for one Job UID.
pub(crate) struct ExpReply {
    /// What the Job of that UID should see.
    pub expectations: Expectations,
    /// Redis time of the read.
    pub now_ms: i64,
}

impl Store {
    /// Reads the expectations of Job `key` as seen by the Job with UID `job_uid`.
    pub async fn get_expectations(
        &self,
        key: &str,
        job_uid: &str,
    ) -> Result<Expectations, WqError> {
        let keys = self.exp_keys(key).to_vec();
        let v: Value = self.run(&GET_SCRIPT, &keys, Vec::new()).await?;
        Ok(self.expectations_reply(Fields::new("get_expectations", &v)?, job_uid)?.expectations)
    }

    /// Reads a GET reply as seen by the Job with UID `job_uid`.
    pub(crate) fn expectations_reply(
        &self,
        mut f: Fields<'_>,
        job_uid: &str,
    ) -> Result<ExpReply, WqError> {
        let exists = f.flag("exists")?;
        let record = ExpectationRecord {
            job_uid: f.string("uid")?,
            add: f.int("add")?,
            del: f.int("del")?,
            set_at_ms: f.int("ts")?,
        };
        let now = f.int("now")?;
        // A record of another Job UID is no record (client-go keys by UID-checked key).
        let record =
            Some(record).filter(|r| exists && (job_uid.is_empty() || r.job_uid == job_uid));
        let mut fin = f.array("finalizer_removals")?;
        if fin.remaining() % 2 != 0 {
            return Err(WqError::Protocol("get_expectations: odd finalizer pairs".into()));
        }
        let mut finalizer_removals = Vec::new();
        while fin.remaining() > 0 {
            let pod = fin.string("pod_uid")?;
            let owner = fin.string("job_uid")?;
            if job_uid.is_empty() || owner.is_empty() || owner == job_uid {
                finalizer_removals.push(pod);
            }
        }
        finalizer_removals.sort();
        let satisfied = crate::expectations::satisfied(
            record.as_ref(),
            job_uid,
            now,
            self.config().expectations_timeout,
        );
        let age_ms =
            record.as_ref().map(|r| u64::try_from(now - r.set_at_ms).unwrap_or(0)).unwrap_or(0);
        Ok(ExpReply {
            expectations: Expectations { record, satisfied, age_ms, finalizer_removals },
            now_ms: now,
        })
    }
}

/// KEYS: the [`ExpKeys`](crate::keys::ExpKeys).
/// ARGV[1] -> gc_ms, then (kind, job_uid, pod_uid)… with kind 1 creation, 2 deletion,
/// 3 finalizer removal.
/// Reply: the number of observations that changed something.
const OBSERVE: &str = concat!(
    exp_prelude!(),
    observe_fn!(),
    r#"
return observe(EXP, SEEN, FIN, FINSEEN, ARGV[1], ARGV, 2, (#ARGV - 1) / 3)
"#
);

static OBSERVE_SCRIPT: Lua = Lua::new("observe", OBSERVE);

impl Store {
    /// Applies watcher observations to the expectations of Job `key`; returns how many changed
    /// something. Observations carrying a pod UID are applied at most once per record.
    pub async fn observe(&self, key: &str, observations: &[Observation]) -> Result<u32, WqError> {
        if observations.is_empty() {
            return Ok(0);
        }
        let mut args = argv![self.config().idle_gc];
        push_observations(&mut args, observations);
        let keys = self.exp_keys(key).to_vec();
        self.run(&OBSERVE_SCRIPT, &keys, args).await
    }
}

/// KEYS: the [`ExpKeys`](crate::keys::ExpKeys) and the four [`ViewKeys`](crate::view::ViewKeys) of one Job.
/// Reply: the number of keys deleted.
const DELETE: &str = r#"
return redis.call('DEL', unpack(KEYS))
"#;

static DELETE_SCRIPT: Lua = Lua::new("delete_expectations", DELETE);

impl Store {
    /// Deletes the expectations, finalizer-removal set, records and shared view of Job `key`.
    pub async fn delete_expectations(&self, key: &str) -> Result<(), WqError> {
        let mut keys = self.exp_keys(key).to_vec();
        keys.extend(self.view_keys(key).to_vec());
        self.run(&DELETE_SCRIPT, &keys, Vec::new()).await
    }
}

/// KEYS: the [`ExpKeys`](crate::keys::ExpKeys).
/// ARGV[1] -> gc_ms, ARGV[2] -> job_uid, ARGV[3..] -> pod_uids.
/// Reply: the number of pod UIDs.
const EXPECT_FIN: &str = concat!(
    exp_prelude!(),
    r#"
for i = 3, #ARGV do redis.call('HSET', FIN, ARGV[i], ARGV[2]) end
redis.call('PEXPIRE', FIN, ARGV[1])
return #ARGV - 2
"#
);

static EXPECT_FIN_SCRIPT: Lua = Lua::new("expect_finalizer_removals", EXPECT_FIN);

impl Store {
    /// Adds pod UIDs whose tracking-finalizer removal is in flight for Job `key`.
    pub async fn expect_finalizer_removals(
        &self,
        key: &str,
        job_uid: &str,
        pod_uids: &[String],
    ) -> Result<(), WqError> {
        if pod_uids.is_empty() {
            return Ok(());
        }
        let mut args = argv![self.config().idle_gc, job_uid];
        args.extend(pod_uids.iter().map(Arg::arg));
        let keys = self.exp_keys(key).to_vec();
        self.run(&EXPECT_FIN_SCRIPT, &keys, args).await
    }
}

/// KEYS: per raise, the in-flight set (`fin`) and the seen-without-finalizer set (`fin_seen`)
/// of its Job ([`ExpKeys`](crate::keys::ExpKeys)).
/// ARGV[1] -> gc_ms, then per raise: job_uid, n, n pod UIDs.
/// Reply: how many pod UIDs went into in-flight sets.
///
/// EXPECT_FIN for a sync that expects its removals after making them, with its lease's Done:
/// the pods the watcher has seen without the finalizer meanwhile (in `fin_seen`, which holds
/// nothing older than the key's previous such Done) are not expected. `fin_seen` starts afresh.
const EXPECT_FIN_DONE: &str = r#"
local gc, a, expected = ARGV[1], 2, 0
for r = 1, #KEYS, 2 do
  local fin, seen = KEYS[r], KEYS[r + 1]
  local juid, n = ARGV[a], tonumber(ARGV[a + 1])
  local raised = false
  for i = a + 2, a + 1 + n do
    if redis.call('SISMEMBER', seen, ARGV[i]) == 0 then
      redis.call('HSET', fin, ARGV[i], juid)
      expected, raised = expected + 1, true
    end
  end
  redis.call('DEL', seen)
  if raised then redis.call('PEXPIRE', fin, gc) end
  a = a + 2 + n
end
return expected
"#;

static EXPECT_FIN_DONE_SCRIPT: Lua = Lua::new("expect_finalizer_removals_done", EXPECT_FIN_DONE);

/// The tracking-finalizer removals one sync made, expected with its lease's Done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinalizerRemovals {
    /// The Job's key.
    pub key: String,
    /// The Job's UID.
    pub job_uid: String,
    /// The pods whose finalizers the sync removed.
    pub pod_uids: Vec<String>,
}

impl Store {
    /// Expects the finalizer removals several syncs made (one script call), except those the
    /// watcher has observed since each Job's previous such call; returns how many are expected.
    pub async fn expect_finalizer_removals_done<'a>(
        &self,
        raises: impl IntoIterator<Item = &'a FinalizerRemovals>,
    ) -> Result<u32, WqError> {
        let raises: Vec<&FinalizerRemovals> =
            raises.into_iter().filter(|r| !r.pod_uids.is_empty()).collect();
        if raises.is_empty() {
            return Ok(0);
        }
        // One script per shard touched (a script's keys share one slot), run concurrently.
        let mut by_shard: std::collections::BTreeMap<u32, (Vec<String>, Vec<Vec<u8>>)> =
            std::collections::BTreeMap::new();
        for r in raises {
            let (keys, args) = by_shard
                .entry(self.layout().shard_of(&r.key))
                .or_insert_with(|| (Vec::new(), argv![self.config().idle_gc]));
            let k = self.exp_keys(&r.key);
            keys.push(k.fin);
            keys.push(k.fin_seen);
            args.push(r.job_uid.arg());
            args.push(r.pod_uids.len().arg());
            args.extend(r.pod_uids.iter().map(Arg::arg));
        }
        let calls = by_shard.into_values().map(|(keys, args)| async move {
            self.run::<u32>(&EXPECT_FIN_DONE_SCRIPT, &keys, args).await
        });
        let mut expected = 0;
        for r in futures::future::join_all(calls).await {
            expected += r?;
        }
        Ok(expected)
    }
}

/// KEYS: the [`ExpKeys`](crate::keys::ExpKeys).
/// ARGV: pod_uids.
/// Reply: how many of them were in the in-flight set.
const FORGET_FIN: &str = concat!(
    exp_prelude!(),
    r#"
return redis.call('HDEL', FIN, unpack(ARGV))
"#
);

static FORGET_FIN_SCRIPT: Lua = Lua::new("forget_finalizer_removals", FORGET_FIN);

impl Store {
    /// Drops pod UIDs from Job `key`'s in-flight finalizer-removal set (their removals failed);
    /// returns how many were in it.
    pub async fn forget_finalizer_removals(
        &self,
        key: &str,
        pod_uids: &[String],
    ) -> Result<u32, WqError> {
        if pod_uids.is_empty() {
            return Ok(0);
        }
        let args = pod_uids.iter().map(Arg::arg).collect();
        let keys = self.exp_keys(key).to_vec();
        self.run(&FORGET_FIN_SCRIPT, &keys, args).await
    }
}
