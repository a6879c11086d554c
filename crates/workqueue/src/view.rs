//! The shared view of each Job: its object and its pods as the leading watcher's informer saw
//! them, kept in Redis so that every worker plans from one informer cache (upstream plans from
//! its own) instead of reading the API server at every sync.
//!
//! Trust: a view is trusted only when it was written in full (a snapshot: `Reset`, every pod,
//! `Job`, `Trust`) by the *current* watcher session, and that session is committed. A new leader
//! (or a watcher whose watch relisted) begins a session, which at once distrusts every view of
//! earlier sessions, writes a snapshot of every Job, and commits. Until then workers fall back to
//! consistent reads. Writes of a session that is not current (a deposed leader still flushing)
//! are dropped. Staleness inside a trusted view is an informer's staleness, guarded as upstream
//! guards it: by the expectations (lowered in the same script as the pod write that shows them
//! met) and by resourceVersion-fenced status writes.
//!
//! Keys (all under the hash tag of the Job's shard of the job queue, so an Add writes a view,
//! applies observations and enqueues in one script, also on a Cluster): `…:view:{key}` the Job JSON, `…:view:{key}:pods`
//! HASH pod name → pod JSON, `…:view:{key}:meta` HASH (`uid`, `rv`, `epoch` = the session that
//! trusted it, `orphans` notices seen, `handled` notices acknowledged), one `…:view-session`
//! string per shard: the current session, with a `|pending` suffix until it commits, and `…:view-run`: the
//! Redis run id the session began on. A Redis that restarted (and may have lost the last writes)
//! or a promoted replica has another run id: no view is trusted until a new session, and the
//! watcher's next Add with view writes learns it must begin one.

use redis::Value;

use crate::WqError;
use crate::keys::ExpKeys;
use crate::lua::Lua;
use crate::lua::{Arg, argv};
use crate::reply::Fields;
use crate::store::Store;

/// One write to a Job's shared view, its JSON as the store keeps it.
pub type ViewOp = kjob_core::ViewOp<Vec<u8>>;

/// The script's code of a view write (see `apply_view_fn!`).
fn view_code(op: &ViewOp) -> u8 {
    match op {
        ViewOp::Job { .. } => 1,
        ViewOp::DeleteJob => 2,
        ViewOp::Pod { .. } => 3,
        ViewOp::DeletePod { .. } => 4,
        ViewOp::Reset { .. } => 5,
        ViewOp::Trust => 6,
        ViewOp::Orphans => 7,
    }
}

/// A trusted view, as [`Store::get_job_view`] returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobView {
    /// The Job object (JSON).
    pub job: Vec<u8>,
    /// Its pods (JSON each), in no particular order.
    pub pods: Vec<Vec<u8>>,
    /// Orphan notices seen.
    pub orphans_seen: u64,
    /// Orphan notices acknowledged by a worker that listed pods.
    pub orphans_handled: u64,
    /// UID of the Job the view holds.
    pub uid: String,
    /// That UID's expectations, read in the same script as the view.
    pub expectations: crate::Expectations,
    /// The per-Job records asked for that exist, as `(name, value)`.
    pub records: Vec<(String, Vec<u8>)>,
}

/// A phase of a watcher's view session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionPhase {
    /// Become the current session, untrusted: no earlier view is trusted any more.
    Begin,
    /// The snapshot is complete: trust this session's views (if still current).
    Commit,
    /// Stop (relist, leadership lost): no view is trusted.
    End,
}

/// The key holding the current view session, one copy per shard of the job queue (`tag`): a
/// view write checks the session in its own shard's script.
pub(crate) fn view_session_key(tag: &str) -> String {
    format!("{tag}:view-session")
}

/// The key holding the Redis run id the current session began on (per shard, like the
/// session: on a Cluster each shard's copy records its own master's run).
pub(crate) fn view_run_key(tag: &str) -> String {
    format!("{tag}:view-run")
}

/// The three view keys of one Job, under the job queue's hash tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ViewKeys {
    /// STRING: the Job JSON.
    pub job: String,
    /// HASH pod name → pod JSON.
    pub pods: String,
    /// HASH `uid`, `rv`, `epoch`, `orphans`, `handled`.
    pub meta: String,
}

impl ViewKeys {
    /// The view keys of Job `key` under `tag`, its shard's.
    pub(crate) fn new(tag: &str, key: &str) -> Self {
        let t = format!("{tag}:view:{key}");
        Self { pods: format!("{t}:pods"), meta: format!("{t}:meta"), job: t }
    }

