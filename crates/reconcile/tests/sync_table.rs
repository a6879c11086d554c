//! One-sync table, as broad as upstream's `TestControllerSyncJob`, re-derived for current
//! behaviour: terminal conditions are two-step and `terminating` is always written.

mod support;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kjob_reconcile::testutil::{PodBuilder, at, mk_job, mk_pod};
use kjob_reconcile::validation::status_update_errors;
use kjob_reconcile::{Expectations, Skipped};
use support::{Api, Env, run};

/// The table, one row a case: `name | job | pods | want`.
///
/// * job: the Job's name, then `started` (`status.startTime` set), `par=N`, `comp=N|none`,
///   `indexed`, `suspend`, `deleting`, `active=A,R,T` (status counts), `backoff=N`,
///   `on-failure` (restartPolicy), `replace-failed` (podReplacementPolicy), `was-suspended` (a
///   Suspended=True condition); and for the sync around it `unsatisfied` (expectations),
///   `fail-creates` (every create fails), `fail-deletes=a-0,..` (those deletes fail).
/// * pods: groups `prefix*N:state` (pods `prefix-0` ..) or `prefix@i,j:state` (pods with those
///   completion indexes), with the states of [`state`].
/// * want: `field=value` of [`Want`] (lists comma-separated), `error`, `no-write`.
const TABLE: &[&str] = &[
    "job start | start par=2 comp=5 | | creates=2 active=2 events=SuccessfulCreate",
    "work-queue job start | wq par=2 comp=none | | creates=2 active=2 events=SuccessfulCreate",
    "pending pods | pend started par=2 comp=5 | p*2:pending | active=2",
    "correct # of pods, one ready | ok started par=2 comp=5 | r*1:ready n*1:running | active=2 ready=1",
    "too few active pods | few started par=2 comp=5 | a*1:running s*1:succeeded | creates=1 active=2 succeeded=1 events=SuccessfulCreate",
    "work-queue: no new pods after a success | wqfew started par=2 comp=none | a*1:running s*1:succeeded | active=1 succeeded=1",
    "too few active pods, create fails | err started par=2 comp=5 fail-creates | a*1:running | active=1 error events=FailedCreate",
    "too many active pods | many started par=2 comp=5 | a*3:running | deletes=1 active=2 terminating=1 events=SuccessfulDelete",
    "too many active pods, delete fails | manyerr started par=2 comp=5 fail-deletes=a-0,a-1,a-2 | a*3:running | active=3 error events=FailedDelete",
    "failed and succeeded pods | mixed started par=2 comp=5 | a*1:running s*1:succeeded f*1:failed | creates=1 active=2 succeeded=1 failed=1 events=SuccessfulCreate",
    "only a new failed pod | newfail started par=2 comp=5 | f*1:failed | creates=2 active=2 failed=1 events=SuccessfulCreate",
    "job finish | finish started par=2 comp=5 | s*5:succeeded | succeeded=5 conditions=SuccessCriteriaMet=CompletionsReached,Complete=CompletionsReached events=Completed",
    "work-queue job finishing | wqfin started par=2 comp=none | s*1:succeeded a*1:running | active=1 succeeded=1",
    "work-queue job all finished | wqdone started par=2 comp=none | s*2:succeeded | succeeded=2 conditions=SuccessCriteriaMet=CompletionsReached,Complete=CompletionsReached events=Completed",
    "work-queue job all finished despite one failure | wqone started par=2 comp=none | s*1:succeeded f*1:failed | succeeded=1 failed=1 conditions=SuccessCriteriaMet=CompletionsReached,Complete=CompletionsReached events=Completed",
    "more active pods than parallelism | over started par=2 comp=5 | a*10:running | deletes=8 active=2 terminating=8 events=SuccessfulDelete",
    "more active pods than remaining completions | remain started par=3 comp=4 | a*3:running s*2:succeeded | deletes=1 active=2 terminating=1 succeeded=2 events=SuccessfulDelete",
    "status change | chg started par=2 comp=5 | a*2:running s*2:succeeded | active=2 succeeded=2",
    "deleting job: no create, finalizers dropped | del started par=2 comp=5 deleting | a*1:pending | active=1",
    "creates capped at 500 per sync | limit par=600 comp=1000 | | creates=500 active=500 events=SuccessfulCreate",
    "suspending a job | susp started par=2 comp=4 suspend | a*2:ready | deletes=2 terminating=2 conditions=Suspended=JobSuspended events=SuccessfulDelete,Suspended",
    "suspending with unsatisfied expectations | suspu started par=2 comp=4 suspend active=2,0,0 unsatisfied | a*2:running | no-write",
    "resuming a job | res par=2 comp=4 was-suspended active=0,0,0 | | creates=2 active=2 conditions=Suspended=JobResumed events=SuccessfulCreate,Resumed",
    "created suspended: no condition flip, no start time | cs par=2 comp=4 suspend | | conditions=Suspended=JobSuspended events=Suspended",
    "indexed job start | idx indexed par=2 comp=5 | | creates=2 active=2 created=0,1 completed= events=SuccessfulCreate",
    "indexed: fill the gaps | idx2 started indexed par=3 comp=5 | s@0,2:succeeded a@1:running f@3:failed | creates=2 active=3 succeeded=2 failed=1 completed=0,2 created=3,4 events=SuccessfulCreate",
    "indexed: duplicate index deleted first | dup started indexed par=2 comp=5 | a@0,0,1:running | deletes=1 active=2 terminating=1 events=SuccessfulDelete",
    "indexed: invalid indexes deleted | inval started indexed par=2 comp=5 | a@7:running noix*1:running | deletes=2 terminating=2 events=SuccessfulDelete",
    "indexed: all indexes succeeded | idxdone started indexed par=2 comp=3 | s@0,1,2:succeeded | succeeded=3 completed=0-2 conditions=SuccessCriteriaMet=CompletionsReached,Complete=CompletionsReached events=Completed",
    "terminating pod counts as failed and is replaced | term started par=2 comp=5 | t*1:terminating a*1:running | creates=1 active=2 terminating=1 failed=1 events=SuccessfulCreate",
    "podReplacementPolicy=Failed waits for terminating pods | termf started par=2 comp=5 replace-failed | t*1:terminating a*1:running | active=1 terminating=1",
    "OnFailure restarts reach the backoff limit | onfail started par=2 comp=5 on-failure backoff=2 | a*2:restarted | deletes=2 terminating=2 failed=2 conditions=FailureTarget=BackoffLimitExceeded events=SuccessfulDelete",
    "backoff limit exceeded: FailureTarget, actives deleted | bol started par=2 comp=5 backoff=1 | f*2:failed a*1:running | deletes=1 terminating=1 failed=3 conditions=FailureTarget=BackoffLimitExceeded events=SuccessfulDelete",
    "backoff limit exceeded, nothing running: Failed at once | bol2 started par=2 comp=5 backoff=1 | f*2:failed | failed=2 conditions=FailureTarget=BackoffLimitExceeded,Failed=BackoffLimitExceeded events=BackoffLimitExceeded",
    "unsatisfied expectations: no manage, still tracking | unsat started par=2 comp=5 unsatisfied | s*1:succeeded a*1:running | active=1 succeeded=1",
    "nothing changed: no status write | nochange started par=1 comp=1 active=1,0,0 | a*1:running | no-write",
    "work-queue: failed pod is replaced | wqre started par=1 comp=none | f*1:failed | creates=1 active=1 failed=1 events=SuccessfulCreate",
    "suspending a job being deleted: no manage, finalizers dropped | sdel started par=2 comp=4 suspend deleting | a*2:running | active=2",
    "indexed: repeated completed index counts once | rep started indexed par=2 comp=3 | s@0,0:succeeded a@1:running | creates=1 active=2 succeeded=1 completed=0 created=2 events=SuccessfulCreate",
    "indexed, replace only failed: terminating index not recreated | itf started indexed par=3 comp=3 replace-failed | t@0:terminating a@1:running | creates=1 active=2 terminating=1 created=2 events=SuccessfulCreate",
    "indexed, terminating or failed: terminating index recreated now | itof started indexed par=3 comp=3 | t@0:terminating a@1:running | creates=2 active=3 terminating=1 failed=1 created=0,2 events=SuccessfulCreate",
    "OnFailure restarts below the backoff limit | fewr started par=2 comp=5 on-failure backoff=3 | a*2:restarted | active=2",
    "OnFailure with backoffLimit 0: one restart fails the job | zero started par=1 comp=5 on-failure backoff=0 | a*1:pending-restarted | deletes=1 terminating=1 failed=1 conditions=FailureTarget=BackoffLimitExceeded events=SuccessfulDelete",
    "parallelism scaled to zero deletes every active pod | par0 started par=0 comp=5 | a*2:running | deletes=2 terminating=2 events=SuccessfulDelete",
];

