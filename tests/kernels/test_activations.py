"""fastattn's activation kernels against independent float64 references.

erf: float32 <= 2 ulp against scipy.special.erf over a sweep of every 97th float32 bit pattern
(both signs) plus a dense linear sweep, for every kernel set the CPU runs; float64 (libm's erf)
against scipy (which is itself up to 3 ulp off; mpmath spot checks pin libm at <= 1 ulp).
gelu / gelu_tanh / silu against float64 formulas, at +-0, +-inf, NaN and large |x|.
"""
import os

import numpy as np
import pytest
import scipy.special as sp

from fastattn import _ops
from fastattn._kernels import _gemm as _g

EPS32 = float(np.finfo(np.float32).eps)
# ci/sanitize.sh runs an -O0 ASan build, 10-50x slower: sweep every 9973rd bit pattern there
SWEEP_STEP = 9973 if os.environ.get("FASTATTN_SANITIZED") else 97
DENSE = 14_001 if os.environ.get("FASTATTN_SANITIZED") else 1_400_001
# relative tolerances per activation and dtype (float32 tails: see test_*_tails for the reason)
RTOL = {
    ("gelu", np.float32): 1e-5, ("gelu_tanh", np.float32): 1.2e-5, ("silu", np.float32): 4 * EPS32,
    ("gelu", np.float64): 1e-13, ("gelu_tanh", np.float64): 1e-13, ("silu", np.float64): 1e-14,
}
# float32 gelu is flushed to -0 below x = -9.19, where |gelu| < 2e-19
ATOL = {np.float32: 2e-19, np.float64: 1e-300}
# Why the float32 tails need ~80 eps: gelu(x) ~ x exp(-x^2 / 2) there, so the float32 rounding
# of x / sqrt 2 (or of u in the tanh form) alone moves the result by |x|^2 eps; the kernel adds
# a few eps more. Away from the tails (x >= -3) it is within 4e-6 (test_gelu_core_accuracy).


def _kernel(x, code, n_threads=2):
    y = np.empty_like(x)
    _g.activation(x, y, code, n_threads)
    return y


def _ulp_error(y, ref, dtype):
    spacing = np.spacing(np.abs(ref).astype(dtype)).astype(np.float64)
    return np.abs(y.astype(np.float64) - ref) / spacing


def _float32_sweep():
    bits = np.arange(0, 0x7F800000, SWEEP_STEP, dtype=np.uint32).view(np.float32)
    dense = np.linspace(-7, 7, DENSE, dtype=np.float32)
    # every float32 around the kernel's interval switches at |x| = 1, 2, 6.5
    around = [np.arange(-4096, 4097, dtype=np.int64) + np.float32(c).view(np.int32)
              for c in (1.0, 2.0, 6.5)]
    around = np.concatenate(around).astype(np.int32).view(np.float32)
    return np.concatenate([bits, -bits, dense, around, -around])


def test_erf_float32_within_2_ulp(isa):
    x = _float32_sweep()
    y = _kernel(x, _g.ACT_ERF)
    ref = sp.erf(x.astype(np.float64))
    err = _ulp_error(y, ref, np.float32)
    worst = int(np.argmax(err))
    assert err.max() <= 2.0, f"{isa}: {err.max():.3f} ulp at x={x[worst]!r}"


def test_erf_float64_against_scipy_and_mpmath(isa):
    mp = pytest.importorskip("mpmath")
    x = np.concatenate([np.linspace(-7, 7, DENSE // 2),
                        np.arange(0, 0x7F800000, 10 * SWEEP_STEP + 27, dtype=np.uint32)
                        .view(np.float32)
                        .astype(np.float64) * 1.0000001])
    y = _kernel(x, _g.ACT_ERF)
    err = _ulp_error(y, sp.erf(x), np.float64)
    assert err.max() <= 4.0           # scipy.special.erf is itself up to 3 ulp off here
    mp.mp.dps = 40
    pts = np.random.default_rng(7).uniform(-6, 6, 400)
    ypts = _kernel(pts, _g.ACT_ERF)
    exact = np.array([float(mp.erf(mp.mpf(float(t)))) for t in pts])
    assert (_ulp_error(ypts, exact, np.float64) <= 1.0).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_erf_special_values(isa, dtype):
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 30.0, -30.0, 3e38, -3e38],
                 dtype=dtype)
    y = _kernel(x, _g.ACT_ERF)
    assert y[0] == 0 and not np.signbit(y[0])
    assert y[1] == 0 and np.signbit(y[1])
    assert y[2] == 1 and y[3] == -1
    assert np.isnan(y[4])
    assert (_ulp_error(y[5:7], sp.erf(x[5:7].astype(np.float64)), dtype) <= 2).all()
    assert (y[7::2] == 1).all() and (y[8::2] == -1).all()


