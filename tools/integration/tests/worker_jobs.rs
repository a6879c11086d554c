//! Job scenarios end to end: kjob-sim (kubelet off, the test plays kubelet), redis-server, the
//! kjob-queue binary and an in-process worker. Each checks the exact status and conditions
//! upstream gives and the pod set the worker created.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{
    Driver, Fate, QueueService, WorkerHandle, condition, create_job, create_plain_job, finished,
    template,
};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kjob_testkit::server::TestServer;

const TIMEOUT: Duration = Duration::from_secs(20);

struct Env {
    server: TestServer,
    /// The test's namespace (unique on the shared real control plane).
    ns: String,
    _queue: QueueService,
    worker: Option<WorkerHandle>,
    driver: Driver,
}

async fn env(server: TestServer, ns: &str, job: &str) -> Env {
    let ns = server.namespace(ns);
    server.create_namespace(&ns).await;
    let client = server.client();
    let queue = QueueService::start();
    let worker =
        WorkerHandle::on(&server, &queue, "w1", Duration::from_secs(5), Duration::from_secs(5));
    let driver = Driver::new(client, queue.client(), &ns, job);
    Env { server, ns, _queue: queue, worker: Some(worker), driver }
}

/// Makes every pod create of the namespace fail: a ResourceQuota of `pods: 0` on the real
/// server, kjob-sim's quota fault otherwise (the same 403 Forbidden "exceeded quota").
async fn refuse_pods(e: &Env) {
    match e.server.as_sim() {
        Some(sim) => sim.app().faults.set_pod_quota_exceeded(true),
        None => {
            let quotas: kube::Api<k8s_openapi::api::core::v1::ResourceQuota> =
                kube::Api::namespaced(e.server.client(), &e.ns);
            let q = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}
            }))
            .unwrap();
            quotas.create(&Default::default(), &q).await.expect("create ResourceQuota");
            // The quota admission plugin refuses creates only once the quota controller
            // has written the quota's usage.
            common::eventually("the quota's status", TIMEOUT, || async {
                let q = quotas.get("no-pods").await.ok()?;
                q.status.and_then(|s| s.hard).filter(|h| h.contains_key("pods")).map(|_| ())
            })
            .await;
        }
    }
}

impl Env {
    /// Creates the test's Job (the one [`env`] named) with this spec; its pods never restart
    /// unless the spec brings its own template.
    async fn create(&self, mut spec: serde_json::Value) -> Job {
        if spec.get("template").is_none() {
            spec["template"] = template("Never");
        }
        let manifest = serde_json::json!({"metadata": {"name": self.driver.job}, "spec": spec});
        create_job(&self.server.client(), &self.ns, manifest).await
    }

    /// Checks the pods of the finished `job` ([`check_pods`]), then stops the worker.
    async fn finish(self, job: &Job, want_total: usize) {
        check_pods(&self.driver, job, want_total).await;
        self.stop().await;
    }

    async fn stop(mut self) {
        if let Some(w) = self.worker.take() {
            w.stop().await;
        }
    }
}

/// The Job's True condition of `type_`, checked to have this reason and message.
fn assert_condition<'a>(
    job: &'a Job,
    type_: &str,
    reason: &str,
    message: &str,
) -> &'a k8s_openapi::api::batch::v1::JobCondition {
    let c = condition(job, type_).unwrap_or_else(|| panic!("no {type_}=True condition"));
    assert_eq!((c.reason.as_deref(), c.message.as_deref()), (Some(reason), Some(message)));
    c
}

fn status(job: &Job) -> &k8s_openapi::api::batch::v1::JobStatus {
    job.status.as_ref().expect("status")
}

/// (succeeded, failed, active) with the API's omitted zeros read as 0 (Go `omitempty`).
fn counts(job: &Job) -> (i32, i32, i32) {
    let s = status(job);
    (s.succeeded.unwrap_or(0), s.failed.unwrap_or(0), s.active.unwrap_or(0))
}

fn index_of(p: &Pod) -> Option<String> {
    p.metadata.annotations.as_ref()?.get(kjob_core::JOB_COMPLETION_INDEX_ANNOTATION).cloned()
}

/// Checks what every pod of a finished Job must look like.
async fn check_pods(d: &Driver, job: &Job, want_total: usize) -> Vec<Pod> {
    let pods = d.pods().await;
    assert_eq!(d.all_pods.len(), want_total, "pods ever created: {:?}", d.all_pods);
    let uid = job.metadata.uid.clone().unwrap();
    for p in &pods {
        let labels = p.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get(kjob_core::CONTROLLER_UID_LABEL), Some(&uid));
        assert_eq!(labels.get(kjob_core::JOB_NAME_LABEL), job.metadata.name.as_ref());
        let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("Job", uid.as_str(), Some(true))
        );
        assert!(!common::has_finalizer(p), "{:?} kept its tracking finalizer", p.metadata.name);
    }
    pods
}

