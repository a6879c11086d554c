//! The worker's side of the one API budget (`--api-qps-total`, `--api-burst-total`): before
//! each API request, a token of the bucket every worker shares, taken from kjob-queue in small
//! batches per namespace (`JobState.TakeApiTokens`); the 429s this worker gets are reported
//! with its next take, and slow the whole budget down. The worker's own `--kube-qps` bucket
//! stays as a second cap. The bucket, its fairness and its slowdown: `kjob_workqueue::budget`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use kjob_queue_client::QueueClient;
use tokio::time::Instant;

use crate::metrics::Metrics;

/// Most tokens taken in one call. A batch saves a round trip per request; a bigger one would
/// let a worker hold tokens another worker's requests need. See [`batch_size`].
pub const MAX_BATCH: u32 = 8;
/// How long tokens taken but unused stay usable: after this they are dropped (never returned,
/// so the sum of requests stays within the bucket), which bounds how long a worker can hold
/// tokens it turned out not to need.
pub const HOLD: Duration = Duration::from_secs(1);
/// Wait after a TakeApiTokens call failed before asking again (kjob-queue's client has already
/// retried it): requests wait rather than go over the budget.
const ERROR_WAIT: Duration = Duration::from_millis(500);
/// Namespaces whose held tokens are kept at once; beyond it, idle ones are forgotten, so the
/// map stays small however many namespaces a worker has synced.
const MAX_NAMESPACES: usize = 1024;

/// Tokens per TakeApiTokens call for a total of `qps`: a tenth of a second of the whole budget,
/// 1 to [`MAX_BATCH`]. At most one batch per namespace is held by a worker, so W workers hold at
/// most W × qps/10 tokens beyond what they spend, and a namespace's requests cost one call per
/// batch (at 100 QPS total: 8 requests per call).
pub fn batch_size(qps: f64) -> u32 {
    ((qps / 10.0).floor() as u32).clamp(1, MAX_BATCH)
}

/// The total burst when only `--api-qps-total` is given: one second of the rate (at least 1),
/// so any 10 s holds at most 1.1 × the rate's requests.
pub fn default_burst(qps: f64) -> u32 {
    (qps.floor() as u32).max(1)
}

/// The budget's configuration: the totals every worker is given.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetConfig {
    /// Requests per second, summed over every worker.
    pub qps: f64,
    /// Burst, summed over every worker.
    pub burst: u32,
}

/// Tokens held for one namespace.
#[derive(Debug)]
struct Held {
    tokens: u32,
    at: Instant,
}

/// The shared API budget as one worker uses it (clone is cheap).
#[derive(Clone)]
pub struct ApiBudget {
    inner: Arc<Inner>,
}

struct Inner {
    queue: QueueClient,
    config: BudgetConfig,
    batch: u32,
    /// Per namespace: the tokens held, behind an async lock so one request at a time asks
    /// kjob-queue for the namespace's next batch while the others wait for it.
    held: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<Held>>>>,
    /// 429s not yet reported.
    throttled: AtomicU32,
    metrics: Metrics,
}

impl ApiBudget {
    /// A budget of `config` taken through `queue`.
    pub fn new(queue: QueueClient, config: BudgetConfig, metrics: Metrics) -> Self {
        let batch = batch_size(config.qps);
        let inner = Inner {
            queue,
            config,
            batch,
            held: Default::default(),
            throttled: AtomicU32::new(0),
            metrics,
        };
        Self { inner: Arc::new(inner) }
    }

    /// Notes a 429 answer: reported with the next take.
    pub fn throttled(&self) {
        self.inner.throttled.fetch_add(1, Ordering::Relaxed);
    }

    fn slot(&self, namespace: &str) -> Arc<tokio::sync::Mutex<Held>> {
        let mut held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.len() >= MAX_NAMESPACES && !held.contains_key(namespace) {
            // Forget namespaces nobody is using now (their tokens are dropped, never reused).
            held.retain(|_, h| Arc::strong_count(h) > 1);
        }
        held.entry(namespace.to_string())
            .or_insert_with(|| {
                Arc::new(tokio::sync::Mutex::new(Held { tokens: 0, at: Instant::now() }))
            })
            .clone()
    }

    /// Takes one token for a request in `namespace` (`""`: cluster-scoped), waiting as long as
    /// the budget says; a failed call to kjob-queue waits and asks again (the budget fails
    /// closed). The wait cannot outlive the lease: a sync whose lease is lost is dropped, and
    /// its wait with it; renewals go on meanwhile.
    pub async fn acquire(&self, namespace: &str) {
        let slot = self.slot(namespace);
        let mut held = slot.lock().await;
        if held.tokens > 0 && held.at.elapsed() < HOLD {
            held.tokens -= 1;
            return;
        }
        let m = &self.inner.metrics;
        let started = Instant::now();
        let mut waited = false;
        loop {
            let throttled = self.inner.throttled.swap(0, Ordering::Relaxed);
            let BudgetConfig { qps, burst } = self.inner.config;
            let answer = self
                .inner
                .queue
                .take_api_tokens(namespace, self.inner.batch, qps, burst, throttled)
                .await;
            let wait = match answer {
                Ok(r) => {
                    m.api_budget_rate.set(r.rate);
                    m.api_budget_tokens.inc_by(u64::from(r.granted));
                    m.api_budget_throttled.inc_by(u64::from(throttled));
                    if r.slowed {
                        m.api_budget_slowdowns.inc();
                    }
                    if r.granted > 0 {
                        held.tokens = r.granted - 1;
                        held.at = Instant::now();
                        break;
                    }
                    Duration::from_millis(r.wait_ms.max(1))
                }
                Err(e) => {
                    // Report these 429s with the next call.
                    self.inner.throttled.fetch_add(throttled, Ordering::Relaxed);
                    m.api_budget_errors.inc();
                    tracing::warn!(error = %e, "the shared API budget did not answer; waiting");
                    ERROR_WAIT
                }
            };
            waited = true;
            tokio::time::sleep(wait).await;
        }
        if waited {
            m.api_budget_waits.inc();
            m.api_budget_wait_seconds.inc_by(started.elapsed().as_secs_f64());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_a_tenth_of_a_second_of_the_budget() {
        assert_eq!(batch_size(1.0), 1);
        assert_eq!(batch_size(20.0), 2);
        assert_eq!(batch_size(45.0), 4);
        assert_eq!(batch_size(100.0), 8);
        assert_eq!(batch_size(5000.0), MAX_BATCH);
    }
}
