"""Slow, obviously-correct float64 references (the full score matrix, nanoGPT's manual path).

Kernel-independent: plain NumPy, no fastattn import. Semantics are fastattn's (= PyTorch SDPA's):
bool mask True = may attend, float mask added, causal top-left, a row with no allowed key -> 0.
"""
import numpy as np


def softmax_ref(x, axis=-1):
    """Max-subtracted softmax in float64 (NaN for an all -inf row, like scipy)."""
    x = np.asarray(x, dtype=np.float64)
    m = np.max(x, axis=axis, keepdims=True)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - m)
        return e / e.sum(axis=axis, keepdims=True)


def sdpa_ref(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """Returns (out, weights) in float64 for query (..., L, E), key (..., S, E), value (..., S, Ev)."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    E = q.shape[-1]
    if scale is None:
        scale = 1.0 / np.sqrt(E) if E > 0 else 1.0
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        k = np.repeat(k, g, axis=-3)
        v = np.repeat(v, g, axis=-3)
    L, S = q.shape[-2], k.shape[-2]
    with np.errstate(invalid="ignore", over="ignore"):
        s = (q @ np.swapaxes(k, -1, -2)) * scale
    allowed = np.ones((L, S), dtype=bool)
    if is_causal:
        allowed = np.tril(allowed)
    if attn_mask is not None:
        mask = np.asarray(attn_mask)
        if mask.dtype == bool:
            allowed = allowed & mask
        else:
            mask = mask.astype(np.float64)
            allowed = allowed & (mask != -np.inf)
            with np.errstate(invalid="ignore"):
                s = s + np.where(mask == -np.inf, 0.0, mask)
    allowed = np.broadcast_to(allowed, np.broadcast_shapes(allowed.shape, s.shape))
    s = np.broadcast_to(s, allowed.shape)
    s = np.where(allowed, s, -np.inf)
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.max(s, axis=-1, keepdims=True) if S else np.zeros(s.shape[:-1] + (1,))
        m = np.where(np.isneginf(m), 0.0, m)
        p = np.where(allowed, np.exp(s - m), 0.0)
        l = p.sum(axis=-1, keepdims=True)
        w = np.where(l > 0, p / np.where(l > 0, l, 1.0), np.where(np.isnan(l), np.nan, 0.0))
        # a masked-out key contributes nothing, even if its value is inf or NaN
        vv = np.broadcast_to(v, w.shape[:-2] + v.shape[-2:])
        out = np.einsum("...ls,...se->...le", w, np.nan_to_num(vv, nan=0.0, posinf=0.0, neginf=0.0))
        bad = ~np.isfinite(vv)
        if bad.any():
            # where an allowed key's value is non-finite, fall back to the plain product
            prod = w[..., :, :, None] * vv[..., None, :, :]
            prod = np.where(w[..., :, :, None] == 0, 0.0, prod)
            out = prod.sum(axis=-2)
    return out, w
