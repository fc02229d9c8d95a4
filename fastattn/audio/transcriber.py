"""Transcriber: audio of any length in, text with timestamps out (a Whisper folder).

The semantics are openai-whisper's ``transcribe`` as faster-whisper and transformers'
sequential long-form ``generate`` run it, re-derived here:

- features of the whole file (:func:`~fastattn.audio.log_mel_spectrogram`, no padding: the
  clip's own frames, normalised over the whole clip as transformers' extractor does with
  ``truncation=False``); a seek pointer walks them: the window ``features[:, seek:seek + 3000]``
  (zero-padded at the end) is encoded and decoded with the timestamp rules;
- the decoding is cut into segments at each pair of consecutive timestamp tokens; a window
  that ends in a single timestamp (no speech after it) or holds no pair moves the seek by the
  whole window, otherwise to the last pair's timestamp, and the unfinished tail is decoded
  again from there (transformers' ``_retrieve_segment``);
- the temperature fallback: each window is decoded at ``temperature[0]`` (0: beam search or
  greedy); when the result is too repetitive (gzip compression ratio over
  ``compression_ratio_threshold``) or too unlikely (average log-probability under
  ``log_prob_threshold``), it is decoded again by sampling (``best_of`` draws) at the next
  temperature; a window whose ``<|nospeech|>`` probability exceeds ``no_speech_threshold``
  while its average log-probability is under ``log_prob_threshold`` is silence and skipped;
- ``condition_on_previous_text``: the tokens of the segments so far (at most
  max_target_positions // 2 - 1 of them, after ``<|startofprev|>``) prompt the next window,
  until a window needs a temperature over ``prompt_reset_on_temperature``;
  ``initial_prompt`` starts that history.

With ``temperature=0.0`` and ``condition_on_previous_text=False`` (and the thresholds None,
transformers' defaults) the segments are transformers' ``generate(..., return_segments=True)``
token for token. Sampling draws from NumPy generators seeded by ``seed``, the window's seek and
the temperature's index: the result is the same for any thread count.
"""
import math
import os
import zlib
from dataclasses import dataclass, field, asdict

import numpy as np

from .._validation import check_option, check_positive_int
from ..generation.processors import apply, history
from ..generation.search import (_chosen_logprob, _draw, _scores_f32, beam_search,
                                 greedy_search)
from ..generation.processors import Temperature
from ..generation.whisper import language_token, strip_generated
from .alignment import add_word_timestamps
from .decode import load_audio
from .features import HOP_LENGTH, SAMPLE_RATE, log_mel_spectrogram
from .vad import TimeMap, VadOptions, collect_chunks, speech_timestamps

__all__ = ["Transcriber", "Transcription", "Segment", "Word"]

_INPUT_STRIDE = 2                       # mel frames per encoder position
_FRAME_SECONDS = HOP_LENGTH / SAMPLE_RATE                      # 0.01
_TIME_PRECISION = _INPUT_STRIDE * _FRAME_SECONDS              # 0.02: one timestamp step


@dataclass(frozen=True)
class Word:
    """A word and when it was said (seconds), with the mean probability of its tokens."""
    start: float
    end: float
    word: str
    probability: float


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
        d = asdict(self)
        return d


