#!/usr/bin/env bash
# Build fastattn's extension with AddressSanitizer + UndefinedBehaviorSanitizer (debug Cython
# directives, bounds checks on, -O1 -g: AddressSanitizer's recommended level; at -O0 the tests
# take ~1.4x as long, FASTATTN_DEBUG_OPT=-O0 to have it) in a throw-away COPY of this checkout,
# run the test suite
# against that build, and fail on any sanitizer report. It first installs what it needs into the
# environment of $PYTHON (default: python): pyproject.toml's [build-system] requires for the
# in-place build and the test extra's packages for the run (ci/requirements.py reads both lists).
#
#   ci/sanitize.sh                 # the suite (slow tests included), CI sizes
#   SANITIZE_PYTEST_ARGS="tests/test_hostile.py -x" ci/sanitize.sh   # a subset
#   KEEP_SANITIZE_DIR=1 ci/sanitize.sh                               # keep the copy for debugging
#   SANITIZE_STEP=build ci/sanitize.sh; ...; SANITIZE_STEP=test ci/sanitize.sh
#       # CI: the build (steps 0-2) during the install, the tests (step 3) beside the suite;
#       # the copy lives in $SANITIZE_DIR (default ${TMPDIR:-/tmp}/fastattn-sanitize-ci)
#
# Sizes for the heavy randomised tests are lowered (the sanitized build is ~10-30x slower):
# FASTATTN_HYPOTHESIS_EXAMPLES, FASTATTN_FUZZ_CASES, FASTATTN_MEMORY_CALLS (override from the
# environment). Budget: the build ~7 minutes, the tests under ~25 minutes on 2 cores. As in ci/run_tests.sh, every skip is listed and
# one that ci/expected_skips.txt does not allow fails the run (FASTATTN_CI_EXPECTED_SKIPS= turns
# that off).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python}"
STEP="${SANITIZE_STEP:-all}"
case "$STEP" in
    all) WORK="$(mktemp -d "${TMPDIR:-/tmp}/fastattn-sanitize.XXXXXX")" ;;
    build) WORK="${SANITIZE_DIR:-${TMPDIR:-/tmp}/fastattn-sanitize-ci}"; rm -rf "$WORK"
           mkdir -p "$WORK" ;;
    test) WORK="${SANITIZE_DIR:-${TMPDIR:-/tmp}/fastattn-sanitize-ci}"
          [[ -f "$WORK/built" ]] || { echo "sanitize: no build in $WORK (SANITIZE_STEP=build first)"
                                      exit 2; } ;;
    *) echo "sanitize: SANITIZE_STEP must be all, build or test, got '$STEP'"; exit 2 ;;
esac
LOG="${SANITIZE_LOG:-${TMPDIR:-/tmp}/fastattn-sanitize-pytest.log}"   # kept after the run
cleanup() {
    if [[ "$STEP" == build ]]; then return; fi          # the test step uses the copy
    if [[ -z "${KEEP_SANITIZE_DIR:-}" ]]; then rm -rf "$WORK"; else echo "sanitize: kept $WORK"; fi
}
trap cleanup EXIT
start=$(date +%s)
if [[ "$STEP" != test ]]; then

# 0. the requirements, from pyproject.toml (its only copy): [build-system] requires -- setup.py
# imports Cython, setuptools and numpy -- and the packages of the test extra (not fastattn itself:
# the tests import the sanitized copy)
# SANITIZE_NO_INSTALL=1: the caller has installed them (.ci/run: the build requirements before
# this build, the test extra beside it -- two pip runs must not write one environment at once)
if [[ -z "${SANITIZE_NO_INSTALL:-}" ]]; then
"$PY" -c "import tomllib" 2>/dev/null || "$PY" -m pip install -q tomli   # Python < 3.11
{ "$PY" "$REPO/ci/requirements.py" build-system && "$PY" "$REPO/ci/requirements.py" test; } \
    > "$WORK/requirements.txt"
echo "sanitize: installing into $("$PY" -c 'import sys; print(sys.prefix)'):" \
    "$(tr '\n' ' ' < "$WORK/requirements.txt")"
"$PY" -m pip install -q -r "$WORK/requirements.txt" \
    || { echo "sanitize: INSTALLING THE REQUIREMENTS FAILED"; exit 2; }
