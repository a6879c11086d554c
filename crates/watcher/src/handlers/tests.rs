//! Table tests for every handler path.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kjob_core::DEFAULT_CONTROLLER_NAME;

use super::*;
use kjob_reconcile::selector::Selector;

const ME: &str = DEFAULT_CONTROLLER_NAME;
const BATCH: Duration = SYNC_JOB_BATCH_PERIOD;

fn cfg() -> HandlerConfig {
    HandlerConfig { controller_name: ME.into(), manage_all: false }
}

fn mk_job(name: &str) -> JobInfo {
    let sel = LabelSelector {
        match_labels: Some(BTreeMap::from([("job".to_string(), name.to_string())])),
        match_expressions: None,
    };
    JobInfo {
        namespace: "ns".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        resource_version: "1".into(),
        generation: 1,
        managed_by: Some(ME.into()),
        selector: Selector::compile(Some(&sel)).unwrap(),
        active_deadline_seconds: None,
        start_time: None,
        finished: false,
        deleting: false,
        pod_priority: Default::default(),
        view: None,
    }
}

fn mk_pod(name: &str, owner: Option<&JobInfo>) -> PodInfo {
    // A Job's pods carry the label its selector matches; orphans start without labels.
    let labels = owner.map(|j| BTreeMap::from([("job".to_string(), j.name.clone())]));
    let labels = labels.unwrap_or_default();
    PodInfo {
        namespace: "ns".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        resource_version: "1".into(),
        labels,
        controller: owner.map(cref),
        has_tracking_finalizer: true,
        deleting: false,
        view: None,
    }
}

fn cref(j: &JobInfo) -> ControllerRef {
    ControllerRef {
        api_version: "batch/v1".into(),
        kind: "Job".into(),
        name: j.name.clone(),
        uid: j.uid.clone(),
    }
}

fn bump(p: &PodInfo) -> PodInfo {
    let mut n = p.clone();
    n.resource_version = format!("{}0", p.resource_version);
    n
}

/// A live Job `a`, a finished Job `f` and a Job `x` managed by another controller, and a store
/// holding the three.
fn three_jobs() -> (JobInfo, JobInfo, JobInfo, Store) {
    let a = mk_job("a");
    let mut finished = mk_job("f");
    finished.finished = true;
    let mut foreign = mk_job("x");
    foreign.managed_by = Some("example.com/other".into());
    let store = store_with(&[&a, &finished, &foreign], &[]);
    (a, finished, foreign, store)
}

fn store_with(jobs: &[&JobInfo], pods: &[&PodInfo]) -> Store {
    let mut s = Store::new();
    for j in jobs {
        s.upsert((*j).clone());
    }
    for p in pods {
        s.upsert((*p).clone());
    }
    s
}

fn job_q(key: &str, delay: Duration, obs: Vec<Observation>) -> Enqueue {
    Enqueue { queue: JOB_QUEUE, key: key.into(), delay, observations: obs, ..Default::default() }
}

fn orphan_q(key: &str) -> Enqueue {
    Enqueue {
        queue: ORPHAN_POD_QUEUE,
        key: key.into(),
        delay: Duration::ZERO,
        observations: vec![],
        ..Default::default()
    }
}

fn obs(kind: ObservationKind, job: &str, pod: &str) -> Observation {
    Observation { kind, job_uid: format!("uid-{job}"), pod_uid: format!("uid-{pod}") }
}

use ObservationKind::{Creation, Deletion, FinalizerRemoval};

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

// ------------------------------------------------------------------ Jobs

