/* fa_driver_impl.h -- the parallel passes of fa_driver.c for one dtype (a template).
 *
 * The includer defines:
 *   FA_T       element type (float or double)
 *   FA_SFX(x)  name mangling, x##_f32 or x##_f64
 *   FA_DT      the dtype's member of fa_kernels (f32 or f64, fa_kernels.h)
 * and includes this file once per dtype; it undefines them at its end. Each function takes the
 * micro-kernels of the call's kernel set (p->isa, or its isa argument) once, into `ops`.
 */

/* the micro-kernel table of this dtype in the kernel set `isa` */
#define FA_OPS (*ops)
#define FA_OPS_DECL(isa) const FA_SFX(fa_ops) *const ops = &fa_kernels_for(isa)->FA_DT

/* Whether the mask tile (rows of this block, keys of this tile) allows any key. */
static int FA_SFX(tile_allows_any)(const unsigned char *bm, const FA_T *fm, ptrdiff_t m_rs,
                                   ptrdiff_t m_cs, int nq, int nk)
{
    int rows = m_rs == 0 ? 1 : nq;
    int cols = m_cs == 0 ? 1 : nk;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < cols; j++) {
            if (bm != NULL) {
                if (bm[r * m_rs + j * m_cs]) return 1;
            } else if (fm[r * m_rs + j * m_cs] != -(FA_T)INFINITY) {
                return 1;
            }
        }
    return 0;
}

/* A mask row shared by all query rows, over the nk keys of one tile (bm or fm set, at the
 * tile's first key, key stride m_cs; some key allowed): returns the keys that matter, up to and
 * including the last allowed one. *bmt / *fmt are set to NULL when every one of those keys is
 * allowed with no change to its score (bool True, or an additive 0.0), else left as they are. */
static int FA_SFX(shared_mask_extent)(const unsigned char *bm, const FA_T *fm, ptrdiff_t m_cs,
                                      int nk, const unsigned char **bmt, const FA_T **fmt)
{
    int last = -1, first_bad = nk;       /* last allowed key, first key that changes a score */
    for (int j = 0; j < nk; j++) {
        int allowed = bm != NULL ? bm[j * m_cs] != 0 : fm[j * m_cs] != -(FA_T)INFINITY;
        int neutral = bm != NULL ? allowed : fm[j * m_cs] == 0;
        if (allowed) last = j;
        if (!neutral && first_bad == nk) first_bad = j;
    }
    /* keys after `last` are left out, so only those up to it need to be neutral */
    if (first_bad > last) {
        *bmt = NULL;
        *fmt = NULL;
    }
    return last + 1;
}

/* Prefetch (towards L2) share r of nq of the next head's q, k and v rows: q row r and keys
 * [r S / nq, (r + 1) S / nq). A fused item calls it once per softmax row, so the next head's
 * inputs arrive while this head computes instead of stalling its packing and first q pass
 * (8 x 8 x 128 x 128 x 64, same process: +9-14%, causal +8-13%). */
static void FA_SFX(prefetch_share)(const fa_problem *p, const FA_T *q, const FA_T *k,
                                   const FA_T *v, int r, int nq)
{
    const int qb = p->E * (int)sizeof(FA_T), vb = p->Ev * (int)sizeof(FA_T);
    for (int b = 0; b < qb; b += 64) FA_PREFETCH((const char *)(q + r * p->q_rs) + b, 2);
    const int j0 = (int)((ptrdiff_t)r * p->S / nq), j1 = (int)((ptrdiff_t)(r + 1) * p->S / nq);
    for (int j = j0; j < j1; j++) {
        for (int b = 0; b < qb; b += 64) FA_PREFETCH((const char *)(k + j * p->k_rs) + b, 2);
        for (int b = 0; b < vb; b += 64) FA_PREFETCH((const char *)(v + j * p->v_rs) + b, 2);
    }
}

