//! kjob-queue's mTLS and per-role authorization against a hostile client: a raw gRPC client
//! that calls every RPC kjob-queue serves (kjob's two services, reflection v1 and v1alpha,
//! grpc.health.v1) with no certificate, another CA's certificate, and each role's certificate;
//! Redis must hold exactly what it held before every refused call. Then the binaries: kjob-queue
//! without security settings does not start, and a secure stack runs a Job to completion.

mod stack_common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use kjob_queue::auth::{RPC_ROLES, Role};
use kjob_queue::certs::{Ca, Issued};
use kjob_queue::{Listeners, QueueConfig, Security};
use kjob_queue_client::{QueueTlsArgs, RetryPolicy, v1};
use kjob_svc::Shutdown;
use kjob_testkit::{RedisServer, StackConfig};
use kube::Api;
use tokio::net::TcpListener;
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// How long one raw call may take (a refused call answers at once; an allowed streaming one
/// may keep its stream open, which counts as "let through").
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// kjob-queue in this process with mTLS (certificates of `ca`), over its own Redis.
struct Secured {
    redis: RedisServer,
    ca: Ca,
    dir: tempfile::TempDir,
    url: String,
    admin: String,
    shutdown: Shutdown,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Secured {
    async fn start() -> Self {
        let redis = RedisServer::start().unwrap();
        let ca = Ca::new("kjob test CA").unwrap();
        let server = ca.server(&["127.0.0.1".into(), "localhost".into()]).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        let admin_url = format!("http://{}", admin.local_addr().unwrap());
        let security = Security::Tls {
            cert: server.cert_pem().into_bytes(),
            key: server.key_pem().into_bytes(),
            client_ca: ca.own().cert_pem().into_bytes(),
        };
        let config = QueueConfig::new(redis.url(), security);
        let shutdown = Shutdown::new();
        let listeners = Listeners { grpc: listener, admin: Some(admin) };
        let task = tokio::spawn(kjob_queue::run(listeners, config, shutdown.clone()));
        let dir = tempfile::tempdir().unwrap();
        let s = Secured { redis, ca, dir, url, admin: admin_url, shutdown, task };
        // Up when an inspector's Stats answers.
        let probe = s.client(Role::Inspector).with_retry_policy(RetryPolicy::default());
        tokio::time::timeout(Duration::from_secs(20), probe.stats("job")).await.unwrap().unwrap();
        s
    }

    /// A raw channel presenting `identity` (none: no client certificate), trusting `ca`.
    fn channel(&self, identity: Option<&Issued>, ca: &Ca) -> Channel {
        let mut tls =
            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca.own().cert_pem()));
        if let Some(i) = identity {
            tls = tls.identity(Identity::from_pem(i.cert_pem(), i.key_pem()));
        }
        let e = Endpoint::from_shared(self.url.clone()).unwrap().tls_config(tls).unwrap();
        e.connect_timeout(CALL_TIMEOUT).connect_lazy()
    }

    /// A raw channel with a certificate of this CA whose CN is `cn`.
    fn channel_as(&self, cn: &str) -> Channel {
        self.channel(Some(&self.ca.client(cn).unwrap()), &self.ca)
    }

    /// kjob's own client as `role`, its certificate read from files as the binaries do.
    fn client(&self, role: Role) -> kjob_queue_client::QueueClient {
        let d = self.dir.path().join(role.name());
        std::fs::create_dir_all(&d).unwrap();
        let leaf = self.ca.client(role.name()).unwrap();
        let (ca, cert, key) = (d.join("ca.crt"), d.join("tls.crt"), d.join("tls.key"));
        std::fs::write(&ca, self.ca.own().cert_pem()).unwrap();
        std::fs::write(&cert, leaf.cert_pem()).unwrap();
        std::fs::write(&key, leaf.key_pem()).unwrap();
        QueueTlsArgs::tls(&ca, &cert, &key)
            .connect_lazy(&self.url)
            .unwrap()
            .with_retry_policy(RetryPolicy::no_retries())
    }

    async fn metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.admin)).await.unwrap().text().await.unwrap()
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(20), self.task).await.unwrap().unwrap().unwrap();
    }
}

