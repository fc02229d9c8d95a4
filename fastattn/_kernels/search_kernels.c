/* search_kernels.c -- beam search's per-row kernels (search_kernels.h): log-softmax of the
 * logits and the top-k selection over a source's beams, both plain C plus GNU vectors.
 *
 * log_softmax_row, for a row x of n >= 1 elements (T = float or double):
 *   m  = max_j x_j                             (exact)
 *   y_j = x_j - m                              in T, the rounding of NumPy's x - m
 *   s  = sum_j exp(y_j)                        exp in T (a polynomial, <= 2 ulp), the sum in
 *                                              double: s >= 1 (the maximum contributes
 *                                              exp(0) = 1), so log s is finite, its relative
 *                                              error at most the terms' (float: ~2.4e-7)
 *   out_j = y_j - (T)log(s)                    in T: NumPy's y -= log(s) with s rounded to T
 * so the result differs from the former NumPy code (float32 exp and sum) only where the two
 * float32 log(s) differ by an ulp. Special rows: any NaN, or a +inf (where x - m is inf - inf),
 * gives a row of NaN (torch gives NaN there too); a row of only -inf stays -inf (every token
 * forbidden: the search must see -inf, not NaN, which it would rank first; the former NumPy
 * code gave NaN there, against its own comment).
 * The sum's lanes and their order are fixed by the source (pass 2 below), the exps are the
 * same polynomials in every build, and nothing is fused in any build (the pragmas below), so
 * results are bitwise the same from the baseline, AVX2 and AVX-512 builds, and for any thread
 * count (one row = one thread).
 * Speed (32 x 32000 floats, 2 threads, AVX-512 machine): the baseline build 3.9 ms, AVX2 0.9 ms,
 * AVX-512 0.54 ms (the three passes over a row then run at about the speed of NumPy's exp alone
 * over the same array).
 *
 * topk_row: one pass over the row keeping the best k so far in a small buffer sorted best
 * first. An element enters only if it beats the k-th (strictly: it comes later than every
 * element kept, so on equal values the kept one, with the lower index, wins), which once the
 * buffer is full is tested a block of SK_BLOCK elements at a time with one vector "any above
 * the threshold" check (almost every block of a 128000-column row fails it; 8 such rows, 2
 * threads: 0.39 ms as the compiler's scalar loop, 0.11 ms in AVX-512 intrinsics). Values
 * v = x + add are formed in T with one rounding, exactly NumPy's float32 acc += run_score, so
 * the fused selection picks the same candidates as the former materialised acc. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1    /* sched_getcpu and the CPU_* macros in fa_team.h */
#endif
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fa_team.h"
#include "search_kernels.h"  /* and simd.h: FA_X86, FA_GNU_VECTORS, the targets, <immintrin.h> */

/* Nothing here may be fused (the promise of the same bits from every build): setup.py compiles
 * this file with -ffp-contract=off; the pragmas say it again for a build that does not go through
 * setup.py (without them, AVX-512F's FMA instructions would contract a * b + c). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#define SK_INLINE static inline

/* ---------------------------------------------------------------------------- log-softmax */

#if FA_GNU_VECTORS
/* 32-byte vectors (one AVX2 register, two SSE2 ones): 8 floats or 4 doubles. Wider types are
 * not native under AVX2 and GCC 12 keeps them on the stack (the first version, with 8-lane
 * doubles, ran slower than NumPy) or crashes (__builtin_convertvector float -> double). */
typedef float sk_vf __attribute__((vector_size(32), aligned(4)));
typedef int32_t sk_vfi __attribute__((vector_size(32), aligned(4)));
typedef double sk_vd __attribute__((vector_size(32), aligned(8)));
typedef int64_t sk_vdi __attribute__((vector_size(32), aligned(8)));

/* exp(x) for x <= 0 (or -inf): simd.h's vexp_softmax (the attention softmax's exp), one
 * instance per build and dtype, sk_vexp_softmax_<dtype>_<build> (see SK_EXPS below). Compiled
 * here without contraction, it gives the same bits in every build. */
