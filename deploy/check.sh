#!/usr/bin/env bash
# make deploy-check: prove deploy/ as far as one machine can.
#
#  1. every manifest in deploy/k8s validates against
#     the Kubernetes schemas (PyPI's kubernetes-validate, strict, in a cached
#     venv: /var/cache/jail-deploy/venv as root, else ~/.cache/jail-deploy/venv);
#  2. deploy/k8s/seccomp-jail.json is what make-profile.py builds from its
#     inputs, and what it allows beyond this host's runtime default is printed;
#  3. the AppArmor profile parses (apparmor_parser -Q);
#  4. the image builds (deploy/image.sh, podman or buildah from Debian);
#  5. `podman kube play` of the Deployment: what podman honours of the pod
#     spec is read back from the container's OCI config and printed; the
#     service is tested in it when it honours what a jail needs;
#  6. otherwise `podman run` with the equivalent settings
#     (deploy/podman-settings.sh) and the Localhost seccomp profile: health
#     and readiness, a data run (pandas, a figure) with its isolation
#     checked, the pod's secrets out of the jail's reach, a session, the
#     metrics, and a SIGTERM drain with a run in flight, all through the
#     Deployment's warm pool (--pool-size 4, the data stack preloaded).
# Steps 4-6 need root (rootful podman; CI runs as root): as another user
# they are listed as skipped, covered elsewhere.
# A step that cannot run for want of something on this host prints SKIP and
# its reason (tests/skips.sh's kind `host`, appended to JAIL_SKIP_LOG when
# set); JAIL_MUST_WORK=1 (CI) turns it into a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

image=${JAIL_IMAGE:-localhost/jail-serve:dev}
token=deploy-check-token-0123456789abcdef
work=$(mktemp -d /tmp/jail-deploy-check.XXXXXX)
chmod 755 "$work"
containers=()
failures=0

