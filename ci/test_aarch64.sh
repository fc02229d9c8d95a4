#!/usr/bin/env bash
# Install the aarch64 wheel (ci/build_aarch64.sh) in the emulated arm64 root (ci/arm64_root.sh)
# and run a test subset there, once per AArch64 kernel variant (FASTATTN_ISA=neon / dotprod /
# i8mm caps the int8 GEMM's; the float kernels are NEON's under all three).
#
#   ci/test_aarch64.sh [WHEEL_DIR] [ROOT] [-- PYTEST_ARGS...]
#
# ARM64_CAPS (default "neon dotprod i8mm"): the FASTATTN_ISA values to run under; "-" is no cap
# (CI runs once, uncapped: the int8 tests force every variant in-process, and the INT8 digest
# test starts processes under the caps itself).
#
# The root runs under qemu-user (binfmt): correctness, not speed. The tests are the repository's
# own, copied into the root; the package under test is the installed wheel (no compiler there).
set -euo pipefail
# chroot lives in the sbin folders, which a PATH may leave out
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
cd "$(dirname "$0")/.."
WHEELS=$(realpath -m "${1:-dist-aarch64}")
ROOT=$(realpath -m "${2:-.arm64-root}")
shift $(( $# >= 2 ? 2 : $# )) || true
[[ "${1:-}" == "--" ]] && shift
ARGS=("$@")
if [[ ${#ARGS[@]} -eq 0 ]]; then
    ARGS=(tests/kernels/test_int8_gemm.py tests/kernels/test_int8_digest.py
          tests/kernels/test_portable_attention.py tests/kernels/test_aarch64.py
          tests/kernels/test_gemm.py tests/kernels/test_attention.py tests/kernels/test_softmax.py
          tests/kernels/test_activations.py tests/kernels/test_isa.py tests/kernels/test_isa_cap.py
          tests/kernels/test_worked_examples.py tests/generation/test_search_kernels.py)
fi
WHL=$(ls "$WHEELS"/fastattn-*manylinux*_aarch64.whl | head -1)
mkdir -p "$ROOT/tmp/fa"
rm -rf "$ROOT/tmp/fa/tests" "$ROOT/tmp/fa/bench" "$ROOT/tmp/fa/"*.whl "$ROOT/opt/fa"
cp "$WHL" "$ROOT/tmp/fa/"
cp -r tests bench "$ROOT/tmp/fa/"
# the root's own (aarch64) Python and pip install the wheel: no compiler there
run() { chroot "$ROOT" env -i HOME=/root PATH=/usr/bin:/bin LANG=C.UTF-8 \
            PYTHONPATH=/opt/fa:/opt/site "$@"; }
run python3 -m pip install -q --no-deps --target /opt/fa "/tmp/fa/$(basename "$WHL")"
run python3 -c "import fastattn; fastattn.show_config()"
status=0
for cap in ${ARM64_CAPS:-neon dotprod i8mm}; do
    [[ "$cap" == "-" ]] && cap=""
    echo "== FASTATTN_ISA=${cap:-(none)}"
    run env FASTATTN_ISA="$cap" bash -c "cd /tmp/fa && python3 -m pytest -q -p no:cacheprovider ${ARGS[*]}" || status=1
done
exit $status