async fn non_indexed_completes(server: TestServer) {
    let mut e = env(server, "nonindexed", "pi").await;
    create_plain_job(&e.server.client(), &e.ns, "pi", 3, 2).await;
    let job = e.driver.run_until(TIMEOUT, &mut |_| Fate::Succeed, &mut finished).await;
    let s = status(&job);
    assert_eq!(counts(&job), (3, 0, 0));
    assert_eq!(s.ready.unwrap_or(0), 0);
    assert_eq!(s.terminating.unwrap_or(0), 0);
    let c = assert_condition(
        &job,
        "Complete",
        "CompletionsReached",
        "Reached expected number of succeeded pods",
    );
    assert!(condition(&job, "SuccessCriteriaMet").is_some());
    assert_eq!(
        s.completion_time.as_ref().map(|t| t.0),
        Some(c.last_transition_time.as_ref().unwrap().0)
    );
    let u = s.uncounted_terminated_pods.as_ref().unwrap();
    assert!(
        u.succeeded.as_ref().is_none_or(|v| v.is_empty())
            && u.failed.as_ref().is_none_or(|v| v.is_empty())
    );
    let pods = check_pods(&e.driver, &job, 3).await;
    assert!(pods.iter().all(|p| p.metadata.name.as_ref().unwrap().starts_with("pi-")));
    // Events go through events.k8s.io/v1 with the upstream reasons, best effort and async.
    let events: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(e.server.client(), &e.ns);
    let reasons = common::eventually("events", TIMEOUT, || {
        let events = events.clone();
        async move {
            let list = events.list(&Default::default()).await.ok()?;
            let reasons: Vec<String> =
                list.items.iter().filter_map(|ev| ev.reason.clone()).collect();
            (reasons.iter().filter(|r| *r == "SuccessfulCreate").count() == 3
                && reasons.iter().any(|r| r == "Completed"))
            .then_some(list.items)
        }
    })
    .await;
    for ev in &reasons {
        assert_eq!(ev.reporting_controller.as_deref(), Some(kjob_core::DEFAULT_CONTROLLER_NAME));
        assert_eq!(ev.regarding.as_ref().and_then(|r| r.name.as_deref()), Some("pi"));
        if ev.reason.as_deref() == Some("SuccessfulCreate") {
            assert!(ev.note.as_deref().unwrap().starts_with("Created pod: pi-"), "{ev:?}");
        }
    }
    // The counters move just after the API writes they count: wait (bounded) for all of them.
    let want = [
        r#"job_controller_jobs_finished_total{completion_mode="NonIndexed",result="succeeded",reason="CompletionsReached"} 1"#,
        r#"job_controller_job_pods_finished_total{completion_mode="NonIndexed",result="succeeded"} 3"#,
        r#"job_controller_terminated_pods_tracking_finalizer_total{event="delete"} 3"#,
        r#"job_controller_terminated_pods_tracking_finalizer_total{event="add"} 3"#,
        r#"job_controller_job_pods_creation_total{reason="new",status="succeeded"} 3"#,
    ];
    let worker = e.worker.as_ref().unwrap();
    let found = common::eventually("the finished Job's metrics", TIMEOUT, || async {
        let (code, metrics) = worker.admin_get("/metrics").await;
        (code == 200 && want.iter().all(|l| metrics.contains(l))).then_some(metrics)
    })
    .await;
    assert!(found.contains("job_controller_job_syncs_total{"), "{found}");
    e.stop().await;
}

async fn indexed_completes_with_every_index(server: TestServer) {
    let mut e = env(server, "indexed", "ix").await;
    e.create(serde_json::json!({
        "completions": 3, "parallelism": 3, "completionMode": "Indexed"
    }))
    .await;
    let job = e.driver.run_until(TIMEOUT, &mut |_| Fate::Succeed, &mut finished).await;
    let s = status(&job);
    assert_eq!(s.completed_indexes.as_deref(), Some("0-2"));
    assert_eq!((counts(&job).0, counts(&job).1), (3, 0));
    assert!(condition(&job, "Complete").is_some());
    let pods = check_pods(&e.driver, &job, 3).await;
    let indexes: BTreeSet<String> = pods.iter().filter_map(index_of).collect();
    assert_eq!(indexes, ["0", "1", "2"].map(String::from).into());
    for p in &pods {
        let i = index_of(p).unwrap();
        let labels = p.metadata.labels.as_ref().unwrap();
        assert_eq!(labels.get(kjob_core::JOB_COMPLETION_INDEX_ANNOTATION), Some(&i));
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.hostname.as_deref(), Some(format!("ix-{i}").as_str()));
        let env = spec.containers[0].env.as_ref().unwrap();
        assert!(env.iter().any(|v| v.name == kjob_core::JOB_COMPLETION_INDEX_ENV), "{env:?}");
        assert!(p.metadata.name.as_ref().unwrap().starts_with(&format!("ix-{i}-")));
    }
    e.stop().await;
}

