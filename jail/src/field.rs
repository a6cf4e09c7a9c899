//! `FieldError`: one policy field a facility's validator rejected.
//!
//! A leaf: the validators of `seccomp` and `landlock` return it and
//! `policy` wraps it into its own `PolicyError`, so the facilities never
//! import `policy` and the policy never sits in a circle with them.

/// A field of the policy file, named by its JSON path (`seccomp.rules[3]`,
/// `landlock.mode`), and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("policy field `{field}`: {message}")]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> FieldError {
        FieldError { field: field.into(), message: message.into() }
    }
}
