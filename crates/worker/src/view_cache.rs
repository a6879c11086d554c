//! The worker's cache of decoded shared views (issue 46: a sync costs what changed).
//!
//! A sync that planned from a trusted view keeps its pods here, decoded and seal-checked, with
//! their summaries, in name order (each held under its own name in the view), with the view's
//! Job UID, epoch token and version. The next sync of that Job asks kjob-queue for what changed
//! since that version and applies it (a delta from an older base than the one held fits too:
//! it is a superset); anything that does not fit (another UID or epoch, a delta from a newer
//! base than the one held, a count that does not match) drops the entry and reads the view in
//! full. The plan is the same as from a full read: the pods are the same entries, opened the
//! same way, in the same order.
//!
//! The sync plans from the held pods themselves, not a copy: they are shared
//! ([`SummarizedPods`]: `Arc`ed Pods behind one `Arc`), so handing them over costs one
//! reference count, and which of them the Job claims is taken once per pod as it comes in.
//! A delta applied while an earlier sync still holds the pods copies the pointers first (copy
//! on write), so no sync ever sees its pods change under it.
//!
//! Memory is bounded by pods, not Jobs (`--view-cache-pods`): the least recently synced Jobs
//! go first, and a Job larger than the whole bound is not kept.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kjob_queue_client::CachedView;
use kjob_reconcile::selector::Selector;
use kjob_reconcile::{Claim, PodSummary, SummarizedPods, claim};

/// Default of `--view-cache-pods`: one 100,000-pod Job (issue 46's largest); at an estimated 1.5 KB
/// of decoded Pod and summary each (not measured yet), about 150 MB at most.
pub const DEFAULT_VIEW_CACHE_PODS: usize = 100_000;

/// Most cached views a Lease names (kjob-queue's `MAX_CACHED_VIEWS`): the most recently
/// synced ones, which a worker is likeliest to lease again.
pub const LEASE_CACHED_VIEWS: usize = 64;

/// One Job's view as a sync last planned from it.
#[derive(Debug, Clone, Default)]
pub struct CachedJob {
    /// The UID of the Job the view held.
    pub uid: String,
    /// The epoch token of the session the view was trusted in.
    pub epoch: String,
    /// The view's version.
    pub version: u64,
    /// Its pods in name order, each held under its own name in the view, decoded, with their
    /// summaries: shared with the syncs that plan from them, never copied for one.
    pods: SummarizedPods,
    /// Which of them the Job claims; `None` until a sync asks.
    claims: Option<Claims>,
}

/// Which held pods the Job claims. Upstream `ClaimPods` keeps a pod the Job controls (its
/// controllerRef carries the Job's UID) that matches the Job's selector; of the Job only its UID
/// (one per held view) and selector count, so each pod is claimed once, as it comes in.
#[derive(Debug, Clone)]
struct Claims {
    /// The Job's `spec.selector` they were taken with (the API server never changes it; if it
    /// changed, every held pod would be claimed again).
    selector: Option<LabelSelector>,
    /// Held pods the Job does not claim (controlled by it, no longer matching its selector,
    /// until the orphan queue releases them), by name.
    unclaimed: BTreeSet<String>,
    /// Pods put in since the claims were last brought up to date, by name.
    unchecked: BTreeSet<String>,
}

fn pod_name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

impl CachedJob {
    /// An empty view of the Job with UID `uid`, trusted in the session of epoch token `epoch`
    /// (a whole read fills it with [`CachedJob::apply`]).
    pub fn new(uid: String, epoch: String) -> Self {
        CachedJob { uid, epoch, ..Default::default() }
    }

    /// Pods held.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// No pods held.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// The pods held, in name order, with their summaries.
    pub fn pods(&self) -> &SummarizedPods {
        &self.pods
    }

