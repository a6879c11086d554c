//! Pod-failure (re-creation) backoff, global and per index (upstream `backoff_utils.go`).
//!
//! Upstream keeps the global record in memory, so a controller restart forgets it (issue
//! #114650). Here the record is plain serde data: the worker persists it per Job key (in Redis)
//! and hands it back on the next sync.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use crate::indexes::index_absolute_failure_count;
use crate::pod::finished_time;

/// Delay after the first consecutive failure (upstream `DefaultJobPodFailureBackOff`).
pub const DEFAULT_POD_FAILURE_BACKOFF: Duration = Duration::from_secs(10);
/// Cap on the delay (upstream `MaxJobPodFailureBackOff`).
pub const MAX_POD_FAILURE_BACKOFF: Duration = Duration::from_secs(600);

/// The backoff record as stored (the worker writes it, kjob-queue's explain reads it): the
/// record with the UID of the Job it belongs to. Records are keyed by `namespace/name`, so a Job
/// deleted and recreated under the same name finds its predecessor's record; the UID makes that
/// record read as absent (upstream drops the record when the Job is deleted, and a delete seen
/// by no one must not leak it either).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredBackoff {
    /// Empty in records written before they carried the UID: never matches a Job.
    #[serde(default)]
    pub job_uid: String,
    /// The record.
    #[serde(flatten)]
    pub record: BackoffRecord,
}

impl StoredBackoff {
    /// `record` of the Job with UID `job_uid`, serialized.
    pub fn encode(record: &BackoffRecord, job_uid: &str) -> Vec<u8> {
        let stored = StoredBackoff { job_uid: job_uid.to_string(), record: record.clone() };
        serde_json::to_vec(&stored).unwrap_or_default()
    }

    /// Reads a stored record.
    pub fn decode(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

/// Consecutive failures since the last success and when the latest of them happened
/// (upstream `backoffRecord`, minus the key, which is the caller's storage key).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackoffRecord {
    /// Pod failures observed after the most recent success.
    pub failures_after_last_success: i32,
    /// Finish time of the most recent of those failures (RFC 3339 in serialized form).
    #[serde(with = "opt_timestamp", default, skip_serializing_if = "Option::is_none")]
    pub last_failure_time: Option<Timestamp>,
}

impl BackoffRecord {
    /// The record after this sync's newly finished pods, given the finish time (upstream
    /// `getFinishedTime`) of each newly succeeded and newly failed pod (upstream
    /// `newBackoffRecord`): without new successes the new failures are added and the latest
    /// failure time taken; with new successes the count restarts from the failures that finished
    /// strictly after the latest success. Times are taken in any order.
    pub fn updated_at(&self, succeeded: &[Timestamp], failed: &[Timestamp]) -> BackoffRecord {
        if failed.is_empty() && succeeded.is_empty() {
            return self.clone();
        }
        let latest_failure = failed.iter().copied().max();
        let Some(last_success) = succeeded.iter().copied().max() else {
            return BackoffRecord {
                failures_after_last_success: self
                    .failures_after_last_success
                    .saturating_add(failed.len() as i32),
                last_failure_time: latest_failure,
            };
        };
        let after: Vec<Timestamp> = failed.iter().copied().filter(|t| *t > last_success).collect();
        BackoffRecord {
            failures_after_last_success: after.len() as i32,
            last_failure_time: after.into_iter().max(),
        }
    }

