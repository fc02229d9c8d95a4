"""Beam search with CTranslate2's rule (``beam_rule="ctranslate2"``), for the code and models
that expect CTranslate2's results (:mod:`fastattn.compat`).

It differs from transformers' (:func:`fastattn.generation.search.beam_search`, the default) in
four ways, re-derived from CTranslate2 4.x's ``BeamSearch``:

- the processors run on the logits and the log-softmax after them (transformers: on the
  log-probabilities): the probability they remove (suppressed tokens, a banned EOS, the
  timestamp rules) is spread over what is left, and ``repetition_penalty`` scales logits;
- a candidate ending in EOS among the first ``num_beams`` of the ``2 * num_beams`` is kept with
  its accumulated score, every one of them (no bounded finished set), and its place among the
  running beams goes to the next candidate that does not end; a source stops as soon as
  ``round(num_beams * patience)`` hypotheses have finished (with ``length_penalty == 0``: as
  soon as its best beam has finished, once, and ``num_return_sequences`` hypotheses have), or
  at the last position;
- the finished hypotheses are ranked at the end by ``score / length ** length_penalty``, the
  length counting the generated tokens (EOS where ``eos_in_length``) plus ``length_offset``
  (CTranslate2's translator counts a target prefix and EOS; its Whisper neither);
- after a forced prefix (a target prefix, Whisper's prompt), at the first free step an EOS
  among the candidates other than the best is turned into token 0 with a score of -1e10
  (CTranslate2's guard against short hypotheses, its issue #277): such a hypothesis does not
  finish, and the dead candidate may take a running beam's place.

The running beams are the same as transformers' (the best ``num_beams`` candidates that do not
end), their scores float32 sums in the same order.
"""
import numpy as np

from .._kernels import _search
from .._threads import _effective_n_threads
from ..functional import log_softmax
from .prefix import feed_prefix
from .processors import apply, history

__all__ = ["BEAM_RULES", "beam_search_ct2", "check_beam_rule"]

_F32 = np.float32
_BIG = _F32(-1.0e9)
BEAM_RULES = ("transformers", "ctranslate2")


def check_beam_rule(rule):
    if rule is None:
        return "transformers"
    if not isinstance(rule, str) or rule not in BEAM_RULES:
        raise ValueError(f"beam_rule must be 'transformers' or 'ctranslate2', got {rule!r}")
    return rule


