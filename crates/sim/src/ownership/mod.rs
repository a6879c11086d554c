//! Server-side-apply field ownership (`metadata.managedFields`), as kube-apiserver's field
//! manager and structured-merge-diff keep it: field sets and their `FieldsV1` encoding
//! ([`set`]), and the apply schema of the served kinds ([`schema`]).

pub mod schema;
pub mod set;
