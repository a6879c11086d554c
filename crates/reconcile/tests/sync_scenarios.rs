//! Multi-sync scenarios: deadlines, pod failure policy, per-index backoff, success policy,
//! pod-failure backoff and the finalizer-tracking protocol (upstream `TestSyncJobPastDeadline`,
//! `TestSyncJobWithJobPodFailurePolicy`, `TestSyncJobWithJobBackoffLimitPerIndex`,
//! `TestSyncJobWithJobSuccessPolicy`, `TestTrackJobStatusAndRemoveFinalizers`, re-derived).

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{Job, JobStatus};
use k8s_openapi::api::core::v1::Pod;
use kjob_core::{JOB_INDEX_FAILURE_COUNT_ANNOTATION, JOB_TRACKING_FINALIZER};
use kjob_reconcile::testutil::{at, condition_rule, exit_code_rule, mk_job, mk_pod, sync_input};
use kjob_reconcile::validation::status_update_errors;
use kjob_reconcile::{BackoffRecord, BackoffUpdate, Expectations, JobSync, SyncError, SyncInput};
use support::{Api, Env, World, run};

fn conds(st: &JobStatus) -> Vec<String> {
    st.conditions
        .iter()
        .flatten()
        .map(|c| format!("{}={}", c.type_, c.reason.as_deref().unwrap_or("")))
        .collect()
}

fn message_of(st: &JobStatus, type_: &str) -> String {
    st.conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == type_)
        .and_then(|c| c.message.clone())
        .unwrap_or_default()
}

/// Checks every write of a trace against the API server's rules, advancing `job`.
fn assert_valid(world_job: &k8s_openapi::api::batch::v1::Job, t: &support::Trace) {
    let mut job = world_job.clone();
    for w in &t.writes {
        let errs = status_update_errors(&job, w);
        assert!(errs.is_empty(), "invalid write {errs:?}\n{w:?}");
        job.status = Some(w.clone());
    }
}

fn sync_valid(w: &mut World, now: jiff::Timestamp) -> support::Trace {
    let before = w.job.clone();
    let t = w.sync(now);
    assert_valid(&before, &t);
    t
}

#[test]
fn past_deadline_fails_in_two_steps() {
    let job = mk_job("dl")
        .parallelism(2)
        .completions(Some(4))
        .active_deadline_seconds(10)
        .start_time(at(0))
        .build();
    let pods = vec![mk_pod(&job, "a").ready(at(1)).build(), mk_pod(&job, "b").build()];
    let mut w = World::new(job, pods);
    let t = sync_valid(&mut w, at(15));
    assert_eq!(
        t.kinds,
        vec!["delete", "status", "expectations", "remove-finalizers", "status", "done"]
    );
    let st = t.last_status().unwrap();
    assert_eq!(conds(st), vec!["FailureTarget=DeadlineExceeded"]);
    assert_eq!(message_of(st, "FailureTarget"), "Job was active longer than specified deadline");
    // Deleted pods kept their finalizer until counted: both are failures now.
    assert_eq!(
        (st.active, st.ready, st.terminating, st.failed),
        (Some(0), Some(0), Some(2), Some(2))
    );
    assert!(!t.outcome.finished);
    assert!(w.pods.is_empty(), "pods are gone once their finalizers are removed");
    let t = sync_valid(&mut w, at(16));
    let st = t.last_status().unwrap();
    assert_eq!(conds(st), vec!["FailureTarget=DeadlineExceeded", "Failed=DeadlineExceeded"]);
    assert_eq!(st.terminating, Some(0));
    assert_eq!(t.events(), vec!["DeadlineExceeded: Job was active longer than specified deadline"]);
    assert!(t.outcome.finished);
    let m = t.outcome.metrics.unwrap();
    assert_eq!(m.job_finished.unwrap().reason, "DeadlineExceeded");
}

#[test]
fn deadline_requeues_after_time_left_and_never_fires_while_suspended() {
    let job = mk_job("dl").active_deadline_seconds(10).start_time(at(0)).active(1, 0, 0).build();
    let pods = vec![mk_pod(&job, "a").build()];
    let t = run(&job, &pods, &Env::at(at(4)), &Api::default());
    assert_eq!(t.outcome.requeue_after, Some(Duration::from_secs(6)));
    assert!(t.writes.is_empty());

    // A job that starts now is re-armed for the full deadline.
    let fresh = mk_job("dl2").active_deadline_seconds(30).build();
    let t = run(&fresh, &[], &Env::at(at(100)), &Api::default());
    assert_eq!(t.outcome.requeue_after, Some(Duration::from_secs(30)));

    let suspended = mk_job("dl3")
        .active_deadline_seconds(10)
        .suspend(true)
        .condition("Suspended", "True", "JobSuspended", "Job suspended", at(0))
        .build();
    let t = run(&suspended, &[], &Env::at(at(500)), &Api::default());
    assert_eq!(t.outcome.requeue_after, None);
    assert!(t.writes.iter().all(|w| conds(w).iter().all(|c| !c.starts_with("FailureTarget"))));
}

