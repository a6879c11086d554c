//! kjob-sim against the real kube-apiserver: the same requests go to both servers and their
//! normalised answers must be equal. Every difference found between the two gets a case here
//! (and a fix in kjob-sim: the real server is right by definition).
//!
//! Each case is a list of raw requests run in a fresh namespace; the observation of a request is
//! its HTTP status plus the fields of the answer the case names (a Status' reason and message,
//! or chosen paths of the object). Without a Go toolchain the real half cannot run; the test
//! then says so and passes.

use std::time::Duration;

use kjob_testkit::cluster::test_cluster;
use kjob_testkit::raw::send;
use serde_json::{Value, json};

/// One request of a case: method, path (with `{ns}` for the namespace), body, content type,
/// and the JSON pointers of the answer to compare (a Status answer compares code, reason,
/// message).
struct Step {
    method: &'static str,
    path: &'static str,
    body: Value,
    content_type: &'static str,
    observe: &'static [&'static str],
}

const JSON: &str = "application/json";
const SMP: &str = "application/strategic-merge-patch+json";

fn pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
           "spec": {"restartPolicy": "Never", "schedulerName": "no-such-scheduler",
                    "containers": [{"name": "main", "image": "busybox"}]}})
}

/// A pod (generated from `gen-` when `name` is empty) with `spec` fields added.
fn prioritised_pod(name: &str, spec: Value) -> Value {
    let mut p = pod(name);
    if name.is_empty() {
        p["metadata"] = json!({"generateName": "gen-"});
    }
    p["spec"].as_object_mut().unwrap().extend(spec.as_object().unwrap().clone());
    p
}

fn job(name: &str) -> Value {
    json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
           "spec": {"managedBy": "example.com/nobody", "template": {"spec": {"restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox"}]}}}})
}

