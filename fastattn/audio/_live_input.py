"""The input side of :mod:`fastattn.audio.live`: chunks checked and converted, resampled to
16 kHz in fixed blocks, and a voice-activity detector run frame by frame as audio arrives."""
from numbers import Integral

import numpy as np

from .features import SAMPLE_RATE


def _as_samples(samples, sample_rate):
    """A chunk -> 1-D float32 (not yet resampled), with errors naming the argument."""
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, Integral):
        raise ValueError(f"sample_rate must be a positive whole number of Hz, got "
                         f"{sample_rate!r}")
    if not 1000 <= sample_rate <= 384000:
        raise ValueError(f"sample_rate must be between 1000 and 384000 Hz, got {sample_rate}")
    if isinstance(samples, (bytes, bytearray, memoryview)):
        if len(samples) % 2:
            raise ValueError("samples: bytes are 16-bit PCM and need an even length, got "
                             f"{len(samples)}")
        samples = np.frombuffer(bytes(samples), "<i2")
    if isinstance(samples, (str, dict)) or samples is None:
        raise TypeError(f"samples must be an array of audio samples, got "
                        f"{type(samples).__name__}")
    try:
        arr = np.asarray(samples)
    except Exception as exc:
        raise TypeError(f"samples could not be converted to an array: {exc}") from None
    if arr.dtype == np.int16:
        arr = arr.astype(np.float32) * np.float32(1 / 32768)
    elif arr.dtype.kind == "f" and arr.dtype.itemsize <= 8:
        arr = arr.astype(np.float32, copy=False)
    else:
        raise ValueError(f"samples must hold float32 (or float16/64) or int16 samples, got "
                         f"dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"samples must be 1-D (mono), got shape {arr.shape}")
    if arr.size and not np.isfinite(arr).all():
        raise ValueError("samples contain NaN or infinity")
    return arr


class _Resampler:
    """A stream at `rate` Hz -> 16 kHz with FFmpeg's resampler (as :func:`load_audio`), fed
    in blocks of 0.1 s whatever the chunks: the output depends on the samples alone."""

    def __init__(self, rate):
        from .decode import _require
        self.av = _require("av", f"resampling live audio from {rate} Hz to {SAMPLE_RATE} Hz")
        from av.audio.resampler import AudioResampler
        self.rate, self.block = rate, max(1, rate // 10)
        self.r = AudioResampler(format="fltp", layout="mono", rate=SAMPLE_RATE)
        self.pending = np.zeros(0, np.float32)

    def _run(self, frame):
        return [o.to_ndarray().reshape(-1).astype(np.float32) for o in self.r.resample(frame)]

    def _frame(self, x):
        frame = self.av.AudioFrame.from_ndarray(np.ascontiguousarray(x[None]), format="fltp",
                                                layout="mono")
        frame.sample_rate = self.rate
        return frame

    def push(self, x, flush=False):
        x = np.concatenate([self.pending, x]) if self.pending.size else x
        n = x.size // self.block * self.block
        out = []
        for i in range(0, n, self.block):
            out += self._run(self._frame(x[i:i + self.block]))
        self.pending = x[n:].copy()
        if flush:
            if self.pending.size:
                out += self._run(self._frame(self.pending))
            out += self._run(None)
            self.pending = np.zeros(0, np.float32)
        return np.concatenate(out) if out else np.zeros(0, np.float32)


class _StreamVad:
    """Speech probabilities frame by frame as audio arrives: Silero (512-sample frames, the
    64 samples before each as context, its recurrent state carried on) or WebRTC (10 ms
    frames, aggressiveness 3: 1.0 or 0.0)."""

    def __init__(self, kind):
        from . import vad
        self.kind = kind
        if kind == "silero":
            self.sess = vad._session(vad._SEQUENCE_MODEL)
            self.frame = vad._FRAME
            self.h = np.zeros((1, 1, 128), np.float32)
            self.c = np.zeros((1, 1, 128), np.float32)
            self.ctx = np.zeros(vad._CONTEXT, np.float32)
        else:
            from .._deps import require
            webrtcvad = require("webrtcvad", 'vad="webrtc"', extra="vad")
            self.v = webrtcvad.Vad(3)
            self.frame = SAMPLE_RATE // 100
        self.pending = np.zeros(0, np.float32)
        self.pos = 0                           # the next frame's first sample

    def push(self, x):
        """(the first sample of the first frame, the probabilities of the frames `x`
        completes (float32))."""
        x = np.concatenate([self.pending, x])
        n = x.size // self.frame
        self.pending = x[n * self.frame:].copy()
        first = self.pos
        self.pos += n * self.frame
        if n == 0:
            return first, np.zeros(0, np.float32)
        body = x[:n * self.frame]
        if self.kind == "webrtc":
            pcm = np.clip(np.round(body * 32767.0), -32768, 32767).astype(np.int16).tobytes()
            step = 2 * self.frame
            return first, np.array([self.v.is_speech(pcm[i * step:(i + 1) * step],
                                                     SAMPLE_RATE) for i in range(n)],
                                   np.float32)
        full = np.concatenate([self.ctx, body])
        c = self.ctx.size
        idx = np.arange(n)[:, None] * self.frame + np.arange(self.frame + c)[None, :]
        frames = full[idx]
        self.ctx = body[-c:].copy()
        out = []
        for b in range(0, n, 512):
            probs, self.h, self.c = self.sess.run(
                ["speech_probs", "hn", "cn"], {"input": frames[b:b + 512], "h": self.h,
                                               "c": self.c})
            out.append(np.asarray(probs, np.float32).reshape(-1))
        return first, np.concatenate(out)


