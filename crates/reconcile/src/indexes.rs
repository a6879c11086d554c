//! Completion indexes of Indexed Jobs: the compressed interval format of
//! `status.completedIndexes` / `status.failedIndexes`, index sets computed from pods, the choice
//! of indexes to create next, and per-index failure counts (upstream `indexed_job_utils.go`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kjob_core::{JOB_INDEX_FAILURE_COUNT_ANNOTATION, JOB_INDEX_IGNORED_FAILURE_COUNT_ANNOTATION};

use crate::job::{completions, only_replace_failed_pods};
use crate::pod::{
    RemovalKey, completion_index, finished_time, has_tracking_finalizer, is_pod_failed,
    is_valid_tracked_pod, removal_key, terminating_pods,
};
use crate::pod_failure_policy::{PodFailurePolicyAction, match_pod_failure_policy};

/// A closed range of indexes `first..=last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    /// First index in the range.
    pub first: i32,
    /// Last index in the range (inclusive).
    pub last: i32,
}

/// A sorted list of disjoint, non-adjacent intervals (upstream `orderedIntervals`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OrderedIntervals(Vec<Interval>);

impl OrderedIntervals {
    /// The empty set.
    pub fn new() -> Self {
        Self(Vec::new())
    }

    /// Parses the compressed format ("1,3-5,7") keeping only indexes below `completions`, as
    /// upstream `parseIndexesFromString`: unparsable parts are skipped, parsing stops at the
    /// first part starting at or beyond `completions`, and an interval end is clamped to
    /// `completions - 1`. Unlike upstream, reversed ranges are skipped and out-of-order or
    /// overlapping parts are normalised, so the result always keeps the type's invariant.
    pub fn parse(s: &str, completions: i32) -> Self {
        if s.is_empty() {
            return Self::new();
        }
        let mut parts = Vec::new();
        for part in s.split(',') {
            let mut limits = part.split('-');
            // i64 like Go's `strconv.Atoi`, so a huge first index stops parsing as upstream does
            // instead of being skipped as unparsable.
            let Some(Ok(first)) = limits.next().map(str::parse::<i64>) else { continue };
            if first >= i64::from(completions) {
                break;
            }
            let last = match limits.next() {
                None => first,
                Some(l) => match l.parse::<i64>() {
                    Ok(l) => l.min(i64::from(completions) - 1),
                    Err(_) => continue,
                },
            };
            if last < first {
                continue;
            }
            // Both are in [0, completions) here, so they fit in i32.
            let (first, last) = (first as i32, last as i32);
            parts.push(Interval { first, last });
        }
        Self::normalise(parts)
    }

    /// Parses an optional status field; `None` is the empty set.
    pub fn parse_opt(s: Option<&str>, completions: i32) -> Self {
        s.map(|s| Self::parse(s, completions)).unwrap_or_default()
    }

    /// Builds the set from indexes in any order (duplicates allowed).
    pub fn from_indexes(indexes: impl IntoIterator<Item = i32>) -> Self {
        let mut v: Vec<i32> = indexes.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        Self::from_sorted(&v)
    }

    /// Builds the set from ascending indexes (duplicates allowed), without sorting again.
    pub(crate) fn from_sorted(sorted: &[i32]) -> Self {
        Self::normalise(sorted.iter().map(|&i| Interval { first: i, last: i }).collect())
    }

    /// Sorts by start and merges overlapping or adjacent intervals.
    fn normalise(mut v: Vec<Interval>) -> Self {
        if !v.windows(2).all(|w| w[0].first <= w[1].first) {
            v.sort_unstable_by_key(|iv| iv.first);
        }
        let mut out: Vec<Interval> = Vec::with_capacity(v.len());
        for iv in v {
            match out.last_mut() {
                // `i64` so `last + 1` cannot overflow at i32::MAX.
                Some(prev) if i64::from(iv.first) <= i64::from(prev.last) + 1 => {
                    prev.last = prev.last.max(iv.last);
                }
                _ => out.push(iv),
            }
        }
        Self(out)
    }

    /// The set plus `indexes` (any order) (upstream `withOrderedIndexes`).
    pub fn with_indexes(&self, indexes: impl IntoIterator<Item = i32>) -> Self {
        self.merge(&Self::from_indexes(indexes))
    }

    /// The union of two sets, in linear time (upstream `merge`).
    pub fn merge(&self, other: &Self) -> Self {
        let (a, b) = (&self.0, &other.0);
        let mut all = Vec::with_capacity(a.len() + b.len());
        let (mut i, mut j) = (0, 0);
        while i < a.len() && j < b.len() {
            if a[i].first < b[j].first {
                all.push(a[i]);
                i += 1;
            } else {
                all.push(b[j]);
                j += 1;
            }
        }
        all.extend_from_slice(&a[i..]);
        all.extend_from_slice(&b[j..]);
        Self::normalise(all)
    }

