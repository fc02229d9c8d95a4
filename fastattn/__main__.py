"""The `fastattn` command (also `python -m fastattn`).

  fastattn bench [options]   fastattn side by side with the NumPy formula, PyTorch and ONNX Runtime
  fastattn info              build configuration, threads, BLAS, CPU
"""
import argparse
import os
import sys


def build_parser():
    from . import benchmark
    from ._version import __version__

    parser = argparse.ArgumentParser(
        prog="fastattn",
        description="fastattn: fused, tiled CPU attention. Run `fastattn bench --quick` for a "
                    "one-minute comparison with the NumPy formula and, when installed, PyTorch and "
                    "ONNX Runtime.")
    parser.add_argument("--version", action="version", version=f"fastattn {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{bench,info}", required=True)
    bench = sub.add_parser(
        "bench", help="time fastattn against the NumPy formula, PyTorch and ONNX Runtime",
        description="Time fastattn side by side with the NumPy formula and, when installed, "
                    "PyTorch's scaled_dot_product_attention and ONNX Runtime (MultiHeadAttention "
                    "and a MatMul/Softmax/MatMul graph), at the same thread budget. Progress goes "
                    "to stderr, the tables to stdout.",
        epilog="Default shapes: 1x8xLxLx64 for L = 128 ... 8192 and the decode shape "
               "16x8x1x2048x64 (--quick: L <= 2048). For comparable numbers keep the machine "
               "otherwise idle and unset OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE.")
    benchmark.add_arguments(bench)
    sub.add_parser("info", help="print the build configuration, threads, BLAS and CPU",
                   description="Print fastattn's build configuration (version, compiler, flags, "
                               "OpenMP, SIMD level), threads, the BLAS libraries loaded and the "
                               "CPU.")
    return parser, bench


def info(out=None):
    from . import benchmark
    out = out or sys.stdout
    for line in benchmark.format_environment(benchmark.environment()):
        print(line, file=out)
    return 0


def main(argv=None):
    parser, bench_parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "info":
            return info()
        from . import benchmark
        benchmark.run_bench(args, bench_parser.error)
    except BrokenPipeError:  # `fastattn ... | head`: stop quietly (as the Python docs suggest)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
