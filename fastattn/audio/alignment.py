"""Word-level timestamps for Whisper: where each word lies in the audio, from the cross-attention
of the decoder's alignment heads (dynamic time warping).

The semantics are openai-whisper's ``timing.py`` as faster-whisper runs it (re-derived here):

1. a teacher-forced pass over ``sot_sequence + [<|notimestamps|>] + text + [<|endoftext|>]``
   (:meth:`fastattn.WhisperModel.cross_attention_weights`' pass) gives each alignment head's
   attention scores q k^T * scale; those over the window's audio (the first ``num_frames // 2``
   encoder positions) are softmaxed (times ``qk_scale``), normalised per head over the token
   axis (mean 0, standard deviation 1), median filtered along time (width 7, reflected edges)
   and averaged over the heads (:func:`alignment_matrix`);
2. the rows of the text tokens and EOT (the prefix dropped) are aligned to the encoder
   positions by :func:`dtw` on the negated matrix; each row starts where the path first
   reaches it (:func:`token_times`; an encoder position is 0.02 s);
3. the tokens are grouped into words (:func:`split_to_word_tokens`: at a space or punctuation,
   or at each whole character for zh, ja, th, lo, my, yue); a word runs from its first token's
   time to the next word's; its probability is the mean probability of its tokens under the
   same pass's logits (softmax over the text tokens);
4. :func:`add_word_timestamps` then applies faster-whisper's heuristics: words at sentence
   ends no longer than twice the median word duration (the median at most 0.7 s), punctuation
   merged into its neighbour (:func:`merge_punctuations`), the first words after a pause
   shortened, and each segment's start / end moved to its words (or the words to the segment
   where a word runs more than 0.5 s past it).

NumPy alone; the DTW is vectorised along anti-diagonals (a 448 x 1500 matrix in ~20 ms) and
takes the same path as openai-whisper's loop, ties included.
"""
import itertools
import math
import string
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["dtw", "median_filter", "alignment_matrix", "token_times", "split_to_word_tokens",
           "merge_punctuations", "find_alignment", "add_word_timestamps", "WordTiming",
           "Word", "TOKENS_PER_SECOND", "PREPEND_PUNCTUATIONS", "APPEND_PUNCTUATIONS"]

TOKENS_PER_SECOND = 50                 # encoder positions per second (0.02 s each)
PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
_SENTENCE_END = ".。!！?？"
_NO_SPACE_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "my", "yue"})
_REPLACEMENT = "\ufffd"


@dataclass
class WordTiming:
    """A word of one window (:func:`find_alignment`): its text, tokens, start and end (seconds
    from the window's start) and the mean probability of its tokens."""
    word: str
    tokens: list
    start: float
    end: float
    probability: float


@dataclass(frozen=True)
class Word:
    """A word and when it was said (seconds from the start of the audio, rounded to 0.01 by
    :func:`add_word_timestamps`), with the mean probability of its tokens: what a
    transcription segment's ``words`` hold."""
    start: float
    end: float
    word: str
    probability: float


# ---------------------------------------------------------------------------------------------
# dynamic time warping, median filter
# ---------------------------------------------------------------------------------------------

