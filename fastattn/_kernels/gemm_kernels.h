/* gemm_kernels.h -- the linear-layer kernels the Cython driver (_gemm.pyx) calls, per dtype,
 * through tables filled by gm_init() with the best version for the running CPU:
 *   pack      W (N, K) -> panels (gemm_tile.h has the layout)
 *   item      one (row block, column block) of y = act(x @ W.T + bias) + res
 *   act       y = act(x) elementwise
 *   ln        one row of residual + LayerNorm (vectorised; sums in double)
 * and gm_block_done, the counter by which the GEMM driver normalises a row block's finished
 * rows (the fused LayerNorm after a residual). */
#ifndef FASTATTN_GEMM_KERNELS_H
#define FASTATTN_GEMM_KERNELS_H

#include <stddef.h>

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

extern gm_ops_f32 gm_f32;
extern gm_ops_f64 gm_f64;

int gm_init(int level);
int gm_current_level(void);

#endif
