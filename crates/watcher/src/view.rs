//! The shared Job view the leading watcher writes for the workers: each managed Job's object and
//! its pods, trimmed to what syncJob reads, kept in kjob-queue's Redis (see
//! `kjob_workqueue::view` for the trust rules). Workers plan from it as upstream plans from its
//! informer cache, instead of GETting the Job and LISTing its pods at every sync.
//!
//! Pure: the informer calls these to turn its events into [`ViewWrite`]s, which ride on the same
//! Add items as the handlers' observations (written first, in the same script).

use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::cache::{JobInfo, PodInfo, Store};

/// Most pods written by one snapshot item: keeps one Add item (and one script run) well under a
/// megabyte of pods.
pub const SNAPSHOT_CHUNK: usize = 200;

/// One write to a Job's shared view, its trimmed JSON shared (see [`kjob_core::ViewOp`]).
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

/// The pod as the view keeps it: what syncJob reads — the metadata (without managedFields), the
/// status, and of the spec only the node name and each init container's name and restart policy
/// (sidecars count for the finish time). Container specs, volumes and the rest are dropped:
/// they are most of a pod's size and no decision reads them.
pub fn trim_pod(pod: &Pod) -> Arc<[u8]> {
    let spec = pod.spec.as_ref().map(|s| PodSpec {
        node_name: s.node_name.clone(),
        init_containers: s.init_containers.as_ref().map(|ics| {
            ics.iter()
                .map(|c| Container {
                    name: c.name.clone(),
                    restart_policy: c.restart_policy.clone(),
                    ..Default::default()
                })
                .collect()
        }),
        ..Default::default()
    });
    let mut metadata = pod.metadata.clone();
    metadata.managed_fields = None;
    let trimmed = Pod { metadata, spec, status: pod.status.clone() };
    serde_json::to_vec(&trimmed).unwrap_or_default().into()
}

/// A pod as the watcher decodes it off the watch stream: the metadata (without managedFields),
/// the status, and of the spec only what syncJob reads (the node name, each init container's
/// name and restart policy). serde skips everything else while parsing (container specs,
/// volumes, managedFields: most of a pod's bytes) instead of allocating it, so a full-pod watch
/// costs the watcher little more than the metadata-only watch it replaced. Serialized, it is the
/// pod the shared view keeps (a valid core/v1 Pod: `containers` is written empty).
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchedPod {
    /// Always written `v1`, whatever the stream sent (the worker decodes the view as a typed
    /// Pod, which checks it).
    #[serde(default, serialize_with = "always_v1")]
    pub api_version: String,
    /// Always written `Pod`.
    #[serde(default, serialize_with = "always_pod")]
    pub kind: String,
    /// Metadata without managedFields.
    #[serde(deserialize_with = "meta_without_managed_fields")]
    pub metadata: ObjectMeta,
    /// The parts of the spec syncJob reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<WatchedPodSpec>,
    /// The status, whole, as the stream sent it: the watcher reads none of it, so it is kept as
    /// raw JSON, neither parsed into fields (conditions, container states: most of a pod
    /// event's allocations) nor written out again field by field for the view.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<RawJson>,
}

/// A JSON value kept as the text it came in (validated, not parsed into fields).
#[derive(Clone, Debug, serde::Deserialize, serde::Serialize)]
#[serde(transparent)]
pub struct RawJson(Box<serde_json::value::RawValue>);

impl RawJson {
    /// The JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }
}

impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
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
    /// Never read; written empty so the object is a valid PodSpec (`containers` is required).
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

fn always_v1<S: serde::Serializer>(_: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str("v1")
}

fn always_pod<S: serde::Serializer>(_: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str("Pod")
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

impl WatchedPod {
    /// The view's JSON of this pod.
    pub fn view_json(&self) -> Arc<[u8]> {
        serde_json::to_vec(self).unwrap_or_default().into()
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
        out.push((n.key(), ViewWrite::Pod { name: pod.name.clone(), object }));
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
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
    use kjob_reconcile::testutil::{mk_job, mk_pod};

    #[test]
    fn a_watched_pod_is_the_trimmed_pod() {
        let pod = sample_pod();
        let full = serde_json::to_vec(&pod).unwrap();
        assert!(full.starts_with(br#"{"apiVersion":"v1","kind":"Pod""#));
        let watched: WatchedPod = serde_json::from_slice(&full).unwrap();
        assert_eq!(watched.metadata.managed_fields, None, "skipped while parsing");
        let a: serde_json::Value = serde_json::from_slice(&watched.view_json()).unwrap();
        let b: serde_json::Value = serde_json::from_slice(&trim_pod(&pod)).unwrap();
        assert_eq!(a, b);
        // The worker decodes it as a core/v1 Pod, also when the stream left out apiVersion/kind.
        let back: Pod = serde_json::from_slice(&watched.view_json()).unwrap();
        // The status goes into the view as it came, and decodes as the pod's status.
        assert_eq!(back.status, pod.status);
        assert!(pod.status.is_some());
        let bare = WatchedPod { api_version: String::new(), kind: String::new(), ..watched };
        let _: Pod = serde_json::from_slice(&bare.view_json()).unwrap();
        assert_eq!(back.metadata.name.as_deref(), Some("p"));
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
                spec.init_containers = Some(vec![Container {
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
        let back: Pod = serde_json::from_slice(&trim_pod(&pod)).unwrap();
        assert_eq!(back.metadata.managed_fields, None);
        assert_eq!(back.metadata.annotations, pod.metadata.annotations);
        assert_eq!(back.status, pod.status);
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