    /// Whether `ix` is in the set, by binary search (upstream `has`).
    pub fn contains(&self, ix: i32) -> bool {
        let pos = self.0.partition_point(|iv| iv.last < ix);
        self.0.get(pos).is_some_and(|iv| iv.first <= ix)
    }

    /// Number of indexes in the set (upstream `total`).
    pub fn total(&self) -> usize {
        self.0.iter().map(|iv| (i64::from(iv.last) - i64::from(iv.first) + 1) as usize).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The intervals, sorted.
    pub fn intervals(&self) -> &[Interval] {
        &self.0
    }

    /// Every index in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = i32> + '_ {
        self.0.iter().flat_map(|iv| iv.first..=iv.last)
    }
}

/// Upstream format: "a" for one index, "a,b" for two adjacent ones, "a-b" for three or more.
impl fmt::Display for OrderedIntervals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, iv) in self.0.iter().enumerate() {
            if n > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}", iv.first)?;
            if iv.last == iv.first + 1 {
                write!(f, ",{}", iv.last)?;
            } else if iv.last > iv.first {
                write!(f, "-{}", iv.last)?;
            }
        }
        Ok(())
    }
}

/// Indexes of `pods` that have a valid index (upstream `getIndexes`).
pub fn indexes_of<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> BTreeSet<i32> {
    pods.into_iter().filter_map(completion_index).collect()
}

/// `(previous, current)` succeeded indexes: `status.completedIndexes` parsed, and that plus the
/// indexes of Succeeded pods that still carry the tracking finalizer (upstream
/// `calculateSucceededIndexes`).
pub fn calculate_succeeded_indexes<'a>(
    job: &Job,
    pods: impl IntoIterator<Item = &'a Pod>,
) -> (OrderedIntervals, OrderedIntervals) {
    let recorded = job.status.as_ref().and_then(|s| s.completed_indexes.as_deref());
    recorded_and_tracked(job, recorded, pods, crate::pod::is_succeeded)
}

/// `status.failedIndexes` plus the indexes of tracked pods whose failure fails the index
/// (upstream `calculateFailedIndexes`; only meaningful with backoffLimitPerIndex).
pub fn calculate_failed_indexes<'a>(
    job: &Job,
    pods: impl IntoIterator<Item = &'a Pod>,
) -> OrderedIntervals {
    let recorded = job.status.as_ref().and_then(|s| s.failed_indexes.as_deref());
    recorded_and_tracked(job, recorded, pods, |p| is_index_failed(job, p)).1
}

/// `(previous, current)`: the `recorded` status intervals, and those plus the in-range indexes
/// of the pods that still carry the tracking finalizer and pass `counts`.
fn recorded_and_tracked<'a>(
    job: &Job,
    recorded: Option<&str>,
    pods: impl IntoIterator<Item = &'a Pod>,
    counts: impl Fn(&Pod) -> bool,
) -> (OrderedIntervals, OrderedIntervals) {
    let completions = completions(job).unwrap_or(0);
    let prev = OrderedIntervals::parse_opt(recorded, completions);
    let new = pods.into_iter().filter_map(|p| {
        let ix = completion_index(p)?;
        (ix < completions && has_tracking_finalizer(p) && counts(p)).then_some(ix)
    });
    let current = prev.with_indexes(new);
    (prev, current)
}

/// The pod's failure fails its index: a FailIndex rule matched, or the failure counts and the
/// pod's failure-count annotation reached backoffLimitPerIndex (upstream `isIndexFailed`).
pub fn is_index_failed(job: &Job, pod: &Pod) -> bool {
    if !is_pod_failed(pod, job) {
        return false;
    }
    let spec = job.spec.as_ref();
    let counted = match spec.and_then(|s| s.pod_failure_policy.as_ref()) {
        Some(policy) => {
            let m = match_pod_failure_policy(Some(policy), pod);
            if m.action == Some(PodFailurePolicyAction::FailIndex) {
                return true;
            }
            m.count_failed
        }
        None => true,
    };
    let limit = spec.and_then(|s| s.backoff_limit_per_index).unwrap_or(i32::MAX);
    counted && index_failure_count(pod) >= limit
}

