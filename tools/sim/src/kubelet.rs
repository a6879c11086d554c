//! A simulated kubelet (and scheduler) in the manner of kwok: it watches every pod through
//! the simulator's HTTP API and drives each one through the stages of a real node — bind,
//! accept, run, exit, graceful termination, final zero-grace delete — writing only through
//! the normal `binding`, `/status` and DELETE paths, so resource versions, watch events and
//! selector transitions are the real ones.
//!
//! Per-pod behaviour comes from annotations (see [`stages`]): `kjob.io/sim-run-time`,
//! `kjob.io/sim-exit-code`, `kjob.io/sim-exit-code.<container>`,
//! `kjob.io/sim-termination-time`, `kjob.io/sim-start-delay`, `kjob.io/sim-schedulable`.
//!
//! One task owns all pod state; due transitions sit in a binary-heap timer queue (no task
//! per pod) and at most [`MAX_IN_FLIGHT`] writes run at once, so it keeps up with hundreds
//! of pods per second.

pub mod stages;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use jiff::Timestamp;
use kjob_svc::Backoff;
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use stages::{Action, Memo};

/// Most status writes/binds/deletes in flight at once.
pub const MAX_IN_FLIGHT: usize = 64;
/// Capacity of the watch → engine event channel (back-pressure on the watch stream).
const EVENT_CHANNEL_CAPACITY: usize = 4096;
/// Server-side lifetime of one watch request; the stream is re-opened afterwards.
const WATCH_TIMEOUT_SECONDS: u64 = 60;
/// Silence on a watch stream after which it is considered dead (server timeout + slack).
const WATCH_IDLE_TIMEOUT: Duration = Duration::from_secs(WATCH_TIMEOUT_SECONDS + 10);
/// Back-off between failed list/watch attempts: from 200 ms, doubling up to 5 s.
const RETRY_BACKOFF: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
/// Delay before re-planning a pod whose write failed (conflict, 5xx, timeout).
const WRITE_RETRY_DELAY: Duration = Duration::from_millis(250);

/// Settings of the simulated kubelet.
#[derive(Debug, Clone)]
pub struct KubeletConfig {
    /// Node names are `<node_prefix>-<i>`.
    pub node_prefix: String,
    /// Number of simulated nodes pods are spread over.
    pub nodes: u32,
    /// Whether to bind unscheduled pods (act as the default scheduler).
    pub schedule: bool,
    /// Container run time when a pod has no `kjob.io/sim-run-time` annotation.
    pub run_time: Duration,
    /// Delay between accepting a pod and running its containers (image pull, start).
    pub start_delay: Duration,
    /// Time containers take to stop on SIGTERM, unless annotated.
    pub termination_time: Duration,
    /// Base of the CrashLoopBackOff delay (10 s on a real kubelet).
    pub crash_loop_backoff: Duration,
    /// Timeout of every request to the API server.
    pub request_timeout: Duration,
    /// Leave alone pods bound to nodes that are not the kubelet's own (on a real control plane
    /// other agents, or a test playing kubelet, may own other nodes).
    pub only_own_nodes: bool,
}

impl Default for KubeletConfig {
    fn default() -> Self {
        Self {
            node_prefix: "sim-node".into(),
            nodes: 3,
            schedule: true,
            run_time: Duration::from_secs(1),
            start_delay: Duration::from_millis(100),
            termination_time: Duration::ZERO,
            crash_loop_backoff: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
            only_own_nodes: false,
        }
    }
}

/// Errors talking to the API server.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// The request could not be sent or the connection failed.
    #[error("request failed: {0}")]
    Transport(String),
    /// No answer within the request timeout.
    #[error("request timed out")]
    Timeout,
    /// The server answered with an error status.
    #[error("server answered {0}: {1}")]
    Status(u16, String),
    /// The answer was not the JSON expected.
    #[error("undecodable answer: {0}")]
    Decode(String),
}

/// A small JSON client for the pod paths the kubelet writes. It rides on a kube client, so the
/// same kubelet drives kjob-sim (plain HTTP) and a real kube-apiserver (TLS, bearer token).
#[derive(Clone)]
struct Api {
    client: kube::Client,
    timeout: Duration,
}

