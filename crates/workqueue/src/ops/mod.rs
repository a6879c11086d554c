//! The store's operations, one module per concern, each script directly above the method that
//! runs it (as asynq's `rdb.go` does), with a `KEYS` / `ARGV` header, its keys from
//! [`crate::keys`] and its reply read into named fields through [`crate::reply::Fields`].

mod add;
mod done;
mod expectations;
mod explain;
mod holders;
mod lease;
mod maintain;
mod oldest;
pub(crate) mod priority;
mod records;
mod shards;
mod stats;
mod weights;

pub use add::HANDOFF_VIEW_MAX_PODS;
pub(crate) use add::Taker;
pub use done::HISTORY_ERROR_MAX;
pub use expectations::FinalizerRemovals;
pub use explain::{
    Explain, HISTORY_MAX_ENTRIES, HISTORY_TTL, HistoryEntry, LAST_SYNC_GENERATION, LeaseInfo,
    NAMESPACES_MAX_SCAN, NamespaceStats, Namespaces, RoundRobin, SYNC_MAX_NAMESPACES,
    SYNC_PUBLISH_PERIOD, SYNC_RATE_STALE, SYNC_WINDOW, SyncCounter, SyncEnd,
};
pub use holders::{HOLDERS_MAX_KEYS, HOLDERS_MAX_SCAN, Holder, LeaseHolders};
pub use oldest::{OLDEST_READY_MAX_KEYS, OLDEST_READY_MAX_NAMESPACES, OldestReady, WaitingKey};
pub use priority::{PRIORITY_AGING, TOP_PRIORITY, head_start as priority_head_start};
pub use records::MAX_RECORDS_PER_JOB;
pub(crate) use shards::read_mark;
pub use weights::{MAX_WEIGHT, MAX_WEIGHTED_NAMESPACES, WEIGHTS_REFRESH};