def beam_search_ct2(state, procs, p, B, K, n_threads=None, *, prefix=None,
                    num_return_sequences=1, return_scores=False, on_logits=None,
                    return_norm=False, patience=1.0, eos_in_length=True, length_offset=0):
    """Beam search by CTranslate2's rule (module docstring): the same arguments and results as
    :func:`~fastattn.generation.search.beam_search` (rows: prefix, tokens, EOS where a
    hypothesis ended, then padding), the scores CTranslate2's (float32, normalised by its
    length), `return_norm` zeros (the sums are of renormalised log-probabilities already)."""
    max_len, eos, pad = p["max_length"], p["eos_token_id"], p["pad_token_id"]
    lp = float(p["length_penalty"])
    R = num_return_sequences
    K2 = 2 * K
    want = max(1, int(round(K * patience)))
    if prefix is None:
        prefix = np.full((B, 1), p["decoder_start_token_id"], np.int64)
    P = prefix.shape[1]
    run_seq = np.full((B, K, max_len), pad, np.int64)
    run_seq[:, :, :P] = prefix[:, None, :]
    run_score = np.zeros((B, K), _F32)
    run_score[:, 1:] = _BIG                       # the first step expands the first beam only
    finished = [[] for _ in range(B)]             # (score, tokens) of each source
    top_done = np.zeros(B, bool)                  # its best beam has finished (once)
    active = np.arange(B)
    feed_prefix(state, np.repeat(prefix[:, :P - 1], K, axis=0), on_logits)
    tokens = np.repeat(prefix[:, P - 1], K)
    cur = P
    nthr = _effective_n_threads(n_threads)
    while True:
        n = active.size
        logits = state.step(tokens)
        logits = logits if logits.dtype == _F32 else logits.astype(_F32)
        if on_logits is not None and cur == P:
            on_logits(P - 1, logits.copy())
        V = logits.shape[1]
        if procs:
            # CTranslate2's order: the processors on the logits, then the log-softmax
            if not logits.flags.writeable:
                logits = logits.copy()
            hist = history(run_seq.reshape(B * K, max_len),
                           (active[:, None] * K + np.arange(K)).reshape(-1), cur, procs)
            logits = apply(procs, hist, logits, np.repeat(active, K))
        lprobs = log_softmax(logits, out=logits if logits.flags.writeable else None,
                             n_threads=nthr)
        top_lp = np.empty((n, K2), lprobs.dtype)
        top = _search.topk_desc(lprobs.reshape(n, K * V), K2,
                                add=run_score[active].astype(lprobs.dtype, copy=False),
                                out_val=top_lp, n_threads=nthr)
        top_beam, top_tok = top // V, top % V
        last = cur + 1 >= max_len
        ends = top_tok == eos
        if cur == P and P > 1 and ends[:, 1:].any():
            # the first step after a forced prefix (a target prefix, Whisper's prompt): an EOS
            # among the candidates other than the best becomes token 0 with a score of -1e10
            # (CTranslate2's update_sample_with_prefix, its issue #277), which may then hold
            # a running beam's place
            sec = ends.copy()
            sec[:, 0] = False
            top_tok = np.where(sec, 0, top_tok)
            top_lp = np.where(sec, _F32(-1.0e10), top_lp)
            ends &= ~sec
        pick = np.tile(np.arange(K), (n, 1))      # the candidate each running beam continues
        live = np.ones(n, bool)
        for i in range(n):
            b = active[i]
            spare = K
            for k in range(K):
                if not (ends[i, k] or last):
                    continue
                if k == 0:
                    top_done[b] = True
                seq = np.concatenate([run_seq[b, top_beam[i, k], :cur], top_tok[i, k:k + 1]])
                length = cur + 1 - P + length_offset - (0 if eos_in_length or not ends[i, k]
                                                        else 1)
                with np.errstate(divide="ignore"):
                    score = _F32(top_lp[i, k]) / _F32(np.power(_F32(length), _F32(lp)))
                finished[b].append((score, seq))
                for j in range(spare, K2):
                    if not ends[i, j]:
                        pick[i, k], spare = j, j + 1
                        break
            if last:
                live[i] = False
            elif lp == 0.0:
                live[i] = not (top_done[b] and len(finished[b]) >= R)
            else:
                live[i] = len(finished[b]) < want
        new_beam = np.take_along_axis(top_beam, pick, axis=1)
        new_tok = np.take_along_axis(top_tok, pick, axis=1)
        new_seq = np.take_along_axis(run_seq[active], new_beam[:, :, None], axis=1)
        new_seq[:, :, cur] = new_tok
        run_seq[active] = new_seq
        run_score[active] = np.take_along_axis(top_lp, pick, axis=1)
        cur += 1
        if not live.any():
            break
        state.reorder((np.arange(n)[:, None] * K + new_beam).reshape(-1))
        if not live.all():
            keep = np.flatnonzero(live)
            state.select_sources(keep)
            active = active[keep]
        tokens = run_seq[active, :, cur - 1].reshape(-1)
    rows, scores = [], []
    for b in range(B):
        # best first (a stable sort: of equal scores, the one that finished first)
        ranked = sorted(finished[b], key=lambda h: -float(h[0]))[:R]
        rows += [h[1] for h in ranked]
        scores += [h[0] for h in ranked]
    L = max(P, max(r.size for r in rows))
    out = np.full((len(rows), L), pad, np.int64)
    for i, r in enumerate(rows):
        out[i, :r.size] = r
    sc = np.array(scores, _F32)
    if return_norm:
        norm = np.zeros(len(rows))
        return (out, sc, norm) if return_scores else (out, norm)
    return (out, sc) if return_scores else out
