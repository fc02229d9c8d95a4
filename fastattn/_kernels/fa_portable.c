/* fa_portable.c -- the portable attention: fa_tile.h instanced so that its bits do not depend on
 * the instruction set or the architecture (the int8 models' attention: with the int8 layers,
 * which are portable too, an int8 model gives the same bits on every x86-64 kernel set and on
 * AArch64; docs/int8.md).
 *
 * What makes the bits the same:
 *   - one shape everywhere: 16 float lanes (8 double), 4 rows x 1 vector a register block. The
 *     lane count fixes the order of every sum across lanes (the softmax's row sums, the
 *     horizontal steps); the tiling (key tiles, query blocks, key splits) is a rule of the
 *     problem's shape alone (fa_driver.c), the same for every kernel set;
 *   - nothing fused: this file (and fa_driver.c) is compiled with -ffp-contract=off (setup.py),
 *     so that neither an FMA target on x86 nor AArch64 (where GCC contracts by default) turns
 *     a * b + c into one rounding;
 *   - no libm: the float exp is simd.h's (one source), the double one fa_exp_det below.
 * The instances differ only in what the compiler may use to run the 16-lane vectors: SSE2 /
 * NEON (baseline), AVX2, AVX-512F. Cost against the native sets: the register block is
 * AVX-512's width in all (one zmm, two ymm, four xmm / q registers a vector), smaller than the
 * float kernels' (bench/results: the int8 models' A/B).
 * Tested bitwise against each other (tests/kernels/test_portable_attention.py) and, under
 * emulation, against AArch64 (ci/test_aarch64.sh). */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fa_kernels.h"

/* exp(x), x <= 0, in double: x = k ln2 + r (Cody-Waite: ln2 in two parts, k = round(x / ln2)),
 * exp(r) by its Taylor series to r^13 (|r| <= ln2 / 2: the truncation is below 2^-60 relative),
 * times 2^k by building the exponent (in two steps below 2^-1022). Only + - * and exact
 * conversions, in a fixed order: the same bits on every IEEE-754 machine. Accuracy: a few ulp
 * (it scales accumulators that are rounded to float afterwards). */
double fa_exp_det(double x)
{
    if (x != x) return x;
    if (x < -745.2) return 0.0;                     /* below the least subnormal: 0, and -inf */
    if (x > 0.0) x = 0.0;                           /* callers pass x <= 0 (rounding can give +0) */
    const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
    const double inv_ln2 = 1.44269504088896338700e+00;
    double kd = x * inv_ln2;
    kd = kd < 0 ? (double)(int64_t)(kd - 0.5) : (double)(int64_t)(kd + 0.5);
    const double r = (x - kd * ln2_hi) - kd * ln2_lo;
    /* Horner from the 13th power down */
    double p = 1.0 / 6227020800.0;
    p = p * r + 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    int k = (int)kd;                                /* in [-1075, 0] */
    double scale = 1.0;
    if (k < -1000) {                                /* two steps: 2^-1000, then the rest */
        uint64_t b = (uint64_t)(1023 - 1000) << 52;
        double s1;
        memcpy(&s1, &b, sizeof s1);
        p *= s1;
        k += 1000;
    }
    uint64_t bits = (uint64_t)(1023 + k) << 52;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}


#if FA_GNU_VECTORS
/* Each instance at its native width and register block, its sums across lanes at 16 float /
 * 8 double lanes (FA_LANES: fa_tile.h keeps 16 / VW vectors per sum and folds them as a
 * 16-lane butterfly): the bits of a 16-lane instance. p16 is that 16-lane instance itself, at
 * the baseline ISA: the scalar kernel set's portable attention and the reference the others are
 * tested against (tests/kernels/test_portable_attention.py). */
#if FA_ARM64
#define FA_PB_MR 6
#define FA_PB_NV 4
#else
#define FA_PB_MR 4
#define FA_PB_NV 2
#endif
/* ---- p16: 16 lanes (8 double) at the baseline ISA */
#define FA_NAME(x) x##_f32_p16
#define FA_IS_DOUBLE 0
#define FA_VW 16
#define FA_MR 4
#define FA_NV 1
#define FA_TARGET
#define FA_DEXP(x) fa_exp_det(x)
#if FA_ARM64
#define FA_ANY(m) FA_ANY64_NEON(m)
#endif
#include "fa_tile.h"

