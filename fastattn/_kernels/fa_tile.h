/* fa_tile.h -- per-ISA tile micro-kernels, a template included once per (dtype, ISA).
 *
 * The includer defines simd.h's instance parameters (FA_IS_DOUBLE, FA_VW, FA_NAME, FA_TARGET,
 * optionally FA_VMAX; this header includes simd.h for them and ends the instance) and
 *   FA_MR      query rows per register block
 *   FA_NV      vectors per register block row; NR = FA_NV * FA_VW columns
 *
 * Everything here works on raw pointers to tiles that the Cython driver packed:
 *   q_tile  (nq, E)      query rows, row stride q_rs, last dim contiguous
 *   kt      (E, ncols)   a key tile, transposed and zero-padded to ncols (a multiple of NR)
 *   scores  (nq, ncols)  raw q.k dot products, later the probabilities P
 *   vp      (nk, evp)    a value tile, zero-padded to evp columns (a multiple of the widest
 *                        vector; panels of NR columns, the last one possibly narrower)
 *   acc     (nq, evp)    the un-normalised output accumulator
 * Vector code uses simd.h's generic vectors, so one source serves SSE2, AVX2 and AVX-512.
 */

#include "simd.h"
/* FA_LANES (the includer's, default FA_VW): the lane count of the sums across lanes (the
 * softmax's row sums, the decode path's dot products). An instance with FA_LANES > FA_VW keeps
 * FA_LANES / FA_VW vectors per sum, lane t of the FA_LANES-lane sum in vector t / FA_VW, and
 * folds them as an FA_LANES-lane butterfly would: the bits of an FA_LANES-wide instance at its
 * native width (the portable instances: 16 float / 8 double lanes on every ISA). */
#ifndef FA_LANES
#define FA_LANES FA_VW
#endif
#define FA_SUB (FA_LANES / FA_VW)
/* the double exp of the online-softmax rescale (x <= 0): libm's, or the includer's (the
 * portable instances: fa_exp_det) */
#ifndef FA_DEXP
#define FA_DEXP(x) exp(x)
#endif
#define FA_NR (FA_NV * FA_VW)

/* Packing, done once per key/value tile (not once per query block):
 *   kp  panels of NR key columns: kp[(c / NR) * E * NR + e * NR + c % NR] = k[c, e], zero for c >= nk
 *   vp  panels of NR value columns, the last one pw = min(NR, evp - c0) wide (a multiple of VW):
 *       vp[c0 * nk + j * pw + c - c0] = v[j, c] for the panel starting at column c0, zero for
 *       c >= Ev
 * so that both micro-kernels below stream through memory contiguously. */
#if FA_VW > 1
/* r[i][j] <-> r[j][i] for a VW x VW block held in VW vectors: log2(VW) stages, stage s swapping
 * the off-diagonal s x s sub-blocks of rows i and i + s (a lane t with bit s set takes the
 * partner's lane t - s, the partner's lane t - s ... t takes this lane t + s). */
#define FA_TA(s, t) (((t) & (s)) ? FA_VW + (t) - (s) : (t))
#define FA_TB(s, t) (((t) & (s)) ? FA_VW + (t) : (t) + (s))
#define FA_T2(F, s) F(s, 0), F(s, 1)
#define FA_T4(F, s) FA_T2(F, s), F(s, 2), F(s, 3)
#define FA_T8(F, s) FA_T4(F, s), F(s, 4), F(s, 5), F(s, 6), F(s, 7)
#define FA_T16(F, s) FA_T8(F, s), F(s, 8), F(s, 9), F(s, 10), F(s, 11), F(s, 12), F(s, 13), \
                     F(s, 14), F(s, 15)
#if FA_VW == 16
#define FA_TLIST FA_T16
#elif FA_VW == 8
#define FA_TLIST FA_T8
#elif FA_VW == 4
#define FA_TLIST FA_T4
#else
#define FA_TLIST FA_T2
#endif
#define FA_TSTAGE(s)                                                                 \
    for (int i = 0; i < FA_VW; i++)                                                  \
        if (!(i & (s))) {                                                            \
            V a = r[i], b = r[i + (s)];                                              \
            r[i] = __builtin_shufflevector(a, b, FA_TLIST(FA_TA, s));                \
            r[i + (s)] = __builtin_shufflevector(a, b, FA_TLIST(FA_TB, s));          \
        }
FA_TARGET static FA_ALWAYS_INLINE void FA_NAME(transpose)(V *r)
{
#if FA_VW >= 16
    FA_TSTAGE(8)
#endif
#if FA_VW >= 8
    FA_TSTAGE(4)
#endif
#if FA_VW >= 4
    FA_TSTAGE(2)
#endif
    FA_TSTAGE(1)
}
#undef FA_TSTAGE
#undef FA_TLIST
#undef FA_T2
#undef FA_T4
#undef FA_T8
#undef FA_T16
#undef FA_TA
#undef FA_TB
#endif

FA_TARGET static void FA_NAME(pack_k)(const FA_T *k, ptrdiff_t k_rs, int nk, int E, int ncols, FA_T *kp)
{
    for (int c0 = 0; c0 < ncols; c0 += FA_NR) {
        FA_T *panel = kp + (ptrdiff_t)c0 * E;
        int w = nk - c0 < FA_NR ? nk - c0 : FA_NR;
        if (w < FA_NR) memset(panel, 0, sizeof(FA_T) * (size_t)E * FA_NR);
        int j0 = 0;
#if FA_VW > 1
        /* VW keys x VW head elements at a time: VW row loads, an in-register transpose, VW
         * contiguous stores (the scalar loop below stored every element to its own line:
         * ~12% of an 8 x 8 x 128 x 128 x 64 call) */
        const int e_full = E / FA_VW * FA_VW;
        for (; j0 + FA_VW <= w; j0 += FA_VW) {
            const FA_T *kb = k + (c0 + j0) * k_rs;
            for (int e0 = 0; e0 < e_full; e0 += FA_VW) {
                V r[FA_VW];
                for (int i = 0; i < FA_VW; i++) r[i] = VLOAD(kb + i * k_rs + e0);
                FA_NAME(transpose)(r);
                for (int i = 0; i < FA_VW; i++) VSTORE(panel + (ptrdiff_t)(e0 + i) * FA_NR + j0, r[i]);
            }
            for (int jj = 0; jj < FA_VW; jj++)            /* head elements past the last vector */
                for (int e = e_full; e < E; e++) panel[e * FA_NR + j0 + jj] = kb[jj * k_rs + e];
        }
#endif
        for (int j = j0; j < w; j++) {
            const FA_T *krow = k + (c0 + j) * k_rs;
            for (int e = 0; e < E; e++) panel[e * FA_NR + j] = krow[e];
        }
    }
}

