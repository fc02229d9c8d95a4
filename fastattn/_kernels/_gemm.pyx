# cython: language_level=3
# Design:
#   The linear layer y = act(x @ W.T + bias) + res on the CPU, with W (N, K) packed once into
#   panels (gemm_tile.h: layout, micro-kernel, epilogue). No BLAS call.
#
#   Work items: y (M, N) is cut into row blocks of at most MC = 96 rows and column blocks of
#   NC columns; one item = one (row block, column block), computed over the whole K by one
#   thread (K is never split between threads). Items are independent, so one parallel region
#   inside `with nogil` runs them on the same libgomp team as the attention kernels. Which
#   thread runs an item never changes its bits. NC is 256 columns, or less when that leaves
#   fewer than 16 items (few rows, e.g. a decode step: the work is then spread over N). The
#   schedule (A/B runs in alternating processes on the shared 2-vCPU hosts):
#     several row blocks: each thread owns a contiguous share of the rows (from a multiple of
#       12 rows, so every ISA's register blocks stay whole; at least MC rows a share) and
#       takes its items column block by column block from a queue of its own: its x rows stay
#       in its L2 while each column block's panels stream past once, and the next GEMM of a
#       model at the same M gives it the rows it has just written. A thread whose queue is
#       empty takes items from the others' queues, one at a time: one core is often slowed by
#       the host for a while, and a plain static split waited for it (base Transformer
#       forward, five rounds on Zen 3: static 561-758 ms against dynamic 465-564). Against
#       the earlier single dynamic queue (items column block by column block, the row blocks
#       shared out as they came), AVX-512 Xeon: products alone +0.5-1.8% (operands hot) and
#       +2-3% (operands cold) but -1 to -2.6% at K = 2048, the base forward's median over
#       nine process pairs +2.2% (bench/results/ab_gemm_avx512.txt). Column blocks outer
#       matter: row block by row block, every item fetched its panels again from L3 or memory
#       (MiniLM 32 x 128 forward 0.944 / 0.985 of the time, base Transformer 0.965, Zen 3).
#     one row block (decode): static, each thread streaming a contiguous slice of the weights
#       (beam 4 x batch 8, M = 32, four rounds: dynamic 3-14% slower in every round).
#
#   Bitwise reproducibility: an element's sum runs over k in order, in K blocks of the ISA's KC,
#   whatever item or register-block position computes it; MC and NC depend on the shape only.
#   So results are identical for any thread count (tests/kernels/test_gemm.py checks 1/2/3/8/16).
#
#   Memory: the packed weights (K * Npad elements, owned by the caller as a NumPy array; _ops
#   starts them, and outputs from 256 KiB up, on a 64-byte boundary: unaligned, every AVX-512
#   panel load straddled two cache lines, 2-19% slower at large M; exact size and unaligned
#   under the sanitizer); no other workspace (the micro-kernel's edge tiles are on the
#   stack) but the work queues' counters (one 64-byte line per thread) and, for a fused
#   LayerNorm, one int per 12 rows (a counter for each row block), calloc'ed per call; nothing cached between calls, so
#   FASTATTN_NO_WORKSPACE_CACHE has nothing to switch off here. x is read in place (an
#   experiment packing x into MR-row panels per item measured 10-40% slower: with 256-column
#   items the packing is not amortised).
#
# Kernels assume (fastattn/_ops.py checks all of it first): x, W, bias, res, y aligned to their
# item size, native byte order, last dimension contiguous, one float dtype; y does not overlap
# x, W, bias or res; the packed buffer was made by pack_weight with the ISA now selected.

from cython.parallel cimport parallel, prange
from libc.math cimport sqrt
from libc.stdlib cimport calloc, free
cimport numpy as cnp

from fastattn._kernels._openmp cimport (FASTATTN_OPENMP_ENABLED, fa_team_open,
                                        fa_team_place, fa_team_t, omp_get_thread_num)
from fastattn._kernels._simd cimport isa_now

cnp.import_array()

# (the C declarations are in _gemm.pxd, which the embedding module cimports for LayerNorm)


cdef const gm_kernels *gemm_kernels(int level) noexcept nogil:
    return gm_kernels_for(level)


ACTIVATIONS = {None: GM_ACT_NONE, "relu": GM_ACT_RELU, "gelu": GM_ACT_GELU,
               "gelu_tanh": GM_ACT_GELU_TANH, "silu": GM_ACT_SILU}
