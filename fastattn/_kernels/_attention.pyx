# cython: language_level=3
# Design: the fused attention's Python entry points, a thin layer over the C driver.
#
#   The algorithm, its passes and their parallel loops live in fa_driver.c (the design notes are
#   at its top); the per-ISA micro-kernels in fa_tile.h, instantiated and dispatched at run time
#   by fa_kernels.c. This module turns NumPy arrays into the driver's fa_problem (shapes and
#   element strides), asks fa_plan for the workspace, allocates it (exactly that size, 64-byte
#   aligned, cached per Python thread unless FASTATTN_NO_WORKSPACE_CACHE=1) and calls the driver
#   once per dtype without the GIL.
#
# Everything the kernels assume was checked by functional.py / _validation.py: q, k, v, mask and
# out aligned to their item size, native byte order, last dimension contiguous; every size > 0.

cimport numpy as cnp
import os
import threading

import numpy as np

from fastattn._kernels._openmp cimport (FASTATTN_OPENMP_ENABLED, fa_team_size,
                                        omp_get_max_threads)
from fastattn._kernels._simd cimport isa_now

cnp.import_array()

cdef extern from "fa_workspace.h" nogil:
    void *fa_ws_alloc(size_t nbytes)
    void fa_ws_free(void *p)

cdef extern from "simd.h" nogil:
    int FA_ISA_PORTABLE

cdef extern from "fa_kernels.h" nogil:
    double fa_exp_det(double x)

cdef extern from "fa_driver.h" nogil:
    enum:
        FA_BQ, FA_BQ_ONE, FA_BQ_ONE_N, FA_DIRECT_MAX_L, FA_KEY_SPLIT, FA_MAX_LEAD
        FA_W_PIECES
    ctypedef struct fa_problem:
        int nd
        Py_ssize_t lead[FA_MAX_LEAD]
        Py_ssize_t q_lead[FA_MAX_LEAD]
        Py_ssize_t k_lead[FA_MAX_LEAD]
        Py_ssize_t v_lead[FA_MAX_LEAD]
        Py_ssize_t m_lead[FA_MAX_LEAD]
        Py_ssize_t k_shape[FA_MAX_LEAD]
        Py_ssize_t v_shape[FA_MAX_LEAD]
        Py_ssize_t o_lead[FA_MAX_LEAD]
        Py_ssize_t q_rs, k_rs, v_rs, m_rs, m_cs, o_rs
        Py_ssize_t N
        int L, S, E, Ev, causal
        double scale
        int head_group
        int packed_only
        int isa
        int bq
        int n_sp
        int fused_pack
    ctypedef struct fa_work:
        char *base
        Py_ssize_t total
        Py_ssize_t off[FA_W_PIECES]
        Py_ssize_t size[FA_W_PIECES]
        Py_ssize_t scratch_stride
    int fa_key_block(int E, int Ev, int S, int itemsize)
    int fa_query_block(Py_ssize_t L, Py_ssize_t N, int ncols_max)
    Py_ssize_t fa_scratch_bytes(int bq, int bk, int pad, int Ev, int itemsize)
    void fa_problem_tiling(fa_problem *p, int itemsize)
    Py_ssize_t fa_fused_pack_bytes(const fa_problem *p)
    Py_ssize_t fa_parallel_items(const fa_problem *p)
    void fa_plan(const fa_problem *p, int n_threads, fa_work *w)
    void fa_sdpa_run_f32(const fa_problem *p, const fa_work *w, const float *q, const float *k,
                         const float *v, const unsigned char *bm, const float *fm, float *out,
                         float *weights, double *stats, int n_threads)
    void fa_sdpa_run_f64(const fa_problem *p, const fa_work *w, const double *q, const double *k,
                         const double *v, const unsigned char *bm, const double *fm, double *out,
                         double *weights, double *stats, int n_threads)
    void fa_softmax_rows_f32(int isa, const float *x, float *y, Py_ssize_t rows, int n,
                             int n_threads)
    void fa_softmax_rows_f64(int isa, const double *x, double *y, Py_ssize_t rows, int n,
                             int n_threads)
    void fa_exp_f32(int isa, const float *x, Py_ssize_t n, float *y)
    void fa_exp_f64(int isa, const double *x, Py_ssize_t n, double *y)


