/* qgemm_tile.h -- the int8 linear layer's per-variant code around a micro-kernel: the work
 * item (register blocks, dequantisation, epilogue). The row quantisation is not per variant
 * (qgemm_kernels.c: one scalar and one AVX2 quantiser). Layout, scheme and the
 * reproducibility argument: qgemm_kernels.h.
 *
 * The includer has opened a simd.h instance at 16 float lanes (FA_VW 16) and included
 * gemm_tile.h in it with GM_KEEP_INSTANCE (for epilogue_row and ln_row), and defines
 *   QG_MR      rows per register block (divides 12)
 *   QG_NP      16-column panels per register block (QG_NP * 16 divides QG_NGROUP)
 *   QG_MK(x, kp, mr, w, ps, tile, ahead)
 *              the micro-kernel: tile[r * QG_NP * 16 + c] = sum_k x[r * kp + k] * w(c, k) for
 *              r < mr (a constant), c < QG_NP * 16, k < kp; w: the first of QG_NP panels
 *              ps bytes apart; ahead: prefetch the panels (the block reads them from memory)
 *   QG_TBIAS   (optional, default 0) the micro-kernel's tile holds sum_k (x - QG_TBIAS) w: the
 *              item adds QG_TBIAS * comp[n] back before anything else (an exact int32)
 *   QG_PREP(x, kp, mr, prep), QG_MKP(prep, kp, mr, w, ps, tile, ahead)
 *              (optional, both or neither) a row block's rows prepared once into prep
 *              (QG_PREP_BYTES(kp) bytes, allocated per item) for all the column blocks the item
 *              computes on them, and the micro-kernel reading them from there: the same tile as
 *              QG_MK's (which still runs when the allocation fails)
 * This header ends the instance. */

#include <stdlib.h>

#define QG_TW (QG_NP * 16)
#ifndef QG_TBIAS
#define QG_TBIAS 0
#endif

/* bias, activation, residual over n elements of one row (bias, res offset alike): four vectors
 * at a time through act_n (GELU's interval tests shared by the four), the rest through
 * epilogue_row; act_n's lane arithmetic is epilogue_row's act_vec's, so an element's bits do
 * not depend on which path it takes. */
FA_TARGET static void FA_NAME(qepilogue)(float *y, ptrdiff_t n, const float *bias, int act,
                                         const float *res)
{
    ptrdiff_t j = 0;
#if FA_VW > 1
    for (; j + 4 * FA_VW <= n; j += 4 * FA_VW) {
        V v[4];
        for (int i = 0; i < 4; i++) {
            v[i] = VLOAD(y + j + i * FA_VW);
            if (bias) v[i] = v[i] + VLOAD(bias + j + i * FA_VW);
        }
        if (act) FA_NAME(act_n)(v, 4, act);
        for (int i = 0; i < 4; i++) {
            if (res) v[i] = v[i] + VLOAD(res + j + i * FA_VW);
            VSTORE(y + j + i * FA_VW, v[i]);
        }
    }
#endif
    if (j < n)
        FA_NAME(epilogue_row)(y + j, n - j, bias ? bias + j : NULL, act, res ? res + j : NULL);
}

/* One work item: rows [0, m) of xq, columns [n0, n0 + nc) of y over the whole K. Register
 * blocks of QG_MR rows x QG_TW columns; more than two row blocks: row blocks outer (the block's
 * activation rows stay in L1 while the item's panels stream from L2), else panels outer (a
 * decode step: each panel read from memory once). After a block's integer sums:
 *   y = ((float)sum * sx[m] + zx[m] * (float)rsum[n]) * sw[n]
 * (rsum[n] = sum_k Wq[n, k]: the zero point's term) into y; then bias, activation, residual
 * (qepilogue) over the item's whole width, a row block's rows at a time once their last
 * column block is done (rows outer) or every row at the end (panels outer): one call per row
 * and up to 256 columns rather than one per register block. */