/* One work item: query rows [q0, q0 + nq) of one leading index against keys [kstart, kstop). */
static void FA_SFX(sdpa_item)(
    const fa_problem *p,
    const FA_T *q,                          /* IN  (nq, E) this block's query rows, stride q_rs */
    const FA_T *kp, const FA_T *vp,         /* IN  packed key / value tiles of this slab, or NULL */
    const unsigned char *v_bad,             /* IN  (n_kt,) the value tiles' pack_v flags */
    const FA_T *k, const FA_T *v,           /* IN  (S, E) keys and (S, Ev) values, read in place
                                                   when kp / vp are NULL (decode) */
    const unsigned char *bm, const FA_T *fm,/* IN  mask rows of this block, or NULL */
    FA_T *out, ptrdiff_t out_rs,            /* OUT (nq, Ev) */
    double *m_out, double *l_out,           /* OUT (nq,) row max and sum, or NULL */
    int q0, int nq, int kstart, int kstop,  /* IN  key range (multiples of bk, or S) */
    const FA_T *pf_q, const FA_T *pf_k,     /* IN  the next head's q, k, v to prefetch (a fused */
    const FA_T *pf_v,                       /*     item), or NULL */
    char *scratch, char *scratch_end)       /* this thread's scratch */
{
    FA_OPS_DECL(p->isa);
    const int S = p->S, E = p->E, Ev = p->Ev, bk = p->bk, pad = p->pad;
    const int ncols_max = p->ncols_max, evp = p->evp, causal = p->causal;
    const ptrdiff_t q_rs = p->q_rs, k_rs = p->k_rs, v_rs = p->v_rs, m_rs = p->m_rs, m_cs = p->m_cs;
    const FA_T scale = (FA_T)p->scale;
    const ptrdiff_t kp_tile = (ptrdiff_t)E * ncols_max;   /* packed key tile stride */
    const ptrdiff_t vp_tile = (ptrdiff_t)bk * evp;        /* packed value tile stride */
    /* scratch layout (sized by fa_scratch_bytes); 64-byte aligned by the caller */
    const int bq = p->bq;
    FA_T *sc = (FA_T *)scratch;                           /* (bq, ncols_max) scores, then P */
    FA_T *acc = sc + (ptrdiff_t)bq * ncols_max;           /* (bq, evp) normalised output */
    double *m = (double *)(acc + (ptrdiff_t)bq * evp);    /* (bq,) running max */
    double *l = m + bq;                                   /* (bq,) running sum */
    double *ca = l + bq;                                  /* (bq,) accumulator factors */
    double *cb = ca + bq;                                 /* (bq,) P @ V factors (1 / l) */
    FA_T *rowmax = (FA_T *)(cb + bq);                     /* (bq,) tile row maxima */
    FA_ASSERT_IN(rowmax, bq * sizeof(FA_T), scratch, scratch_end, "item scratch");
    (void)scratch_end;

    memset(acc, 0, (size_t)nq * evp * sizeof(FA_T));
    for (int r = 0; r < nq; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0;
    }
    /* causal (top-left): row q0 + r sees keys 0 .. q0 + r, so the block needs keys < q0 + nq */
    int kend = kstop;
    if (causal && q0 + nq < kend) kend = q0 + nq;
    for (int kb = kstart / bk; kb < (kend + bk - 1) / bk; kb++) {
        int k0 = kb * bk;
        int nk = kend - k0 > bk ? bk : kend - k0;
        if ((bm != NULL || fm != NULL)
            && !FA_SFX(tile_allows_any)(bm != NULL ? bm + k0 * m_cs : NULL,
                                        fm != NULL ? fm + k0 * m_cs : NULL, m_rs, m_cs, nq, nk))
            continue;
        /* a mask shared by every query row (a key-padding mask): keys after its last allowed
         * one are left out of the tile (they would add exact zeros to every sum), and where
         * it allows every remaining key without changing a score (True, or 0.0) it is not
         * applied per element at all */
        const unsigned char *bmt = bm;
        const FA_T *fmt = fm;
        if ((bm != NULL || fm != NULL) && m_rs == 0)
            nk = FA_SFX(shared_mask_extent)(bm != NULL ? bm + k0 * m_cs : NULL,
                                            fm != NULL ? fm + k0 * m_cs : NULL, m_cs, nk,
                                            &bmt, &fmt);
        /* causal: a tile that crosses the diagonal is taken in groups of FA_CAUSAL_SB rows,
         * each over the keys its last row sees (the block's first rows see few of the tile's
         * keys: at L = 128 a whole-block pass computed 16384 scores per head where the triangle
         * has 8256). Keys a group does not see contribute nothing to its rows (exp(-inf) = 0),
         * so leaving them out changes no sum; a group that sees no key of the tile is skipped
         * (its rows' m, l and accumulator stay as they are). */
        const int sb = causal && k0 + nk > q0 + 1 ? FA_CAUSAL_SB : nq;
        for (int g0 = 0; g0 < nq; g0 += sb) {
            const int ng = nq - g0 < sb ? nq - g0 : sb;
            int nkg = nk;
            if (causal && q0 + g0 + ng - k0 < nkg) nkg = q0 + g0 + ng - k0;
            if (nkg <= 0) continue;
            const int ncols = round_up(nkg, pad);
            const FA_T *qg = q + (ptrdiff_t)g0 * q_rs;
            FA_T *accg = acc + (ptrdiff_t)g0 * evp;
            /* 1. scores = q_group @ k_tile.T */
            if (kp != NULL)
                FA_OPS.qk_tile(qg, q_rs, ng, E, kp + kb * kp_tile, ncols, nkg, scale, sc, rowmax + g0);
            else
                FA_OPS.qk_direct(qg, q_rs, ng, E, k + k0 * k_rs, k_rs, nkg, scale, sc, ncols,
                                 rowmax + g0);
            /* 2. per row: mask, online softmax; P overwrites the scores */
            for (int r = g0; r < g0 + ng; r++) {
                int lim = nkg;
                if (causal && q0 + r - k0 + 1 < nkg) lim = q0 + r - k0 + 1;
                const unsigned char *bmr = bmt != NULL ? bmt + r * m_rs + k0 * m_cs : NULL;
                const FA_T *fmr = fmt != NULL ? fmt + r * m_rs + k0 * m_cs : NULL;
                ca[r] = FA_OPS.row_update(sc + (ptrdiff_t)(r - g0) * ncols, nkg, ncols, lim,
                                          rowmax[r], bmr, fmr, m_cs, &m[r], &l[r], &cb[r]);
                if (pf_q != NULL) FA_SFX(prefetch_share)(p, pf_q, pf_k, pf_v, r, nq);
            }
            /* 3. acc = diag(ca) acc + diag(cb) P @ v_tile, the rescale fused into P @ V */
            if (vp != NULL) {
                int flags = v_bad[kb];
                if (flags & FA_V_BIG) {
                    /* |v| near the float limit: normalise P first so no partial sum can overflow */
                    for (int r = 0; r < ng; r++) {
                        FA_T a = (FA_T)cb[g0 + r];
                        for (int c = 0; c < nkg; c++) sc[(ptrdiff_t)r * ncols + c] *= a;
                        cb[g0 + r] = 1.0;
                    }
                }
                FA_OPS.pv_tile(sc, ncols, ng, nkg, vp + kb * vp_tile, S - k0 > bk ? bk : S - k0,
                               evp, accg, flags & FA_V_NONFINITE, ca + g0, cb + g0);
            } else {
                /* in place (decode): normalise P, rescale acc, then accumulate row by row */
                for (int r = 0; r < ng; r++) {
                    FA_T a = (FA_T)cb[g0 + r];
                    for (int c = 0; c < nkg; c++) sc[(ptrdiff_t)r * ncols + c] *= a;
                }
                FA_OPS.scale_rows(accg, evp, ng, ca + g0);
                FA_OPS.pv_direct(sc, ncols, ng, nkg, v + k0 * v_rs, v_rs, Ev, accg, evp);
            }
        }
    }
    /* acc is already normalised (row_update); a row that allowed no key (l == 0) is zeros. Key
     * splits are merged through their (m, l) afterwards (merge_splits). */
    FA_OPS.store_rows(acc, evp, nq, Ev, l, out, out_rs);
    if (m_out != NULL)
        for (int r = 0; r < nq; r++) {
            m_out[r] = m[r];
            l_out[r] = l[r];
        }
}

