//! Running cases: one control plane per controller, both up at once, each case in its own
//! namespace on each, several cases at a time.
//!
//! Reusing one control plane per controller across cases, and running cases side by side on
//! it, is sound because every case has its own namespace and a Job named alike in both runs:
//! a Job controller keeps its state (pod expectations, pod-failure back-off, rate limiter,
//! orphan-pod cleanup) per Job key `namespace/name` or per pod, events are namespaced, and the
//! scripted kubelet plays only its case's namespace, so one case never sees another's objects.
//! What cases share is the machine's load, which moves timing (reported, never compared); the
//! fates keep pod endings seconds apart so that load does not change their order. Each
//! control plane runs one Job controller, so no pod is ever touched by both.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Namespace, Pod, ResourceQuota, ServiceAccount};
use kjob_testkit::Program;
use kjob_testkit::addons::Addon;
use kjob_testkit::cluster::{
    ClusterInfo, ClusterOptions, ControlPlane, JobController, KJOB_NAMESPACE,
    UPSTREAM_JOB_CONTROLLER_USER,
};
use kjob_testkit::stack::{RealServer, Stack, StackConfig};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

use crate::case::{
    Case, JOB_NAME, JOBSET_GROUP, JOBSET_VERSION, KUEUE_CREATE_SPACING_MS, KUEUE_LOCAL_QUEUE,
    KueueQueue, Since, UserAction,
};
use crate::compare::{JOBSET_RUN_KIND, RawRun};
use crate::kubelet::ScriptedKubelet;

/// After a Job turns terminal: time for the last finalizer removals and events to land.
const SETTLE: Duration = Duration::from_secs(2);
/// How often a case's progress is looked at while waiting (from the Job watch and the
/// kubelet's records, both local: no request to the server).
const TICK: Duration = Duration::from_millis(100);
/// How often a JobSet case reads its JobSet and lists its Jobs while waiting (requests to the
/// server, unlike a Job case's watch; few cases are JobSets).
const JOBSET_TICK: Duration = Duration::from_millis(250);
/// Client rate limit of both controllers in diff runs (kube-controller-manager's
/// `--kube-api-qps`, kjob-worker's `--kube-qps`; bursts twice that). The defaults (20 QPS per
/// kube-controller-manager controller, 100 per kjob worker) are shared by every Job of a run,
/// so with many cases at once a controller's writes would queue behind a throttle one Job
/// alone never meets, and its timing (hence which pod ends first) would move.
const CLIENT_QPS: u32 = 500;
/// kjob's workers for the run (the setting: one watcher, two workers).
const KJOB_WORKERS: usize = 2;
/// The scheduler of users' pods, which nobody runs: they stay Pending (unbound), so whether
/// the garbage collector deletes one before or after a kubelet would run it never shows.
const USER_POD_SCHEDULER: &str = "kjob-diff-nobody";
/// The ResourceFlavor of every Kueue case's ClusterQueue (no node labels: any node).
const KUEUE_FLAVOR: &str = "default-flavor";
/// Name of a case's ResourceQuota.
const QUOTA_NAME: &str = "quota";
/// How long a new namespace may take to get its `default` ServiceAccount (and a quota its
/// usage).
const NAMESPACE_READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A control plane with one Job controller, ready for cases.
pub struct Bench {
    /// Which controller owns Jobs.
    pub mode: JobController,
    /// kjob takes only the Jobs naming it in `spec.managedBy` (which the runs then name), with
    /// upstream's Job controller on beside it; otherwise every Job, upstream's off.
    pub managed_by: bool,
    _cp: ControlPlane,
    info: ClusterInfo,
    client: kube::Client,
    _stack: Option<Stack>,
    _dir: tempfile::TempDir,
}

/// The name of a mode in reports.
pub fn mode_name(m: JobController) -> &'static str {
    match m {
        JobController::Upstream => "upstream",
        JobController::Kjob => "kjob",
    }
}

async fn admin_client(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(kube::Client::try_from(cfg)?)
}

