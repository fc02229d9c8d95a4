"""Encoder-decoder generation: fastattn vs transformers generate vs CTranslate2 (float32).

A random Marian of the base shape (d_model 512, 6+6 layers, 8 heads, FFN 2048, vocab 32000,
tied embeddings), 8 sources x 128 tokens, EOS blocked (min length = max length) so that every
system makes exactly 64 tokens. Works: greedy batch 8, beam 4 batch 8, greedy batch 1.
Systems alternate inside one process; medians and minimums of the repeats are reported, with
token equality against transformers and the peak RSS of a fastattn-only child process.

Run (2 threads, OpenBLAS variables unset as the peers' figures were measured):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_NUM_THREADS=2 \
        python bench/bench_generate.py --repeats 5

--int8 times fastattn and CTranslate2 in float32 and in int8 (fastattn ``quantize="int8"``,
CTranslate2 ``compute_type="int8"``) instead, each system in a process of its own (the children
of ``fastattn bench --models``, fastattn.benchmark._model_child), on the same checkpoint and
works; an int8 system's tokens are compared with its own float32 system's. A fastattn build
without int8 prints "fastattn int8: not available in this build" and times the others.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from _common import ISA_CAPS, ISA_HELP, apply_isa, isa_line

apply_isa()                         # --isa NAME: every library's cap, before any of them loads
if "--torch-first" in sys.argv:     # users often import torch first: its libgomp then serves both
    import torch  # noqa: F401
import fastattn                     # by default first: fastattn's OpenMP settings win (PEERS.md)

D_MODEL, LAYERS, HEADS, FFN, VOCAB = 512, 6, 8, 2048, 32000
BATCH, SRC_LEN, NEW_TOKENS = 8, 128, 64
EOS, PAD = 0, VOCAB - 1
WORKS = [("greedy, batch 8", 8, 1), ("beam 4, batch 8", 8, 4), ("greedy, batch 1", 1, 1)]


def cpu_flags():
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                         "?")
    except OSError:
        model = "?"
    keep = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni",
                        "avx512_bf16", "amx_tile", "amx_int8") if f in flags]
    return model, keep


def loadavg():
    try:
        return open("/proc/loadavg").read().split()[:3]
    except OSError:
        return ["?"]


def build_checkpoint(path, seed=0):
    """Write the random base-shape Marian once (fastattn.benchmark._checkpoints.write_marian,
    shared with `fastattn bench --models`)."""
    from fastattn.benchmark._checkpoints import write_marian
    write_marian(path, seed=seed, vocab_size=VOCAB, d_model=D_MODEL, layers=LAYERS, heads=HEADS,
                 ffn=FFN)


def convert_ct2(hf_path, out_path):
    """CTranslate2's conversion (fastattn.benchmark._checkpoints.write_ct2_marian)."""
    from fastattn.benchmark._checkpoints import write_ct2_marian
    write_ct2_marian(hf_path, out_path)


def median_min(xs):
    return statistics.median(xs), min(xs)


