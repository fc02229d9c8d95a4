/* fa_driver.c -- the fused attention driver: tiling and workspace plan (here, dtype-free), and
 * the parallel passes instantiated once per dtype from fa_driver_impl.h.
 *
 * Design:
 *   Fused scaled dot-product attention, FlashAttention-style, on the CPU.
 *
 *   Work items: the output is (N, L, Ev) with N = prod(broadcast leading dims). Its rows are cut
 *   into query blocks of bq rows (fa_query_block: FA_BQ, or all L rows when L is short and N
 *   large); one work item = one (n, query block[, key split]). One
 *   OpenMP parallel region per call runs the passes below, each an `omp for` with a barrier
 *   after it. Items share nothing but read-only inputs and write disjoint output rows, and tile
 *   sizes are fixed by the shape alone, so the result is bitwise the same for any thread count.
 *
 *   Pass 1: pack every key tile (E x bk, in panels of the micro-kernel's width) and value tile
 *           (bk x Ev) once, into the call's workspace; skipped for L <= FA_DIRECT_MAX_L
 *           (decode), where items read K and V in place, and when each head has one query
 *           block and one key tile (fused_pack): its item packs them into its own scratch.
 *   Pass 2: per item, stream over key tiles of bk keys:
 *     1. scores = scale * q_block @ k_tile.T and row maxima    (qk_tile, register-blocked)
 *     2. per row: mask, online-softmax update                   (row_update)
 *          m_new = max(m, rowmax), p = exp(s - m_new), l_new = l exp(m - m_new) + sum(p)
 *     3. acc = acc * (l exp(m - m_new) / l_new) + (p @ v_tile) / l_new
 *        (pv_tile: the rescale is fused into the epilogue; acc stays normalised, never > max|v|)
 *   and a row with no allowed key (l == 0) stays zero, never NaN.
 *   Pass 3: (decode with S > FA_KEY_SPLIT only) merge the fixed key splits through (m, l).
 *   Pass 4: (weights only) recompute the scores tile by tile: w = exp(s - m) / l.
 *   Key tiles above the causal diagonal are never visited; tiles whose mask allows nothing are
 *   skipped. Extra memory: the packed K and V (the size of K + V) plus O(bq * bk) per thread.
 *
 *   Numerics: the scores and P @ V run in the input precision; the running max m and sum l are
 *   doubles. exp is a vectorised polynomial (simd.h). Masked scores are set to -inf by
 *   selection, not addition, so NaN/inf in a masked-out key never reaches the output; a value
 *   block holding inf/NaN makes P @ V skip zero probabilities for the same reason.
 *
 * The kernels assume (functional.py and _validation.py check all of it first): q, k, v, mask
 * and out aligned to their item size, native byte order, last dimension contiguous; strides in
 * elements (0 for broadcast dimensions); out's elements distinct, none shared with an input;
 * every size > 0; the workspace sized by fa_plan.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1    /* sched_getcpu and the CPU_* macros in fa_team.h */
#endif
#include <math.h>
#include <stddef.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#else
#define omp_get_thread_num() 0
#define omp_get_num_threads() 1
#endif

#include "fa_driver.h"
#include "fa_team.h"
#include "fa_kernels.h"
#include "fa_workspace.h"

static int round_up(int x, int m) { return (x + m - 1) / m * m; }

/* Work queues of a parallel pass: thread t owns the t-th of n_q contiguous shares of the items
 * (so the heads it takes are the rows the GEMMs around it give the same thread: the models'
 * linear layers split their rows the same way), takes them in order, then the unclaimed
 * items of the other shares, one at a time (a core the host slows does not hold the others
 * up). next: n_q counters, FA_QSTRIDE apart (a cache line each), zeroed before the region.
 * Against one dynamic queue (items in order to whichever thread was free), same process:
 * 8 x 8 x 128 x 128 x 64 1.010, causal 1.001, 1 x 8 x 1024 x 1024 x 64 1.025, 2048 causal
 * 1.027, 16 x 8 x 1 x 2048 x 64 1.028; the base Transformer forward, process pairs, median
 * 1.018 (AVX-512 Xeon, bench/results/ab_attention_avx512.txt). Which thread runs an item
 * never changes its bits. */
