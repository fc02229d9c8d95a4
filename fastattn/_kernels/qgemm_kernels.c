/* qgemm_kernels.c -- the int8 linear layer's micro-kernels, one per variant, each instantiating
 * qgemm_tile.h (the work item) over gemm_tile.h's epilogue and LayerNorm rows at 16 float lanes
 * (the same float code on every variant: qgemm_kernels.h says why), and the row quantisation.
 *
 * Register blocks (rows x columns) and the integer step of each variant, per k-quad:
 *   scalar        6 x 64   plain C, the reference
 *   avx2          4 x 16   vpmaddubsw on recentred activations (s = u - 128, |s| times the
 *                          weight with s's sign: exact, see qg_imk_avx2), vpmaddwd against
 *                          ones into int32 lanes: 32 products in 4 instructions
 *   avx2-vnni     6 x 16   two vpdpbusd (ymm) a row
 *   avx512        6 x 64   avx2's scheme on zmm, the sign applied as a mask (no vpsignb)
 *   avx512-vnni   6 x 64   four vpdpbusd (zmm) a row, 24 accumulators
 *   neon, dotprod, i8mm (AArch64)   3 x 16, 4 x 16, 4 x 16: see their section
 * Rows are quantised by qg_quant_scalar (compiled once, for the baseline ISA) on the scalar
 * variant and by qg_quant_x86 (AVX2, eight lanes, the same arithmetic) on every x86 variant.
 * The first row block of an item prefetches its panels ahead (it brings them from memory).
 */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gemm_kernels.h"   /* the activation codes; simd.h */
#include "qgemm_kernels.h"

#define QG_PF 1024          /* bytes ahead in each panel stream */

/* load 4 bytes (a k-quad of a row) as an int */
static inline int32_t qg_quad(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ------------------------------------------------------------------ row quantisation
 * x (K floats) -> xq (kp bytes) over the row's own range widened to hold zero,
 * [a, b] = [min(lo, 0), max(hi, 0)], with an integer zero point, so that 0 is one of the 256
 * levels (exactly: a sparse row, a ReLU or GELU output, loses nothing on its zeros):
 *   inv = 255 / (b - a), z = round(-a * inv) in [0, 255],
 *   u = min(max(round(x * inv) + z, 0), 255), ties to even (the 1.5 * 2^23 shift: exact for
 *   |v| < 2^22), 0 in [K, kp); *sx = (b - a) / 255, *zx = -(z * sx)
 * so x ~ sx u + zx = sx (u - z). A constant row: u = 0, sx = 0, zx = the constant (exact). A
 * row holding inf or NaN: sx = zx = NaN (its outputs are NaN). Written once, in the three
 * helpers below: qg_quant_scalar runs them over the whole row; qg_quant_x86 finds the range
 * and rounds eight lanes at a time with the same operations and leaves the rest to them. */

/* elements [k, K) of x into the range so far (*lo, *hi; *bad: an inf or NaN seen). A min /
 * max is exact in any order, and inf and NaN are flagged apart. */
static FA_ALWAYS_INLINE void qg_range(const float *x, ptrdiff_t k, ptrdiff_t K, float *lo,
                                      float *hi, int *bad)
{
    float l = *lo, h = *hi;
    int b = *bad;
    for (; k < K; k++) {
        float v = x[k];
        b |= !(fabsf(v) <= FLT_MAX);                 /* inf or NaN */
        l = v < l ? v : l;
        h = v > h ? v : h;
    }
    *lo = l;
    *hi = h;
    *bad = b;
}

/* From the row's range: xq zeroed, the scale *sx and zero point *zx. 0: the row is done (inf or
 * NaN, or constant); else 1, with the rounding's *inv and *z. */
static FA_ALWAYS_INLINE int qg_scale(float lo, float hi, int bad, uint8_t *xq, ptrdiff_t kp,
                                     float *inv, float *z, float *sx, float *zx)
{
    lo += 0.0f;                                      /* -0 -> +0: the same bits whatever the */
    hi += 0.0f;                                      /* order the range was found in */
    memset(xq, 0, (size_t)kp);
    if (bad || !(hi - lo <= FLT_MAX)) {              /* (hi - lo overflowing: NaN rows too) */
        *sx = *zx = NAN;
        return 0;
    }
    if (hi == lo) {
        *sx = 0.0f;
        *zx = lo;
        return 0;
    }
    const float a = lo < 0.0f ? lo : 0.0f, b = hi > 0.0f ? hi : 0.0f;
    *inv = 255.0f / (b - a);
    *z = (-a * *inv + 12582912.0f) - 12582912.0f;
    *sx = (b - a) / 255.0f;
    *zx = -(*z * *sx);
    return 1;
}

/* elements [k, K) of x rounded into xq */
static FA_ALWAYS_INLINE void qg_round(const float *x, ptrdiff_t k, ptrdiff_t K, float inv, float z,
                                      uint8_t *xq)
{
    for (; k < K; k++) {
        float v = x[k] * inv;
        v = ((v + 12582912.0f) - 12582912.0f) + z;
        v = v > 255.0f ? 255.0f : (v < 0.0f ? 0.0f : v);
        xq[k] = (uint8_t)(int)v;
    }
}

static void qg_quant_scalar(const float *x, ptrdiff_t K, uint8_t *xq, ptrdiff_t kp, float *sx,
                            float *zx)
{
    float lo = K ? x[0] : 0.0f, hi = lo, inv, z;
    int bad = 0;
    qg_range(x, 0, K, &lo, &hi, &bad);
    if (qg_scale(lo, hi, bad, xq, kp, &inv, &z, sx, zx))
        qg_round(x, 0, K, inv, z, xq);
}

/* the float lanes of every variant's epilogue: GNU vectors of 16 floats where the compiler has
 * them (else plain C, the same on every variant of that build) */
#if FA_GNU_VECTORS
#define QG_VW 16
#else
#define QG_VW 1
#endif


/* ------------------------------------------------------------------ scalar */
#define FA_NAME(x) qg_##x##_scalar
#define FA_IS_DOUBLE 0
#define FA_VW QG_VW
#define GM_MR 6
#define GM_NV 4
#define GM_KC 256
#define FA_TARGET
#if FA_ARM64
#define FA_ANY(m) FA_ANY64_NEON(m)
#endif
#define GM_KEEP_INSTANCE
#include "gemm_tile.h"

static void qg_imk_scalar(const uint8_t *x, ptrdiff_t kp, int mr, const int8_t *w, ptrdiff_t ps,
                         int32_t *tile)
{
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < 64; c++) {
            const int8_t *panel = w + (c / 16) * ps + (c % 16) * 4;
            int32_t s = 0;
            for (ptrdiff_t k = 0; k < kp; k++)
                s += (int32_t)x[r * kp + k] * (int32_t)panel[(k / 4) * 64 + k % 4];
            tile[r * 64 + c] = s;
        }
}
#define QG_MR 6
#define QG_NP 4
#define QG_MK(x, kp, mr, w, ps, tile, ahead) ((void)(ahead), qg_imk_scalar(x, kp, mr, w, ps, tile))
#include "qgemm_tile.h"