/* Softmax weights of one query block, recomputed tile by tile with the forward pass's final row
 * max and sum: w = exp(s - m) / l (rows with l == 0 stay zero). */
static void FA_SFX(weights_item)(
    const fa_problem *p,
    const FA_T *q, const FA_T *kp,          /* IN  query rows, packed key tiles or NULL */
    const FA_T *k,                          /* IN  keys in place, when kp is NULL */
    const unsigned char *bm, const FA_T *fm,/* IN  mask rows of this block, or NULL */
    const double *m_in, const double *l_in, /* IN  (nq,) from the forward pass */
    FA_T *w, ptrdiff_t w_rs,                /* OUT (nq, S), zero-initialised */
    int q0, int nq, char *scratch, char *scratch_end)
{
    FA_OPS_DECL(p->isa);
    const int S = p->S, E = p->E, bk = p->bk, pad = p->pad, causal = p->causal;
    const ptrdiff_t kp_tile = (ptrdiff_t)E * p->ncols_max;
    const FA_T scale = (FA_T)p->scale;
    FA_T *sc = (FA_T *)scratch;                             /* (bq, ncols_max) */
    FA_T *rowmax = sc + (ptrdiff_t)p->bq * p->ncols_max;    /* (bq,), written, not read */
    FA_ASSERT_IN(rowmax, p->bq * sizeof(FA_T), scratch, scratch_end, "weights scratch");
    (void)scratch_end;
    int kend = causal && q0 + nq < S ? q0 + nq : S;
    for (int kb = 0; kb < (kend + bk - 1) / bk; kb++) {
        int k0 = kb * bk;
        int nk = kend - k0 > bk ? bk : kend - k0;
        int ncols = round_up(nk, pad);
        if (kp != NULL)
            FA_OPS.qk_tile(q, p->q_rs, nq, E, kp + kb * kp_tile, ncols, nk, scale, sc, rowmax);
        else
            FA_OPS.qk_direct(q, p->q_rs, nq, E, k + k0 * p->k_rs, p->k_rs, nk, scale, sc, ncols,
                             rowmax);
        for (int r = 0; r < nq; r++) {
            if (l_in[r] == 0.0) continue;
            int lim = nk;
            if (causal && q0 + r - k0 + 1 < nk) lim = q0 + r - k0 + 1;
            const unsigned char *bmr = bm != NULL ? bm + r * p->m_rs + k0 * p->m_cs : NULL;
            const FA_T *fmr = fm != NULL ? fm + r * p->m_rs + k0 * p->m_cs : NULL;
            FA_OPS.row_weights(sc + (ptrdiff_t)r * ncols, nk, lim, bmr, fmr, p->m_cs, m_in[r],
                               1.0 / l_in[r], w + r * w_rs + k0);
        }
    }
}

