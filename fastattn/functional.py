"""The functional API over the compiled kernels: attention, softmax, linear, activations, LayerNorm.

Stateless functions on NumPy arrays (torch.nn.functional's names and semantics); the modules of
:mod:`fastattn.nn` are built from them. ``linear``, ``PackedLinear``, ``gelu``, ``silu``, ``relu``
and ``layer_norm`` live in :mod:`fastattn._ops` (fastattn's own GEMM, no BLAS) and are re-exported
here.
"""

import math

import numpy as np

from . import _validation as _v
from ._kernels import _attention as _k
from ._kernels import _search as _ks
from ._threads import _effective_n_threads

from ._ops import PackedLinear, _new_output, gelu, layer_norm, linear, relu, silu

__all__ = ["scaled_dot_product_attention", "softmax", "log_softmax", "linear", "PackedLinear", "gelu", "silu",
           "relu", "layer_norm"]


def scaled_dot_product_attention(query, key, value, attn_mask=None, *, is_causal=False, scale=None,
                                 enable_gqa=False, return_weights=False, out=None,
                                 n_threads=None, _packed_only=False, _portable=False):
    """Fused scaled dot-product attention, ``softmax(query @ key.T * scale + mask) @ value``.

    Computed tile by tile with an online (max-subtracted) softmax: the L x S score matrix is
    never materialised, so the extra memory is a small scratch area per thread.

    Parameters
    ----------
    query : array_like, shape (..., L, E)
    key : array_like, shape (..., S, E)
    value : array_like, shape (..., S, Ev)
        Leading dimensions broadcast against each other (NumPy rules).
    attn_mask : array_like, optional
        Broadcastable to (..., L, S). **bool**: True means the query may attend to the key
        (PyTorch's SDPA convention). **float**: added to the scaled scores; -inf forbids.
    is_causal : bool
        Query i attends to keys j <= i (top-left aligned when L != S). May be combined with
        `attn_mask`; both then apply.
    scale : float, optional
        Multiplies ``query @ key.T``; default ``1 / sqrt(E)``.
    enable_gqa : bool
        Grouped-query attention: key and value carry fewer heads on dimension -3; query head h
        uses key/value head ``h // (Hq // Hkv)``.
    return_weights : bool
        Also return the softmax weights, shape (..., L, S) (materialised: for inspection).
    out : ndarray, optional
        Where to write the result, of its exact shape and dtype: any writeable view whose last
        axis is contiguous, for instance ``buf.reshape(B, L, H, Ev).transpose(0, 2, 1, 3)`` so
        that the heads land side by side in ``buf`` (B, L, H * Ev), ready for the output
        projection without a copy (start ``buf`` on a 64-byte boundary: where two heads share
        a cache line, the threads writing them slow each other down, by 5-15% at 128 tokens).
        Overlap with the inputs is allowed (the result then goes through a temporary). The
        same values as without `out`, bit for bit.
    n_threads : int, optional
        OpenMP threads for this call (default: :func:`fastattn.get_num_threads`). The result is
        bitwise the same for any value.

    Returns
    -------
    out : ndarray, shape (..., L, Ev)
        float32 for float32 inputs, float64 for float64 (see the dtype table in the README);
        the `out` argument itself when one was given.
        A query row that may attend to no key (all masked, or S == 0) is zeros, never NaN.
    weights : ndarray, shape (..., L, S)
        Only with ``return_weights=True``; rows of fully masked queries are zeros.

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> q = k = v = np.eye(2, dtype=np.float32)
    >>> fastattn.scaled_dot_product_attention(q, k, v).round(4)
    array([[0.6698, 0.3302],
           [0.3302, 0.6698]], dtype=float32)
    """
    q = _v.as_array(query, "query")
    k = _v.as_array(key, "key")
    v = _v.as_array(value, "value")
    mask = None if attn_mask is None else _v.as_array(attn_mask, "attn_mask")
    causal = _v.check_flag(is_causal, "is_causal")
    gqa = _v.check_flag(enable_gqa, "enable_gqa")
    want_w = _v.check_flag(return_weights, "return_weights")
    nthr = _effective_n_threads(n_threads)

    dtype = _v.result_dtype(("query", q), ("key", k), ("value", v))
    lead, L, S, E, Ev, group = _v.check_qkv(q, k, v, gqa)
    scale = _v.check_scale(scale, E, dtype)
    if mask is not None:
        mask, lead = _v.check_mask(mask, L, S, lead)

    shape = tuple(lead) + (L, Ev)
    if out is None:
        out = _new_output(shape, dtype)     # cache-line aligned from 256 KiB up
    else:
        _v.check_out(out, "out", dtype, shape, rows=True)
    weights = np.zeros(tuple(lead) + (L, S), dtype=dtype) if want_w else None
    if S == 0 or (out.size == 0 and (weights is None or weights.size == 0)):
        out[...] = 0          # no key to attend to (S == 0): zeros, by the fully-masked rule
        return (out, weights) if want_w else out

    if E == 0:
        # empty dot products: every score is 0 (uniform weights over the allowed keys)
        q = np.zeros(q.shape[:-1] + (1,), dtype=dtype)
        k = np.zeros(k.shape[:-1] + (1,), dtype=dtype)
    q = _v.kernel_ready(q, dtype)
    k = _v.kernel_ready(k, dtype)
    v = _v.kernel_ready(v, dtype)
    if mask is not None:
        if mask.dtype.kind == "f" and mask.dtype.itemsize > dtype.itemsize:
            mask = _v.narrow_float_mask(mask, dtype)
        mask = _v.kernel_ready(mask, mask.dtype if mask.dtype.kind == "b" else dtype)
    dst = out
    if any(a is not None and np.may_share_memory(out, a) for a in (q, k, v, mask)):
        dst = np.empty(shape, dtype=dtype)         # the kernel reads the inputs while it writes
    # _packed_only (the models' full-sequence passes): never the in-place path that a call of
    # at most 16 query rows takes, so that a row's result does not depend on the padded length
    # _portable (the int8 models): the kernel set's portable attention, the same bits on every
    # ISA and architecture (fa_portable.c)
    _k.sdpa(q, k, v, mask, dst, weights, tuple(lead), causal, scale, group, nthr,
            bool(_packed_only), bool(_portable))
    if dst is not out:
        out[...] = dst
    return (out, weights) if want_w else out


