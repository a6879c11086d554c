//! Bad input against a real kjob-queue process: random and malformed queues, keys, delays,
//! lease ids and counts. Every answer must be a success or an error status (never a dropped
//! connection from a crash), the process must stay up, and afterwards every touched key is in
//! exactly one known state with Stats agreeing.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use kjob_proto::v1;
use kjob_proto::v1::job_state_client::JobStateClient;
use kjob_proto::v1::queue_client::QueueClient;
use kjob_testkit::{ChildGuard, RedisServer, bin_path, free_port, wait_for_tcp};
use proptest::prelude::*;
use tonic::transport::Channel;

/// Per-call deadline: a hung call is a failure too.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
enum Req {
    Add {
        queue: String,
        key: String,
        delay_ms: u64,
        observe_only: bool,
        /// Shared-view writes: (kind, name, object length, resource_version) and the session.
        cache: Vec<(i32, String, usize, String)>,
        session: String,
        /// The Job's pod priority (any int32, or none).
        priority: Option<i32>,
    },
    GetView {
        key: String,
        /// A delta read's base version and epoch token (any).
        base: Option<u64>,
        epoch: String,
    },
    Forget {
        key: String,
        pod_uids: Vec<String>,
    },
    DeleteRecord {
        key: String,
        name: String,
    },
    PutView {
        key: String,
        uid: String,
        object: usize,
        rv: String,
        handled: u64,
    },
    Session {
        session: String,
        phase: i32,
    },
    /// Sent as it is.
    Lease(v1::LeaseRequest),
    Renew {
        queue: String,
        key: String,
        lease_id: String,
        lease_ms: u64,
    },
    Done(Box<Done>),
    /// DoneBatch of `items` repeated `times` (0 items, or 201 and more, are malformed batches).
    DoneBatch {
        items: Vec<Done>,
        times: usize,
    },
    Inspect {
        queue: String,
        keys: Vec<String>,
    },
    Stats {
        queue: String,
    },
    Namespaces(v1::NamespacesRequest),
    /// GateEvents of `events` (object key, spam, aggregate and event keys, message) repeated
    /// `times` (past 256 events, a malformed batch).
    Gate {
        events: Vec<(String, String, String, String, String)>,
        times: usize,
    },
}

/// A Done's (queue, key, lease_id, outcome, requeue_after_ms), its view write-back, the
/// expectations it raises and the finalizer removals it expects.
#[derive(Debug, Clone)]
struct Done((String, String, String, i32, u64), Option<WriteBack>, Option<Raise>, Option<Removals>);

impl Done {
    fn into_proto(self) -> v1::DoneRequest {
        let Done((queue, key, lease_id, outcome, requeue_after_ms), write_back, raise, removals) =
            self;
        v1::DoneRequest {
            queue,
            key,
            lease_id,
            outcome,
            requeue_after_ms,
            view_write_back: write_back.map(WriteBack::into_proto),
            expectations: raise.map(Raise::into_proto),
            finalizer_removals: removals.map(Removals::into_proto),
            error: String::new(),
        }
    }
}

fn done() -> impl Strategy<Value = Done> {
    (
        (text(), text(), text(), -2i32..6, count()),
        proptest::option::of(write_back()),
        proptest::option::of(raise()),
        proptest::option::of(removals()),
    )
        .prop_map(|(fields, write_back, raise, removals)| Done(fields, write_back, raise, removals))
}

/// Finalizer removals riding on a Done: (key, job UID, pod UIDs).
#[derive(Debug, Clone)]
struct Removals(String, String, Vec<String>);

impl Removals {
    fn into_proto(self) -> v1::ExpectFinalizerRemovalsRequest {
        let Removals(key, job_uid, pod_uids) = self;
        v1::ExpectFinalizerRemovalsRequest { key, job_uid, pod_uids }
    }
}

fn removals() -> impl Strategy<Value = Removals> {
    (text(), text(), proptest::collection::vec(text(), 0..4))
        .prop_map(|(k, u, p)| Removals(k, u, p))
}

/// Expectations riding on a Done: (key, job UID, add, del, created pod UIDs).
#[derive(Debug, Clone)]
struct Raise(String, String, i64, i64, Vec<String>);

