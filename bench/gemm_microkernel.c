/* gemm_microkernel.c -- the GEMM register block alone, its operands in L1 / L2, to compare
 * block shapes, loop orders and x layouts on the machine at hand (not part of the package; an
 * ad-hoc harness for the notes in fastattn/_kernels/gemm_kernels.c).
 *
 * One register block of MR rows x NR = NV * W float columns (W = 8 for AVX2, 16 with -DZMM=1
 * for AVX-512), as gemm_tile.h's micro-kernel: per k step NV panel loads, MR broadcasts of x,
 * MR * NV multiply-adds, the block's partial sums loaded first and stored last. x is a packed
 * sliver per row block (element (r, k) at x[k * MR + r], -DPACKED=1, the default for AVX2)
 * or, -DPACKED=0 (the package's layout), rows in place with row stride K. NRB row blocks x NP
 * panels of KC x NR, all of it repeated: rows outer (each row block against every panel, the
 * package's order) or panels outer (each panel against every row block); prints GFLOP/s.
 *
 *   gcc -O2 -mavx2 -mfma -DMR=4 -DNV=3 bench/gemm_microkernel.c -o /tmp/mk && /tmp/mk 256 16
 *   gcc -O2 -mavx512f -mfma -DZMM=1 -DPACKED=0 bench/gemm_microkernel.c -o /tmp/mk512
 *   taskset -c 1 /tmp/mk512 256 16 512 4 0          (KC NRB [K NP PANELS_OUTER])
 *   gcc -O2 -mavx512f -mfma -fopenmp bench/fma_peak.c -o /tmp/fp && taskset -c 1 /tmp/fp 512 1
 *
 * Zen 3, one core (FMA peak 91 GFLOP/s, bench/fma_peak.c), KC 256, 1 and 16 row blocks, two
 * runs each: 4 x 24 77-87 GFLOP/s, 6 x 16 65-78: four broadcasts per twelve multiply-adds
 * against six. Inside the real GEMM the block shape did not carry over (see
 * bench/results/ab_gemm_zen3.txt, 2026-12-01 22:50).
 * AVX-512 + AMX Xeon, 2026-12-02 afternoon, one core (FMA peak 213-220 GFLOP/s by fma_peak in
 * that phase of the host), 6 x 64, x in place unless said: rows outer KC 256 178-184 GFLOP/s,
 * panels outer KC 128 171-176, KC 128 rows outer 175, K = 2048 175-182, packed x 168-179:
 * 78-84% whatever the order or the layout; the k loop unrolled twice 186-190 (+3-5% here,
 * nothing in the package's GEMM: bench/results/ab_gemm_avx512.txt). */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#if ZMM
#define W 16
typedef __m512 vec;
#define VLOADU _mm512_loadu_ps
#define VSTOREU _mm512_storeu_ps
#define VSET1 _mm512_set1_ps
#define VFMA _mm512_fmadd_ps
#ifndef NV
#define NV 4
#endif
#ifndef PACKED
#define PACKED 0
#endif
#else
#define W 8
typedef __m256 vec;
#define VLOADU _mm256_loadu_ps
#define VSTOREU _mm256_storeu_ps
#define VSET1 _mm256_set1_ps
#define VFMA _mm256_fmadd_ps
#ifndef NV
#define NV 2
#endif
#ifndef PACKED
#define PACKED 1
#endif
#endif
#ifndef MR
#define MR 6
#endif
#define NR (NV * W)

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

__attribute__((noinline)) static void block(const float *x, long x_rs, const float *panel, long kc,
                                            float *y, long y_rs)
{
    vec acc[MR][NV];
    const float *xp[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        xp[r] = x + r * x_rs;
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) acc[r][v] = VLOADU(y + r * y_rs + W * v);
    }
    for (long k = 0; k < kc; k++) {
        vec w[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) w[v] = VLOADU(panel + k * NR + W * v);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            vec b = VSET1(PACKED ? x[k * MR + r] : xp[r][k]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[r][v] = VFMA(b, w[v], acc[r][v]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) VSTOREU(y + r * y_rs + W * v, acc[r][v]);
}

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 6) {
        fprintf(stderr, "usage: %s KC ROW_BLOCKS [K PANELS PANELS_OUTER]\n", argv[0]);
        return 2;
    }
    long kc = atol(argv[1]), K = argc == 6 ? atol(argv[3]) : kc;
    int nrb = atoi(argv[2]), np = argc == 6 ? atoi(argv[4]) : 1;
    int panels_outer = argc == 6 ? atoi(argv[5]) : 0;
    if (kc < 1 || K < kc || nrb < 1 || np < 1) {
        fprintf(stderr, "need KC >= 1, K >= KC, ROW_BLOCKS >= 1, PANELS >= 1\n");
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
    /* a row block's x: its packed sliver (MR x KC), or its rows in place (stride K) */
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
    printf("MR %d NR %d KC %ld, %d row blocks, K %ld, %d panels, %s, x %s: %.1f GFLOP/s "
           "(checksum %g)\n", MR, NR, kc, nrb, K, np, panels_outer ? "panels outer" : "rows outer",
           PACKED ? "packed" : "in place", 2.0 * reps * kc * M * NR * np / t / 1e9,
           y[MR * NR - 1]);
    return 0;
}
