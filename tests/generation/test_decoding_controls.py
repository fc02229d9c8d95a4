"""Decoding controls (issue 34) against transformers' own generate on random Marian checkpoints:
repetition_penalty, no_repeat_ngram_size, encoder_no_repeat_ngram_size, num_return_sequences,
decoder_input_ids (a forced prefix), return_scores, streamer, score(); the checkpoint's
generation config; the bitwise contract (batch composition, thread count); bad values."""
import numpy as np
import pytest

import fastattn
from fastattn.generation import score
from marian_helpers import EOS, PAD, hf_generate, small_model

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

NEW = 16


def _model(checkpoint, name, **extra):
    path, hf = checkpoint(name, **extra)
    return fastattn.Seq2SeqTransformer.from_pretrained(path), hf


def _same(a, b):
    return a.shape == b.shape and np.array_equal(a, b)


def _hf_dict(hf, ids, mask, **kw):
    with torch.no_grad():
        return hf.generate(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
                           output_scores=True, return_dict_in_generate=True, **kw)


def _generated_mask(seqs, P=1):
    """True at the generated positions up to and including each row's first EOS."""
    gen = seqs[:, P:]
    eos = np.cumsum(gen == EOS, axis=1)
    return (eos == 0) | ((eos == 1) & (gen == EOS))


def _ngrams(row, n):
    return [tuple(row[i:i + n]) for i in range(len(row) - n + 1)]


# -- logits processors: token for token ------------------------------------------------------

PROC_CASES = [
    dict(repetition_penalty=1.5), dict(repetition_penalty=0.7), dict(repetition_penalty=3.0),
    dict(no_repeat_ngram_size=1), dict(no_repeat_ngram_size=2), dict(no_repeat_ngram_size=3),
    dict(encoder_no_repeat_ngram_size=1),
    dict(repetition_penalty=1.3, no_repeat_ngram_size=2, encoder_no_repeat_ngram_size=1),
]


@pytest.mark.parametrize("name", ["relu_untied", "swish_untied", "relu_tied", "gelu_unshared"])
@pytest.mark.parametrize("num_beams", [1, 3])
@pytest.mark.parametrize("kw", PROC_CASES, ids=[str(k) for k in PROC_CASES])
def test_processors_equal_transformers(checkpoint, src, name, num_beams, kw):
    m, hf = _model(checkpoint, name)
    ids, mask = src                                   # a padded batch
    ref = hf_generate(hf, ids, mask, max_new_tokens=NEW, num_beams=num_beams, **kw)
    out = m.generate(ids, mask, max_new_tokens=NEW, num_beams=num_beams, **kw)
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_the_controls_change_the_output(checkpoint, src, num_beams):
    """Each control does something on these checkpoints (the parity above is not vacuous), and
    what it promises holds in our output."""
    m, _ = _model(checkpoint, "swish_untied")
    ids, mask = src
    plain = m.generate(ids, mask, max_new_tokens=NEW, num_beams=num_beams)
    for kw in PROC_CASES[:7]:
        out = m.generate(ids, mask, max_new_tokens=NEW, num_beams=num_beams, **kw)
        assert not _same(out, plain), kw
    for n in (1, 2, 3):
        out = m.generate(ids, mask, max_new_tokens=NEW, num_beams=num_beams,
                         no_repeat_ngram_size=n)
        for row in out:
            grams = _ngrams(row[:int((row != PAD).sum()) + 1], n)
            assert len(grams) == len(set(grams)), (n, row)
    out = m.generate(ids, mask, max_new_tokens=NEW, num_beams=num_beams,
                     encoder_no_repeat_ngram_size=1)
    for b, row in enumerate(out):          # (EOS is forced at the length limit after the ban)
        assert not set(row[1:].tolist()) & set(ids[b][mask[b] == 1].tolist()) - {EOS}


