//! Running cases on a control plane: one per controller, each case in its own namespace.
//!
//! Reusing one control plane per controller across cases is sound because every case has its
//! own namespace and a Job named alike in both runs: a Job controller keeps its state (pod
//! expectations, pod-failure back-off, rate limiter) per Job key `namespace/name`, events are
//! namespaced, and cases run one after another, so one case cannot see another's objects.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Event;
use kjob_testkit::cluster::{ClusterInfo, ClusterOptions, ControlPlane, JobController};
use kjob_testkit::stack::{RealServer, Stack, StackConfig};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::Value;

use crate::case::{Case, JOB_NAME};
use crate::compare::RawRun;
use crate::kubelet::ScriptedKubelet;

/// After a Job turns terminal: time for the last finalizer removals and events to land.
const SETTLE: Duration = Duration::from_secs(2);
/// How often a case's Job is read while waiting.
const POLL: Duration = Duration::from_millis(200);
/// kjob's workers for the run (the setting: one watcher, two workers).
const KJOB_WORKERS: usize = 2;

/// A control plane with one Job controller, ready for cases.
pub struct Bench {
    /// Which controller owns Jobs.
    pub mode: JobController,
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

impl Bench {
    /// Starts a fresh control plane with `mode`'s Job controller (and, for kjob, its stack:
    /// redis, queue, one watcher, two workers, all taking Jobs without `spec.managedBy`).
    pub async fn start(mode: JobController, kjob_bin: &Path) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("kjob-diff-{}-", mode_name(mode)))
            .tempdir()?;
        let bin_dir = kjob_testkit::cluster::build_binaries()?;
        let mut opts =
            ClusterOptions::new(dir.path().join("cluster"), kjob_bin.join("kjob-node-agent"));
        opts.bin_dir = Some(bin_dir);
        opts.nodes = 1;
        opts.kubelet = false;
        opts.job_controller = mode;
        let cp = tokio::task::block_in_place(|| ControlPlane::start(opts))?;
        let info = ClusterInfo::read(&dir.path().join("cluster"))?;
        let stack = match mode {
            JobController::Upstream => None,
            JobController::Kjob => {
                let redis = kjob_testkit::redis::redis_server_binary()?;
                let mut cfg = StackConfig::new(
                    kjob_bin.to_path_buf(),
                    redis,
                    dir.path().join("stack"),
                    KJOB_WORKERS,
                );
                let mut real = RealServer::from_cluster(&info, "unused");
                // Every case namespace: the watcher lists Jobs and pods cluster-wide.
                real.namespace = None;
                real.lease_name = "kjob-watcher-diff".into();
                cfg.real = Some(real);
                cfg.watcher_args.push("--manage-all-jobs".into());
                cfg.worker_args.push("--manage-all-jobs".into());
                Some(tokio::task::block_in_place(|| Stack::start(cfg))?)
            }
        };
        let client = admin_client(&info.kubeconfig).await?;
        Ok(Self { mode, _cp: cp, info, client, _stack: stack, _dir: dir })
    }

    /// Where the kjob processes log (kept only while the bench lives).
    pub fn log_dir(&self) -> Option<PathBuf> {
        self._stack.as_ref().map(|s| s.log_dir.clone())
    }

    /// Runs one case in its own namespace and returns what it left.
    pub async fn run_case(&self, case: &Case) -> anyhow::Result<RawRun> {
        let ns = case.namespace();
        tokio::task::block_in_place(|| self.info.create_namespace(&ns))?;
        let kubelet = ScriptedKubelet::start(self.client.clone(), &ns, case.fates.clone());
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), &ns);
        let job: Job = serde_json::from_value(case.job())?;
        jobs.create(&PostParams::default(), &job).await.context("creating the Job")?;
        let started = Instant::now();
        let horizon = Duration::from_secs(case.horizon_s);
        let mut actions = case.actions.clone();
        actions.sort_by_key(|a| a.after_ms);
        let mut actions = actions.into_iter().peekable();
        let mut terminal_at: Option<Instant> = None;
        loop {
            let elapsed = started.elapsed();
            while let Some(a) = actions.next_if(|a| Duration::from_millis(a.after_ms) <= elapsed) {
                jobs.patch(JOB_NAME, &PatchParams::default(), &Patch::Merge(&a.patch))
                    .await
                    .context("patching the Job")?;
            }
            let now = serde_json::to_value(jobs.get(JOB_NAME).await?)?;
            let pods = kubelet.records();
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
            tokio::time::sleep(POLL).await;
        }
        let job = serde_json::to_value(jobs.get(JOB_NAME).await?)?;
        let pods = kubelet.stop().await;
        let events: Api<Event> = Api::namespaced(self.client.clone(), &ns);
        let events = events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .map(serde_json::to_value)
            .collect::<Result<Vec<Value>, _>>()?;
        Ok(RawRun { job, pods, events })
    }
}

/// Terminal Job (Complete or Failed) whose pods are all finished and untracked.
fn is_settled(job: &Value, pods: &[crate::kubelet::PodRecord]) -> bool {
    let s = &job["status"];
    let terminal = s["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| (c["type"] == "Complete" || c["type"] == "Failed") && c["status"] == "True")
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
