/* vdpbf16ps_semantics.c -- what VDPBF16PS computes, measured: the harness behind
 * docs/bfloat16.md's definition of the bfloat16 GEMM's arithmetic (fastattn/_kernels/
 * bgemm_kernels.h). Needs a CPU with AVX-512 BF16 and GCC >= 10 or Clang >= 9:
 *
 *     gcc -O2 -o /tmp/vdp bench/studies/vdpbf16ps_semantics.c -lm && /tmp/vdp [lanes per mode]
 *
 * Random lanes (acc, x pair, w pair) in five modes -- operands near 1, every exponent,
 * operands near 2^-126, products near underflow, and sums built to land at 2^-126 -- go through
 * vdpbf16ps and through candidate definitions; it prints each candidate's mismatches (NaN
 * equal to NaN, any payload). fastattn's definition: per lane, the odd element's exact product
 * added first, each sum rounded to nearest even at 24 bits with an unbounded exponent and
 * flushed to a signed zero below 2^-126, inputs (the accumulator too) read with DAZ; the first
 * two lines are its implementations in bgemm_kernels.c. Then the three sums at the flush point
 * that tell that definition from an FMA whose (subnormal-rounded) result is flushed in software.
 * Exit status 0 when both implementations match everywhere. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float f_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t u_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bf(uint32_t h) { return f_of(h << 16); }
static float daz(float x) { return fabsf(x) < 0x1p-126f ? copysignf(0.0f, x) : x; }

__attribute__((target("avx512f,avx512bf16")))
static void hw(float *acc, const uint32_t *x, const uint32_t *w)
{
    __m512 c = _mm512_loadu_ps(acc);
    c = _mm512_dpbf16_ps(c, (__m512bh)_mm512_loadu_si512(x), (__m512bh)_mm512_loadu_si512(w));
    _mm512_storeu_ps(acc, c);
}

/* candidates, one lane: x, w pairs as 32-bit words (odd element high) */
__attribute__((target("fma")))
static float fma_soft_ftz(float acc, uint32_t x, uint32_t w, int odd_first, int ftz_mid,
                          int daz_acc)
{
    float xo = bf(x >> 16), wo = bf(w >> 16), xe = bf(x & 0xffff), we = bf(w & 0xffff);
    if (daz_acc) acc = daz(acc);
    if (odd_first) acc = fmaf(xo, wo, acc); else acc = fmaf(xe, we, acc);
    if (ftz_mid) acc = daz(acc);
    if (odd_first) acc = fmaf(xe, we, acc); else acc = fmaf(xo, wo, acc);
    return daz(acc);
}

static float one_rounding(float acc, uint32_t x, uint32_t w)
{
    long double s = (long double)daz(acc) + (long double)bf(x >> 16) * bf(w >> 16) +
                    (long double)bf(x & 0xffff) * bf(w & 0xffff);
    return daz((float)s);
}

static float step24(float acc, float a, float b)         /* bgemm_kernels.c's bg_step */
{
    double s = (double)acc + (double)a * (double)b, m = fabs(s);
    if (!(m < 0x1p-126)) return (float)s;
    if (m >= 0x1p-126 - 0x1p-151) return (float)copysign(0x1p-126, s);
    return (float)copysign(0.0, s);
}

static float ftz24(float acc, uint32_t x, uint32_t w)
{
    acc = step24(daz(acc), bf(x >> 16), bf(w >> 16));
    return step24(acc, bf(x & 0xffff), bf(w & 0xffff));
}

__attribute__((target("avx512f,fma"), noinline))
static void fma_mxcsr_body(float *acc, const uint32_t *x, const uint32_t *w)
{
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    __m512i a = _mm512_loadu_si512(x), b = _mm512_loadu_si512(w);
    __m512 c = _mm512_loadu_ps(acc);
    c = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(a, hi)),
                        _mm512_castsi512_ps(_mm512_and_si512(b, hi)), c);
    c = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(a, 16)),
                        _mm512_castsi512_ps(_mm512_slli_epi32(b, 16)), c);
    _mm512_storeu_ps(acc, c);
}

static void fma_mxcsr(float *acc, const uint32_t *x, const uint32_t *w)
{
    unsigned csr = _mm_getcsr();
    _mm_setcsr(0x8000u | 0x1f80u | 0x0040u);            /* bgemm_kernels.c's BG_CSR_FTZ */
    fma_mxcsr_body(acc, x, w);
    _mm_setcsr(csr);
}

static uint64_t rs = 88172645463325252ull;
static uint64_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return rs; }

