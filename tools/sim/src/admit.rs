//! The per-kind admission steps the registry runs on every write (defaulting, generated
//! fields, validation) and the patch dispatch, delegating the rule tables to `admission` and
//! `patch`.

use serde_json::{Value, json};

use crate::admission::{FieldCause, job, pod};
use crate::error::{ApiError, Cause};
use crate::patch::{self, PatchError};
use crate::registry::{Part, PatchType};
use crate::resources::{Resource, StoreKind};

/// A patch that could not be applied.
#[derive(Debug)]
pub struct PatchFailure(pub PatchError);

impl PatchFailure {
    /// The API error the real server answers with.
    pub fn into_api_error(self, res: &Resource, name: &str) -> ApiError {
        match self.0 {
            PatchError::BadRequest(m) => ApiError::bad_request(m),
            PatchError::Invalid(m) => ApiError::patch_invalid(&m),
            PatchError::Conflict(_) => ApiError::conflict_modified(res, name),
            e @ PatchError::TooManyOperations(_) => ApiError::too_large(e.to_string()),
        }
    }
}

fn causes(list: Vec<FieldCause>) -> Result<(), Vec<Cause>> {
    if list.is_empty() {
        return Ok(());
    }
    Err(list
        .into_iter()
        .map(|c| Cause { reason: c.reason, message: c.message, field: c.field })
        .collect())
}

/// Create-time admission: server defaults, generated fields and validation.
pub fn on_create(res: &Resource, obj: &mut Value) -> Result<(), Vec<Cause>> {
    match res.store {
        StoreKind::Namespace => {
            let name = obj["metadata"]["name"].clone();
            obj["metadata"]["labels"]["kubernetes.io/metadata.name"] = name;
            let fins = obj.pointer("/spec/finalizers").cloned().unwrap_or(json!([]));
            let mut list: Vec<Value> = fins.as_array().cloned().unwrap_or_default();
            if !list.iter().any(|f| f == "kubernetes") {
                list.push(json!("kubernetes"));
            }
            obj["spec"] = json!({"finalizers": list});
            obj["status"] = json!({"phase": "Active"});
        }
        StoreKind::Pod => {
            pod::default_pod(obj);
            causes(pod::validate_pod_create(obj))?;
            let qos = pod::qos_class(obj);
            obj["status"] = json!({"phase": "Pending", "qosClass": qos});
        }
        StoreKind::Job => {
            job::prepare_job_create(obj);
            causes(job::validate_job_create(obj))?;
            obj["metadata"]["generation"] = json!(1);
        }
        StoreKind::Event => {
            // events.k8s.io/v1 events (and core events carrying eventTime) are validated
            // strictly; legacy core events loosely.
            if res.events_v1 || obj.get("eventTime").is_some_and(|v| !v.is_null()) {
                causes(validate_new_event(obj))?;
            }
        }
        StoreKind::Lease => causes(validate_lease(obj))?,
        StoreKind::PriorityClass => {
            default_priority_class(obj);
            causes(validate_priority_class(obj))?;
        }
    }
    Ok(())
}

/// The object of a create as the real server's field manager sees it: decoded with the API
/// defaults applied, before the strategy (generated selector and labels, status reset) and the
/// admission plugins (service account, priority, tolerations) add what nobody owns.
pub fn create_defaults(res: &Resource, obj: &Value) -> Value {
    let mut out = obj.clone();
    match res.store {
        StoreKind::Pod => {
            if let Some(spec) = out.get_mut("spec") {
                pod::default_pod_spec(spec);
                if let Some(m) = spec.as_object_mut() {
                    m.entry("enableServiceLinks").or_insert(json!(true));
                }
            }
        }
        StoreKind::Job => job::default_job(&mut out),
        StoreKind::Namespace => {
            let name = out["metadata"]["name"].clone();
            out["metadata"]["labels"]["kubernetes.io/metadata.name"] = name;
        }
        StoreKind::PriorityClass => default_priority_class(&mut out),
        StoreKind::Event | StoreKind::Lease => {}
    }
    out
}

