//! Real kjob-queue processes: concurrency across replicas, and crashes of lessees, of
//! kjob-queue and of redis-server.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kjob_queue_client::{AddItem, ClientError, Outcome, QueueClient};
use kjob_testkit::{ChildGuard, RedisServer, free_port, wait_for_tcp};
use parking_lot::Mutex;
use rand::Rng;

/// Long-poll wait of the doomed lessee's Lease calls.
const WAIT: Duration = Duration::from_secs(5);

/// A kjob-queue process on a fixed (free) port, restartable on the same port.
struct QueueProc {
    port: u16,
    redis_url: String,
    child: ChildGuard,
}

impl QueueProc {
    fn start(redis_url: &str) -> Self {
        let port = free_port();
        let child = spawn_queue(port, redis_url);
        Self { port, redis_url: redis_url.to_string(), child }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn restart(&mut self) {
        self.child.kill();
        self.child = spawn_queue(self.port, &self.redis_url);
    }
}

fn spawn_queue(port: u16, redis_url: &str) -> ChildGuard {
    let mut cmd =
        Command::new(kjob_testkit::bin_path("kjob-queue").expect("make build builds kjob-queue"));
    cmd.args(["--listen", &format!("127.0.0.1:{port}"), "--redis-url", redis_url])
        .arg("--insecure-no-auth")
        .args(["--admin-listen", &format!("127.0.0.1:{}", free_port())])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let child = ChildGuard::spawn(format!("kjob-queue:{port}"), &mut cmd).unwrap();
    wait_for_tcp(SocketAddr::from(([127, 0, 0, 1], port)), Duration::from_secs(15)).unwrap();
    child
}

fn item(key: &str, delay_ms: u64) -> AddItem {
    let delay = Duration::from_millis(delay_ms);
    AddItem { queue: "job".into(), key: key.into(), delay, ..Default::default() }
}

async fn empty(c: &QueueClient) -> bool {
    c.stats("job").await.is_ok_and(|s| s.ready + s.delayed + s.leased == 0)
}

/// Done, retried while the call fails. A lost lease ends it quietly: the client's own retry
/// of a Done whose first answer timed out finds the lease already finished (leases last 30 s
/// here, so one that really expired would show as a key held twice, which the test counts).
async fn done_retrying(c: &QueueClient, key: &str, lease_id: &str) {
    for attempt in 1.. {
        match c.done("job", key, lease_id, Outcome::Forget).await {
            Ok(_) => return,
            Err(ClientError::LeaseLost(m)) => {
                eprintln!("done of {key}: lease already finished ({m})");
                return;
            }
            Err(e) if attempt < 10 => {
                eprintln!("done of {key} failed, retrying: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("done of {key}: {e}"),
        }
    }
}

#[derive(Default)]
struct Ledger {
    /// Key → worker currently processing it.
    holders: HashMap<String, usize>,
    /// Key → when its last Add started.
    last_add: HashMap<String, Instant>,
    /// Key → when its last lease was received.
    last_lease: HashMap<String, Instant>,
    processed: u64,
    double_holds: u64,
}

/// 8 lessees over 2 kjob-queue processes, one adder over 10,000 keys with random re-adds (some
/// delayed): every key is leased after its last add, and no key is ever held twice at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_lessees_two_replicas_ten_thousand_keys() {
    const KEYS: usize = 10_000;
    const READDS: usize = 3_000;
    let redis = RedisServer::start().unwrap();
    let replicas = [QueueProc::start(&redis.url()), QueueProc::start(&redis.url())];
    let clients: Vec<QueueClient> =
        replicas.iter().map(|r| QueueClient::connect_lazy(&r.url()).unwrap()).collect();
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let leases_seen = Arc::new(AtomicU64::new(0));

    let mut lessees = Vec::new();
    for w in 0..8 {
        let (c, ledger, stop, seen) =
            (clients[w % 2].clone(), ledger.clone(), stop.clone(), leases_seen.clone());
        lessees.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                // A call that fails under load (a timeout on a busy machine) is retried as a
                // worker would; a lessee that died here would strand its keys for a lease.
                let id = format!("w{w}");
                let lease =
                    c.lease("job", 10, Duration::from_secs(30), Duration::from_millis(300), &id);
                let items = match lease.await {
                    Ok(items) => items,
                    Err(e) => {
                        eprintln!("w{w}: lease failed, retrying: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                {
                    let mut l = ledger.lock();
                    for it in &items {
                        seen.fetch_add(1, Ordering::Relaxed);
                        if l.holders.insert(it.key.clone(), w).is_some() {
                            l.double_holds += 1;
                        }
                        l.last_lease.insert(it.key.clone(), Instant::now());
                    }
                }
                if rand::rng().random_ratio(1, 20) {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                {
                    // Check out before Done: after Done another lessee may take the key.
                    let mut l = ledger.lock();
                    for it in &items {
                        l.holders.remove(&it.key);
                        l.processed += 1;
                    }
                }
                let dones = items.iter().map(|it| done_retrying(&c, &it.key, &it.lease_id));
                futures::future::join_all(dones).await;
            }
        }));
    }

    let adder = {
        let (clients, ledger) = (clients.clone(), ledger.clone());
        tokio::spawn(async move {
            let keys: Vec<String> =
                (0..KEYS).map(|i| format!("ns-{:02}/job-{i:05}", i % 17)).collect();
            let mut readds = 0;
            for (n, chunk) in keys.chunks(100).enumerate() {
                let mut batch: Vec<AddItem> = chunk.iter().map(|k| item(k, 0)).collect();
                // Random re-adds of keys added earlier, some with a short delay.
                {
                    let mut rng = rand::rng();
                    let upto = (n + 1) * 100;
                    for _ in 0..READDS / (KEYS / 100) {
                        let k = &keys[rng.random_range(0..upto)];
                        let delay =
                            if rng.random_ratio(1, 5) { rng.random_range(1..50) } else { 0 };
                        batch.push(item(k, delay));
                        readds += 1;
                    }
                }
                {
                    let mut l = ledger.lock();
                    let now = Instant::now();
                    for it in &batch {
                        // Every add is followed by a lease. Not necessarily after a delayed add
                        // is due: a key already waiting keeps its earlier time (the queue's
                        // documented rule), and that lease answers the add too.
                        l.last_add.insert(it.key.clone(), now);
                    }
                }
                clients[n % 2].add(batch).await.unwrap();
            }
            readds
        })
    };
    let readds = adder.await.unwrap();
    assert_eq!(readds, READDS);

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let done = {
            let l = ledger.lock();
            l.last_add.len() == KEYS
                && l.last_add.iter().all(|(k, t)| l.last_lease.get(k).is_some_and(|lt| lt > t))
        };
        if done && empty(&clients[0]).await {
            break;
        }
        assert!(!lessees.iter().any(|l| l.is_finished()), "a lessee ended early (see its panic)");
        assert!(Instant::now() < deadline, "not every key was processed after its last add");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for l in lessees {
        l.await.unwrap();
    }
    assert!(empty(&clients[1]).await);
    let l = ledger.lock();
    assert_eq!(l.double_holds, 0, "a key was held by two lessees at once");
    assert!(l.holders.is_empty());
    assert!(l.processed >= KEYS as u64, "{}", l.processed);
    assert!(l.processed <= (KEYS + READDS) as u64, "more runs than adds: {}", l.processed);
    assert_eq!(leases_seen.load(Ordering::SeqCst), l.processed);
}

/// A lessee that vanishes mid-lease (its connection gone, no Done, no renewal): its keys come
/// back once the leases expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_lessee_keys_come_back_after_expiry() {
    let redis = RedisServer::start().unwrap();
    let q = QueueProc::start(&redis.url());
    let c = QueueClient::connect_lazy(&q.url()).unwrap();
    let keys: Vec<String> = (0..5).map(|i| format!("ns/k{i}")).collect();
    c.add(keys.iter().map(|k| item(k, 0)).collect()).await.unwrap();

