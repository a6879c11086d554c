//! Property tests: random Jobs run for many syncs against a simulated API server and kubelet.
//! Every status written must pass the API server's validation, a pod is never counted twice,
//! creates never exceed parallelism, and a sync never creates and deletes at once.

mod support;

use std::collections::BTreeSet;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kjob_reconcile::testutil::{at, condition_rule, exit_code_rule, mk_job};
use kjob_reconcile::validation::status_update_errors;
use proptest::prelude::*;
use support::World;

/// The knobs a random Job is built from.
#[derive(Debug, Clone)]
struct Spec {
    indexed: bool,
    completions: Option<i32>,
    parallelism: i32,
    backoff_limit: i32,
    per_index: Option<(i32, Option<i32>)>,
    policy: u8,
    replace_failed: bool,
    success_policy: bool,
    deadline: Option<i64>,
    suspend_at: Option<usize>,
    resume_at: Option<usize>,
}

fn spec_strategy() -> impl Strategy<Value = Spec> {
    (
        any::<bool>(),
        prop::option::weighted(0.8, 1..7i32),
        0..5i32,
        0..4i32,
        prop::option::of((0..3i32, prop::option::of(0..3i32))),
        0..4u8,
        any::<bool>(),
        any::<bool>(),
        prop::option::weighted(0.3, 20..200i64),
        prop::option::weighted(0.3, 0..10usize),
        prop::option::of(0..20usize),
    )
        .prop_map(
            |(
                indexed,
                completions,
                parallelism,
                backoff_limit,
                per_index,
                policy,
                replace_failed,
                sp,
                deadline,
                suspend_at,
                resume_at,
            )| {
                let completions =
                    if indexed { Some(completions.unwrap_or(3)) } else { completions };
                Spec {
                    indexed,
                    completions,
                    parallelism,
                    backoff_limit,
                    per_index: per_index.filter(|_| indexed),
                    policy,
                    replace_failed,
                    success_policy: sp && indexed,
                    deadline,
                    suspend_at,
                    resume_at,
                }
            },
        )
}

fn build(spec: &Spec) -> Job {
    let mut b = mk_job("prop")
        .parallelism(spec.parallelism)
        .completions(spec.completions)
        .backoff_limit(spec.backoff_limit);
    if spec.indexed {
        b = b.indexed();
    }
    if let Some((limit, max_failed)) = spec.per_index {
        b = b.backoff_limit_per_index(limit);
        if let Some(m) = max_failed {
            b = b.max_failed_indexes(m.min(spec.completions.unwrap_or(0)));
        }
    }
    let rules = match spec.policy {
        1 => Some(vec![exit_code_rule("FailJob", None, "In", &[3])]),
        2 => Some(vec![
            condition_rule("Ignore", &[("DisruptionTarget", "True")]),
            exit_code_rule("Count", None, "NotIn", &[3]),
        ]),
        3 if spec.per_index.is_some() => Some(vec![exit_code_rule("FailIndex", None, "In", &[3])]),
        _ => None,
    };
    if let Some(rules) = rules {
        // The API server requires restartPolicy Never and defaults podReplacementPolicy=Failed.
        b = b.restart_policy("Never").pod_failure_policy(rules).pod_replacement_policy("Failed");
    } else if spec.replace_failed {
        b = b.pod_replacement_policy("Failed");
    }
    if spec.success_policy {
        b = b.success_policy(&[(Some("0"), None), (None, Some(2))]);
    }
    if let Some(d) = spec.deadline {
        b = b.active_deadline_seconds(d);
    }
    b.build()
}