/* pass 1 over whole vectors: lane-wise max skipping NaN (compare and select), NaN flags */
#define SK_VEC_MAX(T, V, VI)                                                                   \
    {                                                                                          \
        V vm = (V){0} + ninf;                                                                  \
        VI vnan = (VI){0};                                                                     \
        for (; j + L <= n; j += L) {                                                           \
            V v = *(const V *)(x + j);                                                         \
            VI c = v > vm;                                                                     \
            vm = (V)(((VI)v & c) | ((VI)vm & ~c));                                             \
            vnan |= v != v;                                                                    \
        }                                                                                      \
        for (int l = 0; l < L; l++) {                                                          \
            m = vm[l] > m ? vm[l] : m;                                                         \
            nan |= vnan[l] != 0;                                                               \
        }                                                                                      \
    }
/* pass 2: the exps summed in four double vectors of 4 lanes; each block of 2 vectors (16
 * floats / 8 doubles) adds into them in a fixed way (float: the 16 exps widened in groups of
 * 4 to s0..s3; double: the two vectors to s0, s2), reduced as (s0 + s1) + (s2 + s3) and then
 * lane by lane. A tail shorter than a block is read from a copy padded with -inf (exp 0), so
 * every element goes through the same polynomial. */
#define SK_VEC_EXPSUM(T, V, sfx)                                                               \
    {                                                                                          \
        sk_vd s0 = (sk_vd){0}, s1 = (sk_vd){0}, s2 = (sk_vd){0}, s3 = (sk_vd){0};              \
        for (; j + 2 * L <= n; j += 2 * L) {                                                   \
            SK_EXP_ACC_##sfx(*(const V *)(x + j) - m, s0, s1)                                  \
            SK_EXP_ACC_##sfx(*(const V *)(x + j + L) - m, s2, s3)                              \
        }                                                                                      \
        if (j < n) {                                                                           \
            T pad[2 * L];                                                                      \
            for (int l = 0; l < 2 * L; l++) pad[l] = j + l < n ? x[j + l] : ninf;              \
            SK_EXP_ACC_##sfx(*(const V *)pad - m, s0, s1)                                      \
            SK_EXP_ACC_##sfx(*(const V *)(pad + L) - m, s2, s3)                                \
            j = n;                                                                             \
        }                                                                                      \
        s0 = (s0 + s1) + (s2 + s3);                                                            \
        for (int l = 0; l < 4; l++) s += s0[l];                                                \
    }
#define SK_EXP_ACC_f32(d, sa, sb)                                                              \
    {                                                                                          \
        sk_vf e = SK_VEXPF(d);                                                                 \
        sa += (sk_vd){e[0], e[1], e[2], e[3]};                                                 \
        sb += (sk_vd){e[4], e[5], e[6], e[7]};                                                 \
    }
#define SK_EXP_ACC_f64(d, sa, sb)                                                              \
    {                                                                                          \
        sa += SK_VEXPD(d);                                                                     \
        (void)sb;                                                                              \
    }
#define SK_LANES_f32 8
#define SK_LANES_f64 4
#else
#define SK_VEC_MAX(T, V, VI)
#define SK_VEC_EXPSUM(T, V, sfx)
#define SK_LANES_f32 1
#define SK_LANES_f64 1
#endif

/* pass 1 and the special rows, for the lane count L of the caller; then m is the row maximum
 * (+0 for a maximum of -0: which zero the lanes kept is not fixed) */
#define SK_LSM_HEAD(T, V, VI)                                                                  \
    const T ninf = -(T)INFINITY;                                                               \
    ptrdiff_t j = 0;                                                                           \
    T m = ninf;                                                                                \
    int nan = 0;                                                                               \
    SK_VEC_MAX(T, V, VI)                                                                       \
    for (; j < n; j++) {                                                                       \
        m = x[j] > m ? x[j] : m;                                                               \
        nan |= x[j] != x[j];                                                                   \
    }                                                                                          \
    if (nan || m == (T)INFINITY) {                                                             \
        for (j = 0; j < n; j++) y[j] = (T)NAN;                                                 \
        return;                                                                                \
    }                                                                                          \
    if (m == ninf) {                                                                           \
        for (j = 0; j < n; j++) y[j] = ninf;                                                   \
        return;                                                                                \
    }                                                                                          \
    m = m + (T)0;

/* One row (the maths at the top of this file). The plain loops finish what the vector passes
 * left (nothing, for pass 2) and are the whole computation without GNU vectors (MSVC). */
