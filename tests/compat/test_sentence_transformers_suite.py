"""sentence-transformers' own public encode tests, pointed at fastattn.compat.sentence_transformers.

Ported (written here, their assertions kept) from UKPLab/sentence-transformers' tests/
test_compute_embeddings.py and tests/test_sentence_transformer.py (the 5.2 tree; the 6.x sdist
ships no tests), with the real all-MiniLM-L6-v2 folder in place of the hub models they download
(stsb-bert-tiny, paraphrase-distilroberta-base-v1); where a test checks a number of its model,
the number is sentence-transformers' own on all-MiniLM-L6-v2 (measured with
sentence-transformers 6.3), with their tolerance.

Ported and passing:
  test_compute_embeddings: test_encode_token_embeddings, test_encode_single_sentences,
    test_encode_normalize; test_encode_tuple_sentences as a refusal (sentence pairs are not
    supported: a TypeError naming them).
  test_sentence_transformer: test_load_local_without_normalize_directory (all-MiniLM-L6-v2's
    modules.json lists a 2_Normalize folder it does not ship), test_prompts, test_save_load_prompts
    (the config written as sentence-transformers saves it), test_prompt_output_value_None (the key
    set of sentence-transformers 6, which adds "modality"), test_encode_quantization,
    test_encode_truncate, test_similarity_score (cosine, dot, euclidean, manhattan),
    test_similarity_score_save (the saved config loaded), test_empty_encode, test_encode_query,
    test_encode_document, test_encode_document_prompt_priority, test_encode_advanced_parameters,
    test_encode_query_document_vs_encode, test_get_model_kwargs (its first part),
    test_encode_with_dataset_column (on a datasets Column where the datasets package is
    installed, else on a stand-in Column, a lazy sequence, put in its place).
  As refusals (fastattn cannot honour them; each a ValueError naming the option): test_to and
    test_encode_fp16 (CUDA), test_torch_dtype / test_load_with_torch_dtype /
    test_load_with_model_kwargs (model_kwargs), tests/test_multi_process.py (pool=, a list of
    devices, start_multi_process_pool).

Skipped: none.

Not ported, and why:
  test_load_with_safetensors, test_load_with_revision: download hub models.
  test_push_to_hub, test_safe_serialization, test_model_card_save_update_model_id,
    test_override_config_versions, test_safetensors: saving, model cards and the hub (not in the
    compat layer).
  test_prompt_length_calculation: rewrites a transformers tokenizer's post-processor and sets
    the Pooling's include_prompt=False, which fastattn refuses at load.
  test_get_model_kwargs' second half: patches forward_kwargs of torch modules and builds a
    Router (a Router folder is refused at load).
  test_load_checkpoint_with_peft_and_lora, test_multiple_adapters, test_load_adapter_with_revision
    (PEFT), test_clip (images): not supported.
"""
import json
import logging
import os
import re
import sys
import types
from collections.abc import Sequence
from contextlib import nullcontext
from unittest.mock import patch

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fastattn.compat.sentence_transformers import SentenceTransformer  # noqa: E402

DIM = 384
# sentence-transformers 6.3's np.sum of its all-MiniLM-L6-v2 embeddings of these texts
SUM_ONE = 0.1978164
SUM_THREE = 0.4667342
THREE = ["Hello Word, a test sentence", "Here comes another sentence", "My final sentence"]


@pytest.fixture
def model(minilm):
    return SentenceTransformer(minilm)


def _copy_with(minilm, folder, **files):
    """A copy of the folder (links to its files) with `files` (name -> JSON) written over."""
    os.makedirs(folder)
    for f in os.listdir(minilm):
        if f not in files:
            os.symlink(os.path.join(minilm, f), os.path.join(folder, f))
    for name, content in files.items():
        with open(os.path.join(folder, name), "w") as f:
            json.dump(content, f)
    return str(folder)


# -- tests/test_compute_embeddings.py -----------------------------------------------------------

def test_encode_token_embeddings(model):
    sent = ["Hello Word, a test sentence", "Here comes another sentence", "My final sentence",
            "Sentences", "Sentence five five five five five five five"]
    emb = model.encode(sent, output_value="token_embeddings", batch_size=2)
    assert len(emb) == len(sent)
    for s, e in zip(sent, emb):
        assert len(model.tokenize([s])["input_ids"][0]) == e.shape[0]