/// xorshift64*: deterministic kubelet choices from one proptest seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Random kubelet progress: pods start, become ready, succeed or fail (with exit codes and
/// disruption conditions the policies look at); deleting pods terminate.
fn kubelet(w: &mut World, rng: &mut Rng, now: jiff::Timestamp) {
    for p in &mut w.pods {
        let st = p.status.get_or_insert_with(Default::default);
        let phase = st.phase.clone().unwrap_or_default();
        if p.metadata.deletion_timestamp.is_some() {
            if !matches!(phase.as_str(), "Succeeded" | "Failed") && rng.below(2) == 0 {
                st.phase = Some("Failed".into());
                set_exit(st, 137, now);
            }
            continue;
        }
        match (phase.as_str(), rng.below(6)) {
            ("Pending", 0..=2) => st.phase = Some("Running".into()),
            ("Running", 0) => {
                st.conditions = Some(vec![k8s_openapi::api::core::v1::PodCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    last_transition_time: Some(Time(now)),
                    ..Default::default()
                }])
            }
            ("Running", 1 | 2) => {
                st.phase = Some("Succeeded".into());
                st.conditions = None;
                set_exit(st, 0, now);
            }
            ("Running", 3) => {
                st.phase = Some("Failed".into());
                st.conditions = None;
                let code = [1, 3, 137][rng.below(3) as usize];
                set_exit(st, code, now);
                if code == 137 {
                    st.conditions = Some(vec![k8s_openapi::api::core::v1::PodCondition {
                        type_: "DisruptionTarget".into(),
                        status: "True".into(),
                        last_transition_time: Some(Time(now)),
                        ..Default::default()
                    }]);
                }
            }
            _ => {}
        }
    }
}