/* Combine n_sp partial results of one leading index over disjoint key ranges, in a fixed order:
 * M = max_s m_s, l = sum_s l_s exp(m_s - M), out = sum_s out_s l_s exp(m_s - M) / l, where out_s
 * is split s's normalised output. part (n_sp, L, Ev); pml (n_sp, 2, L) their (m, l); out (L, Ev),
 * row stride out_rs; stats (2 L) receives (M, l) per row when not NULL (the weights pass needs
 * them). */
static void FA_SFX(merge_splits)(const FA_T *part, const double *pml, int n_sp, ptrdiff_t L, int Ev,
                                 FA_T *out, ptrdiff_t out_rs, double *stats, int portable)
{
    /* the portable attention's exp is fa_exp_det (libm's may differ between CPUs and libcs) */
    double (*const dexp)(double) = portable ? fa_exp_det : exp;
    const double *pm = pml, *pl = pml + L;
    for (ptrdiff_t r = 0; r < L; r++) {
        double M = -INFINITY, l = 0.0;
        for (int sp = 0; sp < n_sp; sp++) {
            double mm = pm[2 * sp * L + r];
            if (mm != mm || M != M)
                M = mm != mm ? mm : M;          /* NaN wins */
            else if (mm > M)
                M = mm;
        }
        for (int c = 0; c < Ev; c++) out[r * out_rs + c] = 0;
        if (M != -INFINITY) {
            /* each partial is already normalised by its own l_s: weight it by l_s e^(m_s - M) / l */
            for (int sp = 0; sp < n_sp; sp++)
                if (pm[2 * sp * L + r] != -INFINITY) l += pl[2 * sp * L + r] * dexp(pm[2 * sp * L + r] - M);
            for (int sp = 0; sp < n_sp; sp++) {
                if (pm[2 * sp * L + r] == -INFINITY) continue;
                double f = pl[2 * sp * L + r] * dexp(pm[2 * sp * L + r] - M) / l;
                for (int c = 0; c < Ev; c++) out[r * out_rs + c] += (FA_T)(part[(sp * L + r) * Ev + c] * f);
            }
        }
        if (stats != NULL) {
            stats[r] = M;
            stats[L + r] = l;
        }
    }
}

