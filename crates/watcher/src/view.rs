//! The shared Job view the leading watcher writes for the workers: each managed Job's object and
//! its pods, trimmed to what syncJob reads, kept in kjob-queue's Redis (see
//! `kjob_workqueue::view` for the trust rules). Workers plan from it as upstream plans from its
//! informer cache, instead of GETting the Job and LISTing its pods at every sync.
//!
//! Pure: the informer calls these to turn its events into [`ViewWrite`]s, which ride on the same
//! Add items as the handlers' observations (written first, in the same script).

use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::cache::{JobInfo, PodInfo, Store};

/// Most pods written by one snapshot item: keeps one Add item (and one script run) well under a
/// megabyte of pods.
pub const SNAPSHOT_CHUNK: usize = 200;

/// One write to a Job's shared view, its entry shared (see [`kjob_core::ViewOp`]).
pub type ViewWrite = kjob_core::ViewOp<Arc<[u8]>>;

/// The Job as the view keeps it: everything but managedFields (the worker creates pods from the
/// template and writes status on top of it).
pub fn trim_job(job: &Job) -> Arc<[u8]> {
    if job.metadata.managed_fields.is_none() {
        // Decoded as a [`WatchedJob`]: nothing to drop, so no copy.
        return serde_json::to_vec(job).unwrap_or_default().into();
    }
    let mut j = job.clone();
    j.metadata.managed_fields = None;
    serde_json::to_vec(&j).unwrap_or_default().into()
}

/// A Job as the watcher decodes it off the watch stream: whole but for managedFields, which
/// serde skips while parsing. A Job's managedFields grow with every status writer and decode
/// into JSON trees (`fieldsV1`), one allocation per field; the watcher never reads them and the
/// view drops them.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchedJob {
    /// Metadata without managedFields.
    #[serde(deserialize_with = "meta_without_managed_fields")]
    pub metadata: ObjectMeta,
    /// The spec, whole.
    #[serde(default)]
    pub spec: Option<k8s_openapi::api::batch::v1::JobSpec>,
    /// The status, whole.
    #[serde(default)]
    pub status: Option<k8s_openapi::api::batch::v1::JobStatus>,
}

impl WatchedJob {
    /// The typed Job (apiVersion and kind are the type's own).
    pub fn into_job(self) -> Job {
        Job { metadata: self.metadata, spec: self.spec, status: self.status }
    }
}

impl kube::Resource for WatchedJob {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "Job".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "batch".into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "jobs".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The pod as the view keeps it: what syncJob reads ([`WatchedPod::view_entry`]), taken from a
/// whole Pod (tests and tools; the watcher decodes pods as [`WatchedPod`]s).
pub fn trim_pod(pod: &Pod) -> Arc<[u8]> {
    let json = serde_json::to_vec(pod).unwrap_or_default();
    serde_json::from_slice::<WatchedPod>(&json).map(|p| p.view_entry()).unwrap_or_default()
}

/// A pod as the watcher decodes it off the watch stream (JSON or protobuf,
/// [`crate::kube_proto`]): what the handlers read (the metadata, without managedFields) and what
/// syncJob reads of the spec and status. Everything else (container specs, volumes, IPs,
/// probe times, messages, managedFields: most of a pod's bytes) is skipped while decoding
/// instead of allocated. Its [`view_entry`](Self::view_entry) is the pod the shared view keeps.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchedPod {
    /// Metadata without managedFields.
    #[serde(deserialize_with = "meta_without_managed_fields")]
    pub metadata: ObjectMeta,
    /// The parts of the spec syncJob reads.
    #[serde(default)]
    pub spec: Option<WatchedPodSpec>,
    /// The parts of the status syncJob reads.
    #[serde(default)]
    pub status: Option<WatchedPodStatus>,
}

/// The parts of a pod spec syncJob reads.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchedPodSpec {
    /// `spec.nodeName` (pod deletion order).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Init containers' names and restart policies (sidecars count for the finish time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_containers: Option<Vec<WatchedContainer>>,
    /// Never read, always empty: `containers` is required in a PodSpec (the JSON entries of
    /// watchers before the compact one wrote it so).
    #[serde(skip_deserializing, default)]
    pub containers: Vec<WatchedContainer>,
}

/// A container's name and restart policy.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchedContainer {
    /// Name.
    pub name: String,
    /// `restartPolicy` (`Always` for a sidecar).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<String>,
}

