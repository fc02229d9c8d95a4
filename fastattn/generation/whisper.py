"""Whisper's decoding rules: the forced prompt, its logits processors, the seek loop's segments.

Semantics of transformers' ``WhisperForConditionalGeneration.generate`` (5.x,
``models/whisper/generation_whisper.py`` and ``generation/logits_process.py``), re-derived:

- the decoder prefix (:func:`prompt_rows`): ``<|startoftranscript|>``, the language (given, or
  detected per clip), the task, ``<|notimestamps|>`` unless timestamps are asked for; without
  language and task, the checkpoint's ``forced_decoder_ids`` fill positions 1, 2, ...; a
  ``<|startofprev|>`` prompt goes before it all.
- processors, after the generic ones (:mod:`.processors`), in this order:
  :class:`SuppressAtBegin` (``begin_suppress_tokens`` at the first generated position),
  :class:`~.processors.SuppressTokens`, and with timestamps :class:`TimestampRules`.
- every clip is decoded from seek 0 of its features; a decoding that ends inside a pair of
  timestamp tokens moves the seek to the last timestamp and the clip is decoded again from
  there (:func:`split_segments`): transformers runs this loop for clips of at most 30 s too.
  The result is the clip's kept tokens, window after window, the prefix and EOS left out.
- one window's decoding (:class:`WindowDecoder`: the settings, the processors, beam search,
  greedy or sampling, the no-speech probability and the scores the temperature fallback reads)
  is ``WhisperModel.generate``'s and ``fastattn.audio.Transcriber``'s (sequential, batched,
  streamed); the fallback's draws come from :func:`fallback_streams` / :func:`window_stream`.
"""
from typing import NamedTuple

import numpy as np

from ..functional import log_softmax
from .beam_ct2 import beam_search_ct2, check_beam_rule
from .config import resolve_settings
from .processors import (NoRepeatNGram, RepetitionPenalty, SuppressTokens, _token_list,
                         build_processors)
from .search import beam_search, greedy_search

__all__ = ["SuppressAtBegin", "TimestampRules", "LANGUAGES", "language_token", "prompt_rows",
           "split_segments", "window_segments", "strip_generated", "WindowDecoder",
           "WindowResult", "fallback_streams", "window_stream"]

_NEG_INF = -np.inf

# Whisper's languages (code -> name) and the aliases transformers' tokenizer accepts for them
LANGUAGES = dict(zip(
    "en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no "
    "th ur hr bg lt la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw "
    "gl mr pa si km sn yo so af oc ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl "
    "mg as tt haw ln ha ba jw su yue".split(),
    "english,chinese,german,spanish,russian,korean,french,japanese,portuguese,turkish,polish,"
    "catalan,dutch,arabic,swedish,italian,indonesian,hindi,finnish,vietnamese,hebrew,ukrainian,"
    "greek,malay,czech,romanian,danish,hungarian,tamil,norwegian,thai,urdu,croatian,bulgarian,"
    "lithuanian,latin,maori,malayalam,welsh,slovak,telugu,persian,latvian,bengali,serbian,"
    "azerbaijani,slovenian,kannada,estonian,macedonian,breton,basque,icelandic,armenian,nepali,"
    "mongolian,bosnian,kazakh,albanian,swahili,galician,marathi,punjabi,sinhala,khmer,shona,"
    "yoruba,somali,afrikaans,occitan,georgian,belarusian,tajik,sindhi,gujarati,amharic,yiddish,"
    "lao,uzbek,faroese,haitian creole,pashto,turkmen,nynorsk,maltese,sanskrit,luxembourgish,"
    "myanmar,tibetan,tagalog,malagasy,assamese,tatar,hawaiian,lingala,hausa,bashkir,javanese,"
    "sundanese,cantonese".split(",")))
_NAME_TO_CODE = {name: code for code, name in LANGUAGES.items()}
_NAME_TO_CODE.update(burmese="my", valencian="ca", flemish="nl", haitian="ht",
                     letzeburgesch="lb", pushto="ps", panjabi="pa", moldavian="ro",
                     moldovan="ro", sinhalese="si", castilian="es", mandarin="zh")
