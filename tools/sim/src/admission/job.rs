//! batch/v1 Job admission: defaulting, generated selector and labels, spec validation,
//! immutability on update and the `/status` transition rules of the real API server.

use std::collections::BTreeSet;

use kjob_core::{
    CONTROLLER_UID_LABEL, JOB_NAME_LABEL, LEGACY_CONTROLLER_UID_LABEL, LEGACY_JOB_NAME_LABEL,
};
use serde_json::{Map, Value, json};

use super::pod::{default_pod_spec, validate_labels, validate_pod_spec};
use super::{FieldCause, at_most, nonnegative};
use crate::selector::{
    LabelSelector, dns1123_label_error, dns1123_subdomain_error, qualified_name_errors,
};

/// Largest parallelism (and completions with per-index limits) of an Indexed Job.
pub const MAX_PARALLELISM_FOR_INDEXED_JOB: i64 = 100_000;
/// Above this many completions, per-index limits need `maxFailedIndexes`.
pub const MAX_COMPLETIONS_FOR_PER_INDEX_LIMIT_WITHOUT_MAX_FAILED: i64 = 100_000;
/// Bound on parallelism and maxFailedIndexes for very large per-index-limited jobs.
pub const MAX_FOR_LARGE_PER_INDEX_JOB: i64 = 10_000;
/// Most rules of a podFailurePolicy.
pub const MAX_POD_FAILURE_POLICY_RULES: usize = 20;
/// Most `onPodConditions` patterns of one rule.
pub const MAX_POD_FAILURE_POLICY_ON_POD_CONDITIONS: usize = 20;
/// Most exit-code values of one rule.
pub const MAX_POD_FAILURE_POLICY_ON_EXIT_CODES_VALUES: usize = 255;
/// Most rules of a successPolicy.
pub const MAX_SUCCESS_POLICY_RULES: usize = 20;
/// Longest `succeededIndexes` string.
pub const MAX_SUCCEEDED_INDEXES_SIZE: usize = 64 * 1024;
/// Longest `spec.managedBy`.
pub const MAX_MANAGED_BY_LENGTH: usize = 63;

const COMPLETION_MODES: [&str; 2] = ["NonIndexed", "Indexed"];
const POD_FAILURE_ACTIONS: [&str; 4] = ["Count", "FailIndex", "FailJob", "Ignore"];
const POD_REPLACEMENT_POLICIES: [&str; 2] = ["Failed", "TerminatingOrFailed"];
const EXIT_CODE_OPERATORS: [&str; 2] = ["In", "NotIn"];
const CONDITION_STATUSES: [&str; 3] = ["False", "True", "Unknown"];

/// Checks a required field that takes one of `valid`: `Required value` naming them (in Go's
/// `%q` list form) when it is empty, `Unsupported value` when it is none of them. Whether
/// `value` is one of them.
fn check_one_of(out: &mut Vec<FieldCause>, field: &str, value: &str, valid: &[&str]) -> bool {
    if value.is_empty() {
        let list: Vec<String> = valid.iter().map(|v| format!("{v:?}")).collect();
        out.push(FieldCause::required(field, &format!("valid values: [{}]", list.join(" "))));
        false
    } else if !valid.contains(&value) {
        out.push(FieldCause::not_supported(field, &json!(value), valid));
        false
    } else {
        true
    }
}

fn int(v: &Value, ptr: &str) -> Option<i64> {
    v.pointer(ptr).and_then(Value::as_i64)
}

fn text<'a>(v: &'a Value, ptr: &str) -> Option<&'a str> {
    v.pointer(ptr).and_then(Value::as_str)
}

fn set_default(m: &mut Map<String, Value>, key: &str, value: Value) {
    if m.get(key).is_none_or(Value::is_null) {
        m.insert(key.to_string(), value);
    }
}

/// Applies the batch/v1 defaults (idempotent): both completions and parallelism default to 1
/// when both are unset, parallelism alone to 1 (leaving completions unset: work-queue jobs);
/// backoffLimit 6 (MaxInt32 with backoffLimitPerIndex); completionMode NonIndexed; suspend
/// false; manualSelector false; podReplacementPolicy Failed with a podFailurePolicy else
/// TerminatingOrFailed; onPodConditions status True; pod template defaults; and Job labels
/// taken from the template when the Job has none.
pub fn default_job(job: &mut Value) {
    let template_labels = job.pointer("/spec/template/metadata/labels").cloned();
    let Some(spec) = job.get_mut("spec").and_then(Value::as_object_mut) else { return };
    let unset = |m: &Map<String, Value>, k: &str| m.get(k).is_none_or(Value::is_null);
    if unset(spec, "completions") && unset(spec, "parallelism") {
        spec.insert("completions".into(), json!(1));
        spec.insert("parallelism".into(), json!(1));
    }
    set_default(spec, "parallelism", json!(1));
    let per_index = !unset(spec, "backoffLimitPerIndex");
    set_default(spec, "backoffLimit", json!(if per_index { i64::from(i32::MAX) } else { 6 }));
    set_default(spec, "completionMode", json!("NonIndexed"));
    set_default(spec, "suspend", json!(false));
    set_default(spec, "manualSelector", json!(false));
    let has_pfp = !unset(spec, "podFailurePolicy");
    set_default(
        spec,
        "podReplacementPolicy",
        json!(if has_pfp { "Failed" } else { "TerminatingOrFailed" }),
    );
    if let Some(Value::Array(rules)) =
        spec.get_mut("podFailurePolicy").and_then(|p| p.get_mut("rules"))
    {
        for rule in rules {
            if let Some(Value::Array(conds)) = rule.get_mut("onPodConditions") {
                for c in conds.iter_mut().filter_map(Value::as_object_mut) {
                    let empty = c.get("status").and_then(Value::as_str).is_none_or(str::is_empty);
                    if empty {
                        c.insert("status".into(), json!("True"));
                    }
                }
            }
        }
    }
    if let Some(tspec) = spec.get_mut("template").and_then(|t| t.get_mut("spec")) {
        default_pod_spec(tspec);
    }
    let job_labels_empty =
        job.pointer("/metadata/labels").and_then(Value::as_object).is_none_or(Map::is_empty);
    if job_labels_empty
        && let Some(l) = template_labels.filter(|l| l.as_object().is_some_and(|m| !m.is_empty()))
        && let Some(meta) = job.get_mut("metadata").and_then(Value::as_object_mut)
    {
        meta.insert("labels".into(), l);
    }
}

/// Create-time preparation once `metadata.uid` and `metadata.name` are assigned: resets
/// status to `{}` (upstream sets an empty JobStatus, which reads back as `"status": {}`), adds the generated selector and template labels unless `manualSelector`, then
/// re-runs defaulting so the Job's labels mirror the template's (as a read-back shows them).
pub fn prepare_job_create(job: &mut Value) {
    if let Some(m) = job.as_object_mut() {
        m.insert("status".into(), Value::Object(Default::default()));
    }
    default_job(job);
    let manual = job.pointer("/spec/manualSelector").and_then(Value::as_bool).unwrap_or(false);
    if !manual {
        generate_selector(job);
    }
    default_job(job);
}

/// Adds the four generated template labels (if absent) and, if the selector is unset, a
/// selector on `batch.kubernetes.io/controller-uid`.
pub fn generate_selector(job: &mut Value) {
    let uid = text(job, "/metadata/uid").unwrap_or_default().to_string();
    let name = text(job, "/metadata/name").unwrap_or_default().to_string();
    let Some(spec) = job.get_mut("spec").and_then(Value::as_object_mut) else { return };
    let template = spec.entry("template").or_insert_with(|| json!({}));
    if !template.is_object() {
        *template = json!({});
    }
    let meta = template.as_object_mut().map(|t| t.entry("metadata").or_insert_with(|| json!({})));
    if let Some(meta) = meta.and_then(Value::as_object_mut) {
        let labels = meta.entry("labels").or_insert_with(|| json!({}));
        if let Some(l) = labels.as_object_mut() {
            for (k, v) in [
                (CONTROLLER_UID_LABEL, &uid),
                (LEGACY_CONTROLLER_UID_LABEL, &uid),
                (JOB_NAME_LABEL, &name),
                (LEGACY_JOB_NAME_LABEL, &name),
            ] {
                l.entry(k).or_insert_with(|| json!(v));
            }
        }
    }
    if spec.get("selector").is_none_or(Value::is_null) {
        spec.insert("selector".into(), json!({"matchLabels": {CONTROLLER_UID_LABEL: uid}}));
    }
}

fn template_labels(job: &Value) -> std::collections::BTreeMap<String, String> {
    job.pointer("/spec/template").map(crate::selector::labels_of).unwrap_or_default()
}

