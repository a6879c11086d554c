//! What a sync reads of every pod, taken in one look at the Pod object.
//!
//! A `Pod` keeps each field the engine needs (phase, annotations, finalizers, conditions,
//! container statuses, node name) in its own heap allocation. With a few thousand pods those no
//! longer fit in the CPU cache, and reading them costs a cache miss each: planning a 10,000-pod
//! Job from cold Pod objects cost twice as much per pod as a 1,000-pod one. A [`PodSummary`] is a
//! few dozen bytes with all of it inline, so the engine's pass over every pod reads one dense
//! array and its cost grows with the number of pods, not with where they sit in memory.
//!
//! Take the summary while the Pod is still in cache, ideally as it is decoded ([`SummarizedPods`]
//! does it per item of a pod LIST; the worker decodes its LISTs that way), and hand the summaries
//! to [`crate::JobSync::with_summaries`].
//! [`crate::JobSync::new`] takes them itself.

use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;

use crate::pod::{self, RemovalKey, completion_index};

/// A pod's phase, as far as the Job controller tells phases apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodPhase {
    /// `Pending`.
    Pending,
    /// `Running`.
    Running,
    /// `Succeeded`.
    Succeeded,
    /// `Failed`.
    Failed,
    /// `Unknown`.
    Unknown,
    /// Unset or any other value.
    Other,
}

impl PodPhase {
    /// Parses `status.phase` (`""` when unset).
    pub fn parse(phase: &str) -> Self {
        match phase {
            pod::PHASE_PENDING => PodPhase::Pending,
            pod::PHASE_RUNNING => PodPhase::Running,
            pod::PHASE_SUCCEEDED => PodPhase::Succeeded,
            pod::PHASE_FAILED => PodPhase::Failed,
            pod::PHASE_UNKNOWN => PodPhase::Unknown,
            _ => PodPhase::Other,
        }
    }

    /// Succeeded or Failed (upstream `podutil.IsPodTerminal`).
    pub fn is_terminal(self) -> bool {
        matches!(self, PodPhase::Succeeded | PodPhase::Failed)
    }
}

/// Everything the sync engine reads of one pod on its pass over all of them (see the module
/// docs). Each answer equals the `pod` / `indexes` function of the same name on the Pod.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PodSummary {
    /// Completion index from the annotation only; `None` when missing or invalid.
    pub(crate) index: Option<i32>,
    pub(crate) phase: PodPhase,
    /// Has a deletionTimestamp.
    pub(crate) deleting: bool,
    /// Carries the `batch.kubernetes.io/job-tracking` finalizer.
    pub(crate) finalizer: bool,
    /// Deletion-order key (upstream `controller.ActivePods`).
    pub(crate) key: RemovalKey,
    /// Restarts of all containers and init containers (upstream `pastBackoffLimitOnFailure`).
    pub(crate) restarts_total: i64,
    /// Upstream `getFinishedTime`, for terminal or deleting pods only (no other pod's finish
    /// time is ever read).
    pub(crate) finished_at: Option<Timestamp>,
}

impl PodSummary {
    /// Reads the summary off a Pod.
    pub fn of(pod: &Pod) -> Self {
        let phase = PodPhase::parse(pod::phase(pod));
        let deleting = pod::is_deleting(pod);
        PodSummary {
            index: completion_index(pod),
            phase,
            deleting,
            finalizer: pod::has_tracking_finalizer(pod),
            key: pod::removal_key(pod),
            restarts_total: pod::total_restarts(pod),
            finished_at: (phase.is_terminal() || deleting).then(|| pod::finished_time(pod)),
        }
    }

    /// Summaries of `pods`, in order.
    pub fn of_all<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Vec<Self> {
        pods.into_iter().map(Self::of).collect()
    }

    /// The completion index ([`completion_index`]).
    pub fn index(&self) -> Option<i32> {
        self.index
    }

    /// The phase.
    pub fn phase(&self) -> PodPhase {
        self.phase
    }

