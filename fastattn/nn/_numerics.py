"""The dense numerics inside the blocks: linear, layer norm, exact GELU, ReLU (NumPy for now).

Every activation here is a C-contiguous (rows, features) matrix; the functions work in place where
they can, so a block allocates one buffer per step.
"""
import math

import numpy as np

__all__ = []


def _linear(x, weight, bias, out=None):
    """(N, in) @ (out, in).T + bias -> (N, out): one GEMM on the transposed view, bias in place."""
    y = np.matmul(x, weight.T, out=out)
    if bias is not None:
        y += bias
    return y


def _layer_norm(x, weight, bias, eps, out=None):
    """Row-wise (x - mean) / sqrt(var + eps) * weight + bias over the last axis of a 2-D array.

    Biased variance like torch. A constant row gives x - mean == 0 exactly, hence 0 (then bias),
    never NaN: eps keeps the denominator positive.
    """
    mean = x.mean(axis=-1, keepdims=True)
    xc = np.subtract(x, mean, out=out)
    var = np.square(xc).mean(axis=-1, keepdims=True)   # pairwise sums, accurate in float32
    var += eps
    np.sqrt(var, out=var)
    np.divide(1.0, var, out=var)
    xc *= var
    if weight is not None:
        xc *= weight
    if bias is not None:
        xc += bias
    return xc


# Chebyshev coefficients of h(t) = log(erfc(z) * exp(z**2) / t) with t = 2 / (2 + z), z >= 0,
# in the variable y = 2 t - 1 on [-1, 1]. Computed by us with mpmath (40 digits) at 64 Chebyshev
# nodes; the series converges geometrically and the terms below 1e-18 are dropped. Then
# erfc(z) = t * exp(h(t) - z**2) has a relative error of a few ulp for every z >= 0 (the same idea
# as the Chebyshev erfc of Numerical Recipes, 3rd ed., section 6.2, fitted independently).
_ERFC_CHEB = (
    -0.6513268598908547, 0.6419697923564902, 0.019476473204185836, -0.009561514786808632,
    -0.0009465953444820369, 0.00036683949785276145, 4.252332480690777e-05,
    -2.0278578112534242e-05, -1.6242900046470256e-06, 1.3036558355805232e-06,
    1.5626441722066142e-08, -8.523809591492654e-08, 6.5290544390988515e-09,
    5.059343495551469e-09, -9.91364156493033e-10, -2.273651222931836e-10,
    9.646791102015527e-11, 2.3940380830391146e-12, -6.886027526497553e-12,
    8.944879273090725e-13, 3.130921399342958e-13, -1.1270822361367252e-13,
    3.810905255189232e-16, 7.106097613609237e-15, -1.5230282014571043e-15,
    -9.457494571291233e-17, 1.210237189224279e-16, -2.816663087747177e-17,
    5.003005559445904e-20, 2.3281042579529253e-18, -8.446077682509006e-19,
)

# float32 needs only the terms above ~1e-10 (relative error ~1e-9 before float32 rounding)
_N_CHEB = {np.dtype(np.float64): len(_ERFC_CHEB), np.dtype(np.float32): 17}

_GELU_CHUNK = 16384     # elements per chunk: the ~40 passes of the series stay in L1/L2



def _erfc_nonneg(z, out):
    """erfc(z) for z >= 0 (array), written into `out` (same shape, float dtype of z)."""
    coef = _ERFC_CHEB[:_N_CHEB[z.dtype]]
    t = 2.0 / (2.0 + z)
    y2 = 4.0 * t - 2.0                          # 2 * y, y = 2 t - 1
    # Clenshaw: b_k = c_k + 2 y b_{k+1} - b_{k+2};  h = c_0 + y b_1 - b_2
    b1 = np.zeros_like(z)
    b2 = np.zeros_like(z)
    tmp = np.empty_like(z)
    for c in coef[:0:-1]:
        np.multiply(y2, b1, out=tmp)
        tmp -= b2
        tmp += c
        b1, b2, tmp = tmp, b1, b2
    np.multiply(y2, b1, out=tmp)
    tmp *= 0.5
    tmp -= b2
    tmp += coef[0]                               # h
    np.square(z, out=b2)
    tmp -= b2
    np.exp(tmp, out=out)
    out *= t
    return out


def _gelu_(x):
    """Exact GELU in place, x * Phi(x) = x/2 * (1 + erf(x / sqrt(2))), torch's default 'gelu'.

    Phi(x) = 1 - erfc(z)/2 for x >= 0 and erfc(z)/2 for x < 0 with z = |x|/sqrt(2); erfc from the
    Chebyshev series above (no scipy at run time). float64 agrees with math.erf to ~1e-16.
    """
    flat = x.reshape(-1)
    inv_sqrt2 = 1.0 / math.sqrt(2.0)
    for start in range(0, flat.size, _GELU_CHUNK):
        xs = flat[start:start + _GELU_CHUNK]
        z = np.abs(xs)
        z *= inv_sqrt2
        e = _erfc_nonneg(z, out=z)              # erfc(|x|/sqrt 2), in place of z
        e *= 0.5
        phi = np.where(xs >= 0, 1.0 - e, e)
        xs *= phi
    return x


def _relu_(x):
    return np.maximum(x, 0, out=x)


_ACTIVATIONS = {"relu": _relu_, "gelu": _gelu_}
ACTIVATION_NAMES = tuple(_ACTIVATIONS)
