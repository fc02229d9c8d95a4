"""The build and run-time configuration: `fastattn.show_config()` and `fastattn info`."""
import platform
import sys

from ._kernels import _attention as _k
from ._kernels import _qgemm, _simd
from ._threads import _cpu_count, get_num_threads

__all__ = ["config", "show_config"]


def _blas_info():
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed"
    rows = []
    for lib in threadpool_info():
        if lib.get("user_api") == "blas":
            rows.append(f"{lib.get('internal_api')} {lib.get('version')} "
                        f"({lib.get('architecture')}, {lib.get('num_threads')} threads)")
    return "; ".join(rows) or "none loaded"


def _cpu_int8():
    """The CPU's int8 dot-product extensions, as detected (whatever FASTATTN_ISA allows)."""
    have = _simd.cpu_features()
    names = ("asimddp", "i8mm") if _simd.ARM64 else ("avx512_vnni", "avx_vnni", "amx_int8")
    return ", ".join(f"{f} {'yes' if f in have else 'no'}" for f in names)


def _cpu_bf16():
    """The CPU's bfloat16 dot-product extension, as detected (whatever FASTATTN_ISA allows)."""
    name = "bf16" if _simd.ARM64 else "avx512_bf16"
    return f"{name} {'yes' if name in _simd.cpu_features() else 'no'}"


def config():
    """The build and run-time configuration as a dict (what show_config prints)."""
    from ._version import __version__
    try:
        from ._build_info import BUILD_INFO
    except ImportError:
        BUILD_INFO = {}
    import numpy as np
    return {
        "version": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "numpy": np.__version__,
        "compiler": BUILD_INFO.get("compiler", "unknown"),
        "compile_flags": " ".join(BUILD_INFO.get("compile_flags", [])),
        "openmp": _k.openmp_enabled(),
        "threads": get_num_threads(),
        "cpus": _cpu_count(),
        "simd": _simd.isa() + (" (NEON)" if _simd.ARM64 and _simd.isa() == "baseline" else ""),
        "int8_kernels": _qgemm.variant(),       # the int8 GEMM's variant in use
        "bf16_kernels": _qgemm.bf16_variant(),  # the bfloat16 GEMM's
        "isa_cap": f"{_simd.isa_cap()} (FASTATTN_ISA)" if _simd.isa_cap() else "none",
        "cpu_simd": _simd.cpu_isa(capped=False),
        "cpu_int8": _cpu_int8(),
        "cpu_bf16": _cpu_bf16(),
        "blas": _blas_info(),
    }


def show_config(file=None):
    """Print version, compiler, flags, OpenMP on/off, threads, the kernel sets (float, int8 and
    bfloat16), the FASTATTN_ISA cap, the CPU's SIMD, int8 and bfloat16 extensions and NumPy's
    BLAS."""
    cfg = config()
    width = max(len(k) for k in cfg)
    print("fastattn configuration", file=file)
    for key, val in cfg.items():
        if key == "openmp":
            val = "on" if val else "off (serial build)"
        print(f"  {key:<{width}} : {val}", file=file)
