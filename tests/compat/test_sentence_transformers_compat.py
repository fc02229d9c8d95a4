"""fastattn.compat.sentence_transformers against sentence-transformers itself: the same script
with the import changed gives the same types, shapes, dtypes and (within TORCH_TOL) values, on
the real all-MiniLM-L6-v2 folder and on the Dense folders sentence-transformers saved
(tests/text/dense_folders.py); precision's int8 / uint8 / binary / ubinary equal bit for bit
given equal float inputs; what fastattn cannot honour is refused by name. sentence-transformers'
own encode tests, ported: test_sentence_transformers_suite.py."""
import json
import logging
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
st = pytest.importorskip("sentence_transformers")

from dense_folders import CASES, SENTENCES  # noqa: E402
from fastattn.compat import sentence_transformers as compat  # noqa: E402
from fastattn.compat.sentence_transformers import SentenceTransformer  # noqa: E402
from tolerances import TORCH_TOL  # noqa: E402

TOL = TORCH_TOL[np.float32]
TEXTS = ["A man is eating food.", "A man is eating a piece of bread.", "x",
         "The girl is carrying a baby.", "Ünïcödé àccents, café and 中文字符 mixed in.",
         " ".join(["a very long text"] * 100),             # past max_seq_length (256)
         "A woman is playing violin.", "Two men pushed carts through the woods."]


def _close(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, what
    assert got.dtype == want.dtype, what
    if want.dtype.kind == "f":
        scale = max(float(np.abs(want).max()), 1e-3) if want.size else 1.0
        np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL * scale, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def assert_same(got, want, what="result"):
    """The same type, shape and dtype as sentence-transformers' result, and values within
    TORCH_TOL (integers exactly), recursively through lists and dicts."""
    assert type(got) is type(want), f"{what}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape, what
        assert got.device == want.device, what
        _close(got.numpy(), want.numpy(), what)
    elif isinstance(want, np.ndarray):
        _close(got, want, what)
    elif isinstance(want, list):
        assert len(got) == len(want), what
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{what}[{i}]")
    elif isinstance(want, dict):
        assert list(got) == list(want), what
        for k in want:
            assert_same(got[k], want[k], f"{what}[{k!r}]")
    else:
        assert got == want, what


def both(ref, ours, *args, **kwargs):
    """encode on both; every result compared."""
    want = ref.encode(*args, **kwargs)
    got = ours.encode(*args, **kwargs)
    assert_same(got, want, f"encode({kwargs})")
    return got, want


INPUTS = {"list": TEXTS, "single": TEXTS[1], "empty": [], "one": [TEXTS[0]],
          "tuple": tuple(TEXTS[:3]), "array": np.array(TEXTS[:3])}
OPTIONS = [
    {},
    dict(normalize_embeddings=True),
    dict(batch_size=3),
    dict(batch_size=1, show_progress_bar=False),
    dict(convert_to_tensor=True),
    dict(convert_to_numpy=False),
    dict(convert_to_tensor=True, normalize_embeddings=True),
    dict(truncate_dim=16),
    dict(truncate_dim=16, normalize_embeddings=True, convert_to_tensor=True),
    dict(truncate_dim=1000),
    dict(prompt="query: "),
    dict(prompt=""),
    dict(precision="float32"),
    dict(precision=None),
    dict(output_value="token_embeddings"),
    dict(output_value="token_embeddings", convert_to_tensor=True, batch_size=2),
    dict(output_value=None, batch_size=3),
    dict(output_value=None, prompt="query: ", truncate_dim=8, batch_size=3),
    dict(device="cpu", chunk_size=4),
]


@pytest.mark.parametrize("inputs", list(INPUTS))
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in
                                                                    o.items()) or "defaults")
def test_minilm_encode_options(st_minilm, compat_minilm, inputs, options):
    both(st_minilm, compat_minilm, INPUTS[inputs], **options)


