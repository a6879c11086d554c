//! kube-apiserver's own counters, read out of its `/metrics` text: requests by verb and
//! resource (`apiserver_request_total`), bytes of responses (`apiserver_response_sizes_sum`)
//! and of watch events (`apiserver_watch_events_sizes_sum`), and the watches it closed because
//! their client read too slowly (`apiserver_terminated_watchers_total`).

use std::collections::BTreeMap;

use crate::promtext;

/// Requests counted by kube-apiserver, by verb and resource.
pub const REQUESTS: &str = "apiserver_request_total";
/// Sum of the bytes of every response kube-apiserver sent (a histogram's `_sum`).
pub const RESPONSE_BYTES: &str = "apiserver_response_sizes_sum";
/// Sum of the bytes of every watch event kube-apiserver sent (a histogram's `_sum`).
pub const WATCH_EVENT_BYTES: &str = "apiserver_watch_events_sizes_sum";
/// Watches kube-apiserver's watch cache closed because their client did not take events fast
/// enough (the client then re-watches, and misses nothing only if it resumes in time).
pub const TERMINATED_WATCHERS: &str = "apiserver_terminated_watchers_total";

/// The counters of one scrape (or the difference of two).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counters {
    /// `(verb, resource)` → requests; the resource carries its subresource (`pods/status`);
    /// requests without a resource (`/metrics`, `/readyz`) are left out.
    pub requests: BTreeMap<(String, String), f64>,
    /// Bytes of responses, watches left out: kube-apiserver records a watch's whole stream as
    /// its response once the watch ends (a watch it closed as too slow, or one at the end of a
    /// run), and every byte of that stream is already in [`Counters::watch_event_bytes`].
    pub response_bytes: f64,
    /// Bytes of responses by `(verb, resource)` as [`Counters::requests`] keys them; `WATCH`
    /// keys hold the streams of the watches that ended (not in [`Counters::response_bytes`]).
    pub response_bytes_by: BTreeMap<(String, String), f64>,
    /// Bytes of watch events.
    pub watch_event_bytes: f64,
    /// Watches closed as unresponsive.
    pub terminated_watchers: f64,
}

impl Counters {
    /// Parses the text of kube-apiserver's `/metrics`.
    pub fn parse(text: &str) -> Self {
        let response_bytes_by = by_request(text, RESPONSE_BYTES);
        let watches: f64 =
            response_bytes_by.iter().filter(|((verb, _), _)| verb == "WATCH").map(|(_, b)| b).sum();
        Self {
            requests: by_request(text, REQUESTS),
            response_bytes: (promtext::total(text, RESPONSE_BYTES) - watches).max(0.0),
            response_bytes_by,
            watch_event_bytes: promtext::total(text, WATCH_EVENT_BYTES),
            terminated_watchers: promtext::total(text, TERMINATED_WATCHERS),
        }
    }

    /// What grew from `before` to `self` (a counter that went down counts 0).
    pub fn since(&self, before: &Counters) -> Counters {
        Counters {
            requests: grown(&self.requests, &before.requests),
            response_bytes: (self.response_bytes - before.response_bytes).max(0.0),
            response_bytes_by: grown(&self.response_bytes_by, &before.response_bytes_by),
            watch_event_bytes: (self.watch_event_bytes - before.watch_event_bytes).max(0.0),
            terminated_watchers: (self.terminated_watchers - before.terminated_watchers).max(0.0),
        }
    }

    /// Bytes sent: responses plus watch events.
    pub fn bytes_sent(&self) -> f64 {
        self.response_bytes + self.watch_event_bytes
    }

    /// Every request counted.
    pub fn total_requests(&self) -> f64 {
        self.requests.values().sum()
    }

    /// Adds `other` into `self`.
    pub fn add(&mut self, other: &Counters) {
        for (mine, theirs) in [
            (&mut self.requests, &other.requests),
            (&mut self.response_bytes_by, &other.response_bytes_by),
        ] {
            for (k, v) in theirs {
                *mine.entry(k.clone()).or_insert(0.0) += v;
            }
        }
        self.response_bytes += other.response_bytes;
        self.watch_event_bytes += other.watch_event_bytes;
        self.terminated_watchers += other.terminated_watchers;
    }
}

/// The samples of `name` summed by `(verb, resource)`, the resource with its subresource
/// (`pods/status`); samples without a resource (`/metrics`, `/readyz`) are left out.
fn by_request(text: &str, name: &str) -> BTreeMap<(String, String), f64> {
    let mut out = BTreeMap::new();
    for s in promtext::samples(text, name) {
        let resource = s.labels.get("resource").cloned().unwrap_or_default();
        if resource.is_empty() {
            continue;
        }
        let resource = match s.labels.get("subresource").filter(|r| !r.is_empty()) {
            Some(sub) => format!("{resource}/{sub}"),
            None => resource,
        };
        let verb = s.labels.get("verb").cloned().unwrap_or_default();
        *out.entry((verb, resource)).or_insert(0.0) += s.value;
    }
    out
}