    // The doomed lessee has a connection of its own, dropped with it.
    let lessee = QueueClient::connect_lazy(&q.url()).unwrap();
    let mut held = HashSet::new();
    while held.len() < 5 {
        for it in lessee.lease("job", 5, Duration::from_secs(2), WAIT, "doomed").await.unwrap() {
            held.insert(it.key);
        }
    }
    drop(lessee);
    let killed_at = Instant::now();
    let v = c.inspect("job", keys.clone()).await.unwrap().keys;
    assert!(v.iter().all(|k| k.state == "leased" && k.lease_holder == "doomed"), "{v:?}");

    let mut back = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    while back.len() < 5 {
        assert!(Instant::now() < deadline, "keys did not come back: {back:?}");
        for it in c
            .lease("job", 10, Duration::from_secs(30), Duration::from_secs(1), "rescuer")
            .await
            .unwrap()
        {
            back.insert(it.key.clone());
            c.done("job", &it.key, &it.lease_id, Outcome::Forget).await.unwrap();
        }
    }
    assert_eq!(back, held);
    // Not before the lease ran out (2 s from lease time, which preceded the kill).
    assert!(killed_at.elapsed() >= Duration::from_millis(500), "{:?}", killed_at.elapsed());
    assert!(empty(&c).await);
}