fi

# 1. a copy of the working tree (tracked + untracked-but-not-ignored files), without build outputs
echo "sanitize: copying $REPO -> $WORK/src"
mkdir -p "$WORK/src"
(cd "$REPO" && git ls-files -co --exclude-standard -z | xargs -0 -I{} sh -c 'test -e "{}" && printf "%s\0" "{}"' \
    | tar --null -T - -cf -) | tar -C "$WORK/src" -xf -
rm -f "$WORK/src/fastattn/_kernels/_attention.c" "$WORK/src"/fastattn/_kernels/*.so
cd "$WORK/src"

# 2. the sanitized debug build (the generated C is regenerated: the debug directives differ)
SAN_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
export FASTATTN_DEBUG_OPT="${FASTATTN_DEBUG_OPT:--O1}"
echo "sanitize: building with FASTATTN_DEBUG=1 FASTATTN_DEBUG_OPT=$FASTATTN_DEBUG_OPT" \
     "FASTATTN_SANITIZE=\"$SAN_FLAGS\""
FASTATTN_DEBUG=1 FASTATTN_SANITIZE="$SAN_FLAGS" "$PY" setup.py -q build_ext --inplace \
    -j "${SANITIZE_BUILD_JOBS:-2}" \
    > "$WORK/build.log" 2>&1 || { tail -50 "$WORK/build.log"; echo "sanitize: BUILD FAILED"; exit 2; }
grep -E "^fastattn: OpenMP" "$WORK/build.log" || true
build_end=$(date +%s)
echo "sanitize: build took $((build_end - start)) s"
touch "$WORK/built"
if [[ "$STEP" == build ]]; then echo "sanitize: built in $WORK"; exit 0; fi
else
    cd "$WORK/src"
    build_end=$start
fi

LIBASAN="$(gcc -print-file-name=libasan.so)"
if [[ ! -e "$LIBASAN" ]]; then echo "sanitize: libasan.so not found ($LIBASAN)"; exit 2; fi

# 3. run the tests against the copy. abort_on_error: a report kills the process by SIGABRT, so
# the fuzz harness (child processes) sees it as a death by signal as well.
# libstdc++ preloaded too: otherwise ASan's __cxa_throw interceptor finds no real function in
# this C program and C++ extensions that throw (matplotlib's ft2font, torch) abort at once
LIBSTDCXX="$(gcc -print-file-name=libstdc++.so)"
export LD_PRELOAD="$LIBASAN${LIBSTDCXX:+ $LIBSTDCXX}"
# Reports go to files (pytest's fd capture would swallow them when the process aborts); every
# process of the run, fuzz children included, writes there.
REPORTS="${SANITIZE_REPORTS:-${TMPDIR:-/tmp}/fastattn-sanitize-reports}"
rm -rf "$REPORTS"
mkdir -p "$REPORTS"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:allocator_may_return_null=1:log_path=$REPORTS/asan:${ASAN_OPTIONS_EXTRA:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:abort_on_error=1:log_path=$REPORTS/ubsan"
export PYTHONPATH="$WORK/src"
export PYTHONMALLOC=malloc            # let ASan see every Python-side allocation too
export FASTATTN_SANITIZED=1           # tests that lower RLIMIT_AS skip themselves (ASan reserves TBs)
export FASTATTN_HYPOTHESIS_EXAMPLES="${FASTATTN_HYPOTHESIS_EXAMPLES:-25}"
export FASTATTN_FUZZ_CASES="${FASTATTN_FUZZ_CASES:-600}"
export FASTATTN_MEMORY_CALLS="${FASTATTN_MEMORY_CALLS:-2000}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
# CI runs this beside the ordinary suite on 2 cores: threads that sleep at a barrier instead of
# spinning leave the core to the other run (results are the same bits either way)
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
# every call allocates exactly its plan: an overrun is reported at its first byte
export FASTATTN_NO_WORKSPACE_CACHE=1
export FASTATTN_CI_EXPECTED_SKIPS="${FASTATTN_CI_EXPECTED_SKIPS-$REPO/ci/expected_skips.txt}"

"$PY" - <<'PYEOF'
import os, fastattn
from fastattn._build_info import BUILD_INFO
where = os.path.dirname(fastattn.__file__)
assert where.startswith(os.environ["PYTHONPATH"]), f"imported fastattn from {where}, not the sanitized copy"
assert "-fsanitize=address,undefined" in " ".join(BUILD_INFO["compile_flags"]), BUILD_INFO
print("sanitize: fastattn from", where, "flags", " ".join(BUILD_INFO["compile_flags"]))
PYEOF

# shellcheck disable=SC2086
set +e
# What this run leaves to the ordinary suite (CI's budget: it runs beside that suite on 2
# cores) -- Python layers over the native paths that the rest runs here, and runs whose cost
# is more data through the same kernels:
#   tests/dask, tests/text/test_dask_text.py   LocalClusters of sanitized worker processes
#   tests/test_wheel.py                        an ordinary wheel, built and tested in subprocesses
#   tests/compat, tests/text/test_argos.py     adapters, with the peers' own runs as references
#   tests/serve, tests/cli                     HTTP, WebSocket and the command line over the
#                                              models (their hostile inputs: tests/models, kernels)
#   tests/audio/test_transcriber.py, test_longform_robust.py, test_live.py
#                                              the window logic over WhisperModel (its encoder,
#                                              decoder, batches and threads: tests/models)
#   tests/test_imports.py, test_python_support.py   static checks of the sources
#   -m "not whole_model"                       parity runs of a trained or real Whisper, and the
#                                              long form over minutes of audio (pyproject.toml)
# Every native path still runs here: kernels, workspaces and their fresh-process first calls,
# the portable attention and GEMM, the models' loads, decodes and hostile inputs, the features,
# the readers.
"$PY" -m pytest -p no:cacheprovider -q --durations=40 \
    ${SANITIZE_PYTEST_ARGS:-tests --ignore=tests/dask --ignore=tests/test_wheel.py \
        --ignore=tests/compat --ignore=tests/audio/test_live.py \
        --ignore=tests/text/test_argos.py --ignore=tests/text/test_dask_text.py \
        --ignore=tests/test_imports.py --ignore=tests/test_python_support.py \
        --ignore=tests/serve --ignore=tests/cli --ignore=tests/audio/test_transcriber.py \
        --ignore=tests/audio/test_longform_robust.py \
        -m "not whole_model"} > "$LOG" 2>&1
rc=$?
set -e
end=$(date +%s)
grep -E "passed|failed|error" "$LOG" | grep -vE "^(expected  |UNEXPECTED) " | tail -3
# the skipped tests (tests/conftest.py's list), with the rest of the summary
# (`|| true`: head closing the pipe early is a SIGPIPE for sed, which pipefail would turn into
# this script's failure)
sed -n '/^=* skipped: [0-9]/,$p' "$LOG" | head -80 || true
# the slowest tests under the sanitizer (what to look at when this step grows)
sed -n '/slowest [0-9]* durations/,/^=* short test summary/p' "$LOG" | head -42 || true
if [[ $rc -ne 0 ]]; then echo "---- last 120 lines of $LOG"; tail -120 "$LOG"; fi
PATTERN="ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:|CHECK failed|SUMMARY: UndefinedBehaviorSanitizer"
in_log=$(grep -cE "$PATTERN" "$LOG" || true)
files=$(find "$REPORTS" -type f | wc -l)
bad_files=$(grep -lE "$PATTERN" "$REPORTS"/* 2>/dev/null || true)
n_bad=$(printf "%s" "$bad_files" | grep -c . || true)
echo "sanitize: pytest exit $rc; sanitizer error reports: $n_bad file(s) in $REPORTS, $in_log in the log" \
     "($files report file(s) in all: warnings such as the deliberate failed huge allocations" \
     "of the MemoryError tests are not errors); tests took $((end - build_end)) s, total $((end - start)) s"
if [[ "$n_bad" != "0" || "$in_log" != "0" ]]; then
    for fr in $bad_files; do echo "---- $fr"; head -80 "$fr"; done
    grep -nE -A30 "$PATTERN" "$LOG" | head -60 || true
    echo "sanitize: FAILED (sanitizer report)"
    exit 1
fi
if [[ $rc -ne 0 ]]; then echo "sanitize: FAILED (pytest exit $rc)"; exit 1; fi
echo "sanitize: CLEAN"
