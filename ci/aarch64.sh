#!/usr/bin/env bash
# CI's AArch64 step, in two halves so that the slow parts overlap the x86 tests:
#
#   ci/aarch64.sh prepare     the emulation tools (Debian's qemu-user-static, binfmt-support,
#                             debootstrap, gcc-aarch64-linux-gnu) and the arm64 root
#                             (ci/arm64_root.sh); needs root (or sudo) and Debian's mirrors
#   ci/aarch64.sh test        the cross-built wheel (ci/build_aarch64.sh; needs the build
#                             requirements, which ci/run_tests.sh installs) and the emulated test
#                             subset below, once without a cap (ci/test_aarch64.sh)
#
# ARM64_ROOT moves the root (default: outside the checkout, $TMPDIR/fastattn-arm64-root, so that
# nothing that copies the tree -- tests/test_wheel.py, the sanitizer -- meets a Debian system).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="${ARM64_ROOT:-${TMPDIR:-/tmp}/fastattn-arm64-root}"
SUDO=""
if [[ $(id -u) != 0 ]]; then
    command -v sudo >/dev/null || { echo "aarch64: needs root or sudo (debootstrap, chroot, binfmt)" >&2; exit 1; }
    SUDO="sudo -E env PATH=$PATH"
fi
case "${1:-}" in
prepare)
    need=()
    for p in qemu-user-static binfmt-support debootstrap gcc-aarch64-linux-gnu; do
        dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
    done
    if [[ ${#need[@]} -gt 0 ]]; then
        echo "aarch64: apt-get install ${need[*]}"
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" > /dev/null
    fi
    $SUDO bash ci/arm64_root.sh "$ROOT"
    ;;
test)
    bash ci/build_aarch64.sh dist-aarch64 "$ROOT"
    ARM64_CAPS="-" $SUDO bash ci/test_aarch64.sh dist-aarch64 "$ROOT" -- \
        tests/kernels/test_aarch64.py tests/kernels/test_int8_gemm.py \
        tests/kernels/test_int8_digest.py tests/kernels/test_portable_attention.py \
        tests/kernels/test_worked_examples.py tests/generation/test_search_kernels.py
    ;;
*)
    echo "usage: ci/aarch64.sh prepare|test" >&2; exit 2 ;;
esac