#define FA_QMAX 64
#define FA_QSTRIDE 8
typedef struct {
    int u, n_q, tid;
    ptrdiff_t total;
} fa_queue;

static void fa_queue_start(fa_queue *qs, int tid, int team, ptrdiff_t total)
{
    qs->u = 0;
    qs->n_q = team < FA_QMAX ? team : FA_QMAX;
    qs->tid = tid;
    qs->total = total;
}

/* the next item for this thread, -1 when every share is exhausted; *share_end: the end of the
 * share it came from */
static ptrdiff_t fa_queue_next(fa_queue *qs, ptrdiff_t *next, ptrdiff_t *share_end)
{
    for (; qs->u < qs->n_q; qs->u++) {
        int s = (qs->tid + qs->u) % qs->n_q;
        ptrdiff_t lo = qs->total * s / qs->n_q, hi = qs->total * (s + 1) / qs->n_q;
        ptrdiff_t i = lo + __atomic_fetch_add(next + (ptrdiff_t)s * FA_QSTRIDE, 1, __ATOMIC_RELAXED);
        if (i < hi) {
            *share_end = hi;
            return i;
        }
    }
    return -1;
}
static ptrdiff_t round64(ptrdiff_t n) { return (n + 63) / 64 * 64; }

int fa_key_block(int E, int Ev, int S, int itemsize)
{
    /* 512 floats / 256 doubles per key tile for head sizes up to 128 / 64, fewer beyond (a packed
     * key tile <= 256 KiB, half the L2 of the machines this was tuned on). The micro-kernels work
     * panel by panel (NR columns), so what must stay in L1 is one panel and the query rows, not
     * the tile; long tiles make the per-tile work of the online softmax (row sums, rescales, the
     * P @ V epilogue) rarer: from 128 to 512 keys measured 4-7% faster at 2048 x 2048 x 64; with
     * 512-key tiles 96 query rows per item beat 48 by 1-8% without a mask (K and V stream through
     * L2 half as often) and lose 1-2% with a causal one (a wider diagonal band).
     * Never more columns than S needs (rounded up to the panel width): short key ranges with huge
     * heads would otherwise pad each packed tile far beyond the keys themselves. */
    int bk = itemsize == 4 ? 512 : 256;
    int pad = itemsize == 4 ? FA_PAD_F32 : FA_PAD_F64;
    ptrdiff_t emax = E > Ev ? E : Ev;
    if (emax < 1) emax = 1;
    while (bk > pad && (ptrdiff_t)bk * emax * itemsize > 256 * 1024) bk /= 2;
    if (S < bk) bk = round_up(S > 0 ? S : 1, pad);
    return bk;
}

int fa_query_block(ptrdiff_t L, ptrdiff_t N, int ncols_max)
{
    /* Short query ranges over many heads (a model's own attention: 128 tokens, 8-12 heads, a
     * batch) run as one block per head: with FA_BQ rows L = 128 made two items per head, 96
     * rows and a 32-row one, and every item passes over all of the head's packed keys and
     * values (8 x 8 x 128 x 128 x 64, two threads, old and new build in one process: 4% faster
     * as one block). Only while the block's score tile stays within the largest FA_BQ-row one
     * (the scratch never grows past what FA_BQ rows may need), and with enough heads to keep
     * every thread busy. */
    if (L > FA_BQ && L <= FA_BQ_ONE && N >= FA_BQ_ONE_N && L * (ptrdiff_t)ncols_max <= FA_BQ * 512)
        return (int)L;
    return FA_BQ;
}

