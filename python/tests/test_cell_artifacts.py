"""A session cell's artifacts through every Python door: a local session
started or claimed from the pool, a RemoteSession, and the async ones. A
cell's result lists what that cell made, changed or deleted, but the
session delivers its files only when it ends, so each artifact is read from
the live session (its files API, judged: a CSV's formula cell neutralised),
never from the host output folder, which holds nothing yet or an older file
of the same name. An artifact a later cell changed or removed is refused as
changed (read it again with ``session.files.read``), a deleted one has no
bytes, and once the session is closed its closing result's artifacts are
the delivered ones."""

from __future__ import annotations

import asyncio
import hashlib
import struct
import zlib

import pytest
from conftest import TOKEN

from jail_sandbox import (
    Artifact,
    ArtifactChangedError,
    AsyncRemoteSandbox,
    AsyncSandbox,
    RemoteSandbox,
    Sandbox,
    SandboxError,
    SessionArtifact,
    SessionClosedError,
)


def png(rgb: bytes) -> bytes:
    """A real one-pixel-high PNG of the given RGB pixels, made by hand (the
    minimal rootfs has no matplotlib)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", len(rgb) // 3, 1, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00" + rgb)) + chunk(b"IEND", b"")


CHART = png(b"\xff\x00\x00\x00\x00\xff")
# What the host folder held before the session: an older chart of the same name.
OLD_CHART = png(b"\x00\xff\x00")
TABLE = b"k,v\n=1+1,2\n"
# What the judged copy holds: the formula cell neutralised.
JUDGED = b"k,v\n'=1+1,2\n"
DRAW = (
    f"open('/workspace/output/chart.png', 'wb').write({CHART!r})\n"
    f"open('/workspace/output/table.csv', 'wb').write({TABLE!r})\n"
    "open('/workspace/output/note.txt', 'w').write('gone soon')"
)
CHANGE = "open('/workspace/output/table.csv', 'a').write('x,3\\n')\nimport os\nos.remove('/workspace/output/note.txt')"


def by_path(execution) -> dict:
    return {a.path: a for a in execution.artifacts}


def cell_artifacts_are_read_from_the_session(s) -> Artifact:
    """One session: a cell's chart and CSV read judged before it ends, a
    change and a deletion by the next cell refused, a deleted entry without
    bytes. The first cell's chart is returned, for after the close."""
    first = s.run(DRAW)
    assert first.ok, first.stderr
    drawn = by_path(first)
    assert {p: a.change for p, a in drawn.items()} == {"chart.png": "created", "table.csv": "created", "note.txt": "created"}
    chart, table, note = drawn["chart.png"], drawn["table.csv"], drawn["note.txt"]
    assert all(isinstance(a, SessionArtifact) and a.host_path is None for a in drawn.values()), drawn
    assert first.output_dir is None, "a cell's files are the session's, in no host folder yet"
    assert (chart.media_type, chart.sha256, chart.bytes) == ("image/png", hashlib.sha256(CHART).hexdigest(), len(CHART))
    assert (table.sha256, [f["kind"] for f in table.flags]) == (hashlib.sha256(TABLE).hexdigest(), ["formula_injection"])
    # Read before the session ends, judged, each the file its cell listed.
    assert chart.read_bytes() == CHART
    assert table.read_bytes() == JUDGED
    assert note.read_bytes() == b"gone soon"
    # The next cell changes the table and removes the note: the first
    # cell's listing no longer holds, and that is said, never papered over.
    second = s.run(CHANGE)
    assert second.ok, second.stderr
    changed = by_path(second)
    assert {p: a.change for p, a in changed.items()} == {"table.csv": "modified", "note.txt": "deleted"}
    with pytest.raises(ArtifactChangedError, match=r"changed .*session\.files\.read\('table\.csv'\)") as e:
        table.read_bytes()
    assert e.value.path == "table.csv"
    with pytest.raises(ArtifactChangedError, match=r"removed .*session\.files\.read\('note\.txt'\)"):
        note.read_bytes()
    assert changed["table.csv"].read_bytes() == JUDGED + b"x,3\n"
    assert s.files.read("table.csv") == JUDGED + b"x,3\n"
    deleted = changed["note.txt"]
    assert deleted.sha256 is None
    with pytest.raises(SandboxError, match="deleted") as gone:
        deleted.read_bytes()
    assert not isinstance(gone.value, ArtifactChangedError)
    # What the second cell left alone still reads.
    assert chart.read_bytes() == CHART
    return chart


