"""fastattn.audio.load_audio: WAV (int16, float) and FLAC through soundfile, mp3 / opus / PCM in
Matroska written here with PyAV, 44.1 kHz stereo resampled to 16 kHz mono (against scipy's
resample_poly), arrays, file-like objects and bytes, and the errors for what cannot be read."""
import io
import math
import sys

import numpy as np
import pytest

sf = pytest.importorskip("soundfile")
av = pytest.importorskip("av")
signal = pytest.importorskip("scipy.signal")

from tolerances import LOSSY_SNR_DB, RESAMPLE_ATOL  # noqa: E402

from fastattn.audio import decode_audio, load_audio  # noqa: E402

SR = 16000
EDGE = 100     # output samples at each end left out of resampling comparisons (filter start-up)


def chirps(rate, seconds=1.5):
    """(2, n) float32 stereo: a rising chirp (100 Hz -> 4 kHz) left, a falling one right (not
    periodic, so a shifted signal cannot pass for the right one)."""
    t = np.arange(int(rate * seconds)) / rate
    left = 0.5 * np.sin(2 * np.pi * (100 * t + 1300 * t ** 2))
    right = 0.25 * np.sin(2 * np.pi * (3000 * t - 900 * t ** 2))
    return np.stack([left, right]).astype(np.float32)


def resampled_reference(stereo, rate):
    """The equal-weight mono mix resampled to 16 kHz by scipy's polyphase filter, in float64."""
    g = math.gcd(SR, rate)
    return signal.resample_poly(stereo.astype(np.float64).mean(axis=0), SR // g, rate // g)


def encode(fmt, codec, stereo, rate):
    """`stereo` (2, n) encoded with PyAV into a `fmt` container: the file's bytes. Skips when
    this FFmpeg build has no encoder `codec`."""
    try:
        av.codec.Codec(codec, "w")
    except av.error.FFmpegError:
        pytest.skip(f"this FFmpeg build has no {codec} encoder")
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate, layout="stereo")
        for start in range(0, stereo.shape[1], 4096):
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(stereo[:, start:start + 4096]), format="fltp",
                layout="stereo")
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buf.getvalue()


def wav_bytes(data, rate, subtype, fmt="WAV"):
    buf = io.BytesIO()
    sf.write(buf, data, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def snr_db(got, ref):
    n = min(len(got), len(ref))
    err = got[EDGE:n - EDGE] - ref[EDGE:n - EDGE]
    return 10 * np.log10(np.mean(ref[EDGE:n - EDGE] ** 2) / np.mean(err ** 2))


@pytest.fixture
def pcm16(rng):
    return rng.integers(-32768, 32768, size=12345, dtype=np.int16)


def test_wav_int16(tmp_path, pcm16):
    path = tmp_path / "a.wav"
    sf.write(path, pcm16, SR, subtype="PCM_16")
    got = load_audio(path)
    assert got.dtype == np.float32 and got.shape == pcm16.shape and got.flags.c_contiguous
    np.testing.assert_array_equal(got, pcm16.astype(np.float32) / 32768)
    np.testing.assert_array_equal(load_audio(str(path)), got)
    np.testing.assert_array_equal(decode_audio(path), got)


def test_wav_float(tmp_path, rng):
    x = rng.uniform(-1, 1, 5000).astype(np.float32)
    path = tmp_path / "a.wav"
    sf.write(path, x, SR, subtype="FLOAT")
    np.testing.assert_array_equal(load_audio(path), x)
    x64 = rng.uniform(-1, 1, 5000)
    sf.write(path, x64, SR, subtype="DOUBLE")
    np.testing.assert_array_equal(load_audio(path), x64.astype(np.float32))


def test_flac(tmp_path, pcm16):
    path = tmp_path / "a.flac"
    sf.write(path, pcm16, SR, subtype="PCM_16")
    assert path.read_bytes()[:4] == b"fLaC"
    np.testing.assert_array_equal(load_audio(path), pcm16.astype(np.float32) / 32768)


def test_stereo_is_averaged(rng):
    stereo = rng.uniform(-1, 1, (3000, 2)).astype(np.float32)
    got = load_audio(wav_bytes(stereo, SR, "FLOAT"))
    np.testing.assert_allclose(got, stereo.mean(axis=1), rtol=0, atol=1e-7)


def test_wav_44k_stereo_resampled():
    stereo = chirps(44100)
    got = load_audio(wav_bytes(stereo.T, 44100, "FLOAT"))
    ref = resampled_reference(stereo, 44100)
    assert got.shape == ref.shape == (24000,)
    np.testing.assert_allclose(got[EDGE:-EDGE], ref[EDGE:-EDGE], rtol=0, atol=RESAMPLE_ATOL)


def test_flac_22k_resampled():
    stereo = chirps(22050)
    got = load_audio(wav_bytes(stereo.T, 22050, "PCM_24", fmt="FLAC"))
    ref = resampled_reference(stereo, 22050)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got[EDGE:-EDGE], ref[EDGE:-EDGE], rtol=0, atol=RESAMPLE_ATOL)


