"""Two builds of fastattn side by side on the models' workloads, each run in a process of its own.

    python bench/tools/ab_models.py OLD_TREE NEW_TREE [--rounds 3] [--works transformer,greedy8,...]
        [--repeats N]    timed calls per run (default: per work)

OLD_TREE and NEW_TREE are source trees with their extensions built in place
(``python setup.py build_ext --inplace``). Each round runs every workload once per build, the
builds alternating (old, new, new, old, ...) so that a slow phase of the host hits both; a run is
a fresh interpreter that builds the model (random weights, fixed seeds), warms up, and reports
the median and minimum of its timed repeats. Printed: per workload the medians over rounds of each
build, the ratio old / new (> 1: the new build is faster), and the ratio of the two builds'
fastest calls over all rounds (on a shared machine, the figure least touched by other load).
Workloads (2 threads, float32; --quantize int8 / bfloat16 the same models quantized):

- transformer: nn.Transformer(d_model=512, nhead=8), 6 + 6 layers, forward 8 x 128 -> 8 x 128
- greedy8 / beam4 / greedy1: the base Marian shape (vocab 32000), random unit-scale weights,
  128-token sources, 64 new tokens: greedy batch 8, beam 4 batch 8, greedy batch 1
- encoder32 / encoder1: the all-MiniLM-L6-v2 shape (6 layers, 384 wide, 12 heads), embed 32 x
  128 and 1 x 16
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(r'''
import json, os, sys, tempfile, time
import numpy as np
import fastattn as fa
work, repeats = sys.argv[1], int(sys.argv[2])
Q = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] != "none" else None
fa.set_num_threads(2)
rng = np.random.default_rng(0)

def unit_weights(m, dt=np.float32):
    sd = m.state_dict()
    r = np.random.default_rng(1)
    new = {}
    for k, w in sd.items():
        if k.endswith("layer_norm.weight"):
            new[k] = (1 + 0.1 * r.standard_normal(w.shape)).astype(dt)
        elif w.ndim == 1 or k == "final_logits_bias":
            new[k] = (0.1 * r.standard_normal(w.shape)).astype(dt)
        else:
            new[k] = (r.standard_normal(w.shape) / np.sqrt(w.shape[-1])).astype(dt)
    m.load_state_dict(new)
    return m

if work == "transformer":
    m = fa.Transformer(d_model=512, nhead=8, seed=0)
    if Q:
        m.quantize_(Q)
    src = rng.standard_normal((8, 128, 512), dtype=np.float32)
    tgt = rng.standard_normal((8, 128, 512), dtype=np.float32)
    run = lambda: m(src, tgt, tgt_is_causal=True)
elif work in ("greedy8", "beam4", "greedy1"):
    m = unit_weights(fa.Seq2SeqTransformer(tie_word_embeddings=False, seed=0))
    if Q:
        m = fa.Seq2SeqTransformer.from_state_dict(m.state_dict(), quantize=Q,
                                                  **{k: v for k, v in m.config.items()
                                                     if k not in ("dtype", "quantize")})
    B = 1 if work == "greedy1" else 8
    ids = rng.integers(1, 31999, size=(B, 128))
    ids[:, -1] = 0
    beams = 4 if work == "beam4" else 1
    run = lambda: m.generate(ids, max_new_tokens=64, min_new_tokens=64, num_beams=beams)
else:
    sys.path.insert(0, os.path.join(os.environ["AB_REPO"], "tests", "models"))
    from encoder_checkpoints import write_numpy_bert
    d = tempfile.mkdtemp()
    write_numpy_bert(d, vocab_size=30522, hidden_size=384, num_hidden_layers=6,
                     num_attention_heads=12, intermediate_size=1536,
                     max_position_embeddings=512)
    m = fa.EncoderModel.from_pretrained(d, quantize=Q)
    B, S = (32, 128) if work == "encoder32" else (1, 16)
    ids = rng.integers(1000, 30000, size=(B, S))
    mask = np.ones_like(ids)
    run = lambda: m.embed(ids, attention_mask=mask)
run(); run()
ts = []
for _ in range(repeats):
    t0 = time.perf_counter(); run(); ts.append(time.perf_counter() - t0)
ts.sort()
print(json.dumps({"where": os.path.dirname(os.path.dirname(fa.__file__)),
                  "median_ms": 1e3 * ts[len(ts) // 2], "min_ms": 1e3 * ts[0]}))
''')

QUANTIZE = "none"
REPEATS = {"transformer": 5, "greedy8": 3, "beam4": 3, "greedy1": 5, "encoder32": 7,
           "encoder1": 201}


def run(tree, work, repeats):
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree),
               AB_REPO=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    out = subprocess.run([sys.executable, "-c", CHILD, work, str(repeats), QUANTIZE], env=env,
                         capture_output=True, text=True, cwd="/")
    if out.returncode:
        raise SystemExit(f"{tree} {work} failed:\n{out.stderr[-2000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if os.path.realpath(res["where"]) != os.path.realpath(tree):
        raise SystemExit(f"{tree}: imported fastattn from {res['where']}")
    return res["median_ms"], res["min_ms"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--works", default=",".join(REPEATS))
    ap.add_argument("--repeats", type=int, help="timed calls per run (default: per work)")
    ap.add_argument("--quantize", choices=["none", "int8", "bfloat16"], default="none",
                    help="the models' quantize (default none: float32)")
    args = ap.parse_args()
    global QUANTIZE
    QUANTIZE = args.quantize
    flags = sorted({f for ln in open("/proc/cpuinfo") if ln.startswith("flags")
                    for f in ln.split()[2:] if f.startswith(("avx", "amx", "fma"))})
    print("CPU flags:", " ".join(flags))
    print(f"old = {args.old}\nnew = {args.new}\nrounds = {args.rounds}, 2 threads, "
          f"quantize={args.quantize}, "
          "each run a fresh process, medians of its repeats")
    print(f"{'work':12s} {'old ms':>10s} {'new ms':>10s} {'old/new':>8s} {'min o/n':>8s}   "
          "per round (old/new)")
    for work in args.works.split(","):
        olds, news = [], []
        for r in range(args.rounds):
            pair = [(args.old, olds), (args.new, news)]
            for tree, acc in (pair if r % 2 == 0 else pair[::-1]):
                acc.append(run(tree, work, args.repeats or REPEATS[work]))
        o, n = (statistics.median(m for m, _ in runs) for runs in (olds, news))
        lo = min(m for _, m in olds) / min(m for _, m in news)
        per = " ".join(f"{a[0] / b[0]:.3f}" for a, b in zip(olds, news))
        print(f"{work:12s} {o:10.2f} {n:10.2f} {o / n:8.3f} {lo:8.3f}   {per}", flush=True)


if __name__ == "__main__":
    main()
