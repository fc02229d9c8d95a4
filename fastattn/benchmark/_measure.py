"""Measuring: the run's settings, shapes and their sizes (FLOPs, bytes, available memory), the
plan made before anything is allocated, peak memory, the GEMM peak, and the per-case loop
(warm-up, interleaved timed samples, the output check)."""
import ctypes
import math
import os
import time

import numpy as np

from .._memory import proc_bytes
from ._systems import LABELS, SYSTEM_CLASSES, _Skip

# ---------------------------------------------------------------------------------------------
# defaults (overridable from the command line). run_bench (_cli) reads SLEEP_BETWEEN_SYSTEMS, FULL
# and QUICK as _measure.<name> when it runs, so changing them here (as the tests do) reaches every
# reader.
SLEEP_BETWEEN_SYSTEMS = 0.15  # s: let the previous library's spinning worker threads go idle
# repeats: timed samples per system and shape (fewer for slow calls, to stay within `budget`
# seconds); sample: seconds a sample should last (short calls are repeated `inner` times);
# warmup: seconds of untimed calls first; peak_n: size of the GEMM that measures the peak
FULL = dict(max_repeats=10, min_repeats=3, budget=2.0, sample=0.05, warmup=0.2, peak_n=1536)
QUICK = dict(max_repeats=5, min_repeats=3, budget=0.5, sample=0.02, warmup=0.1, peak_n=1024)
# --quick skips score-materialising systems above these estimates
QUICK_MAX_SCORE_BYTES = 1 << 30
QUICK_MAX_SECONDS = 1.5
# max |out - reference| above which a row is flagged (outputs are O(1): averages of N(0, 1) values)
CHECK_TOL = {np.float32: 1e-3, np.float64: 1e-9}


# ---------------------------------------------------------------------------------------------
# shapes and sizes

class Shape(tuple):
    """(B, H, L, S, E) with Ev == E; printed as BxHxLxSxE."""

    def __new__(cls, dims):
        return super().__new__(cls, tuple(int(d) for d in dims))

    def __str__(self):
        return "x".join(str(d) for d in self)

    B = property(lambda self: self[0])
    H = property(lambda self: self[1])
    L = property(lambda self: self[2])
    S = property(lambda self: self[3])
    E = property(lambda self: self[4])


DEFAULT_SHAPES = ([Shape((1, 8, n, n, 64)) for n in (128, 512, 1024, 2048, 4096, 8192)]
                  + [Shape((16, 8, 1, 2048, 64))])  # the last: decode, one query against a KV cache
QUICK_SHAPES = [Shape((1, 8, n, n, 64)) for n in (128, 512, 1024, 2048)] + [Shape((16, 8, 1, 2048, 64))]


def allowed_pairs(L, S, causal):
    """Number of (query, key) pairs a row may attend to; causal is top-left aligned (key j <= query i)."""
    if not causal:
        return L * S
    m = min(L, S)
    return m * (m + 1) // 2 + max(0, L - S) * S


def flop_count(shape, causal):
    B, H, L, S, E = shape
    return 2 * B * H * (E + E) * allowed_pairs(L, S, causal)


def io_bytes(shape, itemsize):
    """q, k, v and the output."""
    B, H, L, S, E = shape
    return itemsize * B * H * (2 * L * E + 2 * S * E)


def score_bytes(shape, itemsize):
    B, H, L, S, _ = shape
    return itemsize * B * H * L * S


def fmt_bytes(n):
    if n is None:
        return "n/a"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def available_memory():
    """Bytes the process may still allocate without swapping (MemAvailable), or None if unknown."""
    avail = proc_bytes("/proc/meminfo", "MemAvailable")
    if avail is not None:
        return avail
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


# ---------------------------------------------------------------------------------------------
# memory: peak extra bytes of one call

def _proc_status_kib(field):
    n = proc_bytes("/proc/self/status", field)
    if n is None:
        raise KeyError(field)
    return n // 1024


