"""Multi-head attention over the fused kernel, torch.nn.MultiheadAttention's parameters.

Inside a block every activation is a C-contiguous (batch * seq, d_model) matrix. Self-attention
projects q, k and v with ONE GEMM against the packed ``in_proj_weight``; the heads are strided
views (B, H, T, Dh) of that product, passed to :func:`fastattn.scaled_dot_product_attention` as
they are (the kernel takes any strides with a contiguous last axis). The kernel writes its
(B, H, L, Dh) output through a strided view of a (B * L, H * Dh) matrix, the heads side by side,
which goes through W_O as it is. A query that may attend to no
key at all (every key padded) gets zeros (PyTorch gives NaN there, or zeros on its nested-tensor
fast path).
"""
import numpy as np

from .._validation import (as_model_input, check_dtype, check_option, check_positive_int,
                           check_real)
from .._ops import _new_output
from ..functional import _attention_into, scaled_dot_product_attention
from ._masks import _kernel_mask
from ._module import _init_for, _Module
from .positional import apply_rotary
from .linear import Linear

__all__ = ["MultiHeadAttention", "RowSubset"]


class RowSubset:
    """The rows of a (B*T, ...) activation that a model computes (its real tokens): the dense
    layers run on these rows only, and attention scatters their q, k, v among zero rows of a
    buffer kept for the whole forward (rows outside `index` are never written, so they stay
    zero; masked keys, they never reach a real row's output)."""

    __slots__ = ("index", "n_rows", "_bufs")

    def __init__(self, index, n_rows):
        self.index = index                 # (N,) increasing flat row indices
        self.n_rows = n_rows
        self._bufs = {}

    def scatter(self, x):
        """x (N, C) -> (n_rows, C): x in the rows `index`, zeros elsewhere."""
        key = (x.shape[1], x.dtype)
        buf = self._bufs.get(key)
        if buf is None:
            buf = self._bufs[key] = np.zeros((self.n_rows, x.shape[1]), x.dtype)
        buf[self.index] = x
        return buf