    /// Carries the tracking finalizer ([`pod::has_tracking_finalizer`]).
    pub fn has_tracking_finalizer(&self) -> bool {
        self.finalizer
    }

    /// Not terminal and not being deleted ([`pod::is_active`]).
    pub fn is_active(&self) -> bool {
        !self.phase.is_terminal() && !self.deleting
    }

    /// Being deleted but not terminal ([`pod::is_terminating`]).
    pub fn is_terminating(&self) -> bool {
        !self.phase.is_terminal() && self.deleting
    }

    /// Upstream `isPodFailed` ([`pod::is_pod_failed`]), given the Job's
    /// [`crate::job::only_replace_failed_pods`].
    pub fn is_failed(&self, only_replace_failed_pods: bool) -> bool {
        match self.phase {
            PodPhase::Failed => true,
            _ if only_replace_failed_pods => false,
            phase => self.deleting && phase != PodPhase::Succeeded,
        }
    }

    /// The deletion-order key ([`pod::removal_key`]).
    pub fn removal_key(&self) -> RemovalKey {
        self.key
    }

    /// When the pod finished ([`pod::finished_time`]); `None` unless terminal or deleting.
    pub fn finished_at(&self) -> Option<Timestamp> {
        self.finished_at
    }
}

/// Pods and their [`PodSummary`]s, one to one and in the same order, as
/// [`crate::JobSync::with_summaries`] takes them. Deserializes from a JSON array of Pods (the
/// `items` of a pod LIST), taking each summary as soon as its Pod is decoded, while the freshly
/// written object is still in cache.
///
/// The pods are shared, never copied: each is an `Arc<Pod>`, and the two lists sit behind one
/// `Arc`, so a clone costs one reference count whatever the number of pods (the worker's view
/// cache hands its held pods to each sync that way, issue 46). Changing a list that another
/// clone still reads copies the pointers and summaries first (copy on write), never a Pod: a
/// holder never sees a change made through another clone.
#[derive(Debug, Clone, Default)]
pub struct SummarizedPods {
    shared: Arc<Parts>,
}

/// The two lists of a [`SummarizedPods`], one to one.
#[derive(Debug, Clone, Default)]
struct Parts {
    pods: Vec<Arc<Pod>>,
    summaries: Vec<PodSummary>,
}

/// A pod's name (`""` when unset): the order of a LIST and of a view read.
fn pod_name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

impl SummarizedPods {
    /// Room for `n` pods.
    pub fn with_capacity(n: usize) -> Self {
        let parts = Parts { pods: Vec::with_capacity(n), summaries: Vec::with_capacity(n) };
        SummarizedPods { shared: Arc::new(parts) }
    }

    /// The lists, to change: copied first (pointers and summaries) if another clone shares them.
    fn parts_mut(&mut self) -> &mut Parts {
        Arc::make_mut(&mut self.shared)
    }

    /// Appends a pod, taking its summary now.
    pub fn push(&mut self, pod: Pod) {
        let summary = PodSummary::of(&pod);
        self.push_summarized(pod, summary);
    }

    /// Appends a pod (owned, or already shared) whose summary was already taken.
    pub fn push_summarized(&mut self, pod: impl Into<Arc<Pod>>, summary: PodSummary) {
        let parts = self.parts_mut();
        parts.summaries.push(summary);
        parts.pods.push(pod.into());
    }

    /// The pods.
    pub fn pods(&self) -> &[Arc<Pod>] {
        &self.shared.pods
    }

    /// The summaries, in the pods' order.
    pub fn summaries(&self) -> &[PodSummary] {
        &self.shared.summaries
    }