impl Api {
    fn new(client: kube::Client, timeout: Duration) -> Self {
        Self { client, timeout }
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<http::Response<kube::client::Body>, KubeletError> {
        let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json")
            .body(bytes)
            .map_err(|e| KubeletError::Transport(e.to_string()))?;
        tokio::time::timeout(self.timeout, self.client.send(req.map(kube::client::Body::from)))
            .await
            .map_err(|_| KubeletError::Timeout)?
            .map_err(|e| KubeletError::Transport(e.to_string()))
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, KubeletError> {
        let resp = self.send(method, path, body).await?;
        let status = resp.status();
        let bytes = tokio::time::timeout(self.timeout, resp.into_body().collect())
            .await
            .map_err(|_| KubeletError::Timeout)?
            .map_err(|e| KubeletError::Transport(e.to_string()))?
            .to_bytes();
        let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if !status.is_success() {
            let msg = value["message"].as_str().unwrap_or_default().to_string();
            return Err(KubeletError::Status(status.as_u16(), msg));
        }
        Ok(value)
    }
}

fn pod_path(ns: &str, name: &str) -> String {
    format!("/api/v1/namespaces/{ns}/pods/{name}")
}

/// `(namespace, name)` of a pod.
type Key = (String, String);

fn key_of(pod: &Value) -> Key {
    let s = |p: &str| pod.pointer(p).and_then(Value::as_str).unwrap_or_default().to_string();
    (s("/metadata/namespace"), s("/metadata/name"))
}

fn rv_of(pod: &Value) -> String {
    pod.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or_default().to_string()
}

fn uid_of(pod: &Value) -> String {
    pod.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or_default().to_string()
}

/// Whether `candidate` is not older than `current` (RVs are decimal in the simulator; anything
/// else is taken as newer).
fn not_older(candidate: &str, current: &str) -> bool {
    match (candidate.parse::<u64>(), current.parse::<u64>()) {
        (Ok(a), Ok(b)) => a >= b,
        _ => true,
    }
}

/// What the watch task tells the engine.
enum PodEvent {
    /// A full relist: these are all pods.
    Reset(Vec<Value>),
    /// A pod was added or changed.
    Upsert(Value),
    /// A pod is gone.
    Delete(Value),
}

/// Control handle of a running kubelet.
pub struct KubeletHandle {
    paused: Arc<AtomicBool>,
    wake: Arc<Notify>,
    api: Api,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for KubeletHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletHandle").field("paused", &self.is_paused()).finish_non_exhaustive()
    }
}

impl KubeletHandle {
    /// Stops advancing pods (watch events are still tracked).
    pub fn pause(&self) {
        self.paused.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// Resumes advancing pods; transitions that fell due meanwhile run at once.
    pub fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// Whether the kubelet is paused.
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Evicts a pod through the Eviction API, which adds `DisruptionTarget=True`
    /// (`EvictionByEvictionAPI`) and deletes it gracefully; the kubelet then terminates it.
    pub async fn evict(&self, namespace: &str, name: &str) -> Result<(), KubeletError> {
        let body = json!({
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace}
        });
        self.api
            .call(Method::POST, &format!("{}/eviction", pod_path(namespace, name)), Some(&body))
            .await?;
        Ok(())
    }

    /// Waits for the kubelet task to end (after its shutdown token is cancelled).
    pub async fn join(self) {
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "kubelet task failed");
        }
    }
}

/// Starts the kubelet against the API server at `base_url` (e.g. `http://127.0.0.1:40123`),
/// unauthenticated. It runs until `shutdown` is cancelled. Must be called within a tokio runtime.
pub fn spawn(
    base_url: String,
    config: KubeletConfig,
    shutdown: CancellationToken,
) -> Result<KubeletHandle, KubeletError> {
    let url = base_url.parse().map_err(|e| KubeletError::Transport(format!("{base_url}: {e}")))?;
    let client = kube::Client::try_from(kube::Config::new(url))
        .map_err(|e| KubeletError::Transport(e.to_string()))?;
    Ok(spawn_with_client(client, config, shutdown))
}

