# cython: language_level=3
# Design:
#   The int8 linear layer (and below, the bfloat16 one: gemm_bf16): y = act(dequant(q(x) @ Wq.T) + bias) + res, optionally followed by a
#   LayerNorm of each row (the fused post-norm), on one OpenMP team. Scheme, packed layout and
#   why the bits do not depend on the CPU: qgemm_kernels.h. Weights are quantised and packed
#   in Python (fastattn/_quant.py: NumPy, the same on every machine); this module quantises the
#   activations and runs the work items.
#
#   One parallel region, three loops: each row of x quantised into a workspace (M x Kp bytes,
#   M scales and M zero points, malloc'd at their exact size); the work items, an item being up to _MC rows
#   by a column block (_gemm's shape-only sizes: 256 columns, fewer when that leaves under 16 items),
#   computed over the whole K by one thread; then, with a norm, each row of y normalised by one
#   thread. An element's value depends on its row and column only (the integer sum is exact),
#   so results are identical for any thread count and any batch composition.
#
# Kernels assume (fastattn/_quant.py checks all of it first): x float32 (M, K), last axis
# contiguous, aligned; wp, sw, comp made by fastattn._quant.pack_int8 for this K and N; bias
# (N,), res (M, N), y (M, N) float32 as in the float GEMM; y does not overlap anything else.

from cython.parallel cimport parallel, prange
from libc.stdint cimport int8_t, int32_t, uint8_t, uint16_t
from libc.stdlib cimport free, malloc
cimport numpy as cnp

from fastattn._kernels._gemm cimport _col_block   # (QG_NGROUP = GM_NR_MAX = 64)
from fastattn._kernels._openmp cimport fa_team_open, fa_team_place, fa_team_t
from fastattn._kernels._simd cimport isa_features, isa_now

cnp.import_array()

cdef extern from "qgemm_kernels.h" nogil:
    int QG_SCALAR, QG_AVX2, QG_AVX2_VNNI, QG_AVX512, QG_AVX512_VNNI, QG_N_VARIANTS
    int QG_NEON, QG_DOTPROD, QG_I8MM
    int QG_PANEL, QG_NGROUP, QG_MAX_K
    ctypedef struct qg_kernels:
        int mr
        void (*quant)(const float *x, Py_ssize_t K, uint8_t *xq, Py_ssize_t kp, float *sx,
                      float *zx) noexcept nogil
        void (*item)(const uint8_t *xq, Py_ssize_t kp, const float *sx, const float *zx,
                     Py_ssize_t m,
                     const int8_t *wp, const float *sw, const int32_t *comp, Py_ssize_t n0,
                     Py_ssize_t nc, const float *bias, int act, const float *res,
                     Py_ssize_t res_rs, float *y, Py_ssize_t y_rs) noexcept nogil
        void (*ln)(const float *x, const float *res, Py_ssize_t n, const float *gamma,
                   const float *beta, double eps, float *y) noexcept nogil
        int fnr, fkc
        void (*fpack)(const float *w, Py_ssize_t w_rs, Py_ssize_t N, Py_ssize_t K,
                      float *wp) noexcept nogil
        void (*fitem)(const float *x, Py_ssize_t x_rs, Py_ssize_t m, Py_ssize_t K,
                      const float *wp, Py_ssize_t npad, Py_ssize_t n0, Py_ssize_t nc,
                      const float *bias, int act, const float *res, Py_ssize_t res_rs,
                      float *y, Py_ssize_t y_rs, Py_ssize_t pf_n0) noexcept nogil
    void qg_setup()
    const qg_kernels *qg_kernels_for(int variant)
    int qg_variant_ok(int variant, unsigned features)
    int qg_variant_for(int level, unsigned features)

qg_setup()

VARIANTS = {"scalar": QG_SCALAR, "avx2": QG_AVX2, "avx2-vnni": QG_AVX2_VNNI,
            "avx512": QG_AVX512, "avx512-vnni": QG_AVX512_VNNI,
            "neon": QG_NEON, "dotprod": QG_DOTPROD, "i8mm": QG_I8MM}
