//! The slim view of Jobs and Pods the handlers need, and the store the informer keeps them in.
//!
//! Only what a handler decision reads is kept (no spec templates, statuses or managedFields), so
//! the watcher's memory stays proportional to the number of objects, not to their size.

use crate::priority::PodPriority;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kjob_core::JOB_TRACKING_FINALIZER;

use kjob_reconcile::selector::Selector;

/// The controller owner reference of a pod (the one with `controller: true`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerRef {
    /// apiVersion of the owner, e.g. `batch/v1`.
    pub api_version: String,
    /// Kind of the owner, e.g. `Job`.
    pub kind: String,
    /// Name of the owner (same namespace as the pod).
    pub name: String,
    /// UID of the owner.
    pub uid: String,
}

/// What the handlers need to know about a Job.
#[derive(Debug, Clone, PartialEq)]
pub struct JobInfo {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// resourceVersion, to ignore resync-style updates.
    pub resource_version: String,
    /// metadata.generation: changes on spec updates only.
    pub generation: i64,
    /// spec.managedBy.
    pub managed_by: Option<String>,
    /// Compiled spec.selector (an invalid selector matches nothing, as upstream).
    pub selector: Selector,
    /// spec.activeDeadlineSeconds.
    pub active_deadline_seconds: Option<i64>,
    /// status.startTime.
    pub start_time: Option<Timestamp>,
    /// Whether a Complete or Failed condition is True (`IsJobFinished`).
    pub finished: bool,
    /// Whether metadata.deletionTimestamp is set.
    pub deleting: bool,
    /// Its pods' priority as the template asks for it (see [`crate::priority`]).
    pub pod_priority: PodPriority,
    /// The Job as the shared view keeps it ([`crate::view::trim_job`]); `None` in views built
    /// without the object.
    pub view: Option<Arc<[u8]>>,
}

impl JobInfo {
    /// The queue key `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Extracts the slim view from a full Job.
    pub fn from_job(job: &Job) -> Self {
        let meta = &job.metadata;
        let spec = job.spec.as_ref();
        let status = job.status.as_ref();
        let selector = match Selector::compile(spec.and_then(|s| s.selector.as_ref())) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(job = %format!("{}/{}", ns(meta), name(meta)), error = %e, "invalid Job selector; it matches no pods");
                Selector::nothing()
            }
        };
        Self {
            namespace: ns(meta),
            name: name(meta),
            uid: meta.uid.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            generation: meta.generation.unwrap_or_default(),
            managed_by: spec.and_then(|s| s.managed_by.clone()),
            selector,
            active_deadline_seconds: spec.and_then(|s| s.active_deadline_seconds),
            start_time: status.and_then(|s| s.start_time.as_ref()).map(|t| t.0),
            finished: kjob_reconcile::conditions::is_finished(job),
            deleting: meta.deletion_timestamp.is_some(),
            pod_priority: PodPriority::of_job(job),
            view: Some(crate::view::trim_job(job)),
        }
    }
}

/// What the handlers need to know about a Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// resourceVersion, to ignore resync-style updates.
    pub resource_version: String,
    /// Labels, for selector matching. The handlers see every pod's labels (an owned pod whose
    /// labels stop matching its Job's selector is released); the [`Store`] keeps them only for
    /// orphans, because no handler reads a cached owned pod's labels and they are most of its
    /// size.
    pub labels: BTreeMap<String, String>,
    /// The controller owner reference, if any.
    pub controller: Option<ControllerRef>,
    /// Whether the pod carries `batch.kubernetes.io/job-tracking`.
    pub has_tracking_finalizer: bool,
    /// Whether metadata.deletionTimestamp is set.
    pub deleting: bool,
    /// The pod as the shared view keeps it ([`crate::view::WatchedPod::view_json`]), for pods
    /// a Job controls; dropped by the informer when that Job is not a managed, unfinished one
    /// ([`crate::view::may_be_viewed`]); `None` for orphans and when built from metadata only.
    pub view: Option<Arc<[u8]>>,
}

impl PodInfo {
    /// The orphan-queue key `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Extracts the slim view from a pod as the watch delivers it, with its view object when a
    /// Job controls it. Takes the pod, so its strings move into the cache rather than copied.
    pub fn from_watched(pod: crate::view::WatchedPod) -> Self {
        let view = controlled_by_a_job(&pod.metadata).then(|| pod.view_entry());
        Self { view, ..Self::from_meta(pod.metadata) }
    }

    /// Extracts the slim view from a full Pod, with its trimmed object when a Job controls it.
    pub fn from_pod(pod: &Pod) -> Self {
        let view = controlled_by_a_job(&pod.metadata).then(|| crate::view::trim_pod(pod));
        let mut meta = pod.metadata.clone();
        meta.managed_fields = None;
        Self { view, ..Self::from_meta(meta) }
    }