#define SK_DEFINE_LSM(name, TARGET, T, V, VI, sfx)                                             \
    TARGET static void name(const T *x, ptrdiff_t n, T *y)                                     \
    {                                                                                          \
        enum { L = SK_LANES_##sfx };                                                           \
        SK_LSM_HEAD(T, V, VI)                                                                  \
        double s = 0.0;                                                                        \
        j = 0;                                                                                 \
        SK_VEC_EXPSUM(T, V, sfx)                                                               \
        for (; j < n; j++) s += exp((double)(T)(x[j] - m));                                    \
        const T ls = (T)log(s);                                                                \
        /* pass 3: each x[j] is read before y[j] is written, so y may be x */                  \
        for (j = 0; j < n; j++) y[j] = (T)(x[j] - m) - ls;                                     \
    }

/* one build per ISA, every function carrying the ISA's target attribute (as gemm_tile.h) */
#if FA_GNU_VECTORS
/* the baseline build's exps: 32-byte vectors (8 floats, 4 doubles) */
#define FA_IS_DOUBLE 0
#define FA_VW 8
#define FA_NAME(x) sk_##x##_f32_base
#define FA_TARGET
#include "simd.h"
#define FA_SIMD_END
#include "simd.h"
#define FA_IS_DOUBLE 1
#define FA_VW 4
#define FA_NAME(x) sk_##x##_f64_base
#define FA_TARGET
#include "simd.h"
#define FA_SIMD_END
#include "simd.h"
#define SK_VEXPF sk_vexp_softmax_f32_base
#define SK_VEXPD sk_vexp_softmax_f64_base
SK_DEFINE_LSM(sk_lsm_f32_base, , float, sk_vf, sk_vfi, f32)
SK_DEFINE_LSM(sk_lsm_f64_base, , double, sk_vd, sk_vdi, f64)
#undef SK_VEXPF
#undef SK_VEXPD
#if FA_X86
/* "avx2" without "fma": the same operations in one register instead of two, never fused */
#define SK_AVX2 FA_TARGET_AVX2_NOFMA
#define FA_IS_DOUBLE 0
#define FA_VW 8
#define FA_NAME(x) sk_##x##_f32_avx2
#define FA_TARGET SK_AVX2
#include "simd.h"
#define FA_SIMD_END
#include "simd.h"
#define FA_IS_DOUBLE 1
#define FA_VW 4
#define FA_NAME(x) sk_##x##_f64_avx2
#define FA_TARGET SK_AVX2
#include "simd.h"
#define FA_SIMD_END
#include "simd.h"
#define SK_VEXPF sk_vexp_softmax_f32_avx2
#define SK_VEXPD sk_vexp_softmax_f64_avx2
SK_DEFINE_LSM(sk_lsm_f32_avx2, SK_AVX2, float, sk_vf, sk_vfi, f32)
SK_DEFINE_LSM(sk_lsm_f64_avx2, SK_AVX2, double, sk_vd, sk_vdi, f64)
#undef SK_VEXPF
#undef SK_VEXPD

/* AVX-512F: one 64-byte register holds a whole 16-float block of pass 2 (the two 8-float
 * vectors above) and its widened halves are the accumulators s0|s1 and s2|s3 side by side, so
 * every lane sees the same operations in the same order as in the other builds. AVX-512F has
 * FMA instructions; contraction is off for this file (top), so nothing is fused here either. */
#define SK_AVX512 FA_TARGET_AVX512_NOFMA
#define FA_IS_DOUBLE 0
#define FA_VW 16
#define FA_NAME(x) sk_##x##_f32_avx512
#define FA_TARGET SK_AVX512
#include "simd.h"
#define FA_SIMD_END
#include "simd.h"
#define FA_IS_DOUBLE 1
#define FA_VW 8
#define FA_NAME(x) sk_##x##_f64_avx512
#define FA_TARGET SK_AVX512
#include "simd.h"
#define FA_SIMD_END
#include "simd.h"
typedef sk_vec_f32_avx512 sk_vf16;
typedef sk_ivec_f32_avx512 sk_vfi16;
typedef sk_vec_f64_avx512 sk_vd8;
typedef sk_ivec_f64_avx512 sk_vdi8;


/* the last step of pass 2: a + b, then its 4 lanes added in order (as the 4-lane builds do) */
SK_AVX512 static inline double sk_sum_lanes(__m256d a, __m256d b)
{
    double c[4];
    _mm256_storeu_pd(c, _mm256_add_pd(a, b));
    double s = 0.0;
    for (int l = 0; l < 4; l++) s += c[l];
    return s;
}

SK_AVX512 static void sk_lsm_f32_avx512(const float *x, ptrdiff_t n, float *y)
{
    enum { L = 16 };
    SK_LSM_HEAD(float, sk_vf16, sk_vfi16)
    __m512d s01 = _mm512_setzero_pd(), s23 = _mm512_setzero_pd();
    for (j = 0; j < n; j += 16) {
        sk_vf16 v;
        if (j + 16 <= n) {
            v = *(const sk_vf16 *)(x + j);
        } else {                       /* the tail, padded with -inf (exp 0) as elsewhere */
            float pad[16];
            for (int l = 0; l < 16; l++) pad[l] = j + l < n ? x[j + l] : ninf;
            v = *(const sk_vf16 *)pad;
        }
        __m512 e = (__m512)sk_vexp_softmax_f32_avx512(v - m);
        __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1));
        s01 = _mm512_add_pd(s01, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        s23 = _mm512_add_pd(s23, _mm512_cvtps_pd(hi));
    }
    /* (s0 + s1) + (s2 + s3), then its lanes in order */
    const double s = sk_sum_lanes(
        _mm256_add_pd(_mm512_castpd512_pd256(s01), _mm512_extractf64x4_pd(s01, 1)),
        _mm256_add_pd(_mm512_castpd512_pd256(s23), _mm512_extractf64x4_pd(s23, 1)));
    const float ls = (float)log(s);
    for (j = 0; j < n; j++) y[j] = (float)(x[j] - m) - ls;
}

