//! Matching a failed pod against `spec.podFailurePolicy` (upstream `pod_failure_policy.go`).

use k8s_openapi::api::batch::v1::{
    Job, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement,
    PodFailurePolicyOnPodConditionsPattern,
};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodCondition};

use crate::pod::is_pod_failed;

/// A pod-failure-policy rule action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PodFailurePolicyAction {
    /// Fail the whole Job at once.
    FailJob,
    /// Fail the pod's index (backoffLimitPerIndex).
    FailIndex,
    /// Do not count the failure against any limit.
    Ignore,
    /// Count the failure normally.
    Count,
}

impl PodFailurePolicyAction {
    /// Parses the API value; unknown values yield `None` (such rules never match, as upstream).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "FailJob" => Some(Self::FailJob),
            "FailIndex" => Some(Self::FailIndex),
            "Ignore" => Some(Self::Ignore),
            "Count" => Some(Self::Count),
            _ => None,
        }
    }

    /// The API value, also the `action` label of `job_controller_pod_failures_handled_by_failure_policy_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FailJob => "FailJob",
            Self::FailIndex => "FailIndex",
            Self::Ignore => "Ignore",
            Self::Count => "Count",
        }
    }
}

/// Outcome of matching one failed pod (upstream's `(*string, bool, *action)` triple).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyMatch {
    /// The matched rule's action; `None` when no rule matched (or there is no policy).
    pub action: Option<PodFailurePolicyAction>,
    /// Whether the failure counts towards backoffLimit / the index failure count (false only for Ignore).
    pub count_failed: bool,
    /// The Job failure message, set when a FailJob rule matched.
    pub job_failure_message: Option<String>,
}

impl PolicyMatch {
    const NO_MATCH: PolicyMatch =
        PolicyMatch { action: None, count_failed: true, job_failure_message: None };
}

/// Matches a failed pod against the policy: the first rule (in order) that matches wins; rules
/// with an unknown action are skipped (upstream `matchPodFailurePolicy`). FailJob messages are
/// exactly upstream's: "Container <c> for pod <ns>/<pod> failed with exit code <n> matching
/// FailJob rule at index <i>" and "Pod <ns>/<pod> has condition <type> matching FailJob rule at
/// index <i>".
pub fn match_pod_failure_policy(policy: Option<&PodFailurePolicy>, pod: &Pod) -> PolicyMatch {
    let Some(policy) = policy else { return PolicyMatch::NO_MATCH };
    let ns = pod.metadata.namespace.as_deref().unwrap_or("");
    let name = pod.metadata.name.as_deref().unwrap_or("");
    for (index, rule) in policy.rules.iter().enumerate() {
        let Some(action) = PodFailurePolicyAction::parse(&rule.action) else { continue };
        let message = if let Some(req) = rule.on_exit_codes.as_ref() {
            let Some((container, exit_code)) = match_on_exit_codes(pod, req) else { continue };
            format!(
                "Container {container} for pod {ns}/{name} failed with exit code {exit_code} matching {} rule at index {index}",
                action.as_str()
            )
        } else if let Some(patterns) = rule.on_pod_conditions.as_ref() {
            let Some(cond) = match_on_pod_conditions(pod, patterns) else { continue };
            format!(
                "Pod {ns}/{name} has condition {} matching {} rule at index {index}",
                cond.type_,
                action.as_str()
            )
        } else {
            continue;
        };
        return PolicyMatch {
            action: Some(action),
            count_failed: action != PodFailurePolicyAction::Ignore,
            job_failure_message: (action == PodFailurePolicyAction::FailJob).then_some(message),
        };
    }
    PolicyMatch::NO_MATCH
}

/// The first terminated container (regular containers first, then init containers) with a
/// non-zero exit code satisfying the requirement: `(name, exit code)` (upstream `matchOnExitCodes`).
fn match_on_exit_codes<'a>(
    pod: &'a Pod,
    req: &PodFailurePolicyOnExitCodesRequirement,
) -> Option<(&'a str, i32)> {
    let status = pod.status.as_ref()?;
    let regular = status.container_statuses.as_deref().unwrap_or(&[]);
    let init = status.init_container_statuses.as_deref().unwrap_or(&[]);
    matching_container(regular, req).or_else(|| matching_container(init, req))
}