def _echo_sources(m, B=6):
    """Sources that hold the model's own outputs (4 random tokens, then what the model says
    for the previous sources, three times over), right-padded to different lengths: the
    n-grams the model produces are source n-grams, so banning them changes the output."""
    ids = np.random.default_rng(5).integers(1, PAD, size=(B, 10))
    ids[:, -1] = EOS
    for _ in range(3):
        out = m.generate(ids, max_new_tokens=12)
        ids = np.concatenate([ids[:, :4], np.where(out[:, 1:] == PAD, EOS, out[:, 1:])], 1)
        ids[:, -1] = EOS
    mask = np.ones_like(ids)
    for b in range(1, B, 2):                       # every other row shorter, padded
        ids[b, -b - 1] = EOS
        ids[b, -b:] = PAD
        mask[b, -b:] = 0
    return ids, mask


@pytest.mark.parametrize("name", ["swish_untied", "gelu_unshared"])
@pytest.mark.parametrize("num_beams", [1, 3])
@pytest.mark.parametrize("n", [2, 3])
def test_encoder_no_repeat_ngrams_of_the_output(checkpoint, name, num_beams, n):
    m, hf = _model(checkpoint, name)
    ids, mask = _echo_sources(m)
    ref = hf_generate(hf, ids, mask, max_new_tokens=12, num_beams=num_beams,
                      encoder_no_repeat_ngram_size=n)
    out = m.generate(ids, mask, max_new_tokens=12, num_beams=num_beams,
                     encoder_no_repeat_ngram_size=n)
    np.testing.assert_array_equal(out, ref)
    base = m.generate(ids, mask, max_new_tokens=12, num_beams=num_beams)
    assert sum(not _same(a, c) for a, c in zip(out, base)) >= 3
    for b, row in enumerate(out):
        src_grams = set(_ngrams(ids[b][mask[b] == 1].tolist(), n))
        # (EOS is forced at the length limit after the ban)
        assert not {g for g in _ngrams(row.tolist(), n) if g[-1] != EOS} & src_grams


# -- num_return_sequences and return_scores ---------------------------------------------------

BEAM_NRS = [(4, 3, 1.0, False), (3, 3, 2.0, True), (5, 2, 0.5, "never"), (2, 1, 1.0, False)]


@pytest.mark.parametrize("name", ["relu_untied", "swish_untied", "relu_tied"])
@pytest.mark.parametrize("num_beams,nrs,lp,es", BEAM_NRS)
def test_beam_return_sequences_and_scores(checkpoint, src, name, num_beams, nrs, lp, es):
    m, hf = _model(checkpoint, name)
    ids, mask = src
    kw = dict(max_new_tokens=NEW, num_beams=num_beams, num_return_sequences=nrs,
              length_penalty=lp, early_stopping=es, repetition_penalty=1.2)
    ref = _hf_dict(hf, ids, mask, **kw)
    out, sc = m.generate(ids, mask, return_scores=True, **kw)
    np.testing.assert_array_equal(out, ref.sequences.numpy())
    assert out.shape[0] == ids.shape[0] * nrs and sc.shape == (out.shape[0],)
    assert sc.dtype == np.float32
    np.testing.assert_allclose(sc, ref.sequences_scores.numpy(), rtol=1e-4, atol=1e-5)
    # best first within each source
    assert np.all(np.diff(sc.reshape(-1, nrs), axis=1) <= 0)
    np.testing.assert_array_equal(m.generate(ids, mask, **kw), out)


@pytest.mark.parametrize("name", ["relu_untied", "swish_untied", "gelu_unshared"])
@pytest.mark.parametrize("kw", [dict(), dict(repetition_penalty=1.4, no_repeat_ngram_size=2),
                                # bad_words_ids=[[PAD]] (what Marian checkpoints ship): on
                                # padded sources transformers' encoder n-grams also ban PAD
                                dict(min_new_tokens=4, encoder_no_repeat_ngram_size=1,
                                     bad_words_ids=[[PAD]])])
def test_greedy_scores_equal_transition_scores(checkpoint, src, name, kw):
    """Greedy return_scores == transformers' compute_transition_scores(normalize_logits=True)
    summed over the generated tokens up to EOS."""
    m, hf = _model(checkpoint, name)
    ids, mask = src
    ref = _hf_dict(hf, ids, mask, max_new_tokens=NEW, **kw)
    out, sc = m.generate(ids, mask, max_new_tokens=NEW, return_scores=True, **kw)
    seqs = ref.sequences.numpy()
    np.testing.assert_array_equal(out, seqs)
    tr = hf.compute_transition_scores(ref.sequences, ref.scores, normalize_logits=True).numpy()
    want = np.where(_generated_mask(seqs), tr, 0).sum(axis=1)
    np.testing.assert_allclose(sc, want, rtol=1e-5, atol=1e-4)
    assert np.all(sc < 0)


