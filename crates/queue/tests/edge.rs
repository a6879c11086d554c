//! The queue's gRPC edge and its supervision, in process over a real redis-server: per-RPC
//! metrics by code, every workqueue series present at start, server reflection v1 and v1alpha,
//! and a listener that breaks under the server ending the service with an error naming it.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kjob_queue::Config;
use kjob_queue_client::{ClientError, QueueClient, RetryPolicy, v1};
use kjob_svc::Shutdown;
use kjob_testkit::RedisServer;
use tokio::net::TcpListener;
use tracing::instrument::WithSubscriber;

struct Running {
    client: QueueClient,
    url: String,
    admin: String,
    shutdown: Shutdown,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

async fn start(redis: &RedisServer) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let admin_url = format!("http://{}", admin.local_addr().unwrap());
    let shutdown = Shutdown::new();
    let config =
        Config { redis_url: redis.url(), admin_listener: Some(admin), store: Default::default() };
    let task = tokio::spawn(kjob_queue::run(listener, config, shutdown.clone()));
    let client = QueueClient::connect_lazy(&url).unwrap();
    Running { client, url, admin: admin_url, shutdown, task }
}

async fn scrape(admin: &str) -> String {
    reqwest::get(format!("{admin}/metrics")).await.unwrap().text().await.unwrap()
}

