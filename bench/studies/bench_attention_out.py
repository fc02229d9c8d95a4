"""Where attention writes its output: the cost of out= layouts, one process, interleaved.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/studies/bench_attention_out.py [--shape 8x8x128x128x64]

q, k, v are the strided head views of one (B, L, 3, H, E) projection output, as in a model.
The output goes (a) to a fresh array, (b) to a preallocated (B, H, L, E) array, (c) side by
side into a (B, L, H * E) buffer starting on a 64-byte boundary (what the nn layers and models
pass), and (d) the same 16 bytes off a cache line, where the first and last line of every row
chunk is shared by two heads that two threads write at once. Medians in ms over interleaved
rounds, with the CPU line.
"""
import argparse
import os
import sys
import time

import numpy as np

import fastattn
from fastattn._ops import _aligned_empty

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/: _common
from _common import cpu_line  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="8x8x128x128x64", help="BxHxLxSxE (L = S)")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    B, H, L, S, E = (int(v) for v in args.shape.split("x"))
    if L != S:
        raise SystemExit("bench_attention_out: self-attention shapes only (L = S)")
    rng = np.random.default_rng(0)
    qkv = rng.standard_normal((B, L, 3, H, E), dtype=np.float32)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    contig = np.empty((B, H, L, E), np.float32)
    aligned = _aligned_empty((B, L, H * E), np.dtype(np.float32))
    raw = _aligned_empty((B * L * H * E + 16,), np.dtype(np.float32))
    off = raw[4:4 + B * L * H * E].reshape(B, L, H * E)            # 16 bytes past a line
    side = {name: buf.reshape(B, L, H, E).transpose(0, 2, 1, 3) for name, buf in
            (("side by side, aligned", aligned), ("side by side, 16 B off", off))}
    cases = {"fresh output": lambda: fastattn.scaled_dot_product_attention(q, k, v),
             "(B, H, L, E) out": lambda: fastattn.scaled_dot_product_attention(q, k, v, out=contig)}
    for name, o in side.items():
        cases[name] = (lambda o=o: fastattn.scaled_dot_product_attention(q, k, v, out=o))
    ref = cases["fresh output"]()
    for f in cases.values():
        f()
    for o in side.values():
        assert np.array_equal(o, ref)
    n = 30                                      # calls per round: ~30 ms at 128 tokens
    times = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, f in cases.items():
            t = time.perf_counter()
            for _ in range(n):
                f()
            times[name].append((time.perf_counter() - t) / n)
    print(cpu_line())
    print(f"{args.shape}, float32, q/k/v strided views of one projection; medians of {args.rounds} "
          f"interleaved rounds of {n} calls")
    base = np.median(times["(B, H, L, E) out"])
    for name, ts in times.items():
        print(f"  {name:<24} {1e3 * np.median(ts):.3f} ms  ({np.median(ts) / base:.2f}x the (B, H, L, E) out)")


if __name__ == "__main__":
    main()
