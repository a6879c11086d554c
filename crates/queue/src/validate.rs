//! Request validation: pure functions returning a clear message for INVALID_ARGUMENT.

use kjob_core::{ObjectKey, QUEUES};
use kjob_workqueue::{MAX_WEIGHT, MAX_WEIGHTED_NAMESPACES};

/// Longest delay accepted in Add or Done (30 days): longer ones are almost certainly unit
/// mistakes, and the watcher's resync re-enqueues every Job long before that anyway.
pub const MAX_DELAY_MS: u64 = 30 * 24 * 3600 * 1000;
/// Most items in one DoneBatch: one queue's items then fit one Done script call.
pub use kjob_core::MAX_DONE_BATCH;
/// Most items in one Add, and most operations in one Add item (see their why there).
pub use kjob_core::{MAX_ADD_ITEM_OPS, MAX_ADD_ITEMS};
/// Most keys leased by one call.
pub const MAX_LEASE_ITEMS: u32 = 1000;
/// Longest long-poll wait of Lease.
pub const MAX_WAIT_MS: u64 = 60_000;
/// Longest lease (renew for longer syncs).
pub const MAX_LEASE_MS: u64 = 3600 * 1000;
/// Most keys in one Inspect or UIDs in one ExpectFinalizerRemovals.
pub const MAX_LIST: usize = 10_000;
/// Longest free-form identifier (worker ids, UIDs, lease ids, record names).
pub const MAX_ID_LEN: usize = 253;
/// Most records of one Job (see its why there).
pub use kjob_workqueue::MAX_RECORDS_PER_JOB;
/// Largest record value.
pub const MAX_RECORD_BYTES: usize = 64 * 1024;
/// Largest object in a view write: etcd's default request limit (1.5 MiB), which bounds every
/// object the API server can hold.
pub const MAX_VIEW_OBJECT_BYTES: usize = 1536 * 1024;
/// Most records read with one view.
pub const MAX_VIEW_RECORDS: usize = 16;
/// Most cached views a Lease names (`LeaseRequest.cached_views`): a lessee names only the
/// views it holds among the keys it may lease now, a few per free slot.
pub const MAX_CACHED_VIEWS: usize = 64;
/// Longest epoch token a caller names (`kjob-queue` answers 16 hex digits).
pub const MAX_EPOCH_TOKEN: usize = 64;
/// Largest request kjob-queue decodes and largest reply it sends, and the pods of one view
/// page (see their why there).
pub use kjob_core::{MAX_REPLY_BYTES, MAX_REQUEST_BYTES, VIEW_PAGE_BYTES};
/// Most bytes of pods in the one reply to a caller that does not page views (a worker older
/// than paged views): a larger view is answered untrusted, and the caller reads the API
/// server. Leaves 4 MiB of [`MAX_REPLY_BYTES`] for the Job object (≤ 1.5 MiB), the records
/// (≤ 1 MiB), the expectations and one pod past the budget.
pub const WHOLE_VIEW_BYTES: usize = MAX_REPLY_BYTES - 4 * 1024 * 1024;
/// Room a Lease reply keeps beside the views it carries, for its items (≤ 1,000, about 100
/// bytes each) and Done results (≤ 200): the views get the rest of [`MAX_REPLY_BYTES`].
pub const LEASE_REPLY_ROOM: usize = 1024 * 1024;

/// Most events in one GateEvents call, and the longest message it accepts.
pub use kjob_core::events::{MAX_GATE_EVENTS, MAX_GATED_MESSAGE_BYTES as MAX_EVENT_MESSAGE_BYTES};
/// Longest correlation key (spam, aggregate or event key): the involved object's namespace,
/// name and UID with source, type and reason, plus the message for the event key.
pub const MAX_EVENT_KEY_BYTES: usize = 1024 + MAX_EVENT_MESSAGE_BYTES;

/// Most tokens one TakeApiTokens call may ask for.
pub use kjob_workqueue::budget::MAX_TAKE;
/// Largest total burst of the API budget: far above any sensible budget, and it keeps the
/// bucket's arithmetic exact in a double.
pub const MAX_API_BURST: u32 = 100_000;
/// Largest total rate of the API budget (requests per second), for the same reason.
pub const MAX_API_QPS: f64 = 100_000.0;

/// Checks a TakeApiTokens request: a namespace name or "" (cluster-scoped requests), 1 to
/// [`MAX_TAKE`] tokens, a finite positive rate and a burst of at least 1, both bounded.
pub fn api_tokens(namespace: &str, want: u32, qps: f64, burst: u32) -> Result<(), String> {
    self::namespace(namespace, true)?;
    if want == 0 || want > MAX_TAKE {
        return Err(format!("want is {want}; 1 to {MAX_TAKE} tokens may be asked for"));
    }
    if !(qps.is_finite() && qps > 0.0 && qps <= MAX_API_QPS) {
        return Err(format!("qps is {qps}; it must be above 0 and at most {MAX_API_QPS}"));
    }
    if burst == 0 || burst > MAX_API_BURST {
        return Err(format!("burst is {burst}; 1 to {MAX_API_BURST} are allowed"));
    }
    Ok(())
}

