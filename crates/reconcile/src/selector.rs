//! Evaluation of `metav1.LabelSelector` (matchLabels + matchExpressions), as
//! `metav1.LabelSelectorAsSelector` does: a nil selector matches nothing, an empty one (`{}`)
//! everything, an invalid one is an error. The one matcher of kjob: the worker's claim of a
//! Job's pods, the orphan worker's release and the watcher's `getPodJobs` all use it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::Pod;
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
    /// From matchLabels (upstream `selection.Equals`).
    Equals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Self::Equals(k, want) => labels.get(k) == Some(want),
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
    /// Compiles an optional `LabelSelector`; `None` becomes [`Selector::nothing`].
    pub fn compile(sel: Option<&LabelSelector>) -> Result<Self, SelectorError> {
        let Some(sel) = sel else { return Ok(Self::nothing()) };
        let mut reqs = Vec::new();
        for (k, v) in sel.match_labels.iter().flatten() {
            reqs.push(Requirement::Equals(k.clone(), v.clone()));
        }
        for e in sel.match_expressions.iter().flatten() {
            let mut values = e.values.clone().unwrap_or_default();
            // As a set, the way the API server reads the query.
            values.sort();
            values.dedup();
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

    /// Whether the pod's labels (none when unset) satisfy the selector.
    pub fn matches_pod(&self, pod: &Pod) -> bool {
        static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();
        self.matches(pod.metadata.labels.as_ref().unwrap_or(&NO_LABELS))
    }

    /// The selector as a `labelSelector` query parameter (`a=b,c in (d,e),!f`); `""` selects
    /// everything. `None` for [`Selector::nothing`], which no query can express.
    pub fn api_query(&self) -> Option<String> {
        let reqs = self.reqs.as_ref()?;
        let mut q = String::new();
        for (i, r) in reqs.iter().enumerate() {
            if i > 0 {
                q.push(',');
            }
            // Writing to a String cannot fail.
            let _ = match r {
                Requirement::Equals(k, v) => write!(q, "{k}={v}"),
                Requirement::In(k, vs) => write!(q, "{k} in ({})", vs.join(",")),
                Requirement::NotIn(k, vs) => write!(q, "{k} notin ({})", vs.join(",")),
                Requirement::Exists(k) => write!(q, "{k}"),
                Requirement::DoesNotExist(k) => write!(q, "!{k}"),
            };
        }
        Some(q)
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
    fn pods_without_labels() {
        let pod = Pod::default();
        assert!(Selector::compile(Some(&LabelSelector::default())).unwrap().matches_pod(&pod));
        assert!(!Selector::compile(None).unwrap().matches_pod(&pod));
        let dne = sel(&[], vec![expr("a", "DoesNotExist", &[])]);
        assert!(Selector::compile(Some(&dne)).unwrap().matches_pod(&pod));
        let ml = sel(&[("a", "b")], vec![]);
        assert!(!Selector::compile(Some(&ml)).unwrap().matches_pod(&pod));
    }

    /// Empty lists count as unset: `matchLabels: {}` and `matchExpressions: []` select all.
    #[test]
    fn empty_lists_match_everything() {
        let s =
            LabelSelector { match_labels: Some(BTreeMap::new()), match_expressions: Some(vec![]) };
        let compiled = Selector::compile(Some(&s)).unwrap();
        assert!(compiled.matches(&labels(&[])));
        assert_eq!(compiled.api_query().as_deref(), Some(""));
    }

    #[test]
    fn api_query_as_the_api_server_reads_it() {
        let s = sel(
            &[("app", "web")],
            vec![
                expr("tier", "In", &["front", "back", "front"]),
                expr("zone", "NotIn", &["b", "a"]),
                expr("x", "Exists", &[]),
                expr("y", "DoesNotExist", &[]),
            ],
        );
        let q = Selector::compile(Some(&s)).unwrap().api_query();
        assert_eq!(q.as_deref(), Some("app=web,tier in (back,front),zone notin (a,b),x,!y"));
        assert_eq!(Selector::nothing().api_query(), None);
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