fn set_exit(st: &mut k8s_openapi::api::core::v1::PodStatus, code: i32, now: jiff::Timestamp) {
    st.container_statuses = Some(vec![k8s_openapi::api::core::v1::ContainerStatus {
        name: "main".into(),
        image: "busybox".into(),
        state: Some(k8s_openapi::api::core::v1::ContainerState {
            terminated: Some(k8s_openapi::api::core::v1::ContainerStateTerminated {
                exit_code: code,
                finished_at: Some(Time(now)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }]);
}

fn is_active(p: &k8s_openapi::api::core::v1::Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && !matches!(
            p.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_jobs_keep_every_invariant(spec in spec_strategy(), seed in any::<u64>(), steps in prop::collection::vec(0..40i64, 30)) {
        let job = build(&spec);
        let parallelism = spec.parallelism;
        let mut w = World::new(job, Vec::new());
        let mut rng = Rng(seed | 1);
        let mut now = at(0);
        let mut counted: BTreeSet<String> = BTreeSet::new();
        let mut ever_succeeded: BTreeSet<String> = BTreeSet::new();
        let mut ever_failed: BTreeSet<String> = BTreeSet::new();
        let mut ever_seen: BTreeSet<String> = BTreeSet::new();
        for (round, dt) in steps.iter().enumerate() {
            now += jiff::SignedDuration::from_secs(*dt);
            if spec.suspend_at == Some(round) {
                w.job.spec.as_mut().unwrap().suspend = Some(true);
            }
            if spec.resume_at == Some(round) {
                w.job.spec.as_mut().unwrap().suspend = Some(false);
            }
            kubelet(&mut w, &mut rng, now);
            for p in &w.pods {
                let uid = p.metadata.uid.clone().unwrap_or_default();
                match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
                    Some("Succeeded") => { ever_succeeded.insert(uid); }
                    Some("Failed") => { ever_failed.insert(uid); }
                    _ if p.metadata.deletion_timestamp.is_some() => { ever_failed.insert(uid); }
                    _ => {}
                }
            }
            // Flaky API: some finalizer patches, deletes, creates and status writes fail.
            w.api = support::Api::default();
            for p in &w.pods {
                let name = p.metadata.name.clone().unwrap_or_default();
                if rng.below(8) == 0 {
                    w.api.fail_finalizer.insert(name.clone());
                }
                if rng.below(8) == 0 {
                    w.api.fail_deletes.insert(name);
                }
            }
            if rng.below(10) == 0 {
                w.api.fail_writes_from = Some(rng.below(3) as usize);
            }
            if rng.below(10) == 0 {
                w.api.fail_creates_from = Some(rng.below(4) as usize);
            }
            // Sometimes the watcher has not yet observed earlier creates/deletes.
            w.satisfied = rng.below(6) != 0;
            let active_before = w.pods.iter().filter(|p| is_active(p)).count();
            let before = w.job.clone();
            let t = w.sync(now);

            // 1. The API server accepts every write, each against the one before it.
            let mut old = before.clone();
            for st in &t.writes {
                let errs = status_update_errors(&old, st);
                prop_assert!(errs.is_empty(), "round {round}: {errs:?}\nspec {spec:?}\nold {:?}\nnew {st:?}", old.status);
                // 2. A UID is never in both lists, and never comes back once counted.
                let u = st.uncounted_terminated_pods.clone().unwrap_or_default();
                let s: BTreeSet<_> = u.succeeded.unwrap_or_default().into_iter().collect();
                let f: BTreeSet<_> = u.failed.unwrap_or_default().into_iter().collect();
                prop_assert!(s.is_disjoint(&f), "UID both succeeded and failed");
                prop_assert!(counted.is_disjoint(&s) && counted.is_disjoint(&f), "round {round}: counted UID is uncounted again: counted {counted:?}\nwrites {:#?}\npods {:#?}", t.writes.iter().map(|w| (&w.uncounted_terminated_pods, w.succeeded, w.failed)).collect::<Vec<_>>(), w.pods.iter().map(|p| (&p.metadata.uid, p.status.as_ref().and_then(|s| s.phase.clone()), &p.metadata.finalizers, &p.metadata.deletion_timestamp)).collect::<Vec<_>>());
                let prev = old.status.clone().unwrap_or_default().uncounted_terminated_pods.unwrap_or_default();
                for uid in prev.succeeded.unwrap_or_default().into_iter().chain(prev.failed.unwrap_or_default()) {
                    if !s.contains(&uid) && !f.contains(&uid) {
                        counted.insert(uid);
                    }
                }
                old.status = Some(st.clone());
            }
            // A pod is counted only once its finalizer is provably gone.
            for p in &w.pods {
                let uid = p.metadata.uid.clone().unwrap_or_default();
                let tracked = p.metadata.finalizers.iter().flatten().any(|f| f == kjob_core::JOB_TRACKING_FINALIZER);
                prop_assert!(!(tracked && counted.contains(&uid)), "round {round}: {uid} counted with its finalizer");
            }
            // 3. Never create and delete in one sync; creates never exceed parallelism.
            let manage_deletes = t.deleted.iter().filter(|(_, patched)| *patched).count();
            prop_assert!(t.created.is_empty() || manage_deletes == 0, "created and deleted in one sync");
            if !t.created.is_empty() {
                prop_assert!(active_before + t.created.len() <= parallelism.max(0) as usize,
                    "round {round}: {} active + {} created > parallelism {parallelism}", active_before, t.created.len());
            }
            // 4. Counters never exceed the pods that actually finished that way.
            let st = w.job.status.clone().unwrap_or_default();
            if !spec.indexed {
                prop_assert!(st.succeeded.unwrap_or(0) as usize <= ever_succeeded.len(), "succeeded over-counted");
            }
            ever_seen.extend(w.pods.iter().filter_map(|p| p.metadata.uid.clone()));
            let total = (st.succeeded.unwrap_or(0) + st.failed.unwrap_or(0)) as usize;
            prop_assert!(total <= ever_seen.len(), "round {round}: {total} counted from {} pods", ever_seen.len());
            prop_assert!(st.failed.unwrap_or(0) as usize <= ever_seen.len() - ever_succeeded.len().min(ever_seen.len()) + ever_failed.len(), "failed over-counted");
            if kjob_reconcile::conditions::is_finished(&w.job) {
                break;
            }
        }
    }
}
