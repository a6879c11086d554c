//! Orphan entries waiting out [`ORPHAN_SETTLE`](crate::handlers::ORPHAN_SETTLE) before the
//! event loop re-checks them against the cache ([`crate::handlers::recheck_settled`]).

use std::collections::{HashSet, VecDeque};

use tokio::time::Instant;

/// Pods (key and UID) waiting, in due order. Every entry waits the same period, so arrival
/// order is due order; a pod already waiting is not added again.
#[derive(Debug, Default)]
pub(crate) struct Settling {
    due: VecDeque<(Instant, String, String)>,
    waiting: HashSet<String>,
}

impl Settling {
    /// Adds pod `key` with `uid`, due at `at`, unless it is waiting already.
    pub fn push(&mut self, at: Instant, key: String, uid: String) {
        if self.waiting.insert(key.clone()) {
            self.due.push_back((at, key, uid));
        }
    }

    /// When the first waiting pod is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.due.front().map(|(at, _, _)| *at)
    }

    /// Removes and returns every pod due at `now`, as (key, UID).
    pub fn take_due(&mut self, now: Instant) -> Vec<(String, String)> {
        let mut out = Vec::new();
        while let Some((at, _, _)) = self.due.front() {
            if *at > now {
                break;
            }
            let (_, key, uid) = self.due.pop_front().expect("front exists");
            self.waiting.remove(&key);
            out.push((key, uid));
        }
        out
    }

    /// Pods waiting.
    pub fn len(&self) -> usize {
        self.due.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn pods_come_out_when_due_in_order_and_once() {
        let t0 = Instant::now();
        let s = Duration::from_secs(2);
        let mut w = Settling::default();
        assert_eq!(w.next_due(), None);
        w.push(t0 + s, "ns/a".into(), "ua".into());
        w.push(t0 + s + Duration::from_millis(5), "ns/b".into(), "ub".into());
        // Already waiting: not added again, and its first due time stands.
        w.push(t0 + s + Duration::from_millis(9), "ns/a".into(), "ua".into());
        assert_eq!(w.len(), 2);
        assert_eq!(w.next_due(), Some(t0 + s));
        assert!(w.take_due(t0 + s - Duration::from_millis(1)).is_empty());
        assert_eq!(w.take_due(t0 + s), vec![("ns/a".to_string(), "ua".to_string())]);
        assert_eq!(w.next_due(), Some(t0 + s + Duration::from_millis(5)));
        // Once out, the same pod may wait again.
        w.push(t0 + s + Duration::from_millis(20), "ns/a".into(), "ua2".into());
        assert_eq!(
            w.take_due(t0 + s + Duration::from_millis(30)),
            vec![("ns/b".to_string(), "ub".to_string()), ("ns/a".to_string(), "ua2".to_string())]
        );
        assert_eq!(w.len(), 0);
        assert_eq!(w.next_due(), None);
    }
}
