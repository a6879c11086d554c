//! The `kjob-worker` binary: flags, readiness, a real sync, and a clean exit on SIGTERM, on
//! kjob-sim and on the real control plane (there under the worker's ServiceAccount).

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Driver, Fate, QueueService, create_plain_job, finished};
use kjob_testkit::server::TestServer;
use kjob_testkit::{ChildGuard, bin_path, free_port};

async fn binary_syncs_reports_ready_and_drains_on_sigterm(server: TestServer) {
    let client = server.client();
    let ns = server.namespace("bin");
    server.create_namespace(&ns).await;
    let queue = QueueService::start();
    let admin = free_port();
    let bin = bin_path("kjob-worker").expect("kjob-worker binary (cargo build -p kjob-worker)");
    let mut cmd = Command::new(bin);
    cmd.args(["--queue-url", &queue.url, "--insecure-no-auth"])
        .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
        .arg("--kubeconfig")
        .arg(server.worker_kubeconfig())
        .args(["--worker-id", "bin-1", "--lease-duration", "5s", "--shutdown-grace", "2s"])
        .args(["--log-format", "json"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = ChildGuard::spawn("kjob-worker", &mut cmd).unwrap();
    let http = reqwest::Client::new();
    let ready = format!("http://127.0.0.1:{admin}/readyz");
    common::eventually("worker ready", Duration::from_secs(15), || {
        let http = http.clone();
        let ready = ready.clone();
        async move {
            let r = http.get(&ready).send().await.ok()?;
            (r.status() == 200).then_some(())
        }
    })
    .await;
    create_plain_job(&client, &ns, "b", 2, 2).await;
    let mut d = Driver::new(client, queue.client(), &ns, "b");
    let job = d.run_until(Duration::from_secs(20), &mut |_| Fate::Succeed, &mut finished).await;
    assert!(common::condition(&job, "Complete").is_some());
    assert_eq!(d.all_pods.len(), 2);
    let status = tokio::task::spawn_blocking(move || child.terminate(Duration::from_secs(10)))
        .await
        .unwrap();
    assert!(status.is_some_and(|s| s.success()), "exit status {status:?}");
}

kjob_testkit::on_both_servers!(kjob_sim::SimConfig::default();
    binary_syncs_reports_ready_and_drains_on_sigterm);
