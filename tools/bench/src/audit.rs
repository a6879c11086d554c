//! The Job controller's writes as kube-apiserver's audit log times them.
//!
//! The control plane's audit policy records every request of kjob's ServiceAccounts and every
//! write of kube-controller-manager's Job controller (Metadata level, one JSON object a line,
//! `ResponseComplete` stage only). From it, per kind of write, how long the server took from
//! receiving the request to completing the response; and the slow-start rounds of the pod
//! creates — a sync creates 1, 2, 4, … pods, each round after the last one answered — with the
//! time between the server answering one round and receiving the next. That gap is where a
//! controller's round trips show beyond the server's own time: the client's work and the
//! request's way into a busy server.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::stats::percentile;

/// A create received up to this long after the last answer of the round before it still counts
/// as part of that round (the requests of one round leave the client together).
const SAME_ROUND: f64 = 0.002;

/// Server-side time of one kind of write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ServerTime {
    /// Writes of this kind.
    pub count: u64,
    /// Median received → response complete, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile, milliseconds.
    pub p99_ms: f64,
}

/// What the audit log shows of the Job controller's writes in one run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ControllerWrites {
    /// By `"VERB resource"` (`POST pods`, `PUT jobs/status`, …).
    pub by_request: BTreeMap<String, ServerTime>,
    /// The slow-start rounds of pod creates, when one Job was syncing (see [`CreateRounds`]).
    pub create_rounds: Option<CreateRounds>,
}

/// The slow-start rounds of a Job's pod creates. Read only where one Job syncs at a time (the
/// Indexed workload): with many Jobs syncing at once, the creates of different syncs interleave
/// and cannot be told apart in the audit log (a create's object has no name yet).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CreateRounds {
    /// Rounds.
    pub count: u64,
    /// Between one round's last answer and the next round's first request, milliseconds: p50,
    /// over rounds that follow each other with no other write of the controller between them.
    pub gap_p50_ms: Option<f64>,
    /// The same, 99th percentile.
    pub gap_p99_ms: Option<f64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    #[serde(default)]
    stage: String,
    #[serde(default)]
    verb: String,
    user: User,
    #[serde(default)]
    object_ref: Option<ObjectRef>,
    request_received_timestamp: String,
    stage_timestamp: String,
}

#[derive(Deserialize)]
struct User {
    #[serde(default)]
    username: String,
}

#[derive(Deserialize)]
struct ObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: Option<String>,
}

/// The HTTP method kube-apiserver's metrics name a write verb by.
fn method(verb: &str) -> Option<&'static str> {
    Some(match verb {
        "create" => "POST",
        "update" => "PUT",
        "patch" => "PATCH",
        "delete" => "DELETE",
        "deletecollection" => "DELETE",
        _ => return None,
    })
}

/// One write: what it was, and when the server received and answered it (seconds).
struct Write {
    request: String,
    received: f64,
    answered: f64,
}

/// Seconds since the epoch of an RFC 3339 timestamp.
fn secs(t: &str) -> Option<f64> {
    t.parse::<Timestamp>().ok().map(|t| t.as_nanosecond() as f64 / 1e9)
}

/// The writes of `user` in an audit log (`text`, JSON lines), by when they were received. Lines
/// that are not audit events (a torn last line) are skipped.
fn writes_of(text: &str, user: &str) -> Vec<Write> {
    let mut out: Vec<Write> = text
        .lines()
        .filter(|l| l.contains(user))
        .filter_map(|l| serde_json::from_str::<Event>(l).ok())
        .filter(|e| e.stage == "ResponseComplete" && e.user.username == user)
        .filter_map(|e| {
            let m = method(&e.verb)?;
            let o = e.object_ref?;
            let resource = match o.subresource.filter(|s| !s.is_empty()) {
                Some(sub) => format!("{}/{sub}", o.resource),
                None => o.resource,
            };
            Some(Write {
                request: format!("{m} {resource}"),
                received: secs(&e.request_received_timestamp)?,
                answered: secs(&e.stage_timestamp)?,
            })
        })
        .collect();
    out.sort_by(|a, b| a.received.total_cmp(&b.received));
    out
}

