//! Shared `ControllerExpectations` (and the pod-UID finalizer-removal set), as data plus the pure
//! satisfied check. The Redis side is in [`crate::Store`].

use std::time::Duration;

pub use kjob_core::EXPECTATIONS_TIMEOUT;

/// A stored expectations record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectationRecord {
    /// UID of the Job that set it.
    pub job_uid: String,
    /// Creations still expected.
    pub add: i64,
    /// Deletions still expected.
    pub del: i64,
    /// When it was set (Unix ms, Redis clock).
    pub set_at_ms: i64,
}

/// What [`crate::Store::get_expectations`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expectations {
    /// The record, if one exists for the caller's UID.
    pub record: Option<ExpectationRecord>,
    /// Whether the caller may act (see [`satisfied`]).
    pub satisfied: bool,
    /// Age of the record in ms (0 without a record).
    pub age_ms: u64,
    /// Pod UIDs whose finalizer removal is still expected.
    pub finalizer_removals: Vec<String>,
}

/// An observation from the watcher, lowering a Job's expectations (kjob's one shape of it).
pub use kjob_core::{Observation, ObservationKind};

/// client-go `SatisfiedExpectations`: no record (or a record of another Job UID), or nothing
/// left to observe, or a record older than `timeout`.
pub fn satisfied(
    record: Option<&ExpectationRecord>,
    caller_uid: &str,
    now_ms: i64,
    timeout: Duration,
) -> bool {
    let Some(r) = record else { return true };
    if !caller_uid.is_empty() && r.job_uid != caller_uid {
        return true;
    }
    if r.add <= 0 && r.del <= 0 {
        return true;
    }
    let age = now_ms.saturating_sub(r.set_at_ms);
    age > i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(add: i64, del: i64, at: i64) -> ExpectationRecord {
        ExpectationRecord { job_uid: "u1".into(), add, del, set_at_ms: at }
    }

    #[test]
    fn satisfied_table() {
        let t = EXPECTATIONS_TIMEOUT;
        let five_min = 300_000;
        let cases = [
            (None, "u1", 0, true),
            (Some(rec(1, 0, 0)), "u1", 10, false),
            (Some(rec(0, 1, 0)), "u1", 10, false),
            (Some(rec(0, 0, 0)), "u1", 10, true),
            (Some(rec(-1, 0, 0)), "u1", 10, true),
            (Some(rec(2, 2, 0)), "u1", five_min, false),
            (Some(rec(2, 2, 0)), "u1", five_min + 1, true),
            (Some(rec(2, 2, 0)), "other", 10, true),
            (Some(rec(2, 2, 0)), "", 10, false),
        ];
        for (r, uid, now, want) in cases {
            assert_eq!(satisfied(r.as_ref(), uid, now, t), want, "{r:?} {uid} {now}");
        }
    }
}
