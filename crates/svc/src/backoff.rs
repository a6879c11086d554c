//! One retry backoff for every kjob loop: capped exponential, with jitter where many clients
//! may retry together (kube-runtime's `DefaultBackoff` plays this part there).

use std::time::Duration;

use rand::Rng;

/// Capped exponential backoff: `initial · 2^attempt`, never more than `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Delay before the first retry (attempt 0).
    pub initial: Duration,
    /// Longest delay.
    pub max: Duration,
}

impl Backoff {
    /// A backoff from `initial` doubling up to `max`.
    pub const fn new(initial: Duration, max: Duration) -> Self {
        Self { initial, max }
    }

    /// The delay before retry number `attempt` (0-based), without jitter.
    pub fn delay(&self, attempt: u32) -> Duration {
        // Past 2^64 every product exceeds any Duration; compute in u128 so nothing overflows.
        if attempt >= 64 {
            return self.max;
        }
        let nanos = self.initial.as_nanos().saturating_mul(1u128 << attempt);
        if nanos >= self.max.as_nanos() {
            self.max
        } else {
            Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
        }
    }

    /// [`Self::delay`] scaled by a random factor in [0.5, 1.0], so clients that failed together
    /// do not come back in lockstep.
    pub fn jittered(&self, attempt: u32) -> Duration {
        self.delay(attempt).mul_f64(rand::rng().random_range(0.5..=1.0))
    }

    /// A retry counter over this backoff, for loops that retry until something succeeds.
    pub fn attempts(self) -> Attempts {
        Attempts { backoff: self, next: 0 }
    }
}

/// The state of one retry loop: [`Attempts::next_delay`] after a failure, [`Attempts::reset`]
/// after a success.
#[derive(Debug, Clone)]
pub struct Attempts {
    backoff: Backoff,
    next: u32,
}

impl Attempts {
    /// The (jittered) pause before the next attempt; each call doubles the next one.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.backoff.jittered(self.next);
        self.next = self.next.saturating_add(1);
        d
    }

    /// Failures since the last success.
    pub fn failures(&self) -> u32 {
        self.next
    }

    /// Starts over from the initial delay.
    pub fn reset(&mut self) {
        self.next = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_and_caps() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let got: Vec<u128> = (0..6).map(|a| b.delay(a).as_millis()).collect();
        assert_eq!(got, vec![100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.delay(63), Duration::from_secs(1));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(1));
        // A tiny initial delay still reaches a large cap (no early saturation of the factor).
        let tiny = Backoff::new(Duration::from_nanos(1), Duration::from_secs(10_000));
        assert_eq!(tiny.delay(40), Duration::from_nanos(1 << 40));
        assert_eq!(tiny.delay(62), Duration::from_secs(10_000));
        for a in 0..8 {
            let j = b.jittered(a);
            assert!(j <= b.delay(a) && j >= b.delay(a) / 2, "{a}: {j:?}");
        }
    }

    #[test]
    fn attempts_grow_and_reset() {
        let mut a = Backoff::new(Duration::from_millis(10), Duration::from_millis(40)).attempts();
        let d: Vec<Duration> = (0..4).map(|_| a.next_delay()).collect();
        assert!(d[0] <= Duration::from_millis(10) && d[3] >= Duration::from_millis(20), "{d:?}");
        assert_eq!(a.failures(), 4);
        a.reset();
        assert_eq!(a.failures(), 0);
        assert!(a.next_delay() <= Duration::from_millis(10));
    }
}