fn cases() -> Vec<(&'static str, Vec<Step>)> {
    vec![
        (
            "a pod's priority comes from its PriorityClass (the Priority admission plugin)",
            vec![
                Step {
                    method: "POST",
                    path: "/api/v1/namespaces/{ns}/pods",
                    body: prioritised_pod(
                        "critical",
                        json!({"priorityClassName": "system-cluster-critical"}),
                    ),
                    content_type: JSON,
                    observe: &[
                        "/spec/priority",
                        "/spec/priorityClassName",
                        "/spec/preemptionPolicy",
                    ],
                },
                Step {
                    method: "POST",
                    path: "/api/v1/namespaces/{ns}/pods",
                    body: prioritised_pod("plain", json!({})),
                    content_type: JSON,
                    observe: &["/spec/priority", "/spec/priorityClassName"],
                },
                Step {
                    method: "POST",
                    path: "/api/v1/namespaces/{ns}/pods",
                    body: prioritised_pod(
                        "missing",
                        json!({"priorityClassName": "kjob-fidelity-none"}),
                    ),
                    content_type: JSON,
                    observe: &[],
                },
                Step {
                    method: "POST",
                    path: "/api/v1/namespaces/{ns}/pods",
                    body: prioritised_pod("", json!({"priority": 5})),
                    content_type: JSON,
                    observe: &[],
                },
            ],
        ),
        (
            "the system PriorityClasses exist from the start; user classes are bounded, system- names reserved",
            vec![
                Step {
                    method: "GET",
                    path: "/apis/scheduling.k8s.io/v1/priorityclasses/system-node-critical",
                    body: Value::Null,
                    content_type: JSON,
                    observe: &["/value", "/globalDefault", "/preemptionPolicy", "/description"],
                },
                Step {
                    method: "GET",
                    path: "/apis/scheduling.k8s.io/v1/priorityclasses/system-cluster-critical",
                    body: Value::Null,
                    content_type: JSON,
                    observe: &["/value", "/preemptionPolicy", "/description"],
                },
                Step {
                    method: "GET",
                    path: "/apis/scheduling.k8s.io/v1/priorityclasses/kjob-fidelity-none",
                    body: Value::Null,
                    content_type: JSON,
                    observe: &[],
                },
                Step {
                    method: "POST",
                    path: "/apis/scheduling.k8s.io/v1/priorityclasses",
                    body: json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                 "metadata": {"name": "kjob-fidelity-huge"}, "value": 1_000_000_001}),
                    content_type: JSON,
                    observe: &[],
                },
                Step {
                    method: "POST",
                    path: "/apis/scheduling.k8s.io/v1/priorityclasses",
                    body: json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                 "metadata": {"name": "system-kjob-fidelity"}, "value": 5}),
                    content_type: JSON,
                    observe: &[],
                },
            ],
        ),
        (
            "spec.nodeName of an existing pod cannot be patched (binding goes through pods/binding)",
            vec![
                Step {
                    method: "POST",
                    path: "/api/v1/namespaces/{ns}/pods",
                    body: pod("p"),
                    content_type: JSON,
                    observe: &["/metadata/name"],
                },
                Step {
                    method: "PATCH",
                    path: "/api/v1/namespaces/{ns}/pods/p",
                    body: json!({"spec": {"nodeName": "kjob-node-0"}}),
                    content_type: SMP,
                    observe: &[],
                },
                Step {
                    method: "POST",
                    path: "/api/v1/namespaces/{ns}/pods/p/binding",
                    body: json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"},
                                 "target": {"apiVersion": "v1", "kind": "Node", "name": "kjob-node-0"}}),
                    content_type: JSON,
                    observe: &[],
                },
                Step {
                    method: "GET",
                    path: "/api/v1/namespaces/{ns}/pods/p",
                    body: Value::Null,
                    content_type: JSON,
                    observe: &["/spec/nodeName"],
                },
            ],
        ),
        (
            "strategic merge puts patch items before server-only ones",
            vec![
                Step {
                    method: "POST",
                    path: "/api/v1/namespaces/{ns}/pods",
                    body: {
                        let mut p = pod("f");
                        p["metadata"]["finalizers"] = json!(["example.com/a"]);
                        p
                    },
                    content_type: JSON,
                    observe: &["/metadata/finalizers"],
                },
                Step {
                    method: "PATCH",
                    path: "/api/v1/namespaces/{ns}/pods/f",
                    body: json!({"metadata": {"finalizers": ["example.com/b"]}}),
                    content_type: SMP,
                    observe: &["/metadata/finalizers"],
                },
                Step {
                    method: "PATCH",
                    path: "/api/v1/namespaces/{ns}/pods/f",
                    body: json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["example.com/a", "example.com/b"]}}),
                    content_type: SMP,
                    observe: &["/metadata/finalizers"],
                },
            ],
        ),
        (
            "a Job's zero counters are omitted, pointer ones kept",
            vec![
                Step {
                    method: "POST",
                    path: "/apis/batch/v1/namespaces/{ns}/jobs",
                    body: job("j"),
                    content_type: JSON,
                    observe: &["/status", "/metadata/generation"],
                },
                Step {
                    method: "PATCH",
                    path: "/apis/batch/v1/namespaces/{ns}/jobs/j/status",
                    body: json!({"status": {"startTime": "2025-01-01T00:00:00Z", "active": 0, "failed": 0, "ready": 0, "terminating": 0}}),
                    content_type: SMP,
                    observe: &[
                        "/status/active",
                        "/status/failed",
                        "/status/ready",
                        "/status/terminating",
                    ],
                },
            ],
        ),
        (
            "field selectors a resource does not index are 400 with the server's message",
            vec![
                Step {
                    method: "GET",
                    path: "/apis/batch/v1/namespaces/{ns}/jobs?fieldSelector=spec.foo%3Dbar",
                    body: Value::Null,
                    content_type: JSON,
                    observe: &[],
                },
                Step {
                    method: "GET",
                    path: "/api/v1/namespaces/{ns}/pods?fieldSelector=spec.foo%3Dbar",
                    body: Value::Null,
                    content_type: JSON,
                    observe: &[],
                },
                Step {
                    method: "GET",
                    path: "/api/v1/namespaces/{ns}/pods?fieldSelector=spec.nodeName%3Dx",
                    body: Value::Null,
                    content_type: JSON,
                    observe: &["/kind"],
                },
            ],
        ),
        (
            "an unscheduled pod is deleted at once, whatever the grace period",
            vec![
                Step {
                    method: "POST",
                    path: "/api/v1/namespaces/{ns}/pods",
                    body: pod("d"),
                    content_type: JSON,
                    observe: &[],
                },
                Step {
                    method: "DELETE",
                    path: "/api/v1/namespaces/{ns}/pods/d",
                    body: json!({"gracePeriodSeconds": 30}),
                    content_type: JSON,
                    observe: &[],
                },
                Step {
                    method: "GET",
                    path: "/api/v1/namespaces/{ns}/pods/d",
                    body: Value::Null,
                    content_type: JSON,
                    observe: &[],
                },
            ],
        ),
    ]
}

