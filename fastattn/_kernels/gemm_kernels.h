/* gemm_kernels.h -- the linear-layer kernels the Cython driver (_gemm.pyx) calls, per dtype,
 * through one table per kernel set (gm_kernels_for(level), level: simd.h's ISA state):
 *   pack      W (N, K) -> panels (gemm_tile.h has the layout)
 *   item      one (row block, column block) of y = act(x @ W.T + bias) + res
 *   act       y = act(x) elementwise
 *   ln        one row of residual + LayerNorm (vectorised; sums in double)
 * and gm_block_done, the counter by which the GEMM driver normalises a row block's finished
 * rows (the fused LayerNorm after a residual). */
#ifndef FASTATTN_GEMM_KERNELS_H
#define FASTATTN_GEMM_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "simd.h"

enum {
    GM_ACT_NONE = 0,
    GM_ACT_RELU = 1,
    GM_ACT_GELU = 2,       /* exact: x Phi(x) with the normal CDF through erf */
    GM_ACT_GELU_TANH = 3,  /* torch's approximate='tanh' (HF gelu_new / gelu_pytorch_tanh) */
    GM_ACT_SILU = 4,       /* x sigmoid(x), a.k.a. swish */
    GM_ACT_ERF = 5         /* erf itself: not an epilogue, exposed for the accuracy tests */
};

/* The widest panel of any ISA (AVX-512 floats: 4 vectors of 16): the column blocks of the
 * driver are multiples of it, so they are multiples of every ISA's NR. */
#define GM_NR_MAX 64

#define GM_DECLARE_OPS(T, sfx)                                                                  \
    typedef struct {                                                                            \
        int mr, nr, kc;                                                                         \
        void (*pack)(const T *w, ptrdiff_t w_rs, ptrdiff_t N, ptrdiff_t K, T *wp);              \
        void (*item)(const T *x, ptrdiff_t x_rs, ptrdiff_t m, ptrdiff_t K, const T *wp,         \
                     ptrdiff_t npad, ptrdiff_t n0, ptrdiff_t nc, const T *bias, int act,        \
                     const T *res, ptrdiff_t res_rs, T *y, ptrdiff_t y_rs, ptrdiff_t pf_n0);    \
        void (*act)(const T *x, ptrdiff_t n, T *y, int act);                                    \
        void (*ln)(const T *x, const T *res, ptrdiff_t n, const T *gamma, const T *beta,        \
                   double eps, T *y);                                                           \
    } gm_ops_##sfx;

GM_DECLARE_OPS(float, f32)
GM_DECLARE_OPS(double, f64)

/* float32 with binary16 panels (gemm_tile.h's GM_HALF): pack copies binary16 bit patterns
 * (the weight already converted, exactly) into the float instance's layout; item is the float
 * instance's with each panel vector widened as it is loaded. NULL in the sets without them. */
typedef struct {
    void (*pack)(const uint16_t *w, ptrdiff_t w_rs, ptrdiff_t N, ptrdiff_t K, uint16_t *wp);
    void (*item)(const float *x, ptrdiff_t x_rs, ptrdiff_t m, ptrdiff_t K, const uint16_t *wp,
                 ptrdiff_t npad, ptrdiff_t n0, ptrdiff_t nc, const float *bias, int act,
                 const float *res, ptrdiff_t res_rs, float *y, ptrdiff_t y_rs, ptrdiff_t pf_n0);
} gm_ops_f32h;

/* One more of a row block's n column items has finished: nonzero for the thread that finished
 * the last of them (acquire-release, so that thread sees every item's stores to the block). */
static inline int gm_block_done(int *count, int n)
{
    return __atomic_add_fetch(count, 1, __ATOMIC_ACQ_REL) == n;
}

/* the next unclaimed index of a work queue (relaxed: the items are independent) */
static inline ptrdiff_t gm_claim(ptrdiff_t *next)
{
    return __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);
}

typedef struct {
    gm_ops_f32 f32;
    gm_ops_f64 f64;
    gm_ops_f32h f32h;
} gm_kernels;

