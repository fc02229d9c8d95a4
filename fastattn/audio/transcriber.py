"""Transcriber: audio of any length in, text with timestamps out (a Whisper folder).

:class:`Transcriber` loads the folder and checks the options (:data:`TRANSCRIBE_DEFAULTS`,
faster-whisper's); the long form itself, window after window (openai-whisper's ``transcribe``
as faster-whisper and transformers run it: the seek loop, the temperature fallback, the
conditioning on the previous text, the batched windows), is :mod:`._longform`'s, each window
decoded by :class:`fastattn.generation.whisper.WindowDecoder`.
"""
import inspect
import math
import os
import types

import numpy as np

from .._validation import check_option, check_positive_int
from ..generation.beam_ct2 import check_beam_rule
from ..generation.whisper import language_token
from ._longform import (Segment, Transcription, TranscriptionStream, compression_ratio,
                        decode_across)
from .alignment import Word
from .decode import load_audio
from .features import HOP_LENGTH, SAMPLE_RATE, log_mel_spectrogram
from .vad import VadOptions

__all__ = ["Transcriber", "Transcription", "Segment", "Word", "TranscriptionStream",
           "TRANSCRIBE_DEFAULTS", "compression_ratio"]


def _temperatures(temperature):
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool):
        temps = (float(temperature),)
    else:
        if isinstance(temperature, (str, bytes)) or not all(
                isinstance(t, (int, float, np.floating, np.integer)) and
                not isinstance(t, bool) for t in np.atleast_1d(np.asarray(temperature,
                                                                          dtype=object))):
            raise TypeError(f"temperature must be a number or a sequence of numbers, got "
                            f"{temperature!r}")
        try:
            temps = tuple(float(t) for t in temperature)
        except TypeError:
            raise TypeError(f"temperature must be a number or a sequence of numbers, got "
                            f"{temperature!r}") from None
    if not temps or any(not math.isfinite(t) or t < 0 for t in temps):
        raise ValueError(f"temperature must be one or more finite numbers >= 0, got "
                         f"{temperature!r}")
    return temps


def _threshold(value, name):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"{name} must be a finite number or None, got {value!r}")
    return float(value)


