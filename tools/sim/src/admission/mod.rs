//! Server-side admission of Jobs and Pods: defaulting, generated fields and validation, with
//! the field-error causes (reason, message, field) of the real API server.

pub mod job;
pub mod pod;

use serde_json::Value;

/// Cause reason of a required field that is missing.
pub const FIELD_VALUE_REQUIRED: &str = "FieldValueRequired";
/// Cause reason of a field with an invalid value.
pub const FIELD_VALUE_INVALID: &str = "FieldValueInvalid";
/// Cause reason of a value outside the supported set.
pub const FIELD_VALUE_NOT_SUPPORTED: &str = "FieldValueNotSupported";
/// Cause reason of a forbidden field or change.
pub const FIELD_VALUE_FORBIDDEN: &str = "FieldValueForbidden";
/// Cause reason of a duplicated list entry.
pub const FIELD_VALUE_DUPLICATE: &str = "FieldValueDuplicate";
/// Cause reason of a list with too many items.
pub const FIELD_VALUE_TOO_MANY: &str = "FieldValueTooMany";
/// Cause reason of a value that is too long.
pub const FIELD_VALUE_TOO_LONG: &str = "FieldValueTooLong";
/// Cause reason of a reference to something that does not exist.
pub const FIELD_VALUE_NOT_FOUND: &str = "FieldValueNotFound";

/// One field error, as reported in `Status.details.causes[]` of a 422 Invalid answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldCause {
    /// Field-error type, e.g. `FieldValueInvalid`.
    pub reason: String,
    /// Error body without the field, e.g. `Invalid value: -1: must be greater than or equal to 0`.
    pub message: String,
    /// Field path, e.g. `spec.parallelism`.
    pub field: String,
}

impl std::fmt::Display for FieldCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Renders a bad value the way Go's field errors do: strings quoted, scalars plain, objects
/// as compact JSON.
pub fn render_value(v: &Value) -> String {
    match v {
        Value::String(s) => serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\"")),
        Value::Null => "null".into(),
        other => other.to_string(),
    }
}

fn with_detail(head: String, detail: &str) -> String {
    if detail.is_empty() { head } else { format!("{head}: {detail}") }
}

impl FieldCause {
    fn new(reason: &str, field: &str, message: String) -> Self {
        Self { reason: reason.into(), message, field: field.into() }
    }

    /// `Required value[: detail]`.
    pub fn required(field: &str, detail: &str) -> Self {
        Self::new(FIELD_VALUE_REQUIRED, field, with_detail("Required value".into(), detail))
    }

    /// `Invalid value: <v>: detail`.
    pub fn invalid(field: &str, value: &Value, detail: &str) -> Self {
        let head = format!("Invalid value: {}", render_value(value));
        Self::new(FIELD_VALUE_INVALID, field, with_detail(head, detail))
    }

    /// `Invalid value: detail` (Go's `field.OmitValueType`).
    pub fn invalid_omit(field: &str, detail: &str) -> Self {
        Self::new(FIELD_VALUE_INVALID, field, with_detail("Invalid value".into(), detail))
    }

    /// `Forbidden: detail`.
    pub fn forbidden(field: &str, detail: &str) -> Self {
        Self::new(FIELD_VALUE_FORBIDDEN, field, with_detail("Forbidden".into(), detail))
    }

    /// `Unsupported value: "x": supported values: "a", "b"`.
    pub fn not_supported(field: &str, value: &Value, supported: &[&str]) -> Self {
        let list: Vec<String> = supported.iter().map(|s| format!("\"{s}\"")).collect();
        let msg = format!(
            "Unsupported value: {}: supported values: {}",
            render_value(value),
            list.join(", ")
        );
        Self::new(FIELD_VALUE_NOT_SUPPORTED, field, msg)
    }

    /// `Duplicate value: <v>`.
    pub fn duplicate(field: &str, value: &Value) -> Self {
        Self::new(FIELD_VALUE_DUPLICATE, field, format!("Duplicate value: {}", render_value(value)))
    }

