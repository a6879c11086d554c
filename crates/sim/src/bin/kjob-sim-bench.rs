//! kjob-sim-bench: throughput of the simulator over HTTP — creates/s, status updates/s and watch
//! events/s with 1, 4 and 16 concurrent clients, with 100,000 pods stored, and the server's RSS.
//!
//! Run with `cargo run --release -p kjob-sim --bin kjob-sim-bench [-- --pods 100000 --seconds 3]`.
//! It starts the `kjob-sim` binary found next to itself (`--kubelet off`).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Parser;
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::json;

/// Timeout of every benchmark request: a stuck server fails the run instead of hanging it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const NS: &str = "bench";

#[derive(Debug, Parser)]
struct Args {
    /// Pods stored before the update and watch phases.
    #[arg(long, default_value_t = 100_000)]
    pods: u64,
    /// Length of each measured phase.
    #[arg(long, value_parser = kjob_svc::parse_duration, default_value = "3s")]
    seconds: Duration,
    /// Path of the kjob-sim binary (default: next to this one).
    #[arg(long)]
    sim: Option<PathBuf>,
}

type Http = Client<HttpConnector, Full<Bytes>>;

struct Sim(Child);

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn call(
    http: &Http,
    method: &str,
    url: &str,
    ct: &str,
    body: Vec<u8>,
) -> anyhow::Result<u16> {
    let req = http::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", ct)
        .body(Full::new(Bytes::from(body)))?;
    let resp = tokio::time::timeout(REQUEST_TIMEOUT, http.request(req))
        .await
        .context("request timed out")??;
    let code = resp.status().as_u16();
    // Drain the body so the connection is reused.
    let _ = resp.into_body().collect().await;
    Ok(code)
}

