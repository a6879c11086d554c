//! RFC 6902 JSON Patch with the semantics of Go's evanphx/json-patch v4, which the real API
//! server uses: notably a `test` of `null` against a missing key succeeds (kube-rs's
//! finalizer helper depends on it), while `replace`/`remove` of a missing key fail.

use serde_json::Value;

use super::PatchError;

/// Most operations one JSON patch may carry before the server answers 413.
pub const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;

fn invalid(msg: impl Into<String>) -> PatchError {
    PatchError::Invalid(msg.into())
}

/// Splits a JSON pointer into unescaped tokens; "" is the whole document.
fn tokens(path: &str) -> Result<Vec<String>, PatchError> {
    if path.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(invalid(format!("invalid JSON pointer {path:?}: must start with '/'")));
    };
    Ok(rest.split('/').map(|t| t.replace("~1", "/").replace("~0", "~")).collect())
}

fn array_index(tok: &str, len: usize, allow_end: bool) -> Result<usize, PatchError> {
    if allow_end && tok == "-" {
        return Ok(len);
    }
    let idx: usize =
        tok.parse().map_err(|_| invalid(format!("Unable to access invalid index: {tok}")))?;
    let max = if allow_end { len } else { len.saturating_sub(1) };
    if idx > max || (!allow_end && len == 0) {
        return Err(invalid(format!("Unable to access invalid index: {idx}")));
    }
    Ok(idx)
}

/// The container holding the last token of `path`, or None when an ancestor is missing.
fn parent_mut<'a>(doc: &'a mut Value, toks: &[String]) -> Option<&'a mut Value> {
    let mut cur = doc;
    for t in &toks[..toks.len().saturating_sub(1)] {
        cur = match cur {
            Value::Object(m) => m.get_mut(t)?,
            Value::Array(a) => {
                let i: usize = t.parse().ok()?;
                a.get_mut(i)?
            }
            _ => return None,
        };
    }
    Some(cur)
}

