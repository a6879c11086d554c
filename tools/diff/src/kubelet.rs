//! The scripted kubelet: on a control plane without kubelet or scheduler it binds, runs and
//! ends every pod of one namespace as its [`Fate`] says, writing real kubelet statuses (the
//! shapes of `kjob_sim::kubelet::stages`). A pod's fate is keyed by its completion index or its
//! creation order within the Job, never by anything the controller chooses (its name).
//! It also records every pod it saw: its first and last version.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kjob_sim::kubelet::KubeletConfig;
use kjob_sim::kubelet::stages::{self, Action, Memo};
use kube::api::{Api, DeleteParams, EvictParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::case::{Fate, Fates, Slot};

/// Delay before re-planning a pod whose write failed (conflict, timeout).
const WRITE_RETRY_DELAY: Duration = Duration::from_millis(250);
/// Delay between accepting a pod and running its container (image pull, start).
const START_DELAY: Duration = Duration::from_millis(100);
/// Timeout of every request to the API server.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Annotation with the completion index (set by both controllers on Indexed Jobs).
pub const INDEX_ANNOTATION: &str = "batch.kubernetes.io/job-completion-index";
/// Label naming the pod's Job.
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";

/// What the kubelet saw of one pod.
#[derive(Debug, Clone, PartialEq)]
pub struct PodRecord {
    /// The pod as first seen (as created).
    pub first: Value,
    /// The pod as last seen (its last version before deletion, or now).
    pub last: Value,
    /// Whether it was deleted from the server.
    pub gone: bool,
    /// Whether the kubelet (playing a user) deleted or evicted it.
    pub disrupted_by_script: bool,
}

type Records = Arc<Mutex<Vec<PodRecord>>>;
/// When the kubelet first started a container of the namespace.
type FirstStart = Arc<OnceLock<Instant>>;

/// A running scripted kubelet; [`ScriptedKubelet::stop`] returns what it saw.
#[derive(Debug)]
pub struct ScriptedKubelet {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    records: Records,
    first_start: FirstStart,
}

/// The kubelet's settings: every pod goes to node `kjob-node-0`; exit 143 on deletion.
fn config() -> KubeletConfig {
    KubeletConfig {
        node_prefix: kjob_testkit::cluster::NODE_PREFIX.into(),
        nodes: 1,
        schedule: true,
        run_time: Duration::from_millis(500),
        start_delay: START_DELAY,
        termination_time: Duration::ZERO,
        crash_loop_backoff: Duration::from_secs(10),
        request_timeout: REQUEST_TIMEOUT,
        only_own_nodes: false,
    }
}

impl ScriptedKubelet {
    /// Starts playing the pods of `ns` with `fates`.
    pub fn start(client: kube::Client, ns: &str, fates: Fates) -> Self {
        let api: Api<Pod> = Api::namespaced(client, ns);
        let stop = CancellationToken::new();
        let records: Records = Arc::default();
        let first_start: FirstStart = Arc::default();
        let task =
            tokio::spawn(run(api, fates, stop.clone(), records.clone(), first_start.clone()));
        Self { stop, task, records, first_start }
    }

    /// When the first container of the namespace started running, if one did.
    pub fn first_start(&self) -> Option<Instant> {
        self.first_start.get().copied()
    }

    /// A copy of the records so far.
    pub fn records(&self) -> Vec<PodRecord> {
        self.records.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Stops and returns every pod seen, in order of first sight.
    pub async fn stop(self) -> Vec<PodRecord> {
        self.stop.cancel();
        let _ = self.task.await;
        self.records.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

fn uid_of(p: &Value) -> String {
    p.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or_default().to_string()
}

fn rv_of(p: &Value) -> String {
    p.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or_default().to_string()
}

fn name_of(p: &Value) -> String {
    p.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string()
}

/// The pod's slot among its Job's pods; `seen` counts pods per (job, index) so far. A pod
/// of no Job (a user's own) has none: it gets the default fate.
fn slot(pod: &Value, seen: &mut HashMap<(String, Option<u32>), usize>) -> Option<(String, Slot)> {
    let job = pod
        .pointer("/metadata/labels")
        .and_then(|l| l.get(JOB_NAME_LABEL))
        .and_then(Value::as_str)?
        .to_string();
    let index = pod
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(INDEX_ANNOTATION))
        .and_then(Value::as_str)
        .and_then(|i| i.parse::<u32>().ok());
    let n = seen.entry((job.clone(), index)).or_default();
    let this = *n;
    *n += 1;
    Some((
        job,
        match index {
            Some(index) => Slot::Index { index, attempt: this },
            None => Slot::Order(this),
        },
    ))
}

async fn run(
    api: Api<Pod>,
    fates: Fates,
    stop: CancellationToken,
    records: Records,
    first_start: FirstStart,
) {
    let mut pods: HashMap<String, (watch::Sender<Option<Value>>, usize)> = HashMap::new();
    let mut seen = HashMap::new();
    let mut players = JoinSet::new();
    // kube-runtime's default backoff between failed list/watch attempts (no hot loop).
    let stream = watcher(api.clone(), watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    loop {
        let ev = tokio::select! {
            _ = stop.cancelled() => break,
            ev = stream.next() => ev,
        };
        let Some(ev) = ev else { break };
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                tracing::warn!(error = %e, "scripted kubelet: watch error");
                continue;
            }
        };
        let (pod, deleted) = match ev {
            watcher::Event::Apply(p) | watcher::Event::InitApply(p) => (p, false),
            watcher::Event::Delete(p) => (p, true),
            _ => continue,
        };
        let Ok(pod) = serde_json::to_value(&pod) else { continue };
        let uid = uid_of(&pod);
        let Ok(mut recs) = records.lock() else { break };
        if let Some((tx, i)) = pods.get(&uid) {
            recs[*i].last = pod.clone();
            recs[*i].gone = deleted;
            let _ = tx.send(if deleted { None } else { Some(pod) });
            continue;
        }
        let fate = slot(&pod, &mut seen)
            .map_or_else(|| fates.default.clone(), |(job, s)| fates.of_job(&job, s));
        recs.push(PodRecord {
            first: pod.clone(),
            last: pod.clone(),
            gone: deleted,
            disrupted_by_script: false,
        });
        let i = recs.len() - 1;
        drop(recs);
        if deleted {
            continue;
        }
        let (tx, rx) = watch::channel(Some(pod));
        pods.insert(uid, (tx, i));
        let player = Player {
            api: api.clone(),
            fate,
            records: records.clone(),
            index: i,
            first_start: first_start.clone(),
        };
        let stop = stop.clone();
        players.spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = player.play(rx) => {}
            }
        });
    }
    players.shutdown().await;
}