    /// Extracts the slim view from a pod's metadata (all the handlers read).
    pub fn from_meta(meta: ObjectMeta) -> Self {
        let ObjectMeta {
            namespace,
            name,
            uid,
            resource_version,
            labels,
            owner_references,
            finalizers,
            deletion_timestamp,
            ..
        } = meta;
        let controller =
            owner_references.into_iter().flatten().find(|o| o.controller == Some(true)).map(|o| {
                ControllerRef { api_version: o.api_version, kind: o.kind, name: o.name, uid: o.uid }
            });
        Self {
            namespace: namespace.unwrap_or_default(),
            name: name.unwrap_or_default(),
            uid: uid.unwrap_or_default(),
            resource_version: resource_version.unwrap_or_default(),
            labels: labels.unwrap_or_default(),
            controller,
            has_tracking_finalizer: finalizers
                .iter()
                .flatten()
                .any(|f| f == JOB_TRACKING_FINALIZER),
            deleting: deletion_timestamp.is_some(),
            view: None,
        }
    }
}

/// Whether a pod's controller is a Job (the only pods a view may hold).
fn controlled_by_a_job(meta: &ObjectMeta) -> bool {
    meta.owner_references.iter().flatten().any(|o| o.controller == Some(true) && o.kind == "Job")
}

fn ns(meta: &ObjectMeta) -> String {
    meta.namespace.clone().unwrap_or_default()
}

fn name(meta: &ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

/// The informer's cache of Jobs and Pods, with the indexes the handlers look up by.
#[derive(Debug, Default)]
pub struct Store {
    jobs: HashMap<String, JobInfo>,
    /// Keys (`namespace/name`) of each namespace's Jobs, in name order.
    jobs_by_namespace: HashMap<String, BTreeSet<String>>,
    pods: HashMap<String, PodInfo>,
    pods_by_controller_uid: HashMap<String, HashSet<String>>,
}

impl Store {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The Job with this key.
    pub fn job(&self, key: &str) -> Option<&JobInfo> {
        self.jobs.get(key)
    }

    /// The Job `namespace/name`.
    pub fn job_by_name(&self, namespace: &str, name: &str) -> Option<&JobInfo> {
        self.jobs.get(&format!("{namespace}/{name}"))
    }

    /// Every Job of a namespace, in name order.
    pub fn jobs_in_namespace<'a>(&'a self, namespace: &str) -> impl Iterator<Item = &'a JobInfo> {
        self.jobs_by_namespace
            .get(namespace)
            .into_iter()
            .flatten()
            .filter_map(move |key| self.jobs.get(key))
    }

    /// Every Job.
    pub fn jobs(&self) -> impl Iterator<Item = &JobInfo> {
        self.jobs.values()
    }

    /// Number of Jobs.
    pub fn job_count(&self) -> usize {
        self.jobs.len()
    }

    /// The Pod with this key.
    pub fn pod(&self, key: &str) -> Option<&PodInfo> {
        self.pods.get(key)
    }

    /// Every Pod.
    pub fn pods(&self) -> impl Iterator<Item = &PodInfo> {
        self.pods.values()
    }

    /// Number of Pods.
    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    /// Pods whose controllerRef UID is `uid`.
    pub fn pods_controlled_by<'a>(&'a self, uid: &str) -> impl Iterator<Item = &'a PodInfo> {
        self.pods_by_controller_uid.get(uid).into_iter().flatten().filter_map(|k| self.pods.get(k))
    }

    /// Inserts or replaces an object, keeping its kind's index; returns the previous version.
    pub fn upsert<K: Stored>(&mut self, obj: K) -> Option<K> {
        obj.upsert(self)
    }

    /// Removes an object by key; returns it if it was there.
    pub fn remove<K: Stored>(&mut self, key: &str) -> Option<K> {
        K::remove(self, key)
    }

    /// Drops the view JSON of every pod controlled by `uid` (a Job whose view is not kept).
    pub fn drop_pod_views(&mut self, uid: &str) {
        for key in self.pods_by_controller_uid.get(uid).into_iter().flatten() {
            if let Some(pod) = self.pods.get_mut(key) {
                pod.view = None;
            }
        }
    }

    fn unindex_pod(&mut self, uid: String, key: &str) {
        if let Some(set) = self.pods_by_controller_uid.get_mut(&uid) {
            set.remove(key);
            if set.is_empty() {
                self.pods_by_controller_uid.remove(&uid);
            }
        }
    }
}

/// A kind the [`Store`] caches: its key and version, and how it is filed (its map and index).
pub trait Stored: Clone + Sized {
    /// The cache key `namespace/name`.
    fn key(&self) -> String;
    /// resourceVersion, to ignore resync-style updates.
    fn resource_version(&self) -> &str;
    /// Inserts or replaces `self`; returns the previous version.
    fn upsert(self, store: &mut Store) -> Option<Self>;
    /// Removes the object with this key; returns it if it was there.
    fn remove(store: &mut Store, key: &str) -> Option<Self>;
    /// Keys of every cached object of the kind (for relist bookkeeping).
    fn keys(store: &Store) -> impl Iterator<Item = &String>;
}

impl Stored for JobInfo {
    fn key(&self) -> String {
        JobInfo::key(self)
    }

    fn resource_version(&self) -> &str {
        &self.resource_version
    }

