"""Benchmark fastattn against the NumPy formula, PyTorch and ONNX Runtime (when installed).

The same as `fastattn bench`; run from a checkout with fastattn installed or built in place:

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_attention.py --quick
    python bench/bench_attention.py --shapes 1x8x2048x2048x64 --causal --json out.json
"""
import sys

from fastattn.benchmark import main

if __name__ == "__main__":
    sys.exit(main(prog="bench_attention.py"))