#[test]
fn pod_failure_policy_fail_job() {
    let job = mk_job("pfp")
        .parallelism(2)
        .completions(Some(2))
        .restart_policy("Never")
        .pod_failure_policy(vec![exit_code_rule("FailJob", None, "In", &[5])])
        .pod_replacement_policy("Failed")
        .start_time(at(0))
        .build();
    let pods = vec![mk_pod(&job, "bad").failed(5, at(10)).build(), mk_pod(&job, "ok").build()];
    let mut w = World::new(job, pods);
    let t = sync_valid(&mut w, at(20));
    let st = t.last_status().unwrap();
    assert_eq!(conds(st), vec!["FailureTarget=PodFailurePolicy"]);
    assert_eq!(
        message_of(st, "FailureTarget"),
        "Container main for pod default/bad failed with exit code 5 matching FailJob rule at index 0"
    );
    assert_eq!(st.failed, Some(2));
    assert_eq!(
        t.outcome.metrics.as_ref().unwrap().pod_failures_by_policy_action.get("FailJob"),
        Some(&1)
    );
    let t = sync_valid(&mut w, at(21));
    let st = t.last_status().unwrap();
    assert_eq!(conds(st), vec!["FailureTarget=PodFailurePolicy", "Failed=PodFailurePolicy"]);
    assert_eq!(t.outcome.events[0].reason, "PodFailurePolicy");
}

#[test]
fn pod_failure_policy_ignore_and_count() {
    let rules = vec![
        condition_rule("Ignore", &[("DisruptionTarget", "True")]),
        exit_code_rule("Count", None, "In", &[1]),
    ];
    let job = mk_job("ign")
        .parallelism(1)
        .completions(Some(1))
        .backoff_limit(0)
        .restart_policy("Never")
        .pod_failure_policy(rules)
        .pod_replacement_policy("Failed")
        .start_time(at(0))
        .build();
    let evicted = mk_pod(&job, "evicted")
        .failed(137, at(10))
        .condition("DisruptionTarget", "True", at(9))
        .build();
    let mut w = World::new(job.clone(), vec![evicted]);
    let t = sync_valid(&mut w, at(100));
    let st = t.last_status().unwrap();
    assert_eq!(st.failed.unwrap_or(0), 0, "ignored failures are not counted");
    assert_eq!(t.created.len(), 1, "the evicted pod is replaced");
    assert!(conds(st).is_empty());
    assert_eq!(
        t.outcome.metrics.as_ref().unwrap().pod_failures_by_policy_action.get("Ignore"),
        Some(&1)
    );

    // Exit code 1 matches Count: backoffLimit 0 is exceeded.
    let crashed = mk_pod(&job, "crashed").failed(1, at(10)).build();
    let mut w = World::new(job, vec![crashed]);
    let t = sync_valid(&mut w, at(100));
    let st = t.last_status().unwrap();
    assert_eq!(
        conds(st),
        vec!["FailureTarget=BackoffLimitExceeded", "Failed=BackoffLimitExceeded"]
    );
    assert_eq!(st.failed, Some(1));
}

#[test]
fn ignored_failure_still_delays_recreation() {
    let job = mk_job("ign")
        .restart_policy("Never")
        .pod_failure_policy(vec![condition_rule("Ignore", &[("DisruptionTarget", "True")])])
        .pod_replacement_policy("Failed")
        .start_time(at(0))
        .build();
    let evicted = mk_pod(&job, "evicted")
        .failed(137, at(98))
        .condition("DisruptionTarget", "True", at(97))
        .build();
    let t = run(&job, &[evicted], &Env::at(at(100)), &Api::default());
    assert!(t.created.is_empty());
    assert_eq!(t.outcome.requeue_after, Some(Duration::from_secs(8)));
    assert_eq!(
        t.outcome.backoff,
        BackoffUpdate::Put(BackoffRecord {
            failures_after_last_success: 1,
            last_failure_time: Some(at(98))
        })
    );
}

#[test]
fn a_backoff_record_is_written_only_when_it_changes() {
    let job = mk_job("rec").parallelism(2).completions(Some(4)).start_time(at(0)).build();
    let done = |name: &str| mk_pod(&job, name).succeeded(at(50)).build();
    // Only successes, no record yet: the record would be the default, which absent reads as.
    let t = run(&job, &[done("a"), done("b")], &Env::at(at(100)), &Api::default());
    assert!(t.last_status().is_some(), "the successes are counted");
    assert_eq!(t.outcome.backoff, BackoffUpdate::Keep);
    // A success after recorded failures resets the record: that is written.
    let mut env = Env::at(at(100));
    env.backoff =
        Some(BackoffRecord { failures_after_last_success: 2, last_failure_time: Some(at(40)) });
    let t = run(&job, &[done("c")], &env, &Api::default());
    assert_eq!(t.outcome.backoff, BackoffUpdate::Put(BackoffRecord::default()));
}

