"""BART, mBART, Pegasus and M2M100 (NLLB) against transformers, on random checkpoints.

Encoder output and teacher-forced logits within 1e-4 relative (float32) / 1e-6 (float64);
greedy and beam generation token for token on padded batches; tied and untied heads. Each
checkpoint is checked to decode into varied tokens (a degenerate model would agree trivially).
"""
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import fastattn  # noqa: E402
from seq2seq_checkpoints import IDS, make_checkpoint, padded_sources  # noqa: E402

FAMILIES = ["bart", "mbart", "pegasus", "m2m_100"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    made = {}

    def get(model_type, tied=True, dtype="float32", **kw):
        key = (model_type, tied, dtype, tuple(sorted(kw.items())))
        if key not in made:
            path = str(tmp_path_factory.mktemp(f"{model_type}-{tied}-{dtype}"))
            made[key] = path, make_checkpoint(path, model_type, tied=tied, dtype=dtype, **kw)
        return made[key]
    return get


def _rel(a, b):
    return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30)


def _check_encoder_and_logits(model, hf, ids, mask, dec, dtype):
    """encode and logits within 1e-4 (float32) / 1e-6 (float64) relative of transformers."""
    with torch.no_grad():
        t_ids, t_mask = torch.as_tensor(ids), torch.as_tensor(mask)
        want_enc = hf.get_encoder()(input_ids=t_ids, attention_mask=t_mask).last_hidden_state
        want_logits = hf(input_ids=t_ids, attention_mask=t_mask,
                         decoder_input_ids=torch.as_tensor(dec)).logits
    tol = 1e-4 if dtype == "float32" else 1e-6
    m = mask.astype(bool)
    assert _rel(model.encode(ids, mask)[m], want_enc.numpy()[m]) < tol
    assert _rel(model.logits(ids, dec, mask), want_logits.numpy()) < tol


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("model_type", FAMILIES)
def test_encoder_and_logits_match_transformers(checkpoints, model_type, tied, dtype):
    path, hf = checkpoints(model_type, tied, dtype)
    model = fastattn.Seq2SeqTransformer.from_pretrained(path, dtype=np.dtype(dtype))
    assert model.config["model_type"] == model_type
    rng = np.random.default_rng(1)
    ids, mask = padded_sources(model_type, rng, [9, 5, 7])
    dec = np.concatenate([np.full((3, 1), IDS[model_type]["decoder_start_token_id"]),
                          rng.integers(3, 80, size=(3, 6))], axis=1)
    _check_encoder_and_logits(model, hf, ids, mask, dec, dtype)


@pytest.mark.parametrize("num_beams", [1, 3])
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("model_type", FAMILIES)
def test_generation_matches_transformers_token_for_token(checkpoints, model_type, tied,
                                                         num_beams):
    path, hf = checkpoints(model_type, tied)
    model = fastattn.Seq2SeqTransformer.from_pretrained(path)
    rng = np.random.default_rng(2)
    ids, mask = padded_sources(model_type, rng, [10, 4, 7, 10, 6])
    kw = dict(max_new_tokens=14, min_new_tokens=4, num_beams=num_beams)
    got = model.generate(ids, mask, **kw)
    with torch.no_grad():
        want = hf.generate(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
                           do_sample=False, **kw).numpy()
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    if not tied:        # a tied head tends to repeat the current token: vary the untied ones
        assert len(np.unique(got[:, 1:])) >= 3 and len(np.unique(got, axis=0)) >= 2, \
            f"degenerate decoding: {got}"
    # each row alone decodes to the same tokens (row invariance), padding removed
    for i in range(len(ids)):
        n = int(mask[i].sum())
        alone = model.generate(ids[i:i + 1, :n], **kw)
        np.testing.assert_array_equal(alone[0], got[i, :alone.shape[1]])
        assert np.all(got[i, alone.shape[1]:] == IDS[model_type]["pad_token_id"])


