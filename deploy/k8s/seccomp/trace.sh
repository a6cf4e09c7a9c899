#!/usr/bin/env bash
# Trace the syscalls `jail serve` and the jails it starts make outside the
# jails' own filter, into deploy/k8s/seccomp/traced.txt (a maintainer's
# tool, like policies/trace/trace.sh; needs root, strace, podman and the
# image from `make image`). make-profile.py builds seccomp-jail.json from
# that list, the jail policy's own syscalls and extras.json.
#
# Traced, each under `strace -f -c` (names only):
#   1. the image as the Deployment runs it (pod-namespace root in a user
#      namespace, two capabilities, no cgroup: rlimits and the
#      supervisor's CPU throttle): strace attached to jail-serve, then
#      one data run (pandas, a figure), a streamed run, a session of two
#      cells, a run killed at its time limit, a CPU hog throttled, SIGTERM;
#   2. `jail run` with an allowlist policy whose script reaches the proxy
#      (a name mapped to a loopback server, and one looked up in DNS);
# Path 2 runs on the host as root (the same binary and code path but for
# where the run cgroup comes from). `jail pool` is not traced: under
# `strace -f` its jails were not made (and a pool whose stdin ends while a
# request waits never answers it); its jails are sessions, which path 1
# traces, and deploy/check.sh runs the pool under this profile once
# `jail serve --pool-size` exists.
set -euo pipefail
cd "$(dirname "$0")/../../.."
[ "$(id -u)" = 0 ] || { echo "trace: run as root" >&2; exit 1; }
command -v strace >/dev/null || apt-get install -y -qq strace >/dev/null
image=${JAIL_IMAGE:-localhost/jail-serve:dev}
out=deploy/k8s/seccomp/traced.txt
work=$(mktemp -d /tmp/jail-trace.XXXXXX)
name=jail-trace-$$
cleanup() {
    podman rm -f "$name" >/dev/null 2>&1 || podman rm -f "$name" >/dev/null 2>&1 || true
    [ -n "${http_pid:-}" ] && kill "$http_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
chmod 755 "$work"
mkdir -m 755 "$work/tokens"
token=trace-token-0123456789abcdef
printf '{"tenants":[{"name":"trace","token":"%s","max_runs":4,"max_sessions":2}]}\n' "$token" > "$work/tokens/tokens.json"
chmod 644 "$work/tokens/tokens.json"

# 1. The image, as deploy/check.sh runs it (see there for each setting).
# shellcheck source=deploy/podman-settings.sh
. deploy/podman-settings.sh
podman run -d --name "$name" "${JAIL_PODMAN_RUN[@]}" --security-opt seccomp=unconfined \
    -v "$work/tokens:/etc/jail/tokens:ro" -p 127.0.0.1::8080 "$image" "${JAIL_SERVE_ARGS[@]}" >/dev/null
pid=$(podman inspect "$name" --format '{{.State.Pid}}')
port=$(podman port "$name" 8080 | sed 's/.*://')
strace -f -c -S name -o "$work/serve.txt" -p "$pid" &
strace_pid=$!
for _ in $(seq 50); do curl -sf "localhost:$port/readyz" >/dev/null && break; sleep 0.2; done
auth="Authorization: Bearer $token"
post() { curl -sf -H "$auth" -H 'Content-Type: application/json' -d "$2" "localhost:$port$1"; }
post /v1/runs '{"code":"import pandas as pd, matplotlib.pyplot as plt\ndf = pd.DataFrame({\"a\": range(100)})\nplt.plot(df.a); plt.savefig(\"/workspace/output/f.png\")\nopen(\"/workspace/output/t.csv\",\"w\").write(df.to_csv())\nprint(df.a.sum())"}' >/dev/null
id=$(post /v1/runs '{"code":"import time\nfor i in range(3): print(i, flush=True); time.sleep(0.2)","wait":false}' | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
curl -sf -N -H "$auth" "localhost:$port/v1/runs/$id/events" >/dev/null
post /v1/runs '{"code":"while True: pass","limits":{"timeout_secs":2}}' >/dev/null
post /v1/runs '{"code":"import os\nfor _ in range(2):\n  if os.fork() == 0:\n    while True: pass\nimport time; time.sleep(2)","limits":{"timeout_secs":3}}' >/dev/null
sid=$(post /v1/sessions '{}' | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
post "/v1/sessions/$sid/exec" '{"code":"x = 41"}' >/dev/null
post "/v1/sessions/$sid/exec" '{"code":"print(x + 1)"}' >/dev/null
curl -sf -X DELETE -H "$auth" "localhost:$port/v1/sessions/$sid" >/dev/null
curl -sf "localhost:$port/metrics" >/dev/null
podman stop -t 20 "$name" >/dev/null
wait "$strace_pid" || true

# 2. The allowlist proxy.
/usr/bin/python3 -m http.server --bind 127.0.0.1 0 --directory "$work" > "$work/http.log" 2>&1 &
http_pid=$!
for _ in $(seq 50); do hport=$(sed -n 's/.*port \([0-9]*\).*/\1/p' "$work/http.log" | head -1); [ -n "$hport" ] && break; sleep 0.1; done
cat > "$work/allow.json" <<JSON
{"version": 1, "name": "trace-allowlist",
 "network": {"mode": "allowlist", "hosts": ["api.test", "deb.debian.org"], "ports": [80, 443, $hport]}}
JSON
cat > "$work/net.py" <<PY
import urllib.request, http.client
print(urllib.request.urlopen("http://api.test:$hport/", timeout=10).status)
try:
    c = http.client.HTTPSConnection("deb.debian.org", 443, timeout=10); c.request("HEAD", "/"); print(c.getresponse().status)
except OSError as e:
    print("https:", e)
PY
chmod 644 "$work/allow.json" "$work/net.py"
JAIL_TEST_RESOLVE="api.test=127.0.0.1" strace -f -c -S name -o "$work/allow.txt" \
    target/release/jail run --json --policy "$work/allow.json" --rootfs python-rootfs/out/data "$work/net.py" > "$work/allow.out"

{
    echo "# Syscalls traced outside the jails' own filter by deploy/k8s/seccomp/trace.sh"
    echo "# (jail serve in the image, the allowlist proxy): one a line, sorted."
    for f in serve allow; do
        awk 'NR > 2 && $NF ~ /^[a-z_0-9]+$/ && $NF != "total" { print $NF }' "$work/$f.txt"
    done | sort -u
} > "$out"
echo "trace: $(grep -vc '^#' "$out") syscalls in $out"
