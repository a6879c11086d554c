//! `kubectl kjob`: kjob-queue's explain API from kubectl.
//!
//! * `kubectl kjob explain job NAME [-n NS] [-o text|json]`: why the Job is where it is.
//! * `kubectl kjob top [-o text|json]`: namespaces by queue depth, then by the age of their
//!   oldest ready Job.
//! * `kubectl kjob ui [--listen ADDR]`: a local port forwarded to kjob-queue's admin port,
//!   whose web view is at `/ui/`.
//!
//! kjob-queue is reached through kube-apiserver's service proxy with the user's kubeconfig
//! (`GET /api/v1/namespaces/kjob-system/services/http:kjob-queue:admin/proxy/...`), so RBAC's
//! `get` on `services/proxy` decides who may read it (deploy's ClusterRole `kjob-queue-viewer`),
//! or directly with `--queue-admin-url`. Rendering is plain functions over the JSON
//! ([`render_explain`], [`render_top`]) so it is tested without a cluster.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;

/// How long one call to kjob-queue (through the API server or directly) may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// `kubectl kjob`.
#[derive(Debug, clap::Parser)]
#[command(
    name = "kubectl-kjob",
    version,
    about = "Why is my Job waiting: kjob-queue's explain API"
)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub target: Target,
}

/// Where kjob-queue's admin port is.
#[derive(Debug, Clone, clap::Args)]
pub struct Target {
    /// Reach kjob-queue's admin port at this URL instead of through kube-apiserver's service
    /// proxy (e.g. http://127.0.0.1:9090 with a port-forward, or in development).
    #[arg(long, global = true, env = "KJOB_QUEUE_ADMIN_URL")]
    pub queue_admin_url: Option<String>,
    /// Namespace of the kjob-queue Service.
    #[arg(long, global = true, default_value = "kjob-system")]
    pub queue_namespace: String,
    /// The kjob-queue Service, as the service proxy names it (`scheme:name:port`).
    #[arg(long, global = true, default_value = "http:kjob-queue:admin")]
    pub queue_service: String,
}

/// A subcommand.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Explain why a Job is where it is in kjob's queue.
    Explain {
        /// What to explain: `job`.
        #[arg(value_parser = ["job", "jobs", "job.batch"])]
        kind: String,
        /// The Job's name.
        name: String,
        /// The Job's namespace (default: the kubeconfig context's).
        #[arg(short = 'n', long)]
        namespace: Option<String>,
        /// Output format.
        #[arg(short = 'o', long, value_parser = ["text", "json"], default_value = "text")]
        output: String,
    },
    /// Namespaces by queue depth and the age of their oldest ready Job.
    Top {
        /// Output format.
        #[arg(short = 'o', long, value_parser = ["text", "json"], default_value = "text")]
        output: String,
    },
    /// Open kjob-queue's web view: forwards a local port to its admin port (read-only: GET
    /// only) and prints the view's URL (`http://127.0.0.1:8047/ui/`).
    Ui {
        /// Local address to listen on.
        #[arg(long, default_value = "127.0.0.1:8047")]
        listen: SocketAddr,
    },
}

/// How the plugin reaches kjob-queue's admin port.
#[derive(Clone)]
pub enum Admin {
    /// Through kube-apiserver's service proxy, at this path prefix.
    Proxy { client: kube::Client, prefix: String },
    /// Directly.
    Direct { http: reqwest::Client, base: String },
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Admin::Proxy { prefix, .. } => write!(f, "service proxy {prefix}"),
            Admin::Direct { base, .. } => write!(f, "{base}"),
        }
    }
}

impl Admin {
    /// GET `path` (starting with `/`): status and body.
    pub async fn get(&self, path: &str) -> anyhow::Result<(u16, Vec<u8>)> {
        let (status, _, body) = self.fetch(path).await?;
        Ok((status, body))
    }

    /// GET `path` (starting with `/`): status, headers and body. Redirects are returned, not
    /// followed (the web view's are relative, for the browser to resolve).
    pub async fn fetch(&self, path: &str) -> anyhow::Result<(u16, http::HeaderMap, Vec<u8>)> {
        match self {
            Admin::Proxy { client, prefix } => {
                use http_body_util::BodyExt as _;
                let req = http::Request::get(format!("{prefix}{path}"))
                    .body(kube::client::Body::empty())?;
                let resp = tokio::time::timeout(CALL_TIMEOUT, client.send(req))
                    .await
                    .context("kube-apiserver did not answer in time")??;
                let status = resp.status().as_u16();
                let headers = resp.headers().clone();
                let body = resp.into_body().collect().await?.to_bytes().to_vec();
                Ok((status, headers, body))
            }
            Admin::Direct { http, base } => {
                let resp = http.get(format!("{base}{path}")).send().await?;
                let status = resp.status().as_u16();
                let headers = resp.headers().clone();
                Ok((status, headers, resp.bytes().await?.to_vec()))
            }
        }
    }

