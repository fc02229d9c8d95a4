"""fastattn's packed-weight GEMM (fastattn._ops.linear / PackedLinear) against float64 NumPy.

Error bound used throughout: |y - y64| <= K eps (|x| @ |W|.T) + |bias| eps elementwise (the
classical forward bound for a K-term dot product is ~K eps/2 |x||W|), plus a few eps of the
activation. A wrong or missing term moves an element by ~|x_k W_nk|, far above the bound.
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import scipy.special as sp

from fastattn import _ops
from fastattn._kernels import _gemm as _g
from fastattn._kernels import _simd

EPS = {np.float32: float(np.finfo(np.float32).eps), np.float64: float(np.finfo(np.float64).eps)}
DTYPES = [np.float32, np.float64]
ACTS = [None, "relu", "gelu", "gelu_tanh", "silu"]
# child interpreters import the fastattn this process imported (an in-place build or the
# installed wheel) and run from tests/, so that a source checkout never shadows it
FASTATTN_ROOT = os.path.dirname(os.path.dirname(_ops.__file__))
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _act64(name, z):
    if name is None:
        return z
    if name == "relu":
        return np.maximum(z, 0)
    if name == "gelu":
        return 0.5 * z * sp.erfc(-z / np.sqrt(2))
    if name == "gelu_tanh":
        return z * sp.expit(2 * np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3))
    return z * sp.expit(z)


def _check(y, x, w, b=None, act=None, res=None):
    """y against the float64 reference with the forward error bound of the module docstring."""
    dtype = y.dtype.type
    eps = EPS[dtype]
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    K = x.shape[-1]
    z = x64 @ w64.T
    bound = max(K, 1) * eps * (np.abs(x64) @ np.abs(w64).T)
    if b is not None:
        z = z + b
        bound = bound + eps * np.abs(b)
    ref = _act64(act, z)
    # the activation's slope is <= 1.13, and its own error a few eps of |ref|
    bound = 1.2 * bound + 16 * eps * np.abs(ref) + (2e-19 if dtype == np.float32 else 1e-300)
    if res is not None:
        ref = ref + res
        bound = bound + eps * np.abs(ref)
    assert y.shape == ref.shape
    err = np.abs(y.astype(np.float64) - ref)
    bad = err > bound
    assert not bad.any(), (f"{bad.sum()} of {bad.size} elements off; worst err {err.max():.3g} "
                           f"(bound there {bound.flat[np.argmax(err)]:.3g})")


def _data(rng, M, N, K, dtype):
    x = rng.standard_normal((M, K)).astype(dtype)
    w = rng.standard_normal((N, K)).astype(dtype)
    b = rng.standard_normal(N).astype(dtype)
    return x, w, b


# ------------------------------------------------------------------ shapes around every edge
# M edges: MR (4, 6), MC (96); N edges: NR (4, 8, 16, 32, 64) and column blocks (64, 128, 256);
# K edges: KC (128 for AVX-512 doubles, 256, 512 for AVX2 floats)
M_SIZES = [1, 2, 5, 6, 7, 15, 16, 17, 63, 64, 65, 95, 96, 97, 193]
N_SIZES = [1, 2, 5, 7, 15, 16, 17, 31, 33, 63, 64, 65, 255, 257, 511, 513]
K_SIZES = [1, 2, 5, 7, 16, 17, 63, 65, 127, 128, 129, 255, 256, 257, 511, 513]
# ci/sanitize.sh's -O0 ASan build is 10-50x slower: every edge still, fewer combinations
SANITIZED = bool(os.environ.get("FASTATTN_SANITIZED"))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M", M_SIZES)
def test_shapes_against_float64(rng, dtype, M):
    step = 3 if M > 20 else 1
    for i, N in enumerate(N_SIZES):
        for K in K_SIZES[i % 3 if SANITIZED else 0:: 3 * step if SANITIZED else step]:
            x, w, b = _data(rng, M, N, K, dtype)
            _check(_ops.linear(x, w), x, w)
            _check(_ops.linear(x, w, b), x, w, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_big_tile_edges(rng, dtype):
    for M, N, K in [(255, 257, 513), (257, 511, 255), (511, 65, 1025), (97, 1030, 300),
                    (3, 2049, 129), (1, 4097, 64)]:
        x, w, b = _data(rng, M, N, K, dtype)
        _check(_ops.linear(x, w, b, "gelu"), x, w, b, "gelu")


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_isa(isa, rng, dtype):
    # (193, 130, 600): three K blocks, 33 row blocks (the last of one row), three panels:
    # AVX-512's fetch of the next K block into L2 in whole and remainder blocks, and its wrap
    # back to the first K block
    for M, N, K in [(1, 1, 1), (7, 17, 5), (13, 70, 129), (97, 65, 257), (6, 64, 128),
                    (5, 129, 300), (193, 130, 600)]:
        x, w, b = _data(rng, M, N, K, dtype)
        res = rng.standard_normal((M, N)).astype(dtype)
        for act in ACTS:
            _check(_ops.linear(x, w, b, act), x, w, b, act)
        _check(_ops.linear(x, w, b, "silu", res), x, w, b, "silu", res)
        layer = _ops.PackedLinear(w, b, "gelu")
        _check(layer(x, res), x, w, b, "gelu", res)


# ------------------------------------------------------------------ epilogues
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("with_res", [False, True])
def test_epilogues(rng, dtype, act, with_bias, with_res):
    M, N, K = 37, 131, 270
    x, w, b = _data(rng, M, N, K, dtype)
    x *= 0.3
    b = b if with_bias else None
    res = rng.standard_normal((M, N)).astype(dtype) if with_res else None
    _check(_ops.linear(x, w, b, act, res), x, w, b, act, res)


def test_activation_aliases(rng):
    x, w, b = _data(rng, 9, 20, 30, np.float32)
    for alias, name in (("gelu_new", "gelu_tanh"), ("gelu_pytorch_tanh", "gelu_tanh"),
                        ("swish", "silu"), ("GELU", "gelu"), ("none", None)):
        np.testing.assert_array_equal(_ops.linear(x, w, b, alias), _ops.linear(x, w, b, name))


@pytest.mark.parametrize("scale", [1.0, 12.0])
def test_epilogue_matches_standalone_activation(rng, isa, scale):
    # the fused epilogue (whole register blocks and the edges) and the standalone kernel (four
    # vectors at a time, then one, then the tail) run the same element function; at scale 12
    # many lanes take exp's underflow clamp (gelu_tanh, silu) and erfc's far tail (gelu)
    x, w, b = _data(rng, 45, 211, 40, np.float32)
    x *= scale
    z = _ops.linear(x, w, b)
    for name, fn in (("gelu", _ops.gelu), ("silu", _ops.silu), ("relu", _ops.relu),
                     ("gelu_tanh", lambda a: _ops.gelu(a, approximate="tanh"))):
        y = _ops.linear(x, w, b, name)
        np.testing.assert_array_equal(y, fn(z))
        np.testing.assert_array_equal(y.ravel(), fn(z.ravel()))
        np.testing.assert_allclose(y, _act64(name, z.astype(np.float64)), rtol=2e-5, atol=1e-6)


def test_fused_gelu_and_residual_equal_the_unfused_ops(rng, isa):
    # The epilogue of a whole register block runs GELU on two rows at once and decides its
    # interval branches once for them (gemm_tile.h, gelu_n); the residual of a whole block is
    # prefetched inside its last K block. Rows scaled from 0.02 to 20 put register blocks
    # on every branch combination (all |z| small, some past each interval switch, inf and
    # NaN lanes); every element must equal the unfused GELU of the same product plus the same
    # residual, bit for bit. K = 700 crosses a K block for every ISA; M = 47 and N = 83 leave
    # partial blocks on both edges.
    M, N, K = 47, 83, 700
    x, w, b = _data(rng, M, N, K, np.float32)
    x *= np.geomspace(0.02, 20, M).astype(np.float32)[:, None] / np.float32(np.sqrt(K))
    x[5, :3] = np.inf                          # an inf / NaN product in a few rows
    x[29, 7] = np.nan
    res = rng.standard_normal((M, N)).astype(np.float32)
    for name, fn in (("gelu", _ops.gelu), ("gelu_tanh", lambda a: _ops.gelu(a, approximate="tanh")),
                     ("silu", _ops.silu), (None, lambda a: a)):
        layer = _ops.PackedLinear(w, b, name)
        z = _ops.linear(x, w, b)
        np.testing.assert_array_equal(layer(x), fn(z))
        np.testing.assert_array_equal(layer(x, res), fn(z) + res)
        np.testing.assert_array_equal(layer(x, res, n_threads=1), fn(z) + res)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_layer_norm_equals_the_two_calls(rng, isa, dtype):
    # PackedLinear._then_layer_norm normalises each block of MC rows inside the GEMM, done by
    # whichever thread finishes the block's last column item: every element must equal
    # layer_norm(layer(x, residual)) bit for bit, for any thread count. M around MC (one row
    # block, a partial one, several), N with one column item or several (and a partial one),
    # a row of inf, gamma / beta missing.
    MC = _g.MC
    for M, N, K in [(1, 40, 30), (MC - 1, 384, 70), (MC + 1, 700, 130), (3 * MC + 5, 129, 513),
                    (11 * MC - 7, 300, 40)]:
        x, w, b = _data(rng, M, N, K, dtype)
        res = rng.standard_normal((M, N)).astype(dtype)
        g = (1 + 0.3 * rng.standard_normal(N)).astype(dtype)
        beta = (0.3 * rng.standard_normal(N)).astype(dtype)
        x[M // 2, 0] = np.inf
        for act in (None, "gelu"):
            layer = _ops.PackedLinear(w, b, act)
            for r, gg, bb in ((res, g, beta), (None, g, beta), (res, None, None), (res, g, None)):
                want = _ops.layer_norm(layer(x, r), gg, bb, 1e-5)
                for nthr in (1, 2, 3, 8, 16):
                    got = layer._then_layer_norm(x, r, gg, bb, 1e-5, n_threads=nthr)
                    np.testing.assert_array_equal(got, want)
        assert np.isnan(got[M // 2]).all() and np.isfinite(np.delete(got, M // 2, 0)).all()
    # against float64: LN(x W^T + b + r) * g + beta
    x, w, b = _data(rng, 200, 96, 64, dtype)
    z = x.astype(np.float64) @ w.T.astype(np.float64) + b + res[:200, :96]
    z = (z - z.mean(-1, keepdims=True)) / np.sqrt(z.var(-1, keepdims=True) + 1e-5)
    got = _ops.PackedLinear(w, b)._then_layer_norm(x, np.ascontiguousarray(res[:200, :96]), None,
                                                   None, 1e-5)
    np.testing.assert_allclose(got, z, rtol=0, atol=2e-5 if dtype == np.float32 else 1e-12)


def test_fused_layer_norm_takes_the_two_calls_for_other_inputs(rng):
    # inputs the kernel does not take as they are (strided x, float64 gamma for a float32
    # layer, a list) give the same answer through the checked two-step path
    x, w, b = _data(rng, 50, 24, 16, np.float32)
    layer = _ops.PackedLinear(w, b)
    g = np.linspace(0.5, 1.5, 24).astype(np.float32)
    want = _ops.layer_norm(layer(x), g, None, 1e-6)
    xs = np.asfortranarray(x)
    np.testing.assert_array_equal(layer._then_layer_norm(xs, None, g, None, 1e-6), want)
    np.testing.assert_array_equal(layer._then_layer_norm(x, None, list(g), None, 1e-6), want)
    with pytest.raises(ValueError, match="eps"):
        layer._then_layer_norm(x, None, g, None, -1.0)


def test_nonfinite_inputs_propagate():
    x = np.array([[1.0, np.nan, 0.0], [1.0, 1.0, 1.0], [np.inf, 0.0, 0.0]], np.float32)
    w = np.ones((5, 3), np.float32)
    y = _ops.linear(x, w)
    assert np.isnan(y[0]).all() and (y[1] == 3).all() and (y[2] == np.inf).all()


# ------------------------------------------------------------------ layouts
@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_transposed_noncontiguous(rng, dtype):
    N, K = 45, 67
    w = rng.standard_normal((N, K)).astype(dtype)
    b = rng.standard_normal(N).astype(dtype)
    base = rng.standard_normal((40, 3 * K)).astype(dtype)
    cases = {
        "column slice": base[:, 5:5 + K],
        "every other row": base[::2, :K],
        "reversed rows": base[::-1, :K],
        "strided last axis": base[:, : 2 * K : 2],
        "transposed": np.ascontiguousarray(base[:, :K].T).T,
        "fortran": np.asfortranarray(base[:, :K]),
        "3-D permuted": rng.standard_normal((K, 4, 6)).astype(dtype).transpose(1, 2, 0),
        "1-D": base[3, :K],
        "broadcast rows": np.broadcast_to(base[0, :K], (7, K)),
        "big-endian": base[:, :K].astype(np.dtype(dtype).newbyteorder(">")),
    }
    for name, x in cases.items():
        y = _ops.linear(x, w, b, "relu")
        assert y.shape == x.shape[:-1] + (N,), name
        _check(y.reshape(-1, N), np.asarray(x).reshape(-1, K), w, b, "relu")
    # weight and bias in odd layouts too
    wt = np.asfortranarray(w)
    _check(_ops.linear(base[:, :K], wt, b[::-1][::-1]), base[:, :K], w, b)
    _check(_ops.linear(base[:, :K], rng.standard_normal((2 * N, K)).astype(dtype)[::2] * 0 + w,
                       b), base[:, :K], w, b)


def test_leading_dims_and_empty(rng):
    w = rng.standard_normal((8, 5)).astype(np.float32)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    y = _ops.linear(x, w)
    assert y.shape == (2, 3, 4, 8)
    _check(y.reshape(-1, 8), x.reshape(-1, 5), w)
    assert _ops.linear(np.zeros((0, 5), np.float32), w).shape == (0, 8)
    assert _ops.linear(np.zeros((3, 0, 5), np.float32), w).shape == (3, 0, 8)
    assert _ops.linear(x, np.zeros((0, 5), np.float32)).shape == (2, 3, 4, 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_k_zero_gives_epilogue_of_zero(rng, dtype):
    b = rng.standard_normal(9).astype(dtype)
    res = rng.standard_normal((4, 9)).astype(dtype)
    y = _ops.linear(np.zeros((4, 0), dtype), np.zeros((9, 0), dtype), b, "relu", res)
    np.testing.assert_array_equal(y, np.maximum(b, 0) + res)


def test_out_argument_and_residual_alias(rng):
    x, w, b = _data(rng, 50, 70, 300, np.float32)   # K > KC: partial sums pass through out
    res = rng.standard_normal((50, 70)).astype(np.float32)
    expect = _ops.linear(x, w, b, "gelu", res.copy())
    out = np.empty((50, 70), np.float32)
    assert _ops.linear(x, w, b, "gelu", res, out=out) is out
    np.testing.assert_array_equal(out, expect)
    inplace = res.copy()
    assert _ops.linear(x, w, b, "gelu", inplace, out=inplace) is inplace
    np.testing.assert_array_equal(inplace, expect)


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_linear_out(rng, dtype):
    """PackedLinear(..., out=): a ready output array goes straight to the kernel; anything else
    takes the checked path (residual aliasing out is read from a copy; overlaps, read-only,
    wrong byte order are errors)."""
    x, w, b = _data(rng, 50, 70, 300, dtype)       # K > KC: partial sums pass through out
    res = rng.standard_normal((50, 70)).astype(dtype)
    layer = _ops.PackedLinear(w, b, "gelu")
    expect = layer(x, res.copy())
    _check(expect, x, w, b, "gelu", res)
    out = np.full((50, 70), np.nan, dtype)
    assert layer(x, res, out=out) is out
    np.testing.assert_array_equal(out, expect)
    inplace = res.copy()
    assert layer(x, inplace, out=inplace) is inplace
    np.testing.assert_array_equal(inplace, expect)
    big = np.zeros(50 * 300 + 3500, dtype)
    xs = big[:15000].reshape(50, 300)
    xs[...] = x
    with pytest.raises(ValueError, match="overlap x"):
        layer(xs, out=big[15000 - 8:15000 - 8 + 3500].reshape(50, 70))
    with pytest.raises(ValueError, match="overlap weight"):
        layer(x, out=w.reshape(-1)[:3500].reshape(50, 70))
    ro = np.empty((50, 70), dtype)
    ro.setflags(write=False)
    with pytest.raises(ValueError, match="writeable"):
        layer(x, out=ro)
    with pytest.raises(TypeError, match="out must have dtype"):
        layer(x, out=np.empty((50, 70), np.dtype(dtype).newbyteorder()))


def test_dtype_rules(rng):
    w32 = rng.standard_normal((6, 4)).astype(np.float32)
    xi = rng.integers(-3, 4, (5, 4))
    y = _ops.linear(xi, rng.integers(-3, 4, (6, 4)))
    assert y.dtype == np.float64
    y = _ops.linear(xi, w32)             # ints take the float argument's dtype
    assert y.dtype == np.float32
    _check(y, xi.astype(np.float32), w32)
    assert _ops.linear(xi.astype(np.float16), w32).dtype == np.float32
    assert _ops.linear(xi.astype(np.float64), w32.astype(np.float64)).dtype == np.float64


# ------------------------------------------------------------------ threads
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(300, 700, 300), (5, 2000, 129), (1, 513, 1030),
                                   (193, 64, 600), (8, 32000 // 16, 64), (1001, 130, 40)])
def test_bitwise_same_for_any_thread_count(rng, dtype, shape):
    M, N, K = shape
    x, w, b = _data(rng, M, N, K, dtype)
    res = rng.standard_normal((M, N)).astype(dtype)
    layer = _ops.PackedLinear(w, b, "gelu")
    ys = [layer(x, res, n_threads=t) for t in (1, 2, 3, 8)]
    for y in ys[1:]:
        np.testing.assert_array_equal(y, ys[0])
    _check(ys[0], x, w, b, "gelu", res)
    # and row by row (the row's position in its register block does not change its bits)
    rows = np.stack([layer(x[i], res[i], n_threads=2) for i in range(min(M, 13))])
    np.testing.assert_array_equal(rows, ys[0][: min(M, 13)])


@pytest.mark.parametrize("dtype", DTYPES)
def test_loop_order_does_not_change_bits(rng, dtype):
    # items of up to two register-block rows run panel by panel, larger ones row block by row
    # block (gemm_tile.h, item()); M = 200 gives two 96-row items and an 8-row one, and K = 1100
    # crosses two K-block boundaries for every ISA (the partial sums go through y). Every row
    # must equal the same row computed alone (an M = 1 call, panel by panel).
    M, N, K = 200, 300, 1100
    x, w, b = _data(rng, M, N, K, dtype)
    res = rng.standard_normal((M, N)).astype(dtype)
    layer = _ops.PackedLinear(w, b, "relu")
    full = layer(x, res, n_threads=2)
    for i in range(M):
        np.testing.assert_array_equal(layer(x[i:i + 1], res[i:i + 1], n_threads=1), full[i:i + 1])
    for m in (12, 13):                       # the boundary between the two orders
        np.testing.assert_array_equal(layer(x[:m], res[:m], n_threads=2), full[:m])
    _check(full, x, w, b, "relu", res)


def test_set_num_threads_default_is_used(rng):
    import fastattn
    x, w, b = _data(rng, 100, 300, 50, np.float32)
    before = fastattn.get_num_threads()
    try:
        fastattn.set_num_threads(3)
        y3 = _ops.linear(x, w, b)
    finally:
        fastattn.set_num_threads(None)
    assert fastattn.get_num_threads() == before
    np.testing.assert_array_equal(y3, _ops.linear(x, w, b, n_threads=1))


# ------------------------------------------------------------------ packing
def test_packed_linear_repacks_on_assignment(rng):
    x, w, b = _data(rng, 11, 40, 33, np.float32)
    layer = _ops.PackedLinear(w, b, "relu")
    assert (layer.in_features, layer.out_features, layer.dtype) == (33, 40, np.float32)
    _check(layer(x), x, w, b, "relu")
    w2 = rng.standard_normal((40, 33)).astype(np.float32)
    layer.weight = w2
    _check(layer(x), x, w2, b, "relu")
    w2[:] = 0                     # in-place edits are not seen until the weight is reassigned
    assert np.abs(layer(x)).max() > 0
    layer.weight = w2
    np.testing.assert_array_equal(layer(x), np.maximum(np.broadcast_to(b, (11, 40)), 0))
    layer.bias = None
    np.testing.assert_array_equal(layer(x), 0)
    layer.weight = w[:7]          # another N once the bias is gone
    _check(layer(x), x, w[:7], None, "relu")
    with pytest.raises(ValueError, match="bias"):
        layer.bias = b
    assert "PackedLinear(in_features=33, out_features=7" in repr(layer)


def test_packed_linear_follows_isa_change(rng):
    x, w, b = _data(rng, 9, 70, 300, np.float32)
    layer = _ops.PackedLinear(w, b)
    before = _simd.isa()
    try:
        for name in ("scalar", "baseline", before):
            _simd.set_isa(name)
            _check(layer(x), x, w, b)
    finally:
        _simd.set_isa(before)


def test_packed_size_is_exact():
    for isz in (4, 8):
        nr = _g.panel_width(isz)
        assert _g.packed_size(1, 1, isz) == nr
        assert _g.packed_size(nr + 1, 3, isz) == 3 * 2 * nr
        assert _g.packed_size(5, 0, isz) == 0


# ------------------------------------------------------------------ bad inputs
def test_bad_inputs(rng):
    x, w, b = _data(rng, 4, 6, 5, np.float32)
    with pytest.raises(ValueError, match="weight must be 2-D"):
        _ops.linear(x, w[0])
    with pytest.raises(ValueError, match="in_features K=5"):
        _ops.linear(x[:, :4], w)
    with pytest.raises(ValueError, match="bias must have shape"):
        _ops.linear(x, w, b[:5])
    with pytest.raises(ValueError, match="residual must have"):
        _ops.linear(x, w, b, None, np.zeros((4, 5), np.float32))
    with pytest.raises(TypeError, match="weight has dtype float64"):
        _ops.linear(x, w.astype(np.float64))
    with pytest.raises(TypeError, match="bias has dtype float64"):
        _ops.linear(x, w, b.astype(np.float64))
    with pytest.raises(TypeError, match="residual has dtype float64"):
        _ops.linear(x, w, b, None, np.zeros((4, 6)))
    with pytest.raises(TypeError, match="x"):
        _ops.linear(x.astype(np.complex64), w)
    with pytest.raises(TypeError, match="longdouble|float128|extended"):
        _ops.linear(x.astype(np.longdouble), w)
    with pytest.raises(ValueError, match="activation must be one of"):
        _ops.linear(x, w, activation="tanh")
    with pytest.raises(TypeError, match="activation must be a string"):
        _ops.linear(x, w, activation=3)
    with pytest.raises(ValueError, match="x must have at least 1"):
        _ops.linear(np.float32(1), w)
    with pytest.raises(ValueError, match="n_threads"):
        _ops.linear(x, w, n_threads=0)
    with pytest.raises(TypeError, match="n_threads"):
        _ops.linear(x, w, n_threads=1.5)
    with pytest.raises(ValueError, match="out must have shape"):
        _ops.linear(x, w, out=np.empty((4, 5), np.float32))
    with pytest.raises(TypeError, match="out must have dtype"):
        _ops.linear(x, w, out=np.empty((4, 6)))
    with pytest.raises(ValueError, match="C-contiguous"):
        _ops.linear(x, w, out=np.empty((6, 4), np.float32).T)
    with pytest.raises(ValueError, match="overlap x"):
        buf = np.zeros((4, 6), np.float32)
        _ops.linear(buf[:, :5], w, out=buf)
    layer = _ops.PackedLinear(w)
    with pytest.raises(TypeError, match="x has dtype float64"):
        layer(x.astype(np.float64))
    with pytest.raises(ValueError, match="weight must be 2-D"):
        layer.weight = w[None]
    with pytest.raises(ValueError, match="activation"):
        _ops.PackedLinear(w, activation="gelu_erf")


# ------------------------------------------------------------------ LayerNorm
def _ln64(x, res, g, b, eps):
    s = x.astype(np.float64) + (0 if res is None else res)
    if x.dtype == np.float32 and res is not None:
        s = (x + res).astype(np.float64)
    mu = s.mean(-1, keepdims=True)
    var = ((s - mu) ** 2).mean(-1, keepdims=True)
    y = (s - mu) / np.sqrt(var + eps)
    if g is not None:
        y = y * g
    if b is not None:
        y = y + b
    return y


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("C", [1, 2, 7, 15, 16, 17, 64, 385, 1024])
def test_layer_norm(rng, dtype, C, isa):
    x = (rng.standard_normal((3, 5, C)) * 3 + 10).astype(dtype)
    res = rng.standard_normal((3, 5, C)).astype(dtype)
    g = rng.standard_normal(C).astype(dtype)
    b = rng.standard_normal(C).astype(dtype)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    for args in ((g, b, res), (g, b, None), (None, None, None), (g, None, res)):
        y = _ops.layer_norm(x, args[0], args[1], 1e-5, residual=args[2])
        assert y.dtype == dtype and y.shape == x.shape
        np.testing.assert_allclose(y, _ln64(x, args[2], args[0], args[1], 1e-5), **tol)
    # threads do not change the bits; a transposed input is fine
    np.testing.assert_array_equal(_ops.layer_norm(x, g, b, n_threads=1),
                                  _ops.layer_norm(x, g, b, n_threads=3))
    xt = np.ascontiguousarray(x.transpose(2, 1, 0)).transpose(2, 1, 0)
    np.testing.assert_array_equal(_ops.layer_norm(xt, g, b), _ops.layer_norm(x, g, b))


def test_layer_norm_row_independent_of_batch_and_isa_agree(rng, isa):
    """A row's LayerNorm does not depend on the other rows, and every ISA's kernel agrees with
    the float64 reference to float32 rounding (the vector and tail paths included)."""
    x = rng.standard_normal((6, 100)).astype(np.float32) * 5 - 3
    g = rng.standard_normal(100).astype(np.float32)
    full = _ops.layer_norm(x, g, None, 1e-6)
    for r in range(6):
        np.testing.assert_array_equal(_ops.layer_norm(x[r:r + 1], g, None, 1e-6), full[r:r + 1])
    ref = _ln64(x, None, g, None, 1e-6)
    assert np.abs(full - ref).max() <= 4 * np.finfo(np.float32).eps * np.abs(ref).max()


def test_layer_norm_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 9, 48)).astype(np.float32)
    res = rng.standard_normal((4, 9, 48)).astype(np.float32)
    g = rng.standard_normal(48).astype(np.float32)
    b = rng.standard_normal(48).astype(np.float32)
    ref = torch.nn.functional.layer_norm(torch.from_numpy(x + res), (48,), torch.from_numpy(g),
                                         torch.from_numpy(b), 1e-6).numpy()
    np.testing.assert_allclose(_ops.layer_norm(x, g, b, 1e-6, residual=res), ref,
                               rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("C", [1, 5, 16, 64, 385])
def test_layer_norm_float64_beyond_the_square_range(rng, C, isa):
    """float64 rows with |x| ~ 1e300: their squares overflow double, and the row is computed on
    an exactly scaled copy (LayerNorm(x) = LayerNorm(x / c) with eps / c^2): the normalised
    values of the unscaled row, not zeros or garbage. inf or NaN in a row still gives NaN."""
    base = rng.standard_normal((4, C)) * 3 + 1
    g = rng.standard_normal(C)
    b = rng.standard_normal(C)
    for scale in (1e155, 1e300, 2.0 ** 1000):
        x = base * scale
        y = _ops.layer_norm(x, g, b, 1e-5)
        ref = _ln64(base, None, g, b, max(1e-5 / scale / scale, 1e-300))
        np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)
        with_res = _ops.layer_norm(x / 2, g, b, 1e-5, residual=x / 2)
        np.testing.assert_allclose(with_res, ref, rtol=1e-12, atol=1e-12)
    # lanes that overflow to +inf and to -inf (a NaN sum, not an inf one) take the same path
    if C >= 4:
        alt = np.zeros((1, C))
        alt[0, 0::4], alt[0, 1::4] = 1.0, -1.0
        np.testing.assert_allclose(_ops.layer_norm(alt * 1e308, g, b, 1e-5),
                                   _ln64(alt, None, g, b, 1e-300), rtol=1e-12, atol=1e-12)
    x = base * 1e300
    x[1, 0] = np.inf
    x[2, -1] = np.nan
    y = _ops.layer_norm(x, g, b, 1e-5)
    assert np.isnan(y[1]).all() and np.isnan(y[2]).all()
    np.testing.assert_allclose(y[[0, 3]], _ln64(base[[0, 3]], None, g, b, 1e-300), rtol=1e-12,
                               atol=1e-12)


def test_layer_norm_bad_inputs():
    x = np.ones((2, 4), np.float32)
    with pytest.raises(ValueError, match=r"weight must have shape \(C,\)"):
        _ops.layer_norm(x, np.ones(3, np.float32), None)
    with pytest.raises(ValueError, match="residual must have"):
        _ops.layer_norm(x, None, None, residual=np.ones((4,), np.float32))
    with pytest.raises(TypeError, match="bias has dtype float64"):
        _ops.layer_norm(x, None, np.ones(4))
    with pytest.raises(ValueError, match="eps"):
        _ops.layer_norm(x, eps=-1.0)
    with pytest.raises(TypeError, match="eps"):
        _ops.layer_norm(x, eps="1e-5")


# ------------------------------------------------------------------ fresh-process first calls
# Each buffer path runs as the FIRST fastattn call of a new interpreter: nothing allocated
# earlier (by this test session) can hide an overrun. Exit code 0 and the values are checked.
FIRST_CALLS = {
    "linear_small": "y = ops.linear(x[:1, :3], w[:5, :3]); ref = x[:1, :3] @ w[:5, :3].T",
    "linear_edges": "y = ops.linear(x, w, b, 'gelu', r); ref = gelu64(x @ w.T + b) + r",
    "packed_decode": "y = ops.PackedLinear(w, b, 'silu')(x[:1]); ref = silu64(x[:1] @ w.T + b)",
    "packed_wide": "y = ops.PackedLinear(W2)(x[:7]); ref = x[:7] @ W2.T",
    "k_zero": "y = ops.linear(x[:, :0], w[:, :0], b); "
              "ref = np.broadcast_to(b, (x.shape[0], w.shape[0]))",
    "activation": "y = ops.gelu(x[:, :13].ravel()[:37]); ref = gelu64(x[:, :13].ravel()[:37])",
    "linear_layer_norm": "y = ops.PackedLinear(w, b)._then_layer_norm(x, r, None, None, 1e-5); "
                         "s = x.astype(np.float64) @ w.T + b + r; "
                         "ref = (s - s.mean(-1, keepdims=True)) "
                         "/ np.sqrt(s.var(-1, keepdims=True) + 1e-5)",
    # 1001 rows on 8 threads: eight row shares, their work queues and row-block counters
    "linear_shares_layer_norm": "xx = np.repeat(x, 11, 0)[:1001]; rr = np.repeat(r, 11, 0)[:1001]; "
                                "y = ops.PackedLinear(w, b)._then_layer_norm(xx, rr, None, None, "
                                "1e-5, n_threads=8); "
                                "s = xx.astype(np.float64) @ w.T + b + rr; "
                                "ref = (s - s.mean(-1, keepdims=True)) "
                                "/ np.sqrt(s.var(-1, keepdims=True) + 1e-5)",
    "layer_norm": "y = ops.layer_norm(x, None, None, 1e-5, residual=x); s = 2 * x; "
                  "ref = (s - s.mean(-1, keepdims=True)) "
                  "/ np.sqrt(s.var(-1, keepdims=True) + 1e-5)",
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", sorted(FIRST_CALLS))
def test_first_call_in_fresh_process(case, dtype):
    code = textwrap.dedent(f"""
        import numpy as np, scipy.special as sp
        rng = np.random.default_rng(5)
        x = rng.standard_normal((97, 257)).astype("{dtype}")
        w = rng.standard_normal((65, 257)).astype("{dtype}")
        b = rng.standard_normal(65).astype("{dtype}")
        r = rng.standard_normal((97, 65)).astype("{dtype}")
        W2 = rng.standard_normal((513, 257)).astype("{dtype}")
        gelu64 = lambda z: 0.5 * z * sp.erfc(-z.astype(np.float64) / np.sqrt(2))
        silu64 = lambda z: z * sp.expit(z.astype(np.float64))
        import fastattn._ops as ops
        {FIRST_CALLS[case]}
        tol = 2e-4 if "{dtype}" == "float32" else 1e-10
        assert y.dtype == np.dtype("{dtype}"), y.dtype
        np.testing.assert_allclose(y, ref, rtol=tol, atol=tol)
        print("ok")
    """)
    env = dict(os.environ, FASTATTN_NO_WORKSPACE_CACHE="1")
    env["PYTHONPATH"] = os.pathsep.join([FASTATTN_ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300, cwd=TESTS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("ok")


# ------------------------------------------------------------------ concurrency
def test_concurrent_calls_from_python_threads(rng):
    # the GIL is released around the kernels; one PackedLinear shared by several Python
    # threads (each call its own OpenMP team) gives every caller the single-threaded bits
    from concurrent.futures import ThreadPoolExecutor
    x, w, b = _data(rng, 150, 300, 260, np.float32)
    layer = _ops.PackedLinear(w, b, "gelu_tanh")
    expect = layer(x, n_threads=1)
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda i: layer(x, n_threads=1 + i % 3), range(12)))
    for y in outs:
        np.testing.assert_array_equal(y, expect)


def test_built_with_openmp():
    if os.environ.get("FASTATTN_SKIP_OPENMP_TEST"):
        pytest.skip("FASTATTN_SKIP_OPENMP_TEST is set")
    assert _g.openmp_enabled()


@pytest.mark.parametrize("dtype", DTYPES)
def test_fast_call_path_agrees_with_checked_path(rng, dtype):
    """PackedLinear's direct path (2-D C-contiguous input of the weight's dtype, what the models
    pass) gives the bits of the general path, and anything else still goes through the checks."""
    w = rng.standard_normal((70, 33)).astype(dtype)
    b = rng.standard_normal(70).astype(dtype)
    layer = _ops.PackedLinear(w, b, activation="gelu")
    x = rng.standard_normal((9, 33)).astype(dtype)
    res = rng.standard_normal((9, 70)).astype(dtype)
    fast = layer(x, residual=res)
    slow = layer(np.asfortranarray(x), residual=np.asfortranarray(res))
    np.testing.assert_array_equal(fast, slow)
    np.testing.assert_allclose(fast, _ops.gelu(x.astype(np.float64) @ w.T.astype(np.float64) + b)
                               + res, rtol=1e-4 if dtype == np.float32 else 1e-10, atol=1e-5)
    with pytest.raises(ValueError, match="in_features"):
        layer(np.ones((2, 32), dtype))
    with pytest.raises(ValueError, match="residual"):
        layer(x, residual=np.ones((9, 69), dtype))
    # the models' LayerNorm shortcut agrees with the public function
    g, be = rng.standard_normal(33).astype(dtype), rng.standard_normal(33).astype(dtype)
    np.testing.assert_array_equal(_ops._layer_norm_rows(x, g, be, 1e-5),
                                  _ops.layer_norm(np.asfortranarray(x), g, be, 1e-5))
