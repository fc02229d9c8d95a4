/* gemm_tile.h -- packed-weight GEMM with a fused epilogue, and elementwise activations; a
 * template included once per (dtype, ISA) by gemm_kernels.c, like fa_tile.h.
 *
 * The linear layer, row-major, torch's convention (W is Linear.weight):
 *   x    (M, K)     activations, row stride x_rs, last dimension contiguous
 *   W    (N, K)     weights, packed once by pack() into wp
 *   bias (N,)       optional
 *   res  (M, N)     optional residual, row stride res_rs
 *   y    (M, N)     y = act(x @ W.T + bias) + res, row stride y_rs
 *
 * Packed layout (wp, K * Npad elements, Npad = N rounded up to NR): the K axis is cut into blocks
 * of KC (the last one shorter, kcb = min(KC, K - K0)); the block starting at K0 occupies
 * wp[K0 * Npad .. (K0 + kcb) * Npad) and holds Npad / NR panels, panel p at offset p * NR * kcb:
 *   wp[K0 * Npad + n0 * kcb + k * NR + j] = W[n0 + j, K0 + k]     (zero for n0 + j >= N)
 * so the micro-kernel streams one contiguous kcb x NR panel per register block, and the panels
 * of one K block are contiguous: an item's column range is one stream.
 *
 * The includer defines simd.h's instance parameters (FA_IS_DOUBLE, FA_VW -- 1: plain scalar C,
 * the reference --, FA_NAME, FA_TARGET, optionally FA_ANY; this header includes simd.h for them
 * and ends the instance) and
 *   GM_MR       rows per register block
 *   GM_NV       vectors per register block row; NR = GM_NV * FA_VW columns
 *   GM_KC       K block length
 *   GM_L2_NEXT  optional (default 0): fetch the next K block's panels into L2 (item())
 *   GM_WIDEN    optional: the intrinsic widening a register of floats to doubles (ln_row)
 *   GM_HALF     optional (float32 vector instances only): the panels hold IEEE binary16 bit
 *               patterns (uint16_t) instead of floats, widened to float32 as each panel vector
 *               is loaded by GM_PLOAD_HALF(p), the includer's intrinsic (vcvtph2ps). The
 *               widening is exact, and the packing layout, blocking and every multiply-add are
 *               the float instance's, so for a weight whose values are all binary16 numbers the
 *               results are bitwise those of the float panels, from half the bytes (fastattn's
 *               _ops packs such weights this way: a decode step streams its weights).
 *
 * Summation order: each y element is sum_k x[m, k] * W[n, k] accumulated in k order, block by
 * block, in one accumulator (the block's partial sum goes through y between K blocks, stored
 * in the accumulator's own type: exact). The order is k order whatever KC, the loop order or
 * which thread or register-block position computes the element, so results are bitwise
 * identical for any thread count.
 */

#include "simd.h"

#define GM_NR (GM_NV * FA_VW)
/* the panels' element type and their vector load */
#ifdef GM_HALF
#define GM_PT uint16_t
#define GM_PLOAD(p) GM_PLOAD_HALF(p)
#else
#define GM_PT FA_T
#define GM_PLOAD(p) VLOAD(p)
#endif
/* this instance's blocking, for the dispatch table (gemm_kernels.c) */
enum { FA_NAME(mr) = GM_MR, FA_NAME(nr) = GM_NR, FA_NAME(kc) = GM_KC };
/* item(): up to this many MR-row blocks run panel by panel (each panel read from memory once
 * and reused from L1 by the item's few rows: a decode step), more row block by row block */
#define GM_PANEL_OUTER_RB 2
/* software prefetch distance along the packed panel: 4 KiB ahead, in k steps, for blocks
 * streaming it from memory (mk's `ahead`); 512 bytes for blocks finding it in L2 / L3
 * (mk_full; 2 or 4 KiB there, tried when the block was still inlined, measured +-1%) */
#define GM_PF_K (4096 / (GM_NR * (ptrdiff_t)sizeof(GM_PT)))
#define GM_PF_NEAR 512
/* GM_L2_NEXT (the includer's, default 0): fetch the next K block's panels into L2 (item()) */
#ifndef GM_L2_NEXT
#define GM_L2_NEXT 0
#endif
/* mk_full's extra arguments where GM_L2_NEXT is on, nothing where it is off */
#if GM_L2_NEXT
#define GM_L2_ARGS(...) , __VA_ARGS__
#else
#define GM_L2_ARGS(...)
#endif
/* k steps before the end of a block's last K block at which the residual rows its epilogue
 * adds are prefetched. Fetched only with the next block's output tile (one block ahead) they
 * were evicted again by the time the epilogue read them (a block streams its whole panel,
 * 24-32 KiB, through the 32 KiB L1): at 4096 x 384 x 384 + bias + residual, half of item()'s
 * perf samples sat on the residual's load. Same process against that alone (bench/tools/ab_gemm.py
 * --epilogue bias+res, Zen 3): 4096 x 384 x 384 +10%, 4096 x 384 x 1536 +2.5%, 1024 x 512 x
 * 2048 +4.6%, 2048 x 512 x 512 +5.3% (128 steps ahead: the same as 64) */
#define GM_RES_LEAD 64