def test_other_rate_requested():
    stereo = chirps(SR)
    got = load_audio(wav_bytes(stereo.T, SR, "FLOAT"), sampling_rate=8000)
    g = signal.resample_poly(stereo.astype(np.float64).mean(axis=0), 1, 2)
    assert got.shape == g.shape
    # the chirp passes 4 kHz, the new Nyquist, at its end: compare its first 80 % only
    n = int(0.8 * len(g))
    np.testing.assert_allclose(got[EDGE:n], g[EDGE:n], rtol=0, atol=RESAMPLE_ATOL)


def test_pcm_in_matroska_decoded_by_pyav_equals_soundfile_path():
    """One signal, two readers: 44.1 kHz stereo PCM as WAV (soundfile, then PyAV's resampler)
    and in Matroska (PyAV decodes): the same channel mix and resampler, so the same samples."""
    stereo = chirps(44100)
    wav = wav_bytes(stereo.T, 44100, "PCM_16")
    quantized = sf.read(io.BytesIO(wav), dtype="float32")[0].T
    mka = encode("matroska", "pcm_s16le", np.ascontiguousarray(quantized), 44100)
    assert mka[:4] == b"\x1aE\xdf\xa3"
    from_av, from_sf = load_audio(mka), load_audio(wav)
    assert from_av.shape == from_sf.shape == (24000,)
    np.testing.assert_allclose(from_av, from_sf, rtol=0, atol=1e-6)
    ref = resampled_reference(stereo, 44100)
    np.testing.assert_allclose(from_av[EDGE:-EDGE], ref[EDGE:-EDGE], rtol=0, atol=RESAMPLE_ATOL)


@pytest.mark.parametrize("fmt,codec,rate", [("mp3", "libmp3lame", 44100),
                                            ("ogg", "libopus", 48000)])
def test_lossy_file_written_with_pyav(tmp_path, fmt, codec, rate):
    stereo = chirps(rate)
    data = encode(fmt, codec, stereo, rate)
    path = tmp_path / f"a.{fmt}"
    path.write_bytes(data)
    got = load_audio(path)
    ref = resampled_reference(stereo, rate)
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert snr_db(got, ref) > LOSSY_SNR_DB
    # the channels are averaged: the left channel alone is far from it
    assert snr_db(got, resampled_reference(stereo[:1], rate)) < 10
    with open(path, "rb") as f:                       # an open file reads the same
        np.testing.assert_array_equal(load_audio(f), got)


def test_broken_data_after_good_frames_is_dropped(rng):
    """A cut or damaged download: the frames before FFmpeg's InvalidDataError are kept (as
    faster-whisper does); damage from the first byte on is an error (test_garbage_bytes)."""
    mp3 = encode("mp3", "libmp3lame", chirps(44100), 44100)
    clean = load_audio(mp3)
    damaged = load_audio(mp3 + rng.integers(0, 256, 20000, dtype=np.uint8).tobytes())
    assert len(damaged) >= len(clean)
    np.testing.assert_array_equal(damaged[:len(clean) - EDGE], clean[:-EDGE])


class _Pipe(io.RawIOBase):
    """A readable stream that cannot seek (a pipe, a socket)."""

    def __init__(self, data):
        self._data = io.BytesIO(data)

    def readable(self):
        return True

    def seekable(self):
        return False

    def readinto(self, b):
        return self._data.readinto(b)


def test_file_like_bytes_and_unseekable(pcm16):
    wav = wav_bytes(pcm16, SR, "PCM_16")
    want = pcm16.astype(np.float32) / 32768
    np.testing.assert_array_equal(load_audio(io.BytesIO(wav)), want)
    np.testing.assert_array_equal(load_audio(bytearray(wav)), want)
    np.testing.assert_array_equal(load_audio(memoryview(wav)), want)
    np.testing.assert_array_equal(load_audio(_Pipe(wav)), want)
    mp3 = encode("mp3", "libmp3lame", chirps(44100), 44100)
    np.testing.assert_array_equal(load_audio(_Pipe(mp3)), load_audio(mp3))
    # a file-like object read from where it stands
    f = io.BytesIO(b"xxxx" + wav)
    f.seek(4)
    np.testing.assert_array_equal(load_audio(f), want)


