#!/usr/bin/env bash
# Cross-build fastattn's manylinux aarch64 wheel on an x86-64 Debian/Ubuntu machine.
#
#   ci/build_aarch64.sh [OUTDIR] [ROOT]      (default OUTDIR: dist-aarch64/, ROOT: .arm64-root/)
#
# Debian's gcc-aarch64-linux-gnu compiles the Cython C (generated on this machine) against an
# aarch64 Python's headers, taken from the arm64 Debian root that ci/arm64_root.sh makes (the
# emulated tests' root); NumPy's headers are the same on both architectures (checked below).
# setup.py's OpenMP probe runs its aarch64 program under qemu-user (binfmt). auditwheel then
# bundles the cross toolchain's libgomp and names the manylinux tag. The wheel installs and
# runs in the arm64 root without a compiler (ci/test_aarch64.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${1:-dist-aarch64}")
ROOT=$(realpath -m "${2:-.arm64-root}")
CROSS=aarch64-linux-gnu
PYV=$(python -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
PYINC="$ROOT/usr/include/python$PYV"
PYCONF="$ROOT/usr/include/aarch64-linux-gnu/python$PYV"
for need in "$CROSS-gcc" qemu-aarch64-static; do
    command -v "$need" >/dev/null || { echo "build_aarch64: $need not found (apt-get install gcc-aarch64-linux-gnu qemu-user-static binfmt-support)" >&2; exit 1; }
done
[[ -f "$PYINC/Python.h" && -f "$PYCONF/pyconfig.h" ]] || {
    echo "build_aarch64: no aarch64 Python $PYV headers under $ROOT (run ci/arm64_root.sh first; the root's Python must be $PYV)" >&2; exit 1; }

# a clean copy of the sources (the tracked files as they are now, edits included), so that
# the x86 build in place is neither used nor overwritten
SRC=$(mktemp -d)
trap 'rm -rf "$SRC"' EXIT
git ls-files -z --cached --others --exclude-standard | grep -z -v -E '\.so$|^\.arm64-root/' \
    | xargs -0 cp --parents -t "$SRC"
cd "$SRC"
rm -f fastattn/_kernels/_*.c   # the Cython C is generated afresh

export FASTATTN_FAIL_NO_OPENMP=1
export CC="$CROSS-gcc" CXX="$CROSS-g++" LDSHARED="$CROSS-gcc -pthread -shared"
export CFLAGS="-I$PYINC -I$PYCONF -I$ROOT/usr/include/$CROSS -I$ROOT/usr/include" LDFLAGS=""
export SETUPTOOLS_EXT_SUFFIX=".cpython-${PYV/./}-aarch64-linux-gnu.so"
export _PYTHON_HOST_PLATFORM=linux-aarch64
export QEMU_LD_PREFIX=/usr/$CROSS          # the probe's loader and libc, for qemu-user
python -m build --wheel --no-isolation --outdir "$SRC/raw" . > "$SRC/build.log" 2>&1 || {
    tail -40 "$SRC/build.log" >&2; exit 1; }
grep -E "fastattn: OpenMP" "$SRC/build.log" || true
RAW=$(ls "$SRC"/raw/fastattn-*-linux_aarch64.whl)
# every extension in the wheel is an AArch64 ELF (e_machine 183), read with Python alone
python - "$RAW" <<'PY' || { echo "build_aarch64: the extensions are not aarch64" >&2; exit 1; }
import struct, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
sos = [n for n in z.namelist() if n.endswith(".so")]
machines = {n: struct.unpack_from("<H", z.read(n), 18)[0] for n in sos}
print("build_aarch64:", len(sos), "extensions, ELF machines", sorted(set(machines.values())))
sys.exit(0 if sos and set(machines.values()) == {183} else 1)
PY
mkdir -p "$OUT"
LD_LIBRARY_PATH=/usr/$CROSS/lib python -m auditwheel repair --wheel-dir "$OUT" "$RAW"
ls -l "$OUT"
