//! Server-side-apply field ownership (`metadata.managedFields`): the same requests, with the same
//! expected answers, on kjob-sim and on the real kube-apiserver. Managers, operations,
//! subresources and the `fieldsV1` sets are compared exactly; times only for presence.

use kjob_testkit::raw::send as call;
use kjob_testkit::server::TestServer;
use serde_json::{Value, json};

const APPLY: &str = "application/apply-patch+yaml";
const MERGE: &str = "application/merge-patch+json";
const JSON_PATCH: &str = "application/json-patch+json";
const JSON: &str = "application/json";

/// The managedFields of an answer without their times (only whether one is set).
fn owners(obj: &Value) -> Vec<Value> {
    let Some(list) = obj.pointer("/metadata/managedFields").and_then(Value::as_array) else {
        return Vec::new();
    };
    list.iter()
        .map(|e| {
            let mut e = e.clone();
            let timed = e.as_object_mut().unwrap().remove("time").is_some();
            e["timed"] = json!(timed);
            e
        })
        .collect()
}

fn entry(manager: &str, operation: &str, api_version: &str, fields: Value) -> Value {
    json!({"manager": manager, "operation": operation, "apiVersion": api_version,
           "fieldsType": "FieldsV1", "fieldsV1": fields, "timed": true})
}

fn job(labels: Value) -> Value {
    json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "labels": labels},
           "spec": {"managedBy": "example.com/nobody", "template": {"spec": {"restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox"}]}}}})
}

/// Requests by one field manager (the client, the manager's name).
struct Manager<'a>(&'a kube::Client, &'a str);

impl Manager<'_> {
    /// Creates `body` in `collection`.
    async fn create(&self, collection: &str, body: &Value) -> (u16, Value) {
        call(self.0, "POST", &format!("{collection}?fieldManager={}", self.1), JSON, body).await
    }

    /// Merge-patches `labels` into the labels of the object at `path`.
    async fn label(&self, path: &str, labels: Value) -> (u16, Value) {
        let body = json!({"metadata": {"labels": labels}});
        call(self.0, "PATCH", &format!("{path}?fieldManager={}", self.1), MERGE, &body).await
    }
}

/// The fields of `job(labels)` as its applier owns them.
fn applied_fields(labels: &[&str]) -> Value {
    let labels: serde_json::Map<String, Value> =
        labels.iter().map(|l| (format!("f:{l}"), json!({}))).collect();
    let mut fields = json!({"f:spec": {"f:managedBy": {}, "f:template": {"f:spec": {
               "f:containers": {"k:{\"name\":\"main\"}": {".": {}, "f:image": {}, "f:name": {}}},
               "f:restartPolicy": {}}}}});
    if !labels.is_empty() {
        fields["f:metadata"] = json!({"f:labels": labels});
    }
    fields
}

/// A fresh namespace named after `name`: the client, its Jobs collection and the path of Job `j`.
async fn jobs_in(server: &TestServer, name: &str) -> (kube::Client, String, String) {
    let ns = server.namespace(name);
    server.create_namespace(&ns).await;
    let jobs = format!("/apis/batch/v1/namespaces/{ns}/jobs");
    let j = format!("{jobs}/j");
    (server.client(), jobs, j)
}

