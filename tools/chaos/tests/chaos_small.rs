//! The bounded chaos runs: 40 Jobs, a fixed seed, real processes. Each fails with the full
//! report and the tails of every log, and keeps its run folder.
//!
//! `make test` runs two bounded variants: the server-side faults alone (queue and redis
//! restarts, API 429/500, cut watches), and every fault kind including process crashes of a
//! worker and of the leading watcher and Redis losing its data (wiped, or failed over to a
//! replica that missed the last writes), on kjob-sim and on the real control plane. A crash can leave a Job's shared expectations raised (a
//! creation that never happens or is never observed); workers treat such a record as satisfied
//! once it is older than one lease plus 15 s and requeue the Job for that moment, so the
//! crash variant gets room for one such window to converge.

use std::time::Duration;

use kjob_chaos::{ChaosConfig, Fault, run};
use kjob_testkit::bin_path;
use kjob_testkit::redis::redis_server_binary;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_jobs_survive_server_restarts_and_api_faults() {
    let kinds = [Fault::RestartQueue, Fault::RestartRedis, Fault::ApiErrors, Fault::CloseWatches];
    run_small(&kinds, Duration::from_secs(60), None).await;
}

/// Every fault kind, worker and leader-watcher crashes included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_jobs_survive_process_crashes_too() {
    // A crash may strand expectations for one worker lease (30 s) + 15 s before they go stale.
    run_small(&Fault::ALL, Duration::from_secs(120), None).await;
}

/// On the real control plane (kube-apiserver, kjob's ServiceAccounts, kjob-node-agent): every
/// fault kind — worker and leading-watcher crashes, queue and redis restarts, and API 429/500
/// and cut watches from the testkit's fault proxy in front of kube-apiserver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_jobs_survive_every_fault_on_the_real_control_plane() {
    let Some(cluster) = tokio::task::spawn_blocking(kjob_testkit::cluster::test_cluster)
        .await
        .unwrap()
        .expect("the real control plane")
    else {
        return;
    };
    run_small(&Fault::ALL, Duration::from_secs(120), Some(cluster.info().clone())).await;
    let forbidden = cluster.info().forbidden_requests().unwrap();
    assert!(forbidden.is_empty(), "RBAC refused kjob: {forbidden:?}");
}

async fn run_small(
    kinds: &[Fault],
    converge_timeout: Duration,
    cluster: Option<kjob_testkit::cluster::ClusterInfo>,
) {
    let bin_dir = bin_path("kjob-sim").expect("run `cargo build --bins` first");
    let bin_dir = bin_dir.parent().unwrap().to_path_buf();
    let run_dir = tempfile::Builder::new().prefix("kjob-chaos-small-").tempdir().unwrap();
    let cfg = ChaosConfig {
        seed: 8,
        jobs: 40,
        // Every kind at least twice.
        duration: Duration::from_secs(3 * 2 * kinds.len() as u64),
        fault_interval: Duration::from_secs(3),
        workers: 2,
        bin_dir,
        redis_server: redis_server_binary().unwrap(),
        run_dir: run_dir.path().to_path_buf(),
        converge_timeout,
        pod_run_time: Duration::from_millis(500),
        faults: kinds.to_vec(),
        cluster,
    };
    let report = match run(cfg).await {
        Ok(r) => r,
        Err(e) => {
            // A service that died mid-run: keep its logs, they say why.
            let kept = run_dir.keep();
            panic!("{e:#}\nlogs kept in {}", kept.join("logs").display());
        }
    };
    eprint!("{report}");
    let logs = tails(run_dir.path());
    if !report.violations.is_empty() {
        // Keep the full logs of a failed run for diagnosis.
        let kept = run_dir.keep();
        eprintln!("logs kept in {}", kept.join("logs").display());
    }
    assert!(report.violations.is_empty(), "{report}{logs}");
    assert_eq!(report.duplicates, 0, "{report}");
    for &kind in kinds {
        assert!(
            report.faults.get(&kind).copied().unwrap_or(0) >= 2,
            "{kind} not injected twice:\n{report}"
        );
    }
    assert!(report.pods_created >= 40, "{report}");
    assert!(report.converge_after_last_fault.is_some(), "{report}");
}

fn tails(run_dir: &std::path::Path) -> String {
    let mut out = String::new();
    if let Ok(dir) = std::fs::read_dir(run_dir.join("logs")) {
        for f in dir.flatten() {
            let text = std::fs::read_to_string(f.path()).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(10)..];
            out.push_str(&format!("\n--- {} (tail)\n{}", f.path().display(), tail.join("\n")));
        }
    }
    out
}
