# The Python package (python/): a maturin wheel with the jail binary inside,
# and its pytest suite against the real binary and rootfs.
PYTHON_WHEEL_PROFILE ?= release
PYTHON_WHEELS := target/wheels

.PHONY: python-venv python-wheel test-python

python-venv: ## the pinned venv for the Python package (maturin, pytest, example frameworks), cached
	@python/venv.sh >/dev/null

python-wheel: python-venv ## build the jail-sandbox wheel (the jail binary + the Python client) into target/wheels
	@venv=$$(python/venv.sh) && rm -f $(PYTHON_WHEELS)/jail_sandbox-*.whl && \
	(cd python && PATH="$$venv/bin:$$PATH" "$$venv/bin/maturin" build --quiet --profile $(PYTHON_WHEEL_PROFILE) --out $(CURDIR)/$(PYTHON_WHEELS) -i /usr/bin/python3) >&2 && \
	ls $(PYTHON_WHEELS)/jail_sandbox-*.whl

test-python: python-wheel rootfs ## install the wheel into the venv and run the pytest suite (python/tests), as root then as TEST_USER
	@venv=$$(python/venv.sh) && \
	"$$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps $(PYTHON_WHEELS)/jail_sandbox-*.whl && \
	JAIL_ROOTFS=$(CURDIR)/python-rootfs/out/minimal "$$venv/bin/python" -m pytest -p no:cacheprovider -q python/tests && \
	if [ "$$(id -u)" = 0 ] && id $(TEST_USER) >/dev/null 2>&1; then \
		echo "== the pytest suite again as $(TEST_USER)"; \
		runuser -u $(TEST_USER) -- env -i PATH=/usr/bin:/bin HOME=/tmp JAIL_ROOTFS=$(CURDIR)/python-rootfs/out/minimal \
			"$$venv/bin/python" -m pytest -p no:cacheprovider -q python/tests; \
	fi