def dtw(cost):
    """The cheapest monotone path through `cost` (N, M) from (0, 0) to (N - 1, M - 1), each
    step one down, one right or one diagonally -> (row indices, column indices), int64 arrays
    of the path's cells in order.

    openai-whisper's ``dtw_cpu`` step for step: accumulated costs kept in float32 (each the
    float64 sum of the cell and the cheapest predecessor, rounded), the diagonal taken when it
    is strictly cheapest, else the cell above when it is strictly cheapest, else the cell to
    the left (so a tie between the diagonal and the cell above goes left). Computed along
    anti-diagonals, each one vectorised."""
    x = np.asarray(cost, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"dtw: cost must be a non-empty 2-D matrix, got shape {x.shape}")
    N, M = x.shape
    flat = np.ascontiguousarray(x).reshape(-1)
    # acc[k, i]: the accumulated cost of cell (i, k - i) of the (N + 1, M + 1) table whose row
    # and column 0 are the border (inf, 0 at the corner)
    acc = np.full((N + M + 1, N + 1), np.inf, np.float32)
    acc[0, 0] = 0
    step = max(M - 1, 1)
    low = np.empty(N, np.float32)
    pick = np.empty(N, bool)
    diff = np.empty(N, bool)
    for k in range(2, N + M + 1):
        lo, hi = max(1, k - M), min(N, k - 1)              # the table rows on this diagonal
        n = hi - lo + 1
        c0 = acc[k - 2, lo - 1:hi]                          # (i - 1, j - 1)
        c1 = acc[k - 1, lo - 1:hi]                          # (i - 1, j)
        c2 = acc[k - 1, lo:hi + 1]                          # (i, j - 1)
        start = (lo - 1) * (M - 1) + k - 2                  # cost[i - 1, k - i - 1], i = lo
        xs = flat[start:start + (n - 1) * step + 1:step]
        # openai's choice: c0 if it is the strict minimum, else c1 if it is, else c2; that is
        # min(c0, c1) where it is below c2 and c0 != c1, else c2 (NaN included)
        m, p, d = low[:n], pick[:n], diff[:n]
        np.minimum(c0, c1, out=m)
        np.less(m, c2, out=d)
        np.logical_not(d, out=d)                # not below c2 (NaN included)
        np.equal(c0, c1, out=p)
        p |= d                                  # where c2 is taken
        np.copyto(m, c2, where=p)
        np.add(xs, m, out=acc[k, lo:hi + 1], casting="unsafe")
    # the path back from the corner, each step's choice taken again from the stored costs
    rows, cols = [], []
    i, j = N, M
    while i > 0 or j > 0:
        rows.append(i - 1)
        cols.append(j - 1)
        if i == 0:
            j -= 1
        elif j == 0:
            i -= 1
        else:
            k = i + j
            c0, c1, c2 = acc[k - 2, i - 1], acc[k - 1, i - 1], acc[k - 1, i]
            if c0 < c1 and c0 < c2:
                i -= 1
                j -= 1
            elif c1 < c0 and c1 < c2:
                i -= 1
            else:
                j -= 1
    return np.array(rows[::-1], np.int64), np.array(cols[::-1], np.int64)


def _check_width(width):
    if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width < 1 or \
            width % 2 == 0:
        raise ValueError(f"the median filter's width must be an odd integer >= 1, got {width!r}")
    return int(width)