cleanup() {
    local c
    for c in "${containers[@]}"; do
        # podman here sometimes finds the container's shm still busy on the
        # first removal: a second one succeeds.
        podman rm -f "$c" >/dev/null 2>&1 || podman rm -f "$c" >/dev/null 2>&1 || true
    done
    podman pod rm -f jail-serve-pod-0 >/dev/null 2>&1 || podman pod rm -f jail-serve-pod-0 >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

step() { printf '\n== deploy-check: %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }
ok() { echo "  ok   $*"; }
fail() { echo "  FAIL $*"; failures=$((failures + 1)); }
skip_host() {
    echo "  SKIP (this host lacks it): $1"
    if [ -n "${JAIL_SKIP_LOG:-}" ]; then
        printf 'host\t%s\t%s\t%s\n' "$(id -un)" "deploy-check" "$1" >> "$JAIL_SKIP_LOG"
    fi
    if [ "${JAIL_MUST_WORK:-}" = 1 ]; then
        echo "deploy-check: JAIL_MUST_WORK=1 but this host cannot: $1" >&2
        exit 1
    fi
}
skip_elsewhere() {
    echo "  SKIP (covered elsewhere): $1"
    if [ -n "${JAIL_SKIP_LOG:-}" ]; then
        printf 'elsewhere\t%s\t%s\t%s\n' "$(id -un)" "deploy-check" "$1" >> "$JAIL_SKIP_LOG"
    fi
}
as_root() { [ "$(id -u)" = 0 ]; }

# ---- 1. the manifests
step "manifests against the Kubernetes schemas (kubernetes-validate, strict)"
venv_packages="kubernetes-validate==1.37.0"
if as_root; then venv=/var/cache/jail-deploy/venv; else venv="${XDG_CACHE_HOME:-$HOME/.cache}/jail-deploy/venv"; fi
if [ "$(cat "$venv/.stamp" 2>/dev/null)" != "$venv_packages" ] || ! "$venv/bin/python" -c 'import kubernetes_validate, yaml' 2>/dev/null; then
    if ! /usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null; then
        as_root && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    fi
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    /usr/bin/python3 -m venv "$venv"
    # shellcheck disable=SC2086 # the package list is meant to split
    "$venv/bin/pip" install --quiet --disable-pip-version-check $venv_packages
    echo "$venv_packages" > "$venv/.stamp"
fi
# Every file kustomization.yaml lists exists.
"$venv/bin/python" - <<'PY'
import os, yaml
listed = yaml.safe_load(open("deploy/k8s/kustomization.yaml"))["resources"]
missing = [f for f in listed if not os.path.exists("deploy/k8s/" + f)]
assert not missing, f"kustomization.yaml lists missing files {missing}"
PY
manifests=()
for f in deploy/k8s/*.yaml; do
    [ "$(basename "$f")" = kustomization.yaml ] || manifests+=("$f")
done
for k in 1.33.0 1.37.0; do
    if out=$("$venv/bin/kubernetes-validate" --strict -k "$k" "${manifests[@]}" 2>&1); then
        ok "Kubernetes $k: ${#manifests[@]} manifests"
    else
        fail "Kubernetes $k:"; echo "$out" | sed 's/^/       /'
    fi
done

# ---- 2. the seccomp profile
step "seccomp profile (deploy/k8s/seccomp-jail.json)"
if /usr/bin/python3 deploy/k8s/seccomp/make-profile.py --check; then ok "matches traced.txt, extras.json and policies/default.json"; else fail "seccomp-jail.json is stale"; fi
if [ -f /usr/share/containers/seccomp.json ]; then
    /usr/bin/python3 deploy/k8s/seccomp/make-profile.py --compare /usr/share/containers/seccomp.json | sed 's/^/  /'
fi

# ---- 3. the AppArmor profile
step "AppArmor profile (deploy/k8s/apparmor-jail-serve)"
if ! command -v apparmor_parser >/dev/null && as_root; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq apparmor >/dev/null 2>&1 || true
fi
if command -v apparmor_parser >/dev/null; then
    ver=$(apparmor_parser --version | sed -n '1s/.*version \([0-9]*\).*/\1/p')
    profile=deploy/k8s/apparmor-jail-serve
    if [ "${ver:-0}" -lt 4 ]; then
        # An AppArmor 3 parser knows no `userns,` rule (the profile says so).
        grep -v '^  userns,$' "$profile" > "$work/apparmor"
        profile=$work/apparmor
        echo "  (AppArmor $ver parser: checked without the AppArmor 4 \`userns,\` rule)"
    fi
    if apparmor_parser -Q -K "$profile" 2>"$work/aa.err"; then ok "parses"; else fail "apparmor_parser: $(grep -v 'Cache read' "$work/aa.err")"; fi
else
    skip_host "no apparmor_parser (Debian's apparmor package) to check the AppArmor profile with"
fi

# ---- 4. the image
step "image (deploy/image.sh: $image)"
if ! as_root; then
    # Rootful podman: the pod's user namespace maps 65536 ids, which an
    # ordinary user's podman could only take from its own subuid range.
    skip_elsewhere "the image and podman steps run as root (CI runs them so)"
    echo; if [ "$failures" = 0 ]; then echo "deploy-check: all passed"; else echo "deploy-check: $failures failure(s)"; exit 1; fi
    exit 0
fi
JAIL_IMAGE=$image deploy/image.sh >/dev/null
# runc: crun 1.8 (Debian 12's) refuses hybrid cgroups (podman-settings.sh).
if ! command -v runc >/dev/null && as_root; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runc >/dev/null
fi
ok "built $image ($(podman image inspect --format '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}'))"
# shellcheck source=deploy/podman-settings.sh
. deploy/podman-settings.sh
probe=(--runtime runc --ulimit "nofile=$jail_nofile:$jail_nofile" --ulimit "nproc=$jail_nproc:$jail_nproc")
if ! podman run --rm "${probe[@]}" --entrypoint /usr/local/bin/jail "$image" --version >/dev/null 2>&1; then
    skip_host "podman cannot run a container here ($(podman run --rm "${probe[@]}" --entrypoint /usr/local/bin/jail "$image" --version 2>&1 | tail -1))"
    echo; echo "deploy-check: $failures failure(s)"; [ "$failures" = 0 ]; exit
fi

mkdir -m 755 "$work/tokens"
printf '{"tenants":[{"name":"check","token":"%s","max_runs":4,"max_sessions":2}]}\n' "$token" > "$work/tokens/tokens.json"
chmod 644 "$work/tokens/tokens.json"

# What of the pod spec podman honoured for container $1, read back from
# its OCI config and /proc, into $work/honoured.txt.
honoured() {
    local c=$1
    id=$(podman inspect "$c" --format '{{.Id}}')
    pid=$(podman inspect "$c" --format '{{.State.Pid}}')
    cfg=$(podman info --format '{{.Store.GraphRoot}}')/overlay-containers/$id/userdata/config.json
    "$venv/bin/python" - "$cfg" "/proc/$pid" deploy/k8s/seccomp-jail.json > "$work/honoured.txt" <<'PY' || true
import json, sys
cfg, proc, ours = json.load(open(sys.argv[1])), sys.argv[2], json.load(open(sys.argv[3]))
linux = cfg["linux"]
try:
    status = dict(l.split(":\t", 1) for l in open(proc + "/status").read().splitlines() if ":\t" in l)
    ids = [l.split() for l in open(proc + "/uid_map")]
except OSError as e:
    # Its server ended before it could be looked at (its log says why).
    print(f"NOT honoured  the container running: it had ended when inspected ({e.strerror})")
    sys.exit(0)
sc = linux.get("seccomp") or {}
names = {n for s in sc.get("syscalls", []) if s.get("action") == "SCMP_ACT_ALLOW" for n in s.get("names", [])}
want = {n for s in ours["syscalls"] if s["action"] == "SCMP_ACT_ALLOW" for n in s["names"]}
rows = [
    ("hostUsers: false", sum(int(i[2]) for i in ids) >= 65536 and ids[0][1] != "0",
     f"uid_map {' / '.join(' '.join(i) for i in ids)} (the pod policy needs 65536 ids)"),
    ("runAsUser: 0", cfg["process"]["user"]["uid"] == 0, f"uid {cfg['process']['user']['uid']}"),
    ("capabilities drop ALL, add SETUID SETGID", status.get("CapEff", "").strip().endswith("00000000c0"), f"CapEff {status.get('CapEff','').strip()}"),
    ("allowPrivilegeEscalation: false", cfg["process"].get("noNewPrivileges") is True, "no_new_privs"),
    ("readOnlyRootFilesystem: true", cfg["root"].get("readonly") is True, "read-only root"),
    ("procMount: Unmasked", not [p for p in (linux.get("maskedPaths") or []) + (linux.get("readonlyPaths") or []) if p.startswith("/proc")],
     "masked or read-only under /proc: " + " ".join(p for p in (linux.get("maskedPaths") or []) + (linux.get("readonlyPaths") or []) if p.startswith("/proc"))),
    ("seccompProfile Localhost jail/seccomp-jail.json", names == want and sc.get("defaultErrnoRet") == 38,
     f"{len(names)} syscalls allowed, default errno {sc.get('defaultErrnoRet')} (ours: {len(want)}, 38)"),
    ("resources.limits memory", (linux.get("resources", {}).get("memory", {}) or {}).get("limit") == 4 << 30,
     f"memory limit {(linux.get('resources', {}).get('memory', {}) or {}).get('limit')}"),
]
for what, honoured, detail in rows:
    print(("honoured    " if honoured else "NOT honoured") + f"  {what}: {detail}")
PY
}

# ---- 5. podman kube play of the Deployment
step "podman kube play of deploy/k8s/deployment.yaml"
# userns=auto (hostUsers: false) takes ids from the `containers` entry of
# /etc/subuid and /etc/subgid; a range above the jail's own root range.
if as_root; then
    for f in /etc/subuid /etc/subgid; do
        grep -q '^containers:' "$f" 2>/dev/null || { echo "containers:1879113728:65536" >> "$f"; echo "  (added containers:1879113728:65536 to $f for userns=auto)"; }
    done
fi
mkdir -p "$work/seccomp/jail"
cp deploy/k8s/seccomp-jail.json "$work/seccomp/jail/"
cat > "$work/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$jail_nofile:$jail_nofile", "nproc=$jail_nproc:$jail_nproc"]
[engine]
runtime = "runc"
EOF
# podman 4.3 panics on a secret volume (kube.VolumeFromSecret): the tokens
# come from a hostPath instead; one replica; the image built above.
"$venv/bin/python" - "$work" "$image" <<'PY'
import sys, yaml
work, image = sys.argv[1:3]
d = yaml.safe_load(open("deploy/k8s/deployment.yaml"))
d["spec"]["replicas"] = 1
pod = d["spec"]["template"]["spec"]
pod["containers"][0]["image"] = image
for v in pod["volumes"]:
    if v["name"] == "tokens":
        v.pop("secret")
        v["hostPath"] = {"path": work + "/tokens", "type": "Directory"}
yaml.safe_dump(d, open(work + "/kube.yaml", "w"))
PY
kube_ok=0
if CONTAINERS_CONF=$work/containers.conf podman kube play --replace --seccomp-profile-root "$work/seccomp" "$work/kube.yaml" > "$work/kube.log" 2>&1; then
    c=jail-serve-pod-0-jail-serve
    containers+=("$c")
    honoured "$c"
    sed 's/^/  /' "$work/honoured.txt"
    if grep -q "NOT honoured  the container running" "$work/honoured.txt"; then
        podman logs "$c" 2>&1 | tail -3 | sed 's/^/    /'
    fi
    if grep -q "NOT honoured  procMount\|NOT honoured  hostUsers\|NOT honoured  the container running" "$work/honoured.txt"; then
        echo "  podman kube play cannot run a jail here as the pod spec says (above); the service is tested with podman run instead"
    else
        kube_ok=1
    fi
    echo "  not honoured either: appArmorProfile (AppArmor is off on this kernel), the probes (podman runs them from systemd timers; there is no systemd here)"
else
    echo "  podman kube play failed:"; sed 's/^/    /' "$work/kube.log" | tail -5
fi
[ "$kube_ok" = 1 ] || { podman pod rm -f jail-serve-pod-0 >/dev/null 2>&1 || podman pod rm -f jail-serve-pod-0 >/dev/null 2>&1 || true; }

# ---- 6. the service in the image
api() { # METHOD PATH [BODY] -> body on stdout, status in $work/code
    local m=$1 p=$2 args=()
    [ -z "${3:-}" ] || args=(-H 'Content-Type: application/json' -d "$3")
    curl -s -o "$work/body" -w '%{http_code}' -X "$m" -H "Authorization: Bearer $token" \
        "${args[@]}" "$base$p" > "$work/code" || echo 000 > "$work/code"
    cat "$work/body"
}
serve_checks() { # NAME: the checks against $base
    local name=$1 id sid
    for _ in $(seq 100); do curl -sf "$base/readyz" >/dev/null 2>&1 && break; sleep 0.2; done
    if curl -sf "$base/healthz" >/dev/null && curl -sf "$base/readyz" >/dev/null; then ok "/healthz and /readyz answer 200"; else fail "/healthz or /readyz"; podman logs "$name" 2>&1 | tail -5; return; fi
    api POST /v1/runs '{"code":"import os, pandas as pd, matplotlib.pyplot as plt\ndf = pd.DataFrame({\"a\": range(100)})\nplt.plot(df.a); plt.savefig(\"/workspace/output/f.png\")\nprint(df.a.sum())\nfor p in (\"/etc/jail/tokens/tokens.json\", \"/etc/jail/pod.json\", \"/usr/local/bin/jail-serve\", \"/run/jail\"):\n    print(p, os.path.exists(p))\nimport socket\ntry:\n    socket.create_connection((\"10.0.0.1\", 80), timeout=1); print(\"net open\")\nexcept OSError as e:\n    print(\"net\", type(e).__name__)"}' > "$work/run.json"
    "$venv/bin/python" - "$work/run.json" "$(cat "$work/code")" <<'PY' || failures=$((failures + 1))
import json, sys
d, code = json.load(open(sys.argv[1])), sys.argv[2]
r = d.get("result") or {}
iso = r.get("isolation") or {}
out = (r.get("stdout") or {}).get("text", "")
checks = [
    ("HTTP 200 and status ok", code == "200" and r.get("status") == "ok", f"HTTP {code}, status {r.get('status')}, setup_error {r.get('setup_error')}"),
    ("run in a jail of the warm pool", d.get("backend") == "pool", f"backend {d.get('backend')}"),
    ("the script's output", out.startswith("4950\n"), out.splitlines()[:1]),
    ("the pod's files are out of the jail's reach", all(l.endswith(" False") for l in out.splitlines()[1:5]), out.splitlines()[1:5]),
    ("no network", "net open" not in out, out.splitlines()[5:6]),
    ("the figure is an accepted artifact", any(a.get("path") == "f.png" for a in r.get("artifacts", [])), [a.get("path") for a in r.get("artifacts", [])]),
    ("seven namespaces", sorted(iso.get("namespaces", [])) == sorted(["user", "mount", "pid", "net", "ipc", "uts", "cgroup"]), iso.get("namespaces")),
    ("no capabilities, no_new_privs", iso.get("capabilities") == [] and iso.get("no_new_privs") is True, (iso.get("capabilities"), iso.get("no_new_privs"))),
    ("seccomp enforced", (iso.get("seccomp") or {}).get("status") == "enforced", (iso.get("seccomp") or {}).get("status")),
    ("landlock enforced", (iso.get("landlock") or {}).get("status") == "enforced", iso.get("landlock")),
    ("a run uid of the pod policy's range", 32768 <= (iso.get("host_uid") or 0) <= 65533, iso.get("host_uid")),
]
bad = 0
for what, good, detail in checks:
    print(("  ok   " if good else "  FAIL ") + what + ("" if good else f": {detail}"))
    bad += not good
limits = r.get("limits") or {}
print("  limits enforced by: " + ", ".join(f"{k} {v.get('enforced_by')}" for k, v in sorted(limits.items())))
for d in iso.get("degraded", []):
    print("  degraded (reported by the run): " + d[:300])
sys.exit(1 if bad else 0)
PY
    id=$("$venv/bin/python" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("id",""))' "$work/run.json" 2>/dev/null || true)
    if curl -sf -H "Authorization: Bearer $token" "$base/v1/runs/$id/artifacts/f.png" -o "$work/f.png" \
        && [ "$(head -c 4 "$work/f.png" | od -An -tx1 | tr -d ' ')" = 89504e47 ]; then
        ok "the figure is served from GET /v1/runs/{id}/artifacts/f.png"
    else fail "GET /v1/runs/$id/artifacts/f.png"; fi
    sid=$(api POST /v1/sessions '{}' | "$venv/bin/python" -c 'import json,sys; print(json.load(sys.stdin).get("id",""))' 2>/dev/null || true)
    api POST "/v1/sessions/$sid/exec" '{"code":"x = 41"}' >/dev/null
    cell=$(api POST "/v1/sessions/$sid/exec" '{"code":"print(x + 1)"}' || true)
    if grep -q '"text":"42\\n"' <<<"$cell" \
        && [ "$(api DELETE "/v1/sessions/$sid" >/dev/null; cat "$work/code")" = 200 ]; then
        ok "a session keeps state across cells and is deleted"
    else fail "session: $(cat "$work/body" | head -c 300)"; fi
    # Read whole first: `curl | grep -q` under pipefail fails when grep
    # exits at its match before curl has written the rest.
    metrics=$(curl -sf "$base/metrics" || true)
    if grep -q '^jail_runs_total{status="ok"}' <<<"$metrics"; then ok "/metrics counts the runs (jail_runs_in_flight is the HPA's metric)"; else fail "/metrics: $(head -c 300 <<<"$metrics")"; fi
}

drain_check() { # NAME: SIGTERM with a run in flight
    local name=$1 t0 rc refused
    # The run's client waits for its result on its own connection, as a
    # client of a draining worker does (a wait:false run's result cannot be
    # fetched once the server has exited).
    curl -s -o "$work/inflight.json" -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
        -d '{"code":"import time; time.sleep(3); print(\"finished\")"}' "$base/v1/runs" &
    local client=$!
    sleep 1
    t0=$(date +%s)
    podman kill --signal TERM "$name" >/dev/null
    sleep 0.3
    api POST /v1/runs '{"code":"print(1)"}' >/dev/null
    refused=$(cat "$work/code")
    wait "$client" || true
    local state
    state=$("$venv/bin/python" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get("state"), (d.get("result") or {}).get("status"), (d.get("result") or {}).get("stdout",{}).get("text","").strip())' "$work/inflight.json" 2>/dev/null || echo "no answer")
    rc=$(podman wait "$name" 2>/dev/null || echo "?")
    if [ "$state" = "done ok finished" ] && [ "$refused" = 503 ] && [ "$rc" = 0 ]; then
        ok "SIGTERM drained: the run in flight finished ok, a new one got 503, exit 0 after $(( $(date +%s) - t0 )) s (grace: 75 s)"
    else
        fail "drain: in-flight run '$state', new run HTTP $refused, exit $rc"; podman logs "$name" 2>&1 | tail -5
    fi
}

if [ "$kube_ok" = 1 ]; then
    step "the service in the kube play pod"
    base="http://$(podman inspect jail-serve-pod-0-infra --format '{{.NetworkSettings.IPAddress}}' 2>/dev/null || true):8080"
    serve_checks jail-serve-pod-0-jail-serve
    drain_check jail-serve-pod-0-jail-serve
else
    step "the service with podman run and the pod's settings (deploy/podman-settings.sh)"
    name=jail-deploy-check-$$
    containers+=("$name")
    podman run -d --name "$name" "${JAIL_PODMAN_RUN[@]}" --security-opt seccomp=deploy/k8s/seccomp-jail.json \
        -v "$work/tokens:/etc/jail/tokens:ro" -p 127.0.0.1::8080 "$image" "${JAIL_SERVE_ARGS[@]}" >/dev/null
    base="http://127.0.0.1:$(podman port "$name" 8080 | sed 's/.*://')"
    honoured "$name"
    if grep -q "NOT honoured" "$work/honoured.txt"; then
        fail "podman run did not apply the pod's settings:"; grep "NOT honoured" "$work/honoured.txt" | sed 's/^/       /'
    else
        ok "the container has the pod's settings (user namespace of 65536 ids, root, two capabilities, no_new_privs, read-only root, /proc unmasked, the Localhost seccomp profile, the memory limit)"
    fi
    serve_checks "$name"
    drain_check "$name"
fi


echo
if [ "$failures" = 0 ]; then echo "deploy-check: all passed"; else echo "deploy-check: $failures failure(s)"; exit 1; fi