async fn work_queue_completes_when_all_pods_are_done(server: TestServer) {
    let mut e = env(server, "workqueue", "wq").await;
    e.create(serde_json::json!({"parallelism": 2})).await;
    let job = e.driver.run_until(TIMEOUT, &mut |_| Fate::Succeed, &mut finished).await;
    assert_eq!(counts(&job), (2, 0, 0));
    assert!(condition(&job, "Complete").is_some());
    e.finish(&job, 2).await;
}

/// `manualSelector: true` with `selector: {}` is synced as upstream does (an empty selector
/// selects every pod of the namespace), not refused.
async fn manual_empty_selector_runs(server: TestServer) {
    let mut e = env(server, "manualsel", "es").await;
    let mut tmpl = template("Never");
    tmpl["metadata"] = serde_json::json!({"labels": {kjob_core::JOB_NAME_LABEL: "es"}});
    e.create(serde_json::json!({
        "completions": 2, "parallelism": 2, "manualSelector": true,
        "selector": {}, "template": tmpl
    }))
    .await;
    let job = e.driver.run_until(TIMEOUT, &mut |_| Fate::Succeed, &mut finished).await;
    assert_eq!(job.spec.as_ref().unwrap().selector, Some(Default::default()));
    assert_eq!(counts(&job), (2, 0, 0));
    assert!(condition(&job, "Complete").is_some());
    assert_eq!(e.driver.all_pods.len(), 2);
    e.stop().await;
}

/// A selector whose value is the word `in` (`grp=in` on the wire) lists the Job's pods as on a
/// real server.
async fn selector_value_in_runs(server: TestServer) {
    let mut e = env(server, "selin", "si").await;
    let mut tmpl = template("Never");
    tmpl["metadata"] =
        serde_json::json!({"labels": {kjob_core::JOB_NAME_LABEL: "si", "grp": "in"}});
    e.create(serde_json::json!({
        "completions": 1, "manualSelector": true,
        "selector": {"matchLabels": {"grp": "in"}}, "template": tmpl
    }))
    .await;
    let job = e.driver.run_until(TIMEOUT, &mut |_| Fate::Succeed, &mut finished).await;
    assert_eq!(counts(&job), (1, 0, 0));
    assert!(condition(&job, "Complete").is_some());
    e.stop().await;
}

/// A Job deleted and recreated under the same name starts without its predecessor's
/// pod-failure backoff (upstream drops the record when the Job is deleted). The delete here is
/// seen by no sync (no watcher runs), so only the record's Job UID tells the two apart.
async fn recreated_job_does_not_inherit_pod_failure_backoff(server: TestServer) {
    let mut e = env(server, "recreate", "rc").await;
    let ns = e.ns.clone();
    let ns = ns.as_str();
    let manifest = serde_json::json!({
        "metadata": {"name": "rc"},
        "spec": {"completions": 1, "backoffLimit": 6, "template": template("Never")}
    });
    let first = create_job(&e.server.client(), ns, manifest.clone()).await;
    // One failed pod: the next pod of this Job waits 10 s (DefaultJobPodFailureBackOff).
    e.driver.run_until(TIMEOUT, &mut |_| Fate::Fail(1), &mut |j| counts(j).1 == 1).await;
    let key = format!("{ns}/rc");
    common::eventually("the first Job's backoff record", TIMEOUT, || async {
        let r = e.driver.queue.get_record(&key, kjob_worker::sync::BACKOFF_RECORD).await.ok()?;
        r.filter(|b| !b.is_empty())
    })
    .await;
    let jobs: kube::Api<Job> = kube::Api::namespaced(e.server.client(), ns);
    jobs.delete("rc", &kube::api::DeleteParams::background()).await.unwrap();
    common::eventually("the first Job gone", TIMEOUT, || async {
        jobs.get_opt("rc").await.unwrap().is_none().then_some(())
    })
    .await;
    let second = create_job(&e.server.client(), ns, manifest).await;
    assert_ne!(first.metadata.uid, second.metadata.uid);
    let mut driver = Driver::new(e.server.client(), e.driver.queue.clone(), ns, "rc");
    let started = std::time::Instant::now();
    let job = driver.run_until(TIMEOUT, &mut |_| Fate::Succeed, &mut finished).await;
    assert_eq!(job.metadata.uid, second.metadata.uid);
    assert_eq!(counts(&job), (1, 0, 0));
    let took = started.elapsed();
    assert!(took < Duration::from_secs(6), "the recreated Job waited {took:?} for its first pod");
    e.stop().await;
}

