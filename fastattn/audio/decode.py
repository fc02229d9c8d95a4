"""Audio in, 16 kHz mono float32 out: what Whisper's feature extractor reads.

Files are told apart by their first bytes, not their names: WAV (RIFF / RIFX / RF64 ... WAVE)
and FLAC (fLaC) are read with ``soundfile`` (libsndfile); everything else (mp3, m4a / aac,
ogg / opus, webm, the audio of a video, ...) is decoded with PyAV (FFmpeg). Both are optional
(``pip install "fastattn[audio]"``) and imported only when a file needs them.

Channels are mixed down to mono by averaging them with equal weights (so both readers give the
same signal; FFmpeg's own down-mix matrix would weight them differently). Audio at another rate
is resampled by FFmpeg's swresample (PyAV's ``AudioResampler``, as faster-whisper decodes), for
soundfile's files too: one resampler for every format.
"""
import io
import os
from numbers import Integral

import numpy as np

from .._deps import require
from .features import SAMPLE_RATE, _pcm_float32

__all__ = ["load_audio", "decode_audio"]

_BLOCK = 1 << 16          # samples per frame fed to the resampler from soundfile's arrays


def _require(module, purpose):
    return require(module, purpose, extra="audio")


def _one_line(exc):
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _soundfile_kind(head):
    """True for the formats read with soundfile: WAV (and its 64-bit / big-endian kin), FLAC."""
    return (head[:4] in (b"RIFF", b"RIFX", b"RF64", b"BW64") and head[8:12] == b"WAVE"
            or head[:4] == b"fLaC")


def _from_array(source):
    arr = _pcm_float32(source, "source")
    if arr.ndim == 2:
        # the channel axis is the shorter one: (samples, channels) as soundfile returns it,
        # or (channels, samples) as PyAV and torchaudio do
        if arr.shape[0] == arr.shape[1] and arr.shape[0] > 1:
            raise ValueError(f"source has shape {arr.shape}: cannot tell its channel axis "
                             "(the shorter one) from its samples")
        arr = arr.mean(axis=0 if arr.shape[0] < arr.shape[1] else 1, dtype=np.float32)
    elif arr.ndim != 1:
        raise ValueError(f"source must be a 1-D waveform or a 2-D (samples, channels) array, "
                         f"got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("source is an empty array: no audio samples")
    if not np.isfinite(arr).all():
        raise ValueError("source contains NaN or infinity")
    return np.ascontiguousarray(arr)


def _resampled(resampler, frame):
    """The resampler's output for `frame` (None flushes it), channels averaged: 1-D arrays."""
    return [out.to_ndarray().mean(axis=0, dtype=np.float32)
            for out in resampler.resample(frame)]


def _resample(mono, rate, sampling_rate, label):
    """A 1-D float32 signal at `rate` Hz -> `sampling_rate` Hz with FFmpeg's resampler."""
    av = _require("av", f"resampling {label} from {rate} Hz to {sampling_rate} Hz")
    from av.audio.resampler import AudioResampler
    resampler = AudioResampler(format="fltp", layout="mono", rate=sampling_rate)
    pieces = []
    for start in range(0, mono.size, _BLOCK):
        frame = av.AudioFrame.from_ndarray(mono[None, start:start + _BLOCK], format="fltp",
                                           layout="mono")
        frame.sample_rate = rate
        pieces += _resampled(resampler, frame)
    pieces += _resampled(resampler, None)
    return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)


def _read_soundfile(src, sampling_rate, label):
    sf = _require("soundfile", f"reading the WAV / FLAC file {label}")
    try:
        data, rate = sf.read(src, dtype="float32", always_2d=True)
    except (RuntimeError, ValueError, TypeError, OSError) as exc:   # LibsndfileError is a
        raise ValueError(f"cannot decode audio from {label}: {_one_line(exc)}") from exc
    mono = data[:, 0] if data.shape[1] == 1 else data.mean(axis=1, dtype=np.float32)
    if mono.size and rate != sampling_rate:
        mono = _resample(np.ascontiguousarray(mono), rate, sampling_rate, label)
    return mono


