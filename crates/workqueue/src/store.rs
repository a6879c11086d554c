//! The workqueue operations over Redis: one script call per operation.

use std::sync::Arc;
use std::time::Duration;

use redis::{Script, Value};

use crate::conn::{self, Conn, RESPONSE_TIMEOUT, RedisTarget};
use crate::expectations::{
    EXPECTATIONS_TIMEOUT, ExpectationRecord, Expectations, Observation, ObservationKind,
};
use crate::limiter::{ItemExponentialLimiter, JOB_LIMITER};
use crate::view::{ViewOp, push_view_ops, view_keys, view_run_key, view_session_key};
use crate::{WqError, scripts};

/// Default of [`StoreConfig::poison_after`]: one expiry is a crash or a pause, three in a row
/// (BullMQ's `maxStalledCount` is 1, asynq archives after its retries) is the item itself.
pub const DEFAULT_POISON_AFTER: u32 = 3;

/// Tunables of a [`Store`].
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Rate limiter of `LeaseOutcome::RateLimited`.
    pub limiter: ItemExponentialLimiter,
    /// Age after which expectations count as satisfied.
    pub expectations_timeout: Duration,
    /// Expectations, finalizer sets and records of a Job untouched this long are dropped, so a
    /// Job whose delete event was missed does not leak keys forever.
    pub idle_gc: Duration,
    /// Most delayed items promoted per script call (a script blocks the whole server).
    pub promote_limit: u32,
    /// Most expired leases reaped per script call.
    pub reap_limit: u32,
    /// Lease expiries in a row (without a Done) after which an item is a poison item: the reaper
    /// requeues it through the rate limiter instead of at once. 0 = never.
    pub poison_after: u32,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            limiter: JOB_LIMITER,
            expectations_timeout: EXPECTATIONS_TIMEOUT,
            idle_gc: Duration::from_secs(7 * 24 * 3600),
            promote_limit: 1000,
            reap_limit: 1000,
            poison_after: DEFAULT_POISON_AFTER,
        }
    }
}

/// One item to enqueue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enqueue {
    /// The item (a `namespace/name` key).
    pub key: String,
    /// Delay before it becomes ready; zero = now.
    pub delay: Duration,
    /// Observations for the expectations of Job `key`, applied in the same script as the
    /// enqueue when the queue is [`kjob_core::JOB_QUEUE`].
    pub observations: Vec<Observation>,
    /// Apply the observations only; do not enqueue.
    pub observe_only: bool,
    /// Writes to the shared view of Job `key` (job queue only), applied before the
    /// observations in the same script, while `session` is the current view session.
    pub view: Vec<ViewOp>,
    /// The watcher session that made `view` (ignored without view writes).
    pub session: String,
}

impl Enqueue {
    /// An item ready now.
    pub fn now(key: impl Into<String>) -> Self {
        Self::after(key, Duration::ZERO)
    }

    /// An item ready after `delay`.
    pub fn after(key: impl Into<String>, delay: Duration) -> Self {
        Self {
            key: key.into(),
            delay,
            observations: Vec::new(),
            observe_only: false,
            view: Vec::new(),
            session: String::new(),
        }
    }

    /// The same item carrying `observations`.
    pub fn observing(mut self, observations: Vec<Observation>) -> Self {
        self.observations = observations;
        self
    }

    /// The same item carrying view writes of watcher session `session`.
    pub fn writing_view(mut self, session: impl Into<String>, view: Vec<ViewOp>) -> Self {
        self.session = session.into();
        self.view = view;
        self
    }
}

/// Result of [`Store::add`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AddOutcome {
    /// Items that became newly waiting, newly dirty or got an earlier ready time.
    pub added: u32,
    /// Immediate adds accepted (client-go `workqueue_adds_total`).
    pub accepted_now: u32,
    /// Adds with a delay (client-go counts every AddAfter in `workqueue_retries_total`).
    pub delayed: u32,
    /// Observations that changed an expectation record or finalizer set.
    pub observed: u32,
    /// View writes found no current session (Redis lost it): the watcher must begin a new one.
    pub view_lost: bool,
}

/// A leased item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leased {
    /// The item.
    pub key: String,
    /// Fencing id; Renew and Done must present it.
    pub lease_id: String,
    /// Rate-limited requeues since the last Forget.
    pub requeues: u32,
    /// Lease deadline (Unix ms, Redis clock).
    pub deadline_ms: i64,
    /// When the item was (first) added (Unix ms).
    pub enqueued_ms: i64,
}