/// A user's disruption of a running pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Disruption {
    Evict,
    Delete,
    /// Its labels edited so its Job's selector no longer matches.
    Relabel,
}

/// What a relabelling user sets the label of the Job's selector to.
const RELABELLED: &str = "released";

struct Player {
    api: Api<Pod>,
    fate: Fate,
    records: Records,
    index: usize,
    first_start: FirstStart,
}

/// The pod as the sim kubelet's stages read it: the fate in its annotations (never written).
fn with_fate(pod: &Value, fate: &Fate) -> Value {
    let mut v = pod.clone();
    if !v["metadata"]["annotations"].is_object() {
        v["metadata"]["annotations"] = json!({});
    }
    let a = &mut v["metadata"]["annotations"];
    a[stages::RUN_TIME_ANNOTATION] = json!(format!("{}ms", fate.run_ms));
    a[stages::EXIT_CODE_ANNOTATION] = json!(fate.exit_code.to_string());
    if let Some(ms) = fate.start_delay_ms {
        a[stages::START_DELAY_ANNOTATION] = json!(format!("{ms}ms"));
    }
    if let Some(ms) = fate.termination_ms {
        a[stages::TERMINATION_TIME_ANNOTATION] = json!(format!("{ms}ms"));
    }
    for (c, code) in &fate.container_exit_codes {
        a[format!("{}{c}", stages::EXIT_CODE_CONTAINER_PREFIX)] = json!(code.to_string());
    }
    v
}

fn add(t: Timestamp, ms: u64) -> Timestamp {
    t.checked_add(jiff::SignedDuration::from_millis(i64::try_from(ms).unwrap_or(i64::MAX)))
        .unwrap_or(t)
}