TASKS = ("translate", "transcribe")


def language_token(language, lang_to_id):
    """A language as given to generate ('de', 'german', '<|de|>'; any case) -> its token id in
    `lang_to_id` (ValueError for a language Whisper does not know or this model lacks)."""
    if not isinstance(language, str):
        raise TypeError(f"language must be a string (a code such as 'de', a name such as "
                        f"'german', or a token such as '<|de|>'), got {language!r}")
    lang = language.lower()
    if lang in lang_to_id:
        tok = lang
    elif lang in _NAME_TO_CODE:
        tok = f"<|{_NAME_TO_CODE[lang]}|>"
    elif lang in LANGUAGES:
        tok = f"<|{lang}|>"
    else:
        raise ValueError(f"unsupported language {language!r}: give a language code "
                         f"({', '.join(LANGUAGES)}) or name")
    if tok not in lang_to_id:
        raise ValueError(f"language {language!r} ({tok}) is not one of this model's languages "
                         f"(its generation config's lang_to_id)")
    return lang_to_id[tok]


def prompt_rows(gen, batch, *, language=None, task=None, return_timestamps=False, detect=None):
    """The forced decoder prefix of each clip (a list of `batch` token lists), as transformers'
    ``_retrieve_init_tokens``.

    gen: the model's generation config (Whisper fields checked); language: None, one language
    or one per clip; task: None, 'transcribe' or 'translate' (None for both: the checkpoint's
    ``language`` / ``task``, then its ``forced_decoder_ids``); detect(): the detected language
    ids (batch,), called only when a multilingual model is given no language."""
    if language is None:
        language = gen.get("language")
    if task is None:
        task = gen.get("task")
    lang_to_id, task_to_id = gen.get("lang_to_id"), gen.get("task_to_id")
    notimestamps = gen.get("no_timestamps_token_id")
    if gen.get("is_multilingual") is False and (task is not None or language is not None):
        raise ValueError("this is an English-only Whisper (is_multilingual is false in its "
                         "generation config): task and language cannot be given")
    if language is not None and lang_to_id is None:
        raise ValueError("language: the model's generation config has no lang_to_id")
    if task is not None and task_to_id is None:
        raise ValueError("task: the model's generation config has no task_to_id")
    if task is not None and task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    init = [gen["decoder_start_token_id"]]
    if task is None and language is None:
        forced = gen.get("forced_decoder_ids")
        if forced and forced[0][0] == 1:
            pos = 1
            while forced and forced[0][0] == pos:
                init.append(forced[0][1])
                forced = forced[1:]
                pos += 1
            if forced:
                raise ValueError(f"forced_decoder_ids {gen['forced_decoder_ids']!r} do not fill "
                                 "the decoder positions 1, 2, ... in order")
    undefined = len(init) <= 1 or init[1] is None
    if isinstance(language, (list, tuple)):
        if len(language) != batch:
            raise ValueError(f"language holds {len(language)} languages for {batch} clips")
        lang_ids = [language_token(lang, lang_to_id) for lang in language]
    elif language is not None:
        lang_ids = [language_token(language, lang_to_id)] * batch
    elif lang_to_id is not None and undefined:
        lang_ids = [int(t) for t in detect()]
    else:
        lang_ids = None
    rows = []
    for b in range(batch):
        row = list(init)
        if lang_ids is not None:
            if len(row) > 1:
                row[1] = lang_ids[b]
            else:
                row.append(lang_ids[b])
        if task is not None:
            row.append(task_to_id[task])
        elif language is not None and task_to_id is not None and \
                not any(t in row for t in task_to_id.values()):
            row.append(task_to_id["transcribe"])
        if not return_timestamps and notimestamps is not None and row[-1] != notimestamps:
            row.append(notimestamps)
        elif return_timestamps and row[-1] == notimestamps:
            row = row[:-1]
        rows.append([t for t in row if t is not None])
    return rows


