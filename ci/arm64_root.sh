#!/usr/bin/env bash
# An arm64 Debian root for the emulated AArch64 tests (ci/test_aarch64.sh) and the aarch64 Python
# headers the cross build compiles against (ci/build_aarch64.sh), on an x86-64 Debian/Ubuntu
# machine. Needs root (debootstrap, chroot), qemu-user-static + binfmt-support, network access
# to Debian's and PyPI's mirrors.
#
#   ci/arm64_root.sh [ROOT]            (default .arm64-root; reused when it is complete)
#
# The root holds Debian's Python 3 (with its headers) and nothing else of ours; the test
# dependencies are aarch64 wheels from PyPI, installed by this machine's pip into ROOT/opt/site
# (`pip install --target --platform`: no pip run under emulation), which ci/test_aarch64.sh puts
# on PYTHONPATH. fastattn itself goes in from its wheel, with --no-deps, at test time.
set -euo pipefail
cd "$(dirname "$0")/.."
# update-binfmts, debootstrap and chroot live in the sbin folders, which a PATH may leave out
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
ROOT=$(realpath -m "${1:-.arm64-root}")
SUITE=${ARM64_SUITE:-bookworm}
MIRROR=${ARM64_MIRROR:-http://deb.debian.org/debian}
start=$(date +%s)

if [[ ! -d /proc/sys/fs/binfmt_misc ]] || [[ ! -e /proc/sys/fs/binfmt_misc/status ]]; then
    mount binfmt_misc -t binfmt_misc /proc/sys/fs/binfmt_misc
fi
[[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]] || update-binfmts --enable qemu-aarch64

if [[ ! -x "$ROOT/usr/bin/python3" || ! -f "$ROOT/.fastattn-root-ok" ]]; then
    # (a chroot's mounts first: never delete through a mounted /proc or /dev)
    for m in proc sys dev; do umount -R "$ROOT/$m" 2>/dev/null || true; done
    if grep -q " $ROOT/" /proc/mounts; then
        echo "arm64_root: something is still mounted under $ROOT; not deleting it" >&2; exit 1
    fi
    rm -rf "$ROOT"
    mkdir -p "$ROOT"
    echo "arm64_root: debootstrap $SUITE into $ROOT"
    debootstrap --arch=arm64 --variant=minbase --include=python3,python3-dev,ca-certificates \
        "$SUITE" "$ROOT" "$MIRROR" > "$ROOT.debootstrap.log" 2>&1 || {
        tail -20 "$ROOT.debootstrap.log" >&2; exit 1; }
    touch "$ROOT/.fastattn-root-ok"
fi
PYV=$(chroot "$ROOT" python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
echo "arm64_root: $(chroot "$ROOT" python3 -c 'import platform, sys; print(sys.version.split()[0], platform.machine())')"

# the test dependencies, aarch64 wheels for the root's Python, by this machine's pip
SITE="$ROOT/opt/site"
if [[ ! -f "$SITE/.ok" ]]; then
    rm -rf "$SITE"
    python -m pip install -q --no-cache-dir --target "$SITE" --only-binary=:all: \
        --platform manylinux_2_28_aarch64 --platform manylinux_2_27_aarch64 \
        --platform manylinux2014_aarch64 --platform linux_aarch64 \
        --python-version "$PYV" --implementation cp --abi "cp${PYV/./}" \
        pip "numpy>=2" scipy pytest safetensors threadpoolctl
    touch "$SITE/.ok"
fi
chroot "$ROOT" env PYTHONPATH=/opt/site python3 -c "import numpy, scipy, pytest; print('arm64_root: numpy', numpy.__version__, 'scipy', scipy.__version__)"
echo "arm64_root: ready in $(( $(date +%s) - start )) s"
