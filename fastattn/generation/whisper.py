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
"""
import numpy as np

from ..functional import log_softmax
from .processors import _token_list

__all__ = ["SuppressAtBegin", "TimestampRules", "LANGUAGES", "language_token", "prompt_rows",
           "split_segments", "strip_generated"]

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
    """

    needs_history = True
    needs_sources = False

    def __init__(self, no_timestamps_id, eos_id, begin_index, max_initial_index=None,
                 from_logprob=True):
        self.no_timestamps = no_timestamps_id
        self.begin = no_timestamps_id + 1                  # the first timestamp token
        self.eos = eos_id
        self.begin_index = begin_index
        self.max_initial = max_initial_index
        self.from_logprob = from_logprob

    def __call__(self, seqs, scores):
        tb = self.begin
        scores[:, self.no_timestamps] = _NEG_INF
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
