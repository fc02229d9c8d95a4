"""CTranslate2 folders of binary versions 3 to 5 (CTranslate2 1.x / 2.x: older OPUS-MT
conversions and Argos Translate packages): TransformerSpec revision 4 (the options once at the
top), the tokens and flags as model.bin variables, no config.json, a text vocabulary.

tests/models/ct2_legacy.py rewrites a current folder in those layouts; CTranslate2 itself loads
the rewritten folders and translates as from the original (the writer is right), and fastattn
reads them into the same model, bit for bit."""
import os
import shutil
import struct
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "text"))
ctranslate2 = pytest.importorskip("ctranslate2")
pytest.importorskip("sentencepiece")

import argos_helpers as A  # noqa: E402
import fastattn  # noqa: E402
from ct2_legacy import write_legacy  # noqa: E402
from fastattn.io.ctranslate2 import ModelBin, read_config  # noqa: E402

VERSIONS = (5, 4, 3)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("legacy")
    sp = A.train_sentencepiece()
    out = {"float32": A.make_package(str(root / "f"), sp_bytes=sp, unk_bias=2.0),
           "int8": A.make_package(str(root / "q"), sp_bytes=sp, seed=5,
                                  quantization="int8")}
    for kind, pkg in list(out.items()):
        for v in VERSIONS:
            if kind == "int8" and v < 4:
                continue                 # item sizes: an int8 folder of version 3 is refused
            dst = str(root / f"{kind}-v{v}")
            shutil.copytree(pkg, dst)
            shutil.rmtree(os.path.join(dst, "model"))
            write_legacy(os.path.join(pkg, "model"), os.path.join(dst, "model"), v)
            out[(kind, v)] = dst
    return out


def _sources(pkg):
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=os.path.join(pkg, "sentencepiece.model"))
    return [sp.encode(s, out_type=str) for s in A.EN]


@pytest.mark.parametrize("version", VERSIONS)
def test_ctranslate2_reads_the_rewritten_folder(made, version):
    """The writer: CTranslate2 loads the old layout and translates as from the original."""
    pkg = made["float32"]
    src = _sources(pkg)
    ref = ctranslate2.Translator(os.path.join(pkg, "model"), compute_type="float32")
    old = ctranslate2.Translator(os.path.join(made[("float32", version)], "model"),
                                 compute_type="float32")
    assert [r.hypotheses for r in old.translate_batch(src, beam_size=4)] == \
        [r.hypotheses for r in ref.translate_batch(src, beam_size=4)]


@pytest.mark.parametrize("version", VERSIONS)
def test_fastattn_reads_old_versions_bit_for_bit(made, version):
    pkg, old = made["float32"], made[("float32", version)]
    mb = ModelBin(os.path.join(old, "model", "model.bin"))
    assert (mb.version, mb.revision) == (version, 4)
    assert not os.path.exists(os.path.join(old, "model", "config.json"))
    cfg = read_config(os.path.join(old, "model"))
    assert cfg == {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>",
                   "add_source_bos": False, "add_source_eos": False,
                   "decoder_start_token": "<s>"}
    a = fastattn.Seq2SeqTransformer.from_pretrained(os.path.join(pkg, "model"))
    b = fastattn.Seq2SeqTransformer.from_pretrained(os.path.join(old, "model"))
    assert b.quantize is None and b.config == a.config
    ids = np.array([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 3, 1]])
    dec = np.array([[2, 5, 6, 7], [2, 8, 9, 10]])
    assert np.array_equal(a.logits(ids, dec), b.logits(ids, dec))
    new, legacy = fastattn.Translator(pkg), fastattn.Translator(old)
    assert legacy.translate(A.EN) == new.translate(A.EN)
    # CTranslate2's API over the old folder
    from fastattn.compat import ctranslate2 as compat
    src = _sources(pkg)
    ref = ctranslate2.Translator(os.path.join(old, "model"), compute_type="float32")
    ours = compat.Translator(os.path.join(old, "model"))
    kw = dict(beam_size=4, replace_unknowns=True)
    assert [r.hypotheses for r in ours.translate_batch(src[:1], **kw)] == \
        [r.hypotheses for r in ref.translate_batch(src[:1], **kw)]


@pytest.mark.parametrize("version", (5, 4))
def test_old_int8_folder_keeps_its_integers(made, version):
    pkg, old = made["int8"], made[("int8", version)]
    a = fastattn.Seq2SeqTransformer.from_pretrained(os.path.join(pkg, "model"))
    b = fastattn.Seq2SeqTransformer.from_pretrained(os.path.join(old, "model"))
    assert a.quantize == b.quantize == "int8"
    ids = np.array([[5, 6, 7, 8, 9, 10]])
    assert np.array_equal(a.generate(ids, num_beams=4), b.generate(ids, num_beams=4))


