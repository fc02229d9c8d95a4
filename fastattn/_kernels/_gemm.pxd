# The GEMM module's C declarations (gemm_kernels.h), and its kernel tables for the other kernel
# modules: the embedding module (_embedding.pyx) runs this module's LayerNorm rows,
#     kern = gemm_kernels(isa_now()); gm_ln(kern, isz, x, res, n, gamma, beta, eps, y)
# (`from fastattn._kernels._gemm cimport gemm_kernels, gm_kernels, gm_ln`).

cdef extern from "gemm_kernels.h" nogil:
    int GM_ACT_NONE, GM_ACT_RELU, GM_ACT_GELU, GM_ACT_GELU_TANH, GM_ACT_SILU, GM_ACT_ERF
    int GM_NR_MAX
    # the kernels of one kernel set (both dtypes), and the calls by item size isz (4 or 8)
    ctypedef struct gm_kernels:
        pass
    void gm_setup()
    const gm_kernels *gm_kernels_for(int level)
    void gm_blocking(const gm_kernels *k, int isz, int *mr, int *nr, int *kc)
    void gm_pack(const gm_kernels *k, int isz, const void *w, Py_ssize_t w_rs, Py_ssize_t N,
                 Py_ssize_t K, void *wp)
    void gm_item(const gm_kernels *k, int isz, const void *x, Py_ssize_t x_rs, Py_ssize_t m,
                 Py_ssize_t K, const void *wp, Py_ssize_t npad, Py_ssize_t n0, Py_ssize_t nc,
                 const void *bias, int act, const void *res, Py_ssize_t res_rs, void *y,
                 Py_ssize_t y_rs, Py_ssize_t pf_n0)
    # float32 with binary16 panels (gm_half_ok(level) first)
    int gm_half_ok(int level)
    void gm_pack_half(const gm_kernels *k, const void *w, Py_ssize_t w_rs, Py_ssize_t N,
                      Py_ssize_t K, void *wp)
    void gm_item_half(const gm_kernels *k, const void *x, Py_ssize_t x_rs, Py_ssize_t m,
                      Py_ssize_t K, const void *wp, Py_ssize_t npad, Py_ssize_t n0,
                      Py_ssize_t nc, const void *bias, int act, const void *res,
                      Py_ssize_t res_rs, void *y, Py_ssize_t y_rs, Py_ssize_t pf_n0)
    void gm_act(const gm_kernels *k, int isz, const void *x, Py_ssize_t n, void *y, int act)
    void gm_ln(const gm_kernels *k, int isz, const void *x, const void *res, Py_ssize_t n,
               const void *gamma, const void *beta, double eps, void *y)
    int gm_block_done(int *count, int n)
    Py_ssize_t gm_claim(Py_ssize_t *next)


cdef const gm_kernels *gemm_kernels(int level) noexcept nogil
# columns per work item for an (M, N) output, from the shape only (the int8 GEMM's too)
cdef Py_ssize_t _col_block(Py_ssize_t M, Py_ssize_t N) noexcept nogil