fn matching_container<'a>(
    statuses: &'a [ContainerStatus],
    req: &PodFailurePolicyOnExitCodesRequirement,
) -> Option<(&'a str, i32)> {
    statuses.iter().find_map(|cs| {
        // A container still terminating has no exit code to match.
        let term = cs.state.as_ref()?.terminated.as_ref()?;
        if req.container_name.as_deref().is_some_and(|n| n != cs.name) {
            return None;
        }
        // Exit code 0 is success and never matches, whatever the operator.
        (term.exit_code != 0 && operator_matches(term.exit_code, req))
            .then_some((cs.name.as_str(), term.exit_code))
    })
}

fn operator_matches(exit_code: i32, req: &PodFailurePolicyOnExitCodesRequirement) -> bool {
    match req.operator.as_str() {
        "In" => req.values.contains(&exit_code),
        "NotIn" => !req.values.contains(&exit_code),
        _ => false,
    }
}

/// The first pod condition (in the pod's order) equal in type and status to any pattern; a
/// pattern without status means "True", the API default (upstream `matchOnPodConditions`).
fn match_on_pod_conditions<'a>(
    pod: &'a Pod,
    patterns: &[PodFailurePolicyOnPodConditionsPattern],
) -> Option<&'a PodCondition> {
    let conds = pod.status.as_ref()?.conditions.as_deref()?;
    conds.iter().find(|c| {
        patterns
            .iter()
            .any(|p| p.type_ == c.type_ && p.status.as_deref().unwrap_or("True") == c.status)
    })
}

