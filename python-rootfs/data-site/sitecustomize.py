"""sitecustomize for the jail's data rootfs (installed as /etc/python3.11/sitecustomize.py).

Matplotlib keeps its font list in a cache dir that must be writable
(MPLCONFIGDIR, else ~/.cache/matplotlib); given a read-only one it makes a
temporary dir and rebuilds the list there, on every run, with a warning. The
rootfs is read-only and every jail starts with an empty /tmp, so the list is
built once at build time (/usr/share/jail/matplotlib) and, the first time a
script imports matplotlib, copied into a writable MPLCONFIGDIR ($TMPDIR/matplotlib
unless the script's environment names one). Agg is the default backend.

joblib (scikit-learn's parallel backend) counts physical cores with lscpu,
which reads /sys; the jail mounts no /sys, so every run would start lscpu,
find no cores and warn. Its core count is set instead to what loky falls
back to anyway, the CPUs this process may use (sched_getaffinity), and
LOKY_MAX_CPU_COUNT defaults to OMP_NUM_THREADS (which the jail derives from
the CPU limit) when that is set.

Nothing happens unless those packages are imported: a finder at the front of
sys.meta_path waits for their names, runs each hook once (before the import,
or after it through the module's loader), and removes itself when all are
done. Any failure leaves the package to its own fallback, never breaks the
import.
"""

import os
import sys

_PREBUILT = "/usr/share/jail/matplotlib"


def _prepare_matplotlib():
    os.environ.setdefault("MPLBACKEND", "Agg")
    configdir = os.environ.get("MPLCONFIGDIR")
    if not configdir:
        configdir = os.path.join(os.environ.get("TMPDIR") or "/tmp", "matplotlib")
        os.environ["MPLCONFIGDIR"] = configdir
    try:
        os.makedirs(configdir, exist_ok=True)
        for name in os.listdir(_PREBUILT):
            dest = os.path.join(configdir, name)
            if name.endswith(".json") and not os.path.lexists(dest):
                with open(os.path.join(_PREBUILT, name), "rb") as src:
                    data = src.read()
                with open(dest, "xb") as out:
                    out.write(data)
    except OSError:
        pass


def _prepare_joblib():
    count = os.environ.get("OMP_NUM_THREADS", "")
    if count.isdigit() and int(count) >= 1:
        os.environ.setdefault("LOKY_MAX_CPU_COUNT", count)


def _after_loky_context(module):
    if getattr(module, "physical_cores_cache", 0) is None:
        try:
            module.physical_cores_cache = len(os.sched_getaffinity(0))
        except OSError:
            pass


# Run before the named module is imported.
_BEFORE = {"matplotlib": _prepare_matplotlib, "joblib": _prepare_joblib}
# Run on the module just after it is executed.
_AFTER = {"joblib.externals.loky.backend.context": _after_loky_context}


class _PrepareOnImport:
    """Runs each hook once, around the first import of its module."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        spec = None
        before = _BEFORE.pop(name, None)
        after = _AFTER.pop(name, None)
        if not _BEFORE and not _AFTER:
            try:
                sys.meta_path.remove(cls)
            except ValueError:
                pass
        if before is not None:
            before()
        if after is not None:
            from importlib.machinery import PathFinder

            spec = PathFinder.find_spec(name, path)
            loader = getattr(spec, "loader", None)
            if loader is None or not hasattr(loader, "exec_module"):
                return None
            run = loader.exec_module

            def exec_module(module):
                run(module)
                after(module)

            loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PrepareOnImport)
