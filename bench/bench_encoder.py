"""A sentence-embedding encoder: fastattn.EncoderModel vs transformers' BertModel (torch), side by
side, optionally ONNX Runtime on the same model exported with torch.onnx.

Systems: the last hidden state (transformers BertModel, fastattn EncoderModel, ONNX Runtime),
and sentence vectors (mean pooling + L2 normalisation: torch ops after BertModel, and
EncoderModel.embed, which skips padding tokens in the dense layers).

Model: the all-MiniLM-L6-v2 shape (6 layers, hidden 384, 12 heads, intermediate 1536, exact
GELU, LayerNorm eps 1e-12), random weights written by transformers and read back by
EncoderModel.from_pretrained. Inputs: batch 32 x 128 tokens (full rows; and padded rows of
64..128 real tokens) and batch 1 x 16 tokens (a search query). float32, the same number of
threads everywhere. Timed runs alternate between the systems with a ~0.15 s sleep in between;
medians (and minimums) are reported. Each import order (torch first, fastattn first) runs in its own child process.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_encoder.py [--onnx] [--profile]

--int8 times the last hidden state of 32 x 128 and 1 x 16 tokens (the same checkpoint) with
fastattn, CTranslate2 and ONNX Runtime in float32 and in int8 instead (fastattn
``quantize="int8"``, CTranslate2 ``compute_type="int8"``, ONNX Runtime on
``quantize_dynamic``'s copy of the export), each system in a process of its own (the children
of ``fastattn bench --models``, fastattn.benchmark._model_child); an int8 system's output is
compared with its own float32 system's. A fastattn build without int8 prints "fastattn int8:
not available in this build" and times the others.
"""
import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from _common import ISA_CAPS, ISA_HELP, apply_isa, isa_line


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return "?", "?"
    model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines()
                  if ln.startswith("model name")), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines()
                  if ln.startswith("flags")), [])
    keep = sorted(f for f in flags if f.startswith(("avx", "fma", "amx", "f16c", "sse4")))
    return model, " ".join(keep)