@pytest.mark.parametrize("model_type", FAMILIES)
def test_thread_counts_give_the_same_bits(checkpoints, model_type):
    path, _ = checkpoints(model_type)
    model = fastattn.Seq2SeqTransformer.from_pretrained(path)
    ids, mask = padded_sources(model_type, np.random.default_rng(3), [8, 3])
    a = model.logits(ids, ids, mask, n_threads=1)
    b = model.logits(ids, ids, mask, n_threads=2)
    assert np.array_equal(a, b)


def test_m2m100_positions_count_from_the_pad_id(checkpoints):
    """Left padding moves M2M100's positions with the tokens (they count non-pad ids), as in
    transformers: a left-padded row encodes to the same vectors as the row alone."""
    path, hf = checkpoints("m2m_100")
    model = fastattn.Seq2SeqTransformer.from_pretrained(path)
    pad = IDS["m2m_100"]["pad_token_id"]
    row = np.array([[5, 9, 13, 2]])
    left = np.array([[pad, pad, 5, 9, 13, 2]])
    mask = (left != pad).astype(np.int64)
    a = model.encode(row)[0]
    b = model.encode(left, mask)[0, 2:]
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        want = hf.get_encoder()(input_ids=torch.as_tensor(left),
                                attention_mask=torch.as_tensor(mask)).last_hidden_state.numpy()
    assert _rel(model.encode(left, mask)[0, 2:], want[0, 2:]) < 1e-4


def _write(path, name, obj):
    with open(os.path.join(path, name), "w") as f:
        json.dump(obj, f)


@pytest.mark.parametrize("model_type,field,value", [
    ("bart", "normalize_before", True),
    ("mbart", "add_final_layer_norm", False),
    ("pegasus", "static_position_embeddings", False),
    ("bart", "surprise", 1),
    ("m2m_100", "encoder_layers", 0),
])
def test_config_fields_are_honoured_or_rejected_by_name(checkpoints, tmp_path, model_type,
                                                        field, value):
    path, _ = checkpoints(model_type)
    cfg = json.load(open(os.path.join(path, "config.json")))
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in os.listdir(path):
        with open(os.path.join(path, name), "rb") as f:
            (bad / name).write_bytes(f.read())
    _write(bad, "config.json", dict(cfg, **{field: value}))
    with pytest.raises(ValueError, match=field):
        fastattn.Seq2SeqTransformer.from_pretrained(bad)


def test_unknown_model_type_and_missing_shard(checkpoints, tmp_path):
    path, hf = checkpoints("bart")
    cfg = json.load(open(os.path.join(path, "config.json")))
    bad = tmp_path / "t"
    bad.mkdir()
    _write(bad, "config.json", dict(cfg, model_type="prophetnet"))
    with pytest.raises(ValueError, match="model_type='prophetnet'"):
        fastattn.Seq2SeqTransformer.from_pretrained(bad)
    sharded = tmp_path / "sharded"
    hf.save_pretrained(sharded, max_shard_size="20KB")
    files = sorted(n for n in os.listdir(sharded) if n.endswith(".safetensors"))
    assert len(files) > 1
    model = fastattn.Seq2SeqTransformer.from_pretrained(sharded)
    ids, mask = padded_sources("bart", np.random.default_rng(4), [6, 4])
    ref = fastattn.Seq2SeqTransformer.from_pretrained(path)
    np.testing.assert_array_equal(model.encode(ids, mask), ref.encode(ids, mask))
    os.remove(sharded / files[-1])
    with pytest.raises(ValueError, match=files[-1]):
        fastattn.Seq2SeqTransformer.from_pretrained(sharded)


# -- T5 / mT5 (flan-T5 = t5 with gated-gelu and an untied head) --------------------------------

T5_VARIANTS = [("t5", True, "relu"), ("t5", False, "gated-gelu"), ("mt5", False, "gated-gelu"),
               ("t5", True, "gated-silu")]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("model_type,tied,ffn", T5_VARIANTS)