def median_filter(x, width):
    """The running median of `x` along its last axis over `width` (odd) values, the ends
    extended by reflection without repeating the edge value (d c b | a b c d: torch's and
    NumPy's 'reflect', scipy.ndimage's 'mirror'): openai-whisper's median_filter. An axis of
    at most width // 2 values is returned as it is (a copy)."""
    width = _check_width(width)
    x = np.asarray(x)
    pad = width // 2
    if x.ndim == 0:
        raise ValueError("median_filter: x must have at least one axis")
    if x.shape[-1] <= pad:
        return x.copy()
    n = x.shape[-1]
    rows = x.reshape(-1, n)
    out = np.empty(rows.shape, x.dtype)
    chunk = max(1, (1 << 22) // max(1, (n + 2 * pad) * width))   # bound the windows' copy
    for r in range(0, rows.shape[0], chunk):
        p = np.pad(rows[r:r + chunk], ((0, 0), (pad, pad)), mode="reflect")
        win = np.lib.stride_tricks.sliding_window_view(p, width, axis=-1)
        out[r:r + chunk] = np.partition(win, pad, axis=-1)[..., pad]
    return out.reshape(x.shape)


def alignment_matrix(weights, medfilt_width=7):
    """Attention weights (heads, tokens, positions) -> (tokens, positions): each head
    normalised over the token axis (mean 0, standard deviation 1, the population's), median
    filtered along positions (:func:`median_filter`), then the mean over heads (openai-
    whisper's and transformers' matrix). float32 in, float32 out."""
    w = np.asarray(weights)
    if w.ndim != 3:
        raise ValueError(f"weights must be (heads, tokens, positions), got shape {w.shape}")
    mean = w.mean(axis=-2, keepdims=True)
    std = w.std(axis=-2, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = (w - mean) / std
    return median_filter(w, medfilt_width).mean(axis=0)


def token_times(matrix):
    """The time (seconds) at which each row of an alignment matrix (tokens, positions) starts:
    the position where :func:`dtw` of ``-matrix`` first reaches the row, / 50."""
    rows, cols = dtw(-np.asarray(matrix, np.float64))
    jumps = np.diff(rows, prepend=-1).astype(bool)
    return cols[jumps] / TOKENS_PER_SECOND


# ---------------------------------------------------------------------------------------------
# words
# ---------------------------------------------------------------------------------------------

def _text_decoder(tokenizer):
    """ids -> text, special tokens skipped and nothing cleaned up (the text as the byte-level
    BPE gives it): a fastattn tokenizer (its tokenizers.Tokenizer), a tokenizers.Tokenizer,
    any object with decode(ids), or a callable."""
    tk = getattr(tokenizer, "_tk", None)
    if tk is not None:
        return lambda ids: tk.decode([int(i) for i in ids], skip_special_tokens=True)
    if hasattr(tokenizer, "decode"):
        return lambda ids: tokenizer.decode([int(i) for i in ids])
    if callable(tokenizer):
        return lambda ids: tokenizer([int(i) for i in ids])
    raise TypeError(f"tokenizer must decode token ids (a tokenizer or a callable), got "
                    f"{type(tokenizer).__name__}")


def _split_on_unicode(tokens, decode):
    full = decode(tokens)
    words, groups, current, offset = [], [], [], 0
    for t in tokens:
        current.append(t)
        text = decode(current)
        at = text.find(_REPLACEMENT)
        # a group ends where its text is whole: no replacement character, or one that the
        # full text holds too (a genuine U+FFFD, or bytes that never complete)
        if at < 0 or (at + offset < len(full) and full[at + offset] == _REPLACEMENT):
            words.append(text)
            groups.append(current)
            current = []
            offset += len(text)
    return words, groups


def split_to_word_tokens(tokens, tokenizer, eot, language=None):
    """Whisper's words of `tokens` (text tokens, usually then EOT) -> (words, token groups).

    For zh, ja, th, lo, my and yue (no spaces between words) every whole character is a word
    (a token run whose text has no replacement character); otherwise those runs are joined
    into words that start at a run beginning with a space, a run that is punctuation, or a
    special token (id >= eot). `tokenizer`: see :func:`find_alignment`."""
    decode = _text_decoder(tokenizer)
    tokens = [int(t) for t in tokens]
    subwords, groups = _split_on_unicode(tokens, decode)
    if language in _NO_SPACE_LANGUAGES:
        return subwords, groups
    words, out = [], []
    for sub, group in zip(subwords, groups):
        if group[0] >= eot or sub.startswith(" ") or sub.strip() in string.punctuation or \
                not words:
            words.append(sub)
            out.append(list(group))
        else:
            words[-1] += sub
            out[-1].extend(group)
    return words, out


def merge_punctuations(alignment, prepended=PREPEND_PUNCTUATIONS, appended=APPEND_PUNCTUATIONS):
    """Merge punctuation words into their neighbours in place (a list of :class:`WordTiming`):
    an opening mark (a word ' x' with x in `prepended`) into the word after it, a closing one
    (x in `appended`, after a word that does not end in a space) into the word before it. The
    merged word keeps its own times; the mark's entry is left with no text and no tokens."""
    i, j = len(alignment) - 2, len(alignment) - 1
    while i >= 0:
        prev, nxt = alignment[i], alignment[j]
        if prev.word.startswith(" ") and prev.word.strip() in prepended:
            nxt.word = prev.word + nxt.word
            nxt.tokens = prev.tokens + nxt.tokens
            prev.word, prev.tokens = "", []
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(alignment):
        prev, nxt = alignment[i], alignment[j]
        if not prev.word.endswith(" ") and nxt.word in appended:
            prev.word = prev.word + nxt.word
            prev.tokens = prev.tokens + nxt.tokens
            nxt.word, nxt.tokens = "", []
        else:
            i = j
        j += 1


# ---------------------------------------------------------------------------------------------
# one window
# ---------------------------------------------------------------------------------------------

def _special_ids(model):
    gen = model.generation_config
    eot = gen.get("eos_token_id")
    if eot is None:
        eot = model.eos_id
    if isinstance(eot, (list, tuple)):
        eot = eot[0]
    nts = gen.get("no_timestamps_token_id")
    if nts is None:
        raise ValueError("word timestamps need no_timestamps_token_id in the model's "
                         "generation config")
    return int(eot), int(nts)


def _language_of(model, sot_sequence):
    lang = model.generation_config.get("lang_to_id") or {}
    by_id = {v: k for k, v in lang.items()}
    for t in sot_sequence:
        if int(t) in by_id:
            return by_id[int(t)].strip("<|>")
    return None


def _token_list(tokens, name, vocab):
    out = []
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < vocab:
            raise ValueError(f"{name} holds {t!r}, not a token id in [0, {vocab})")
        out.append(int(t))
    return out


def find_alignment(model, encoder_output, sot_sequence, text_tokens, num_frames, tokenizer, *,
                   language=None, medfilt_width=7, qk_scale=1.0, n_threads=None):
    """The words of one window and when they are said (openai-whisper's find_alignment).

    Parameters
    ----------
    model : fastattn.WhisperModel
        Its :attr:`~fastattn.WhisperModel.alignment_heads` give the weights.
    encoder_output : array (max_source_positions, d_model) or (1, ...)
        The window's encoder output (:meth:`~fastattn.WhisperModel.encode`), or its features
        (1, num_mel_bins, n_frames).
    sot_sequence : list of int
        <|startoftranscript|>, the language and task tokens, without any previous-text prompt
        (<|notimestamps|> follows them here; one ending the sequence is the same one).
    text_tokens : list of int
        The window's text tokens (ids below EOT: no timestamps).
    num_frames : int
        Mel frames of audio in the window (at most n_frames): the first num_frames // 2
        encoder positions are aligned to.
    tokenizer : a fastattn tokenizer (``tokenizer.json``), a ``tokenizers.Tokenizer``, or a
        callable ids -> text (the raw byte-level decoding, special tokens skipped).
    language : str, optional
        The language code; default the language token of `sot_sequence` (none: split at
        spaces).
    medfilt_width : int (odd)
    qk_scale : float
        Multiplies the attention scores before their softmax.
    n_threads : int, optional

    Returns
    -------
    list of :class:`WordTiming` (start / end in seconds from the window's start); [] without
    text tokens.
    """
    eot, nts = _special_ids(model)
    V = model.vocab_size
    sot_sequence = _token_list(sot_sequence, "sot_sequence", V)
    text_tokens = _token_list(text_tokens, "text_tokens", V)
    if any(t >= eot for t in text_tokens):
        raise ValueError("text_tokens must be text tokens (ids below <|endoftext|>): drop the "
                         "timestamps and special tokens")
    medfilt_width = _check_width(medfilt_width)
    qk_scale = float(qk_scale)
    if not math.isfinite(qk_scale):
        raise ValueError(f"qk_scale must be finite, got {qk_scale!r}")
    S = model.config["max_source_positions"]
    if isinstance(num_frames, bool) or not isinstance(num_frames, (int, np.integer)) or \
            not 2 <= num_frames <= 2 * S:
        raise ValueError(f"num_frames must be an integer in [2, {2 * S}], got {num_frames!r}")
    if sot_sequence and sot_sequence[-1] == nts:
        sot_sequence = sot_sequence[:-1]
    if not text_tokens:
        return []
    shape = np.shape(encoder_output)
    if len(shape) == 3 and shape[0] != 1:
        raise ValueError(f"find_alignment takes one window's encoder output, got {shape[0]}")
    tokens = sot_sequence + [nts] + text_tokens + [eot]
    if len(tokens) > model.max_decoder_positions:
        raise ValueError(f"{len(tokens)} tokens (the prefix, <|notimestamps|>, the text, EOT) "
                         f"exceed max_target_positions={model.max_decoder_positions}")
    if language is None:
        language = _language_of(model, sot_sequence)
    scores, logits = model.cross_attention_weights(encoder_output, [tokens], softmax=False,
                                                   return_logits=True, n_threads=n_threads)
    n_sot, n = len(sot_sequence), len(text_tokens)
    # the text tokens' probabilities: each predicted from the position before it
    lg = logits[0, n_sot:n_sot + n, :eot].astype(np.float64)
    lg -= lg.max(axis=1, keepdims=True)
    p = np.exp(lg)
    probs = p[np.arange(n), text_tokens] / p.sum(axis=1)
    # the heads' weights over the window's audio
    w = scores[0, :, :, :num_frames // 2]
    if qk_scale != 1.0:
        w = w * np.float32(qk_scale)
    w = np.exp(w - w.max(axis=-1, keepdims=True))
    w /= w.sum(axis=-1, keepdims=True)
    matrix = alignment_matrix(w, medfilt_width)[n_sot:-1]      # text tokens and EOT
    words, groups = split_to_word_tokens(text_tokens + [eot], tokenizer, eot, language)
    if len(groups) <= 1:
        return []
    bounds = np.concatenate([[0], np.cumsum([len(g) for g in groups[:-1]])])
    times = token_times(matrix)
    starts, ends = times[bounds[:-1]], times[bounds[1:]]
    return [WordTiming(word, list(group), float(s), float(e), float(np.mean(probs[a:b])))
            for word, group, s, e, a, b in zip(words, groups, starts, ends, bounds[:-1],
                                               bounds[1:])]


def _field(seg, name):
    return seg[name] if isinstance(seg, Mapping) else getattr(seg, name)


def add_word_timestamps(model, segments, encoder_output, sot_sequence, tokenizer, num_frames,
                        time_offset, *, language=None, last_speech_timestamp=0.0,
                        prepend_punctuations=PREPEND_PUNCTUATIONS,
                        append_punctuations=APPEND_PUNCTUATIONS, medfilt_width=7, qk_scale=1.0,
                        n_threads=None):
    """Word timestamps for the segments of one window (faster-whisper's add_word_timestamps).

    Parameters
    ----------
    model, encoder_output, sot_sequence, tokenizer, num_frames, language, medfilt_width,
    qk_scale, n_threads :
        As :func:`find_alignment` (one alignment of all the window's text).
    segments : list of mappings or objects with ``tokens`` (timestamps included: only the
        ids below EOT count), ``start`` and ``end`` (absolute seconds)
        Every segment of the window decoded, in order (the empty ones too: their text is
        part of the alignment).
    time_offset : float
        The window's start in seconds (its seek frame * 0.01).
    last_speech_timestamp : float
        The end of the previous window's last segment with words (0 at first).
    prepend_punctuations, append_punctuations : str
        :func:`merge_punctuations`' marks.

    Returns
    -------
    (results, last_speech_timestamp): results one ``(start, end, words)`` per segment, its
    start and end adjusted to its words and ``words`` a list of :class:`Word` (absolute
    seconds rounded to 0.01; empty when the segment has no words); last_speech_timestamp
    updated for the next window.
    """
    if not segments:
        return [], float(last_speech_timestamp)
    eot, _ = _special_ids(model)
    per_segment = [[int(t) for t in _field(s, "tokens") if int(t) < eot] for s in segments]
    text_tokens = list(itertools.chain.from_iterable(per_segment))
    alignment = find_alignment(model, encoder_output, sot_sequence, text_tokens, num_frames,
                               tokenizer, language=language, medfilt_width=medfilt_width,
                               qk_scale=qk_scale, n_threads=n_threads)
    durations = np.array([w.end - w.start for w in alignment])
    durations = durations[durations.nonzero()]
    median = min(0.7, float(np.median(durations))) if len(durations) else 0.0
    longest = median * 2
    if len(durations):
        # a word at a sentence boundary is at most twice the median duration
        for i in range(1, len(alignment)):
            w = alignment[i]
            if w.end - w.start > longest:
                if w.word in _SENTENCE_END:
                    w.end = w.start + longest
                elif alignment[i - 1].word in _SENTENCE_END:
                    w.start = w.end - longest
    merge_punctuations(alignment, prepend_punctuations, append_punctuations)
    last = float(last_speech_timestamp)
    offset = float(time_offset)
    results, k = [], 0
    for seg, toks in zip(segments, per_segment):
        start, end = float(_field(seg, "start")), float(_field(seg, "end"))
        words, saved = [], 0
        while k < len(alignment) and saved < len(toks):
            w = alignment[k]
            if w.word:
                words.append([round(offset + w.start, 2), round(offset + w.end, 2), w.word,
                              w.probability])
            saved += len(w.tokens)
            k += 1
        if words:
            first = words[0]
            # after a pause, the first (and second) word at most twice the median duration
            if first[1] - last > median * 4 and (
                    first[1] - first[0] > longest or
                    (len(words) > 1 and words[1][1] - first[0] > longest * 2)):
                if len(words) > 1 and words[1][1] - words[1][0] > longest:
                    boundary = max(words[1][1] / 2, words[1][1] - longest)
                    first[1] = words[1][0] = boundary
                first[0] = max(0.0, first[1] - longest)
            # the segment's start, unless its first word runs more than 0.5 s before it
            if start < first[1] and start - 0.5 > first[0]:
                first[0] = max(0.0, min(first[1] - median, start))
            else:
                start = first[0]
            # the segment's end, unless its last word runs more than 0.5 s past it
            final = words[-1]
            if end > final[0] and end + 0.5 < final[1]:
                final[1] = max(final[0] + median, end)
            else:
                end = final[1]
            last = end
        results.append((start, end, [Word(float(a), float(b), c, float(d))
                                     for a, b, c, d in words]))
    return results, last
