//! Pod defaulting the way a real cluster stores pods (API defaults plus the side effects of
//! the default admission plugins) and a minimal pod validation.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::FieldCause;
use crate::image::default_pull_policy;
use crate::selector::{dns1123_label_error, qualified_name_errors};

/// Default `terminationGracePeriodSeconds` of a pod.
pub const DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS: i64 = 30;
/// Seconds the DefaultTolerationSeconds plugin tolerates not-ready/unreachable nodes.
pub const DEFAULT_TOLERATION_SECONDS: i64 = 300;

const RESTART_POLICIES: [&str; 3] = ["Always", "OnFailure", "Never"];

fn set_default(m: &mut Map<String, Value>, key: &str, value: Value) {
    if m.get(key).is_none_or(Value::is_null) {
        m.insert(key.to_string(), value);
    }
}

fn default_container(c: &mut Value) {
    let Some(m) = c.as_object_mut() else { return };
    set_default(m, "terminationMessagePath", json!("/dev/termination-log"));
    set_default(m, "terminationMessagePolicy", json!("File"));
    let image = m.get("image").and_then(Value::as_str).unwrap_or_default().to_string();
    set_default(m, "imagePullPolicy", json!(default_pull_policy(&image)));
    set_default(m, "resources", json!({}));
    if let Some(Value::Array(ports)) = m.get_mut("ports") {
        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
            set_default(p, "protocol", json!("TCP"));
        }
    }
    // Requests default to limits when only limits are given.
    if let Some(Value::Object(res)) = m.get_mut("resources")
        && let Some(Value::Object(limits)) = res.get("limits").cloned()
    {
        let requests = res.entry("requests").or_insert_with(|| json!({}));
        if let Some(req) = requests.as_object_mut() {
            for (k, v) in limits {
                req.entry(k).or_insert(v);
            }
        }
    }
}

/// Applies the API defaults of a pod spec (also used for Job pod templates).
pub fn default_pod_spec(spec: &mut Value) {
    let Some(m) = spec.as_object_mut() else { return };
    set_default(m, "restartPolicy", json!("Always"));
    set_default(m, "dnsPolicy", json!("ClusterFirst"));
    set_default(m, "schedulerName", json!("default-scheduler"));
    set_default(m, "securityContext", json!({}));
    set_default(
        m,
        "terminationGracePeriodSeconds",
        json!(DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS),
    );
    for list in ["initContainers", "containers"] {
        if let Some(Value::Array(cs)) = m.get_mut(list) {
            cs.iter_mut().for_each(default_container);
        }
    }
}

/// Defaults a pod as a real cluster stores it on create: API defaults, `enableServiceLinks`,
/// the `default` service account, priority 0 / `PreemptLowerPriority`, and the
/// not-ready/unreachable tolerations of the DefaultTolerationSeconds plugin.
pub fn default_pod(pod: &mut Value) {
    let Some(spec) = pod.get_mut("spec") else { return };
    default_pod_spec(spec);
    let Some(m) = spec.as_object_mut() else { return };
    set_default(m, "enableServiceLinks", json!(true));
    let sa = m
        .get("serviceAccountName")
        .or_else(|| m.get("serviceAccount"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or("default")
        .to_string();
    m.insert("serviceAccountName".into(), json!(sa));
    m.insert("serviceAccount".into(), json!(sa));
    set_default(m, "priority", json!(0));
    set_default(m, "preemptionPolicy", json!("PreemptLowerPriority"));
    let tolerations = m.entry("tolerations").or_insert_with(|| json!([]));
    if let Some(list) = tolerations.as_array_mut() {
        for key in ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"] {
            let present = list.iter().any(|t| {
                t.get("key").and_then(Value::as_str) == Some(key)
                    && t.get("effect").and_then(Value::as_str).is_none_or(|e| e == "NoExecute")
            });
            if !present {
                list.push(json!({
                    "key": key,
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": DEFAULT_TOLERATION_SECONDS
                }));
            }
        }
    }
}

/// QoS class of a pod: BestEffort without any requests/limits, Guaranteed when every
/// container has cpu and memory limits equal to its requests, else Burstable.
pub fn qos_class(pod: &Value) -> &'static str {
    let containers: Vec<&Value> = ["containers", "initContainers"]
        .iter()
        .filter_map(|k| pod.pointer(&format!("/spec/{k}")).and_then(Value::as_array))
        .flatten()
        .collect();
    let non_empty = |c: &Value, w: &str| {
        c.pointer(&format!("/resources/{w}"))
            .and_then(Value::as_object)
            .is_some_and(|m| !m.is_empty())
    };
    if !containers.iter().any(|c| non_empty(c, "requests") || non_empty(c, "limits")) {
        return "BestEffort";
    }
    let guaranteed = containers.iter().all(|c| {
        ["cpu", "memory"].iter().all(|r| {
            let limit = c.pointer(&format!("/resources/limits/{r}"));
            let request = c.pointer(&format!("/resources/requests/{r}")).or(limit);
            limit.is_some() && limit == request
        })
    });
    if guaranteed { "Guaranteed" } else { "Burstable" }
}

