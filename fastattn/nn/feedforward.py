"""The position-wise feed-forward network, linear2(activation(linear1(x)))."""
import numpy as np

from .._validation import (check_choice, check_dtype, check_last_dim, check_option,
                           check_positive_int)
from ._module import _init_for, _Module
from .linear import Linear

# torch.nn's names (plus the tanh GELU and SiLU); run as the first linear layer's epilogue
ACTIVATION_NAMES = ("relu", "gelu", "gelu_tanh", "silu")

__all__ = ["FeedForward"]


class FeedForward(_Module):
    """Position-wise feed-forward network, ``linear2(activation(linear1(x)))``.

    Parameters ``linear1.weight`` (dim_feedforward, d_model), ``linear1.bias``,
    ``linear2.weight`` (d_model, dim_feedforward), ``linear2.bias``. activation: 'relu',
    'gelu' (exact, erf-based, like torch's default), 'gelu_tanh' or 'silu'. ``gated=True``
    (T5 v1.1's gated-GELU, GeGLU): ``linear2(act(linear1(x)) * gate(x))`` with ``gate.*``
    of linear1's shapes.
    """

    def __init__(self, d_model, dim_feedforward=2048, activation="relu", *, bias=True,
                 gated=False, dtype=np.float32, seed=None, _init=None):
        d_model = check_positive_int(d_model, "d_model")
        dim_feedforward = check_positive_int(dim_feedforward, "dim_feedforward")
        activation = check_choice(activation, "activation", ACTIVATION_NAMES)
        dtype = check_dtype(dtype)
        init = _init_for(seed, dtype, _init)
        self.d_model, self.dim_feedforward, self.activation = d_model, dim_feedforward, activation
        self._config = {"d_model": d_model, "dim_feedforward": dim_feedforward,
                        "activation": activation, "bias": check_option(bias, "bias"),
                        "dtype": dtype.name}
        self.gated = check_option(gated, "gated")
        self.linear1 = Linear(d_model, dim_feedforward, bias, dtype=dtype, _init=init)
        self.gate = Linear(d_model, dim_feedforward, bias, dtype=dtype, _init=init) \
            if self.gated else None
        self.linear2 = Linear(dim_feedforward, d_model, bias, dtype=dtype, _init=init)
        self._params = {}
        self._children = {"linear1": self.linear1, "linear2": self.linear2}
        if self.gated:
            self._config["gated"] = True
            self._children["gate"] = self.gate

    @classmethod
    def _config_from_state_dict(cls, sd, prefix, config):
        config = dict(config)
        w1 = sd[prefix + "linear1.weight"]
        config.setdefault("d_model", w1.shape[1])
        config.setdefault("dim_feedforward", w1.shape[0])
        config.setdefault("bias", prefix + "linear1.bias" in sd)
        return config

    def _forward(self, x2d, residual=None, norm=None, n_threads=None):
        """linear2(act(linear1(x2d))) + residual, then `norm` (a LayerNorm) when given."""
        h = self.linear1._forward(x2d, None, self.activation, None, n_threads)   # (N, d_ff),
        if self.gated:                                               # bias + act fused;
            h *= self.gate._forward(x2d, None, None, None, n_threads)  # act(x W1) * (x Wg)
        return self.linear2._forward(h, residual, None, norm, n_threads)

    def _prepack(self):
        self.linear1._prepack(self.activation)
        if self.gated:
            self.gate._prepack()
        self.linear2._prepack()

    def __call__(self, x):
        arr = check_last_dim(x, self.d_model)
        flat = np.ascontiguousarray(arr, dtype=self.dtype).reshape(-1, self.d_model)
        return self._forward(flat).reshape(arr.shape)
