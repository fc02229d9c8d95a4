/* bgemm_kernels.c -- the bfloat16 linear layer's micro-kernels, one per variant, and the work
 * item they share; the arithmetic they all do, and why it is the same bits: bgemm_kernels.h.
 * Compiled into the int8 GEMM's extension (with -ffp-contract=off, as it): the float epilogue
 * and LayerNorm are that GEMM's (qg_kernels_for(...)->epi, ->ln).
 *
 * Register blocks (rows x columns) and each variant's step per k-pair and row:
 *   scalar        6 x 64   plain C in double (the reference)
 *   avx2          4 x 16   each 32-bit lane of a pair split into two float32 lanes (the odd
 *                          element is its high half, the even one shifted up), panel and
 *                          broadcast alike; two vfmadd per ymm of columns: 8 accumulators, 4
 *                          panel halves, 2 broadcast halves
 *   avx512        4 x 64   the same on zmm: 16 accumulators, 8 panel halves, 2 broadcast halves
 *   avx512-bf16   6 x 64   one vdpbf16ps per zmm of columns: 24 accumulators
 * The first row block of an item prefetches its panels ahead (it brings them from memory).
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "bgemm_kernels.h"
#include "qgemm_kernels.h"    /* the float epilogue and LayerNorm rows */

#define BG_PF 1024            /* bytes ahead in each panel stream */
#define BG_MAXT (6 * 64)      /* the largest tile (mr x tw) */

/* the compilers that know AVX-512 BF16 (its target attribute and intrinsics) */
#if FA_X86 && ((defined(__clang__) && __clang_major__ >= 9) || \
               (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 10))
#define BG_HAVE_BF16 1
#else
#define BG_HAVE_BF16 0
#endif

/* ------------------------------------------------------------------ rounding to bfloat16 */
static inline uint16_t bg_round1(uint32_t u)
{
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);   /* NaN: quiet, sign kept */
    if (a < 0x00800000u) return (uint16_t)((u >> 16) & 0x8000u);   /* 0 and subnormals: +-0 */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);     /* to nearest even; the
                                                                      largest round to inf */
}

void bg_round_row(const float *x, ptrdiff_t K, uint16_t *xb, ptrdiff_t kp)
{
    ptrdiff_t k;
    for (k = 0; k < K; k++) {
        uint32_t u;
        memcpy(&u, x + k, 4);
        xb[k] = bg_round1(u);
    }
    for (; k < kp; k++) xb[k] = 0;
}

/* the pair of x (its two bfloat16 values) as one 32-bit word: the odd element high */
static inline uint32_t bg_pair(const uint16_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ------------------------------------------------------------------ scalar (the reference)
 * acc + a b: the product exact in double (8 + 8 significant bits, exponents from -252 to 256),
 * the sum rounded once to double then to float32's 24 bits (53 >= 2 * 24 + 2: the same as one
 * rounding), then vdpbf16ps's flush: a result below 2^-126 once rounded to 24 bits with no
 * exponent limit becomes a zero of its sign. (float) s does that rounding at and above 2^-126;
 * below it the 24-bit rounding gives 2^-126 exactly from 2^-126 - 2^-151 up (a tie goes to
 * 2^-126, its mantissa even), and less (flushed) further down. NaN and inf pass through the
 * first test. */
static inline float bg_step(float acc, uint32_t a_bits, uint32_t b_bits)
{
    float a, b;
    memcpy(&a, &a_bits, 4);
    memcpy(&b, &b_bits, 4);
    const double s = (double)acc + (double)a * (double)b;
    const double m = fabs(s);
    if (!(m < 0x1p-126)) return (float)s;
    if (m >= 0x1p-126 - 0x1p-151) return (float)copysign(0x1p-126, s);
    return (float)copysign(0.0, s);
}

static void bg_mk_scalar(const uint16_t *x, ptrdiff_t kp, int mr, const uint16_t *w,
                         ptrdiff_t ps, float *tile, int ahead)
{
    (void)ahead;
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < 64; c++) {
            const uint16_t *panel = w + (c / 16) * ps + (c % 16) * 2;
            const uint16_t *xr = x + r * kp;
            float acc = 0.0f;
            for (ptrdiff_t k = 0; k < kp; k += 2) {
                const uint32_t xp = bg_pair(xr + k), wq = bg_pair(panel + k * 16);
                acc = bg_step(acc, xp & 0xffff0000u, wq & 0xffff0000u);   /* odd first */
                acc = bg_step(acc, xp << 16, wq << 16);
            }
            tile[r * 64 + c] = acc;
        }
}