/// Up to `count` smallest indexes in `[0, completions)` that are not succeeded, failed, held by
/// an active pod, or (with [`only_replace_failed_pods`]) held by a terminating pod, ascending
/// (upstream `firstPendingIndexes`). Linear in pods plus intervals plus `count`.
pub fn first_pending_indexes<'a>(
    job: &Job,
    active: impl IntoIterator<Item = &'a Pod>,
    all_pods: impl IntoIterator<Item = &'a Pod>,
    succeeded: &OrderedIntervals,
    failed: Option<&OrderedIntervals>,
    count: usize,
) -> Vec<i32> {
    if count == 0 {
        return Vec::new();
    }
    let completions = completions(job).unwrap_or(0);
    let mut non_pending = succeeded.with_indexes(indexes_of(active));
    if only_replace_failed_pods(job) {
        non_pending = non_pending.with_indexes(indexes_of(terminating_pods(all_pods)));
    }
    if let Some(failed) = failed {
        non_pending = non_pending.merge(failed);
    }
    first_pending_outside(&non_pending, completions, count)
}

/// Up to `count` smallest indexes in `[0, completions)` that are not in `non_pending`, ascending.
/// Linear in intervals plus `count`.
pub(crate) fn first_pending_outside(
    non_pending: &OrderedIntervals,
    completions: i32,
    count: usize,
) -> Vec<i32> {
    let mut result = Vec::with_capacity(count.min(completions.max(0) as usize));
    let mut candidate = 0i32;
    for iv in non_pending.intervals() {
        while candidate < completions && result.len() < count && candidate < iv.first {
            result.push(candidate);
            candidate += 1;
        }
        if result.len() >= count || candidate >= completions {
            return result;
        }
        candidate = candidate.max(iv.last.saturating_add(1));
    }
    while candidate < completions && result.len() < count {
        result.push(candidate);
        candidate += 1;
    }
    result
}

/// Splits active pods of an Indexed Job into (to remove, to keep): pods without a valid index or
/// with index ≥ `completions` are removed, and of each duplicated index all but the pod that sorts
/// last in upstream `ActivePods` order ([`RemovalKey`]) (the most advanced one) (upstream
/// `appendDuplicatedIndexPodsForRemoval`).
pub fn duplicated_index_pods_for_removal<'a>(
    pods: &[&'a Pod],
    completions: i32,
) -> (Vec<&'a Pod>, Vec<&'a Pod>) {
    let indexes: Vec<Option<i32>> = pods.iter().map(|p| completion_index(p)).collect();
    let (rm, left) = split_duplicated_indexes(&indexes, completions, |i| removal_key(pods[i]));
    (rm.into_iter().map(|i| pods[i]).collect(), left.into_iter().map(|i| pods[i]).collect())
}

/// [`duplicated_index_pods_for_removal`] over positions: `indexes[i]` is the parsed completion
/// index of pod `i` and `key(i)` its deletion-order key. Groups pods by sorting `(index,
/// position)` pairs instead of building a map of per-index vectors: one allocation whatever the
/// pod count, and the deletion order is looked at only for the (rare) pods sharing an index.
pub(crate) fn split_duplicated_indexes(
    indexes: &[Option<i32>],
    completions: i32,
    key: impl Fn(usize) -> RemovalKey,
) -> (Vec<usize>, Vec<usize>) {
    let mut rm = Vec::new();
    let mut valid: Vec<(i32, usize)> = Vec::with_capacity(indexes.len());
    for (pos, &ix) in indexes.iter().enumerate() {
        match ix {
            Some(ix) if ix < completions => valid.push((ix, pos)),
            _ => rm.push(pos),
        }
    }
    // Position breaks ties, so each index's pods keep their input order, as the map did.
    valid.sort_unstable();
    let mut left = Vec::with_capacity(valid.len());
    for group in valid.chunk_by(|a, b| a.0 == b.0) {
        if let [(_, pos)] = group {
            left.push(*pos);
            continue;
        }
        let mut dups: Vec<(RemovalKey, usize)> =
            group.iter().map(|&(_, pos)| (key(pos), pos)).collect();
        // Stable, like the upstream sort of the group: equal pods keep their input order.
        dups.sort_by_key(|d| d.0);
        let (_, keep) = dups.pop().expect("groups are never empty");
        rm.extend(dups.into_iter().map(|(_, pos)| pos));
        left.push(keep);
    }
    (rm, left)
}

