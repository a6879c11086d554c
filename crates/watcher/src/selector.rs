//! Evaluation of `metav1.LabelSelector` (matchLabels + matchExpressions), as
//! `metav1.LabelSelectorAsSelector` does, for finding the Jobs that may adopt an orphan pod.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Why a label selector cannot be turned into a matcher.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// `In`/`NotIn` with no values.
    #[error("operator {op} on key {key:?} needs at least one value")]
    MissingValues {
        /// The requirement's key.
        key: String,
        /// The operator.
        op: String,
    },
    /// `Exists`/`DoesNotExist` with values.
    #[error("operator {op} on key {key:?} takes no values")]
    UnexpectedValues {
        /// The requirement's key.
        key: String,
        /// The operator.
        op: String,
    },
    /// An operator other than In, NotIn, Exists, DoesNotExist.
    #[error("unknown label selector operator {0:?}")]
    UnknownOperator(String),
}

/// One requirement of a compiled selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Self::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            // Upstream: a missing key satisfies NotIn.
            Self::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Self::Exists(k) => labels.contains_key(k),
            Self::DoesNotExist(k) => !labels.contains_key(k),
        }
    }
}

/// A compiled label selector: every requirement must hold. A nil selector matches nothing
/// (upstream `labels.Nothing()`); one without requirements matches everything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    reqs: Option<Vec<Requirement>>,
}

impl Selector {
    /// Compiles an optional `LabelSelector`; `None` becomes [`Selector::Nothing`].
    pub fn compile(sel: Option<&LabelSelector>) -> Result<Self, SelectorError> {
        let Some(sel) = sel else { return Ok(Self::nothing()) };
        let mut reqs = Vec::new();
        for (k, v) in sel.match_labels.iter().flatten() {
            reqs.push(Requirement::In(k.clone(), vec![v.clone()]));
        }
        for e in sel.match_expressions.iter().flatten() {
            let values = e.values.clone().unwrap_or_default();
            let key = e.key.clone();
            let req = match e.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(SelectorError::MissingValues { key, op: e.operator.clone() });
                }
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(SelectorError::UnexpectedValues { key, op: e.operator.clone() });
                }
                "In" => Requirement::In(key, values),
                "NotIn" => Requirement::NotIn(key, values),
                "Exists" => Requirement::Exists(key),
                "DoesNotExist" => Requirement::DoesNotExist(key),
                other => return Err(SelectorError::UnknownOperator(other.to_string())),
            };
            reqs.push(req);
        }
        Ok(Self { reqs: Some(reqs) })
    }

    /// The selector that matches nothing.
    pub fn nothing() -> Self {
        Self { reqs: None }
    }

    /// Whether `labels` satisfy the selector.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match &self.reqs {
            None => false,
            Some(reqs) => reqs.iter().all(|r| r.matches(labels)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: if values.is_empty() {
                None
            } else {
                Some(values.iter().map(|v| v.to_string()).collect())
            },
        }
    }

    fn sel(ml: &[(&str, &str)], exprs: Vec<LabelSelectorRequirement>) -> LabelSelector {
        LabelSelector {
            match_labels: if ml.is_empty() { None } else { Some(labels(ml)) },
            match_expressions: if exprs.is_empty() { None } else { Some(exprs) },
        }
    }

    #[test]
    fn nil_matches_nothing_and_empty_matches_everything() {
        let nothing = Selector::compile(None).unwrap();
        assert!(!nothing.matches(&labels(&[("a", "b")])));
        let every = Selector::compile(Some(&LabelSelector::default())).unwrap();
        assert!(every.matches(&labels(&[("a", "b")])));
        assert!(every.matches(&labels(&[])));
    }

    #[test]
    fn operators_table() {
        let l = labels(&[("app", "web"), ("tier", "front")]);
        let cases: Vec<(LabelSelector, bool)> = vec![
            (sel(&[("app", "web")], vec![]), true),
            (sel(&[("app", "db")], vec![]), false),
            (sel(&[("app", "web"), ("tier", "back")], vec![]), false),
            (sel(&[], vec![expr("app", "In", &["db", "web"])]), true),
            (sel(&[], vec![expr("app", "In", &["db"])]), false),
            (sel(&[], vec![expr("missing", "In", &["x"])]), false),
            (sel(&[], vec![expr("app", "NotIn", &["db"])]), true),
            (sel(&[], vec![expr("app", "NotIn", &["web"])]), false),
            (sel(&[], vec![expr("missing", "NotIn", &["x"])]), true),
            (sel(&[], vec![expr("tier", "Exists", &[])]), true),
            (sel(&[], vec![expr("missing", "Exists", &[])]), false),
            (sel(&[], vec![expr("missing", "DoesNotExist", &[])]), true),
            (sel(&[], vec![expr("app", "DoesNotExist", &[])]), false),
            (sel(&[("app", "web")], vec![expr("tier", "In", &["back"])]), false),
        ];
        for (i, (s, want)) in cases.into_iter().enumerate() {
            let compiled = Selector::compile(Some(&s)).unwrap();
            assert_eq!(compiled.matches(&l), want, "case {i}: {s:?}");
        }
    }

    #[test]
    fn invalid_selectors_are_errors() {
        let bad = [
            (expr("a", "In", &[]), "needs at least one value"),
            (expr("a", "NotIn", &[]), "needs at least one value"),
            (expr("a", "Exists", &["x"]), "takes no values"),
            (expr("a", "DoesNotExist", &["x"]), "takes no values"),
            (expr("a", "Gt", &["1"]), "unknown label selector operator"),
        ];
        for (e, msg) in bad {
            let err = Selector::compile(Some(&sel(&[], vec![e.clone()]))).unwrap_err();
            assert!(err.to_string().contains(msg), "{e:?}: {err}");
        }
    }
}
