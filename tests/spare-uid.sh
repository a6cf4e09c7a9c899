#!/usr/bin/env bash
# Print a uid nobody uses, for running tests as an ordinary user without
# creating an account: tests/spare-uid.sh
#
# Spare means: no passwd entry, no group of that number, inside nobody's
# subordinate range (/etc/subuid), running no process, owning nothing in
# the shared temporary folders. The search runs down from 59999, the far
# end of Debian's range for ordinary accounts (useradd counts up from
# 1000), below systemd's dynamic users (61184-65519) and nobody (65534), far
# below the uids root's jail runs take (identity.root_host_uids, 1879048192 up).
set -euo pipefail

in_subuid() { # UID: inside a subordinate uid range of some account?
    [ -r /etc/subuid ] || return 1
    awk -F: -v u="$1" '$2 <= u && u < $2 + $3 { found = 1 } END { exit !found }' /etc/subuid
}

runs_processes() { # UID: any process with it as real, effective or saved uid?
    awk -v u="$1" '$1 == "Uid:" && ($2 == u || $3 == u || $4 == u) { found = 1; exit } END { exit !found }' \
        /proc/[0-9]*/status 2>/dev/null
}

owns_files() { # UID
    [ -n "$(find /tmp /var/tmp /dev/shm -xdev -uid "$1" -print -quit 2>/dev/null)" ]
}

for uid in $(seq 59999 -1 59000); do
    getent passwd "$uid" >/dev/null && continue
    getent group "$uid" >/dev/null && continue
    in_subuid "$uid" && continue
    runs_processes "$uid" && continue
    owns_files "$uid" && continue
    echo "$uid"
    exit 0
done
echo "spare-uid: no unused uid in 59000-59999" >&2
exit 1
