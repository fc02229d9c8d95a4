"""Search strategies over a decoder: greedy, beam, multinomial sampling.

The strategies talk to the model only through the decoder interface (:class:`Decoder`:
``check_sources``, ``start`` -> a :class:`DecoderState`: feed tokens, get logits, reorder rows,
drop finished sources), so they are independent of the network and of the model family.

Semantics follow transformers' ``generate`` (``generation/utils.py``, 5.x), re-derived here:

- decoding starts from ``[decoder_start_token_id]``, or from a forced prefix
  (``decoder_input_ids``, P tokens, the start token first: fed one position at a time through
  the step API); ``cur_len`` counts it. ``max_length`` bounds ``cur_len`` (``max_new_tokens +
  P`` when given); lengths in the beam search's length penalty count the tokens after the
  prefix.
- ``num_return_sequences`` = k: sampling decodes every source k times (k rows, source-major,
  each with its own random stream); beam search returns its k best finished hypotheses.
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
from .._validation import check_generation_setting, check_labels, check_token_ids
from ..functional import log_softmax
from .beam_ct2 import beam_search_ct2, check_beam_rule
from .config import resolve_settings
from .prefix import feed_prefix
from .processors import Temperature, apply, build_processors, history

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
        The checked source batch (a ValueError / TypeError naming the argument). Sources
        other than token ids pass through as the model checked them (WhisperModel: log-mel
        features (B, n_mels, frames)); the search reads B and S from the mask.
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


def _search_bytes(B, K, T, V, S=0, enc_ngram=0):
    """The search's own arrays: token histories (running, finished and candidate beams, int64,
    with the processors' copies), a step's float32 scores with the processors', sampling's and
    the score bookkeeping's copies, and the encoder n-gram table (B sources of S tokens)."""
    table = 0
    if enc_ngram and enc_ngram <= S:
        table = B * (S - enc_ngram + 1) * (enc_ngram + 1) * 8 * 3
    return B * K * T * 8 * 12 + B * K * V * 48 + table


def _generate_plan(model, n_sources, src_len, max_length, num_beams=1, num_return_sequences=1,
                   do_sample=False, encoder_no_repeat_ngram_size=0):
    """The bytes generate plans before anything runs (what fastattn._memory.check_plan gets):
    the model's decoding plan and the search's arrays. Sampling with num_return_sequences=k
    decodes k rows per source (the source repeated k times: k x the encoder's and the cache's
    rows); beam search returns k of its num_beams hypotheses (no more rows)."""
    rows = n_sources * (num_return_sequences if num_beams == 1 and do_sample else 1)
    return (model.plan_bytes(rows, src_len, num_beams, max_length)
            + _search_bytes(rows, num_beams, max_length, model.vocab_size, src_len,
                            encoder_no_repeat_ngram_size))


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


# the settings generate takes as keywords (transformers' names), besides seed and n_threads
GENERATE_KWARGS = ("max_new_tokens", "min_new_tokens", "num_beams", "length_penalty",
                   "early_stopping", "suppress_tokens", "bad_words_ids", "do_sample",
                   "temperature", "top_k", "top_p", "repetition_penalty", "no_repeat_ngram_size",
                   "encoder_no_repeat_ngram_size", "num_return_sequences", "decoder_input_ids",
                   "return_scores", "streamer", "forced_bos_token_id", "beam_rule")


def _decoder_prefix(dec, start, vocab):
    """decoder_input_ids -> the forced prefix (B, P) int64, beginning with the start token.

    As transformers: when no row begins with the decoder start token, it is prepended to every
    row. A batch where some rows begin with it and others do not is a ValueError here
    (transformers would take such rows as given only when at least one row has it, so a row's
    result would depend on the others). Rectangular only: every row has the same prefix length
    (ragged prefixes are not supported; a padded prefix would be forced as it is, padding
    included)."""
    a = check_token_ids(dec, "decoder_input_ids", vocab)
    first = a[:, 0] == start if a.shape[1] else np.zeros(a.shape[0], bool)
    if not first.any():
        return np.concatenate([np.full((a.shape[0], 1), start, np.int64), a], axis=1)
    if not first.all():
        raise ValueError(f"decoder_input_ids: rows {np.flatnonzero(~first).tolist()} do not "
                         f"begin with the decoder start token {start} and the others do; give "
                         "every row with it or every row without it (then it is prepended)")
    return np.array(a, dtype=np.int64, copy=True)