def test_the_issue_script(st_minilm, minilm):
    """The call of the issue, every option named."""
    kw = dict(batch_size=32, show_progress_bar=False, convert_to_numpy=True,
              convert_to_tensor=False, normalize_embeddings=True, prompt_name=None, prompt=None,
              precision="float32", output_value="sentence_embedding", truncate_dim=None)
    model = SentenceTransformer(minilm, device="cpu")
    emb, want = both(st_minilm, model, TEXTS, **kw)
    assert emb.shape == (len(TEXTS), 384) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1, rtol=1e-6)
    # the old positional name
    np.testing.assert_array_equal(model.encode(sentences=TEXTS), model.encode(TEXTS))


def test_bitwise_whatever_the_batch(compat_minilm):
    texts = TEXTS + [f"sentence {i} " * (i % 5 + 1) for i in range(20)]
    ref = compat_minilm.encode(texts)
    for bs in (1, 7, 100):
        np.testing.assert_array_equal(compat_minilm.encode(texts, batch_size=bs), ref)
    perm = np.random.default_rng(0).permutation(len(texts))
    np.testing.assert_array_equal(compat_minilm.encode([texts[i] for i in perm]), ref[perm])
    tokens = compat_minilm.encode(texts, output_value="token_embeddings", batch_size=3)
    for got, want in zip(compat_minilm.encode(texts, output_value="token_embeddings",
                                              batch_size=32), tokens):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


# -- precision ----------------------------------------------------------------------------------

PRECISIONS = ["int8", "uint8", "binary", "ubinary"]


def quantize_embeddings(*args, **kwargs):
    """sentence-transformers' own (its home since 6.0, else the old one)."""
    try:
        from sentence_transformers.util.quantization import quantize_embeddings as theirs
    except ImportError:
        from sentence_transformers.quantization import quantize_embeddings as theirs
    return theirs(*args, **kwargs)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_quantize_embeddings_equals_theirs_bit_for_bit(precision, rng):
    x = rng.standard_normal((50, 37)).astype(np.float32)
    x[3] = 0
    x[:, 5] = 0.25                           # a constant dimension: step 0 -> 1
    cal = rng.standard_normal((80, 37)).astype(np.float32)
    for kw in ({}, {"calibration_embeddings": cal},
               {"ranges": np.vstack([cal.min(0), cal.max(0)])}):
        want = quantize_embeddings(x, precision, **kw)
        got = compat.quantize_embeddings(x, precision, **kw)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    # token embeddings: one calibration over every matrix
    mats = [x[:7], x[7:30], x[30:]]
    want = quantize_embeddings(mats, precision)
    got = compat.quantize_embeddings(mats, precision)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("convert", [{}, {"convert_to_tensor": True},
                                     {"convert_to_numpy": False}])
def test_encode_precision(st_minilm, compat_minilm, precision, convert):
    got = compat_minilm.encode(TEXTS, precision=precision, **convert)
    want = st_minilm.encode(TEXTS, precision=precision, **convert)
    assert type(got) is type(want)
    got_a = np.stack([np.asarray(g) for g in got])
    want_a = np.stack([np.asarray(w) for w in want])
    assert got_a.dtype == want_a.dtype and got_a.shape == want_a.shape
    if isinstance(want, list):
        assert type(got[0]) is type(want[0])
    # the call's own float embeddings, quantized as sentence-transformers quantizes them
    ours_float = compat_minilm.encode(TEXTS)
    np.testing.assert_array_equal(got_a, quantize_embeddings(ours_float, precision))
    # against sentence-transformers' float embeddings: a bucket edge or a sign near zero may
    # fall the other way within float32 rounding
    if precision.endswith("int8"):
        assert np.abs(got_a.astype(int) - want_a.astype(int)).max() <= 1
        assert (got_a == want_a).mean() > 0.98
    else:
        theirs = st_minilm.encode(TEXTS)
        sure = np.abs(theirs) > TOL
        np.testing.assert_array_equal(np.unpackbits(got_a.view(np.uint8), axis=1)[sure],
                                      np.unpackbits(want_a.view(np.uint8), axis=1)[sure])


