"""jail's cell driver: runs the cells of one session (or the one step of a
pooled jail) in one interpreter whose globals persist.

Trusted, stdlib only, started by the jail in place of a script; the jail
puts shown.py (rich results, the control channel) before it in one file. It speaks
newline-delimited JSON on the control socket it finds on fd 0 (moved to a
private close-on-exec descriptor at once; fd 0 then reads /dev/null, so a
cell and its subprocesses never see the protocol):

  supervisor -> driver   {"op": "exec", "id": N, "nonce": "...", "code": "...", "live": true?,
                          "env": {NAME: VALUE}?, "keep_env": true?}
  driver -> supervisor   {"op": "ready", "preloaded": [...], "failed": [...]}
                         {"op": "display", "id": N, "nonce": "...", "main": bool, "data": {MIME: ...}}
                         {"op": "done", "id": N, "nonce": "...", "outcome": "ok"|"error"|"exit"|"interrupted",
                          "exit_code": int|null, "error": {"type", "message", "traceback"}|null}

A cell's `env` (checked by the supervisor, envs.rs) is set in os.environ
for the cell and set back as it was once the cell ends, unless `keep_env`
makes it the session's from then on.

A cell's rich results, Jupyter's way (shown.py, display.py): each `display(obj)`
(a builtin, as in IPython), each figure `plt.show()` shows or the cell
leaves open unsaved, and the value of its last expression (`main`, unless the cell ends with `;`) go
to the supervisor as MIME bundles, one `display` line each, before the
cell's `done`: text/plain always, and what the object's `_repr_*_`
methods give (HTML, Markdown, SVG, PNG, JPEG, JSON, LaTeX). Images are
base64. The supervisor judges each before it lists it (artifacts/bundle.rs).

A `live` cell (its output watched as it comes: `jail session exec --events`)
runs with unbuffered stdout and stderr, as PYTHONUNBUFFERED makes them for
`jail run --events`; the buffered ones are back once it ends.

A cell runs untrusted code in this process, so it can write to the control
socket itself: the supervisor treats every reply as the cell's own words
(bounded in size, checked in shape) and never as a fact about the jail;
a `done` counts only with the nonce of the `exec` it answers, which no
line written before that `exec` can carry.
"""

import atexit
import builtins
import gc
import io
import json
import linecache
import os
import sys
import traceback

MAX_LINE = 16 << 20  # a cell's source, at most (the supervisor caps it lower)
TRACEBACK_LINES = 40


def preload(modules):
    """Import the trusted preload list before any untrusted code exists."""
    done, failed = [], []
    for name in modules:
        try:
            __import__(name)
            done.append(name)
        except BaseException as e:  # a preload failure is reported, not fatal
            failed.append({"module": name, "error": f"{type(e).__name__}: {e}"})
    if "matplotlib.pyplot" in done:
        warm_matplotlib()
    return done, failed


def warm_matplotlib():
    """Draw one figure to memory: the font cache and the backend are set up
    now rather than in the first untrusted cell."""
    import io
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    ax.set_title("warm-up")
    fig.savefig(io.BytesIO(), format="png")
    plt.close(fig)


def error_of(e, tb):
    lines = traceback.format_exception(type(e), e, tb)
    text = "".join(lines)
    return {
        "type": type(e).__qualname__ if type(e).__module__ in ("builtins", "__main__") else f"{type(e).__module__}.{type(e).__qualname__}",
        "message": str(e),
        "traceback": "\n".join(text.rstrip("\n").splitlines()[-TRACEBACK_LINES:]),
    }, text


def go_live():
    """Unbuffered stdout and stderr for one cell (what `python -u` makes):
    the buffered ones, flushed, and the unbuffered ones, to undo it."""
    saved = (sys.stdout, sys.stderr)
    live = []
    for stream, fd in zip(saved, (1, 2)):
        try:
            stream.flush()
        except BaseException:
            pass
        live.append(io.TextIOWrapper(io.FileIO(fd, "w", closefd=False),
                                     encoding=getattr(stream, "encoding", None) or "utf-8",
                                     errors=getattr(stream, "errors", None) or "strict",
                                     newline="\n", write_through=True))
    sys.stdout, sys.stderr = live
    return saved, tuple(live)


def come_back(saved, live):
    """The buffered streams again, unless the cell put others in their place."""
    for stream in live:
        try:
            stream.flush()
        except BaseException:
            pass
    if sys.stdout is live[0]:
        sys.stdout = saved[0]
    if sys.stderr is live[1]:
        sys.stderr = saved[1]