impl Raise {
    fn into_proto(self) -> v1::SetExpectationsRequest {
        let Raise(key, job_uid, add, del, created_pod_uids) = self;
        v1::SetExpectationsRequest { key, job_uid, add, del, created_pod_uids }
    }
}

fn raise() -> impl Strategy<Value = Raise> {
    let n = prop_oneof![Just(0i64), -2i64..4, Just(i64::MAX), Just(i64::MIN)];
    (text(), text(), n.clone(), n, proptest::collection::vec(text(), 0..4))
        .prop_map(|(k, u, a, d, p)| Raise(k, u, a, d, p))
}

/// A view write-back riding on a Done: (key, job UID, object length, resourceVersion).
#[derive(Debug, Clone)]
struct WriteBack(String, String, usize, String);

impl WriteBack {
    fn into_proto(self) -> v1::PutJobViewRequest {
        let WriteBack(key, job_uid, len, resource_version) = self;
        v1::PutJobViewRequest {
            key,
            job_uid,
            job: vec![b'x'; len],
            resource_version,
            orphans_handled: 0,
        }
    }
}

fn write_back() -> impl Strategy<Value = WriteBack> {
    (text(), text(), object_len(), text()).prop_map(|(k, u, l, rv)| WriteBack(k, u, l, rv))
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("job".to_string()),
        Just("orphan-pod".to_string()),
        Just("default/a".to_string()),
        Just("ns/b".to_string()),
        "[a-z/{}\\x00-\\x1f\"'\\\\ ]{0,12}",
        ".{0,40}",
        "[a-z]{300,400}",
    ]
}

/// Sizes of view objects: empty, small, and past kjob-queue's 1.5 MiB limit.
fn object_len() -> impl Strategy<Value = usize> {
    prop_oneof![Just(0usize), 1usize..64, Just(1536 * 1024 + 1)]
}

fn count() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), 0u64..5_000, Just(u64::MAX), Just(i64::MAX as u64 + 1)]
}

fn req() -> impl Strategy<Value = Req> {
    prop_oneof![
        (
            text(),
            text(),
            count(),
            any::<bool>(),
            proptest::collection::vec((-1i32..9, text(), object_len(), text()), 0..4),
            text(),
            proptest::option::of(any::<i32>()),
        )
            .prop_map(|(queue, key, delay_ms, observe_only, cache, session, priority)| {
                Req::Add { queue, key, delay_ms, observe_only, cache, session, priority }
            }),
        (text(), proptest::option::of(count()), text())
            .prop_map(|(key, base, epoch)| Req::GetView { key, base, epoch }),
        (text(), proptest::collection::vec(text(), 0..5))
            .prop_map(|(key, pod_uids)| Req::Forget { key, pod_uids }),
        (text(), text()).prop_map(|(key, name)| Req::DeleteRecord { key, name }),
        (text(), text(), object_len(), text(), count()).prop_map(
            |(key, uid, object, rv, handled)| Req::PutView { key, uid, object, rv, handled }
        ),
        (text(), -1i32..5).prop_map(|(session, phase)| Req::Session { session, phase }),
        (
            (text(), any::<u32>(), count(), 0u64..50, text()),
            (
                any::<bool>(),
                proptest::collection::vec(text(), 0..20),
                proptest::collection::vec(done(), 0..3),
                // Views a lessee says it holds: any key and epoch token, any version.
                proptest::collection::vec((text(), count(), text()), 0..4)
            )
        )
            .prop_map(
                |(
                    (queue, max_items, lease_ms, wait_ms, worker_id),
                    (with_views, view_records, dones, cached),
                )| {
                    Req::Lease(v1::LeaseRequest {
                        queue,
                        max_items,
                        lease_ms,
                        wait_ms,
                        worker_id,
                        with_views,
                        view_records,
                        dones: dones.into_iter().map(Done::into_proto).collect(),
                        cached_views: cached
                            .into_iter()
                            .map(|(key, version, epoch)| v1::CachedView { key, version, epoch })
                            .collect(),
                        view_names: with_views,
                    })
                }
            ),
        (text(), text(), text(), count()).prop_map(|(queue, key, lease_id, lease_ms)| Req::Renew {
            queue,
            key,
            lease_id,
            lease_ms
        }),
        done().prop_map(|d| Req::Done(Box::new(d))),
        (proptest::collection::vec(done(), 0..5), prop_oneof![Just(1usize), Just(67)])
            .prop_map(|(items, times)| Req::DoneBatch { items, times }),
        (text(), proptest::collection::vec(text(), 0..5))
            .prop_map(|(queue, keys)| Req::Inspect { queue, keys }),
        text().prop_map(|queue| Req::Stats { queue }),
        (
            text(),
            text(),
            prop_oneof![Just(0u32), Just(3), Just(1001)],
            prop_oneof![Just(0u32), Just(5), Just(101)]
        )
            .prop_map(|(queue, namespace, limit, oldest_keys)| Req::Namespaces(
                v1::NamespacesRequest { queue, namespace, limit, oldest_keys }
            )),
        (
            proptest::collection::vec((text(), text(), text(), text(), text()), 0..4),
            prop_oneof![Just(1usize), Just(30), Just(257)],
        )
            .prop_map(|(events, times)| Req::Gate { events, times }),
    ]
}