def test_precision_token_embeddings(st_minilm, compat_minilm):
    got = compat_minilm.encode(TEXTS[:4], output_value="token_embeddings", precision="binary")
    want = st_minilm.encode(TEXTS[:4], output_value="token_embeddings", precision="binary")
    assert type(got) is type(want) and type(got[0]) is type(want[0])
    floats = [t.numpy() for t in compat_minilm.encode(TEXTS[:4], output_value="token_embeddings")]
    for g, w, q in zip(got, want, quantize_embeddings(floats, "binary")):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, q)


def test_precision_errors(st_minilm, compat_minilm):
    for model in (st_minilm, compat_minilm):
        with pytest.raises(ValueError, match="single embedding"):
            model.encode(TEXTS[0], precision="int8")
        with pytest.raises(ValueError, match="'int4' is not supported"):
            model.encode(TEXTS, precision="int4")
    with pytest.raises(ValueError, match="output_value=None"):
        compat_minilm.encode(TEXTS, precision="binary", output_value=None)


# -- the Dense folders --------------------------------------------------------------------------

@pytest.mark.parametrize("case", list(CASES))
def test_dense_folders(dense_folders, case):
    folder = dense_folders[case]
    ref = st.SentenceTransformer(folder, device="cpu")
    ours = SentenceTransformer(folder)
    assert ours.get_embedding_dimension() == ref.get_embedding_dimension()
    assert ours.get_sentence_embedding_dimension() == ref.get_embedding_dimension()
    assert ours.prompts == ref.prompts
    assert ours.default_prompt_name == ref.default_prompt_name
    assert ours.truncate_dim == ref.truncate_dim
    assert ours.max_seq_length == ref.max_seq_length
    for kw in ({}, {"normalize_embeddings": True}, {"truncate_dim": 5},
               {"truncate_dim": 5, "normalize_embeddings": True}, {"prompt": "passage: "},
               {"prompt_name": "document"}, {"convert_to_tensor": True},
               {"output_value": "token_embeddings"}, {"output_value": None, "batch_size": 4}):
        both(ref, ours, SENTENCES, **kw)
        both(ref, ours, SENTENCES[0], **kw)
    both(ref, ours, SENTENCES, precision="ubinary")
    assert_same(ours.encode_query(SENTENCES), ref.encode_query(SENTENCES))
    assert_same(ours.encode_document(SENTENCES), ref.encode_document(SENTENCES))


def test_dense_truncate_dim_beyond_the_folders(dense_folders):
    """The folder's truncate_dim (10) is the model's default; a call or the attribute may ask
    for more, or for none, as in sentence-transformers."""
    folder = dense_folders["truncated"]
    ref = st.SentenceTransformer(folder, device="cpu")
    ours = SentenceTransformer(folder)
    assert ours.truncate_dim == ref.truncate_dim == 10
    for kw in ({}, {"truncate_dim": 20}, {"truncate_dim": 3, "normalize_embeddings": True}):
        both(ref, ours, SENTENCES, **kw)
    for model in (ref, ours):
        model.truncate_dim = None
    assert ours.get_embedding_dimension() == ref.get_embedding_dimension() == 24
    both(ref, ours, SENTENCES)
    with ref.truncate_embeddings(7), ours.truncate_embeddings(7):
        assert ours.get_embedding_dimension() == ref.get_embedding_dimension() == 7
        both(ref, ours, SENTENCES)
    assert ours.truncate_dim is None
    mini = SentenceTransformer(folder, truncate_dim=4)
    assert mini.get_embedding_dimension() == 4
    assert_same(mini.encode(SENTENCES),
                st.SentenceTransformer(folder, device="cpu", truncate_dim=4).encode(SENTENCES))


# -- prompts ------------------------------------------------------------------------------------