/// Checks a SetNamespaceWeights request: at most [`MAX_WEIGHTED_NAMESPACES`] entries, each a
/// namespace name (a DNS-1123 label) with a weight of 1 to [`MAX_WEIGHT`].
pub fn namespace_weights(weights: &std::collections::HashMap<String, u32>) -> Result<(), String> {
    if weights.len() > MAX_WEIGHTED_NAMESPACES {
        return Err(format!(
            "{} weighted namespaces; at most {MAX_WEIGHTED_NAMESPACES} are allowed",
            weights.len()
        ));
    }
    // Sorted, so the same request always names the same offender.
    let mut sorted: Vec<(&String, &u32)> = weights.iter().collect();
    sorted.sort();
    for (ns, &w) in sorted {
        // A namespace is valid exactly when `<namespace>/x` is a valid key.
        if key(&format!("{ns}/x")).is_err() {
            return Err(format!("namespace {ns:?} is not a namespace name (a DNS-1123 label)"));
        }
        if w == 0 || w > MAX_WEIGHT {
            return Err(format!("weight {w} for namespace {ns}; 1 to {MAX_WEIGHT} are allowed"));
        }
    }
    Ok(())
}

/// Checks the size of a GateEvents batch.
pub fn gate_batch(len: usize) -> Result<(), String> {
    if len > MAX_GATE_EVENTS {
        return Err(format!("{len} events in one GateEvents call; the limit is {MAX_GATE_EVENTS}"));
    }
    Ok(())
}

/// Checks event `i` of a GateEvents batch: the object key is a `namespace/name` key, every
/// correlation key is present and bounded, the message is bounded.
pub fn gate_event(
    i: usize,
    object_key: &str,
    keys: [(&str, &str); 3],
    message: &str,
) -> Result<(), String> {
    key(object_key).map_err(|e| format!("events[{i}].object_key: {e}"))?;
    for (field, v) in keys {
        if v.is_empty() {
            return Err(format!("events[{i}].{field} is required"));
        }
        if v.len() > MAX_EVENT_KEY_BYTES {
            return Err(format!(
                "events[{i}].{field} is {} bytes long; the limit is {MAX_EVENT_KEY_BYTES}",
                v.len()
            ));
        }
    }
    if message.len() > MAX_EVENT_MESSAGE_BYTES {
        return Err(format!(
            "events[{i}].message is {} bytes long; the limit is {MAX_EVENT_MESSAGE_BYTES}",
            message.len()
        ));
    }
    Ok(())
}

/// Checks the object of a view write.
pub fn view_object(field: &str, v: &[u8], required: bool) -> Result<(), String> {
    if required && v.is_empty() {
        return Err(format!("{field} is required"));
    }
    if v.len() > MAX_VIEW_OBJECT_BYTES {
        return Err(format!("{field} is {} bytes; the limit is {MAX_VIEW_OBJECT_BYTES}", v.len()));
    }
    Ok(())
}

/// Checks the size of an Add.
pub fn add_items(n: usize) -> Result<(), String> {
    if n > MAX_ADD_ITEMS {
        return Err(format!("{n} items in one Add; the limit is {MAX_ADD_ITEMS} (MAX_ADD_ITEMS)"));
    }
    Ok(())
}

/// Checks the operations (view writes and observations) of one Add item.
pub fn add_item_ops(cache_ops: usize, observations: usize) -> Result<(), String> {
    let n = cache_ops + observations;
    if n > MAX_ADD_ITEM_OPS {
        return Err(format!(
            "{n} operations ({cache_ops} cache writes, {observations} observations) in one Add \
             item; the limit is {MAX_ADD_ITEM_OPS} (MAX_ADD_ITEM_OPS)"
        ));
    }
    Ok(())
}

/// Checks a queue name.
pub fn queue(name: &str) -> Result<(), String> {
    if QUEUES.contains(&name) {
        Ok(())
    } else {
        Err(format!("unknown queue {name:?}; known queues are {QUEUES:?}"))
    }
}

/// Checks an item key (`namespace/name`).
pub fn key(k: &str) -> Result<(), String> {
    ObjectKey::parse(k).map(|_| ()).map_err(|e| e.to_string())
}

/// Most namespaces a Namespaces answer lists.
pub const MAX_NAMESPACES_LIMIT: u32 = 1000;
/// Namespaces a Namespaces answer lists when the request leaves `limit` at 0: a screenful.
pub const DEFAULT_NAMESPACES_LIMIT: u32 = 50;

