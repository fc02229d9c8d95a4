"""Positional encodings: the paper's sinusoids, and the tables of the translation models."""
import math

import numpy as np

from .._validation import (check_dtype, check_positive_int, check_real, check_real_input,
                           to_numpy)
from ._module import _init_for, _Module

__all__ = ["sinusoidal_positions", "PositionalEncoding", "positions_table",
           "fairseq_positions_table", "RelativePositionBias", "t5_position_buckets",
           "rotary_tables", "apply_rotary", "counted_position_ids"]

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


def counted_position_ids(ids, pad_id, padding_idx, start=0):
    """Position ids counted over the tokens that are not padding (fairseq's and RoBERTa's,
    transformers' ``create_position_ids_from_input_ids``): ids (B, T) fed at positions
    start .. -> (B, T) int, a token's ``padding_idx + start + its count among its row's
    non-padding tokens so far`` (from 1), a padding token's (``pad_id``) ``padding_idx``.
    M2M100 / NLLB and RoBERTa count from the pad id itself, MPNet from its fixed 1."""
    tok = ids != pad_id
    return (np.cumsum(tok, axis=1) + start) * tok + padding_idx


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


def t5_position_buckets(relative_position, bidirectional, num_buckets, max_distance):
    """T5's bucket of each relative position (key position - query position), int64 array.

    Bidirectional (the encoder): half the buckets for keys after the query; causal (the
    decoder): only keys at or before it. Distances below num_buckets // 2 (per side) get a
    bucket each, larger ones logarithmically spaced buckets up to max_distance, then the last.
    The logarithm is taken in float32 as transformers does, so that the buckets agree at their
    boundaries.
    """
    rel = np.asarray(relative_position, dtype=np.int64)
    buckets = np.zeros(rel.shape, np.int64)
    if bidirectional:
        num_buckets //= 2
        buckets += (rel > 0) * num_buckets
        rel = np.abs(rel)
    else:
        rel = -np.minimum(rel, 0)
    max_exact = num_buckets // 2
    is_small = rel < max_exact
    with np.errstate(divide="ignore"):
        scaled = (np.log(rel.astype(np.float32) / np.float32(max_exact))
                  / np.float32(math.log(max_distance / max_exact))
                  * np.float32(num_buckets - max_exact))
    large = max_exact + np.where(is_small, 0, scaled).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    return buckets + np.where(is_small, rel, large)


class RelativePositionBias(_Module):
    """T5's learned relative position bias, added to every layer's attention scores: parameter
    ``weight`` (num_buckets, num_heads); ``_forward(q_len, k_len, offset)`` -> (1, H, q_len,
    k_len) for queries at positions offset .. offset + q_len - 1 over keys 0 .. k_len - 1."""

    def __init__(self, num_buckets, max_distance, num_heads, bidirectional, *,
                 dtype=np.float32, _init=None):
        self.num_buckets = check_positive_int(num_buckets, "relative_attention_num_buckets")
        self.max_distance = check_positive_int(max_distance, "relative_attention_max_distance")
        if self.num_buckets < (4 if bidirectional else 2):
            raise ValueError(f"relative_attention_num_buckets={num_buckets} is too small")
        H = check_positive_int(num_heads, "num_heads")
        self.bidirectional = bool(bidirectional)
        dtype = check_dtype(dtype)
        init = _init_for(None, dtype, _init)
        self._params = {"weight": init.xavier((self.num_buckets, H))}
        self._children = {}
        self._config = {"num_buckets": self.num_buckets, "max_distance": self.max_distance,
                        "num_heads": H, "bidirectional": self.bidirectional,
                        "dtype": dtype.name}

    def _forward(self, q_len, k_len, offset=0):
        rel = np.arange(k_len)[None, :] - np.arange(offset, offset + q_len)[:, None]
        b = t5_position_buckets(rel, self.bidirectional, self.num_buckets, self.max_distance)
        return np.ascontiguousarray(self._params["weight"][b].transpose(2, 0, 1))[None]


def rotary_tables(positions, head_dim, theta, dtype=np.float32):
    """Rotary position embedding tables (cos, sin), each (T, head_dim) for the positions (T,):
    angle p * theta ** (-2 i / head_dim) for i < head_dim / 2, the halves repeated
    (transformers' default RoPE, computed in float32, then cast to `dtype`)."""
    if head_dim % 2:
        raise ValueError(f"rotary positions need an even head_dim, got {head_dim}")
    inv_freq = (1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32)
                                            / np.float32(head_dim)))).astype(np.float32)
    freqs = np.asarray(positions, dtype=np.float32)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=1)
    return np.cos(emb).astype(dtype), np.sin(emb).astype(dtype)


def apply_rotary(x, cos, sin):
    """x (B, T, H, Dh) (a view, e.g. of a q/k/v projection) rotated in place:
    x * cos + rotate_half(x) * sin, with cos, sin (T, Dh) and rotate_half(x) = (-x2, x1)."""
    half = x.shape[-1] // 2
    c = cos[None, :, None, :half]
    s = sin[None, :, None, :half]
    x1 = x[..., :half].copy()
    x2 = x[..., half:].copy()
    x[..., :half] = x1 * c - x2 * s
    x[..., half:] = x2 * c + x1 * s