/// What the sync must have done.
#[derive(Default, Debug)]
struct Want {
    creates: usize,
    deletes: usize,
    active: i32,
    ready: i32,
    terminating: i32,
    succeeded: i32,
    failed: i32,
    /// `Type=Reason` of every condition in the last write, in order.
    conditions: Vec<String>,
    completed_indexes: Option<String>,
    created_indexes: Option<Vec<i32>>,
    error: bool,
    /// Event reasons (deduplicated, in first-seen order).
    events: Vec<String>,
    no_write: bool,
}

struct Case {
    name: String,
    job: Job,
    pods: Vec<Pod>,
    satisfied: bool,
    api: Api,
    want: Want,
}

fn list(v: &str) -> Vec<String> {
    v.split(',').map(str::to_string).collect()
}

fn num<T: std::str::FromStr>(row: &str, v: &str) -> T {
    v.parse().unwrap_or_else(|_| panic!("{row}: {v:?} is not a number"))
}

/// The pod states of the table.
fn state(row: &str, name: &str) -> fn(PodBuilder) -> PodBuilder {
    match name {
        "running" => |b| b,
        "ready" => |b| b.ready(at(1)),
        "pending" => |b| b.pending(),
        "succeeded" => |b| b.succeeded(at(10)),
        "failed" => |b| b.failed(1, at(10)),
        "terminating" => |b| b.deleting(at(20)),
        "restarted" => |b| b.restarts(1),
        "pending-restarted" => |b| b.pending().restarts(1),
        other => panic!("{row}: unknown pod state {other:?}"),
    }
}