/* ------------------------------------------------------------------ activations
 * act codes (gemm_kernels.h): GM_ACT_NONE, GM_ACT_RELU, GM_ACT_GELU (exact, erf),
 * GM_ACT_GELU_TANH (torch's approximate='tanh'), GM_ACT_SILU.
 * Limits: gelu(+inf) = +inf, gelu(-inf) = -0 (the limits, where torch returns NaN), the same for
 * gelu_tanh and silu; NaN stays NaN; relu(NaN) = NaN.
 *
 * The scalar element function: double arithmetic through libm, used by the scalar ISA for both
 * dtypes and by every ISA for float64 (libm's erf/erfc/exp are correctly rounded or within 1
 * ulp; a float64 vector erf is not implemented). gelu uses erfc(-x / sqrt 2) rather than
 * 1 + erf(x / sqrt 2): no cancellation for negative x, so the tail keeps its relative accuracy. */
static inline double FA_NAME(act_scalar)(double x, int act)
{
    double e;
    switch (act) {
    case GM_ACT_RELU:
        return x < 0 ? 0.0 : x;                        /* NaN < 0 is false: NaN passes */
    case GM_ACT_GELU:
        if (x == -INFINITY) return -0.0;
        return 0.5 * x * erfc(-x * 0.70710678118654752440);
    case GM_ACT_GELU_TANH:
        /* 0.5 x (1 + tanh u) = x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3) */
        e = exp(-2.0 * 0.79788456080286535588 * (x + 0.044715 * x * x * x));
        return e == INFINITY ? -0.0 : x / (1.0 + e);
    case GM_ACT_SILU:
        e = exp(-x);
        return e == INFINITY ? -0.0 : x / (1.0 + e);
    case GM_ACT_ERF:
        return erf(x);
    default:
        return x;
    }
}

#if FA_VW > 1 && !FA_IS_DOUBLE
/* exact GELU, x Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2 for x >= 0 and erfc(|x| / sqrt 2) / 2
 * for x < 0 (no cancellation in the negative tail: relative accuracy kept down to x = -9.2,
 * beyond which gelu is -0), in three steps: a = |x| / sqrt 2; erf(a) for a < 1 and erfc(a)
 * above (the tail, needed only when some lane has a >= 1); the product. */
FA_TARGET static inline V FA_NAME(gelu_arg)(V x)
{
    const VI signbit = (VI){0} + (FA_I)(-2147483647 - 1);
    return (V)((VI)x & ~signbit) * 0.707106781f;
}

FA_TARGET static inline V FA_NAME(gelu_end)(V x, V a, V small, V tail)
{
    V erf_a = VSEL(a < 1.0f, small, 1.0f - tail);
    V erfc_a = VSEL(a < 1.0f, 1.0f - small, tail);
    V phi = VSEL(x < 0.0f, erfc_a, 1.0f + erf_a) * 0.5f;
    V y = x * phi;
    return VSEL(phi == 0.0f, VSPLAT(-0.0f), y);         /* -inf * 0 would be NaN */
}

/* GELU of n vectors at once (n a constant after inlining): the same lane-wise arithmetic as
 * act_vec's, with the two interval tests taken once for all n vectors, so that the n
 * polynomial chains are independent straight-line code the core can overlap. A lane's
 * result does not depend on which branch its neighbours chose: each interval's value is
 * selected lane by lane. In the GEMM's epilogue, two rows at a time against one vector at a
 * time (bench/tools/ab_gemm.py --epilogue bias+gelu, Zen 3): +1-4%; three rows: no better. */
FA_TARGET static FA_ALWAYS_INLINE void FA_NAME(gelu_n)(V *v, const int n)
{
    V a[2 * GM_NV], small[2 * GM_NV], tail[2 * GM_NV];
    VI need = (VI){0};
    for (int i = 0; i < n; i++) {
        a[i] = FA_NAME(gelu_arg)(v[i]);
        small[i] = FA_NAME(verf_small)(a[i]);
        tail[i] = VSPLAT(0.0f);
        need |= ~(VI)(a[i] < 1.0f);
    }
    if (VANY(need)) {
        need = (VI){0};
        for (int i = 0; i < n; i++) {
            tail[i] = FA_NAME(verfc_q1)(a[i]);
            need |= ~(VI)(a[i] < 2.0f);
        }
        if (VANY(need))
            for (int i = 0; i < n; i++) tail[i] = FA_NAME(verfc_q2)(a[i], tail[i]);
    }
    for (int i = 0; i < n; i++) v[i] = FA_NAME(gelu_end)(v[i], a[i], small[i], tail[i]);
}

/* the element functions, inlined into the loops of act_n: a call per vector made the caller
 * spill its live vectors (every zmm register is caller-saved) -- bias + ReLU took 7% of a
 * 1024 x 2048 x 512 GEMM's time that way */
FA_TARGET static FA_ALWAYS_INLINE V FA_NAME(relu_v)(V x)
{
    return VSEL(x < 0.0f, VSPLAT(0.0f), x);
}

FA_TARGET static FA_ALWAYS_INLINE V FA_NAME(gelu_tanh_v)(V x)
{
    V u = x * (0.797884561f + (0.797884561f * 0.044715f) * (x * x));
    V e = FA_NAME(vexp_act)(-2.0f * u);
    V y = x / (1.0f + e);
    return VSEL(e == INFINITY, VSPLAT(-0.0f), y);       /* x -> -inf: the limit, not NaN */
}

FA_TARGET static FA_ALWAYS_INLINE V FA_NAME(silu_v)(V x)
{
    V e = FA_NAME(vexp_act)(-x);
    V y = x / (1.0f + e);
    return VSEL(e == INFINITY, VSPLAT(-0.0f), y);
}

