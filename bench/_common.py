"""What every bench/ script prints with its figures: the CPU, its SIMD flags, the load, and
which fastattn was measured."""
import glob
import importlib.machinery
import importlib.util
import os
import platform
import subprocess
import sys
import time

import numpy as np


def cpu_line():
    """'model name; SIMD flags; CPUs; load average' (Linux), or what the platform says."""
    name, simd, load = platform.processor() or "?", "", "?"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    simd = " ".join(f for f in ("avx2", "fma", "avx512f", "avx512vl", "avx512_vnni")
                                    if f in flags)
                    break
        with open("/proc/loadavg") as fh:
            load = " ".join(fh.read().split()[:3])
    except OSError:
        pass
    return f"{name}; {simd}; {os.cpu_count()} CPUs; load average {load}"


def fastattn_origin():
    """'fastattn <version> from <package dir> (<source tree at commit> | installed copy)': the
    scripts import the installed package, and CI's `pip install .[test]` replaces an editable
    install with a wheel of whatever it built, so a figure must say what it measured."""
    import fastattn
    pkg = os.path.dirname(os.path.abspath(fastattn.__file__))
    root = os.path.dirname(pkg)
    how = "installed copy"
    if os.path.exists(os.path.join(root, ".git")):     # a file in a git worktree
        try:
            rev = subprocess.run(["git", "-C", root, "describe", "--always", "--dirty"],
                                 capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            rev = ""
        how = f"source tree at {rev}" if rev else "source tree"
    return f"fastattn {fastattn.__version__} from {pkg} ({how})"


def load_built_extension(tree, name, tag):
    """fastattn/_kernels/<name> as built in place under source tree `tree`, loaded under the
    module name `tag.name` (the init function is found by the last component), so two builds
    of one extension can live in one process (the A/B scripts)."""
    paths = glob.glob(os.path.join(tree, "fastattn", "_kernels", f"{name}.*.so"))
    if not paths:
        sys.exit(f"no built {name} extension under {tree} "
                 "(run `python setup.py build_ext --inplace` there)")
    full = f"{tag}.{name}"
    loader = importlib.machinery.ExtensionFileLoader(full, paths[0])
    spec = importlib.util.spec_from_file_location(full, paths[0], loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def alternate(call, n, rounds):
    """Seconds per call of call(0) and call(1), alternating: each round times n back-to-back
    calls of one then of the other, each after one untimed call (the same start for both).
    Returns two arrays of `rounds` samples."""
    times = [[], []]
    for _ in range(rounds):
        for i in range(2):
            call(i)
            t = time.perf_counter()
            for _ in range(n):
                call(i)
            times[i].append((time.perf_counter() - t) / n)
    return np.array(times[0]), np.array(times[1])