def _reference(name, x):
    xd = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if name == "gelu":
            ref = 0.5 * xd * sp.erfc(-xd / np.sqrt(2))
        elif name == "gelu_tanh":
            # 0.5 x (1 + tanh u) == x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)
            ref = xd * sp.expit(2 * np.sqrt(2 / np.pi) * (xd + 0.044715 * xd ** 3))
        elif name == "silu":
            ref = xd * sp.expit(xd)
        else:
            ref = np.where(xd < 0, 0.0, xd)
        ref = np.where(np.isneginf(xd), -0.0, ref)
        ref = np.where(np.isposinf(xd), np.inf, ref)
    return ref


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "silu"])
def test_activation_values(isa, dtype, name):
    x = np.concatenate([np.linspace(-9, 12, DENSE // 3), np.linspace(-1e-3, 1e-3, 2001)])
    x = x.astype(dtype)
    y = _kernel(x, _g.ACTIVATIONS[name])
    ref = _reference(name, x)
    np.testing.assert_allclose(y, ref, rtol=RTOL[(name, dtype)], atol=ATOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_values(isa, dtype):
    x = np.array([-2.0, -0.0, 0.0, 3.5, np.inf, -np.inf, np.nan, 1e38], dtype=dtype)
    y = _kernel(x, _g.ACTIVATIONS["relu"])
    np.testing.assert_array_equal(y, np.array([0, -0.0, 0, 3.5, np.inf, 0, np.nan, 1e38], dtype))
    assert np.signbit(y[1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "silu"])
def test_activation_extremes(isa, dtype, name):
    big = float(np.finfo(dtype).max)
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e30, -1e30, big, -big, 50, -50, -200,
                  200], dtype=dtype)
    y = _kernel(x, _g.ACTIVATIONS[name])
    assert y[0] == np.inf
    assert y[1] == 0                                   # the limit, never NaN
    assert np.isnan(y[2])
    assert y[3] == 0 and y[4] == 0
    np.testing.assert_array_equal(y[[5, 7, 9, 12]], x[[5, 7, 9, 12]])   # x for large x
    assert (y[[6, 8]] == 0).all()                      # -0 for huge negative x
    np.testing.assert_allclose(y[11], _reference(name, x[11:12]), rtol=1e-5, atol=ATOL[dtype])
    assert not np.isnan(y[[0, 1] + list(range(3, 13))]).any()
    ref = _reference(name, x[10:11])
    np.testing.assert_allclose(y[10], ref, rtol=1e-5 if dtype == np.float32 else 1e-12,
                               atol=1e-300)


def test_gelu_tails_keep_relative_accuracy(isa):
    # 0.5 x (1 + erf(x / sqrt 2)) would lose every digit here (1 + erf cancels); the kernel
    # evaluates erfc directly, so the relative error stays at a few float32 ulps
    x = np.linspace(-9, -3, DENSE // 10).astype(np.float32)
    y = _kernel(x, _g.ACTIVATIONS["gelu"])
    ref = _reference("gelu", x)
    assert np.max(np.abs(y - ref) / np.abs(ref)) < 1e-5


def test_gelu_core_accuracy(isa):
    x = np.linspace(-3, 12, DENSE // 5).astype(np.float32)
    y = _kernel(x, _g.ACTIVATIONS["gelu"])
    ref = _reference("gelu", x)
    nz = ref != 0
    assert np.max(np.abs(y - ref)[nz] / np.abs(ref[nz])) < 4e-6
    assert (y[~nz] == 0).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 15, 16, 17, 16383, 16384, 16385, 50_001])
def test_every_length_and_thread_count(dtype, n):
    # lengths around the vector width and the parallel chunk; one element's result does not
    # depend on where it sits or on the thread count
    x = np.random.default_rng(n).standard_normal(n).astype(dtype) * 4
    ys = [_ops.gelu(x, n_threads=t) for t in (1, 2, 3, 8)]
    for y in ys[1:]:
        np.testing.assert_array_equal(y, ys[0])
    if n:
        np.testing.assert_allclose(ys[0], _reference("gelu", x), rtol=RTOL[("gelu", dtype)],
                                   atol=ATOL[dtype])
        single = np.array([_ops.gelu(x[i:i + 1])[0] for i in range(min(n, 40))])
        np.testing.assert_array_equal(single, ys[0][:min(n, 40)])


def test_public_functions_layout_and_dtypes(rng):
    x = rng.standard_normal((6, 5, 4)).astype(np.float32).transpose(2, 0, 1)[:, ::-1]
    for fn, name in ((lambda a: _ops.gelu(a), "gelu"),
                     (lambda a: _ops.gelu(a, approximate="tanh"), "gelu_tanh"),
                     (_ops.silu, "silu"), (_ops.relu, "relu")):
        y = fn(x)
        assert y.shape == x.shape and y.dtype == np.float32
        np.testing.assert_allclose(y, _reference(name, x), rtol=1.2e-5, atol=1e-7)
    yi = _ops.relu(np.array([-1, 2, 3]))
    assert yi.dtype == np.float64
    np.testing.assert_array_equal(yi, [0, 2, 3])
    assert _ops.gelu(np.float32(1.0)).shape == ()


def test_public_functions_bad_inputs():
    with pytest.raises(ValueError, match="approximate"):
        _ops.gelu(np.ones(3), approximate="erf")
    with pytest.raises(TypeError, match="x"):
        _ops.silu(np.ones(3, dtype=complex))
    with pytest.raises(TypeError, match="x must be an array"):
        _ops.relu(None)
    with pytest.raises(ValueError, match="n_threads"):
        _ops.gelu(np.ones(3), n_threads=0)
