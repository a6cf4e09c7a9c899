"""The standard-library workload the default seccomp allowlist is traced from.

Run it under strace with `policies/trace/trace.sh`; the end-to-end tests also
run it inside the jail under the default policy and require it to finish with
no denial. Each section exercises one thing LLM-written analysis code does.
Writes only below $TMPDIR (or the current folder when it is writable).
"""

import asyncio
import bz2
import concurrent.futures
import csv
import ctypes
import datetime
import decimal
import faulthandler
import fcntl
import gc
import glob
import gzip
import hashlib
import io
import json
import locale
import logging
import lzma
import mmap
import multiprocessing
import multiprocessing.shared_memory
import os
import pathlib
import pickle
import platform
import queue
import random
import re
import resource
import secrets
import select
import selectors
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
import zlib

RESULTS = {}


SECTIONS = []


def section(fn):
    SECTIONS.append(fn)
    return fn


WORK = None


def square(x):
    return x * x


@section
def json_csv_text():
    data = [{"a": i, "b": str(i) * 3, "c": i / 7} for i in range(500)]
    (WORK / "d.json").write_text(json.dumps(data))
    assert json.loads((WORK / "d.json").read_text()) == data
    with open(WORK / "d.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["a", "b", "c"])
        w.writeheader()
        w.writerows(data)
    with open(WORK / "d.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == 500
    assert re.findall(r"\d+", "a1b22c333") == ["1", "22", "333"]
    assert statistics.mean(range(10)) == 4.5
    decimal.getcontext().prec = 50
    str(decimal.Decimal(1) / decimal.Decimal(7))
    datetime.datetime.now().astimezone().isoformat()
    pickle.loads(pickle.dumps(data))
    try:
        locale.setlocale(locale.LC_ALL, "")
    except locale.Error:
        pass  # the rootfs may carry no locale data; not a syscall matter
    logging.basicConfig(filename=WORK / "log.txt", level=logging.INFO)
    logging.info("hello")


@section
def sqlite():
    for path in (":memory:", str(WORK / "db.sqlite")):
        con = sqlite3.connect(path)
        con.execute("pragma journal_mode=wal") if path != ":memory:" else None
        con.execute("create table t (x integer, y text)")
        con.executemany("insert into t values (?, ?)", [(i, str(i)) for i in range(2000)])
        con.commit()
        assert con.execute("select count(*), sum(x) from t").fetchone() == (2000, 1999000)
        con.close()


@section
def threads():
    out = []
    lock = threading.Lock()
    cond = threading.Condition()
    ev = threading.Event()

    def work(i):
        with lock:
            out.append(i)
        with cond:
            cond.notify_all()
        ev.wait(0.01)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert sorted(out) == list(range(8))
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        assert list(ex.map(square, range(20))) == [x * x for x in range(20)]
    q = queue.Queue()
    threading.Timer(0.01, lambda: q.put(1)).start()
    assert q.get(timeout=5) == 1


@section
def processes():
    for method in ("fork", "spawn", "forkserver"):
        ctx = multiprocessing.get_context(method)
        with ctx.Pool(2) as pool:
            assert pool.map(square, range(10)) == [x * x for x in range(10)]
    with concurrent.futures.ProcessPoolExecutor(2) as ex:
        assert list(ex.map(square, range(10))) == [x * x for x in range(10)]
    with multiprocessing.Manager() as m:
        d = m.dict()
        d["k"] = 1
        assert d["k"] == 1
    shm = multiprocessing.shared_memory.SharedMemory(create=True, size=4096)
    shm.buf[0] = 7
    shm.close()
    shm.unlink()
    q = multiprocessing.Queue()
    p = multiprocessing.Process(target=q.put, args=(5,))
    p.start()
    assert q.get(timeout=10) == 5
    p.join()
    lock = multiprocessing.Lock()
    with lock:
        pass


@section
def subprocesses():
    r = subprocess.run([sys.executable, "-c", "import sys; print(sys.argv[1])", "hi"],
                       capture_output=True, text=True, check=True)
    assert r.stdout == "hi\n"
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdout.write(sys.stdin.read())"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert p.communicate(b"echo")[0] == b"echo"
    pid = os.posix_spawn(sys.executable, [sys.executable, "-c", "pass"], os.environ)
    assert os.waitpid(pid, 0)[1] == 0
    pid = os.fork()
    if pid == 0:
        os._exit(3)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 3
    try:
        subprocess.run(["/no/such/program"])
    except FileNotFoundError:
        pass


@section
def files():
    with tempfile.TemporaryDirectory() as d:
        p = pathlib.Path(d)
        (p / "a" / "b").mkdir(parents=True)
        (p / "a" / "b" / "f.txt").write_text("x" * 10000)
        shutil.copy(p / "a" / "b" / "f.txt", p / "g.txt")
        shutil.copytree(p / "a", p / "c")
        shutil.move(str(p / "g.txt"), str(p / "h.txt"))
        os.replace(p / "h.txt", p / "a" / "h.txt")
        assert sorted(glob.glob(str(p / "**" / "*.txt"), recursive=True))
        list(os.walk(p))
        os.chmod(p / "a" / "h.txt", 0o600)
        os.utime(p / "a" / "h.txt")
        os.stat(p / "a" / "h.txt")
        os.lstat(p / "a")
        os.access(p / "a", os.W_OK)
        with open(p / "a" / "h.txt", "r+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            fcntl.lockf(f, fcntl.LOCK_UN)
            f.truncate(100)
            os.fsync(f.fileno())
            with mmap.mmap(f.fileno(), 100) as m:
                m[0:1] = b"y"
                m.flush()
        os.symlink(p / "a", p / "link")
        os.readlink(p / "link")
        os.link(p / "a" / "h.txt", p / "hard.txt")
        os.mkfifo(p / "fifo")
        shutil.rmtree(p / "c")
        os.statvfs(d)
        with tempfile.NamedTemporaryFile() as f:
            f.write(b"data")
            f.flush()
        with tempfile.SpooledTemporaryFile(max_size=10) as f:
            f.write(b"x" * 100)
        os.getcwd()
        os.listdir("/")


@section
def archives():
    z = WORK / "a.zip"
    with zipfile.ZipFile(z, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("inner.txt", "hello" * 1000)
    with zipfile.ZipFile(z) as zf:
        assert zf.read("inner.txt") == b"hello" * 1000
    with tarfile.open(WORK / "a.tar.gz", "w:gz") as tf:
        tf.add(z, arcname="a.zip")
    with tarfile.open(WORK / "a.tar.gz") as tf:
        tf.extractall(WORK / "x")
    for mod in (gzip, bz2, lzma, zlib):
        assert mod.decompress(mod.compress(b"abc" * 100)) == b"abc" * 100
    hashlib.sha256(b"x").hexdigest()
    hashlib.md5(b"x").hexdigest()


@section
def signals():
    got = []
    signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
    os.kill(os.getpid(), signal.SIGUSR1)
    signal.signal(signal.SIGALRM, lambda s, f: got.append(s))
    signal.setitimer(signal.ITIMER_REAL, 0.01)
    time.sleep(0.05)
    signal.alarm(0)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])
    signal.pthread_kill(threading.get_ident(), signal.SIGUSR2)
    assert signal.sigtimedwait([signal.SIGUSR2], 1) is not None
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGUSR2])
    signal.siginterrupt(signal.SIGUSR1, False)
    faulthandler.enable()
    faulthandler.dump_traceback(file=open(os.devnull, "w"))
    assert signal.SIGUSR1 in got and signal.SIGALRM in got