def _hf_processed_logprobs(hf, ids, mask, seqs, procs):
    """log_softmax of transformers' processors over the teacher-forced logits of `seqs`: what
    sampling drew each token from."""
    from transformers import LogitsProcessorList
    plist = LogitsProcessorList(procs)
    with torch.no_grad():
        lg = hf(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
                decoder_input_ids=torch.as_tensor(seqs)).logits.float()
        out = np.zeros(seqs.shape[0])
        gm = _generated_mask(seqs)
        for t in range(1, seqs.shape[1]):
            s = plist(torch.as_tensor(seqs[:, :t]), lg[:, t - 1].clone())
            lp = torch.log_softmax(s.double(), dim=-1).numpy()
            tok = seqs[:, t]
            out += np.where(gm[:, t - 1], lp[np.arange(len(tok)), tok], 0)
    return out


def test_sampling_scores_and_return_sequences(checkpoint, src):
    """Sampling with k samples per source: B*k rows source-major; the scores are the chosen
    tokens' log-probabilities under the processed (penalised, tempered, top-k) distribution,
    as transformers' processors give them on the teacher-forced logits."""
    from transformers import (ForcedEOSTokenLogitsProcessor, RepetitionPenaltyLogitsProcessor,
                              TemperatureLogitsWarper, TopKLogitsWarper)
    m, hf = _model(checkpoint, "swish_untied")
    ids, mask = src
    k = 3
    kw = dict(max_new_tokens=12, do_sample=True, seed=7, temperature=0.8, top_k=20,
              repetition_penalty=1.2, num_return_sequences=k)
    out, sc = m.generate(ids, mask, return_scores=True, **kw)
    assert out.shape[0] == ids.shape[0] * k and sc.shape == (out.shape[0],)
    procs = [RepetitionPenaltyLogitsProcessor(1.2), ForcedEOSTokenLogitsProcessor(13, EOS),
             TemperatureLogitsWarper(0.8), TopKLogitsWarper(20)]
    want = _hf_processed_logprobs(hf, np.repeat(ids, k, 0), np.repeat(mask, k, 0), out, procs)
    np.testing.assert_allclose(sc, want, rtol=1e-4, atol=1e-4)
    # k samples differ; sample 0 of each source is what num_return_sequences=1 gives
    kw1 = dict(kw, num_return_sequences=1)
    one, sc1 = m.generate(ids, mask, return_scores=True, **kw1)
    L = one.shape[1]
    first = out[::k]
    np.testing.assert_array_equal(first[:, :L], one)
    assert np.all(first[:, L:] == PAD)
    np.testing.assert_array_equal(sc[::k], sc1)
    assert len({tuple(r) for r in out}) > ids.shape[0]


def test_sampling_top_k_1_samples_are_greedy(checkpoint, src):
    m, _ = _model(checkpoint, "relu_untied")
    ids, mask = src
    greedy = m.generate(ids, mask, max_new_tokens=NEW, repetition_penalty=1.3)
    out = m.generate(ids, mask, max_new_tokens=NEW, repetition_penalty=1.3, do_sample=True,
                     top_k=1, num_return_sequences=2, seed=1)
    np.testing.assert_array_equal(out, np.repeat(greedy, 2, axis=0))


# -- decoder_input_ids: a forced prefix -------------------------------------------------------

def _prefix(B, n, seed=1, start=True):
    body = np.random.default_rng(seed).integers(1, PAD, size=(B, n))
    return np.concatenate([np.full((B, 1), PAD), body], 1) if start else body


PREFIX_CASES = [dict(max_new_tokens=10), dict(max_new_tokens=10, num_beams=3),
                dict(max_new_tokens=10, num_beams=4, length_penalty=2.0,
                     early_stopping="never"),
                dict(), dict(min_new_tokens=6, max_new_tokens=12),
                dict(max_new_tokens=10, num_beams=3, num_return_sequences=2,
                     no_repeat_ngram_size=2, repetition_penalty=1.3)]


