"""fastattn.SentenceEncoder against sentence-transformers' encode on the real all-MiniLM-L6-v2
(within 1e-5, truncation to max_seq_length included), bitwise identical whatever batch_size."""
import os
import shutil

import numpy as np
import pytest

from fastattn.text import SentenceEncoder

SENTENCES = [
    "A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
    "A man is riding a horse.", "A woman is playing violin.", "", "   ", "x",
    "Two men pushed carts through the woods.", "Ünïcödé àccents, café and 中文字符 mixed in.",
    "don't stop-believing, ok?", "[CLS] special [SEP] tokens [MASK] in the text",
    " ".join(["a very long text"] * 120),            # ~ 480 tokens > max_seq_length = 256
    "The quick brown fox jumps over the lazy dog. " * 20,
]


@pytest.fixture(scope="module")
def st_model(minilm):
    st = pytest.importorskip("sentence_transformers")
    pytest.importorskip("torch")
    return st.SentenceTransformer(minilm, device="cpu")


@pytest.fixture(scope="module")
def enc(minilm):
    return SentenceEncoder(minilm)


def test_equal_sentence_transformers(enc, st_model):
    assert enc.max_seq_length == st_model.max_seq_length == 256
    assert len(enc.tokenize([SENTENCES[12]])[0][0]) == 256          # truncated
    got = enc.encode(SENTENCES)
    want = st_model.encode(SENTENCES, batch_size=4)
    assert got.dtype == np.float32 and got.shape == (len(SENTENCES), 384)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    one = enc.encode("A man is eating food.")
    assert one.shape == (384,)
    np.testing.assert_allclose(one, st_model.encode("A man is eating food."), atol=1e-5)


def test_bitwise_identical_across_batch_sizes(enc):
    texts = SENTENCES + [f"sentence number {i} " * (i % 7 + 1) for i in range(40)]
    ref = enc.encode(texts, batch_size=32)
    for bs in (1, 2, 5, 17, 1000):
        assert np.array_equal(enc.encode(texts, batch_size=bs), ref), bs
    # order in, order out; a sentence alone gets its bits
    perm = np.random.default_rng(0).permutation(len(texts))
    assert np.array_equal(enc.encode([texts[i] for i in perm], batch_size=3), ref[perm])
    assert np.array_equal(enc.encode([texts[5]])[0], ref[5])


def test_normalize_override(enc, st_model):
    raw = enc.encode(SENTENCES[:4], normalize=False)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)
    unit = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    np.testing.assert_allclose(unit, st_model.encode(SENTENCES[:4]), atol=1e-5)
    with pytest.raises(TypeError, match="normalize must be True, False or None"):
        enc.encode(["a"], normalize="yes")


def test_plain_model_folder_as_sentence_transformers(minilm, tmp_path):
    """A folder without modules.json: mean pooling, no normalisation (sentence-transformers'
    default module stack for a plain model)."""
    st = pytest.importorskip("sentence_transformers")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=128,
                                  max_position_embeddings=96)
    torch.manual_seed(0)
    transformers.BertModel(cfg, add_pooling_layer=False).save_pretrained(tmp_path)
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(os.path.join(minilm, f), tmp_path)
    ours = SentenceEncoder(str(tmp_path))
    ref = st.SentenceTransformer(str(tmp_path), device="cpu")
    assert ours.max_seq_length == 96 and not ours.normalize
    np.testing.assert_allclose(ours.encode(SENTENCES), ref.encode(SENTENCES), rtol=1e-5,
                               atol=1e-5)


def test_bad_arguments(enc, minilm, tmp_path, marian):
    assert enc.encode([]).shape == (0, 384)
    with pytest.raises(TypeError, match=r"sentences\[1\] must be a str, got int"):
        enc.encode(["a", 3])
    with pytest.raises(TypeError, match="sentences must be a sequence of strings"):
        enc.encode(7)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        enc.encode(["a"], batch_size=0)
    with pytest.raises(ValueError, match="quantize must be None, 'int8' or 'bfloat16', got 'int4'"):
        SentenceEncoder(minilm, quantize="int4")
    with pytest.raises(FileNotFoundError, match="model folder not found"):
        SentenceEncoder(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="model_type='marian' is a translation model: use "
                                         "fastattn.Translator"):
        SentenceEncoder(marian[0])
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ValueError, match="model_type='gpt2' is not an encoder fastattn supports"):
        SentenceEncoder(str(tmp_path))


def test_threads_and_progress(minilm, capsys):
    enc = SentenceEncoder(minilm, n_threads=1)
    a = enc.encode(SENTENCES[:6], progress=True)
    assert "embed" in capsys.readouterr().err
    assert np.array_equal(a, SentenceEncoder(minilm, n_threads=2).encode(SENTENCES[:6]))