/// The server's message, with what is specific to one run (names, namespaces) replaced. A
/// pod-update refusal of the real server ends with a diff of its internal Go struct, which
/// kjob-sim does not reproduce: the comparison stops before it.
fn normalise_message(msg: &str, ns: &str) -> String {
    let msg = msg.split("\n@@ ").next().unwrap_or(msg);
    msg.replace(ns, "{ns}")
}

async fn run_case(client: &kube::Client, ns: &str, steps: &[Step]) -> Vec<Value> {
    let mut out = Vec::new();
    for s in steps {
        let path = s.path.replace("{ns}", ns);
        let (code, v) = send(client, s.method, &path, s.content_type, &s.body).await;
        let mut obs = json!({"code": code});
        if v["kind"] == "Status" {
            obs["reason"] = v["reason"].clone();
            obs["message"] =
                json!(normalise_message(v["message"].as_str().unwrap_or_default(), ns));
        }
        for p in s.observe {
            obs[*p] = v.pointer(p).cloned().unwrap_or(Value::Null);
        }
        out.push(obs);
    }
    out
}

async fn namespace(client: &kube::Client, ns: &str, real: bool) {
    use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
    let api: kube::Api<Namespace> = kube::Api::all(client.clone());
    let obj: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
    api.create(&Default::default(), &obj).await.expect("create namespace");
    // The real server's ServiceAccount admission refuses pods until `default` exists; kjob-sim
    // has no ServiceAccounts.
    if !real {
        return;
    }
    let sas: kube::Api<ServiceAccount> = kube::Api::namespaced(client.clone(), ns);
    for _ in 0..300 {
        match sas.get_opt("default").await {
            Ok(Some(_)) => return,
            Err(e) => panic!("reading ServiceAccount {ns}/default: {e}"),
            Ok(None) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    panic!("namespace {ns} got no default ServiceAccount");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kjob_sim_answers_as_the_real_apiserver() {
    let Some(cluster) =
        tokio::task::spawn_blocking(test_cluster).await.unwrap().expect("real control plane")
    else {
        return;
    };
    let kc = kube::config::Kubeconfig::read_from(&cluster.info().kubeconfig).unwrap();
    let real = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap(),
    )
    .unwrap();
    let sim = kjob_sim::testing::TestSim::start(kjob_sim::SimConfig {
        kubelet: kjob_sim::KubeletMode::Off,
        ..Default::default()
    })
    .await;
    let mut differences = Vec::new();
    for (i, (name, steps)) in cases().into_iter().enumerate() {
        let ns = format!("fidelity-{}-{i}", std::process::id());
        namespace(&real, &ns, true).await;
        namespace(&sim.client(), &ns, false).await;
        let on_real = run_case(&real, &ns, &steps).await;
        let on_sim = run_case(&sim.client(), &ns, &steps).await;
        println!("{name}\n  real: {on_real:?}\n  sim:  {on_sim:?}");
        if on_real != on_sim {
            differences.push(format!("{name}:\n  real: {on_real:?}\n  sim:  {on_sim:?}"));
        }
    }
    assert!(
        differences.is_empty(),
        "kjob-sim differs from kube-apiserver:\n{}",
        differences.join("\n")
    );
}
