"""faster-whisper's ``WhisperModel`` / ``BatchedInferencePipeline`` over
:class:`fastattn.Transcriber`.

    from fastattn.compat.faster_whisper import WhisperModel        # the only change
    model = WhisperModel("path/to/faster-whisper-tiny.en", device="cpu", compute_type="int8")
    segments, info = model.transcribe("talk.mp3", beam_size=5, word_timestamps=True)
    for s in segments:
        print(f"[{s.start:.2f} -> {s.end:.2f}] {s.text}")

Semantics are faster-whisper 1.2's: its constructor and ``transcribe`` signatures (names,
order, defaults), ``(segments generator, TranscriptionInfo)`` as the result, its
:class:`Segment` / :class:`Word` / :class:`TranscriptionOptions` / :class:`TranscriptionInfo`
dataclasses (the same fields in the same order; segment ids from 1), ``decode_audio``,
``format_timestamp``, ``available_models``. The decoding is Transcriber's (its long form, its
log-mel features: the text is faster-whisper's within what different features change, not
token for token), with faster-whisper's decoding: beam search by CTranslate2's rule
(``beam_rule="ctranslate2"``) and at most 224 new tokens a window.

Models: a folder (CTranslate2 as faster-whisper reads it, or Hugging Face), or a size name /
hub id whose snapshot is already in the Hugging Face cache (``download_root``, else
``HF_HUB_CACHE`` / ``HF_HOME``): nothing is downloaded.

``compute_type``: "default" / "auto" load the folder as stored (float32 compute; an int8
folder stays int8), "float32" the same on a float folder; "int8", "int8_float32",
"int8_float16", "int8_bfloat16" quantize to int8 (int8 weights, float32 activations: the
second half names the activations' type on a GPU); "bfloat16" quantizes to bfloat16. Refused:
"float16" and "int8" folders asked for "float32" / "bfloat16" (CTranslate2 refuses float16 on
a CPU too; fastattn does not widen an int8 folder).

Refused, each by a ValueError naming it when its value differs from faster-whisper's default:
``device`` other than "cpu" / "auto", ``device_index`` other than 0, ``num_workers`` other
than 1, ``files``, ``revision``, ``use_auth_token``, extra CTranslate2 keywords;
``patience``, ``chunk_length`` other than
the model's 30 s, ``prepend_punctuations`` / ``append_punctuations``, ``initial_prompt`` as
token ids, several ``clip_timestamps`` clips with ``condition_on_previous_text=True``;
``split_stereo=True`` in ``decode_audio``. Batched: ``vad_filter=False``, ``clip_timestamps``,
``word_timestamps=True``, ``multilingual=True`` on a multilingual model.

As faster-whisper: ``language`` other than "en" and ``multilingual=True`` on an English-only
model log a warning and use English; ``language_detection_threshold`` decides nothing with one
detection segment; the batched pipeline ignores ``condition_on_previous_text``, the three
thresholds, ``prompt_reset_on_temperature``, ``prefix``, ``max_initial_timestamp`` and every
temperature but the first. ``prefix`` begins the first window's transcript (at 0 s; a clip
that starts later has none, as there), ``hotwords`` prompt every window (Transcriber's options
of the same names).
"""
import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np

from ..audio import Transcriber
from ..audio.alignment import APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS
from ..audio.decode import load_audio
from ..audio.features import HOP_LENGTH, SAMPLE_RATE
from ..audio.vad import VadOptions

__all__ = ["WhisperModel", "BatchedInferencePipeline", "Segment", "Word",
           "TranscriptionOptions", "TranscriptionInfo", "VadOptions", "decode_audio",
           "format_timestamp", "available_models"]

logger = logging.getLogger(__name__)

