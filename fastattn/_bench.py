"""The engine behind `fastattn bench`: fastattn side by side with its peers, on one machine.

Design:
- Systems: fastattn; the NumPy formula (max-subtracted softmax(q @ k^T * scale) @ v, NumPy's BLAS
  limited to the same thread budget with threadpoolctl); PyTorch's scaled_dot_product_attention
  (torch.set_num_threads, inference_mode); ONNX Runtime on the CPU provider (intra_op_num_threads):
  its fused com.microsoft MultiHeadAttention and a plain MatMul/Softmax/MatMul graph, both called
  through IOBinding on preallocated buffers so no copy is timed. A system that is not installed is
  skipped with the reason, never an error.
- Every system gets the same random inputs, laid out the way it wants them (done before timing).
  Outputs are compared with the NumPy formula (or fastattn's when the formula is skipped).
- One shape at a time. Each system is warmed up, then run once for its memory (process peak RSS
  above the level just before the call: /proc/self/clear_refs + VmHWM on Linux, tracemalloc for the
  NumPy formula elsewhere), then timed in interleaved rounds A, B, C, A, B, C, ... with a 0.15 s
  sleep between systems: on few cores, worker threads of one library keep spinning ~0.1 s after a
  call and would steal a core from the next. A sample times `inner` back-to-back calls when one call
  is short; we report the median and the minimum of the samples.
- GFLOP/s counts 2 * B*H * (E + Ev) per allowed (query, key) pair: 4*B*H*L*S*E without a mask,
  L(L+1)/2 pairs instead of L*S with the causal mask (about half).
- "% peak" is a share of NumPy's GEMM rate measured at start-up on one thread times the thread count
  (SGEMM for float32, DGEMM for float64): a measured stand-in for, and slightly under, the FMA limit.
- Memory is estimated before anything is allocated: a shape whose inputs and outputs would not fit
  is refused; the systems that materialise the (L, S) score matrix are skipped when it would not fit
  (and, with --quick, when it would be big or slow), with the estimate in the message.
"""
import argparse
import ctypes
import io
import json
import math
import os
import platform
import re
import sys
import time

import numpy as np

# ---------------------------------------------------------------------------------------------
# defaults (overridable from the command line)
DEFAULT_THREADS = 2
SLEEP_BETWEEN_SYSTEMS = 0.15  # s: let the previous library's spinning worker threads go idle
# repeats: timed samples per system and shape (fewer for slow calls, to stay within `budget`
# seconds); sample: seconds a sample should last (short calls are repeated `inner` times);
# warmup: seconds of untimed calls first; peak_n: size of the GEMM that measures the peak
FULL = dict(max_repeats=10, min_repeats=3, budget=2.0, sample=0.05, warmup=0.2, peak_n=1536)
QUICK = dict(max_repeats=5, min_repeats=3, budget=0.5, sample=0.02, warmup=0.1, peak_n=1024)
# --quick skips score-materialising systems above these estimates
QUICK_MAX_SCORE_BYTES = 1 << 30
QUICK_MAX_SECONDS = 1.5
SYSTEMS = ("fastattn", "numpy", "torch", "ort-mha", "ort-graph")
LABELS = {
    "fastattn": "fastattn",
    "numpy": "NumPy formula",
    "torch": "PyTorch SDPA",
    "ort-mha": "ORT MultiHeadAttention",
    "ort-graph": "ORT MatMul/Softmax graph",
}
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


def parse_shape(text):
    """'BxHxLxSxE' (or 'BxHxLxE' for S = L) -> Shape; argparse type, so errors are usage errors."""
    parts = re.split(r"[x×*]", text.strip().lower())
    try:
        dims = [int(p) for p in parts]
    except ValueError:
        dims = []
    if len(dims) == 4:
        dims = dims[:3] + [dims[2], dims[3]]
    if len(dims) != 5 or min(dims) < 1:
        raise argparse.ArgumentTypeError(
            f"malformed shape {text!r}: expected BxHxLxSxE (batch x heads x queries x keys x head "
            f"dim) or BxHxLxE (keys = queries), all positive integers, e.g. 1x8x2048x2048x64")
    return Shape(dims)


def parse_shapes(text):
    shapes = [parse_shape(t) for t in text.split(",") if t.strip()]
    if not shapes:
        raise argparse.ArgumentTypeError("--shapes needs at least one BxHxLxSxE shape")
    return shapes