def _check_streamer(streamer, num_beams, rows):
    if not (callable(getattr(streamer, "put", None)) and callable(getattr(streamer, "end", None))):
        raise TypeError(f"streamer must have put(token_ids) and end() methods (transformers' "
                        f"streamer protocol), got {type(streamer).__name__}")
    if num_beams > 1:
        raise ValueError(f"`streamer` cannot be used with beam search (num_beams={num_beams}): "
                         "use num_beams=1")
    if rows != 1:
        raise ValueError(f"streamer needs batch size 1 (one returned sequence), got {rows} rows "
                         "(input_ids rows x num_return_sequences)")


def generate(model, input_ids, attention_mask=None, *, seed=None, n_threads=None, **user):
    """transformers' ``generate`` over a :class:`Decoder` (see ``Seq2SeqTransformer.generate``).

    Besides the settings of :data:`GENERATE_KWARGS` read by :func:`resolve_settings`:

    decoder_input_ids : int array (B, P), optional
        A forced prefix: decoding continues after it (CTranslate2's ``target_prefix``). It
        begins with the decoder start token (prepended when no row has it, as transformers);
        ``max_new_tokens`` counts the tokens after it, ``max_length`` the whole sequence.
        Rectangular: every row has the same prefix length.
    num_return_sequences : int, default 1 (or the checkpoint's)
        Beam search: the best ``num_return_sequences`` (<= num_beams) finished hypotheses of
        each source, best first. Sampling: that many independent samples per source (sample j
        of source b draws from its own random stream: sample 0 is what num_return_sequences=1
        gives, and neither depends on the other sources nor on num_return_sequences). Greedy
        without sampling: only 1. Rows are source-major: row ``b * k + j``.
    return_scores : bool, default False
        Return ``(ids, scores)``, scores float32 (rows,). Beam search: transformers'
        ``sequences_scores``, the hypothesis' sum of processed log-probabilities divided by
        ``generated_length ** length_penalty``. Greedy / sampling: the sum over the generated
        tokens (up to and including EOS; not the padding after it) of the chosen token's
        log-probability under the processed scores, ``log_softmax(processed)[token]``, computed
        in float64 and rounded once: transformers'
        ``compute_transition_scores(..., normalize_logits=True)`` summed over the same tokens.
    beam_rule : "transformers" (default) or "ctranslate2"
        Beam search's rule: transformers' (above), or CTranslate2's
        (:mod:`fastattn.generation.beam_ct2`: the processed logits renormalised, a source
        stopping when num_beams hypotheses have finished, the finished ranked by
        ``score / length ** length_penalty`` with the prefix after the start token and EOS in
        the length, its scores CTranslate2's). Greedy search and sampling are the same under
        both.
    streamer : object with ``put(token_ids)`` and ``end()``, optional
        transformers' streamer protocol: ``put`` gets the prefix (an int64 array (1, P)), then
        each new token (an int64 array (1,)), then ``end()`` is called. Batch size 1 and
        num_beams=1 only (greedy or sampling).
    """
    for key in user:
        if key not in GENERATE_KWARGS:
            raise TypeError(f"generate() got an unexpected keyword argument {key!r}")
    want_scores = bool(check_generation_setting("return_scores", user.get("return_scores")))
    rule = check_beam_rule(user.get("beam_rule"))
    streamer = user.get("streamer")
    start = model.decoder_start_id
    dec = user.get("decoder_input_ids")
    prefix = None if dec is None else _decoder_prefix(dec, start, model.vocab_size)
    P = 1 if prefix is None else prefix.shape[1]
    p = resolve_settings(model, user, P)
    ids, mask = model.check_sources(input_ids, attention_mask)
    B, S = mask.shape          # (the sources may be features: their positions are the mask's)
    if prefix is None:
        prefix = np.full((B, 1), start, np.int64)
    elif prefix.shape[0] != B:
        raise ValueError(f"decoder_input_ids has {prefix.shape[0]} rows, input_ids {B}")
    K, R = p["num_beams"], p["num_return_sequences"]
    if streamer is not None:
        _check_streamer(streamer, K, B * R)
    if p["max_length"] <= P:                                  # max_new_tokens=0
        out = np.repeat(prefix, R, axis=0)
        if streamer is not None:
            streamer.put(out.copy())
            streamer.end()
        return (out, np.zeros(B * R, _F32)) if want_scores else out
    V = model.vocab_size
    min_keep = 2 if K > 1 else 1
    enc_n = p["encoder_no_repeat_ngram_size"]
    sources = [ids[b][mask[b]] for b in range(B)] if enc_n else None
    procs = build_processors(p, V, p["eos_token_id"], min_keep, sources)
    if p["do_sample"]:
        check_generation_setting("seed", seed)
        rng = np.random.SeedSequence(seed)
    else:
        rng = None
    max_len = p["max_length"]
    what = f"generate(input_ids {ids.shape}, num_beams={K}, "
    if R > 1:
        what += f"num_return_sequences={R}, "
    check_plan(_generate_plan(model, B, S, max_len, K, R, p["do_sample"], enc_n),
               what + f"max_new_tokens={max_len - P})")
    if K > 1:
        state = model.start(ids, mask, num_beams=K, max_length=max_len, n_threads=n_threads)
        if rule == "ctranslate2":
            if rng is not None:
                raise ValueError("beam_rule='ctranslate2' with do_sample=True: CTranslate2 has "
                                 "no beam sampling")
            return beam_search_ct2(state, procs, p, B, K, n_threads, prefix=prefix,
                                   num_return_sequences=R, return_scores=want_scores,
                                   length_offset=P - 1)
        return beam_search(state, procs, p, B, K, rng, n_threads, prefix=prefix,
                           num_return_sequences=R, return_scores=want_scores)
    streams = None
    if R > 1:            # k samples per source: the source repeated, row b * k + j
        ids, mask, prefix = (np.repeat(a, R, axis=0) for a in (ids, mask, prefix))
        if rng is not None:
            streams = []
            for child in rng.spawn(B):
                streams.append(np.random.default_rng(child))
                streams.extend(np.random.default_rng(s) for s in child.spawn(R - 1))
    state = model.start(ids, mask, num_beams=1, max_length=max_len, n_threads=n_threads)
    try:
        return greedy_search(state, procs, p, B * R, rng, prefix=prefix, streams=streams,
                             sources=np.arange(B * R) // R, streamer=streamer,
                             return_scores=want_scores)
    finally:
        if streamer is not None:
            streamer.end()


