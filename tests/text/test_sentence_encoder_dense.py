"""sentence-transformers folders with Dense modules (issue 56): SentenceEncoder and
EncoderModel.embed against SentenceTransformer.encode on folders sentence-transformers saved
(several activations, stacked Dense, residuals, with and without Normalize, truncate_dim, a
default prompt), the real all-MiniLM-L6-v2 with a Dense module, every Dense activation against
torch, and the fields and modules we do not run refused by name. ``fastattn embed`` and
``/v1/embeddings`` on the same folders: tests/cli/test_text_cli.py, tests/serve/test_serve.py."""
import json
import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
st = pytest.importorskip("sentence_transformers")

import fastattn  # noqa: E402
from dense_folders import CASES, HIDDEN, SENTENCES, st_modules  # noqa: E402
from fastattn.models._sentence_transformers import _DENSE_ACTIVATIONS, read_dense  # noqa: E402
from fastattn.text import SentenceEncoder  # noqa: E402
from tolerances import TORCH_TOL  # noqa: E402

TOL = TORCH_TOL[np.float32]


def st_model(folder):
    return st.SentenceTransformer(folder, device="cpu")


def assert_close(got, want):
    """float32 against sentence-transformers' float32, relative to the vectors' size."""
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL * max(np.abs(want).max(), 1e-3))


@pytest.mark.parametrize("case", list(CASES))
def test_equal_sentence_transformers(dense_folders, case):
    folder = dense_folders[case]
    ref = st_model(folder)
    enc = SentenceEncoder(folder)
    want = ref.encode(SENTENCES, batch_size=4)
    dim = getattr(ref, "get_embedding_dimension", None) or ref.get_sentence_embedding_dimension
    assert enc.dim == dim() == want.shape[1]
    got = enc.encode(SENTENCES)
    assert got.dtype == np.float32
    assert_close(got, want)
    assert_close(enc.encode(SENTENCES[0]), ref.encode(SENTENCES[0]))
    # sentence-transformers' option names, with its meaning
    for value in (True, False):
        assert_close(enc.encode(SENTENCES, normalize_embeddings=value),
                     ref.encode(SENTENCES, batch_size=4, normalize_embeddings=value))
    # EncoderModel.embed is the one path: the same bits from a batch of ids
    ids, types = enc.tokenize(SENTENCES[:4])
    n = max(map(len, ids))
    batch = np.array([r + [0] * (n - len(r)) for r in ids])
    mask = np.array([[1] * len(r) + [0] * (n - len(r)) for r in ids])
    np.testing.assert_array_equal(enc.model.embed(batch, mask), got[:4])
    assert enc.model.embedding_dim == enc.dim


@pytest.mark.parametrize("case", ["stacked", "residual", "truncated"])
def test_bitwise_whatever_the_batch(dense_folders, case):
    enc = SentenceEncoder(dense_folders[case])
    texts = SENTENCES + [f"sentence number {i} " * (i % 7 + 1) for i in range(30)]
    ref = enc.encode(texts, batch_size=32)
    for bs in (1, 3, 1000):
        np.testing.assert_array_equal(enc.encode(texts, batch_size=bs), ref)
    perm = np.random.default_rng(0).permutation(len(texts))
    np.testing.assert_array_equal(enc.encode([texts[i] for i in perm], batch_size=5), ref[perm])
    ids, types = enc.tokenize(texts)
    np.testing.assert_array_equal(enc.embed_ids(ids, types, batch_size=None,
                                                max_batch_tokens=64), ref)


def test_truncate_dim_and_normalize(dense_folders):
    enc = SentenceEncoder(dense_folders["truncated"])
    full = SentenceEncoder(dense_folders["tanh_normalize"])
    assert enc.dim == 10 and enc.model.truncate_dim == 10
    got = enc.encode(SENTENCES)
    # the Normalize module runs before truncation, as in sentence-transformers: not unit norm
    assert np.all(np.linalg.norm(got, axis=1) < 1 - 1e-3)
    unit = enc.encode(SENTENCES, normalize=True)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1, rtol=1e-6)
    np.testing.assert_array_equal(enc.encode(SENTENCES, normalize_embeddings=True), unit)
    raw = enc.encode(SENTENCES, normalize=False)
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), unit,
                               rtol=1e-6, atol=1e-7)
    assert full.dim == 24


