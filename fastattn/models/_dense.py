"""The dense maths of the whole models: fastattn's packed GEMM, LayerNorm and a log-softmax.

``Linear(w, b=None, activation=None)`` holds one layer's weight packed once
(:class:`fastattn.PackedLinear`); it is called as ``layer(x, residual=None, n_threads=None)``
-> ``act(x @ w.T + b) + residual`` with bias, activation and residual in the GEMM's epilogue.
The weight is read when the layer is built, so models rebuild their layers after loading weights.
"""
import numpy as np

from .._kernels import _gemm as _g
from .._ops import PackedLinear
from .._ops import layer_norm as _layer_norm
from .._threads import _effective_n_threads

__all__ = ["Linear", "layer_norm", "log_softmax"]


class Linear:
    """``act(x @ weight.T + bias) + residual`` on fastattn's packed-weight GEMM.

    ``size`` is the multiply-adds per input row (out * in)."""

    __slots__ = ("_layer", "size")

    def __init__(self, weight, bias=None, activation=None):
        self._layer = PackedLinear(weight, bias, activation)
        self.size = weight.size

    def __call__(self, x, residual=None, n_threads=None):
        return self._layer(x, residual, n_threads)


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


def log_softmax(x, out=None):
    """Row-wise log(softmax(x)) over the last axis of (N, V): x - max - log(sum(exp(x - max)))."""
    m = x.max(axis=-1, keepdims=True)
    m[~np.isfinite(m)] = 0          # an all -inf row stays -inf (torch: NaN; not reached here)
    y = np.subtract(x, m, out=out)
    s = np.exp(y).sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        np.log(s, out=s)
    y -= s
    return y
