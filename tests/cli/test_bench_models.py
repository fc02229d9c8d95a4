"""`fastattn bench --models` end to end on tiny checkpoints (the same pipeline as the base-size
run: checkpoints written with NumPy, one child process per system, outputs compared with
transformers', tables, JSON, plot); no timing asserts."""
import json

import pytest

from fastattn.__main__ import main
from fastattn.benchmark import _cli


def test_bench_models_tiny(tmp_path, capsys):
    pytest.importorskip("safetensors")
    out_json, png = tmp_path / "m.json", tmp_path / "m.png"
    argv = ["bench", "--models", "--models-tiny", "--models-dir", str(tmp_path / "work"),
            "--repeats", "1", "--threads", "1", "--no-progress", "--json", str(out_json)]
    try:
        import matplotlib  # noqa: F401
        argv += ["--plot", str(png)]
    except ImportError:
        png = None
    assert main(argv) == 0
    text = capsys.readouterr().out
    data = json.loads(out_json.read_text())
    runs = data["models"]["models"]
    assert set(runs) == {"marian", "encoder"}
    fa = runs["marian"]["fastattn"]
    assert [r["work"] for r in fa["rows"]] == ["greedy 8x128->64", "beam 4, 8x128->64",
                                              "greedy 1x128->64"]
    assert all(r["samples_s"] and r["median_ms"] > 0 for r in fa["rows"])
    assert "onnxruntime" in runs["marian"] and "KV cache" in runs["marian"]["onnxruntime"]["skipped"]
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return
    for r in fa["rows"]:                       # the same tokens as transformers
        n, of = r["vs_transformers"].split()[0].split("/")
        assert n == of, r
    for r in runs["encoder"]["fastattn"]["rows"]:
        assert float(r["vs_transformers"].split()[-1]) < 1e-4
    assert "Marian base" in text and "MiniLM-shaped BERT" in text and "fastattn speed-up" in text
    if png is not None:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_default_run_includes_models_only_when_not_narrowed():
    parser = _cli.add_arguments(__import__("argparse").ArgumentParser())
    assert _cli._with_models(parser.parse_args([]))
    for argv in (["--shapes", "1x2x16x16x8"], ["--systems", "fastattn"], ["--causal"],
                 ["--dtype", "float64"], ["--no-models"]):
        assert not _cli._with_models(parser.parse_args(argv)), argv


def test_models_and_no_models_contradict(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--models", "--no-models"])
    assert exc.value.code == 2
    assert "contradict" in capsys.readouterr().err