/// The parts of a pod status syncJob reads (`crates/reconcile`'s `pod`, `summary` and
/// `pod_failure_policy` modules): the phase, every condition's type, status and transition
/// time (Ready orders deletions and dates a finish; a podFailurePolicy rule may name any
/// type), and each container's name, restarts and terminated exit code and finish time.
/// Messages, reasons, probe times, IPs, images and start times are read by no decision.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchedPodStatus {
    /// `phase`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// `conditions`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<WatchedCondition>>,
    /// `containerStatuses`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_statuses: Option<Vec<WatchedContainerStatus>>,
    /// `initContainerStatuses`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_container_statuses: Option<Vec<WatchedContainerStatus>>,
}

/// A pod condition's type, status and last transition.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchedCondition {
    /// `type`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `status`.
    pub status: String,
    /// `lastTransitionTime`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
}

/// A container status: name, restarts, and how it terminated.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchedContainerStatus {
    /// `name`.
    pub name: String,
    /// `restartCount`.
    #[serde(default)]
    pub restart_count: i32,
    /// `state`, its `terminated` part only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<WatchedContainerState>,
}

/// A container state, its `terminated` part only.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchedContainerState {
    /// `terminated`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminated: Option<WatchedTerminated>,
}

/// A terminated container's exit code and finish time.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchedTerminated {
    /// `exitCode`.
    #[serde(default)]
    pub exit_code: i32,
    /// `finishedAt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
}

/// The annotations syncJob reads: its own (`batch.kubernetes.io/`: the completion index and
/// the per-index failure counts). Others (tools' notes, kubectl's) change nothing it decides.
pub const VIEW_ANNOTATION_PREFIX: &str = "batch.kubernetes.io/";

impl WatchedPod {
    /// The view's entry of this pod ([`kjob_reconcile::view_pod`]): what syncJob reads, and
    /// nothing else, so that two versions of a pod whose differences no decision reads have
    /// the same entry (and the second writes nothing). No resourceVersion: it changes on every
    /// write, and an entry that carried it would be rewritten for updates no decision reads.
    pub fn view_entry(&self) -> Arc<[u8]> {
        use kjob_reconcile::view_pod as vp;
        let m = &self.metadata;
        let owners = m.owner_references.as_deref().unwrap_or_default();
        let controller = owners.iter().find(|r| r.controller == Some(true));
        let dict = vp::Dict::new(controller.map(|c| (c.name.as_str(), c.uid.as_str())));
        let clock = vp::Clock::new(m.creation_timestamp.as_ref());
        let (name, name_after_controller) = dict.name(m.name.as_deref().unwrap_or_default());
        let (deleted, deleted_nanos) = clock.since(m.deletion_timestamp.as_ref());
        let (uuid, uid) = vp::uid_parts(m.uid.as_deref().unwrap_or_default());
        let pairs = |kv: &mut dyn Iterator<Item = (&String, &String)>| {
            kv.map(|(k, v)| dict.pair(k, v)).collect()
        };
        // Owner references are coded without references to the controller: they hold it.
        let plain = vp::Dict::default();
        let view = vp::ViewPod {
            name,
            name_after_controller,
            uuid,
            uid,
            created: m.creation_timestamp.as_ref().map(|t| t.0.as_second()),
            created_nanos: clock.since(m.creation_timestamp.as_ref()).1,
            deleted,
            deleted_nanos,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            labels: pairs(&mut m.labels.iter().flatten()),
            annotations: pairs(
                &mut m
                    .annotations
                    .iter()
                    .flatten()
                    .filter(|(k, _)| k.starts_with(VIEW_ANNOTATION_PREFIX)),
            ),
            finalizers: m.finalizers.iter().flatten().map(|f| dict.sym(f)).collect(),
            owners: owners
                .iter()
                .map(|o| {
                    let (api_version, api_version_text) = plain.code(&o.api_version);
                    let (kind, kind_text) = plain.code(&o.kind);
                    let (uuid, uid) = vp::uid_parts(&o.uid);
                    vp::Owner {
                        api_version,
                        api_version_text,
                        kind,
                        kind_text,
                        name: o.name.clone(),
                        uuid,
                        uid,
                        controller: o.controller,
                        block_owner_deletion: o.block_owner_deletion,
                    }
                })
                .collect(),
            spec: self.spec.as_ref().map(|s| vp::Spec {
                node_name: s.node_name.clone().unwrap_or_default(),
                init_containers: s
                    .init_containers
                    .iter()
                    .flatten()
                    .map(|c| {
                        let (restart_policy, restart_policy_text) =
                            dict.code(c.restart_policy.as_deref().unwrap_or_default());
                        vp::InitContainer {
                            name: c.name.clone(),
                            restart_policy,
                            restart_policy_text,
                        }
                    })
                    .collect(),
            }),
            status: self.status.as_ref().map(|s| {
                let statuses = |v: &Option<Vec<WatchedContainerStatus>>| {
                    v.iter()
                        .flatten()
                        .map(|c| {
                            let t = c.state.as_ref().and_then(|s| s.terminated.as_ref());
                            let (finished, finished_nanos) =
                                clock.since(t.and_then(|t| t.finished_at.as_ref()));
                            vp::ContainerStat {
                                name: c.name.clone(),
                                restart_count: c.restart_count,
                                has_state: c.state.is_some(),
                                terminated: t.is_some(),
                                exit_code: t.map_or(0, |t| t.exit_code),
                                finished,
                                finished_nanos,
                            }
                        })
                        .collect()
                };
                let (phase, phase_text) = dict.code(s.phase.as_deref().unwrap_or_default());
                vp::Status {
                    phase,
                    phase_text,
                    conditions: s
                        .conditions
                        .iter()
                        .flatten()
                        .map(|c| {
                            let (type_, type_text) = dict.code(&c.type_);
                            let (status, status_text) = dict.code(&c.status);
                            let (changed, changed_nanos) =
                                clock.since(c.last_transition_time.as_ref());
                            vp::Condition {
                                type_,
                                type_text,
                                status,
                                status_text,
                                changed,
                                changed_nanos,
                            }
                        })
                        .collect(),
                    containers: statuses(&s.container_statuses),
                    init_containers: statuses(&s.init_container_statuses),
                }
            }),
        };
        view.to_entry().into()
    }
}

