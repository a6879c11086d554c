//! First end-to-end checks of the sync state machine.

mod support;

use kjob_reconcile::testutil::{at, mk_job, mk_pod};
use kjob_reconcile::{Expectations, Skipped};
use support::{Api, Env, run};

#[test]
fn new_job_creates_parallelism_pods_in_slow_start_batches() {
    let job = mk_job("pi").parallelism(7).completions(Some(10)).build();
    let t = run(&job, &[], &Env::at(at(0)), &Api::default());
    assert_eq!(t.batches, vec![1, 2, 4]);
    assert_eq!(t.created.len(), 7);
    assert_eq!(t.expectations[0], Expectations::Set { add: 7, del: 0 });
    let st = t.last_status().expect("status written");
    assert_eq!(st.active, Some(7));
    assert_eq!(st.ready, Some(0));
    assert_eq!(st.terminating, Some(0));
    assert_eq!(st.start_time.as_ref().map(|t| t.0), Some(at(0)));
    assert!(t.outcome.error.is_none());
    assert_eq!(t.events().len(), 7);
    assert!(t.events()[0].starts_with("SuccessfulCreate: Created pod: pi-"));
}

#[test]
fn finished_job_is_skipped_and_backoff_dropped() {
    let job = mk_job("pi").condition("Complete", "True", "CompletionsReached", "x", at(0)).build();
    let t = run(&job, &[], &Env::at(at(5)), &Api::default());
    assert_eq!(t.outcome.skipped, Some(Skipped::Finished));
    assert!(t.writes.is_empty());
    assert_eq!(t.outcome.backoff, kjob_reconcile::BackoffUpdate::Remove);
}

#[test]
fn succeeded_pod_goes_through_uncounted_then_counter_then_complete() {
    let job = mk_job("pi").start_time(at(0)).active(1, 0, 0).build();
    let pod = mk_pod(&job, "pi-a").succeeded(at(3)).build();
    let t = run(&job, &[pod], &Env::at(at(5)), &Api::default());
    assert_eq!(t.kinds, vec!["status", "expectations", "remove-finalizers", "status", "done"]);
    let first = &t.writes[0];
    assert_eq!(
        first.uncounted_terminated_pods.as_ref().unwrap().succeeded,
        Some(vec!["pi-a-uid".to_string()])
    );
    assert_eq!(first.succeeded.unwrap_or(0), 0);
    assert_eq!(
        first.conditions.as_ref().unwrap().iter().map(|c| c.type_.as_str()).collect::<Vec<_>>(),
        vec!["SuccessCriteriaMet"]
    );
    let last = &t.writes[1];
    assert_eq!(last.succeeded, Some(1));
    assert_eq!(last.uncounted_terminated_pods.as_ref().unwrap().succeeded, None);
    assert_eq!(t.condition_types(), vec!["SuccessCriteriaMet=True", "Complete=True"]);
    assert_eq!(last.completion_time.as_ref().map(|t| t.0), Some(at(5)));
    assert_eq!(t.events(), vec!["Completed: Job completed"]);
    assert!(t.outcome.finished);
    let m = t.outcome.metrics.expect("sync metrics");
    assert_eq!((m.completion_mode, m.action), ("NonIndexed", "tracking"));
    assert_eq!((m.pods_finished_succeeded, m.pods_finished_failed), (1, 0));
    let finished = m.job_finished.expect("jobs_finished_total increment");
    assert_eq!((finished.result, finished.reason.as_str()), ("succeeded", "CompletionsReached"));
}
