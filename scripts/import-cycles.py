#!/usr/bin/env python3
"""No import circle: the module graph of each crate, from its `use` lines and
the `crate::`/`super::`/`self::`/child paths written inline, and every cycle
in it (Tarjan's strongly connected components). `make check-imports` runs it
in CI, right after the lints.

    import-cycles.py [--allow FILE] [--strict] [--edges] [--cut=A>B]... [SRC...]
    import-cycles.py --self-test

SRC is a crate's `src` folder; without one, every crate of the repository
(a folder with a Cargo.toml and a src/lib.rs or src/main.rs). A file is a
module (`lib.rs`/`main.rs` the root, `mod.rs` its folder); `#[cfg(test)]`
code is left out, both `mod tests { .. }` blocks and files declared by
`#[cfg(test)] mod x;`. A binary's main.rs beside a lib.rs is a leaf: it uses
the library by name and nothing uses it.

Two rules, both must hold:
- rooms: one node per room, a top-level module with everything under it.
  No room may need a room that needs it back.
- siblings: one node per file, with the edges
  between a module and its own ancestors left out, so a child may use its
  parent's shared types and a parent its children (seccomp and
  seccomp::compile, an `impl Pool` split across pool::run and its cancel.rs),
  but siblings may not form a cycle.
`--strict` also prints the cycles of the plain file graph, for information
only; `--edges` prints every edge of the three graphs; `--cut=A>B` drops an
edge first (module paths, `crate` for the root), to try a planned cut.

Every crate is free of cycles, and `make check-imports` holds it so: any
cycle fails. The ratchet it came in with stays for a cycle that must be
lived with for a while: `--allow FILE` lists cycles, one per line as this
script prints them; a cycle not listed fails, and a listed cycle that is
gone fails too, so such a list only ever shrinks (cut a cycle and delete
its line in the same commit, or, when the cycle only lost some of its
modules, rewrite the line as printed). Issue 35 emptied the list it came
in with and deleted the file.
Exit status: 0 clean (or exactly the listed cycles), 1 otherwise.
"""
import glob
import os
import re
import shutil
import sys
import tempfile
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rust_source import strip, drop_test_mods  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("rooms", "siblings")


def crates(root):
    """Every crate's src folder under root (depth 1 and 2), sorted."""
    out = []
    for pattern in ("*", os.path.join("*", "*")):
        for d in glob.glob(os.path.join(root, pattern)):
            rel = os.path.relpath(d, root)
            if rel.split(os.sep)[0] in ("target", ".git") or not os.path.isfile(os.path.join(d, "Cargo.toml")):
                continue
            src = os.path.join(d, "src")
            if os.path.isfile(os.path.join(src, "lib.rs")) or os.path.isfile(os.path.join(src, "main.rs")):
                out.append(src)
    return sorted(set(out))


def name(mod):
    return "::".join(mod) if mod else "crate"


def expand(tree):
    """`a::{b, c::{d, self}}` -> [a::b, a::c::d, a::c]."""
    tree = re.sub(r"\s+", "", tree)
    m = re.match(r"^(.*?)\{(.*)\}$", tree)
    if not m:
        return [tree]
    prefix, inner = m.group(1), m.group(2)
    items, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        cur += ch
    items.append(cur)
    out = []
    for it in items:
        if not it:
            continue
        for e in expand(it):
            out.append(prefix[:-2] if e == "self" else prefix + e)
    return out


