/* gemm_microkernel_avx512.c -- the AVX-512 GEMM register block alone (6 rows x 64 floats, as
 * gemm_tile.h's mk_full), to see how close to the FMA peak it can run with its operands in
 * L1 / L2, and whether the loop order or the x layout matters (not part of the package).
 *
 * Per k step: 4 panel loads, 6 broadcasts of x (rows x + r * K in place, or -DPACKED=1 a packed
 * sliver x[k * 6 + r]), 24 multiply-adds. NRB row blocks x NP panels of KC x 64, all of it
 * repeated; rows outer (each row block against every panel: the package's order) or panels
 * outer (each panel, in L1 at KC 128, against every row block).
 *
 *   gcc -O2 -mavx512f -mfma bench/gemm_microkernel_avx512.c -o /tmp/mk512
 *   taskset -c 1 /tmp/mk512 KC NRB K NP PANELS_OUTER      e.g. 256 16 512 4 0
 *   gcc -O2 -mavx512f -mfma -fopenmp bench/fma_peak.c -o /tmp/fp && taskset -c 1 /tmp/fp 512 1
 *
 * AVX-512 + AMX Xeon, 2026-12-02 afternoon, one core (FMA peak 216-220 GFLOP/s by fma_peak in
 * that phase of the host): rows outer KC 256 179-184 GFLOP/s, panels outer KC 128 171-176,
 * KC 128 rows outer 175, K = 2048 175-182, packed x 168-177: 78-84% whatever the order or
 * the layout; the k loop unrolled twice 186-190 (+3-5% here, nothing in the package's GEMM). */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define MR 6
#define NV 4
#define NR 64
#ifndef PACKED
#define PACKED 0
#endif

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

__attribute__((noinline)) static void block(const float *x, long x_rs, const float *panel, long kc,
                                            float *y, long y_rs)
{
    __m512 acc[MR][NV];
    const float *xp[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        xp[r] = x + r * x_rs;
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) acc[r][v] = _mm512_loadu_ps(y + r * y_rs + 16 * v);
    }
    for (long k = 0; k < kc; k++) {
        __m512 w[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) w[v] = _mm512_loadu_ps(panel + k * NR + 16 * v);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            __m512 b = _mm512_set1_ps(PACKED ? x[k * MR + r] : xp[r][k]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[r][v] = _mm512_fmadd_ps(b, w[v], acc[r][v]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) _mm512_storeu_ps(y + r * y_rs + 16 * v, acc[r][v]);
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: %s KC NRB K NP PANELS_OUTER\n", argv[0]);
        return 2;
    }
    long kc = atol(argv[1]), K = atol(argv[3]);
    int nrb = atoi(argv[2]), np = atoi(argv[4]), panels_outer = atoi(argv[5]);
    if (kc < 1 || K < kc || nrb < 1 || np < 1) {
        fprintf(stderr, "need KC >= 1, K >= KC, NRB >= 1, NP >= 1\n");
        return 2;
    }
    long M = (long)nrb * MR, y_rs = (long)np * NR;
    float *x = aligned_alloc(64, ((size_t)M * K * 4 + 63) / 64 * 64);
    float *panel = aligned_alloc(64, (size_t)np * kc * NR * 4);
    float *y = aligned_alloc(64, (size_t)M * y_rs * 4);
    if (!x || !panel || !y) return 1;
    for (long i = 0; i < M * K; i++) x[i] = 1e-3f * (i % 7);
    for (long i = 0; i < (long)np * kc * NR; i++) panel[i] = 1e-3f * (i % 5);
    for (long i = 0; i < M * y_rs; i++) y[i] = 0;
    /* a row block's x: rows in place (stride K), or its packed sliver (6 x KC) */
    long xs = PACKED ? MR * kc : MR * K, x_rs = PACKED ? 0 : K;
    long reps = 4000000000L / (kc * M * NR * np * 2) + 1;
    double t = now();
    for (long it = 0; it < reps; it++) {
        if (panels_outer) {
            for (int p = 0; p < np; p++)
                for (int rb = 0; rb < nrb; rb++)
                    block(x + rb * xs, x_rs, panel + p * kc * NR, kc, y + rb * MR * y_rs + p * NR, y_rs);
        } else {
            for (int rb = 0; rb < nrb; rb++)
                for (int p = 0; p < np; p++)
                    block(x + rb * xs, x_rs, panel + p * kc * NR, kc, y + rb * MR * y_rs + p * NR, y_rs);
        }
    }
    t = now() - t;
    printf("KC %ld, %d row blocks, K %ld, %d panels, %s, x %s: %.1f GFLOP/s (checksum %g)\n", kc,
           nrb, K, np, panels_outer ? "panels outer" : "rows outer", PACKED ? "packed" : "in place",
           2.0 * reps * kc * M * NR * np / t / 1e9, y[MR * NR - 1]);
    return 0;
}
