//! The wire: request and reply bodies, and the JSON error every refusal is.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use jail::envs::Envs;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A refusal: `{"error": {"code", "field", "message"}}` (and `reason`
/// when the files API refused a file or its name by the artifact rules);
/// `message` says what was wrong and how to fix it.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub field: Option<String>,
    pub message: String,
    pub retry_after: Option<Duration>,
    /// The artifact rules' reason (`bad_name`, `extension_not_allowed`,
    /// ...), for a file of a session's files API, or its name, that they
    /// refused.
    pub reason: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorSent,
}

/// A refusal as it is sent: the error, and the artifact check's reason
/// when there is one.
#[derive(Serialize, ToSchema)]
pub struct ErrorSent {
    #[serde(flatten)]
    pub error: ErrorDetail,
    /// Why the artifact rules refused a file of a session's files API, or
    /// its name (`bad_name`, `too_deep`, `extension_not_allowed`,
    /// `hard_link`, `formula_cells`, ...: a result's
    /// `rejected_artifacts[].reason`); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct ErrorDetail {
    /// A stable name: `bad_request`, `unauthorized`, `not_found`, `too_large`, `busy`, `draining`,
    /// `failed`, `pool_lost` (the warm pool ended while the run was in it: send it again),
    /// `cancelled` (the run was cancelled before it reached a jail: nothing ran),
    /// `session_ended` (the session ended by itself: start a new one); from a session's files
    /// API, why it refused a file: `bad_path`, `not_found`, `link`, `not_a_file`, `too_large`,
    /// `rejected`, `unavailable`, `failed`.
    pub code: String,
    /// The request field at fault, when one is (`path` when the files API refused the path
    /// itself: `bad_path`, `not_found`, `link`, `not_a_file`).
    pub field: Option<String>,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            field: None,
            message: message.into(),
            retry_after: None,
            reason: None,
        }
    }
    pub fn field(field: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError {
            field: Some(field.into()),
            ..ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
        }
    }
    pub fn not_found(what: &str) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no {what} with this id for this token"))
    }
    pub fn busy(message: impl Into<String>) -> ApiError {
        ApiError {
            retry_after: Some(Duration::from_secs(1)),
            ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "busy", message)
        }
    }
    pub fn draining() -> ApiError {
        ApiError {
            retry_after: Some(Duration::from_secs(5)),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "draining",
                "this server is shutting down: send the request to another replica",
            )
        }
    }
    pub fn failed(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "failed", message)
    }
    /// Cancelled (`DELETE /v1/runs/{id}`) before it reached a jail: 409.
    pub fn cancelled(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, "cancelled", message)
    }
    /// The warm pool ended with the run in it: 502, and a retry may succeed.
    pub fn pool_lost(message: impl Into<String>) -> ApiError {
        ApiError {
            retry_after: Some(Duration::from_secs(1)),
            ..ApiError::new(StatusCode::BAD_GATEWAY, "pool_lost", message)
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorSent {
                error: ErrorDetail { code: self.code.into(), field: self.field, message: self.message },
                reason: self.reason,
            },
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(after) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&after.as_secs().max(1).to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        response
    }
}

/// `POST /v1/runs`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// Python source, run as /workspace/code/main.py in a fresh jail.
    pub code: String,
    /// Input files by name (UTF-8 text), copied to /workspace/input/NAME.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// Input files as a tar archive, base64-encoded, optionally
    /// gzip-compressed: unpacked into /workspace/input beside `files`.
    /// Only regular files and folders; links, devices, FIFOs, absolute
    /// names, `..` and names also in `files` are refused (400, the entry
    /// named). Bounded: the token's bytes in (unpacked), 4096 entries, 32
    /// folders deep.
    #[serde(default)]
    #[schema(format = Byte)]
    pub input_tar: Option<String>,
    #[serde(default)]
    pub limits: Limits,
    /// `true` (the default): reply when the run ends, with its result (a
    /// client that goes away cancels the run). `false`: reply 202 with the
    /// id at once; follow `/v1/runs/{id}/events` or poll `/v1/runs/{id}`;
    /// `DELETE /v1/runs/{id}` cancels it.
    #[serde(default = "yes")]
    pub wait: bool,
    /// Variables for the script, NAME to value (at most 64, 32 KiB as
    /// JSON; names as in a shell, not `JAIL_*`, `PYTHON*`, `LD_*` or the
    /// proxy variables): refused with 400 and `field: "env"`, naming it.
    #[serde(default)]
    #[schema(value_type = BTreeMap<String, String>)]
    pub env: Envs,
}

fn yes() -> bool {
    true
}

