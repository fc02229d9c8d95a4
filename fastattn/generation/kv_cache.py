"""Decoder key/value cache: buffers allocated once, appended in place, reordered by index.

Layout, per decoder layer l (n = rows: sources x beams, H heads, Dh = d_model / H):

    self_k[l], self_v[l]   (n_max, H, max_len, Dh)   keys / values of the tokens fed so far;
                                                      step t writes [:, :, t], the attention
                                                      kernel reads the strided view [:n, :, :t+1]
    cross_k[l], cross_v[l] (B, H, S, Dh)             the encoder output's projections, computed
                                                      once per source (strided views of one GEMM)
    memory_mask            (B, 1, 1, S) bool         True = source token (not padding)

The buffers come from ``np.empty``: the operating system commits their pages when they are first
written, so a buffer sized for ``max_len`` costs memory only for the positions actually used.

Rows of one source are contiguous (``group`` rows per source, beam j of source b at row
``b * group + j``); the cross-attention reads one source's keys once for all its rows.

Reordering (beam search) and dropping finished sources are row gathers into the same buffers:
rows that keep their content are not touched; the others are copied through one scratch buffer
(sized like one layer's keys) when a source row could be overwritten before it is read. Nothing
allocated per step grows with the step number except that scratch's used part (a view).
"""
import numpy as np

__all__ = ["KVCache"]


class KVCache:
    """Self- and cross-attention keys / values for every decoder layer (see module docstring)."""

    def __init__(self, n_layers, n_rows, n_heads, head_dim, max_len, n_src, src_len, dtype):
        shape = (n_rows, n_heads, max_len, head_dim)
        self.self_k = [np.empty(shape, dtype) for _ in range(n_layers)]
        self.self_v = [np.empty(shape, dtype) for _ in range(n_layers)]
        self._scratch = None                     # (n_rows, H, max_len, Dh), made on first reorder
        self.cross_k = [None] * n_layers
        self.cross_v = [None] * n_layers
        self._mask = None                          # (B, 1, 1, S) bool
        self.max_len = max_len
        self.length = 0                           # tokens fed so far
        self.n_rows = n_rows
        self.n_src = n_src
        self.group = n_rows // n_src

    # -- filling ---------------------------------------------------------------------------------

    def set_cross(self, layer, k, v):
        """k, v (B, H, S, Dh): the cross-attention keys / values of `layer` (kept as given)."""
        self.cross_k[layer] = k
        self.cross_v[layer] = v

    def cross(self, layer):
        return self.cross_k[layer][:self.n_src], self.cross_v[layer][:self.n_src]

    def set_memory_mask(self, mask, group):
        """mask (B, S) bool, True = source token."""
        self._mask = np.ascontiguousarray(mask[:, None, None, :])
        self.group = group

    @property
    def memory_mask(self):
        """(n_src, 1, 1, S) bool, True = source token."""
        return self._mask[:self.n_src]

    def append(self, layer, k_new, v_new):
        """Write k_new, v_new (n, T, H, Dh) at positions [length, length + T).

        Returns the (n, H, length + T, Dh) views of all keys and values so far.
        """
        t0, T = self.length, k_new.shape[1]
        if t0 + T > self.max_len:
            raise ValueError(f"the cache holds {self.max_len} positions; cannot feed position "
                             f"{t0 + T - 1}")
        n = self.n_rows
        K, V = self.self_k[layer], self.self_v[layer]
        K[:n, :, t0:t0 + T] = k_new.transpose(0, 2, 1, 3)
        V[:n, :, t0:t0 + T] = v_new.transpose(0, 2, 1, 3)
        return K[:n, :, :t0 + T], V[:n, :, :t0 + T]

    def advance(self, T):
        self.length += T

    # -- reordering --------------------------------------------------------------------------------

    def _gather(self, buf, idx, n_old, length):
        """buf[:len(idx), :, :length] = buf[idx, :, :length] in place."""
        n = len(idx)
        moved = np.flatnonzero(idx != np.arange(n))
        if moved.size == 0:
            return
        if np.all(idx[moved] > moved) and np.all(np.diff(idx) > 0):
            # compaction (strictly increasing sources ahead of their targets): a forward copy
            # never reads a row it has already overwritten
            for i in moved:
                buf[i, :, :length] = buf[idx[i], :, :length]
            return
        if self._scratch is None or self._scratch.shape[0] < moved.size:
            self._scratch = np.empty((self.n_rows_max,) + buf.shape[1:], buf.dtype)
        tmp = self._scratch[:moved.size, :, :length]
        np.take(buf[:n_old, :, :length], idx[moved], axis=0, out=tmp, mode="clip")
        buf[moved, :, :length] = tmp

    @property
    def n_rows_max(self):
        return self.self_k[0].shape[0] if self.self_k else 0

    def reorder(self, beam_idx):
        """Row i of the cache becomes row beam_idx[i] (beam search). Row count is kept or
        shrinks; rows must stay with their source (beam_idx[i] // group == i // group)."""
        idx = np.asarray(beam_idx, dtype=np.int64)
        n_old = self.n_rows
        if idx.ndim != 1 or idx.size != n_old:
            raise ValueError(f"beam_idx must have one entry per row ({n_old}), got shape "
                             f"{idx.shape}")
        if idx.size and (idx.min() < 0 or idx.max() >= n_old):
            raise ValueError(f"beam_idx entries must be in [0, {n_old})")
        if np.any(idx // self.group != np.arange(n_old) // self.group):
            raise ValueError("beam_idx must keep every row with its source "
                             f"(beam_idx[i] // {self.group} == i // {self.group})")
        for K, V in zip(self.self_k, self.self_v):
            self._gather(K, idx, n_old, self.length)
            self._gather(V, idx, n_old, self.length)

    def select_sources(self, keep):
        """Keep only the sources `keep` (increasing source indices) and their rows."""
        keep = np.asarray(keep, dtype=np.int64)
        g = self.group
        rows = (keep[:, None] * g + np.arange(g)).reshape(-1)
        n_old = self.n_rows
        for K, V in zip(self.self_k, self.self_v):
            self._gather(K, rows, n_old, self.length)
            self._gather(V, rows, n_old, self.length)
        for ck, cv in zip(self.cross_k, self.cross_v):
            for i, s in enumerate(keep):
                if s != i:
                    ck[i] = ck[s]
                    cv[i] = cv[s]
        m = self._mask
        for i, s in enumerate(keep):
            if s != i:
                m[i] = m[s]
        self.n_src = len(keep)
        self.n_rows = len(rows)
