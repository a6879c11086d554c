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
        StoreKind::Event | StoreKind::Lease => {}
    }
    Ok(())
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
        PatchType::Apply => return apply_patch(res, Some(view), body, "", false),
    }
    .map_err(PatchFailure)?;
    Ok(doc)
}

/// Server-side apply of `applied` onto `live` (absent: the object to create).
pub fn apply_patch(
    res: &Resource,
    live: Option<&Value>,
    applied: &Value,
    field_manager: &str,
    force: bool,
) -> Result<Value, PatchFailure> {
    patch::apply(live, applied, field_manager, force, res.kind).map_err(PatchFailure)
}