#[test]
fn global_backoff_from_persisted_record() {
    let job = mk_job("bo").parallelism(1).completions(Some(3)).start_time(at(0)).build();
    let mut env = Env::at(at(100));
    // Three failures so far, the last at 90: the delay is 40 s, so 30 s are left.
    env.backoff =
        Some(BackoffRecord { failures_after_last_success: 3, last_failure_time: Some(at(90)) });
    let t = run(&job, &[], &env, &Api::default());
    assert!(t.created.is_empty());
    assert_eq!(t.outcome.requeue_after, Some(Duration::from_secs(30)));
    // Active stays what it is (0 here) and the sync still reports its action.
    assert_eq!(t.outcome.metrics.unwrap().action, "pods_created");
    env.now = at(131);
    let t = run(&job, &[], &env, &Api::default());
    assert_eq!(t.created.len(), 1);
}

#[test]
fn backoff_limit_per_index_replaces_then_fails_the_index() {
    let job = mk_job("bpi")
        .indexed()
        .completions(Some(3))
        .parallelism(3)
        .backoff_limit_per_index(1)
        .start_time(at(0))
        .build();
    let pods = vec![
        mk_pod(&job, "bpi-0-a").index(0).failure_counts(0, None).failed(1, at(10)).build(),
        mk_pod(&job, "bpi-1-a").index(1).build(),
        mk_pod(&job, "bpi-2-a").index(2).build(),
    ];
    let mut w = World::new(job, pods);
    let t = sync_valid(&mut w, at(100));
    // Index 0 gets a replacement carrying the failure count; the failed pod keeps its finalizer
    // until then.
    assert_eq!(t.created.len(), 1);
    let replacement = &t.created[0].1;
    assert_eq!(
        replacement.metadata.annotations.as_ref().unwrap()[JOB_INDEX_FAILURE_COUNT_ANNOTATION],
        "1"
    );
    assert!(t.finalizers_removed.is_empty());
    assert_eq!(t.last_status().unwrap().failed_indexes.as_deref(), Some(""));
    // Next sync: the index is active again, so the old failed pod is counted and released.
    let t = sync_valid(&mut w, at(101));
    assert_eq!(t.finalizers_removed, vec!["bpi-0-a"]);
    assert_eq!(t.last_status().unwrap().failed, Some(1));
    // The replacement fails too: its count (1) reaches the limit, the index fails for good.
    // The replacement (named by generateName `bpi-0-`) fails as well.
    let name = w
        .pods
        .iter()
        .find(|p| {
            p.metadata.name.as_deref() != Some("bpi-0-a")
                && p.metadata.name.as_deref().unwrap().starts_with("bpi-0-")
        })
        .and_then(|p| p.metadata.name.clone())
        .expect("replacement of index 0");
    {
        let p = w.pod_mut(&name);
        let st = p.status.get_or_insert_with(Default::default);
        st.phase = Some("Failed".into());
    }
    let t = sync_valid(&mut w, at(200));
    let st = t.last_status().unwrap();
    assert_eq!(st.failed_indexes.as_deref(), Some("0"));
    assert_eq!(st.failed, Some(2));
    assert!(t.created.is_empty(), "a failed index is never retried");
    assert!(conds(st).is_empty());
    // The other indexes succeed: every index is finished with one failed ⇒ FailedIndexes.
    for p in &mut w.pods {
        if p.metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|x| x == JOB_TRACKING_FINALIZER))
        {
            p.status.get_or_insert_with(Default::default).phase = Some("Succeeded".into());
        }
    }
    let t = sync_valid(&mut w, at(300));
    let st = t.last_status().unwrap();
    assert_eq!(st.completed_indexes.as_deref(), Some("1,2"));
    assert_eq!(conds(st), vec!["FailureTarget=FailedIndexes", "Failed=FailedIndexes"]);
    assert_eq!(message_of(st, "Failed"), "Job has failed indexes");
    assert_eq!(t.outcome.metrics.as_ref().unwrap().finished_indexes_succeeded, 2);
}

