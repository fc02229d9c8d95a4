"""save_pretrained / from_pretrained of fastattn's own folders (fastattn/io/saved.py): int8 and
float models come back bit for bit, mapped rather than copied (the int8 panels are not
repacked), text loaders work on the folder, processes share its pages, and bad folders get a
ValueError naming the file."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import fastattn  # noqa: E402
from fastattn._ops import _Packed  # noqa: E402
from fastattn._quant import Int8Rows, Int8Weight  # noqa: E402
from fastattn.io import saved  # noqa: E402
from encoder_checkpoints import padded_batch, write_numpy_bert  # noqa: E402
from seq2seq_checkpoints import make_checkpoint, padded_sources  # noqa: E402


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("marian-src"))
    make_checkpoint(path, "marian", tied=True, d_model=64, encoder_ffn_dim=96,
                    decoder_ffn_dim=96)
    return path


def _mapped(arr):
    """Whether arr is a view of a read-only memory map."""
    base = arr
    while base is not None and not isinstance(base, np.memmap):
        base = getattr(base, "base", None)
    return isinstance(base, np.memmap) and not arr.flags.writeable


@pytest.mark.parametrize("quantize", ["int8", None])
def test_seq2seq_round_trip_is_bitwise_and_mapped(marian, tmp_path, quantize):
    m = fastattn.Seq2SeqTransformer.from_pretrained(marian, quantize=quantize)
    m.save_pretrained(tmp_path / "out")
    assert saved.is_saved_folder(tmp_path / "out")
    r = fastattn.Seq2SeqTransformer.from_pretrained(tmp_path / "out")
    assert r.quantize == quantize and r.config == m.config
    assert r.generation_config == m.generation_config
    ids, mask = padded_sources("marian", np.random.default_rng(0), [9, 5, 7])
    dec = np.random.default_rng(1).integers(1, 70, size=(3, 6))
    np.testing.assert_array_equal(r.logits(ids, dec, mask), m.logits(ids, dec, mask))
    np.testing.assert_array_equal(r.generate(ids, mask, num_beams=2, max_new_tokens=6),
                                  m.generate(ids, mask, num_beams=2, max_new_tokens=6))
    params = [arr for layer in r._layers.values() for _, arr, _, _ in layer._named_params()]
    for arr in params:
        if isinstance(arr, Int8Weight):
            assert _mapped(arr.panels) and _mapped(arr.scale) and _mapped(arr.comp)
        elif isinstance(arr, Int8Rows):
            assert _mapped(arr.q) and _mapped(arr.scale)
        elif isinstance(arr, _Packed):        # a float32 linear weight: packed once, at load
            assert quantize is None and arr._weight is None
        else:
            assert _mapped(arr)
    assert any(isinstance(a, Int8Weight) for a in params) == (quantize == "int8")
    # the tied embedding is stored once and tied again
    assert r.decoder_embed._params["weight"] is r.encoder_embed._params["weight"]
    # load_state_dict on a mapped float model builds new arrays (the map is read-only)
    if quantize is None:
        sd = {k: v.copy() for k, v in m.state_dict().items()}
        r.load_state_dict(sd)
        np.testing.assert_array_equal(r.logits(ids, dec, mask), m.logits(ids, dec, mask))


def test_float_folder_quantized_at_load_equals_int8_folder(marian, tmp_path):
    fastattn.Seq2SeqTransformer.from_pretrained(marian).save_pretrained(tmp_path / "f")
    a = fastattn.Seq2SeqTransformer.from_pretrained(tmp_path / "f", quantize="int8")
    b = fastattn.Seq2SeqTransformer.from_pretrained(marian, quantize="int8")
    ids, mask = padded_sources("marian", np.random.default_rng(2), [8, 4])
    np.testing.assert_array_equal(a.generate(ids, mask, max_new_tokens=5),
                                  b.generate(ids, mask, max_new_tokens=5))


def test_translator_on_a_saved_folder(tmp_path):
    pytest.importorskip("sentencepiece")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "text"))
    from text_helpers import make_marian_folder, sentences
    src = str(tmp_path / "src")
    os.makedirs(src)
    make_marian_folder(src)
    tr = fastattn.Translator(src, quantize="int8")
    tr.model.save_pretrained(tmp_path / "q")
    assert os.path.isfile(tmp_path / "q" / "source.spm")        # the tokenizer came along
    texts = sentences(1, 6)
    assert fastattn.Translator(tmp_path / "q").translate(texts, max_new_tokens=6) == \
        tr.translate(texts, max_new_tokens=6)


@pytest.mark.parametrize("quantize", ["int8", None])
def test_encoder_round_trip(tmp_path, quantize):
    write_numpy_bert(tmp_path / "src", seed=3)
    m = fastattn.EncoderModel.from_pretrained(tmp_path / "src", quantize=quantize)
    m.save_pretrained(tmp_path / "out")
    r = fastattn.EncoderModel.from_pretrained(tmp_path / "out")
    assert r.quantize == quantize
    ids, mask = padded_batch(np.random.default_rng(0), 60, [5, 12, 9], 12)
    np.testing.assert_array_equal(r.embed(ids, attention_mask=mask),
                                  m.embed(ids, attention_mask=mask))
    np.testing.assert_array_equal(r(ids, attention_mask=mask), m(ids, attention_mask=mask))


def test_sentence_encoder_on_a_saved_minilm(tmp_path, minilm):
    enc = fastattn.SentenceEncoder(minilm, quantize="int8")
    enc.model.save_pretrained(tmp_path / "q")
    s = ["A man is eating food.", "Ünïcödé café", "x " * 300]
    np.testing.assert_array_equal(fastattn.SentenceEncoder(tmp_path / "q").encode(s),
                                  enc.encode(s))


def _edit_json(path, **changes):
    with open(path) as f:
        doc = json.load(f)
    doc.update(changes)
    with open(path, "w") as f:
        json.dump(doc, f)


def test_bad_saved_folders(marian, tmp_path):
    q = fastattn.Seq2SeqTransformer.from_pretrained(marian, quantize="int8")
    out = tmp_path / "q"
    q.save_pretrained(out)
    meta = out / saved.MODEL_FILE
    with pytest.raises(ValueError, match="dtype=float64"):
        fastattn.Seq2SeqTransformer.from_pretrained(out, dtype=np.float64)
    with pytest.raises(ValueError, match="quantize"):
        fastattn.Seq2SeqTransformer.from_pretrained(out, quantize="int4")
    with pytest.raises(ValueError, match="model_type='marian'"):
        fastattn.EncoderModel.from_pretrained(out)
    write_numpy_bert(tmp_path / "bert", seed=1)
    fastattn.EncoderModel.from_pretrained(tmp_path / "bert").save_pretrained(tmp_path / "e")
    with pytest.raises(ValueError, match="holds a 'EncoderModel', not a Seq2SeqTransformer"):
        fastattn.Seq2SeqTransformer.from_pretrained(tmp_path / "e")
    _edit_json(meta, format_version=saved.FORMAT_VERSION + 1)
    with pytest.raises(ValueError, match=rf"fastattn_model.json: format_version "
                                         rf"{saved.FORMAT_VERSION + 1} was written by a newer "
                                         r"fastattn"):
        fastattn.Seq2SeqTransformer.from_pretrained(out)
    _edit_json(meta, format_version=1)
    weights = out / saved.WEIGHTS_FILE
    data = weights.read_bytes()
    weights.write_bytes(data[:len(data) // 2])                   # truncated
    with pytest.raises(ValueError, match="fastattn_model.safetensors: tensor"):
        fastattn.Seq2SeqTransformer.from_pretrained(out)
    os.remove(weights)
    with pytest.raises(FileNotFoundError, match="fastattn_model.safetensors"):
        fastattn.Seq2SeqTransformer.from_pretrained(out)
    meta.write_text("{not json")
    with pytest.raises(ValueError, match="fastattn_model.json: cannot read it as JSON"):
        fastattn.Seq2SeqTransformer.from_pretrained(out)


_CHILD = r"""
import sys
import numpy as np
import fastattn
m = fastattn.Seq2SeqTransformer.from_pretrained(sys.argv[1])
ids = np.array([[5, 6, 7, 8, 0]])
m.generate(ids, max_new_tokens=3)              # every weight read once
print("ready", flush=True)
sys.stdin.readline()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/smaps")
def test_two_processes_share_the_mapped_weights(marian, tmp_path):
    """Two processes (say, two Dask workers) loading one int8 folder hold its weights once: the
    file's pages are shared pages of both (dirty where the page cache has not written a
    just-saved file back yet, or on tmpfs)."""
    fastattn.Seq2SeqTransformer.from_pretrained(marian, quantize="int8").save_pretrained(
        tmp_path / "q")
    weights = str(tmp_path / "q" / saved.WEIGHTS_FILE)
    size = os.path.getsize(weights)
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path / "q")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              cwd=os.path.dirname(__file__))   # (not a checkout's source folder)
             for _ in range(2)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        for p in procs:
            shared = rss = 0
            inside = False
            with open(f"/proc/{p.pid}/smaps") as f:
                for line in f:
                    if "-" in line.split()[0] and len(line.split()) >= 5:
                        inside = line.rstrip().endswith(weights)
                    elif inside and line.startswith(("Shared_Clean:", "Shared_Dirty:")):
                        shared += int(line.split()[1]) * 1024
                    elif inside and line.startswith("Rss:"):
                        rss += int(line.split()[1]) * 1024
            # the whole file is resident in each process, and all of it shared
            assert rss >= 0.9 * size and shared >= 0.9 * size, (rss, shared, size)
    finally:
        for p in procs:
            p.communicate("\n", timeout=60)