def _drop_finished(state, done, active, *carried):
    """The rows not `done` stay in the step batch (the state keeps their sources only):
    `active` (their original rows) and each array of `carried` restricted to them."""
    if not done.any():
        return (active,) + carried
    keep = np.flatnonzero(~done)
    state.select_sources(keep)
    return (active[keep],) + tuple(a[keep] for a in carried)


def _scores_f32(logits):
    # transformers copies the last position's logits to float32 before any processing
    return logits if logits.dtype == _F32 else logits.astype(_F32)


def _chosen_logprob(scores, tokens):
    """log_softmax(scores)[i, tokens[i]] in float64 (the processed scores of a step)."""
    lp = log_softmax(scores.astype(np.float64))
    return lp[np.arange(tokens.size), tokens]


def greedy_search(state, procs, p, B, rng=None, *, prefix=None, streams=None, sources=None,
                  streamer=None, return_scores=False, on_logits=None, draw_temperature=None,
                  score_dtype=_F32):
    """Greedy (or, with `rng` / `streams`, multinomial) decoding -> int64 (B, P + T), with
    `return_scores` also the (B,) sums of the chosen tokens' log-probabilities (float32, or
    `score_dtype`: float64 keeps the sums unrounded).

    prefix (B, P): the forced decoder prefix (default: the start token). streams: one NumPy
    Generator per row (default: spawned from the SeedSequence `rng`, row b drawing from child
    b). sources (B,): the source of each row, for the processors that read it.
    on_logits(t, logits): called with the raw logits (rows, vocab) after prefix position t is
    fed, for t = 0 .. P - 1 (Whisper's no-speech probability reads them at
    <|startoftranscript|>).
    draw_temperature: sampling draws from softmax(scores / draw_temperature) while the scores
    summed by `return_scores` stay those before it (Whisper's temperature fallback, as
    openai-whisper and CTranslate2 score a draw); generate's ``temperature`` is a processor
    instead.

    A state with several rows per source (``state.num_beams`` > 1: e.g. draws sharing one
    encoder output) keeps a row that has ended in the step batch, fed padding and drawing
    nothing, until every row of its source has ended; with one row per source, an ended row
    leaves at once."""
    max_len, eos, pad = p["max_length"], p["eos_token_id"], p["pad_token_id"]
    if prefix is None:
        prefix = np.full((B, 1), p["decoder_start_token_id"], np.int64)
    P = prefix.shape[1]
    seqs = np.full((B, max_len), pad, np.int64)               # every row's tokens, start first
    seqs[:, :P] = prefix
    if sources is None:
        sources = np.arange(B)
    G = state.num_beams                                        # rows per source in the state
    active = np.arange(B)                                      # source row of each cache row
    ended = np.zeros(B, bool)                                  # per cache row (G > 1 only)
    if streams is None and rng is not None:
        # one generator per source row: a row's draws do not depend on the rest of the batch
        streams = [np.random.default_rng(s) for s in rng.spawn(B)]
    temperature = None if draw_temperature is None else Temperature(draw_temperature)
    total = np.zeros(B) if return_scores else None
    if streamer is not None:
        streamer.put(prefix.copy())
    feed_prefix(state, seqs[:, :P - 1], on_logits)
    cur = P
    tokens = seqs[:, P - 1].copy()

    def choose(scores, rows):
        if streams is None:
            return np.argmax(scores, axis=1)
        if temperature is not None:
            scores = temperature(None, scores.copy())
        return _draw(scores, [streams[r] for r in rows])

    while True:
        scores = _scores_f32(state.step(tokens))               # (n, V)
        if on_logits is not None and cur == P:
            on_logits(P - 1, scores.copy())
        hist = history(seqs, active, cur, procs)
        scores = apply(procs, hist, scores, sources[active])
        if ended.any():                   # rows that ended wait for their source's others
            live = np.flatnonzero(~ended)
            nxt = np.full(active.size, pad, np.int64)
            nxt[live] = choose(scores[live], active[live])
            if return_scores:
                total[active[live]] += _chosen_logprob(scores[live], nxt[live])
        else:
            nxt = choose(scores, active)
            if return_scores:
                total[active] += _chosen_logprob(scores, nxt)
        seqs[active, cur] = nxt
        if streamer is not None:
            streamer.put(nxt.copy())
        cur += 1
        if cur >= max_len:
            break
        done = nxt == eos
        if G == 1:
            if done.all():
                break
            active, nxt = _drop_finished(state, done, active, nxt)
        else:
            ended |= done
            gone = ended.reshape(-1, G).all(axis=1)            # per source
            if gone.all():
                break
            if gone.any():
                keep = np.flatnonzero(~gone)
                state.select_sources(keep)
                rows = (keep[:, None] * G + np.arange(G)).reshape(-1)
                active, nxt, ended = active[rows], nxt[rows], ended[rows]
        tokens = nxt
    out = seqs[:, :cur]
    return (out, total.astype(score_dtype)) if return_scores else out


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


