//! `meta.k8s.io/v1` Table output for `kubectl get`, with the real printers' columns.

use jiff::Timestamp;
use serde_json::{Value, json};

use crate::resources::{Resource, StoreKind};

/// `duration.HumanDuration` of apimachinery, as kubectl prints ages.
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    let s = secs.max(0);
    if s < 120 {
        return format!("{s}s");
    }
    let m = s / 60;
    if m < 10 {
        return if s % 60 == 0 { format!("{m}m") } else { format!("{m}m{}s", s % 60) };
    }
    if m < 180 {
        return format!("{m}m");
    }
    let h = m / 60;
    if h < 8 {
        return if m % 60 == 0 { format!("{h}h") } else { format!("{h}h{}m", m % 60) };
    }
    if h < 48 {
        return format!("{h}h");
    }
    let d = h / 24;
    if h < 24 * 8 {
        return if h % 24 == 0 { format!("{d}d") } else { format!("{d}d{}h", h % 24) };
    }
    if h < 24 * 365 * 2 {
        return format!("{d}d");
    }
    let y = d / 365;
    if h < 24 * 365 * 8 {
        return if d % 365 == 0 { format!("{y}y") } else { format!("{y}y{}d", d % 365) };
    }
    format!("{y}y")
}

fn ts(v: &Value) -> Option<Timestamp> {
    v.as_str()?.parse().ok()
}

fn age(obj: &Value, now: Timestamp) -> String {
    match ts(&obj["metadata"]["creationTimestamp"]) {
        Some(t) => human_duration((now - t).get_seconds()),
        None => "<unknown>".into(),
    }
}

fn col(name: &str, typ: &str, format: &str, priority: i64, description: &str) -> Value {
    json!({"name": name, "type": typ, "format": format, "description": description, "priority": priority})
}

fn pod_status(p: &Value) -> String {
    let mut reason = p
        .pointer("/status/reason")
        .and_then(Value::as_str)
        .or_else(|| p.pointer("/status/phase").and_then(Value::as_str))
        .unwrap_or("Unknown")
        .to_owned();
    for c in p.pointer("/status/containerStatuses").and_then(Value::as_array).into_iter().flatten()
    {
        if let Some(r) = c.pointer("/state/waiting/reason").and_then(Value::as_str) {
            reason = r.to_owned();
        } else if let Some(t) = c.pointer("/state/terminated") {
            reason = match t.get("reason").and_then(Value::as_str) {
                Some(r) => r.to_owned(),
                None => match t.get("signal").and_then(Value::as_i64) {
                    Some(s) if s != 0 => format!("Signal:{s}"),
                    _ => format!(
                        "ExitCode:{}",
                        t.get("exitCode").and_then(Value::as_i64).unwrap_or(0)
                    ),
                },
            };
        }
    }
    if p.pointer("/metadata/deletionTimestamp").is_some() && reason != "NodeLost" {
        reason = "Terminating".into();
    }
    reason
}

fn pod_row(p: &Value, now: Timestamp) -> Vec<Value> {
    let total = p.pointer("/spec/containers").and_then(Value::as_array).map_or(0, Vec::len);
    let statuses = p
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let ready = statuses.iter().filter(|c| c["ready"] == json!(true)).count();
    let restarts: i64 = statuses.iter().filter_map(|c| c["restartCount"].as_i64()).sum();
    let none = || json!("<none>");
    let ip = p.pointer("/status/podIP").cloned().unwrap_or_else(none);
    let node = p.pointer("/spec/nodeName").cloned().unwrap_or_else(none);
    let nominated = p.pointer("/status/nominatedNodeName").cloned().unwrap_or_else(none);
    vec![
        p["metadata"]["name"].clone(),
        json!(format!("{ready}/{total}")),
        json!(pod_status(p)),
        json!(restarts),
        json!(age(p, now)),
        ip,
        node,
        nominated,
        none(),
    ]
}

fn has_condition(j: &Value, typ: &str) -> bool {
    j.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == typ && c["status"] == "True"))
}

fn job_status(j: &Value) -> &'static str {
    if has_condition(j, "Complete") {
        "Complete"
    } else if has_condition(j, "Failed") {
        "Failed"
    } else if j.pointer("/metadata/deletionTimestamp").is_some() {
        "Terminating"
    } else if has_condition(j, "Suspended") {
        "Suspended"
    } else if has_condition(j, "FailureTarget") {
        "FailureTarget"
    } else {
        "Running"
    }
}