# faster-whisper's size names -> the hub repositories of their CTranslate2 conversions
_MODELS = {
    "tiny.en": "Systran/faster-whisper-tiny.en", "tiny": "Systran/faster-whisper-tiny",
    "base.en": "Systran/faster-whisper-base.en", "base": "Systran/faster-whisper-base",
    "small.en": "Systran/faster-whisper-small.en", "small": "Systran/faster-whisper-small",
    "medium.en": "Systran/faster-whisper-medium.en", "medium": "Systran/faster-whisper-medium",
    "large-v1": "Systran/faster-whisper-large-v1", "large-v2": "Systran/faster-whisper-large-v2",
    "large-v3": "Systran/faster-whisper-large-v3", "large": "Systran/faster-whisper-large-v3",
    "distil-large-v2": "Systran/faster-distil-whisper-large-v2",
    "distil-medium.en": "Systran/faster-distil-whisper-medium.en",
    "distil-small.en": "Systran/faster-distil-whisper-small.en",
    "distil-large-v3": "Systran/faster-distil-whisper-large-v3",
    "distil-large-v3.5": "distil-whisper/distil-large-v3.5-ct2",
    "large-v3-turbo": "mobiuslabsgmbh/faster-whisper-large-v3-turbo",
    "turbo": "mobiuslabsgmbh/faster-whisper-large-v3-turbo",
}
_TEMPERATURES = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]


@dataclass
class Word:
    start: float
    end: float
    word: str
    probability: float


@dataclass
class Segment:
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: List[int]
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: Optional[List[Word]]
    temperature: Optional[float]


@dataclass
class TranscriptionOptions:
    beam_size: int
    best_of: int
    patience: float
    length_penalty: float
    repetition_penalty: float
    no_repeat_ngram_size: int
    log_prob_threshold: Optional[float]
    no_speech_threshold: Optional[float]
    compression_ratio_threshold: Optional[float]
    condition_on_previous_text: bool
    prompt_reset_on_temperature: float
    temperatures: List[float]
    initial_prompt: Optional[str]
    prefix: Optional[str]
    suppress_blank: bool
    suppress_tokens: Optional[List[int]]
    without_timestamps: bool
    max_initial_timestamp: float
    word_timestamps: bool
    prepend_punctuations: str
    append_punctuations: str
    multilingual: bool
    max_new_tokens: Optional[int]
    clip_timestamps: object
    hallucination_silence_threshold: Optional[float]
    hotwords: Optional[str]


@dataclass
class TranscriptionInfo:
    language: str
    language_probability: float
    duration: float
    duration_after_vad: float
    all_language_probs: Optional[List[Tuple[str, float]]]
    transcription_options: TranscriptionOptions
    vad_options: object


def available_models():
    """faster-whisper's size names (a size loads only from the Hugging Face cache here)."""
    return list(_MODELS)


def format_timestamp(seconds, always_include_hours=False, decimal_marker="."):
    """``[HH:]MM:SS.mmm`` of `seconds` (>= 0), milliseconds rounded."""
    if seconds < 0:
        raise ValueError(f"seconds must be >= 0, got {seconds!r}")
    ms = round(seconds * 1000.0)
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    head = f"{hours:02d}:" if always_include_hours or hours > 0 else ""
    return f"{head}{minutes:02d}:{secs:02d}{decimal_marker}{ms:03d}"


def decode_audio(input_file, sampling_rate=16000, split_stereo=False):
    """A file (path, binary file object, bytes) as mono float32 samples at `sampling_rate`
    (:func:`fastattn.audio.load_audio`: channels averaged, FFmpeg's resampler)."""
    if split_stereo:
        raise ValueError("split_stereo=True is not supported: fastattn decodes to mono "
                         "(channels averaged)")
    return load_audio(input_file, sampling_rate=sampling_rate)


# -- the model ---------------------------------------------------------------------------------

def _hub_cache(download_root):
    if download_root is not None:
        return os.fspath(download_root)
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return os.environ[var]
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "huggingface")
    return os.path.join(home, "hub")


def _resolve(model_size_or_path, download_root):
    """The local folder of a path, a size name or a hub id (its cached snapshot)."""
    from .sentence_transformers import _cached_snapshot
    if not isinstance(model_size_or_path, (str, os.PathLike)):
        raise TypeError(f"model_size_or_path must be a str or os.PathLike, got "
                        f"{type(model_size_or_path).__name__}")
    path = os.fspath(model_size_or_path)
    if os.path.isdir(path):
        return path
    repo = path if "/" in path and path.count("/") == 1 and not path.startswith(
        (".", os.sep)) else _MODELS.get(path)
    if repo is None:
        raise ValueError(f"model_size_or_path={path!r} is neither a folder nor a size name "
                         f"({', '.join(_MODELS)}) nor a hub id")
    cache = _hub_cache(download_root)
    folder = _cached_snapshot(repo, cache, None)
    if folder is None:
        raise ValueError(f"model_size_or_path={path!r}: no snapshot of {repo} is in the Hugging "
                         f"Face cache {cache}, and fastattn downloads nothing. Download it once "
                         f"(huggingface-cli download {repo}) or pass its folder")
    return folder


