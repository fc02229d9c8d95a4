"""A Seq2SeqTransformer's rows for continuous batching (what ``start_rows`` returns): one KV cache
whose rows hold different lengths, rows joining and leaving between steps.

The decoding itself (settings, processors, the greedy choice, each row's tokens and limit) is
:class:`fastattn.generation.continuous.ContinuousGreedy`'s; it reaches this class only through
:class:`fastattn.generation.continuous.RowState`. Why a row computes here what it computes alone:

- its self-attention keys and values sit at positions 0 .. n - 1 of its own cache row, and a
  step attends over the batch's longest row with the positions past each row's own length
  masked: right padding, which the attention kernel computes exactly as the row alone (the
  masked keys add exact zeros, the tile boundaries stay where they are);
- its cross-attention keys and values are its source's, padded on the right to the batch's
  longest source and masked the same way;
- its positions are its own (the embedding takes one position per row), and every GEMM and
  norm computes a row on its own.
"""
import numpy as np

from .._threads import _effective_n_threads
from ..generation.continuous import RowState

__all__ = ["Seq2SeqRows"]


class _RowView:
    """Layer i's part of the rows, what a decoder layer reads from a cache during a step."""

    __slots__ = ("_b", "_i")

    def __init__(self, rows, i):
        self._b, self._i = rows, i

    def append(self, k_new, v_new):
        """k_new, v_new (n, 1, H, Dh): each row's key / value at its own next position ->
        every row's keys and values so far, (n, H, L, Dh) with L the longest row's length."""
        b, i = self._b, self._i
        n = b.n
        r, t = b._rows[:n], b.lens[:n]
        K, V = b.self_k[i], b.self_v[i]
        K[r, :, t] = k_new[:, 0]
        V[r, :, t] = v_new[:, 0]
        return K[:n, :, :b._L], V[:n, :, :b._L]

    @property
    def cross(self):
        b = self._b
        return b.cross_k[self._i][:b.n, :, :b.S], b.cross_v[self._i][:b.n, :, :b.S]

    @property
    def memory_mask(self):
        b = self._b
        return b.mmask[:b.n, :, :, :b.S]

    @property
    def n_src(self):
        return self._b.n


