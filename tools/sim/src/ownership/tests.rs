use serde_json::json;

use super::*;

const NOW: &str = "2025-01-01T00:00:00Z";

fn id(manager: &str, operation: Operation) -> Id<'_> {
    Id::new(manager, operation, "v1", Part::Main)
}

fn w(id: Id<'_>) -> Write<'_> {
    Write { kind: StoreKind::Pod, part: Part::Main, id, now: NOW }
}

fn pod(labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns", "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "busybox", "ports": [{"containerPort": 80}]}],
                 "tolerations": [{"key": "t"}]},
        "status": {"phase": "Pending"}})
}

#[test]
fn field_set_of_an_applied_configuration() {
    let set = to_field_set(StoreKind::Pod, &pod(json!({"a": "1"})));
    let mut strip = set.clone();
    strip_meta(&mut strip);
    assert_eq!(
        strip.to_fields_v1(),
        json!({"f:metadata": {"f:labels": {"f:a": {}}},
               "f:spec": {"f:containers": {"k:{\"name\":\"c\"}": {".": {}, "f:image": {}, "f:name": {},
                   "f:ports": {"k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {".": {}, "f:containerPort": {}}}}},
                          "f:tolerations": {}},
               "f:status": {"f:phase": {}}})
    );
    let fins = json!({"metadata": {"finalizers": ["a.io/x"]}});
    assert_eq!(
        to_field_set(StoreKind::Job, &fins).to_fields_v1(),
        json!({"f:metadata": {"f:finalizers": {"v:\"a.io/x\"": {}}}})
    );
}

#[test]
fn create_owns_what_it_set_with_self_markers_for_new_maps() {
    let mut entries = Vec::new();
    let new = pod(json!({"a": "1"}));
    record_update(
        &w(id("kubectl-create", Operation::Update)),
        &zero_object(StoreKind::Pod),
        &new,
        &mut entries,
        true,
    );
    assert_eq!(entries.len(), 1);
    let fields = entries[0].fields.to_fields_v1();
    assert_eq!(fields["f:metadata"], json!({"f:labels": {".": {}, "f:a": {}}}));
    assert!(fields.get("f:status").is_none(), "status is reset on the main resource");
    assert_eq!(fields["f:spec"]["f:containers"]["k:{\"name\":\"c\"}"]["."], json!({}));
    let out = encode(entries).unwrap();
    assert_eq!(out[0]["manager"], "kubectl-create");
    assert_eq!(out[0]["operation"], "Update");
    assert_eq!(out[0]["time"], NOW);
    assert_eq!(out[0]["fieldsType"], "FieldsV1");
}

#[test]
fn updates_take_fields_from_others_and_untracked_objects_stay_untracked() {
    let live = pod(json!({"a": "1"}));
    let mut entries = Vec::new();
    let zero = zero_object(StoreKind::Pod);
    record_update(&w(id("a", Operation::Update)), &zero, &live, &mut entries, true);
    let new = pod(json!({"a": "2", "b": "1"}));
    record_update(&w(id("b", Operation::Update)), &live, &new, &mut entries, false);
    let b = entries.iter().find(|e| e.manager == "b").unwrap();
    assert_eq!(
        b.fields.to_fields_v1(),
        json!({"f:metadata": {"f:labels": {"f:a": {}, "f:b": {}}}})
    );
    let a = entries.iter().find(|e| e.manager == "a").unwrap();
    assert!(a.fields.to_fields_v1()["f:metadata"].get("f:labels").unwrap().get("f:a").is_none());
    let mut none = Vec::new();
    record_update(&w(id("b", Operation::Update)), &live, &new, &mut none, false);
    assert!(none.is_empty());
}

/// An applied configuration of pod `p` setting one label, and `live` with that label merged in.
fn label_apply(live: &Value, key: &str, value: &str) -> (Value, Value) {
    let cfg = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {key: value}}});
    let mut merged = live.clone();
    merged["metadata"]["labels"][key] = json!(value);
    (cfg, merged)
}

/// Records an apply by `manager` over `live` of a `(configuration, merged result)` pair.
fn apply(
    manager: &str,
    live: Option<&Value>,
    (cfg, merged): (Value, Value),
    entries: &mut Vec<Entry>,
    force: bool,
) -> Result<Value, Vec<Conflict>> {
    record_apply(&w(id(manager, Operation::Apply)), live, merged, &cfg, entries, force)
}

