//! Priority within a namespace: a Job's pod priority (its PriorityClass's value) gives its key a
//! head start in its namespace's ready set, bounded by the aging cap.
//!
//! A key's ready score is its ready time less its head start, so among keys of one namespace a
//! higher priority goes first when they became ready within the difference of their head starts,
//! and the order is upstream's (ready time, then key) when priorities are equal. **Aging:** no
//! key is ever passed by a key of its namespace that became ready more than
//! [`StoreConfig::priority_aging`](crate::StoreConfig) after it, since no head start exceeds it;
//! so a low-priority key waits at most that long plus the time to lease the keys that became
//! ready before then.
//!
//! The head start grows with the logarithm of the priority, so the values PriorityClasses use
//! in practice (tens to millions) stay apart: `aging × ln(1 + p) / ln(1 + TOP_PRIORITY)`, 0 for
//! p ≤ 0 (e.g. 1000 → 19.4 s, 1,000,000 → 38.7 s, 1,000,000,000 → 58.1 s of 60 s).
//! It is computed here, when the key is added, and kept beside the key (`T:prio`, with the
//! priority), so every script that readies the key again (promotion, requeue, an expired lease)
//! scores it the same way without knowing the cap.

use std::time::Duration;

/// Default of [`StoreConfig::priority_aging`](crate::StoreConfig): the longest head start a
/// priority gives, hence how long a low-priority key can be passed by keys that became ready
/// after it. A minute lets a high priority overtake a backlog of a minute's arrivals, while no
/// tenant's low-priority Job waits more than a minute behind later ones.
pub const PRIORITY_AGING: Duration = Duration::from_secs(60);

/// The highest priority Kubernetes gives a pod (`system-node-critical`): it gets the whole
/// aging cap as its head start.
pub const TOP_PRIORITY: i32 = 2_000_001_000;

/// The head start of `priority` under the aging cap `aging`, in whole milliseconds.
pub fn head_start(priority: i32, aging: Duration) -> Duration {
    if priority <= 0 {
        return Duration::ZERO;
    }
    let p = f64::from(priority.min(TOP_PRIORITY));
    let share = (1.0 + p).ln() / (1.0 + f64::from(TOP_PRIORITY)).ln();
    Duration::from_millis((aging.as_millis() as f64 * share).round() as u64)
}

/// An Add entry's priority argument: `head start ms|priority`, `0|0` for priority 0 (forgets a
/// stored one), empty when none was sent (the stored one stays).
pub(crate) fn arg(priority: Option<i32>, aging: Duration) -> Vec<u8> {
    match priority {
        None => Vec::new(),
        Some(0) => b"0|0".to_vec(),
        Some(p) => format!("{}|{p}", head_start(p, aging).as_millis()).into_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_starts_rise_with_priority_and_stay_under_the_cap() {
        let cap = PRIORITY_AGING;
        let hs = |p| head_start(p, cap).as_millis();
        assert_eq!(hs(0), 0);
        assert_eq!(hs(-5), 0, "negative priorities get no head start");
        assert_eq!(hs(TOP_PRIORITY), 60_000);
        assert_eq!(hs(i32::MAX), 60_000, "capped");
        let ps = [1, 10, 100, 1000, 10_000, 1_000_000, 1_000_000_000, 2_000_000_000];
        for w in ps.windows(2) {
            assert!(hs(w[0]) < hs(w[1]), "{} → {} ms, {} → {} ms", w[0], hs(w[0]), w[1], hs(w[1]));
        }
        assert_eq!(hs(1000), 19_355);
        assert_eq!(head_start(TOP_PRIORITY, Duration::from_secs(2)).as_millis(), 2000);
        assert_eq!(arg(None, cap), b"");
        assert_eq!(arg(Some(0), cap), b"0|0");
        assert_eq!(arg(Some(-7), cap), b"0|-7");
        assert_eq!(arg(Some(1000), cap), b"19355|1000");
    }
}
