#!/usr/bin/python3
"""The VM matrix: prove the jail on pure cgroup-v2 hosts with older kernels.

For each entry of tests/vm/matrix.txt this boots a throwaway Debian 12 guest
with QEMU (KVM when the host has real hardware virtualisation, else TCG):
Debian's stock kernel of that entry, downloaded from the entry's Debian
suites through a private apt configuration under the cache (the host's apt
sources are never changed); a root image built with debootstrap; systemd as
init with only the unified cgroup hierarchy. The host's build output (the jail binary, the test
binaries of tests/vm/tests.txt, the minimal rootfs, policies and examples)
reaches the guest as one tarball over 9p; tests/vm/guest.sh, inside, checks
the kernel and the cgroup layout, prints `jail doctor`, and runs the tests as
root and as an ordinary user in a systemd-delegated cgroup. Its output is
streamed here from a file-backed serial port and its exit status comes back
through the share.

The kernel (with a small busybox initramfs) and the image are cached under
JAIL_VM_CACHE (default /var/cache/jail-vm as root, ~/.cache/jail-vm
otherwise), keyed by a hash of their recipe, and rebuilt from scratch when
absent. Nothing is written to the repository.

Usage: tests/vm/vm.py [ENTRY...]          (default: every entry of the matrix)
Environment: JAIL_VM_CACHE, JAIL_VM_ACCEL (kvm|tcg), JAIL_VM_TIMEOUT (seconds
per guest, default 1800), JAIL_ROOTFS (the rootfs to test, default python-rootfs/out/minimal),
JAIL_VM_TESTS (a test list other than tests/vm/tests.txt), JAIL_VM_KEEP=1
(keep the work folder with the serial logs), CARGO_TARGET_DIR.
"""

import contextlib
import ctypes
import fcntl
import hashlib
import inspect
import json
import lzma
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SUITE = "bookworm"  # the guest's Debian release (its userland)
# Modules the stock kernel keeps out of its image that the guest needs before
# systemd runs: the virtio disk, ext4 (crc32c for its checksums) and 9p.
MODULES = ["virtio_pci", "virtio_blk", "ext4", "crc32c_generic", "9p", "9pnet_virtio"]
# Host tools and the Debian package that provides each.
TOOLS = {
    "qemu-system-x86_64": "qemu-system-x86",
    "debootstrap": "debootstrap",
    "cpio": "cpio",
    "depmod": "kmod",
    "modprobe": "kmod",
    "mkfs.ext4": "e2fsprogs",
    "dpkg-deb": "dpkg",
}
# Every Debian release's archive key is in the host's debian-archive-keyring.
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
KNOWN_SUITES = ["bullseye", "bookworm", "trixie", "forky"]
GUEST_MEMORY_MB = 2048
GUEST_CPUS = 2


class VmError(Exception):
    """A host-side step failed; the message says which and how to fix it."""


def log(msg: str) -> None:
    print(f"vm: {msg}", flush=True)


