"""Generation settings from the checkpoint, sampling with no defined distribution, the
parameter dict's contract, embedding copies, and inputs that must be rejected (found by a
hostile-input review)."""
import copy
import json
import os
import warnings

import numpy as np
import pytest

import fastattn
from marian_helpers import EOS, PAD, VOCAB, hf_generate, small_model

_model = small_model


def _copy_checkpoint(src, dst):
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        with open(os.path.join(src, name), "rb") as f, open(os.path.join(dst, name), "wb") as g:
            g.write(f.read())
    return dst


@pytest.mark.parametrize("field", [{"min_length": 6}, {"min_new_tokens": 5}])
def test_checkpoint_min_length_applies(checkpoint, src, tmp_path, field):
    """min_length / min_new_tokens of generation_config.json apply when the caller does not
    give min_new_tokens (a strong EOS bias would end every row at once otherwise)."""
    pytest.importorskip("torch")
    from transformers import MarianMTModel
    path, _ = checkpoint("relu_tied", eos_bias=8.0, generation=field)
    hf = MarianMTModel.from_pretrained(path).eval()       # reads generation_config.json
    ids, mask = src
    model = fastattn.Seq2SeqTransformer.from_pretrained(path)
    out = model.generate(ids, mask, max_new_tokens=10)
    np.testing.assert_array_equal(out, hf_generate(hf, ids, mask, max_new_tokens=10))
    assert (out[:, 1:6] != EOS).all()       # min_length 6 counts the start token
    # the caller's min_new_tokens wins, as in transformers
    np.testing.assert_array_equal(model.generate(ids, mask, max_new_tokens=10, min_new_tokens=0),
                                  hf_generate(hf, ids, mask, max_new_tokens=10, min_new_tokens=0))


def test_bad_checkpoint_min_length(checkpoint, tmp_path):
    path, _ = checkpoint("relu_tied")
    bad = _copy_checkpoint(path, str(tmp_path / "bad"))
    g = json.load(open(os.path.join(bad, "generation_config.json")))
    g["min_length"] = -3
    json.dump(g, open(os.path.join(bad, "generation_config.json"), "w"))
    with pytest.raises(ValueError, match="generation_config.json: min_length=-3"):
        fastattn.Seq2SeqTransformer.from_pretrained(bad)


def test_sampling_without_a_distribution_is_an_error(ids):
    m = _model()
    greedy = m.generate(ids, max_new_tokens=4)
    # a tiny temperature that still leaves finite scores samples the most likely token
    np.testing.assert_array_equal(
        m.generate(ids, max_new_tokens=4, do_sample=True, temperature=1e-6, top_k=0, seed=0),
        greedy)
    for t in (1e-40, 1e-300):            # logits / t overflow float32
        with pytest.raises(ValueError, match="cannot sample.*temperature"):
            m.generate(ids, max_new_tokens=4, do_sample=True, temperature=t, top_k=0, seed=0)
    # every token but EOS suppressed, EOS forbidden by min_new_tokens: nothing to sample
    but_eos = [t for t in range(VOCAB) if t != EOS]
    with pytest.raises(ValueError, match="cannot sample.*forbids every token"):
        m.generate(ids, max_new_tokens=4, do_sample=True, seed=0, suppress_tokens=but_eos,
                   min_new_tokens=2)
    with pytest.raises(ValueError, match="cannot sample"):
        m.generate(ids, max_new_tokens=4, do_sample=True, num_beams=2, seed=0,
                   suppress_tokens=but_eos, min_new_tokens=2)


@pytest.mark.parametrize("settings", [{}, {"num_beams": 2}, {"do_sample": True, "seed": 0}])
def test_contradictory_suppress_tokens_are_refused(ids, settings):
    # as transformers refuses them, whatever the search
    with pytest.raises(ValueError, match="suppress_tokens forbids every token"):
        _model().generate(ids, max_new_tokens=4, suppress_tokens=list(range(VOCAB)), **settings)
    forced = _model(generation_config={"forced_eos_token_id": EOS})
    with pytest.raises(ValueError, match=f"forced_eos_token_id={EOS} is also in suppress_tokens"):
        forced.generate(ids, max_new_tokens=4, suppress_tokens=[EOS, 5], **settings)
    assert forced.generate(ids, max_new_tokens=4, suppress_tokens=[5], **settings)[0, -1] == EOS


