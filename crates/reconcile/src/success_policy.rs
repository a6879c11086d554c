//! Evaluating `spec.successPolicy` over succeeded indexes (upstream `success_policy.go`).

use k8s_openapi::api::batch::v1::SuccessPolicy;

use crate::indexes::OrderedIntervals;

/// Reason of the SuccessCriteriaMet / Complete conditions set by a success policy.
pub const SUCCESS_POLICY_REASON: &str = "SuccessPolicy";

/// Evaluates the rules in order and returns the message of the first match, "Matched rules at
/// index <i>"; `None` without a policy or without any succeeded index. A rule's
/// `succeededIndexes` is parsed against `completions`; a rule whose indexes parse to nothing is
/// skipped (upstream `matchSuccessPolicy`).
pub fn match_success_policy(
    policy: Option<&SuccessPolicy>,
    completions: i32,
    succeeded: &OrderedIntervals,
) -> Option<String> {
    let policy = policy?;
    if succeeded.is_empty() {
        return None;
    }
    policy.rules.iter().enumerate().find_map(|(index, rule)| {
        let matched = match rule.succeeded_indexes.as_deref() {
            Some(s) => {
                let required = OrderedIntervals::parse(s, completions);
                !required.is_empty()
                    && succeeded_indexes_rule_matches(&required, succeeded, rule.succeeded_count)
            }
            None => rule.succeeded_count.is_some_and(|c| succeeded.total() >= c.max(0) as usize),
        };
        matched.then(|| format!("Matched rules at index {index}"))
    })
}

/// All of `required` succeeded, or at least `count` of them did; linear in both interval lists
/// (upstream `matchSucceededIndexesRule`).
pub fn succeeded_indexes_rule_matches(
    required: &OrderedIntervals,
    succeeded: &OrderedIntervals,
    count: Option<i32>,
) -> bool {
    let (r, s) = (required.intervals(), succeeded.intervals());
    let (mut i, mut j) = (0, 0);
    let mut contained: usize = 0;
    while i < r.len() && j < s.len() {
        let overlap =
            i64::from(r[i].last.min(s[j].last)) - i64::from(r[i].first.max(s[j].first)) + 1;
        if overlap > 0 {
            contained += overlap as usize;
        }
        match s[j].last.cmp(&r[i].last) {
            std::cmp::Ordering::Less => j += 1,
            std::cmp::Ordering::Greater => i += 1,
            std::cmp::Ordering::Equal => {
                i += 1;
                j += 1;
            }
        }
    }
    contained == required.total() || count.is_some_and(|c| contained >= c.max(0) as usize)
}

#[cfg(test)]
#[allow(clippy::type_complexity)] // Table rows are spelled out as tuples on purpose.
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::SuccessPolicyRule;

    fn policy(rules: &[(Option<&str>, Option<i32>)]) -> SuccessPolicy {
        SuccessPolicy {
            rules: rules
                .iter()
                .map(|(i, c)| SuccessPolicyRule {
                    succeeded_indexes: i.map(str::to_string),
                    succeeded_count: *c,
                })
                .collect(),
        }
    }

    /// Re-derived from upstream's TestMatchSuccessPolicy.
    #[test]
    fn match_table() {
        let cases: &[(&str, &[(Option<&str>, Option<i32>)], i32, &str, Option<&str>)] = &[
            ("no succeeded indexes", &[(None, Some(1))], 10, "", None),
            (
                "count only, reached",
                &[(None, Some(2))],
                10,
                "0,5",
                Some("Matched rules at index 0"),
            ),
            ("count only, not reached", &[(None, Some(3))], 10, "0,5", None),
            (
                "all listed indexes succeeded",
                &[(Some("0-2,5"), None)],
                10,
                "0-5",
                Some("Matched rules at index 0"),
            ),
            ("one listed index missing", &[(Some("0-2,5"), None)], 10, "0-4", None),
            (
                "count within listed indexes",
                &[(Some("0-5"), Some(3))],
                10,
                "1,3,5,7,9",
                Some("Matched rules at index 0"),
            ),
            (
                "count within listed indexes, short",
                &[(Some("0-5"), Some(4))],
                10,
                "1,3,5,7,9",
                None,
            ),
            (
                "second rule matches",
                &[(Some("7"), None), (Some("1,3"), None)],
                10,
                "1,3",
                Some("Matched rules at index 1"),
            ),
            (
                "unparsable indexes skipped",
                &[(Some("x"), None), (None, Some(1))],
                10,
                "2",
                Some("Matched rules at index 1"),
            ),
            (
                "listed indexes beyond completions dropped",
                &[(Some("0,8-9"), None)],
                5,
                "0",
                Some("Matched rules at index 0"),
            ),
            (
                "indexes clamped to completions",
                &[(Some("3-9"), None)],
                5,
                "3,4",
                Some("Matched rules at index 0"),
            ),
            ("rule with nothing set never matches", &[(None, None)], 5, "0-4", None),
        ];
        for (name, rules, completions, succ, want) in cases {
            let succ = OrderedIntervals::parse(succ, *completions);
            let got = match_success_policy(Some(&policy(rules)), *completions, &succ);
            assert_eq!(got.as_deref(), *want, "{name}");
        }
        assert_eq!(match_success_policy(None, 3, &OrderedIntervals::parse("0-2", 3)), None);
    }

    #[test]
    fn rule_overlap_counting() {
        let p = |s: &str| OrderedIntervals::parse(s, 1000);
        assert!(succeeded_indexes_rule_matches(&p("10-20,30"), &p("0-100"), None));
        assert!(!succeeded_indexes_rule_matches(&p("10-20,30"), &p("0-29"), None));
        assert!(succeeded_indexes_rule_matches(&p("10-20,30"), &p("0-29"), Some(11)));
        assert!(!succeeded_indexes_rule_matches(&p("10-20,30"), &p("0-29"), Some(12)));
        // 1 and 5 succeeded, 3 did not.
        assert!(succeeded_indexes_rule_matches(&p("1,3,5"), &p("0-2,4-6"), Some(2)));
        assert!(!succeeded_indexes_rule_matches(&p("1,3,5"), &p("0-2,4-6"), Some(3)));
    }
}