/// For each pending index, the last failed pod whose deletion waits for its replacement, so the
/// failure count can be copied into the new pod. Indexes that are succeeded, failed or active
/// are skipped; among candidates the one with the highest absolute failure count and latest
/// finish time wins (upstream `getPodsWithDelayedDeletionPerIndex`).
pub fn pods_with_delayed_deletion_per_index<'a>(
    job: &Job,
    pods: impl IntoIterator<Item = &'a Pod>,
    active: impl IntoIterator<Item = &'a Pod>,
    succeeded: &OrderedIntervals,
    failed: &OrderedIntervals,
    finalizer_removals_in_flight: &BTreeSet<String>,
) -> BTreeMap<i32, &'a Pod> {
    let mut active_indexes: Vec<i32> = active.into_iter().filter_map(completion_index).collect();
    active_indexes.sort_unstable();
    let candidates = pods.into_iter().filter_map(|p| {
        if !is_valid_tracked_pod(job, p, finalizer_removals_in_flight) || !is_pod_failed(p, job) {
            return None;
        }
        Some((completion_index(p)?, p))
    });
    delayed_deletion_among(candidates, succeeded, failed, &active_indexes)
}

/// The core of [`pods_with_delayed_deletion_per_index`] over already filtered candidates:
/// `(index, pod)` of tracked failed pods with a valid index, in input order, and the ascending
/// indexes of active pods.
pub(crate) fn delayed_deletion_among<'a>(
    candidates: impl IntoIterator<Item = (i32, &'a Pod)>,
    succeeded: &OrderedIntervals,
    failed: &OrderedIntervals,
    active_sorted: &[i32],
) -> BTreeMap<i32, &'a Pod> {
    let mut out: BTreeMap<i32, &'a Pod> = BTreeMap::new();
    for (ix, p) in candidates {
        if succeeded.contains(ix) || failed.contains(ix) || active_sorted.binary_search(&ix).is_ok()
        {
            continue;
        }
        match out.get(&ix) {
            Some(prev)
                if !(index_absolute_failure_count(prev) <= index_absolute_failure_count(p)
                    && finished_time(p) >= finished_time(prev)) => {}
            _ => {
                out.insert(ix, p);
            }
        }
    }
    out
}

fn annotation_count(pod: &Pod, key: &str) -> i32 {
    // Missing, unparsable, negative or out-of-range values read as 0, as upstream `parseInt32`.
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|v| (0..=i64::from(i32::MAX)).contains(v))
        .map_or(0, |v| v as i32)
}

/// The pod's `batch.kubernetes.io/job-index-failure-count` (upstream `getIndexFailureCount`).
pub fn index_failure_count(pod: &Pod) -> i32 {
    annotation_count(pod, JOB_INDEX_FAILURE_COUNT_ANNOTATION)
}

/// The pod's `batch.kubernetes.io/job-index-ignored-failure-count`.
pub fn index_ignored_failure_count(pod: &Pod) -> i32 {
    annotation_count(pod, JOB_INDEX_IGNORED_FAILURE_COUNT_ANNOTATION)
}

/// Failure count plus ignored failure count (upstream `getIndexAbsoluteFailureCount`).
pub fn index_absolute_failure_count(pod: &Pod) -> i32 {
    index_failure_count(pod).saturating_add(index_ignored_failure_count(pod))
}

/// `(failure count, ignored failure count)` for the pod replacing `replaced`: the previous
/// counts plus one in the bucket its failure fell into; `(0, 0)` for a fresh index (upstream
/// `getNewIndexFailureCounts`).
pub fn new_index_failure_counts(job: &Job, replaced: Option<&Pod>) -> (i32, i32) {
    let Some(pod) = replaced else { return (0, 0) };
    let (mut failures, mut ignored) = (index_failure_count(pod), index_ignored_failure_count(pod));
    let counted = match job.spec.as_ref().and_then(|s| s.pod_failure_policy.as_ref()) {
        Some(policy) => match_pod_failure_policy(Some(policy), pod).count_failed,
        None => true,
    };
    if counted {
        failures = failures.saturating_add(1);
    } else {
        ignored = ignored.saturating_add(1);
    }
    (failures, ignored)
}

#[cfg(test)]
#[allow(clippy::type_complexity)] // Table rows are spelled out as tuples on purpose.
mod tests {
    use kjob_core::JOB_COMPLETION_INDEX_ANNOTATION;

    use super::*;
    use crate::testutil::{at, exit_code_rule, mk_job, mk_pod};

    fn iv(pairs: &[(i32, i32)]) -> OrderedIntervals {
        OrderedIntervals(pairs.iter().map(|&(first, last)| Interval { first, last }).collect())
    }