def positive_int(text):
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n


def parse_systems(text):
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in SYSTEMS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown system(s) {', '.join(bad) if bad else repr(text)}; choose from "
            f"{', '.join(SYSTEMS)}")
    return names


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
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


# ---------------------------------------------------------------------------------------------
# memory: peak extra bytes of one call

def _proc_status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


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
# the systems. prepare(q, k, v, causal) -> Prepared; inputs are (B, H, L|S, E), C-contiguous.

class Prepared:
    """run(): one timed call; fetch(): the last output as (B, H, L, Ev); memory_run: for the memory
    measurement when it must differ from run (ONNX Runtime's arena would hide the working set)."""

    def __init__(self, run, fetch, memory_run=None):
        self.run = run
        self.fetch = fetch
        self.memory_run = memory_run or run


class FastAttn:
    name = "fastattn"
    materialises_scores = False

    def __init__(self, threads):
        self.threads = threads

    def unavailable(self, dtype):
        return None

    def version(self):
        import fastattn
        return fastattn.__version__

    def prepare(self, q, k, v, causal):
        from fastattn import scaled_dot_product_attention as sdpa
        last = [None]
        threads = self.threads

        def run():
            last[0] = sdpa(q, k, v, is_causal=causal, n_threads=threads)

        return Prepared(run, lambda: last[0])


def numpy_attention(q, k, v, scale, forbid=None):
    """The NumPy formula, as lean as NumPy allows: one (B, H, L, S) score buffer, updated in place.

    forbid: optional (L, S) bool, True where a query may not attend (the causal upper triangle).
    """
    s = np.matmul(q, k.swapaxes(-1, -2))  # (B, H, L, S): what the fused kernel never stores
    s *= scale
    if forbid is not None:
        np.copyto(s, -np.inf, where=forbid)
    s -= s.max(axis=-1, keepdims=True)  # subtract the row max only for numerical stability
    np.exp(s, out=s)
    denom = s.sum(axis=-1, keepdims=True)
    out = np.matmul(s, v)
    out /= denom
    return out


class NumpyFormula:
    name = "numpy"
    materialises_scores = True
    score_copies = 1

    def __init__(self, threads):
        self.threads = threads

    def unavailable(self, dtype):
        return None

    def version(self):
        return np.__version__

    def prepare(self, q, k, v, causal):
        L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
        scale = q.dtype.type(1.0 / math.sqrt(E))
        forbid = np.triu(np.ones((L, S), dtype=bool), k=1) if causal else None
        last = [None]

        def run():
            last[0] = numpy_attention(q, k, v, scale, forbid)

        return Prepared(run, lambda: last[0])


class TorchSDPA:
    name = "torch"
    materialises_scores = False

    def __init__(self, threads):
        self.threads = threads
        try:
            import torch
        except ImportError:
            self.torch = None
        else:
            self.torch = torch
            torch.set_num_threads(threads)

    def unavailable(self, dtype):
        if self.torch is None:
            return "PyTorch is not installed (pip install torch)"
        return None

    def version(self):
        return self.torch.__version__

    def prepare(self, q, k, v, causal):
        torch = self.torch
        sdpa = torch.nn.functional.scaled_dot_product_attention
        tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))  # shares the NumPy buffers
        last = [None]

        def run():
            with torch.inference_mode():
                last[0] = sdpa(tq, tk, tv, is_causal=causal)

        return Prepared(run, lambda: last[0].numpy())