FA_TARGET static void FA_NAME(qitem)(const uint8_t *xq, ptrdiff_t kp, const float *sx,
                                     const float *zx, ptrdiff_t m, const int8_t *wp,
                                     const float *sw,
                                     const int32_t *comp, ptrdiff_t n0, ptrdiff_t nc,
                                     const float *bias, int act, const float *res,
                                     ptrdiff_t res_rs, float *y, ptrdiff_t y_rs)
{
    int32_t tile[QG_MR * QG_TW] __attribute__((aligned(64)));
    const ptrdiff_t ps = kp * QG_PANEL;
    const ptrdiff_t n_rb = (m + QG_MR - 1) / QG_MR, n_cb = (nc + QG_TW - 1) / QG_TW;
    const int rows_outer = n_rb > 2;
#ifdef QG_PREP
    /* worth it only where a row block meets several column blocks in a row */
    uint8_t *prep = rows_outer && n_cb > 1 ? (uint8_t *)malloc(QG_PREP_BYTES(kp)) : NULL;
    ptrdiff_t prep_rb = -1;
#define QG_CALL(R)                                                                            \
    do {                                                                                      \
        if (prep) {                                                                           \
            if (prep_rb != rb) {                                                              \
                QG_PREP(xb, kp, R, prep);                                                     \
                prep_rb = rb;                                                                 \
            }                                                                                 \
            QG_MKP(prep, kp, R, wb, ps, tile, ahead);                                         \
        } else {                                                                              \
            QG_MK(xb, kp, R, wb, ps, tile, ahead);                                            \
        }                                                                                     \
    } while (0)
#else
#define QG_CALL(R) QG_MK(xb, kp, R, wb, ps, tile, ahead)
#endif
    for (ptrdiff_t b = 0; b < n_rb * n_cb; b++) {
        ptrdiff_t rb = rows_outer ? b / n_cb : b % n_rb;
        ptrdiff_t cb = rows_outer ? b % n_cb : b / n_rb;
        ptrdiff_t i0 = rb * QG_MR, j0 = n0 + cb * QG_TW;
        int mr = m - i0 < QG_MR ? (int)(m - i0) : QG_MR;
        ptrdiff_t cols = n0 + nc - j0 < QG_TW ? n0 + nc - j0 : QG_TW;
        const uint8_t *xb = xq + i0 * kp;
        const int8_t *wb = wp + (j0 / QG_PANEL) * ps;
        int ahead = i0 == 0;
        switch (mr) {
        case QG_MR: QG_CALL(QG_MR); break;
        case 1: QG_CALL(1); break;
#if QG_MR > 2
        case 2: QG_CALL(2); break;
#endif
#if QG_MR > 3
        case 3: QG_CALL(3); break;
#endif
#if QG_MR > 4
        case 4: QG_CALL(4); break;
#endif
#if QG_MR > 5
        case 5: QG_CALL(5); break;
#endif
#if QG_MR > 6
#error "QG_MR > 6: extend the remainder switch"
#endif
        default: break;
        }
        for (int r = 0; r < mr; r++) {
            float *yr = y + (i0 + r) * y_rs + j0;
            const int32_t *t = tile + r * QG_TW;
            const float s = sx[i0 + r], z = zx[i0 + r];
            for (ptrdiff_t c = 0; c < cols; c++)
                yr[c] = ((float)(t[c] + QG_TBIAS * comp[j0 + c]) * s + z * (float)comp[j0 + c]) *
                        sw[j0 + c];
        }
        if ((bias || act || res) && rows_outer && cb == n_cb - 1)
            for (int r = 0; r < mr; r++)
                FA_NAME(qepilogue)(y + (i0 + r) * y_rs + n0, nc, bias ? bias + n0 : NULL, act,
                                   res ? res + (i0 + r) * res_rs + n0 : NULL);
    }
    if ((bias || act || res) && !rows_outer)
        for (ptrdiff_t r = 0; r < m; r++)
            FA_NAME(qepilogue)(y + r * y_rs + n0, nc, bias ? bias + n0 : NULL, act,
                               res ? res + r * res_rs + n0 : NULL);
#ifdef QG_PREP
    free(prep);
#endif
}
#undef QG_CALL

#undef QG_TW
#undef QG_TBIAS
#undef QG_MR
#undef QG_NP
#undef QG_MK
#undef QG_MKP
#undef QG_PREP
#undef GM_KEEP_INSTANCE
#define FA_SIMD_END
#include "simd.h"
