//! Kueue and kjob sharing Jobs the second way kjob takes them (docs/ecosystem.md): kjob beside
//! upstream's Job controller, taking only Jobs whose `spec.managedBy` names it. Kueue 0.17
//! manages such a Job all the same (it decides by the queue-name label and `spec.suspend`, not
//! by `managedBy`): two Jobs of 1 CPU in a ClusterQueue of 1 CPU run one after the other, each
//! unsuspended by Kueue and run by kjob, and upstream's Job controller never writes to them.
//! (The first way, kjob with upstream's off and `--manage-all-jobs`, is the differential
//! suite's Kueue cases, compared with upstream's controller.)
//!
//! On a control plane of its own (the shared one of `make test` runs no Kueue).

use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kjob_testkit::addons::Addon;
use kjob_testkit::cluster::{
    self, ClusterInfo, ClusterOptions, ControlPlane, JobController, UPSTREAM_JOB_CONTROLLER_USER,
};
use kjob_testkit::stack::{RealServer, Stack, StackConfig};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, ListParams, PostParams};
use serde_json::{Value, json};

/// Longest the whole scenario may take once the cluster is up (two 3 s Jobs one after the
/// other, each admitted within Kueue's next scheduling pass, on a loaded 2-core machine).
const SCENARIO: Duration = Duration::from_secs(90);
/// How long each Job's pod runs.
const RUN_TIME: &str = "3s";
const NS: &str = "kueue-managed-by";

fn kueue(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "kueue.x-k8s.io".into(),
        version: "v1beta2".into(),
        api_version: "kueue.x-k8s.io/v1beta2".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

async fn create(api: &Api<DynamicObject>, v: Value) {
    let o: DynamicObject = serde_json::from_value(v).unwrap();
    api.create(&PostParams::default(), &o).await.unwrap();
}

fn job(name: &str) -> Job {
    serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "queue"}},
        "spec": {"suspend": true, "managedBy": kjob_core::DEFAULT_CONTROLLER_NAME, "template": {
            "metadata": {"annotations": {"kjob.io/sim-run-time": RUN_TIME}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox",
                "resources": {"requests": {"cpu": "1"}}}]}}}
    }))
    .unwrap()
}

fn condition(job: &Job, ty: &str) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == ty && c.status == "True"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kueue_admits_jobs_whose_managed_by_names_kjob_one_at_a_time() {
    if !cluster::go_available() {
        eprintln!("SKIP kueue_managed_by: no Go toolchain on PATH, so Kueue cannot be built");
        return;
    }
    let dir = tempfile::Builder::new().prefix("kjob-kueue-mb-").tempdir().unwrap();
    let cluster_dir = dir.path().join("cluster");
    let agent = kjob_testkit::bin_path("kjob-node-agent").expect("cargo build --bins");
    let bin_dir = agent.parent().unwrap().to_path_buf();
    let stack_dir = dir.path().join("stack");
    let (_cp, info, _stack) = tokio::task::spawn_blocking(move || {
        let mut opts = ClusterOptions::new(cluster_dir.clone(), agent);
        opts.nodes = 1;
        opts.job_controller = JobController::Upstream;
        opts.addons = vec![Addon::Kueue];
        let cp = ControlPlane::start(opts)?;
        let info = ClusterInfo::read(&cluster_dir)?;
        info.create_namespace(NS)?;
        let redis = kjob_testkit::redis::redis_server_binary()?;
        let mut cfg = StackConfig::new(bin_dir, redis, stack_dir, 1);
        cfg.real = Some(RealServer::from_cluster(&info, NS));
        // No --manage-all-jobs: kjob takes only the Jobs naming it.
        let stack = Stack::start(cfg)?;
        anyhow::Ok((cp, info, stack))
    })
    .await
    .unwrap()
    .expect("control plane with Kueue, and kjob");

    let kc = kube::config::Kubeconfig::read_from(&info.kubeconfig).unwrap();
    let client = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap(),
    )
    .unwrap();
    create(
        &Api::all_with(client.clone(), &kueue("ResourceFlavor", "resourceflavors")),
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
            "metadata": {"name": "default-flavor"}}),
    )
    .await;
    create(
        &Api::all_with(client.clone(), &kueue("ClusterQueue", "clusterqueues")),
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
            "metadata": {"name": "one-cpu"},
            "spec": {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["cpu"],
                "flavors": [{"name": "default-flavor",
                    "resources": [{"name": "cpu", "nominalQuota": "1"}]}]}]}}),
    )
    .await;
    let lqs = Api::namespaced_with(client.clone(), NS, &kueue("LocalQueue", "localqueues"));
    create(
        &lqs,
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
            "metadata": {"name": "queue", "namespace": NS}, "spec": {"clusterQueue": "one-cpu"}}),
    )
    .await;

    // A Job queued before its LocalQueue is active waits as inadmissible and is retried
    // later, so a later Job could pass it.
    let t = Instant::now();
    loop {
        let lq = lqs.get("queue").await.unwrap();
        let active = lq.data["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Active" && c["status"] == "True"));
        if active {
            break;
        }
        assert!(t.elapsed() < SCENARIO, "LocalQueue not Active within {SCENARIO:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    for name in ["first", "second"] {
        jobs.create(&PostParams::default(), &job(name)).await.unwrap();
        // Distinct creation seconds: Kueue queues by creation timestamp.
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    let t = Instant::now();
    let mut max_unsuspended = 0;
    let mut completed_order: Vec<String> = Vec::new();
    loop {
        let list = jobs.list(&ListParams::default()).await.unwrap().items;
        let running = list
            .iter()
            .filter(|j| {
                !j.spec.as_ref().unwrap().suspend.unwrap_or(false) && !condition(j, "Complete")
            })
            .count();
        max_unsuspended = max_unsuspended.max(running);
        for j in &list {
            let name = j.metadata.name.clone().unwrap();
            if condition(j, "Complete") && !completed_order.contains(&name) {
                completed_order.push(name);
            }
        }
        if completed_order.len() == 2 {
            break;
        }
        assert!(
            t.elapsed() < SCENARIO,
            "not both complete within {SCENARIO:?}: {completed_order:?} (logs in {})",
            info.dir.join("logs").display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(completed_order, ["first", "second"], "Kueue admits in creation order");
    assert_eq!(max_unsuspended, 1, "one CPU of quota: one Job unsuspended at a time");
    // Kueue made a Workload for each Job with the Job's managedBy left as it was.
    let wls =
        Api::<DynamicObject>::namespaced_with(client.clone(), NS, &kueue("Workload", "workloads"));
    assert_eq!(wls.list(&ListParams::default()).await.unwrap().items.len(), 2);
    for j in jobs.list(&ListParams::default()).await.unwrap().items {
        assert_eq!(
            j.spec.as_ref().unwrap().managed_by.as_deref(),
            Some(kjob_core::DEFAULT_CONTROLLER_NAME)
        );
    }
    // kjob made every pod: upstream's Job controller, running, skipped Jobs naming kjob.
    assert_eq!(pods.list(&ListParams::default()).await.unwrap().items.len(), 2);
    let audit = std::fs::read_to_string(&info.audit_log).unwrap();
    let upstream_writes = audit
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| {
            e["user"]["username"] == UPSTREAM_JOB_CONTROLLER_USER
                && e["objectRef"]["namespace"] == NS
                && !matches!(e["verb"].as_str(), Some("get" | "list" | "watch"))
        })
        .count();
    assert_eq!(upstream_writes, 0, "upstream's Job controller wrote in {NS}");
}
