//! JSON merge patch (RFC 7386), strategic merge patch and a minimal server-side apply.

use serde_json::{Map, Value};

use super::PatchError;
use super::strategy::{ListStrategy, list_strategy};
use crate::ownership::schema::{ListType, ObjType, list_type, obj_type};
use crate::resources::StoreKind;

// The list semantics of server-side apply (`+listType` of the Go types) in terms of the merger.
// Lists keyed by several fields (container ports) merge by their first key.
fn apply_strategy(kind: &str, path: &[&str]) -> ListStrategy {
    let Some(store) = StoreKind::ALL.into_iter().find(|k| {
        let r = k.resource();
        kind.eq_ignore_ascii_case(r.kind) || kind.eq_ignore_ascii_case(r.plural)
    }) else {
        return ListStrategy::Replace;
    };
    match list_type(store, path) {
        ListType::Atomic => ListStrategy::Replace,
        ListType::Set => ListStrategy::MergePrimitives,
        ListType::Map(keys) => ListStrategy::MergeByKey(keys[0]),
    }
}

const DIRECTIVE: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList/";
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";

/// Applies an RFC 7386 JSON merge patch: objects merge recursively, `null` deletes a key and
/// arrays are replaced wholesale. A non-object patch is a 400.
pub fn merge_patch(doc: &mut Value, patch: &Value) -> Result<(), PatchError> {
    if !patch.is_object() {
        return Err(PatchError::BadRequest("Invalid JSON Patch".into()));
    }
    merge_value(doc, patch);
    Ok(())
}

fn merge_value(doc: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *doc = patch.clone();
        return;
    };
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    let Value::Object(d) = doc else { return };
    for (k, v) in p {
        if v.is_null() {
            d.shift_remove(k);
        } else {
            let slot = d.entry(k.clone()).or_insert(Value::Null);
            merge_value(slot, v);
        }
    }
}

/// Whether merging produced a value to keep or asked to delete the enclosing map.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Keep,
    Delete,
}

/// Strategic merge patch vs server-side apply differences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `$`-directives honoured, `null` deletes.
    Strategic,
    /// Applied configuration: `null` leaves the field alone.
    Apply,
}

struct Merger<'a> {
    kind: &'a str,
    mode: Mode,
    path: Vec<String>,
}

