//! kjob-queue over a secured Redis (issue 44): TLS only (`rediss://`, the test CA made at test
//! time), client certificates required, the `default` user off and kjob's ACL user
//! (`kjob_workqueue::acl::ACL_RULES`). kjob-queue serves Add/Lease/Done over it and never prints
//! the password; a plain client and a client trusting another CA are refused, the latter with
//! an error that says what to fix; kjob's user cannot run what it does not need.

mod common;

use std::time::Duration;

use common::logs::Logs;
use kjob_queue::{Listeners, QueueConfig, Security};
use kjob_queue_client::{Outcome, QueueClient};
use kjob_svc::Shutdown;
use kjob_testkit::{RedisSecurity, RedisServer, TestPki};
use kjob_workqueue::{RedisOptions, RedisTarget, RedisTls, Store, StoreConfig};
use tokio::net::TcpListener;
use tracing::instrument::WithSubscriber;

const PASSWORD: &str = "s3cret-redis-pw";

/// A secured redis-server and the certificates it trusts.
fn secured_redis() -> (RedisServer, TestPki) {
    let pki = TestPki::generate("security").unwrap();
    let security = RedisSecurity {
        tls: Some(pki.dir().to_path_buf()),
        tls_auth_clients: true,
        acl: vec![
            "user default off".into(),
            kjob_workqueue::acl::acl_user_line("kjob", &format!(">{PASSWORD}")),
        ],
    };
    // DEBUG on, so that only the ACL stands in its way.
    (RedisServer::start_secured(&security, &["--enable-debug-command", "yes"]).unwrap(), pki)
}

/// The TLS files of a client of `pki`'s servers.
fn client_tls(pki: &TestPki) -> RedisTls {
    RedisTls {
        ca_file: Some(pki.ca()),
        cert_file: Some(pki.client_cert()),
        key_file: Some(pki.client_key()),
    }
}

/// kjob-queue (in process) over `rediss://kjob:PASSWORD@…` with the test CA and a client
/// certificate serves Add, Lease and Done; the URL it logs is redacted and no log line holds
/// the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kjob_queue_serves_over_rediss_as_the_acl_user_and_never_logs_the_password() {
    let (redis, pki) = secured_redis();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = Shutdown::new();
    let redis_url = format!("rediss://kjob:{PASSWORD}@127.0.0.1:{}", redis.port());
    let config = QueueConfig {
        redis: RedisOptions { tls: client_tls(&pki), ..Default::default() },
        ..QueueConfig::new(redis_url, Security::InsecureNoAuth)
    };
    assert!(!format!("{config:?}").contains(PASSWORD));
    let logs = Logs::default();
    let task = tokio::spawn(
        kjob_queue::run(Listeners::grpc(listener), config, shutdown.clone())
            .with_subscriber(logs.subscriber()),
    );
    let c = QueueClient::connect_lazy(&url).unwrap();
    let item = |key: &str| kjob_queue_client::AddItem {
        queue: "job".into(),
        key: key.into(),
        ..Default::default()
    };
    let add = c.add(vec![item("ns/a"), item("ns/b")]).await.unwrap();
    assert_eq!(add.added, 2);
    let got = c.lease("job", 10, Duration::from_secs(30), Duration::from_secs(1), "w1").await;
    let got = got.unwrap();
    assert_eq!(got.len(), 2);
    for i in &got {
        c.done("job", &i.key, &i.lease_id, Outcome::Forget).await.unwrap();
    }
    let s = c.stats("job").await.unwrap();
    assert_eq!((s.ready, s.leased), (0, 0));
    shutdown.cancel();
    task.await.unwrap().unwrap();

    let text = logs.text();
    assert!(text.contains(&format!("rediss://kjob:***@127.0.0.1:{}", redis.port())), "{text}");
    assert!(!text.contains(PASSWORD), "{text}");
}

