#!/usr/bin/env bash
# The README's test command, with CI's switches: build with OpenMP or fail, then the whole suite.
# Every skipped test is listed at the end of each pytest run; a skip whose reason
# ci/expected_skips.txt does not allow fails the run (tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
export FASTATTN_FAIL_NO_OPENMP=1
export FASTATTN_CI_EXPECTED_SKIPS="$PWD/ci/expected_skips.txt"
# `|| exit`: set -e does not stop at a failure of the first command of an && list. Any nonzero
# status fails, pytest's 5 ("no tests collected") included.
python -m pip install ".[test]" && pytest --durations=25 tests || { rc=$?; echo "run_tests: FAILED (exit $rc)"; exit $rc; }
# the property tests once more with the workspace cache off: every call allocates exactly its plan
FASTATTN_NO_WORKSPACE_CACHE=1 pytest -q tests/kernels/test_properties.py