_INT8 = ("int8", "int8_float32", "int8_float16", "int8_bfloat16")


class WhisperModel:
    """faster-whisper's WhisperModel over :class:`fastattn.Transcriber` (see the module)."""

    def __init__(self, model_size_or_path, device="auto", device_index=0,
                 compute_type="default", cpu_threads=0, num_workers=1, download_root=None,
                 local_files_only=False, files=None, revision=None, use_auth_token=None,
                 **model_kwargs):
        if device not in ("cpu", "auto"):
            raise ValueError(f"device={device!r} is not supported: fastattn computes on the "
                             "CPU only (device='cpu' or 'auto')")
        if device_index not in (0, [0]):
            raise ValueError(f"device_index={device_index!r} is not supported: one CPU device")
        if num_workers != 1:
            raise ValueError(f"num_workers={num_workers!r} is not supported: one worker (call "
                             "transcribe from one thread; cpu_threads sets its threads)")
        for name, value in (("files", files), ("revision", revision),
                            ("use_auth_token", use_auth_token)):
            if value:
                raise ValueError(f"{name}={value!r} is not supported: a folder on disk or a "
                                 "snapshot already in the Hugging Face cache")
        if model_kwargs:
            raise TypeError(f"unsupported CTranslate2 keyword arguments: "
                            f"{', '.join(sorted(model_kwargs))}")
        if isinstance(cpu_threads, bool) or not isinstance(cpu_threads, int) or cpu_threads < 0:
            raise ValueError(f"cpu_threads must be an integer >= 0, got {cpu_threads!r}")
        if compute_type in ("default", "auto", "float32"):
            quantize = None
        elif compute_type in _INT8:
            quantize = "int8"
        elif compute_type == "bfloat16":
            quantize = "bfloat16"
        elif compute_type == "float16":
            raise ValueError("compute_type='float16' is not supported on a CPU (CTranslate2 "
                             "refuses it there too): use 'int8', 'bfloat16' or 'float32'")
        else:
            raise ValueError(f"compute_type={compute_type!r} is not supported: 'default', "
                             f"'auto', 'float32', 'bfloat16' or one of {', '.join(_INT8)}")
        del local_files_only                      # nothing is ever downloaded
        folder = _resolve(model_size_or_path, download_root)
        self.transcriber = Transcriber(folder, quantize=quantize,
                                       n_threads=cpu_threads or None)
        if compute_type == "float32" and self.transcriber.model.quantize is not None:
            raise ValueError(f"compute_type='float32': {folder} is stored "
                             f"{self.transcriber.model.quantize} and fastattn does not widen it "
                             "(use compute_type='default')")
        self.model_path = folder
        self.compute_type = compute_type

    def __repr__(self):
        return f"WhisperModel({self.model_path!r}, compute_type={self.compute_type!r})"

    @property
    def supported_languages(self):
        tr = self.transcriber
        return [t[2:-2] for t in tr.model.languages] if tr.is_multilingual else ["en"]

    def detect_language(self, audio=None, features=None, vad_filter=False, vad_parameters=None,
                        language_detection_segments=1, language_detection_threshold=0.5):
        """(language, probability, [(language, probability), ...]): faster-whisper's detection
        on `audio` (samples or a file; its speech only with ``vad_filter``), up to
        ``language_detection_segments`` windows of 30 s (Transcriber's ``_detect``)."""
        if features is not None or audio is None:
            raise ValueError("features: give audio (fastattn computes its own features)")
        tr = self.transcriber
        if not tr.is_multilingual:
            raise ValueError("this is an English-only Whisper: it has no languages to detect")
        vad = _vad(vad_parameters, None) if vad_filter else None
        stream = tr.stream(_samples(audio), vad_filter=bool(vad_filter), vad_parameters=vad,
                           language_detection_segments=language_detection_segments,
                           language_detection_threshold=language_detection_threshold)
        if stream.language is None:
            raise ValueError("audio: no speech to detect a language in")
        return stream.language, stream.language_probability, stream.all_language_probs

    # -- transcribe ---------------------------------------------------------------------------

    def transcribe(self, audio, language=None, task="transcribe", log_progress=False,
                   beam_size=5, best_of=5, patience=1, length_penalty=1, repetition_penalty=1,
                   no_repeat_ngram_size=0, temperature=_TEMPERATURES,
                   compression_ratio_threshold=2.4, log_prob_threshold=-1.0,
                   no_speech_threshold=0.6, condition_on_previous_text=True,
                   prompt_reset_on_temperature=0.5, initial_prompt=None, prefix=None,
                   suppress_blank=True, suppress_tokens=[-1], without_timestamps=False,
                   max_initial_timestamp=1.0, word_timestamps=False,
                   prepend_punctuations=PREPEND_PUNCTUATIONS,
                   append_punctuations=APPEND_PUNCTUATIONS, multilingual=False,
                   vad_filter=False, vad_parameters=None, max_new_tokens=None,
                   chunk_length=None, clip_timestamps="0", hallucination_silence_threshold=None,
                   hotwords=None, language_detection_threshold=0.5,
                   language_detection_segments=1):
        """``(segments, info)``: a generator of :class:`Segment` (decoded as it is iterated)
        and a :class:`TranscriptionInfo` (known at once). faster-whisper's options."""
        args = dict(locals())
        del args["self"], args["audio"]
        common, options = self._common(args, batched=False)
        kw = dict(common, condition_on_previous_text=condition_on_previous_text,
                  compression_ratio_threshold=compression_ratio_threshold,
                  log_prob_threshold=log_prob_threshold,
                  no_speech_threshold=no_speech_threshold,
                  prompt_reset_on_temperature=prompt_reset_on_temperature,
                  word_timestamps=word_timestamps,
                  hallucination_silence_threshold=hallucination_silence_threshold)
        tr = self.transcriber
        samples = _samples(audio)
        points, clips = _clips(clip_timestamps, samples.size)
        options.clip_timestamps = points               # parsed, as faster-whisper records it
        vad = None
        if samples.size == 0:
            return iter(()), _empty_info(tr, kw["language"], options, vad_parameters)
        if clips is None:
            if vad_filter:
                vad = _vad(vad_parameters, None)
            stream = tr.stream(samples, vad_filter=bool(vad_filter), vad_parameters=vad, **kw)
            info = _info(stream, stream.duration, stream.duration_after_vad, options,
                         vad if vad_filter else vad_parameters)
            segments = _segments([(stream, 0)], round_to=None)
        else:
            if len(clips) > 1 and condition_on_previous_text:
                raise ValueError("clip_timestamps: several clips with "
                                 "condition_on_previous_text=True are not supported (the "
                                 "previous clip's text would prompt the next); pass "
                                 "condition_on_previous_text=False")
            streams = []
            for i, (a, b) in enumerate(clips):
                # the initial prompt and the prefix go to the first clip (faster-whisper: the
                # prefix to the window at seek 0 only)
                kw_i = dict(kw, initial_prompt=None, prefix=None) if i else \
                    dict(kw, prefix=kw["prefix"] if a == 0 else None)
                s = tr.stream(samples[a * HOP_LENGTH:b * HOP_LENGTH], **kw_i)
                if i == 0 and kw["language"] is None and s.language is not None:
                    kw["language"] = s.language       # detected once, in the first clip
                streams.append((s, a))
            duration = samples.size / SAMPLE_RATE
            info = _info(streams[0][0], duration, duration, options, vad_parameters)
            segments = _segments(streams, round_to=None)
        if log_progress:
            segments = _progress(segments, info.duration)
        return segments, info

    def _common(self, a, *, batched):
        """Transcriber's options of the options both transcribes share, and faster-whisper's
        TranscriptionOptions of the call (`a`: the call's arguments)."""
        tr = self.transcriber
        for name, default in (("patience", 1), ("prepend_punctuations", PREPEND_PUNCTUATIONS),
                              ("append_punctuations", APPEND_PUNCTUATIONS)):
            if a[name] != default:
                raise ValueError(f"{name}={a[name]!r} is not supported: only faster-whisper's "
                                 f"default {default!r}")
        window_s = tr.n_frames * HOP_LENGTH / SAMPLE_RATE
        if a["chunk_length"] is not None and a["chunk_length"] != window_s:
            raise ValueError(f"chunk_length={a['chunk_length']!r} is not supported: the "
                             f"model's windows are {window_s:g} s")
        language, multilingual = a["language"], a["multilingual"]
        if batched and multilingual and tr.is_multilingual:
            raise ValueError("multilingual=True is not supported by the batched pipeline "
                             "(its windows share one prompt): use WhisperModel.transcribe")
        if not tr.is_multilingual:
            if multilingual:
                logger.warning("The current model is English-only but the multilingual "
                               "parameter is set to True; setting to False instead.")
                multilingual = False
            if language is not None and language != "en":
                logger.warning("The current model is English-only but the language parameter "
                               "is set to %r; using 'en' instead.", language)
                language = "en"
        prompt = a["initial_prompt"]
        if prompt is not None and not isinstance(prompt, str):
            raise ValueError("initial_prompt: token ids are not supported, give the text")
        temps = a["temperature"]
        temps = list(temps) if isinstance(temps, (list, tuple)) else [temps]
        if batched:
            temps = temps[:1]
        suppress = a["suppress_tokens"]
        resolved = self._suppressed(suppress) if suppress else suppress
        options = TranscriptionOptions(
            beam_size=a["beam_size"], best_of=a["best_of"], patience=a["patience"],
            length_penalty=a["length_penalty"], repetition_penalty=a["repetition_penalty"],
            no_repeat_ngram_size=a["no_repeat_ngram_size"],
            log_prob_threshold=a["log_prob_threshold"],
            no_speech_threshold=a["no_speech_threshold"],
            compression_ratio_threshold=a["compression_ratio_threshold"],
            condition_on_previous_text=False if batched else a["condition_on_previous_text"],
            prompt_reset_on_temperature=(0.5 if batched else
                                         a["prompt_reset_on_temperature"]),
            temperatures=temps, initial_prompt=prompt, prefix=a["prefix"],
            suppress_blank=a["suppress_blank"], suppress_tokens=resolved,
            without_timestamps=a["without_timestamps"],
            max_initial_timestamp=0.0 if batched else a["max_initial_timestamp"],
            word_timestamps=a["word_timestamps"],
            prepend_punctuations=a["prepend_punctuations"],
            append_punctuations=a["append_punctuations"], multilingual=multilingual,
            max_new_tokens=a["max_new_tokens"], clip_timestamps=a["clip_timestamps"],
            hallucination_silence_threshold=a["hallucination_silence_threshold"],
            hotwords=a["hotwords"])
        common = dict(language=language, task=a["task"], beam_size=a["beam_size"],
                      best_of=a["best_of"], length_penalty=a["length_penalty"],
                      temperature=tuple(temps), initial_prompt=prompt,
                      suppress_blank=a["suppress_blank"],
                      suppress_tokens=list(resolved or ()),
                      without_timestamps=a["without_timestamps"],
                      max_new_tokens=self._max_new_tokens(a["max_new_tokens"]),
                      beam_rule="ctranslate2", hotwords=a["hotwords"],
                      prefix=None if batched else a["prefix"],
                      language_detection_segments=a["language_detection_segments"],
                      language_detection_threshold=a["language_detection_threshold"],
                      repetition_penalty=a["repetition_penalty"],
                      no_repeat_ngram_size=a["no_repeat_ngram_size"])
        if not batched:
            common.update(multilingual=multilingual,
                          max_initial_timestamp=a["max_initial_timestamp"])
        return common, options

    def _max_new_tokens(self, value):
        """Transcriber's max_new_tokens of faster-whisper's: by default CTranslate2's limit,
        at most half the decoder's positions a window (``max_length / 2`` = 224 new tokens;
        transformers' rule, Transcriber's default, lets a window that repeats itself run to
        the last position, twice the decoding before the fallback rejects it)."""
        if value is None:
            return self.transcriber.model.max_decoder_positions // 2
        return value

    def _suppressed(self, tokens):
        """faster-whisper's suppress list: -1 stands for the non-speech symbols (the folder's
        suppress list, which Whisper's converters write from the same rule), and the task,
        start and no-speech tokens are always added (Whisper's vocabulary puts translate,
        transcribe, startoflm, startofprev, nospeech just before notimestamps)."""
        tr = self.transcriber
        if isinstance(tokens, (str, bytes)) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise TypeError(f"suppress_tokens must be a list of token ids, got {tokens!r}")
        ids = {t for t in tokens if t >= 0}
        if -1 in tokens:
            ids.update(tr.model.generation_config.get("suppress_tokens") or ())
        ids.update(range(tr.no_timestamps - 5, tr.no_timestamps))
        ids.add(tr.sot)
        return tuple(sorted(ids))


