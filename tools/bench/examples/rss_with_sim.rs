//! Resident memory of a real `kjob-watcher` process whose caches hold N pods (default 100,000)
//! served by a `kjob-sim` process. Needs `cargo build -p kjob-sim -p kjob-watcher` first.
//!
//! `cargo run --release -p kjob-bench --example rss_with_sim -- 100000`

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kjob_testkit::{ChildGuard, bin_path, free_port, wait_for_tcp};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

/// Pod creations in flight at once: enough to keep both cores of the simulator busy.
const CONCURRENCY: usize = 32;

fn vm_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn pod(i: usize) -> Pod {
    let job = format!("job-{:05}", i / 10);
    let uid = format!("6f1c2d3e-0000-4000-8000-{:012}", i / 10);
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("{job}-{i:05x}"),
            "namespace": "default",
            "labels": {
                kjob_core::CONTROLLER_UID_LABEL: uid,
                kjob_core::LEGACY_CONTROLLER_UID_LABEL: uid,
                kjob_core::JOB_NAME_LABEL: job,
                kjob_core::LEGACY_JOB_NAME_LABEL: job,
            },
            "finalizers": [kjob_core::JOB_TRACKING_FINALIZER],
            "ownerReferences": [{
                "apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": uid,
                "controller": true, "blockOwnerDeletion": true
            }]
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", "true"]}]
        }
    }))
    .expect("valid pod")
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let kubeconfig =
        std::env::temp_dir().join(format!("kjob-rss-{}.kubeconfig", std::process::id()));
    let sim_port = free_port();
    let mut sim_cmd = Command::new(bin_path("kjob-sim")?);
    sim_cmd
        .args(["--listen", &format!("127.0.0.1:{sim_port}"), "--kubelet", "off"])
        .arg("--kubeconfig-out")
        .arg(&kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut sim = ChildGuard::spawn("kjob-sim", &mut sim_cmd)?;
    let sim_addr = std::net::SocketAddr::from(([127, 0, 0, 1], sim_port));
    wait_for_tcp(sim_addr, Duration::from_secs(10))?;
    let url = format!("http://{sim_addr}");
    let client = kube::Client::try_from(kube::Config::new(url.parse()?))?;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let started = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let pods = pods.clone();
            async move { pods.create(&PostParams::default(), &pod(i)).await }
        })
        .buffer_unordered(CONCURRENCY)
        .for_each(|r| async {
            if let Err(e) = r {
                eprintln!("create failed: {e}");
            }
        })
        .await;
    eprintln!("created {n} pods in {:?}", started.elapsed());

    let admin = free_port();
    let mut w_cmd = Command::new(bin_path("kjob-watcher")?);
    w_cmd
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--queue-url", &format!("http://127.0.0.1:{}", free_port()), "--insecure-no-auth"])
        .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
        .args(["--lease-namespace", "default", "--identity", "rss"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let watcher = ChildGuard::spawn("kjob-watcher", &mut w_cmd)?;
    let pid = watcher.pid().ok_or_else(|| anyhow::anyhow!("kjob-watcher exited"))?;
    let http = reqwest::Client::new();
    let want = format!("kjob_watcher_cached_objects{{kind=\"pod\"}} {n}");
    let synced_at = Instant::now();
    loop {
        let body = match http
            .get(format!("http://127.0.0.1:{admin}/metrics"))
            .timeout(Duration::from_secs(2))
            .send()
            .await
        {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        if body.lines().any(|l| l == want) {
            break;
        }
        anyhow::ensure!(synced_at.elapsed() < Duration::from_secs(600), "watcher never synced");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let rss = vm_rss_kib(pid);
    println!(
        "pods={n} sync_seconds={:.1} watcher_rss_kib={rss} rss_bytes_per_pod={}",
        synced_at.elapsed().as_secs_f64(),
        rss * 1024 / n.max(1) as u64
    );
    sim.kill();
    let _ = std::fs::remove_file(&kubeconfig);
    Ok(())
}
