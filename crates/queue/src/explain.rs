//! The explain API on kjob-queue's admin port (read-only): why a Job is where it is, and what
//! each namespace is waiting on.
//!
//! * `GET /api/v1/jobs/{namespace}/{name}`: the Job key's state, the reason in words and as a
//!   code, its backoffs, expectations, lease, last sync and recent history ([`explain_json`]);
//!   404 with a JSON error when the queue knows nothing of it, 400 for a malformed name.
//! * `GET /api/v1/namespaces`: per namespace ready, delayed, leased, the oldest ready key's age
//!   and syncs per second.
//!
//! The story is decided by [`reason`], a pure function of what one script read, so every state
//! is table-tested without Redis.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use kjob_reconcile::BackoffRecord;
use kjob_reconcile::backoff::{
    DEFAULT_POD_FAILURE_BACKOFF, MAX_POD_FAILURE_BACKOFF, StoredBackoff,
};
use kjob_workqueue::{
    Explain, HistoryEntry, KeyState, Namespaces, Store, SyncEnd, WqError, satisfied,
};
use serde_json::{Value, json};

use crate::validate;

/// The worker's record name of a Job's pod-failure backoff (`kjob-worker`'s `BACKOFF_RECORD`).
pub const BACKOFF_RECORD: &str = "backoff";

/// What the routes read from, set once kjob-queue has connected to Redis (the admin port
/// answers before that: probes must).
#[derive(Clone, Default)]
pub struct ExplainApi {
    store: Arc<OnceLock<Store>>,
}

impl ExplainApi {
    /// Starts serving from `store` (before this the routes answer 503).
    pub fn serve_from(&self, store: Store) {
        let _ = self.store.set(store);
    }

    /// The API's routes, for the admin port.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/api/v1/jobs/{namespace}/{name}", get(job))
            .route("/api/v1/namespaces", get(namespaces))
            .with_state(self.clone())
    }

    fn store(&self) -> Option<&Store> {
        self.store.get()
    }
}

/// The answer before kjob-queue has connected to Redis.
fn not_connected() -> Response {
    error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "not connected to Redis yet")
}

/// A JSON error `{"error": {"code", "message"}}`.
pub(crate) fn error(status: StatusCode, code: &str, message: impl std::fmt::Display) -> Response {
    let body = json!({ "error": { "code": code, "message": message.to_string() } });
    (status, axum::Json(body)).into_response()
}

pub(crate) fn redis_error(e: &WqError) -> Response {
    if e.is_unavailable() {
        error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", e)
    } else {
        error(StatusCode::INTERNAL_SERVER_ERROR, "internal", e)
    }
}

async fn job(
    State(api): State<ExplainApi>,
    Path((namespace, name)): Path<(String, String)>,
) -> Response {
    let key = format!("{namespace}/{name}");
    if let Err(e) = validate::key(&key) {
        return error(StatusCode::BAD_REQUEST, "invalid_argument", e);
    }
    let Some(store) = api.store() else { return not_connected() };
    match store.explain(kjob_core::JOB_QUEUE, &key).await {
        Ok(Some(x)) => axum::Json(explain_json(&x)).into_response(),
        Ok(None) => error(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("kjob-queue knows nothing of Job {key}: never queued, or long forgotten"),
        ),
        Err(e) => redis_error(&e),
    }
}

async fn namespaces(State(api): State<ExplainApi>) -> Response {
    let Some(store) = api.store() else { return not_connected() };
    match store.namespaces(kjob_core::JOB_QUEUE).await {
        Ok(n) => axum::Json(namespaces_json(&n)).into_response(),
        Err(e) => redis_error(&e),
    }
}

/// Seconds between two Unix-ms times, to the millisecond.
fn secs(ms: i64) -> f64 {
    ms as f64 / 1000.0
}

