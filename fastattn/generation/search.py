"""Search strategies over a decoder: greedy, beam, multinomial sampling.

The strategies talk to the model only through the decoder interface (:class:`Decoder`:
``check_sources``, ``start`` -> a :class:`DecoderState`: feed tokens, get logits, reorder rows,
drop finished sources), so they are independent of the network and of the model family.

Semantics follow transformers' ``generate`` (``generation/utils.py``, 5.x), re-derived here:

- decoding starts from ``[decoder_start_token_id]``; ``cur_len`` counts it. ``max_length``
  bounds ``cur_len`` (``max_new_tokens + 1`` when given).
- greedy / sampling: scores = float32 logits of the last position -> processors -> argmax (or a
  draw from softmax). A row that produced EOS gets ``pad`` afterwards; decoding stops when every
  row has finished or ``cur_len == max_length``. Finished rows leave the step batch here (their
  outputs no longer change), so the work shrinks as rows end.
- beam search (transformers' vectorised beam search): per source, ``2 * num_beams`` candidates
  by accumulated log-probability (log_softmax, then the processors); candidates ending in EOS
  (or reaching ``max_length``) among the first ``num_beams`` compete for the finished set with
  score ``sum_logprobs / new_len ** length_penalty``; the ``num_beams`` best unfinished ones
  continue. A source stops when no running beam can improve its finished set (heuristic chosen
  by ``early_stopping``: True = as soon as num_beams hypotheses are finished, False = the best
  running score at the current length, "never" = at the best reachable length) and then leaves
  the step batch. All score arithmetic is float32 in transformers' order, so that rankings
  match bit for bit where the logits do.
"""
import numpy as np

from .._kernels import _search
from .._memory import check_plan
from .._threads import _effective_n_threads
from .._validation import check_generation_setting, check_option, check_token_ids, to_numpy
from ..functional import log_softmax
from .config import resolve_settings
from .processors import build_processors, history

__all__ = ["Decoder", "DecoderState", "generate", "greedy_search", "beam_search", "score"]

_F32 = np.float32
_BIG = _F32(-1.0e9)


class Decoder:
    """The decoder interface: what the search needs from a model (Seq2SeqTransformer implements
    it; the search imports nothing from fastattn.models).

    Attributes: ``vocab_size``, ``eos_id``, ``pad_id``, ``decoder_start_id``,
    ``max_decoder_positions`` (ints) and ``generation_config`` (the checkpoint's checked
    settings, :func:`fastattn.generation.config.check_generation_config`).

    Methods
    -------
    check_sources(input_ids, attention_mask) -> (ids (B, S) int64, mask (B, S) bool)
        The checked source batch (a ValueError / TypeError naming the argument).
    logits(input_ids, decoder_input_ids, attention_mask=None, n_threads=None) -> (B, T, vocab)
        Teacher-forced logits (for :func:`score`).
    plan_bytes(n_sources, src_len, num_beams, max_length) -> int
        An upper bound of the bytes the model holds at once while decoding that (encoder,
        cache, a step's activations and logits), for the memory check before anything runs.
    start(input_ids, attention_mask=None, *, num_beams=1, max_length=None, n_threads=None)
        -> DecoderState: the sources encoded, ``num_beams`` decoder rows each.
    """

    vocab_size: int
    eos_id: int
    pad_id: int
    decoder_start_id: int
    max_decoder_positions: int
    generation_config: dict

    def check_sources(self, input_ids, attention_mask=None):  # pragma: no cover - interface
        raise NotImplementedError

    def plan_bytes(self, n_sources, src_len, num_beams, max_length):  # pragma: no cover
        raise NotImplementedError

    def start(self, input_ids=None, attention_mask=None, *, num_beams=1, max_length=None,
              n_threads=None):  # pragma: no cover - interface
        raise NotImplementedError


def _search_bytes(B, K, T, V):
    """The search's own arrays: token histories (running, finished and candidate beams, int64)
    and a step's float32 scores with the processors' and sampling's copies."""
    return B * K * T * 8 * 12 + B * K * V * 48


class DecoderState:
    """Incremental decoding over a model's KV cache (the step API), what ``start`` returns.

    Rows: ``num_beams`` per source, row ``b * num_beams + j`` is beam j of source b.

    Attributes: ``length`` (tokens fed so far), ``n_rows``, ``n_sources``, ``num_beams``.

    Methods
    -------
    step(tokens) : tokens (n,) int -> logits (n, vocab) in the model dtype; appends one position.
    reorder(beam_idx) : row i continues from row beam_idx[i] (same source).
    select_sources(keep) : keep only these sources (increasing indices) and their rows (the
        finished ones leave the step batch).
    """

    length: int
    n_rows: int
    n_sources: int
    num_beams: int

    def step(self, tokens):  # pragma: no cover - interface
        raise NotImplementedError

    def reorder(self, beam_idx):  # pragma: no cover - interface
        raise NotImplementedError

    def select_sources(self, keep):  # pragma: no cover - interface
        raise NotImplementedError