#[test]
fn job_add_and_delete() {
    let a = mk_job("a");
    let mut other = mk_job("b");
    other.managed_by = Some("example.com/other".into());
    let mut unset = mk_job("c");
    unset.managed_by = None;
    let p1 = mk_pod("p1", Some(&a));
    let mut p2 = mk_pod("p2", Some(&a));
    p2.has_tracking_finalizer = false;
    let mut p3 = mk_pod("p3", Some(&a));
    p3.namespace = "elsewhere".into(); // same owner UID in another namespace: not this Job's
    let store = store_with(&[&a, &other, &unset], &[&p1, &p2, &p3]);
    let all = HandlerConfig { manage_all: true, ..cfg() };

    assert_eq!(on_job_add(&cfg(), &a), vec![job_q("ns/a", Duration::ZERO, vec![])]);
    assert_eq!(on_job_add(&cfg(), &other), vec![]);
    assert_eq!(on_job_add(&all, &other), vec![]);
    assert_eq!(on_job_add(&cfg(), &unset), vec![]);
    assert_eq!(on_job_add(&all, &unset), vec![job_q("ns/c", Duration::ZERO, vec![])]);

    assert_eq!(
        on_job_delete(&cfg(), &store, &a),
        vec![job_q("ns/a", Duration::ZERO, vec![]), orphan_q("ns/p1")]
    );
    assert_eq!(on_job_delete(&cfg(), &store, &other), vec![]);
}

#[test]
fn job_update_table() {
    let now = ts("2026-01-01T00:01:00Z");
    let base = mk_job("a");
    let p1 = mk_pod("p1", Some(&base));
    let store = store_with(&[&base], &[&p1]);
    let with = |f: &dyn Fn(&mut JobInfo)| {
        let mut j = base.clone();
        j.resource_version = "2".into();
        f(&mut j);
        j
    };
    let started = |j: &mut JobInfo| j.start_time = Some(ts("2026-01-01T00:00:00Z"));
    // A Job started a minute before `now` at resourceVersion `rv` with this deadline.
    let running = |rv: &str, ads: Option<i64>| {
        with(&|j| {
            started(j);
            j.resource_version = rv.into();
            j.active_deadline_seconds = ads;
        })
    };

    struct Case {
        name: &'static str,
        old: JobInfo,
        new: JobInfo,
        want: Vec<Enqueue>,
    }
    let cases = vec![
        Case { name: "same rv", old: base.clone(), new: base.clone(), want: vec![] },
        Case {
            name: "status only",
            old: base.clone(),
            new: with(&|j| j.start_time = Some(now)),
            want: vec![job_q("ns/a", BATCH, vec![])],
        },
        Case {
            name: "spec change",
            old: base.clone(),
            new: with(&|j| j.generation = 2),
            want: vec![job_q("ns/a", Duration::ZERO, vec![])],
        },
        Case {
            name: "deadline set on started job",
            old: running("2", None),
            new: JobInfo { generation: 2, ..running("3", Some(100)) },
            want: vec![
                job_q("ns/a", Duration::ZERO, vec![]),
                job_q("ns/a", Duration::from_secs(40), vec![]),
            ],
        },
        Case {
            name: "deadline changed",
            old: running("2", Some(100)),
            new: running("3", Some(90)),
            want: vec![
                job_q("ns/a", BATCH, vec![]),
                job_q("ns/a", Duration::from_secs(30), vec![]),
            ],
        },
        Case {
            name: "deadline already passed fires now",
            old: running("2", None),
            new: running("3", Some(10)),
            want: vec![job_q("ns/a", BATCH, vec![]), job_q("ns/a", Duration::ZERO, vec![])],
        },
        Case {
            name: "deadline unchanged is not re-armed",
            old: running("2", Some(100)),
            new: running("3", Some(100)),
            want: vec![job_q("ns/a", BATCH, vec![])],
        },
        Case {
            name: "deadline without startTime waits for the start",
            old: base.clone(),
            new: with(&|j| j.active_deadline_seconds = Some(100)),
            want: vec![job_q("ns/a", BATCH, vec![])],
        },
        Case {
            name: "finished job cleans up pod finalizers",
            old: base.clone(),
            new: with(&|j| j.finished = true),
            want: vec![job_q("ns/a", BATCH, vec![]), Enqueue { settle: true, ..orphan_q("ns/p1") }],
        },
        Case {
            name: "managed by someone else",
            old: with(&|j| j.managed_by = Some("x/y".into())),
            new: with(&|j| {
                j.managed_by = Some("x/y".into());
                j.resource_version = "3".into();
                j.generation = 5;
            }),
            want: vec![],
        },
    ];
    for c in cases {
        assert_eq!(on_job_update(&cfg(), &store, &c.old, &c.new, now), c.want, "{}", c.name);
    }
}

