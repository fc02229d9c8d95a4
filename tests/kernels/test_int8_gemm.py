"""The int8 linear layer (PackedLinear(quantize='int8'), fastattn._kernels._qgemm).

Checked against an exact integer reference written here in NumPy (the activations quantised
the documented way, the products summed in int64, the dequantisation in float32): equal to the
bit. Every variant the CPU can run (forced with set_variant) and every kernel set of the ISA
switch gives the same bits, for any thread count and whatever else is in the batch; the float
epilogue (bias, activations, residual, LayerNorm) is checked against float64 NumPy on the
dequantised sums.
"""
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy.special import erf

import fastattn
import fastattn._ops as ops
from fastattn._kernels import _qgemm, _simd
from fastattn._quant import MAX_K, Int8Weight

VARIANTS = _qgemm.cpu_variants()
SHAPES = [(1, 512, 512), (1, 3, 1), (5, 37, 100), (8, 64, 300), (12, 129, 64), (97, 200, 130),
          (200, 96, 520), (1, 1, 17), (50, 601, 70), (300, 1536, 40)]


@pytest.fixture(autouse=True)
def _restore():
    yield
    _qgemm.set_variant(None)
    _simd.set_isa(_simd.cpu_isa())
    fastattn.set_num_threads(None)


def quantize_rows(x):
    """The documented activation quantisation, over each row's range widened to hold zero,
    [a, b] = [min(lo, 0), max(hi, 0)], with an integer zero point z = round(-a * 255 / (b - a)):
    u = clip(round_half_even(x * (255 / (b - a))) + z, 0, 255), scale (b - a) / 255, zero point
    -(z * scale); a constant row: u = 0, scale 0, zero point the constant."""
    lo, hi = x.min(axis=1), x.max(axis=1)
    a, b = np.minimum(lo, np.float32(0)), np.maximum(hi, np.float32(0))
    const = hi == lo
    span = np.where(const, np.float32(0), b - a).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(span > 0, np.float32(255) / span, np.float32(0)).astype(np.float32)
    z = np.rint((-a * inv).astype(np.float32))
    u = np.clip(np.rint((x * inv[:, None]).astype(np.float32)) + z[:, None], 0, 255)
    u[const] = 0
    sx = (span / np.float32(255)).astype(np.float32)
    zx = np.where(const, lo, -(z * sx)).astype(np.float32)
    return u.astype(np.int64), sx, zx


def reference(x, q):
    """The dequantised sums, exactly as the kernels compute them (float32 step by step)."""
    u, sx, zx = quantize_rows(x)
    wq = q.int8().astype(np.int64)
    acc = (u @ wq.T).astype(np.float32)                    # exact, then rounded once
    rsum = wq.sum(axis=1).astype(np.float32)
    t = acc * sx[:, None] + zx[:, None] * rsum[None, :]
    return (t * q.scale[None, :q.N]).astype(np.float32)