BQ = FA_BQ                          # query rows per work item (see query_block)
BQ_ONE = FA_BQ_ONE                  # up to this many query rows, one block per leading index
BQ_ONE_N = FA_BQ_ONE_N              # ... when there are this many leading indices or more
DIRECT_MAX_L = FA_DIRECT_MAX_L      # up to this many query rows, K and V are read in place
KEY_SPLIT = FA_KEY_SPLIT            # ... and keys beyond this many are split into chunks
MAX_LEAD_DIMS = FA_MAX_LEAD         # leading (batch, head, ...) dimensions a call may have
_PIECE_NAMES = ("kpack", "vpack", "v_bad", "scratch", "part", "pml")


def key_block(int E, int Ev, int itemsize, int S=1 << 30):
    """Keys per tile for these head sizes, item size and (optionally) key count."""
    return fa_key_block(E, Ev, S, itemsize)


def query_block(Py_ssize_t L, Py_ssize_t N, int E, int Ev, int S, int itemsize):
    """Query rows per work item for L query rows over N leading indices (fa_query_block)."""
    cdef int pad = 64 if itemsize == 4 else 32
    cdef int bk = fa_key_block(E, Ev, S, itemsize)
    return fa_query_block(L, N, (bk + pad - 1) // pad * pad)


def scratch_bytes(int E, int Ev, int S, int itemsize, Py_ssize_t L=FA_BQ, Py_ssize_t N=1):
    """Bytes of scratch one thread needs for the fused kernel (fa_scratch_bytes)."""
    cdef int pad = 64 if itemsize == 4 else 32
    return fa_scratch_bytes(query_block(L, N, E, Ev, S, itemsize), fa_key_block(E, Ev, S, itemsize),
                            pad, Ev, itemsize)


# ---------------------------------------------------------------- arrays -> fa_problem

cdef inline Py_ssize_t _estride(cnp.ndarray a, int d):
    """Stride of dimension d in elements, 0 where the dimension has length 1 (broadcasts)."""
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


cdef _problem(fa_problem *p, cnp.ndarray q, cnp.ndarray k, cnp.ndarray v, cnp.ndarray m,
              tuple lead, bint causal, double scale, int head_group, bint packed_only=False,
              bint portable=False):
    cdef int nd = len(lead), d
    if nd > FA_MAX_LEAD:
        raise ValueError(f"at most {FA_MAX_LEAD} leading dimensions are supported, got {nd}")
    p.nd = nd
    p.N = 1
    for d in range(nd):
        p.lead[d] = lead[d]
        p.N *= lead[d]
        p.m_lead[d] = 0
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
    if m is not None:
        _lead_strides(m, nd, p.m_lead, NULL)
        p.m_rs = _estride(m, m.ndim - 2)
        p.m_cs = _estride(m, m.ndim - 1)
    p.o_rs = p.Ev                      # a C-contiguous (*lead, L, Ev) output; sdpa() sets
    cdef Py_ssize_t ostride = <Py_ssize_t>p.L * p.Ev   # the strides of the array it writes
    for d in range(nd - 1, -1, -1):
        p.o_lead[d] = ostride
        ostride *= lead[d]
    p.causal = causal
    p.scale = scale
    p.head_group = head_group
    p.packed_only = packed_only
    # portable: the kernel set's portable instance (fa_portable.c: the same bits on every ISA)
    p.isa = isa_now() | (FA_ISA_PORTABLE if portable else 0)
    fa_problem_tiling(p, cnp.PyArray_ITEMSIZE(q))


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
    threads (after the cap by parallel items), query rows per block, whether items pack their
    own head's tiles (and the bytes of thread scratch those take), total bytes and each piece's
    (offset, size)."""
    cdef fa_problem p
    cdef fa_work w
    _problem(&p, q, k, v, None, lead, False, 1.0, 1)
    n_threads = fa_team_size(n_threads, fa_parallel_items(&p))
    fa_plan(&p, n_threads, &w)
    return {"threads": n_threads, "total": w.total, "key_splits": p.n_sp, "query_block": p.bq,
            "fused_pack": bool(p.fused_pack), "own_pack_bytes": fa_fused_pack_bytes(&p),
            "scratch_stride": w.scratch_stride,
            "pieces": {_PIECE_NAMES[i]: (w.off[i], w.size[i]) for i in range(FA_W_PIECES)}}


def sdpa(cnp.ndarray q, cnp.ndarray k, cnp.ndarray v, mask, cnp.ndarray out, weights,
         tuple lead, bint causal, double scale, int head_group, int n_threads,
         bint packed_only=False, bint portable=False):
    """Fused attention into `out` (and `weights` when not None). portable: the kernel set's
    portable instance (the same bits on every ISA and architecture: the int8 models').

    q (..., L, E), k (..., S, E), v (..., S, Ev), mask (..., L, S) bool/float or None:
    each with its own leading dims, broadcastable to `lead` (k, v with the head dim divided by
    head_group). out (*lead, L, Ev) any strides with a contiguous last dimension, its elements
    distinct and sharing no memory with the inputs; weights (*lead, L, S) C-contiguous and
    zero-filled; both of q's dtype. All sizes > 0. Validation happened in functional.py. n_threads
    is an upper bound: the call uses no more threads than it has parallel work items.
    """
    cdef fa_problem p
    cdef fa_work w
    cdef cnp.ndarray m_arr = mask
    _problem(&p, q, k, v, m_arr, lead, causal, scale, head_group, packed_only, portable)
    _lead_strides(out, p.nd, p.o_lead, NULL)
    p.o_rs = _estride(out, out.ndim - 2)
    cdef int nthr = fa_team_size(n_threads, fa_parallel_items(&p))   # the team fa_sdpa_run opens
    fa_plan(&p, nthr, &w)
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
    cdef char *fm = mp if not is_bool else NULL
    if cnp.PyArray_ITEMSIZE(q) == 4:
        with nogil:
            fa_sdpa_run_f32(&p, &w, <const float *>qp, <const float *>kp, <const float *>vp, bm,
                            <const float *>fm, <float *>op, <float *>wp, stats, nthr)
    else:
        with nogil:
            fa_sdpa_run_f64(&p, &w, <const double *>qp, <const double *>kp, <const double *>vp,
                            bm, <const double *>fm, <double *>op, <double *>wp, stats, nthr)


# ---------------------------------------------------------------- standalone softmax, exp

def softmax_rows(cnp.ndarray x, cnp.ndarray y, int n_threads):
    """y = softmax(x) along the last axis; x, y C-contiguous 2-D, same float dtype, n > 0."""
    cdef Py_ssize_t rows = cnp.PyArray_DIMS(x)[0]
    cdef int n = <int>cnp.PyArray_DIMS(x)[1]
    cdef char *xp = <char *> cnp.PyArray_DATA(x)
    cdef char *yp = <char *> cnp.PyArray_DATA(y)
    cdef int level = isa_now()
    if cnp.PyArray_ITEMSIZE(x) == 4:
        with nogil:
            fa_softmax_rows_f32(level, <const float *>xp, <float *>yp, rows, n, n_threads)
    else:
        with nogil:
            fa_softmax_rows_f64(level, <const double *>xp, <double *>yp, rows, n, n_threads)


def kernel_exp(cnp.ndarray x, cnp.ndarray y):
    """y = exp(x) with the kernel's vectorised exp (for the accuracy tests)."""
    cdef Py_ssize_t n = cnp.PyArray_SIZE(x)
    if cnp.PyArray_ITEMSIZE(x) == 4:
        fa_exp_f32(isa_now(), <const float *>cnp.PyArray_DATA(x), n, <float *>cnp.PyArray_DATA(y))
    else:
        fa_exp_f64(isa_now(), <const double *>cnp.PyArray_DATA(x), n,
                   <double *>cnp.PyArray_DATA(y))


# ---------------------------------------------------------------- build and run-time facts

def exp_det(double x):
    """The portable attention's double exp (fa_portable.c; x <= 0): exposed for its tests."""
    return fa_exp_det(x)


def openmp_enabled():
    """True when the extension was compiled with OpenMP."""
    return bool(FASTATTN_OPENMP_ENABLED)


def omp_max_threads():
    """omp_get_max_threads() now (follows OMP_NUM_THREADS and threadpoolctl's limits)."""
    return omp_get_max_threads()


# the kernel set in use, for bench/bench_decode.py: fastattn._kernels._simd has the ISA state
# and its functions (isa, cpu_isa, set_isa), for every kernel family
from fastattn._kernels._simd import isa  # noqa: E402
