//! Reads counters out of Prometheus/OpenMetrics text (kjob-sim's and the workers' `/metrics`).

use std::collections::BTreeMap;

/// One sample: its labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Label name → value.
    pub labels: BTreeMap<String, String>,
    /// The sample's value.
    pub value: f64,
}

/// Every sample of the metric called exactly `name` (e.g. `kjob_sim_apiserver_requests_total`).
pub fn samples(text: &str, name: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (labels, value) = if let Some(inner) = rest.strip_prefix('{') {
                let end = inner.rfind('}')?;
                (parse_labels(&inner[..end]), inner[end + 1..].trim())
            } else if rest.starts_with(' ') {
                (BTreeMap::new(), rest.trim())
            } else {
                // A longer metric name sharing the prefix.
                return None;
            };
            // OpenMetrics may append a timestamp or exemplar after the value.
            let value = value.split_whitespace().next()?.parse().ok()?;
            Some(Sample { labels, value })
        })
        .collect()
}

/// Sums the samples of `name` grouped by the values of `keys` (missing labels group as "").
pub fn sum_by(text: &str, name: &str, keys: &[&str]) -> BTreeMap<Vec<String>, f64> {
    let mut out = BTreeMap::new();
    for s in samples(text, name) {
        let group =
            keys.iter().map(|k| s.labels.get(*k).cloned().unwrap_or_default()).collect::<Vec<_>>();
        *out.entry(group).or_insert(0.0) += s.value;
    }
    out
}

/// The sum of every sample of `name`.
pub fn total(text: &str, name: &str) -> f64 {
    samples(text, name).iter().map(|s| s.value).sum()
}

/// Parses `a="x",b="y"` (with `\"`, `\\` and `\n` escapes in values).
fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() || chars.next() != Some('"') {
            return out;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => break,
                },
                other => value.push(other),
            }
        }
        out.insert(key.trim().to_string(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP kjob_sim_apiserver_requests API requests by verb, resource and HTTP code.
# TYPE kjob_sim_apiserver_requests counter
kjob_sim_apiserver_requests_total{verb="create",resource="pods",code="201"} 120
kjob_sim_apiserver_requests_total{verb="create",resource="pods",code="409"} 3
kjob_sim_apiserver_requests_total{verb="get",resource="jobs.batch",code="200"} 40
kjob_sim_apiserver_requests_total_extra{verb="get"} 9
kjob_worker_events_dropped_total 2
weird{msg="a \"q\", b\\c"} 1.5 1700000000
# EOF
"#;

    #[test]
    fn sums_by_label_and_ignores_prefix_twins() {
        let m = sum_by(TEXT, "kjob_sim_apiserver_requests_total", &["verb", "resource"]);
        assert_eq!(m.get(&vec!["create".to_string(), "pods".to_string()]), Some(&123.0));
        assert_eq!(m.get(&vec!["get".to_string(), "jobs.batch".to_string()]), Some(&40.0));
        assert_eq!(m.len(), 2);
        assert_eq!(total(TEXT, "kjob_sim_apiserver_requests_total"), 163.0);
        assert_eq!(total(TEXT, "kjob_worker_events_dropped_total"), 2.0);
        assert_eq!(total(TEXT, "absent"), 0.0);
    }

    #[test]
    fn escaped_label_values_and_timestamps() {
        let s = samples(TEXT, "weird");
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].labels["msg"], "a \"q\", b\\c");
        assert_eq!(s[0].value, 1.5);
    }
}