async fn send(
    c: &mut QueueClient<Channel>,
    e: &JobStateClient<Channel>,
    r: Req,
) -> Result<(), tonic::Status> {
    let call = async {
        match r {
            Req::Add { queue, key, delay_ms, observe_only, cache, session, priority } => c
                .add(v1::AddRequest {
                    items: vec![v1::AddItem {
                        queue,
                        key,
                        delay_ms,
                        observations: vec![],
                        observe_only,
                        cache: cache
                            .into_iter()
                            .map(|(kind, name, len, resource_version)| v1::CacheOp {
                                kind,
                                name,
                                object: vec![b'x'; len],
                                resource_version,
                            })
                            .collect(),
                        cache_session: session,
                        priority,
                    }],
                })
                .await
                .map(drop),
            Req::GetView { key, base, epoch } => {
                let mut e = e.clone();
                e.get_job_view(v1::GetJobViewRequest {
                    key,
                    records: vec!["backoff".into()],
                    base_version: base,
                    base_epoch: epoch,
                    with_names: base.is_some(),
                    ..Default::default()
                })
                .await
                .map(drop)
            }
            Req::Forget { key, pod_uids } => {
                let mut e = e.clone();
                e.forget_finalizer_removals(v1::ForgetFinalizerRemovalsRequest { key, pod_uids })
                    .await
                    .map(drop)
            }
            Req::DeleteRecord { key, name } => {
                let mut e = e.clone();
                e.delete_record(v1::DeleteRecordRequest { key, name }).await.map(drop)
            }
            Req::PutView { key, uid, object, rv, handled } => {
                let mut e = e.clone();
                e.put_job_view(v1::PutJobViewRequest {
                    key,
                    job_uid: uid,
                    job: vec![b'x'; object],
                    resource_version: rv,
                    orphans_handled: handled,
                })
                .await
                .map(drop)
            }
            Req::Session { session, phase } => {
                let mut e = e.clone();
                e.cache_session(v1::CacheSessionRequest { session, phase }).await.map(drop)
            }
            Req::Lease(lease) => c.lease(lease).await.map(drop),
            Req::Renew { queue, key, lease_id, lease_ms } => {
                c.renew(v1::RenewRequest { queue, key, lease_id, lease_ms }).await.map(drop)
            }
            Req::Done(done) => c.done(done.into_proto()).await.map(drop),
            Req::DoneBatch { items, times } => {
                let one: Vec<v1::DoneRequest> = items.into_iter().map(Done::into_proto).collect();
                let items = one.iter().cycle().take(one.len() * times).cloned().collect();
                let resp = c.done_batch(v1::DoneBatchRequest { items }).await?.into_inner();
                // Every accepted batch answers each item with OK or FAILED_PRECONDITION.
                let codes = [tonic::Code::Ok as i32, tonic::Code::FailedPrecondition as i32];
                match resp.results.iter().find(|r| !codes.contains(&r.code)) {
                    Some(r) => Err(tonic::Status::internal(format!("bad item result {r:?}"))),
                    None if resp.results.len() != one.len() * times => {
                        Err(tonic::Status::internal("DoneBatch result count differs"))
                    }
                    None => Ok(()),
                }
            }
            Req::Inspect { queue, keys } => {
                c.inspect(v1::InspectRequest { queue, keys }).await.map(drop)
            }
            Req::Stats { queue } => c.stats(v1::StatsRequest { queue }).await.map(drop),
            Req::Namespaces(r) => c.namespaces(r).await.map(drop),
            Req::Gate { events, times } => {
                let one: Vec<v1::GateEvent> = events
                    .into_iter()
                    .map(|(object_key, spam_key, aggregate_key, event_key, message)| {
                        v1::GateEvent { object_key, spam_key, aggregate_key, event_key, message }
                    })
                    .collect();
                let events: Vec<v1::GateEvent> =
                    one.iter().cycle().take(one.len() * times).cloned().collect();
                let sent = events.len();
                let mut e = e.clone();
                let resp = e.gate_events(v1::GateEventsRequest { events }).await?.into_inner();
                // An accepted batch answers every event, in order.
                if resp.events.len() != sent {
                    return Err(tonic::Status::internal("GateEvents answer count differs"));
                }
                Ok(())
            }
        }
    };
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(r) => r,
        Err(_) => Err(tonic::Status::deadline_exceeded("harness timeout")),
    }
}

