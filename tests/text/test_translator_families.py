"""fastattn.Translator on every seq2seq family (BART, mBART, mBART-50, M2M100, NLLB, Pegasus,
T5) against transformers' tokenizer -> generate -> batch_decode(skip_special_tokens=True),
string for string, with the language codes; the tokenizers id for id on hostile strings.

Each folder is a random checkpoint (untied, unit-scale weights) plus the tokenizer
transformers' own class builds from a model trained here and saves (seq2seq_text_helpers.py).
"""
import random

import pytest

pytest.importorskip("sentencepiece")
pytest.importorskip("tokenizers")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from seq2seq_text_helpers import (FAMILIES, build_tokenizer, hf_tokenizer,  # noqa: E402
                                  make_folder, sentences)

from fastattn.text import (JsonTokenizer, M2M100Tokenizer, Translator,  # noqa: E402
                           load_tokenizer)

# source / target language per family (None: the family has no codes)
LANGS = {"mbart": ("ro_RO", "de_DE"), "mbart50": ("fr_XX", "de_DE"), "m2m_100": ("fr", "de"),
         "nllb": ("fra_Latn", "deu_Latn")}
HOSTILE = ["", " ", "  the   cat  ", "the cat\tand\ndog", "Über schön — café naïve ß",
           "☃ 中文字符 and 日本語 ∑", "the cat</s>ran", "<unk> <pad> <s> <mask>x", "en_XX the cat",
           "__fr__ cat", "eng_Latn dog", "\u00a0the\u200bcat ", "THE CAT!!", "x" * 40,
           "the cat's dog, not here.", "\x00\ufffd ctrl", " leading", "trailing "]
LONG = " ".join(["the cat and dog ran over"] * 40)
TEXTS = sentences(5, 29) + ["", "  ", "ka to", "☃ über the cat</s>", LONG]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(request.param))
    tok, model = make_folder(request.param, path)
    return request.param, path, tok, model


@pytest.fixture(scope="module", params=[f for f in FAMILIES if f in LANGS])
def lang_family(request, tmp_path_factory):
    """The families with language codes (the tests of the codes themselves)."""
    path = str(tmp_path_factory.mktemp(request.param + "-lang"))
    tok, model = make_folder(request.param, path)
    return request.param, path, tok, model


def _hf_src(tok, family, src):
    if src is not None:
        tok.src_lang = src
    return tok


def hf_translate(family, tok, model, texts, max_length, src=None, tgt=None, **kw):
    tok = _hf_src(tok, family, src)
    enc = tok(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    if tgt is not None:
        kw["forced_bos_token_id"] = tok.convert_tokens_to_ids(
            f"__{tgt}__" if family == "m2m_100" else tgt)
    with torch.no_grad():
        out = model.generate(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                             do_sample=False, **kw)
    return tok.batch_decode(out, skip_special_tokens=True)


# -- tokenization --------------------------------------------------------------------------------

def test_tokenizer_ids_and_text_equal_transformers(family):
    name, path, hf, _ = family
    ours = load_tokenizer(path)
    assert isinstance(ours, M2M100Tokenizer if name == "m2m_100" else JsonTokenizer)
    texts = HOSTILE + sentences(3, 100)
    srcs = [None] + ([LANGS[name][0]] if name in LANGS else [])
    for src in srcs:
        _hf_src(hf, name, src)
        got = ours.encode(texts, src_lang=src)
        for t, ids in zip(texts, got):
            want = hf(t)["input_ids"]
            assert ids == want, (name, src, t)
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == \
                    hf.decode(want, skip_special_tokens=skip), (name, t, skip)
    unk = hf.convert_tokens_to_ids(hf.unk_token)
    assert any(unk in ids for ids in got), "no text encodes an unknown piece"
    assert ours.pad_id == hf.pad_token_id


@pytest.mark.parametrize("max_length", [4, 9, 64])
def test_truncation_equals_transformers(family, max_length):
    name, path, hf, _ = family
    ours = load_tokenizer(path)
    _hf_src(hf, name, LANGS.get(name, (None,))[0])
    texts = [LONG, "the", ""]
    want = hf(texts, truncation=True, max_length=max_length)["input_ids"]
    assert ours.encode(texts, max_length=max_length, src_lang=LANGS.get(name, (None,))[0]) == want
    assert max(map(len, want)) == max_length


def test_decode_any_ids_equals_transformers(family):
    name, path, hf, _ = family
    ours = load_tokenizer(path)
    r = random.Random(1)
    top = ours.max_id
    for _ in range(300):
        ids = [r.randrange(top + 1) for _ in range(r.randint(0, 12))]
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == \
                hf.decode(ids, skip_special_tokens=skip), (name, ids, skip)


def test_m2m100_with_language_tokens_listed_as_special(tmp_path):
    """Published M2M100 folders list the __xx__ tokens as additional special tokens: matched
    whole in the text, dropped by skip_special_tokens."""
    hf = build_tokenizer("m2m_100", str(tmp_path), hub_like=True)
    ours = load_tokenizer(str(tmp_path))
    for src in ("en", "fr", "zu"):
        hf.src_lang = src
        for t in HOSTILE + ["__de__ the cat", "the__fr__cat"]:
            want = hf(t)["input_ids"]
            assert ours.encode([t], src_lang=src) == [want], (src, t)
            for skip in (True, False):
                assert ours.decode(want, skip_special_tokens=skip) == \
                    hf.decode(want, skip_special_tokens=skip)
    de = ours.target_language_id("de")
    assert ours.decode([2, de, 40, 41, 2]) == hf.decode([2, de, 40, 41, 2], skip_special_tokens=True)
    assert "__de__" not in ours.decode([2, de, 40, 41, 2])


# -- translation ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [dict(max_new_tokens=16), dict(max_new_tokens=12, num_beams=3)],
                         ids=["greedy", "beam3"])