@pytest.mark.parametrize("name", ["relu_untied", "swish_untied"])
@pytest.mark.parametrize("kw", PREFIX_CASES, ids=[str(k) for k in PREFIX_CASES])
def test_prefix_equal_transformers(checkpoint, src, name, kw):
    m, hf = _model(checkpoint, name)
    ids, mask = src
    pre = _prefix(ids.shape[0], 3)
    ref = hf_generate(hf, ids, mask, decoder_input_ids=torch.as_tensor(pre), **kw)
    out = m.generate(ids, mask, decoder_input_ids=pre, **kw)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(out[:, :4], np.repeat(pre, kw.get("num_return_sequences", 1), 0))
    # without the start token: prepended (transformers' rule)
    np.testing.assert_array_equal(m.generate(ids, mask, decoder_input_ids=pre[:, 1:], **kw), out)


def test_prefix_scores_and_forced_decoding(checkpoint, src):
    m, hf = _model(checkpoint, "swish_untied")
    ids, mask = src
    pre = _prefix(ids.shape[0], 2)
    ref = _hf_dict(hf, ids, mask, decoder_input_ids=torch.as_tensor(pre), max_new_tokens=10,
                   num_beams=3)
    out, sc = m.generate(ids, mask, decoder_input_ids=pre, max_new_tokens=10, num_beams=3,
                         return_scores=True)
    np.testing.assert_array_equal(out, ref.sequences.numpy())
    np.testing.assert_allclose(sc, ref.sequences_scores.numpy(), rtol=1e-4, atol=1e-5)
    ref = _hf_dict(hf, ids, mask, decoder_input_ids=torch.as_tensor(pre), max_new_tokens=10)
    out, sc = m.generate(ids, mask, decoder_input_ids=pre, max_new_tokens=10,
                         return_scores=True)
    seqs = ref.sequences.numpy()
    np.testing.assert_array_equal(out, seqs)
    tr = hf.compute_transition_scores(ref.sequences, ref.scores, normalize_logits=True).numpy()
    np.testing.assert_allclose(sc, np.where(_generated_mask(seqs, 3), tr, 0).sum(1),
                               rtol=1e-5, atol=1e-4)
    # a greedy output's start forced again: generation continues exactly as before
    go = np.flatnonzero(~np.any(out[:, 1:6] == EOS, axis=1))        # rows not ended by then
    assert go.size >= 3
    again = m.generate(ids[go], mask[go], decoder_input_ids=out[go, :6], max_new_tokens=7)
    np.testing.assert_array_equal(again[:, :out.shape[1]], out[go, :again.shape[1]])
    # max_new_tokens=0 returns the prefix
    np.testing.assert_array_equal(m.generate(ids, mask, decoder_input_ids=pre,
                                             max_new_tokens=0), pre)


def test_prefix_errors(checkpoint, src):
    m, _ = _model(checkpoint, "relu_untied", generation=dict(max_length=4))
    ids, mask = src
    B = ids.shape[0]
    with pytest.raises(ValueError, match="decoder_input_ids.*max_length"):
        m.generate(ids, mask, decoder_input_ids=_prefix(B, 3))     # transformers raises too
    assert m.generate(ids, mask, decoder_input_ids=_prefix(B, 3), max_new_tokens=2).shape == (B, 6)
    mixed = _prefix(B, 3)
    mixed[1, 0] = 5
    with pytest.raises(ValueError, match="decoder_input_ids"):
        m.generate(ids, mask, decoder_input_ids=mixed, max_new_tokens=2)
    with pytest.raises(ValueError, match="decoder_input_ids"):
        m.generate(ids, mask, decoder_input_ids=_prefix(B - 1, 3), max_new_tokens=2)
    with pytest.raises(ValueError, match="decoder_input_ids"):
        m.generate(ids, mask, decoder_input_ids=np.full((B, 2), 64), max_new_tokens=2)
    with pytest.raises(ValueError, match="decoder_input_ids"):
        m.generate(ids, mask, decoder_input_ids=np.full((B, 2, 1), 3), max_new_tokens=2)
    with pytest.raises(TypeError, match="decoder_input_ids"):
        m.generate(ids, mask, decoder_input_ids=np.full((B, 2), 3.0), max_new_tokens=2)
    with pytest.raises(ValueError, match="decoder_input_ids.*max_position_embeddings"):
        m.generate(ids, mask, decoder_input_ids=_prefix(B, 120), max_new_tokens=10)


