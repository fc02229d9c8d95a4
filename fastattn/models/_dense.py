"""The dense maths of the whole models: fastattn's packed GEMM, LayerNorm and a log-softmax.

``Linear(w, b=None, activation=None)`` holds one layer's weight packed once
(:class:`fastattn.PackedLinear`); it is called as ``layer(x, residual=None, n_threads=None)``
-> ``act(x @ w.T + b) + residual`` with bias, activation and residual in the GEMM's epilogue,
and with ``norm=(gamma, beta, eps)`` the post-norm LayerNorm of that too.
The weight is read when the layer is built, so models rebuild their layers after loading weights.
"""
import math

import numpy as np

from .._kernels import _gemm as _g
from .._kernels import _search
from .._ops import PackedLinear
from .._ops import layer_norm as _layer_norm
from .._threads import _effective_n_threads

__all__ = ["Linear", "layer_norm", "log_softmax"]

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


class Linear:
    """``act(x @ weight.T + bias) + residual`` on fastattn's packed-weight GEMM.

    ``size`` is the multiply-adds per input row (out * in)."""

    __slots__ = ("_layer", "size")

    def __init__(self, weight, bias=None, activation=None):
        self._layer = PackedLinear(weight, bias, activation)
        self.size = weight.size

    def __call__(self, x, residual=None, n_threads=None, norm=None):
        """norm: (gamma, beta, eps) to return layer_norm of the result instead, computed inside
        the GEMM as its rows are finished (the same bits)."""
        if norm is None:
            return self._layer(x, residual, n_threads)
        return self._layer._then_layer_norm(x, residual, *norm, n_threads=n_threads)


def layer_norm(x, g, b, eps, n_threads=None):
    """LayerNorm over the last axis of x (N, D) (torch's biased variance), a new array."""
    if (type(x) is np.ndarray and x.ndim == 2 and x.size and x.flags.c_contiguous
            and x.flags.aligned and g is not None and b is not None
            and x.dtype == g.dtype == b.dtype and g.shape == b.shape == (x.shape[1],)
            and g.flags.c_contiguous and b.flags.c_contiguous):
        # the models' own arrays (a decode step makes dozens of these calls): straight to the
        # kernel; anything else goes through the checked public function
        y = np.empty_like(x)
        _g.layer_norm(x, None, g, b, float(eps), y, _effective_n_threads(n_threads))
        return y
    return _layer_norm(x, g, b, eps, n_threads=n_threads)


def log_softmax(x, out=None, n_threads=None):
    """Row-wise log(softmax(x)) over the last axis: x - max - log(sum(exp(x - max))).

    The C kernel (fastattn/_kernels/search_kernels.c: exp in x's dtype, the sum in double, rows
    in parallel, the same result for any thread count); out may be x (in place). A row with a
    NaN or a +inf gives NaN; a row of only -inf stays -inf. float32 and float64 keep their
    dtype; float16 is computed in float32, integers and bools in float64."""
    x = np.asarray(x)
    if x.dtype not in _FLOATS:
        x = x.astype(np.float32 if x.dtype == np.float16 else np.float64)
    if x.ndim < 1:
        raise ValueError(f"x must have at least 1 dimension, got shape {x.shape}")
    nthr = _effective_n_threads(n_threads)
    x2 = x.reshape(math.prod(x.shape[:-1]), x.shape[-1]) if x.ndim != 2 else x
    if out is not None and out.dtype == x.dtype and out.shape == x.shape and \
            out.flags.c_contiguous and out.flags.writeable:
        _search.log_softmax_rows(x2, out.reshape(x2.shape), nthr)
        return out
    y = _search.log_softmax_rows(x2, None, nthr).reshape(x.shape)
    if out is None:
        return y
    out[...] = y
    return out