def beam_search(state, procs, p, B, K, rng=None, n_threads=None, *, prefix=None,
                num_return_sequences=1, return_scores=False, on_logits=None, return_norm=False):
    """Beam search with transformers' semantics -> int64 (B * num_return_sequences, P + T):
    the best `num_return_sequences` finished hypotheses of each source, best first; with
    `return_scores` also their float32 scores (transformers' ``sequences_scores``).

    prefix (B, P): the forced decoder prefix (default: the start token); lengths for the
    length penalty count the tokens after it (transformers' ``decoder_prompt_len``).
    With `rng` (a SeedSequence; do_sample=True), the 2 * num_beams candidates of each source are
    sampled instead of taken best-first (beam sampling), source b drawing from stream b.
    on_logits(t, logits): as greedy_search's (rows: B * K, beam-major within a source).
    return_norm: also return, per returned hypothesis, the float64 sum over its steps of the
    log of the probability mass the processors left (logsumexp of the processed log-probs):
    its score's sum minus this is the sum of its tokens' log-probabilities renormalised after
    the processors (openai-whisper's and CTranslate2's ``sum_logprobs``)."""
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
    fin_len = np.zeros((B, K), np.int64)                      # a hypothesis' length (prefix in)
    fin_done = np.zeros((B, K), bool)                         # slot holds a finished hypothesis
    if return_norm:
        run_norm = np.zeros((B, K))                           # sum of the steps' logsumexp
        fin_norm = np.zeros((B, K))
    open_ = np.ones(B, bool)                                  # early-stop heuristic unsatisfied
    active = np.arange(B)
    feed_prefix(state, np.repeat(prefix[:, :P - 1], K, axis=0), on_logits)
    tokens = np.repeat(prefix[:, P - 1], K)
    cur = P
    top_mask = np.zeros(K2, bool)
    top_mask[:K] = True
    nthr = _effective_n_threads(n_threads)
    while True:
        n = active.size
        logits = _scores_f32(state.step(tokens))                     # (n*K, V)
        if on_logits is not None and cur == P:
            on_logits(P - 1, logits.copy())
        V = logits.shape[1]
        lprobs = log_softmax(logits, out=logits if logits.flags.writeable else None,
                             n_threads=nthr)
        hist = history(run_seq.reshape(B * K, max_len),
                       (active[:, None] * K + np.arange(K)).reshape(-1), cur, procs)
        lprobs = apply(procs, hist, lprobs, np.repeat(active, K))
        if return_norm:                         # float32 exp, float64 sums and log
            lp3 = lprobs.reshape(n, K, V)
            mx = lp3.max(axis=2, keepdims=True)
            mx = np.where(np.isfinite(mx), mx, _F32(0))
            with np.errstate(divide="ignore"):
                lse = np.log(np.exp(lp3 - mx).sum(axis=2, dtype=np.float64)) + mx[:, :, 0]
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
        if return_norm:
            cand_norm = np.take_along_axis(run_norm[active] + lse, top_beam, axis=1)  # (n, 2K)
            new_run_norm = np.take_along_axis(cand_norm, nxt, axis=1)
        # -- the finished set: merge the new finished candidates (top K positions only)
        just = hits & top_mask[None, :]
        cand = top_lp / _F32((cur + 1 - P) ** lp)
        full = fin_done[active].all(axis=1, keepdims=True) & (es is True)
        cand = cand + full.astype(_F32) * _BIG
        cand = cand + (~open_[active])[:, None].astype(_F32) * _BIG
        cand = cand + (~just).astype(_F32) * _BIG
        m_score = np.concatenate([fin_score[active], cand], axis=1)          # (n, 3K)
        m_seq = np.concatenate([fin_seq[active], cand_seq], axis=1)
        m_len = np.concatenate([fin_len[active], np.full((n, K2), cur + 1, np.int64)], axis=1)
        m_done = np.concatenate([fin_done[active], just], axis=1)
        sel = _topk_desc(m_score, K)
        fin_score[active] = np.take_along_axis(m_score, sel, axis=1)
        fin_seq[active] = np.take_along_axis(m_seq, sel[:, :, None], axis=1)
        fin_len[active] = np.take_along_axis(m_len, sel, axis=1)
        fin_done[active] = np.take_along_axis(m_done, sel, axis=1)
        if return_norm:
            m_norm = np.concatenate([fin_norm[active], cand_norm], axis=1)
            fin_norm[active] = np.take_along_axis(m_norm, sel, axis=1)
            run_norm[active] = new_run_norm
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
    R = num_return_sequences
    L = max(P, int(fin_len[:, :R].max()))
    out = fin_seq[:, :R, :L].reshape(B * R, L).copy()
    if return_norm:
        norm = fin_norm[:, :R].reshape(-1).copy()
        return (out, fin_score[:, :R].reshape(-1).copy(), norm) if return_scores else \
            (out, norm)
    return (out, fin_score[:, :R].reshape(-1).copy()) if return_scores else out


