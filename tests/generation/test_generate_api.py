"""Sampling, the step API, bad inputs, checkpoint errors, a fresh-process first call."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import fastattn
from marian_helpers import PAD, VOCAB, small_model

_model = small_model


def test_built_in_code(ids):
    m = _model()
    assert (m.vocab_size, m.d_model, m.pad_id, m.eos_id, m.decoder_start_id) == (VOCAB, 32, PAD, 0, PAD)
    assert m.dtype == np.float32 and m.config["decoder_layers"] == 2
    out = m.generate(ids, max_new_tokens=7)
    assert out.shape[0] == 3 and out.shape[1] <= 8 and out.dtype == np.int64
    assert np.all(out[:, 0] == PAD)
    # the state_dict round trip reproduces the model
    m2 = fastattn.Seq2SeqTransformer.from_state_dict(
        m.state_dict(), vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=64)
    np.testing.assert_array_equal(m2.generate(ids, max_new_tokens=7), out)


@pytest.mark.parametrize("kw", [dict(positions="interleaved"), dict(positions="learned"),
                                dict(normalize_before=True, activation_function="gelu"),
                                dict(tie_word_embeddings=False, share_encoder_decoder_embeddings=False,
                                     decoder_vocab_size=40, pad_token_id=39)])
def test_variants_cache_matches_teacher_forcing(ids, kw):
    """Greedy through the KV cache == argmax of the teacher-forced logits of its own output."""
    m = _model(**kw)
    ids = np.minimum(ids, m.vocab_size - 2)
    out = m.generate(ids, max_new_tokens=10, bad_words_ids=None)
    lg = m.logits(ids, out[:, :-1])
    for b in range(out.shape[0]):
        for t in range(1, out.shape[1]):
            if out[b, t - 1] == m.eos_id and t > 1:
                break
            if out[b, t] == m.pad_id and t > 1 and out[b, t - 1] in (m.eos_id, m.pad_id):
                break
            assert out[b, t] == np.argmax(lg[b, t - 1]) or (t == 10 and out[b, t] == m.eos_id)


def test_step_api(ids):
    m = _model()
    state = m.start(ids, num_beams=2, max_length=8)
    assert state.n_rows == 6
    tok = np.full(6, m.decoder_start_id)
    l1 = state.step(tok)
    assert l1.shape == (6, VOCAB)
    ref = m.logits(ids, np.full((3, 1), PAD))[:, 0]
    np.testing.assert_allclose(l1[::2], ref, rtol=1e-5, atol=1e-5)
    nxt = np.argmax(l1, axis=1)
    state.reorder([1, 1, 2, 3, 5, 4])
    l2 = state.step(nxt[[1, 1, 2, 3, 5, 4]])
    tf = m.logits(ids, np.stack([np.full(3, PAD), nxt[[1, 2, 5]]], 1))[:, 1]
    np.testing.assert_allclose(l2[[0, 2, 4]], tf, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="source"):
        state.reorder([2, 0, 1, 3, 4, 5])
    # from an encoder output
    enc = m.encode(ids)
    s2 = m.start(encoder_output=enc)
    np.testing.assert_allclose(s2.step(np.full(3, PAD)), ref, rtol=1e-5, atol=1e-5)


def test_sampling_reproducible_and_top_k_1_is_greedy(ids):
    m = _model()
    a = m.generate(ids, max_new_tokens=12, do_sample=True, seed=11, top_k=0)
    b = m.generate(ids, max_new_tokens=12, do_sample=True, seed=11, top_k=0)
    c = m.generate(ids, max_new_tokens=12, do_sample=True, seed=12, top_k=0, temperature=2.0)
    np.testing.assert_array_equal(a, b)
    assert a.shape != c.shape or not np.array_equal(a, c)
    greedy = m.generate(ids, max_new_tokens=12)
    np.testing.assert_array_equal(m.generate(ids, max_new_tokens=12, do_sample=True, seed=1,
                                             top_k=1), greedy)
    np.testing.assert_array_equal(m.generate(ids, max_new_tokens=12, do_sample=True, seed=2,
                                             top_p=1e-6), greedy)
    # row b draws from stream b of the seed: rows after it do not change it
    one = m.generate(ids[0:1], max_new_tokens=12, do_sample=True, seed=11, top_k=0)[0]
    np.testing.assert_array_equal(a[0, :one.size], one)


def test_bad_inputs(ids):
    m = _model()
    with pytest.raises(ValueError, match="input_ids"):
        m.generate(np.array([[1, 2, VOCAB]]))
    with pytest.raises(ValueError, match="input_ids"):
        m.generate(np.array([[1, -2, 3]]))
    with pytest.raises(TypeError, match="input_ids"):
        m.generate(np.array([[1.0, 2.0]]))
    with pytest.raises(TypeError, match="input_ids"):
        m.encode([["a", "b"]])
    with pytest.raises(ValueError, match="attention_mask"):
        m.generate(ids, np.ones((3, 4)))
    with pytest.raises(ValueError, match="max_new_tokens"):
        m.generate(ids, max_new_tokens=-1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        m.generate(ids, max_new_tokens=1000)
    with pytest.raises(ValueError, match="num_beams"):
        m.generate(ids, num_beams=0)
    with pytest.raises(ValueError, match="early_stopping"):
        m.generate(ids, num_beams=2, early_stopping="sometimes")
    with pytest.raises(ValueError, match="temperature"):
        m.generate(ids, do_sample=True, temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        m.generate(ids, do_sample=True, top_p=1.5)
    with pytest.raises(ValueError, match="suppress_tokens"):
        m.generate(ids, suppress_tokens=[VOCAB + 3])
    with pytest.raises(ValueError, match="bad_words_ids"):
        m.generate(ids, bad_words_ids=[[]])
    with pytest.raises(ValueError, match="decoder_input_ids"):
        m.logits(ids, np.full((2, 1), PAD))
    with pytest.raises(ValueError, match="activation_function"):
        _model(activation_function="tanh")
    with pytest.raises(ValueError, match="divisible"):
        _model(d_model=30)
    np.testing.assert_array_equal(m.generate(ids, max_new_tokens=0), np.full((3, 1), PAD))


def _write(path, name, obj):
    with open(os.path.join(path, name), "w") as f:
        json.dump(obj, f)


def test_checkpoint_errors(tmp_path, checkpoint):
    path, _ = checkpoint("relu_untied")
    cfg = json.load(open(os.path.join(path, "config.json")))
    with pytest.raises(FileNotFoundError):
        fastattn.Seq2SeqTransformer.from_pretrained(tmp_path / "nowhere")
    bad = tmp_path / "bad"
    bad.mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        fastattn.Seq2SeqTransformer.from_pretrained(bad)
    _write(bad, "config.json", dict(cfg, model_type="gpt2"))
    with pytest.raises(ValueError, match="model_type"):
        fastattn.Seq2SeqTransformer.from_pretrained(bad)
    _write(bad, "config.json", dict(cfg, activation_function="tanh"))
    (bad / "model.safetensors").write_bytes(open(os.path.join(path, "model.safetensors"), "rb").read())
    with pytest.raises(ValueError, match="activation_function"):
        fastattn.Seq2SeqTransformer.from_pretrained(bad)
    _write(bad, "config.json", dict(cfg, normalize_before=True))
    with pytest.raises(ValueError, match="normalize_before"):
        fastattn.Seq2SeqTransformer.from_pretrained(bad)
    _write(bad, "config.json", dict(cfg, surprise_field=3))
    with pytest.raises(ValueError, match="surprise_field"):
        fastattn.Seq2SeqTransformer.from_pretrained(bad)
    _write(bad, "config.json", cfg)
    _write(bad, "generation_config.json", {"typical_p": 0.5})
    with pytest.raises(ValueError, match="typical_p"):
        fastattn.Seq2SeqTransformer.from_pretrained(bad)
    os.remove(bad / "generation_config.json")
    os.remove(bad / "model.safetensors")
    (bad / "pytorch_model.bin").write_bytes(b"\0")
    with pytest.raises(ValueError, match="pytorch_model.bin"):
        fastattn.Seq2SeqTransformer.from_pretrained(bad)
    os.remove(bad / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        fastattn.Seq2SeqTransformer.from_pretrained(bad)


def test_fresh_process_first_call_is_generate(checkpoint, tmp_path):
    """A new interpreter whose first fastattn call is a cached generate (beam and greedy)."""
    path, hf = checkpoint("swish_untied")
    from marian_helpers import hf_generate, sources
    ids, mask = sources(np.random.default_rng(7), batch=6, length=12)
    ref_g = hf_generate(hf, ids, mask, max_new_tokens=12)
    ref_b = hf_generate(hf, ids, mask, max_new_tokens=12, num_beams=3)
    np.save(tmp_path / "ids.npy", ids)
    code = (
        "import numpy as np, fastattn, sys\n"
        f"m = fastattn.Seq2SeqTransformer.from_pretrained({path!r})\n"
        f"ids = np.load({str(tmp_path / 'ids.npy')!r})\n"
        "g = m.generate(ids, max_new_tokens=12)\n"
        "b = m.generate(ids, max_new_tokens=12, num_beams=3)\n"
        f"np.save({str(tmp_path / 'g.npy')!r}, g); np.save({str(tmp_path / 'b.npy')!r}, b)\n"
    )
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(fastattn.__file__))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)    # not the checkout: it would shadow the build
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "g.npy"), ref_g)
    np.testing.assert_array_equal(np.load(tmp_path / "b.npy"), ref_b)


def test_beam_sampling_reproducible(ids):
    m = _model()
    a = m.generate(ids, max_new_tokens=10, num_beams=3, do_sample=True, seed=4)
    b = m.generate(ids, max_new_tokens=10, num_beams=3, do_sample=True, seed=4)
    np.testing.assert_array_equal(a, b)
    assert a.shape[0] == 3 and np.all(a[:, 0] == PAD)
    # top_k=1 leaves one token per beam: the beams can only follow the best continuations
    assert m.generate(ids, max_new_tokens=10, num_beams=2, do_sample=True, seed=5,
                      top_k=1).shape[0] == 3


def test_beam_rule(ids):
    """beam_rule: "transformers" is the default (the same tokens and scores as not giving it);
    "ctranslate2" (CTranslate2 itself is the reference in tests/compat) returns its score: the
    log-probabilities of the tokens after the start token (EOS included) summed and divided by
    their number ** length_penalty, best first; a bad value is a ValueError naming it."""
    m = _model()
    kw = dict(num_beams=3, max_new_tokens=8, num_return_sequences=2, return_scores=True,
              bad_words_ids=None)
    a, sa = m.generate(ids, **kw)
    b, sb = m.generate(ids, beam_rule="transformers", **kw)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(sa, sb)
    c, sc = m.generate(ids, beam_rule="ctranslate2", length_penalty=0.5, **kw)
    assert c.shape[0] == 6 and np.all(c[:, 0] == m.decoder_start_id)
    assert np.all(sc[0::2] >= sc[1::2])                      # best first, per source
    for r, (row, s) in enumerate(zip(c, sc)):
        gen = row[1:].tolist()
        if m.eos_id in gen:
            gen = gen[:gen.index(m.eos_id) + 1]
        lp = m.score(ids[r // 2][None], np.array([gen]))[0]
        assert s == pytest.approx(lp.sum() / len(gen) ** 0.5, abs=1e-4)
    with pytest.raises(ValueError, match="beam_rule"):
        m.generate(ids, num_beams=2, beam_rule="fairseq")