    /// GET `path` as JSON; an error status becomes an error carrying the API's message.
    pub async fn get_json(&self, path: &str) -> anyhow::Result<Value> {
        let (status, body) = self.get(path).await?;
        let v: Option<Value> = serde_json::from_slice(&body).ok();
        if !(200..300).contains(&status) {
            let msg = v
                .as_ref()
                .and_then(|v| v.pointer("/error/message").or_else(|| v.get("message")))
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| String::from_utf8_lossy(&body).trim().to_string());
            bail!("{status}: {msg}");
        }
        v.with_context(|| format!("GET {path}: not JSON"))
    }
}

/// Connects as the target says; with the service proxy, also the kubeconfig's namespace.
pub async fn connect(target: &Target) -> anyhow::Result<(Admin, Option<String>)> {
    if let Some(base) = &target.queue_admin_url {
        let http = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        return Ok((Admin::Direct { http, base: base.trim_end_matches('/').to_string() }, None));
    }
    let client = kube::Client::try_default().await.context("reading the kubeconfig")?;
    let ns = client.default_namespace().to_string();
    let prefix = format!(
        "/api/v1/namespaces/{}/services/{}/proxy",
        target.queue_namespace, target.queue_service
    );
    Ok((Admin::Proxy { client, prefix }, Some(ns)))
}

/// Runs the plugin.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let Args { command, target } = args;
    let (admin, kube_ns) = connect(&target).await?;
    match command {
        Command::Explain { kind: _, name, namespace, output } => {
            let ns = namespace.or(kube_ns).unwrap_or_else(|| "default".to_string());
            let v = admin.get_json(&format!("/api/v1/jobs/{ns}/{name}")).await?;
            if output == "json" {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", render_explain(&v));
            }
        }
        Command::Top { output } => {
            let v = admin.get_json("/api/v1/namespaces").await?;
            if output == "json" {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", render_top(&v));
            }
        }
        Command::Ui { listen } => ui(admin, listen).await?,
    }
    Ok(())
}

/// Response headers `kubectl kjob ui` passes on from kjob-queue: the browser needs the content
/// type (the page is served with `nosniff`), the page's security policy, and the relative
/// Location of its redirects (`/` → `ui/`).
const FORWARDED_HEADERS: [http::HeaderName; 6] = [
    http::header::CONTENT_TYPE,
    http::header::CONTENT_SECURITY_POLICY,
    http::header::X_CONTENT_TYPE_OPTIONS,
    http::header::REFERRER_POLICY,
    http::header::CACHE_CONTROL,
    http::header::LOCATION,
];

/// Serves GETs on `listen` from kjob-queue's admin port until interrupted; the web view is at
/// `/ui/` (`/` redirects there).
async fn ui(admin: Admin, listen: SocketAddr) -> anyhow::Result<()> {
    use axum::extract::{Request, State};
    use axum::response::IntoResponse;
    async fn forward(State(admin): State<Admin>, req: Request) -> axum::response::Response {
        let path = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_string();
        if req.method() != http::Method::GET {
            return (http::StatusCode::METHOD_NOT_ALLOWED, "read-only: GET only").into_response();
        }
        match admin.fetch(&path).await {
            Ok((status, headers, body)) => {
                let status =
                    http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::BAD_GATEWAY);
                let mut resp = (status, body).into_response();
                for name in FORWARDED_HEADERS {
                    if let Some(v) = headers.get(&name) {
                        resp.headers_mut().insert(name, v.clone());
                    }
                }
                resp
            }
            Err(e) => (http::StatusCode::BAD_GATEWAY, format!("{e:#}")).into_response(),
        }
    }
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let local = listener.local_addr()?;
    println!(
        "kjob-queue's web view: http://{local}/ui/ (forwarded to its admin port, {admin:?}); \
         Ctrl-C stops"
    );
    let app = axum::Router::new().fallback(forward).with_state(admin);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

fn secs(v: &Value) -> Option<f64> {
    v.as_f64()
}

fn time(ms: &Value) -> String {
    ms.as_i64()
        .and_then(|m| jiff::Timestamp::from_millisecond(m).ok())
        .map_or_else(|| "?".to_string(), |t| t.strftime("%H:%M:%S%.3f").to_string())
}