/// The FailJob message of the first failed pod that matches a FailJob rule, if any (upstream
/// `getFailJobMessage`).
pub fn fail_job_message<'a>(job: &Job, pods: impl IntoIterator<Item = &'a Pod>) -> Option<String> {
    let policy = job.spec.as_ref()?.pod_failure_policy.as_ref()?;
    pods.into_iter()
        .filter(|p| is_pod_failed(p, job))
        .find_map(|p| match_pod_failure_policy(Some(policy), p).job_failure_message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{at, condition_rule, exit_code_rule, mk_job, mk_pod};
    use PodFailurePolicyAction::*;

    fn policy(rules: Vec<k8s_openapi::api::batch::v1::PodFailurePolicyRule>) -> PodFailurePolicy {
        PodFailurePolicy { rules }
    }

    /// Re-derived from upstream's TestMatchPodFailurePolicy.
    #[test]
    fn match_table() {
        let job = mk_job("j").build();
        let failed = |code: i32| mk_pod(&job, "p").failed(code, at(1)).build();
        let ns_pod = "default/p";
        struct Case {
            name: &'static str,
            rules: Vec<k8s_openapi::api::batch::v1::PodFailurePolicyRule>,
            pod: Pod,
            want: (Option<PodFailurePolicyAction>, bool, Option<String>),
        }
        let cases = vec![
            Case { name: "no rules", rules: vec![], pod: failed(1), want: (None, true, None) },
            Case {
                name: "ignore on exit code In",
                rules: vec![exit_code_rule("Ignore", None, "In", &[1, 2, 3])],
                pod: failed(2),
                want: (Some(Ignore), false, None),
            },
            Case {
                name: "count on exit code NotIn",
                rules: vec![exit_code_rule("Count", None, "NotIn", &[1, 2, 3])],
                pod: failed(42),
                want: (Some(Count), true, None),
            },
            Case {
                name: "NotIn does not match a listed code",
                rules: vec![exit_code_rule("FailJob", None, "NotIn", &[42])],
                pod: failed(42),
                want: (None, true, None),
            },
            Case {
                name: "fail job on exit code",
                rules: vec![exit_code_rule("FailJob", None, "In", &[5])],
                pod: failed(5),
                want: (
                    Some(FailJob),
                    true,
                    Some(format!(
                        "Container main for pod {ns_pod} failed with exit code 5 matching FailJob rule at index 0"
                    )),
                ),
            },
            Case {
                name: "exit code 0 never matches, even with NotIn",
                rules: vec![exit_code_rule("FailJob", None, "NotIn", &[1])],
                pod: mk_pod(&job, "p").failed(0, at(1)).build(),
                want: (None, true, None),
            },
            Case {
                name: "first matching rule wins",
                rules: vec![
                    exit_code_rule("Ignore", None, "In", &[9]),
                    exit_code_rule("FailIndex", None, "In", &[3]),
                    exit_code_rule("FailJob", None, "In", &[3]),
                ],
                pod: failed(3),
                want: (Some(FailIndex), true, None),
            },
            Case {
                name: "container name restricts",
                rules: vec![
                    exit_code_rule("FailJob", Some("other"), "In", &[3]),
                    exit_code_rule("Ignore", Some("main"), "In", &[3]),
                ],
                pod: failed(3),
                want: (Some(Ignore), false, None),
            },
            Case {
                name: "init container matched after regular ones",
                rules: vec![exit_code_rule("FailJob", None, "In", &[7])],
                pod: mk_pod(&job, "p").phase("Failed").init_terminated("setup", 7, at(1)).build(),
                want: (
                    Some(FailJob),
                    true,
                    Some(format!(
                        "Container setup for pod {ns_pod} failed with exit code 7 matching FailJob rule at index 0"
                    )),
                ),
            },
            Case {
                name: "running container has no exit code",
                rules: vec![exit_code_rule("FailJob", None, "NotIn", &[0])],
                pod: mk_pod(&job, "p").phase("Failed").build(),
                want: (None, true, None),
            },
            Case {
                name: "pod condition FailJob",
                rules: vec![
                    exit_code_rule("Count", None, "In", &[9]),
                    condition_rule("FailJob", &[("DisruptionTarget", "True")]),
                ],
                pod: failed(1).into_builder().condition("DisruptionTarget", "True", at(1)).build(),
                want: (
                    Some(FailJob),
                    true,
                    Some(format!(
                        "Pod {ns_pod} has condition DisruptionTarget matching FailJob rule at index 1"
                    )),
                ),
            },
            Case {
                name: "pod condition status must match",
                rules: vec![condition_rule("Ignore", &[("DisruptionTarget", "True")])],
                pod: failed(1).into_builder().condition("DisruptionTarget", "False", at(1)).build(),
                want: (None, true, None),
            },
            Case {
                name: "unknown action skipped",
                rules: vec![
                    exit_code_rule("Explode", None, "In", &[1]),
                    exit_code_rule("Count", None, "In", &[1]),
                ],
                pod: failed(1),
                want: (Some(Count), true, None),
            },
            Case {
                name: "unknown operator never matches",
                rules: vec![exit_code_rule("FailJob", None, "Maybe", &[1])],
                pod: failed(1),
                want: (None, true, None),
            },
        ];
        for c in cases {
            let got = match_pod_failure_policy(Some(&policy(c.rules)), &c.pod);
            assert_eq!(
                (got.action, got.count_failed, got.job_failure_message),
                c.want,
                "{}",
                c.name
            );
        }
        assert_eq!(match_pod_failure_policy(None, &failed(1)), PolicyMatch::NO_MATCH);
    }

    #[test]
    fn fail_job_message_from_pods() {
        let job = mk_job("j")
            .pod_failure_policy(vec![exit_code_rule("FailJob", None, "In", &[3])])
            .build();
        let running = mk_pod(&job, "a").build();
        let other = mk_pod(&job, "b").failed(1, at(1)).build();
        let hit = mk_pod(&job, "c").failed(3, at(1)).build();
        assert_eq!(fail_job_message(&job, [&running, &other]), None);
        assert_eq!(
            fail_job_message(&job, [&running, &other, &hit]).as_deref(),
            Some(
                "Container main for pod default/c failed with exit code 3 matching FailJob rule at index 0"
            )
        );
        assert_eq!(fail_job_message(&mk_job("j").build(), [&hit]), None);
    }

    trait IntoBuilder {
        fn into_builder(self) -> crate::testutil::PodBuilder;
    }
    impl IntoBuilder for Pod {
        fn into_builder(self) -> crate::testutil::PodBuilder {
            crate::testutil::PodBuilder(self)
        }
    }
}