/// `activeDeadlineSeconds` fires on time although every sync fails (a quota refuses each pod
/// create): the deadline's requeue is kept beside the rate-limited one, as upstream's AddAfter
/// is. The key is enqueued once, as the watcher's Job add handler does; no driver runs (its
/// enqueues would bring the key back sooner than the rate limiter does).
async fn deadline_fires_on_time_while_syncs_fail(server: TestServer) {
    let e = env(server, "deadline-quota", "dq").await;
    let ns = e.ns.clone();
    let ns = ns.as_str();
    refuse_pods(&e).await;
    e.create(serde_json::json!({"completions": 1, "activeDeadlineSeconds": 8})).await;
    let created = std::time::Instant::now();
    let item = kjob_queue_client::AddItem {
        queue: kjob_core::JOB_QUEUE.into(),
        key: format!("{ns}/dq"),
        ..Default::default()
    };
    e.driver.queue.add(vec![item]).await.unwrap();
    // Failed syncs come back after 1, 2, 4, 8 s of rate limiting (at 1, 3, 7, 15 s): without the
    // deadline's own requeue the Job would fail at 15 s, not 8.
    let job = common::eventually("the Job failed", Duration::from_secs(30), || async {
        e.driver.get_job().await.filter(|j| condition(j, "Failed").is_some())
    })
    .await;
    let took = created.elapsed();
    let failed = condition(&job, "Failed").unwrap();
    assert_eq!(failed.reason.as_deref(), Some("DeadlineExceeded"));
    assert!(e.driver.pods().await.is_empty(), "every create was refused");
    assert!(took < Duration::from_secs(12), "the 8 s deadline fired after {took:?}");
    e.stop().await;
}

async fn pod_failure_policy_fail_job(server: TestServer) {
    let mut e = env(server, "pfp-failjob", "fj").await;
    e.create(serde_json::json!({
        "completions": 1, "parallelism": 1, "backoffLimit": 6,
        "podFailurePolicy": {"rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}}
        ]}
    }))
    .await;
    let job = e.driver.run_until(TIMEOUT, &mut |_| Fate::Fail(42), &mut finished).await;
    assert_eq!(counts(&job), (0, 1, 0));
    let failed = condition(&job, "Failed").expect("Failed");
    let target = condition(&job, "FailureTarget").expect("FailureTarget");
    assert_eq!(failed.reason.as_deref(), Some("PodFailurePolicy"));
    let pod_name = e.driver.all_pods.values().next().unwrap().clone();
    let ns = &e.ns;
    let msg = format!(
        "Container main for pod {ns}/{pod_name} failed with exit code 42 matching FailJob rule at index 0"
    );
    assert_eq!(failed.message.as_deref(), Some(msg.as_str()));
    assert_eq!(target.message, failed.message);
    e.finish(&job, 1).await;
}

async fn pod_failure_policy_ignore(server: TestServer) {
    let mut e = env(server, "pfp-ignore", "ig").await;
    e.create(serde_json::json!({
        "completions": 1, "parallelism": 1, "backoffLimit": 0,
        "podFailurePolicy": {"rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
        ]}
    }))
    .await;
    let mut first = None::<String>;
    let mut fate = |p: &Pod| {
        let uid = p.metadata.uid.clone().unwrap();
        if first.get_or_insert(uid.clone()) == &uid { Fate::Disrupt } else { Fate::Succeed }
    };
    // The ignored failure still starts the 10 s pod-failure backoff before the replacement.
    let job = e.driver.run_until(TIMEOUT, &mut fate, &mut finished).await;
    assert_eq!((counts(&job).0, counts(&job).1), (1, 0), "the disruption is not counted");
    assert!(condition(&job, "Complete").is_some());
    e.finish(&job, 2).await;
}

async fn backoff_limit_exceeded(server: TestServer) {
    let mut e = env(server, "backoff", "bo").await;
    e.create(serde_json::json!({"completions": 1, "parallelism": 1, "backoffLimit": 1})).await;
    let job = e.driver.run_until(TIMEOUT, &mut |_| Fate::Fail(1), &mut finished).await;
    assert_eq!(counts(&job), (0, 2, 0));
    assert_condition(
        &job,
        "Failed",
        "BackoffLimitExceeded",
        "Job has reached the specified backoff limit",
    );
    e.finish(&job, 2).await;
}

