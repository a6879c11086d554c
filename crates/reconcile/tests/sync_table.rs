//! One-sync table, as broad as upstream's `TestControllerSyncJob`, re-derived for current
//! behaviour: terminal conditions are two-step and `terminating` is always written.

mod support;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kjob_reconcile::testutil::{PodBuilder, at, mk_job, mk_pod};
use kjob_reconcile::validation::status_update_errors;
use kjob_reconcile::{Expectations, Skipped};
use support::{Api, Env, run};

/// `n` pods named `<prefix>-<i>` shaped by `f`.
fn pods(job: &Job, prefix: &str, n: usize, f: impl Fn(PodBuilder) -> PodBuilder) -> Vec<Pod> {
    (0..n).map(|i| f(mk_pod(job, &format!("{prefix}-{i}"))).build()).collect()
}

/// Pods with explicit completion indexes.
fn indexed(job: &Job, prefix: &str, ixs: &[i32], f: impl Fn(PodBuilder) -> PodBuilder) -> Vec<Pod> {
    ixs.iter()
        .enumerate()
        .map(|(k, ix)| f(mk_pod(job, &format!("{prefix}-{ix}-{k}")).index(*ix)).build())
        .collect()
}

fn running(b: PodBuilder) -> PodBuilder {
    b
}
fn ready(b: PodBuilder) -> PodBuilder {
    b.ready(at(1))
}
fn pending(b: PodBuilder) -> PodBuilder {
    b.pending()
}
fn succeeded(b: PodBuilder) -> PodBuilder {
    b.succeeded(at(10))
}
fn failed(b: PodBuilder) -> PodBuilder {
    b.failed(1, at(10))
}
fn terminating(b: PodBuilder) -> PodBuilder {
    b.deleting(at(20))
}

#[derive(Default)]
struct Want {
    creates: usize,
    deletes: usize,
    active: i32,
    ready: i32,
    terminating: i32,
    succeeded: i32,
    failed: i32,
    /// `Type=Reason` of every condition in the last write, in order.
    conditions: &'static [&'static str],
    completed_indexes: Option<&'static str>,
    created_indexes: Option<&'static [i32]>,
    error: bool,
    /// Event reasons (deduplicated, in first-seen order).
    events: &'static [&'static str],
    no_write: bool,
}

struct Case {
    name: &'static str,
    job: Job,
    pods: Vec<Pod>,
    satisfied: bool,
    api: Api,
    want: Want,
}

fn case(name: &'static str, job: Job, pods: Vec<Pod>, want: Want) -> Case {
    Case { name, job, pods, satisfied: true, api: Api::default(), want }
}

fn check(c: Case) {
    let mut env = Env::at(at(1000));
    env.satisfied = c.satisfied;
    let t = run(&c.job, &c.pods, &env, &c.api);
    let name = c.name;
    assert_eq!(t.created.len(), c.want.creates, "{name}: creates");
    assert_eq!(t.deleted.len(), c.want.deletes, "{name}: deletes");
    assert_eq!(t.outcome.error.is_some(), c.want.error, "{name}: error {:?}", t.outcome.error);
    let mut reasons: Vec<String> = Vec::new();
    for e in &t.outcome.events {
        if !reasons.contains(&e.reason) {
            reasons.push(e.reason.clone());
        }
    }
    assert_eq!(reasons, c.want.events, "{name}: events {:?}", t.events());
    if c.want.no_write {
        assert!(t.writes.is_empty(), "{name}: unexpected write {:?}", t.writes);
        return;
    }
    let st = t.last_status().unwrap_or_else(|| panic!("{name}: no status written"));
    assert_eq!(st.active.unwrap_or(0), c.want.active, "{name}: active");
    assert_eq!(st.ready, Some(c.want.ready), "{name}: ready");
    assert_eq!(st.terminating, Some(c.want.terminating), "{name}: terminating");
    assert_eq!(st.succeeded.unwrap_or(0), c.want.succeeded, "{name}: succeeded");
    assert_eq!(st.failed.unwrap_or(0), c.want.failed, "{name}: failed");
    let conds: Vec<String> = st
        .conditions
        .iter()
        .flatten()
        .map(|c| format!("{}={}", c.type_, c.reason.as_deref().unwrap_or("")))
        .collect();
    assert_eq!(conds, c.want.conditions, "{name}: conditions");
    if let Some(ci) = c.want.completed_indexes {
        assert_eq!(st.completed_indexes.as_deref().unwrap_or(""), ci, "{name}: completedIndexes");
    }
    if let Some(ixs) = c.want.created_indexes {
        let got: Vec<i32> = t
            .created
            .iter()
            .map(|(_, p)| {
                p.metadata.annotations.as_ref().unwrap()[kjob_core::JOB_COMPLETION_INDEX_ANNOTATION]
                    .parse()
                    .unwrap()
            })
            .collect();
        assert_eq!(got, ixs, "{name}: created indexes");
    }
    // Every write must be one the API server accepts, each against the previous one.
    let mut job = c.job.clone();
    for w in &t.writes {
        let errs = status_update_errors(&job, w);
        assert!(errs.is_empty(), "{name}: invalid status write: {errs:?}");
        job.status = Some(w.clone());
    }
}

