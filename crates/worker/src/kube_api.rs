//! The worker's only door to the API server: typed calls over Jobs, Pods and Events with a
//! client-side token bucket (and, with `--api-qps-total`, a token of the budget all workers
//! share, [`crate::budget`]), a timeout on every call, bounded retries of throttling and server
//! errors, and a metric per call.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::api::core::v1::Pod;
use kjob_reconcile::SummarizedPods;
use kube::Api;
use kube::Resource as _;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};

use crate::budget::ApiBudget;
use crate::metrics::Metrics;
use crate::ratelimit::TokenBucket;

/// Deadline of one API call. Writes of this controller are small; a call slower than this is
/// treated like a server error (retried, then the sync fails and is requeued).
pub const API_CALL_TIMEOUT: Duration = Duration::from_secs(15);
/// Attempts of one call when the server throttles (429) or fails (5xx, timeout, transport).
const MAX_ATTEMPTS: u32 = 4;
/// First delay between attempts; doubled each time.
const RETRY_BASE: Duration = Duration::from_millis(200);
/// Upper bound of one retry delay (also caps a server's Retry-After-like hints).
const RETRY_MAX: Duration = Duration::from_secs(5);

/// Errors of API server calls.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The object does not exist (404).
    #[error("{0} not found")]
    NotFound(String),
    /// The write lost a race (409): stale resourceVersion or the object already exists.
    #[error("conflict on {what}: {message}")]
    Conflict {
        /// What was written.
        what: String,
        /// The server's message.
        message: String,
    },
    /// The server refused the request definitely (400, 403, 422, …).
    #[error("{what} refused ({code} {reason}): {message}")]
    Refused {
        /// What was attempted.
        what: String,
        /// HTTP status.
        code: u16,
        /// The Status reason (e.g. `Invalid`, `Forbidden`).
        reason: String,
        /// The server's message.
        message: String,
    },
    /// The server stayed throttled or failing after the retries.
    #[error("{what} failed after {MAX_ATTEMPTS} attempts: {message}")]
    Unavailable {
        /// What was attempted.
        what: String,
        /// The last failure.
        message: String,
    },
}

impl ApiError {
    /// Whether the error is a 404.
    pub fn is_not_found(&self) -> bool {
        matches!(self, ApiError::NotFound(_))
    }

    /// Whether the error says the namespace is being deleted (such create failures are ignored,
    /// as upstream does).
    pub fn is_namespace_terminating(&self) -> bool {
        match self {
            ApiError::Refused { reason, message, .. } => {
                reason == "Forbidden" && message.contains("because it is being terminated")
            }
            _ => false,
        }
    }
}

/// What a failed attempt means for the caller.
enum Attempt {
    /// Definite answer; return it.
    Final(ApiError),
    /// Worth another try, after at least the server's suggested delay (if it gave one).
    Retry(String, Option<Duration>),
}

impl Attempt {
    /// A call that got no answer (transport error, timeout): retried if resending is safe,
    /// else unavailable (it may or may not have been applied).
    fn unanswered(idempotent: bool, what: &str, message: String) -> Self {
        if idempotent {
            Attempt::Retry(message, None)
        } else {
            Attempt::Final(ApiError::Unavailable { what: what.to_string(), message })
        }
    }
}

