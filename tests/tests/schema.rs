//! The result's JSON Schema: the committed copy is what `jail schema`
//! prints, and the validator every e2e test runs on its results
//! (`jail_tests::parse`) does refuse what the contract does not allow.

use jail_tests::*;
use serde_json::Value;

#[test]
fn committed_schema_is_what_jail_schema_prints() {
    let out = std::process::Command::new(jail_bin()).arg("schema").output().expect("run jail schema");
    assert!(out.status.success(), "jail schema failed: {}", String::from_utf8_lossy(&out.stderr));
    let path = repo().join(jail::schema::SCHEMA_PATH);
    let committed = std::fs::read_to_string(&path).expect("read the committed schema");
    assert!(
        committed == String::from_utf8_lossy(&out.stdout),
        "{} is stale: regenerate it with `target/debug/jail schema > {}`",
        path.display(),
        jail::schema::SCHEMA_PATH
    );
}

#[test]
fn the_validator_refuses_an_unknown_version_an_unlisted_field_and_a_missing_one() {
    let sb = Sandbox::new();
    let out = sb.command("print('hi')").output().expect("spawn jail");
    let doc: Value = serde_json::from_slice(&out.stdout).expect("a result");
    validate_result(&doc).expect("a real result is valid");

    let mut newer = doc.clone();
    newer["schema_version"] = Value::from(jail::result::SCHEMA_VERSION + 1);
    assert!(validate_result(&newer).unwrap_err().contains("schema_version"));
    assert!(jail::schema::check_version(&newer).is_err());

    let mut extra = doc.clone();
    extra["usage"]["made_up_ms"] = Value::from(1);
    assert!(validate_result(&extra).unwrap_err().contains("/usage"));

    let mut missing = doc.clone();
    missing.as_object_mut().unwrap().remove("status");
    assert!(validate_result(&missing).unwrap_err().contains("status"));

    let mut retyped = doc;
    retyped["status"] = Value::from("fine");
    assert!(validate_result(&retyped).is_err());
}

#[test]
fn a_setup_failure_result_is_valid_too() {
    let mut sb = Sandbox::new();
    sb.extra_args = vec!["--timeout=0".into()];
    let cmd = &mut sb.command("print('hi')");
    // `parse` validates: a setup_failed document must match the schema.
    let r = parse(&cmd.output().expect("spawn jail"));
    assert_eq!(r.status, Status::SetupFailed);
}
