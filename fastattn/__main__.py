"""The `fastattn` command (also `python -m fastattn`).

  fastattn translate MODEL [options]   UTF-8 lines in, translations out (stdin / stdout by default)
  fastattn embed MODEL --input FILE --output FILE.npy   sentence embeddings
  fastattn transcribe FOLDER --input AUDIO... [--output FILE.{txt,srt,vtt,json}]   speech to text
  fastattn transcribe FOLDER --live --input -   live: raw PCM on stdin, text as it settles
  fastattn convert FOLDER OUT [--quantize int8]   a fastattn folder that loads by memory map
  fastattn bench [options]   fastattn side by side with the NumPy formula, PyTorch and ONNX Runtime,
                             then whole models against transformers, CTranslate2 and ONNX Runtime
  fastattn serve --model NAME=FOLDER [...]   HTTP server: /v1/embeddings, /translate, /metrics
  fastattn info              build configuration, threads, BLAS, CPU
"""
import argparse
import os
import sys


def build_parser():
    from . import benchmark, serve
    from ._version import __version__
    from .audio import cli as audio_cli
    from .models import convert
    from .text import cli as text_cli

    parser = argparse.ArgumentParser(
        prog="fastattn",
        description="fastattn: fused, tiled CPU attention and Transformer inference. "
                    "`fastattn translate` / `fastattn embed` run model folders on text, "
                    "`fastattn transcribe` a Whisper folder on audio; "
                    "`fastattn bench --quick` compares with the NumPy formula and, when "
                    "installed, PyTorch and ONNX Runtime.")
    parser.add_argument("--version", action="version", version=f"fastattn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True,
                                metavar="{translate,embed,transcribe,convert,serve,bench,info}")
    text_cli.add_translate_arguments(sub.add_parser(
        "translate", help="translate UTF-8 lines with a translation model folder",
        description="Translate UTF-8 text, one source a line, with a translation model folder "
                    "(config.json, model.safetensors, source.spm, target.spm, vocab.json). "
                    "Lines are sorted by length into batches; the output has one line per input "
                    "line, in input order, identical whatever the batching. A progress bar goes "
                    "to stderr when the input is a file."))
    text_cli.add_embed_arguments(sub.add_parser(
        "embed", help="sentence embeddings of UTF-8 lines into a .npy file",
        description="Embed UTF-8 text, one sentence a line, with a sentence-transformers or "
                    "BERT-family folder, as sentence-transformers' encode does; writes a "
                    "(lines, dim) float32 .npy."))
    audio_cli.add_arguments(sub.add_parser(
        "transcribe", help="speech to text (txt, srt, vtt, json) with a Whisper folder",
        description="Transcribe (or translate to English) audio files with a Whisper folder: "
                    "long files window by window with timestamps, the temperature fallback and "
                    "faster-whisper's defaults. Progress (seconds of audio) goes to stderr; each "
                    "output is written whole or not at all."))
    convert.add_arguments(sub.add_parser(
        "convert", help="write a model folder in fastattn's own format (int8 or float32)",
        description="Convert a Hugging Face model folder (every family fastattn runs; "
                    "sharded, float32 / float16 / bfloat16) to a fastattn folder: the weights "
                    "packed (and quantized) as the kernels read them, with the tokenizer and "
                    "config files, so that it loads by memory map in milliseconds. The model is "
                    "read one layer at a time: converting needs about the memory of the result. "
                    "OUT is written under a temporary name and renamed when complete."))
    serve.add_arguments(sub.add_parser(
        "serve", help="serve model folders over HTTP (OpenAI embeddings, LibreTranslate)",
        description="Serve embedding and translation model folders over HTTP: POST "
                    "/v1/embeddings (OpenAI's schema), POST /translate and /translate/stream, "
                    "GET /v1/models, /health, /metrics. Concurrent requests are batched; each "
                    "response is what the in-process call gives for that request alone. "
                    "Needs fastattn[serve]; see docs/serve.md."))
    bench = sub.add_parser(
        "bench", help="time fastattn against the NumPy formula, PyTorch, ONNX Runtime, "
                      "transformers and CTranslate2",
        description="Time fastattn side by side with the NumPy formula and, when installed, "
                    "PyTorch's scaled_dot_product_attention and ONNX Runtime (MultiHeadAttention "
                    "and a MatMul/Softmax/MatMul graph), at the same thread budget; then (the "
                    "default run, or --models alone) whole models: a base-size Marian and a "
                    "MiniLM-shaped encoder on random checkpoints built locally, against "
                    "transformers, CTranslate2 and ONNX Runtime, each system in its own process. "
                    "Progress goes to stderr, the tables to stdout.",
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


def _text_command(args):
    """translate / embed / transcribe / convert: a failure is one line on stderr and exit status 2."""
    from ._cli import CommandError
    from .audio import cli as audio_cli
    from .models import convert
    from .text import cli as text_cli
    run = {"translate": text_cli.run_translate, "embed": text_cli.run_embed,
           "transcribe": audio_cli.run, "convert": convert.run}[args.command]
    try:
        return run(args)
    except (CommandError, FileNotFoundError, ValueError, TypeError, ImportError,
            OSError, MemoryError) as exc:
        if isinstance(exc, BrokenPipeError):
            raise
        msg = str(exc) or type(exc).__name__
        if isinstance(exc, MemoryError):
            msg = f"out of memory: {msg}"
        print(f"fastattn {args.command}: error: {' '.join(msg.split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fastattn {args.command}: interrupted", file=sys.stderr)
        return 130


def main(argv=None):
    parser, bench_parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "info":
            return info()
        if args.command in ("translate", "embed", "transcribe", "convert"):
            return _text_command(args)
        if args.command == "serve":
            from . import serve
            return serve.run(args)  # (fails at start with one line on stderr, exit 2)
        from . import benchmark
        benchmark.run_bench(args, bench_parser.error)
    except BrokenPipeError:  # `fastattn ... | head`: stop quietly (as the Python docs suggest)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