// ------------------------------------------------------------------ Pod add

#[test]
fn pod_add_table() {
    let (a, finished, foreign, store) = three_jobs();

    let owned = mk_pod("p", Some(&a));
    let mut deleting = owned.clone();
    deleting.deleting = true;
    let mut wrong_uid = owned.clone();
    wrong_uid.controller.as_mut().unwrap().uid = "other".into();
    let mut wrong_kind = owned.clone();
    wrong_kind.controller.as_mut().unwrap().kind = "CronJob".into();
    let mut orphan = mk_pod("o", None);
    orphan.labels.insert("job".into(), "a".into());
    let mut orphan_plain = orphan.clone();
    orphan_plain.has_tracking_finalizer = false;
    let mut orphan_nolabels = mk_pod("n", None);
    orphan_nolabels.has_tracking_finalizer = false;
    let foreign_pod = mk_pod("fp", Some(&foreign));
    let mut deleting_of_finished = mk_pod("df", Some(&finished));
    deleting_of_finished.deleting = true;

    let cases: Vec<(&str, PodInfo, Vec<Enqueue>)> = vec![
        ("owned", owned.clone(), vec![job_q("ns/a", BATCH, vec![obs(Creation, "a", "p")])]),
        (
            "deleting on add is a deletion",
            deleting,
            vec![job_q("ns/a", BATCH, vec![obs(Deletion, "a", "p")])],
        ),
        ("uid mismatch", wrong_uid, vec![]),
        ("not a Job owner", wrong_kind, vec![]),
        ("orphan with finalizer", orphan, vec![orphan_q("ns/o"), job_q("ns/a", BATCH, vec![])]),
        ("orphan without finalizer", orphan_plain, vec![job_q("ns/a", BATCH, vec![])]),
        ("orphan without labels", orphan_nolabels, vec![]),
        ("pod of a foreign job", foreign_pod, vec![]),
        ("deleting pod of a finished job", deleting_of_finished, vec![orphan_q("ns/df")]),
    ];
    for (name, pod, want) in cases {
        assert_eq!(on_pod_add(&cfg(), &store, &pod), want, "{name}");
    }
}

#[test]
fn orphans_only_wake_managed_matching_jobs() {
    let a = mk_job("a");
    let mut all_selecting = mk_job("b");
    all_selecting.selector = Selector::compile(Some(&LabelSelector::default())).unwrap();
    let mut nil_sel = mk_job("c");
    nil_sel.selector = Selector::nothing();
    let mut foreign = mk_job("d");
    foreign.managed_by = Some("x/y".into());
    foreign.selector = all_selecting.selector.clone();
    let mut other_ns = mk_job("a");
    other_ns.namespace = "elsewhere".into();
    let store = store_with(&[&a, &all_selecting, &nil_sel, &foreign, &other_ns], &[]);
    let mut pod = mk_pod("o", None);
    pod.has_tracking_finalizer = false;
    pod.labels.insert("job".into(), "a".into());
    assert_eq!(
        on_pod_add(&cfg(), &store, &pod),
        vec![job_q("ns/a", BATCH, vec![]), job_q("ns/b", BATCH, vec![])]
    );
}