# -- streamer ---------------------------------------------------------------------------------

class Collect:
    def __init__(self):
        self.pieces, self.ended = [], 0

    def put(self, value):
        assert not self.ended
        self.pieces.append(value.numpy() if hasattr(value, "numpy") else value)

    def end(self):
        self.ended += 1


@pytest.mark.parametrize("kw", [dict(max_new_tokens=NEW), dict(max_new_tokens=4),
                                dict(max_new_tokens=NEW, repetition_penalty=1.5),
                                dict(max_new_tokens=8, decoder_input_ids=np.array([[PAD, 7, 9]]))])
def test_streamer_equals_transformers(checkpoint, src, kw):
    m, hf = _model(checkpoint, "relu_untied")
    ids, mask = src
    for b in range(3):
        one = ids[b:b + 1, :int(mask[b].sum())]
        ours, theirs = Collect(), Collect()
        out = m.generate(one, streamer=ours, **kw)
        hkw = dict(kw)
        if "decoder_input_ids" in hkw:
            hkw["decoder_input_ids"] = torch.as_tensor(hkw["decoder_input_ids"])
        ref = hf_generate(hf, one, streamer=theirs, **hkw)
        np.testing.assert_array_equal(out, ref)
        assert ours.ended == 1 and theirs.ended == 1
        assert len(ours.pieces) == len(theirs.pieces)
        for a, t in zip(ours.pieces, theirs.pieces):
            assert isinstance(a, np.ndarray) and a.dtype == np.int64 and a.shape == t.shape
            np.testing.assert_array_equal(a, t)
        np.testing.assert_array_equal(np.concatenate([p.ravel() for p in ours.pieces]), out[0])


def test_streamer_with_sampling_and_errors(checkpoint, src):
    m, _ = _model(checkpoint, "relu_untied")
    ids, mask = src
    one = ids[:1, :int(mask[0].sum())]
    s = Collect()
    out = m.generate(one, streamer=s, do_sample=True, seed=3, max_new_tokens=NEW)
    np.testing.assert_array_equal(np.concatenate([p.ravel() for p in s.pieces]), out[0])
    assert s.pieces[0].shape == (1, 1) and all(p.shape == (1,) for p in s.pieces[1:])
    with pytest.raises(ValueError, match="streamer.*beam"):
        m.generate(one, streamer=Collect(), num_beams=2)
    with pytest.raises(ValueError, match="streamer.*batch size 1"):
        m.generate(ids, mask, streamer=Collect())
    with pytest.raises(ValueError, match="streamer.*batch size 1"):
        m.generate(one, streamer=Collect(), do_sample=True, num_return_sequences=2)
    with pytest.raises(TypeError, match="streamer"):
        m.generate(one, streamer=object())
    s = Collect()
    np.testing.assert_array_equal(m.generate(one, streamer=s, max_new_tokens=0), [[PAD]])
    assert s.ended == 1 and len(s.pieces) == 1