    /// The pods as a sync reads them ([`crate::SyncInput::pods`]).
    pub fn as_slice(&self) -> PodSlice<'_> {
        PodSlice::Shared(self.pods())
    }

    /// Number of pods.
    pub fn len(&self) -> usize {
        self.shared.pods.len()
    }

    /// No pods.
    pub fn is_empty(&self) -> bool {
        self.shared.pods.is_empty()
    }

    /// Whether `self` and `other` share their lists (a clone of one another, neither changed
    /// since).
    pub fn shares_with(&self, other: &SummarizedPods) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Keeps only the pods `keep` accepts (with their summaries), in order. Keeping every pod
    /// changes nothing, so shared lists stay shared.
    pub fn retain(&mut self, mut keep: impl FnMut(&Pod) -> bool) {
        let kept: Vec<bool> = self.shared.pods.iter().map(|p| keep(p.as_ref())).collect();
        if kept.iter().all(|k| *k) {
            return;
        }
        // In place: what follows a dropped pod moves once (a rebuild regrew both vectors from
        // empty and copied them at each doubling).
        let parts = self.parts_mut();
        let mut pods_kept = kept.iter();
        parts.pods.retain(|_| pods_kept.next().copied().unwrap_or(true));
        let mut summaries_kept = kept.iter();
        parts.summaries.retain(|_| summaries_kept.next().copied().unwrap_or(true));
    }

    /// For pods in name order (a LIST's order, and a view read's): the position of the pod
    /// named `name`, by binary search.
    pub fn find_by_name(&self, name: &str) -> Option<usize> {
        self.shared.pods.binary_search_by(|p| pod_name(p).cmp(name)).ok()
    }

    /// For pods in name order with distinct names (a LIST's order, and a view read's): removes
    /// the pods named in `removed`, then puts each of `changed` in place of the pod of its name,
    /// or where its name falls in the order (of two with one name in `changed`, the later
    /// wins). The result is in name order with distinct names again: what sorting the same pods
    /// whole would give. Costs a binary search by name per name given, plus one pass over the
    /// pointers and summaries when pods come or go; no Pod is copied.
    pub fn apply_by_name(&mut self, removed: &[String], mut changed: Vec<(Arc<Pod>, PodSummary)>) {
        if removed.is_empty() && changed.is_empty() {
            return;
        }
        if !changed.is_sorted_by(|a, b| pod_name(&a.0) <= pod_name(&b.0)) {
            // Stable: of two with one name, the later stays later.
            changed.sort_by(|a, b| pod_name(&a.0).cmp(pod_name(&b.0)));
        }
        // Of two with one name, the later wins: `dedup_by` drops the later, so it is swapped in.
        changed.dedup_by(|later, kept| {
            let same = pod_name(&later.0) == pod_name(&kept.0);
            if same {
                std::mem::swap(later, kept);
            }
            same
        });
        let parts = self.parts_mut();
        let find = |pods: &[Arc<Pod>], name: &str| pods.binary_search_by(|p| pod_name(p).cmp(name));
        let mut gone: Vec<usize> =
            removed.iter().filter_map(|n| find(&parts.pods, n).ok()).collect();
        gone.sort_unstable();
        gone.dedup();
        // Positions in the list before this change, nondecreasing (`changed` is in name order).
        let mut inserts: Vec<(usize, Arc<Pod>, PodSummary)> = Vec::new();
        for (pod, summary) in changed {
            match find(&parts.pods, pod_name(&pod)) {
                Ok(i) => {
                    // Removed and put again (a delta names a pod once; kept for any caller):
                    // the pod is there.
                    if let Ok(g) = gone.binary_search(&i) {
                        gone.remove(g);
                    }
                    parts.pods[i] = pod;
                    parts.summaries[i] = summary;
                }
                Err(i) => inserts.push((i, pod, summary)),
            }
        }
        if gone.is_empty() && inserts.is_empty() {
            return;
        }
        let old_pods = std::mem::take(&mut parts.pods);
        let old_summaries = std::mem::take(&mut parts.summaries);
        let n = old_pods.len() - gone.len() + inserts.len();
        parts.pods.reserve_exact(n);
        parts.summaries.reserve_exact(n);
        let mut inserts = inserts.into_iter().peekable();
        let mut gone = gone.into_iter().peekable();
        for (i, (pod, summary)) in old_pods.into_iter().zip(old_summaries).enumerate() {
            while let Some((_, p, s)) = inserts.next_if(|(at, ..)| *at <= i) {
                parts.pods.push(p);
                parts.summaries.push(s);
            }
            if gone.next_if_eq(&i).is_some() {
                continue;
            }
            parts.pods.push(pod);
            parts.summaries.push(summary);
        }
        for (_, p, s) in inserts {
            parts.pods.push(p);
            parts.summaries.push(s);
        }
    }

    /// The pods with their summaries, by value (the lists are copied, pointers only, when
    /// another clone shares them).
    pub fn into_parts(self) -> (Vec<Arc<Pod>>, Vec<PodSummary>) {
        let parts = Arc::unwrap_or_clone(self.shared);
        (parts.pods, parts.summaries)
    }
}

