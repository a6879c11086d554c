//! Which active pods manageJob deletes first (upstream `activePodsForRemoval`): pods of
//! invalid or duplicated indexes, then the first in upstream `ActivePods` order.

use k8s_openapi::api::batch::v1::Job;

use crate::indexes::split_duplicated_indexes;
use crate::job::completions;
use crate::pod::RemovalKey;

/// [`active_pods_for_removal`] over positions `0..len` in the active pod list, with each pod's
/// [`RemovalKey`] (`key(position)`) and (exactly for Indexed Jobs) completion index already
/// computed.
pub(crate) fn active_pods_for_removal_with(
    job: &Job,
    len: usize,
    key: impl Fn(usize) -> RemovalKey,
    indexes: Option<&[Option<i32>]>,
    rm_at_least: usize,
) -> Vec<usize> {
    let (mut rm, left) = match indexes {
        Some(indexes) => split_duplicated_indexes(indexes, completions(job).unwrap_or(0), &key),
        None => (Vec::new(), (0..len).collect()),
    };
    if rm.len() < rm_at_least {
        let need = (rm_at_least - rm.len()).min(left.len());
        // A comparison reads two small keys instead of walking both Pods' conditions and
        // container statuses. Equal pods keep their order in `left` (completion-index order for
        // Indexed Jobs): upstream's sort.Sort is an insertion sort, a stable one, on up to 12
        // pods, so of two running pods alike the lower index goes first.
        let mut keyed: Vec<(RemovalKey, usize, usize)> =
            left.into_iter().enumerate().map(|(rank, i)| (key(i), rank, i)).collect();
        let order = |a: &(RemovalKey, usize, usize), b: &(RemovalKey, usize, usize)| {
            (a.0, a.1).cmp(&(b.0, b.1))
        };
        if need < keyed.len() {
            // Only the first `need` are taken, so a partial selection keeps this O(n) on average.
            keyed.select_nth_unstable_by(need, order);
            keyed.truncate(need);
        }
        keyed.sort_by(order);
        rm.extend(keyed.into_iter().map(|(_, _, i)| i));
    }
    rm
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::Pod;

    use super::*;
    use crate::job::is_indexed;
    use crate::pod::{completion_index, name, removal_key};
    use crate::testutil::{active_pods_for_removal, active_pods_order, at, mk_job, mk_pod};

    /// Re-derived from upstream's TestActivePodsForRemoval equivalents.
    #[test]
    fn pods_for_removal_table() {
        let nonidx = mk_job("j").parallelism(3).completions(Some(5)).build();
        let a = mk_pod(&nonidx, "a").ready(at(10)).build();
        let b = mk_pod(&nonidx, "b").build();
        let c = mk_pod(&nonidx, "c").pending().build();
        let active = [&a, &b, &c];
        let names = |v: Vec<&Pod>| v.into_iter().map(|p| name(p).to_string()).collect::<Vec<_>>();
        assert_eq!(names(active_pods_for_removal(&nonidx, &active, 0)), Vec::<String>::new());
        assert_eq!(names(active_pods_for_removal(&nonidx, &active, 1)), vec!["c"]);
        assert_eq!(names(active_pods_for_removal(&nonidx, &active, 2)), vec!["c", "b"]);
        assert_eq!(names(active_pods_for_removal(&nonidx, &active, 5)), vec!["c", "b", "a"]);

        let idx = mk_job("j").indexed().parallelism(4).completions(Some(4)).build();
        let p0 = mk_pod(&idx, "p0").index(0).ready(at(1)).build();
        let p0dup = mk_pod(&idx, "p0dup").index(0).build();
        let p1 = mk_pod(&idx, "p1").index(1).build();
        let p7 = mk_pod(&idx, "p7").index(7).build();
        let none = mk_pod(&idx, "none").build();
        let bad =
            mk_pod(&idx, "bad").annotation(kjob_core::JOB_COMPLETION_INDEX_ANNOTATION, "x").build();
        let active = [&p1, &p7, &p0, &none, &p0dup, &bad];
        let mut got = names(active_pods_for_removal(&idx, &active, 0));
        got.sort();
        assert_eq!(got, vec!["bad", "none", "p0dup", "p7"]);
        let got = names(active_pods_for_removal(&idx, &active, 5));
        assert_eq!(got.len(), 5);
        assert_eq!(got[4], "p1", "the extra removal comes from the remaining pods");
    }

    /// Random active pods: every field the deletion order or the index grouping reads, with
    /// few values each so ties, duplicates and bad indexes are common.
    mod removal_props {
        use super::*;
        use kjob_core::JOB_COMPLETION_INDEX_ANNOTATION;
        use proptest::prelude::*;

        type Shape = (u8, u8, u8, u8, u8, u8);

        fn pod(job: &Job, n: usize, (node, phase, ready, restarts, created, ix): Shape) -> Pod {
            let mut b = mk_pod(job, &format!("p{n}"))
                .node([None, Some("a"), Some("b")][node as usize % 3])
                .phase(["Pending", "Running", "Unknown", ""][phase as usize % 4])
                .restarts(i32::from(restarts % 3));
            b = match ready % 4 {
                0 => b,
                1 => b.condition("Ready", "False", at(1)),
                2 => b.ready(at(i64::from(restarts % 2))),
                _ => b.ready(at(0)).with(|p| {
                    let conds = p.status.as_mut().unwrap().conditions.as_mut().unwrap();
                    conds[0].last_transition_time = None;
                }),
            };
            b = match created % 3 {
                0 => b.with(|p| p.metadata.creation_timestamp = None),
                c => b.created(at(i64::from(c))),
            };
            match ix % 9 {
                0 => b.build(),
                1 => b.annotation(JOB_COMPLETION_INDEX_ANNOTATION, "x").build(),
                2 => b.label(JOB_COMPLETION_INDEX_ANNOTATION, "1").build(),
                k => b.index(i32::from(k) - 3).build(),
            }
        }

        /// The selection as it was before deletion keys and sorted grouping: a map of per-index
        /// vectors and the Pod comparator at every comparison.
        fn reference<'a>(job: &Job, active: &[&'a Pod], rm_at_least: usize) -> Vec<&'a Pod> {
            let (mut rm, mut left) = if is_indexed(job) {
                let mut rm = Vec::new();
                let mut by_index: BTreeMap<i32, Vec<&'a Pod>> = BTreeMap::new();
                for &p in active {
                    match completion_index(p) {
                        Some(ix) if ix < completions(job).unwrap_or(0) => {
                            by_index.entry(ix).or_default().push(p)
                        }
                        _ => rm.push(p),
                    }
                }
                let mut left = Vec::new();
                for (_, mut group) in by_index {
                    group.sort_by(|a, b| active_pods_order(a, b));
                    left.push(group.pop().unwrap());
                    rm.extend(group);
                }
                (rm, left)
            } else {
                (Vec::new(), active.to_vec())
            };
            if rm.len() < rm_at_least {
                let need = (rm_at_least - rm.len()).min(left.len());
                // Stable, as upstream's insertion sort of a few pods.
                left.sort_by(|a, b| active_pods_order(a, b));
                left.truncate(need);
                rm.extend(left);
            }
            rm
        }

        proptest! {
            /// Comparing keys is comparing pods, ties included.
            #[test]
            fn removal_key_orders_like_the_comparator(a in any::<Shape>(), b in any::<Shape>()) {
                let job = mk_job("j").build();
                let (pa, pb) = (pod(&job, 0, a), pod(&job, 1, b));
                prop_assert_eq!(removal_key(&pa).cmp(&removal_key(&pb)), active_pods_order(&pa, &pb));
            }

            /// Which pods are deleted, and in which order, is exactly what the plain
            /// implementation picks, for Indexed and NonIndexed Jobs.
            #[test]
            fn removal_choice_matches_reference(
                shapes in proptest::collection::vec(any::<Shape>(), 0..40),
                rm_at_least in 0usize..45,
                indexed in any::<bool>(),
            ) {
                let b = mk_job("j").completions(Some(5));
                let job = if indexed { b.indexed().build() } else { b.build() };
                let pods: Vec<Pod> = shapes.iter().enumerate().map(|(n, s)| pod(&job, n, *s)).collect();
                let refs: Vec<&Pod> = pods.iter().collect();
                let names = |v: Vec<&Pod>| v.into_iter().map(|p| name(p).to_string()).collect::<Vec<_>>();
                prop_assert_eq!(
                    names(active_pods_for_removal(&job, &refs, rm_at_least)),
                    names(reference(&job, &refs, rm_at_least))
                );
            }
        }
    }

    #[test]
    fn alike_pods_of_an_indexed_job_are_removed_lowest_index_first() {
        // Listed in name order (index 10 before index 2); alike in every removal criterion.
        let job = mk_job("j").completions(Some(12)).parallelism(3).indexed().build();
        let pods: Vec<Pod> = [("j-10-a", 10), ("j-2-b", 2), ("j-7-c", 7)]
            .into_iter()
            .map(|(n, i)| mk_pod(&job, n).index(i).ready(at(1)).build())
            .collect();
        let refs: Vec<&Pod> = pods.iter().collect();
        let names = |v: Vec<&Pod>| v.into_iter().map(|p| name(p).to_string()).collect::<Vec<_>>();
        assert_eq!(names(active_pods_for_removal(&job, &refs, 1)), ["j-2-b"]);
        assert_eq!(names(active_pods_for_removal(&job, &refs, 2)), ["j-2-b", "j-7-c"]);
        // A NonIndexed Job keeps the input order among alike pods.
        let plain = mk_job("p").completions(Some(3)).parallelism(3).build();
        let pods: Vec<Pod> = ["p-c", "p-a", "p-b"]
            .into_iter()
            .map(|n| mk_pod(&plain, n).ready(at(1)).build())
            .collect();
        let refs: Vec<&Pod> = pods.iter().collect();
        assert_eq!(names(active_pods_for_removal(&plain, &refs, 2)), ["p-c", "p-a"]);
    }
}