/// The writes of `user` (a username as the audit log records it) in the audit log `text`; with
/// `one_job` (a single Job synced during the run) also its create rounds.
pub fn controller_writes(text: &str, user: &str, one_job: bool) -> ControllerWrites {
    let writes = writes_of(text, user);
    let mut times: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for w in &writes {
        times.entry(w.request.clone()).or_default().push(1000.0 * (w.answered - w.received));
    }
    let by_request = times
        .into_iter()
        .map(|(k, mut v)| {
            v.sort_by(f64::total_cmp);
            let t = ServerTime {
                count: v.len() as u64,
                p50_ms: percentile(&v, 0.50).unwrap_or(0.0),
                p99_ms: percentile(&v, 0.99).unwrap_or(0.0),
            };
            (k, t)
        })
        .collect();
    let create_rounds = one_job.then(|| create_rounds(&writes));
    ControllerWrites { by_request, create_rounds }
}

/// The most requests of any verb `user` sent in one `window` (seconds) of the audit log
/// `text`, divided by `window`: the peak request rate as kube-apiserver received it, with the
/// total requests seen. Windows start at each request (a sliding window, so no peak falls
/// between two fixed windows). The control plane's audit policy records every request of
/// kjob's ServiceAccounts and of upstream's `job-controller` ServiceAccount alike.
pub fn peak_request_rate(text: &str, user: &str, window: f64) -> Option<(f64, u64)> {
    let mut at: Vec<f64> = text
        .lines()
        .filter(|l| l.contains(user))
        .filter_map(|l| serde_json::from_str::<Event>(l).ok())
        .filter(|e| e.stage == "ResponseComplete" && e.user.username == user)
        .filter_map(|e| secs(&e.request_received_timestamp))
        .collect();
    if at.is_empty() || window <= 0.0 {
        return None;
    }
    at.sort_by(f64::total_cmp);
    let (mut most, mut end) = (0usize, 0usize);
    for start in 0..at.len() {
        while end < at.len() && at[end] < at[start] + window {
            end += 1;
        }
        most = most.max(end - start);
    }
    Some((most as f64 / window, at.len() as u64))
}