/// Validates a pod spec under `path` (`spec` or `spec.template.spec`): at least one
/// container, unique DNS-label container names, images present, a known restartPolicy,
/// volume mounts referencing declared volumes, unique volume names.
pub fn validate_pod_spec(spec: &Value, path: &str) -> Vec<FieldCause> {
    let mut out = Vec::new();
    let mut volumes = BTreeSet::new();
    if let Some(vs) = spec.get("volumes").and_then(Value::as_array) {
        for (i, v) in vs.iter().enumerate() {
            let name = v.get("name").and_then(Value::as_str).unwrap_or_default();
            let f = format!("{path}.volumes[{i}].name");
            if name.is_empty() {
                out.push(FieldCause::required(&f, ""));
            } else if let Some(e) = dns1123_label_error(name) {
                out.push(FieldCause::invalid(&f, &json!(name), &e));
            } else if !volumes.insert(name.to_string()) {
                out.push(FieldCause::duplicate(&f, &json!(name)));
            }
        }
    }
    let containers = spec.get("containers").and_then(Value::as_array);
    if containers.is_none_or(Vec::is_empty) {
        out.push(FieldCause::required(&format!("{path}.containers"), ""));
    }
    let mut names = BTreeSet::new();
    for list in ["initContainers", "containers"] {
        let Some(cs) = spec.get(list).and_then(Value::as_array) else { continue };
        for (i, c) in cs.iter().enumerate() {
            let cp = format!("{path}.{list}[{i}]");
            let name = c.get("name").and_then(Value::as_str).unwrap_or_default();
            if name.is_empty() {
                out.push(FieldCause::required(&format!("{cp}.name"), ""));
            } else if let Some(e) = dns1123_label_error(name) {
                out.push(FieldCause::invalid(&format!("{cp}.name"), &json!(name), &e));
            } else if !names.insert(name.to_string()) {
                out.push(FieldCause::duplicate(&format!("{cp}.name"), &json!(name)));
            }
            if c.get("image").and_then(Value::as_str).is_none_or(|s| s.trim().is_empty()) {
                out.push(FieldCause::required(&format!("{cp}.image"), ""));
            }
            if let Some(ms) = c.get("volumeMounts").and_then(Value::as_array) {
                for (j, m) in ms.iter().enumerate() {
                    let vname = m.get("name").and_then(Value::as_str).unwrap_or_default();
                    if !volumes.contains(vname) {
                        out.push(FieldCause::not_found(
                            &format!("{cp}.volumeMounts[{j}].name"),
                            &json!(vname),
                        ));
                    }
                    if m.get("mountPath").and_then(Value::as_str).is_none_or(str::is_empty) {
                        out.push(FieldCause::required(
                            &format!("{cp}.volumeMounts[{j}].mountPath"),
                            "",
                        ));
                    }
                }
            }
        }
    }
    match spec.get("restartPolicy").and_then(Value::as_str) {
        None | Some("") => out.push(FieldCause::required(&format!("{path}.restartPolicy"), "")),
        Some(p) if !RESTART_POLICIES.contains(&p) => out.push(FieldCause::not_supported(
            &format!("{path}.restartPolicy"),
            &json!(p),
            &RESTART_POLICIES,
        )),
        _ => {}
    }
    out
}

