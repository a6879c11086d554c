//! The informer layer: turns kube-runtime watcher events into (old, new) handler calls over a
//! store of last-seen versions.
//!
//! * Apply of an unknown object is an add; of a known one with another resourceVersion an
//!   update; with the same resourceVersion nothing.
//! * A relist (Init … InitDone after a watch was cut, e.g. by 410 Gone) turns objects that are
//!   no longer listed into deletes of their last known state (tombstones).
//! * Nothing is handled before the initial lists of both Jobs and Pods are complete: objects
//!   present at start are not events (a half-filled Job cache would make pods look orphaned);
//!   the takeover ([`Informer::take_over`]) enqueues every Job instead and sends the cached pods
//!   that need finalizer cleanup to the orphan queue.
//!
//! [`Informer`] is plain data (no I/O), so the whole event path is tested without a server.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use jiff::Timestamp;
use kube::runtime::watcher::Event;

use crate::cache::{JobInfo, PodInfo, Store, Stored};
use crate::handlers::{self, Enqueue, HandlerConfig, SessionControl};
use crate::metrics::{ControllerNameLabels, EventLabels, KindLabels, Metrics};
use crate::view::{self, ViewWrite};

/// Converts the objects of a watcher event (e.g. to the slim views the informer keeps).
pub fn map_event<A, B>(ev: Event<A>, f: impl FnOnce(A) -> B) -> Event<B> {
    match ev {
        Event::Apply(o) => Event::Apply(f(o)),
        Event::Delete(o) => Event::Delete(f(o)),
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(f(o)),
        Event::InitDone => Event::InitDone,
    }
}

#[derive(Debug, Default)]
struct ListState {
    /// The first complete list has been seen.
    synced: bool,
    /// Keys listed so far in the current (re)list.
    relist: Option<HashSet<String>>,
}

/// The informer caches and the handler dispatch.
#[derive(Debug)]
pub struct Informer {
    cfg: HandlerConfig,
    store: Store,
    jobs: ListState,
    pods: ListState,
    metrics: Metrics,
    view: ViewState,
}

/// The shared-view session this informer writes in.
#[derive(Debug, Default)]
struct ViewState {
    /// Prefix of session ids (unique per process); `None` writes no view.
    identity: Option<String>,
    /// Sessions begun so far.
    seq: u64,
    /// The current session: set while leading with synced, not relisting caches.
    session: Option<Arc<str>>,
}

impl Informer {
    /// An empty, unsynced informer.
    pub fn new(cfg: HandlerConfig, metrics: Metrics) -> Self {
        Self {
            cfg,
            store: Store::new(),
            jobs: ListState::default(),
            pods: ListState::default(),
            metrics,
            view: ViewState::default(),
        }
    }

    /// Makes this informer write the shared Job view, in sessions named `identity-<n>`
    /// (`identity` must be unique per process, e.g. the pod name and the start time).
    pub fn with_view(mut self, identity: impl Into<String>) -> Self {
        self.view.identity = Some(identity.into());
        self
    }

    /// Whether a view session is current.
    pub fn view_active(&self) -> bool {
        self.view.session.is_some()
    }

    /// Whether a relist of Jobs or Pods is in progress.
    pub fn relisting(&self) -> bool {
        self.jobs.relist.is_some() || self.pods.relist.is_some()
    }

    /// Whether a view session should be current: leading with synced caches, not relisting.
    pub fn view_wanted(&self, leading: bool) -> bool {
        self.view.identity.is_some() && leading && self.synced() && !self.relisting()
    }

    /// Begins a view session: its Begin, a snapshot of every managed Job, its Commit. Workers
    /// stop trusting every earlier view at the Begin and trust this one's after the Commit.
    pub fn begin_view(&mut self) -> Vec<Enqueue> {
        let Some(identity) = &self.view.identity else { return vec![] };
        self.view.seq += 1;
        let session: Arc<str> = format!("{identity}-{}", self.view.seq).into();
        self.view.session = Some(session.clone());
        let mut out = vec![Enqueue::session(SessionControl::Begin(session.clone()))];
        let mut jobs: Vec<&JobInfo> = self.store.jobs().filter(|j| self.cfg.manages(j)).collect();
        jobs.sort_by_key(|j| j.key());
        for job in jobs {
            for chunk in view::snapshot(job, &self.store) {
                out.push(Enqueue::view_only(job.key(), session.clone(), chunk));
            }
        }
        out.push(Enqueue::session(SessionControl::Commit(session)));
        out
    }

    /// Ends the current view session (leadership lost, a relist began): no view is trusted
    /// until the next session commits.
    pub fn end_view(&mut self) -> Vec<Enqueue> {
        match self.view.session.take() {
            Some(s) => vec![Enqueue::session(SessionControl::End(s))],
            None => vec![],
        }
    }

    /// View-only items for `writes` (grouped per Job key, in order) of the current session.
    fn view_items(&self, writes: Vec<(String, ViewWrite)>) -> Vec<Enqueue> {
        let Some(session) = &self.view.session else { return vec![] };
        let mut by_key: BTreeMap<String, Vec<ViewWrite>> = BTreeMap::new();
        let mut order = Vec::new();
        for (key, w) in writes {
            let entry = by_key.entry(key.clone()).or_default();
            if entry.is_empty() {
                order.push(key);
            }
            entry.push(w);
        }
        order
            .into_iter()
            .filter_map(|k| by_key.remove(&k).map(|v| (k, v)))
            .map(|(k, v)| Enqueue::view_only(k, session.clone(), v))
            .collect()
    }

