//! Leader election against kjob-sim: one leader at a time, takeover after a crash within the
//! lease duration, immediate takeover after a graceful release, and step-down before the lease
//! could be taken when renewals fail.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kjob_sim::testing::TestSim;
use kjob_watcher::leader::{LeaderElector, LeaseConfig};
use kjob_watcher::metrics::Metrics;
use kube::Api;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

// Each test has its own simulator, so a bootstrap namespace is private to the test.
const NS: &str = "kube-node-lease";
const LEASE: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_secs(2);
const RETRY: Duration = Duration::from_millis(300);

fn cfg(identity: &str) -> LeaseConfig {
    LeaseConfig {
        name: "kjob-watcher".into(),
        namespace: NS.into(),
        identity: identity.into(),
        lease_duration: LEASE,
        renew_deadline: RENEW,
        retry_period: RETRY,
    }
}

async fn sim_with_namespace() -> TestSim {
    TestSim::start(Default::default()).await
}

struct Candidate {
    leading: watch::Receiver<bool>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

fn start(client: kube::Client, identity: &str) -> Candidate {
    let (tx, rx) = watch::channel(false);
    let stop = CancellationToken::new();
    let elector = LeaderElector::new(client, cfg(identity), Metrics::default());
    let task = tokio::spawn(elector.run(tx, stop.clone()));
    Candidate { leading: rx, stop, task }
}

/// A candidate started on a fresh Lease, once it leads.
async fn first_leader(sim: &TestSim, identity: &str) -> Candidate {
    let c = start(sim.client(), identity);
    wait_until("the first candidate leads", Duration::from_secs(5), || *c.leading.borrow()).await;
    c
}

impl Candidate {
    /// Stops the candidate (it releases the Lease if it holds it) and waits for it; whether it
    /// still claimed to lead afterwards.
    async fn stop(self) -> bool {
        self.stop.cancel();
        self.task.await.unwrap();
        *self.leading.borrow()
    }
}

async fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !cond() {
        assert!(started.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

async fn holder(client: &kube::Client) -> Option<String> {
    let lease = Api::<Lease>::namespaced(client.clone(), NS).get("kjob-watcher").await.unwrap();
    lease.spec.and_then(|s| s.holder_identity).filter(|h| !h.is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_of_the_leader_hands_over_within_the_lease_duration() {
    let sim = sim_with_namespace().await;
    let a = first_leader(&sim, "a").await;
    let b = start(sim.client(), "b");
    // b must stay a standby while a renews.
    tokio::time::sleep(LEASE + RETRY * 2).await;
    assert!(*a.leading.borrow(), "a lost the lease while renewing");
    assert!(!*b.leading.borrow(), "two leaders at once");
    assert_eq!(holder(&sim.client()).await.as_deref(), Some("a"));

    // Crash: the task dies without releasing.
    a.task.abort();
    let _ = a.task.await;
    let took = wait_until("b leads", LEASE * 3, || *b.leading.borrow()).await;
    // b notices only after a whole lease duration without renewals (plus its own retry cadence).
    assert!(took >= LEASE - RETRY, "took over too early: {took:?}");
    assert!(took <= LEASE + RETRY * 4, "took over too late: {took:?}");
    assert_eq!(holder(&sim.client()).await.as_deref(), Some("b"));
    let lease = Api::<Lease>::namespaced(sim.client(), NS).get("kjob-watcher").await.unwrap();
    assert_eq!(lease.spec.unwrap().lease_transitions, Some(1));
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_release_lets_a_standby_take_over_at_once() {
    let sim = sim_with_namespace().await;
    let a = first_leader(&sim, "a").await;
    let b = start(sim.client(), "b");
    tokio::time::sleep(RETRY * 2).await;
    assert!(!a.stop().await, "a still claims to lead after stopping");
    let took = wait_until("b leads", LEASE * 2, || *b.leading.borrow()).await;
    assert!(took < LEASE, "a released lease should be taken before it would expire: {took:?}");
    b.stop().await;
    assert_eq!(holder(&sim.client()).await, None, "b released the lease on stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_cannot_renew_steps_down_before_the_lease_expires() {
    let sim = sim_with_namespace().await;
    let a = first_leader(&sim, "a").await;
    // Every API call fails from now on.
    let http = reqwest::Client::new();
    let resp = http
        .post(format!("{}/sim/faults", sim.url()))
        .json(&serde_json::json!({"error500": 1.0}))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    let faults_at = Instant::now();
    wait_until("a steps down", LEASE * 2, || !*a.leading.borrow()).await;
    let after = faults_at.elapsed();
    // The last successful renew was at most one retry period before the faults started.
    assert!(after <= RENEW + RETRY, "stepped down late: {after:?}");
    assert!(after < LEASE - RETRY, "stepped down after the lease could be taken: {after:?}");
    a.stop().await;
}