fn started(name: &str) -> kjob_reconcile::testutil::JobBuilder {
    mk_job(name).start_time(at(0))
}

#[test]
fn controller_sync_job_table() {
    let mut cases = Vec::new();

    let j = mk_job("start").parallelism(2).completions(Some(5)).build();
    cases.push(case(
        "job start",
        j,
        vec![],
        Want { creates: 2, active: 2, events: &["SuccessfulCreate"], ..Default::default() },
    ));

    let j = mk_job("wq").parallelism(2).completions(None).build();
    cases.push(case(
        "work-queue job start",
        j,
        vec![],
        Want { creates: 2, active: 2, events: &["SuccessfulCreate"], ..Default::default() },
    ));

    let j = started("pend").parallelism(2).completions(Some(5)).build();
    let p = pods(&j, "p", 2, pending);
    cases.push(case("pending pods", j, p, Want { active: 2, ..Default::default() }));

    let j = started("ok").parallelism(2).completions(Some(5)).build();
    let mut p = pods(&j, "r", 1, ready);
    p.extend(pods(&j, "n", 1, running));
    cases.push(case(
        "correct # of pods, one ready",
        j,
        p,
        Want { active: 2, ready: 1, ..Default::default() },
    ));

    let j = started("few").parallelism(2).completions(Some(5)).build();
    let mut p = pods(&j, "a", 1, running);
    p.extend(pods(&j, "s", 1, succeeded));
    cases.push(case(
        "too few active pods",
        j,
        p,
        Want {
            creates: 1,
            active: 2,
            succeeded: 1,
            events: &["SuccessfulCreate"],
            ..Default::default()
        },
    ));

    let j = started("wqfew").parallelism(2).completions(None).build();
    let mut p = pods(&j, "a", 1, running);
    p.extend(pods(&j, "s", 1, succeeded));
    cases.push(case(
        "work-queue: no new pods after a success",
        j,
        p,
        Want { active: 1, succeeded: 1, ..Default::default() },
    ));

    let j = started("err").parallelism(2).completions(Some(5)).build();
    let p = pods(&j, "a", 1, running);
    let mut c = case(
        "too few active pods, create fails",
        j,
        p,
        Want { active: 1, error: true, events: &["FailedCreate"], ..Default::default() },
    );
    c.api.fail_creates_from = Some(0);
    cases.push(c);

    let j = started("many").parallelism(2).completions(Some(5)).build();
    let p = pods(&j, "a", 3, running);
    cases.push(case(
        "too many active pods",
        j,
        p,
        Want {
            deletes: 1,
            active: 2,
            terminating: 1,
            events: &["SuccessfulDelete"],
            ..Default::default()
        },
    ));

    let j = started("manyerr").parallelism(2).completions(Some(5)).build();
    let p = pods(&j, "a", 3, running);
    let mut c = case(
        "too many active pods, delete fails",
        j,
        p,
        Want { active: 3, error: true, events: &["FailedDelete"], ..Default::default() },
    );
    c.api.fail_deletes = ["a-0", "a-1", "a-2"].iter().map(|s| s.to_string()).collect();
    cases.push(c);

    let j = started("mixed").parallelism(2).completions(Some(5)).build();
    let mut p = pods(&j, "a", 1, running);
    p.extend(pods(&j, "s", 1, succeeded));
    p.extend(pods(&j, "f", 1, failed));
    cases.push(case(
        "failed and succeeded pods",
        j,
        p,
        Want {
            creates: 1,
            active: 2,
            succeeded: 1,
            failed: 1,
            events: &["SuccessfulCreate"],
            ..Default::default()
        },
    ));

    let j = started("newfail").parallelism(2).completions(Some(5)).build();
    let p = pods(&j, "f", 1, failed);
    cases.push(case(
        "only a new failed pod",
        j,
        p,
        Want {
            creates: 2,
            active: 2,
            failed: 1,
            events: &["SuccessfulCreate"],
            ..Default::default()
        },
    ));

    let j = started("finish").parallelism(2).completions(Some(5)).build();
    let p = pods(&j, "s", 5, succeeded);
    cases.push(case(
        "job finish",
        j,
        p,
        Want {
            succeeded: 5,
            conditions: &["SuccessCriteriaMet=CompletionsReached", "Complete=CompletionsReached"],
            events: &["Completed"],
            ..Default::default()
        },
    ));

    let j = started("wqfin").parallelism(2).completions(None).build();
    let mut p = pods(&j, "s", 1, succeeded);
    p.extend(pods(&j, "a", 1, running));
    cases.push(case(
        "work-queue job finishing",
        j,
        p,
        Want { active: 1, succeeded: 1, ..Default::default() },
    ));

    let j = started("wqdone").parallelism(2).completions(None).build();
    let p = pods(&j, "s", 2, succeeded);
    cases.push(case(
        "work-queue job all finished",
        j,
        p,
        Want {
            succeeded: 2,
            conditions: &["SuccessCriteriaMet=CompletionsReached", "Complete=CompletionsReached"],
            events: &["Completed"],
            ..Default::default()
        },
    ));

    let j = started("wqone").parallelism(2).completions(None).build();
    let mut p = pods(&j, "s", 1, succeeded);
    p.extend(pods(&j, "f", 1, failed));
    cases.push(case(
        "work-queue job all finished despite one failure",
        j,
        p,
        Want {
            succeeded: 1,
            failed: 1,
            conditions: &["SuccessCriteriaMet=CompletionsReached", "Complete=CompletionsReached"],
            events: &["Completed"],
            ..Default::default()
        },
    ));

    let j = started("over").parallelism(2).completions(Some(5)).build();
    let p = pods(&j, "a", 10, running);
    cases.push(case(
        "more active pods than parallelism",
        j,
        p,
        Want {
            deletes: 8,
            active: 2,
            terminating: 8,
            events: &["SuccessfulDelete"],
            ..Default::default()
        },
    ));

    let j = started("remain").parallelism(3).completions(Some(4)).build();
    let mut p = pods(&j, "a", 3, running);
    p.extend(pods(&j, "s", 2, succeeded));
    cases.push(case(
        "more active pods than remaining completions",
        j,
        p,
        Want {
            deletes: 1,
            active: 2,
            terminating: 1,
            succeeded: 2,
            events: &["SuccessfulDelete"],
            ..Default::default()
        },
    ));

    let j = started("chg").parallelism(2).completions(Some(5)).build();
    let mut p = pods(&j, "a", 2, running);
    p.extend(pods(&j, "s", 2, succeeded));
    cases.push(case("status change", j, p, Want { active: 2, succeeded: 2, ..Default::default() }));

    let j = started("del").parallelism(2).completions(Some(5)).deleting(at(500)).build();
    let p = pods(&j, "a", 1, pending);
    cases.push(case(
        "deleting job: no create, finalizers dropped",
        j,
        p,
        Want { active: 1, ..Default::default() },
    ));

    let j = mk_job("limit").parallelism(600).completions(Some(1000)).build();
    cases.push(case(
        "creates capped at 500 per sync",
        j,
        vec![],
        Want { creates: 500, active: 500, events: &["SuccessfulCreate"], ..Default::default() },
    ));

    let j = started("susp").parallelism(2).completions(Some(4)).suspend(true).build();
    let p = pods(&j, "a", 2, ready);
    cases.push(case(
        "suspending a job",
        j,
        p,
        Want {
            deletes: 2,
            terminating: 2,
            conditions: &["Suspended=JobSuspended"],
            events: &["SuccessfulDelete", "Suspended"],
            ..Default::default()
        },
    ));

    let j =
        started("suspu").parallelism(2).completions(Some(4)).suspend(true).active(2, 0, 0).build();
    let p = pods(&j, "a", 2, running);
    let mut c = case(
        "suspending with unsatisfied expectations",
        j,
        p,
        Want { no_write: true, ..Default::default() },
    );
    c.satisfied = false;
    cases.push(c);

    let j = mk_job("res")
        .parallelism(2)
        .completions(Some(4))
        .condition("Suspended", "True", "JobSuspended", "Job suspended", at(5))
        .active(0, 0, 0)
        .build();
    cases.push(case(
        "resuming a job",
        j,
        vec![],
        Want {
            creates: 2,
            active: 2,
            conditions: &["Suspended=JobResumed"],
            events: &["SuccessfulCreate", "Resumed"],
            ..Default::default()
        },
    ));

    let j = mk_job("cs").parallelism(2).completions(Some(4)).suspend(true).build();
    cases.push(case(
        "created suspended: no condition flip, no start time",
        j,
        vec![],
        Want {
            conditions: &["Suspended=JobSuspended"],
            events: &["Suspended"],
            ..Default::default()
        },
    ));

    let j = mk_job("idx").indexed().parallelism(2).completions(Some(5)).build();
    cases.push(case(
        "indexed job start",
        j,
        vec![],
        Want {
            creates: 2,
            active: 2,
            created_indexes: Some(&[0, 1]),
            completed_indexes: Some(""),
            events: &["SuccessfulCreate"],
            ..Default::default()
        },
    ));

    let j = started("idx2").indexed().parallelism(3).completions(Some(5)).build();
    let mut p = indexed(&j, "s", &[0, 2], succeeded);
    p.extend(indexed(&j, "a", &[1], running));
    p.extend(indexed(&j, "f", &[3], failed));
    cases.push(case(
        "indexed: fill the gaps",
        j,
        p,
        Want {
            creates: 2,
            active: 3,
            succeeded: 2,
            failed: 1,
            completed_indexes: Some("0,2"),
            created_indexes: Some(&[3, 4]),
            events: &["SuccessfulCreate"],
            ..Default::default()
        },
    ));

    let j = started("dup").indexed().parallelism(2).completions(Some(5)).build();
    let p = indexed(&j, "a", &[0, 0, 1], running);
    cases.push(case(
        "indexed: duplicate index deleted first",
        j,
        p,
        Want {
            deletes: 1,
            active: 2,
            terminating: 1,
            events: &["SuccessfulDelete"],
            ..Default::default()
        },
    ));

    let j = started("inval").indexed().parallelism(2).completions(Some(5)).build();
    let mut p = indexed(&j, "a", &[7], running);
    p.extend(pods(&j, "noix", 1, running));
    cases.push(case(
        "indexed: invalid indexes deleted",
        j,
        p,
        Want { deletes: 2, terminating: 2, events: &["SuccessfulDelete"], ..Default::default() },
    ));

    let j = started("idxdone").indexed().parallelism(2).completions(Some(3)).build();
    let p = indexed(&j, "s", &[0, 1, 2], succeeded);
    cases.push(case(
        "indexed: all indexes succeeded",
        j,
        p,
        Want {
            succeeded: 3,
            completed_indexes: Some("0-2"),
            conditions: &["SuccessCriteriaMet=CompletionsReached", "Complete=CompletionsReached"],
            events: &["Completed"],
            ..Default::default()
        },
    ));

    let j = started("term").parallelism(2).completions(Some(5)).build();
    let mut p = pods(&j, "t", 1, terminating);
    p.extend(pods(&j, "a", 1, running));
    cases.push(case(
        "terminating pod counts as failed and is replaced",
        j,
        p,
        Want {
            creates: 1,
            active: 2,
            terminating: 1,
            failed: 1,
            events: &["SuccessfulCreate"],
            ..Default::default()
        },
    ));

    let j = started("termf")
        .parallelism(2)
        .completions(Some(5))
        .pod_replacement_policy("Failed")
        .build();
    let mut p = pods(&j, "t", 1, terminating);
    p.extend(pods(&j, "a", 1, running));
    cases.push(case(
        "podReplacementPolicy=Failed waits for terminating pods",
        j,
        p,
        Want { active: 1, terminating: 1, ..Default::default() },
    ));

    let j = started("onfail")
        .parallelism(2)
        .completions(Some(5))
        .restart_policy("OnFailure")
        .backoff_limit(2)
        .build();
    let p = pods(&j, "a", 2, |b| b.restarts(1));
    cases.push(case(
        "OnFailure restarts reach the backoff limit",
        j,
        p,
        Want {
            deletes: 2,
            terminating: 2,
            failed: 2,
            conditions: &["FailureTarget=BackoffLimitExceeded"],
            events: &["SuccessfulDelete"],
            ..Default::default()
        },
    ));

    let j = started("bol").parallelism(2).completions(Some(5)).backoff_limit(1).build();
    let mut p = pods(&j, "f", 2, failed);
    p.extend(pods(&j, "a", 1, running));
    cases.push(case(
        "backoff limit exceeded: FailureTarget, actives deleted",
        j,
        p,
        Want {
            deletes: 1,
            terminating: 1,
            failed: 3,
            conditions: &["FailureTarget=BackoffLimitExceeded"],
            events: &["SuccessfulDelete"],
            ..Default::default()
        },
    ));

    let j = started("bol2").parallelism(2).completions(Some(5)).backoff_limit(1).build();
    let p = pods(&j, "f", 2, failed);
    cases.push(case(
        "backoff limit exceeded, nothing running: Failed at once",
        j,
        p,
        Want {
            failed: 2,
            conditions: &["FailureTarget=BackoffLimitExceeded", "Failed=BackoffLimitExceeded"],
            events: &["BackoffLimitExceeded"],
            ..Default::default()
        },
    ));

    let j = started("unsat").parallelism(2).completions(Some(5)).build();
    let mut p = pods(&j, "s", 1, succeeded);
    p.extend(pods(&j, "a", 1, running));
    let mut c = case(
        "unsatisfied expectations: no manage, still tracking",
        j,
        p,
        Want { active: 1, succeeded: 1, ..Default::default() },
    );
    c.satisfied = false;
    cases.push(c);

    let j = started("nochange").parallelism(1).completions(Some(1)).active(1, 0, 0).build();
    let p = pods(&j, "a", 1, running);
    cases.push(case(
        "nothing changed: no status write",
        j,
        p,
        Want { no_write: true, ..Default::default() },
    ));

    let j = started("wqre").parallelism(1).completions(None).build();
    let p = pods(&j, "f", 1, failed);
    cases.push(case(
        "work-queue: failed pod is replaced",
        j,
        p,
        Want {
            creates: 1,
            active: 1,
            failed: 1,
            events: &["SuccessfulCreate"],
            ..Default::default()
        },
    ));

    let j =
        started("sdel").parallelism(2).completions(Some(4)).suspend(true).deleting(at(500)).build();
    let p = pods(&j, "a", 2, running);
    cases.push(case(
        "suspending a job being deleted: no manage, finalizers dropped",
        j,
        p,
        Want { active: 2, ..Default::default() },
    ));

    let j = started("rep").indexed().parallelism(2).completions(Some(3)).build();
    let mut p = indexed(&j, "s", &[0, 0], succeeded);
    p.extend(indexed(&j, "a", &[1], running));
    cases.push(case(
        "indexed: repeated completed index counts once",
        j,
        p,
        Want {
            creates: 1,
            active: 2,
            succeeded: 1,
            completed_indexes: Some("0"),
            created_indexes: Some(&[2]),
            events: &["SuccessfulCreate"],
            ..Default::default()
        },
    ));

    let j = started("itf")
        .indexed()
        .parallelism(3)
        .completions(Some(3))
        .pod_replacement_policy("Failed")
        .build();
    let mut p = indexed(&j, "t", &[0], terminating);
    p.extend(indexed(&j, "a", &[1], running));
    cases.push(case(
        "indexed, replace only failed: terminating index not recreated",
        j,
        p,
        Want {
            creates: 1,
            active: 2,
            terminating: 1,
            created_indexes: Some(&[2]),
            events: &["SuccessfulCreate"],
            ..Default::default()
        },
    ));

    let j = started("itof").indexed().parallelism(3).completions(Some(3)).build();
    let mut p = indexed(&j, "t", &[0], terminating);
    p.extend(indexed(&j, "a", &[1], running));
    cases.push(case(
        "indexed, terminating or failed: terminating index recreated now",
        j,
        p,
        Want {
            creates: 2,
            active: 3,
            terminating: 1,
            failed: 1,
            created_indexes: Some(&[0, 2]),
            events: &["SuccessfulCreate"],
            ..Default::default()
        },
    ));

    let j = started("fewr")
        .parallelism(2)
        .completions(Some(5))
        .restart_policy("OnFailure")
        .backoff_limit(3)
        .build();
    let p = pods(&j, "a", 2, |b| b.restarts(1));
    cases.push(case(
        "OnFailure restarts below the backoff limit",
        j,
        p,
        Want { active: 2, ..Default::default() },
    ));

    let j = started("zero")
        .parallelism(1)
        .completions(Some(5))
        .restart_policy("OnFailure")
        .backoff_limit(0)
        .build();
    let p = pods(&j, "a", 1, |b| b.pending().restarts(1));
    cases.push(case(
        "OnFailure with backoffLimit 0: one restart fails the job",
        j,
        p,
        Want {
            deletes: 1,
            terminating: 1,
            failed: 1,
            conditions: &["FailureTarget=BackoffLimitExceeded"],
            events: &["SuccessfulDelete"],
            ..Default::default()
        },
    ));

    let j = started("par0").parallelism(0).completions(Some(5)).build();
    let p = pods(&j, "a", 2, running);
    cases.push(case(
        "parallelism scaled to zero deletes every active pod",
        j,
        p,
        Want { deletes: 2, terminating: 2, events: &["SuccessfulDelete"], ..Default::default() },
    ));

    for c in cases {
        check(c);
    }
}