    /// The managed Job a pod's controllerRef points at.
    fn owner<'a>(cfg: &HandlerConfig, store: &'a Store, pod: &PodInfo) -> Option<&'a JobInfo> {
        let cref = pod.controller.as_ref()?;
        handlers::resolve_controller_ref(store, &pod.namespace, cref).filter(|j| cfg.manages(j))
    }

    /// View writes for a pod event (`old` cached, `new` the event's; `None` = deleted).
    fn pod_view(&self, old: Option<&PodInfo>, new: Option<&PodInfo>) -> Vec<Enqueue> {
        if self.view.session.is_none() {
            return vec![];
        }
        let (cfg, store) = (&self.cfg, &self.store);
        let mut writes = view::pod_writes(old, new, |p| Self::owner(cfg, store, p));
        if let Some(pod) = new {
            let jobs = store.jobs_in_namespace(&pod.namespace).filter(|j| cfg.manages(j));
            writes.extend(view::orphan_notices(pod, jobs).map(|k| (k, ViewWrite::Orphans)));
        }
        self.view_items(writes)
    }

    /// View writes for a Job event (`old` cached, `new` the event's).
    fn job_view(&self, old: Option<&JobInfo>, new: &JobInfo) -> Vec<Enqueue> {
        let Some(session) = &self.view.session else { return vec![] };
        if !self.cfg.manages(new) {
            return vec![];
        }
        view::job_writes(old, new, &self.store)
            .into_iter()
            .map(|chunk| Enqueue::view_only(new.key(), session.clone(), chunk))
            .collect()
    }

    /// Whether the initial lists of both Jobs and Pods are complete.
    pub fn synced(&self) -> bool {
        self.jobs.synced && self.pods.synced
    }

    /// Whether the initial Job list is complete (Pods are listed only after it).
    pub fn jobs_synced(&self) -> bool {
        self.jobs.synced
    }

    /// The cache.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Every managed Job, to sync now (resync, leadership takeover).
    pub fn enqueue_all(&self) -> Vec<Enqueue> {
        handlers::enqueue_all_jobs(&self.cfg, &self.store)
    }

    /// The periodic resync: every managed Job, and every cached pod that still needs its
    /// tracking finalizer removed (as at a takeover). Upstream's informer resync reaches such
    /// pods through `updatePod`; here it also repairs a Redis that lost the orphan queue (wiped,
    /// or failed over to a replica that missed the last writes), which would otherwise leave
    /// those pods Terminating until the next leader change.
    pub fn resync(&self) -> Vec<Enqueue> {
        let mut out = self.enqueue_all();
        out.extend(handlers::orphans_of_cached_pods(&self.cfg, &self.store));
        out
    }

    /// What a watcher that starts leading with a synced cache enqueues: every managed Job, and
    /// the orphan-queue entries the pod add handler gives for the cached pods (upstream's
    /// initial list goes through `addPod`; see [`handlers::orphans_of_cached_pods`]). Counts
    /// the Jobs of external controllers as a new leader's list does.
    pub fn take_over(&self) -> Vec<Enqueue> {
        self.count_external_jobs();
        let mut out = self.enqueue_all();
        out.extend(handlers::orphans_of_cached_pods(&self.cfg, &self.store));
        out
    }

    /// Counts a Job in `job_controller_jobs_by_external_controller_total` when its managedBy
    /// names a controller other than the built-in one (upstream `addJob`).
    fn count_if_external(&self, job: &JobInfo) {
        if let Some(name) = job.managed_by.as_deref()
            && name != kjob_core::BUILTIN_JOB_CONTROLLER
        {
            let labels = ControllerNameLabels { controller_name: name.to_string() };
            self.metrics.jobs_by_external_controller.get_or_create(&labels).inc();
        }
    }

    /// On gaining leadership with a synced cache: counts every cached Job as upstream's
    /// informer does when a new leader lists them (each list item is an `addJob`).
    pub fn count_external_jobs(&self) {
        for job in self.store.jobs() {
            self.count_if_external(job);
        }
    }

    fn count(&self, kind: &'static str, r#type: &'static str) {
        self.metrics.events.get_or_create(&EventLabels { kind, r#type }).inc();
    }

    fn update_gauges(&self) {
        let jobs = i64::try_from(self.store.job_count()).unwrap_or(i64::MAX);
        let pods = i64::try_from(self.store.pod_count()).unwrap_or(i64::MAX);
        self.metrics.cached.get_or_create(&KindLabels { kind: "job" }).set(jobs);
        self.metrics.cached.get_or_create(&KindLabels { kind: "pod" }).set(pods);
    }

    /// Applies a Job event; returns what to enqueue when `leading` and synced.
    pub fn job_event(&mut self, ev: Event<JobInfo>, leading: bool, now: Timestamp) -> Vec<Enqueue> {
        self.event(ev, leading, now)
    }

    /// Applies a Pod event; returns what to enqueue when `leading` and synced.
    pub fn pod_event(&mut self, ev: Event<PodInfo>, leading: bool) -> Vec<Enqueue> {
        self.event(ev, leading, Timestamp::now())
    }

    /// The watch-and-tombstone machine of every kind: applies one event to the cache and its
    /// list state, and returns the kind's handler calls when `leading` and synced.
    fn event<K: Cached>(&mut self, ev: Event<K>, leading: bool, now: Timestamp) -> Vec<Enqueue> {
        let emit = leading && self.synced();
        let out = match ev {
            Event::Init => {
                K::lists(self).relist = Some(HashSet::new());
                self.end_view()
            }
            Event::InitApply(mut info) | Event::Apply(mut info) => {
                K::trim(self, &mut info);
                if let Some(seen) = K::lists(self).relist.as_mut() {
                    seen.insert(info.key());
                }
                match self.store.upsert(info.clone()) {
                    Some(old) if old.resource_version() == info.resource_version() => vec![],
                    old => {
                        let mut out = K::view(self, old.as_ref(), &info);
                        self.count(K::KIND, if old.is_none() { "add" } else { "update" });
                        if emit {
                            out.extend(K::changed(self, old.as_ref(), &info, now));
                        }
                        out
                    }
                }
            }
            Event::Delete(info) => {
                self.count(K::KIND, "delete");
                K::deleted(self, info, emit)
            }
            Event::InitDone => {
                let lists = K::lists(self);
                let seen = lists.relist.take().unwrap_or_default();
                let was_synced = std::mem::replace(&mut lists.synced, true);
                let gone: Vec<String> =
                    K::keys(&self.store).filter(|k| !seen.contains(*k)).cloned().collect();
                let mut out = vec![];
                for key in gone {
                    if let Some(last) = self.store.remove::<K>(&key) {
                        self.count(K::KIND, "tombstone");
                        if emit && was_synced {
                            out.extend(K::tombstone(self, &last));
                        }
                    }
                }
                out
            }
        };
        self.update_gauges();
        fold_views(out)
    }
}

/// Moves each view-only item's writes into the first later item of one event's output that
/// enqueues the same key (a handler's: no writes or session of its own), and drops the
/// view-only item. The writes then travel with that enqueue — in the same Add entry, applied
/// before its observations and its enqueue, as before — and wait for company as long as it may
/// ([`crate::sender::linger_for`]: up to 100 ms for a pod event's 1 s batched sync, where a
/// view-only item waits 10 ms), so a busy Job's events go in fuller Adds. A sync that starts
/// before they land is followed by the one their enqueue asks for, as with any event that
/// arrives during a sync. Writes with no enqueue of their key in the event stay view-only.
fn fold_views(mut out: Vec<Enqueue>) -> Vec<Enqueue> {
    let is_view_only =
        |e: &Enqueue| e.observe_only && e.observations.is_empty() && e.control.is_none();
    if out.len() < 2 || !out.iter().any(is_view_only) {
        return out;
    }
    let mut i = 0;
    while i < out.len() {
        let target = is_view_only(&out[i])
            .then(|| {
                let (queue, key) = (out[i].queue, &out[i].key);
                out.iter().skip(i + 1).position(|e| {
                    !e.observe_only
                        && e.session.is_none()
                        && e.view.is_empty()
                        && e.control.is_none()
                        && !e.settle
                        && e.queue == queue
                        && &e.key == key
                })
            })
            .flatten();
        match target {
            Some(offset) => {
                let view_item = out.remove(i);
                let t = &mut out[i + offset];
                let mut view = view_item.view;
                view.append(&mut t.view);
                t.view = view;
                t.session = view_item.session;
            }
            None => i += 1,
        }
    }
    out
}

/// What the relist machine ([`Informer::event`]) needs of one kind beyond its cache
/// ([`Stored`]): its list state, and the handlers and view writes of its add / update / delete /
/// tombstone.
trait Cached: Stored {
    /// The `kind` label of the event metrics.
    const KIND: &'static str;
    fn lists(informer: &mut Informer) -> &mut ListState;
    /// Drops what the cache need not keep of an object about to be applied (or of the objects
    /// it decides about): the view JSON of pods no managed, unfinished Job owns.
    fn trim(informer: &mut Informer, info: &mut Self);
    /// View writes for an add (`old` is `None`) or an update.
    fn view(informer: &Informer, old: Option<&Self>, new: &Self) -> Vec<Enqueue>;
    /// Handlers of an add or an update, already applied to the store.
    fn changed(informer: &Informer, old: Option<&Self>, new: &Self, now: Timestamp)
    -> Vec<Enqueue>;
    /// A delete event: removes the object and returns its view writes and (when `emit`) its
    /// handlers.
    fn deleted(informer: &mut Informer, info: Self, emit: bool) -> Vec<Enqueue>;
    /// Handlers of an object a relist no longer lists (`last` is its last known state).
    fn tombstone(informer: &Informer, last: &Self) -> Vec<Enqueue>;
}

impl Cached for JobInfo {
    const KIND: &'static str = "job";

    fn lists(informer: &mut Informer) -> &mut ListState {
        &mut informer.jobs
    }

    /// A Job whose view is not kept (not managed, or finished) drops its pods' view JSON.
    fn trim(informer: &mut Informer, info: &mut Self) {
        if !(informer.cfg.manages(info) && view::keeps_pods(info)) {
            informer.store.drop_pod_views(&info.uid);
        }
    }

    fn view(informer: &Informer, old: Option<&Self>, new: &Self) -> Vec<Enqueue> {
        informer.job_view(old, new)
    }

    fn changed(
        informer: &Informer,
        old: Option<&Self>,
        new: &Self,
        now: Timestamp,
    ) -> Vec<Enqueue> {
        let cfg = &informer.cfg;
        match old {
            None => {
                informer.count_if_external(new);
                handlers::on_job_add(cfg, new)
            }
            Some(old) => handlers::on_job_update(cfg, &informer.store, old, new, now),
        }
    }

    fn deleted(informer: &mut Informer, info: Self, emit: bool) -> Vec<Enqueue> {
        informer.store.remove::<JobInfo>(&info.key());
        let mut out = match &informer.view.session {
            Some(session) if informer.cfg.manages(&info) => {
                vec![Enqueue::view_only(info.key(), session.clone(), vec![ViewWrite::DeleteJob])]
            }
            _ => vec![],
        };
        if emit {
            out.extend(handlers::on_job_delete(&informer.cfg, &informer.store, &info));
        }
        out
    }

    fn tombstone(informer: &Informer, last: &Self) -> Vec<Enqueue> {
        handlers::on_job_delete(&informer.cfg, &informer.store, last)
    }
}

impl Cached for PodInfo {
    const KIND: &'static str = "pod";

    fn lists(informer: &mut Informer) -> &mut ListState {
        &mut informer.pods
    }

    fn trim(informer: &mut Informer, info: &mut Self) {
        if !view::may_be_viewed(info, &informer.store, |j| informer.cfg.manages(j)) {
            info.view = None;
        }
    }

    fn view(informer: &Informer, old: Option<&Self>, new: &Self) -> Vec<Enqueue> {
        informer.pod_view(old, Some(new))
    }

    fn changed(informer: &Informer, old: Option<&Self>, new: &Self, _: Timestamp) -> Vec<Enqueue> {
        let (cfg, store) = (&informer.cfg, &informer.store);
        match old {
            None => handlers::on_pod_add(cfg, store, new),
            Some(old) => handlers::on_pod_update(cfg, store, old, new),
        }
    }

    fn deleted(informer: &mut Informer, info: Self, emit: bool) -> Vec<Enqueue> {
        let mut out = informer.pod_view(informer.store.pod(&info.key()), None);
        let old = informer.store.remove::<PodInfo>(&info.key());
        // A delete whose object UID differs from the cached one is for a pod we never saw; the
        // cached namesake's state must not decide whether deletion was seen.
        let was_deleting = old.filter(|o| o.uid == info.uid).is_some_and(|o| o.deleting);
        if emit {
            out.extend(handlers::on_pod_delete(
                &informer.cfg,
                &informer.store,
                &info,
                was_deleting,
            ));
        }
        out
    }

    fn tombstone(informer: &Informer, last: &Self) -> Vec<Enqueue> {
        handlers::on_pod_delete(&informer.cfg, &informer.store, last, last.deleting)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::{Job, JobSpec};
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        LabelSelector, ObjectMeta, OwnerReference,
    };
    use kjob_core::{DEFAULT_CONTROLLER_NAME, JOB_QUEUE, JOB_TRACKING_FINALIZER, ORPHAN_POD_QUEUE};
    use std::collections::BTreeMap;
    use std::time::Duration;

    use crate::handlers::{ObservationKind, SYNC_JOB_BATCH_PERIOD};

    /// Metadata of object `name` (uid `uid-<name>`) in namespace `ns` at `rv`.
    fn meta(name: &str, rv: &str) -> ObjectMeta {
        ObjectMeta {
            namespace: Some("ns".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some(rv.into()),
            ..Default::default()
        }
    }

    fn job(name: &str, rv: &str) -> JobInfo {
        JobInfo::from_job(&Job {
            metadata: ObjectMeta { generation: Some(1), ..meta(name, rv) },
            spec: Some(JobSpec {
                managed_by: Some(DEFAULT_CONTROLLER_NAME.into()),
                selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([("job".into(), name.into())])),
                    match_expressions: None,
                }),
                ..Default::default()
            }),
            status: None,
        })
    }

    fn pod(name: &str, job: &str, rv: &str) -> PodInfo {
        PodInfo::from_pod(&Pod {
            metadata: ObjectMeta {
                labels: Some(BTreeMap::from([("job".into(), job.into())])),
                finalizers: Some(vec![JOB_TRACKING_FINALIZER.into()]),
                owner_references: Some(vec![OwnerReference {
                    api_version: "batch/v1".into(),
                    kind: "Job".into(),
                    name: job.into(),
                    uid: format!("uid-{job}"),
                    controller: Some(true),
                    ..Default::default()
                }]),
                ..meta(name, rv)
            },
            ..Default::default()
        })
    }

    fn informer() -> Informer {
        let cfg =
            HandlerConfig { controller_name: DEFAULT_CONTROLLER_NAME.into(), manage_all: false };
        Informer::new(cfg, Metrics::default())
    }

    fn now() -> Timestamp {
        "2026-01-01T00:00:00Z".parse().unwrap()
    }

    /// Runs the initial lists: jobs `a` and pod `p0` of `a`.
    fn synced() -> Informer {
        let mut inf = informer();
        assert!(inf.job_event(Event::Init, true, now()).is_empty());
        assert!(inf.job_event(Event::InitApply(job("a", "1")), true, now()).is_empty());
        assert!(inf.job_event(Event::InitDone, true, now()).is_empty());
        assert!(inf.jobs_synced() && !inf.synced());
        assert!(inf.pod_event(Event::Init, true).is_empty());
        assert!(inf.pod_event(Event::InitApply(pod("p0", "a", "2")), true).is_empty());
        assert!(inf.pod_event(Event::InitDone, true).is_empty());
        assert!(inf.synced());
        inf
    }

    /// Kinds of the view writes of `items`, as (key, short names), session phases as ("", …).
    fn view_shape(items: &[Enqueue]) -> Vec<(String, Vec<String>)> {
        items
            .iter()
            .map(|e| {
                if let Some(c) = &e.control {
                    let phase = match c {
                        SessionControl::Begin(_) => "begin",
                        SessionControl::Commit(_) => "commit",
                        SessionControl::End(_) => "end",
                    };
                    return (String::new(), vec![phase.to_string()]);
                }
                let names = e
                    .view
                    .iter()
                    .map(|w| match w {
                        ViewWrite::Job { .. } => "job".to_string(),
                        ViewWrite::DeleteJob => "delete-job".to_string(),
                        ViewWrite::Pod { name, .. } => format!("pod:{name}"),
                        ViewWrite::DeletePod { name } => format!("delete-pod:{name}"),
                        ViewWrite::Reset { .. } => "reset".to_string(),
                        ViewWrite::Trust => "trust".to_string(),
                        ViewWrite::Orphans => "orphans".to_string(),
                    })
                    .collect();
                (e.key.clone(), names)
            })
            .collect()
    }

    fn strs(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// A synced leader with a committed view session.
    fn viewing() -> Informer {
        let mut inf = synced().with_view("w");
        assert!(inf.view_wanted(true) && !inf.view_wanted(false));
        let out = inf.begin_view();
        assert_eq!(
            view_shape(&out),
            [
                (String::new(), strs(&["begin"])),
                ("ns/a".to_string(), strs(&["reset", "pod:p0", "job", "trust"])),
                (String::new(), strs(&["commit"])),
            ]
        );
        assert!(out[1].observe_only && out[1].session.as_deref() == Some("w-1"));
        assert!(inf.view_active());
        inf
    }

    #[test]
    fn no_view_without_an_identity() {
        let mut inf = synced();
        assert!(!inf.view_wanted(true));
        assert!(inf.begin_view().is_empty());
        let out = inf.pod_event(Event::Apply(pod("p1", "a", "3")), true);
        assert!(out.iter().all(|e| e.view.is_empty()));
    }

    #[test]
    fn pod_events_carry_their_view_writes_with_the_handlers_enqueue() {
        let mut inf = viewing();
        let out = inf.pod_event(Event::Apply(pod("p1", "a", "3")), true);
        assert_eq!(out.len(), 1, "one item: the view write rides with the enqueue");
        assert_eq!(view_shape(&out)[0], ("ns/a".to_string(), strs(&["pod:p1"])));
        assert_eq!(out[0].observations[0].kind, ObservationKind::Creation, "and the handler's");
        assert!(!out[0].observe_only && out[0].delay == SYNC_JOB_BATCH_PERIOD);
        assert_eq!(out[0].session.as_deref(), Some("w-1"), "the writes' session");
        // The written pod is the view's entry of it (in the Job's namespace).
        let ViewWrite::Pod { object, .. } = &out[0].view[0] else { panic!() };
        let back = kjob_reconcile::view_pod::decode(object, "ns").unwrap();
        assert_eq!(back.metadata.name.as_deref(), Some("p1"));
        // An unchanged resourceVersion writes nothing.
        assert!(inf.pod_event(Event::Apply(pod("p1", "a", "3")), true).is_empty());
        let out = inf.pod_event(Event::Delete(pod("p1", "a", "4")), true);
        assert_eq!(view_shape(&out)[0], ("ns/a".to_string(), strs(&["delete-pod:p1"])));
    }

    #[test]
    fn a_finished_job_drops_its_pods_and_a_deleted_one_its_view() {
        let mut inf = viewing();
        let mut done = job("a", "7");
        done.finished = true;
        let out = inf.job_event(Event::Apply(done), true, now());
        assert_eq!(view_shape(&out)[0], ("ns/a".to_string(), strs(&["reset", "job", "trust"])));
        let out = inf.pod_event(Event::Apply(pod("p0", "a", "8")), true);
        assert!(out.iter().all(|e| e.view.is_empty()), "a finished Job's pods are not mirrored");
        let out = inf.job_event(Event::Apply(job("b", "9")), true, now());
        assert_eq!(view_shape(&out)[0], ("ns/b".to_string(), strs(&["reset", "job", "trust"])));
        let out = inf.job_event(Event::Apply(job("b", "10")), true, now());
        assert_eq!(view_shape(&out)[0], ("ns/b".to_string(), strs(&["job"])));
        let out = inf.job_event(Event::Delete(job("b", "11")), true, now());
        assert_eq!(view_shape(&out)[0], ("ns/b".to_string(), strs(&["delete-job"])));
    }

    /// An update that changes only what syncJob does not read (a resourceVersion, someone
    /// else's annotation) still runs the handlers, but writes nothing to the view; one that
    /// changes a field it reads (the phase) writes the pod again.
    #[test]
    fn a_pod_update_no_sync_reads_writes_no_view() {
        let mut inf = viewing();
        let first = inf.pod_event(Event::Apply(pod("p1", "a", "3")), true);
        assert_eq!(view_shape(&first)[0].1, strs(&["pod:p1"]));
        let mut noted = pod("p1", "a", "4");
        noted.view = inf.store().pod("ns/p1").unwrap().view.clone();
        let out = inf.pod_event(Event::Apply(noted), true);
        assert!(!out.is_empty(), "the handlers still enqueue the Job");
        assert!(out.iter().all(|e| e.view.is_empty()), "no view write: {:?}", view_shape(&out));
        let mut failed = pod("p1", "a", "5");
        let with_phase = Pod {
            status: Some(serde_json::from_value(serde_json::json!({"phase": "Failed"})).unwrap()),
            ..Default::default()
        };
        failed.view = Some(crate::view::trim_pod(&with_phase));
        let out = inf.pod_event(Event::Apply(failed), true);
        assert_eq!(view_shape(&out)[0].1, strs(&["pod:p1"]));
    }

    /// A pod no managed Job owns keeps no view JSON in the cache: a ReplicaSet's, another
    /// controller's Job's, a finished Job's (dropped when the Job finishes); an orphan keeps its
    /// labels for the orphan handling. A pod of a Job not seen yet keeps it until then.
    #[test]
    fn pods_no_managed_job_owns_keep_no_view() {
        let mut inf = viewing();
        let mut rs = pod("rs-1", "a", "3");
        rs.controller.as_mut().unwrap().kind = "ReplicaSet".into();
        assert!(rs.view.is_some());
        inf.pod_event(Event::Apply(rs), true);
        assert_eq!(inf.store().pod("ns/rs-1").unwrap().view, None);
        let mut other = job("o", "4");
        other.managed_by = Some("example.com/other".into());
        inf.job_event(Event::Apply(other), true, now());
        inf.pod_event(Event::Apply(pod("o-1", "o", "5")), true);
        assert_eq!(inf.store().pod("ns/o-1").unwrap().view, None);
        let mut orphan = pod("free", "a", "6");
        orphan.controller = None;
        orphan.view = None;
        inf.pod_event(Event::Apply(orphan), true);
        assert!(!inf.store().pod("ns/free").unwrap().labels.is_empty(), "orphans keep labels");
        // A pod whose Job is not cached yet keeps its view, for the Job's snapshot.
        inf.pod_event(Event::Apply(pod("later-1", "later", "7")), true);
        assert!(inf.store().pod("ns/later-1").unwrap().view.is_some());
        let out = inf.job_event(Event::Apply(job("later", "8")), true, now());
        assert_eq!(view_shape(&out)[0].1, strs(&["reset", "pod:later-1", "job", "trust"]));
        // The managed Job's pod keeps it until the Job finishes.
        inf.pod_event(Event::Apply(pod("p1", "a", "9")), true);
        assert!(inf.store().pod("ns/p1").unwrap().view.is_some());
        let mut done = job("a", "10");
        done.finished = true;
        inf.job_event(Event::Apply(done), true, now());
        assert_eq!(inf.store().pod("ns/p1").unwrap().view, None);
        assert_eq!(inf.store().pod("ns/p0").unwrap().view, None);
    }

    #[test]
    fn matching_orphans_send_a_notice() {
        let mut inf = viewing();
        let mut orphan = pod("o", "a", "3");
        orphan.controller = None;
        orphan.view = None;
        let out = inf.pod_event(Event::Apply(orphan), true);
        let to_a: Vec<_> = view_shape(&out).into_iter().filter(|(k, _)| k == "ns/a").collect();
        assert_eq!(to_a, [("ns/a".to_string(), strs(&["orphans"]))], "with a's enqueue");
    }

    #[test]
    fn a_relist_ends_the_session_and_a_new_one_snapshots_after_it() {
        let mut inf = viewing();
        let out = inf.pod_event(Event::Init, true);
        assert_eq!(view_shape(&out), [(String::new(), strs(&["end"]))]);
        assert!(!inf.view_active() && !inf.view_wanted(true), "not while relisting");
        let out = inf.pod_event(Event::InitApply(pod("p5", "a", "12")), true);
        assert!(out.iter().all(|e| e.view.is_empty()), "no writes without a session");
        inf.pod_event(Event::InitDone, true);
        assert!(inf.view_wanted(true));
        let out = inf.begin_view();
        assert_eq!(out[1].session.as_deref(), Some("w-2"), "a new session");
        assert_eq!(view_shape(&out)[1].1, strs(&["reset", "pod:p5", "job", "trust"]));
        assert_eq!(view_shape(&inf.end_view()), [(String::new(), strs(&["end"]))]);
        assert!(inf.end_view().is_empty());
    }

    #[test]
    fn snapshots_come_in_chunks() {
        let mut inf = synced().with_view("w");
        for i in 0..(view::SNAPSHOT_CHUNK + 5) {
            inf.pod_event(
                Event::Apply(pod(&format!("q{i:04}"), "a", &format!("{}", 100 + i))),
                false,
            );
        }
        let out = inf.begin_view();
        let shape = view_shape(&out);
        assert_eq!(shape.len(), 4, "begin, two chunks, commit");
        assert_eq!(shape[1].1.len(), view::SNAPSHOT_CHUNK, "reset and pods");
        assert_eq!(shape[2].1.last().map(String::as_str), Some("trust"), "only the last trusts");
    }

    #[test]
    fn view_writes_fold_into_the_next_enqueue_of_their_key_only() {
        let view = |key: &str, pod: &str| {
            Enqueue::view_only(
                key.into(),
                "s".into(),
                vec![ViewWrite::DeletePod { name: pod.into() }],
            )
        };
        let enqueue = |key: &str| Enqueue {
            queue: JOB_QUEUE,
            key: key.into(),
            delay: SYNC_JOB_BATCH_PERIOD,
            ..Default::default()
        };
        let settle = Enqueue { settle: true, ..enqueue("ns/c") };
        let mut with_own = enqueue("ns/a");
        with_own.view = vec![ViewWrite::DeletePod { name: "own".into() }];
        let out = fold_views(vec![
            view("ns/a", "a1"),
            view("ns/b", "b1"),
            view("ns/c", "c1"),
            settle,
            enqueue("ns/x"),
            with_own,
            enqueue("ns/a"),
        ]);
        let shape = view_shape(&out);
        assert_eq!(
            shape,
            [
                ("ns/b".to_string(), strs(&["delete-pod:b1"])),
                ("ns/c".to_string(), strs(&["delete-pod:c1"])),
                ("ns/c".to_string(), vec![]),
                ("ns/x".to_string(), vec![]),
                ("ns/a".to_string(), strs(&["delete-pod:own"])),
                ("ns/a".to_string(), strs(&["delete-pod:a1"])),
            ],
            "no enqueue of b, a settling entry of c: both stay view-only; a's writes go to \
             the first enqueue of a that has none of its own"
        );
        assert!(out[0].observe_only && out[1].observe_only);
        assert_eq!(out[4].session, None);
        assert!(!out[5].observe_only && out[5].session.as_deref() == Some("s"));
    }

    #[test]
    fn map_event_keeps_the_variant() {
        let ev = map_event(Event::Delete(3), |x: i32| x * 2);
        assert!(matches!(ev, Event::Delete(6)));
        assert!(matches!(map_event(Event::<i32>::InitDone, |x| x), Event::InitDone));
    }

    #[test]
    fn nothing_is_handled_during_the_initial_lists() {
        let inf = synced();
        assert_eq!(inf.store().job_count(), 1);
        assert_eq!(inf.store().pod_count(), 1);
        assert_eq!(inf.enqueue_all().len(), 1);
    }

    #[test]
    fn add_update_same_rv_and_delete() {
        let mut inf = synced();
        let out = inf.pod_event(Event::Apply(pod("p1", "a", "3")), true);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].observations[0].kind, ObservationKind::Creation);
        assert_eq!(out[0].delay, SYNC_JOB_BATCH_PERIOD);
        // Same resourceVersion again: a resync-style duplicate, ignored.
        assert!(inf.pod_event(Event::Apply(pod("p1", "a", "3")), true).is_empty());
        // A real update.
        let mut p = pod("p1", "a", "4");
        p.deleting = true;
        let out = inf.pod_event(Event::Apply(p.clone()), true);
        assert_eq!(out[0].observations[0].kind, ObservationKind::Deletion);
        // Final delete: deletion already observed, only the finalizer removal remains.
        let out = inf.pod_event(Event::Delete(p), true);
        let kinds: Vec<_> = out[0].observations.iter().map(|o| o.kind).collect();
        assert_eq!(kinds, [ObservationKind::FinalizerRemoval]);
        assert!(inf.store().pod("ns/p1").is_none());
    }

    #[test]
    fn standby_keeps_the_cache_but_emits_nothing() {
        let mut inf = synced();
        assert!(inf.pod_event(Event::Apply(pod("p1", "a", "3")), false).is_empty());
        assert!(inf.job_event(Event::Apply(job("b", "5")), false, now()).is_empty());
        assert!(inf.store().pod("ns/p1").is_some());
        assert_eq!(inf.enqueue_all().len(), 2);
    }

    #[test]
    fn relist_synthesizes_tombstones_for_vanished_objects() {
        let mut inf = synced();
        inf.pod_event(Event::Apply(pod("p1", "a", "3")), true);
        // Watch cut; the relist shows p1 changed, p0 gone, p2 new.
        assert!(inf.pod_event(Event::Init, true).is_empty());
        let out = inf.pod_event(Event::InitApply(pod("p1", "a", "3")), true);
        assert!(out.is_empty(), "unchanged object on relist is not an event");
        let out = inf.pod_event(Event::InitApply(pod("p2", "a", "9")), true);
        assert_eq!(out[0].observations[0].kind, ObservationKind::Creation);
        let out = inf.pod_event(Event::InitDone, true);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].queue, JOB_QUEUE);
        let kinds: Vec<_> = out[0].observations.iter().map(|o| o.kind).collect();
        assert_eq!(kinds, [ObservationKind::Deletion, ObservationKind::FinalizerRemoval]);
        assert_eq!(out[0].observations[0].pod_uid, "uid-p0");
        assert!(inf.store().pod("ns/p0").is_none());
        let tombstones = inf
            .metrics
            .events
            .get_or_create(&EventLabels { kind: "pod", r#type: "tombstone" })
            .get();
        assert_eq!(tombstones, 1);
    }

    #[test]
    fn job_relist_tombstone_cleans_up_pods() {
        let mut inf = synced();
        inf.job_event(Event::Init, true, now());
        let out = inf.job_event(Event::InitDone, true, now());
        assert_eq!(
            out.iter().map(|e| (e.queue, e.key.as_str(), e.delay)).collect::<Vec<_>>(),
            [(JOB_QUEUE, "ns/a", Duration::ZERO), (ORPHAN_POD_QUEUE, "ns/p0", Duration::ZERO)]
        );
        assert_eq!(inf.store().job_count(), 0);
    }

    #[test]
    fn jobs_of_external_controllers_are_counted_on_add_by_the_leader() {
        let external = |name: &str, managed_by: Option<&str>| {
            let mut j = job(name, "3");
            j.managed_by = managed_by.map(str::to_string);
            j
        };
        let count = |inf: &Informer, name: &str| {
            let labels = ControllerNameLabels { controller_name: name.into() };
            inf.metrics.jobs_by_external_controller.get_or_create(&labels).get()
        };
        let mut inf = synced();
        inf.job_event(Event::Apply(external("k1", Some(DEFAULT_CONTROLLER_NAME))), true, now());
        inf.job_event(Event::Apply(external("o1", Some("example.com/other"))), true, now());
        inf.job_event(
            Event::Apply(external("b1", Some("kubernetes.io/job-controller"))),
            true,
            now(),
        );
        inf.job_event(Event::Apply(external("n1", None)), true, now());
        // An update of a known Job is not an add; a standby counts nothing.
        inf.job_event(Event::Apply(external("o1", Some("example.com/other"))), true, now());
        inf.job_event(Event::Apply(external("o2", Some("example.com/other"))), false, now());
        assert_eq!(count(&inf, DEFAULT_CONTROLLER_NAME), 1);
        assert_eq!(count(&inf, "example.com/other"), 1);
        assert_eq!(count(&inf, "kubernetes.io/job-controller"), 0);
        // Taking over counts every cached Job, as a new leader's list does upstream ("a" from
        // the initial list is managed by kjob too).
        inf.count_external_jobs();
        assert_eq!(count(&inf, "example.com/other"), 3);
        assert_eq!(count(&inf, DEFAULT_CONTROLLER_NAME), 3);
    }

    /// Pods already there when the watcher starts leading go through the pod add handler's
    /// orphan decisions (upstream's initial list runs `addPod` for each): a pod of a Job deleted
    /// while no watcher led, Terminating with the tracking finalizer, reaches the orphan queue.
    #[test]
    fn take_over_sends_cached_pods_needing_cleanup_to_the_orphan_queue() {
        let mut inf = informer();
        // A standby lists: Job "a" and its pod, a Terminating pod of the vanished Job "gone",
        // an orphan with the finalizer, one without, and a live pod of "gone" (left to the GC).
        inf.job_event(Event::Init, false, now());
        inf.job_event(Event::InitApply(job("a", "1")), false, now());
        inf.job_event(Event::InitDone, false, now());
        let mut terminating = pod("gone-x", "gone", "3");
        terminating.deleting = true;
        let mut orphan = pod("orphan", "none", "4");
        orphan.controller = None;
        let mut plain = pod("plain", "none", "5");
        plain.controller = None;
        plain.has_tracking_finalizer = false;
        inf.pod_event(Event::Init, false);
        for p in [pod("p0", "a", "2"), terminating, orphan, plain, pod("gone-y", "gone", "6")] {
            assert!(inf.pod_event(Event::InitApply(p), false).is_empty());
        }
        assert!(inf.pod_event(Event::InitDone, false).is_empty());
        let out = inf.take_over();
        let got: Vec<_> = out.iter().map(|e| (e.queue, e.key.as_str(), e.delay)).collect();
        assert_eq!(
            got,
            [
                (JOB_QUEUE, "ns/a", Duration::ZERO),
                (ORPHAN_POD_QUEUE, "ns/gone-x", Duration::ZERO),
                (ORPHAN_POD_QUEUE, "ns/orphan", Duration::ZERO),
            ]
        );
        assert!(out.iter().all(|e| e.observations.is_empty()), "no observation is replayed");
    }

    /// The periodic resync points out a pod that kept its tracking finalizer after its Job
    /// vanished, as a takeover does: an orphan-queue entry lost with Redis comes back.
    #[test]
    fn resync_points_out_pods_that_kept_their_finalizer() {
        let mut inf = synced();
        assert!(inf.job_event(Event::Apply(job("a", "1")), true, now()).is_empty());
        let mut orphan = pod("orphan", "none", "4");
        orphan.controller = None;
        let mut plain = pod("plain", "none", "5");
        plain.controller = None;
        plain.has_tracking_finalizer = false;
        inf.pod_event(Event::Apply(orphan), true);
        inf.pod_event(Event::Apply(plain), true);
        let got: Vec<_> = inf.resync().iter().map(|e| (e.queue, e.key.clone())).collect();
        assert_eq!(
            got,
            [(JOB_QUEUE, "ns/a".to_string()), (ORPHAN_POD_QUEUE, "ns/orphan".to_string())]
        );
        let jobs_only: Vec<_> = inf.enqueue_all().iter().map(|e| e.key.clone()).collect();
        assert_eq!(jobs_only, ["ns/a"]);
    }

    #[test]
    fn job_update_and_delete_events() {
        let mut inf = synced();
        assert!(inf.job_event(Event::Apply(job("a", "1")), true, now()).is_empty());
        let out = inf.job_event(Event::Apply(job("a", "7")), true, now());
        assert_eq!(out[0].delay, SYNC_JOB_BATCH_PERIOD);
        let out = inf.job_event(Event::Delete(job("a", "8")), true, now());
        assert_eq!(out.len(), 2, "{out:?}");
        // Pods of a deleted Job: a later pod delete goes to orphan cleanup.
        let out = inf.pod_event(Event::Delete(pod("p0", "a", "10")), true);
        assert_eq!(out[0].queue, ORPHAN_POD_QUEUE);
    }
}