/// Validates label keys/values of an object's metadata under `path` (`metadata`).
pub fn validate_labels(meta: Option<&Value>, path: &str) -> Vec<FieldCause> {
    let mut out = Vec::new();
    let Some(labels) = meta.and_then(|m| m.get("labels")).and_then(Value::as_object) else {
        return out;
    };
    for (k, v) in labels {
        for e in qualified_name_errors(k) {
            out.push(FieldCause::invalid(&format!("{path}.labels"), &json!(k), &e));
        }
        let val = v.as_str().unwrap_or_default();
        for e in crate::selector::label_value_errors(val) {
            out.push(FieldCause::invalid(&format!("{path}.labels"), &json!(val), &e));
        }
    }
    out
}

/// Validates a pod on create.
pub fn validate_pod_create(pod: &Value) -> Vec<FieldCause> {
    let mut out = validate_labels(pod.get("metadata"), "metadata");
    match pod.get("spec") {
        Some(spec) => out.extend(validate_pod_spec(spec, "spec")),
        None => out.push(FieldCause::required("spec.containers", "")),
    }
    out
}

const POD_UPDATE_FORBIDDEN: &str = "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";

/// Validates a main-resource pod update: only images, `activeDeadlineSeconds` (set or
/// lowered), added tolerations, removed scheduling gates and a negative grace period moving
/// to 1 may change.
pub fn validate_pod_update(new: &Value, old: &Value) -> Vec<FieldCause> {
    let mut out = validate_labels(new.get("metadata"), "metadata");
    let (Some(ns), Some(os)) = (new.get("spec"), old.get("spec")) else {
        return out;
    };
    let mut ns = ns.clone();
    let mut os = os.clone();
    // Copy the mutable parts from new into old; whatever still differs is forbidden.
    for list in ["containers", "initContainers"] {
        if let (Some(Value::Array(n)), Some(Value::Array(o))) = (ns.get(list), os.get_mut(list))
            && n.len() == o.len()
        {
            for (nc, oc) in n.iter().zip(o.iter_mut()) {
                if let Some(img) = nc.get("image") {
                    oc["image"] = img.clone();
                }
            }
        }
    }
    let new_ads = ns.get("activeDeadlineSeconds").and_then(Value::as_i64);
    let old_ads = os.get("activeDeadlineSeconds").and_then(Value::as_i64);
    match (old_ads, new_ads) {
        (None, Some(_)) => {}
        (Some(o), Some(n)) if n <= o => {}
        (o, n) if o == n => {}
        (_, n) => out.push(FieldCause::invalid(
            "spec.activeDeadlineSeconds",
            &json!(n),
            "must be less than or equal to previous value",
        )),
    }
    for s in [&mut ns, &mut os] {
        if let Some(m) = s.as_object_mut() {
            m.remove("activeDeadlineSeconds");
        }
    }
    let old_tol = os.get("tolerations").and_then(Value::as_array).cloned().unwrap_or_default();
    let new_tol = ns.get("tolerations").and_then(Value::as_array).cloned().unwrap_or_default();
    if old_tol.iter().all(|t| new_tol.contains(t)) {
        os["tolerations"] = Value::Array(new_tol);
        ns["tolerations"] = os["tolerations"].clone();
    }
    let old_gates =
        os.get("schedulingGates").and_then(Value::as_array).cloned().unwrap_or_default();
    let new_gates =
        ns.get("schedulingGates").and_then(Value::as_array).cloned().unwrap_or_default();
    if new_gates.iter().all(|g| old_gates.contains(g)) {
        for s in [&mut ns, &mut os] {
            if let Some(m) = s.as_object_mut() {
                m.remove("schedulingGates");
            }
        }
    }
    if os.get("terminationGracePeriodSeconds").and_then(Value::as_i64).is_some_and(|g| g < 0)
        && ns.get("terminationGracePeriodSeconds").and_then(Value::as_i64) == Some(1)
    {
        os["terminationGracePeriodSeconds"] = json!(1);
    }
    if let Some(m) = os.as_object_mut()
        && m.get("tolerations").and_then(Value::as_array).is_some_and(Vec::is_empty)
    {
        m.remove("tolerations");
    }
    if let Some(m) = ns.as_object_mut()
        && m.get("tolerations").and_then(Value::as_array).is_some_and(Vec::is_empty)
    {
        m.remove("tolerations");
    }
    if ns != os {
        out.push(FieldCause::forbidden("spec", POD_UPDATE_FORBIDDEN));
    }
    out
}