    /// Applies what changed in the view: drops the pods named in `removed`, and puts each of
    /// `changed` (opened from the view, where each is held under its own name) in place of
    /// the held pod of its name, or where its name falls. No held Pod is copied, and a sync
    /// that still plans from the pods handed out before keeps them unchanged.
    pub fn apply(&mut self, removed: &[String], changed: Vec<Pod>) {
        let changed: Vec<(Arc<Pod>, PodSummary)> = changed
            .into_iter()
            .map(|pod| {
                let summary = PodSummary::of(&pod);
                (Arc::new(pod), summary)
            })
            .collect();
        if let Some(c) = &mut self.claims {
            for name in removed {
                c.unclaimed.remove(name);
                c.unchecked.remove(name);
            }
            c.unchecked.extend(changed.iter().map(|(p, _)| pod_name(p).to_string()));
        }
        self.pods.apply_by_name(removed, changed);
    }

    /// The held pods Job `job` claims (`selector`: its selector, compiled), in name order, as
    /// upstream `ClaimPods` keeps them: the held list itself, shared, unless some held pod is
    /// not claimed (then a list without it, copying pointers only). Claims each pod put in
    /// since the last call; all of them the first time, or if the Job's selector changed.
    pub fn claimed(&mut self, job: &Job, selector: &Selector) -> SummarizedPods {
        let owned = |p: &Pod| claim(job, selector, p) == Claim::Owned;
        let spec_selector = job.spec.as_ref().and_then(|s| s.selector.as_ref());
        let claims = match &mut self.claims {
            Some(c) if c.selector.as_ref() == spec_selector => {
                for name in std::mem::take(&mut c.unchecked) {
                    let Some(i) = self.pods.find_by_name(&name) else { continue };
                    if owned(&self.pods.pods()[i]) {
                        c.unclaimed.remove(&name);
                    } else {
                        c.unclaimed.insert(name);
                    }
                }
                c
            }
            _ => {
                let unclaimed = self
                    .pods
                    .pods()
                    .iter()
                    .filter(|p| !owned(p))
                    .map(|p| pod_name(p).to_string())
                    .collect();
                self.claims.insert(Claims {
                    selector: spec_selector.cloned(),
                    unclaimed,
                    unchecked: BTreeSet::new(),
                })
            }
        };
        let mut pods = self.pods.clone();
        if !claims.unclaimed.is_empty() {
            pods.retain(|p| !claims.unclaimed.contains(pod_name(p)));
        }
        pods
    }
}

/// Decoded views of recently synced Jobs, shared by every sync of a worker.
#[derive(Debug)]
pub struct ViewCache {
    /// Most pods held over all Jobs.
    max_pods: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Job key → its view and when it was last used.
    jobs: HashMap<String, (CachedJob, u64)>,
    /// Pods held over all Jobs.
    pods: usize,
    /// Use counter (LRU order).
    clock: u64,
}