/// Calls `/service/method` with an empty message, as a hostile client with no stubs would.
async fn raw_call(channel: &Channel, service: &str, method: &str) -> Result<(), tonic::Status> {
    let path = http::uri::PathAndQuery::from_str(&format!("/{service}/{method}")).unwrap();
    let call = async {
        let mut grpc = tonic::client::Grpc::new(channel.clone());
        grpc.ready().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let codec = tonic_prost::ProstCodec::<(), ()>::default();
        grpc.unary(tonic::Request::new(()), path, codec).await.map(drop)
    };
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(r) => r,
        // A stream kept open (health Watch, reflection): let through.
        Err(_) => Ok(()),
    }
}

/// Whether `r` is a refusal by the auth layer.
fn refused_by_auth(r: &Result<(), tonic::Status>) -> bool {
    matches!(r, Err(s) if matches!(s.code(), Code::Unauthenticated | Code::PermissionDenied))
}

/// The value of `kjob_queue_auth_refused_total{reason, role}` in `text`.
fn refused_count(text: &str, reason: &str, role: &str) -> u64 {
    let want = format!("kjob_queue_auth_refused_total{{reason=\"{reason}\",role=\"{role}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&want)).map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients_are_refused_counted_and_change_nothing() {
    let q = Secured::start().await;

    // Legitimate state first, so "unchanged" compares a Redis that holds queue state.
    let watcher = q.client(Role::Watcher);
    let worker = q.client(Role::Worker);
    let item = |key: &str| kjob_queue_client::AddItem {
        queue: "job".into(),
        key: key.into(),
        ..Default::default()
    };
    watcher.add(vec![item("ns/a"), item("ns/b")]).await.unwrap();
    let leased =
        worker.lease("job", 1, Duration::from_secs(60), Duration::ZERO, "w1").await.unwrap();
    assert_eq!(leased.len(), 1);
    worker.set_expectations("ns/a", "uid-a", 1, 0).await.unwrap();
    worker.put_record("ns/a", "backoff", b"x".to_vec(), None).await.unwrap();
    let before = q.redis.snapshot().await.unwrap();
    assert!(!before.is_empty());

    // (a) No client certificate: every RPC, reflection and health included, UNAUTHENTICATED.
    let anonymous = q.channel(None, &q.ca);
    for (service, method, _) in RPC_ROLES {
        let r = raw_call(&anonymous, service, method).await;
        let s = r.expect_err(&format!("{service}/{method} without a certificate"));
        assert_eq!(s.code(), Code::Unauthenticated, "{service}/{method}: {s:?}");
    }
    // Through tonic's typed stubs too (what grpcurl-like tools send).
    let mut health = tonic_health::pb::health_client::HealthClient::new(anonymous.clone());
    let s = health.check(tonic_health::pb::HealthCheckRequest::default()).await.unwrap_err();
    assert_eq!(s.code(), Code::Unauthenticated);

    // (b) A certificate from another CA, even with a role's CN: refused at the TLS handshake
    // (or, were it let through, UNAUTHENTICATED); never answered.
    let other_ca = Ca::new("not kjob's CA").unwrap();
    let forged = other_ca.client(Role::Worker.name()).unwrap();
    let outsider = q.channel(Some(&forged), &q.ca);
    for (service, method, _) in RPC_ROLES {
        let r = raw_call(&outsider, service, method).await;
        let s = r.expect_err(&format!("{service}/{method} with another CA's certificate"));
        assert_ne!(s.code(), Code::Ok);
        assert_ne!(s.code(), Code::PermissionDenied, "{service}/{method}: the CN was believed");
    }

    // (c) Each role calling what it may not: PERMISSION_DENIED naming the role and the RPC.
    let mut denied: BTreeMap<&str, u64> = BTreeMap::new();
    for role in Role::ALL {
        let channel = q.channel_as(role.name());
        for (service, method, roles) in RPC_ROLES.iter().filter(|(.., r)| !r.contains(&role)) {
            let s = raw_call(&channel, service, method).await.unwrap_err();
            assert_eq!(
                s.code(),
                Code::PermissionDenied,
                "{} {service}/{method}: {s:?}",
                role.name()
            );
            assert!(s.message().contains(role.name()) && s.message().contains(method), "{s:?}");
            let _ = roles;
            *denied.entry(role.name()).or_default() += 1;
        }
    }
    // The worker is refused exactly the watcher-only RPCs and the inspection-only ones; the
    // inspector every write.
    let watcher_only: Vec<&str> = RPC_ROLES
        .iter()
        .filter(|(.., r)| r.contains(&Role::Watcher) && !r.contains(&Role::Worker))
        .map(|(_, m, _)| *m)
        .collect();
    assert_eq!(watcher_only, ["CacheSession", "SetNamespaceWeights"]);
    for write in [
        "Add",
        "Lease",
        "Renew",
        "Done",
        "DoneBatch",
        "PutJobView",
        "PutRecord",
        "SetExpectations",
        "GateEvents",
        "TakeApiTokens",
        "CacheSession",
        "SetNamespaceWeights",
    ] {
        assert!(
            RPC_ROLES.iter().any(|(_, m, r)| *m == write && !r.contains(&Role::Inspector)),
            "{write}"
        );
    }
    // A CN of the right CA that names no role.
    let mallory = q.channel_as("mallory");
    let s = raw_call(&mallory, "kjob.queue.v1.Queue", "Stats").await.unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied);
    assert_eq!(q.redis.snapshot().await.unwrap(), before, "a refused call changed Redis");

    // Typed write calls with real payloads, by the wrong roles: still nothing changes.
    let inspector = q.client(Role::Inspector);
    assert!(inspector.add(vec![item("ns/evil")]).await.is_err());
    assert!(
        inspector.put_job_view("ns/a", "uid-a", b"{}".to_vec(), "999999999999", 0).await.is_err()
    );
    assert!(worker.cache_session("evil", v1::CacheSessionPhase::Begin).await.is_err());
    assert!(watcher.set_expectations("ns/a", "uid-a", 1_000_000, 0).await.is_err());
    assert!(watcher.take_api_tokens("ns", 100, 1000.0, 1000, 0).await.is_err());
    assert!(inspector.take_api_tokens("ns", 100, 1000.0, 1000, 5).await.is_err());
    let weights: std::collections::HashMap<String, u32> = [("ns".to_string(), 1000)].into();
    assert!(worker.set_namespace_weights(weights.clone()).await.is_err());
    assert!(inspector.set_namespace_weights(weights).await.is_err());
    assert!(
        watcher.lease("job", 10, Duration::from_secs(3600), Duration::ZERO, "evil").await.is_err()
    );
    assert_eq!(q.redis.snapshot().await.unwrap(), before, "a refused typed call changed Redis");

    // (d) The right roles get through: every RPC by every role it names (the answer may be a
    // validation error for the empty message, never a refusal), and real calls succeed.
    for role in Role::ALL {
        let channel = q.channel_as(role.name());
        for (service, method, _) in RPC_ROLES.iter().filter(|(.., r)| r.contains(&role)) {
            let r = raw_call(&channel, service, method).await;
            assert!(!refused_by_auth(&r), "{} {service}/{method}: {r:?}", role.name());
        }
    }
    let stats = inspector.stats("job").await.unwrap();
    assert!(stats.ready + stats.leased >= 2, "{stats:?}");
    let keys = inspector.inspect("job", vec!["ns/a".into(), "ns/b".into()]).await.unwrap();
    assert_eq!(keys.keys.len(), 2);
    let n = inspector.namespaces("job", "ns", 10, 5).await.unwrap();
    assert_eq!(n.namespaces.len(), 1, "{n:?}");
    assert!(n.namespaces[0].ready + n.namespaces[0].leased >= 2, "{n:?}");
    assert!(worker.namespaces("job", "", 10, 0).await.is_err());
    assert!(watcher.answers().await && worker.answers().await && inspector.answers().await);
    let lease = &leased[0];
    worker
        .done("job", &lease.key, &lease.lease_id, kjob_queue_client::Outcome::Forget)
        .await
        .unwrap();
    assert!(watcher.cache_session("s1", v1::CacheSessionPhase::Begin).await.is_ok());
    let weights: std::collections::HashMap<String, u32> = [("ns".to_string(), 3)].into();
    assert_eq!(watcher.set_namespace_weights(weights).await.unwrap(), 1);

    // (e) Every refusal above was counted, by reason and role.
    let text = q.metrics().await;
    let n = RPC_ROLES.len() as u64;
    // (a)'s raw calls, plus the typed health check.
    assert_eq!(refused_count(&text, "no_certificate", "none"), n + 1, "{text}");
    for role in Role::ALL {
        let raw = denied[role.name()];
        let typed = match role {
            // CacheSession, Namespaces and SetNamespaceWeights.
            Role::Inspector => 4,
            // Namespaces and SetNamespaceWeights.
            Role::Worker => 3,
            Role::Watcher => 3,
        };
        assert_eq!(
            refused_count(&text, "rpc_not_allowed", role.name()),
            raw + typed,
            "{}",
            role.name()
        );
    }
    assert_eq!(refused_count(&text, "unknown_role", "unknown"), 1);
    q.stop().await;
}

