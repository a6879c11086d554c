//! Wire-level semantics checked with raw HTTP: the resourceVersion matrix, watch ERROR events,
//! bookmarks, error Status shapes, strict field validation, event views, leases, hooks.

use std::time::Duration;

use futures::StreamExt;
use kjob_sim::SimConfig;
use serde_json::{Value, json};
use wire::{WAIT, Wire};

mod wire;

struct H(Wire);

impl std::ops::Deref for H {
    type Target = Wire;

    fn deref(&self) -> &Wire {
        &self.0
    }
}

impl H {
    async fn start(config: SimConfig) -> H {
        H(Wire::start(config).await)
    }

    /// Sends `body` (JSON, with its content type) when given; the answer as JSON, or as a
    /// string when it is not JSON.
    async fn json(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<(&str, Value)>,
    ) -> (u16, Value) {
        let (ct, body) = body.map_or(("", None), |(ct, b)| (ct, Some(b.to_string().into_bytes())));
        let (code, bytes) = self.send(method, path, ct, body).await.unwrap();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        (code, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.json(reqwest::Method::GET, path, None).await
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.json(reqwest::Method::POST, path, Some(("application/json", body))).await
    }

    async fn pod(&self, ns: &str, name: &str) -> Value {
        let body = json!({"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "x"}]}});
        let (code, v) = self.post(&format!("/api/v1/namespaces/{ns}/pods"), body).await;
        assert_eq!(code, 201, "{v}");
        v
    }

    /// Reads watch lines until `n` lines arrived or the stream ended.
    async fn watch_lines(&self, path: &str, n: usize) -> (u16, Vec<Value>) {
        let resp =
            self.http.get(self.url(path)).timeout(Duration::from_secs(60)).send().await.unwrap();
        let code = resp.status().as_u16();
        let mut stream = resp.bytes_stream();
        let mut buf = Vec::new();
        let mut out = Vec::new();
        while out.len() < n {
            match tokio::time::timeout(WAIT, stream.next()).await.expect("watch data in time") {
                Some(chunk) => buf.extend_from_slice(&chunk.unwrap()),
                None => break,
            }
            while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=pos).collect();
                out.push(serde_json::from_slice(&line).unwrap());
            }
        }
        (code, out)
    }
}

fn rv(v: &Value) -> u64 {
    v["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap()
}

#[tokio::test]
async fn expired_watch_is_http_200_with_one_error_event() {
    let h = H::start(SimConfig::default()).await;
    let p = h.pod("default", "a").await;
    h.pod("default", "b").await;
    h.sim.compact();
    let (code, lines) = h
        .watch_lines(
            &format!("/api/v1/namespaces/default/pods?watch=true&resourceVersion={}", rv(&p)),
            5,
        )
        .await;
    assert_eq!(code, 200);
    assert_eq!(lines.len(), 1, "one ERROR event then end of stream: {lines:?}");
    assert_eq!(lines[0]["type"], "ERROR");
    assert_eq!(lines[0]["object"]["code"], 410);
    assert_eq!(lines[0]["object"]["reason"], "Expired");
}

#[tokio::test]
async fn watch_replays_after_rv_and_sends_bookmarks() {
    let config = SimConfig { bookmark_interval: Duration::from_millis(200), ..Default::default() };
    let h = H::start(config).await;
    let a = h.pod("default", "a").await;
    h.pod("default", "b").await;
    let path = format!("/api/v1/pods?watch=1&allowWatchBookmarks=true&resourceVersion={}", rv(&a));
    let (_, lines) = h.watch_lines(&path, 2).await;
    assert_eq!(lines[0]["type"], "ADDED");
    assert_eq!(lines[0]["object"]["metadata"]["name"], "b");
    assert_eq!(lines[1]["type"], "BOOKMARK");
    assert_eq!(lines[1]["object"]["kind"], "Pod");
    assert_eq!(lines[1]["object"]["apiVersion"], "v1");
    assert!(rv(&lines[1]["object"]) > rv(&a));
    // Without a resourceVersion: synthetic ADDED for current objects first.
    let (_, lines) =
        h.watch_lines("/api/v1/namespaces/default/pods?watch=true&timeoutSeconds=1", 3).await;
    assert_eq!(lines.len(), 2, "two ADDED then the server timeout ends the stream: {lines:?}");
    assert!(lines.iter().all(|l| l["type"] == "ADDED"));
    // Streaming list: ADDED then the end-marker bookmark.
    let path = "/api/v1/namespaces/default/pods?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&resourceVersion=0";
    let (_, lines) = h.watch_lines(path, 3).await;
    assert_eq!(lines[2]["type"], "BOOKMARK");
    assert_eq!(lines[2]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"], "true");
}

#[tokio::test]
async fn list_resource_version_matrix() {
    let h = H::start(SimConfig::default()).await;
    let a = h.pod("default", "a").await;
    h.pod("default", "b").await;
    h.pod("default", "c").await;
    let base = "/api/v1/namespaces/default/pods";
    // RV=0 ignores limit.
    let (_, v) = h.get(&format!("{base}?resourceVersion=0&limit=1")).await;
    assert_eq!(v["items"].as_array().unwrap().len(), 3);
    assert!(v["metadata"].get("continue").is_none());
    // Exact at an older revision reads history.
    let (code, v) =
        h.get(&format!("{base}?resourceVersion={}&resourceVersionMatch=Exact", rv(&a))).await;
    assert_eq!(code, 200);
    assert_eq!(v["items"].as_array().unwrap().len(), 1);
    assert_eq!(v["metadata"]["resourceVersion"], rv(&a).to_string());
    // Legacy: RV=N with a limit is Exact too.
    let (_, v) = h.get(&format!("{base}?resourceVersion={}&limit=10", rv(&a))).await;
    assert_eq!(v["items"].as_array().unwrap().len(), 1);
    // Option validation.
    let (code, v) = h.get(&format!("{base}?resourceVersionMatch=Exact")).await;
    assert_eq!((code, v["reason"].as_str()), (422, Some("Invalid")));
    let (code, _) = h.get(&format!("{base}?resourceVersion=0&resourceVersionMatch=Exact")).await;
    assert_eq!(code, 422);
    let (code, _) = h.get(&format!("{base}?continue=abc&resourceVersion=5")).await;
    assert_eq!(code, 400);
    // Too old once compacted.
    h.sim.compact();
    let (code, v) =
        h.get(&format!("{base}?resourceVersion={}&resourceVersionMatch=Exact", rv(&a))).await;
    assert_eq!((code, v["reason"].as_str()), (410, Some("Expired")));
    // Too new: 504 after the wait.
    let (code, v) = h.get(&format!("{base}/a?resourceVersion=999999")).await;
    assert_eq!((code, v["reason"].as_str()), (504, Some("Timeout")));
    // Bad selectors are 400.
    let (code, v) = h.get(&format!("{base}?fieldSelector=spec.foo%3Dx")).await;
    assert_eq!(code, 400);
    assert_eq!(v["message"], "field label not supported: spec.foo");
    let (code, _) = h.get(&format!("{base}?labelSelector=a%20in%20(")).await;
    assert_eq!(code, 400);
}

#[tokio::test]
async fn error_shapes_and_body_rules() {
    let h = H::start(SimConfig::default()).await;
    let (code, v) = h.get("/apis/apps/v1/deployments").await;
    assert_eq!(code, 404);
    assert_eq!(v["message"], "the server could not find the requested resource");
    let (code, v) = h.get("/apis/batch/v1/namespaces/default/jobs/nope").await;
    assert_eq!(code, 404);
    assert_eq!(
        v,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "jobs.batch \"nope\" not found", "reason": "NotFound",
               "details": {"name": "nope", "group": "batch", "kind": "jobs"}, "code": 404})
    );
    h.pod("default", "a").await;
    let (code, v) = h
        .json(
            reqwest::Method::PATCH,
            "/api/v1/namespaces/default/pods/a",
            Some(("text/plain", json!({}))),
        )
        .await;
    assert_eq!((code, v["reason"].as_str()), (415, Some("UnsupportedMediaType")));
    let body = json!({"metadata": {"name": "s", "bogus": 1}, "spec": {"containers": [{"name": "c", "image": "x"}]}});
    let (code, v) =
        h.post("/api/v1/namespaces/default/pods?fieldValidation=Strict", body.clone()).await;
    assert_eq!(code, 400);
    assert!(v["message"].as_str().unwrap().contains("unknown field \"metadata.bogus\""), "{v}");
    let (code, v) = h.post("/api/v1/namespaces/default/pods", body).await;
    assert_eq!(code, 201);
    assert!(v["metadata"].get("bogus").is_none());
    let wrong_ns = json!({"metadata": {"name": "n", "namespace": "kube-system"}, "spec": {"containers": [{"name": "c", "image": "x"}]}});
    let (code, _) = h.post("/api/v1/namespaces/default/pods", wrong_ns).await;
    assert_eq!(code, 400);
    let (code, v) =
        h.post("/api/v1/namespaces/nowhere/pods", json!({"metadata": {"name": "x"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}))
        .await;
    assert_eq!(code, 404, "{v}");
    // A JSON patch whose test fails is 422 Invalid; a test of null on a missing key passes.
    let jp = "application/json-patch+json";
    let (code, _) = h
        .json(
            reqwest::Method::PATCH,
            "/api/v1/namespaces/default/pods/a",
            Some((jp, json!([{"op": "test", "path": "/metadata/labels", "value": {"x": "y"}}]))),
        )
        .await;
    assert_eq!(code, 422);
    let (code, v) = h
        .json(
            reqwest::Method::PATCH,
            "/api/v1/namespaces/default/pods/a",
            Some((
                jp,
                json!([{"op": "test", "path": "/metadata/finalizers", "value": null},
                           {"op": "add", "path": "/metadata/finalizers", "value": ["a.io/b"]}]),
            )),
        )
        .await;
    assert_eq!(code, 200, "{v}");
    // Deleting a pod returns the pod; deleting a job returns a Status.
    let (code, v) =
        h.json(reqwest::Method::DELETE, "/api/v1/namespaces/default/pods/a", None).await;
    assert_eq!(code, 200);
    assert_eq!(v["kind"], "Pod");
    assert!(v["metadata"]["deletionTimestamp"].is_string());
}

#[tokio::test]
async fn events_share_one_store_and_leases_create_on_put() {
    let h = H::start(SimConfig::default()).await;
    let ev = json!({"metadata": {"name": "e1"}, "eventTime": "2025-01-01T00:00:00.5Z", "action": "A", "reason": "R",
        "type": "Normal", "note": "n", "regarding": {"kind": "Pod", "name": "p", "namespace": "default"},
        "reportingController": "kjob.io/x", "reportingInstance": "i"});
    let (code, v) = h.post("/apis/events.k8s.io/v1/namespaces/default/events", ev).await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["eventTime"], "2025-01-01T00:00:00.500000Z");
    let (_, v) = h.get("/api/v1/namespaces/default/events/e1").await;
    assert_eq!(v["apiVersion"], "v1");
    assert_eq!(v["message"], "n");
    assert_eq!(v["involvedObject"]["name"], "p");
    let (_, v) = h.get("/api/v1/events?fieldSelector=involvedObject.name%3Dp").await;
    assert_eq!(v["items"].as_array().unwrap().len(), 1);
    let lease = json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "me", "leaseDurationSeconds": 15}});
    let path = "/apis/coordination.k8s.io/v1/namespaces/default/leases/l";
    let (code, v) =
        h.json(reqwest::Method::PUT, path, Some(("application/json", lease.clone()))).await;
    assert_eq!(code, 201, "{v}");
    let (code, _) = h.json(reqwest::Method::PUT, path, Some(("application/json", lease))).await;
    assert_eq!(code, 422, "leases refuse unconditional updates");
    let mut stale = v.clone();
    stale["metadata"]["resourceVersion"] = json!("1");
    let (code, v) = h.json(reqwest::Method::PUT, path, Some(("application/json", stale))).await;
    assert_eq!((code, v["reason"].as_str()), (409, Some("Conflict")));
}

