"""fastattn's packed-weight GEMM vs NumPy's ``@`` (OpenBLAS), float32, side by side in one process.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_gemm.py [--threads 2]
        [--torch] [--minilm]

For each shape: y = x @ W.T with x (M, K), W (N, K) (the linear layer; fastattn packs W once,
outside the timed region, as PackedLinear does). Warm-up first, then REPEATS interleaved rounds
(fastattn, sleep, NumPy, sleep) so that both see the same machine state; medians (and minimums)
reported. The sleep lets the other library's spinning worker threads go idle first (on 2
cores they steal the core the next call needs); each sample then starts with one untimed call,
which wakes the idle threads, and times calls back to back, as a model's linear layers run.
For small M the work is reading the weights: each call reads the next of a ring of weight
copies larger than the L3 (from DRAM, as in a decode step through a whole model), and GB/s of
weight reading is shown beside a bandwidth measured here (a large np.copyto, counted as
read + write). Also: exact GELU on 4096 x 1536 float32 vs torch.nn.functional.gelu.

--torch adds torch.mm (torch's CPU wheel: Intel MKL's SGEMM), the GEMM inside every torch model
fastattn is compared with, as a third system in the same rounds; --minilm adds the shapes of a
6-layer / 384 sentence encoder at batch 32 x 128 tokens (M = 4096; q,k,v fused N = 1152).
"""
import argparse
import os
import platform
import time

import numpy as np

SHAPES = [(M, N, K) for M in (8, 32, 1024, 2048)
          for (N, K) in ((512, 512), (1536, 512), (2048, 512), (512, 2048))]
SHAPES += [(8, 32000, 512), (32, 32000, 512)]
MINILM_SHAPES = [(4096, 1152, 384), (4096, 384, 384), (4096, 1536, 384), (4096, 384, 1536)]
REPEATS = 9
PAUSE = 0.15


def _cpu_header():
    flags = ""
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = " ".join(sorted(t for t in line.split(":", 1)[1].split()
                                            if t.startswith(("avx", "fma", "f16c", "amx"))))
                    break
    except OSError:
        pass
    try:
        load = open("/proc/loadavg").read().strip()
    except OSError:
        load = "n/a"
    return model, flags, load


def _timed(fn, n=1, warm=1, warm_s=0.004):
    """Seconds per call over n back-to-back calls, after at least `warm` untimed calls lasting
    at least `warm_s` seconds together: after the pause between systems every library's worker
    threads (and their vCPUs) are idle, and waking them cost ~1-3 ms per call for the first
    few calls on some hosts (a Zen 3 VM: 4-8x the M = 8 GEMM itself; one warm call was not
    enough there on 2026-12-02, and 8 x 512 x 2048 read 1.05 ms instead of 0.35), the same for
    every library and no part of the GEMM; in a model the linear layers run back to back."""
    t_end = time.perf_counter() + warm_s
    done = 0
    while done < warm or time.perf_counter() < t_end:
        fn()
        done += 1
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def _inner_count(fn, target=0.02, span=0.03):
    """Calls per timed sample so that one sample lasts ~target seconds (small shapes): after the
    pause, a warm-up, then as many calls as fit in `span` seconds, averaged. Counts taken from
    a few calls came out 2-10x too small: from one cold timing (the weight ring's first pass,
    idle threads), and from calls made right after another library's (OpenBLAS's threads spin
    ~0.1 s after a call; a fastattn call then lost a whole 4 ms time slice now and then: 8 x
    512 x 2048 on Zen 3, 7-9 calls a sample, median 1.05 ms against 0.35 ms); a sample of a few
    calls then measured mostly the wake-up or the contention."""
    time.sleep(PAUSE)
    _timed(fn, 1, warm=3, warm_s=0.005)
    t0, calls = time.perf_counter(), 0
    while calls < 3 or time.perf_counter() - t0 < span:
        fn()
        calls += 1
    t = (time.perf_counter() - t0) / calls
    return max(1, int(target / max(t, 1e-7)))