/// The PriorityClasses kube-apiserver creates at start (name, value, description), the only
/// ones whose names may begin with `system-`.
pub const SYSTEM_PRIORITY_CLASSES: [(&str, i64, &str); 2] = [
    (
        "system-node-critical",
        2_000_001_000,
        "Used for system critical pods that must not be moved from their current node.",
    ),
    (
        "system-cluster-critical",
        2_000_000_000,
        "Used for system critical pods that must run in the cluster, but can be moved to another node if necessary.",
    ),
];

/// The Priority admission plugin on a PriorityClass create: the name of an existing global
/// default when `pc` would be a second one.
pub fn second_default(classes: &[std::sync::Arc<crate::store::Obj>], pc: &Value) -> Option<String> {
    if !pc.get("globalDefault").and_then(Value::as_bool).unwrap_or(false) {
        return None;
    }
    classes
        .iter()
        .map(|c| c.value())
        .find(|c| c.get("globalDefault").and_then(Value::as_bool).unwrap_or(false))
        .and_then(|c| c["metadata"]["name"].as_str().map(str::to_owned))
}

/// The Priority admission plugin on a pod create: the pod's `priorityClassName` names its
/// priority (its class's value and preemption policy); without one it gets the global default
/// class (the lowest-valued if several) or priority 0. A class that does not exist, or a
/// `priority` / `preemptionPolicy` the pod sets that its class does not give, is refused with
/// the plugin's message.
pub fn pod_priority(
    classes: &[std::sync::Arc<crate::store::Obj>],
    pod: &mut Value,
) -> Result<(), String> {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else { return Ok(()) };
    let named = spec.get("priorityClassName").and_then(Value::as_str).unwrap_or_default();
    let class = if named.is_empty() {
        classes
            .iter()
            .map(|c| c.value())
            .filter(|c| c.get("globalDefault").and_then(Value::as_bool).unwrap_or(false))
            .min_by_key(|c| c.get("value").and_then(Value::as_i64).unwrap_or(0))
    } else {
        let found = classes.iter().map(|c| c.value()).find(|c| c["metadata"]["name"] == named);
        Some(found.ok_or_else(|| format!("no PriorityClass with name {named} was found"))?)
    };
    let (priority, policy) = match class {
        Some(c) => {
            if named.is_empty() {
                spec.insert("priorityClassName".into(), c["metadata"]["name"].clone());
            }
            (
                c.get("value").and_then(Value::as_i64).unwrap_or(0),
                c.get("preemptionPolicy").cloned(),
            )
        }
        None => (0, None),
    };
    if let Some(given) = spec.get("priority").and_then(Value::as_i64)
        && given != priority
    {
        return Err(format!(
            "the integer value of priority ({given}) must not be provided in pod spec; priority admission controller computed {priority} from the given PriorityClass name"
        ));
    }
    spec.insert("priority".into(), json!(priority));
    if let Some(policy) = policy.filter(|p| !p.is_null()) {
        if let Some(given) = spec.get("preemptionPolicy").filter(|g| !g.is_null())
            && *given != policy
        {
            return Err(format!(
                "the string value of PreemptionPolicy ({}) must not be provided in pod spec; priority admission controller computed {} from the given PriorityClass name",
                given.as_str().unwrap_or_default(),
                policy.as_str().unwrap_or_default()
            ));
        }
        spec.insert("preemptionPolicy".into(), policy);
    }
    Ok(())
}

/// The highest value a PriorityClass not of the system may have.
const HIGHEST_USER_DEFINABLE_PRIORITY: i64 = 1_000_000_000;

/// `SetDefaults_PriorityClass`.
fn default_priority_class(obj: &mut Value) {
    if obj.get("preemptionPolicy").is_none_or(Value::is_null) {
        obj["preemptionPolicy"] = json!("PreemptLowerPriority");
    }
}