#[test]
fn malformed_queue_requests_get_answers_and_keep_invariants() {
    let redis = RedisServer::start().unwrap();
    let port = free_port();
    let mut cmd = Command::new(bin_path("kjob-queue").expect("run `cargo build --bins` first"));
    cmd.arg(format!("--listen=127.0.0.1:{port}"))
        .arg(format!("--redis-url={}", redis.url()))
        .arg(format!("--admin-listen=127.0.0.1:{}", free_port()))
        .arg("--insecure-no-auth")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let queue = std::cell::RefCell::new(ChildGuard::spawn("kjob-queue", &mut cmd).unwrap());
    wait_for_tcp(SocketAddr::from(([127, 0, 0, 1], port)), Duration::from_secs(30)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let channel = rt
        .block_on(async { tonic::transport::Endpoint::from_shared(url)?.connect().await })
        .unwrap();
    let mut client = QueueClient::new(channel.clone());
    let expectations = JobStateClient::new(channel);

    let cfg = ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() };
    let mut runner = proptest::test_runner::TestRunner::new(cfg);
    runner
        .run(&proptest::collection::vec(req(), 1..12), |reqs| {
            // Clients are cheap handles on one channel; the runner wants an `Fn` closure.
            let mut c = client.clone();
            for r in reqs {
                let what = format!("{r:?}");
                if let Err(st) = rt.block_on(send(&mut c, &expectations, r)) {
                    // A crashed server shows up as a transport error (Unknown/Unavailable
                    // without a server message) or a harness timeout.
                    prop_assert!(
                        !matches!(st.code(), tonic::Code::DeadlineExceeded | tonic::Code::Unknown),
                        "{what}: {st:?}"
                    );
                    prop_assert!(!st.message().contains("transport error"), "{what}: {st:?}");
                    // Internal is what a wrong DoneBatch answer turns into (see `send`).
                    prop_assert!(st.code() != tonic::Code::Internal, "{what}: {st:?}");
                }
                prop_assert!(!queue.borrow_mut().has_exited(), "kjob-queue exited after {what}");
            }
            Ok(())
        })
        .unwrap();

    // Invariants afterwards: every well-formed queue answers Stats, and what Inspect reports
    // for the keys the strategies reuse agrees with it (a key is in one state only).
    rt.block_on(async {
        for q in ["job", "orphan-pod"] {
            let stats =
                client.stats(v1::StatsRequest { queue: q.into() }).await.unwrap().into_inner();
            let keys: Vec<String> = ["default/a", "ns/b"].map(String::from).into();
            let ins = client
                .inspect(v1::InspectRequest { queue: q.into(), keys })
                .await
                .unwrap()
                .into_inner();
            let n = |st: &str| ins.keys.iter().filter(|k| k.state == st).count() as u64;
            assert!(n("ready") <= stats.ready, "{q}: inspect {ins:?} vs stats {stats:?}");
            assert!(n("delayed") <= stats.delayed, "{q}: inspect {ins:?} vs stats {stats:?}");
            assert!(n("leased") <= stats.leased, "{q}: inspect {ins:?} vs stats {stats:?}");
            for k in &ins.keys {
                let known = ["absent", "ready", "delayed", "leased"];
                assert!(known.contains(&k.state.as_str()), "{q}: unknown state {k:?}");
            }
        }
    });
    assert!(!queue.borrow_mut().has_exited(), "kjob-queue still runs");
}
