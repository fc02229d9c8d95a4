"""Layer normalisation, torch.nn.LayerNorm's parameters."""
import numpy as np

from .._validation import check_dtype, check_eps, check_last_dim, check_option, check_positive_int
from .._kernels import _gemm as _g
from .._kernels import _qgemm as _qg
from .._ops import _layer_norm_rows, layer_norm
from .._threads import _effective_n_threads
from ._module import _init_for, _Module

__all__ = ["LayerNorm", "RMSNorm", "Identity"]


class LayerNorm(_Module):
    """Layer normalisation over the last axis: (x - mean) / sqrt(var + eps) * weight + bias.

    A zero-variance row gives zeros (then + bias) when eps > 0 (with eps = 0 it gives NaN, as
    torch does). Parameters ``weight`` (ones) and
    ``bias`` (zeros) as torch.nn.LayerNorm.
    """

    def __init__(self, normalized_shape, eps=1e-5, *, bias=True, dtype=np.float32, _init=None):
        d = check_positive_int(normalized_shape, "normalized_shape")
        eps = check_eps(eps)
        dtype = check_dtype(dtype)
        init = _init_for(None, dtype, _init)
        self.normalized_shape, self.eps = d, eps
        self._config = {"normalized_shape": d, "eps": eps, "bias": check_option(bias, "bias"),
                        "dtype": dtype.name}
        self._params = {"weight": init.ones((d,))}
        if bias:
            self._params["bias"] = init.zeros((d,))
        self._children = {}

    @classmethod
    def _config_from_state_dict(cls, sd, prefix, config):
        config = dict(config)
        config.setdefault("normalized_shape", sd[prefix + "weight"].shape[0])
        config.setdefault("bias", prefix + "bias" in sd)
        return config

    def _forward(self, x2d, residual=None, n_threads=None):
        """LayerNorm(x2d + residual) in one pass: (N, d) -> a new (N, d) array. In an int8 model
        the int8 layers' LayerNorm (the same bits on every CPU: docs/int8.md)."""
        if self.quantize == "int8" and self.dtype == np.float32:
            return _portable_layer_norm(x2d, residual, self._params["weight"],
                                        self._params.get("bias"), self.eps, n_threads)
        if residual is None:
            return _layer_norm_rows(x2d, self._params["weight"], self._params.get("bias"),
                                    self.eps, n_threads)
        return layer_norm(x2d, self._params["weight"], self._params.get("bias"), self.eps,
                          residual, n_threads=n_threads)

    def __call__(self, x):
        arr = check_last_dim(x, self.normalized_shape)
        flat = np.ascontiguousarray(arr, dtype=self.dtype).reshape(-1, self.normalized_shape)
        return self._forward(flat).reshape(arr.shape)


def _portable_layer_norm(x2d, residual, weight, bias, eps, n_threads=None):
    """LayerNorm(x2d + residual) * weight + bias by the int8 layers' kernel (_qgemm's: 16 lanes,
    nothing fused, the same bits on every ISA and architecture). float32."""
    x2d = np.ascontiguousarray(x2d, dtype=np.float32)
    if residual is not None:
        residual = np.ascontiguousarray(residual, dtype=np.float32)
        if residual.shape != x2d.shape:
            raise ValueError(f"residual must have x's shape {x2d.shape}, got {residual.shape}")
    y = np.empty_like(x2d)
    _qg.layer_norm_rows(x2d, residual, weight, bias, float(eps), y,
                        _effective_n_threads(n_threads))
    return y


class RMSNorm(_Module):
    """Root-mean-square normalisation over the last axis: x / sqrt(mean(x^2) + eps) * weight
    (T5's LayerNorm: no mean subtracted, no bias). The mean of squares is accumulated in float64.
    Parameter ``weight`` (ones)."""

    def __init__(self, normalized_shape, eps=1e-6, *, dtype=np.float32, _init=None):
        d = check_positive_int(normalized_shape, "normalized_shape")
        eps = check_eps(eps)
        dtype = check_dtype(dtype)
        init = _init_for(None, dtype, _init)
        self.normalized_shape, self.eps = d, eps
        self._config = {"normalized_shape": d, "eps": eps, "dtype": dtype.name}
        self._params = {"weight": init.ones((d,))}
        self._children = {}

    @classmethod
    def _config_from_state_dict(cls, sd, prefix, config):
        config = dict(config)
        config.setdefault("normalized_shape", sd[prefix + "weight"].shape[0])
        return config

    def _forward(self, x2d, residual=None, n_threads=None):
        """RMSNorm(x2d + residual): (N, d) -> a new (N, d) array, one C pass per row (the sum of
        squares and the products in double; the same bits for any thread count and batch)."""
        w = self._params["weight"]
        if not (type(x2d) is np.ndarray and x2d.ndim == 2 and x2d.size
                and x2d.dtype == w.dtype and x2d.flags.c_contiguous and x2d.flags.aligned):
            x2d = np.ascontiguousarray(x2d, dtype=w.dtype)
            if x2d.ndim != 2 or not x2d.size:
                return x2d.copy()
        if residual is not None and not (type(residual) is np.ndarray
                                         and residual.dtype == w.dtype
                                         and residual.flags.c_contiguous
                                         and residual.flags.aligned):
            residual = np.ascontiguousarray(residual, dtype=w.dtype)
        if residual is not None and residual.shape != x2d.shape:
            raise ValueError(f"residual must have x's shape {x2d.shape}, got {residual.shape}")
        y = np.empty_like(x2d)
        _g.rms_norm(x2d, residual, w, self.eps, y, _effective_n_threads(n_threads))
        return y

    def __call__(self, x):
        arr = check_last_dim(x, self.normalized_shape)
        flat = np.ascontiguousarray(arr, dtype=self.dtype).reshape(-1, self.normalized_shape)
        return self._forward(flat).reshape(arr.shape)


class Identity(_Module):
    """No normalisation (ModernBERT's first layer has no attention norm): x (+ residual)."""

    def __init__(self, *, dtype=np.float32):
        self._config = {"dtype": check_dtype(dtype).name}
        self._params = {}
        self._children = {}

    def _forward(self, x2d, residual=None, n_threads=None):
        return x2d if residual is None else x2d + residual