/// Starts the kubelet on an existing kube client (any API server, any credentials).
pub fn spawn_with_client(
    client: kube::Client,
    config: KubeletConfig,
    shutdown: CancellationToken,
) -> KubeletHandle {
    let api = Api::new(client, config.request_timeout);
    let paused = Arc::new(AtomicBool::new(false));
    let wake = Arc::new(Notify::new());
    let (tx, rx) = mpsc::channel(EVENT_CHANNEL_CAPACITY);
    let engine = Engine {
        api: api.clone(),
        cfg: config,
        paused: paused.clone(),
        wake: wake.clone(),
        pods: HashMap::new(),
        memo: HashMap::new(),
        timers: BinaryHeap::new(),
        planned: HashMap::new(),
        seq: 0,
        ready: VecDeque::new(),
        in_flight: HashSet::new(),
        done: HashMap::new(),
    };
    let watch_api = api.clone();
    let watch_shutdown = shutdown.clone();
    let task = tokio::spawn(async move {
        let watcher = tokio::spawn(watch_pods(watch_api, tx, watch_shutdown.clone()));
        engine.run(rx, shutdown).await;
        watch_shutdown.cancel();
        if let Err(e) = watcher.await {
            tracing::error!(error = %e, "kubelet watch task failed");
        }
    });
    KubeletHandle { paused, wake, api, task }
}

/// Lists then watches all pods, forwarding events; relists after a 410 or a broken list.
async fn watch_pods(api: Api, tx: mpsc::Sender<PodEvent>, shutdown: CancellationToken) {
    // Failed attempts since the last watch that opened.
    let mut failures = 0;
    'relist: while !shutdown.is_cancelled() {
        let list = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = api.call(Method::GET, "/api/v1/pods", None) => r,
        };
        let list = match list {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "kubelet: listing pods failed");
                sleep_or_shutdown(&shutdown, &mut failures).await;
                continue;
            }
        };
        let mut rv = list
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or("0")
            .to_string();
        let items = list["items"].as_array().cloned().unwrap_or_default();
        if tx.send(PodEvent::Reset(items)).await.is_err() {
            return;
        }
        loop {
            let path = format!(
                "/api/v1/pods?watch=true&allowWatchBookmarks=true&timeoutSeconds={WATCH_TIMEOUT_SECONDS}&resourceVersion={rv}"
            );
            let resp = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = api.send(Method::GET, &path, None) => r,
            };
            let resp = match resp {
                Ok(r) if r.status() == StatusCode::OK => r,
                Ok(r) if r.status() == StatusCode::GONE => continue 'relist,
                Ok(r) => {
                    tracing::warn!(status = %r.status(), "kubelet: watch refused");
                    sleep_or_shutdown(&shutdown, &mut failures).await;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "kubelet: watch failed");
                    sleep_or_shutdown(&shutdown, &mut failures).await;
                    continue;
                }
            };
            failures = 0;
            let mut body = resp.into_body();
            let mut buf: Vec<u8> = Vec::new();
            loop {
                let frame = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    f = tokio::time::timeout(WATCH_IDLE_TIMEOUT, body.frame()) => f,
                };
                let data = match frame {
                    Ok(Some(Ok(f))) => match f.into_data() {
                        Ok(d) => d,
                        Err(_) => continue,
                    },
                    // End of stream, idle timeout or broken connection: re-watch from rv.
                    _ => break,
                };
                buf.extend_from_slice(&data);
                while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=pos).collect();
                    let Ok(ev) = serde_json::from_slice::<Value>(&line) else { continue };
                    let obj = ev["object"].clone();
                    match ev["type"].as_str().unwrap_or_default() {
                        "ADDED" | "MODIFIED" => {
                            rv = rv_of(&obj);
                            if tx.send(PodEvent::Upsert(obj)).await.is_err() {
                                return;
                            }
                        }
                        "DELETED" => {
                            rv = rv_of(&obj);
                            if tx.send(PodEvent::Delete(obj)).await.is_err() {
                                return;
                            }
                        }
                        "BOOKMARK" => rv = rv_of(&obj),
                        "ERROR" => {
                            tracing::info!(code = %obj["code"], message = %obj["message"], "kubelet: watch error, relisting");
                            continue 'relist;
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}

async fn sleep_or_shutdown(shutdown: &CancellationToken, failures: &mut u32) {
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = tokio::time::sleep(RETRY_BACKOFF.delay(*failures)) => {}
    }
    *failures = failures.saturating_add(1);
}