class Crate:
    """One crate's modules and the edges between them (first line of each)."""

    def __init__(self, src):
        self.src = src.rstrip("/")
        self.files = {}  # module -> path
        has_lib = os.path.isfile(os.path.join(self.src, "lib.rs"))
        for root, _, names in os.walk(self.src):
            for n in names:
                if n.endswith(".rs"):
                    p = os.path.join(root, n)
                    self.files[self.module_of(p, has_lib)] = p
        self.texts, self.test_files, self.children = {}, set(), defaultdict(set)
        for mod, p in self.files.items():
            with open(p, encoding="utf-8") as f:
                t = strip(f.read())
            base = () if mod == ("<main>",) else mod
            for m in re.finditer(r"(#\[cfg\(test\)\]\s*)?(pub(\([^)]*\))?\s+)?mod\s+(\w+)\s*;", t):
                self.children[base].add(m.group(4))
                if m.group(1):
                    self.test_files.add(base + (m.group(4),))
            self.texts[mod] = drop_test_mods(t)
        # A test file's own children are test code too.
        for mod in list(self.files):
            if any(mod[:len(t)] == t for t in self.test_files):
                self.test_files.add(mod)
        self.edges = self.read_edges()

    def module_of(self, path, has_lib):
        rel = os.path.relpath(path, self.src)[:-3]
        parts = rel.split(os.sep)
        if parts == ["main"] and has_lib:
            return ("<main>",)  # the binary: its own crate, uses the lib by name
        if parts in (["lib"], ["main"]):
            return ()
        if parts[-1] == "mod":
            parts = parts[:-1]
        return tuple(parts)

    def known(self, mod):
        return mod in self.files and mod not in self.test_files

    def resolve(self, mod, path):
        segs = [re.sub(r"\bas\b.*$", "", s) for s in path.split("::") if s]
        if not segs:
            return None
        base = () if mod == ("<main>",) else mod
        if segs[0] == "crate":
            cur, segs = (), segs[1:]
        elif segs[0] == "self":
            cur, segs = base, segs[1:]
        elif segs[0] == "super":
            cur = base
            while segs and segs[0] == "super":
                cur, segs = cur[:-1], segs[1:]
        elif segs[0] in self.children[base]:
            cur = base
        else:
            return None  # std or another crate
        for s in segs:
            if self.known(cur + (s,)):
                cur = cur + (s,)
            else:
                break
        return cur

    def read_edges(self):
        edges = defaultdict(dict)  # from -> {to: line}
        for mod, t in self.texts.items():
            if mod in self.test_files or mod == ("<main>",):
                continue  # the binary is a leaf of the library
            spans = [(m.group(1), m.start()) for m in re.finditer(r"\buse\s+([^;]+);", t)]
            spans += [(m.group(0), m.start()) for m in re.finditer(r"(?<![\w:])(crate|super|self)(::\w+)+", t)]
            kids = self.children[mod]
            spans += [(m.group(0), m.start()) for m in re.finditer(r"(?<![\w:])(\w+)(::\w+)+", t) if m.group(1) in kids]
            for tree, pos in spans:
                for path in expand(tree):
                    to = self.resolve(mod, path)
                    if to is None or to == mod or to == ("<main>",):
                        continue
                    edges[mod].setdefault(to, t.count("\n", 0, pos) + 1)
        return edges

    def graph(self, mode, cuts=()):
        """(edges, where) for a mode: 'rooms', 'siblings' or 'strict'."""
        edges = defaultdict(dict)
        for a, tos in self.edges.items():
            for b, line in tos.items():
                if (name(a), name(b)) in cuts:
                    continue
                if mode == "siblings" and (b == a[:len(b)] or a == b[:len(a)]):
                    continue
                if mode == "rooms":
                    a_, b_ = a[:1], b[:1]
                    if a_ == b_ or not a_ or not b_:
                        continue
                    edges[a_].setdefault(b_, (a, line))
                else:
                    edges[a].setdefault(b, (a, line))
        return edges

    def where(self, at):
        mod, line = at
        return f"{os.path.relpath(self.files[mod])}:{line}"


def cycles(edges):
    """Tarjan's strongly connected components of more than one node."""
    index, low, onstack, stack, out = {}, {}, set(), [], []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        onstack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in onstack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                onstack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out, key=lambda c: (-len(c), c))


def label(src, root):
    return os.path.relpath(os.path.dirname(os.path.abspath(src)), root)


def key(crate_label, mode, comp):
    """One cycle as the allow-list writes it: `jail rooms: a, b, c`."""
    return f"{crate_label} {mode}: {', '.join(name(m) for m in comp)}"


