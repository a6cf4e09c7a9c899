"""Rich results, Jupyter's and E2B's way, through every Python door: the
last expression's value (`Execution.text`), `display()` and objects with
`_repr_*_` methods, as `Execution.results` — from a spawned run, a pooled
run, a session's cell and a remote run and cell alike; what the jail
refused (a PNG that is not one) never reaches the caller."""

from __future__ import annotations

import base64

import pytest
from conftest import REPO, TOKEN

from jail_sandbox import RemoteSandbox, Sandbox

# tests/shows.py's objects (a real PNG and HTML; a PNG that is an SVG)
# shown, then the last expression.
CODE = (REPO / "tests/shows.py").read_text() + """
display(Chart())
display(Liar())
x = 1
x += 1
x
"""


def check(ex) -> None:
    assert ex.status == "ok", ex.stderr
    assert ex.text == "2" and ex.stdout == ""
    chart, liar, main = ex.results
    assert (chart.is_main_result, chart.text) == (False, "Chart()") and chart.html.startswith("<b>chart</b>")
    assert [f["kind"] for f in chart.flags] == ["script"]
    assert base64.b64decode(chart.png).startswith(b"\x89PNG")
    assert liar.png is None and liar.text is not None, liar
    assert main.is_main_result and main.formats() == ["text/plain"]


@pytest.mark.parametrize("pool", [0, 1])
def test_a_local_run_and_cell_give_their_rich_results(rootfs, pool):
    with Sandbox(rootfs=rootfs, pool=pool) as sb:
        ex = sb.run_code(CODE)
        assert ex.backend == ("pool" if pool else "run")
        check(ex)
        with sb.session() as s:
            check(s.run_code(CODE))
            assert s.run_code("y = 3").text is None and s.run_code("y = 3").results == []
            assert s.run_code("y * 2;").results == [], "a cell ending in ; shows nothing"


def test_a_remote_run_and_cell_give_their_rich_results(server):
    remote = RemoteSandbox(server.url, TOKEN)
    check(remote.run_code(CODE))
    with remote.session() as s:
        check(s.run_code(CODE))