def closed_session_delivers(s, chart: Artifact) -> None:
    """After close: the closing result's artifacts are the delivered ones;
    a cell's artifact says the session is closed and where to look."""
    closing = by_path(s.closing)
    assert sorted(closing) == ["chart.png", "table.csv"], s.closing.result["artifacts"]
    assert not any(isinstance(a, SessionArtifact) for a in closing.values())
    assert closing["chart.png"].read_bytes() == CHART
    with pytest.raises(SessionClosedError, match=r"session\.closing"):
        chart.read_bytes()


@pytest.mark.parametrize("pool", [0, 1])
def test_a_local_cells_chart_and_csv_are_read_from_the_live_session_and_a_later_change_is_refused(rootfs, pool):
    with Sandbox(rootfs=rootfs, pool=pool) as sb:
        with sb.session() as s:
            assert s.backend == ("pool" if pool else "start")
            chart = cell_artifacts_are_read_from_the_session(s)
        closed_session_delivers(s, chart)


def test_a_cells_artifact_is_never_the_host_folders_older_file_of_the_same_name(rootfs, folders):
    """The host output folder holds an older chart.png; the session gives it
    the cell's only when it ends. The cell's artifact is the cell's."""
    _, out = folders
    (out / "chart.png").write_bytes(OLD_CHART)
    with Sandbox(rootfs=rootfs, pool=0, output=out) as sb, sb.session() as s:
        [chart] = s.run(DRAW.splitlines()[0]).artifacts
        assert (chart.path, chart.change) == ("chart.png", "modified")
        assert chart.read_bytes() == CHART
        assert (out / "chart.png").read_bytes() == OLD_CHART, "delivered before the session ended"
    assert (out / "chart.png").read_bytes() == CHART


def test_a_remote_cells_chart_and_csv_are_read_through_the_files_route_and_a_later_change_is_refused(server):
    with RemoteSandbox(server.url, TOKEN).session() as s:
        chart = cell_artifacts_are_read_from_the_session(s)
    closed_session_delivers(s, chart)


def test_the_async_sessions_cells_artifacts_are_read_from_the_live_session(rootfs, server):
    async def one(s) -> None:
        drawn = by_path(await s.run_code(DRAW))
        assert all(isinstance(a, SessionArtifact) for a in drawn.values()), drawn
        assert await asyncio.to_thread(drawn["chart.png"].read_bytes) == CHART
        assert await asyncio.to_thread(drawn["table.csv"].read_bytes) == JUDGED
        await s.run_code(CHANGE)
        with pytest.raises(ArtifactChangedError):
            await asyncio.to_thread(drawn["table.csv"].read_bytes)
        assert await s.files.read("table.csv") == JUDGED + b"x,3\n"

    async def main() -> None:
        async with AsyncSandbox(rootfs=rootfs, pool=0) as sandbox:
            async with await sandbox.session() as s:
                await one(s)
        async with await AsyncRemoteSandbox(server.url, TOKEN).session() as s:
            await one(s)

    asyncio.run(main())


def test_a_runs_artifacts_are_still_the_host_folders(rootfs):
    """Outside a session nothing changes: a run's artifact is its folder's."""
    ex = Sandbox(rootfs=rootfs, pool=0).run(DRAW)
    chart = by_path(ex)["chart.png"]
    assert type(chart) is Artifact and chart.host_path is not None
    assert chart.read_bytes() == CHART