def test_prompts(minilm):
    prompts = {"query": "query: ", "passage": "passage: ", "classify": "Classify: "}
    ref = st.SentenceTransformer(minilm, device="cpu", prompts=prompts,
                                 default_prompt_name="classify")
    ours = SentenceTransformer(minilm, prompts=prompts, default_prompt_name="classify")
    assert ours.prompts == ref.prompts and ours.default_prompt_name == "classify"
    texts = TEXTS[:4]
    for kw in ({}, {"prompt_name": "query"}, {"prompt_name": "document"}, {"prompt": ""},
               {"prompt": "x: "}):
        both(ref, ours, texts, **kw)
    for method in ("encode_query", "encode_document"):
        for kw in ({}, {"prompt": "q: "}, {"prompt_name": "classify"}):
            assert_same(getattr(ours, method)(texts, **kw), getattr(ref, method)(texts, **kw))
    # a prompt is the text put before each input
    np.testing.assert_array_equal(ours.encode(texts, prompt_name="query"),
                                  ours.encode(["query: " + t for t in texts], prompt=""))
    with pytest.raises(ValueError, match="'nope'"):
        ours.encode(texts, prompt_name="nope")
    with pytest.raises(ValueError, match="default_prompt_name='nope'"):
        SentenceTransformer(minilm, prompts=prompts, default_prompt_name="nope")


def test_prompt_and_prompt_name_warns(compat_minilm, caplog):
    compat_minilm.prompts = {"query": "query: ", "document": ""}
    with caplog.at_level(logging.WARNING):
        got = compat_minilm.encode(TEXTS[:2], prompt="query: ", prompt_name="document")
    assert len(caplog.records) == 1 and "prompt_name='document' is ignored" in caplog.text
    np.testing.assert_array_equal(got, compat_minilm.encode(TEXTS[:2], prompt_name="query"))


def test_folder_prompts_and_similarity_fn_name(dense_folders, tmp_path):
    """config_sentence_transformers.json as sentence-transformers saved it: its prompts, default
    prompt, similarity_fn_name; the constructor's values first."""
    ref = st.SentenceTransformer(dense_folders["gelu"], device="cpu",
                                 prompts={"query": "q: ", "doc": "d: "},
                                 default_prompt_name="doc", similarity_fn_name="manhattan")
    ref.save(str(tmp_path / "saved"))
    for kw in ({}, {"prompts": {"doc": "D: ", "x": "x: "}, "similarity_fn_name": "dot"},
               {"default_prompt_name": "query"}):
        theirs = st.SentenceTransformer(str(tmp_path / "saved"), device="cpu", **kw)
        ours = SentenceTransformer(str(tmp_path / "saved"), **kw)
        assert ours.prompts == theirs.prompts
        assert ours.default_prompt_name == theirs.default_prompt_name
        assert ours.similarity_fn_name == theirs.similarity_fn_name
        emb = both(theirs, ours, SENTENCES)[0]
        assert_same(ours.similarity(emb, emb), theirs.similarity(emb, emb))


# -- attributes ---------------------------------------------------------------------------------

def test_max_seq_length(st_minilm, compat_minilm, minilm):
    assert compat_minilm.max_seq_length == st_minilm.max_seq_length == 256
    assert compat_minilm.get_max_seq_length() == 256
    ref = st.SentenceTransformer(minilm, device="cpu")
    for n in (8, 300):
        ref.max_seq_length = n
        compat_minilm.max_seq_length = n
        assert compat_minilm.max_seq_length == n
        both(ref, compat_minilm, TEXTS)
        both(ref, compat_minilm, TEXTS, output_value="token_embeddings")
        assert max(len(t) for t in compat_minilm.encode(TEXTS,
                                                        output_value="token_embeddings")) == n
    for bad, err in ((0, ValueError), (513, ValueError), (None, TypeError), (8.0, TypeError)):
        with pytest.raises(err, match="max_seq_length"):
            compat_minilm.max_seq_length = bad


