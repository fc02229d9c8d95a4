/* qgemm_kernels.c -- the int8 linear layer's micro-kernels, one per variant, each instantiating
 * qgemm_tile.h (row quantisation, work item) over gemm_tile.h's epilogue and LayerNorm rows at
 * 16 float lanes (the same float code on every variant: qgemm_kernels.h says why).
 *
 * Register blocks (rows x columns) and the integer step of each variant, per k-quad:
 *   scalar        6 x 64   plain C, the reference
 *   avx2          2 x 16   the 64-byte quad widened to four 16-bit ymm (vpmovsxbw), vpmaddwd
 *                          against the row's quad broadcast as four 16-bit lanes: pairs of k
 *                          summed into int32 lanes, the pairs added after the loop (exact;
 *                          vpmaddubsw would saturate at 2 * 255 * 127 > 32767)
 *   avx2-vnni     6 x 16   two vpdpbusd (ymm) a row
 *   avx512        6 x 32   as avx2 on zmm: two 32-byte halves per panel
 *   avx512-vnni   6 x 64   four vpdpbusd (zmm) a row, 24 accumulators
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

/* the quad's 4 bytes zero-extended to 4 16-bit lanes of a 64-bit word */
static inline int64_t qg_quad16(const uint8_t *p)
{
    uint64_t v = (uint32_t)qg_quad(p);
    v = (v | v << 16) & 0x0000FFFF0000FFFFull;
    v = (v | v << 8) & 0x00FF00FF00FF00FFull;
    return (int64_t)v;
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

/* ------------------------------------------------------------------ AVX2 (vpmaddwd)
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
#define QG_LN_AVX2 qg_ln_row_avx2ln16
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

QG_TARGET_AVX2 static FA_ALWAYS_INLINE void
qg_imk_avx2(const uint8_t *x, ptrdiff_t kp, const int mr, const int8_t *w, ptrdiff_t ps,
           int32_t *tile, int ahead)
{
    (void)ps;
    __m256i acc[2][4];
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < 4; j++) acc[r][j] = _mm256_setzero_si256();
    for (ptrdiff_t k = 0; k < kp; k += 4) {
        const int8_t *q = w + k * 16;
        if (ahead) FA_PREFETCH(q + QG_PF, 3);
        __m256i xb[2];
        for (int r = 0; r < mr; r++) xb[r] = _mm256_set1_epi64x(qg_quad16(x + r * kp + k));
        for (int j = 0; j < 4; j++) {
            __m256i wv = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + 16 * j)));
            for (int r = 0; r < mr; r++)
                acc[r][j] = _mm256_add_epi32(acc[r][j], _mm256_madd_epi16(wv, xb[r]));
        }
    }
    /* lanes 2i, 2i + 1 of accumulator j: column 4 j + i */
    for (int r = 0; r < mr; r++) {
        int32_t pr[32] __attribute__((aligned(32)));
        for (int j = 0; j < 4; j++) _mm256_store_si256((__m256i *)(pr + 8 * j), acc[r][j]);
        for (int c = 0; c < 16; c++) tile[r * 16 + c] = pr[2 * c] + pr[2 * c + 1];
    }
}
#define QG_MR 2
#define QG_NP 1
#define QG_MK qg_imk_avx2
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
    for (int r = 0; r < mr; r++) {
        _mm256_storeu_si256((__m256i *)(tile + r * 16), acc[r][0]);
        _mm256_storeu_si256((__m256i *)(tile + r * 16 + 8), acc[r][1]);
    }
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

