"""Decode-step attention (one query row, long keys): fastattn at 1 and 2 threads and NumPy.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_decode.py [BxHxLxSxE,...]

Medians (and minimums) of interleaved repeats in one process, float32. Prints the CPU flags.
"""
import statistics
import time

import numpy as np

import fastattn
from _common import cpu_line

SHAPES = [(1, 8, 1, 16384, 64), (1, 1, 1, 262144, 64), (16, 8, 1, 2048, 64), (1, 32, 1, 4096, 128)]
REPEATS = 30


def numpy_decode(q, k, v):
    s = (q @ np.swapaxes(k, -1, -2)) * (1.0 / np.sqrt(q.shape[-1]))
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return s @ v


def main():
    import sys
    shapes = SHAPES
    if len(sys.argv) > 1:      # e.g. 1x8x1x16384x64,1x1x1x262144x64
        shapes = [tuple(int(v) for v in s.split("x")) for s in sys.argv[1].split(",")]
    from fastattn._kernels import _attention as kernels
    print(f"CPU: {cpu_line()}; fastattn {fastattn.__version__} (kernels: {kernels.isa()}); "
          f"float32, medians of {REPEATS}")
    print("| B×H×L×S×E | fastattn 1 thread | fastattn 2 threads | NumPy | 2 threads vs NumPy |")
    print("|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for shape in shapes:
        B, H, L, S, E = shape
        q = rng.standard_normal((B, H, L, E), dtype=np.float32)
        k = rng.standard_normal((B, H, S, E), dtype=np.float32)
        v = rng.standard_normal((B, H, S, E), dtype=np.float32)
        # warm-up (a larger call first, so even an old build's cached workspace has room)
        fastattn.scaled_dot_product_attention(q, np.concatenate([k, k], -2), np.concatenate([v, v], -2))
        runs = {"t1": [], "t2": [], "np": []}
        for _ in range(REPEATS):
            for name, fn in (("t1", lambda: fastattn.scaled_dot_product_attention(q, k, v, n_threads=1)),
                             ("t2", lambda: fastattn.scaled_dot_product_attention(q, k, v, n_threads=2)),
                             ("np", lambda: numpy_decode(q, k, v))):
                t0 = time.perf_counter()
                fn()
                runs[name].append((time.perf_counter() - t0) * 1e3)
        med = {n: statistics.median(x) for n, x in runs.items()}
        mins = {n: min(x) for n, x in runs.items()}
        print(f"| {'×'.join(map(str, shape))} | {med['t1']:.3f} (min {mins['t1']:.3f}) | "
              f"{med['t2']:.3f} (min {mins['t2']:.3f}) | {med['np']:.3f} | {med['np'] / med['t2']:.2f}× |")


if __name__ == "__main__":
    main()