impl Merger<'_> {
    fn path_refs(&self) -> Vec<&str> {
        self.path.iter().map(String::as_str).collect()
    }

    fn strategy_for(&mut self, field: &str) -> ListStrategy {
        self.path.push(field.to_string());
        let s = match self.mode {
            Mode::Strategic => list_strategy(self.kind, &self.path_refs()),
            Mode::Apply => apply_strategy(self.kind, &self.path_refs()),
        };
        self.path.pop();
        s
    }

    // An atomic struct (a label selector, an object reference) is replaced by an apply.
    fn atomic_struct(&mut self, field: &str) -> bool {
        if self.mode != Mode::Apply {
            return false;
        }
        self.path.push(field.to_string());
        let atomic = obj_type(&self.path_refs()) == ObjType::Atomic;
        self.path.pop();
        atomic
    }

    fn merge_map(
        &mut self,
        orig: &mut Map<String, Value>,
        patch: &Map<String, Value>,
    ) -> Result<Outcome, PatchError> {
        if self.mode == Mode::Strategic {
            match patch.get(DIRECTIVE).map(|d| d.as_str()) {
                None | Some(Some("merge")) => {}
                Some(Some("replace")) => {
                    let mut fresh = Map::new();
                    let mut rest = patch.clone();
                    rest.shift_remove(DIRECTIVE);
                    self.merge_map(&mut fresh, &rest)?;
                    *orig = fresh;
                    return Ok(Outcome::Keep);
                }
                Some(Some("delete")) => return Ok(Outcome::Delete),
                Some(other) => {
                    return Err(PatchError::Invalid(format!(
                        "Unknown patch type: {}",
                        other.map(str::to_string).unwrap_or_else(|| "<non-string>".into())
                    )));
                }
            }
            if let Some(retain) = patch.get(RETAIN_KEYS) {
                let keys: Vec<&str> = retain
                    .as_array()
                    .ok_or_else(|| {
                        PatchError::Invalid("$retainKeys must be a list of strings".into())
                    })?
                    .iter()
                    .filter_map(Value::as_str)
                    .collect();
                for k in patch.keys() {
                    if !k.starts_with('$') && !keys.contains(&k.as_str()) {
                        return Err(PatchError::Invalid(
                            "The content of the patch does not match the retainKeys list".into(),
                        ));
                    }
                }
                orig.retain(|k, _| keys.contains(&k.as_str()));
            }
            for (k, v) in patch {
                if let Some(field) = k.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) {
                    let remove = v.as_array().ok_or_else(|| {
                        PatchError::Invalid(format!("{k} must be a list of primitives"))
                    })?;
                    if let Some(Value::Array(list)) = orig.get_mut(field) {
                        list.retain(|x| !remove.contains(x));
                        if list.is_empty() {
                            orig.shift_remove(field);
                        }
                    }
                }
            }
        }
        for (k, v) in patch {
            if k.starts_with('$') && self.mode == Mode::Strategic {
                continue;
            }
            if v.is_null() {
                if self.mode == Mode::Strategic {
                    orig.shift_remove(k);
                }
                continue;
            }
            match v {
                Value::Object(_) if self.atomic_struct(k) => {
                    orig.insert(k.clone(), v.clone());
                }
                Value::Object(p) => {
                    self.path.push(k.clone());
                    let mut fresh = Map::new();
                    let target = match orig.get_mut(k) {
                        Some(Value::Object(o)) => o,
                        _ => &mut fresh,
                    };
                    let outcome = self.merge_map(target, p)?;
                    self.path.pop();
                    match outcome {
                        Outcome::Delete => {
                            orig.shift_remove(k);
                        }
                        Outcome::Keep => {
                            if !matches!(orig.get(k), Some(Value::Object(_))) {
                                orig.insert(k.clone(), Value::Object(fresh));
                            }
                        }
                    }
                }
                Value::Array(p) => {
                    let strategy = self.strategy_for(k);
                    let existing = match orig.shift_remove(k) {
                        Some(Value::Array(a)) => a,
                        _ => Vec::new(),
                    };
                    self.path.push(k.clone());
                    let merged = self.merge_list(existing, p, strategy);
                    self.path.pop();
                    orig.insert(k.clone(), Value::Array(merged?));
                }
                other => {
                    orig.insert(k.clone(), other.clone());
                }
            }
        }
        if self.mode == Mode::Strategic {
            for (k, v) in patch {
                if let Some(field) = k.strip_prefix(SET_ELEMENT_ORDER) {
                    let strategy = self.strategy_for(field);
                    if let (Some(Value::Array(list)), Some(order)) =
                        (orig.get_mut(field), v.as_array())
                    {
                        reorder(list, order, strategy);
                    }
                }
            }
        }
        Ok(Outcome::Keep)
    }

    /// Strips directives from a new element (merging it into an empty map).
    fn fresh(&mut self, elem: &Value) -> Result<Option<Value>, PatchError> {
        match elem {
            Value::Object(p) => {
                let mut m = Map::new();
                match self.merge_map(&mut m, p)? {
                    Outcome::Keep => Ok(Some(Value::Object(m))),
                    Outcome::Delete => Ok(None),
                }
            }
            other => Ok(Some(other.clone())),
        }
    }

    fn merge_list(
        &mut self,
        orig: Vec<Value>,
        patch: &[Value],
        strategy: ListStrategy,
    ) -> Result<Vec<Value>, PatchError> {
        let mode = self.mode;
        let is_replace_marker = |v: &Value| {
            mode == Mode::Strategic
                && v.get(DIRECTIVE).and_then(Value::as_str) == Some("replace")
                && v.as_object().is_some_and(|m| m.len() == 1)
        };
        if strategy == ListStrategy::Replace || patch.iter().any(is_replace_marker) {
            let mut out = Vec::new();
            for p in patch.iter().filter(|p| !is_replace_marker(p)) {
                if let Some(v) = self.fresh(p)? {
                    out.push(v);
                }
            }
            return Ok(out);
        }
        let server_order = orig.clone();
        let mut out = orig;
        match strategy {
            // Replace returned above, so only the primitive set union is left here.
            ListStrategy::Replace | ListStrategy::MergePrimitives => {
                for p in patch {
                    if !out.contains(p) {
                        out.push(p.clone());
                    }
                }
            }
            ListStrategy::MergeByKey(key) => {
                for p in patch {
                    let Some(pm) = p.as_object() else {
                        if !out.contains(p) {
                            out.push(p.clone());
                        }
                        continue;
                    };
                    let delete = self.mode == Mode::Strategic
                        && pm.get(DIRECTIVE).and_then(Value::as_str) == Some("delete");
                    let Some(kv) = pm.get(key) else {
                        return Err(PatchError::Invalid(format!(
                            "map: {p} does not contain declared merge key: {key}"
                        )));
                    };
                    let idx = out.iter().position(|o| o.get(key) == Some(kv));
                    match (idx, delete) {
                        (Some(i), true) => {
                            out.remove(i);
                        }
                        (None, true) => {}
                        (Some(i), false) => {
                            let mut fresh = Map::new();
                            let target = out[i].as_object_mut().unwrap_or(&mut fresh);
                            if self.merge_map(target, pm)? == Outcome::Delete {
                                out.remove(i);
                            }
                        }
                        (None, false) => {
                            if let Some(v) = self.fresh(p)? {
                                out.push(v);
                            }
                        }
                    }
                }
            }
        }
        // Server-side apply keeps the live order and appends (structured-merge-diff).
        Ok(match self.mode {
            Mode::Strategic => merge_order(out, patch, &server_order, strategy),
            _ => out,
        })
    }
}