async fn backoff_limit_per_index_with_max_failed_indexes(server: TestServer) {
    let mut e = env(server, "perindex", "pi").await;
    e.create(serde_json::json!({
        "completions": 3, "parallelism": 3, "completionMode": "Indexed",
        "backoffLimitPerIndex": 0, "maxFailedIndexes": 1
    }))
    .await;
    let mut fate =
        |p: &Pod| if index_of(p).as_deref() == Some("1") { Fate::Fail(1) } else { Fate::Succeed };
    let job = e.driver.run_until(TIMEOUT, &mut fate, &mut finished).await;
    let s = status(&job);
    assert_eq!(s.failed_indexes.as_deref(), Some("1"));
    assert_eq!(s.completed_indexes.as_deref(), Some("0,2"));
    assert_eq!((counts(&job).0, counts(&job).1), (2, 1));
    assert_condition(&job, "Failed", "FailedIndexes", "Job has failed indexes");
    e.finish(&job, 3).await;
}

async fn success_policy_completes_early(server: TestServer) {
    let mut e = env(server, "successpolicy", "sp").await;
    e.create(serde_json::json!({
        "completions": 3, "parallelism": 3, "completionMode": "Indexed",
        "successPolicy": {"rules": [{"succeededIndexes": "0"}]}
    }))
    .await;
    // Index 0 succeeds only a full driver round after all three pods were seen, so their
    // creations are observed when the success policy matches. Otherwise upstream's own rule
    // applies (and kjob follows it): with expectations unsatisfied the finishing sync deletes
    // the other pods but cannot declare the Job finished, so the next sync counts those
    // deleted pods as failed — a race of a slow machine, not the outcome this test is about.
    let mut seen = std::collections::BTreeSet::new();
    let mut ready_rounds = 0;
    let mut fate = |p: &Pod| {
        seen.insert(p.metadata.name.clone().unwrap_or_default());
        if index_of(p).as_deref() != Some("0") {
            return Fate::Run;
        }
        if seen.len() >= 3 {
            ready_rounds += 1;
        }
        if ready_rounds >= 2 { Fate::Succeed } else { Fate::Run }
    };
    let job = e.driver.run_until(TIMEOUT, &mut fate, &mut finished).await;
    let s = status(&job);
    assert_condition(&job, "Complete", "SuccessPolicy", "Matched rules at index 0");
    assert_eq!(s.completed_indexes.as_deref(), Some("0"));
    assert_eq!(counts(&job), (1, 0, 0));
    e.finish(&job, 3).await;
}

async fn active_deadline_fails_the_job(server: TestServer) {
    let mut e = env(server, "deadline", "dl").await;
    e.create(serde_json::json!({
        "completions": 2, "parallelism": 2, "activeDeadlineSeconds": 2
    }))
    .await;
    let job = e.driver.run_until(TIMEOUT, &mut |_| Fate::Run, &mut finished).await;
    assert_condition(
        &job,
        "Failed",
        "DeadlineExceeded",
        "Job was active longer than specified deadline",
    );
    assert_eq!(counts(&job), (0, 2, 0));
    e.finish(&job, 2).await;
}

async fn suspend_then_resume(server: TestServer) {
    let mut e = env(server, "suspend", "su").await;
    let client = e.server.client();
    e.create(serde_json::json!({"completions": 1, "parallelism": 1, "suspend": true})).await;
    // A Job created suspended gets no pods, no startTime and no Suspended condition... until
    // manageJob runs once: then Suspended=True (JobSuspended).
    let job = e
        .driver
        .run_until(TIMEOUT, &mut |_| Fate::Succeed, &mut |j| condition(j, "Suspended").is_some())
        .await;
    let c = condition(&job, "Suspended").unwrap();
    assert_eq!(
        (c.reason.as_deref(), c.message.as_deref()),
        (Some("JobSuspended"), Some("Job suspended"))
    );
    assert!(status(&job).start_time.is_none());
    assert!(e.driver.pods().await.is_empty());
    let jobs: kube::Api<Job> = kube::Api::namespaced(client, &e.ns);
    let patch = serde_json::json!({"spec": {"suspend": false}});
    jobs.patch("su", &Default::default(), &kube::api::Patch::Merge(&patch)).await.unwrap();
    let job = e.driver.run_until(TIMEOUT, &mut |_| Fate::Succeed, &mut finished).await;
    let resumed = job
        .status
        .as_ref()
        .unwrap()
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == "Suspended")
        .expect("Suspended condition kept");
    assert_eq!(resumed.status, "False");
    assert_eq!(
        (resumed.reason.as_deref(), resumed.message.as_deref()),
        (Some("JobResumed"), Some("Job resumed"))
    );
    assert!(status(&job).start_time.is_some());
    assert_eq!(counts(&job).0, 1);
    e.finish(&job, 1).await;
}

