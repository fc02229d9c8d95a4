"""EncoderModel without transformers: bad folders, bad inputs, pooling vs a NumPy reference,
and a float64 NumPy re-implementation of the whole forward pass."""
import json
import math
import os
import shutil
import warnings

import numpy as np
import pytest

pytest.importorskip("safetensors")

import fastattn  # noqa: E402
from encoder_checkpoints import (padded_batch, reference_pool, write_numpy_bert,  # noqa: E402
                                 write_st_folder)
from fastattn.models import EncoderModel  # noqa: E402


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("bert")
    write_numpy_bert(d, type_vocab_size=3)
    return d


@pytest.fixture(scope="module")
def enc(bert_dir):
    return EncoderModel.from_pretrained(bert_dir)


def copy_folder(src, dst):
    shutil.copytree(src, dst)
    return dst


def edit_config(folder, **changes):
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    with open(path, "w") as f:
        json.dump(cfg, f)


# --- an independent float64 forward pass (loops over heads, math.erf GELU) ----------------

def numpy_bert_forward(folder, ids, mask, tt):
    from safetensors.numpy import load_file
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    w = {k: v.astype(np.float64) for k, v in load_file(os.path.join(folder,
                                                                     "model.safetensors")).items()}
    eps = c["layer_norm_eps"]
    nh = c["num_attention_heads"]

    def ln(x, g, b):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * g + b

    erf = np.vectorize(math.erf)
    act = {"gelu": lambda x: 0.5 * x * (1 + erf(x / math.sqrt(2))),
           "relu": lambda x: np.maximum(x, 0),
           "silu": lambda x: x / (1 + np.exp(-x)),
           "gelu_new": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi)
                                                         * (x + 0.044715 * x ** 3)))}
    act = act[c["hidden_act"]]
    B, S = ids.shape
    x = (w["embeddings.word_embeddings.weight"][ids]
         + w["embeddings.token_type_embeddings.weight"][tt]
         + w["embeddings.position_embeddings.weight"][np.arange(S)])
    x = ln(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
    H = x.shape[-1]
    hd = H // nh
    for i in range(c["num_hidden_layers"]):
        p = f"encoder.layer.{i}."

        def lin(v, n):
            return v @ w[p + n + ".weight"].T + w[p + n + ".bias"]
        q, k, v = (lin(x, f"attention.self.{n}") for n in ("query", "key", "value"))
        ctx = np.zeros_like(x)
        for b in range(B):
            for h in range(nh):
                sl = slice(h * hd, (h + 1) * hd)
                s = q[b, :, sl] @ k[b, :, sl].T / math.sqrt(hd)
                s = np.where(mask[b][None, :] == 1, s, -np.inf)
                e = np.exp(s - s.max(-1, keepdims=True))
                ctx[b, :, sl] = (e / e.sum(-1, keepdims=True)) @ v[b, :, sl]
        x = ln(lin(ctx, "attention.output.dense") + x, w[p + "attention.output.LayerNorm.weight"],
               w[p + "attention.output.LayerNorm.bias"])
        h_ = act(lin(x, "intermediate.dense"))
        x = ln(lin(h_, "output.dense") + x, w[p + "output.LayerNorm.weight"],
               w[p + "output.LayerNorm.bias"])
    return x


@pytest.mark.parametrize("act,eps", [("gelu", 1e-12), ("relu", 1e-5), ("silu", 1e-7),
                                     ("gelu_new", 1e-3)])
@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-4), (np.float64, 1e-9)])
def test_matches_numpy_reference(tmp_path, act, eps, dtype, tol):
    write_numpy_bert(tmp_path, seed=3, hidden_act=act, layer_norm_eps=eps, type_vocab_size=3,
                     dtype=np.float64)
    rng = np.random.default_rng(0)
    ids, mask = padded_batch(rng, 60, [10, 6, 2], 10)
    tt = rng.integers(0, 3, ids.shape)
    ref = numpy_bert_forward(tmp_path, ids, mask, tt)
    out = EncoderModel.from_pretrained(tmp_path, dtype=dtype)(ids, mask, tt)
    assert out.dtype == dtype
    assert np.abs(out - ref).max() / np.abs(ref).max() <= tol


