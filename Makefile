# jail: the only entry points. `make help` lists them.
SHELL := /bin/bash
CARGO ?= cargo
JAIL  := target/release/jail
TEST_USER ?= jailtest
# libtest arguments for `make test`/`test-user`, e.g. TEST_FILTER="--exact name"
TEST_FILTER ?=
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.DEFAULT_GOAL := help

.PHONY: help setup build release install rootfs test test-core test-deps test-user test-harness demo doctor check-policies check-imports measure bench bench-quick image deploy-check clean

help: ## list every target
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

setup: ## install the system packages the build needs (uses sudo when not root)
	scripts/setup.sh

build: ## build the workspace (debug)
	$(CARGO) build --workspace

# The release binaries run on any x86_64 Linux with glibc 2.31 or newer
# (Debian 11, Ubuntu 20.04): linked by zig for that glibc (scripts/zig.sh:
# cargo-zigbuild and the ziglang wheel, pinned, cached), libseccomp linked
# statically. One build serves `make install`, the wheel (`make
# python-wheel`), the image and the bench; cargo-zigbuild builds into
# target/$(RELEASE_TRIPLE)/release, copied to target/release.
RELEASE_TRIPLE := x86_64-unknown-linux-gnu
RELEASE_GLIBC := 2.31
RELEASE_BINS := jail jail-mcp jail-serve
LIBSECCOMP_A = $(firstword $(wildcard /usr/lib/x86_64-linux-gnu/libseccomp.a /usr/lib64/libseccomp.a /usr/lib/libseccomp.a))
release: ## build the release binaries target/release/jail, jail-mcp and jail-serve (`jail mcp`, `jail serve` run them) and libjail.so (a pool's template loads it): glibc >= 2.31, libseccomp static
	@[ -n "$(LIBSECCOMP_A)" ] || { echo "no libseccomp.a: install libseccomp-dev (make setup)" >&2; exit 1; }
	zig=$$(scripts/zig.sh) && PATH="$$zig:$$PATH" LIBSECCOMP_LINK_TYPE=static LIBSECCOMP_LIB_PATH=$(dir $(LIBSECCOMP_A)) \
		$(CARGO) zigbuild --release --target $(RELEASE_TRIPLE).$(RELEASE_GLIBC) $(addprefix -p ,$(RELEASE_BINS))
	@mkdir -p target/release && for b in $(RELEASE_BINS) libjail.so; do cp -p target/$(RELEASE_TRIPLE)/release/$$b target/release/$$b.new && mv target/release/$$b.new target/release/$$b; done

# `make install PREFIX=...`: the binary alone works anywhere (policy and
# rootfs recipes compiled in); DESTDIR is honoured for packaging.
PREFIX ?= /usr/local
install: release ## install jail into PREFIX/bin (default /usr/local); then `jail rootfs build minimal`
	scripts/install.sh $(JAIL) $(DESTDIR)$(PREFIX)

include python-rootfs/rootfs.mk
include agent/agent.mk
include tests/vm/vm.mk
include tests/compat/compat.mk
include fuzz/fuzz.mk
include python/python.mk

# The group every run started by root shares (identity.root_host_gid in
# policies/default.json); each run's uid is its own.
JAIL_ROOT_GID ?= 1879048192

demo: setup release ## set up (packages, jail, data rootfs), then summarise and chart a CSV in the jail and print the result
	@[ -d python-rootfs/out/data ] || $(SUDO) python-rootfs/build.sh data
	@out=$$(mktemp -d /tmp/jail-demo.XXXXXX); chmod 755 $$out; [ "$$(id -u)" != 0 ] || { chgrp $(JAIL_ROOT_GID) $$out && chmod 775 $$out; }; \
	$(JAIL) run --json --rootfs python-rootfs/out/data --input examples/data --output $$out examples/analyse.py; \
	echo "demo output: $$out"

doctor: release ## show what this host provides to the jail
	$(JAIL) doctor

test: build rootfs test-deps ## run every test; as root, the jail tests again as an ordinary user (TEST_USER, else a spare uid); then list every skip
	TEST_USER=$(TEST_USER) tests/run.sh $(TEST_FILTER)

# The jail's own tests alone: the jail crate and its end-to-end tests
# (tests/, crate jail-tests), which depend on nothing of the agent, the
# service or the MCP server, so none of those is built. As the caller only.
test-core: rootfs ## the jail's tests alone (cargo test -p jail -p jail-tests): builds no agent, service or MCP server
	$(CARGO) build -p jail
	$(CARGO) test -p jail -p jail-tests -- $(TEST_FILTER)