/// Whether an audit entry's user is the Job controller of `mode`: upstream's ServiceAccount in
/// kube-system, or any of kjob's ServiceAccounts (watcher and workers).
fn is_controller(mode: JobController, user: &str) -> bool {
    match mode {
        JobController::Upstream => user == UPSTREAM_JOB_CONTROLLER_USER,
        JobController::Kjob => user
            .strip_prefix("system:serviceaccount:")
            .is_some_and(|u| u.starts_with(&format!("{KJOB_NAMESPACE}:"))),
    }
}

/// The controller's writes per namespace from an audit log: `"<verb> <resource>[/<sub>]"` →
/// count, for successful write requests only (a refused or conflicting write changes nothing
/// a user sees; retries are a controller's own business); and `"pods deleted"` / `"pods
/// patched"`: how many distinct pods got a delete or a patch (a second delete of a
/// terminating pod, or a finalizer patch of a pod that has none left, succeeds too and
/// changes nothing).
pub fn writes_by_namespace(
    mode: JobController,
    audit_log: &str,
) -> BTreeMap<String, BTreeMap<String, u64>> {
    let mut out: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    let mut distinct: BTreeMap<(String, &'static str), std::collections::BTreeSet<String>> =
        BTreeMap::new();
    for e in audit_log.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()) {
        let verb = e["verb"].as_str().unwrap_or_default();
        if !matches!(verb, "create" | "update" | "patch" | "delete" | "deletecollection") {
            continue;
        }
        if !is_controller(mode, e["user"]["username"].as_str().unwrap_or_default()) {
            continue;
        }
        let code = e["responseStatus"]["code"].as_i64().unwrap_or(0);
        if !(200..300).contains(&code) {
            continue;
        }
        let o = &e["objectRef"];
        let Some(ns) = o["namespace"].as_str() else { continue };
        let resource = match o["subresource"].as_str() {
            Some(s) => format!("{}/{s}", o["resource"].as_str().unwrap_or_default()),
            None => o["resource"].as_str().unwrap_or_default().to_string(),
        };
        *out.entry(ns.to_string()).or_default().entry(format!("{verb} {resource}")).or_default() +=
            1;
        let kind = match (verb, resource.as_str()) {
            ("delete", "pods") => "pods deleted",
            ("patch", "pods") => "pods patched",
            _ => continue,
        };
        let name = o["name"].as_str().unwrap_or_default().to_string();
        distinct.entry((ns.to_string(), kind)).or_default().insert(name);
    }
    for ((ns, kind), names) in distinct {
        out.entry(ns).or_default().insert(kind.to_string(), names.len() as u64);
    }
    out
}

impl Bench {
    /// Starts a fresh control plane with `mode`'s Job controller (and, for kjob, its stack:
    /// redis, queue, one watcher, two workers, all taking Jobs without `spec.managedBy`).
    ///
    /// `addons` start beside the control plane (Kueue when a case needs it).
    pub async fn start(
        mode: JobController,
        kjob_bin: PathBuf,
        addons: Vec<Addon>,
        managed_by: bool,
    ) -> anyhow::Result<Self> {
        let managed_by = managed_by && mode == JobController::Kjob;
        let dir = tempfile::Builder::new()
            .prefix(&format!("kjob-diff-{}-", mode_name(mode)))
            .tempdir()?;
        let cluster_dir = dir.path().join("cluster");
        let stack_dir = dir.path().join("stack");
        let (cp, info, stack) = tokio::task::spawn_blocking(move || {
            let bin_dir = kjob_testkit::cluster::build_binaries()?;
            let mut opts =
                ClusterOptions::new(cluster_dir.clone(), kjob_bin.join("kjob-node-agent"));
            opts.bin_dir = Some(bin_dir);
            opts.nodes = 1;
            opts.kubelet = false;
            // kjob taking only the Jobs that name it: upstream's controller runs beside it (and
            // must leave those Jobs alone: see `foreign_writes`).
            opts.job_controller = if managed_by { JobController::Upstream } else { mode };
            opts.addons = addons;
            let qps = [
                format!("--kube-api-qps={CLIENT_QPS}"),
                format!("--kube-api-burst={}", 2 * CLIENT_QPS),
            ];
            opts.extra_args.add(Program::KubeControllerManager, qps);
            let cp = ControlPlane::start(opts)?;
            let info = ClusterInfo::read(&cluster_dir)?;
            let stack = match mode {
                JobController::Upstream => None,
                JobController::Kjob => {
                    let redis = kjob_testkit::redis::redis_server_binary()?;
                    let mut cfg = StackConfig::new(kjob_bin, redis, stack_dir, KJOB_WORKERS);
                    let mut real = RealServer::from_cluster(&info, "unused");
                    // Every case namespace: the watcher lists Jobs and pods cluster-wide.
                    real.namespace = None;
                    real.lease_name = "kjob-watcher-diff".into();
                    cfg.real = Some(real);
                    let qps = [
                        format!("--kube-qps={CLIENT_QPS}"),
                        format!("--kube-burst={}", 2 * CLIENT_QPS),
                    ];
                    if !managed_by {
                        cfg.extra_args
                            .add(Program::Watcher, ["--manage-all-jobs"])
                            .add(Program::Worker, ["--manage-all-jobs"]);
                    }
                    cfg.extra_args.add(Program::Worker, qps);
                    Some(Stack::start(cfg)?)
                }
            };
            anyhow::Ok((cp, info, stack))
        })
        .await??;
        let client = admin_client(&info.kubeconfig).await?;
        Ok(Self { mode, managed_by, _cp: cp, info, client, _stack: stack, _dir: dir })
    }