# the settings generate takes as keywords (transformers' names), besides seed, n_threads,
# decoder_input_ids, return_scores and streamer
GENERATE_KWARGS = ("max_new_tokens", "min_new_tokens", "num_beams", "length_penalty",
                   "early_stopping", "suppress_tokens", "bad_words_ids", "do_sample",
                   "temperature", "top_k", "top_p", "repetition_penalty", "no_repeat_ngram_size",
                   "encoder_no_repeat_ngram_size", "num_return_sequences", "forced_bos_token_id")


def _check_prefix(decoder_input_ids, B, start, vocab):
    """The forced decoder prefix (B, P): the start token, then decoder_input_ids (transformers
    prepends the start token unless every row already begins with it)."""
    if decoder_input_ids is None:
        return np.full((B, 1), start, np.int64)
    pre = check_token_ids(decoder_input_ids, "decoder_input_ids", vocab)
    if pre.shape[0] != B:
        raise ValueError(f"decoder_input_ids has {pre.shape[0]} rows, input_ids {B}")
    if pre.shape[1] == 0 or not np.all(pre[:, 0] == start):
        pre = np.concatenate([np.full((B, 1), start, np.int64), pre], axis=1)
    return pre


def generate(model, input_ids, attention_mask=None, *, seed=None, n_threads=None,
             decoder_input_ids=None, return_scores=False, streamer=None, **user):
    """transformers' ``generate`` over a :class:`Decoder` (see ``Seq2SeqTransformer.generate``).

    Returns int64 (B * num_return_sequences, P + T): the decoder prefix (the start token, then
    ``decoder_input_ids`` when given), the generated tokens, ``pad`` after a row's EOS; with
    ``return_scores`` also float (B * num_return_sequences,): beam search's length-penalised
    final scores (transformers' ``sequences_scores``), else the sum of the log-probabilities
    (log-softmax of the processed scores) of each row's generated tokens up to its EOS.
    ``streamer`` (batch 1, one beam): ``put`` with the prefix (1, P), then each new token (1,),
    then ``end()`` (transformers' streamer protocol).
    """
    for key in user:
        if key not in GENERATE_KWARGS:
            raise TypeError(f"generate() got an unexpected keyword argument {key!r}")
    ids, mask = model.check_sources(input_ids, attention_mask)
    B = ids.shape[0]
    V = model.vocab_size
    start = model.decoder_start_id
    prefix = _check_prefix(decoder_input_ids, B, start, V)
    P = prefix.shape[1]
    p = resolve_settings(model, user, prefix_len=P)
    return_scores = check_option(return_scores, "return_scores")
    K, R = p["num_beams"], p["num_return_sequences"]
    if K == 1 and R > 1:                     # sampling: every source R times, source-major
        ids, mask, prefix = (np.repeat(a, R, axis=0) for a in (ids, mask, prefix))
    n_src = ids.shape[0]
    if streamer is not None:
        if K > 1 or n_src > 1:
            raise ValueError("streamer works with one source and one beam (batch 1, "
                             "num_beams=1, num_return_sequences=1), as in transformers")
        for name in ("put", "end"):
            if not callable(getattr(streamer, name, None)):
                raise TypeError(f"streamer must have put() and end() methods (transformers' "
                                f"streamer protocol), got {type(streamer).__name__}")
    if p["max_length"] <= P:                                  # nothing to generate
        if streamer is not None:
            streamer.put(prefix.copy())
            streamer.end()
        out = prefix if K == 1 else np.repeat(prefix, R, axis=0)
        return (out, np.zeros(len(out))) if return_scores else out
    min_keep = 2 if K > 1 else 1
    procs = build_processors(p, V, p["eos_token_id"], min_keep, source_ids=ids)
    if p["do_sample"]:
        check_generation_setting("seed", seed)
        rng = np.random.SeedSequence(seed)
    else:
        rng = None
    check_plan(model.plan_bytes(n_src, ids.shape[1], K, p["max_length"], chunk=P)
               + _search_bytes(n_src, K, p["max_length"], V),
               f"generate(input_ids {np.shape(input_ids)}, num_beams={K}, "
               f"num_return_sequences={R}, max_new_tokens={p['max_length'] - P})")
    state = model.start(ids, mask, num_beams=K, max_length=p["max_length"], n_threads=n_threads)
    if K == 1:
        seqs, scores = greedy_search(state, procs, p, n_src, rng, prefix, return_scores,
                                     streamer)
    else:
        seqs, scores = beam_search(state, procs, p, n_src, K, rng, n_threads, prefix, R)
    return (seqs, scores) if return_scores else seqs


