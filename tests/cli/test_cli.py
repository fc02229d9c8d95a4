"""The `fastattn` command: argument errors, `info`, and small real `bench` runs (no timing asserts)."""
import argparse
import json
import math
import shutil
import subprocess
import sys

import numpy as np
import pytest

import fastattn
from fastattn import benchmark
from fastattn.__main__ import main
from fastattn.benchmark import _measure

TINY = "1x2x16x16x8"


@pytest.fixture(autouse=True)
def fast_settings(monkeypatch):
    # pauses, warm-up and sample lengths matter for timing, not for what these tests check;
    # they live in _measure, which is where every reader (run_bench included) looks them up
    monkeypatch.setattr(_measure, "SLEEP_BETWEEN_SYSTEMS", 0.0)
    tiny = dict(max_repeats=3, min_repeats=1, budget=0.0, sample=0.0, warmup=0.0, peak_n=128)
    monkeypatch.setattr(_measure, "FULL", tiny)
    monkeypatch.setattr(_measure, "QUICK", tiny)


def _exit_code(argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return exc.value.code


# --- parsing ------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, dims", [
    ("1x8x2048x2048x64", (1, 8, 2048, 2048, 64)),
    ("2x4x128x64", (2, 4, 128, 128, 64)),        # BxHxLxE: S = L
    (" 16X8x1x2048x64 ", (16, 8, 1, 2048, 64)),
    ("1×8×256×4096×64", (1, 8, 256, 4096, 64)),
])
def test_parse_shape(text, dims):
    shape = benchmark.parse_shape(text)
    assert tuple(shape) == dims
    assert (shape.B, shape.H, shape.L, shape.S, shape.E) == dims
    assert str(shape) == "x".join(map(str, dims))


@pytest.mark.parametrize("text", ["1x8x12", "1x8x0x4x4", "axbxcxdxe", "1x2x3x4x5x6", "", "1x-2x3x4"])
def test_parse_shape_rejects(text):
    with pytest.raises(Exception, match="malformed shape"):
        benchmark.parse_shape(text)


@pytest.mark.parametrize("argv, message", [
    (["bench", "--shapes", "1x8x12"], "malformed shape '1x8x12'"),
    (["bench", "--shapes", "1x8x64x64x0"], "malformed shape"),
    (["bench", "--threads", "0"], "positive integer"),
    (["bench", "--dtype", "float16"], "invalid choice"),
    (["bench", "--systems", "fastattn,tensorflow"], "unknown system(s) tensorflow"),
    (["bench", "--no-such-option"], "unrecognized arguments: --no-such-option"),
    (["frobnicate"], "invalid choice"),
    ([], "required"),
])
def test_usage_errors(capsys, argv, message):
    assert _exit_code(argv) == 2
    assert message in capsys.readouterr().err


def test_refuses_shape_that_does_not_fit_before_allocating(capsys):
    assert _exit_code(["bench", "--shapes", "64x64x65536x65536x128", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "64x64x65536x65536x128" in err and "GiB" in err and "available" in err


def test_counts():
    Shape = benchmark.Shape
    assert benchmark.flop_count(Shape((1, 8, 2048, 2048, 64)), False) == 4 * 8 * 2048 ** 2 * 64
    # causal, top-left: query i sees keys 0..i
    assert benchmark.allowed_pairs(4, 4, True) == 10
    assert benchmark.allowed_pairs(2, 5, True) == 3
    assert benchmark.allowed_pairs(5, 2, True) == 3 + 3 * 2
    n = 2048
    assert math.isclose(benchmark.flop_count(Shape((1, 8, n, n, 64)), True),
                        0.5 * benchmark.flop_count(Shape((1, 8, n, n, 64)), False), rel_tol=1e-3)


def test_plan_skips_score_matrices(monkeypatch):
    parser = benchmark.add_arguments(argparse.ArgumentParser())
    big = "1x8x8192x8192x64"  # 2 GiB of float32 scores
    args = parser.parse_args(["--quick", "--shapes", big])
    _, skips = _measure._plan(args, parser.error)
    shape = benchmark.parse_shape(big)
    assert "--quick" in skips[(shape, "numpy")] and "GiB" in skips[(shape, "numpy")]
    assert (shape, "fastattn") not in skips
    # with 2 GiB available the scores do not fit, the inputs do: NumPy is skipped, not the shape
    monkeypatch.setattr(_measure, "available_memory", lambda: 2 << 30)
    args = parser.parse_args(["--shapes", big])
    _, skips = _measure._plan(args, parser.error)
    assert "available" in skips[(shape, "numpy")] and "ort-graph" in {s for _, s in skips}


@pytest.mark.parametrize("causal", [False, True])
def test_numpy_formula_matches_reference(causal):
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 3, n, 8)) for n in (9, 9, 9))
    forbid = np.triu(np.ones((9, 9), bool), 1) if causal else None
    got = benchmark.numpy_attention(q, k, v, 1 / np.sqrt(8), forbid)
    s = np.einsum("bhle,bhse->bhls", q, k) / np.sqrt(8)
    if causal:
        s = np.where(forbid, -np.inf, s)
    w = np.exp(s - s.max(-1, keepdims=True))
    ref = np.einsum("bhls,bhse->bhle", w / w.sum(-1, keepdims=True), v)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