def test_t5_encoder_and_logits_match_transformers(checkpoints, model_type, tied, ffn, dtype):
    # three decoder layers over two encoder layers (transformers' generate cannot do that)
    path, hf = checkpoints(model_type, tied, dtype, feed_forward_proj=ffn, num_decoder_layers=3)
    model = fastattn.Seq2SeqTransformer.from_pretrained(path, dtype=np.dtype(dtype))
    c = model.config
    assert c["decoder_layers"] == 3
    assert c["norm"] == "rms" and c["head_dim"] == 12 and c["gated_ffn"] == ffn.startswith("gated")
    assert c["tie_word_embeddings"] == tied
    rng = np.random.default_rng(5)
    ids, mask = padded_sources(model_type, rng, [11, 6, 30])      # beyond max_distance 20
    dec = np.concatenate([np.zeros((3, 1), np.int64), rng.integers(2, 80, size=(3, 25))], axis=1)
    _check_encoder_and_logits(model, hf, ids, mask, dec, dtype)


@pytest.mark.parametrize("num_beams", [1, 3])
@pytest.mark.parametrize("model_type,tied,ffn", T5_VARIANTS[:3])
def test_t5_generation_matches_transformers(checkpoints, model_type, tied, ffn, num_beams):
    path, hf = checkpoints(model_type, tied, feed_forward_proj=ffn)
    model = fastattn.Seq2SeqTransformer.from_pretrained(path)
    ids, mask = padded_sources(model_type, np.random.default_rng(6), [12, 5, 9, 3])
    kw = dict(max_new_tokens=26, min_new_tokens=3, num_beams=num_beams)
    got = model.generate(ids, mask, **kw)
    with torch.no_grad():
        want = hf.generate(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
                           do_sample=False, **kw).numpy()
    np.testing.assert_array_equal(got, want)
    if not tied:
        assert len(np.unique(got[:, 1:])) >= 3 and len(np.unique(got, axis=0)) >= 2, got
    for i in range(len(ids)):
        n = int(mask[i].sum())
        alone = model.generate(ids[i:i + 1, :n], **kw)
        np.testing.assert_array_equal(alone[0], got[i, :alone.shape[1]])


@pytest.mark.parametrize("model_type,tied,ffn", T5_VARIANTS[1:2])
def test_t5_thread_counts_give_the_same_bits(checkpoints, model_type, tied, ffn):
    # RMS norms, the position bias and the decode step's direct attention calls: the logits of
    # a padded batch and a greedy decode, bitwise the same on 1, 2 and 3 threads
    path, _ = checkpoints(model_type, tied, feed_forward_proj=ffn)
    model = fastattn.Seq2SeqTransformer.from_pretrained(path)
    ids, mask = padded_sources(model_type, np.random.default_rng(7), [10, 4])
    dec = np.concatenate([np.zeros((2, 1), np.int64), ids[:, :6]], axis=1)
    a = model.logits(ids, dec, mask, n_threads=1)
    kw = dict(max_new_tokens=12, min_new_tokens=12, return_scores=True)
    g_ids, g_scores = model.generate(ids, mask, n_threads=1, **kw)
    for t in (2, 3):
        assert np.array_equal(model.logits(ids, dec, mask, n_threads=t), a)
        ids_t, scores_t = model.generate(ids, mask, n_threads=t, **kw)
        assert np.array_equal(ids_t, g_ids) and np.array_equal(scores_t, g_scores)


def test_t5_config_errors(checkpoints, tmp_path):
    path, _ = checkpoints("t5", False, feed_forward_proj="gated-gelu")
    cfg = json.load(open(os.path.join(path, "config.json")))
    for field, value, match in (("relative_attention_max_distance", None,
                                 "relative_attention_max_distance is missing"),
                                ("feed_forward_proj", "gated-tanh", "feed_forward_proj"),
                                ("d_kv", 0, "d_kv"), ("mystery", 1, "mystery")):
        bad = tmp_path / field
        bad.mkdir()
        for name in os.listdir(path):
            with open(os.path.join(path, name), "rb") as f:
                (bad / name).write_bytes(f.read())
        new = dict(cfg, **{field: value})
        if value is None:
            del new[field]
        _write(bad, "config.json", new)
        with pytest.raises(ValueError, match=match):
            fastattn.Seq2SeqTransformer.from_pretrained(bad)
