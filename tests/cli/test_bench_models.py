"""`fastattn bench --models` end to end on tiny checkpoints (the same pipeline as the base-size
run: checkpoints written with NumPy, one child process per system, outputs compared with
transformers', tables, JSON, plot); no timing asserts."""
import json

import pytest

from fastattn.__main__ import main
from fastattn.benchmark import _cli


@pytest.mark.whole_model
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
    _check_int8_rows(runs, text)
    if png is not None:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _check_int8_rows(runs, text):
    """The int8 systems: each timed in its child, its outputs compared with its own float32
    system's; fastattn int8 either measured or skipped with the line the benches print."""
    for model in ("marian", "encoder"):
        fa8 = runs[model]["fastattn-int8"]
        if not fa8["rows"]:
            assert fa8["skipped"].startswith("fastattn int8: not available in this build")
            assert "fastattn int8: not available in this build" in text
        for r in fa8["rows"]:
            assert r["samples_s"] and r["vs_float32"]
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return
    for r in runs["marian"]["ctranslate2-int8"]["rows"]:
        n, of = map(int, r["vs_float32"].split()[0].split("/"))
        assert of > 0
        assert n > of // 2, r          # int8 may change a few greedy / beam tokens, not most
    for system in ("ctranslate2-int8", "onnxruntime-int8"):
        rows = runs["encoder"][system]["rows"]
        if system == "onnxruntime-int8" and not rows:
            assert "onnx" in runs["encoder"][system]["skipped"].lower()
            continue
        assert len(rows) == 2
        # quantized (not the float32 graph), and near it: how near is the peer's own arithmetic
        # (CTranslate2 int8's largest difference on this random encoder: < 0.5 on AVX-512 VNNI
        # hosts, 1.3 on a Zen 3 without VNNI)
        bound = 4.0 if system == "ctranslate2-int8" else 0.5
        for r in rows:
            diff = float(r["vs_float32"].split()[-1])
            assert 1e-4 < diff < bound, (system, r)


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