class _OnnxRuntime:
    """Shared by the two ONNX Runtime systems: sessions on the CPU provider, IOBinding."""

    materialises_scores = False

    def __init__(self, threads):
        self.threads = threads
        try:
            import onnxruntime
        except ImportError:
            self.ort = None
        else:
            self.ort = onnxruntime
        try:
            import onnx
        except ImportError:
            self.onnx = None
        else:
            self.onnx = onnx

    def unavailable(self, dtype):
        if self.ort is None:
            return "ONNX Runtime is not installed (pip install onnxruntime)"
        if self.onnx is None:
            return "the onnx package, needed to build the graph, is not installed (pip install onnx)"
        return None

    def version(self):
        return self.ort.__version__

    def _session(self, model, arena=True):
        opts = self.ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = self.ort.ExecutionMode.ORT_SEQUENTIAL
        opts.enable_cpu_mem_arena = arena
        opts.log_severity_level = 3
        return self.ort.InferenceSession(model.SerializeToString(), opts,
                                         providers=["CPUExecutionProvider"])

    def _bound(self, session, inputs, out):
        binding = session.io_binding()
        for name, arr in inputs.items():
            binding.bind_cpu_input(name, arr)
        binding.bind_output("out", "cpu", 0, out.dtype, list(out.shape), out.ctypes.data)
        keep = (session, binding, inputs, out)  # ONNX Runtime holds raw pointers into these

        def run():
            keep[0].run_with_iobinding(keep[1])

        return run

    def _tensor_type(self, dtype):
        TensorProto = self.onnx.TensorProto
        return TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE

    def _model(self, nodes, inputs, outputs, initializers=()):
        h = self.onnx.helper
        graph = h.make_graph(nodes, "attention", inputs, outputs, initializer=list(initializers))
        return h.make_model(graph, opset_imports=[h.make_opsetid("", 17),
                                                  h.make_opsetid("com.microsoft", 1)])


class OrtMHA(_OnnxRuntime):
    """com.microsoft MultiHeadAttention: query (B, L, H*E); key/value (B, S, H*E), or (B, H, S, E)
    for decode (L == 1), where that layout is ONNX Runtime's fast path; output (B, L, H*E)."""

    name = "ort-mha"

    def unavailable(self, dtype):
        why = super().unavailable(dtype)
        if why is None and dtype != np.float32:
            why = "MultiHeadAttention has no float64 CPU kernel"
        return why

    def prepare(self, q, k, v, causal):
        h = self.onnx.helper
        B, H, L, E = q.shape
        S = k.shape[2]
        if causal and L != S:
            raise _Skip("its causal mask is aligned differently from fastattn's when L != S")
        ttype = self._tensor_type(q.dtype)
        kv4d = L == 1
        q3 = np.ascontiguousarray(q.transpose(0, 2, 1, 3).reshape(B, L, H * E))
        if kv4d:
            k_in, v_in = k, v
        else:
            k_in = np.ascontiguousarray(k.transpose(0, 2, 1, 3).reshape(B, S, H * E))
            v_in = np.ascontiguousarray(v.transpose(0, 2, 1, 3).reshape(B, S, H * E))
        out = np.empty((B, L, H * E), dtype=q.dtype)
        node = h.make_node("MultiHeadAttention", ["q", "k", "v"], ["out"], domain="com.microsoft",
                           num_heads=H, unidirectional=int(causal))
        model = self._model(
            [node],
            [h.make_tensor_value_info("q", ttype, list(q3.shape)),
             h.make_tensor_value_info("k", ttype, list(k_in.shape)),
             h.make_tensor_value_info("v", ttype, list(v_in.shape))],
            [h.make_tensor_value_info("out", ttype, list(out.shape))])
        inputs = {"q": q3, "k": k_in, "v": v_in}
        run = self._bound(self._session(model), inputs, out)
        memory_run = self._bound(self._session(model, arena=False), inputs, np.empty_like(out))
        memory_run()  # its warm-up: the memory call then sees the working set, not code pages
        return Prepared(run, lambda: out.reshape(B, L, H, E).transpose(0, 2, 1, 3), memory_run)