#[test]
fn max_failed_indexes_exceeded_and_fail_index_rule() {
    let job = mk_job("mfi")
        .indexed()
        .completions(Some(4))
        .parallelism(4)
        .backoff_limit_per_index(3)
        .max_failed_indexes(0)
        .restart_policy("Never")
        .pod_failure_policy(vec![exit_code_rule("FailIndex", None, "In", &[42])])
        .pod_replacement_policy("Failed")
        .start_time(at(0))
        .build();
    let pods = vec![
        mk_pod(&job, "mfi-0").index(0).failed(42, at(10)).build(),
        mk_pod(&job, "mfi-1").index(1).build(),
    ];
    let mut w = World::new(job, pods);
    let t = sync_valid(&mut w, at(100));
    let st = t.last_status().unwrap();
    assert_eq!(st.failed_indexes.as_deref(), Some("0"));
    assert_eq!(conds(st), vec!["FailureTarget=MaxFailedIndexesExceeded"]);
    assert_eq!(
        message_of(st, "FailureTarget"),
        "Job has exceeded the specified maximal number of failed indexes"
    );
    assert_eq!(
        t.outcome.metrics.as_ref().unwrap().pod_failures_by_policy_action.get("FailIndex"),
        Some(&1)
    );
    let t = sync_valid(&mut w, at(101));
    assert_eq!(conds(t.last_status().unwrap()).last().unwrap(), "Failed=MaxFailedIndexesExceeded");
}

#[test]
fn success_policy_completes_and_does_not_count_the_rest_as_failed() {
    let job = mk_job("sp")
        .indexed()
        .completions(Some(3))
        .parallelism(3)
        .success_policy(&[(Some("0"), None)])
        .start_time(at(0))
        .build();
    let pods = vec![
        mk_pod(&job, "sp-0").index(0).succeeded(at(10)).build(),
        mk_pod(&job, "sp-1").index(1).build(),
        mk_pod(&job, "sp-2").index(2).build(),
    ];
    let mut w = World::new(job, pods);
    let t = sync_valid(&mut w, at(20));
    let st = t.last_status().unwrap();
    assert_eq!(conds(st), vec!["SuccessCriteriaMet=SuccessPolicy"]);
    assert_eq!(message_of(st, "SuccessCriteriaMet"), "Matched rules at index 0");
    assert_eq!((st.succeeded, st.failed.unwrap_or(0), st.terminating), (Some(1), 0, Some(2)));
    assert_eq!(st.completed_indexes.as_deref(), Some("0"));
    let t = sync_valid(&mut w, at(21));
    let st = t.last_status().unwrap();
    assert_eq!(conds(st), vec!["SuccessCriteriaMet=SuccessPolicy", "Complete=SuccessPolicy"]);
    assert_eq!(st.completion_time.as_ref().unwrap().0, at(21));
    assert_eq!(t.events(), vec!["Completed: Job completed"]);
    let m = t.outcome.metrics.unwrap();
    assert_eq!(m.job_finished.unwrap().reason, "SuccessPolicy");
}

#[test]
fn suspend_then_resume() {
    let job = mk_job("sr")
        .parallelism(2)
        .completions(Some(2))
        .active_deadline_seconds(100)
        .start_time(at(0))
        .build();
    let pods = vec![mk_pod(&job, "a").ready(at(1)).build(), mk_pod(&job, "b").build()];
    let mut w = World::new(job, pods);
    w.job.spec.as_mut().unwrap().suspend = Some(true);
    let t = sync_valid(&mut w, at(10));
    let st = t.last_status().unwrap();
    assert_eq!(conds(st), vec!["Suspended=JobSuspended"]);
    assert!(st.start_time.is_none(), "start time cleared on suspend");
    assert_eq!((st.active, st.ready, st.terminating), (Some(0), Some(0), Some(2)));
    // Not-ready pods go first.
    assert_eq!(t.deleted, vec![("b".to_string(), true), ("a".to_string(), true)]);
    assert_eq!(t.expectations[0], Expectations::Set { add: 0, del: 2 });
    // Suspended pods are not failures: their finalizer went before the delete.
    assert_eq!(st.failed.unwrap_or(0), 0);
    w.job.spec.as_mut().unwrap().suspend = Some(false);
    let t = sync_valid(&mut w, at(500));
    let st = t.last_status().unwrap();
    assert_eq!(conds(st), vec!["Suspended=JobResumed"]);
    assert_eq!(st.start_time.as_ref().unwrap().0, at(500));
    assert_eq!(t.created.len(), 2);
    assert!(t.events().contains(&"Resumed: Job resumed".to_string()));
    assert_eq!(
        t.outcome.requeue_after,
        Some(Duration::from_secs(100)),
        "deadline measured from resume"
    );
}

#[test]
fn uncounted_list_is_capped_at_500_per_sync() {
    let job = mk_job("big").parallelism(0).completions(Some(1000)).start_time(at(0)).build();
    let pods: Vec<_> =
        (0..600).map(|i| mk_pod(&job, &format!("s{i}")).succeeded(at(1)).build()).collect();
    let mut w = World::new(job, pods);
    let t = sync_valid(&mut w, at(10));
    assert_eq!(
        t.writes[0].uncounted_terminated_pods.as_ref().unwrap().succeeded.as_ref().unwrap().len(),
        500
    );
    assert_eq!(t.finalizers_removed.len(), 500);
    assert_eq!(t.last_status().unwrap().succeeded, Some(500));
    let t = sync_valid(&mut w, at(11));
    assert_eq!(t.finalizers_removed.len(), 100);
    assert_eq!(t.last_status().unwrap().succeeded, Some(600));
}

