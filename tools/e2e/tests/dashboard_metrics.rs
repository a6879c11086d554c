//! Every metric the Grafana dashboard (deploy/grafana/kjob.json) and the alert rules
//! (deploy/prometheus/kjob-rules.yaml) query is exported by a real kjob-queue, kjob-watcher or
//! kjob-worker process (read from their `/metrics` after a Job ran through them).
//! prometheus-client prints a labelled family only once it has a sample, so the few metrics
//! that only move on faults (or while Jobs wait) are checked against the registering source.
//! The rules file has the structure Prometheus loads, and the Helm chart's copy is the same file.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kjob_testkit::{ChildGuard, RedisServer, bin_path, free_port, require_bins, wait_for_tcp};

/// How long a freshly started debug binary may take to serve its admin port.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a two-pod Job of 500 ms pods may take through the whole stack.
const JOB_TIMEOUT: Duration = Duration::from_secs(30);

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// `GET /metrics` over plain HTTP/1.0, body only.
fn scrape(port: u16) -> String {
    let mut s = TcpStream::connect_timeout(&addr(port), Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()
}

/// Metric family names from `# TYPE` lines.
fn families(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect()
}

/// The metric names the dashboard's PromQL expressions use.
fn dashboard_metrics() -> BTreeSet<String> {
    let text = std::fs::read_to_string(kjob_e2e::root().join("deploy/grafana/kjob.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut out = BTreeSet::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            metric_words(t["expr"].as_str().unwrap(), &mut out);
        }
    }
    out
}

/// The kjob metric names in a PromQL expression.
fn metric_words(expr: &str, out: &mut BTreeSet<String>) {
    for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if ["workqueue_", "job_controller_", "kjob_"].iter().any(|p| word.starts_with(p)) {
            out.insert(word.to_string());
        }
    }
}

/// deploy/prometheus/kjob-rules.yaml, parsed.
fn rules_file() -> serde_yaml::Value {
    let text = std::fs::read_to_string(kjob_e2e::root().join("deploy/prometheus/kjob-rules.yaml"))
        .unwrap();
    serde_yaml::from_str(&text).unwrap()
}

/// Every rule of the rules file.
fn rules() -> Vec<serde_yaml::Value> {
    let file = rules_file();
    let groups = file["groups"].as_sequence().expect("groups: a list").clone();
    groups.iter().flat_map(|g| g["rules"].as_sequence().cloned().unwrap_or_default()).collect()
}

/// The metric names the alert rules use.
fn rules_metrics() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for r in rules() {
        metric_words(r["expr"].as_str().unwrap(), &mut out);
    }
    out
}

