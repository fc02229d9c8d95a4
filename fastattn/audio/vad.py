"""Voice-activity detection: where the speech is, with Silero VAD (its ONNX model, run by
ONNX Runtime; no torch) or WebRTC's VAD.

Silero's model file comes from the ``silero-vad`` package (its ``data/silero_vad.onnx``;
fastattn reads the file and never imports the package, whose Python side needs torch: ``pip
install --no-deps silero-vad onnxruntime`` is enough); WebRTC's from ``webrtcvad-wheels``
(``pip install "fastattn[vad]"``). Silero gives a speech probability per 32 ms frame (512
samples at 16 kHz, with the 64 samples before it as context and a recurrent state carried from
frame to frame); :func:`speech_timestamps` turns the probabilities into speech stretches with
Silero's rules (a stretch opens at ``threshold``, closes after ``min_silence_duration_ms``
under ``threshold - 0.15``, is split at a pause before it exceeds ``max_speech_duration_s``, is
dropped under ``min_speech_duration_ms``, and is padded by ``speech_pad_ms`` on each side).
:func:`collect_chunks` groups stretches into windows of at most 30 s for batched decoding, and
:class:`TimeMap` maps times in the speech-only audio back to the file's.
"""
import bisect
import os
from dataclasses import dataclass

import numpy as np

from .._deps import require

__all__ = ["VadOptions", "speech_probabilities", "speech_timestamps", "collect_chunks",
           "TimeMap"]

SAMPLE_RATE = 16000
_FRAME = 512
_CONTEXT = 64


@dataclass(frozen=True)
class VadOptions:
    """Silero's parameters (faster-whisper's defaults for ``vad_filter=True``)."""
    threshold: float = 0.5
    neg_threshold: float = None            # default threshold - 0.15 (at least 0.01)
    min_speech_duration_ms: int = 0
    max_speech_duration_s: float = float("inf")
    min_silence_duration_ms: int = 2000
    speech_pad_ms: int = 400

    def __post_init__(self):
        for name in ("threshold", "min_speech_duration_ms", "max_speech_duration_s",
                     "min_silence_duration_ms", "speech_pad_ms"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0:
                raise ValueError(f"vad_parameters: {name} must be a number >= 0, got {v!r}")
        if not 0 < self.threshold < 1:
            raise ValueError(f"vad_parameters: threshold must be in (0, 1), got "
                             f"{self.threshold!r}")


def _model_path(name):
    import importlib.util
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError('vad_model="silero" needs the silero-vad package (its ONNX model '
                          'file; fastattn runs it with onnxruntime, without torch): pip install '
                          'silero-vad onnxruntime, or pip install --no-deps silero-vad; or use '
                          'vad_model="webrtc" (pip install "fastattn[vad]")')
    path = os.path.join(list(spec.submodule_search_locations)[0], "data", name)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"the silero-vad package has no {path}")
    return path


_SESSIONS = {}
_SEQUENCE_MODEL = "silero_vad_16k_sequence.onnx"      # frames in, probabilities out, one call
_FRAME_MODEL = "silero_vad.onnx"                      # one frame a call (the reference)
_BLOCK = 512                                           # frames per call of the sequence model


def _session(name):
    if name not in _SESSIONS:
        path = _model_path(name)
        ort = require("onnxruntime", 'vad_model="silero"', extra="vad")
        opts = ort.SessionOptions()
        opts.inter_op_num_threads = 1
        opts.intra_op_num_threads = 1
        opts.log_severity_level = 3                    # the files' unused-initializer notes
        _SESSIONS[name] = ort.InferenceSession(path, sess_options=opts,
                                               providers=["CPUExecutionProvider"])
    return _SESSIONS[name]


