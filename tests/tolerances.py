"""Tolerances, per compute dtype: the one table every test reads (never inline numbers).

A plain module (``from tolerances import ...``), not conftest.py: with several conftest.py
files in the tree, ``from conftest import`` would find whichever was imported first."""
import numpy as np

# The kernel against the float64 reference:
ATOL = {np.float32: 2e-6, np.float64: 1e-12}
RTOL = {np.float32: 1e-5, np.float64: 1e-12}
# A whole block or model (several GEMMs, LayerNorms and attention calls) against float64 NumPy:
BLOCK_TOL = {np.float32: 2e-5, np.float64: 1e-12}
# ... and against PyTorch's own modules (torch computes float32 its own way):
TORCH_TOL = {np.float32: 1e-4, np.float64: 1e-10}
# One attention call in a child process, relative to 1 + |reference| (kernels/test_workspace.py):
CHILD_TOL = {"float32": 2e-5, "float64": 1e-11}
# Whisper's log-mel features (fastattn.audio) against transformers' WhisperFeatureExtractor,
# absolute on their (log10(mel) + 4) / 4 scale: both float32 (torch.stft there, a DFT by GEMM
# here), each within 8e-5 of a float64 computation near the features' 80 dB floor; measured
# up to 9.5e-5:
WHISPER_FEATURES_ATOL = 2e-4
# load_audio's 44.1 -> 16 kHz resampling (FFmpeg's swresample) against scipy's resample_poly, both
# windowed-sinc low-pass filters with gain 1 within 1e-3 below 4 kHz, for tones of amplitude
# <= 0.75 below 4 kHz, outside the filters' start-up edges; measured 5e-4. A one-sample shift
# is an error of ~0.4 and no anti-alias filter or a wrong rate far more:
RESAMPLE_ATOL = 2e-3
# ... and of lossy files (mp3, opus) decoded and resampled, as a signal-to-noise ratio in dB
# (measured: mp3 at PyAV's default bit rate 26 dB, opus 35 dB; one sample late: about 0 dB):
LOSSY_SNR_DB = 20.0


def assert_close(actual, expected, dtype):
    dtype = np.dtype(dtype).type
    np.testing.assert_allclose(actual, expected, rtol=RTOL[dtype], atol=ATOL[dtype])