    /// Where the kjob processes log (kept only while the bench lives).
    pub fn log_dir(&self) -> Option<PathBuf> {
        self._stack.as_ref().map(|s| s.log_dir.clone())
    }

    /// The Job controller's successful writes per namespace so far (from the audit log, which
    /// the API server writes before answering).
    pub fn writes(&self) -> anyhow::Result<BTreeMap<String, BTreeMap<String, u64>>> {
        let text = std::fs::read_to_string(&self.info.audit_log)
            .with_context(|| format!("reading {}", self.info.audit_log.display()))?;
        Ok(writes_by_namespace(self.mode, &text))
    }

    /// Upstream's Job controller's writes per namespace on a bench where kjob takes the Jobs
    /// naming it and upstream's controller runs beside it: every one is a Job of kjob's that
    /// upstream's touched (none when kjob takes every Job: upstream's is off).
    pub fn foreign_writes(&self) -> anyhow::Result<BTreeMap<String, BTreeMap<String, u64>>> {
        if !self.managed_by {
            return Ok(BTreeMap::new());
        }
        let text = std::fs::read_to_string(&self.info.audit_log)
            .with_context(|| format!("reading {}", self.info.audit_log.display()))?;
        Ok(writes_by_namespace(JobController::Upstream, &text))
    }

    /// The Job of `case` as this bench creates it: naming kjob in `spec.managedBy` when kjob
    /// takes only such Jobs.
    fn job_object(&self, case: &Case) -> Value {
        let mut job = case.job();
        if self.managed_by {
            job["spec"]["managedBy"] = json!(kjob_core::DEFAULT_CONTROLLER_NAME);
        }
        job
    }

    /// Every namespace's core/v1 Events, read once every case ran: both controllers' event
    /// recorders write asynchronously, so an event of a case just settled may still be queued.
    pub async fn events(&self) -> anyhow::Result<BTreeMap<String, Vec<Value>>> {
        let api: Api<Event> = Api::all(self.client.clone());
        let mut out: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for e in api.list(&ListParams::default()).await?.items {
            let ns = e.metadata.namespace.clone().unwrap_or_default();
            out.entry(ns).or_default().push(serde_json::to_value(e)?);
        }
        Ok(out)
    }