def score(model, input_ids, labels, attention_mask=None, *, n_threads=None):
    """Per-token log-probabilities (B, T) float64 of `labels` (B, T) under forced decoding
    (CTranslate2's ``score_batch``): the decoder is fed the start token then labels[:, :-1],
    and position t gets log softmax(logits_t)[labels[t]], computed in float64. A label of -100
    (transformers' ignore index) gives 0 there and feeds the pad id."""
    ids, mask = model.check_sources(input_ids, attention_mask)
    lab = np.asarray(to_numpy(labels))
    if lab.dtype.kind not in "iu":
        raise TypeError(f"labels must hold integer token ids, got dtype {lab.dtype}")
    if lab.ndim == 1 and ids.shape[0] == 1:
        lab = lab[None]
    if lab.ndim != 2 or lab.shape[0] != ids.shape[0] or lab.shape[1] == 0:
        raise ValueError(f"labels must be (batch {ids.shape[0]}, length >= 1), got shape "
                         f"{lab.shape}")
    ignore = lab == -100
    real = np.where(ignore, model.pad_id, lab)
    check_token_ids(real, "labels", model.vocab_size)       # -100 or a token id
    dec = np.concatenate([np.full((lab.shape[0], 1), model.decoder_start_id, np.int64),
                          real[:, :-1]], axis=1)
    logits = model.logits(ids, dec, mask, n_threads=n_threads)           # (B, T, V)
    lp = log_softmax(logits.astype(np.float64), n_threads=n_threads)
    out = np.take_along_axis(lp, real[:, :, None].astype(np.int64), axis=2)[:, :, 0]
    out[ignore] = 0.0
    return out


def _scores_f32(logits):
    # transformers copies the last position's logits to float32 before any processing
    return logits if logits.dtype == _F32 else logits.astype(_F32)


def _process(procs, hist, scores, sources):
    for proc in procs:
        scores = proc(hist, scores, sources) if getattr(proc, "needs_sources", False) \
            else proc(hist, scores)
    return scores


def greedy_search(state, procs, p, B, rng, prefix=None, return_scores=False, streamer=None):
    """Greedy (or, with `rng`, multinomial) decoding -> (int64 (B, P + T), scores or None):
    the prefix (default the start token), then the tokens."""
    max_len, eos, pad = p["max_length"], p["eos_token_id"], p["pad_token_id"]
    if prefix is None:
        prefix = np.full((B, 1), p["decoder_start_token_id"], np.int64)
    P = prefix.shape[1]
    seqs = np.full((B, max_len), pad, np.int64)               # every row's tokens, prefix first
    seqs[:, :P] = prefix
    active = np.arange(B)                                      # source row of each cache row
    streams = None
    if rng is not None:
        # one generator per source row: a row's draws do not depend on the rest of the batch
        streams = [np.random.default_rng(s) for s in rng.spawn(B)]
    totals = np.zeros(B) if return_scores else None
    if streamer is not None:
        streamer.put(prefix.copy())
    cur = P
    tokens = prefix if P > 1 else prefix[:, 0].copy()
    while True:
        scores = _scores_f32(state.step(tokens))               # (n, V)
        hist = history(seqs, active, cur, procs)
        scores = _process(procs, hist, scores, active)
        if streams is None:
            nxt = np.argmax(scores, axis=1)
        else:
            nxt = _draw(scores, [streams[r] for r in active])
        if totals is not None:
            lsm = log_softmax(scores)
            totals[active] += lsm[np.arange(len(nxt)), nxt]
        seqs[active, cur] = nxt
        if streamer is not None:
            streamer.put(nxt.copy())
        cur += 1
        if cur >= max_len:
            break
        done = nxt == eos
        if done.all():
            break
        if done.any():
            keep = np.flatnonzero(~done)
            state.select_sources(keep)
            active = active[keep]
            nxt = nxt[keep]
        tokens = nxt
    if streamer is not None:
        streamer.end()
    return seqs[:, :cur], totals