def test_encode_single_sentences(model):
    emb = model.encode("Hello Word, a test sentence")
    assert emb.shape == (DIM,)
    assert abs(np.sum(emb) - SUM_ONE) < 0.002
    emb = model.encode(["Hello Word, a test sentence"])
    assert emb.shape == (1, DIM)
    assert abs(np.sum(emb) - SUM_ONE) < 0.002
    emb = model.encode(THREE)
    assert emb.shape == (3, DIM)
    assert abs(np.sum(emb) - SUM_THREE) < 0.007


def test_encode_normalize(model):
    emb = model.encode(THREE, normalize_embeddings=True)
    assert emb.shape == (3, DIM)
    for norm in np.linalg.norm(emb, axis=1):
        assert abs(norm - 1) < 0.001


def test_encode_tuple_sentences_refused(model):
    with pytest.raises(TypeError, match="sentence pairs"):
        model.encode([("Hello Word, a test sentence", "Second input for model")])


# -- tests/test_sentence_transformer.py ---------------------------------------------------------

def test_load_local_without_normalize_directory(minilm):
    with open(os.path.join(minilm, "modules.json")) as f:
        assert any(m["path"] == "2_Normalize" for m in json.load(f))
    assert not os.path.exists(os.path.join(minilm, "2_Normalize"))
    assert isinstance(SentenceTransformer(minilm), SentenceTransformer)


def test_prompts(model, caplog):
    assert model.prompts == {"query": "", "document": ""}
    assert model.default_prompt_name is None
    texts = ["How to bake a chocolate cake", "Symptoms of the flu"]
    no_prompt_embedding = model.encode(texts)
    prompt_embedding = model.encode([f"query: {text}" for text in texts])
    assert not np.array_equal(no_prompt_embedding, prompt_embedding)
    for query in ["query: ", "query:", "query:   "]:
        model.prompts = {"query": "", "document": ""}
        assert np.array_equal(model.encode(texts, prompt=query), prompt_embedding)
        model.prompts = {"query": query, "document": ""}
        assert np.array_equal(model.encode(texts, prompt_name="query"), prompt_embedding)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert np.array_equal(model.encode(texts, prompt=query, prompt_name="query"),
                                  prompt_embedding)
            assert len(caplog.record_tuples) == 1
            assert "prompt_name='query' is ignored" in caplog.record_tuples[0][2]
        with pytest.raises(ValueError, match=re.escape("prompt_name='invalid_prompt_name' is "
                                                       "not among the prompts ['query', "
                                                       "'document']")):
            model.encode(texts, prompt_name="invalid_prompt_name")


def test_save_load_prompts(minilm, tmp_path):
    with pytest.raises(ValueError, match=re.escape("default_prompt_name='invalid_prompt_name' "
                                                   "is not among the prompts ['query', "
                                                   "'document']")):
        SentenceTransformer(minilm, prompts={"query": "query: "},
                            default_prompt_name="invalid_prompt_name")
    model = SentenceTransformer(minilm, prompts={"query": "query: "}, default_prompt_name="query")
    assert model.prompts == {"query": "query: ", "document": ""}
    assert model.default_prompt_name == "query"
    # what sentence-transformers' save writes for this model
    saved = _copy_with(minilm, tmp_path / "saved", **{"config_sentence_transformers.json": {
        "prompts": {"query": "query: ", "document": ""}, "default_prompt_name": "query",
        "similarity_fn_name": "cosine", "model_type": "SentenceTransformer"}})
    fresh_model = SentenceTransformer(saved)
    assert fresh_model.prompts == {"query": "query: ", "document": ""}
    assert fresh_model.default_prompt_name == "query"
    np.testing.assert_array_equal(fresh_model.encode(THREE), model.encode(THREE))


def test_prompt_output_value_None(model):
    outputs = model.encode(["Text one", "Text two"], prompt="query: ", output_value=None)
    assert len(outputs) == 2
    assert isinstance(outputs, list)
    expected_keys = {"input_ids", "token_type_ids", "attention_mask", "sentence_embedding",
                     "token_embeddings", "prompt_length", "modality"}
    assert set(outputs[0].keys()) == expected_keys
    assert set(outputs[1].keys()) == expected_keys