#[test]
fn owned_pods_whose_labels_stop_matching_are_released() {
    let (a, finished, foreign, store) = three_jobs();
    let unmatch = |p: &PodInfo| {
        let mut n = bump(p);
        n.labels.insert("job".into(), "edited".into());
        n
    };
    let owned = mk_pod("p", Some(&a));
    let edited = unmatch(&owned);
    // Update: the Job syncs (it loses a pod) and the orphan worker releases the pod.
    assert_eq!(
        on_pod_update(&cfg(), &store, &owned, &edited),
        vec![job_q("ns/a", BATCH, vec![]), orphan_q("ns/p")]
    );
    // Labels removed altogether: no longer selected either.
    let mut bare = bump(&owned);
    bare.labels.clear();
    assert_eq!(
        on_pod_update(&cfg(), &store, &owned, &bare),
        vec![job_q("ns/a", BATCH, vec![]), orphan_q("ns/p")]
    );
    // Seen for the first time already unmatched (e.g. after a relist).
    assert_eq!(
        on_pod_add(&cfg(), &store, &edited),
        vec![job_q("ns/a", BATCH, vec![obs(Creation, "a", "p")]), orphan_q("ns/p")]
    );
    // A pod being deleted is not released (upstream ClaimPods skips it).
    let mut deleting = unmatch(&owned);
    deleting.deleting = true;
    assert!(on_pod_update(&cfg(), &store, &owned, &deleting).iter().all(|e| e.queue == JOB_QUEUE));
    // Finished Jobs do not claim or release; foreign Jobs are not ours.
    let of_finished = mk_pod("q", Some(&finished));
    assert_eq!(
        on_pod_update(&cfg(), &store, &of_finished, &unmatch(&of_finished)),
        vec![job_q("ns/f", BATCH, vec![])]
    );
    let of_foreign = mk_pod("r", Some(&foreign));
    assert!(on_pod_update(&cfg(), &store, &of_foreign, &unmatch(&of_foreign)).is_empty());
    // Still matching: nothing but the usual Job sync.
    assert_eq!(
        on_pod_update(&cfg(), &store, &owned, &bump(&owned)),
        vec![job_q("ns/a", BATCH, vec![])]
    );
    // A Job being deleted releases nothing (upstream ClaimObject).
    let mut deleting_job = mk_job("d");
    deleting_job.deleting = true;
    let store = store_with(&[&deleting_job], &[]);
    let of_deleting = mk_pod("s", Some(&deleting_job));
    assert_eq!(
        on_pod_update(&cfg(), &store, &of_deleting, &unmatch(&of_deleting)),
        vec![job_q("ns/d", BATCH, vec![])]
    );
}

// ------------------------------------------------------------------ Pod update