impl Player {
    async fn play(self, mut rx: watch::Receiver<Option<Value>>) {
        let cfg = config();
        let mut memo = Memo::default();
        let mut done: Option<(String, Action)> = None;
        let mut disrupted = false;
        loop {
            let Some(pod) = rx.borrow_and_update().clone() else { return };
            let view = with_fate(&pod, &self.fate);
            let now = Timestamp::now();
            let deleting = pod.pointer("/metadata/deletionTimestamp").is_some_and(|d| !d.is_null());
            let phase = pod.pointer("/status/phase").and_then(Value::as_str).unwrap_or_default();
            let mut next: Option<(Timestamp, Option<Action>, Option<Disruption>)> =
                stages::plan(&view, Some(&memo), now, &cfg)
                    .filter(|(_, a)| done.as_ref() != Some(&(rv_of(&pod), *a)))
                    .map(|(t, a)| (t, Some(a), None));
            if !disrupted
                && !deleting
                && phase == "Running"
                && let Some(started) = memo.started_at
            {
                let f = &self.fate;
                let d = match (f.evict_after_ms, f.delete_after_ms, f.relabel_after_ms) {
                    (Some(ms), _, _) => Some((add(started, ms), Disruption::Evict)),
                    (None, Some(ms), _) => Some((add(started, ms), Disruption::Delete)),
                    (None, None, Some(ms)) => Some((add(started, ms), Disruption::Relabel)),
                    _ => None,
                };
                if let Some((t, d)) = d
                    && next.as_ref().is_none_or(|(nt, _, _)| t < *nt)
                {
                    next = Some((t, None, Some(d)));
                }
            }
            let Some((when, action, disruption)) = next else {
                if rx.changed().await.is_err() {
                    return;
                }
                continue;
            };
            let wait = Duration::try_from(when.duration_since(now)).unwrap_or(Duration::ZERO);
            tokio::select! {
                r = rx.changed() => {
                    if r.is_err() { return; }
                    continue;
                }
                _ = tokio::time::sleep(wait) => {}
            }
            let at = Timestamp::now();
            let result = match (action, disruption) {
                (Some(a), _) => self.perform(&pod, &view, a, at, &cfg).await,
                (None, Some(d)) => self.disrupt(&pod, d).await,
                (None, None) => Ok(()),
            };
            match result {
                Ok(()) => {
                    if let Some(a) = action {
                        done = Some((rv_of(&pod), a));
                        match a {
                            Action::Accept => memo.accepted_at = Some(at),
                            Action::Start => {
                                memo.started_at = Some(at);
                                let _ = self.first_start.set(Instant::now());
                            }
                            Action::Exit => memo.exited_at = Some(at),
                            _ => {}
                        }
                    } else {
                        disrupted = true;
                        // A relabelled pod is not deleted by the script (its end is its own).
                        if disruption != Some(Disruption::Relabel)
                            && let Ok(mut r) = self.records.lock()
                        {
                            r[self.index].disrupted_by_script = true;
                        }
                    }
                }
                Err(kube::Error::Api(s)) if s.code == 404 => return,
                Err(e) => {
                    tracing::debug!(pod = %name_of(&pod), error = %e, "scripted kubelet: write failed");
                    // A conflict means a newer version is on its way; otherwise retry.
                    tokio::select! {
                        r = rx.changed() => if r.is_err() { return },
                        _ = tokio::time::sleep(WRITE_RETRY_DELAY) => {}
                    }
                }
            }
        }
    }

    async fn perform(
        &self,
        pod: &Value,
        view: &Value,
        action: Action,
        now: Timestamp,
        cfg: &KubeletConfig,
    ) -> Result<(), kube::Error> {
        let name = name_of(pod);
        let status = |new: Value| {
            // Only the status changes: the server's metadata (no fate annotations) and its
            // resourceVersion, so a stale write is refused.
            let mut p = pod.clone();
            p["status"] = new["status"].clone();
            p
        };
        let new = match action {
            Action::Bind => {
                let b = stages::binding(pod, &stages::node_for(pod, cfg));
                let _: Value = self
                    .api
                    .create_subresource("binding", &name, &PostParams::default(), &b)
                    .await?;
                return Ok(());
            }
            Action::FinalDelete => {
                let dp = DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(Preconditions {
                        uid: Some(uid_of(pod)),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                return match self.api.delete(&name, &dp).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                    Err(e) => Err(e),
                };
            }
            Action::Unschedulable => status(stages::unschedulable(view, now, cfg)),
            Action::Accept => status(stages::accepted(view, now)),
            Action::Start => status(stages::started(view, now)),
            Action::Exit => status(stages::exited(view, now)),
            Action::Terminate => status(stages::terminated(view, now, cfg)),
        };
        let typed: Pod = serde_json::from_value(new).map_err(kube::Error::SerdeError)?;
        self.api.replace_status(&name, &PostParams::default(), &typed).await?;
        Ok(())
    }

    async fn disrupt(&self, pod: &Value, d: Disruption) -> Result<(), kube::Error> {
        let name = name_of(pod);
        match d {
            Disruption::Evict => {
                self.api.evict(&name, &EvictParams::default()).await?;
            }
            Disruption::Delete => {
                self.api.delete(&name, &DeleteParams::default()).await?;
            }
            Disruption::Relabel => {
                let patch =
                    json!({"metadata": {"labels": {kjob_core::CONTROLLER_UID_LABEL: RELABELLED}}});
                let _: Pod =
                    self.api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            }
        }
        Ok(())
    }
}