class MultiHeadAttention(_Module):
    """Multi-head attention, ``concat(head_1..head_h) @ W_O.T`` with
    ``head_i = softmax(q_i k_i^T / sqrt(d_k) + mask) v_i``; parameters as torch.nn.MultiheadAttention.

    Parameters
    ----------
    embed_dim, num_heads : int
        d_model and h; each head has d_k = embed_dim // num_heads features.
    kdim, vdim : int, optional
        Feature sizes of key and value inputs (default embed_dim). When both equal embed_dim
        the projections are packed in ``in_proj_weight`` (3*embed_dim, embed_dim), else
        ``q_proj_weight``, ``k_proj_weight``, ``v_proj_weight``.
    bias : bool
        ``in_proj_bias`` and ``out_proj.bias``.
    head_dim : int, optional
        Features per head (default embed_dim // num_heads); the heads side by side are
        num_heads * head_dim wide (T5 v1.1: not d_model).
    scale : float, optional
        Multiplies q k^T (default 1 / sqrt(head_dim); T5: 1).
    dtype : float32 or float64
    seed : int, optional
        Random initialisation: Xavier-uniform matrices, zero biases.
    dropout : float
        Accepted for signature compatibility; ignored (inference only).

    Call ``mha(query, key, value, *, key_padding_mask=None, attn_mask=None, is_causal=False,
    need_weights=False, average_attn_weights=True)`` with (B, L, E) / (B, S, kdim) / (B, S, vdim)
    or unbatched arrays; masks follow torch (bool True = not allowed / padding, float added).
    Returns the output (B, L, E), or ``(output, weights)`` with weights (B, L, S) averaged over
    heads or (B, H, L, S).
    """

    _LINEAR_PARAMS = ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight")

    def __init__(self, embed_dim, num_heads, *, kdim=None, vdim=None, bias=True, dtype=np.float32,
                 seed=None, dropout=0.0, head_dim=None, scale=None, _init=None):
        embed_dim = check_positive_int(embed_dim, "embed_dim")
        num_heads = check_positive_int(num_heads, "num_heads")
        if head_dim is None and embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        Dh = embed_dim // num_heads if head_dim is None else check_positive_int(head_dim,
                                                                                 "head_dim")
        if scale is not None:
            scale = check_real(scale, "scale")
        kdim = embed_dim if kdim is None else check_positive_int(kdim, "kdim")
        vdim = embed_dim if vdim is None else check_positive_int(vdim, "vdim")
        dtype = check_dtype(dtype)
        init = _init_for(seed, dtype, _init)
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, Dh
        self.inner_dim = I = num_heads * Dh              # the heads side by side
        self.scale = scale                              # None: 1 / sqrt(head_dim)
        self.kdim, self.vdim = kdim, vdim
        self.packed = kdim == embed_dim and vdim == embed_dim
        self._config = {"embed_dim": embed_dim, "num_heads": num_heads, "kdim": kdim, "vdim": vdim,
                        "bias": check_option(bias, "bias"), "dtype": dtype.name}
        if head_dim is not None:
            self._config["head_dim"] = Dh
        if scale is not None:
            self._config["scale"] = scale
        E = embed_dim
        if self.packed:
            self._params = {"in_proj_weight": init.xavier((3 * I, E))}
        else:
            self._params = {"q_proj_weight": init.xavier((I, E)),
                            "k_proj_weight": init.xavier((I, kdim)),
                            "v_proj_weight": init.xavier((I, vdim))}
        if bias:
            self._params["in_proj_bias"] = init.zeros((3 * I,))
        self.out_proj = Linear(I, E, bias, dtype=dtype, _init=init)
        self._children = {"out_proj": self.out_proj}

    @classmethod
    def _config_from_state_dict(cls, sd, prefix, config):
        config = dict(config)
        if "num_heads" not in config:
            raise TypeError("from_torch_state_dict needs num_heads= (the head count is not in the shapes)")
        if prefix + "in_proj_weight" in sd:
            E = sd[prefix + "in_proj_weight"].shape[1]
            kdim = vdim = E
        elif prefix + "q_proj_weight" in sd:
            E = sd[prefix + "q_proj_weight"].shape[0]
            kdim = sd[prefix + "k_proj_weight"].shape[1] if prefix + "k_proj_weight" in sd else E
            vdim = sd[prefix + "v_proj_weight"].shape[1] if prefix + "v_proj_weight" in sd else E
        else:
            raise ValueError(f"state_dict has neither {prefix}in_proj_weight nor {prefix}q_proj_weight")
        config.setdefault("embed_dim", E)
        config.setdefault("kdim", kdim)
        config.setdefault("vdim", vdim)
        config.setdefault("bias", prefix + "in_proj_bias" in sd)
        return config

    # -- projections ---------------------------------------------------------------------------
    def _proj(self, which):
        """The packed q (0), k (1), v (2) projection, or q, k, v (None) / k, v (12) together
        when the weights are packed in in_proj_weight."""
        fast = self.__dict__.get("_fast")
        lin = fast.get(which) if fast else None
        return lin if lin is not None else self._fast_packed(which,
                                                             lambda: self._proj_packed(which))

    def _proj_packed(self, which):
        E = self.inner_dim
        if self.packed:
            if which is None:
                return self._packed("in_proj_weight", "in_proj_bias")
            rows = (E, 3 * E) if which == 12 else (which * E, (which + 1) * E)
            return self._packed("in_proj_weight", "in_proj_bias", rows=rows)
        # separate weights (kdim or vdim != embed_dim), each with its slice of in_proj_bias
        return self._packed(("q_proj_weight", "k_proj_weight", "v_proj_weight")[which],
                            "in_proj_bias", bias_rows=(which * E, (which + 1) * E))

    def _prepack(self, cross=False):
        """Pack the projections now (else on first use): q, k, v together for self-attention,
        q and k, v for cross-attention."""
        if cross:
            self._proj(0)
            self._proj(12)
        else:
            self._proj(None)
        self.out_proj._prepack()

    def _heads(self, x2d, B, T, col):
        """Columns [col, col + H*Dh) of the projected (B*T, n*H*Dh) matrix as a (B, H, T, Dh)
        view."""
        I, H, Dh = self.inner_dim, self.num_heads, self.head_dim
        return x2d[:, col:col + I].reshape(B, T, H, Dh).swapaxes(1, 2)

    def _attend(self, q, k, v, mask, causal, B, L, residual=None, norm=None, need_weights=False,
                keep=None, n_threads=None, attn_threads=None, padded=False):
        """Attention of q (B, H, L, Dh) over k, v (B, H, S, Dh), then W_O (+ residual, then the
        LayerNorm `norm`, both inside the output projection's GEMM) -> (B*L, E) (the rows `keep`
        of it when given), and the (B, H, L, S) weights or None. padded: L is a padded length
        (a full-sequence pass): the kernel then takes the same path for every L, so that a
        row's result does not depend on the padding of its batch."""
        # the heads written side by side into concat (B*L, E), W_O's input as it is; cache-line
        # aligned (_new_output), so that two heads never share a line: written by two threads at
        # once, such lines made an 8 x 8 x 128 x 128 x 64 call 5% slower, 32 x 12 x 128 x 128 x 32
        # 15% (bench/studies/bench_attention_out.py)
        concat = _new_output((B * L, self.inner_dim), q.dtype)
        heads = concat.reshape(B, L, self.num_heads, self.head_dim).swapaxes(1, 2)
        thr = n_threads if attn_threads is None else attn_threads
        # an int8 layer runs the portable attention: with its portable int8 projections, the
        # same bits on every CPU (docs/int8.md)
        portable = self.quantize == "int8"
        if need_weights:
            w = scaled_dot_product_attention(
                q, k, v, mask, is_causal=causal, scale=self.scale, return_weights=True,
                out=heads, n_threads=thr, _packed_only=padded, _portable=portable)[1]
        else:
            w = None
            _attention_into(q, k, v, mask, heads, causal, self.scale, thr, padded, portable)
        if keep is not None:
            concat = concat[keep.index]
        return self.out_proj._forward(concat, residual, None, norm, n_threads), w

    def _forward(self, xq, xk, xv, B, L, S, kmask, need_weights=False, average=True, residual=None,
                 norm=None, keep=None, n_threads=None, attn_threads=None, rope=None):
        """xq (B*L, E), xk (B*S, kdim), xv (B*S, vdim) C-contiguous -> (B*L, E) [+ residual,
        then the LayerNorm `norm`, both inside the output projection's GEMM], weights or None.

        keep (a RowSubset; self-attention only): xq holds only the rows keep.index (flat indices
        into B*L) of the sequences (padding skipped); the other rows' keys and values are zeros,
        masked by kmask, and the result holds the rows keep.index alone. rope (self-attention
        only): (cos, sin) tables (L, head_dim) rotating q and k (rotary positions)."""
        E = self.inner_dim
        if self.packed and xq is xk and xk is xv:           # self-attention: one GEMM for q, k, v
            qkv = self._proj(None)(xq, n_threads=n_threads)
            if keep is not None:                           # the real rows among zero rows
                qkv = keep.scatter(qkv)
            if rope is not None:
                H, Dh = self.num_heads, self.head_dim
                for col in (0, E):
                    apply_rotary(qkv[:, col:col + E].reshape(B, L, H, Dh), *rope)
            q, k, v = self._heads(qkv, B, L, 0), self._heads(qkv, B, S, E), self._heads(qkv, B, S, 2 * E)
        elif self.packed and xk is xv:                      # cross-attention: one GEMM for k, v
            q = self._heads(self._proj(0)(xq, n_threads=n_threads), B, L, 0)
            k, v = self._kv_heads(xk, B, S, n_threads)
        else:
            q = self._heads(self._proj(0)(xq, n_threads=n_threads), B, L, 0)
            k = self._heads(self._proj(1)(xk, n_threads=n_threads), B, S, 0)
            v = self._heads(self._proj(2)(xv, n_threads=n_threads), B, S, 0)
        out, w = self._attend(q, k, v, kmask.mask, kmask.causal, B, L, residual, norm,
                              need_weights, keep, n_threads, attn_threads, padded=True)
        if need_weights and average:
            w = w.mean(axis=1)
        return out, w

    def _kv_heads(self, mem, B, S, n_threads=None):
        """Keys and values of mem (B*S, E) with one GEMM: (B, H, S, Dh) strided views."""
        kv = self._proj(12)(mem, n_threads=n_threads)
        return self._heads(kv, B, S, 0), self._heads(kv, B, S, self.inner_dim)

    def _cross_kv(self, mem, B, S, n_threads=None):
        """The cross-attention keys and values of a decoder's memory (B*S, E), computed once per
        source: contiguous (B, H, S, Dh) copies, so that every decode step reads each head's
        keys and values as one block (the strided views of the GEMM output put each 64-float
        key row 4 KiB from the next, ~20% slower a step)."""
        k, v = self._kv_heads(mem, B, S, n_threads)
        return np.ascontiguousarray(k), np.ascontiguousarray(v)

    def _step_self(self, x, n, T, kv_append, residual=None, norm=None, n_threads=None,
                   mask=None):
        """Cached causal self-attention of x (n*T, E), T new positions per row: kv_append(k, v)
        stores the new keys and values (n, T, H, Dh) and returns every position's so far
        (n, H, t0 + T, Dh). mask: an additive (position) bias (1, H, T, t0 + T) or None."""
        I, H, Dh = self.inner_dim, self.num_heads, self.head_dim
        qkv = self._proj(None)(x, None, n_threads)                      # (n*T, 3 H Dh)
        k_all, v_all = kv_append(qkv[:, I:2 * I].reshape(n, T, H, Dh),
                                 qkv[:, 2 * I:].reshape(n, T, H, Dh))
        return self._attend(self._heads(qkv, n, T, 0), k_all, v_all, mask, T > 1, n, T,
                            residual, norm, n_threads=n_threads)[0]

    def _step_cross(self, x, k, v, mask, n_src, rows, residual=None, norm=None, n_threads=None,
                    padded=False):
        """Cross-attention of x (n_src * rows, E) over per-source keys and values k, v
        (n_src, H, S, Dh): the `rows` query rows of one source (its beams x positions) stacked
        on the query axis of one attention call, so each source's keys are read once.
        padded: the kernel's path the same for every `rows` (a chunk of several positions: a
        row's bits then do not depend on how many rows its source brings, e.g. a prefix fed
        once per source or once per beam)."""
        q = self._heads(self._proj(0)(x, None, n_threads), n_src, rows, 0)
        return self._attend(q, k, v, mask, False, n_src, rows, residual, norm,
                            n_threads=n_threads, padded=padded)[0]

    def __call__(self, query, key, value, *, key_padding_mask=None, attn_mask=None, is_causal=False,
                 need_weights=False, average_attn_weights=True):
        need_weights = check_option(need_weights, "need_weights")
        average_attn_weights = check_option(average_attn_weights, "average_attn_weights")
        dt = self.dtype
        xq, B, L, batched = as_model_input(query, "query", self.embed_dim, dt)
        same_kv = key is value
        self_attn = query is key and same_kv
        xk, Bk, S, kb = as_model_input(key, "key", self.kdim, dt)
        if self_attn:
            xk = xv = xq
            Bv, Sv, vb = B, S, batched
        elif same_kv and self.kdim == self.vdim:
            xv, Bv, Sv, vb = xk, Bk, S, kb
        else:
            xv, Bv, Sv, vb = as_model_input(value, "value", self.vdim, dt)
        if not (batched == kb == vb):
            raise ValueError("query, key and value must all be batched (3-D) or all unbatched (2-D), "
                             f"got query {np.shape(query)}, key {np.shape(key)}, value {np.shape(value)}")
        if not (B == Bk == Bv) or S != Sv:
            raise ValueError("query, key and value must share the batch size and key and value the "
                             f"sequence length, got query {np.shape(query)}, key {np.shape(key)}, "
                             f"value {np.shape(value)}")
        kmask = _kernel_mask(attn_mask, key_padding_mask, is_causal, B, self.num_heads, L, S, dt, batched)
        out, w = self._forward(xq, xk, xv, B, L, S, kmask, bool(need_weights), bool(average_attn_weights))
        out = out.reshape(B, L, self.embed_dim) if batched else out.reshape(L, self.embed_dim)
        if not need_weights:
            return out
        return out, (w if batched else w[0])

