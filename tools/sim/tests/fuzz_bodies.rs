//! Bad input (issue #8): random and malformed bodies sent to create, update, patch and status
//! of pods, Jobs, events (both groups) and leases of an in-process simulator. Every answer must
//! be a real HTTP answer below 500, every rejection a `Status` object carrying its 4xx code, and
//! the store must stay sound: reads and watches keep working, revisions only grow and an
//! accepted write is visible.

use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt;
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};
use serde_json::{Map, Value, json};
use wire::{WAIT, Wire};

mod wire;

/// Names the strategies address; `a` exists for every resource before the run.
const NAMES: [&str; 3] = ["a", "b", "c-1"];

/// One served collection and a valid object for it (what the fuzzed bodies are mutated from).
struct Target {
    collection: &'static str,
    status: bool,
    valid: fn(&str) -> Value,
}

fn pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "f"}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}})
}

fn job(name: &str) -> Value {
    json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"completions": 1, "parallelism": 1, "template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox"}]}}}})
}

fn core_event(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": name},
        "involvedObject": {"kind": "Pod", "name": "a", "namespace": "default"},
        "reason": "Fuzz", "message": "m", "type": "Normal", "source": {"component": "fuzz"}})
}

fn new_event(name: &str) -> Value {
    json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": name},
        "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "fuzz",
        "reportingInstance": "fuzz-1", "action": "Test", "reason": "Fuzz", "type": "Normal",
        "regarding": {"kind": "Pod", "name": "a", "namespace": "default"}})
}

fn lease(name: &str) -> Value {
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name},
        "spec": {"holderIdentity": "x", "leaseDurationSeconds": 15}})
}

const TARGETS: [Target; 5] = [
    Target { collection: "/api/v1/namespaces/default/pods", status: true, valid: pod },
    Target { collection: "/apis/batch/v1/namespaces/default/jobs", status: true, valid: job },
    Target { collection: "/api/v1/namespaces/default/events", status: false, valid: core_event },
    Target {
        collection: "/apis/events.k8s.io/v1/namespaces/default/events",
        status: false,
        valid: new_event,
    },
    Target {
        collection: "/apis/coordination.k8s.io/v1/namespaces/default/leases",
        status: false,
        valid: lease,
    },
];

const CONTENT_TYPES: [&str; 9] = [
    "application/json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/json-patch+json",
    "application/apply-patch+yaml",
    "text/plain",
    "",
    "application/json; charset=utf-8",
    "application/x-garbage",
];

/// Keys the random JSON draws from: the API's own field names make random shapes reach deep
/// into admission and the patch engines instead of failing at the first unknown field.
const KEYS: [&str; 32] = [
    "metadata",
    "spec",
    "status",
    "name",
    "namespace",
    "labels",
    "annotations",
    "finalizers",
    "ownerReferences",
    "resourceVersion",
    "generateName",
    "uid",
    "deletionTimestamp",
    "containers",
    "image",
    "template",
    "completions",
    "parallelism",
    "conditions",
    "type",
    "phase",
    "holderIdentity",
    "leaseDurationSeconds",
    "involvedObject",
    "regarding",
    "$patch",
    "$retainKeys",
    "$setElementOrder/containers",
    "$deleteFromPrimitiveList/finalizers",
    "op",
    "path",
    "value",
];

