"""Whisper's log-mel spectrogram: the features ``transformers.WhisperFeatureExtractor`` computes.

The pipeline, for each clip (a 1-D float32 waveform at 16 kHz):

1. truncate to ``chunk_length`` seconds (``truncation=True``), optionally normalise to zero mean
   and unit variance over the clip's own samples (``do_normalize``), then pad with zeros to
   ``chunk_length`` seconds (``padding="max_length"``) or to the longest clip of the batch
   (``padding="longest"``);
2. reflect-pad ``n_fft // 2`` samples at both ends (``torch.stft(center=True)``) and take frames
   of ``n_fft`` samples every ``hop_length`` samples, keeping ``L // hop_length`` of them (the
   STFT's last frame is dropped, as Whisper does);
3. power spectrum of each frame under a periodic Hann window, ``n_fft // 2 + 1`` bins;
4. Slaney mel filter bank (:func:`mel_filters`), ``log10(max(mel, 1e-10))``, floor each clip at
   its own maximum minus 8, then ``(x + 4) / 4``.

Step 3 is a real DFT written as two matrix products on fastattn's GEMM (no FFT). The periodic
Hann window is symmetric (``w[n] == w[N - n]``), and so are the cosines, so the frame is folded
first: with ``s[n] = x[n] + x[N - n]`` and ``d[n] = x[n] - x[N - n]`` (n = 1 .. N/2 - 1), the
real part of bin k is ``sum_n w[n] s[n] cos(2 pi k n / N)`` over ``x[0], s, x[N/2]`` and the
imaginary part ``-sum_n w[n] d[n] sin(2 pi k n / N)``. That is half the multiply-adds of a
plain DFT-by-matrix (400 x 201 per frame instead of 400 x 402); the window is folded into the
matrices. The mel projection is a third GEMM.
"""
import functools
import math
from numbers import Integral

import numpy as np

from .._kernels import _qgemm as _qg
from .._memory import check_plan
from .._threads import _effective_n_threads

__all__ = ["log_mel_spectrogram", "mel_filters", "hz_to_mel", "mel_to_hz", "SAMPLE_RATE",
           "N_FFT", "HOP_LENGTH", "CHUNK_LENGTH", "N_SAMPLES", "N_FRAMES"]

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_LENGTH = 30                       # seconds in one Whisper window
N_SAMPLES = CHUNK_LENGTH * SAMPLE_RATE  # 480000
N_FRAMES = N_SAMPLES // HOP_LENGTH      # 3000 feature frames per window

# Slaney's mel scale (the Auditory Toolbox; librosa's htk=False): linear, 3 mels every 200 Hz,
# up to 1 kHz (15 mels), logarithmic above it with 27 mels per factor 6.4.
_BREAK_HZ = 1000.0
_BREAK_MEL = 15.0
_HZ_PER_MEL = 200.0 / 3.0
_MELS_PER_LOG_UNIT = 27.0 / 1.8562979903656263      # 27 / ln 6.4 (a constant: no libm)


# --- The same bits on every CPU. The features are portable: NumPy's exp / log / cos / sin (and
# libm's) may differ in the last place between CPUs (SIMD builds, libms), so the tables and the
# log below use these, made of + - * / and exact steps (frexp, ldexp, rint, integer arithmetic)
# in a fixed order, accurate to a few ulp of float64; the DFT and the filterbank run the
# portable float GEMM (_qgemm.gemm_f32_portable: sums in order, nothing fused). An int8 Whisper
# model then gives the same transcript bits on x86-64 and AArch64 (docs/int8.md).
_LN2_HI, _LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10


def _det_exp(x):
    """exp(x) for float64 arrays (|x| < 700)."""
    x = np.asarray(x, dtype=np.float64)
    k = np.rint(x * 1.4426950408889634)
    r = (x - k * _LN2_HI) - k * _LN2_LO
    p = np.full_like(r, 1.0 / math.factorial(14))
    for i in range(13, -1, -1):                                   # Horner: sum r^i / i!
        p = p * r + 1.0 / math.factorial(i)
    return np.ldexp(p, k.astype(np.int64))


