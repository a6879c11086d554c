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

/// A `POST` on a subresource of one pod (`binding`, `eviction`), and when it arrived.
#[derive(Debug, Clone, Copy)]
pub struct PodCall<'a> {
    /// The store holding the pod.
    pub store: &'a Store,
    /// The pod's namespace.
    pub ns: &'a str,
    /// The pod's name.
    pub name: &'a str,
    /// When the call arrived.
    pub now: Timestamp,
}

impl PodCall<'_> {
    /// Applies `change` to the stored pod (not found when it is absent); `None` from `change`
    /// leaves it as it is.
    fn mutate(
        self,
        change: impl FnOnce(&Value) -> Result<Option<Value>, ApiError>,
    ) -> Result<(), ApiError> {
        let res = StoreKind::Pod.resource();
        let key: Key = (self.ns.to_owned(), self.name.to_owned());
        self.store.mutate(StoreKind::Pod, &key, |cur, _| {
            let cur = cur.ok_or_else(|| ApiError::not_found(res, self.name))?;
            Ok((change(cur.value())?.map_or(Mutation::Unchanged, Mutation::Put), ()))
        })?;
        Ok(())
    }

    /// `POST pods/{name}/binding`: assigns the node (once) and marks the pod scheduled.
    pub fn bind(self, body: &Value) -> Result<(), ApiError> {
        let (res, name, now) = (StoreKind::Pod.resource(), self.name, self.now);
        let node =
            body.pointer("/target/name").and_then(Value::as_str).unwrap_or_default().to_owned();
        if node.is_empty() {
            return Err(ApiError::invalid_field(
                res,
                name,
                "FieldValueRequired",
                "Required value",
                "target.name",
            ));
        }
        self.mutate(|cur| {
            if cur["metadata"].get("deletionTimestamp").is_some() {
                return Err(ApiError::conflict(res, name, "pod is being deleted, cannot be assigned to a host"));
            }
            if let Some(existing) = cur.pointer("/spec/nodeName").and_then(Value::as_str).filter(|s| !s.is_empty()) {
                return Err(ApiError::conflict(res, name, &format!("pod {name} is already assigned to node \"{existing}\"")));
            }
            let mut pod = cur.clone();
            pod["spec"]["nodeName"] = json!(node);
            set_condition(
                &mut pod,
                json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": format_time(now)}),
            );
            Ok(Some(pod))
        })
    }

    /// `POST pods/{name}/eviction`: marks the pod `DisruptionTarget` and deletes it gracefully.
    pub fn evict(self, body: &Value) -> Result<(), ApiError> {
        let opts = match body.get("deleteOptions") {
            Some(o) if o.is_object() => DeleteOpts::from_json(o)?,
            _ => DeleteOpts::default(),
        };
        self.mutate(|cur| {
            let phase = cur.pointer("/status/phase").and_then(Value::as_str).unwrap_or_default();
            if cur["metadata"].get("deletionTimestamp").is_some()
                || phase == "Succeeded"
                || phase == "Failed"
            {
                return Ok(None);
            }
            let mut pod = cur.clone();
            set_condition(
                &mut pod,
                json!({"type": "DisruptionTarget", "status": "True", "lastProbeTime": null,
                       "lastTransitionTime": format_time(self.now), "reason": "EvictionByEvictionAPI",
                       "message": "Eviction API: evicting"}),
            );
            Ok(Some(pod))
        })?;
        let res = StoreKind::Pod.resource();
        registry::delete(self.store, res, Some(self.ns), self.name, &opts, self.now)?;
        Ok(())
    }
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