    /// The keys in the order ADD (three per item with view writes) and DELETE take them.
    pub(crate) fn to_vec(&self) -> Vec<String> {
        vec![self.job.clone(), self.pods.clone(), self.meta.clone()]
    }
}

/// Appends `(kind, name, object, resource_version)` of each write to `args`.
pub(crate) fn push_view_ops(args: &mut Vec<Vec<u8>>, ops: &[ViewOp]) {
    for op in ops {
        let (name, object, rv): (&str, &[u8], &str) = match op {
            ViewOp::Job { uid, object, resource_version } => (uid, object, resource_version),
            ViewOp::Pod { name, object } => (name, object, ""),
            ViewOp::DeletePod { name } => (name, &[], ""),
            ViewOp::Reset { uid } => (uid, &[], ""),
            ViewOp::DeleteJob | ViewOp::Trust | ViewOp::Orphans => ("", &[], ""),
        };
        args.push(view_code(op).arg());
        args.push(name.arg());
        args.push(object.to_vec());
        args.push(rv.arg());
    }
}

/// Lua shared by ADD and PUT_VIEW: `newer(rv, cached)` (resourceVersions of one etcd are
/// increasing integers; anything unparseable replaces), `session_accepts` and `apply_view`.
macro_rules! apply_view_fn {
    () => {
        r#"
local function newer(rv, cached)
  if not cached then return true end
  local a, b = tonumber(rv), tonumber(cached)
  if not a or not b then return true end
  return a > b
end

-- The current session (committed or pending), or false when there is none or it was begun on
-- another Redis run: a restarted Redis (or a promoted replica) may have lost writes the view
-- needed, so nothing written before the restart is trusted.
local function view_current(SESSION, RUN)
  local cur = redis.call('GET', SESSION)
  if not cur then return false end
  local run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
  if redis.call('GET', RUN) ~= run then return false end
  return cur
end

-- Writes of `session` are accepted while it is the current session, committed or not.
local function session_accepts(current, session)
  return session ~= '' and current ~= false and
    (current == session or current == session .. '|pending')
end

-- kind 1 JOB, 2 DELETE_JOB, 3 POD, 4 DELETE_POD, 5 RESET, 6 TRUST, 7 ORPHANS.
local function apply_view(JOB, PODS, META, gc_ms, session, ops, first, count)
  for i = first, first + 4 * (count - 1), 4 do
    local kind, name, obj, rv = tonumber(ops[i]), ops[i + 1], ops[i + 2], ops[i + 3]
    if kind == 1 then
      local cur = redis.call('HMGET', META, 'uid', 'rv')
      if cur[1] and cur[1] ~= name then
        -- Another Job of the same name: what is cached belongs to its predecessor.
        redis.call('DEL', PODS, META)
        redis.call('SET', JOB, obj)
        redis.call('HSET', META, 'uid', name, 'rv', rv, 'epoch', '')
      elseif newer(rv, cur[2]) then
        redis.call('SET', JOB, obj)
        redis.call('HSET', META, 'uid', name, 'rv', rv)
      end
    elseif kind == 2 then
      redis.call('DEL', JOB, PODS, META)
    elseif kind == 3 then
      redis.call('HSET', PODS, name, obj)
    elseif kind == 4 then
      redis.call('HDEL', PODS, name)
    elseif kind == 5 then
      local cur = redis.call('HGET', META, 'uid')
      if cur and cur ~= name then
        redis.call('DEL', JOB, META)
      end
      redis.call('DEL', PODS)
      redis.call('HSET', META, 'uid', name, 'epoch', '')
    elseif kind == 6 then
      redis.call('HSET', META, 'epoch', session)
    elseif kind == 7 then
      redis.call('HINCRBY', META, 'orphans', 1)
    end
  end
  -- Views of Jobs whose delete nobody saw go away with the other idle records.
  redis.call('PEXPIRE', JOB, gc_ms)
  redis.call('PEXPIRE', PODS, gc_ms)
  redis.call('PEXPIRE', META, gc_ms)
end

-- One Job's view: {0} unless its epoch is the `current` session, which a pending session never
-- equals; else {1, object, orphans_seen, orphans_handled, {pod…}, uid, exp, {record…}} with
-- `exp` as GET_EXPECTATIONS replies it and the records named by names[first .. first + count -
-- 1] (each `expiry|value`, '' when absent). The pods only `with_pods` (else {}): GET_VIEW reads
-- them with an HVALS after the script, in the same transaction (see `Store::run_then_read`).
local function read_view(current, JOB, PODS, META, EXP, FIN, REC, now, names, first, count,
                         with_pods)
  local m = redis.call('HMGET', META, 'epoch', 'orphans', 'handled', 'uid')
  if not current or not m[1] or m[1] == '' or m[1] ~= current then return {0} end
  local job = redis.call('GET', JOB)
  if not job then return {0} end
  local fin = redis.call('HGETALL', FIN)
  local exp
  if redis.call('EXISTS', EXP) == 0 then
    exp = {0, '', 0, 0, 0, now, fin}
  else
    local r = redis.call('HMGET', EXP, 'uid', 'add', 'del', 'ts')
    exp = {1, r[1] or '', tonumber(r[2] or 0), tonumber(r[3] or 0), tonumber(r[4] or 0), now, fin}
  end
  local recs = {}
  if count > 0 then recs = redis.call('HMGET', REC, unpack(names, first, first + count - 1)) end
  for i = 1, count do if not recs[i] then recs[i] = '' end end
  local pods = {}
  if with_pods then pods = redis.call('HVALS', PODS) end
  return {1, job, tonumber(m[2] or 0), tonumber(m[3] or 0), pods, m[4] or '', exp, recs}
end
"#
    };
}
pub(crate) use apply_view_fn;

