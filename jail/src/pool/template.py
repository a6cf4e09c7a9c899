"""jail's template (template.rs): trusted code only.

Started by `jail template` as the interpreter of a jail of its own, with
`sys.argv[1:]` the path of this crate's library and of the session's cell
driver, the preload's modules as JSON, and the path the driver has in a
fork (it is compiled here, once, under that name). It imports the preload as a
pooled session's first cell does (session/preload.rs), then serves its
supervisor: each message on fd 0 (the control channel) brings one
connection, whose one message is a request (template/wire.rs) and its
descriptors. `jail_template_fork` (template/fork.rs) clones this process
into a full jail and returns twice: here, with the fork's pid, and in the
fork's worker, confined, with 0. There, this file becomes what an exec of
`python DRIVER` would have been: the cell driver as `__main__`, the
request's argv and environment, the signal handlers CPython installs.
Nothing of a request stays here: its descriptors go to the fork, and the
fork's memory is its own.
"""
import ctypes
import gc
import json
import os
import signal
import socket
import sys
import threading


def preload(modules):
    import importlib

    for name in modules:
        importlib.import_module(name)
    if "matplotlib.pyplot" in modules:
        import io
        import matplotlib.pyplot as plt

        fig = plt.figure()
        fig.gca().plot([0, 1])
        fig.savefig(io.BytesIO(), format="png")
        plt.close(fig)


def reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def become(request, driver, compiled):
    """In the fork's worker: what `execve(python, [python, DRIVER, ...])`
    would have set up, then the driver (`compiled`, a path and its code,
    where the request names that path)."""
    ex = request
    os.environ.clear()
    os.environ.update(e.split("=", 1) for e in ex["envp"] if "=" in e)
    script = ex["argv"][1]
    sys.argv = list(ex["argv"][1:])
    # As `python SCRIPT` sets it (main dropped the template's own).
    sys.path.insert(0, os.path.dirname(script))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for name in ("SIGPIPE", "SIGXFSZ"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    main = type(sys)("__main__")
    main.__file__ = script
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    path, code = compiled
    if script != path:
        code = compile(driver, script, "exec")
    del request, ex, compiled
    exec(code, main.__dict__)
    os._exit(0)


def receive(conn, buf):
    """One message into `buf`, and the descriptors that came with it."""
    n, ancdata, flags, _ = conn.recvmsg_into([buf], socket.CMSG_SPACE(64 * 4))
    fds = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(int.from_bytes(data[i : i + 4], sys.byteorder) for i in range(0, len(data) - len(data) % 4, 4))
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        raise OSError("a request larger than the template takes")
    return n, fds


def main():
    lib_path, driver_path, modules, forks_driver = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
    with open(driver_path) as f:
        driver = f.read()
    # Once here rather than in every fork (2.5 ms each).
    compiled = (forks_driver, compile(driver, forks_driver, "exec"))
    if sys.path and sys.path[0] in ("", os.path.dirname(os.path.abspath(__file__))):
        del sys.path[0]
    preload(modules)
    lib = ctypes.PyDLL(lib_path)
    fork = lib.jail_template_fork
    fork.restype = ctypes.c_int
    fork.argtypes = [
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int), ctypes.c_size_t,
        ctypes.c_int, ctypes.POINTER(ctypes.c_size_t),
    ]
    # One buffer for every request, which the library zeroes once it has
    # read one: a request names host paths, and a fork's memory is this
    # process's.
    buf = bytearray(MAX_MESSAGE)
    view = (ctypes.c_char * MAX_MESSAGE).from_buffer(buf)
    said = ctypes.c_size_t(0)
    gc.collect()
    gc.freeze()
    control = socket.socket(fileno=0)
    if threading.active_count() != 1 or len(os.listdir("/proc/self/task")) != 1:
        control.sendall(b"error the template has more than one thread after its preload\n")
        return 1
    control.sendall(b"ready\n")
    while True:
        reap()
        try:
            _, fds, _, _ = socket.recv_fds(control, 1, 1)
        except InterruptedError:
            continue
        if not fds:
            return 0  # the supervisor is gone: so are we
        conn = socket.socket(fileno=fds[0])
        try:
            n, given = receive(conn, buf)
        except OSError:
            conn.close()
            continue
        arr = (ctypes.c_int * max(1, len(given)))(*given)
        pid = fork(ctypes.addressof(view), n, MAX_MESSAGE, arr, len(given), conn.fileno(), ctypes.byref(said))
        if pid == 0:
            # The fork's worker: every descriptor but its own is closed,
            # so these objects must not close the numbers again.
            conn.detach()
            control.detach()
            return json.loads(bytes(buf[: said.value])), driver, compiled
        conn.close()


MAX_MESSAGE = 1 << 20

if __name__ == "__main__":
    # In a fork's worker, main returns what `become` needs, so that no
    # frame of the template's loop is left under the driver's.
    outcome = main()
    if isinstance(outcome, tuple):
        become(*outcome)
    sys.exit(outcome)
