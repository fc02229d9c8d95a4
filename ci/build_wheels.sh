#!/usr/bin/env bash
# Build fastattn's sdist and wheel(s) and make the wheels portable.
#
# Usage:
#   ci/build_wheels.sh [OUTDIR]       local build (default OUTDIR: dist/):
#                                     python -m build -> sdist + a wheel built from that sdist,
#                                     check the sdist holds sources only, then on Linux
#                                     auditwheel repair -> a manylinux wheel bundling libgomp
#   ci/build_wheels.sh --aarch64 [OUTDIR] [ROOT]
#                                     Linux aarch64 cross-built on x86-64 (ci/build_aarch64.sh:
#                                     gcc-aarch64-linux-gnu against the arm64 root's Python
#                                     headers, auditwheel bundling libgomp)
#   ci/build_wheels.sh --cibuildwheel [OUTDIR]
#                                     CI: every platform/Python in [tool.cibuildwheel]
#                                     (pyproject.toml), which repairs and tests each wheel
# Builds in a clean tree are best: setup.py regenerates the Cython C next to the .pyx.
set -euo pipefail

cd "$(dirname "$0")/.."
export FASTATTN_FAIL_NO_OPENMP=1   # never ship a serial wheel

MODE=local
if [[ "${1:-}" == "--aarch64" ]]; then
    shift
    exec bash ci/build_aarch64.sh "${1:-dist-aarch64}" "${2:-.arm64-root}"
fi
if [[ "${1:-}" == "--cibuildwheel" ]]; then
    MODE=cibuildwheel
    shift
fi

if [[ "$(uname)" == "Darwin" ]]; then
    # Apple clang has no bundled OpenMP runtime: use Homebrew's libomp (setup.py adds
    # -Xpreprocessor -fopenmp and -lomp; these point it at the headers and the library)
    PREFIX=$(brew --prefix libomp)
    export CPPFLAGS="${CPPFLAGS:-} -I$PREFIX/include"
    export CFLAGS="${CFLAGS:-} -I$PREFIX/include"
    export LDFLAGS="${LDFLAGS:-} -L$PREFIX/lib -Wl,-rpath,$PREFIX/lib"
    export MACOSX_DEPLOYMENT_TARGET="${MACOSX_DEPLOYMENT_TARGET:-14.0}"
fi

if [[ "$MODE" == "cibuildwheel" ]]; then
    OUT=${1:-wheelhouse}
    python -m pip install --upgrade "cibuildwheel>=2.21"
    python -m cibuildwheel --output-dir "$OUT" .
    ls -l "$OUT"
    exit 0
fi

OUT=${1:-dist}
RAW="$OUT/unrepaired"
rm -rf "$RAW"
mkdir -p "$OUT" "$RAW"

echo "== python -m build (sdist, then a wheel built from the sdist)"
python -m build --outdir "$RAW" .

SDIST=$(ls "$RAW"/fastattn-*.tar.gz)
echo "== checking $SDIST"
python - "$SDIST" <<'PY'
import sys
import tarfile

names = tarfile.open(sys.argv[1]).getnames()
rel = ["/".join(n.split("/")[1:]) for n in names]
must = ["setup.py", "pyproject.toml", "fastattn/_kernels/_attention.pyx",
        "fastattn/_kernels/fa_kernels.c", "fastattn/_kernels/fa_kernels.h"]
missing = [m for m in must if m not in rel]
missing += [f"a *{ext} file" for ext in (".pxd", ".h") if not any(r.endswith(ext) for r in rel)]
generated = [r for r in rel if r.endswith(".c") and r != "fastattn/_kernels/fa_kernels.c"]
generated += [r for r in rel if r.endswith((".so", ".pyd", ".html")) or r.endswith("_build_info.py")]
print(f"{len(rel)} entries; sources: "
      + ", ".join(r for r in rel if r.endswith((".pyx", ".pxd", ".h", ".c"))))
if missing or generated:
    sys.exit(f"bad sdist: missing {missing}, generated files that must not ship {generated}")
print("sdist OK: .pyx/.pxd/.h/fa_kernels.c present, no generated C")
PY

cp "$SDIST" "$OUT/"
for WHEEL in "$RAW"/fastattn-*.whl; do
    if [[ "$(uname)" == "Linux" ]]; then
        echo "== auditwheel repair $WHEEL"
        auditwheel repair --wheel-dir "$OUT" "$WHEEL"
    else
        cp "$WHEEL" "$OUT/"
    fi
done

echo "== results"
for WHEEL in "$OUT"/fastattn-*.whl; do
    ls -l "$WHEEL"
    if [[ "$(uname)" == "Linux" ]]; then
        auditwheel show "$WHEEL"
        python - "$WHEEL" <<'PY'
import sys
import zipfile

libs = [n for n in zipfile.ZipFile(sys.argv[1]).namelist() if ".libs/" in n]
print("bundled libraries:", ", ".join(libs) or "none")
if not any("libgomp" in n for n in libs):
    sys.exit("the repaired wheel does not bundle libgomp")
PY
    fi
done
ls -l "$OUT"
