//! `kjob-cluster up --kjob-workers` (`make cluster-up KJOB_WORKERS=…`), as a user trying kjob by
//! hand would run it: the control plane comes up with kjob's services beside it, a Job applied
//! with kubectl completes, and `kjob-cluster down` stops kjob's processes with the cluster's.
//!
//! On a control plane of its own. Without a Go toolchain the test says so and passes without
//! running, as the other real-server suites do.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use kjob_e2e::run_ok;
use kjob_testkit::cluster;

/// How long the Job may take once applied (one 1 s pod on a loaded 2-core machine).
const JOB_TIMEOUT: Duration = Duration::from_secs(90);

fn alive(pid: &str) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.split(") ").nth(1).is_some_and(|r| r.starts_with('Z')))
}

/// Runs `kjob-cluster down` on drop (a failed assertion must not leave a cluster running).
struct Down(std::path::PathBuf, String);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = Command::new(&self.0).args(["down", "--dir", &self.1]).output();
    }
}

#[test]
fn cluster_up_with_kjob_runs_a_job_and_down_stops_kjob() {
    if !cluster::go_available() {
        eprintln!(
            "SKIP cluster_with_kjob: no Go toolchain on PATH, so the control plane cannot be built"
        );
        return;
    }
    let bin = kjob_testkit::bin_path("kjob-cluster").expect("cargo build --bins");
    let dir = tempfile::Builder::new().prefix("kjob-cluster-kjob-").tempdir().unwrap();
    let d = dir.path().display().to_string();
    // Whatever happens below, the detached cluster and kjob's processes are stopped.
    let _down = Down(bin.clone(), d.clone());
    let out =
        run_ok(Command::new(&bin).args(["up", "--dir", &d, "--nodes", "1", "--kjob-workers", "1"]));
    assert!(
        out.contains("stack:  redis, kjob-queue, a watcher and 1 worker(s), taking every Job"),
        "{out}"
    );
    let pids: Vec<(String, String)> = std::fs::read_dir(dir.path().join("pids"))
        .unwrap()
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(e.path()).unwrap().trim().to_string())
        })
        .filter(|(n, _)| n.starts_with("stack-"))
        .collect();
    let names: Vec<&str> = pids.iter().map(|(n, _)| n.as_str()).collect();
    for want in
        ["stack-redis-server", "stack-kjob-queue", "stack-kjob-watcher-1", "stack-kjob-worker-1"]
    {
        assert!(names.contains(&want), "no {want} among kjob's pids {names:?}");
    }
    let kubectl = cluster::ClusterInfo::read(dir.path()).unwrap().bin_dir.join("kubectl");
    let kc = dir.path().join("kubeconfig").display().to_string();
    let job = dir.path().join("job.yaml");
    std::fs::write(
        &job,
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: by-hand\n  namespace: default\nspec:\n  \
         template:\n    metadata:\n      annotations:\n        kjob.io/sim-run-time: 1s\n    spec:\n      \
         restartPolicy: Never\n      containers:\n      - name: main\n        image: busybox\n",
    )
    .unwrap();
    run_ok(Command::new(&kubectl).args(["--kubeconfig", &kc, "apply", "-f"]).arg(&job));
    let deadline = Instant::now() + JOB_TIMEOUT;
    loop {
        let succeeded = run_ok(Command::new(&kubectl).args([
            "--kubeconfig",
            &kc,
            "get",
            "job",
            "by-hand",
            "-n",
            "default",
            "-o",
            "jsonpath={.status.succeeded}",
        ]));
        if succeeded == "1" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the Job did not complete under kjob: succeeded {succeeded:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    run_ok(Command::new(&bin).args(["down", "--dir", &d]));
    let left: Vec<&(String, String)> = pids.iter().filter(|(_, pid)| alive(pid)).collect();
    assert!(left.is_empty(), "kjob's processes left after down: {left:?}");
}
