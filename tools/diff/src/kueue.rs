//! What a group of Kueue cases must show on each control plane, beyond each case's own
//! comparison: the Jobs of one ClusterQueue never have more pods at once than its CPUs (each
//! pod asks for one), and they complete in the order they were created.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::case::Case;
use crate::compare::RawRun;

/// When a Job had pods: from its first pod seen to its Complete (or Failed) condition seen,
/// on one clock.
#[derive(Debug, Clone, Copy)]
struct Span {
    from: Instant,
    to: Option<Instant>,
}

/// The violations of one run of the groups in `cases` (`raws[i]` is case `i`'s run), each a
/// sentence; empty when every group held its quota and completed in creation order.
pub fn check_groups(side: &str, cases: &[Case], raws: &[&RawRun]) -> Vec<String> {
    let mut groups: BTreeMap<&str, Vec<(u32, &Case, &RawRun)>> = BTreeMap::new();
    for (c, r) in cases.iter().zip(raws) {
        if let Some(q) = &c.kueue {
            groups.entry(q.cluster_queue.as_str()).or_default().push((q.position, c, r));
        }
    }
    let mut out = Vec::new();
    for (cq, mut members) in groups {
        members.sort_by_key(|m| m.0);
        let cpus = members[0].1.kueue.as_ref().map_or(0, |q| q.cpus) as usize;
        let at = |r: &RawRun, key: &str| {
            let s = r.started?;
            r.milestones.get(key).map(|secs| s + std::time::Duration::from_secs_f64(*secs))
        };
        let mut spans = Vec::new();
        for (_, c, r) in &members {
            let end = at(r, "condition Complete").or_else(|| at(r, "condition Failed"));
            match at(r, "pod 1 created") {
                Some(from) => spans.push((c.name.as_str(), Span { from, to: end })),
                None => out.push(format!("{side}: {cq}: {} never had a pod", c.name)),
            }
            if at(r, "condition Complete").is_none() {
                out.push(format!("{side}: {cq}: {} did not complete", c.name));
            }
        }
        // Most Jobs with pods at once: at each span's start, count the spans open then.
        for (name, s) in &spans {
            let open = spans
                .iter()
                .filter(|(_, o)| o.from <= s.from && o.to.is_none_or(|t| t > s.from))
                .count();
            if open > cpus {
                out.push(format!(
                    "{side}: {cq}: {open} Jobs had pods when {name}'s first pod appeared, over the {cpus} CPUs of the queue"
                ));
            }
        }
        let mut by_end: Vec<(&str, Option<Instant>)> =
            spans.iter().map(|(n, s)| (*n, s.to)).collect();
        by_end.sort_by_key(|(_, t)| *t);
        let ended: Vec<&str> = by_end.iter().map(|(n, _)| *n).collect();
        let created: Vec<&str> = members.iter().map(|m| m.1.name.as_str()).collect();
        if ended != created {
            out.push(format!(
                "{side}: {cq}: completed in the order {ended:?}, created in the order {created:?}"
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::case::KueueQueue;

    fn case(i: u32) -> Case {
        let mut c: Case = serde_yaml::from_str(&format!("name: kueue-quota-{i}")).unwrap();
        c.kueue = Some(KueueQueue { cluster_queue: "cq".into(), cpus: 2, position: i });
        c
    }

    /// A Job created `created` s after t0, first pod at `pod` s, Complete at `done` s.
    fn run(t0: Instant, created: f64, pod: f64, done: f64) -> RawRun {
        RawRun {
            started: Some(t0 + Duration::from_secs_f64(created)),
            milestones: [
                ("pod 1 created".to_string(), pod - created),
                ("condition Complete".to_string(), done - created),
            ]
            .into(),
            ..RawRun::default()
        }
    }

    #[test]
    fn a_group_within_quota_and_in_order_holds() {
        let t0 = Instant::now();
        let cases: Vec<Case> = (0..4).map(case).collect();
        let runs = [
            run(t0, 0.0, 0.2, 6.5),
            run(t0, 1.5, 1.7, 8.0),
            run(t0, 3.0, 6.6, 13.0),
            run(t0, 4.5, 8.1, 14.5),
        ];
        let refs: Vec<&RawRun> = runs.iter().collect();
        assert_eq!(check_groups("kjob", &cases, &refs), Vec::<String>::new());
    }

    #[test]
    fn a_third_job_with_pods_and_an_overtaking_job_are_violations() {
        let t0 = Instant::now();
        let cases: Vec<Case> = (0..4).map(case).collect();
        // The third Job's pod appears while the first two still run; the fourth completes
        // before the third.
        let runs = [
            run(t0, 0.0, 0.2, 6.5),
            run(t0, 1.5, 1.7, 8.0),
            run(t0, 3.0, 3.2, 13.0),
            run(t0, 4.5, 8.1, 12.0),
        ];
        let refs: Vec<&RawRun> = runs.iter().collect();
        let v = check_groups("kjob", &cases, &refs);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v[0].contains("3 Jobs had pods when kueue-quota-2's first pod appeared"), "{v:?}");
        assert!(v[1].contains("completed in the order"), "{v:?}");
    }
}