SK_AVX512 static void sk_lsm_f64_avx512(const double *x, ptrdiff_t n, double *y)
{
    enum { L = 8 };
    SK_LSM_HEAD(double, sk_vd8, sk_vdi8)
    sk_vd8 s02 = (sk_vd8){0};        /* s0 | s2 of the 4-lane builds (their s1, s3 stay 0) */
    for (j = 0; j < n; j += 8) {
        sk_vd8 v;
        if (j + 8 <= n) {
            v = *(const sk_vd8 *)(x + j);
        } else {
            double pad[8];
            for (int l = 0; l < 8; l++) pad[l] = j + l < n ? x[j + l] : ninf;
            v = *(const sk_vd8 *)pad;
        }
        s02 += sk_vexp_softmax_f64_avx512(v - m);
    }
    const __m256d zero = _mm256_setzero_pd();
    const double s = sk_sum_lanes(_mm256_add_pd(_mm512_castpd512_pd256((__m512d)s02), zero),
                                  _mm256_add_pd(_mm512_extractf64x4_pd((__m512d)s02, 1), zero));
    const double ls = log(s);
    for (j = 0; j < n; j++) y[j] = (x[j] - m) - ls;
}
#endif
#else
SK_DEFINE_LSM(sk_lsm_f32_base, , float, , , f32)
SK_DEFINE_LSM(sk_lsm_f64_base, , double, , , f64)
#endif

/* ---------------------------------------------------------------------------------- top-k */

#define SK_BLOCK 16    /* elements per threshold test once the buffer is full */

/* a beats b, given that a comes later in the row: a NaN beats any number, a number beats a
 * number only when strictly greater (equal values keep the earlier element) */
#define SK_BEATS(a, b) ((a) > (b) || ((a) != (a) && (b) == (b)))