@pytest.mark.parametrize("convert_to_tensor", [True, False])
@pytest.mark.parametrize("convert_to_numpy", [True, False])
@pytest.mark.parametrize(("precision", "expected_torch_dtype", "expected_numpy_dtype", "raises"), [
    (None, torch.float32, np.float32, False),
    ("float32", torch.float32, np.float32, False),
    ("int8", torch.int8, np.int8, False),
    ("uint8", torch.uint8, np.uint8, False),
    ("binary", torch.int8, np.int8, False),
    ("ubinary", torch.uint8, np.uint8, False),
    ("error", None, None, True),
])
def test_encode_quantization(model, convert_to_tensor, convert_to_numpy, precision,
                             expected_torch_dtype, expected_numpy_dtype, raises):
    with pytest.raises(ValueError, match=f"'{precision}' is not supported") if raises \
            else nullcontext():
        embeddings = model.encode(["One sentence", "Another sentence"],
                                  convert_to_tensor=convert_to_tensor,
                                  convert_to_numpy=convert_to_numpy, precision=precision)
    if not raises:
        if convert_to_tensor:
            assert embeddings[0].dtype == expected_torch_dtype
            assert isinstance(embeddings, torch.Tensor)
        elif convert_to_numpy:
            assert embeddings[0].dtype == expected_numpy_dtype
            assert isinstance(embeddings, np.ndarray)
        else:
            assert embeddings[0].dtype == expected_torch_dtype
            assert isinstance(embeddings, list)


@pytest.mark.parametrize("sentences", ("Single sentence", ["One sentence", "Another sentence"]))
@pytest.mark.parametrize("convert_to_tensor", [True, False])
@pytest.mark.parametrize("convert_to_numpy", [True, False])
@pytest.mark.parametrize("normalize_embeddings", [True, False])
@pytest.mark.parametrize("output_value", ["sentence_embedding", None])
def test_encode_truncate(model, minilm, sentences, convert_to_tensor, convert_to_numpy,
                         normalize_embeddings, output_value):
    full = model.encode(sentences, convert_to_numpy=False, convert_to_tensor=True)

    def check(model, expected_dim):
        outputs = model.encode(sentences, output_value=output_value,
                               convert_to_tensor=convert_to_tensor,
                               convert_to_numpy=convert_to_numpy,
                               normalize_embeddings=normalize_embeddings)
        if output_value is None:
            embeddings = outputs["sentence_embedding"] if not isinstance(outputs, list) else \
                [out["sentence_embedding"] for out in outputs]
        else:
            embeddings = outputs
        if isinstance(embeddings, list):
            shape = (len(embeddings), embeddings[0].shape[-1])
        else:
            shape = embeddings.shape
        expected_shape = (expected_dim,) if isinstance(sentences, str) else \
            (len(sentences), expected_dim)
        assert shape == expected_shape
        assert model.get_sentence_embedding_dimension() == expected_dim
        if isinstance(embeddings, list):
            embeddings = torch.stack(embeddings)
        elif isinstance(embeddings, np.ndarray):
            embeddings = torch.from_numpy(embeddings)
        truncated = full[..., :expected_dim]
        if normalize_embeddings and output_value is not None:
            assert torch.allclose(embeddings,
                                  torch.nn.functional.normalize(truncated, p=2, dim=-1))
        elif not normalize_embeddings:
            assert torch.allclose(embeddings, truncated)

    original_output_dim = model.get_sentence_embedding_dimension()
    check(model, expected_dim=original_output_dim)
    truncate_dim = int(original_output_dim / 4)
    model = SentenceTransformer(minilm, truncate_dim=truncate_dim)
    check(model, expected_dim=truncate_dim)
    model.truncate_dim = 2 * truncate_dim
    check(model, expected_dim=2 * truncate_dim)
    final_truncate_dim = int(original_output_dim / 8)
    with model.truncate_sentence_embeddings(final_truncate_dim):
        check(model, expected_dim=final_truncate_dim)
    check(model, expected_dim=2 * truncate_dim)
    model.truncate_dim = 2 * original_output_dim
    check(model, expected_dim=original_output_dim)


