"""The Python versions fastattn says it supports, checked against the code and the packaging.

The package runs on Python >= 3.9: every module under fastattn/ must parse with 3.9's grammar
(``ast.parse(..., feature_version=(3, 9))``: a ``match`` statement or ``except*`` fails) and use
none of the constructs 3.9 parses but cannot run (``X | Y`` of types evaluated at run time,
``zip(strict=)``, ``dataclass(slots=, kw_only=)``, ``int.bit_count``, ``itertools.pairwise``).
pyproject.toml's ``requires-python``, its classifiers, the wheels cibuildwheel builds and the
README's Install section must state the same versions; the README's floors for the ``bench``
extra (torch 2.13, pinned) and the ``test`` extra (transformers >= 5.25) must be those packages'
own ``Requires-Python``.
"""
import ast
import importlib.metadata
import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
PACKAGE = os.path.join(ROOT, "fastattn")
OLDEST = (3, 9)
NEWEST = (3, 13)


def _sources():
    out = []
    for folder, dirs, files in os.walk(PACKAGE):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        out += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".py")]
    return out


def _parse(source, name="<snippet>"):
    return ast.parse(source, name, feature_version=OLDEST)


def _newer_constructs(tree):
    """(line, what) for each construct in `tree` that Python 3.9 parses but cannot run."""
    postponed = any(isinstance(n, ast.ImportFrom) and n.module == "__future__"
                    and any(a.name == "annotations" for a in n.names) for n in tree.body)
    annotations = set()
    if postponed:            # annotations are strings then, never evaluated by the interpreter
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
                    if a is not None and a.annotation is not None:
                        annotations.update(map(id, ast.walk(a.annotation)))
                if node.returns is not None:
                    annotations.update(map(id, ast.walk(node.returns)))
            elif isinstance(node, ast.AnnAssign):
                annotations.update(map(id, ast.walk(node.annotation)))
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr)
                and id(node) not in annotations):
            sides = (node.left, node.right)
            if any(isinstance(s, ast.Constant) and s.value is None for s in sides) or all(
                    isinstance(s, ast.Name) and s.id in _BUILTIN_TYPES for s in sides):
                found.append((node.lineno, "a `X | Y` union of types (3.10)"))
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            keywords = {k.arg for k in node.keywords}
            if name == "zip" and "strict" in keywords:
                found.append((node.lineno, "zip(strict=) (3.10)"))
            if name == "dataclass" and keywords & {"slots", "kw_only", "match_args"}:
                found.append((node.lineno, "dataclass(slots= / kw_only= / match_args=) (3.10)"))
            if name in ("bit_count", "pairwise"):
                found.append((node.lineno, f"{name}() (3.10)"))
        if isinstance(node, ast.ImportFrom) and node.module == "itertools" and any(
                a.name == "pairwise" for a in node.names):
            found.append((node.lineno, "itertools.pairwise (3.10)"))
    return found


_BUILTIN_TYPES = {"int", "float", "str", "bytes", "bool", "list", "tuple", "dict", "set",
                  "frozenset", "complex", "type", "object"}


def test_every_module_parses_as_python_3_9():
    files = _sources()
    assert len(files) > 50, PACKAGE
    errors = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        try:
            _parse(source, path)
        except SyntaxError as e:
            errors.append(f"{os.path.relpath(path, ROOT)}:{e.lineno}: {e.msg}")
    assert not errors, "syntax newer than Python 3.9:\n" + "\n".join(errors)


def test_no_module_uses_what_python_3_9_cannot_run():
    found = []
    for path in _sources():
        with open(path, encoding="utf-8") as f:
            tree = _parse(f.read(), path)
        found += [f"{os.path.relpath(path, ROOT)}:{line}: {what}"
                  for line, what in _newer_constructs(tree)]
    assert not found, "constructs Python 3.9 cannot run:\n" + "\n".join(found)