#[test]
fn failed_finalizer_removal_saves_partial_progress_and_errors() {
    let job = mk_job("fr").parallelism(0).completions(Some(5)).start_time(at(0)).build();
    let pods: Vec<_> =
        (0..3).map(|i| mk_pod(&job, &format!("s{i}")).succeeded(at(1)).build()).collect();
    let api = Api { fail_finalizer: ["s1".to_string()].into(), ..Default::default() };
    let t = run(&job, &pods, &Env::at(at(10)), &api);
    assert_eq!(
        t.kinds,
        vec!["status", "expectations", "remove-finalizers", "expectations", "status", "done"]
    );
    assert_eq!(
        t.expectations[1],
        Expectations::FinalizerRemovalsFailed { pod_uids: vec!["s1-uid".into()] }
    );
    let st = t.last_status().unwrap();
    assert_eq!(st.succeeded, Some(2));
    assert_eq!(
        st.uncounted_terminated_pods.as_ref().unwrap().succeeded,
        Some(vec!["s1-uid".to_string()])
    );
    assert!(matches!(t.outcome.error, Some(SyncError::RemoveFinalizers(_))));
}

#[test]
fn first_write_failure_stops_before_any_finalizer_goes() {
    let job = mk_job("w1").parallelism(0).completions(Some(5)).start_time(at(0)).build();
    let pods = vec![mk_pod(&job, "s0").succeeded(at(1)).build()];
    let api = Api { fail_writes_from: Some(0), ..Default::default() };
    let t = run(&job, &pods, &Env::at(at(10)), &api);
    assert!(t.finalizers_removed.is_empty());
    assert!(matches!(t.outcome.error, Some(SyncError::StatusUpdate(_))));
    assert_eq!(
        t.outcome.backoff,
        BackoffUpdate::Keep,
        "record persisted only after a successful write"
    );
    assert!(t.outcome.status_written.is_none());
}

#[test]
fn in_flight_removals_are_skipped_and_vanished_uncounted_pods_are_counted() {
    let job = mk_job("inf")
        .parallelism(0)
        .completions(Some(5))
        .start_time(at(0))
        .uncounted(&["gone-uid"], &[])
        .build();
    let pods = vec![mk_pod(&job, "s0").succeeded(at(1)).build()];
    let mut env = Env::at(at(10));
    env.in_flight.insert("s0-uid".into());
    let t = run(&job, &pods, &env, &Api::default());
    assert!(t.finalizers_removed.is_empty(), "a removal in flight is not repeated");
    let st = t.last_status().unwrap();
    assert_eq!(st.succeeded, Some(1), "the vanished pod's UID moved into the counter");
    assert_eq!(st.uncounted_terminated_pods.as_ref().unwrap().succeeded, None);
}

#[test]
fn job_being_deleted_releases_every_pod_without_counting_running_ones() {
    let job = mk_job("gone")
        .parallelism(2)
        .completions(Some(4))
        .start_time(at(0))
        .deleting(at(5))
        .build();
    let pods = vec![mk_pod(&job, "r").build(), mk_pod(&job, "f").failed(1, at(3)).build()];
    let t = run(&job, &pods, &Env::at(at(10)), &Api::default());
    assert_eq!(t.finalizers_removed, vec!["r", "f"]);
    assert!(t.created.is_empty() && t.deleted.is_empty());
    let st = t.last_status().unwrap();
    assert_eq!(st.failed, Some(1));
}

#[test]
fn finishing_waits_for_satisfied_expectations() {
    let job = mk_job("ex").backoff_limit(0).start_time(at(0)).build();
    let pods = vec![mk_pod(&job, "f").failed(1, at(3)).build()];
    let mut env = Env::at(at(10));
    env.satisfied = false;
    let t = run(&job, &pods, &env, &Api::default());
    let st = t.last_status().unwrap();
    assert!(conds(st).is_empty(), "no verdict while pods may be unseen: {:?}", conds(st));
    assert_eq!(st.failed, Some(1));
}

#[test]
fn failed_create_event_carries_the_error() {
    let job = mk_job("fc").build();
    let api = Api { fail_creates_from: Some(0), ..Default::default() };
    let t = run(&job, &[], &Env::at(at(0)), &api);
    assert_eq!(t.events(), vec!["FailedCreate: Error creating: quota exceeded"]);
    assert_eq!(
        t.expectations,
        vec![Expectations::Set { add: 1, del: 0 }, Expectations::Lower { add: 1, del: 0 }]
    );
    assert_eq!(t.last_status().unwrap().active, Some(0));
}