def test_attributes(st_minilm, compat_minilm):
    assert compat_minilm.get_sentence_embedding_dimension() == 384
    assert compat_minilm.get_embedding_dimension() == st_minilm.get_embedding_dimension()
    assert compat_minilm.device == st_minilm.device == torch.device("cpu")
    assert compat_minilm.similarity_fn_name == st_minilm.similarity_fn_name == "cosine"
    assert compat_minilm.prompts == st_minilm.prompts == {"query": "", "document": ""}
    assert compat_minilm.default_prompt_name is None
    assert compat_minilm.truncate_dim is None
    assert compat_minilm.to("cpu") is compat_minilm and compat_minilm.eval() is compat_minilm
    assert compat_minilm.tokenizer.encode([TEXTS[0]])[0] == \
        st_minilm.tokenizer(TEXTS[0])["input_ids"]
    assert_same(compat_minilm.tokenize(TEXTS), {k: v for k, v in
                                                st_minilm.tokenize(TEXTS).items()})
    for x in ("a", ["a"], ("a",), np.array(["a"])):
        assert compat_minilm.is_singular_input(x) == st_minilm.is_singular_input(x)
    assert compat_minilm.get_model_kwargs() == st_minilm.get_model_kwargs() == []


@pytest.mark.parametrize("name", compat.SIMILARITY_FN_NAMES)
def test_similarity(st_minilm, compat_minilm, name):
    ref = st_minilm
    before = ref.similarity_fn_name
    try:
        ref.similarity_fn_name = compat_minilm.similarity_fn_name = name
        a = compat_minilm.encode(TEXTS)
        b = compat_minilm.encode(TEXTS[:3], normalize_embeddings=True)
        for x, y in ((a, b), (a, a), (a[0], b), (torch.from_numpy(a), list(b)),
                     (a.astype(np.float64), b.astype(np.float64))):
            assert_same(compat_minilm.similarity(x, y), ref.similarity(x, y))
        for x, y in ((a[:3], b), (a[::2], a[1::2]), (a[0], b[1])):
            assert_same(compat_minilm.similarity_pairwise(x, y), ref.similarity_pairwise(x, y))
    finally:
        ref.similarity_fn_name = before


def test_similarity_fn_name_choices(minilm, compat_minilm):
    from sentence_transformers import SimilarityFunction
    assert SentenceTransformer(minilm, similarity_fn_name="dot").similarity_fn_name == "dot"
    compat_minilm.similarity_fn_name = SimilarityFunction.EUCLIDEAN
    assert compat_minilm.similarity_fn_name == "euclidean"
    with pytest.raises(ValueError, match="similarity_fn_name='maxsim'"):
        compat_minilm.similarity_fn_name = "maxsim"
    with pytest.raises(TypeError, match="float embeddings"):
        compat_minilm.similarity(compat_minilm.encode(TEXTS, precision="binary"),
                                 compat_minilm.encode(TEXTS, precision="binary"))


def test_hub_name_from_the_cache(minilm, tmp_path, monkeypatch):
    """A hub name loads its snapshot already in the Hugging Face cache (a bare name under
    sentence-transformers/, as sentence-transformers looks it up); nothing is downloaded."""
    repo = tmp_path / "models--sentence-transformers--all-MiniLM-L6-v2"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots").mkdir()
    os.symlink(minilm, repo / "snapshots" / "abc123")
    want = SentenceTransformer(minilm).encode(TEXTS)
    for name in ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
        model = SentenceTransformer(name, cache_folder=str(tmp_path))
        np.testing.assert_array_equal(model.encode(TEXTS), want)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("SENTENCE_TRANSFORMERS_HOME", raising=False)
    np.testing.assert_array_equal(SentenceTransformer("all-MiniLM-L6-v2").encode(TEXTS), want)
    np.testing.assert_array_equal(
        SentenceTransformer("all-MiniLM-L6-v2", revision="abc123").encode(TEXTS), want)
    with pytest.raises(ValueError, match="downloads nothing"):
        SentenceTransformer("all-MiniLM-L6-v2", revision="other")
    with pytest.raises(ValueError, match="downloads nothing"):
        SentenceTransformer("sentence-transformers/all-mpnet-base-v2")


