"""The child process of `fastattn bench --models`: one system, one model, run by path (not as
part of the fastattn package, so that a peer's process never imports fastattn). Prints one JSON
object: the system's version, the timed samples of each work, where its outputs were saved.

The int8 systems: fastattn ``from_pretrained(path, quantize="int8")`` (skipped, saying so, in a
build without it), CTranslate2 ``compute_type="int8"`` on the float32 conversion, and ONNX
Runtime on ``onnxruntime.quantization.quantize_dynamic`` of the float32 export (its defaults:
int8 weights, one scale per tensor; uint8 activations quantized per call)."""
import argparse
import json
import os
import sys
import time

import numpy as np

NEW_TOKENS, SRC_LEN = 64, 128
MODEL_WORKS = {
    "marian": [("greedy 8x128->64", 8, 1), ("beam 4, 8x128->64", 8, 4), ("greedy 1x128->64", 1, 1)],
    "encoder": [("32x128", 32, 128), ("1x16", 1, 16)],
}
SYSTEMS = ("fastattn", "transformers", "ctranslate2", "onnxruntime", "fastattn-int8",
           "ctranslate2-int8", "onnxruntime-int8")
INT8_MISSING = "fastattn int8: not available in this build"


def _vocab(path):
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)["vocab_size"]


def _inputs(model, batch, length, vocab):
    rng = np.random.default_rng(0)
    if model == "marian":
        ids = rng.integers(1, vocab - 1, size=(8, SRC_LEN))
        ids[:, -1] = 0                                       # EOS
        return ids[:batch]
    return rng.integers(1000, 30000, size=(batch, length))


# ---------------------------------------------------------------------------------------------
# the child: one system, one model

def _peak_rss():
    # (its own reader of /proc/self/status, not fastattn._memory.proc_bytes: this script runs
    # the peers too, whose processes must never import fastattn)
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class _Skip(Exception):
    pass


def load_fastattn(cls, path, quantize=None):
    """cls.from_pretrained(path), or with quantize="int8"; a build whose from_pretrained does
    not take quantize="int8" (TypeError / ValueError) raises _Skip(INT8_MISSING ...)."""
    if quantize is None:
        return cls.from_pretrained(path)
    try:
        return cls.from_pretrained(path, quantize=quantize)
    except (TypeError, ValueError) as exc:
        raise _Skip(f"{INT8_MISSING} ({type(exc).__name__}: {exc})") from None


def _onnx_path(path, workdir, system):
    stem = os.path.join(workdir, os.path.basename(os.path.normpath(path)))
    return stem + (".int8.onnx" if system.endswith("-int8") else ".onnx")


def prepare(system, model, path, workdir):
    """What a system's timed child loads, made in a process of its own beforehand (so that the
    torch export counts neither in the child's load time nor in its peak RSS): the ONNX files."""
    if system.startswith("onnxruntime") and model == "encoder":
        export_onnx(path, _onnx_path(path, workdir, "onnxruntime"),
                    int8=system.endswith("-int8"))


def export_onnx(path, onnx_path, int8=False):
    """The BERT folder `path` as an ONNX graph input_ids -> hidden (torch.onnx, written once);
    int8: then its quantize_dynamic copy. Returns the file to load."""
    torch = _need("torch", "PyTorch (to export the ONNX graph)")
    transformers = _need("transformers", "transformers (to export the ONNX graph)")
    _need("onnx", "onnx (to export the ONNX graph)")
    if not os.path.exists(onnx_path):
        m = transformers.BertModel.from_pretrained(path, add_pooling_layer=False).eval()

        class Hidden(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, input_ids):
                return self.m(input_ids=input_ids).last_hidden_state
        torch.onnx.export(Hidden(m), (torch.ones((2, 8), dtype=torch.long),), onnx_path,
                          input_names=["input_ids"], output_names=["hidden"],
                          dynamic_axes={"input_ids": {0: "b", 1: "s"},
                                        "hidden": {0: "b", 1: "s"}},
                          opset_version=17, dynamo=False)
    if not int8:
        return onnx_path
    q_path = onnx_path[:-len(".onnx")] + ".int8.onnx"
    if not os.path.exists(q_path):
        from onnxruntime.quantization import QuantType, quantize_dynamic
        quantize_dynamic(onnx_path, q_path, weight_type=QuantType.QInt8)
    return q_path


def _need(module, what):
    try:
        return __import__(module)
    except ImportError:
        raise _Skip(f"{what} is not installed") from None