fn forbidden(field: &str, message: String) -> FieldCause {
    FieldCause {
        reason: "FieldValueForbidden".into(),
        message: format!("Forbidden: {message}"),
        field: field.into(),
    }
}

/// `ValidatePriorityClass`: `system-` names are reserved for the system's classes (with their
/// values), other classes stay at or below 1,000,000,000.
fn validate_priority_class(pc: &Value) -> Vec<FieldCause> {
    let name = pc["metadata"]["name"].as_str().unwrap_or_default();
    let value = pc.get("value").and_then(Value::as_i64).unwrap_or(0);
    let global = pc.get("globalDefault").and_then(Value::as_bool).unwrap_or(false);
    let mut out = Vec::new();
    if name.starts_with("system-") {
        let why = match SYSTEM_PRIORITY_CLASSES.iter().find(|(n, ..)| *n == name) {
            None => Some(format!("{name} is not a known system priority class")),
            Some((_, v, _)) if *v != value => {
                Some(format!("value of {name} PriorityClass must be {v}"))
            }
            Some(_) if global => {
                Some(format!("globalDefault of {name} PriorityClass must be false"))
            }
            Some(_) => None,
        };
        if let Some(why) = why {
            out.push(forbidden(
                "metadata.name",
                format!(
                    "priority class names with 'system-' prefix are reserved for system use only. error: {why}"
                ),
            ));
        }
    } else if value > HIGHEST_USER_DEFINABLE_PRIORITY {
        out.push(forbidden(
            "value",
            format!(
                "maximum allowed value of a user defined priority is {HIGHEST_USER_DEFINABLE_PRIORITY}"
            ),
        ));
    }
    out
}

/// `ValidatePriorityClassUpdate`: the value and the preemption policy never change.
fn validate_priority_class_update(new: &Value, cur: &Value) -> Vec<FieldCause> {
    let mut out = Vec::new();
    if new.get("value") != cur.get("value") {
        out.push(forbidden("value", "may not be changed in an update.".into()));
    }
    if new.get("preemptionPolicy") != cur.get("preemptionPolicy") {
        out.push(FieldCause {
            reason: "FieldValueInvalid".into(),
            message: format!(
                "Invalid value: {}: field is immutable",
                new.get("preemptionPolicy")
                    .and_then(Value::as_str)
                    .map_or("null".into(), |p| format!("\"{p}\""))
            ),
            field: "preemptionPolicy".into(),
        });
    }
    out
}

fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

fn validate_new_event(ev: &Value) -> Vec<FieldCause> {
    let mut out = Vec::new();
    let mut req = |field: &str, ok: bool| {
        if !ok {
            out.push(FieldCause {
                reason: "FieldValueRequired".into(),
                message: "Required value".into(),
                field: field.into(),
            });
        }
    };
    req("eventTime", ev.get("eventTime").is_some_and(|v| !v.is_null()));
    req("reportingController", !text(ev, "reportingComponent").is_empty());
    req("reportingInstance", !text(ev, "reportingInstance").is_empty());
    req("action", !text(ev, "action").is_empty());
    req("reason", !text(ev, "reason").is_empty());
    for (field, stored, max) in [
        ("reportingInstance", "reportingInstance", 128),
        ("action", "action", 128),
        ("reason", "reason", 128),
        ("note", "message", 1024),
    ] {
        if text(ev, stored).len() > max {
            out.push(FieldCause {
                reason: "FieldValueTooLong".into(),
                message: format!("Too long: may not be more than {max} bytes"),
                field: field.into(),
            });
        }
    }
    let typ = text(ev, "type");
    if typ != "Normal" && typ != "Warning" {
        out.push(FieldCause {
            reason: "FieldValueInvalid".into(),
            message: format!("Invalid value: \"{typ}\": has invalid value: {typ}"),
            field: "type".into(),
        });
    }
    out
}

