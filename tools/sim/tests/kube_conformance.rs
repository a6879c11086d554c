//! kube-rs conformance: the watcher, finalizer helper, events Recorder and error handling of
//! kube-rs 5 must work against the simulator exactly as against a real API server.

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kjob_sim::SimConfig;
use kjob_sim::testing::TestSim;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event, watcher};
use serde_json::json;

/// Upper bound for any single wait in these tests (generous for a loaded 2-core machine).
const WAIT: Duration = Duration::from_secs(10);

async fn namespace(client: &kube::Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        ..Default::default()
    };
    api.create(&PostParams::default(), &ns).await.expect("create namespace");
}

/// A simulator started with `config`, with namespace `ns` made, and a client of it.
async fn sim_with(config: SimConfig, ns: &str) -> (TestSim, kube::Client) {
    let sim = TestSim::start(config).await;
    let client = sim.client();
    namespace(&client, ns).await;
    (sim, client)
}

/// Merge-patches pod `name` with `patch`.
async fn merge(pods: &Api<Pod>, name: &str, patch: serde_json::Value) {
    pods.patch(name, &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "busybox"}], "restartPolicy": "Never"},
    }))
    .expect("pod")
}

/// Short name of a watcher event, for sequence assertions.
fn label(e: &Event<Pod>) -> String {
    let name = |p: &Pod| p.metadata.name.clone().unwrap_or_default();
    match e {
        Event::Init => "Init".into(),
        Event::InitApply(p) => format!("InitApply:{}", name(p)),
        Event::InitDone => "InitDone".into(),
        Event::Apply(p) => format!("Apply:{}", name(p)),
        Event::Delete(p) => format!("Delete:{}", name(p)),
    }
}

async fn next_label<S>(stream: &mut S) -> String
where
    S: Stream<Item = Result<Event<Pod>, watcher::Error>> + Unpin,
{
    let e = tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("watcher event in time")
        .expect("stream open");
    match e {
        Ok(e) => label(&e),
        Err(watcher::Error::WatchError(s)) => format!("Err:{}", s.code),
        Err(other) => panic!("unexpected watcher error {other:?}"),
    }
}

async fn expect_labels<S>(stream: &mut S, want: &[&str])
where
    S: Stream<Item = Result<Event<Pod>, watcher::Error>> + Unpin,
{
    for w in want {
        assert_eq!(next_label(stream).await, *w);
    }
}

#[tokio::test]
async fn watcher_sees_init_then_apply_and_delete() {
    let (_sim, client) = sim_with(SimConfig::default(), "w1").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "w1");
    pods.create(&PostParams::default(), &pod("a")).await.unwrap();
    let mut stream = watcher(pods.clone(), watcher::Config::default()).boxed();
    expect_labels(&mut stream, &["Init", "InitApply:a", "InitDone"]).await;
    pods.create(&PostParams::default(), &pod("b")).await.unwrap();
    expect_labels(&mut stream, &["Apply:b"]).await;
    merge(&pods, "b", json!({"metadata": {"labels": {"x": "y"}}})).await;
    expect_labels(&mut stream, &["Apply:b"]).await;
    // Unscheduled pods skip the grace period: MODIFIED (deletionTimestamp) then DELETED.
    pods.delete("b", &DeleteParams::default()).await.unwrap();
    expect_labels(&mut stream, &["Apply:b", "Delete:b"]).await;
}

#[tokio::test]
async fn compaction_mid_watch_gives_one_410_and_one_relist() {
    let (sim, client) = sim_with(SimConfig::default(), "w2").await;
    namespace(&client, "other").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "w2");
    pods.create(&PostParams::default(), &pod("a")).await.unwrap();
    let mut stream = watcher(pods.clone(), watcher::Config::default()).boxed();
    expect_labels(&mut stream, &["Init", "InitApply:a", "InitDone"]).await;
    // A write elsewhere moves the revision past the watcher's; compaction then expires it.
    Api::<Pod>::namespaced(client.clone(), "other")
        .create(&PostParams::default(), &pod("z"))
        .await
        .unwrap();
    sim.compact();
    sim.close_watches();
    // kube-rs surfaces the 410 ERROR event, then relists.
    expect_labels(&mut stream, &["Err:410", "Init", "InitApply:a", "InitDone"]).await;
    pods.create(&PostParams::default(), &pod("b")).await.unwrap();
    expect_labels(&mut stream, &["Apply:b"]).await;
    let metrics = &sim.app().metrics;
    assert_eq!(metrics.total("list", "pods"), 2, "exactly one relist after the 410");
    // Reconnect after the 410 ERROR, and the two other watches: no retry storm on a stale RV.
    assert!(metrics.total("watch", "pods") <= 3, "watches: {}", metrics.total("watch", "pods"));
}