class PeakMemory:
    """Peak resident memory a call adds on top of what the process held just before it.

    Linux: give freed heap back (malloc_trim), reset the process high-water mark (writing "5" to
    /proc/self/clear_refs), call, read VmHWM. Counts everything the call touches, C allocations of
    any library included. Elsewhere only tracemalloc is left, which sees NumPy's buffers: then only
    the NumPy formula gets a figure.
    """

    def __init__(self):
        self.method = "tracemalloc (NumPy formula only)"
        self._trim = None
        try:
            _proc_status_kib("VmHWM")
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.method = "process peak RSS (/proc/self/clear_refs + VmHWM)"
            self.rss = True
        except (OSError, KeyError):
            self.rss = False
        try:
            self._trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError, TypeError):
            self._trim = None

    def measure(self, fn, system):
        """Run fn() once; return (seconds, peak extra bytes or None)."""
        if self.rss:
            if self._trim is not None:
                self._trim(0)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            base = _proc_status_kib("VmRSS")
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            return dt, max(0, _proc_status_kib("VmHWM") - base) * 1024
        if system != "numpy":
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0, None
        import tracemalloc
        tracemalloc.start()
        try:
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            return dt, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()


# ---------------------------------------------------------------------------------------------
# the GEMM peak

def measure_peak(dtype, threads, n):
    """GEMM rate of NumPy's BLAS on one thread (best of a few), times `threads`: the '% peak' basis."""
    from threadpoolctl import threadpool_limits
    rng = np.random.default_rng(1)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    c = np.empty((n, n), dtype=dtype)
    best = math.inf
    with threadpool_limits(limits=1, user_api="blas"):
        np.matmul(a, b, out=c)
        for _ in range(5):
            t0 = time.perf_counter()
            np.matmul(a, b, out=c)
            best = min(best, time.perf_counter() - t0)
    per_thread = 2.0 * n ** 3 / best / 1e9
    kind = "SGEMM" if dtype == np.float32 else "DGEMM"
    return {"method": f"NumPy {kind} {n}x{n}x{n} on 1 thread x {threads} threads",
            "gflops_per_thread": per_thread, "gflops": per_thread * threads}


# ---------------------------------------------------------------------------------------------
# the plan, decided before anything is allocated

def _plan(args, error):
    """Shapes, causal flags and per-shape skips, all decided before anything is allocated."""
    dtype = np.dtype(args.dtype)
    if args.shapes:
        cases = [(s, args.causal) for s in args.shapes]
    else:
        shapes = QUICK_SHAPES if args.quick else DEFAULT_SHAPES
        # a decode query attends to every cached key; top-left causal would leave it one key
        cases = [(s, args.causal and s.L > 1) for s in shapes]
    avail = available_memory()
    skips = {}
    for shape, causal in cases:
        base = 2 * io_bytes(shape, dtype.itemsize)  # inputs + output, and the layout copies
        if avail is not None and base > 0.9 * avail:
            error(f"shape {shape} ({args.dtype}) needs about {fmt_bytes(base)} for its inputs, "
                  f"outputs and their copies, but only {fmt_bytes(avail)} of memory is available; "
                  f"choose a smaller shape")
        for name in args.systems:
            cls = SYSTEM_CLASSES[name]
            if not cls.materialises_scores:
                continue
            need = cls.score_copies * score_bytes(shape, dtype.itemsize) + base
            if avail is not None and need > 0.9 * avail:
                skips[(shape, name)] = (f"needs about {fmt_bytes(need)} (the {shape.L}x{shape.S} "
                                        f"score matrices) but {fmt_bytes(avail)} is available")
            elif args.quick and need > QUICK_MAX_SCORE_BYTES:
                skips[(shape, name)] = (f"--quick: would allocate about {fmt_bytes(need)} for "
                                        f"the score matrices")
    return cases, skips


# ---------------------------------------------------------------------------------------------
# one case: prepare, warm up, memory, interleaved timed rounds, output check

def _estimate_seconds(shape, causal, peak_gflops):
    """A generous guess for a score-materialising call: GEMMs at half the peak + ~8 ns per score."""
    B, H, L, S, _ = shape
    return flop_count(shape, causal) / (0.5 * peak_gflops * 1e9) + 8e-9 * B * H * L * S


def _row(shape, causal, system, samples, inner, mem, err, peak):
    flops = flop_count(shape, causal)
    med = float(np.median(samples))
    best = float(np.min(samples))
    return {
        "shape": str(shape), "B": shape.B, "H": shape.H, "L": shape.L, "S": shape.S, "E": shape.E,
        "causal": causal, "system": system, "label": LABELS[system],
        "median_ms": med * 1e3, "min_ms": best * 1e3,
        "samples_ms": [s * 1e3 for s in samples], "inner": inner,
        "gflop": flops / 1e9, "gflops": flops / med / 1e9, "gflops_best": flops / best / 1e9,
        "share_of_peak": flops / med / 1e9 / peak["gflops"],
        "peak_extra_bytes": mem, "max_abs_err": err,
    }