@section
def clocks_and_randomness():
    time.time(), time.monotonic(), time.perf_counter(), time.process_time(), time.thread_time()
    time.sleep(0.001)
    time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    time.clock_gettime(time.CLOCK_BOOTTIME)
    random.seed()
    random.random()
    random.SystemRandom().random()
    secrets.token_hex(16)
    os.urandom(32)
    os.getrandom(16)


@section
def native_code():
    libc = ctypes.CDLL("libc.so.6")
    assert libc.getpid() == os.getpid()
    ctypes.CDLL(None).strlen(b"abc")
    from ctypes import util
    util.find_library("c")
    import _ctypes
    ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(lambda x: x + 1)(1)


@section
def event_loops():
    async def main():
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "print(1)", stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()
        assert out == b"1\n"
        await asyncio.sleep(0.001)
        await asyncio.get_running_loop().run_in_executor(None, square, 3)
    asyncio.run(main())
    a, b = socket.socketpair()
    sel = selectors.DefaultSelector()
    sel.register(a, selectors.EVENT_READ)
    b.send(b"x")
    assert sel.select(1)
    select.select([a], [], [], 0)
    select.poll().poll(0)
    a.close(), b.close()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(WORK / "sock"))
    srv.listen()
    cli = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    cli.connect(str(WORK / "sock"))
    conn, _ = srv.accept()
    cli.sendall(b"ping")
    assert conn.recv(4) == b"ping"


@section
def host_info():
    platform.platform(), platform.uname(), os.uname()
    os.cpu_count(), os.sched_getaffinity(0), os.getloadavg()
    resource.getrusage(resource.RUSAGE_SELF)
    resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.getuid(), os.geteuid(), os.getgid(), os.getegid(), os.getgroups(), os.getppid(), os.getpgrp()
    os.getpriority(os.PRIO_PROCESS, 0)
    os.nice(0)
    os.environ.get("HOME")
    os.get_terminal_size() if os.isatty(1) else None
    sys.getrecursionlimit()
    gc.collect()


def main():
    global WORK
    WORK = pathlib.Path(tempfile.mkdtemp(prefix="trace-"))
    for fn in SECTIONS:
        try:
            fn()
            RESULTS[fn.__name__] = "ok"
        except Exception as e:  # report every failure, keep going
            RESULTS[fn.__name__] = f"{type(e).__name__}: {e}"
    print(json.dumps(RESULTS))
    shutil.rmtree(WORK, ignore_errors=True)
    sys.exit(0 if all(v == "ok" for v in RESULTS.values()) else 1)


if __name__ == "__main__":
    main()