async fn pod_replacement_policy_failed_waits_for_terminating_pods(server: TestServer) {
    let mut e = env(server, "replacement", "rp").await;
    let client = e.server.client();
    e.create(serde_json::json!({
        "completions": 1, "parallelism": 1, "backoffLimit": 2,
        "podReplacementPolicy": "Failed"
    }))
    .await;
    // The Job has no status until the worker's first write: read the fields through Options
    // (a bare `status(j)` here panicked whenever the first check beat that write).
    let ready = &mut |j: &Job| j.status.as_ref().and_then(|s| s.ready) == Some(1);
    let first = e.driver.run_until(TIMEOUT, &mut |_| Fate::Run, ready).await;
    assert_eq!(counts(&first), (0, 0, 1));
    // Delete the running pod; it keeps terminating (the test kubelet holds it).
    e.driver.hold_terminating = true;
    let name = e.driver.pods().await[0].metadata.name.clone().unwrap();
    let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), &e.ns);
    pods.delete(&name, &Default::default()).await.unwrap();
    let terminating = &mut |j: &Job| j.status.as_ref().and_then(|s| s.terminating) == Some(1);
    let job = e.driver.run_until(TIMEOUT, &mut |_| Fate::Run, terminating).await;
    assert_eq!(counts(&job), (0, 0, 0));
    // "No replacement" is only shown by syncs that ran: wait (bounded) until the worker has
    // finished three more syncs of the Job while the pod terminates, then look at the pods.
    let worker = e.worker.as_ref().unwrap();
    let syncs_before = worker.job_syncs().await;
    let deadline = std::time::Instant::now() + TIMEOUT;
    while worker.job_syncs().await < syncs_before + 3.0 {
        assert!(std::time::Instant::now() < deadline, "the worker stopped syncing the Job");
        e.driver.step(&mut |_| Fate::Run).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    e.driver.step(&mut |_| Fate::Run).await;
    assert_eq!(e.driver.all_pods.len(), 1, "replaced before the old pod terminated");
    // Let it terminate (Failed): it is counted, and after the 10 s pod-failure backoff a
    // replacement runs and succeeds.
    e.driver.hold_terminating = false;
    let job =
        e.driver.run_until(Duration::from_secs(30), &mut |_| Fate::Succeed, &mut finished).await;
    assert_eq!(counts(&job), (1, 1, 0));
    assert!(condition(&job, "Complete").is_some());
    e.finish(&job, 2).await;
}

/// A sync that creates all its pods in one batch raises their expectations with its lease's
/// Done, after the creates: the record expects the pod until the watcher's observation of it
/// lowers it, and only a lease expiry (not a Done) leaves no record.
async fn expectations_of_one_batch_are_raised_after_the_creates(server: TestServer) {
    let mut e = env(server, "raised", "one").await;
    let job = create_plain_job(&e.server.client(), &e.ns, "one", 1, 1).await;
    let uid = job.metadata.uid.clone().unwrap();
    let key = format!("{}/one", e.ns);
    let queue = e.driver.queue.clone();
    // Enqueue the Job without observing anything: the driver sees no pod yet.
    let item = kjob_queue_client::AddItem {
        queue: kjob_core::JOB_QUEUE.into(),
        key: key.clone(),
        ..Default::default()
    };
    queue.add(vec![item]).await.unwrap();
    let record = common::eventually("the record raised by the Done", TIMEOUT, || async {
        let r = queue.get_expectations(&key, &uid).await.ok()?;
        r.exists.then_some(r)
    })
    .await;
    assert_eq!((record.add, record.del, record.satisfied), (1, 0, false), "{record:?}");
    assert_eq!(e.driver.pods().await.len(), 1, "the pod was created before the record");
    // The observation of that pod satisfies it, and the Job runs to completion.
    let job = e.driver.run_until(TIMEOUT, &mut |_| Fate::Succeed, &mut finished).await;
    let after = queue.get_expectations(&key, &uid).await.unwrap();
    assert!(after.satisfied, "{after:?}");
    assert_eq!(counts(&job), (1, 0, 0));
    e.finish(&job, 1).await;
}

/// A worker in this process (no lease loop: the test calls its syncs), its event writer's task
/// and the registry of its metrics.
fn in_process_worker(
    server: &TestServer,
    queue: &QueueService,
) -> (kjob_worker::Worker, tokio::task::JoinHandle<()>, prometheus_client::registry::Registry) {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = kjob_worker::metrics::Metrics::new(&mut registry);
    let api = kjob_worker::kube_api::KubeApi::new(server.client(), 100.0, 100, metrics.clone());
    let (events, writer) = kjob_worker::events::EventSink::new(
        api.clone(),
        kjob_core::DEFAULT_CONTROLLER_NAME,
        "t",
        metrics.clone(),
    );
    let writer = tokio::spawn(writer.run());
    let name = kjob_core::DEFAULT_CONTROLLER_NAME.to_string();
    let worker = kjob_worker::Worker::new(api, queue.client(), events, metrics, name, false);
    (worker, writer, registry)
}

