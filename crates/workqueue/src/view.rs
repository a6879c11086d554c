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
//! HASH pod name → pod entry (sealed bytes kjob-queue never reads; `kjob_reconcile::view_pod`), `…:view:{key}:meta` HASH (`uid`, `rv`, `epoch` = the session that
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
    /// Read whole in one script (an Add's hand-off): each pod's name (as `pods`, in the same
    /// order), the view's version and its epoch token, which a lessee that caches views
    /// decoded keeps. `None` for a view read otherwise.
    pub named: Option<NamedPods>,
}

/// What a view read whole in one script adds (see [`JobView::named`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedPods {
    /// The pods' names, in the order of [`JobView::pods`].
    pub names: Vec<String>,
    /// The view's version (`ver`): a later delta read may start from it.
    pub version: u64,
    /// The token of the session that trusted the view.
    pub epoch: String,
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

/// The four view keys of one Job, under the job queue's hash tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ViewKeys {
    /// STRING: the Job JSON.
    pub job: String,
    /// HASH pod name → pod JSON.
    pub pods: String,
    /// HASH `uid`, `rv`, `epoch`, `orphans`, `handled`, `ver`, `cver`, `floor`.
    pub meta: String,
    /// ZSET pod name → the version its entry last changed or was removed at (the change log).
    pub chg: String,
}

impl ViewKeys {
    /// The view keys of Job `key` under `tag`, its shard's.
    pub(crate) fn new(tag: &str, key: &str) -> Self {
        let t = format!("{tag}:view:{key}");
        Self {
            pods: format!("{t}:pods"),
            meta: format!("{t}:meta"),
            chg: format!("{t}:chg"),
            job: t,
        }
    }

