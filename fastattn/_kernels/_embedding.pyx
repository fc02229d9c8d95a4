# cython: language_level=3
# Design:
#   The embedding layer of the BERT-style encoders: y[r] = LayerNorm((word[ids[r]] +
#   types[tt[r]]) + pos_table[pos[r]]) * gamma + beta, the gather, the sums and the LayerNorm
#   in one pass over the rows, rows in parallel (one row = one work item, one thread, so the
#   bits do not depend on the thread count). The LayerNorm is the GEMM module's row kernel
#   (gemm_tile.h, ln_row: _gemm.pxd gives its table of the ISA state's kernel set), the
#   same function as fastattn._kernels._gemm.layer_norm, so the result is that of gathering,
#   adding and normalising step by step, bit for bit.

from cython.parallel cimport parallel, prange
cimport numpy as cnp

import numpy as np

from fastattn._kernels._gemm cimport gemm_kernels, gm_kernels, gm_ln
from fastattn._kernels._openmp cimport fa_team_open, fa_team_place, fa_team_t
from fastattn._kernels._simd cimport isa_now

cnp.import_array()


ctypedef fused _real:
    float
    double


cdef inline void _embed_row(const gm_kernels *kern, const _real *w, const _real *t,
                            const _real *p, Py_ssize_t n, const _real *g, const _real *b,
                            double eps, _real *y) noexcept nogil:
    # y = LayerNorm((w + t) + p): the first sum into y, then the kernel's x + res
    cdef Py_ssize_t j
    if t != NULL:
        for j in range(n):
            y[j] = w[j] + t[j]
        w = y
    gm_ln(kern, sizeof(_real), w, p, n, g, b, eps, y)


def _check_rows(cnp.ndarray idx, Py_ssize_t n_rows, Py_ssize_t n_table, str name):
    if idx.dtype != np.intp or idx.ndim != 1 or idx.shape[0] != n_rows or \
            not idx.flags.c_contiguous:
        raise ValueError(f"{name} must be a contiguous 1-D intp array of {n_rows} indices")
    if n_rows and (idx.min() < 0 or idx.max() >= n_table):
        raise ValueError(f"{name} holds an index outside [0, {n_table})")


def embed_layer_norm(cnp.ndarray word, cnp.ndarray ids, object types, object tt,
                     cnp.ndarray pos_table, cnp.ndarray pos, object gamma, object beta,
                     double eps, cnp.ndarray y, int n_threads):
    """y[r] = LayerNorm((word[ids[r]] + types[tt[r]]) + pos_table[pos[r]]) * gamma + beta: a
    BERT-style embedding layer in one pass, rows in parallel. The sums run in the tables' dtype
    in that order, then the LayerNorm of the plain kernel (x + res with res the position row),
    so the result is the same, bit for bit, as gathering, adding and normalising step by step.
    types None: no token-type table; tt None: row 0 of it for every token. Tables (rows, n),
    gamma / beta (n,) and y (len(ids), n) C-contiguous, one float dtype (the caller checks)."""
    # IN   word (V, n), types (T, n) or None, pos_table (P, n); ids, tt, pos (rows,) intp
    # IN   gamma, beta (n,) or None (1 and 0)
    # OUT  y (rows, n)
    if y.ndim != 2:
        raise ValueError(f"the output must be a 2-D array, got shape {(<object>y).shape}")
    cdef Py_ssize_t rows = cnp.PyArray_DIMS(y)[0], n = cnp.PyArray_DIMS(y)[1]
    cdef cnp.ndarray tarr = types
    cdef cnp.ndarray ttarr = tt
    for a in (word, pos_table, y) + ((types,) if types is not None else ()):
        if a.ndim != 2 or a.shape[1] != n or a.dtype != y.dtype or not a.flags.c_contiguous:
            raise ValueError(f"embedding tables and output must be C-contiguous (rows, {n}) "
                             f"arrays of {y.dtype}")
    _check_rows(ids, rows, word.shape[0], "ids")
    _check_rows(pos, rows, pos_table.shape[0], "pos")
    if types is not None:
        if tt is not None:
            _check_rows(tt, rows, tarr.shape[0], "tt")
        elif tarr.shape[0] < 1:
            raise ValueError("the token-type table is empty")
    for a in (gamma, beta):
        if a is not None and (a.shape != (n,) or a.dtype != y.dtype or not a.flags.c_contiguous):
            raise ValueError(f"gamma and beta must be contiguous ({n},) arrays of {y.dtype}")
    cdef int isz = <int>cnp.PyArray_ITEMSIZE(y)
    cdef const char *wp = <const char *> cnp.PyArray_DATA(word)
    cdef const char *pp = <const char *> cnp.PyArray_DATA(pos_table)
    cdef const char *tp = <const char *> cnp.PyArray_DATA(tarr) if types is not None else NULL
    cdef const Py_ssize_t *ip = <const Py_ssize_t *> cnp.PyArray_DATA(ids)
    cdef const Py_ssize_t *posp = <const Py_ssize_t *> cnp.PyArray_DATA(pos)
    cdef const Py_ssize_t *ttp = <const Py_ssize_t *> cnp.PyArray_DATA(ttarr) if tt is not None else NULL
    cdef const char *gp = <const char *> cnp.PyArray_DATA(<cnp.ndarray> gamma) if gamma is not None else NULL
    cdef const char *bp = <const char *> cnp.PyArray_DATA(<cnp.ndarray> beta) if beta is not None else NULL
    cdef char *yp = <char *> cnp.PyArray_DATA(y)
    cdef Py_ssize_t r, row_bytes = n * isz, trow
    if rows == 0 or n == 0:
        return
    cdef const gm_kernels *kern = gemm_kernels(isa_now())
    cdef fa_team_t team = fa_team_open(n_threads, rows)
    with nogil, parallel(num_threads=team.n):
        fa_team_place(&team)
        for r in prange(rows, schedule='static'):
            trow = ttp[r] if ttp != NULL else 0
            if isz == 4:
                _embed_row(kern, <const float *>(wp + ip[r] * row_bytes),
                           <const float *>(tp + trow * row_bytes) if tp != NULL else NULL,
                           <const float *>(pp + posp[r] * row_bytes), n,
                           <const float *>gp, <const float *>bp, eps,
                           <float *>(yp + r * row_bytes))
            else:
                _embed_row(kern, <const double *>(wp + ip[r] * row_bytes),
                           <const double *>(tp + trow * row_bytes) if tp != NULL else NULL,
                           <const double *>(pp + posp[r] * row_bytes), n,
                           <const double *>gp, <const double *>bp, eps,
                           <double *>(yp + r * row_bytes))