class Seq2SeqRows(RowState):
    """The rows of a Seq2SeqTransformer with absolute positions (Marian, BART, mBART, M2M100 /
    NLLB, Pegasus); T5's relative position bias is a ValueError."""

    def __init__(self, model, n_threads=None):
        if model.decoder.position_bias is not None:
            raise ValueError("continuous batching needs absolute positions; this model (T5) "
                             "has a relative position bias: use generate")
        self.model, self.n_threads = model, n_threads
        self.max_len = model.max_decoder_positions       # the widest a row can grow
        c = model._config
        self._fairseq = c["positions"] == "fairseq"
        self._offset = c.get("position_offset", 0)
        self._pad = c["pad_token_id"]
        layer = model.decoder.layers[0].self_attn
        self._H, self._Dh = c["decoder_attention_heads"], layer.head_dim
        self._n_layers = c["decoder_layers"]
        self._dt = model._dtype
        self.n = 0                       # running rows: indices [0, n) of every buffer
        self.S = 0                       # the longest running source
        self._L = 0                      # the longest row's length during a step
        self.self_mask = None            # the self-attention's key mask during a step
        self._alloc(0, 0, 0)

    # -- buffers -------------------------------------------------------------------------------

    def _alloc(self, R, L, S):
        H, Dh, dt, nl = self._H, self._Dh, self._dt, self._n_layers
        self.self_k = [np.zeros((R, H, L, Dh), dt) for _ in range(nl)]
        self.self_v = [np.zeros((R, H, L, Dh), dt) for _ in range(nl)]
        self.cross_k = [np.zeros((R, H, S, Dh), dt) for _ in range(nl)]
        self.cross_v = [np.zeros((R, H, S, Dh), dt) for _ in range(nl)]
        self.mmask = np.zeros((R, 1, 1, S), bool)
        self.lens = np.zeros(R, np.int64)       # positions fed (the cache length of each row)
        self._rows = np.arange(R)

    def _grow(self, rows, S, L):
        """Room for `rows` rows, sources of S positions and rows of L positions: each dimension
        that is short doubles (at least), and only the buffers it indexes are copied."""
        R0, L0, S0 = self.mmask.shape[0], self.self_k[0].shape[2], self.mmask.shape[3]
        if rows <= R0 and S <= S0 and L <= L0:
            return
        R1 = R0 if rows <= R0 else max(rows, 2 * R0, 4)
        L1 = L0 if L <= L0 else min(self.max_len, max(L, 2 * L0, 16))
        S1 = S0 if S <= S0 else min(self.max_len, max(S, 2 * S0, 16))   # (sources: as many)
        n = self.n

        def resized(a, shape):
            b = np.zeros(shape, a.dtype)
            if a.ndim == 1:
                b[:n] = a[:n]
            else:
                b[:n, :, :a.shape[2]] = a[:n]
            return b

        H, Dh = self._H, self._Dh
        if R1 != R0 or L1 != L0:
            self.self_k = [resized(a, (R1, H, L1, Dh)) for a in self.self_k]
            self.self_v = [resized(a, (R1, H, L1, Dh)) for a in self.self_v]
        if R1 != R0 or S1 != S0:
            self.cross_k = [resized(a, (R1, H, S1, Dh)) for a in self.cross_k]
            self.cross_v = [resized(a, (R1, H, S1, Dh)) for a in self.cross_v]
            m = np.zeros((R1, 1, 1, S1), bool)
            m[:n, :, :, :S0] = self.mmask[:n]
            self.mmask = m
        if R1 != R0:
            self.lens = resized(self.lens, (R1,))
            self._rows = np.arange(R1)

    # -- the decoder-cache interface (TransformerDecoder._forward) -----------------------------

    def layer(self, i):
        return _RowView(self, i)

    @property
    def length(self):
        return self._L - 1

    # -- the row interface (RowState) ------------------------------------------------------------

    def add(self, ids, mask):
        B, S = mask.shape
        m = self.model
        nthr = _effective_n_threads(self.n_threads)
        memory = m._encode(ids, mask, nthr)
        n = self.n
        self._grow(n + B, S, 1)
        for i, layer in enumerate(m.decoder.layers):
            k, v = layer.multihead_attn._cross_kv(memory, B, S, nthr)
            self.cross_k[i][n:n + B, :, :S] = k
            self.cross_v[i][n:n + B, :, :S] = v
            self.cross_k[i][n:n + B, :, S:] = 0
            self.cross_v[i][n:n + B, :, S:] = 0
        self.mmask[n:n + B] = False
        self.mmask[n:n + B, 0, 0, :S] = mask
        self.lens[n:n + B] = 0
        self.n = n + B
        self.S = self._longest_source()

    def _longest_source(self):
        """The running rows' longest source: its last real position + 1 (0 when none run)."""
        has = self.mmask[:self.n, 0, 0].any(axis=0)
        return int(np.flatnonzero(has)[-1]) + 1 if has.any() else 0

    def remove(self, rows):
        """The last rows move into the holes (a row's computation does not depend on where it
        sits): one row's buffers copied per hole, not every row after it."""
        order = np.arange(self.n)
        for i in sorted((int(j) for j in rows), reverse=True):
            last = self.n - 1
            if i != last:
                t, S = int(self.lens[last]), self.S
                for buf in self.self_k + self.self_v:
                    buf[i, :, :t] = buf[last, :, :t]
                for buf in self.cross_k + self.cross_v:
                    buf[i, :, :S] = buf[last, :, :S]
                self.mmask[i] = self.mmask[last]
                self.lens[i] = self.lens[last]
                order[i] = order[last]
            self.n = last
        self.S = self._longest_source()
        return order[:self.n]

    def step(self, tokens):
        n = self.n
        m = self.model
        nthr = _effective_n_threads(self.n_threads)
        self._L = int(self.lens[:n].max()) + 1
        self._grow(n, 0, self._L)
        lens = self.lens[:n]
        tok = np.asarray(tokens, np.int64).reshape(n, 1)
        if self._fairseq:
            pos = (1 + lens[:, None]) * (tok != self._pad) + self._pad
        else:
            pos = lens[:, None] + self._offset
        x = m.decoder_embed._forward(tok, position_ids=pos)
        if int(lens.min()) + 1 == self._L:
            self.self_mask = None                                 # every row the same length
        else:
            self.self_mask = (np.arange(self._L)[None, :] <= lens[:, None])[:, None, None, :]
        h = m._decoder_stack(x, n, 1, nthr, self)
        self.self_mask = None
        self.lens[:n] += 1
        return m._project(h, nthr)