fn validate_generated_selector(job: &Value, out: &mut Vec<FieldCause>) {
    if job.pointer("/spec/manualSelector").and_then(Value::as_bool) == Some(true) {
        return;
    }
    let Some(selector) = job.pointer("/spec/selector").filter(|s| !s.is_null()) else { return };
    let uid = text(job, "/metadata/uid").unwrap_or_default();
    let name = text(job, "/metadata/name").unwrap_or_default();
    if uid.is_empty() {
        out.push(FieldCause::required("metadata.uid", ""));
    }
    let labels = template_labels(job);
    for (key, want) in [
        (CONTROLLER_UID_LABEL, uid),
        (LEGACY_CONTROLLER_UID_LABEL, uid),
        (JOB_NAME_LABEL, name),
        (LEGACY_JOB_NAME_LABEL, name),
    ] {
        let field = format!("spec.template.metadata.labels[{key}]");
        match labels.get(key) {
            None => out.push(FieldCause::required(&field, want)),
            Some(have) if have != want => {
                let all =
                    job.pointer("/spec/template/metadata/labels").cloned().unwrap_or(Value::Null);
                out.push(FieldCause::invalid(&field, &all, want));
            }
            Some(_) => {}
        }
    }
    let expected = std::collections::BTreeMap::from([
        (CONTROLLER_UID_LABEL.to_string(), uid.to_string()),
        (LEGACY_CONTROLLER_UID_LABEL.to_string(), uid.to_string()),
    ]);
    if let Ok(sel) = LabelSelector::from_json(selector)
        && !sel.matches(&expected)
    {
        out.push(FieldCause::invalid("spec.selector", selector, "`selector` not auto-generated"));
    }
}

/// Parses an interval list (`1,3-5,7`) of indexes below `completions`, returning the number
/// of indexes it names, with the same checks as the real server (ordered, non-overlapping,
/// in range).
pub fn parse_indexes(s: &str, completions: i64) -> Result<i64, String> {
    if s.is_empty() {
        return Ok(0);
    }
    let mut total = 0i64;
    let mut last: Option<i64> = None;
    for interval in s.split(',') {
        let (x, y) = parse_index_interval(interval, completions)?;
        if let Some(l) = last
            && l >= x
        {
            return Err(format!("non-increasing order, previous: {l}, current: {x}"));
        }
        total += y - x + 1;
        last = Some(y);
    }
    Ok(total)
}

fn parse_index_interval(interval: &str, completions: i64) -> Result<(i64, i64), String> {
    let limits: Vec<&str> = interval.split('-').collect();
    if limits.len() > 2 {
        return Err(format!(
            "the fragment {interval:?} violates the requirement that an index interval can have at most two parts separated by '-'"
        ));
    }
    let parse = |x: &str| {
        let n: i64 =
            x.parse().map_err(|_| format!("cannot convert string to integer for index: {x:?}"))?;
        if n >= completions {
            return Err(format!("too large index: {x:?}"));
        }
        Ok(n)
    };
    let x = parse(limits[0])?;
    match limits.get(1) {
        None => Ok((x, x)),
        Some(b) => {
            let y = parse(b)?;
            if x >= y {
                return Err(format!("non-increasing order, previous: {x}, current: {y}"));
            }
            Ok((x, y))
        }
    }
}

fn index_set(s: &str) -> BTreeSet<i64> {
    let mut out = BTreeSet::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(lo), Ok(hi)) = (a.parse::<i64>(), b.parse::<i64>()) {
            // Bounded by completions through parse_indexes before this is called.
            out.extend(lo..=hi);
        }
    }
    out
}

fn validate_pod_failure_policy(spec: &Value, out: &mut Vec<FieldCause>) {
    let Some(pfp) = spec.get("podFailurePolicy").filter(|p| !p.is_null()) else { return };
    let rules = pfp.get("rules").and_then(Value::as_array).cloned().unwrap_or_default();
    if rules.len() > MAX_POD_FAILURE_POLICY_RULES {
        out.push(FieldCause::too_many(
            "spec.podFailurePolicy.rules",
            rules.len(),
            MAX_POD_FAILURE_POLICY_RULES,
        ));
    }
    let mut containers = BTreeSet::new();
    for list in ["containers", "initContainers"] {
        if let Some(cs) = spec.pointer(&format!("/template/spec/{list}")).and_then(Value::as_array)
        {
            containers.extend(cs.iter().filter_map(|c| c.get("name").and_then(Value::as_str)));
        }
    }
    let per_index = spec.get("backoffLimitPerIndex").is_some_and(|v| !v.is_null());
    for (i, rule) in rules.iter().enumerate() {
        let rp = format!("spec.podFailurePolicy.rules[{i}]");
        let action = rule.get("action").and_then(Value::as_str).unwrap_or_default();
        let known = check_one_of(out, &format!("{rp}.action"), action, &POD_FAILURE_ACTIONS);
        if known && action == "FailIndex" && !per_index {
            out.push(FieldCause::invalid(
                &format!("{rp}.action"),
                &json!(action),
                "requires the backoffLimitPerIndex to be set",
            ));
        }
        let codes = rule.get("onExitCodes").filter(|v| !v.is_null());
        let conds = rule.get("onPodConditions").and_then(Value::as_array).filter(|c| !c.is_empty());
        match (codes, conds) {
            (Some(_), Some(_)) => out.push(FieldCause::invalid_omit(
                &rp,
                "specifying both OnExitCodes and OnPodConditions is not supported",
            )),
            (None, None) => out.push(FieldCause::invalid_omit(
                &rp,
                "specifying one of OnExitCodes and OnPodConditions is required",
            )),
            _ => {}
        }
        if let Some(codes) = codes {
            let cp = format!("{rp}.onExitCodes");
            if let Some(name) = codes.get("containerName").and_then(Value::as_str)
                && !containers.contains(name)
            {
                out.push(FieldCause::invalid(
                    &format!("{cp}.containerName"),
                    &json!(name),
                    "must be one of the container or initContainer names in the pod template",
                ));
            }
            let op = codes.get("operator").and_then(Value::as_str).unwrap_or_default();
            check_one_of(out, &format!("{cp}.operator"), op, &EXIT_CODE_OPERATORS);
            let values: Vec<i64> = codes
                .get("values")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_i64).collect())
                .unwrap_or_default();
            let vp = format!("{cp}.values");
            if values.is_empty() {
                out.push(FieldCause::invalid(
                    &vp,
                    &json!(values),
                    "at least one value is required",
                ));
            }
            if values.len() > MAX_POD_FAILURE_POLICY_ON_EXIT_CODES_VALUES {
                out.push(FieldCause::too_many(
                    &vp,
                    values.len(),
                    MAX_POD_FAILURE_POLICY_ON_EXIT_CODES_VALUES,
                ));
            }
            let mut ordered = true;
            let mut prev: Option<i64> = None;
            let mut seen = BTreeSet::new();
            for (j, v) in values.iter().enumerate() {
                let f = format!("{vp}[{j}]");
                if op == "In" && *v == 0 {
                    out.push(FieldCause::invalid(
                        &f,
                        &json!(v),
                        "must not be 0 for the In operator",
                    ));
                }
                if !seen.insert(*v) {
                    out.push(FieldCause::duplicate(&f, &json!(v)));
                }
                ordered &= prev.is_none_or(|p| p <= *v);
                prev = Some(*v);
            }
            if !ordered {
                out.push(FieldCause::invalid(&vp, &json!(values), "must be ordered"));
            }
        }
        if let Some(conds) = conds {
            let cp = format!("{rp}.onPodConditions");
            if conds.len() > MAX_POD_FAILURE_POLICY_ON_POD_CONDITIONS {
                out.push(FieldCause::too_many(
                    &cp,
                    conds.len(),
                    MAX_POD_FAILURE_POLICY_ON_POD_CONDITIONS,
                ));
            }
            for (j, c) in conds.iter().enumerate() {
                let ty = c.get("type").and_then(Value::as_str).unwrap_or_default();
                for e in qualified_name_errors(ty) {
                    out.push(FieldCause::invalid(&format!("{cp}[{j}].type"), &json!(ty), &e));
                }
                let st = c.get("status").and_then(Value::as_str).unwrap_or_default();
                if !CONDITION_STATUSES.contains(&st) {
                    out.push(FieldCause::not_supported(
                        &format!("{cp}[{j}].status"),
                        &json!(st),
                        &CONDITION_STATUSES,
                    ));
                }
            }
        }
    }
}