class SuppressAtBegin:
    """``begin_suppress_tokens``: these tokens get -inf at the first generated position (the
    sequence `begin_index` tokens long: the forced prefix)."""

    needs_history = False
    needs_sources = False

    def __init__(self, ids, begin_index, vocab):
        self.ids = np.array(sorted(set(_token_list(ids, "begin_suppress_tokens", vocab))),
                            np.int64)
        self.begin_index = begin_index

    def __call__(self, seqs, scores):
        if seqs.shape[1] == self.begin_index:
            scores[:, self.ids] = _NEG_INF
        return scores


def _logsumexp(x):
    """log(sum(exp(x))) per row in float32 (torch's: max + log(sum(exp(x - max))); a row of
    -inf gives -inf)."""
    m = x.max(axis=1, keepdims=True)
    safe = np.where(np.isfinite(m), m, np.float32(0))
    with np.errstate(divide="ignore"):
        return (np.log(np.exp(x - safe).sum(axis=1, dtype=np.float32)) + safe[:, 0]).astype(
            np.float32)


class TimestampRules:
    """Whisper's timestamp rules (transformers' WhisperTimeStampLogitsProcessor) over the
    tokens generated after the prefix (`begin_index` tokens):

    - ``<|notimestamps|>`` never; timestamps come in pairs: after a pair a text token, after
      one timestamp (following text) another timestamp or EOS;
    - timestamps never decrease (after a pair, strictly increase);
    - the first generated token is a timestamp, at most ``max_initial_timestamp_index``;
    - where the timestamps' total probability exceeds every text token's, a timestamp.

    ``after_prefix``: CTranslate2's rules after a forced transcript prefix (`begin_index` is
    then the prefix's end): at the first free position only ``<|notimestamps|>`` is
    suppressed (no forced timestamp, no probability rule).
    """

    needs_history = True
    needs_sources = False

    def __init__(self, no_timestamps_id, eos_id, begin_index, max_initial_index=None,
                 from_logprob=True, after_prefix=False):
        self.no_timestamps = no_timestamps_id
        self.begin = no_timestamps_id + 1                  # the first timestamp token
        self.eos = eos_id
        self.begin_index = begin_index
        self.max_initial = max_initial_index
        self.from_logprob = from_logprob
        self.after_prefix = after_prefix

    def __call__(self, seqs, scores):
        tb = self.begin
        scores[:, self.no_timestamps] = _NEG_INF
        if self.after_prefix and seqs.shape[1] == self.begin_index:
            return scores
        gen = seqs[:, self.begin_index:]
        n, m = gen.shape
        ts = gen >= tb
        last = ts[:, -1] if m >= 1 else np.zeros(n, bool)
        penult = ts[:, -2] if m >= 2 else np.ones(n, bool)
        scores[last & penult, tb:] = _NEG_INF               # a pair: text next
        single = last & ~penult
        scores[single, :self.eos] = _NEG_INF                # one timestamp: no text
        has = ts.any(axis=1)
        if has.any():
            idx = m - 1 - np.argmax(ts[:, ::-1], axis=1)
            val = gen[np.arange(n), idx]
            floor = np.where(single, val, val + 1)
            for i in np.flatnonzero(has):          # timestamps below the floor, row by row
                scores[i, tb:floor[i]] = _NEG_INF
        if seqs.shape[1] == self.begin_index:
            scores[:, :tb] = _NEG_INF
            if self.max_initial is not None:
                scores[:, tb + self.max_initial + 1:] = _NEG_INF
        if self.from_logprob:
            lp = log_softmax(np.asarray(scores, np.float32))
            ts_lp = _logsumexp(lp[:, tb:])
            text_max = lp[:, :tb].max(axis=1)
            scores[ts_lp > text_max, :tb] = _NEG_INF
        return scores