FA_TARGET static inline V FA_NAME(act_vec)(V x, int act)
{
    switch (act) {
    case GM_ACT_RELU:
        return FA_NAME(relu_v)(x);
    case GM_ACT_GELU: {
        V a = FA_NAME(gelu_arg)(x);
        V tail = VANY(~(VI)(a < 1.0f)) ? FA_NAME(verfc_tail)(a) : VSPLAT(0.0f);
        return FA_NAME(gelu_end)(x, a, FA_NAME(verf_small)(a), tail);
    }
    case GM_ACT_GELU_TANH:
        return FA_NAME(gelu_tanh_v)(x);
    case GM_ACT_SILU:
        return FA_NAME(silu_v)(x);
    case GM_ACT_ERF:
        return FA_NAME(verf)(x);
    default:
        return x;
    }
}

/* act on n vectors in place (n a constant after inlining): the activation chosen once, then a
 * loop of its inlined element function; the same bits as act_vec on each vector */
FA_TARGET static FA_ALWAYS_INLINE void FA_NAME(act_n)(V *v, const int n, int act)
{
    switch (act) {
    case 0:
        break;
    case GM_ACT_RELU:
        for (int i = 0; i < n; i++) v[i] = FA_NAME(relu_v)(v[i]);
        break;
    case GM_ACT_GELU:
        FA_NAME(gelu_n)(v, n);
        break;
    case GM_ACT_GELU_TANH:
        for (int i = 0; i < n; i++) v[i] = FA_NAME(gelu_tanh_v)(v[i]);
        break;
    case GM_ACT_SILU:
        for (int i = 0; i < n; i++) v[i] = FA_NAME(silu_v)(v[i]);
        break;
    default:
        for (int i = 0; i < n; i++) v[i] = FA_NAME(act_vec)(v[i], act);
    }
}
#define GM_VEC_ACT 1
#endif

/* y[j] = act(y[j] + bias[j]) + res[j] for j < n (bias, res optional). Every element takes the
 * same path wherever it sits: a tail shorter than a vector is padded into one vector, so an
 * element's result does not depend on n or on its position. */
FA_TARGET static void FA_NAME(epilogue_row)(FA_T *y, ptrdiff_t n, const FA_T *bias, int act,
                                           const FA_T *res)
{
#ifdef GM_VEC_ACT
    ptrdiff_t j = 0;
    for (; j + FA_VW <= n; j += FA_VW) {
        V v = VLOAD(y + j);
        if (bias) v = v + VLOAD(bias + j);
        if (act) v = FA_NAME(act_vec)(v, act);
        if (res) v = v + VLOAD(res + j);
        VSTORE(y + j, v);
    }
    if (j < n) {
        FA_T tmp[3][FA_VW];
        ptrdiff_t w = n - j;
        for (ptrdiff_t t = 0; t < FA_VW; t++) {
            tmp[0][t] = t < w ? y[j + t] : 0;
            tmp[1][t] = (t < w && bias) ? bias[j + t] : 0;
            tmp[2][t] = (t < w && res) ? res[j + t] : 0;
        }
        V v = VLOAD(tmp[0]);
        if (bias) v = v + VLOAD(tmp[1]);
        if (act) v = FA_NAME(act_vec)(v, act);
        if (res) v = v + VLOAD(tmp[2]);
        VSTORE(tmp[0], v);
        for (ptrdiff_t t = 0; t < w; t++) y[j + t] = tmp[0][t];
    }
#else
    for (ptrdiff_t j = 0; j < n; j++) {
        FA_T v = y[j];
        if (bias) v = v + bias[j];
        if (act) v = (FA_T)FA_NAME(act_scalar)((double)v, act);
        if (res) v = v + res[j];
        y[j] = v;
    }
#endif
}

#ifdef GM_VEC_ACT
#if GM_MR % 2
#error "epilogue_block takes the rows two at a time: GM_MR must be even"
#endif
/* The epilogue of a whole register block (MR rows x NR columns), two rows at a time: the same
 * per-element arithmetic as epilogue_row (bias, act, residual, in that order), GELU on the two
 * rows' 2 * NV vectors together (gelu_n). */
FA_TARGET static void FA_NAME(epilogue_block)(FA_T *y, ptrdiff_t y_rs, const FA_T *bias, int act,
                                             const FA_T *res, ptrdiff_t res_rs)
{
    V b[GM_NV];
    for (int c = 0; c < GM_NV; c++) b[c] = bias ? VLOAD(bias + c * FA_VW) : VSPLAT(0.0f);
    for (int r = 0; r < GM_MR; r += 2) {
        V v[2 * GM_NV];
        for (int i = 0; i < 2; i++)
            for (int c = 0; c < GM_NV; c++) {
                v[i * GM_NV + c] = VLOAD(y + (r + i) * y_rs + c * FA_VW);
                if (bias) v[i * GM_NV + c] = v[i * GM_NV + c] + b[c];
            }
        FA_NAME(act_n)(v, 2 * GM_NV, act);
        for (int i = 0; i < 2; i++)
            for (int c = 0; c < GM_NV; c++) {
                V t = v[i * GM_NV + c];
                if (res) t = t + VLOAD(res + (r + i) * res_rs + c * FA_VW);
                VSTORE(y + (r + i) * y_rs + c * FA_VW, t);
            }
    }
}
#endif

/* y = act(x) elementwise over n elements (y may be x): the standalone activation kernel, one
 * pass over memory; the same element function as the epilogue, so the bits agree with it. */