def test_state_dict_is_read_only_and_a_bad_load_changes_nothing(ids):
    m = _model()
    enc = m.encode(ids)
    sd = m.state_dict()
    before = {k: v.copy() for k, v in sd.items()}
    w = sd["model.encoder.layers.0.fc1.weight"]
    with pytest.raises(ValueError, match="read-only"):
        w[:] = 0
    # an entry early in the order is edited, a later one is bad: nothing may be copied
    names = list(sd)
    bad = {k: v.copy() for k, v in sd.items()}
    bad[names[0]][...] = 0
    bad["model.decoder.layers.1.fc1.weight"] = np.zeros((3, 3), np.float32)
    assert names.index("model.decoder.layers.1.fc1.weight") > 0
    with pytest.raises(ValueError, match="layers.1.fc1.weight"):
        m.load_state_dict(bad)
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)
    np.testing.assert_array_equal(m.encode(ids), enc)
    # a good edited dict takes effect
    good = {k: v.copy() for k, v in sd.items()}
    good["model.encoder.layers.0.fc1.weight"][:] = 0
    m.load_state_dict(good)
    assert not np.array_equal(m.encode(ids), enc)
    with pytest.raises(TypeError, match="state_dict must be a mapping"):
        m.load_state_dict([1, 2])


@pytest.mark.parametrize("dtype", [None, np.float16, "int32", "nonsense"])
def test_model_dtype_must_be_float32_or_float64(dtype):
    # np.dtype(None) is float64: None must not silently build a float64 model
    with pytest.raises(TypeError, match="dtype must be float32 or float64"):
        fastattn.Seq2SeqTransformer(vocab_size=10, d_model=8, encoder_layers=1, decoder_layers=1,
                                    encoder_attention_heads=2, decoder_attention_heads=2,
                                    encoder_ffn_dim=16, decoder_ffn_dim=16, dtype=dtype)


@pytest.mark.parametrize("which", [("encoder",), ("decoder",), ("lm_head",),
                                   ("decoder", "lm_head")])
def test_embedding_copies_that_differ_load_as_transformers(checkpoint, src, tmp_path, which):
    """A tied checkpoint whose saved encoder / decoder embedding copy differs from
    model.shared: transformers then unties that copy (each stack its own, the output
    projection model.shared); fastattn reads it the same way, with a warning."""
    torch = pytest.importorskip("torch")
    from safetensors.numpy import load_file, save_file
    from transformers import MarianMTModel
    path, _ = checkpoint("relu_tied")
    d = _copy_checkpoint(path, str(tmp_path / "_".join(which)))
    st = os.path.join(d, "model.safetensors")
    w = load_file(st)
    shared = w["model.shared.weight"]
    for t in which:
        name = "lm_head.weight" if t == "lm_head" else f"model.{t}.embed_tokens.weight"
        w[name] = (shared[::-1] * 0.5).copy()
    save_file(w, st, metadata={"format": "pt"})
    hf = MarianMTModel.from_pretrained(d).eval()
    with pytest.warns(UserWarning, match="differ from the tensors they are tied to"):
        model = fastattn.Seq2SeqTransformer.from_pretrained(d)
    ids, mask = src
    dec = np.concatenate([np.full((ids.shape[0], 1), PAD), ids[:, :4]], axis=1)
    with torch.no_grad():
        ref = hf(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
                 decoder_input_ids=torch.as_tensor(dec)).logits.numpy()
    np.testing.assert_allclose(model.logits(ids, dec, mask), ref, rtol=1e-4, atol=1e-4)
    if which == ("lm_head",):
        return
    # a state dict whose copies disagree is refused when the model shares them
    sd = {k: v for k, v in w.items()}
    with pytest.raises(ValueError, match="differs from model.shared.weight"):
        fastattn.Seq2SeqTransformer.from_state_dict(
            sd, vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
            decoder_ffn_dim=64, max_position_embeddings=128, pad_token_id=PAD)