impl ViewCache {
    /// A cache of at most `max_pods` pods (0: nothing is kept).
    pub fn new(max_pods: usize) -> Self {
        Self { max_pods, inner: Mutex::new(Inner::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data: still usable.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The version and epoch token of the view held for `key`.
    pub fn base(&self, key: &str) -> Option<(u64, String)> {
        let inner = self.lock();
        inner.jobs.get(key).map(|(j, _)| (j.version, j.epoch.clone()))
    }

    /// The views held, most recently used first, at most `limit` (for a Lease to name).
    pub fn cached_views(&self, limit: usize) -> Vec<CachedView> {
        let inner = self.lock();
        let mut all: Vec<(&String, &(CachedJob, u64))> = inner.jobs.iter().collect();
        all.sort_by_key(|(_, (_, used))| std::cmp::Reverse(*used));
        all.into_iter()
            .take(limit)
            .map(|(key, (j, _))| CachedView {
                key: key.clone(),
                version: j.version,
                epoch: j.epoch.clone(),
            })
            .collect()
    }

    /// Takes the view held for `key` out of the cache (a sync applies a delta to it, then
    /// puts it back).
    pub fn take(&self, key: &str) -> Option<CachedJob> {
        let mut inner = self.lock();
        let (job, _) = inner.jobs.remove(key)?;
        inner.pods -= job.len();
        Some(job)
    }

    /// Forgets the view held for `key` (a read that could not be trusted, or did not fit).
    pub fn forget(&self, key: &str) {
        drop(self.take(key));
    }

    /// Keeps `job` as the view of `key`, dropping the least recently used others while the
    /// pods held would pass the bound. A Job larger than the bound is not kept.
    pub fn put(&self, key: &str, job: CachedJob) {
        let mut inner = self.lock();
        if let Some((old, _)) = inner.jobs.remove(key) {
            inner.pods -= old.len();
        }
        if job.len() > self.max_pods {
            return;
        }
        while inner.pods + job.len() > self.max_pods {
            let Some(oldest) = inner.jobs.iter().min_by_key(|(_, (_, used))| *used) else {
                break;
            };
            let oldest = oldest.0.clone();
            if let Some((gone, _)) = inner.jobs.remove(&oldest) {
                inner.pods -= gone.len();
            }
        }
        inner.clock += 1;
        let used = inner.clock;
        inner.pods += job.len();
        inner.jobs.insert(key.to_string(), (job, used));
    }

    /// Whether anything is kept (a bound above 0).
    pub fn enabled(&self) -> bool {
        self.max_pods > 0
    }

    /// Pods held over all Jobs.
    pub fn pods(&self) -> usize {
        self.lock().pods
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kjob_reconcile::testutil::{mk_job, mk_pod};

    fn names(pods: &SummarizedPods) -> Vec<String> {
        pods.pods().iter().map(|p| pod_name(p).to_string()).collect()
    }

    fn job_of(n: usize, version: u64) -> CachedJob {
        let job = mk_job("j").build();
        let mut c = CachedJob::new("u".into(), "e".into());
        c.apply(&[], (0..n).map(|i| mk_pod(&job, &format!("p{i}")).build()).collect());
        c.version = version;
        c
    }

    /// The bound is in pods: the least recently used Jobs go first, a Job above the bound is
    /// not kept, and taking a view out frees its pods.
    #[test]
    fn bounded_by_pods_least_recently_used_first() {
        let c = ViewCache::new(10);
        c.put("ns/a", job_of(4, 1));
        c.put("ns/b", job_of(4, 2));
        assert_eq!(c.pods(), 8);
        c.put("ns/a", job_of(5, 3));
        assert_eq!(c.pods(), 9, "a Job's new view replaces its old one");
        c.put("ns/c", job_of(3, 4));
        assert_eq!(c.base("ns/b"), None, "b was used least recently");
        assert_eq!(c.base("ns/a"), Some((3, "e".into())));
        let names: Vec<String> = c.cached_views(10).into_iter().map(|v| v.key).collect();
        assert_eq!(names, ["ns/c", "ns/a"], "most recently used first");
        c.put("ns/huge", job_of(11, 5));
        assert_eq!(c.base("ns/huge"), None, "larger than the bound: not kept");
        assert_eq!(c.take("ns/a").map(|j| j.version), Some(3));
        assert_eq!(c.pods(), 3);
        c.forget("ns/c");
        assert_eq!((c.pods(), c.cached_views(10).len()), (0, 0));
    }

    /// Pods are held in pod-name order with the summaries taken as they came in.
    #[test]
    fn held_in_name_order() {
        let j = job_of(12, 1);
        let s = j.pods();
        let mut sorted = names(s);
        sorted.sort();
        assert_eq!(names(s), sorted);
        assert_eq!(s.summaries(), &PodSummary::of_all(s.pods().iter().map(|p| p.as_ref()))[..]);
    }

    /// A sync plans from the held pods themselves (no copy), and what it holds never changes
    /// under it: a delta applied to the cache afterwards (a pod changed, one gone, one new)
    /// leaves the sync's pods and summaries as they were, while the next sync gets the new
    /// ones, and the pods no delta touched stay shared by both.
    #[test]
    fn syncs_share_the_held_pods_and_keep_them_through_later_deltas() {
        let job = mk_job("j").build();
        let selector = Selector::compile(job.spec.as_ref().unwrap().selector.as_ref()).unwrap();
        let mut held = job_of(4, 1);
        let first = held.claimed(&job, &selector);
        assert!(first.shares_with(held.pods()), "handed over without a copy");
        for (a, b) in first.pods().iter().zip(held.pods().pods()) {
            assert!(Arc::ptr_eq(a, b));
        }
        let before: Vec<(String, i64)> =
            first.pods().iter().map(|p| (pod_name(p).to_string(), restarts(p))).collect();
        let summaries_before = first.summaries().to_vec();

        held.apply(
            &["p0".into()],
            vec![mk_pod(&job, "p2").restarts(3).build(), mk_pod(&job, "p9").build()],
        );
        let after: Vec<(String, i64)> =
            first.pods().iter().map(|p| (pod_name(p).to_string(), restarts(p))).collect();
        assert_eq!(after, before, "the first sync's pods are untouched");
        assert_eq!(first.summaries(), &summaries_before[..]);
        assert!(!first.shares_with(held.pods()), "the delta copied the pointers, not the Pods");

        let second = held.claimed(&job, &selector);
        assert_eq!(names(&second), ["p1", "p2", "p3", "p9"]);
        assert_eq!(restarts(&second.pods()[1]), 3);
        assert!(second.summaries()[1] != summaries_before[2], "a new summary for the new pod");
        assert!(Arc::ptr_eq(&second.pods()[0], &first.pods()[1]), "p1: one Pod for both");
        assert!(Arc::ptr_eq(&second.pods()[2], &first.pods()[3]), "p3: one Pod for both");
    }

    fn restarts(p: &Pod) -> i64 {
        kjob_reconcile::pod::total_restarts(p)
    }

    /// The claim of each pod is taken once, as it comes in: a pod that stops matching the
    /// selector is left out of what syncs get (the rest still shared), and comes back when a
    /// later delta shows it matching again.
    #[test]
    fn claims_follow_each_pod_as_it_changes() {
        let job = mk_job("j").build();
        let selector = Selector::compile(job.spec.as_ref().unwrap().selector.as_ref()).unwrap();
        let mut held = job_of(3, 1);
        assert_eq!(names(&held.claimed(&job, &selector)), ["p0", "p1", "p2"]);
        let mut relabelled = mk_pod(&job, "p1").build();
        relabelled.metadata.labels = Some([("app".to_string(), "other".to_string())].into());
        let mut others = mk_pod(&job, "p5").build();
        others.metadata.owner_references.as_mut().unwrap()[0].uid = "another-job".into();
        held.apply(&[], vec![relabelled, others]);
        let claimed = held.claimed(&job, &selector);
        assert_eq!(names(&claimed), ["p0", "p2"]);
        assert_eq!(claimed.summaries().len(), 2);
        assert!(Arc::ptr_eq(&claimed.pods()[1], &held.pods().pods()[2]));
        assert_eq!(held.len(), 4, "held, not claimed");
        held.apply(&["p5".into()], vec![mk_pod(&job, "p1").build()]);
        let claimed = held.claimed(&job, &selector);
        assert_eq!(names(&claimed), ["p0", "p1", "p2"]);
        assert!(claimed.shares_with(held.pods()), "all claimed again: shared whole");
        // Another selector (never from the API server): every pod is claimed again.
        let mut narrowed = job.clone();
        let sel = narrowed.spec.as_mut().unwrap().selector.as_mut().unwrap();
        sel.match_labels.as_mut().unwrap().insert("only".into(), "p9".into());
        let none = Selector::compile(Some(sel)).unwrap();
        assert!(held.claimed(&narrowed, &none).is_empty());
    }
}