FA_TARGET static void FA_NAME(act_array)(const FA_T *x, ptrdiff_t n, FA_T *y, int act)
{
#ifdef GM_VEC_ACT
    ptrdiff_t j = 0;
    for (; j + 4 * FA_VW <= n; j += 4 * FA_VW) {
        V v[4];
        for (int i = 0; i < 4; i++) v[i] = VLOAD(x + j + i * FA_VW);
        FA_NAME(act_n)(v, 4, act);
        for (int i = 0; i < 4; i++) VSTORE(y + j + i * FA_VW, v[i]);
    }
    for (; j + FA_VW <= n; j += FA_VW) VSTORE(y + j, FA_NAME(act_vec)(VLOAD(x + j), act));
    if (j < n) {
        FA_T tmp[FA_VW];
        ptrdiff_t w = n - j;
        for (ptrdiff_t t = 0; t < FA_VW; t++) tmp[t] = t < w ? x[j + t] : 0;
        VSTORE(tmp, FA_NAME(act_vec)(VLOAD(tmp), act));
        for (ptrdiff_t t = 0; t < w; t++) y[j + t] = tmp[t];
    }
#else
    for (ptrdiff_t j = 0; j < n; j++) y[j] = (FA_T)FA_NAME(act_scalar)((double)x[j], act);
#endif
}

/* ------------------------------------------------------------------ packing
 * W (N, K) with row stride w_rs -> wp (K * Npad), the layout in the header comment. */
FA_TARGET static void FA_NAME(pack)(const GM_PT *w, ptrdiff_t w_rs, ptrdiff_t N, ptrdiff_t K,
                                    GM_PT *wp)
{
    ptrdiff_t npad = (N + GM_NR - 1) / GM_NR * GM_NR;
    for (ptrdiff_t k0 = 0; k0 < K; k0 += GM_KC) {
        ptrdiff_t kcb = K - k0 < GM_KC ? K - k0 : GM_KC;
        GM_PT *blk = wp + k0 * npad;
        for (ptrdiff_t n0 = 0; n0 < npad; n0 += GM_NR) {
            GM_PT *panel = blk + n0 * kcb;             /* (kcb, NR) */
            ptrdiff_t w_cols = N - n0 < GM_NR ? N - n0 : GM_NR;
            for (ptrdiff_t j = 0; j < GM_NR; j++) {
                if (j < w_cols) {
                    const GM_PT *wrow = w + (n0 + j) * w_rs + k0;
                    for (ptrdiff_t k = 0; k < kcb; k++) panel[k * GM_NR + j] = wrow[k];
                } else {
                    for (ptrdiff_t k = 0; k < kcb; k++) panel[k * GM_NR + j] = 0;
                }
            }
        }
    }
}

/* ------------------------------------------------------------------ the micro-kernel
 * One register block: `mr` rows (a compile-time constant after inlining) x one packed panel:
 *   acc[r, c] = (first ? 0 : y[r, c]) + sum_{k < kcb} x[r, k] * panel[k, c]
 * for c < nv (the panel's real columns; the padding columns are computed and dropped).
 * Each k step loads NV vectors of the panel and broadcasts one x element per row: MR * NV
 * independent multiply-add chains (12 on AVX2 floats: 6 rows x 2 ymm), enough to hide the FMA
 * latency. Partial panels go through a stack tile so nothing outside y's nv columns is read or
 * written. `ahead`: software prefetch of the panel's own data 4 KiB ahead of k (a prefetch
 * never faults, so addresses past the buffer's end are harmless), for the register blocks
 * that bring the weights in from memory (the first row block of an item; the hardware
 * prefetcher alone left the M = 8 output projection at 16 GB/s of the 27 measured, 21 with
 * this). The other row blocks find the panels in L2 or L3 and run mk_full when whole. */
#if FA_VW > 1
#define GM_ACC V
#define GM_ZERO ((V){0})
#else
#define GM_ACC FA_T
#define GM_ZERO ((FA_T)0)
#define VLOAD(p) (*(p))
#define VSTORE(p, x) (*(p) = (x))
#endif

FA_TARGET static FA_ALWAYS_INLINE void
FA_NAME(mk)(const FA_T *x, ptrdiff_t x_rs, const int mr, ptrdiff_t kcb, const GM_PT *panel,
            FA_T *y, ptrdiff_t y_rs, ptrdiff_t nv, int first, int ahead)
{
    GM_ACC acc[GM_MR][GM_NV];
    FA_T tmp[GM_MR][GM_NR];
    const FA_T *xp[GM_MR];
    for (int r = 0; r < mr; r++) {
        xp[r] = x + r * x_rs;
        if (first) {
            for (int v = 0; v < GM_NV; v++) acc[r][v] = GM_ZERO;
        } else if (nv == GM_NR) {
            for (int v = 0; v < GM_NV; v++) acc[r][v] = VLOAD(y + r * y_rs + v * FA_VW);
        } else {
            for (int c = 0; c < GM_NR; c++) tmp[r][c] = c < nv ? y[r * y_rs + c] : 0;
            for (int v = 0; v < GM_NV; v++) acc[r][v] = VLOAD(&tmp[r][v * FA_VW]);
        }
    }
    /* one k step: NV panel vectors, one broadcast per row, MR * NV multiply-adds */
#define GM_KSTEP(k)                                                                        \
    do {                                                                                   \
        GM_ACC wv[GM_NV];                                                                  \
        for (int v = 0; v < GM_NV; v++) wv[v] = GM_PLOAD(panel + (k) * GM_NR + v * FA_VW); \
        for (int r = 0; r < mr; r++) {                                                     \
            FA_T xe = xp[r][k];                        /* scalar * vector: a broadcast */  \
            for (int v = 0; v < GM_NV; v++) acc[r][v] += xe * wv[v];                       \
        }                                                                                  \
    } while (0)
    /* The prefetching steps run in their own loop, so the steady-state loop is nothing but
     * loads and multiply-adds: bookkeeping inside it took issue slots from the FMA ports
     * (96 x 256 x 512 on one core: 50% of the FMA peak with it in every step). */
    ptrdiff_t k = 0;
    if (ahead) {
        for (; k < kcb; k++) {
            for (ptrdiff_t b = 0; b < GM_NR * (ptrdiff_t)sizeof(GM_PT); b += 64)
                FA_PREFETCH((const char *)(panel + (k + GM_PF_K) * GM_NR) + b, 3);
            GM_KSTEP(k);
        }
    }
    for (; k < kcb; k++) GM_KSTEP(k);
#undef GM_KSTEP
    for (int r = 0; r < mr; r++) {
        if (nv == GM_NR) {
            for (int v = 0; v < GM_NV; v++) VSTORE(y + r * y_rs + v * FA_VW, acc[r][v]);
        } else {
            for (int v = 0; v < GM_NV; v++) VSTORE(&tmp[r][v * FA_VW], acc[r][v]);
            for (ptrdiff_t c = 0; c < nv; c++) y[r * y_rs + c] = tmp[r][c];
        }
    }
}