/// kjob-queue SIGKILLed and restarted mid-run: clients retry, nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_restart_mid_run_loses_nothing() {
    const KEYS: usize = 2_000;
    let redis = RedisServer::start().unwrap();
    let mut q = QueueProc::start(&redis.url());
    let c = QueueClient::connect_lazy(&q.url()).unwrap();
    let keys: Vec<String> = (0..KEYS).map(|i| format!("ns/k{i:04}")).collect();
    let processed = Arc::new(Mutex::new(HashSet::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut lessees = Vec::new();
    for w in 0..4 {
        let (c, processed, stop) = (c.clone(), processed.clone(), stop.clone());
        lessees.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                // Short leases: a lease granted while the server died comes back quickly.
                let items = c
                    .lease(
                        "job",
                        10,
                        Duration::from_secs(2),
                        Duration::from_millis(300),
                        &format!("w{w}"),
                    )
                    .await
                    .unwrap();
                for it in items {
                    match c.done("job", &it.key, &it.lease_id, Outcome::Forget).await {
                        // A retried Done whose first attempt landed is reported as lost: done.
                        Ok(_) | Err(ClientError::LeaseLost(_)) => {
                            processed.lock().insert(it.key);
                        }
                        Err(e) => panic!("done: {e}"),
                    }
                }
            }
        }));
    }
    for (n, chunk) in keys.chunks(100).enumerate() {
        c.add(chunk.iter().map(|k| item(k, 0)).collect()).await.unwrap();
        if n == 10 {
            q.restart();
        }
    }
    let deadline = Instant::now() + Duration::from_secs(40);
    while processed.lock().len() < KEYS || !empty(&c).await {
        assert!(
            Instant::now() < deadline,
            "lost keys: {} of {KEYS} processed",
            processed.lock().len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for l in lessees {
        l.await.unwrap();
    }
    assert_eq!(processed.lock().len(), KEYS);
}

/// redis-server with AOF (appendfsync everysec) SIGKILLed and restarted: acknowledged state
/// older than the fsync second survives (a process crash keeps even newer writes, which are in
/// the page cache; only an OS crash or power loss may drop the last ~1–2 s of acknowledged
/// writes, which the watcher's resync re-enqueues).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_with_aof_keeps_acknowledged_state() {
    let mut redis = RedisServer::start_with_aof().unwrap();
    let q = QueueProc::start(&redis.url());
    let c = QueueClient::connect_lazy(&q.url()).unwrap();
    let keys: Vec<String> = (0..500).map(|i| format!("ns/k{i:03}")).collect();
    c.add(keys.iter().map(|k| item(k, 0)).collect()).await.unwrap();
    let leased = c.lease("job", 100, Duration::from_secs(60), Duration::ZERO, "w").await.unwrap();
    assert_eq!(leased.len(), 100);
    c.set_expectations("ns/k000", "u1", 3, 0).await.unwrap();
    // Let the everysec fsync pass.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    redis.kill();
    redis.restart().unwrap();
    let s = tokio::time::timeout(Duration::from_secs(20), c.stats("job")).await.unwrap().unwrap();
    assert_eq!((s.ready, s.leased), (400, 100));
    let e = c.get_expectations("ns/k000", "u1").await.unwrap();
    assert!(e.exists && !e.satisfied && e.add == 3);
    // The leases survived with their fencing ids.
    let it = &leased[0];
    c.done("job", &it.key, &it.lease_id, Outcome::Forget).await.unwrap();
}
