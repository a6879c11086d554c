//! kjob-node-agent: fake nodes for a real control plane. It registers Node objects
//! (`<prefix>-0`, `<prefix>-1`, …), keeps them Ready by renewing their Leases in
//! `kube-node-lease` and their Ready heartbeat, and — unless `--kubelet off` — plays kubelet for
//! the pods bound to them with kjob-sim's kubelet stages, so pods behave the same on kjob-sim and
//! on a real kube-apiserver (the same `kjob.io/sim-*` annotations, status through `pods/status`,
//! graceful deletion finished with a zero-grace DELETE).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

/// How long a node's Lease stays valid without renewal (the kubelet's default is 40 s).
const LEASE_DURATION_SECONDS: i32 = 40;
/// Field manager of the agent's writes.
const MANAGER: &str = "kjob-node-agent";

/// Whether the agent also runs the pods bound to its nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum KubeletMode {
    /// Play kubelet for pods bound to the agent's nodes.
    On,
    /// Keep the nodes Ready only; clients bind pods and write their status themselves.
    Off,
}

/// Fake nodes (and their kubelet) for a real kube-apiserver.
#[derive(Debug, Parser)]
#[command(name = "kjob-node-agent", version)]
struct Args {
    /// Number of nodes.
    #[arg(long, default_value_t = 3)]
    nodes: u32,
    /// Node names are `<prefix>-<i>`.
    #[arg(long, default_value = "kjob-node")]
    node_prefix: String,
    /// Play kubelet for the nodes' pods (on) or only keep the nodes Ready (off).
    #[arg(long, value_enum, default_value = "on")]
    kubelet: KubeletMode,
    /// Pods each node admits (`status.capacity.pods`).
    #[arg(long, default_value_t = 5000)]
    max_pods: u32,
    /// Interval of Lease renewals.
    #[arg(long, value_parser = kjob_svc::parse_duration, default_value = "10s")]
    lease_renew_interval: Duration,
    /// Interval of the Ready condition's heartbeat in node status.
    #[arg(long, value_parser = kjob_svc::parse_duration, default_value = "60s")]
    status_interval: Duration,
    /// Container run time of pods without a `kjob.io/sim-run-time` annotation.
    #[arg(long, value_parser = kjob_svc::parse_duration, default_value = "1s")]
    pod_run_time: Duration,
    /// Delay between a pod being accepted and its containers running.
    #[arg(long, value_parser = kjob_svc::parse_duration, default_value = "100ms")]
    pod_start_delay: Duration,
    /// Base of the CrashLoopBackOff delay of `restartPolicy: OnFailure` pods.
    #[arg(long, value_parser = kjob_svc::parse_duration, default_value = "10s")]
    crash_loop_backoff: Duration,
    /// Path to a kubeconfig; unset = KUBECONFIG, then ~/.kube/config.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    kjob_svc::main(kjob_svc::Threads::PerCpu, run)
}

async fn run(args: Args) -> anyhow::Result<()> {
    // HTTP/1.1, one connection per request in flight, as in every earlier benchmark: the node
    // agent is the benchmarks' kubelet for every configuration, kjob's and upstream's alike, and
    // its many nodes' watch and status writes over one HTTP/2 connection made kube-apiserver
    // close more watches as too slow for every client.
    let client = kjob_svc::KubeClientArgs {
        kubeconfig: args.kubeconfig,
        kube_timeout_seconds: 30,
        kube_http1_only: true,
    }
    .client()
    .await?;
    let names: Vec<String> = (0..args.nodes).map(|i| format!("{}-{i}", args.node_prefix)).collect();
    for name in &names {
        register(&client, name, args.max_pods).await?;
        renew_lease(&client, name).await?;
    }
    tracing::info!(nodes = names.len(), kubelet = ?args.kubelet, "nodes registered");
    let shutdown = kjob_svc::shutdown_on_signals();
    let pods = (args.kubelet == KubeletMode::On).then(|| {
        let cfg = kjob_sim::kubelet::KubeletConfig {
            node_prefix: args.node_prefix.clone(),
            nodes: args.nodes,
            schedule: false,
            only_own_nodes: true,
            run_time: args.pod_run_time,
            start_delay: args.pod_start_delay,
            crash_loop_backoff: args.crash_loop_backoff,
            ..Default::default()
        };
        kjob_sim::kubelet::spawn_with_client(client.clone(), cfg, shutdown.child_token())
    });
    let mut leases = tokio::time::interval(args.lease_renew_interval);
    let mut status = tokio::time::interval(args.status_interval);
    leases.tick().await;
    status.tick().await;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = leases.tick() => {
                for name in &names {
                    if let Err(e) = renew_lease(&client, name).await {
                        tracing::warn!(node = %name, error = %e, "renewing the node Lease failed");
                    }
                }
            }
            _ = status.tick() => {
                for name in &names {
                    if let Err(e) = write_status(&client, name, args.max_pods).await {
                        tracing::warn!(node = %name, error = %e, "node status heartbeat failed");
                    }
                }
            }
        }
    }
    if let Some(p) = pods {
        p.join().await;
    }
    Ok(())
}

fn now_rfc3339() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Creates the Node (an existing one is kept) and writes its Ready status.
async fn register(client: &kube::Client, name: &str, max_pods: u32) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kjob.io/node-agent": "true",
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {},
    }))?;
    match api.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(anyhow::anyhow!("creating Node {name}: {e}")),
    }
    write_status(client, name, max_pods).await
}

/// The node's status: Ready, with room for many pods and no pressure.
async fn write_status(client: &kube::Client, name: &str, max_pods: u32) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let now = now_rfc3339();
    let cond = |ty: &str, status: &str, reason: &str, message: &str| {
        json!({"type": ty, "status": status, "reason": reason, "message": message,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    let resources = json!({"cpu": "64", "memory": "512Gi", "pods": max_pods.to_string(),
                           "ephemeral-storage": "1Ti"});
    let status = json!({"status": {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            cond("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        ],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        "nodeInfo": {
            "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "", "osImage": "kjob-node-agent",
            "containerRuntimeVersion": "kjob://0", "kubeletVersion": "v1.37.2", "kubeProxyVersion": "",
            "operatingSystem": "linux", "architecture": "amd64",
        },
    }});
    api.patch_status(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "status": status["status"],
    })))
    .await
    .map_err(|e| anyhow::anyhow!("writing the status of Node {name}: {e}"))?;
    Ok(())
}

/// Creates or renews the node's Lease in `kube-node-lease` (what node-lifecycle reads).
async fn renew_lease(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    let api: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let renew = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string();
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_DURATION_SECONDS, "renewTime": renew},
    });
    api.patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&lease))
        .await
        .map_err(|e| anyhow::anyhow!("renewing Lease kube-node-lease/{name}: {e}"))?;
    Ok(())
}
