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
#[derive(Debug, Clone, Default)]
pub struct SummarizedPods {
    pods: Vec<Pod>,
    summaries: Vec<PodSummary>,
}

impl SummarizedPods {
    /// Room for `n` pods.
    pub fn with_capacity(n: usize) -> Self {
        SummarizedPods { pods: Vec::with_capacity(n), summaries: Vec::with_capacity(n) }
    }

    /// Appends a pod, taking its summary now.
    pub fn push(&mut self, pod: Pod) {
        self.summaries.push(PodSummary::of(&pod));
        self.pods.push(pod);
    }

    /// Appends a pod whose summary was already taken.
    pub fn push_summarized(&mut self, pod: Pod, summary: PodSummary) {
        self.summaries.push(summary);
        self.pods.push(pod);
    }

    /// The pods.
    pub fn pods(&self) -> &[Pod] {
        &self.pods
    }

    /// The summaries, in the pods' order.
    pub fn summaries(&self) -> &[PodSummary] {
        &self.summaries
    }

    /// Number of pods.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// No pods.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// Keeps only the pods `keep` accepts (with their summaries), in order.
    pub fn retain(&mut self, mut keep: impl FnMut(&Pod) -> bool) {
        // In place: nothing moves while every pod is kept, and what follows a dropped pod moves
        // once (a rebuild regrew both vectors from empty and copied the pods at each doubling).
        let kept: Vec<bool> = self.pods.iter().map(&mut keep).collect();
        let mut pods_kept = kept.iter();
        self.pods.retain(|_| pods_kept.next().copied().unwrap_or(true));
        let mut summaries_kept = kept.iter();
        self.summaries.retain(|_| summaries_kept.next().copied().unwrap_or(true));
    }

    /// The pods with their summaries, by value.
    pub fn into_parts(self) -> (Vec<Pod>, Vec<PodSummary>) {
        (self.pods, self.summaries)
    }
}

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
                let mut out = SummarizedPods::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
                while let Some(pod) = seq.next_element::<Pod>()? {
                    out.push(pod);
                }
                Ok(out)
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
        assert_eq!(decoded.pods(), &pods[..]);
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
}