fn validate_success_policy(spec: &Value, out: &mut Vec<FieldCause>) {
    let Some(sp) = spec.get("successPolicy").filter(|p| !p.is_null()) else { return };
    let mode = spec.get("completionMode").and_then(Value::as_str).unwrap_or("NonIndexed");
    if mode != "Indexed" {
        out.push(FieldCause::invalid("spec.successPolicy", sp, "requires indexed completion mode"));
        return;
    }
    let rules = sp.get("rules").and_then(Value::as_array).cloned().unwrap_or_default();
    if rules.is_empty() {
        out.push(FieldCause::required(
            "spec.successPolicy.rules",
            "at least one rules must be specified when the successPolicy is specified",
        ));
    }
    if rules.len() > MAX_SUCCESS_POLICY_RULES {
        out.push(FieldCause::too_many(
            "spec.successPolicy.rules",
            rules.len(),
            MAX_SUCCESS_POLICY_RULES,
        ));
    }
    let completions = spec.get("completions").and_then(Value::as_i64);
    for (i, rule) in rules.iter().enumerate() {
        let rp = format!("spec.successPolicy.rules[{i}]");
        let indexes = rule.get("succeededIndexes").and_then(Value::as_str);
        let count = rule.get("succeededCount").and_then(Value::as_i64);
        if indexes.is_none() && count.is_none() {
            out.push(FieldCause::required(
                &rp,
                "at least one of succeededCount or succeededIndexes must be specified",
            ));
        }
        let mut total: Option<i64> = None;
        if let Some(ix) = indexes {
            let ip = format!("{rp}.succeededIndexes");
            if ix.len() > MAX_SUCCEEDED_INDEXES_SIZE {
                out.push(FieldCause::too_long(&ip, MAX_SUCCEEDED_INDEXES_SIZE));
            } else if let Some(c) = completions {
                match parse_indexes(ix, c) {
                    Ok(n) => total = Some(n),
                    Err(e) => out.push(FieldCause::invalid(
                        &ip,
                        &json!(ix),
                        &format!("error parsing succeededIndexes: {e}"),
                    )),
                }
            }
        }
        if let Some(n) = count {
            let cp = format!("{rp}.succeededCount");
            if n < 0 {
                out.push(FieldCause::invalid(&cp, &json!(n), "must be greater than or equal to 0"));
            }
            if let Some(c) = completions
                && n > c
            {
                out.push(FieldCause::invalid(
                    &cp,
                    &json!(n),
                    &format!(
                        "must be less than or equal to {c} (the number of specified completions)"
                    ),
                ));
            }
            if let Some(t) = total
                && n > t
            {
                out.push(FieldCause::invalid(
                    &cp,
                    &json!(n),
                    &format!("must be less than or equal to {t} (the number of indexes in the specified succeededIndexes field)"),
                ));
            }
        }
    }
}

fn validate_managed_by(spec: &Value, out: &mut Vec<FieldCause>) {
    let Some(m) = spec.get("managedBy").and_then(Value::as_str) else { return };
    if m.len() > MAX_MANAGED_BY_LENGTH {
        out.push(FieldCause::too_long("spec.managedBy", MAX_MANAGED_BY_LENGTH));
    }
    let ok = match m.split_once('/') {
        Some((domain, path)) => {
            dns1123_subdomain_error(domain).is_none()
                && !path.is_empty()
                && path
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-._~%!$&'()*+,;=:/".contains(c))
        }
        None => false,
    };
    if !ok {
        out.push(FieldCause::invalid(
            "spec.managedBy",
            &json!(m),
            "must be a domain-prefixed path (such as \"acme.io/foo\")",
        ));
    }
}

fn validate_job_spec(job: &Value, out: &mut Vec<FieldCause>) {
    let Some(spec) = job.get("spec") else {
        out.push(FieldCause::required("spec.template", ""));
        return;
    };
    for f in [
        "parallelism",
        "completions",
        "activeDeadlineSeconds",
        "backoffLimit",
        "ttlSecondsAfterFinished",
        "backoffLimitPerIndex",
        "maxFailedIndexes",
    ] {
        nonnegative(out, spec, &format!("/{f}"), &format!("spec.{f}"));
    }
    let mode = spec.get("completionMode").and_then(Value::as_str).unwrap_or("NonIndexed");
    let indexed = mode == "Indexed";
    if !COMPLETION_MODES.contains(&mode) {
        out.push(FieldCause::not_supported("spec.completionMode", &json!(mode), &COMPLETION_MODES));
    }
    let completions = spec.get("completions").and_then(Value::as_i64);
    let parallelism = spec.get("parallelism").and_then(Value::as_i64);
    let per_index = spec.get("backoffLimitPerIndex").and_then(Value::as_i64);
    let max_failed = spec.get("maxFailedIndexes").and_then(Value::as_i64);
    if indexed {
        if completions.is_none() {
            out.push(FieldCause::required("spec.completions", "when completion mode is Indexed"));
        }
        at_most(
            out,
            "spec.parallelism",
            parallelism,
            Some(MAX_PARALLELISM_FOR_INDEXED_JOB),
            "must be less than or equal to 100000 when completion mode is Indexed",
        );
    }
    if !indexed {
        if let Some(b) = per_index {
            out.push(FieldCause::invalid(
                "spec.backoffLimitPerIndex",
                &json!(b),
                "requires indexed completion mode",
            ));
        }
        if let Some(m) = max_failed {
            out.push(FieldCause::invalid(
                "spec.maxFailedIndexes",
                &json!(m),
                "requires indexed completion mode",
            ));
        }
    }
    if max_failed.is_some() {
        if per_index.is_none() {
            out.push(FieldCause::required(
                "spec.backoffLimitPerIndex",
                "when maxFailedIndexes is specified",
            ));
        }
        let field = "spec.maxFailedIndexes";
        let detail = "must be less than or equal to completions";
        at_most(out, field, max_failed, completions, detail);
        let detail = "must be less than or equal to 100000";
        at_most(out, field, max_failed, Some(MAX_PARALLELISM_FOR_INDEXED_JOB), detail);
    }
    if per_index.is_some()
        && let Some(c) = completions
        && c > MAX_COMPLETIONS_FOR_PER_INDEX_LIMIT_WITHOUT_MAX_FAILED
    {
        match max_failed {
            None => out.push(FieldCause::required(
                "spec.maxFailedIndexes",
                "must be specified when completions is above 100000",
            )),
            Some(mf) if mf > MAX_FOR_LARGE_PER_INDEX_JOB => out.push(FieldCause::invalid(
                "spec.maxFailedIndexes",
                &json!(mf),
                "must be less than or equal to 10000 when completions are above 100000 and used with backoff limit per index",
            )),
            _ => {}
        }
        at_most(
            out,
            "spec.parallelism",
            parallelism,
            Some(MAX_FOR_LARGE_PER_INDEX_JOB),
            "must be less than or equal to 10000 when completions are above 100000 and used with backoff limit per index",
        );
    }
    if indexed && let Some(c) = completions.filter(|c| *c > 0) {
        let name = text(job, "/metadata/name").unwrap_or_default();
        let host = format!("{name}-{}", c - 1);
        if !name.is_empty() && dns1123_label_error(&host).is_some() {
            out.push(FieldCause::invalid(
                "metadata.name",
                &json!(name),
                &format!("will not able to create pod with invalid DNS label: {host}"),
            ));
        }
    }
    validate_pod_failure_policy(spec, out);
    validate_success_policy(spec, out);
    if let Some(prp) = spec.get("podReplacementPolicy").and_then(Value::as_str) {
        if !POD_REPLACEMENT_POLICIES.contains(&prp) {
            out.push(FieldCause::not_supported(
                "spec.podReplacementPolicy",
                &json!(prp),
                &POD_REPLACEMENT_POLICIES,
            ));
        } else if prp != "Failed" && spec.get("podFailurePolicy").is_some_and(|p| !p.is_null()) {
            out.push(FieldCause::not_supported(
                "spec.podReplacementPolicy",
                &json!(prp),
                &["Failed"],
            ));
        }
    }
    validate_managed_by(spec, out);

    // Template.
    match spec.get("template") {
        None => out.push(FieldCause::required("spec.template", "")),
        Some(t) => {
            out.extend(validate_labels(t.get("metadata"), "spec.template.metadata"));
            match t.get("spec") {
                Some(ts) => out.extend(
                    validate_pod_spec(ts, "spec.template.spec")
                        .into_iter()
                        .filter(|c| c.field != "spec.template.spec.restartPolicy"),
                ),
                None => out.push(FieldCause::required("spec.template.spec.containers", "")),
            }
            let restart = text(t, "/spec/restartPolicy").unwrap_or_default();
            let has_pfp = spec.get("podFailurePolicy").is_some_and(|p| !p.is_null());
            if restart.is_empty() || restart == "Always" {
                out.push(FieldCause::required(
                    "spec.template.spec.restartPolicy",
                    "valid values: \"OnFailure\", \"Never\"",
                ));
            } else if restart != "OnFailure" && restart != "Never" {
                out.push(FieldCause::not_supported(
                    "spec.template.spec.restartPolicy",
                    &json!(restart),
                    &["OnFailure", "Never"],
                ));
            } else if has_pfp && restart != "Never" {
                out.push(FieldCause::invalid(
                    "spec.template.spec.restartPolicy",
                    &json!(restart),
                    "only \"Never\" is supported when podFailurePolicy is specified",
                ));
            }
        }
    }

    // Selector.
    match spec.get("selector").filter(|s| !s.is_null()) {
        None => out.push(FieldCause::required("spec.selector", "")),
        Some(sel) => match LabelSelector::from_json(sel) {
            Err(e) => out.push(FieldCause::invalid("spec.selector", sel, &e.to_string())),
            Ok(s) => {
                if !s.matches(&template_labels(job)) {
                    let labels = job
                        .pointer("/spec/template/metadata/labels")
                        .cloned()
                        .unwrap_or(Value::Null);
                    out.push(FieldCause::invalid(
                        "spec.template.metadata.labels",
                        &labels,
                        "`selector` does not match template `labels`",
                    ));
                }
            }
        },
    }
}