    fn upsert(self, store: &mut Store) -> Option<Self> {
        let key = self.key();
        store.jobs_by_namespace.entry(self.namespace.clone()).or_default().insert(key.clone());
        store.jobs.insert(key, self)
    }

    fn remove(store: &mut Store, key: &str) -> Option<Self> {
        let job = store.jobs.remove(key)?;
        if let Some(keys) = store.jobs_by_namespace.get_mut(&job.namespace) {
            keys.remove(key);
            if keys.is_empty() {
                store.jobs_by_namespace.remove(&job.namespace);
            }
        }
        Some(job)
    }

    fn keys(store: &Store) -> impl Iterator<Item = &String> {
        store.jobs.keys()
    }
}

impl Stored for PodInfo {
    fn key(&self) -> String {
        PodInfo::key(self)
    }

    fn resource_version(&self) -> &str {
        &self.resource_version
    }

    /// An owned pod's labels are not kept.
    fn upsert(mut self, store: &mut Store) -> Option<Self> {
        if self.controller.is_some() {
            self.labels = BTreeMap::new();
        }
        let key = self.key();
        if let Some(c) = &self.controller {
            store.pods_by_controller_uid.entry(c.uid.clone()).or_default().insert(key.clone());
        }
        let old = store.pods.insert(key.clone(), self);
        if let Some(old_uid) = old.as_ref().and_then(|o| o.controller.as_ref()).map(|c| &c.uid) {
            let still = store.pods[&key].controller.as_ref().is_some_and(|c| &c.uid == old_uid);
            if !still {
                store.unindex_pod(old_uid.clone(), &key);
            }
        }
        old
    }

    fn remove(store: &mut Store, key: &str) -> Option<Self> {
        let pod = store.pods.remove(key)?;
        if let Some(c) = &pod.controller {
            store.unindex_pod(c.uid.clone(), key);
        }
        Some(pod)
    }

    fn keys(store: &Store) -> impl Iterator<Item = &String> {
        store.pods.keys()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kjob_reconcile::testutil::{mk_job, mk_pod, t0};

    #[test]
    fn job_info_extracts_fields() {
        let job = mk_job("j")
            .managed_by("kjob.io/job-controller")
            .active_deadline_seconds(30)
            .start_time(t0())
            .condition("Failed", "True", "BackoffLimitExceeded", "", t0())
            .with(|j| {
                j.metadata.generation = Some(2);
                // `selector: {}` selects every pod.
                j.spec.as_mut().unwrap().selector = Some(Default::default());
            })
            .build();
        let info = JobInfo::from_job(&job);
        assert_eq!(info.key(), "default/j");
        assert_eq!(info.generation, 2);
        assert_eq!(info.active_deadline_seconds, Some(30));
        assert!(info.finished);
        assert!(info.selector.matches(&BTreeMap::new()));
        assert_eq!(info.start_time.unwrap().to_string(), "2026-01-01T00:00:00Z");
    }

    #[test]
    fn pod_info_extracts_fields_and_store_indexes_by_controller() {
        let mut pod = mk_pod(&mk_job("j").build(), "p")
            .with(|p| {
                p.metadata.labels = Some(BTreeMap::from([("a".to_string(), "b".to_string())]));
                // A plain owner before the controller: the controller is the one marked so.
                let not_controller = OwnerReference {
                    api_version: "v1".into(),
                    kind: "ConfigMap".into(),
                    name: "c".into(),
                    uid: "cu".into(),
                    ..Default::default()
                };
                p.metadata.owner_references.as_mut().unwrap().insert(0, not_controller);
            })
            .build();
        let info = PodInfo::from_pod(&pod);
        assert!(info.has_tracking_finalizer);
        assert!(!info.deleting);
        assert_eq!(info.controller.as_ref().unwrap().uid, "uid-j");
        assert_eq!(info.labels.len(), 1, "handlers see an owned pod's labels");
        let mut orphan = pod.clone();
        orphan.metadata.owner_references = None;
        assert_eq!(PodInfo::from_pod(&orphan).labels.len(), 1, "orphans keep labels");

        let mut store = Store::new();
        assert!(store.upsert(info).is_none());
        assert!(
            store.pod("default/p").unwrap().labels.is_empty(),
            "the cache drops owned pods' labels"
        );
        store.upsert(PodInfo::from_pod(&orphan));
        assert_eq!(
            store.pod("default/p").unwrap().labels.len(),
            1,
            "the cache keeps orphans' labels"
        );
        store.upsert(PodInfo::from_pod(&pod));
        assert_eq!(store.pods_controlled_by("uid-j").count(), 1);
        // Re-parented: the old index entry goes away.
        pod.metadata.owner_references.as_mut().unwrap()[1].uid = "u2".into();
        store.upsert(PodInfo::from_pod(&pod));
        assert_eq!(store.pods_controlled_by("uid-j").count(), 0);
        assert_eq!(store.pods_controlled_by("u2").count(), 1);
        assert!(store.remove::<PodInfo>("default/p").is_some());
        assert_eq!(store.pods_controlled_by("u2").count(), 0);
        assert_eq!(store.pod_count(), 0);
    }
}