/// A read or write whose NotFound is an answer (`None`), not an error.
fn found<T>(r: Result<T, ApiError>) -> Result<Option<T>, ApiError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(ApiError::NotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Delay before retry number `attempt` (1 for the first retry): exponential from
/// [`RETRY_BASE`], never shorter than the server's `retryAfterSeconds` (client-go honours it the
/// same way), and capped at [`RETRY_MAX`] so one throttled call cannot stall a sync for long.
pub fn retry_delay(attempt: u32, server_hint: Option<Duration>) -> Duration {
    let backoff = kjob_svc::Backoff::new(RETRY_BASE, RETRY_MAX).delay(attempt.saturating_sub(1));
    backoff.max(server_hint.unwrap_or(Duration::ZERO)).min(RETRY_MAX)
}

/// The server's suggested wait (`details.retryAfterSeconds` of a Status), if any.
fn retry_after(status: &kube::core::Status) -> Option<Duration> {
    let secs = status.details.as_ref()?.retry_after_seconds;
    (secs > 0).then(|| Duration::from_secs(u64::from(secs)))
}

/// The part of a PodList the worker reads: the items, each decoded with its summary. `items`
/// may be null in a v1 list.
#[derive(serde::Deserialize)]
struct PodListItems {
    #[serde(default)]
    items: Option<SummarizedPods>,
}

/// What a create made: the pod's name and UID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedPod {
    /// The pod's name (generated by the server from `generateName`).
    pub name: String,
    /// The pod's UID.
    pub uid: String,
}

/// What an event write left on the server: the event's name, resourceVersion and count.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WrittenEvent {
    /// The event's name.
    pub name: String,
    /// Its resourceVersion (the precondition of the next count patch).
    pub resource_version: String,
    /// Its count, when it has one.
    pub count: Option<i32>,
}

impl From<&Event> for WrittenEvent {
    fn from(e: &Event) -> Self {
        Self {
            name: e.metadata.name.clone().unwrap_or_default(),
            resource_version: e.metadata.resource_version.clone().unwrap_or_default(),
            count: e.count,
        }
    }
}

/// The successful answer of a write: its body, protobuf or JSON.
struct Answer {
    protobuf: bool,
    body: bytes::Bytes,
}

impl Answer {
    /// The answered object's metadata, as far as [`kube_proto::ObjectMeta`](crate::kube_proto::ObjectMeta)
    /// reads it: a created pod's, a Job status write's.
    fn metadata(&self) -> Result<crate::kube_proto::ObjectMeta, kube::Error> {
        if self.protobuf {
            let object = crate::kube_proto::decode::<crate::kube_proto::MetaOnly>(&self.body)
                .map_err(|e| kube::Error::Service(e.into()))?;
            return Ok(object.metadata.unwrap_or_default());
        }
        #[derive(serde::Deserialize)]
        struct Meta {
            #[serde(default)]
            name: String,
            #[serde(default)]
            uid: String,
            #[serde(default, rename = "resourceVersion")]
            resource_version: String,
        }
        #[derive(serde::Deserialize)]
        struct Answered {
            metadata: Meta,
        }
        let Answered { metadata: m } =
            serde_json::from_slice(&self.body).map_err(kube::Error::SerdeError)?;
        Ok(crate::kube_proto::ObjectMeta {
            name: m.name,
            uid: m.uid,
            resource_version: m.resource_version,
            ..Default::default()
        })
    }

    /// The created pod's name and UID.
    fn created_pod(&self) -> Result<CreatedPod, kube::Error> {
        let meta = self.metadata()?;
        Ok(CreatedPod { name: meta.name, uid: meta.uid })
    }

    /// The written object's resourceVersion (a Job status write's answer).
    fn written_version(&self) -> Result<String, kube::Error> {
        Ok(self.metadata()?.resource_version)
    }

    /// The written event's name, resourceVersion and count.
    fn written_event(&self) -> Result<WrittenEvent, kube::Error> {
        if self.protobuf {
            let ev = crate::kube_proto::decode::<crate::kube_proto::EventMeta>(&self.body)
                .map_err(|e| kube::Error::Service(e.into()))?;
            let meta = ev.metadata.unwrap_or_default();
            return Ok(WrittenEvent {
                name: meta.name,
                resource_version: meta.resource_version,
                count: ev.count,
            });
        }
        let ev: Event = serde_json::from_slice(&self.body).map_err(kube::Error::SerdeError)?;
        Ok(WrittenEvent::from(&ev))
    }
}