def strip_generated(seq, pad, eos):
    """A row of generated tokens (the prefix cut off) as transformers keeps it: the padding
    after EOS removed (every pad token is counted, as there; EOS kept when pad == EOS), then
    the EOS."""
    if seq.size and seq[-1] == pad:
        n = int(np.count_nonzero(seq == pad)) - (1 if pad == eos else 0)
        if n:
            seq = seq[:-n]
    if seq.size and seq[-1] == eos:
        seq = seq[:-1]
    return seq


def split_segments(seq, timestamp_begin, window_frames, input_stride=2):
    """One window's generated tokens -> (the tokens kept, how many frames the seek moves).

    A decoding with a pair of consecutive timestamps is cut after its last pair unless it ends
    in a single timestamp (no speech after it); the seek then moves to that last pair's
    timestamp (its position x input_stride frames), or past the window when the decoding ended
    with a single timestamp or holds no pair (transformers' ``_retrieve_segment``)."""
    ts = seq >= timestamp_begin
    single_end = ts.size >= 2 and not ts[-2] and ts[-1]
    pairs = np.flatnonzero(ts[:-1] & ts[1:]) + 1
    if pairs.size == 0 or single_end:
        return seq, window_frames
    end = pairs[-1] + 1
    return seq[:end], int(seq[pairs[-1] - 1] - timestamp_begin) * input_stride