#if FA_VW > 1
/* A whole register block (MR rows, all NR columns): mk()'s sums, in a function of its own.
 * Inlined into item(), GCC's register allocation kept moves between the accumulators in the
 * k loop (the last row's two chains went through four registers); alone, the loop is the NV
 * loads, MR broadcasts and MR * NV multiply-adds, and a prefetch of the panel GM_PF_NEAR
 * bytes ahead (from L2 / L3: the item's first row block brought it in). Zen 3, two threads,
 * same process (bench/tools/ab_gemm.py, bench/results/ab_gemm_zen3.txt) at M >= 1024: the
 * function alone +1-5% against the inlined block, the prefetch a further +3-8% (at 1 KiB
 * ahead -5 to +4%, 2 KiB +0-6%). Written out rather than as a noinline call of mk() with
 * constant arguments: that compiled with the moves back. On an AVX-512 + AMX Xeon the 6 x 64
 * block's loop is clean (4 loads, 6 broadcasts, 24 multiply-adds a step); alone with its panel
 * in L1 it runs at 92-95% of a core's FMA peak, from L2 (KC 256) at 82-85%
 * (bench/results/ab_gemm_avx512.txt). */
FA_TARGET static __attribute__((noinline)) void
FA_NAME(mk_full)(const FA_T *x, ptrdiff_t x_rs, ptrdiff_t kcb, const GM_PT *panel, FA_T *y,
                 ptrdiff_t y_rs, int first GM_L2_ARGS(const char *l2, ptrdiff_t nl2))
{
    V acc[GM_MR][GM_NV];
    const FA_T *xp[GM_MR];
#pragma GCC unroll 8
    for (int r = 0; r < GM_MR; r++) {
        xp[r] = x + r * x_rs;
#pragma GCC unroll 4
        for (int v = 0; v < GM_NV; v++)
            acc[r][v] = first ? (V){0} : VLOAD(y + r * y_rs + v * FA_VW);
    }
#define GM_FULL_STEP(k)                                                                    \
    do {                                                                                   \
        V wv[GM_NV];                                                                       \
        _Pragma("GCC unroll 4")                                                            \
        for (ptrdiff_t b = 0; b < GM_NR * (ptrdiff_t)sizeof(GM_PT); b += 64)               \
            FA_PREFETCH((const char *)(panel + (k) * GM_NR) + GM_PF_NEAR + b, 3);          \
        _Pragma("GCC unroll 4")                                                            \
        for (int v = 0; v < GM_NV; v++) wv[v] = GM_PLOAD(panel + (k) * GM_NR + v * FA_VW); \
        _Pragma("GCC unroll 8")                                                            \
        for (int r = 0; r < GM_MR; r++) {                                                  \
            FA_T xe = xp[r][k];                                                            \
            _Pragma("GCC unroll 4")                                                        \
            for (int v = 0; v < GM_NV; v++) acc[r][v] += xe * wv[v];                       \
        }                                                                                  \
    } while (0)
    ptrdiff_t k = 0;
#if GM_L2_NEXT
    /* the first nl2 steps also fetch one line of the next K block's panels into L2 */
    for (; k < nl2; k++) {
        FA_PREFETCH(l2 + 64 * k, 2);
        GM_FULL_STEP(k);
    }
#endif
    for (; k < kcb; k++) GM_FULL_STEP(k);
#undef GM_FULL_STEP
#pragma GCC unroll 8
    for (int r = 0; r < GM_MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < GM_NV; v++) VSTORE(y + r * y_rs + v * FA_VW, acc[r][v]);
}
#endif

/* Prefetch rows rows of cols elements at p, row stride rs: the first and last element of each
 * row (up to NR elements span two lines when unaligned). item() fetches the next register
 * block's output tile (and its residual rows when the epilogue will read them) while this
 * block computes: without it every block of a large-M GEMM waited on its y lines at the end
 * (stores to lines not in cache) and, after the first K block, at the start (the partial
 * sums): one core, 1024 x 512 x 512, 0.80x OpenBLAS's speed before, 0.90x after. */
static inline void FA_NAME(prefetch_rows)(const FA_T *p, ptrdiff_t rs, int rows, ptrdiff_t cols)
{
    for (int r = 0; r < rows; r++) {
        FA_PREFETCH(p + r * rs, 3);
        FA_PREFETCH(p + r * rs + cols - 1, 3);
    }
}

