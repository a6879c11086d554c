//! What an example Job is expected to end as, and what it did end as.
//!
//! Each example carries `kjob.io/demo-expect: Complete` or `Failed:<Reason>` (optionally
//! `Complete:<Reason>`); the demo compares it with the Job's terminal condition.

use k8s_openapi::api::batch::v1::Job;

/// Annotation naming the terminal condition an example Job must reach.
pub const EXPECT_ANNOTATION: &str = "kjob.io/demo-expect";
/// Annotation asking the demo to resume a suspended Job after a delay (e.g. `5s`).
pub const RESUME_AFTER_ANNOTATION: &str = "kjob.io/demo-resume-after";

/// Annotation asking the demo to make the first pod of the Job exit with this code (it sets
/// [`SIM_EXIT_CODE_ANNOTATION`] on that pod while it runs), e.g. to show a podFailurePolicy
/// `Ignore` rule at work.
pub const FIRST_POD_EXIT_CODE_ANNOTATION: &str = "kjob.io/demo-first-pod-exit-code";
/// The simulated kubelet's per-pod exit code annotation (kjob-sim's
/// `kubelet::stages::EXIT_CODE_ANNOTATION`); read when the containers exit.
pub const SIM_EXIT_CODE_ANNOTATION: &str = "kjob.io/sim-exit-code";

/// Errors reading an expectation.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ExpectError {
    /// The annotation is not `Complete[:Reason]` or `Failed[:Reason]`.
    #[error("{EXPECT_ANNOTATION} value {0:?} is not Complete[:Reason] or Failed[:Reason]")]
    Invalid(String),
}

/// The two terminal condition types of a Job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Terminal {
    /// `Complete=True`.
    Complete,
    /// `Failed=True`.
    Failed,
}

impl std::fmt::Display for Terminal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Terminal::Complete => "Complete",
            Terminal::Failed => "Failed",
        })
    }
}

/// An expected (or observed) terminal state: condition type and, optionally, its reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expectation {
    /// The condition type.
    pub terminal: Terminal,
    /// The condition reason; `None` accepts any reason.
    pub reason: Option<String>,
}

impl Expectation {
    /// Parses `Complete`, `Complete:CompletionsReached`, `Failed:BackoffLimitExceeded`, ...
    pub fn parse(s: &str) -> Result<Self, ExpectError> {
        let s = s.trim();
        let (kind, reason) = match s.split_once(':') {
            Some((k, r)) => (k.trim(), Some(r.trim())),
            None => (s, None),
        };
        let terminal = match kind {
            "Complete" => Terminal::Complete,
            "Failed" => Terminal::Failed,
            _ => return Err(ExpectError::Invalid(s.to_string())),
        };
        match reason {
            Some("") => Err(ExpectError::Invalid(s.to_string())),
            r => Ok(Self { terminal, reason: r.map(str::to_string) }),
        }
    }

    /// Whether an observed outcome satisfies this expectation.
    pub fn matches(&self, outcome: &Expectation) -> bool {
        self.terminal == outcome.terminal
            && self.reason.as_ref().is_none_or(|want| outcome.reason.as_ref() == Some(want))
    }
}

impl std::fmt::Display for Expectation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.reason {
            Some(r) => write!(f, "{}:{r}", self.terminal),
            None => write!(f, "{}", self.terminal),
        }
    }
}

/// The Job's terminal state, if it is finished (`Complete=True` or `Failed=True`, as upstream's
/// `IsJobFinished`).
pub fn outcome(job: &Job) -> Option<Expectation> {
    let conditions = job.status.as_ref()?.conditions.as_ref()?;
    conditions.iter().filter(|c| c.status == "True").find_map(|c| {
        let terminal = match c.type_.as_str() {
            "Complete" => Terminal::Complete,
            "Failed" => Terminal::Failed,
            _ => return None,
        };
        Some(Expectation { terminal, reason: c.reason.clone().filter(|r| !r.is_empty()) })
    })
}

/// The expectation an example Job declares, if any.
pub fn declared(job: &Job) -> Option<Result<Expectation, ExpectError>> {
    job.metadata.annotations.as_ref()?.get(EXPECT_ANNOTATION).map(|v| Expectation::parse(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::job_with_conditions;

    #[test]
    fn parse_table() {
        let c = |t, r: Option<&str>| Ok(Expectation { terminal: t, reason: r.map(String::from) });
        assert_eq!(Expectation::parse("Complete"), c(Terminal::Complete, None));
        assert_eq!(
            Expectation::parse(" Failed:BackoffLimitExceeded "),
            c(Terminal::Failed, Some("BackoffLimitExceeded"))
        );
        assert_eq!(
            Expectation::parse("Complete:CompletionsReached"),
            c(Terminal::Complete, Some("CompletionsReached"))
        );
        for bad in ["", "Done", "Failed:", "complete", "Suspended:JobSuspended"] {
            assert!(Expectation::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn matching_respects_type_and_optional_reason() {
        let e = |s| Expectation::parse(s).unwrap();
        assert!(e("Complete").matches(&e("Complete:CompletionsReached")));
        assert!(e("Failed:DeadlineExceeded").matches(&e("Failed:DeadlineExceeded")));
        assert!(!e("Failed:DeadlineExceeded").matches(&e("Failed:BackoffLimitExceeded")));
        assert!(!e("Failed:DeadlineExceeded").matches(&e("Failed")));
        assert!(!e("Complete").matches(&e("Failed:BackoffLimitExceeded")));
        assert_eq!(e("Failed:PodFailurePolicy").to_string(), "Failed:PodFailurePolicy");
    }

    #[test]
    fn outcome_reads_only_true_terminal_conditions() {
        let j = job_with_conditions(&[("FailureTarget", "True", "BackoffLimitExceeded")]);
        assert_eq!(outcome(&j), None, "FailureTarget alone is not finished");
        let j = job_with_conditions(&[("Complete", "False", "")]);
        assert_eq!(outcome(&j), None);
        let j = job_with_conditions(&[
            ("FailureTarget", "True", "DeadlineExceeded"),
            ("Failed", "True", "DeadlineExceeded"),
        ]);
        assert_eq!(outcome(&j), Some(Expectation::parse("Failed:DeadlineExceeded").unwrap()));
        let j = job_with_conditions(&[("Complete", "True", "")]);
        assert_eq!(outcome(&j), Some(Expectation::parse("Complete").unwrap()));
    }
}
