//! Parses Redis `INFO commandstats` so command counts can be compared before and after a phase.

use std::collections::BTreeMap;

/// Calls per command (`evalsha`, `get`, …) from `INFO commandstats` output.
pub fn command_calls(info: &str) -> BTreeMap<String, u64> {
    info.lines()
        .filter_map(|l| {
            let (name, fields) = l.trim().strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = fields.split(',').find_map(|f| f.strip_prefix("calls="))?.parse().ok()?;
            Some((name.to_string(), calls))
        })
        .collect()
}

/// Per-command growth from `before` to `after`; commands that did not grow are left out, and a
/// counter that went down (a Redis restart) counts from zero.
pub fn delta(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(k, &a)| {
            let b = before.get(k).copied().unwrap_or(0);
            let d = if a >= b { a - b } else { a };
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_diffs_commandstats() {
        let before = command_calls(
            "# Commandstats\r\ncmdstat_evalsha:calls=10,usec=50,usec_per_call=5.00,rejected_calls=0,failed_calls=0\r\ncmdstat_info:calls=1,usec=9\r\n",
        );
        assert_eq!(before.get("evalsha"), Some(&10));
        let after = command_calls(
            "cmdstat_evalsha:calls=25,usec=90\ncmdstat_info:calls=1,usec=9\ncmdstat_ping:calls=4,usec=1\nnot_a_stat:calls=3\n",
        );
        let d = delta(&before, &after);
        assert_eq!(d.get("evalsha"), Some(&15));
        assert_eq!(d.get("ping"), Some(&4));
        assert_eq!(d.get("info"), None);
        assert_eq!(d.len(), 2);
        // A restart resets counters: growth counts from zero.
        let restarted = command_calls("cmdstat_evalsha:calls=3,usec=1\n");
        assert_eq!(delta(&before, &restarted).get("evalsha"), Some(&3));
    }
}
