# The Python package (python/): a maturin wheel with the jail binary inside,
# and its pytest suite against the real binary and rootfs (RemoteSandbox's
# tests against a jail-serve on loopback).
PYTHON_WHEEL_PROFILE ?= release
PYTHON_WHEELS := target/wheels
# Where cargo puts the PYTHON_WHEEL_PROFILE build (`dev` builds into debug/).
PYTHON_SERVE_DIR := target/$(if $(filter dev,$(PYTHON_WHEEL_PROFILE)),debug,$(PYTHON_WHEEL_PROFILE))

.PHONY: python-venv python-wheel python-serve test-python

python-venv: ## the pinned venv for the Python package (maturin, pytest, example frameworks), cached
	@python/venv.sh >/dev/null

# `--auditwheel skip`: the wheel links the host's libseccomp2 (Debian and
# Ubuntu have it; the jail needs it anyway) rather than bundling it, since
# maturin's repair patches cargo's own binary in place through a hard link;
# so its tag is plain `linux_x86_64`, not manylinux.
python-wheel: python-venv ## build the jail-sandbox wheel (the jail binary + the Python client) into target/wheels
	@venv=$$(python/venv.sh) && rm -f $(PYTHON_WHEELS)/jail_sandbox-*.whl && \
	(cd python && "$$venv/bin/maturin" build --quiet --profile $(PYTHON_WHEEL_PROFILE) --compatibility linux --auditwheel skip --out $(CURDIR)/$(PYTHON_WHEELS) -i /usr/bin/python3) >&2 && \
	ls $(PYTHON_WHEELS)/jail_sandbox-*.whl

# jail-serve runs each request with the `jail` beside it, so both are built
# into the same folder; the suite's fixture starts that jail-serve.
python-serve: ## build jail-serve and jail (PYTHON_WHEEL_PROFILE) for RemoteSandbox's tests
	$(CARGO) build --quiet --profile $(PYTHON_WHEEL_PROFILE) -p jail -p jail-serve

test-python: python-wheel python-serve rootfs ## install the wheel into the venv and run the pytest suite (python/tests; RemoteSandbox against jail-serve on loopback), as root then as an ordinary user
	JAIL_SERVE=$(CURDIR)/$(PYTHON_SERVE_DIR)/jail-serve python/test.sh $$(ls $(PYTHON_WHEELS)/jail_sandbox-*.whl)