#define SK_TOPK(T, sfx, TARGET, HIT)                                                           \
    /* insert v (logical index i, later than all kept) into the sorted buffer of cnt < k or    \
     * cnt == k (then the last entry drops out); returns the new count */                      \
    TARGET SK_INLINE ptrdiff_t sk_insert_##sfx(T *bv, int64_t *bi, ptrdiff_t cnt, ptrdiff_t k, \
                                               T v, int64_t i)                                 \
    {                                                                                          \
        ptrdiff_t p = cnt < k ? cnt : k - 1;                                                   \
        while (p > 0 && SK_BEATS(v, bv[p - 1])) {                                              \
            bv[p] = bv[p - 1];                                                                 \
            bi[p] = bi[p - 1];                                                                 \
            p--;                                                                               \
        }                                                                                      \
        bv[p] = v;                                                                             \
        bi[p] = i;                                                                             \
        return cnt < k ? cnt + 1 : k;                                                          \
    }                                                                                          \
                                                                                               \
    TARGET static void sk_topk_##sfx(const T *x, ptrdiff_t nseg, ptrdiff_t seglen,               \
                                     ptrdiff_t seg_stride, const T *add, ptrdiff_t k,          \
                                     int64_t *idx, T *val)                                     \
    {                                                                                          \
        ptrdiff_t cnt = 0; /* the buffer is (val, idx)[0..cnt), best first */                  \
        if (k <= 0) return;                                                                    \
        for (ptrdiff_t s = 0; s < nseg; s++) {                                                 \
            const T *xs = x + s * seg_stride;                                                  \
            /* -0.0 is the identity of IEEE addition (x + -0 == x bit for bit, -0 included) */ \
            const T a = add ? add[s] : (T)-0.0;                                                \
            const int64_t base = (int64_t)s * (int64_t)seglen;                                 \
            ptrdiff_t j = 0;                                                                   \
            for (; j < seglen && cnt < k; j++) /* filling: every element enters */             \
                cnt = sk_insert_##sfx(val, idx, cnt, k, (T)(xs[j] + a), base + j);             \
            for (; j + SK_BLOCK <= seglen; j += SK_BLOCK) {                                    \
                /* !(v <= thr) holds for v > thr and for NaN on either side: a superset of     \
                 * the elements that may enter, decided exactly below */                       \
                if (!HIT(xs + j, a, val[k - 1])) continue;                                     \
                for (int l = 0; l < SK_BLOCK; l++) {                                           \
                    T v = (T)(xs[j + l] + a);                                                  \
                    if (SK_BEATS(v, val[k - 1]))                                               \
                        cnt = sk_insert_##sfx(val, idx, cnt, k, v, base + j + l);              \
                }                                                                              \
            }                                                                                  \
            for (; j < seglen; j++) {                                                          \
                T v = (T)(xs[j] + a);                                                          \
                if (SK_BEATS(v, val[k - 1])) cnt = sk_insert_##sfx(val, idx, cnt, k, v, base + j); \
            }                                                                                  \
        }                                                                                      \
    }

/* Does any of the SK_BLOCK values (T)(p[l] + a) fail to be <= thr (greater, or NaN on either
 * side)? The same exact comparison in every build, the wider ones in fewer instructions
 * (_CMP_NLE_UQ: "not less or equal", true for unordered operands). */
#define SK_HIT_PLAIN(T, sfx)                                                                   \
    SK_INLINE int sk_hit_##sfx(const T *p, T a, T thr)                                         \
    {                                                                                          \
        int hit = 0;                                                                           \
        for (int l = 0; l < SK_BLOCK; l++) hit |= !((T)(p[l] + a) <= thr);                     \
        return hit;                                                                            \
    }
SK_HIT_PLAIN(float, f32_base)
SK_HIT_PLAIN(double, f64_base)
SK_TOPK(float, f32_base, , sk_hit_f32_base)
SK_TOPK(double, f64_base, , sk_hit_f64_base)
#if FA_X86 && FA_GNU_VECTORS
SK_AVX2 SK_INLINE int sk_hit_f32_avx2(const float *p, float a, float thr)
{
    const __m256 va = _mm256_set1_ps(a), vt = _mm256_set1_ps(thr);
    __m256 c0 = _mm256_cmp_ps(_mm256_add_ps(_mm256_loadu_ps(p), va), vt, _CMP_NLE_UQ);
    __m256 c1 = _mm256_cmp_ps(_mm256_add_ps(_mm256_loadu_ps(p + 8), va), vt, _CMP_NLE_UQ);
    return _mm256_movemask_ps(_mm256_or_ps(c0, c1)) != 0;
}
SK_AVX2 SK_INLINE int sk_hit_f64_avx2(const double *p, double a, double thr)
{
    const __m256d va = _mm256_set1_pd(a), vt = _mm256_set1_pd(thr);
    __m256d c = _mm256_setzero_pd();
    for (int l = 0; l < SK_BLOCK; l += 4)
        c = _mm256_or_pd(c, _mm256_cmp_pd(_mm256_add_pd(_mm256_loadu_pd(p + l), va), vt,
                                          _CMP_NLE_UQ));
    return _mm256_movemask_pd(c) != 0;
}
SK_AVX512 SK_INLINE int sk_hit_f32_avx512(const float *p, float a, float thr)
{
    return _mm512_cmp_ps_mask(_mm512_add_ps(_mm512_loadu_ps(p), _mm512_set1_ps(a)),
                              _mm512_set1_ps(thr), _CMP_NLE_UQ) != 0;
}
SK_AVX512 SK_INLINE int sk_hit_f64_avx512(const double *p, double a, double thr)
{
    const __m512d va = _mm512_set1_pd(a), vt = _mm512_set1_pd(thr);
    return (_mm512_cmp_pd_mask(_mm512_add_pd(_mm512_loadu_pd(p), va), vt, _CMP_NLE_UQ)
            | _mm512_cmp_pd_mask(_mm512_add_pd(_mm512_loadu_pd(p + 8), va), vt, _CMP_NLE_UQ))
           != 0;
}
SK_TOPK(float, f32_avx2, SK_AVX2, sk_hit_f32_avx2)
SK_TOPK(double, f64_avx2, SK_AVX2, sk_hit_f64_avx2)
SK_TOPK(float, f32_avx512, SK_AVX512, sk_hit_f32_avx512)
SK_TOPK(double, f64_avx512, SK_AVX512, sk_hit_f64_avx512)
#endif

