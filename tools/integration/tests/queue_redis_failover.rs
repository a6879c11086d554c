//! kjob-queue on a Redis Cluster with replicas follows a failover without a restart: the
//! master holding a leased key's shard is killed mid-run, its replica takes over, and the same running
//! kjob-queue keeps serving. Everything Redis had replicated before the kill survives, a lease
//! granted before it is honoured (renewed, finished), and the data-loss fence holds new leases
//! for the longest lease granted, because the new master is another Redis process.

use std::time::{Duration, Instant};

use kjob_queue::{Listeners, QueueConfig, Security};
use kjob_queue_client::{AddItem, Outcome, QueueClient};
use kjob_svc::Shutdown;
use kjob_testkit::{RedisCluster, TestPki};
use kjob_workqueue::{RedisOptions, RedisTls};
use tokio::net::TcpListener;

/// Lease of the one key held across the failover: twice [`SERVED_AGAIN_WITHIN`], so a renewal
/// that comes in time always finds it; also the longest lease granted, so the hold.
const LEASE: Duration = Duration::from_secs(20);
/// kjob-queue answers for the dead master's shards again within this of the kill: the failover
/// (1 s node timeout and an election, ~2 s here) plus a retry pause; measured 2.3-8.4 s
/// (median 2.9 s) over 20 failovers on a loaded 2-core machine. A
/// stalled cluster connection (the redis crate's driver wedged) would take a response timeout
/// or more.
const SERVED_AGAIN_WITHIN: Duration = Duration::from_secs(10);
/// A failover takes the node timeout (1 s) plus an election; generous for a loaded machine.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);

fn item(key: &str) -> AddItem {
    AddItem { queue: "job".into(), key: key.into(), ..Default::default() }
}

async fn scrape(admin: &str) -> String {
    reqwest::get(format!("{admin}/metrics")).await.unwrap().text().await.unwrap()
}

