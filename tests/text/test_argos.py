"""Argos Translate packages (issue 60): fastattn.Translator on a package folder or its
.argosmodel zip translates as LibreTranslate does -- argostranslate's own pipeline
(``translate.apply_packaged_translation``: SentencePiece, CTranslate2's beam search with
argostranslate's options, replace_unknowns, target prefix, decoding) run on the same package
and the same sentences is the reference -- and `fastattn serve` routes LibreTranslate's
requests to the package of their languages.

The packages are made here (tests/text/argos_helpers.py: an OpenNMT-py Transformer as
CTranslate2's converter writes it, random weights, a SentencePiece model trained on a few
sentences)."""
import json
import os
import sys
import zipfile

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
ctranslate2 = pytest.importorskip("ctranslate2")
spm = pytest.importorskip("sentencepiece")

import argos_helpers as A  # noqa: E402
import fastattn  # noqa: E402
from fastattn.text import argos  # noqa: E402
from fastattn.text.argos import split_sentences  # noqa: E402

DOCS = A.EN + [" ".join(A.EN[:4]), "\n\n" + A.EN[0] + "\n" + A.EN[2], "",
               A.EN[5] + "\n\n" + A.EN[6] + " " + A.EN[7]]


@pytest.fixture(scope="module")
def sp_bytes():
    return A.train_sentencepiece()


@pytest.fixture(scope="module")
def packages(tmp_path_factory, sp_bytes):
    """Packages: 'plain' (unknown tokens rare), 'unk' (the unknown token's logit raised: many
    replacements), 'prefix' (a target prefix token), 'int8' (CTranslate2 int8 weights), and
    'zip' (the 'unk' package as an .argosmodel file)."""
    root = tmp_path_factory.mktemp("argos")
    out = {"plain": A.make_package(str(root / "plain"), sp_bytes=sp_bytes, unk_bias=-30.0),
           "unk": A.make_package(str(root / "unk"), sp_bytes=sp_bytes, unk_bias=2.0),
           "prefix": A.make_package(str(root / "prefix"), sp_bytes=sp_bytes, seed=3,
                                    target_prefix="ö", to_code="fr"),
           "int8": A.make_package(str(root / "int8"), sp_bytes=sp_bytes, seed=5,
                                  unk_bias=-30.0, quantization="int8")}
    out["zip"] = A.make_package(str(root / "zip"), sp_bytes=sp_bytes, unk_bias=2.0,
                                zipped=True)
    return out


class _Sentences:
    """argostranslate's sentencizer interface over fastattn's splitter (the neural ones need a
    download): the reference then differs from fastattn only where the pipelines do."""

    def split_sentences(self, text):
        return split_sentences(text)


def _ct2(folder, compute_type="float32"):
    return ctranslate2.Translator(os.path.join(folder, "model"), compute_type=compute_type)


def argos_reference(folder, text, translator):
    """argostranslate.translate's PackageTranslation.hypotheses(text, 1)[0] with fastattn's
    sentence splitter: its paragraphs, apply_packaged_translation each, its join."""
    package = pytest.importorskip("argostranslate.package")
    translate = pytest.importorskip("argostranslate.translate")
    pkg = package.Package(folder)
    paras = [translate.apply_packaged_translation(pkg, p, translator, _Sentences(), 1)[0].value
             for p in text.split("\n")]
    return "\n".join(paras).lstrip("\n")


def ct2_alone(folder, text, translator):
    """The same pipeline, each sentence translated alone by CTranslate2 (no batch)."""
    sp = spm.SentencePieceProcessor(model_file=os.path.join(folder, "sentencepiece.model"))
    meta = json.load(open(os.path.join(folder, "metadata.json")))
    prefix = meta.get("target_prefix", "")
    paras = []
    for para in text.split("\n"):
        toks = []
        for s in split_sentences(para):
            r = translator.translate_batch([sp.encode(s, out_type=str)],
                                           target_prefix=[[prefix]] if prefix else None,
                                           beam_size=4, length_penalty=0.2,
                                           replace_unknowns=True)[0]
            toks += r.hypotheses[0]
        v = sp.decode_pieces(toks).replace("\u2581", " ").replace("_", " ")
        if prefix and v.startswith(prefix):
            v = v[len(prefix):]
        paras.append(v[1:] if v.startswith(" ") else v)
    return "\n".join(paras).lstrip("\n")


