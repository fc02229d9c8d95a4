"""Loading in bounded memory (fastattn/io/huggingface.Checkpoint, the models' streaming loads)
and `fastattn convert`.

- Peak memory, measured in a fresh process (VmHWM after /proc/self/clear_refs): a load peaks
  at no more than 1.3 x (int8) / 1.1 x (float32) the loaded model's resident size plus the
  largest tensor's float32 size plus a small constant, for float32, float16 and bfloat16 files,
  one file or shards. (Before streaming, the peak was 3-4 x the file.)
- The checkpoint reader: every dtype read as the safetensors library reads it, row ranges,
  block-wise comparison; a truncated or corrupt file is one ValueError naming the file.
- int8 quantization in C: the bytes of the NumPy definition, any thread count.
- `fastattn convert`: the folder loads (mapped) into the model quantize="int8" gives at load,
  bit for bit; float32 too (packed panels mapped); a failed or interrupted conversion leaves
  no output and no temporary folder; bad input is one line and exit status 2.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import fastattn
from fastattn import _quant
from fastattn.io import saved
from fastattn.io.huggingface import Checkpoint, checkpoint_files

pytest.importorskip("transformers")        # make_checkpoint writes config.json through it

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench", "fixtures"))
import make_checkpoint  # noqa: E402

# a model big enough that the constant overheads are small against it (~40 MB float32)
make_checkpoint.SHAPES.setdefault("test-small", dict(
    model_type="m2m_100", d_model=256, encoder_layers=3, decoder_layers=3,
    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=1024,
    decoder_ffn_dim=1024, vocab_size=16000, max_position_embeddings=256))
SLACK = 12 << 20            # bytes: the interpreter's own allocations during a load
# child processes run outside the checkout, so that they import the installed fastattn (CI
# installs the package; the checkout's fastattn/ has no built kernels there)
OUTSIDE = tempfile.gettempdir()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    made = {}

    def get(dtype="float32", sharded=False, shape="test-small"):
        key = (dtype, sharded, shape)
        if key not in made:
            path = str(tmp_path_factory.mktemp(f"ck-{dtype}-{sharded}-{shape}"))
            make_checkpoint.write(path, shape, dtype, shard_bytes=6_000_000 if sharded else None,
                                  progress=False)
            made[key] = path
        return made[key]
    return get


def _sources(n=3, length=12, vocab=1000):
    src = np.random.default_rng(0).integers(3, vocab, (n, length))
    src[:, -1] = 2
    return src


_MEASURE = """
import json, sys
import fastattn
from fastattn.models.convert import model_class
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
folder, quantize = sys.argv[1], (sys.argv[2] if sys.argv[2] != "None" else None)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
base = status("VmRSS")
model = model_class(folder).from_pretrained(folder, quantize=quantize)
print(json.dumps({"resident": status("VmRSS") - base, "peak": status("VmHWM") - base}))
"""


def _largest_f32(folder):
    ck = Checkpoint(checkpoint_files(folder))
    return max(int(np.prod(ck.shape(n))) * 4 for n in ck.keys())


@pytest.mark.parametrize("quantize", [None, "int8"])
@pytest.mark.parametrize("dtype,sharded", [("float32", False), ("float32", True),
                                           ("float16", True), ("bfloat16", False)])
def test_peak_memory_of_a_load_is_bounded(folders, dtype, sharded, quantize):
    if os.environ.get("FASTATTN_SANITIZED"):
        pytest.skip("AddressSanitizer keeps freed memory in quarantine: peak RSS measures "
                    "nothing of the load")
    folder = folders(dtype, sharded)
    if sharded:
        assert os.path.exists(os.path.join(folder, "model.safetensors.index.json"))
        assert len(checkpoint_files(folder)) >= 3
    out = subprocess.run([sys.executable, "-c", _MEASURE, folder, str(quantize)],
                         capture_output=True, text=True, check=True, cwd=OUTSIDE)
    m = json.loads(out.stdout.strip().splitlines()[-1])
    largest = _largest_f32(folder)
    factor = 1.3 if quantize else 1.1
    file_bytes = sum(os.path.getsize(f) for f in checkpoint_files(folder))
    assert m["resident"] > 0.2 * file_bytes                     # the measure sees the model
    assert m["peak"] <= factor * m["resident"] + largest + SLACK, (m, largest)


def test_streamed_load_equals_a_state_dict_load(folders):
    """The streaming path gives the model load_state_dict of the whole dict gives."""
    folder = folders("float32", True)
    config = fastattn.Seq2SeqTransformer.from_pretrained(folder).config
    ck = Checkpoint(checkpoint_files(folder))
    sd = {k: ck[k] for k in ck.keys()}
    src = _sources()
    for q in (None, "int8"):
        streamed = fastattn.Seq2SeqTransformer.from_pretrained(folder, quantize=q)
        whole = fastattn.Seq2SeqTransformer.from_state_dict(sd, quantize=q, **config)
        a, b = streamed.state_dict(), whole.state_dict()
        assert list(a) == list(b) and all(np.array_equal(a[k], b[k]) for k in a)
        np.testing.assert_array_equal(streamed.generate(src, max_new_tokens=10),
                                      whole.generate(src, max_new_tokens=10))


def test_half_precision_files_load_as_transformers_widens_them(folders):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForSeq2SeqLM
    src = _sources(2, 10)
    for dtype in ("float16", "bfloat16"):
        folder = folders(dtype, dtype == "float16")
        hf = AutoModelForSeq2SeqLM.from_pretrained(folder, dtype=torch.float32).eval()
        ours = fastattn.Seq2SeqTransformer.from_pretrained(folder)
        sd = ours.state_dict()
        want = hf.state_dict()
        for name in ("model.encoder.layers.0.fc1.weight", "model.shared.weight",
                     "model.decoder.layers.2.encoder_attn.k_proj.weight"):
            np.testing.assert_array_equal(sd[name], want[name].numpy())
        with torch.no_grad():
            ref = hf.generate(torch.as_tensor(src), max_new_tokens=12, num_beams=1,
                              do_sample=False).numpy()
        np.testing.assert_array_equal(ours.generate(src, max_new_tokens=12), ref)


# -- the checkpoint reader ---------------------------------------------------------------------

def test_checkpoint_reads_every_dtype_as_the_safetensors_library(tmp_path):
    from safetensors.numpy import save_file
    rng = np.random.default_rng(3)
    arrays = {"f32": rng.standard_normal((7, 5)).astype(np.float32),
              "f64": rng.standard_normal((3, 4)),
              "f16": rng.standard_normal((9, 2)).astype(np.float16),
              "i64": rng.integers(-5, 5, (4,)), "i8": rng.integers(-5, 5, (2, 3), dtype=np.int8),
              "scalar": np.array(2.5, np.float32), "empty": np.zeros((0, 3), np.float32)}
    path = str(tmp_path / "a.safetensors")
    save_file(arrays, path)
    ck = Checkpoint([path])
    assert sorted(ck.keys()) == sorted(arrays)
    for name, want in arrays.items():
        got = ck[name]
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        assert ck.shape(name) == want.shape and ck.dtype(name) == want.dtype
    np.testing.assert_array_equal(ck.read("f32", (2, 5)), arrays["f32"][2:5])
    dst = np.empty((3, 5), np.float64)
    ck.copy_into("f32", dst, (1, 4))
    np.testing.assert_array_equal(dst, arrays["f32"][1:4])
    assert ck.equal("f32", "f32") and not ck.equal("f32", "f64")


def test_checkpoint_widens_bfloat16_exactly(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file
    t = torch.randn(300, 70).to(torch.bfloat16)
    path = str(tmp_path / "b.safetensors")
    save_file({"w": t, "v": t.clone()}, path)
    ck = Checkpoint([path])
    want = t.float().numpy()
    assert ck.dtype("w") == np.float32
    np.testing.assert_array_equal(ck["w"], want)
    # block by block (a small block: many blocks) into a float64 destination
    import fastattn.io.huggingface as hfio
    monkeypatch.setattr(hfio, "_READ_BLOCK", 64)
    dst = np.empty((300, 70), np.float64)
    ck.copy_into("w", dst)
    np.testing.assert_array_equal(dst, want)
    assert ck.equal("w", "v")


@pytest.mark.parametrize("damage", ["truncate", "header", "offsets", "dtype", "empty"])
def test_a_corrupt_or_truncated_shard_is_one_error_naming_the_file(folders, tmp_path, damage):
    src = folders("float32", True)
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in os.listdir(src):
        (bad / name).write_bytes(open(os.path.join(src, name), "rb").read())
    shard = sorted(f for f in os.listdir(bad) if f.endswith(".safetensors"))[1]
    path = bad / shard
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    if damage == "truncate":
        path.write_bytes(data[:len(data) - 1000])
    elif damage == "header":
        path.write_bytes(data[:8] + b"{not json" + data[17:])
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        name = next(k for k in header if k != "__metadata__")
        if damage == "offsets":
            header[name]["data_offsets"][1] += 4
        else:
            header[name]["dtype"] = "F8_E4M3"
        blob = json.dumps(header).encode()
        blob += b" " * (n - len(blob)) if len(blob) <= n else b""
        path.write_bytes(len(blob).to_bytes(8, "little") + blob + data[8 + n:])
    with pytest.raises(ValueError, match=str(path).replace("\\", "\\\\")):
        fastattn.Seq2SeqTransformer.from_pretrained(str(bad))
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "fastattn", "convert", str(bad), str(out)],
                       capture_output=True, text=True, cwd=OUTSIDE)
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("\r")]
    err = [ln for ln in lines if "error" in ln]
    assert len(err) == 1 and shard in err[0] and "Traceback" not in r.stderr, r.stderr
    assert not out.exists() and not [f for f in os.listdir(tmp_path) if "partial" in f]


# -- int8 quantization in C --------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(1, 1), (5, 3), (64, 7), (130, 1024), (1001, 257), (3, 0)])
def test_c_quantization_gives_the_bytes_of_the_numpy_definition(shape):
    rng = np.random.default_rng(sum(shape))
    w = rng.standard_normal(shape) * rng.choice([1e-4, 1.0, 3e4], size=(shape[0], 1))
    w = w.astype(np.float32)
    if shape[0] > 2 and shape[1]:
        w[1] = 0                                               # a zero row: scale 0, q 0
        w[2, :4] = np.float32(2.5) * (np.abs(w[2]).max() / 127)   # near-halves
    q_ref, s_ref = _quant._quantize_rows_reference(w, "w")
    for arr in (w, w.astype(np.float64), np.asfortranarray(w)):
        q, s = _quant._quantize_rows(arr, "w")
        np.testing.assert_array_equal(q, q_ref)
        np.testing.assert_array_equal(s, s_ref)
    if shape[1]:
        a, b = _quant.Int8Weight.from_float(w), _quant.Int8Weight.from_int8(q_ref, s_ref)
        for x, y in ((a.panels, b.panels), (a.scale, b.scale), (a.comp, b.comp)):
            np.testing.assert_array_equal(x, y)


def test_c_quantization_is_the_same_on_any_thread_count_and_rejects_inf_nan():
    w = np.random.default_rng(1).standard_normal((777, 100)).astype(np.float32)
    before = fastattn.get_num_threads()
    try:
        fastattn.set_num_threads(1)
        q1, s1 = _quant._quantize_rows(w, "w")
        for n in (2, 3, 8):
            fastattn.set_num_threads(n)
            q, s = _quant._quantize_rows(w, "w")
            assert np.array_equal(q, q1) and np.array_equal(s, s1)
    finally:
        fastattn.set_num_threads(before)
    for bad in (np.inf, -np.inf, np.nan):
        w2 = w.copy()
        w2[500, 7] = bad
        with pytest.raises(ValueError, match="lin.weight holds inf or NaN"):
            _quant.Int8Weight.from_float(w2, "lin.weight")


# -- fastattn convert --------------------------------------------------------------------------

def _same_params(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return list(sa) == list(sb) and all(np.array_equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("quantize", ["int8", "float32"])
def test_convert_round_trip_is_bitwise_the_load_time_model(folders, tmp_path, quantize):
    folder = folders("bfloat16", False)
    out = tmp_path / "converted"
    r = subprocess.run([sys.executable, "-m", "fastattn", "convert", folder, str(out),
                        "--quantize", quantize], capture_output=True, text=True, cwd=OUTSIDE)
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stderr and "GB" in r.stderr                # the progress line
    assert sorted(os.listdir(out)) == ["config.json", "fastattn_model.json",
                                       "fastattn_model.safetensors", "generation_config.json"]
    q = None if quantize == "float32" else "int8"
    want = fastattn.Seq2SeqTransformer.from_pretrained(folder, quantize=q)
    got = fastattn.Seq2SeqTransformer.from_pretrained(str(out))
    assert got.quantize == q
    params = saved.read_folder(str(out))
    kinds = {type(v).__name__ for v in params.values()}
    assert ("Int8Weight" if q else "_Packed") in kinds           # the packed form, mapped
    assert _same_params(got, want)
    src = _sources()
    for kw in (dict(max_new_tokens=12), dict(max_new_tokens=8, num_beams=3)):
        np.testing.assert_array_equal(got.generate(src, **kw), want.generate(src, **kw))
    # an existing OUT is refused (one line), replaced with --force
    r = subprocess.run([sys.executable, "-m", "fastattn", "convert", folder, str(out)],
                       capture_output=True, text=True, cwd=OUTSIDE)
    assert r.returncode == 2 and "already exists" in r.stderr
    r = subprocess.run([sys.executable, "-m", "fastattn", "convert", folder, str(out), "--force",
                        "--quiet", "--quantize", quantize], capture_output=True, text=True,
                       cwd=OUTSIDE)
    assert r.returncode == 0 and r.stderr == ""


def test_a_float_saved_folder_runs_under_another_kernel_set(folders, tmp_path):
    from fastattn._kernels import _simd
    folder = folders("float32", False)
    model = fastattn.Seq2SeqTransformer.from_pretrained(folder)
    model.save_pretrained(tmp_path / "f")
    src = _sources()
    want = model.generate(src, max_new_tokens=10)
    levels = [lv for lv in ("avx2", "baseline") if lv != _simd.isa()]
    before = _simd.isa()
    try:
        for level in levels:
            _simd.set_isa(level)
            other = fastattn.Seq2SeqTransformer.from_pretrained(folder)
            got = fastattn.Seq2SeqTransformer.from_pretrained(tmp_path / "f")
            np.testing.assert_array_equal(got.generate(src, max_new_tokens=10),
                                          other.generate(src, max_new_tokens=10))
            assert _same_params(got, other)
    finally:
        _simd.set_isa(before)
    assert np.array_equal(fastattn.Seq2SeqTransformer.from_pretrained(
        tmp_path / "f").generate(src, max_new_tokens=10), want)


def test_a_failed_convert_leaves_nothing(folders, tmp_path, monkeypatch):
    from fastattn.models import convert as cv
    folder = folders("float32", False)
    out = tmp_path / "out"

    def stop(stage, done, total):
        if stage == "write" and done > total // 3:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        cv.convert(folder, out, "int8", progress=stop)
    assert os.listdir(tmp_path) == []


_SLOW_CONVERT = """
import signal, sys, time
# Ctrl-C as at a terminal (a background job of a non-interactive shell starts with SIGINT
# ignored, and Python then never raises KeyboardInterrupt)
signal.signal(signal.SIGINT, signal.default_int_handler)
from fastattn.models import convert
from fastattn import __main__ as cli
real = convert._Progress.__call__
def slow(self, stage, done, total):
    if stage == "write":
        print("WRITING", file=sys.stderr, flush=True)
        time.sleep(0.5)
    return real(self, stage, done, total)