    /// `Too many: <n>: must have at most <max> items`.
    pub fn too_many(field: &str, actual: usize, max: usize) -> Self {
        Self::new(
            FIELD_VALUE_TOO_MANY,
            field,
            format!("Too many: {actual}: must have at most {max} items"),
        )
    }

    /// `Too long: may not be more than <max> bytes`.
    pub fn too_long(field: &str, max: usize) -> Self {
        Self::new(
            FIELD_VALUE_TOO_LONG,
            field,
            format!("Too long: may not be more than {max} bytes"),
        )
    }

    /// `Not found: <v>`.
    pub fn not_found(field: &str, value: &Value) -> Self {
        Self::new(FIELD_VALUE_NOT_FOUND, field, format!("Not found: {}", render_value(value)))
    }

    /// `Invalid value: <v>: field is immutable`.
    pub fn immutable(field: &str, value: &Value) -> Self {
        Self::invalid(field, value, "field is immutable")
    }
}

/// The top-level message of a 422 Invalid Status: `Job.batch "pi" is invalid: <cause>` or,
/// with several causes, `... is invalid: [<cause>, <cause>]`. `qualified_kind` is `Job.batch`,
/// `Pod`, ...
pub fn invalid_message(qualified_kind: &str, name: &str, causes: &[FieldCause]) -> String {
    let parts: Vec<String> = causes.iter().map(ToString::to_string).collect();
    let body = if parts.len() == 1 { parts[0].clone() } else { format!("[{}]", parts.join(", ")) };
    format!("{qualified_kind} \"{name}\" is invalid: {body}")
}

/// `Invalid value` for `field` when both `value` and `max` are set and `value` is above `max`.
pub(crate) fn at_most(
    out: &mut Vec<FieldCause>,
    field: &str,
    value: Option<i64>,
    max: Option<i64>,
    detail: &str,
) {
    if let (Some(v), Some(max)) = (value, max)
        && v > max
    {
        out.push(FieldCause::invalid(field, &Value::from(v), detail));
    }
}

/// Validates a non-negative integer field (`must be greater than or equal to 0`).
pub(crate) fn nonnegative(out: &mut Vec<FieldCause>, obj: &Value, ptr: &str, field: &str) {
    if let Some(n) = obj.pointer(ptr).and_then(Value::as_i64)
        && n < 0
    {
        out.push(FieldCause::invalid(field, &Value::from(n), "must be greater than or equal to 0"));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn messages() {
        assert_eq!(
            FieldCause::required("spec.x", "valid values: \"OnFailure\", \"Never\"").message,
            "Required value: valid values: \"OnFailure\", \"Never\""
        );
        assert_eq!(FieldCause::required("spec.x", "").message, "Required value");
        assert_eq!(
            FieldCause::invalid(
                "spec.parallelism",
                &json!(-1),
                "must be greater than or equal to 0"
            )
            .to_string(),
            "spec.parallelism: Invalid value: -1: must be greater than or equal to 0"
        );
        assert_eq!(
            FieldCause::not_supported(
                "spec.completionMode",
                &json!("X"),
                &["NonIndexed", "Indexed"]
            )
            .message,
            "Unsupported value: \"X\": supported values: \"NonIndexed\", \"Indexed\""
        );
        assert_eq!(
            FieldCause::invalid_omit("status.conditions", "nope").message,
            "Invalid value: nope"
        );
        let causes = vec![FieldCause::required("a", ""), FieldCause::forbidden("b", "no")];
        assert_eq!(
            invalid_message("Job.batch", "pi", &causes),
            "Job.batch \"pi\" is invalid: [a: Required value, b: Forbidden: no]"
        );
        assert_eq!(
            invalid_message("Job.batch", "pi", &causes[..1]),
            "Job.batch \"pi\" is invalid: a: Required value"
        );
        assert_eq!(FieldCause::too_many("r", 21, 20).reason, FIELD_VALUE_TOO_MANY);
    }
}
