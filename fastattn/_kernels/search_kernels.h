/* search_kernels.h -- the per-row kernels of beam search and the parallel loops over rows that
 * the Cython module (_search.pyx) calls, per dtype:
 *   log_softmax_row   y = log(softmax(x)) over one row (y may be x)
 *   topk_row          indices (and values) of the k largest of one row, best first
 * One thread computes a whole row, always in the same order, so results do not depend on the
 * thread count. There are a baseline, an AVX2 and an AVX-512 build (sk_ops_for picks the one of
 * the ISA state's level; same results: nothing is fused in any build, and the lanes of the
 * sums are fixed by the source, not by the ISA). */
#ifndef FASTATTN_SEARCH_KERNELS_H
#define FASTATTN_SEARCH_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "simd.h"

/* The row kernels of one build, per dtype:
 *   log_softmax_row(x, n, y)   y = log(softmax(x)) over one row of n >= 1 (y may be x)
 *   topk_row(x, nseg, seglen, seg_stride, add, k, idx, val)
 *       top k of the logical row  v[s * seglen + j] = x[s * seg_stride + j] + add[s]
 *       (s < nseg, j < seglen; add NULL: v = x), i.e. the concatenation of nseg segments, each
 *       shifted by its own addend (beam search: segments are a source's beams, add their
 *       running scores). idx[0..k) gets the logical indices, val[0..k) the values (also the
 *       working buffer). Order: NaN first (NaN ranks above every number, as in torch.topk),
 *       then by value descending, equal values (-0 == +0, -inf == -inf, NaN == NaN) by lower
 *       index first. Requires 0 <= k <= nseg * seglen. */
typedef struct {
    void (*log_softmax_row_f32)(const float *x, ptrdiff_t n, float *y);
    void (*log_softmax_row_f64)(const double *x, ptrdiff_t n, double *y);
    void (*topk_row_f32)(const float *x, ptrdiff_t nseg, ptrdiff_t seglen, ptrdiff_t seg_stride,
                         const float *add, ptrdiff_t k, int64_t *idx, float *val);
    void (*topk_row_f64)(const double *x, ptrdiff_t nseg, ptrdiff_t seglen, ptrdiff_t seg_stride,
                         const double *add, ptrdiff_t k, int64_t *idx, double *val);
} sk_ops;

/* The build of the kernel set `level` (FA_ISA_*, simd.h's state): scalar runs the baseline
 * build, avx2-wide the AVX2 one. */
const sk_ops *sk_ops_for(int level);

/* The row kernels over rows in parallel (a thread gets whole rows, at least 16384 elements),
 * the dtype by item size isz (4 or 8), with the build of `level`:
 *   sk_log_softmax_rows   y (rows, n) = log_softmax_row of each row of x (rows, n); y may be x
 *   sk_topk_rows          per row r of x (rows, m): topk_row with nseg segments of m / nseg,
 *                         add (rows, nseg) or NULL, into idx, val (rows, k) */
void sk_log_softmax_rows(int level, int isz, const void *x, ptrdiff_t rows, ptrdiff_t n, void *y,
                         int n_threads);
void sk_topk_rows(int level, int isz, const void *x, ptrdiff_t rows, ptrdiff_t m, ptrdiff_t nseg,
                  const void *add, ptrdiff_t k, int64_t *idx, void *val, int n_threads);

#endif