# --- info ---------------------------------------------------------------------------------------

def test_info(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "fastattn configuration" in out
    assert f"version       : {fastattn.__version__}" in out
    assert "openmp" in out and "CPU" in out and "threadpools" in out


# --- bench --------------------------------------------------------------------------------------

def _bench_json(tmp_path, capsys, *extra):
    path = tmp_path / "out.json"
    argv = ["bench", "--shapes", f"{TINY},2x2x5x33x16", "--repeats", "2", "--no-progress",
            "--json", str(path), *extra]
    assert main(argv) == 0
    out = capsys.readouterr().out
    return json.loads(path.read_text()), out


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("causal", [False, True])
def test_bench_fastattn_vs_numpy(tmp_path, capsys, dtype, causal):
    extra = ["--systems", "fastattn,numpy", "--dtype", dtype] + (["--causal"] if causal else [])
    data, out = _bench_json(tmp_path, capsys, *extra)
    rows = data["rows"]
    assert {(r["shape"], r["system"]) for r in rows} == {
        (s, n) for s in (TINY, "2x2x5x33x16") for n in ("fastattn", "numpy")}
    for r in rows:
        assert r["causal"] is causal
        assert len(r["samples_ms"]) >= 1 and r["min_ms"] <= r["median_ms"]
        assert r["gflops"] > 0 and r["share_of_peak"] > 0
        assert r["check_ok"], r
        if r["system"] == "fastattn":
            assert r["reference"] == "numpy" and r["max_abs_err"] < (1e-5 if dtype == "float32" else 1e-12)
        assert r["speedup_vs_numpy"] > 0
    numpy_rows = [r for r in rows if r["system"] == "numpy"]
    assert all(r["speedup_vs_numpy"] == 1.0 for r in numpy_rows)
    assert data["settings"]["dtype"] == dtype and data["settings"]["threads"] == 2
    assert data["peak"]["gflops"] > 0 and "GEMM" in data["peak"]["method"]
    # the report: environment header, summary and detail tables
    assert "fastattn configuration" in out and "peak      :" in out
    assert "| shape BxHxLxSxE" in out and "NumPy formula" in out and "% peak" in out
    assert ("2x2x5x33x16 causal" in out) is causal


def test_bench_peers(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    data, out = _bench_json(tmp_path, capsys)
    systems = {r["system"] for r in data["rows"]}
    assert systems == set(benchmark.SYSTEMS), (systems, data["skipped"])
    for r in data["rows"]:
        assert r["check_ok"], r  # every peer computes the same attention
    assert "PyTorch SDPA" in out and "ORT MultiHeadAttention" in out


def test_bench_peers_causal_float64(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    data, out = _bench_json(tmp_path, capsys, "--causal", "--dtype", "float64")
    by = {(r["shape"], r["system"]): r for r in data["rows"]}
    assert all(r["check_ok"] for r in data["rows"]), data["rows"]
    assert (TINY, "torch") in by and (TINY, "ort-graph") in by
    assert any(s["system"] == "ort-mha" and "float64" in s["reason"] for s in data["skipped"])
    assert "Skipped:" in out


def test_bench_missing_peer_is_skipped(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    data, out = _bench_json(tmp_path, capsys, "--systems", "fastattn,torch")
    assert {r["system"] for r in data["rows"]} == {"fastattn"}
    assert any(s["system"] == "torch" and "not installed" in s["reason"] for s in data["skipped"])
    assert "PyTorch is not installed" in out


def test_bench_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "bench.png"
    assert main(["bench", "--shapes", "1x2x16x16x8,1x2x32x32x8", "--systems", "fastattn,numpy",
                 "--repeats", "1", "--no-progress", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {png}" in capsys.readouterr().out


def test_bench_plot_without_matplotlib(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    png = tmp_path / "bench.png"
    assert _exit_code(["bench", "--shapes", TINY, "--no-progress", "--plot", str(png)]) == 2
    assert "--plot needs matplotlib" in capsys.readouterr().err
    assert not png.exists()


def test_progress_goes_to_stderr(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # the built-in bar
    assert main(["bench", "--shapes", TINY, "--systems", "fastattn", "--repeats", "1"]) == 0
    cap = capsys.readouterr()
    assert "[" in cap.err and "1x2x16x16x8" in cap.err
    assert "| shape" in cap.out and "####" not in cap.out


def test_console_script(tmp_path):
    exe = shutil.which("fastattn")
    if exe is None:
        pytest.skip("the fastattn console script is not on PATH")
    r = subprocess.run([exe, "bench", "--shapes", "1x8x12"], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 2 and "malformed shape" in r.stderr


def test_bench_module(tmp_path):
    """`python -m fastattn bench` in a fresh interpreter runs and prints the markdown table."""
    r = subprocess.run([sys.executable, "-m", "fastattn", "bench", "--shapes", TINY, "--systems",
                        "fastattn", "--repeats", "1", "--no-progress"], capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "| shape BxHxLxSxE" in r.stdout
