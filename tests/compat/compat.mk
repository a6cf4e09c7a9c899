# The compatibility bar (tests/compat/README.md), included by the top Makefile.
MODULES ?=

.PHONY: test-compat compat-testsuite

# CPython's own regression tests (Debian's package). Installing it can upgrade
# the host's python3.11 to the package's exact version, so the rootfs (a copy
# of the host's Python) is built after it.
compat-testsuite:
	@dpkg-query -W -f='$${Status}' libpython3.11-testsuite 2>/dev/null | grep -q 'install ok installed' \
	    || { sudo=; [ "$$(id -u)" = 0 ] || sudo=sudo; DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends libpython3.11-testsuite >/dev/null; }

test-compat: compat-testsuite ## run CPython 3.11's own tests for 30+ stdlib modules bare and in the jail; fail on a difference not in tests/compat/differences.txt (MODULES=... for some)
	$(MAKE) --no-print-directory build rootfs
	/usr/bin/python3 tests/compat/compat.py $(MODULES)
