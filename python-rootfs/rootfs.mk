# Rootfs targets, included by the top-level Makefile (`include python-rootfs/rootfs.mk`).
# python-rootfs/README.md says what each flavour holds and how long it takes.

.PHONY: rootfs rootfs-data rootfs-data-lock rootfs-data-syscalls

rootfs: ## build the minimal Python rootfs into python-rootfs/out/minimal
	python-rootfs/build.sh minimal

rootfs-data: ## build the data-science rootfs into python-rootfs/out/data (root: Debian's Python, cached by its inputs; an ordinary user: the host's Python and locked wheels)
	python-rootfs/build.sh data

rootfs-data-lock: ## re-resolve python-rootfs/data.in into python-rootfs/data.lock and the per-Python locks of the root-free build, python-rootfs/wheels/ (PyPI)
	python-rootfs/lock-data.sh
	python-rootfs/lock-wheels.sh

rootfs-data-syscalls: ## trace the data workloads in the jail into python-rootfs/data-syscalls.txt (root, strace)
	cargo build --quiet -p jail
	python-rootfs/trace-syscalls.sh