    /// Creates `ns` and waits for its `default` ServiceAccount (the ServiceAccount admission
    /// plugin refuses pods until the serviceaccount controller made it).
    async fn create_namespace(&self, ns: &str) -> anyhow::Result<()> {
        let nss: Api<Namespace> = Api::all(self.client.clone());
        let n: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
        nss.create(&PostParams::default(), &n).await.with_context(|| format!("creating {ns}"))?;
        let sas: Api<ServiceAccount> = Api::namespaced(self.client.clone(), ns);
        let t = Instant::now();
        while sas.get_opt("default").await?.is_none() {
            anyhow::ensure!(
                t.elapsed() < NAMESPACE_READY_TIMEOUT,
                "namespace {ns} got no default ServiceAccount within {NAMESPACE_READY_TIMEOUT:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// Runs one case in its own namespace and returns what it left (its events and writes
    /// come later, once every case ran).
    pub async fn run_case(&self, case: &Case) -> anyhow::Result<RawRun> {
        let ns = case.namespace();
        self.create_namespace(&ns).await?;
        let kubelet = ScriptedKubelet::start(self.client.clone(), &ns, case.fates.clone());
        if let Some(mut jobset) = case.jobset_object() {
            if self.managed_by {
                // JobSet copies each template into its Jobs, managedBy included.
                for rj in jobset["spec"]["replicatedJobs"].as_array_mut().into_iter().flatten() {
                    rj["template"]["spec"]["managedBy"] = json!(kjob_core::DEFAULT_CONTROLLER_NAME);
                }
            }
            return self.run_jobset_case(case, jobset, kubelet).await;
        }
        if !case.quota.is_null() {
            self.create_quota(&ns, &case.quota).await?;
        }
        if let Some(q) = &case.kueue {
            self.create_kueue_queue(&ns, q).await?;
            let wait = KUEUE_CREATE_SPACING_MS * u64::from(q.position);
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), &ns);
        let (job_watch, mut job_rx) = watch_job(jobs.clone());
        let mut refusals = Vec::new();
        let job: Job = serde_json::from_value(self.job_object(case))?;
        let created = jobs.create(&PostParams::default(), &job).await;
        refused(case, "create job", created, &mut refusals).context("creating the Job")?;
        let started = Instant::now();
        let horizon = Duration::from_secs(case.horizon_s);
        // In the case's order: each waits for the one before it.
        let mut actions = case.actions.clone().into_iter().peekable();
        let mut terminal_at: Option<Instant> = None;
        let mut milestones = Milestones::default();
        loop {
            let elapsed = started.elapsed();
            let first_start = kubelet.first_start();
            let job_gone = job_rx.borrow().as_ref().is_some_and(Value::is_null);
            let due = |a: &UserAction| {
                let from = match a.since {
                    Since::Created => Some(started),
                    Since::FirstPodRunning => first_start,
                };
                from.is_some_and(|t| t.elapsed() >= Duration::from_millis(a.after_ms))
                    && (!a.create || job_gone)
            };
            while let Some(a) = actions.next_if(due) {
                self.act(case, &a, &jobs, &mut refusals).await?;
            }
            // Not seen yet counts as there (it was created before the watch could tell).
            let Some(now) = job_rx.borrow_and_update().clone() else {
                if elapsed >= horizon {
                    break;
                }
                tokio::select! {
                    _ = job_rx.changed() => {}
                    _ = tokio::time::sleep(TICK) => {}
                }
                continue;
            };
            let pods = kubelet.records();
            milestones.see(&now, &pods, elapsed);
            if actions.peek().is_none() && is_settled(&now, &pods) {
                let t = *terminal_at.get_or_insert_with(Instant::now);
                if t.elapsed() >= SETTLE {
                    break;
                }
            } else {
                terminal_at = None;
            }
            if elapsed >= horizon {
                break;
            }
            tokio::select! {
                _ = job_rx.changed() => {}
                _ = tokio::time::sleep(TICK) => {}
            }
        }
        job_watch.abort();
        let job = jobs.get_opt(JOB_NAME).await?.map(serde_json::to_value).transpose()?;
        let pods = kubelet.stop().await;
        Ok(RawRun {
            job: job.unwrap_or(Value::Null),
            pods,
            events: Vec::new(),
            writes: BTreeMap::new(),
            milestones: milestones.0,
            refusals,
            started: Some(started),
        })
    }

    /// Runs a JobSet case: creates the JobSet, applies the case's patches to it when due, and
    /// waits until JobSet's controller marks it Completed or Failed and every Job it has then
    /// is settled (or the horizon passes). What it left is every Job of the namespace at the
    /// end with the JobSet, as one [`JOBSET_RUN_KIND`] object, and every pod.
    async fn run_jobset_case(
        &self,
        case: &Case,
        jobset: Value,
        kubelet: ScriptedKubelet,
    ) -> anyhow::Result<RawRun> {
        let ns = case.namespace();
        let sets: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &ns, &jobset_resource());
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), &ns);
        for a in &case.actions {
            anyhow::ensure!(
                a.delete.is_none() && !a.create && a.pod.is_none(),
                "{}: a JobSet case's actions only patch the JobSet",
                case.name
            );
        }
        let obj: DynamicObject = serde_json::from_value(jobset)?;
        sets.create(&PostParams::default(), &obj).await.context("creating the JobSet")?;
        let started = Instant::now();
        let horizon = Duration::from_secs(case.horizon_s);
        let mut actions = case.actions.iter().peekable();
        let mut settled_at: Option<Instant> = None;
        let mut milestones = Milestones::default();
        let (set, final_jobs) = loop {
            let first_start = kubelet.first_start();
            let due = |a: &&UserAction| {
                let from = match a.since {
                    Since::Created => Some(started),
                    Since::FirstPodRunning => first_start,
                };
                from.is_some_and(|t| t.elapsed() >= Duration::from_millis(a.after_ms))
            };
            while let Some(a) = actions.next_if(due) {
                sets.patch(JOB_NAME, &PatchParams::default(), &Patch::Merge(&a.patch))
                    .await
                    .context("patching the JobSet")?;
            }
            let set =
                serde_json::to_value(sets.get(JOB_NAME).await.context("reading the JobSet")?)?;
            let list: Vec<Value> = jobs
                .list(&ListParams::default())
                .await
                .context("listing the JobSet's Jobs")?
                .items
                .into_iter()
                .map(serde_json::to_value)
                .collect::<Result<_, _>>()?;
            let pods = kubelet.records();
            milestones.see(&json!({"status": set["status"]}), &pods, started.elapsed());
            let terminal = set["status"]["terminalState"].as_str().is_some_and(|t| !t.is_empty());
            if actions.peek().is_none() && terminal && list.iter().all(|j| is_settled(j, &pods)) {
                let t = *settled_at.get_or_insert_with(Instant::now);
                if t.elapsed() >= SETTLE {
                    break (set, list);
                }
            } else {
                settled_at = None;
            }
            if started.elapsed() >= horizon {
                break (set, list);
            }
            tokio::time::sleep(JOBSET_TICK).await;
        };
        let pods = kubelet.stop().await;
        let by_name: serde_json::Map<String, Value> = final_jobs
            .into_iter()
            .map(|j| (j["metadata"]["name"].as_str().unwrap_or_default().to_string(), j))
            .collect();
        Ok(RawRun {
            job: json!({"kind": JOBSET_RUN_KIND, "metadata": {"uid": set["metadata"]["uid"]},
                "jobset": set, "jobs": by_name}),
            pods,
            events: Vec::new(),
            writes: BTreeMap::new(),
            milestones: milestones.0,
            refusals: Vec::new(),
            started: Some(started),
        })
    }

    /// Performs one user action of `case`.
    async fn act(
        &self,
        case: &Case,
        a: &UserAction,
        jobs: &Api<Job>,
        refusals: &mut Vec<Value>,
    ) -> anyhow::Result<()> {
        if !a.patch.is_null() {
            let r = jobs.patch(JOB_NAME, &PatchParams::default(), &Patch::Merge(&a.patch)).await;
            refused(case, "patch job", r, refusals).context("patching the Job")?;
        }
        if let Some(p) = &a.delete {
            let policy = match p.as_str() {
                "Foreground" => PropagationPolicy::Foreground,
                "Orphan" => PropagationPolicy::Orphan,
                _ => PropagationPolicy::Background,
            };
            let dp = DeleteParams { propagation_policy: Some(policy), ..Default::default() };
            jobs.delete(JOB_NAME, &dp).await.context("deleting the Job")?;
        }
        if a.create {
            let job: Job = serde_json::from_value(self.job_object(case))?;
            jobs.create(&PostParams::default(), &job).await.context("creating the Job again")?;
        }
        if let Some(p) = &a.pod {
            let owner = if p.owned_by_job {
                let j = jobs.get(JOB_NAME).await.context("reading the Job for its uid")?;
                json!({"apiVersion": "batch/v1", "kind": "Job", "name": JOB_NAME,
                    "uid": j.metadata.uid})
            } else {
                p.owner.clone()
            };
            let mut pod = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": p.name, "labels": {"app": "user"},
                    "finalizers": [kjob_core::JOB_TRACKING_FINALIZER]},
                "spec": {"restartPolicy": "Never", "schedulerName": USER_POD_SCHEDULER,
                    "containers": [{"name": "main", "image": "busybox"}]}
            });
            if !owner.is_null() {
                let mut o = owner;
                o["controller"] = json!(true);
                pod["metadata"]["ownerReferences"] = json!([o]);
            }
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), &case.namespace());
            let pod: Pod = serde_json::from_value(pod)?;
            pods.create(&PostParams::default(), &pod).await.context("creating a user's pod")?;
        }
        Ok(())
    }

    /// Makes the Kueue objects of `q`: the ResourceFlavor and the group's ClusterQueue when no
    /// case made them yet, and the namespace's LocalQueue; waits until Kueue reports the
    /// LocalQueue active (a Job queued before would wait for it, and say so in events).
    async fn create_kueue_queue(&self, ns: &str, q: &KueueQueue) -> anyhow::Result<()> {
        let ar = |kind: &str, plural: &str| ApiResource {
            group: "kueue.x-k8s.io".into(),
            version: "v1beta2".into(),
            api_version: "kueue.x-k8s.io/v1beta2".into(),
            kind: kind.into(),
            plural: plural.into(),
        };
        let create = |api: Api<DynamicObject>, obj: Value| async move {
            let o: DynamicObject = serde_json::from_value(obj)?;
            match api.create(&PostParams::default(), &o).await {
                Ok(_) => anyhow::Ok(()),
                // Another case of the group made it first.
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                Err(e) => Err(e.into()),
            }
        };
        let flavor = ar("ResourceFlavor", "resourceflavors");
        let flavor_name = if q.own_flavor() {
            format!("{}-flavor", q.cluster_queue)
        } else {
            KUEUE_FLAVOR.into()
        };
        let mut flavor_spec = json!({});
        if !q.flavor_node_labels.is_empty() {
            flavor_spec["nodeLabels"] = json!(q.flavor_node_labels);
        }
        if !q.flavor_tolerations.is_empty() {
            flavor_spec["tolerations"] = json!(q.flavor_tolerations);
        }
        create(
            Api::all_with(self.client.clone(), &flavor),
            json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                "metadata": {"name": flavor_name}, "spec": flavor_spec}),
        )
        .await
        .context("creating the ResourceFlavor")?;
        if let (Some(name), Some(value)) = (q.priority_class(), q.priority) {
            let wpc = ar("WorkloadPriorityClass", "workloadpriorityclasses");
            create(
                Api::all_with(self.client.clone(), &wpc),
                json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
                    "metadata": {"name": name}, "value": value}),
            )
            .await
            .context("creating the WorkloadPriorityClass")?;
        }
        let cq = ar("ClusterQueue", "clusterqueues");
        let mut cq_spec = json!({"namespaceSelector": {}, "resourceGroups": [{
            "coveredResources": ["cpu"],
            "flavors": [{"name": flavor_name,
                "resources": [{"name": "cpu", "nominalQuota": q.cpus.to_string()}]}]}]});
        if q.priority.is_some() {
            cq_spec["preemption"] = json!({"withinClusterQueue": "LowerPriority"});
        }
        create(
            Api::all_with(self.client.clone(), &cq),
            json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                "metadata": {"name": q.cluster_queue}, "spec": cq_spec}),
        )
        .await
        .context("creating the ClusterQueue")?;
        let lq = ar("LocalQueue", "localqueues");
        let lqs: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), ns, &lq);
        create(
            lqs.clone(),
            json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                "metadata": {"name": KUEUE_LOCAL_QUEUE, "namespace": ns},
                "spec": {"clusterQueue": q.cluster_queue}}),
        )
        .await
        .context("creating the LocalQueue")?;
        let t = Instant::now();
        loop {
            let o = lqs.get(KUEUE_LOCAL_QUEUE).await?;
            let active = o.data["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter().any(|c| c["type"] == "Active" && c["status"] == "True")
            });
            if active {
                return Ok(());
            }
            anyhow::ensure!(
                t.elapsed() < NAMESPACE_READY_TIMEOUT,
                "LocalQueue of {ns} not Active within {NAMESPACE_READY_TIMEOUT:?}"
            );
            tokio::time::sleep(TICK).await;
        }
    }

    /// Creates the case's ResourceQuota and waits until the quota controller has written its
    /// usage (the quota admission plugin refuses creates only from then on).
    async fn create_quota(&self, ns: &str, hard: &Value) -> anyhow::Result<()> {
        let api: Api<ResourceQuota> = Api::namespaced(self.client.clone(), ns);
        let q: ResourceQuota = serde_json::from_value(json!({
            "metadata": {"name": QUOTA_NAME}, "spec": {"hard": hard}
        }))?;
        api.create(&PostParams::default(), &q).await.context("creating the ResourceQuota")?;
        let t = Instant::now();
        loop {
            let q = api.get(QUOTA_NAME).await?;
            if q.status.and_then(|s| s.used).is_some_and(|u| !u.is_empty()) {
                return Ok(());
            }
            anyhow::ensure!(
                t.elapsed() < NAMESPACE_READY_TIMEOUT,
                "ResourceQuota of {ns} got no usage within {NAMESPACE_READY_TIMEOUT:?}"
            );
            tokio::time::sleep(TICK).await;
        }
    }
}

