"""Decoder key/value cache: buffers allocated once, appended in place, reordered by index.

Layout, per decoder layer l (n = rows: sources x beams, H heads, Dh = d_model / H):

    self_k[l], self_v[l]   (n_max, H, max_len, Dh)   keys / values of the tokens fed so far;
                                                      step t writes [:, :, t], the attention
                                                      kernel reads the strided view [:n, :, :t+1]
    cross_k[l], cross_v[l] (B, H, S, Dh)             the encoder output's projections, computed
                                                      once per source (Seq2SeqTransformer stores
                                                      contiguous copies; any strides work)
    memory_mask            (B, 1, 1, S) bool         True = source token (not padding)

The buffers come from ``np.empty``: the operating system commits their pages when they are first
written, so a buffer sized for ``max_len`` costs memory only for the positions actually used.

Rows of one source are contiguous (``group`` rows per source, beam j of source b at row
``b * group + j``); the cross-attention reads one source's keys once for all its rows.

Reordering (beam search) copies only the rows that change, and of them only the positions after
a prefix their source's rows share (``shared``: a forced prefix fed once per source, ``spread``):
row i takes row beam_idx[i]'s keys; a source row that is itself overwritten is first saved in
a twin buffer (allocated on the first reorder). One C call copies every layer's moved rows
(``_kv_cache.copy_cache_rows``: the buffers in parallel, each row's positions [shared:length]
head by head, no temporary).
Dropping finished sources compacts the rows in place (a forward copy of the rows that move).
Nothing allocated per step grows with the step number.
"""
import numpy as np

from .._kernels import _kv_cache
from .._threads import _effective_n_threads

__all__ = ["KVCache"]


class _LayerCache:
    """One decoder layer's view of a KVCache (what TransformerDecoderLayer._forward reads)."""

    __slots__ = ("_cache", "_layer")

    def __init__(self, cache, layer):
        self._cache, self._layer = cache, layer

    def append(self, k_new, v_new):
        return self._cache.append(self._layer, k_new, v_new)

    @property
    def cross(self):
        return self._cache.cross(self._layer)

    @property
    def memory_mask(self):
        return self._cache.memory_mask

    @property
    def n_src(self):
        return self._cache.n_src


class KVCache:
    """Self- and cross-attention keys / values for every decoder layer (see module docstring)."""

    def __init__(self, n_layers, n_rows, n_heads, head_dim, max_len, n_src, src_len, dtype):
        shape = (n_rows, n_heads, max_len, head_dim)
        self.self_k = [np.empty(shape, dtype) for _ in range(n_layers)]
        self.self_v = [np.empty(shape, dtype) for _ in range(n_layers)]
        self._alt_k = [None] * n_layers          # the reorder targets, made on first reorder
        self._alt_v = [None] * n_layers
        self.cross_k = [None] * n_layers
        self.cross_v = [None] * n_layers
        self._mask = None                          # (B, 1, 1, S) bool
        self.max_len = max_len
        self.length = 0                           # tokens fed so far
        self.shared = 0                           # positions the same in every row of a source
        self.n_rows = n_rows
        self.n_src = n_src
        self.group = n_rows // n_src
        self.n_threads = None                     # for reorder's copies (None: the default)

    def layer(self, i):
        """Layer i's view: ``append(k, v)``, ``cross`` (k, v), ``memory_mask``, ``n_src``.
        Made on each call and not kept: a view held by the cache would make a reference cycle,
        and the cache's arrays (megabytes a layer) would wait for Python's cyclic collector,
        which large arrays do not prompt (RSS grew by the caches of every call until it ran)."""
        return _LayerCache(self, i)

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

    def spread(self, group):
        """Row b of the first n_src rows -> rows [b * group, (b + 1) * group), positions
        [:length], every layer (a prefix computed once per source, then given to its rows)."""
        t = self.length
        for buf in self.self_k + self.self_v:
            for b in range(self.n_src - 1, -1, -1):
                buf[b * group:(b + 1) * group, :, :t] = buf[b, :, :t]
        self.shared = t

    # -- reordering --------------------------------------------------------------------------------

    @staticmethod
    def _compact(buf, idx, length):
        """buf[i, :, :length] = buf[idx[i], :, :length] for strictly increasing idx (idx[i] >= i):
        a forward copy never reads a row it has already overwritten."""
        for i in np.flatnonzero(idx != np.arange(len(idx))):
            buf[i, :, :length] = buf[idx[i], :, :length]

    def reorder(self, beam_idx):
        """Row i of the cache becomes (a copy of) row beam_idx[i] (beam search). Rows must stay
        with their source: beam_idx[i] // group == i // group."""
        idx = np.asarray(beam_idx)
        n = self.n_rows
        if idx.dtype.kind not in "iu" or idx.shape != (n,):
            raise ValueError(f"beam_idx must be {n} integer row indices, got {idx.dtype} "
                             f"shape {idx.shape}")
        idx = idx.astype(np.int64, copy=False)
        if n and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(f"beam_idx entries must be in [0, {n})")
        rows = np.arange(n)
        if np.any(idx // self.group != rows // self.group):
            raise ValueError("beam_idx must keep every row with its source "
                             f"(beam_idx[i] // {self.group} == i // {self.group})")
        if np.array_equal(idx, rows):
            return
        t = self.length
        moved = np.flatnonzero(idx != rows)
        src = idx[moved]
        saved = np.zeros(n, bool)
        saved[np.intersect1d(src, moved)] = True      # sources overwritten before being read
        keep = np.flatnonzero(saved)
        if keep.size:
            for layer in range(len(self.self_k)):
                if self._alt_k[layer] is None:
                    self._alt_k[layer] = np.empty_like(self.self_k[layer])
                    self._alt_v[layer] = np.empty_like(self.self_v[layer])
        # one C call for every layer's keys and values (buffers in parallel, GIL released):
        # save the rows that are read after being overwritten, then copy the moved rows
        _kv_cache.copy_cache_rows(self.self_k + self.self_v, self._alt_k + self._alt_v, keep,
                                moved, src, saved[src].astype(np.uint8), t,
                                _effective_n_threads(self.n_threads), min(self.shared, t))

    def select_sources(self, keep):
        """Keep only the sources `keep` (increasing source indices) and their rows."""
        keep = np.asarray(keep, dtype=np.int64)
        g = self.group
        rows = (keep[:, None] * g + np.arange(g)).reshape(-1)
        if keep.ndim != 1 or np.any(np.diff(keep) <= 0) or (keep.size and (
                keep[0] < 0 or keep[-1] >= self.n_src)):
            raise ValueError(f"keep must be increasing source indices in [0, {self.n_src})")
        for K, V in zip(self.self_k, self.self_v):
            self._compact(K, rows, self.length)
            self._compact(V, rows, self.length)
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
