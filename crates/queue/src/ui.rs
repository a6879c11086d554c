//! The web view on kjob-queue's admin port, served by kjob-queue itself: `/ui/` is one page
//! (HTML, a small script and a stylesheet, hand-written and embedded in the binary) that reads
//! the explain API and `GET /api/v1/overview` with relative URLs, so it works
//! the same on the port itself, through `kubectl kjob ui` and behind kube-apiserver's service
//! proxy prefix. Its routes sit beside the explain API's and share its access rules.
//!
//! * `GET /api/v1/overview`: the job queue's depth now and over the last
//!   [`SERIES_WINDOW`] (this replica's in-memory [`Samples`], one every [`SAMPLE_PERIOD`]),
//!   the workers holding leases, and the busiest namespaces.
//! * `GET /ui/`, `/ui/app.js`, `/ui/app.css`: the page. `/ui` and `/` redirect to `ui/`.
//!
//! Every response here carries a Content-Security-Policy that allows only this origin's
//! script, style and fetches (nothing inline), and `X-Content-Type-Options: nosniff`; the
//! script builds the page with `textContent`, never HTML from data (Job names are user input).

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use kjob_svc::Shutdown;
use kjob_workqueue::{LeaseHolders, Namespaces, QueueStats, Store};
use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::explain;

/// How often the overview's depth is sampled: fine enough for a 10-minute chart (120 points),
/// and one cheap STATS script per shard per period costs Redis nothing noticeable.
pub const SAMPLE_PERIOD: Duration = Duration::from_secs(5);

/// How far back the overview's chart reaches: "the last minutes" an operator looks at
/// when something piles up.
pub const SERIES_WINDOW: Duration = Duration::from_secs(10 * 60);

/// Samples kept: [`SERIES_WINDOW`] of [`SAMPLE_PERIOD`]s (a few KiB of memory).
pub const SAMPLES_KEPT: usize = (SERIES_WINDOW.as_secs() / SAMPLE_PERIOD.as_secs()) as usize;

/// Namespaces the overview lists (the busiest): a table a person reads at a glance;
/// `kubectl kjob top` and `/api/v1/namespaces` have them all.
pub const NAMESPACES_SHOWN: usize = 10;

/// The page's policy: this origin's script, style, images and fetches only, nothing inline,
/// no framing, no plugins, forms only to itself.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; \
     base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

const INDEX_HTML: &str = include_str!("../ui/index.html");
const APP_JS: &str = include_str!("../ui/app.js");
const APP_CSS: &str = include_str!("../ui/app.css");

/// One sample of the job queue's depth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Redis time of the read (Unix ms).
    pub at_ms: i64,
    /// Keys ready.
    pub ready: u64,
    /// Keys delayed.
    pub delayed: u64,
    /// Keys leased.
    pub leased: u64,
}

/// The last [`SAMPLES_KEPT`] samples, oldest first (this replica's: each replica samples the
/// same Redis, so any one answers alike once it has run for [`SERIES_WINDOW`]).
#[derive(Debug, Clone, Default)]
pub struct Samples(Arc<Mutex<VecDeque<Sample>>>);

impl Samples {
    /// Appends `s`, dropping the oldest past [`SAMPLES_KEPT`].
    pub fn push(&self, s: Sample) {
        let mut ring = self.0.lock();
        if ring.len() == SAMPLES_KEPT {
            ring.pop_front();
        }
        ring.push_back(s);
    }

    /// The samples, oldest first.
    pub fn snapshot(&self) -> Vec<Sample> {
        self.0.lock().iter().copied().collect()
    }
}

/// The web view: what its routes read, set once kjob-queue has connected to Redis.
#[derive(Clone, Default)]
pub struct Ui {
    store: Arc<OnceLock<Store>>,
    samples: Samples,
}

impl Ui {
    /// Starts serving from `store` (before this the overview answers 503; the page itself
    /// loads and says so).
    pub fn serve_from(&self, store: Store) {
        let _ = self.store.set(store);
    }