def _frames(audio):
    """(n, 576) float32: frame i is samples [512 i - 64, 512 i + 512) (zeros before the start and
    after the end): the 64 samples before a frame are its context."""
    n = -(-audio.size // _FRAME)
    padded = np.zeros(n * _FRAME + _CONTEXT, np.float32)
    padded[_CONTEXT:_CONTEXT + audio.size] = audio
    idx = np.arange(n)[:, None] * _FRAME + np.arange(_FRAME + _CONTEXT)[None, :]
    return padded[idx]


def _silero_probabilities(audio, per_frame=False):
    """Silero's probabilities: the sequence model over blocks of 512 frames, its LSTM state
    carried from block to block (per_frame: the one-frame-a-call model, the same numbers
    within float rounding)."""
    frames = _frames(audio)
    if per_frame:
        sess = _session(_FRAME_MODEL)
        state = np.zeros((2, 1, 128), np.float32)
        sr = np.array(SAMPLE_RATE, np.int64)
        out = np.empty(len(frames), np.float32)
        for i, x in enumerate(frames):
            prob, state = sess.run(None, {"input": x[None], "state": state, "sr": sr})
            out[i] = prob.reshape(-1)[0]
        return out
    sess = _session(_SEQUENCE_MODEL)
    h = np.zeros((1, 1, 128), np.float32)
    c = np.zeros((1, 1, 128), np.float32)
    out = []
    for b in range(0, len(frames), _BLOCK):
        probs, h, c = sess.run(["speech_probs", "hn", "cn"],
                               {"input": frames[b:b + _BLOCK], "h": h, "c": c})
        out.append(np.asarray(probs, np.float32).reshape(-1))
    return np.concatenate(out) if out else np.zeros(0, np.float32)


def _webrtc_probabilities(audio, mode=3):
    webrtcvad = require("webrtcvad", 'vad_model="webrtc"', extra="vad")
    vad = webrtcvad.Vad(mode)
    step = SAMPLE_RATE // 100                           # 10 ms frames
    n10 = -(-audio.size // step)
    pcm = np.zeros(n10 * step, np.int16)
    pcm[:audio.size] = np.clip(np.round(audio * 32767.0), -32768, 32767).astype(np.int16)
    raw = pcm.tobytes()
    flags = np.array([vad.is_speech(raw[2 * i * step:2 * (i + 1) * step], SAMPLE_RATE)
                      for i in range(n10)], np.float32)
    # a 512-sample frame's probability: the share of its samples in 10-ms frames marked speech
    per_sample = np.repeat(flags, step)
    n = -(-audio.size // _FRAME)
    per_sample = np.concatenate([per_sample, np.zeros(n * _FRAME - per_sample.size + _FRAME,
                                                      np.float32)])[:n * _FRAME]
    return per_sample.reshape(n, _FRAME).mean(axis=1)


def speech_probabilities(audio, model="silero"):
    """The speech probability of each 512-sample frame of 16 kHz `audio` (the last frame
    zero-padded), float32 (frames,). model: "silero" (Silero VAD's ONNX model) or "webrtc"
    (WebRTC's VAD, aggressiveness 3: the share of each frame's 10-ms frames it calls
    speech)."""
    audio = np.asarray(audio, np.float32)
    if model == "silero":
        return _silero_probabilities(audio)
    if model == "webrtc":
        return _webrtc_probabilities(audio)
    raise ValueError(f"vad_model must be 'silero' or 'webrtc', got {model!r}")


def speech_timestamps(audio, options=None, probs=None, model="silero"):
    """[(start, end)] sample indices of the speech in 16 kHz `audio` (Silero's rules with
    `options`, a :class:`VadOptions`, over :func:`speech_probabilities`)."""
    o = options or VadOptions()
    if probs is None:
        probs = speech_probabilities(audio, model)
    n_samples = len(audio)
    neg = o.neg_threshold if o.neg_threshold is not None else max(o.threshold - 0.15, 0.01)
    ms = SAMPLE_RATE / 1000
    min_speech = ms * o.min_speech_duration_ms
    pad = int(ms * o.speech_pad_ms)
    max_speech = SAMPLE_RATE * o.max_speech_duration_s - _FRAME - 2 * pad
    min_silence = ms * o.min_silence_duration_ms
    min_silence_at_max = ms * 98
    out = []
    speaking, start = False, 0
    temp_end = prev_end = next_start = 0
    for i, p in enumerate(probs):
        pos = _FRAME * i
        if p >= o.threshold and temp_end:
            temp_end = 0
            if next_start < prev_end:
                next_start = pos
        if p >= o.threshold and not speaking:
            speaking, start = True, pos
            continue
        if speaking and pos - start > max_speech:
            # too long: close at the last long-enough pause, else here
            if prev_end:
                out.append([start, prev_end])
                if next_start < prev_end:
                    speaking = False
                else:
                    start = next_start
            else:
                out.append([start, pos])
                speaking = False
            prev_end = next_start = temp_end = 0
            continue
        if p < neg and speaking:
            if not temp_end:
                temp_end = pos
            if pos - temp_end > min_silence_at_max:
                prev_end = temp_end
            if pos - temp_end < min_silence:
                continue
            if temp_end - start > min_speech:
                out.append([start, temp_end])
            prev_end = next_start = temp_end = 0
            speaking = False
    if speaking and n_samples - start > min_speech:
        out.append([start, n_samples])
    for i, s in enumerate(out):
        if i == 0:
            s[0] = max(0, s[0] - pad)
        if i + 1 < len(out):
            gap = out[i + 1][0] - s[1]
            if gap < 2 * pad:
                s[1] += gap // 2
                out[i + 1][0] = max(0, out[i + 1][0] - gap // 2)
            else:
                s[1] = min(n_samples, s[1] + pad)
                out[i + 1][0] = max(0, out[i + 1][0] - pad)
        else:
            s[1] = min(n_samples, s[1] + pad)
    return [(int(a), int(b)) for a, b in out if b > a]


def collect_chunks(stretches, max_samples):
    """Group consecutive speech stretches into chunks of at most `max_samples` samples of
    speech (a longer stretch is a chunk alone, cut into pieces of max_samples): a list of
    lists of (start, end)."""
    chunks, cur, total = [], [], 0
    for a, b in stretches:
        while b - a > max_samples:                    # cannot happen with max_speech set
            if cur:
                chunks.append(cur)
                cur, total = [], 0
            chunks.append([(a, a + max_samples)])
            a += max_samples
        if cur and total + (b - a) > max_samples:
            chunks.append(cur)
            cur, total = [], 0
        cur.append((a, b))
        total += b - a
    if cur:
        chunks.append(cur)
    return chunks


class TimeMap:
    """Seconds in the speech-only audio (the stretches concatenated) -> seconds in the file."""

    def __init__(self, stretches, sampling_rate=SAMPLE_RATE):
        self.sr = sampling_rate
        self.orig = [a for a, _ in stretches]
        self.cum = np.concatenate([[0], np.cumsum([b - a for a, b in stretches])]).tolist()

    def __call__(self, seconds, is_end=False):
        s = seconds * self.sr
        i = (bisect.bisect_left if is_end else bisect.bisect_right)(self.cum, s) - 1
        i = min(max(i, 0), len(self.orig) - 1)
        return (self.orig[i] + s - self.cum[i]) / self.sr