convert._Progress.__call__ = slow
sys.exit(cli.main(["convert", sys.argv[1], sys.argv[2]]))
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupted_convert_leaves_nothing(folders, tmp_path, sig):
    folder = folders("float32", False)
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-c", _SLOW_CONVERT, folder, str(out)],
                         stderr=subprocess.PIPE, text=True, cwd=OUTSIDE)
    for line in p.stderr:                           # wait until it is writing OUT's weights
        if "WRITING" in line:
            break
    assert [f for f in os.listdir(tmp_path) if "partial" in f]
    p.send_signal(sig)
    rest = p.stderr.read()
    assert p.wait(timeout=60) != 0
    assert "Traceback" not in rest and "interrupted" in rest
    assert os.listdir(tmp_path) == []


# -- T5 tables kept apart (transformers 5) ------------------------------------------------------

@pytest.mark.parametrize("tie", [True, False])
def test_t5_separate_encoder_decoder_and_shared_tables(tmp_path, tie):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file
    from transformers import T5ForConditionalGeneration
    from seq2seq_checkpoints import make_checkpoint as make_seq2seq, padded_sources
    path = tmp_path / "t5"
    make_seq2seq(str(path), "t5", tied=tie, feed_forward_proj="gated-gelu")
    sd = load_file(str(path / "model.safetensors"))
    g = torch.Generator().manual_seed(5)
    V, d = sd["shared.weight"].shape
    for name in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
        sd[name] = torch.randn(V, d, generator=g)
    save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
    hf = T5ForConditionalGeneration.from_pretrained(str(path)).eval()
    assert not torch.equal(hf.encoder.embed_tokens.weight, hf.shared.weight)
    model = fastattn.Seq2SeqTransformer.from_pretrained(str(path))
    ids, mask = padded_sources("t5", np.random.default_rng(2), [9, 4, 6])
    dec = np.concatenate([np.zeros((3, 1), np.int64), ids[:, :5]], axis=1)
    with torch.no_grad():
        want = hf(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
                  decoder_input_ids=torch.as_tensor(dec)).logits.numpy()
        ref = hf.generate(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
                          max_new_tokens=15, min_new_tokens=3, do_sample=False).numpy()
    got = model.logits(ids, dec, mask)
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 1e-4
    np.testing.assert_array_equal(model.generate(ids, mask, max_new_tokens=15,
                                                 min_new_tokens=3), ref)
