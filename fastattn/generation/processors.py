"""Logits processors: one small object per decoding rule, applied in transformers' order.

Each processor is called as ``scores = proc(sequences, scores)`` (or, when it has
``needs_sources``, ``proc(sequences, scores, sources)``; :func:`apply` does the dispatch) with

    sequences  (n, cur_len) int64   the decoder tokens so far (start token first), one per row
    scores     (n, V) float32       next-token scores of those rows (modified in place or replaced)
    sources    (n,) int64           the source (input row) each row decodes

Processors that read the tokens say so (``needs_history``: :class:`NoBadWords` with multi-token
entries, :class:`RepetitionPenalty`, :class:`NoRepeatNGram`, :class:`EncoderNoRepeatNGram`);
for the others the search passes a zero-stride stand-in of the right shape, so that no per-step
copy of the history is made.

The order (``build_processors``) is transformers' ``_get_logits_processor`` (5.x) restricted to
the rules implemented here: repetition penalty, no-repeat n-grams, encoder no-repeat n-grams,
bad words, minimum length (``min_length`` / ``min_new_tokens``), forced EOS at the length limit,
suppressed tokens; when sampling then temperature, top-k, top-p; and ``renormalize_logits`` (a
log-softmax) last.
"""
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .._validation import check_generation_setting
from ..functional import log_softmax

__all__ = [
    "RepetitionPenalty", "NoRepeatNGram", "EncoderNoRepeatNGram", "NoBadWords", "MinLength",
    "ForcedBOS", "ForcedEOS", "SuppressTokens", "Temperature", "TopK", "TopP",
    "Renormalize", "apply", "build_processors", "history",
]

_NEG_INF = -np.inf


def _token_list(ids, name, vocab):
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise TypeError(f"{name} must be a list of token ids, got {type(ids).__name__}")
    out = []
    for t in ids:
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
            raise TypeError(f"{name} must hold integer token ids, got {t!r}")
        if not 0 <= t < vocab:
            raise ValueError(f"{name} holds token id {int(t)} outside [0, {vocab})")
        out.append(int(t))
    return out


class RepetitionPenalty:
    """transformers' ``repetition_penalty``: the score of every token already in the row's
    decoder sequence (start token and forced prefix included) is divided by `penalty` where it
    is > 0 (or 0) and multiplied by it where it is < 0, in float32 (the scores' dtype).
    `start`: only the tokens from that position on count (CTranslate2's rule for Whisper: the
    prompt before the transcript is not penalised)."""

    needs_history = True
    needs_sources = False

    def __init__(self, penalty, start=0):
        self.penalty = check_generation_setting("repetition_penalty", penalty)
        self.start = int(start)

    def __call__(self, seqs, scores):
        seqs = seqs[:, self.start:]
        if seqs.shape[1] == 0:
            return scores
        pen = scores.dtype.type(self.penalty)
        got = np.take_along_axis(scores, seqs, axis=1)
        with np.errstate(over="ignore"):      # a logit at float32's minimum: -inf
            got = np.where(got < 0, got * pen, got / pen)
        # a token present several times gets the same value from each copy
        np.put_along_axis(scores, seqs, got, axis=1)
        return scores


def _ngram_banned(seqs, n):
    """(rows, tokens) of the banned (row, token) pairs: the tokens that would complete an n-gram
    already present in the row's sequence (transformers' NoRepeatNGramLogitsProcessor)."""
    cur = seqs.shape[1]
    win = sliding_window_view(seqs, n, axis=1)                  # (rows, cur - n + 1, n), a view
    match = np.ones(win.shape[:2], bool)
    for j in range(n - 1):              # column by column: temporaries of rows x windows only
        match &= win[:, :, j] == seqs[:, cur - n + 1 + j, None]
    r, w = np.nonzero(match)
    return r, win[r, w, n - 1]