    #[test]
    fn parse_table() {
        let cases: &[(&str, i32, &[(i32, i32)])] = &[
            ("", 10, &[]),
            ("1", 10, &[(1, 1)]),
            ("1,3-5,7", 10, &[(1, 1), (3, 5), (7, 7)]),
            ("0-2,3,4,6,7", 10, &[(0, 4), (6, 7)]),
            ("1,2-4,5,7-9", 8, &[(1, 5), (7, 7)]),
            ("0-5,9", 8, &[(0, 5)]),
            ("9-12", 8, &[]),
            ("a,1,2-x,3,5-b", 10, &[(1, 1), (3, 3)]),
            ("-3,2", 10, &[(2, 2)]),
            ("5-3,7", 10, &[(7, 7)]),
            ("7,1-2,2-3", 10, &[(1, 3), (7, 7)]),
            ("2147483647", i32::MAX, &[]),
            ("0,99999999999,3", 5, &[(0, 0)]),
            ("+2,4-99999999999", 6, &[(2, 2), (4, 5)]),
        ];
        for (s, completions, want) in cases {
            assert_eq!(OrderedIntervals::parse(s, *completions), iv(want), "{s:?} / {completions}");
        }
    }

    #[test]
    fn format_table() {
        let cases: &[(&[(i32, i32)], &str)] = &[
            (&[], ""),
            (&[(0, 0)], "0"),
            (&[(1, 2)], "1,2"),
            (&[(1, 3)], "1-3"),
            (&[(0, 0), (3, 4), (6, 10), (12, 12)], "0,3,4,6-10,12"),
        ];
        for (ivs, want) in cases {
            assert_eq!(iv(ivs).to_string(), *want);
        }
        // Round trip through the parser.
        let s = "0,3,4,6-10,12";
        assert_eq!(OrderedIntervals::parse(s, 100).to_string(), s);
    }

    #[test]
    fn merge_contains_total_iter() {
        let a = OrderedIntervals::parse("0-2,8", 100);
        let b = OrderedIntervals::parse("3,5-6,9-10", 100);
        let m = a.merge(&b);
        assert_eq!(m.to_string(), "0-3,5,6,8-10");
        assert_eq!(m.total(), 9);
        for (ix, want) in [
            (0, true),
            (3, true),
            (4, false),
            (6, true),
            (7, false),
            (10, true),
            (11, false),
            (-1, false),
        ] {
            assert_eq!(m.contains(ix), want, "{ix}");
        }
        assert_eq!(m.iter().collect::<Vec<_>>(), vec![0, 1, 2, 3, 5, 6, 8, 9, 10]);
        assert_eq!(OrderedIntervals::new().with_indexes([5, 1, 3, 2, 5]).to_string(), "1-3,5");
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn small_set() -> impl Strategy<Value = BTreeSet<i32>> {
            proptest::collection::btree_set(0i32..200, 0..60)
        }

        proptest! {
            /// The compressed format round-trips and matches the plain set it was built from.
            #[test]
            fn format_parse_round_trip(set in small_set()) {
                let iv = OrderedIntervals::from_indexes(set.iter().copied());
                prop_assert_eq!(iv.iter().collect::<BTreeSet<_>>(), set.clone());
                prop_assert_eq!(iv.total(), set.len());
                prop_assert_eq!(OrderedIntervals::parse(&iv.to_string(), 200), iv.clone());
                for ix in -1..201 {
                    prop_assert_eq!(iv.contains(ix), set.contains(&ix));
                }
                // Intervals stay sorted, disjoint and non-adjacent.
                for w in iv.intervals().windows(2) {
                    prop_assert!(w[0].last + 1 < w[1].first);
                }
            }

            /// Merge is set union; parsing with a smaller bound is intersection with [0, bound).
            #[test]
            fn merge_is_union(a in small_set(), b in small_set(), bound in 0i32..220) {
                let (ia, ib) = (OrderedIntervals::from_indexes(a.iter().copied()), OrderedIntervals::from_indexes(b.iter().copied()));
                let union: BTreeSet<i32> = a.union(&b).copied().collect();
                prop_assert_eq!(ia.merge(&ib).iter().collect::<BTreeSet<_>>(), union);
                let clipped: BTreeSet<i32> = a.iter().copied().filter(|i| *i < bound).collect();
                prop_assert_eq!(OrderedIntervals::parse(&ia.to_string(), bound).iter().collect::<BTreeSet<_>>(), clipped);
            }

            /// firstPendingIndexes returns the smallest free indexes below completions, ascending.
            #[test]
            fn first_pending_is_smallest_free(succ in small_set(), active in small_set(), count in 0usize..80, completions in 0i32..200) {
                let job = mk_job("j").indexed().completions(Some(completions)).build();
                let pods: Vec<Pod> = active.iter().map(|ix| mk_pod(&job, &format!("p{ix}")).index(*ix).build()).collect();
                let succeeded = OrderedIntervals::from_indexes(succ.iter().copied());
                let got = first_pending_indexes(&job, &pods, &pods, &succeeded, None, count);
                let want: Vec<i32> = (0..completions).filter(|i| !succ.contains(i) && !active.contains(i)).take(count).collect();
                prop_assert_eq!(got, want);
            }
        }
    }

