# cython: language_level=3
# Design:
#   Fused scaled dot-product attention, FlashAttention-style, on the CPU.
#
#   Work items: the output is (N, L, Ev) with N = prod(broadcast leading dims). Its rows are cut
#   into query blocks of BQ rows; one work item = one (n, query block[, key split]). One OpenMP
#   parallel region per call runs the passes below, each a prange with a barrier after it.
#   Items share nothing but read-only inputs and write disjoint output rows, and tile sizes
#   are fixed by the shape alone, so the result is bitwise the same for any thread count.
#
#   Pass 1: pack every key tile (E x bk, in panels of the micro-kernel's width) and value tile
#           (bk x Ev) once, into the call's workspace; skipped for L <= DIRECT_MAX_L (decode),
#           where items read K and V in place.
#   Pass 2: per item, stream over key tiles of bk keys:
#     1. scores = scale * q_block @ k_tile.T and row maxima    (qk_tile, register-blocked)
#     2. per row: mask, online-softmax update                   (row_update)
#          m_new = max(m, rowmax), p = exp(s - m_new), l_new = l exp(m - m_new) + sum(p)
#     3. acc = acc * (l exp(m - m_new) / l_new) + (p @ v_tile) / l_new
#        (pv_tile: the rescale is fused into the epilogue; acc stays normalised, never > max|v|)
#   and a row with no allowed key (l == 0) stays zero, never NaN.
#   Pass 3: (decode with S > KEY_SPLIT only) merge the fixed key splits through (m, l).
#   Pass 4: (return_weights only) recompute the scores tile by tile: w = exp(s - m) / l.
#   Key tiles above the causal diagonal are never visited; tiles whose mask allows nothing are
#   skipped. Extra memory: the packed K and V (the size of K + V) plus O(BQ * bk) per thread.
#
#   Numerics: the scores and P @ V run in the input precision; the running max m and sum l are
#   doubles. exp is a vectorised polynomial (fa_tile.h). Masked scores are set to -inf by
#   selection, not addition, so NaN/inf in a masked-out key never reaches the output; a value
#   block holding inf/NaN makes P @ V skip zero probabilities for the same reason.
#
# Kernels assume (attention.py checks all of it first): q, k, v, mask and out are aligned to
# their item size, native byte order, last dimension contiguous; strides are given in elements
# (0 for broadcast dimensions); every size is > 0; the scratch buffer is big enough.

from cython.parallel cimport parallel, prange, threadid
from cython cimport floating
from libc.math cimport INFINITY, exp
from libc.string cimport memset
cimport numpy as cnp
import os
import threading

import numpy as np

from fastattn._kernels._openmp cimport (FASTATTN_OPENMP_ENABLED, omp_get_max_threads)

cnp.import_array()

cdef extern from "fa_workspace.h" nogil:
    void *fa_ws_alloc(size_t nbytes)
    void fa_ws_free(void *p)
    void FA_ASSERT_IN(const void *p, Py_ssize_t nbytes, const void *lo, const void *hi,
                      const char *what)

cdef extern from "fa_kernels.h" nogil:
    int FA_ISA_SCALAR, FA_ISA_BASE, FA_ISA_AVX2, FA_ISA_AVX512, FA_ISA_AVX2_WIDE
    int FA_PAD_F32, FA_PAD_F64
    int FA_V_NONFINITE, FA_V_BIG
    ctypedef struct fa_ops_f32:
        void (*qk_tile)(const float *q_tile, Py_ssize_t q_rs, int nq, int E, const float *kt,
                        int ncols, int nvalid, float scale, float *scores, float *rowmax) noexcept nogil
        void (*pv_tile)(const float *p, int p_rs, int nq, int nk, const float *vp, int nkp, int evp,
                        float *acc, int skip_zero, const double *ca, const double *cb) noexcept nogil
        double (*row_update)(float *s, int n, int ncols, int lim, float rowmax,
                             const unsigned char *bmask, const float *fmask, Py_ssize_t ms,
                             double *m_io, double *l_io, double *cb) noexcept nogil
        void (*row_weights)(const float *s, int n, int lim,
                            const unsigned char *bmask, const float *fmask, Py_ssize_t ms,
                            double m, double inv_l, float *w) noexcept nogil
        void (*softmax_row)(const float *x, int n, float *y) noexcept nogil
        void (*pack_k)(const float *k, Py_ssize_t k_rs, int nk, int E, int ncols, float *kp) noexcept nogil
        int (*pack_v)(const float *v, Py_ssize_t v_rs, int nk, int Ev, int evp, float *vp) noexcept nogil
        void (*scale_rows)(float *acc, int evp, int nq, const double *alpha) noexcept nogil
        void (*qk_direct)(const float *q, Py_ssize_t q_rs, int nq, int E, const float *k,
                          Py_ssize_t k_rs, int nk, float scale, float *scores, int ncols,
                          float *rowmax) noexcept nogil
        void (*pv_direct)(const float *p, int p_rs, int nq, int nk, const float *v, Py_ssize_t v_rs,
                          int Ev, float *acc, int evp) noexcept nogil
        void (*exp_array)(const float *x, Py_ssize_t n, float *y) noexcept nogil
    ctypedef struct fa_ops_f64:
        void (*qk_tile)(const double *q_tile, Py_ssize_t q_rs, int nq, int E, const double *kt,
                        int ncols, int nvalid, double scale, double *scores, double *rowmax) noexcept nogil
        void (*pv_tile)(const double *p, int p_rs, int nq, int nk, const double *vp, int nkp, int evp,
                        double *acc, int skip_zero, const double *ca, const double *cb) noexcept nogil
        double (*row_update)(double *s, int n, int ncols, int lim, double rowmax,
                             const unsigned char *bmask, const double *fmask, Py_ssize_t ms,
                             double *m_io, double *l_io, double *cb) noexcept nogil
        void (*row_weights)(const double *s, int n, int lim,
                            const unsigned char *bmask, const double *fmask, Py_ssize_t ms,
                            double m, double inv_l, double *w) noexcept nogil
        void (*softmax_row)(const double *x, int n, double *y) noexcept nogil
        void (*pack_k)(const double *k, Py_ssize_t k_rs, int nk, int E, int ncols, double *kp) noexcept nogil
        int (*pack_v)(const double *v, Py_ssize_t v_rs, int nk, int Ev, int evp, double *vp) noexcept nogil
        void (*scale_rows)(double *acc, int evp, int nq, const double *alpha) noexcept nogil
        void (*qk_direct)(const double *q, Py_ssize_t q_rs, int nq, int E, const double *k,
                          Py_ssize_t k_rs, int nk, double scale, double *scores, int ncols,
                          double *rowmax) noexcept nogil
        void (*pv_direct)(const double *p, int p_rs, int nq, int nk, const double *v, Py_ssize_t v_rs,
                          int Ev, double *acc, int evp) noexcept nogil
        void (*exp_array)(const double *x, Py_ssize_t n, double *y) noexcept nogil
    fa_ops_f32 fa_f32
    fa_ops_f64 fa_f64
    int fa_cpu_level()
    int fa_init(int level)
    int fa_current_level()