/// A work queue's success decided from the shared view while the view misses a pod the Job
/// created (its expectations unsatisfied) is checked against a LIST first: the pod still runs,
/// so the Job is not finished (planning from the view alone, the sync would mark it so and the
/// running pod's success would never be counted).
async fn a_success_the_view_shows_with_pods_unobserved_is_checked_by_a_list(server: TestServer) {
    let ns = server.namespace("unseen");
    server.create_namespace(&ns).await;
    let queue = QueueService::start();
    let (worker, writer, registry) = in_process_worker(&server, &queue);
    let never = tokio_util::sync::CancellationToken::new();
    let client = server.client();
    let manifest = serde_json::json!({"metadata": {"name": "wq"},
        "spec": {"parallelism": 2, "template": template("Never")}});
    let job = create_job(&client, &ns, manifest).await;
    let key = format!("{ns}/wq");
    let sync = |view: Option<kjob_queue_client::JobView>| {
        let (worker, never, key) = (&worker, &never, key.clone());
        async move {
            let key = kjob_core::ObjectKey::parse(&key).unwrap();
            let job = kjob_worker::LeasedJob::without_done(key, view);
            worker.sync_leased(kjob_core::JOB_QUEUE, job, never).await.outcome
        }
    };
    // A first sync (from the API server) creates both pods; one succeeds.
    sync(None).await.unwrap();
    let pods_api: kube::Api<Pod> = kube::Api::namespaced(client.clone(), &ns);
    let lp = kube::api::ListParams::default().labels("batch.kubernetes.io/job-name=wq");
    let pods = pods_api.list(&lp).await.unwrap().items;
    assert_eq!(pods.len(), 2);
    common::set_phase(&pods_api, &pods[0], &Fate::Succeed).await;
    let done = pods_api.get(pods[0].metadata.name.as_deref().unwrap()).await.unwrap();
    // The view the watcher would hold had it observed only that pod: the other one missing,
    // one creation still expected.
    let jobs_api: kube::Api<Job> = kube::Api::namespaced(client.clone(), &ns);
    let job = jobs_api.get("wq").await.unwrap_or(job);
    let uid = job.metadata.uid.clone().unwrap();
    // Sealed as the watcher seals it (the in-process worker opens with the development key).
    let seal = kjob_core::seal::ViewKey::insecure_development();
    let (job_kind, pod_kind) = (kjob_core::seal::EntryKind::Job, kjob_core::seal::EntryKind::Pod);
    let view = kjob_queue_client::JobView {
        trusted: true,
        job: seal.seal(job_kind, &key, &serde_json::to_vec(&job).unwrap()),
        pods: vec![seal.seal(pod_kind, &key, &serde_json::to_vec(&done).unwrap())],
        expectations: Some(kjob_queue_client::JobExpectations {
            satisfied: false,
            exists: true,
            add: 1,
            ..Default::default()
        }),
        job_uid: uid,
        ..Default::default()
    };
    sync(Some(view)).await.unwrap();
    let job = jobs_api.get("wq").await.unwrap();
    let st = status(&job);
    let conditions: Vec<&str> = st.conditions.iter().flatten().map(|c| c.type_.as_str()).collect();
    assert!(conditions.is_empty(), "finished while a pod runs: {conditions:?}");
    assert_eq!((st.active, st.succeeded), (Some(1), Some(1)), "{st:?}");
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let line = "kjob_worker_job_view_reads_total{result=\"unobserved_creations\"} 1";
    assert!(text.lines().any(|l| l == line), "{text}");
    drop(worker);
    writer.abort();
}

/// A test that drives one in-process worker's syncs by hand, in a namespace of its own.
struct ByHand {
    ns: String,
    queue: QueueService,
    worker: kjob_worker::Worker,
    writer: tokio::task::JoinHandle<()>,
    _registry: prometheus_client::registry::Registry,
    never: tokio_util::sync::CancellationToken,
    pods: kube::Api<Pod>,
}

impl ByHand {
    async fn start(server: &TestServer, name: &str) -> Self {
        let ns = server.namespace(name);
        server.create_namespace(&ns).await;
        let queue = QueueService::start();
        let (worker, writer, _registry) = in_process_worker(server, &queue);
        let never = tokio_util::sync::CancellationToken::new();
        let pods = kube::Api::namespaced(server.client(), &ns);
        Self { ns, queue, worker, writer, _registry, never, pods }
    }

    /// One sync of Job `key` (from the API server), as a lease ending with a Done runs it
    /// (`done`) or as one without: what it owes.
    async fn sync(&self, key: &str, done: bool) -> kjob_worker::context::Owed {
        let key = kjob_core::ObjectKey::parse(key).unwrap();
        let job = match done {
            true => kjob_worker::LeasedJob::new(key, None),
            false => kjob_worker::LeasedJob::without_done(key, None),
        };
        let r = self.worker.sync_leased(kjob_core::JOB_QUEUE, job, &self.never).await;
        r.outcome.unwrap();
        r.owed
    }