fn job_row(j: &Value, now: Timestamp) -> Vec<Value> {
    let succeeded = j.pointer("/status/succeeded").and_then(Value::as_i64).unwrap_or(0);
    let completions = match (
        j.pointer("/spec/completions").and_then(Value::as_i64),
        j.pointer("/spec/parallelism").and_then(Value::as_i64),
    ) {
        (Some(c), _) => format!("{succeeded}/{c}"),
        (None, Some(p)) if p > 1 => format!("{succeeded}/1 of {p}"),
        (None, _) => format!("{succeeded}/1"),
    };
    let duration = match ts(&j["status"]["startTime"]) {
        Some(start) => {
            let end = ts(&j["status"]["completionTime"]).unwrap_or(now);
            human_duration((end - start).get_seconds())
        }
        None => String::new(),
    };
    let containers = j
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let names: Vec<&str> = containers.iter().filter_map(|c| c["name"].as_str()).collect();
    let images: Vec<&str> = containers.iter().filter_map(|c| c["image"].as_str()).collect();
    let selector = j
        .pointer("/spec/selector/matchLabels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_else(|| "<none>".into());
    vec![
        j["metadata"]["name"].clone(),
        json!(job_status(j)),
        json!(completions),
        json!(duration),
        json!(age(j, now)),
        json!(names.join(",")),
        json!(images.join(",")),
        json!(selector),
    ]
}

fn columns(res: &Resource) -> Vec<Value> {
    let name = col("Name", "string", "name", 0, "Name must be unique within a namespace.");
    let age = col(
        "Age",
        "string",
        "",
        0,
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
    );
    match res.store {
        StoreKind::Pod => vec![
            name,
            col(
                "Ready",
                "string",
                "",
                0,
                "The aggregate readiness state of this pod for accepting traffic.",
            ),
            col("Status", "string", "", 0, "The aggregate status of the containers in this pod."),
            col(
                "Restarts",
                "string",
                "",
                0,
                "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
            ),
            age,
            col("IP", "string", "", 1, "IP address allocated to the pod."),
            col("Node", "string", "", 1, "Name of the Node this pod is assigned to."),
            col("Nominated Node", "string", "", 1, "Name of the node nominated by the scheduler."),
            col("Readiness Gates", "string", "", 1, "Pod readiness gates."),
        ],
        StoreKind::Job => vec![
            name,
            col("Status", "string", "", 0, "Status of the job."),
            col(
                "Completions",
                "string",
                "",
                0,
                "The desired number of successfully finished pods the job should be run with.",
            ),
            col("Duration", "string", "", 0, "Time required to complete the job."),
            age,
            col("Containers", "string", "", 1, "Names of each container in the template."),
            col("Images", "string", "", 1, "Images referenced by each container in the template."),
            col(
                "Selector",
                "string",
                "",
                1,
                "A label query over pods that should match the pod count.",
            ),
        ],
        StoreKind::Namespace => {
            vec![name, col("Status", "string", "", 0, "The status of the namespace"), age]
        }
        StoreKind::Lease => {
            vec![name, col("Holder", "string", "", 0, "The holder of the lease."), age]
        }
        StoreKind::PriorityClass => vec![
            name,
            col(
                "Value",
                "integer",
                "",
                0,
                "value represents the integer value of this priority class. This is the actual priority that pods receive when they have the name of this class in their pod spec.",
            ),
            col(
                "Global-Default",
                "boolean",
                "",
                0,
                "globalDefault specifies whether this PriorityClass should be considered as the default priority for pods that do not have any priority class. Only one PriorityClass can be marked as `globalDefault`. However, if more than one PriorityClasses exists with their `globalDefault` field set to true, the smallest value of such global default PriorityClasses will be used as the default priority.",
            ),
            age,
            col(
                "PreemptionPolicy",
                "string",
                "",
                0,
                "preemptionPolicy is the Policy for preempting pods with lower priority. One of Never, PreemptLowerPriority. Defaults to PreemptLowerPriority if unset.",
            ),
        ],
        StoreKind::Event => vec![
            col("Last Seen", "string", "", 0, "Time when last event occurred"),
            col("Type", "string", "", 0, "Type of event"),
            col("Reason", "string", "", 0, "Reason of event"),
            col("Object", "string", "", 0, "Object the event is about"),
            col("Message", "string", "", 0, "Message of event"),
            name,
        ],
    }
}

fn event_row(e: &Value, now: Timestamp) -> Vec<Value> {
    // The stored (core) shape and the events.k8s.io view name the fields differently.
    let pick = |a: &str, b: &str| {
        e.get(a).filter(|v| !v.is_null()).or_else(|| e.get(b)).cloned().unwrap_or(Value::Null)
    };
    let last = [
        pick("lastTimestamp", "deprecatedLastTimestamp"),
        pick("eventTime", "eventTime"),
        e["metadata"]["creationTimestamp"].clone(),
    ]
    .iter()
    .find_map(ts)
    .map(|t| human_duration((now - t).get_seconds()))
    .unwrap_or_else(|| "<unknown>".into());
    let obj = pick("involvedObject", "regarding");
    let kind = obj["kind"].as_str().unwrap_or_default().to_lowercase();
    vec![
        json!(last),
        pick("type", "type"),
        pick("reason", "reason"),
        json!(format!("{kind}/{}", obj["name"].as_str().unwrap_or_default())),
        pick("message", "note"),
        e["metadata"]["name"].clone(),
    ]
}

fn row(res: &Resource, obj: &Value, now: Timestamp) -> Vec<Value> {
    match res.store {
        StoreKind::Pod => pod_row(obj, now),
        StoreKind::Job => job_row(obj, now),
        StoreKind::Namespace => {
            vec![
                obj["metadata"]["name"].clone(),
                obj.pointer("/status/phase").cloned().unwrap_or(Value::Null),
                json!(age(obj, now)),
            ]
        }
        StoreKind::Lease => vec![
            obj["metadata"]["name"].clone(),
            obj.pointer("/spec/holderIdentity").cloned().unwrap_or_else(|| json!("")),
            json!(age(obj, now)),
        ],
        StoreKind::PriorityClass => vec![
            obj["metadata"]["name"].clone(),
            obj.get("value").cloned().unwrap_or(json!(0)),
            obj.get("globalDefault").cloned().unwrap_or(json!(false)),
            json!(age(obj, now)),
            obj.get("preemptionPolicy").cloned().unwrap_or_else(|| json!("")),
        ],
        StoreKind::Event => event_row(obj, now),
    }
}

/// A Table of `objects` (already in the resource's view) with the resource's columns.
pub fn table(res: &Resource, objects: &[Value], rv: Option<String>, now: Timestamp) -> Value {
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            json!({"cells": row(res, o, now), "object": {
                "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"],
            }})
        })
        .collect();
    let mut meta = json!({});
    if let Some(rv) = rv {
        meta["resourceVersion"] = json!(rv);
    }
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "columnDefinitions": columns(res), "rows": rows})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations_match_apimachinery() {
        let secs = [5, 119, 125, 600, 3 * 3600 + 60, 10 * 3600, 3 * 86400 + 3600, 100 * 86400];
        let want = ["5s", "119s", "2m5s", "10m", "3h1m", "10h", "3d1h", "100d"];
        assert_eq!(secs.map(human_duration), want);
    }

    #[test]
    fn job_rows_follow_the_printer() {
        let now: Timestamp = "2025-01-01T00:10:00Z".parse().unwrap();
        let job = json!({"metadata": {"name": "pi", "creationTimestamp": "2025-01-01T00:00:00Z"},
            "spec": {"completions": 3, "template": {"spec": {"containers": [{"name": "pi", "image": "perl"}]}}},
            "status": {"succeeded": 3, "startTime": "2025-01-01T00:00:00Z", "completionTime": "2025-01-01T00:01:00Z",
                       "conditions": [{"type": "Complete", "status": "True"}]}});
        let cells = job_row(&job, now);
        assert_eq!(cells[1], "Complete");
        assert_eq!(cells[2], "3/3");
        assert_eq!(cells[3], "60s");
        assert_eq!(cells[4], "10m");
        let res = StoreKind::Job.resource();
        let t = table(res, &[job], Some("5".into()), now);
        assert_eq!(
            t["columnDefinitions"].as_array().unwrap().len(),
            t["rows"][0]["cells"].as_array().unwrap().len()
        );
    }

    #[test]
    fn pod_status_prefers_container_reasons_and_terminating() {
        let p = json!({"metadata": {"name": "p"}, "status": {"phase": "Pending",
            "containerStatuses": [{"ready": false, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}]}});
        assert_eq!(pod_status(&p), "ContainerCreating");
        let mut t = p.clone();
        t["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
        assert_eq!(pod_status(&t), "Terminating");
    }
}