/// The outcome of one of the case's own requests: an API refusal is recorded (in
/// `refusals`, as `{request, code, reason, message}`) when the case says its requests are
/// refused, and an error otherwise (a generated Job the server refuses stops the run).
fn refused<T>(
    case: &Case,
    request: &str,
    r: Result<T, kube::Error>,
    refusals: &mut Vec<Value>,
) -> anyhow::Result<()> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if case.refused => {
            refusals.push(json!({"request": request, "code": e.code, "reason": e.reason,
                "message": e.message}));
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// Watches the case's Job: `None` until first seen, then the latest version (`Null` once
/// deleted).
fn watch_job(
    jobs: Api<Job>,
) -> (tokio::task::JoinHandle<()>, tokio::sync::watch::Receiver<Option<Value>>) {
    let (tx, rx) = tokio::sync::watch::channel(None);
    let task = tokio::spawn(async move {
        let cfg = watcher::Config::default().fields(&format!("metadata.name={JOB_NAME}"));
        // kube-runtime's default backoff between failed list/watch attempts (no hot loop).
        let stream = watcher(jobs, cfg).default_backoff();
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            let v = match ev {
                Ok(watcher::Event::Apply(j) | watcher::Event::InitApply(j)) => {
                    serde_json::to_value(j).unwrap_or(Value::Null)
                }
                Ok(watcher::Event::Delete(_)) => Value::Null,
                Ok(_) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "diff-upstream: Job watch error");
                    continue;
                }
            };
            if tx.send(Some(v)).is_err() {
                return;
            }
        }
    });
    (task, rx)
}