/// Result of one lease attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseBatch {
    /// Redis time of the attempt (Unix ms).
    pub now_ms: i64,
    /// Due time of the earliest delayed item, if any.
    pub next_due_ms: Option<i64>,
    /// Delayed items promoted by this call.
    pub promoted: u32,
    /// Expired leases put back by this call.
    pub reaped: u32,
    /// Of those, poison items requeued through the rate limiter.
    pub poisoned: u32,
    /// The leased items.
    pub items: Vec<Leased>,
}

/// How a lease ends (kjob's one lease outcome).
pub use kjob_core::LeaseOutcome;

pub use kjob_core::MAX_DONE_BATCH;

/// One lease to finish (see [`Store::done_many`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    /// The item.
    pub key: String,
    /// The fencing id its lease was issued with.
    pub lease_id: String,
    /// How the lease ends.
    pub outcome: LeaseOutcome,
}

/// Result of an accepted [`Store::done`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DoneResult {
    /// Lease start → Done, ms.
    pub work_ms: i64,
    /// When the item is ready again, if it went back into the queue.
    pub ready_at_ms: Option<i64>,
    /// Redis time of the call.
    pub now_ms: i64,
    /// The delay used by a rate-limited or requeue-after outcome (an AddAfter).
    pub retry_delay_ms: Option<i64>,
}

/// Result of [`Store::sweep`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepResult {
    /// Delayed items promoted.
    pub promoted: u32,
    /// Expired leases put back.
    pub reaped: u32,
    /// Of those, poison items requeued through the rate limiter.
    pub poisoned: u32,
    /// Due time of the earliest delayed item, if any.
    pub next_due_ms: Option<i64>,
    /// Redis time.
    pub now_ms: i64,
}

/// Depths of a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueStats {
    /// Redis time.
    pub now_ms: i64,
    /// Ready now.
    pub ready: u64,
    /// Waiting for a later time.
    pub delayed: u64,
    /// Leased.
    pub leased: u64,
    /// Leased and added again meanwhile.
    pub dirty: u64,
    /// Ready time of the oldest ready item.
    pub oldest_ready_ms: Option<i64>,
    /// Items with a non-zero failure count.
    pub failing: u64,
    /// Sum over leased items of their time in processing, ms.
    pub unfinished_ms: i64,
    /// Start of the oldest lease.
    pub oldest_started_ms: Option<i64>,
}

/// Where a key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyState {
    /// Not known to the queue.
    Absent,
    /// Ready to be leased.
    Ready,
    /// Waiting for its due time only.
    Delayed,
    /// Held by a worker.
    Leased,
}

impl KeyState {
    /// The lowercase name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyState::Absent => "absent",
            KeyState::Ready => "ready",
            KeyState::Delayed => "delayed",
            KeyState::Leased => "leased",
        }
    }
}

/// What the queue knows about one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyView {
    /// The key.
    pub key: String,
    /// Its state (leased wins over ready wins over delayed).
    pub state: KeyState,
    /// Ready time if ready.
    pub ready_ms: Option<i64>,
    /// Due time of its delayed entry, if any (independent of the other states, as in client-go).
    pub delayed_ms: Option<i64>,
    /// Lease deadline if leased.
    pub lease_deadline_ms: Option<i64>,
    /// Leased and added again meanwhile.
    pub dirty: bool,
    /// Failure count.
    pub requeues: u32,
    /// Worker holding the lease (empty if none).
    pub holder: String,
    /// Lease expiries in a row without a Done (poison detection).
    pub expiries: u32,
}

struct Scripts {
    add: Script,
    lease: Script,
    renew: Script,
    done: Script,
    sweep: Script,
    stats: Script,
    inspect: Script,
    rewake: Script,
    exp_set: Script,
    exp_lower: Script,
    exp_get: Script,
    exp_observe: Script,
    exp_delete: Script,
    exp_fin_add: Script,
    rec_get: Script,
    rec_put: Script,
    rec_del: Script,
    view: crate::view::ViewScripts,
}

