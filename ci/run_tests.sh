#!/usr/bin/env bash
# The README's test command, with CI's switches: build with OpenMP or fail, then the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
export FASTATTN_FAIL_NO_OPENMP=1
python -m pip install ".[test]" && pytest tests
# the property tests once more with the workspace cache off: every call allocates exactly its plan
FASTATTN_NO_WORKSPACE_CACHE=1 pytest -q tests/kernels/test_properties.py