def test_rejected_settings_and_inputs(ids):
    with pytest.raises(ValueError, match="layer_norm_eps"):
        _model(layer_norm_eps=-1)
    with pytest.raises(ValueError, match="layer_norm_eps"):
        _model(layer_norm_eps=float("nan"))
    with pytest.raises(TypeError, match="layer_norm_eps"):
        _model(layer_norm_eps="x")
    with pytest.raises(TypeError, match="scale_embedding"):
        _model(scale_embedding="no")
    with pytest.raises(TypeError, match="generation_config"):
        _model(generation_config=[1, 2])
    with pytest.raises(ValueError, match="max_position_embeddings=10000000000000"):
        _model(max_position_embeddings=10**13)     # an 80 TB sinusoid table
    for field in ("eos_token_id", "pad_token_id", "decoder_start_token_id",
                  "forced_eos_token_id"):
        with pytest.raises(ValueError, match=f"generation_config: {field}=99"):
            _model(generation_config={field: 99})
    m = _model()
    mask = np.ones(ids.shape)
    mask[:, -2:] = 0
    for bad in (np.where(mask > 0, 0.0, -np.inf), mask * 7, -mask, mask * np.nan):
        with pytest.raises(ValueError, match="attention_mask"):
            m.encode(ids, bad)
    with pytest.raises(TypeError, match="attention_mask"):
        m.start(encoder_output=m.encode(ids), attention_mask=np.array([["a"] * 9] * 3))
    with pytest.raises(ValueError, match="attention_mask"):
        m.start(encoder_output=m.encode(ids), attention_mask=mask * 2)
    with pytest.raises(ValueError, match="length_penalty"):
        m.generate(ids, num_beams=2, length_penalty=float("nan"))
    with pytest.raises(ValueError, match="length_penalty"):
        m.generate(ids, num_beams=2, length_penalty=float("inf"))
    with pytest.raises(ValueError, match="encoder_output"):
        m.start(encoder_output=np.ones((0, 3, 32), np.float32))
    with pytest.raises(ValueError, match="encoder_output"):
        m.start(encoder_output=np.ones((2, 0, 32), np.float32))
    with pytest.raises(TypeError, match="encoder_output"):
        m.start(encoder_output=np.ones((2, 3, 32), complex))
    state = m.start(ids, max_length=2)
    with pytest.raises(TypeError, match="keep"):
        state.select_sources([0.5])
    with pytest.raises(ValueError, match="keep"):
        state.select_sources(1)
    # the caller's bool mask is never kept or changed (the cache compacts its own copy)
    bmask = np.ones(ids.shape, bool)
    bmask[0, -3:] = False
    saved = bmask.copy()
    s2 = m.start(ids, bmask)
    s2.step(np.full(3, PAD))
    s2.select_sources([1, 2])
    m.generate(ids, bmask, max_new_tokens=6, do_sample=True, seed=4)
    np.testing.assert_array_equal(bmask, saved)
    # a 1-D mask for a single source, as generate() takes it
    one = m.encode(ids[:1])
    s3 = m.start(encoder_output=one, attention_mask=np.ones(9, int))
    np.testing.assert_allclose(s3.step(np.full(1, PAD)), m.start(ids[:1]).step(np.full(1, PAD)),
                               rtol=1e-5, atol=1e-5)
    state.step(np.full(3, PAD))
    state.step(np.full(3, 5))
    with pytest.raises(ValueError, match="cannot feed position 2"):
        state.step(np.full(3, 5))


