# cython: language_level=3
# Design:
#   The decoder's key / value cache, rows moved in place for beam search's reorder
#   (fastattn/generation/kv_cache.py): every layer's buffers in one call, a buffer per work item
#   (one thread copies all of a buffer's moved rows, in order, so the result is that of the
#   Python loop it replaces, for any thread count).

from cython.parallel cimport parallel, prange
cimport numpy as cnp
from libc.stdint cimport int64_t

import numpy as np

from fastattn._kernels._openmp cimport fa_team_open, fa_team_place, fa_team_t

cnp.import_array()

cdef extern from "string.h" nogil:
    void *memcpy(void *dst, const void *src, size_t n)


def copy_cache_rows(list bufs, list alts, cnp.ndarray saves, cnp.ndarray dst,
                    cnp.ndarray src, cnp.ndarray from_alt, Py_ssize_t t, int n_threads,
                    Py_ssize_t t0=0):
    """Beam reorder of the decoder's key / value buffers (fastattn/generation/kv_cache.py).

    Every buffer b of `bufs` is a C-contiguous (rows, H, max_len, Dh) array of one float dtype;
    alts[b] a twin of it (or None when `saves` is empty). For each buffer, positions [t0:t] only
    (t0 > 0: the positions before it are the same in every row a row is copied from, a prefix
    shared by a source's rows):
      1. alt[j] = buf[j] for j in saves (rows read after they are overwritten),
      2. buf[dst[p]] = (alt if from_alt[p] else buf)[src[p]] for p in order.
    Buffers are independent work items (one thread each); within a buffer the order above is
    kept, so the result is that of the Python loop it replaces."""
    # IN   saves (n_save,) int64; dst, src (n_move,) int64; from_alt (n_move,) uint8
    cdef Py_ssize_t nb = len(bufs), n_save = saves.shape[0], n_move = dst.shape[0]
    if len(alts) != nb or src.shape[0] != n_move or from_alt.shape[0] != n_move:
        raise ValueError("copy_cache_rows: mismatched argument lengths")
    if t0 < 0 or t0 > t:
        raise ValueError(f"copy_cache_rows: t0={t0} must be in [0, t={t}]")
    if nb == 0 or t <= t0 or (n_save == 0 and n_move == 0):
        return
    cdef cnp.ndarray first = bufs[0]
    if first.ndim != 4:
        raise ValueError("copy_cache_rows: buffers must be 4-D (rows, H, max_len, Dh)")
    cdef Py_ssize_t rows = first.shape[0], H = first.shape[1], L = first.shape[2]
    cdef Py_ssize_t Dh = first.shape[3], isz = first.itemsize
    if t > L:
        raise ValueError(f"copy_cache_rows: t={t} exceeds max_len={L}")
    cdef cnp.ndarray ptrs = np.empty(2 * nb, np.uintp)
    cdef cnp.ndarray a
    cdef Py_ssize_t b
    for b in range(nb):
        for a, slot in ((bufs[b], 2 * b), (alts[b], 2 * b + 1)):
            if a is None:
                if n_save:
                    raise ValueError("copy_cache_rows: a twin buffer is needed")
                ptrs[slot] = 0
                continue
            if (a.ndim != 4 or a.shape[0] != rows or a.shape[1] != H or a.shape[2] != L
                    or a.shape[3] != Dh or a.dtype != first.dtype
                    or not a.flags.c_contiguous or not a.flags.writeable):
                raise ValueError("copy_cache_rows: every buffer must be a writeable C-contiguous "
                                 "array of the first one's shape and dtype")
            ptrs[slot] = a.ctypes.data
    cdef int64_t[::1] sv = np.ascontiguousarray(saves, np.int64)
    cdef int64_t[::1] dv = np.ascontiguousarray(dst, np.int64)
    cdef int64_t[::1] sr = np.ascontiguousarray(src, np.int64)
    cdef unsigned char[::1] fa = np.ascontiguousarray(from_alt, np.uint8)
    for arr in (saves, dst, src):
        if arr.shape[0] and (arr.min() < 0 or arr.max() >= rows):
            raise ValueError(f"copy_cache_rows: row indices must be in [0, {rows})")
    cdef size_t[::1] pv = ptrs
    cdef Py_ssize_t row_stride = H * L * Dh * isz, head_stride = L * Dh * isz
    cdef size_t chunk = <size_t>((t - t0) * Dh * isz)
    cdef Py_ssize_t off = t0 * Dh * isz
    cdef Py_ssize_t p, h
    cdef char *buf
    cdef char *alt
    cdef char *s
    cdef fa_team_t team = fa_team_open(n_threads, nb)
    with nogil, parallel(num_threads=team.n):
        fa_team_place(&team)
        for b in prange(nb, schedule='static'):
            buf = <char *>pv[2 * b]
            alt = <char *>pv[2 * b + 1]
            for p in range(n_save):
                for h in range(H):
                    memcpy(alt + sv[p] * row_stride + h * head_stride + off,
                           buf + sv[p] * row_stride + h * head_stride + off, chunk)
            for p in range(n_move):
                s = alt if fa[p] else buf
                for h in range(H):
                    memcpy(buf + dv[p] * row_stride + h * head_stride + off,
                           s + sr[p] * row_stride + h * head_stride + off, chunk)
