//! client-go's per-item exponential failure rate limiter, as a pure formula.
//!
//! The DONE script applies the same formula atomically in Redis; this is the reference it is
//! tested against and what callers use to predict a delay.

use std::time::Duration;

/// `ItemExponentialFailureRateLimiter`: delay = base · 2^failures (counted before this failure),
/// capped at `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemExponentialLimiter {
    /// Delay after the first failure.
    pub base: Duration,
    /// Longest delay.
    pub max: Duration,
}

/// The Job controller's limiter (both queues): 1 s doubling up to 60 s
/// (`DefaultJobApiBackOff`, `MaxJobApiBackOff`).
pub const JOB_LIMITER: ItemExponentialLimiter =
    ItemExponentialLimiter { base: Duration::from_secs(1), max: Duration::from_secs(60) };

impl ItemExponentialLimiter {
    /// The delay of the next requeue when the item has already failed `failures` times: kjob's
    /// one backoff formula, without jitter (the DONE script cannot draw the same random number).
    pub fn when(&self, failures: u32) -> Duration {
        kjob_svc::Backoff::new(self.base, self.max).delay(failures)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_sequence() {
        let got: Vec<u64> = (0..10).map(|f| JOB_LIMITER.when(f).as_secs()).collect();
        assert_eq!(got, vec![1, 2, 4, 8, 16, 32, 60, 60, 60, 60]);
        assert_eq!(JOB_LIMITER.when(u32::MAX), Duration::from_secs(60));
    }

    #[test]
    fn client_go_default_item_limiter() {
        let l = ItemExponentialLimiter {
            base: Duration::from_millis(5),
            max: Duration::from_secs(1000),
        };
        assert_eq!(l.when(0), Duration::from_millis(5));
        assert_eq!(l.when(1), Duration::from_millis(10));
        assert_eq!(l.when(30), Duration::from_secs(1000));
    }
}