/// Validates a Job on create (after [`prepare_job_create`]).
pub fn validate_job_create(job: &Value) -> Vec<FieldCause> {
    let mut out = validate_labels(job.get("metadata"), "metadata");
    validate_generated_selector(job, &mut out);
    validate_job_spec(job, &mut out);
    out
}

/// Validates a main-resource Job update: the spec rules plus immutability of selector,
/// completionMode, podFailurePolicy, backoffLimitPerIndex, managedBy, successPolicy,
/// completions (except Indexed jobs scaled with parallelism == completions) and the
/// template (whose scheduling directives, labels and annotations may change while the Job is
/// suspended and has never started).
pub fn validate_job_update(new: &Value, old: &Value) -> Vec<FieldCause> {
    let mut out = validate_labels(new.get("metadata"), "metadata");
    validate_job_spec(new, &mut out);
    let field =
        |v: &Value, f: &str| v.pointer(&format!("/spec/{f}")).cloned().unwrap_or(Value::Null);
    for f in [
        "selector",
        "completionMode",
        "podFailurePolicy",
        "backoffLimitPerIndex",
        "managedBy",
        "successPolicy",
    ] {
        let (n, o) = (field(new, f), field(old, f));
        if n != o {
            out.push(FieldCause::immutable(&format!("spec.{f}"), &n));
        }
    }
    let (nc, oc) = (field(new, "completions"), field(old, "completions"));
    if nc != oc {
        let indexed = text(new, "/spec/completionMode") == Some("Indexed");
        if !indexed {
            out.push(FieldCause::immutable("spec.completions", &nc));
        } else if nc != field(new, "parallelism") {
            out.push(FieldCause::invalid(
                "spec.completions",
                &nc,
                "can only be modified in tandem with spec.parallelism",
            ));
        }
    }
    let mut nt = field(new, "template");
    let mut ot = field(old, "template");
    let suspended_never_started = old.pointer("/spec/suspend").and_then(Value::as_bool)
        == Some(true)
        && old.pointer("/status/startTime").is_none_or(Value::is_null);
    if suspended_never_started {
        for (meta_or_spec, key) in [
            ("metadata", "labels"),
            ("metadata", "annotations"),
            ("spec", "nodeSelector"),
            ("spec", "tolerations"),
            ("spec", "schedulingGates"),
        ] {
            let v = nt.pointer(&format!("/{meta_or_spec}/{key}")).cloned();
            if let Some(parent) = ot.get_mut(meta_or_spec).and_then(Value::as_object_mut) {
                match v {
                    Some(v) => parent.insert(key.into(), v),
                    None => parent.remove(key),
                };
            } else if let (Some(v), Some(o)) = (v, ot.as_object_mut()) {
                o.insert(meta_or_spec.into(), json!({ key: v }));
            }
        }
        let na = nt.pointer("/spec/affinity/nodeAffinity").cloned();
        if let Some(spec) = ot.get_mut("spec").and_then(Value::as_object_mut) {
            let aff = spec.entry("affinity").or_insert_with(|| json!({}));
            if let Some(a) = aff.as_object_mut() {
                match na {
                    Some(v) => a.insert("nodeAffinity".into(), v),
                    None => a.remove("nodeAffinity"),
                };
            }
        }
        for t in [&mut nt, &mut ot] {
            let empty =
                t.pointer("/spec/affinity").and_then(Value::as_object).is_some_and(Map::is_empty);
            if empty && let Some(s) = t.get_mut("spec").and_then(Value::as_object_mut) {
                s.remove("affinity");
            }
            let empty_meta =
                t.get("metadata").and_then(Value::as_object).is_some_and(Map::is_empty);
            if empty_meta && let Some(o) = t.as_object_mut() {
                o.remove("metadata");
            }
        }
    }
    if nt != ot {
        out.push(FieldCause::immutable("spec.template", &field(new, "template")));
    }
    out
}

fn condition_true(job: &Value, ty: &str) -> bool {
    job.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == ty && c["status"] == "True"))
}

fn is_finished(job: &Value) -> bool {
    condition_true(job, "Complete") || condition_true(job, "Failed")
}

fn uncounted_len(job: &Value) -> usize {
    ["succeeded", "failed"]
        .iter()
        .filter_map(|k| {
            job.pointer(&format!("/status/uncountedTerminatedPods/{k}")).and_then(Value::as_array)
        })
        .map(Vec::len)
        .sum()
}

fn parse_time(job: &Value, f: &str) -> Option<jiff::Timestamp> {
    text(job, &format!("/status/{f}")).and_then(|s| s.parse().ok())
}