def test_default_prompt(dense_folders):
    enc = SentenceEncoder(dense_folders["prompt"])
    assert enc.prompt == "query: "
    ids, _ = enc.tokenize(["hello"])
    plain, _ = enc.tokenizer.encode(["query: hello"], max_length=enc.max_seq_length, types=True)
    assert ids == plain


def test_minilm_with_dense(minilm, tmp_path):
    """The issue's case: all-MiniLM-L6-v2 + Dense(384 -> 128, Tanh) + Normalize, saved by
    sentence-transformers: (3, 128), as SentenceTransformer.encode."""
    st_models = st_modules()
    base = st_model(minilm)
    torch.manual_seed(5)
    model = st.SentenceTransformer(modules=[base[0], base[1], st_models.Dense(384, 128),
                                            st_models.Normalize()], device="cpu")
    model.save(str(tmp_path))
    texts = ["A man is eating food.", "A man rides a horse.", "Ein Satz auf Deutsch."]
    want = st_model(str(tmp_path)).encode(texts)
    enc = SentenceEncoder(str(tmp_path))
    assert enc.dim == 128 and want.shape == (3, 128)
    got = enc.encode(texts)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1, rtol=1e-6)


@pytest.mark.parametrize("activation", sorted(_DENSE_ACTIVATIONS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_dense_activation_against_torch(tmp_path, activation, dtype):
    """Each activation read_dense accepts, as Dense.save writes it, against the torch module
    over a wide range of inputs (past softplus' threshold and exp's overflow)."""
    st_models = st_modules()
    torch.manual_seed(7)
    d = st_models.Dense(6, 40, activation_function=getattr(torch.nn, activation)())
    with torch.no_grad():
        d.linear.weight.mul_(60)                  # outputs over about [-150, 150]
    d.save(str(tmp_path))
    tdt = {np.float32: torch.float32, np.float64: torch.float64}[dtype]
    x = np.random.default_rng(1).standard_normal((9, 6)).astype(dtype)
    x[0] = 0
    ours = read_dense(str(tmp_path), 6, dtype)
    ours.prepack()
    with torch.no_grad():
        want = d.to(tdt)({"sentence_embedding": torch.as_tensor(x)})["sentence_embedding"]
    got = ours(x)
    assert got.dtype == dtype
    tol = TORCH_TOL[dtype]
    np.testing.assert_allclose(got, want.numpy(), rtol=tol, atol=tol)


def _edit(path, **changes):
    cfg = json.load(open(path))
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    json.dump(cfg, open(path, "w"))


@pytest.fixture
def folder(dense_folders, tmp_path):
    """A copy of the 'stacked' case to damage (its base model's weights linked, not copied)."""
    dst = tmp_path / "f"
    shutil.copytree(dense_folders["stacked"], dst, copy_function=os.link)
    for f in dst.rglob("*.json"):                 # files we edit: our own copies
        data = f.read_bytes()
        f.unlink()
        f.write_bytes(data)
    return dst


def _modules(folder):
    return json.load(open(folder / "modules.json"))


@pytest.mark.parametrize("file,changes,match", [
    ("2_Dense/config.json", {"activation_function": "torch.nn.modules.activation.Softmax"},
     r"activation_function='torch.nn.modules.activation.Softmax' in .*2_Dense.config.json "
     r"is not supported; supported: torch.nn.Identity"),
    ("2_Dense/config.json", {"activation_function": "torch.nn.modules.activation.PReLU"},
     "activation_function='torch.nn.modules.activation.PReLU'"),
    ("2_Dense/config.json", {"activation_function": "my_package.Swish"},
     "activation_function='my_package.Swish'"),
    ("2_Dense/config.json", {"activation_function": "torch.tanh"},
     "activation_function='torch.tanh'"),
    ("2_Dense/config.json", {"activation_function": "torch.nn.modules.activation.Identity"},
     "activation_function='torch.nn.modules.activation.Identity'"),
    ("3_Dense/config.json", {"module_input_name": "token_embeddings"},
     r"Dense config field module_input_name='token_embeddings' in .*3_Dense"),
    ("2_Dense/config.json", {"module_output_name": "projected"}, "module_output_name='projected'"),
    ("2_Dense/config.json", {"scale": 2}, r"Dense config field scale in .*2_Dense.config.json"),
    ("2_Dense/config.json", {"bias": "yes"}, "bias='yes'"),
    ("2_Dense/config.json", {"use_residual": 1}, "use_residual=1"),
    ("4_Normalize/config.json", {"module_input_name": "token_embeddings"},
     r"Normalize config field module_input_name='token_embeddings' in .*4_Normalize"),
    ("1_Pooling/config.json", {"pooling_mode": "weightedmean"},
     r"pooling_mode='weightedmean' in .*1_Pooling.config.json is not supported"),
    ("1_Pooling/config.json", {"pooling_mode": "lasttoken"}, "pooling_mode='lasttoken'"),
    ("1_Pooling/config.json", {"pooling_mode": ["mean", "mean"]}, r"pooling_mode=\['mean', "),
    ("1_Pooling/config.json", {"pooling_mode": None, "pooling_mode_lasttoken": True},
     "pooling_mode_lasttoken=true"),
    ("1_Pooling/config.json", {"include_prompt": False}, "include_prompt=False"),
    ("1_Pooling/config.json", {"embedding_dimension": 33}, "embedding_dimension=33"),
    ("1_Pooling/config.json", {"normalize": True}, r"Pooling config field normalize in "),
    ("sentence_bert_config.json", {"transformer_task": "fill-mask"},
     r"transformer_task='fill-mask' in .*sentence_bert_config.json is not supported"),
    ("sentence_bert_config.json", {"module_output_name": "pooler_output"},
     "module_output_name='pooler_output'"),
    ("sentence_bert_config.json",
     {"modality_config": {"text": {"method": "forward", "method_output_name": "pooler_output"}}},
     "modality_config="),
    ("sentence_bert_config.json", {"processing_kwargs": {"text": {"max_length": 8}}},
     "processing_kwargs="),
    ("sentence_bert_config.json", {"tokenizer_args": {"model_max_length": 8}},
     "tokenizer_args="),
    ("sentence_bert_config.json", {"strip": True},
     r"config field strip in .*sentence_bert_config.json is not supported"),
    ("sentence_bert_config.json", {"do_lower_case": "yes"}, "do_lower_case='yes'"),
    ("config_sentence_transformers.json", {"model_type": "SparseEncoder"},
     r"model_type='SparseEncoder' in .*config_sentence_transformers.json"),
    ("config_sentence_transformers.json", {"truncate_dim": 0}, "truncate_dim=0"),
    ("config_sentence_transformers.json", {"default_prompt_name": "passage"},
     "default_prompt_name='passage'"),
])
def test_unsupported_fields_name_field_and_file(folder, file, changes, match):
    _edit(folder / file, **changes)
    for load in (SentenceEncoder, fastattn.EncoderModel.from_pretrained):
        with pytest.raises(ValueError, match=match):
            load(str(folder))


@pytest.mark.parametrize("kind", ["LayerNorm", "CNN", "WordEmbeddings", "LSTM",
                                  "WeightedLayerPooling", "pylate", "normalize_first"])
def test_unsupported_modules_are_refused_by_type(folder, kind):
    mods = _modules(folder)
    if kind == "pylate":                          # another library's Dense
        mods[2]["type"] = "pylate.models.Dense.Dense"
        match = "module type 'pylate.models.Dense.Dense' is not supported"
    elif kind == "normalize_first":               # Normalize before a Dense
        mods[2], mods[4] = dict(mods[4], idx=2), dict(mods[2], idx=4)
        match = "then optionally Normalize"
    else:
        mods.insert(2, {"idx": 2, "name": "x", "path": "x",
                        "type": f"sentence_transformers.models.{kind}"})
        for i, m in enumerate(mods):
            m["idx"] = i
        match = f"module type 'sentence_transformers.models.{kind}' is not supported"
    json.dump(mods, open(folder / "modules.json", "w"))
    for load in (SentenceEncoder, fastattn.EncoderModel.from_pretrained):
        with pytest.raises(ValueError, match=match):
            load(str(folder))


def test_dense_pytorch_bin_is_refused_with_the_way_out(folder):
    os.rename(folder / "3_Dense" / "model.safetensors", folder / "3_Dense" / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"3_Dense holds pytorch_model.bin but no "
                                         r"model.safetensors.*SentenceTransformer\(folder\)"):
        SentenceEncoder(str(folder))


def test_embed_pooling_must_fit_the_dense_module(dense_folders):
    model = fastattn.EncoderModel.from_pretrained(dense_folders["residual"])
    assert model.pooling == ("mean", "cls")       # the folder's order of concatenation
    ids = np.ones((1, 5), dtype=np.int64)
    with pytest.raises(ValueError, match="pooling='mean' gives 32 values per sentence; the "
                                         "folder's first Dense module takes 64"):
        model.embed(ids, pooling="mean")
    assert model.embed(ids, pooling=("cls", "max")).shape == (1, 20)


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_saved_folder_keeps_the_dense_modules(dense_folders, tmp_path, quantize):
    """save_pretrained writes the Dense weights (a residual projection too): the saved folder
    gives the same bits."""
    enc = SentenceEncoder(dense_folders["residual"], quantize=quantize)
    enc.model.save_pretrained(tmp_path / "saved")
    again = SentenceEncoder(str(tmp_path / "saved"))
    np.testing.assert_array_equal(again.encode(SENTENCES), enc.encode(SENTENCES))
    if quantize:                                  # int8 Dense layers: close to float
        ref = st_model(dense_folders["residual"]).encode(SENTENCES)
        np.testing.assert_allclose(enc.encode(SENTENCES), ref, atol=0.05 * np.abs(ref).max())


def test_encode_option_names(dense_folders, capsys):
    enc = SentenceEncoder(dense_folders["tanh_normalize"])
    a = enc.encode(SENTENCES[:3], show_progress_bar=True)
    assert "embed" in capsys.readouterr().err
    np.testing.assert_array_equal(a, enc.encode(SENTENCES[:3], progress=True,
                                                show_progress_bar=True))
    capsys.readouterr()
    np.testing.assert_array_equal(enc.encode(SENTENCES[:3], normalize=False,
                                             normalize_embeddings=False),
                                  enc.encode(SENTENCES[:3], normalize=False))
    for kw in ({"normalize": False, "normalize_embeddings": True},
               {"normalize": True, "normalize_embeddings": False}):
        with pytest.raises(TypeError, match="normalize=.* and normalize_embeddings=.* disagree"):
            enc.encode(["a"], **kw)
    with pytest.raises(TypeError, match="progress=True and show_progress_bar=False disagree"):
        enc.encode(["a"], progress=True, show_progress_bar=False)
    with pytest.raises(TypeError, match="normalize_embeddings must be True, False or None"):
        enc.encode(["a"], normalize_embeddings="yes")


def test_legacy_files(folder):
    """Files earlier sentence-transformers versions wrote: Pooling flags, a
    sentence_roberta_config.json, Dense without module names; a folder without pooling
    keys pools by mean."""
    enc = SentenceEncoder(str(folder))
    want = enc.encode(SENTENCES)
    _edit(folder / "1_Pooling" / "config.json", embedding_dimension=None, pooling_mode=None,
          word_embedding_dimension=HIDDEN, pooling_mode_cls_token=False,
          pooling_mode_mean_tokens=True, pooling_mode_max_tokens=False)
    for d in ("2_Dense", "3_Dense"):
        _edit(folder / d / "config.json", module_input_name=None, module_output_name=None)
    os.rename(folder / "sentence_bert_config.json", folder / "sentence_roberta_config.json")
    _edit(folder / "sentence_roberta_config.json", max_seq_length=12, do_lower_case=True)
    enc = SentenceEncoder(str(folder))
    assert enc.max_seq_length == 12 and enc.do_lower_case
    assert_close(enc.encode(SENTENCES), st_model(str(folder)).encode(SENTENCES))
    os.rename(folder / "sentence_roberta_config.json", folder / "sentence_bert_config.json")
    _edit(folder / "sentence_bert_config.json", max_seq_length=None, do_lower_case=None)
    _edit(folder / "1_Pooling" / "config.json", pooling_mode_cls_token=None,
          pooling_mode_mean_tokens=None, pooling_mode_max_tokens=None)
    np.testing.assert_array_equal(SentenceEncoder(str(folder)).encode(SENTENCES), want)
