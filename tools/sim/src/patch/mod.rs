//! The four PATCH flavours of the API server over Go-shaped JSON documents.
//!
//! * [`json_patch`]: RFC 6902 with the evanphx (Go, v4) semantics the real server uses.
//! * [`merge_patch`]: RFC 7386.
//! * [`strategic_merge_patch`]: Kubernetes strategic merge patch driven by a hand-written
//!   patch-metadata table ([`strategy`]).
//! * [`apply`]: a minimal server-side apply built on the same list semantics.
//!
//! Status codes of [`PatchError`] (see [`PatchError::status_code`]): `BadRequest` → 400,
//! `Invalid` → 422, `Conflict` → 409, `TooManyOperations` → 413.

mod json;
mod strategic;
pub mod strategy;

pub use json::{MAX_JSON_PATCH_OPERATIONS, json_patch};
pub use strategic::{apply, merge_patch, strategic_merge_patch};

/// Why a patch could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// The patch body is malformed (not a list of operations, not an object, unknown op):
    /// HTTP 400 BadRequest.
    #[error("{0}")]
    BadRequest(String),
    /// The patch is well-formed but does not apply to this document (failed `test`, missing
    /// path, index out of range, missing merge key, missing fieldManager): HTTP 422 Invalid.
    #[error("{0}")]
    Invalid(String),
    /// The patched object names a resourceVersion other than the stored one: HTTP 409 Conflict.
    #[error("{0}")]
    Conflict(String),
    /// A JSON patch with more operations than the server accepts: HTTP 413.
    #[error(
        "Request entity too large: The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {0}"
    )]
    TooManyOperations(usize),
}

impl PatchError {
    /// HTTP status code the server answers this error with.
    pub fn status_code(&self) -> u16 {
        match self {
            PatchError::BadRequest(_) => 400,
            PatchError::Invalid(_) => 422,
            PatchError::Conflict(_) => 409,
            PatchError::TooManyOperations(_) => 413,
        }
    }

    /// The Status `reason` for this error.
    pub fn reason(&self) -> &'static str {
        match self {
            PatchError::BadRequest(_) => "BadRequest",
            PatchError::Invalid(_) => "Invalid",
            PatchError::Conflict(_) => "Conflict",
            PatchError::TooManyOperations(_) => "RequestEntityTooLarge",
        }
    }
}