#[tokio::test]
async fn streaming_lists_end_on_the_initial_events_bookmark() {
    let (sim, client) = sim_with(SimConfig::default(), "w3").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "w3");
    pods.create(&PostParams::default(), &pod("a")).await.unwrap();
    pods.create(&PostParams::default(), &pod("b")).await.unwrap();
    let mut stream = watcher(pods.clone(), watcher::Config::default().streaming_lists()).boxed();
    expect_labels(&mut stream, &["Init", "InitApply:a", "InitApply:b", "InitDone"]).await;
    pods.create(&PostParams::default(), &pod("c")).await.unwrap();
    expect_labels(&mut stream, &["Apply:c"]).await;
    assert_eq!(sim.app().metrics.total("list", "pods"), 0, "streaming lists never LIST");
}

#[tokio::test]
async fn selector_transitions_are_added_and_deleted() {
    let (_sim, client) = sim_with(SimConfig::default(), "w4").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "w4");
    pods.create(&PostParams::default(), &pod("a")).await.unwrap();
    let mut stream = watcher(pods.clone(), watcher::Config::default().labels("app=x")).boxed();
    expect_labels(&mut stream, &["Init", "InitDone"]).await;
    let set = |v: serde_json::Value| json!({"metadata": {"labels": {"app": v}}});
    merge(&pods, "a", set(json!("x"))).await;
    expect_labels(&mut stream, &["Apply:a"]).await;
    merge(&pods, "a", set(json!("y"))).await;
    expect_labels(&mut stream, &["Delete:a"]).await;
    // Field selectors transition the same way: unscheduled pods have an empty nodeName.
    let mut by_field =
        watcher(pods.clone(), watcher::Config::default().fields("spec.nodeName=")).boxed();
    expect_labels(&mut by_field, &["Init", "InitApply:a", "InitDone"]).await;
}

#[tokio::test]
async fn finalizer_helper_adds_and_removes_its_finalizer() {
    use kube::runtime::controller::Action;
    use kube::runtime::finalizer::{Event as FEvent, finalizer};

    let (_sim, client) = sim_with(SimConfig::default(), "w5").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "w5");
    pods.create(&PostParams::default(), &pod("a")).await.unwrap();
    const NAME: &str = "kjob.io/test-finalizer";
    let run = |obj: Pod| {
        let pods = pods.clone();
        async move {
            finalizer(&pods, NAME, Arc::new(obj), |ev| async move {
                Ok::<_, std::convert::Infallible>(match ev {
                    FEvent::Apply(_) => Action::await_change(),
                    FEvent::Cleanup(_) => Action::await_change(),
                })
            })
            .await
        }
    };
    // First pass: the object has no finalizers; kube-rs tests `/metadata/finalizers` == null.
    run(pods.get("a").await.unwrap()).await.expect("finalizer added");
    let p = pods.get("a").await.unwrap();
    assert_eq!(p.metadata.finalizers.as_deref(), Some(&[NAME.to_owned()][..]));
    run(p).await.expect("apply pass");
    pods.delete("a", &DeleteParams::default()).await.unwrap();
    let p = pods.get("a").await.expect("kept by the finalizer");
    assert!(p.metadata.deletion_timestamp.is_some());
    run(p).await.expect("cleanup removes the finalizer");
    let deadline = tokio::time::Instant::now() + WAIT;
    while pods.get_opt("a").await.unwrap().is_some() {
        assert!(tokio::time::Instant::now() < deadline, "pod not removed after its finalizer went");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn recorder_creates_then_series_patches_an_event() {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use k8s_openapi::api::events::v1::Event as NewEvent;
    use kube::runtime::events::{Event as REvent, EventType, Recorder, Reporter};

    let (_sim, client) = sim_with(SimConfig::default(), "w6").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "w6");
    let p = pods.create(&PostParams::default(), &pod("a")).await.unwrap();
    let reporter = Reporter { controller: "kjob.io/test".into(), instance: Some("t-1".into()) };
    let recorder = Recorder::new(client.clone(), reporter);
    let ev = REvent {
        type_: EventType::Normal,
        reason: "Tested".into(),
        note: Some("hello".into()),
        action: "Test".into(),
        secondary: None,
    };
    let reference = kube::Resource::object_ref(&p, &());
    recorder.publish(&ev, &reference).await.expect("first publish creates");
    recorder.publish(&ev, &reference).await.expect("second publish patches the series");
    let new_events: Api<NewEvent> = Api::namespaced(client.clone(), "w6");
    let list = new_events.list(&Default::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let series = list.items[0].series.as_ref().expect("series after the repeat");
    assert_eq!(series.count, 2);
    // The same event through core/v1, with the old field names.
    let core: Api<CoreEvent> = Api::namespaced(client.clone(), "w6");
    let fs = "involvedObject.name=a,involvedObject.kind=Pod";
    let list = core.list(&kube::api::ListParams::default().fields(fs)).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].message.as_deref(), Some("hello"));
    assert_eq!(list.items[0].involved_object.name.as_deref(), Some("a"));
}

