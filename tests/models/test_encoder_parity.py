"""EncoderModel hidden states and embeddings vs transformers on random checkpoints."""
import json
import os

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")

import transformers  # noqa: E402

import fastattn  # noqa: E402
from encoder_checkpoints import (hf_hidden, padded_batch, reference_pool,  # noqa: E402
                                 write_hf, write_st_folder)

TOL = {np.float32: 1e-4, np.float64: 1e-9}
DTYPES = {np.float32: "float32", np.float64: "float64"}


def rel_err(actual, expected):
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


def bert_config(**kw):
    base = dict(vocab_size=80, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=80, max_position_embeddings=32, type_vocab_size=3,
                pad_token_id=0)
    base.update(kw)
    return transformers.BertConfig(**base)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act,eps", [
    ("gelu", 1e-12), ("gelu_new", 1e-5), ("gelu_pytorch_tanh", 1e-7), ("gelu_fast", 1e-12),
    ("gelu_accurate", 1e-3), ("gelu_python", 1e-12), ("gelu_python_tanh", 1e-6),
    ("relu", 1e-6), ("silu", 1e-12), ("swish", 1e-5),
])
def test_bert_hidden_states(tmp_path, dtype, act, eps):
    cfg = bert_config(hidden_act=act, layer_norm_eps=eps)
    model = write_hf(tmp_path, transformers.BertModel, cfg, DTYPES[dtype])
    enc = fastattn.EncoderModel.from_pretrained(tmp_path, dtype=dtype)
    assert enc.dtype == dtype and enc.hidden_size == 48
    assert enc.config.hidden_act == act and enc.config.layer_norm_eps == eps
    rng = np.random.default_rng(1)
    ids, mask = padded_batch(rng, 80, [11, 7, 1, 11], 11)
    tt = rng.integers(0, 3, ids.shape)
    out = enc(ids, attention_mask=mask, token_type_ids=tt)
    ref = hf_hidden(model, ids, mask, tt)
    assert out.shape == (4, 11, 48) and out.dtype == dtype
    # every position, padding ones included (their queries still see the real keys)
    assert rel_err(out, ref) <= TOL[dtype]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bert_defaults_and_mask_types(tmp_path, dtype):
    cfg = bert_config(hidden_act="gelu", layer_norm_eps=1e-12, type_vocab_size=2)
    model = write_hf(tmp_path, transformers.BertModel, cfg, DTYPES[dtype])
    enc = fastattn.EncoderModel.from_pretrained(tmp_path, dtype=dtype)
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 80, (2, 9))
    # no mask, no token types: transformers' defaults (all tokens, type 0)
    assert rel_err(enc(ids), hf_hidden(model, ids)) <= TOL[dtype]
    ids, mask = padded_batch(rng, 80, [9, 4], 9)
    by_int = enc(ids, attention_mask=mask)
    np.testing.assert_array_equal(enc(ids, attention_mask=mask.astype(bool)), by_int)
    np.testing.assert_array_equal(enc(ids.astype(np.int32), attention_mask=mask.astype(np.uint8)),
                                  by_int)
    np.testing.assert_array_equal(enc(ids, attention_mask=mask.astype(np.float32)), by_int)
    assert rel_err(by_int, hf_hidden(model, ids, mask)) <= TOL[dtype]
    # the HF mask is 1 = token: a row's real tokens do not depend on what sits in its padding
    ids2 = ids.copy()
    ids2[1, 4:] = 7
    np.testing.assert_allclose(enc(ids2, attention_mask=mask)[1, :4], by_int[1, :4],
                               rtol=0, atol=1e-5 if dtype == np.float32 else 1e-12)


def test_bert_full_length_and_fully_padded_row(tmp_path):
    cfg = bert_config()
    model = write_hf(tmp_path, transformers.BertModel, cfg)
    enc = fastattn.EncoderModel.from_pretrained(tmp_path)
    rng = np.random.default_rng(3)
    ids, mask = padded_batch(rng, 80, [32, 0, 5], 32)
    out = enc(ids, attention_mask=mask)
    assert np.isfinite(out).all()
    keep = [0, 2]                       # transformers' values for an all-padding row are not
    assert rel_err(out[keep], hf_hidden(model, ids[keep], mask[keep])) <= 1e-4   # a spec
    with pytest.raises(ValueError, match="max_position_embeddings=32"):
        enc(np.zeros((1, 33), dtype=np.int64))