/// The family a sample name belongs to (`x_total` → `x`, `x_bucket` → `x`).
fn family_of(sample: &str) -> &str {
    ["_total", "_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| sample.strip_suffix(s))
        .unwrap_or(sample)
}

/// Families that get samples only on faults (refused renewals, expired leases,
/// watch errors, podFailurePolicy matches) or while Jobs wait (the Jobs waiting longest), with
/// the name their crate registers them under (after any sub-registry prefix).
const FAULT_ONLY: [(&str, &str); 8] = [
    ("kjob_queue_oldest_ready_job_seconds", "kjob_queue_oldest_ready_job_seconds"),
    ("kjob_watcher_watch_restarts", "watch_restarts"),
    ("kjob_queue_lease_expired", "kjob_queue_lease_expired"),
    ("kjob_queue_stale_lease", "kjob_queue_stale_lease"),
    ("kjob_worker_renew_failures", "renew_failures"),
    (
        "job_controller_pod_failures_handled_by_failure_policy",
        "pod_failures_handled_by_failure_policy",
    ),
    ("job_controller_terminated_pods_tracking_finalizer", "terminated_pods_tracking_finalizer"),
    ("workqueue_retries", "workqueue_retries"),
];

/// Creates a two-pod Job managed by kjob in the simulator and waits until it is Complete.
fn run_one_job(kubeconfig: &Path) {
    use k8s_openapi::api::batch::v1::Job;
    use kube::api::{Api, PostParams};
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
        let client = kube::Client::try_from(cfg).unwrap();
        let jobs: Api<Job> = Api::namespaced(client, "default");
        let job: Job = serde_json::from_value(serde_json::json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "metrics"},
            "spec": {
                "managedBy": kjob_core::DEFAULT_CONTROLLER_NAME,
                "completions": 2, "parallelism": 2,
                "template": {
                    "metadata": {"annotations": {"kjob.io/sim-run-time": "500ms"}},
                    "spec": {"restartPolicy": "Never",
                             "containers": [{"name": "main", "image": "busybox"}]}
                }
            }
        }))
        .unwrap();
        let call = Duration::from_secs(10);
        tokio::time::timeout(call, jobs.create(&PostParams::default(), &job))
            .await
            .unwrap()
            .unwrap();
        let deadline = Instant::now() + JOB_TIMEOUT;
        loop {
            let j = tokio::time::timeout(call, jobs.get("metrics")).await.unwrap().unwrap();
            let conds = j.status.and_then(|s| s.conditions).unwrap_or_default();
            if conds.iter().any(|c| c.type_ == "Complete" && c.status == "True") {
                return;
            }
            assert!(Instant::now() < deadline, "Job not Complete after {JOB_TIMEOUT:?}: {conds:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}

fn wait_for_file(path: &Path, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !path.is_file() {
        assert!(Instant::now() < deadline, "{} not written within {timeout:?}", path.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn every_dashboard_metric_is_exported_by_a_kjob_binary() {
    require_bins(&["kjob-sim", "kjob-queue", "kjob-watcher", "kjob-worker"])
        .unwrap_or_else(|e| panic!("{e}"));
    let redis = RedisServer::start().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let kubeconfig = tmp.path().join("kubeconfig");
    let quiet = |c: &mut Command| {
        c.stdout(Stdio::null()).stderr(Stdio::null());
    };

    let mut sim = Command::new(bin_path("kjob-sim").unwrap());
    sim.args(["--listen", "127.0.0.1:0", "--kubelet", "auto", "--kubeconfig-out"]).arg(&kubeconfig);
    quiet(&mut sim);
    let _sim = ChildGuard::spawn("kjob-sim", &mut sim).unwrap();
    wait_for_file(&kubeconfig, START_TIMEOUT);

    let (grpc, queue_admin) = (free_port(), free_port());
    let mut q = Command::new(bin_path("kjob-queue").unwrap());
    q.arg(format!("--listen=127.0.0.1:{grpc}"))
        .arg(format!("--redis-url={}", redis.url()))
        .arg(format!("--admin-listen=127.0.0.1:{queue_admin}"))
        .arg("--insecure-no-auth");
    quiet(&mut q);
    let _queue = ChildGuard::spawn("kjob-queue", &mut q).unwrap();
    wait_for_tcp(addr(grpc), START_TIMEOUT).unwrap();

    let queue_url = format!("--queue-url=http://127.0.0.1:{grpc}");
    let kc = format!("--kubeconfig={}", kubeconfig.display());
    let (watcher_admin, worker_admin) = (free_port(), free_port());
    let mut w = Command::new(bin_path("kjob-watcher").unwrap());
    w.args([&queue_url, &kc, "--insecure-no-auth", "--lease-namespace=default"])
        .arg("--identity=metrics-test")
        .arg(format!("--admin-listen=127.0.0.1:{watcher_admin}"));
    quiet(&mut w);
    let _watcher = ChildGuard::spawn("kjob-watcher", &mut w).unwrap();
    let mut k = Command::new(bin_path("kjob-worker").unwrap());
    k.args([&queue_url, &kc, "--insecure-no-auth", "--worker-id=metrics-test"])
        .arg(format!("--admin-listen=127.0.0.1:{worker_admin}"));
    quiet(&mut k);
    let _worker = ChildGuard::spawn("kjob-worker", &mut k).unwrap();

    run_one_job(&kubeconfig);
    let mut exported = BTreeSet::new();
    for port in [queue_admin, watcher_admin, worker_admin] {
        wait_for_tcp(addr(port), START_TIMEOUT).unwrap();
        exported.extend(families(&scrape(port)));
    }
    let mut wanted = dashboard_metrics();
    assert!(wanted.len() > 20, "dashboard queries only {wanted:?}");
    let alerted = rules_metrics();
    assert!(alerted.len() >= 8, "the rules use only {alerted:?}");
    wanted.extend(alerted);
    let sources: String = ["queue", "watcher", "worker"]
        .iter()
        .map(|c| {
            let p = kjob_e2e::root().join(format!("crates/{c}/src/metrics.rs"));
            std::fs::read_to_string(p).unwrap_or_default()
        })
        .collect();
    let absent: Vec<&String> = wanted
        .iter()
        .filter(|m| !exported.contains(family_of(m)) && !exported.contains(*m))
        .filter(|m| {
            let fam = family_of(m);
            !FAULT_ONLY.iter().any(|(f, registered_as)| {
                *f == fam && sources.contains(&format!("\"{registered_as}\""))
            })
        })
        .collect();
    assert!(
        absent.is_empty(),
        "the dashboard or the rules query metrics no binary exports: {absent:?}\nexported: {exported:?}"
    );

    // docs/metrics.md's reference names exactly what the services export: every name it
    // lists is exported (or registered, for fault-only families), and every exported family
    // is listed.
    let documented = documented_metrics();
    assert!(documented.len() > 20, "docs/metrics.md lists only {documented:?}");
    let registered = |fam: &str| {
        FAULT_ONLY.iter().any(|(f, as_)| *f == fam && sources.contains(&format!("\"{as_}\"")))
    };
    let undocumented_ok = |fam: &str| documented.iter().any(|d| family_of(d) == fam);
    let mut problems: Vec<String> = documented
        .iter()
        .filter(|m| !m.starts_with("kjob_sim_"))
        .filter(|m| !exported.contains(family_of(m)) && !registered(family_of(m)))
        .map(|m| format!("docs/metrics.md names {m}, which no service exports"))
        .collect();
    problems.extend(
        exported
            .iter()
            .filter(|f| !undocumented_ok(f))
            .map(|f| format!("{f} is exported but missing from docs/metrics.md's reference")),
    );
    problems.extend(
        FAULT_ONLY
            .iter()
            .filter(|(f, _)| !undocumented_ok(f))
            .map(|(f, _)| format!("{f} (fault-only) is missing from docs/metrics.md's reference")),
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Metric names in docs/metrics.md's "Metrics reference" table (second column, backticked).
fn documented_metrics() -> BTreeSet<String> {
    let text = std::fs::read_to_string(kjob_e2e::root().join("docs/metrics.md")).unwrap();
    let section = text.split("## Metrics reference").nth(1).unwrap_or_default();
    let section = section.split("\n## ").next().unwrap_or_default();
    let mut out = BTreeSet::new();
    for line in section.lines().filter(|l| l.starts_with("| kjob-")) {
        let Some(cell) = line.split('|').nth(2) else { continue };
        for name in cell.split('`').skip(1).step_by(2) {
            out.insert(name.to_string());
        }
    }
    out
}

/// The rules file loads as Prometheus reads one (groups of named rules, each an alert with an
/// expression, a duration, a severity and the annotations a page shows), holds the alerts
/// operators expect, uses only documented metrics, and is the file the Helm chart ships.
#[test]
fn the_alert_rules_have_the_structure_prometheus_loads() {
    let file = rules_file();
    let top: Vec<&str> = file.as_mapping().unwrap().keys().map(|k| k.as_str().unwrap()).collect();
    assert_eq!(top, ["groups"]);
    let mut names = BTreeSet::new();
    for g in file["groups"].as_sequence().unwrap() {
        assert!(g["name"].as_str().is_some_and(|n| !n.is_empty()), "a group without a name");
        let rules = g["rules"].as_sequence().expect("rules: a list");
        assert!(!rules.is_empty());
        for r in rules {
            let known = ["alert", "expr", "for", "labels", "annotations"];
            for k in r.as_mapping().unwrap().keys() {
                assert!(known.contains(&k.as_str().unwrap()), "unknown field {k:?} in {r:?}");
            }
            let alert = r["alert"].as_str().expect("every rule is an alert");
            assert!(
                alert.starts_with("Kjob") && alert.chars().all(|c| c.is_ascii_alphanumeric()),
                "{alert}"
            );
            assert!(names.insert(alert.to_string()), "{alert} twice");
            let expr = r["expr"].as_str().unwrap();
            let depth = expr.chars().try_fold(0i32, |d, c| {
                let d = match c {
                    '(' | '{' | '[' => d + 1,
                    ')' | '}' | ']' => d - 1,
                    _ => d,
                };
                (d >= 0).then_some(d)
            });
            assert_eq!(depth, Some(0), "{alert}: unbalanced brackets in {expr}");
            if let Some(f) = r.get("for") {
                let f = f.as_str().unwrap();
                let (n, unit) = f.split_at(f.len() - 1);
                assert!(
                    n.parse::<u32>().is_ok() && ["s", "m", "h"].contains(&unit),
                    "{alert}: {f}"
                );
            }
            let sev = r["labels"]["severity"].as_str().unwrap_or_default();
            assert!(["warning", "critical"].contains(&sev), "{alert}: severity {sev:?}");
            for a in ["summary", "description"] {
                let text = r["annotations"][a].as_str().unwrap_or_default();
                assert!(!text.trim().is_empty(), "{alert}: no {a}");
            }
        }
    }
    for wanted in [
        "KjobQueueDown",
        "KjobQueueDepthGrowing",
        "KjobQueueOldestReadyTooOld",
        "KjobLeasesExpiring",
        "KjobWorkersAbsent",
        "KjobRedisMemoryHigh",
    ] {
        assert!(names.contains(wanted), "no alert {wanted}: {names:?}");
    }
    // Growing for 10 minutes means a 10-minute `for`.
    let growing = rules().into_iter().find(|r| r["alert"] == "KjobQueueDepthGrowing").unwrap();
    assert_eq!(growing["for"].as_str(), Some("10m"));
    // Every metric the rules use is in docs/metrics.md's reference (the test above checks that
    // the services export them).
    let documented = documented_metrics();
    let undocumented: Vec<String> = rules_metrics()
        .into_iter()
        .filter(|m| !documented.iter().any(|d| family_of(d) == family_of(m)))
        .collect();
    assert!(undocumented.is_empty(), "rules use undocumented metrics {undocumented:?}");
    // The chart's PrometheusRule is made of the same file, byte for byte.
    let root = kjob_e2e::root();
    assert_eq!(
        std::fs::read_to_string(root.join("charts/kjob/files/kjob-rules.yaml")).unwrap(),
        std::fs::read_to_string(root.join("deploy/prometheus/kjob-rules.yaml")).unwrap(),
        "charts/kjob/files/kjob-rules.yaml differs from deploy/prometheus/kjob-rules.yaml"
    );
}
