"""RemoteSandbox against a service that misbehaves: a stand-in HTTP server
on loopback (the real `jail-serve` never sends these) that answers with a
result of another schema version, a reply over the cap, an artifact path
that climbs out, a redirect, HTML from a proxy, silence, a broken event
stream, or 503 with Retry-After. The client must refuse or recover, never
trust."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Dict, List, Tuple

import pytest

import jail_sandbox._remote as remote_module
from jail_sandbox import RemoteConnectionError, RemoteError, RemoteSandbox, RemoteTimeoutError, SandboxProtocolError

TOKEN = "stand-in-token-0123456789"
RUN_ID = "0123456789abcdef0123456789abcdef"


def result(**fields) -> Dict:
    doc = {"schema_version": 2, "status": "ok", "exit_code": 0, "stdout": {"text": "hi\n"}, "stderr": {"text": ""}, "artifacts": []}
    doc.update(fields)
    return doc


Reply = Tuple[int, Dict[str, str], bytes]
Script = Callable[["Handler"], Reply]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    routes: Dict[Tuple[str, str], Script] = {}
    seen: List[Tuple[str, str]] = []

    def log_message(self, *args) -> None:
        pass

    def handle_one(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(length) if length else b""
        key = (self.command, self.path)
        self.seen.append(key)
        script = self.routes.get(key)
        if script is None:
            status, headers, body = 404, {}, b'{"error":{"code":"not_found","field":null,"message":"no"}}'
        else:
            reply = script(self)
            if reply is None:
                return  # the script answered itself
            status, headers, body = reply
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = handle_one


@pytest.fixture()
def stand_in():
    Handler.routes = {}
    Handler.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield Handler.routes, RemoteSandbox(f"http://127.0.0.1:{httpd.server_address[1]}", TOKEN, request_timeout=2)
    finally:
        httpd.shutdown()
        httpd.server_close()


def done(doc: Dict) -> Script:
    return lambda h: (200, {"Content-Type": "application/json"}, json.dumps({"id": RUN_ID, "state": "done", "result": doc}).encode())


def test_a_result_of_another_schema_version_is_refused(stand_in):
    routes, sandbox = stand_in
    routes[("POST", "/v1/runs")] = done(result(schema_version=99))
    with pytest.raises(SandboxProtocolError, match="schema_version 99"):
        sandbox.run("print(1)")


def test_a_reply_over_the_cap_is_refused(stand_in, monkeypatch):
    routes, sandbox = stand_in
    monkeypatch.setattr(remote_module, "MAX_REPLY_BYTES", 1000)
    routes[("POST", "/v1/runs")] = done(result(stdout={"text": "x" * 5000}))
    with pytest.raises(SandboxProtocolError, match="over 1000 bytes"):
        sandbox.run("print(1)")


@pytest.mark.parametrize("path", ["../../etc/passwd", "/etc/passwd", "a//b", "a/./b", "ok\n.txt", 7])
def test_an_artifact_path_that_is_not_plainly_relative_is_refused(stand_in, path):
    routes, sandbox = stand_in
    artifact = {"path": path, "bytes": 1, "sha256": "0" * 64, "media_type": "text/plain", "change": "created"}
    routes[("POST", "/v1/runs")] = done(result(artifacts=[artifact]))
    with pytest.raises(SandboxProtocolError, match="artifacts"):
        sandbox.run("print(1)")


def test_fields_of_the_wrong_type_are_refused(stand_in):
    routes, sandbox = stand_in
    routes[("POST", "/v1/runs")] = done(result(stdout={"text": 5}))
    with pytest.raises(SandboxProtocolError, match="stdout"):
        sandbox.run("print(1)")
    routes[("POST", "/v1/runs")] = lambda h: (200, {}, b'{"id": "../../x", "state": "done", "result": {}}')
    with pytest.raises(SandboxProtocolError, match="no usable id"):
        sandbox.run("print(1)")


def test_a_redirect_is_not_followed_so_the_token_goes_nowhere_else(stand_in):
    routes, sandbox = stand_in
    routes[("POST", "/v1/runs")] = lambda h: (307, {"Location": "http://elsewhere.example/v1/runs"}, b"")
    with pytest.raises(RemoteError) as info:
        sandbox.run("print(1)")
    assert info.value.status == 307 and "unexpected HTTP 307" in str(info.value)
    assert Handler.seen == [("POST", "/v1/runs")]


def test_an_error_page_that_is_not_the_json_error_keeps_its_start(stand_in):
    routes, sandbox = stand_in
    routes[("POST", "/v1/runs")] = lambda h: (502, {"Content-Type": "text/html"}, b"<html>Bad Gateway</html>")
    with pytest.raises(RemoteError) as info:
        sandbox.run("print(1)")
    e = info.value
    assert (e.status, e.code, e.field) == (502, None, None)
    assert "the service failed (502)" in str(e) and "Bad Gateway" in e.message


def test_503_with_retry_after_is_retried_and_a_long_retry_after_is_not(stand_in):
    routes, sandbox = stand_in
    answers = [
        (503, {"Retry-After": "1"}, b'{"error":{"code":"draining","field":null,"message":"shutting down"}}'),
        done(result())(None),  # type: ignore[arg-type]
    ]
    routes[("POST", "/v1/runs")] = lambda h: answers.pop(0)
    started = time.monotonic()
    assert sandbox.run("print(1)").stdout == "hi\n"
    assert time.monotonic() - started >= 1.0
    assert Handler.seen == [("POST", "/v1/runs")] * 2
    routes[("POST", "/v1/runs")] = lambda h: (
        429,
        {"Retry-After": "3600"},
        b'{"error":{"code":"busy","field":null,"message":"full"}}',
    )
    started = time.monotonic()
    with pytest.raises(RemoteError) as info:
        sandbox.run("print(1)")
    assert time.monotonic() - started < 1.0, "an hour's Retry-After is raised, not waited for"
    assert (info.value.status, info.value.retry_after) == (429, 3600.0)
    assert "retry after 3600 s" in str(info.value)


def test_a_silent_service_is_a_timeout(stand_in):
    routes, sandbox = stand_in

    def silent(h: Handler):
        time.sleep(5)
        return (200, {}, b"{}")

    routes[("POST", "/v1/sessions")] = silent
    started = time.monotonic()
    with pytest.raises(RemoteTimeoutError, match="no answer"):
        sandbox.session()
    assert time.monotonic() - started < 4, "request_timeout=2 bounds the wait"
    assert isinstance(RemoteTimeoutError("x", status=None), RemoteConnectionError)


def test_a_broken_event_stream_is_followed_again_without_repeating_a_chunk(stand_in):
    routes, sandbox = stand_in
    routes[("POST", "/v1/runs")] = lambda h: (202, {}, json.dumps({"id": RUN_ID, "state": "running", "result": None}).encode())
    chunk_a = b'data: {"type":"stdout","data":"a\\n"}\n\n'
    whole = (
        chunk_a
        + b": a comment\n\n"
        + b'data: {"type":"stdout","data":"b\\n"}\n\n'
        + b"data: "
        + json.dumps({"type": "result", "result": result(stdout={"text": "a\nb\n"})}).encode()
        + b"\n\nevent: end\ndata: {}\n\n"
    )
    streams = [chunk_a, whole]

    def events(h: Handler):
        body = streams.pop(0)
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write(body)  # and, the first time, close before `event: end`
        return None

    routes[("GET", f"/v1/runs/{RUN_ID}/events")] = events
    routes[("GET", f"/v1/runs/{RUN_ID}")] = done(result(stdout={"text": "a\nb\n"}))
    got: List[str] = []
    ex = sandbox.run("print('a'); print('b')", on_stdout=got.append)
    assert got == ["a\n", "b\n"]
    assert ex.stdout == "a\nb\n"
    assert Handler.seen.count(("GET", f"/v1/runs/{RUN_ID}/events")) == 2


def test_a_run_the_service_failed_ends_its_events_with_an_error_raised_as_its_code(stand_in):
    routes, sandbox = stand_in
    routes[("POST", "/v1/runs")] = lambda h: (202, {}, json.dumps({"id": RUN_ID, "state": "running", "result": None}).encode())
    error = {"type": "error", "error": {"code": "pool_lost", "message": "the warm pool ended: send it again"}}
    routes[("GET", f"/v1/runs/{RUN_ID}/events")] = lambda h: (
        200,
        {"Content-Type": "text/event-stream"},
        b': keepalive\n\ndata: {"type":"stdout","data":"part\\n"}\n\ndata: '
        + json.dumps(error).encode()
        + b"\n\nevent: end\ndata: {}\n\n",
    )
    got: List[str] = []
    with pytest.raises(RemoteError) as info:
        sandbox.run("print(1)", on_stdout=got.append)
    e = info.value
    assert (e.status, e.code) == (None, "pool_lost") and "send it again" in e.message, str(e)
    assert got == ["part\n"], "the chunks before the error are handed on, the keepalive is not"
    # The end of the events is the end: no poll of the run's state, no cancel of a run that ended.
    assert Handler.seen == [("POST", "/v1/runs"), ("GET", f"/v1/runs/{RUN_ID}/events")], Handler.seen


def test_events_that_end_with_neither_a_result_nor_an_error_are_refused(stand_in):
    routes, sandbox = stand_in
    routes[("POST", "/v1/runs")] = lambda h: (202, {}, json.dumps({"id": RUN_ID, "state": "running", "result": None}).encode())
    routes[("GET", f"/v1/runs/{RUN_ID}/events")] = lambda h: (
        200,
        {"Content-Type": "text/event-stream"},
        b'data: {"type":"stdout","data":"x"}\n\nevent: end\ndata: {}\n\n',
    )
    with pytest.raises(SandboxProtocolError, match="neither a result nor an error"):
        sandbox.run("print(1)", on_stdout=lambda t: None)


def test_an_event_stream_silent_past_its_keepalives_is_opened_again_then_the_run_cancelled(stand_in, monkeypatch):
    routes, sandbox = stand_in
    monkeypatch.setattr(remote_module, "EVENTS_SILENCE", 1.0)
    routes[("POST", "/v1/runs")] = lambda h: (202, {}, json.dumps({"id": RUN_ID, "state": "running", "result": None}).encode())

    def silent(h: Handler):
        # Headers, then nothing: no event, no keepalive.
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        h.wfile.flush()
        time.sleep(3)

    routes[("GET", f"/v1/runs/{RUN_ID}/events")] = silent
    routes[("DELETE", f"/v1/runs/{RUN_ID}")] = lambda h: (200, {}, json.dumps({"id": RUN_ID, "state": "done"}).encode())
    started = time.monotonic()
    with pytest.raises(RemoteConnectionError, match="cancelled on the service"):
        RemoteSandbox(sandbox.url, TOKEN, request_timeout=2, retries=1).run("print(1)", on_stdout=lambda t: None)
    assert time.monotonic() - started < 10
    events = [k for k in Handler.seen if k[0] == "GET"]
    assert len(events) == 2, f"opened once more after the silence: {Handler.seen}"
    assert Handler.seen[-1] == ("DELETE", f"/v1/runs/{RUN_ID}"), "a run no longer followed is cancelled"


def test_a_refused_event_stream_is_the_services_error(stand_in):
    routes, sandbox = stand_in
    routes[("POST", "/v1/runs")] = lambda h: (202, {}, json.dumps({"id": RUN_ID, "state": "running", "result": None}).encode())
    # No events route: the stand-in answers 404 with the JSON error.
    with pytest.raises(RemoteError) as info:
        sandbox.run("print(1)", on_stdout=lambda t: None)
    assert (info.value.status, info.value.code) == (404, "not_found")


def test_an_https_url_speaks_tls_and_a_plain_http_answer_is_a_tls_failure(stand_in):
    routes, sandbox = stand_in
    routes[("POST", "/v1/runs")] = done(result())
    port = sandbox.url.rsplit(":", 1)[1]
    tls = RemoteSandbox(f"https://127.0.0.1:{port}", TOKEN, request_timeout=2, retries=0)
    with pytest.raises(RemoteConnectionError, match="TLS with https://127.0.0.1"):
        tls.run("print(1)")
    assert ("POST", "/v1/runs") not in Handler.seen, "the request went out in plain HTTP"


def test_a_reply_dripped_a_byte_at_a_time_is_a_timeout_not_a_hang(stand_in):
    routes, sandbox = stand_in
    stop = threading.Event()

    def drip(h: Handler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", "100000")
        h.end_headers()
        # Each byte well within the 2 s per-read timeout, for ever.
        while not stop.is_set():
            try:
                h.wfile.write(b" ")
                h.wfile.flush()
            except OSError:
                return
            time.sleep(0.2)

    routes[("POST", "/v1/runs")] = drip
    started = time.monotonic()
    try:
        with pytest.raises(RemoteTimeoutError, match="slower than 64 KiB/s"):
            sandbox._json("POST", "/v1/runs", {"code": "pass"}, timeout=2)
    finally:
        stop.set()
    assert time.monotonic() - started < 6, "bounded by the timeout, not by the byte count"
