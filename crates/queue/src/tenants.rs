//! The queue per namespace, bounded: the namespaces ranked by depth (shared by the Namespaces
//! RPC and the per-namespace gauges), and the loop that keeps the gauges of the top N
//! namespaces, the rest summed under [`OTHER`], and of the Jobs waiting longest.
//!
//! Every replica refreshes the gauges from Redis on its own, so each replica exports the same
//! values (dashboards take `max by (namespace)`, never a sum). A refresh costs, per shard, one
//! NAMESPACES script reading at most [`NAMESPACE_METRICS_MAX_SCAN`] members of each of the
//! shard's delayed and lease sets, one OLDEST READY script (the head of each namespace's ready
//! set) and one read of the published sync rates: a few ms of Redis time per master every
//! [`NAMESPACE_METRICS_PERIOD`] per replica.

use std::time::Duration;

use kjob_svc::Shutdown;
use kjob_workqueue::{NamespaceStats, Store, WaitingKey, WqError};
use rand::Rng;

use crate::metrics::Metrics;

/// How often each replica refreshes the per-namespace gauges: under a typical 15-30 s scrape
/// interval, and rare enough that the scans cost Redis little.
pub const NAMESPACE_METRICS_PERIOD: Duration = Duration::from_secs(10);

/// Members of each shard's delayed and lease sets (and namespaces of its round robin) one
/// refresh reads: the walk costs about 0.3-0.6 ms of Redis time per 1,000 members (measured on
/// a loaded 2-core machine), so no refresh holds a master for more than a few ms; past it the
/// counts are lower bounds and `kjob_queue_namespace_counts_truncated` says so.
pub const NAMESPACE_METRICS_MAX_SCAN: u32 = 5_000;

/// Default of `--namespace-metrics-top`: the namespaces with their own series.
pub const DEFAULT_NAMESPACE_METRICS_TOP: usize = 10;

/// Most namespaces `--namespace-metrics-top` may give their own series: keeps the gauges'
/// cardinality small whatever the flag says.
pub const MAX_NAMESPACE_METRICS_TOP: usize = 100;

/// The Jobs waiting longest that get a `kjob_queue_oldest_ready_job_seconds` series each.
pub const OLDEST_JOBS: u32 = 10;

/// The `namespace` label of the namespaces past the top N, summed. Namespace names are DNS-1123
/// labels (lower-case letters, digits and `-`), so no namespace can be called this.
pub const OTHER: &str = "_other";

/// The keys a namespace holds in the queue: ready, delayed and leased.
pub fn depth(s: &NamespaceStats) -> u64 {
    s.ready + s.delayed + s.leased
}

/// The namespaces holding keys, deepest first, then by name (namespaces that only synced
/// recently are left out).
pub fn by_depth(mut rows: Vec<NamespaceStats>) -> Vec<NamespaceStats> {
    rows.retain(|s| depth(s) > 0);
    rows.sort_by(|a, b| depth(b).cmp(&depth(a)).then_with(|| a.namespace.cmp(&b.namespace)));
    rows
}

/// The namespaces of a refresh: the top `n` by depth, and the rest summed as [`OTHER`] (its
/// oldest ready time the oldest of theirs).
#[derive(Debug, Clone, PartialEq)]
pub struct TopNamespaces {
    /// Redis time of the read.
    pub now_ms: i64,
    /// The deepest namespaces, deepest first.
    pub top: Vec<NamespaceStats>,
    /// The others, summed, named [`OTHER`] (zero when there are none).
    pub other: NamespaceStats,
    /// Namespaces holding keys, in the top or not.
    pub total: usize,
    /// The counts are lower bounds (a set held more than the refresh read).
    pub truncated: bool,
    /// The Jobs waiting longest, longest first.
    pub oldest: Vec<WaitingKey>,
}