#[tokio::test]
async fn write_errors_have_the_real_status_shapes() {
    let (_sim, client) = sim_with(SimConfig::default(), "w7").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "w7");
    let created = pods.create(&PostParams::default(), &pod("a")).await.unwrap();
    let err = pods.create(&PostParams::default(), &pod("a")).await.unwrap_err();
    let kube::Error::Api(s) = err else { panic!("api error expected") };
    assert!(s.is_already_exists(), "{s:?}");
    let mut stale = created.clone();
    merge(&pods, "a", json!({"metadata": {"labels": {"v": "1"}}})).await;
    stale.metadata.labels = Some([("v".to_owned(), "2".to_owned())].into());
    let kube::Error::Api(s) = pods.replace("a", &PostParams::default(), &stale).await.unwrap_err()
    else {
        panic!("api error expected")
    };
    assert!(s.is_conflict(), "{s:?}");
    let kube::Error::Api(s) = pods.get("missing").await.unwrap_err() else {
        panic!("api error expected")
    };
    assert!(s.is_not_found());
    assert_eq!(s.message, "pods \"missing\" not found");
    let bad: Pod =
        serde_json::from_value(json!({"metadata": {"name": "bad"}, "spec": {"containers": []}}))
            .unwrap();
    let kube::Error::Api(s) = pods.create(&PostParams::default(), &bad).await.unwrap_err() else {
        panic!("api error expected")
    };
    assert!(s.is_invalid(), "{s:?}");
    let causes = s.details.as_ref().map(|d| d.causes.clone()).unwrap_or_default();
    assert!(causes.iter().any(|c| c.field == "spec.containers"), "{causes:?}");
}

#[tokio::test]
async fn lists_page_with_the_first_pages_revision() {
    let (_sim, client) = sim_with(SimConfig::default(), "w8").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "w8");
    for i in 0..5 {
        pods.create(&PostParams::default(), &pod(&format!("p{i}"))).await.unwrap();
    }
    let first = pods.list(&kube::api::ListParams::default().limit(2)).await.unwrap();
    assert_eq!(first.items.len(), 2);
    let token = first.metadata.continue_.clone().expect("continue token");
    // Concurrent writes between pages must not change the reported revision.
    pods.create(&PostParams::default(), &pod("p9")).await.unwrap();
    let second = pods
        .list(&kube::api::ListParams::default().limit(10).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(second.metadata.resource_version, first.metadata.resource_version);
    let names: Vec<_> = second.items.iter().filter_map(|p| p.metadata.name.clone()).collect();
    assert_eq!(names, ["p2", "p3", "p4", "p9"]);
    assert!(second.metadata.continue_.as_deref().is_none_or(str::is_empty));
    let all: Vec<Pod> = pods.list(&Default::default()).await.unwrap().items;
    assert_eq!(all.len(), 6);
    // A full relist through the paginating watcher helper sees every object too.
    let listed: Vec<_> = watcher(pods, watcher::Config::default().page_size(2))
        .take_while(|e| futures::future::ready(!matches!(e, Ok(Event::InitDone))))
        .try_collect()
        .await
        .unwrap();
    assert_eq!(listed.len(), 7, "Init + 6 InitApply");
}