/// The keys GET_VIEW reads, in its KEYS order.
struct GetViewKeys {
    session: String,
    view: ViewKeys,
    exp: ExpKeys,
    run: String,
}

impl GetViewKeys {
    fn to_vec(&self) -> Vec<String> {
        vec![
            self.session.clone(),
            self.view.job.clone(),
            self.view.pods.clone(),
            self.view.meta.clone(),
            self.exp.exp.clone(),
            self.exp.fin.clone(),
            self.run.clone(),
            self.exp.rec.clone(),
        ]
    }
}

/// KEYS: [`GetViewKeys`]: 1 session, 2 object, 3 pods, 4 meta, 5 the Job's expectation record,
/// 6 its finalizer set, 7 run, 8 its per-Job records.
/// ARGV: record names.
/// Reply: `read_view`'s (see `apply_view_fn!`) without the pods, read in one script with the
/// session check; [`Store::get_job_view`] reads the pods with an HVALS in the same transaction.
const GET_VIEW: &str = concat!(
    apply_view_fn!(),
    r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local current = view_current(KEYS[1], KEYS[7])
return read_view(current, KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[8], now, ARGV, 1, #ARGV,
  false)
"#
);

static GET_VIEW_SCRIPT: Lua = Lua::new("get_job_view", GET_VIEW);

impl Store {
    /// Reads the view of Job `key`: `None` unless it is trusted (see the module docs). The
    /// script checks the session and reads the object, expectations and records; the pods,
    /// kilobytes each and thousands for a large Job, come from an HVALS in the same MULTI/EXEC
    /// (atomic with the script, and never copied through Lua).
    pub async fn get_job_view(
        &self,
        key: &str,
        records: &[String],
    ) -> Result<Option<JobView>, WqError> {
        let tag = self.layout().job_tag(key);
        let keys = GetViewKeys {
            session: view_session_key(&tag),
            view: ViewKeys::new(&tag, key),
            exp: ExpKeys::new(&tag, key),
            run: view_run_key(&tag),
        };
        let args: Vec<Vec<u8>> = records.iter().map(Arg::arg).collect();
        let mut hvals = redis::cmd("HVALS");
        hvals.arg(&keys.view.pods);
        let (v, mut reads) =
            self.run_then_read(&GET_VIEW_SCRIPT, &keys.to_vec(), &args, &[hvals]).await?;
        let Some(mut view) = self.job_view_reply(Fields::new("get_job_view", &v)?, records)? else {
            return Ok(None);
        };
        let pods = reads.pop().unwrap_or(Value::Nil);
        let mut pods_f = Fields::new("get_job_view", &pods)?;
        view.pods =
            (0..pods_f.remaining()).map(|_| pods_f.bytes("pod")).collect::<Result<_, _>>()?;
        Ok(Some(view))
    }

    /// Reads a view as `read_view` replies it (GET_VIEW, and ADD's hand-offs): `None` when it
    /// is not trusted.
    pub(crate) fn job_view_reply(
        &self,
        mut f: Fields<'_>,
        records: &[String],
    ) -> Result<Option<JobView>, WqError> {
        if !f.flag("trusted")? {
            return Ok(None);
        }
        let job = f.bytes("object")?;
        let orphans_seen = f.u64("orphans_seen")?;
        let orphans_handled = f.u64("orphans_handled")?;
        let mut pods_f = f.array("pods")?;
        let pods =
            (0..pods_f.remaining()).map(|_| pods_f.bytes("pod")).collect::<Result<_, _>>()?;
        let uid = f.string("uid")?;
        let exp = self.expectations_reply(f.array("expectations")?, &uid)?;
        let mut recs = f.array("records")?;
        if recs.remaining() != records.len() {
            return Err(WqError::Protocol(format!(
                "get_job_view: {} records for {} names",
                recs.remaining(),
                records.len()
            )));
        }
        let mut found = Vec::new();
        for name in records {
            let stored = recs.bytes("record")?;
            if let Some(value) = crate::store::live_record(&stored, exp.now_ms) {
                found.push((name.clone(), value));
            }
        }
        Ok(Some(JobView {
            job,
            pods,
            orphans_seen,
            orphans_handled,
            uid,
            expectations: exp.expectations,
            records: found,
        }))
    }
}