/// Splits `rows` into the top `n` by depth and the rest.
pub fn split_top(
    rows: Vec<NamespaceStats>,
    n: usize,
) -> (Vec<NamespaceStats>, NamespaceStats, usize) {
    let mut rows = by_depth(rows);
    let total = rows.len();
    let rest = rows.split_off(n.min(total));
    let mut other = NamespaceStats {
        namespace: OTHER.to_string(),
        ready: 0,
        delayed: 0,
        leased: 0,
        oldest_ready_ms: None,
        syncs_per_second: 0.0,
    };
    for s in rest {
        other.ready += s.ready;
        other.delayed += s.delayed;
        other.leased += s.leased;
        other.syncs_per_second += s.syncs_per_second;
        other.oldest_ready_ms = match (other.oldest_ready_ms, s.oldest_ready_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    (rows, other, total)
}

/// Reads the job queue's namespaces and longest waiting keys from Redis, bounded.
pub async fn read(store: &Store, n: usize) -> Result<TopNamespaces, WqError> {
    let queue = kjob_core::JOB_QUEUE;
    let (all, oldest) = futures::future::try_join(
        store.namespaces_within(queue, NAMESPACE_METRICS_MAX_SCAN),
        store.oldest_ready(queue, None, OLDEST_JOBS),
    )
    .await?;
    let (top, other, total) = split_top(all.namespaces, n);
    Ok(TopNamespaces {
        now_ms: all.now_ms.max(oldest.now_ms),
        top,
        other,
        total,
        truncated: all.truncated,
        oldest: oldest.keys,
    })
}

/// Refreshes the per-namespace gauges of the deepest namespaces ([`Metrics::namespace_top`])
/// every [`NAMESPACE_METRICS_PERIOD`] (jittered, so replicas spread their reads) until
/// `shutdown`.
pub async fn publish(store: &Store, metrics: &Metrics, shutdown: &Shutdown) {
    loop {
        match read(store, metrics.namespace_top()).await {
            Ok(t) => metrics.set_namespaces(&t),
            Err(e) => tracing::warn!(error = %e, "reading the per-namespace gauges failed"),
        }
        let pause = NAMESPACE_METRICS_PERIOD.mul_f64(rand::rng().random_range(0.8..1.2));
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(
        name: &str,
        ready: u64,
        delayed: u64,
        leased: u64,
        oldest: Option<i64>,
    ) -> NamespaceStats {
        NamespaceStats {
            namespace: name.into(),
            ready,
            delayed,
            leased,
            oldest_ready_ms: oldest,
            syncs_per_second: 1.0,
        }
    }

    #[test]
    fn the_deepest_get_their_own_series_and_the_rest_one() {
        let rows = vec![
            ns("a", 1, 0, 0, Some(50)),
            ns("b", 5, 5, 0, Some(100)),
            ns("c", 0, 3, 1, None),
            ns("d", 2, 0, 0, Some(10)),
            // Only synced recently: no keys, no series.
            ns("quiet", 0, 0, 0, None),
            // Ties by name.
            ns("e", 2, 0, 0, None),
        ];
        // (top n, the namespaces with series, _other's ready, delayed, leased and oldest)
        type Other = (u64, u64, u64, Option<i64>);
        let cases: Vec<(usize, Vec<&str>, Other)> = vec![
            (0, vec![], (10, 8, 1, Some(10))),
            (2, vec!["b", "c"], (5, 0, 0, Some(10))),
            (3, vec!["b", "c", "d"], (3, 0, 0, Some(50))),
            (10, vec!["b", "c", "d", "e", "a"], (0, 0, 0, None)),
        ];
        for (n, want, (r, d, l, o)) in cases {
            let (top, other, total) = split_top(rows.clone(), n);
            let names: Vec<&str> = top.iter().map(|s| s.namespace.as_str()).collect();
            assert_eq!(names, want, "top {n}");
            assert_eq!(total, 5, "top {n}");
            assert_eq!(other.namespace, OTHER);
            assert_eq!(
                (other.ready, other.delayed, other.leased, other.oldest_ready_ms),
                (r, d, l, o)
            );
        }
    }

    #[test]
    fn the_other_label_is_no_namespace_name() {
        assert!(crate::validate::namespace(OTHER, false).is_err());
    }
}
