//! The workqueue store: its types, its connection and the one way a script is run
//! ([`Store::eval`]). The operations are in `crate::ops`, each beside its script.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::{Script, Value};

use crate::WqError;
use crate::conn::{self, Conn, RESPONSE_TIMEOUT, RedisTarget};
use crate::expectations::{EXPECTATIONS_TIMEOUT, Observation};
use crate::limiter::{ItemExponentialLimiter, JOB_LIMITER};
use crate::lua::Arg;
use crate::lua::Lua;
use crate::reply::Reply;
use crate::view::ViewOp;

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
    /// Shards of a new data set; `None`: [`crate::keys::auto_shards`] (1 on a single Redis,
    /// [`crate::DEFAULT_SHARDS`] on a Cluster). A data set keeps the layout it was created with
    /// (recorded in Redis): the one recorded wins over this.
    pub shards: Option<u32>,
    /// The longest head start a Job's priority gives its key within its namespace, hence the
    /// bound on how long a key can be passed by keys that became ready after it (aging; see
    /// [`crate::PRIORITY_AGING`]).
    pub priority_aging: Duration,
    /// How leases pick among the namespaces with ready items.
    pub lease_order: LeaseOrder,
}

/// How leases pick among namespaces (within one, the order is always the score: ready time less
/// the priority head start, then the key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LeaseOrder {
    /// Deficit round robin over the namespaces with ready items, by their weights: one
    /// namespace's flood does not hold up another's Jobs.
    #[default]
    Fair,
    /// The oldest ready item of a shard first, whichever its namespace, as upstream's FIFO
    /// workqueue: fairness off, for comparison and diagnosis. Costs a read per namespace with
    /// work per lease.
    Fifo,
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
            shards: None,
            priority_aging: crate::PRIORITY_AGING,
            lease_order: LeaseOrder::Fair,
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
    /// The Job's pod priority, which orders its key within its namespace (with aging; see
    /// [`crate::PRIORITY_AGING`]) and is kept with the key until it leaves the queue; `None`
    /// keeps the one stored (0 when none).
    pub priority: Option<i32>,
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
            priority: None,
        }
    }

    /// The same item with the Job's pod priority `priority`.
    pub fn with_priority(mut self, priority: i32) -> Self {
        self.priority = Some(priority);
        self
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
    /// Leases of the item that expired without a Done since its last Done: more than zero
    /// when the previous lessee died or lost its lease mid-sync.
    pub expiries: u32,
    /// The Job's shared view, read in the script that leased the item when that was an Add's
    /// hand-off to a lessee that asked for views: `Some(None)` when the view is not trusted,
    /// `None` when it was not read (the lessee's server reads it itself).
    pub view: Option<Option<crate::JobView>>,
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
    /// Why the sync failed (empty: it did not, or the caller did not say): kept, truncated, in
    /// the item's history for explain.
    pub error: String,
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
    /// Ready time of the oldest ready item (with priorities: of the next item each namespace
    /// leases, which a head start of at most [`crate::PRIORITY_AGING`] may have put first).
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

/// Appends `(kind, job_uid, pod_uid)` of each observation to `args`.
pub(crate) fn push_observations(args: &mut Vec<Vec<u8>>, observations: &[Observation]) {
    for o in observations {
        args.push(crate::lua::observation_code(o.kind).arg());
        args.push(o.job_uid.arg());
        args.push(o.pod_uid.arg());
    }
}

/// The value of a stored record (`expiry|value`, expiry 0 = none) unless it expired by `now`.
pub(crate) fn live_record(stored: &[u8], now: i64) -> Option<Vec<u8>> {
    let sep = stored.iter().position(|b| *b == b'|')?;
    let expiry: i64 = std::str::from_utf8(&stored[..sep]).ok()?.parse().ok()?;
    (expiry == 0 || expiry > now).then(|| stored[sep + 1..].to_vec())
}

pub(crate) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Memory of one Redis node, from `INFO memory`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeMemory {
    /// `host:port` of the node.
    pub node: String,
    /// `used_memory`, in bytes.
    pub used: u64,
    /// `maxmemory`, in bytes (0: no limit).
    pub max: u64,
}

impl NodeMemory {
    fn parse(node: String, info: &str) -> Self {
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        Self { node, used: field("used_memory"), max: field("maxmemory") }
    }

    /// Whether the node is at its `maxmemory`, where (with `noeviction`) it refuses writes.
    pub fn is_full(&self) -> bool {
        self.max > 0 && self.used >= self.max
    }
}

/// The Redis-backed workqueue and expectations store. Cheap to clone (one shared connection).
#[derive(Clone)]
pub struct Store {
    target: RedisTarget,
    conn: Conn,
    config: StoreConfig,
    /// When Redis last refused one of this store's writes for lack of memory (shared by
    /// clones).
    last_oom: Arc<Mutex<Option<Instant>>>,
    /// Turns of the lessees' rotation over shards (shared by clones).
    turn: Arc<std::sync::atomic::AtomicU32>,
    /// The data set's layout, as recorded in Redis.
    layout: crate::Layout,
    /// The namespace weights last read, and when (shared by clones; see `ops::weights`).
    pub(crate) weights: Arc<Mutex<Option<(Instant, String)>>>,
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
        Self::connect_to(RedisTarget::parse(url)?, config).await
    }

    /// Connects to `target` (credentials and TLS included), refusing a Redis whose
    /// `maxmemory-policy` is not `noeviction`.
    pub async fn connect_to(target: RedisTarget, config: StoreConfig) -> Result<Self, WqError> {
        conn::check_noeviction(&target).await?;
        let conn = conn::connect(&target, RESPONSE_TIMEOUT).await?;
        let wanted = match config.shards {
            Some(n) => crate::Layout::new(n)?,
            None => crate::keys::auto_layout(target.is_cluster()),
        };
        let layout = crate::keys::recorded_layout(&conn, wanted).await?;
        if layout != wanted {
            tracing::info!(
                recorded = layout.shards(),
                asked = wanted.shards(),
                "the Redis data set keeps the shard count it was created with"
            );
        }
        let turn = Arc::default();
        let weights = Arc::default();
        let store = Self { target, conn, config, last_oom: Arc::default(), turn, layout, weights };
        // Before anything is served: the data set may still hold the unsharded layout's items.
        store.migrate_unsharded().await?;
        Ok(store)
    }

    /// Where this store connects.
    pub fn target(&self) -> &RedisTarget {
        &self.target
    }

    /// A handle on the store's connection.
    pub(crate) fn connection(&self) -> Conn {
        self.conn.clone()
    }

    /// The tunables.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// How keys are sharded.
    pub fn layout(&self) -> &crate::Layout {
        &self.layout
    }

    /// The expectation keys of Job `key`, under its shard's tag.
    pub(crate) fn exp_keys(&self, key: &str) -> crate::keys::ExpKeys {
        crate::keys::ExpKeys::new(&self.layout().job_tag(key), key)
    }

    /// The shard a lease starts its rotation at (any number; taken modulo the shards).
    pub(crate) fn next_start(&self) -> u32 {
        self.turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn idle_gc_ms(&self) -> i64 {
        ms(self.config.idle_gc)
    }

    /// Runs `lua` with `keys` and `args` (within [`RESPONSE_TIMEOUT`]) and reads its reply as
    /// `R`; every error names the script.
    pub(crate) async fn run<R: Reply>(
        &self,
        lua: &Lua,
        keys: &[String],
        args: Vec<Vec<u8>>,
    ) -> Result<R, WqError> {
        let v = self.eval(lua.name(), lua.script(), keys, args).await?;
        R::read(lua.name(), &v)
    }

    /// Runs `lua` and then `reads` (plain commands on the script's slot) in one MULTI/EXEC, so
    /// nothing runs between them; returns the script's reply and each read's. Large replies
    /// belong in `reads`: a value that passes through a script is copied into Lua and hashed
    /// there byte by byte (a 5 MB hash costs a script 40–75 ms against 4–8 ms for the command
    /// alone, and Redis runs nothing else meanwhile). A script Redis no longer has is loaded
    /// and the whole transaction sent again.
    pub(crate) async fn run_then_read(
        &self,
        lua: &Lua,
        keys: &[String],
        args: &[Vec<u8>],
        reads: &[redis::Cmd],
    ) -> Result<(Value, Vec<Value>), WqError> {
        let script = lua.script();
        let mut pipe = redis::pipe();
        pipe.atomic();
        pipe.cmd("EVALSHA").arg(script.get_hash()).arg(keys.len()).arg(keys).arg(args);
        for r in reads {
            pipe.add_command(r.clone());
        }
        let what = lua.name();
        let mut conn = self.conn.clone();
        let mut loaded = false;
        loop {
            let res =
                tokio::time::timeout(RESPONSE_TIMEOUT, pipe.query_async::<Vec<Value>>(&mut conn))
                    .await;
            let e = match res {
                Ok(Ok(mut v)) => {
                    if v.len() != reads.len() + 1 {
                        return Err(WqError::Protocol(format!(
                            "{what}: {} replies in the transaction, {} expected",
                            v.len(),
                            reads.len() + 1
                        )));
                    }
                    let script_reply = v.remove(0);
                    return Ok((script_reply, v));
                }
                Ok(Err(e)) => e,
                Err(_) => return Err(self.no_reply(what)),
            };
            if e.kind() == redis::ErrorKind::NoScriptError && !loaded {
                loaded = true;
                let load = tokio::time::timeout(RESPONSE_TIMEOUT, script.load_async(&mut conn));
                match load.await {
                    Ok(Ok(_)) => continue,
                    Ok(Err(e)) => return Err(self.named(what, e)),
                    Err(_) => return Err(self.no_reply(what)),
                }
            }
            return Err(self.named(what, e));
        }
    }

    /// A background check of Redis is slow to answer (see [`Conn::nudge`]).
    pub(crate) fn nudge(&self) {
        self.conn.nudge();
    }

    /// Script `what` got no reply within [`RESPONSE_TIMEOUT`]: the connection may be stuck on
    /// a node that is gone (see [`Conn::stalled`]).
    fn no_reply(&self, what: &'static str) -> WqError {
        self.conn.stalled();
        WqError::Unavailable(format!("{what}: no reply in {RESPONSE_TIMEOUT:?}"))
    }

    /// A Redis error of script `what` as this crate reports it.
    fn named(&self, what: &'static str, e: redis::RedisError) -> WqError {
        if crate::is_out_of_memory(&e) {
            *self.last_oom.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        }
        let e = WqError::from(e);
        if e.is_unavailable() { WqError::Unavailable(format!("{what}: {e}")) } else { e }
    }

    async fn eval(
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
            Ok(Err(e)) => Err(self.named(what, e)),
            Err(_) => Err(self.no_reply(what)),
        }
    }

    /// `used_memory` and `maxmemory` of every node (`INFO memory`; a Cluster answers for each
    /// of its nodes), for readiness and the memory gauges.
    pub async fn memory(&self) -> Result<Vec<NodeMemory>, WqError> {
        let mut conn = self.conn.clone();
        let reply = tokio::time::timeout(
            RESPONSE_TIMEOUT,
            redis::cmd("INFO").arg("memory").query_async::<Value>(&mut conn),
        )
        .await
        .map_err(|_| WqError::Unavailable("INFO memory: no reply".into()))?
        .map_err(|e| WqError::Unavailable(format!("INFO memory: {e}")))?;
        let text = |v: &Value| -> Result<String, WqError> {
            redis::from_redis_value::<String>(v)
                .map_err(|e| WqError::Protocol(format!("INFO memory: {e}")))
        };
        match &reply {
            Value::Map(nodes) => nodes
                .iter()
                .map(|(node, info)| Ok(NodeMemory::parse(text(node)?, &text(info)?)))
                .collect(),
            single => {
                let node = self.target.node_addrs().swap_remove(0);
                Ok(vec![NodeMemory::parse(node, &text(single)?)])
            }
        }
    }

    /// Whether Redis refused one of this store's writes as out of memory within `window`. A
    /// refusal can come while `used_memory` reads below `maxmemory` (the refused request's own
    /// bytes pushed it over), so readiness remembers refusals as well as reading the gauges.
    pub fn refused_for_memory_within(&self, window: Duration) -> bool {
        let last = *self.last_oom.lock().unwrap_or_else(|p| p.into_inner());
        last.is_some_and(|t| t.elapsed() < window)
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
}

#[cfg(test)]
mod tests {
    use super::NodeMemory;

    #[test]
    fn reads_used_and_max_memory_from_info() {
        let info = "# Memory\r\nused_memory:4200000\r\nused_memory_human:4.01M\r\nmaxmemory:4194304\r\nmaxmemory_policy:noeviction\r\n";
        let m = NodeMemory::parse("a:1".into(), info);
        assert_eq!((m.used, m.max), (4_200_000, 4_194_304));
        assert!(m.is_full());
        assert!(!NodeMemory { max: 0, ..m }.is_full(), "no limit is never full");
    }
}