/// The order a real server gives a merged list (apimachinery's `normalizeElementOrder`): the
/// items named in the patch in patch order, interleaved with the server-only items in their
/// old order, a patch item going first unless both it and the server item were already there
/// with the server item in front. So `[a]` merged with `[b]` is `[b, a]`.
fn merge_order(
    merged: Vec<Value>,
    patch: &[Value],
    server: &[Value],
    strategy: ListStrategy,
) -> Vec<Value> {
    let same = |a: &Value, b: &Value| match strategy {
        ListStrategy::MergeByKey(key) if a.is_object() && b.is_object() => {
            a.get(key).is_some() && a.get(key) == b.get(key)
        }
        _ => a == b,
    };
    let pos = |list: &[Value], v: &Value| list.iter().position(|o| same(o, v));
    let (mut from_patch, server_only): (Vec<Value>, Vec<Value>) =
        merged.into_iter().partition(|v| pos(patch, v).is_some());
    from_patch.sort_by_key(|v| pos(patch, v));
    let mut out = Vec::with_capacity(from_patch.len() + server_only.len());
    let (mut left, mut right) =
        (server_only.into_iter().peekable(), from_patch.into_iter().peekable());
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => {
                matches!((pos(server, l), pos(server, r)), (Some(li), Some(ri)) if li < ri)
            }
        };
        let next = if take_left { left.next() } else { right.next() };
        out.extend(next);
    }
    out
}

/// Orders `list` by `$setElementOrder`: listed elements first in the given order, the rest
/// after them in their previous relative order.
fn reorder(list: &mut [Value], order: &[Value], strategy: ListStrategy) {
    let rank = |v: &Value| -> usize {
        let pos = match strategy {
            ListStrategy::MergeByKey(key) => {
                let kv = v.get(key);
                order.iter().position(|o| o.get(key).is_some() && o.get(key) == kv)
            }
            _ => order.iter().position(|o| o == v),
        };
        pos.unwrap_or(usize::MAX)
    };
    list.sort_by_key(|v| rank(v));
}

