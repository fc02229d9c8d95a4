"""The folders' tokenizers against transformers': Marian's SentencePiece files (models trained
here), tokenizer.json and a BERT vocab.txt (all-MiniLM-L6-v2), id for id and string for string."""
import os
import random
import shutil
import sys

import pytest

pytest.importorskip("sentencepiece")
pytest.importorskip("transformers")

from text_helpers import hf_tokenizer, sentences, write_tokenizer  # noqa: E402

from fastattn.text import JsonTokenizer, MarianTokenizer, load_tokenizer  # noqa: E402
from fastattn.text.tokenizers import bert_wordpiece  # noqa: E402

ODD = ["", " ", "kato </s> mi<unk>x", "<pad><pad>", "ka</s>", "ÉSSS ß é", "a\tb\nc",
       "  ka   to  ", "xyz∑ ☃", ">>aa<< kato", " >>aa<< kato", ">>zz<<kato", ">>aa<<", "ka>>bb<<",
       "kato.", "mi ?", "ren,su", "\u00a0ka\u200bto", "KATO Mi"]


@pytest.fixture(scope="module", params=["saved_config", "raw_files", "languages"])
def folder(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(request.param))
    write_tokenizer(path, languages=request.param == "languages",
                    save_config=request.param != "raw_files")
    return path


def test_marian_encode_decode_equal_transformers(folder):
    hf, ours = hf_tokenizer(folder), MarianTokenizer(folder)
    texts = sentences(3, 300) + ODD
    got = ours.encode(texts)
    for t, ids in zip(texts, got):
        want = hf(t)["input_ids"]
        assert ids == want, t
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == \
                hf.decode(want, skip_special_tokens=skip), (t, skip)
    # unknown pieces: some of the models' pieces are not in vocab.json
    assert any(ours.unk_id in ids[:-1] for ids in got)
    assert ours.pad_id == hf.pad_token_id and ours.eos_id == hf.eos_token_id


def test_marian_decode_any_ids_equal_transformers(folder):
    hf, ours = hf_tokenizer(folder), MarianTokenizer(folder)
    r = random.Random(0)
    n = len(ours.encoder)
    for _ in range(400):
        ids = [r.randrange(n) for _ in range(r.randint(0, 14))]
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == \
                hf.decode(ids, skip_special_tokens=skip), ids
    assert ours.batch_decode([[5, 6], [0, 7]]) == hf.batch_decode([[5, 6], [0, 7]],
                                                                   skip_special_tokens=True)


@pytest.mark.parametrize("max_length", [2, 5, 64])
def test_marian_truncation_equal_transformers(folder, max_length):
    hf, ours = hf_tokenizer(folder), MarianTokenizer(folder)
    texts = [" ".join(["kato mi ren"] * 200), "ka", ""]
    want = hf(texts, truncation=True, max_length=max_length)["input_ids"]
    assert ours.encode(texts, max_length=max_length) == want
    assert max(map(len, want)) <= max_length


def test_marian_target_language(tmp_path):
    write_tokenizer(str(tmp_path), languages=True)
    hf, ours = hf_tokenizer(str(tmp_path)), MarianTokenizer(str(tmp_path))
    assert ours.target_languages == (">>aa<<", ">>bb<<")
    assert list(hf.supported_language_codes) == list(ours.target_languages)
    for code in ("aa", ">>bb<<"):
        tag = code if code.startswith(">>") else f">>{code}<<"
        assert ours.encode(["kato mi"], tgt_lang=code) == [hf(f"{tag} kato mi")["input_ids"]]
    with pytest.raises(ValueError, match=r"tgt_lang='zz' is not one of this model's language "
                                         r"codes: >>aa<<, >>bb<<"):
        ours.encode(["x"], tgt_lang="zz")
    with pytest.raises(ValueError, match="src_lang='aa'.*no source language codes"):
        ours.encode(["x"], src_lang="aa")
    with pytest.raises(TypeError, match="tgt_lang must be a str"):
        ours.encode(["x"], tgt_lang=3)