# -- sentences ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("Hello there. How are you? Fine!", ["Hello there.", "How are you?", "Fine!"]),
    ("Dr. Smith met Mr. Jones at 10 a.m. in St. Louis. Then he left.",
     ["Dr. Smith met Mr. Jones at 10 a.m. in St. Louis.", "Then he left."]),
    ("It costs 3.50 dollars. J. R. R. Tolkien wrote it.",
     ["It costs 3.50 dollars.", "J. R. R. Tolkien wrote it."]),
    ('She said: "Come back soon." He did.', ['She said: "Come back soon."', "He did."]),
    ("Wait... what? no way", ["Wait... what? no way"]),
    ("Chapter 3. The end", ["Chapter 3. The end"]),
    ("你好。今天天气很好！是吗？", ["你好。", "今天天气很好！", "是吗？"]),
    ("  ", []), ("", []), ("one", ["one"]),
])
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


def test_split_sentences_refuses_bytes():
    with pytest.raises(TypeError, match="text must be a str"):
        split_sentences(b"x")


# -- translations ------------------------------------------------------------------------------

def test_package_folder_is_argostranslate(packages):
    """Documents of one or several paragraphs and sentences, on a package whose outputs hold
    no unknown token: argostranslate's pipeline, string for string."""
    folder = packages["plain"]
    tr = fastattn.Translator(folder)
    assert tr.package is not None and tr.source_languages == ("en",) and \
        tr.target_languages == ("de",)
    ct = _ct2(folder)
    got = tr.translate(DOCS)
    assert got == [argos_reference(folder, d, ct) for d in DOCS]
    assert len(set(got)) > len(DOCS) // 2            # the translations depend on the source


def test_unknown_tokens_are_replaced_as_ctranslate2_does(packages):
    """replace_unknowns: each <unk> of a hypothesis becomes the source piece the alignment head
    attends to most. One-sentence paragraphs: argostranslate's pipeline exactly. Several
    sentences: argostranslate batches them, and CTranslate2's attention of a row padded in a
    batch is not the row's own (its hypotheses are; measured here), so the reference there is
    CTranslate2 on each sentence alone -- which is what fastattn gives whatever the batch."""
    folder = packages["unk"]
    tr = fastattn.Translator(folder)
    ct = _ct2(folder)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(folder, "sentencepiece.model"))
    unknowns = sum(ct.translate_batch([sp.encode(s, out_type=str)], beam_size=4,
                                      length_penalty=0.2)[0].hypotheses[0].count("<unk>")
                   for s in A.EN)
    assert unknowns >= 10                            # the test exercises the replacement
    singles = [d for d in A.EN if len(split_sentences(d)) == 1]
    assert len(singles) >= 9
    assert tr.translate(singles) == [argos_reference(folder, d, ct) for d in singles]
    assert tr.translate(DOCS) == [ct2_alone(folder, d, ct) for d in DOCS]
    assert not any("<unk>" in t for t in tr.translate(DOCS))


def test_zipped_package(packages):
    """The .argosmodel file itself: extracted to a temporary folder (removed on close), the
    same translations as the installed folder."""
    path = packages["zip"]
    tr = fastattn.Translator(path)
    tmp = tr.package._tmp
    assert tmp is not None and os.path.isdir(tmp)
    folder = os.path.join(os.path.dirname(path), "translate-en_de-1_0")
    assert tr.translate(DOCS) == fastattn.Translator(folder).translate(DOCS)
    tr.package.close()
    assert not os.path.exists(tmp)


def test_target_prefix(packages):
    """A package with a target_prefix: the token forced first, removed from the text."""
    folder = packages["prefix"]
    tr = fastattn.Translator(folder)
    ct = _ct2(folder)
    singles = list(A.EN)
    got = tr.translate(singles)
    assert got == [argos_reference(folder, d, ct) for d in singles]
    assert tr.target_languages == ("fr",)


def test_int8_package_keeps_its_integers(packages):
    """A package quantized by CTranslate2 (int8, as argos-train writes them): every linear
    weight is the file's integers with its scales (no float round trip), and the sentences'
    translations are those of the same integers in float (CTranslate2's float32 run of the
    folder) where the int8 activations' rounding does not tip a random model's beam."""
    sys.path.insert(0, os.path.join(HERE, "..", "models"))
    from test_ct2_folders import _check_int8, _int8_sources
    folder = packages["int8"]
    tr = fastattn.Translator(folder)
    m = tr.model
    assert m.quantize == "int8"
    assert _check_int8(m, os.path.join(folder, "model"), _int8_sources(m.d_model, 2, 2),
                       []) == 21          # 2 x 4 encoder, 2 x 6 decoder, the output
    ct = _ct2(folder, "float32")
    singles = [d for d in A.EN if len(split_sentences(d)) == 1]
    got = tr.translate(singles)
    ref = [argos_reference(folder, d, ct) for d in singles]
    assert sum(g == r for g, r in zip(got, ref)) >= len(singles) * 0.6