/* Returns flags about the value tile: FA_V_NONFINITE when it holds inf or NaN (then P @ V must
 * skip zero probabilities), FA_V_BIG when some |v| is so large that a tile's sum of up to 512
 * unnormalised p * v could overflow (then P is normalised before P @ V); both in fa_kernels.h. */
FA_TARGET static int FA_NAME(pack_v)(const FA_T *v, ptrdiff_t v_rs, int nk, int Ev, int evp, FA_T *vp)
{
#if FA_IS_DOUBLE
    const FA_T big = 1.7976931348623157e308 / 2048;
#else
    const FA_T big = 3.4028234663852886e38f / 2048;
#endif
    FA_T probe = 0, amax = 0;
#if FA_VW > 1
    V vprobe = (V){0}, vamax = (V){0};
    const VI absmask = (VI){0} + (FA_I)(((uint64_t)1 << (8 * sizeof(FA_T) - 1)) - 1);
#endif
    /* row by row (V is read in its own order, one row after the other), each row's columns
     * going to their panels */
    for (int j = 0; j < nk; j++) {
        const FA_T *vrow = v + j * v_rs;
        for (int c0 = 0; c0 < evp; c0 += FA_NR) {
            int pw = evp - c0 < FA_NR ? evp - c0 : FA_NR;
            int w = Ev - c0 < pw ? Ev - c0 : pw;
            FA_T *dst = vp + (ptrdiff_t)c0 * nk + (ptrdiff_t)j * pw;
#if FA_VW > 1
            if (w == pw) {
                for (int t = 0; t < pw / FA_VW; t++) {
                    V x = VLOAD(vrow + c0 + t * FA_VW);
                    VSTORE(dst + t * FA_VW, x);
                    vprobe += x * 0;                      /* inf * 0 and NaN * 0 are NaN */
                    V ax = (V)((VI)x & absmask);
                    vamax = (V)(((VI)vamax & ~(VI)(ax > vamax)) | ((VI)ax & (VI)(ax > vamax)));
                }
                continue;
            }
#endif
            for (int c = 0; c < pw; c++) {
                FA_T x = c < w ? vrow[c0 + c] : 0;
                dst[c] = x;
                probe += x * 0;
                FA_T ax = x < 0 ? -x : x;
                amax = ax > amax ? ax : amax;
            }
        }
    }
#if FA_VW > 1
    for (int t = 0; t < FA_VW; t++) {
        probe += vprobe[t];
        amax = vamax[t] > amax ? vamax[t] : amax;
    }
#endif
    return (probe != probe ? FA_V_NONFINITE : 0) | (amax > big ? FA_V_BIG : 0);
}

#if FA_VW > 1
/* One register block: `mr` (a compile-time constant after inlining) query rows against one
 * panel of NR packed key columns:
 *   scores[r, c] = scale * sum_e q[r, e] * k[c, e]   for the panel's NR columns, and
 *   vmax[r]      = max(vmax[r], those scores)        lane-wise; columns >= nvalid count as -inf.
 * Each step of e broadcasts one query element per row and does mr * nvv fused multiply-adds
 * against nvv contiguous loads of the panel (nvv = FA_NV but in the last panel, which computes
 * only its vectors that hold valid keys; its columns past them are left unwritten). The max
 * ignores NaN (it is vmaxps): a NaN score still reaches the output through exp and the row sum
 * (row_update). */
FA_TARGET static FA_ALWAYS_INLINE void
FA_NAME(qk_block)(const FA_T *qr, ptrdiff_t q_rs, const int mr, int E, const FA_T *panel,
                  FA_T scale, FA_T *scores, ptrdiff_t s_rs, V *vmax, int partial, const VI *valid,
                  const int nvv)
{
    const FA_T ninf = -(FA_T)INFINITY;
    V acc[FA_MR][FA_NV];
    const FA_T *qp[FA_MR];
    for (int r = 0; r < mr; r++) {
        qp[r] = qr + r * q_rs;
        for (int v = 0; v < nvv; v++) acc[r][v] = (V){0};
    }
    /* unrolled by 4: a head of 64 elements is a short loop, and its exit and bookkeeping were
     * a visible share (8 x 8 x 128 x 128 x 64, same process: +2-4%, +7% at L = S = 1024; 8 was
     * no better). Not for the 6 x 4-vector block (AVX-512): 24 accumulators and four panel
     * vectors leave two of 32 registers, and unrolled GCC spilled accumulators to the stack in
     * the loop; rolled it keeps them in registers (8 x 8 x 128 x 128 x 64, same process:
     * +10%, unrolled by 2 +1%; bench/results/bench_attention_small_xeon_amx.txt, end) */
#if FA_NV >= 4
#pragma GCC unroll 1
#else
#pragma GCC unroll 4
#endif
    for (int e = 0; e < E; e++) {
        V kv[FA_NV];
        for (int v = 0; v < nvv; v++) kv[v] = VLOAD(panel + (ptrdiff_t)e * FA_NR + v * FA_VW);
        for (int r = 0; r < mr; r++) {
            FA_T qe = qp[r][e];
            for (int v = 0; v < nvv; v++) acc[r][v] += qe * kv[v];
        }
    }
    for (int r = 0; r < mr; r++) {
        V m = vmax[r];
        for (int v = 0; v < nvv; v++) {
            V x = acc[r][v] * scale;
            VSTORE(scores + r * s_rs + v * FA_VW, x);
            if (partial) x = (V)(((VI)x & valid[v]) | ((VI)((V){0} + ninf) & ~valid[v]));
            m = VMAXSKIP(x, m);
        }
        vmax[r] = m;
    }
}

/* One register block: `mr` rows against one panel of nvv vectors of value columns (c0 ..
 * c0 + nvv VW; mr and nvv compile-time constants after inlining):
 * acc[r, c] = ca[r] * acc[r, c] + cb[r] * sum_{j < nk} p[r, j] * v[j, c]. */
FA_TARGET static FA_ALWAYS_INLINE void
FA_NAME(pv_block)(const FA_T *pr, int p_rs, const int mr, int nk, const FA_T *panel,
                  FA_T *acc, int evp, const double *ca, const double *cb, const int nvv)
{
    V a[FA_MR][FA_NV];
    const FA_T *pp[FA_MR];
    const int pw = nvv * FA_VW;
    for (int r = 0; r < mr; r++) {
        pp[r] = pr + (ptrdiff_t)r * p_rs;
        for (int v = 0; v < nvv; v++) a[r][v] = (V){0};
    }
#pragma GCC unroll 4                /* as in qk_block */
    for (int j = 0; j < nk; j++) {
        V vv[FA_NV];
        for (int v = 0; v < nvv; v++) vv[v] = VLOAD(panel + (ptrdiff_t)j * pw + v * FA_VW);
        for (int r = 0; r < mr; r++) {
            FA_T pj = pp[r][j];
            for (int v = 0; v < nvv; v++) a[r][v] += pj * vv[v];
        }
    }
    for (int r = 0; r < mr; r++) {
        FA_T car = (FA_T)ca[r], cbr = (FA_T)cb[r];
        for (int v = 0; v < nvv; v++) {
            FA_T *dst = acc + (ptrdiff_t)r * evp + v * FA_VW;
            VSTORE(dst, VLOAD(dst) * car + a[r][v] * cbr);
        }
    }
}

