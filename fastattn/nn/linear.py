"""Linear: y = x @ weight.T + bias, torch.nn.Linear's parameters."""
import numpy as np

from .._validation import check_dtype, check_last_dim, check_option, check_positive_int
from .._quant import check_quantize
from ._module import _init_for, _Module

__all__ = ["Linear"]


class Linear(_Module):
    """y = x @ weight.T + bias; weight (out_features, in_features) as in torch.nn.Linear.

    Random init: Xavier-uniform weight, zero bias. ``lin(x)`` takes (..., in_features) and
    returns (..., out_features) in the module's dtype. ``quantize='int8'``: the weight is
    quantized to int8 (one scale per output channel) and each input row at every call (see
    :class:`fastattn._ops.PackedLinear`); float32 only.
    """

    _LINEAR_PARAMS = ("weight",)

    def __init__(self, in_features, out_features, bias=True, *, dtype=np.float32, seed=None,
                 quantize=None, _init=None):
        in_features = check_positive_int(in_features, "in_features")
        out_features = check_positive_int(out_features, "out_features")
        dtype = check_dtype(dtype)
        init = _init_for(seed, dtype, _init)
        self.in_features, self.out_features = in_features, out_features
        self._config = {"in_features": in_features, "out_features": out_features,
                        "bias": check_option(bias, "bias"), "dtype": dtype.name}
        self._params = {"weight": init.xavier((out_features, in_features))}
        if bias:
            self._params["bias"] = init.zeros((out_features,))
        self._children = {}
        if check_quantize(quantize, dtype) is not None:
            self.quantize_(quantize)

    @classmethod
    def _config_from_state_dict(cls, sd, prefix, config):
        config = dict(config)
        if prefix + "weight" not in sd:
            raise ValueError(f"state_dict has no {prefix}weight (a Linear's weight)")
        config.setdefault("out_features", sd[prefix + "weight"].shape[0])
        config.setdefault("in_features", sd[prefix + "weight"].shape[1])
        config.setdefault("bias", prefix + "bias" in sd)
        return config

    @property
    def weight(self):
        return self._params["weight"]

    @property
    def bias(self):
        return self._params.get("bias")

    def _forward(self, x2d, residual=None, activation=None, norm=None, n_threads=None):
        """act(x2d @ weight.T + bias) + residual: x2d (N, in_features) in the module's dtype ->
        (N, out_features), in one pass of fastattn's GEMM (the weight packed once); then `norm`
        (a LayerNorm over out_features) when given, inside the same GEMM (the same bits as
        norm._forward of the result)."""
        fast = self.__dict__.get("_fast")
        packed = fast.get(activation) if fast else None
        if packed is None:
            packed = self._fast_packed(activation, lambda: self._packed("weight", "bias",
                                                                        activation=activation))
        if norm is None:
            return packed(x2d, residual, n_threads)
        return packed._then_layer_norm(x2d, residual, norm._params["weight"],
                                       norm._params.get("bias"), norm.eps, n_threads)

    def _prepack(self, activation=None):
        """Pack the weight now (else on first use), for calls with this activation."""
        self._packed("weight", "bias", activation=activation)

    def __call__(self, x):
        arr = check_last_dim(x, self.in_features)
        flat = np.ascontiguousarray(arr, dtype=self.dtype).reshape(-1, self.in_features)
        return self._forward(flat).reshape(arr.shape[:-1] + (self.out_features,))
