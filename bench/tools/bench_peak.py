"""The float32 multiply-add ceiling and memory read bandwidth of this machine (roofline figures).

    python bench/tools/bench_peak.py [--threads 2]

Compiles bench/tools/fma_peak.c (register-only FMA chains, no memory traffic) with the C compiler
Python was built with and prints GFLOPS for AVX2 and, where the CPU has it, AVX-512, for 1 and
--threads threads (best of 5). Nothing runs faster than this on float32 multiply-adds: a
forward pass of F flops cannot take less than F / peak seconds. Also the read bandwidth over a
2 GiB buffer (DRAM) and a 32 MiB one: a decode step that reads W bytes of weights from DRAM
cannot take less than W / bandwidth.
"""
import argparse
import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/: _common
from _common import cpu_line  # noqa: E402


def peak(width, threads, exe):
    out = subprocess.run([exe, str(width), str(threads)], capture_output=True, text=True)
    return float(out.stdout) if out.returncode in (0, 1) and out.stdout.strip() else float("nan")


def read_bw(threads, mib, exe):
    out = subprocess.run([exe, "bw", str(threads), str(mib)], capture_output=True, text=True)
    return float(out.stdout) if out.returncode in (0, 1) and out.stdout.strip() else float("nan")


def build():
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fma_peak.c")
    exe = os.path.join(tempfile.mkdtemp(prefix="fma_peak_"), "fma_peak")
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
    subprocess.run(cc + ["-O2", "-fopenmp", src, "-o", exe], check=True)
    return exe


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    print(f"# CPU: {cpu_line()}")
    exe = build()
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    widths = [256] + ([512] if "avx512f" in flags else [])
    for w in widths:
        for t in sorted({1, args.threads}):
            print(f"fp32 FMA peak, {w}-bit vectors, {t} thread(s): {peak(w, t, exe):.1f} GFLOPS")
    for mib in (2048, 32):
        for t in sorted({1, args.threads}):
            print(f"read bandwidth, {mib} MiB buffer, {t} thread(s): {read_bw(t, mib, exe):.1f} GB/s")


if __name__ == "__main__":
    main()