/* Dispatch a leftover row count (1 .. FA_MR - 1) to a block specialised for it. */
#define FA_REMAINDER(CALL, rem)                           \
    switch (rem) {                                        \
    case 1: CALL(1); break;                               \
    case 2: CALL(FA_MR > 2 ? 2 : 1); break;               \
    case 3: CALL(FA_MR > 3 ? 3 : 1); break;               \
    case 4: CALL(FA_MR > 4 ? 4 : 1); break;               \
    case 5: CALL(FA_MR > 5 ? 5 : 1); break;               \
    case 6: CALL(FA_MR > 6 ? 6 : 1); break;               \
    case 7: CALL(FA_MR > 7 ? 7 : 1); break;               \
    default: break;                                       \
    }

/* Dispatch a panel width of nvv vectors (1 .. FA_NV) to code specialised for it (widths above
 * FA_NV never occur; their cases only keep the labels distinct). */
#if FA_NV > 4
#error "FA_NV > 4: extend FA_WIDTHS"
#endif
#define FA_WIDTHS(CALL, nvv)                              \
    switch (nvv) {                                        \
    case 1: CALL(1); break;                               \
    case 2: CALL(FA_NV >= 2 ? 2 : 1); break;              \
    case 3: CALL(FA_NV >= 3 ? 3 : 1); break;              \
    case 4: CALL(FA_NV >= 4 ? 4 : 1); break;              \
    default: break;                                       \
    }

/* Every row block of P against one value panel of nvv vectors (a compile-time constant after
 * inlining); acc already offset to the panel's first column. */
FA_TARGET static FA_ALWAYS_INLINE void
FA_NAME(pv_rows)(const FA_T *p, int p_rs, int nq, int nk, const FA_T *panel, FA_T *acc, int evp,
                 const double *ca, const double *cb, const int nvv)
{
    int r0 = 0;
    for (; r0 + FA_MR <= nq; r0 += FA_MR)
        FA_NAME(pv_block)(p + (ptrdiff_t)r0 * p_rs, p_rs, FA_MR, nk, panel,
                          acc + (ptrdiff_t)r0 * evp, evp, ca + r0, cb + r0, nvv);
#define FA_PV_CALL(k) FA_NAME(pv_block)(p + (ptrdiff_t)r0 * p_rs, p_rs, k, nk, panel, \
                                        acc + (ptrdiff_t)r0 * evp, evp, ca + r0, cb + r0, nvv)
    FA_REMAINDER(FA_PV_CALL, nq - r0)
#undef FA_PV_CALL
}
#endif

#if FA_VW > 1
/* Every row block of the query rows against one key panel of nvv vectors (a compile-time
 * constant after inlining). */
FA_TARGET static FA_ALWAYS_INLINE void
FA_NAME(qk_rows)(const FA_T *qc, ptrdiff_t q_rs, int nr, int E, const FA_T *panel, FA_T scale,
                 FA_T *sc, int ncols, V *vmax, int partial, const VI *valid, const int nvv)
{
    int r0 = 0;
    for (; r0 + FA_MR <= nr; r0 += FA_MR)
        FA_NAME(qk_block)(qc + r0 * q_rs, q_rs, FA_MR, E, panel, scale, sc + (ptrdiff_t)r0 * ncols,
                          ncols, vmax + r0, partial, valid, nvv);
#define FA_QK_CALL(k) FA_NAME(qk_block)(qc + r0 * q_rs, q_rs, k, E, panel, scale, \
                                        sc + (ptrdiff_t)r0 * ncols, ncols, vmax + r0, partial, \
                                        valid, nvv)
    FA_REMAINDER(FA_QK_CALL, nr - r0)
#undef FA_QK_CALL
}
#endif

/* scores = scale * q_tile @ k_tile.T for r < nq, c < ncols (kp packed by pack_k), and
 * rowmax[r] = max over the nvalid real keys, NaN scores skipped (-inf if there is no other). */
FA_TARGET static void FA_NAME(qk_tile)(const FA_T *q_tile, ptrdiff_t q_rs, int nq, int E,
                                       const FA_T *kp, int ncols, int nvalid, FA_T scale,
                                       FA_T *scores, FA_T *rowmax)
{
#if FA_VW > 1
    /* panel-outer order: one packed key panel (E x NR) stays in L1 while every row block of
     * the query tile passes over it; the row maxima live in lane-wise vectors until the end */
    const FA_T ninf = -(FA_T)INFINITY;
    V vmax[128];
    VI lane;
    for (int t = 0; t < FA_VW; t++) lane[t] = t;
    for (int rc = 0; rc < nq; rc += 128) {
        int nr = nq - rc < 128 ? nq - rc : 128;
        const FA_T *qc = q_tile + rc * q_rs;
        FA_T *sc = scores + (ptrdiff_t)rc * ncols;
        for (int r = 0; r < nr; r++) vmax[r] = (V){0} + ninf;
        /* panels past the valid keys are not computed: columns cend .. ncols-1 of the scores
         * are left for the caller (row_update zeroes everything from its limit to ncols) */
        const int vend = (nvalid + FA_NR - 1) / FA_NR * FA_NR;   /* nvalid up to a panel */
        const int cend = vend < ncols ? vend : ncols;
        for (int c0 = 0; c0 < cend; c0 += FA_NR) {
            const FA_T *panel = kp + (ptrdiff_t)c0 * E;
            int partial = c0 + FA_NR > nvalid;
            VI valid[FA_NV];
            for (int v = 0; v < FA_NV; v++) valid[v] = (VI)((lane + (FA_I)(c0 + v * FA_VW)) < (FA_I)nvalid);
            /* the last panel only as far as its valid keys, in whole vectors (a causal row
             * group's keys, a short or ragged S): 16 keys of a 64-wide AVX-512 panel cost a
             * quarter of it */
            const int nvv = partial ? (nvalid - c0 + FA_VW - 1) / FA_VW : FA_NV;
#define FA_QK_WIDTH(w) FA_NAME(qk_rows)(qc, q_rs, nr, E, panel, scale, sc + c0, ncols, vmax, \
                                        partial, valid, w)
            FA_WIDTHS(FA_QK_WIDTH, nvv)
#undef FA_QK_WIDTH
        }
        for (int r = 0; r < nr; r++) {
            FA_T m = ninf;
            for (int t = 0; t < FA_VW; t++) m = vmax[r][t] > m ? vmax[r][t] : m;
            rowmax[rc + r] = m;
        }
    }