#[test]
fn apply_conflicts_force_and_prune() {
    let mut entries = Vec::new();
    let cfg1 = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "1", "b": "1"}}});
    let live = apply("one", None, (cfg1.clone(), cfg1), &mut entries, false).unwrap();
    assert_eq!(entries[0].operation, Operation::Apply);
    assert_eq!(entries[0].time.as_deref(), Some(NOW));
    // Another applier changing `a` conflicts.
    let change = label_apply(&live, "a", "2");
    let err = apply("two", Some(&live), change.clone(), &mut entries.clone(), false).unwrap_err();
    assert_eq!(
        err,
        vec![Conflict { manager: "\"one\"".into(), path: ".metadata.labels.a".into() }]
    );
    let e = conflict_error(&err);
    assert_eq!(
        e.message,
        "Apply failed with 1 conflict: conflict with \"one\": .metadata.labels.a"
    );
    assert_eq!(
        e.details.unwrap()["causes"][0],
        json!({"reason": "FieldManagerConflict", "message": "conflict with \"one\"", "field": ".metadata.labels.a"})
    );
    // Forced, it takes the field.
    let live2 = apply("two", Some(&live), change, &mut entries, true).unwrap();
    let one = entries.iter().find(|e| e.manager == "one").unwrap();
    assert_eq!(one.fields.to_fields_v1(), json!({"f:metadata": {"f:labels": {"f:b": {}}}}));
    // `one` drops `b`, which nobody else owns: it goes.
    let out =
        apply("one", Some(&live2), label_apply(&live2, "c", "1"), &mut entries, false).unwrap();
    assert_eq!(out["metadata"]["labels"], json!({"a": "2", "c": "1"}));
}

#[test]
fn manager_names_and_incoming_lists() {
    assert_eq!(manager_name(Some("m"), Some("kubectl/v1.32.5 (linux/amd64)")), "m");
    assert_eq!(manager_name(None, Some("kubectl/v1.32.5 (linux/amd64)")), "kubectl");
    assert_eq!(manager_name(Some(""), None), "");
    assert_eq!(Id::new("", Operation::Update, "v1", Part::Status).manager, "unknown");
    let mut body = json!({"metadata": {"managedFields": []}});
    assert_eq!(take_incoming(&mut body), Incoming::Reset);
    assert!(body["metadata"].get("managedFields").is_none());
    let mut body = json!({"metadata": {"name": "x"}});
    assert_eq!(take_incoming(&mut body), Incoming::Absent);
}

#[test]
fn last_applied_is_rewritten_for_kubectl() {
    let mut obj = json!({"metadata": {"annotations": {LAST_APPLIED: "{}"}}});
    let cfg = json!({"metadata": {"name": "p", "labels": {"b": "<"}, "annotations": {LAST_APPLIED: "x"}}, "apiVersion": "v1"});
    update_last_applied(&mut obj, &cfg, "kubectl");
    assert_eq!(
        obj["metadata"]["annotations"][LAST_APPLIED],
        "{\"apiVersion\":\"v1\",\"metadata\":{\"labels\":{\"b\":\"\\u003c\"},\"name\":\"p\"}}\n"
    );
}

#[test]
fn update_managers_are_capped_into_ancient_changes() {
    let mut entries = Vec::new();
    let mut live = pod(json!({}));
    for i in 0..12 {
        let mut new = live.clone();
        new["metadata"]["labels"][format!("l{i}")] = json!("x");
        let manager = format!("m{i:02}");
        let now = format!("2025-01-01T00:00:{i:02}Z");
        let write = Write {
            kind: StoreKind::Pod,
            part: Part::Main,
            id: id(&manager, Operation::Update),
            now: &now,
        };
        record_update(&write, &live, &new, &mut entries, true);
        live = new;
    }
    assert_eq!(entries.len(), MAX_UPDATE_MANAGERS);
    let ancient = entries.iter().find(|e| e.manager == ANCIENT_CHANGES).unwrap();
    // m00 (which also created the pod), m01 and m02 merged, with the newest of their times.
    assert_eq!(ancient.time.as_deref(), Some("2025-01-01T00:00:02Z"));
    let labels = ancient.fields.to_fields_v1()["f:metadata"]["f:labels"].clone();
    for l in ["f:l0", "f:l1", "f:l2"] {
        assert!(labels.get(l).is_some(), "{labels}");
    }
    assert!(!entries.iter().any(|e| ["m00", "m01", "m02"].contains(&e.manager.as_str())));
}

#[test]
fn kubectl_takes_what_its_client_side_apply_set_unchanged() {
    let last =
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "1"}}});
    let mut live = pod(json!({"a": "1"}));
    live["metadata"]["annotations"] = json!({LAST_APPLIED: last.to_string()});
    let mut entries = Vec::new();
    let csa = Write {
        kind: StoreKind::Pod,
        part: Part::Main,
        id: id("kubectl-client-side-apply", Operation::Update),
        now: NOW,
    };
    record_update(&csa, &zero_object(StoreKind::Pod), &live, &mut entries, true);
    let cfg =
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "2"}}});
    let mut merged = live.clone();
    merged["metadata"]["labels"]["a"] = json!("2");
    for (manager, ok) in [("alice", false), ("kubectl", true)] {
        let out = record_apply(
            &w(id(manager, Operation::Apply)),
            Some(&live),
            merged.clone(),
            &cfg,
            &mut entries.clone(),
            false,
        );
        assert_eq!(out.is_ok(), ok, "{manager}");
    }
}