# -- score() ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["relu_untied", "gelu_unshared"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_score_equals_teacher_forced_log_softmax(checkpoint, src, name, dtype):
    path, hf = checkpoint(name)
    m = fastattn.Seq2SeqTransformer.from_pretrained(path, dtype=dtype)
    ids, mask = src
    gen = m.generate(ids, mask, max_new_tokens=NEW)
    labels = np.where(np.arange(gen.shape[1] - 1) < (gen[:, 1:] != PAD).sum(1)[:, None],
                      gen[:, 1:], -100)                      # EOS scored, padding ignored
    orig = labels.copy()
    labels[1, 0] = 17 if labels[1, 0] != 17 else 18          # not what the model would say
    got = score(m, ids, labels, mask)
    assert got.dtype == np.float64 and got.shape == labels.shape
    ref_model = hf.double() if dtype == np.float64 else hf
    try:
        with torch.no_grad():
            lg = ref_model(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
                           labels=torch.as_tensor(labels)).logits.double()
    finally:
        hf.float()
    lp = torch.log_softmax(lg, dim=-1).numpy()
    want = np.where(labels >= 0, np.take_along_axis(lp, np.maximum(labels, 0)[..., None],
                                                    -1)[..., 0], 0.0)
    np.testing.assert_allclose(got, want, rtol=1e-4 if dtype == np.float32 else 1e-9,
                               atol=1e-4 if dtype == np.float32 else 1e-9)
    assert np.all(got[labels == -100] == 0)
    # plain greedy (no processor but the forced EOS at the limit): its return_scores is the
    # sum of score() over its own output
    _, sc = m.generate(ids, mask, max_new_tokens=NEW, return_scores=True)
    full = gen[:, -1] != PAD          # rows cut by the forced EOS: generate scores it 0
    s = score(m, ids, orig, mask)
    s = s.sum(1) - np.where(full, s[:, -1], 0)
    np.testing.assert_allclose(sc, s, rtol=1e-5, atol=1e-5)


def test_score_rows_and_errors(ids):
    m = small_model()
    lab = np.random.default_rng(2).integers(0, 63, size=(3, 7))
    lab[0, 4:] = -100
    full = score(m, ids, lab)
    for b in range(3):
        np.testing.assert_array_equal(score(m, ids[b:b + 1], lab[b:b + 1]), full[b:b + 1])
    np.testing.assert_array_equal(score(m, ids, lab, n_threads=1), score(m, ids, lab, n_threads=2))
    assert np.all(full[0, 4:] == 0) and np.all(full[:, :4] < 0)
    np.testing.assert_array_equal(score(m, ids[0], lab[0]), full[:1])        # 1-D: one row
    assert score(m, ids, np.full((3, 4), -100)).tolist() == [[0.0] * 4] * 3
    assert score(m, ids, np.zeros((3, 0), int)).shape == (3, 0)
    with pytest.raises(TypeError, match="labels"):
        score(m, ids, lab.astype(float))
    with pytest.raises(ValueError, match="labels"):
        score(m, ids, np.full((3, 2), -5))
    with pytest.raises(ValueError, match="labels"):
        score(m, ids, np.full((3, 2), 64))
    with pytest.raises(ValueError, match="labels"):
        score(m, ids, lab[:2])
    with pytest.raises(ValueError, match="labels"):
        score(m, ids, np.zeros((3, 65), int))
    with pytest.raises(ValueError, match="input_ids"):
        score(m, ids + 100, lab)


# -- the checkpoint's generation config -------------------------------------------------------

GEN_FILES = [dict(repetition_penalty=1.4, no_repeat_ngram_size=2),
             dict(num_beams=4, num_return_sequences=2, encoder_no_repeat_ngram_size=1,
                  max_length=14),
             dict(num_beams=3, repetition_penalty=0.8, no_repeat_ngram_size=3, max_length=12)]


@pytest.mark.parametrize("gen", GEN_FILES, ids=[str(g) for g in GEN_FILES])
def test_generation_config_file_is_honoured(checkpoint, src, gen):
    path, _ = checkpoint("swish_untied", generation=gen)
    from transformers import MarianMTModel
    hf = MarianMTModel.from_pretrained(path).eval()
    m = fastattn.Seq2SeqTransformer.from_pretrained(path)
    for k, v in gen.items():
        assert m.generation_config[k] == v
    ids, mask = src
    ref = hf_generate(hf, ids, mask)
    np.testing.assert_array_equal(m.generate(ids, mask), ref)


@pytest.mark.parametrize("field,value", [
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0), ("repetition_penalty", "1.2"),
    ("no_repeat_ngram_size", -1), ("no_repeat_ngram_size", 2.5),
    ("encoder_no_repeat_ngram_size", -2), ("encoder_no_repeat_ngram_size", True),
    ("num_return_sequences", 0), ("num_return_sequences", 1.5)])