/// Applies a strategic merge patch to `doc` using the patch metadata of `kind` (resource or
/// Kind name). Honours `$patch: replace|delete|merge`, `$deleteFromPrimitiveList/<f>`,
/// `$setElementOrder/<f>` and `$retainKeys`; `null` deletes; lists without a merge strategy
/// are replaced. A non-object patch is a 400; a patch that cannot apply is a 422.
pub fn strategic_merge_patch(doc: &mut Value, patch: &Value, kind: &str) -> Result<(), PatchError> {
    let Value::Object(p) = patch else {
        return Err(PatchError::BadRequest(
            "json: cannot unmarshal array into Go value of type map[string]interface {}".into(),
        ));
    };
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    let Value::Object(d) = doc else { return Ok(()) };
    let mut m = Merger { kind, mode: Mode::Strategic, path: Vec::new() };
    if m.merge_map(d, p)? == Outcome::Delete {
        return Err(PatchError::Invalid("a patch may not delete the whole object".into()));
    }
    Ok(())
}

/// The merge step of server-side apply: with no live object the applied configuration is the
/// object to create; otherwise the applied configuration is merged into `live` with the list
/// semantics of server-side apply (keyed lists by their list-map keys, sets such as finalizers
/// as sets, other lists and atomic structs replaced). Ownership (conflicts, `force`, removing
/// what a manager no longer applies) is [`crate::ownership`]'s. A `metadata.resourceVersion`
/// in the applied configuration that differs from the live one is a 409 Conflict; a missing
/// `field_manager` is a 422; applied `metadata.managedFields` are a 400.
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    field_manager: &str,
    force: bool,
    kind: &str,
) -> Result<Value, PatchError> {
    if field_manager.is_empty() {
        return Err(PatchError::Invalid(
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch".into(),
        ));
    }
    let Value::Object(cfg) = applied else {
        return Err(PatchError::BadRequest("apply patch must be an object".into()));
    };
    tracing::debug!(field_manager, force, kind, "server-side apply");
    if applied.pointer("/metadata/managedFields").is_some_and(|m| !m.is_null()) {
        return Err(PatchError::BadRequest("metadata.managedFields must be nil".into()));
    }
    let Some(live) = live else {
        return Ok(applied.clone());
    };
    for field in ["apiVersion", "kind"] {
        if let (Some(a), Some(l)) = (cfg.get(field), live.get(field))
            && a != l
        {
            return Err(PatchError::BadRequest(format!(
                "the {field} of the applied configuration ({a}) does not match the object ({l})"
            )));
        }
    }
    let want_rv = applied.pointer("/metadata/resourceVersion").and_then(Value::as_str);
    let have_rv = live.pointer("/metadata/resourceVersion").and_then(Value::as_str);
    if let Some(want) = want_rv.filter(|w| !w.is_empty())
        && Some(want) != have_rv
    {
        return Err(PatchError::Conflict(
            "the object has been modified; please apply your changes to the latest version and try again".into(),
        ));
    }
    let mut out = live.clone();
    if let Value::Object(o) = &mut out {
        let mut m = Merger { kind, mode: Mode::Apply, path: Vec::new() };
        m.merge_map(o, cfg)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::testing::field_of_each;

    fn smp(mut doc: Value, patch: Value, kind: &str) -> Value {
        strategic_merge_patch(&mut doc, &patch, kind).unwrap_or_else(|e| panic!("{patch}: {e}"));
        doc
    }

    fn pod() -> Value {
        json!({
            "metadata": {"name": "p", "finalizers": ["a", "b"], "labels": {"x": "1", "y": "2"},
                "ownerReferences": [{"uid": "u1", "name": "j1", "kind": "Job", "apiVersion": "batch/v1"}]},
            "spec": {
                "containers": [
                    {"name": "c1", "image": "busybox", "args": ["a"],
                     "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                     "ports": [{"containerPort": 80}]},
                    {"name": "c2", "image": "nginx"}
                ],
                "volumes": [{"name": "v", "emptyDir": {}}],
                "tolerations": [{"key": "t1"}]
            },
            "status": {"conditions": [{"type": "Ready", "status": "False"}]}
        })
    }

    #[test]
    fn merge_patch_rfc7386() {
        let mut doc = json!({"a": {"b": 1, "c": 2}, "l": [1, 2], "s": "x"});
        merge_patch(&mut doc, &json!({"a": {"b": null, "d": 3}, "l": [3], "s": null})).unwrap();
        assert_eq!(doc, json!({"a": {"c": 2, "d": 3}, "l": [3]}));
        assert_eq!(merge_patch(&mut doc, &json!([1])).unwrap_err().status_code(), 400);
    }

    #[test]
    fn finalizers_union_and_delete_from_primitive_list() {
        let out = smp(pod(), json!({"metadata": {"finalizers": ["b", "c"]}}), "pods");
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b", "c"]));
        // New items go in front of server-only ones, as on a real server.
        let out = smp(pod(), json!({"metadata": {"finalizers": ["c"]}}), "pods");
        assert_eq!(out["metadata"]["finalizers"], json!(["c", "a", "b"]));
        let out = smp(pod(), json!({"metadata": {"finalizers": ["b", "c"]}}), "pods");
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b", "c"]));
        let out =
            smp(pod(), json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}), "pods");
        assert_eq!(out["metadata"]["finalizers"], json!(["b"]));
        let out = smp(
            pod(),
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a", "b"]}}),
            "pods",
        );
        assert!(out["metadata"].get("finalizers").is_none(), "empty list is not stored");
    }

    #[test]
    fn containers_merge_by_name_and_nested_lists() {
        let out = smp(
            pod(),
            json!({"spec": {"containers": [
                {"name": "c1", "image": "busybox:2", "args": ["b"],
                 "env": [{"name": "B", "value": "20"}, {"name": "C", "value": "3"}],
                 "ports": [{"containerPort": 443}]},
                {"name": "c3", "image": "redis"}
            ]}}),
            "pods",
        );
        let cs = out["spec"]["containers"].as_array().unwrap();
        assert_eq!(cs.len(), 3);
        assert_eq!(cs[0]["image"], "busybox:2");
        assert_eq!(cs[0]["args"], json!(["b"]), "args are replaced");
        assert_eq!(
            cs[0]["env"],
            json!([{"name": "A", "value": "1"}, {"name": "B", "value": "20"}, {"name": "C", "value": "3"}])
        );
        // New items before server-only ones, as kube-apiserver 1.37 answers this very patch.
        assert_eq!(cs[0]["ports"], json!([{"containerPort": 443}, {"containerPort": 80}]));
        assert_eq!(cs[1]["name"], "c3");
        assert_eq!(cs[2]["name"], "c2");
        // Tolerations have no merge key: replaced.
        let out = smp(pod(), json!({"spec": {"tolerations": [{"key": "t2"}]}}), "pods");
        assert_eq!(out["spec"]["tolerations"], json!([{"key": "t2"}]));
    }

    #[test]
    fn patch_directives() {
        // Delete one element of a keyed list.
        let out = smp(
            pod(),
            json!({"spec": {"containers": [{"name": "c2", "$patch": "delete"}]}}),
            "pods",
        );
        assert_eq!(out["spec"]["containers"].as_array().unwrap().len(), 1);
        // Replace a whole keyed list.
        let out = smp(
            pod(),
            json!({"spec": {"containers": [{"$patch": "replace"}, {"name": "only", "image": "x"}]}}),
            "pods",
        );
        assert_eq!(out["spec"]["containers"], json!([{"name": "only", "image": "x"}]));
        // Replace a map.
        let out =
            smp(pod(), json!({"metadata": {"labels": {"$patch": "replace", "z": "9"}}}), "pods");
        assert_eq!(out["metadata"]["labels"], json!({"z": "9"}));
        // Delete a map.
        let out = smp(pod(), json!({"metadata": {"labels": {"$patch": "delete"}}}), "pods");
        assert!(out["metadata"].get("labels").is_none());
        // Explicit merge is the default.
        let out =
            smp(pod(), json!({"metadata": {"labels": {"$patch": "merge", "z": "9"}}}), "pods");
        assert_eq!(out["metadata"]["labels"], json!({"x": "1", "y": "2", "z": "9"}));
        // null deletes.
        let out = smp(pod(), json!({"metadata": {"labels": {"x": null}}}), "pods");
        assert_eq!(out["metadata"]["labels"], json!({"y": "2"}));
        // Unknown directive is a 422.
        let mut doc = pod();
        let err = strategic_merge_patch(&mut doc, &json!({"metadata": {"$patch": "frob"}}), "pods");
        assert_eq!(err.unwrap_err().status_code(), 422);
    }

    #[test]
    fn set_element_order_and_retain_keys() {
        let out = smp(
            pod(),
            json!({"spec": {
                "$setElementOrder/containers": [{"name": "c2"}, {"name": "c1"}],
                "containers": [{"name": "c1", "image": "new"}]
            }}),
            "pods",
        );
        assert_eq!(field_of_each(&out["spec"]["containers"], "name"), ["c2", "c1"]);
        assert!(
            out["spec"].get("$setElementOrder/containers").is_none(),
            "directives are not stored"
        );
        let out = smp(
            pod(),
            json!({"spec": {"volumes": [{"name": "v", "$retainKeys": ["name", "configMap"], "configMap": {"name": "cm"}}]}}),
            "pods",
        );
        assert_eq!(out["spec"]["volumes"], json!([{"name": "v", "configMap": {"name": "cm"}}]));
        let out = smp(
            pod(),
            json!({"metadata": {"$setElementOrder/finalizers": ["b", "a"], "finalizers": ["b"]}}),
            "pods",
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["b", "a"]));
        let mut doc = pod();
        let err = strategic_merge_patch(
            &mut doc,
            &json!({"spec": {"volumes": [{"name": "v", "$retainKeys": ["name"], "secret": {}}]}}),
            "pods",
        );
        assert_eq!(err.unwrap_err().status_code(), 422);
    }

    #[test]
    fn conditions_and_owner_refs_and_jobs() {
        let out = smp(
            pod(),
            json!({"status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}]}}),
            "pods",
        );
        assert_eq!(out["status"]["conditions"].as_array().unwrap().len(), 2);
        assert_eq!(out["status"]["conditions"][0]["status"], "True");
        let out = smp(
            pod(),
            json!({"metadata": {"ownerReferences": [{"uid": "u1", "$patch": "delete"}]}}),
            "pods",
        );
        assert_eq!(out["metadata"]["ownerReferences"], json!([]));
        let job =
            json!({"spec": {"template": {"spec": {"containers": [{"name": "a", "image": "x"}]}}}});
        let out = smp(
            job,
            json!({"spec": {"template": {"spec": {"containers": [{"name": "b", "image": "y"}]}}}}),
            "jobs",
        );
        assert_eq!(out["spec"]["template"]["spec"]["containers"].as_array().unwrap().len(), 2);
        let mut doc = pod();
        let err = strategic_merge_patch(
            &mut doc,
            &json!({"spec": {"containers": [{"image": "x"}]}}),
            "pods",
        );
        assert_eq!(err.unwrap_err().status_code(), 422, "missing merge key");
        assert_eq!(
            strategic_merge_patch(&mut doc, &json!([]), "pods").unwrap_err().status_code(),
            400
        );
    }

    #[test]
    fn server_side_apply() {
        let applied = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}});
        assert_eq!(apply(None, &applied, "kubectl", false, "pods").unwrap(), applied);
        assert_eq!(apply(None, &applied, "", false, "pods").unwrap_err().status_code(), 422);
        let mut live = pod();
        live["apiVersion"] = json!("v1");
        live["kind"] = json!("Pod");
        live["metadata"]["resourceVersion"] = json!("5");
        let out = apply(
            Some(&live),
            &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "finalizers": ["z"], "labels": {"x": "10"}},
                "spec": {"containers": [{"name": "c2", "image": "nginx:2"}]}}),
            "mgr",
            false,
            "pods",
        )
        .unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b", "z"]));
        assert_eq!(out["metadata"]["labels"], json!({"x": "10", "y": "2"}));
        assert_eq!(out["spec"]["containers"][1]["image"], "nginx:2");
        assert_eq!(out["spec"]["containers"][0]["image"], "busybox");
        let stale = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "resourceVersion": "4"}});
        assert_eq!(apply(Some(&live), &stale, "mgr", true, "pods").unwrap_err().status_code(), 409);
        let fresh = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "resourceVersion": "5"}});
        apply(Some(&live), &fresh, "mgr", false, "pods").unwrap();
        let wrong = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "p"}});
        assert_eq!(
            apply(Some(&live), &wrong, "mgr", false, "pods").unwrap_err().status_code(),
            400
        );
    }
}
