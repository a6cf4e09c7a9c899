"""A live session's files API through every Python door (``session.files``):
a local session started or claimed from the pool (``jail session
put|get|ls``), a RemoteSession (``/v1/sessions/{id}/files``) and the async
ones. A file written mid-session is read by the next cell; what a cell
writes comes back judged as an artifact (a CSV's formula cell
neutralised); and every way out is the same typed refusal, local or
remote: ``..``, a link a cell made, a file over the cap, an extension the
policy does not allow. A session that is closed or gone raises
SessionClosedError, another tenant's is gone too."""

from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import SOLO_TOKEN, TOKEN

from jail_sandbox import (
    ArtifactMismatchError,
    AsyncRemoteSandbox,
    AsyncSandbox,
    FileEntry,
    FileInfo,
    FileRefusedError,
    RemoteSandbox,
    Sandbox,
    SessionClosedError,
)
from jail_sandbox._sandbox import MAX_FILE

PRICES = b"item,price\npen,2\n"
# A cell reads the file put, adds a total with a formula, and writes another.
TOTAL = (
    "import csv\n"
    "rows = list(csv.reader(open('/workspace/output/data/prices.csv')))\n"
    "rows.append(['total', '=SUM(B2:B2)'])\n"
    "csv.writer(open('/workspace/output/total.csv', 'w', newline=''), lineterminator='\\n').writerows(rows)\n"
    "print(len(rows))"
)
# What the judged copy holds: the formula cell neutralised.
JUDGED = b"item,price\npen,2\ntotal,'=SUM(B2:B2)\n"
# What a hostile cell leaves for the files API.
TRAPS = (
    "import os\n"
    "os.symlink('/etc/passwd', 'passwd.txt')\n"
    "os.symlink('/etc', 'etc')\n"
    "open('run.sh', 'w').write('echo hi')\n"
    "open('ok.txt', 'w').write('fine')"
)


def files_round_trip(s) -> None:
    """Write, a cell reads and writes, read back judged, list: one session."""
    info = s.files.write("data/prices.csv", PRICES)
    assert info == FileInfo(path="data/prices.csv", bytes=len(PRICES), sha256=info.sha256) and len(info.sha256) == 64
    assert s.run(TOTAL).stdout == "3\n", "the cell did not read the file written mid-session"
    assert s.files.read("total.csv") == JUDGED
    assert s.files.read("/workspace/output/data/prices.csv") == PRICES
    assert s.files.write("note.txt", "héllo").bytes == len("héllo".encode("utf-8"))
    assert s.run("print(open('note.txt').read())").stdout == "héllo\n"
    listed = s.files.list()
    assert [(e.name, e.kind) for e in listed] == [("data", "dir"), ("note.txt", "file"), ("total.csv", "file")]
    assert listed.truncated is False  # type: ignore[attr-defined]
    assert s.files.list("data") == [FileEntry(name="prices.csv", kind="file", bytes=len(PRICES), path="data/prices.csv")]


def refuses_the_ways_out(s) -> None:
    """Each way out is a FileRefusedError with its code; the session lives on."""
    assert s.run(TRAPS).ok

    def refused(call, *args, code: str, reason=None) -> FileRefusedError:
        with pytest.raises(FileRefusedError) as e:
            call(*args)
        assert e.value.code == code and (reason is None or e.value.reason == reason), e.value
        assert "root:x:0" not in str(e.value)
        return e.value

    for path in ("../code/main.py", "data/../../x.txt", "/etc/passwd", "-rf.txt"):
        refused(s.files.read, path, code="bad_path")
        refused(s.files.write, path, b"x", code="bad_path")
    refused(s.files.list, "..", code="bad_path")
    # A link, as the file or on the way, is never followed.
    refused(s.files.read, "passwd.txt", code="link")
    refused(s.files.read, "etc/passwd", code="link")
    refused(s.files.write, "etc/evil.txt", b"x", code="link")
    refused(s.files.list, "etc", code="link")
    e = refused(s.files.read, "run.sh", code="rejected", reason="extension_not_allowed")
    assert "echo hi" not in str(e)
    refused(s.files.read, "nothing.txt", code="not_found")
    refused(s.files.write, "big.txt", b"a" * (MAX_FILE + 1), code="too_large")
    refused(s.files.read, "big.txt", code="not_found")
    assert s.files.read("ok.txt") == b"fine", "the session did not live on after its refusals"