#else
    for (int r = 0; r < nq; r++) {
        FA_T m = -(FA_T)INFINITY;
        for (int c = 0; c < ncols; c++) {
            FA_T s = 0;
            for (int e = 0; e < E; e++) s += q_tile[r * q_rs + e] * kp[(ptrdiff_t)c * E + e];
            s *= scale;
            scores[(ptrdiff_t)r * ncols + c] = s;
            if (c < nvalid) m = s > m ? s : m;
        }
        rowmax[r] = m;
    }
#endif
}

/* acc[r, c] = ca[r] * acc[r, c] + cb[r] * sum_{j < nk} p[r, j] * v[j, c]  for r < nq, c < evp:
 * the online-softmax rescale of the accumulator fused into the P @ V epilogue (vp packed by
 * pack_v from nkp >= nk rows: a causal block may need only the first nk keys of a packed tile).
 * When skip_zero is set (the value tile holds inf or NaN), keys with p == 0 are left out per row
 * so that a masked-out non-finite value cannot turn 0 * inf into NaN. */
FA_TARGET static void FA_NAME(pv_tile)(const FA_T *p, int p_rs, int nq, int nk,
                                       const FA_T *vp, int nkp, int evp, FA_T *acc, int skip_zero,
                                       const double *ca, const double *cb)
{
#if FA_VW > 1
    if (!skip_zero) {
        /* panel-outer order: one packed value panel (nk x NR) stays in L1 while every row block
         * of P passes over it */
        for (int c0 = 0; c0 < evp; c0 += FA_NR) {
            const FA_T *panel = vp + (ptrdiff_t)c0 * nkp;
            int nvv = (evp - c0 < FA_NR ? evp - c0 : FA_NR) / FA_VW;
            /* the panel width as a compile-time constant: 1 .. FA_NV vectors */
#define FA_PV_WIDTH(w) FA_NAME(pv_rows)(p, p_rs, nq, nk, panel, acc + c0, evp, ca, cb, w)
            FA_WIDTHS(FA_PV_WIDTH, nvv)
#undef FA_PV_WIDTH
        }
        return;
    }
    for (int r0 = 0; r0 < nq; r0++) {
        const FA_T *pr = p + (ptrdiff_t)r0 * p_rs;
        FA_T car = (FA_T)ca[r0], cbr = (FA_T)cb[r0];
        for (int c0 = 0; c0 < evp; c0 += FA_NR) {
            const FA_T *panel = vp + (ptrdiff_t)c0 * nkp;
            const int pw = evp - c0 < FA_NR ? evp - c0 : FA_NR, nvv = pw / FA_VW;
            V a[FA_NV];
            for (int v = 0; v < nvv; v++) a[v] = (V){0};
            for (int j = 0; j < nk; j++) {
                FA_T pj = pr[j];
                if (pj == 0) continue;
                for (int v = 0; v < nvv; v++) a[v] += pj * VLOAD(panel + (ptrdiff_t)j * pw + v * FA_VW);
            }
            for (int v = 0; v < nvv; v++) {
                FA_T *dst = acc + (ptrdiff_t)r0 * evp + c0 + v * FA_VW;
                VSTORE(dst, VLOAD(dst) * car + a[v] * cbr);
            }
        }
    }
#else
    for (int r = 0; r < nq; r++)
        for (int c = 0; c < evp; c++) {
            FA_T s = 0;
            for (int j = 0; j < nk; j++) {
                FA_T pj = p[(ptrdiff_t)r * p_rs + j];
                if (skip_zero && pj == 0) continue;
                s += pj * vp[(ptrdiff_t)c * nkp + j];
            }
            acc[(ptrdiff_t)r * evp + c] = acc[(ptrdiff_t)r * evp + c] * (FA_T)ca[r] + s * (FA_T)cb[r];
        }
#endif
}

#if FA_VW > 1
/* The sum of a vector's lanes by a butterfly (lane t plus lane t ^ w, for w = VW/2 down to 1):
 * a fixed order, log2(VW) shuffle-add steps instead of VW - 1 dependent scalar adds. */
#define FA_X2(w) 0 ^ (w), 1 ^ (w)
#define FA_X4(w) FA_X2(w), 2 ^ (w), 3 ^ (w)
#define FA_X8(w) FA_X4(w), 4 ^ (w), 5 ^ (w), 6 ^ (w), 7 ^ (w)
#define FA_X16(w) FA_X8(w), 8 ^ (w), 9 ^ (w), 10 ^ (w), 11 ^ (w), 12 ^ (w), 13 ^ (w), 14 ^ (w), 15 ^ (w)
FA_TARGET static inline FA_T FA_NAME(hsum)(V a)
{
#if FA_VW == 16
    a += __builtin_shufflevector(a, a, FA_X16(8));
    a += __builtin_shufflevector(a, a, FA_X16(4));
    a += __builtin_shufflevector(a, a, FA_X16(2));
    a += __builtin_shufflevector(a, a, FA_X16(1));
#elif FA_VW == 8
    a += __builtin_shufflevector(a, a, FA_X8(4));
    a += __builtin_shufflevector(a, a, FA_X8(2));
    a += __builtin_shufflevector(a, a, FA_X8(1));
#elif FA_VW == 4
    a += __builtin_shufflevector(a, a, FA_X4(2));
    a += __builtin_shufflevector(a, a, FA_X4(1));
#elif FA_VW == 2
    a += __builtin_shufflevector(a, a, FA_X2(1));
#else
#error "FA_VW must be 1, 2, 4, 8 or 16"
#endif
    return a[0];
}
/* FA_SUB vectors of an FA_LANES-lane sum folded into one, as the first steps of an FA_LANES-lane
 * butterfly would (lanes t and t + FA_LANES / 2 first ...): hsum of the result is the
 * FA_LANES-lane hsum's number. FA_SUB = 1: the vector itself. */
FA_TARGET static FA_ALWAYS_INLINE V FA_NAME(fold)(V *a)
{
    for (int w = FA_SUB / 2; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) a[i] = a[i] + a[i + w];
    return a[0];
}
/* s[u] = hsum(a[u]) for four vectors at once, bit for bit: the same butterfly (every lane pair
 * added in the same tree), but with the four vectors' halves packed side by side, so that each
 * shuffle-add step works for several of them (VW = 16: 13 shuffles and adds for the four instead
 * of 4 x 8). Exact, since x + y == y + x in IEEE arithmetic. */