async fn apply_put_conflict_force_and_replace(server: TestServer) {
    let (client, _, j) = jobs_in(&server, "field-ownership").await;

    // An apply creates the Job; its applier owns exactly what it applied.
    let (code, created) = call(
        &client,
        "PATCH",
        &format!("{j}?fieldManager=alice"),
        APPLY,
        &job(json!({"a": "1", "b": "1"})),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(
        owners(&created),
        [entry("alice", "Apply", "batch/v1", applied_fields(&["a", "b"]))]
    );

    // A PUT that adds a label: an Update entry for the manager the server derives (kube-rs sends
    // no User-Agent, so the real server says "unknown"), owning only that label.
    let mut put = created.clone();
    put["metadata"]["labels"]["c"] = json!("1");
    let (code, updated) = call(&client, "PUT", &j, JSON, &put).await;
    assert_eq!(code, 200, "{updated}");
    let added_c = json!({"f:metadata": {"f:labels": {"f:c": {}}}});
    assert_eq!(
        owners(&updated),
        [
            entry("alice", "Apply", "batch/v1", applied_fields(&["a", "b"])),
            entry("unknown", "Update", "batch/v1", added_c.clone()),
        ]
    );

    // Alice applies without `b`: nobody else owns it, so it goes; `c` stays (the updater's).
    let (code, pruned) =
        call(&client, "PATCH", &format!("{j}?fieldManager=alice"), APPLY, &job(json!({"a": "1"})))
            .await;
    assert_eq!(code, 200, "{pruned}");
    assert_eq!(pruned["metadata"]["labels"], json!({"a": "1", "c": "1"}));
    assert_eq!(owners(&pruned)[0], entry("alice", "Apply", "batch/v1", applied_fields(&["a"])));

    // Bob applies another value of `a`: a conflict with alice, unless forced.
    let bob = json!({"apiVersion": "batch/v1", "kind": "Job",
                     "metadata": {"name": "j", "labels": {"a": "2"}}});
    let (code, refused) =
        call(&client, "PATCH", &format!("{j}?fieldManager=bob"), APPLY, &bob).await;
    assert_eq!(code, 409, "{refused}");
    assert_eq!(refused["reason"], "Conflict");
    assert_eq!(
        refused["message"],
        "Apply failed with 1 conflict: conflict with \"alice\": .metadata.labels.a"
    );
    assert_eq!(
        refused["details"],
        json!({"causes": [{"reason": "FieldManagerConflict", "message": "conflict with \"alice\"",
                           "field": ".metadata.labels.a"}]})
    );
    let (code, forced) =
        call(&client, "PATCH", &format!("{j}?fieldManager=bob&force=true"), APPLY, &bob).await;
    assert_eq!(code, 200, "{forced}");
    assert_eq!(forced["metadata"]["labels"], json!({"a": "2", "c": "1"}));
    assert_eq!(
        owners(&forced),
        [
            entry("alice", "Apply", "batch/v1", applied_fields(&[])),
            entry("bob", "Apply", "batch/v1", json!({"f:metadata": {"f:labels": {"f:a": {}}}})),
            entry("unknown", "Update", "batch/v1", added_c.clone()),
        ]
    );
    // An Update by bob of the label alice dropped to nobody: no conflict for an Update.
    let (code, _) = Manager(&client, "carol").label(&j, json!({"a": "3"})).await;
    assert_eq!(code, 200);

    // A request that sets managedFields replaces them as given.
    let given = json!([{"manager": "dave", "operation": "Update", "apiVersion": "batch/v1",
                        "time": "2025-01-01T00:00:00Z", "fieldsType": "FieldsV1",
                        "fieldsV1": {"f:metadata": {"f:labels": {"f:a": {}}}}}]);
    let (code, replaced) = call(
        &client,
        "PATCH",
        &j,
        JSON_PATCH,
        &json!([{"op": "replace", "path": "/metadata/managedFields", "value": given}]),
    )
    .await;
    assert_eq!(code, 200, "{replaced}");
    assert_eq!(replaced["metadata"]["managedFields"], given);

    // `managedFields: []` clears them, and a later update of the untracked object adds none.
    let (code, cleared) =
        call(&client, "PATCH", &j, MERGE, &json!({"metadata": {"managedFields": []}})).await;
    assert_eq!(code, 200, "{cleared}");
    assert_eq!(owners(&cleared), Vec::<Value>::new());
    let (code, untracked) = Manager(&client, "erin").label(&j, json!({"e": "1"})).await;
    assert_eq!(code, 200, "{untracked}");
    assert_eq!(owners(&untracked), Vec::<Value>::new());
}

fn pod() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"app": "x"}},
           "spec": {"restartPolicy": "Never", "schedulerName": "no-such-scheduler",
                    "containers": [{"name": "main", "image": "busybox"}]}})
}