class OrtGraph(_OnnxRuntime):
    """The formula as a plain ONNX graph on (B, H, L, E): MatMul, Mul, [Add causal bias], Softmax,
    MatMul. ONNX Runtime materialises the (B, H, L, S) scores (and the probabilities)."""

    name = "ort-graph"
    materialises_scores = True
    score_copies = 2

    def prepare(self, q, k, v, causal):
        h = self.onnx.helper
        B, H, L, E = q.shape
        S = k.shape[2]
        ttype = self._tensor_type(q.dtype)
        scale = h.make_tensor("scale", ttype, [], [1.0 / math.sqrt(E)])
        nodes = [
            h.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
            h.make_node("MatMul", ["q", "kt"], ["qk"]),
            h.make_node("Mul", ["qk", "scale"], ["scores"]),
        ]
        inputs = {"q": q, "k": k, "v": v}
        infos = [h.make_tensor_value_info(n, ttype, list(a.shape)) for n, a in inputs.items()]
        if causal:
            bias = np.zeros((L, S), dtype=q.dtype)
            bias[np.triu(np.ones((L, S), dtype=bool), k=1)] = -np.inf
            inputs["bias"] = bias
            infos.append(h.make_tensor_value_info("bias", ttype, [L, S]))
            nodes.append(h.make_node("Add", ["scores", "bias"], ["masked"]))
        nodes += [
            h.make_node("Softmax", ["masked" if causal else "scores"], ["p"], axis=-1),
            h.make_node("MatMul", ["p", "v"], ["out"]),
        ]
        out = np.empty((B, H, L, E), dtype=q.dtype)
        model = self._model(nodes, infos, [h.make_tensor_value_info("out", ttype, list(out.shape))],
                            [scale])
        run = self._bound(self._session(model), inputs, out)
        memory_run = self._bound(self._session(model, arena=False), inputs, np.empty_like(out))
        memory_run()
        return Prepared(run, lambda: out, memory_run)


SYSTEM_CLASSES = {"fastattn": FastAttn, "numpy": NumpyFormula, "torch": TorchSDPA,
                  "ort-mha": OrtMHA, "ort-graph": OrtGraph}


class _Skip(Exception):
    """A system cannot run this case; the message says why."""


# ---------------------------------------------------------------------------------------------
# environment and peak

def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags():
    wanted = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile")
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    have = set(line.split(":", 1)[1].split())
                    return [w for w in wanted if w in have] or sorted(have)[:12]
    except OSError:
        pass
    return []