/// The explain answer as text.
pub fn render_explain(v: &Value) -> String {
    let mut o = String::new();
    let s = |p: &str| v.pointer(p).and_then(Value::as_str).unwrap_or("").to_string();
    let _ = writeln!(o, "Job:          {}", s("/key"));
    let _ = writeln!(o, "State:        {}", s("/state"));
    let _ = writeln!(o, "Reason:       {} ({})", s("/reason"), s("/reason_code"));
    if let Some(d) = secs(&v["due_in_seconds"]) {
        let _ = writeln!(o, "Next retry:   in {d:.1}s (at {})", time(&v["due_unix_ms"]));
    }
    if let Some(r) = v["ready"].as_object() {
        let _ = writeln!(
            o,
            "Ready:        {:.1}s, position {} of {} ready in namespace {}",
            r["age_seconds"].as_f64().unwrap_or(0.0),
            r["position"].as_u64().map_or(0, |p| p + 1),
            r["namespace_ready"].as_u64().unwrap_or(0),
            s("/namespace/name")
        );
    }
    let b = &v["backoff"];
    let _ = write!(
        o,
        "Backoff:      {} failed syncs (next error waits {}s)",
        b["failures"].as_u64().unwrap_or(0),
        b["next_delay_seconds"].as_f64().unwrap_or(0.0)
    );
    if let Some(n) = b["pod_failures"].as_i64() {
        let _ = write!(
            o,
            "; {n} pod failures, pods may be created again in {:.1}s",
            b["pod_backoff_remaining_seconds"].as_f64().unwrap_or(0.0)
        );
    }
    o.push('\n');
    if let Some(e) = v["expectations"].as_object() {
        let _ = writeln!(
            o,
            "Expectations: {} creates / {} deletes pending, set {:.1}s ago{}",
            e["add"].as_i64().unwrap_or(0).max(0),
            e["del"].as_i64().unwrap_or(0).max(0),
            e["age_seconds"].as_f64().unwrap_or(0.0),
            if e["satisfied"] == true { " (satisfied)" } else { "" }
        );
    }
    if let Some(l) = v["lease"].as_object() {
        let _ = writeln!(
            o,
            "Lease:        held by {} for {:.1}s, ends in {:.1}s{}",
            l["holder"].as_str().unwrap_or("?"),
            l["age_seconds"].as_f64().unwrap_or(0.0),
            l["ends_in_seconds"].as_f64().unwrap_or(0.0),
            if l["dirty"] == true { ", added again meanwhile" } else { "" }
        );
    }
    if let Some(l) = v["last_sync"].as_object() {
        let _ = write!(
            o,
            "Last sync:    {} at {} by {}",
            l["outcome"].as_str().unwrap_or("?"),
            time(&l["at_unix_ms"]),
            l["worker"].as_str().unwrap_or("?")
        );
        if let Some(e) = l["error"].as_str() {
            let _ = write!(o, ": {e}");
        }
        o.push('\n');
    }
    if let Some(h) = v["history"].as_array().filter(|h| !h.is_empty()) {
        let _ = writeln!(o, "History (oldest first):");
        for e in h {
            let at = time(&e["at_unix_ms"]);
            match e["event"].as_str() {
                Some("enqueued") => {
                    let _ = write!(o, "  {at}  enqueued");
                    if let Some(d) = e["delay_seconds"].as_f64().filter(|d| *d > 0.0) {
                        let _ = write!(o, " after {d}s");
                    }
                    if let Some(n) = e["observations"].as_u64().filter(|n| *n > 0) {
                        let _ = write!(o, " ({n} pod observations)");
                    }
                }
                Some("lease_expired") => {
                    let _ = write!(
                        o,
                        "  {at}  lease of {} expired without a Done ({} in a row{})",
                        e["worker"].as_str().unwrap_or("?"),
                        e["expiries_in_a_row"].as_u64().unwrap_or(0),
                        if e["poisoned"] == true { ", now in backoff" } else { "" }
                    );
                }
                _ => {
                    let _ = write!(
                        o,
                        "  {at}  synced by {}: {}",
                        e["worker"].as_str().unwrap_or("?"),
                        e["outcome"].as_str().unwrap_or("?")
                    );
                    if let Some(d) = e["requeue_delay_seconds"].as_f64() {
                        let _ = write!(o, ", again in {d}s");
                    }
                    if let Some(err) = e["error"].as_str() {
                        let _ = write!(o, ": {err}");
                    }
                }
            }
            o.push('\n');
        }
    }
    o
}