def test_prefix_and_tf_layernorm_names(tmp_path, bert_dir, enc):
    """'roberta.'-style prefixes and gamma/beta LayerNorm names load to the same model."""
    from safetensors.numpy import load_file, save_file
    t = load_file(os.path.join(bert_dir, "model.safetensors"))
    renamed = {}
    for k, v in t.items():
        k = k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                     "LayerNorm.beta")
        renamed["bert." + k] = v
    renamed["cls.predictions.bias"] = np.zeros(3, np.float32)
    shutil.copy(os.path.join(bert_dir, "config.json"), tmp_path / "config.json")
    save_file(renamed, tmp_path / "model.safetensors")
    ids = np.arange(12).reshape(2, 6)
    np.testing.assert_array_equal(EncoderModel.from_pretrained(tmp_path)(ids), enc(ids))


# --- pooling -----------------------------------------------------------------------------

@pytest.mark.parametrize("modes", [("mean",), ("cls",), ("max",), ("mean_sqrt_len",),
                                   ("cls", "max", "mean", "mean_sqrt_len")])
@pytest.mark.parametrize("normalize", [False, True])
def test_pooling_modes(enc, modes, normalize):
    rng = np.random.default_rng(1)
    ids, mask = padded_batch(rng, 60, [9, 4, 1, 0], 9)
    hidden = enc(ids, mask)
    with warnings.catch_warnings():
        warnings.simplefilter("error")             # no divide-by-zero on the empty row
        vec = enc.embed(ids, mask, pooling=list(modes)[::-1], normalize=normalize)
    ref = reference_pool(hidden, mask, modes, normalize)
    assert vec.shape == (4, 32 * len(modes))
    np.testing.assert_allclose(vec, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(vec[3], 0.0)     # no token: zeros by definition, no NaN


def test_embed_defaults_without_mask(enc):
    ids = np.random.default_rng(2).integers(0, 60, (3, 7))
    vec = enc.embed(ids)
    np.testing.assert_allclose(vec, reference_pool(enc(ids), np.ones(ids.shape), ("mean",), True),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(vec, axis=1), 1.0, rtol=1e-6)


@pytest.mark.parametrize("transformer_path", ["", "0_Transformer"])
def test_st_folder_modes(tmp_path, bert_dir, enc, transformer_path):
    root = tmp_path / "st"
    copy_folder(bert_dir, root / transformer_path if transformer_path else root)
    write_st_folder(root, pooling=("cls", "mean"), normalize=False,
                    transformer_path=transformer_path)
    st = EncoderModel.from_pretrained(root)
    assert st.pooling == ("cls", "mean") and not st.normalize
    ids, mask = padded_batch(np.random.default_rng(3), 60, [5, 3], 5)
    np.testing.assert_array_equal(st.embed(ids, mask),
                                  enc.embed(ids, mask, pooling=("cls", "mean"), normalize=False))
    assert st.max_seq_length is None
    write_st_folder(root, pooling=("max",), normalize=True, transformer_path=transformer_path)
    (root / transformer_path / "sentence_bert_config.json").write_text(
        '{"max_seq_length": 16, "do_lower_case": false}')
    st = EncoderModel.from_pretrained(root)
    assert st.pooling == ("max",) and st.normalize and st.max_seq_length == 16


# --- bad inputs ---------------------------------------------------------------------------

@pytest.mark.parametrize("mask,exc,match", [
    (np.ones((2, 5), int), ValueError, r"attention_mask must have the shape of input_ids \(2, 6\)"),
    (np.ones((6,), int), ValueError, "attention_mask must have the shape"),
    (np.full((2, 6), 2), ValueError, "attention_mask must hold only 0 and 1.*1 = token"),
    (np.where(np.eye(2, 6) > 0, -np.inf, 0.0), ValueError, "attention_mask.*additive"),
    (np.full((2, 6), -1), ValueError, "attention_mask must hold only 0 and 1"),
    (np.full((2, 6), "1"), TypeError, "attention_mask must hold 0/1"),
])
def test_bad_masks(enc, mask, exc, match):
    with pytest.raises(exc, match=match):
        enc(np.ones((2, 6), dtype=np.int64), attention_mask=mask)


@pytest.mark.parametrize("ids,exc,match", [
    (np.array([[1, 2, -1]]), ValueError, r"input_ids holds token id -1 outside the vocabulary \[0, 60\)"),
    (np.array([[1, 2, 60]]), ValueError, "input_ids holds token id 60"),
    (np.array([[1.0, 2.0]]), TypeError, "input_ids must hold integer token ids"),
    (np.array([[True, False]]), TypeError, "input_ids must hold integer"),
    (np.array([1, 2, 3]), ValueError, r"input_ids must be 2-D \(batch, seq_len\)"),
    (np.zeros((1, 25), int), ValueError, "input_ids has 25 tokens.*max_position_embeddings=24"),
])
def test_bad_ids(enc, ids, exc, match):
    with pytest.raises(exc, match=match):
        enc(ids)
    with pytest.raises(exc, match=match):
        enc.embed(ids)


def test_bad_token_types_and_options(enc):
    ids = np.ones((1, 4), dtype=np.int64)
    with pytest.raises(ValueError, match=r"token_type_ids holds 3, outside \[0, type_vocab_size=3"):
        enc(ids, token_type_ids=np.full((1, 4), 3))
    with pytest.raises(ValueError, match="token_type_ids must have the shape"):
        enc(ids, token_type_ids=np.zeros((1, 3), int))
    with pytest.raises(TypeError, match="token_type_ids must be integers"):
        enc(ids, token_type_ids=np.zeros((1, 4)))
    with pytest.raises(ValueError, match="pooling must be one of"):
        enc.embed(ids, pooling="weightedmean")
    with pytest.raises(TypeError, match="normalize must be True or False"):
        enc.embed(ids, normalize="yes")
    assert enc(np.zeros((0, 4), int)).shape == (0, 4, 32)
    assert enc.embed(np.zeros((0, 4), int)).shape == (0, 32)


# --- bad folders --------------------------------------------------------------------------

def test_missing_things_name_the_path(tmp_path, bert_dir):
    with pytest.raises(FileNotFoundError, match="model folder not found: .*nope"):
        EncoderModel.from_pretrained(tmp_path / "nope")
    d = copy_folder(bert_dir, tmp_path / "a")
    os.remove(d / "config.json")
    with pytest.raises(FileNotFoundError, match=r"model config not found: .*a/config\.json"):
        EncoderModel.from_pretrained(d)
    d = copy_folder(bert_dir, tmp_path / "b")
    os.remove(d / "model.safetensors")
    with pytest.raises(FileNotFoundError, match=r"model weights not found: .*b/model\.safetensors"):
        EncoderModel.from_pretrained(d)
    (d / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(ValueError, match="pytorch_model.bin but no model.safetensors"):
        EncoderModel.from_pretrained(d)
    d = copy_folder(bert_dir, tmp_path / "c")
    (d / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        EncoderModel.from_pretrained(d)
    d = copy_folder(bert_dir, tmp_path / "e")
    (d / "model.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(ValueError, match="could not read the safetensors file"):
        EncoderModel.from_pretrained(d)


@pytest.mark.parametrize("changes,match", [
    ({"model_type": "gpt2"}, "model_type='gpt2'.*not supported"),
    ({"model_type": None}, "model_type=None"),
    ({"position_embedding_type": "relative_key"}, "position_embedding_type='relative_key'"),
    ({"hidden_act": "quick_gelu"}, "hidden_act='quick_gelu' is not supported"),
    ({"hidden_act": "tanh"}, "hidden_act='tanh'"),
    ({"is_decoder": True}, "is_decoder"),
    ({"is_decoder": "false"}, "is_decoder='false' .* must be true or false"),
    ({"layer_norm_eps": -1}, "layer_norm_eps=-1"),
    ({"num_attention_heads": 5}, "not a multiple of the number of attention heads"),
    ({"pad_token_id": 60}, "pad_token_id=60"),
    ({"type_vocab_size": 2}, r"token_type_embeddings.weight' .* has shape \(3, 32\); "
                             r"config.json implies \(2, 32\)"),
    ({"num_hidden_layers": 3}, "tensor 'encoder.layer.2.attention.self.query.weight' not found"),
    ({"num_hidden_layers": 1}, "more layers than config.json's 1"),
    ({"max_position_embeddings": 30}, "position_embeddings.weight"),
])
def test_bad_configs_name_the_field(tmp_path, bert_dir, changes, match):
    d = copy_folder(bert_dir, tmp_path / "m")
    edit_config(d, **changes)
    with pytest.raises(ValueError, match=match):
        EncoderModel.from_pretrained(d)


def test_bad_dtype_and_path(bert_dir):
    with pytest.raises(ValueError, match="dtype must be float32 or float64"):
        EncoderModel.from_pretrained(bert_dir, dtype=np.float16)
    with pytest.raises(TypeError, match="path must be a folder path"):
        EncoderModel.from_pretrained(3)


@pytest.mark.parametrize("kind,kwargs,match", [
    ("flag", {"extra_flags": {"pooling_mode_weightedmean_tokens": True}},
     "pooling_mode_weightedmean_tokens=true.*not supported"),
    ("flag", {"extra_flags": {"pooling_mode_lasttoken": True}}, "pooling_mode_lasttoken"),
    ("flag", {"pooling": ()}, "sets no pooling mode"),
    ("flag", {"extra_flags": {"word_embedding_dimension": 31}}, "word_embedding_dimension=31"),
    ("flag", {"extra_flags": {"include_prompt": False}}, "include_prompt=False"),
    ("modules", {"modules": [
        {"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "path": "2_WW", "type": "sentence_transformers.models.WordWeights"}]},
     "module type 'sentence_transformers.models.WordWeights' is not supported"),
    ("modules", {"modules": [
        {"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"}]},
     "supported: Transformer, Pooling"),
    ("modules", {"modules": {"0": "x"}}, "must hold a JSON list"),
])
def test_bad_sentence_transformers_folders(tmp_path, bert_dir, kind, kwargs, match):
    d = copy_folder(bert_dir, tmp_path / "st")
    write_st_folder(d, **kwargs)
    with pytest.raises(ValueError, match=match):
        EncoderModel.from_pretrained(d)


def test_missing_pooling_config_names_the_path(tmp_path, bert_dir):
    d = copy_folder(bert_dir, tmp_path / "st")
    write_st_folder(d)
    os.remove(d / "1_Pooling" / "config.json")
    with pytest.raises(FileNotFoundError, match=r"Pooling config not found: .*1_Pooling"):
        EncoderModel.from_pretrained(d)


def test_exported_at_top_level():
    assert fastattn.EncoderModel is EncoderModel


@pytest.mark.parametrize("modes", [("mean",), ("max", "mean_sqrt_len"), ("cls", "mean")])
def test_embed_left_padding_and_holes(enc, modes):
    """embed skips padding in the dense layers: the same vectors as pooling the full hidden
    state, for left padding (position 0 is padding: 'cls' reads it, as sentence-transformers
    does) and for masks with holes."""
    rng = np.random.default_rng(4)
    ids = rng.integers(1, 60, (4, 10))
    mask = np.ones((4, 10), dtype=np.int64)
    mask[0, :6] = 0                     # left padded
    mask[1, 3:5] = 0                    # a hole
    mask[2, :] = 0                      # nothing
    tt = rng.integers(0, 3, ids.shape)
    hidden = enc(ids, mask, tt)
    np.testing.assert_allclose(enc.embed(ids, mask, tt, pooling=modes, normalize=False),
                               reference_pool(hidden, mask, modes, False), rtol=1e-5, atol=1e-5)


def test_more_damaged_folders_name_the_file(tmp_path, bert_dir, enc):
    """Damage a hostile-input review found reported without the file or field."""
    d = copy_folder(bert_dir, tmp_path / "st")
    write_st_folder(d, extra_flags={"pooling_mode": ["mean", 3]})
    with pytest.raises(ValueError, match=r"pooling_mode=\['mean', 3\].*1_Pooling"):
        EncoderModel.from_pretrained(d)
    d = copy_folder(bert_dir, tmp_path / "st2")
    write_st_folder(d)
    (d / "sentence_bert_config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="sentence_bert_config.json must hold a JSON dict"):
        EncoderModel.from_pretrained(d)
    d = copy_folder(bert_dir, tmp_path / "latin1")
    (d / "config.json").write_bytes(b'{"model_type": "bert\xe9"}')
    with pytest.raises(ValueError, match="config.json is not UTF-8"):
        EncoderModel.from_pretrained(d)
    # a sharded index may only name files inside the folder
    for shard in ("../outside.safetensors", 3, "sub/x.safetensors", ".."):
        d = copy_folder(bert_dir, tmp_path / f"idx{abs(hash(str(shard)))}")
        os.rename(d / "model.safetensors", d / "part-1.safetensors")
        (d / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {"embeddings.word_embeddings.weight": shard}}))
        with pytest.raises(ValueError, match="weight_map lists"):
            EncoderModel.from_pretrained(d)
    for bad in (None, "bogus", np.int32):
        with pytest.raises(ValueError, match="dtype must be float32 or float64"):
            EncoderModel.from_pretrained(bert_dir, dtype=bad)
    ids = np.ones((1, 4), dtype=np.int64)
    for bad in (3, None.__class__, [3]):
        with pytest.raises(ValueError, match="pooling must be one of"):
            enc.embed(ids, pooling=bad)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_embedding_layer_is_the_step_by_step_ops(tmp_path, dtype, model_type):
    """The one-pass C embedding layer (gather, sum, LayerNorm) gives the bits of gathering the
    three tables, adding them in order and normalising with fastattn.layer_norm, for every way
    the rows come in: token types given or not, RoBERTa's padding-aware positions, only the
    real tokens of a padded batch (embed's packed rows)."""
    overrides = {"model_type": model_type, "pad_token_id": 1}
    write_numpy_bert(tmp_path, dtype=dtype, type_vocab_size=3, config_overrides=overrides)
    enc = EncoderModel.from_pretrained(tmp_path, dtype=dtype)
    emb, cfg = enc.embeddings._params, enc.config
    top = {"word": emb["weight"], "token_type": emb["token_type_weight"],
           "position": emb["position_weight"], "emb_ln_w": enc.embeddings.norm._params["weight"],
           "emb_ln_b": enc.embeddings.norm._params["bias"]}
    rng = np.random.default_rng(5)
    ids, mask = padded_batch(rng, cfg.vocab_size, [9, 4, 1], 9, pad_id=1)
    tt = rng.integers(0, 3, ids.shape)
    keep = np.flatnonzero(mask)
    for t in (None, tt):
        for k in (None, keep):
            got = enc._embeddings(ids, t, k)
            pos = np.broadcast_to(enc._position_ids(ids), ids.shape).reshape(-1)
            i, p_ = ids.reshape(-1), pos
            ti = np.zeros(ids.size, int) if t is None else t.reshape(-1)
            if k is not None:
                i, p_, ti = i[k], p_[k], ti[k]
            x = top["word"][i]
            x += top["token_type"][ti]
            x += top["position"][p_]
            want = fastattn.layer_norm(x, top["emb_ln_w"], top["emb_ln_b"], cfg.layer_norm_eps)
            assert got.dtype == dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want)
    if model_type == "roberta":          # positions start after the padding id
        assert enc._position_ids(ids)[2, 0] == 2 and enc._position_ids(ids)[2, 1] == 1


def test_embedding_kernel_refuses_bad_indexes():
    """The C embedding layer checks its own indexes and layouts (a ValueError, never a read
    outside a table), whatever its caller validated."""
    from fastattn._kernels import _embedding
    rng = np.random.default_rng(0)
    word = rng.standard_normal((10, 8)).astype(np.float32)
    types = rng.standard_normal((2, 8)).astype(np.float32)
    posn = rng.standard_normal((6, 8)).astype(np.float32)
    g, b = np.ones(8, np.float32), np.zeros(8, np.float32)
    y = np.empty((3, 8), np.float32)
    idx = lambda *v: np.array(v, dtype=np.intp)
    _embedding.embed_layer_norm(word, idx(0, 9, 3), types, idx(0, 1, 1), posn, idx(0, 1, 5), g, b,
                           1e-5, y, 2)
    want = fastattn.layer_norm(word[[0, 9, 3]] + types[[0, 1, 1]] + posn[[0, 1, 5]], g, b, 1e-5)
    np.testing.assert_array_equal(y, want)
    cases = [
        ((word, idx(0, 10, 3), types, None, posn, idx(0, 1, 2)), "ids holds an index outside"),
        ((word, idx(0, -1, 3), types, None, posn, idx(0, 1, 2)), "ids holds an index outside"),
        ((word, idx(0, 1, 3), types, idx(0, 2, 0), posn, idx(0, 1, 2)), "tt holds an index"),
        ((word, idx(0, 1, 3), types, None, posn, idx(0, 1, 6)), "pos holds an index outside"),
        ((word, idx(0, 1), types, None, posn, idx(0, 1, 2)), "ids must be a contiguous 1-D"),
        ((word, idx(0, 1, 2, 3)[::-1][1:], None, None, posn, idx(0, 1, 2)), None),
        ((word.astype(np.float64), idx(0, 1, 2), None, None, posn, idx(0, 1, 2)),
         "C-contiguous"),
        ((word[:, :4], idx(0, 1, 2), None, None, posn, idx(0, 1, 2)), "C-contiguous"),
        ((word, idx(0, 1, 2), types[:0], None, posn, idx(0, 1, 2)), "token-type table is empty"),
    ]
    for args, match in cases:
        if match is None:                  # a reversed (negative-stride) index array
            with pytest.raises(ValueError, match="contiguous 1-D"):
                _embedding.embed_layer_norm(*args, g, b, 1e-5, y, 2)
            continue
        with pytest.raises(ValueError, match=match):
            _embedding.embed_layer_norm(*args, g, b, 1e-5, y, 2)
    with pytest.raises(ValueError, match="output must be a 2-D array"):
        _embedding.embed_layer_norm(word, idx(0, 1, 2), None, None, posn, idx(0, 1, 2), g, b, 1e-5,
                               y.reshape(-1), 2)
    with pytest.raises(ValueError, match="gamma and beta"):
        _embedding.embed_layer_norm(word, idx(0, 1, 2), None, None, posn, idx(0, 1, 2), g[:4], b,
                               1e-5, y, 2)