/// Result of one write: the pod key, the action, the RV it acted on, and the outcome.
struct Done {
    key: Key,
    action: Action,
    rv: String,
    uid: String,
    at: Timestamp,
    result: Result<Option<Value>, KubeletError>,
}

struct Engine {
    api: Api,
    cfg: KubeletConfig,
    paused: Arc<AtomicBool>,
    wake: Arc<Notify>,
    /// Latest known state of every pod.
    pods: HashMap<Key, Value>,
    /// Precise transition times per pod uid.
    memo: HashMap<String, Memo>,
    /// Timer queue of (due, seq, key); an entry is live only if `planned[key].seq` matches.
    timers: BinaryHeap<Reverse<(Instant, u64, Key)>>,
    planned: HashMap<Key, (u64, Option<Action>)>,
    seq: u64,
    /// Due work waiting for a free write slot.
    ready: VecDeque<(Key, Action)>,
    in_flight: HashSet<Key>,
    /// Last successful action per pod and the RV it was applied to (no repeats on one RV).
    done: HashMap<Key, (String, Action)>,
}

impl Engine {
    async fn run(mut self, mut rx: mpsc::Receiver<PodEvent>, shutdown: CancellationToken) {
        let mut writes: JoinSet<Done> = JoinSet::new();
        loop {
            let paused = self.paused.load(Ordering::SeqCst);
            if !paused {
                self.dispatch(&mut writes);
            }
            let next_due = self.timers.peek().map(|Reverse((at, _, _))| *at);
            tokio::select! {
                _ = shutdown.cancelled() => break,
                ev = rx.recv() => match ev {
                    Some(ev) => self.on_event(ev),
                    None => break,
                },
                Some(done) = writes.join_next(), if !writes.is_empty() => match done {
                    Ok(done) => self.on_done(done),
                    Err(e) => tracing::error!(error = %e, "kubelet write task failed"),
                },
                _ = sleep_until_opt(next_due), if next_due.is_some() && !paused => self.pop_due(),
                _ = self.wake.notified() => {
                    if !self.paused.load(Ordering::SeqCst) {
                        self.replan_all();
                    }
                }
            }
        }
        writes.shutdown().await;
    }

    fn on_event(&mut self, ev: PodEvent) {
        match ev {
            PodEvent::Reset(items) => {
                let keys: HashSet<Key> = items.iter().map(key_of).collect();
                self.pods.retain(|k, _| keys.contains(k));
                self.planned.retain(|k, _| keys.contains(k));
                self.done.retain(|k, _| keys.contains(k));
                for pod in items {
                    self.pods.insert(key_of(&pod), pod);
                }
                let live: HashSet<String> = self.pods.values().map(uid_of).collect();
                self.memo.retain(|uid, _| live.contains(uid));
                self.replan_all();
            }
            PodEvent::Upsert(pod) => {
                let key = key_of(&pod);
                if let Some(cur) = self.pods.get(&key)
                    && uid_of(cur) == uid_of(&pod)
                    && (rv_of(&pod) == rv_of(cur) || !not_older(&rv_of(&pod), &rv_of(cur)))
                {
                    // Older, or the version this kubelet's own write already brought: planned.
                    return;
                }
                self.pods.insert(key.clone(), pod);
                self.replan(&key);
            }
            PodEvent::Delete(pod) => {
                let key = key_of(&pod);
                if self.pods.get(&key).is_some_and(|cur| uid_of(cur) == uid_of(&pod)) {
                    self.pods.remove(&key);
                    self.planned.remove(&key);
                    self.done.remove(&key);
                    self.memo.remove(&uid_of(&pod));
                }
            }
        }
    }

    fn replan_all(&mut self) {
        let keys: Vec<Key> = self.pods.keys().cloned().collect();
        for k in keys {
            self.replan(&k);
        }
    }

