# jail: the only entry points. `make help` lists them.
SHELL := /bin/bash
CARGO ?= cargo
JAIL  := target/release/jail
TEST_USER ?= jailtest
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.DEFAULT_GOAL := help

.PHONY: help setup build release rootfs test test-user demo doctor check-policies bench bench-quick clean

help: ## list every target
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

setup: ## install the system packages the build needs (uses sudo when not root)
	scripts/setup.sh

build: ## build the workspace (debug)
	$(CARGO) build --workspace

release: ## build the release binary target/release/jail
	$(CARGO) build --release -p jail

include python-rootfs/rootfs.mk
include agent/agent.mk
include tests/vm/vm.mk
include tests/compat/compat.mk
include fuzz/fuzz.mk

demo: setup release ## set up (packages, jail, data rootfs), then summarise and chart a CSV in the jail and print the result
	@[ -d python-rootfs/out/data ] || $(SUDO) python-rootfs/build.sh data
	@out=$$(mktemp -d /tmp/jail-demo.XXXXXX); chmod 755 $$out; [ "$$(id -u)" != 0 ] || chown 65534:65534 $$out; \
	$(JAIL) run --json --rootfs python-rootfs/out/data --input examples/data --output $$out examples/analyse.py; \
	echo "demo output: $$out"

doctor: release ## show what this host provides to the jail
	$(JAIL) doctor

test: build rootfs ## run every test (and, as root, the jail tests again as $(TEST_USER))
	$(CARGO) test --workspace
	@if [ "$$(id -u)" = 0 ]; then \
	    if id $(TEST_USER) >/dev/null 2>&1; then tests/run-as-user.sh $(TEST_USER); \
	    else echo "note: no user $(TEST_USER); create it (useradd -m $(TEST_USER)) to run the jail tests as an ordinary user too"; fi; \
	fi

test-user: build rootfs ## run the jail tests as $(TEST_USER) (root only)
	tests/run-as-user.sh $(TEST_USER)

bench: release rootfs ## jail vs bare python vs bubblewrap, as ratios (installs bubblewrap if missing)
	@command -v bwrap >/dev/null || { sudo=; [ "$$(id -u)" = 0 ] || sudo=sudo; $$sudo apt-get install -y -qq bubblewrap >/dev/null; }
	/usr/bin/python3 bench/bench.py

bench-quick: release rootfs ## a short smoke run of the bench
	/usr/bin/python3 bench/bench.py --quick

check-policies: build ## validate every policy in policies/
	@for p in policies/*.json; do target/debug/jail check $$p || exit 1; done

clean: ## remove build output and rootfs builds
	$(CARGO) clean
	rm -rf python-rootfs/out