# -- refused ------------------------------------------------------------------------------------

def _remote_code_copy(minilm, tmp_path):
    folder = tmp_path / "remote"
    folder.mkdir()
    for f in os.listdir(minilm):
        if f != "config.json":
            os.symlink(os.path.join(minilm, f), folder / f)
    with open(os.path.join(minilm, "config.json")) as f:
        cfg = json.load(f)
    cfg["auto_map"] = {"AutoModel": "modeling_custom.CustomBert"}
    (folder / "config.json").write_text(json.dumps(cfg))
    return str(folder)


@pytest.mark.parametrize("kwargs, match", [
    ({"device": "cuda"}, "device='cuda'"),
    ({"device": "mps"}, "device='mps'"),
    ({"modules": []}, "modules="),
    ({"backend": "onnx"}, "backend='onnx'"),
    ({"model_kwargs": {"torch_dtype": "float16"}}, "model_kwargs="),
    ({"processor_kwargs": {"do_lower_case": True}}, "processor_kwargs="),
    ({"tokenizer_kwargs": {"do_lower_case": True}}, "tokenizer_kwargs="),
    ({"config_kwargs": {"hidden_dropout_prob": 0.2}}, "config_kwargs="),
    ({"use_kernels": True}, "use_kernels"),
    ({"truncate_dim": 0}, "truncate_dim"),
    ({"similarity_fn_name": "cos"}, "similarity_fn_name='cos'"),
    ({"quantize": "int4"}, "quantize"),
])
def test_constructor_refusals(minilm, kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        SentenceTransformer(minilm, **kwargs)


def test_constructor_accepts_what_changes_nothing(minilm, tmp_path):
    want = SentenceTransformer(minilm).encode(TEXTS[:2])
    model = SentenceTransformer(minilm, device=torch.device("cpu"), trust_remote_code=True,
                                local_files_only=True, token="x", revision="main",
                                cache_folder=str(tmp_path), model_kwargs={}, backend="torch")
    np.testing.assert_array_equal(model.encode(TEXTS[:2]), want)
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        SentenceTransformer(_remote_code_copy(minilm, tmp_path), trust_remote_code=True)
    with pytest.raises(ValueError, match="model_name_or_path"):
        SentenceTransformer()
    with pytest.raises(ValueError, match="is a file"):
        SentenceTransformer(os.path.join(minilm, "config.json"))
    with pytest.raises(ValueError, match="downloads nothing"):
        SentenceTransformer("certainly-not-cached-model", cache_folder=str(tmp_path))
    q = SentenceTransformer(minilm, quantize="int8", n_threads=1)
    assert q.encoder.quantize == "int8" and q.encoder.n_threads == 1


@pytest.mark.parametrize("kwargs, err, match", [
    ({"device": "cuda"}, ValueError, "device='cuda'"),
    ({"device": ["cpu", "cpu"]}, ValueError, "multi-process"),
    ({"pool": {"processes": []}}, ValueError, "pool="),
    ({"processing_kwargs": {"text": {"max_length": 8}}}, ValueError, "processing_kwargs"),
    ({"normalize": True}, ValueError, "normalize"),
    ({"output_value": "input_ids"}, ValueError, "output_value='input_ids'"),
    ({"batch_size": 0}, ValueError, "batch_size"),
    ({"truncate_dim": -1}, ValueError, "truncate_dim"),
    ({"prompt": 3}, TypeError, "prompt"),
])
def test_encode_refusals(compat_minilm, kwargs, err, match):
    with pytest.raises(err, match=match):
        compat_minilm.encode(TEXTS, **kwargs)


def test_inputs_refused(compat_minilm):
    with pytest.raises(TypeError, match="sentence pairs"):
        compat_minilm.encode([("a question", "an answer")])
    with pytest.raises(TypeError, match=r"inputs\[1\] must be a str"):
        compat_minilm.encode(["a", {"text": "b"}])
    with pytest.raises(TypeError, match="inputs must be a str"):
        compat_minilm.encode(iter(["a"]))
    with pytest.raises(AttributeError, match="'fit'.*training"):
        compat_minilm.fit
    with pytest.raises(AttributeError, match="start_multi_process_pool"):
        compat_minilm.start_multi_process_pool()


def test_without_torch(compat_minilm, monkeypatch):
    """torch is not needed: what sentence-transformers gives as tensors unasked comes as NumPy
    arrays, and convert_to_tensor=True says it needs torch."""
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ValueError, match="convert_to_tensor=True.*torch is not installed"):
        compat_minilm.encode(TEXTS, convert_to_tensor=True)
    emb = compat_minilm.encode(TEXTS)
    rows = compat_minilm.encode(TEXTS, convert_to_numpy=False)
    assert isinstance(rows, list) and all(isinstance(r, np.ndarray) for r in rows)
    np.testing.assert_array_equal(np.stack(rows), emb)
    tokens = compat_minilm.encode(TEXTS[0], output_value="token_embeddings")
    assert isinstance(tokens, np.ndarray) and tokens.shape[1] == 384
    features = compat_minilm.encode(TEXTS[:2], output_value=None)
    assert isinstance(features[0]["input_ids"], np.ndarray)
    sim = compat_minilm.similarity(emb, emb)
    assert isinstance(sim, np.ndarray) and sim.shape == (len(TEXTS), len(TEXTS))
    np.testing.assert_allclose(np.diag(sim), 1, rtol=1e-6)
    assert compat_minilm.device == "cpu"