def _pkg_version(name):
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return None
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def environment():
    """What the numbers depend on, as a dict (printed as the header, stored in the JSON)."""
    from . import _threads
    try:
        from threadpoolctl import threadpool_info
        pools = [{k: lib.get(k) for k in ("user_api", "internal_api", "version", "threading_layer",
                                          "architecture", "num_threads")}
                 | {"file": os.path.basename(lib.get("filepath") or "")}
                 for lib in threadpool_info()]
    except ImportError:
        pools = "threadpoolctl not installed"
    cpus = _threads._cpu_count()
    env = {
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": cpus,
        "memory_available": available_memory(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "fastattn": _threads.config(),
        "threadpools": pools,
        "packages": {p: _pkg_version(p) for p in ("numpy", "threadpoolctl", "torch", "onnxruntime",
                                                   "onnx", "matplotlib", "tqdm")},
        "env": {k: os.environ[k] for k in sorted(os.environ)
                if k.startswith(("OPENBLAS_", "OMP_", "MKL_", "GOMP_", "KMP_"))},
    }
    return env


def _fmt_load(load):
    if not load:
        return "unknown"
    return " ".join(f"{x:.2f}" for x in load) + " (1, 5, 15 min)"


def format_environment(env):
    lines = [f"CPU       : {env['cpu']} ({env['usable_cpus']} usable of {env['logical_cpus']} "
             f"logical CPUs; {' '.join(env['cpu_flags'])})",
             f"memory    : {fmt_bytes(env['memory_available'])} available",
             f"load avg  : {_fmt_load(env.get('load_average'))}",
             f"platform  : {env['platform']}, Python {env['python']}"]
    buf = io.StringIO()
    from . import _threads
    _threads.show_config(file=buf)
    lines += buf.getvalue().rstrip().splitlines()
    pools = env["threadpools"]
    if isinstance(pools, str):
        lines.append(f"threadpools: {pools}")
    else:
        lines.append("threadpools (threadpoolctl):")
        for p in pools:
            arch = f", {p['architecture']} kernels" if p.get("architecture") else ""
            layer = f", {p['threading_layer']} threading" if p.get("threading_layer") else ""
            version = f" {p['version']}" if p.get("version") else ""
            lines.append(f"  {p['user_api']:<7} {p['internal_api']}{version}{arch}{layer}, "
                         f"{p['num_threads']} threads ({p['file']})")
    pk = env["packages"]
    lines.append("packages  : " + ", ".join(f"{k} {v}" for k, v in pk.items() if v))
    missing = [k for k, v in pk.items() if not v]
    if missing:
        lines.append("not found : " + ", ".join(missing))
    if env["env"]:
        lines.append("env       : " + " ".join(f"{k}={v}" for k, v in env["env"].items()))
    return lines


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
# progress on stderr

class _MiniBar:
    def __init__(self, total, file):
        self.total, self.n, self.file, self.desc = total, 0, file, ""
        self.tty = file is not None and file.isatty()
        self.t0 = time.perf_counter()
        self._last_line = None

    def set_description(self, desc):
        self.desc = desc
        self._draw()

    def update(self, n=1):
        self.n = min(self.total, self.n + n)
        self._draw()

    def _draw(self):
        if self.file is None:
            return
        frac = self.n / self.total if self.total else 1.0
        width = 28
        bar = "#" * int(frac * width) + "." * (width - int(frac * width))
        line = f"[{bar}] {self.n}/{self.total} {time.perf_counter() - self.t0:5.0f}s {self.desc}"
        if self.tty:
            self.file.write("\r" + line[:120].ljust(120))
            self.file.flush()
        elif self.desc.split(" ")[0] != self._last_line:  # a log file: one line per shape
            self._last_line = self.desc.split(" ")[0]
            self.file.write(line + "\n")
            self.file.flush()

    def close(self):
        if self.tty:
            self.file.write("\n")
            self.file.flush()


def progress_bar(total, enabled=True):
    if not enabled:
        return _MiniBar(total, None)
    if not sys.stderr.isatty():  # a log file: a line per shape reads better than redraws
        return _MiniBar(total, sys.stderr)
    try:
        from tqdm import tqdm
    except ImportError:
        return _MiniBar(total, sys.stderr)
    return tqdm(total=total, file=sys.stderr, unit="step", dynamic_ncols=True, leave=False)


# ---------------------------------------------------------------------------------------------
# the run

def add_arguments(parser):
    parser.add_argument("--threads", type=positive_int, default=DEFAULT_THREADS,
                        help=f"thread budget for every system (default {DEFAULT_THREADS})")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--quick", action="store_true",
                        help="fewer shapes and repeats (about a minute); skips the score-"
                             "materialising systems when they would be big or slow")
    parser.add_argument("--shapes", type=parse_shapes, metavar="BxHxLxSxE[,...]",
                        help="shapes to run instead of the defaults (BxHxLxE means S = L)")
    parser.add_argument("--causal", action="store_true",
                        help="causal mask (top-left aligned); default decode shapes stay non-causal")
    parser.add_argument("--systems", type=parse_systems, default=list(SYSTEMS),
                        metavar="NAME[,...]", help="subset of " + ", ".join(SYSTEMS))
    parser.add_argument("--repeats", type=positive_int, default=None,
                        help="timed samples per system and shape (default 10, --quick 5; fewer "
                             "for slow calls)")
    parser.add_argument("--json", metavar="FILE", help="write all measurements to FILE")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="draw time and GFLOP/s against L (needs matplotlib)")
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return parser


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