    /// The pods of Job `job_name`.
    async fn pods_of(&self, job_name: &str) -> Vec<Pod> {
        let lp = kube::api::ListParams::default()
            .labels(&format!("batch.kubernetes.io/job-name={job_name}"));
        self.pods.list(&lp).await.unwrap().items
    }

    fn stop(self) {
        drop(self.worker);
        self.writer.abort();
    }
}

/// A sync leaves the record of the pods it creates to its lease's Done, with their UIDs: none
/// is raised before the creates.
async fn a_sync_owes_its_done_the_record_of_its_creations(server: TestServer) {
    let h = ByHand::start(&server, "owed").await;
    let job_name = "after";
    let job = create_plain_job(&server.client(), &h.ns, job_name, 1, 1).await;
    let uid = job.metadata.uid.clone().unwrap();
    let key = format!("{}/{job_name}", h.ns);
    let owed = h.sync(&key, true).await.expectations;
    let created = h.pods_of(job_name).await;
    assert_eq!(created.len(), 1, "{job_name}");
    let record = h.queue.client().get_expectations(&key, &uid).await.unwrap();
    assert!(!record.exists, "{record:?}");
    let owed = owed.expect("the record is owed to the Done");
    assert_eq!(
        (owed.key.as_str(), owed.job_uid.as_str(), owed.add, owed.del),
        (key.as_str(), uid.as_str(), 1, 0)
    );
    assert_eq!(owed.created_pod_uids, vec![created[0].metadata.uid.clone().unwrap()]);
    h.stop();
}

/// A sync that counts a finished pod leaves the expectation of its finalizer's removal to its
/// lease's Done; a sync without a Done expects the removal before making it, as upstream.
async fn a_sync_owes_its_done_the_finalizer_removals_it_makes(server: TestServer) {
    let h = ByHand::start(&server, "removals").await;
    for (job_name, deferrable) in [("first", false), ("after", true)] {
        let job = create_plain_job(&server.client(), &h.ns, job_name, 1, 1).await;
        let uid = job.metadata.uid.clone().unwrap();
        let key = format!("{}/{job_name}", h.ns);
        // The first sync creates the pod (its record, owed to a Done, is dropped: no watcher
        // runs here to observe the creation).
        let owed = h.sync(&key, deferrable).await;
        assert!(owed.expectations.is_some(), "{job_name}");
        let created = h.pods_of(job_name).await;
        assert_eq!(created.len(), 1, "{job_name}");
        let pod_uid = created[0].metadata.uid.clone().unwrap();
        common::set_phase(&h.pods, &created[0], &Fate::Succeed).await;
        // The second counts it: status, finalizer removal, status.
        let owed = h.sync(&key, deferrable).await.removals;
        let pod = h.pods.get(created[0].metadata.name.as_deref().unwrap()).await.unwrap();
        let finalizers = pod.metadata.finalizers.unwrap_or_default();
        assert!(!finalizers.iter().any(|f| f == "batch.kubernetes.io/job-tracking"));
        let exp = h.queue.client().get_expectations(&key, &uid).await.unwrap();
        if deferrable {
            assert!(exp.finalizer_removals.is_empty(), "{exp:?}");
            let owed = owed.expect("the removal is owed to the Done");
            assert_eq!((owed.key.as_str(), owed.job_uid.as_str()), (key.as_str(), uid.as_str()));
            assert_eq!(owed.pod_uids, vec![pod_uid]);
        } else {
            assert_eq!(owed, None);
            assert_eq!(exp.finalizer_removals, vec![pod_uid]);
        }
    }
    h.stop();
}

kjob_testkit::on_both_servers!(kjob_sim::SimConfig::default();
    non_indexed_completes,
    indexed_completes_with_every_index,
    work_queue_completes_when_all_pods_are_done,
    manual_empty_selector_runs,
    selector_value_in_runs,
    recreated_job_does_not_inherit_pod_failure_backoff,
    deadline_fires_on_time_while_syncs_fail,
    pod_failure_policy_fail_job,
    pod_failure_policy_ignore,
    backoff_limit_exceeded,
    backoff_limit_per_index_with_max_failed_indexes,
    success_policy_completes_early,
    active_deadline_fails_the_job,
    suspend_then_resume,
    pod_replacement_policy_failed_waits_for_terminating_pods,
    expectations_of_one_batch_are_raised_after_the_creates,
    a_sync_owes_its_done_the_record_of_its_creations,
    a_sync_owes_its_done_the_finalizer_removals_it_makes,
    a_success_the_view_shows_with_pods_unobserved_is_checked_by_a_list,
);