/// A plain `redis://` client gets nothing from the TLS-only server; a TLS client that trusts
/// another CA fails at once (not retried forever) with an error naming the certificate
/// problem and the flag to fix, and without the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_clients_and_clients_trusting_another_ca_are_refused() {
    let (redis, pki) = secured_redis();
    let options = RedisOptions {
        password: Some(PASSWORD.into()),
        tls: client_tls(&pki),
        ..Default::default()
    };

    let plain = format!("redis://kjob@127.0.0.1:{}", redis.port());
    let plain =
        RedisTarget::new(&plain, &RedisOptions { tls: RedisTls::default(), ..options.clone() });
    let refused = tokio::time::timeout(
        Duration::from_secs(20),
        Store::connect_to(plain.unwrap(), StoreConfig::default()),
    )
    .await
    .expect("a refusal, not a hang");
    let e = refused.unwrap_err();
    assert!(!e.to_string().contains(PASSWORD), "{e}");

    let other = TestPki::generate("another").unwrap();
    let wrong_ca = RedisOptions {
        tls: RedisTls { ca_file: Some(other.ca()), ..client_tls(&pki) },
        ..options.clone()
    };
    let url = format!("rediss://kjob@127.0.0.1:{}", redis.port());
    let e = Store::connect_to(RedisTarget::new(&url, &wrong_ca).unwrap(), StoreConfig::default())
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(!e.is_unavailable(), "a wrong CA is a configuration error, not an outage: {text}");
    assert!(text.contains("certificate") && text.contains("--redis-ca-file"), "{text}");
    assert!(!text.contains(PASSWORD), "{text}");

    // kjob-queue itself stops with that error instead of retrying.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = QueueConfig { redis: wrong_ca, ..QueueConfig::new(url, Security::InsecureNoAuth) };
    let run = kjob_queue::run(Listeners::grpc(listener), config, Shutdown::new());
    let e = tokio::time::timeout(Duration::from_secs(20), run).await.unwrap().unwrap_err();
    let text = format!("{e:#}");
    assert!(text.contains("--redis-ca-file") && !text.contains(PASSWORD), "{text}");

    // Over TLS with the right CA but without kjob's password, or with another one: refused
    // too, since Redis's `default` user is off.
    for password in [None, Some("not-the-password".to_string())] {
        let without = RedisOptions { password, ..options.clone() };
        let url = format!("rediss://kjob@127.0.0.1:{}", redis.port());
        let target = RedisTarget::new(&url, &without).unwrap();
        let refused = tokio::time::timeout(
            Duration::from_secs(20),
            Store::connect_to(target, StoreConfig::default()),
        )
        .await
        .expect("a refusal, not a hang");
        let e = refused.unwrap_err().to_string();
        assert!(!e.contains(PASSWORD), "{e}");
    }

    // The right CA and password work (the refusals above were about TLS, nothing else).
    let good = RedisTarget::new(&format!("rediss://kjob@127.0.0.1:{}", redis.port()), &options);
    Store::connect_to(good.unwrap(), StoreConfig::default()).await.unwrap().ping().await.unwrap();
}

/// kjob's ACL user may run what kjob needs and nothing else: no FLUSHALL, FLUSHDB, CONFIG SET,
/// KEYS, DEBUG or EVAL of its own, and no key outside `{wq:*`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_acl_user_cannot_flush_reconfigure_or_touch_other_keys() {
    let (redis, pki) = secured_redis();
    let certs = redis::TlsCertificates {
        client_tls: Some(redis::ClientTlsConfig {
            client_cert: std::fs::read(pki.client_cert()).unwrap(),
            client_key: std::fs::read(pki.client_key()).unwrap(),
        }),
        root_cert: Some(std::fs::read(pki.ca()).unwrap()),
    };
    let url = format!("rediss://kjob:{PASSWORD}@127.0.0.1:{}", redis.port());
    let client = redis::Client::build_with_tls(url.as_str(), certs).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let allowed: String =
        redis::cmd("SET").arg("{wq:job}:probe").arg("1").query_async(&mut c).await.unwrap();
    assert_eq!(allowed, "OK");
    let refused: [&[&str]; 9] = [
        &["FLUSHALL"],
        &["FLUSHDB"],
        &["CONFIG", "SET", "maxmemory", "1"],
        &["KEYS", "*"],
        &["DEBUG", "SLEEP", "0"],
        &["EVAL", "return 1", "0"],
        &["ACL", "LIST"],
        &["SET", "other", "1"],
        &["GET", "other"],
    ];
    for args in refused {
        let mut cmd = redis::cmd(args[0]);
        cmd.arg(&args[1..]);
        let e = cmd.query_async::<redis::Value>(&mut c).await.unwrap_err();
        assert!(e.to_string().contains("NOPERM"), "{args:?}: {e}");
    }
    // Still there: nothing was flushed.
    let kept: Option<String> =
        redis::cmd("GET").arg("{wq:job}:probe").query_async(&mut c).await.unwrap();
    assert_eq!(kept.as_deref(), Some("1"));
}