def _child(args):
    # the import order under test
    if args.order == "torch-first":
        import torch
        import fastattn
    else:
        import fastattn
        import torch
    import numpy as np
    import transformers
    from threadpoolctl import threadpool_info, threadpool_limits

    import fastattn._ops as ops
    from fastattn.models import encoder as enc_mod
    from fastattn.nn import attention as attn_mod

    th = args.threads
    torch.set_num_threads(th)
    fastattn.set_num_threads(th)
    threadpool_limits(limits=th, user_api="blas")
    from _common import fastattn_origin
    print(f"## child: import order {args.order}; {fastattn_origin()}")
    print(f"## child: import order {args.order}; {isa_line()}")
    print(f"## child: import order {args.order}; torch {torch.__version__} threads "
          f"{torch.get_num_threads()}, fastattn {fastattn.__version__} kernel threads "
          f"{fastattn.get_num_threads()}, transformers {transformers.__version__}, numpy "
          f"{np.__version__}")
    for lib in threadpool_info():
        print(f"##   threadpool: {lib.get('user_api')} {lib.get('internal_api')} "
              f"{lib.get('version')} arch={lib.get('architecture')} "
              f"threads={lib.get('num_threads')}")

    # the MiniLM-shaped random checkpoint `fastattn bench --models` uses too
    from fastattn.benchmark._checkpoints import write_bert
    tmp = tempfile.mkdtemp(prefix="bench_encoder_")
    write_bert(tmp, seed=0)
    tm = transformers.BertModel.from_pretrained(tmp, add_pooling_layer=False).eval()
    fm = fastattn.EncoderModel.from_pretrained(tmp)

    ort_sess = None
    if args.onnx:
        try:
            import onnxruntime as ort
            path = os.path.join(tmp, "model.onnx")
            class _Hidden(torch.nn.Module):      # positional (ids, mask) -> hidden state
                def __init__(self, m):
                    super().__init__()
                    self.m = m

                def forward(self, input_ids, attention_mask):
                    return self.m(input_ids=input_ids,
                                  attention_mask=attention_mask).last_hidden_state

            ex_ids = torch.ones((2, 8), dtype=torch.long)
            ex_mask = torch.ones_like(ex_ids)
            ex_mask[1, 5:] = 0
            torch.onnx.export(_Hidden(tm).eval(), (ex_ids, ex_mask), path,
                              input_names=["input_ids", "attention_mask"],
                              output_names=["last_hidden_state"],
                              dynamic_axes={"input_ids": {0: "b", 1: "s"},
                                            "attention_mask": {0: "b", 1: "s"},
                                            "last_hidden_state": {0: "b", 1: "s"}},
                              opset_version=17, dynamo=False)
            so = ort.SessionOptions()
            so.intra_op_num_threads = th
            so.inter_op_num_threads = 1
            ort_sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            print(f"##   onnxruntime {ort.__version__}, intra-op threads {th}")
        except Exception as exc:  # report and go on without the peer
            print(f"##   ONNX Runtime skipped: {type(exc).__name__}: {exc}")

    rng = np.random.default_rng(0)
    # (B, S, padded): full rows, then rows of 64..128 real tokens (a sorted-free, padded
    # batch as a tokenizer pads it), then a single short query
    shapes = [(32, 128, False), (32, 128, True), (1, 16, False)]
    for B, S, pad in shapes:
        ids = rng.integers(1000, 30000, (B, S))
        mask = np.ones((B, S), dtype=np.int64)
        if pad:
            for b, n in enumerate(rng.integers(64, S + 1, B)):
                mask[b, n:] = 0
                ids[b, n:] = 0
        ids_t, mask_t = torch.from_numpy(ids), torch.from_numpy(mask)
        label = f"{B}x{S}" + (" padded" if pad else "")

        def run_torch():
            with torch.inference_mode():
                return tm(input_ids=ids_t, attention_mask=mask_t).last_hidden_state

        def run_fa():
            return fm(ids, attention_mask=mask)

        def embed_torch():      # sentence-transformers' mean pooling + Normalize, in torch
            with torch.inference_mode():
                h = tm(input_ids=ids_t, attention_mask=mask_t).last_hidden_state
                m = mask_t[..., None].to(h.dtype)
                v = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
                return torch.nn.functional.normalize(v, dim=1)

        def embed_fa():
            return fm.embed(ids, attention_mask=mask)

        systems = [("transformers (torch)", run_torch), ("fastattn", run_fa)]
        if ort_sess is not None:
            feed = {"input_ids": ids, "attention_mask": mask}
            systems.append(("onnxruntime", lambda: ort_sess.run(None, feed)[0]))
        if not args.no_embed:
            systems += [("torch embed", embed_torch), ("fastattn embed", embed_fa)]

        # parity on this batch (real tokens only) and warm-up
        ref = run_torch().numpy()
        valid = mask.astype(bool)
        for name, fn in systems[1:]:
            if "embed" in name:
                continue
            out = np.asarray(fn())
            err = np.abs(out - ref)[valid].max() / np.abs(ref[valid]).max()
            print(f"##   {label}: {name} vs torch, max rel err {err:.2e}")
        if not args.no_embed:
            err = np.abs(embed_fa() - embed_torch().numpy()).max()
            print(f"##   {label}: fastattn embed vs torch embed, max abs err {err:.2e}")
        for _, fn in systems:
            fn()
        times = {name: [] for name, _ in systems}
        repeats = args.repeats if B > 1 else args.repeats * 5
        for _ in range(repeats):
            for name, fn in systems:
                time.sleep(0.15)
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        for name, ts in times.items():
            base = statistics.median(times["torch embed" if "embed" in name
                                           else "transformers (torch)"])
            med = statistics.median(ts)
            print(f"RESULT order={args.order} batch={label!r} system={name!r} "
                  f"median_ms={med * 1e3:.2f} min_ms={min(ts) * 1e3:.2f} n={len(ts)} "
                  f"speedup_vs_torch={base / med:.2f}")

        if args.profile:
            spent = {}

            def timed(name, fn):
                def wrapper(*a, **k):
                    t0 = time.perf_counter()
                    r = fn(*a, **k)
                    spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0
                    return r
                return wrapper
            # (object, attribute, label): the linear layers without and with the post-norm
            # LayerNorm fused into their GEMM, attention, the embedding layer
            hooks = [(ops.PackedLinear, "__call__", "linear (GEMM + bias, activation, residual)"),
                     (ops.PackedLinear, "_then_layer_norm",
                      "linear + residual + LayerNorm (fused)"),
                     (attn_mod, "_attention_into", "attention"),
                     (attn_mod, "scaled_dot_product_attention", "attention (weights out)"),
                     (enc_mod.EncoderModel, "_embeddings", "embeddings (gather + LayerNorm)")]
            saved = [getattr(obj, attr) for obj, attr, _ in hooks]
            for (obj, attr, label_), fn in zip(hooks, saved):
                setattr(obj, attr, timed(label_, fn))
            try:
                n = 3
                t0 = time.perf_counter()
                for _ in range(n):
                    run_fa()
                total = (time.perf_counter() - t0) / n
            finally:
                for (obj, attr, _), fn in zip(hooks, saved):
                    setattr(obj, attr, fn)
            parts = ", ".join(f"{k} {v / n * 1e3:.1f} ms ({v / n / total:.0%})"
                              for k, v in sorted(spent.items(), key=lambda kv: -kv[1]))
            print(f"##   profile {label}: total {total * 1e3:.1f} ms: {parts}")
    return 0