@pytest.mark.parametrize("snippet", [
    "match x:\n    case 1:\n        pass\n",
    "try:\n    pass\nexcept* ValueError:\n    pass\n",
])
def test_the_grammar_check_rejects_newer_syntax(snippet):
    with pytest.raises(SyntaxError):
        _parse(snippet)


@pytest.mark.parametrize("snippet", [
    "def f(x: int | None): pass\n",
    "y = isinstance(x, int | float)\n",
    "T = None | str\n",
    "for a, b in zip(p, q, strict=True): pass\n",
    "@dataclasses.dataclass(slots=True)\nclass C: pass\n",
    "n = (5).bit_count()\n",
    "from itertools import pairwise\n",
])
def test_the_runtime_check_flags_what_3_9_cannot_run(snippet):
    assert _newer_constructs(_parse(snippet))


def test_postponed_annotations_may_use_unions():
    tree = _parse("from __future__ import annotations\ndef f(x: int | None) -> str | None: pass\n")
    assert not _newer_constructs(tree)


# --- what the packaging and the README state -------------------------------------------------

def _pyproject():
    try:
        import tomllib
    except ModuleNotFoundError:          # Python 3.9 / 3.10 (the wheels' test runs)
        tomllib = pytest.importorskip("tomli")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def _readme():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def _version(text):
    return tuple(int(v) for v in text.split("."))


def _floor(requires_python):
    """(3, 11) from '>=3.11' or '>=3.11.0'."""
    m = re.fullmatch(r"\s*>=\s*(\d+)\.(\d+)(?:\.\d+)?\s*", requires_python or "")
    assert m, f"not a plain lower bound: {requires_python!r}"
    return int(m.group(1)), int(m.group(2))


def _readme_floor(pattern):
    m = re.search(pattern, _readme())
    assert m, f"README.md no longer states {pattern!r}"
    return _version(m.group(1))


def test_requires_python_classifiers_and_wheels_agree():
    project = _pyproject()["project"]
    assert _floor(project["requires-python"]) == OLDEST
    stated = sorted(_version(c.rsplit("::", 1)[1].strip()) for c in project["classifiers"]
                    if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c))
    assert stated == [(3, minor) for minor in range(OLDEST[1], NEWEST[1] + 1)]
    built = _pyproject()["tool"]["cibuildwheel"]["build"].split()
    assert sorted(_version(f"3.{b[3:-2]}") for b in built) == stated, built


def test_readme_states_the_package_floor():
    assert _readme_floor(r"package runs on \*\*Python ≥ (\d+\.\d+)\*\*") == OLDEST
    assert _readme_floor(r"CPython (\d+\.\d+) – \d+\.\d+ wheels") == OLDEST
    assert _readme_floor(r"CPython \d+\.\d+ – (\d+\.\d+) wheels") == NEWEST


def _extra(name):
    return _pyproject()["project"]["optional-dependencies"][name]


def test_readme_states_the_bench_extra_floor():
    """The bench extra pins torch exactly; that release's Requires-Python is the floor."""
    pin = next(r for r in _extra("bench") if r.startswith("torch"))
    version = re.fullmatch(r"torch==([\d.]+)", pin).group(1)
    try:
        installed = importlib.metadata.metadata("torch")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("torch is not installed")
    assert installed["Version"].split("+")[0] == version, "the test extra pins the same torch"
    stated = _readme_floor(r"`bench`\s+extra needs Python ≥ (\d+\.\d+)")
    assert stated == _floor(installed["Requires-Python"])


def test_readme_states_the_test_extra_floor():
    """transformers >= 5.25 (the parity tests' reference) sets the test extra's floor: the
    installed release (pip picks one the running Python can install) states it."""
    assert "transformers>=5.25" in _extra("test")
    try:
        installed = importlib.metadata.metadata("transformers")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("transformers is not installed")
    stated = _readme_floor(r"`test` extra \*\*Python ≥ (\d+\.\d+)\*\*")
    assert stated == _floor(installed["Requires-Python"])
    assert _readme_floor(r"fresh machine with Python ≥ (\d+\.\d+)") == stated