/// Checks a namespace name (a DNS-1123 label); `""` is accepted when `optional`.
pub fn namespace(ns: &str, optional: bool) -> Result<(), String> {
    if ns.is_empty() && optional {
        return Ok(());
    }
    // A namespace is valid exactly when `<namespace>/x` is a valid key.
    if key(&format!("{ns}/x")).is_err() {
        return Err(format!("namespace {ns:?} is not a namespace name (a DNS-1123 label)"));
    }
    Ok(())
}

/// Checks a Namespaces request's bounds; the namespace limit it asks for (0: the default).
pub fn namespaces(limit: u32, oldest_keys: u32) -> Result<u32, String> {
    if limit > MAX_NAMESPACES_LIMIT {
        return Err(format!("limit is {limit}; at most {MAX_NAMESPACES_LIMIT} namespaces"));
    }
    if oldest_keys > kjob_workqueue::OLDEST_READY_MAX_KEYS {
        return Err(format!(
            "oldest_keys is {oldest_keys}; at most {} keys",
            kjob_workqueue::OLDEST_READY_MAX_KEYS
        ));
    }
    Ok(if limit == 0 { DEFAULT_NAMESPACES_LIMIT } else { limit })
}

/// Checks a delay in ms.
pub fn delay(field: &str, ms: u64) -> Result<(), String> {
    if ms > MAX_DELAY_MS {
        return Err(format!(
            "{field} {ms} ms is longer than the limit of {MAX_DELAY_MS} ms (30 days)"
        ));
    }
    Ok(())
}

/// Checks an identifier's length (and presence when `required`).
pub fn id(field: &str, v: &str, required: bool) -> Result<(), String> {
    if required && v.is_empty() {
        return Err(format!("{field} is required"));
    }
    if v.len() > MAX_ID_LEN {
        return Err(format!("{field} is {} bytes long; the limit is {MAX_ID_LEN}", v.len()));
    }
    Ok(())
}

/// Checks a Lease request's numbers.
pub fn lease(max_items: u32, lease_ms: u64, wait_ms: u64) -> Result<(), String> {
    if max_items == 0 || max_items > MAX_LEASE_ITEMS {
        return Err(format!("max_items must be 1..={MAX_LEASE_ITEMS}, got {max_items}"));
    }
    lease_ms_ok(lease_ms)?;
    if wait_ms > MAX_WAIT_MS {
        return Err(format!("wait_ms must be at most {MAX_WAIT_MS}, got {wait_ms}"));
    }
    Ok(())
}

/// Checks the item count of a DoneBatch.
pub fn done_batch_len(n: usize) -> Result<(), String> {
    if n == 0 || n > MAX_DONE_BATCH {
        return Err(format!("a DoneBatch takes 1..={MAX_DONE_BATCH} items, got {n}"));
    }
    Ok(())
}

/// Checks a lease duration.
pub fn lease_ms_ok(lease_ms: u64) -> Result<(), String> {
    if lease_ms == 0 || lease_ms > MAX_LEASE_MS {
        return Err(format!("lease_ms must be 1..={MAX_LEASE_MS}, got {lease_ms}"));
    }
    Ok(())
}