def _check_sampling_scores(scores):
    """Sampling needs, in every row, a finite largest score and no NaN: a row whose scores are
    all -inf (every token forbidden) has no distribution, and +inf or NaN (e.g. logits divided
    by a temperature so small that they overflow float32) none that is defined. transformers
    fails there too (torch.multinomial rejects the probabilities)."""
    m = scores.max(axis=1)
    bad = ~np.isfinite(m)
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        if np.isnan(m[r]):
            why = "holds NaN scores"
        elif m[r] > 0:
            why = ("holds +inf scores (a temperature so small that logits / temperature "
                   "overflows float32? use do_sample=False for the most likely tokens)")
        else:
            why = ("forbids every token (all scores -inf: suppress_tokens / bad_words_ids / "
                   "min_new_tokens leave nothing to sample)")
        raise ValueError(f"cannot sample: row {r} of the batch {why}")
    return m


def _draw(scores, gens):
    """One token per row from softmax(scores), by inverse CDF with each row's own generator."""
    m = _check_sampling_scores(scores)[:, None]
    e = np.exp((scores - m).astype(np.float64))
    cdf = np.cumsum(e, axis=1)
    out = np.empty(scores.shape[0], np.int64)
    for i, g in enumerate(gens):
        u = g.random() * cdf[i, -1]
        j = int(np.searchsorted(cdf[i], u, side="right"))
        j = min(j, scores.shape[1] - 1)
        while e[i, j] == 0:                    # never land on a forbidden token
            j -= 1
        out[i] = j
    return out


def _topk_desc(x, k, n_threads=1):
    """Indices of the k largest entries of each row of x (n, m), sorted descending; ties keep
    the lower index first (NaN ranks above every number). One pass per row in C."""
    return _search.topk_desc(x, k, n_threads=n_threads)


def _sample_desc(acc, k, gens):
    """Beam sampling: k candidates per row drawn without replacement from softmax(acc), then
    sorted by score descending (transformers' beam-sample selection; our own random streams)."""
    _check_sampling_scores(acc)
    out = np.empty((acc.shape[0], k), np.int64)
    for r, g in enumerate(gens):
        a = acc[r].astype(np.float64)
        e = np.exp(a - a.max())
        ok = np.flatnonzero(e > 0)
        pr = e[ok] / e[ok].sum()
        pick = ok[g.choice(ok.size, size=min(k, ok.size), replace=False, p=pr)]
        if pick.size < k:          # fewer possible tokens than candidates: add -inf ones
            rest = np.setdiff1d(np.arange(acc.shape[1]), pick)[:k - pick.size]
            pick = np.concatenate([pick, rest])
        out[r] = pick[np.lexsort((pick, -acc[r, pick]))]
    return out