ptrdiff_t fa_scratch_bytes(int bq, int bk, int pad, int Ev, int itemsize)
{
    /* the layout sdpa_item carves out of it: scores (bq, ncols_max) and acc (bq, evp) in the
     * input dtype, then m, l, ca, cb (bq,) as doubles, then rowmax (bq,) in the input dtype */
    ptrdiff_t ncols_max = round_up(bk, pad);
    ptrdiff_t evp = round_up(Ev > 0 ? Ev : 1, itemsize == 4 ? FA_PADV_F32 : FA_PADV_F64);
    return ((ptrdiff_t)bq * ncols_max + (ptrdiff_t)bq * evp) * itemsize
           + 4 * (ptrdiff_t)bq * (ptrdiff_t)sizeof(double) + (ptrdiff_t)bq * itemsize;
}

/* C-order strides (in slabs) over `shape`, 0 where it broadcasts; returns the slab count. */
static ptrdiff_t slab_strides(int nd, const ptrdiff_t *shape, ptrdiff_t *strides)
{
    ptrdiff_t stride = 1;
    for (int d = nd - 1; d >= 0; d--) {
        strides[d] = shape[d] > 1 ? stride : 0;
        stride *= shape[d];
    }
    return stride;
}

void fa_problem_tiling(fa_problem *p, int itemsize)
{
    /* sizes stop 2^20 short of 2^31 (fastattn/_validation.py, DIM_MAX); the block counts are
     * computed in ptrdiff_t all the same */
    p->itemsize = itemsize;
    p->pad = itemsize == 4 ? FA_PAD_F32 : FA_PAD_F64;
    p->bk = fa_key_block(p->E, p->Ev, p->S, itemsize);
    p->ncols_max = round_up(p->bk, p->pad);
    p->evp = round_up(p->Ev > 0 ? p->Ev : 1, itemsize == 4 ? FA_PADV_F32 : FA_PADV_F64);
    p->n_kt = (int)(((ptrdiff_t)p->S + p->bk - 1) / p->bk);
    p->bq = fa_query_block(p->L, p->N, p->ncols_max);
    p->n_qb = (int)(((ptrdiff_t)p->L + p->bq - 1) / p->bq);
    /* few query rows read K and V in place (no packing); with many keys as well, the keys are
     * split into fixed chunks of FA_KEY_SPLIT (a rule of the shape alone, so results stay
     * bitwise independent of the thread count) merged through their row max and sum */
    p->n_sp = 1;
    if (p->L <= FA_DIRECT_MAX_L && !p->packed_only) {
        p->n_ks = p->n_vs = 0;
        memset(p->kslab_lead, 0, sizeof p->kslab_lead);
        memset(p->vslab_lead, 0, sizeof p->vslab_lead);
        if (p->S > FA_KEY_SPLIT)
            p->n_sp = (int)(((ptrdiff_t)p->S + FA_KEY_SPLIT - 1) / FA_KEY_SPLIT);
    } else {
        p->n_ks = slab_strides(p->nd, p->k_shape, p->kslab_lead);
        p->n_vs = slab_strides(p->nd, p->v_shape, p->vslab_lead);
    }
    /* One query block and one key tile per head, every head its own keys and values: the item
     * that uses a head's packed tiles is the only one, so it packs them itself, into its
     * thread's scratch, right before using them (they stay in L1/L2). Pass 1 instead wrote all
     * packed tiles to the workspace and pass 2 read them back from memory: at 8 x 8 x 128 x 128
     * x 64 the packing was 16% of the call. */
    p->fused_pack = p->n_ks > 0 && p->n_qb == 1 && p->n_kt == 1 && p->n_sp == 1
                    && p->head_group == 1 && p->n_ks == p->N && p->n_vs == p->N;
}

ptrdiff_t fa_own_key_tile_bytes(const fa_problem *p)
{
    return round64((ptrdiff_t)p->E * p->ncols_max * p->itemsize);
}