/// Limits of one run, each at most the tenant's.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Wall-clock seconds, at least 0.001 (default: the tenant's most).
    pub timeout_secs: Option<f64>,
    /// Memory of the whole run in MiB (default: the tenant's most).
    pub memory_mib: Option<u64>,
}

/// A run's reply: its id and, once it ended, the jail's result document
/// (schema/result.schema.json, `jail schema`), or why there is none.
#[derive(Serialize, ToSchema)]
pub struct RunReply {
    pub id: String,
    /// `running`; `done`: it ended and `result` is its document, whatever
    /// its status (`cancelled` after a `DELETE`); `failed`: it ended
    /// without one (the jail printed no result, the warm pool was lost, it
    /// was cancelled before it reached a jail) and `error` says why.
    pub state: String,
    /// Where the run runs: `pool` (a jail made ahead by the warm pool) or
    /// `spawn` (a `jail run` of its own). Absent for session cells.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub result: Option<serde_json::Value>,
    /// Why a `failed` run has no result: `code` (`failed`, `pool_lost`,
    /// `cancelled`) and `message`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorDetail>,
}

impl RunReply {
    /// A session's cell or closing result.
    pub fn done(id: &str, result: serde_json::Value) -> RunReply {
        RunReply {
            id: id.into(),
            state: "done".into(),
            backend: None,
            result: Some(result),
            error: None,
        }
    }
}

/// `POST /v1/sessions` (an empty body is `{}`).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    /// Limits of the session: `timeout_secs` is each cell's wall-clock
    /// limit, `memory_mib` the whole session's.
    #[serde(default)]
    pub limits: Limits,
    /// Input files by name (UTF-8 text), at /workspace/input/NAME for
    /// every cell, as a run's `files`.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// Input files as a tar archive, base64-encoded, optionally
    /// gzip-compressed, checked and bounded exactly as a run's `input_tar`.
    #[serde(default)]
    #[schema(format = Byte)]
    pub input_tar: Option<String>,
    /// Variables for every cell, NAME to value, checked as a run's `env`.
    #[serde(default)]
    #[schema(value_type = BTreeMap<String, String>)]
    pub env: Envs,
}

/// `POST /v1/sessions/{id}/exec`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// Python source of the next cell.
    pub code: String,
    /// Variables for this cell only, over the session's (checked as a
    /// run's `env`); set back once the cell ends.
    #[serde(default)]
    #[schema(value_type = BTreeMap<String, String>)]
    pub env: Envs,
}

#[derive(Serialize, ToSchema)]
pub struct SessionReply {
    pub id: String,
    /// Where its jail came from: `pool` (a jail the warm pool made ahead,
    /// its preload imported) or `spawn` (a `jail session start` of its own).
    pub backend: String,
}

/// `PUT /v1/sessions/{id}/files/{path}`'s reply: the file as it is now
/// in the session's `/workspace/output`.
#[derive(Serialize, ToSchema)]
pub struct FileWritten {
    /// Relative to `/workspace/output`.
    pub path: String,
    pub bytes: u64,
    /// Lowercase hex sha256 of the bytes written.
    pub sha256: String,
}

/// `GET /v1/sessions/{id}/files`'s reply: a folder of the session's
/// `/workspace/output`, its entries sorted by name.
#[derive(Serialize, ToSchema)]
pub struct FileListing {
    /// The folder, relative to `/workspace/output` (`""`: the folder itself).
    pub path: String,
    pub entries: Vec<FileListed>,
    /// More entries than a listing gives (4096): the rest are not listed.
    pub truncated: bool,
}

/// One entry of a [`FileListing`].
#[derive(Serialize, ToSchema)]
pub struct FileListed {
    /// Its name (control characters escaped).
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`: a link is listed, never followed.
    pub kind: String,
    /// A file's size; 0 for anything else.
    pub bytes: u64,
}

/// `GET /v1/sessions/{id}/files`'s query.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileQuery {
    /// The folder to list, relative to `/workspace/output` (default: the folder itself).
    #[serde(default)]
    pub path: String,
}

/// Parse a JSON body into `T`, naming the field at fault.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let field = if path == "." { None } else { Some(path) };
        let message = format!("{inner}: send a JSON object as the API documents it (GET /openapi.json)");
        ApiError { field, ..ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_nested_field_is_named() {
        let e = parse::<RunRequest>(br#"{"code":"1","limits":{"memory":1}}"#).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("limits.memory"));
        assert!(e.message.contains("unknown field `memory`"), "{}", e.message);
    }

    #[test]
    fn a_missing_code_is_refused() {
        let e = parse::<RunRequest>(br#"{}"#).unwrap_err();
        assert!(e.message.contains("missing field `code`"), "{}", e.message);
    }
}
