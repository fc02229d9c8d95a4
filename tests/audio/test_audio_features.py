"""fastattn.audio.log_mel_spectrogram and mel_filters against transformers' WhisperFeatureExtractor
and mel_filter_bank: 80 and 128 mels, clips shorter than, exactly and longer than 30 s, batches,
padding, attention masks, normalisation, input dtypes; the folded real DFT against np.fft."""
import warnings

import numpy as np
import pytest

pytest.importorskip("transformers")

from tolerances import WHISPER_FEATURES_ATOL  # noqa: E402
from transformers import WhisperFeatureExtractor  # noqa: E402
from transformers.audio_utils import mel_filter_bank  # noqa: E402

from fastattn.audio import (N_FRAMES, N_SAMPLES, hz_to_mel, log_mel_spectrogram,  # noqa: E402
                            mel_filters, mel_to_hz)
from fastattn.audio import features as F  # noqa: E402

SR = 16000


def speechlike(n, seed=0):
    """A clip that exercises the whole 80 dB range the features keep: an amplitude-modulated
    chirp in noise, a passage 80 dB quieter, digital silence and a loud pure tone over a noise
    floor 70 dB below it."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / SR
    x = 0.3 * np.sin(2 * np.pi * (150 + 250 * t) * t) * (1 + np.sin(2 * np.pi * 0.7 * t))
    x += 0.05 * rng.standard_normal(n)
    x[n // 5:n // 3] *= 1e-4
    x[n // 2:n // 2 + n // 20] = 0.0
    tone = slice(2 * n // 3, 2 * n // 3 + n // 10)
    x[tone] = 0.9 * np.sin(2 * np.pi * 1234.5 * t[tone]) + 3e-4 * rng.standard_normal(n // 10)
    return x.astype(np.float32)


_EXTRACTORS = {}


def hf_features(clips, n_mels, **kwargs):
    if n_mels not in _EXTRACTORS:
        _EXTRACTORS[n_mels] = WhisperFeatureExtractor(feature_size=n_mels)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _EXTRACTORS[n_mels](clips, sampling_rate=SR, return_tensors="np", **kwargs)


def assert_features_close(ours, ref):
    assert ours.shape == ref.shape and ours.dtype == np.float32
    np.testing.assert_allclose(ours, ref, rtol=0, atol=WHISPER_FEATURES_ATOL)


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_equal_transformers(n_mels):
    ref = mel_filter_bank(num_frequency_bins=201, num_mel_filters=n_mels, min_frequency=0.0,
                          max_frequency=8000.0, sampling_rate=SR, norm="slaney",
                          mel_scale="slaney")
    ours = mel_filters(n_mels)
    assert ours.shape == (n_mels, 201) and ours.dtype == np.float64
    np.testing.assert_allclose(ours, ref.T, rtol=1e-12, atol=1e-15)
    assert mel_filters(n_mels, dtype=np.float32).dtype == np.float32


def test_mel_filters_other_sizes_and_band():
    ref = mel_filter_bank(257, 40, 100.0, 6000.0, 22050, norm="slaney", mel_scale="slaney")
    ours = mel_filters(40, n_fft=512, sampling_rate=22050, f_min=100.0, f_max=6000.0)
    np.testing.assert_allclose(ours, ref.T, rtol=1e-12, atol=1e-15)


def test_slaney_mel_scale():
    hz = np.array([0.0, 200.0, 999.0, 1000.0, 1001.0, 6400.0, 8000.0])
    mel = hz_to_mel(hz)
    np.testing.assert_allclose(mel[:3], hz[:3] * 3 / 200)          # linear below 1 kHz
    np.testing.assert_allclose(mel[3], 15.0)
    np.testing.assert_allclose(mel[5], 15.0 + 27.0)                 # 27 mels per factor 6.4
    np.testing.assert_allclose(mel_to_hz(mel), hz, rtol=1e-12)
    assert isinstance(hz_to_mel(1000.0), float) and isinstance(mel_to_hz(15.0), float)


# shorter than 30 s (a multiple of the hop and not), exactly 30 s, longer (truncated)
@pytest.mark.parametrize("n_samples", [16000, 123457, N_SAMPLES, N_SAMPLES + 150001])
@pytest.mark.parametrize("n_mels", [80, 128])
def test_features_equal_transformers(n_mels, n_samples):
    x = speechlike(n_samples)
    ours = log_mel_spectrogram(x, n_mels)
    assert ours.shape == (n_mels, N_FRAMES)
    assert_features_close(ours, hf_features(x, n_mels).input_features[0])


def test_features_of_silence_equal_transformers():
    x = np.zeros(40000, np.float32)
    ours = log_mel_spectrogram(x)
    assert_features_close(ours, hf_features(x, 80).input_features[0])
    np.testing.assert_allclose(ours, -1.5, rtol=0, atol=1e-6)   # log10(1e-10) -> (-10 + 4) / 4


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_float_input_dtypes(dtype):
    x = speechlike(50000, seed=1).astype(dtype)
    ours = log_mel_spectrogram(x)
    assert_features_close(ours, hf_features(x.astype(np.float32), 80).input_features[0])


def test_int16_input_is_scaled_pcm():
    # int16 is PCM: scaled by 1/32768 (load_audio's convention; transformers would take the
    # integer values as they are, a constant offset of log10(32768 ** 2) / 4 in its features)
    x = np.round(speechlike(70000, seed=2) * 30000).astype(np.int16)
    ours = log_mel_spectrogram(x)
    assert_features_close(ours, hf_features(x.astype(np.float32) / 32768, 80).input_features[0])
    x32 = x.astype(np.int32) << 16
    np.testing.assert_allclose(log_mel_spectrogram(x32), ours, rtol=0, atol=1e-6)


@pytest.mark.parametrize("n_mels", [80, 128])
def test_batch_of_different_lengths_with_attention_mask(n_mels):
    lengths = [8000, 160 * 999, 123457, N_SAMPLES, N_SAMPLES + 40000]
    clips = [speechlike(n, seed=i) for i, n in enumerate(lengths)]
    ref = hf_features(clips, n_mels, return_attention_mask=True)
    ours, mask = log_mel_spectrogram(clips, n_mels, return_attention_mask=True)
    assert ours.shape == (len(clips), n_mels, N_FRAMES)
    assert_features_close(ours, ref.input_features)
    assert mask.dtype == np.int32
    np.testing.assert_array_equal(mask, ref.attention_mask)
    # frame j holds audio when sample j * 160 does: ceil(n / 160) frames, 3000 at most
    assert mask.sum(axis=1).tolist() == [min(-(-n // 160), N_FRAMES) for n in lengths]
    # each clip alone gives the same features as in the batch
    for clip, row in zip(clips, ours):
        np.testing.assert_array_equal(log_mel_spectrogram(clip, n_mels), row)


def test_padding_longest():
    lengths = [5000, 160 * 200, 33333]          # the longest is not a multiple of the hop
    clips = [speechlike(n, seed=i) for i, n in enumerate(lengths)]
    ref = hf_features(clips, 80, padding="longest", return_attention_mask=True)
    ours, mask = log_mel_spectrogram(clips, padding="longest", return_attention_mask=True)
    assert ours.shape == (3, 80, 33333 // 160)
    assert_features_close(ours, ref.input_features)
    np.testing.assert_array_equal(mask, ref.attention_mask)
    one, one_mask = log_mel_spectrogram(clips[1], padding="longest", return_attention_mask=True)
    assert one.shape == (80, 200) and one_mask.shape == (200,) and one_mask.all()
    assert_features_close(one, hf_features(clips[1], 80, padding="longest").input_features[0])


def test_padding_longest_truncates_to_chunk_length():
    clips = [speechlike(N_SAMPLES + 20000), speechlike(1000, seed=3)]
    ours = log_mel_spectrogram(clips, padding="longest")
    assert ours.shape == (2, 80, N_FRAMES)
    assert_features_close(ours, hf_features(clips, 80, padding="longest").input_features)


def test_no_truncation():
    x = speechlike(N_SAMPLES + 32100)
    ours = log_mel_spectrogram(x, truncation=False)
    assert ours.shape == (80, (N_SAMPLES + 32100) // 160)
    assert_features_close(ours, hf_features(x, 80, truncation=False).input_features[0])


def test_chunk_length():
    x = speechlike(100000)
    ours = log_mel_spectrogram(x, chunk_length=5)           # truncated to 5 s = 500 frames
    assert ours.shape == (80, 500)
    np.testing.assert_allclose(ours, log_mel_spectrogram(x[:80000], padding="longest"),
                               rtol=0, atol=0)


@pytest.mark.parametrize("n_mels", [80, 128])
def test_do_normalize(n_mels):
    clips = [speechlike(n, seed=i) * 0.01 + 0.2 for i, n in enumerate([20000, 123457])]
    ref = hf_features(clips, n_mels, do_normalize=True, return_attention_mask=True)
    ours, mask = log_mel_spectrogram(clips, n_mels, do_normalize=True,
                                     return_attention_mask=True)
    assert_features_close(ours, ref.input_features)
    np.testing.assert_array_equal(mask, ref.attention_mask)
    # normalising changes the features (the offset and the scale are gone)
    assert np.abs(ours - log_mel_spectrogram(clips, n_mels)).max() > 0.1


def test_batch_as_2d_array_and_lists():
    clips = np.stack([speechlike(30000, seed=i) for i in range(2)])
    from_array = log_mel_spectrogram(clips)
    assert from_array.shape == (2, 80, N_FRAMES)
    np.testing.assert_array_equal(from_array, log_mel_spectrogram(list(clips)))
    np.testing.assert_array_equal(from_array[1], log_mel_spectrogram(clips[1].tolist()))


@pytest.mark.parametrize("n_fft", [400, 401, 512, 2, 3])
def test_folded_dft_equals_numpy_rfft(n_fft, rng):
    """The power spectrum of the GEMM-folded DFT, even and odd sizes, against np.fft in float64."""
    hop, n_frames = 37, 50
    padded = rng.standard_normal((2, hop * (n_frames - 1) + n_fft + 5)).astype(np.float32)
    power = F._Frontend(n_fft, 4, SR).power_spectrum(padded, hop, n_frames)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
    idx = np.arange(n_frames)[:, None] * hop + np.arange(n_fft)
    spectrum = np.fft.rfft(padded.astype(np.float64)[:, idx] * window, axis=-1)
    ref = spectrum.real ** 2 + spectrum.imag ** 2
    assert power.shape == ref.shape == (2, n_frames, n_fft // 2 + 1)
    np.testing.assert_allclose(power, ref, rtol=2e-4, atol=2e-4 * ref.max())


def test_memory_is_planned_first(monkeypatch):
    import fastattn._memory
    x = speechlike(4 * N_SAMPLES)          # 2 minutes, not truncated: ~60 MB at once
    monkeypatch.setattr(fastattn._memory, "available_bytes", lambda: 8 << 20)
    with pytest.raises(MemoryError, match="log_mel_spectrogram of 1 clip"):
        log_mel_spectrogram(x, truncation=False)
    assert log_mel_spectrogram(x).shape == (80, N_FRAMES)   # one 30 s window fits its 15 MB


def test_argument_errors():
    x = speechlike(20000)
    with pytest.raises(TypeError, match="n_mels"):
        log_mel_spectrogram(x, "80")
    with pytest.raises(TypeError, match="hop_length"):
        log_mel_spectrogram(x, hop_length=160.0)
    with pytest.raises(ValueError, match="n_fft"):
        log_mel_spectrogram(x, n_fft=0)
    with pytest.raises(ValueError, match="padding"):
        log_mel_spectrogram(x, padding="longer")
    with pytest.raises(TypeError, match="padding"):
        log_mel_spectrogram(x, padding=True)
    with pytest.raises(TypeError, match="audio"):
        log_mel_spectrogram("clip.wav")
    with pytest.raises(TypeError, match=r"audio\[1\].*complex"):
        log_mel_spectrogram([x, x.astype(np.complex64)])
    with pytest.raises(TypeError, match="audio.*uint8"):
        log_mel_spectrogram(np.zeros(1000, np.uint8))
    with pytest.raises(ValueError, match="1-D .* 2-D"):
        log_mel_spectrogram(np.zeros((2, 2, 1000), np.float32))
    with pytest.raises(ValueError, match="empty list"):
        log_mel_spectrogram([])
    bad = x.copy()
    bad[7] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        log_mel_spectrogram(bad)
    with pytest.raises(ValueError, match="too short"):
        log_mel_spectrogram(x[:200], padding="longest")
    with pytest.raises(TypeError, match="n_mels"):
        mel_filters(n_mels=True)
    with pytest.raises(ValueError, match="f_min"):
        mel_filters(f_min=9000.0, f_max=8000.0)