    /// Computes the pod's next transition and (re)arms its timer.
    fn replan(&mut self, key: &Key) {
        let Some(pod) = self.pods.get(key) else {
            self.planned.remove(key);
            return;
        };
        let now = Timestamp::now();
        let memo = self.memo.get(&uid_of(pod));
        match stages::plan(pod, memo, now, &self.cfg) {
            None => {
                self.planned.remove(key);
            }
            Some((when, action)) => {
                if self.done.get(key).is_some_and(|(rv, a)| *rv == rv_of(pod) && *a == action) {
                    // Already applied to this version; wait for the write's watch event.
                    self.planned.remove(key);
                    return;
                }
                self.seq += 1;
                let wait = when.duration_since(now);
                let wait = Duration::try_from(wait).unwrap_or(Duration::ZERO);
                self.planned.insert(key.clone(), (self.seq, Some(action)));
                self.timers.push(Reverse((Instant::now() + wait, self.seq, key.clone())));
            }
        }
    }

    fn pop_due(&mut self) {
        let now = Instant::now();
        while let Some(Reverse((at, seq, _))) = self.timers.peek() {
            if *at > now {
                break;
            }
            let seq = *seq;
            let Some(Reverse((_, _, key))) = self.timers.pop() else { break };
            if let Some((s, action)) = self.planned.get(&key)
                && *s == seq
            {
                let action = *action;
                self.planned.remove(&key);
                match action {
                    Some(action) => self.ready.push_back((key, action)),
                    None => self.replan(&key),
                }
            }
        }
    }

    fn dispatch(&mut self, writes: &mut JoinSet<Done>) {
        while writes.len() < MAX_IN_FLIGHT {
            let Some((key, action)) = self.ready.pop_front() else { break };
            // A pod with a write in flight is re-planned when that write finishes.
            if self.in_flight.contains(&key) {
                continue;
            }
            let Some(pod) = self.pods.get(&key).cloned() else { continue };
            // The pod may have moved on since its timer fired (its key can also be queued twice:
            // a re-plan while it waited here arms a second timer). Only the transition the pod
            // is due for now is written; anything else is re-planned, never written twice.
            let memo = self.memo.get(&uid_of(&pod));
            let now = Timestamp::now();
            match stages::plan(&pod, memo, now, &self.cfg) {
                Some((when, due)) if due == action && when <= now => {}
                _ => {
                    self.replan(&key);
                    continue;
                }
            }
            if self.done.get(&key).is_some_and(|(rv, a)| *rv == rv_of(&pod) && *a == action) {
                continue;
            }
            self.in_flight.insert(key.clone());
            let api = self.api.clone();
            let cfg = self.cfg.clone();
            writes.spawn(async move {
                let at = Timestamp::now();
                let result = perform(&api, &cfg, &pod, action, at).await;
                Done { key, action, rv: rv_of(&pod), uid: uid_of(&pod), at, result }
            });
        }
    }