fn job(name: &str, restart_policy: &str) -> k8s_openapi::api::batch::v1::Job {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"template": {"spec": {"restartPolicy": restart_policy,
            "containers": [{"name": "c", "image": "busybox"}]}}},
    }))
    .expect("job")
}

#[tokio::test]
async fn jobs_are_defaulted_and_invalid_jobs_get_causes() {
    use k8s_openapi::api::batch::v1::Job;

    let (_sim, client) = sim_with(SimConfig::default(), "j1").await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "j1");
    let j = jobs.create(&PostParams::default(), &job("pi", "Never")).await.unwrap();
    let uid = j.metadata.uid.clone().unwrap();
    let spec = j.spec.as_ref().unwrap();
    assert_eq!(
        (spec.parallelism, spec.completions, spec.backoff_limit),
        (Some(1), Some(1), Some(6))
    );
    let sel = spec.selector.as_ref().and_then(|s| s.match_labels.clone()).unwrap();
    assert_eq!(sel.get("batch.kubernetes.io/controller-uid"), Some(&uid));
    let tl = spec.template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap();
    assert_eq!(tl.get("job-name").map(String::as_str), Some("pi"));
    assert_eq!(j.metadata.generation, Some(1));
    // Upstream resets status to an empty JobStatus on create, which reads back as `{}`.
    assert_eq!(j.status, Some(Default::default()));

    let kube::Error::Api(s) =
        jobs.create(&PostParams::default(), &job("bad", "Always")).await.unwrap_err()
    else {
        panic!("api error expected")
    };
    assert!(s.is_invalid(), "{s:?}");
    assert!(s.message.starts_with("Job.batch \"bad\" is invalid: "), "{}", s.message);
    let d = s.details.expect("details");
    assert_eq!(d.kind, "Job");
    assert!(
        d.causes.iter().any(|c| c.field == "spec.template.spec.restartPolicy"),
        "{:?}",
        d.causes
    );

    // A spec change bumps generation; a status write through the main resource is ignored.
    let patched = jobs
        .patch(
            "pi",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"parallelism": 2}, "status": {"active": 5}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.metadata.generation, Some(2));
    assert_eq!(patched.status, Some(Default::default()));
    let st = jobs
        .patch_status(
            "pi",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"active": 1, "startTime": "2025-01-01T00:00:00Z"}})),
        )
        .await
        .unwrap();
    assert_eq!(st.status.and_then(|s| s.active), Some(1));
    assert_eq!(st.metadata.generation, Some(2));
}

async fn wait_until<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    while !f().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn owned_pod(name: &str, owner: &k8s_openapi::api::batch::v1::Job) -> Pod {
    let mut p = pod(name);
    p.metadata.owner_references =
        Some(vec![kube::Resource::controller_owner_ref(owner, &()).unwrap()]);
    p
}

#[tokio::test]
async fn job_deletion_orphans_by_default_and_collects_in_background() {
    use k8s_openapi::api::batch::v1::Job;

    let (_sim, client) = sim_with(SimConfig::default(), "g1").await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "g1");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "g1");

    // Default propagation for batch/v1 Jobs: Orphan — the pod stays, without the owner ref.
    let a = jobs.create(&PostParams::default(), &job("a", "Never")).await.unwrap();
    pods.create(&PostParams::default(), &owned_pod("a-1", &a)).await.unwrap();
    jobs.delete("a", &DeleteParams::default()).await.unwrap();
    wait_until("orphaned job gone", || async { jobs.get_opt("a").await.unwrap().is_none() }).await;
    let p = pods.get("a-1").await.unwrap();
    assert!(p.metadata.owner_references.is_none_or(|r| r.is_empty()));

    // Background: the job goes at once, the GC then deletes its pods.
    let b = jobs.create(&PostParams::default(), &job("b", "Never")).await.unwrap();
    pods.create(&PostParams::default(), &owned_pod("b-1", &b)).await.unwrap();
    jobs.delete("b", &DeleteParams::background()).await.unwrap();
    assert!(jobs.get_opt("b").await.unwrap().is_none());
    wait_until("dependent collected", || async { pods.get_opt("b-1").await.unwrap().is_none() })
        .await;

    // Foreground: the job waits (foregroundDeletion) until its blocking dependents are gone.
    let c = jobs.create(&PostParams::default(), &job("c", "Never")).await.unwrap();
    let mut held = owned_pod("c-1", &c);
    if let Some(r) = held.metadata.owner_references.as_mut() {
        r[0].block_owner_deletion = Some(true);
    }
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    pods.create(&PostParams::default(), &held).await.unwrap();
    jobs.delete("c", &DeleteParams::foreground()).await.unwrap();
    wait_until("dependent marked deleting", || async {
        pods.get("c-1").await.unwrap().metadata.deletion_timestamp.is_some()
    })
    .await;
    let j = jobs.get("c").await.expect("owner waits for its dependent");
    assert_eq!(j.metadata.finalizers.as_deref(), Some(&["foregroundDeletion".to_owned()][..]));
    merge(&pods, "c-1", json!({"metadata": {"finalizers": null}})).await;
    wait_until("owner released", || async { jobs.get_opt("c").await.unwrap().is_none() }).await;
}