const PATHS: [&str; 12] = [
    "/metadata/labels/x",
    "/metadata/labels",
    "/metadata/name",
    "/metadata/resourceVersion",
    "/metadata/finalizers/-",
    "/metadata/finalizers/0",
    "/spec/containers/0/image",
    "/spec/containers/5",
    "/spec/parallelism",
    "/status/conditions/-",
    "/status",
    "",
];

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => proptest::sample::select(&KEYS[..]).prop_map(str::to_owned),
        1 => "[a-z$/~.]{0,6}",
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "[a-zA-Z0-9 ./:-]{0,12}".prop_map(Value::String),
        proptest::sample::select(&PATHS[..]).prop_map(|p| Value::String(p.to_owned())),
    ];
    leaf.prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            proptest::collection::vec((key(), inner), 0..5)
                .prop_map(|kvs| Value::Object(kvs.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A JSON patch operation with a random (often invalid) name, path and value.
fn patch_op() -> impl Strategy<Value = Value> {
    let op = prop_oneof![
        proptest::sample::select(&["add", "remove", "replace", "move", "copy", "test"][..])
            .prop_map(|s| Value::String(s.to_owned())),
        json_value(),
    ];
    (op, proptest::sample::select(&PATHS[..]), json_value(), any::<bool>()).prop_map(
        |(op, path, value, from)| {
            let mut m = json!({"op": op, "path": path, "value": value});
            if from {
                m["from"] = json!("/metadata/labels");
            }
            m
        },
    )
}

/// How a body is made.
#[derive(Debug, Clone)]
enum Body {
    /// Raw bytes (mostly not JSON).
    Bytes(Vec<u8>),
    /// A valid object cut short.
    Truncated(usize),
    /// Any JSON document.
    Json(Value),
    /// A valid object with one top-level part replaced by a random value.
    Replaced(&'static str, Value),
    /// A valid object with one metadata field replaced by a random value.
    Meta(&'static str, Value),
    /// A JSON patch (array of operations).
    JsonPatch(Vec<Value>),
}

fn body() -> impl Strategy<Value = Body> {
    prop_oneof![
        1 => proptest::collection::vec(any::<u8>(), 0..48).prop_map(Body::Bytes),
        1 => (0usize..200).prop_map(Body::Truncated),
        3 => json_value().prop_map(Body::Json),
        3 => (proptest::sample::select(&["metadata", "spec", "status", "kind", "apiVersion",
                "involvedObject", "regarding", "eventTime"][..]), json_value())
            .prop_map(|(k, v)| Body::Replaced(k, v)),
        3 => (proptest::sample::select(&["name", "labels", "annotations", "finalizers",
                "ownerReferences", "resourceVersion", "generateName", "namespace", "uid",
                "deletionTimestamp", "creationTimestamp", "generation"][..]), json_value())
            .prop_map(|(k, v)| Body::Meta(k, v)),
        2 => proptest::collection::vec(patch_op(), 0..4).prop_map(Body::JsonPatch),
    ]
}

/// One request of a case.
#[derive(Debug, Clone)]
struct Req {
    target: usize,
    /// 0 create, 1 update, 2 update status, 3 patch, 4 patch status.
    verb: u8,
    name: &'static str,
    content_type: &'static str,
    body: Body,
}

fn req() -> impl Strategy<Value = Req> {
    (
        0..TARGETS.len(),
        0u8..5,
        proptest::sample::select(&NAMES[..]),
        proptest::sample::select(&CONTENT_TYPES[..]),
        body(),
    )
        .prop_map(|(target, verb, name, content_type, body)| Req {
            target,
            verb,
            name,
            content_type,
            body,
        })
}

fn render(r: &Req) -> Vec<u8> {
    let valid = (TARGETS[r.target].valid)(r.name);
    let v = match &r.body {
        Body::Bytes(b) => return b.clone(),
        Body::Truncated(n) => {
            let s = valid.to_string().into_bytes();
            return s[..(*n).min(s.len().saturating_sub(1))].to_vec();
        }
        Body::Json(v) => v.clone(),
        Body::Replaced(k, v) => {
            let mut o = valid;
            o[*k] = v.clone();
            o
        }
        Body::Meta(k, v) => {
            let mut o = valid;
            o["metadata"][*k] = v.clone();
            o
        }
        Body::JsonPatch(ops) => Value::Array(ops.clone()),
    };
    serde_json::to_vec(&v).unwrap()
}

struct Harness {
    wire: Wire,
    /// Fuzzed requests the server accepted and refused (both must happen for the run to mean
    /// anything).
    accepted: AtomicU64,
    refused: AtomicU64,
}

impl std::ops::Deref for Harness {
    type Target = Wire;

    fn deref(&self) -> &Wire {
        &self.wire
    }
}

impl Harness {
    /// A simulator with `a` of every resource stored.
    async fn seeded() -> Harness {
        let wire = Wire::start(Default::default()).await;
        let h = Harness { wire, accepted: AtomicU64::new(0), refused: AtomicU64::new(0) };
        seed(&h).await;
        h
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let (code, b) = self.send(reqwest::Method::GET, path, "", Some(Vec::new())).await.unwrap();
        (code, serde_json::from_slice(&b).unwrap_or(Value::Null))
    }

    /// The list revision of a collection (and checks the list answers at all).
    async fn list_rv(&self, collection: &str) -> u64 {
        let (code, v) = self.get(collection).await;
        assert_eq!(code, 200, "LIST {collection}: {v}");
        assert!(v["items"].is_array(), "LIST {collection}: {v}");
        v["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap()
    }
}

fn rv_of(v: &Value) -> u64 {
    v["metadata"]["resourceVersion"].as_str().and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// Checks one answer; returns the accepted object for a 2xx.
fn check_answer(what: &str, code: u16, body: &[u8]) -> Result<Option<Value>, TestCaseError> {
    prop_assert!(code < 500, "{what}: server error {code}: {}", String::from_utf8_lossy(body));
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        TestCaseError::fail(format!("{what}: {code} body is not JSON ({e}): {body:?}"))
    })?;
    if code >= 400 {
        prop_assert_eq!(&v["kind"], "Status", "{}: {}", what, v);
        prop_assert_eq!(&v["apiVersion"], "v1", "{}: {}", what, v);
        prop_assert_eq!(&v["status"], "Failure", "{}: {}", what, v);
        prop_assert_eq!(v["code"].as_u64(), Some(u64::from(code)), "{}: {}", what, v);
        prop_assert!(v["message"].is_string(), "{}: {}", what, v);
        return Ok(None);
    }
    prop_assert!((200..300).contains(&code), "{}: unexpected {}: {}", what, code, v);
    Ok(Some(v))
}

async fn run_case(h: &Harness, reqs: Vec<Req>) -> Result<(), TestCaseError> {
    for r in reqs {
        let t = &TARGETS[r.target];
        let (method, path) = match r.verb {
            0 => (reqwest::Method::POST, t.collection.to_owned()),
            1 => (reqwest::Method::PUT, format!("{}/{}", t.collection, r.name)),
            2 if t.status => (reqwest::Method::PUT, format!("{}/{}/status", t.collection, r.name)),
            3 | 2 => (reqwest::Method::PATCH, format!("{}/{}", t.collection, r.name)),
            _ if t.status => {
                (reqwest::Method::PATCH, format!("{}/{}/status", t.collection, r.name))
            }
            _ => (reqwest::Method::PATCH, format!("{}/{}", t.collection, r.name)),
        };
        let what = format!("{method} {path} [{}] {:?}", r.content_type, r.body);
        let before = h.list_rv(t.collection).await;
        let (code, body) = h
            .send(method, &path, r.content_type, Some(render(&r)))
            .await
            .map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
        let Some(obj) = check_answer(&what, code, &body)? else {
            h.refused.fetch_add(1, Ordering::Relaxed);
            prop_assert!(h.list_rv(t.collection).await >= before, "{what}: revision went back");
            continue;
        };
        h.accepted.fetch_add(1, Ordering::Relaxed);
        // Accepted: the answer is a stored object, visible to a GET, and revisions never go
        // back (a create always moves them forward).
        let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        prop_assert!(!name.is_empty(), "{}: accepted object without a name: {}", what, obj);
        let rv = rv_of(&obj);
        prop_assert!(rv > 0, "{}: accepted object without a revision: {}", what, obj);
        if code == 201 {
            prop_assert!(rv > before, "{what}: created at {rv}, not after {before}");
        }
        let (gcode, got) = h.get(&format!("{}/{name}", t.collection)).await;
        // The collector may remove an object naming a missing owner right after the write.
        let collectable =
            obj["metadata"]["ownerReferences"].as_array().is_some_and(|r| !r.is_empty())
                || !obj["metadata"]["deletionTimestamp"].is_null();
        if gcode == 404 && collectable {
            continue;
        }
        prop_assert_eq!(gcode, 200, "{}: accepted object not readable: {}", what, got);
        prop_assert!(rv_of(&got) >= rv, "{}: GET older than the write: {} vs {}", what, got, obj);
        prop_assert_eq!(&got["metadata"]["uid"], &obj["metadata"]["uid"], "{}", what);
        let after = h.list_rv(t.collection).await;
        prop_assert!(after >= rv, "{what}: list at {after} behind the write at {rv}");
    }
    Ok(())
}

/// Creates `a` of every resource, so updates and patches reach stored objects.
async fn seed(h: &Harness) {
    for t in &TARGETS {
        let (code, body) = h
            .send(reqwest::Method::POST, t.collection, "application/json", {
                Some(serde_json::to_vec(&(t.valid)("a")).unwrap())
            })
            .await
            .unwrap();
        // Both event groups are views of one store: the second `a` already exists.
        assert!(code == 201 || code == 409, "{}: {}", t.collection, String::from_utf8_lossy(&body));
    }
}

/// The store is sound after the run: every collection lists, a watch from the list revision
/// sees a following valid write, and that write is readable.
async fn check_sound(h: &Harness) {
    for (i, t) in TARGETS.iter().enumerate() {
        let rv = h.list_rv(t.collection).await;
        let resp = h
            .http
            .get(h.url(&format!("{}?watch=true&resourceVersion={rv}", t.collection)))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{}", t.collection);
        let mut stream = resp.bytes_stream();
        let name = format!("after-{i}");
        let (code, body) = h
            .send(
                reqwest::Method::POST,
                t.collection,
                "application/json",
                Some(serde_json::to_vec(&(t.valid)(&name)).unwrap()),
            )
            .await
            .unwrap();
        assert_eq!(code, 201, "{}: {}", t.collection, String::from_utf8_lossy(&body));
        let created: Value = serde_json::from_slice(&body).unwrap();
        assert!(rv_of(&created) > rv, "{}: {created}", t.collection);
        let mut buf = Vec::new();
        let seen = tokio::time::timeout(WAIT, async {
            while let Some(Ok(chunk)) = stream.next().await {
                buf.extend_from_slice(&chunk);
                for line in buf.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                    let Ok(e) = serde_json::from_slice::<Value>(line) else { continue };
                    if e["type"] == "ADDED" && e["object"]["metadata"]["name"] == name.as_str() {
                        return true;
                    }
                }
            }
            false
        })
        .await;
        assert_eq!(seen, Ok(true), "{}: watch did not deliver {name}", t.collection);
        let (code, got) = h.get(&format!("{}/{name}", t.collection)).await;
        assert_eq!(code, 200, "{}: {got}", t.collection);
    }
}

#[test]
fn random_bodies_get_4xx_statuses_and_leave_the_store_sound() {
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let h = rt.block_on(Harness::seeded());
    // KJOB_FUZZ_CASES runs a longer search by hand; the default keeps the test a few seconds.
    let cases = std::env::var("KJOB_FUZZ_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(160);
    let cfg = ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() };
    let mut runner = TestRunner::new(cfg);
    runner
        .run(&proptest::collection::vec(req(), 1..8), |reqs| rt.block_on(run_case(&h, reqs)))
        .unwrap();
    let (accepted, refused) =
        (h.accepted.load(Ordering::Relaxed), h.refused.load(Ordering::Relaxed));
    eprintln!("fuzzed requests: {accepted} accepted, {refused} refused");
    assert!(accepted > 0 && refused > 0, "accepted {accepted}, refused {refused}");
    rt.block_on(check_sound(&h));
}

#[test]
fn empty_huge_and_mistyped_bodies_are_rejected_with_statuses() {
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let h = Harness::seeded().await;
        // Over the 3 MiB request limit: 413, as a Status.
        let huge = vec![b' '; 4 * 1024 * 1024];
        for t in &TARGETS {
            for (method, path) in [
                (reqwest::Method::POST, t.collection.to_owned()),
                (reqwest::Method::PUT, format!("{}/a", t.collection)),
                (reqwest::Method::PATCH, format!("{}/a", t.collection)),
            ] {
                let ct = if method == reqwest::Method::PATCH {
                    "application/merge-patch+json"
                } else {
                    "application/json"
                };
                let what = format!("{method} {path}");
                let (code, body) =
                    h.send(method.clone(), &path, ct, Some(huge.clone())).await.unwrap();
                assert_eq!(code, 413, "{what}");
                check_answer(&what, code, &body).unwrap();
                let (code, body) =
                    h.send(method.clone(), &path, ct, Some(Vec::new())).await.unwrap();
                assert_eq!(code, 400, "{what} (empty)");
                check_answer(&what, code, &body).unwrap();
                // A large but allowed body: a 1 MiB annotation is accepted or refused, never a
                // crash.
                let mut big = (t.valid)("a");
                big["metadata"]["annotations"] = json!({"big": "x".repeat(1 << 20)});
                let (code, body) = h
                    .send(method, &path, ct, Some(serde_json::to_vec(&big).unwrap()))
                    .await
                    .unwrap();
                check_answer(&what, code, &body).unwrap();
            }
            // A patch with a content type no patch engine takes: 415.
            let (code, body) = h
                .send(
                    reqwest::Method::PATCH,
                    &format!("{}/a", t.collection),
                    "text/plain",
                    Some(b"{}".to_vec()),
                )
                .await
                .unwrap();
            assert_eq!(code, 415, "{}", t.collection);
            check_answer(t.collection, code, &body).unwrap();
        }
        check_sound(&h).await;
    });
}