def test_the_one_implementation_underneath(dense_folders):
    """The compat class adds nothing to the vectors: they are SentenceEncoder.encode's and
    EncoderModel.embed's, with the per-call prompt and truncate_dim those now take."""
    folder = dense_folders["truncated"]
    ours = SentenceTransformer(folder)
    enc = ours.encoder
    np.testing.assert_array_equal(ours.encode(SENTENCES), enc.encode(SENTENCES))
    for keep in (None, 3, 20):
        ours.truncate_dim = keep                  # the model's, as the attribute sets it
        want = enc.encode(SENTENCES, prompt="x: ", truncate_dim=keep)
        np.testing.assert_array_equal(ours.encode(SENTENCES, prompt="x: "), want)
        assert want.shape[1] == enc.model.output_dim(keep) == min(keep or 24, 24)
    assert enc.encode([], truncate_dim=None).shape == (0, 24)
    ids, types = enc.tokenize(SENTENCES[:3], "")
    n = max(map(len, ids))
    batch = np.array([r + [0] * (n - len(r)) for r in ids])
    mask = batch != 0
    full = enc.model.embed(batch, mask, truncate_dim=None)
    assert full.shape == (3, 24)
    np.testing.assert_array_equal(enc.model.embed(batch, mask, truncate_dim=5), full[:, :5])
    np.testing.assert_array_equal(enc.model.embed(batch, mask), full[:, :10])
    for bad, err in (("all", TypeError), (0, ValueError), (True, TypeError), (2.0, TypeError)):
        with pytest.raises(err, match="truncate_dim"):
            enc.model.embed(batch, mask, truncate_dim=bad)
    with pytest.raises(TypeError, match="prompt"):
        enc.encode(SENTENCES, prompt=b"x")
    tokens = enc.token_embeddings(SENTENCES, batch_size=3, prompt="")
    hidden = enc.model(batch, mask)
    for i in range(3):
        np.testing.assert_array_equal(tokens[i], hidden[i, :len(ids[i])])
