//! API errors as the real server reports them: `Status` objects with reason, code and details.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde_json::{Map, Value, json};

use crate::resources::Resource;

/// One field-level cause of a 422 Invalid error (`details.causes[]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    /// Field-error type, e.g. `FieldValueRequired`.
    pub reason: String,
    /// Human message, e.g. `Required value: ...`.
    pub message: String,
    /// Field path, e.g. `spec.template.spec.restartPolicy`.
    pub field: String,
}

impl Cause {
    /// Builds a cause.
    pub fn new(reason: &str, message: impl Into<String>, field: impl Into<String>) -> Self {
        Self { reason: reason.to_owned(), message: message.into(), field: field.into() }
    }
}

/// An error answer of the API server, rendered as a `Status` object.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code (also `Status.code`).
    pub code: u16,
    /// Machine-readable reason (`NotFound`, `Conflict`, ...).
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
    /// `Status.details`, when the real server sets it.
    pub details: Option<Value>,
}

fn details(res: &Resource, name: &str) -> Value {
    let mut d = Map::new();
    d.insert("name".into(), json!(name));
    if !res.group.is_empty() {
        d.insert("group".into(), json!(res.group));
    }
    d.insert("kind".into(), json!(res.plural));
    Value::Object(d)
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self { code, reason, message: message.into(), details: None }
    }

    /// An error about one object, whose details name it.
    fn about(
        res: &Resource,
        name: &str,
        code: u16,
        reason: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self { details: Some(details(res, name)), ..Self::new(code, reason, message) }
    }

    /// 404 for a missing object.
    pub fn not_found(res: &Resource, name: &str) -> Self {
        let message = format!("{} \"{name}\" not found", res.qualified());
        Self::about(res, name, 404, "NotFound", message)
    }

    /// 404 for a missing namespace (creating inside it).
    pub fn namespace_not_found(ns: &str) -> Self {
        Self {
            details: Some(json!({"name": ns, "kind": "namespaces"})),
            ..Self::new(404, "NotFound", format!("namespaces \"{ns}\" not found"))
        }
    }

    /// 404 for a path the server does not serve.
    pub fn path_not_found() -> Self {
        Self {
            details: Some(json!({})),
            ..Self::new(404, "NotFound", "the server could not find the requested resource")
        }
    }

    /// 409 on create of an existing name.
    pub fn already_exists(res: &Resource, name: &str) -> Self {
        let message = format!("{} \"{name}\" already exists", res.qualified());
        Self::about(res, name, 409, "AlreadyExists", message)
    }

    /// 409 on a stale resourceVersion.
    pub fn conflict_modified(res: &Resource, name: &str) -> Self {
        Self::conflict(
            res,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 409 of a server-side apply whose fields other managers own: only `causes` (type
    /// FieldManagerConflict) in the details, as `NewApplyConflict` answers.
    pub fn apply_conflict(message: String, causes: Vec<Value>) -> Self {
        Self { details: Some(json!({"causes": causes})), ..Self::new(409, "Conflict", message) }
    }

    /// 409 with a free cause (precondition failures).
    pub fn conflict(res: &Resource, name: &str, cause: &str) -> Self {
        let message =
            format!("Operation cannot be fulfilled on {} \"{name}\": {cause}", res.qualified());
        Self::about(res, name, 409, "Conflict", message)
    }

    /// 422 with the one cause `Cause::new(reason, message, field)`.
    pub fn invalid_field(
        res: &Resource,
        name: &str,
        reason: &str,
        message: &str,
        field: &str,
    ) -> Self {
        Self::invalid(res, name, vec![Cause::new(reason, message, field)])
    }

    /// 422 with field causes; `kind` is the Kind (`Job`), as in the real server's details.
    pub fn invalid(res: &Resource, name: &str, causes: Vec<Cause>) -> Self {
        let list: Vec<String> =
            causes.iter().map(|c| format!("{}: {}", c.field, c.message)).collect();
        let joined =
            if list.len() == 1 { list[0].clone() } else { format!("[{}]", list.join(", ")) };
        let mut d = Map::new();
        d.insert("name".into(), json!(name));
        if !res.group.is_empty() {
            d.insert("group".into(), json!(res.group));
        }
        d.insert("kind".into(), json!(res.kind));
        d.insert(
            "causes".into(),
            Value::Array(
                causes
                    .iter()
                    .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                    .collect(),
            ),
        );
        Self {
            details: Some(Value::Object(d)),
            ..Self::new(
                422,
                "Invalid",
                format!("{} \"{name}\" is invalid: {joined}", res.qualified_kind()),
            )
        }
    }

    /// 422 for invalid list options.
    pub fn invalid_list_options(field: &str, message: &str) -> Self {
        Self {
            details: Some(json!({"kind": "ListOptions", "group": "meta.k8s.io", "causes": [
                {"reason": "FieldValueForbidden", "message": message, "field": field}
            ]})),
            ..Self::new(
                422,
                "Invalid",
                format!("ListOptions.meta.k8s.io \"\" is invalid: {field}: {message}"),
            )
        }
    }

    /// 422 with the generic message a failed JSON patch gets.
    pub fn patch_invalid(detail: &str) -> Self {
        Self::new(
            422,
            "Invalid",
            format!("the server rejected our request due to an error in our request: {detail}"),
        )
    }

    /// 400 BadRequest with a free message.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 410 Expired.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 405 for a verb the path does not support.
    pub fn method_not_allowed() -> Self {
        Self {
            details: Some(json!({})),
            ..Self::new(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            )
        }
    }

    /// 415 for an unknown patch type.
    pub fn unsupported_media_type() -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: \
             application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, \
             application/strategic-merge-patch+json",
        )
    }

    /// 403 from an admission plugin (e.g. ResourceQuota).
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// 403 when creating inside a terminating namespace.
    pub fn namespace_terminating(res: &Resource, name: &str, ns: &str) -> Self {
        let msg = format!(
            "unable to create new content in namespace {ns} because it is being terminated"
        );
        Self {
            details: Some(json!({"name": name, "kind": res.plural, "causes": [
                {"reason": "NamespaceTerminating", "message": msg, "field": "metadata.namespace"}
            ]})),
            ..Self::new(
                403,
                "Forbidden",
                format!("{} \"{name}\" is forbidden: {msg}", res.qualified()),
            )
        }
    }

    /// 413 for an oversized request.
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(413, "RequestEntityTooLarge", message)
    }

    /// 429 injected by the fault hook.
    pub fn too_many_requests() -> Self {
        Self {
            details: Some(json!({"retryAfterSeconds": 1})),
            ..Self::new(
                429,
                "TooManyRequests",
                "the server has received too many requests and has asked us to try again later",
            )
        }
    }

    /// 503 injected by the fault hook.
    pub fn service_unavailable() -> Self {
        Self::new(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request (injected)",
        )
    }

    /// 500 (injected, or a bug).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// 504 when a requested resourceVersion is newer than the store.
    pub fn too_large_rv(asked: u64, current: u64) -> Self {
        Self {
            details: Some(
                json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1}),
            ),
            ..Self::new(
                504,
                "Timeout",
                format!("Timeout: Too large resource version: {asked}, current: {current}"),
            )
        }
    }

    /// The `Status` object of this error.
    pub fn to_status(&self) -> Value {
        let mut m = Map::new();
        m.insert("kind".into(), json!("Status"));
        m.insert("apiVersion".into(), json!("v1"));
        m.insert("metadata".into(), json!({}));
        m.insert("status".into(), json!("Failure"));
        m.insert("message".into(), json!(self.message));
        m.insert("reason".into(), json!(self.reason));
        if let Some(d) = &self.details {
            m.insert("details".into(), d.clone());
        }
        m.insert("code".into(), json!(self.code));
        Value::Object(m)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self.to_status()).unwrap_or_default();
        let mut resp = (code, body).into_response();
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        // kube-apiserver sends the hint as a header too (responsewriters.ErrorNegotiated).
        if let Some(secs) =
            self.details.as_ref().and_then(|d| d.get("retryAfterSeconds")).and_then(|s| s.as_u64())
        {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}
