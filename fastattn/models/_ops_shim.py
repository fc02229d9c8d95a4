"""The numeric primitives the models use, behind one small private module.

Everything in ``fastattn.models`` and ``fastattn.generation`` reaches the dense maths only
through the four names below, so that they can be pointed at faster kernels (packed GEMM, fused
GELU / SiLU / layer norm) in one place without touching the models. Today they are NumPy.

Contract (2-D, C-contiguous float32 or float64 inputs; outputs in the input dtype):

- ``Linear(w, b=None, activation=None)``: a layer holding w (out, in) and b (out,), called as
  ``layer(x, residual=None, n_threads=None)`` -> ``act(x @ w.T + b) + residual`` (N, out).
  ``layer.size`` is the multiply-adds per row (out * in).
  The same shape as ``fastattn._ops.PackedLinear`` (packs once, fuses the epilogue); the
  weight is read when the layer is built, so models rebuild their layers after loading weights.
- ``linear(x, w, b=None, activation=None, residual=None)``: the same, functional
- ``layer_norm(x, g, b, eps, out=None, n_threads=None)``: row-wise over the last axis of (N, D)
- ``activation(name)``: a function applying relu / gelu (exact, erf) / swish (= silu) in place
- ``log_softmax(x, out=None)``: row-wise over the last axis of (N, V)
- ``decode_context()``: a context manager around a decode loop (see below)
"""
import contextlib

import numpy as np

try:                        # the erf GELU of the NumPy blocks (layers.py before the nn/ split)
    from ..layers import _gelu_
except ImportError:         # after it, the compiled _ops below provide gelu
    _gelu_ = None

__all__ = ["Linear", "linear", "layer_norm", "activation", "log_softmax", "decode_context"]


def linear(x, w, b=None, activation=None, residual=None, out=None):
    """act(x (N, in) @ w (out, in).T + b) + residual -> (N, out); one GEMM on the transposed
    view, the epilogue in place."""
    y = np.matmul(x, w.T, out=out)
    if b is not None:
        y += b
    if activation is not None:
        _ACTIVATIONS[activation](y)
    if residual is not None:
        y += residual
    return y


class Linear:
    """``act(x @ weight.T + bias) + residual`` with a fixed weight (out, in) and bias (out,)."""

    __slots__ = ("weight", "bias", "activation", "size")

    def __init__(self, weight, bias=None, activation=None):
        if activation is not None:
            globals()["activation"](activation)          # validates the name
        self.weight, self.bias, self.activation = weight, bias, activation
        self.size = weight.size                          # multiply-adds per input row

    def __call__(self, x, residual=None, n_threads=None):
        return linear(x, self.weight, self.bias, self.activation, residual)


def layer_norm(x, g, b, eps, out=None, n_threads=None):
    """(x - mean) / sqrt(var + eps) * g + b over the last axis of x (N, D); biased variance."""
    mean = x.mean(axis=-1, keepdims=True)
    xc = np.subtract(x, mean, out=out)
    var = np.square(xc).mean(axis=-1, keepdims=True)
    var += eps
    np.sqrt(var, out=var)
    xc /= var
    if g is not None:
        xc *= g
    if b is not None:
        xc += b
    return xc


def _relu_(x):
    return np.maximum(x, 0, out=x)


def _silu_(x):
    # x * sigmoid(x) = x / (1 + exp(-x)); exp overflows to inf for x < -88 (float32) and
    # x / inf = -0.0, the right limit, so no clipping is needed
    t = np.negative(x)
    with np.errstate(over="ignore"):
        np.exp(t, out=t)
    t += 1.0
    x /= t
    return x


_ACTIVATIONS = {"relu": _relu_, "gelu": _gelu_, "swish": _silu_, "silu": _silu_}


def activation(name):
    """The in-place activation function for `name` ('relu', 'gelu', 'swish' / 'silu')."""
    try:
        return _ACTIVATIONS[name]
    except (KeyError, TypeError):
        raise ValueError(f"activation_function must be one of {sorted(_ACTIVATIONS)}, "
                         f"got {name!r}") from None


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


_controller = None


def decode_context():
    """Sequential BLAS while decoding (NumPy backend).

    A decode step is ~40 small-M GEMMs between OpenMP attention calls; OpenBLAS's threads and
    the OpenMP team then take turns spinning on the same two cores, and on a shared machine
    every hand-over waits for a time slice (measured: 16 tokens at batch 8 took 2.7 s with one
    BLAS thread, 8.7-14 s with two, at load 6 on 2 cores). The encoder's large GEMMs keep
    BLAS's threads.
    """
    global _controller
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:              # pragma: no cover - threadpoolctl is a dependency
        return contextlib.nullcontext()
    if _controller is None:
        _controller = ThreadpoolController()
    return _controller.limit(limits=1, user_api="blas")


# --------------------------------------------------------------------------------------------
# the packed-GEMM kernels, when this build has them (fastattn._ops, the GEMM issue): same
# contract, weights packed once per layer, bias / activation / residual fused in the epilogue
# --------------------------------------------------------------------------------------------

try:
    from .. import _ops as _fast
except ImportError:         # NumPy above
    _fast = None

if _fast is not None and all(hasattr(_fast, n) for n in ("PackedLinear", "layer_norm")):

    class Linear:                                    # noqa: F811 - replaces the NumPy layer
        """``act(x @ weight.T + bias) + residual`` on fastattn's packed-weight GEMM."""

        __slots__ = ("_layer", "size")

        def __init__(self, weight, bias=None, activation=None):
            self._layer = _fast.PackedLinear(weight, bias, activation)
            self.size = weight.size

        def __call__(self, x, residual=None, n_threads=None):
            return self._layer(x, residual, n_threads)

    def _fast_gelu_(x):
        x[...] = _fast.gelu(x)
        return x

    _ACTIVATIONS["gelu"] = _fast_gelu_

    def decode_context():                                         # noqa: F811
        """No BLAS in the decode step: nothing to limit."""
        return contextlib.nullcontext()

    def layer_norm(x, g, b, eps, out=None, n_threads=None):      # noqa: F811
        y = _fast.layer_norm(x, g, b, eps, n_threads=n_threads)
        if out is not None:
            out[...] = y
            return out
        return y