def run_bench(args, error, out=None):
    """Run the benchmark described by parsed `args`; print the tables; return the result dict."""
    out = out or sys.stdout
    dtype = np.dtype(args.dtype).type
    settings = dict(QUICK if args.quick else FULL)
    if args.repeats:
        settings["max_repeats"] = args.repeats
        settings["min_repeats"] = min(settings["min_repeats"], args.repeats)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            error("--plot needs matplotlib, which is not installed: pip install matplotlib "
                  "(or pip install 'fastattn[plot]'), or leave out --plot")
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        error("fastattn bench needs threadpoolctl (pip install threadpoolctl) to give NumPy's BLAS "
              "the same thread budget as the other systems")
    cases, skips = _plan(args, error)

    log = sys.stderr
    systems = []
    unavailable = {}
    for name in args.systems:
        sysobj = SYSTEM_CLASSES[name](args.threads)
        why = sysobj.unavailable(dtype)
        if why:
            unavailable[name] = why
            print(f"fastattn bench: skipping {LABELS[name]}: {why}", file=log)
        else:
            systems.append(sysobj)
    if not systems:
        error("none of the requested systems is available")

    env = environment()
    for key in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if key in os.environ:
            print(f"fastattn bench: warning: {key}={os.environ[key]} is set and may pin NumPy's "
                  f"BLAS to a slower kernel; benchmark with `env -u {key} ...`", file=log)
    load = env.get("load_average")
    if load and load[0] > 1.0:
        print(f"fastattn bench: warning: the 1-minute load average is {load[0]:.2f}: if other "
              f"processes are using the CPUs, the timings will be noisy", file=log)
    if args.threads > env["usable_cpus"]:
        print(f"fastattn bench: warning: --threads {args.threads} is more than the "
              f"{env['usable_cpus']} usable CPUs", file=log)

    with threadpool_limits(limits=args.threads, user_api="blas"):
        peak = measure_peak(dtype, args.threads, settings["peak_n"])
        memory = PeakMemory()
        result = {
            "settings": {"threads": args.threads, "dtype": args.dtype, "quick": args.quick,
                         "causal": args.causal, "systems": args.systems,
                         "sleep_between_systems_s": SLEEP_BETWEEN_SYSTEMS, **settings},
            "environment": env, "peak": peak, "memory_method": memory.method,
            "versions": {s.name: s.version() for s in systems},
            "rows": [], "skipped": [{"system": n, "shape": None, "reason": r}
                                    for n, r in unavailable.items()],
        }
        per_shape = len(systems) * (1 + settings["max_repeats"])
        bar = progress_bar(len(cases) * per_shape, enabled=not args.no_progress)
        interrupted = False
        try:
            for shape, causal in cases:
                _bench_case(shape, causal, systems, dtype, settings, skips, peak, memory, args,
                            bar, result)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            bar.close()
    result["interrupted"] = interrupted
    print_report(result, out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
        print(f"\nwrote {args.json}", file=out)
    if args.plot:
        plot(result, args.plot)
        print(f"wrote {args.plot}", file=out)
    if interrupted:
        print("fastattn bench: interrupted; the table shows what was measured", file=log)
    return result


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


# ---------------------------------------------------------------------------------------------
# report

def _table(header, rows, align):
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]

    def line(cells):
        out = []
        for c, w, a in zip(cells, widths, align):
            out.append(str(c).rjust(w) if a == "r" else str(c).ljust(w))
        return "| " + " | ".join(out) + " |"

    sep = "|" + "|".join(("-" * (w + 1) + ":") if a == "r" else ("-" * (w + 2))
                         for w, a in zip(widths, align)) + "|"
    return [line(header), sep] + [line(r) for r in rows]


def _ms(x):
    return f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 100 else f"{x:.0f}"