def set_env(env):
    """Set `env` in os.environ; what to pass to `restore_env` to undo it."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    return saved


def restore_env(saved):
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def run_cell(namespace, cell_id, code, results=None):
    """Run one cell; return the `done` reply (without op/id)."""
    filename = f"<cell {cell_id}>"
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    reply = {"outcome": "ok", "exit_code": None, "error": None}
    try:
        if results is None:
            exec(compile(code, filename, "exec"), namespace)
        else:
            body, last = split_last(code, filename)
            exec(compile(body, filename, "exec"), namespace)
            if last is not None:
                value = eval(compile(last, filename, "eval"), namespace)
                if value is not None:
                    results.emit(value, main=True)
    except SystemExit as e:
        code = e.code
        reply["outcome"] = "exit"
        reply["exit_code"] = code if isinstance(code, int) else (0 if code is None else 1)
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
    except KeyboardInterrupt as e:
        reply["outcome"] = "interrupted"
        reply["error"], text = error_of(e, e.__traceback__.tb_next)
        sys.stderr.write(text)
    except BaseException as e:
        reply["outcome"] = "error"
        # Drop this driver's own frame: the traceback starts in the cell.
        reply["error"], text = error_of(e, e.__traceback__.tb_next)
        sys.stderr.write(text)
    finally:
        if results is not None:
            results.flush_figures(shown=False)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
    return reply


def quick_exit(namespace):
    """The session is closed: end as the interpreter's own exit would,
    without its teardown of every imported module (with the data stack
    loaded that takes hundreds of milliseconds, which a pooled step's
    reply would wait for). What finalization would save of a cell's work
    is saved, in its order: the threads a cell started (not daemons) are
    waited for and atexit handlers run; the cells' names are dropped, so
    their objects' own deallocation flushes and closes their files; every
    file still open (one held in a reference cycle, which the full exit
    would leave to a collection that can lose its text, bpo-17852) is
    flushed; then the standard streams. A thread that never ends is the
    supervisor's to kill after its grace, as before."""
    import threading

    shutdown = getattr(threading, "_shutdown", None)  # what Python's exit calls
    if shutdown is not None:
        shutdown()
    else:
        main_thread = threading.main_thread()
        for t in threading.enumerate():
            if t is not main_thread and not t.daemon:
                t.join()
    atexit._run_exitfuncs()
    namespace.clear()
    flush_open_files()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(0)


def flush_open_files():
    """Flush every file object the cells made and left open. A collection
    would not do: it can close a buffer before its text wrapper has
    flushed into it, losing the text (bpo-17852). Only what cells made is
    looked at: everything from before the first cell is frozen out of the
    collector's lists (`gc.freeze` in main and in the pool's preload)."""
    for obj in gc.get_objects():
        if isinstance(obj, io.IOBase):
            try:
                if not obj.closed:
                    obj.flush()
            except BaseException:
                pass


CODE_DIR = "/workspace/code"


def main():
    # Cells import from the code dir, as a script run from it would: the
    # driver itself lives apart (/.jail), and its folder is no cell's.
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and sys.path[0] == here:
        sys.path[0] = CODE_DIR
    reader, ctl = take_control_fd()
    results = Shown(ctl)
    inline_backend(results)
    builtins.display = results.display
    modules = [m for m in os.environ.pop("JAIL_PRELOAD", "").split(",") if m]
    done, failed = preload(modules)
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    sys.argv = [""]
    # Nothing made so far is a cell's: the exit's search for files left
    # open skips it all (flush_open_files).
    gc.freeze()
    send(ctl, {"op": "ready", "preloaded": done, "failed": failed})
    while True:
        try:
            line = reader.readline(MAX_LINE + 1)
            if not line:
                quick_exit(namespace)  # the supervisor closed the session
            request = json.loads(line)
            cell_id, code, nonce = request.get("id"), request.get("code"), request.get("nonce")
            if (
                request.get("op") != "exec"
                or not isinstance(cell_id, int)
                or not isinstance(code, str)
                or not isinstance(nonce, str)
            ):
                send(ctl, {"op": "bad_request", "detail": "expected {op: exec, id: int, nonce: str, code: str}"})
                continue
            env = request.get("env") or {}
            if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
                send(ctl, {"op": "bad_request", "detail": "env must be an object of strings"})
                continue
            saved = set_env(env) if request.get("keep_env") is not True else None
            if saved is None:
                os.environ.update(env)
            streams = go_live() if request.get("live") is True else None
            results.cell = (cell_id, nonce)
            try:
                reply = run_cell(namespace, cell_id, code, results)
            finally:
                results.cell = None
                if streams:
                    come_back(*streams)
                if saved:
                    restore_env(saved)
            send(ctl, {"op": "done", "id": cell_id, "nonce": nonce, **reply})
        except KeyboardInterrupt:
            continue  # an interrupt that arrived between cells


if __name__ == "__main__":
    sys.exit(main())