/// The JobSet resource of JobSet cases.
fn jobset_resource() -> ApiResource {
    ApiResource {
        group: JOBSET_GROUP.into(),
        version: JOBSET_VERSION.into(),
        api_version: format!("{JOBSET_GROUP}/{JOBSET_VERSION}"),
        kind: "JobSet".into(),
        plural: "jobsets".into(),
    }
}

/// When each kind of state change was first seen, in seconds after the Job's creation.
#[derive(Debug, Default)]
struct Milestones(BTreeMap<String, f64>);

/// Prefix of the milestones `active <n>`: when the Job first counted `n` active pods.
pub const ACTIVE_MILESTONE: &str = "active ";
/// Milestone: the Job's Suspended condition seen true after it had pods.
pub const SUSPENDED_MID_RUN: &str = "suspended after its pods";

impl Milestones {
    fn mark(&mut self, kind: String, at: Duration) {
        self.0.entry(kind).or_insert(at.as_secs_f64());
    }

    fn see(&mut self, job: &Value, pods: &[crate::kubelet::PodRecord], at: Duration) {
        let s = &job["status"];
        if let Some(cs) = s["conditions"].as_array() {
            for c in cs.iter().filter(|c| c["status"] == "True") {
                self.mark(format!("condition {}", c["type"].as_str().unwrap_or_default()), at);
                // Suspended once it had pods: stopped mid-run (a Job created suspended, as
                // Kueue creates them, has the condition from the start).
                if c["type"] == "Suspended" && self.0.contains_key("pod 1 created") {
                    self.mark(SUSPENDED_MID_RUN.into(), at);
                }
            }
        }
        for (i, _) in pods.iter().enumerate() {
            self.mark(format!("pod {} created", i + 1), at);
        }
        // Pods in parallel as the Job counts them (Kueue's partial admission bounds it).
        if let Some(n) = s["active"].as_i64().filter(|n| *n > 0) {
            self.mark(format!("{ACTIVE_MILESTONE}{n}"), at);
        }
        if s["succeeded"].as_i64().unwrap_or(0) > 0 {
            self.mark("first success counted".into(), at);
        }
        if s["failed"].as_i64().unwrap_or(0) > 0 {
            self.mark("first failure counted".into(), at);
        }
        if job.is_null() {
            self.mark("Job gone".into(), at);
        }
        if is_settled(job, pods) {
            self.mark("settled".into(), at);
        }
    }
}