/// The namespaces answer as a table, deepest queue first, then oldest ready Job first.
pub fn render_top(v: &Value) -> String {
    let mut rows: Vec<&Value> =
        v["namespaces"].as_array().map(|a| a.iter().collect()).unwrap_or_default();
    let depth = |r: &Value| {
        ["ready", "delayed", "leased"].iter().map(|f| r[*f].as_u64().unwrap_or(0)).sum::<u64>()
    };
    let age = |r: &Value| r["oldest_ready_age_seconds"].as_f64().unwrap_or(0.0);
    rows.sort_by(|a, b| depth(b).cmp(&depth(a)).then(age(b).total_cmp(&age(a))));
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<32} {:>8} {:>8} {:>8} {:>14} {:>10}",
        "NAMESPACE", "READY", "DELAYED", "LEASED", "OLDEST READY", "SYNCS/S"
    );
    for r in rows {
        let oldest = r["oldest_ready_age_seconds"]
            .as_f64()
            .map_or_else(|| "-".to_string(), |s| format!("{s:.1}s"));
        let _ = writeln!(
            o,
            "{:<32} {:>8} {:>8} {:>8} {:>14} {:>10.2}",
            r["namespace"].as_str().unwrap_or("?"),
            r["ready"].as_u64().unwrap_or(0),
            r["delayed"].as_u64().unwrap_or(0),
            r["leased"].as_u64().unwrap_or(0),
            oldest,
            r["syncs_per_second"].as_f64().unwrap_or(0.0)
        );
    }
    if v["truncated"] == true {
        o.push_str(
            "(a queue set was larger than kjob-queue reads at once: counts are lower bounds)\n",
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn explain_text_shows_failures_next_retry_and_the_last_error() {
        let v = json!({
            "key": "ns/pi", "state": "delayed", "reason_code": "request_backoff",
            "reason": "request backoff after an error: 3 failures in a row",
            "due_in_seconds": 3.5, "due_unix_ms": 1_000_000,
            "backoff": {"failures": 3, "next_delay_seconds": 8.0, "pod_failures": 2,
                "pod_backoff_remaining_seconds": 12.5},
            "last_sync": {"outcome": "error", "at_unix_ms": 999_000, "worker": "w1",
                "error": "quota"},
            "history": [{"event": "enqueued", "at_unix_ms": 990_000, "delay_seconds": 1.0,
                "observations": 2},
                {"event": "lease_expired", "at_unix_ms": 995_000, "worker": "w0",
                "expiries_in_a_row": 5, "poisoned": true},
                {"event": "synced", "at_unix_ms": 999_000, "worker": "w1", "outcome": "error",
                "requeue_delay_seconds": 4.0, "error": "quota"}],
        });
        let t = render_explain(&v);
        for want in [
            "State:        delayed",
            "(request_backoff)",
            "Next retry:   in 3.5s",
            "3 failed syncs (next error waits 8s)",
            "2 pod failures, pods may be created again in 12.5s",
            "Last sync:    error at 00:16:39.000 by w1: quota",
            "enqueued after 1s (2 pod observations)",
            "synced by w1: error, again in 4s: quota",
            "lease of w0 expired without a Done (5 in a row, now in backoff)",
        ] {
            assert!(t.contains(want), "{want:?} in\n{t}");
        }
        let ready = json!({"key": "ns/pi", "state": "ready",
            "ready": {"age_seconds": 2.0, "position": 3, "namespace_ready": 10},
            "namespace": {"name": "ns", "ready": 10}, "backoff": {}});
        let t = render_explain(&ready);
        let want = "Ready:        2.0s, position 4 of 10 ready in namespace ns";
        assert!(t.contains(want), "{want:?} in\n{t}");
    }

    #[test]
    fn top_puts_the_deepest_namespace_first() {
        let v = json!({"namespaces": [
            {"namespace": "a", "ready": 1, "delayed": 0, "leased": 0,
                "oldest_ready_age_seconds": 9.0, "syncs_per_second": 0.5},
            {"namespace": "b", "ready": 5, "delayed": 2, "leased": 1,
                "oldest_ready_age_seconds": 1.0, "syncs_per_second": 3.0},
            {"namespace": "c", "ready": 0, "delayed": 0, "leased": 0,
                "oldest_ready_age_seconds": null, "syncs_per_second": 1.0},
        ]});
        let t = render_top(&v);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("NAMESPACE"));
        assert!(lines[1].starts_with("b "), "{t}");
        assert!(lines[2].starts_with("a "), "{t}");
        assert!(lines[3].starts_with("c ") && lines[3].contains(" - "), "{t}");
    }
}