/// The namespaces answer.
pub fn namespaces_json(n: &Namespaces) -> Value {
    let rows: Vec<Value> = n
        .namespaces
        .iter()
        .map(|s| {
            json!({
                "namespace": s.namespace,
                "ready": s.ready,
                "delayed": s.delayed,
                "leased": s.leased,
                "oldest_ready_age_seconds": s.oldest_ready_ms.map(|t| secs(n.now_ms - t)),
                "syncs_per_second": (s.syncs_per_second * 1000.0).round() / 1000.0,
            })
        })
        .collect();
    json!({ "queue": kjob_core::JOB_QUEUE, "now_unix_ms": n.now_ms, "truncated": n.truncated,
        "replicas_counted": n.replicas, "namespaces": rows })
}

/// A Job's pod-failure backoff as explain shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct PodBackoff {
    /// Pod failures since the last success.
    pub failures: i32,
    /// Finish time of the latest (Unix ms).
    pub last_failure_ms: Option<i64>,
    /// Time left before pods may be created again.
    pub remaining: Duration,
}

/// The Job's pod-failure backoff from its record, if it has one with failures. A record of
/// another Job UID than the expectations' (a Job recreated under the same name) is ignored.
pub fn pod_backoff(x: &Explain) -> Option<PodBackoff> {
    let (_, bytes) = x.records.iter().find(|(n, _)| n == BACKOFF_RECORD)?;
    let stored = StoredBackoff::decode(bytes).ok()?;
    if let Some(e) = &x.expectations
        && !e.job_uid.is_empty()
        && stored.job_uid != e.job_uid
    {
        return None;
    }
    let BackoffRecord { failures_after_last_success, last_failure_time } = stored.record.clone();
    if failures_after_last_success <= 0 {
        return None;
    }
    let now = jiff::Timestamp::from_millisecond(x.now_ms).ok()?;
    let remaining =
        stored.record.remaining_time(now, DEFAULT_POD_FAILURE_BACKOFF, MAX_POD_FAILURE_BACKOFF);
    Some(PodBackoff {
        failures: failures_after_last_success,
        last_failure_ms: last_failure_time.map(|t| t.as_millisecond()),
        remaining,
    })
}

/// Why the key is where it is: a stable code and a sentence.
pub fn reason(x: &Explain, pod: Option<&PodBackoff>) -> (&'static str, String) {
    let now = x.now_ms;
    let ago = |t: i64| format!("{:.1}s", secs(now - t));
    match x.state {
        KeyState::Leased => {
            let Some(l) = x.lease.as_ref() else {
                return ("leased", "leased".to_string());
            };
            let mut m = format!(
                "leased to worker {} for {} (lease ends in {:.1}s)",
                l.worker,
                ago(l.started_ms),
                secs(l.deadline_ms - now)
            );
            if l.dirty_ms.is_some() {
                m.push_str("; added again meanwhile, so it comes back when this sync ends");
            }
            ("leased", m)
        }
        KeyState::Ready => {
            let pos = x.ready_position.map_or(0, |p| p + 1);
            let since = x.ready_ms.map_or_else(String::new, |t| format!(" for {}", ago(t)));
            let ns = x.key.split_once('/').map_or("", |(ns, _)| ns);
            let turn = match x.round_robin.position {
                Some(0) => "its namespace is served next".to_string(),
                Some(p) => format!(
                    "{p} namespace(s) of {} with ready work are served before it",
                    x.round_robin.namespaces
                ),
                None => "its namespace has no turn yet".to_string(),
            };
            (
                "ready",
                format!(
                    "ready{since}: position {pos} of {} ready in namespace {ns}, waiting for a                      worker ({turn} in its shard's round robin)",
                    x.namespace_ready
                ),
            )
        }
        KeyState::Delayed => delayed_reason(x, pod),
        KeyState::Absent => {
            if let Some(e) = &x.expectations
                && !satisfied(Some(e), "", now, kjob_core::EXPECTATIONS_TIMEOUT)
            {
                return (
                    "waiting_on_expectations",
                    format!(
                        "waiting on expectations: {} creates / {} deletes not yet observed, since {} \
                         (the watcher's observations enqueue it; after {}s they count as met)",
                        e.add.max(0),
                        e.del.max(0),
                        ago(e.set_at_ms),
                        kjob_core::EXPECTATIONS_TIMEOUT.as_secs()
                    ),
                );
            }
            match last_sync(x) {
                Some(HistoryEntry::Synced { at_ms, worker, end, .. }) => (
                    "finished",
                    format!(
                        "finished and forgotten: its last sync ({}, worker {worker}) ended {} ago, \
                         and nothing has queued it since",
                        end.as_str(),
                        ago(*at_ms)
                    ),
                ),
                _ => ("absent", "not in the queue, and no sync of it is on record".to_string()),
            }
        }
    }
}

