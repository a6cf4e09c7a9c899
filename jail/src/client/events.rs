//! Reading what `jail` prints: each line of `--events` (read by the one
//! bounded reader, `client::lines`, re-exported here for the callers of
//! `jail run`) as what it says, and one `result_of` that reads a result
//! document as ours.

pub use super::lines::{read_to_end, Line, Lines};
use crate::events::{Event, RESULT_PREFIX};
use crate::result::RunResult;

/// Whether a whole line is the result event (the last line of `--events`).
pub fn is_result(line: &[u8]) -> bool {
    line.starts_with(RESULT_PREFIX)
}

/// One line of `jail run --events` read as what it says.
#[derive(Debug)]
pub enum Seen {
    Event(Event<'static>),
    Result(Box<Result<RunResult, ResultError>>),
    /// Over the cap, or not an event this client knows: counted.
    Dropped,
}

/// Read one line of `jail run --events` (or of a session cell's events).
pub fn seen(line: Line<'_>) -> Seen {
    let Line::Whole(text) = line else { return Seen::Dropped };
    if is_result(text) {
        #[derive(serde::Deserialize)]
        struct Doc {
            result: serde_json::Value,
        }
        return match serde_json::from_slice::<Doc>(text) {
            Ok(doc) => Seen::Result(Box::new(result_of(doc.result))),
            Err(e) => Seen::Result(Box::new(Err(ResultError::Contract(e.to_string())))),
        };
    }
    match serde_json::from_slice::<Event<'static>>(text) {
        Ok(event) => Seen::Event(event),
        Err(_) => Seen::Dropped,
    }
}

/// Why a result document is not read as ours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResultError {
    /// Another schema version: its fields may not mean what ours do.
    #[error("{0}")]
    Version(String),
    /// This version, but not our `RunResult`.
    #[error("{0}")]
    Contract(String),
}

/// A result document read as ours: the schema version checked first
/// (jail/src/schema.rs), then the type.
pub(crate) fn result_of(doc: serde_json::Value) -> Result<RunResult, ResultError> {
    crate::schema::check_version(&doc).map_err(|e| ResultError::Version(e.to_string()))?;
    serde_json::from_value(doc).map_err(|e| ResultError::Contract(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::lines::tests::lines_of;

    #[test]
    fn a_character_split_between_reads_comes_whole() {
        let line = "{\"type\":\"stdout\",\"data\":\"a☃b\"}\n".as_bytes();
        let at = line.iter().position(|&b| b == 0xE2).unwrap() + 1;
        let got = lines_of(1 << 10, &[&line[..at], &line[at..]]);
        assert_eq!(got, vec![Some(line[..line.len() - 1].to_vec())]);
        let Seen::Event(Event::Stdout { data, .. }) = seen(Line::Whole(got[0].as_deref().unwrap())) else {
            panic!()
        };
        assert_eq!(data, "a☃b");
    }

    #[test]
    fn what_the_jail_writes_is_what_a_client_reads() {
        let event = Event::Stderr { data: "oops\n".into(), base64: None };
        let text = serde_json::to_vec(&event).unwrap();
        let Seen::Event(back) = seen(Line::Whole(&text)) else { panic!() };
        assert_eq!(back, event);
        let truncated = br#"{"type":"truncated","stream":"stdout","limit_bytes":8}"#;
        assert!(matches!(seen(Line::Whole(truncated)), Seen::Event(Event::Truncated { limit_bytes: 8, .. })));
        assert!(matches!(seen(Line::Whole(b"{\"type\":\"new\"}")), Seen::Dropped));
        assert!(matches!(seen(Line::TooLong), Seen::Dropped));
    }

    #[test]
    fn a_result_of_another_version_is_refused_before_its_type_is_read() {
        let line = br#"{"type":"result","result":{"schema_version":999,"status":"ok"}}"#;
        let Seen::Result(r) = seen(Line::Whole(line)) else { panic!() };
        assert!(matches!(*r, Err(ResultError::Version(_))));
        let this = format!(r#"{{"type":"result","result":{{"schema_version":{}}}}}"#, crate::result::SCHEMA_VERSION);
        let Seen::Result(r) = seen(Line::Whole(this.as_bytes())) else { panic!() };
        assert!(matches!(*r, Err(ResultError::Contract(_))));
    }
}
