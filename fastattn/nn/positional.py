"""Positional encodings: the paper's sinusoids, and the tables of the translation models."""
import math

import numpy as np

from .._validation import (check_dtype, check_positive_int, check_real, check_real_input,
                           to_numpy)

__all__ = ["sinusoidal_positions", "PositionalEncoding", "positions_table",
           "fairseq_positions_table"]

POSITION_LAYOUTS = ("marian", "interleaved")


def sinusoidal_positions(length, d_model, dtype=np.float32):
    """The paper's positional encodings, (length, d_model), position 0 first:
    PE[pos, 2i] = sin(pos / 10000**(2i / d_model)), PE[pos, 2i + 1] = cos(same angle).

    Computed in float64, then cast to `dtype`.
    """
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 0:
        raise ValueError(f"length must be a non-negative integer, got {length!r}")
    d_model = check_positive_int(d_model, "d_model")
    dtype = check_dtype(dtype)
    pos = np.arange(length, dtype=np.float64)[:, None]
    inv_freq = np.exp(-math.log(10000.0) * np.arange(0, d_model, 2, dtype=np.float64) / d_model)
    angle = pos * inv_freq                                   # (length, ceil(d/2))
    pe = np.empty((length, d_model), dtype=np.float64)
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle[:, : d_model // 2])
    return pe.astype(dtype)


def positions_table(n_positions, d_model, layout="marian", dtype=np.float32):
    """Sinusoidal position table (n_positions, d_model) of a translation model.

    ``"marian"``: sin(p * w_i) in columns [0, d/2), cos(p * w_i) in [d/2, d) with
    w_i = 10000 ** (-2 i / d) (transformers' MarianSinusoidalPositionalEmbedding, including its
    float32 rounding of the table); ``"interleaved"``: the paper's layout, sin in even columns,
    cos in odd ones (``fastattn.sinusoidal_positions``).
    """
    pos = np.arange(n_positions, dtype=np.float64)[:, None]
    j = np.arange(d_model)
    # p / 10000 ** (2 (j // 2) / d), evaluated like transformers (a division, in float64)
    angle = pos / np.power(10000, 2 * (j // 2) / d_model)
    if layout == "marian":
        half = d_model // 2 if d_model % 2 == 0 else d_model // 2 + 1
        out = np.empty((n_positions, d_model), np.float64)
        out[:, :half] = np.sin(angle[:, 0::2])
        out[:, half:] = np.cos(angle[:, 1::2])
        return out.astype(np.float32).astype(dtype)
    if layout == "interleaved":
        out = np.empty((n_positions, d_model), np.float64)
        out[:, 0::2] = np.sin(angle[:, 0::2])
        out[:, 1::2] = np.cos(angle[:, 1::2])
        return out.astype(dtype)
    raise ValueError(f"positions must be one of {POSITION_LAYOUTS + ('learned',)}, got {layout!r}")


def fairseq_positions_table(n_positions, d_model, padding_idx=None, dtype=np.float32):
    """fairseq's (tensor2tensor's) sinusoid table (n_positions, d_model) of M2M100 and NLLB:
    sin(p * w_i) in columns [0, h), cos(p * w_i) in [h, 2h) with h = d // 2 and
    w_i = exp(-i * log(10000) / (h - 1)), a zero column last when d is odd, and a zero row at
    `padding_idx`. Computed in float32 as transformers does (M2M100SinusoidalPositionalEmbedding).
    """
    half = d_model // 2
    step = math.log(10000) / (half - 1) if half > 1 else 0.0
    freq = np.exp(np.arange(half, dtype=np.float32) * np.float32(-step))
    angle = np.arange(n_positions, dtype=np.float32)[:, None] * freq[None, :]
    out = np.zeros((n_positions, d_model), np.float32)
    out[:, :half] = np.sin(angle)
    out[:, half:2 * half] = np.cos(angle)
    if padding_idx is not None:
        out[padding_idx] = 0
    return out.astype(dtype)


class PositionalEncoding:
    """Adds :func:`sinusoidal_positions` to (batch, seq, d_model) or (seq, d_model) inputs.

    ``scale`` optionally multiplies the input first (the paper scales embeddings by sqrt(d_model)).
    Returns a new array in `dtype`.
    """

    def __init__(self, d_model, max_len=5000, *, scale=1.0, dtype=np.float32):
        self.d_model = check_positive_int(d_model, "d_model")
        self.dtype = check_dtype(dtype)
        self.scale = check_real(scale, "scale")
        if not math.isfinite(self.scale):
            raise ValueError(f"scale must be finite, got {self.scale}")
        self.pe = sinusoidal_positions(check_positive_int(max_len, "max_len"), self.d_model, self.dtype)

    def __call__(self, x):
        arr = check_real_input(to_numpy(x), "x")
        if arr.ndim < 2 or arr.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (..., seq, {self.d_model}), got {arr.shape}")
        T = arr.shape[-2]
        if T > self.pe.shape[0]:
            self.pe = sinusoidal_positions(T, self.d_model, self.dtype)
        out = np.array(arr, dtype=self.dtype, copy=True)
        if self.scale != 1.0:
            out *= self.scale
        out += self.pe[:T]
        return out
