# The VM matrix (tests/vm/README.md), included by the top Makefile.
VM ?=

.PHONY: test-vm

test-vm: build rootfs ## boot the VM matrix (pure cgroup v2 guests, older kernels) and run tests/vm/tests.txt inside; VM=NAME for one entry
	/usr/bin/python3 tests/vm/vm.py $(VM)