    /// Re-derived from upstream's TestCalculateSucceededIndexes.
    #[test]
    fn succeeded_indexes_table() {
        let cases: &[(&str, &[(i32, &str, bool)], i32, &str)] = &[
            // (previous, pods (index, phase, has finalizer), completions, want)
            ("", &[], 4, ""),
            ("", &[(0, "Succeeded", true), (1, "Failed", true), (2, "Succeeded", true)], 4, "0,2"),
            (
                "1",
                &[(0, "Succeeded", true), (2, "Succeeded", true), (5, "Succeeded", true)],
                4,
                "0-2",
            ),
            ("0-5", &[(7, "Succeeded", true)], 6, "0-5"),
            ("", &[(0, "Succeeded", false), (1, "Succeeded", true)], 4, "1"),
            ("0-2,7-9", &[(5, "Succeeded", true)], 8, "0-2,5,7"),
        ];
        for (prev, pods, completions, want) in cases {
            let job = mk_job("j")
                .indexed()
                .completions(Some(*completions))
                .completed_indexes(prev)
                .build();
            let pods: Vec<Pod> = pods
                .iter()
                .enumerate()
                .map(|(n, (ix, phase, fin))| {
                    let b = mk_pod(&job, &format!("p{n}")).index(*ix).phase(phase);
                    if *fin { b.build() } else { b.no_finalizer().build() }
                })
                .collect();
            let (p, cur) = calculate_succeeded_indexes(&job, &pods);
            assert_eq!(p, OrderedIntervals::parse(prev, *completions));
            assert_eq!(cur.to_string(), *want, "prev={prev:?}");
        }
    }

    #[test]
    fn failed_indexes_and_index_failed() {
        let job = mk_job("j")
            .indexed()
            .completions(Some(6))
            .backoff_limit_per_index(1)
            .failed_indexes("0")
            .build();
        let pods = [
            // count 1 >= limit 1: index fails.
            mk_pod(&job, "a").index(2).failure_counts(1, None).failed(1, at(1)).build(),
            // count 0 < 1: retried.
            mk_pod(&job, "b").index(3).failure_counts(0, None).failed(1, at(1)).build(),
            // already counted (no finalizer): not new.
            mk_pod(&job, "c")
                .index(4)
                .failure_counts(3, None)
                .failed(1, at(1))
                .no_finalizer()
                .build(),
        ];
        assert_eq!(calculate_failed_indexes(&job, &pods).to_string(), "0,2");

        let pfp = mk_job("j")
            .indexed()
            .completions(Some(6))
            .backoff_limit_per_index(1)
            .pod_failure_policy(vec![
                exit_code_rule("FailIndex", None, "In", &[42]),
                exit_code_rule("Ignore", None, "In", &[7]),
            ])
            .build();
        let fail_index = mk_pod(&pfp, "x").index(1).failed(42, at(1)).build();
        assert!(is_index_failed(&pfp, &fail_index));
        let ignored = mk_pod(&pfp, "y").index(1).failure_counts(5, None).failed(7, at(1)).build();
        assert!(!is_index_failed(&pfp, &ignored));
        let counted = mk_pod(&pfp, "z").index(1).failure_counts(1, None).failed(3, at(1)).build();
        assert!(is_index_failed(&pfp, &counted));
        assert!(!is_index_failed(
            &pfp,
            &mk_pod(&pfp, "r").index(1).failure_counts(9, None).build()
        ));
    }

    /// Re-derived from upstream's TestFirstPendingIndexes.
    #[test]
    fn first_pending_table() {
        let job = mk_job("j").indexed().completions(Some(20)).build();
        let running = |ixs: &[i32]| -> Vec<Pod> {
            ixs.iter().map(|ix| mk_pod(&job, &format!("r{ix}")).index(*ix).build()).collect()
        };
        let cases: Vec<(Vec<Pod>, &str, Option<&str>, usize, Vec<i32>)> = vec![
            (vec![], "", None, 0, vec![]),
            (vec![], "", None, 3, vec![0, 1, 2]),
            (running(&[5, 0, 7]), "", None, 4, vec![1, 2, 3, 4]),
            (vec![], "2,4,5,7-9", None, 6, vec![0, 1, 3, 6, 10, 11]),
            (running(&[3, 0, 6]), "2,4,5,7-9", None, 6, vec![1, 10, 11, 12, 13, 14]),
            (running(&[18, 19]), "0-16", None, 5, vec![17]),
            (vec![], "0-4", Some("5,7"), 3, vec![6, 8, 9]),
        ];
        for (pods, succ, failed, count, want) in cases {
            let succ = OrderedIntervals::parse(succ, 20);
            let failed = failed.map(|f| OrderedIntervals::parse(f, 20));
            let got = first_pending_indexes(&job, &pods, &pods, &succ, failed.as_ref(), count);
            assert_eq!(got, want);
        }
    }

