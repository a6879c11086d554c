//! What a JobSet case must show on each control plane beyond the comparison: the fields of the
//! JobSet's final status its `jobset_expect` names (it completed, it restarted once, …).

use serde_json::Value;

use crate::case::Case;
use crate::compare::RawRun;

/// The violations of one control plane's runs of `cases` (`raws[i]` is case `i`'s), each a
/// sentence; empty when every JobSet case's status holds its expected fields.
pub fn check(side: &str, cases: &[Case], raws: &[&RawRun]) -> Vec<String> {
    let mut out = Vec::new();
    for (c, r) in cases.iter().zip(raws) {
        let Some(expect) = c.jobset_expect.as_object() else { continue };
        let status = &r.job["jobset"]["status"];
        for (field, want) in expect {
            let got = status.get(field).unwrap_or(&Value::Null);
            if got != want {
                out.push(format!(
                    "{side}: {}: the JobSet's status.{field} is {got}, the scenario expects {want}",
                    c.name
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn expected_fields_must_match_and_others_are_free() {
        let c: Case = serde_yaml::from_str(
            "name: js\njobset: {}\njobset_expect: {terminalState: Completed, restarts: 1}",
        )
        .unwrap();
        let run = |status: Value| RawRun {
            job: json!({"kind": "JobSetRun", "jobset": {"status": status}}),
            ..RawRun::default()
        };
        let ok = run(json!({"terminalState": "Completed", "restarts": 1, "other": 3}));
        assert_eq!(check("kjob", std::slice::from_ref(&c), &[&ok]), Vec::<String>::new());
        let never_restarted = run(json!({"terminalState": "Completed", "restarts": 0}));
        let v = check("kjob", std::slice::from_ref(&c), &[&never_restarted]);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("status.restarts is 0"), "{v:?}");
        let unfinished = run(json!({}));
        assert_eq!(check("upstream", &[c], &[&unfinished]).len(), 2);
    }
}
