#!/usr/bin/env bash
# Run the test suite against the installed fastattn (a wheel), never the source tree.
#
# Usage: ci/test_wheels.sh [PROJECT_DIR] [pytest args (absolute test paths)...]
# cibuildwheel calls it as its test-command (`bash {project}/ci/test_wheels.sh {project}`);
# without pytest args it runs all of PROJECT_DIR/tests, slow tests included.
set -euo pipefail

PROJECT=$(cd "${1:-$(dirname "$0")/..}" && pwd)
shift || true

# Leave the checkout: from a temporary directory `import fastattn` can only find the installed package.
WORKDIR=$(mktemp -d)
cd "$WORKDIR"

python - "$PROJECT" <<'PY'
import os
import sys

import fastattn
from fastattn._config import config

project = os.path.realpath(sys.argv[1])
where = os.path.realpath(fastattn.__file__)
print(f"fastattn {fastattn.__version__} imported from {where}")
if where.startswith(project + os.sep):
    sys.exit(f"fastattn was imported from the source tree {project}, not from the installed wheel")
fastattn.show_config()
if not config()["openmp"] and not os.environ.get("FASTATTN_SKIP_OPENMP_TEST"):
    sys.exit("this fastattn was built without OpenMP (set FASTATTN_SKIP_OPENMP_TEST=1 to allow)")
PY

python -m threadpoolctl -i numpy fastattn 2>/dev/null || true
python -m fastattn --version

# tests/ has no __init__.py: pytest puts tests/ (not the checkout) on sys.path
if [[ $# -eq 0 ]]; then
    set -- "$PROJECT/tests"
fi
python -m pytest --rootdir "$PROJECT" -p no:cacheprovider -q "$@"