    #[test]
    fn first_pending_skips_terminating_only_when_replacing_failed() {
        let term = |job: &Job| mk_pod(job, "t").index(0).deleting(at(1)).build();
        let default = mk_job("j").indexed().completions(Some(3)).build();
        let pods = [term(&default)];
        let none = OrderedIntervals::new();
        assert_eq!(first_pending_indexes(&default, [], &pods, &none, None, 2), vec![0, 1]);
        let strict =
            mk_job("j").indexed().completions(Some(3)).pod_replacement_policy("Failed").build();
        let pods = [term(&strict)];
        assert_eq!(first_pending_indexes(&strict, [], &pods, &none, None, 2), vec![1, 2]);
    }

    #[test]
    fn duplicated_indexes() {
        let job = mk_job("j").indexed().completions(Some(3)).build();
        let a = mk_pod(&job, "a").index(0).pending().build();
        let b = mk_pod(&job, "b").index(0).ready(at(1)).build();
        let c = mk_pod(&job, "c").index(0).build();
        let d = mk_pod(&job, "d").index(1).build();
        let e = mk_pod(&job, "e").index(3).build();
        let f = mk_pod(&job, "f").build();
        let (rm, left) = duplicated_index_pods_for_removal(&[&a, &b, &c, &d, &e, &f], 3);
        let names =
            |v: &[&Pod]| v.iter().map(|p| p.metadata.name.clone().unwrap()).collect::<Vec<_>>();
        assert_eq!(names(&rm), vec!["e", "f", "a", "c"]);
        assert_eq!(names(&left), vec!["b", "d"]);
    }