impl<'a> From<&'a SummarizedPods> for PodSlice<'a> {
    fn from(pods: &'a SummarizedPods) -> Self {
        pods.as_slice()
    }
}

/// The pods a sync reads ([`crate::SyncInput::pods`]), borrowed as the caller holds them: Pods
/// of its own, or Pods shared with a cache (`Arc`s, as [`SummarizedPods`] holds them), so a
/// sync plans from either without copying a Pod. Reads like a slice of `Pod`s.
#[derive(Debug, Clone, Copy)]
pub enum PodSlice<'a> {
    /// Pods the caller owns.
    Owned(&'a [Pod]),
    /// Pods shared with others.
    Shared(&'a [Arc<Pod>]),
}

impl Default for PodSlice<'_> {
    fn default() -> Self {
        PodSlice::Owned(&[])
    }
}

impl<'a> PodSlice<'a> {
    /// Number of pods.
    pub fn len(self) -> usize {
        match self {
            PodSlice::Owned(p) => p.len(),
            PodSlice::Shared(p) => p.len(),
        }
    }

    /// No pods.
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }

    /// The pod at `i`; panics past the end, as indexing a slice does.
    pub fn pod(self, i: usize) -> &'a Pod {
        match self {
            PodSlice::Owned(p) => &p[i],
            PodSlice::Shared(p) => &p[i],
        }
    }

    /// The pods, in order.
    pub fn iter(self) -> PodIter<'a> {
        match self {
            PodSlice::Owned(p) => PodIter::Owned(p.iter()),
            PodSlice::Shared(p) => PodIter::Shared(p.iter()),
        }
    }
}

impl<'a> IntoIterator for PodSlice<'a> {
    type Item = &'a Pod;
    type IntoIter = PodIter<'a>;

    fn into_iter(self) -> PodIter<'a> {
        self.iter()
    }
}

impl<'a> From<&'a [Pod]> for PodSlice<'a> {
    fn from(pods: &'a [Pod]) -> Self {
        PodSlice::Owned(pods)
    }
}

impl<'a> From<&'a Vec<Pod>> for PodSlice<'a> {
    fn from(pods: &'a Vec<Pod>) -> Self {
        PodSlice::Owned(pods)
    }
}

impl<'a, const N: usize> From<&'a [Pod; N]> for PodSlice<'a> {
    fn from(pods: &'a [Pod; N]) -> Self {
        PodSlice::Owned(pods)
    }
}

impl<'a> From<&'a [Arc<Pod>]> for PodSlice<'a> {
    fn from(pods: &'a [Arc<Pod>]) -> Self {
        PodSlice::Shared(pods)
    }
}

impl<'a> From<&'a Vec<Arc<Pod>>> for PodSlice<'a> {
    fn from(pods: &'a Vec<Arc<Pod>>) -> Self {
        PodSlice::Shared(pods)
    }
}

