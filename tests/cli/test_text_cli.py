"""`fastattn translate` and `fastattn embed` run as subprocesses: round trips equal to the Python
API, and failures (exit 2, one line on stderr, no traceback, no partial output)."""
import glob
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tests" / "text"))


def run(*args, stdin=None, cwd=None):
    env = dict(os.environ)
    # the checkout under test (the in-place build), wherever pytest runs from
    import fastattn
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(fastattn.__file__)))
    # `python -m` puts the working directory first on sys.path: from a checkout's root that
    # would be the uncompiled source folder, so the child runs in tests/ unless told otherwise
    return subprocess.run([sys.executable, "-m", "fastattn", *map(str, args)], input=stdin,
                          capture_output=True, cwd=cwd or str(ROOT / "tests"), env=env,
                          timeout=600)


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    pytest.importorskip("sentencepiece")
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from text_helpers import make_marian_folder
    path = tmp_path_factory.mktemp("cli_marian")
    make_marian_folder(str(path))
    return path


def _lines(n=25, seed=3):
    from text_helpers import sentences
    return sentences(seed, n) + ["", "kato", "ÉSSS ß é"]


def _assert_failed(r, *fragments):
    err = r.stderr.decode()
    assert r.returncode == 2, err
    assert "Traceback" not in err, err
    last = [ln for ln in err.splitlines() if ln.strip()][-1]
    for f in fragments:
        assert f in last, err


def test_translate_file_round_trip(marian, tmp_path):
    from fastattn import Translator
    lines = _lines()
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    r = run("translate", marian, "--input", src, "--output", out, "--beams", 2,
            "--max-new-tokens", 12, "--batch-size", 4)
    assert r.returncode == 0, r.stderr.decode()
    got = out.read_text(encoding="utf-8").split("\n")
    assert got[-1] == "" and got[:-1] == Translator(marian).translate(
        lines, num_beams=2, max_new_tokens=12)
    assert r.stdout == b""
    # token batches, quiet: the same file
    out2 = tmp_path / "out2.txt"
    r = run("translate", marian, "--input", src, "--output", out2, "--beams", 2,
            "--max-new-tokens", 12, "--max-batch-tokens", 30, "--quiet")
    assert r.returncode == 0 and r.stderr == b""
    assert out2.read_bytes() == out.read_bytes()


def test_translate_stdin_to_stdout(marian):
    from fastattn import Translator
    lines = ["kato mi", "ren su la", "\u00e9"]
    r = run("translate", marian, "--max-new-tokens", 6, stdin="\r\n".join(lines).encode())
    assert r.returncode == 0, r.stderr.decode()
    want = Translator(marian).translate(lines, max_new_tokens=6)
    assert r.stdout.decode("utf-8") == "".join(w + "\n" for w in want)
    assert r.stderr == b""                            # no bar for stdin


def test_translate_progress_bar_for_files(marian, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(_lines(10)), encoding="utf-8")     # no final newline
    r = run("translate", marian, "--input", src, "--output", tmp_path / "o.txt",
            "--max-new-tokens", 3)
    assert r.returncode == 0
    assert b"translate" in r.stderr and b"13" in r.stderr
    assert len((tmp_path / "o.txt").read_text(encoding="utf-8").splitlines()) == 13


def test_int8_round_trips(marian, minilm, tmp_path):
    """--quantize int8 on both commands: what Translator / SentenceEncoder(quantize='int8')
    return."""
    from fastattn import SentenceEncoder, Translator
    lines = _lines(6)
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    r = run("translate", marian, "--input", src, "--output", tmp_path / "o.txt",
            "--max-new-tokens", 4, "--quantize", "int8", "--quiet")
    assert r.returncode == 0, r.stderr.decode()
    want = Translator(marian, quantize="int8").translate(lines, max_new_tokens=4)
    assert (tmp_path / "o.txt").read_text(encoding="utf-8").split("\n")[:-1] == want
    r = run("embed", minilm, "--input", src, "--output", tmp_path / "e.npy", "--quantize",
            "int8", "--quiet")
    assert r.returncode == 0, r.stderr.decode()
    got = np.load(tmp_path / "e.npy")
    assert np.array_equal(got, SentenceEncoder(minilm, quantize="int8").encode(lines))
    assert not np.array_equal(got, SentenceEncoder(minilm).encode(lines))


def test_bf16_embed_round_trip(minilm, tmp_path):
    """--quantize bfloat16: what SentenceEncoder(quantize='bfloat16') returns."""
    from fastattn import SentenceEncoder
    lines = _lines(6)
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    r = run("embed", minilm, "--input", src, "--output", tmp_path / "e.npy", "--quantize",
            "bfloat16", "--quiet")
    assert r.returncode == 0, r.stderr.decode()
    got = np.load(tmp_path / "e.npy")
    assert np.array_equal(got, SentenceEncoder(minilm, quantize="bfloat16").encode(lines))
    assert not np.array_equal(got, SentenceEncoder(minilm).encode(lines))