test-deps: ## what the tests need beyond the build: the agent's OTLP receiver venv, the MCP Python SDK venv
	@agent/otel-test-setup.sh >/dev/null || echo "note: no OTLP receiver venv; the agent's trace-export test will skip (see agent/otel-test-setup.sh)"
	@tests/mcp/setup.sh >/dev/null || echo "note: no MCP SDK venv; tests/fronts/tests/mcp.rs will skip (see tests/mcp/setup.sh)"

test-user: build rootfs ## run the jail tests as TEST_USER, an account or a bare uid (root only)
	tests/run-as-user.sh $(TEST_USER) $(TEST_FILTER)

load-test: build release ## `jail serve` on its warm pool under load on loopback: LOAD_CLIENTS clients (200) for LOAD_SECS s (60), pool LOAD_POOL_SIZE (4); runs/s, p50/p99, errors 0, refill time, nothing left after the drain; the same for half as long with a preload (each jail forked from the pool's template); then a noisy neighbour (release binaries): server RSS, the steady tenant's p50/p99 alone and under the attack, the caps hit
	JAIL_BIN=$(CURDIR)/target/debug/jail JAIL_REPO=$(CURDIR) LOAD_CLIENTS=$${LOAD_CLIENTS:-200} LOAD_SECS=$${LOAD_SECS:-60} \
		LOAD_POOL_SIZE=$${LOAD_POOL_SIZE:-4} $(CARGO) test --workspace --test serve load_on_loopback -- --ignored --nocapture
	JAIL_BIN=$(CURDIR)/target/debug/jail JAIL_REPO=$(CURDIR) LOAD_CLIENTS=$${LOAD_CLIENTS:-200} LOAD_SECS=$$(( $${LOAD_SECS:-60} / 2 )) \
		LOAD_POOL_SIZE=$${LOAD_POOL_SIZE:-4} LOAD_PRELOAD=1 $(CARGO) test --workspace --test serve load_on_loopback -- --ignored --nocapture
	JAIL_BIN=$(CURDIR)/target/release/jail JAIL_REPO=$(CURDIR) \
		$(CARGO) test --workspace --test serve noisy_neighbour_on_loopback -- --ignored --nocapture

image: release ## the `jail serve` container image (deploy/Containerfile; JAIL_IMAGE, default localhost/jail-serve:dev) with podman or buildah; needs the data rootfs
	@[ -d python-rootfs/out/data ] || $(SUDO) python-rootfs/build.sh data
	deploy/image.sh

deploy-check: release ## prove deploy/: manifests against the Kubernetes schemas, the seccomp and AppArmor profiles, the image built and serving under podman (deploy/k8s/README.md)
	@[ -d python-rootfs/out/data ] || $(SUDO) python-rootfs/build.sh data
	deploy/check.sh

test-harness: build rootfs ## check `make test` itself: green without the test user, red under JAIL_MUST_WORK=1 (a few filtered runs)
	tests/harness-test.sh

bench: release rootfs ## jail vs bare python vs bubblewrap, as ratios (installs bubblewrap if missing)
	@command -v bwrap >/dev/null || { sudo=; [ "$$(id -u)" = 0 ] || sudo=sudo; $$sudo apt-get install -y -qq bubblewrap >/dev/null; }
	/usr/bin/python3 bench/bench.py

bench-quick: release rootfs ## a short smoke run of the bench
	/usr/bin/python3 bench/bench.py --quick

# No import circle (scripts/import-cycles.py): first its self-test (a cycle
# planted in a temp copy of jail/src fails the check, and so does a stale
# allow-list line), then every crate: any cycle fails. Stdlib Python, no build.
check-imports: ## no import cycle in any crate (rooms, and siblings within a room)
	/usr/bin/python3 scripts/import-cycles.py --self-test
	/usr/bin/python3 scripts/import-cycles.py

# Issue 35's before and after figures; no build.
measure: ## the code's figures: pub items of jail/src, the longest functions, client lines in agent+mcp+serve, import cycles
	@printf 'pub items in jail/src: '; grep -rE '^\s*pub\s+(fn|struct|enum|const|static|type|trait|mod|unsafe fn|async fn)\b' jail/src --include=*.rs | wc -l
	@printf 'pub fields in jail/src: '; grep -rE '^\s*pub\s+[a-z_0-9]+\s*:' jail/src --include=*.rs | wc -l
	@printf 'pub mod in jail/src/lib.rs: '; grep -c '^pub mod' jail/src/lib.rs
	@echo 'longest functions (tests left out):'; /usr/bin/python3 scripts/fn-lengths.py -n 15 jail/src agent/src serve/src mcp/src
	@/usr/bin/python3 scripts/client-loc.py
	@/usr/bin/python3 scripts/import-cycles.py --strict | grep -v "^    " || true

check-policies: build ## validate every policy in policies/
	@for p in policies/*.json; do target/debug/jail check $$p || exit 1; done

clean: ## remove build output and rootfs builds
	$(CARGO) clean
	rm -rf python-rootfs/out
