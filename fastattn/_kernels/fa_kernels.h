/* fa_kernels.h -- the tile micro-kernels the attention driver (fa_driver.c) calls, per dtype,
 * through one table per kernel set (fa_kernels_for(level), level: simd.h's ISA state). */
#ifndef FASTATTN_FA_KERNELS_H
#define FASTATTN_FA_KERNELS_H

#include <stddef.h>

#include "simd.h"   /* FA_ISA_* levels and fa_cpu_level() */

/* pack_v's flags */
#define FA_V_NONFINITE 1
#define FA_V_BIG 2

/* Columns of a packed key tile must be a multiple of these (the widest register block of any
 * ISA: 4 vectors of 16 floats / 8 doubles). */
#define FA_PAD_F32 64
#define FA_PAD_F64 32
/* Columns of the value / accumulator tiles (evp) only a multiple of the widest vector: the last
 * value panel may be narrower than NR (pack_v, pv_tile), so a 32-wide head does not pay for
 * 64 columns of P @ V. */
#define FA_PADV_F32 16
#define FA_PADV_F64 8

#define FA_DECLARE_OPS(T, sfx)                                                                  \
    typedef struct {                                                                            \
        void (*qk_tile)(const T *q_tile, ptrdiff_t q_rs, int nq, int E, const T *kt, int ncols, \
                        int nvalid, T scale, T *scores, T *rowmax);                             \
        void (*pv_tile)(const T *p, int p_rs, int nq, int nk, const T *vp, int nkp, int evp, T *acc, \
                        int skip_zero, const double *ca, const double *cb);                     \
        double (*row_update)(T *s, int n, int ncols, int lim, T rowmax, const unsigned char *bmask, \
                             const T *fmask, ptrdiff_t ms, double *m_io, double *l_io,          \
                             double *cb);                                                       \
        void (*row_weights)(const T *s, int n, int lim, const unsigned char *bmask,             \
                            const T *fmask, ptrdiff_t ms, double m, double inv_l, T *w);        \
        void (*softmax_row)(const T *x, int n, T *y);                                           \
        void (*pack_k)(const T *k, ptrdiff_t k_rs, int nk, int E, int ncols, T *kp);            \
        int (*pack_v)(const T *v, ptrdiff_t v_rs, int nk, int Ev, int evp, T *vp);              \
        void (*scale_rows)(T *acc, int evp, int nq, const double *alpha);                       \
        void (*store_rows)(const T *acc, int evp, int nq, int Ev, const double *l, T *out,      \
                           ptrdiff_t out_rs);                                                   \
        void (*qk_direct)(const T *q, ptrdiff_t q_rs, int nq, int E, const T *k, ptrdiff_t k_rs, \
                          int nk, T scale, T *scores, int ncols, T *rowmax);                    \
        void (*pv_direct)(const T *p, int p_rs, int nq, int nk, const T *v, ptrdiff_t v_rs,     \
                          int Ev, T *acc, int evp);                                             \
        void (*exp_array)(const T *x, ptrdiff_t n, T *y);                                       \
    } fa_ops_##sfx;

FA_DECLARE_OPS(float, f32)
FA_DECLARE_OPS(double, f64)

typedef struct {
    fa_ops_f32 f32;
    fa_ops_f64 f64;
} fa_kernels;

/* A table's ops from one fa_tile.h instance's functions (suffix sfx, e.g. f32_avx2): the
 * per-ISA tables (fa_kernels.c) and the portable ones (fa_portable.c) */
#define FA_TILE_OPS(sfx)                                                                       \
    {.qk_tile = qk_tile_##sfx, .pv_tile = pv_tile_##sfx, .row_update = row_update_##sfx,     \
     .row_weights = row_weights_##sfx, .softmax_row = softmax_row_##sfx,                    \
     .pack_k = pack_k_##sfx, .pack_v = pack_v_##sfx, .scale_rows = scale_rows_##sfx,         \
     .store_rows = store_rows_##sfx, .qk_direct = qk_direct_##sfx,                          \
     .pv_direct = pv_direct_##sfx, .exp_array = exp_array_##sfx}
#define FA_TABLE(name, isa) static const fa_kernels name = {FA_TILE_OPS(f32_##isa), FA_TILE_OPS(f64_##isa)};

/* The kernels of the set `level` (FA_ISA_*, one the CPU has: simd.h's state); with the
 * FA_ISA_PORTABLE flag, that set's portable instance (fa_portable.c). */
const fa_kernels *fa_kernels_for(int level);
const fa_kernels *fa_portable_kernels_for(int level);
/* exp(x) for x <= 0 in double, the same bits on every CPU and compiler (no libm: the portable
 * attention's online-softmax rescales and key-split merges); exp(-inf) = 0, NaN -> NaN */
double fa_exp_det(double x);

#endif