ptrdiff_t fa_fused_pack_bytes(const fa_problem *p)
{
    if (!p->fused_pack) return 0;
    return fa_own_key_tile_bytes(p) + round64((ptrdiff_t)p->bk * p->evp * p->itemsize);
}

ptrdiff_t fa_parallel_items(const fa_problem *p)
{
    /* pass 1 packs (n_ks + n_vs) * n_kt tiles, pass 2 runs N * n_qb * n_sp items */
    ptrdiff_t items = p->N * p->n_qb * p->n_sp;
    ptrdiff_t packs = p->fused_pack ? 0 : (p->n_ks + p->n_vs) * p->n_kt;
    return items > packs ? items : packs;
}

void fa_plan(const fa_problem *p, int n_threads, fa_work *w)
{
    ptrdiff_t isz = p->itemsize;
    int packed = p->n_ks > 0 && !p->fused_pack;
    w->base = NULL;
    w->scratch_stride = round64(fa_scratch_bytes(p->bq, p->bk, p->pad, p->Ev, p->itemsize))
                        + fa_fused_pack_bytes(p);
    w->size[FA_W_KPACK] = packed ? p->n_ks * p->n_kt * p->E * p->ncols_max * isz : 0;
    w->size[FA_W_VPACK] = packed ? p->n_vs * p->n_kt * p->bk * p->evp * isz : 0;
    w->size[FA_W_VBAD] = packed ? p->n_vs * p->n_kt : 0;
    w->size[FA_W_SCRATCH] = w->scratch_stride * n_threads;
    w->size[FA_W_PART] = p->n_sp > 1 ? p->N * p->n_sp * p->L * p->Ev * isz : 0;
    w->size[FA_W_PML] = p->n_sp > 1 ? p->N * p->n_sp * 2 * p->L * (ptrdiff_t)sizeof(double) : 0;
    /* pieces at 64-byte offsets; the total ends exactly where the last used piece ends, so an
     * overrun of it is an overrun of the allocation (what AddressSanitizer sees) */
    ptrdiff_t at = 0;
    w->total = 0;
    for (int i = 0; i < FA_W_PIECES; i++) {
        w->off[i] = at;
        if (w->size[i] > 0) {
            w->total = at + w->size[i];
            at = round64(w->total);
        }
    }
}

/* Element offset of flat leading index n in an array with the given leading strides.
 * head_group > 1 maps the last leading index h to h / head_group (grouped-query heads). */
static ptrdiff_t lead_offset(ptrdiff_t n, int nd, const ptrdiff_t *shape, const ptrdiff_t *strides,
                             int head_group)
{
    ptrdiff_t off = 0;
    for (int d = nd - 1; d >= 0; d--) {
        ptrdiff_t idx = n % shape[d];
        n /= shape[d];
        if (d == nd - 1 && head_group > 1) idx /= head_group;
        off += idx * strides[d];
    }
    return off;
}

/* Pass 1's item `item` (a key or a value tile to pack): tile t of slab item / n_kt, keys
 * [k0, k0 + nk) of the S. */
typedef struct {
    ptrdiff_t slab, t;
    int k0, nk;
} fa_pack_item;

static inline fa_pack_item pack_item(ptrdiff_t item, ptrdiff_t n_kt, int bk, int S)
{
    fa_pack_item at;
    at.slab = item / n_kt;
    at.t = item % n_kt;
    at.k0 = (int)(at.t * bk);
    at.nk = S - at.k0 > bk ? bk : S - at.k0;
    return at;
}

static char *piece(const fa_work *w, int i) { return w->size[i] > 0 ? w->base + w->off[i] : NULL; }
static char *piece_end(const fa_work *w, int i) { return w->base + w->off[i] + w->size[i]; }

#define FA_T float
#define FA_SFX(x) x##_f32
#define FA_DT f32
#include "fa_driver_impl.h"

#define FA_T double
#define FA_SFX(x) x##_f64
#define FA_DT f64
#include "fa_driver_impl.h"
