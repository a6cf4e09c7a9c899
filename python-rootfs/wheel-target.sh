# The wheel tags the data rootfs's interpreter accepts, shared by lock-data.sh
# (which resolves with them) and flavours/data.sh (which installs with them),
# so the lock and the install can never pick different files.
# Debian bookworm: CPython 3.11, glibc 2.36, x86_64.
WHEEL_PYTHON=3.11
WHEEL_TARGET=(--python-version "$WHEEL_PYTHON" --implementation cp --abi cp311 --abi abi3 --abi none)
for minor in $(seq 36 -1 17); do
    WHEEL_TARGET+=(--platform "manylinux_2_${minor}_x86_64")
done
WHEEL_TARGET+=(--platform manylinux2014_x86_64 --platform any)