#[tokio::test]
async fn namespace_deletion_empties_then_removes_the_namespace() {
    let (_sim, client) = sim_with(SimConfig::default(), "doomed").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "doomed");
    pods.create(&PostParams::default(), &pod("a")).await.unwrap();
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns = nss.get("doomed").await.unwrap();
    assert_eq!(
        ns.metadata.labels.unwrap().get("kubernetes.io/metadata.name").map(String::as_str),
        Some("doomed")
    );
    nss.delete("doomed", &DeleteParams::default()).await.unwrap();
    let kube::Error::Api(s) = pods.create(&PostParams::default(), &pod("b")).await.unwrap_err()
    else {
        panic!("api error expected")
    };
    // Either terminating (403) or already gone (404), depending on how fast the sweep ran.
    assert!(s.code == 403 || s.code == 404, "{s:?}");
    wait_until("namespace removed", || async { nss.get_opt("doomed").await.unwrap().is_none() })
        .await;
    assert!(pods.get_opt("a").await.unwrap().is_none());
}

#[tokio::test]
async fn kubelet_auto_runs_pods_to_completion() {
    let config = SimConfig {
        kubelet: kjob_sim::KubeletMode::Auto,
        kubelet_settings: kjob_sim::kubelet::KubeletConfig {
            run_time: Duration::from_millis(200),
            start_delay: Duration::from_millis(20),
            ..Default::default()
        },
        ..Default::default()
    };
    let (sim, client) = sim_with(config, "k1").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "k1");
    pods.create(&PostParams::default(), &pod("a")).await.unwrap();
    let phase = |p: &Pod| p.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
    wait_until("pod succeeded", || async { phase(&pods.get("a").await.unwrap()) == "Succeeded" })
        .await;
    let p = pods.get("a").await.unwrap();
    assert!(p.spec.as_ref().and_then(|s| s.node_name.clone()).is_some_and(|n| !n.is_empty()));
    let cs = &p.status.unwrap().container_statuses.unwrap()[0];
    assert_eq!(cs.state.as_ref().and_then(|s| s.terminated.as_ref()).map(|t| t.exit_code), Some(0));
    // Paused: a new pod is not advanced.
    sim.pause_kubelet();
    pods.create(&PostParams::default(), &pod("b")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(phase(&pods.get("b").await.unwrap()), "Pending");
    sim.resume_kubelet();
    wait_until("pod b succeeded", || async { phase(&pods.get("b").await.unwrap()) == "Succeeded" })
        .await;
}

