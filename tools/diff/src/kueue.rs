//! What a group of Kueue cases must show on each control plane, beyond each case's own
//! comparison: the Jobs of one ClusterQueue never have more pods at once than its CPUs (each
//! pod asks for one), and they complete in the order they were created; every pod carries its
//! flavor's node labels and tolerations; a Job admitted partially runs within its admission; a
//! Job whose pods are not ready in time is evicted (suspended) by Kueue and then completes.

use std::collections::BTreeMap;
use std::time::Instant;

use serde_json::Value;

use crate::case::{Case, KueueQueue};
use crate::compare::RawRun;
use crate::run::{ACTIVE_MILESTONE, SUSPENDED_MID_RUN};

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
            if let Some(q) = &c.kueue {
                out.extend(check_admission(side, cq, &c.name, q, r));
            }
            let end = at(r, "condition Complete").or_else(|| at(r, "condition Failed"));
            match at(r, "pod 1 created") {
                Some(from) => spans.push((c.name.as_str(), Span { from, to: end })),
                None => out.push(format!("{side}: {cq}: {} never had a pod", c.name)),
            }
            if at(r, "condition Complete").is_none() {
                out.push(format!("{side}: {cq}: {} did not complete", c.name));
            }
        }
        let priority = |c: &Case| c.kueue.as_ref().and_then(|q| q.priority);
        if members.iter().any(|m| priority(m.1).is_some()) {
            out.extend(check_preemption(side, cq, &members, &spans, at));
            continue;
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

/// A group whose Jobs have priorities, in a queue that preempts lower priority: a Job that had
/// pods when a higher one's first pod appeared was suspended meanwhile (its Suspended condition
/// seen after it had pods), and the Jobs complete highest priority first (creation order among equals).
fn check_preemption(
    side: &str,
    cq: &str,
    members: &[(u32, &Case, &RawRun)],
    spans: &[(&str, Span)],
    at: impl Fn(&RawRun, &str) -> Option<Instant>,
) -> Vec<String> {
    let mut out = Vec::new();
    let priority = |c: &Case| c.kueue.as_ref().and_then(|q| q.priority).unwrap_or(0);
    let span = |name: &str| spans.iter().find(|(n, _)| *n == name).map(|(_, s)| *s);
    for (_, low, low_run) in members {
        for (_, high, _) in members.iter().filter(|m| priority(m.1) > priority(low)) {
            let (Some(l), Some(h)) = (span(&low.name), span(&high.name)) else { continue };
            let overlapped = l.from <= h.from && l.to.is_none_or(|t| t > h.from);
            if overlapped && at(low_run, SUSPENDED_MID_RUN).is_none() {
                out.push(format!(
                    "{side}: {cq}: {} ran when {} (higher priority) got its first pod, and was never suspended",
                    low.name, high.name
                ));
            }
        }
    }
    let mut expected: Vec<&(u32, &Case, &RawRun)> = members.iter().collect();
    expected.sort_by_key(|m| (std::cmp::Reverse(priority(m.1)), m.0));
    let expected: Vec<&str> = expected.iter().map(|m| m.1.name.as_str()).collect();
    let mut by_end: Vec<(&str, Option<Instant>)> = spans.iter().map(|(n, s)| (*n, s.to)).collect();
    by_end.sort_by_key(|(_, t)| *t);
    let ended: Vec<&str> = by_end.iter().map(|(n, _)| *n).collect();
    if ended != expected {
        out.push(format!(
            "{side}: {cq}: completed in the order {ended:?}, by priority {expected:?}"
        ));
    }
    out
}

/// What Kueue's admission must have left on one case's run: every pod carries the flavor's
/// node labels in its `nodeSelector` and the flavor's tolerations; a Job admitted partially
/// never had more pods in parallel than the queue's CPUs, and had at least its minimum.
fn check_admission(side: &str, cq: &str, name: &str, q: &KueueQueue, r: &RawRun) -> Vec<String> {
    let mut out = Vec::new();
    for p in &r.pods {
        let spec = &p.first["spec"];
        let pod = p.first["metadata"]["name"].as_str().unwrap_or("?");
        for (k, v) in &q.flavor_node_labels {
            if spec["nodeSelector"][k].as_str() != Some(v.as_str()) {
                out.push(format!(
                    "{side}: {cq}: {name}'s pod {pod} lacks the flavor's nodeSelector {k}={v}: {}",
                    spec["nodeSelector"]
                ));
            }
        }
        let tolerations = spec["tolerations"].as_array().cloned().unwrap_or_default();
        for t in &q.flavor_tolerations {
            let same =
                |o: &Value| ["key", "operator", "value", "effect"].iter().all(|f| o[f] == t[f]);
            if !tolerations.iter().any(same) {
                out.push(format!(
                    "{side}: {cq}: {name}'s pod {pod} lacks the flavor's toleration {t}"
                ));
            }
        }
    }
    if q.pods_ready_eviction && !r.milestones.contains_key(SUSPENDED_MID_RUN) {
        out.push(format!(
            "{side}: {cq}: {name}'s pods were never ready, yet Kueue's waitForPodsReady timeout \
             never suspended it"
        ));
    }
    if let Some(min) = q.min_parallelism {
        let most = r
            .milestones
            .keys()
            .filter_map(|k| k.strip_prefix(ACTIVE_MILESTONE)?.parse::<u32>().ok())
            .max()
            .unwrap_or(0);
        if most > q.cpus || most < min {
            out.push(format!(
                "{side}: {cq}: {name} had up to {most} pods in parallel; admitted partially it \
                 should have between {min} and the queue's {} CPUs",
                q.cpus
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn case(i: u32) -> Case {
        let mut c: Case = serde_yaml::from_str(&format!("name: kueue-quota-{i}")).unwrap();
        c.kueue = Some(KueueQueue {
            cluster_queue: "cq".into(),
            cpus: 2,
            position: i,
            ..Default::default()
        });
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

    fn pod(node_selector: Value, tolerations: Value) -> crate::kubelet::PodRecord {
        let p = serde_json::json!({"metadata": {"name": "job-x"},
            "spec": {"nodeSelector": node_selector, "tolerations": tolerations}});
        crate::kubelet::PodRecord {
            first: p.clone(),
            last: p,
            gone: false,
            disrupted_by_script: false,
        }
    }

    #[test]
    fn pods_must_carry_the_flavor_and_partial_admission_bounds_parallelism() {
        let q = KueueQueue {
            cluster_queue: "cq".into(),
            cpus: 2,
            flavor_node_labels: [("pool".to_string(), "a".to_string())].into(),
            flavor_tolerations: vec![
                serde_json::json!({"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}),
            ],
            min_parallelism: Some(2),
            ..Default::default()
        };
        let toleration =
            serde_json::json!([{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]);
        let mut good = RawRun {
            pods: vec![pod(serde_json::json!({"pool": "a"}), toleration.clone())],
            milestones: [("active 1".to_string(), 1.0), ("active 2".to_string(), 1.5)].into(),
            ..RawRun::default()
        };
        assert_eq!(check_admission("kjob", "cq", "j", &q, &good), Vec::<String>::new());
        // A pod without the label or the toleration; four pods at once in a queue of two.
        good.pods.push(pod(serde_json::json!({}), serde_json::json!([])));
        good.milestones.insert("active 4".into(), 2.0);
        let v = check_admission("kjob", "cq", "j", &q, &good);
        assert_eq!(v.len(), 3, "{v:?}");
        assert!(v[0].contains("lacks the flavor's nodeSelector pool=a"), "{v:?}");
        assert!(v[1].contains("lacks the flavor's toleration"), "{v:?}");
        assert!(v[2].contains("up to 4 pods in parallel"), "{v:?}");
        // Never more than one pod: the partial admission was not used.
        let one =
            RawRun { milestones: [("active 1".to_string(), 1.0)].into(), ..RawRun::default() };
        assert_eq!(check_admission("kjob", "cq", "j", &q, &one).len(), 1);
    }

    #[test]
    fn preemption_groups_check_suspension_and_priority_order() {
        let t0 = Instant::now();
        let member = |name: &str, position: u32, priority: i32| {
            let mut c: Case = serde_yaml::from_str(&format!("name: {name}")).unwrap();
            c.kueue = Some(KueueQueue {
                cluster_queue: "cq".into(),
                cpus: 1,
                position,
                priority: Some(priority),
                ..Default::default()
            });
            c
        };
        let cases = [member("low", 0, 10), member("high", 2, 1000)];
        // Low runs from 0.2 s, high arrives at 3 s, gets its pod at 3.5 s, completes at 6 s;
        // low completes at 30 s.
        let mut low = run(t0, 0.0, 0.2, 30.0);
        let high = run(t0, 3.0, 3.5, 6.0);
        let refs = [&low, &high];
        let v = check_groups("kjob", &cases, &refs);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("low ran when high (higher priority) got its first pod"), "{v:?}");
        // Created suspended (as Kueue creates Jobs) is not preempted.
        low.milestones.insert("condition Suspended".into(), 0.0);
        let refs = [&low, &high];
        assert_eq!(check_groups("kjob", &cases, &refs).len(), 1);
        low.milestones.insert(SUSPENDED_MID_RUN.into(), 3.2);
        let refs = [&low, &high];
        assert_eq!(check_groups("kjob", &cases, &refs), Vec::<String>::new());
        // The low Job completing first is out of priority order.
        let early = run(t0, 0.0, 0.2, 5.0);
        let refs = [&early, &high];
        let v = check_groups("kjob", &cases, &refs);
        assert!(v.iter().any(|m| m.contains("by priority [\"high\", \"low\"]")), "{v:?}");
    }

    #[test]
    fn a_job_waiting_for_ready_pods_must_have_been_suspended() {
        let t0 = Instant::now();
        let mut c: Case = serde_yaml::from_str("name: waits").unwrap();
        c.kueue = Some(KueueQueue {
            cluster_queue: "cq".into(),
            cpus: 1,
            pods_ready_eviction: true,
            ..Default::default()
        });
        let cases = [c];
        let mut r = run(t0, 0.0, 0.2, 25.0);
        let v = check_groups("upstream", &cases, &[&r]);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("never suspended it"), "{v:?}");
        r.milestones.insert(SUSPENDED_MID_RUN.into(), 20.5);
        assert_eq!(check_groups("upstream", &cases, &[&r]), Vec::<String>::new());
    }
}