def test_generation_config_file_bad_values(tmp_path, checkpoint, field, value):
    import json
    import shutil
    path, _ = checkpoint("relu_untied")
    d = tmp_path / "m"
    shutil.copytree(path, d)
    gen = json.loads((d / "generation_config.json").read_text())
    gen[field] = value
    (d / "generation_config.json").write_text(json.dumps(gen))
    with pytest.raises(ValueError, match=f"generation_config.json.*{field}"):
        fastattn.Seq2SeqTransformer.from_pretrained(d)


# -- the bitwise contract ---------------------------------------------------------------------

CONTRACT = [dict(repetition_penalty=1.4), dict(no_repeat_ngram_size=2),
            dict(encoder_no_repeat_ngram_size=1), dict(num_beams=3, no_repeat_ngram_size=2,
                                                       repetition_penalty=1.2),
            dict(num_beams=4, num_return_sequences=3, encoder_no_repeat_ngram_size=2),
            dict(do_sample=True, seed=5, num_return_sequences=3, repetition_penalty=1.3),
            dict(do_sample=True, seed=5, num_beams=2, num_return_sequences=2),
            dict(decoder_input_ids="prefix"), dict(decoder_input_ids="prefix", num_beams=3)]


@pytest.mark.parametrize("kw", CONTRACT, ids=[str(k) for k in CONTRACT])
def test_rows_alone_and_thread_counts(checkpoint, src, kw):
    """A source alone (unpadded) gives bitwise the same rows and scores as in a padded batch
    (for sampling: as the first row of a batch, stream 0), with 1 or 2 threads."""
    m, _ = _model(checkpoint, "swish_untied")
    ids, mask = src
    B = ids.shape[0]
    kw = dict(kw)
    pre = _prefix(B, 2) if kw.get("decoder_input_ids") == "prefix" else None
    kw.pop("decoder_input_ids", None)
    k = kw.get("num_return_sequences", 1)
    full, sc = m.generate(ids, mask, max_new_tokens=14, return_scores=True,
                          decoder_input_ids=pre, n_threads=2, **kw)
    full1, sc1 = m.generate(ids, mask, max_new_tokens=14, return_scores=True,
                            decoder_input_ids=pre, n_threads=1, **kw)
    np.testing.assert_array_equal(full, full1)
    np.testing.assert_array_equal(sc, sc1)
    for b in range(B):
        n = int(mask[b].sum())
        p = None if pre is None else pre[b:b + 1]
        if kw.get("do_sample"):
            # source b draws from stream b: the batch of sources 0..b, padded, gives its rows
            part, s = m.generate(ids[:b + 1], mask[:b + 1], max_new_tokens=14,
                                 return_scores=True, **kw)
            alone, s = part[b * k:], s[b * k:]
        else:
            alone, s = m.generate(ids[b:b + 1, :n], max_new_tokens=14, return_scores=True,
                                  decoder_input_ids=p, **kw)
        L = alone.shape[1]
        np.testing.assert_array_equal(full[b * k:(b + 1) * k, :L], alone)
        assert np.all(full[b * k:(b + 1) * k, L:] == PAD)
        np.testing.assert_array_equal(sc[b * k:(b + 1) * k], s)
    if kw.get("do_sample"):        # and source 0 alone, unpadded, is row 0 of any batch
        alone = m.generate(ids[:1, :int(mask[0].sum())], max_new_tokens=14, **kw)
        np.testing.assert_array_equal(full[:k, :alone.shape[1]], alone)


# -- bad values name the argument -------------------------------------------------------------

BAD = [
    ("repetition_penalty", 0), ("repetition_penalty", -1.0), ("repetition_penalty", 1e300),
    ("repetition_penalty", 1e-300), ("repetition_penalty", float("nan")),
    ("repetition_penalty", float("inf")), ("repetition_penalty", "1.2"),
    ("repetition_penalty", True),
    ("no_repeat_ngram_size", -1), ("no_repeat_ngram_size", float("nan")),
    ("no_repeat_ngram_size", 2.0), ("no_repeat_ngram_size", "2"), ("no_repeat_ngram_size", True),
    ("encoder_no_repeat_ngram_size", -1), ("encoder_no_repeat_ngram_size", float("nan")),
    ("encoder_no_repeat_ngram_size", 1.5), ("encoder_no_repeat_ngram_size", [1]),
    ("num_return_sequences", 0), ("num_return_sequences", -1),
    ("num_return_sequences", float("nan")), ("num_return_sequences", 2.0),
    ("num_return_sequences", "2"), ("num_return_sequences", False),
]