/// The rounds of pod creates among `writes` (by when they were received): a create starts one
/// when it arrives after the current round's last answer.
fn create_rounds(writes: &[Write]) -> CreateRounds {
    let mut count = 0u64;
    let mut gaps = Vec::new();
    // The round being filled: its last answer; `None` after a write that is not a pod create.
    let mut last: Option<f64> = None;
    for w in writes {
        if w.request != "POST pods" {
            last = None;
            continue;
        }
        match last {
            Some(answered) if w.received <= answered + SAME_ROUND => {
                last = Some(answered.max(w.answered));
            }
            prev => {
                count += 1;
                if let Some(answered) = prev {
                    gaps.push(1000.0 * (w.received - answered));
                }
                last = Some(w.answered);
            }
        }
    }
    gaps.sort_by(f64::total_cmp);
    CreateRounds { count, gap_p50_ms: percentile(&gaps, 0.50), gap_p99_ms: percentile(&gaps, 0.99) }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KJOB: &str = "system:serviceaccount:kjob-system:kjob-worker";

    /// An audit line of `user`: `verb` on `resource` (`pods`, `jobs/status`), received at
    /// `at` ms past 12:00:00 and answered `took` ms later.
    fn line(user: &str, verb: &str, resource: &str, at: u32, took: u32) -> String {
        let (res, sub) = match resource.split_once('/') {
            Some((r, s)) => (r, format!(",\"subresource\":\"{s}\"")),
            None => (resource, String::new()),
        };
        let ts = |ms: u32| format!("2026-12-06T12:00:{:02}.{:03}000Z", ms / 1000, ms % 1000);
        format!(
            "{{\"kind\":\"Event\",\"level\":\"Metadata\",\"stage\":\"ResponseComplete\",\
             \"verb\":\"{verb}\",\"user\":{{\"username\":\"{user}\"}},\
             \"objectRef\":{{\"resource\":\"{res}\",\"namespace\":\"default\"{sub}}},\
             \"responseStatus\":{{\"code\":200}},\
             \"requestReceivedTimestamp\":\"{}\",\"stageTimestamp\":\"{}\"}}",
            ts(at),
            ts(at + took)
        )
    }

    #[test]
    fn server_time_per_kind_of_write_of_the_controller_only() {
        let log = [
            line(KJOB, "create", "pods", 0, 4),
            line(KJOB, "create", "pods", 100, 8),
            line(KJOB, "update", "jobs/status", 200, 3),
            line(KJOB, "get", "jobs", 300, 1),
            line("system:serviceaccount:kube-system:job-controller", "create", "pods", 400, 50),
            "{\"kind\":\"Event\",\"torn".to_string(),
        ]
        .join("\n");
        let w = controller_writes(&log, KJOB, false);
        assert_eq!(w.by_request.len(), 2, "{:?}", w.by_request);
        assert_eq!(w.create_rounds, None, "many Jobs: no rounds");
        let pods = w.by_request["POST pods"];
        assert_eq!((pods.count, pods.p50_ms.round(), pods.p99_ms.round()), (2, 4.0, 8.0));
        assert_eq!(w.by_request["PUT jobs/status"].count, 1);
    }

    #[test]
    fn rounds_and_the_gaps_between_them() {
        // A sync: a round of 1 (0–10 ms), of 2 (30–50), of 4 (60–90), then a status write; the
        // next sync: rounds of 1 at 500 and 545. Two gaps in the first sync, one in the second,
        // none across the status write.
        let mut lines = vec![line(KJOB, "create", "pods", 0, 10)];
        lines.push(line(KJOB, "create", "pods", 30, 20));
        lines.push(line(KJOB, "create", "pods", 31, 15));
        for i in 0..4 {
            lines.push(line(KJOB, "create", "pods", 60 + i, 30 - i));
        }
        lines.push(line(KJOB, "update", "jobs/status", 100, 5));
        lines.push(line(KJOB, "create", "pods", 500, 5));
        lines.push(line(KJOB, "create", "pods", 545, 5));
        let rounds = controller_writes(&lines.join("\n"), KJOB, true).create_rounds.unwrap();
        assert_eq!(rounds.count, 5);
        // Gaps: 30 − 10 = 20, 60 − 50 = 10, 545 − 505 = 40.
        assert_eq!(rounds.gap_p50_ms.map(f64::round), Some(20.0));
        assert_eq!(rounds.gap_p99_ms.map(f64::round), Some(40.0));
    }

    #[test]
    fn an_empty_log_has_no_rounds() {
        let w = controller_writes("", KJOB, true);
        assert!(w.by_request.is_empty());
        assert_eq!(w.create_rounds, Some(CreateRounds::default()));
    }

    #[test]
    fn peak_request_rate_slides_over_every_verb_of_the_user() {
        // 5 requests between 1.0 s and 1.9 s, one at 0 s and one at 5 s; another user's
        // requests in the middle count for nothing.
        let mut log = vec![line(KJOB, "get", "jobs", 0, 1), line(KJOB, "list", "pods", 5000, 1)];
        for at in [1000, 1200, 1500, 1800, 1900] {
            log.push(line(KJOB, "create", "pods", at, 2));
            log.push(line("someone-else", "create", "pods", at, 2));
        }
        let log = log.join("\n");
        let (rate, total) = peak_request_rate(&log, KJOB, 1.0).unwrap();
        assert_eq!(total, 7);
        assert!((rate - 5.0).abs() < 1e-9, "{rate}");
        // A window of 2 s from 0 s holds 6 of them (0 s and the five before 1.9 s).
        let (rate, _) = peak_request_rate(&log, KJOB, 2.0).unwrap();
        assert!((rate - 3.0).abs() < 1e-9, "{rate}");
        assert_eq!(peak_request_rate("", KJOB, 10.0), None);
    }
}