def compression_ratio(text):
    """len(utf-8 bytes) / len(zlib-compressed bytes) (openai-whisper's repetition measure)."""
    b = text.encode("utf-8")
    return len(b) / len(zlib.compress(b)) if b else 0.0


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
                 vad_parameters, vad_model):
        gen = model.generation_config
        self.task = task
        if task is not None and task not in ("transcribe", "translate"):
            raise ValueError(f"task must be 'transcribe' or 'translate', got {task!r}")
        self.language = language
        if language is not None:
            if not gen.get("lang_to_id"):
                raise ValueError("language: this is an English-only Whisper (no lang_to_id in "
                                 "its generation config)")
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
        self.condition_on_previous_text = check_option(condition_on_previous_text,
                                                       "condition_on_previous_text")
        self.prompt_reset_on_temperature = _threshold(prompt_reset_on_temperature,
                                                      "prompt_reset_on_temperature")
        if initial_prompt is not None and not isinstance(initial_prompt, str):
            raise TypeError(f"initial_prompt must be a string, got {type(initial_prompt).__name__}")
        self.initial_prompt = initial_prompt
        self.word_timestamps = check_option(word_timestamps, "word_timestamps")
        self.without_timestamps = check_option(without_timestamps, "without_timestamps")
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

    # -- language ---------------------------------------------------------------------------

    def _language_probs(self, mem):
        ids, probs = self.model._detect(mem, 1, self.n_threads)
        z = probs.astype(np.float64)[0]
        z = np.exp(z - z.max())
        z /= z.sum()
        codes = [tok[2:-2] for tok in self.model.languages]
        return sorted(zip(codes, z.tolist()), key=lambda kv: -kv[1])

    def detect_language(self, audio):
        """[(code, probability), ...] most likely first, from the first 30 s of `audio`."""
        if not self.is_multilingual:
            raise ValueError("this is an English-only Whisper: it has no languages to detect")
        feats, _ = self.features(audio)
        mem = self.model._encode(self._window(feats, 0), None, self.n_threads)
        return self._language_probs(mem)

    # -- transcription ----------------------------------------------------------------------

    def transcribe(self, audio, *, language=None, task=None, num_beams=5, best_of=5,
                   patience=1.0, length_penalty=1.0,
                   temperature=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0), compression_ratio_threshold=2.4,
                   log_prob_threshold=-1.0, no_speech_threshold=0.6,
                   condition_on_previous_text=True, prompt_reset_on_temperature=0.5,
                   initial_prompt=None, word_timestamps=False, without_timestamps=False,
                   max_new_tokens=None, suppress_tokens=None, suppress_blank=True, seed=0,
                   batch_size=None, vad_filter=False, vad_parameters=None, vad_model="silero"):
        """Transcribe (or, ``task="translate"``, translate to English) `audio`: a path (WAV,
        FLAC, anything FFmpeg reads) or 16 kHz samples. Returns a :class:`Transcription`.

        The options are faster-whisper's (its defaults); ``language`` None detects it from
        the first 30 s (multilingual models).

        - ``vad_filter``: the stretches without speech (a voice-activity detector:
          ``vad_model`` "silero" or "webrtc", ``vad_parameters`` a dict of
          :class:`~fastattn.audio.vad.VadOptions` fields) are cut out before decoding; the
          times are the file's.
        - ``batch_size=N``: batched long form (faster-whisper's BatchedInferencePipeline):
          the speech stretches are grouped into windows of at most 30 s and N windows are
          decoded at once, at ``temperature[0]``, each window alone (no conditioning on the
          previous text; ``initial_prompt`` prompts every window). Each window's result is
          bitwise what it gives in any other batch.

        See :meth:`stream` for the segments as they finish."""
        opts = {k: v for k, v in locals().items() if k not in ("self", "audio")}
        stream = self.stream(audio, **opts)
        return stream.result(list(stream))

    def stream(self, audio, **options):
        """The segments of `audio` as each window (batch of windows) finishes: a
        :class:`TranscriptionStream` (iterate it; ``.language``, ``.language_probability``,
        ``.duration`` are known before the first segment). Options as :meth:`transcribe`'s."""
        for key in options:
            if key not in _DEFAULTS:
                raise TypeError(f"transcribe() got an unexpected keyword argument {key!r}")
        opts = _Options(self.model, **dict(_DEFAULTS, **options))
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
        groups = {}
        for s in streams:
            if s._chunks:
                groups.setdefault(tuple(s._batch_prefix()), []).extend(
                    (s, i) for i in range(len(s._chunks)))
        results = {}
        for prefix, items in groups.items():
            for b0 in range(0, len(items), streams[0]._opts.batch_size):
                part = items[b0:b0 + streams[0]._opts.batch_size]
                feats = np.stack([s._chunk_feats[i] for s, i in part])
                mem = self.model._encode(feats, None, self.n_threads)
                keys = [s._chunks[i][0][0] for s, i in part]
                for (s, i), r in zip(part, part[0][0]._decode_batch(mem, keys, list(prefix))):
                    results[id(s), i] = r
        out = []
        for s in streams:
            segs = [seg for i in range(len(s._chunks or ()))
                    for seg in s._chunk_segments(i, results[id(s), i])]
            out.append(s.result(segs))
        return out

    def _samples(self, audio):
        samples = load_audio(audio)
        if samples.size == 0:
            where = f" {os.fspath(audio)}" if isinstance(audio, (str, os.PathLike)) else ""
            raise ValueError(f"audio{where} holds no samples")
        return samples