fn get<'a>(doc: &'a Value, toks: &[String]) -> Option<&'a Value> {
    let mut cur = doc;
    for t in toks {
        cur = match cur {
            Value::Object(m) => m.get(t)?,
            Value::Array(a) => a.get(t.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

fn add(doc: &mut Value, path: &str, value: Value) -> Result<(), PatchError> {
    let toks = tokens(path)?;
    let Some(last) = toks.last() else {
        *doc = value;
        return Ok(());
    };
    let parent = parent_mut(doc, &toks).ok_or_else(|| {
        invalid(format!("add operation does not apply: doc is missing path: \"{path}\""))
    })?;
    match parent {
        Value::Object(m) => {
            m.insert(last.clone(), value);
            Ok(())
        }
        Value::Array(a) => {
            let i = array_index(last, a.len(), true)?;
            a.insert(i, value);
            Ok(())
        }
        _ => Err(invalid(format!("add operation does not apply: doc is missing path: \"{path}\""))),
    }
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, PatchError> {
    let toks = tokens(path)?;
    let Some(last) = toks.last() else {
        return Ok(std::mem::replace(doc, Value::Null));
    };
    let missing =
        || invalid(format!("remove operation does not apply: doc is missing path: \"{path}\""));
    let parent = parent_mut(doc, &toks).ok_or_else(missing)?;
    match parent {
        Value::Object(m) => m.shift_remove(last).ok_or_else(missing),
        Value::Array(a) => {
            let i = array_index(last, a.len(), false)?;
            Ok(a.remove(i))
        }
        _ => Err(missing()),
    }
}

fn replace(doc: &mut Value, path: &str, value: Value) -> Result<(), PatchError> {
    let toks = tokens(path)?;
    let Some(last) = toks.last() else {
        *doc = value;
        return Ok(());
    };
    let missing =
        || invalid(format!("replace operation does not apply: doc is missing key: {path}"));
    let parent = parent_mut(doc, &toks).ok_or_else(missing)?;
    match parent {
        Value::Object(m) => match m.get_mut(last) {
            Some(slot) => {
                *slot = value;
                Ok(())
            }
            None => Err(missing()),
        },
        Value::Array(a) => {
            let i = array_index(last, a.len(), false)?;
            a[i] = value;
            Ok(())
        }
        _ => Err(missing()),
    }
}

fn test(doc: &mut Value, path: &str, value: &Value) -> Result<(), PatchError> {
    let toks = tokens(path)?;
    let failed = || invalid(format!("testing value {path} failed: test failed"));
    if toks.is_empty() {
        return if doc == value { Ok(()) } else { Err(failed()) };
    }
    // Go semantics: the parent must exist; a missing key reads as null.
    let parent = parent_mut(doc, &toks)
        .ok_or_else(|| invalid("test operation does not apply: is nil".to_string()))?;
    let last = &toks[toks.len() - 1];
    let current = match parent {
        Value::Object(m) => m.get(last).cloned().unwrap_or(Value::Null),
        Value::Array(a) => {
            let i = array_index(last, a.len(), false)?;
            a[i].clone()
        }
        _ => return Err(invalid("test operation does not apply: is nil".to_string())),
    };
    if current == *value { Ok(()) } else { Err(failed()) }
}

fn str_field<'a>(op: &'a Value, name: &str, kind: &str) -> Result<&'a str, PatchError> {
    op.get(name).and_then(Value::as_str).ok_or_else(|| {
        invalid(format!("{kind} operation does not apply: doc is missing {name} field"))
    })
}

/// Applies an RFC 6902 patch (a JSON array of operations) to `doc` in place. On error the
/// document may be partly modified: callers patch a copy.
pub fn json_patch(doc: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let ops = patch.as_array().ok_or_else(|| {
        PatchError::BadRequest(
            "json: cannot unmarshal object into Go value of type jsonpatch.Patch".into(),
        )
    })?;
    if ops.len() > MAX_JSON_PATCH_OPERATIONS {
        return Err(PatchError::TooManyOperations(ops.len()));
    }
    for op in ops {
        if !op.is_object() {
            return Err(PatchError::BadRequest(
                "json: cannot unmarshal into Go value of type jsonpatch.Operation".into(),
            ));
        }
        let kind = op.get("op").and_then(Value::as_str).unwrap_or("unknown");
        let value = || op.get("value").cloned().unwrap_or(Value::Null);
        match kind {
            "add" => add(doc, str_field(op, "path", kind)?, value())?,
            "remove" => {
                remove(doc, str_field(op, "path", kind)?)?;
            }
            "replace" => replace(doc, str_field(op, "path", kind)?, value())?,
            "move" | "copy" => {
                let from = str_field(op, "from", kind)?;
                let path = str_field(op, "path", kind)?;
                let found = if kind == "move" {
                    remove(doc, from).ok()
                } else {
                    get(doc, &tokens(from)?).cloned()
                };
                let v = found.ok_or_else(|| {
                    invalid(format!(
                        "{kind} operation does not apply: doc is missing from path: {from}"
                    ))
                })?;
                add(doc, path, v)?;
            }
            "test" => test(doc, str_field(op, "path", kind)?, &value())?,
            other => {
                return Err(PatchError::BadRequest(format!("Unexpected kind: {other}")));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn run(mut doc: Value, patch: Value) -> Result<Value, PatchError> {
        json_patch(&mut doc, &patch)?;
        Ok(doc)
    }

    #[test]
    fn kube_rs_finalizer_patches() {
        // Adding the first finalizer: test null on a missing key succeeds (Go semantics).
        let doc = json!({"metadata": {"name": "a"}});
        let out = run(
            doc,
            json!([
                {"op": "test", "path": "/metadata/finalizers", "value": null},
                {"op": "add", "path": "/metadata/finalizers", "value": ["x/y"]}
            ]),
        )
        .unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["x/y"]));
        // Removing it: test the element then remove it.
        let out = run(
            out,
            json!([
                {"op": "test", "path": "/metadata/finalizers/0", "value": "x/y"},
                {"op": "remove", "path": "/metadata/finalizers/0"}
            ]),
        )
        .unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!([]));
    }

    #[test]
    fn test_op_semantics() {
        let doc = json!({"metadata": {"finalizers": ["a"]}, "n": null});
        // null against an existing value fails.
        let err = run(
            doc.clone(),
            json!([{"op": "test", "path": "/metadata/finalizers", "value": null}]),
        );
        assert_eq!(err.unwrap_err().status_code(), 422);
        // null against an explicit null succeeds.
        run(doc.clone(), json!([{"op": "test", "path": "/n", "value": null}])).unwrap();
        // Missing parent fails.
        assert!(run(doc.clone(), json!([{"op": "test", "path": "/x/y", "value": null}])).is_err());
        // Value mismatch fails, match succeeds.
        assert!(
            run(
                doc.clone(),
                json!([{"op": "test", "path": "/metadata/finalizers/0", "value": "b"}])
            )
            .is_err()
        );
        run(doc, json!([{"op": "test", "path": "/metadata/finalizers", "value": ["a"]}])).unwrap();
    }

    #[test]
    fn add_remove_replace_move_copy() {
        let doc = json!({"a": {"b": [1, 2]}, "c": "x"});
        let out = run(
            doc,
            json!([
                {"op": "add", "path": "/a/b/-", "value": 3},
                {"op": "add", "path": "/a/b/0", "value": 0},
                {"op": "replace", "path": "/c", "value": "y"},
                {"op": "copy", "from": "/c", "path": "/d"},
                {"op": "move", "from": "/a/b/1", "path": "/e"},
                {"op": "remove", "path": "/a/b/0"},
                {"op": "add", "path": "/k~1s", "value": true}
            ]),
        )
        .unwrap();
        assert_eq!(out, json!({"a": {"b": [2, 3]}, "c": "y", "d": "y", "e": 1, "k/s": true}));
    }

    #[test]
    fn failures_are_422_or_400() {
        let doc = json!({"a": {"b": [1]}});
        for bad in [
            json!([{"op": "remove", "path": "/missing"}]),
            json!([{"op": "replace", "path": "/missing", "value": 1}]),
            json!([{"op": "add", "path": "/x/y", "value": 1}]),
            json!([{"op": "add", "path": "/a/b/5", "value": 1}]),
            json!([{"op": "remove", "path": "/a/b/1"}]),
            json!([{"op": "move", "from": "/nope", "path": "/z"}]),
            json!([{"op": "copy", "from": "/nope", "path": "/z"}]),
        ] {
            let err = run(doc.clone(), bad.clone()).unwrap_err();
            assert_eq!(err.status_code(), 422, "{bad}: {err}");
        }
        assert_eq!(run(doc.clone(), json!({"op": "add"})).unwrap_err().status_code(), 400);
        assert_eq!(
            run(doc.clone(), json!([{"op": "frob", "path": "/a"}])).unwrap_err().status_code(),
            400
        );
        let many: Vec<Value> =
            (0..10_001).map(|_| json!({"op": "test", "path": "/a", "value": null})).collect();
        let err = run(doc, Value::Array(many)).unwrap_err();
        assert_eq!(err.status_code(), 413);
        assert!(err.to_string().contains("got 10001"));
    }
}
