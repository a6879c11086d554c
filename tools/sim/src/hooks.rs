//! Test and benchmark hooks under `/sim/...`, injected faults and latencies, and the request
//! counters served at `/metrics`.
//!
//! Hooks (all `POST` unless noted):
//! * `/sim/compact` — drop the watch history; watches from older revisions get 410.
//! * `/sim/close-watches` — end every open watch stream (clients re-watch).
//! * `/sim/faults` — body `{"error429": 0.1, "error500": 0.05, "error503": 0, "writeLatencyMs": 10,
//!   "readLatencyMs": 0, "latencyResources": ["pods"], "podQuotaExceeded": false}` (every field
//!   optional; `latencyResources` limits the write latency to those qualified resources, empty
//!   means all); `GET` shows the current settings. kjob-testkit's `ApiFaults` speaks this, and
//!   its fault proxy does the same in front of a real kube-apiserver.
//!   `podQuotaExceeded` refuses every pod create with the 403 a ResourceQuota of `pods: 0` gives.
//! * `/sim/kubelet/pause`, `/sim/kubelet/resume` — stop and restart the simulated kubelet.
//! * `/sim/evict/{namespace}/{name}` — evict a pod (`DisruptionTarget`, then graceful delete).
//! * `GET /sim/state` — current and compacted revision, object counts.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, Method, StatusCode, header};
use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use rand::Rng;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::resources::StoreKind;
use crate::server::App;
use crate::subresources::PodCall;

/// Injected faults: shares of 429 / 500 answers and per-request latencies.
#[derive(Debug)]
pub struct Faults {
    // Shares are stored as parts per million so reads need no lock.
    error429_ppm: AtomicU64,
    error500_ppm: AtomicU64,
    error503_ppm: AtomicU64,
    write_latency_us: AtomicU64,
    // Qualified resources the write latency applies to; empty: all.
    latency_resources: Mutex<Vec<String>>,
    read_latency_us: AtomicU64,
    pod_quota_exceeded: AtomicBool,
}

impl Faults {
    /// No errors, the given latencies.
    pub fn new(write: Duration, read: Duration) -> Self {
        Self {
            error429_ppm: AtomicU64::new(0),
            error500_ppm: AtomicU64::new(0),
            error503_ppm: AtomicU64::new(0),
            write_latency_us: AtomicU64::new(write.as_micros() as u64),
            latency_resources: Mutex::new(Vec::new()),
            read_latency_us: AtomicU64::new(read.as_micros() as u64),
            pod_quota_exceeded: AtomicBool::new(false),
        }
    }

    /// Latency added before every write of `resource` (qualified, e.g. `jobs.batch`).
    pub fn write_latency(&self, resource: &str) -> Duration {
        let only = self.latency_resources.lock();
        if !only.is_empty() && !only.iter().any(|r| r == resource) {
            return Duration::ZERO;
        }
        Duration::from_micros(self.write_latency_us.load(Ordering::Relaxed))
    }

    /// Latency added before every read.
    pub fn read_latency(&self) -> Duration {
        Duration::from_micros(self.read_latency_us.load(Ordering::Relaxed))
    }

    /// Draws an injected error for this request, if any.
    pub fn injected_error(&self) -> Option<ApiError> {
        let p429 = self.error429_ppm.load(Ordering::Relaxed);
        let p500 = self.error500_ppm.load(Ordering::Relaxed);
        let p503 = self.error503_ppm.load(Ordering::Relaxed);
        if p429 == 0 && p500 == 0 && p503 == 0 {
            return None;
        }
        let draw = rand::rng().random_range(0..1_000_000u64);
        if draw < p429 {
            Some(ApiError::too_many_requests())
        } else if draw < p429 + p500 {
            Some(ApiError::internal("injected failure"))
        } else if draw < p429 + p500 + p503 {
            Some(ApiError::service_unavailable())
        } else {
            None
        }
    }

    /// Turns the `podQuotaExceeded` fault on or off.
    pub fn set_pod_quota_exceeded(&self, on: bool) {
        self.pod_quota_exceeded.store(on, Ordering::Relaxed);
    }

