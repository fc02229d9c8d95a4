"""Batch-1 latency after a pause, with and without fastattn's worker placement (fa_team.h).

A search service calls the encoder once per query, with idle time in between. On small virtual
machines the kernel may wake an idle OpenMP worker on the CPU its master runs on and leave both
there (see fa_team.h); this measures what a caller sees. Model: the all-MiniLM-L6-v2 shape (6
layers, hidden 384, 12 heads, exact GELU), random weights written by transformers; input 1 x 16
tokens; float32, 2 threads. Each setting runs in its own child process (placement is decided
once per process), alternating, twice; per child: `warm` = calls back to back, `after pause`
= each call after a sleep of --pause seconds.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/studies/bench_idle_latency.py
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/: _common
from _common import cpu_line, fastattn_origin  # noqa: E402


def _model_dir():
    path = os.path.join(tempfile.gettempdir(), "fastattn_bench_idle_minilm")
    if not os.path.exists(os.path.join(path, "config.json")):
        import torch
        import transformers
        cfg = transformers.BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6,
                                      num_attention_heads=12, intermediate_size=1536,
                                      hidden_act="gelu", layer_norm_eps=1e-12)
        torch.manual_seed(0)
        transformers.BertModel(cfg, add_pooling_layer=False).eval().save_pretrained(path)
    return path


def _child(args):
    import numpy as np
    import fastattn
    fastattn.set_num_threads(args.threads)
    enc = fastattn.EncoderModel.from_pretrained(args.model)
    ids = np.random.default_rng(0).integers(1000, 30000, (1, 16))
    mask = np.ones_like(ids)
    for _ in range(5):
        enc(ids, attention_mask=mask)
    for label, pause in (("warm", 0.0), ("after pause", args.pause)):
        ts = []
        for _ in range(args.calls):
            if pause:
                time.sleep(pause)
            t0 = time.perf_counter()
            enc(ids, attention_mask=mask)
            ts.append(time.perf_counter() - t0)
        ts.sort()
        print(f"RESULT placement={os.environ['FASTATTN_THREAD_PLACEMENT']} {label}: median "
              f"{statistics.median(ts) * 1e3:.2f} ms, min {ts[0] * 1e3:.2f}, p90 "
              f"{ts[int(0.9 * (len(ts) - 1))] * 1e3:.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pause", type=float, default=0.15)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.model:
        return _child(args)
    print(f"# {cpu_line()}")
    print(f"# {fastattn_origin()}")
    print(f"# EncoderModel, MiniLM-L6 shape, 1 x 16 tokens, float32, {args.threads} threads; "
          f"{args.calls} calls per setting, pause {args.pause} s")
    model = _model_dir()
    here = os.path.abspath(__file__)
    for _ in range(args.rounds):
        for setting in ("0", "1"):
            env = dict(os.environ, FASTATTN_THREAD_PLACEMENT=setting)
            res = subprocess.run([sys.executable, here, "--model", model, "--pause",
                                  str(args.pause), "--calls", str(args.calls), "--threads",
                                  str(args.threads)], env=env, capture_output=True, text=True)
            sys.stdout.write(res.stdout)
            if res.returncode:
                sys.stdout.write(res.stderr[-2000:])
                return res.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
