"""The command line: the argparse types and options of `fastattn bench`, and run_bench (options
in, report out)."""
import argparse
import json
import os
import re
import sys

import numpy as np

from .._cli import positive_int
from . import _measure
from ._measure import PeakMemory, Shape, _bench_case, _plan, measure_peak
from ._report import environment, format_environment, plot, print_report, progress_bar
from ._systems import LABELS, SYSTEM_CLASSES, SYSTEMS

# ---------------------------------------------------------------------------------------------
# options

DEFAULT_THREADS = 2


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


def parse_systems(text):
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in SYSTEMS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown system(s) {', '.join(bad) if bad else repr(text)}; choose from "
            f"{', '.join(SYSTEMS)}")
    return names


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
    parser.add_argument("--models", action="store_true",
                        help="time only the whole models (a base Marian's generation, a "
                             "MiniLM-shaped encoder) against transformers, CTranslate2 and ONNX "
                             "Runtime, each system in its own process; the default run does "
                             "this after the kernel table")
    parser.add_argument("--no-models", action="store_true",
                        help="the kernel table only (also implied by --shapes, --systems, "
                             "--causal or --dtype float64)")
    parser.add_argument("--models-dir", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--models-tiny", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return parser


# ---------------------------------------------------------------------------------------------
# the run

def _with_models(args):
    """The default run times the models after the kernels; a run that picks kernel shapes,
    systems, the causal mask or float64 is about the kernels only."""
    return not (args.no_models or args.shapes is not None or args.causal
                or args.dtype != "float32" or list(args.systems) != list(SYSTEMS))


def _write(result, args, out):
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
        print(f"\nwrote {args.json}", file=out)
    if args.plot:
        if result.get("rows") is not None:
            plot(result, args.plot)
            print(f"wrote {args.plot}", file=out)
        if result.get("models"):
            from ._models import plot_models
            stem, ext = os.path.splitext(args.plot)
            path = args.plot if result.get("rows") is None else f"{stem}_models{ext or '.png'}"
            plot_models(result["models"], path)
            print(f"wrote {path}", file=out)


def run_models_only(args, error, out=None):
    """`fastattn bench --models`: the model tables alone."""
    from ._models import run_models
    out = out or sys.stdout
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            error("--plot needs matplotlib, which is not installed: pip install matplotlib "
                  "(or pip install 'fastattn[plot]'), or leave out --plot")
    env = environment()
    print("fastattn bench --models", file=out)
    print("=======================", file=out)
    for line in format_environment(env):
        print(line, file=out)
    result = {"environment": env, "settings": {"threads": args.threads, "quick": args.quick},
              "models": run_models(args, out)}
    _write(result, args, out)
    return result


def run_bench(args, error, out=None):
    """Run the benchmark described by parsed `args`; print the tables; return the result dict."""
    out = out or sys.stdout
    if getattr(args, "models", False):
        if args.no_models:
            error("--models and --no-models contradict each other")
        return run_models_only(args, error, out)
    dtype = np.dtype(args.dtype).type
    settings = dict(_measure.QUICK if args.quick else _measure.FULL)
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
                         "sleep_between_systems_s": _measure.SLEEP_BETWEEN_SYSTEMS, **settings},
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
    if interrupted:
        print("fastattn bench: interrupted; the table shows what was measured", file=log)
    elif _with_models(args):
        from ._models import run_models
        result["models"] = run_models(args, out)
    _write(result, args, out)
    return result

