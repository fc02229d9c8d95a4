/* qgemm_kernels.h -- the int8 linear layer's kernels (qgemm_tile.h), one table per variant.
 *
 *   y = act(dequant(xq @ Wq.T) + bias) + res,   then optionally LayerNorm(y) row by row
 *
 * Weights: int8, one float scale per output channel (row of W), symmetric in [-127, 127].
 * Activations: quantised per row at run time to u8 over the row's own range [lo, hi] (a zero
 * point: u = round((x - lo) * 255 / (hi - lo)), the unsigned operand of vpdpbusd), so a row
 * uses all 256 levels whatever its sign balance (GELU outputs, >= -0.17, get twice the levels
 * of a symmetric [-max, max] scale); the zero point's term lo * sum_k Wq[n, k] is added back
 * with comp[n] = sum_k Wq[n, k], precomputed with the weights. The sum over k is an exact
 * int32 (|u w| <= 255 * 127 a term, K <= 65536 terms: no overflow), so every variant and every
 * blocking gives the same integer; the float part (dequantisation, bias, activation, residual,
 * LayerNorm) runs the same lane-wise code at the same width (16 float lanes, nothing fused:
 * the extension is built with -ffp-contract=off) on every variant, so the output bits do not
 * depend on the CPU's instruction set, the thread count or the batch.
 *
 * Packed weight layout (the same for every variant; a saved model loads on any CPU):
 *   N padded to Npad (a multiple of QG_NGROUP), K to Kp (a multiple of 4); panel p holds columns
 *   [16 p, 16 p + 16) of y, Kp * 16 bytes at wp + p * Kp * 16:
 *     wp[p * Kp * 16 + (k / 4) * 64 + j * 4 + k % 4] = Wq[16 p + j, k]    (0 in the padding)
 *   so one k-quad of a panel is 64 bytes: 16 columns x 4 consecutive k, what one vpdpbusd of a
 *   broadcast activation quad consumes. sw (Npad,) float scales, comp (Npad,) int32 row sums: 0
 *   in the padding.
 */
#ifndef FASTATTN_QGEMM_KERNELS_H
#define FASTATTN_QGEMM_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "simd.h"

enum {
    QG_SCALAR = 0,       /* plain C: the reference (also the baseline ISA's choice) */
    QG_AVX2 = 1,         /* AVX2, vpmaddubsw on recentred activations (exact: no saturation) */
    QG_AVX2_VNNI = 2,    /* AVX2 + AVX-VNNI: vpdpbusd on ymm */
    QG_AVX512 = 3,       /* AVX-512BW, vpmaddubsw as QG_AVX2 on zmm */
    QG_AVX512_VNNI = 4,  /* AVX-512 VNNI: vpdpbusd on zmm */
    QG_NEON = 5,         /* AArch64 NEON: SMULL + SADALP on recentred activations */
    QG_DOTPROD = 6,      /* AArch64 FEAT_DotProd: SDOT on recentred activations */
    QG_I8MM = 7,         /* AArch64 FEAT_I8MM: USMMLA (row pairs), SUDOT (one row) */
    QG_N_VARIANTS = 8
};

#define QG_PANEL 16      /* columns per panel */
#define QG_NGROUP 64     /* N is padded to this: a register block reads up to 64 columns */
#define QG_MAX_K 65536   /* the int32 sums cannot overflow up to here */

typedef struct {
    int mr;              /* rows per register block (divides 12) */
    /* one row: x (K floats) -> xq (kp bytes, 0 in the padding), *sx its scale and *zx its zero
     * point (NaN when the row holds inf or NaN: the row's outputs are then NaN) */
    void (*quant)(const float *x, ptrdiff_t K, uint8_t *xq, ptrdiff_t kp, float *sx, float *zx);
    /* rows [0, m) of xq (row stride kp), columns [n0, n0 + nc) of y (n0 a multiple of 64) */
    void (*item)(const uint8_t *xq, ptrdiff_t kp, const float *sx, const float *zx, ptrdiff_t m,
                 const int8_t *wp, const float *sw, const int32_t *comp, ptrdiff_t n0,
                 ptrdiff_t nc, const float *bias, int act, const float *res, ptrdiff_t res_rs,
                 float *y, ptrdiff_t y_rs);
    /* one row of LayerNorm (gemm_tile.h's ln_row at 16 lanes) */
    void (*ln)(const float *x, const float *res, ptrdiff_t n, const float *gamma,
               const float *beta, double eps, float *y);
    /* y[j] = act(y[j] + bias[j]) + res[j], j < n (bias, res optional): the epilogue item runs
     * on a row's sums (qgemm_tile.h's qepilogue; the bfloat16 GEMM's too, bgemm_kernels.c) */
    void (*epi)(float *y, ptrdiff_t n, const float *bias, int act, const float *res);
    /* The portable float32 GEMM (gemm_tile.h's pack and item of the variant's instance, built
     * with -ffp-contract=off like this whole extension): every output is the sum over k in
     * order of rounded products, one chain per element, whatever the register block, so every
     * variant and architecture gives the same bits (the log-mel features' DFT and filterbank,
     * fastattn/audio/features.py). fnr: the packed panels' width (the layout fpack writes:
     * K blocks of fkc rows, N padded to fnr). */
    int fnr, fkc;
    void (*fpack)(const float *w, ptrdiff_t w_rs, ptrdiff_t N, ptrdiff_t K, float *wp);
    void (*fitem)(const float *x, ptrdiff_t x_rs, ptrdiff_t m, ptrdiff_t K, const float *wp,
                  ptrdiff_t npad, ptrdiff_t n0, ptrdiff_t nc, const float *bias, int act,
                  const float *res, ptrdiff_t res_rs, float *y, ptrdiff_t y_rs, ptrdiff_t pf_n0);
} qg_kernels;

void qg_setup(void);
const qg_kernels *qg_kernels_for(int variant);
/* whether a variant runs with these CPU features (simd.h's FA_CPU_* bits: the kernels pass
 * fa_isa_features(), the CPU's as detected in dispatch.c less the FASTATTN_ISA cap) and this
 * build */
int qg_variant_ok(int variant, unsigned features);
/* the variant for a kernel set of simd.h's ISA state: the best one at or below it that the
 * features allow */
int qg_variant_for(int level, unsigned features);

#endif