def test_prefixed_checkpoint(tmp_path):
    """BertForMaskedLM saves 'bert.'-prefixed names and extra heads: the encoder is found."""
    cfg = bert_config(hidden_act="gelu_new", layer_norm_eps=1e-6)
    model = write_hf(tmp_path, transformers.BertForMaskedLM, cfg)
    from safetensors import safe_open
    with safe_open(os.path.join(tmp_path, "model.safetensors"), "numpy") as f:
        assert any(k.startswith("bert.") for k in f.keys())
    enc = fastattn.EncoderModel.from_pretrained(tmp_path)
    ids, mask = padded_batch(np.random.default_rng(4), 80, [6, 3], 6)
    assert rel_err(enc(ids, mask), hf_hidden(model.bert, ids, mask)) <= 1e-4


def test_sharded_checkpoint(tmp_path):
    cfg = bert_config()
    model = write_hf(tmp_path, transformers.BertModel, cfg, "float64")
    os.remove(tmp_path / "model.safetensors")
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    enc = fastattn.EncoderModel.from_pretrained(tmp_path, dtype=np.float64)
    ids, mask = padded_batch(np.random.default_rng(5), 80, [5, 2], 5)
    assert rel_err(enc(ids, mask), hf_hidden(model, ids, mask)) <= 1e-9


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["roberta", "xlm-roberta", "camembert"])
def test_roberta_family(tmp_path, kind, dtype):
    cls_cfg, cls_model = {
        "roberta": (transformers.RobertaConfig, transformers.RobertaModel),
        "xlm-roberta": (transformers.XLMRobertaConfig, transformers.XLMRobertaModel),
        "camembert": (transformers.CamembertConfig, transformers.CamembertModel),
    }[kind]
    pad = 1
    cfg = cls_cfg(vocab_size=70, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, max_position_embeddings=20, type_vocab_size=1,
                  pad_token_id=pad, hidden_act="gelu", layer_norm_eps=1e-5)
    model = write_hf(tmp_path, cls_model, cfg, DTYPES[dtype])
    enc = fastattn.EncoderModel.from_pretrained(tmp_path, dtype=dtype)
    assert enc.config.model_type == kind
    rng = np.random.default_rng(6)
    S = 20 - pad - 1                    # the longest sequence the position table allows
    ids, mask = padded_batch(rng, 70, [S, 9, 3], S, pad_id=pad)
    # position ids follow the padding id: results depend on it (checked against transformers)
    assert rel_err(enc(ids, mask), hf_hidden(model, ids, mask)) <= TOL[dtype]
    assert rel_err(enc(ids), hf_hidden(model, ids)) <= TOL[dtype]
    with pytest.raises(ValueError, match="input_ids has 19 non-padding tokens.*at most 18"):
        enc(np.full((1, S + 1), 5))
    # padding past the limit keeps the padding id's position: accepted, as transformers does
    long_ids = np.full((2, S + 5), pad)
    long_ids[0, :S] = rng.integers(3, 70, S)
    long_ids[1, :4] = rng.integers(3, 70, 4)
    long_mask = (long_ids != pad).astype(np.int64)
    assert rel_err(enc(long_ids, long_mask), hf_hidden(model, long_ids, long_mask)) <= TOL[dtype]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act", ["gelu", "relu"])
def test_distilbert(tmp_path, act, dtype):
    cfg = transformers.DistilBertConfig(vocab_size=60, dim=32, n_layers=3, n_heads=4,
                                        hidden_dim=40, max_position_embeddings=16,
                                        activation=act)
    model = write_hf(tmp_path, transformers.DistilBertModel, cfg, DTYPES[dtype])
    enc = fastattn.EncoderModel.from_pretrained(tmp_path, dtype=dtype)
    ids, mask = padded_batch(np.random.default_rng(7), 60, [16, 10, 4], 16)
    assert rel_err(enc(ids, mask), hf_hidden(model, ids, mask)) <= TOL[dtype]
    # tokenizers hand out type ids for DistilBERT too: zeros are fine, anything else is not
    np.testing.assert_array_equal(enc(ids, mask, np.zeros_like(ids)), enc(ids, mask))
    with pytest.raises(ValueError, match="token_type_ids.*no token types"):
        enc(ids, mask, np.ones_like(ids))


