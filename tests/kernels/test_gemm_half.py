"""Binary16 panels (fastattn/_ops.py's _HALF_PANELS, gemm_tile.h's GM_HALF): a float32 weight
whose values are all binary16 numbers is packed as binary16 where the kernel set widens it as
it loads (AVX2 with F16C, AVX-512). The claim is exact: the same bits as the float32 panels of
the same values, for every shape, epilogue and thread count, and within the float64 bound of
tests/kernels/test_gemm.py. Weights that are not all binary16 numbers keep float32 panels.
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from fastattn import _ops
from fastattn._kernels import _gemm as _g
from fastattn._kernels import _simd
from test_gemm import ACTS, FASTATTN_ROOT, TESTS, _check

HALF_SETS = {"avx2", "avx512"}          # the kernel sets with binary16 panels
F16C = "f16c" in _simd.cpu_features(capped=True)
SHAPES = [(1, 1, 1), (5, 2000, 384), (7, 17, 5), (13, 70, 129), (97, 65, 257), (6, 64, 128),
          (193, 130, 600), (4, 4099, 1030), (300, 257, 64)]


def _half_data(rng, M, N, K):
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float16).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    return x, w, b


def _both(monkeypatch, make):
    """make() with binary16 panels allowed, then with float32 panels only."""
    monkeypatch.setattr(_ops, "_HALF_PANELS", True)
    a = make()
    monkeypatch.setattr(_ops, "_HALF_PANELS", False)
    b = make()
    return a, b


def _same(a, b):
    assert a.dtype == b.dtype == np.float32 and a.shape == b.shape
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_half_panels_where_the_set_has_them(isa):
    want = isa == "avx512" or (isa == "avx2" and F16C)
    assert _g.half_panels() == want
    w = np.float32([[1.0, -0.0, 2.0 ** -24, 65504.0]])        # binary16 numbers, a subnormal
    assert _ops._Packed(w).half == want
    assert not _ops._Packed(w.astype(np.float64)).half        # float64 never


@pytest.mark.parametrize("M,N,K", SHAPES)
def test_bitwise_the_float_panels_for_every_epilogue(isa, rng, monkeypatch, M, N, K):
    x, w, b = _half_data(rng, M, N, K)
    res = rng.standard_normal((M, N)).astype(np.float32)
    for act in ACTS:
        h, f = _both(monkeypatch, lambda: _ops.PackedLinear(w, b, act))
        assert h._packed.half == (isa in HALF_SETS and _g.half_panels())
        assert not f._packed.half
        for r in (None, res):
            y = h(x, r)
            _same(y, f(x, r))
            _check(y, x, w, b, act, r)                    # and against float64 NumPy
    g = rng.standard_normal(N).astype(np.float32)
    h, f = _both(monkeypatch, lambda: _ops.PackedLinear(w, b))
    _same(h._then_layer_norm(x, res, g, b, 1e-5), f._then_layer_norm(x, res, g, b, 1e-5))


@pytest.mark.parametrize("n_threads", [1, 2, 3, 8])
def test_bitwise_for_any_thread_count(rng, monkeypatch, n_threads):
    x, w, b = _half_data(rng, 101, 1030, 600)
    h, f = _both(monkeypatch, lambda: _ops.PackedLinear(w, b, "gelu"))
    _same(h(x, n_threads=n_threads), f(x, n_threads=1))
    _same(h(x[:3], n_threads=n_threads), f(x, n_threads=2)[:3])   # a row alone or in a batch


@pytest.mark.parametrize("value", [0x7FC00001, 1.0 + 2.0 ** -20, 1e-9, 70000.0, -3.0e38])
def test_weights_that_are_not_binary16_keep_float_panels(value):
    w = np.ones((3, 40), np.float32)
    if isinstance(value, int):                     # a NaN whose payload binary16 cannot hold
        w.view(np.uint32)[2, 17] = value
    else:
        w[2, 17] = value
    p = _ops._Packed(w.copy())
    assert not p.half and p.buf.dtype == np.float32
    assert np.array_equal(p.unpack().view(np.uint32), w.view(np.uint32))


def test_binary16_values_come_back_bit_for_bit(isa, rng):
    w = rng.standard_normal((70, 530)).astype(np.float16)
    w[0, :7] = [0.0, -0.0, np.inf, -np.inf, 65504.0, 2.0 ** -24, np.nan]
    w32 = w.astype(np.float32)
    p = _ops._Packed.alone(w32)
    assert p.half == _g.half_panels()
    assert p.buf.nbytes == _g.packed_size(70, 530, 4) * (2 if p.half else 4)
    assert np.array_equal(p.weight.view(np.uint32), w32.view(np.uint32))


def test_follows_a_kernel_set_without_them(rng):
    """Packed with binary16 panels, then run under the baseline set: repacked as float32."""
    if not _g.half_panels():
        pytest.skip("this CPU has no binary16 panels")
    x, w, b = _half_data(rng, 9, 130, 300)
    layer = _ops.PackedLinear(w, b)
    y = layer(x)
    assert layer._packed.half
    before = _simd.isa()
    try:
        _simd.set_isa("baseline")
        y2 = layer(x)
        assert not layer._packed.half
        _check(y2, x, w, b)
    finally:
        _simd.set_isa(before)
    _same(layer(x), y)
    assert layer._packed.half


def test_the_kernel_refuses_binary16_panels_with_float64_x(rng):
    if not _g.half_panels():
        pytest.skip("this CPU has no binary16 panels")
    w = np.ones((4, 8), np.float16).view(np.uint16)
    wp = np.zeros(_g.packed_size(4, 8, 4), np.uint16)
    _g.pack_weight_half(w, wp)
    with pytest.raises(ValueError, match="binary16 panels"):
        _g.gemm(np.ones((2, 8)), wp, 4, None, 0, None, np.empty((2, 4)), 1)


def test_first_call_in_fresh_process(tmp_path):
    """A fresh interpreter's first GEMM on binary16 panels (their first allocation and pack),
    under each kernel set the CPU runs, with and without them: the same bits both ways."""
    code = textwrap.dedent("""
        import sys
        import numpy as np
        import scipy.special as sp
        import fastattn._ops as ops
        rng = np.random.default_rng(7)
        x = rng.standard_normal((37, 1030)).astype(np.float32)
        w = (rng.standard_normal((2051, 1030)) / 32).astype(np.float16).astype(np.float32)
        b = rng.standard_normal(2051).astype(np.float32)
        layer = ops.PackedLinear(w, b, "gelu")
        y = np.concatenate([layer(x[:1]), layer(x)])
        z = x.astype(np.float64) @ w.T.astype(np.float64) + b
        assert np.abs(y[1:] - 0.5 * z * sp.erfc(-z / np.sqrt(2))).max() < 1e-3
        assert layer._packed.half == (sys.argv[2] == "1" and ops._g.half_panels())
        np.save(sys.argv[1], y)
        print("ok")
    """)
    isas = [c for c in _simd.valid_caps() if c in ("sse2", "avx2", "avx512")]
    for isa in isas:
        got = {}
        for half in ("1", "0"):
            env = dict(os.environ, FASTATTN_HALF_PANELS=half, FASTATTN_ISA=isa)
            env["PYTHONPATH"] = os.pathsep.join([FASTATTN_ROOT] +
                                                [p for p in [env.get("PYTHONPATH")] if p])
            out = str(tmp_path / f"{isa}-{half}.npy")
            proc = subprocess.run([sys.executable, "-c", code, out, half], capture_output=True,
                                  text=True, env=env, timeout=300, cwd=TESTS)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            got[half] = np.load(out)
        _same(got["1"], got["0"])