/* ------------------------------------------------------------------ residual + LayerNorm
 * One row of n elements (n >= 1):
 *   s = x + res (rounded to T, as the unfused x + res would be), mean and biased variance of s
 *   in double over two passes (no cancellation from sum(s^2) - n mean^2), then
 *   y = (s - mean) / sqrt(var + eps) * gamma + beta in double, rounded once to T.
 * res, gamma, beta may be NULL (0, 1, 0); y may be x (each element is read before it is
 * written). The sums run in FA_VW double lanes over the whole vectors, then the lanes in order,
 * then the tail: the order depends on n only, never on the thread or the row's position. */
/* The same row when the sums overflow double (float64 rows with |x| beyond ~1e154): LayerNorm
 * does not change under x -> x / c with eps -> eps / c^2, so the row is computed on x / c, c the
 * power of two at or below max |x| (exact for every element that stays a normal number after
 * the scaling; an element 2^1022 times smaller than the largest may lose low bits, far below
 * the result's rounding). Returns 0, doing nothing, when the row holds inf or NaN (the plain
 * path's NaN result is then the answer, as in torch). */
static int FA_NAME(ln_row_scaled)(const FA_T *x, const FA_T *res, ptrdiff_t n,
                                  const FA_T *gamma, const FA_T *beta, double eps, FA_T *y)
{
    double amax = 0.0, sum = 0.0, ss = 0.0;
    ptrdiff_t j;
#define GM_LN_X(j) ((double)(res ? (FA_T)(x[j] + res[j]) : x[j]))
    for (j = 0; j < n; j++) {
        double a = fabs(GM_LN_X(j));
        if (!(a <= DBL_MAX)) return 0;                 /* inf or NaN */
        amax = a > amax ? a : amax;
    }
    if (amax == 0.0) return 0;
    const double inv_c = 1.0 / ldexp(1.0, ilogb(amax));  /* exact: a power of two */
    for (j = 0; j < n; j++) sum += GM_LN_X(j) * inv_c;
    const double mean = sum / (double)n;
    for (j = 0; j < n; j++) {
        double d = GM_LN_X(j) * inv_c - mean;
        ss += d * d;
    }
    /* eps / c^2 may underflow to 0: if ss is exactly 0 the row is then still 0 when eps > 0
     * (NaN when eps = 0), as unscaled. A constant row whose rounded mean differs from its
     * elements by an ulp has ss ~ ulp^2 > 0 and normalises to +-1, as on the plain path
     * (a known limit of the two-pass mean in double for rows of identical huge values). */
    const double var_s = ss / (double)n + eps * inv_c * inv_c;
    const double rstd = var_s > 0.0 ? 1.0 / sqrt(var_s) : (eps > 0.0 ? 0.0 : INFINITY);
    for (j = 0; j < n; j++) {
        double d = (GM_LN_X(j) * inv_c - mean) * rstd;
        if (gamma) d *= (double)gamma[j];
        if (beta) d += (double)beta[j];
        y[j] = (FA_T)d;
    }
#undef GM_LN_X
    return 1;
}

FA_TARGET static void FA_NAME(ln_row)(const FA_T *x, const FA_T *res, ptrdiff_t n,
                                      const FA_T *gamma, const FA_T *beta, double eps, FA_T *y)
{
    double sum = 0.0, ss = 0.0;
    ptrdiff_t j, nv = 0;
#if FA_VW > 1
    /* The double lanes are kept in native-width vectors (LH doubles: a whole register): a
     * vector of FA_VW doubles is twice a register for float32, and GCC spilled it to the stack
     * on every step (2 us per 512-element row on AVX2). For float32 each FA_VW-element step is
     * two halves, lo = elements 0..LH-1 and hi = LH..FA_VW-1 of the step; summing lo's lanes
     * then hi's is the same order as one FA_VW-lane accumulator. */
#if FA_IS_DOUBLE
#define LH FA_VW
#else
#define LH (FA_VW / 2)
#endif
    typedef FA_T VH __attribute__((vector_size(LH * sizeof(FA_T)), aligned(sizeof(FA_T))));
    typedef double VD __attribute__((vector_size(LH * sizeof(double))));
#define GM_LN_S(j) (res ? *(const VH *)(x + (j)) + *(const VH *)(res + (j)) : *(const VH *)(x + (j)))
/* float -> double a register at a time: GCC 12 lowers __builtin_convertvector of 8 floats to
 * 8 doubles (and of 4 to 4) as two half-width conversions and an insert; the includer's
 * GM_WIDEN is the one instruction (vcvtps2pd) where it names it */
#if defined(GM_WIDEN) && !FA_IS_DOUBLE
#define GM_LN_D(j) ((VD)GM_WIDEN(GM_LN_S(j)))
#define GM_LN_W(p) ((VD)GM_WIDEN(*(const VH *)(p)))
#else
#define GM_LN_D(j) __builtin_convertvector(GM_LN_S(j), VD)
#define GM_LN_W(p) __builtin_convertvector(*(const VH *)(p), VD)
#endif
    nv = n / FA_VW * FA_VW;
    VD lo = {0}, hi = {0};
    (void)hi;                                      /* float64: one register per step */
    for (j = 0; j < nv; j += FA_VW) {
        lo += GM_LN_D(j);
#if !FA_IS_DOUBLE
        hi += GM_LN_D(j + LH);
#endif
    }
    for (int t = 0; t < LH; t++) sum += lo[t];
#if !FA_IS_DOUBLE
    for (int t = 0; t < LH; t++) sum += hi[t];
#endif
#endif
    for (j = nv; j < n; j++) sum += (double)(res ? (FA_T)(x[j] + res[j]) : x[j]);
    const double mean = sum / (double)n;
#if FA_VW > 1
    const VD mean_v = (VD){0} + mean;
    lo = (VD){0};
    hi = (VD){0};
    for (j = 0; j < nv; j += FA_VW) {
        VD d = GM_LN_D(j) - mean_v;
        lo += d * d;
#if !FA_IS_DOUBLE
        d = GM_LN_D(j + LH) - mean_v;
        hi += d * d;
#endif
    }
    for (int t = 0; t < LH; t++) ss += lo[t];
#if !FA_IS_DOUBLE
    for (int t = 0; t < LH; t++) ss += hi[t];
#endif
#endif
    for (j = nv; j < n; j++) {
        double d = (double)(res ? (FA_T)(x[j] + res[j]) : x[j]) - mean;
        ss += d * d;
    }
    /* lanes may overflow to +inf and -inf (a NaN sum): any non-finite sum tries the scaled
     * row, which declines rows that really hold inf or NaN */
    if ((!isfinite(ss) || !isfinite(sum)) &&
        FA_NAME(ln_row_scaled)(x, res, n, gamma, beta, eps, y))
        return;
    const double rstd = 1.0 / sqrt(ss / (double)n + eps);
#if FA_VW > 1
    const VD rstd_v = (VD){0} + rstd;
    for (j = 0; j < nv; j += LH) {
        VD d = (GM_LN_D(j) - mean_v) * rstd_v;
        if (gamma) d *= GM_LN_W(gamma + j);
        if (beta) d += GM_LN_W(beta + j);
        *(VH *)(y + j) = __builtin_convertvector(d, VH);
    }
#undef GM_LN_S
#undef GM_LN_D
#undef GM_LN_W
#undef LH
#endif
    for (j = nv; j < n; j++) {
        double d = ((double)(res ? (FA_T)(x[j] + res[j]) : x[j]) - mean) * rstd;
        if (gamma) d *= (double)gamma[j];
        if (beta) d += (double)beta[j];
        y[j] = (FA_T)d;
    }
}