impl Scripts {
    fn new() -> Self {
        Self {
            add: Script::new(scripts::ADD),
            lease: Script::new(scripts::LEASE),
            renew: Script::new(scripts::RENEW),
            done: Script::new(scripts::DONE),
            sweep: Script::new(scripts::SWEEP),
            stats: Script::new(scripts::STATS),
            inspect: Script::new(scripts::INSPECT),
            rewake: Script::new(scripts::REWAKE),
            exp_set: Script::new(scripts::EXP_SET),
            exp_lower: Script::new(scripts::EXP_LOWER),
            exp_get: Script::new(scripts::EXP_GET),
            exp_observe: Script::new(scripts::EXP_OBSERVE),
            exp_delete: Script::new(scripts::EXP_DELETE),
            exp_fin_add: Script::new(scripts::EXP_FIN_ADD),
            rec_get: Script::new(scripts::REC_GET),
            rec_put: Script::new(scripts::REC_PUT),
            rec_del: Script::new(scripts::REC_DEL),
            view: crate::view::ViewScripts::new(),
        }
    }
}

/// The seven keys of a queue, in the order the scripts expect.
pub(crate) fn queue_keys(queue: &str) -> [String; 7] {
    let t = format!("{{wq:{queue}}}");
    ["ready", "delayed", "leases", "lease", "failures", "stats", "wake"].map(|s| format!("{t}:{s}"))
}

/// The wake marker list of a queue.
pub(crate) fn wake_key(queue: &str) -> String {
    format!("{{wq:{queue}}}:wake")
}

/// The four expectation keys of Job `key`. They carry the hash tag of the `job` queue, so an Add
/// to that queue applies an item's observations and its enqueue in one script, also on a
/// Cluster (where every key of a script must hash to one slot). The price: all expectations live
/// on the job queue's shard, which the queue's own traffic already bounds.
pub(crate) fn exp_keys(key: &str) -> [String; 4] {
    let t = format!("{{wq:{}}}:exp:{key}", kjob_core::JOB_QUEUE);
    [t.clone(), format!("{t}:seen"), format!("{t}:fin"), format!("{t}:rec")]
}

/// Appends `(kind, job_uid, pod_uid)` of each observation to `args`.
fn push_observations(args: &mut Vec<Vec<u8>>, observations: &[Observation]) {
    for o in observations {
        // The script's kind codes (see `observe_fn!` in scripts.rs).
        let kind = match o.kind {
            ObservationKind::Creation => 1,
            ObservationKind::Deletion => 2,
            ObservationKind::FinalizerRemoval => 3,
        };
        args.push(kind.to_string().into_bytes());
        args.push(o.job_uid.as_bytes().to_vec());
        args.push(o.pod_uid.as_bytes().to_vec());
    }
}

/// The value of a stored record (`expiry|value`, expiry 0 = none) unless it expired by `now`.
pub(crate) fn live_record(stored: &[u8], now: i64) -> Option<Vec<u8>> {
    let sep = stored.iter().position(|b| *b == b'|')?;
    let expiry: i64 = std::str::from_utf8(&stored[..sep]).ok()?.parse().ok()?;
    (expiry == 0 || expiry > now).then(|| stored[sep + 1..].to_vec())
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

// ---- reply parsing: scripts return nested arrays of integers and strings.

fn proto(what: &str, v: &Value) -> WqError {
    WqError::Protocol(format!("{what}: {v:?}"))
}

fn arr<'a>(v: &'a Value, what: &str) -> Result<&'a [Value], WqError> {
    match v {
        Value::Array(a) => Ok(a),
        _ => Err(proto(what, v)),
    }
}

fn int(v: &Value, what: &str) -> Result<i64, WqError> {
    match v {
        Value::Int(i) => Ok(*i),
        Value::BulkString(b) => {
            std::str::from_utf8(b).ok().and_then(|s| s.parse().ok()).ok_or_else(|| proto(what, v))
        }
        _ => Err(proto(what, v)),
    }
}

fn bytes(v: &Value, what: &str) -> Result<Vec<u8>, WqError> {
    match v {
        Value::BulkString(b) => Ok(b.clone()),
        Value::SimpleString(s) => Ok(s.clone().into_bytes()),
        Value::Int(i) => Ok(i.to_string().into_bytes()),
        _ => Err(proto(what, v)),
    }
}

