//! kjob-queue served in the test's own process (`kjob_queue::run` on free ports, plaintext
//! gRPC), for the suites that test the service rather than the stack.

#![allow(dead_code)]

use kjob_queue::{Listeners, QueueConfig, Security};
use kjob_queue_client::{QueueClient, RetryPolicy};
use kjob_svc::Shutdown;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A kjob-queue running on this test's runtime until [`InProcessQueue::stop`].
pub struct InProcessQueue {
    /// The gRPC listener's URL.
    pub url: String,
    /// A client of it (retrying UNAVAILABLE, so the first calls wait for it to start).
    pub client: QueueClient,
    /// The admin port's URL (explain, web view, metrics, readiness).
    pub admin: String,
    /// Cancelled to drain it.
    pub shutdown: Shutdown,
    /// The serving task: its result is `run`'s.
    pub task: JoinHandle<anyhow::Result<()>>,
}

impl InProcessQueue {
    /// Plaintext and open to every caller (`--insecure-no-auth`) over `redis_url`, both ports.
    pub async fn insecure(redis_url: &str) -> Self {
        Self::start(QueueConfig::new(redis_url.to_string(), Security::InsecureNoAuth)).await
    }

    /// Serves `config` on a gRPC port and an admin port.
    pub async fn start(config: QueueConfig) -> Self {
        assert!(
            matches!(config.security, Security::InsecureNoAuth),
            "a TLS kjob-queue needs a client with certificates: start it in the test"
        );
        let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", grpc.local_addr().unwrap());
        let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin_url = format!("http://{}", admin.local_addr().unwrap());
        let shutdown = Shutdown::new();
        let task = tokio::spawn(kjob_queue::run(
            Listeners { grpc, admin: Some(admin) },
            config,
            shutdown.clone(),
        ));
        let client = QueueClient::connect_lazy(&url).unwrap();
        InProcessQueue { url, client, admin: admin_url, shutdown, task }
    }

    /// A client that reports the first failure instead of retrying it.
    pub fn strict(&self) -> QueueClient {
        self.client.clone().with_retry_policy(RetryPolicy::no_retries())
    }

    /// Drains it and checks that it stopped cleanly.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
    }
}