/// Checks an expectations count (never negative: lowering takes a positive amount).
pub fn count(field: &str, v: i64) -> Result<(), String> {
    if !(0..=1_000_000).contains(&v) {
        return Err(format!("{field} must be 0..=1000000, got {v}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        assert!(queue("job").is_ok() && queue("orphan-pod").is_ok());
        assert!(queue("jobs").unwrap_err().contains("unknown queue"));
        assert!(key("ns/a").is_ok());
        assert!(key("").unwrap_err().contains("empty"));
        assert!(key(&format!("ns/{}", "x".repeat(400))).is_err());
        assert!(key("nslash").is_err());
        assert!(delay("delay_ms", MAX_DELAY_MS).is_ok());
        assert!(delay("delay_ms", MAX_DELAY_MS + 1).unwrap_err().contains("30 days"));
        assert!(lease(1, 1000, 0).is_ok());
        assert!(lease(0, 1000, 0).unwrap_err().contains("max_items"));
        assert!(lease(1001, 1000, 0).is_err());
        assert!(lease(1, 0, 0).unwrap_err().contains("lease_ms"));
        assert!(lease(1, 1000, 60_001).unwrap_err().contains("wait_ms"));
        assert!(id("worker_id", "", true).is_err());
        assert!(id("job_uid", "", false).is_ok());
        assert!(id("x", &"a".repeat(254), false).is_err());
        assert!(done_batch_len(0).unwrap_err().contains("1..=200"));
        assert!(done_batch_len(1).is_ok() && done_batch_len(MAX_DONE_BATCH).is_ok());
        assert!(done_batch_len(MAX_DONE_BATCH + 1).is_err());
        assert!(count("add", -1).is_err() && count("add", 3).is_ok());
        assert!(add_items(MAX_ADD_ITEMS).is_ok());
        assert!(add_items(MAX_ADD_ITEMS + 1).unwrap_err().contains("MAX_ADD_ITEMS"));
        assert!(add_item_ops(MAX_ADD_ITEM_OPS, 0).is_ok());
        assert!(add_item_ops(MAX_ADD_ITEM_OPS, 1).unwrap_err().contains("limit is 512"));
        assert!(namespace("", true).is_ok() && namespace("team-a", false).is_ok());
        assert!(namespace("", false).is_err());
        assert!(namespace("_other", true).unwrap_err().contains("DNS-1123"));
        assert!(namespace("a/b", true).is_err() && namespace("Team", true).is_err());
        assert_eq!(namespaces(0, 0), Ok(DEFAULT_NAMESPACES_LIMIT));
        assert_eq!(namespaces(MAX_NAMESPACES_LIMIT, 100), Ok(MAX_NAMESPACES_LIMIT));
        assert!(namespaces(MAX_NAMESPACES_LIMIT + 1, 0).unwrap_err().contains("limit"));
        assert!(namespaces(1, 101).unwrap_err().contains("oldest_keys"));
    }

    #[test]
    fn namespace_weights_table() {
        let w = |v: &[(&str, u32)]| {
            namespace_weights(&v.iter().map(|(n, w)| (n.to_string(), *w)).collect())
        };
        assert!(w(&[]).is_ok() && w(&[("team-a", 1), ("b", MAX_WEIGHT)]).is_ok());
        assert!(w(&[("a", 0)]).unwrap_err().contains("weight 0"));
        assert!(w(&[("a", MAX_WEIGHT + 1)]).unwrap_err().contains("1 to 1000"));
        assert!(w(&[("Team", 2)]).unwrap_err().contains("\"Team\" is not a namespace"));
        assert!(w(&[("a=2,b", 2)]).unwrap_err().contains("not a namespace"));
        assert!(w(&[("", 2)]).unwrap_err().contains("not a namespace"));
        let many: Vec<(String, u32)> =
            (0..=MAX_WEIGHTED_NAMESPACES).map(|i| (format!("n{i}"), 2)).collect();
        let many: Vec<(&str, u32)> = many.iter().map(|(n, w)| (n.as_str(), *w)).collect();
        assert!(w(&many).unwrap_err().contains("at most 10000"));
    }

    #[test]
    fn gate_events_table() {
        let keys = [("spam_key", "s"), ("aggregate_key", "a"), ("event_key", "e")];
        assert!(api_tokens("", 1, 20.0, 30).is_ok() && api_tokens("team-a", 100, 0.5, 1).is_ok());
        assert!(api_tokens("Team", 1, 20.0, 30).unwrap_err().contains("namespace"));
        assert!(api_tokens("a/b", 1, 20.0, 30).unwrap_err().contains("namespace"));
        assert!(api_tokens("a", 0, 20.0, 30).unwrap_err().contains("want"));
        assert!(api_tokens("a", 101, 20.0, 30).unwrap_err().contains("want"));
        assert!(api_tokens("a", 1, 0.0, 30).unwrap_err().contains("qps"));
        assert!(api_tokens("a", 1, f64::NAN, 30).unwrap_err().contains("qps"));
        assert!(api_tokens("a", 1, 1e9, 30).unwrap_err().contains("qps"));
        assert!(api_tokens("a", 1, 20.0, 0).unwrap_err().contains("burst"));
        assert!(gate_batch(MAX_GATE_EVENTS).is_ok() && gate_batch(0).is_ok());
        assert!(gate_batch(MAX_GATE_EVENTS + 1).unwrap_err().contains("limit is 256"));
        assert!(gate_event(0, "ns/pi", keys, "m").is_ok());
        assert!(
            gate_event(3, "nslash", keys, "m").unwrap_err().starts_with("events[3].object_key")
        );
        let no_spam = [("spam_key", ""), keys[1], keys[2]];
        assert_eq!(
            gate_event(1, "ns/pi", no_spam, "m").unwrap_err(),
            "events[1].spam_key is required"
        );
        let long = "k".repeat(MAX_EVENT_KEY_BYTES + 1);
        let long_key = [keys[0], keys[1], ("event_key", long.as_str())];
        assert!(gate_event(0, "ns/pi", long_key, "m").unwrap_err().contains("event_key is 5121"));
        let long_msg = "m".repeat(MAX_EVENT_MESSAGE_BYTES + 1);
        assert!(gate_event(0, "ns/pi", keys, &long_msg).unwrap_err().contains("message is 4097"));
    }
}