def found(srcs, root, cuts=(), modes=MODES, show=None):
    """{key: [edge lines]} for every cycle of every crate in the given modes."""
    out = {}
    for src in srcs:
        crate = Crate(src)
        lab = label(src, root)
        for mode in modes:
            edges = crate.graph(mode, cuts)
            if show is not None and mode == show:
                for a in sorted(edges, key=name):
                    for b, at in sorted(edges[a].items(), key=lambda kv: name(kv[0])):
                        print(f"{lab} {mode}: {name(a)} -> {name(b)}  ({crate.where(at)})")
            for comp in cycles(edges):
                members = set(comp)
                lines = [f"    {name(a)} -> {name(b)}  {crate.where(at)}"
                         for a in comp for b, at in sorted(edges[a].items(), key=lambda kv: name(kv[0])) if b in members]
                out[key(lab, mode, comp)] = lines
    return out


def read_allow(path):
    with open(path, encoding="utf-8") as f:
        return [l.strip() for l in f if l.strip() and not l.lstrip().startswith("#")]


def check(srcs, root, allow_path=None, cuts=(), out=sys.stdout):
    """Print the verdict; return the exit status."""
    cyc = found(srcs, root, cuts)
    allowed = set(read_allow(allow_path)) if allow_path else set()
    labels = {label(s, root) for s in srcs}
    # An allow-list line for a crate not checked now (a single SRC given) is neither new nor gone.
    allowed = {a for a in allowed if a.split(" ", 1)[0] in labels}
    new = [k for k in cyc if k not in allowed]
    gone = sorted(allowed - set(cyc))

    def split(k):
        head, members = k.split(": ", 1)
        return head, set(members.split(", "))

    # A listed cycle that lost members but not all is the same cycle, smaller:
    # its line is rewritten, not deleted (still a failure, so the file stays exact).
    shrank = {}
    for k in new:
        for g in gone:
            if split(k)[0] == split(g)[0] and split(k)[1] < split(g)[1] and g not in shrank.values():
                shrank[k] = g
                break
    for k in new:
        if k in shrank:
            print(f"cycle shrank, rewrite its line in {os.path.relpath(allow_path)}:\n    was: {shrank[k]}\n    now: {k}", file=out)
            continue
        print(f"{'new import cycle' if allow_path else 'import cycle'}: {k}", file=out)
        for l in cyc[k]:
            print(l, file=out)
    for k in gone:
        if k not in shrank.values():
            print(f"cycle gone, delete its line from {os.path.relpath(allow_path)}: {k}", file=out)
    if set(new) - set(shrank):
        print("an import cycle makes its modules one: move what they share into a leaf module "
              "they all use (scripts/import-cycles.py --edges lists every edge)", file=out)
    if not new and not gone:
        what = f", {len(cyc)} listed in {os.path.relpath(allow_path)} (it only shrinks)" if allow_path else ""
        print(f"import cycles: {len(srcs)} crates, {'no new cycle' if allow_path else 'no cycle'}{what}", file=out)
    return 1 if new or gone else 0