ISA_NAMES = {FA_ISA_SCALAR: "scalar", FA_ISA_BASE: "baseline", FA_ISA_AVX2: "avx2",
             FA_ISA_AVX512: "avx512", FA_ISA_AVX2_WIDE: "avx2-wide"}
fa_init(-1)

# Tile sizes: fixed by dtype and head size only (never by the thread count).
cdef enum:
    _BQ = 96               # query rows per work item (a multiple of every ISA's 6- or 4-row block)
    _DIRECT_MAX_L = 16     # up to this many query rows, K and V are read in place (no packing)
    _KEY_SPLIT = 2048      # ... and keys beyond this many are split into chunks merged by LSE
BQ = _BQ
DIRECT_MAX_L = _DIRECT_MAX_L
KEY_SPLIT = _KEY_SPLIT


cdef inline int _round_up(int x, int m) noexcept nogil:
    return ((x + m - 1) // m) * m


cdef inline int _key_block(int E, int Ev, int S, int itemsize) noexcept nogil:
    # 512 floats / 256 doubles per key tile for head sizes up to 128 / 64, fewer beyond (a packed
    # key tile <= 256 KiB, half the L2 here). The micro-kernels work panel by panel (NR columns),
    # so what must stay in L1 is one panel and the query rows, not the tile; long tiles make the
    # per-tile work of the online softmax (row sums, rescales, the P @ V epilogue) rarer: from
    # 128 to 512 keys measured 4-7% faster at 2048 x 2048 x 64 (bench/README); with 512-key tiles
    # 96 query rows per item beat 48 by 1-8% without a mask (K and V stream through L2 half as
    # often) and lose 1-2% with a causal one (a wider diagonal band).
    # Never more columns than S needs (rounded up to the panel width): short key ranges with huge
    # heads would otherwise pad each packed tile far beyond the keys themselves.
    cdef int bk = 512 if itemsize == 4 else 256
    cdef int pad = FA_PAD_F32 if itemsize == 4 else FA_PAD_F64
    cdef Py_ssize_t emax = E if E > Ev else Ev
    if emax < 1:
        emax = 1
    while bk > pad and <Py_ssize_t>bk * emax * itemsize > 256 * 1024:
        bk = bk // 2
    if S < bk:
        bk = _round_up(S if S > 0 else 1, pad)
    return bk


def key_block(int E, int Ev, int itemsize, int S=1 << 30):
    """Keys per tile for these head sizes, item size and (optionally) key count."""
    return _key_block(E, Ev, S, itemsize)


def scratch_bytes(int E, int Ev, int S, int itemsize):
    """Bytes of scratch one thread needs for the fused kernel (see _scratch_bytes)."""
    cdef int pad = FA_PAD_F32 if itemsize == 4 else FA_PAD_F64
    return _scratch_bytes(_key_block(E, Ev, S, itemsize), pad, Ev, itemsize)


# ---------------------------------------------------------------- dtype-generic tile operations

cdef inline void _qk(const floating *q, Py_ssize_t q_rs, int nq, int E, const floating *kp,
                     int ncols, int nvalid, floating scale, floating *sc,
                     floating *rowmax) noexcept nogil:
    if floating is float:
        fa_f32.qk_tile(q, q_rs, nq, E, kp, ncols, nvalid, scale, sc, rowmax)
    else:
        fa_f64.qk_tile(q, q_rs, nq, E, kp, ncols, nvalid, scale, sc, rowmax)


cdef inline void _pv(const floating *p, int p_rs, int nq, int nk, const floating *vp, int nkp,
                     int evp, floating *acc, int skip_zero, const double *ca,
                     const double *cb) noexcept nogil:
    if floating is float:
        fa_f32.pv_tile(p, p_rs, nq, nk, vp, nkp, evp, acc, skip_zero, ca, cb)
    else:
        fa_f64.pv_tile(p, p_rs, nq, nk, vp, nkp, evp, acc, skip_zero, ca, cb)


cdef inline double _row_update(floating *s, int n, int ncols, int lim, floating rowmax,
                               const unsigned char *bm, const floating *fm, Py_ssize_t ms,
                               double *m, double *l, double *cb) noexcept nogil:
    if floating is float:
        return fa_f32.row_update(s, n, ncols, lim, rowmax, bm, fm, ms, m, l, cb)
    else:
        return fa_f64.row_update(s, n, ncols, lim, rowmax, bm, fm, ms, m, l, cb)


cdef inline void _row_weights(const floating *s, int n, int lim,
                              const unsigned char *bm, const floating *fm, Py_ssize_t ms,
                              double m, double inv_l, floating *w) noexcept nogil:
    if floating is float:
        fa_f32.row_weights(s, n, lim, bm, fm, ms, m, inv_l, w)
    else:
        fa_f64.row_weights(s, n, lim, bm, fm, ms, m, inv_l, w)


cdef inline void _pack_k(const floating *k, Py_ssize_t k_rs, int nk, int E, int ncols,
                         floating *kp) noexcept nogil:
    if floating is float:
        fa_f32.pack_k(k, k_rs, nk, E, ncols, kp)
    else:
        fa_f64.pack_k(k, k_rs, nk, E, ncols, kp)


cdef inline int _pack_v(const floating *v, Py_ssize_t v_rs, int nk, int Ev, int evp,
                        floating *vp) noexcept nogil:
    if floating is float:
        return fa_f32.pack_v(v, v_rs, nk, Ev, evp, vp)
    else:
        return fa_f64.pack_v(v, v_rs, nk, Ev, evp, vp)


cdef inline void _scale_rows(floating *acc, int evp, int nq, const double *alpha) noexcept nogil:
    if floating is float:
        fa_f32.scale_rows(acc, evp, nq, alpha)
    else:
        fa_f64.scale_rows(acc, evp, nq, alpha)


cdef inline void _qk_direct(const floating *q, Py_ssize_t q_rs, int nq, int E, const floating *k,
                            Py_ssize_t k_rs, int nk, floating scale, floating *sc, int ncols,
                            floating *rowmax) noexcept nogil:
    if floating is float:
        fa_f32.qk_direct(q, q_rs, nq, E, k, k_rs, nk, scale, sc, ncols, rowmax)
    else:
        fa_f64.qk_direct(q, q_rs, nq, E, k, k_rs, nk, scale, sc, ncols, rowmax)


cdef inline void _pv_direct(const floating *p, int p_rs, int nq, int nk, const floating *v,
                            Py_ssize_t v_rs, int Ev, floating *acc, int evp) noexcept nogil:
    if floating is float:
        fa_f32.pv_direct(p, p_rs, nq, nk, v, v_rs, Ev, acc, evp)
    else:
        fa_f64.pv_direct(p, p_rs, nq, nk, v, v_rs, Ev, acc, evp)


# ---------------------------------------------------------------- one work item

cdef bint _tile_allows_any(const unsigned char *bm, const floating *fm, Py_ssize_t m_rs,
                           Py_ssize_t m_cs, int nq, int nk) noexcept nogil:
    """Whether the mask tile (rows of this block, keys of this tile) allows any key."""
    cdef int r, j
    cdef int rows = 1 if m_rs == 0 else nq
    cdef int cols = 1 if m_cs == 0 else nk
    for r in range(rows):
        for j in range(cols):
            if bm != NULL:
                if bm[r * m_rs + j * m_cs]:
                    return True
            elif fm[r * m_rs + j * m_cs] != -INFINITY:
                return True
    return False


cdef void _sdpa_item(
        const floating *q, Py_ssize_t q_rs,          # IN  (nq, E) this block's query rows
        const floating *kp, const floating *vp,      # IN  packed key / value tiles of this slab
        const unsigned char *v_bad,                  # IN  (n_tiles,) value tile holds inf/NaN
        const floating *k, Py_ssize_t k_rs,          # IN  (S, E) keys, when kp is NULL (decode)
        const floating *v, Py_ssize_t v_rs,          # IN  (S, Ev) values, when vp is NULL
        const unsigned char *bm, const floating *fm, # IN  mask rows of this block, or NULL
        Py_ssize_t m_rs, Py_ssize_t m_cs,
        floating *out, Py_ssize_t out_rs,            # OUT (nq, Ev)
        double *m_out, double *l_out,                # OUT (nq,) row max and sum, or NULL
        int q0, int nq, int S, int E, int Ev, bint causal, floating scale, int bk, int pad,
        int kstart, int kstop,                       # IN  key range (multiples of bk, or S)
        char *scratch, char *scratch_end) noexcept nogil:   # this thread's scratch
    cdef int ncols_max = _round_up(bk, pad)
    cdef int evp = _round_up(Ev if Ev > 0 else 1, pad)
    cdef Py_ssize_t kp_tile = <Py_ssize_t>E * ncols_max     # packed key tile stride
    cdef Py_ssize_t vp_tile = <Py_ssize_t>bk * evp           # packed value tile stride
    # scratch layout (sized by _scratch_bytes); 64-byte aligned by the caller
    cdef floating *sc = <floating *> scratch                       # (BQ, ncols_max) scores, P
    cdef floating *acc = sc + <Py_ssize_t>_BQ * ncols_max          # (BQ, evp) normalised out
    cdef double *m = <double *> (acc + <Py_ssize_t>_BQ * evp)      # (BQ,) running max
    cdef double *l = m + _BQ                                       # (BQ,) running sum
    cdef double *ca = l + _BQ                                      # (BQ,) accumulator factors
    cdef double *cb = ca + _BQ                                     # (BQ,) P @ V factors (1 / l)
    cdef floating *rowmax = <floating *> (cb + _BQ)                # (BQ,) tile row maxima
    cdef int r, c, kb, k0, nk, ncols, lim, kend, flags
    cdef floating a
    cdef const unsigned char *bmr = NULL
    cdef const floating *fmr = NULL
    FA_ASSERT_IN(rowmax, _BQ * sizeof(floating), scratch, scratch_end, "item scratch")

    memset(acc, 0, <Py_ssize_t>nq * evp * sizeof(floating))
    for r in range(nq):
        m[r] = -INFINITY
        l[r] = 0.0
    # causal (top-left): row q0 + r sees keys 0 .. q0 + r, so the block needs keys < q0 + nq
    kend = kstop
    if causal and q0 + nq < kend:
        kend = q0 + nq
    for kb in range(kstart // bk, (kend + bk - 1) // bk):
        k0 = kb * bk
        nk = bk if kend - k0 > bk else kend - k0
        if bm != NULL or fm != NULL:
            if not _tile_allows_any(bm + k0 * m_cs if bm != NULL else NULL,
                                    fm + k0 * m_cs if fm != NULL else NULL,
                                    m_rs, m_cs, nq, nk):
                continue
        ncols = _round_up(nk, pad)
        # 1. scores = q_block @ k_tile.T
        if kp != NULL:
            _qk(q, q_rs, nq, E, kp + kb * kp_tile, ncols, nk, scale, sc, rowmax)
        else:
            _qk_direct(q, q_rs, nq, E, k + k0 * k_rs, k_rs, nk, scale, sc, ncols, rowmax)
        # 2. per row: scale, mask, online softmax; P overwrites the scores
        for r in range(nq):
            lim = nk
            if causal and q0 + r - k0 + 1 < nk:
                lim = q0 + r - k0 + 1
            if bm != NULL:
                bmr = bm + r * m_rs + k0 * m_cs
            if fm != NULL:
                fmr = fm + r * m_rs + k0 * m_cs
            ca[r] = _row_update(sc + <Py_ssize_t>r * ncols, nk, ncols, lim, rowmax[r],
                                bmr, fmr, m_cs, &m[r], &l[r], &cb[r])
        # 3. acc = diag(ca) acc + diag(cb) P @ v_tile, the rescale fused into the P @ V epilogue
        if vp != NULL:
            flags = v_bad[kb]
            if flags & FA_V_BIG:
                # |v| near the float limit: normalise P first so no partial sum can overflow
                for r in range(nq):
                    a = <floating> cb[r]
                    for c in range(nk):
                        sc[<Py_ssize_t>r * ncols + c] *= a
                    cb[r] = 1.0
            _pv(sc, ncols, nq, nk, vp + kb * vp_tile, bk if S - k0 > bk else S - k0, evp, acc,
                flags & FA_V_NONFINITE, ca, cb)
        else:
            # in place (decode): normalise P, rescale acc, then accumulate row by row
            for r in range(nq):
                a = <floating> cb[r]
                for c in range(nk):
                    sc[<Py_ssize_t>r * ncols + c] *= a
            _scale_rows(acc, evp, nq, ca)
            _pv_direct(sc, ncols, nq, nk, v + k0 * v_rs, v_rs, Ev, acc, evp)
    # acc is already normalised (row_update); a row that allowed no key (l == 0) is zeros. Key
    # splits are merged through their (m, l) afterwards (_merge_splits).
    for r in range(nq):
        a = 0 if l[r] == 0.0 else 1
        for c in range(Ev):
            out[r * out_rs + c] = acc[<Py_ssize_t>r * evp + c] * a
        if m_out != NULL:
            m_out[r] = m[r]
            l_out[r] = l[r]


cdef void _weights_item(
        const floating *q, Py_ssize_t q_rs, const floating *kp,
        const floating *k, Py_ssize_t k_rs,          # IN  keys in place, when kp is NULL
        const unsigned char *bm, const floating *fm, Py_ssize_t m_rs, Py_ssize_t m_cs,
        const double *m_in, const double *l_in,      # IN  (nq,) from the forward pass
        floating *w, Py_ssize_t w_rs,                # OUT (nq, S), zero-initialised
        int q0, int nq, int S, int E, bint causal, floating scale, int bk, int pad,
        char *scratch, char *scratch_end) noexcept nogil:
    """Softmax weights of one query block, recomputed tile by tile with the forward pass's
    final row max and sum: w = exp(s - m) / l (rows with l == 0 stay zero)."""
    cdef int ncols_max = _round_up(bk, pad)
    cdef Py_ssize_t kp_tile = <Py_ssize_t>E * ncols_max
    cdef floating *sc = <floating *> scratch                       # (BQ, ncols)
    cdef floating *rowmax = sc + <Py_ssize_t>_BQ * ncols_max       # (BQ,), written, not read
    cdef int r, kb, k0, nk, ncols, lim, kend
    cdef const unsigned char *bmr = NULL
    cdef const floating *fmr = NULL
    FA_ASSERT_IN(rowmax, _BQ * sizeof(floating), scratch, scratch_end, "weights scratch")
    kend = S
    if causal and q0 + nq < S:
        kend = q0 + nq
    for kb in range((kend + bk - 1) // bk):
        k0 = kb * bk
        nk = bk if kend - k0 > bk else kend - k0
        ncols = _round_up(nk, pad)
        if kp != NULL:
            _qk(q, q_rs, nq, E, kp + kb * kp_tile, ncols, nk, scale, sc, rowmax)
        else:
            _qk_direct(q, q_rs, nq, E, k + k0 * k_rs, k_rs, nk, scale, sc, ncols, rowmax)
        for r in range(nq):
            if l_in[r] == 0.0:
                continue
            lim = nk
            if causal and q0 + r - k0 + 1 < nk:
                lim = q0 + r - k0 + 1
            if bm != NULL:
                bmr = bm + r * m_rs + k0 * m_cs
            if fm != NULL:
                fmr = fm + r * m_rs + k0 * m_cs
            _row_weights(sc + <Py_ssize_t>r * ncols, nk, lim, bmr, fmr, m_cs,
                         m_in[r], 1.0 / l_in[r], w + r * w_rs + k0)


cdef void _merge_splits(const floating *part, const double *pml, int n_sp,
                        Py_ssize_t L, int Ev, floating *out, double *stats) noexcept nogil:
    """Combine n_sp partial results of one (n) over disjoint key ranges, in a fixed order:
    M = max_s m_s, l = sum_s l_s exp(m_s - M), out = sum_s out_s l_s exp(m_s - M) / l, where
    out_s is split s's normalised output.
    part (n_sp, L, Ev) the splits' normalised outputs; pml (n_sp, 2, L) their (m, l); out (L, Ev);
    stats (2 L) receives (M, l) per row when not NULL (the weights pass needs them)."""
    cdef const double *pm = pml
    cdef const double *pl = pml + L
    cdef Py_ssize_t r
    cdef int sp, c
    cdef double M, l, f, mm
    for r in range(L):
        M = -INFINITY
        for sp in range(n_sp):
            mm = pm[2 * sp * L + r]
            if mm != mm or M != M:
                M = mm if mm != mm else M
            elif mm > M:
                M = mm
        l = 0.0
        for c in range(Ev):
            out[r * Ev + c] = 0
        if M != -INFINITY:
            # each partial is already normalised by its own l_s: weight it by l_s e^(m_s - M) / l
            for sp in range(n_sp):
                if pm[2 * sp * L + r] != -INFINITY:
                    l += pl[2 * sp * L + r] * exp(pm[2 * sp * L + r] - M)
            for sp in range(n_sp):
                if pm[2 * sp * L + r] == -INFINITY:
                    continue
                f = pl[2 * sp * L + r] * exp(pm[2 * sp * L + r] - M) / l
                for c in range(Ev):
                    out[r * Ev + c] += <floating>(part[(sp * L + r) * Ev + c] * f)
        if stats != NULL:
            stats[r] = M
            stats[L + r] = l


# ---------------------------------------------------------------- the parallel driver

cdef enum:
    _MAX_LEAD = 32         # leading (batch, head, ...) dimensions a call may have

MAX_LEAD_DIMS = _MAX_LEAD

# The pieces of a call's workspace, in order (see _plan)
cdef enum:
    _W_KPACK = 0           # (n_ks, n_kt, E, ncols_max) packed key tiles           (L > DIRECT_MAX_L)
    _W_VPACK = 1           # (n_vs, n_kt, bk, evp) packed value tiles               (L > DIRECT_MAX_L)
    _W_VBAD = 2            # (n_vs, n_kt) pack_v's flags per value tile (bytes)     (L > DIRECT_MAX_L)
    _W_SCRATCH = 3         # (n_threads, scratch_stride) per-thread tiles, see _scratch_bytes
    _W_PART = 4            # (N, n_sp, L, Ev) partial outputs of the key splits     (n_sp > 1)
    _W_PML = 5             # (N, n_sp, 2, L) their row max and sum (doubles)        (n_sp > 1)
    _W_PIECES = 6


cdef struct _Problem:
    # Shapes (every size > 0) and strides in elements, 0 where a dimension broadcasts. Leading
    # dims are right-aligned to `lead` (nd of them), NumPy style.
    int nd
    Py_ssize_t lead[_MAX_LEAD]        # the broadcast leading shape; N = prod(lead)
    Py_ssize_t q_lead[_MAX_LEAD]      # leading strides of q, k, v and the mask
    Py_ssize_t k_lead[_MAX_LEAD]
    Py_ssize_t v_lead[_MAX_LEAD]
    Py_ssize_t m_lead[_MAX_LEAD]
    Py_ssize_t k_shape[_MAX_LEAD]     # k's (v's) own leading shape, left-padded with 1
    Py_ssize_t v_shape[_MAX_LEAD]
    Py_ssize_t kslab_lead[_MAX_LEAD]  # index of a packed k (v) slab, in slabs (C order over
    Py_ssize_t vslab_lead[_MAX_LEAD]  # k_shape / v_shape, 0 where broadcast)
    Py_ssize_t q_rs, k_rs, v_rs       # row strides
    Py_ssize_t m_rs, m_cs             # mask row and column strides (0: broadcast)
    Py_ssize_t N
    int L, S, E, Ev
    bint causal
    double scale
    int head_group                    # grouped-query attention: q heads per k/v head
    # tiling, fixed by the shape alone (never by the thread count)
    int itemsize, bk, pad, ncols_max, evp
    Py_ssize_t n_kt                   # key tiles
    Py_ssize_t n_qb                   # query blocks of BQ rows
    Py_ssize_t n_ks, n_vs             # packed key / value slabs (0 when not packed)
    int n_sp                          # key splits (few query rows, S > KEY_SPLIT)


cdef struct _Work:
    char *base                        # one allocation of exactly `total` bytes, 64-byte aligned
    Py_ssize_t total
    Py_ssize_t off[_W_PIECES]         # byte offset of each piece (multiples of 64)
    Py_ssize_t size[_W_PIECES]        # bytes of each piece (0: not used by this call)
    Py_ssize_t scratch_stride         # bytes of one thread's scratch (a multiple of 64)


cdef inline Py_ssize_t _round64(Py_ssize_t n) noexcept nogil:
    return (n + 63) // 64 * 64


cdef Py_ssize_t _scratch_bytes(int bk, int pad, int Ev, int itemsize) noexcept nogil:
    """Bytes one thread's scratch needs (the layout _sdpa_item carves out of it):
    scores (BQ, ncols_max) and acc (BQ, evp) in the input dtype, then m, l, ca, cb (BQ,) each as
    doubles, then rowmax (BQ,) in the input dtype."""
    cdef Py_ssize_t ncols_max = _round_up(bk, pad)
    cdef Py_ssize_t evp = _round_up(Ev if Ev > 0 else 1, pad)
    return (_BQ * ncols_max + _BQ * evp) * itemsize + 4 * _BQ * <Py_ssize_t>sizeof(double) \
        + _BQ * itemsize


cdef void _plan(_Problem *p, int n_threads, _Work *w) noexcept nogil:
    """Size every piece of the call's workspace (the one place that does): see the _W_ enum."""
    cdef Py_ssize_t isz = p.itemsize
    cdef bint packed = p.n_ks > 0
    cdef int i
    w.scratch_stride = _round64(_scratch_bytes(p.bk, p.pad, p.Ev, p.itemsize))
    w.size[_W_KPACK] = p.n_ks * p.n_kt * p.E * p.ncols_max * isz if packed else 0
    w.size[_W_VPACK] = p.n_vs * p.n_kt * p.bk * p.evp * isz if packed else 0
    w.size[_W_VBAD] = p.n_vs * p.n_kt if packed else 0
    w.size[_W_SCRATCH] = w.scratch_stride * n_threads
    w.size[_W_PART] = p.N * p.n_sp * p.L * p.Ev * isz if p.n_sp > 1 else 0
    w.size[_W_PML] = p.N * p.n_sp * 2 * p.L * <Py_ssize_t>sizeof(double) if p.n_sp > 1 else 0
    # pieces at 64-byte offsets; the total ends exactly where the last used piece ends
    w.total = 0
    cdef Py_ssize_t at = 0
    for i in range(_W_PIECES):
        w.off[i] = at
        if w.size[i] > 0:
            w.total = at + w.size[i]
            at = _round64(w.total)


cdef inline char *_piece(const _Work *w, int i) noexcept nogil:
    return (w.base + w.off[i]) if w.size[i] > 0 else NULL


cdef inline char *_piece_end(const _Work *w, int i) noexcept nogil:
    return w.base + w.off[i] + w.size[i]


cdef Py_ssize_t _parallel_items(const _Problem *p) noexcept nogil:
    """The most independent work items any pass of the call has: more threads than this would
    only wait. Pass 1 packs (n_ks + n_vs) * n_kt tiles, pass 2 runs N * n_qb * n_sp items."""
    cdef Py_ssize_t items = p.N * p.n_qb * p.n_sp
    cdef Py_ssize_t packs = (p.n_ks + p.n_vs) * p.n_kt
    return items if items > packs else packs


cdef inline Py_ssize_t _offset(Py_ssize_t n, int nd, const Py_ssize_t *shape,
                               const Py_ssize_t *strides, int head_group) noexcept nogil:
    """Element offset of flat leading index n in an array with the given leading strides.
    head_group > 1 maps the last leading index h to h // head_group (grouped-query heads)."""
    cdef Py_ssize_t off = 0, idx
    cdef int d
    for d in range(nd - 1, -1, -1):
        idx = n % shape[d]
        n = n // shape[d]
        if d == nd - 1 and head_group > 1:
            idx = idx // head_group
        off += idx * strides[d]
    return off


cdef void _sdpa_run(const _Problem *p, const _Work *ws,
                    const floating *q, const floating *k, const floating *v,
                    const unsigned char *bm, const floating *fm,   # IN  mask (one or neither)
                    floating *out,                                   # OUT (N, L, Ev)
                    floating *w, double *stats,                      # OUT (N, L, S), (N, 2, L)
                    int n_threads) noexcept nogil:
    cdef Py_ssize_t isz = sizeof(floating)
    cdef int nd = p.nd, L = p.L, S = p.S, E = p.E, Ev = p.Ev, bk = p.bk, pad = p.pad
    cdef int evp = p.evp, ncols_max = p.ncols_max, n_sp = p.n_sp
    cdef Py_ssize_t N = p.N, n_kt = p.n_kt, n_qb = p.n_qb
    cdef Py_ssize_t kp_slab = n_kt * E * ncols_max, vp_slab = n_kt * bk * evp
    cdef Py_ssize_t n_items = N * n_qb
    cdef floating scale = <floating>p.scale
    cdef floating *kpack = <floating *>_piece(ws, _W_KPACK)
    cdef floating *vpack = <floating *>_piece(ws, _W_VPACK)
    cdef unsigned char *v_bad = <unsigned char *>_piece(ws, _W_VBAD)
    cdef char *scratch = _piece(ws, _W_SCRATCH)
    cdef floating *part = <floating *>_piece(ws, _W_PART)
    cdef double *pml = <double *>_piece(ws, _W_PML)
    cdef Py_ssize_t sstride = ws.scratch_stride
    cdef Py_ssize_t item, n, qb, t, slab, sp
    cdef int q0, nq, tid, k0, nk, kstart, kstop
    cdef Py_ssize_t qo, ko, vo, mo, kdo, vdo
    cdef double *mrow
    cdef double *lrow
    cdef floating *dst
    cdef floating *tile
    cdef char *mine
    cdef const unsigned char *bmi
    cdef const floating *fmi

    # one parallel region for all passes (each prange ends with a barrier): the threads are
    # woken once per call, not once per pass
    with parallel(num_threads=n_threads):
        # pass 1: pack every key and value tile once (panels the micro-kernels stream through);
        # n_ks = n_vs = 0 for few query rows, where the items read K and V in place
        for item in prange(p.n_ks * n_kt, schedule='static'):
            slab = item // n_kt
            t = item % n_kt
            k0 = <int>(t * bk)
            nk = bk if S - k0 > bk else S - k0
            tile = kpack + slab * kp_slab + t * E * ncols_max
            FA_ASSERT_IN(tile, E * _round_up(nk, pad) * isz, _piece(ws, _W_KPACK),
                         _piece_end(ws, _W_KPACK), "packed key tile")
            ko = _offset(slab, nd, p.k_shape, p.k_lead, 1)
            _pack_k(k + ko + k0 * p.k_rs, p.k_rs, nk, E, _round_up(nk, pad), tile)
        for item in prange(p.n_vs * n_kt, schedule='static'):
            slab = item // n_kt
            t = item % n_kt
            k0 = <int>(t * bk)
            nk = bk if S - k0 > bk else S - k0
            tile = vpack + slab * vp_slab + t * bk * evp
            FA_ASSERT_IN(tile, nk * evp * isz, _piece(ws, _W_VPACK), _piece_end(ws, _W_VPACK),
                         "packed value tile")
            FA_ASSERT_IN(v_bad + item, 1, _piece(ws, _W_VBAD), _piece_end(ws, _W_VBAD),
                         "value tile flag")
            vo = _offset(slab, nd, p.v_shape, p.v_lead, 1)
            v_bad[item] = _pack_v(v + vo + k0 * p.v_rs, p.v_rs, nk, Ev, evp, tile)

        # pass 2: one work item per (leading index, query block, key split)
        for item in prange(n_items * n_sp, schedule='dynamic'):
            tid = threadid()
            sp = item % n_sp
            n = item // n_sp // n_qb
            qb = (item // n_sp) % n_qb
            if p.causal:
                qb = n_qb - 1 - qb      # longest items (last query blocks) first: less tail idle
            q0 = <int>(qb * _BQ)
            nq = _BQ if L - q0 > _BQ else L - q0
            qo = _offset(n, nd, p.lead, p.q_lead, 1)
            ko = _offset(n, nd, p.lead, p.kslab_lead, p.head_group)    # k slab index
            vo = _offset(n, nd, p.lead, p.vslab_lead, p.head_group)    # v slab index
            kdo = _offset(n, nd, p.lead, p.k_lead, p.head_group)       # k element offset
            vdo = _offset(n, nd, p.lead, p.v_lead, p.head_group)       # v element offset
            mo = _offset(n, nd, p.lead, p.m_lead, 1)
            bmi = (bm + mo + q0 * p.m_rs) if bm != NULL else NULL      # this block's mask rows
            fmi = (fm + mo + q0 * p.m_rs) if fm != NULL else NULL
            mrow = NULL
            lrow = NULL
            dst = out + n * L * Ev + <Py_ssize_t>q0 * Ev
            kstart = 0
            kstop = S
            if n_sp > 1:
                # split sp covers keys [sp * KEY_SPLIT, min(S, (sp + 1) * KEY_SPLIT)); its
                # partial result goes to part (N, n_sp, L, Ev), its (m, l) to pml (N, n_sp, 2, L)
                kstart = <int>(sp * _KEY_SPLIT)
                if (sp + 1) * _KEY_SPLIT < S:
                    kstop = <int>((sp + 1) * _KEY_SPLIT)
                dst = part + ((n * n_sp + sp) * L) * Ev
                mrow = pml + (n * n_sp + sp) * 2 * L
                lrow = mrow + L
                FA_ASSERT_IN(dst, nq * Ev * isz, _piece(ws, _W_PART), _piece_end(ws, _W_PART),
                             "key-split partial output")
                FA_ASSERT_IN(mrow, 2 * L * sizeof(double), _piece(ws, _W_PML),
                             _piece_end(ws, _W_PML), "key-split row max and sum")
            elif stats != NULL:
                mrow = stats + 2 * (n * L + q0)
                lrow = mrow + nq
            mine = scratch + tid * sstride
            FA_ASSERT_IN(mine, sstride, _piece(ws, _W_SCRATCH), _piece_end(ws, _W_SCRATCH),
                         "thread scratch")
            _sdpa_item(q + qo + q0 * p.q_rs, p.q_rs,
                       (kpack + ko * kp_slab) if kpack != NULL else NULL,
                       (vpack + vo * vp_slab) if vpack != NULL else NULL,
                       (v_bad + vo * n_kt) if v_bad != NULL else NULL,
                       k + kdo, p.k_rs, v + vdo, p.v_rs, bmi, fmi, p.m_rs, p.m_cs,
                       dst, Ev, mrow, lrow,
                       q0, nq, S, E, Ev, p.causal, scale, bk, pad, kstart, kstop,
                       mine, mine + sstride)

        # pass 3 (key splits only): merge the partial results of each leading index, in split order
        if n_sp > 1:
            for n in prange(N, schedule='static'):
                _merge_splits(part + n * n_sp * L * Ev, pml + n * n_sp * 2 * L, n_sp, L, Ev,
                              out + n * L * Ev, (stats + 2 * n * L) if stats != NULL else NULL)

        # pass 4 (return_weights only): the softmax weights, from the final row max and sum
        if w != NULL:
            for item in prange(n_items, schedule='dynamic'):
                tid = threadid()
                n = item // n_qb
                qb = item % n_qb
                q0 = <int>(qb * _BQ)
                nq = _BQ if L - q0 > _BQ else L - q0
                qo = _offset(n, nd, p.lead, p.q_lead, 1)
                ko = _offset(n, nd, p.lead, p.kslab_lead, p.head_group)
                kdo = _offset(n, nd, p.lead, p.k_lead, p.head_group)
                mo = _offset(n, nd, p.lead, p.m_lead, 1)
                bmi = (bm + mo + q0 * p.m_rs) if bm != NULL else NULL
                fmi = (fm + mo + q0 * p.m_rs) if fm != NULL else NULL
                mrow = stats + 2 * (n * L + q0)
                mine = scratch + tid * sstride
                _weights_item(q + qo + q0 * p.q_rs, p.q_rs,
                              (kpack + ko * kp_slab) if kpack != NULL else NULL, k + kdo, p.k_rs,
                              bmi, fmi, p.m_rs, p.m_cs, mrow, mrow + nq,
                              w + n * L * S + <Py_ssize_t>q0 * S, S,
                              q0, nq, S, E, p.causal, scale, bk, pad, mine, mine + sstride)


cdef inline Py_ssize_t _estride(cnp.ndarray a, int d):
    return cnp.PyArray_STRIDES(a)[d] // cnp.PyArray_ITEMSIZE(a) if cnp.PyArray_DIMS(a)[d] > 1 else 0


cdef void _lead_strides(cnp.ndarray a, int nd, Py_ssize_t *strides, Py_ssize_t *shape):
    """a's leading strides (and shape, when `shape` is not NULL), right-aligned to nd dims."""
    cdef int d, off = nd - (a.ndim - 2)
    for d in range(nd):
        strides[d] = 0
        if shape != NULL:
            shape[d] = 1
    for d in range(a.ndim - 2):
        strides[off + d] = _estride(a, d)
        if shape != NULL:
            shape[off + d] = cnp.PyArray_DIMS(a)[d]


cdef Py_ssize_t _slab_strides(int nd, const Py_ssize_t *shape, Py_ssize_t *strides) noexcept:
    """C-order strides (in slabs) over `shape`, 0 where it broadcasts; returns the slab count."""
    cdef Py_ssize_t stride = 1
    cdef int d
    for d in range(nd - 1, -1, -1):
        strides[d] = stride if shape[d] > 1 else 0
        stride *= shape[d]
    return stride


cdef _problem(_Problem *p, cnp.ndarray q, cnp.ndarray k, cnp.ndarray v, cnp.ndarray m,
              tuple lead, bint causal, double scale, int head_group):
    cdef int nd = len(lead), d
    if nd > _MAX_LEAD:
        raise ValueError(f"at most {_MAX_LEAD} leading dimensions are supported, got {nd}")
    p.nd = nd
    p.N = 1
    for d in range(nd):
        p.lead[d] = lead[d]
        p.N *= lead[d]
    _lead_strides(q, nd, p.q_lead, NULL)
    _lead_strides(k, nd, p.k_lead, p.k_shape)
    _lead_strides(v, nd, p.v_lead, p.v_shape)
    p.L = <int>cnp.PyArray_DIMS(q)[q.ndim - 2]
    p.E = <int>cnp.PyArray_DIMS(q)[q.ndim - 1]
    p.S = <int>cnp.PyArray_DIMS(k)[k.ndim - 2]
    p.Ev = <int>cnp.PyArray_DIMS(v)[v.ndim - 1]
    p.q_rs = _estride(q, q.ndim - 2)
    p.k_rs = cnp.PyArray_STRIDES(k)[k.ndim - 2] // cnp.PyArray_ITEMSIZE(k)
    p.v_rs = cnp.PyArray_STRIDES(v)[v.ndim - 2] // cnp.PyArray_ITEMSIZE(v)
    p.m_rs = 0
    p.m_cs = 0
    for d in range(nd):
        p.m_lead[d] = 0
    if m is not None:
        _lead_strides(m, nd, p.m_lead, NULL)
        p.m_rs = _estride(m, m.ndim - 2)
        p.m_cs = _estride(m, m.ndim - 1)
    p.causal = causal
    p.scale = scale
    p.head_group = head_group
    p.itemsize = cnp.PyArray_ITEMSIZE(q)
    p.pad = FA_PAD_F32 if p.itemsize == 4 else FA_PAD_F64
    p.bk = _key_block(p.E, p.Ev, p.S, p.itemsize)
    p.ncols_max = _round_up(p.bk, p.pad)
    p.evp = _round_up(p.Ev if p.Ev > 0 else 1, p.pad)
    p.n_kt = (p.S + p.bk - 1) // p.bk
    p.n_qb = (p.L + _BQ - 1) // _BQ
    # few query rows read K and V in place (no packing); with many keys as well, the keys are
    # split into fixed chunks of KEY_SPLIT (a rule of the shape alone, so results stay bitwise
    # independent of the thread count) merged through their row max and sum
    p.n_sp = 1
    if p.L <= _DIRECT_MAX_L:
        p.n_ks = 0
        p.n_vs = 0
        if p.S > _KEY_SPLIT:
            p.n_sp = (p.S + _KEY_SPLIT - 1) // _KEY_SPLIT
    else:
        p.n_ks = _slab_strides(nd, p.k_shape, p.kslab_lead)
        p.n_vs = _slab_strides(nd, p.v_shape, p.vslab_lead)
    if p.n_ks == 0:
        for d in range(nd):
            p.kslab_lead[d] = 0
            p.vslab_lead[d] = 0


# Per-thread workspace cache: big per-call buffers come back from the OS as fresh pages, and on
# VMs that hand freed memory back to the host, faulting them in again costs as much as the
# attention of a mid-sized call. Each Python thread keeps its last workspace up to
# _WORKSPACE_KEEP bytes. FASTATTN_NO_WORKSPACE_CACHE=1 (read at import; ci/sanitize.sh sets it)
# turns the cache off, so that every call allocates exactly what it needs and AddressSanitizer
# sees an overrun on its first byte.
_WORKSPACE_KEEP = 256 * 1024 * 1024
_CACHE_WORKSPACE = os.environ.get("FASTATTN_NO_WORKSPACE_CACHE", "").strip().lower() \
    in ("", "0", "false", "no")
_local = threading.local()


cdef class _Workspace:
    """An exact-size, 64-byte aligned block of memory owned by Python (freed with the object)."""
    cdef char *data
    cdef Py_ssize_t nbytes

    def __cinit__(self, Py_ssize_t nbytes):
        self.data = <char *>fa_ws_alloc(<size_t>nbytes)
        if self.data == NULL:
            raise MemoryError(f"fastattn: cannot allocate a {nbytes}-byte kernel workspace")
        self.nbytes = nbytes

    def __dealloc__(self):
        if self.data != NULL:
            fa_ws_free(self.data)


cdef _Workspace _workspace(Py_ssize_t nbytes):
    """A workspace of at least nbytes: this thread's cached one when allowed and big enough,
    else a new one of exactly nbytes."""
    cdef _Workspace buf = getattr(_local, "buf", None) if _CACHE_WORKSPACE else None
    if buf is None or buf.nbytes < nbytes:
        buf = _Workspace(nbytes)
        if _CACHE_WORKSPACE:
            _local.buf = buf if nbytes <= _WORKSPACE_KEEP else None
    return buf


def release_workspace():
    """Drop this thread's cached kernel workspace."""
    _local.buf = None


def workspace_cache_enabled():
    """Whether calls reuse a per-thread workspace (False under FASTATTN_NO_WORKSPACE_CACHE=1)."""
    return bool(_CACHE_WORKSPACE)


def plan(cnp.ndarray q, cnp.ndarray k, cnp.ndarray v, tuple lead, int n_threads):
    """The workspace plan of a call without a mask, as a dict (for tests and debugging):
    threads (after the cap by parallel items), total bytes and each piece's (offset, size)."""
    cdef _Problem p
    cdef _Work w
    _problem(&p, q, k, v, None, lead, False, 1.0, 1)
    n_threads = max(1, min(n_threads, _parallel_items(&p)))
    _plan(&p, n_threads, &w)
    names = ("kpack", "vpack", "v_bad", "scratch", "part", "pml")
    return {"threads": n_threads, "total": w.total, "key_splits": p.n_sp,
            "scratch_stride": w.scratch_stride,
            "pieces": {names[i]: (w.off[i], w.size[i]) for i in range(_W_PIECES)}}


def sdpa(cnp.ndarray q, cnp.ndarray k, cnp.ndarray v, mask, cnp.ndarray out, weights,
         tuple lead, bint causal, double scale, int head_group, int n_threads):
    """Fused attention into `out` (and `weights` when not None).

    q (..., L, E), k (..., S, E), v (..., S, Ev), mask (..., L, S) bool/float or None:
    each with its own leading dims, broadcastable to `lead` (k, v with the head dim divided by
    head_group). out (*lead, L, Ev) and weights (*lead, L, S) are C-contiguous and of q's dtype;
    weights must be zero-filled. All sizes > 0. Validation happened in attention.py. n_threads
    is an upper bound: the call uses no more threads than it has parallel work items.
    """
    cdef _Problem p
    cdef _Work w
    cdef cnp.ndarray m_arr = mask
    _problem(&p, q, k, v, m_arr, lead, causal, scale, head_group)
    cdef int nthr = <int>max(1, min(n_threads, _parallel_items(&p)))
    _plan(&p, nthr, &w)
    cdef _Workspace ws = _workspace(w.total)       # held until the kernel returns
    w.base = ws.data
    cdef bint is_bool = m_arr is not None and m_arr.dtype.kind == 'b'
    cdef double *stats = NULL
    cdef object stats_arr = None
    if weights is not None:
        stats_arr = np.empty(2 * p.N * p.L, dtype=np.float64)
        stats = <double *> cnp.PyArray_DATA(<cnp.ndarray> stats_arr)
    cdef char *qp = <char *> cnp.PyArray_DATA(q)
    cdef char *kp = <char *> cnp.PyArray_DATA(k)
    cdef char *vp = <char *> cnp.PyArray_DATA(v)
    cdef char *op = <char *> cnp.PyArray_DATA(out)
    cdef char *mp = <char *> cnp.PyArray_DATA(m_arr) if m_arr is not None else NULL
    cdef char *wp = <char *> cnp.PyArray_DATA(<cnp.ndarray> weights) if weights is not None else NULL
    cdef const unsigned char *bm = <const unsigned char *>mp if is_bool else NULL
    if p.itemsize == 4:
        with nogil:
            _sdpa_run(&p, &w, <const float *>qp, <const float *>kp, <const float *>vp, bm,
                      <const float *>mp if (mp != NULL and not is_bool) else NULL,
                      <float *>op, <float *>wp, stats, nthr)
    else:
        with nogil:
            _sdpa_run(&p, &w, <const double *>qp, <const double *>kp, <const double *>vp, bm,
                      <const double *>mp if (mp != NULL and not is_bool) else NULL,
                      <double *>op, <double *>wp, stats, nthr)


# ---------------------------------------------------------------- standalone softmax

cdef void _softmax_rows(const floating *x, floating *y, Py_ssize_t rows, int n,
                        int n_threads) noexcept nogil:
    cdef Py_ssize_t r
    for r in prange(rows, schedule='static', num_threads=n_threads):
        if floating is float:
            fa_f32.softmax_row(x + r * n, n, y + r * n)
        else:
            fa_f64.softmax_row(x + r * n, n, y + r * n)


def softmax_rows(cnp.ndarray x, cnp.ndarray y, int n_threads):
    """y = softmax(x) along the last axis; x, y C-contiguous 2-D, same float dtype, n > 0."""
    cdef Py_ssize_t rows = cnp.PyArray_DIMS(x)[0]
    cdef int n = <int>cnp.PyArray_DIMS(x)[1]
    cdef char *xp = <char *> cnp.PyArray_DATA(x)
    cdef char *yp = <char *> cnp.PyArray_DATA(y)
    if cnp.PyArray_ITEMSIZE(x) == 4:
        with nogil:
            _softmax_rows(<const float *>xp, <float *>yp, rows, n, n_threads)
    else:
        with nogil:
            _softmax_rows(<const double *>xp, <double *>yp, rows, n, n_threads)


def kernel_exp(cnp.ndarray x, cnp.ndarray y):
    """y = exp(x) with the kernel's vectorised exp (for the accuracy tests)."""
    cdef Py_ssize_t n = cnp.PyArray_SIZE(x)
    if cnp.PyArray_ITEMSIZE(x) == 4:
        fa_f32.exp_array(<const float *>cnp.PyArray_DATA(x), n, <float *>cnp.PyArray_DATA(y))
    else:
        fa_f64.exp_array(<const double *>cnp.PyArray_DATA(x), n, <double *>cnp.PyArray_DATA(y))


# ---------------------------------------------------------------- build and run-time facts

def openmp_enabled():
    """True when the extension was compiled with OpenMP."""
    return bool(FASTATTN_OPENMP_ENABLED)


def omp_max_threads():
    """omp_get_max_threads() now (follows OMP_NUM_THREADS and threadpoolctl's limits)."""
    return omp_get_max_threads()


def isa():
    """Name of the micro-kernel set in use ('avx512', 'avx2', 'baseline' or 'scalar')."""
    return ISA_NAMES[fa_current_level()]


def cpu_isa():
    """Best micro-kernel set the running CPU supports."""
    return ISA_NAMES[fa_cpu_level()]


def set_isa(name):
    """Select a micro-kernel set by name (testing aid: clamped to what the CPU supports).
    Returns the name actually selected. Not thread-safe against running kernels."""
    levels = {v: k for k, v in ISA_NAMES.items()}
    if name not in levels:
        raise ValueError(f"isa must be one of {sorted(levels)}, got {name!r}")
    return ISA_NAMES[fa_init(levels[name])]