/// Terminal (Complete or Failed) or gone Job whose pods are all finished and untracked.
fn is_settled(job: &Value, pods: &[crate::kubelet::PodRecord]) -> bool {
    let s = &job["status"];
    let terminal = job.is_null()
        || s["conditions"].as_array().is_some_and(|cs| {
            cs.iter().any(|c| {
                (c["type"] == "Complete" || c["type"] == "Failed") && c["status"] == "True"
            })
        });
    let uncounted = s["uncountedTerminatedPods"]
        .as_object()
        .is_some_and(|u| u.values().any(|v| v.as_array().is_some_and(|a| !a.is_empty())));
    let active = s["active"].as_i64().unwrap_or(0) + s["terminating"].as_i64().unwrap_or(0);
    let pods_done = pods.iter().all(|p| {
        p.gone
            || (matches!(
                p.last.pointer("/status/phase").and_then(Value::as_str),
                Some("Succeeded" | "Failed")
            ) && p
                .last
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty))
    });
    terminal && !uncounted && active == 0 && pods_done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_counted_per_namespace_for_the_controller_only() {
        let line = |user: &str, verb: &str, res: &str, sub: Option<&str>, ns: &str, code: i64| {
            json!({"user": {"username": user}, "verb": verb,
                "objectRef": {"resource": res, "subresource": sub, "namespace": ns,
                    "name": if verb == "create" { "" } else { "p1" }},
                "responseStatus": {"code": code}})
            .to_string()
        };
        let up = UPSTREAM_JOB_CONTROLLER_USER;
        let kw = "system:serviceaccount:kjob-system:kjob-worker";
        let log = [
            line(up, "create", "pods", None, "a", 201),
            line(up, "create", "pods", None, "a", 201),
            line(up, "update", "jobs", Some("status"), "a", 200),
            line(up, "update", "jobs", Some("status"), "a", 409),
            line(up, "get", "jobs", None, "a", 200),
            line(up, "patch", "pods", None, "a", 200),
            line(up, "patch", "pods", None, "a", 200),
            line(kw, "create", "pods", None, "a", 201),
            line(kw, "update", "leases", None, "kjob-system", 200),
        ]
        .join("\n");
        let u = writes_by_namespace(JobController::Upstream, &log);
        assert_eq!(u["a"]["create pods"], 2);
        assert_eq!(u["a"]["update jobs/status"], 1);
        assert_eq!(u["a"]["patch pods"], 2);
        assert_eq!(u["a"]["pods patched"], 1);
        assert_eq!(u["a"].len(), 4);
        let k = writes_by_namespace(JobController::Kjob, &log);
        assert_eq!(k["a"]["create pods"], 1);
        assert_eq!(k["kjob-system"]["update leases"], 1);
    }
}