def _det_log(x):
    """log(x) for positive finite float64 arrays: x = m 2^e with m in [sqrt(1/2), sqrt(2)),
    log m = 2 atanh((m - 1) / (m + 1)) by its series (|s| <= 0.172: 12 terms)."""
    m, e = np.frexp(np.asarray(x, dtype=np.float64))
    low = m < 0.7071067811865476
    m = np.where(low, m * 2.0, m)
    e = np.where(low, e - 1, e).astype(np.float64)
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    p = np.full_like(s, 1.0 / 23.0)
    for n in range(21, 0, -2):
        p = p * s2 + 1.0 / n
    return (2.0 * s * p + e * _LN2_LO) + e * _LN2_HI


def _sincos_2pi(j, n):
    """(sin, cos) of 2 pi j / n for integer arrays j: the octant found in integers, the angle
    within it in [0, pi/4] by one rounding, Taylor series to the 19th power."""
    q = 8 * (np.asarray(j, dtype=np.int64) % n)
    octant, r = q // n, q % n
    odd = octant % 2 == 1
    x = np.where(odd, n - r, r).astype(np.float64) * (math.pi / (4.0 * n))
    x2 = x * x
    sp = np.full_like(x, -1.0 / math.factorial(19))
    cp = np.full_like(x, -1.0 / math.factorial(18))
    for t in range(17, 0, -2):
        sp = sp * x2 + (-1.0) ** (t // 2) / math.factorial(t)
    for t in range(16, -1, -2):
        cp = cp * x2 + (-1.0) ** (t // 2) / math.factorial(t)
    sn, cs = sp * x, cp
    # octant o: the angle is o pi/4 + x (even o) or (o + 1) pi/4 - x (odd o)
    sin_t = np.select([octant == 0, octant == 1, octant == 2, octant == 3, octant == 4,
                       octant == 5, octant == 6], [sn, cs, cs, sn, -sn, -cs, -cs], -sn)
    cos_t = np.select([octant == 0, octant == 1, octant == 2, octant == 3, octant == 4,
                       octant == 5, octant == 6], [cs, sn, -sn, -cs, -cs, -sn, sn], cs)
    return sin_t, cos_t


def hz_to_mel(freq):
    """Frequency in Hz to Slaney mels (float or ndarray)."""
    f = np.asarray(freq, dtype=np.float64)
    above = _BREAK_MEL + _det_log(np.maximum(f, _BREAK_HZ) / _BREAK_HZ) * _MELS_PER_LOG_UNIT
    mel = np.where(f >= _BREAK_HZ, above, f / _HZ_PER_MEL)
    return mel if mel.ndim else float(mel)


def mel_to_hz(mel):
    """Slaney mels to Hz, the inverse of :func:`hz_to_mel`."""
    m = np.asarray(mel, dtype=np.float64)
    above = _BREAK_HZ * _det_exp((np.maximum(m, _BREAK_MEL) - _BREAK_MEL) / _MELS_PER_LOG_UNIT)
    freq = np.where(m >= _BREAK_MEL, above, m * _HZ_PER_MEL)
    return freq if freq.ndim else float(freq)


def _positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return int(value)


def mel_filters(n_mels=80, *, n_fft=N_FFT, sampling_rate=SAMPLE_RATE, f_min=0.0, f_max=None,
                dtype=np.float64):
    """Whisper's mel filter bank: ``n_mels`` triangles on the Slaney mel scale, Slaney area norm.

    Filter m rises linearly from edge ``f[m]`` to a peak at ``f[m + 1]`` and falls back to zero
    at ``f[m + 2]``, where ``f`` are ``n_mels + 2`` frequencies equally spaced in mels from
    ``f_min`` to ``f_max`` (default ``sampling_rate / 2``); it is sampled at the DFT bins
    ``k * sampling_rate / n_fft`` and scaled by ``2 / (f[m + 2] - f[m])`` so that every filter
    has the same area (constant energy per channel).

    Returns
    -------
    ndarray, shape (n_mels, n_fft // 2 + 1), `dtype`
        ``mel_spectrum = filters @ power_spectrum``; the transpose of transformers'
        ``mel_filter_bank(n_fft // 2 + 1, n_mels, 0, 8000, 16000, "slaney", "slaney")``.
    """
    n_mels = _positive_int(n_mels, "n_mels")
    n_fft = _positive_int(n_fft, "n_fft")
    sampling_rate = _positive_int(sampling_rate, "sampling_rate")
    f_max = sampling_rate / 2 if f_max is None else float(f_max)
    f_min = float(f_min)
    if not 0.0 <= f_min < f_max:
        raise ValueError(f"need 0 <= f_min < f_max, got f_min={f_min}, f_max={f_max}")
    edges = mel_to_hz(np.linspace(hz_to_mel(f_min), hz_to_mel(f_max), n_mels + 2))
    bins = np.arange(n_fft // 2 + 1) * (sampling_rate / n_fft)
    lower, center, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins - lower) / (center - lower)
    falling = (upper - bins) / (upper - center)
    tri = np.clip(np.minimum(rising, falling), 0.0, None)
    return (tri * (2.0 / (upper - lower))).astype(dtype)


class _PortableLinear:
    """x @ w.T by the portable float GEMM (the same bits on every CPU), packed once per panel
    width (the int8 variant in use decides it; a forced variant may change it)."""

    def __init__(self, w):
        self.w = np.ascontiguousarray(w, dtype=np.float32)
        self._packed = {}

    def __call__(self, x):
        nr = _qg.portable_panel_width()
        if nr not in self._packed:
            self._packed[nr] = _qg.pack_f32_portable(self.w)[0]
        N, K = self.w.shape
        if N == 0 or K == 0 or x.size == 0:
            return np.zeros(x.shape[:-1] + (N,), np.float32)
        x2 = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, K)
        y = np.empty((x2.shape[0], N), np.float32)
        _qg.gemm_f32_portable(x2, self._packed[nr], nr, N, y, _effective_n_threads(None))
        return y.reshape(x.shape[:-1] + (N,))


class _Frontend:
    """The packed matrices for one (n_fft, n_mels, sampling_rate): built once, then cached."""

    def __init__(self, n_fft, n_mels, sampling_rate):
        self.n_fft = n_fft
        self.half = (n_fft + 1) // 2          # pairs (n, N - n) are n = 1 .. half - 1
        self.even = n_fft % 2 == 0            # x[N/2] stands alone
        n = np.arange(n_fft)
        window = 0.5 - 0.5 * _sincos_2pi(n, n_fft)[1]          # periodic Hann (torch's default)
        k = np.arange(n_fft // 2 + 1)
        cos_n = np.arange(self.half + self.even)                # x[0], s[1..half-1], (x[N/2])
        cos_w = _sincos_2pi(np.outer(k, cos_n), n_fft)[1] * window[cos_n]
        sin_n = np.arange(1, self.half)
        sin_k = np.arange(1, self.half)       # bins 0 and N/2 have no imaginary part
        sin_w = -_sincos_2pi(np.outer(sin_k, sin_n), n_fft)[0] * window[sin_n]
        self.cos = _PortableLinear(cos_w.astype(np.float32))     # (bins, half + even)
        self.sin = _PortableLinear(sin_w.astype(np.float32))     # (half - 1, half - 1)
        self.mel = _PortableLinear(mel_filters(n_mels, n_fft=n_fft, sampling_rate=sampling_rate,
                                               dtype=np.float32))

    def power_spectrum(self, padded, hop_length, n_frames):
        """Rows of `padded` (batch, samples), float32, C-contiguous -> the power spectra of
        their `n_frames` frames every `hop_length` samples: (batch, n_frames, n_fft // 2 + 1)."""
        n_fft, h = self.n_fft, self.half
        batch, width = padded.shape
        item = padded.itemsize
        frames = _strided(padded, (batch, n_frames, h + self.even),
                          (width * item, hop_length * item, item))
        # x[N - n] for n = 1 .. h - 1 read forwards: frame t of the reversed rows starts
        # (t * hop + N - 1) samples from the row's end and walks towards its start
        reverse = padded[:, ::-1].copy()
        mirror = _strided(reverse[:, width - n_fft:], (batch, n_frames, h - 1),
                          (width * item, -hop_length * item, item))
        fold = np.empty((batch, n_frames, h + self.even), np.float32)
        np.copyto(fold, frames)
        fold[..., 1:h] += mirror
        diff = np.subtract(frames[..., 1:h], mirror)
        power = self.cos(fold)
        np.multiply(power, power, out=power)
        imag = self.sin(diff)
        np.multiply(imag, imag, out=imag)
        power[..., 1:h] += imag
        return power


def _strided(base, shape, strides):
    return np.lib.stride_tricks.as_strided(base, shape, strides, writeable=False)


@functools.lru_cache(maxsize=8)
def _frontend(n_fft, n_mels, sampling_rate):
    return _Frontend(n_fft, n_mels, sampling_rate)


def _pcm_float32(audio, name):
    """`audio` as a float32 array of any shape: floats as they are, int16 / int32 PCM scaled to
    [-1, 1) by 1/32768 and 1/2**31; a TypeError naming `name` for anything else."""
    try:
        arr = np.asarray(audio)
    except Exception as exc:  # ragged nested lists and the like
        raise TypeError(f"{name} could not be converted to an array: {exc}") from exc
    if arr.dtype.kind == "f" and arr.dtype.itemsize <= 8:
        return arr.astype(np.float32, copy=False)
    if arr.dtype == np.int16:
        return arr.astype(np.float32) * np.float32(1 / 32768)
    if arr.dtype == np.int32:
        return (arr * (1 / 2147483648)).astype(np.float32)
    raise TypeError(f"{name} must hold float16/32/64, int16 or int32 samples, got dtype "
                    f"{arr.dtype}")


def _clip(audio, name):
    """One clip -> 1-D float32."""
    arr = _pcm_float32(audio, name)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D waveform, got shape {arr.shape}")
    if arr.size and not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or infinity")
    return arr


def _as_batch(audio):
    """(list of 1-D float32 clips, whether the input was one clip)."""
    if isinstance(audio, np.ndarray):
        if audio.ndim == 1:
            return [_clip(audio, "audio")], True
        if audio.ndim == 2:
            return [_clip(row, f"audio[{i}]") for i, row in enumerate(audio)], False
        raise ValueError(f"audio must be 1-D (one clip) or 2-D (batch, samples), got shape "
                         f"{audio.shape}")
    if isinstance(audio, (list, tuple)):
        if not audio:
            raise ValueError("audio is an empty list")
        if all(isinstance(a, (np.ndarray, list, tuple)) for a in audio):
            return [_clip(a, f"audio[{i}]") for i, a in enumerate(audio)], False
        return [_clip(audio, "audio")], True
    raise TypeError(f"audio must be a NumPy array or a list of them, got "
                    f"{type(audio).__name__}")


def log_mel_spectrogram(audio, n_mels=80, *, n_fft=N_FFT, hop_length=HOP_LENGTH,
                        sampling_rate=SAMPLE_RATE, padding="max_length",
                        chunk_length=CHUNK_LENGTH, truncation=True, do_normalize=False,
                        return_attention_mask=False):
    """Whisper's log-mel input features, equal to ``transformers.WhisperFeatureExtractor``.

    Parameters
    ----------
    audio : array_like
        One clip (1-D) or a batch: a list of 1-D clips of any lengths, or a 2-D array
        (batch, samples). Samples at `sampling_rate`, float16/32/64 in [-1, 1] or int16 / int32
        PCM (scaled by 1/32768 and 1/2**31, as :func:`load_audio` returns them; transformers
        would take int16 values unscaled). Computed in float32.
    n_mels : int
        80 (Whisper tiny to large-v2) or 128 (large-v3).
    n_fft, hop_length, sampling_rate : int
        Whisper's 400, 160 and 16000.
    padding : {"max_length", "longest"}
        "max_length" (Whisper's models need it): every clip padded with zeros to `chunk_length`
        seconds, ``chunk_length * sampling_rate // hop_length`` frames (3000). "longest": to the
        longest clip of the batch (after truncation).
    chunk_length : int
        Seconds in one window (30).
    truncation : bool
        Cut clips longer than `chunk_length` seconds to it (as transformers does by default).
        With False and padding="max_length", a longer clip keeps its length and sets the
        batch's.
    do_normalize : bool
        Normalise each clip to zero mean and unit variance over its own (truncated) samples
        before padding, transformers' ``do_normalize``.
    return_attention_mask : bool
        Also return an int32 mask of the frames that hold audio (1) rather than padding (0).

    Returns
    -------
    features : ndarray, float32, shape (n_mels, frames) for one clip, (batch, n_mels, frames)
        for a batch
    attention_mask : ndarray, int32, shape (frames,) or (batch, frames); only with
        `return_attention_mask`. Frame j is 1 when sample ``j * hop_length`` is audio.
    """
    n_mels = _positive_int(n_mels, "n_mels")
    n_fft = _positive_int(n_fft, "n_fft")
    hop_length = _positive_int(hop_length, "hop_length")
    sampling_rate = _positive_int(sampling_rate, "sampling_rate")
    chunk_length = _positive_int(chunk_length, "chunk_length")
    if not isinstance(padding, str):
        raise TypeError(f"padding must be 'max_length' or 'longest', got "
                        f"{type(padding).__name__}")
    if padding not in ("max_length", "longest"):
        raise ValueError(f"padding must be 'max_length' or 'longest', got {padding!r}")
    clips, single = _as_batch(audio)
    max_samples = chunk_length * sampling_rate
    if truncation:
        clips = [c[:max_samples] for c in clips]
    lengths = [c.size for c in clips]
    total = max(lengths) if padding == "longest" else max(max(lengths), max_samples)
    if total <= n_fft // 2:
        raise ValueError(f"audio is too short: {total} samples; the STFT's reflect padding needs "
                         f"more than n_fft // 2 = {n_fft // 2}")

    pad = n_fft // 2
    n_frames = total // hop_length
    # at once: the padded rows and their reverse; the folded frames, the spectra, the mel bands
    check_plan(4 * len(clips) * (2 * (total + 2 * pad) + n_frames * (4 * (n_fft // 2 + 1)
                                                                     + 2 * n_mels)),
               f"log_mel_spectrogram of {len(clips)} clip(s) of up to {total} samples")
    # the zero-padded batch, reflect-padded by n_fft // 2 at both ends
    padded = np.zeros((len(clips), total + 2 * pad), np.float32)
    for row, clip in zip(padded, clips):
        if do_normalize and clip.size:
            # in float32, as transformers does: a clip far from zero mean keeps the same residue
            # of its offset (float64 here would differ by up to 5e-3 in the lowest mel band)
            clip = (clip - clip.mean()) / np.sqrt(clip.var() + np.float32(1e-7))
        row[pad:pad + clip.size] = clip
        row[:pad] = row[2 * pad:pad:-1]
        row[pad + total:] = row[pad + total - 2:total - 2:-1]
    frontend = _frontend(n_fft, n_mels, sampling_rate)
    power = frontend.power_spectrum(padded, hop_length, n_frames)  # (batch, frames, bins)
    mel = frontend.mel(power)                                  # (batch, frames, n_mels)
    np.maximum(mel, np.float32(1e-10), out=mel)
    mel[...] = _det_log(mel) * (1.0 / 2.302585092994046)     # log10, the same on every CPU
    floor = mel.max(axis=(1, 2), keepdims=True) - np.float32(8.0)
    np.maximum(mel, floor, out=mel)
    mel += np.float32(4.0)
    mel *= np.float32(0.25)
    features = np.ascontiguousarray(mel.transpose(0, 2, 1))
    if single:
        features = features[0]
    if not return_attention_mask:
        return features
    starts = np.arange(n_frames) * hop_length
    mask = (starts[None, :] < np.asarray(lengths)[:, None]).astype(np.int32)
    return features, (mask[0] if single else mask)
