"""The version lives in fastattn/_version.py only; everything else reads it from there."""
import io
import re
import subprocess
import sys
from pathlib import Path

import fastattn
from fastattn import __main__ as cli

ROOT = Path(__file__).resolve().parent.parent


def _source_version():
    # the installed package's _version.py: the single source of truth
    text = Path(fastattn.__file__).with_name("_version.py").read_text()
    (version,) = re.findall(r'^__version__ = "([^"]+)"$', text, re.M)
    return version


def test_dunder_version():
    v = _source_version()
    assert fastattn.__version__ == v
    assert re.fullmatch(r"\d+\.\d+\.\d+([.-]?(a|b|rc|dev|post)\d*)*", v), v


def test_show_config_reports_version():
    buf = io.StringIO()
    fastattn.show_config(file=buf)
    assert re.search(rf"version\s+:\s+{re.escape(fastattn.__version__)}$", buf.getvalue(), re.M)
    assert fastattn._config.config()["version"] == fastattn.__version__


def test_cli_version(capsys):
    try:
        cli.main(["--version"])
    except SystemExit as exc:
        assert exc.code == 0
    assert capsys.readouterr().out.strip() == f"fastattn {fastattn.__version__}"


def test_python_m_fastattn_version(tmp_path):
    r = subprocess.run([sys.executable, "-m", "fastattn", "--version"], capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"fastattn {fastattn.__version__}"


def test_version_declared_once():
    """Only _version.py spells the version; setup.py reads it and pyproject declares it dynamic."""
    if not (ROOT / "setup.py").exists():
        return  # testing an installed wheel without its sources
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'dynamic\s*=\s*\[[^\]]*"version"', pyproject)
    assert not re.search(r"^version\s*=", pyproject, re.M)
    assert "_version.py" in (ROOT / "setup.py").read_text()
    v = fastattn.__version__
    for path in ["setup.py", "pyproject.toml", "fastattn/__init__.py"]:
        assert f'"{v}"' not in (ROOT / path).read_text(), f"{path} repeats the version {v}"