_DEFAULTS = dict(language=None, task=None, num_beams=5, best_of=5, patience=1.0,
                 length_penalty=1.0, temperature=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
                 compression_ratio_threshold=2.4, log_prob_threshold=-1.0,
                 no_speech_threshold=0.6, condition_on_previous_text=True,
                 prompt_reset_on_temperature=0.5, initial_prompt=None, word_timestamps=False,
                 without_timestamps=False, max_new_tokens=None, suppress_tokens=None,
                 suppress_blank=True, seed=0, batch_size=None, vad_filter=False,
                 vad_parameters=None, vad_model="silero")


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
            self._chunk_feats = [self._chunk_features(samples, c) for c in self._chunks]
            self._f = self._chunk_feats[0] if self._chunks else None
        elif samples.size:
            self._f = log_mel_spectrogram(samples, tr.n_mels, padding="longest",
                                          truncation=False)
        else:
            self._f = None                              # no speech at all
        if opts.language is None and tr.is_multilingual and self._f is not None:
            first = model._encode(tr._window(self._f, 0), None, tr.n_threads)
            probs = tr._language_probs(first)
            self.all_language_probs = probs
            self.language, self.language_probability = probs[0]
        elif opts.language is not None:
            tok = language_token(opts.language, model.generation_config["lang_to_id"])
            inv = {v: k for k, v in model.generation_config["lang_to_id"].items()}
            self.language = inv[tok][2:-2]
        elif not tr.is_multilingual:
            self.language = "en"                        # English-only (faster-whisper says so)
        self._first = first
        self._sid = 0
        if self._f is None:
            self._it = iter(())
        elif self._chunks is not None:
            self._it = self._batched()
        else:
            self._it = self._segments()

    def _chunk_features(self, samples, chunk):
        audio = np.concatenate([samples[a:b] for a, b in chunk])
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

    def _sot_sequence(self):
        tr, opts = self._tr, self._opts
        gen = tr.model.generation_config
        seq = [tr.sot]
        if tr.is_multilingual:
            seq.append(gen["lang_to_id"][f"<|{self.language}|>"])
            seq.append(gen["task_to_id"][opts.task or "transcribe"])
        elif opts.task == "translate":
            raise ValueError("task='translate' needs a multilingual Whisper")
        if opts.without_timestamps:
            seq.append(tr.no_timestamps)
        return seq

    def _settings(self, prefix_len):
        tr, opts = self._tr, self._opts
        model = tr.model
        user = {"num_beams": opts.num_beams, "length_penalty": opts.length_penalty}
        if opts.max_new_tokens is not None:
            # at most what the decoder's positions leave after this window's prompt
            user["max_new_tokens"] = max(1, min(opts.max_new_tokens,
                                                model.max_decoder_positions - prefix_len))
        if opts.suppress_tokens is not None:
            user["suppress_tokens"] = list(opts.suppress_tokens)
        if not opts.suppress_blank:
            user["begin_suppress_tokens"] = []
        p, P = model._settings(user, prefix_len)
        if opts.max_new_tokens is None:
            # one window: the checkpoint's max_length grown by the prompt, at most the
            # decoder's positions (transformers' per-window max_length)
            p["max_length"] = min(p["max_length"] + min(model.max_decoder_positions // 2 - 1,
                                                         prefix_len),
                                  model.max_decoder_positions)
        if p["max_length"] <= P:
            raise ValueError(f"the prompt leaves no room to decode (max_length "
                             f"{p['max_length']}, prompt {P} tokens)")
        procs = model._processors(p, user, P, not opts.without_timestamps)
        return p, procs

    def _decode(self, mem, prefix, temperature, t_index, seek):
        """One decoding of one window -> (tokens without EOS, sum of log-probs, no-speech
        probability)."""
        tr, opts = self._tr, self._opts
        model = tr.model
        P = len(prefix)
        p, procs = self._settings(P)
        sot_at = prefix.index(tr.sot)
        seen = {}

        def on_logits(t, logits):
            if t == sot_at:
                seen["sot"] = np.asarray(logits, np.float64)

        S = model._config["max_source_positions"]
        if temperature == 0.0:
            K = opts.num_beams
            rows = np.array([prefix], np.int64)
            state = model.start(encoder_output=mem.reshape(1, S, -1), num_beams=K,
                                max_length=p["max_length"], n_threads=tr.n_threads)
            if K > 1:
                seqs, scores, norm = beam_search(state, procs, p, 1, K, None, tr.n_threads,
                                                 prefix=rows, return_scores=True,
                                                 on_logits=on_logits, return_norm=True)
                gen = strip_generated(seqs[0, P:], p["pad_token_id"], p["eos_token_id"])
                n = seqs.shape[1] - P                # tokens scored (EOS counted)
                # the log-probabilities renormalised after the suppression and timestamp
                # rules (openai-whisper's and CTranslate2's, which the thresholds assume)
                total = float(scores[0]) * n ** p["length_penalty"] - float(norm[0])
            else:
                seqs, scores = greedy_search(state, procs, p, 1, prefix=rows,
                                             return_scores=True, on_logits=on_logits)
                gen = strip_generated(seqs[0, P:], p["pad_token_id"], p["eos_token_id"])
                total = float(scores[0])
        else:
            R = opts.best_of
            ss = np.random.SeedSequence([opts.seed, int(seek), t_index])
            streams = [np.random.default_rng(x) for x in ss.spawn(R)]
            # best_of draws of one window: R rows of one source (its cross-attention keys
            # and values computed once); finished rows idle until the last one ends
            state = model.start(encoder_output=mem.reshape(1, S, -1), num_beams=R,
                                max_length=p["max_length"], n_threads=tr.n_threads)
            seqs, scores = _sample_rows(state, procs, p, [prefix] * R, streams, on_logits,
                                        temperature)
            best, best_rank = None, -np.inf
            for r in range(R):
                g = strip_generated(seqs[r, P:], p["pad_token_id"], p["eos_token_id"])
                rank = float(scores[r]) / max(g.size, 1)
                if rank > best_rank:
                    best, best_rank, total = g, rank, float(scores[r])
            gen = best
        lg = seen["sot"][0]
        lg = lg - lg.max()
        probs = np.exp(lg) / np.exp(lg).sum()
        return gen, total, float(probs[tr.no_speech])

    def _text(self, tokens):
        return self._tr.tokenizer.decode([int(t) for t in tokens if t < self._tr.eot])

    def _with_fallback(self, mem, prefix, seek):
        opts = self._opts
        results = []
        for i, t in enumerate(opts.temperatures):
            tokens, total, no_speech = self._decode(mem, prefix, t, i, seek)
            avg = total / (tokens.size + 1)
            cr = compression_ratio(self._text(tokens).strip())
            res = (tokens, t, avg, cr, no_speech)
            results.append(res)
            fallback = False
            if opts.compression_ratio_threshold is not None and \
                    cr > opts.compression_ratio_threshold:
                fallback = True
            if opts.log_prob_threshold is not None and avg < opts.log_prob_threshold:
                fallback = True
            if opts.no_speech_threshold is not None and \
                    no_speech > opts.no_speech_threshold and \
                    opts.log_prob_threshold is not None and avg < opts.log_prob_threshold:
                fallback = False                  # silence: no point in decoding it again
            if not fallback:
                return res
        # every temperature failed: the most likely result that is not repetitive, else the
        # most likely one
        ok = [r for r in results if opts.compression_ratio_threshold is None or
              r[3] <= opts.compression_ratio_threshold] or results
        return max(ok, key=lambda r: r[2])

    # -- batched windows ---------------------------------------------------------------------

    def _decode_batch(self, mem, keys, prefix):
        """Windows (len(keys) of them, encoded: (n * S, d)) decoded at once at temperature[0]
        with the same prefix -> [(tokens, sum of log-probs, no-speech probability)]. keys: each
        window's first sample in its file (a sampled window draws from the stream of the seed
        and its key: the same whatever else is in the batch)."""
        tr, opts = self._tr, self._opts
        model = tr.model
        n = len(keys)
        P = len(prefix)
        p, procs = self._settings(P)
        sot_at = prefix.index(tr.sot)
        temperature = opts.temperatures[0]
        K = opts.num_beams if temperature == 0.0 else 1
        seen = {}

        def on_logits(t, logits):
            if t == sot_at:
                seen["sot"] = np.asarray(logits[::K], np.float64)

        S = model._config["max_source_positions"]
        rows = np.repeat(np.array([prefix], np.int64), n, axis=0)
        state = model.start(encoder_output=mem.reshape(n, S, -1), num_beams=K,
                            max_length=p["max_length"], n_threads=tr.n_threads)
        norm = np.zeros(n)
        if K > 1:
            seqs, scores, norm = beam_search(state, procs, p, n, K, None, tr.n_threads,
                                             prefix=rows, return_scores=True,
                                             on_logits=on_logits, return_norm=True)
        elif temperature > 0.0:
            streams = [np.random.default_rng(np.random.SeedSequence([opts.seed, int(k)]))
                       for k in keys]
            seqs, scores = _sample_rows(state, procs, p, rows, streams, on_logits, temperature)
        else:
            seqs, scores = greedy_search(state, procs, p, n, prefix=rows, return_scores=True,
                                         on_logits=on_logits)
        out = []
        lg = seen["sot"]
        lg = lg - lg.max(axis=1, keepdims=True)
        probs = np.exp(lg) / np.exp(lg).sum(axis=1, keepdims=True)
        for i in range(n):
            gen = strip_generated(seqs[i, P:], p["pad_token_id"], p["eos_token_id"])
            total = float(scores[i])
            if K > 1:                    # the beam score is sum / length ** length_penalty
                end = P + gen.size
                length = gen.size + (end < seqs.shape[1] and seqs[i, end] == p["eos_token_id"])
                total = total * length ** p["length_penalty"] - float(norm[i])
            out.append((gen, total, float(probs[i, tr.no_speech])))
        return out

    def _batch_prefix(self):
        """The prefix every batched window of this stream is decoded with."""
        tr, opts = self._tr, self._opts
        prefix = self._sot_sequence()
        if opts.initial_prompt and tr.sot_prev is not None:
            cut = tr.model.max_decoder_positions // 2 - 1
            prefix = [tr.sot_prev] + _plain_ids(tr.tokenizer, " " + opts.initial_prompt.strip(),
                                                tr.eot)[-cut:] + prefix
        return prefix

    def _window_keys(self, idx):
        return [self._chunks[i][0][0] for i in idx]

    def _batched(self):
        tr = self._tr
        prefix = self._batch_prefix()
        N = self._opts.batch_size
        for b0 in range(0, len(self._chunks), N):
            idx = list(range(b0, min(b0 + N, len(self._chunks))))
            feats = np.stack([self._chunk_feats[i] for i in idx])
            if b0 == 0 and self._first is not None and len(idx) == 1:
                mem = self._first
            else:
                mem = tr.model._encode(feats, None, tr.n_threads)
            self._first = None
            results = self._decode_batch(mem, self._window_keys(idx), prefix)
            for i, r in zip(idx, results):
                yield from self._chunk_segments(i, r)

    def _chunk_segments(self, i, result):
        """The segments of batched window i from its decoding `result`."""
        tr, opts = self._tr, self._opts
        tb = tr.timestamp_begin
        chunk = self._chunks[i]
        tokens, total, no_speech = result
        avg = total / (tokens.size + 1)
        if opts.no_speech_threshold is not None and no_speech > opts.no_speech_threshold and \
                not (opts.log_prob_threshold is not None and avg > opts.log_prob_threshold):
            return
        cr = compression_ratio(self._text(tokens).strip())
        frames = -(-sum(b - a for a, b in chunk) // HOP_LENGTH)
        window = min(frames, tr.n_frames)
        tmap = TimeMap(chunk)
        if opts.without_timestamps:
            pieces = [(tokens, 0, window // _INPUT_STRIDE)]
        else:
            pieces = _pieces(tokens, tb, window)
        # times inside the window's speech (the model may name a time in its zero padding)
        speech = sum(b - a for a, b in chunk) / SAMPLE_RATE
        for toks, start_pos, end_pos in pieces:
            text = self._text(toks)
            start = tmap(min(start_pos * _TIME_PRECISION, speech))
            end = tmap(min(end_pos * _TIME_PRECISION, speech), is_end=True)
            if start >= end or not text.strip():
                continue
            yield Segment(id=self._sid, seek=int(chunk[0][0] // HOP_LENGTH), start=start,
                          end=end, text=text, tokens=[int(t) for t in toks],
                          temperature=opts.temperatures[0], avg_logprob=avg,
                          compression_ratio=cr, no_speech_prob=no_speech)
            self._sid += 1

    # -- the seek loop -----------------------------------------------------------------------

    def _segments(self):
        tr, opts, f = self._tr, self._opts, self._f
        frames = f.shape[1]
        tb = tr.timestamp_begin
        history = []
        if opts.initial_prompt:
            history = _plain_ids(tr.tokenizer, " " + opts.initial_prompt.strip(), tr.eot)
        reset_since = 0
        seek, sid = 0, 0
        last_speech = 0.0
        sot_seq = self._sot_sequence()
        cut = tr.model.max_decoder_positions // 2 - 1
        while seek < frames:
            window = min(frames - seek, tr.n_frames)
            if seek == 0 and self._first is not None:
                mem = self._first
            else:
                mem = tr.model._encode(tr._window(f, seek), None, tr.n_threads)
            self._first = None
            prev = history[reset_since:]
            prefix = list(sot_seq)
            if prev and tr.sot_prev is not None and (opts.condition_on_previous_text or
                                                     reset_since == 0 and opts.initial_prompt):
                prefix = [tr.sot_prev] + prev[-cut:] + sot_seq
            tokens, temp, avg, cr, no_speech = self._with_fallback(mem, prefix, seek)
            if opts.no_speech_threshold is not None and no_speech > opts.no_speech_threshold \
                    and not (opts.log_prob_threshold is not None and
                             avg > opts.log_prob_threshold):
                seek += window                    # silence
                continue
            offset = seek * _TIME_PRECISION / _INPUT_STRIDE       # transformers' arithmetic
            pieces, moved = _split(tokens, tb, window)
            segs = [[toks, offset + a * _TIME_PRECISION, offset + b * _TIME_PRECISION, None]
                    for toks, a, b in pieces]
            if opts.word_timestamps and segs:
                timed, last_speech = add_word_timestamps(
                    tr.model, [{"tokens": t, "start": a, "end": b} for t, a, b, _ in segs],
                    mem.reshape(tr.model._config["max_source_positions"], -1), sot_seq,
                    tr.tokenizer, window, offset, language=self.language,
                    last_speech_timestamp=last_speech, n_threads=tr.n_threads)
                for seg, (a, b, words) in zip(segs, timed):
                    seg[1], seg[2], seg[3] = a, b, words
                single_end = tokens.size >= 2 and tokens[-2] < tb <= tokens[-1]
                ends = [w.end for _, _, words in timed for w in words]
                if not single_end and ends:
                    shift = round((ends[-1] - offset) * 100)
                    if shift > 0:
                        moved = shift                 # on from the last word (faster-whisper)
            for toks, start, end, words in segs:
                if self._map is not None:                   # speech-only time -> the file's
                    start, end = self._map(start), self._map(end, is_end=True)
                    if words is not None:
                        words = [w._replace(start=self._map(w.start),
                                            end=self._map(w.end, is_end=True)) for w in words]
                text = self._text(toks)
                # the history that prompts later windows: a segment's tokens, its closing
                # timestamp left out where it ends in two (transformers' conditioning)
                keep = toks[:-1] if toks.size > 2 and toks[-2] >= tb else toks
                history.extend(int(t) for t in keep)
                if start == end or not text.strip():
                    continue
                yield Segment(id=sid, seek=seek, start=start, end=end, text=text,
                              tokens=[int(t) for t in toks], temperature=temp,
                              avg_logprob=avg, compression_ratio=cr,
                              no_speech_prob=no_speech,
                              words=None if words is None else [Word(*w) for w in words])
                sid += 1
            if not opts.condition_on_previous_text or \
                    (opts.prompt_reset_on_temperature is not None and
                     temp > opts.prompt_reset_on_temperature):
                reset_since = len(history)
            seek += moved


def _sample_rows(state, procs, p, prefix, streams, on_logits, temperature):
    """Multinomial decoding at `temperature` of the state's rows (one stream each), which stay
    in the step batch until every row has ended -> (int64 (R, P + T), float64 (R,) sums of the
    chosen tokens' log-probabilities under the processed scores before the temperature, as
    openai-whisper's and CTranslate2's). prefix: (R, P) rows."""
    R = len(streams)
    max_len, eos, pad = p["max_length"], p["eos_token_id"], p["pad_token_id"]
    prefix = np.asarray(prefix, np.int64).reshape(R, -1)
    P = prefix.shape[1]
    seqs = np.full((R, max_len), pad, np.int64)
    seqs[:, :P] = prefix
    rows = np.arange(R)
    zeros = np.zeros(R, np.int64)
    temp = Temperature(temperature)
    for t in range(P - 1):
        on_logits(t, state.step(seqs[:, t]))
    cur, tokens = P, seqs[:, P - 1].copy()
    done = np.zeros(R, bool)
    total = np.zeros(R)
    while True:
        scores = _scores_f32(state.step(tokens))
        if cur == P:
            on_logits(P - 1, scores.copy())
        scores = apply(procs, history(seqs, rows, cur, procs), scores, zeros)
        live = np.flatnonzero(~done)
        nxt = np.full(R, pad, np.int64)
        nxt[live] = _draw(temp(None, scores[live].copy()), [streams[i] for i in live])
        total[live] += _chosen_logprob(scores[live], nxt[live])
        seqs[:, cur] = nxt
        cur += 1
        done |= nxt == eos
        if done.all() or cur >= max_len:
            break
        tokens = nxt
    return seqs[:, :cur], total


def _pieces(tokens, tb, window):
    """Batched windows are decoded once: _split's segments, and the text after the last
    timestamp pair (which the sequential loop decodes again) as a segment to the window's
    end."""
    pieces, moved = _split(tokens, tb, window)
    if moved < window:
        used = sum(p[0].size for p in pieces)
        tail = tokens[used:]
        if tail.size:
            start = int(pieces[-1][2]) if pieces else 0
            pieces.append((tail, start, window // _INPUT_STRIDE))
    return pieces


def _split(tokens, tb, window):
    """One window's tokens -> ([(tokens, start position, end position)], frames to move):
    transformers' ``_retrieve_segment`` (positions in timestamp steps of 0.02 s)."""
    ts = tokens >= tb
    single_end = tokens.size >= 2 and not ts[-2] and ts[-1]
    cuts = list(np.flatnonzero(ts[:-1] & ts[1:]) + 1)
    if cuts:
        if single_end:
            cuts.append(tokens.size)
        else:
            cuts[-1] += 1
        out, last = [], 0
        for i, c in enumerate(cuts):
            piece = tokens[last:c]
            end_idx = -1 if i < len(cuts) - 1 or single_end else -2
            out.append((piece, int(piece[0]) - tb, int(piece[end_idx]) - tb))
            last = c
        if single_end:
            moved = window
        else:
            moved = (int(tokens[last - 2]) - tb) * _INPUT_STRIDE
        return out, moved
    idx = np.flatnonzero(ts)
    end = window * _FRAME_SECONDS / _TIME_PRECISION
    end = int(end)
    if idx.size and tokens[idx[-1]] != tb:
        end = int(tokens[idx[-1]]) - tb
    return [(tokens, 0, end)], window


def _plain_ids(tokenizer, text, eot):
    """`text`'s token ids without special tokens."""
    tk = getattr(tokenizer, "_tk", None)
    if tk is not None:
        return [int(t) for t in tk.encode(text, add_special_tokens=False).ids]
    ids = tokenizer.encode([text])
    return [int(t) for t in np.asarray(ids).reshape(-1) if t < eot]


def _whisper_tokenizer(folder):
    """The folder's tokenizer.json (a Whisper byte-level BPE) as a fastattn tokenizer."""
    from ..text.tokenizers.json_tokenizer import JsonTokenizer
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{folder} has no tokenizer.json (Whisper's text needs it)")
    return JsonTokenizer(folder)
