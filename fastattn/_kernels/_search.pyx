# cython: language_level=3
# Design:
#   Beam search's per-step array work on the CPU (search_kernels.c has the maths):
#     log_softmax_rows   out = log(softmax(x)) row-wise over (N, V) (the logits, out may be x)
#     topk_desc          per row the k best entries, best first, ties to the lower index; with
#                        `add` (n, K) the row is read as K segments each shifted by add[:, s]
#                        (beam search's acc = lprobs + running score, never materialised)
#   A row is one work item computed by one thread in a fixed order, so results are identical
#   for any thread count (tests/generation/test_search_kernels.py checks 1/2/3/8). The loops
#   over rows are C's (search_kernels.c: a static schedule on a fa_team_open team); small
#   calls (the (n, 2K) and (n, 3K) selections) run on one thread: a thread gets at least
#   16384 elements. The kernel build is the ISA state's (fastattn._kernels._simd).
#
#   These entry points check their arguments themselves (they are called from the search loop
#   directly, with no _ops layer): x must be float32 or float64 and 2-D (a non-contiguous x is
#   copied), outputs must be C-contiguous with the exact dtype and shape; TypeError / ValueError
#   name the argument.

cimport numpy as cnp
from libc.stdint cimport int64_t

from fastattn._kernels._simd cimport isa_now

import operator

import numpy as np

from .._validation import check_out

cnp.import_array()

cdef extern from "search_kernels.h" nogil:
    void sk_log_softmax_rows(int level, int isz, const void *x, Py_ssize_t rows, Py_ssize_t n,
                             void *y, int n_threads)
    void sk_topk_rows(int level, int isz, const void *x, Py_ssize_t rows, Py_ssize_t m,
                      Py_ssize_t nseg, const void *add, Py_ssize_t k, int64_t *idx, void *val,
                      int n_threads)

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _float_2d(x, name):
    x = np.asarray(x)
    if x.dtype.kind == "f" and x.dtype.itemsize in (4, 8) and not x.dtype.isnative:
        x = x.astype(x.dtype.newbyteorder("="))
    if x.dtype not in _FLOATS:
        raise TypeError(f"{name} must be a float32 or float64 array, got dtype {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D (rows, columns), got shape {x.shape}")
    return np.ascontiguousarray(x)


def _check_threads(n_threads):
    if isinstance(n_threads, (bool, np.bool_)) or not isinstance(n_threads, (int, np.integer)) \
            or n_threads < 1:
        raise ValueError(f"n_threads must be an integer >= 1, got {n_threads!r}")
    return int(n_threads)


def log_softmax_rows(x, out=None, n_threads=1):
    """out <- log(softmax(x)) over the last axis of x (N, V), float32 or float64; returns out.

    out: None (a new array) or a C-contiguous (N, V) array of x's dtype; it may be x itself
    (in place). A row with a NaN or a +inf gives NaN; a row of only -inf stays -inf."""
    x = _float_2d(x, "x")
    if out is None:
        out = np.empty_like(x)
    else:
        check_out(out, "out", x.dtype, x.shape)
        # the kernel reads x[j] before it writes out[j] of the same row: only exact aliasing
        # (in place) or no overlap is safe
        if out is not x and np.may_share_memory(x, out) and \
                out.__array_interface__["data"][0] != x.__array_interface__["data"][0]:
            x = x.copy()
    cdef int nthr0 = _check_threads(n_threads)
    cdef cnp.ndarray xa = x
    cdef cnp.ndarray oa = out
    cdef Py_ssize_t N = cnp.PyArray_DIMS(xa)[0], V = cnp.PyArray_DIMS(xa)[1]
    if N == 0 or V == 0:
        return out
    cdef int isz = <int>cnp.PyArray_ITEMSIZE(xa)
    cdef const void *xp = cnp.PyArray_DATA(xa)
    cdef void *yp = cnp.PyArray_DATA(oa)
    cdef int level = isa_now()
    with nogil:
        sk_log_softmax_rows(level, isz, xp, N, V, yp, nthr0)
    return out


def topk_desc(x, k, out_idx=None, *, add=None, out_val=None, n_threads=1):
    """Indices (int64 (n, k)) of the k largest entries of each row of x (n, m), best first:
    NaN above every number, then by value descending, equal values by lower index first.

    add: None, or (n, K) of x's dtype with K dividing m: row i is then read as
    x[i, s * (m // K) + j] + add[i, s] (rounded once to x's dtype), i.e. beam search's
    lprobs (n * K, V) viewed as (n, K * V) plus each beam's running score.
    out_idx / out_val: None or C-contiguous (n, k) arrays (int64 / x's dtype) to fill; out_val
    receives the selected values. 0 <= k <= m. Returns out_idx."""
    x = _float_2d(x, "x")
    cdef Py_ssize_t n = x.shape[0], m = x.shape[1]
    if isinstance(k, (bool, np.bool_)):
        raise TypeError(f"k must be an integer, got {k!r}")
    try:
        k = operator.index(k)
    except TypeError:
        raise TypeError(f"k must be an integer, got {type(k).__name__} {k!r}") from None
    if not 0 <= k <= m:
        raise ValueError(f"k must be in [0, {m}] (the row length), got {k}")
    cdef Py_ssize_t nseg = 1
    if add is not None:
        add = np.asarray(add)
        if add.dtype != x.dtype:
            raise TypeError(f"add must have x's dtype {x.dtype}, got {add.dtype}")
        if add.ndim != 2 or add.shape[0] != n or add.shape[1] < 1 or m % add.shape[1]:
            raise ValueError(f"add must have shape (n, K) = ({n}, K) with K dividing the row "
                             f"length {m}, got {add.shape}")
        add = np.ascontiguousarray(add)
        nseg = add.shape[1]
    if out_idx is None:
        out_idx = np.empty((n, k), np.int64)
    else:
        check_out(out_idx, "out_idx", np.dtype(np.int64), (n, k))
    if out_val is None:
        out_val = np.empty((n, k), x.dtype)
    else:
        check_out(out_val, "out_val", x.dtype, (n, k))
    cdef int nthr0 = _check_threads(n_threads)
    if n == 0 or k == 0:
        return out_idx
    cdef cnp.ndarray xa = x
    cdef cnp.ndarray ia = out_idx
    cdef cnp.ndarray va = out_val
    cdef int isz = <int>cnp.PyArray_ITEMSIZE(xa)
    cdef const void *xp = cnp.PyArray_DATA(xa)
    cdef const void *ap = cnp.PyArray_DATA(<cnp.ndarray> add) if add is not None else NULL
    cdef int64_t *ip = <int64_t *> cnp.PyArray_DATA(ia)
    cdef void *vp = cnp.PyArray_DATA(va)
    cdef Py_ssize_t kk = k
    cdef int level = isa_now()
    with nogil:
        sk_topk_rows(level, isz, xp, n, m, nseg, ap, kk, ip, vp, nthr0)
    return out_idx