/// PriorityClasses as kube-apiserver serves them: the two system classes exist from the start,
/// a class is defaulted (preemptionPolicy) and validated (`system-` names reserved, user values
/// at most 1,000,000,000, the value immutable), and a watch sees them.
#[tokio::test]
async fn priority_classes_are_bootstrapped_defaulted_and_validated() {
    use k8s_openapi::api::scheduling::v1::PriorityClass;
    let sim = TestSim::start(SimConfig::default()).await;
    let api: Api<PriorityClass> = Api::all(sim.client());
    let node = api.get("system-node-critical").await.unwrap();
    assert_eq!(node.value, Some(2_000_001_000));
    assert_eq!(api.get("system-cluster-critical").await.unwrap().value, Some(2_000_000_000));
    let class = |name: &str, value: i64, global: bool| -> PriorityClass {
        serde_json::from_value(json!({
            "metadata": {"name": name}, "value": value, "globalDefault": global
        }))
        .unwrap()
    };
    let pp = PostParams::default();
    let high = api.create(&pp, &class("high", 1000, false)).await.unwrap();
    assert_eq!(high.preemption_policy.as_deref(), Some("PreemptLowerPriority"));
    assert_eq!(high.global_default, None, "false is omitted");
    let refused = |e: kube::Error| match e {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("{other:?}"),
    };
    let (code, msg) =
        refused(api.create(&pp, &class("huge", 1_000_000_001, false)).await.unwrap_err());
    assert_eq!(code, 422);
    assert_eq!(
        msg,
        "PriorityClass.scheduling.k8s.io \"huge\" is invalid: value: Forbidden: maximum allowed \
         value of a user defined priority is 1000000000"
    );
    let (code, msg) = refused(api.create(&pp, &class("system-mine", 5, false)).await.unwrap_err());
    assert_eq!(code, 422);
    assert!(msg.contains("system-mine is not a known system priority class"), "{msg}");
    let patch = Patch::Merge(json!({"value": 7}));
    let (code, msg) =
        refused(api.patch("high", &PatchParams::default(), &patch).await.unwrap_err());
    assert_eq!(code, 422);
    assert!(msg.ends_with("value: Forbidden: may not be changed in an update."), "{msg}");
    let described = Patch::Merge(json!({"description": "batch that matters"}));
    api.patch("high", &PatchParams::default(), &described).await.unwrap();
    // The watcher the kjob watcher runs: the list, then a new class.
    use kube::runtime::WatchStreamExt;
    let mut events = watcher(api.clone(), watcher::Config::default()).applied_objects().boxed();
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 3 {
        let c = tokio::time::timeout(WAIT, events.try_next()).await.unwrap().unwrap().unwrap();
        seen.insert(c.metadata.name.unwrap());
    }
    api.create(&pp, &class("default-batch", 10, true)).await.unwrap();
    let (code, msg) = refused(api.create(&pp, &class("second", 20, true)).await.unwrap_err());
    assert_eq!(code, 403);
    assert_eq!(
        msg,
        "priorityclasses.scheduling.k8s.io \"second\" is forbidden: PriorityClass default-batch \
         is already marked as default. Only one default can exist"
    );
    let c = tokio::time::timeout(WAIT, events.try_next()).await.unwrap().unwrap().unwrap();
    assert_eq!((c.metadata.name.as_deref(), c.global_default), (Some("default-batch"), Some(true)));
    // The Priority admission plugin: a pod takes its class's value, a pod without a class the
    // global default's (and its name), and a class that does not exist is refused.
    namespace(&sim.client(), "prio").await;
    let pods: Api<Pod> = Api::namespaced(sim.client(), "prio");
    let with = |name: &str, spec: serde_json::Value| -> Pod {
        let mut p = serde_json::to_value(pod(name)).unwrap();
        p["spec"].as_object_mut().unwrap().extend(spec.as_object().unwrap().clone());
        serde_json::from_value(p).unwrap()
    };
    let p = pods.create(&pp, &with("high", json!({"priorityClassName": "high"}))).await.unwrap();
    assert_eq!(p.spec.as_ref().unwrap().priority, Some(1000));
    let p = pods.create(&pp, &with("plain", json!({}))).await.unwrap();
    let spec = p.spec.unwrap();
    assert_eq!(
        (spec.priority, spec.priority_class_name.as_deref()),
        (Some(10), Some("default-batch"))
    );
    let (code, msg) = refused(
        pods.create(&pp, &with("none", json!({"priorityClassName": "nope"}))).await.unwrap_err(),
    );
    assert_eq!(code, 403);
    assert_eq!(msg, "pods \"none\" is forbidden: no PriorityClass with name nope was found");
    let (code, msg) =
        refused(pods.create(&pp, &with("own", json!({"priority": 3}))).await.unwrap_err());
    assert_eq!(code, 403);
    assert!(msg.contains("the integer value of priority (3) must not be provided"), "{msg}");
    api.delete("default-batch", &DeleteParams::default()).await.unwrap();
    let p = pods.create(&pp, &with("after", json!({}))).await.unwrap();
    assert_eq!(p.spec.unwrap().priority, Some(0), "no default class: 0");
}
