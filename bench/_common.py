"""What every bench/ script prints with its figures: the CPU, its SIMD flags, the load."""
import os
import platform


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
