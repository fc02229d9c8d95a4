/* search_kernels.h -- the per-row kernels of beam search that the Cython driver (_search.pyx)
 * runs over rows in parallel, per dtype:
 *   log_softmax_row   y = log(softmax(x)) over one row (y may be x)
 *   topk_row          indices (and values) of the k largest of one row, best first
 * One thread computes a whole row, always in the same order, so results do not depend on the
 * thread count. sk_init() picks the AVX-512 or AVX2 build where the CPU has it (same results:
 * nothing is fused in any build, and the lanes of the sums are fixed by the source, not by the
 * ISA). */
#ifndef FASTATTN_SEARCH_KERNELS_H
#define FASTATTN_SEARCH_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "simd.h"

/* The row kernels of the build sk_init() selected, per dtype:
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

extern sk_ops sk_ops_now;

/* Select the build of both kernels: the highest of level (0 baseline, 1 AVX2, 2 AVX-512F) that
 * the CPU has. Returns the level selected. */
int sk_init(int level);

#endif