fn string(v: &Value, what: &str) -> Result<String, WqError> {
    String::from_utf8(bytes(v, what)?).map_err(|_| proto(what, v))
}

fn at(a: &[Value], i: usize, what: &str) -> Result<i64, WqError> {
    int(a.get(i).ok_or_else(|| WqError::Protocol(format!("{what}: short reply")))?, what)
}

fn opt(v: i64) -> Option<i64> {
    (v >= 0).then_some(v)
}

fn count(v: i64) -> u32 {
    u32::try_from(v.max(0)).unwrap_or(u32::MAX)
}

/// The Redis-backed workqueue and expectations store. Cheap to clone (one shared connection).
#[derive(Clone)]
pub struct Store {
    target: RedisTarget,
    conn: Conn,
    scripts: Arc<Scripts>,
    config: StoreConfig,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("target", &self.target).finish_non_exhaustive()
    }
}

impl Store {
    /// Connects to `url` (see [`crate::conn`] for the forms), refusing a Redis whose
    /// `maxmemory-policy` is not `noeviction`.
    pub async fn connect(url: &str, config: StoreConfig) -> Result<Self, WqError> {
        let target = RedisTarget::parse(url)?;
        conn::check_noeviction(&target).await?;
        let conn = conn::connect(&target, RESPONSE_TIMEOUT).await?;
        Ok(Self { target, conn, scripts: Arc::new(Scripts::new()), config })
    }

    /// Where this store connects.
    pub fn target(&self) -> &RedisTarget {
        &self.target
    }

