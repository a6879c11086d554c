//! The kube client of `kjob_svc::kube_client::client` against a TLS server that offers HTTP/2
//! (as kube-apiserver does): concurrent requests share one connection. Against a server that
//! offers HTTP/1.1 only, or with `--kube-http1-only`, the same client still works, one connection
//! per request in flight. Past the streams a server allows on one HTTP/2 connection, the client
//! opens another, as client-go does.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

const CERT: &[u8] = include_bytes!("fixtures/localhost.crt");
const KEY: &[u8] = include_bytes!("fixtures/localhost.key");
/// Requests in flight at once; each answer waits so that they overlap.
const CONCURRENT: usize = 16;
const ANSWER_AFTER: Duration = Duration::from_millis(100);

/// Streams kube-apiserver allows on one HTTP/2 connection by default.
const APISERVER_STREAMS: u32 = 100;

/// What the server saw: TCP connections accepted and the protocol each negotiated, and the
/// most requests it was answering at once.
#[derive(Default)]
struct Seen {
    connections: AtomicUsize,
    alpn: Mutex<Vec<Option<Vec<u8>>>>,
    answering: AtomicUsize,
    most_at_once: AtomicUsize,
}

/// Serves `/version` over TLS on a loopback port, offering `alpn`; returns its URL.
async fn serve(alpn: &[&[u8]], seen: Arc<Seen>) -> String {
    serve_with_streams(alpn, 200, seen).await
}

/// [`serve`] allowing `streams` concurrent HTTP/2 streams on each connection.
async fn serve_with_streams(alpn: &[&[u8]], streams: u32, seen: Arc<Seen>) -> String {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(CERT).unwrap()],
            PrivateKeyDer::from_pem_slice(KEY).unwrap(),
        )
        .unwrap();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            seen.connections.fetch_add(1, Ordering::SeqCst);
            let (acceptor, seen) = (acceptor.clone(), seen.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                seen.alpn.lock().unwrap().push(tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec));
                let service = hyper::service::service_fn(move |_req| {
                    let seen = seen.clone();
                    async move {
                        let now = seen.answering.fetch_add(1, Ordering::SeqCst) + 1;
                        seen.most_at_once.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(ANSWER_AFTER).await;
                        seen.answering.fetch_sub(1, Ordering::SeqCst);
                        let body = r#"{"major":"1","minor":"37","gitVersion":"v1.37.2"}"#;
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(body))))
                    }
                });
                let mut server = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                server.http2().max_concurrent_streams(streams);
                let _ = server.serve_connection(TokioIo::new(tls), service).await;
            });
        }
    });
    format!("https://127.0.0.1:{port}")
}

/// Sends [`CONCURRENT`] requests at once through the client under test, twice.
async fn get_concurrently(url: &str, http1_only: bool) {
    let client = client_for(url, http1_only);
    burst(&client, CONCURRENT).await;
    burst(&client, CONCURRENT).await;
}

fn client_for(url: &str, http1_only: bool) -> kube::Client {
    let mut config = kube::Config::new(url.parse().unwrap());
    config.root_cert = Some(vec![CertificateDer::from_pem_slice(CERT).unwrap().to_vec()]);
    kjob_svc::kube_client::client(config, http1_only).unwrap()
}

async fn burst(client: &kube::Client, n: usize) {
    let calls = (0..n).map(|_| {
        let client = client.clone();
        async move {
            let req = http::Request::get("/version").body(Vec::new()).unwrap();
            client.request_text(req).await
        }
    });
    for answer in futures::future::join_all(calls).await {
        assert!(answer.unwrap().contains("v1.37.2"));
    }
}

#[tokio::test]
async fn a_server_offering_http2_gets_every_request_on_one_connection() {
    let seen = Arc::new(Seen::default());
    let url = serve(&[b"h2", b"http/1.1"], seen.clone()).await;
    get_concurrently(&url, false).await;
    assert_eq!(seen.connections.load(Ordering::SeqCst), 1, "one connection for all requests");
    assert_eq!(*seen.alpn.lock().unwrap(), vec![Some(b"h2".to_vec())]);
}

#[tokio::test]
async fn requests_beyond_a_connections_streams_go_on_another_connection() {
    let seen = Arc::new(Seen::default());
    let url = serve_with_streams(&[b"h2", b"http/1.1"], APISERVER_STREAMS, seen.clone()).await;
    let client = client_for(&url, false);
    // The first request finds out that the server speaks HTTP/2.
    burst(&client, 1).await;
    assert_eq!(seen.connections.load(Ordering::SeqCst), 1);
    // 250 at once: one connection would answer them 100 at a time, in three rounds.
    burst(&client, 250).await;
    assert_eq!(seen.connections.load(Ordering::SeqCst), 3, "100 streams a connection");
    assert_eq!(seen.most_at_once.load(Ordering::SeqCst), 250, "all were answered together");
    // The streams are free again: the next burst opens nothing new.
    burst(&client, 250).await;
    assert_eq!(seen.connections.load(Ordering::SeqCst), 3);
    assert!(seen.alpn.lock().unwrap().iter().all(|p| p.as_deref() == Some(b"h2".as_slice())));
}

#[tokio::test]
async fn a_server_offering_http1_only_still_answers_one_connection_per_request() {
    let seen = Arc::new(Seen::default());
    let url = serve(&[b"http/1.1"], seen.clone()).await;
    get_concurrently(&url, false).await;
    // What kube's own client does with every server: a connection per request in flight.
    assert_eq!(seen.connections.load(Ordering::SeqCst), CONCURRENT);
    assert!(seen.alpn.lock().unwrap().iter().all(|p| p.as_deref() == Some(b"http/1.1".as_slice())));
}

#[tokio::test]
async fn http1_only_keeps_to_http1_with_a_server_offering_http2() {
    let seen = Arc::new(Seen::default());
    let url = serve(&[b"h2", b"http/1.1"], seen.clone()).await;
    get_concurrently(&url, true).await;
    assert_eq!(seen.connections.load(Ordering::SeqCst), CONCURRENT);
    // No ALPN offered at all (as kube-rs's own client): the server falls back to HTTP/1.1.
    assert!(seen.alpn.lock().unwrap().iter().all(Option::is_none));
}