class _Options:
    """The checked options of one transcribe call."""

    def __init__(self, model, *, language, task, num_beams, best_of, patience, length_penalty,
                 temperature, compression_ratio_threshold, log_prob_threshold,
                 no_speech_threshold, condition_on_previous_text, prompt_reset_on_temperature,
                 initial_prompt, word_timestamps, without_timestamps, max_new_tokens,
                 suppress_tokens, suppress_blank, seed, batch_size, vad_filter,
                 vad_parameters, vad_model, hallucination_silence_threshold, beam_rule,
                 prefix, hotwords, max_initial_timestamp, multilingual,
                 language_detection_segments, language_detection_threshold,
                 repetition_penalty, no_repeat_ngram_size, seek_to_pause):
        gen = model.generation_config
        self.beam_rule = check_beam_rule(beam_rule)
        self.task = task
        if task is not None and task not in ("transcribe", "translate"):
            raise ValueError(f"task must be 'transcribe' or 'translate', got {task!r}")
        self.language = language
        if language is not None:
            if not gen.get("lang_to_id"):
                # English-only: "en" is what it transcribes anyway (faster-whisper accepts it)
                if language != "en":
                    raise ValueError(f"language: this is an English-only Whisper (no "
                                     f"lang_to_id in its generation config); got {language!r}, "
                                     f"only 'en' applies")
                self.language = None
            else:
                language_token(language, gen["lang_to_id"])          # checked here
        self.num_beams = check_positive_int(num_beams, "num_beams")
        self.best_of = check_positive_int(best_of, "best_of")
        if patience != 1.0:
            raise ValueError("patience: only 1.0 (transformers' beam search) is supported")
        self.length_penalty = _threshold(length_penalty, "length_penalty")
        self.temperatures = _temperatures(temperature)
        self.compression_ratio_threshold = _threshold(compression_ratio_threshold,
                                                      "compression_ratio_threshold")
        self.log_prob_threshold = _threshold(log_prob_threshold, "log_prob_threshold")
        self.no_speech_threshold = _threshold(no_speech_threshold, "no_speech_threshold")
        # None: with the long-form checks (any threshold set); off in transformers' plain
        # long form (every threshold None), which stays transformers' token for token
        self.seek_to_pause = (self.compression_ratio_threshold is not None or
                              self.log_prob_threshold is not None or
                              self.no_speech_threshold is not None) \
            if seek_to_pause is None else check_option(seek_to_pause, "seek_to_pause")
        self.condition_on_previous_text = check_option(condition_on_previous_text,
                                                       "condition_on_previous_text")
        self.prompt_reset_on_temperature = _threshold(prompt_reset_on_temperature,
                                                      "prompt_reset_on_temperature")
        if initial_prompt is not None and not isinstance(initial_prompt, str):
            raise TypeError(f"initial_prompt must be a string, got {type(initial_prompt).__name__}")
        self.initial_prompt = initial_prompt
        for name, value in (("prefix", prefix), ("hotwords", hotwords)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be a string, got {type(value).__name__}")
        # faster-whisper's: an empty or blank string is no prefix / no hotwords
        self.prefix = prefix.strip() if prefix and prefix.strip() else None
        self.hotwords = hotwords.strip() if hotwords and hotwords.strip() else None
        rp = _threshold(repetition_penalty, "repetition_penalty")
        if rp is None or rp <= 0:
            raise ValueError(f"repetition_penalty must be a number > 0, got "
                             f"{repetition_penalty!r}")
        self.repetition_penalty = rp
        if isinstance(no_repeat_ngram_size, bool) or not isinstance(
                no_repeat_ngram_size, (int, np.integer)) or no_repeat_ngram_size < 0:
            raise ValueError(f"no_repeat_ngram_size must be an integer >= 0, got "
                             f"{no_repeat_ngram_size!r}")
        self.no_repeat_ngram_size = int(no_repeat_ngram_size)
        mit = _threshold(max_initial_timestamp, "max_initial_timestamp")
        if mit is not None and mit < 0:
            raise ValueError(f"max_initial_timestamp must be >= 0 seconds, got "
                             f"{max_initial_timestamp!r}")
        self.max_initial_timestamp = mit
        # on an English-only model there is nothing to detect (faster-whisper warns, then
        # does the same)
        self.multilingual = check_option(multilingual, "multilingual") and \
            bool(gen.get("lang_to_id"))
        self.language_detection_segments = check_positive_int(
            language_detection_segments, "language_detection_segments")
        ldt = _threshold(language_detection_threshold, "language_detection_threshold")
        if ldt is None:
            raise TypeError("language_detection_threshold must be a number")
        self.language_detection_threshold = ldt
        if self.hotwords is not None and gen.get("prev_sot_token_id") is None:
            raise ValueError("hotwords: this Whisper has no <|startofprev|> token "
                             "(prev_sot_token_id) to show them after")
        self.word_timestamps = check_option(word_timestamps, "word_timestamps")
        self.without_timestamps = check_option(without_timestamps, "without_timestamps")
        hst = _threshold(hallucination_silence_threshold, "hallucination_silence_threshold")
        if hst is not None:
            if hst < 0:
                raise ValueError(f"hallucination_silence_threshold must be >= 0 seconds, got "
                                 f"{hallucination_silence_threshold!r}")
            if not self.word_timestamps:
                raise ValueError("hallucination_silence_threshold needs word_timestamps=True "
                                 "(it judges hallucinations by their words)")
        self.hallucination_silence_threshold = hst
        if max_new_tokens is not None:
            max_new_tokens = check_positive_int(max_new_tokens, "max_new_tokens")
        self.max_new_tokens = max_new_tokens
        self.suppress_tokens = suppress_tokens
        self.suppress_blank = check_option(suppress_blank, "suppress_blank")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        self.seed = 0 if seed is None else seed
        if batch_size is not None:
            batch_size = check_positive_int(batch_size, "batch_size")
        self.batch_size = batch_size
        self.vad_filter = check_option(vad_filter, "vad_filter") or batch_size is not None
        if vad_model not in ("silero", "webrtc"):
            raise ValueError(f"vad_model must be 'silero' or 'webrtc', got {vad_model!r}")
        self.vad_model = vad_model
        chunk_s = model.n_frames * HOP_LENGTH / SAMPLE_RATE
        if vad_parameters is None:
            vad_parameters = {}
        if isinstance(vad_parameters, VadOptions):
            self.vad = vad_parameters
        elif isinstance(vad_parameters, dict):
            # batched: stretches of at most one window, split at short pauses (faster-whisper's
            # BatchedInferencePipeline settings); sequential: Silero's / faster-whisper's
            base = dict(max_speech_duration_s=chunk_s, min_silence_duration_ms=160) \
                if batch_size is not None else {}
            try:
                self.vad = VadOptions(**dict(base, **vad_parameters))
            except TypeError as exc:
                raise TypeError(f"vad_parameters: {exc}") from None
        else:
            raise TypeError(f"vad_parameters must be a dict or a VadOptions, got "
                            f"{type(vad_parameters).__name__}")
        if batch_size is not None and self.vad.max_speech_duration_s > chunk_s:
            raise ValueError(f"vad_parameters: max_speech_duration_s must be at most "
                             f"{chunk_s:g} s (one window) with batch_size")


class Transcriber:
    """Speech to text with a Whisper folder: ``Transcriber(folder).transcribe("talk.mp3")``.

    Parameters
    ----------
    model : str or os.PathLike or WhisperModel
        A Hugging Face Whisper folder (openai/whisper-tiny ... large-v3, distil-whisper,
        fine-tunes; ``tokenizer.json`` read for the text) or a fastattn saved folder, or a
        loaded :class:`~fastattn.WhisperModel` (then give ``tokenizer``).
    quantize : None, "int8" or "bfloat16"
    n_threads : int, optional
    tokenizer : a fastattn tokenizer, optional (default: the folder's ``tokenizer.json``)
    """

    def __init__(self, model, *, quantize=None, dtype=None, n_threads=None, tokenizer=None):
        from ..models.speech import WhisperModel
        if isinstance(model, WhisperModel):
            if quantize is not None or dtype is not None:
                raise ValueError("quantize / dtype apply to a folder, not to a loaded model")
            self.model = model
            folder = None
        elif isinstance(model, (str, os.PathLike)):
            folder = os.fspath(model)
            kw = {} if dtype is None else {"dtype": dtype}
            self.model = WhisperModel.from_pretrained(folder, quantize=quantize, **kw)
        else:
            raise TypeError(f"model must be a folder path or a WhisperModel, got "
                            f"{type(model).__name__}")
        if tokenizer is None:
            if folder is None:
                raise ValueError("tokenizer: give the tokenizer of a loaded WhisperModel")
            tokenizer = _whisper_tokenizer(folder)
        self.tokenizer = tokenizer
        if n_threads is not None:
            n_threads = check_positive_int(n_threads, "n_threads")
        self.n_threads = n_threads
        gen = self.model.generation_config
        self.eot = gen["eos_token_id"]
        self.sot = gen["decoder_start_token_id"]
        self.no_timestamps = gen.get("no_timestamps_token_id")
        if self.no_timestamps is None:
            raise ValueError("the model's generation config has no no_timestamps_token_id: "
                             "Whisper's timestamps (and long audio) need it")
        self.timestamp_begin = self.no_timestamps + 1
        self.no_speech = self.no_timestamps - 1       # <|nospeech|> (<|nocaptions|>)
        self.sot_prev = gen.get("prev_sot_token_id")
        self.n_mels = self.model.config["num_mel_bins"]
        self.n_frames = self.model.n_frames

    def __repr__(self):
        return f"Transcriber({self.model!r})"

    @property
    def is_multilingual(self):
        return bool(self.model.generation_config.get("lang_to_id"))

    # -- input ------------------------------------------------------------------------------

    def features(self, audio):
        """Log-mel features (n_mels, frames) of a path or 16 kHz samples, the whole clip."""
        samples = self._samples(audio)
        return log_mel_spectrogram(samples, self.n_mels, padding="longest", truncation=False), \
            samples.size / SAMPLE_RATE

    def _window(self, features, seek):
        out = np.zeros((1, self.n_mels, self.n_frames), np.float32)
        part = features[:, seek:seek + self.n_frames]
        out[0, :, :part.shape[1]] = part
        return out

    def _encode(self, windows):
        """The encoder output (n, max_source_positions, d_model) of windows (n, n_mels,
        n_frames)."""
        return self.model.encode(windows, n_threads=self.n_threads)

    # -- language ---------------------------------------------------------------------------

    def _language_probs(self, mem):
        _, probs = self.model.detect_language(encoder_output=mem, return_probs=True,
                                              n_threads=self.n_threads)
        codes = [tok[2:-2] for tok in self.model.languages]
        return sorted(zip(codes, probs[0].tolist()), key=lambda kv: -kv[1])

    def detect_language(self, audio):
        """[(code, probability), ...] most likely first, from the first 30 s of `audio`."""
        if not self.is_multilingual:
            raise ValueError("this is an English-only Whisper: it has no languages to detect")
        feats, _ = self.features(audio)
        return self._language_probs(self._encode(self._window(feats, 0)))

    # -- transcription ----------------------------------------------------------------------

    def transcribe(self, audio, *, language=None, task=None, num_beams=5, best_of=5,
                   patience=1.0, length_penalty=1.0,
                   temperature=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0), compression_ratio_threshold=2.4,
                   log_prob_threshold=-1.0, no_speech_threshold=0.6,
                   condition_on_previous_text=True, prompt_reset_on_temperature=0.5,
                   initial_prompt=None, word_timestamps=False, without_timestamps=False,
                   max_new_tokens=None, suppress_tokens=None, suppress_blank=True, seed=0,
                   batch_size=None, vad_filter=False, vad_parameters=None, vad_model="silero",
                   hallucination_silence_threshold=None, beam_size=None,
                   beam_rule="transformers", prefix=None, hotwords=None,
                   max_initial_timestamp=None, multilingual=False,
                   language_detection_segments=1, language_detection_threshold=0.5,
                   repetition_penalty=1.0, no_repeat_ngram_size=0, seek_to_pause=None):
        """Transcribe (or, ``task="translate"``, translate to English) `audio`: a path (WAV,
        FLAC, anything FFmpeg reads) or 16 kHz samples. Returns a :class:`Transcription`.

        The options are faster-whisper's (its defaults); ``language`` None detects it from
        the first 30 s (multilingual models; an English-only one takes "en" or None).
        ``beam_size`` is faster-whisper's name for ``num_beams`` (giving both, num_beams other
        than its default 5 and different from beam_size, is a TypeError).

        - ``vad_filter``: the stretches without speech (a voice-activity detector:
          ``vad_model`` "silero" or "webrtc", ``vad_parameters`` a dict of
          :class:`~fastattn.audio.vad.VadOptions` fields) are cut out before decoding; the
          times are the file's.
        - ``batch_size=N``: batched long form (faster-whisper's BatchedInferencePipeline):
          the speech stretches are grouped into windows of at most 30 s and N windows are
          decoded at once, at ``temperature[0]``, each window alone (no conditioning on the
          previous text; ``initial_prompt``, its text as given, prompts every window). A
          window whose decoding loops (below) is decoded again alone through the temperature
          fallback (fastattn's rule). Each window's result is bitwise what it gives in any
          other batch.
        - ``hallucination_silence_threshold`` (seconds; needs ``word_timestamps``): a segment
          whose words look hallucinated (improbable, too short or too long) with a silence
          longer than this before and after it is dropped and the silence skipped
          (faster-whisper's option).

        - ``prefix`` (faster-whisper's option): text the transcript begins with: the first
          window's decoding is forced to start with it (after ``<|0.00|>`` with timestamps)
          and goes on from there; it is part of the first segment.
        - ``hotwords`` (faster-whisper's option): words or phrases the model is shown before
          every window (after ``<|startofprev|>``, before the previous text), so it is more
          likely to spell them so; not on the first window when ``prefix`` is given there.
          Batched: every window, with ``initial_prompt`` after them; ``prefix`` is ignored
          there, as faster-whisper's BatchedInferencePipeline ignores it.

        - ``repetition_penalty``, ``no_repeat_ngram_size`` (faster-whisper's; 1.0 / 0: off):
          transformers' processors over the window's decoding; with
          ``beam_rule="ctranslate2"`` over the transcript only (CTranslate2's rule: the
          prompt before it is not penalised).
        - ``max_initial_timestamp`` (seconds; None: the checkpoint's
          ``max_initial_timestamp_index``, 1.0 s): a window's first timestamp is at most this.
        - ``language_detection_segments``, ``language_detection_threshold`` (faster-whisper's):
          with ``language=None`` on a multilingual model the language is detected on up to
          that many 30 s windows from the start, the first whose most likely language is more
          likely than the threshold deciding, else the language most often on top (its
          highest probability). ``multilingual=True`` (sequential only): each window's language
          is detected again and the window decoded in it.

        - ``beam_rule``: beam search's rule, transformers' (default) or "ctranslate2"
          (faster-whisper's decoding: CTranslate2's stopping rule and scores,
          :mod:`fastattn.generation.beam_ct2`; the compat layer's choice).

        A window whose decoding fails the fallback checks while conditioned on the previous text
        is decoded again without it before any sampled temperature (docs/whisper.md). A result
        fails the compression check only when it loops: its compression ratio over the
        threshold and more than 8 words a second of the window's speech, or a phrase of up to
        four words four times back to back; speech that is said again compresses as well and
        is kept (fastattn's rule: faster-whisper would sample the window again).

        - ``seek_to_pause`` (sequential long form; default None: on unless the three thresholds
          are all None): where a window's last timestamp falls in speech that began less than
          0.5 s before it (the model placed the end of its last segment late, in the next
          sentence's first word), the next window starts in the pause before that speech
          instead, so that word is not cut; and a window whose decoding ends early (a last
          timestamp with no speech after it, by the model) while a second or more of speech
          follows in the window moves on from that timestamp, not past the window (the seek
          never jumps over speech); and a window that starts inside speech the last segment
          kept may have written (before that segment's end, or amid speech) leaves out the
          words at its start that say that segment's last words again. False: the seek of
          openai-whisper, faster-whisper and transformers.

        See :meth:`stream` for the segments as they finish."""
        opts = {k: v for k, v in locals().items() if k not in ("self", "audio")}
        stream = self.stream(audio, **opts)
        return stream.result(list(stream))

    def stream(self, audio, **options):
        """The segments of `audio` as each window (batch of windows) finishes: a
        :class:`TranscriptionStream` (iterate it; ``.language``, ``.language_probability``,
        ``.duration`` are known before the first segment). Options as :meth:`transcribe`'s."""
        for key in options:
            if key not in TRANSCRIBE_DEFAULTS:
                raise TypeError(f"transcribe() got an unexpected keyword argument {key!r}")
        options = dict(TRANSCRIBE_DEFAULTS, **options)
        beam_size = options.pop("beam_size")
        if beam_size is not None:
            if options["num_beams"] not in (TRANSCRIBE_DEFAULTS["num_beams"], beam_size):
                raise TypeError(f"num_beams={options['num_beams']!r} and beam_size={beam_size!r}: "
                                f"beam_size is faster-whisper's name for num_beams, give one")
            options["num_beams"] = beam_size
        opts = _Options(self.model, **options)
        if opts.multilingual and opts.batch_size is not None:
            raise ValueError("multilingual=True: not available with batch_size (the batched "
                             "windows share one prompt; decode sequentially)")
        if opts.word_timestamps and opts.batch_size is not None:
            raise ValueError("word_timestamps: not available with batch_size (decode "
                             "sequentially, with vad_filter=True to skip silences)")
        samples = self._samples(audio)
        return TranscriptionStream(self, samples, opts)

    def transcribe_batch(self, audios, *, batch_size=8, **options):
        """Several files at once: every file's speech windows (batched mode: voice-activity
        detection, windows of at most 30 s) decoded ``batch_size`` at a time across the files.
        Returns one :class:`Transcription` per file, each bitwise
        ``transcribe(audio, batch_size=batch_size, **options)`` (a window's decoding does not
        depend on the rest of its batch). Options as :meth:`transcribe`'s."""
        if isinstance(audios, (str, os.PathLike, np.ndarray, bytes)):
            raise TypeError("audios must be a list of files or arrays")
        streams = [self.stream(a, batch_size=batch_size, **options) for a in audios]
        return decode_across(self, streams)

    def live(self, **options):
        """A live transcription: a :class:`~fastattn.audio.live.LiveSession` that takes audio
        in chunks as it arrives (``session.feed(samples, sample_rate=16000)``) and returns
        events (partial text, confirmed words with times, utterance ends), LocalAgreement-2
        over the decodings of a growing buffer with voice-activity detection. Options:
        :class:`~fastattn.audio.live.LiveSession` (docs/live.md)."""
        from .live import LiveSession
        return LiveSession(self, **options)

    def live_batch(self, **options):
        """A :class:`~fastattn.audio.live.LiveGroup`: live sessions whose decodings run
        together as one batch (a server's case), each session's events bitwise its own
        alone. Options: as :meth:`live`'s, for every session of the group."""
        from .live import LiveGroup
        return LiveGroup(self, **options)

    def _samples(self, audio):
        samples = load_audio(audio)
        if samples.size == 0:
            where = f" {os.fspath(audio)}" if isinstance(audio, (str, os.PathLike)) else ""
            raise ValueError(f"audio{where} holds no samples")
        return samples


# the options of transcribe / stream / transcribe_batch and their defaults: transcribe's
# signature is the one place they are written
TRANSCRIBE_DEFAULTS = types.MappingProxyType({
    name: p.default for name, p in inspect.signature(Transcriber.transcribe).parameters.items()
    if p.kind is inspect.Parameter.KEYWORD_ONLY})


def _whisper_tokenizer(folder):
    """The folder's tokenizer.json (a Whisper byte-level BPE) as a fastattn tokenizer."""
    from ..text.tokenizers.json_tokenizer import JsonTokenizer
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{folder} has no tokenizer.json (Whisper's text needs it)")
    return JsonTokenizer(folder)