#[test]
fn too_many_succeeded_pods_warning() {
    let job = mk_job("tm").parallelism(3).completions(Some(2)).start_time(at(0)).build();
    let pods: Vec<_> =
        (0..3).map(|i| mk_pod(&job, &format!("s{i}")).succeeded(at(1)).build()).collect();
    let t = run(&job, &pods, &Env::at(at(10)), &Api::default());
    assert_eq!(
        t.events(),
        vec![
            "TooManySucceededPods: Too many succeeded pods running after completion count reached",
            "Completed: Job completed"
        ]
    );
}

#[test]
fn dropped_verdict_is_not_replaced_by_a_completion() {
    // Backoff limit exceeded while expectations are unsatisfied: the active pod is deleted but the
    // verdict is dropped for this sync. A work-queue Job with a success and no active pod left
    // must not be declared complete in its place (upstream only tests completion on the
    // manageJob branch).
    let job =
        mk_job("fd").parallelism(1).completions(None).backoff_limit(0).start_time(at(0)).build();
    let pods = vec![
        mk_pod(&job, "s").succeeded(at(1)).build(),
        mk_pod(&job, "f").failed(1, at(2)).build(),
        mk_pod(&job, "a").build(),
    ];
    let mut env = Env::at(at(10));
    env.satisfied = false;
    let t = run(&job, &pods, &env, &Api::default());
    assert_eq!(t.deleted, vec![("a".to_string(), false)]);
    let st = t.last_status().unwrap();
    assert!(conds(st).is_empty(), "{:?}", conds(st));
    assert_eq!((st.active, st.terminating), (Some(0), Some(1)));
    assert!(t.outcome.error.is_none());
}

/// Whether a sync of `job` over `pods` flags a success decided without managing pods.
fn flagged(job: &Job, pods: &[Pod], satisfied: bool) -> bool {
    let never = BTreeSet::new();
    let input =
        SyncInput { expectations_satisfied: satisfied, ..sync_input(job, pods, at(5), &never) };
    JobSync::new(input).succeeds_unmanaged()
}

#[test]
fn a_success_decided_without_managing_is_flagged_for_a_fresh_pod_list() {
    // A work queue with one pod succeeded and, as far as the pod list shows, none running.
    let job = mk_job("wq").parallelism(2).completions(None).start_time(at(0)).build();
    let done = vec![mk_pod(&job, "s").succeeded(at(1)).build()];
    let running = vec![done[0].clone(), mk_pod(&job, "r").build()];
    // Unsatisfied expectations: a created pod may be missing from the list, and the success
    // verdict would be final.
    assert!(flagged(&job, &done, false));
    // Satisfied (manageJob runs and the list is complete), or a pod still runs: nothing to flag.
    assert!(!flagged(&job, &done, true));
    assert!(!flagged(&job, &running, false));
    // Nothing succeeded yet: no verdict either way.
    assert!(!flagged(&job, &[], false));
    // Fixed completions: flagged only once enough succeeded.
    let two = mk_job("c2").parallelism(2).completions(Some(2)).start_time(at(0)).build();
    let one = vec![mk_pod(&two, "s").succeeded(at(1)).build()];
    assert!(!flagged(&two, &one, false));
    let both = vec![one[0].clone(), mk_pod(&two, "t").succeeded(at(2)).build()];
    assert!(flagged(&two, &both, false));
    // A finished Job is skipped, never flagged.
    let finished =
        mk_job("fin").completions(None).condition("Complete", "True", "x", "y", at(3)).build();
    assert!(!flagged(&finished, &done, false));
}

#[test]
fn finishing_with_a_failed_delete_errors_and_keeps_the_pod_active() {
    let job = mk_job("fd").parallelism(1).backoff_limit(0).start_time(at(0)).build();
    let pods = vec![mk_pod(&job, "f").failed(1, at(2)).build(), mk_pod(&job, "a").build()];
    let api = Api { fail_deletes: ["a".to_string()].into(), ..Default::default() };
    let t = run(&job, &pods, &Env::at(at(10)), &api);
    let st = t.last_status().unwrap();
    assert!(conds(st).is_empty(), "{:?}", conds(st));
    assert_eq!(st.active, Some(1));
    assert!(matches!(t.outcome.error, Some(SyncError::DeletePods(_))));
    assert_eq!(t.events(), vec!["FailedDelete: Error deleting: delete refused"]);
}