/* Fill the tables (once, at import of _gemm); then the kernels of the set `level` (FA_ISA_*, one
 * the CPU has: simd.h's state). */
void gm_setup(void);
const gm_kernels *gm_kernels_for(int level);
/* nonzero where the set `level` has binary16 panels (the AVX2 set's also need the CPU's F16C:
 * _gemm.pyx checks it) */
int gm_half_ok(int level);

/* The driver's calls by item size (isz 4: float32, 8: float64) on untyped pointers, strides in
 * elements: the dtype is picked here, once per call of a kernel. */
static inline void gm_blocking(const gm_kernels *k, int isz, int *mr, int *nr, int *kc)
{
    *mr = isz == 4 ? k->f32.mr : k->f64.mr;
    *nr = isz == 4 ? k->f32.nr : k->f64.nr;
    *kc = isz == 4 ? k->f32.kc : k->f64.kc;
}

static inline void gm_pack(const gm_kernels *k, int isz, const void *w, ptrdiff_t w_rs,
                           ptrdiff_t N, ptrdiff_t K, void *wp)
{
    if (isz == 4)
        k->f32.pack((const float *)w, w_rs, N, K, (float *)wp);
    else
        k->f64.pack((const double *)w, w_rs, N, K, (double *)wp);
}

static inline void gm_item(const gm_kernels *k, int isz, const void *x, ptrdiff_t x_rs,
                           ptrdiff_t m, ptrdiff_t K, const void *wp, ptrdiff_t npad, ptrdiff_t n0,
                           ptrdiff_t nc, const void *bias, int act, const void *res,
                           ptrdiff_t res_rs, void *y, ptrdiff_t y_rs, ptrdiff_t pf_n0)
{
    if (isz == 4)
        k->f32.item((const float *)x, x_rs, m, K, (const float *)wp, npad, n0, nc,
                    (const float *)bias, act, (const float *)res, res_rs, (float *)y, y_rs, pf_n0);
    else
        k->f64.item((const double *)x, x_rs, m, K, (const double *)wp, npad, n0, nc,
                    (const double *)bias, act, (const double *)res, res_rs, (double *)y, y_rs,
                    pf_n0);
}

/* the float32 GEMM with binary16 panels (gm_half_ok(level) checked by the caller) */
static inline void gm_pack_half(const gm_kernels *k, const void *w, ptrdiff_t w_rs, ptrdiff_t N,
                                ptrdiff_t K, void *wp)
{
    k->f32h.pack((const uint16_t *)w, w_rs, N, K, (uint16_t *)wp);
}

static inline void gm_item_half(const gm_kernels *k, const void *x, ptrdiff_t x_rs, ptrdiff_t m,
                                ptrdiff_t K, const void *wp, ptrdiff_t npad, ptrdiff_t n0,
                                ptrdiff_t nc, const void *bias, int act, const void *res,
                                ptrdiff_t res_rs, void *y, ptrdiff_t y_rs, ptrdiff_t pf_n0)
{
    k->f32h.item((const float *)x, x_rs, m, K, (const uint16_t *)wp, npad, n0, nc,
                 (const float *)bias, act, (const float *)res, res_rs, (float *)y, y_rs, pf_n0);
}

static inline void gm_act(const gm_kernels *k, int isz, const void *x, ptrdiff_t n, void *y,
                          int act)
{
    if (isz == 4)
        k->f32.act((const float *)x, n, (float *)y, act);
    else
        k->f64.act((const double *)x, n, (double *)y, act);
}

static inline void gm_ln(const gm_kernels *k, int isz, const void *x, const void *res, ptrdiff_t n,
                         const void *gamma, const void *beta, double eps, void *y)
{
    if (isz == 4)
        k->f32.ln((const float *)x, (const float *)res, n, (const float *)gamma,
                  (const float *)beta, eps, (float *)y);
    else
        k->f64.ln((const double *)x, (const double *)res, n, (const double *)gamma,
                  (const double *)beta, eps, (double *)y);
}

#endif