fn validate_lease(lease: &Value) -> Vec<FieldCause> {
    let mut out = Vec::new();
    if let Some(d) = lease.pointer("/spec/leaseDurationSeconds").and_then(Value::as_i64)
        && d <= 0
    {
        out.push(FieldCause {
            reason: "FieldValueInvalid".into(),
            message: format!("Invalid value: {d}: must be greater than 0"),
            field: "spec.leaseDurationSeconds".into(),
        });
    }
    if let Some(t) = lease.pointer("/spec/leaseTransitions").and_then(Value::as_i64)
        && t < 0
    {
        out.push(FieldCause {
            reason: "FieldValueInvalid".into(),
            message: format!("Invalid value: {t}: must be greater than or equal to 0"),
            field: "spec.leaseTransitions".into(),
        });
    }
    out
}

/// Update-time admission (main resource or `/status`), after the generic rules ran.
pub fn on_update(
    res: &Resource,
    cur: &Value,
    new: &mut Value,
    part: Part,
) -> Result<(), Vec<Cause>> {
    match (res.store, part) {
        (StoreKind::Namespace, Part::Main) => {
            let name = cur["metadata"]["name"].clone();
            new["metadata"]["labels"]["kubernetes.io/metadata.name"] = name;
        }
        (StoreKind::Job, Part::Main) => {
            job::default_job(new);
            causes(job::validate_job_update(new, cur))?;
        }
        (StoreKind::Lease, _) => causes(validate_lease(new))?,
        (StoreKind::PriorityClass, _) => {
            default_priority_class(new);
            causes(validate_priority_class_update(new, cur))?;
        }
        (StoreKind::Job, Part::Status) => causes(job::validate_job_status_update(new, cur))?,
        (StoreKind::Pod, Part::Main) => {
            pod::default_pod(new);
            causes(pod::validate_pod_update(new, cur))?;
        }
        (StoreKind::Pod, Part::Status) => {
            if new.pointer("/status/qosClass").is_none()
                && let Some(q) = cur.pointer("/status/qosClass")
            {
                new["status"]["qosClass"] = q.clone();
            }
            causes(pod::validate_pod_status_update(new, cur))?;
        }
        _ => {}
    }
    Ok(())
}

/// Applies a JSON, merge or strategic merge patch to the object as served (`view`).
pub fn patch_object(
    res: &Resource,
    view: &Value,
    ptype: PatchType,
    body: &Value,
) -> Result<Value, PatchFailure> {
    let mut doc = view.clone();
    match ptype {
        PatchType::Json => patch::json_patch(&mut doc, body),
        PatchType::Merge => patch::merge_patch(&mut doc, body),
        PatchType::Strategic => patch::strategic_merge_patch(&mut doc, body, res.kind),
        PatchType::Apply => {
            return patch::apply(Some(view), body, "", false, res.kind).map_err(PatchFailure);
        }
    }
    .map_err(PatchFailure)?;
    Ok(doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn new_style_events_need_their_fields() {
        let ok = json!({"eventTime": "2025-01-01T00:00:00.000000Z", "reportingComponent": "a.io/b",
            "reportingInstance": "i", "action": "A", "reason": "R", "type": "Normal"});
        assert!(validate_new_event(&ok).is_empty());
        let bad = json!({"type": "Odd"});
        let fields: Vec<String> = validate_new_event(&bad).into_iter().map(|c| c.field).collect();
        assert_eq!(
            fields,
            ["eventTime", "reportingController", "reportingInstance", "action", "reason", "type"]
        );
    }

    #[test]
    fn lease_durations_must_be_positive() {
        assert!(validate_lease(&json!({"spec": {"leaseDurationSeconds": 15}})).is_empty());
        assert_eq!(
            validate_lease(&json!({"spec": {"leaseDurationSeconds": 0}}))[0].field,
            "spec.leaseDurationSeconds"
        );
    }
}