_NAMES = {v: k for k, v in VARIANTS.items()}
PANEL = QG_PANEL
NGROUP = QG_NGROUP
MAX_K = QG_MAX_K

cdef int _forced = -1       # a variant forced by set_variant (testing aid), else -1

cdef enum:
    _MC = 96                # rows per work item (a multiple of every variant's MR), as _gemm's


cdef inline Py_ssize_t _cdiv(Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    return (a + b - 1) // b


cdef inline int _variant_now() noexcept nogil:
    return _forced if _forced >= 0 else qg_variant_for(isa_now(), isa_features())


def variant():
    """Name of the int8 kernel variant in use: set_variant's, else the best one for the
    kernel set of fastattn's ISA state and the CPU's features under the FASTATTN_ISA cap
    ('avx512-vnni', 'avx512', 'avx2-vnni', 'avx2', 'scalar')."""
    return _NAMES[_variant_now()]


def cpu_variants():
    """The int8 variants this CPU can run (under the FASTATTN_ISA cap)."""
    return [name for name, v in VARIANTS.items() if qg_variant_ok(v, isa_features())]


def _cap_note():
    from fastattn._kernels._simd import isa_cap
    return f"; FASTATTN_ISA={isa_cap()}" if isa_cap() else ""


def set_variant(name):
    """Force an int8 kernel variant (testing aid; None: back to automatic). Returns the name in
    use. ValueError for an unknown name or one this CPU cannot run (under the FASTATTN_ISA
    cap)."""
    global _forced
    if name is None:
        _forced = -1
        return variant()
    if name not in VARIANTS:
        raise ValueError(f"int8 kernel variant must be one of {sorted(VARIANTS)} or None, "
                         f"got {name!r}")
    if not qg_variant_ok(VARIANTS[name], isa_features()):
        raise ValueError(f"this CPU cannot run the int8 kernel variant {name!r} "
                         f"(it can: {cpu_variants()}{_cap_note()})")
    _forced = VARIANTS[name]
    return name


cdef struct _Epilogue:
    const float *bias       # (N,) or NULL
    const float *res        # (M, N) or NULL, row stride res_rs
    Py_ssize_t res_rs
    bint has_norm           # LayerNorm after the residual
    const float *gamma      # (N,) or NULL
    const float *beta       # (N,) or NULL
    double eps


cdef _Epilogue _epilogue(object bias, object res, object norm):
    """The epilogue's arguments of gemm_int8 and gemm_bf16 as pointers (the arrays checked by
    the caller: float32, contiguous rows)."""
    cdef _Epilogue e
    e.bias = e.res = e.gamma = e.beta = NULL
    e.res_rs, e.eps, e.has_norm = 0, 0.0, norm is not None
    if bias is not None:
        e.bias = <const float *> cnp.PyArray_DATA(<cnp.ndarray> bias)
    if res is not None:
        e.res = <const float *> cnp.PyArray_DATA(<cnp.ndarray> res)
        e.res_rs = cnp.PyArray_STRIDES(<cnp.ndarray> res)[0] // 4
    if e.has_norm:
        gamma, beta, e.eps = norm
        if gamma is not None:
            e.gamma = <const float *> cnp.PyArray_DATA(<cnp.ndarray> gamma)
        if beta is not None:
            e.beta = <const float *> cnp.PyArray_DATA(<cnp.ndarray> beta)
    return e


def gemm_int8(cnp.ndarray x, cnp.ndarray wp, cnp.ndarray sw, cnp.ndarray comp, Py_ssize_t N,
              object bias, int act, object res, cnp.ndarray y, int n_threads, object norm=None):
    """y = act(dequant(q(x) @ Wq.T) + bias) + res, then LayerNorm(y) when norm = (gamma, beta,
    eps) is given. x (M, K) float32; wp, sw, comp: pack_int8's for (N, K); M, N >= 1."""
    # IN   x     (M, K)             float32, row stride x_rs
    # IN   wp    (Npad * Kp,)       int8 panels; sw (Npad,) float32; comp (Npad,) int32
    # IN   bias  (N,) or None; res (M, N) or None, row stride res_rs
    # OUT  y     (M, N)             row stride y_rs
    # WORK xq    (M, Kp) bytes (+1: K = 0), sx, zx (M,) floats: malloc'd at their exact size
    cdef Py_ssize_t M = cnp.PyArray_DIMS(x)[0], K = cnp.PyArray_DIMS(x)[1]
    cdef Py_ssize_t kp = _cdiv(K, 4) * 4
    cdef Py_ssize_t x_rs = cnp.PyArray_STRIDES(x)[0] // 4
    cdef Py_ssize_t y_rs = cnp.PyArray_STRIDES(y)[0] // 4
    cdef _Epilogue e = _epilogue(bias, res, norm)
    cdef Py_ssize_t res_rs = e.res_rs
    cdef const float *bp = e.bias
    cdef const float *rp = e.res
    cdef const float *gp = e.gamma
    cdef const float *betap = e.beta
    cdef double eps = e.eps
    cdef bint has_norm = e.has_norm
    cdef const float *xp = <const float *> cnp.PyArray_DATA(x)
    cdef const int8_t *wpp = <const int8_t *> cnp.PyArray_DATA(wp)
    cdef const float *swp = <const float *> cnp.PyArray_DATA(sw)
    cdef const int32_t *cp = <const int32_t *> cnp.PyArray_DATA(comp)
    cdef float *yp = <float *> cnp.PyArray_DATA(y)
    cdef const qg_kernels *kern = qg_kernels_for(_variant_now())
    cdef Py_ssize_t nc = _col_block(M, N)
    cdef Py_ssize_t n_nb = _cdiv(N, nc)
    cdef Py_ssize_t n_mb = _cdiv(M, _MC)
    cdef Py_ssize_t n_items = n_mb * n_nb
    cdef Py_ssize_t r, l, i0, n0
    cdef uint8_t *xq = <uint8_t *> malloc(<size_t>(M * kp) + 1)
    cdef float *sx = <float *> malloc(<size_t>(2 * M) * sizeof(float))
    cdef float *zx = sx + M
    if xq == NULL or sx == NULL:
        free(xq)
        free(sx)
        raise MemoryError(f"fastattn: cannot allocate the int8 GEMM's {M} x {kp} activation "
                          f"workspace")
    cdef fa_team_t team = fa_team_open(n_threads, n_items if n_items > M else M)
    try:
        with nogil, parallel(num_threads=team.n):
            fa_team_place(&team)
            for r in prange(M, schedule='static'):
                kern.quant(xp + r * x_rs, K, xq + r * kp, kp, sx + r, zx + r)
            if M > _MC:
                # column blocks outer: an item's weights are reused by the next row block's
                # item while they are in L2 / L3
                for l in prange(n_items, schedule='dynamic'):
                    i0 = (l % n_mb) * _MC
                    n0 = (l // n_mb) * nc
                    kern.item(xq + i0 * kp, kp, sx + i0, zx + i0, _MC if M - i0 > _MC else M - i0, wpp,
                              swp, cp, n0, nc if N - n0 > nc else N - n0, bp, act,
                              (rp + i0 * res_rs) if rp != NULL else NULL, res_rs,
                              yp + i0 * y_rs, y_rs)
            else:
                # one row block (a decode step): each thread streams a contiguous slice of the
                # weights
                for l in prange(n_items, schedule='static'):
                    n0 = l * nc
                    kern.item(xq, kp, sx, zx, M, wpp, swp, cp, n0, nc if N - n0 > nc else N - n0,
                              bp, act, rp, res_rs, yp, y_rs)
            if has_norm:
                for r in prange(M, schedule='static'):
                    kern.ln(yp + r * y_rs, NULL, N, gp, betap, eps, yp + r * y_rs)
    finally:
        free(xq)
        free(sx)


# ---------------------------------------------------------------- the bfloat16 GEMM
# y = act(bf16(x) @ Wb.T + bias) + res, then LayerNorm(y) when asked: bgemm_kernels.h (the
# arithmetic every variant shares, the layout). The same parallel structure as gemm_int8: each
# row of x rounded to bfloat16 into a workspace (M x Kp values, malloc'd at its exact size),

def portable_panel_width():
    """The packed layout of the portable float GEMM under the variant in use: its panel width
    (pack_f32_portable's packing is valid while this stays the same)."""
    return qg_kernels_for(_variant_now()).fnr


def pack_f32_portable(cnp.ndarray w):
    """w (N, K) float32 C-contiguous -> (packed panels, panel width) for gemm_f32_portable."""
    if w.dtype.char != "f" or w.ndim != 2 or not w.flags.c_contiguous:
        raise ValueError("w must be a C-contiguous 2-D float32 array")
    cdef const qg_kernels *kern = qg_kernels_for(_variant_now())
    cdef Py_ssize_t N = w.shape[0], K = w.shape[1], nr = kern.fnr
    cdef Py_ssize_t npad = _cdiv(N, nr) * nr
    cdef cnp.ndarray wp = cnp.PyArray_ZEROS(1, [max(npad * K, 1)], cnp.NPY_FLOAT32, 0)
    kern.fpack(<const float *> cnp.PyArray_DATA(w), K, N, K, <float *> cnp.PyArray_DATA(wp))
    return wp, nr


def gemm_f32_portable(cnp.ndarray x, cnp.ndarray wp, int nr, Py_ssize_t N, cnp.ndarray y,
                      int n_threads):
    """y = x @ W.T with the portable float GEMM (qgemm_kernels.h: sums over k in order, nothing
    fused: the same bits on every variant and architecture). x (M, K), y (M, N) float32
    C-contiguous; wp, nr: pack_f32_portable's, under a variant of the same panel width."""
    cdef const qg_kernels *kern = qg_kernels_for(_variant_now())
    if kern.fnr != nr:
        raise ValueError(f"the panels were packed {nr} wide; the variant in use reads "
                         f"{kern.fnr} (pack again)")
    cdef Py_ssize_t M = x.shape[0], K = x.shape[1]
    if y.shape[0] != M or y.shape[1] != N or x.dtype.char != "f" or y.dtype.char != "f" \
            or not x.flags.c_contiguous or not y.flags.c_contiguous:
        raise ValueError("x (M, K) and y (M, N) must be C-contiguous float32 arrays")
    cdef Py_ssize_t npad = _cdiv(N, nr) * nr
    if wp.shape[0] < npad * K:
        raise ValueError("the packed panels are smaller than (N, K) needs")
    cdef const float *xp = <const float *> cnp.PyArray_DATA(x)
    cdef const float *wpp = <const float *> cnp.PyArray_DATA(wp)
    cdef float *yp = <float *> cnp.PyArray_DATA(y)
    cdef Py_ssize_t n_mb = _cdiv(M, _MC), l, i0
    if M == 0 or N == 0:
        return
    cdef fa_team_t team = fa_team_open(n_threads, n_mb)
    with nogil, parallel(num_threads=team.n):
        fa_team_place(&team)
        for l in prange(n_mb, schedule='static'):
            i0 = l * _MC
            kern.fitem(xp + i0 * K, K, _MC if M - i0 > _MC else M - i0, K, wpp, npad, 0, N,
                       NULL, 0, NULL, 0, yp + i0 * N, N, -1)


def layer_norm_rows(cnp.ndarray x, object res, object gamma, object beta, double eps,
                    cnp.ndarray y, int n_threads):
    """y[r] = LayerNorm(x[r] (+ res[r])) * gamma + beta, row by row, with the int8 layers' own
    LayerNorm (16 lanes, nothing fused: the same bits on every variant, ISA and architecture):
    the LayerNorms of an int8 model that no GEMM carries (the embedding's, a pre-norm layer's,
    the final one). x, res, y (M, N) float32 C-contiguous (y may be x); gamma, beta (N,)
    float32 or None (1 and 0)."""
    cdef Py_ssize_t M = cnp.PyArray_DIMS(x)[0], N = cnp.PyArray_DIMS(x)[1], r
    for name, a in (("x", x), ("res", res), ("y", y)):
        if a is not None and (a.dtype.char != "f" or a.ndim != 2 or a.shape[0] != M
                              or a.shape[1] != N or not a.flags.c_contiguous):
            raise ValueError(f"{name} must be a C-contiguous ({M}, {N}) float32 array")
    for name, a in (("gamma", gamma), ("beta", beta)):
        if a is not None and (a.dtype.char != "f" or a.shape != (N,)
                              or not a.flags.c_contiguous):
            raise ValueError(f"{name} must be a contiguous ({N},) float32 array")
    cdef const float *xp = <const float *> cnp.PyArray_DATA(x)
    cdef const float *rp = <const float *> cnp.PyArray_DATA(<cnp.ndarray> res) if res is not None else NULL
    cdef const float *gp = <const float *> cnp.PyArray_DATA(<cnp.ndarray> gamma) if gamma is not None else NULL
    cdef const float *bp = <const float *> cnp.PyArray_DATA(<cnp.ndarray> beta) if beta is not None else NULL
    cdef float *yp = <float *> cnp.PyArray_DATA(y)
    cdef const qg_kernels *kern = qg_kernels_for(_variant_now())
    if M == 0 or N == 0:
        return
    cdef fa_team_t team = fa_team_open(n_threads, M)
    with nogil, parallel(num_threads=team.n):
        fa_team_place(&team)
        for r in prange(M, schedule='static'):
            kern.ln(xp + r * N, (rp + r * N) if rp != NULL else NULL, N, gp, bp, eps, yp + r * N)

# the work items, the rows normalised. An element's value depends on its row and column only.

cdef extern from "bgemm_kernels.h" nogil:
    int BG_SCALAR, BG_AVX2, BG_AVX512, BG_AVX512_BF16, BG_N_VARIANTS
    int BG_PANEL, BG_NGROUP
    ctypedef struct bg_kernels:
        void (*ln)(const float *x, const float *res, Py_ssize_t n, const float *gamma,
                   const float *beta, double eps, float *y) noexcept nogil
    void bg_setup()
    const bg_kernels *bg_kernels_for(int variant)
    int bg_variant_ok(int variant, unsigned features)
    int bg_variant_for(int level, unsigned features)
    void bg_round_row(const float *x, Py_ssize_t K, uint16_t *xb, Py_ssize_t kp)
    void bg_item(const bg_kernels *k, const uint16_t *xb, Py_ssize_t kp, Py_ssize_t m,
                 const uint16_t *wp, Py_ssize_t n0, Py_ssize_t nc, const float *bias, int act,
                 const float *res, Py_ssize_t res_rs, float *y, Py_ssize_t y_rs)

bg_setup()

BF16_VARIANTS = {"scalar": BG_SCALAR, "avx2": BG_AVX2, "avx512": BG_AVX512,
                 "avx512-bf16": BG_AVX512_BF16}
_BF16_NAMES = {v: k for k, v in BF16_VARIANTS.items()}
BF16_PANEL = BG_PANEL
BF16_NGROUP = BG_NGROUP

cdef int _bf16_forced = -1  # a variant forced by set_bf16_variant (testing aid), else -1


cdef inline int _bf16_variant_now() noexcept nogil:
    return _bf16_forced if _bf16_forced >= 0 else bg_variant_for(isa_now(), isa_features())


def bf16_variant():
    """Name of the bfloat16 kernel variant in use: set_bf16_variant's, else the best one for
    the kernel set of fastattn's ISA state and the CPU's features under the FASTATTN_ISA cap
    ('avx512-bf16', 'avx512', 'avx2', 'scalar'). Every variant gives the same bits."""
    return _BF16_NAMES[_bf16_variant_now()]


def bf16_cpu_variants():
    """The bfloat16 variants this CPU can run (under the FASTATTN_ISA cap)."""
    return [name for name, v in BF16_VARIANTS.items() if bg_variant_ok(v, isa_features())]


def set_bf16_variant(name):
    """Force a bfloat16 kernel variant (testing aid; None: back to automatic). Returns the name
    in use. ValueError for an unknown name or one this CPU cannot run (under the cap)."""
    global _bf16_forced
    if name is None:
        _bf16_forced = -1
        return bf16_variant()
    if name not in BF16_VARIANTS:
        raise ValueError(f"bfloat16 kernel variant must be one of {sorted(BF16_VARIANTS)} or "
                         f"None, got {name!r}")
    if not bg_variant_ok(BF16_VARIANTS[name], isa_features()):
        raise ValueError(f"this CPU cannot run the bfloat16 kernel variant {name!r} "
                         f"(it can: {bf16_cpu_variants()}{_cap_note()})")
    _bf16_forced = BF16_VARIANTS[name]
    return name


def gemm_bf16(cnp.ndarray x, cnp.ndarray wp, Py_ssize_t N, object bias, int act, object res,
              cnp.ndarray y, int n_threads, object norm=None):
    """y = act(bf16(x) @ Wb.T + bias) + res, then LayerNorm(y) when norm = (gamma, beta, eps)
    is given. x (M, K) float32; wp: fastattn._quant.Bf16Weight's panels for (N, K) (uint16);
    M, N >= 1."""
    # IN   x     (M, K)             float32, row stride x_rs
    # IN   wp    (Npad * Kp,)       bfloat16 panels (uint16)
    # IN   bias  (N,) or None; res (M, N) or None, row stride res_rs
    # OUT  y     (M, N)             row stride y_rs
    # WORK xb    (M, Kp) bfloat16 (+1 value: K = 0), malloc'd at its exact size
    cdef Py_ssize_t M = cnp.PyArray_DIMS(x)[0], K = cnp.PyArray_DIMS(x)[1]
    cdef Py_ssize_t kp = _cdiv(K, 2) * 2
    cdef Py_ssize_t x_rs = cnp.PyArray_STRIDES(x)[0] // 4
    cdef Py_ssize_t y_rs = cnp.PyArray_STRIDES(y)[0] // 4
    cdef _Epilogue e = _epilogue(bias, res, norm)
    cdef Py_ssize_t res_rs = e.res_rs
    cdef const float *bp = e.bias
    cdef const float *rp = e.res
    cdef const float *gp = e.gamma
    cdef const float *betap = e.beta
    cdef double eps = e.eps
    cdef bint has_norm = e.has_norm
    cdef const float *xp = <const float *> cnp.PyArray_DATA(x)
    cdef const uint16_t *wpp = <const uint16_t *> cnp.PyArray_DATA(wp)
    cdef float *yp = <float *> cnp.PyArray_DATA(y)
    cdef const bg_kernels *kern = bg_kernels_for(_bf16_variant_now())
    cdef Py_ssize_t nc = _col_block(M, N)
    cdef Py_ssize_t n_nb = _cdiv(N, nc)
    cdef Py_ssize_t n_mb = _cdiv(M, _MC)
    cdef Py_ssize_t n_items = n_mb * n_nb
    cdef Py_ssize_t r, l, i0, n0
    cdef uint16_t *xb = <uint16_t *> malloc(<size_t>(M * kp + 1) * sizeof(uint16_t))
    if xb == NULL:
        raise MemoryError(f"fastattn: cannot allocate the bfloat16 GEMM's {M} x {kp} activation "
                          f"workspace")
    cdef fa_team_t team = fa_team_open(n_threads, n_items if n_items > M else M)
    try:
        with nogil, parallel(num_threads=team.n):
            fa_team_place(&team)
            for r in prange(M, schedule='static'):
                bg_round_row(xp + r * x_rs, K, xb + r * kp, kp)
            if M > _MC:
                # column blocks outer: an item's weights are reused by the next row block's
                # item while they are in L2 / L3
                for l in prange(n_items, schedule='dynamic'):
                    i0 = (l % n_mb) * _MC
                    n0 = (l // n_mb) * nc
                    bg_item(kern, xb + i0 * kp, kp, _MC if M - i0 > _MC else M - i0, wpp, n0,
                            nc if N - n0 > nc else N - n0, bp, act,
                            (rp + i0 * res_rs) if rp != NULL else NULL, res_rs,
                            yp + i0 * y_rs, y_rs)
            else:
                # one row block (a decode step): each thread streams a contiguous slice of the
                # weights
                for l in prange(n_items, schedule='static'):
                    n0 = l * nc
                    bg_item(kern, xb, kp, M, wpp, n0, nc if N - n0 > nc else N - n0, bp, act,
                            rp, res_rs, yp, y_rs)
            if has_norm:
                for r in prange(M, schedule='static'):
                    kern.ln(yp + r * y_rs, NULL, N, gp, betap, eps, yp + r * y_rs)
    finally:
        free(xb)


# ---------------------------------------------------------------- weight quantisation (loading)

from libc.math cimport fabs, nearbyint
from libc.float cimport FLT_MAX


def quantize_rows(cnp.ndarray w, cnp.ndarray q, cnp.ndarray scale, cnp.ndarray panels,
                  cnp.ndarray comp, int n_threads=1):
    """Per-output-channel int8 quantisation of rows of w, the numbers of fastattn/_quant.py's
    NumPy reference (_quantize_rows_reference): s = max|w| / 127 in float32, q = round-half-even
    of w / s in float64, clamped to [-127, 127] (s = 0: q = 0). Writes scale (N,), and, when
    given, q (N, K) int8, and panels / comp: the packed layout of qgemm_kernels.h (panels of
    QG_PANEL rows by k-quads; panels zeroed by the caller) with each row's sum. Rows are
    independent (one thread each): the same bytes for any thread count.

    w: (N, K) float32 C-contiguous. Returns the number of rows holding inf or NaN (nothing is
    guaranteed written unless it is 0)."""
    cdef Py_ssize_t N = cnp.PyArray_DIMS(w)[0], K = cnp.PyArray_DIMS(w)[1]
    cdef Py_ssize_t kp = _cdiv(K, 4) * 4
    cdef const float *W = <const float *> cnp.PyArray_DATA(w)
    cdef float *S = <float *> cnp.PyArray_DATA(scale)
    cdef int8_t *Q = NULL if q is None else <int8_t *> cnp.PyArray_DATA(q)
    cdef int8_t *P = NULL if panels is None else <int8_t *> cnp.PyArray_DATA(panels)
    cdef int32_t *C = NULL if comp is None else <int32_t *> cnp.PyArray_DATA(comp)
    cdef Py_ssize_t n, k, bad = 0
    cdef const float *row
    cdef float amax, s, a
    cdef double safe, r
    cdef int8_t v
    cdef int32_t total
    cdef int8_t *base
    with nogil:
        for n in prange(N, num_threads=max(1, n_threads), schedule="static"):
            row = W + n * K
            amax = 0
            for k in range(K):
                a = fabs(row[k])
                if not a <= FLT_MAX:              # inf or NaN
                    amax = -1
                    break
                if a > amax:
                    amax = a
            if amax < 0:
                bad += 1                          # (a reduction: private to each thread)
                continue
            s = amax / <float>127
            S[n] = s
            safe = <double>s if s > 0 else 1.0
            total = 0
            base = NULL
            if P != NULL:
                base = P + (n // QG_PANEL) * (kp // 4) * (QG_PANEL * 4) + (n % QG_PANEL) * 4
            for k in range(K):
                r = nearbyint(<double>row[k] / safe)
                if r > 127:
                    r = 127
                elif r < -127:
                    r = -127
                v = <int8_t>r
                total = total + v
                if Q != NULL:
                    Q[n * K + k] = v
                if base != NULL:
                    base[(k // 4) * (QG_PANEL * 4) + k % 4] = v
            if C != NULL:
                C[n] = total
    return bad