/// The key's last Done: the one on record for it, else the newest of its history.
fn last_sync(x: &Explain) -> Option<&HistoryEntry> {
    x.last_sync
        .as_ref()
        .or_else(|| x.history.iter().rev().find(|h| matches!(h, HistoryEntry::Synced { .. })))
}

/// Why a delayed key waits: the history entry that set its due time (the delayed set keeps the
/// earliest), read with the backoffs that explain it.
fn delayed_reason(x: &Explain, pod: Option<&PodBackoff>) -> (&'static str, String) {
    let due = x.due_ms.unwrap_or(x.now_ms);
    let due_in = format!("{:.1}s", secs(due - x.now_ms));
    let setter = x.history.iter().rev().find(|h| match h {
        HistoryEntry::Enqueued { at_ms, delay_ms, .. } => *delay_ms > 0 && at_ms + delay_ms == due,
        HistoryEntry::Synced { at_ms, delay_ms: Some(d), .. } => at_ms + d == due,
        HistoryEntry::Synced { .. } | HistoryEntry::Expired { .. } => false,
    });
    // A lease that expired too often in a row is requeued through the rate limiter.
    let poisoned = match x.history.last() {
        Some(HistoryEntry::Expired { poisoned: true, expiries, .. }) => Some(*expiries),
        _ => None,
    };
    let request_backoff = || {
        let last_error = match last_sync(x) {
            Some(HistoryEntry::Synced { error, .. }) if !error.is_empty() => {
                format!("; last error: {error}")
            }
            _ => String::new(),
        };
        (
            "request_backoff",
            format!(
                "request backoff after an error: {} failures in a row, retry in {due_in} (the next \
                 error waits {}s){last_error}",
                x.requeues,
                x.next_delay.as_secs_f64()
            ),
        )
    };
    if let Some(HistoryEntry::Synced { end: SyncEnd::Error, .. }) = setter {
        return request_backoff();
    }
    if let Some(expiries) = poisoned
        && setter.is_none()
    {
        return (
            "lease_expiry_backoff",
            format!(
                "its leases expired {expiries} times in a row without a Done (a worker crashed or hung on                  it), so it waits in backoff: retry in {due_in}"
            ),
        );
    }
    if let Some(p) = pod
        && !p.remaining.is_zero()
    {
        return (
            "pod_failure_backoff",
            format!(
                "pod-failure backoff: {} pod failures since the last success; pods may be created \
                 again in {:.1}s, the Job syncs again in {due_in}",
                p.failures,
                p.remaining.as_secs_f64()
            ),
        );
    }
    match setter {
        Some(HistoryEntry::Enqueued { delay_ms, observations, .. })
            // An Add with observations delayed by at most upstream's batch period is the watcher
            // batching pod events, not a backoff.
            if *observations > 0 && *delay_ms <= ms(kjob_core::SYNC_JOB_BATCH_PERIOD) =>
        {
            ("pod_event_batch", format!("batch delay of pod events: syncs in {due_in}"))
        }
        Some(HistoryEntry::Synced { end: SyncEnd::RequeueAfter, .. }) => (
            "requeue_after",
            format!("its last sync asked for another in {due_in} (e.g. activeDeadlineSeconds)"),
        ),
        Some(HistoryEntry::Enqueued { delay_ms, .. }) => (
            "delayed_add",
            format!(
                "added with a delay of {:.1}s (e.g. the time left to activeDeadlineSeconds): \
                 due in {due_in}",
                secs(*delay_ms)
            ),
        ),
        _ if x.requeues > 0 => request_backoff(),
        // The history keeps no batch delay (the happy path writes none): a short delay with
        // nothing on record is the watcher batching pod events.
        None if due - x.now_ms <= ms(kjob_core::SYNC_JOB_BATCH_PERIOD) => {
            ("pod_event_batch", format!("batch delay of pod events: syncs in {due_in}"))
        }
        _ => ("delayed", format!("delayed: due in {due_in}")),
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn history_json(h: &HistoryEntry) -> Value {
    match h {
        HistoryEntry::Enqueued { at_ms, delay_ms, observations } => json!({
            "event": "enqueued", "at_unix_ms": at_ms, "delay_seconds": secs(*delay_ms),
            "observations": observations,
        }),
        HistoryEntry::Synced { at_ms, leased_ms, worker, end, delay_ms, error } => json!({
            "event": "synced", "at_unix_ms": at_ms, "leased_at_unix_ms": leased_ms,
            "worker": worker, "outcome": end.as_str(),
            "requeue_delay_seconds": delay_ms.map(secs),
            "error": (!error.is_empty()).then_some(error),
        }),
        HistoryEntry::Expired { at_ms, leased_ms, expiries, poisoned, worker } => json!({
            "event": "lease_expired", "at_unix_ms": at_ms,
            "leased_at_unix_ms": (*leased_ms >= 0).then_some(leased_ms),
            "worker": worker, "expiries_in_a_row": expiries, "poisoned": poisoned,
        }),
    }
}

/// The explain answer for one Job.
pub fn explain_json(x: &Explain) -> Value {
    let pod = pod_backoff(x);
    let (code, message) = reason(x, pod.as_ref());
    let now = x.now_ms;
    let timeout = kjob_core::EXPECTATIONS_TIMEOUT;
    let last = last_sync(x).map(|h| match h {
        HistoryEntry::Synced { at_ms, leased_ms, worker, end, error, .. } => json!({
            "at_unix_ms": at_ms,
            "ago_seconds": secs(now - at_ms),
            "took_seconds": secs(at_ms - leased_ms),
            "outcome": end.as_str(),
            "error": (!error.is_empty()).then_some(error),
            "worker": worker,
        }),
        HistoryEntry::Enqueued { .. } | HistoryEntry::Expired { .. } => Value::Null,
    });
    let namespace = x.key.split_once('/').map_or("", |(ns, _)| ns);
    json!({
        "key": x.key,
        "queue": kjob_core::JOB_QUEUE,
        "now_unix_ms": now,
        "state": x.state.as_str(),
        "reason_code": code,
        "reason": message,
        "priority": x.priority,
        "priority_head_start_seconds": x.head_start.as_secs_f64(),
        "due_in_seconds": x.due_ms.map(|d| secs(d - now)),
        "due_unix_ms": x.due_ms,
        "ready": x.ready_ms.map(|t| json!({
            "since_unix_ms": t,
            "age_seconds": secs(now - t),
            "position": x.ready_position,
            "namespace_ready": x.namespace_ready,
        })),
        "namespace": {
            "name": namespace,
            "ready": x.namespace_ready,
            "round_robin": {
                "position": x.round_robin.position,
                "namespaces": x.round_robin.namespaces,
                "deficit": x.round_robin.deficit,
            },
        },
        "requeues": x.requeues,
        "backoff": {
            "failures": x.requeues,
            "next_delay_seconds": x.next_delay.as_secs_f64(),
            "pod_failures": pod.as_ref().map(|p| p.failures),
            "last_pod_failure_unix_ms": pod.as_ref().and_then(|p| p.last_failure_ms),
            "pod_backoff_remaining_seconds": pod.as_ref().map(|p| p.remaining.as_secs_f64()),
        },
        "expectations": x.expectations.as_ref().map(|e| json!({
            "add": e.add,
            "del": e.del,
            "age_seconds": secs(now - e.set_at_ms),
            "satisfied": satisfied(Some(e), "", now, timeout),
        })),
        "lease": x.lease.as_ref().map(|l| json!({
            "holder": l.worker,
            "lease_id": l.lease_id,
            "age_seconds": secs(now - l.started_ms),
            "ends_in_seconds": secs(l.deadline_ms - now),
            "dirty": l.dirty_ms.is_some(),
        })),
        "lease_expiries": x.expiries,
        "last_sync": last,
        "history": x.history.iter().map(history_json).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kjob_workqueue::{ExpectationRecord, LeaseInfo};

    const NOW: i64 = 1_000_000;

    fn x(state: KeyState) -> Explain {
        Explain {
            key: "ns/a".into(),
            now_ms: NOW,
            state,
            ready_ms: None,
            priority: 0,
            head_start: Duration::ZERO,
            ready_position: None,
            namespace_ready: 0,
            round_robin: kjob_workqueue::RoundRobin { namespaces: 0, position: None, deficit: 0 },
            due_ms: None,
            lease: None,
            requeues: 0,
            next_delay: Duration::from_secs(1),
            expiries: 0,
            expectations: None,
            records: Vec::new(),
            history: Vec::new(),
            last_sync: None,
        }
    }

    fn synced(at_ms: i64, end: SyncEnd, delay_ms: Option<i64>, error: &str) -> HistoryEntry {
        HistoryEntry::Synced {
            at_ms,
            leased_ms: at_ms - 10,
            worker: "w1".into(),
            end,
            delay_ms,
            error: error.into(),
        }
    }

    fn enqueued(at_ms: i64, delay_ms: i64, observations: u32) -> HistoryEntry {
        HistoryEntry::Enqueued { at_ms, delay_ms, observations }
    }

    fn delayed(due_ms: i64, history: Vec<HistoryEntry>) -> Explain {
        Explain { due_ms: Some(due_ms), history, ..x(KeyState::Delayed) }
    }

    fn pod(remaining_s: u64) -> PodBackoff {
        PodBackoff {
            failures: 2,
            last_failure_ms: Some(NOW),
            remaining: Duration::from_secs(remaining_s),
        }
    }

    #[test]
    fn every_state_has_its_reason() {
        let leased = Explain {
            lease: Some(LeaseInfo {
                worker: "w9".into(),
                lease_id: "1-1".into(),
                started_ms: NOW - 2000,
                deadline_ms: NOW + 28_000,
                dirty_ms: Some(NOW - 1000),
            }),
            ..x(KeyState::Leased)
        };
        let ready = Explain {
            ready_ms: Some(NOW - 500),
            ready_position: Some(3),
            namespace_ready: 10,
            round_robin: kjob_workqueue::RoundRobin {
                namespaces: 3,
                position: Some(1),
                deficit: 0,
            },
            ..x(KeyState::Ready)
        };
        let expecting = Explain {
            expectations: Some(ExpectationRecord {
                job_uid: "u".into(),
                add: 2,
                del: 1,
                set_at_ms: NOW - 3000,
            }),
            history: vec![synced(NOW - 3000, SyncEnd::Forget, None, "")],
            ..x(KeyState::Absent)
        };
        let stale_expectations = Explain {
            expectations: Some(ExpectationRecord {
                set_at_ms: NOW - 10 * 60 * 1000,
                ..expecting.expectations.clone().unwrap()
            }),
            ..expecting.clone()
        };
        let errored = Explain {
            requeues: 3,
            next_delay: Duration::from_secs(8),
            ..delayed(NOW + 4000, vec![synced(NOW, SyncEnd::Error, Some(4000), "quota")])
        };
        let cases: Vec<(&str, Explain, Option<PodBackoff>, &str, &str)> = vec![
            ("leased", leased, None, "leased", "leased to worker w9 for 2.0s"),
            ("ready", ready, None, "ready", "position 4 of 10 ready in namespace ns"),
            ("expectations", expecting, None, "waiting_on_expectations", "2 creates / 1 deletes"),
            ("expectations timed out", stale_expectations, None, "finished", "worker w1"),
            ("never synced", x(KeyState::Absent), None, "absent", "not in the queue"),
            ("error", errored.clone(), None, "request_backoff", "last error: quota"),
            // An error's backoff is the error's even with pods in backoff too.
            ("error and pods", errored, Some(pod(20)), "request_backoff", "3 failures"),
            (
                "pods",
                delayed(NOW + 20_000, vec![synced(NOW, SyncEnd::RequeueAfter, Some(20_000), "")]),
                Some(pod(20)),
                "pod_failure_backoff",
                "2 pod failures",
            ),
            (
                "batch",
                delayed(NOW + 1000, vec![enqueued(NOW, 1000, 1)]),
                None,
                "pod_event_batch",
                "syncs in 1.0s",
            ),
            (
                "deadline",
                delayed(NOW + 30_000, vec![enqueued(NOW, 30_000, 0)]),
                None,
                "delayed_add",
                "delay of 30.0s",
            ),
            (
                "requeue after",
                delayed(NOW + 5000, vec![synced(NOW, SyncEnd::RequeueAfter, Some(5000), "")]),
                Some(pod(0)),
                "requeue_after",
                "in 5.0s",
            ),
            // The earliest due time wins: the entry that set it explains it, not the last one.
            (
                "earliest wins",
                delayed(NOW + 1000, vec![enqueued(NOW, 1000, 2), enqueued(NOW + 10, 60_000, 0)]),
                None,
                "pod_event_batch",
                "",
            ),
            // The batch delay writes no history: a short delay on no record is a batch.
            ("no history", delayed(NOW + 1000, vec![]), None, "pod_event_batch", "in 1.0s"),
            ("no history, long", delayed(NOW + 9000, vec![]), None, "delayed", "due in 9.0s"),
            (
                "poisoned",
                Explain {
                    expiries: 0,
                    requeues: 1,
                    history: vec![HistoryEntry::Expired {
                        at_ms: NOW,
                        leased_ms: NOW - 30_000,
                        expiries: 5,
                        poisoned: true,
                        worker: "w2".into(),
                    }],
                    ..delayed(NOW + 1000, vec![])
                },
                None,
                "lease_expiry_backoff",
                "expired 5 times",
            ),
            // The last Done on record wins over the history (which holds none of a success).
            (
                "finished, on record",
                Explain {
                    last_sync: Some(synced(NOW - 100, SyncEnd::Forget, None, "")),
                    history: vec![synced(NOW - 9000, SyncEnd::Error, Some(1000), "x")],
                    ..x(KeyState::Absent)
                },
                None,
                "finished",
                "forget",
            ),
        ];
        for (name, ex, pb, code, text) in cases {
            let (c, m) = reason(&ex, pb.as_ref());
            assert_eq!(c, code, "{name}: {m}");
            assert!(m.contains(text), "{name}: {m:?} lacks {text:?}");
        }
    }

    #[test]
    fn the_pod_backoff_comes_from_the_jobs_own_record() {
        let rec = BackoffRecord {
            failures_after_last_success: 2,
            last_failure_time: jiff::Timestamp::from_millisecond(NOW - 5000).ok(),
        };
        let with = |uid: &str, exp_uid: &str| Explain {
            records: vec![(BACKOFF_RECORD.into(), StoredBackoff::encode(&rec, uid))],
            expectations: Some(ExpectationRecord {
                job_uid: exp_uid.into(),
                add: 0,
                del: 0,
                set_at_ms: NOW,
            }),
            ..x(KeyState::Delayed)
        };
        // 2 failures: 20 s from the last failure, 5 s ago.
        let p = pod_backoff(&with("u1", "u1")).unwrap();
        assert_eq!((p.failures, p.remaining), (2, Duration::from_secs(15)));
        assert_eq!(pod_backoff(&with("old-uid", "u1")), None);
        assert_eq!(pod_backoff(&x(KeyState::Delayed)), None);
    }
}