/// Validates a pod `/status` update: a terminated container of a `restartPolicy: Never` pod
/// may not be running or waiting again, and terminal phases are final.
pub fn validate_pod_status_update(new: &Value, old: &Value) -> Vec<FieldCause> {
    let mut out = Vec::new();
    let old_phase = old.pointer("/status/phase").and_then(Value::as_str).unwrap_or_default();
    let new_phase = new.pointer("/status/phase").and_then(Value::as_str).unwrap_or_default();
    if matches!(old_phase, "Succeeded" | "Failed") && new_phase != old_phase {
        out.push(FieldCause::forbidden(
            "status.phase",
            &format!("cannot transition from terminal phase {old_phase} to {new_phase}"),
        ));
    }
    let never = old.pointer("/spec/restartPolicy").and_then(Value::as_str) == Some("Never");
    if never {
        for list in ["containerStatuses", "initContainerStatuses"] {
            let olds = old.pointer(&format!("/status/{list}")).and_then(Value::as_array);
            let news = new.pointer(&format!("/status/{list}")).and_then(Value::as_array);
            let (Some(olds), Some(news)) = (olds, news) else { continue };
            for (i, n) in news.iter().enumerate() {
                let name = n.get("name");
                let Some(o) = olds.iter().find(|o| o.get("name") == name) else { continue };
                let was_terminated = o.pointer("/state/terminated").is_some();
                if was_terminated && n.pointer("/state/terminated").is_none() {
                    out.push(FieldCause::forbidden(
                        &format!("status.{list}[{i}].state"),
                        &format!(
                            "may not be transitioned to non-terminated state: {}",
                            name.and_then(Value::as_str).unwrap_or_default()
                        ),
                    ));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Value {
        json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [
                {"name": "c", "image": "busybox", "ports": [{"containerPort": 80}],
                 "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}},
                {"name": "d", "image": "nginx:1.27"}
            ]}
        })
    }

    #[test]
    fn defaults_like_a_real_cluster() {
        let mut p = pod();
        default_pod(&mut p);
        let s = &p["spec"];
        assert_eq!(s["restartPolicy"], "Always");
        assert_eq!(s["dnsPolicy"], "ClusterFirst");
        assert_eq!(s["schedulerName"], "default-scheduler");
        assert_eq!(s["securityContext"], json!({}));
        assert_eq!(s["terminationGracePeriodSeconds"], 30);
        assert_eq!(s["enableServiceLinks"], true);
        assert_eq!(s["serviceAccountName"], "default");
        assert_eq!(s["serviceAccount"], "default");
        assert_eq!(s["priority"], 0);
        assert_eq!(s["preemptionPolicy"], "PreemptLowerPriority");
        assert_eq!(s["tolerations"].as_array().unwrap().len(), 2);
        assert_eq!(s["tolerations"][0]["tolerationSeconds"], 300);
        let c = &s["containers"][0];
        assert_eq!(c["terminationMessagePath"], "/dev/termination-log");
        assert_eq!(c["terminationMessagePolicy"], "File");
        assert_eq!(c["imagePullPolicy"], "Always");
        assert_eq!(c["ports"][0]["protocol"], "TCP");
        assert_eq!(c["resources"]["requests"], json!({"cpu": "1", "memory": "1Gi"}));
        assert_eq!(s["containers"][1]["imagePullPolicy"], "IfNotPresent");
        assert_eq!(s["containers"][1]["resources"], json!({}));
        // Idempotent.
        let again = {
            let mut q = p.clone();
            default_pod(&mut q);
            q
        };
        assert_eq!(again, p);
        // Explicit values are kept.
        let mut q = pod();
        q["spec"]["restartPolicy"] = json!("Never");
        q["spec"]["serviceAccountName"] = json!("runner");
        default_pod(&mut q);
        assert_eq!(q["spec"]["restartPolicy"], "Never");
        assert_eq!(q["spec"]["serviceAccount"], "runner");
    }

    #[test]
    fn qos() {
        assert_eq!(qos_class(&json!({"spec": {"containers": [{"name": "a"}]}})), "BestEffort");
        let mut p = pod();
        assert_eq!(qos_class(&p), "Burstable");
        p["spec"]["containers"][1]["resources"] = json!({"limits": {"cpu": "1", "memory": "1Gi"}});
        assert_eq!(qos_class(&p), "Guaranteed");
        p["spec"]["containers"][1]["resources"]["requests"] = json!({"cpu": "500m"});
        assert_eq!(qos_class(&p), "Burstable");
    }

    #[test]
    fn validation() {
        let mut p = pod();
        default_pod(&mut p);
        assert!(validate_pod_create(&p).is_empty());
        let bad = json!({"metadata": {"name": "p"}, "spec": {
        "restartPolicy": "Sometimes",
        "volumes": [{"name": "v"}, {"name": "v"}],
        "containers": [
            {"name": "c", "image": "x", "volumeMounts": [{"name": "nope", "mountPath": "/a"}]},
            {"name": "c", "image": ""},
            {"name": "Bad_Name", "image": "x"}
        ]}});
        let causes = validate_pod_create(&bad);
        let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
        assert!(fields.contains(&"spec.volumes[1].name"), "{causes:?}");
        assert!(fields.contains(&"spec.containers[0].volumeMounts[0].name"));
        assert!(fields.contains(&"spec.containers[1].name"));
        assert!(fields.contains(&"spec.containers[1].image"));
        assert!(fields.contains(&"spec.containers[2].name"));
        assert!(fields.contains(&"spec.restartPolicy"));
        let none = validate_pod_create(
            &json!({"metadata": {"name": "p"}, "spec": {"restartPolicy": "Never"}}),
        );
        assert_eq!(none[0].to_string(), "spec.containers: Required value");
    }

    #[test]
    fn update_rules() {
        let mut old = pod();
        default_pod(&mut old);
        let mut new = old.clone();
        new["spec"]["containers"][0]["image"] = json!("busybox:2");
        new["spec"]["activeDeadlineSeconds"] = json!(30);
        new["spec"]["tolerations"]
            .as_array_mut()
            .unwrap()
            .push(json!({"key": "x", "operator": "Exists"}));
        assert!(
            validate_pod_update(&new, &old).is_empty(),
            "{:?}",
            validate_pod_update(&new, &old)
        );
        let mut raised = new.clone();
        raised["spec"]["activeDeadlineSeconds"] = json!(60);
        assert_eq!(validate_pod_update(&raised, &new)[0].field, "spec.activeDeadlineSeconds");
        let mut bad = old.clone();
        bad["spec"]["restartPolicy"] = json!("Never");
        let causes = validate_pod_update(&bad, &old);
        assert_eq!(causes[0].reason, super::super::FIELD_VALUE_FORBIDDEN);
        assert!(causes[0].message.starts_with("Forbidden: pod updates may not change fields"));
        let mut removed_tol = old.clone();
        removed_tol["spec"]["tolerations"] = json!([]);
        assert!(!validate_pod_update(&removed_tol, &old).is_empty());
    }

    #[test]
    fn status_rules() {
        let old = json!({"spec": {"restartPolicy": "Never"}, "status": {"phase": "Running",
            "containerStatuses": [{"name": "c", "state": {"terminated": {"exitCode": 0}}}]}});
        let back = json!({"spec": {"restartPolicy": "Never"}, "status": {"phase": "Running",
            "containerStatuses": [{"name": "c", "state": {"running": {}}}]}});
        assert_eq!(validate_pod_status_update(&back, &old).len(), 1);
        let done = json!({"status": {"phase": "Succeeded"}});
        let again = json!({"status": {"phase": "Running"}});
        assert_eq!(validate_pod_status_update(&again, &done)[0].field, "status.phase");
        assert!(validate_pod_status_update(&done, &done).is_empty());
    }
}