@pytest.mark.parametrize("similarity_fn_name", ["cosine", "dot", "euclidean", "manhattan"])
def test_similarity_score(model, similarity_fn_name):
    model.similarity_fn_name = similarity_fn_name
    sentences = ["The weather is so nice!", "It's so sunny outside.",
                 "He's driving to the movie theater.", "She's going to the cinema."]
    embeddings = model.encode(sentences, normalize_embeddings=True)
    scores = model.similarity(embeddings, embeddings)
    assert scores.shape == (len(sentences), len(sentences))
    expected = np.ones(4) if similarity_fn_name in ("cosine", "dot") else np.zeros(4)
    np.testing.assert_almost_equal(np.diag(scores), expected, decimal=4)
    assert scores[1][0] > scores[2][0]
    assert scores[1][0] > scores[3][0]
    assert scores[2][3] > scores[2][0]
    assert scores[2][3] > scores[2][1]
    pairwise_scores = model.similarity_pairwise(embeddings[::2], embeddings[1::2])
    assert pairwise_scores.shape == (len(sentences) // 2,)
    if similarity_fn_name in ("cosine", "dot"):
        assert (pairwise_scores > 0.5).all()


def test_similarity_score_save(model, minilm, tmp_path):
    embeddings = model.encode(["Sentence 1", "Sentence 2"])
    assert model.similarity_fn_name == "cosine"
    cosine_scores = model.similarity(embeddings, embeddings)
    assert model.similarity_fn_name == "cosine"
    model.similarity_fn_name = "euclidean"
    saved = _copy_with(minilm, tmp_path / "saved", **{"config_sentence_transformers.json": {
        "prompts": {"query": "", "document": ""}, "default_prompt_name": None,
        "similarity_fn_name": "euclidean", "model_type": "SentenceTransformer"}})
    loaded_model = SentenceTransformer(saved)
    assert loaded_model.similarity_fn_name == "euclidean"
    dot_scores = model.similarity(embeddings, embeddings)
    assert np.not_equal(cosine_scores, dot_scores).all()


@pytest.mark.parametrize("convert_to_tensor", [True, False])
@pytest.mark.parametrize("convert_to_numpy", [True, False])
@pytest.mark.parametrize("normalize_embeddings", [True, False])
@pytest.mark.parametrize("precision", [None, "float32", "int8", "uint8", "binary", "ubinary"])
@pytest.mark.parametrize("truncate_dim", [None, 64, 128])
def test_empty_encode(model, convert_to_tensor, convert_to_numpy, normalize_embeddings,
                      precision, truncate_dim):
    embeddings = model.encode([], convert_to_tensor=convert_to_tensor,
                              convert_to_numpy=convert_to_numpy,
                              normalize_embeddings=normalize_embeddings, precision=precision,
                              truncate_dim=truncate_dim)
    if convert_to_tensor:
        assert isinstance(embeddings, torch.Tensor)
        assert embeddings.numel() == 0
        assert embeddings.device == model.device
    elif convert_to_numpy:
        assert isinstance(embeddings, np.ndarray)
        assert embeddings.size == 0
    else:
        assert embeddings == []


def _mocked_call(model, method, **kwargs):
    with patch.object(model, "encode", autospec=True) as mock_encode:
        getattr(model, method)(**kwargs)
        mock_encode.assert_called_once()
        return mock_encode.call_args[1]


@pytest.mark.parametrize("sentences", ["Hello world", ["Hello world", "This is a test"], [],
                                       [""]])
@pytest.mark.parametrize("prompt_name", [None, "query", "custom"])
@pytest.mark.parametrize("prompt", [None, "Custom prompt: "])
@pytest.mark.parametrize("convert_to_numpy", [True, False])
@pytest.mark.parametrize("convert_to_tensor", [True, False])
def test_encode_query(model, sentences, prompt_name, prompt, convert_to_numpy,
                      convert_to_tensor):
    model.prompts = {"query": "query: ", "custom": "custom: "}
    kwargs = _mocked_call(model, "encode_query", sentences=sentences, prompt_name=prompt_name,
                          prompt=prompt, batch_size=32, convert_to_numpy=convert_to_numpy,
                          convert_to_tensor=convert_to_tensor)
    expected = prompt_name or (None if prompt is not None else "query")
    assert kwargs["inputs"] == sentences        # sentence-transformers 6 names it inputs
    assert kwargs["prompt"] == prompt
    assert kwargs["prompt_name"] == expected
    assert kwargs["convert_to_numpy"] == convert_to_numpy
    assert kwargs["convert_to_tensor"] == convert_to_tensor
    assert kwargs["task"] == "query"


@pytest.mark.parametrize("sentences", ["Hello world", ["Hello world", "This is a test"], [],
                                       [""]])
@pytest.mark.parametrize("prompt_name", [None, "document", "passage", "corpus", "custom"])
@pytest.mark.parametrize("prompt", [None, "Custom prompt: "])
@pytest.mark.parametrize("convert_to_numpy", [True, False])
@pytest.mark.parametrize("convert_to_tensor", [True, False])
def test_encode_document(model, sentences, prompt_name, prompt, convert_to_numpy,
                         convert_to_tensor):
    model.prompts = {"document": "document: ", "passage": "passage: ", "corpus": "corpus: ",
                     "custom": "custom: "}
    kwargs = _mocked_call(model, "encode_document", sentences=sentences,
                          prompt_name=prompt_name, prompt=prompt, batch_size=32,
                          convert_to_numpy=convert_to_numpy, convert_to_tensor=convert_to_tensor)
    expected = prompt_name or (None if prompt is not None else "document")
    assert kwargs["inputs"] == sentences
    assert kwargs["prompt"] == prompt
    assert kwargs["prompt_name"] == expected
    assert kwargs["convert_to_numpy"] == convert_to_numpy
    assert kwargs["convert_to_tensor"] == convert_to_tensor
    assert kwargs["task"] == "document"


def test_encode_document_prompt_priority(model):
    for prompts, expected in (({"document": "document: ", "passage": "passage: ",
                                "corpus": "corpus: "}, "document"),
                              ({"passage": "passage: ", "corpus": "corpus: "}, "passage"),
                              ({"corpus": "corpus: "}, "corpus"),
                              ({"query": "query: "}, None)):
        model.prompts = prompts
        assert _mocked_call(model, "encode_document", inputs="test")["prompt_name"] == expected


def test_encode_advanced_parameters(model):
    kwargs = _mocked_call(model, "encode_query", inputs="test", normalize_embeddings=True,
                          batch_size=64, show_progress_bar=True,
                          output_value="token_embeddings", precision="uint8", truncate_dim=128,
                          chunk_size=10, custom_param="value")
    assert kwargs["normalize_embeddings"] is True
    assert kwargs["batch_size"] == 64
    assert kwargs["show_progress_bar"] is True
    assert kwargs["output_value"] == "token_embeddings"
    assert kwargs["precision"] == "uint8"
    assert kwargs["truncate_dim"] == 128
    assert kwargs["chunk_size"] == 10
    assert kwargs["custom_param"] == "value"


@pytest.mark.parametrize("inputs", ["test sentence", ["test sentence"]])
def test_encode_query_document_vs_encode(model, inputs):
    model.prompts = {"query": "query: ", "document": "document: "}
    query_embeddings = model.encode_query(inputs)
    document_embeddings = model.encode_document(inputs)
    np.testing.assert_allclose(query_embeddings, model.encode(inputs, prompt_name="query"))
    np.testing.assert_allclose(document_embeddings, model.encode(inputs, prompt_name="document"))
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(model.encode(inputs), query_embeddings)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(model.encode(inputs), document_embeddings)


class _Column(Sequence):
    """A stand-in for datasets' Column (a lazy sequence of a table's column) where the datasets
    package is not installed."""

    def __init__(self, values):
        self._values = list(values)

    def __getitem__(self, i):
        return self._values[i]

    def __len__(self):
        return len(self._values)


def test_encode_with_dataset_column(model, monkeypatch):
    texts = ["This is a test.", "Another sentence."]
    try:
        import datasets
        column = datasets.Dataset.from_dict({"text": texts})["text"]
    except ImportError:
        monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(Column=_Column))
        column = _Column(texts)
    embeddings = model.encode(column, convert_to_tensor=True)
    assert embeddings.shape == (2, model.get_sentence_embedding_dimension())
    np.testing.assert_array_equal(embeddings.numpy(), model.encode(texts))