/// ObjectMeta's fields but managedFields, which serde then skips without allocating.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetaFields {
    #[serde(default)]
    annotations: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default)]
    creation_timestamp: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    #[serde(default)]
    deletion_grace_period_seconds: Option<i64>,
    #[serde(default)]
    deletion_timestamp: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    #[serde(default)]
    finalizers: Option<Vec<String>>,
    #[serde(default)]
    generate_name: Option<String>,
    #[serde(default)]
    generation: Option<i64>,
    #[serde(default)]
    labels: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    owner_references: Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    self_link: Option<String>,
    #[serde(default)]
    uid: Option<String>,
}

fn meta_without_managed_fields<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<ObjectMeta, D::Error> {
    let m = <MetaFields as serde::Deserialize>::deserialize(d)?;
    Ok(ObjectMeta {
        annotations: m.annotations,
        creation_timestamp: m.creation_timestamp,
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        deletion_timestamp: m.deletion_timestamp,
        finalizers: m.finalizers,
        generate_name: m.generate_name,
        generation: m.generation,
        labels: m.labels,
        managed_fields: None,
        name: m.name,
        namespace: m.namespace,
        owner_references: m.owner_references,
        resource_version: m.resource_version,
        self_link: m.self_link,
        uid: m.uid,
    })
}

impl kube::Resource for WatchedPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "Pod".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "pods".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Whether a pod's view JSON is worth keeping: its controller is a Job that is managed
/// (`manages`) and unfinished, or a Job the cache does not know yet (its add may come after its
/// pods', and then snapshots them). A pod of anything else (a ReplicaSet, a Job of another
/// controller, a finished Job) keeps none: only its metadata, which the handlers and the orphan
/// handling read.
pub fn may_be_viewed(pod: &PodInfo, store: &Store, manages: impl Fn(&JobInfo) -> bool) -> bool {
    let Some(cref) = pod.controller.as_ref().filter(|c| c.kind == "Job") else { return false };
    match store.job_by_name(&pod.namespace, &cref.name) {
        Some(job) if job.uid == cref.uid => manages(job) && keeps_pods(job),
        // Another Job of that name: the pod's own is either gone (its pods go to the garbage
        // collector) or not seen yet; kept for the latter.
        _ => true,
    }
}

/// Whether the view of `job` is kept: managed, and not finished (a finished Job is never synced
/// again, so its pods need not be mirrored).
pub fn keeps_pods(job: &JobInfo) -> bool {
    !job.finished
}

fn job_write(job: &JobInfo) -> Option<ViewWrite> {
    job.view.as_ref().map(|object| ViewWrite::Job {
        uid: job.uid.clone(),
        object: object.clone(),
        resource_version: job.resource_version.clone(),
    })
}