#if FA_X86
/* MXCSR while a fallback micro-kernel runs: flush to zero and denormals read as zero
 * (vdpbf16ps's FTZ and DAZ; no operand is subnormal here, so DAZ only makes the instruction's
 * match complete), round to nearest, every exception masked; the caller's value is put back
 * before the epilogue */
#define BG_CSR_FTZ (0x8000u | 0x0040u | 0x1f80u)
#define BG_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define BG_TARGET_AVX512 __attribute__((target("avx512f,avx2,fma")))

/* ------------------------------------------------------------------ AVX2 + FMA (widened) */
BG_TARGET_AVX2 static FA_ALWAYS_INLINE void
bg_mk_avx2_rows(const uint16_t *x, ptrdiff_t kp, const int mr, const uint16_t *w, float *tile,
                int ahead)
{
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    __m256 acc[4][2];
    for (int r = 0; r < mr; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (ptrdiff_t k = 0; k < kp; k += 2) {
        const uint16_t *q = w + k * 16;
        if (ahead) FA_PREFETCH((const char *)q + BG_PF, 3);
        const __m256i v0 = _mm256_loadu_si256((const __m256i *)q);
        const __m256i v1 = _mm256_loadu_si256((const __m256i *)(q + 16));
        const __m256 o0 = _mm256_castsi256_ps(_mm256_and_si256(v0, hi));
        const __m256 e0 = _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16));
        const __m256 o1 = _mm256_castsi256_ps(_mm256_and_si256(v1, hi));
        const __m256 e1 = _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16));
        for (int r = 0; r < mr; r++) {
            const __m256i p = _mm256_set1_epi32((int)bg_pair(x + r * kp + k));
            const __m256 xo = _mm256_castsi256_ps(_mm256_and_si256(p, hi));
            const __m256 xe = _mm256_castsi256_ps(_mm256_slli_epi32(p, 16));
            acc[r][0] = _mm256_fmadd_ps(xe, e0, _mm256_fmadd_ps(xo, o0, acc[r][0]));
            acc[r][1] = _mm256_fmadd_ps(xe, e1, _mm256_fmadd_ps(xo, o1, acc[r][1]));
        }
    }
    for (int r = 0; r < mr; r++) {
        _mm256_storeu_ps(tile + r * 16, acc[r][0]);
        _mm256_storeu_ps(tile + r * 16 + 8, acc[r][1]);
    }
}

/* a function of its own, called with MXCSR set: nothing of it can move outside the setting */
BG_TARGET_AVX2 static __attribute__((noinline)) void
bg_mk_avx2_body(const uint16_t *x, ptrdiff_t kp, int mr, const uint16_t *w, float *tile,
                int ahead)
{
    switch (mr) {
    case 4: bg_mk_avx2_rows(x, kp, 4, w, tile, ahead); break;
    case 3: bg_mk_avx2_rows(x, kp, 3, w, tile, ahead); break;
    case 2: bg_mk_avx2_rows(x, kp, 2, w, tile, ahead); break;
    case 1: bg_mk_avx2_rows(x, kp, 1, w, tile, ahead); break;
    default: break;
    }
}

static void bg_mk_avx2(const uint16_t *x, ptrdiff_t kp, int mr, const uint16_t *w, ptrdiff_t ps,
                       float *tile, int ahead)
{
    (void)ps;
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(BG_CSR_FTZ);
    bg_mk_avx2_body(x, kp, mr, w, tile, ahead);
    _mm_setcsr(csr);
}

/* ------------------------------------------------------------------ AVX-512F (widened) */
BG_TARGET_AVX512 static FA_ALWAYS_INLINE void
bg_mk_avx512_rows(const uint16_t *x, ptrdiff_t kp, const int mr, const uint16_t *w,
                  ptrdiff_t ps, float *tile, int ahead)
{
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    __m512 acc[4][4];
    for (int r = 0; r < mr; r++)
        for (int p = 0; p < 4; p++) acc[r][p] = _mm512_setzero_ps();
    for (ptrdiff_t k = 0; k < kp; k += 2) {
        __m512 o[4], e[4];
        for (int p = 0; p < 4; p++) {
            const uint16_t *q = w + p * ps + k * 16;
            if (ahead) FA_PREFETCH((const char *)q + BG_PF, 3);
            const __m512i v = _mm512_loadu_si512((const void *)q);
            o[p] = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
            e[p] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        }
        for (int r = 0; r < mr; r++) {
            const __m512i pr = _mm512_set1_epi32((int)bg_pair(x + r * kp + k));
            const __m512 xo = _mm512_castsi512_ps(_mm512_and_si512(pr, hi));
            const __m512 xe = _mm512_castsi512_ps(_mm512_slli_epi32(pr, 16));
            for (int p = 0; p < 4; p++)
                acc[r][p] = _mm512_fmadd_ps(xe, e[p], _mm512_fmadd_ps(xo, o[p], acc[r][p]));
        }
    }
    for (int r = 0; r < mr; r++)
        for (int p = 0; p < 4; p++) _mm512_storeu_ps(tile + r * 64 + p * 16, acc[r][p]);
}