#if FA_X86
/* "is any lane true" for 16-lane masks (VANY): one test instruction rather than a lane loop;
 * it only decides whether a tail is computed, never a lane's value */
__attribute__((target("avx2"))) static inline int qg_any16_avx2(const void *m)
{
    __m256i a, b;
    memcpy(&a, m, 32);
    memcpy(&b, (const char *)m + 32, 32);
    return !_mm256_testz_si256(_mm256_or_si256(a, b), _mm256_or_si256(a, b));
}
__attribute__((target("avx512f"))) static inline int qg_any16_avx512(const void *m)
{
    __m512i a;
    memcpy(&a, m, 64);
    return _mm512_test_epi32_mask(a, a) != 0;
}
#define QG_ANY_AVX2(m) ({ __typeof__(m) qg_m_ = (m); qg_any16_avx2(&qg_m_); })
#define QG_ANY_AVX512(m) ({ __typeof__(m) qg_m_ = (m); qg_any16_avx512(&qg_m_); })
#define QG_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define QG_TARGET_AVX2_VNNI __attribute__((target("avx2,fma,avxvnni")))
#define QG_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx2,fma")))
#define QG_TARGET_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni,avx2,fma")))

/* ------------------------------------------------------------------ row quantisation (x86)
 * qg_quant_scalar eight lanes at a time, for every x86 variant: the range as lane-wise min /
 * max (inf and NaN flagged apart), each element through the same roundings (multiply, the
 * 1.5 * 2^23 shift, the zero point's add) and clamp, the rest by the scalar helpers, so the
 * bytes, scale and zero point are the scalar quantiser's bit for bit. */
QG_TARGET_AVX2 static void qg_quant_x86(const float *x, ptrdiff_t K, uint8_t *xq, ptrdiff_t kp,
                                        float *sx, float *zx)
{
    float lo = K ? x[0] : 0.0f, hi = lo, inv, z;
    int bad = 0;
    ptrdiff_t k = 0;
    if (K >= 8) {
        const __m256 fmax = _mm256_set1_ps(FLT_MAX);
        const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        __m256 vlo = _mm256_loadu_ps(x), vhi = vlo, vbad = _mm256_setzero_ps();
        for (; k + 8 <= K; k += 8) {
            __m256 v = _mm256_loadu_ps(x + k);
            /* !(|v| <= FLT_MAX): inf or NaN */
            vbad = _mm256_or_ps(vbad, _mm256_cmp_ps(_mm256_and_ps(v, absmask), fmax, _CMP_NLE_UQ));
            vlo = _mm256_min_ps(vlo, v);
            vhi = _mm256_max_ps(vhi, v);
        }
        bad = _mm256_movemask_ps(vbad) != 0;
        float l8[8], h8[8];
        _mm256_storeu_ps(l8, vlo);
        _mm256_storeu_ps(h8, vhi);
        for (int i = 0; i < 8; i++) {
            lo = l8[i] < lo ? l8[i] : lo;
            hi = h8[i] > hi ? h8[i] : hi;
        }
    }
    qg_range(x, k, K, &lo, &hi, &bad);
    if (!qg_scale(lo, hi, bad, xq, kp, &inv, &z, sx, zx))
        return;
    const __m256 vz = _mm256_set1_ps(z), vi = _mm256_set1_ps(inv);
    const __m256 shift = _mm256_set1_ps(12582912.0f), top = _mm256_set1_ps(255.0f);
    const __m256 zero = _mm256_setzero_ps();
    k = 0;
    for (; k + 16 <= K; k += 16) {
        __m256i q[2];
        for (int h = 0; h < 2; h++) {
            __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + k + 8 * h), vi);
            v = _mm256_add_ps(_mm256_sub_ps(_mm256_add_ps(v, shift), shift), vz);
            v = _mm256_min_ps(_mm256_max_ps(v, zero), top);
            q[h] = _mm256_cvttps_epi32(v);
        }
        /* 16 int32 in [0, 255] -> 16 bytes in order */
        __m256i w16 = _mm256_permute4x64_epi64(_mm256_packus_epi32(q[0], q[1]), 0xD8);
        __m128i b16 = _mm_packus_epi16(_mm256_castsi256_si128(w16),
                                       _mm256_extracti128_si256(w16, 1));
        _mm_storeu_si128((__m128i *)(xq + k), b16);
    }
    qg_round(x, k, K, inv, z, xq);
}

/* ------------------------------------------------------------------ AVX2 (vpmaddubsw)
 * On AVX2 a 16-float GNU vector is two registers and GCC expands much of the epilogue's lane
 * code (the GELU's erf, selects, conversions) piecewise, element by element: the exact-GELU
 * epilogue took 3x the GEMM. So the AVX2 variants run the elementwise epilogue (dequantised
 * tile + bias, activation, residual: lane-wise arithmetic, the same bits at any width) at the
 * native 8 lanes, and take LayerNorm (whose sums' order is the lane count's) from a 16-lane
 * instance, as every other variant computes it. */
#if FA_GNU_VECTORS
#define FA_NAME(x) qg_##x##_avx2ln16
#define FA_IS_DOUBLE 0
#define FA_VW QG_VW
#define GM_MR 6
#define GM_NV 4
#define GM_KC 256
#define FA_TARGET QG_TARGET_AVX2
#define FA_ANY(m) QG_ANY_AVX2(m)
#include "gemm_tile.h"
/* ln_row at 16 lanes (gemm_tile.h) written for two ymm of floats, four of doubles: the same
 * per-lane double sums (lanes 0-7 then 8-15 added in order), the same mean, variance and
 * normalisation, so the same bits. GCC's code for the 16-lane GNU vectors took ~1.5 ns an
 * element on AVX2 (0.4 on AVX-512), which made LayerNorm a tenth of an int8 encoder's time. */
/* the 16 double lanes (a0: lanes 0-3 ... a3: 12-15) added in order from 0.0 (0.0 when n < 16:
 * no vector step ran) */