async fn creates_and_status_writes_are_updates(server: TestServer) {
    let ns = server.namespace("field-ownership-updates");
    server.create_namespace(&ns).await;
    let client = server.client();
    let pods = format!("/api/v1/namespaces/{ns}/pods");

    // A create is an Update of every field set, the API defaults included; what admission and
    // the strategy add (service account, tolerations, priority, status) is nobody's.
    let (code, created) = Manager(&client, "maker").create(&pods, &pod()).await;
    assert_eq!(code, 201, "{created}");
    let container = json!({".": {}, "f:image": {}, "f:imagePullPolicy": {}, "f:name": {},
        "f:resources": {}, "f:terminationMessagePath": {}, "f:terminationMessagePolicy": {}});
    let fields = json!({"f:metadata": {"f:labels": {".": {}, "f:app": {}}},
        "f:spec": {"f:containers": {"k:{\"name\":\"main\"}": container}, "f:dnsPolicy": {},
                   "f:enableServiceLinks": {}, "f:restartPolicy": {}, "f:schedulerName": {},
                   "f:securityContext": {}, "f:terminationGracePeriodSeconds": {}}});
    assert_eq!(owners(&created), [entry("maker", "Update", "v1", fields.clone())]);

    // A status write is an Update of the status subresource. The condition's never-omitted
    // times (null here) are the writer's too.
    let (code, status) = call(
        &client,
        "PATCH",
        &format!("{pods}/p/status?fieldManager=prober"),
        MERGE,
        &json!({"status": {"conditions": [{"type": "example.com/ready", "status": "True"}]}}),
    )
    .await;
    assert_eq!(code, 200, "{status}");
    let mut prober = entry(
        "prober",
        "Update",
        "v1",
        json!({"f:status": {"f:conditions": {".": {},
            "k:{\"type\":\"example.com/ready\"}": {".": {}, "f:lastProbeTime": {},
                "f:lastTransitionTime": {}, "f:status": {}, "f:type": {}}}}}),
    );
    prober["subresource"] = json!("status");
    let got = owners(&status);
    assert_eq!(got, [entry("maker", "Update", "v1", fields), prober], "{got:#?}");

    // An events.k8s.io Event owns its fields under that version's names.
    let event = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "p.1"},
        "eventTime": "2025-01-01T00:00:00.000000Z", "action": "Test", "reason": "Tested",
        "note": "hi", "type": "Normal", "reportingController": "example.com/test",
        "reportingInstance": "i", "regarding": {"apiVersion": "v1", "kind": "Pod", "name": "p",
                                                "namespace": ns}});
    let events = format!("/apis/events.k8s.io/v1/namespaces/{ns}/events");
    let (code, recorded) = Manager(&client, "recorder").create(&events, &event).await;
    assert_eq!(code, 201, "{recorded}");
    let fields = json!({"f:action": {}, "f:eventTime": {}, "f:note": {}, "f:reason": {},
        "f:regarding": {}, "f:reportingController": {}, "f:reportingInstance": {}, "f:type": {}});
    let got = owners(&recorded);
    assert_eq!(got, [entry("recorder", "Update", "events.k8s.io/v1", fields)], "{got:#?}");
}

async fn kubectl_takeover_and_capped_updaters(server: TestServer) {
    let (client, jobs, j) = jobs_in(&server, "field-ownership-takeover").await;

    // A Job as kubectl's client-side apply creates it: its manager and the annotation.
    let mut body = job(json!({"a": "1"}));
    let last = body.to_string();
    body["metadata"]["annotations"] =
        json!({"kubectl.kubernetes.io/last-applied-configuration": last});
    let (code, created) = Manager(&client, "kubectl-client-side-apply").create(&jobs, &body).await;
    assert_eq!(code, 201, "{created}");

    // Changing what the client-side apply set, unchanged since, is a conflict for anyone but
    // kubectl's server-side apply, which takes it.
    let change = json!({"apiVersion": "batch/v1", "kind": "Job",
                        "metadata": {"name": "j", "labels": {"a": "2"}}});
    let (code, refused) =
        call(&client, "PATCH", &format!("{j}?fieldManager=alice"), APPLY, &change).await;
    assert_eq!(code, 409, "{refused}");
    let (code, taken) =
        call(&client, "PATCH", &format!("{j}?fieldManager=kubectl"), APPLY, &change).await;
    assert_eq!(code, 200, "{taken}");
    assert_eq!(taken["metadata"]["labels"]["a"], "2");

    // Eleven more updaters: the oldest Update entries merge into `ancient-changes`, ten remain.
    for i in 0..11 {
        let (code, _) = call(
            &client,
            "PATCH",
            &format!("{j}?fieldManager=updater-{i:02}"),
            MERGE,
            &json!({"metadata": {"labels": {format!("u{i}"): "x"}}}),
        )
        .await;
        assert_eq!(code, 200);
    }
    let (_, capped) = call(&client, "GET", &j, JSON, &Value::Null).await;
    let updates: Vec<String> = owners(&capped)
        .iter()
        .filter(|e| e["operation"] == "Update")
        .map(|e| e["manager"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(updates.len(), 10, "{updates:?}");
    assert!(updates.iter().any(|m| m == "ancient-changes"), "{updates:?}");
    assert!(updates.iter().any(|m| m == "updater-10"), "{updates:?}");
}

kjob_testkit::on_both_servers!(kjob_sim::SimConfig::default();
    apply_put_conflict_force_and_replace, creates_and_status_writes_are_updates,
    kubectl_takeover_and_capped_updaters);