/* a bfloat16 of the mode's range (no subnormals: fastattn's rounding flushes them) */
static uint32_t rbf(int mode)
{
    uint32_t e;
    switch (mode) {
    case 0: e = 120 + rnd() % 16; break;
    case 1: e = 1 + rnd() % 254; break;
    case 2: e = 1 + rnd() % 4; break;
    default: e = 60 + rnd() % 8; break;
    }
    uint32_t h = ((rnd() & 1) << 15) | (e << 7) | (rnd() & 127);
    return rnd() % 50 ? h : h & 0x8000;
}

#define N_CAND 7
static const char *names[N_CAND] = {
    "fastattn's definition, in double (the scalar variant's bg_step)",
    "fastattn's definition, two FMAs under MXCSR.FTZ (the avx2 / avx512 variants)",
    "FMAs, each float32 (subnormal-rounded) result flushed in software",
    "  the same, even product first", "  the same, no flush of the intermediate sum",
    "  the same, no DAZ on the accumulator", "one rounding of the three-term sum"};

int main(int argc, char **argv)
{
    long per_mode = argc > 1 ? atol(argv[1]) : 1000000, lanes = 0, band = 0, bad[N_CAND] = {0};
    float acc[16], r[16], f[16];
    uint32_t x[16], w[16];
    for (int mode = 0; mode < 5; mode++)
        for (long i = 0; i < per_mode; i += 16) {
            for (int j = 0; j < 16; j++) {
                int m = mode == 4 ? 3 : mode;
                x[j] = rbf(m) << 16 | rbf(m);
                w[j] = rbf(m) << 16 | rbf(m);
                if (mode == 4) {             /* the odd product cancelled to near 2^-126 */
                    float t = f_of(0x00800000u + (uint32_t)(rnd() % 64)) * (rnd() & 1 ? 1 : -1);
                    acc[j] = t - bf(x[j] >> 16) * bf(w[j] >> 16);
                } else {                     /* (k = 3: a subnormal accumulator, for DAZ) */
                    int k = rnd() % 4;
                    acc[j] = k == 0 ? f_of((uint32_t)rnd() & 0xff7fffffu)
                             : k == 1 ? -bf(x[j] >> 16) * bf(w[j] >> 16)
                             : k == 2 ? 0.0f : f_of((uint32_t)rnd() & 0x807fffffu);
                }
                if (!isfinite(acc[j]) || (mode == 4 && fabsf(acc[j]) < 0x1p-126f))
                    acc[j] = 0.0f;
                r[j] = f[j] = acc[j];
            }
            hw(r, x, w);
            fma_mxcsr(f, x, w);
            for (int j = 0; j < 16; j++) {
                float c[N_CAND] = {ftz24(acc[j], x[j], w[j]), f[j],
                                   fma_soft_ftz(acc[j], x[j], w[j], 1, 1, 1),
                                   fma_soft_ftz(acc[j], x[j], w[j], 0, 1, 1),
                                   fma_soft_ftz(acc[j], x[j], w[j], 1, 0, 1),
                                   fma_soft_ftz(acc[j], x[j], w[j], 1, 1, 0),
                                   one_rounding(acc[j], x[j], w[j])};
                for (int k = 0; k < N_CAND; k++)
                    bad[k] += !(u_of(c[k]) == u_of(r[j]) || (isnan(c[k]) && isnan(r[j])));
                band += fabsf(r[j]) <= 0x1p-126f;
                lanes++;
            }
        }
    printf("%ld lanes (%ld with a result of 0 or +-2^-126); mismatches with vdpbf16ps:\n", lanes,
           band);
    for (int k = 0; k < N_CAND; k++) printf("  %10ld  %s\n", bad[k], names[k]);
    /* where the flush's point of view shows: 2^-126 + x_e w_e with x_o w_o = 0 */
    const float cases[3][2] = {{0x1p-75f, -0x1p-76f}, {0x1p-75f, -0x1p-75f},
                               {0x1p-75f, -0x1.8p-76f}};
    printf("2^-126 - 2^-151, - 2^-150, - 0.75 * 2^-150: vdpbf16ps, definition, FMA + software "
           "flush\n");
    for (int i = 0; i < 3; i++) {
        uint32_t cx = u_of(cases[i][0]) >> 16, cw = u_of(cases[i][1]) >> 16;
        float one[16], base = 0x1p-126f;
        for (int j = 0; j < 16; j++) { one[j] = base; x[j] = cx; w[j] = cw; }
        hw(one, x, w);
        printf("  %a  %a  %a\n", one[0], ftz24(base, cx, cw), fma_soft_ftz(base, cx, cw, 1, 1, 1));
        bad[0] += u_of(one[0]) != u_of(ftz24(base, cx, cw));
    }
    return bad[0] || bad[1];
}