class NoRepeatNGram:
    """transformers' ``no_repeat_ngram_size``: no n-gram occurs twice in a row's decoder
    sequence (start token and forced prefix included): a token that would complete an n-gram
    already present gets -inf. `start`: as :class:`RepetitionPenalty`'s."""

    needs_history = True
    needs_sources = False

    def __init__(self, n, start=0):
        self.n = check_generation_setting("no_repeat_ngram_size", n)
        self.start = int(start)

    def __call__(self, seqs, scores):
        seqs = seqs[:, self.start:]
        if seqs.shape[1] < self.n:
            return scores
        r, tok = _ngram_banned(seqs, self.n)
        scores[r, tok] = _NEG_INF
        return scores


def _void_keys(a):
    """Rows of an int64 array (m, k) as one opaque key each (k * 8 bytes), for sorting and
    searching rows as wholes."""
    a = np.ascontiguousarray(a, dtype=np.int64)
    return a.view(np.dtype((np.void, 8 * a.shape[1]))).reshape(a.shape[0])


class EncoderNoRepeatNGram:
    """transformers' ``encoder_no_repeat_ngram_size``: no n-gram of the source appears in the
    output: where a row's last n - 1 tokens equal the first n - 1 of a source n-gram, that
    n-gram's last token gets -inf (n = 1: every source token is banned).

    `sources` lists each source's tokens, padding removed (the positions whose attention mask
    is 1): unlike transformers, which takes n-grams over the padded input_ids rectangle
    (padding tokens included), a source gives the same bans alone or padded in a batch. The
    n-grams of all sources are kept in one table sorted by (source, prefix); each step looks its
    rows' (source, last n - 1 tokens) up in it (binary search), so a step costs O(rows log n-grams)
    whatever the source lengths."""

    needs_history = True
    needs_sources = True

    def __init__(self, n, sources):
        self.n = n = check_generation_setting("encoder_no_repeat_ngram_size", n)
        keys, last = [], []
        for b, toks in enumerate(sources):
            toks = np.asarray(toks, dtype=np.int64)
            if toks.size < n:
                continue
            w = sliding_window_view(toks, n)                      # (W, n)
            keys.append(np.concatenate([np.full((w.shape[0], 1), b, np.int64), w[:, :-1]], 1))
            last.append(w[:, -1])
        if keys:
            k = _void_keys(np.concatenate(keys))
            order = np.argsort(k, kind="stable")
            self.keys, self.last = k[order], np.concatenate(last)[order]
        else:
            self.keys, self.last = None, None

    def __call__(self, seqs, scores, sources):
        cur = seqs.shape[1]
        if self.keys is None or cur < self.n - 1:
            return scores
        q = _void_keys(np.concatenate([np.asarray(sources, np.int64)[:, None],
                                       seqs[:, cur - self.n + 1:]], 1))
        lo = np.searchsorted(self.keys, q, "left")
        hi = np.searchsorted(self.keys, q, "right")
        cnt = hi - lo
        if not cnt.any():
            return scores
        rows = np.repeat(np.arange(len(q)), cnt)
        starts = np.repeat(lo - (np.cumsum(cnt) - cnt), cnt)
        scores[rows, self.last[starts + np.arange(rows.size)]] = _NEG_INF
        return scores


