#!/usr/bin/python3
"""Build deploy/k8s/seccomp-jail.json, the pod's Localhost seccomp profile.

    deploy/k8s/seccomp/make-profile.py            write the profile
    deploy/k8s/seccomp/make-profile.py --check    fail if the committed profile is not what the inputs give
    deploy/k8s/seccomp/make-profile.py --compare RUNTIME_DEFAULT.json
                                                   print what the profile allows that the runtime
                                                   default does not give a container without
                                                   capabilities, and what it refuses that the default allows

The profile is an allowlist with ENOSYS as its default errno, built from:
  - every syscall policies/default.json lets the script make (any rule whose
    action is allow, with or without conditions: the jail's own filter
    applies the conditions, stacked under this one);
  - traced.txt: what jail-serve, the jails' supervisors, the allowlist proxy
    and jail pool were seen making (trace.sh);
  - extras.json "allow": what they need that no trace here shows, each with why.
extras.json "eperm" lists calls refused with EPERM (as the jail's policy
refuses them) instead of the default ENOSYS. Only x86_64 calls are allowed:
any other architecture's calls are killed by the runtime.
"""
import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[2]
PROFILE = HERE.parent / "seccomp-jail.json"
ENOSYS, EPERM = 38, 1


def policy_allowed():
    rules = json.loads((REPO / "policies/default.json").read_text())["seccomp"]["rules"]
    return {n for r in rules if r["action"] == "allow" for n in r["syscalls"]}


def traced():
    lines = (HERE / "traced.txt").read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def build():
    extras = json.loads((HERE / "extras.json").read_text())
    from_policy, seen = policy_allowed(), traced()
    extra_allow = {n for e in extras["allow"] for n in e["syscalls"]}
    allow = from_policy | seen | extra_allow
    eperm = set(extras["eperm"]["syscalls"])
    clash = eperm & allow
    if clash:
        sys.exit(f"make-profile: {sorted(clash)} are both needed (policy, trace or extras) and listed under eperm")
    groups = [
        (sorted(from_policy), "what policies/default.json lets the script make (its own filter narrows the arguments)"),
        (sorted(seen - from_policy), "traced outside the jails' filter (deploy/k8s/seccomp/traced.txt, trace.sh)"),
    ]
    for e in extras["allow"]:
        names = sorted(set(e["syscalls"]) - from_policy - seen)
        if names:
            groups.append((names, e["why"]))
    syscalls = [{"names": names, "action": "SCMP_ACT_ALLOW", "comment": why} for names, why in groups]
    syscalls.append({"names": sorted(eperm), "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM,
                     "comment": extras["eperm"]["why"]})
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": ENOSYS,
        "architectures": ["SCMP_ARCH_X86_64"],
        "syscalls": syscalls,
    }


def allowed(profile, caps=()):
    """Names a profile allows for a process holding `caps` (docker/OCI format:
    includes/excludes on capabilities; argument conditions count as allowed)."""
    out = set()
    for s in profile.get("syscalls", []):
        if s.get("action") != "SCMP_ACT_ALLOW":
            continue
        inc, exc = s.get("includes", {}), s.get("excludes", {})
        if inc.get("caps") and not set(inc["caps"]) & set(caps):
            continue
        if exc.get("caps") and set(exc["caps"]) & set(caps):
            continue
        if inc.get("arches") and "amd64" not in inc["arches"] and "x86_64" not in inc["arches"]:
            continue
        names = s.get("names") or ([s["name"]] if s.get("name") else [])
        out.update(names)
    return out


def text(profile):
    return json.dumps(profile, indent=2) + "\n"


def main(argv):
    profile = build()
    if argv[:1] == ["--check"]:
        if PROFILE.read_text() != text(profile):
            sys.exit(f"make-profile: {PROFILE} is not what its inputs give: run deploy/k8s/seccomp/make-profile.py")
        print(f"make-profile: {PROFILE.name} matches its inputs ({len(allowed(profile))} syscalls allowed)")
    elif argv[:1] == ["--compare"] and len(argv) == 2:
        default = json.loads(pathlib.Path(argv[1]).read_text())
        ours, theirs = allowed(profile), allowed(default, caps=("CAP_SETUID", "CAP_SETGID"))
        # Only x86_64's calls count (the runtime default names every
        # architecture's); linux-libc-dev's table lists them.
        table = pathlib.Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
        if table.exists():
            native = {line.split()[1][len("__NR_"):] for line in table.read_text().splitlines()
                      if line.startswith("#define __NR_")}
            ours, theirs = ours & native, theirs & native
        print(f"runtime default ({argv[1]}, with the pod's capabilities SETUID, SETGID): "
              f"{len(theirs)} allowed; this profile: {len(ours)}")
        print("  allowed here beyond the runtime default:", " ".join(sorted(ours - theirs)) or "none")
        print("  refused here though the runtime default allows:", " ".join(sorted(theirs - ours)) or "none")
    elif not argv:
        PROFILE.write_text(text(profile))
        print(f"make-profile: wrote {PROFILE} ({len(allowed(profile))} syscalls allowed)")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