@pytest.mark.parametrize("modes,normalize", [
    (("mean",), True), (("cls",), False), (("max",), True), (("mean_sqrt_len",), False),
    (("cls", "mean"), True), (("max", "mean", "mean_sqrt_len"), False),
])
def test_sentence_transformers_folder(tmp_path, modes, normalize):
    """embed() of a sentence-transformers folder vs pooling written out over transformers'
    own hidden states."""
    cfg = bert_config(hidden_act="gelu", layer_norm_eps=1e-12)
    sub = tmp_path / "0_Transformer"
    model = write_hf(sub, transformers.BertModel, cfg)
    write_st_folder(tmp_path, pooling=modes, normalize=normalize,
                    transformer_path="0_Transformer")
    enc = fastattn.EncoderModel.from_pretrained(tmp_path)
    assert enc.pooling == modes and enc.normalize == normalize
    ids, mask = padded_batch(np.random.default_rng(8), 80, [12, 5, 1], 12)
    vec = enc.embed(ids, attention_mask=mask)
    ref = reference_pool(hf_hidden(model, ids, mask), mask, modes, normalize)
    assert vec.shape == (3, 48 * len(modes)) and vec.dtype == np.float32
    assert rel_err(vec, ref) <= 1e-4
    if normalize:
        np.testing.assert_allclose(np.linalg.norm(vec, axis=1), 1.0, rtol=1e-6)


def test_plain_folder_embeds_mean_normalised(tmp_path):
    cfg = bert_config()
    model = write_hf(tmp_path, transformers.BertModel, cfg, "float64")
    assert not (tmp_path / "modules.json").exists()
    enc = fastattn.EncoderModel.from_pretrained(tmp_path, dtype=np.float64)
    assert enc.pooling == ("mean",) and enc.normalize
    ids, mask = padded_batch(np.random.default_rng(9), 80, [8, 3], 8)
    ref = reference_pool(hf_hidden(model, ids, mask), mask, ("mean",), True)
    assert rel_err(enc.embed(ids, mask), ref) <= 1e-9
    with open(tmp_path / "config.json") as f:
        assert json.load(f)["model_type"] == "bert"


@pytest.mark.parametrize("saved", ["float16", "bfloat16"])
def test_half_precision_checkpoints(tmp_path, saved):
    """float16 and bfloat16 files (NumPy has no bfloat16: widened by hand) compute in float32
    like transformers computing on the same weights widened to float32."""
    import torch
    cfg = bert_config()
    model = write_hf(tmp_path, transformers.BertModel, cfg, saved)
    enc = fastattn.EncoderModel.from_pretrained(tmp_path)
    ids, mask = padded_batch(np.random.default_rng(10), 80, [7, 4], 7)
    assert rel_err(enc(ids, mask), hf_hidden(model.to(torch.float32), ids, mask)) <= 1e-4


def test_distilbert_sinusoidal_positions(tmp_path):
    """sinusoidal_pos_embds: the table transformers builds is saved with the weights."""
    cfg = transformers.DistilBertConfig(vocab_size=60, dim=32, n_layers=2, n_heads=4,
                                        hidden_dim=40, max_position_embeddings=16,
                                        sinusoidal_pos_embds=True)
    model = transformers.DistilBertModel(cfg).eval()
    model.save_pretrained(tmp_path)
    enc = fastattn.EncoderModel.from_pretrained(tmp_path)
    ids, mask = padded_batch(np.random.default_rng(11), 60, [16, 5], 16)
    assert rel_err(enc(ids, mask), hf_hidden(model, ids, mask)) <= 1e-4


def test_bert_without_pad_token(tmp_path):
    """BERT allows pad_token_id null (it only marks the embedding row; positions ignore it)."""
    model = write_hf(tmp_path, transformers.BertModel, bert_config(), "float64")
    with open(tmp_path / "config.json") as f:
        cfg = json.load(f)
    cfg["pad_token_id"] = None
    with open(tmp_path / "config.json", "w") as f:
        json.dump(cfg, f)
    enc = fastattn.EncoderModel.from_pretrained(tmp_path, dtype=np.float64)
    ids, mask = padded_batch(np.random.default_rng(12), 80, [6, 2], 6)
    assert rel_err(enc(ids, mask), hf_hidden(model, ids, mask)) <= 1e-9