#[tokio::test]
async fn hooks_inject_faults_and_count_requests() {
    let h = H::start(SimConfig::default()).await;
    let (code, _) = h.post("/sim/faults", json!({"error429": 1.0})).await;
    assert_eq!(code, 200);
    let (code, v) = h.get("/api/v1/namespaces/default/pods").await;
    assert_eq!((code, v["reason"].as_str()), (429, Some("TooManyRequests")));
    h.post("/sim/faults", json!({"error429": 0.0, "writeLatencyMs": 200})).await;
    let start = std::time::Instant::now();
    h.pod("default", "slow").await;
    assert!(start.elapsed() >= Duration::from_millis(200));
    let (code, v) = h.get("/sim/state").await;
    assert_eq!(code, 200);
    assert_eq!(v["objects"]["pods"], 1);
    let text = h.http.get(h.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(
        text.contains(
            "kjob_sim_apiserver_requests_total{verb=\"list\",resource=\"pods\",code=\"429\"} 1"
        ),
        "{text}"
    );
    let (code, _) = h.post("/sim/kubelet/pause", json!({})).await;
    assert_eq!(code, 400, "no kubelet with --kubelet off");
}

#[tokio::test]
async fn pod_quota_fault_refuses_only_pod_creates() {
    let h = H::start(SimConfig::default()).await;
    h.pod("default", "before").await;
    let (code, v) = h.post("/sim/faults", json!({"podQuotaExceeded": true})).await;
    assert_eq!((code, &v["podQuotaExceeded"]), (200, &json!(true)));
    let body = json!({"metadata": {"name": "refused"}, "spec": {"containers": [{"name": "c", "image": "x"}]}});
    let (code, v) = h.post("/api/v1/namespaces/default/pods", body.clone()).await;
    assert_eq!((code, v["reason"].as_str()), (403, Some("Forbidden")), "{v}");
    assert!(v["message"].as_str().unwrap().contains("exceeded quota"), "{v}");
    let (code, _) = h.get("/api/v1/namespaces/default/pods/before").await;
    assert_eq!(code, 200, "reads go through");
    let (code, _) = h.post("/sim/faults", json!({"podQuotaExceeded": "yes"})).await;
    assert_eq!(code, 400);
    h.post("/sim/faults", json!({"podQuotaExceeded": false})).await;
    let (code, _) = h.post("/api/v1/namespaces/default/pods", body).await;
    assert_eq!(code, 201);
}

/// `in` and `notin` are words wherever a key or value is expected, as a real server parses them.
#[tokio::test]
async fn label_selectors_take_in_and_notin_as_values() {
    let h = H::start(SimConfig::default()).await;
    let body = json!({"metadata": {"name": "g", "labels": {"grp": "in"}},
                      "spec": {"containers": [{"name": "c", "image": "x"}]}});
    let (code, _) = h.post("/api/v1/namespaces/default/pods", body).await;
    assert_eq!(code, 201);
    for (sel, want) in [("grp%3Din", 1), ("grp+in+(in,notin)", 1), ("grp+notin+(in)", 0)] {
        let (code, v) =
            h.get(&format!("/api/v1/namespaces/default/pods?labelSelector={sel}")).await;
        assert_eq!(code, 200, "{sel}: {v}");
        assert_eq!(v["items"].as_array().unwrap().len(), want, "{sel}");
    }
}

#[tokio::test]
async fn a_bookmark_precedes_the_watch_timeout() {
    let h = H::start(SimConfig::default()).await;
    let start = std::time::Instant::now();
    let path = "/api/v1/namespaces/default/pods?watch=true&allowWatchBookmarks=true&timeoutSeconds=3&resourceVersion=1";
    let (_, lines) = h.watch_lines(path, 5).await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["type"], "BOOKMARK");
    assert!(start.elapsed() >= Duration::from_secs(3), "the stream ends at the timeout");
}