BG_TARGET_AVX512 static __attribute__((noinline)) void
bg_mk_avx512_body(const uint16_t *x, ptrdiff_t kp, int mr, const uint16_t *w, ptrdiff_t ps,
                  float *tile, int ahead)
{
    switch (mr) {
    case 4: bg_mk_avx512_rows(x, kp, 4, w, ps, tile, ahead); break;
    case 3: bg_mk_avx512_rows(x, kp, 3, w, ps, tile, ahead); break;
    case 2: bg_mk_avx512_rows(x, kp, 2, w, ps, tile, ahead); break;
    case 1: bg_mk_avx512_rows(x, kp, 1, w, ps, tile, ahead); break;
    default: break;
    }
}

static void bg_mk_avx512(const uint16_t *x, ptrdiff_t kp, int mr, const uint16_t *w,
                         ptrdiff_t ps, float *tile, int ahead)
{
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(BG_CSR_FTZ);
    bg_mk_avx512_body(x, kp, mr, w, ps, tile, ahead);
    _mm_setcsr(csr);
}

#if BG_HAVE_BF16
/* ------------------------------------------------------------------ AVX-512 BF16 */
#define BG_TARGET_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16,avx2,fma")))

BG_TARGET_BF16 static FA_ALWAYS_INLINE void
bg_mk_bf16_rows(const uint16_t *x, ptrdiff_t kp, const int mr, const uint16_t *w, ptrdiff_t ps,
                float *tile, int ahead)
{
    __m512 acc[6][4];
    for (int r = 0; r < mr; r++)
        for (int p = 0; p < 4; p++) acc[r][p] = _mm512_setzero_ps();
    ptrdiff_t k = 0;
#define BG_STEP(k)                                                                          \
    do {                                                                                    \
        __m512i wv[4];                                                                      \
        for (int p = 0; p < 4; p++)                                                         \
            wv[p] = _mm512_loadu_si512((const void *)(w + p * ps + (k) * 16));              \
        for (int r = 0; r < mr; r++) {                                                      \
            const __m512i a = _mm512_set1_epi32((int)bg_pair(x + r * kp + (k)));            \
            for (int p = 0; p < 4; p++)                                                     \
                acc[r][p] = _mm512_dpbf16_ps(acc[r][p], (__m512bh)a, (__m512bh)wv[p]);      \
        }                                                                                   \
    } while (0)
    if (ahead)
        for (; k < kp; k += 2) {
            for (int p = 0; p < 4; p++)
                FA_PREFETCH((const char *)(w + p * ps + k * 16) + BG_PF, 3);
            BG_STEP(k);
        }
    for (; k < kp; k += 2) BG_STEP(k);
#undef BG_STEP
    for (int r = 0; r < mr; r++)
        for (int p = 0; p < 4; p++) _mm512_storeu_ps(tile + r * 64 + p * 16, acc[r][p]);
}

BG_TARGET_BF16 static void bg_mk_bf16(const uint16_t *x, ptrdiff_t kp, int mr, const uint16_t *w,
                                      ptrdiff_t ps, float *tile, int ahead)
{
    switch (mr) {
    case 6: bg_mk_bf16_rows(x, kp, 6, w, ps, tile, ahead); break;
    case 5: bg_mk_bf16_rows(x, kp, 5, w, ps, tile, ahead); break;
    case 4: bg_mk_bf16_rows(x, kp, 4, w, ps, tile, ahead); break;
    case 3: bg_mk_bf16_rows(x, kp, 3, w, ps, tile, ahead); break;
    case 2: bg_mk_bf16_rows(x, kp, 2, w, ps, tile, ahead); break;
    case 1: bg_mk_bf16_rows(x, kp, 1, w, ps, tile, ahead); break;
    default: break;
    }
}
#endif /* BG_HAVE_BF16 */
#endif /* FA_X86 */

/* ------------------------------------------------------------------ the work item
 * Register blocks of mr rows x tw columns; more than two row blocks: row blocks outer (the
 * block's activation rows stay in L1 while the item's panels stream from L2), else panels
 * outer (a decode step: each panel read from memory once). A block's sums go to y, then the
 * epilogue over the item's whole width, a row block's rows once their last column block is done
 * (rows outer) or every row at the end (panels outer): qgemm_tile.h's qitem, with float sums. */