/* One work item: y[0:m, n0:n0+nc] over the whole K (never split between threads).
 *   x    (m, K)   the item's rows (already offset to its first row)
 *   y    (m, N)   the same rows of the output, column 0; res likewise (or NULL)
 *   wp   packed weights (K * npad); n0 and nc multiples of NR except nc at the right edge
 * Loop order per K block, for items of more than GM_PANEL_OUTER_RB row blocks: MR-row blocks,
 * then panels, so a row block's x sliver (MR x KC: 12 KiB for AVX2 floats) is read from L1 by
 * every panel while the item's panels (KC x nc) stream past it from L2 / L3, the first row
 * block bringing them in from memory. Panels outer, each panel held in L1 for all the row
 * blocks while the x rows streamed from L2, is kept for the few-row items of a decode step,
 * which read each panel from memory once; at large M it was slower (row blocks outer with
 * KC 512 against panels outer with KC 256, same process on Zen 3: +0-9%,
 * bench/results/ab_gemm_zen3.txt). After the last K block each finished register block gets
 * its epilogue while it is still in L1. The loop order changes no rounding. */
FA_TARGET static void FA_NAME(item)(const FA_T *x, ptrdiff_t x_rs, ptrdiff_t m, ptrdiff_t K,
                                    const GM_PT *wp, ptrdiff_t npad, ptrdiff_t n0, ptrdiff_t nc,
                                    const FA_T *bias, int act, const FA_T *res, ptrdiff_t res_rs,
                                    FA_T *y, ptrdiff_t y_rs, ptrdiff_t pf_n0)
{
    const ptrdiff_t n_end = n0 + nc;
    const ptrdiff_t n_rb = (m + GM_MR - 1) / GM_MR, n_pb = (nc + GM_NR - 1) / GM_NR;
    (void)pf_n0;                           /* used where GM_L2_NEXT is on */
    const ptrdiff_t n_blk = n_rb * n_pb;
    const int rows_outer = n_rb > GM_PANEL_OUTER_RB;
    ptrdiff_t k0 = 0;
    do {                                   /* at least once: K = 0 still writes the epilogue */
        ptrdiff_t kcb = K - k0 < GM_KC ? K - k0 : GM_KC;
        int first = k0 == 0, last = k0 + kcb >= K;
        const GM_PT *blk = wp + k0 * npad;
#if GM_L2_NEXT
        /* The panels of the next K block are fetched into L2 while this one runs, a line per
         * k step, by the register blocks that find this K block's panels in L2 already (rows
         * outer: all but the first row block). After the last K block: the first K block of
         * the column block at pf_n0, where the driver says this thread's next item starts
         * there, else the item's own first again (the next item shares its column block; with
         * a single K block, nothing). Without it the first row block of every K block waited
         * on the weights coming from L3 or memory. */
        const int to_next = last && pf_n0 >= 0 && pf_n0 < npad;
        const ptrdiff_t nk0 = to_next ? 0 : k0 + kcb < K ? k0 + kcb : 0;
        const ptrdiff_t nkcb = K - nk0 < GM_KC ? K - nk0 : GM_KC;
        const ptrdiff_t pf_col = to_next ? pf_n0 : n0;
        const ptrdiff_t pf_cols = npad - pf_col < n_pb * GM_NR ? npad - pf_col : n_pb * GM_NR;
        const char *pf_base = (const char *)(wp + nk0 * npad + pf_col * nkcb);
        const ptrdiff_t pf_lines = (to_next || nk0 != k0) && rows_outer
                                       ? (nkcb * pf_cols * (ptrdiff_t)sizeof(GM_PT) + 63) / 64 : 0;
        ptrdiff_t pf_per = n_blk > n_pb ? (pf_lines + n_blk - n_pb - 1) / (n_blk - n_pb) : 0;
        if (pf_per > kcb) pf_per = kcb;
#endif
        for (ptrdiff_t b = 0; b < n_blk; b++) {
#if GM_L2_NEXT
            /* this block's slice of those lines: [l0, l0 + nl2) */
            ptrdiff_t l0 = 0, nl2 = 0;
            if (pf_per && b >= n_pb && (b - n_pb) * pf_per < pf_lines) {
                l0 = (b - n_pb) * pf_per;
                nl2 = l0 + pf_per < pf_lines ? pf_per : pf_lines - l0;
            }
#endif
            /* register block b and the next one (b + 1, none after the last) */
            ptrdiff_t i0 = GM_MR * (rows_outer ? b / n_pb : b % n_rb);
            ptrdiff_t j0 = n0 + GM_NR * (rows_outer ? b % n_pb : b / n_rb);
            ptrdiff_t ni = GM_MR * (rows_outer ? (b + 1) / n_pb : (b + 1) % n_rb);
            ptrdiff_t nj = n0 + GM_NR * (rows_outer ? (b + 1) % n_pb : (b + 1) / n_rb);
            int mr = m - i0 < GM_MR ? (int)(m - i0) : GM_MR;
            ptrdiff_t nv = n_end - j0 < GM_NR ? n_end - j0 : GM_NR;
            const FA_T *xb = x + i0 * x_rs + k0;
            const GM_PT *panel = blk + j0 * kcb;
            FA_T *yb = y + i0 * y_rs + j0;
            if (b + 1 < n_blk) {          /* pointers formed only inside the arrays */
                ptrdiff_t nx_cols = n_end - nj < GM_NR ? n_end - nj : GM_NR;
                int nx_rows = m - ni < GM_MR ? (int)(m - ni) : GM_MR;
                FA_NAME(prefetch_rows)(y + ni * y_rs + nj, y_rs, nx_rows, nx_cols);
                if (last && res)
                    FA_NAME(prefetch_rows)(res + ni * res_rs + nj, res_rs, nx_rows, nx_cols);
            }
#define GM_CALL(R) FA_NAME(mk)(xb, x_rs, R, kcb, panel, yb, y_rs, nv, first, i0 == 0)
#if FA_VW > 1
            /* whole blocks that find their panel in L2 / L3 (not the first row block, which
             * prefetches it from memory): the tight loop */
            if (mr == GM_MR && nv == GM_NR && i0 != 0) {
                /* with a residual, the last K block in two calls (the partial sums go through
                 * y exactly), the rows the epilogue adds fetched GM_RES_LEAD k steps before
                 * the end */
                ptrdiff_t ks = last && res && kcb > 2 * GM_RES_LEAD ? kcb - GM_RES_LEAD : kcb;
                FA_NAME(mk_full)(xb, x_rs, ks, panel, yb, y_rs, first
                                 GM_L2_ARGS(pf_base + 64 * l0, nl2 < ks ? nl2 : ks));
                if (ks < kcb) {
                    FA_NAME(prefetch_rows)(res + i0 * res_rs + j0, res_rs, GM_MR, GM_NR);
                    FA_NAME(mk_full)(xb + ks, x_rs, kcb - ks, panel + ks * GM_NR, yb, y_rs, 0
                                     GM_L2_ARGS(pf_base, 0));
                }
            } else
#endif
            {
#if GM_L2_NEXT
            for (ptrdiff_t l = 0; l < nl2; l++) FA_PREFETCH(pf_base + 64 * (l0 + l), 2);
#endif
            switch (mr) {
            case GM_MR: GM_CALL(GM_MR); break;
            case 1: GM_CALL(1); break;
#if GM_MR > 2
            case 2: GM_CALL(2); break;
#endif
#if GM_MR > 3
            case 3: GM_CALL(3); break;
#endif
#if GM_MR > 4
            case 4: GM_CALL(4); break;
#endif
#if GM_MR > 5
            case 5: GM_CALL(5); break;
#endif
#if GM_MR > 6
#error "GM_MR > 6: extend the remainder switch"
#endif
            default: break;
            }
            }
#undef GM_CALL
            if (last && (bias || act || res)) {
#ifdef GM_VEC_ACT
                if (mr == GM_MR && nv == GM_NR)
                    FA_NAME(epilogue_block)(yb, y_rs, bias ? bias + j0 : NULL, act,
                                            res ? res + i0 * res_rs + j0 : NULL, res_rs);
                else
#endif
                for (int r = 0; r < mr; r++)
                    FA_NAME(epilogue_row)(yb + r * y_rs, nv, bias ? bias + j0 : NULL, act,
                                          res ? res + (i0 + r) * res_rs + j0 : NULL);
            }
        }
        k0 += kcb;
    } while (k0 < K);
}

#undef GM_NR
#undef GM_PT
#undef GM_PLOAD
#ifdef GM_HALF
#undef GM_HALF
#undef GM_PLOAD_HALF
#endif
#undef GM_PANEL_OUTER_RB
#undef GM_PF_K
#undef GM_PF_NEAR
#undef GM_L2_NEXT
#undef GM_L2_ARGS
#undef GM_RES_LEAD
#undef GM_ACC
#undef GM_ZERO
#ifdef GM_VEC_ACT
#undef GM_VEC_ACT
#endif
#undef GM_MR
#undef GM_NV
#undef GM_KC
#ifdef GM_WIDEN
#undef GM_WIDEN
#endif
/* GM_KEEP_INSTANCE (the includer's): leave the simd.h instance open, so that a template included
 * next can call this one's epilogue and LayerNorm rows (qgemm_tile.h ends it) */
#ifndef GM_KEEP_INSTANCE
#define FA_SIMD_END
#include "simd.h"
#endif