@pytest.mark.parametrize("arg,value", BAD, ids=[f"{a}={v!r}" for a, v in BAD])
def test_bad_values_name_the_argument(ids, arg, value):
    m = small_model()
    with pytest.raises((ValueError, TypeError), match=arg):
        m.generate(ids, max_new_tokens=3, do_sample=True, **{arg: value})


def test_bad_combinations(ids):
    m = small_model()
    with pytest.raises(ValueError, match="num_return_sequences"):
        m.generate(ids, num_return_sequences=2)                      # greedy: 1 only
    with pytest.raises(ValueError, match="num_return_sequences"):
        m.generate(ids, num_beams=3, num_return_sequences=4)         # <= num_beams
    with pytest.raises(ValueError, match="num_return_sequences"):
        m.generate(ids, num_beams=3, num_return_sequences=10**12)
    with pytest.raises(MemoryError, match="num_return_sequences"):
        m.generate(ids, do_sample=True, num_return_sequences=10**9, max_new_tokens=3)
    with pytest.raises(TypeError, match="return_scores"):
        m.generate(ids, return_scores=1)
    with pytest.raises(TypeError, match="return_scores"):
        m.generate(ids, return_scores="yes")
    # n-gram sizes longer than any sequence ban nothing (transformers accepts them too)
    plain = m.generate(ids, max_new_tokens=6)
    np.testing.assert_array_equal(m.generate(ids, max_new_tokens=6, no_repeat_ngram_size=10**12,
                                             encoder_no_repeat_ngram_size=10**12), plain)
    # the neutral values change nothing
    np.testing.assert_array_equal(m.generate(ids, max_new_tokens=6, repetition_penalty=1.0,
                                             no_repeat_ngram_size=0,
                                             encoder_no_repeat_ngram_size=0,
                                             num_return_sequences=1), plain)


# -- forced_bos_token_id (the target language of mBART-50, M2M100, NLLB) ---------------------

@pytest.mark.parametrize("kw", [dict(forced_bos_token_id=7),
                                dict(forced_bos_token_id=11, num_beams=3,
                                     repetition_penalty=1.3)])
def test_forced_bos_matches_transformers(checkpoint, src, kw):
    path, hf = checkpoint("swish_untied")
    model = fastattn.Seq2SeqTransformer.from_pretrained(path)
    ids, mask = src
    got = model.generate(ids, mask, max_new_tokens=12, **kw)
    want = hf_generate(hf, ids, mask, max_new_tokens=12, do_sample=False, **kw)
    np.testing.assert_array_equal(got, want)
    assert np.all(got[:, 1] == kw["forced_bos_token_id"])


def test_forced_bos_from_the_checkpoint_and_bad_values(checkpoint, src, tmp_path):
    import json
    import shutil
    path, _ = checkpoint("swish_untied")
    d = tmp_path / "fb"
    shutil.copytree(path, d)
    gen = json.load(open(d / "generation_config.json"))
    json.dump(dict(gen, forced_bos_token_id=9), open(d / "generation_config.json", "w"))
    model = fastattn.Seq2SeqTransformer.from_pretrained(d)
    ids, mask = src
    assert np.all(model.generate(ids, mask, max_new_tokens=3)[:, 1] == 9)
    for bad in (-1, 10 ** 6, 2.5, True):
        with pytest.raises(ValueError, match="forced_bos_token_id"):
            model.generate(ids, mask, max_new_tokens=3, forced_bos_token_id=bad)
    json.dump(dict(gen, forced_bos_token_id=10 ** 6), open(d / "generation_config.json", "w"))
    with pytest.raises(ValueError, match="forced_bos_token_id"):
        fastattn.Seq2SeqTransformer.from_pretrained(d)