FA_TARGET static FA_ALWAYS_INLINE void FA_NAME(hsum4)(const V *a, FA_T *s)
{
#if FA_VW == 16
    /* lanes [0, 8): x's pairs (t, t + 8); lanes [8, 16): y's */
#define FA_PAIRS16(x, y)                                                                     \
    (__builtin_shufflevector(x, y, 0, 1, 2, 3, 4, 5, 6, 7, 24, 25, 26, 27, 28, 29, 30, 31)    \
     + __builtin_shufflevector(x, y, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23))
    V b01 = FA_PAIRS16(a[0], a[1]), b23 = FA_PAIRS16(a[2], a[3]);
#undef FA_PAIRS16
    /* quarters: a0, a2, a1, a3, each its pairs (t, t + 4) of the step before */
    V c = __builtin_shufflevector(b01, b23, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11,
                                  24, 25, 26, 27)
        + __builtin_shufflevector(b01, b23, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15,
                                  28, 29, 30, 31);
    c += __builtin_shufflevector(c, c, FA_X16(2));
    c += __builtin_shufflevector(c, c, FA_X16(1));
    s[0] = c[0];
    s[1] = c[8];
    s[2] = c[4];
    s[3] = c[12];
#elif FA_VW == 8
#define FA_PAIRS8(x, y) (__builtin_shufflevector(x, y, 0, 1, 2, 3, 12, 13, 14, 15)          \
                         + __builtin_shufflevector(x, y, 4, 5, 6, 7, 8, 9, 10, 11))
    V b01 = FA_PAIRS8(a[0], a[1]), b23 = FA_PAIRS8(a[2], a[3]);
#undef FA_PAIRS8
    V c = __builtin_shufflevector(b01, b23, 0, 1, 8, 9, 4, 5, 12, 13)
        + __builtin_shufflevector(b01, b23, 2, 3, 10, 11, 6, 7, 14, 15);
    c += __builtin_shufflevector(c, c, FA_X8(1));
    s[0] = c[0];
    s[1] = c[4];
    s[2] = c[2];
    s[3] = c[6];
#elif FA_VW == 4
    V b01 = __builtin_shufflevector(a[0], a[1], 0, 1, 6, 7)
          + __builtin_shufflevector(a[0], a[1], 2, 3, 4, 5);
    V b23 = __builtin_shufflevector(a[2], a[3], 0, 1, 6, 7)
          + __builtin_shufflevector(a[2], a[3], 2, 3, 4, 5);
    V c = __builtin_shufflevector(b01, b23, 0, 4, 2, 6)
        + __builtin_shufflevector(b01, b23, 1, 5, 3, 7);
    s[0] = c[0];
    s[1] = c[2];
    s[2] = c[1];
    s[3] = c[3];
#else
    V b01 = __builtin_shufflevector(a[0], a[1], 0, 3) + __builtin_shufflevector(a[0], a[1], 1, 2);
    V b23 = __builtin_shufflevector(a[2], a[3], 0, 3) + __builtin_shufflevector(a[2], a[3], 1, 2);
    s[0] = b01[0];
    s[1] = b01[1];
    s[2] = b23[0];
    s[3] = b23[1];
#endif
}

#undef FA_X2
#undef FA_X4
#undef FA_X8
#undef FA_X16
#endif

/* Few query rows (decode): each key and value row is used by so few queries that packing it
 * would cost as much as the arithmetic, so these read K and V in place.
 *   scores[r, j] = sum_e q[r, e] * k[j, e]      (vectorised along e, 4 keys at a time)
 *   acc[r, c]   += sum_j p[r, j] * v[j, c]      (vectorised along c; p == 0 skipped, so a
 *                                                masked-out inf/NaN value never enters)
 * Query rows go in groups of up to FA_DG for the scores and FA_DGP for P @ V (as many as keep
 * their accumulators in registers: 6 and 6 where the ISA has 32 vector registers, else 2 and
 * 4), the rows left over as one smaller group: each key or value vector is loaded once for the
 * whole group (beam search's rows of one source share the cross-attention keys: 5 beams are one
 * group, where 4 + 1 read every key twice and 1 x 5 five times). Every (row, key) and (row,
 * column) keeps the arithmetic it has alone, in the same order, so a row's bits do not depend
 * on the group it lands in or on how many rows there are. */
#if FA_NV >= 4
#define FA_DG 6
#define FA_DGP 6
#else
#define FA_DG 2
#define FA_DGP 4
#endif
/* keys and values are read FA_DPF rows ahead of their use: a decode step's cross-attention
 * reads each layer's keys and values (6 MB for Whisper base) from memory once, after the GEMMs
 * between two layers have pushed them out of the caches, and the hardware's stream prefetch
 * alone left the loads waiting */
#ifndef FA_DPF
#define FA_DPF 16
#endif
FA_TARGET static FA_ALWAYS_INLINE void FA_NAME(prefetch_row)(const FA_T *row, int n)
{
    for (int b = 0; b < n * (int)sizeof(FA_T); b += 64) FA_PREFETCH((const char *)row + b, 3);
}
/* call F(g, row0) for groups of `max` rows, then one group of the nq % max rows left, g a
 * constant in every call (max <= 6). The remainder is below max, so each `if` holds whenever
 * its case is reached; it is there so that a group larger than the instance's arrays is dead
 * code the compiler can see. */
#define FA_GROUPS(nq, max, F)                                                               \
    do {                                                                                    \
        int r0_ = 0;                                                                        \
        for (; r0_ + (max) <= (nq); r0_ += (max)) F(max, r0_);                             \
        switch ((nq) - r0_) {                                                               \
        case 5: if ((max) > 5) { F(5, r0_); break; } /* fall through */                     \
        case 4: if ((max) > 4) { F(4, r0_); break; } /* fall through */                     \
        case 3: if ((max) > 3) { F(3, r0_); break; } /* fall through */                     \
        case 2: if ((max) > 2) { F(2, r0_); break; } /* fall through */                     \
        case 1: for (; r0_ < (nq); r0_++) F(1, r0_); break;                                 \
        default: break;                                                                     \
        }                                                                                   \
    } while (0)