#[test]
fn pod_update_table() {
    let a = mk_job("a");
    let b = mk_job("b");
    let mut foreign = mk_job("x");
    foreign.managed_by = Some("x/y".into());
    let store = store_with(&[&a, &b, &foreign], &[]);
    let p = mk_pod("p", Some(&a));

    let finalizer_gone = {
        let mut n = bump(&p);
        n.has_tracking_finalizer = false;
        n
    };
    let deleting = {
        let mut n = bump(&p);
        n.deleting = true;
        n
    };
    let still_deleting = {
        let mut o = p.clone();
        o.deleting = true;
        let mut n = bump(&o);
        n.has_tracking_finalizer = false;
        (o, n)
    };
    let moved = {
        let mut n = bump(&p);
        n.controller = Some(cref(&b));
        n.labels.insert("job".into(), "b".into());
        n.has_tracking_finalizer = false;
        n
    };
    let released = {
        let mut n = bump(&p);
        n.controller = None;
        n.labels.insert("job".into(), "b".into());
        n
    };
    let mut orphan = mk_pod("o", None);
    orphan.labels.insert("job".into(), "a".into());
    orphan.has_tracking_finalizer = false;
    let orphan_relabelled = {
        let mut n = bump(&orphan);
        n.labels.insert("job".into(), "b".into());
        n
    };
    let orphan_status_only = bump(&orphan);
    let fp = mk_pod("fp", Some(&foreign));
    let fp_new = {
        let mut n = bump(&fp);
        n.has_tracking_finalizer = false;
        n
    };

    let cases: Vec<(&str, PodInfo, PodInfo, Vec<Enqueue>)> = vec![
        ("same rv is a resync", p.clone(), p.clone(), vec![]),
        ("status change", p.clone(), bump(&p), vec![job_q("ns/a", BATCH, vec![])]),
        (
            "finalizer removed",
            p.clone(),
            finalizer_gone,
            vec![job_q("ns/a", BATCH, vec![obs(FinalizerRemoval, "a", "p")])],
        ),
        (
            "deletionTimestamp newly set",
            p.clone(),
            deleting,
            vec![job_q("ns/a", BATCH, vec![obs(Deletion, "a", "p")])],
        ),
        (
            "already deleting: no second deletion observation",
            still_deleting.0,
            still_deleting.1,
            vec![job_q("ns/a", BATCH, vec![obs(FinalizerRemoval, "a", "p")])],
        ),
        (
            "controllerRef changed wakes old and new",
            p.clone(),
            moved,
            vec![
                job_q("ns/a", BATCH, vec![obs(FinalizerRemoval, "a", "p")]),
                job_q("ns/b", BATCH, vec![obs(FinalizerRemoval, "b", "p")]),
            ],
        ),
        (
            "released pod: old job, orphan cleanup, matching jobs",
            p.clone(),
            released,
            vec![job_q("ns/a", BATCH, vec![]), orphan_q("ns/p"), job_q("ns/b", BATCH, vec![])],
        ),
        (
            "orphan relabelled wakes matching jobs",
            orphan.clone(),
            orphan_relabelled,
            vec![job_q("ns/b", BATCH, vec![])],
        ),
        ("orphan unchanged labels wakes nobody", orphan.clone(), orphan_status_only, vec![]),
        ("pod of a foreign job", fp, fp_new, vec![]),
    ];
    for (name, old, new, want) in cases {
        assert_eq!(on_pod_update(&cfg(), &store, &old, &new), want, "{name}");
    }
}

// ------------------------------------------------------------------ Pod delete

#[test]
fn pod_delete_table() {
    let (a, finished, foreign, store) = three_jobs();
    let gone = mk_job("gone");

    let p = mk_pod("p", Some(&a));
    let mut p_plain = p.clone();
    p_plain.has_tracking_finalizer = false;
    let of_gone = mk_pod("g", Some(&gone));
    let of_finished = mk_pod("f1", Some(&finished));
    let mut of_finished_plain = of_finished.clone();
    of_finished_plain.has_tracking_finalizer = false;
    let orphan = mk_pod("o", None);
    let of_foreign = mk_pod("fp", Some(&foreign));

    let cases: Vec<(&str, PodInfo, bool, Vec<Enqueue>)> = vec![
        (
            "final delete",
            p.clone(),
            false,
            vec![job_q(
                "ns/a",
                BATCH,
                vec![obs(Deletion, "a", "p"), obs(FinalizerRemoval, "a", "p")],
            )],
        ),
        (
            "final delete after deletionTimestamp was observed",
            p.clone(),
            true,
            vec![job_q("ns/a", BATCH, vec![obs(FinalizerRemoval, "a", "p")])],
        ),
        (
            "tombstone without finalizer",
            p_plain,
            false,
            vec![job_q(
                "ns/a",
                BATCH,
                vec![obs(Deletion, "a", "p"), obs(FinalizerRemoval, "a", "p")],
            )],
        ),
        ("job gone", of_gone, false, vec![orphan_q("ns/g")]),
        ("job finished", of_finished, false, vec![orphan_q("ns/f1")]),
        ("job finished, no finalizer", of_finished_plain, false, vec![]),
        ("orphan with finalizer", orphan, false, vec![orphan_q("ns/o")]),
        ("pod of a foreign job", of_foreign, false, vec![]),
    ];
    for (name, pod, was_deleting, want) in cases {
        assert_eq!(on_pod_delete(&cfg(), &store, &pod, was_deleting), want, "{name}");
    }
}