def test_translations_equal_transformers(family, kw):
    name, path, hf, model = family
    src, tgt = LANGS.get(name, (None, None))
    tr = Translator(path)
    want = hf_translate(name, hf, model, TEXTS, tr.max_source_length, src, tgt, **kw)
    got = tr.translate(TEXTS, batch_size=8, src_lang=src, tgt_lang=tgt, **kw)
    assert got == want
    assert len(set(got)) > len(TEXTS) // 4, got        # outputs vary: the test can fail
    if name in LANGS:                                   # the constructor's defaults
        assert Translator(path, src_lang=src, tgt_lang=tgt).translate(TEXTS, **kw) == want


def test_language_codes_change_the_translation(lang_family):
    name, path, hf, model = lang_family
    tr = Translator(path)
    src, tgt = LANGS[name]
    other = {"mbart": "en_XX", "mbart50": "en_XX", "m2m_100": "en", "nllb": "eng_Latn"}[name]
    texts = sentences(7, 12)
    kw = dict(max_new_tokens=10)
    a = tr.translate(texts, src_lang=src, tgt_lang=tgt, **kw)
    b = tr.translate(texts, src_lang=src, tgt_lang=other, **kw)
    c = tr.translate(texts, src_lang=other, tgt_lang=tgt, **kw)
    assert a != b and a != c
    # default source language: the folder's (transformers' default for the family)
    assert tr.translate(texts, tgt_lang=tgt, **kw) == hf_translate(
        name, hf_tokenizer(path), model, texts, tr.max_source_length, None, tgt, **kw)
    assert tr.translate(texts, src_lang=other, tgt_lang=tgt, **kw) == hf_translate(
        name, hf, model, texts, tr.max_source_length, other, tgt, **kw)


def test_same_strings_whatever_the_batching(family):
    name, path, _, _ = family
    src, tgt = LANGS.get(name, (None, None))
    tr = Translator(path, src_lang=src, tgt_lang=tgt)
    texts = sentences(9, 30, hi=25) + TEXTS
    kw = dict(max_new_tokens=10)
    ref = tr.translate(texts, **kw)
    assert tr.translate(texts, batch_size=1, **kw) == ref
    assert tr.translate(texts, batch_size=None, max_batch_tokens=60, **kw) == ref
    assert list(tr.translate_iterable(iter(texts), batch_size=4, window=7, **kw)) == ref
    for text, want in list(zip(texts, ref))[::5]:
        assert "".join(tr.translate_stream(text, **kw)) == want