/// The namespace of a request path (`/api/v1/namespaces/<ns>/pods/…`), `""` for a
/// cluster-scoped one: what the shared API budget charges the request to.
fn namespace_of(path: &str) -> &str {
    let mut parts = path.split('/');
    while let Some(p) = parts.next() {
        if p == "namespaces" {
            return parts.next().unwrap_or_default();
        }
    }
    ""
}

/// A request that could not be built is refused, not retried.
fn refused_unbuilt(what: &str, e: impl std::fmt::Display) -> ApiError {
    ApiError::Refused {
        what: what.to_string(),
        code: 400,
        reason: "BadRequest".to_string(),
        message: format!("could not build the request: {e}"),
    }
}

/// Typed API calls, shared by every sync of the process (clone is cheap).
#[derive(Clone)]
pub struct KubeApi {
    client: kube::Client,
    limiter: Arc<TokenBucket>,
    /// The workers' shared budget (`--api-qps-total`), when one is set.
    budget: Option<ApiBudget>,
    metrics: Metrics,
}

impl KubeApi {
    /// Wraps a client with a `qps`/`burst` token bucket.
    pub fn new(client: kube::Client, qps: f64, burst: u32, metrics: Metrics) -> Self {
        Self { client, limiter: Arc::new(TokenBucket::new(qps, burst)), budget: None, metrics }
    }