def test_get_model_kwargs(model):
    assert model.get_model_kwargs() == []
    with pytest.raises(ValueError, match=re.escape("keyword arguments this model does not "
                                                   "use: ['normalize']")):
        model.encode("Test sentence", normalize=True)
    model.encode("Test sentence")
    model.encode_query("Test sentence")


# -- refused: what fastattn cannot honour -------------------------------------------------------

def test_to_cuda_refused(model):
    """test_to and test_encode_fp16 move the model to CUDA."""
    assert model.device.type == "cpu"
    with pytest.raises(ValueError, match="device='cuda'"):
        model.to(torch.device("cuda"))
    with pytest.raises(ValueError, match="device='cuda'"):
        SentenceTransformer(model.model_name_or_path, device="cuda")


@pytest.mark.parametrize("torch_dtype", ["auto", "float16", "bfloat16", torch.float16])
def test_torch_dtype_refused(minilm, torch_dtype):
    """test_torch_dtype, test_load_with_torch_dtype, test_load_with_model_kwargs."""
    with pytest.raises(ValueError, match="model_kwargs="):
        SentenceTransformer(minilm, model_kwargs={"torch_dtype": torch_dtype})


def test_multi_process_refused(model):
    """tests/test_multi_process.py: a pool, or a list of devices."""
    with pytest.raises(AttributeError, match="start_multi_process_pool"):
        model.start_multi_process_pool(["cpu", "cpu"])
    with pytest.raises(ValueError, match="pool="):
        model.encode(THREE, pool={"input": None, "output": None, "processes": []})
    with pytest.raises(ValueError, match="multi-process"):
        model.encode(THREE, device=["cpu", "cpu"], chunk_size=1)
