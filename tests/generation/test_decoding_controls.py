"""The decoding controls CTranslate2 users rely on, against transformers' own generate:
repetition_penalty, no_repeat_ngram_size, encoder_no_repeat_ngram_size, num_return_sequences,
forced_bos_token_id, decoder_input_ids as a forced prefix, return_scores (sequences_scores /
summed log-probabilities), score (forced decoding) and the streamer protocol."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import fastattn  # noqa: E402
from fastattn.generation import score  # noqa: E402
from marian_helpers import EOS, PAD, hf_generate, sources  # noqa: E402

CASES = [
    dict(repetition_penalty=1.8),
    dict(repetition_penalty=0.7, num_beams=3),
    dict(no_repeat_ngram_size=2),
    dict(no_repeat_ngram_size=3, num_beams=4),
    dict(encoder_no_repeat_ngram_size=1),
    dict(encoder_no_repeat_ngram_size=2, num_beams=3),
    dict(num_beams=4, num_return_sequences=3),
    dict(num_beams=3, num_return_sequences=3, length_penalty=0.5, no_repeat_ngram_size=2),
    dict(forced_bos_token_id=7),
    dict(forced_bos_token_id=11, num_beams=3, repetition_penalty=1.3),
]


@pytest.mark.parametrize("kw", CASES, ids=[str(c) for c in CASES])
def test_controls_match_transformers(checkpoint, src, kw):
    path, hf = checkpoint("swish_untied")
    model = fastattn.Seq2SeqTransformer.from_pretrained(path)
    ids, mask = src
    if "encoder_no_repeat_ngram_size" in kw:      # sources holding the bigrams decoding makes
        ids = ids.copy()
        ids[:, :4] = [2, 46, 2, 58]
    got = model.generate(ids, mask, max_new_tokens=16, **kw)
    want = hf_generate(hf, ids, mask, max_new_tokens=16, do_sample=False, **kw)
    np.testing.assert_array_equal(got, want)
    plain = model.generate(ids, mask, max_new_tokens=16, num_beams=kw.get("num_beams", 1))
    if "num_return_sequences" not in kw:
        assert not np.array_equal(got, plain), "the control changed nothing: a vacuous case"


@pytest.mark.parametrize("kw", [dict(), dict(num_beams=3)])
def test_forced_prefix_matches_transformers(checkpoint, src, kw):
    path, hf = checkpoint("relu_untied")
    model = fastattn.Seq2SeqTransformer.from_pretrained(path)
    ids, mask = src
    prefix = np.random.default_rng(1).integers(1, PAD - 1, size=(len(ids), 3))
    got = model.generate(ids, mask, max_new_tokens=10, decoder_input_ids=prefix, **kw)
    with torch.no_grad():
        want = hf.generate(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
                           decoder_input_ids=torch.as_tensor(
                               np.concatenate([np.full((len(ids), 1), PAD), prefix], 1)),
                           max_new_tokens=10, do_sample=False, **kw).numpy()
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(got[:, 1:4], prefix)


def test_scores_match_transformers(checkpoint, src):
    path, hf = checkpoint("swish_untied")
    model = fastattn.Seq2SeqTransformer.from_pretrained(path)
    ids, mask = src
    t_ids, t_mask = torch.as_tensor(ids), torch.as_tensor(mask)
    # beam search: sequences_scores
    seqs, scores = model.generate(ids, mask, max_new_tokens=12, num_beams=3,
                                  num_return_sequences=2, return_scores=True)
    with torch.no_grad():
        out = hf.generate(input_ids=t_ids, attention_mask=t_mask, max_new_tokens=12, num_beams=3,
                          num_return_sequences=2, return_dict_in_generate=True,
                          output_scores=True, do_sample=False)
    np.testing.assert_array_equal(seqs, out.sequences.numpy())
    np.testing.assert_allclose(scores, out.sequences_scores.numpy(), rtol=1e-5, atol=1e-6)
    # greedy: the generated tokens' log-probabilities up to EOS
    seqs, scores = model.generate(ids, mask, max_new_tokens=12, return_scores=True)
    with torch.no_grad():
        out = hf.generate(input_ids=t_ids, attention_mask=t_mask, max_new_tokens=12,
                          return_dict_in_generate=True, output_scores=True, do_sample=False)
        trans = hf.compute_transition_scores(out.sequences, out.scores,
                                             normalize_logits=True).numpy()
    np.testing.assert_array_equal(seqs, out.sequences.numpy())
    gen = out.sequences.numpy()[:, 1:]
    upto_eos = np.cumsum(np.cumsum(gen == EOS, axis=1), axis=1) <= 1     # through the first EOS
    want = np.where(upto_eos, trans, 0).sum(axis=1)
    np.testing.assert_allclose(scores, want, rtol=1e-5, atol=1e-5)


def test_sampling_return_sequences_and_row_invariance(checkpoint, src):
    path, _ = checkpoint("swish_untied")
    model = fastattn.Seq2SeqTransformer.from_pretrained(path)
    ids, mask = src
    kw = dict(max_new_tokens=10, do_sample=True, top_k=20, num_return_sequences=3, seed=4,
              repetition_penalty=1.4, no_repeat_ngram_size=2)
    got = model.generate(ids, mask, **kw)
    assert got.shape[0] == 3 * len(ids)
    assert len({tuple(r) for r in got[:3]}) > 1, "three samples of one source all alike"
    # thread count: the same bits
    np.testing.assert_array_equal(got, model.generate(ids, mask, n_threads=1, **kw))
    # greedy with the controls: each source alone gives its rows of the batch
    kw = dict(max_new_tokens=12, repetition_penalty=1.5, no_repeat_ngram_size=2,
              encoder_no_repeat_ngram_size=3)
    batch = model.generate(ids, mask, **kw)
    for i in range(len(ids)):
        n = int(mask[i].sum())
        alone = model.generate(ids[i:i + 1, :n], **dict(kw, encoder_no_repeat_ngram_size=None))
        if n == ids.shape[1]:      # the encoder n-grams include padding, as in transformers
            alone = model.generate(ids[i:i + 1, :n], **kw)
            np.testing.assert_array_equal(alone[0], batch[i, :alone.shape[1]])


def test_score_matches_transformers(checkpoint, src):
    path, hf = checkpoint("relu_untied")
    model = fastattn.Seq2SeqTransformer.from_pretrained(path)
    ids, mask = src
    labels = np.random.default_rng(2).integers(1, PAD - 1, size=(len(ids), 7))
    labels[0, 5:] = -100
    got = model.score(ids, labels, mask)
    assert got.dtype == np.float64 and got.shape == labels.shape
    dec = np.concatenate([np.full((len(ids), 1), PAD), np.where(labels == -100, PAD,
                                                                 labels)[:, :-1]], 1)
    with torch.no_grad():
        logits = hf(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
                    decoder_input_ids=torch.as_tensor(dec)).logits.double()
        lp = torch.log_softmax(logits, -1).numpy()
    want = np.take_along_axis(lp, np.where(labels == -100, 0, labels)[..., None], 2)[..., 0]
    want[labels == -100] = 0
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert np.all(got[0, 5:] == 0)
    assert score(model, ids, labels, mask).shape == labels.shape
    with pytest.raises(ValueError, match="labels"):
        model.score(ids, labels[:2], mask)
    with pytest.raises(ValueError, match="labels"):
        model.score(ids, np.full_like(labels, PAD + 5), mask)
    with pytest.raises(TypeError, match="labels"):
        model.score(ids, labels.astype(float), mask)


class _Collect:
    def __init__(self):
        self.puts, self.ended = [], 0

    def put(self, value):
        self.puts.append(np.asarray(value))

    def end(self):
        self.ended += 1


@pytest.mark.parametrize("kw", [dict(), dict(do_sample=True, seed=3, top_k=10)])
def test_streamer_pieces_join_to_the_output(checkpoint, src, kw):
    path, hf = checkpoint("swish_untied")
    model = fastattn.Seq2SeqTransformer.from_pretrained(path)
    ids, mask = src
    n = int(mask[1].sum())
    s = _Collect()
    out = model.generate(ids[1:2, :n], max_new_tokens=14, streamer=s, **kw)
    assert s.ended == 1 and s.puts[0].shape == (1, 1) and s.puts[0][0, 0] == PAD
    joined = np.concatenate([s.puts[0][0]] + [p.reshape(-1) for p in s.puts[1:]])
    np.testing.assert_array_equal(joined, out[0])
    if not kw:        # against transformers' own streamer calls
        t = _Collect()
        hf_generate(hf, ids[1:2, :n], max_new_tokens=14, streamer=t, do_sample=False)
        assert [p.tolist() for p in s.puts[1:]] == [np.asarray(p).tolist() for p in t.puts[1:]]
    with pytest.raises(ValueError, match="streamer"):
        model.generate(ids, mask, streamer=_Collect())
    with pytest.raises(ValueError, match="streamer"):
        model.generate(ids[:1], mask[:1], num_beams=2, streamer=_Collect())
    with pytest.raises(TypeError, match="streamer"):
        model.generate(ids[:1], mask[:1], streamer=object())


@pytest.mark.parametrize("kw,name", [
    (dict(repetition_penalty=0), "repetition_penalty"),
    (dict(repetition_penalty=-1.0), "repetition_penalty"),
    (dict(repetition_penalty=float("nan")), "repetition_penalty"),
    (dict(repetition_penalty="2"), "repetition_penalty"),
    (dict(no_repeat_ngram_size=-1), "no_repeat_ngram_size"),
    (dict(no_repeat_ngram_size=2.5), "no_repeat_ngram_size"),
    (dict(encoder_no_repeat_ngram_size=-2), "encoder_no_repeat_ngram_size"),
    (dict(num_return_sequences=0), "num_return_sequences"),
    (dict(num_return_sequences=2), "num_return_sequences"),            # greedy: only 1
    (dict(num_return_sequences=5, num_beams=3), "num_return_sequences"),
    (dict(forced_bos_token_id=10 ** 6), "forced_bos_token_id"),
    (dict(forced_bos_token_id=-1), "forced_bos_token_id"),
    (dict(decoder_input_ids=np.array([[1.5]])), "decoder_input_ids"),
    (dict(decoder_input_ids=np.ones((2, 2), int)), "decoder_input_ids"),
    (dict(decoder_input_ids=np.full((6, 2), 10 ** 6)), "decoder_input_ids"),
    (dict(return_scores="yes"), "return_scores"),
])
def test_bad_values_name_the_argument(checkpoint, src, kw, name):
    path, _ = checkpoint("swish_untied")
    model = fastattn.Seq2SeqTransformer.from_pretrained(path)
    ids, mask = src
    with pytest.raises((ValueError, TypeError), match=name):
        model.generate(ids, mask, max_new_tokens=4, **kw)
