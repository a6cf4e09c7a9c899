#!/bin/bash
# Runs inside the guest (started by jail-vm.service from the 9p share): check
# that this really is the host the matrix entry promises, unpack the payload,
# then run the chosen test binaries as root and, in a systemd-delegated
# cgroup, as the ordinary user jailtest. Writes the exit status to
# /mnt/share/status; the host reads it after the guest has powered off.
#
#   guest.sh          the root part (the service's ExecStart)
#   guest.sh user     the user part (run by the root part through systemd-run)
#
# /mnt/share/entry.env gives ENTRY (the matrix entry), EXPECT_RELEASE (the
# exact `uname -r` of the kernel the host booted) and EXPECT_PREFIX (the
# kernel series, e.g. "6.1."). /mnt/share/tests lists this entry's tests: one
# test binary a line, with the libtest arguments (name filters) to pass it.
set -u
share=/mnt/share
opt=/opt/jail
user=jailtest

say() { echo "jail-vm: $*"; }
uptime_s() { cut -d' ' -f1 /proc/uptime; }
failures=()
fail() { say "FAIL: $*"; failures+=("$*"); }

# Controllers a pure-v2 host must offer for the jail's limits.
want_controllers="memory cpu pids"
has_controllers() { # FILE: does it list every controller in $want_controllers?
    local c
    for c in $want_controllers; do
        grep -qw "$c" "$1" 2>/dev/null || return 1
    done
}

# Run every line of the test list (default: this entry's), each binary with
# the same environment as root and as the user (stdin is the list: keep it
# from the tests).
run_tests() { # LABEL [LIST]
    local label=$1 list=${2:-$share/tests} name args count status=0 t0 t1
    while read -r name args; do
        [ -n "$name" ] || continue
        t0=$(uptime_s)
        # A filter that selects nothing would pass without testing anything.
        # shellcheck disable=SC2086
        count=$("$opt/bin/$name" --list $args </dev/null 2>/dev/null | grep -c ': test$')
        if [ "$count" -eq 0 ]; then
            status=1
            fail "$label: $name $args selects no test"
            continue
        fi
        say "== $label: $name${args:+ $args} ($count tests)"
        # shellcheck disable=SC2086 # args are libtest arguments, split on purpose
        (cd /tmp && env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="${HOME:-/tmp}" \
            JAIL_BIN=$opt/bin/jail JAIL_ROOTFS=$opt/rootfs JAIL_REPO=$opt/repo \
            JAIL_MUST_WORK=1 RUST_BACKTRACE=1 JAIL_CGROUP_PARENT="${JAIL_CGROUP_PARENT:-}" \
            JAIL_EXPECT_SYSTEMD_SCOPE="${JAIL_EXPECT_SYSTEMD_SCOPE:-}" \
            ${XDG_RUNTIME_DIR:+XDG_RUNTIME_DIR=$XDG_RUNTIME_DIR} \
            ${DBUS_SESSION_BUS_ADDRESS:+DBUS_SESSION_BUS_ADDRESS=$DBUS_SESSION_BUS_ADDRESS} \
            "$opt/bin/$name" --test-threads=2 $args </dev/null) || { status=1; fail "$label: $name${args:+ $args}"; }
        t1=$(uptime_s)
        say "$label: $name took $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}') s (guest clock)"
    done <"$list"
    return $status
}

# Give the jail a cgroup v2 parent it can create run cgroups under: systemd
# delegates a cgroup that holds our own processes, and v2's no-internal-
# processes rule forbids enabling controllers for the children of a cgroup
# with processes. So, as a delegate should, move ourselves into a leaf
# ("supervisor"), enable memory, cpu and pids below the delegated cgroup, and
# hand the jail its own "runs" subtree through JAIL_CGROUP_PARENT.
delegate_parent() { # LABEL
    local cg dir
    cg=$(sed -n 's/^0:://p' /proc/self/cgroup)
    dir=/sys/fs/cgroup$cg
    mkdir -p "$dir/supervisor" "$dir/runs" || { say "FAIL: $1: cannot create cgroups in $dir"; return 1; }
    # Every process of this unit moves, not only this shell.
    local p
    for p in $(cat "$dir/cgroup.procs"); do
        echo "$p" >"$dir/supervisor/cgroup.procs" 2>/dev/null || true
    done
    if ! echo "+memory +cpu +pids" >"$dir/cgroup.subtree_control"; then
        say "FAIL: $1: cannot enable controllers in $dir (still in it: $(tr '\n' ' ' <"$dir/cgroup.procs"))"
        return 1
    fi
    export JAIL_CGROUP_PARENT=$cg/runs
    say "$1: jail run cgroups go under $JAIL_CGROUP_PARENT ([$(cat "$dir/runs/cgroup.controllers")])"
}

