/* fa_driver.h -- the fused attention driver: one call's problem, its workspace plan, and the
 * parallel passes over work items (fa_driver.c, one instance per dtype). The Cython module
 * (_attention.pyx) validates nothing here: attention.py / _validation.py did; it fills an
 * fa_problem from the arrays, asks fa_plan for the workspace, allocates it (fa_workspace.h) and
 * calls fa_sdpa_run_<dtype> once, without the GIL.
 *
 * Shapes: the output is (N, L, Ev) with N = prod(lead), the broadcast leading (batch, head, ...)
 * shape. q (..., L, E), k (..., S, E), v (..., S, Ev) and the mask (..., L, S) each carry their own
 * leading dims, right-aligned to lead (NumPy broadcasting) with stride 0 where they broadcast.
 */
#ifndef FASTATTN_FA_DRIVER_H
#define FASTATTN_FA_DRIVER_H

#include <stddef.h>

/* Tile sizes: fixed by the shape alone (never by the thread count), so that results are bitwise
 * the same for any number of threads. */
enum {
    FA_BQ = 96,            /* query rows per work item (a multiple of every ISA's 6- or 4-row block) */
    FA_BQ_ONE = 192,       /* up to this many query rows, one block per leading index when there
                            * are FA_BQ_ONE_N of them or more (fa_query_block) */
    FA_BQ_ONE_N = 8,
    FA_CAUSAL_SB = 24,     /* causal: a key tile crossing the diagonal is taken in row groups of
                            * this many (a multiple of 6 and 4), each over the keys it sees */
    FA_DIRECT_MAX_L = 16,  /* up to this many query rows, K and V are read in place (no packing) */
    FA_KEY_SPLIT = 2048,   /* ... and keys beyond this many are split into chunks merged by LSE */
    FA_MAX_LEAD = 32       /* leading dimensions a call may have */
};

/* The pieces of a call's workspace, in order (sized by fa_plan, the one place that does) */
enum {
    FA_W_KPACK = 0,        /* (n_ks, n_kt, E, ncols_max) packed key tiles            (L > DIRECT_MAX_L) */
    FA_W_VPACK = 1,        /* (n_vs, n_kt, bk, evp) packed value tiles                (L > DIRECT_MAX_L) */
    FA_W_VBAD = 2,         /* (n_vs, n_kt) pack_v's flags per value tile, bytes      (L > DIRECT_MAX_L) */
    FA_W_SCRATCH = 3,      /* (n_threads, scratch_stride) per-thread tiles, see fa_scratch_bytes */
    FA_W_PART = 4,         /* (N, n_sp, L, Ev) partial outputs of the key splits      (n_sp > 1) */
    FA_W_PML = 5,          /* (N, n_sp, 2, L) their row max and sum, doubles          (n_sp > 1) */
    FA_W_PIECES = 6
};

typedef struct {
    /* shapes (every size > 0) and strides in elements, 0 where a dimension broadcasts */
    int nd;
    ptrdiff_t lead[FA_MAX_LEAD];        /* the broadcast leading shape; N = prod(lead) */
    ptrdiff_t q_lead[FA_MAX_LEAD];      /* leading strides of q, k, v and the mask */
    ptrdiff_t k_lead[FA_MAX_LEAD];
    ptrdiff_t v_lead[FA_MAX_LEAD];
    ptrdiff_t m_lead[FA_MAX_LEAD];
    ptrdiff_t k_shape[FA_MAX_LEAD];     /* k's (v's) own leading shape, left-padded with 1 */
    ptrdiff_t v_shape[FA_MAX_LEAD];
    ptrdiff_t kslab_lead[FA_MAX_LEAD];  /* index of a packed k (v) slab, in slabs: C order over */
    ptrdiff_t vslab_lead[FA_MAX_LEAD];  /* k_shape (v_shape), 0 where broadcast */
    ptrdiff_t o_lead[FA_MAX_LEAD];      /* the output's leading strides (its shape is lead) */
    ptrdiff_t q_rs, k_rs, v_rs;         /* row strides */
    ptrdiff_t o_rs;                     /* the output's row stride (Ev when C-contiguous) */
    ptrdiff_t m_rs, m_cs;               /* mask row and column strides (0: broadcast) */
    ptrdiff_t N;
    int L, S, E, Ev;
    int causal;                         /* top-left: query i sees keys j <= i */
    double scale;
    int head_group;                     /* grouped-query attention: q heads per k/v head */
    int packed_only;                    /* never the in-place path of few query rows: a row's
                                         * result then does not depend on how many rows its
                                         * call has (padding), at some cost for L <= 16 */
    int isa;                            /* the kernel set it runs (FA_ISA_*, simd.h's state) */
    /* tiling (fa_problem_tiling fills these from the sizes above) */
    int itemsize, bk, pad, ncols_max, evp;
    ptrdiff_t n_kt;                     /* key tiles */
    int bq;                             /* query rows per block (fa_query_block) */
    ptrdiff_t n_qb;                     /* query blocks of bq rows */
    ptrdiff_t n_ks, n_vs;               /* packed key / value slabs (0 when not packed) */
    int n_sp;                           /* key splits (few query rows, S > FA_KEY_SPLIT) */
    int fused_pack;                     /* each item packs its own head's key and value tile
                                         * into its thread's scratch (no pass 1) */
} fa_problem;