void FA_SFX(fa_sdpa_run)(const fa_problem *p, const fa_work *ws, const FA_T *q, const FA_T *k,
                         const FA_T *v, const unsigned char *bm, const FA_T *fm, FA_T *out,
                         FA_T *w, double *stats, int n_threads)
{
    FA_OPS_DECL(p->isa);
    const ptrdiff_t isz = sizeof(FA_T);      /* for the debug range checks */
    (void)isz;
    const int nd = p->nd, L = p->L, S = p->S, E = p->E, Ev = p->Ev, bk = p->bk, pad = p->pad;
    const int evp = p->evp, ncols_max = p->ncols_max, n_sp = p->n_sp, hg = p->head_group;
    const ptrdiff_t N = p->N, n_kt = p->n_kt, n_qb = p->n_qb;
    const ptrdiff_t kp_slab = n_kt * E * ncols_max, vp_slab = n_kt * bk * evp;
    const int fused = p->fused_pack;
    const ptrdiff_t n_items = N * n_qb;
    const ptrdiff_t n_kpack = fused ? 0 : p->n_ks * n_kt, n_vpack = fused ? 0 : p->n_vs * n_kt;
    FA_T *kpack = (FA_T *)piece(ws, FA_W_KPACK);
    FA_T *vpack = (FA_T *)piece(ws, FA_W_VPACK);
    unsigned char *v_bad = (unsigned char *)piece(ws, FA_W_VBAD);
    char *scratch = piece(ws, FA_W_SCRATCH);
    FA_T *part = (FA_T *)piece(ws, FA_W_PART);
    double *pml = (double *)piece(ws, FA_W_PML);
    const ptrdiff_t sstride = ws->scratch_stride;
    /* fused packing: the head's packed key tile, then its value tile, end each thread's scratch */
    const ptrdiff_t fp_bytes = fa_fused_pack_bytes(p);

    /* one parallel region for all passes (each `omp for` ends with a barrier): the threads are
     * woken once per call, not once per pass */
    const fa_team_t team_at = fa_team_open(n_threads, fa_parallel_items(p));
    ptrdiff_t qnext[FA_QMAX * FA_QSTRIDE];               /* pass 2's work queues */
    memset(qnext, 0, sizeof qnext);
#pragma omp parallel num_threads(team_at.n)
    {
        fa_team_place(&team_at);
        char *mine = scratch + omp_get_thread_num() * sstride;
        const int team = omp_get_num_threads();
        FA_ASSERT_IN(mine, sstride, piece(ws, FA_W_SCRATCH), piece_end(ws, FA_W_SCRATCH),
                     "thread scratch");
        char *mine_end = mine + sstride - fp_bytes;       /* the item scratch */
        FA_T *kp_own = fused ? (FA_T *)mine_end : NULL;
        FA_T *vp_own = fused ? (FA_T *)(mine_end + fa_own_key_tile_bytes(p)) : NULL;
        unsigned char v_bad_own = 0;
        /* a fused item's own key tile (its head's S <= bk keys), packed into its scratch */
#define FA_PACK_OWN_K(ko)                                                                  \
    do {                                                                                   \
        FA_ASSERT_IN(kp_own, (ptrdiff_t)E * round_up(S, pad) * isz, mine_end, mine + sstride, \
                     "own packed key tile");                                               \
        FA_OPS.pack_k(k + (ko), p->k_rs, S, E, round_up(S, pad), kp_own);                  \
    } while (0)

        /* pass 1: pack every key and value tile once (panels the micro-kernels stream through);
         * n_ks = n_vs = 0 for few query rows, where the items read K and V in place */
#pragma omp for schedule(static)
        for (ptrdiff_t item = 0; item < n_kpack; item++) {
            const fa_pack_item at = pack_item(item, n_kt, bk, S);
            FA_T *tile = kpack + at.slab * kp_slab + at.t * E * ncols_max;
            FA_ASSERT_IN(tile, (ptrdiff_t)E * round_up(at.nk, pad) * isz, piece(ws, FA_W_KPACK),
                         piece_end(ws, FA_W_KPACK), "packed key tile");
            ptrdiff_t ko = lead_offset(at.slab, nd, p->k_shape, p->k_lead, 1);
            FA_OPS.pack_k(k + ko + at.k0 * p->k_rs, p->k_rs, at.nk, E, round_up(at.nk, pad), tile);
        }
#pragma omp for schedule(static)
        for (ptrdiff_t item = 0; item < n_vpack; item++) {
            const fa_pack_item at = pack_item(item, n_kt, bk, S);
            FA_T *tile = vpack + at.slab * vp_slab + at.t * bk * evp;
            FA_ASSERT_IN(tile, (ptrdiff_t)at.nk * evp * isz, piece(ws, FA_W_VPACK),
                         piece_end(ws, FA_W_VPACK), "packed value tile");
            FA_ASSERT_IN(v_bad + item, 1, piece(ws, FA_W_VBAD), piece_end(ws, FA_W_VBAD),
                         "value tile flag");
            ptrdiff_t vo = lead_offset(at.slab, nd, p->v_shape, p->v_lead, 1);
            v_bad[item] = (unsigned char)FA_OPS.pack_v(v + vo + at.k0 * p->v_rs, p->v_rs, at.nk, Ev,
                                                       evp, tile);
        }

        /* pass 2: one work item per (leading index, query block, key split), from the
         * threads' work queues (fa_queue_next) */
        fa_queue queue;
        fa_queue_start(&queue, omp_get_thread_num(), team, n_items * n_sp);
        ptrdiff_t share_end = 0;
        for (ptrdiff_t item; (item = fa_queue_next(&queue, qnext, &share_end)) >= 0;) {
            ptrdiff_t sp = item % n_sp, n = item / n_sp / n_qb, qb = (item / n_sp) % n_qb;
            if (p->causal) qb = n_qb - 1 - qb;   /* longest items (last query blocks) first */
            int q0 = (int)(qb * p->bq);
            int nq = L - q0 > p->bq ? p->bq : L - q0;
            ptrdiff_t qo = lead_offset(n, nd, p->lead, p->q_lead, 1);
            ptrdiff_t ks = lead_offset(n, nd, p->lead, p->kslab_lead, hg);   /* k slab index */
            ptrdiff_t vs = lead_offset(n, nd, p->lead, p->vslab_lead, hg);   /* v slab index */
            ptrdiff_t ko = lead_offset(n, nd, p->lead, p->k_lead, hg);       /* k element offset */
            ptrdiff_t vo = lead_offset(n, nd, p->lead, p->v_lead, hg);       /* v element offset */
            ptrdiff_t mo = lead_offset(n, nd, p->lead, p->m_lead, 1);
            const unsigned char *bmi = bm != NULL ? bm + mo + q0 * p->m_rs : NULL;
            const FA_T *fmi = fm != NULL ? fm + mo + q0 * p->m_rs : NULL;
            FA_T *dst = out + lead_offset(n, nd, p->lead, p->o_lead, 1) + (ptrdiff_t)q0 * p->o_rs;
            ptrdiff_t dst_rs = p->o_rs;
            double *mrow = NULL, *lrow = NULL;
            int kstart = 0, kstop = S;
            if (n_sp > 1) {
                /* split sp covers keys [sp * KEY_SPLIT, min(S, (sp + 1) * KEY_SPLIT)); its partial
                 * result goes to part (N, n_sp, L, Ev), its (m, l) to pml (N, n_sp, 2, L) */
                kstart = (int)(sp * FA_KEY_SPLIT);
                if ((sp + 1) * FA_KEY_SPLIT < S) kstop = (int)((sp + 1) * FA_KEY_SPLIT);
                dst = part + (n * n_sp + sp) * L * Ev;
                dst_rs = Ev;
                mrow = pml + (n * n_sp + sp) * 2 * L;
                lrow = mrow + L;
                FA_ASSERT_IN(dst, (ptrdiff_t)nq * Ev * isz, piece(ws, FA_W_PART),
                             piece_end(ws, FA_W_PART), "key-split partial output");
                FA_ASSERT_IN(mrow, 2 * L * (ptrdiff_t)sizeof(double), piece(ws, FA_W_PML),
                             piece_end(ws, FA_W_PML), "key-split row max and sum");
            } else if (stats != NULL) {
                mrow = stats + 2 * (n * L + q0);
                lrow = mrow + nq;
            }
            const FA_T *kpi = kpack != NULL ? kpack + ks * kp_slab : NULL;
            const FA_T *vpi = vpack != NULL ? vpack + vs * vp_slab : NULL;
            const unsigned char *vbi = v_bad != NULL ? v_bad + vs * n_kt : NULL;
            if (fused) {
                /* this head's only item: its one key and value tile, packed here */
                FA_PACK_OWN_K(ko);
                FA_ASSERT_IN(vp_own, (ptrdiff_t)S * evp * isz, (char *)vp_own, mine + sstride,
                             "own packed value tile");
                v_bad_own = (unsigned char)FA_OPS.pack_v(v + vo, p->v_rs, S, Ev, evp, vp_own);
                kpi = kp_own;
                vpi = vp_own;
                vbi = &v_bad_own;
            }
            /* the head this thread most likely takes next (the next of its share) */
            const FA_T *pfq = NULL, *pfk = NULL, *pfv = NULL;
            if (fused) {
                ptrdiff_t nn = n + 1;
                if (nn < N && item + 1 < share_end) {
                    pfq = q + lead_offset(nn, nd, p->lead, p->q_lead, 1);
                    pfk = k + lead_offset(nn, nd, p->lead, p->k_lead, hg);
                    pfv = v + lead_offset(nn, nd, p->lead, p->v_lead, hg);
                }
            }
            FA_SFX(sdpa_item)(p, q + qo + q0 * p->q_rs, kpi, vpi, vbi, k + ko, v + vo, bmi, fmi,
                              dst, dst_rs, mrow, lrow, q0, nq, kstart, kstop, pfq, pfk, pfv, mine,
                              mine_end);
        }
#pragma omp barrier

        /* pass 3 (key splits only): merge the partial results of each leading index, in split order */
        if (n_sp > 1) {
#pragma omp for schedule(static)
            for (ptrdiff_t n = 0; n < N; n++)
                FA_SFX(merge_splits)(part + n * n_sp * L * Ev, pml + n * n_sp * 2 * L, n_sp, L, Ev,
                                     out + lead_offset(n, nd, p->lead, p->o_lead, 1), p->o_rs,
                                     stats != NULL ? stats + 2 * n * L : NULL,
                                     (p->isa & FA_ISA_PORTABLE) != 0);
        }

        /* pass 4 (weights only): the softmax weights, from the final row max and sum */
        if (w != NULL) {
#pragma omp for schedule(dynamic)
            for (ptrdiff_t item = 0; item < n_items; item++) {
                ptrdiff_t n = item / n_qb, qb = item % n_qb;
                int q0 = (int)(qb * p->bq);
                int nq = L - q0 > p->bq ? p->bq : L - q0;
                ptrdiff_t qo = lead_offset(n, nd, p->lead, p->q_lead, 1);
                ptrdiff_t ks = lead_offset(n, nd, p->lead, p->kslab_lead, hg);
                ptrdiff_t ko = lead_offset(n, nd, p->lead, p->k_lead, hg);
                ptrdiff_t mo = lead_offset(n, nd, p->lead, p->m_lead, 1);
                double *mrow = stats + 2 * (n * L + q0);
                const FA_T *kpi = kpack != NULL ? kpack + ks * kp_slab : NULL;
                if (fused) {
                    FA_PACK_OWN_K(ko);
                    kpi = kp_own;
                }
                FA_SFX(weights_item)(p, q + qo + q0 * p->q_rs, kpi, k + ko,
                                     bm != NULL ? bm + mo + q0 * p->m_rs : NULL,
                                     fm != NULL ? fm + mo + q0 * p->m_rs : NULL, mrow, mrow + nq,
                                     w + n * L * S + (ptrdiff_t)q0 * S, S, q0, nq, mine,
                                     mine_end);
            }
        }
    }
}

#undef FA_PACK_OWN_K

void FA_SFX(fa_softmax_rows)(int isa, const FA_T *x, FA_T *y, ptrdiff_t rows, int n,
                             int n_threads)
{
    FA_OPS_DECL(isa);
    const fa_team_t team_at = fa_team_open(n_threads, rows);
#pragma omp parallel num_threads(team_at.n)
    {
        fa_team_place(&team_at);
#pragma omp for schedule(static)
        for (ptrdiff_t r = 0; r < rows; r++) FA_OPS.softmax_row(x + r * n, n, y + r * n);
    }
}

void FA_SFX(fa_exp)(int isa, const FA_T *x, ptrdiff_t n, FA_T *y)
{
    FA_OPS_DECL(isa);
    FA_OPS.exp_array(x, n, y);
}

#undef FA_T
#undef FA_SFX
#undef FA_DT
#undef FA_OPS
#undef FA_OPS_DECL