def test_checkpoint_special_ids_and_damaged_weights(checkpoint, tmp_path):
    path, _ = checkpoint("relu_tied")
    for field in ("eos_token_id", "pad_token_id", "decoder_start_token_id",
                  "forced_eos_token_id"):
        bad = _copy_checkpoint(path, str(tmp_path / field))
        g = json.load(open(os.path.join(bad, "generation_config.json")))
        g[field] = 99
        json.dump(g, open(os.path.join(bad, "generation_config.json"), "w"))
        with pytest.raises(ValueError, match=f"generation_config.json: {field}=99"):
            fastattn.Seq2SeqTransformer.from_pretrained(bad)
    bad = _copy_checkpoint(path, str(tmp_path / "truncated"))
    st = os.path.join(bad, "model.safetensors")
    data = open(st, "rb").read()
    for content in (data[:len(data) // 2], b"", b"\x00" * 64):
        open(st, "wb").write(content)
        with pytest.raises(ValueError, match="model.safetensors"):
            fastattn.Seq2SeqTransformer.from_pretrained(bad)
    os.remove(st)
    os.mkdir(st)
    with pytest.raises(ValueError, match="model.safetensors"):
        fastattn.Seq2SeqTransformer.from_pretrained(bad)


def test_bfloat16_checkpoint_loads(checkpoint, src, tmp_path):
    torch = pytest.importorskip("torch")
    path, hf = checkpoint("relu_tied")
    d = str(tmp_path / "bf16")
    copy.deepcopy(hf).to(torch.bfloat16).save_pretrained(d)   # the fixture's model unchanged
    for name in ("generation_config.json",):
        with open(os.path.join(path, name), "rb") as f, open(os.path.join(d, name), "wb") as g:
            g.write(f.read())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = fastattn.Seq2SeqTransformer.from_pretrained(d)
    ref = fastattn.Seq2SeqTransformer.from_pretrained(path)
    ids, mask = src
    # the bf16 weights are the float32 ones rounded: the encoder outputs agree to bf16 precision
    np.testing.assert_allclose(model.encode(ids, mask), ref.encode(ids, mask), rtol=0.1, atol=0.1)


def test_generation_config_numpy_scalars_are_numbers(ids):
    m = _model(generation_config={"num_beams": np.int64(2), "temperature": np.float32(0.7),
                                  "do_sample": np.False_, "length_penalty": np.float64(1.0)})
    np.testing.assert_array_equal(m.generate(ids, max_new_tokens=5),
                                  _model().generate(ids, max_new_tokens=5, num_beams=2))


@pytest.mark.parametrize("field,value", [
    ("num_beams", "4"), ("num_beams", 0), ("top_k", 50.0), ("temperature", "0.7"),
    ("temperature", 0), ("top_p", 1.5), ("length_penalty", "x"), ("do_sample", "yes"),
    ("renormalize_logits", "no"), ("early_stopping", 1), ("max_new_tokens", -1),
    ("min_length", 2.5)])
def test_generation_config_types_name_the_file(checkpoint, tmp_path, field, value):
    path, _ = checkpoint("relu_tied")
    bad = _copy_checkpoint(path, str(tmp_path / "g"))
    g = json.load(open(os.path.join(bad, "generation_config.json")))
    g[field] = value
    json.dump(g, open(os.path.join(bad, "generation_config.json"), "w"))
    with pytest.raises(ValueError, match=f"generation_config.json: {field}="):
        fastattn.Seq2SeqTransformer.from_pretrained(bad)
    with pytest.raises(ValueError, match=f"generation_config: {field}="):
        _model(generation_config={field: value})


def test_tiny_vocabulary_beam_search():
    one = fastattn.Seq2SeqTransformer(vocab_size=1, d_model=8, encoder_layers=1,
                                      decoder_layers=1, encoder_attention_heads=2,
                                      decoder_attention_heads=2, encoder_ffn_dim=8,
                                      decoder_ffn_dim=8, pad_token_id=0, seed=0)
    with pytest.raises(ValueError, match="num_beams=2 needs a target vocabulary"):
        one.generate(np.zeros((1, 3), int), num_beams=2, max_new_tokens=2)
