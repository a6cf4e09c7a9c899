# The Python package (python/): a manylinux_2_31 wheel packed from the
# workspace's release build (`make release`: jail, jail-mcp, jail-serve,
# glibc >= 2.31, libseccomp static) by python/pack.py, and its pytest suite
# against the real binaries and rootfs (RemoteSandbox's tests against the
# release jail-serve on loopback); then the same wheel in fresh Debian 11
# and Debian 13 userlands (python/userland.sh).
PYTHON_WHEELS := target/wheels

.PHONY: python-venv python-wheel python-api test-python test-python-userlands

python-venv: ## the pinned venv for the Python package's tests (pytest, auditwheel, the frameworks the integrations plug into), cached
	@python/venv.sh >/dev/null

python-wheel: release ## pack the jail-sandbox wheel (the release jail, jail-mcp, jail-serve + the Python client) into target/wheels: no second build
	@rm -f $(PYTHON_WHEELS)/jail_sandbox-*.whl
	/usr/bin/python3 python/pack.py --bin target/release --out $(PYTHON_WHEELS)

python-api: ## regenerate python/API.md, the API reference, from the package's docstrings
	/usr/bin/python3 python/apidoc.py > python/API.md

test-python: python-wheel python-venv rootfs ## install the wheel into the venv and run the pytest suite (python/tests; RemoteSandbox against jail-serve on loopback), as root then as an ordinary user
	JAIL_SERVE=$(CURDIR)/target/release/jail-serve python/test.sh $$(ls $(PYTHON_WHEELS)/jail_sandbox-*.whl)

test-python-userlands: python-wheel ## the wheel in fresh Debian 11 (glibc 2.31) and Debian 13 userlands (debootstrap, cached in /var/cache/jail-userlands), as an ordinary user: Sandbox().run, a data rootfs built without root, a pandas chart (root)
	python/userland.sh $$(ls $(PYTHON_WHEELS)/jail_sandbox-*.whl) bullseye trixie
