/* gemm_microkernel.c -- the AVX2 GEMM register block alone, data in L1 / L2, to compare block
 * shapes on the machine at hand (not part of the package; an ad-hoc harness for the notes in
 * fastattn/_kernels/gemm_kernels.c).
 *
 * One register block of MR rows x NR = NV * 8 float columns, as gemm_tile.h's micro-kernel:
 * per k step NV panel loads, MR broadcasts of x from a packed sliver (element (r, k) at
 * x[k * MR + r]), MR * NV multiply-adds. The same panel (KC x NR) is run against NRB row
 * blocks in turn (panel in L1, x slivers from L1 / L2), repeatedly; prints GFLOP/s.
 *
 *   gcc -O2 -mavx2 -mfma -DMR=4 -DNV=3 bench/gemm_microkernel.c -o /tmp/mk && /tmp/mk 256 16
 *   gcc -O2 -mavx2 -mfma -DMR=6 -DNV=2 bench/gemm_microkernel.c -o /tmp/mk && /tmp/mk 256 16
 *
 * Zen 3, one core (FMA peak 91 GFLOP/s, bench/fma_peak.c), KC 256, 1 and 16 row blocks, two
 * runs each: 4 x 24 77-87 GFLOP/s, 6 x 16 65-78: four broadcasts per twelve multiply-adds
 * against six. Inside the real GEMM the block shape did not carry over (see
 * bench/results/ab_gemm_zen3.txt, 2026-12-01 22:50). */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifndef MR
#define MR 6
#endif
#ifndef NV
#define NV 2
#endif
#define NR (NV * 8)

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

__attribute__((noinline)) static void block(const float *xp, const float *panel, long kc,
                                            float *y, long y_rs)
{
    __m256 acc[MR][NV];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) acc[r][v] = _mm256_setzero_ps();
    for (long k = 0; k < kc; k++) {
        __m256 w[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) w[v] = _mm256_loadu_ps(panel + k * NR + 8 * v);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            __m256 b = _mm256_broadcast_ss(xp + k * MR + r);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[r][v] = _mm256_fmadd_ps(b, w[v], acc[r][v]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)
            _mm256_storeu_ps(y + r * y_rs + 8 * v,
                             _mm256_add_ps(_mm256_loadu_ps(y + r * y_rs + 8 * v), acc[r][v]));
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s KC ROW_BLOCKS\n", argv[0]);
        return 2;
    }
    long kc = atol(argv[1]);
    int nrb = atoi(argv[2]);
    float *xp = aligned_alloc(64, (size_t)nrb * MR * kc * 4 + 64);
    float *panel = aligned_alloc(64, (size_t)kc * NR * 4 + 64);
    float *y = aligned_alloc(64, (size_t)nrb * MR * NR * 4 + 64);
    for (long i = 0; i < (long)nrb * MR * kc; i++) xp[i] = 1e-3f * (i % 7);
    for (long i = 0; i < kc * NR; i++) panel[i] = 1e-3f * (i % 5);
    for (long i = 0; i < (long)nrb * MR * NR; i++) y[i] = 0;
    long reps = 3000000000L / (kc * nrb * MR * NR * 2) + 1;
    double t = now();
    for (long it = 0; it < reps; it++)
        for (int rb = 0; rb < nrb; rb++) block(xp + rb * MR * kc, panel, kc, y + rb * MR * NR, NR);
    t = now() - t;
    printf("MR %d NR %d KC %ld row blocks %d: %.1f GFLOP/s (checksum %g)\n", MR, NR, kc, nrb,
           2.0 * reps * kc * nrb * MR * NR / t / 1e9, y[MR * NR - 1]);
    return 0;
}