async fn wait_ready(admin: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let r = reqwest::get(format!("{admin}/readyz")).await;
        if r.is_ok_and(|r| r.status() == 200) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_server_shows_every_workqueue_series_at_zero() {
    let redis = RedisServer::start().unwrap();
    let r = start(&redis).await;
    wait_ready(&r.admin).await;
    let body = scrape(&r.admin).await;
    for q in kjob_core::QUEUES {
        for series in [
            "workqueue_depth",
            "workqueue_adds_total",
            "workqueue_retries_total",
            "workqueue_unfinished_work_seconds",
            "workqueue_longest_running_processor_seconds",
            "workqueue_queue_duration_seconds_count",
            "workqueue_work_duration_seconds_count",
        ] {
            let want = format!("{series}{{name=\"{q}\"}} ");
            let value = body.lines().find_map(|l| l.strip_prefix(&want)?.parse::<f64>().ok());
            assert_eq!(value, Some(0.0), "{want} in\n{body}");
        }
    }
    // Every RPC, not called yet, is there too.
    let started = body.lines().filter(|l| l.starts_with("grpc_server_started_total{")).count();
    assert_eq!(started, kjob_queue::service::RPCS.len(), "{body}");
    r.shutdown.cancel();
    r.task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_are_counted_by_grpc_code() {
    let redis = RedisServer::start().unwrap();
    let r = start(&redis).await;
    wait_ready(&r.admin).await;
    let c = r.client.clone().with_retry_policy(RetryPolicy::no_retries());
    c.stats("job").await.unwrap();
    let refused = c.add(vec![v1::AddItem {
        queue: "job".into(),
        key: "nslash".into(),
        ..Default::default()
    }]);
    assert!(matches!(refused.await, Err(ClientError::InvalidArgument(_))));
    let body = scrape(&r.admin).await;
    let add = "grpc_service=\"kjob.queue.v1.Queue\",grpc_method=\"Add\",grpc_type=\"unary\"";
    let stats = "grpc_service=\"kjob.queue.v1.Queue\",grpc_method=\"Stats\",grpc_type=\"unary\"";
    for want in [
        format!("grpc_server_started_total{{{add}}} 1"),
        format!("grpc_server_handled_total{{{add},grpc_code=\"InvalidArgument\"}} 1"),
        format!("grpc_server_handled_total{{{add},grpc_code=\"OK\"}} 0"),
        format!("grpc_server_handling_seconds_count{{{add}}} 1"),
        format!("grpc_server_handled_total{{{stats},grpc_code=\"OK\"}} 1"),
    ] {
        assert!(body.lines().any(|l| l == want), "missing {want} in\n{body}");
    }
    r.shutdown.cancel();
    r.task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_answers_v1alpha_and_v1_clients() {
    use tonic_reflection::pb::{v1, v1alpha};
    let redis = RedisServer::start().unwrap();
    let r = start(&redis).await;
    wait_ready(&r.admin).await;
    let channel =
        tonic::transport::Endpoint::from_shared(r.url.clone()).unwrap().connect().await.unwrap();

    let mut alpha = v1alpha::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let req = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1alpha::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut answers = alpha.server_reflection_info(futures::stream::iter([req])).await.unwrap();
    let answer = answers.get_mut().message().await.unwrap().expect("a v1alpha answer");
    let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        answer.message_response
    else {
        panic!("unexpected v1alpha answer {answer:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for want in ["kjob.queue.v1.Queue", "kjob.queue.v1.Expectations", "grpc.health.v1.Health"] {
        assert!(names.iter().any(|n| n == want), "v1alpha lists {names:?}");
    }

    let mut v1 = v1::server_reflection_client::ServerReflectionClient::new(channel);
    let req = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::FileContainingSymbol(
            "kjob.queue.v1.Queue".into(),
        )),
    };
    let mut answers = v1.server_reflection_info(futures::stream::iter([req])).await.unwrap();
    let answer = answers.get_mut().message().await.unwrap().expect("a v1 answer");
    assert!(
        matches!(
            answer.message_response,
            Some(v1::server_reflection_response::MessageResponse::FileDescriptorResponse(_))
        ),
        "{answer:?}"
    );
    r.shutdown.cancel();
    r.task.await.unwrap().unwrap();
}

/// Log lines written by one future (its own subscriber), for assertions.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The bug of issue 17: a gRPC server that stops must not leave the service running (and
/// ready). A listening socket shut down under the server makes every accept fail with EINVAL:
/// the server ends, the service goes not ready, drains, and `run` returns an error naming the
/// server (the binary's `main` returns it: exit status 1), after an error log line saying which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_listener_ends_the_service_with_an_error_naming_the_server() {
    let redis = RedisServer::start().unwrap();
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std_listener.set_nonblocking(true).unwrap();
    let addr = std_listener.local_addr().unwrap();
    // The same socket, held by the test: shutting it down breaks the server's listener.
    let handle = std_listener.try_clone().unwrap();
    let listener = TcpListener::from_std(std_listener).unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin_url = format!("http://{}", admin.local_addr().unwrap());
    let shutdown = Shutdown::new();
    let config =
        Config { redis_url: redis.url(), admin_listener: Some(admin), store: Default::default() };
    let logs = Logs::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer({
            let logs = logs.clone();
            move || logs.clone()
        })
        .with_ansi(false)
        .finish();
    let task = tokio::spawn(
        kjob_queue::run(listener, config, shutdown.clone()).with_subscriber(subscriber),
    );
    wait_ready(&admin_url).await;
    let c = QueueClient::connect_lazy(&format!("http://{addr}")).unwrap();
    c.stats("job").await.unwrap();

    socket2::SockRef::from(&handle).shutdown(std::net::Shutdown::Read).unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the service kept running on a broken listener")
        .unwrap();
    let err = ended.expect_err("a service whose server stopped must fail");
    assert!(err.to_string().contains("vital task \"gRPC server\" ended"), "{err:#}");
    assert!(shutdown.is_cancelled(), "the other tasks were asked to drain");
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let line = text.lines().find(|l| l.contains("vital task ended")).unwrap_or_else(|| {
        panic!("no log line names the task:\n{text}");
    });
    assert!(line.contains("ERROR") && line.contains("task=\"gRPC server\""), "{line}");
    assert!(text.contains("the listener cannot accept any more"), "{text}");
    // The admin port is gone with the service, so nothing reports it ready any more.
    assert!(reqwest::get(format!("{admin_url}/readyz")).await.is_err());
}
