"""The long form behind :class:`~fastattn.audio.Transcriber`: audio of any length, window after
window, and the segments it yields.

The semantics are openai-whisper's ``transcribe`` as faster-whisper and transformers'
sequential long-form ``generate`` run it, re-derived here:

- features of the whole file (:func:`~fastattn.audio.log_mel_spectrogram`, no padding: the
  clip's own frames, normalised over the whole clip as transformers' extractor does with
  ``truncation=False``); a seek pointer walks them: the window ``features[:, seek:seek + 3000]``
  (zero-padded at the end) is encoded and decoded with the timestamp rules;
- the decoding is cut into segments at each pair of consecutive timestamp tokens; a window
  that ends in a single timestamp (no speech after it) or holds no pair moves the seek by the
  whole window, otherwise to the last pair's timestamp, and the unfinished tail is decoded
  again from there (transformers' ``_retrieve_segment``:
  :func:`fastattn.generation.whisper.window_segments`); with ``seek_to_pause`` (on with the
  checks below) a last timestamp that fell just inside the next speech moves back to the pause
  before it (:meth:`TranscriptionStream._pause_seek`), and a window that starts inside
  speech the last segment may have written leaves out the words that say it again
  (:meth:`TranscriptionStream._not_said_again`);
- the temperature fallback: each window is decoded at ``temperature[0]`` (0: beam search or
  greedy); when the result is too repetitive (gzip compression ratio over
  ``compression_ratio_threshold``, and a loop, :func:`loops`: fastattn's rule, since speech
  said again compresses as well) or too unlikely (average log-probability under
  ``log_prob_threshold``), it is decoded again by sampling (``best_of`` draws) at the next
  temperature; a window whose ``<|nospeech|>`` probability exceeds ``no_speech_threshold``
  while its average log-probability is under ``log_prob_threshold`` is silence and skipped;
- ``condition_on_previous_text``: the tokens of the segments so far (at most
  max_target_positions // 2 - 1 of them, after ``<|startofprev|>``) prompt the next window,
  until a window needs a temperature over ``prompt_reset_on_temperature``;
  ``initial_prompt`` starts that history.

Each window is decoded by :class:`fastattn.generation.whisper.WindowDecoder` (what
``WhisperModel.generate`` decodes with). With ``temperature=0.0`` and
``condition_on_previous_text=False`` (and the thresholds None, transformers' defaults) the
segments are transformers' ``generate(..., return_segments=True)`` token for token. Sampling
draws from NumPy generators seeded by ``seed``, the window's seek and the temperature's index
(:func:`~fastattn.generation.whisper.fallback_streams`): the result is the same for any thread
count.
"""
import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ..generation.whisper import (WindowDecoder, WindowResult, fallback_streams,
                                  language_token, window_segments, window_stream)
from ..text.tokenizers.json_tokenizer import JsonTokenizer
from ._window_rules import (_words, compression_ratio, first_repeat, loops, overlap, repeats,
                            skip_hallucinations)
from .alignment import add_word_timestamps
from .features import HOP_LENGTH, SAMPLE_RATE, log_mel_spectrogram
from .vad import TimeMap, collect_chunks, speech_timestamps

_INPUT_STRIDE = 2                       # mel frames per encoder position
_FRAME_SECONDS = HOP_LENGTH / SAMPLE_RATE                      # 0.01
_TIME_PRECISION = _INPUT_STRIDE * _FRAME_SECONDS              # 0.02: one timestamp step
# seek_to_pause (mel frames of 10 ms): a pause is 0.2 s under the loudness level; the speech a
# late timestamp fell in began at most 0.5 s before it, and 0.5 s or more after the last
# segment's start
_PAUSE_FRAMES, _LATE_FRAMES, _SEG_GUARD = 20, 50, 50
_MIN_RANGE = 0.25          # normalised log-mel: 1 in log10 (10 dB) between the percentiles


@dataclass(frozen=True)
class Segment:
    """A stretch of speech between two timestamps (seconds from the start of the audio)."""
    id: int
    seek: int                   # the window's first mel frame
    start: float
    end: float
    text: str
    tokens: list                # its tokens, timestamps included
    temperature: float          # the temperature its window was decoded at
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: list = None          # [Word] with word_timestamps=True, else None


@dataclass(frozen=True)
class Transcription:
    """What :meth:`Transcriber.transcribe` returns."""
    text: str
    segments: list
    language: str               # a code ('en'; 'en' for an English-only model, as faster-whisper)
    language_probability: float
    duration: float             # seconds of audio
    all_language_probs: list = field(default=None, repr=False)

    def to_dict(self):
        d = dataclasses.asdict(self)
        return d


