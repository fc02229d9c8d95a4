"""Print one of pyproject.toml's requirement lists, one requirement a line, for `pip install -r`.

    python ci/requirements.py build-system   # [build-system] requires (what setup.py imports)
    python ci/requirements.py test           # [project] dependencies + the `test` extra

pyproject.toml stays the only copy of these lists: CI steps that build or test outside
`pip install ".[test]"` (the sanitizer's in-place build) install what this prints.
"""
import sys
from pathlib import Path

try:
    import tomllib  # Python 3.11+
except ModuleNotFoundError:  # Python 3.9 / 3.10
    try:
        import tomli as tomllib
    except ModuleNotFoundError:
        sys.exit("ci/requirements.py: Python < 3.11 needs tomli to read pyproject.toml "
                 "(python -m pip install tomli)")

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def requirements(which):
    data = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
    if which == "build-system":
        return list(data["build-system"]["requires"])
    project = data["project"]
    return list(project.get("dependencies", [])) + list(project["optional-dependencies"][which])


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print("\n".join(requirements(sys.argv[1])))