def test_language_errors(family):
    name, path, _, _ = family
    tr = Translator(path)
    if name not in LANGS:
        with pytest.raises(ValueError, match="src_lang='en_XX'.*has no source language codes"):
            tr.translate(["the cat"], src_lang="en_XX")
        with pytest.raises(ValueError, match="tgt_lang='de'.*has no target language codes"):
            tr.translate(["the cat"], tgt_lang="de")
        with pytest.raises(ValueError, match="tgt_lang='de'"):
            Translator(path, tgt_lang="de")
        assert tr.source_languages == () and tr.target_languages == ()
        return
    src, tgt = LANGS[name]
    assert src in tr.source_languages or f"__{src}__" in tr.source_languages
    with pytest.raises(ValueError, match=r"tgt_lang='xx_YY' is not one of this model's "
                                         r"language codes"):
        tr.translate(["the cat"], tgt_lang="xx_YY")
    with pytest.raises(ValueError, match="src_lang='klingon' is not one of"):
        tr.translate_iterable(["the cat"], src_lang="klingon")
    with pytest.raises(ValueError, match="src_lang='klingon'"):
        Translator(path, src_lang="klingon")
    with pytest.raises(ValueError, match="src_lang='klingon'"):
        tr.translate_stream("the cat", src_lang="klingon")
    with pytest.raises(ValueError, match="forced_bos_token_id=5 contradicts tgt_lang"):
        tr.translate(["the cat"], tgt_lang=tgt, forced_bos_token_id=5)


def test_quantize_is_checked_at_the_text_layer(family):
    name, path, _, _ = family
    with pytest.raises(ValueError, match="quantize must be None, 'int8' or 'bfloat16'"):
        Translator(path, quantize="int4")
    with pytest.raises(TypeError, match="quantize must be None, .int8. or .bfloat16., got bool"):
        Translator(path, quantize=True)
    assert Translator(path, quantize=None).quantize is None


def test_vocabulary_mismatch_is_named(family, tmp_path):
    import json
    import shutil
    name, path, _, _ = family
    bad = tmp_path / "bad"
    shutil.copytree(path, bad)
    if name == "m2m_100":
        vocab = json.loads((bad / "vocab.json").read_text(encoding="utf-8"))
        vocab["extra"] = 10_000
        (bad / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    else:
        tj = json.loads((bad / "tokenizer.json").read_text(encoding="utf-8"))
        tj["added_tokens"].append(dict(tj["added_tokens"][-1], id=10_000, content="<extra>"))
        (bad / "tokenizer.json").write_text(json.dumps(tj), encoding="utf-8")
    with pytest.raises(ValueError, match=r"the tokenizer's ids go up to \d+, but the "
                                         r"model's vocab_size is \d+"):
        Translator(str(bad))


def test_int8_translator_equals_the_int8_model(family):
    """Translator(quantize='int8') decodes with the int8 model, and its output does not depend
    on the batching either."""
    name, path, _, _ = family
    tr = Translator(path, quantize="int8")
    assert tr.model.quantize == "int8"
    src, tgt = LANGS.get(name, (None, None))
    got = tr.translate(TEXTS[:6], src_lang=src, tgt_lang=tgt, max_new_tokens=8)
    assert got == tr.translate(TEXTS[:6], batch_size=1, src_lang=src, tgt_lang=tgt,
                               max_new_tokens=8)
    assert len(got) == 6 and all(isinstance(t, str) for t in got)


def test_cli_languages(lang_family, tmp_path):
    """`fastattn translate --src-lang --tgt-lang` writes what Translator.translate returns."""
    import os
    import subprocess
    import sys

    import fastattn
    name, path, _, _ = lang_family
    src, tgt = LANGS[name]
    texts = sentences(11, 6)
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(fastattn.__file__)))
    cmd = [sys.executable, "-m", "fastattn", "translate", path, "--input", str(tmp_path / "in.txt"),
           "--output", str(tmp_path / "out.txt"), "--src-lang", src, "--tgt-lang", tgt,
           "--max-new-tokens", "8", "--quiet"]
    done = subprocess.run(cmd, capture_output=True, cwd=str(tmp_path), env=env, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    want = Translator(path).translate(texts, src_lang=src, tgt_lang=tgt, max_new_tokens=8)
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")[:-1] == \
        [w.replace("\n", " ") for w in want]
    bad = subprocess.run([c if c != tgt else "xx_Q" for c in cmd], capture_output=True,
                         cwd=str(tmp_path), env=env, timeout=300)
    assert bad.returncode == 2 and b"tgt_lang='xx_Q'" in bad.stderr
    assert b"Traceback" not in bad.stderr