def window_segments(seq, timestamp_begin, window_frames, input_stride=2, *, tail=False):
    """One window's generated tokens -> ([(tokens, start, end)], frames the seek moves): the
    segments of what :func:`split_segments` keeps, cut after each pair of consecutive
    timestamps, start and end in timestamp steps (0.02 s) from the window's start
    (transformers' ``_retrieve_segment``). A decoding without a pair is one segment to its last
    timestamp (or, ending in ``<|0.00|>`` or without one, to the window's end).

    tail: the tokens after the last pair (which the seek loop decodes again from there) are a
    segment of their own, from the last pair to the window's end (a window decoded once: the
    batched long form)."""
    kept, moved = split_segments(seq, timestamp_begin, window_frames, input_stride)
    tb = timestamp_begin
    ts = kept >= tb
    cuts = list(np.flatnonzero(ts[:-1] & ts[1:]) + 1)
    if cuts:
        closed = bool(ts[-2] and ts[-1])   # kept ends in its last pair (else: one timestamp)
        if closed:
            cuts[-1] += 1
        else:
            cuts.append(kept.size)
        out, last = [], 0
        for i, c in enumerate(cuts):
            piece = kept[last:c]
            end_idx = -2 if closed and i == len(cuts) - 1 else -1
            out.append((piece, int(piece[0]) - tb, int(piece[end_idx]) - tb))
            last = c
    else:
        idx = np.flatnonzero(ts)
        # the window's end in timestamp steps, in transformers' float arithmetic
        end = int(window_frames * 0.01 / (input_stride * 0.01))
        if idx.size and kept[idx[-1]] != tb:
            end = int(kept[idx[-1]]) - tb
        out = [(kept, 0, end)]
    if tail and moved < window_frames:
        rest = seq[sum(p[0].size for p in out):]
        if rest.size:
            out.append((rest, int(out[-1][2]) if out else 0, window_frames // input_stride))
    return out, moved


def fallback_streams(seed, seek, index, best_of):
    """The NumPy generators of the `best_of` draws of the sequential long form's window at mel
    frame `seek` decoded at its `index`-th temperature: the children of
    ``SeedSequence([seed, seek, index])`` (the same draws for any thread count)."""
    ss = np.random.SeedSequence([seed, int(seek), index])
    return [np.random.default_rng(x) for x in ss.spawn(best_of)]


def window_stream(seed, key):
    """The NumPy generator of a batched window's one draw: ``SeedSequence([seed, key])``, key
    the window's first sample in its file (the same draw whatever else is in the batch)."""
    return np.random.default_rng(np.random.SeedSequence([seed, int(key)]))


class WindowResult(NamedTuple):
    """One window's decoding (:meth:`WindowDecoder.decode`)."""
    tokens: np.ndarray          # the generated tokens: the prefix, EOS and padding left out
    sum_logprob: float          # None unless scores were asked for or it was sampled
    no_speech_prob: float       # None unless scores were asked for


class WindowDecoder:
    """The decoding of Whisper windows (30 s of features, encoded), the one behind
    ``WhisperModel.generate`` and ``fastattn.audio.Transcriber``: a window's settings
    (:meth:`settings`, :meth:`max_length`), its logits processors (:meth:`processors`), and
    beam search, greedy or sampling with the scores the temperature fallback reads
    (:meth:`decode`).

    Parameters
    ----------
    model : a Whisper on the decoder interface (:class:`~.search.Decoder`)
        WhisperModel: its ``generation_config`` holds Whisper's fields and its ``start``
        takes ``encoder_output``.
    settings : dict, optional
        generate's keywords (:attr:`SETTINGS`, transformers' names); the checkpoint's where
        not given.
    timestamps : bool
        Decode with the timestamp rules (:class:`TimestampRules`).
    """

    SETTINGS = ("max_new_tokens", "num_beams", "length_penalty", "early_stopping",
                "suppress_tokens", "begin_suppress_tokens", "repetition_penalty",
                "no_repeat_ngram_size", "beam_rule", "max_initial_timestamp_index")

    def __init__(self, model, settings=None, *, timestamps=True):
        self.model = model
        self.user = dict(settings or {})
        for key in self.user:
            if key not in self.SETTINGS:
                raise TypeError(f"generate() got an unexpected keyword argument {key!r}")
        self.timestamps = bool(timestamps)

    def settings(self, prefix_len):
        """The generation settings (transformers' precedence: the given settings, the
        checkpoint's, the defaults) for a decoder prefix of `prefix_len` tokens; max_length
        before the first window's growth (:meth:`max_length`); sampling never (Whisper samples
        only in its temperature fallback, :meth:`decode`)."""
        model = self.model
        gen = model.generation_config
        user = self.user
        mnt = user.get("max_new_tokens")
        if mnt is None:
            mnt = gen.get("max_new_tokens")
        p = resolve_settings(model, dict(user, max_new_tokens=1), 1)
        p["do_sample"], p["max_new_tokens"] = False, mnt
        p["beam_rule"] = check_beam_rule(user.get("beam_rule"))
        if gen.get("min_new_tokens") is not None:     # counted after the whole prefix
            p["min_length"] = gen["min_new_tokens"] + prefix_len
        limit = model.max_decoder_positions
        if mnt is not None:
            if isinstance(mnt, bool) or not isinstance(mnt, (int, np.integer)) or mnt < 1:
                raise ValueError(f"max_new_tokens must be an integer >= 1, got {mnt!r}")
            if mnt + prefix_len > limit:
                raise ValueError(f"the decoder prefix ({prefix_len} tokens: prompt and "
                                 f"<|startoftranscript|>...) plus max_new_tokens={mnt} exceed "
                                 f"max_target_positions={limit}")
            p["max_length"] = int(mnt) + prefix_len
        else:
            if prefix_len >= limit:
                raise ValueError(f"the decoder prefix ({prefix_len} tokens: prompt and "
                                 f"<|startoftranscript|>...) leaves no room below "
                                 f"max_target_positions={limit}")
            p["max_length"] = gen.get("max_length", 20)
        return p

    def max_length(self, p, prefix_len, window=1):
        """The max_length of the `window`-th window (1: the first) of a clip decoded after
        `prefix_len` tokens: without max_new_tokens, transformers' per-window limit, the
        settings' ``max_length`` grown by min(max_target_positions // 2 - 1, prefix_len) each
        window, at most max_target_positions; else the settings'. A ValueError where it
        leaves no room after the prefix."""
        limit = self.model.max_decoder_positions
        n = p["max_length"]
        if p["max_new_tokens"] is None:
            n = min(n + window * min(limit // 2 - 1, prefix_len), limit)
        if n <= prefix_len:
            raise ValueError(f"max_length={n} leaves no room after the decoder prefix of "
                             f"{prefix_len} tokens; pass max_new_tokens")
        return n

    def processors(self, p, prefix_len, begin=None):
        """transformers' generic processors, then Whisper's: begin_suppress_tokens, then
        suppress_tokens, then the timestamp rules. `begin`: where the window's own tokens
        begin (default `prefix_len`); earlier, when the prefix ends with forced tokens (a
        transcript prefix, faster-whisper's ``prefix``). transformers' rule reads those tokens
        as generated; ``beam_rule="ctranslate2"`` starts the begin suppression and the timestamp
        rules after them and the repetition rules at them, as CTranslate2 does."""
        begin = prefix_len if begin is None else begin
        ct2 = p.get("beam_rule") == "ctranslate2"
        # CTranslate2 after a forced transcript prefix: the begin suppression and the timestamp
        # rules start after it (the first free step), the repetition rules at its start
        rules_at = prefix_len if ct2 else begin
        gen, V = self.model.generation_config, self.model.vocab_size
        sup = p["suppress_tokens"]
        begin_ids = self.user.get("begin_suppress_tokens", gen.get("begin_suppress_tokens"))
        procs = build_processors(dict(p, suppress_tokens=None), V, p["eos_token_id"],
                                 2 if p["num_beams"] > 1 else 1)
        if ct2:
            # CTranslate2 penalises repetitions of the transcript only, not of its prompt
            for proc in procs:
                if isinstance(proc, (RepetitionPenalty, NoRepeatNGram)):
                    proc.start = begin
        if begin_ids is not None:
            procs.append(SuppressAtBegin(begin_ids, rules_at, V))
        if sup is not None:
            procs.append(SuppressTokens(sup, V))
        if self.timestamps:
            procs.append(TimestampRules(
                gen["no_timestamps_token_id"], p["eos_token_id"], rules_at,
                self.user.get("max_initial_timestamp_index",
                              gen.get("max_initial_timestamp_index")),
                gen.get("_detect_timestamp_from_logprob", True) is not False,
                after_prefix=ct2 and begin < prefix_len))
        return procs

    def window(self, prefix_len, begin=None):
        """(settings, processors) of a window decoded on its own after `prefix_len` tokens
        (the long form's: max_length grown once); `begin` as :meth:`processors`'."""
        p = self.settings(prefix_len)
        p["max_length"] = self.max_length(p, prefix_len)
        return p, self.processors(p, prefix_len, begin)

    def decode(self, encoder_output, prefix, p, procs, *, temperature=0.0, streams=None,
               scores=False, n_threads=None, begin=None):
        """Decode n windows -> [:class:`WindowResult`], one per window.

        encoder_output : array (n, max_source_positions, d_model)
        prefix : int array (n, P), or (P,) for every window
            The decoder prefix: a ``<|startofprev|>`` prompt, then <|startoftranscript|> ...
            (at the same position in every row).
        p, procs : the window's settings and processors (:meth:`window`).
        temperature : float
            0: beam search (``p["num_beams"]`` > 1) or greedy. Over 0: sampling at that
            temperature, ``streams[i]`` holding window i's generators, one per draw (as many
            for every window). A window's draws are decoded together over one encoder output
            and the best is kept: the highest sum_logprob per token (EOS counted), the first
            of equals.
        scores : bool
            Also each window's ``sum_logprob`` and ``no_speech_prob``: the chosen tokens'
            log-probabilities summed, EOS included (beam search: renormalised after the
            processors, the beam score x length ** length_penalty less the mass the processors
            left, openai-whisper's and CTranslate2's ``sum_logprobs``; greedy: under the
            processed scores, rounded to float32; sampling: under the processed scores before
            the temperature, float64), and the probability of ``<|nospeech|>`` (the token
            before ``<|notimestamps|>``) under the raw logits at <|startoftranscript|>.
        begin : int, optional
            Where each window's tokens begin (default: after the prefix). Smaller when the
            prefix ends with forced tokens (a transcript prefix: ``<|0.00|>`` and text): they
            are returned as the window's first tokens (CTranslate2's and faster-whisper's
            result) and the processors were made with the same `begin`; the scores count only
            the tokens decoded after them.
        """
        model = self.model
        n = encoder_output.shape[0]
        rows = np.asarray(prefix, np.int64)
        if rows.ndim == 1:
            rows = np.repeat(rows[None], n, axis=0)
        P = rows.shape[1]
        B = P if begin is None else int(begin)
        if not 0 < B <= P:
            raise ValueError(f"begin={begin!r} must lie in 1..{P} (the prefix's length)")
        pad, eos = p["pad_token_id"], p["eos_token_id"]
        sampled = temperature > 0.0
        K = len(streams[0]) if sampled else p["num_beams"]      # rows per window
        seen = {}
        on_logits = None
        if scores:
            gen = model.generation_config
            sot_at = int(np.flatnonzero(rows[0] == gen["decoder_start_token_id"])[0])

            def on_logits(t, logits):
                if t == sot_at:
                    seen["sot"] = np.asarray(logits[::K], np.float64)
            on_logits.positions = (sot_at,)     # the prefix's other logits are not needed

        state = model.start(encoder_output=encoder_output, num_beams=K,
                            max_length=p["max_length"], n_threads=n_threads)
        sums = norm = None
        if sampled:
            seqs, sums = greedy_search(
                state, procs, p, n * K, prefix=np.repeat(rows, K, axis=0),
                streams=[g for s in streams for g in s], sources=np.repeat(np.arange(n), K),
                return_scores=True, on_logits=on_logits, draw_temperature=temperature,
                score_dtype=np.float64)
        elif K > 1 and p.get("beam_rule") == "ctranslate2":
            # CTranslate2's Whisper: neither the prompt nor EOS in the length
            got = beam_search_ct2(state, procs, p, n, K, n_threads, prefix=rows,
                                  return_scores=scores, on_logits=on_logits,
                                  eos_in_length=False)
            seqs, sums = got if scores else (got, None)
        elif K > 1:
            if scores:
                seqs, sums, norm = beam_search(state, procs, p, n, K, None, n_threads,
                                               prefix=rows, return_scores=True,
                                               on_logits=on_logits, return_norm=True)
            else:
                seqs = beam_search(state, procs, p, n, K, None, n_threads, prefix=rows)
        elif scores:
            seqs, sums = greedy_search(state, procs, p, n, prefix=rows, return_scores=True,
                                       on_logits=on_logits)
        else:
            seqs = greedy_search(state, procs, p, n, prefix=rows)
        no_speech = [None] * n
        if scores:
            lg = seen["sot"]
            lg = lg - lg.max(axis=1, keepdims=True)
            probs = np.exp(lg) / np.exp(lg).sum(axis=1, keepdims=True)
            tok = model.generation_config["no_timestamps_token_id"] - 1
            no_speech = [float(probs[i, tok]) for i in range(n)]
        out = []
        for i in range(n):
            total = None
            if sampled:
                best, best_rank = None, -np.inf
                for r in range(i * K, (i + 1) * K):
                    g = strip_generated(seqs[r, B:], pad, eos)
                    rank = float(sums[r]) / max(g.size, 1)
                    if rank > best_rank:
                        best, best_rank, total = g, rank, float(sums[r])
                tokens = best
            else:
                tokens = strip_generated(seqs[i, B:], pad, eos)
                if scores:
                    total = float(sums[i])
                if K > 1 and not sampled and p.get("beam_rule") == "ctranslate2" and scores:
                    # CTranslate2's score: the renormalised sum / (tokens, EOS not counted)
                    total = total * (tokens.size - (P - B)) ** p["length_penalty"]
                if norm is not None:      # the beam score is sum / length ** length_penalty
                    end = B + tokens.size
                    length = tokens.size + (end < seqs.shape[1] and seqs[i, end] == eos)
                    total = total * length ** p["length_penalty"] - float(norm[i])
            out.append(WindowResult(tokens, total, no_speech[i]))
        return out