doctor() { # LABEL
    say "== jail doctor ($1)"
    JAIL_ROOTFS=$opt/rootfs "$opt/bin/jail" doctor
    say "jail doctor ($1) exited $?"
}

if [ "${1:-}" = scope ]; then
    # The user-manager part: jailtest with no cgroup of its own (we are in
    # root's cgroup) but a lingering user manager. The jail must ask systemd
    # for a delegated scope itself (jail/src/delegate.rs).
    me=$(id -un)
    cg=$(sed -n 's/^0:://p' /proc/self/cgroup)
    owner=$(stat -c %U "/sys/fs/cgroup$cg")
    say "user-manager part as $me (uid $(id -u)) in cgroup $cg, owned by $owner"
    [ "$owner" != "$me" ] || { say "FAIL: cgroup $cg belongs to $me: this part must run without a writable cgroup"; exit 1; }
    # The root part's parent is not ours, and an explicit parent turns
    # delegation off: this part has none.
    unset JAIL_CGROUP_PARENT
    export JAIL_EXPECT_SYSTEMD_SCOPE=1 XDG_RUNTIME_DIR=/run/user/$(id -u)
    export DBUS_SESSION_BUS_ADDRESS=unix:path=$XDG_RUNTIME_DIR/bus
    doctor "$me, user manager, no writable cgroup"
    echo systemd_scope >/tmp/scope-tests
    run_tests "as $me (systemd user manager)" /tmp/scope-tests
    exit $?
fi

if [ "${1:-}" = user ]; then
    # The user part: systemd gave this unit a cgroup of its own (Delegate=yes);
    # prove that before running anything, so the tests cannot pass in a
    # cgroup the user does not own.
    me=$(id -un)
    cg=$(sed -n 's/^0:://p' /proc/self/cgroup)
    say "user part as $me (uid $(id -u)) in cgroup $cg"
    owner=$(stat -c %U "/sys/fs/cgroup$cg")
    [ "$owner" = "$me" ] || { say "FAIL: cgroup $cg belongs to $owner, not $me: not delegated"; exit 1; }
    has_controllers "/sys/fs/cgroup$cg/cgroup.controllers" \
        || { say "FAIL: delegated cgroup $cg offers [$(cat "/sys/fs/cgroup$cg/cgroup.controllers")], not all of: $want_controllers"; exit 1; }
    say "delegated cgroup $cg owned by $me with controllers [$(cat "/sys/fs/cgroup$cg/cgroup.controllers")]"
    delegate_parent "as $me" || exit 1
    doctor "$me, delegated"
    run_tests "as $me (delegated cgroup)"
    exit $?
fi

# shellcheck source=/dev/null
. "$share/entry.env" || { say "FAIL: no $share/entry.env"; echo 1 >"$share/status"; exit 1; }
say "guest up: entry $ENTRY, uptime $(uptime_s) s"

# 1. The kernel the matrix entry promises, not whatever happens to boot.
release=$(uname -r)
say "kernel: $release ($(uname -v))"
[ "$release" = "$EXPECT_RELEASE" ] || fail "kernel is $release, expected $EXPECT_RELEASE"
case "$release" in "$EXPECT_PREFIX"*) ;; *) fail "kernel $release is not of the $EXPECT_PREFIX series" ;; esac

