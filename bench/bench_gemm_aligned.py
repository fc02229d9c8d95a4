"""Paired before/after of the 64-byte-aligned GEMM buffers, in one process (results bitwise equal).

    PYTHONPATH=. [T=1] [R=9] [ISA=avx2] python bench/bench_gemm_aligned.py [MxNxK ...]

"before" packs W and allocates y with plain np.empty (what _ops did before; also what it does
under the sanitizer, _ops._EXACT_ALLOC = True), "after" with _ops._aligned_empty. Both against
np.matmul(x, W.T) with threadpoolctl.threadpool_limits(T), interleaved rounds, medians; 1 thread
is timed with time.thread_time (the machine is shared), more with perf_counter.
"""
import os
import sys
import time

import numpy as np
from threadpoolctl import threadpool_limits

from fastattn import _ops
from fastattn._kernels import _gemm

SHAPES = [(1024, 512, 512), (1024, 1536, 512), (1024, 2048, 512), (1024, 512, 2048),
          (2048, 512, 512), (2048, 1536, 512), (2048, 2048, 512), (2048, 512, 2048),
          (8, 2048, 512), (32, 1536, 512)]


def main():
    if os.environ.get("ISA"):
        _gemm.set_isa(os.environ["ISA"])
    T = int(os.environ.get("T", "1"))
    R = int(os.environ.get("R", "9"))
    shapes = [tuple(map(int, a.split("x"))) for a in sys.argv[1:]] or SHAPES
    clk = time.thread_time if T == 1 else time.perf_counter
    rng = np.random.default_rng(0)
    load = open("/proc/loadavg").read().strip()
    print(f"# isa {_gemm.isa()} {_gemm.blocking(4)} threads {T} clock {clk.__name__}; "
          f"medians of {R} interleaved rounds; loadavg {load}")
    print("| M | N | K | before ms | after ms | NumPy ms | before GF/s | after GF/s | NumPy GF/s"
          " | before/NumPy | after/NumPy | after/before |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

    def tm(fn):
        t0 = clk()
        fn()
        n = max(1, int(0.03 / max(1e-6, clk() - t0)))
        t0 = clk()
        for _ in range(n):
            fn()
        return (clk() - t0) / n

    for M, N, K in shapes:
        x = rng.standard_normal((M, K)).astype(np.float32)
        w = rng.standard_normal((N, K)).astype(np.float32)
        _ops._EXACT_ALLOC = True
        lb = _ops.PackedLinear(w)
        _ops._EXACT_ALLOC = False
        la = _ops.PackedLinear(w)
        wt = np.ascontiguousarray(w.T)

        def before():
            _ops._EXACT_ALLOC = True
            return lb(x, n_threads=T)

        def after():
            _ops._EXACT_ALLOC = False
            return la(x, n_threads=T)

        assert np.array_equal(before(), after())
        b, a, n_ = [], [], []
        with threadpool_limits(T):
            for _ in range(R):
                b.append(tm(before))
                time.sleep(0.02)
                a.append(tm(after))
                time.sleep(0.02)
                n_.append(tm(lambda: np.matmul(x, wt)))
                time.sleep(0.02)
        _ops._EXACT_ALLOC = False
        b, a, n_ = map(np.median, (b, a, n_))
        gf = 2 * M * N * K / 1e9
        print(f"| {M} | {N} | {K} | {b * 1e3:.3f} | {a * 1e3:.3f} | {n_ * 1e3:.3f} | "
              f"{gf / b:.1f} | {gf / a:.1f} | {gf / n_:.1f} | {n_ / b:.2f} | {n_ / a:.2f} | "
              f"{b / a:.2f} |")
    print(f"# loadavg after {open('/proc/loadavg').read().strip()}")


if __name__ == "__main__":
    main()