/* the dot products of g rows (g a constant after inlining) with the tile's nk keys */
FA_TARGET static FA_ALWAYS_INLINE void
FA_NAME(qk_group)(const FA_T *q, ptrdiff_t q_rs, const int g, int E, const FA_T *k, ptrdiff_t k_rs,
                  int nk, FA_T *scores, int ncols)
{
    int j = 0;
#if FA_VW > 1
    for (; j + 4 <= nk; j += 4) {
        const FA_T *kr[4] = {k + j * k_rs, k + (j + 1) * k_rs, k + (j + 2) * k_rs,
                             k + (j + 3) * k_rs};
        if (j + FA_DPF + 4 <= nk)
            for (int u = 0; u < 4; u++) FA_NAME(prefetch_row)(kr[u] + FA_DPF * k_rs, E);
        V a[FA_DG][4][FA_SUB];
        for (int r = 0; r < g; r++)
            for (int u = 0; u < 4; u++)
                for (int i = 0; i < FA_SUB; i++) a[r][u][i] = (V){0};
        int e = 0;
        for (; e + FA_LANES <= E; e += FA_LANES)
            for (int i = 0; i < FA_SUB; i++) {
                V kv[4];
                for (int u = 0; u < 4; u++) kv[u] = VLOAD(kr[u] + e + i * FA_VW);
                for (int r = 0; r < g; r++) {
                    V qv = VLOAD(q + r * q_rs + e + i * FA_VW);
                    for (int u = 0; u < 4; u++) a[r][u][i] += qv * kv[u];
                }
            }
        for (int r = 0; r < g; r++) {
            const FA_T *qr = q + r * q_rs;
            FA_T s[4];
            V f[4];
            for (int u = 0; u < 4; u++) f[u] = FA_NAME(fold)(a[r][u]);
            FA_NAME(hsum4)(f, s);
            for (int e2 = e; e2 < E; e2++)
                for (int u = 0; u < 4; u++) s[u] += qr[e2] * kr[u][e2];
            for (int u = 0; u < 4; u++) scores[(ptrdiff_t)r * ncols + j + u] = s[u];
        }
    }
    /* the last nk % 4 keys one at a time, with exactly the arithmetic of the loop above, so
     * a key's score does not depend on how many keys follow it (a padded batch gives every
     * row the bits it gets alone) */
    for (; j < nk; j++) {
        const FA_T *kj = k + j * k_rs;
        V a[FA_DG][FA_SUB];
        for (int r = 0; r < g; r++)
            for (int i = 0; i < FA_SUB; i++) a[r][i] = (V){0};
        int e = 0;
        for (; e + FA_LANES <= E; e += FA_LANES)
            for (int i = 0; i < FA_SUB; i++) {
                V kv = VLOAD(kj + e + i * FA_VW);
                for (int r = 0; r < g; r++) a[r][i] += VLOAD(q + r * q_rs + e + i * FA_VW) * kv;
            }
        for (int r = 0; r < g; r++) {
            const FA_T *qr = q + r * q_rs;
            FA_T s0 = FA_NAME(hsum)(FA_NAME(fold)(a[r]));
            for (int e2 = e; e2 < E; e2++) s0 += qr[e2] * kj[e2];
            scores[(ptrdiff_t)r * ncols + j] = s0;
        }
    }
#else
    for (; j < nk; j++) {
        const FA_T *kj = k + j * k_rs;
        for (int r = 0; r < g; r++) {
            const FA_T *qr = q + r * q_rs;
            FA_T s0 = 0;
            for (int e = 0; e < E; e++) s0 += qr[e] * kj[e];
            scores[(ptrdiff_t)r * ncols + j] = s0;
        }
    }
#endif
}

FA_TARGET static void FA_NAME(qk_direct)(const FA_T *q, ptrdiff_t q_rs, int nq, int E,
                                         const FA_T *k, ptrdiff_t k_rs, int nk, FA_T scale,
                                         FA_T *scores, int ncols, FA_T *rowmax)
{
#define FA_QK(g, r0) FA_NAME(qk_group)(q + (r0) * q_rs, q_rs, g, E, k, k_rs, nk,             \
                                     scores + (ptrdiff_t)(r0) * ncols, ncols)
    FA_GROUPS(nq, FA_DG, FA_QK);
#undef FA_QK
    /* scale, row maximum (NaN skipped, as the micro-kernels' is) and a NaN flag, in vectors: a
     * scalar pass here held a fifth of a 5-row decode call's time in its max chain. The maximum
     * is the same number in any order (only the sign of a zero maximum could differ, and
     * exp(s - m) and the (m, l) merges treat +0 and -0 alike). */
    for (int r = 0; r < nq; r++) {
        FA_T *srow = scores + (ptrdiff_t)r * ncols;
        FA_T m = -(FA_T)INFINITY;
        int nan = 0;
        int j = 0;
#if FA_VW > 1
        const V vs = VSPLAT(scale);
        V vm = VSPLAT(-INFINITY);
        VI vn = (VI){0};
        for (; j + FA_VW <= nk; j += FA_VW) {
            V x = VLOAD(srow + j) * vs;
            VSTORE(srow + j, x);
            vm = VMAXSKIP(x, vm);
            vn |= (VI)(x != x);
        }
        for (int t = 0; t < FA_VW; t++) m = vm[t] > m ? vm[t] : m;
        nan = VANY(vn != 0);
#endif
        for (; j < nk; j++) {
            FA_T x = srow[j] * scale;
            srow[j] = x;
            m = x > m ? x : m;
            nan |= x != x;
        }
        rowmax[r] = nan ? (FA_T)NAN : m;
    }
}

/* acc rows of g query rows (g a constant after inlining) += their P rows @ the tile's values.
 * Per row and column: the tile's sum_j p[j] v[j, c] in registers (keys in order, p == 0
 * skipped), then added to acc once; columns in blocks of NR, then single vectors, then
 * scalars, each column with the same arithmetic. */
FA_TARGET static FA_ALWAYS_INLINE void
FA_NAME(pv_group)(const FA_T *p, int p_rs, const int g, int nk, const FA_T *v, ptrdiff_t v_rs,
                  int Ev, FA_T *acc, int evp)
{
    int c = 0;
#if FA_VW > 1
    for (; c + FA_NR <= Ev; c += FA_NR) {
        V a[FA_DGP][FA_NV];
        for (int r = 0; r < g; r++)
            for (int t = 0; t < FA_NV; t++) a[r][t] = (V){0};
        for (int j = 0; j < nk; j++) {
            const FA_T *vj = v + j * v_rs + c;
            if (j + FA_DPF < nk) FA_NAME(prefetch_row)(vj + FA_DPF * v_rs, FA_NR);
            V vv[FA_NV];
            for (int t = 0; t < FA_NV; t++) vv[t] = VLOAD(vj + t * FA_VW);
            for (int r = 0; r < g; r++) {
                FA_T pj = p[(ptrdiff_t)r * p_rs + j];
                if (pj == 0) continue;
                for (int t = 0; t < FA_NV; t++) a[r][t] += pj * vv[t];
            }
        }
        for (int r = 0; r < g; r++) {
            FA_T *ar = acc + (ptrdiff_t)r * evp + c;
            for (int t = 0; t < FA_NV; t++)
                VSTORE(ar + t * FA_VW, VLOAD(ar + t * FA_VW) + a[r][t]);
        }
    }
    for (; c + FA_VW <= Ev; c += FA_VW) {
        V a[FA_DGP];
        for (int r = 0; r < g; r++) a[r] = (V){0};
        for (int j = 0; j < nk; j++) {
            V vv = VLOAD(v + j * v_rs + c);
            for (int r = 0; r < g; r++) {
                FA_T pj = p[(ptrdiff_t)r * p_rs + j];
                if (pj == 0) continue;
                a[r] += pj * vv;
            }
        }
        for (int r = 0; r < g; r++) {
            FA_T *ar = acc + (ptrdiff_t)r * evp + c;
            VSTORE(ar, VLOAD(ar) + a[r]);
        }
    }
#endif
    for (; c < Ev; c++) {
        for (int r = 0; r < g; r++) {
            const FA_T *pr = p + (ptrdiff_t)r * p_rs;
            FA_T a = 0;
            for (int j = 0; j < nk; j++) {
                FA_T pj = pr[j];
                if (pj == 0) continue;
                a += pj * v[j * v_rs + c];
            }
            acc[(ptrdiff_t)r * evp + c] += a;
        }
    }
}