/// The output of a kjob binary run with `args` and no kjob environment, which must fail.
fn fails_to_start(bin: &str, args: &[&str]) -> String {
    let mut cmd = Command::new(kjob_testkit::bin_path(bin).expect("cargo build --bins"));
    cmd.args(args).stdin(Stdio::null());
    // No kjob settings from the environment, and no backtrace under the one line (anyhow
    // appends one when the test runner asks for backtraces).
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("KJOB_")) {
        cmd.env_remove(k);
    }
    cmd.env_remove("RUST_BACKTRACE").env_remove("RUST_LIB_BACKTRACE");
    let out = cmd.output().unwrap();
    assert!(!out.status.success(), "{bin} started");
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(stderr.lines().count(), 1, "{bin}: not one line: {stderr}");
    assert!(out.stdout.is_empty(), "{bin} printed {:?}", String::from_utf8_lossy(&out.stdout));
    stderr
}

#[test]
fn binaries_without_security_settings_refuse_to_start_in_one_line() {
    let free = format!("--listen=127.0.0.1:{}", kjob_testkit::free_port());
    let admin = "--admin-listen=127.0.0.1:0";
    let line = fails_to_start("kjob-queue", &[&free, admin, "--redis-url=redis://127.0.0.1:1"]);
    for flag in ["--tls-cert-file", "--tls-key-file", "--client-ca-file", "--insecure-no-auth"] {
        assert!(line.contains(flag), "{line}");
    }
    let http = "--queue-url=http://127.0.0.1:1";
    for bin in ["kjob-watcher", "kjob-worker"] {
        let line = fails_to_start(bin, &[http, admin]);
        assert!(line.contains("--insecure-no-auth") && line.contains("https://"), "{bin}: {line}");
        let https = "--queue-url=https://127.0.0.1:1";
        let line = fails_to_start(bin, &[https, admin]);
        assert!(line.contains("--queue-ca-file"), "{bin}: {line}");
    }
    let line = fails_to_start("kjob-queue", &["inspect", http]);
    assert!(line.contains("--insecure-no-auth"), "{line}");
}

