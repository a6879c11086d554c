//! kjob's Redis data model: the distributed workqueue, and beside it the state kept per Job —
//! expectations, records (backoff), the shared Job view ([`view`]) and the event correlator
//! ([`events`]). They live in one crate because one script often touches several of them (an
//! Add applies a pod event's view write, its observations and the enqueue at once).
//!
//! The semantics are client-go's rate-limiting delaying workqueue, made distributed: every
//! operation is one Lua script, so it is atomic across any number of kjob-queue replicas, and the
//! clock is Redis `TIME`. A queue is split into shards (`keys`): every key of a shard, and every
//! per-Job key of a Job in it, carries the shard's hash tag, so every script touches one Cluster
//! slot (an Add applies a Job's observations in its enqueue's script) while different Jobs
//! spread over the slots; a small advisory index per queue says which shards have work.
//!
//! * [`Store`]: the operations (add, lease, renew, done, sweep, stats, inspect, expectations,
//!   records) over a single server or a Cluster (see [`conn`] for the URL forms). Each lives in
//!   a module of `ops` directly below its Lua script, with typed keys (`keys`) and its reply
//!   read into named fields (`reply`); Lua used by several scripts is in `lua`.
//! * [`limiter`] and [`expectations`]: the pure formulas (rate limiter, satisfied check).
//! * [`wake`]: prompt wake-ups of waiting lessees across replicas.

pub mod acl;
pub mod budget;
pub mod conn;
pub mod epoch;
pub mod events;
pub mod expectations;
mod keys;
pub mod limiter;
mod lua;
mod migrate;
mod ops;
mod reply;
pub mod store;
pub mod view;
pub mod wake;

pub use conn::{Conn, RedisOptions, RedisTarget, RedisTls, redact};
pub use epoch::Fence;
pub use expectations::{ExpectationRecord, Expectations, Observation, ObservationKind, satisfied};
pub use keys::{DEFAULT_SHARDS, Layout, auto_layout, slot_of};
pub use limiter::{ItemExponentialLimiter, JOB_LIMITER};
pub use migrate::Migrated;
pub use ops::{
    Explain, FinalizerRemovals, HANDOFF_VIEW_MAX_PODS, HISTORY_ERROR_MAX, HISTORY_MAX_ENTRIES,
    HISTORY_TTL, HOLDERS_MAX_KEYS, HOLDERS_MAX_SCAN, HistoryEntry, Holder, LAST_SYNC_GENERATION,
    LeaseHolders, LeaseInfo, MAX_RECORDS_PER_JOB, MAX_WEIGHT, MAX_WEIGHTED_NAMESPACES,
    NAMESPACES_MAX_SCAN, NamespaceStats, Namespaces, OLDEST_READY_MAX_KEYS,
    OLDEST_READY_MAX_NAMESPACES, OldestReady, PRIORITY_AGING, RoundRobin, SYNC_MAX_NAMESPACES,
    SYNC_PUBLISH_PERIOD, SYNC_RATE_STALE, SYNC_WINDOW, SyncCounter, SyncEnd, TOP_PRIORITY,
    WEIGHTS_REFRESH, WaitingKey, priority_head_start,
};
pub use store::{
    AddOutcome, DEFAULT_POISON_AFTER, Done, DoneResult, Enqueue, KeyState, KeyView, LeaseBatch,
    LeaseOrder, LeaseOutcome, Leased, MAX_DONE_BATCH, NodeMemory, QueueStats, Store, StoreConfig,
    SweepResult,
};
pub use view::{
    DELTA_MAX_PODS, JobView, NamedPods, SessionPhase, ViewChanges, ViewCursor, ViewDelta, ViewOp,
    ViewPage, ViewPods,
};
pub use wake::{LeaseAsk, Waker};

/// Errors of the workqueue.
#[derive(Debug, thiserror::Error)]
pub enum WqError {
    /// Redis did not answer in time or the connection is down.
    #[error("redis unavailable: {0}")]
    Unavailable(String),
    /// Redis answered with an error, or the connection failed.
    #[error("redis error: {0}")]
    Redis(#[from] redis::RedisError),
    /// The configuration (URL, Redis settings) is unusable.
    #[error("configuration: {0}")]
    Config(String),
    /// A script returned something this version does not understand.
    #[error("unexpected reply from redis: {0}")]
    Protocol(String),
}

impl WqError {
    /// Whether the error means "Redis cannot serve this right now" (retry later) rather than a
    /// definite failure: unreachable, or out of memory (it refuses writes until memory frees).
    pub fn is_unavailable(&self) -> bool {
        match self {
            WqError::Unavailable(_) => true,
            WqError::Redis(e) => {
                is_out_of_memory(e)
                    || e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.is_timeout()
                    || e.is_cluster_error()
                    || matches!(
                        e.kind(),
                        redis::ErrorKind::BusyLoadingError
                            | redis::ErrorKind::TryAgain
                            | redis::ErrorKind::ClusterDown
                            | redis::ErrorKind::MasterDown
                    )
            }
            _ => false,
        }
    }
}

/// Whether Redis refused a command (or a script's first write, or a transaction holding one)
/// because it is over `maxmemory`: `OOM command not allowed when used memory > 'maxmemory'`.
pub(crate) fn is_out_of_memory(e: &redis::RedisError) -> bool {
    e.code() == Some("OOM") || e.to_string().contains("OOM command not allowed")
}
