//! The result document's JSON Schema, generated from the types in
//! `result.rs` (schemars), and the rule every client follows for
//! `schema_version`. `jail schema` prints it; `schema/result.schema.json` is
//! the committed copy, checked against this output by the tests.
//!
//! Versioning: `schema_version` is bumped on any incompatible change (a field
//! removed, renamed or retyped, a new `status` or other enum value, a change
//! of meaning). Adding a field is compatible and does not bump it, so the
//! schema leaves `additionalProperties` open and clients ignore fields they
//! do not know. A client refuses a document whose `schema_version` is not
//! the one it was built for ([`check_version`]): older or newer, it cannot
//! know what the document means.

use serde_json::Value;

use crate::result::{RunResult, SCHEMA_VERSION};

/// Where the committed copy of [`result_schema`] lives in the repository.
pub const SCHEMA_PATH: &str = "schema/result.schema.json";

/// The JSON Schema (draft 2020-12) of the document `jail run --json` prints.
pub(crate) fn result_schema() -> Value {
    let mut schema = serde_json::to_value(schemars::schema_for!(RunResult)).unwrap_or(Value::Null);
    if let Value::Object(root) = &mut schema {
        root.insert("title".into(), Value::from("jail run --json result"));
        root.insert(
            "description".into(),
            Value::from(format!(
                "One JSON document per run, printed by `jail run --json` (schema_version {SCHEMA_VERSION}). \
                 Fields documented in jail/src/result.rs and README.md. A client refuses a document whose \
                 schema_version is not the one it knows; unknown fields are to be ignored."
            )),
        );
        // Pin the version: a validator with this schema rejects any other one.
        if let Some(Value::Object(props)) = root.get_mut("properties") {
            props.insert(
                "schema_version".into(),
                serde_json::json!({
                    "description": "Bumped on any incompatible change to this document.",
                    "type": "integer",
                    "const": SCHEMA_VERSION,
                }),
            );
        }
    }
    schema
}

/// The schema as `jail schema` prints it and the repository keeps it.
pub(crate) fn result_schema_text() -> String {
    let mut text = serde_json::to_string_pretty(&result_schema()).unwrap_or_default();
    text.push('\n');
    text
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum VersionError {
    #[error("the result has no schema_version: it is not a `jail run --json` document")]
    Missing,
    #[error(
        "the result has schema_version {found}, this client knows {known}: use a jail binary and a client from the same release (`jail --version`)"
    )]
    Unknown { found: Value, known: u32 },
}

/// A client's first step with a result document: refuse any schema version
/// but the one this build knows, before reading anything else in it.
pub fn check_version(doc: &Value) -> Result<(), VersionError> {
    match doc.get("schema_version") {
        None => Err(VersionError::Missing),
        Some(v) if v.as_u64() == Some(u64::from(SCHEMA_VERSION)) => Ok(()),
        Some(v) => Err(VersionError::Unknown { found: v.clone(), known: SCHEMA_VERSION }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::SetupError;

    #[test]
    fn the_schema_pins_the_version_and_names_every_top_level_field() {
        let s = result_schema();
        assert_eq!(s["properties"]["schema_version"]["const"], SCHEMA_VERSION);
        let doc =
            serde_json::to_value(RunResult::setup_failed(SetupError { stage: "s".into(), message: "m".into(), causes: vec![] }))
                .unwrap();
        let props = s["properties"].as_object().unwrap();
        for key in doc.as_object().unwrap().keys() {
            assert!(props.contains_key(key), "schema lacks `{key}`");
        }
    }

    #[test]
    fn a_client_refuses_a_version_it_does_not_know() {
        assert_eq!(check_version(&serde_json::json!({"schema_version": SCHEMA_VERSION})), Ok(()));
        let newer = serde_json::json!({"schema_version": SCHEMA_VERSION + 1});
        let err = check_version(&newer).unwrap_err();
        assert!(err.to_string().contains("same release"), "{err}");
        assert!(check_version(&serde_json::json!({"schema_version": "1"})).is_err());
        assert_eq!(check_version(&serde_json::json!({"status": "ok"})), Err(VersionError::Missing));
    }
}
