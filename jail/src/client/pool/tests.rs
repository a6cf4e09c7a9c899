use super::*;
use serde_json::json;

const CEIL: Ceilings = Ceilings { wall_time: Duration::from_secs(15) };

fn err(line: &str) -> Error {
    Line::parse(line, CEIL).unwrap_err()
}

// ---- Today's bytes: every kind of reply line, byte for byte as the pool
// wrote it with `json!` and `format!` before its wire was typed (captured
// from that code at f35e873). ----

#[test]
fn an_error_reply_is_todays_line_byte_for_byte() {
    let e = err(r#"{"id":"x","code":"1","limits":{"wall_time_secs":99}}"#);
    assert_eq!(
        e.reply().text(),
        r#"{"error":{"code":"limit_above_policy","message":"limits.wall_time_secs is 99, above the pool's 15: lower it or start the pool with a larger --timeout"},"id":"x"}"#
    );
    assert_eq!(
        err("not json").reply().text(),
        r#"{"error":{"code":"malformed","message":"not JSON (expected ident at line 1 column 2): send one JSON object per line"},"id":null}"#
    );
    assert_eq!(
        Error::unknown_id("gone").reply().text(),
        r#"{"error":{"code":"unknown_id","message":"no request with this id is in flight (unknown, or already answered): nothing to cancel"},"id":"gone"}"#
    );
}

#[test]
fn a_result_reply_is_todays_line_byte_for_byte() {
    let result =
        json!({"status": "ok", "stdout": {"text": "hi\n", "bytes": 3}, "artifacts": [], "output_dir": null, "exit_code": 0});
    assert_eq!(
        Reply::result("r1", result).text(),
        r#"{"id":"r1","result":{"artifacts":[],"exit_code":0,"output_dir":null,"status":"ok","stdout":{"bytes":3,"text":"hi\n"}}}"#
    );
}

#[test]
fn an_event_line_is_todays_line_byte_for_byte_and_carried_as_written() {
    let line = Reply::event("a\"b\n", r#"{"type":"stdout","data":"x"}"#).unwrap().text();
    assert_eq!(line, r#"{"id":"a\"b\n","event":{"type":"stdout","data":"x"}}"#);
    assert!(!line.contains('\n'));
    // An artifact's event: its keys sorted, as `Value` wrote them.
    let a = json!({"path": "a.png", "bytes": 3, "kind": "image"});
    assert_eq!(
        Reply::artifact("r", &a).unwrap().text(),
        r#"{"id":"r","event":{"type":"artifact","artifact":{"bytes":3,"kind":"image","path":"a.png"}}}"#
    );
    assert!(Reply::event("r", "{not json").is_none());
}

/// JSON may have newlines between its tokens; an event is carried as
/// written, so one with a newline would be two lines when written again
/// (found by the pool_line fuzz target).
#[test]
fn an_event_of_more_than_one_line_is_neither_made_nor_read() {
    assert!(Reply::event("r", "{\"type\":\n\"stdout\"}").is_none());
    let read = br#"{"ilitiTs":{"wall_ti":5},"event":{"wall_":true
}}"#;
    assert!(Reply::parse(read).is_err());
    assert!(Reply::parse(br#"{"id":"r","event":{"type":"stdout","data":"a\nb"}}"#).is_ok());
}

fn some_stats() -> Stats {
    Stats {
        available_memory_bytes: Some(1000),
        idle: Some(Idle { anon_bytes: Some(3), pss_bytes: Some(2), rss_bytes: Some(1), uss_bytes: Some(2) }),
        idle_rss_bytes: 123,
        in_use: 1,
        making: 0,
        max_size: None,
        ready: 1,
        refill_ms: Refill { last: 58.2, mean: 0.0, median: 58.2, p99: 61.0 },
        sessions: 0,
        size: 2,
    }
}

#[test]
fn a_stats_reply_is_todays_line_byte_for_byte() {
    let stats = r#"{"available_memory_bytes":1000,"idle":{"anon_bytes":3,"pss_bytes":2,"rss_bytes":1,"uss_bytes":2},"idle_rss_bytes":123,"in_use":1,"making":0,"max_size":null,"ready":1,"refill_ms":{"last":58.2,"mean":0.0,"median":58.2,"p99":61.0},"sessions":0,"size":2}"#;
    let reply = Reply { id: Some("s".into()), body: Body::Stats(some_stats()) };
    assert_eq!(reply.text(), format!(r#"{{"id":"s","stats":{stats}}}"#));
    let reply = Reply { id: None, body: Body::Stats(some_stats()) };
    assert_eq!(reply.text(), format!(r#"{{"id":null,"stats":{stats}}}"#));
    let none_ready = Stats { idle: None, ..some_stats() };
    assert!(Reply { id: None, body: Body::Stats(none_ready) }.text().contains(r#""idle":null,"#));
}

#[test]
fn a_session_reply_is_todays_line_byte_for_byte() {
    let h = Handout { handle: "/run/h.sock".into(), id: "abc".into(), output_dir: "/o".into(), pid: 42 };
    let reply = Reply { id: Some("s1".into()), body: Body::Session(h) };
    assert_eq!(reply.text(), r#"{"id":"s1","session":{"handle":"/run/h.sock","id":"abc","output_dir":"/o","pid":42}}"#);
}

#[test]
fn every_reply_reads_back_as_written() {
    let replies = [
        err(r#"{"id":"x","code":"1","shell":1}"#).reply(),
        err("[1]").reply(),
        Reply::result("r", json!({"status": "ok"})),
        Reply::event("r", r#"{"type":"stderr","data":"\u0001"}"#).unwrap(),
        Reply { id: Some("s".into()), body: Body::Stats(some_stats()) },
        Reply {
            id: Some("s".into()),
            body: Body::Session(Handout { handle: "/h".into(), id: "i".into(), output_dir: "/o".into(), pid: 1 }),
        },
    ];
    for r in replies {
        assert_eq!(Reply::parse(r.text().as_bytes()).unwrap(), r, "{}", r.text());
    }
    assert!(Reply::parse(br#"{"id":"x"}"#).is_err(), "no kind");
    let newer = Reply::parse(br#"{"error":{"code":"too_new","message":"m"},"id":"x"}"#).unwrap();
    assert!(matches!(newer.body, Body::Error(Error { code: ErrorCode::Other, .. })));
}

#[test]
fn a_stats_answer_is_read_whole_or_with_its_unknowns_null() {
    let user = json!({"size": 1, "ready": 1, "refill_ms": {"last": 1.0, "mean": 1.0}, "idle_rss_bytes": 5,
                      "idle": {"rss_bytes": 9, "pss_bytes": null, "anon_bytes": null}});
    let s: Stats = serde_json::from_value(user).unwrap();
    assert_eq!(s.idle.unwrap(), Idle { rss_bytes: Some(9), pss_bytes: None, anon_bytes: None, uss_bytes: None });
    // A pool before the refill's median and p99: read as 0.
    assert_eq!(s.refill_ms, Refill { last: 1.0, mean: 1.0, median: 0.0, p99: 0.0 });
    let none_ready: Stats = serde_json::from_value(json!({"size": 1, "ready": 0, "idle": null})).unwrap();
    assert_eq!((none_ready.idle, none_ready.max_size), (None, None));
}

#[test]
fn the_codes_are_written_as_the_protocol_names_them() {
    for (code, text) in [
        (ErrorCode::Malformed, "malformed"),
        (ErrorCode::UnknownField, "unknown_field"),
        (ErrorCode::BadRequest, "bad_request"),
        (ErrorCode::LimitAbovePolicy, "limit_above_policy"),
        (ErrorCode::DuplicateId, "duplicate_id"),
        (ErrorCode::Draining, "draining"),
        (ErrorCode::Internal, "internal"),
        (ErrorCode::Cancelled, "cancelled"),
        (ErrorCode::UnknownId, "unknown_id"),
    ] {
        assert_eq!(serde_json::to_value(code).unwrap(), json!(text));
        assert_eq!(code.as_str(), text);
    }
}

// ---- Lines in ----

#[test]
fn a_code_request_takes_the_policy_limits_unless_lowered() {
    let line = r#"{"id":"r1","code":"print(1)","input":"/in","output":"/out","args":["a"]}"#;
    let want = Request {
        id: "r1".into(),
        source: Source::Code("print(1)".into()),
        input: Some("/in".into()),
        output: Some("/out".into()),
        args: vec!["a".into()],
        wall_time: CEIL.wall_time,
        events: false,
        env: Envs::default(),
    };
    assert_eq!(Line::parse(line, CEIL).unwrap(), Line::Run(want));
    let Line::Run(r) = Line::parse(r#"{"id":"r2","script":"/s.py","limits":{"wall_time_secs":2.5}}"#, CEIL).unwrap() else {
        panic!("not a run")
    };
    assert_eq!((r.source, r.wall_time), (Source::Script("/s.py".into()), Duration::from_millis(2500)));
    let Line::Run(r) = Line::parse(r#"{"id":"r3","code":"1","events":true}"#, CEIL).unwrap() else {
        panic!("not a run")
    };
    assert!(r.events);
}

#[test]
fn a_requests_variables_are_checked_as_every_doors_are() {
    let Line::Run(r) = Line::parse(r#"{"id":"r1","code":"1","env":{"API_KEY":"k"}}"#, CEIL).unwrap() else {
        panic!("not a run")
    };
    assert_eq!(r.env, Envs::from_pairs(["API_KEY=k"]).unwrap());
    for line in [
        r#"{"id":"r2","code":"1","env":{"LD_PRELOAD":"/x.so"}}"#,
        r#"{"id":"r3","code":"1","env":{"1X":"v"}}"#,
        r#"{"id":"r4","op":"session","env":{"JAIL_PRELOAD":"os"}}"#,
        r#"{"id":"r5","op":"cancel","env":{"A":"1"}}"#,
    ] {
        let e = err(line);
        assert_eq!((e.code, e.id.is_some()), (ErrorCode::BadRequest, true), "{line}: {e:?}");
    }
    assert_eq!(err(r#"{"id":"r6","code":"1","env":{"A":1}}"#).code, ErrorCode::Malformed);
}

#[test]
fn every_line_a_caller_writes_parses_back_to_itself() {
    let lines = [
        Line::Run(Request {
            id: "ab".into(),
            source: Source::Script("/w/t/ab/main.py".into()),
            input: Some("/w/t/ab/input".into()),
            output: Some("/w/t/ab/output".into()),
            args: vec![],
            wall_time: Duration::from_millis(2500),
            events: true,
            env: Envs::from_pairs(["A=1", "B="]).unwrap(),
        }),
        Line::Run(Request {
            id: "c".into(),
            source: Source::Code("print(1)".into()),
            input: None,
            output: None,
            args: vec!["x".into()],
            wall_time: CEIL.wall_time,
            events: false,
            env: Envs::default(),
        }),
        Line::Stats { id: Some("s".into()) },
        Line::Stats { id: None },
        Line::Session(SessionRequest {
            id: "s1".into(),
            input: Some("/w/in".into()),
            output: Some("/w/out".into()),
            env: Envs::from_pairs(["TOKEN=t"]).unwrap(),
        }),
        Line::Session(SessionRequest { id: "s2".into(), input: None, output: None, env: Envs::default() }),
        Line::Cancel { id: "r1".into() },
    ];
    for line in lines {
        assert_eq!(Line::parse(&line.text(), CEIL).unwrap(), line, "{}", line.text());
    }
    assert_eq!(Line::Cancel { id: "r1".into() }.text(), r#"{"id":"r1","op":"cancel"}"#);
    assert_eq!(Line::Stats { id: None }.text(), r#"{"op":"stats"}"#);
}

#[test]
fn stats_is_its_own_line() {
    assert_eq!(Line::parse(r#"{"op":"stats"}"#, CEIL).unwrap(), Line::Stats { id: None });
    assert_eq!(Line::parse(r#"{"op":"stats","id":"s"}"#, CEIL).unwrap(), Line::Stats { id: Some("s".into()) });
    assert_eq!(err(r#"{"op":"stats","code":"x"}"#).code, ErrorCode::BadRequest);
    assert_eq!(err(r#"{"op":"restart"}"#).code, ErrorCode::BadRequest);
    assert_eq!(err(r#"{"op":"stats","events":true}"#).code, ErrorCode::BadRequest);
}

#[test]
fn a_session_line_takes_an_id_and_its_folders_only() {
    let line = r#"{"id":"s1","op":"session","input":"/in","output":"/out"}"#;
    let want = SessionRequest {
        id: "s1".into(),
        input: Some("/in".into()),
        output: Some("/out".into()),
        env: Envs::default(),
    };
    assert_eq!(Line::parse(line, CEIL).unwrap(), Line::Session(want));
    let bare = SessionRequest { id: "s2".into(), input: None, output: None, env: Envs::default() };
    assert_eq!(Line::parse(r#"{"op":"session","id":"s2"}"#, CEIL).unwrap(), Line::Session(bare));
    for (line, id) in [
        (r#"{"op":"session"}"#, None),
        (r#"{"op":"session","id":"s","code":"1"}"#, Some("s")),
        (r#"{"op":"session","id":"s","events":true}"#, Some("s")),
        (r#"{"op":"session","id":"s","limits":{"wall_time_secs":1}}"#, Some("s")),
        (r#"{"op":"session","id":"s","output":"rel"}"#, Some("s")),
        (r#"{"op":"session","id":"s","input":"/a/../b"}"#, Some("s")),
    ] {
        let e = err(line);
        assert_eq!((e.code, e.id.as_deref()), (ErrorCode::BadRequest, id), "{line}: {}", e.message);
    }
    assert_eq!(err(r#"{"op":"session","id":"s","shell":1}"#).code, ErrorCode::UnknownField);
}

#[test]
fn a_cancel_line_names_the_request_and_nothing_else() {
    assert_eq!(Line::parse(r#"{"op":"cancel","id":"r1"}"#, CEIL).unwrap(), Line::Cancel { id: "r1".into() });
    for (line, id) in [
        (r#"{"op":"cancel"}"#, None),
        (r#"{"op":"cancel","id":"r","code":"1"}"#, Some("r")),
        (r#"{"op":"cancel","id":"r","limits":{"wall_time_secs":1}}"#, Some("r")),
        (r#"{"op":"cancel","id":""}"#, None),
    ] {
        let e = err(line);
        assert_eq!((e.code, e.id.as_deref()), (ErrorCode::BadRequest, id), "{line}: {}", e.message);
    }
}

#[test]
fn bad_lines_get_a_code_and_keep_the_id_they_had() {
    use ErrorCode::*;
    for (line, code, id) in [
        ("not json", Malformed, None),
        ("[1]", Malformed, None),
        (r#"{"id":"x","code":"1","shell":true}"#, UnknownField, Some("x")),
        (r#"{"id":"x","limits":{"memory":"1G"},"code":"1"}"#, UnknownField, Some("x")),
        (r#"{"code":"1"}"#, BadRequest, None),
        (r#"{"id":"","code":"1"}"#, BadRequest, None),
        (r#"{"id":"x"}"#, BadRequest, Some("x")),
        (r#"{"id":"x","code":"1","script":"/a"}"#, BadRequest, Some("x")),
        (r#"{"id":"x","script":"rel.py"}"#, BadRequest, Some("x")),
        (r#"{"id":"x","code":"1","input":"/a/../etc"}"#, BadRequest, Some("x")),
        (r#"{"id":"x","code":"1","limits":{"wall_time_secs":0}}"#, BadRequest, Some("x")),
        // A positive number under 1 ms would be a zero Duration (found by fuzz/pool_line).
        (r#"{"id":"x","code":"1","limits":{"wall_time_secs":1e-15}}"#, BadRequest, Some("x")),
        (r#"{"id":"x","code":"1","limits":{"wall_time_secs":16}}"#, LimitAbovePolicy, Some("x")),
        (r#"{"id":"x","code":"1","limits":{"wall_time_secs":1e300}}"#, LimitAbovePolicy, Some("x")),
        (r#"{"id":"x","code":"1","limits":{"cpu_time_secs":1}}"#, UnknownField, Some("x")),
        (r#"{"id":"x","code":"1","events":"yes"}"#, Malformed, Some("x")),
    ] {
        let e = err(line);
        assert_eq!((e.code, e.id.as_deref()), (code, id), "{line}: {}", e.message);
        assert!(!e.message.contains('\n'), "{line}: one line");
    }
}

#[test]
fn the_message_tests_the_clients_make_hold_for_the_pools_own_messages() {
    let never = Error::new(ErrorCode::Internal, format!("{SET_ARGV}: session /s.sock ended (no cell for 600s)"));
    assert!(never.never_started());
    assert!(!Error::new(ErrorCode::Internal, "run the step: the session ended").never_started());
    let refused = Error::new(ErrorCode::BadRequest, format!("{REFUSES_SESSIONS} (filesystem.output_size \"unlimited\")"));
    assert!(refused.refuses_sessions());
    assert!(!Error::new(ErrorCode::BadRequest, "input /x: no such folder").refuses_sessions());
    assert!(!Error::new(ErrorCode::Internal, refused.message.clone()).refuses_sessions());
}

#[test]
fn a_long_lines_id_is_read_from_its_head() {
    assert_eq!(leading_id(br#"{"id":"0123abcd","result":{"#), Some("0123abcd".into()));
    assert_eq!(leading_id(br#"{"event":{},"id":"x"}"#), None);
    assert_eq!(result_id(br#"{"id":"r1","result":{"status":"ok"}}"#).as_deref(), Some("r1"));
    assert_eq!(result_id(br#"{"id":"r1","event":{}}"#), None);
    assert_eq!(result_id(br#"{"error":{},"id":"r1"}"#), None);
}