/* ---------------------------------------------------------------------------- dispatch */

#define SK_TABLE(name, sfx)                                                                    \
    static const sk_ops name = {sk_lsm_f32_##sfx, sk_lsm_f64_##sfx, sk_topk_f32_##sfx,         \
                                sk_topk_f64_##sfx};
SK_TABLE(sk_base, base)
FA_IF_X86(SK_TABLE(sk_avx2, avx2) SK_TABLE(sk_avx512, avx512))

const sk_ops *sk_ops_for(int level)
{
    /* no scalar build (the baseline one is plain C without vectors) and no avx2-wide one: their
     * levels run the baseline and the AVX2 build */
    FA_KERNELS_FOR(level, sk_base, sk_base, sk_avx2, sk_avx2, sk_avx512)
}

/* ---------------------------------------------------------------------------- the row loops */

#define SK_MIN_WORK 16384      /* elements per thread at least (a 32000-token row is one item) */

/* the work items of a rows x cols call: a thread per row, each with SK_MIN_WORK elements */
static ptrdiff_t sk_items(ptrdiff_t rows, ptrdiff_t cols)
{
    ptrdiff_t by_work = rows * cols / SK_MIN_WORK;
    return rows < by_work ? rows : by_work;
}

/* One call's rows: the arguments of sk_log_softmax_rows (topk 0) or of sk_topk_rows. */
typedef struct {
    int topk, isz;
    const void *x;
    ptrdiff_t cols, nseg, k;
    const void *add;
    int64_t *idx;
    void *out;                 /* log-softmax: y; top-k: val */
} sk_call;

static void sk_row(const sk_ops *ops, const sk_call *c, ptrdiff_t r)
{
    const ptrdiff_t n = c->cols, seglen = n / c->nseg, k = c->k;
    const char *x = (const char *)c->x + r * n * c->isz;
    const char *add = c->add ? (const char *)c->add + r * c->nseg * c->isz : NULL;
    char *out = (char *)c->out + r * (c->topk ? k : n) * c->isz;
    if (!c->topk && c->isz == 4)
        ops->log_softmax_row_f32((const float *)x, n, (float *)out);
    else if (!c->topk)
        ops->log_softmax_row_f64((const double *)x, n, (double *)out);
    else if (c->isz == 4)
        ops->topk_row_f32((const float *)x, c->nseg, seglen, seglen, (const float *)add, k,
                          c->idx + r * k, (float *)out);
    else
        ops->topk_row_f64((const double *)x, c->nseg, seglen, seglen, (const double *)add, k,
                          c->idx + r * k, (double *)out);
}

/* the rows of a call in parallel, each on one thread */
static void sk_rows(int level, ptrdiff_t rows, const sk_call *c, int n_threads)
{
    const sk_ops *ops = sk_ops_for(level);
    const fa_team_t team = fa_team_open(n_threads, sk_items(rows, c->cols));
#pragma omp parallel num_threads(team.n)
    {
        fa_team_place(&team);
#pragma omp for schedule(static)
        for (ptrdiff_t r = 0; r < rows; r++) sk_row(ops, c, r);
    }
}

void sk_log_softmax_rows(int level, int isz, const void *x, ptrdiff_t rows, ptrdiff_t n, void *y,
                         int n_threads)
{
    const sk_call c = {0, isz, x, n, 1, 0, NULL, NULL, y};
    sk_rows(level, rows, &c, n_threads);
}

void sk_topk_rows(int level, int isz, const void *x, ptrdiff_t rows, ptrdiff_t m, ptrdiff_t nseg,
                  const void *add, ptrdiff_t k, int64_t *idx, void *val, int n_threads)
{
    const sk_call c = {1, isz, x, m, nseg, k, add, idx, val};
    sk_rows(level, rows, &c, n_threads);
}