def _attention_into(q, k, v, mask, out, causal, scale, n_threads, packed_only=False,
                    portable=False):
    """The layers' call (a decode step makes two per layer): ``out[...] = attention(q, k, v)``
    for arrays fastattn made itself, straight to the kernel when nothing needs converting or
    checking beyond the tests here (the checked path costs ~17 us a call, more than the kernel
    of a batch-1 step); anything else through :func:`scaled_dot_product_attention` (the same
    kernel, the same arguments, the same bits). q (B, H, L, E), k (B, H, S, E), v (B, H, S, Ev)
    and out (B, H, L, Ev): one float dtype, aligned, last axis contiguous, no broadcasting; out
    a fresh array that overlaps none of the inputs (the caller's guarantee). mask: None, or a
    bool or q.dtype array (B | 1, H | 1, L | 1, S | 1). scale: a float or None. portable: the
    portable kernels (the int8 models: the same bits on every CPU)."""
    dt = q.dtype
    qs, ks, vs = q.shape, k.shape, v.shape
    isz = dt.itemsize
    if (type(q) is np.ndarray and type(k) is np.ndarray and type(v) is np.ndarray
            and type(out) is np.ndarray and q.ndim == k.ndim == v.ndim == 4
            and k.dtype == dt and v.dtype == dt and out.dtype == dt and dt.kind == "f"
            and dt.isnative and qs[:2] == ks[:2] == vs[:2] and qs[3] == ks[3] > 0
            and ks[2] == vs[2] > 0 and qs[2] > 0 and vs[3] > 0
            and out.shape == qs[:3] + vs[3:]
            and q.strides[3] == k.strides[3] == v.strides[3] == out.strides[3] == isz
            and q.flags.aligned and k.flags.aligned and v.flags.aligned and out.flags.aligned
            and out.flags.writeable
            and (mask is None
                 or (type(mask) is np.ndarray and mask.ndim == 4
                     and (mask.dtype == dt or mask.dtype.kind == "b")
                     and mask.flags.aligned
                     and (mask.shape[3] <= 1 or mask.strides[3] == mask.itemsize)
                     and (mask.shape[0] == 1 or mask.shape[0] == qs[0])
                     and (mask.shape[1] == 1 or mask.shape[1] == qs[1])
                     and (mask.shape[2] == 1 or mask.shape[2] == qs[2])
                     and (mask.shape[3] == 1 or mask.shape[3] == ks[2])))):
        if scale is None:
            scale = 1.0 / math.sqrt(qs[3])
        _k.sdpa(q, k, v, mask, out, None, qs[:2], bool(causal), float(scale), 1,
                _effective_n_threads(n_threads), bool(packed_only), bool(portable))
        return out
    return scaled_dot_product_attention(q, k, v, mask, is_causal=causal, scale=scale, out=out,
                                        n_threads=n_threads, _packed_only=packed_only,
                                        _portable=portable)


