//! Pure Job reconcile logic: (Job, Pods, now, expectations) → plan, with upstream parity.
//!
//! No I/O, no async, no kube client: the worker drives this crate step by step.

pub mod backoff;
pub mod conditions;
pub mod events;
pub mod indexes;
pub mod job_util;
mod leaf;
pub mod metrics;
pub mod pod_failure_policy;
pub mod pod_util;
pub mod success_policy;
pub mod sync;
pub mod template;
#[cfg(any(test, feature = "testutil"))]
pub mod testutil;
pub mod validation;

pub use backoff::BackoffRecord;
pub use sync::{
    BackoffUpdate, CallError, Expectations, JobSync, Outcome, PodRef, Report, Skipped, Step,
    SyncError, SyncInput,
};