def _decode_av(src, sampling_rate, label):
    av = _require("av", f"decoding {label} (not WAV / FLAC)")
    from av.audio.resampler import AudioResampler
    pieces = []
    try:
        with av.open(src, mode="r", metadata_errors="ignore") as container:
            if not container.streams.audio:
                raise ValueError(f"{label} has no audio stream")
            stream = container.streams.audio[0]
            resampler, setup = None, None
            try:
                for frame in container.decode(stream):
                    now = (frame.format.name, frame.layout.name, frame.sample_rate)
                    if now != setup:     # a stream may change its layout or rate midway
                        if resampler is not None:
                            pieces += _resampled(resampler, None)
                        resampler, setup = AudioResampler(format="fltp", rate=sampling_rate), now
                    pieces += _resampled(resampler, frame)
            except av.error.InvalidDataError:
                if not pieces:    # broken data after good frames (a cut download) is dropped,
                    raise         # as faster-whisper does; broken from the start is an error
            if resampler is not None:
                pieces += _resampled(resampler, None)
    except (av.error.FFmpegError, OSError) as exc:
        raise ValueError(f"cannot decode audio from {label}: {_one_line(exc)}") from exc
    return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)


def _open_source(source):
    """(what soundfile / PyAV open, a label for messages, the first 12 bytes)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        source = io.BytesIO(bytes(source))
        return source, "the given bytes", source.getvalue()[:12]
    if isinstance(source, (str, os.PathLike)):
        path = os.fsdecode(os.fspath(source))
        label = repr(path)
        if not os.path.exists(path):
            raise FileNotFoundError(2, "No such audio file", path)
        if os.path.isdir(path):
            raise ValueError(f"{label} is a directory, not an audio file")
        try:
            with open(path, "rb") as f:
                head = f.read(12)
        except OSError as exc:
            raise ValueError(f"cannot read {label}: {_one_line(exc)}") from exc
        return path, label, head
    if isinstance(source, io.TextIOBase):
        raise TypeError("source must be opened in binary mode ('rb'), got a text-mode file")
    if callable(getattr(source, "read", None)):
        name = getattr(source, "name", None)
        label = repr(name) if isinstance(name, str) else "the file-like object"
        try:
            if not (callable(getattr(source, "seekable", None)) and source.seekable()):
                source = io.BytesIO(source.read())      # soundfile and PyAV seek
            start = source.tell()
            head = source.read(12)
            source.seek(start)
        except OSError as exc:
            raise ValueError(f"cannot read {label}: {_one_line(exc)}") from exc
        if not isinstance(head, bytes):
            raise TypeError(f"source must be opened in binary mode ('rb'), got "
                            f"{type(head).__name__} from read()")
        return source, label, head
    raise TypeError(f"source must be a path, a binary file-like object, bytes or a NumPy "
                    f"array, got {type(source).__name__}")


def load_audio(source, sampling_rate=SAMPLE_RATE):
    """Audio as Whisper reads it: a 1-D float32 waveform, mono, at `sampling_rate` (16 kHz).

    Parameters
    ----------
    source : str, os.PathLike, binary file-like object, bytes or ndarray
        A file (path, open binary file or its bytes): WAV / FLAC are read with ``soundfile``,
        any other format FFmpeg knows with PyAV; channels are averaged, the rate converted
        with FFmpeg's resampler.
        An array is taken to be at `sampling_rate` already (it is not resampled): 1-D, or 2-D
        with channels on its shorter axis, (samples, channels) or (channels, samples), which
        are averaged. float16/32/64 samples are taken as they are, int16 scaled by 1/32768,
        int32 by 1/2**31. A float32 1-D contiguous array comes back as it is (not copied).
    sampling_rate : int
        The rate returned (Whisper: 16000).

    Returns
    -------
    ndarray, float32, shape (samples,)

    Raises
    ------
    FileNotFoundError
        No file at the path.
    ValueError
        A directory, an empty file, a file that does not decode (naming it), no audio stream,
        no samples, NaN / infinity in an array.
    ImportError
        ``soundfile`` (WAV / FLAC) or ``av`` (other formats, resampling) missing:
        ``pip install "fastattn[audio]"``.
    TypeError
        `source` or `sampling_rate` of the wrong type.
    """
    if isinstance(sampling_rate, bool) or not isinstance(sampling_rate, Integral):
        raise TypeError(f"sampling_rate must be an int, got {type(sampling_rate).__name__} "
                        f"{sampling_rate!r}")
    if sampling_rate <= 0:
        raise ValueError(f"sampling_rate must be positive, got {sampling_rate}")
    sampling_rate = int(sampling_rate)
    if isinstance(source, np.ndarray):
        return _from_array(source)
    src, label, head = _open_source(source)
    if not head:
        raise ValueError(f"{label} is empty: no audio")
    if _soundfile_kind(head):
        audio = _read_soundfile(src, sampling_rate, label)
    else:
        audio = _decode_av(src, sampling_rate, label)
    if audio.size == 0:
        raise ValueError(f"{label} holds no audio samples")
    return np.ascontiguousarray(audio, dtype=np.float32)


decode_audio = load_audio