def data(M, K, N, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    return x, w, rng


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("M,K,N", SHAPES)
def test_equals_exact_integer_reference(variant, M, K, N):
    x, w, _ = data(M, K, N)
    lin = ops.PackedLinear(w, quantize="int8")
    _qgemm.set_variant(variant)
    np.testing.assert_array_equal(lin(x), reference(x, lin.int8_weight))


def test_weight_quantisation_is_per_row_symmetric():
    _, w, _ = data(1, 50, 40)
    w[3] = 0.0
    q = Int8Weight.from_float(w)
    wq = q.int8()
    assert wq.dtype == np.int8 and wq.shape == w.shape
    np.testing.assert_array_equal(np.abs(wq).max(axis=1)[np.arange(40) != 3], 127)
    np.testing.assert_array_equal(wq[3], 0)
    scale = np.abs(w).max(axis=1) / np.float32(127)
    np.testing.assert_array_equal(q.scale[:40], scale.astype(np.float32))
    np.testing.assert_array_equal(wq, np.clip(np.rint(w.astype(np.float64) / np.where(
        scale > 0, scale, 1).astype(np.float32).astype(np.float64)[:, None]), -127, 127))
    # dequantised within half a step of the weight
    assert (np.abs(q.dequantize() - w) <= q.scale[:40, None] * 0.5001).all()


@pytest.mark.parametrize("act", [None, "relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("with_res", [False, True])
def test_epilogue_against_float64(act, with_res):
    x, w, rng = data(33, 70, 90, seed=1)
    b = rng.standard_normal(90).astype(np.float32)
    res = rng.standard_normal((33, 90)).astype(np.float32) if with_res else None
    lin = ops.PackedLinear(w, b, act, quantize="int8")
    y = lin(x, res)
    z = reference(x, lin.int8_weight).astype(np.float64) + b
    if act == "relu":
        z = np.maximum(z, 0)
    elif act == "gelu":
        z = 0.5 * z * (1 + erf(z / np.sqrt(2)))
    elif act == "gelu_tanh":
        z = 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))
    elif act == "silu":
        z = z / (1 + np.exp(-z))
    if with_res:
        z = z + res
    np.testing.assert_allclose(y, z, rtol=2e-6, atol=2e-6)


def test_fused_layer_norm_against_float64():
    x, w, rng = data(20, 64, 48, seed=2)
    b, g, beta = (rng.standard_normal(48).astype(np.float32) for _ in range(3))
    res = rng.standard_normal((20, 48)).astype(np.float32)
    lin = ops.PackedLinear(w, b, quantize="int8")
    y = lin._then_layer_norm(x, res, g, beta, 1e-5)
    s = (reference(x, lin.int8_weight) + b + res).astype(np.float64)
    mu = s.mean(1, keepdims=True)
    ref = (s - mu) / np.sqrt(((s - mu) ** 2).mean(1, keepdims=True) + 1e-5) * g + beta
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    # the unfused-input path (a strided x) gives the same bits
    xs = np.asfortranarray(x)
    np.testing.assert_array_equal(lin._then_layer_norm(xs, res, g, beta, 1e-5), y)


def _every_epilogue(x, lin, res, g, beta):
    return [lin(x), lin(x, res), lin._then_layer_norm(x, res, g, beta, 1e-5)]


@pytest.mark.parametrize("N", [300, 512])
@pytest.mark.parametrize("act", [None, "relu", "gelu", "gelu_tanh", "silu"])
def test_same_bits_on_every_variant_and_kernel_set(act, N):
    """Every variant's epilogue (the AVX2 ones at 8 lanes, the others at 16; LayerNorm at 16
    everywhere) gives the scalar variant's bits: N = 300 takes the tails, 512 whole vectors;
    x scaled so that the GELU's erf tail and SiLU's exp saturation are reached."""
    x, w, rng = data(131, 200, N, seed=3)
    x *= 4.0
    x[5] = 0.0
    b, g, beta = (rng.standard_normal(N).astype(np.float32) for _ in range(3))
    res = rng.standard_normal((131, N)).astype(np.float32)
    lin = ops.PackedLinear(w, b, act, quantize="int8")
    _qgemm.set_variant("scalar")
    want = _every_epilogue(x, lin, res, g, beta)
    for v in VARIANTS:
        _qgemm.set_variant(v)
        for got, ref in zip(_every_epilogue(x, lin, res, g, beta), want):
            np.testing.assert_array_equal(got, ref, err_msg=v)
    _qgemm.set_variant(None)
    for isa in ("scalar", "baseline", "avx2", "avx2-wide", "avx512"):
        if _simd.set_isa(isa) != isa:
            continue
        assert _qgemm.variant() in VARIANTS
        for got, ref in zip(_every_epilogue(x, lin, res, g, beta), want):
            np.testing.assert_array_equal(got, ref, err_msg=isa)


def test_variant_follows_the_kernel_set():
    _simd.set_isa("scalar")
    assert _qgemm.variant() == "scalar"
    if "avx2" in VARIANTS and _simd.set_isa("avx2") == "avx2":
        assert _qgemm.variant() in ("avx2", "avx2-vnni")
    if "avx512" in VARIANTS and _simd.set_isa("avx512") == "avx512":
        assert _qgemm.variant() in ("avx512", "avx512-vnni")


@pytest.mark.parametrize("M", [1, 8, 96, 97, 300])
def test_same_bits_for_any_thread_count(M):
    x, w, rng = data(M, 96, 700, seed=4)
    b, g, beta = (rng.standard_normal(700).astype(np.float32) for _ in range(3))
    lin = ops.PackedLinear(w, b, "gelu", quantize="int8")
    want = None
    for n in (1, 2, 3, 8):
        got = [lin(x, n_threads=n), lin._then_layer_norm(x, None, g, beta, 1e-5, n_threads=n)]
        if want is None:
            want = got
        for a, r in zip(got, want):
            np.testing.assert_array_equal(a, r, err_msg=f"{n} threads")


def test_a_row_alone_equals_the_row_in_any_batch():
    x, w, rng = data(150, 64, 200, seed=5)
    lin = ops.PackedLinear(w, rng.standard_normal(200).astype(np.float32), "relu",
                           quantize="int8")
    full = lin(x)
    for i in (0, 7, 96, 149):
        np.testing.assert_array_equal(lin(x[i:i + 1]), full[i:i + 1])
    np.testing.assert_array_equal(lin(x[90:110]), full[90:110])


def test_non_finite_rows_give_nan_rows_only():
    x, w, _ = data(4, 32, 20, seed=6)
    x[1, 3] = np.nan
    x[2, 0] = np.inf
    x[3] = 0.0
    b = np.arange(20, dtype=np.float32)
    y = ops.PackedLinear(w, b, quantize="int8")(x)
    assert np.isnan(y[1]).all() and np.isnan(y[2]).all()
    assert np.isfinite(y[0]).all()
    np.testing.assert_array_equal(y[3], b)          # a zero row: the bias alone


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("K", [64, 1536, 301])
def test_extreme_operands_do_not_saturate(variant, K):
    """Rows whose bytes are all 0 or 255 against weights of +-127: the largest products every
    variant forms (the AVX2 variant's vpmaddubsw pairs reach 2 * 128 * 127 = 32512, the most a
    16-bit lane holds without saturating; the avx2-vnni / avx512-vnni dot products and the
    widened avx512 sums likewise at their extremes) equal the exact integer reference."""
    rng = np.random.default_rng(K)
    signs = rng.choice(np.array([-1.0, 1.0], np.float32), size=(48, K))
    x = signs.copy()
    x[:8] = -1.0                                    # lo = hi: a constant row (u = 0)
    x[8:16, ::2] = -1.0                             # u = 0 (s = -128) against ...
    w = rng.choice(np.array([-1.0, 1.0], np.float32), size=(70, K))
    w[:10] = -1.0                                   # ... w = -127: the largest positive pairs
    w[10:20] = 1.0
    lin = ops.PackedLinear(w, quantize="int8")
    assert set(np.unique(lin.int8_weight.int8())) <= {-127, 127}
    _qgemm.set_variant(variant)
    np.testing.assert_array_equal(lin(x), reference(x, lin.int8_weight))


@pytest.mark.parametrize("K", [7, 8, 15, 16, 17, 32, 33, 100, 257])
def test_row_quantisation_same_bits_on_every_variant(K):
    """The x86 variants quantise rows eight lanes at a time (the scalar variant element by
    element): the same bytes, scale and zero point, whatever the tails, the sign of a zero
    (-0.0 first in a row of zeros), a lone inf or NaN anywhere in the row."""
    rng = np.random.default_rng(K)
    x = rng.standard_normal((12, K)).astype(np.float32) * 3
    x[1] = 0.0
    x[1, 0] = -0.0
    x[2] = -0.0
    x[3, K - 1] = np.nan
    x[4, K // 2] = np.inf
    x[5] = 2.5                                     # constant
    x[6, :] = np.abs(x[6])                         # non-negative
    x[7, 0] = np.float32(3e38)
    x[7, -1] = np.float32(-3e38)                   # hi - lo overflows: NaN row
    w = rng.standard_normal((33, K)).astype(np.float32)
    lin = ops.PackedLinear(w, rng.standard_normal(33).astype(np.float32), quantize="int8")
    _qgemm.set_variant("scalar")
    want = lin(x)
    for v in VARIANTS:
        _qgemm.set_variant(v)
        got = lin(x)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=v)
    assert np.isnan(want[3]).all() and np.isnan(want[4]).all() and np.isnan(want[7]).all()


@pytest.mark.parametrize("N", [16, 40, 384])
def test_layer_norm_same_bits_on_every_variant(N):
    """The fused LayerNorm (16-lane sums everywhere; written out for two ymm on the AVX2
    variants) gives the scalar variant's bits, whole vectors and tails, with rows of values
    near float32's limit, a row holding inf, a constant row and a large offset."""
    rng = np.random.default_rng(N)
    x = rng.standard_normal((9, 64)).astype(np.float32)
    w = rng.standard_normal((N, 64)).astype(np.float32)
    lin = ops.PackedLinear(w, quantize="int8")
    res = rng.standard_normal((9, N)).astype(np.float32)
    res[1] = 3e38                                   # squares near 1e77: fine in double
    res[1, ::2] = -3e38
    res[2, N // 2] = np.inf                         # a NaN row
    res[3] = 1e6                                    # a large offset
    res[4] = 0.0
    x[4] = 0.0                                      # a constant row
    g, beta = (rng.standard_normal(N).astype(np.float32) for _ in range(2))
    _qgemm.set_variant("scalar")
    want = [lin._then_layer_norm(x, res, g, beta, 1e-5), lin._then_layer_norm(x, res, None, None, 1e-12)]
    for v in VARIANTS:
        _qgemm.set_variant(v)
        got = [lin._then_layer_norm(x, res, g, beta, 1e-5), lin._then_layer_norm(x, res, None, None, 1e-12)]
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32), err_msg=v)
    assert np.isfinite(want[0][3]).all() and np.isfinite(want[0][1]).all()
    assert np.isnan(want[0][2]).all()