#define FA_NAME(x) x##_f64_p16
#define FA_IS_DOUBLE 1
#define FA_VW 8
#define FA_MR 4
#define FA_NV 1
#define FA_TARGET
#define FA_DEXP(x) fa_exp_det(x)
#if FA_ARM64
#define FA_ANY(m) FA_ANY64_NEON(m)
#endif
#include "fa_tile.h"

/* ---- baseline: SSE2 (x86-64) or NEON (AArch64) at 4 float / 2 double lanes */
#define FA_NAME(x) x##_f32_pbase
#define FA_IS_DOUBLE 0
#define FA_VW 4
#define FA_LANES 16
#define FA_MR FA_PB_MR
#define FA_NV FA_PB_NV
#define FA_TARGET
#define FA_DEXP(x) fa_exp_det(x)
#include "fa_tile.h"

#define FA_NAME(x) x##_f64_pbase
#define FA_IS_DOUBLE 1
#define FA_VW 2
#define FA_LANES 8
#define FA_MR FA_PB_MR
#define FA_NV FA_PB_NV
#define FA_TARGET
#define FA_DEXP(x) fa_exp_det(x)
#include "fa_tile.h"

#if FA_X86
/* ---- AVX2 (no FMA: nothing is fused here anyway) at 8 / 4 lanes, AVX2's block */
#define FA_NAME(x) x##_f32_pavx2
#define FA_IS_DOUBLE 0
#define FA_VW 8
#define FA_LANES 16
#define FA_MR 6
#define FA_NV 2
#define FA_VMAX _mm256_max_ps
#define FA_TARGET FA_TARGET_AVX2_NOFMA
#define FA_DEXP(x) fa_exp_det(x)
#include "fa_tile.h"

#define FA_NAME(x) x##_f64_pavx2
#define FA_IS_DOUBLE 1
#define FA_VW 4
#define FA_LANES 8
#define FA_MR 6
#define FA_NV 2
#define FA_VMAX _mm256_max_pd
#define FA_TARGET FA_TARGET_AVX2_NOFMA
#define FA_DEXP(x) fa_exp_det(x)
#include "fa_tile.h"

/* ---- AVX-512F at 16 / 8 lanes, AVX-512's block */
#define FA_NAME(x) x##_f32_pavx512
#define FA_IS_DOUBLE 0
#define FA_VW 16
#define FA_MR 6
#define FA_NV 4
#define FA_VMAX _mm512_max_ps
#define FA_TARGET FA_TARGET_AVX512_NOFMA
#define FA_DEXP(x) fa_exp_det(x)
#include "fa_tile.h"

#define FA_NAME(x) x##_f64_pavx512
#define FA_IS_DOUBLE 1
#define FA_VW 8
#define FA_MR 6
#define FA_NV 4
#define FA_VMAX _mm512_max_pd
#define FA_TARGET FA_TARGET_AVX512_NOFMA
#define FA_DEXP(x) fa_exp_det(x)
#include "fa_tile.h"
#endif

FA_TABLE(fa_p16, p16)
FA_TABLE(fa_pbase, pbase)
#if FA_X86
FA_TABLE(fa_pavx2, pavx2)
FA_TABLE(fa_pavx512, pavx512)
#endif

const fa_kernels *fa_portable_kernels_for(int level)
{
#if FA_X86
    if (level == FA_ISA_AVX512) return &fa_pavx512;
    if (level == FA_ISA_AVX2 || level == FA_ISA_AVX2_WIDE) return &fa_pavx2;
#endif
    return level == FA_ISA_SCALAR ? &fa_p16 : &fa_pbase;
}
#else
/* no GNU vectors (MSVC): the scalar kernels, portable among such builds only */
const fa_kernels *fa_portable_kernels_for(int level)
{
    (void)level;
    return fa_kernels_for(FA_ISA_SCALAR);
}
#endif