def self_test():
    """The check fails on a planted cycle, passes a parent⇄child edge, and a
    stale allow-list line fails it; checked on temp copies, never the tree."""
    import io
    failures = []

    def expect(what, status, want, text=""):
        if status != want:
            failures.append(f"{what}: exit {status}, expected {want}\n{text}")

    def write(path, text):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)

    with tempfile.TemporaryDirectory() as tmp:
        # 1. Planting two rooms that use each other in a copy of jail/src
        #    makes the check fail, naming both (whatever else it says of
        #    the copy: the real check, which follows, judges the tree).
        src = os.path.join(tmp, "jail", "src")
        shutil.copytree(os.path.join(REPO, "jail", "src"), src)
        write(os.path.join(tmp, "jail", "Cargo.toml"), "")
        with open(os.path.join(src, "lib.rs"), "a", encoding="utf-8") as f:
            f.write("\nmod planted_a;\nmod planted_b;\n")
        write(os.path.join(src, "planted_a.rs"), "use crate::planted_b::B;\npub struct A(B);\n")
        write(os.path.join(src, "planted_b.rs"), "pub struct B;\nfn f() { let _ = crate::planted_a::A; }\n")
        buf = io.StringIO()
        status = check([src], tmp, out=buf)
        expect("planted cycle", status, 1, buf.getvalue())
        for mode in MODES:
            if f"import cycle: jail {mode}: planted_a, planted_b" not in buf.getvalue():
                failures.append(f"planted cycle not named in {mode} mode:\n{buf.getvalue()}")
        # 2. A listed cycle that is gone fails too.
        stale = os.path.join(tmp, "stale.allow")
        write(stale, "jail rooms: gone_a, gone_b\n")
        buf = io.StringIO()
        os.remove(os.path.join(src, "planted_b.rs"))
        write(os.path.join(src, "planted_b.rs"), "pub struct B;\n")
        status = check([src], tmp, stale, out=buf)
        expect("stale allow-list line", status, 1, buf.getvalue())
        if "cycle gone" not in buf.getvalue() or "gone_a, gone_b" not in buf.getvalue():
            failures.append(f"stale line not named:\n{buf.getvalue()}")
        # 3. The rules on a small crate: parent and child may use each other,
        #    siblings may not (one room, so only the sibling rule sees it);
        #    test code does not count.
        small = os.path.join(tmp, "small", "src")
        write(os.path.join(tmp, "small", "Cargo.toml"), "")
        write(os.path.join(small, "lib.rs"), "mod p;\nmod q;\n#[cfg(test)]\nmod tests { use crate::q::Q; }\n")
        write(os.path.join(small, "p.rs"), "mod a;\nmod b;\npub struct T;\nuse a::A;\n")
        write(os.path.join(small, "p", "a.rs"), "use super::T;\npub struct A;\n")
        write(os.path.join(small, "p", "b.rs"), "pub struct B(super::T);\n")
        write(os.path.join(small, "q.rs"), "pub struct Q;\n#[cfg(test)]\nmod tests { use crate::p::T; }\n")
        buf = io.StringIO()
        expect("parent and child", check([small], tmp, out=buf), 0, buf.getvalue())
        write(os.path.join(small, "p", "a.rs"), "use super::T;\npub struct A(super::b::B);\n")
        write(os.path.join(small, "p", "b.rs"), "use crate::p::a::A;\npub struct B(super::T);\n")
        buf = io.StringIO()
        status = check([small], tmp, out=buf)
        expect("siblings", status, 1, buf.getvalue())
        if "small siblings: p::a, p::b" not in buf.getvalue() or "small rooms" in buf.getvalue():
            failures.append(f"sibling cycle misjudged:\n{buf.getvalue()}")
        # 4. A listed cycle that lost a module is named as shrunk, and fails
        #    until its line is rewritten.
        write(os.path.join(small, "p", "c.rs"), "pub struct C;\n")
        bigger = os.path.join(tmp, "bigger.allow")
        write(bigger, "small siblings: p::a, p::b, p::c\n")
        buf = io.StringIO()
        expect("shrunk cycle", check([small], tmp, bigger, out=buf), 1, buf.getvalue())
        if "cycle shrank" not in buf.getvalue() or "now: small siblings: p::a, p::b" not in buf.getvalue():
            failures.append(f"shrunk cycle not named:\n{buf.getvalue()}")
        write(bigger, "small siblings: p::a, p::b\n")
        buf = io.StringIO()
        expect("rewritten line", check([small], tmp, bigger, out=buf), 0, buf.getvalue())
    for f in failures:
        print(f"self-test: {f}", file=sys.stderr)
    print(f"import-cycles self-test: {'FAILED' if failures else 'ok'} (a planted cycle fails the check, a stale or shrunk line fails it, parent and child pass)")
    return 1 if failures else 0


def main(argv):
    flags = [a for a in argv if a.startswith("--")]
    srcs = [a for a in argv if not a.startswith("--")]
    allow = None
    if "--allow" in argv:
        i = argv.index("--allow")
        allow = argv[i + 1]
        srcs.remove(allow)
    if "--self-test" in flags:
        return self_test()
    cuts = set()
    for f in flags:
        if f.startswith("--cut="):
            a, b = f[len("--cut="):].split(">")
            cuts.add((a, b))
    srcs = srcs or crates(REPO)
    root = REPO if all(os.path.abspath(s).startswith(REPO + os.sep) for s in srcs) else os.getcwd()
    if "--edges" in flags:
        for mode in ("rooms", "siblings", "strict"):
            found(srcs, root, cuts, modes=(mode,), show=mode)
    if "--strict" in flags:
        for k, lines in found(srcs, root, cuts, modes=("strict",)).items():
            print(f"(information) {k}")
            print("\n".join(lines))
    return check(srcs, root, allow, cuts)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
