//! kjob-queue's input limits, sent one past each by a raw gRPC client (not kjob's own client,
//! which would refuse some of them before sending): every request is refused with
//! INVALID_ARGUMENT naming the rule, and Redis holds exactly what it held before.

use std::time::Duration;

use kjob_proto::v1;
use kjob_proto::v1::job_state_client::JobStateClient;
use kjob_proto::v1::queue_client::QueueClient;
use kjob_queue::validate;
use kjob_queue::{Listeners, QueueConfig, Security};
use kjob_svc::Shutdown;
use kjob_testkit::RedisServer;
use tokio::net::TcpListener;
use tonic::transport::Channel;

fn item(key: &str) -> v1::AddItem {
    v1::AddItem { queue: "job".into(), key: key.into(), ..Default::default() }
}

/// Asserts that `res` is INVALID_ARGUMENT whose message contains every one of `words`.
fn refused<T: std::fmt::Debug>(what: &str, res: Result<T, tonic::Status>, words: &[&str]) {
    let status = res.expect_err(what);
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{what}: {status:?}");
    for w in words {
        assert!(status.message().contains(w), "{what}: {:?} lacks {w:?}", status.message());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_past_every_limit_is_refused_and_changes_nothing() {
    let redis = RedisServer::start().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = Shutdown::new();
    let config = QueueConfig::new(redis.url(), Security::InsecureNoAuth);
    let listeners = Listeners { grpc: listener, admin: None };
    let task = tokio::spawn(kjob_queue::run(listeners, config, shutdown.clone()));
    let channel = Channel::from_shared(url).unwrap().connect_lazy();
    let big = validate::MAX_MESSAGE_BYTES;
    let mut q = QueueClient::new(channel.clone())
        .max_encoding_message_size(big)
        .max_decoding_message_size(big);
    let mut s =
        JobStateClient::new(channel).max_encoding_message_size(big).max_decoding_message_size(big);

    // Something legitimate first, so "unchanged" compares a Redis that holds queue state.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match q.add(v1::AddRequest { items: vec![item("ns/real")] }).await {
            Ok(_) => break,
            Err(e) if tokio::time::Instant::now() < deadline => {
                eprintln!("waiting for kjob-queue: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("kjob-queue never answered: {e}"),
        }
    }
    let before = redis.snapshot().await.unwrap();
    assert!(!before.is_empty());

    // Keys that are not Kubernetes names would land on another key's Redis key.
    for key in ["ns/real:seen", "ns/real:pods", "ns/{wq:job}", "NS/a", "ns/a_b"] {
        let res = q.add(v1::AddRequest { items: vec![item(key)] }).await;
        refused(&format!("Add {key}"), res, &["DNS-1123"]);
        let res = s.get_job_view(v1::GetJobViewRequest { key: key.into(), ..Default::default() });
        refused(&format!("GetJobView {key}"), res.await, &["DNS-1123"]);
        let res = s
            .set_expectations(v1::SetExpectationsRequest {
                key: key.into(),
                job_uid: "u".into(),
                add: 1,
                ..Default::default()
            })
            .await;
        refused(&format!("SetExpectations {key}"), res, &["DNS-1123"]);
    }

    let too_many = vec![item("ns/a"); validate::MAX_ADD_ITEMS + 1];
    let res = q.add(v1::AddRequest { items: too_many }).await;
    refused("Add of too many items", res, &[&validate::MAX_ADD_ITEMS.to_string()]);

    let lease = |max_items, lease_ms, wait_ms| v1::LeaseRequest {
        queue: "job".into(),
        worker_id: "w".into(),
        max_items,
        lease_ms,
        wait_ms,
        ..Default::default()
    };
    let res = q.lease(lease(validate::MAX_LEASE_ITEMS + 1, 1000, 0)).await;
    refused("Lease of too many keys", res, &["max_items", &validate::MAX_LEASE_ITEMS.to_string()]);
    let res = q.lease(lease(1, validate::MAX_LEASE_MS + 1, 0)).await;
    refused("Lease held too long", res, &["lease_ms"]);
    let res = q.lease(lease(1, 1000, validate::MAX_WAIT_MS + 1)).await;
    refused("Lease waiting too long", res, &["wait_ms"]);

    let res = q
        .add(v1::AddRequest {
            items: vec![v1::AddItem { delay_ms: validate::MAX_DELAY_MS + 1, ..item("ns/a") }],
        })
        .await;
    refused("Add delayed past the limit", res, &["30 days"]);

    let record = |name: String, value: Vec<u8>| v1::PutRecordRequest {
        key: "ns/real".into(),
        name,
        value,
        ttl_ms: 0,
    };
    let res = s.put_record(record("backoff".into(), vec![0; validate::MAX_RECORD_BYTES + 1])).await;
    refused("PutRecord too large", res, &[&validate::MAX_RECORD_BYTES.to_string()]);
    let res = s.put_record(record("n".repeat(validate::MAX_ID_LEN + 1), vec![1])).await;
    refused("PutRecord name too long", res, &[&validate::MAX_ID_LEN.to_string()]);

    let res = s
        .set_expectations(v1::SetExpectationsRequest {
            key: "ns/real".into(),
            job_uid: "u".into(),
            add: 1_000_001,
            ..Default::default()
        })
        .await;
    refused("SetExpectations past the count limit", res, &["1000000"]);

    let after = redis.snapshot().await.unwrap();
    assert_eq!(before.keys().collect::<Vec<_>>(), after.keys().collect::<Vec<_>>());
    assert!(before == after, "a refused request changed Redis");

    shutdown.cancel();
    task.await.unwrap().unwrap();
}