    /// The refusal of a pod create when `podQuotaExceeded` is on (the answer of the
    /// ResourceQuota admission plugin in a namespace whose quota allows no more pods).
    pub fn quota_error(&self, verb: &str, resource: &str) -> Option<ApiError> {
        if verb != "create"
            || resource != "pods"
            || !self.pod_quota_exceeded.load(Ordering::Relaxed)
        {
            return None;
        }
        Some(ApiError::forbidden(
            "pods is forbidden: exceeded quota: sim-quota, requested: pods=1, used: pods=0, limited: pods=0",
        ))
    }

    fn set(&self, v: &Value) -> Result<(), ApiError> {
        let share = |k: &str| -> Result<Option<u64>, ApiError> {
            match v.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => match x.as_f64() {
                    Some(f) if (0.0..=1.0).contains(&f) => Ok(Some((f * 1_000_000.0) as u64)),
                    _ => {
                        Err(ApiError::bad_request(format!("{k} must be a number between 0 and 1")))
                    }
                },
            }
        };
        let ms = |k: &str| -> Result<Option<u64>, ApiError> {
            match v.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => x
                    .as_u64()
                    .map(Some)
                    .ok_or_else(|| ApiError::bad_request(format!("{k} must be milliseconds"))),
            }
        };
        let (e429, e500, e503) = (share("error429")?, share("error500")?, share("error503")?);
        let (w, r) = (ms("writeLatencyMs")?, ms("readLatencyMs")?);
        let resources = match v.get("latencyResources") {
            None | Some(Value::Null) => None,
            Some(Value::Array(a)) => Some(
                a.iter()
                    .map(|r| r.as_str().map(str::to_string))
                    .collect::<Option<Vec<String>>>()
                    .ok_or_else(|| {
                    ApiError::bad_request("latencyResources must be a list of strings")
                })?,
            ),
            Some(_) => {
                return Err(ApiError::bad_request("latencyResources must be a list of strings"));
            }
        };
        if let Some(x) = e429 {
            self.error429_ppm.store(x, Ordering::Relaxed);
        }
        if let Some(x) = e500 {
            self.error500_ppm.store(x, Ordering::Relaxed);
        }
        if let Some(x) = e503 {
            self.error503_ppm.store(x, Ordering::Relaxed);
        }
        if let Some(list) = resources {
            *self.latency_resources.lock() = list;
        }
        if let Some(x) = w {
            self.write_latency_us.store(x * 1000, Ordering::Relaxed);
        }
        if let Some(x) = r {
            self.read_latency_us.store(x * 1000, Ordering::Relaxed);
        }
        match v.get("podQuotaExceeded") {
            None | Some(Value::Null) => {}
            Some(Value::Bool(b)) => self.pod_quota_exceeded.store(*b, Ordering::Relaxed),
            Some(_) => return Err(ApiError::bad_request("podQuotaExceeded must be a boolean")),
        }
        Ok(())
    }

    fn show(&self) -> Value {
        json!({
            "error429": self.error429_ppm.load(Ordering::Relaxed) as f64 / 1e6,
            "error500": self.error500_ppm.load(Ordering::Relaxed) as f64 / 1e6,
            "error503": self.error503_ppm.load(Ordering::Relaxed) as f64 / 1e6,
            "latencyResources": *self.latency_resources.lock(),
            "writeLatencyMs": self.write_latency_us.load(Ordering::Relaxed) / 1000,
            "readLatencyMs": self.read_latency_us.load(Ordering::Relaxed) / 1000,
            "podQuotaExceeded": self.pod_quota_exceeded.load(Ordering::Relaxed),
        })
    }
}

/// Labels of the request counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// API verb (get, list, watch, create, update, patch, delete, deletecollection).
    pub verb: String,
    /// Qualified resource (`pods`, `jobs.batch`).
    pub resource: String,
    /// HTTP status code.
    pub code: String,
}

/// Labels of the per-client request counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AgentLabels {
    /// The client's User-Agent product (before the first '/'), `unknown` without one.
    pub agent: String,
}

/// Longest agent label kept: a product name, never a whole header.
const MAX_AGENT_LEN: usize = 64;