def test_arrays(rng, pcm16):
    x = rng.uniform(-1, 1, 1000).astype(np.float32)
    assert load_audio(x) is x                                   # already what it returns
    out = load_audio(x.astype(np.float64))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, x)
    np.testing.assert_array_equal(load_audio(pcm16), pcm16.astype(np.float32) / 32768)
    np.testing.assert_array_equal(load_audio(pcm16.astype(np.int32) << 16),
                                  pcm16.astype(np.float32) / 32768)
    stereo = rng.uniform(-1, 1, (1000, 2)).astype(np.float32)
    want = stereo.mean(axis=1)
    np.testing.assert_allclose(load_audio(stereo), want, rtol=0, atol=1e-7)     # (n, channels)
    np.testing.assert_allclose(load_audio(stereo.T), want, rtol=0, atol=1e-7)   # (channels, n)
    np.testing.assert_allclose(load_audio(stereo[:, :1]), stereo[:, 0], rtol=0, atol=0)
    with pytest.raises(ValueError, match="channel axis"):
        load_audio(np.zeros((4, 4), np.float32))
    with pytest.raises(ValueError, match="shape"):
        load_audio(np.zeros((2, 3, 100), np.float32))
    with pytest.raises(ValueError, match="empty"):
        load_audio(np.zeros(0, np.float32))
    with pytest.raises(ValueError, match="NaN"):
        load_audio(np.array([0.0, np.inf], np.float32))
    with pytest.raises(TypeError, match="source.*object"):
        load_audio(np.array(["a", 1], dtype=object))
    with pytest.raises(TypeError, match="source.*uint8"):
        load_audio(np.zeros(10, np.uint8))


def test_missing_file(tmp_path):
    path = tmp_path / "missing.wav"
    with pytest.raises(FileNotFoundError, match="missing.wav") as info:
        load_audio(path)
    assert info.value.filename == str(path)


def test_empty_file(tmp_path):
    for name in ("empty.wav", "empty.mp3"):
        path = tmp_path / name
        path.write_bytes(b"")
        with pytest.raises(ValueError, match=f"{name}.* empty") as info:
            load_audio(path)
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="empty"):
        load_audio(b"")
    with pytest.raises(ValueError, match="empty"):
        load_audio(io.BytesIO())


@pytest.mark.parametrize("content", [bytes(range(256)) * 40,                       # PyAV
                                     b"RIFF\x10\x00\x00\x00WAVEfmt garbage" * 3,  # soundfile
                                     b"fLaC" + b"\x00" * 100])
def test_garbage_bytes(tmp_path, content):
    path = tmp_path / "noise.m4a"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="cannot decode audio from .*noise.m4a") as info:
        load_audio(path)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="cannot decode audio from the given bytes"):
        load_audio(content)


def test_no_samples(tmp_path):
    path = tmp_path / "silent.wav"
    sf.write(path, np.zeros(0, np.int16), SR, subtype="PCM_16")
    with pytest.raises(ValueError, match="silent.wav.* no audio samples"):
        load_audio(path)


def test_directory_and_argument_types(tmp_path):
    with pytest.raises(ValueError, match="directory"):
        load_audio(tmp_path)
    with pytest.raises(TypeError, match="source"):
        load_audio(3)
    with pytest.raises(TypeError, match="source"):
        load_audio([0.0, 0.1])
    with pytest.raises(TypeError, match="sampling_rate"):
        load_audio(np.zeros(10, np.float32), sampling_rate="16000")
    with pytest.raises(TypeError, match="sampling_rate"):
        load_audio(np.zeros(10, np.float32), sampling_rate=16000.0)
    with pytest.raises(ValueError, match="sampling_rate"):
        load_audio(np.zeros(10, np.float32), sampling_rate=0)
    path = tmp_path / "a.wav"
    sf.write(path, np.zeros(100, np.int16), SR)
    with open(path) as text_mode:
        with pytest.raises(TypeError, match="binary"):
            load_audio(text_mode)


@pytest.mark.parametrize("missing,fmt", [("soundfile", "wav"), ("av", "mp3"), ("av", "wav44")])
def test_missing_library_names_the_extra(monkeypatch, missing, fmt):
    if fmt == "wav":
        data = wav_bytes(np.zeros(1000, np.int16), SR, "PCM_16")
    elif fmt == "wav44":        # soundfile reads it; resampling 44.1 kHz needs PyAV
        data = wav_bytes(np.zeros(1000, np.int16), 44100, "PCM_16")
    else:
        data = encode("mp3", "libmp3lame", chirps(44100, 0.2), 44100)
    monkeypatch.setitem(sys.modules, missing, None)       # import now raises ImportError
    with pytest.raises(ImportError, match=rf"'{missing}'.*fastattn\[audio\]"):
        load_audio(data)