#[test]
fn observations_carry_the_controller_ref_uid_of_a_recreated_job() {
    // A Job deleted and recreated under the same name: pods of the old incarnation resolve to
    // nothing and never touch the new Job's expectations.
    let new = mk_job("a");
    let mut old_incarnation = new.clone();
    old_incarnation.uid = "old-uid".into();
    let store = store_with(&[&new], &[]);
    let mut stale = mk_pod("p", Some(&old_incarnation));
    stale.has_tracking_finalizer = false;
    assert_eq!(on_pod_add(&cfg(), &store, &stale), vec![]);
    assert_eq!(on_pod_delete(&cfg(), &store, &stale, false), vec![]);
    let fresh = mk_pod("q", Some(&new));
    let out = on_pod_add(&cfg(), &store, &fresh);
    assert_eq!(out[0].observations[0].job_uid, "uid-a");
}

#[test]
fn enqueue_all_takes_managed_jobs_only() {
    let a = mk_job("a");
    let b = mk_job("b");
    let mut foreign = mk_job("c");
    foreign.managed_by = None;
    let store = store_with(&[&b, &a, &foreign], &[]);
    assert_eq!(
        enqueue_all_jobs(&cfg(), &store),
        vec![job_q("ns/a", Duration::ZERO, vec![]), job_q("ns/b", Duration::ZERO, vec![])]
    );
    let all = HandlerConfig { manage_all: true, ..cfg() };
    assert_eq!(enqueue_all_jobs(&all, &store).len(), 3);
}

// ------------------------------------------------------------------ Settled orphan entries

/// A Job's finish points out its pods that still have the finalizer only after they had a
/// moment to lose it: the re-check sends the entry when the cached pod still has it, and nothing
/// when its finalizer removal (or a namesake, or its delete) came first.
#[test]
fn settled_orphan_entries_are_rechecked_against_the_cache() {
    let (_, finished, _, _) = three_jobs();
    let kept = mk_pod("kept", Some(&finished));
    let mut released = mk_pod("released", Some(&finished));
    released.has_tracking_finalizer = false;
    let mut namesake = mk_pod("namesake", Some(&finished));
    namesake.uid = "uid-another".into();
    let store = store_with(&[&finished], &[&kept, &released, &namesake]);
    assert_eq!(recheck_settled(&store, "ns/kept", "uid-kept"), Some(orphan_q("ns/kept")));
    assert_eq!(recheck_settled(&store, "ns/released", "uid-released"), None);
    assert_eq!(recheck_settled(&store, "ns/namesake", "uid-namesake"), None);
    assert_eq!(recheck_settled(&store, "ns/gone", "uid-gone"), None);

    // A deleted Job's pods are not held back: nobody else will remove their finalizers.
    let out = on_job_delete(&cfg(), &store, &finished);
    assert!(out.contains(&orphan_q("ns/kept")), "{out:?}");
    assert!(out.iter().all(|e| !e.settle), "{out:?}");
}

/// A watcher that starts leading points out every finished Job's pod that kept the finalizer:
/// the entry the Job's finish gave may have been waiting in a watcher that stopped.
#[test]
fn takeover_points_out_finished_jobs_pods_with_the_finalizer() {
    let (a, finished, foreign, _) = three_jobs();
    let live = mk_pod("live", Some(&a));
    let of_finished = mk_pod("of-f", Some(&finished));
    let mut released = mk_pod("rel-f", Some(&finished));
    released.has_tracking_finalizer = false;
    let of_foreign = mk_pod("of-x", Some(&foreign));
    let store =
        store_with(&[&a, &finished, &foreign], &[&live, &of_finished, &released, &of_foreign]);
    assert_eq!(orphans_of_cached_pods(&cfg(), &store), vec![orphan_q("ns/of-f")]);
}