    /// The web view's routes, for the admin port.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/", get(to_ui))
            .route("/ui", get(to_ui))
            .route("/ui/", get(|| async { asset("index.html") }))
            .route("/ui/{file}", get(|Path(file): Path<String>| async move { asset(&file) }))
            .route("/api/v1/overview", get(overview))
            .with_state(self.clone())
            .layer(axum::middleware::map_response(secure))
    }

    /// Samples the job queue's depth every [`SAMPLE_PERIOD`] until `shutdown`; a failed read
    /// leaves a gap (the chart shows it), it does not stop sampling.
    pub async fn sample(&self, store: &Store, shutdown: &Shutdown) {
        loop {
            match store.stats(kjob_core::JOB_QUEUE).await {
                Ok(s) => self.samples.push(sample_of(&s)),
                Err(e) => tracing::debug!(error = %e, "sampling the queue depth failed"),
            }
            tokio::select! {
                _ = tokio::time::sleep(SAMPLE_PERIOD) => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }
}

fn sample_of(s: &QueueStats) -> Sample {
    Sample { at_ms: s.now_ms, ready: s.ready, delayed: s.delayed, leased: s.leased }
}

/// `/` and `/ui` → `ui/`, relative, so the redirect stays under a proxy's prefix.
async fn to_ui() -> Redirect {
    Redirect::temporary("ui/")
}

/// The headers every web-view response carries.
async fn secure(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    // Small and embedded: always revalidated, so an upgraded kjob-queue serves its own page.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// One embedded file, or 404.
fn asset(file: &str) -> Response {
    let (body, content_type) = match file {
        "index.html" => (INDEX_HTML, "text/html; charset=utf-8"),
        "app.js" => (APP_JS, "text/javascript; charset=utf-8"),
        "app.css" => (APP_CSS, "text/css; charset=utf-8"),
        _ => {
            return (
                StatusCode::NOT_FOUND,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                "no such file in kjob-queue's web view\n",
            )
                .into_response();
        }
    };
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

async fn overview(State(ui): State<Ui>) -> Response {
    let Some(store) = ui.store.get() else {
        return explain::error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "not connected to Redis yet",
        );
    };
    let q = kjob_core::JOB_QUEUE;
    let (stats, namespaces, holders) =
        tokio::join!(store.stats(q), store.namespaces(q), store.lease_holders(q));
    match (stats, namespaces, holders) {
        (Ok(s), Ok(n), Ok(h)) => {
            axum::Json(overview_json(&s, &n, &h, &ui.samples.snapshot())).into_response()
        }
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => explain::redis_error(&e),
    }
}

/// Seconds between two Unix-ms times.
fn secs(ms: i64) -> f64 {
    ms as f64 / 1000.0
}

/// The overview answer: depth now, its series, the lease holders and the busiest namespaces
/// (deepest first, then oldest ready key first).
pub fn overview_json(s: &QueueStats, n: &Namespaces, h: &LeaseHolders, series: &[Sample]) -> Value {
    let now = s.now_ms.max(n.now_ms).max(h.now_ms);
    let mut rows: Vec<Value> =
        explain::namespaces_json(n)["namespaces"].as_array().cloned().unwrap_or_default();
    let depth = |r: &Value| {
        ["ready", "delayed", "leased"].iter().map(|f| r[*f].as_u64().unwrap_or(0)).sum::<u64>()
    };
    let age = |r: &Value| r["oldest_ready_age_seconds"].as_f64().unwrap_or(0.0);
    rows.sort_by(|a, b| {
        depth(b)
            .cmp(&depth(a))
            .then(age(b).total_cmp(&age(a)))
            .then_with(|| a["namespace"].as_str().cmp(&b["namespace"].as_str()))
    });
    let total = rows.len();
    rows.truncate(NAMESPACES_SHOWN);
    json!({
        "queue": kjob_core::JOB_QUEUE,
        "now_unix_ms": now,
        "depth": {
            "ready": s.ready,
            "delayed": s.delayed,
            "leased": s.leased,
            "dirty": s.dirty,
            "failing": s.failing,
            "oldest_ready_age_seconds": s.oldest_ready_ms.map(|t| secs(now - t)),
            "oldest_lease_age_seconds": s.oldest_started_ms.map(|t| secs(now - t)),
        },
        "sample_period_seconds": SAMPLE_PERIOD.as_secs(),
        "window_seconds": SERIES_WINDOW.as_secs(),
        "series": series.iter().map(|p| json!({
            "at_unix_ms": p.at_ms, "ready": p.ready, "delayed": p.delayed, "leased": p.leased,
        })).collect::<Vec<_>>(),
        "workers": h.workers.iter().map(|w| json!({
            "worker": w.worker,
            "leases": w.leases,
            "keys": w.keys.iter().map(|(k, started)| json!({
                "key": k, "age_seconds": secs(now - started),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "workers_truncated": h.truncated,
        "namespaces": rows,
        "namespaces_total": total,
        "namespaces_truncated": n.truncated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kjob_workqueue::{Holder, NamespaceStats};

    fn ns(name: &str, ready: u64, delayed: u64, oldest: Option<i64>) -> NamespaceStats {
        NamespaceStats {
            namespace: name.into(),
            ready,
            delayed,
            leased: 0,
            oldest_ready_ms: oldest,
            syncs_per_second: 0.0,
        }
    }

    #[test]
    fn the_ring_keeps_the_last_window() {
        let s = Samples::default();
        for i in 0..(SAMPLES_KEPT as i64 + 5) {
            s.push(Sample { at_ms: i, ready: 0, delayed: 0, leased: 0 });
        }
        let snap = s.snapshot();
        assert_eq!(snap.len(), SAMPLES_KEPT);
        assert_eq!(snap[0].at_ms, 5);
        assert_eq!(snap.last().unwrap().at_ms, SAMPLES_KEPT as i64 + 4);
    }

    #[test]
    fn the_busiest_namespaces_come_first_and_only_the_shown_ones() {
        let mut rows: Vec<NamespaceStats> =
            (0..15).map(|i| ns(&format!("n{i:02}"), 1, 0, Some(1000))).collect();
        rows.push(ns("deep", 50, 3, Some(9000)));
        rows.push(ns("old", 1, 0, Some(10)));
        let n = Namespaces { now_ms: 10_000, truncated: false, namespaces: rows, replicas: 1 };
        let h = LeaseHolders {
            now_ms: 10_000,
            truncated: false,
            workers: vec![Holder {
                worker: "w1".into(),
                leases: 2,
                keys: vec![("a/x".into(), 4000)],
            }],
        };
        let s = QueueStats { now_ms: 10_000, ready: 66, delayed: 3, ..Default::default() };
        let v = overview_json(&s, &n, &h, &[]);
        let names: Vec<&str> = v["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["namespace"].as_str().unwrap())
            .collect();
        assert_eq!(names.len(), NAMESPACES_SHOWN);
        assert_eq!(&names[..3], ["deep", "old", "n00"]);
        assert_eq!(v["namespaces_total"], 17);
        assert_eq!(v["workers"][0]["keys"][0]["age_seconds"], 6.0);
        assert_eq!(v["depth"]["ready"], 66);
    }

    #[test]
    fn unknown_files_are_404_and_known_ones_have_their_type() {
        assert_eq!(asset("../Cargo.toml").status(), StatusCode::NOT_FOUND);
        assert_eq!(asset("app.js.map").status(), StatusCode::NOT_FOUND);
        let js = asset("app.js");
        assert_eq!(js.headers()[header::CONTENT_TYPE], "text/javascript; charset=utf-8");
    }
}