def score(model, input_ids, labels, attention_mask=None, n_threads=None):
    """Per-token log-probabilities of `labels` under forced decoding (CTranslate2's
    ``score_batch``) over a :class:`Decoder`.

    The decoder is fed ``[decoder_start] + labels[:, :-1]`` (transformers'
    ``shift_tokens_right``: a -100 fed back becomes ``pad_id``) and position t scores
    ``labels[:, t]``: ``log_softmax(logits)[labels[:, t]]``, the log-softmax in float64 of the
    model's logits (no logits processor). The start token is not scored: position 0 is the
    first label.

    Parameters
    ----------
    input_ids : int array (B, S)
    labels : int array (B, T)
        Target token ids; -100 marks positions to ignore (transformers' convention for
        padding labels): they score 0.0, and a row stops being decoded after its last
        non-ignored label. Sum a row for its sequence log-probability.
    attention_mask : array (B, S), optional (default: positions holding ``pad_id`` are padding)
    n_threads : int, optional

    Returns
    -------
    ndarray float64 (B, T). A row's values do not depend on the other rows or the thread count.
    """
    ids, mask = model.check_sources(input_ids, attention_mask)
    B, S = mask.shape          # (the sources may be features: their positions are the mask's)
    lab = check_labels(labels, B, model.vocab_size, model.max_decoder_positions)
    T = lab.shape[1]
    out = np.zeros((B, T), np.float64)
    ignore = lab == -100
    counted = ~ignore
    if T == 0 or not counted.any():
        return out
    V = model.vocab_size
    dec = np.empty((B, T), np.int64)
    dec[:, 0] = model.decoder_start_id
    dec[:, 1:] = np.where(ignore[:, :-1], model.pad_id, lab[:, :-1])
    # the last position each row scores (-1: none)
    last = np.where(counted.any(axis=1), T - 1 - np.argmax(counted[:, ::-1], axis=1), -1)
    check_plan(model.plan_bytes(B, S, 1, T) + B * T * 8 * 3 + B * V * 8 * 3,
               f"score(input_ids {ids.shape}, labels {lab.shape})")
    state = model.start(ids, mask, num_beams=1, max_length=T, n_threads=n_threads)
    nthr = _effective_n_threads(n_threads)
    active = np.arange(B)
    if (last < 0).any():                                      # nothing to score: leave now
        active = np.flatnonzero(last >= 0)
        state.select_sources(active)
    for t in range(T):
        logits = state.step(dec[active, t])
        lp = log_softmax(logits.astype(np.float64), n_threads=nthr)
        tok = lab[active, t]
        ok = np.flatnonzero(tok >= 0)
        out[active[ok], t] = lp[ok, tok[ok]]
        done = last[active] <= t
        if done.all():
            break
        active, = _drop_finished(state, done, active)
    return out