    /// The tunables.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    pub(crate) fn view_scripts(&self) -> &crate::view::ViewScripts {
        &self.scripts.view
    }

    pub(crate) fn idle_gc_ms(&self) -> i64 {
        ms(self.config.idle_gc)
    }

    pub(crate) async fn eval(
        &self,
        what: &'static str,
        script: &Script,
        keys: &[String],
        args: Vec<Vec<u8>>,
    ) -> Result<Value, WqError> {
        let mut inv = script.prepare_invoke();
        for k in keys {
            inv.key(k);
        }
        for a in args {
            inv.arg(a);
        }
        let mut conn = self.conn.clone();
        match tokio::time::timeout(RESPONSE_TIMEOUT, inv.invoke_async::<Value>(&mut conn)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                let e = WqError::from(e);
                if e.is_unavailable() {
                    Err(WqError::Unavailable(format!("{what}: {e}")))
                } else {
                    Err(e)
                }
            }
            Err(_) => {
                Err(WqError::Unavailable(format!("{what}: no reply in {RESPONSE_TIMEOUT:?}")))
            }
        }
    }

    /// Checks that Redis answers (for readiness).
    pub async fn ping(&self) -> Result<(), WqError> {
        let mut conn = self.conn.clone();
        match tokio::time::timeout(
            RESPONSE_TIMEOUT,
            redis::cmd("PING").query_async::<String>(&mut conn),
        )
        .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(WqError::Unavailable(format!("ping: {e}"))),
            Err(_) => Err(WqError::Unavailable("ping: no reply".into())),
        }
    }

    /// Adds a batch to `queue`: immediate items join the ready set (or mark a leased item
    /// dirty), delayed items keep their earliest due time. On the `job` queue each item's
    /// observations are applied in the same script as its enqueue (atomically, before it); on
    /// another queue they are applied first by a separate script on the job queue's slot.
    pub async fn add(&self, queue: &str, items: &[Enqueue]) -> Result<AddOutcome, WqError> {
        if items.is_empty() {
            return Ok(AddOutcome::default());
        }
        let mut observed = 0;
        let same_slot = queue == kjob_core::JOB_QUEUE;
        if !same_slot {
            for it in items.iter().filter(|it| !it.observations.is_empty()) {
                observed += self.observe(&it.key, &it.observations).await?;
            }
        }
        let mut keys: Vec<String> = queue_keys(queue).into();
        let mut args = Vec::with_capacity(2 + items.len() * 6);
        args.push(ms(self.config.idle_gc).to_string().into_bytes());
        // The view session key carries the job queue's hash tag, so only that queue's script
        // may name it (one slot per script on a Cluster); view writes go to the job queue only.
        if same_slot {
            args.push(b"1".to_vec());
            keys.push(view_session_key());
            keys.push(view_run_key());
        } else {
            args.push(b"0".to_vec());
        }
        let mut delayed = 0;
        let mut entries = 0;
        for it in items {
            let obs: &[Observation] = if same_slot { &it.observations } else { &[] };
            let view: &[ViewOp] = if same_slot { &it.view } else { &[] };
            if it.observe_only && obs.is_empty() && view.is_empty() {
                continue;
            }
            entries += 1;
            let d = ms(it.delay);
            if d > 0 && !it.observe_only {
                delayed += 1;
            }
            args.push(it.key.clone().into_bytes());
            args.push(d.to_string().into_bytes());
            args.push(if it.observe_only { b"1".to_vec() } else { b"0".to_vec() });
            args.push(obs.len().to_string().into_bytes());
            args.push(view.len().to_string().into_bytes());
            args.push(it.session.clone().into_bytes());
            if !obs.is_empty() {
                keys.extend(exp_keys(&it.key));
                push_observations(&mut args, obs);
            }
            if !view.is_empty() {
                keys.extend(view_keys(&it.key));
                push_view_ops(&mut args, view);
            }
        }
        if entries == 0 {
            return Ok(AddOutcome { observed, ..AddOutcome::default() });
        }
        let v = self.eval("add", &self.scripts.add, &keys, args).await?;
        let a = arr(&v, "add")?;
        Ok(AddOutcome {
            added: count(at(a, 0, "add")?),
            accepted_now: count(at(a, 1, "add")?),
            delayed,
            observed: observed + count(at(a, 3, "add")?),
            view_lost: at(a, 4, "add")? == 1,
        })
    }

    /// Leases up to `n` ready items for `lease`, without waiting (see [`crate::Waker::lease`]).
    /// Also promotes due delayed items and reaps expired leases first.
    pub async fn lease(
        &self,
        queue: &str,
        worker: &str,
        n: u32,
        lease: Duration,
    ) -> Result<LeaseBatch, WqError> {
        let args = vec![
            worker.as_bytes().to_vec(),
            n.to_string().into_bytes(),
            ms(lease).to_string().into_bytes(),
            self.config.promote_limit.to_string().into_bytes(),
            self.config.reap_limit.to_string().into_bytes(),
            self.config.poison_after.to_string().into_bytes(),
            ms(self.config.limiter.base).to_string().into_bytes(),
            ms(self.config.limiter.max).to_string().into_bytes(),
        ];
        let v = self.eval("lease", &self.scripts.lease, &queue_keys(queue), args).await?;
        let a = arr(&v, "lease")?;
        let mut items = Vec::new();
        for it in a.iter().skip(5) {
            let f = arr(it, "lease item")?;
            items.push(Leased {
                key: string(f.first().ok_or_else(|| proto("lease item", it))?, "lease key")?,
                lease_id: string(f.get(1).ok_or_else(|| proto("lease item", it))?, "lease id")?,
                requeues: count(at(f, 2, "lease requeues")?),
                deadline_ms: at(f, 3, "lease deadline")?,
                enqueued_ms: at(f, 4, "lease added")?,
            });
        }
        Ok(LeaseBatch {
            now_ms: at(a, 0, "lease now")?,
            next_due_ms: opt(at(a, 1, "lease next due")?),
            promoted: count(at(a, 2, "lease promoted")?),
            reaped: count(at(a, 3, "lease reaped")?),
            poisoned: count(at(a, 4, "lease poisoned")?),
            items,
        })
    }

    /// Extends a lease; `None` when `lease_id` is stale (nothing changed).
    pub async fn renew(
        &self,
        queue: &str,
        key: &str,
        lease_id: &str,
        lease: Duration,
    ) -> Result<Option<i64>, WqError> {
        let args = vec![
            key.as_bytes().to_vec(),
            lease_id.as_bytes().to_vec(),
            ms(lease).to_string().into_bytes(),
        ];
        let v = self.eval("renew", &self.scripts.renew, &queue_keys(queue), args).await?;
        Ok(opt(int(&v, "renew")?))
    }

    /// Finishes a lease; `None` when `lease_id` is stale (nothing changed).
    pub async fn done(
        &self,
        queue: &str,
        key: &str,
        lease_id: &str,
        outcome: LeaseOutcome,
    ) -> Result<Option<DoneResult>, WqError> {
        let done = Done { key: key.to_string(), lease_id: lease_id.to_string(), outcome };
        let mut r = self.done_many(queue, std::slice::from_ref(&done)).await?;
        Ok(r.pop().flatten())
    }

    /// Finishes several leases of `queue` in one script call, in order; one result per Done
    /// (`None` = stale id, nothing changed). At most [`MAX_DONE_BATCH`] at a time.
    pub async fn done_many(
        &self,
        queue: &str,
        dones: &[Done],
    ) -> Result<Vec<Option<DoneResult>>, WqError> {
        if dones.is_empty() {
            return Ok(Vec::new());
        }
        if dones.len() > MAX_DONE_BATCH {
            return Err(WqError::Config(format!(
                "{} Dones in one call; the limit is {MAX_DONE_BATCH}",
                dones.len()
            )));
        }
        let mut args = Vec::with_capacity(2 + dones.len() * 4);
        args.push(ms(self.config.limiter.base).to_string().into_bytes());
        args.push(ms(self.config.limiter.max).to_string().into_bytes());
        for d in dones {
            let (code, after) = match d.outcome {
                LeaseOutcome::Forget => (1, 0),
                LeaseOutcome::RateLimited => (2, 0),
                LeaseOutcome::RequeueAfter(t) => (3, ms(t)),
            };
            args.push(d.key.as_bytes().to_vec());
            args.push(d.lease_id.as_bytes().to_vec());
            args.push(code.to_string().into_bytes());
            args.push(after.to_string().into_bytes());
        }
        let v = self.eval("done", &self.scripts.done, &queue_keys(queue), args).await?;
        let a = arr(&v, "done")?;
        let now_ms = at(a, 0, "done now")?;
        if a.len() != dones.len() + 1 {
            return Err(proto("done: one result per item", &v));
        }
        a[1..]
            .iter()
            .map(|r| {
                let f = arr(r, "done item")?;
                let work = at(f, 0, "done work")?;
                if work < 0 {
                    return Ok(None);
                }
                Ok(Some(DoneResult {
                    work_ms: work,
                    ready_at_ms: opt(at(f, 1, "done ready")?),
                    now_ms,
                    retry_delay_ms: opt(at(f, 2, "done delay")?),
                }))
            })
            .collect()
    }

    /// Promotes due delayed items and reaps expired leases (atomic; safe from any replica).
    pub async fn sweep(&self, queue: &str) -> Result<SweepResult, WqError> {
        let args = vec![
            self.config.promote_limit.to_string().into_bytes(),
            self.config.reap_limit.to_string().into_bytes(),
            self.config.poison_after.to_string().into_bytes(),
            ms(self.config.limiter.base).to_string().into_bytes(),
            ms(self.config.limiter.max).to_string().into_bytes(),
        ];
        let v = self.eval("sweep", &self.scripts.sweep, &queue_keys(queue), args).await?;
        let a = arr(&v, "sweep")?;
        Ok(SweepResult {
            promoted: count(at(a, 0, "sweep")?),
            reaped: count(at(a, 1, "sweep")?),
            next_due_ms: opt(at(a, 2, "sweep")?),
            now_ms: at(a, 3, "sweep")?,
            poisoned: count(at(a, 4, "sweep")?),
        })
    }

    /// Depths of `queue`.
    pub async fn stats(&self, queue: &str) -> Result<QueueStats, WqError> {
        // Lease records read for the unfinished-work gauge and the dirty count; in-flight items
        // are bounded by the total worker concurrency, this only caps a pathological backlog.
        const MAX_LEASES: u32 = 10_000;
        let args = vec![MAX_LEASES.to_string().into_bytes()];
        let v = self.eval("stats", &self.scripts.stats, &queue_keys(queue), args).await?;
        let a = arr(&v, "stats")?;
        let u = |i| at(a, i, "stats").map(|x| u64::try_from(x.max(0)).unwrap_or(0));
        Ok(QueueStats {
            now_ms: at(a, 0, "stats")?,
            ready: u(1)?,
            delayed: u(2)?,
            leased: u(3)?,
            dirty: u(4)?,
            oldest_ready_ms: opt(at(a, 5, "stats")?),
            failing: u(6)?,
            unfinished_ms: at(a, 7, "stats")?,
            oldest_started_ms: opt(at(a, 8, "stats")?),
        })
    }

    /// What `queue` knows about `keys`.
    pub async fn inspect(&self, queue: &str, keys: &[String]) -> Result<Vec<KeyView>, WqError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let args = keys.iter().map(|k| k.as_bytes().to_vec()).collect();
        let v = self.eval("inspect", &self.scripts.inspect, &queue_keys(queue), args).await?;
        let a = arr(&v, "inspect")?;
        let mut out = Vec::with_capacity(keys.len());
        for (key, row) in keys.iter().zip(a) {
            let f = arr(row, "inspect row")?;
            let ready = opt(at(f, 0, "inspect")?);
            let delayed = opt(at(f, 1, "inspect")?);
            let deadline = opt(at(f, 2, "inspect")?);
            let state = if deadline.is_some() {
                KeyState::Leased
            } else if ready.is_some() {
                KeyState::Ready
            } else if delayed.is_some() {
                KeyState::Delayed
            } else {
                KeyState::Absent
            };
            out.push(KeyView {
                key: key.clone(),
                state,
                ready_ms: ready,
                delayed_ms: delayed,
                lease_deadline_ms: deadline,
                dirty: at(f, 3, "inspect")? == 1,
                requeues: count(at(f, 4, "inspect")?),
                holder: string(f.get(5).ok_or_else(|| proto("inspect", row))?, "inspect")?,
                expiries: count(at(f, 6, "inspect")?),
            });
        }
        Ok(out)
    }

    /// Re-pushes the wake marker of `queue` if items are ready.
    pub async fn rewake(&self, queue: &str) -> Result<(), WqError> {
        let keys = queue_keys(queue);
        let keys = [keys[0].clone(), keys[6].clone()];
        self.eval("rewake", &self.scripts.rewake, &keys, Vec::new()).await?;
        Ok(())
    }

    // ------------------------------------------------------------ expectations

    /// Applies watcher observations to the expectations of Job `key`; returns how many changed
    /// something. Observations carrying a pod UID are applied at most once per record.
    pub async fn observe(&self, key: &str, observations: &[Observation]) -> Result<u32, WqError> {
        if observations.is_empty() {
            return Ok(0);
        }
        let mut args = vec![ms(self.config.idle_gc).to_string().into_bytes()];
        push_observations(&mut args, observations);
        let v = self.eval("observe", &self.scripts.exp_observe, &exp_keys(key), args).await?;
        Ok(count(int(&v, "observe")?))
    }

    /// Replaces the expectations of Job `key` and stamps the time (client-go `SetExpectations`).
    pub async fn set_expectations(
        &self,
        key: &str,
        job_uid: &str,
        add: i64,
        del: i64,
    ) -> Result<(), WqError> {
        let args = vec![
            job_uid.as_bytes().to_vec(),
            add.to_string().into_bytes(),
            del.to_string().into_bytes(),
            ms(self.config.idle_gc).to_string().into_bytes(),
        ];
        self.eval("set_expectations", &self.scripts.exp_set, &exp_keys(key), args).await?;
        Ok(())
    }

    /// Lowers an existing record of that UID by `add`/`del`; `false` when there was none.
    pub async fn lower_expectations(
        &self,
        key: &str,
        job_uid: &str,
        add: i64,
        del: i64,
    ) -> Result<bool, WqError> {
        let args = vec![
            job_uid.as_bytes().to_vec(),
            add.saturating_neg().to_string().into_bytes(),
            del.saturating_neg().to_string().into_bytes(),
        ];
        let v =
            self.eval("lower_expectations", &self.scripts.exp_lower, &exp_keys(key), args).await?;
        Ok(int(&v, "lower")? == 1)
    }

    /// Reads the expectations of Job `key` as seen by the Job with UID `job_uid`.
    pub async fn get_expectations(
        &self,
        key: &str,
        job_uid: &str,
    ) -> Result<Expectations, WqError> {
        let v = self
            .eval("get_expectations", &self.scripts.exp_get, &exp_keys(key), Vec::new())
            .await?;
        self.parse_expectations(&v, job_uid)
    }

    /// Reads an EXP_GET reply as seen by the Job with UID `job_uid`.
    pub(crate) fn parse_expectations(
        &self,
        v: &Value,
        job_uid: &str,
    ) -> Result<Expectations, WqError> {
        let a = arr(v, "get_expectations")?;
        let exists = at(a, 0, "exp")? == 1;
        let now = at(a, 5, "exp")?;
        let rec_uid = string(a.get(1).ok_or_else(|| proto("exp", v))?, "exp uid")?;
        let record = exists.then(|| -> Result<ExpectationRecord, WqError> {
            Ok(ExpectationRecord {
                job_uid: rec_uid.clone(),
                add: at(a, 2, "exp")?,
                del: at(a, 3, "exp")?,
                set_at_ms: at(a, 4, "exp")?,
            })
        });
        let record = record.transpose()?;
        // A record of another Job UID is no record (client-go keys by UID-checked key).
        let record = record.filter(|r| job_uid.is_empty() || r.job_uid == job_uid);
        let fin = arr(a.get(6).ok_or_else(|| proto("exp", v))?, "exp fin")?;
        let mut finalizer_removals = Vec::new();
        for pair in fin.chunks(2) {
            if let [pod, owner] = pair {
                let owner = string(owner, "fin owner")?;
                if job_uid.is_empty() || owner.is_empty() || owner == job_uid {
                    finalizer_removals.push(string(pod, "fin pod")?);
                }
            }
        }
        finalizer_removals.sort();
        let satisfied = crate::expectations::satisfied(
            record.as_ref(),
            job_uid,
            now,
            self.config.expectations_timeout,
        );
        let age_ms =
            record.as_ref().map(|r| u64::try_from(now - r.set_at_ms).unwrap_or(0)).unwrap_or(0);
        Ok(Expectations { record, satisfied, age_ms, finalizer_removals })
    }

    /// Deletes the expectations, finalizer-removal set, records and shared view of Job `key`.
    pub async fn delete_expectations(&self, key: &str) -> Result<(), WqError> {
        let mut keys: Vec<String> = exp_keys(key).into();
        keys.extend(view_keys(key));
        self.eval("delete_expectations", &self.scripts.exp_delete, &keys, Vec::new()).await?;
        Ok(())
    }

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
        let mut args =
            vec![ms(self.config.idle_gc).to_string().into_bytes(), job_uid.as_bytes().to_vec()];
        args.extend(pod_uids.iter().map(|p| p.as_bytes().to_vec()));
        self.eval("expect_finalizer_removals", &self.scripts.exp_fin_add, &exp_keys(key), args)
            .await?;
        Ok(())
    }

    /// Drops pod UIDs from Job `key`'s in-flight finalizer-removal set (their removals failed);
    /// returns how many were in it.
    pub async fn forget_finalizer_removals(
        &self,
        key: &str,
        pod_uids: &[String],
    ) -> Result<u32, WqError> {
        let observations: Vec<Observation> = pod_uids
            .iter()
            .map(|p| Observation::new(ObservationKind::FinalizerRemoval, "", p.clone()))
            .collect();
        self.observe(key, &observations).await
    }

    /// Removes record `name` of Job `key`; whether it existed.
    pub async fn delete_record(&self, key: &str, name: &str) -> Result<bool, WqError> {
        let v = self
            .eval(
                "delete_record",
                &self.scripts.rec_del,
                &exp_keys(key),
                vec![name.as_bytes().to_vec()],
            )
            .await?;
        Ok(matches!(v, Value::Int(1)))
    }

    /// Reads record `name` of Job `key` (`None` if absent or expired).
    pub async fn get_record(&self, key: &str, name: &str) -> Result<Option<Vec<u8>>, WqError> {
        let v = self
            .eval(
                "get_record",
                &self.scripts.rec_get,
                &exp_keys(key),
                vec![name.as_bytes().to_vec()],
            )
            .await?;
        match v {
            Value::Nil => Ok(None),
            other => Ok(Some(bytes(&other, "record")?)),
        }
    }

    /// Writes record `name` of Job `key`, expiring after `ttl` if given.
    pub async fn put_record(
        &self,
        key: &str,
        name: &str,
        value: &[u8],
        ttl: Option<Duration>,
    ) -> Result<(), WqError> {
        let args = vec![
            name.as_bytes().to_vec(),
            ttl.map(ms).unwrap_or(0).to_string().into_bytes(),
            ms(self.config.idle_gc).to_string().into_bytes(),
            value.to_vec(),
        ];
        self.eval("put_record", &self.scripts.rec_put, &exp_keys(key), args).await?;
        Ok(())
    }
}