QG_TARGET_AVX2 static inline double qg_lanes16(__m256d a0, __m256d a1, __m256d a2, __m256d a3,
                                               ptrdiff_t nv)
{
    double lanes[16], s = 0.0;
    if (!nv)
        return s;
    _mm256_storeu_pd(lanes, a0);
    _mm256_storeu_pd(lanes + 4, a1);
    _mm256_storeu_pd(lanes + 8, a2);
    _mm256_storeu_pd(lanes + 12, a3);
    for (int t = 0; t < 16; t++) s += lanes[t];
    return s;
}

QG_TARGET_AVX2 static void qg_ln16_avx2(const float *x, const float *res, ptrdiff_t n,
                                        const float *gamma, const float *beta, double eps,
                                        float *y)
{
    const ptrdiff_t nv = n / 16 * 16;
    double sum, ss;
    ptrdiff_t j;
#define QG_LN_F8(p) (res ? _mm256_add_ps(_mm256_loadu_ps(x + (p)), _mm256_loadu_ps(res + (p))) \
                         : _mm256_loadu_ps(x + (p)))
#define QG_LO(v) _mm256_cvtps_pd(_mm256_castps256_ps128(v))
#define QG_HI(v) _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1))
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    for (j = 0; j < nv; j += 16) {
        __m256 u = QG_LN_F8(j), v = QG_LN_F8(j + 8);
        a0 = _mm256_add_pd(a0, QG_LO(u));
        a1 = _mm256_add_pd(a1, QG_HI(u));
        a2 = _mm256_add_pd(a2, QG_LO(v));
        a3 = _mm256_add_pd(a3, QG_HI(v));
    }
    sum = qg_lanes16(a0, a1, a2, a3, nv);
    for (j = nv; j < n; j++) sum += (double)(res ? (float)(x[j] + res[j]) : x[j]);
    const double mean = sum / (double)n;
    const __m256d m = _mm256_set1_pd(mean);
    a0 = a1 = a2 = a3 = _mm256_setzero_pd();
    for (j = 0; j < nv; j += 16) {
        __m256 u = QG_LN_F8(j), v = QG_LN_F8(j + 8);
        __m256d d0 = _mm256_sub_pd(QG_LO(u), m), d1 = _mm256_sub_pd(QG_HI(u), m);
        __m256d d2 = _mm256_sub_pd(QG_LO(v), m), d3 = _mm256_sub_pd(QG_HI(v), m);
        a0 = _mm256_add_pd(a0, _mm256_mul_pd(d0, d0));
        a1 = _mm256_add_pd(a1, _mm256_mul_pd(d1, d1));
        a2 = _mm256_add_pd(a2, _mm256_mul_pd(d2, d2));
        a3 = _mm256_add_pd(a3, _mm256_mul_pd(d3, d3));
    }
    ss = qg_lanes16(a0, a1, a2, a3, nv);
    for (j = nv; j < n; j++) {
        double d = (double)(res ? (float)(x[j] + res[j]) : x[j]) - mean;
        ss += d * d;
    }
    if ((!isfinite(ss) || !isfinite(sum)) &&
        qg_ln_row_scaled_avx2ln16(x, res, n, gamma, beta, eps, y))
        return;
    const double rstd = 1.0 / sqrt(ss / (double)n + eps);
    const __m256d r = _mm256_set1_pd(rstd);
    for (j = 0; j < nv; j += 8) {
        __m256 u = QG_LN_F8(j);
        __m256d d0 = _mm256_mul_pd(_mm256_sub_pd(QG_LO(u), m), r);
        __m256d d1 = _mm256_mul_pd(_mm256_sub_pd(QG_HI(u), m), r);
        if (gamma) {
            __m256 g = _mm256_loadu_ps(gamma + j);
            d0 = _mm256_mul_pd(d0, QG_LO(g));
            d1 = _mm256_mul_pd(d1, QG_HI(g));
        }
        if (beta) {
            __m256 b = _mm256_loadu_ps(beta + j);
            d0 = _mm256_add_pd(d0, QG_LO(b));
            d1 = _mm256_add_pd(d1, QG_HI(b));
        }
        _mm256_storeu_ps(y + j, _mm256_set_m128(_mm256_cvtpd_ps(d1), _mm256_cvtpd_ps(d0)));
    }
#undef QG_LN_F8
#undef QG_LO
#undef QG_HI
    for (j = nv; j < n; j++) {
        double d = ((double)(res ? (float)(x[j] + res[j]) : x[j]) - mean) * rstd;
        if (gamma) d *= (double)gamma[j];
        if (beta) d += (double)beta[j];
        y[j] = (float)d;
    }
}
#define QG_LN_AVX2 qg_ln16_avx2
#define QG_AVX2_VW 8
#else
#define QG_LN_AVX2 qg_ln_row_avx2
#define QG_AVX2_VW QG_VW
#endif
#define FA_NAME(x) qg_##x##_avx2
#define FA_IS_DOUBLE 0
#define FA_VW QG_AVX2_VW
#define GM_MR 6
#define GM_NV 2
#define GM_KC 256
#define FA_TARGET QG_TARGET_AVX2
#if FA_GNU_VECTORS
#define FA_ANY(m) _mm256_movemask_ps((__m256)(m))
#endif
#define GM_KEEP_INSTANCE
#include "gemm_tile.h"

/* vpmaddubsw multiplies unsigned by signed bytes and adds pairs into 16 bits with saturation:
 * u8 activations (<= 255) times int8 weights (|w| <= 127) can reach 2 * 255 * 127 > 32767. The
 * activations are recentred instead, s = u - 128 in [-128, 127], and the sign moved onto the
 * weight: s w = |s| (sign(s) w), with |s| <= 128 unsigned and |sign(s) w| <= 127, so a pair is
 * at most 2 * 128 * 127 = 32512: exact. vpmaddwd against ones sums the pairs into int32 lanes
 * (one column's k-quad each); the tile holds sum_k (u - 128) w and the item adds
 * 128 * comp[n] = 128 * sum_k w back (QG_TBIAS), which gives the same integer as every other
 * variant: the quantised values are unchanged. Per 32 products: vpsignb, vpmaddubsw, vpmaddwd,
 * vpaddd, against vpmovsxbw's share, vpmaddwd and vpaddd per 16 before.
 * The block's rows are prepared (s and |s| per byte) so that the inner loop broadcasts both
 * straight from memory: once per row block for all the item's column blocks (qg_prep_recentre),
 * or a 256-byte chunk at a time on the stack where the item has no prepared copy. */