typedef struct {
    char *base;                         /* one allocation of exactly `total` bytes, 64-aligned */
    ptrdiff_t total;
    ptrdiff_t off[FA_W_PIECES];         /* byte offset of each piece (multiples of 64) */
    ptrdiff_t size[FA_W_PIECES];        /* bytes of each piece (0: not used by this call) */
    ptrdiff_t scratch_stride;           /* bytes of one thread's scratch (a multiple of 64) */
} fa_work;

/* Keys per tile for these head sizes, item size and key count. */
int fa_key_block(int E, int Ev, int S, int itemsize);
/* Query rows per work item for L query rows, N leading indices and key tiles of ncols_max
 * columns (a rule of the shape alone). */
int fa_query_block(ptrdiff_t L, ptrdiff_t N, int ncols_max);
/* Bytes one thread's scratch needs for blocks of bq query rows and tiles of bk keys. */
ptrdiff_t fa_scratch_bytes(int bq, int bk, int pad, int Ev, int itemsize);
/* The tiling fields of p from its sizes, lead and the k / v leading shapes. */
void fa_problem_tiling(fa_problem *p, int itemsize);
/* Bytes of thread scratch a fused-pack item's own packed key tile takes, and its key and value
 * tiles together (0 without fused_pack); each rounded to 64, after the item scratch. */
ptrdiff_t fa_own_key_tile_bytes(const fa_problem *p);
ptrdiff_t fa_fused_pack_bytes(const fa_problem *p);
/* The most independent work items any pass of the call has (more threads would only wait). */
ptrdiff_t fa_parallel_items(const fa_problem *p);
/* Size every piece of the workspace for n_threads threads; w->base is left to the caller. */
void fa_plan(const fa_problem *p, int n_threads, fa_work *w);

/* The fused attention, all passes, with the kernel set p->isa on n_threads OpenMP threads (the
 * count fa_plan was given: fa_team_size(threads wanted, fa_parallel_items(p))). bm (bool, nonzero =
 * may attend) or fm (float, added) is the mask, or both NULL. out (*lead, L, Ev) at the strides
 * o_lead / o_rs (rows of distinct items never share memory); weights (N, L, S) C-contiguous,
 * zero-filled, with stats (N, 2, L), or both NULL. */
void fa_sdpa_run_f32(const fa_problem *p, const fa_work *w, const float *q, const float *k,
                     const float *v, const unsigned char *bm, const float *fm, float *out,
                     float *weights, double *stats, int n_threads);
void fa_sdpa_run_f64(const fa_problem *p, const fa_work *w, const double *q, const double *k,
                     const double *v, const unsigned char *bm, const double *fm, double *out,
                     double *weights, double *stats, int n_threads);

/* y = softmax(x) row by row: x, y (rows, n) C-contiguous; exp: y = exp(x) elementwise (tests);
 * with the kernel set isa (FA_ISA_*). */
void fa_softmax_rows_f32(int isa, const float *x, float *y, ptrdiff_t rows, int n, int n_threads);
void fa_softmax_rows_f64(int isa, const double *x, double *y, ptrdiff_t rows, int n,
                         int n_threads);
void fa_exp_f32(int isa, const float *x, ptrdiff_t n, float *y);
void fa_exp_f64(int isa, const double *x, ptrdiff_t n, double *y);

#endif