QG_TARGET_AVX512 static FA_ALWAYS_INLINE void
qg_imk_avx512(const uint8_t *x, ptrdiff_t kp, const int mr, const int8_t *w, ptrdiff_t ps,
             int32_t *tile, int ahead)
{
    __m512i acc[6][4];
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < 4; j++) acc[r][j] = _mm512_setzero_si512();
    for (ptrdiff_t k = 0; k < kp; k += 4) {
        __m512i xb[6];
        for (int r = 0; r < mr; r++) xb[r] = _mm512_set1_epi64(qg_quad16(x + r * kp + k));
        for (int p = 0; p < 2; p++) {
            const int8_t *q = w + p * ps + k * 16;
            if (ahead) FA_PREFETCH(q + QG_PF, 3);
            for (int h = 0; h < 2; h++) {
                __m512i wv = _mm512_cvtepi8_epi16(
                    _mm256_loadu_si256((const __m256i *)(q + 32 * h)));
                for (int r = 0; r < mr; r++)
                    acc[r][2 * p + h] = _mm512_add_epi32(acc[r][2 * p + h],
                                                         _mm512_madd_epi16(wv, xb[r]));
            }
        }
    }
    /* lanes 2i, 2i + 1 of accumulator j: column 8 j + i */
    for (int r = 0; r < mr; r++) {
        int32_t pr[64] __attribute__((aligned(64)));
        for (int j = 0; j < 4; j++) _mm512_store_si512((void *)(pr + 16 * j), acc[r][j]);
        for (int c = 0; c < 32; c++) tile[r * 32 + c] = pr[2 * c] + pr[2 * c + 1];
    }
}
#define QG_MR 6
#define QG_NP 2
#define QG_MK qg_imk_avx512
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
    __m512i acc[6][4];
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < 4; j++) acc[r][j] = _mm512_setzero_si512();
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
    for (int r = 0; r < mr; r++)
        for (int p = 0; p < 4; p++)
            _mm512_storeu_si512((void *)(tile + r * 64 + p * 16), acc[r][p]);
}
#define QG_MR 6
#define QG_NP 4
#define QG_MK qg_imk_avx512vnni
#include "qgemm_tile.h"
#endif /* FA_X86 */

/* ------------------------------------------------------------------ tables, selection */
static qg_kernels qg_tables[QG_N_VARIANTS];

#define QG_FILL(v, sfx, MR)                     \
    do {                                        \
        qg_tables[v].mr = MR;                   \
        qg_tables[v].quant = qg_qquant_##sfx;   \
        qg_tables[v].item = qg_qitem_##sfx;     \
        qg_tables[v].ln = qg_ln_row_##sfx;      \
    } while (0)

void qg_setup(void)
{
    for (int v = 0; v < QG_N_VARIANTS; v++) QG_FILL(v, scalar, 6);
#if FA_X86
    QG_FILL(QG_AVX2, avx2, 2);
    QG_FILL(QG_AVX2_VNNI, avx2vnni, 6);
    /* LayerNorm's sums at 16 lanes, as every variant (see the AVX2 instances) */
    qg_tables[QG_AVX2].ln = QG_LN_AVX2;
    qg_tables[QG_AVX2_VNNI].ln = QG_LN_AVX2;
    QG_FILL(QG_AVX512, avx512, 6);
    QG_FILL(QG_AVX512_VNNI, avx512vnni, 6);
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
    default: return 0;
    }
    return (features & need) == need;
}

int qg_variant_for(int level, unsigned features)
{
    int order[QG_N_VARIANTS] = {QG_AVX512_VNNI, QG_AVX512, QG_AVX2_VNNI, QG_AVX2, QG_SCALAR};
    for (int i = 0; i < QG_N_VARIANTS; i++) {
        int v = order[i];
        int need = v >= QG_AVX512 ? FA_ISA_AVX512 : v >= QG_AVX2 ? FA_ISA_AVX2 : FA_ISA_SCALAR;
        /* the AVX2 kernel sets (avx2, avx2-wide) take the AVX2 variants */
        int ok = level == FA_ISA_AVX2_WIDE ? need <= FA_ISA_AVX2 : need <= level;
        if (ok && qg_variant_ok(v, features)) return v;
    }
    return QG_SCALAR;
}