#[test]
fn unknown_completion_mode_warns_and_does_nothing() {
    let job = mk_job("weird").completion_mode("Sparse").build();
    let t = run(&job, &[], &Env::at(at(0)), &Api::default());
    assert_eq!(t.outcome.skipped, Some(Skipped::UnknownCompletionMode));
    assert_eq!(
        t.events(),
        vec!["UnknownCompletionMode: Skipped Job sync because completion mode is unknown"]
    );
    assert!(t.created.is_empty() && t.writes.is_empty());
    assert!(t.outcome.metrics.is_none());
}

#[test]
fn managed_by_another_controller_is_skipped() {
    let job = mk_job("other").managed_by("example.com/other").build();
    let t = run(&job, &[], &Env::at(at(0)), &Api::default());
    assert_eq!(t.outcome.skipped, Some(Skipped::ManagedElsewhere));
    assert!(t.kinds == vec!["done"]);
}

#[test]
fn slow_start_stops_after_a_failing_batch() {
    let job = mk_job("slow").parallelism(10).completions(Some(10)).build();
    // Creates 0..2 succeed (batches 1 and 2), the 4th create fails: the batch of 4 runs, the rest is skipped.
    let api = Api { fail_creates_from: Some(3), ..Default::default() };
    let t = run(&job, &[], &Env::at(at(0)), &api);
    assert_eq!(t.batches, vec![1, 2, 4]);
    assert_eq!(t.created.len(), 3);
    assert_eq!(
        t.expectations,
        vec![Expectations::Set { add: 10, del: 0 }, Expectations::Lower { add: 4 + 3, del: 0 }]
    );
    let st = t.last_status().unwrap();
    assert_eq!(st.active, Some(3));
    assert!(matches!(t.outcome.error, Some(kjob_reconcile::SyncError::CreatePods(_))));
    let m = t.outcome.metrics.unwrap();
    assert_eq!(m.action, "pods_created");
    let pc = m.pods_creation.unwrap();
    // Upstream's quirk: failed creates are also added to the "succeeded" series.
    assert_eq!((pc.reason, pc.succeeded, pc.failed), ("new", 7, 4));
}
