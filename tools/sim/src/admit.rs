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
        StoreKind::Event | StoreKind::Lease => {}
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
