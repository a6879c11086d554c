//! Pure Job reconcile logic: (Job, Pods, now, expectations) → plan, with upstream parity.
//!
//! No I/O, no async, no kube client: the worker drives this crate step by step.

pub mod backoff;
pub mod indexes;
pub mod pod_failure_policy;
pub mod pod_util;
pub mod success_policy;
pub mod template;
#[cfg(any(test, feature = "testutil"))]
pub mod testutil;