fn metric(body: &str, name: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing in\n{body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_queue_follows_a_master_failover_and_fences_leasing() {
    let cluster =
        tokio::task::spawn_blocking(RedisCluster::start_replicated).await.unwrap().unwrap();
    follows_a_failover(cluster, RedisOptions::default()).await;
}

/// The same over TLS everywhere: clients, the cluster bus and replication. The nodes the
/// cluster names after the failover are reached with the seeds' TLS settings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_queue_follows_a_failover_of_a_tls_cluster() {
    let pki = TestPki::generate("tls-cluster").unwrap();
    eprintln!("failover test: starting a TLS cluster");
    let dir = pki.dir().to_path_buf();
    let cluster = tokio::task::spawn_blocking(move || RedisCluster::start_replicated_tls(&dir))
        .await
        .unwrap()
        .unwrap();
    eprintln!("failover test: TLS cluster up");
    assert!(cluster.url().starts_with("rediss+cluster://"), "{}", cluster.url());
    let tls = RedisTls { ca_file: Some(pki.ca()), ..Default::default() };
    follows_a_failover(cluster, RedisOptions { tls, ..Default::default() }).await;
}

async fn follows_a_failover(mut cluster: RedisCluster, redis: RedisOptions) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let admin_url = format!("http://{}", admin.local_addr().unwrap());
    let shutdown = Shutdown::new();
    let config = QueueConfig { redis, ..QueueConfig::new(cluster.url(), Security::InsecureNoAuth) };
    let listeners = Listeners { grpc: listener, admin: Some(admin) };
    let task = tokio::spawn(kjob_queue::run(listeners, config, shutdown.clone()));
    let c = QueueClient::connect_lazy(&url).unwrap();

    eprintln!("failover test: kjob-queue started");
    // Before: ten keys, one of them leased (the lease must survive with the data).
    let keys: Vec<String> = (0..10).map(|i| format!("ns/job-{i}")).collect();
    c.add(keys.iter().map(|k| item(k)).collect()).await.unwrap();
    let held = c.lease("job", 1, LEASE, Duration::from_secs(5), "w1").await.unwrap();
    assert_eq!(held.len(), 1);
    let held = held.into_iter().next().unwrap();
    // The master that holds the held key's shard (a new data set on a Cluster gets the
    // default layout); the other keys' masters stay up.
    let tag = kjob_workqueue::auto_layout(true).job_tag(&held.key);
    let master = cluster.master_of(&tag).unwrap();
    tokio::task::block_in_place(|| cluster.wait_replicated(master)).unwrap();
    // One epoch poll at least, so the fence has seen the old master's run id.
    tokio::time::sleep(kjob_workqueue::epoch::POLL * 3).await;

    eprintln!("failover test: killing master {master}");
    // The kill.
    cluster.kill(master).unwrap();
    let killed_at = Instant::now();
    let promoted =
        tokio::task::block_in_place(|| cluster.wait_failover(&tag, master, FAILOVER_TIMEOUT))
            .unwrap();
    assert_ne!(promoted, master);
    eprintln!("failover test: {promoted} took over");

    // The same kjob-queue serves again: the lease granted before the kill is still held (its
    // renewal works on the new master), nothing replicated was lost, and no other key is
    // leased while the fence holds.
    let renewed = loop {
        match c.renew("job", &held.key, &held.lease_id, LEASE).await {
            Ok(deadline) => break deadline,
            Err(e) if killed_at.elapsed() < FAILOVER_TIMEOUT => {
                eprintln!("renew after the kill: {e}; again");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("kjob-queue did not follow the failover: {e}"),
        }
    };
    assert!(renewed > 0);
    // Its holder keeps renewing it, as a worker's sync would.
    let renewer = {
        let (c, key, id) = (c.clone(), held.key.clone(), held.lease_id.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(LEASE / 4).await;
                c.renew("job", &key, &id, LEASE).await.expect("renewing the lease held across");
            }
        })
    };
    let served_at = Instant::now();
    eprintln!("failover test: the held lease renewed");
    assert!(
        served_at - killed_at < SERVED_AGAIN_WITHIN,
        "served again {:?} after the kill",
        served_at - killed_at
    );
    let stats = c.stats("job").await.unwrap();
    assert_eq!((stats.ready, stats.leased), (9, 1), "{stats:?}");
    // The fence saw the new run id (within a few of its polls).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let body = scrape(&admin_url).await;
        if metric(&body, "kjob_queue_redis_data_lost_total") >= 1.0 {
            break;
        }
        assert!(Instant::now() < deadline, "no data loss counted after the failover:\n{body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut got = Vec::new();
    while got.len() < 9 {
        let batch = c.lease("job", 9, LEASE, Duration::from_secs(10), "w2").await.unwrap();
        for it in &batch {
            c.done("job", &it.key, &it.lease_id, Outcome::Forget).await.unwrap();
        }
        got.extend(batch.into_iter().map(|it| it.key));
        assert!(served_at.elapsed() < FAILOVER_TIMEOUT, "only {got:?} leased");
    }
    let drained = killed_at.elapsed();
    eprintln!(
        "failover: served again {:.1}s after the kill, every key leased again {:.1}s after it",
        (served_at - killed_at).as_secs_f64(),
        drained.as_secs_f64()
    );
    // The fence: the new master is another process, so nothing was leased before a lease as
    // long as the longest granted had run out after the failover was seen.
    assert!(drained >= LEASE, "leased again {drained:?} after the kill, within the hold");
    got.sort();
    let mut want: Vec<String> = keys.iter().filter(|k| **k != held.key).cloned().collect();
    want.sort();
    assert_eq!(got, want, "every key added before the kill, each exactly once");
    renewer.abort();
    c.done("job", &held.key, &held.lease_id, Outcome::Forget).await.unwrap();
    let stats = c.stats("job").await.unwrap();
    assert_eq!((stats.ready, stats.leased), (0, 0), "{stats:?}");
    eprintln!("failover test: draining");
    shutdown.cancel();
    let drain = tokio::time::timeout(Duration::from_secs(60), task).await;
    drain.expect("kjob-queue did not drain within 60 s after the failover").unwrap().unwrap();
}

/// A Cluster node that is down (here a master whose replica took over) does not keep a new
/// kjob-queue from starting: the `noeviction` check skips a seed that does not answer, and the
/// cluster client reaches the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_starts_while_a_cluster_node_is_down() {
    let mut cluster =
        tokio::task::spawn_blocking(RedisCluster::start_replicated).await.unwrap().unwrap();
    let master = cluster.master_of("{wq:job}").unwrap();
    cluster.kill(master).unwrap();
    tokio::task::block_in_place(|| cluster.wait_failover("{wq:job}", master, FAILOVER_TIMEOUT))
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = Shutdown::new();
    let config = QueueConfig::new(cluster.url(), Security::InsecureNoAuth);
    let task = tokio::spawn(kjob_queue::run(Listeners::grpc(listener), config, shutdown.clone()));
    let c = QueueClient::connect_lazy(&url).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let added = loop {
        match c.add(vec![item("ns/after")]).await {
            Ok(a) => break a,
            Err(e) if Instant::now() < deadline => {
                eprintln!("not serving yet: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("kjob-queue did not start with one node down: {e}"),
        }
    };
    assert_eq!(added.added, 1);
    shutdown.cancel();
    task.await.unwrap().unwrap();
}
