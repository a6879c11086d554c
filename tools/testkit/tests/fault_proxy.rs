//! The fault proxy in front of the real kube-apiserver: a kube client on a kubeconfig it wrote
//! works as on the server itself, and each injected fault shows the way kube-apiserver's own
//! would (a 429 Status with retryAfterSeconds, a 500, write latency by resource, a cut watch).

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kjob_testkit::faults::ApiFaults;
use kjob_testkit::proxy::FaultProxy;
use kube::Api;
use kube::api::{ListParams, PostParams, WatchParams};

async fn client_on(kubeconfig: &std::path::Path) -> kube::Client {
    kjob_testkit::server::kube_client(kubeconfig, None).await.unwrap()
}

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_forwards_and_injects_each_fault() {
    let Some(cluster) =
        tokio::task::spawn_blocking(kjob_testkit::cluster::test_cluster).await.unwrap().unwrap()
    else {
        return;
    };
    let info = cluster.info().clone();
    let ns = format!("fault-proxy-{}", std::process::id());
    tokio::task::block_in_place(|| info.create_namespace(&ns)).unwrap();
    let proxy = FaultProxy::start(&info.kubeconfig).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    proxy.write_kubeconfig(&info.kubeconfig, &kubeconfig).unwrap();
    let client = client_on(&kubeconfig).await;

    // Transparent without faults.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let names: Vec<String> = namespaces
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    assert!(names.contains(&ns), "{names:?}");
    let forwarded = proxy.stats().forwarded;
    assert!(forwarded >= 1);

    // Every request refused: 429 with the server's hint (kube's client retries those by
    // itself, so a plain HTTP client looks), then 500.
    let url = format!("{}/api/v1/namespaces/{ns}", proxy.url());
    proxy.set_faults(ApiFaults::errors(1.0, 0.0));
    let resp = reqwest::get(&url).await.unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    assert_eq!(resp.headers()["retry-after"], "1");
    let status: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(status["reason"], "TooManyRequests", "{status}");
    assert_eq!(status["details"]["retryAfterSeconds"], 1, "{status}");
    proxy.set_faults(ApiFaults::errors(0.0, 1.0));
    match namespaces.get(&ns).await {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (500, "InternalError")),
        other => panic!("expected a 500, got {other:?}"),
    }
    assert_eq!(proxy.stats().refused, 2);
    assert_eq!(proxy.stats().forwarded, forwarded, "a refused request reached the server");

    // Write latency, only for the resources named.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let slow = Duration::from_millis(600);
    proxy.set_faults(ApiFaults {
        latency_resources: vec!["configmaps".into()],
        ..ApiFaults::write_latency(slow)
    });
    let t = Instant::now();
    cms.create(&PostParams::default(), &config_map("slow")).await.unwrap();
    assert!(t.elapsed() >= slow, "create took {:?}", t.elapsed());
    let t = Instant::now();
    cms.get("slow").await.unwrap();
    assert!(t.elapsed() < slow, "a read waited {:?}", t.elapsed());
    proxy.set_faults(ApiFaults {
        latency_resources: vec!["pods".into()],
        ..ApiFaults::write_latency(slow)
    });
    let t = Instant::now();
    cms.create(&PostParams::default(), &config_map("fast")).await.unwrap();
    assert!(t.elapsed() < slow, "create of an unlisted resource took {:?}", t.elapsed());
    proxy.set_faults(ApiFaults::none());

    // A watch streams events through the proxy and ends when cut.
    let mut events = cms.watch(&WatchParams::default().timeout(290), "0").await.unwrap().boxed();
    let first = tokio::time::timeout(Duration::from_secs(10), events.next()).await;
    assert!(matches!(first, Ok(Some(Ok(_)))), "no first watch event: {first:?}");
    proxy.close_watches();
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(ev) = events.next().await {
            ev.unwrap();
        }
    })
    .await;
    assert!(ended.is_ok(), "the watch did not end after close_watches");
    assert_eq!(proxy.stats().watches_cut, 1);
    tokio::task::block_in_place(|| info.kubectl(&["delete", "namespace", &ns, "--wait=false"]))
        .unwrap();
}