/// KEYS[1] -> the Job's view object, KEYS[2] -> its view meta.
/// ARGV[1] -> uid, ARGV[2] -> resource_version, ARGV[3] -> object ('' = none), ARGV[4] ->
/// orphans_handled, ARGV[5] -> gc_ms.
/// Reply: 1 when the object was stored. Only a view of that UID is touched.
const PUT_VIEW: &str = concat!(
    apply_view_fn!(),
    r#"
local m = redis.call('HMGET', KEYS[2], 'uid', 'rv', 'handled')
if not m[1] or m[1] ~= ARGV[1] then return 0 end
local stored = 0
if ARGV[3] ~= '' and newer(ARGV[2], m[2]) then
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[5])
  redis.call('HSET', KEYS[2], 'rv', ARGV[2])
  stored = 1
end
local handled = tonumber(ARGV[4]) or 0
if handled > (tonumber(m[3]) or 0) then redis.call('HSET', KEYS[2], 'handled', handled) end
return stored
"#
);

static PUT_VIEW_SCRIPT: Lua = Lua::new("put_job_view", PUT_VIEW);

impl Store {
    /// Writes back a Job object a worker got from the API server (kept only when newer than
    /// the cached one and the view is of `uid`), and acknowledges `orphans_handled` notices.
    /// Returns whether the object was stored.
    pub async fn put_job_view(
        &self,
        key: &str,
        uid: &str,
        object: &[u8],
        resource_version: &str,
        orphans_handled: u64,
    ) -> Result<bool, WqError> {
        let ViewKeys { job, meta, .. } = self.view_keys(key);
        let args = argv![uid, resource_version, object, orphans_handled, self.idle_gc_ms()];
        self.run(&PUT_VIEW_SCRIPT, &[job, meta], args).await
    }
}

/// KEYS[1] -> the view session, KEYS[2] -> the view run.
/// ARGV[1] -> session, ARGV[2] -> phase (1 begin, 2 commit, 3 end).
/// Reply: 1 when applied. A Begin records the Redis run it happened on (see `view_current`).
const SESSION: &str = r#"
local current = redis.call('GET', KEYS[1])
local pending = ARGV[1] .. '|pending'
if ARGV[2] == '1' then
  redis.call('SET', KEYS[1], pending)
  redis.call('SET', KEYS[2], string.match(redis.call('INFO', 'server'), 'run_id:(%w+)'))
  return 1
elseif ARGV[2] == '2' then
  if current == pending then
    redis.call('SET', KEYS[1], ARGV[1])
    return 1
  end
  return 0
else
  if current == ARGV[1] or current == pending then
    redis.call('DEL', KEYS[1])
    return 1
  end
  return 0
end
"#;

static SESSION_SCRIPT: Lua = Lua::new("view_session", SESSION);

impl Store {
    /// Begins, commits or ends watcher session `session`; returns whether it applied.
    pub async fn view_session(&self, session: &str, phase: SessionPhase) -> Result<bool, WqError> {
        let phase = match phase {
            SessionPhase::Begin => "1",
            SessionPhase::Commit => "2",
            SessionPhase::End => "3",
        };
        // Every shard holds a copy; the phase applies when it applied to each. A failure part
        // way leaves some copies behind: the watcher retries the phase (a Begin always applies).
        let calls = (0..self.layout().shards()).map(|shard| {
            let tag = self.layout().tag(kjob_core::JOB_QUEUE, shard);
            let keys = [view_session_key(&tag), view_run_key(&tag)];
            let args = argv![session, phase];
            async move { self.run::<bool>(&SESSION_SCRIPT, &keys, args).await }
        });
        let mut applied = true;
        for r in futures::future::join_all(calls).await {
            applied &= r?;
        }
        Ok(applied)
    }

    /// The view keys of Job `key`, under its shard's tag.
    pub(crate) fn view_keys(&self, key: &str) -> ViewKeys {
        ViewKeys::new(&self.layout().job_tag(key), key)
    }
}