def rss_child(path, threads):
    """Peak RSS of a fastattn-only process: after loading, and after beam 4 x batch 8."""
    code = (
        "import resource, numpy as np, fastattn\n"
        f"m = fastattn.Seq2SeqTransformer.from_pretrained({path!r})\n"
        "def rss(key='VmRSS'):\n"
        "    for ln in open('/proc/self/status'):\n"
        "        if ln.startswith(key):\n"
        "            return int(ln.split()[1]) * 1024\n"
        f"ids = np.random.default_rng(0).integers(1, {VOCAB - 1}, size=({BATCH}, {SRC_LEN}))\n"
        f"ids[:, -1] = {EOS}\n"
        "r0 = rss()\n"
        "open('/proc/self/clear_refs', 'w').write('5')   # peak RSS := current (drops the load peak)\n"
        f"m.generate(ids, max_new_tokens={NEW_TOKENS}, min_new_tokens={NEW_TOKENS}, num_beams=4,"
        f" n_threads={threads})\n"
        "peak = rss('VmHWM')   # ru_maxrss would include the parent's image before exec\n"
        "print(r0, peak)\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(fastattn.__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if out.returncode:
        return None
    r0, peak = map(int, out.stdout.split()[-2:])
    return r0, peak


def profile_step(hf_dir, threads, batch=8, beams=1, steps=NEW_TOKENS):
    """Where a decode step's time goes: the model's layers wrapped with timers, greedy decoding
    of `steps` tokens after a 128-token source; per-step milliseconds by component."""
    import fastattn.nn.attention as nn_attention
    import fastattn.nn.norm as nn_norm
    m = fastattn.Seq2SeqTransformer.from_pretrained(hf_dir)
    acc = {}

    def timed(name, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            r = fn(*a, **k)
            acc[name] = acc.get(name, 0.0) + time.perf_counter() - t0
            return r
        return wrapper

    class _TimedLinear:
        """A packed linear layer (fastattn.PackedLinear) whose calls are timed under `name`."""
        def __init__(self, name, lin):
            self._call = timed(name, lin.__call__)
            self._then_layer_norm = timed(name, lin._then_layer_norm)

        def __call__(self, *a, **k):
            return self._call(*a, **k)

    def time_module(module, name_of_rows):
        # the nn modules keep their packed weights in _pack_cache (key (weight, rows, ...)) and
        # the decode step's lookups in _fast (key: the projection, 0 q / 1 k / 2 v / 12 k,v /
        # None q,k,v, or a Linear's activation), which hold the same PackedLinear objects
        cache = module.__dict__.get("_pack_cache", {})
        timed_of = {}
        for key, (w, b, lin) in list(cache.items()):
            timed_of[id(lin)] = _TimedLinear(name_of_rows(key[1]), lin)
            cache[key] = (w, b, timed_of[id(lin)])
        fast = module.__dict__.get("_fast", {})
        for key, lin in list(fast.items()):
            if id(lin) in timed_of:
                fast[key] = timed_of[id(lin)]

    ids = np.random.default_rng(0).integers(1, VOCAB - 1, size=(batch, SRC_LEN))
    ids[:, -1] = EOS
    m.generate(ids, max_new_tokens=4, min_new_tokens=4, num_beams=beams, n_threads=threads)
    for L in m.decoder.layers:      # fastattn.nn.TransformerDecoderLayer
        time_module(L.self_attn, lambda rows: "self-attn q,k,v GEMM")
        time_module(L.self_attn.out_proj, lambda rows: "self-attn out GEMM")
        time_module(L.multihead_attn, lambda rows: "cross-attn q GEMM" if rows[0] == 0
                    else "cross-attn k,v GEMM (once per source)")
        time_module(L.multihead_attn.out_proj, lambda rows: "cross-attn out GEMM")
        time_module(L.ff.linear1, lambda rows: "FFN fc1 GEMM + activation")
        time_module(L.ff.linear2, lambda rows: "FFN fc2 GEMM")
    time_module(m.lm_head, lambda rows: "output projection (32000 x 512)")
    # the layers call the kernel through functional._attention_into (the checked public
    # function only when attention weights are asked for)
    orig_sdpa, orig_ln = nn_attention._attention_into, nn_norm._layer_norm_rows
    nn_attention._attention_into = timed("attention kernel (self + cross)", orig_sdpa)
    nn_norm._layer_norm_rows = timed("layer norms", orig_ln)
    orig_encode = m._encode

    def encode_excluded(*a, **k):
        # the encoder's attention and layer norms must not count as decode-step time
        before = dict(acc)
        t0 = time.perf_counter()
        r = orig_encode(*a, **k)
        for key in ("attention kernel (self + cross)", "layer norms"):
            acc[key] = before.get(key, 0.0)
        acc["encoder (once)"] = acc.get("encoder (once)", 0.0) + time.perf_counter() - t0
        return r
    m._encode = encode_excluded
    try:
        t0 = time.perf_counter()
        m.generate(ids, max_new_tokens=steps, min_new_tokens=steps, num_beams=beams,
                   n_threads=threads)
        total = time.perf_counter() - t0
    finally:
        nn_attention._attention_into, nn_norm._layer_norm_rows = orig_sdpa, orig_ln
    enc = acc.pop("encoder (once)", 0.0)
    once = acc.pop("cross-attn k,v GEMM (once per source)", 0.0)
    per_step = (total - enc - once) / steps
    print(f"\n## one decode step, batch {batch}, beams {beams} ({steps} steps, cache up to "
          f"{steps} positions); total {total:.2f} s, encoder {enc:.2f} s, cross k,v {once:.3f} s")
    print("| component | ms per step | share |")
    print("|---|---|---|")
    rest = per_step
    for k, v in sorted(acc.items(), key=lambda kv: -kv[1]):
        print(f"| {k} | {1000 * v / steps:.2f} | {100 * v / steps / per_step:.0f}% |")
        rest -= v / steps
    print(f"| embedding, cache writes, reshapes, processors, search (Python) | {1000 * rest:.2f} | "
          f"{100 * rest / per_step:.0f}% |")
    print(f"| **step** | {1000 * per_step:.2f} | 100% |")


INT8_SYSTEMS = ("fastattn", "ctranslate2", "fastattn-int8", "ctranslate2-int8")


def int8_run(args, hf_dir):
    """--int8: one child process per system (fastattn.benchmark._models.run_model)."""
    from fastattn.benchmark import _models
    model_name, flags = cpu_flags()
    print(f"# CPU: {model_name}; flags: {' '.join(flags)}; os.cpu_count()={os.cpu_count()}")
    print(f"# {isa_line()}")
    print(f"# loadavg before: {' '.join(loadavg())}; threads: {args.threads}; "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')}, "
          f"OPENBLAS_L2_SIZE={os.environ.get('OPENBLAS_L2_SIZE')}")
    print(f"# fastattn {fastattn.__version__}, numpy {np.__version__}; each system in a process "
          f"of its own; {args.repeats} timed calls per work after a warm-up")
    print(f"\n## Marian base shape ({BATCH} x {SRC_LEN} -> {NEW_TOKENS} tokens, batch 1 the "
          "first source), median ms per call")
    runs = _models.run_model("marian", hf_dir, INT8_SYSTEMS, args.threads, args.repeats,
                             args.dir)
    _models.report_model("marian", runs, sys.stdout)
    print(f"\n# loadavg after: {' '.join(loadavg())}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--torch-first", action="store_true",
                    help="import torch before fastattn (the other import order)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "fastattn_bench_marian"))
    ap.add_argument("--systems", default="fastattn,transformers,ct2")
    ap.add_argument("--works", default="0,1,2", help="indices into the work list")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--int8", action="store_true",
                    help="float32 and int8 of fastattn and CTranslate2, one process each")
    ap.add_argument("--isa", choices=list(ISA_CAPS), help=ISA_HELP)
    ap.add_argument("--profile-step", action="store_true",
                    help="only print where one decode step's time goes (fastattn)")
    args = ap.parse_args()
    systems = args.systems.split(",")
    works = [WORKS[int(i)] for i in args.works.split(",")]

    hf_dir = os.path.join(args.dir, "hf")
    ct2_dir = os.path.join(args.dir, "ct2")
    if not os.path.exists(os.path.join(hf_dir, "model.safetensors")):
        build_checkpoint(hf_dir)
    if args.int8:
        return int8_run(args, hf_dir)
    import torch
    torch.set_num_threads(args.threads)
    if "ct2" in systems and not os.path.exists(os.path.join(ct2_dir, "model.bin")):
        convert_ct2(hf_dir, ct2_dir)

    if args.profile_step:
        print(f"# loadavg before: {' '.join(loadavg())}; flags: {' '.join(cpu_flags()[1])}")
        print(f"# {isa_line()}")
        for _title, batch, beams in works:
            profile_step(hf_dir, args.threads, batch=batch, beams=beams)
        print(f"# loadavg after: {' '.join(loadavg())}")
        return
    model_name, flags = cpu_flags()
    print(f"# CPU: {model_name}; flags: {' '.join(flags)}; os.cpu_count()={os.cpu_count()}")
    print(f"# {isa_line()}")
    print(f"# loadavg before: {' '.join(loadavg())}; threads: {args.threads}; "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')}, "
          f"OPENBLAS_L2_SIZE={os.environ.get('OPENBLAS_L2_SIZE')}")
    print(f"# fastattn {fastattn.__version__}, torch {torch.__version__}, numpy {np.__version__}")

    rng = np.random.default_rng(0)
    src = rng.integers(1, VOCAB - 1, size=(BATCH, SRC_LEN))
    src[:, -1] = EOS

    runners = {}
    if "fastattn" in systems:
        fa = fastattn.Seq2SeqTransformer.from_pretrained(hf_dir)

        def run_fa(ids, beams):
            return fa.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                               num_beams=beams, n_threads=args.threads)
        runners["fastattn"] = run_fa
    if "transformers" in systems:
        from transformers import MarianMTModel
        hf = MarianMTModel.from_pretrained(hf_dir).eval()

        def run_hf(ids, beams):
            with torch.inference_mode():
                return hf.generate(torch.as_tensor(ids), max_new_tokens=NEW_TOKENS,
                                   min_new_tokens=NEW_TOKENS, num_beams=beams).numpy()
        runners["transformers"] = run_hf
    if "ct2" in systems:
        import ctranslate2
        tr = ctranslate2.Translator(ct2_dir, device="cpu", compute_type="float32",
                                    inter_threads=1, intra_threads=args.threads)

        def run_ct2(ids, beams):
            toks = [[f"t{i}" for i in row] for row in ids]
            res = tr.translate_batch(toks, beam_size=beams, max_decoding_length=NEW_TOKENS,
                                     min_decoding_length=NEW_TOKENS, max_batch_size=0)
            out = np.array([[int(t[1:]) for t in r.hypotheses[0]] for r in res])
            return np.concatenate([np.full((len(ids), 1), PAD), out], axis=1)
        runners["ct2"] = run_ct2

    results = {}
    for title, batch, beams in works:
        ids = src[:batch]
        times = {s: [] for s in runners}
        outs = {}
        for s, fn in runners.items():          # warm-up (and the outputs compared)
            outs[s] = fn(ids, beams)
            time.sleep(0.15)
        for _ in range(args.repeats):
            for s, fn in runners.items():
                t0 = time.perf_counter()
                fn(ids, beams)
                times[s].append(time.perf_counter() - t0)
                time.sleep(0.15)
        row = {}
        for s in runners:
            med, mn = median_min(times[s])
            eq = None
            if "transformers" in outs and s != "transformers":
                a, b = outs[s], outs["transformers"]
                if a.shape == b.shape:
                    eq = f"{int((a[:, 1:] == b[:, 1:]).sum())}/{b[:, 1:].size}"
                else:
                    eq = f"shape {a.shape} vs {b.shape}"
            row[s] = {"median_s": med, "min_s": mn, "tokens_equal_to_transformers": eq,
                      "shape": list(outs[s].shape)}
        results[title] = row
        print(f"\n## {title} ({batch} x {SRC_LEN} -> {NEW_TOKENS} tokens)")
        print("| system | median s | min s | ms per token step | tokens equal to transformers |")
        print("|---|---|---|---|---|")
        for s, r in row.items():
            print(f"| {s} | {r['median_s']:.3f} | {r['min_s']:.3f} | "
                  f"{1000 * r['median_s'] / NEW_TOKENS:.1f} | {r['tokens_equal_to_transformers']} |")
    print(f"\n# loadavg after: {' '.join(loadavg())}")
    print(f"# peak RSS of this process: "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    if "fastattn" in systems:
        r = rss_child(hf_dir, args.threads)
        if r:
            print(f"# fastattn alone: RSS after loading {r[0] / 2**20:.0f} MiB, peak after beam 4 x "
                  f"batch 8 {r[1] / 2**20:.0f} MiB (+{(r[1] - r[0]) / 2**20:.0f} MiB)")
            results["rss"] = {"loaded": r[0], "peak_beam4_b8": r[1]}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