def softmax(x, axis=-1, *, n_threads=None):
    """Numerically stable softmax along `axis` (the row maximum is subtracted first).

    Matches ``scipy.special.softmax(x, axis=axis)``, including NaN for a row that is all -inf
    and NaN wherever the row holds a NaN. float32 stays float32, float64 stays float64 (dtype
    table in the README).
    """
    arr = _v.as_array(x, "x")
    dtype = _v.result_dtype(("x", arr))
    nthr = _effective_n_threads(n_threads)
    if arr.ndim == 0:
        raise ValueError("softmax needs an array with at least one dimension, got a scalar")
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis must be an int, got {type(axis).__name__} {axis!r}")
    if not -arr.ndim <= axis < arr.ndim:
        raise ValueError(f"axis {axis} is out of bounds for x of shape {arr.shape}")
    moved = np.moveaxis(arr, axis, -1)
    if moved.shape[-1] > _v.DIM_MAX:            # before any copy of a (broadcast) input
        raise ValueError(f"softmax axis length {moved.shape[-1]} exceeds the kernel's limit "
                         f"{_v.DIM_MAX} (32-bit indexes)")
    rows = np.ascontiguousarray(moved, dtype=dtype).reshape(-1, moved.shape[-1]) \
        if moved.size else None
    if rows is not None and not rows.flags.aligned:
        # np.ascontiguousarray hands back a C-contiguous view at an odd byte offset unchanged;
        # the kernel's vector loads need element alignment
        rows = rows.copy()
    out = np.empty(moved.shape, dtype=dtype)
    if rows is not None and rows.shape[1] > 0:
        flat = out.reshape(rows.shape)
        _k.softmax_rows(rows, flat, max(1, min(nthr, rows.shape[0])))
    return np.moveaxis(out, -1, axis)


def log_softmax(x, out=None, n_threads=None):
    """Row-wise ``log(softmax(x))`` over the last axis: ``x - max - log(sum(exp(x - max)))``.

    One C pass per row (``_kernels/search_kernels.c``: exp in x's dtype, the sum in float64,
    rows in parallel, the same result for any thread count). `out` may be `x` (in place). A row
    with a NaN or a +inf gives NaN; a row of only -inf stays -inf. float32 and float64 keep their
    dtype; float16 is computed in float32, integers and bools in float64.
    """
    x = np.asarray(x)
    if x.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        x = x.astype(np.float32 if x.dtype == np.float16 else np.float64)
    if x.ndim < 1:
        raise ValueError(f"x must have at least 1 dimension, got shape {x.shape}")
    nthr = _effective_n_threads(n_threads)
    x2 = x.reshape(math.prod(x.shape[:-1]), x.shape[-1]) if x.ndim != 2 else x
    if out is not None and out.dtype == x.dtype and out.shape == x.shape and \
            out.flags.c_contiguous and out.flags.writeable:
        _ks.log_softmax_rows(x2, out.reshape(x2.shape), nthr)
        return out
    y = _ks.log_softmax_rows(x2, None, nthr).reshape(x.shape)
    if out is None:
        return y
    out[...] = y
    return out