class NoBadWords:
    """Forbid completing any of the token sequences in `bad_words_ids`.

    A one-token entry is forbidden everywhere; a longer entry forbids its last token where the
    row's sequence ends with the entry's prefix (the start token counts as part of the sequence,
    as in transformers). One-token entries equal to EOS are dropped (transformers does too).
    """

    def __init__(self, bad_words_ids, eos_id, vocab):
        if isinstance(bad_words_ids, (str, bytes)) or not hasattr(bad_words_ids, "__iter__"):
            raise ValueError(f"bad_words_ids must be a list of lists of token ids, got "
                             f"{bad_words_ids!r}")
        words = []
        for w in bad_words_ids:
            if isinstance(w, (str, bytes)) or not hasattr(w, "__iter__"):
                raise ValueError(f"bad_words_ids must be a list of lists of token ids, got "
                                 f"entry {w!r}")
            w = _token_list(w, "bad_words_ids", vocab)
            if not w:
                raise ValueError("bad_words_ids entries must be non-empty")
            words.append(w)
        if not words:
            raise ValueError("bad_words_ids must not be empty")
        words = [w for w in words if w != [eos_id]]
        self.single = np.array(sorted({w[0] for w in words if len(w) == 1}), dtype=np.int64)
        self.multi = [(np.array(w[:-1], dtype=np.int64), w[-1]) for w in words if len(w) > 1]
        self.needs_history = bool(self.multi)
        self.needs_sources = False

    def __call__(self, seqs, scores):
        if self.single.size:
            scores[:, self.single] = _NEG_INF
        cur = seqs.shape[1]
        for prefix, last in self.multi:
            m = prefix.size
            if m > cur:
                continue
            hit = np.all(seqs[:, cur - m:] == prefix, axis=1)
            scores[hit, last] = _NEG_INF
        return scores


class MinLength:
    """Forbid EOS while the sequence (start token included) is shorter than `min_length`."""

    needs_history = False
    needs_sources = False

    def __init__(self, min_length, eos_id):
        self.min_length = min_length
        self.eos_id = eos_id

    def __call__(self, seqs, scores):
        if seqs.shape[1] < self.min_length:
            scores[:, self.eos_id] = _NEG_INF
        return scores


class _ForcedToken:
    """When the sequence is `length` tokens long, `token_id` gets 0 and every other token -inf."""

    needs_history = False
    needs_sources = False

    def __init__(self, length, token_id):
        self.length, self.token_id = length, token_id

    def __call__(self, seqs, scores):
        if seqs.shape[1] == self.length:
            scores[...] = _NEG_INF
            scores[:, self.token_id] = 0.0
        return scores


class ForcedBOS(_ForcedToken):
    """The first generated token is `token_id` (mBART-50, M2M100, NLLB: the target language),
    while the sequence holds only the start token (transformers' ForcedBOSTokenLogitsProcessor)."""

    def __init__(self, token_id):
        super().__init__(1, token_id)


class ForcedEOS(_ForcedToken):
    """At the last position allowed by `max_length`, EOS gets 0 and every other token -inf."""

    def __init__(self, max_length, eos_id):
        super().__init__(max_length - 1, eos_id)


class SuppressTokens:
    """Tokens that are never generated (score -inf)."""

    needs_history = False
    needs_sources = False

    def __init__(self, ids, vocab):
        self.ids = np.array(sorted(set(_token_list(ids, "suppress_tokens", vocab))), np.int64)

    def __call__(self, seqs, scores):
        scores[:, self.ids] = _NEG_INF
        return scores


class Temperature:
    needs_history = False
    needs_sources = False

    def __init__(self, temperature):
        self.temperature = check_generation_setting("temperature", temperature)

    def __call__(self, seqs, scores):
        # a temperature so small that scores overflow: sampling then refuses the +inf scores
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            scores /= scores.dtype.type(self.temperature)
        return scores


class TopK:
    """Keep the k highest scores (ties with the k-th kept too), -inf elsewhere."""

    needs_history = False
    needs_sources = False

    def __init__(self, top_k, min_tokens_to_keep=1):
        if top_k == 0:
            raise ValueError("top_k must be a positive integer here, got 0 (0 = no top-k filter: "
                             "leave the processor out)")
        self.k = max(check_generation_setting("top_k", top_k), min_tokens_to_keep)

    def __call__(self, seqs, scores):
        V = scores.shape[1]
        k = min(self.k, V)
        if k == V:
            return scores
        kth = np.partition(scores, V - k, axis=1)[:, V - k:V - k + 1]    # k-th largest, (n, 1)
        scores[scores < kth] = _NEG_INF
        return scores