/// Lists are joined from stored encodings (streamed in chunks when large): every item must be
/// byte-for-byte what a GET of it returns, carry its own resourceVersion, and an exact-revision
/// list must send the older state's own encoding.
#[tokio::test]
async fn large_lists_join_each_items_stored_encoding() {
    let h = H::start(SimConfig::default()).await;
    let base = "/api/v1/namespaces/default/pods";
    // 300 pods of about 2 KiB each: well over the 256 KiB chunk, so the body is streamed.
    let filler = "x".repeat(2048);
    for i in 0..300 {
        let body = json!({
            "metadata": {"name": format!("p{i:03}"), "labels": {"app": "big"}, "annotations": {"fill": filler}},
            "spec": {"containers": [{"name": "c", "image": "x"}]}
        });
        let (code, v) = h.post(base, body).await;
        assert_eq!(code, 201, "{v}");
    }
    let resp = h.http.get(h.url(base)).send().await.unwrap();
    assert_eq!(resp.headers()["content-type"], "application/json");
    let raw = resp.text().await.unwrap();
    assert!(raw.len() > 600 * 1024, "body of {} bytes", raw.len());
    assert!(
        raw.starts_with(r#"{"kind":"PodList","apiVersion":"v1","metadata":{"#),
        "{}",
        &raw[..80]
    );
    let list: Value = serde_json::from_str(&raw).unwrap();
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 300);
    let before = items[7].clone();
    // Each item is exactly the stored object a GET answers with.
    for i in [0usize, 7, 150, 299] {
        let got = h.http.get(h.url(&format!("{base}/p{i:03}"))).send().await.unwrap();
        let got: Value = serde_json::from_str(&got.text().await.unwrap()).unwrap();
        assert_eq!(items[i], got);
    }
    let list_rv = rv(&list);
    assert!(items.iter().all(|o| rv(o) <= list_rv));
    // Change one pod: the latest list carries its new encoding, an exact list at the old
    // revision the old one.
    let patch = h
        .http
        .patch(h.url(&format!("{base}/p007")))
        .header("content-type", "application/merge-patch+json")
        .body(r#"{"metadata":{"labels":{"app":"big","changed":"yes"}}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(patch.status().as_u16(), 200);
    let (_, now) = h.get(&format!("{base}?labelSelector=app%3Dbig")).await;
    let now7 = &now["items"][7];
    assert_eq!(now7["metadata"]["labels"]["changed"], "yes");
    assert!(rv(now7) > rv(&before));
    let (code, then) =
        h.get(&format!("{base}?resourceVersion={list_rv}&resourceVersionMatch=Exact")).await;
    assert_eq!(code, 200);
    assert_eq!(then["items"][7], before);
    assert_eq!(then["items"].as_array().unwrap().len(), 300);
    // Paging with large pages still hands out every item once, in order.
    let mut names = Vec::new();
    let mut cont = String::new();
    loop {
        let (_, page) = h.get(&format!("{base}?limit=130&continue={cont}")).await;
        names.extend(
            page["items"].as_array().unwrap().iter().map(|o| o["metadata"]["name"].clone()),
        );
        match page["metadata"]["continue"].as_str() {
            Some(c) => cont = c.to_owned(),
            None => break,
        }
    }
    let want: Vec<Value> = (0..300).map(|i| json!(format!("p{i:03}"))).collect();
    assert_eq!(names, want);
}
