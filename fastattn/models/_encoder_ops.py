"""Numeric primitives of the encoder models, behind one private seam.

Every dense operation an encoder forward pass needs (linear, layer norm with a fused residual,
the activations named by Hugging Face configs) goes through this module and nothing else, so
that the NumPy bodies here can be pointed at compiled kernels without touching the model code.
Attention itself is :func:`fastattn.scaled_dot_product_attention`.

All functions take 2-D row-major arrays of float32 or float64 and keep the dtype.
"""
import math

import numpy as np

__all__ = ["ACTIVATIONS", "activation", "canonical_activation", "layer_norm", "linear"]


def linear(x, weight, bias=None, activation=None):
    """``act(x @ weight.T + bias)``.

    Parameters
    ----------
    x : ndarray, shape (N, in)
    weight : ndarray, shape (out, in)  (PyTorch / Hugging Face layout)
    bias : ndarray, shape (out,), optional
    activation : str, optional
        A key of :data:`ACTIVATIONS`, applied to the result (a GEMM epilogue, once there is a
        compiled one).

    Returns
    -------
    ndarray, shape (N, out), a new array in x's dtype.
    """
    y = np.matmul(x, weight.T)
    if bias is not None:
        y += bias
    if activation is not None:
        ACTIVATIONS[activation](y)
    return y


def layer_norm(x, weight, bias, eps, residual=None):
    """Layer norm over the last axis of ``x + residual`` (torch's biased variance).

    Parameters
    ----------
    x : ndarray, shape (N, H)
        Overwritten: the result is computed in x's buffer, which is returned.
    weight, bias : ndarray, shape (H,)
    eps : float
    residual : ndarray, shape (N, H), optional
        Added to x before normalising (post-norm Transformer blocks: ``LN(sublayer(h) + h)``).

    Returns
    -------
    ndarray, shape (N, H): x's buffer.
    """
    if residual is not None:
        x += residual
    mean = x.mean(axis=-1, keepdims=True)
    x -= mean
    var = np.square(x).mean(axis=-1, keepdims=True)
    var += eps
    np.sqrt(var, out=var)
    np.divide(1.0, var, out=var)
    x *= var
    x *= weight
    x += bias
    return x


# --- activations: each works in place on a float array and returns it ----------------------

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu_exact(x):
    # the erf-based GELU of torch.nn.functional.gelu (approximate='none'); fastattn's own
    # vectorised erfc series, accurate to a few ulp in float32 and float64
    from .. import layers
    return layers._gelu_(x)


def _gelu_tanh_with(c):
    def gelu_tanh(x):
        # 0.5 x (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2/pi): torch's approximate='tanh'
        t = np.multiply(x, x)
        t *= 0.044715
        t += 1.0
        t *= x
        t *= c
        np.tanh(t, out=t)
        t += 1.0
        t *= 0.5
        x *= t
        return x
    return gelu_tanh


def _relu(x):
    return np.maximum(x, 0, out=x)


def _silu(x):
    # x * sigmoid(x) with sigmoid(x) = (1 + tanh(x / 2)) / 2: no exp overflow for large |x|
    t = np.multiply(x, 0.5)
    np.tanh(t, out=t)
    t += 1.0
    t *= 0.5
    x *= t
    return x


_gelu_tanh = _gelu_tanh_with(_SQRT_2_OVER_PI)
# transformers' FastGELUActivation writes the constant as 0.7978845608 and the cubic term as
# x * c * (1 + 0.044715 x^2), the same polynomial; only the constant's last digits differ
_gelu_fast = _gelu_tanh_with(0.7978845608)

#: canonical names -> in-place functions
ACTIVATIONS = {
    "gelu": _gelu_exact,
    "gelu_tanh": _gelu_tanh,
    "gelu_fast": _gelu_fast,
    "relu": _relu,
    "silu": _silu,
}

# Hugging Face `hidden_act` / DistilBERT `activation` strings -> canonical names. Each alias has
# the same formula in transformers/activations.py (checked there): "gelu" and "gelu_python" are
# the erf GELU; "gelu_new", "gelu_pytorch_tanh", "gelu_python_tanh" and "gelu_accurate" are the
# tanh approximation with c = sqrt(2/pi); "swish" and "silu" are x * sigmoid(x).
_HF_NAMES = {
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_python_tanh": "gelu_tanh",
    "gelu_accurate": "gelu_tanh",
    "gelu_fast": "gelu_fast",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}


def canonical_activation(name, field="hidden_act"):
    """Map a Hugging Face activation name to one of :data:`ACTIVATIONS`' keys.

    Raises ValueError naming `field` for a name we do not implement (e.g. "quick_gelu").
    """
    if not isinstance(name, str) or name not in _HF_NAMES:
        raise ValueError(
            f"config field {field}={name!r} is not supported; supported: "
            f"{', '.join(sorted(_HF_NAMES))}")
    return _HF_NAMES[name]


def activation(x, name):
    """Apply the activation `name` (a key of :data:`ACTIVATIONS`) to x in place; returns x.

    x : ndarray of any shape, float32 or float64, writeable.
    """
    return ACTIVATIONS[name](x)
