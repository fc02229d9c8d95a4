"""MPNet and ModernBERT encoders and sentence-transformers Dense modules, against transformers and
sentence-transformers on random checkpoints written by save_pretrained / Dense.save."""
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import fastattn  # noqa: E402
from encoder_checkpoints import hf_hidden, padded_batch, write_hf, write_st_folder  # noqa: E402


def rel_err(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / max(np.max(np.abs(b)), 1e-30))


def mpnet(tmp_path, dtype="float32", **kw):
    cfg = transformers.MPNetConfig(vocab_size=70, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=48,
                                   max_position_embeddings=300, relative_attention_num_buckets=32,
                                   **kw)
    return write_hf(tmp_path, transformers.MPNetModel, cfg, dtype=dtype)


def modernbert(tmp_path, dtype="float32", **kw):
    args = dict(vocab_size=70, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                intermediate_size=40, max_position_embeddings=256, local_attention=8,
                pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
    args.update(kw)
    cfg = transformers.ModernBertConfig(**args)
    cfg._attn_implementation = "eager"
    return write_hf(tmp_path, transformers.ModernBertModel, cfg, dtype=dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_mpnet_hidden_states(tmp_path, dtype):
    hf = mpnet(tmp_path, dtype)
    enc = fastattn.EncoderModel.from_pretrained(tmp_path, dtype=np.dtype(dtype))
    assert enc.config.model_type == "mpnet" and enc.config.relative_attention_num_buckets == 32
    rng = np.random.default_rng(0)
    # lengths past the buckets' max distance (128) and padded rows (pad id 1)
    ids, mask = padded_batch(rng, 70, [150, 20, 1], 150, pad_id=1, low=3)
    want = hf_hidden(hf, ids, mask)
    got = enc(ids, attention_mask=mask)
    m = mask.astype(bool)
    tol = 1e-4 if dtype == "float32" else 1e-9
    assert rel_err(got[m], want[m]) < tol
    # embed skips padding in the dense layers: the same vectors as pooling the hidden state
    e = enc.embed(ids, attention_mask=mask)
    full = (got * m[..., None]).sum(1) / m.sum(1, keepdims=True)
    full /= np.linalg.norm(full, axis=1, keepdims=True)
    np.testing.assert_allclose(e, full, rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layer_types", [None, "every2"])
def test_modernbert_hidden_states(tmp_path, dtype, layer_types):
    kw = {}
    if layer_types == "every2":
        kw["layer_types"] = ["full_attention", "sliding_attention"] * 2
    hf = modernbert(tmp_path, dtype, **kw)
    enc = fastattn.EncoderModel.from_pretrained(tmp_path, dtype=np.dtype(dtype))
    c = enc.config
    assert c.model_type == "modernbert" and c.norm_first and c.gated and not c.bias
    assert "sliding" in c.layer_types and "full" in c.layer_types
    rng = np.random.default_rng(1)
    ids, mask = padded_batch(rng, 70, [40, 13, 25], 40, pad_id=0, low=3)
    # float64: transformers computes the rotary tables in float32 whatever the model dtype, and
    # torch's float32 cos / sin differ from NumPy's by an ulp here and there
    tol = 1e-4 if dtype == "float32" else 1e-6
    got = enc(ids, attention_mask=mask)
    for i, n in enumerate(mask.sum(1)):
        # transformers' eager attention turns a sliding window of only padding into NaN that
        # reaches real rows through 0 * NaN values: its reference is each row alone
        want = hf_hidden(hf, ids[i:i + 1, :n])[0]
        assert rel_err(got[i, :n], want) < tol
    # every row gives the same bits whatever else is in the batch (embed's packed rows)
    e = enc.embed(ids, attention_mask=mask)
    for i in range(len(ids)):
        np.testing.assert_array_equal(enc.embed(ids[i:i + 1], attention_mask=mask[i:i + 1]),
                                      e[i:i + 1])


def test_modernbert_old_config_names(tmp_path):
    """Configs written before transformers 5: global_attn_every_n_layers and the two rope
    thetas name the same model."""
    hf = modernbert(tmp_path)
    cfg = json.load(open(tmp_path / "config.json"))
    types = cfg.pop("layer_types")
    rope = cfg.pop("rope_parameters")
    cfg["global_attn_every_n_layers"] = 3
    assert types == ["full_attention" if i % 3 == 0 else "sliding_attention" for i in range(4)]
    cfg["global_rope_theta"] = rope["full_attention"]["rope_theta"]
    cfg["local_rope_theta"] = rope["sliding_attention"]["rope_theta"]
    json.dump(cfg, open(tmp_path / "config.json", "w"))
    enc = fastattn.EncoderModel.from_pretrained(tmp_path)
    ids = np.random.default_rng(2).integers(3, 70, size=(2, 30))
    assert rel_err(enc(ids), hf_hidden(hf, ids)) < 1e-4


@pytest.mark.parametrize("field,value", [("attention_bias", True), ("layer_types", ["x"] * 4),
                                         ("hidden_activation", "quick_gelu")])
def test_modernbert_bad_config(tmp_path, field, value):
    modernbert(tmp_path)
    cfg = json.load(open(tmp_path / "config.json"))
    cfg[field] = value
    json.dump(cfg, open(tmp_path / "config.json", "w"))
    with pytest.raises(ValueError, match=field):
        fastattn.EncoderModel.from_pretrained(tmp_path)


@pytest.mark.parametrize("activation", ["Tanh", "Identity"])
def test_dense_modules_match_sentence_transformers(tmp_path, activation):
    st_models = pytest.importorskip("sentence_transformers.models")
    mpnet(tmp_path)
    write_st_folder(tmp_path, pooling=("mean",), normalize=False)
    act = getattr(torch.nn, activation)()
    dense = [st_models.Dense(32, 24, activation_function=act),
             st_models.Dense(24, 16, bias=False, activation_function=torch.nn.Tanh())]
    g = torch.Generator().manual_seed(3)
    modules = json.load(open(tmp_path / "modules.json"))
    for i, d in enumerate(dense):
        with torch.no_grad():
            for p in d.parameters():
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
        path = tmp_path / f"{2 + i}_Dense"
        path.mkdir()
        d.save(str(path))
        modules.append({"idx": 2 + i, "name": str(2 + i), "path": path.name,
                        "type": "sentence_transformers.models.Dense"})
    os.makedirs(tmp_path / "4_Normalize", exist_ok=True)
    modules.append({"idx": 4, "name": "4", "path": "4_Normalize",
                    "type": "sentence_transformers.models.Normalize"})
    json.dump(modules, open(tmp_path / "modules.json", "w"))
    enc = fastattn.EncoderModel.from_pretrained(tmp_path)
    ids, mask = padded_batch(np.random.default_rng(4), 70, [12, 5, 9], 12, pad_id=1, low=3)
    got = enc.embed(ids, attention_mask=mask)
    assert got.shape == (3, 16)
    hidden = enc(ids, attention_mask=mask)
    m = mask[..., None].astype(np.float32)
    x = torch.as_tensor((hidden * m).sum(1) / m.sum(1))
    with torch.no_grad():
        for d in dense:
            x = d({"sentence_embedding": x})["sentence_embedding"]
    want = torch.nn.functional.normalize(x, dim=1).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # a Dense whose in_features does not fit is refused by name
    cfgp = tmp_path / "3_Dense" / "config.json"
    cfg = json.load(open(cfgp))
    json.dump(dict(cfg, in_features=23), open(cfgp, "w"))
    with pytest.raises(ValueError, match="in_features=23"):
        fastattn.EncoderModel.from_pretrained(tmp_path)
