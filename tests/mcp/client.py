"""A real MCP client for `jail mcp`, on the official MCP Python SDK.

Driven by tests/fronts/tests/mcp.rs. It starts the server named in an MCP client
config (the `mcpServers` JSON that Claude Desktop, Claude Code and Cursor
read; the test hands it README.md's snippet as written), then:
lists the tools, runs a step that charts an input CSV with matplotlib and
checks the image content is a PNG, then sends the requests the server must
refuse without running anything; then drives sessions, their files tools
among them (every structured reply checked against its tool's schema). It prints one JSON report on stdout and
exits 0 only when every check passed; the test asserts on the report too.

    client.py CONFIG.json SERVER_NAME CSV_INPUT
"""

import asyncio
import base64
import json
import os
import struct
import subprocess
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

CHART = """
import csv, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = list(csv.DictReader(open("/workspace/input/sales.csv")))
units = {}
for r in rows:
    units[r["region"]] = units.get(r["region"], 0) + int(r["units"])
fig, ax = plt.subplots(figsize=(4, 3), dpi=100)
ax.bar(list(units), list(units.values()))
fig.savefig("/workspace/output/chart.png")
print("regions", len(units))
"""


def texts(result):
    return "\n".join(c.text for c in result.content if c.type == "text")


async def main(config_path, name, csv_input):
    server = json.load(open(config_path))["mcpServers"][name]
    # The config's own environment, plus the test's TMPDIR and the jail's
    # test variables (the SDK passes the server only a safe default set).
    env = dict(server.get("env", {}))
    for k, v in os.environ.items():
        if k == "TMPDIR" or k.startswith("JAIL_"):
            env[k] = v
    params = StdioServerParameters(command=server["command"], args=server.get("args", []), env=env, cwd=os.getcwd())
    report = {"checks": {}}
    checks = report["checks"]
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            report["server"] = init.server_info.name
            report["protocol"] = init.protocol_version
            report["instructions"] = init.instructions
            tools = await session.list_tools()
            report["tools"] = sorted(t.name for t in tools.tools)
            checks["lists_run_python"] = "run_python" in report["tools"]
            # Each tool declares its structured content's schema; the SDK
            # validates every structured reply against it.
            checks["output_schemas"] = all(t.output_schema and t.output_schema.get("type") == "object" for t in tools.tools)

            chart = await session.call_tool("run_python", {"code": CHART, "input": [csv_input]})
            images = [c for c in chart.content if c.type == "image"]
            report["chart_text"] = texts(chart)
            report["chart_is_error"] = bool(chart.is_error)
            checks["chart_ran"] = not chart.is_error and "status ok" in texts(chart) and "regions 3" in texts(chart)
            checks["one_image"] = len(images) == 1
            if images:
                png = base64.b64decode(images[0].data)
                width, height = struct.unpack(">II", png[16:24])
                report["image"] = {"mime": images[0].mime_type, "bytes": len(png), "width": width, "height": height}
                checks["image_is_png"] = images[0].mime_type == "image/png" and png.startswith(b"\x89PNG\r\n\x1a\n") and png[12:16] == b"IHDR"
                checks["image_is_the_chart"] = (width, height) == (400, 300)
            structured = chart.structured_content or {}
            checks["structured_result"] = structured.get("schema_version") == 2 and structured.get("status") == "ok"

            bad = {
                "outside_path": {"code": "print(1)", "input": ["/etc/passwd"]},
                "dotdot_path": {"code": "print(1)", "input": [csv_input.split("/")[0] + "/../../etc/passwd"]},
                "empty_code": {"code": "   \n"},
                "timeout_above_limit": {"code": "print(1)", "timeout_seconds": 100000},
            }
            report["refusals"] = {}
            for key, args in bad.items():
                r = await session.call_tool("run_python", args)
                report["refusals"][key] = {"is_error": bool(r.is_error), "text": texts(r)}
                checks["refuses_" + key] = bool(r.is_error) and "status" not in texts(r)

            # A session: state survives from one cell to the next; the chart
            # its cell draws comes back as an image with that cell (read
            # through the session: it is not delivered until the stop), and
            # again when it is stopped.
            checks["lists_session_tools"] = {"session_start", "session_exec", "session_stop"} <= set(report["tools"])
            started = await session.call_tool("session_start", {"input": [csv_input]})
            sid = (started.structured_content or {}).get("session_id")
            report["session_start"] = texts(started)
            checks["session_started"] = not started.is_error and bool(sid)
            first = await session.call_tool("session_exec", {"session_id": sid, "code": "x = 41\nprint('set')"})
            second = await session.call_tool("session_exec", {"session_id": sid, "code": "print('x is', x + 1)"})
            report["session_cells"] = [texts(first), texts(second)]
            checks["session_keeps_state"] = not second.is_error and "x is 42" in texts(second)
            drawn = await session.call_tool("session_exec", {"session_id": sid, "code": CHART})
            checks["session_chart_ran"] = not drawn.is_error and "regions 3" in texts(drawn)
            report["session_chart_cell"] = texts(drawn)
            cell_pics = [base64.b64decode(c.data) for c in drawn.content if c.type == "image"]
            checks["session_cell_chart_is_an_image"] = (
                len(cell_pics) == 1 and cell_pics[0].startswith(b"\x89PNG") and struct.unpack(">II", cell_pics[0][16:24]) == (400, 300)
            )
            checks["session_cell_says_its_files_are_in_the_session"] = (
                "chart.png (created" in texts(drawn) and "session_read_file" in texts(drawn)
            )
            checks["quiet_cell_lists_no_files"] = "files this cell" not in texts(first) and not [
                c for c in first.content if c.type == "image"
            ]
            # The files tools (issue 37 item 4), while the session lives: a CSV
            # in, read by a cell as written, read back with its formula cell
            # neutralised; the chart back as an image; a listing; `..` refused.
            csv = "a,b\n1,=SUM(A1)\n"
            wrote = await session.call_tool("session_write_file", {"session_id": sid, "path": "in/f.csv", "content": csv})
            checks["files_write"] = not wrote.is_error and (wrote.structured_content or {}).get("bytes") == len(csv)
            seen = await session.call_tool(
                "session_exec", {"session_id": sid, "code": "print(open('/workspace/output/in/f.csv').read().split()[1])"}
            )
            checks["files_cell_reads_the_write"] = "1,=SUM(A1)" in texts(seen)
            back = await session.call_tool("session_read_file", {"session_id": sid, "path": "in/f.csv"})
            report["files_read"] = texts(back)
            cells = ((back.structured_content or {}).get("neutralised") or {}).get("cells")
            checks["files_read_neutralised"] = not back.is_error and "1,'=SUM(A1)" in texts(back) and cells == 1
            pic = await session.call_tool("session_read_file", {"session_id": sid, "path": "chart.png"})
            pics = [c for c in pic.content if c.type == "image"]
            checks["files_read_png_is_an_image"] = len(pics) == 1 and base64.b64decode(pics[0].data).startswith(b"\x89PNG")
            listed = await session.call_tool("session_list_files", {"session_id": sid})
            checks["files_listed"] = [e["name"] for e in (listed.structured_content or {}).get("entries", [])] == ["chart.png", "in"]
            dotdot = await session.call_tool("session_read_file", {"session_id": sid, "path": "../input/sales.csv"})
            report["files_dotdot"] = texts(dotdot)
            checks["files_refuse_dotdot"] = bool(dotdot.is_error) and "relative to /workspace/output" in texts(dotdot)
            stopped = await session.call_tool("session_stop", {"session_id": sid})
            shown = [c for c in stopped.content if c.type == "image"]
            report["session_stop"] = texts(stopped)
            checks["session_chart_is_an_image"] = bool(shown) and base64.b64decode(shown[0].data).startswith(b"\x89PNG")
            gone = await session.call_tool("session_exec", {"session_id": sid, "code": "print(x)"})
            checks["stopped_session_is_refused"] = bool(gone.is_error) and "no open session" in texts(gone)
            outside = await session.call_tool("session_start", {"input": ["/etc/passwd"]})
            checks["session_refuses_outside_path"] = bool(outside.is_error)
            # A cell past its time, with busy loops on every core beside it:
            # KeyboardInterrupt in the cell, and the session lives on with its
            # variables (issue 37 item 1). The loops are killed by their pids.
            timed = await session.call_tool("session_start", {"timeout_seconds": 1})
            tsid = (timed.structured_content or {}).get("session_id")
            await session.call_tool("session_exec", {"session_id": tsid, "code": "y = 6"})
            hogs = [
                subprocess.Popen(["/usr/bin/python3", "-c", "while 1: pass"]) for _ in range(2 * (os.cpu_count() or 1) + 2)
            ]
            try:
                late = await session.call_tool(
                    "session_exec", {"session_id": tsid, "code": "import time\nwhile True:\n    time.sleep(0.1)\n"}
                )
            finally:
                for h in hogs:
                    h.kill()
                    h.wait()
            report["session_late_cell"] = texts(late)
            checks["late_cell_gets_keyboard_interrupt"] = "KeyboardInterrupt" in texts(late)
            after = await session.call_tool("session_exec", {"session_id": tsid, "code": "print(y * 7)"})
            checks["late_cell_session_keeps_state"] = not after.is_error and "42" in texts(after)
            # A cell that ends the interpreter ends the session: the next
            # call says so in MCP terms, naming no socket of the host.
            await session.call_tool("session_exec", {"session_id": tsid, "code": "import os\nos._exit(3)"})
            ended = await session.call_tool("session_exec", {"session_id": tsid, "code": "print(y)"})
            report["ended_session"] = texts(ended)
            checks["ended_session_says_so_in_mcp_terms"] = (
                bool(ended.is_error) and "session_start" in texts(ended) and ".sock" not in texts(ended)
            )
            await session.call_tool("session_stop", {"session_id": tsid})
            # Left open on purpose: it must end when the server exits.
            left = await session.call_tool("session_start", {})
            report["left_open"] = (left.structured_content or {}).get("session_id")
    report["ok"] = all(checks.values())
    print(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(*sys.argv[1:])))