fn pod_body(name: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"metadata": {"name": name, "labels": {"app": "bench"}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox:1.36"}]}}))
    .unwrap_or_default()
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).map(str::to_owned))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// Runs `clients` workers until `dur` elapses; each calls `op(worker, seq)`; returns ops/s.
async fn phase<F, Fut>(clients: u64, dur: Duration, op: F) -> anyhow::Result<f64>
where
    F: Fn(u64, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let op = Arc::new(op);
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..clients {
        let (op, done) = (op.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut seq = 0;
            while start.elapsed() < dur {
                op(w, seq).await?;
                seq += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Args { pods, seconds, sim } = Args::parse();
    let sim_bin = match sim {
        Some(p) => p,
        None => std::env::current_exe()?.with_file_name("kjob-sim"),
    };
    let mut child = Command::new(&sim_bin)
        .args(["--listen", "127.0.0.1:0", "--kubelet", "off", "--log-level", "warn"])
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", sim_bin.display()))?;
    let stdout = child.stdout.take().context("sim stdout")?;
    let pid = child.id();
    let _guard = Sim(child);
    let mut url = String::new();
    BufReader::new(stdout).read_line(&mut url)?;
    let base = url.trim().to_owned();
    let http: Http = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let code = call(
        &http,
        "POST",
        &format!("{base}/api/v1/namespaces"),
        "application/json",
        serde_json::to_vec(&json!({"metadata": {"name": NS}}))?,
    )
    .await?;
    if code != 201 {
        bail!("creating the namespace answered {code}");
    }
    let pods_url = format!("{base}/api/v1/namespaces/{NS}/pods");
    println!("kjob-sim-bench: {base}, phases of {seconds:?}");

    // Creates/s.
    let created = Arc::new(AtomicU64::new(0));
    for clients in [1u64, 4, 16] {
        let (http, url, created) = (http.clone(), pods_url.clone(), created.clone());
        let rate = phase(clients, seconds, move |w, seq| {
            let (http, url, created) = (http.clone(), url.clone(), created.clone());
            async move {
                // Pods are named p-0, p-1, ... so later phases can address any stored pod.
                let n = created.fetch_add(1, Ordering::Relaxed);
                let _ = (w, seq);
                let code =
                    call(&http, "POST", &url, "application/json", pod_body(&format!("p-{n}")))
                        .await?;
                if code != 201 {
                    bail!("create answered {code}");
                }
                Ok(())
            }
        })
        .await?;
        println!("creates/s        clients={clients:<2} {rate:>10.0}");
    }

    // Fill the store up to `pods` with 16 clients.
    let have = created.load(Ordering::Relaxed);
    let fill_start = Instant::now();
    if have < pods {
        let next = Arc::new(AtomicU64::new(have));
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let (http, url, next) = (http.clone(), pods_url.clone(), next.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= pods {
                        return anyhow::Ok(());
                    }
                    let code =
                        call(&http, "POST", &url, "application/json", pod_body(&format!("p-{i}")))
                            .await?;
                    if code != 201 {
                        bail!("create answered {code}");
                    }
                }
            }));
        }
        for t in tasks {
            t.await??;
        }
    }
    println!(
        "stored pods: {} (fill took {:.1}s), server RSS {} MiB",
        pods.max(have),
        fill_start.elapsed().as_secs_f64(),
        rss_kib(pid) / 1024
    );

    // Status updates/s (merge patch of /status on stored pods; every patch changes something,
    // since a no-op write is cheaper and emits no event).
    let stored = pods.max(have);
    for clients in [1u64, 4, 16] {
        let (http, url) = (http.clone(), pods_url.clone());
        let rate = phase(clients, seconds, move |w, seq| {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let i = (w * 7919 + seq * 104_729) % stored;
                let body = serde_json::to_vec(
                    &json!({"status": {"phase": "Running", "message": format!("u{clients}-{w}-{seq}")}}),
                )?;
                let code = call(
                    &http,
                    "PATCH",
                    &format!("{url}/p-{i}/status"),
                    "application/merge-patch+json",
                    body,
                )
                .await?;
                if code != 200 {
                    bail!("status patch answered {code}");
                }
                Ok(())
            }
        })
        .await?;
        println!("status updates/s clients={clients:<2} {rate:>10.0}");
    }

    // Watch events/s delivered: W watchers, 16 writers.
    for watchers in [1u64, 4, 16] {
        let received = Arc::new(AtomicU64::new(0));
        let stop = tokio_util::sync::CancellationToken::new();
        let mut tasks = Vec::new();
        for _ in 0..watchers {
            // Start each watch at a fresh list revision: only new changes are counted.
            let list_rv = {
                let req = http::Request::builder()
                    .uri(format!("{pods_url}?limit=1"))
                    .body(Full::new(Bytes::new()))?;
                let resp = http.request(req).await?;
                let body = resp.into_body().collect().await?.to_bytes();
                let v: serde_json::Value = serde_json::from_slice(&body)?;
                v["metadata"]["resourceVersion"].as_str().unwrap_or("0").to_owned()
            };
            let req = http::Request::builder()
                .uri(format!("{pods_url}?watch=true&resourceVersion={list_rv}"))
                .body(Full::new(Bytes::new()))?;
            let resp = http.request(req).await?;
            let (received, stop) = (received.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let mut body = resp.into_body().into_data_stream();
                loop {
                    tokio::select! {
                        chunk = body.next() => match chunk {
                            Some(Ok(b)) => { received.fetch_add(b.iter().filter(|c| **c == b'\n').count() as u64, Ordering::Relaxed); }
                            _ => return,
                        },
                        _ = stop.cancelled() => return,
                    }
                }
            }));
        }
        let (http2, url) = (http.clone(), pods_url.clone());
        let start = Instant::now();
        let writes = phase(16, seconds, move |w, seq| {
            let (http, url) = (http2.clone(), url.clone());
            async move {
                let i = (w * 7919 + seq * 104_729) % stored;
                let body = serde_json::to_vec(
                    &json!({"status": {"message": format!("w{watchers}-{w}-{seq}")}}),
                )?;
                call(
                    &http,
                    "PATCH",
                    &format!("{url}/p-{i}/status"),
                    "application/merge-patch+json",
                    body,
                )
                .await?;
                Ok(())
            }
        })
        .await?;
        // Let the watchers drain what was written.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let elapsed = start.elapsed().as_secs_f64();
        stop.cancel();
        for t in tasks {
            let _ = t.await;
        }
        let events = received.load(Ordering::Relaxed) as f64;
        println!(
            "watch events/s   watchers={watchers:<2} {:>10.0} delivered (writes {writes:.0}/s)",
            events / elapsed
        );
    }
    println!("server RSS at end: {} MiB", rss_kib(pid) / 1024);
    Ok(())
}