def _samples(audio):
    """load_audio's samples; an empty array is empty audio (faster-whisper transcribes it to
    nothing)."""
    if isinstance(audio, np.ndarray) and audio.size == 0:
        return np.zeros(0, np.float32)
    return load_audio(audio)


def _clips(clip_timestamps, n_samples):
    """faster-whisper's clip_timestamps ("start,end,..." seconds, or a list of them; the last
    end defaults to the end) -> (the seconds, [(start_frame, end_frame)] or None for the whole
    file)."""
    if isinstance(clip_timestamps, str):
        try:
            points = [float(t) for t in clip_timestamps.split(",")] if clip_timestamps else []
        except ValueError:
            raise ValueError(f"clip_timestamps={clip_timestamps!r}: comma-separated seconds "
                             "start,end,start,end,...") from None
    elif isinstance(clip_timestamps, (list, tuple)):
        points = clip_timestamps
    else:
        raise TypeError(f"clip_timestamps must be a string or a list of seconds, got "
                        f"{type(clip_timestamps).__name__}")
    frames = -(-n_samples // HOP_LENGTH)
    try:
        seeks = [round(float(t) * SAMPLE_RATE / HOP_LENGTH) for t in points] or [0]
    except (TypeError, ValueError):
        raise TypeError(f"clip_timestamps must hold seconds, got {clip_timestamps!r}") from None
    if len(seeks) % 2:
        seeks.append(frames)
    clips = [(a, min(b, frames)) for a, b in zip(seeks[::2], seeks[1::2])]
    if clips == [(0, frames)]:
        return points, None
    clips = [(a, b) for a, b in clips if a < b]
    if not clips and n_samples:
        raise ValueError(f"clip_timestamps={clip_timestamps!r} selects no audio")
    return points, clips


def _vad(vad_parameters, window_s):
    """faster-whisper's VAD options: a VadOptions (fastattn's, or faster-whisper's converted
    field by field), a dict of its fields, or None; batched (`window_s`): at most one window
    per stretch, and by default split at pauses of 160 ms."""
    if vad_parameters is None:
        return VadOptions() if window_s is None else VadOptions(
            max_speech_duration_s=window_s, min_silence_duration_ms=160)
    if dataclasses.is_dataclass(vad_parameters) and not isinstance(vad_parameters, type):
        vad_parameters = dataclasses.asdict(vad_parameters)
        if window_s is not None:
            vad_parameters["max_speech_duration_s"] = min(
                vad_parameters["max_speech_duration_s"], window_s)
        return VadOptions(**vad_parameters)
    if not isinstance(vad_parameters, dict):
        raise TypeError(f"vad_parameters must be a dict or a VadOptions, got "
                        f"{type(vad_parameters).__name__}")
    d = dict(vad_parameters)
    if window_s is not None:
        d["max_speech_duration_s"] = window_s
    try:
        return VadOptions(**d)
    except TypeError as exc:
        raise TypeError(f"vad_parameters: {exc}") from None


def _info(stream, duration, after_vad, options, vad_options):
    return TranscriptionInfo(language=stream.language,
                             language_probability=stream.language_probability,
                             duration=duration, duration_after_vad=after_vad,
                             all_language_probs=stream.all_language_probs,
                             transcription_options=options, vad_options=vad_options)


def _empty_info(tr, language, options, vad_options):
    """The info of audio without samples (faster-whisper transcribes it to nothing; a
    multilingual model's language is detected on silence, as there)."""
    probs = None
    if language is None:
        if tr.is_multilingual:
            probs = tr.detect_language(np.zeros(HOP_LENGTH, np.float32))
            language, p = probs[0]
        else:
            language, p = "en", 1
    else:
        p = 1
    return TranscriptionInfo(language=language, language_probability=p, duration=0.0,
                             duration_after_vad=0.0, all_language_probs=probs,
                             transcription_options=options, vad_options=vad_options)


def _segments(streams, round_to):
    """faster-whisper's Segments of Transcriber streams, each (stream, first frame in the
    file): ids from 1, times and seeks offset to the file."""
    sid = 0
    for stream, frame0 in streams:
        offset = frame0 * HOP_LENGTH / SAMPLE_RATE
        for s in stream:
            sid += 1
            start, end = s.start + offset, s.end + offset
            if round_to is not None:
                start, end = round(start, round_to), round(end, round_to)
            words = None
            if s.words is not None:
                words = [Word(start=round(w.start + offset, 2), end=round(w.end + offset, 2),
                              word=w.word, probability=w.probability) for w in s.words]
            yield Segment(id=sid, seek=s.seek + frame0, start=start, end=end, text=s.text,
                          tokens=list(s.tokens), avg_logprob=s.avg_logprob,
                          compression_ratio=s.compression_ratio,
                          no_speech_prob=s.no_speech_prob, words=words,
                          temperature=s.temperature)


def _progress(segments, duration):
    try:
        from tqdm import tqdm
    except ImportError:
        raise ValueError("log_progress=True needs tqdm (pip install tqdm)") from None
    bar = tqdm(total=duration, unit="seconds")
    done = 0.0
    for s in segments:
        bar.update(max(0.0, min(s.end, duration) - done))
        done = max(done, min(s.end, duration))
        yield s
    bar.update(max(0.0, duration - done))
    bar.close()


class BatchedInferencePipeline:
    """faster-whisper's batched pipeline: the speech stretches (voice-activity detection)
    grouped into windows of at most 30 s, ``batch_size`` windows decoded at once
    (Transcriber's ``batch_size``)."""

    def __init__(self, model):
        if not isinstance(model, WhisperModel):
            raise TypeError(f"model must be a fastattn.compat.faster_whisper.WhisperModel, got "
                            f"{type(model).__name__}")
        self.model = model

    def transcribe(self, audio, language=None, task="transcribe", log_progress=False,
                   beam_size=5, best_of=5, patience=1, length_penalty=1, repetition_penalty=1,
                   no_repeat_ngram_size=0, temperature=_TEMPERATURES,
                   compression_ratio_threshold=2.4, log_prob_threshold=-1.0,
                   no_speech_threshold=0.6, condition_on_previous_text=True,
                   prompt_reset_on_temperature=0.5, initial_prompt=None, prefix=None,
                   suppress_blank=True, suppress_tokens=[-1], without_timestamps=True,
                   max_initial_timestamp=1.0, word_timestamps=False,
                   prepend_punctuations=PREPEND_PUNCTUATIONS,
                   append_punctuations=APPEND_PUNCTUATIONS, multilingual=False,
                   vad_filter=True, vad_parameters=None, max_new_tokens=None,
                   chunk_length=None, clip_timestamps=None, hallucination_silence_threshold=None,
                   batch_size=8, hotwords=None, language_detection_threshold=0.5,
                   language_detection_segments=1):
        """``(segments, info)`` as :meth:`WhisperModel.transcribe`, batched."""
        args = dict(locals())
        del args["self"], args["audio"]
        args["hallucination_silence_threshold"] = None       # unused here, as there
        model = self.model
        common, options = model._common(args, batched=True)
        if not vad_filter:
            raise ValueError("vad_filter=False is not supported: the batched windows are cut "
                             "at the speech stretches")
        if clip_timestamps:
            raise ValueError("clip_timestamps is not supported by the batched pipeline")
        if word_timestamps:
            raise ValueError("word_timestamps=True is not supported by the batched pipeline "
                             "(WhisperModel.transcribe(..., vad_filter=True) has them)")
        tr = model.transcriber
        vad = _vad(vad_parameters, tr.n_frames * HOP_LENGTH / SAMPLE_RATE)
        # the thresholds and the conditioning do not apply to batched windows (faster-whisper
        # ignores them there)
        samples = _samples(audio)
        if samples.size == 0:
            return iter(()), _empty_info(tr, common["language"], options, vad)
        stream = tr.stream(samples, batch_size=batch_size, vad_filter=True,
                           vad_parameters=vad, condition_on_previous_text=False,
                           compression_ratio_threshold=None, log_prob_threshold=None,
                           no_speech_threshold=None, **common)
        info = _info(stream, stream.duration, stream.duration_after_vad, options, vad)
        segments = _segments([(stream, 0)], round_to=3)
        if log_progress:
            segments = _progress(segments, info.duration)
        return segments, info
