"""Whisper's audio front end: decode audio to 16 kHz mono float32, then log-mel features.

- :func:`load_audio` (alias :func:`decode_audio`): a file (WAV / FLAC through ``soundfile``,
  everything else FFmpeg reads through PyAV) or an array -> 1-D float32 at 16 kHz.
- :func:`log_mel_spectrogram`: the input features of Whisper's encoder, equal to
  ``transformers.WhisperFeatureExtractor``'s (80 or 128 mels, 3000 frames per 30 s window).
- :func:`mel_filters`: the Slaney mel filter bank those features use.
- :class:`Transcriber`: a Whisper folder's speech to text with timestamps, audio of any length
  (:mod:`.transcriber`); :func:`write_transcript`: txt / srt / vtt / json files.

Decoding files needs ``soundfile`` and ``av`` (``pip install "fastattn[audio]"``), imported
only when a file of their kind is read; the features need NumPy alone.
"""
from .decode import decode_audio, load_audio
from .features import (CHUNK_LENGTH, HOP_LENGTH, N_FFT, N_FRAMES, N_SAMPLES, SAMPLE_RATE,
                       hz_to_mel, log_mel_spectrogram, mel_filters, mel_to_hz)

from .formats import format_timestamp, write_transcript
from .transcriber import Segment, Transcriber, Transcription, Word

__all__ = ["Transcriber", "Transcription", "Segment", "Word", "write_transcript",
           "format_timestamp", "load_audio", "decode_audio", "log_mel_spectrogram", "mel_filters",
           "hz_to_mel", "mel_to_hz", "SAMPLE_RATE", "N_FFT", "HOP_LENGTH", "CHUNK_LENGTH",
           "N_SAMPLES", "N_FRAMES"]