    /// Also takes a token of the workers' shared `budget` before every request (the
    /// `qps`/`burst` bucket stays as this process's own cap) and reports its 429s to it.
    pub fn with_budget(mut self, budget: ApiBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    fn jobs(&self, ns: &str) -> Api<Job> {
        Api::namespaced(self.client.clone(), ns)
    }

    fn pods(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// Runs one call with the limiter, a timeout and bounded retries of transient failures.
    /// `idempotent = false` (creates) retries only a 429, which the server answers before doing
    /// anything; a timed-out or failed create may have happened, so it is not resent.
    async fn call<T, F, Fut>(
        &self,
        ns: &str,
        verb: &str,
        resource: &str,
        what: &str,
        idempotent: bool,
        mut f: F,
    ) -> Result<T, ApiError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, kube::Error>>,
    {
        let mut attempt = 0u32;
        loop {
            self.limiter.acquire().await;
            if let Some(budget) = &self.budget {
                budget.acquire(ns).await;
            }
            let res = tokio::time::timeout(API_CALL_TIMEOUT, f()).await;
            let (result_label, outcome) = match res {
                Ok(Ok(v)) => {
                    self.metrics.api_call(verb, resource, "ok");
                    return Ok(v);
                }
                Ok(Err(kube::Error::Api(status))) => {
                    let code = status.code;
                    let label = code.to_string();
                    let hint = retry_after(&status);
                    if code == 429
                        && let Some(budget) = &self.budget
                    {
                        budget.throttled();
                    }
                    let outcome = match code {
                        404 => Attempt::Final(ApiError::NotFound(what.to_string())),
                        409 => Attempt::Final(ApiError::Conflict {
                            what: what.to_string(),
                            message: status.message.clone(),
                        }),
                        // A 429 is answered before anything is done, so even a create is resent.
                        429 => Attempt::Retry(format!("429 {}", status.message), hint),
                        500..=599 if idempotent => {
                            Attempt::Retry(format!("{code} {}", status.message), hint)
                        }
                        _ => Attempt::Final(ApiError::Refused {
                            what: what.to_string(),
                            code,
                            reason: status.reason.clone(),
                            message: status.message.clone(),
                        }),
                    };
                    (label, outcome)
                }
                Ok(Err(e)) => {
                    ("transport".to_string(), Attempt::unanswered(idempotent, what, e.to_string()))
                }
                Err(_) => {
                    let msg = format!("timed out after {API_CALL_TIMEOUT:?}");
                    ("timeout".to_string(), Attempt::unanswered(idempotent, what, msg))
                }
            };
            self.metrics.api_call(verb, resource, &result_label);
            match outcome {
                Attempt::Final(e) => return Err(e),
                Attempt::Retry(message, hint) => {
                    attempt += 1;
                    if attempt >= MAX_ATTEMPTS {
                        return Err(ApiError::Unavailable { what: what.to_string(), message });
                    }
                    let delay = retry_delay(attempt, hint);
                    tracing::debug!(verb, resource, what, attempt, ?delay, error = %message, "API call failed; retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// GETs a Job (a consistent read: no resourceVersion); `None` when it does not exist.
    pub async fn get_job(&self, ns: &str, name: &str) -> Result<Option<Job>, ApiError> {
        let api = self.jobs(ns);
        let what = format!("job {ns}/{name}");
        found(self.call(ns, "get", "jobs", &what, true, || api.get(name)).await)
    }

    /// GETs a Pod (consistent read); `None` when it does not exist.
    pub async fn get_pod(&self, ns: &str, name: &str) -> Result<Option<Pod>, ApiError> {
        let api = self.pods(ns);
        let what = format!("pod {ns}/{name}");
        found(self.call(ns, "get", "pods", &what, true, || api.get(name)).await)
    }

    /// LISTs the pods of `ns` matching `selector` (consistent read: no resourceVersion). Each
    /// pod's [`PodSummary`](kjob_reconcile::PodSummary) is taken as the pod is decoded, while
    /// it is still in cache: the sync's pass over thousands of pods then reads only those.
    pub async fn list_pods(&self, ns: &str, selector: &str) -> Result<SummarizedPods, ApiError> {
        let lp = ListParams::default().labels(selector);
        let what = format!("pods in {ns} matching {selector:?}");
        let path = Pod::url_path(&(), Some(ns));
        let build = || kube::core::Request::new(path.as_str()).list(&lp);
        // Built once up front so a request that cannot be built is refused, not retried.
        build().map_err(|e| refused_unbuilt(&what, e))?;
        let list: PodListItems = self
            .call(ns, "list", "pods", &what, true, || {
                let request = build().map_err(kube::Error::BuildRequest);
                async move { self.client.request(request?).await }
            })
            .await?;
        Ok(list.items.unwrap_or_default())
    }

    /// Creates a pod (never resent after an ambiguous failure); the created pod's name and UID
    /// (what a sync reads of it), from a protobuf answer (see [`kube_proto`](crate::kube_proto)).
    pub async fn create_pod(&self, ns: &str, pod: &Pod) -> Result<CreatedPod, ApiError> {
        let what = format!(
            "create pod {ns}/{}",
            pod.metadata.generate_name.as_deref().or(pod.metadata.name.as_deref()).unwrap_or("")
        );
        let path = Pod::url_path(&(), Some(ns));
        let body = serde_json::to_vec(pod).map_err(|e| refused_unbuilt(&what, e))?;
        let pp = PostParams::default();
        let build = || kube::core::Request::new(path.as_str()).create(&pp, body.clone());
        self.write_call("create", "pods", &what, false, build, |a| a.created_pod()).await
    }

    /// Deletes a pod (NotFound is returned: the caller's expectations depend on it).
    pub async fn delete_pod(&self, ns: &str, name: &str) -> Result<(), ApiError> {
        let what = format!("delete pod {ns}/{name}");
        let path = Pod::url_path(&(), Some(ns));
        let dp = DeleteParams::default();
        let build = || kube::core::Request::new(path.as_str()).delete(name, &dp);
        self.write_call("delete", "pods", &what, true, build, |_| Ok(())).await
    }

    /// Strategic-merge-patches a pod.
    pub async fn patch_pod(
        &self,
        ns: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<Pod, ApiError> {
        let what = format!("patch pod {ns}/{name}");
        self.patch_strategic::<Pod>(ns, "pods", &what, name, patch, true).await
    }

    /// Removes the Job tracking finalizer from a pod; NotFound counts as done.
    pub async fn remove_tracking_finalizer(&self, ns: &str, name: &str) -> Result<(), ApiError> {
        found(self.patch_out_tracking_finalizer(ns, name).await).map(drop)
    }

    /// Removes the Job tracking finalizer from a pod; a missing pod is NotFound. The patched
    /// pod is not read, so it is asked for as protobuf (cheaper for the server to encode).
    pub async fn patch_out_tracking_finalizer(&self, ns: &str, name: &str) -> Result<(), ApiError> {
        let what = format!("patch pod {ns}/{name}");
        let path = Pod::url_path(&(), Some(ns));
        let pp = PatchParams::default();
        let patch = remove_tracking_finalizer_patch();
        let patch = Patch::Strategic(&patch);
        let build = || kube::core::Request::new(path.as_str()).patch(name, &pp, &patch);
        self.write_call("patch", "pods", &what, true, build, |_| Ok(())).await
    }

    /// [`call`](Self::call) of a write that asks for a protobuf answer and reads it with
    /// `read`. The request is built up front (one that cannot be built is refused, not
    /// retried) and sent as built; `build` runs again only for a retry.
    async fn write_call<T>(
        &self,
        verb: &str,
        resource: &str,
        what: &str,
        idempotent: bool,
        build: impl Fn() -> Result<http::Request<Vec<u8>>, kube::core::request::Error>,
        read: impl Fn(Answer) -> Result<T, kube::Error>,
    ) -> Result<T, ApiError> {
        let request = build().map_err(|e| refused_unbuilt(what, e))?;
        let ns = namespace_of(request.uri().path()).to_string();
        let mut first = Some(request);
        self.call(&ns, verb, resource, what, idempotent, || {
            let request =
                first.take().map_or_else(|| build().map_err(kube::Error::BuildRequest), Ok);
            let read = &read;
            async move { read(self.write(request?).await?) }
        })
        .await
    }

    /// Sends a write asking for a protobuf answer; a failure's `Status` (protobuf, JSON or
    /// neither) becomes `kube::Error::Api`, as kube's own calls report it.
    async fn write(&self, request: http::Request<Vec<u8>>) -> Result<Answer, kube::Error> {
        use http_body_util::BodyExt as _;
        let (mut parts, body) = request.into_parts();
        parts.headers.insert(
            http::header::ACCEPT,
            http::HeaderValue::from_static(crate::kube_proto::ACCEPT),
        );
        let request = http::Request::from_parts(parts, kube::client::Body::from(body));
        let response = self.client.send(request).await?;
        let code = response.status();
        let protobuf = crate::kube_proto::is_protobuf(
            response.headers().get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()),
        );
        let body = response.into_body().collect().await?.to_bytes();
        if code.is_success() {
            return Ok(Answer { protobuf, body });
        }
        let code = code.as_u16();
        let status = if protobuf {
            crate::kube_proto::decode::<crate::kube_proto::Status>(&body)
                .map(|s| crate::kube_proto::kube_status(s, code))
                .ok()
        } else {
            serde_json::from_slice::<kube::core::Status>(&body).ok()
        };
        let status = status.unwrap_or_else(|| {
            // Not a Status (a proxy's text, say): its text, under the HTTP status.
            let text = String::from_utf8_lossy(&body);
            kube::core::Status::failure(text.trim(), "Failed to parse error data").with_code(code)
        });
        Err(kube::Error::Api(status.boxed()))
    }

    /// Writes a Job's status with its resourceVersion (PUT /status); 409 on a stale version.
    /// Returns the written Job's resourceVersion, all the sync reads of the answer, which is
    /// asked for as protobuf (see [`kube_proto`](crate::kube_proto)).
    pub async fn replace_job_status(&self, job: &Job) -> Result<String, ApiError> {
        let ns = job.metadata.namespace.as_deref().unwrap_or_default();
        let name = job.metadata.name.as_deref().unwrap_or_default();
        let what = format!("status of job {ns}/{name}");
        let path = Job::url_path(&(), Some(ns));
        let body = serde_json::to_vec(job).map_err(|e| refused_unbuilt(&what, e))?;
        let pp = PostParams::default();
        let build = || {
            kube::core::Request::new(path.as_str()).replace_subresource(
                "status",
                name,
                &pp,
                body.clone(),
            )
        };
        self.write_call("update_status", "jobs", &what, true, build, |a| a.written_version()).await
    }

    /// Creates a core/v1 Event (never resent: a resent create of a named event is a 409, and
    /// a duplicate is noise). A 409 means an event of that name exists already.
    pub async fn create_event(&self, ns: &str, event: &Event) -> Result<WrittenEvent, ApiError> {
        let what = format!("event in {ns}");
        let path = Event::url_path(&(), Some(ns));
        let body = serde_json::to_vec(event).map_err(|e| refused_unbuilt(&what, e))?;
        let pp = PostParams::default();
        let build = || kube::core::Request::new(path.as_str()).create(&pp, body.clone());
        self.write_call("create", "events", &what, false, build, |a| a.written_event()).await
    }

    /// Strategic-merge PATCHes a core/v1 Event's count (a patch naming a resourceVersion:
    /// 409 when the event changed since; never resent after an ambiguous failure).
    pub async fn patch_event_count(
        &self,
        ns: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<WrittenEvent, ApiError> {
        let what = format!("event {ns}/{name}");
        let path = Event::url_path(&(), Some(ns));
        let pp = PatchParams::default();
        let patch = Patch::Strategic(patch);
        let build = || kube::core::Request::new(path.as_str()).patch(name, &pp, &patch);
        self.write_call("patch", "events", &what, false, build, |a| a.written_event()).await
    }

    /// Strategic-merge PATCHes a core/v1 Event and returns all of it (the recorder's read: an
    /// empty patch, resent after an ambiguous failure; other patches are not, as they may
    /// have been applied).
    pub async fn patch_event(
        &self,
        ns: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<Event, ApiError> {
        let what = format!("event {ns}/{name}");
        let idempotent = patch.as_object().is_some_and(|o| o.is_empty());
        self.patch_strategic::<Event>(ns, "events", &what, name, patch, idempotent).await
    }

    /// Strategic-merge-patches object `name` in namespace `ns` (`resource` names it in metrics,
    /// `what` in errors; `idempotent`: whether it may be resent after an ambiguous failure).
    async fn patch_strategic<K>(
        &self,
        ns: &str,
        resource: &str,
        what: &str,
        name: &str,
        patch: &serde_json::Value,
        idempotent: bool,
    ) -> Result<K, ApiError>
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
    {
        let api: Api<K> = Api::namespaced(self.client.clone(), ns);
        let pp = PatchParams::default();
        let patch = Patch::Strategic(patch);
        self.call(ns, "patch", resource, what, idempotent, || api.patch(name, &pp, &patch)).await
    }
}

/// The strategic merge patch removing the tracking finalizer (upstream
/// `removeTrackingFinalizerPatch`).
pub fn remove_tracking_finalizer_patch() -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "$deleteFromPrimitiveList/finalizers": [kjob_core::JOB_TRACKING_FINALIZER]
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_charged_to_their_namespace() {
        assert_eq!(namespace_of("/api/v1/namespaces/team-a/pods"), "team-a");
        assert_eq!(namespace_of("/api/v1/namespaces/b/pods/p-1"), "b");
        assert_eq!(namespace_of("/apis/batch/v1/namespaces/c/jobs/j/status"), "c");
        assert_eq!(namespace_of("/api/v1/namespaces/namespaces/events"), "namespaces");
        assert_eq!(namespace_of("/api/v1/nodes"), "");
    }

    #[test]
    fn pod_lists_decode_with_summaries() {
        let body = r#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"7"},
            "items":[{"metadata":{"name":"a","uid":"u1",
              "annotations":{"batch.kubernetes.io/job-completion-index":"3"},
              "finalizers":["batch.kubernetes.io/job-tracking"]},
              "status":{"phase":"Running"}}]}"#;
        let list: PodListItems = serde_json::from_str(body).expect("decodes");
        let items = list.items.expect("items");
        assert_eq!(items.len(), 1);
        assert_eq!(items.pods()[0].metadata.name.as_deref(), Some("a"));
        let s = items.summaries()[0];
        assert_eq!(s.index(), Some(3));
        assert!(s.has_tracking_finalizer() && s.is_active());
        // A v1 list may carry `items: null`, or none at all.
        for body in [r#"{"items":null}"#, r#"{"metadata":{}}"#] {
            let list: PodListItems = serde_json::from_str(body).expect("decodes");
            assert!(list.items.unwrap_or_default().is_empty());
        }
        // Items that are not Pods fail the call instead of reading as no pods.
        assert!(serde_json::from_str::<PodListItems>(r#"{"items":[7]}"#).is_err());
    }

    #[test]
    fn a_status_write_answer_gives_its_resource_version() {
        let json = r#"{"kind":"Job","metadata":{"name":"pi","resourceVersion":"88"},
            "status":{"active":1}}"#;
        let a = Answer { protobuf: false, body: bytes::Bytes::from_static(json.as_bytes()) };
        assert_eq!(a.written_version().expect("decodes"), "88");
        let a = Answer { protobuf: false, body: bytes::Bytes::from_static(b"{\"metadata\":{}}") };
        assert_eq!(a.written_version().expect("decodes"), "");
        // Not the encoding it claims: an error, not an empty version.
        let a = Answer { protobuf: true, body: bytes::Bytes::from_static(json.as_bytes()) };
        assert!(a.written_version().is_err());
        let a = Answer { protobuf: false, body: bytes::Bytes::from_static(b"k8s\0") };
        assert!(a.written_version().is_err());
    }

    #[test]
    fn finalizer_patch_shape() {
        let p = remove_tracking_finalizer_patch();
        assert_eq!(
            p.to_string(),
            r#"{"metadata":{"$deleteFromPrimitiveList/finalizers":["batch.kubernetes.io/job-tracking"]}}"#
        );
    }

    #[test]
    fn retries_back_off_and_honour_the_server_hint() {
        let ms = Duration::from_millis;
        // (attempt, server hint, expected delay)
        let cases = [
            (1, None, ms(200)),
            (2, None, ms(400)),
            (3, None, ms(800)),
            (10, None, RETRY_MAX),
            (1, Some(Duration::from_secs(1)), Duration::from_secs(1)),
            (3, Some(Duration::from_secs(1)), Duration::from_secs(1)),
            (4, Some(ms(100)), ms(1600)),
            (1, Some(Duration::from_secs(60)), RETRY_MAX),
            (u32::MAX, None, RETRY_MAX),
        ];
        for (attempt, hint, want) in cases {
            assert_eq!(retry_delay(attempt, hint), want, "attempt {attempt} hint {hint:?}");
        }
    }

    #[test]
    fn retry_after_comes_from_status_details() {
        let mut st = kube::core::Status::failure("slow down", "TooManyRequests").with_code(429);
        assert_eq!(retry_after(&st), None);
        st.details =
            Some(serde_json::from_value(serde_json::json!({"retryAfterSeconds": 2})).unwrap());
        assert_eq!(retry_after(&st), Some(Duration::from_secs(2)));
    }

    #[test]
    fn namespace_terminating_is_recognised() {
        let e = ApiError::Refused {
            what: "create pod".into(),
            code: 403,
            reason: "Forbidden".into(),
            message: "pods \"x\" is forbidden: unable to create new content in namespace ns because it is being terminated".into(),
        };
        assert!(e.is_namespace_terminating());
        assert!(!ApiError::NotFound("x".into()).is_namespace_terminating());
    }
}