void bg_item(const bg_kernels *kn, const uint16_t *xb, ptrdiff_t kp, ptrdiff_t m,
             const uint16_t *wp, ptrdiff_t n0, ptrdiff_t nc, const float *bias, int act,
             const float *res, ptrdiff_t res_rs, float *y, ptrdiff_t y_rs)
{
    float tile[BG_MAXT] __attribute__((aligned(64)));
    const int MR = kn->mr, TW = kn->tw;
    const ptrdiff_t ps = kp * BG_PANEL;
    const ptrdiff_t n_rb = (m + MR - 1) / MR, n_cb = (nc + TW - 1) / TW;
    const int rows_outer = n_rb > 2, epi = bias || act || res;
    for (ptrdiff_t b = 0; b < n_rb * n_cb; b++) {
        const ptrdiff_t rb = rows_outer ? b / n_cb : b % n_rb;
        const ptrdiff_t cb = rows_outer ? b % n_cb : b / n_rb;
        const ptrdiff_t i0 = rb * MR, j0 = n0 + cb * TW;
        const int mr = m - i0 < MR ? (int)(m - i0) : MR;
        const ptrdiff_t cols = n0 + nc - j0 < TW ? n0 + nc - j0 : TW;
        kn->mk(xb + i0 * kp, kp, mr, wp + (j0 / BG_PANEL) * ps, ps, tile, i0 == 0);
        for (int r = 0; r < mr; r++)
            memcpy(y + (i0 + r) * y_rs + j0, tile + r * TW, (size_t)cols * sizeof(float));
        if (epi && rows_outer && cb == n_cb - 1)
            for (int r = 0; r < mr; r++)
                kn->epi(y + (i0 + r) * y_rs + n0, nc, bias ? bias + n0 : NULL, act,
                        res ? res + (i0 + r) * res_rs + n0 : NULL);
    }
    if (epi && !rows_outer)
        for (ptrdiff_t r = 0; r < m; r++)
            kn->epi(y + r * y_rs + n0, nc, bias ? bias + n0 : NULL, act,
                    res ? res + r * res_rs + n0 : NULL);
}

/* ------------------------------------------------------------------ tables, selection */
static bg_kernels bg_tables[BG_N_VARIANTS];

static void bg_fill(int v, int mr, int tw, bg_mk_fn mk, int qv)
{
    const qg_kernels *q = qg_kernels_for(qv);
    bg_tables[v].mr = mr;
    bg_tables[v].tw = tw;
    bg_tables[v].mk = mk;
    bg_tables[v].epi = q->epi;
    bg_tables[v].ln = q->ln;
}

void bg_setup(void)
{
    for (int v = 0; v < BG_N_VARIANTS; v++) bg_fill(v, 6, 64, bg_mk_scalar, QG_SCALAR);
#if FA_X86
    bg_fill(BG_AVX2, 4, 16, bg_mk_avx2, QG_AVX2);
    bg_fill(BG_AVX512, 4, 64, bg_mk_avx512, QG_AVX512);
#if BG_HAVE_BF16
    bg_fill(BG_AVX512_BF16, 6, 64, bg_mk_bf16, QG_AVX512);
#endif
#endif
}

const bg_kernels *bg_kernels_for(int variant) { return &bg_tables[variant]; }

int bg_variant_ok(int variant, unsigned features)
{
    const unsigned avx2 = FA_CPU_AVX2 | FA_CPU_FMA;
    const unsigned avx512 = avx2 | FA_CPU_AVX512F | FA_CPU_AVX512BW;
    unsigned need;
    switch (variant) {
    case BG_SCALAR: return 1;
#if FA_X86
    case BG_AVX2: need = avx2; break;
    case BG_AVX512: need = avx512; break;
#if BG_HAVE_BF16
    case BG_AVX512_BF16: need = avx512 | FA_CPU_AVX512_BF16; break;
#endif
#endif
    default: return 0;
    }
    return (features & need) == need;
}

int bg_variant_for(int level, unsigned features)
{
    const int order[BG_N_VARIANTS] = {BG_AVX512_BF16, BG_AVX512, BG_AVX2, BG_SCALAR};
    for (int i = 0; i < BG_N_VARIANTS; i++) {
        const int v = order[i];
        const int need = v >= BG_AVX512 ? FA_ISA_AVX512 : v == BG_AVX2 ? FA_ISA_AVX2
                                                                      : FA_ISA_SCALAR;
        /* the AVX2 kernel sets (avx2, avx2-wide) take the AVX2 variant */
        const int ok = level == FA_ISA_AVX2_WIDE ? need <= FA_ISA_AVX2 : need <= level;
        if (ok && bg_variant_ok(v, features)) return v;
    }
    return BG_SCALAR;
}