/// What grew from `before` to `now`, key by key; keys that did not grow drop out.
fn grown(
    now: &BTreeMap<(String, String), f64>,
    before: &BTreeMap<(String, String), f64>,
) -> BTreeMap<(String, String), f64> {
    now.iter()
        .filter_map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0.0);
            (d > 0.0).then(|| (k.clone(), d))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = r#"# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 10
apiserver_request_total{code="200",component="apiserver",dry_run="",group="batch",resource="jobs",scope="resource",subresource="status",verb="PUT",version="v1"} 4
apiserver_request_total{code="200",component="",dry_run="",group="",resource="",scope="",subresource="/readyz",verb="GET",version=""} 7
apiserver_response_sizes_bucket{component="apiserver",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1",le="1000"} 3
apiserver_response_sizes_sum{component="apiserver",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 25000
apiserver_response_sizes_count{component="apiserver",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 10
apiserver_watch_events_sizes_sum{group="",resource="pods",version="v1"} 1000
apiserver_watch_events_sizes_sum{group="batch",resource="jobs",version="v1"} 500.5
apiserver_terminated_watchers_total{group="",resource="pods",version="v1"} 1
"#;

    const AFTER: &str = r#"apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 30
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="batch",resource="jobs",scope="resource",subresource="status",verb="PUT",version="v1"} 4
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="LIST",version="v1"} 5
apiserver_response_sizes_sum{component="apiserver",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 75000
apiserver_response_sizes_sum{component="apiserver",group="",resource="pods",scope="namespace",subresource="",verb="LIST",version="v1"} 4000
apiserver_response_sizes_sum{component="apiserver",group="",resource="pods",scope="cluster",subresource="",verb="WATCH",version="v1"} 1800
apiserver_watch_events_sizes_sum{group="",resource="pods",version="v1"} 3000
apiserver_watch_events_sizes_sum{group="batch",resource="jobs",version="v1"} 500.5
apiserver_terminated_watchers_total{group="",resource="pods",version="v1"} 4
apiserver_terminated_watchers_total{group="batch",resource="jobs",version="v1"} 2
"#;

    #[test]
    fn parses_requests_by_verb_and_resource_and_bytes() {
        let c = Counters::parse(BEFORE);
        let key = |v: &str, r: &str| (v.to_string(), r.to_string());
        assert_eq!(c.requests.get(&key("POST", "pods")), Some(&10.0));
        assert_eq!(c.requests.get(&key("PUT", "jobs/status")), Some(&4.0));
        // Non-resource requests and buckets/counts of histograms are not counted.
        assert_eq!(c.requests.len(), 2);
        assert_eq!(c.response_bytes, 25_000.0);
        assert_eq!(c.response_bytes_by.get(&key("POST", "pods")), Some(&25_000.0));
        assert_eq!(c.response_bytes_by.len(), 1);
        assert_eq!(c.watch_event_bytes, 1500.5);
    }

    #[test]
    fn difference_of_two_scrapes() {
        let d = Counters::parse(AFTER).since(&Counters::parse(BEFORE));
        let key = |v: &str, r: &str| (v.to_string(), r.to_string());
        // Codes are summed: 20 more 201s and 2 new 409s.
        assert_eq!(d.requests.get(&key("POST", "pods")), Some(&22.0));
        assert_eq!(d.requests.get(&key("LIST", "pods")), Some(&5.0));
        // Unchanged counters drop out.
        assert_eq!(d.requests.get(&key("PUT", "jobs/status")), None);
        assert_eq!(d.response_bytes, 54_000.0);
        assert_eq!(d.response_bytes_by.get(&key("POST", "pods")), Some(&50_000.0));
        assert_eq!(d.response_bytes_by.get(&key("LIST", "pods")), Some(&4_000.0));
        assert_eq!(d.watch_event_bytes, 2000.0);
        // A watch that ended: its stream is listed by request, but its bytes are its events,
        // already counted, so bytes sent leave it out.
        assert_eq!(d.response_bytes_by.get(&key("WATCH", "pods")), Some(&1_800.0));
        assert_eq!(d.bytes_sent(), 56_000.0);
        // Watches closed as too slow, over every resource: 3 more of pods, 2 new of jobs.
        assert_eq!(d.terminated_watchers, 5.0);
        assert_eq!(d.total_requests(), 27.0);
        let mut sum = d.clone();
        sum.add(&d);
        assert_eq!(sum.total_requests(), 54.0);
        // A restarted server (counters went down) never yields negative figures.
        let back = Counters::parse(BEFORE).since(&Counters::parse(AFTER));
        assert_eq!(back.response_bytes, 0.0);
        assert!(back.requests.is_empty());
    }
}