def beam_search(state, procs, p, B, K, rng=None, n_threads=None, prefix=None, n_return=1):
    """Beam search with transformers' semantics -> (int64 (B * n_return, P + T), float32
    (B * n_return,) scores): each source's n_return best finished hypotheses, best first.

    With `rng` (a SeedSequence; do_sample=True), the 2 * num_beams candidates of each source are
    sampled instead of taken best-first (beam sampling), source b drawing from stream b."""
    streams = None if rng is None else [np.random.default_rng(s) for s in rng.spawn(B)]
    max_len, eos, pad = p["max_length"], p["eos_token_id"], p["pad_token_id"]
    lp, es = p["length_penalty"], p["early_stopping"]
    K2 = 2 * K
    if prefix is None:
        prefix = np.full((B, 1), p["decoder_start_token_id"], np.int64)
    P = prefix.shape[1]
    # per source (all B kept; `active` lists those still searching)
    run_seq = np.full((B, K, max_len), pad, np.int64)       # running beams' tokens
    run_seq[:, :, :P] = prefix[:, None, :]
    run_score = np.zeros((B, K), _F32)                        # accumulated log-probs
    run_score[:, 1:] = _BIG
    fin_seq = run_seq.copy()                                  # finished hypotheses
    fin_score = np.full((B, K), _BIG, _F32)
    fin_len = np.zeros((B, K), np.int64)                      # generated tokens per hypothesis
    fin_done = np.zeros((B, K), bool)                         # slot holds a finished hypothesis
    open_ = np.ones(B, bool)                                  # early-stop heuristic unsatisfied
    active = np.arange(B)
    tokens = np.repeat(prefix, K, axis=0)                     # (B*K, P): every beam's prefix
    if P == 1:
        tokens = tokens[:, 0]
    cur = P
    top_mask = np.zeros(K2, bool)
    top_mask[:K] = True
    nthr = _effective_n_threads(n_threads)
    while True:
        n = active.size
        logits = _scores_f32(state.step(tokens))                     # (n*K, V)
        V = logits.shape[1]
        lprobs = log_softmax(logits, out=logits if logits.flags.writeable else None,
                             n_threads=nthr)
        rows = (active[:, None] * K + np.arange(K)).reshape(-1)
        hist = history(run_seq.reshape(B * K, max_len), rows, cur, procs)
        lprobs = _process(procs, hist, lprobs, rows // K)
        if streams is None:
            # acc = lprobs + running score (float32, one rounding), read by the selection
            # without being stored: the top 2K of each source over its K * V candidates
            top_lp = np.empty((n, K2), lprobs.dtype)
            add = run_score[active].astype(lprobs.dtype, copy=False)
            top = _search.topk_desc(lprobs.reshape(n, K * V), K2, add=add, out_val=top_lp,
                                    n_threads=nthr)                      # (n, 2K)
        else:
            acc = lprobs.reshape(n, K, V)
            acc += run_score[active][:, :, None]                        # float32, in place
            acc = acc.reshape(n, K * V)
            top = _sample_desc(acc, K2, [streams[b] for b in active])
            top_lp = np.take_along_axis(acc, top, axis=1)                # (n, 2K)
        top_beam = top // V
        top_tok = top % V
        cand_seq = np.take_along_axis(run_seq[active], top_beam[:, :, None], axis=1)  # (n,2K,L)
        cand_seq[:, :, cur] = top_tok
        hits = top_tok == eos
        if cur + 1 >= max_len:
            hits[...] = True
        # -- the running beams for the next step: best K among candidates that did not stop
        run_lp = top_lp + hits.astype(_F32) * _BIG
        nxt = _topk_desc(run_lp, K)                                      # (n, K)
        new_run_seq = np.take_along_axis(cand_seq, nxt[:, :, None], axis=1)
        new_run_score = np.take_along_axis(run_lp, nxt, axis=1)
        src_beam = np.take_along_axis(top_beam, nxt, axis=1)             # (n, K)
        # -- the finished set: merge the new finished candidates (top K positions only)
        just = hits & top_mask[None, :]
        cand = top_lp / _F32((cur + 1 - P) ** lp)
        full = fin_done[active].all(axis=1, keepdims=True) & (es is True)
        cand = cand + full.astype(_F32) * _BIG
        cand = cand + (~open_[active])[:, None].astype(_F32) * _BIG
        cand = cand + (~just).astype(_F32) * _BIG
        m_score = np.concatenate([fin_score[active], cand], axis=1)          # (n, 3K)
        m_seq = np.concatenate([fin_seq[active], cand_seq], axis=1)
        m_len = np.concatenate([fin_len[active], np.full((n, K2), cur + 1 - P, np.int64)], axis=1)
        m_done = np.concatenate([fin_done[active], just], axis=1)
        sel = _topk_desc(m_score, K)
        fin_score[active] = np.take_along_axis(m_score, sel, axis=1)
        fin_seq[active] = np.take_along_axis(m_seq, sel[:, :, None], axis=1)
        fin_len[active] = np.take_along_axis(m_len, sel, axis=1)
        fin_done[active] = np.take_along_axis(m_done, sel, axis=1)
        run_seq[active] = new_run_seq
        run_score[active] = new_run_score
        cur += 1
        # -- can a running beam still improve the finished set?
        if es == "never" and lp > 0.0:
            best_len = max_len - P
        else:
            best_len = cur - P
        best = run_score[active][:, :1] / _F32(best_len ** lp)
        worst = np.where(fin_done[active], fin_score[active].min(axis=1, keepdims=True), _BIG)
        open_[active] &= np.any(best > worst, axis=1)
        if hits.all():
            break
        # sources whose result can no longer change leave the batch
        live = open_[active].copy()
        if es is True:
            live &= ~fin_done[active].all(axis=1)
        if not live.any():
            break
        # cache rows: row (i, j) continues beam src_beam[i, j] of the same source
        rows = (np.arange(n)[:, None] * K + src_beam).reshape(-1)
        state.reorder(rows)
        if not live.all():
            keep = np.flatnonzero(live)
            state.select_sources(keep)
            active = active[keep]
        tokens = run_seq[active, :, cur - 1].reshape(-1)
    T = int(fin_len[:, :n_return].max())
    seqs = fin_seq[:, :n_return, :P + T].reshape(B * n_return, P + T).copy()
    return seqs, fin_score[:, :n_return].reshape(-1).copy()