ACT_ERF = GM_ACT_ERF      # erf itself, for the accuracy tests (activation(x, y, ACT_ERF, n))
gm_setup()

cdef enum:
    _MC = 96               # rows per work item: a multiple of every ISA's MR (4 or 6)
    _NC = 256              # columns per work item, a multiple of GM_NR_MAX ...
    _MIN_ITEMS = 16        # ... lowered (to a multiple of GM_NR_MAX) to get at least this many
    _ACT_CHUNK = 16384     # elements per work item of the standalone activations
    _RQ = 12               # threads' row shares start at multiples of this (every MR divides it)
    _QSTRIDE = 8           # one work-queue counter per 64-byte line
MC = _MC


cdef inline Py_ssize_t _cdiv(Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    return (a + b - 1) // b


cdef Py_ssize_t _col_block(Py_ssize_t M, Py_ssize_t N) noexcept nogil:
    """Columns per work item: depends on the shape only (never on the thread count)."""
    cdef Py_ssize_t n_mb = _cdiv(M, _MC)
    cdef Py_ssize_t nc = _NC
    if n_mb * _cdiv(N, nc) < _MIN_ITEMS:
        nc = _cdiv(_cdiv(N, _MIN_ITEMS), GM_NR_MAX) * GM_NR_MAX
        if nc < GM_NR_MAX:
            nc = GM_NR_MAX
    return nc


def col_block(Py_ssize_t M, Py_ssize_t N):
    """Columns per work item for an (M, N) output (for tests and the benchmark)."""
    return _col_block(M, N)


# ---------------------------------------------------------------- packing

def blocking(int itemsize):
    """(MR, NR, KC) of the kernel set now selected for this item size."""
    cdef int mr, nr, kc
    gm_blocking(gm_kernels_for(isa_now()), itemsize, &mr, &nr, &kc)
    return (mr, nr, kc)


def panel_width(int itemsize):
    """NR, the panel width of the ISA now selected, for float32 (4) or float64 (8)."""
    return blocking(itemsize)[1]


def packed_size(Py_ssize_t N, Py_ssize_t K, int itemsize):
    """Elements of the packed buffer for an (N, K) weight with the ISA now selected."""
    cdef Py_ssize_t nr = panel_width(itemsize)
    return K * _cdiv(N, nr) * nr


def pack_weight(cnp.ndarray w, cnp.ndarray wp):
    """wp <- W (N, K) in panels. w: 2-D, last axis contiguous, aligned; wp: 1-D contiguous of
    packed_size(N, K) elements, same dtype."""
    # IN   w   (N, K)       row stride w_rs
    # OUT  wp  (K * Npad,)  the layout in gemm_tile.h
    cdef Py_ssize_t N = cnp.PyArray_DIMS(w)[0], K = cnp.PyArray_DIMS(w)[1]
    cdef int isz = <int>cnp.PyArray_ITEMSIZE(w)
    cdef Py_ssize_t w_rs = cnp.PyArray_STRIDES(w)[0] // isz
    cdef const char *src = <const char *> cnp.PyArray_DATA(w)
    cdef char *dst = <char *> cnp.PyArray_DATA(wp)
    cdef const gm_kernels *kern = gm_kernels_for(isa_now())
    with nogil:
        gm_pack(kern, isz, src, w_rs, N, K, dst)


# ---------------------------------------------------------------- the GEMM driver

# AVX-512F converts binary16 itself; the AVX2 set's conversion is F16C's, a CPUID bit of its own
# (every AVX2 CPU seen has it)
from fastattn._kernels import _simd as _simd_mod

cdef extern from "simd.h" nogil:
    int FA_ISA_AVX512

_F16C = "f16c" in _simd_mod.cpu_features(capped=True)


cdef bint _half_ok(int level) noexcept:
    return gm_half_ok(level) and (level == FA_ISA_AVX512 or _F16C)


def half_panels():
    """Whether the kernel set now selected has binary16 panels for float32 (and the CPU, as
    capped, runs them): AVX2 with F16C, AVX-512."""
    return bool(_half_ok(isa_now()))


def pack_weight_half(cnp.ndarray w, cnp.ndarray wp):
    """wp <- W (N, K) in panels of binary16 bit patterns. w: uint16 (the weight converted to
    float16 exactly and viewed as uint16), 2-D, last axis contiguous; wp: uint16, 1-D contiguous
    of packed_size(N, K, 4) elements (the float32 layout). half_panels() must be true."""
    cdef Py_ssize_t N = cnp.PyArray_DIMS(w)[0], K = cnp.PyArray_DIMS(w)[1]
    cdef Py_ssize_t w_rs = cnp.PyArray_STRIDES(w)[0] // 2
    cdef const char *src = <const char *> cnp.PyArray_DATA(w)
    cdef char *dst = <char *> cnp.PyArray_DATA(wp)
    cdef int level = isa_now()
    if not _half_ok(level):
        raise RuntimeError("fastattn: this kernel set has no binary16 panels")
    cdef const gm_kernels *kern = gm_kernels_for(level)
    with nogil:
        gm_pack_half(kern, src, w_rs, N, K, dst)


cdef struct _Norm:
    # a LayerNorm over each finished row of y, in place (the fused post-norm)
    const char *gamma          # (N,) or NULL
    const char *beta           # (N,) or NULL
    double eps
    int *done                  # (row blocks,) column items finished, zero at the start


cdef inline void _gemm_item(const gm_kernels *kern, Py_ssize_t i0, Py_ssize_t m, Py_ssize_t n0,
                            const char *x, Py_ssize_t x_rs, Py_ssize_t K, const char *wp,
                            Py_ssize_t npad, Py_ssize_t N, Py_ssize_t nc, Py_ssize_t n_nb,
                            const char *bias, int act, const char *res, Py_ssize_t res_rs,
                            char *y, Py_ssize_t y_rs, int isz, const _Norm *norm,
                            Py_ssize_t pf_n0, bint half) noexcept nogil:
    # rows [i0, i0 + m), columns [n0, n0 + nc) (fewer at the right edge) over the whole K;
    # pf_n0: the first column of this thread's next item when that is another column block
    # (its weights are fetched into L2 during the last K block), else -1; half: wp holds
    # binary16 panels (float32 x)
    cdef Py_ssize_t w = nc if N - n0 > nc else N - n0
    cdef Py_ssize_t r
    if half:
        gm_item_half(kern, x + i0 * x_rs * isz, x_rs, m, K, wp, npad, n0, w, bias, act,
                     (res + i0 * res_rs * isz) if res != NULL else NULL, res_rs,
                     y + i0 * y_rs * isz, y_rs, pf_n0)
    else:
        gm_item(kern, isz, x + i0 * x_rs * isz, x_rs, m, K, wp, npad, n0, w, bias, act,
                (res + i0 * res_rs * isz) if res != NULL else NULL, res_rs, y + i0 * y_rs * isz,
                y_rs, pf_n0)
    # the thread that finishes a row block's last column item normalises its rows while they
    # are still in cache: the LayerNorm kernel on the same values, so the same bits as a
    # separate pass
    # (a row block starts on a multiple of _RQ rows: its counter is norm.done[i0 // _RQ])
    if norm == NULL or not gm_block_done(norm.done + i0 // _RQ, <int>n_nb):
        return
    for r in range(i0, i0 + m):
        gm_ln(kern, isz, y + r * y_rs * isz, NULL, N, norm.gamma, norm.beta, norm.eps,
              y + r * y_rs * isz)


cdef inline Py_ssize_t _row_split(Py_ssize_t q, Py_ssize_t n_q, Py_ssize_t M) noexcept nogil:
    """The first row of thread q's share of M rows (q = n_q: M), a multiple of _RQ."""
    if q >= n_q:
        return M
    return (q * M // n_q) // _RQ * _RQ


cdef void _gemm_run(const gm_kernels *kern, const char *x, Py_ssize_t x_rs, Py_ssize_t M,
                    Py_ssize_t K,
                    const char *wp, Py_ssize_t N, const char *bias, int act,
                    const char *res, Py_ssize_t res_rs, char *y, Py_ssize_t y_rs,
                    int isz, int n_threads, const _Norm *norm,
                    Py_ssize_t *queues, bint half) noexcept nogil:
    # IN   x     (M, K)        row stride x_rs
    # IN   wp    (K * Npad,)   W (N, K) packed by pack_weight with the current kernel set
    # IN   bias  (N,)          or NULL
    # IN   res   (M, N)        row stride res_rs, or NULL
    # OUT  y     (M, N)        row stride y_rs; also holds the partial sums between K blocks
    # IN   norm    a LayerNorm for every finished row, or NULL; norm.done has cdiv(M, _RQ)
    #              zeroed counters, one for each row block at its first row // _RQ
    # IN   queues  n_threads * _QSTRIDE zeroed counters (M > _MC; one per share), else unused
    # strides in elements; pointers untyped, isz (4 or 8) picks the dtype; kern: the kernel set
    cdef int mr, nr, kc
    gm_blocking(kern, isz, &mr, &nr, &kc)
    cdef Py_ssize_t npad = _cdiv(N, nr) * nr
    cdef Py_ssize_t nc = _col_block(M, N)
    cdef Py_ssize_t n_nb = _cdiv(N, nc)
    cdef Py_ssize_t n_mb = _cdiv(M, _MC)
    cdef Py_ssize_t n_items = n_mb * n_nb
    cdef Py_ssize_t item, i0, q, u, l, r0, r1, nb, n_sh
    cdef fa_team_t team = fa_team_open(n_threads, n_items)
    q = u = l = r0 = r1 = nb = i0 = 0               # (thread-private copies of these)
    if M > _MC:
        # several row blocks (compute-bound): thread q owns the q-th of n_sh contiguous shares
        # of the rows (the same share in every GEMM of a model at one size, so the rows it
        # wrote last are the ones it reads next) and works through it column block by column
        # block, its x rows staying in L2 while each block of weights streams past once. A
        # thread that finishes its share takes the unclaimed items of the others', one at a
        # time, so a core the host slows for a while does not hold the others up. Shares of at
        # least _MC rows: with more threads than that, the extra ones start on a share with
        # its owner (a thread per share that small would each stream all of the weights).
        # Which thread computes an element never changes its bits.
        n_sh = team.n if M // _MC > team.n else M // _MC
        with parallel(num_threads=team.n):
            fa_team_place(&team)
            for u in range(n_sh):
                q = (omp_get_thread_num() + u) % n_sh
                r0 = _row_split(q, n_sh, M)
                r1 = _row_split(q + 1, n_sh, M)
                nb = _cdiv(r1 - r0, _MC)
                while True:
                    l = gm_claim(queues + q * _QSTRIDE)
                    if l >= nb * n_nb:
                        break
                    i0 = r0 + (l % nb) * _MC
                    _gemm_item(kern, i0, _MC if r1 - i0 > _MC else r1 - i0, (l // nb) * nc, x,
                               x_rs, K, wp, npad, N, nc, n_nb, bias, act, res, res_rs, y, y_rs,
                               isz, norm,
                               ((l + 1) // nb) * nc if (l + 1) % nb == 0 and l + 1 < nb * n_nb
                               else -1, half)
    else:
        # one row block (a decode step: reading the weights is the work): each thread streams
        # one contiguous slice of them
        with parallel(num_threads=team.n):
            fa_team_place(&team)
            for item in prange(n_items, schedule='static'):
                _gemm_item(kern, 0, M, item * nc, x, x_rs, K, wp, npad, N, nc, n_nb, bias, act,
                           res, res_rs, y, y_rs, isz, norm,
                           (item + 1) * nc if item + 1 < n_items else -1, half)


def gemm(cnp.ndarray x, cnp.ndarray wp, Py_ssize_t N, object bias, int act, object res,
         cnp.ndarray y, int n_threads, object norm=None):
    """y = act(x @ W.T + bias) + res with W packed in wp. x (M, K), res and y (M, N): 2-D,
    last axis contiguous, aligned; bias (N,) contiguous or None; M, N >= 1. norm: None or
    (gamma, beta, eps), then y = LayerNorm(y) row by row (gamma, beta (N,) contiguous or None):
    the bits of layer_norm(y) after the GEMM, done as each row block is finished.
    wp uint16 with float32 x: binary16 panels (pack_weight_half), the same results as the
    float32 panels of the same values."""
    cdef Py_ssize_t M = cnp.PyArray_DIMS(x)[0], K = cnp.PyArray_DIMS(x)[1]
    cdef int isz = <int>cnp.PyArray_ITEMSIZE(x)
    cdef Py_ssize_t x_rs = cnp.PyArray_STRIDES(x)[0] // isz
    cdef Py_ssize_t y_rs = cnp.PyArray_STRIDES(y)[0] // isz
    cdef Py_ssize_t res_rs = 0
    cdef const char *bp = NULL
    cdef const char *rp = NULL
    if bias is not None:
        bp = <const char *> cnp.PyArray_DATA(<cnp.ndarray> bias)
    if res is not None:
        rp = <const char *> cnp.PyArray_DATA(<cnp.ndarray> res)
        res_rs = cnp.PyArray_STRIDES(<cnp.ndarray> res)[0] // isz
    cdef const char *xp = <const char *> cnp.PyArray_DATA(x)
    cdef const char *wpp = <const char *> cnp.PyArray_DATA(wp)
    cdef char *yp = <char *> cnp.PyArray_DATA(y)
    cdef int level = isa_now()
    cdef const gm_kernels *kern = gm_kernels_for(level)
    cdef bint half = cnp.PyArray_ITEMSIZE(wp) == 2
    if half and (isz != 4 or not _half_ok(level)):
        raise ValueError("fastattn: binary16 panels need float32 x and a kernel set with them")
    cdef _Norm nm
    cdef const _Norm *nmp = NULL
    if norm is not None:
        gamma, beta, eps = norm
        nm.gamma = <const char *> cnp.PyArray_DATA(<cnp.ndarray> gamma) if gamma is not None else NULL
        nm.beta = <const char *> cnp.PyArray_DATA(<cnp.ndarray> beta) if beta is not None else NULL
        nm.eps = eps
        nm.done = <int *> calloc(<size_t>_cdiv(M, _RQ), sizeof(int))
        if nm.done == NULL:
            raise MemoryError("fastattn: cannot allocate the GEMM's row-block counters")
        nmp = &nm
    cdef Py_ssize_t *queues = <Py_ssize_t *> calloc(<size_t>(max(n_threads, 1) * _QSTRIDE),
                                                    sizeof(Py_ssize_t))
    if queues == NULL:
        if nmp != NULL:
            free(nm.done)
        raise MemoryError("fastattn: cannot allocate the GEMM's work queues")
    try:
        with nogil:
            _gemm_run(kern, xp, x_rs, M, K, wpp, N, bp, act, rp, res_rs, yp, y_rs, isz, n_threads,
                      nmp, queues, half)
    finally:
        free(queues)
        if nmp != NULL:
            free(nm.done)


# ---------------------------------------------------------------- activations, LayerNorm

def activation(cnp.ndarray x, cnp.ndarray y, int act, int n_threads):
    """y = act(x) elementwise; x, y contiguous, same float dtype, same size (y may be x)."""
    cdef Py_ssize_t n = cnp.PyArray_SIZE(x)
    cdef Py_ssize_t n_chunks = _cdiv(n, _ACT_CHUNK)
    cdef Py_ssize_t c, c0, w
    cdef int isz = <int>cnp.PyArray_ITEMSIZE(x)
    cdef char *xp = <char *> cnp.PyArray_DATA(x)
    cdef char *yp = <char *> cnp.PyArray_DATA(y)
    cdef const gm_kernels *kern = gm_kernels_for(isa_now())
    cdef fa_team_t team = fa_team_open(n_threads, n_chunks)
    with nogil, parallel(num_threads=team.n):
        fa_team_place(&team)
        for c in prange(n_chunks, schedule='static'):
            c0 = c * _ACT_CHUNK
            w = _ACT_CHUNK if n - c0 > _ACT_CHUNK else n - c0
            gm_act(kern, isz, xp + c0 * isz, w, yp + c0 * isz, act)


def layer_norm(cnp.ndarray x, object res, object gamma, object beta, double eps,
               cnp.ndarray y, int n_threads):
    """y = LayerNorm(x + res) * gamma + beta over the last axis. x, res, y (rows, n) C-contiguous;
    gamma, beta (n,) contiguous or None; rows >= 1, n >= 1; y may be x."""
    # IN   x, res      (rows, n)
    # IN   gamma, beta (n,) or NULL (1 and 0)
    # OUT  y           (rows, n), may be x
    cdef Py_ssize_t rows = cnp.PyArray_DIMS(x)[0], n = cnp.PyArray_DIMS(x)[1]
    cdef int isz = <int>cnp.PyArray_ITEMSIZE(x)
    cdef char *xp = <char *> cnp.PyArray_DATA(x)
    cdef char *yp = <char *> cnp.PyArray_DATA(y)
    cdef char *rp = NULL
    cdef char *gp = NULL
    cdef char *bp = NULL
    cdef Py_ssize_t r
    if res is not None:
        rp = <char *> cnp.PyArray_DATA(<cnp.ndarray> res)
    if gamma is not None:
        gp = <char *> cnp.PyArray_DATA(<cnp.ndarray> gamma)
    if beta is not None:
        bp = <char *> cnp.PyArray_DATA(<cnp.ndarray> beta)
    cdef const gm_kernels *kern = gm_kernels_for(isa_now())
    cdef fa_team_t team = fa_team_open(n_threads, rows)
    with nogil, parallel(num_threads=team.n):
        fa_team_place(&team)
        for r in prange(rows, schedule='static'):
            gm_ln(kern, isz, xp + r * n * isz, rp + r * n * isz if rp != NULL else NULL, n, gp,
                  bp, eps, yp + r * n * isz)


# RMSNorm (T5's LayerNorm) rows: s = x + res (rounded to the dtype, as the unfused sum would
# be), y = s / sqrt(mean(s^2) + eps) * gamma with the sum of squares and the products in double,
# rounded once. Plain C over the row in index order (no per-ISA variants, no reassociation): the
# sums run in one order on every CPU and thread count. It replaced NumPy's astype / einsum /
# multiply chain (T5's decode step makes 37 such calls; bench/results/families_2026-12-03.txt).

cdef inline void _rms_row_f32(const float *x, const float *res, Py_ssize_t n, const float *g,
                              double eps, float *y) noexcept nogil:
    cdef double ss = 0.0, s, rstd
    cdef Py_ssize_t j
    for j in range(n):
        s = <double>(<float>(x[j] + res[j])) if res != NULL else <double>x[j]
        ss += s * s
    rstd = 1.0 / sqrt(ss / <double>n + eps)
    for j in range(n):
        s = <double>(<float>(x[j] + res[j])) if res != NULL else <double>x[j]
        y[j] = <float>(s * rstd * <double>g[j]) if g != NULL else <float>(s * rstd)


cdef inline void _rms_row_f64(const double *x, const double *res, Py_ssize_t n, const double *g,
                              double eps, double *y) noexcept nogil:
    cdef double ss = 0.0, s, rstd
    cdef Py_ssize_t j
    for j in range(n):
        s = x[j] + res[j] if res != NULL else x[j]
        ss += s * s
    rstd = 1.0 / sqrt(ss / <double>n + eps)
    for j in range(n):
        s = x[j] + res[j] if res != NULL else x[j]
        y[j] = s * rstd * g[j] if g != NULL else s * rstd


def rms_norm(cnp.ndarray x, object res, object gamma, double eps, cnp.ndarray y, int n_threads):
    """y = RMSNorm(x + res) * gamma over the last axis. x, res, y (rows, n) C-contiguous, one
    float dtype; gamma (n,) contiguous or None (1); rows >= 1, n >= 1; y may be x."""
    # IN   x, res  (rows, n)
    # IN   gamma   (n,) or NULL (1)
    # OUT  y       (rows, n), may be x
    cdef Py_ssize_t rows = cnp.PyArray_DIMS(x)[0], n = cnp.PyArray_DIMS(x)[1]
    cdef bint f32 = cnp.PyArray_ITEMSIZE(x) == 4
    cdef char *xp = <char *> cnp.PyArray_DATA(x)
    cdef char *yp = <char *> cnp.PyArray_DATA(y)
    cdef char *rp = NULL
    cdef char *gp = NULL
    cdef Py_ssize_t r, off
    if res is not None:
        rp = <char *> cnp.PyArray_DATA(<cnp.ndarray> res)
    if gamma is not None:
        gp = <char *> cnp.PyArray_DATA(<cnp.ndarray> gamma)
    cdef fa_team_t team = fa_team_open(n_threads, rows)
    with nogil, parallel(num_threads=team.n):
        fa_team_place(&team)
        for r in prange(rows, schedule='static'):
            off = r * n
            if f32:
                _rms_row_f32(<float *> xp + off, <float *> rp + off if rp != NULL else NULL, n,
                             <float *> gp, eps, <float *> yp + off)
            else:
                _rms_row_f64(<double *> xp + off, <double *> rp + off if rp != NULL else NULL,
                             n, <double *> gp, eps, <double *> yp + off)


# ---------------------------------------------------------------- run-time facts, testing hook

def openmp_enabled():
    return bool(FASTATTN_OPENMP_ENABLED)


# the ISA state's functions (fastattn._kernels._simd), for bench/bench_gemm*.py and
# bench/tools/ab_gemm.py (which load older builds' _gemm too, where they lived)
from fastattn._kernels._simd import isa, isa_level, set_isa  # noqa: E402
