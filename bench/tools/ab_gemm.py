"""Two builds of the GEMM side by side in one process: is a change faster?

    python bench/tools/ab_gemm.py OLD_TREE NEW_TREE [--threads 2] [--shapes 1024x512x512,8x32000x512]
                            [--epilogue none|bias+gelu|bias+res] [--isa avx2] [--cold]

Like ab_attention.py: OLD_TREE and NEW_TREE are source trees built in place, both builds'
`_gemm` extensions are loaded into this process under different module names and called
alternately (host drift affects both alike), and their outputs must be byte-identical. Shapes
are MxNxK (x (M, K), W (N, K)). For M <= 32 each call takes the next of a ring of weight copies
larger than the L3, so the weights come from memory as in a decode step. With --cold every call
also takes the next of a ring of x, output and residual arrays (together >= 64 MiB), and of
weight copies, so that, as in a model's forward, no operand is in L2 when the call starts (the
output lands in memory last written long ago). Prints, per shape,
both medians and the median of the per-round speed ratios, with the CPU line.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/: _common
from _common import alternate, cpu_line, load_built_extension  # noqa: E402
from fastattn._ops import _aligned_empty  # noqa: E402

DEFAULT_SHAPES = ("8x512x512,8x2048x512,8x32000x512,32x512x512,32x2048x512,32x32000x512,"
                  "1024x512x512,1024x2048x512,1024x512x2048,4096x1536x384,4096x384x1536")


def _packed(mod, w):
    # 64-byte aligned, as fastattn._ops allocates them (NumPy's 16-byte start made a 32-byte
    # panel load straddle two cache lines by chance, differently for the two builds)
    wp = _aligned_empty((mod.packed_size(w.shape[0], w.shape[1], 4),), np.dtype(np.float32))
    mod.pack_weight(w, wp)
    return wp


def run_shape(mods, M, N, K, threads, rounds, rng, epilogue="none", cold=False):
    x = rng.standard_normal((M, K), dtype=np.float32)
    w = rng.standard_normal((N, K), dtype=np.float32)
    # the models' epilogues: bias + GELU (a BERT FFN's first layer), bias + residual (an
    # output projection, an FFN's second layer); the inputs scaled as in a real layer
    bias = rng.standard_normal(N, dtype=np.float32) if epilogue != "none" else None
    act = mods[0].ACTIVATIONS["gelu"] if epilogue == "bias+gelu" else 0
    res = rng.standard_normal((M, N), dtype=np.float32) if epilogue == "bias+res" else None
    if act:
        x *= 1 / np.sqrt(K)
    n_copies = max(1, -(-96 * 2**20 // (4 * N * K))) if M <= 32 else 1
    n_act = 1
    if cold:
        n_copies = max(n_copies, -(-64 * 2**20 // (4 * N * K)))
        n_act = max(2, -(-64 * 2**20 // (4 * M * (K + N * (2 if res is not None else 1)))))
    rings = [[_packed(m, w) for _ in range(n_copies)] for m in mods]
    xs = [x] + [x.copy() for _ in range(n_act - 1)]
    ress = [res] + [None if res is None else res.copy() for _ in range(n_act - 1)]
    ys = [[_aligned_empty((M, N), np.dtype(np.float32)) for _ in range(n_act)] for _ in mods]
    pos = [0, 0]

    def call(i):
        wp = rings[i][pos[i] % n_copies]
        a = pos[i] % n_act
        pos[i] += 1
        mods[i].gemm(xs[a], wp, N, bias, act, ress[a], ys[i][a], threads)

    for i in range(2):
        call(i)
    if not np.array_equal(ys[0][0], ys[1][0]):
        sys.exit(f"ab_gemm: the two builds' outputs differ at {M}x{N}x{K}")
    n = max(3, int(0.03 / (2 * M * N * K / 100e9)))         # ~30 ms per sample
    t_old, t_new = alternate(call, n, rounds)
    gf = 2e-9 * M * N * K
    print(f"{M}x{N}x{K}{'' if epilogue == 'none' else ' ' + epilogue}{' cold' if cold else ''}: old {1e3 * np.median(t_old):.3f} ms ({gf / np.median(t_old):.1f} "
          f"GFLOP/s), new {1e3 * np.median(t_new):.3f} ms ({gf / np.median(t_new):.1f} GFLOP/s), "
          f"new / old speed {np.median(t_old / t_new):.3f}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="MxNxK,...")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--epilogue", default="none", choices=["none", "bias+gelu", "bias+res"],
                    help="fused epilogue to time with the product (default: none)")
    ap.add_argument("--isa", default=None,
                    help="kernels to select in both builds (e.g. avx2 on an AVX-512 machine)")
    ap.add_argument("--cold", action="store_true",
                    help="rings of x, outputs, residuals and weights: no operand in L2 at a call's start")
    args = ap.parse_args(argv)
    mods = [load_built_extension(args.old, "_gemm", "ab_old"),
            load_built_extension(args.new, "_gemm", "ab_new")]
    if args.isa is not None:
        for m in mods:
            m.set_isa(args.isa)
    print(cpu_line(), f"GEMM kernels: {mods[0].isa()} / {mods[1].isa()}")
    print(f"float32, {args.threads} threads, {args.rounds} alternating rounds per shape; "
          f"blocking (MR, NR, KC): old {mods[0].blocking(4)}, new {mods[1].blocking(4)}; "
          f"outputs byte-identical{'; cold operands (rings of >= 64 MiB)' if args.cold else ''}")
    rng = np.random.default_rng(0)
    for s in args.shapes.split(","):
        M, N, K = (int(v) for v in s.split("x"))
        run_shape(mods, M, N, K, args.threads, args.rounds, rng, args.epilogue, args.cold)


if __name__ == "__main__":
    main()