def test_marian_without_languages(tmp_path):
    write_tokenizer(str(tmp_path), save_config=False)
    tok = MarianTokenizer(str(tmp_path))
    assert tok.target_languages == ()
    with pytest.raises(ValueError, match="tgt_lang='de'.*has no target language codes"):
        tok.encode(["x"], tgt_lang="de")


def test_marian_bad_inputs_and_files(tmp_path):
    write_tokenizer(str(tmp_path), save_config=False)
    tok = load_tokenizer(str(tmp_path))
    assert isinstance(tok, MarianTokenizer)
    with pytest.raises(TypeError, match=r"texts must be a sequence of strings .*got one str"):
        tok.encode("kato")
    with pytest.raises(TypeError, match=r"texts\[1\] must be a str, got int"):
        tok.encode(["kato", 5])
    with pytest.raises(ValueError, match="max_length must be an integer >= 2"):
        tok.encode(["kato"], max_length=1)
    os.remove(tmp_path / "target.spm")
    with pytest.raises(FileNotFoundError, match="target.spm not found"):
        load_tokenizer(str(tmp_path))
    (tmp_path / "target.spm").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="target.spm is not a SentencePiece model"):
        load_tokenizer(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="model folder not found"):
        load_tokenizer(str(tmp_path / "nope"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="has no tokenizer: none of source.spm"):
        load_tokenizer(str(empty))


def test_missing_packages_name_the_extra(tmp_path, monkeypatch):
    write_tokenizer(str(tmp_path), save_config=False)
    monkeypatch.setitem(sys.modules, "sentencepiece", None)
    with pytest.raises(ImportError, match=r'sentencepiece.*pip install "fastattn\[text\]"'):
        load_tokenizer(str(tmp_path))
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "tokenizer.json").write_text("{}")
    with pytest.raises(ImportError, match=r'tokenizers.*pip install "fastattn\[text\]"'):
        load_tokenizer(str(tmp_path / "bert"))


TEXTS = ["Hello World!", "  leading and trailing  ", "", "Ünïcödé àccents café", "中文字符 and 日本語",
         "[CLS] inside [SEP] text [MASK]", "a\tb\nc\u00a0d\u200be", "x" * 300,
         " ".join(["word"] * 400), "don't stop-believing, ok?", "\x00\ufffd ctrl", "UPPER lower"]


def _hf_auto(folder):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("max_length", [None, 16, 256])
def test_tokenizer_json_equal_transformers(minilm, max_length):
    hf, ours = _hf_auto(minilm), load_tokenizer(minilm)
    assert isinstance(ours, JsonTokenizer)
    kw = dict(truncation=True, max_length=max_length) if max_length else {}
    want = hf(TEXTS, **kw)
    ids, types = ours.encode(TEXTS, max_length=max_length, types=True)
    assert ids == want["input_ids"] and types == want["token_type_ids"]
    for row in want["input_ids"]:
        assert ours.decode(row) == hf.decode(row, skip_special_tokens=True)
        assert ours.decode(row, skip_special_tokens=False) == hf.decode(row)
    assert ours.pad_id == hf.pad_token_id and ours.model_max_length == hf.model_max_length


def test_bert_vocab_txt_equal_transformers(minilm, tmp_path):
    """A BERT folder without tokenizer.json: built from vocab.txt as transformers does."""
    for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "config.json"):
        shutil.copy(os.path.join(minilm, name), tmp_path)
    hf = _hf_auto(str(tmp_path))
    ours = load_tokenizer(str(tmp_path))
    assert isinstance(ours, JsonTokenizer)
    want = hf(TEXTS, truncation=True, max_length=64)["input_ids"]
    assert ours.encode(TEXTS, max_length=64) == want
    assert ours.encode(TEXTS, max_length=64) == bert_wordpiece(str(tmp_path)).encode(
        TEXTS, max_length=64)


def test_tokenizer_json_languages_and_bad_file(minilm, tmp_path):
    tok = load_tokenizer(minilm)
    with pytest.raises(ValueError, match="has no source language codes"):
        tok.encode(["x"], src_lang="en")
    (tmp_path / "tokenizer.json").write_text('{"not": "a tokenizer"}')
    with pytest.raises(ValueError, match="tokenizer.json is not a tokenizer.json"):
        load_tokenizer(str(tmp_path))