def test_zero_point_uses_the_row_range():
    """A row of non-negative values (a ReLU / GELU output) gets all 256 levels: its error is
    about half that of a symmetric [-max, max] scale's."""
    rng = np.random.default_rng(9)
    x = np.abs(rng.standard_normal((64, 256))).astype(np.float32)
    w = rng.standard_normal((128, 256)).astype(np.float32)
    lin = ops.PackedLinear(w, quantize="int8")
    exact = x.astype(np.float64) @ lin.int8_weight.dequantize().astype(np.float64).T
    err = np.abs(lin(x) - exact).mean()
    step = np.abs(x).max(axis=1, keepdims=True) / 127          # the symmetric scale's step
    sym = (np.rint(x / step) * step).astype(np.float64) @ \
        lin.int8_weight.dequantize().astype(np.float64).T
    assert err < 0.7 * np.abs(sym - exact).mean()


def test_rows_view_equals_copy():
    _, w, _ = data(1, 40, 300, seed=7)
    q = Int8Weight.from_float(w)
    for a, b in ((0, 100), (64, 192), (128, 300), (16, 40), (3, 70)):
        r = q.rows(a, b)
        np.testing.assert_array_equal(r.int8(), q.int8()[a:b])
        np.testing.assert_array_equal(r.scale[:b - a], q.scale[a:b])
        x = np.random.default_rng(a).standard_normal((3, 40)).astype(np.float32)
        np.testing.assert_array_equal(ops.PackedLinear(r)(x), ops.PackedLinear(q)(x)[:, a:b])