def run(cmd: list, **kw) -> subprocess.CompletedProcess:
    """Run a command, failing with its output when it fails."""
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if r.returncode != 0:
        tail = "\n".join(r.stdout.splitlines()[-30:])
        raise VmError(f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{tail}")
    return r


def sha256(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def seconds(t0: float, t1: float | None = None) -> float:
    return round((t1 if t1 is not None else time.monotonic()) - t0, 1)


# --- data: the matrix and the tests ------------------------------------------

@dataclass
class Entry:
    name: str
    suites: list[str]  # the Debian suites the kernel comes from (highest version wins)
    package: str  # the kernel metapackage
    prefix: str  # what `uname -r` must start with


def read_matrix(path: Path) -> list[Entry]:
    entries = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].split()
        if not line:
            continue
        if len(line) != 4:
            raise VmError(f"{path}:{n}: want NAME SUITES PACKAGE UNAME_PREFIX, got {' '.join(line)}")
        name, suites, package, prefix = line
        bad = [x for x in suites.split(",") if x.split("-")[0] not in KNOWN_SUITES]
        if bad:
            raise VmError(f"{path}:{n}: unknown Debian suite {', '.join(bad)} (known: {', '.join(KNOWN_SUITES)})")
        entries.append(Entry(name, suites.split(","), package, prefix))
    return entries


@dataclass
class TestLine:
    binary: str  # a jail-tests test binary
    args: str  # libtest arguments
    only: set[str] | None = None  # the entries it runs in (None: every one)
    skip: set[str] = field(default_factory=set)  # the entries it does not run in

    def runs_in(self, entry: str) -> bool:
        return (self.only is None or entry in self.only) and entry not in self.skip


def read_tests(path: Path, entries: list[str]) -> list[TestLine]:
    """One TestLine per line of tests.txt: `[ENTRY,...] BINARY ARGS` runs in
    those entries only, `[!ENTRY,...] BINARY ARGS` in all but those."""
    tests = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        only, skip = None, set()
        if line.startswith("["):
            sel, _, line = line[1:].partition("]")
            names = {x.strip() for x in sel.lstrip("!").split(",") if x.strip()}
            unknown = names - set(entries)
            if unknown or not names:
                raise VmError(f"{path}:{n}: [{sel}] names no matrix entry or unknown ones: {', '.join(sorted(unknown))}")
            if sel.startswith("!"):
                skip = names
            else:
                only = names
        name, _, args = line.strip().partition(" ")
        tests.append(TestLine(name, args.strip(), only, skip))
    if not tests:
        raise VmError(f"{path} lists no test binary")
    return tests


def tests_for(tests: list[TestLine], entry: str) -> str:
    """The guest's test list for one entry: `BINARY ARGS` a line."""
    return "".join(f"{t.binary} {t.args}".strip() + "\n" for t in tests if t.runs_in(entry))


# --- host setup ---------------------------------------------------------------

def ensure_tools() -> None:
    """Install the host tools the matrix needs from the configured sources."""
    missing = sorted({pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None})
    static_busybox = subprocess.run(["dpkg-query", "-W", "-f=${Status}", "busybox-static"],
                                    capture_output=True, text=True).stdout
    if "install ok installed" not in static_busybox:
        missing.append("busybox-static")
    if not missing:
        return
    if os.getuid() != 0:
        raise VmError(f"missing host packages; install them: sudo apt-get install --no-install-recommends {' '.join(missing)}")
    log(f"installing {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], env=env)


def index_targets() -> list[dict]:
    """The configured package sources, as apt sees them."""
    out = run(["apt-get", "indextargets", "--format",
               "$(CREATED_BY) $(RELEASE) $(CODENAME) $(COMPONENT) $(REPO_URI)"]).stdout
    targets = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[0] == "Packages":
            targets.append(dict(zip(["kind", "release", "codename", "component", "uri"], parts)))
    return targets


def debian_mirror(targets: list[dict]) -> str:
    for t in targets:
        if SUITE in (t["release"], t["codename"]) and t["component"] == "main":
            return t["uri"]
    raise VmError(f"no configured package source serves Debian {SUITE} main (see /etc/apt/sources.list*)")


def security_mirror(targets: list[dict]) -> str:
    """The host's debian-security URI (its suites are SUITE-security)."""
    for t in targets:
        if t["codename"] == f"{SUITE}-security" and t["component"] == "main":
            return t["uri"]
    return "http://deb.debian.org/debian-security/"


class KernelSource:
    """A private apt configuration for one matrix entry's kernel: its own
    sources list (the entry's suites only), package lists, cache and an
    empty dpkg status, all under the VM cache. It downloads kernel packages
    and nothing else, and never touches the host's /etc/apt: apt reads no
    host sources, preferences or lists through it (Dir::Etc::* point into
    the private root; apt.conf.d snippets still apply, as for any apt run)."""

    def __init__(self, root: Path, entry: Entry, mirror: str, security: str):
        self.dir = root / f"apt-{entry.name}"
        self.entry = entry
        lines = []
        for suite in entry.suites:
            uri = security if suite.endswith("-security") else mirror
            lines.append(f"deb [signed-by={KEYRING}] {uri} {suite} main\n")
        self.sources = "".join(lines)

    def opts(self) -> list[str]:
        d = self.dir
        opts = [
            "-o", f"Dir::Etc::sourcelist={d}/sources.list",
            "-o", f"Dir::Etc::sourceparts={d}/sources.list.d",
            "-o", f"Dir::Etc::preferences={d}/preferences",
            "-o", f"Dir::Etc::preferencesparts={d}/preferences.d",
            "-o", f"Dir::State::Lists={d}/lists",
            "-o", f"Dir::State::status={d}/status",
            "-o", f"Dir::Cache={d}/cache",
            "-o", "APT::Get::List-Cleanup=1",
        ]
        if os.getuid() == 0:
            opts += ["-o", "APT::Sandbox::User=root"]
        return opts

    def update(self) -> None:
        """Refresh the private package lists; with lists already there, an
        unreachable mirror only warns (the cached kernel stays usable)."""
        for sub in ("sources.list.d", "preferences.d", "lists/partial", "cache/archives/partial"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        (self.dir / "status").touch()
        (self.dir / "sources.list").write_text(self.sources)
        r = subprocess.run(["apt-get", *self.opts(), "-qq", "update"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0 or "W:" in r.stdout or "E:" in r.stdout:
            have_lists = any((self.dir / "lists").glob("*_Packages*"))
            tail = "\n".join(r.stdout.splitlines()[-10:])
            if r.returncode != 0 and not have_lists:
                raise VmError(f"apt-get update for {self.entry.name} ({' '.join(self.entry.suites)}) failed:\n{tail}")
            log(f"[{self.entry.name}] apt-get update warned; using the lists it has:\n{tail}")

    def apt(self, *args: str, **kw) -> str:
        return run(["apt-cache" if args[0] in ("policy", "show") else "apt-get", *self.opts(), *args], **kw).stdout

    def candidate(self, package: str) -> str:
        for line in self.apt("policy", package).splitlines():
            if line.strip().startswith("Candidate:"):
                v = line.split(":", 1)[1].strip()
                if v and v != "(none)":
                    return v
        raise VmError(f"{' '.join(self.entry.suites)} offer no {package} (entry {self.entry.name})")

    def kernel_package(self) -> tuple[str, str]:
        """The versioned linux-image package the metapackage depends on, and its version."""
        package = self.entry.package
        meta_version = self.candidate(package)
        for line in self.apt("show", f"{package}={meta_version}").splitlines():
            if line.startswith("Depends:"):
                for dep in line.split(":", 1)[1].split(","):
                    name = dep.split()[0]
                    if name.startswith("linux-image-"):
                        return name, self.candidate(name)
        raise VmError(f"{package} {meta_version} depends on no linux-image package")

    def download(self, package: str, version: str, into: Path) -> None:
        self.apt("download", f"{package}={version}", cwd=into)


# --- the cache ----------------------------------------------------------------

def cache_root() -> Path:
    if os.environ.get("JAIL_VM_CACHE"):
        root = Path(os.environ["JAIL_VM_CACHE"])
    elif os.getuid() == 0:
        root = Path("/var/cache/jail-vm")
    else:
        root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "jail-vm"
    root = root.resolve()
    if root == REPO or REPO in root.parents:
        raise VmError(f"the VM cache {root} is inside the repository; point JAIL_VM_CACHE elsewhere")
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextlib.contextmanager
def locked(root: Path):
    """One matrix run per cache at a time (builds replace cache entries)."""
    with open(root / ".lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another test-vm run holding {root}/.lock")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def cached(root: Path, family: str, key: str, build) -> tuple[Path, bool]:
    """root/family-key, built by build(tmpdir) into a temporary folder that
    is renamed into place when complete; older keys of the family removed."""
    final = root / f"{family}-{key}"
    if final.is_dir():
        return final, True
    # Under the lock, an older key of this family or a half-built folder
    # left by a killed run is stale.
    for old in [*root.glob(f"{family}-*"), *root.glob(f".{family}-*")]:
        rest = old.name.lstrip(".").removeprefix(f"{family}-")
        if old.is_dir() and (old.name.startswith(".") or (len(rest) == 16 and all(c in "0123456789abcdef" for c in rest))):
            log(f"removing stale cache entry {old}")
            shutil.rmtree(old)
    tmp = Path(tempfile.mkdtemp(prefix=f".{family}-", dir=root))
    try:
        build(tmp)
        tmp.rename(final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return final, False


def build_image(root: Path, mirror: str) -> tuple[Path, bool]:
    recipe = HERE / "image.sh"
    key = sha256(recipe.read_bytes(), SUITE, mirror)

    def build(tmp: Path) -> None:
        if os.getuid() != 0:
            raise VmError("building the guest image needs root (debootstrap); run make test-vm as root once to fill the cache")
        log(f"building the {SUITE} root image with debootstrap from {mirror} (about a minute)")
        run([str(recipe), str(tmp / "root.img"), SUITE, mirror])

    d, hit = cached(root, "image", key, build)
    return d / "root.img", hit


def initramfs_modules(tree: Path, release: str) -> list[tuple[str, bytes]]:
    """MODULES and their dependencies from an unpacked kernel package, in
    load order, uncompressed (busybox insmod reads plain .ko files; 6.12
    ships .ko.xz)."""
    run(["depmod", "-b", str(tree), release])
    order = []
    for m in MODULES:
        out = run(["modprobe", "-d", str(tree), "-S", release, "--show-depends", m]).stdout
        for line in out.splitlines():
            kind, *rest = line.split()
            if kind == "insmod" and rest[0] not in order:  # "builtin NAME" needs nothing
                order.append(rest[0])
    modules = []
    for ko in map(Path, order):
        data = ko.read_bytes()
        if ko.suffix == ".xz":
            data = lzma.decompress(data)
        elif ko.suffix == ".zst":
            data = subprocess.run(["zstd", "-dc", str(ko)], capture_output=True, check=True).stdout
        modules.append((ko.name.removesuffix(".xz").removesuffix(".zst"), data))
    return modules


def build_kernel(root: Path, entry: Entry, source: KernelSource, package: str, version: str) -> tuple[Path, bool]:
    init = HERE / "initramfs-init"
    busybox = run(["dpkg-query", "-W", "-f=${Version}", "busybox-static"]).stdout
    # The recipe: this function and the module picker are part of the key.
    recipe = inspect.getsource(build_kernel) + inspect.getsource(initramfs_modules)
    key = sha256(package, version, " ".join(MODULES), init.read_bytes(), busybox, recipe)

    def build(tmp: Path) -> None:
        log(f"fetching {package} {version} and building its initramfs")
        source.download(package, version, tmp)
        (deb,) = tmp.glob("*.deb")
        x = tmp / "x"
        run(["dpkg-deb", "-x", str(deb), str(x)])
        # Trixie's packages ship merged /usr (usr/lib/modules); depmod and
        # modprobe -d want BASE/lib/modules.
        if not (x / "lib").exists() and (x / "usr/lib/modules").is_dir():
            (x / "lib").symlink_to("usr/lib")
        if not (x / "boot").exists() and (x / "usr/boot").is_dir():
            (x / "boot").symlink_to("usr/boot")
        (release,) = [p.name for p in (x / "lib/modules").iterdir()]
        ird = tmp / "initramfs"
        (ird / "bin").mkdir(parents=True)
        (ird / "lib/modules").mkdir(parents=True)
        shutil.copy2("/bin/busybox", ird / "bin/busybox")
        shutil.copy2(init, ird / "init")
        (ird / "init").chmod(0o755)
        names = []
        for name, data in initramfs_modules(x, release):
            (ird / "lib/modules" / name).write_bytes(data)
            names.append(name)
        (ird / "modules").write_text("".join(n + "\n" for n in names))
        files = run(["find", "."], cwd=ird).stdout
        with open(tmp / "initrd.img", "wb") as out:
            cpio = subprocess.Popen(["cpio", "-o", "-H", "newc", "--quiet"], cwd=ird,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            gz = subprocess.Popen(["gzip", "-1"], stdin=cpio.stdout, stdout=out)
            cpio.stdout.close()
            cpio.communicate(files.encode())
            if cpio.wait() != 0 or gz.wait() != 0:
                raise VmError("building the initramfs with cpio failed")
        shutil.copy2(x / f"boot/vmlinuz-{release}", tmp / "vmlinuz")
        (tmp / "release").write_text(release + "\n")
        shutil.rmtree(x)
        shutil.rmtree(ird)
        deb.unlink()

    return cached(root, f"kernel-{entry.name}", key, build)


# --- the payload --------------------------------------------------------------

def cargo(*args: str) -> str:
    return run(["cargo", *args], cwd=REPO).stdout


def test_binaries() -> dict[str, Path]:
    """Every integration-test binary of jail-tests and jail-tests-fronts (the
    serve tests), by target name (built now)."""
    found = {}
    # --workspace, as `make test` builds them (see build_payload).
    out = cargo("test", "--workspace", "--no-run", "--message-format=json", "--quiet")
    for line in out.splitlines():
        try:
            m = json.loads(line)
        except json.JSONDecodeError:
            continue
        if m.get("reason") == "compiler-artifact" and m.get("executable") and "test" in m["target"]["kind"]:
            found[m["target"]["name"]] = Path(m["executable"])
    return found


def build_payload(share_dir: Path, tests: list[TestLine], rootfs: Path) -> Path:
    # jail-serve for the serve tests: it runs the `jail` beside it. The
    # whole workspace, as `make build` builds it: `-p jail -p jail-serve`
    # alone unifies other features and builds the jail crate and its
    # dependencies a second time (minutes, and a gigabyte of target/).
    cargo("build", "--workspace", "--quiet")
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    jail = target / "debug/jail"
    bins = test_binaries()
    names = sorted({t.binary for t in tests})
    unknown = [name for name in names if name not in bins]
    if unknown:
        raise VmError(f"tests/vm/tests.txt names {', '.join(unknown)}, which no test crate builds "
                      f"(it has: {', '.join(sorted(bins))})")
    # A --skip that names no test (a test renamed since) would silently run
    # what the line meant to leave out.
    for t in tests:
        args = t.args.split()
        listed = None
        for flag, name in zip(args, args[1:]):
            if flag != "--skip":
                continue
            if listed is None:
                listed = run([str(bins[t.binary]), "--list"]).stdout
            if name not in listed:
                raise VmError(f"tests/vm/tests.txt: `{t.binary} --skip {name}` names no test of {t.binary}")
    if not (rootfs / "usr/bin/python3").exists():
        raise VmError(f"no rootfs at {rootfs}: build it with `make rootfs` (or set JAIL_ROOTFS)")

    def normalise(ti: tarfile.TarInfo) -> tarfile.TarInfo:
        ti.uid = ti.gid = 0
        ti.uname = ti.gname = "root"
        ti.mode |= 0o555 if (ti.isdir() or ti.mode & 0o100) else 0o444
        return ti

    payload = share_dir / "payload.tar"
    with tarfile.open(payload, "w", format=tarfile.GNU_FORMAT) as tar:
        tar.add(jail, "bin/jail", filter=normalise)
        tar.add(jail.with_name("jail-serve"), "bin/jail-serve", filter=normalise)
        # A pool's template loads the jail crate's cdylib from beside jail.
        tar.add(jail.with_name("libjail.so"), "bin/libjail.so", filter=normalise)
        for name in names:
            tar.add(bins[name], f"bin/{name}", filter=normalise)
        for d in ("policies", "examples", "schema"):
            if (REPO / d).is_dir():
                tar.add(REPO / d, f"repo/{d}", filter=normalise)
        tar.add(rootfs, "rootfs", filter=normalise)
        tar.add(HERE / "guest.sh", "guest.sh", filter=normalise)
    return payload


# --- one guest ------------------------------------------------------------------

def accelerator() -> list[str]:
    """KVM only with real hardware virtualisation (kvm_intel or kvm_amd);
    software nested virtualisation behind /dev/kvm aborts or crawls."""
    choice = os.environ.get("JAIL_VM_ACCEL")
    hw = any(Path(f"/sys/module/{m}").exists() for m in ("kvm_intel", "kvm_amd")) \
        and os.access("/dev/kvm", os.R_OK | os.W_OK)
    if choice == "kvm" or (choice is None and hw):
        return ["-accel", "kvm", "-cpu", "host"]
    return ["-accel", "tcg,thread=multi", "-cpu", "max"]


def die_with_parent() -> None:
    """In the qemu child: be killed when this runner dies, however it dies."""
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class Outcome:
    entry: str
    verdict: str  # PASS or FAIL
    detail: str = ""
    times: dict = field(default_factory=dict)
    #: The guest never came up (no "guest up" line): nothing of ours ran,
    #: so a second boot hides no test result.
    never_up: bool = False


#: Boots of a guest that never came up (a kernel that panics early under
#: TCG now and then), before its failure stands.
BOOTS = 2


def boot(entry: Entry, kernel: Path, image: Path, share: Path, timeout: float) -> Outcome:
    release = (kernel / "release").read_text().strip()
    (share / "entry.env").write_text(
        f"ENTRY={entry.name}\nEXPECT_RELEASE={release}\nEXPECT_PREFIX={entry.prefix}\n")
    shutil.copy2(HERE / "guest.sh", share / "guest.sh")
    console, out = share.parent / f"{share.name}.console.log", share.parent / f"{share.name}.out.log"
    cmdline = ("console=ttyS0 panic=-1 loglevel=4 "
               "systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all "
               "systemd.show_status=0")
    qemu = [
        "qemu-system-x86_64", "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
        *accelerator(), "-smp", str(GUEST_CPUS), "-m", str(GUEST_MEMORY_MB),
        "-kernel", str(kernel / "vmlinuz"), "-initrd", str(kernel / "initrd.img"), "-append", cmdline,
        # snapshot=on: the guest's writes go to a temporary overlay, the cached image stays clean.
        "-drive", f"file={image},format=raw,if=virtio,snapshot=on",
        "-virtfs", f"local,path={share},mount_tag=jailshare,security_model=none,id=share",
        # File-backed serial ports: ttyS0 the console, ttyS1 the test output.
        # (A stdio chardev with no reader can block the guest's writes.)
        "-chardev", f"file,id=con,path={console}", "-serial", "chardev:con",
        "-chardev", f"file,id=out,path={out}", "-serial", "chardev:out",
    ]
    log(f"[{entry.name}] booting {release}: {' '.join(qemu)}")
    t0 = time.monotonic()
    times = {}
    qemu_log = share.parent / f"{share.name}.qemu.log"
    with open(qemu_log, "wb") as qlog:
        proc = subprocess.Popen(qemu, stdin=subprocess.DEVNULL, stdout=qlog,
                                stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
    timed_out = False
    try:
        pos, pending = 0, b""
        while True:
            exited = proc.poll() is not None
            if out.exists():
                with open(out, "rb") as f:
                    f.seek(pos)
                    chunk = f.read()
                pos += len(chunk)
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    line = raw.decode(errors="replace").rstrip("\r")
                    print(f"[{entry.name}] {line}", flush=True)
                    if line.startswith("jail-vm: guest up") and "boot" not in times:
                        times["boot"] = seconds(t0)
                    if line.startswith("jail-vm: finished"):
                        times["tests"] = seconds(t0) - times.get("boot", 0)
                        t_done = time.monotonic()
            if exited:
                break
            if time.monotonic() - t0 > timeout:
                timed_out = True
                log(f"[{entry.name}] no power-off after {timeout:.0f} s: killing qemu (pid {proc.pid})")
                break
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    if pending:
        print(f"[{entry.name}] {pending.decode(errors='replace')}", flush=True)
    if "tests" in times:
        times["shutdown"] = seconds(t_done)
    times["total"] = seconds(t0)
    qemu_out = qemu_log.read_text(errors="replace").strip()
    status_file = share / "status"
    status = status_file.read_text().strip() if status_file.exists() else None

    def show_console(why: str) -> None:
        log(f"[{entry.name}] {why}; last lines of the guest console:")
        text = console.read_text(errors="replace") if console.exists() else ""
        for line in text.splitlines()[-60:]:
            print(f"[{entry.name} console] {line.rstrip()}", flush=True)
        if qemu_out:
            print(f"[{entry.name} qemu] {qemu_out}", flush=True)

    never_up = "boot" not in times
    if timed_out:
        show_console("timed out")
        return Outcome(entry.name, "FAIL", f"timed out after {timeout:.0f} s", times, never_up)
    if status is None:
        show_console(f"qemu exited {proc.returncode} and the guest reported no status")
        return Outcome(entry.name, "FAIL", "the guest reported no status", times, never_up)
    if status != "0":
        show_console(f"the guest reported status {status}")
        return Outcome(entry.name, "FAIL", f"guest status {status} (see the [{entry.name}] lines above)", times)
    return Outcome(entry.name, "PASS", f"kernel {release}", times)


# --- main -----------------------------------------------------------------------

@contextlib.contextmanager
def work_folder(keep: bool):
    """A temporary folder for the payload, shares and serial logs; kept for
    inspection with JAIL_VM_KEEP=1."""
    work = Path(tempfile.mkdtemp(prefix="jail-vm-"))
    try:
        yield work
    finally:
        if keep:
            log(f"kept the work folder (payload, shares, serial logs) at {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str]) -> int:
    t_start = time.monotonic()
    entries = read_matrix(HERE / "matrix.txt")
    if argv:
        unknown = [a for a in argv if a not in {e.name for e in entries}]
        if unknown:
            raise VmError(f"no matrix entry {', '.join(unknown)} (have: {', '.join(e.name for e in entries)})")
        entries = [e for e in entries if e.name in argv]
    tests = read_tests(Path(os.environ.get("JAIL_VM_TESTS", HERE / "tests.txt")), [e.name for e in read_matrix(HERE / "matrix.txt")])
    timeout = float(os.environ.get("JAIL_VM_TIMEOUT", "1800"))
    rootfs = Path(os.environ.get("JAIL_ROOTFS", REPO / "python-rootfs/out/minimal"))
    ensure_tools()
    targets = index_targets()
    mirror = debian_mirror(targets)
    root = cache_root()
    outcomes = []
    keep = os.environ.get("JAIL_VM_KEEP") == "1"
    with locked(root), work_folder(keep) as work:
        t0 = time.monotonic()
        payload = build_payload(work, tests, rootfs)
        log(f"payload: {payload.stat().st_size / 2**20:.0f} MiB ({', '.join(sorted({t.binary for t in tests}))}, jail, rootfs) "
            f"in {seconds(t0)} s")
        t0 = time.monotonic()
        image, hit = build_image(root, mirror)
        log(f"root image {image}: {'cached' if hit else 'built'} in {seconds(t0)} s")
        security = security_mirror(targets)
        for entry in entries:
            t0 = time.monotonic()
            source = KernelSource(root, entry, mirror, security)
            source.update()
            package, version = source.kernel_package()
            kernel, hit = build_kernel(root, entry, source, package, version)
            setup = seconds(t0)
            log(f"[{entry.name}] kernel {package} {version} from {', '.join(entry.suites)}: "
                f"{'cached' if hit else 'fetched'} in {setup} s")
            for attempt in range(1, BOOTS + 1):
                share = work / f"share-{entry.name}-{attempt}"
                share.mkdir()
                os.link(payload, share / "payload.tar")
                (share / "tests").write_text(tests_for(tests, entry.name))
                outcome = boot(entry, kernel, image, share, timeout)
                if not (outcome.verdict == "FAIL" and outcome.never_up) or attempt == BOOTS:
                    break
                log(f"[{entry.name}] the guest never came up ({outcome.detail}): booting it again "
                    f"({attempt + 1} of {BOOTS}); its tests had not started")
            if attempt > 1:
                outcome.detail += f" (boot {attempt} of {BOOTS}: the first never came up)"
            outcome.times = {"setup": setup, **outcome.times}
            outcomes.append(outcome)
    print("\n== VM matrix", flush=True)
    failed = False
    for o in outcomes:
        t = "  ".join(f"{k} {v:.1f} s" for k, v in o.times.items())
        print(f"  {o.entry:<16} {o.verdict:<12} {o.detail}{'  ' + t if t else ''}", flush=True)
        failed |= o.verdict != "PASS"
    print(f"  whole matrix: {seconds(t_start)} s, accelerator {accelerator()[1]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    # SIGTERM and SIGHUP unwind like Ctrl-C, so qemu is always stopped.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, f: sys.exit(128 + s))
    try:
        sys.exit(main(sys.argv[1:]))
    except VmError as e:
        print(f"vm: error: {e}", file=sys.stderr)
        sys.exit(1)