def _runner(system, model, path, threads, workdir):
    """(version, run(work) -> output ndarray)."""
    if system in ("fastattn", "fastattn-int8"):
        # by absolute name (this file runs by path), from the modules themselves: the
        # package's __init__ is a layer above benchmark/
        from fastattn._threads import set_num_threads
        from fastattn._version import __version__
        from fastattn.models import EncoderModel, Seq2SeqTransformer
        quantize = "int8" if system == "fastattn-int8" else None
        if model == "marian":
            m = load_fastattn(Seq2SeqTransformer, path, quantize)

            def run(ids, beams):
                return m.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                  num_beams=beams, n_threads=threads)
        else:
            m = load_fastattn(EncoderModel, path, quantize)
            set_num_threads(threads)

            def run(ids, _):
                return m(ids)
        from fastattn._kernels import _qgemm, _simd
        cap = f", FASTATTN_ISA={_simd.isa_cap()}" if _simd.isa_cap() else ""
        kernels = _qgemm.variant() if quantize else _simd.isa()
        return f"{__version__} (kernels {kernels}{cap})", run
    if system == "transformers":
        torch = _need("torch", "PyTorch")
        transformers = _need("transformers", "transformers")
        torch.set_num_threads(threads)
        if model == "marian":
            m = transformers.MarianMTModel.from_pretrained(path).eval()

            def run(ids, beams):
                with torch.inference_mode():
                    return m.generate(torch.as_tensor(ids), max_new_tokens=NEW_TOKENS,
                                      min_new_tokens=NEW_TOKENS, num_beams=beams).numpy()
        else:
            m = transformers.BertModel.from_pretrained(path, add_pooling_layer=False).eval()

            def run(ids, _):
                with torch.inference_mode():
                    return m(input_ids=torch.as_tensor(ids)).last_hidden_state.numpy()
        return f"{transformers.__version__}, torch {torch.__version__}", run
    if system in ("ctranslate2", "ctranslate2-int8"):
        ct2 = _need("ctranslate2", "CTranslate2")
        compute_type = "int8" if system == "ctranslate2-int8" else "float32"
        out = os.path.join(workdir, f"{model}_ct2")               # converted by the parent
        if model == "encoder":
            enc = ct2.Encoder(out, device="cpu", compute_type=compute_type, inter_threads=1,
                              intra_threads=threads)

            def run(ids, _):
                ids32 = np.ascontiguousarray(ids, dtype=np.int32)
                lengths = np.full(len(ids32), ids32.shape[1], dtype=np.int32)
                res = enc.forward_batch(ct2.StorageView.from_array(ids32),
                                        ct2.StorageView.from_array(lengths))
                return np.asarray(res.last_hidden_state)
            return ct2.__version__, run
        tr = ct2.Translator(out, device="cpu", compute_type=compute_type, inter_threads=1,
                            intra_threads=threads)
        pad = _vocab(path) - 1

        def run(ids, beams):
            toks = [[f"t{i}" for i in row] for row in ids]
            res = tr.translate_batch(toks, beam_size=beams, max_decoding_length=NEW_TOKENS,
                                     min_decoding_length=NEW_TOKENS, max_batch_size=0)
            body = np.array([[int(t[1:]) for t in r.hypotheses[0]] for r in res])
            return np.concatenate([np.full((len(ids), 1), pad), body], axis=1)
        return ct2.__version__, run
    if system in ("onnxruntime", "onnxruntime-int8"):
        ort = _need("onnxruntime", "ONNX Runtime")
        if model == "marian":
            raise _Skip("generation needs an ONNX export of the decoder with its KV cache "
                        "(optimum), which this benchmark does not build")
        onnx_path = _onnx_path(path, workdir, system)
        if not os.path.exists(onnx_path):
            raise _Skip(f"{onnx_path} is missing (the parent's --prepare step makes it)")
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])

        def run(ids, _):
            return sess.run(None, {"input_ids": ids.astype(np.int64)})[0]
        return ort.__version__, run
    raise ValueError(f"unknown system {system!r}")


def child(system, model, path, threads, repeats, workdir):
    """Run in the child process: one JSON object on stdout."""
    res = {"system": system, "model": model, "rows": []}
    try:
        t0 = time.perf_counter()
        version, run = _runner(system, model, path, threads, workdir)
        res["version"] = version
        res["load_s"] = time.perf_counter() - t0
    except _Skip as exc:
        res["skipped"] = str(exc)
        return res
    for title, a, b in MODEL_WORKS[model]:
        ids = _inputs(model, a, b, _vocab(path))
        beams = b if model == "marian" else 1
        out = np.asarray(run(ids, beams))                    # warm-up, and the output
        samples = []
        n = repeats if model == "marian" or a > 1 else repeats * 5
        for _ in range(n):
            t = time.perf_counter()
            run(ids, beams)
            samples.append(time.perf_counter() - t)
        name = os.path.join(workdir, f"out_{model}_{system}_{len(res['rows'])}.npy")
        np.save(name, out)
        res["rows"].append({"work": title, "samples_s": samples, "output": name})
    res["peak_rss"] = _peak_rss()
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    how = ap.add_mutually_exclusive_group(required=True)
    how.add_argument("--child", choices=SYSTEMS, help="time this system")
    how.add_argument("--prepare", choices=SYSTEMS, help="make the files this system loads")
    ap.add_argument("--model", choices=tuple(MODEL_WORKS), required=True)
    ap.add_argument("--path", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args(argv)
    if a.prepare:
        try:
            prepare(a.prepare, a.model, a.path, a.workdir)
        except _Skip as exc:          # the timed child says the same: nothing to do here
            print(f"# {exc}")
        return 0
    res = child(a.child, a.model, a.path, a.threads, a.repeats, a.workdir)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