def test_bad_arguments():
    w = np.ones((4, 8), np.float32)
    with pytest.raises(ValueError, match="quantize"):
        ops.PackedLinear(w, quantize="int4")
    with pytest.raises(TypeError, match="quantize"):
        ops.PackedLinear(w, quantize=8)
    with pytest.raises(ValueError, match="float32"):
        ops.PackedLinear(w.astype(np.float64), quantize="int8")
    with pytest.raises(ValueError, match="inf or NaN"):
        ops.PackedLinear(np.full((2, 2), np.nan, np.float32), quantize="int8")
    with pytest.raises(ValueError, match=str(MAX_K)):
        Int8Weight.from_float(np.zeros((1, MAX_K + 1), np.float32))
    lin = ops.PackedLinear(w, quantize="int8")
    with pytest.raises(TypeError, match="float32"):
        lin(np.ones((2, 8)))
    with pytest.raises(ValueError, match="in_features"):
        lin(np.ones((2, 7), np.float32))
    with pytest.raises(ValueError, match="variant"):
        _qgemm.set_variant("avx1024")
    with pytest.raises(ValueError, match="panels"):
        q = Int8Weight.from_float(w)
        Int8Weight.from_arrays(q.panels[:-1], q.scale, q.comp, 4, 8)
    # integer inputs are converted; the result is float32
    assert lin(np.ones((1, 8), np.int64)).dtype == np.float32


def test_nd_input_and_out_argument():
    x, w, _ = data(6, 16, 10, seed=8)
    lin = ops.PackedLinear(w, quantize="int8")
    y = lin(x.reshape(2, 3, 16))
    np.testing.assert_array_equal(y.reshape(6, 10), lin(x))
    out = np.empty((6, 10), np.float32)
    assert lin(x, out=out) is out
    np.testing.assert_array_equal(out, lin(x))


_FRESH = r"""
import numpy as np, sys
import fastattn._ops as ops
from fastattn._kernels import _qgemm
v = sys.argv[1]
_qgemm.set_variant(v)
rng = np.random.default_rng(0)
M, K, N = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
x = rng.standard_normal((M, K)).astype(np.float32)
w = rng.standard_normal((N, K)).astype(np.float32)
y = ops.PackedLinear(w, rng.standard_normal(N).astype(np.float32), "gelu", quantize="int8")(x)
print(float(np.float64(y.astype(np.float64).sum())).hex())
"""


@pytest.mark.parametrize("M,K,N", [(1, 5, 3), (97, 130, 70)])
def test_first_call_in_a_fresh_process(M, K, N):
    """The first int8 call of a process (its workspace's first allocation) on every variant:
    the same bits as in this process."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    want = ops.PackedLinear(w, rng.standard_normal(N).astype(np.float32), "gelu",
                            quantize="int8")(x)
    for v in VARIANTS:
        out = subprocess.run([sys.executable, "-c", _FRESH, v, str(M), str(K), str(N)],
                             capture_output=True, text=True, env=dict(os.environ), timeout=120,
                             cwd=os.path.dirname(__file__))   # (not a checkout's source folder)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == float(want.astype(np.float64).sum()).hex(), v