def _bench_case(shape, causal, systems, dtype, settings, skips, peak, memory, args, bar, result):
    rng = np.random.default_rng(args.seed)
    B, H, L, S, E = shape
    q = rng.standard_normal((B, H, L, E), dtype=np.float64).astype(dtype)
    k = rng.standard_normal((B, H, S, E), dtype=np.float64).astype(dtype)
    v = rng.standard_normal((B, H, S, E), dtype=np.float64).astype(dtype)
    tag = f"{shape}{' causal' if causal else ''}"
    steps = 1 + settings["max_repeats"]

    # phase 1: prepare, warm up, time one call, measure memory
    active = []  # [system, prepared, t_call, inner, repeats, mem]
    for sysobj in systems:
        name = sysobj.name
        bar.set_description(f"{tag} {name} warm-up")
        reason = skips.get((shape, name))
        if reason is None and args.quick and sysobj.materialises_scores:
            est = _estimate_seconds(shape, causal, peak["gflops"])
            if est > QUICK_MAX_SECONDS:
                reason = f"--quick: one call would take about {est:.1f} s"
        prepared = None
        if reason is None:
            try:
                prepared = sysobj.prepare(q, k, v, causal)
            except _Skip as exc:
                reason = str(exc)
            except Exception as exc:  # noqa: BLE001 -- a peer's failure must not end the bench
                reason = f"failed to set up: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        if reason is not None:
            result["skipped"].append({"system": name, "shape": str(shape), "causal": causal,
                                      "reason": reason})
            bar.update(steps)
            continue
        time.sleep(SLEEP_BETWEEN_SYSTEMS)
        t_call = _warm_up(prepared.run, settings["warmup"])
        time.sleep(SLEEP_BETWEEN_SYSTEMS)
        _, mem = memory.measure(prepared.memory_run, name)
        inner = max(1, min(1000, round(settings["sample"] / t_call)))
        repeats = int(min(settings["max_repeats"],
                          max(settings["min_repeats"], math.ceil(settings["budget"] / (inner * t_call)))))
        active.append([sysobj, prepared, t_call, inner, repeats, mem, []])
        bar.update(1)

    # phase 2: interleaved timed rounds
    for r in range(settings["max_repeats"]):
        for entry in active:
            sysobj, prepared, t_call, inner, repeats, _, samples = entry
            if r >= repeats:
                bar.update(1)
                continue
            bar.set_description(f"{tag} {sysobj.name} {r + 1}/{repeats}")
            time.sleep(SLEEP_BETWEEN_SYSTEMS)
            if t_call < 5e-3:
                prepared.run()  # wake the cores up before a short sample
            run = prepared.run
            t0 = time.perf_counter()
            for _ in range(inner):
                run()
            samples.append((time.perf_counter() - t0) / inner)
            bar.update(1)

    # check the outputs against the NumPy formula (or fastattn's)
    outputs = {e[0].name: np.asarray(e[1].fetch(), dtype=np.float64) for e in active}
    ref_name = next((n for n in ("numpy", "fastattn") if n in outputs), None)
    for sysobj, prepared, t_call, inner, repeats, mem, samples in active:
        err = None
        if ref_name is not None and sysobj.name != ref_name:
            err = float(np.max(np.abs(outputs[sysobj.name] - outputs[ref_name]), initial=0.0))
        row = _row(shape, causal, sysobj.name, samples, inner, mem, err, peak)
        row["reference"] = ref_name
        row["check_ok"] = err is None or err <= CHECK_TOL[dtype]
        result["rows"].append(row)
    baseline = next((r for r in result["rows"] if r["shape"] == str(shape) and r["causal"] == causal
                     and r["system"] == "numpy"), None)
    for row in result["rows"]:
        if row["shape"] == str(shape) and row["causal"] == causal:
            row["speedup_vs_numpy"] = (baseline["median_ms"] / row["median_ms"]) if baseline else None


def _warm_up(run, seconds):
    """Call until `seconds` have passed (at least twice); return the fastest call's time."""
    best = math.inf
    start = time.perf_counter()
    n = 0
    while n < 2 or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
        n += 1
        if best > seconds:  # one long call is warm-up enough
            break
    return best