INT8_SYSTEMS = ("fastattn", "ctranslate2", "onnxruntime", "fastattn-int8", "ctranslate2-int8",
                "onnxruntime-int8")


def _int8_run(args):
    """--int8: one child process per system (fastattn.benchmark._models.run_model)."""
    from fastattn.benchmark import _models
    from _common import fastattn_origin
    workdir = os.path.join(tempfile.gettempdir(), "fastattn_bench_encoder_int8")
    os.makedirs(workdir, exist_ok=True)
    path = _models.build(workdir, "encoder")
    print(f"# {fastattn_origin()}; each system in a process of its own; {args.repeats} timed "
          f"calls at 32x128 ({5 * args.repeats} at 1x16) after a warm-up")
    print("\n## last hidden state, median ms per call")
    runs = _models.run_model("encoder", path, INT8_SYSTEMS, args.threads, args.repeats, workdir)
    _models.report_model("encoder", runs, sys.stdout)
    with open("/proc/loadavg") as f:
        print(f"# loadavg after: {f.read().strip()}")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    # 9, not 5: the host's speed swings by +-10% between rounds; with 5 samples per system
    # one run's fastattn / torch ratio moved by as much (runs 11-13: 1.38-1.63)
    ap.add_argument("--repeats", type=int, default=9,
                    help="timed runs per system at 32x128 (5x that at 1x16)")
    ap.add_argument("--onnx", action="store_true", help="add ONNX Runtime (torch.onnx export)")
    ap.add_argument("--profile", action="store_true", help="break fastattn's time down by op")
    ap.add_argument("--no-embed", action="store_true",
                    help="time the hidden state only (no pooled-embedding systems)")
    ap.add_argument("--int8", action="store_true",
                    help="float32 and int8 of fastattn, CTranslate2, ONNX Runtime, one process "
                         "each")
    ap.add_argument("--isa", choices=list(ISA_CAPS), help=ISA_HELP)
    ap.add_argument("--order", choices=["torch-first", "fastattn-first"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.isa:
        apply_isa(["--isa", args.isa])   # before any library loads; the children inherit it
    if args.order:
        return _child(args)

    model, flags = _cpu_flags()
    with open("/proc/loadavg") as f:
        load = f.read().strip()
    print(f"# python {platform.python_version()}  {platform.platform()}")
    print(f"# cpu: {model}; {os.cpu_count()} logical CPUs; flags: {flags}")
    print(f"# {isa_line()}")
    print(f"# loadavg before: {load}")
    print(f"# OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')} "
          f"OPENBLAS_L2_SIZE={os.environ.get('OPENBLAS_L2_SIZE')}")
    print("# model: BERT 6 layers, hidden 384, 12 heads, intermediate 1536, exact GELU, "
          "eps 1e-12, float32; threads", args.threads)
    if args.int8:
        return _int8_run(args)
    rc = 0
    here = os.path.abspath(__file__)
    passthrough = [a for a in (argv if argv is not None else sys.argv[1:])]
    for order in ("torch-first", "fastattn-first"):
        res = subprocess.run([sys.executable, here, *passthrough, "--order", order],
                             capture_output=True, text=True)
        sys.stdout.write(res.stdout)
        if res.returncode:
            sys.stdout.write(res.stderr[-3000:])
            rc = res.returncode
    with open("/proc/loadavg") as f:
        print(f"# loadavg after: {f.read().strip()}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
