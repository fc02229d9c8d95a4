"""Folders with a SentencePiece model and no tokenizer.json (older published T5 / Pegasus /
mBART / mBART-50 / NLLB folders): fastattn's tokenizer against
``AutoTokenizer.from_pretrained(folder)`` (transformers 5 builds one from the .model file) id for
id and string for string, and Translator against tokenizer -> generate -> batch_decode, and
against the same folder with its tokenizer.json.

transformers 5 orders Pegasus' mask tokens differently from a .model file (``<mask_2>`` 2,
``<mask_1>`` 3) than in its tokenizer.json (``<mask_1>`` 2): fastattn follows transformers for
each folder, so only the text "<mask_1>" / "<mask_2>" encodes differently between the two.
"""
import os
import random
import shutil

import pytest

pytest.importorskip("sentencepiece")
pytest.importorskip("tokenizers")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from seq2seq_text_helpers import hf_tokenizer, make_folder, sentences  # noqa: E402
from test_translator_families import HOSTILE, LANGS, TEXTS, hf_translate  # noqa: E402

from fastattn.text import JsonTokenizer, Translator, load_tokenizer  # noqa: E402

SPM_FAMILIES = ["t5", "pegasus", "mbart", "mbart50", "nllb"]
EXTRA = ["<extra_id_0> x<extra_id_5>y", "<mask_1> <mask_2> <unk_3>", "a <mask> b", "ro_RO x"]


@pytest.fixture(scope="module", params=SPM_FAMILIES)
def spm_family(request, tmp_path_factory):
    name = request.param
    path = str(tmp_path_factory.mktemp(name + "-spm"))
    tok, model = make_folder(name, path, spm_only=True)
    return name, path, tok, model


def test_folder_is_spm_only(spm_family):
    name, path, _, _ = spm_family
    files = set(os.listdir(path))
    assert "tokenizer.json" not in files
    assert ("spiece.model" if name in ("t5", "pegasus") else "sentencepiece.bpe.model") in files


def test_ids_and_text_equal_transformers(spm_family):
    name, path, hf, _ = spm_family
    ours = load_tokenizer(path)
    assert isinstance(ours, JsonTokenizer)
    texts = HOSTILE + EXTRA + sentences(3, 100) + sentences(4, 50, hi=40)
    for src in [None] + ([LANGS[name][0]] if name in LANGS else []):
        if src is not None:
            hf.src_lang = src
        for t, ids in zip(texts, ours.encode(texts, src_lang=src)):
            want = hf(t)["input_ids"]
            assert ids == want, (name, src, t)
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == \
                    hf.decode(want, skip_special_tokens=skip), (name, t, skip)
    assert ours.pad_id == hf.pad_token_id
    assert ours.max_id == max(hf.get_vocab().values())
    r = random.Random(2)
    for _ in range(200):
        ids = [r.randrange(ours.max_id + 1) for _ in range(r.randint(0, 12))]
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == \
                hf.decode(ids, skip_special_tokens=skip), (name, ids, skip)
    want = hf([TEXTS[-1], "the"], truncation=True, max_length=9)["input_ids"]
    assert ours.encode([TEXTS[-1], "the"], max_length=9, src_lang=LANGS.get(name, (None,))[0]) \
        == want


def test_t5_sentinels_and_pegasus_offset(spm_family):
    name, path, hf, _ = spm_family
    ours = load_tokenizer(path)
    if name == "t5":
        import sentencepiece as spm
        n = spm.SentencePieceProcessor(model_file=os.path.join(path, "spiece.model")) \
            .GetPieceSize()
        assert ours.encode(["<extra_id_0>"])[0][0] == n + 99 == ours.max_id
        assert ours.encode(["<extra_id_99>"])[0][0] == n
    elif name == "pegasus":
        assert hf.convert_tokens_to_ids("<unk>") == ours.encode(["<unk>"])[0][0] == 105


def test_translations_equal_transformers_and_the_json_folder(spm_family, tmp_path):
    name, path, hf, model = spm_family
    src, tgt = LANGS.get(name, (None, None))
    kw = dict(max_new_tokens=12)
    tr = Translator(path)
    want = hf_translate(name, hf_tokenizer(path), model, TEXTS, tr.max_source_length, src, tgt,
                        **kw)
    got = tr.translate(TEXTS, batch_size=8, src_lang=src, tgt_lang=tgt, **kw)
    assert got == want
    assert len(set(got)) > len(TEXTS) // 4, got
    # the same folder with the tokenizer.json transformers writes for it
    with_json = tmp_path / "json"
    shutil.copytree(path, with_json)
    hf.save_pretrained(str(with_json))
    assert (with_json / "tokenizer.json").is_file()
    assert Translator(str(with_json)).translate(TEXTS, batch_size=8, src_lang=src, tgt_lang=tgt,
                                                **kw) == got


def test_unknown_class_is_named(tmp_path):
    import json
    (tmp_path / "spiece.model").write_bytes(b"")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "AlbertTokenizer"}))
    with pytest.raises(ValueError, match="tokenizer_class='AlbertTokenizer' is not one"):
        load_tokenizer(str(tmp_path))
