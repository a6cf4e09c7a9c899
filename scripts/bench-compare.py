#!/usr/bin/python3
"""Before and after, from `make bench`'s JSON (bench/out/bench.json, copied
once per run): for each target of bench/bench.py, the range of its value
over the runs before and over the runs after, and whether the after range
is within noise: it overlaps the before range, or is better (lower for a
`<=` target, higher for a `>=` one). Every figure is already a ratio to
bare Python or an absolute the bench checks, taken in the same run.

    scripts/bench-compare.py --before A.json [B.json...] --after C.json [D.json...]

Exit status 0 when every target is within noise, 1 otherwise.
"""
import json
import sys


def load(paths):
    runs = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            runs.append(json.load(f).get("targets", {}))
    return runs


def main(argv):
    if "--before" not in argv or "--after" not in argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    b, a = argv.index("--before"), argv.index("--after")
    before = load(argv[b + 1 : a] if b < a else argv[b + 1 :])
    after = load(argv[a + 1 :] if a > b else argv[a + 1 : b])
    if not before or not after:
        print("bench-compare: give at least one JSON before and one after", file=sys.stderr)
        return 2
    names = sorted(set().union(*before, *after))
    worse = []
    print(f"{'target':40} {'before (min-max)':>22} {'after (min-max)':>22}  verdict")
    for name in names:
        bv = [r[name]["value"] for r in before if isinstance(r.get(name, {}).get("value"), (int, float))]
        av = [r[name]["value"] for r in after if isinstance(r.get(name, {}).get("value"), (int, float))]
        if not bv or not av:
            print(f"{name:40} {'-':>22} {'-':>22}  not in both")
            continue
        # The bench says which way a target points ("<= 1.15", ">= 0.85").
        target = next((str(r[name].get("target", "")) for r in before + after if name in r), "")
        lower_is_better = target.startswith("<=") or name.endswith("_max")
        overlaps = min(av) <= max(bv) and min(bv) <= max(av)
        better = max(av) < min(bv) if lower_is_better else min(av) > max(bv)
        verdict = "better" if better else "within noise" if overlaps else "WORSE"
        if verdict == "WORSE":
            worse.append(name)
        rng = lambda v: f"{min(v):.3g}-{max(v):.3g}"
        print(f"{name:40} {rng(bv):>22} {rng(av):>22}  {verdict}")
    print(f"bench-compare: {len(before)} runs before, {len(after)} after; "
          + (f"worse: {', '.join(worse)}" if worse else "every target within noise or better"))
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
