//! Pure Job reconcile logic: (Job, Pods, now, expectations) → plan, with upstream parity.
//!
//! No I/O, no async, no kube client: the worker drives this crate step by step. Start at
//! [`JobSync`] (module [`sync`]): one upstream `syncJob` pass as a sequence of [`Step`]s (set or
//! lower expectations, create a slow-start batch, delete pods, remove finalizers, write the
//! status) whose results the worker feeds back with [`JobSync::report`], ending in an
//! [`Outcome`] (events, metric deltas, requeue delay, backoff record to persist).
//! [`validation`] holds the API server's status-update rules, [`conditions`] and [`events`] the
//! exact upstream reasons and messages. [`job`], [`pod`] and [`selector`] are the helpers the
//! rest builds on (they import nothing from the index or policy modules), [`ownership`] the
//! `ClaimPods` decision; the other modules are the index and policy helpers the engine is built
//! from.

#![warn(missing_docs)]

pub mod backoff;
pub mod conditions;
pub mod events;
pub mod indexes;
pub mod job;
pub mod metrics;
pub mod ownership;
pub mod pod;
pub mod pod_failure_policy;
pub mod removal;
pub mod selector;
pub mod success_policy;
pub mod summary;
pub mod sync;
pub mod template;
#[cfg(any(test, feature = "testutil"))]
pub mod testutil;
pub mod validation;
pub mod view_pod;

pub use backoff::BackoffRecord;
pub use ownership::{Claim, ClaimFacts, Owner, claim};
pub use summary::{PodIter, PodSlice, PodSummary, SummarizedPods};
pub use sync::{
    BackoffUpdate, CallError, Expectations, JobSync, Outcome, PodRef, Report, Skipped, Step,
    SyncError, SyncInput,
};
