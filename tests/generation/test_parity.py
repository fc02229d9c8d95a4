"""Seq2SeqTransformer against transformers' MarianMTModel: forward passes and generate."""
import numpy as np
import pytest

import fastattn
from marian_helpers import PAD, hf_generate, marian_like_generation

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = {np.float32: 1e-4, np.float64: 1e-9}


def _rel(a, b):
    return np.abs(a - b).max() / np.abs(b).max()


def _varied(out):
    """Outputs worth comparing token by token: several lengths or several tokens per row."""
    lengths = {int((r != PAD).sum()) for r in out}
    distinct = np.mean([len(set(r.tolist())) for r in out])
    return len(lengths) >= 2 or distinct >= 3


@pytest.mark.parametrize("name", ["relu_untied", "swish_untied", "relu_tied", "gelu_unshared"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_encoder_and_logits(checkpoint, src, name, dtype):
    path, hf = checkpoint(name)
    ids, mask = src
    model = fastattn.Seq2SeqTransformer.from_pretrained(path, dtype=dtype)
    assert model.dtype == dtype
    ref_model = hf.double() if dtype == np.float64 else hf.float()
    rng = np.random.default_rng(1)
    dec = np.concatenate([np.full((ids.shape[0], 1), PAD), rng.integers(0, PAD, (ids.shape[0], 9))], 1)
    with torch.no_grad():
        t_ids, t_mask = torch.as_tensor(ids), torch.as_tensor(mask)
        enc_ref = ref_model.model.encoder(input_ids=t_ids, attention_mask=t_mask).last_hidden_state
        lg_ref = ref_model(input_ids=t_ids, attention_mask=t_mask,
                           decoder_input_ids=torch.as_tensor(dec)).logits
    hf.float()
    enc = model.encode(ids, mask)
    lg = model.logits(ids, dec, mask)
    assert enc.dtype == dtype and lg.dtype == dtype
    assert enc.shape == (ids.shape[0], ids.shape[1], model.d_model)
    assert lg.shape == (ids.shape[0], dec.shape[1], model.vocab_size)
    # padded source positions are outputs too, but only real tokens matter downstream
    m = mask.astype(bool)
    assert _rel(enc[m], enc_ref.numpy()[m]) <= TOL[dtype]
    assert _rel(lg, lg_ref.numpy()) <= TOL[dtype]


@pytest.mark.parametrize("name", ["relu_untied", "swish_untied", "relu_tied", "gelu_unshared"])
def test_greedy_equal(checkpoint, src, name):
    path, hf = checkpoint(name)
    ids, mask = src
    model = fastattn.Seq2SeqTransformer.from_pretrained(path)
    ref = hf_generate(hf, ids, mask, max_new_tokens=20)
    out = model.generate(ids, mask, max_new_tokens=20)
    assert _varied(ref)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, ref)
    # no mask: pad positions are padding
    np.testing.assert_array_equal(model.generate(ids, max_new_tokens=20), ref)


BEAMS = [(2, 1.0, False), (3, 1.0, True), (4, 1.0, "never"), (4, 0.5, False), (5, 2.0, True),
         (3, -1.0, False), (4, 1.5, "never"), (2, 0.0, True)]


@pytest.mark.parametrize("name", ["relu_untied", "swish_untied", "relu_tied"])
@pytest.mark.parametrize("num_beams,length_penalty,early_stopping", BEAMS)
def test_beam_equal(checkpoint, src, name, num_beams, length_penalty, early_stopping):
    path, hf = checkpoint(name)
    ids, mask = src
    model = fastattn.Seq2SeqTransformer.from_pretrained(path)
    kw = dict(max_new_tokens=16, num_beams=num_beams, length_penalty=length_penalty,
              early_stopping=early_stopping)
    ref = hf_generate(hf, ids, mask, **kw)
    out = model.generate(ids, mask, **kw)
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("name", ["relu_untied", "swish_untied"])
def test_checkpoint_defaults(checkpoint, src, name):
    """OPUS-MT style generation_config.json: num_beams, max_length, bad_words_ids=[[pad]],
    renormalize_logits, forced EOS at max_length; generate() with no arguments."""
    path, _ = checkpoint(name, generation=marian_like_generation(max_length=12))
    from transformers import MarianMTModel
    hf = MarianMTModel.from_pretrained(path).eval()
    ids, mask = src
    model = fastattn.Seq2SeqTransformer.from_pretrained(path)
    assert model.generation_config["num_beams"] == 4
    ref = hf_generate(hf, ids, mask)
    out = model.generate(ids, mask)
    np.testing.assert_array_equal(out, ref)
    ref = hf_generate(hf, ids, mask, num_beams=1)
    np.testing.assert_array_equal(model.generate(ids, mask, num_beams=1), ref)


def test_default_length_without_generation_max_length(checkpoint, src):
    path, hf = checkpoint("relu_untied")
    ids, mask = src
    model = fastattn.Seq2SeqTransformer.from_pretrained(path)
    ref = hf_generate(hf, ids, mask)               # 20 new tokens at most
    np.testing.assert_array_equal(model.generate(ids, mask), ref)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_row_independent_of_batch(checkpoint, src, num_beams):
    path, _ = checkpoint("swish_untied")
    ids, mask = src
    model = fastattn.Seq2SeqTransformer.from_pretrained(path)
    full = model.generate(ids, mask, max_new_tokens=18, num_beams=num_beams)
    for b in range(ids.shape[0]):
        n = int(mask[b].sum())
        alone = model.generate(ids[b:b + 1, :n], max_new_tokens=18, num_beams=num_beams)[0]
        np.testing.assert_array_equal(full[b, :alone.size], alone)
        assert np.all(full[b, alone.size:] == PAD)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_min_new_tokens(checkpoint, src, num_beams):
    path, hf = checkpoint("swish_untied")
    ids, mask = src
    model = fastattn.Seq2SeqTransformer.from_pretrained(path)
    kw = dict(max_new_tokens=15, min_new_tokens=6, num_beams=num_beams)
    ref = hf_generate(hf, ids, mask, **kw)
    out = model.generate(ids, mask, **kw)
    np.testing.assert_array_equal(out, ref)
    assert not np.any(out[:, 1:7] == 0)


@pytest.mark.parametrize("num_beams", [1, 2])
def test_suppress_and_bad_words(checkpoint, src, num_beams):
    path, hf = checkpoint("relu_untied")
    ids, mask = src
    model = fastattn.Seq2SeqTransformer.from_pretrained(path)
    plain = model.generate(ids, mask, max_new_tokens=15, num_beams=num_beams)
    common = np.bincount(plain[:, 1:].ravel(), minlength=64)
    common[[0, PAD]] = 0
    top = [int(t) for t in np.argsort(-common)[:2]]
    kw = dict(max_new_tokens=15, num_beams=num_beams, suppress_tokens=[top[0]],
              bad_words_ids=[[top[1]], [12, 2], [PAD, 27]])
    ref = hf_generate(hf, ids, mask, **kw)
    out = model.generate(ids, mask, **kw)
    np.testing.assert_array_equal(out, ref)
    assert not np.any(out[:, 1:] == top[0]) and not np.any(out[:, 1:] == top[1])
    assert not np.any((out[:, :-1] == 12) & (out[:, 1:] == 2))


@pytest.mark.parametrize("num_beams", [1, 4])
def test_forced_eos_at_length_limit(checkpoint, src, num_beams):
    path, hf = checkpoint("relu_untied")
    ids, mask = src
    model = fastattn.Seq2SeqTransformer.from_pretrained(path)
    ref = hf_generate(hf, ids, mask, max_new_tokens=6, num_beams=num_beams)
    out = model.generate(ids, mask, max_new_tokens=6, num_beams=num_beams)
    np.testing.assert_array_equal(out, ref)
    assert out.shape[1] == 7
    full_rows = out[:, -1] != PAD
    assert full_rows.any() and np.all(out[full_rows, -1] == 0)


def test_max_new_tokens_zero(checkpoint, src):
    path, _ = checkpoint("relu_untied")
    model = fastattn.Seq2SeqTransformer.from_pretrained(path)
    out = model.generate(src[0], src[1], max_new_tokens=0)
    np.testing.assert_array_equal(out, np.full((src[0].shape[0], 1), PAD))


@pytest.mark.parametrize("num_beams", [1, 3])
def test_float64_generate_equal(checkpoint, src, num_beams):
    path, hf = checkpoint("swish_untied")
    ids, mask = src
    model = fastattn.Seq2SeqTransformer.from_pretrained(path, dtype=np.float64)
    try:
        ref = hf_generate(hf.double(), ids, mask, max_new_tokens=16, num_beams=num_beams)
    finally:
        hf.float()
    np.testing.assert_array_equal(model.generate(ids, mask, max_new_tokens=16,
                                                 num_beams=num_beams), ref)
