/* bgemm_kernels.h -- the bfloat16 linear layer's kernels (bgemm_kernels.c), one table per variant.
 *
 *   y = act(bf16(x) @ Wb.T + bias) + res,   then optionally LayerNorm(y) row by row
 *
 * Weights: bfloat16 (fastattn/_quant.py rounds them from float32 in NumPy, to nearest even,
 * subnormals to zero). Activations: each row rounded to bfloat16 the same way at every call
 * (bg_round_row), on its own (a row's result does not depend on the batch).
 *
 * Products and sums: each output element is one float32 accumulator, from +0, that takes the
 * k-pairs (2i, 2i + 1) in increasing i, and per pair
 *     acc = F(acc + x[2i+1] w[2i+1]),   then   acc = F(acc + x[2i] w[2i])
 * where the product of two bfloat16 values is exact (no rounding, whatever its exponent) and
 * F rounds the exact sum to nearest even at float32's 24 bits with an unbounded exponent, then
 * gives a signed zero where that is below 2^-126 (flush to zero, tininess after rounding). That
 * is VDPBF16PS's arithmetic, measured on AMD Zen 4 (bench/studies/vdpbf16ps_semantics.c, docs/
 * bfloat16.md: 80 million random lanes and the cases around 2^-126): denormal inputs read as
 * zero (there are none: the rounding flushes them), the odd element's product first. Every
 * variant does exactly this:
 *   avx512-bf16   vdpbf16ps on zmm
 *   avx512, avx2  two vfmadd (fused: the product exact, one rounding) per pair, odd first,
 *                 with MXCSR's flush-to-zero (and DAZ) set around the micro-kernel (x86
 *                 flushes after rounding, as vdpbf16ps does)
 *   scalar        plain C in double: the product exact, the sum rounded to 53 bits then to 24
 *                 (exact: 53 >= 2 * 24 + 2), the flush by comparison
 * so the sums are the same bits on every variant, and the float epilogue (bias, activation,
 * residual, LayerNorm) is the int8 GEMM's (qgemm_kernels.h: the same bits on every variant).
 * The order per element is fixed by k alone (the whole K in one accumulator, no K blocks), so
 * the results do not depend on the thread count or on which register block computes them.
 *
 * Packed weight layout (the same for every variant): N padded to Npad (a multiple of
 * BG_NGROUP), K to Kp (a multiple of 2); panel p holds columns [16 p, 16 p + 16) of y, Kp * 16
 * values at wp + p * Kp * 16:
 *     wp[p * Kp * 16 + (k / 2) * 32 + j * 2 + k % 2] = Wb[16 p + j, k]    (0 in the padding)
 * so one k-pair of a panel is 64 bytes: 16 columns x 2 consecutive k, the 16 lanes one
 * vdpbf16ps of a broadcast activation pair consumes.
 */
#ifndef FASTATTN_BGEMM_KERNELS_H
#define FASTATTN_BGEMM_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "simd.h"

enum {
    BG_SCALAR = 0,        /* plain C, double arithmetic: the reference (and the baseline's) */
    BG_AVX2 = 1,          /* AVX2 + FMA, bfloat16 widened to float32 */
    BG_AVX512 = 2,        /* AVX-512F (+BW for the shared epilogue), widened likewise */
    BG_AVX512_BF16 = 3,   /* AVX-512 BF16: vdpbf16ps on zmm */
    BG_N_VARIANTS = 4
};

#define BG_PANEL 16       /* columns per panel */
#define BG_NGROUP 64      /* N is padded to this: a register block reads up to 64 columns */

/* a register block's sums: tile[r * tw + c] for rows r < mr (a row block of x, row stride kp
 * values), columns c < tw from the panel at w (panels ps values apart); ahead: prefetch the
 * panels (the block reads them from memory) */
typedef void (*bg_mk_fn)(const uint16_t *x, ptrdiff_t kp, int mr, const uint16_t *w,
                         ptrdiff_t ps, float *tile, int ahead);

typedef struct {
    int mr;               /* rows per register block (divides 12) */
    int tw;               /* columns per register block (16 or 64) */
    bg_mk_fn mk;
    /* the float epilogue of one row and one row of LayerNorm: the int8 GEMM's (qg_kernels) */
    void (*epi)(float *y, ptrdiff_t n, const float *bias, int act, const float *res);
    void (*ln)(const float *x, const float *res, ptrdiff_t n, const float *gamma,
               const float *beta, double eps, float *y);
} bg_kernels;

/* Fill the tables (after qg_setup); the kernels of a variant. */
void bg_setup(void);
const bg_kernels *bg_kernels_for(int variant);
/* whether a variant runs with these CPU features (simd.h's FA_CPU_* bits, as capped) */
int bg_variant_ok(int variant, unsigned features);
/* the variant for a kernel set of simd.h's ISA state: the best at or below it */
int bg_variant_for(int level, unsigned features);

/* One row: x (K floats) -> xb (kp bfloat16, 0 in [K, kp)), each rounded to nearest even,
 * zeros and subnormals to a zero of their sign, NaN to a quiet NaN; the same integer
 * arithmetic as fastattn/_quant.py's to_bfloat16. */
void bg_round_row(const float *x, ptrdiff_t K, uint16_t *xb, ptrdiff_t kp);

/* One work item: rows [0, m) of xb (row stride kp), columns [n0, n0 + nc) of y (n0 a multiple
 * of BG_NGROUP) over the whole K, then the epilogue; wp the packed weights. */
void bg_item(const bg_kernels *k, const uint16_t *xb, ptrdiff_t kp, ptrdiff_t m,
             const uint16_t *wp, ptrdiff_t n0, ptrdiff_t nc, const float *bias, int act,
             const float *res, ptrdiff_t res_rs, float *y, ptrdiff_t y_rs);

#endif