@pytest.mark.parametrize("pool", [0, 1])
def test_a_local_sessions_files_are_written_read_by_a_cell_read_back_judged_and_listed(rootfs, pool):
    with Sandbox(rootfs=rootfs, pool=pool) as sb:
        with sb.session() as s:
            assert s.backend == ("pool" if pool else "start")
            files_round_trip(s)
        # What was written is the session's output, delivered at its end.
        assert sorted(a.path for a in s.closing.artifacts) == ["data/prices.csv", "note.txt", "total.csv"]
        with pytest.raises(SessionClosedError):
            s.files.read("total.csv")


def test_the_local_files_api_refuses_dot_dot_links_oversize_and_refused_extensions(rootfs):
    with Sandbox(rootfs=rootfs, pool=0) as sb, sb.session() as s:
        refuses_the_ways_out(s)
        assert s.run("import os\nos._exit(3)").result["session"]["ended"]
        with pytest.raises(SessionClosedError):
            s.files.read("ok.txt")
        with pytest.raises(SessionClosedError):
            s.files.write("late.txt", b"late")


def test_a_remote_sessions_files_are_written_read_by_a_cell_read_back_judged_and_listed(server):
    with RemoteSandbox(server.url, TOKEN).session() as s:
        files_round_trip(s)
    assert sorted(a.path for a in s.closing.artifacts) == ["data/prices.csv", "note.txt", "total.csv"]
    with pytest.raises(SessionClosedError):
        s.files.list()


def test_the_remote_files_api_refuses_as_the_local_one_and_another_tenant_finds_no_session(server):
    with RemoteSandbox(server.url, TOKEN).session() as s:
        refuses_the_ways_out(s)
        # Over the token's max_bytes_in (4 MiB), under the files API's 8: the service's 413.
        with pytest.raises(FileRefusedError) as e:
            s.files.write("big.txt", b"a" * ((4 << 20) + 1))
        assert e.value.code == "too_large" and "4194304 bytes" in e.value.detail, e.value
        # Another tenant: no such session, for writes as for reads.
        theirs = RemoteSandbox(server.url, SOLO_TOKEN).session(session_id=s.id)
        with pytest.raises(SessionClosedError):
            theirs.files.write("solo.txt", b"from solo")
        with pytest.raises(SessionClosedError):
            RemoteSandbox(server.url, SOLO_TOKEN).session(session_id=s.id).files.read("ok.txt")
        with pytest.raises(FileRefusedError):
            s.files.read("solo.txt")
        assert s.run("import os\nos._exit(3)").result["session"]["ended"]
        with pytest.raises(SessionClosedError, match="exited with code 3"):
            s.files.read("ok.txt")


def test_the_async_sessions_files_are_the_same_calls_as_coroutines(rootfs, server):
    async def main() -> None:
        async with AsyncSandbox(rootfs=rootfs, pool=0) as sandbox:
            async with await sandbox.session() as s:
                assert (await s.files.write("a.txt", "one")).bytes == 3
                await s.run_code("open('b.txt', 'w').write(open('a.txt').read() * 2)")
                assert await s.files.read("b.txt") == b"oneone"
                assert [e.name for e in await s.files.list()] == ["a.txt", "b.txt"]
                with pytest.raises(FileRefusedError):
                    await s.files.read("../a.txt")
        async with await AsyncRemoteSandbox(server.url, TOKEN).session() as s:
            await s.files.write("a.txt", b"remote")
            assert await s.files.read("a.txt") == b"remote"
            assert [e.path for e in await s.files.list()] == ["a.txt"]

    asyncio.run(main())


def test_a_file_the_service_sends_other_than_it_judged_is_refused():
    """The service is trusted less than the local binary: bytes whose sha256
    is not the one it sent with them are refused, never returned."""

    class Lying(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            body = b"not what was judged"
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("x-jail-sha256", "0" * 64)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Lying)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        s = RemoteSandbox(f"http://127.0.0.1:{httpd.server_address[1]}", TOKEN).session(session_id="0" * 32)
        with pytest.raises(ArtifactMismatchError):
            s.files.read("a.txt")
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_refusal_says_its_code_reason_and_detail():
    e = FileRefusedError("rejected", ".sh is not in artifacts.allowed_extensions", reason="extension_not_allowed", path="run.sh")
    assert (e.code, e.reason, e.path) == ("rejected", "extension_not_allowed", "run.sh")
    assert str(e) == "'run.sh' refused (rejected, extension_not_allowed): .sh is not in artifacts.allowed_extensions"