/// Parses one row of [`TABLE`].
fn parse(row: &str) -> Case {
    let cols: Vec<&str> = row.split('|').map(str::trim).collect();
    let [name, job, pods, expect] = cols[..] else { panic!("{row}: expected 4 columns") };
    let mut words = job.split_whitespace();
    let mut b = mk_job(words.next().unwrap_or_else(|| panic!("{row}: no job name")));
    let (mut satisfied, mut api) = (true, Api::default());
    for w in words {
        let (k, v) = w.split_once('=').unwrap_or((w, ""));
        b = match k {
            "started" => b.start_time(at(0)),
            "par" => b.parallelism(num(row, v)),
            "comp" => b.completions((v != "none").then(|| num(row, v))),
            "indexed" => b.indexed(),
            "suspend" => b.suspend(true),
            "deleting" => b.deleting(at(500)),
            "active" => {
                let n: Vec<i32> = v.split(',').map(|x| num(row, x)).collect();
                b.active(n[0], n[1], n[2])
            }
            "backoff" => b.backoff_limit(num(row, v)),
            "on-failure" => b.restart_policy("OnFailure"),
            "replace-failed" => b.pod_replacement_policy("Failed"),
            "was-suspended" => {
                b.condition("Suspended", "True", "JobSuspended", "Job suspended", at(5))
            }
            "unsatisfied" => {
                satisfied = false;
                b
            }
            "fail-creates" => {
                api.fail_creates_from = Some(0);
                b
            }
            "fail-deletes" => {
                api.fail_deletes = list(v).into_iter().collect();
                b
            }
            other => panic!("{row}: unknown job word {other:?}"),
        };
    }
    let job = b.build();
    let mut all = Vec::new();
    for group in pods.split_whitespace() {
        let (who, st) = group.split_once(':').unwrap_or_else(|| panic!("{row}: {group:?}"));
        let f = state(row, st);
        if let Some((prefix, n)) = who.split_once('*') {
            let n: usize = num(row, n);
            all.extend((0..n).map(|i| f(mk_pod(&job, &format!("{prefix}-{i}"))).build()));
        } else if let Some((prefix, ixs)) = who.split_once('@') {
            for (k, ix) in ixs.split(',').map(|x| num::<i32>(row, x)).enumerate() {
                all.push(f(mk_pod(&job, &format!("{prefix}-{ix}-{k}")).index(ix)).build());
            }
        } else {
            panic!("{row}: pod group {group:?} is neither prefix*N nor prefix@i,j");
        }
    }
    let mut want = Want::default();
    for w in expect.split_whitespace() {
        let (k, v) = w.split_once('=').unwrap_or((w, ""));
        match k {
            "creates" => want.creates = num(row, v),
            "deletes" => want.deletes = num(row, v),
            "active" => want.active = num(row, v),
            "ready" => want.ready = num(row, v),
            "terminating" => want.terminating = num(row, v),
            "succeeded" => want.succeeded = num(row, v),
            "failed" => want.failed = num(row, v),
            "conditions" => want.conditions = list(v),
            "events" => want.events = list(v),
            "completed" => want.completed_indexes = Some(v.to_string()),
            "created" => want.created_indexes = Some(v.split(',').map(|x| num(row, x)).collect()),
            "error" => want.error = true,
            "no-write" => want.no_write = true,
            other => panic!("{row}: unknown want word {other:?}"),
        }
    }
    Case { name: name.to_string(), job, pods: all, satisfied, api, want }
}

fn check(c: Case) {
    let mut env = Env::at(at(1000));
    env.satisfied = c.satisfied;
    let t = run(&c.job, &c.pods, &env, &c.api);
    let name = &c.name;
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
    if let Some(ci) = &c.want.completed_indexes {
        assert_eq!(st.completed_indexes.as_deref().unwrap_or(""), ci, "{name}: completedIndexes");
    }
    if let Some(ixs) = &c.want.created_indexes {
        let got: Vec<i32> = t
            .created
            .iter()
            .map(|(_, p)| {
                p.metadata.annotations.as_ref().unwrap()[kjob_core::JOB_COMPLETION_INDEX_ANNOTATION]
                    .parse()
                    .unwrap()
            })
            .collect();
        assert_eq!(&got, ixs, "{name}: created indexes");
    }
    // Every write must be one the API server accepts, each against the previous one.
    let mut job = c.job.clone();
    for w in &t.writes {
        let errs = status_update_errors(&job, w);
        assert!(errs.is_empty(), "{name}: invalid status write: {errs:?}");
        job.status = Some(w.clone());
    }
}

#[test]
fn controller_sync_job_table() {
    for row in TABLE {
        check(parse(row));
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
