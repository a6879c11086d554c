//! Subresources with their own semantics: `pods/binding`, `pods/eviction`,
//! `namespaces/finalize`.

use std::sync::Arc;

use jiff::Timestamp;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::registry::{self, DeleteOpts, format_time};
use crate::resources::StoreKind;
use crate::store::{Key, Mutation, Obj, Store, Written};

fn set_condition(pod: &mut Value, cond: Value) {
    let typ = cond["type"].clone();
    let conds = pod["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let mut out: Vec<Value> = conds.into_iter().filter(|c| c["type"] != typ).collect();
    out.push(cond);
    pod["status"]["conditions"] = Value::Array(out);
}

/// `POST pods/{name}/binding`: assigns the node (once) and marks the pod scheduled.
pub fn bind(
    store: &Store,
    ns: &str,
    name: &str,
    body: &Value,
    now: Timestamp,
) -> Result<(), ApiError> {
    let res = StoreKind::Pod.resource();
    let node = body.pointer("/target/name").and_then(Value::as_str).unwrap_or_default().to_owned();
    if node.is_empty() {
        return Err(ApiError::invalid(
            res,
            name,
            vec![crate::error::Cause::new("FieldValueRequired", "Required value", "target.name")],
        ));
    }
    let key: Key = (ns.to_owned(), name.to_owned());
    store.mutate(StoreKind::Pod, &key, |cur, _| {
        let cur = cur.ok_or_else(|| ApiError::not_found(res, name))?;
        if cur["metadata"].get("deletionTimestamp").is_some() {
            return Err(ApiError::conflict(res, name, "pod is being deleted, cannot be assigned to a host"));
        }
        if let Some(existing) = cur.pointer("/spec/nodeName").and_then(Value::as_str).filter(|s| !s.is_empty()) {
            return Err(ApiError::conflict(res, name, &format!("pod {name} is already assigned to node \"{existing}\"")));
        }
        let mut pod = (**cur).clone();
        pod["spec"]["nodeName"] = json!(node);
        set_condition(
            &mut pod,
            json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": format_time(now)}),
        );
        Ok((Mutation::Put(pod), ()))
    })?;
    Ok(())
}

/// `POST pods/{name}/eviction`: marks the pod `DisruptionTarget` and deletes it gracefully.
pub fn evict(
    store: &Store,
    ns: &str,
    name: &str,
    body: &Value,
    now: Timestamp,
) -> Result<(), ApiError> {
    let res = StoreKind::Pod.resource();
    let key: Key = (ns.to_owned(), name.to_owned());
    let opts = match body.get("deleteOptions") {
        Some(o) if o.is_object() => DeleteOpts::from_json(o)?,
        _ => DeleteOpts::default(),
    };
    store.mutate(StoreKind::Pod, &key, |cur, _| {
        let cur = cur.ok_or_else(|| ApiError::not_found(res, name))?;
        let phase = cur.pointer("/status/phase").and_then(Value::as_str).unwrap_or_default();
        if cur["metadata"].get("deletionTimestamp").is_some()
            || phase == "Succeeded"
            || phase == "Failed"
        {
            return Ok((Mutation::Unchanged, ()));
        }
        let mut pod = (**cur).clone();
        set_condition(
            &mut pod,
            json!({"type": "DisruptionTarget", "status": "True", "lastProbeTime": null,
                   "lastTransitionTime": format_time(now), "reason": "EvictionByEvictionAPI",
                   "message": "Eviction API: evicting"}),
        );
        Ok((Mutation::Put(pod), ()))
    })?;
    registry::delete(store, res, Some(ns), name, &opts, now)?;
    Ok(())
}

/// `PUT namespaces/{name}/finalize`: replaces `spec.finalizers`; a terminating namespace with
/// none left is removed.
pub fn finalize_namespace(store: &Store, name: &str, body: &Value) -> Result<Arc<Obj>, ApiError> {
    let res = StoreKind::Namespace.resource();
    let key: Key = (String::new(), name.to_owned());
    let fins = body.pointer("/spec/finalizers").cloned().unwrap_or(json!([]));
    let (written, ()) = store.mutate(StoreKind::Namespace, &key, |cur, _| {
        let cur = cur.ok_or_else(|| ApiError::not_found(res, name))?;
        let mut ns = (**cur).clone();
        if fins.as_array().is_none_or(Vec::is_empty) {
            if let Some(spec) = ns.get_mut("spec").and_then(Value::as_object_mut) {
                spec.remove("finalizers");
            }
        } else {
            ns["spec"]["finalizers"] = fins.clone();
        }
        if ns == *cur.value() {
            return Ok((Mutation::Unchanged, ()));
        }
        Ok((Mutation::Put(ns), ()))
    })?;
    match written {
        Written::Unchanged(Some(o))
        | Written::Created(o)
        | Written::Updated(o)
        | Written::Deleted(o) => Ok(o),
        Written::Unchanged(None) => Err(ApiError::not_found(res, name)),
    }
}
