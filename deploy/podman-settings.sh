# Sourced by deploy/check.sh and deploy/k8s/seccomp/trace.sh: the `podman
# run` flags that stand for the Deployment's pod spec (deploy/k8s/
# deployment.yaml) on this machine, one line each with the pod setting it
# stands for, and the server's arguments. deploy/k8s/README.md, "What this
# machine proves", lists what podman here cannot honour and why.

# The container's open-file and process limits: podman asks for 1048576
# open files and lowers its own process limit to 32768, but root here lacks
# CAP_SYS_RESOURCE (its hard limits are the machine's), so crun/runc's
# setrlimit fails with EPERM unless asked for what the caller has.
jail_nofile=$(ulimit -Hn)
jail_nproc=$(ulimit -Hu)
[ "$jail_nproc" = unlimited ] || [ "$jail_nproc" -gt 32768 ] && jail_nproc=32768

JAIL_PODMAN_RUN=(
    # crun refuses this machine's hybrid cgroups (hugetlb on the v2
    # hierarchy); runc takes the v1 controllers.
    --runtime runc
    --ulimit "nofile=$jail_nofile:$jail_nofile" --ulimit "nproc=$jail_nproc:$jail_nproc"
    # hostUsers: false (a user namespace of 65536 ids for the pod)
    --uidmap 0:1879113728:65536 --gidmap 0:1879113728:65536
    # runAsUser: 0, runAsGroup: 0 (the pod namespace's root)
    --user 0:0
    # capabilities: drop ALL, add SETUID, SETGID
    --cap-drop ALL --cap-add SETUID,SETGID
    # allowPrivilegeEscalation: false
    --security-opt no-new-privileges
    # procMount: Unmasked
    --security-opt unmask=/proc/*
    # readOnlyRootFilesystem: true; emptyDirs at /tmp and /run
    --read-only --tmpfs /tmp:rw,mode=1777,size=2g --tmpfs /run:rw,mode=0755,size=16m
    # resources.limits (memory, cpu, pids)
    --memory 4g --cpus 2 --pids-limit 4096
)
JAIL_SERVE_ARGS=(
    --listen 0.0.0.0:8080 --tokens /etc/jail/tokens/tokens.json
    --rootfs /var/lib/jail/rootfs/data --policy /etc/jail/pod.json
    --max-runs 16 --drain-secs 60 --pool-size 4 --pool-memory 512
)
