//! The worker's cache of decoded shared views (issue 46: a sync costs what changed).
//!
//! A sync that planned from a trusted view keeps its pods here, decoded and seal-checked, with
//! their summaries, keyed by the view's name of each pod, and the view's Job UID, epoch token
//! and version. The next sync of that Job asks kjob-queue for what changed since that version
//! and applies it (a delta from an older base than the one held fits too: it is a superset);
//! anything that does not fit (another UID or epoch, a delta from a newer base than the one
//! held, a count that does not match) drops the entry and reads the view in full.
//! The plan is the same as from a full read: the pods are the same entries, opened the same
//! way, in the same order.
//!
//! Memory is bounded by pods, not Jobs (`--view-cache-pods`): the least recently synced Jobs
//! go first, and a Job larger than the whole bound is not kept.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;
use kjob_queue_client::CachedView;
use kjob_reconcile::{PodSummary, SummarizedPods};

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
    /// Its pods by their name in the view, decoded, with their summaries.
    pub pods: BTreeMap<String, (Pod, PodSummary)>,
}

impl CachedJob {
    /// The pods in name order (the order a LIST returns; among equal names, the view's
    /// order), as the sync plans from them.
    pub fn summarized(&self) -> SummarizedPods {
        let mut order: Vec<&(Pod, PodSummary)> = self.pods.values().collect();
        // Stable: a view holds each pod under its own name, so this only reorders when a name
        // in the view is not its pod's (which a full read would order the same way).
        order.sort_by(|a, b| a.0.metadata.name.cmp(&b.0.metadata.name));
        let mut pods = SummarizedPods::with_capacity(order.len());
        for (pod, summary) in order {
            pods.push_summarized(pod.clone(), *summary);
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
        inner.pods -= job.pods.len();
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
            inner.pods -= old.pods.len();
        }
        if job.pods.len() > self.max_pods {
            return;
        }
        while inner.pods + job.pods.len() > self.max_pods {
            let Some(oldest) = inner.jobs.iter().min_by_key(|(_, (_, used))| *used) else {
                break;
            };
            let oldest = oldest.0.clone();
            if let Some((gone, _)) = inner.jobs.remove(&oldest) {
                inner.pods -= gone.pods.len();
            }
        }
        inner.clock += 1;
        let used = inner.clock;
        inner.pods += job.pods.len();
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

    fn job_of(n: usize, version: u64) -> CachedJob {
        let job = mk_job("j").build();
        let pods = (0..n)
            .map(|i| {
                let pod = mk_pod(&job, &format!("p{i}")).build();
                let summary = PodSummary::of(&pod);
                (format!("p{i}"), (pod, summary))
            })
            .collect();
        CachedJob { uid: "u".into(), epoch: "e".into(), version, pods }
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

    /// Pods come out in pod-name order with the summaries they went in with.
    #[test]
    fn summarized_in_name_order() {
        let j = job_of(12, 1);
        let s = j.summarized();
        let names: Vec<&str> =
            s.pods().iter().map(|p| p.metadata.name.as_deref().unwrap()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        assert_eq!(s.summaries().len(), 12);
    }
}