def _patch_header(path, version=None, spec=None, revision=None):
    raw = open(path, "rb").read()
    (v,) = struct.unpack_from("<I", raw, 0)
    (n,) = struct.unpack_from("<H", raw, 4)
    name = raw[6:6 + n - 1].decode()
    (r,) = struct.unpack_from("<I", raw, 6 + n)
    name = name if spec is None else spec
    b = name.encode()
    head = struct.pack("<I", v if version is None else version) + \
        struct.pack("<H", len(b) + 1) + b + b"\0" + \
        struct.pack("<I", r if revision is None else revision)
    open(path, "wb").write(head + raw[6 + n + 4:])


@pytest.mark.parametrize("change, match", [
    (dict(version=1), "binary version 1 is not supported"),
    (dict(version=7), "binary version 7 is not supported"),
    (dict(revision=1), "revision 1 of TransformerSpec is not supported"),
    (dict(revision=8), "revision 8 of TransformerSpec is not supported"),
    (dict(spec="LanguageModelSpec"), "spec 'LanguageModelSpec' is not supported"),
])
def test_unsupported_layouts_are_named(made, tmp_path, change, match):
    d = str(tmp_path / "m")
    shutil.copytree(os.path.join(made[("float32", 5)], "model"), d)
    _patch_header(os.path.join(d, "model.bin"), **change)
    with pytest.raises(ValueError, match=match):
        fastattn.Seq2SeqTransformer.from_pretrained(d)


def test_old_spec_names_give_the_head_count(made, tmp_path):
    """Revision 2 has no num_heads: the spec's name gives it (TransformerBase 8 heads,
    TransformerBig 16: CTranslate2's model factory). The 4-head test model written as a
    TransformerBase is read with 8 heads by both; a revision 4 file keeps its own count."""
    pkg = made["float32"]
    d = str(tmp_path / "m")
    write_legacy(os.path.join(pkg, "model"), d, 5, revision=2, spec="TransformerBase")
    mb = ModelBin(os.path.join(d, "model.bin"))
    assert (mb.spec, mb.revision, mb.virtual) == ("TransformerSpec", 2, {"num_heads": 8})
    assert mb.scalar("decoder/num_heads") == 8
    src = _sources(pkg)
    ref = ctranslate2.Translator(d, compute_type="float32")
    from fastattn.compat import ctranslate2 as compat
    ours = compat.Translator(d)
    assert ours.model.config["encoder_attention_heads"] == 8
    assert [r.hypotheses for r in ours.translate_batch(src, beam_size=2)] == \
        [r.hypotheses for r in ref.translate_batch(src, beam_size=2)]
    d4 = str(tmp_path / "m4")
    write_legacy(os.path.join(pkg, "model"), d4, 5, revision=4, spec="TransformerBig")
    mb4 = ModelBin(os.path.join(d4, "model.bin"))
    assert mb4.virtual == {} and mb4.scalar("encoder/num_heads") == 4


@pytest.mark.parametrize("version", (5, 2))
def test_bare_old_conversions(made, tmp_path, version):
    """OpenNMT-tf's old conversions (CTranslate2's own test model is one): no position table
    (CTranslate2's built-in sinusoids, rebuilt here as it computes them), encoder/embeddings,
    no pre_norm / activation scalars (pre-norm, ReLU by default), version 2 without aliases:
    CTranslate2's hypotheses and scores through fastattn.compat.ctranslate2."""
    from fastattn.compat import ctranslate2 as compat
    pkg = made["float32"]
    d = str(tmp_path / "bare")
    write_legacy(os.path.join(pkg, "model"), d, version, revision=2 if version < 3 else 4,
                 spec="TransformerBase" if version < 3 else "TransformerSpec", bare=True)
    mb = ModelBin(os.path.join(d, "model.bin"))
    assert "encoder/position_encodings/encodings" not in mb and "pre_norm" not in mb
    src = _sources(pkg)
    ref = ctranslate2.Translator(d, compute_type="float32")
    ours = compat.Translator(d)
    for kw in (dict(beam_size=1), dict(beam_size=4, return_scores=True)):
        a, b = ref.translate_batch(src, **kw), ours.translate_batch(src, **kw)
        assert [r.hypotheses for r in b] == [r.hypotheses for r in a], kw
        for x, y in zip(a, b):
            np.testing.assert_allclose(y.scores, x.scores, rtol=1e-4, atol=1e-4)