def test_embed_round_trip(minilm, tmp_path):
    from fastattn import SentenceEncoder
    lines = ["A man is eating food.", "", "Ünïcödé café", "x " * 400]
    src = tmp_path / "s.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "e.npy"
    r = run("embed", minilm, "--input", src, "--output", out, "--batch-size", 2, "--quiet")
    assert r.returncode == 0, r.stderr.decode()
    got = np.load(out)
    assert got.dtype == np.float32 and got.shape == (4, 384)
    assert np.array_equal(got, SentenceEncoder(minilm).encode(lines))


@pytest.mark.parametrize("case", ["stacked", "residual", "truncated", "prompt"])
def test_embed_dense_folders(dense_folders, tmp_path, case):
    """sentence-transformers folders with Dense modules (tests/text/dense_folders.py; compared
    with SentenceTransformer.encode in tests/text/test_sentence_encoder_dense.py): the command
    gives SentenceEncoder's bits, the last module's width."""
    from dense_folders import SENTENCES

    from fastattn import SentenceEncoder
    src = tmp_path / "s.txt"
    src.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    out = tmp_path / "e.npy"
    r = run("embed", dense_folders[case], "--input", src, "--output", out, "--batch-size", 3,
            "--quiet")
    assert r.returncode == 0, r.stderr.decode()
    enc = SentenceEncoder(dense_folders[case])
    got = np.load(out)
    assert got.shape == (len(SENTENCES), enc.dim) and enc.dim != enc.model.hidden_size
    assert np.array_equal(got, enc.encode(SENTENCES))


@pytest.mark.parametrize("case", ["missing_folder", "not_a_model", "wrong_type", "no_input",
                                  "not_utf8", "bad_output_folder", "int4", "bad_lang",
                                  "bad_batch"])
def test_translate_failures(marian, minilm, tmp_path, case):
    src = tmp_path / "in.txt"
    src.write_text("kato\nmi\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    model, extra, frags = marian, [], []
    if case == "missing_folder":
        model, frags = tmp_path / "nope", ["model folder not found"]
    elif case == "not_a_model":
        model, frags = tmp_path, ["model config not found", "config.json"]
    elif case == "wrong_type":
        model, frags = minilm, ["model_type='bert' is not a translation model"]
    elif case == "no_input":
        src, frags = tmp_path / "missing.txt", ["cannot read", "missing.txt"]
    elif case == "not_utf8":
        src.write_bytes(b"kato\n\xff\xfe\xfd\n")
        frags = ["is not UTF-8 text"]
    elif case == "bad_output_folder":
        out, frags = tmp_path / "no" / "out.txt", ["cannot write", "does not exist"]
    elif case == "int4":
        extra, frags = ["--quantize", "int4"], ["argument --quantize: invalid choice: 'int4'"]
    elif case == "bad_lang":
        extra, frags = ["--tgt-lang", "fr"], ["tgt_lang='fr'", "no target language codes"]
    elif case == "bad_batch":
        extra, frags = ["--batch-size", "0"], ["argument --batch-size: expected a positive"]
    r = run("translate", model, "--input", src, "--output", out, "--max-new-tokens", 3, *extra)
    _assert_failed(r, *frags)
    assert not out.exists()
    assert not glob.glob(str(tmp_path / ".fastattn-*"))


def test_failure_mid_file_leaves_no_output(marian, tmp_path):
    """A decoding error after some lines were translated: the output is not written."""
    src = tmp_path / "in.txt"
    good = "\n".join(_lines(200)) + "\n"
    src.write_bytes(good.encode() * 5 + b"\xff oops\n")
    out = tmp_path / "out.txt"
    r = run("translate", marian, "--input", src, "--output", out, "--max-new-tokens", 2,
            "--batch-size", 2)
    _assert_failed(r, "not UTF-8 text")
    assert not out.exists() and not glob.glob(str(tmp_path / ".fastattn-*"))


@pytest.mark.parametrize("case", ["wrong_type", "no_input", "missing_output_arg"])
def test_embed_failures(marian, minilm, tmp_path, case):
    src = tmp_path / "in.txt"
    src.write_text("a\nb\n", encoding="utf-8")
    out = tmp_path / "e.npy"
    args = ["embed", minilm, "--input", src, "--output", out]
    frags = []
    if case == "wrong_type":
        args[1], frags = marian, ["is a translation model: use fastattn.Translator"]
    elif case == "no_input":
        args[3], frags = tmp_path / "missing.txt", ["cannot read"]
    elif case == "missing_output_arg":
        args, frags = args[:4], ["the following arguments are required: --output"]
    r = run(*args)
    _assert_failed(r, *frags)
    assert not out.exists()
    assert not glob.glob(str(tmp_path / ".fastattn-*"))


def test_help_lists_the_commands():
    r = run("--help")
    assert r.returncode == 0
    assert b"translate" in r.stdout and b"embed" in r.stdout