#[test]
fn crash_between_the_writes_never_loses_or_double_counts() {
    let job = mk_job("crash").parallelism(0).completions(Some(3)).start_time(at(0)).build();
    let pods: Vec<_> =
        (0..3).map(|i| mk_pod(&job, &format!("s{i}")).succeeded(at(1)).build()).collect();
    // Crash 1: after write #1 (UIDs recorded), before any finalizer went.
    let t = run(&job, &pods, &Env::at(at(10)), &Api::default());
    let mut w = World::new(job.clone(), pods.clone());
    w.job.status = Some(t.writes[0].clone());
    assert_eq!(
        t.writes[0].uncounted_terminated_pods.as_ref().unwrap().succeeded.as_ref().unwrap().len(),
        3
    );
    let t = sync_valid(&mut w, at(20));
    let st = t.last_status().unwrap();
    assert_eq!(st.succeeded, Some(3), "each pod counted exactly once");
    assert_eq!(
        conds(st),
        vec!["SuccessCriteriaMet=CompletionsReached", "Complete=CompletionsReached"]
    );

    // Crash 2: finalizers removed, but the write moving UIDs into the counter never happened.
    let t = run(&job, &pods, &Env::at(at(10)), &Api::default());
    let mut w = World::new(job, pods);
    w.job.status = Some(t.writes[0].clone());
    for p in &mut w.pods {
        p.metadata.finalizers = Some(vec![]);
    }
    let t = sync_valid(&mut w, at(20));
    assert!(t.finalizers_removed.is_empty());
    let st = t.last_status().unwrap();
    assert_eq!(st.succeeded, Some(3));
    assert_eq!(st.uncounted_terminated_pods.as_ref().unwrap().succeeded, None);
    assert!(t.outcome.finished);
}

#[test]
fn indexed_tracking_publishes_every_index_but_releases_500_pods_a_sync() {
    let job =
        mk_job("ibig").indexed().parallelism(0).completions(Some(1000)).start_time(at(0)).build();
    // Listed in reverse: the engine walks them by index itself.
    let pods: Vec<_> = (0..600)
        .rev()
        .map(|i| mk_pod(&job, &format!("p{i}")).index(i).succeeded(at(1)).build())
        .collect();
    let mut w = World::new(job, pods);
    let t = sync_valid(&mut w, at(10));
    // completedIndexes is idempotent, so every succeeded index is published at once (as
    // upstream); only the finalizer removals are capped, lowest indexes first.
    let st = t.last_status().unwrap();
    assert_eq!(st.completed_indexes.as_deref(), Some("0-599"));
    assert_eq!(st.succeeded, Some(600));
    assert_eq!(t.finalizers_removed.len(), 500);
    assert!(
        t.finalizers_removed.contains(&"p0".to_string())
            && !t.finalizers_removed.contains(&"p599".to_string())
    );
    assert_eq!(t.outcome.metrics.as_ref().unwrap().finished_indexes_succeeded, 600);
    let t = sync_valid(&mut w, at(11));
    assert_eq!(t.finalizers_removed.len(), 100);
    assert_eq!(t.last_status().map(|s| s.succeeded), None, "nothing new to write");
}

#[test]
fn per_index_backoff_delays_the_replacement() {
    let job = mk_job("pib")
        .indexed()
        .completions(Some(2))
        .parallelism(2)
        .backoff_limit_per_index(5)
        .start_time(at(0))
        .build();
    // Index 0 failed at 95 after 2 earlier failures: 3 failures ⇒ 40 s backoff ⇒ 35 s left.
    let pods = vec![
        mk_pod(&job, "pib-0").index(0).failure_counts(2, None).failed(1, at(95)).build(),
        mk_pod(&job, "pib-1").index(1).build(),
    ];
    let t = run(&job, &pods, &Env::at(at(100)), &Api::default());
    assert!(t.created.is_empty());
    assert_eq!(t.outcome.requeue_after, Some(Duration::from_secs(35)));
    assert!(t.finalizers_removed.is_empty(), "held until the replacement exists");
    let t = run(&job, &pods, &Env::at(at(136)), &Api::default());
    assert_eq!(t.created.len(), 1);
    let ann = t.created[0].1.metadata.annotations.clone().unwrap();
    assert_eq!(ann[JOB_INDEX_FAILURE_COUNT_ANNOTATION], "3");
    assert_eq!(ann[kjob_core::JOB_COMPLETION_INDEX_ANNOTATION], "0");
}

/// Upstream `getCompletionIndex` reads only the annotation: a pod that lost it but keeps the
/// index label has no index, so it is deleted and its index gets a fresh pod.
#[test]
fn label_only_index_pod_is_index_less_and_replaced() {
    let job = mk_job("lbl").indexed().completions(Some(2)).parallelism(2).start_time(at(0)).build();
    let pods = vec![
        mk_pod(&job, "lbl-0").index(0).ready(at(1)).build(),
        mk_pod(&job, "lbl-1").label(kjob_core::JOB_COMPLETION_INDEX_ANNOTATION, "1").build(),
    ];
    let t = run(&job, &pods, &Env::at(at(10)), &Api::default());
    assert_eq!(t.deleted.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), vec!["lbl-1"]);
    assert!(t.created.is_empty(), "a sync that deletes creates nothing (upstream manageJob)");
    // Once it is gone, its index is missing and gets a pod.
    let t = run(&job, &pods[..1], &Env::at(at(11)), &Api::default());
    assert_eq!(t.created.len(), 1);
    let ann = t.created[0].1.metadata.annotations.clone().unwrap();
    assert_eq!(ann[kjob_core::JOB_COMPLETION_INDEX_ANNOTATION], "1");
}

