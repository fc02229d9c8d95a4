"""What `fastattn bench` prints: the environment (also `fastattn info`), the progress bar on
stderr, the summary and detail tables, and the --plot figure."""
import io
import os
import platform
import sys
import time

from ._measure import available_memory, fmt_bytes
from ._systems import LABELS, SYSTEMS

# ---------------------------------------------------------------------------------------------
# environment

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
    wanted = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16",
              "avx512_fp16", "amx_tile", "amx_int8",
              # AArch64 (/proc/cpuinfo's Features line)
              "asimd", "asimddp", "i8mm", "bf16", "sve", "sve2")
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
    from .. import _config, _threads
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
        "fastattn": _config.config(),
        "threadpools": pools,
        "packages": {p: _pkg_version(p) for p in ("numpy", "threadpoolctl", "torch", "onnxruntime",
                                                   "onnx", "matplotlib", "tqdm")},
        "env": {k: os.environ[k] for k in sorted(os.environ)
                if k.startswith(("OPENBLAS_", "OMP_", "MKL_", "GOMP_", "KMP_", "FASTATTN_",
                                 # the peers' instruction-set caps (bench --isa sets them)
                                 "CT2_", "ONEDNN_", "DNNL_", "ATEN_CPU_"))},
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
    from .. import _config
    _config.show_config(file=buf)
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
