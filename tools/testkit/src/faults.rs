//! API-server faults with one vocabulary for both servers: kjob-sim takes them at its
//! `/sim/faults` hook, the real kube-apiserver through [`crate::proxy::FaultProxy`] in front of
//! it. The decisions (which request is refused, which one waits) are pure functions here, so
//! they are tested without a server.

use std::time::Duration;

use kjob_sim::resources::request_verb;

/// Faults an API server injects, set all at once (a field left at its default turns that fault
/// off). The same semantics as kjob-sim's `/sim/faults`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ApiFaults {
    /// Share (0..=1) of resource requests answered `429 TooManyRequests` with
    /// `Retry-After: 1` and `details.retryAfterSeconds: 1`, as priority and fairness does.
    pub error429: f64,
    /// Share of resource requests answered `500 InternalError`.
    pub error500: f64,
    /// Share of resource requests answered `503 ServiceUnavailable`.
    pub error503: f64,
    /// Latency added before every write (create, update, patch, delete).
    pub write_latency: Duration,
    /// Latency added before every read (get, list, and the start of a watch).
    pub read_latency: Duration,
    /// Resources the write latency applies to, by qualified name (`pods`, `jobs.batch`);
    /// empty: every resource.
    pub latency_resources: Vec<String>,
}

impl ApiFaults {
    /// No faults at all.
    pub fn none() -> Self {
        Self::default()
    }

    /// Every write waits `latency`.
    pub fn write_latency(latency: Duration) -> Self {
        Self { write_latency: latency, ..Self::default() }
    }

    /// A share of requests refused with 429 and another with 500.
    pub fn errors(error429: f64, error500: f64) -> Self {
        Self { error429, error500, ..Self::default() }
    }

    /// The body of kjob-sim's `POST /sim/faults` that sets exactly these faults.
    pub fn sim_json(&self) -> String {
        serde_json::json!({
            "error429": self.error429,
            "error500": self.error500,
            "error503": self.error503,
            "writeLatencyMs": self.write_latency.as_millis() as u64,
            "readLatencyMs": self.read_latency.as_millis() as u64,
            "latencyResources": self.latency_resources,
        })
        .to_string()
    }
}

/// What a request to the API is, as far as faults care (kube-apiserver's RequestInfo, cut down).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiRequest {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete` or `deletecollection`.
    pub verb: &'static str,
    /// Qualified resource: `pods`, `jobs.batch`, `leases.coordination.k8s.io`.
    pub resource: String,
    /// Subresource (`status`, `eviction`, `binding`), if any.
    pub subresource: Option<String>,
}

impl ApiRequest {
    /// Whether it changes state (faults' "write").
    pub fn is_write(&self) -> bool {
        !matches!(self.verb, "get" | "list" | "watch")
    }

    /// Whether it opens a watch stream.
    pub fn is_watch(&self) -> bool {
        self.verb == "watch"
    }
}

// Subresources of a namespace itself, not resources inside it (upstream's
// `namespaceSubresources`).
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

/// Parses a request into an [`ApiRequest`]; `None` for everything that is not a resource
/// request (discovery, `/version`, `/healthz`, `/openapi`), which faults never touch, as on
/// kjob-sim.
pub fn classify(method: &str, path: &str, query: &str) -> Option<ApiRequest> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group, mut rest) = match segs.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let mut watch_path = false;
    if rest.first() == Some(&"watch") {
        watch_path = true;
        rest = &rest[1..];
    }
    if rest.first() == Some(&"namespaces")
        && rest.len() > 2
        && !NAMESPACE_SUBRESOURCES.contains(&rest[2])
    {
        rest = &rest[2..];
    }
    let (resource, name, subresource) = match rest {
        [] => return None,
        [res] => (*res, None, None),
        [res, name] => (*res, Some(*name), None),
        [res, name, sub, ..] => (*res, Some(*name), Some(sub.to_string())),
    };
    let watch_param = query.split('&').any(|kv| kv == "watch=true" || kv == "watch=1");
    let verb = request_verb(method, name.is_some(), watch_path || watch_param)?;
    let resource =
        if group.is_empty() { resource.to_string() } else { format!("{resource}.{group}") };
    Some(ApiRequest { verb, resource, subresource })
}

/// What to do with one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Answer with this injected error code (429, 500 or 503) without forwarding.
    Refuse(u16),
    /// Forward it after waiting this long.
    Forward(Duration),
}

