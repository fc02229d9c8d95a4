/* fma_peak.c -- the machine's float32 multiply-add ceiling, for the roofline arithmetic beside
 * the benchmarks (bench/bench_peak.py compiles and runs it; not part of the package).
 *
 * Each thread runs CHAINS independent vfmadd chains on registers only (no memory traffic):
 * enough chains to cover the FMA latency (4 cycles) on two FMA ports. GFLOPS counts a
 * multiply-add as 2 flops. Usage: fma_peak WIDTH THREADS, WIDTH 256 (AVX2+FMA) or 512
 * (AVX-512F). */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#define CHAINS 12

__attribute__((target("avx512f"))) static float chains512(long iters)
{
    __m512 a[CHAINS];
    const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm512_set1_ps((float)i);
    for (long t = 0; t < iters; t++) {
#pragma GCC unroll 12
        for (int i = 0; i < CHAINS; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
    }
    __m512 s = a[0];
    for (int i = 1; i < CHAINS; i++) s = _mm512_add_ps(s, a[i]);
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static float chains256(long iters)
{
    __m256 a[CHAINS];
    const __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm256_set1_ps((float)i);
    for (long t = 0; t < iters; t++) {
#pragma GCC unroll 12
        for (int i = 0; i < CHAINS; i++) a[i] = _mm256_fmadd_ps(a[i], b, c);
    }
    __m256 s = a[0];
    for (int i = 1; i < CHAINS; i++) s = _mm256_add_ps(s, a[i]);
    float o[8];
    _mm256_storeu_ps(o, s);
    return o[0] + o[7];
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s 256|512 THREADS\n", argv[0]);
        return 2;
    }
    int width = atoi(argv[1]), nt = atoi(argv[2]);
    if ((width != 256 && width != 512) || nt < 1) return 2;
    const long iters = 50000000L;
    double best = 0;
    float sink = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = omp_get_wtime();
#pragma omp parallel num_threads(nt) reduction(+ : sink)
        sink += width == 512 ? chains512(iters) : chains256(iters);
        double dt = omp_get_wtime() - t0;
        double gf = (double)iters * CHAINS * (width / 32) * 2 * nt / dt / 1e9;
        if (gf > best) best = gf;
    }
    printf("%.1f\n", best);
    return sink == 12345.0f;   /* keeps the chains live */
}