def test_batching_and_threads_do_not_change_a_translation(packages):
    tr = fastattn.Translator(packages["unk"])
    whole = tr.translate(DOCS, batch_size=32)
    assert tr.translate(DOCS, batch_size=1) == whole
    assert tr.translate(DOCS, max_batch_tokens=20, batch_size=None, n_threads=1) == whole
    assert [tr.translate([d])[0] for d in DOCS] == whole
    assert list(tr.translate_iterable(iter(DOCS), batch_size=3)) == whole


def test_decoding_options_pass_through(packages):
    """argostranslate's options are defaults: num_beams=1 is greedy (CTranslate2's)."""
    folder = packages["plain"]
    tr = fastattn.Translator(folder)
    ct = _ct2(folder)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(folder, "sentencepiece.model"))
    for s in [d for d in A.EN if len(split_sentences(d)) == 1][:5]:
        r = ct.translate_batch([sp.encode(s, out_type=str)], beam_size=1)[0].hypotheses[0]
        v = sp.decode_pieces(r).replace("\u2581", " ").replace("_", " ")
        assert tr.translate([s], num_beams=1)[0] == (v[1:] if v.startswith(" ") else v)
    with pytest.raises(ValueError, match="translate_stream"):
        next(tr.translate_stream("Hello."))
    with pytest.raises(TypeError, match="decoder_input_ids"):
        tr.translate(["x"], decoder_input_ids=[[1]])


# -- bad packages ------------------------------------------------------------------------------

def _zip(path, members):
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return str(path)


def test_bad_packages_are_named(packages, tmp_path):
    good = packages["plain"]
    meta = open(os.path.join(good, "metadata.json")).read()
    with pytest.raises(ValueError, match=r"'\.\./evil' would be written outside"):
        fastattn.Translator(_zip(tmp_path / "a.argosmodel", {"p/metadata.json": meta,
                                                              "../evil": "x"}))
    with pytest.raises(ValueError, match="no metadata.json"):
        fastattn.Translator(_zip(tmp_path / "b.argosmodel", {"p/readme": "x"}))
    (tmp_path / "c.argosmodel").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a valid .argosmodel"):
        fastattn.Translator(str(tmp_path / "c.argosmodel"))
    import shutil
    for change, err, match in (
            (lambda d: json.dump({"type": "sbd", "from_code": "en", "to_code": "en"},
                                 open(os.path.join(d, "metadata.json"), "w")),
             ValueError, "type='sbd'"),
            (lambda d: json.dump({"from_code": "en"}, open(os.path.join(d, "metadata.json"),
                                                           "w")),
             ValueError, "field 'to_code'"),
            (lambda d: open(os.path.join(d, "metadata.json"), "w").write("{"),
             ValueError, "not valid JSON"),
            (lambda d: os.rename(os.path.join(d, "sentencepiece.model"),
                                 os.path.join(d, "bpe.model")),
             ValueError, "bpe.model"),
            (lambda d: os.remove(os.path.join(d, "sentencepiece.model")),
             FileNotFoundError, "no sentencepiece.model"),
            (lambda d: json.dump({"from_code": "en", "to_code": "de",
                                  "target_prefix": "__nope__"},
                                 open(os.path.join(d, "metadata.json"), "w")),
             ValueError, "target_prefix='__nope__'")):
        d = str(tmp_path / "pkg")
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(good, d)
        change(d)
        with pytest.raises(err, match=match):
            fastattn.Translator(d)
    assert not argos.is_package(str(tmp_path / "nothing-here"))


# -- serve: LibreTranslate's API over packages -----------------------------------------------

