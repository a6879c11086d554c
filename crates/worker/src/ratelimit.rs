//! Client-side token bucket for API calls (`--kube-qps`, `--kube-burst`), like client-go's
//! flowcontrol limiter: a burst of `burst` calls, then `qps` calls per second.

use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

/// A token bucket shared by every API call of a worker process.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<BucketState>,
}

#[derive(Debug)]
struct BucketState {
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket refilling at `qps` tokens per second up to `burst` (both at least 1).
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        let qps = if qps.is_finite() && qps > 0.0 { qps } else { 1.0 };
        Self { qps, burst, state: Mutex::new(BucketState { tokens: burst, last: Instant::now() }) }
    }

    /// Takes one token, waiting for it if the bucket is empty. Reservations are made under the
    /// lock (tokens may go negative) so waiters are served in order without busy polling.
    pub async fn acquire(&self) {
        let wait = {
            let mut s = self.state.lock().await;
            let now = Instant::now();
            let refill = now.saturating_duration_since(s.last).as_secs_f64() * self.qps;
            s.tokens = (s.tokens + refill).min(self.burst);
            s.last = now;
            s.tokens -= 1.0;
            if s.tokens >= 0.0 {
                Duration::ZERO
            } else {
                Duration::from_secs_f64(-s.tokens / self.qps)
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn burst_then_rate() {
        let b = TokenBucket::new(10.0, 3);
        let start = Instant::now();
        for _ in 0..3 {
            b.acquire().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "burst is free");
        b.acquire().await;
        let e = start.elapsed();
        assert!(e >= Duration::from_millis(99) && e <= Duration::from_millis(101), "{e:?}");
        for _ in 0..10 {
            b.acquire().await;
        }
        let e = start.elapsed();
        assert!(e >= Duration::from_millis(1099) && e <= Duration::from_millis(1101), "{e:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn refills_up_to_burst_only() {
        let b = TokenBucket::new(100.0, 2);
        b.acquire().await;
        b.acquire().await;
        tokio::time::advance(Duration::from_secs(10)).await;
        let start = Instant::now();
        b.acquire().await;
        b.acquire().await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        b.acquire().await;
        assert!(start.elapsed() >= Duration::from_millis(9));
    }
}