FA_TARGET static void FA_NAME(pv_direct)(const FA_T *p, int p_rs, int nq, int nk,
                                         const FA_T *v, ptrdiff_t v_rs, int Ev, FA_T *acc, int evp)
{
#define FA_PV(g, r0) FA_NAME(pv_group)(p + (ptrdiff_t)(r0) * p_rs, p_rs, g, nk, v, v_rs, Ev, \
                                     acc + (ptrdiff_t)(r0) * evp, evp)
    FA_GROUPS(nq, FA_DGP, FA_PV);
#undef FA_PV
}
#undef FA_DG
#undef FA_DGP
#undef FA_GROUPS

/* acc[r, :] *= alpha[r] for rows whose running maximum moved; out[r, :Ev] = acc[r, :] * inv_l. */
FA_TARGET static void FA_NAME(scale_rows)(FA_T *acc, int evp, int nq, const double *alpha)
{
    for (int r = 0; r < nq; r++) {
        if (alpha[r] == 1.0) continue;
        FA_T a = (FA_T)alpha[r];
        FA_T *row = acc + (ptrdiff_t)r * evp;
        for (int c = 0; c < evp; c++) row[c] *= a;
    }
}

/* out[r, :Ev] = acc[r, :Ev] for r < nq (row strides evp and out_rs), zeros in a row that
 * allowed no key (l[r] == 0): the item's last step, in vectors. Compiled with the driver for
 * the baseline ISA, the loop held ~4% of an 8 x 8 x 128 x 128 x 64 call's samples on AVX-512;
 * here the call is 1% faster (same process, outputs byte-identical). */
FA_TARGET static void FA_NAME(store_rows)(const FA_T *acc, int evp, int nq, int Ev,
                                          const double *l, FA_T *out, ptrdiff_t out_rs)
{
    for (int r = 0; r < nq; r++) {
        const FA_T *a = acc + (ptrdiff_t)r * evp;
        FA_T *o = out + r * out_rs;
        const FA_T f = l[r] == 0.0 ? 0 : 1;
        int c = 0;
#if FA_VW > 1
        for (; c + FA_VW <= Ev; c += FA_VW) VSTORE(o + c, VLOAD(a + c) * f);
#endif
        for (; c < Ev; c++) o[c] = a[c] * f;
    }
}

/* Pass 1 of a row, on scores the micro-kernel already scaled: s_j <- s_j (+ additive mask), or
 * -inf where key j is not allowed (keys j >= lim for causal; bmask uint8 with 1 = allowed; fmask
 * additive with -inf = not allowed; both optional, column stride ms). Masked entries become -inf
 * by selection, never by addition, so NaN or inf in a masked-out key cannot leak. Returns the
 * row maximum: NaN when an allowed entry is NaN under a mask; without one (causal rows) NaN is
 * skipped, as in the micro-kernel. Shared by the forward pass and the weights
 * pass so both see the very same scores. */
FA_TARGET static inline FA_T FA_NAME(mask_max)(FA_T *s, int lim, const unsigned char *bmask,
                                               const FA_T *fmask, ptrdiff_t ms)
{
    const FA_T ninf = -(FA_T)INFINITY;
    FA_T mx = ninf;
    int nan = 0;
    if (bmask) {
        for (int j = 0; j < lim; j++) {
            FA_T x = bmask[j * ms] ? s[j] : ninf;
            s[j] = x;
            mx = x > mx ? x : mx;
            nan |= x != x;
        }
    } else if (fmask) {
        for (int j = 0; j < lim; j++) {
            FA_T a = fmask[j * ms];
            FA_T x = (a == ninf) ? ninf : s[j] + a;
            s[j] = x;
            mx = x > mx ? x : mx;
            nan |= x != x;
        }
    } else {
        /* causal rows only shorten the row: no NaN check needed here (the max skips NaN, which
         * reaches the output through exp and the sum, or row_update's all-NaN check) */
        int j = 0;
#if FA_VW > 1
        V vm = (V){0} + ninf;
        for (; j + FA_VW <= lim; j += FA_VW) vm = VMAXSKIP(VLOAD(s + j), vm);
        for (int t = 0; t < FA_VW; t++) mx = vm[t] > mx ? vm[t] : mx;
#endif
        for (; j < lim; j++) mx = s[j] > mx ? s[j] : mx;
    }
    return nan ? (FA_T)NAN : mx;
}

/* s[j] <- exp(s[j] - mf) for j < lim, returning the sum (kept in the vector lanes until the end). */
FA_TARGET static inline FA_T FA_NAME(exp_sub_sum)(FA_T *s, int lim, FA_T mf)
{
    FA_T sum = 0;
#if FA_VW > 1
    const FA_T ninf = -(FA_T)INFINITY;
    V vsum[FA_SUB];
    for (int i = 0; i < FA_SUB; i++) vsum[i] = (V){0};
    int j = 0;
    for (; j + FA_LANES <= lim; j += FA_LANES)
        for (int i = 0; i < FA_SUB; i++) {
            V p = FA_NAME(vexp_softmax)(VLOAD(s + j + i * FA_VW) - mf);
            VSTORE(s + j + i * FA_VW, p);
            vsum[i] += p;
        }
    if (j < lim) {
        /* the tail: pad FA_LANES lanes with -inf so the same code finishes the row */
        for (int i = 0; i < FA_SUB; i++) {
            const int j0 = j + i * FA_VW;
            V x = (V){0} + ninf;
            for (int k = 0; k < FA_VW && j0 + k < lim; k++) x[k] = s[j0 + k] - mf;
            V p = FA_NAME(vexp_softmax)(x);
            for (int k = 0; k < FA_VW && j0 + k < lim; k++) s[j0 + k] = p[k];
            vsum[i] += p;
        }
    }
    for (int i = 0; i < FA_SUB; i++)
        for (int k = 0; k < FA_VW; k++) sum += vsum[i][k];
#else
    for (int j = 0; j < lim; j++) {
        FA_T p = (FA_T)exp((double)(s[j] - mf));
        s[j] = p;
        sum += p;
    }
#endif
    return sum;
}