def test_serve_routes_libretranslate_requests_by_language(packages):
    pytest.importorskip("starlette")
    pytest.importorskip("httpx")
    from starlette.testclient import TestClient
    from fastattn.serve import app
    de, fr = fastattn.Translator(packages["plain"]), fastattn.Translator(packages["prefix"])
    with TestClient(app({"en-de": packages["plain"], "en-fr": packages["prefix"]})) as c:
        langs = c.get("/languages").json()
        assert langs == [{"code": "en", "name": "English", "targets": ["de", "fr"]}]
        for tgt, tr in (("de", de), ("fr", fr)):
            r = c.post("/translate", json={"q": A.EN[0], "source": "en", "target": tgt,
                                           "format": "text"})
            assert r.status_code == 200, r.text
            assert r.json()["translatedText"] == tr.translate([A.EN[0]])[0]
        r = c.post("/translate", json={"q": [A.EN[1], A.EN[2]], "source": "auto",
                                       "target": "de"})
        assert r.json()["translatedText"] == de.translate([A.EN[1], A.EN[2]])
        r = c.post("/translate", json={"q": "x", "source": "en", "target": "es"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "target"
        assert "en->de" in r.json()["error"]["message"]
        r = c.post("/translate", json={"q": "x", "source": "en", "target": "de",
                                       "stream": True})
        assert r.status_code == 400
        assert c.get("/health").status_code == 200


@pytest.mark.whole_model
def test_compat_ctranslate2_attention_and_replace_unknowns(packages):
    """fastattn.compat.ctranslate2's translate_batch with return_attention / replace_unknowns
    (beam and greedy, a target prefix, several hypotheses, the end token returned) on the
    package's CTranslate2 folder: CTranslate2's hypotheses and attention vectors, one source
    at a time (CTranslate2's batched attention is not a row's own)."""
    from fastattn.compat import ctranslate2 as compat
    folder = packages["unk"]
    model = os.path.join(folder, "model")
    ref, ours = ctranslate2.Translator(model, compute_type="float32"), compat.Translator(model)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(folder, "sentencepiece.model"))
    replaced = 0
    for s in A.EN:
        src = [sp.encode(s, out_type=str)]
        for kw in (dict(beam_size=4, replace_unknowns=True, return_attention=True),
                   dict(beam_size=1, return_attention=True, return_end_token=True),
                   dict(beam_size=2, num_hypotheses=2, replace_unknowns=True,
                        return_attention=True, target_prefix=[["ö"]]),
                   dict(beam_size=4, replace_unknowns=True)):
            a, b = ref.translate_batch(src, **kw)[0], ours.translate_batch(src, **kw)[0]
            assert b.hypotheses == a.hypotheses, (s, kw)
            assert len(b.attention) == len(a.attention)
            for x, y in zip(a.attention, b.attention):
                np.testing.assert_allclose(np.array(y), np.array(x), atol=2e-5)
            if kw.get("replace_unknowns"):
                plain = ref.translate_batch(src, **{k: v for k, v in kw.items()
                                                     if k != "replace_unknowns"})[0]
                replaced += sum(h.count("<unk>") for h in plain.hypotheses)
    assert replaced >= 10


def test_hypotheses_are_argostranslates(packages):
    """num_return_sequences=N: argostranslate's hypotheses(q, N) (beam max(N, 4), N
    hypotheses per sentence, hypothesis k of a paragraph joins each sentence's k-th), one-sentence
    paragraphs (the multi-sentence reference is batched, see above)."""
    package = pytest.importorskip("argostranslate.package")
    translate = pytest.importorskip("argostranslate.translate")
    folder = packages["plain"]
    tr = fastattn.Translator(folder)
    ct = _ct2(folder)
    pkg = package.Package(folder)
    singles = [d for d in A.EN if len(split_sentences(d)) == 1]
    got = tr.translate(singles, num_return_sequences=3)
    assert got[0] != got[0][:1] * 3 or len(set(sum(got, []))) > len(singles)
    for text, hyps in zip(singles, got):
        ref = translate.apply_packaged_translation(pkg, text, ct, _Sentences(), 3)
        assert hyps == [h.value for h in ref]
    assert [h[0] for h in got] == tr.translate(singles)


def test_serve_alternatives(packages):
    """LibreTranslate's `alternatives`: the best translation and N more (the package's
    hypotheses 2 .. N + 1); bad values are a 400 naming the field."""
    pytest.importorskip("starlette")
    pytest.importorskip("httpx")
    from starlette.testclient import TestClient
    from fastattn.serve import app
    tr = fastattn.Translator(packages["plain"])
    want = tr.translate([A.EN[1], A.EN[5]], num_return_sequences=3)
    with TestClient(app({"en-de": packages["plain"]})) as c:
        r = c.post("/translate", json={"q": A.EN[1], "source": "en", "target": "de",
                                       "alternatives": 2})
        assert r.json() == {"translatedText": want[0][0], "alternatives": want[0][1:]}
        r = c.post("/translate", json={"q": [A.EN[1], A.EN[5]], "source": "en",
                                       "target": "de", "alternatives": 2})
        assert r.json() == {"translatedText": [w[0] for w in want],
                            "alternatives": [w[1:] for w in want]}
        for bad in (-1, 99, "2", 1.5):
            r = c.post("/translate", json={"q": "x", "alternatives": bad})
            assert r.status_code == 400 and r.json()["error"]["param"] == "alternatives"
        r = c.post("/translate", json={"q": "x", "alternatives": 0})
        assert set(r.json()) == {"translatedText"}