def test_binary16_panels_round_trip_bitwise_and_mapped(marian, tmp_path, monkeypatch):
    """A folder saved in float16 loads as float32 whose linear weights are all binary16 numbers:
    packed as binary16 panels where the kernel set has them, saved as float16 panels, mapped
    back; the same bits as float32 panels throughout, and transformers' logits."""
    import torch
    from transformers import AutoModelForSeq2SeqLM

    from fastattn import _ops
    from fastattn._kernels import _gemm
    AutoModelForSeq2SeqLM.from_pretrained(marian).half().save_pretrained(tmp_path / "f16")
    ref = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "f16", dtype=torch.float32).eval()
    m = fastattn.Seq2SeqTransformer.from_pretrained(tmp_path / "f16")
    monkeypatch.setattr(_ops, "_HALF_PANELS", False)
    f = fastattn.Seq2SeqTransformer.from_pretrained(tmp_path / "f16")
    monkeypatch.setattr(_ops, "_HALF_PANELS", True)

    def packed(model):
        return [a for layer in model._layers.values() for _, a, _, _ in layer._named_params()
                if isinstance(a, _Packed)]
    assert packed(m) and all(p.half == _gemm.half_panels() for p in packed(m))
    assert not any(p.half for p in packed(f))
    ids, mask = padded_sources("marian", np.random.default_rng(0), [9, 5, 7])
    dec = np.random.default_rng(1).integers(1, 70, size=(3, 6))
    want = m.logits(ids, dec, mask)
    np.testing.assert_array_equal(want, f.logits(ids, dec, mask))
    with torch.no_grad():
        hf = ref(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                 decoder_input_ids=torch.from_numpy(dec)).logits.numpy()
    np.testing.assert_allclose(want, hf, rtol=1e-4, atol=1e-4)
    m.save_pretrained(tmp_path / "out")
    r = fastattn.Seq2SeqTransformer.from_pretrained(tmp_path / "out")
    assert all(p.half == _gemm.half_panels() and _mapped(p.buf.view(np.float16) if p.half
                                                         else p.buf) for p in packed(r))
    np.testing.assert_array_equal(r.logits(ids, dec, mask), want)
    np.testing.assert_array_equal(r.generate(ids, mask, num_beams=2, max_new_tokens=6),
                                  f.generate(ids, mask, num_beams=2, max_new_tokens=6))
    # state_dict reads the binary16 panels back as the float32 values
    for k, v in r.state_dict().items():
        np.testing.assert_array_equal(v, f.state_dict()[k])
    # float16 is read for panels only: a float16 parameter is refused, naming the tensor
    weights = tmp_path / "out" / saved.WEIGHTS_FILE
    raw = weights.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    name = next(k for k, v in header.items() if k != "__metadata__" and v["dtype"] == "F32"
                and not k.endswith(".panels"))
    header[name]["dtype"] = "F16"
    header[name]["shape"] = [2 * int(np.prod(header[name]["shape"]))]
    new = json.dumps(header).encode()
    weights.write_bytes(len(new).to_bytes(8, "little") + new + raw[8 + n:])
    with pytest.raises(ValueError, match=f"{name}.*float16 is only written for packed panels"):
        fastattn.Seq2SeqTransformer.from_pretrained(tmp_path / "out")
