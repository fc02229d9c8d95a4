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


# --isa NAME (bench_generate.py, bench_encoder.py, bench_precision.py, ...): every system capped
# at one instruction set, to time the CPUs people have on a bigger one. NAME is a FASTATTN_ISA
# value; the peers get their own switches at the same level: CTranslate2's CT2_FORCE_CPU_ISA (its
# own kernels), oneDNN's ONEDNN_MAX_CPU_ISA (inside CTranslate2, PyTorch and OpenVINO), MKL's
# MKL_ENABLE_INSTRUCTIONS (Intel CPUs only: MKL ignores it elsewhere), PyTorch's
# ATEN_CPU_CAPABILITY and OpenVINO's OV_CPU_MAX_ISA (its CPU plugin's own choices, bf16 among
# them: set to oneDNN's value, or the plugin picks kernels oneDNN then refuses; OpenVINO's MLAS
# GEMM has no switch). ONNX Runtime has no such switch: it runs at its best. Each library reads
# its variable when it loads or first runs, so apply_isa() sets them before anything is imported;
# child processes inherit them.
ISA_CAPS = {  # NAME: (CT2_FORCE_CPU_ISA, ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS, ATEN_CPU_CAPABILITY)
    "scalar": ("GENERIC", "SSE41", "SSE4_2", "default"),
    "sse2": ("GENERIC", "SSE41", "SSE4_2", "default"),
    "avx2": ("AVX2", "AVX2", "AVX2", "avx2"),
    "avx2-vnni": ("AVX2", "AVX2_VNNI", "AVX2_E1", "avx2"),
    "avx512": ("AVX512", "AVX512_CORE", "AVX512", "avx512"),
    "avx512-vnni": ("AVX512", "AVX512_CORE_VNNI", "AVX512_E1", "avx512"),
    "avx512-bf16": ("AVX512", "AVX512_CORE_BF16", "AVX512_E3", "avx512"),
}
ISA_HELP = ("cap every system at this instruction set: FASTATTN_ISA for fastattn, "
            "CT2_FORCE_CPU_ISA + ONEDNN_MAX_CPU_ISA + MKL_ENABLE_INSTRUCTIONS for CTranslate2, "
            "ATEN_CPU_CAPABILITY (+ oneDNN, MKL) for PyTorch, OV_CPU_MAX_ISA + oneDNN for "
            "OpenVINO; ONNX Runtime has no switch")


def isa_environment(name):
    """The environment variables that cap fastattn and its peers at `name` (ISA_CAPS)."""
    ct2, onednn, mkl, aten = ISA_CAPS[name]
    return {"FASTATTN_ISA": name, "CT2_FORCE_CPU_ISA": ct2, "ONEDNN_MAX_CPU_ISA": onednn,
            "MKL_ENABLE_INSTRUCTIONS": mkl, "ATEN_CPU_CAPABILITY": aten,
            "OV_CPU_MAX_ISA": onednn}


def apply_isa(argv=None):
    """`--isa NAME` (or --isa=NAME) in argv (sys.argv): isa_environment(NAME) into os.environ,
    for this process and its children, before any library loads. Returns NAME, or None."""
    argv = sys.argv[1:] if argv is None else list(argv)
    name = None
    for i, arg in enumerate(argv):
        if arg == "--isa" and i + 1 < len(argv):
            name = argv[i + 1]
        elif arg.startswith("--isa="):
            name = arg.split("=", 1)[1]
    if name is None:
        return None
    if name not in ISA_CAPS:
        sys.exit(f"--isa must be one of {', '.join(ISA_CAPS)}, got {name!r}")
    os.environ.update(isa_environment(name))
    return name


def isa_line():
    """'ISA cap: ...; fastattn kernels: ...; CPU features: ...' for a bench header: the caps in
    this process's environment, what fastattn runs under them, and the CPU's flags as fastattn
    detects them (whatever the cap)."""
    from fastattn._kernels import _qgemm, _simd
    keys = ("FASTATTN_ISA", "CT2_FORCE_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
            "ATEN_CPU_CAPABILITY", "OV_CPU_MAX_ISA")
    caps = " ".join(f"{k}={os.environ[k]}" for k in keys if k in os.environ) or "none"
    return (f"ISA cap: {caps}; fastattn kernels: float {_simd.isa()}, int8 {_qgemm.variant()}, "
            f"bf16 {_qgemm.bf16_variant()}; "
            f"CPU features: {' '.join(f for f in _simd.cpu_features() if f != 'base')}")
