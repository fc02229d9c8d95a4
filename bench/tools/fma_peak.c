/* fma_peak.c -- the machine's float32 multiply-add ceiling and its memory read bandwidth, for
 * the roofline arithmetic beside the benchmarks (bench/tools/bench_peak.py compiles and runs it; not
 * part of the package).
 *
 * Each thread runs CHAINS independent vfmadd chains on registers only (no memory traffic):
 * enough chains to cover the FMA latency (4 cycles) on two FMA ports. GFLOPS counts a
 * multiply-add as 2 flops. Usage: fma_peak WIDTH THREADS, WIDTH 256 (AVX2+FMA) or 512
 * (AVX-512F).
 *
 * fma_peak bw THREADS MIB: read bandwidth in GB/s, summing a MIB-mebibyte float array (each
 * thread its own contiguous part, 256-bit loads, 4 accumulators), best of 5 passes; a buffer
 * far larger than the last-level cache measures DRAM. */
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

__attribute__((target("avx2"))) static float sum_part(const float *a, long n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (long i = 0; i + 32 <= n; i += 32) {
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps(a + i));
        s1 = _mm256_add_ps(s1, _mm256_loadu_ps(a + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_loadu_ps(a + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_loadu_ps(a + i + 24));
    }
    float o[8];
    _mm256_storeu_ps(o, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    return o[0] + o[7];
}

static int read_bw(int nt, long mib)
{
    long n = mib * 1024 * 1024 / 4;
    float *a = malloc((size_t)n * 4);
    if (a == NULL) return 3;
#pragma omp parallel for num_threads(nt)
    for (long i = 0; i < n; i++) a[i] = 1.0f;           /* first touch by the reading thread */
    double best = 0;
    float sink = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = omp_get_wtime();
#pragma omp parallel num_threads(nt) reduction(+ : sink)
        {
            long per = n / omp_get_num_threads(), i0 = per * omp_get_thread_num();
            sink += sum_part(a + i0, per);
        }
        double gbs = (double)n * 4 / (omp_get_wtime() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    printf("%.1f\n", best);
    free(a);
    return sink == 12345.0f;
}

int main(int argc, char **argv)
{
    if (argc == 4 && argv[1][0] == 'b') return read_bw(atoi(argv[2]), atol(argv[3]));
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