class TranscriptionStream:
    """An iterator of :class:`Segment` (see :meth:`Transcriber.stream`)."""

    def __init__(self, tr, samples, opts):
        self._tr, self._opts = tr, opts
        self.duration = samples.size / SAMPLE_RATE
        self.duration_after_vad = self.duration
        self.language, self.language_probability, self.all_language_probs = None, 1.0, None
        model = tr.model
        self._map = None
        self._chunks = None
        if opts.vad_filter:
            stretches = speech_timestamps(samples, opts.vad, model=opts.vad_model)
            self.duration_after_vad = sum(b - a for a, b in stretches) / SAMPLE_RATE
            if opts.batch_size is not None:
                self._chunks = collect_chunks(stretches, tr.n_frames * HOP_LENGTH)
            else:
                self._map = TimeMap(stretches)
                samples = np.concatenate([samples[a:b] for a, b in stretches] or
                                         [np.zeros(0, np.float32)])
        first = None
        if self._chunks is not None:
            self._samples = samples                     # a window's rest is decoded again
            self._chunk_feats = [self._chunk_features(samples, c) for c in self._chunks]
            self._f = self._chunk_feats[0] if self._chunks else None
        elif samples.size:
            self._f = log_mel_spectrogram(samples, tr.n_mels, padding="longest",
                                          truncation=False)
        else:
            self._f = None                              # no speech at all
        if opts.language is None and tr.is_multilingual and self._f is not None:
            (self.language, self.language_probability, self.all_language_probs,
             first) = self._detect()
        elif opts.language is not None:
            tok = language_token(opts.language, model.generation_config["lang_to_id"])
            inv = {v: k for k, v in model.generation_config["lang_to_id"].items()}
            self.language = inv[tok][2:-2]
        elif not tr.is_multilingual:
            self.language = "en"                        # English-only (faster-whisper says so)
        self._first = first
        self._loud = None
        self._sid = 0
        if self._f is None:
            self._it = iter(())
        elif self._chunks is not None:
            self._it = self._batched()
        else:
            self._it = self._segments()

    def _chunk_features(self, samples, chunk, offset=0):
        audio = np.concatenate([samples[a:b] for a, b in chunk])[offset:]
        seconds, rest = divmod(self._tr.n_frames * HOP_LENGTH, SAMPLE_RATE)
        if rest:
            raise ValueError(f"batch_size: windows of {self._tr.n_frames} frames are not whole "
                             "seconds")
        return log_mel_spectrogram(audio, self._tr.n_mels, padding="max_length",
                                   chunk_length=seconds)

    def __iter__(self):
        return self

    def result(self, segments):
        """The :class:`Transcription` of these segments (those this stream yielded)."""
        return Transcription(text="".join(s.text for s in segments), segments=list(segments),
                             language=self.language,
                             language_probability=self.language_probability,
                             duration=self.duration, all_language_probs=self.all_language_probs)

    def __next__(self):
        return next(self._it)

    # -- one window --------------------------------------------------------------------------

    def _detect(self):
        """faster-whisper's language detection -> (code, probability, [(code, probability)]
        of the last window looked at, the first window's encoder output): up to
        ``language_detection_segments`` windows from the start (sequential: 30 s apart;
        batched: the first speech windows), the first whose top language is more likely than
        ``language_detection_threshold`` deciding, else the language on top most often (the
        first of equals), with its highest probability."""
        tr, opts = self._tr, self._opts
        votes, first = {}, None
        for i in range(opts.language_detection_segments):
            if self._chunks is not None:
                if i >= len(self._chunk_feats):
                    break
                window = tr._window(self._chunk_feats[i], 0)
            else:
                if i * tr.n_frames >= self._f.shape[1]:
                    break
                window = tr._window(self._f, i * tr.n_frames)
            mem = tr._encode(window)
            first = mem if first is None else first
            probs = tr._language_probs(mem)
            code, p = probs[0]
            if p > opts.language_detection_threshold:
                return code, p, probs, first
            votes.setdefault(code, []).append(p)
        code = max(votes, key=lambda c: len(votes[c]))
        return code, max(votes[code]), probs, first

    def _sot_sequence(self, language=None):
        """<|startoftranscript|>, the language (this window's under ``multilingual``, else the
        stream's) and task, <|notimestamps|> without timestamps."""
        tr, opts = self._tr, self._opts
        gen = tr.model.generation_config
        seq = [tr.sot]
        if tr.is_multilingual:
            seq.append(gen["lang_to_id"][f"<|{language or self.language}|>"])
            seq.append(gen["task_to_id"][opts.task or "transcribe"])
        elif opts.task == "translate":
            raise ValueError("task='translate' needs a multilingual Whisper")
        if opts.without_timestamps:
            seq.append(tr.no_timestamps)
        return seq

    def _decoder(self, prefix_len, forced=0):
        """(WindowDecoder, settings, processors) of a window after `prefix_len` tokens, the
        last `forced` of them the transcript's prefix: the options as generate's settings."""
        opts = self._opts
        model = self._tr.model
        user = {"num_beams": opts.num_beams, "length_penalty": opts.length_penalty}
        if opts.max_new_tokens is not None:
            # at most what the decoder's positions leave after this window's prompt
            user["max_new_tokens"] = max(1, min(opts.max_new_tokens,
                                                model.max_decoder_positions - prefix_len))
        if opts.suppress_tokens is not None:
            user["suppress_tokens"] = list(opts.suppress_tokens)
        if not opts.suppress_blank:
            user["begin_suppress_tokens"] = []
        if opts.repetition_penalty != 1.0:
            user["repetition_penalty"] = opts.repetition_penalty
        if opts.no_repeat_ngram_size:
            user["no_repeat_ngram_size"] = opts.no_repeat_ngram_size
        if opts.max_initial_timestamp is not None:
            user["max_initial_timestamp_index"] = int(round(opts.max_initial_timestamp /
                                                            _TIME_PRECISION))
        if opts.beam_rule != "transformers":
            user["beam_rule"] = opts.beam_rule
        decoder = WindowDecoder(model, user, timestamps=not opts.without_timestamps)
        return (decoder,) + decoder.window(prefix_len, prefix_len - forced)

    def _decode(self, mem, prefix, temperature, t_index, seek, forced=0):
        """One decoding of the window at `seek` (encoded: `mem`) at its `t_index`-th
        temperature -> a WindowResult (tokens without EOS, sum of log-probs, no-speech
        probability). forced: how many of the prefix's last tokens are the transcript's
        prefix (returned as the window's first tokens)."""
        opts = self._opts
        decoder, p, procs = self._decoder(len(prefix), forced)
        streams = None
        if temperature > 0.0:
            streams = [fallback_streams(opts.seed, seek, t_index, opts.best_of)]
        return decoder.decode(mem, prefix, p, procs, temperature=temperature, streams=streams,
                              scores=True, n_threads=self._tr.n_threads,
                              begin=len(prefix) - forced)[0]

    def _text(self, tokens):
        return self._tr.tokenizer.decode([int(t) for t in tokens if t < self._tr.eot])

    def _needs_fallback(self, res, seconds, first=True):
        """Whether a result (tokens, temperature, avg, cr, no_speech) fails the fallback checks
        (a loop over `seconds` of speech, or too unlikely, and not silence). A loop is too
        repetitive (compression ratio over the threshold) and :func:`loops`: speech that is
        said again compresses as well, but keeps its pace and does not stutter (fastattn's
        rule; openai-whisper's and faster-whisper's fallback takes any repetitive result for a
        failure, and can keep a sampled draw over the words that were said). Silence is told
        by a decoding at temperature[0] (`first`): a sampled one that is unlikely is not
        silence."""
        opts = self._opts
        tokens, _, avg, cr, no_speech = res
        fallback = self._loops(self._text(tokens), cr, seconds)
        if opts.log_prob_threshold is not None and avg < opts.log_prob_threshold:
            fallback = True
        if first and opts.no_speech_threshold is not None and \
                no_speech > opts.no_speech_threshold and \
                opts.log_prob_threshold is not None and avg < opts.log_prob_threshold:
            fallback = False                  # silence: no point in decoding it again
        return fallback

    def _best(self, results):
        """Of results that all failed: the least repetitive of those that are likely (average
        log-probability at least the threshold; fastattn's rule: repeated speech compresses
        as well as a loop, and a draw that is unlikely is not what was said), else the most
        likely one that is not repetitive, else the most likely one (faster-whisper's
        choice). The seek loop cuts a repetitive result at its first repeated segment."""
        opts = self._opts
        if opts.log_prob_threshold is not None:
            likely = [r for r in results if r[2] >= opts.log_prob_threshold]
            if likely:
                return min(likely, key=lambda r: r[3])
        ok = [r for r in results if opts.compression_ratio_threshold is None or
              r[3] <= opts.compression_ratio_threshold] or results
        return max(ok, key=lambda r: r[2])

    def _loops(self, text, cr, seconds):
        """Whether a decoding (`text`, compression ratio `cr`) over `seconds` of speech loops:
        too repetitive (cr over the threshold) and :func:`loops`."""
        limit = self._opts.compression_ratio_threshold
        return limit is not None and cr > limit and loops(text, seconds)

    def _attempt(self, mem, prefix, t, i, seek, forced=0):
        tokens, total, no_speech = self._decode(mem, prefix, t, i, seek, forced)
        avg = total / (tokens.size + 1)
        return tokens, t, avg, compression_ratio(self._text(tokens).strip()), no_speech

    def _with_fallback(self, mem, prefix, seek, seconds, plain=None, forced=0):
        """The window's result (tokens, temperature, avg, cr, no_speech), whether it was
        decoded without the previous text and whether it failed every check. seconds: the
        window's speech (what :func:`loops` measures a result's pace by).

        plain: the prefix without the previous text, given when `prefix` holds it. A window
        whose first-temperature decoding fails the checks (or passes them as speech said
        again, over the compression threshold) while conditioned is decoded again without the
        previous text at that temperature before any other one (repeated text in
        the prompt drives Whisper into loops and dropped speech; fastattn's rule, not
        openai-whisper's); the first result that passes is kept. With one temperature there is
        no fallback: the result is the one decoding asked for, as openai-whisper's. forced:
        as :meth:`_decode`'s (both prefixes end with the same forced tokens)."""
        temps = self._opts.temperatures
        if len(temps) == 1:
            return self._attempt(mem, prefix, temps[0], 0, seek, forced), False, False
        limit = self._opts.compression_ratio_threshold
        results = []
        for i, t in enumerate(temps):
            res = self._attempt(mem, prefix, t, i, seek, forced)
            results.append((res, False))
            failed = self._needs_fallback(res, seconds, first=i == 0)
            # a repetitive result that does not loop (speech said again) is kept, unless the
            # previous text prompted it: repeated text in the prompt also makes Whisper say a
            # passage more often than it was said, so the unprompted decoding is asked first
            said_again = not failed and limit is not None and res[3] > limit
            if not failed and not (said_again and i == 0 and plain is not None):
                return res, False, False
            if i == 0 and plain is not None:
                unprompted = self._attempt(mem, plain, t, i, seek, forced)
                results.append((unprompted, True))
                if not self._needs_fallback(unprompted, seconds):
                    return unprompted, True, False
                if said_again:
                    return res, False, False
        best = self._best([r for r, _ in results])
        return best, next(u for r, u in results if r is best), True

    # -- batched windows ---------------------------------------------------------------------

    def _decode_batch(self, mem, keys, prefix):
        """Windows (len(keys) of them, encoded: mem (n, S, d)) decoded at once at
        temperature[0] with the same prefix -> [WindowResult]. keys: each window's first sample
        in its file (a sampled window draws from the stream of the seed and its key:
        :func:`~fastattn.generation.whisper.window_stream`, the same whatever else is in the
        batch)."""
        opts = self._opts
        decoder, p, procs = self._decoder(len(prefix))
        temperature = opts.temperatures[0]
        streams = None
        if temperature > 0.0:
            streams = [[window_stream(opts.seed, k)] for k in keys]
        return decoder.decode(mem, prefix, p, procs, temperature=temperature, streams=streams,
                              scores=True, n_threads=self._tr.n_threads)

    def _batch_prefix(self):
        """The prefix every batched window of this stream is decoded with."""
        tr, opts = self._tr, self._opts
        prefix = self._sot_sequence()
        hot = self._hotwords()
        if opts.initial_prompt and tr.sot_prev is not None:
            cut = tr.model.max_decoder_positions // 2 - 1
            # the prompt's text as given (faster-whisper's batched pipeline: no leading space,
            # unlike the sequential history's)
            prefix = [tr.sot_prev] + hot + plain_ids(
                tr.tokenizer, opts.initial_prompt, tr.eot)[-cut:] + prefix
        elif hot:
            prefix = [tr.sot_prev] + hot + prefix
        return prefix

    def _hotwords(self):
        """The hotwords' tokens (faster-whisper's: a leading space, at most
        max_target_positions // 2 - 1 of them), [] without hotwords."""
        tr, text = self._tr, self._opts.hotwords
        if not text:
            return []
        return plain_ids(tr.tokenizer, " " + text, tr.eot)[:tr.model.max_decoder_positions // 2 - 1]

    def _forced(self):
        """The first window's forced tokens for the transcript's prefix: ``<|0.00|>`` (with
        timestamps), then the text's tokens (faster-whisper's: a leading space, at most
        max_target_positions // 2 - 1)."""
        tr, opts = self._tr, self._opts
        ids = plain_ids(tr.tokenizer, " " + opts.prefix, tr.eot)
        ids = ids[:tr.model.max_decoder_positions // 2 - 1]
        return ([] if opts.without_timestamps else [tr.timestamp_begin]) + ids

    def _window_features(self, i, offset):
        """The features of batched window i from `offset` samples into its speech."""
        if offset == 0:
            return self._chunk_feats[i]
        return self._chunk_features(self._samples, self._chunks[i], offset)

    def _batched(self):
        prefix = self._batch_prefix()
        N = self._opts.batch_size
        self._first = None
        for b0 in range(0, len(self._chunks), N):
            idx = range(b0, min(b0 + N, len(self._chunks)))
            for fields in decode_windows(self._tr, [(self, i) for i in idx], prefix, N):
                yield from self._numbered(fields)

    def _numbered(self, fields):
        for f in fields:
            yield Segment(id=self._sid, **f)
            self._sid += 1

    def _speech_left(self, i, offset):
        """Speech samples in batched window i from `offset` samples into it."""
        return sum(b - a for a, b in self._chunks[i]) - offset

    def _batched_fallback(self, mem, prefix, key, result, i, offset):
        """A batched window's result at temperature[0] -> (the result to keep, its
        temperature). One that loops -- its compression ratio over the threshold and
        :func:`loops` over window i's speech from `offset`: words that were not said; speech
        said again compresses as well but keeps its pace -- is decoded again alone (`mem`: its
        encoding) through the sequential temperature fallback, its draws seeded by the seed
        and the window's `key` (fastattn's rule; faster-whisper's batched pipeline keeps the
        loop): what the window gives does not depend on its batch.
        Any other result is kept, as faster-whisper keeps it."""
        opts = self._opts
        t0 = opts.temperatures[0]
        if len(opts.temperatures) == 1 or opts.compression_ratio_threshold is None:
            return result, t0
        seconds = min(self._speech_left(i, offset), self._tr.n_frames * HOP_LENGTH) / SAMPLE_RATE
        text = self._text(np.asarray(result.tokens)).strip()
        if not self._loops(text, compression_ratio(text), seconds):
            return result, t0
        (tokens, t, avg, _, no_speech), _, _ = self._with_fallback(mem, prefix, key, seconds)
        return WindowResult(tokens, avg * (tokens.size + 1), no_speech), t

    def _chunk_segments(self, i, result, offset, temperature):
        """The segments of batched window i decoded from `offset` samples into its speech ->
        ([Segment fields], the offset to decode again from or None): a decoding that ends at
        a timestamp more than TAIL_MIN_S before the window's speech ends has the rest decoded
        again (what the sequential long form's seek does; without it those words are lost)."""
        tr, opts = self._tr, self._opts
        tb = tr.timestamp_begin
        chunk = self._chunks[i]
        tokens, total, no_speech = result
        avg = total / (tokens.size + 1)
        if opts.no_speech_threshold is not None and no_speech > opts.no_speech_threshold and \
                not (opts.log_prob_threshold is not None and avg > opts.log_prob_threshold):
            return [], None
        cr = compression_ratio(self._text(tokens).strip())
        left = self._speech_left(i, offset)
        frames = -(-left // HOP_LENGTH)
        window = min(frames, tr.n_frames)
        tmap = TimeMap(chunk)
        rest_text = False
        if opts.without_timestamps:
            pieces, moved = [(tokens, 0, window // _INPUT_STRIDE)], window
        else:         # decoded once: the text after the last pair is a segment of its own
            pieces, moved = window_segments(tokens, tb, window, _INPUT_STRIDE, tail=True)
            rest_text = len(pieces) > len(window_segments(tokens, tb, window,
                                                          _INPUT_STRIDE)[0])
        # times inside the window's speech (the model may name a time in its zero padding)
        speech, base = left / SAMPLE_RATE, offset / SAMPLE_RATE
        out = []
        for toks, start_pos, end_pos in pieces:
            text = self._text(toks)
            start = tmap(base + min(start_pos * _TIME_PRECISION, speech))
            end = tmap(base + min(end_pos * _TIME_PRECISION, speech), is_end=True)
            if start >= end or not text.strip():
                continue
            out.append(dict(seek=int(round(tmap(base) * SAMPLE_RATE)) // HOP_LENGTH,
                            start=start, end=end, text=text, tokens=[int(t) for t in toks],
                            temperature=temperature, avg_logprob=avg,
                            compression_ratio=cr, no_speech_prob=no_speech))
        again = None
        if not opts.without_timestamps and not rest_text and 0 < moved < window and \
                left - moved * HOP_LENGTH >= TAIL_MIN_S * SAMPLE_RATE:
            again = offset + moved * HOP_LENGTH
        return out, again

    # -- the seek loop -----------------------------------------------------------------------

    def _segments(self):
        tr, opts, f = self._tr, self._opts, self._f
        frames = f.shape[1]
        tb = tr.timestamp_begin
        history = []
        if opts.initial_prompt:
            history = plain_ids(tr.tokenizer, " " + opts.initial_prompt.strip(), tr.eot)
        n_initial = len(history)
        reset_since = 0
        seek, sid = 0, 0
        last_speech = 0.0
        said = None         # the last segment kept: its text and its end (mel frame)
        sot_seq = self._sot_sequence()
        hot_ids = self._hotwords()
        cut = tr.model.max_decoder_positions // 2 - 1
        while seek < frames:
            window = min(frames - seek, tr.n_frames)
            if seek == 0 and self._first is not None:
                mem = self._first
            else:
                mem = tr._encode(tr._window(f, seek))
            self._first = None
            language = self.language
            if opts.multilingual:                 # faster-whisper: each window's own language
                language = tr._language_probs(mem)[0][0]
                sot_seq = self._sot_sequence(language)
            prev = history[reset_since:]
            if prev and len(opts.temperatures) > 1 and len(history) > n_initial and \
                    repeats(self._text(prev[-cut:])):
                reset_since, prev = len(history), []     # a prompt that repeats itself
            # faster-whisper's prompt: <|startofprev|>, the hotwords (not beside the prefix),
            # the previous text; the SOT sequence; the transcript's prefix (first window only)
            forced = self._forced() if seek == 0 and opts.prefix else []
            hot = hot_ids if not forced else []
            plain = ([tr.sot_prev] + hot if hot else []) + sot_seq
            prefix = plain
            if prev and tr.sot_prev is not None and (opts.condition_on_previous_text or
                                                     reset_since == 0 and opts.initial_prompt):
                prefix = [tr.sot_prev] + hot + prev[-cut:] + sot_seq
            plain = plain + forced if len(prefix) > len(plain) else None
            prefix = prefix + forced
            (tokens, temp, avg, cr, no_speech), unprompted, failed = self._with_fallback(
                mem, prefix, seek, self._speech_seconds(seek, window), plain, len(forced))
            if opts.no_speech_threshold is not None and no_speech > opts.no_speech_threshold \
                    and not (opts.log_prob_threshold is not None and
                             avg > opts.log_prob_threshold) and not failed:
                seek += window                    # silence (told at temperature[0])
                said = None
                continue
            offset = seek * _TIME_PRECISION / _INPUT_STRIDE       # transformers' arithmetic
            pieces, moved = window_segments(tokens, tb, window, _INPUT_STRIDE)
            if failed and opts.compression_ratio_threshold is not None and \
                    cr > opts.compression_ratio_threshold:
                # a repetitive result that failed every check: kept up to its first segment
                # that says an earlier one again (a loop, or speech said again that the next
                # window decodes afresh), the seek moved to that segment
                k = first_repeat([self._text(t) for t, _, _ in pieces])
                if k and 0 < pieces[k][1] * _INPUT_STRIDE < window:
                    moved = pieces[k][1] * _INPUT_STRIDE
                    pieces = pieces[:k]
            if opts.seek_to_pause and pieces and said is not None:
                pieces[0] = self._not_said_again(pieces[0], said, seek)
            if moved == window and pieces:
                # a result that failed every check does not vouch for the silence after its
                # last timestamp: move on from there, not past the window; nor does one that
                # ended early (seek_to_pause) where TAIL_MIN_S or more of loud frames follow
                # its last timestamp: the seek never jumps over speech (tiny.en ended a window
                # at 491 s after one sentence and skipped 27 s of speech)
                last = pieces[-1][2] * _INPUT_STRIDE
                if 0 < last < window and (failed or opts.seek_to_pause and self._speech_seconds(
                        seek + last, window - last) >= TAIL_MIN_S):
                    moved = last
            segs = [[toks, offset + a * _TIME_PRECISION, offset + b * _TIME_PRECISION, None]
                    for toks, a, b in pieces]
            if opts.word_timestamps and segs:
                previous_end = last_speech
                timed, last_speech = add_word_timestamps(
                    tr.model, [{"tokens": t, "start": a, "end": b} for t, a, b, _ in segs],
                    mem, sot_seq, tr.tokenizer, window, offset, language=language,
                    last_speech_timestamp=last_speech, n_threads=tr.n_threads)
                for seg, (a, b, words) in zip(segs, timed):
                    seg[1], seg[2], seg[3] = a, b, words
                single_end = tokens.size >= 2 and tokens[-2] < tb <= tokens[-1]
                ends = [w.end for _, _, words in timed for w in words]
                if not single_end and ends:
                    shift = round((ends[-1] - offset) * 100)
                    if shift > 0:
                        moved = shift                 # on from the last word (faster-whisper)
                if opts.hallucination_silence_threshold is not None:
                    skip = skip_hallucinations(
                        segs, opts.hallucination_silence_threshold, offset,
                        tr.n_frames * _FRAME_SECONDS, window * _FRAME_SECONDS,
                        frames * _FRAME_SECONDS, previous_end)
                    if skip is not None:
                        keep_n, to = skip
                        if keep_n == 0 and to is not None and to > offset:
                            seek += max(1, round((to - offset) * 100))
                            last_speech = previous_end
                            continue                  # silence, then a hallucination: skip it
                        del segs[keep_n:]
                        moved = frames - seek if to is None else \
                            max(1, round((to - offset) * 100))
                        ends = [w.end for _, _, words in segs for w in words]
                        last_speech = ends[-1] if ends else previous_end
            for toks, start, end, words in segs:
                end_frame = round(end / _FRAME_SECONDS)         # in the clip's frames
                if self._map is not None:                   # speech-only time -> the file's
                    start, end = self._map(start), self._map(end, is_end=True)
                    if words is not None:
                        words = [dataclasses.replace(w, start=self._map(w.start),
                                                     end=self._map(w.end, is_end=True))
                                 for w in words]
                text = self._text(toks)
                # the history that prompts later windows: a segment's tokens, its closing
                # timestamp left out where it ends in two (transformers' conditioning)
                keep = toks[:-1] if toks.size > 2 and toks[-2] >= tb else toks
                history.extend(int(t) for t in keep)
                if start == end or not text.strip():
                    continue
                said = (text, end_frame)
                yield Segment(id=sid, seek=seek, start=start, end=end, text=text,
                              tokens=[int(t) for t in toks], temperature=temp,
                              avg_logprob=avg, compression_ratio=cr,
                              no_speech_prob=no_speech, words=words)
                sid += 1
            if not opts.condition_on_previous_text or unprompted or \
                    (opts.prompt_reset_on_temperature is not None and
                     temp > opts.prompt_reset_on_temperature):
                reset_since = len(history)
            if opts.seek_to_pause and 0 < moved < window and pieces:
                moved = self._pause_seek(seek, moved, seek + pieces[-1][1] * _INPUT_STRIDE)
            seek += moved

    def _not_said_again(self, piece, said, seek):
        """A window's first segment `piece` (tokens, start, end) without the words at its
        start that say again the end of the last segment kept (`said`: its text and end
        frame), where the window starts inside speech that segment may have written: before
        its end, or amid loud frames (``seek_to_pause``'s rule, fastattn's). A segment whose
        text runs past its closing timestamp (its end is where the next sentence starts:
        "... winter. Learning to sail is mostly a matter") or a seek inside a sentence makes
        the next window say those words again (tiny.en: 7 words at 326 s of the 10-minute
        file). :func:`overlap` tells them; the segment keeps its tokens from the first one
        after them, or none of its text when it is all said again."""
        text, end = said
        loud = self._loud_frames()
        inside = loud[max(0, seek - _PAUSE_FRAMES):seek].any() and \
            loud[seek:seek + _PAUSE_FRAMES].any()
        if end <= seek and not inside:
            return piece
        toks, a, b = piece
        new = self._text(toks)
        k = overlap(text, new)
        words = _words(new)
        if not k:
            return piece
        tb = self._tr.timestamp_begin
        lead = 1 if toks.size and toks[0] >= tb else 0
        body = np.flatnonzero(toks[lead:] < tb) + lead     # the text tokens' places
        if not body.size:
            return piece
        stop = body[-1] + 1
        cut = stop if k == len(words) else next(
            (j for j in range(lead + 1, stop) if _words(self._text(toks[j:stop])) == words[k:]),
            None)
        if cut is None:
            return piece
        return np.concatenate([toks[:lead], toks[cut:]]), a, b

    def _loud_frames(self):
        """The clip's loud mel frames (bool, one a frame): a frame's mean log-mel at least 30%
        of the way from the clip's 10th to its 90th percentile (a level of the clip's own,
        whatever its gain and noise); none where those percentiles are less than 10 dB apart
        (silence, a steady tone: nothing to tell speech from pauses by)."""
        if self._loud is None:
            e = self._f.mean(axis=0)
            lo, hi = np.percentile(e, [10, 90])
            self._loud = e >= lo + 0.3 * (hi - lo) if hi - lo >= _MIN_RANGE else \
                np.zeros(e.size, bool)
        return self._loud

    def _speech_seconds(self, seek, window):
        """Seconds of loud frames in the window of `window` frames at `seek`."""
        return float(np.count_nonzero(self._loud_frames()[seek:seek + window])) * _FRAME_SECONDS

    def _pause_seek(self, seek, moved, seg_start):
        """``seek_to_pause``: the frames the seek moves from `seek` when the window's last
        timestamp (``seek + moved``) lies in speech that began at most _LATE_FRAMES before
        it, after a pause of _PAUSE_FRAMES or more: to _PAUSE_FRAMES before that speech, so
        its first word is not cut. Unchanged where the timestamp is in a pause, where the
        speech began earlier, or where the pause is not clear of the last segment's start
        (`seg_start`) by _SEG_GUARD (that speech is the last segment's own).

        Loud frames: :meth:`_loud_frames`."""
        loud = self._loud_frames()
        s = seek + moved
        if s >= loud.size or not loud[s]:
            return moved
        j, quiet = s, 0
        while j > max(seg_start, s - _LATE_FRAMES - _PAUSE_FRAMES):
            j -= 1
            if loud[j]:
                quiet = 0
            else:
                quiet += 1
                if quiet >= _PAUSE_FRAMES:
                    break
        if quiet < _PAUSE_FRAMES:
            return moved
        onset = j + quiet                 # the first loud frame after the pause
        if onset - _PAUSE_FRAMES <= seg_start + _SEG_GUARD:
            return moved
        return onset - _PAUSE_FRAMES - seek


#: speech (seconds) left after a batched window's last timestamp that is decoded again
TAIL_MIN_S = 1.0


def decode_windows(tr, windows, prefix, N):
    """Batched windows [(stream, chunk index)] -> each one's [Segment fields] in order. The
    windows are decoded N at a time; the rest of a window whose decoding stopped at a timestamp
    more than TAIL_MIN_S before its speech ends is decoded again, from that timestamp, as a
    window of its own (in further rounds, N at a time, until none stops early: each round
    starts later in its window, so it ends). Each window's decoding is bitwise what it gives
    in any other batch, so the result is too."""
    out = [[] for _ in windows]
    todo = [(k, s, i, 0) for k, (s, i) in enumerate(windows)]
    while todo:
        again = []
        for b0 in range(0, len(todo), N):
            part = todo[b0:b0 + N]
            mem = tr._encode(np.stack([s._window_features(i, off) for _, s, i, off in part]))
            keys = [s._chunks[i][0][0] + off for _, s, i, off in part]
            results = part[0][1]._decode_batch(mem, keys, prefix)
            for j, ((k, s, i, off), r) in enumerate(zip(part, results)):
                r, temperature = s._batched_fallback(mem[j:j + 1], prefix, keys[j], r, i, off)
                fields, tail = s._chunk_segments(i, r, off, temperature)
                out[k].extend(fields)
                if tail is not None:
                    again.append((k, s, i, tail))
        todo = again
    return out


def decode_across(tr, streams):
    """The batched windows of several streams (files) decoded together, ``batch_size`` at a
    time (windows with the same prefix only) -> each stream's :class:`Transcription`, bitwise
    what it gives alone (a window's decoding does not depend on the rest of its batch)."""
    groups = {}
    for s in streams:
        if s._chunks:
            groups.setdefault(tuple(s._batch_prefix()), []).extend(
                (s, i) for i in range(len(s._chunks)))
    fields = {}
    for prefix, items in groups.items():
        N = streams[0]._opts.batch_size
        for (s, i), f in zip(items, decode_windows(tr, items, list(prefix), N)):
            fields[id(s), i] = f
    out = []
    for s in streams:
        segs = [seg for i in range(len(s._chunks or ()))
                for seg in s._numbered(fields[id(s), i])]
        out.append(s.result(segs))
    return out


def plain_ids(tokenizer, text, eot):
    """`text`'s token ids without special tokens (a folder's tokenizer.json; another tokenizer's
    ids below `eot`, the first special token)."""
    if isinstance(tokenizer, JsonTokenizer):
        return [int(t) for t in tokenizer.encode([text], special_tokens=False)[0]]
    ids = tokenizer.encode([text])
    return [int(t) for t in np.asarray(ids).reshape(-1) if t < eot]
