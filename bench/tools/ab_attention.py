"""Two builds of the attention kernel side by side in one process: is a change faster?

    python bench/tools/ab_attention.py OLD_TREE NEW_TREE [--threads 2] [--causal] [--shape 8x8x128x128x64]

OLD_TREE and NEW_TREE are source trees built in place (`python setup.py build_ext --inplace`),
e.g. a `git archive` of the previous commit and the working tree. Both builds'
`_attention` extensions are loaded into this process under different module names and called
alternately, so the host's state (on a shared VM it drifts by +-30% within minutes) affects both
alike; separate processes cannot tell a 5% change from that drift. The outputs must be
byte-identical (a kernel change that moves bits is reported and stops the run). Prints both
medians and the median of the per-round speed ratios, with the CPU line.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/: _common
from _common import alternate, cpu_line, load_built_extension  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--shape", default="8x8x128x128x64", help="BxHxLxSxE")
    ap.add_argument("--rounds", type=int, default=25)
    args = ap.parse_args(argv)
    B, H, L, S, E = (int(x) for x in args.shape.split("x"))
    mods = [load_built_extension(args.old, "_attention", "ab_old"),
            load_built_extension(args.new, "_attention", "ab_new")]
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, H, L, E), dtype=np.float32)
    k = rng.standard_normal((B, H, S, E), dtype=np.float32)
    v = rng.standard_normal((B, H, S, E), dtype=np.float32)
    outs = [np.empty((B, H, L, E), np.float32) for _ in mods]
    scale = 1.0 / np.sqrt(E)

    def call(i):
        mods[i].sdpa(q, k, v, None, outs[i], None, (B, H), args.causal, scale, 1, args.threads)

    for i in range(2):
        call(i)
    if not np.array_equal(outs[0], outs[1]):
        sys.exit("ab_attention: the two builds' outputs differ")
    n = max(3, int(0.03 / (4 * B * H * L * S * E / 60e9)))     # ~30 ms per sample
    t_old, t_new = alternate(call, n, args.rounds)
    print(cpu_line())
    print(f"{args.shape}{' causal' if args.causal else ''}, float32, {args.threads} threads, "
          f"{args.rounds} alternating rounds of {n} calls: old {1e3 * np.median(t_old):.3f} ms, "
          f"new {1e3 * np.median(t_new):.3f} ms, new / old speed (median of rounds) "
          f"{np.median(t_old / t_new):.3f}; outputs byte-identical")


if __name__ == "__main__":
    main()