def _l3_bytes():
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            txt = f.read().strip().upper()
        mult = {"K": 1 << 10, "M": 1 << 20}.get(txt[-1], 1)
        return int(txt.rstrip("KM")) * mult
    except (OSError, ValueError):
        return 32 << 20


def _cycle(items):
    """A function returning the next of `items` on each call, round and round."""
    state = [0]

    def nxt():
        state[0] = (state[0] + 1) % len(items)
        return items[state[0]]
    return nxt


def measure_bandwidth(nbytes=512 << 20):
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    ts = [_timed(lambda: np.copyto(dst, src)) for _ in range(5)]
    return 2 * nbytes / min(ts) / 1e9     # read + write


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=REPEATS)
    ap.add_argument("--isa", default=None, help="force a kernel set (scalar/baseline/avx2/...)")
    ap.add_argument("--torch", action="store_true", help="add torch.mm (MKL) as a third system")
    ap.add_argument("--minilm", action="store_true", help="add the MiniLM encoder's shapes")
    args = ap.parse_args()

    from threadpoolctl import threadpool_info, threadpool_limits

    import fastattn
    from fastattn import _ops
    from fastattn._kernels import _gemm

    from _common import fastattn_origin

    if args.isa:
        _gemm.set_isa(args.isa)
    model, flags, load = _cpu_header()
    blas = [f"{d.get('internal_api')} {d.get('version')} ({d.get('architecture')})"
            for d in threadpool_info() if d.get("user_api") == "blas"]
    print(f"# CPU: {model}; {os.cpu_count()} CPUs")
    print(f"# flags: {flags}")
    print(f"# loadavg before: {load}")
    print(f"# {fastattn_origin()}")
    print(f"# fastattn {fastattn.__version__}, GEMM kernels {_gemm.isa()} (MR, NR, KC) = "
          f"{_gemm.blocking(4)}; NumPy {np.__version__}, BLAS {'; '.join(blas)}")
    print(f"# threads: {args.threads} for both; medians of {args.repeats} interleaved rounds")
    bw = measure_bandwidth()
    l3 = _l3_bytes()
    print(f"# small M (<= 32): each call reads the next of a ring of weight copies totalling > "
          f"{3 * l3 >> 20} MiB (3x the L3), so the weights come from DRAM as in a decode step; "
          f"each ring is read once untimed first; calls per sample from warmed timings; each "
          f"timed sample starts with one untimed call (it wakes the idle threads)")
    print(f"# memory bandwidth (np.copyto of 512 MiB, read + write): {bw:.1f} GB/s\n")

    torch = None
    if args.torch:
        import torch
        torch.set_num_threads(args.threads)
        print(f"# torch {torch.__version__}: torch.mm, {args.threads} threads\n")
    shapes = SHAPES + (MINILM_SHAPES if args.minilm else [])
    rng = np.random.default_rng(0)
    rows = []
    t_head = " torch ms | torch GFLOP/s | torch / fastattn |" if torch else ""
    print("| M | N | K | fastattn ms | NumPy ms | fastattn GFLOP/s | NumPy GFLOP/s | ratio | "
          "weights GB/s (fastattn / NumPy) |" + t_head)
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|" + ("---:|---:|---:|" if torch else ""))
    with threadpool_limits(limits=args.threads, user_api="blas"):
        for M, N, K in shapes:
            x = rng.standard_normal((M, K), dtype=np.float32)
            w = rng.standard_normal((N, K), dtype=np.float32)
            out_fa = np.empty((M, N), np.float32)
            out_np = np.empty((M, N), np.float32)
            # small M: every call takes the next of a ring of weight copies (> 3x the L3), so
            # the weights come from DRAM, as in a decode step through a whole model; large M:
            # one copy (the arithmetic is the work)
            n_copies = -(-3 * l3 // w.nbytes) if M <= 32 else 1
            ws = [w.copy() for _ in range(n_copies)]
            layers = [_ops.PackedLinear(a) for a in ws]
            w_next, l_next = _cycle(ws), _cycle(layers)
            f_fa = lambda: l_next()(x, n_threads=args.threads, out=out_fa)   # noqa: E731
            f_np = lambda: np.matmul(x, w_next().T, out=out_np)              # noqa: E731
            for _ in range(n_copies):       # one untimed pass over each ring first
                f_fa()
                f_np()
            n_fa, n_np = _inner_count(f_fa), _inner_count(f_np)
            t_fa, t_np, t_t = [], [], []
            if torch is not None:
                xt = torch.from_numpy(x)
                wt_next = _cycle([torch.from_numpy(a) for a in ws])
                out_t = torch.empty((M, N))
                f_t = lambda: torch.mm(xt, wt_next().t(), out=out_t)        # noqa: E731
                for _ in range(n_copies):
                    f_t()
                n_t = _inner_count(f_t)
            time.sleep(PAUSE)               # the last count's library threads go idle
            for _ in range(args.repeats):
                t_fa.append(_timed(f_fa, n_fa))
                time.sleep(PAUSE)
                t_np.append(_timed(f_np, n_np))
                time.sleep(PAUSE)
                if torch is not None:
                    t_t.append(_timed(f_t, n_t))
                    time.sleep(PAUSE)
            f_fa()                          # the same weights (copies of w) for both
            f_np()
            err = np.abs(out_fa - out_np).max()
            del ws, layers
            a, b = np.median(t_fa), np.median(t_np)
            flop = 2.0 * M * N * K
            wgb = ""
            if M <= 32:
                wbytes = 4.0 * N * K
                wgb = f"{wbytes / a / 1e9:.1f} / {wbytes / b / 1e9:.1f} (of {bw:.0f})"
            c = np.median(t_t) if t_t else np.nan
            rows.append((M, N, K, a, b, c))
            t_cols = (f" {c * 1e3:.3f} | {flop / c / 1e9:.1f} | {c / a:.2f} |" if t_t else "")
            print(f"| {M} | {N} | {K} | {a * 1e3:.3f} | {b * 1e3:.3f} | {flop / a / 1e9:.1f} | "
                  f"{flop / b / 1e9:.1f} | {b / a:.2f} | {wgb} |{t_cols}  "
                  f"<!-- max|diff| {err:.2g} -->", flush=True)
    ratios = np.array([b / a for *_, a, b, _c in rows])
    print(f"\n# geometric mean ratio (NumPy time / fastattn time): "
          f"{np.exp(np.log(ratios).mean()):.2f}; min {ratios.min():.2f}")
    if torch is not None:
        tr = np.array([c / a for *_, a, _b, c in rows])
        big = np.array([c / a for M, _n, _k, a, _b, c in rows if M >= 1024])
        print(f"# geometric mean ratio (torch.mm time / fastattn time): "
              f"{np.exp(np.log(tr).mean()):.2f}; M >= 1024 only: {np.exp(np.log(big).mean()):.2f}")

    # exact GELU on a BERT-sized activation
    x = rng.standard_normal((4096, 1536), dtype=np.float32)
    f_fa = lambda: _ops.gelu(x, n_threads=args.threads)   # noqa: E731
    line = "| gelu 4096 x 1536 float32 | fastattn "
    f_fa()
    t_fa = []
    try:
        if torch is None:
            import torch
        torch.set_num_threads(args.threads)
        xt = torch.from_numpy(x)
        f_t = lambda: torch.nn.functional.gelu(xt)        # noqa: E731
        f_t()
        t_t = []
    except ImportError:
        torch = None
    for _ in range(args.repeats):
        t_fa.append(_timed(f_fa))
        time.sleep(PAUSE)
        if torch is not None:
            t_t.append(_timed(f_t))
            time.sleep(PAUSE)
    line += f"{np.median(t_fa) * 1e3:.2f} ms"
    if torch is not None:
        line += (f" | torch {np.median(t_t) * 1e3:.2f} ms | ratio "
                 f"{np.median(t_t) / np.median(t_fa):.2f} |")
    print("\n" + line)
    print(f"# loadavg after: {open('/proc/loadavg').read().strip()}")


if __name__ == "__main__":
    main()