#define QG_KC 256

/* k-chunk [0, kc) of mr rows of x (row stride kp) recentred: xs[r * ls + k] = u - 128 (as a
 * byte), xa[...] = |u - 128| (128 for u = 0, as an unsigned byte); for the avx2 and avx512
 * kernels */
QG_TARGET_AVX2 static FA_ALWAYS_INLINE void
qg_recentre(const uint8_t *x, ptrdiff_t kp, const int mr, ptrdiff_t kc, uint8_t *xs, uint8_t *xa,
            ptrdiff_t ls)
{
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    for (int r = 0; r < mr; r++) {
        const uint8_t *xr = x + r * kp;
        ptrdiff_t k = 0;
        for (; k + 32 <= kc; k += 32) {
            __m256i v = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(xr + k)), bias);
            _mm256_storeu_si256((__m256i *)(xs + r * ls + k), v);
            _mm256_storeu_si256((__m256i *)(xa + r * ls + k), _mm256_abs_epi8(v));
        }
        for (; k < kc; k++) {
            int v = (int)xr[k] - 128;
            xs[r * ls + k] = (uint8_t)(int8_t)v;
            xa[r * ls + k] = (uint8_t)(v < 0 ? -v : v);
        }
    }
}

/* A row block's whole rows recentred once, for every column block the item computes on them
 * (qgemm_tile.h's QG_PREP): prep holds xs (QG_PREP_ROWS rows of kp bytes) then xa. Recentring
 * a 256-byte chunk at every register block took ~7% of the avx2 item's time (N / 16 column
 * blocks read the same rows). */
#define QG_PREP_ROWS 6
#define QG_PREP_BYTES(kp) ((size_t)(2 * QG_PREP_ROWS) * (size_t)(kp))
QG_TARGET_AVX2 static void qg_prep_recentre(const uint8_t *x, ptrdiff_t kp, int mr, uint8_t *prep)
{
    qg_recentre(x, kp, mr, kp, prep, prep + QG_PREP_ROWS * kp, kp);
}

/* k-quads [0, kc) of mr recentred rows (xs, xa, row stride ls) against the panel q (from its
 * quad 0), added into acc */
QG_TARGET_AVX2 static FA_ALWAYS_INLINE void
qg_imk_avx2_run(const uint8_t *xs, const uint8_t *xa, ptrdiff_t ls, ptrdiff_t kc, const int mr,
                const int8_t *q, int ahead, __m256i acc[6][2])
{
    const __m256i ones = _mm256_set1_epi16(1);
    for (ptrdiff_t k = 0; k < kc; k += 4) {
        const int8_t *qq = q + k * 16;
        if (ahead) FA_PREFETCH(qq + QG_PF, 3);
        __m256i w0 = _mm256_loadu_si256((const __m256i *)qq);
        __m256i w1 = _mm256_loadu_si256((const __m256i *)(qq + 32));
        for (int r = 0; r < mr; r++) {
            int32_t s32, a32;
            memcpy(&s32, xs + r * ls + k, 4);
            memcpy(&a32, xa + r * ls + k, 4);
            __m256i sv = _mm256_set1_epi32(s32), av = _mm256_set1_epi32(a32);
            acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(
                _mm256_maddubs_epi16(av, _mm256_sign_epi8(w0, sv)), ones));
            acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(
                _mm256_maddubs_epi16(av, _mm256_sign_epi8(w1, sv)), ones));
        }
    }
}

QG_TARGET_AVX2 static FA_ALWAYS_INLINE void
qg_imk_avx2_store(const int mr, __m256i acc[6][2], int32_t *tile)
{
    for (int r = 0; r < mr; r++) {
        _mm256_storeu_si256((__m256i *)(tile + r * 16), acc[r][0]);
        _mm256_storeu_si256((__m256i *)(tile + r * 16 + 8), acc[r][1]);
    }
}