    fn on_done(&mut self, done: Done) {
        self.in_flight.remove(&done.key);
        match done.result {
            Ok(updated) => {
                self.done.insert(done.key.clone(), (done.rv, done.action));
                let memo = self.memo.entry(done.uid).or_default();
                match done.action {
                    Action::Accept => memo.accepted_at = Some(done.at),
                    Action::Start => memo.started_at = Some(done.at),
                    Action::Exit => memo.exited_at = Some(done.at),
                    _ => {}
                }
                if let Some(pod) = updated
                    && let Some(cur) = self.pods.get(&done.key)
                    && uid_of(cur) == uid_of(&pod)
                    && not_older(&rv_of(&pod), &rv_of(cur))
                {
                    self.pods.insert(done.key.clone(), pod);
                }
                self.replan(&done.key);
            }
            Err(KubeletError::Status(404, _)) => {
                tracing::debug!(pod = ?done.key, "kubelet: pod gone");
            }
            Err(e) => {
                tracing::debug!(pod = ?done.key, action = ?done.action, error = %e, "kubelet: write failed, retrying");
                // Re-plan from the freshest cached state once the retry delay has passed.
                self.seq += 1;
                self.planned.insert(done.key.clone(), (self.seq, None));
                self.timers.push(Reverse((Instant::now() + WRITE_RETRY_DELAY, self.seq, done.key)));
            }
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Performs one transition against the API server; returns the updated pod when the answer
/// carries it.
async fn perform(
    api: &Api,
    cfg: &KubeletConfig,
    pod: &Value,
    action: Action,
    now: Timestamp,
) -> Result<Option<Value>, KubeletError> {
    let (ns, name) = key_of(pod);
    let path = pod_path(&ns, &name);
    let status_write = |new: Value| async move {
        let out = api.call(Method::PUT, &format!("{path}/status"), Some(&new)).await?;
        Ok::<_, KubeletError>(Some(out))
    };
    match action {
        Action::Bind => {
            let node = stages::node_for(pod, cfg);
            api.call(
                Method::POST,
                &format!("{}/binding", pod_path(&ns, &name)),
                Some(&stages::binding(pod, &node)),
            )
            .await?;
            Ok(None)
        }
        Action::Unschedulable => status_write(stages::unschedulable(pod, now, cfg)).await,
        Action::Accept => status_write(stages::accepted(pod, now)).await,
        Action::Start => status_write(stages::started(pod, now)).await,
        Action::Exit => status_write(stages::exited(pod, now)).await,
        Action::Terminate => status_write(stages::terminated(pod, now, cfg)).await,
        Action::FinalDelete => {
            let body = json!({"gracePeriodSeconds": 0, "preconditions": {"uid": uid_of(pod)}});
            match api.call(Method::DELETE, &pod_path(&ns, &name), Some(&body)).await {
                Ok(_) | Err(KubeletError::Status(409, _)) => Ok(None),
                Err(e) => Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::Pod;
    use kube::Api;
    use kube::api::{DeleteParams, ListParams, PostParams};
    use serde_json::{Value, json};
    use tokio_util::sync::CancellationToken;

    use super::stages::pod_condition;

    use super::{KubeletConfig, KubeletHandle, spawn};
    use crate::testing::TestSim;

    /// Longest any condition in these tests may take on a loaded 2-core machine.
    const DEADLINE: Duration = Duration::from_secs(15);

    struct Fixture {
        sim: TestSim,
        kubelet: KubeletHandle,
        pods: Api<Pod>,
        stop: CancellationToken,
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            self.stop.cancel();
        }
    }

    async fn fixture() -> Fixture {
        let sim = TestSim::start(crate::SimConfig::default()).await;
        let stop = CancellationToken::new();
        let cfg = KubeletConfig {
            run_time: Duration::from_millis(300),
            start_delay: Duration::from_millis(50),
            crash_loop_backoff: Duration::from_millis(100),
            ..KubeletConfig::default()
        };
        let kubelet = spawn(sim.url().to_string(), cfg, stop.clone()).unwrap();
        let pods = Api::namespaced(sim.client(), "default");
        Fixture { sim, kubelet, pods, stop }
    }

    impl Fixture {
        /// Creates `pod(name, annotations, restart)`.
        async fn create(&self, name: &str, annotations: Value, restart: &str) {
            self.pods
                .create(&PostParams::default(), &pod(name, annotations, restart))
                .await
                .unwrap();
        }
    }

    fn pod(name: &str, annotations: Value, restart: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"restartPolicy": restart, "containers": [
                {"name": "main", "image": "busybox"},
                {"name": "side", "image": "nginx:1.27"}
            ]}
        }))
        .expect("valid pod")
    }

    async fn wait_for(
        pods: &Api<Pod>,
        name: &str,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let start = tokio::time::Instant::now();
        loop {
            // Typed read: proves every field the kubelet wrote deserialises as a real Pod.
            let last = match pods.get_opt(name).await.expect("get pod") {
                Some(p) => serde_json::to_value(p).expect("pod to json"),
                None => Value::Null,
            };
            if pred(&last) {
                return last;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "pod {name}: timed out waiting for {what}; last: {last:#}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Polls until `n` pods have Succeeded; fails once `deadline` has passed since `start`.
    async fn all_succeeded(
        pods: &Api<Pod>,
        n: usize,
        start: tokio::time::Instant,
        deadline: Duration,
    ) {
        loop {
            let list = pods.list(&ListParams::default()).await.unwrap();
            let done = list
                .items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded"))
                .count();
            if done == n {
                return;
            }
            assert!(start.elapsed() < deadline, "only {done}/{n} pods finished");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn phase(p: &Value) -> &str {
        p.pointer("/status/phase").and_then(Value::as_str).unwrap_or_default()
    }

    #[tokio::test]
    async fn pods_run_to_completion_with_real_shapes() {
        let f = fixture().await;
        f.create("ok", json!({}), "Never").await;
        f.create("bad", json!({"kjob.io/sim-exit-code.side": "42"}), "Never").await;

        let ok = wait_for(&f.pods, "ok", "Succeeded", |p| phase(p) == "Succeeded").await;
        assert!(ok["spec"]["nodeName"].as_str().unwrap().starts_with("sim-node-"));
        assert!(ok["status"]["podIP"].as_str().unwrap().starts_with("10.244."));
        for cs in ok["status"]["containerStatuses"].as_array().unwrap() {
            assert!(cs["imageID"].as_str().unwrap().contains("@sha256:"), "{cs}");
            assert_eq!(cs["state"]["terminated"]["exitCode"], 0);
            assert_eq!(cs["state"]["terminated"]["reason"], "Completed");
            assert_eq!(cs["ready"], false);
        }
        assert_eq!(pod_condition(&ok, "Ready").unwrap()["reason"], "PodCompleted");
        assert_eq!(pod_condition(&ok, "PodScheduled").unwrap()["status"], "True");
        assert_eq!(pod_condition(&ok, "Initialized").unwrap()["status"], "True");

        let bad = wait_for(&f.pods, "bad", "Failed", |p| phase(p) == "Failed").await;
        let side = bad["status"]["containerStatuses"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "side")
            .unwrap();
        assert_eq!(side["state"]["terminated"]["exitCode"], 42);
        assert_eq!(side["state"]["terminated"]["reason"], "Error");
        assert_eq!(pod_condition(&bad, "Ready").unwrap()["reason"], "PodFailed");
    }

    #[tokio::test]
    async fn on_failure_restarts_and_never_runs_until_deleted() {
        let f = fixture().await;
        f.create("crash", json!({"kjob.io/sim-exit-code": "2"}), "OnFailure").await;
        let crashed = wait_for(&f.pods, "crash", "a restart", |p| {
            p.pointer("/status/containerStatuses/0/restartCount")
                .and_then(Value::as_i64)
                .unwrap_or(0)
                >= 2
        })
        .await;
        assert_eq!(phase(&crashed), "Running");
        assert_eq!(
            crashed["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"],
            2
        );

        f.create("forever", json!({"kjob.io/sim-run-time": "never"}), "Never").await;
        let running = wait_for(&f.pods, "forever", "Running", |p| phase(p) == "Running").await;
        assert_eq!(pod_condition(&running, "Ready").unwrap()["status"], "True");
        assert_eq!(running["status"]["containerStatuses"][0]["started"], true);
        tokio::time::sleep(Duration::from_millis(600)).await;
        let still = wait_for(&f.pods, "forever", "Running", |p| phase(p) == "Running").await;
        assert!(still["status"]["containerStatuses"][0]["state"]["running"].is_object());
    }

    #[tokio::test]
    async fn graceful_deletion_terminates_then_deletes() {
        let f = fixture().await;
        let pp = PostParams::default();
        let annotations = json!({"kjob.io/sim-run-time": "never"});
        f.create("plain", annotations.clone(), "Never").await;
        let mut held = pod("held", annotations, "Never");
        held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
        f.pods.create(&pp, &held).await.unwrap();
        for name in ["plain", "held"] {
            wait_for(&f.pods, name, "Running", |p| phase(p) == "Running").await;
            f.pods.delete(name, &DeleteParams::default()).await.unwrap();
        }
        wait_for(&f.pods, "plain", "removal", Value::is_null).await;
        let held = wait_for(&f.pods, "held", "terminated and zero grace", |p| {
            phase(p) == "Failed"
                && p.pointer("/metadata/deletionGracePeriodSeconds") == Some(&json!(0))
        })
        .await;
        let term = &held["status"]["containerStatuses"][0]["state"]["terminated"];
        assert_eq!(term["exitCode"], 143, "SIGTERM honoured within the grace period");
        assert_eq!(term["reason"], "Error");
        // Removing the finalizer lets the server delete it.
        f.pods
            .patch(
                "held",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await
            .unwrap();
        wait_for(&f.pods, "held", "removal", Value::is_null).await;
    }

    #[tokio::test]
    async fn eviction_adds_disruption_target() {
        let f = fixture().await;
        let mut p = pod("victim", json!({"kjob.io/sim-run-time": "never"}), "Never");
        p.metadata.finalizers = Some(vec!["example.com/hold".into()]);
        f.pods.create(&PostParams::default(), &p).await.unwrap();
        wait_for(&f.pods, "victim", "Running", |p| phase(p) == "Running").await;
        f.kubelet.evict("default", "victim").await.unwrap();
        let gone = wait_for(&f.pods, "victim", "Failed", |p| phase(p) == "Failed").await;
        let dt = pod_condition(&gone, "DisruptionTarget").expect("DisruptionTarget condition");
        assert_eq!(dt["status"], "True");
        assert_eq!(dt["reason"], "EvictionByEvictionAPI");
    }

    #[tokio::test]
    async fn pause_holds_pods_and_resume_releases_them() {
        let f = fixture().await;
        f.kubelet.pause();
        assert!(f.kubelet.is_paused());
        f.create("waiting", json!({}), "Never").await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let p = f.pods.get("waiting").await.unwrap();
        assert!(p.spec.unwrap().node_name.is_none(), "a paused kubelet binds nothing");
        f.kubelet.resume();
        wait_for(&f.pods, "waiting", "Succeeded", |p| phase(p) == "Succeeded").await;
    }

    #[tokio::test]
    async fn recovers_from_closed_watches_and_compaction() {
        let f = fixture().await;
        let never = json!({"kjob.io/sim-run-time": "never"});
        f.create("before", never.clone(), "Never").await;
        wait_for(&f.pods, "before", "Running", |p| phase(p) == "Running").await;
        // Writes the kubelet misses while its watch is down, then a history it cannot resume.
        f.sim.close_watches();
        f.create("during", never.clone(), "Never").await;
        f.sim.compact();
        f.sim.close_watches();
        f.create("after", never, "Never").await;
        for name in ["during", "after"] {
            wait_for(&f.pods, name, "Running", |p| phase(p) == "Running").await;
        }
    }

    /// A backlog of due writes (more pods than writes in flight, watch events arriving while
    /// they wait) never writes a transition twice: each pod gets Accept, Start and Exit once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_backlog_writes_each_transition_once() {
        let f = fixture().await;
        let n = super::MAX_IN_FLIGHT * 4;
        let modified = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashMap::<
            String,
            usize,
        >::new()));
        let counter = {
            let (pods, modified) = (f.pods.clone(), modified.clone());
            tokio::spawn(async move {
                use futures::{StreamExt, TryStreamExt};
                let wp = kube::api::WatchParams::default();
                let mut s = pods.watch(&wp, "0").await.unwrap().boxed();
                while let Ok(Some(ev)) = s.try_next().await {
                    if let kube::api::WatchEvent::Modified(p) = ev {
                        let name = p.metadata.name.unwrap_or_default();
                        *modified.lock().unwrap().entry(name).or_default() += 1;
                    }
                }
            })
        };
        f.kubelet.pause();
        let pp = PostParams::default();
        for i in 0..n {
            let p = pod(&format!("backlog-{i}"), json!({"kjob.io/sim-run-time": "50ms"}), "Never");
            f.pods.create(&pp, &p).await.unwrap();
        }
        f.kubelet.resume();
        all_succeeded(&f.pods, n, tokio::time::Instant::now(), DEADLINE * 2).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        counter.abort();
        let modified = modified.lock().unwrap();
        // Bind (this kubelet schedules here), Accept, Start, Exit.
        let over: Vec<_> = modified.iter().filter(|(_, c)| **c > 4).collect();
        assert!(over.is_empty(), "pods written more than once per transition: {over:?}");
        assert_eq!(modified.len(), n);
    }

    #[tokio::test]
    async fn keeps_up_with_many_pods() {
        let f = fixture().await;
        const N: usize = 100;
        let start = tokio::time::Instant::now();
        for i in 0..N {
            f.create(&format!("bulk-{i}"), json!({"kjob.io/sim-run-time": "0s"}), "Never").await;
        }
        let created = start.elapsed();
        all_succeeded(&f.pods, N, start, Duration::from_secs(20)).await;
        // The kubelet must not lag far behind the creations.
        let lag = start.elapsed() - created;
        assert!(lag < Duration::from_secs(10), "kubelet lagged {lag:?} behind {N} creations");
    }
}