/// A full snapshot of `job`'s view from the store, in chunks of at most [`SNAPSHOT_CHUNK`] pods
/// (each chunk one Add item; only the last trusts the view).
pub fn snapshot(job: &JobInfo, store: &Store) -> Vec<Vec<ViewWrite>> {
    let mut chunks = vec![vec![ViewWrite::Reset { uid: job.uid.clone() }]];
    if keeps_pods(job) {
        let mut pods: Vec<&PodInfo> = store.pods_controlled_by(&job.uid).collect();
        pods.sort_by(|a, b| a.name.cmp(&b.name));
        for pod in pods {
            let Some(object) = pod.view.clone() else { continue };
            if chunks.last().is_some_and(|c| c.len() >= SNAPSHOT_CHUNK) {
                chunks.push(Vec::new());
            }
            if let Some(c) = chunks.last_mut() {
                c.push(ViewWrite::Pod { name: pod.name.clone(), object });
            }
        }
    }
    let last = chunks.last_mut().expect("one chunk at least");
    last.extend(job_write(job));
    if orphans_match(job, store) {
        last.push(ViewWrite::Orphans);
    }
    last.push(ViewWrite::Trust);
    chunks
}

/// Whether an orphan in the store (no controller, not deleting, labelled) matches `job`'s
/// selector: such a pod is adopted at the Job's next sync, which needs an API list.
fn orphans_match(job: &JobInfo, store: &Store) -> bool {
    store.pods().any(|p| {
        p.controller.is_none()
            && !p.deleting
            && p.namespace == job.namespace
            && !p.labels.is_empty()
            && job.selector.matches(&p.labels)
    })
}

/// Writes for a Job event: `old` is the cached version (None for an add), `new` the event's.
/// A new UID (or a Job first seen) gets a snapshot; a Job turning finished drops its pods.
pub fn job_writes(old: Option<&JobInfo>, new: &JobInfo, store: &Store) -> Vec<Vec<ViewWrite>> {
    match old {
        Some(o) if o.uid == new.uid && (o.finished || !new.finished) => {
            job_write(new).map(|w| vec![vec![w]]).unwrap_or_default()
        }
        _ => snapshot(new, store),
    }
}

/// Writes for a pod event on the views of the Jobs it belongs to: `(job key, writes)` pairs.
/// `owner(pod)` resolves a pod's controller to a managed Job in the store.
pub fn pod_writes<'a>(
    old: Option<&PodInfo>,
    new: Option<&PodInfo>,
    owner: impl Fn(&PodInfo) -> Option<&'a JobInfo>,
) -> Vec<(String, ViewWrite)> {
    let mut out = Vec::new();
    let old_job = old.and_then(&owner).filter(|j| keeps_pods(j));
    let new_job = new.and_then(&owner).filter(|j| keeps_pods(j));
    if let (Some(o), Some(pod)) = (old_job, old) {
        // Gone, or now another Job's (or nobody's): no longer in this view.
        if new_job.is_none_or(|n| n.uid != o.uid) || new.is_none() {
            out.push((o.key(), ViewWrite::DeletePod { name: pod.name.clone() }));
        }
    }
    if let (Some(n), Some(pod)) = (new_job, new)
        && let Some(object) = pod.view.clone()
    {
        // The same Job's view already holds this JSON: the update changed nothing syncJob
        // reads (a resourceVersion, an IP, a probe time, someone else's annotation).
        let unchanged = old_job.is_some_and(|o| o.uid == n.uid)
            && old.and_then(|o| o.view.as_deref()) == Some(&*object);
        if !unchanged {
            out.push((n.key(), ViewWrite::Pod { name: pod.name.clone(), object }));
        }
    }
    out
}

/// Jobs that gain an orphan notice from an orphan pod's add or update.
pub fn orphan_notices<'a>(
    pod: &'a PodInfo,
    jobs: impl Iterator<Item = &'a JobInfo> + 'a,
) -> impl Iterator<Item = String> + 'a {
    // Only orphans are looked for: a pod with a controller costs no walk over the Jobs.
    let orphan = pod.controller.is_none() && !pod.deleting && !pod.labels.is_empty();
    orphan
        .then_some(jobs)
        .into_iter()
        .flatten()
        .filter(move |j| keeps_pods(j) && j.selector.matches(&pod.labels))
        .map(|j| j.key())
}