class TopP:
    """Nucleus filter: drop the lowest-probability tokens whose total mass is <= 1 - top_p."""

    needs_history = False
    needs_sources = False

    def __init__(self, top_p, min_tokens_to_keep=1):
        self.p = check_generation_setting("top_p", top_p)
        self.min_keep = min_tokens_to_keep

    def __call__(self, seqs, scores):
        order = np.argsort(scores, axis=1, kind="stable")                 # ascending
        srt = np.take_along_axis(scores, order, axis=1)
        m = srt[:, -1:]
        m = np.where(np.isfinite(m), m, 0)
        e = np.exp(srt - m)
        cum = np.cumsum(e, axis=1) / e.sum(axis=1, keepdims=True)
        drop = cum <= (1 - self.p)
        drop[:, -self.min_keep:] = False
        rows = np.nonzero(drop)
        scores[rows[0], order[rows]] = _NEG_INF
        return scores


class Renormalize:
    """log_softmax of the processed scores (transformers' ``renormalize_logits``)."""

    needs_history = False
    needs_sources = False

    def __call__(self, seqs, scores):
        return log_softmax(scores, out=scores)


def history(seqs, rows, cur, procs):
    """The (n, cur) token history for `procs`: a copy of seqs[rows, :cur] when a processor reads
    it, else a zero-stride stand-in carrying only the shape (no per-step allocation)."""
    if any(p.needs_history for p in procs):
        return seqs[rows, :cur]
    return np.broadcast_to(np.int64(0), (len(rows), cur))


def apply(procs, seqs, scores, sources):
    """Run `procs` in order over scores (n, V) of rows with token history `seqs` decoding
    `sources` (n,)."""
    for proc in procs:
        scores = proc(seqs, scores, sources) if proc.needs_sources else proc(seqs, scores)
    return scores


def build_processors(p, vocab, eos_id, sampling_min_keep=1, sources=None):
    """The processor list for resolved generation settings `p` (a dict), in transformers' order.
    `sources`: each source's tokens without padding (for ``encoder_no_repeat_ngram_size``)."""
    procs = []
    if p.get("repetition_penalty") not in (None, 1.0):
        procs.append(RepetitionPenalty(p["repetition_penalty"]))
    if p.get("no_repeat_ngram_size"):
        procs.append(NoRepeatNGram(p["no_repeat_ngram_size"]))
    if p.get("encoder_no_repeat_ngram_size"):
        if sources is None:
            raise ValueError("encoder_no_repeat_ngram_size needs the source token ids")
        procs.append(EncoderNoRepeatNGram(p["encoder_no_repeat_ngram_size"], sources))
    if p["bad_words_ids"] is not None:
        procs.append(NoBadWords(p["bad_words_ids"], eos_id, vocab))
    if eos_id is not None and p["min_length"] > 0:
        procs.append(MinLength(p["min_length"], eos_id))
    if p.get("forced_bos_token_id") is not None:
        procs.append(ForcedBOS(p["forced_bos_token_id"]))
    if p["forced_eos_token_id"] is not None:
        procs.append(ForcedEOS(p["max_length"], p["forced_eos_token_id"]))
    if p["suppress_tokens"] is not None:
        sup = SuppressTokens(p["suppress_tokens"], vocab)
        # contradictions transformers also refuses: nothing would be left to generate
        if len(sup.ids) == vocab:
            raise ValueError(f"suppress_tokens forbids every token of the vocabulary ({vocab})")
        forced = p["forced_eos_token_id"]
        if forced is not None and forced in sup.ids:
            raise ValueError(f"forced_eos_token_id={forced} is also in suppress_tokens: the "
                             "last token would be forbidden")
        procs.append(sup)
    if p["do_sample"]:
        if p["temperature"] is not None and p["temperature"] != 1.0:
            procs.append(Temperature(p["temperature"]))
        if p["top_k"] is not None and p["top_k"] != 0:
            procs.append(TopK(p["top_k"], sampling_min_keep))
        if p["top_p"] is not None and p["top_p"] < 1.0:
            procs.append(TopP(p["top_p"], sampling_min_keep))
    if p["renormalize_logits"]:
        procs.append(Renormalize())
    return procs