/// Validates a `/status` update of a Job (`new` and `old` are whole Jobs), with the
/// transition rules of the JobManagedBy-era server: counters non-negative, failed (and,
/// except for elastic Indexed jobs, succeeded) never decrease, terminal conditions never
/// turned off, completionTime rules, Complete/Failed/FailureTarget/SuccessCriteriaMet
/// consistency (Failed needs FailureTarget and Complete needs SuccessCriteriaMet, as in
/// current releases), finished jobs without active/terminating/uncounted pods and with a
/// startTime, and completed/failed index formats. Each rule is checked only when a field it
/// reads changed, as upstream does, so legacy objects stay writable.
pub fn validate_job_status_update(new: &Value, old: &Value) -> Vec<FieldCause> {
    let mut out = Vec::new();
    let st =
        |j: &Value, f: &str| j.pointer(&format!("/status/{f}")).cloned().unwrap_or(Value::Null);
    let changed = |f: &str| st(new, f) != st(old, f);
    let cond_changed = |ty: &str| condition_true(new, ty) != condition_true(old, ty);
    for f in ["active", "succeeded", "failed", "ready", "terminating"] {
        nonnegative(&mut out, new, &format!("/status/{f}"), &format!("status.{f}"));
    }
    let mut seen = BTreeSet::new();
    for k in ["succeeded", "failed"] {
        let ids =
            new.pointer(&format!("/status/uncountedTerminatedPods/{k}")).and_then(Value::as_array);
        for (i, id) in ids.into_iter().flatten().enumerate() {
            let f = format!("status.uncountedTerminatedPods.{k}[{i}]");
            let s = id.as_str().unwrap_or_default();
            if s.is_empty() {
                out.push(FieldCause::invalid(&f, id, "must not be empty"));
            } else if !seen.insert(s.to_string()) {
                out.push(FieldCause::duplicate(&f, id));
            }
        }
    }
    let complete = condition_true(new, "Complete");
    let failed = condition_true(new, "Failed");
    let failure_target = condition_true(new, "FailureTarget");
    let scm = condition_true(new, "SuccessCriteriaMet");
    let finished = is_finished(new);
    let finished_changed = finished != is_finished(old);
    let indexed = text(new, "/spec/completionMode") == Some("Indexed");
    let completions = int(new, "/spec/completions");

    for ty in ["Failed", "Complete", "FailureTarget"] {
        if condition_true(old, ty) && !condition_true(new, ty) {
            out.push(FieldCause::invalid_omit(
                "status.conditions",
                &format!("cannot disable the terminal {ty}=True condition"),
            ));
        }
    }
    let count = |j: &Value, f: &str| int(j, &format!("/status/{f}")).unwrap_or(0);
    if count(new, "failed") < count(old, "failed") {
        out.push(FieldCause::invalid(
            "status.failed",
            &json!(count(new, "failed")),
            "cannot decrease the failed counter",
        ));
    }
    let elastic = indexed && new.pointer("/spec/completions") == new.pointer("/spec/parallelism");
    if !elastic && count(new, "succeeded") < count(old, "succeeded") {
        out.push(FieldCause::invalid(
            "status.succeeded",
            &json!(count(new, "succeeded")),
            "cannot decrease the succeeded counter",
        ));
    }
    let (nct, oct) = (st(new, "completionTime"), st(old, "completionTime"));
    if !nct.is_null() && !oct.is_null() && nct != oct {
        out.push(FieldCause::invalid(
            "status.completionTime",
            &nct,
            "completionTime cannot be mutated",
        ));
    }
    let suspended = new.pointer("/spec/suspend").and_then(Value::as_bool) == Some(true);
    if !st(old, "startTime").is_null() && changed("startTime") && !suspended {
        out.push(FieldCause::required(
            "status.startTime",
            "startTime cannot be removed for unsuspended job",
        ));
    }
    if condition_true(old, "SuccessCriteriaMet") && !scm {
        out.push(FieldCause::invalid_omit(
            "status.conditions",
            "cannot disable the SuccessCriteriaMet=True condition",
        ));
    }
    if condition_true(old, "Complete") && !condition_true(old, "SuccessCriteriaMet") && scm {
        out.push(FieldCause::invalid_omit(
            "status.conditions",
            "cannot set SuccessCriteriaMet=True for Job already has Complete=true conditions",
        ));
    }
    if (cond_changed("Complete") || cond_changed("Failed")) && complete && failed {
        out.push(FieldCause::invalid_omit(
            "status.conditions",
            "cannot set Complete=True and Failed=true conditions",
        ));
    }
    if (cond_changed("Complete") || cond_changed("FailureTarget")) && complete && failure_target {
        out.push(FieldCause::invalid_omit(
            "status.conditions",
            "cannot set Complete=True and FailureTarget=true conditions",
        ));
    }
    if (cond_changed("Complete") || changed("completionTime")) && !nct.is_null() && !complete {
        out.push(FieldCause::invalid(
            "status.completionTime",
            &nct,
            "cannot set completionTime when there is no Complete=True condition",
        ));
    }
    if (cond_changed("Complete") || changed("completionTime")) && nct.is_null() && complete {
        out.push(FieldCause::required(
            "status.completionTime",
            "completionTime is required for Complete jobs",
        ));
    }
    if (changed("startTime") || changed("completionTime"))
        && let (Some(s), Some(c)) =
            (parse_time(new, "startTime"), parse_time(new, "completionTime"))
        && c < s
    {
        out.push(FieldCause::invalid(
            "status.completionTime",
            &nct,
            "completionTime cannot be set before startTime",
        ));
    }
    if (cond_changed("Failed") || changed("failedIndexes")) && failed && !failure_target {
        out.push(FieldCause::invalid_omit(
            "status.conditions",
            "cannot set Failed=True condition without the FailureTarget=true condition",
        ));
    }
    if (cond_changed("Complete") || cond_changed("SuccessCriteriaMet")) && complete && !scm {
        out.push(FieldCause::invalid_omit(
            "status.conditions",
            "cannot set Complete=True condition without the SuccessCriteriaMet=true condition",
        ));
    }
    if (finished_changed || changed("active")) && finished && count(new, "active") > 0 {
        out.push(FieldCause::invalid(
            "status.active",
            &json!(count(new, "active")),
            "active>0 is invalid for finished job",
        ));
    }
    if (finished_changed || changed("terminating")) && finished && count(new, "terminating") > 0 {
        out.push(FieldCause::invalid(
            "status.terminating",
            &json!(count(new, "terminating")),
            "terminating>0 is invalid for finished job",
        ));
    }
    if (finished_changed || changed("startTime")) && finished && st(new, "startTime").is_null() {
        out.push(FieldCause::required(
            "status.startTime",
            "startTime is required for finished job",
        ));
    }
    if (finished_changed || changed("uncountedTerminatedPods"))
        && finished
        && uncounted_len(new) > 0
    {
        out.push(FieldCause::invalid(
            "status.uncountedTerminatedPods",
            &st(new, "uncountedTerminatedPods"),
            "uncountedTerminatedPods needs to be empty for finished job",
        ));
    }
    let completed_ix = text(new, "/status/completedIndexes").unwrap_or_default();
    let failed_ix = new.pointer("/status/failedIndexes").and_then(Value::as_str);
    if changed("completedIndexes") {
        if let Some(c) = completions
            && let Err(e) = parse_indexes(completed_ix, c)
        {
            out.push(FieldCause::invalid(
                "status.completedIndexes",
                &json!(completed_ix),
                &format!("error parsing completedIndexes: {e}"),
            ));
        }
        if !completed_ix.is_empty() && !indexed {
            out.push(FieldCause::invalid(
                "status.completedIndexes",
                &json!(completed_ix),
                "cannot set non-empty completedIndexes when non-indexed completion mode",
            ));
        }
    }
    let per_index = new.pointer("/spec/backoffLimitPerIndex").is_some_and(|v| !v.is_null());
    if changed("failedIndexes")
        && let Some(fi) = failed_ix
    {
        if !per_index {
            out.push(FieldCause::invalid(
                "status.failedIndexes",
                &json!(fi),
                "cannot set non-null failedIndexes when backoffLimitPerIndex is null",
            ));
        } else if let Some(c) = completions
            && let Err(e) = parse_indexes(fi, c)
        {
            out.push(FieldCause::invalid(
                "status.failedIndexes",
                &json!(fi),
                &format!("error parsing failedIndexes: {e}"),
            ));
        }
    }
    if (changed("failedIndexes") || changed("completedIndexes"))
        && let (Some(fi), Some(c)) = (failed_ix, completions)
        && parse_indexes(fi, c).is_ok()
        && parse_indexes(completed_ix, c).is_ok()
    {
        let overlap: Vec<i64> =
            index_set(fi).intersection(&index_set(completed_ix)).copied().collect();
        if let Some(first) = overlap.first() {
            out.push(FieldCause::invalid(
                "status.failedIndexes",
                &json!(fi),
                &format!("failedIndexes and completedIndexes overlap at index: {first}"),
            ));
        }
    }
    if (changed("ready") || changed("active")) && count(new, "ready") > count(new, "active") {
        out.push(FieldCause::invalid(
            "status.ready",
            &json!(count(new, "ready")),
            "cannot set more ready pods than active",
        ));
    }
    let has_success_policy = new.pointer("/spec/successPolicy").is_some_and(|v| !v.is_null());
    if has_success_policy && !scm && complete {
        out.push(FieldCause::invalid_omit(
            "status.conditions",
            "cannot set Complete=True for Job with SuccessPolicy unless SuccessCriteriaMet=True",
        ));
    }
    if scm && failed {
        out.push(FieldCause::invalid_omit(
            "status.conditions",
            "cannot set SuccessCriteriaMet=True and Failed=true conditions",
        ));
    }
    if scm && failure_target {
        out.push(FieldCause::invalid_omit(
            "status.conditions",
            "cannot set SuccessCriteriaMet=True and FailureTarget=true conditions",
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A change applied to a test Job.
    type Mutation = Box<dyn FnOnce(&mut Value)>;

    fn job() -> Value {
        json!({
            "metadata": {"name": "pi", "namespace": "default", "uid": "u-1"},
            "spec": {"template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "pi", "image": "perl:5.34"}]
            }}}
        })
    }

    fn created(mut j: Value) -> Value {
        prepare_job_create(&mut j);
        j
    }

    fn fields(c: &[FieldCause]) -> Vec<String> {
        c.iter().map(|c| c.field.clone()).collect()
    }

    #[test]
    fn defaulting_table() {
        let j = created(job());
        let s = &j["spec"];
        assert_eq!(s["completions"], 1);
        assert_eq!(s["parallelism"], 1);
        assert_eq!(s["backoffLimit"], 6);
        assert_eq!(s["completionMode"], "NonIndexed");
        assert_eq!(s["suspend"], false);
        assert_eq!(s["manualSelector"], false);
        assert_eq!(s["podReplacementPolicy"], "TerminatingOrFailed");
        assert_eq!(s["template"]["spec"]["dnsPolicy"], "ClusterFirst");
        assert_eq!(s["template"]["spec"]["containers"][0]["imagePullPolicy"], "IfNotPresent");
        assert!(s["template"]["spec"].get("enableServiceLinks").is_none(), "pod-only default");

        // Work queue: parallelism set, completions unset stays unset.
        let mut wq = job();
        wq["spec"]["parallelism"] = json!(3);
        default_job(&mut wq);
        assert!(wq["spec"].get("completions").is_none());
        assert_eq!(wq["spec"]["parallelism"], 3);
        // Completions set alone: parallelism 1.
        let mut c = job();
        c["spec"]["completions"] = json!(5);
        default_job(&mut c);
        assert_eq!(c["spec"]["parallelism"], 1);
        // Per-index backoff: MaxInt32.
        let mut pi = job();
        pi["spec"]["backoffLimitPerIndex"] = json!(1);
        default_job(&mut pi);
        assert_eq!(pi["spec"]["backoffLimit"], 2147483647);
        // podFailurePolicy: Failed replacement and condition status True.
        let mut pf = job();
        pf["spec"]["podFailurePolicy"] = json!({"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]});
        default_job(&mut pf);
        assert_eq!(pf["spec"]["podReplacementPolicy"], "Failed");
        assert_eq!(
            pf["spec"]["podFailurePolicy"]["rules"][0]["onPodConditions"][0]["status"],
            "True"
        );
    }

    #[test]
    fn generated_selector_and_labels() {
        let j = created(job());
        assert_eq!(
            j["spec"]["selector"],
            json!({"matchLabels": {"batch.kubernetes.io/controller-uid": "u-1"}})
        );
        let tl = &j["spec"]["template"]["metadata"]["labels"];
        assert_eq!(tl["batch.kubernetes.io/controller-uid"], "u-1");
        assert_eq!(tl["controller-uid"], "u-1");
        assert_eq!(tl["batch.kubernetes.io/job-name"], "pi");
        assert_eq!(tl["job-name"], "pi");
        assert_eq!(&j["metadata"]["labels"], tl, "job labels mirror the template");
        assert!(validate_job_create(&j).is_empty(), "{:?}", validate_job_create(&j));

        // User labels on the Job are kept.
        let mut l = job();
        l["metadata"]["labels"] = json!({"team": "a"});
        let l = created(l);
        assert_eq!(l["metadata"]["labels"], json!({"team": "a"}));

        // A wrong generated label is invalid.
        let mut bad = job();
        bad["spec"]["template"]["metadata"] = json!({"labels": {"job-name": "other"}});
        let bad = created(bad);
        let c = validate_job_create(&bad);
        assert!(
            fields(&c).contains(&"spec.template.metadata.labels[job-name]".to_string()),
            "{c:?}"
        );

        // A user selector without manualSelector is "not auto-generated".
        let mut us = job();
        us["spec"]["selector"] = json!({"matchLabels": {"app": "x"}});
        us["spec"]["template"]["metadata"] = json!({"labels": {"app": "x"}});
        let us = created(us);
        let c = validate_job_create(&us);
        assert!(c.iter().any(|c| c.message.contains("`selector` not auto-generated")), "{c:?}");

        // manualSelector: selector required and must match template labels.
        let mut ms = job();
        ms["spec"]["manualSelector"] = json!(true);
        let ms = created(ms);
        let c = validate_job_create(&ms);
        assert_eq!(c[0].to_string(), "spec.selector: Required value");
        let mut ms = job();
        ms["spec"]["manualSelector"] = json!(true);
        ms["spec"]["selector"] = json!({"matchLabels": {"app": "x"}});
        ms["spec"]["template"]["metadata"] = json!({"labels": {"app": "y"}});
        let c = validate_job_create(&created(ms));
        assert!(
            c.iter().any(|c| c.field == "spec.template.metadata.labels"
                && c.message.ends_with("`selector` does not match template `labels`")),
            "{c:?}"
        );
    }

    fn causes_for(f: impl FnOnce(&mut Value)) -> Vec<FieldCause> {
        let mut j = job();
        f(&mut j);
        validate_job_create(&created(j))
    }

    /// Causes of creating the test Job with `patch` (a JSON merge patch) applied.
    fn causes_with(patch: Value) -> Vec<FieldCause> {
        causes_for(|j| crate::patch::merge_patch(j, &patch).expect("a valid merge patch"))
    }

    #[test]
    fn spec_validation_table() {
        let indexed = |mut spec: Value| {
            spec["completionMode"] = json!("Indexed");
            json!({"spec": spec})
        };
        let pod_spec = |pod: Value| json!({"spec": {"template": {"spec": pod}}});
        let cases: Vec<(Value, &str, &str)> = vec![
            (
                json!({"spec": {"parallelism": -1}}),
                "spec.parallelism",
                "Invalid value: -1: must be greater than or equal to 0",
            ),
            (
                json!({"spec": {"backoffLimit": -2}}),
                "spec.backoffLimit",
                "Invalid value: -2: must be greater than or equal to 0",
            ),
            (
                pod_spec(json!({"restartPolicy": "Always"})),
                "spec.template.spec.restartPolicy",
                "Required value: valid values: \"OnFailure\", \"Never\"",
            ),
            (
                json!({"spec": {"completionMode": "Sometimes"}}),
                "spec.completionMode",
                "Unsupported value: \"Sometimes\": supported values: \"NonIndexed\", \"Indexed\"",
            ),
            (
                indexed(json!({"parallelism": 2})),
                "spec.completions",
                "Required value: when completion mode is Indexed",
            ),
            (
                indexed(json!({"completions": 200_000, "parallelism": 100_001})),
                "spec.parallelism",
                "Invalid value: 100001: must be less than or equal to 100000 when completion mode is Indexed",
            ),
            (
                pod_spec(json!({"restartPolicy": "Sometimes"})),
                "spec.template.spec.restartPolicy",
                "Unsupported value: \"Sometimes\": supported values: \"OnFailure\", \"Never\"",
            ),
            (
                json!({"spec": {"backoffLimitPerIndex": 1}}),
                "spec.backoffLimitPerIndex",
                "Invalid value: 1: requires indexed completion mode",
            ),
            (
                indexed(json!({"completions": 3, "maxFailedIndexes": 1})),
                "spec.backoffLimitPerIndex",
                "Required value: when maxFailedIndexes is specified",
            ),
            (
                indexed(
                    json!({"completions": 3, "backoffLimitPerIndex": 1, "maxFailedIndexes": 4}),
                ),
                "spec.maxFailedIndexes",
                "Invalid value: 4: must be less than or equal to completions",
            ),
            (
                indexed(
                    json!({"completions": 200_000, "parallelism": 10, "backoffLimitPerIndex": 1}),
                ),
                "spec.maxFailedIndexes",
                "Required value: must be specified when completions is above 100000",
            ),
            (
                json!({"metadata": {"name": "a".repeat(62)},
                       "spec": {"completionMode": "Indexed", "completions": 10}}),
                "metadata.name",
                "will not able to create pod with invalid DNS label",
            ),
            (
                json!({"spec": {"podReplacementPolicy": "Sometimes"}}),
                "spec.podReplacementPolicy",
                "Unsupported value: \"Sometimes\"",
            ),
            (
                json!({"spec": {"managedBy": "nodomain"}}),
                "spec.managedBy",
                "must be a domain-prefixed path",
            ),
            (
                json!({"spec": {"managedBy": format!("example.com/{}", "a".repeat(60))}}),
                "spec.managedBy",
                "Too long: may not be more than 63 bytes",
            ),
            (
                pod_spec(json!({"containers": []})),
                "spec.template.spec.containers",
                "Required value",
            ),
            (
                json!({"spec": {"template": {"metadata": {"labels": {"bad key!": "x"}}}}}),
                "spec.template.metadata.labels",
                "Invalid value: \"bad key!\"",
            ),
        ];
        for (patch, field, msg) in cases {
            let c = causes_with(patch);
            assert!(
                c.iter().any(|c| c.field == field && c.message.contains(msg)),
                "want {field}: {msg}; got {c:?}"
            );
        }
        assert!(causes_with(json!({"spec": {"managedBy": "kjob.io/job-controller"}})).is_empty());
    }

    #[test]
    fn pod_failure_policy_rules() {
        let with_rules = |rules: Value| {
            causes_for(move |j| j["spec"]["podFailurePolicy"] = json!({"rules": rules}))
        };
        let ok = with_rules(json!([
            {"action": "FailJob", "onExitCodes": {"containerName": "pi", "operator": "In", "values": [1, 2, 42]}},
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
            {"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [0]}}
        ]));
        assert!(ok.is_empty(), "{ok:?}");
        let table: Vec<(Value, &str, &str)> = vec![
            (
                json!([{"action": "Explode", "onExitCodes": {"operator": "In", "values": [1]}}]),
                "spec.podFailurePolicy.rules[0].action",
                "Unsupported value: \"Explode\": supported values: \"Count\", \"FailIndex\", \"FailJob\", \"Ignore\"",
            ),
            (
                json!([{"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [1]}}]),
                "spec.podFailurePolicy.rules[0].action",
                "requires the backoffLimitPerIndex to be set",
            ),
            (
                json!([{"action": "FailJob"}]),
                "spec.podFailurePolicy.rules[0]",
                "specifying one of OnExitCodes and OnPodConditions is required",
            ),
            (
                json!([{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [1]}, "onPodConditions": [{"type": "X"}]}]),
                "spec.podFailurePolicy.rules[0]",
                "specifying both",
            ),
            (
                json!([{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [0, 1]}}]),
                "spec.podFailurePolicy.rules[0].onExitCodes.values[0]",
                "must not be 0 for the In operator",
            ),
            (
                json!([{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [2, 1]}}]),
                "spec.podFailurePolicy.rules[0].onExitCodes.values",
                "must be ordered",
            ),
            (
                json!([{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [1, 1]}}]),
                "spec.podFailurePolicy.rules[0].onExitCodes.values[1]",
                "Duplicate value: 1",
            ),
            (
                json!([{"action": "FailJob", "onExitCodes": {"operator": "In", "values": []}}]),
                "spec.podFailurePolicy.rules[0].onExitCodes.values",
                "at least one value is required",
            ),
            (
                json!([{"action": "FailJob", "onExitCodes": {"operator": "Is", "values": [1]}}]),
                "spec.podFailurePolicy.rules[0].onExitCodes.operator",
                "Unsupported value: \"Is\"",
            ),
            (
                json!([{"action": "FailJob", "onExitCodes": {"containerName": "nope", "operator": "In", "values": [1]}}]),
                "spec.podFailurePolicy.rules[0].onExitCodes.containerName",
                "must be one of the container or initContainer names",
            ),
            (
                json!([{"action": "Ignore", "onPodConditions": [{"type": "X", "status": "Maybe"}]}]),
                "spec.podFailurePolicy.rules[0].onPodConditions[0].status",
                "Unsupported value: \"Maybe\"",
            ),
            (
                json!(vec![json!({"action": "Ignore", "onPodConditions": [{"type": "X"}]}); 21]),
                "spec.podFailurePolicy.rules",
                "Too many: 21: must have at most 20 items",
            ),
        ];
        for (rules, field, msg) in table {
            let c = with_rules(rules.clone());
            assert!(
                c.iter().any(|c| c.field == field && c.message.contains(msg)),
                "{rules}: want {field}: {msg}; got {c:?}"
            );
        }
        let c = causes_for(|j| {
            j["spec"]["template"]["spec"]["restartPolicy"] = json!("OnFailure");
            j["spec"]["podFailurePolicy"] =
                json!({"rules": [{"action": "Ignore", "onPodConditions": [{"type": "X"}]}]});
        });
        assert!(
            c.iter().any(|c| c.field == "spec.template.spec.restartPolicy"
                && c.message.contains("only \"Never\"")),
            "{c:?}"
        );
        let c = causes_for(|j| {
            j["spec"]["podReplacementPolicy"] = json!("TerminatingOrFailed");
            j["spec"]["podFailurePolicy"] =
                json!({"rules": [{"action": "Ignore", "onPodConditions": [{"type": "X"}]}]});
        });
        assert!(c.iter().any(|c| c.field == "spec.podReplacementPolicy"), "{c:?}");
    }

    #[test]
    fn success_policy_and_indexes() {
        let indexed = |j: &mut Value| {
            j["spec"]["completionMode"] = json!("Indexed");
            j["spec"]["completions"] = json!(5);
            j["spec"]["parallelism"] = json!(5);
        };
        let ok = causes_for(|j| {
            indexed(j);
            j["spec"]["successPolicy"] =
                json!({"rules": [{"succeededIndexes": "0-2,4", "succeededCount": 3}]});
        });
        assert!(ok.is_empty(), "{ok:?}");
        let table: Vec<(Value, bool, &str, &str)> = vec![
            (
                json!({"rules": [{"succeededCount": 1}]}),
                false,
                "spec.successPolicy",
                "requires indexed completion mode",
            ),
            (
                json!({"rules": []}),
                true,
                "spec.successPolicy.rules",
                "at least one rules must be specified",
            ),
            (
                json!({"rules": [{}]}),
                true,
                "spec.successPolicy.rules[0]",
                "at least one of succeededCount or succeededIndexes",
            ),
            (
                json!({"rules": [{"succeededIndexes": "3-1"}]}),
                true,
                "spec.successPolicy.rules[0].succeededIndexes",
                "error parsing succeededIndexes",
            ),
            (
                json!({"rules": [{"succeededIndexes": "0-5"}]}),
                true,
                "spec.successPolicy.rules[0].succeededIndexes",
                "too large index: \"5\"",
            ),
            (
                json!({"rules": [{"succeededCount": 6}]}),
                true,
                "spec.successPolicy.rules[0].succeededCount",
                "(the number of specified completions)",
            ),
            (
                json!({"rules": [{"succeededIndexes": "0,1", "succeededCount": 3}]}),
                true,
                "spec.successPolicy.rules[0].succeededCount",
                "must be less than or equal to 2",
            ),
        ];
        for (sp, is_indexed, field, msg) in table {
            let c = causes_for(|j| {
                if is_indexed {
                    indexed(j);
                }
                j["spec"]["successPolicy"] = sp.clone();
            });
            assert!(
                c.iter().any(|c| c.field == field && c.message.contains(msg)),
                "{sp}: want {field}: {msg}; got {c:?}"
            );
        }
        assert_eq!(parse_indexes("0,2-4,7", 8), Ok(5));
        assert!(parse_indexes("2,1", 8).unwrap_err().contains("non-increasing"));
        assert!(parse_indexes("1-3,3", 8).is_err());
        assert!(parse_indexes("a", 8).unwrap_err().contains("cannot convert"));
        assert_eq!(parse_indexes("8", 8).unwrap_err(), "too large index: \"8\"");
        assert!(parse_indexes("3-3", 8).unwrap_err().contains("non-increasing order"));
        assert!(parse_indexes("1-2-3", 8).unwrap_err().contains("at most two parts"));
        assert_eq!(parse_indexes("", 8), Ok(0));
    }

    #[test]
    fn update_immutability() {
        let old = created(job());
        let mut ok = old.clone();
        ok["spec"]["parallelism"] = json!(3);
        ok["spec"]["suspend"] = json!(true);
        ok["spec"]["activeDeadlineSeconds"] = json!(60);
        ok["spec"]["backoffLimit"] = json!(2);
        assert!(validate_job_update(&ok, &old).is_empty(), "{:?}", validate_job_update(&ok, &old));

        let cases: Vec<(Mutation, &str, &str)> = vec![
            (
                Box::new(|j| j["spec"]["completions"] = json!(2)),
                "spec.completions",
                "field is immutable",
            ),
            (
                Box::new(|j| j["spec"]["selector"]["matchLabels"]["x"] = json!("y")),
                "spec.selector",
                "field is immutable",
            ),
            (
                Box::new(|j| j["spec"]["completionMode"] = json!("Indexed")),
                "spec.completionMode",
                "field is immutable",
            ),
            (
                Box::new(|j| j["spec"]["managedBy"] = json!("x.io/y")),
                "spec.managedBy",
                "field is immutable",
            ),
            (
                Box::new(|j| {
                    j["spec"]["template"]["spec"]["containers"][0]["image"] = json!("perl:6")
                }),
                "spec.template",
                "field is immutable",
            ),
        ];
        for (mutate, field, msg) in cases {
            let mut new = old.clone();
            mutate(&mut new);
            let c = validate_job_update(&new, &old);
            assert!(
                c.iter().any(|c| c.field == field && c.message.ends_with(msg)),
                "want {field}; got {c:?}"
            );
        }

        // Elastic indexed: completions may change together with parallelism.
        let mut ix = job();
        ix["spec"]["completionMode"] = json!("Indexed");
        ix["spec"]["completions"] = json!(3);
        ix["spec"]["parallelism"] = json!(3);
        let ix = created(ix);
        let mut scaled = ix.clone();
        scaled["spec"]["completions"] = json!(5);
        scaled["spec"]["parallelism"] = json!(5);
        assert!(validate_job_update(&scaled, &ix).is_empty());
        scaled["spec"]["parallelism"] = json!(4);
        let c = validate_job_update(&scaled, &ix);
        assert!(c.iter().any(|c| c.message.contains("in tandem with spec.parallelism")), "{c:?}");

        // Suspended, never started: scheduling directives and template labels are mutable.
        let mut sus = old.clone();
        sus["spec"]["suspend"] = json!(true);
        let mut moved = sus.clone();
        moved["spec"]["template"]["spec"]["nodeSelector"] = json!({"zone": "a"});
        moved["spec"]["template"]["metadata"]["annotations"] = json!({"a": "b"});
        moved["spec"]["template"]["spec"]["tolerations"] =
            json!([{"key": "k", "operator": "Exists"}]);
        moved["spec"]["template"]["spec"]["affinity"] = json!({"nodeAffinity": {}});
        assert!(
            validate_job_update(&moved, &sus).is_empty(),
            "{:?}",
            validate_job_update(&moved, &sus)
        );
        let mut started = sus.clone();
        started["status"] = json!({"startTime": "2025-01-01T00:00:00Z"});
        assert!(!validate_job_update(&moved, &started).is_empty());
        // Images stay immutable even when suspended.
        let mut img = sus.clone();
        img["spec"]["template"]["spec"]["containers"][0]["image"] = json!("perl:6");
        assert!(!validate_job_update(&img, &sus).is_empty());
    }

    fn with_status(status: Value) -> Value {
        let mut j = created(job());
        j["status"] = status;
        j
    }

    fn cond(ty: &str) -> Value {
        json!({"type": ty, "status": "True", "reason": "R", "message": "m"})
    }

    #[test]
    fn status_rules_accept_the_upstream_sequence() {
        let t0 = "2025-01-01T00:00:00Z";
        let t1 = "2025-01-01T00:01:00Z";
        let steps = [
            json!({}),
            json!({"startTime": t0, "active": 1, "ready": 0, "terminating": 0, "uncountedTerminatedPods": {}}),
            json!({"startTime": t0, "active": 0, "ready": 0, "terminating": 0, "uncountedTerminatedPods": {"succeeded": ["p1"]}}),
            json!({"startTime": t0, "active": 0, "succeeded": 1, "ready": 0, "terminating": 0, "uncountedTerminatedPods": {}}),
            json!({"startTime": t0, "active": 0, "succeeded": 1, "ready": 0, "terminating": 0, "uncountedTerminatedPods": {},
                   "conditions": [cond("SuccessCriteriaMet")]}),
            json!({"startTime": t0, "completionTime": t1, "active": 0, "succeeded": 1, "ready": 0, "terminating": 0,
                   "uncountedTerminatedPods": {}, "conditions": [cond("SuccessCriteriaMet"), cond("Complete")]}),
        ];
        for w in steps.windows(2) {
            let (old, new) = (with_status(w[0].clone()), with_status(w[1].clone()));
            let c = validate_job_status_update(&new, &old);
            assert!(c.is_empty(), "{} -> {}: {c:?}", w[0], w[1]);
        }
        let failing = [
            json!({"startTime": t0, "active": 1, "failed": 0}),
            json!({"startTime": t0, "active": 0, "failed": 7, "conditions": [cond("FailureTarget")]}),
            json!({"startTime": t0, "active": 0, "failed": 7, "conditions": [cond("FailureTarget"), cond("Failed")]}),
        ];
        for w in failing.windows(2) {
            let c =
                validate_job_status_update(&with_status(w[1].clone()), &with_status(w[0].clone()));
            assert!(c.is_empty(), "{} -> {}: {c:?}", w[0], w[1]);
        }
    }

    #[test]
    fn status_rules_reject() {
        let t0 = "2025-01-01T00:00:00Z";
        let t1 = "2025-01-01T00:01:00Z";
        let running = json!({"startTime": t0, "active": 1, "succeeded": 2, "failed": 1});
        let done = json!({"startTime": t0, "completionTime": t1, "succeeded": 3, "failed": 1,
            "conditions": [cond("SuccessCriteriaMet"), cond("Complete")]});
        let table: Vec<(Value, Value, &str, &str)> = vec![
            (
                running.clone(),
                json!({"startTime": t0, "active": -1, "succeeded": 2, "failed": 1}),
                "status.active",
                "must be greater than or equal to 0",
            ),
            (
                running.clone(),
                json!({"startTime": t0, "active": 1, "succeeded": 2, "failed": 0}),
                "status.failed",
                "cannot decrease the failed counter",
            ),
            (
                running.clone(),
                json!({"startTime": t0, "active": 1, "succeeded": 1, "failed": 1}),
                "status.succeeded",
                "cannot decrease the succeeded counter",
            ),
            (
                done.clone(),
                json!({"startTime": t0, "completionTime": t1, "succeeded": 3, "failed": 1, "conditions": [cond("SuccessCriteriaMet")]}),
                "status.conditions",
                "cannot disable the terminal Complete=True condition",
            ),
            (
                done.clone(),
                json!({"startTime": t0, "completionTime": "2025-01-01T00:02:00Z", "succeeded": 3, "failed": 1, "conditions": [cond("SuccessCriteriaMet"), cond("Complete")]}),
                "status.completionTime",
                "completionTime cannot be mutated",
            ),
            (
                running.clone(),
                json!({"startTime": t0, "succeeded": 3, "failed": 1, "conditions": [cond("SuccessCriteriaMet"), cond("Complete")]}),
                "status.completionTime",
                "completionTime is required for Complete jobs",
            ),
            (
                running.clone(),
                json!({"startTime": t0, "active": 1, "succeeded": 2, "failed": 1, "completionTime": t1}),
                "status.completionTime",
                "cannot set completionTime when there is no Complete=True condition",
            ),
            (
                running.clone(),
                json!({"startTime": t1, "completionTime": t0, "succeeded": 3, "failed": 1, "conditions": [cond("SuccessCriteriaMet"), cond("Complete")]}),
                "status.completionTime",
                "completionTime cannot be set before startTime",
            ),
            (
                running.clone(),
                json!({"startTime": t0, "completionTime": t1, "succeeded": 3, "failed": 1, "conditions": [cond("Complete")]}),
                "status.conditions",
                "without the SuccessCriteriaMet=true condition",
            ),
            (
                running.clone(),
                json!({"startTime": t0, "failed": 1, "succeeded": 2, "conditions": [cond("Failed")]}),
                "status.conditions",
                "without the FailureTarget=true condition",
            ),
            (
                running.clone(),
                json!({"startTime": t0, "active": 1, "failed": 1, "succeeded": 2, "conditions": [cond("FailureTarget"), cond("Failed")]}),
                "status.active",
                "active>0 is invalid for finished job",
            ),
            (
                running.clone(),
                json!({"startTime": t0, "terminating": 1, "failed": 1, "succeeded": 2, "conditions": [cond("FailureTarget"), cond("Failed")]}),
                "status.terminating",
                "terminating>0 is invalid for finished job",
            ),
            (
                json!({}),
                json!({"failed": 1, "conditions": [cond("FailureTarget"), cond("Failed")]}),
                "status.startTime",
                "startTime is required for finished job",
            ),
            (
                running.clone(),
                json!({"startTime": t0, "failed": 1, "succeeded": 2, "uncountedTerminatedPods": {"failed": ["x"]}, "conditions": [cond("FailureTarget"), cond("Failed")]}),
                "status.uncountedTerminatedPods",
                "needs to be empty for finished job",
            ),
            (
                running.clone(),
                json!({"startTime": t0, "active": 1, "succeeded": 2, "failed": 1, "uncountedTerminatedPods": {"succeeded": ["a", "a"]}}),
                "status.uncountedTerminatedPods.succeeded[1]",
                "Duplicate value: \"a\"",
            ),
            (
                running.clone(),
                json!({"startTime": t0, "active": 1, "succeeded": 2, "failed": 1, "uncountedTerminatedPods": {"failed": [""]}}),
                "status.uncountedTerminatedPods.failed[0]",
                "must not be empty",
            ),
            (
                running.clone(),
                json!({"active": 1, "succeeded": 2, "failed": 1}),
                "status.startTime",
                "startTime cannot be removed for unsuspended job",
            ),
            (
                running.clone(),
                json!({"startTime": t0, "completionTime": t1, "succeeded": 3, "failed": 1, "conditions": [cond("SuccessCriteriaMet"), cond("Complete"), cond("FailureTarget")]}),
                "status.conditions",
                "cannot set Complete=True and FailureTarget=true conditions",
            ),
            (
                running.clone(),
                json!({"startTime": t0, "succeeded": 3, "failed": 1, "completionTime": t1, "conditions": [cond("SuccessCriteriaMet"), cond("FailureTarget"), cond("Failed"), cond("Complete")]}),
                "status.conditions",
                "cannot set Complete=True and Failed=true conditions",
            ),
            (
                running.clone(),
                json!({"startTime": t0, "active": 1, "succeeded": 2, "failed": 1, "conditions": [cond("SuccessCriteriaMet"), cond("FailureTarget")]}),
                "status.conditions",
                "cannot set SuccessCriteriaMet=True and FailureTarget=true conditions",
            ),
            (
                running.clone(),
                json!({"startTime": t0, "active": 1, "succeeded": 2, "failed": 1, "completedIndexes": "0"}),
                "status.completedIndexes",
                "cannot set non-empty completedIndexes when non-indexed completion mode",
            ),
            (
                running.clone(),
                json!({"startTime": t0, "active": 1, "succeeded": 2, "failed": 1, "failedIndexes": "0"}),
                "status.failedIndexes",
                "cannot set non-null failedIndexes when backoffLimitPerIndex is null",
            ),
        ];
        let mut table = table;
        table.push((
            running.clone(),
            json!({"startTime": t0, "active": 1, "ready": 2, "succeeded": 2, "failed": 1}),
            "status.ready",
            "cannot set more ready pods than active",
        ));
        for (old, new, field, msg) in table {
            let c =
                validate_job_status_update(&with_status(new.clone()), &with_status(old.clone()));
            assert!(
                c.iter().any(|c| c.field == field && c.message.contains(msg)),
                "{old} -> {new}: want {field}: {msg}; got {c:?}"
            );
        }
    }

    #[test]
    fn status_rules_indexed() {
        let mut j = job();
        j["spec"]["completionMode"] = json!("Indexed");
        j["spec"]["completions"] = json!(4);
        j["spec"]["parallelism"] = json!(4);
        j["spec"]["backoffLimitPerIndex"] = json!(1);
        let base = created(j);
        let with = |s: Value| {
            let mut x = base.clone();
            x["status"] = s;
            x
        };
        let old = with(json!({"startTime": "2025-01-01T00:00:00Z", "active": 4}));
        let ok = with(
            json!({"startTime": "2025-01-01T00:00:00Z", "active": 2, "succeeded": 1, "failed": 1, "completedIndexes": "0", "failedIndexes": "1"}),
        );
        assert!(
            validate_job_status_update(&ok, &old).is_empty(),
            "{:?}",
            validate_job_status_update(&ok, &old)
        );
        let overlap = with(
            json!({"startTime": "2025-01-01T00:00:00Z", "active": 2, "succeeded": 1, "failed": 1, "completedIndexes": "0-1", "failedIndexes": "1"}),
        );
        let c = validate_job_status_update(&overlap, &old);
        assert!(
            c.iter().any(|c| c.field == "status.failedIndexes" && c.message.contains("overlap")),
            "{c:?}"
        );
        let bad = with(
            json!({"startTime": "2025-01-01T00:00:00Z", "active": 2, "succeeded": 1, "completedIndexes": "4"}),
        );
        let c = validate_job_status_update(&bad, &old);
        assert!(
            c.iter().any(|c| c.field == "status.completedIndexes"
                && c.message.contains("error parsing completedIndexes: too large index: \"4\"")),
            "{c:?}"
        );
        // Elastic indexed jobs may lower succeeded.
        let high = with(
            json!({"startTime": "2025-01-01T00:00:00Z", "succeeded": 3, "completedIndexes": "0-2"}),
        );
        let low = with(
            json!({"startTime": "2025-01-01T00:00:00Z", "succeeded": 2, "completedIndexes": "0-1"}),
        );
        assert!(validate_job_status_update(&low, &high).is_empty());
    }
}