    /// Time left before pods may be created again (upstream `getRemainingTime`).
    pub fn remaining_time(&self, now: Timestamp, base: Duration, max: Duration) -> Duration {
        remaining_time_for_failures(
            self.failures_after_last_success,
            self.last_failure_time,
            now,
            base,
            max,
        )
    }
}

/// The delay for `failures` consecutive failures: `base · 2^(failures−1)` capped at `max`;
/// zero for no failures.
pub fn backoff_delay(failures: i32, base: Duration, max: Duration) -> Duration {
    if failures <= 0 {
        return Duration::ZERO;
    }
    let mut d = base;
    for _ in 1..failures {
        d = d.saturating_mul(2);
        if d >= max {
            return max;
        }
    }
    d.min(max)
}

/// `delay(failures) − (now − last_failure)`, floored at zero (upstream
/// `getRemainingTimeForFailuresCount`). A failure without a time is treated as long past.
pub fn remaining_time_for_failures(
    failures: i32,
    last_failure: Option<Timestamp>,
    now: Timestamp,
    base: Duration,
    max: Duration,
) -> Duration {
    let delay = backoff_delay(failures, base, max);
    let Some(last) = last_failure else { return Duration::ZERO };
    if delay.is_zero() {
        return Duration::ZERO;
    }
    let elapsed = now.duration_since(last);
    // Signed on purpose: a failure time ahead of `now` (clock skew) lengthens the wait, as upstream.
    let delay = jiff::SignedDuration::try_from(delay).unwrap_or(jiff::SignedDuration::MAX);
    let left = delay.saturating_sub(elapsed);
    if left.is_positive() { left.unsigned_abs() } else { Duration::ZERO }
}

/// Time left before the index of `last_failed_pod` may get a new pod: the pod's absolute failure
/// count + 1 failures, timed from its finish (upstream `getRemainingTimePerIndex`).
pub fn remaining_time_per_index(
    last_failed_pod: Option<&Pod>,
    now: Timestamp,
    base: Duration,
    max: Duration,
) -> Duration {
    let Some(pod) = last_failed_pod else { return Duration::ZERO };
    let failures = index_absolute_failure_count(pod).saturating_add(1);
    remaining_time_for_failures(failures, Some(finished_time(pod)), now, base, max)
}

/// Splits `indexes` into those whose per-index backoff is over; when none is, also returns the
/// smallest remaining time to requeue after (upstream `getPodCreationInfoForIndependentIndexes`).
pub fn indexes_ready_to_create(
    indexes: &[i32],
    delayed_deletion: &BTreeMap<i32, &Pod>,
    now: Timestamp,
) -> (Vec<i32>, Duration) {
    let mut ready = Vec::new();
    let mut min_remaining: Option<Duration> = None;
    for &ix in indexes {
        let left = remaining_time_per_index(
            delayed_deletion.get(&ix).copied(),
            now,
            DEFAULT_POD_FAILURE_BACKOFF,
            MAX_POD_FAILURE_BACKOFF,
        );
        if left.is_zero() {
            ready.push(ix);
        } else {
            min_remaining = Some(min_remaining.map_or(left, |m| m.min(left)));
        }
    }
    if ready.is_empty() {
        (ready, min_remaining.unwrap_or_default())
    } else {
        (ready, Duration::ZERO)
    }
}

/// Serde for `Option<Timestamp>` as an RFC 3339 string, so jiff's serde feature is not needed.
mod opt_timestamp {
    use jiff::Timestamp;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &Option<Timestamp>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_some(&t.to_string()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Timestamp>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|s| s.parse::<Timestamp>().map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
#[allow(clippy::type_complexity)] // Table rows are spelled out as tuples on purpose.
mod tests {
    use super::*;
    use crate::testutil::{at, mk_job, mk_pod};

    const BASE: Duration = DEFAULT_POD_FAILURE_BACKOFF;
    const MAX: Duration = MAX_POD_FAILURE_BACKOFF;

    /// Re-derived from upstream's TestNewBackoffRecord.
    #[test]
    fn new_record_table() {
        let job = mk_job("j").build();
        let ok = |n: &str, t: i64| mk_pod(&job, n).succeeded(at(t)).build();
        let bad = |n: &str, t: i64| mk_pod(&job, n).failed(1, at(t)).build();
        let rec = |n: i32, t: Option<i64>| BackoffRecord {
            failures_after_last_success: n,
            last_failure_time: t.map(at),
        };
        let cases: Vec<(&str, BackoffRecord, Vec<Pod>, Vec<Pod>, BackoffRecord)> = vec![
            ("nothing new keeps the record", rec(2, Some(5)), vec![], vec![], rec(2, Some(5))),
            (
                "failures only add up",
                rec(1, Some(5)),
                vec![],
                vec![bad("a", 20), bad("b", 10)],
                rec(3, Some(20)),
            ),
            ("success only resets", rec(4, Some(5)), vec![ok("a", 20)], vec![], rec(0, None)),
            (
                "failures before the last success are dropped",
                rec(4, Some(5)),
                vec![ok("s1", 10), ok("s2", 30)],
                vec![bad("f1", 20), bad("f2", 40), bad("f3", 50)],
                rec(2, Some(50)),
            ),
            (
                "failure at the same instant as success is not after it",
                rec(0, None),
                vec![ok("s", 30)],
                vec![bad("f", 30)],
                rec(0, None),
            ),
        ];
        for (name, old, succ, failed, want) in cases {
            let s: Vec<Timestamp> = succ.iter().map(finished_time).collect();
            let f: Vec<Timestamp> = failed.iter().map(finished_time).collect();
            assert_eq!(old.updated_at(&s, &f), want, "{name}");
        }
    }

    /// Re-derived from upstream's TestGetRemainingBackoffTime.
    #[test]
    fn remaining_time_table() {
        let cases: &[(i32, Option<i64>, i64, u64)] = &[
            // (failures, last failure at, now at, want seconds)
            (0, None, 0, 0),
            (0, Some(0), 5, 0),
            (1, Some(0), 0, 10),
            (1, Some(0), 5, 5),
            (1, Some(0), 10, 0),
            (1, Some(0), 11, 0),
            (2, Some(0), 5, 15),
            (3, Some(0), 5, 35),
            (6, Some(0), 20, 300),
            (7, Some(0), 0, 600),
            (50, Some(0), 100, 500),
            (2, Some(10), 5, 25),
        ];
        for &(n, last, now, want) in cases {
            let r =
                BackoffRecord { failures_after_last_success: n, last_failure_time: last.map(at) };
            assert_eq!(
                r.remaining_time(at(now), BASE, MAX),
                Duration::from_secs(want),
                "n={n} last={last:?} now={now}"
            );
        }
    }

    /// Upstream's own table uses base 5 s and max 700 s, which exercises the cap differently.
    #[test]
    fn remaining_time_custom_base_and_cap() {
        let base = Duration::from_secs(5);
        let max = Duration::from_secs(700);
        for (n, now, want) in
            [(1, 0, 5), (1, 1, 4), (1, 5, 0), (1, 6, 0), (3, 0, 20), (8, 0, 640), (9, 0, 700)]
        {
            let r =
                BackoffRecord { failures_after_last_success: n, last_failure_time: Some(at(0)) };
            assert_eq!(
                r.remaining_time(at(now), base, max),
                Duration::from_secs(want),
                "n={n} now={now}"
            );
        }
        let job = mk_job("j").indexed().completions(Some(2)).backoff_limit_per_index(9).build();
        // Two previous failures (or one counted + one ignored) make this the third: 20 s.
        for pod in [
            mk_pod(&job, "a")
                .index(0)
                .failure_counts(2, None)
                .phase("Failed")
                .deleting(at(30))
                .build(),
            mk_pod(&job, "b")
                .index(0)
                .failure_counts(1, Some(1))
                .phase("Failed")
                .deleting(at(30))
                .build(),
        ] {
            // deleting() sets a 30 s grace period, so the pod finished at t=0.
            assert_eq!(
                remaining_time_per_index(Some(&pod), at(0), base, max),
                Duration::from_secs(20)
            );
        }
    }

    #[test]
    fn delay_sequence() {
        let got: Vec<u64> = (0..=8).map(|n| backoff_delay(n, BASE, MAX).as_secs()).collect();
        assert_eq!(got, vec![0, 10, 20, 40, 80, 160, 320, 600, 600]);
        assert_eq!(backoff_delay(i32::MAX, BASE, MAX), MAX);
    }

    #[test]
    fn per_index_remaining_and_selection() {
        let job = mk_job("j").indexed().completions(Some(4)).backoff_limit_per_index(9).build();
        // Index 0: 1 counted + 1 ignored previous failure => 3rd failure => 40 s from t=100.
        let p0 = mk_pod(&job, "p0").index(0).failure_counts(1, Some(1)).failed(1, at(100)).build();
        // Index 1: first failure => 10 s from t=100.
        let p1 = mk_pod(&job, "p1").index(1).failure_counts(0, None).failed(1, at(100)).build();
        assert_eq!(
            remaining_time_per_index(Some(&p0), at(110), BASE, MAX),
            Duration::from_secs(30)
        );
        assert_eq!(remaining_time_per_index(None, at(110), BASE, MAX), Duration::ZERO);
        let delayed = BTreeMap::from([(0, &p0), (1, &p1)]);
        assert_eq!(
            indexes_ready_to_create(&[0, 1, 2], &delayed, at(105)),
            (vec![2], Duration::ZERO)
        );
        assert_eq!(
            indexes_ready_to_create(&[0, 1], &delayed, at(105)),
            (vec![], Duration::from_secs(5))
        );
        assert_eq!(indexes_ready_to_create(&[0, 1], &delayed, at(111)), (vec![1], Duration::ZERO));
    }

    #[test]
    fn serde_round_trip() {
        let r = BackoffRecord { failures_after_last_success: 3, last_failure_time: Some(at(42)) };
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(
            json,
            r#"{"failures_after_last_success":3,"last_failure_time":"2026-01-01T00:00:42Z"}"#
        );
        assert_eq!(serde_json::from_str::<BackoffRecord>(&json).unwrap(), r);
        let empty: BackoffRecord =
            serde_json::from_str(r#"{"failures_after_last_success":0}"#).unwrap();
        assert_eq!(empty, BackoffRecord::default());
        assert!(
            serde_json::from_str::<BackoffRecord>(
                r#"{"failures_after_last_success":1,"last_failure_time":"nope"}"#
            )
            .is_err()
        );
    }
}