    /// The keys in the order ADD (four per item with view writes) and DELETE take them.
    pub(crate) fn to_vec(&self) -> Vec<String> {
        vec![self.job.clone(), self.pods.clone(), self.meta.clone(), self.chg.clone()]
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

-- Most entries of a change log beyond its view's pods before the oldest are dropped (a
-- few chunks of churn): tombstones of removed pods stay a while, never without bound.
local CHANGE_LOG_SLACK = 64

-- The change log of a view: CHG, a ZSET pod name -> the version at which its entry last
-- changed or was removed (a removed pod stays as a tombstone: in CHG, not in PODS), and
-- `floor` in META: changes at versions <= floor are not known any more, so a reader whose
-- base version is below it reads the view in full. `cver` in META is the version the log was
-- last kept at: a view whose `ver` is another one was written by a writer that does not keep
-- the log (an older kjob-queue, during an upgrade) or is new, so its log starts afresh.
local function log_changes(PODS, META, CHG, ver, reset, changed)
  local m = redis.call('HMGET', META, 'ver', 'cver')
  if reset or not m[1] or m[1] ~= m[2] then
    redis.call('DEL', CHG)
    redis.call('HSET', META, 'floor', ver)
    return
  end
  for s = 1, #changed, 500 do
    local z = {}
    for j = s, math.min(s + 499, #changed) do
      z[#z + 1] = ver
      z[#z + 1] = changed[j]
    end
    redis.call('ZADD', CHG, unpack(z))
  end
  -- Bounded: past twice the pods (and some slack), the oldest entries go, and the floor rises
  -- to the newest of them. Always right: a reader whose base is at or above the new floor
  -- already has every change it drops.
  local n, pods = redis.call('ZCARD', CHG), redis.call('HLEN', PODS)
  if n > 2 * pods + CHANGE_LOG_SLACK then
    local popped = redis.call('ZPOPMIN', CHG, n - pods - CHANGE_LOG_SLACK)
    if #popped > 0 then redis.call('HSET', META, 'floor', popped[#popped]) end
  end
end

-- kind 1 JOB, 2 DELETE_JOB, 3 POD, 4 DELETE_POD, 5 RESET, 6 TRUST, 7 ORPHANS. SEQ: the
-- shard's counters (its `view_ver` gives each changed view a version it never had). CHG: the
-- view's change log (see `log_changes`).
local function apply_view(JOB, PODS, META, CHG, SEQ, gc_ms, session, ops, first, count)
  local moved, reset = false, false
  -- Pods written or removed by this call, logged at the view's new version.
  local changed = {}
  for i = first, first + 4 * (count - 1), 4 do
    local kind, name, obj, rv = tonumber(ops[i]), ops[i + 1], ops[i + 2], ops[i + 3]
    if kind == 1 then
      local cur = redis.call('HMGET', META, 'uid', 'rv')
      if cur[1] and cur[1] ~= name then
        -- Another Job of the same name: what is cached belongs to its predecessor.
        redis.call('DEL', PODS, META)
        redis.call('SET', JOB, obj)
        redis.call('HSET', META, 'uid', name, 'rv', rv, 'epoch', '')
        moved, reset, changed = true, true, {}
      elseif newer(rv, cur[2]) then
        redis.call('SET', JOB, obj)
        redis.call('HSET', META, 'uid', name, 'rv', rv)
      end
    elseif kind == 2 then
      redis.call('DEL', JOB, PODS, META, CHG)
      moved, reset, changed = false, false, {}
    elseif kind == 3 then
      redis.call('HSET', PODS, name, obj)
      moved = true
      changed[#changed + 1] = name
    elseif kind == 4 then
      redis.call('HDEL', PODS, name)
      moved = true
      changed[#changed + 1] = name
    elseif kind == 5 then
      moved, reset, changed = true, true, {}
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
  -- A paged read compares the version of its pages: a view whose pods changed gets one no
  -- page has seen (a per-shard sequence, so a view deleted and written again never repeats
  -- one).
  if moved then
    local ver = redis.call('HINCRBY', SEQ, 'view_ver', 1)
    log_changes(PODS, META, CHG, ver, reset, changed)
    redis.call('HSET', META, 'ver', ver, 'cver', ver)
  end
  -- Views of Jobs whose delete nobody saw go away with the other idle records.
  redis.call('PEXPIRE', JOB, gc_ms)
  redis.call('PEXPIRE', PODS, gc_ms)
  redis.call('PEXPIRE', META, gc_ms)
  redis.call('PEXPIRE', CHG, gc_ms)
end

-- The session a trusted view was read in, as readers see it: a digest, so a worker can tell
-- one session from the next without learning the id that lets the watcher write.
local function epoch_token(current)
  return string.sub(redis.sha1hex(current), 1, 16)
end

-- One Job's view: {0} unless its epoch is the `current` session, which a pending session never
-- equals; else {1, object, orphans_seen, orphans_handled, {pod…}, uid, exp, {record…}} with
-- `exp` as GET_EXPECTATIONS replies it and the records named by names[first .. first + count -
-- 1] (each `expiry|value`, '' when absent). The pods only `with_pods` (else {}): GET_VIEW reads
-- them with an HVALS after the script, in the same transaction (see `Store::run_then_read`).
-- With the pods (an Add's hand-off) they come as `{name, entry, …}` and the reply ends with the
-- view's version and epoch token, so a lessee that caches views decoded can hold this one
-- without reading it again.
local function read_view(current, JOB, PODS, META, EXP, FIN, REC, now, names, first, count,
                         with_pods)
  local m = redis.call('HMGET', META, 'epoch', 'orphans', 'handled', 'uid', 'ver')
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
  if not with_pods then
    return {1, job, tonumber(m[2] or 0), tonumber(m[3] or 0), {}, m[4] or '', exp, recs}
  end
  return {1, job, tonumber(m[2] or 0), tonumber(m[3] or 0), redis.call('HGETALL', PODS),
    m[4] or '', exp, recs, tonumber(m[5] or 0), epoch_token(current)}
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
    /// The keys of `key`'s view, under its tag `tag`.
    fn of(tag: &str, key: &str) -> Self {
        GetViewKeys {
            session: view_session_key(tag),
            view: ViewKeys::new(tag, key),
            exp: ExpKeys::new(tag, key),
            run: view_run_key(tag),
        }
    }

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
/// session check, and when trusted then the view's version, pod count and epoch token;
/// [`Store::get_job_view`] reads the pods with an HVALS in the same transaction,
/// [`Store::get_job_view_page`] with an HSCAN.
const GET_VIEW: &str = concat!(
    apply_view_fn!(),
    r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local current = view_current(KEYS[1], KEYS[7])
local r = read_view(current, KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[8], now, ARGV, 1,
  #ARGV, false)
if r[1] == 1 then
  r[#r + 1] = tonumber(redis.call('HGET', KEYS[4], 'ver') or 0)
  r[#r + 1] = redis.call('HLEN', KEYS[3])
  r[#r + 1] = epoch_token(current)
end
return r
"#
);

/// KEYS[1] -> the view session, KEYS[2] -> the view meta, KEYS[3] -> the view pods, KEYS[4] ->
/// the view run.
/// Reply: `{0}` when the view is not trusted (as `read_view` decides), else `{1, version,
/// pod_count}`: a later page of a paged read checks trust and version in the transaction
/// whose HSCAN reads its pods.
const VIEW_PAGE: &str = concat!(
    apply_view_fn!(),
    r#"
local current = view_current(KEYS[1], KEYS[4])
local m = redis.call('HMGET', KEYS[2], 'epoch', 'ver')
if not current or not m[1] or m[1] == '' or m[1] ~= current then return {0} end
return {1, tonumber(m[2] or 0), redis.call('HLEN', KEYS[3])}
"#
);

static VIEW_PAGE_SCRIPT: Lua = Lua::new("job_view_page", VIEW_PAGE);

/// HSCAN's COUNT for one chunk of a paged view read: a few hundred pods (about 60 KB of compact
/// entries, half a megabyte of the older JSON ones) per Redis transaction, short for Redis.
const VIEW_SCAN_COUNT: u32 = 256;

/// Where a paged view read goes on: the view's version its pages so far were read at, the
/// HSCAN cursor of the chunk to read next, and how many of that chunk's first entries an
/// earlier page took already (a page ends on a byte budget, not on a chunk's end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewCursor {
    /// The version of the view the pages were read at.
    pub version: u64,
    /// The HSCAN cursor of the next chunk.
    pub scan: u64,
    /// Entries of that chunk an earlier page returned.
    pub skip: u32,
}

impl ViewCursor {
    /// The cursor as a page token (`version.scan.skip`).
    pub fn token(&self) -> String {
        format!("{}.{}.{}", self.version, self.scan, self.skip)
    }

    /// Reads a page token; `None` when it is not one [`Self::token`] makes.
    pub fn parse(token: &str) -> Option<Self> {
        let mut it = token.split('.');
        let version = it.next()?.parse().ok()?;
        let scan = it.next()?.parse().ok()?;
        let skip = it.next()?.parse().ok()?;
        it.next().is_none().then_some(Self { version, scan, skip })
    }
}

/// One page of a view read by [`Store::get_job_view_page`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ViewPage {
    /// The view is not trusted (now): read the API server.
    Untrusted,
    /// The view's pods changed since the version the read began at: begin again.
    Moved,
    /// Pods of the view at one version.
    Pods(ViewPods),
}

/// The pods of one page of a view read, at one version of the view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewPods {
    /// First page only: the view's object, expectations and records (its `pods` empty).
    pub head: Option<Box<JobView>>,
    /// This page's pods, at most the budget's bytes (or one pod, if larger).
    pub pods: Vec<Vec<u8>>,
    /// Their names in the view (the hash's fields), one per pod, in the same order.
    pub names: Vec<String>,
    /// The view's version: every page of one read must have the same.
    pub version: u64,
    /// First page only: the token of the session the view was trusted in (empty on later
    /// pages); a delta read names it with its base version.
    pub epoch: String,
    /// How many pods the view holds at that version.
    pub pod_count: u64,
    /// Where the next page begins; `None` on the last.
    pub next: Option<ViewCursor>,
}

/// One HSCAN chunk of a view, read in one transaction with its trust check.
struct ViewChunk {
    head: Option<Box<JobView>>,
    version: u64,
    pod_count: u64,
    epoch: String,
    next_scan: u64,
    pods: Vec<Vec<u8>>,
    names: Vec<String>,
}

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
        let keys = GetViewKeys::of(&tag, key);
        let args: Vec<Vec<u8>> = records.iter().map(Arg::arg).collect();
        let mut hvals = redis::cmd("HVALS");
        hvals.arg(&keys.view.pods);
        let (v, mut reads) =
            self.run_then_read(&GET_VIEW_SCRIPT, &keys.to_vec(), &args, &[hvals]).await?;
        let mut f = Fields::new("get_job_view", &v)?;
        let Some(mut view) = self.read_view_fields(&mut f, records, false)? else {
            return Ok(None);
        };
        let pods = reads.pop().unwrap_or(Value::Nil);
        let mut pods_f = Fields::new("get_job_view", &pods)?;
        view.pods =
            (0..pods_f.remaining()).map(|_| pods_f.bytes("pod")).collect::<Result<_, _>>()?;
        Ok(Some(view))
    }

    /// Reads one page of the view of Job `key`: from its first pod (`from` = `None`, which
    /// also reads the object, expectations and `records`) or from where an earlier page ended,
    /// until its pods reach `budget` bytes (a page holds at least one pod, whatever its size)
    /// or the view's end. Each HSCAN chunk is read in one transaction with the view's trust
    /// and version, so every pod of a page is of the version it reports; a page whose chunks
    /// disagree, or that does not have `from`'s version, is [`ViewPage::Moved`]. Pods may come
    /// twice across pages (HSCAN returns an entry again when the hash was resized between
    /// chunks), never changed: a reader that finds more pods than `pod_count` drops exact
    /// duplicates, and one that then counts another number than `pod_count` begins again.
    pub async fn get_job_view_page(
        &self,
        key: &str,
        records: &[String],
        from: Option<ViewCursor>,
        budget: usize,
    ) -> Result<ViewPage, WqError> {
        let tag = self.layout().job_tag(key);
        let keys = GetViewKeys::of(&tag, key);
        let (mut scan, mut skip) = from.map_or((0, 0), |c| (c.scan, c.skip as usize));
        let mut version = from.map(|c| c.version);
        let mut page = ViewPods {
            head: None,
            pods: Vec::new(),
            names: Vec::new(),
            version: 0,
            epoch: String::new(),
            pod_count: 0,
            next: None,
        };
        let mut bytes = 0usize;
        let mut first = from.is_none();
        loop {
            let chunk = if first {
                self.first_chunk(&keys, records).await?
            } else {
                self.next_chunk(&keys, scan).await?
            };
            let Some(chunk) = chunk else { return Ok(ViewPage::Untrusted) };
            if version.is_some_and(|v| v != chunk.version) {
                return Ok(ViewPage::Moved);
            }
            version = Some(chunk.version);
            if first {
                page.head = chunk.head;
                page.epoch = chunk.epoch;
                first = false;
            }
            page.version = chunk.version;
            page.pod_count = chunk.pod_count;
            // A chunk read again may be shorter than the part of it already returned (the hash
            // was resized): the reader's count check then finds what is missing.
            for (i, (pod, name)) in chunk.pods.into_iter().zip(chunk.names).enumerate().skip(skip) {
                if !page.pods.is_empty() && bytes + pod.len() > budget {
                    let skip = u32::try_from(i).unwrap_or(u32::MAX);
                    page.next = Some(ViewCursor { version: chunk.version, scan, skip });
                    return Ok(ViewPage::Pods(page));
                }
                bytes += pod.len();
                page.pods.push(pod);
                page.names.push(name);
            }
            skip = 0;
            if chunk.next_scan == 0 {
                return Ok(ViewPage::Pods(page));
            }
            scan = chunk.next_scan;
            if bytes >= budget {
                page.next = Some(ViewCursor { version: chunk.version, scan, skip: 0 });
                return Ok(ViewPage::Pods(page));
            }
        }
    }

    /// The first chunk of a paged read: GET_VIEW and an HSCAN from cursor 0, in one
    /// transaction. `None` when the view is not trusted.
    async fn first_chunk(
        &self,
        keys: &GetViewKeys,
        records: &[String],
    ) -> Result<Option<ViewChunk>, WqError> {
        let args: Vec<Vec<u8>> = records.iter().map(Arg::arg).collect();
        let (v, reads) = self
            .run_then_read(&GET_VIEW_SCRIPT, &keys.to_vec(), &args, &[scan_cmd(keys, 0)])
            .await?;
        let mut f = Fields::new("get_job_view", &v)?;
        let Some(head) = self.read_view_fields(&mut f, records, false)? else { return Ok(None) };
        let version = f.u64("version")?;
        let pod_count = f.u64("pod_count")?;
        let epoch = f.string("epoch")?;
        let (next_scan, pods, names) = scan_reply(&reads)?;
        Ok(Some(ViewChunk {
            head: Some(Box::new(head)),
            version,
            pod_count,
            epoch,
            next_scan,
            pods,
            names,
        }))
    }

    /// A later chunk of a paged read: VIEW_PAGE and an HSCAN from `scan`, in one transaction.
    /// `None` when the view is not trusted any more.
    async fn next_chunk(
        &self,
        keys: &GetViewKeys,
        scan: u64,
    ) -> Result<Option<ViewChunk>, WqError> {
        let page_keys = [
            keys.session.clone(),
            keys.view.meta.clone(),
            keys.view.pods.clone(),
            keys.run.clone(),
        ];
        let (v, reads) =
            self.run_then_read(&VIEW_PAGE_SCRIPT, &page_keys, &[], &[scan_cmd(keys, scan)]).await?;
        let mut f = Fields::new("job_view_page", &v)?;
        if !f.flag("trusted")? {
            return Ok(None);
        }
        let version = f.u64("version")?;
        let pod_count = f.u64("pod_count")?;
        let (next_scan, pods, names) = scan_reply(&reads)?;
        let epoch = String::new();
        Ok(Some(ViewChunk { head: None, version, pod_count, epoch, next_scan, pods, names }))
    }

    /// Reads a view as `read_view` replies it with its pods (ADD's hand-offs: named, with
    /// version and epoch): `None` when it is not trusted.
    pub(crate) fn handoff_view_reply(
        &self,
        mut f: Fields<'_>,
        records: &[String],
    ) -> Result<Option<JobView>, WqError> {
        let Some(mut view) = self.read_view_fields(&mut f, records, true)? else {
            return Ok(None);
        };
        if let Some(named) = &mut view.named {
            named.version = f.u64("version")?;
            named.epoch = f.string("epoch")?;
        }
        Ok(Some(view))
    }

    /// The fields of `read_view`'s reply from a cursor that may go on past them; the pods as
    /// `{name, entry, …}` when `named`.
    fn read_view_fields(
        &self,
        f: &mut Fields<'_>,
        records: &[String],
        named: bool,
    ) -> Result<Option<JobView>, WqError> {
        if !f.flag("trusted")? {
            return Ok(None);
        }
        let job = f.bytes("object")?;
        let orphans_seen = f.u64("orphans_seen")?;
        let orphans_handled = f.u64("orphans_handled")?;
        let mut pods_f = f.array("pods")?;
        let mut pods = Vec::with_capacity(pods_f.remaining());
        let mut names = Vec::new();
        while pods_f.remaining() > 0 {
            if named {
                names.push(pods_f.string("pod name")?);
            }
            pods.push(pods_f.bytes("pod")?);
        }
        let named = named.then(|| NamedPods { names, version: 0, epoch: String::new() });
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
            named,
        }))
    }
}

/// `HSCAN pods scan COUNT` [`VIEW_SCAN_COUNT`].
fn scan_cmd(keys: &GetViewKeys, scan: u64) -> redis::Cmd {
    let mut c = redis::cmd("HSCAN");
    c.arg(&keys.view.pods).arg(scan).arg("COUNT").arg(VIEW_SCAN_COUNT);
    c
}

/// One HSCAN chunk's reply: the next cursor, the values and their names.
type ScanChunk = (u64, Vec<Vec<u8>>, Vec<String>);

/// An HSCAN reply (the one read of its transaction): the next cursor, the values and their
/// names.
fn scan_reply(reads: &[Value]) -> Result<ScanChunk, WqError> {
    let v = reads.first().unwrap_or(&Value::Nil);
    let mut f = Fields::new("job_view_scan", v)?;
    let next = f.u64("cursor")?;
    let mut entries = f.array("entries")?;
    let mut pods = Vec::with_capacity(entries.remaining() / 2);
    let mut names = Vec::with_capacity(entries.remaining() / 2);
    while entries.remaining() > 0 {
        names.push(entries.string("pod name")?);
        pods.push(entries.bytes("pod")?);
    }
    Ok((next, pods, names))
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

/// Most changed pods a delta read answers with: a view that changed more since the reader's
/// base is read in pages, as a full read (a delta of thousands costs Lua time and little less
/// than a page).
pub const DELTA_MAX_PODS: u32 = 8192;

/// KEYS: [`GetViewKeys`] (1 session, 2 object, 3 pods, 4 meta, 5 expectation record, 6
/// finalizer set, 7 run, 8 records), 9 the change log.
/// ARGV[1] -> base version, ARGV[2] -> the base's epoch token, ARGV[3] -> most changed pods,
/// ARGV[4] -> most bytes of changed entries, ARGV[5..] -> record names.
/// Reply: `{0}` when the view is not trusted; `{2}` when the reader must read it in full (its
/// base is below the log's floor or above the view's version, the session is another, the
/// log was not kept at the view's version, or more changed than the bounds); else
/// `read_view`'s reply without pods, then version, pod count, epoch token, and `{name, entry
/// or '' when removed, …}` of every pod changed since the base: one script, so the changes,
/// the head and the trust check are of one instant.
const VIEW_DELTA: &str = concat!(
    apply_view_fn!(),
    r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local current = view_current(KEYS[1], KEYS[7])
local r = read_view(current, KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[8], now, ARGV, 5,
  #ARGV - 4, false)
if r[1] ~= 1 then return {0} end
local m = redis.call('HMGET', KEYS[4], 'ver', 'cver', 'floor')
local ver, floor, base = tonumber(m[1]), tonumber(m[3]), tonumber(ARGV[1])
local epoch = epoch_token(current)
if not ver or m[1] ~= m[2] or not floor or not base or base < floor or base > ver or
    epoch ~= ARGV[2] then
  return {2}
end
local changed = {}
if base < ver then
  if redis.call('ZCOUNT', KEYS[9], '(' .. ARGV[1], '+inf') > tonumber(ARGV[3]) then return {2} end
  local names = redis.call('ZRANGE', KEYS[9], '(' .. ARGV[1], '+inf', 'BYSCORE')
  local bytes, budget = 0, tonumber(ARGV[4])
  for s = 1, #names, 500 do
    local got = redis.call('HMGET', KEYS[3], unpack(names, s, math.min(s + 499, #names)))
    for j = 1, #got do
      local name = names[s + j - 1]
      local entry = got[j] or ''
      bytes = bytes + #name + #entry
      changed[#changed + 1] = name
      changed[#changed + 1] = entry
    end
    if bytes > budget then return {2} end
  end
end
r[#r + 1] = ver
r[#r + 1] = redis.call('HLEN', KEYS[3])
r[#r + 1] = epoch
r[#r + 1] = changed
return r
"#
);

static VIEW_DELTA_SCRIPT: Lua = Lua::new("job_view_delta", VIEW_DELTA);

/// What a delta read of a view found ([`Store::get_job_view_delta`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ViewDelta {
    /// The view is not trusted (now): read the API server.
    Untrusted,
    /// The reader's base cannot be brought up to date from the change log: read the view in
    /// full (pages).
    Full,
    /// The view now, as what changed since the base.
    Changes(Box<ViewChanges>),
}

/// A view as the changes since a reader's base version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewChanges {
    /// The view's object, expectations and records, as a first page has them (`pods` empty).
    pub head: JobView,
    /// The view's version now.
    pub version: u64,
    /// How many pods the view holds now: the base's pods, with `changed` and without
    /// `removed`, must be that many.
    pub pod_count: u64,
    /// The token of the session the view is trusted in (the base's: else the read is full).
    pub epoch: String,
    /// Pods written since the base, `(name, entry)`.
    pub changed: Vec<(String, Vec<u8>)>,
    /// Pods removed since the base (some may not have been in it: created and removed since).
    pub removed: Vec<String>,
    /// The base version the changes are from.
    pub base: u64,
}

impl Store {
    /// Reads what changed in the view of Job `key` since version `base` of session `epoch`
    /// (a [`ViewPods::epoch`] or [`ViewChanges::epoch`]), with its object, expectations and
    /// `records`, in one script with the trust check. [`ViewDelta::Full`] when the change
    /// log cannot say (see `VIEW_DELTA`), or the changed entries pass `budget` bytes.
    pub async fn get_job_view_delta(
        &self,
        key: &str,
        records: &[String],
        base: u64,
        epoch: &str,
        budget: usize,
    ) -> Result<ViewDelta, WqError> {
        let tag = self.layout().job_tag(key);
        let keys = GetViewKeys::of(&tag, key);
        let mut key_list = keys.to_vec();
        key_list.push(keys.view.chg.clone());
        let mut args = argv![base, epoch, DELTA_MAX_PODS, budget];
        args.extend(records.iter().map(Arg::arg));
        let v: Value = self.run(&VIEW_DELTA_SCRIPT, &key_list, args).await?;
        if let Value::Array(a) = &v {
            match a.first() {
                Some(Value::Int(0)) => return Ok(ViewDelta::Untrusted),
                Some(Value::Int(2)) => return Ok(ViewDelta::Full),
                _ => {}
            }
        }
        let mut f = Fields::new("job_view_delta", &v)?;
        let Some(head) = self.read_view_fields(&mut f, records, false)? else {
            return Ok(ViewDelta::Untrusted);
        };
        let version = f.u64("version")?;
        let pod_count = f.u64("pod_count")?;
        let epoch = f.string("epoch")?;
        let mut entries = f.array("changes")?;
        let (mut changed, mut removed) = (Vec::new(), Vec::new());
        while entries.remaining() > 0 {
            let name = entries.string("pod name")?;
            let entry = entries.bytes("pod")?;
            if entry.is_empty() {
                removed.push(name);
            } else {
                changed.push((name, entry));
            }
        }
        Ok(ViewDelta::Changes(Box::new(ViewChanges {
            head,
            version,
            pod_count,
            epoch,
            changed,
            removed,
            base,
        })))
    }
}