/// The User-Agent product of a request (as kube-apiserver names a field manager after it):
/// `kjob-worker` for `kjob-worker/0.1.0`; `unknown` without one.
pub fn agent_of(headers: &http::HeaderMap) -> String {
    let ua = headers.get(header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let product: String =
        ua.split('/').next().unwrap_or_default().chars().take(MAX_AGENT_LEN).collect();
    if product.is_empty() { "unknown".to_string() } else { product }
}

/// Request counters per verb, resource and code, and per client.
pub struct Metrics {
    registry: Mutex<Registry>,
    requests: Family<RequestLabels, Counter>,
    by_agent: Family<AgentLabels, Counter>,
}

impl Metrics {
    /// A fresh registry with the request counter.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("kjob_sim");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "apiserver_requests",
            "API requests by verb, resource and HTTP code",
            requests.clone(),
        );
        let by_agent = Family::<AgentLabels, Counter>::default();
        registry.register(
            "apiserver_requests_by_agent",
            "API requests by the client's User-Agent product (kjob-worker, kjob-watcher, …)",
            by_agent.clone(),
        );
        Self { registry: Mutex::new(registry), requests, by_agent }
    }

    /// Counts one request of client `agent`.
    pub fn count(&self, verb: &str, resource: &str, code: u16, agent: &str) {
        self.by_agent.get_or_create(&AgentLabels { agent: agent.to_owned() }).inc();
        self.requests
            .get_or_create(&RequestLabels {
                verb: verb.to_owned(),
                resource: resource.to_owned(),
                code: code.to_string(),
            })
            .inc();
    }

    /// The number of requests counted for a verb and resource (all codes).
    pub fn total(&self, verb: &str, resource: &str) -> u64 {
        // Families cannot be iterated; render and sum the matching lines instead.
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry.lock()).is_err() {
            return 0;
        }
        let needle_verb = format!("verb=\"{verb}\"");
        let needle_res = format!("resource=\"{resource}\"");
        out.lines()
            .filter(|l| {
                l.starts_with("kjob_sim_apiserver_requests_total")
                    && l.contains(&needle_verb)
                    && l.contains(&needle_res)
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    /// Renders `/metrics`.
    pub fn render(&self) -> Response {
        let mut out = String::new();
        match prometheus_client::encoding::text::encode(&mut out, &self.registry.lock()) {
            Ok(()) => {
                let mut resp = (StatusCode::OK, out).into_response();
                resp.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    ),
                );
                resp
            }
            Err(e) => ApiError::internal(e.to_string()).into_response(),
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn ok(v: Value) -> Response {
    let mut resp = (StatusCode::OK, serde_json::to_vec(&v).unwrap_or_default()).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// Serves `/sim/...`.
pub fn handle(app: &App, method: &Method, segs: &[&str], body: &[u8]) -> Response {
    let result: Result<Value, ApiError> = match (method.as_str(), segs) {
        ("POST", ["compact"]) => {
            app.store.compact();
            Ok(json!({"compactedRevision": app.store.compacted_rv().to_string()}))
        }
        ("POST", ["close-watches"]) => {
            app.close_watches();
            Ok(json!({"closed": true}))
        }
        ("GET", ["faults"]) => Ok(app.faults.show()),
        ("POST", ["faults"]) => {
            serde_json::from_slice::<Value>(if body.is_empty() { b"{}" } else { body })
                .map_err(|e| ApiError::bad_request(e.to_string()))
                .and_then(|v| app.faults.set(&v))
                .map(|()| app.faults.show())
        }
        ("POST", ["kubelet", action @ ("pause" | "resume")]) => match app.kubelet.lock().as_ref() {
            Some(k) => {
                if *action == "pause" {
                    k.pause();
                } else {
                    k.resume();
                }
                Ok(json!({"kubelet": action}))
            }
            None => Err(ApiError::bad_request("the kubelet is off (--kubelet off)")),
        },
        ("POST", ["evict", ns, name]) => {
            let pod = PodCall { store: &app.store, ns, name, now: jiff::Timestamp::now() };
            pod.evict(&json!({})).map(|()| json!({"evicted": name}))
        }
        ("GET", ["state"]) => {
            let counts: serde_json::Map<String, Value> = StoreKind::ALL
                .iter()
                .map(|k| (k.resource().plural.to_owned(), json!(app.store.count(*k, None))))
                .collect();
            Ok(json!({
                "resourceVersion": app.store.current_rv().to_string(),
                "compactedRevision": app.store.compacted_rv().to_string(),
                "objects": counts,
            }))
        }
        (_, ["compact" | "close-watches" | "faults" | "state"]) => {
            Err(ApiError::method_not_allowed())
        }
        _ => Err(ApiError::path_not_found()),
    };
    match result {
        Ok(v) => ok(v),
        Err(e) => e.into_response(),
    }
}