/* the rows as bytes, recentred a chunk at a time on the stack */
QG_TARGET_AVX2 static FA_ALWAYS_INLINE void
qg_imk_avx2(const uint8_t *x, ptrdiff_t kp, const int mr, const int8_t *w, ptrdiff_t ps,
           int32_t *tile, int ahead)
{
    (void)ps;
    uint8_t xs[6 * QG_KC] __attribute__((aligned(32)));   /* s = u - 128 (as bytes) */
    uint8_t xa[6 * QG_KC] __attribute__((aligned(32)));   /* |s| (128 for s = -128) */
    __m256i acc[6][2];
    for (int r = 0; r < mr; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (ptrdiff_t k0 = 0; k0 < kp; k0 += QG_KC) {
        const ptrdiff_t kc = kp - k0 < QG_KC ? kp - k0 : QG_KC;
        qg_recentre(x + k0, kp, mr, kc, xs, xa, QG_KC);
        qg_imk_avx2_run(xs, xa, QG_KC, kc, mr, w + k0 * 16, ahead, acc);
    }
    qg_imk_avx2_store(mr, acc, tile);
}

/* the rows prepared by qg_prep_recentre (the same integers) */
QG_TARGET_AVX2 static FA_ALWAYS_INLINE void
qg_imkp_avx2(const uint8_t *prep, ptrdiff_t kp, const int mr, const int8_t *w, ptrdiff_t ps,
            int32_t *tile, int ahead)
{
    (void)ps;
    __m256i acc[6][2];
    for (int r = 0; r < mr; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    qg_imk_avx2_run(prep, prep + QG_PREP_ROWS * kp, kp, kp, mr, w, ahead, acc);
    qg_imk_avx2_store(mr, acc, tile);
}
#undef QG_KC
#define QG_MR 4
#define QG_NP 1
#define QG_TBIAS 128
#define QG_MK qg_imk_avx2
#define QG_MKP qg_imkp_avx2
#define QG_PREP qg_prep_recentre
#include "qgemm_tile.h"

/* ------------------------------------------------------------------ AVX2 + AVX-VNNI */
#define FA_NAME(x) qg_##x##_avx2vnni
#define FA_IS_DOUBLE 0
#define FA_VW QG_AVX2_VW
#define GM_MR 6
#define GM_NV 2
#define GM_KC 256
#define FA_TARGET QG_TARGET_AVX2_VNNI
#if FA_GNU_VECTORS
#define FA_ANY(m) _mm256_movemask_ps((__m256)(m))
#endif
#define GM_KEEP_INSTANCE
#include "gemm_tile.h"

QG_TARGET_AVX2_VNNI static FA_ALWAYS_INLINE void
qg_imk_avx2vnni(const uint8_t *x, ptrdiff_t kp, const int mr, const int8_t *w, ptrdiff_t ps,
               int32_t *tile, int ahead)
{
    (void)ps;
    __m256i acc[6][2];
    for (int r = 0; r < mr; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (ptrdiff_t k = 0; k < kp; k += 4) {
        const int8_t *q = w + k * 16;
        if (ahead) FA_PREFETCH(q + QG_PF, 3);
        __m256i w0 = _mm256_loadu_si256((const __m256i *)q);
        __m256i w1 = _mm256_loadu_si256((const __m256i *)(q + 32));
        for (int r = 0; r < mr; r++) {
            __m256i a = _mm256_set1_epi32(qg_quad(x + r * kp + k));
            acc[r][0] = _mm256_dpbusd_avx_epi32(acc[r][0], a, w0);
            acc[r][1] = _mm256_dpbusd_avx_epi32(acc[r][1], a, w1);
        }
    }
    qg_imk_avx2_store(mr, acc, tile);
}
#define QG_MR 6
#define QG_NP 1
#define QG_MK qg_imk_avx2vnni
#include "qgemm_tile.h"

/* ------------------------------------------------------------------ AVX-512BW (vpmaddwd) */
#define FA_NAME(x) qg_##x##_avx512
#define FA_IS_DOUBLE 0
#define FA_VW QG_VW
#define GM_MR 6
#define GM_NV 4
#define GM_KC 256
#define FA_TARGET QG_TARGET_AVX512
#if FA_GNU_VECTORS
#define FA_ANY(m) QG_ANY_AVX512(m)
#endif
#define GM_KEEP_INSTANCE
#include "gemm_tile.h"

/* The avx2 variant's scheme on zmm (qg_imk_avx2 says why it is exact). AVX-512 has no vpsignb:
 * the sign of s comes as a mask (vpmovb2m) and the weights are negated under it (0 - w: w is
 * never -128, so the negation is exact). */
#define QG_KC 256
#define QG_NPANEL512 4

/* k-quads [k0, k0 + kc) of mr recentred rows (xs, xa from quad k0, row stride ls) against the
 * QG_NPANEL512 panels from w (ps bytes apart), added into acc */
QG_TARGET_AVX512 static FA_ALWAYS_INLINE void
qg_imk_avx512_run(const uint8_t *xs, const uint8_t *xa, ptrdiff_t ls, ptrdiff_t k0, ptrdiff_t kc,
                  const int mr, const int8_t *w, ptrdiff_t ps, int ahead,
                  __m512i acc[6][QG_NPANEL512])
{
    const __m512i ones = _mm512_set1_epi16(1), zero = _mm512_setzero_si512();
    for (ptrdiff_t k = 0; k < kc; k += 4) {
        __m512i wv[QG_NPANEL512];
        for (int p = 0; p < QG_NPANEL512; p++) {
            const int8_t *q = w + p * ps + (k0 + k) * 16;
            if (ahead) FA_PREFETCH(q + QG_PF, 3);
            wv[p] = _mm512_loadu_si512((const void *)q);
        }
        for (int r = 0; r < mr; r++) {
            int32_t s32, a32;
            memcpy(&s32, xs + r * ls + k, 4);
            memcpy(&a32, xa + r * ls + k, 4);
            const __mmask64 neg = _mm512_movepi8_mask(_mm512_set1_epi32(s32));
            const __m512i av = _mm512_set1_epi32(a32);
            for (int p = 0; p < QG_NPANEL512; p++)
                acc[r][p] = _mm512_add_epi32(acc[r][p], _mm512_madd_epi16(
                    _mm512_maddubs_epi16(av, _mm512_mask_sub_epi8(wv[p], neg, zero, wv[p])),
                    ones));
        }
    }
}

QG_TARGET_AVX512 static FA_ALWAYS_INLINE void
qg_imk_avx512_store(const int mr, __m512i acc[6][QG_NPANEL512], int32_t *tile)
{
    for (int r = 0; r < mr; r++)
        for (int p = 0; p < QG_NPANEL512; p++)
            _mm512_storeu_si512((void *)(tile + r * 16 * QG_NPANEL512 + p * 16), acc[r][p]);
}

QG_TARGET_AVX512 static FA_ALWAYS_INLINE void
qg_imk_avx512(const uint8_t *x, ptrdiff_t kp, const int mr, const int8_t *w, ptrdiff_t ps,
             int32_t *tile, int ahead)
{
    uint8_t xs[6 * QG_KC] __attribute__((aligned(64)));   /* s = u - 128 (as bytes) */
    uint8_t xa[6 * QG_KC] __attribute__((aligned(64)));   /* |s| */
    __m512i acc[6][QG_NPANEL512];
    for (int r = 0; r < mr; r++)
        for (int p = 0; p < QG_NPANEL512; p++) acc[r][p] = _mm512_setzero_si512();
    for (ptrdiff_t k0 = 0; k0 < kp; k0 += QG_KC) {
        const ptrdiff_t kc = kp - k0 < QG_KC ? kp - k0 : QG_KC;
        qg_recentre(x + k0, kp, mr, kc, xs, xa, QG_KC);
        qg_imk_avx512_run(xs, xa, QG_KC, k0, kc, mr, w, ps, ahead, acc);
    }
    qg_imk_avx512_store(mr, acc, tile);
}

/* the rows prepared by qg_prep_recentre (the same integers) */
QG_TARGET_AVX512 static FA_ALWAYS_INLINE void
qg_imkp_avx512(const uint8_t *prep, ptrdiff_t kp, const int mr, const int8_t *w, ptrdiff_t ps,
              int32_t *tile, int ahead)
{
    __m512i acc[6][QG_NPANEL512];
    for (int r = 0; r < mr; r++)
        for (int p = 0; p < QG_NPANEL512; p++) acc[r][p] = _mm512_setzero_si512();
    qg_imk_avx512_run(prep, prep + QG_PREP_ROWS * kp, kp, 0, kp, mr, w, ps, ahead, acc);
    qg_imk_avx512_store(mr, acc, tile);
}
#undef QG_KC
#define QG_MR 6
#define QG_NP QG_NPANEL512
#define QG_TBIAS 128
#define QG_MK qg_imk_avx512
#define QG_MKP qg_imkp_avx512
#define QG_PREP qg_prep_recentre
#include "qgemm_tile.h"

/* ------------------------------------------------------------------ AVX-512 VNNI */
#define FA_NAME(x) qg_##x##_avx512vnni
#define FA_IS_DOUBLE 0
#define FA_VW QG_VW
#define GM_MR 6
#define GM_NV 4
#define GM_KC 256
#define FA_TARGET QG_TARGET_AVX512_VNNI
#if FA_GNU_VECTORS
#define FA_ANY(m) QG_ANY_AVX512(m)
#endif
#define GM_KEEP_INSTANCE
#include "gemm_tile.h"

QG_TARGET_AVX512_VNNI static FA_ALWAYS_INLINE void
qg_imk_avx512vnni(const uint8_t *x, ptrdiff_t kp, const int mr, const int8_t *w, ptrdiff_t ps,
                 int32_t *tile, int ahead)
{
    __m512i acc[6][QG_NPANEL512];
    for (int r = 0; r < mr; r++)
        for (int p = 0; p < QG_NPANEL512; p++) acc[r][p] = _mm512_setzero_si512();
    ptrdiff_t k = 0;
#define QG_STEP(k)                                                                         \
    do {                                                                                   \
        __m512i wv[4];                                                                     \
        for (int p = 0; p < 4; p++) wv[p] = _mm512_loadu_si512((const void *)(w + p * ps + (k) * 16)); \
        for (int r = 0; r < mr; r++) {                                                     \
            __m512i a = _mm512_set1_epi32(qg_quad(x + r * kp + (k)));                      \
            for (int p = 0; p < 4; p++) acc[r][p] = _mm512_dpbusd_epi32(acc[r][p], a, wv[p]); \
        }                                                                                  \
    } while (0)
    if (ahead)
        for (; k < kp; k += 4) {
            for (int p = 0; p < 4; p++) FA_PREFETCH(w + p * ps + k * 16 + QG_PF, 3);
            QG_STEP(k);
        }
    for (; k < kp; k += 4) QG_STEP(k);
#undef QG_STEP
    qg_imk_avx512_store(mr, acc, tile);
}
#define QG_MR 6
#define QG_NP 4
#define QG_MK qg_imk_avx512vnni
#include "qgemm_tile.h"
#endif /* FA_X86 */

#if FA_ARM64
/* ------------------------------------------------------------------ AArch64
 * The packed layout is the x86 one: a k-quad of a panel is 16 columns x 4 k, so a 16-byte NEON
 * register holds 4 columns' k-quads (columns 4c .. 4c + 3 in register c), which is what the
 * dot-product instructions consume against one activation quad taken by lane. The epilogue and
 * LayerNorm are the same 16-lane GNU-vector source as on x86 (four q registers a vector), built
 * with -ffp-contract=off like the rest of this extension: the same bits as every x86 variant.
 * Register blocks (32 q registers):
 *   neon     3 x 16   SMULL / SMULL2 of recentred activations (s = u - 128) by the weights into
 *                     int16 (|s w| <= 128 * 127), SADALP pairs into int32 (8 accumulators a
 *                     row), one ADDP a column at the end; 24 accumulators + 4 weights + 1 row
 *   dotprod  4 x 16   SDOT by lane of recentred activations (16 bytes = 4 quads of a row in one
 *                     register, a quad per lane): 16 accumulators, 4 weights, 4 rows
 *   i8mm     4 x 16   USMMLA on row pairs x column pairs over 8 k (the weights' quads zipped
 *                     into 8-k columns: ZIP1 / ZIP2 of two quads' registers), raw u8 activations
 *                     (no recentring); 16 accumulators (2 x 2 each), 8 weight pairs, 2 row
 *                     pairs. One row (a decode step) runs SUDOT by lane instead, which wastes
 *                     no half of the matrix unit.
 * The recentred variants add 128 * sum_k w back in the item (QG_TBIAS), as avx2 does: every
 * variant's integers are the scalar reference's. */


/* the 16-byte chunk [k, k + 16) of row xr recentred (u - 128, as s8) */
static FA_ALWAYS_INLINE int8x16_t qg_arm_recentre16(const uint8_t *xr)
{
    return vreinterpretq_s8_u8(veorq_u8(vld1q_u8(xr), vdupq_n_u8(0x80)));
}

/* one k-quad of row xr at k recentred and repeated in all four 32-bit lanes */
static FA_ALWAYS_INLINE int8x16_t qg_arm_quad_s8(const uint8_t *xr)
{
    return vreinterpretq_s8_u32(vdupq_n_u32((uint32_t)qg_quad(xr) ^ 0x80808080u));
}

/* ---- neon: the baseline (ARMv8.0, every AArch64 CPU) */
#define FA_NAME(x) qg_##x##_neon
#define FA_IS_DOUBLE 0
#define FA_VW QG_VW
#define GM_MR 6
#define GM_NV 4
#define GM_KC 256
#define FA_ANY(m) FA_ANY64_NEON(m)
#define FA_TARGET
#define GM_KEEP_INSTANCE
#include "gemm_tile.h"

static FA_ALWAYS_INLINE void qg_imk_neon(const uint8_t *x, ptrdiff_t kp, const int mr,
                                         const int8_t *w, ptrdiff_t ps, int32_t *tile, int ahead)
{
    (void)ps;
    int32x4_t acc[3][8];             /* row r, register c: [2c] columns 4c, 4c+1, [2c+1] the next two */
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < 8; c++) acc[r][c] = vdupq_n_s32(0);
    for (ptrdiff_t k = 0; k < kp; k += 4) {
        const int8_t *q = w + k * 16;
        if (ahead) FA_PREFETCH(q + QG_PF, 3);
        int8x16_t wv[4];
        for (int c = 0; c < 4; c++) wv[c] = vld1q_s8(q + 16 * c);
        for (int r = 0; r < mr; r++) {
            const int8x16_t xs = qg_arm_quad_s8(x + r * kp + k);
            for (int c = 0; c < 4; c++) {
                acc[r][2 * c] = vpadalq_s16(acc[r][2 * c], vmull_s8(vget_low_s8(wv[c]),
                                                                     vget_low_s8(xs)));
                acc[r][2 * c + 1] = vpadalq_s16(acc[r][2 * c + 1], vmull_high_s8(wv[c], xs));
            }
        }
    }
    /* lanes (column, k pair): [c0 k01, c0 k23, c1 k01, c1 k23] -> the columns' sums */
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < 4; c++)
            vst1q_s32(tile + r * 16 + 4 * c, vpaddq_s32(acc[r][2 * c], acc[r][2 * c + 1]));
}
#define QG_MR 3
#define QG_NP 1
#define QG_TBIAS 128
#define QG_MK(x, kp, mr, w, ps, tile, ahead) qg_imk_neon(x, kp, mr, w, ps, tile, ahead)
#include "qgemm_tile.h"

/* ---- dotprod: SDOT (ARMv8.2 FEAT_DotProd: Graviton 2+, Apple M1+, Cortex-A76+) */
#define FA_NAME(x) qg_##x##_dotprod
#define FA_IS_DOUBLE 0
#define FA_VW QG_VW
#define GM_MR 6
#define GM_NV 4
#define GM_KC 256
#define FA_ANY(m) FA_ANY64_NEON(m)
#define FA_TARGET FA_TARGET_DOTPROD
#define GM_KEEP_INSTANCE
#include "gemm_tile.h"

/* four quads of the panel from quad k: SDOT of each of the 4 registers against lane L of the
 * rows' recentred chunks */
#define QG_SDOT_QUAD(L)                                                                      \
    do {                                                                                     \
        const int8_t *q = w + (k + 4 * (L)) * 16;                                            \
        int8x16_t wv[4];                                                                     \
        for (int c = 0; c < 4; c++) wv[c] = vld1q_s8(q + 16 * c);                            \
        for (int r = 0; r < mr; r++)                                                         \
            for (int c = 0; c < 4; c++)                                                      \
                acc[r][c] = vdotq_laneq_s32(acc[r][c], wv[c], xs[r], (L));                   \
    } while (0)

FA_TARGET_DOTPROD static FA_ALWAYS_INLINE void
qg_imk_dotprod(const uint8_t *x, ptrdiff_t kp, const int mr, const int8_t *w, ptrdiff_t ps,
               int32_t *tile, int ahead)
{
    (void)ps;
    int32x4_t acc[4][4];
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < 4; c++) acc[r][c] = vdupq_n_s32(0);
    ptrdiff_t k = 0;
    for (; k + 16 <= kp; k += 16) {
        if (ahead) FA_PREFETCH(w + k * 16 + QG_PF, 3);
        int8x16_t xs[4];
        for (int r = 0; r < mr; r++) xs[r] = qg_arm_recentre16(x + r * kp + k);
        QG_SDOT_QUAD(0);
        QG_SDOT_QUAD(1);
        QG_SDOT_QUAD(2);
        QG_SDOT_QUAD(3);
    }
    for (; k < kp; k += 4) {          /* the last 1-3 quads: the quad in every lane */
        int8x16_t xs[4];
        for (int r = 0; r < mr; r++) xs[r] = qg_arm_quad_s8(x + r * kp + k);
        const int8_t *q = w + k * 16;
        for (int c = 0; c < 4; c++) {
            const int8x16_t wv = vld1q_s8(q + 16 * c);
            for (int r = 0; r < mr; r++) acc[r][c] = vdotq_s32(acc[r][c], wv, xs[r]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < 4; c++) vst1q_s32(tile + r * 16 + 4 * c, acc[r][c]);
}
#undef QG_SDOT_QUAD
#define QG_MR 4
#define QG_NP 1
#define QG_TBIAS 128
#define QG_MK(x, kp, mr, w, ps, tile, ahead) qg_imk_dotprod(x, kp, mr, w, ps, tile, ahead)
#include "qgemm_tile.h"

/* ---- i8mm: USMMLA / SUDOT (ARMv8.6 FEAT_I8MM: Graviton 3+, Apple M2+, Neoverse V1 / N2+) */
#define FA_NAME(x) qg_##x##_i8mm
#define FA_IS_DOUBLE 0
#define FA_VW QG_VW
#define GM_MR 6
#define GM_NV 4
#define GM_KC 256
#define FA_ANY(m) FA_ANY64_NEON(m)
#define FA_TARGET FA_TARGET_I8MM
#define GM_KEEP_INSTANCE
#include "gemm_tile.h"

/* 8 bytes of row xr from k: two quads, or one quad and 4 zero bytes (the last odd quad) */
static FA_ALWAYS_INLINE uint8x8_t qg_arm_row8(const uint8_t *xr, int two)
{
    uint64_t v = (uint32_t)qg_quad(xr);
    if (two) v |= (uint64_t)(uint32_t)qg_quad(xr + 4) << 32;
    return vcreate_u8(v);
}

/* the panel's 16 columns over 8 k from quad k (and quad k + 4 unless !two: zeros) as 8 column
 * pairs, each [column 2p: k .. k+7, column 2p+1: k .. k+7] */
FA_TARGET_I8MM static FA_ALWAYS_INLINE void qg_arm_wpairs(const int8_t *q, int two,
                                                          int8x16_t wp[8])
{
    for (int c = 0; c < 4; c++) {
        const int32x4_t lo = vreinterpretq_s32_s8(vld1q_s8(q + 16 * c));
        const int32x4_t hi = two ? vreinterpretq_s32_s8(vld1q_s8(q + 64 + 16 * c))
                                 : vdupq_n_s32(0);
        wp[2 * c] = vreinterpretq_s8_s32(vzip1q_s32(lo, hi));
        wp[2 * c + 1] = vreinterpretq_s8_s32(vzip2q_s32(lo, hi));
    }
}

FA_TARGET_I8MM static FA_ALWAYS_INLINE void
qg_imk_i8mm(const uint8_t *x, ptrdiff_t kp, const int mr, const int8_t *w, ptrdiff_t ps,
            int32_t *tile, int ahead)
{
    (void)ps;
    if (mr == 1) {
        /* one row: SUDOT by lane (signed weights x the unsigned quad in lane L) */
        int32x4_t acc[4];
        for (int c = 0; c < 4; c++) acc[c] = vdupq_n_s32(0);
        ptrdiff_t k = 0;
        for (; k + 16 <= kp; k += 16) {
            if (ahead) FA_PREFETCH(w + k * 16 + QG_PF, 3);
            const uint8x16_t xu = vld1q_u8(x + k);
#define QG_SUDOT_QUAD(L)                                                                     \
            for (int c = 0; c < 4; c++)                                                      \
                acc[c] = vsudotq_laneq_s32(acc[c], vld1q_s8(w + (k + 4 * (L)) * 16 + 16 * c), \
                                           xu, (L));
            QG_SUDOT_QUAD(0)
            QG_SUDOT_QUAD(1)
            QG_SUDOT_QUAD(2)
            QG_SUDOT_QUAD(3)
#undef QG_SUDOT_QUAD
        }
        for (; k < kp; k += 4) {
            const uint8x16_t xu = vreinterpretq_u8_u32(vdupq_n_u32((uint32_t)qg_quad(x + k)));
            for (int c = 0; c < 4; c++)
                acc[c] = vusdotq_s32(acc[c], xu, vld1q_s8(w + k * 16 + 16 * c));
        }
        for (int c = 0; c < 4; c++) vst1q_s32(tile + 4 * c, acc[c]);
        return;
    }
    /* row pairs: acc[p][cp] = [r 2p: col 2cp, 2cp+1; r 2p+1: col 2cp, 2cp+1] */
    enum { NP = 2 };
    int32x4_t acc[NP][8];
    const int npairs = (mr + 1) / 2;
    for (int p = 0; p < npairs; p++)
        for (int c = 0; c < 8; c++) acc[p][c] = vdupq_n_s32(0);
    for (ptrdiff_t k = 0; k < kp; k += 8) {
        const int two = k + 8 <= kp;
        const int8_t *q = w + k * 16;
        if (ahead) FA_PREFETCH(q + QG_PF, 3);
        int8x16_t wp[8];
        qg_arm_wpairs(q, two, wp);
        for (int p = 0; p < npairs; p++) {
            const uint8x8_t r0 = qg_arm_row8(x + (2 * p) * kp + k, two);
            const uint8x8_t r1 = 2 * p + 1 < mr ? qg_arm_row8(x + (2 * p + 1) * kp + k, two)
                                                : vdup_n_u8(0);
            const uint8x16_t xp = vcombine_u8(r0, r1);
            for (int c = 0; c < 8; c++) acc[p][c] = vusmmlaq_s32(acc[p][c], xp, wp[c]);
        }
    }
    for (int p = 0; p < npairs; p++)
        for (int c = 0; c < 8; c++) {
            int32_t v[4];
            vst1q_s32(v, acc[p][c]);
            tile[(2 * p) * 16 + 2 * c] = v[0];
            tile[(2 * p) * 16 + 2 * c + 1] = v[1];
            if (2 * p + 1 < mr) {
                tile[(2 * p + 1) * 16 + 2 * c] = v[2];
                tile[(2 * p + 1) * 16 + 2 * c + 1] = v[3];
            }
        }
}
#define QG_MR 4
#define QG_NP 1
#define QG_MK(x, kp, mr, w, ps, tile, ahead) qg_imk_i8mm(x, kp, mr, w, ps, tile, ahead)
#include "qgemm_tile.h"
#endif /* FA_ARM64 */

/* ------------------------------------------------------------------ tables, selection */
static qg_kernels qg_tables[QG_N_VARIANTS];

#define QG_FILL(v, sfx, MR, QUANT)              \
    do {                                        \
        qg_tables[v].mr = MR;                   \
        qg_tables[v].quant = QUANT;             \
        qg_tables[v].item = qg_qitem_##sfx;     \
        qg_tables[v].ln = qg_ln_row_##sfx;      \
        qg_tables[v].epi = qg_qepilogue_##sfx;  \
        qg_tables[v].fnr = qg_nr_##sfx;         \
        qg_tables[v].fkc = qg_kc_##sfx;         \
        qg_tables[v].fpack = qg_pack_##sfx;     \
        qg_tables[v].fitem = qg_item_##sfx;     \
    } while (0)

void qg_setup(void)
{
    for (int v = 0; v < QG_N_VARIANTS; v++) QG_FILL(v, scalar, 6, qg_quant_scalar);
#if FA_X86
    QG_FILL(QG_AVX2, avx2, 4, qg_quant_x86);
    QG_FILL(QG_AVX2_VNNI, avx2vnni, 6, qg_quant_x86);
    /* LayerNorm's sums at 16 lanes, as every variant (see the AVX2 instances) */
    qg_tables[QG_AVX2].ln = QG_LN_AVX2;
    qg_tables[QG_AVX2_VNNI].ln = QG_LN_AVX2;
    QG_FILL(QG_AVX512, avx512, 6, qg_quant_x86);
    QG_FILL(QG_AVX512_VNNI, avx512vnni, 6, qg_quant_x86);
#endif
#if FA_ARM64
    QG_FILL(QG_NEON, neon, 3, qg_quant_scalar);
    QG_FILL(QG_DOTPROD, dotprod, 4, qg_quant_scalar);
    QG_FILL(QG_I8MM, i8mm, 4, qg_quant_scalar);
#endif
}

const qg_kernels *qg_kernels_for(int variant) { return &qg_tables[variant]; }

int qg_variant_ok(int variant, unsigned features)
{
    const unsigned avx2 = FA_CPU_AVX2 | FA_CPU_FMA;
    const unsigned avx512 = avx2 | FA_CPU_AVX512F | FA_CPU_AVX512BW;
    unsigned need;
    switch (variant) {
    case QG_SCALAR: return 1;
#if FA_X86
    case QG_AVX2: need = avx2; break;
    case QG_AVX2_VNNI: need = avx2 | FA_CPU_AVX_VNNI; break;
    case QG_AVX512: need = avx512; break;
    case QG_AVX512_VNNI: need = avx512 | FA_CPU_AVX512_VNNI; break;
#endif
#if FA_ARM64
    case QG_NEON: need = FA_CPU_BASE; break;
    case QG_DOTPROD: need = FA_CPU_BASE | FA_CPU_DOTPROD; break;
    case QG_I8MM: need = FA_CPU_BASE | FA_CPU_DOTPROD | FA_CPU_I8MM; break;
#endif
    default: return 0;
    }
    return (features & need) == need;
}

int qg_variant_for(int level, unsigned features)
{
    /* (AArch64's run on the baseline kernel set, NEON; the x86 ones are never ok there) */
    int order[] = {QG_AVX512_VNNI, QG_AVX512, QG_AVX2_VNNI, QG_AVX2, QG_I8MM, QG_DOTPROD,
                   QG_NEON, QG_SCALAR};
    if (level == FA_ISA_AVX2_WIDE) level = FA_ISA_AVX2;   /* an AVX2 kernel set: the AVX2 variants */
    for (int i = 0; i < (int)(sizeof order / sizeof order[0]); i++) {
        int v = order[i];
        int need = v >= QG_NEON ? FA_ISA_BASE : v >= QG_AVX512 ? FA_ISA_AVX512
                 : v >= QG_AVX2 ? FA_ISA_AVX2 : FA_ISA_SCALAR;
        if (need <= level && qg_variant_ok(v, features)) return v;
    }
    return QG_SCALAR;
}