/// One million: draws and shares are in parts per million, as on kjob-sim (no float sums).
pub const PPM: u64 = 1_000_000;

fn ppm(share: f64) -> u64 {
    (share.clamp(0.0, 1.0) * PPM as f64).round() as u64
}

/// The fate of `req` under `faults`, given a uniform `draw` in `0..PPM`: errors first (429, then
/// 500, then 503, each taking its share of the draw), else the latency of its kind.
pub fn decide(faults: &ApiFaults, req: &ApiRequest, draw: u64) -> Decision {
    let mut edge = 0;
    for (share, code) in [(faults.error429, 429), (faults.error500, 500), (faults.error503, 503)] {
        edge += ppm(share);
        if draw < edge {
            return Decision::Refuse(code);
        }
    }
    if !req.is_write() {
        return Decision::Forward(faults.read_latency);
    }
    let filtered =
        !faults.latency_resources.is_empty() && !faults.latency_resources.contains(&req.resource);
    Decision::Forward(if filtered { Duration::ZERO } else { faults.write_latency })
}

/// Seconds a client is told to wait after an injected 429 (kube-apiserver's priority and
/// fairness says 1).
pub const RETRY_AFTER_SECONDS: u64 = 1;

/// The metav1.Status body kube-apiserver sends with `code`, and the `Retry-After` value to send
/// beside it (429 only).
pub fn status_body(code: u16) -> (serde_json::Value, Option<u64>) {
    let (reason, message, details, retry) = match code {
        429 => (
            "TooManyRequests",
            "Too many requests, please try again later.".to_string(),
            serde_json::json!({"retryAfterSeconds": RETRY_AFTER_SECONDS}),
            Some(RETRY_AFTER_SECONDS),
        ),
        503 => (
            "ServiceUnavailable",
            "the server is currently unable to handle the request (injected)".to_string(),
            serde_json::json!({}),
            None,
        ),
        _ => (
            "InternalError",
            "Internal error occurred: injected failure".to_string(),
            serde_json::json!({"causes": [{"message": "injected failure"}]}),
            None,
        ),
    };
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": details,
        "code": code,
    });
    (body, retry)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(verb: &'static str, resource: &str, sub: Option<&str>) -> Option<ApiRequest> {
        Some(ApiRequest { verb, resource: resource.into(), subresource: sub.map(String::from) })
    }

    #[test]
    fn classify_parses_paths_like_kube_apiserver() {
        let cases = [
            ("GET", "/api", "", None),
            ("GET", "/api/v1", "", None),
            ("GET", "/apis/batch/v1", "", None),
            ("GET", "/version", "", None),
            ("GET", "/healthz", "", None),
            ("GET", "/api/v1/namespaces/ns/pods", "", req("list", "pods", None)),
            ("GET", "/api/v1/namespaces/ns/pods", "watch=true&rv=1", req("watch", "pods", None)),
            ("GET", "/api/v1/namespaces/ns/pods", "a=b&watch=1", req("watch", "pods", None)),
            ("GET", "/api/v1/namespaces/ns/pods", "watch=false", req("list", "pods", None)),
            ("GET", "/api/v1/watch/namespaces/ns/pods", "", req("watch", "pods", None)),
            ("GET", "/api/v1/namespaces/ns/pods/p", "", req("get", "pods", None)),
            ("POST", "/api/v1/namespaces/ns/pods", "", req("create", "pods", None)),
            (
                "PATCH",
                "/api/v1/namespaces/ns/pods/p/status",
                "",
                req("patch", "pods", Some("status")),
            ),
            (
                "POST",
                "/api/v1/namespaces/ns/pods/p/eviction",
                "",
                req("create", "pods", Some("eviction")),
            ),
            ("DELETE", "/api/v1/namespaces/ns/pods/p", "", req("delete", "pods", None)),
            ("DELETE", "/api/v1/namespaces/ns/pods", "", req("deletecollection", "pods", None)),
            (
                "PUT",
                "/apis/batch/v1/namespaces/ns/jobs/j/status",
                "",
                req("update", "jobs.batch", Some("status")),
            ),
            ("GET", "/apis/batch/v1/jobs", "watch=true", req("watch", "jobs.batch", None)),
            (
                "PUT",
                "/apis/coordination.k8s.io/v1/namespaces/kjob-system/leases/l",
                "",
                req("update", "leases.coordination.k8s.io", None),
            ),
            ("GET", "/api/v1/namespaces", "", req("list", "namespaces", None)),
            ("GET", "/api/v1/namespaces/ns", "", req("get", "namespaces", None)),
            (
                "PUT",
                "/api/v1/namespaces/ns/finalize",
                "",
                req("update", "namespaces", Some("finalize")),
            ),
            ("GET", "/api/v1/namespaces/ns/status", "", req("get", "namespaces", Some("status"))),
            ("OPTIONS", "/api/v1/namespaces/ns/pods", "", None),
        ];
        for (method, path, query, want) in cases {
            assert_eq!(classify(method, path, query), want, "{method} {path}?{query}");
        }
    }

    #[test]
    fn decide_splits_the_draw_between_error_codes_then_latency() {
        let f = ApiFaults {
            error429: 0.1,
            error500: 0.2,
            error503: 0.05,
            write_latency: Duration::from_millis(300),
            read_latency: Duration::from_millis(7),
            latency_resources: vec![],
        };
        let write = req("create", "pods", None).unwrap();
        let read = req("watch", "pods", None).unwrap();
        let cases = [
            (0, &write, Decision::Refuse(429)),
            (99_999, &write, Decision::Refuse(429)),
            (100_000, &write, Decision::Refuse(500)),
            (299_999, &read, Decision::Refuse(500)),
            (300_000, &read, Decision::Refuse(503)),
            (349_999, &write, Decision::Refuse(503)),
            (350_000, &write, Decision::Forward(Duration::from_millis(300))),
            (PPM - 1, &read, Decision::Forward(Duration::from_millis(7))),
        ];
        for (draw, r, want) in cases {
            assert_eq!(decide(&f, r, draw), want, "draw {draw} {r:?}");
        }
    }

    #[test]
    fn no_faults_forward_everything_at_once() {
        for verb in ["get", "list", "watch", "create", "update", "patch", "delete"] {
            let r = req(verb, "pods", None).unwrap();
            assert_eq!(decide(&ApiFaults::none(), &r, 0), Decision::Forward(Duration::ZERO));
        }
    }

    #[test]
    fn write_latency_can_be_limited_to_some_resources() {
        let f = ApiFaults {
            write_latency: Duration::from_millis(50),
            latency_resources: vec!["jobs.batch".into()],
            ..ApiFaults::default()
        };
        let job_status = req("update", "jobs.batch", Some("status")).unwrap();
        let pod_create = req("create", "pods", None).unwrap();
        let job_get = req("get", "jobs.batch", None).unwrap();
        assert_eq!(decide(&f, &job_status, 500_000), Decision::Forward(Duration::from_millis(50)));
        assert_eq!(decide(&f, &pod_create, 500_000), Decision::Forward(Duration::ZERO));
        assert_eq!(decide(&f, &job_get, 500_000), Decision::Forward(Duration::ZERO));
    }

    #[test]
    fn status_bodies_are_the_ones_kube_apiserver_sends() {
        let (body, retry) = status_body(429);
        assert_eq!(retry, Some(1));
        assert_eq!(body["reason"], "TooManyRequests");
        assert_eq!(body["details"]["retryAfterSeconds"], 1);
        assert_eq!(body["code"], 429);
        assert_eq!(body["kind"], "Status");
        let (body, retry) = status_body(500);
        assert_eq!((body["reason"].as_str(), retry), (Some("InternalError"), None));
        let (body, _) = status_body(503);
        assert_eq!(body["reason"], "ServiceUnavailable");
        assert_eq!(body["status"], "Failure");
    }

    #[test]
    fn sim_json_sets_every_knob() {
        let f = ApiFaults {
            error429: 0.25,
            write_latency: Duration::from_millis(300),
            latency_resources: vec!["pods".into()],
            ..ApiFaults::default()
        };
        let v: serde_json::Value = serde_json::from_str(&f.sim_json()).unwrap();
        assert_eq!(v["error429"], 0.25);
        assert_eq!(v["error500"], 0.0);
        assert_eq!(v["writeLatencyMs"], 300);
        assert_eq!(v["readLatencyMs"], 0);
        assert_eq!(v["latencyResources"], serde_json::json!(["pods"]));
    }
}