/// The pods of a [`PodSlice`], in order.
#[derive(Debug, Clone)]
pub enum PodIter<'a> {
    /// Over owned Pods.
    Owned(std::slice::Iter<'a, Pod>),
    /// Over shared Pods.
    Shared(std::slice::Iter<'a, Arc<Pod>>),
}

impl<'a> Iterator for PodIter<'a> {
    type Item = &'a Pod;

    fn next(&mut self) -> Option<&'a Pod> {
        match self {
            PodIter::Owned(it) => it.next(),
            PodIter::Shared(it) => it.next().map(|p| &**p),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            PodIter::Owned(it) => it.size_hint(),
            PodIter::Shared(it) => it.size_hint(),
        }
    }
}

impl ExactSizeIterator for PodIter<'_> {}

impl<'de> Deserialize<'de> for SummarizedPods {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Items;
        impl<'de> serde::de::Visitor<'de> for Items {
            type Value = SummarizedPods;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an array of Pods")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                // The size hint comes from the input; bound it so a lying body cannot make us
                // reserve gigabytes up front.
                let n = seq.size_hint().unwrap_or(0).min(4096);
                let mut parts =
                    Parts { pods: Vec::with_capacity(n), summaries: Vec::with_capacity(n) };
                while let Some(pod) = seq.next_element::<Pod>()? {
                    parts.summaries.push(PodSummary::of(&pod));
                    parts.pods.push(Arc::new(pod));
                }
                Ok(SummarizedPods { shared: Arc::new(parts) })
            }
        }
        d.deserialize_seq(Items)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::only_replace_failed_pods;
    use crate::pod::{
        finished_time, has_tracking_finalizer, is_active, is_pod_failed, is_terminating,
        removal_key,
    };
    use crate::testutil::{at, mk_job, mk_pod};
    use proptest::prelude::*;

    /// A pod built from random choices of everything the summary reads.
    #[allow(clippy::too_many_arguments)]
    fn pod_from(
        job: &k8s_openapi::api::batch::v1::Job,
        phase: u8,
        deleting: bool,
        finalizer: bool,
        index: Option<i32>,
        ready: Option<i64>,
        restarts: i32,
        node: bool,
    ) -> Pod {
        let mut b = mk_pod(job, "p").created(at(3));
        if let Some(ix) = index {
            b = b.index(ix);
        }
        b = match phase {
            0 => b.pending(),
            1 => b,
            2 => b.succeeded(at(40)),
            3 => b.failed(2, at(41)),
            _ => b.phase("Unknown"),
        };
        if let Some(t) = ready {
            b = b.ready(at(t));
        }
        if deleting {
            b = b.deleting(at(50));
        }
        if !finalizer {
            b = b.no_finalizer();
        }
        if !node {
            b = b.node(None);
        }
        b.restarts(restarts).build()
    }

    #[test]
    fn index_comes_from_the_annotation_only() {
        let job = mk_job("j").indexed().build();
        let label_only =
            mk_pod(&job, "p").label(kjob_core::JOB_COMPLETION_INDEX_ANNOTATION, "3").build();
        assert_eq!(PodSummary::of(&label_only).index(), None);
        let annotated =
            mk_pod(&job, "q").annotation(kjob_core::JOB_COMPLETION_INDEX_ANNOTATION, "3").build();
        assert_eq!(PodSummary::of(&annotated).index(), Some(3));
    }

    proptest! {
        /// Every answer of the summary equals the Pod-reading function it stands for.
        #[test]
        fn summary_answers_as_the_pod_does(
            phase in 0u8..5, deleting: bool, finalizer: bool, index in proptest::option::of(0i32..50),
            ready in proptest::option::of(0i64..30), restarts in 0i32..4, node: bool,
            replace_failed_only: bool,
        ) {
            let mut job = mk_job("j");
            if replace_failed_only {
                job = job.pod_replacement_policy("Failed");
            }
            let job = job.build();
            let pod = pod_from(&job, phase, deleting, finalizer, index, ready, restarts, node);
            let s = PodSummary::of(&pod);
            prop_assert_eq!(s.index(), completion_index(&pod));
            prop_assert_eq!(s.has_tracking_finalizer(), has_tracking_finalizer(&pod));
            prop_assert_eq!(s.is_active(), is_active(&pod));
            prop_assert_eq!(s.is_terminating(), is_terminating(&pod));
            prop_assert_eq!(s.is_failed(only_replace_failed_pods(&job)), is_pod_failed(&pod, &job));
            prop_assert_eq!(s.removal_key(), removal_key(&pod));
            prop_assert_eq!(s.restarts_total, pod::total_restarts(&pod));
            if s.phase().is_terminal() || deleting {
                prop_assert_eq!(s.finished_at(), Some(finished_time(&pod)));
            } else {
                prop_assert_eq!(s.finished_at(), None);
            }
        }
    }

    #[test]
    fn retain_keeps_pods_and_summaries_together_in_order() {
        let job = mk_job("j").indexed().completions(Some(5)).build();
        let mut pods = SummarizedPods::with_capacity(5);
        for i in 0..5 {
            pods.push(mk_pod(&job, &format!("p{i}")).index(i).build());
        }
        pods.retain(|_| true);
        assert_eq!(pods.len(), 5);
        pods.retain(|p| p.metadata.name.as_deref() != Some("p1"));
        pods.retain(|p| p.metadata.name.as_deref() != Some("p4"));
        let names: Vec<_> = pods.pods().iter().map(|p| p.metadata.name.clone().unwrap()).collect();
        assert_eq!(names, ["p0", "p2", "p3"]);
        let indexes: Vec<_> = pods.summaries().iter().map(PodSummary::index).collect();
        assert_eq!(indexes, [Some(0), Some(2), Some(3)]);
        // Shared lists are copied (pointers only) before a change, and only then.
        let mut kept = pods.clone();
        let shared = pods.clone();
        kept.retain(|_| true);
        assert!(kept.shares_with(&shared), "keeping every pod changes nothing");
        kept.retain(|p| p.metadata.name.as_deref() != Some("p2"));
        assert!(!kept.shares_with(&shared));
        assert_eq!((kept.len(), shared.len()), (2, 3), "the other clone keeps its pods");
        assert!(Arc::ptr_eq(&kept.pods()[1], &shared.pods()[2]), "the Pods themselves shared");
        pods.retain(|_| false);
        assert!(pods.is_empty() && pods.summaries().is_empty());
    }

    #[test]
    fn decodes_with_the_summaries() {
        let job = mk_job("j").indexed().completions(Some(3)).build();
        let pods = vec![
            mk_pod(&job, "a").index(2).succeeded(at(40)).build(),
            mk_pod(&job, "b").index(0).ready(at(5)).build(),
        ];
        let json = serde_json::to_string(&pods).expect("encode");
        let decoded: SummarizedPods = serde_json::from_str(&json).expect("decode");
        assert!(decoded.as_slice().iter().eq(&pods));
        assert_eq!(decoded.summaries(), &PodSummary::of_all(&pods)[..]);
        assert_eq!(decoded.summaries()[0].index(), Some(2));
        assert_eq!(decoded.summaries()[0].phase(), PodPhase::Succeeded);
        assert_eq!(decoded.summaries()[0].finished_at(), Some(at(40)));
        assert!(decoded.summaries()[1].is_active());
        let empty: SummarizedPods = serde_json::from_str("[]").expect("decode");
        assert!(empty.is_empty());
        // A body that is not an array of Pods is the decoder's error, not an empty list.
        assert!(serde_json::from_str::<SummarizedPods>("[1, 2]").is_err());
        assert!(serde_json::from_str::<SummarizedPods>("{}").is_err());
    }

    fn names(pods: &SummarizedPods) -> Vec<String> {
        pods.pods().iter().map(|p| pod_name(p).to_string()).collect()
    }

    /// Pods in name order, each with its summary, as one list.
    fn sorted(
        job: &k8s_openapi::api::batch::v1::Job,
        names: &[&str],
        restarts: i32,
    ) -> SummarizedPods {
        let mut names = names.to_vec();
        names.sort_unstable();
        let mut out = SummarizedPods::with_capacity(names.len());
        for n in names {
            out.push(mk_pod(job, n).restarts(restarts).build());
        }
        out
    }

    proptest! {
        /// Applying removals and changes by name gives what sorting the resulting pods whole
        /// gives: same pods, same order, same summaries; and a clone taken before is untouched.
        #[test]
        fn apply_by_name_is_a_sort_of_the_result(
            held in proptest::collection::btree_set(0u8..40, 0..30),
            removed in proptest::collection::vec(0u8..40, 0..10),
            changed in proptest::collection::vec(0u8..40, 0..10),
        ) {
            let job = mk_job("j").build();
            let name = |i: &u8| format!("p{i:02}");
            let held_names: Vec<String> = held.iter().map(name).collect();
            let held_refs: Vec<&str> = held_names.iter().map(String::as_str).collect();
            let mut pods = sorted(&job, &held_refs, 0);
            let before = pods.clone();
            let removed: Vec<String> = removed.iter().map(name).collect();
            let changed_pods: Vec<(Arc<Pod>, PodSummary)> = changed
                .iter()
                .map(|i| {
                    let p = mk_pod(&job, &name(i)).restarts(1).build();
                    let s = PodSummary::of(&p);
                    (Arc::new(p), s)
                })
                .collect();
            pods.apply_by_name(&removed, changed_pods);
            // The expected result: held minus removed, plus changed (changed win).
            let mut want: std::collections::BTreeMap<String, i32> =
                held_names.iter().map(|n| (n.clone(), 0)).collect();
            for r in &removed {
                want.remove(r);
            }
            for c in &changed {
                want.insert(name(c), 1);
            }
            let got: Vec<(String, i32)> = pods
                .pods()
                .iter()
                .map(|p| (pod_name(p).to_string(), pod::total_restarts(p) as i32))
                .collect();
            let want: Vec<(String, i32)> = want.into_iter().collect();
            prop_assert_eq!(got, want);
            prop_assert_eq!(
                pods.summaries(),
                &PodSummary::of_all(pods.pods().iter().map(|p| p.as_ref()))[..]
            );
            prop_assert_eq!(names(&before), held_names, "the clone taken before is unchanged");
            prop_assert!(before.summaries().iter().all(|s| s.restarts_total == 0));
        }
    }

    /// A change that neither adds nor drops a pod replaces it in place; one that does rebuilds
    /// the lists once, and either way a clone taken before keeps its pods.
    #[test]
    fn apply_by_name_replaces_inserts_and_removes() {
        let job = mk_job("j").build();
        let mut pods = sorted(&job, &["b", "d", "f"], 0);
        let unchanged = pods.pods()[0].clone();
        let taken = pods.clone();
        let put = |n: &str| {
            let p = mk_pod(&job, n).restarts(2).build();
            let s = PodSummary::of(&p);
            (Arc::new(p), s)
        };
        pods.apply_by_name(&[], vec![put("d")]);
        assert_eq!(names(&pods), ["b", "d", "f"]);
        assert_eq!(pods.summaries()[1].restarts_total, 2);
        assert!(Arc::ptr_eq(&pods.pods()[0], &unchanged), "the other pods are not copied");
        assert_eq!(taken.summaries()[1].restarts_total, 0, "the clone keeps the old pod");
        pods.apply_by_name(&["b".into(), "x".into()], vec![put("g"), put("a"), put("c")]);
        assert_eq!(names(&pods), ["a", "c", "d", "f", "g"]);
        assert_eq!(names(&taken), ["b", "d", "f"]);
        pods.apply_by_name(&["a".into(), "g".into()], vec![put("a")]);
        assert_eq!(names(&pods), ["a", "c", "d", "f"], "removed and put again: there");
        pods.apply_by_name(&["a".into(), "c".into(), "d".into(), "f".into()], Vec::new());
        assert!(pods.is_empty() && pods.summaries().is_empty());
    }
}
