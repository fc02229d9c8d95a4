"""Conv1d: torch.nn.Conv1d as one GEMM (im2col, then fastattn's packed GEMM).

A 1-D convolution of x (C_in channels) with a (C_out, C_in, k) kernel is a linear layer over
the windows of x: each output position's C_in * k inputs, in the kernel's (channel, tap)
order, times the weight seen as (C_out, C_in * k). The windows are gathered once (im2col: a
copy of the zero-padded input, k times its size / stride) and the product runs through
:class:`~fastattn.nn.Linear`'s GEMM, bias and activation fused (so the layer packs, compacts
and quantizes to int8 as every linear layer does). Whisper's audio stem is two of them.
"""
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .._validation import check_positive_int, to_numpy
from .linear import Linear

__all__ = ["Conv1d"]


class Conv1d(Linear):
    """``torch.nn.Conv1d(in_channels, out_channels, kernel_size, stride, padding)`` (zero
    padding, dilation 1, one group), inference only.

    Parameters ``weight`` (out_channels, in_channels * kernel_size): torch's (out, in, k)
    kernel flattened (a reshape, no reordering; ``state_dict`` gives it back as (out, in, k)
    and ``load_state_dict`` takes either) and ``bias`` (out_channels,). ``conv(x)`` takes
    (B, in_channels, L) or unbatched (in_channels, L), as torch, and returns (B, out_channels,
    L_out) with ``L_out = (L + 2 * padding - kernel_size) // stride + 1``.
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, bias=True,
                 *, dtype=np.float32, seed=None, quantize=None, _init=None):
        cin = check_positive_int(in_channels, "in_channels")
        k = check_positive_int(kernel_size, "kernel_size")
        stride = check_positive_int(stride, "stride")
        if isinstance(padding, bool) or not isinstance(padding, (int, np.integer)) or \
                padding < 0:
            raise ValueError(f"padding must be an integer >= 0, got {padding!r}")
        super().__init__(cin * k, out_channels, bias, dtype=dtype, seed=seed, _init=_init)
        self.in_channels, self.out_channels, self.kernel_size = cin, self.out_features, k
        self.stride, self.padding = stride, int(padding)
        self._config = {"in_channels": cin, "out_channels": self.out_features,
                        "kernel_size": k, "stride": stride, "padding": self.padding,
                        "bias": self._config["bias"], "dtype": self._config["dtype"]}
        if quantize is not None:
            self.quantize_(quantize)

    def output_length(self, length):
        """L_out for an input of `length` positions."""
        return (length + 2 * self.padding - self.kernel_size) // self.stride + 1

    def _columns(self, x, channels_last):
        """The windows of x as a C-contiguous (B * L_out, in_channels * kernel_size) matrix,
        each row one output position's inputs in the kernel's (channel, tap) order. x: (B,
        L, C_in) when `channels_last`, else (B, C_in, L)."""
        p, k = self.padding, self.kernel_size
        t = 1 if channels_last else 2
        if p:
            pad = [(0, 0)] * 3
            pad[t] = (p, p)
            x = np.pad(x, pad)
        L_out = (x.shape[t] - k) // self.stride + 1
        if L_out < 1:
            raise ValueError(f"the input has {x.shape[t] - 2 * p} positions, fewer than the "
                             f"kernel's {k} (padding {p})")
        win = sliding_window_view(x, k, axis=t)[(slice(None),) * t +
                                                (slice(None, L_out * self.stride, self.stride),)]
        if not channels_last:                  # (B, C, L_out, k) -> (B, L_out, C, k)
            win = win.transpose(0, 2, 1, 3)
        cols = np.empty((x.shape[0], L_out, self.in_channels, k), self.dtype)
        cols[...] = win
        return cols.reshape(-1, self.in_features), L_out

    def _forward(self, x, channels_last=False, activation=None, residual=None, n_threads=None):
        """x (B, C_in, L) (or (B, L, C_in) when `channels_last`) in the module's dtype ->
        ``act(conv(x)) + residual`` as (B * L_out, C_out), positions major (channels last)."""
        cols, _ = self._columns(x, channels_last)
        return super()._forward(cols, residual, activation, None, n_threads)

    def state_dict(self):
        sd = super().state_dict()
        sd["weight"] = sd["weight"].reshape(self.out_channels, self.in_channels,
                                            self.kernel_size)
        return sd

    def load_state_dict(self, state_dict):
        if hasattr(state_dict, "keys") and "weight" in state_dict.keys():
            w = to_numpy(state_dict["weight"])
            if w.shape == (self.out_channels, self.in_channels, self.kernel_size):
                state_dict = dict(state_dict.items(), weight=w.reshape(self.out_channels, -1))
        return super().load_state_dict(state_dict)

    @classmethod
    def _config_from_state_dict(cls, sd, prefix, config):
        config = dict(config)
        w = sd.get(prefix + "weight")
        if w is None or w.ndim != 3:
            raise ValueError(f"state_dict has no 3-D {prefix}weight (a Conv1d's kernel)")
        config.setdefault("out_channels", w.shape[0])
        config.setdefault("in_channels", w.shape[1])
        config.setdefault("kernel_size", w.shape[2])
        config.setdefault("bias", prefix + "bias" in sd)
        return config

    def __call__(self, x):
        arr = to_numpy(x)
        if arr.dtype.kind not in "fiub":
            raise TypeError(f"x must be a real numeric array, got dtype {arr.dtype}")
        batched = arr.ndim == 3
        if arr.ndim not in (2, 3) or arr.shape[-2] != self.in_channels:
            raise ValueError(f"x must have shape (batch, {self.in_channels}, length) or "
                             f"({self.in_channels}, length), got {arr.shape}")
        arr = np.ascontiguousarray(arr if batched else arr[None], dtype=self.dtype)
        y = self._forward(arr)
        L_out = self.output_length(arr.shape[2])
        y = y.reshape(arr.shape[0], L_out, self.out_channels).transpose(0, 2, 1)
        return np.ascontiguousarray(y if batched else y[0])