#[test]
fn ignored_failure_bumps_the_ignored_count_of_the_replacement() {
    let job = mk_job("pii")
        .indexed()
        .completions(Some(1))
        .parallelism(1)
        .backoff_limit_per_index(1)
        .restart_policy("Never")
        .pod_failure_policy(vec![condition_rule("Ignore", &[("DisruptionTarget", "True")])])
        .pod_replacement_policy("Failed")
        .start_time(at(0))
        .build();
    let pods = vec![
        mk_pod(&job, "pii-0")
            .index(0)
            .failure_counts(0, None)
            .failed(137, at(10))
            .condition("DisruptionTarget", "True", at(9))
            .build(),
    ];
    let t = run(&job, &pods, &Env::at(at(100)), &Api::default());
    assert_eq!(t.created.len(), 1);
    let ann = t.created[0].1.metadata.annotations.clone().unwrap();
    assert_eq!(ann[JOB_INDEX_FAILURE_COUNT_ANNOTATION], "0");
    assert_eq!(ann[kjob_core::JOB_INDEX_IGNORED_FAILURE_COUNT_ANNOTATION], "1");
    assert_eq!(t.last_status().unwrap().failed_indexes.as_deref(), Some(""));
}

#[test]
fn fail_job_on_pod_condition_message() {
    let job = mk_job("pc")
        .restart_policy("Never")
        .pod_failure_policy(vec![condition_rule("FailJob", &[("ConfigIssue", "True")])])
        .pod_replacement_policy("Failed")
        .start_time(at(0))
        .build();
    let pods =
        vec![mk_pod(&job, "pc-a").failed(1, at(5)).condition("ConfigIssue", "True", at(4)).build()];
    let t = run(&job, &pods, &Env::at(at(10)), &Api::default());
    let st = t.last_status().unwrap();
    assert_eq!(conds(st), vec!["FailureTarget=PodFailurePolicy", "Failed=PodFailurePolicy"]);
    assert_eq!(
        message_of(st, "Failed"),
        "Pod default/pc-a has condition ConfigIssue matching FailJob rule at index 0"
    );
}

#[test]
fn success_policy_by_count() {
    let job = mk_job("spc")
        .indexed()
        .completions(Some(5))
        .parallelism(5)
        .success_policy(&[(None, Some(2))])
        .start_time(at(0))
        .build();
    let mut pods: Vec<_> = (0..2)
        .map(|i| mk_pod(&job, &format!("spc-{i}")).index(i).succeeded(at(5)).build())
        .collect();
    pods.extend((2..5).map(|i| mk_pod(&job, &format!("spc-{i}")).index(i).build()));
    let t = run(&job, &pods, &Env::at(at(10)), &Api::default());
    let st = t.last_status().unwrap();
    assert_eq!(conds(st), vec!["SuccessCriteriaMet=SuccessPolicy"]);
    assert_eq!(t.deleted.len(), 3);
    assert_eq!(st.failed.unwrap_or(0), 0);
}

#[test]
fn protocol_misuse_is_refused_and_abort_keeps_what_was_earned() {
    use kjob_reconcile::testutil::sync_input;
    use kjob_reconcile::{JobSync, Report, Step};
    let job = mk_job("pm").parallelism(2).completions(Some(2)).build();
    let in_flight = Default::default();
    let input = sync_input(&job, &[], at(0), &in_flight);
    let mut sync = JobSync::new(input);
    assert!(sync.report(Report::StatusUpdated(Ok(()))).is_err(), "nothing asked yet");
    assert!(matches!(sync.next_step(), Step::Expectations(_)));
    let Step::CreatePods { pods } = sync.next_step() else { panic!("expected a create batch") };
    assert_eq!(pods.len(), 1);
    // Wrong report kind, then wrong length: both refused, the step stays pending.
    assert!(sync.report(Report::PodsDeleted(vec![Ok(())])).is_err());
    assert!(sync.report(Report::PodsCreated(vec![])).is_err());
    sync.report(Report::PodsCreated(vec![Ok("pm-x".into())])).unwrap();
    assert!(matches!(sync.next_step(), Step::CreatePods { .. }));
    let outcome = sync.abort("lease lost");
    assert!(matches!(outcome.error, Some(SyncError::Aborted(_))));
    assert_eq!(outcome.events.len(), 1, "the SuccessfulCreate already earned is kept");
    assert!(outcome.metrics.is_some());
}