# 2. Pure cgroup v2: the unified hierarchy at /sys/fs/cgroup, no v1 mount at
#    all, and the controllers the jail's limits use.
fstype=$(stat -f -c %T /sys/fs/cgroup)
[ "$fstype" = cgroup2fs ] || fail "/sys/fs/cgroup is $fstype, not cgroup2"
v1=$(awk '$3 == "cgroup" {print $2}' /proc/mounts)
[ -z "$v1" ] || fail "cgroup v1 hierarchies are mounted: $v1"
say "/sys/fs/cgroup is $fstype with [$(cat /sys/fs/cgroup/cgroup.controllers 2>/dev/null)]; v1 mounts: ${v1:-none}"
has_controllers /sys/fs/cgroup/cgroup.controllers || fail "/sys/fs/cgroup/cgroup.controllers lacks one of: $want_controllers"
say "root part in cgroup $(sed -n 's/^0:://p' /proc/self/cgroup)"

# 3. The payload: one tarball over 9p, unpacked to the guest's own disk
#    (many small reads over 9p are slow).
t0=$(uptime_s)
mkdir -p "$opt"
if tar -C "$opt" -b 2048 -xf "$share/payload.tar"; then  # 1 MiB reads: one 9p request each
    chmod 755 "$opt"
    say "payload unpacked in $(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN{printf "%.1f", b-a}') s: $(du -sh "$opt" | cut -f1)"
else
    fail "cannot unpack $share/payload.tar"
fi

if [ ${#failures[@]} -eq 0 ]; then
    delegate_parent root || failures+=("root cgroup parent")
    doctor root
    run_tests root
    # 4. The same tests as an ordinary user, in a service systemd delegates
    #    a cgroup to (Delegate=yes, as for a user's session manager).
    #    `systemctl start` waits for the oneshot and fails when it fails; it
    #    needs no D-Bus daemon (which the guest lacks), unlike systemd-run
    #    --wait, and a transient scope would not be chowned to the user.
    say "== starting the user part in a delegated cgroup"
    cat >/run/systemd/system/jail-vm-user.service <<UNIT
[Unit]
Description=jail VM tests as $user in a delegated cgroup
DefaultDependencies=no

[Service]
Type=oneshot
User=$user
Group=$user
Delegate=yes
WorkingDirectory=/tmp
Environment=HOME=/home/$user
ExecStart=/bin/bash $opt/guest.sh user
StandardInput=null
StandardOutput=file:/dev/ttyS1
StandardError=inherit
TimeoutStartSec=infinity
UNIT
    systemctl daemon-reload && systemctl start jail-vm-user.service \
        || fail "the user part (as $user, delegated cgroup) failed"
    # 5. As the user again, from root's cgroup (which the user cannot
    #    write, as from a login session's scope), with a user manager
    #    running through lingering: the jail asks it for a delegated scope
    #    over the user bus. The guest boots no bus or logind by default.
    say "== starting the system bus, logind and $user's user manager (loginctl enable-linger)"
    t0=$(uptime_s)
    uid=$(id -u "$user")
    if systemctl start dbus.service systemd-logind.service && loginctl enable-linger "$user"; then
        for _ in $(seq 300); do
            [ -S "/run/user/$uid/bus" ] && systemctl is-active -q "user@$uid.service" && break
            sleep 0.2
        done
    fi
    if [ -S "/run/user/$uid/bus" ]; then
        say "user manager of $user up in $(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN{printf "%.1f", b-a}') s: $(systemctl is-active "user@$uid.service"), bus /run/user/$uid/bus"
        setpriv --reuid="$uid" --regid="$(id -g "$user")" --init-groups \
            env HOME="/home/$user" /bin/bash "$opt/guest.sh" scope </dev/null \
            || fail "the user-manager part (as $user, a scope from systemd) failed"
        left=$(find /sys/fs/cgroup -name 'jail-run-*.scope' 2>/dev/null)
        [ -z "$left" ] || fail "jail scopes left behind: $left"
    else
        fail "no user manager for $user (user@$uid.service: $(systemctl is-active "user@$uid.service"))"
    fi
fi

if [ ${#failures[@]} -eq 0 ]; then
    say "PASS: entry $ENTRY, kernel $release, pure cgroup v2"
    status=0
else
    say "${#failures[@]} failure(s) in entry $ENTRY:"
    printf 'jail-vm:   %s\n' "${failures[@]}"
    status=1
fi
say "finished: uptime $(uptime_s) s"
echo $status >"$share/status"
sync
exit $status