/// kjob-queue certs writes every Secret; inspect reaches a secure queue as the inspector.
fn inspect_as_inspector(stack: &kjob_testkit::Stack) -> String {
    let dir = stack.cert_dir().unwrap();
    let s = dir.join(kjob_testkit::stack::INSPECTOR_SECRET);
    let arg = |flag: &str, p: &Path| format!("{flag}={}", p.display());
    let out = Command::new(kjob_testkit::bin_path("kjob-queue").unwrap())
        .args(["inspect", &format!("--queue-url={}", stack.queue_url)])
        .arg(arg("--queue-ca-file", &s.join("ca.crt")))
        .arg(arg("--queue-cert-file", &s.join("tls.crt")))
        .arg(arg("--queue-key-file", &s.join("tls.key")))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secure_stack_runs_a_job_to_completion() {
    let bin_dir = kjob_testkit::bin_path("kjob-sim").expect("run `cargo build --bins` first");
    let bin_dir = bin_dir.parent().unwrap().to_path_buf();
    let redis = kjob_testkit::redis::redis_server_binary().expect("redis-server");
    let run = tempfile::tempdir().unwrap();
    let mut cfg = StackConfig::new(bin_dir, redis, run.path().to_path_buf(), 1);
    (cfg.tls, cfg.redis_tls) = (true, true);
    let stack = tokio::task::block_in_place(|| kjob_testkit::Stack::start(cfg)).expect("stack");
    assert!(stack.queue_url.starts_with("https://"), "{}", stack.queue_url);
    // Redis as deployed: TLS only, and no plaintext client gets an answer on its port.
    let redis_port = stack.redis_url.rsplit(':').next().unwrap().to_string();
    assert!(stack.redis_url.starts_with("rediss://"), "{}", stack.redis_url);
    let plain = redis::Client::open(format!("redis://127.0.0.1:{redis_port}")).unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(5), async {
        let mut c = plain.get_multiplexed_async_connection().await?;
        redis::cmd("PING").query_async::<String>(&mut c).await
    })
    .await;
    assert!(!matches!(answer, Ok(Ok(_))), "a plaintext PING was answered: {answer:?}");
    let client = stack_common::client(&stack).await;
    stack_common::create_namespace(&client, "secure").await;
    let api: Api<Job> = Api::namespaced(client, "secure");
    let shape = kjob_chaos::plan::Shape::NonIndexed { completions: 2, parallelism: 2 };
    let job = shape.job("pi", kjob_core::DEFAULT_CONTROLLER_NAME, 200);
    stack_common::create_job_retrying(&api, &job).await;
    let jobs = stack_common::wait_terminal(&api, 1, Duration::from_secs(60)).await;
    let logs = || stack_common::log_tails(&stack, 20);
    let status = jobs[0].status.clone().unwrap_or_default();
    assert_eq!(status.succeeded, Some(2), "{status:?}\n{}", logs());
    let complete = status.conditions.unwrap_or_default();
    assert!(complete.iter().any(|c| c.type_ == "Complete" && c.status == "True"), "{}", logs());
    let out = tokio::task::block_in_place(|| inspect_as_inspector(&stack));
    assert!(out.starts_with("queue job"), "{out}");
    // The per-namespace table, through the inspector-only Namespaces RPC.
    assert!(out.contains("NAMESPACE") && out.contains("OLDEST_READY"), "{out}");
    // Nothing of the stack was refused.
    let admin = stack.admin_url(kjob_testkit::stack::QUEUE).unwrap();
    let text = reqwest::get(format!("{admin}/metrics")).await.unwrap().text().await.unwrap();
    let refused = stack_common::metric_sum(&text, "kjob_queue_auth_refused_total", &[]);
    assert_eq!(refused, 0.0, "{}", logs());
    // kjob-queue did its work as the ACL user `kjob`, over TLS: Redis saw its scripts run.
    let ca = std::fs::read(stack.redis_ca.as_ref().unwrap()).unwrap();
    let certs = redis::TlsCertificates { client_tls: None, root_cert: Some(ca) };
    let admin = redis::Client::build_with_tls(stack.redis_url.as_str(), certs).unwrap();
    let mut c = admin.get_multiplexed_async_connection().await.unwrap();
    let users: Vec<String> = redis::cmd("ACL").arg("USERS").query_async(&mut c).await.unwrap();
    assert!(users.contains(&"kjob".to_string()), "{users:?}");
    let stats: String = redis::cmd("INFO").arg("commandstats").query_async(&mut c).await.unwrap();
    assert!(stats.contains("cmdstat_evalsha:"), "{stats}");
}