/* One row of one tile, the online-softmax step (FlashAttention's recurrence), for an
 * accumulator kept normalised (so it never grows past max|v|, even near the float limits):
 *   s_j   <- s_j + mask_j                    (or -inf where the key is not allowed)
 *   m_new  = max(m_old, max_j s_j)
 *   p_j    = exp(s_j - m_new)                (written back into s)
 *   l_new  = l_old * exp(m_old - m_new) + sum_j p_j
 * Returns ca = l_old * exp(m_old - m_new) / l_new and sets *cb = 1 / l_new: the new accumulator
 * row is ca * acc + cb * (p @ v). A NaN score in an allowed position makes m, l (and so the
 * row's output) NaN. Entries lim .. ncols-1 (masked by causality, or padding) are set to 0. */
FA_TARGET static double FA_NAME(row_update)(FA_T *s, int n, int ncols, int lim, FA_T rowmax,
                                            const unsigned char *bmask, const FA_T *fmask,
                                            ptrdiff_t ms, double *m_io, double *l_io, double *cb)
{
    if (lim > n) lim = n;
    if (lim < 0) lim = 0;
    /* rowmax (from the micro-kernel) is the max over all n keys: valid unless masking applies */
    FA_T mx = (bmask || fmask || lim < n) ? FA_NAME(mask_max)(s, lim, bmask, fmask, ms) : rowmax;
    double m_old = *m_io;
    double m_new = (mx != mx || m_old != m_old) ? NAN : ((double)mx > m_old ? (double)mx : m_old);
    if (m_new == -INFINITY) {
        /* every allowed score is -inf or NaN (the micro-kernel's max skips NaN): a NaN makes the
         * row NaN from here on; otherwise no probability mass yet, accumulator untouched */
        int nan = 0;
        for (int j = 0; j < lim; j++) nan |= s[j] != s[j];
        for (int j = 0; j < ncols; j++) s[j] = 0;
        if (nan) {
            *m_io = NAN;
            *l_io = NAN;
            *cb = NAN;
            return NAN;
        }
        *cb = 0.0;
        return 1.0;
    }
    FA_T sum = FA_NAME(exp_sub_sum)(s, lim, (FA_T)m_new);
    for (int j = lim; j < ncols; j++) s[j] = 0;
    double carried = (m_old == -INFINITY) ? 0.0 : *l_io * FA_DEXP(m_old - m_new);
    double l_new = carried + (double)sum;
    double inv = 1.0 / l_new;          /* l_new >= 1: the maximal entry contributes exp(0) */
    *l_io = l_new;
    *m_io = m_new;
    *cb = inv;
    return carried * inv;
}

/* w_j = exp(s_j - m) * inv_l over one row, for the optional weights output: the same scores as
 * the forward pass (scale_mask_max), its final row max m and sum l. */
FA_TARGET static void FA_NAME(row_weights)(const FA_T *s, int n, int lim,
                                           const unsigned char *bmask, const FA_T *fmask, ptrdiff_t ms,
                                           double m, double inv_l, FA_T *w)
{
    if (lim > n) lim = n;
    if (lim < 0) lim = 0;
    memcpy(w, s, sizeof(FA_T) * (size_t)lim);
    FA_NAME(mask_max)(w, lim, bmask, fmask, ms);
    FA_NAME(exp_sub_sum)(w, lim, (FA_T)m);
    FA_T il = (FA_T)inv_l;
    for (int j = 0; j < lim; j++) w[j] *= il;
    for (int j = lim; j < n; j++) w[j] = 0;
}

/* Standalone softmax of one contiguous row: max-subtracted, like scipy.special.softmax
 * (an all -inf row gives NaN there, and here). */
FA_TARGET static void FA_NAME(softmax_row)(const FA_T *x, int n, FA_T *y)
{
    FA_T mx = -(FA_T)INFINITY;
    int has_nan = 0;
    for (int j = 0; j < n; j++) {
        mx = x[j] > mx ? x[j] : mx;
        has_nan |= (x[j] != x[j]);
    }
    if (has_nan) mx = (FA_T)NAN;
    double sum = 0;
#if FA_VW > 1
    V vsum = (V){0};
    int j = 0;
    for (; j + FA_VW <= n; j += FA_VW) {
        V p = FA_NAME(vexp_softmax)(VLOAD(x + j) - mx);
        VSTORE(y + j, p);
        vsum += p;
    }
    if (j < n) {
        V t = (V){0} - (FA_T)INFINITY;
        for (int k = 0; j + k < n; k++) t[k] = x[j + k] - mx;
        V p = FA_NAME(vexp_softmax)(t);
        for (int k = 0; j + k < n; k++) y[j + k] = p[k];
        vsum += p;
    }
    for (int k = 0; k < FA_VW; k++) sum += vsum[k];
#else
    for (int j = 0; j < n; j++) {
        y[j] = (FA_T)exp((double)(x[j] - mx));
        sum += y[j];
    }
#endif
    FA_T inv = (FA_T)(1.0 / sum);
    for (int j = 0; j < n; j++) y[j] *= inv;
}

/* Exposed for the exp accuracy test: y = exp(x) elementwise with the kernel's exp. */
FA_TARGET static void FA_NAME(exp_array)(const FA_T *x, ptrdiff_t n, FA_T *y)
{
#if FA_VW > 1
    ptrdiff_t j = 0;
    for (; j + FA_VW <= n; j += FA_VW) VSTORE(y + j, FA_NAME(vexp_softmax)(VLOAD(x + j)));
    for (; j < n; j++) {
        V t = (V){0} + x[j];
        y[j] = FA_NAME(vexp_softmax)(t)[0];
    }
#else
    for (ptrdiff_t j = 0; j < n; j++) y[j] = (FA_T)exp((double)x[j]);
#endif
}

#undef FA_NR
#undef FA_REMAINDER
#ifdef FA_WIDTHS
#undef FA_WIDTHS
#endif
#undef FA_MR
#undef FA_DEXP
#undef FA_LANES
#undef FA_SUB
#undef FA_NV
#define FA_SIMD_END
#include "simd.h"
