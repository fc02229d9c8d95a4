"""`fastattn translate` and `fastattn embed`: UTF-8 lines in, translations / a .npy out.

Failures (a missing folder, a model type we do not run, an unreadable or non-UTF-8 file, a bad
option value) are one line on stderr and exit status 2, never a traceback; ``--output`` is
written to a temporary file beside it and renamed at the end, so a failed run leaves no partial
output.
"""
import io
import sys

import numpy as np

from .._cli import CommandError, Output, positive_int
from ..models import registry

__all__ = ["add_translate_arguments", "add_embed_arguments", "run_translate", "run_embed"]


def add_translate_arguments(p):
    p.add_argument("model", metavar="MODEL",
                   help=f"a translation model folder ({registry.titles('seq2seq')})")
    p.add_argument("--input", metavar="FILE", help="UTF-8 text, one source a line (default stdin)")
    p.add_argument("--output", metavar="FILE",
                   help="where the translations go, one a line (default stdout); written only "
                        "when every line is translated")
    p.add_argument("--beams", type=positive_int, metavar="N",
                   help="beam size (default: the model's generation config)")
    p.add_argument("--max-new-tokens", type=positive_int, metavar="N",
                   help="longest translation in tokens (default: the model's generation config)")
    p.add_argument("--batch-size", type=positive_int, default=32, metavar="N",
                   help="lines per batch, after sorting by length (default 32)")
    p.add_argument("--max-batch-tokens", type=positive_int, metavar="N",
                   help="also cap a batch at N padded source tokens")
    p.add_argument("--quantize", choices=("int8", "bfloat16"), help="int8 linear layers (per-channel int8 weights, int8 activations) or bfloat16 ones")
    p.add_argument("--src-lang", metavar="L",
                   help="source language code (mBART en_XX, M2M100 en, NLLB eng_Latn; default: "
                        "the folder's)")
    p.add_argument("--tgt-lang", metavar="L",
                   help="target language code of a multilingual model (mBART-50 de_DE, M2M100 "
                        "de, NLLB deu_Latn, Marian fr for >>fr<<)")
    p.add_argument("--threads", type=positive_int, metavar="N", help="threads (default: all usable)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def add_embed_arguments(p):
    p.add_argument("model", metavar="MODEL",
                   help=f"a sentence-transformers folder or an encoder model folder "
                        f"({registry.titles('encoder')})")
    p.add_argument("--input", metavar="FILE", required=True, help="UTF-8 text, one sentence a line")
    p.add_argument("--output", metavar="FILE.npy", required=True,
                   help="the (lines, dim) float32 embeddings, NumPy .npy")
    p.add_argument("--batch-size", type=positive_int, default=32, metavar="N",
                   help="sentences per batch, after sorting by length (default 32)")
    p.add_argument("--quantize", choices=("int8", "bfloat16"), help="int8 linear layers (per-channel int8 weights, int8 activations) or bfloat16 ones")
    p.add_argument("--threads", type=positive_int, metavar="N", help="threads (default: all usable)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _lines(stream, name):
    """The lines of a text stream without their line ends; a decoding error names the file."""
    try:
        for line in stream:
            yield line[:-1] if line.endswith("\n") else line
    except UnicodeDecodeError as exc:
        raise CommandError(f"{name} is not UTF-8 text ({exc.reason} at byte {exc.start} of a "
                           "read block)") from None


def _open_input(path):
    if path is None or path == "-":
        return io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", newline=None), "stdin"
    try:
        return open(path, encoding="utf-8", newline=None), path
    except OSError as exc:
        raise CommandError(f"cannot read {path}: {exc.strerror or exc}") from None


def _count_lines(path):
    n, last = 0, b"\n"
    try:
        with open(path, "rb") as f:
            while True:
                block = f.read(1 << 20)
                if not block:
                    break
                n += block.count(b"\n")
                last = block[-1:]
    except OSError as exc:
        raise CommandError(f"cannot read {path}: {exc.strerror or exc}") from None
    return n + (last != b"\n")


def _progress(args, total, unit):
    from ._progress import progress_bar
    return progress_bar(not args.quiet and args.input not in (None, "-"), total=total,
                        desc=args.command, unit=unit)


def run_translate(args):
    from .translator import Translator
    stream, name = _open_input(args.input)          # unreadable input: fail before loading
    out = Output(args.output)
    try:
        _translate(args, Translator, stream, name, out)
    finally:
        if name != "stdin":
            stream.close()
        out.discard()
    return 0


def _translate(args, Translator, stream, name, out):
    tr = Translator(args.model, quantize=args.quantize, n_threads=args.threads)
    kw = {}
    if args.beams is not None:
        kw["num_beams"] = args.beams
    if args.max_new_tokens is not None:
        kw["max_new_tokens"] = args.max_new_tokens
    total = _count_lines(args.input) if args.input not in (None, "-") and not args.quiet else None
    bar = _progress(args, total, "line")
    try:
        for text in tr.translate_iterable(
                _lines(stream, name), batch_size=args.batch_size,
                max_batch_tokens=args.max_batch_tokens, src_lang=args.src_lang,
                tgt_lang=args.tgt_lang, **kw):
            out.f.write(text.replace("\n", " ") + "\n")
            bar.update(1)
        out.commit()
    finally:
        bar.close()


def run_embed(args):
    from .sentence_encoder import SentenceEncoder
    stream, name = _open_input(args.input)
    try:
        lines = list(_lines(stream, name))
    finally:
        if name != "stdin":
            stream.close()
    out = Output(args.output, binary=True)
    try:
        enc = SentenceEncoder(args.model, quantize=args.quantize, n_threads=args.threads)
        vectors = enc.encode(lines, batch_size=args.batch_size, progress=not args.quiet)
        np.save(out.f, vectors, allow_pickle=False)
        out.commit()
    finally:
        out.discard()
    return 0