def print_report(result, out=None):
    out = out or sys.stdout
    p = lambda *a: print(*a, file=out)  # noqa: E731
    st = result["settings"]
    p("fastattn bench")
    p("==============")
    for line in format_environment(result["environment"]):
        p(line)
    pk = result["peak"]
    p(f"peak      : {pk['gflops']:.0f} GFLOP/s = {pk['method']} ({pk['gflops_per_thread']:.1f} "
      f"GFLOP/s per thread); '% peak' is a share of it")
    p(f"settings  : {st['dtype']}, {st['threads']} threads, "
      f"{'causal' if st['causal'] else 'no mask'}{', --quick' if st['quick'] else ''}; "
      f"medians of up to {st['max_repeats']} interleaved samples after warm-up, "
      f"{st['sleep_between_systems_s']} s pause between systems")
    p("versions  : " + ", ".join(f"{LABELS[k]} {v}" for k, v in result["versions"].items()))
    p(f"GFLOP/s   : 4*B*H*L*S*E per call (the allowed pairs only with a causal mask); memory: "
      f"{result['memory_method']}, above the level before the call")
    rows = result["rows"]
    if not rows:
        p("\nno measurements")
        return
    names = [n for n in SYSTEMS if any(r["system"] == n for r in rows)]
    cases = []
    for r in rows:
        if (r["shape"], r["causal"]) not in cases:
            cases.append((r["shape"], r["causal"]))

    p("")
    p("Summary: median ms (GFLOP/s)")
    p("")
    header = ["shape BxHxLxSxE"] + [LABELS[n] for n in names]
    if "fastattn" in names and len(names) > 1:
        header.append("fastattn speed-up vs fastest other")
    body = []
    for shape, causal in cases:
        by = {r["system"]: r for r in rows if r["shape"] == shape and r["causal"] == causal}
        cells = [shape + (" causal" if causal else "")]
        for n in names:
            r = by.get(n)
            cells.append(f"{_ms(r['median_ms'])} ({r['gflops']:.0f})" if r else "skipped")
        if len(header) > len(names) + 1:
            others = [by[n]["median_ms"] for n in names if n != "fastattn" and n in by]
            if "fastattn" in by and others:
                cells.append(f"{min(others) / by['fastattn']['median_ms']:.2f}x")
            else:
                cells.append("")
        body.append(cells)
    for line in _table(header, body, ["l"] + ["r"] * (len(header) - 1)):
        p(line)

    p("")
    p("Details")
    p("")
    header = ["shape", "system", "median ms", "min ms", "GFLOP/s", "% peak", "vs NumPy",
              "peak extra mem", "max|diff|"]
    body = []
    for shape, causal in cases:
        for r in rows:
            if (r["shape"], r["causal"]) != (shape, causal):
                continue
            sp = r.get("speedup_vs_numpy")
            err = r["max_abs_err"]
            body.append([
                shape + (" causal" if causal else ""), r["label"], _ms(r["median_ms"]),
                _ms(r["min_ms"]), f"{r['gflops']:.1f}", f"{100 * r['share_of_peak']:.0f}%",
                f"{sp:.2f}x" if sp else "-", fmt_bytes(r["peak_extra_bytes"]),
                "ref" if err is None else f"{err:.1e}" + ("" if r["check_ok"] else " MISMATCH"),
            ])
    for line in _table(header, body, ["l", "l"] + ["r"] * 7):
        p(line)
    skipped = result["skipped"]
    if skipped:
        p("")
        p("Skipped:")
        for s in skipped:
            where = f" at {s['shape']}{' causal' if s.get('causal') else ''}" if s["shape"] else ""
            p(f"  {LABELS[s['system']]}{where}: {s['reason']}")
    bad = [r for r in rows if not r["check_ok"]]
    if bad:
        p("")
        p("WARNING: outputs differ from the reference by more than the tolerance: " +
          ", ".join(f"{r['label']} at {r['shape']}" for r in bad))


def plot(result, path):
    """Two panels against L: median time (log-log) and GFLOP/s; one line per system. Only the
    self-attention rows (L == S) form the lines when there are any."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    selfatt = [r for r in rows if r["L"] == r["S"]]
    rows = selfatt or rows
    fig, (ax_t, ax_g) = plt.subplots(1, 2, figsize=(12, 4.8))
    for name in SYSTEMS:
        rs = sorted((r for r in rows if r["system"] == name), key=lambda r: r["L"])
        if not rs:
            continue
        xs = [r["L"] for r in rs]
        ax_t.plot(xs, [r["median_ms"] for r in rs], marker="o", label=LABELS[name])
        ax_g.plot(xs, [r["gflops"] for r in rs], marker="o", label=LABELS[name])
    peak = result["peak"]["gflops"]
    ax_g.axhline(peak, color="grey", linestyle="--", linewidth=1)
    ax_g.text(0.01, peak, " NumPy GEMM peak (1 thread x threads)", va="bottom", color="grey",
              fontsize=8, transform=ax_g.get_yaxis_transform())
    for ax in (ax_t, ax_g):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length L" + (" (= S)" if selfatt else ""))
        ax.grid(True, which="both", alpha=0.3)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("median time per call (ms)")
    ax_g.set_ylabel("GFLOP/s (4·B·H·L·S·E per call)")
    ax_g.set_ylim(bottom=0)
    ax_t.legend(fontsize=8)
    st = result["settings"]
    env = result["environment"]
    shapes = sorted({(r["B"], r["H"], r["E"]) for r in rows})
    what = ", ".join(f"B={b} H={h} E={e}" for b, h, e in shapes)
    fig.suptitle(f"attention, {st['dtype']}, {st['threads']} threads"
                 f"{', causal' if st['causal'] else ''} ({what}) on {env['cpu']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None, prog=None):
    """Stand-alone entry (bench/bench_attention.py): the same options as `fastattn bench`."""
    parser = argparse.ArgumentParser(
        prog=prog, description="Benchmark fastattn against the NumPy formula, PyTorch and ONNX "
                               "Runtime (when installed).")
    add_arguments(parser)
    args = parser.parse_args(argv)
    run_bench(args, parser.error)
    return 0