    /// Re-derived from upstream's TestAppendDuplicatedIndexPodsForRemoval (compared as
    /// multisets: our removal list puts invalid indexes first, upstream sorts by index).
    #[test]
    fn duplicated_indexes_upstream_table() {
        let job = mk_job("j").indexed().completions(Some(6)).build();
        type Row<'a> = &'a [(&'a str, &'a str)];
        let cases: &[(Row, Row, Row)] = &[
            (
                &[("-", "Pending"), ("2", "Pending"), ("5", "Running"), ("6", "Running")],
                &[("-", "Pending"), ("6", "Running")],
                &[("2", "Pending"), ("5", "Running")],
            ),
            (
                &[
                    ("5", "Pending"),
                    ("0", "Running"),
                    ("3", "Pending"),
                    ("0", "Running"),
                    ("3", "Running"),
                    ("0", "Pending"),
                    ("6", "Running"),
                    ("6", "Pending"),
                ],
                &[
                    ("0", "Pending"),
                    ("0", "Running"),
                    ("3", "Pending"),
                    ("6", "Running"),
                    ("6", "Pending"),
                ],
                &[("0", "Running"), ("3", "Running"), ("5", "Pending")],
            ),
            (
                &[
                    ("-", "Pending"),
                    ("invalid", "Running"),
                    ("-2", "Running"),
                    ("0", "Pending"),
                    ("1", "Pending"),
                    ("1", "Pending"),
                    ("1", "Running"),
                ],
                &[
                    ("-", "Pending"),
                    ("invalid", "Running"),
                    ("-2", "Running"),
                    ("1", "Pending"),
                    ("1", "Pending"),
                ],
                &[("0", "Pending"), ("1", "Running")],
            ),
        ];
        let desc = |p: &Pod| -> (String, String) {
            let ix = p
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(JOB_COMPLETION_INDEX_ANNOTATION).cloned())
                .unwrap_or_else(|| "-".to_string());
            (ix, crate::pod::phase(p).to_string())
        };
        let sorted = |mut v: Vec<(String, String)>| {
            v.sort();
            v
        };
        for (pods, want_rm, want_left) in cases {
            // Hollow pods like upstream's: no node, no conditions, only index and phase.
            let pods: Vec<Pod> = pods
                .iter()
                .enumerate()
                .map(|(n, (ix, phase))| {
                    let b = mk_pod(&job, &format!("p{n}"))
                        .node(None)
                        .phase(phase)
                        .with(|p| p.metadata.labels = None);
                    if *ix == "-" {
                        b.build()
                    } else {
                        b.annotation(JOB_COMPLETION_INDEX_ANNOTATION, ix).build()
                    }
                })
                .collect();
            let refs: Vec<&Pod> = pods.iter().collect();
            let (rm, left) = duplicated_index_pods_for_removal(&refs, 6);
            let own =
                |r: Row| sorted(r.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect());
            assert_eq!(sorted(rm.iter().map(|p| desc(p)).collect()), own(want_rm));
            assert_eq!(sorted(left.iter().map(|p| desc(p)).collect()), own(want_left));
        }
    }

    /// A 10,000-pod Indexed Job goes through every helper; all of them are (near) linear, so this
    /// stays fast in debug builds.
    #[test]
    fn large_indexed_job() {
        let n = 10_000;
        let job = mk_job("big")
            .indexed()
            .completions(Some(n))
            .parallelism(n)
            .backoff_limit_per_index(1)
            .build();
        let pods: Vec<Pod> = (0..n)
            .map(|ix| {
                let b = mk_pod(&job, &format!("p{ix}")).index(ix);
                match ix % 4 {
                    0 => b.succeeded(at(1)).build(),
                    1 => b.failure_counts(0, None).failed(1, at(1)).build(),
                    _ => b.build(),
                }
            })
            .collect();
        let (_, succeeded) = calculate_succeeded_indexes(&job, &pods);
        assert_eq!(succeeded.total(), 2500);
        let failed = calculate_failed_indexes(&job, &pods);
        assert!(failed.is_empty(), "failure count 0 < limit 1: retried, not failed");
        let active = crate::testutil::active_pods(&pods);
        assert_eq!(active.len(), 5000);
        let pending = first_pending_indexes(
            &job,
            active.iter().copied(),
            &pods,
            &succeeded,
            Some(&failed),
            500,
        );
        assert_eq!(pending.len(), 500);
        assert_eq!(pending[..3], [1, 5, 9]);
        let delayed = pods_with_delayed_deletion_per_index(
            &job,
            &pods,
            active.iter().copied(),
            &succeeded,
            &failed,
            &BTreeSet::new(),
        );
        assert_eq!(delayed.len(), 2500);
        let (rm, left) = duplicated_index_pods_for_removal(&active, n);
        assert_eq!((rm.len(), left.len()), (0, 5000));
    }

    #[test]
    fn failure_count_annotations() {
        let job = mk_job("j").indexed().completions(Some(3)).backoff_limit_per_index(3).build();
        let p = mk_pod(&job, "p").failure_counts(2, Some(1)).failed(1, at(1)).build();
        assert_eq!(
            (
                index_failure_count(&p),
                index_ignored_failure_count(&p),
                index_absolute_failure_count(&p)
            ),
            (2, 1, 3)
        );
        let bogus =
            mk_pod(&job, "q").annotation(JOB_INDEX_FAILURE_COUNT_ANNOTATION, "99999999999").build();
        assert_eq!(index_failure_count(&bogus), 0);
        assert_eq!(new_index_failure_counts(&job, None), (0, 0));
        assert_eq!(new_index_failure_counts(&job, Some(&p)), (3, 1));
        let pfp = mk_job("j")
            .indexed()
            .completions(Some(3))
            .backoff_limit_per_index(3)
            .pod_failure_policy(vec![exit_code_rule("Ignore", None, "In", &[1])])
            .build();
        assert_eq!(new_index_failure_counts(&pfp, Some(&p)), (2, 2));
    }

    #[test]
    fn delayed_deletion_picks_latest_failure_of_pending_index() {
        let job = mk_job("j").indexed().completions(Some(4)).backoff_limit_per_index(5).build();
        let pods = vec![
            mk_pod(&job, "i0-old").index(0).failure_counts(0, None).failed(1, at(10)).build(),
            mk_pod(&job, "i0-new").index(0).failure_counts(1, None).failed(1, at(20)).build(),
            mk_pod(&job, "i1-failed").index(1).failed(1, at(5)).build(),
            mk_pod(&job, "i1-active").index(1).build(),
            mk_pod(&job, "i2-succ-idx").index(2).failed(1, at(5)).build(),
            mk_pod(&job, "i3-counted").index(3).failed(1, at(5)).no_finalizer().build(),
        ];
        let active: Vec<&Pod> = crate::testutil::active_pods(&pods);
        let succeeded = OrderedIntervals::parse("2", 4);
        let got = pods_with_delayed_deletion_per_index(
            &job,
            &pods,
            active,
            &succeeded,
            &OrderedIntervals::new(),
            &BTreeSet::new(),
        );
        let got: Vec<(i32, &str)> =
            got.iter().map(|(ix, p)| (*ix, p.metadata.name.as_deref().unwrap())).collect();
        assert_eq!(got, vec![(0, "i0-new")]);
    }
}