#[cfg(test)]
mod compact_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
    use kjob_reconcile::testutil::{TEST_NAMESPACE, mk_job, mk_pod};
    use kjob_reconcile::view_pod;

    /// The worker's expansion of a view entry of a pod in [`TEST_NAMESPACE`].
    fn decode(entry: &[u8]) -> Pod {
        view_pod::decode(entry, TEST_NAMESPACE).unwrap()
    }

    #[test]
    fn a_watched_pod_is_the_trimmed_pod() {
        let pod = sample_pod();
        let full = serde_json::to_vec(&pod).unwrap();
        assert!(full.starts_with(br#"{"apiVersion":"v1","kind":"Pod""#));
        let watched: WatchedPod = serde_json::from_slice(&full).unwrap();
        assert_eq!(watched.metadata.managed_fields, None, "skipped while parsing");
        assert_eq!(*watched.view_entry(), *trim_pod(&pod));
        // The worker expands it into a core/v1 Pod, also when the stream left out apiVersion/kind.
        let back = decode(&watched.view_entry());
        assert_eq!(back.metadata.name.as_deref(), Some("p"));
        let mut bare: serde_json::Value = serde_json::from_slice(&full).unwrap();
        bare.as_object_mut().unwrap().retain(|k, _| k != "apiVersion" && k != "kind");
        let bare: WatchedPod = serde_json::from_value(bare).unwrap();
        assert_eq!(*bare.view_entry(), *watched.view_entry());
    }

    /// Every answer syncJob takes from a pod is the same on the view's pod as on the whole one:
    /// its summary, readiness, conditions, exit codes, claim facts and finish time.
    #[test]
    fn the_view_pod_answers_syncjob_as_the_whole_pod_does() {
        use kjob_reconcile::pod as p;
        use kjob_reconcile::pod_failure_policy::match_pod_failure_policy;
        use kjob_reconcile::testutil::at;
        let job = mk_job("j")
            .pod_failure_policy(
                serde_json::from_value(serde_json::json!([
                    {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}},
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                    {"action": "Count", "onExitCodes": {"containerName": "side",
                                                        "operator": "NotIn", "values": [0]}}
                ]))
                .unwrap(),
            )
            .build();
        let pods = [
            sample_pod(),
            mk_pod(&job, "a").index(3).failure_counts(2, Some(1)).ready(at(5)).build(),
            mk_pod(&job, "b").failed(42, at(9)).node(Some("n2")).restarts(3).build(),
            mk_pod(&job, "c").condition("DisruptionTarget", "True", at(4)).deleting(at(7)).build(),
            mk_pod(&job, "d")
                .init_terminated("side", 3, at(8))
                .terminated("main", 0, at(6))
                .build(),
            mk_pod(&job, "e").created(at(1)).label("x", "y").no_finalizer().build(),
        ];
        let policy = job.spec.as_ref().and_then(|s| s.pod_failure_policy.as_ref());
        for full in pods {
            let view = decode(&trim_pod(&full));
            let name = p::name(&full);
            assert_eq!(
                kjob_reconcile::PodSummary::of(&view),
                kjob_reconcile::PodSummary::of(&full),
                "{name}"
            );
            assert_eq!(p::ready_since(&view), p::ready_since(&full), "{name}");
            assert_eq!(p::finished_time(&view), p::finished_time(&full), "{name}");
            assert_eq!(p::removal_key(&view), p::removal_key(&full), "{name}");
            assert_eq!(p::controller_ref(&view), p::controller_ref(&full), "{name}");
            assert_eq!(p::uid(&view), p::uid(&full), "{name}");
            assert_eq!(view.metadata.namespace, full.metadata.namespace, "{name}");
            assert_eq!(view.metadata.labels, full.metadata.labels, "{name}");
            // An empty list is absent in the view, as the API server's JSON leaves it out.
            let finalizers = |p: &Pod| p.metadata.finalizers.clone().unwrap_or_default();
            assert_eq!(finalizers(&view), finalizers(&full), "{name}");
            assert_eq!(p::has_tracking_finalizer(&view), p::has_tracking_finalizer(&full));
            assert_eq!(
                match_pod_failure_policy(policy, &view),
                match_pod_failure_policy(policy, &full),
                "{name}"
            );
            assert_eq!(
                kjob_reconcile::pod_failure_policy::fail_job_message(&job, [&view]),
                kjob_reconcile::pod_failure_policy::fail_job_message(&job, [&full]),
                "{name}"
            );
        }
    }

    /// Updates that change nothing syncJob reads give the same view entry; those that do, not.
    #[test]
    fn only_what_syncjob_reads_changes_the_view_entry() {
        let base = mk_pod(&mk_job("j").build(), "p")
            .ready(kjob_reconcile::testutil::at(3))
            .with(|p| p.metadata.resource_version = Some("5".into()))
            .build();
        let same = |f: &dyn Fn(&mut Pod)| {
            let mut p = base.clone();
            f(&mut p);
            trim_pod(&p) == trim_pod(&base)
        };
        assert!(same(&|p| p.metadata.resource_version = Some("999".into())));
        assert!(same(&|p| {
            p.metadata.annotations.get_or_insert_default().insert("note".into(), "x".into());
        }));
        assert!(same(&|p| {
            let st = p.status.as_mut().unwrap();
            st.pod_ip = Some("10.0.0.9".into());
            st.message = Some("probing".into());
            let c = &mut st.conditions.as_mut().unwrap()[0];
            c.last_probe_time = Some(Time(jiff::Timestamp::from_second(77).unwrap()));
            c.message = Some("x".into());
        }));
        assert!(same(&|p| p.spec.as_mut().unwrap().containers[0].image = Some("other".into())));
        assert!(!same(&|p| p.status.as_mut().unwrap().phase = Some("Failed".into())));
        assert!(!same(&|p| {
            let a = p.metadata.annotations.get_or_insert_default();
            a.insert(kjob_core::JOB_COMPLETION_INDEX_ANNOTATION.into(), "4".into());
        }));
        assert!(!same(&|p| p.metadata.finalizers = None));
        assert!(!same(&|p| p.spec.as_mut().unwrap().node_name = Some("n9".into())));
        assert!(!same(&|p| {
            let c = &mut p.status.as_mut().unwrap().conditions.as_mut().unwrap()[0];
            c.status = if c.status == "True" { "False".into() } else { "True".into() };
        }));
    }

    /// A Job decoded as a [`WatchedJob`] is the Job without managedFields, and the view keeps
    /// the same JSON of it as of the fully decoded Job.
    #[test]
    fn a_watched_job_is_the_job_without_managed_fields() {
        let mut job = mk_job("j").parallelism(3).build();
        job.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("kjob-worker".into()),
            fields_v1: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1(
                serde_json::json!({"f:status": {"f:active": {}, "f:startTime": {}}}),
            )),
            ..Default::default()
        }]);
        job.metadata.annotations = Some([("a".to_string(), "1".to_string())].into());
        let full = serde_json::to_vec(&job).unwrap();
        let watched: WatchedJob = serde_json::from_slice(&full).unwrap();
        assert_eq!(watched.metadata.managed_fields, None, "skipped while parsing");
        let typed = watched.into_job();
        let mut expected = job.clone();
        expected.metadata.managed_fields = None;
        assert_eq!(typed, expected);
        assert_eq!(trim_job(&typed), trim_job(&job));
        let back: Job = serde_json::from_slice(&trim_job(&typed)).unwrap();
        assert_eq!(back, expected);
    }

    fn sample_pod() -> Pod {
        mk_pod(&mk_job("j").build(), "p")
            .annotation("a", "1")
            .restarts(2)
            .with(|p| {
                p.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
                let spec = p.spec.as_mut().unwrap();
                spec.containers[0].command = Some(vec!["sleep".into(), "1".into()]);
                spec.init_containers = Some(vec![k8s_openapi::api::core::v1::Container {
                    name: "side".into(),
                    image: Some("envoy".into()),
                    restart_policy: Some("Always".into()),
                    ..Default::default()
                }]);
                spec.service_account_name = Some("default".into());
            })
            .build()
    }

    #[test]
    fn trimmed_pod_keeps_what_sync_reads() {
        let pod = sample_pod();
        let back = decode(&trim_pod(&pod));
        assert_eq!(back.metadata.managed_fields, None);
        assert_eq!(back.metadata.resource_version, None, "changes on every write");
        assert_eq!(back.metadata.annotations, None, "only batch.kubernetes.io/ ones are kept");
        let st = back.status.unwrap();
        assert_eq!(st.phase, pod.status.as_ref().unwrap().phase);
        assert_eq!(st.pod_ip, None);
        let spec = back.spec.unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("node-1"));
        assert!(spec.containers.is_empty());
        assert_eq!(spec.service_account_name, None);
        let ics = spec.init_containers.unwrap();
        assert_eq!(
            (ics[0].name.as_str(), ics[0].restart_policy.as_deref()),
            ("side", Some("Always"))
        );
        assert_eq!(ics[0].image, None);
    }
}
