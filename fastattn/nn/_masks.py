"""PyTorch's module mask convention -> the kernel's, converted once per stack (not per layer).

========================  ==========================  ==============================
                          modules here (= torch.nn)   fastattn.scaled_dot_product_attention
========================  ==========================  ==============================
bool ``attn_mask``        True = NOT allowed          True = may attend
``key_padding_mask``      True = padding (ignored)    (none: pass a (B, 1, 1, S) mask)
float masks               added to the scores         added to the scores
========================  ==========================  ==============================

Broadcast dimensions are kept: a key-padding mask becomes a (B, 1, 1, S) view, a causal mask the
kernel's ``is_causal`` flag (no L x S array at all).
"""
import numpy as np

from .._validation import check_flag, module_mask

__all__ = []


def _is_causal_pattern(m):
    """True if the (L, L) torch-convention mask m forbids exactly the keys after each query."""
    L, S = m.shape
    if L != S:
        return False
    upper = np.triu(np.ones((L, L), dtype=bool), k=1)
    if m.dtype.kind == "b":
        return bool(np.array_equal(m, upper))
    return bool(np.all(m[upper] == -np.inf) and np.all(m[~upper] == 0))


def _additive(m, dtype):
    if m.dtype.kind == "b":
        return np.where(m, dtype.type(-np.inf), dtype.type(0))
    return m


class _KernelMask:
    """A module-level mask set converted once to the kernel's form: (mask or None, is_causal)."""

    __slots__ = ("mask", "causal")

    def __init__(self, mask, causal):
        self.mask = mask
        self.causal = causal


def _kernel_mask(attn_mask, key_padding_mask, is_causal, B, H, L, S, dtype, batched,
                 attn_name="attn_mask", kpm_name="key_padding_mask"):
    """torch.nn.MultiheadAttention masks -> fastattn.scaled_dot_product_attention masks.

    attn_mask: (L, S), or (B*H, L, S) batched / (H, L, S) unbatched; bool True = not allowed,
    float added. key_padding_mask: (B, S) batched / (S,) unbatched; bool True = padding, float
    added. is_causal: the causal mask applies (together with attn_mask unless attn_mask is exactly
    the causal mask, which is then dropped). A causal attn_mask is recognised and run as the
    kernel's is_causal flag. Result broadcasts to (B, H, L, S) without materialising it unless a
    per-head mask forces it.
    """
    causal = check_flag(is_causal, "is_causal")
    am = None
    if attn_mask is not None:
        am = module_mask(attn_mask, attn_name, dtype)
        if am.ndim == 2:
            if am.shape != (L, S):
                raise ValueError(f"{attn_name} of shape {am.shape} should be (L, S) = {(L, S)}")
            if _is_causal_pattern(am):
                causal, am = True, None
        elif am.ndim == 3:
            want = (B * H, L, S) if batched else (H, L, S)
            if am.shape != want:
                raise ValueError(f"{attn_name} of shape {am.shape} should be (L, S) = {(L, S)} or "
                                 f"{'(batch * num_heads, L, S)' if batched else '(num_heads, L, S)'} = {want}")
            am = am.reshape(B, H, L, S)
        else:
            raise ValueError(f"{attn_name} must be 2-D (L, S) or 3-D, got shape {am.shape}")
    kp = None
    if key_padding_mask is not None:
        kp = module_mask(key_padding_mask, kpm_name, dtype, padding=True)
        want = (B, S) if batched else (S,)
        if kp.shape != want:
            raise ValueError(f"{kpm_name} of shape {kp.shape} should be "
                             f"{'(batch, S)' if batched else '(S,)'} = {want}")
        kp = kp.reshape(B, 1, 1, S)
    if am is None and kp is None:
        return _KernelMask(None, causal)
    if kp is None:
        return _KernelMask(np.logical_not(am) if am.dtype.kind == "b" else am, causal)
    if am is None:
        return _KernelMask(np.logical_not(kp) if kp.dtype.kind == "b" else kp, causal)
    if am.dtype.kind == "b" and kp.dtype.kind == "b":
        return _KernelMask(np.logical_not(np.logical_or(am, kp)), causal)   # (B, 1|H, L, S)
    return _KernelMask(_additive(am, dtype) + _additive(kp, dtype), causal)
