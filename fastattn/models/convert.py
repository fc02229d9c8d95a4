"""`fastattn convert`: a Hugging Face folder to fastattn's own saved folder, in bounded memory.

The model is read one layer at a time (:class:`~fastattn.io.huggingface.Checkpoint`; each layer
packed or quantized as soon as it is in) and written one tensor at a time
(:func:`fastattn.io.saved.write_folder`), so that converting needs the memory of the result,
not of the float checkpoint: a machine that can hold an int8 model can convert its float
folder. The folder is written under a temporary name beside ``OUT`` and renamed into place when
complete: an interrupted or failed conversion leaves no ``OUT`` (and removes its temporary
folder, unless the process is killed outright). The result loads with ``from_pretrained`` by
memory map: an int8 folder in milliseconds.
"""
import os
import shutil
import signal
import sys
import time

import numpy as np

from .._quant import check_quantize
from ..io import saved as _saved
from ..io.huggingface import checkpoint_files, read_json, read_progress
from . import _ct2, registry
from .encoder import EncoderModel
from .family import KINDS
from .seq2seq import Seq2SeqTransformer
from .speech import WhisperModel

__all__ = ["convert", "model_class", "add_arguments", "run"]

_CLASSES = {cls.__name__: cls for cls in (Seq2SeqTransformer, EncoderModel, WhisperModel)}


def model_class(folder):
    """The model class that loads `folder`: the class of its config.json's family
    (:mod:`fastattn.models.registry`), EncoderModel for sentence-transformers folders (and
    anything else: its own error names what is wrong), the saved class of a fastattn folder,
    the class of a CTranslate2 folder's spec."""
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{folder} is not a directory")
    if _saved.is_saved_folder(folder):
        meta = read_json(os.path.join(folder, _saved.MODEL_FILE), _saved.MODEL_FILE, dict)
        return _CLASSES.get(meta.get("class"), EncoderModel)
    if os.path.isfile(os.path.join(folder, "modules.json")):
        return EncoderModel
    if _ct2.is_ct2_folder(folder):
        return _CLASSES[KINDS[_ct2.spec_kind(folder)]]
    cfg = read_json(os.path.join(folder, "config.json"), "config.json", dict)
    family = registry.family(cfg.get("model_type"))
    return EncoderModel if family is None else _CLASSES[KINDS[family.kind]]


def _weight_bytes(folder):
    try:
        if _ct2.is_ct2_folder(folder):
            return os.path.getsize(os.path.join(folder, "model.bin"))
        return sum(os.path.getsize(f) for f in checkpoint_files(folder))
    except (OSError, ValueError):
        return 0


def convert(src, out, quantize="int8", *, dtype=np.float32, force=False, progress=None):
    """Convert the model folder `src` to a fastattn folder `out` (quantize: 'int8' or None
    for float). ``progress(stage, done, total)`` is called as bytes are read ('read') and
    written ('write'). Returns the model class's name. `out` must not exist unless `force`."""
    src, out = os.fspath(src), os.fspath(out)
    if check_quantize(quantize, dtype) == "bfloat16":
        raise ValueError("quantize='bfloat16': a bfloat16 model cannot be saved (load the float32 "
                         "folder with quantize='bfloat16')")
    cls = model_class(src)
    if cls is EncoderModel and _ct2.is_ct2_folder(src):
        raise ValueError(f"{src} is a CTranslate2 encoder folder: converting it is not supported "
                         "yet (its saved folder would carry CTranslate2's config.json); load it "
                         "with EncoderModel / SentenceEncoder directly")
    if os.path.abspath(src) == os.path.abspath(out):
        raise ValueError(f"the output folder {out} is the input folder")
    if os.path.lexists(out) and not force:
        raise ValueError(f"{out} already exists (choose another folder, or --force to replace "
                         f"it)")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"the output folder's parent {parent} does not exist")
    tmp = os.path.join(parent, f".{os.path.basename(os.path.abspath(out))}.partial-{os.getpid()}")
    total = _weight_bytes(src)
    done = [0]

    def on_read(n):
        done[0] += n
        if progress is not None:
            progress("read", done[0], total)

    try:
        with read_progress(on_read):
            model = cls.from_pretrained(src, dtype=dtype, quantize=quantize)
        model.save_pretrained(tmp, progress=None if progress is None else
                              lambda d, t: progress("write", d, t))
        del model
        if os.path.lexists(out):
            old = tmp + ".old"
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return cls.__name__


# -- the command --------------------------------------------------------------------------------

def add_arguments(p):
    p.add_argument("model", metavar="FOLDER",
                   help="a Hugging Face model folder (config.json, model.safetensors or "
                        "shards; any family fastattn runs), a sentence-transformers folder "
                        "or a CTranslate2 folder (model.bin)")
    p.add_argument("output", metavar="OUT", help="the fastattn folder to write (must not exist)")
    p.add_argument("--quantize", choices=("int8", "float32"), default="int8",
                   help="int8 weights (default) or float32")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


class _Progress:
    """One line on stderr, redrawn: stage, GB done of total, seconds."""

    def __init__(self, stream):
        self.stream, self.t0, self.last, self.stage = stream, time.monotonic(), 0.0, None

    def __call__(self, stage, done, total):
        now = time.monotonic()
        if stage != self.stage:
            if self.stage is not None:
                print(file=self.stream)
            self.stage = stage
        elif now - self.last < 0.2 and done < total:
            return
        self.last = now
        what = "reading and converting" if stage == "read" else "writing"
        frac = f" ({100 * done / total:3.0f}%)" if total else ""
        print(f"\r{what}: {done / 1e9:.2f} / {total / 1e9:.2f} GB{frac}, "
              f"{now - self.t0:.1f} s   ", end="", file=self.stream, flush=True)

    def end(self):
        print(file=self.stream, flush=True)


def run(args):
    """`fastattn convert`: 0 on success; errors propagate to the caller's one-line report."""
    quantize = None if args.quantize == "float32" else args.quantize
    bar = None if args.quiet else _Progress(sys.stderr)

    def on_term(signum, frame):              # SIGTERM: clean up as on Ctrl-C
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    t0 = time.monotonic()
    try:
        name = convert(args.model, args.output, quantize, force=args.force, progress=bar)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if bar is not None:
            bar.end()
    if not args.quiet:
        print(f"wrote {args.output} ({name}, {args.quantize}) in {time.monotonic() - t0:.1f} s",
              file=sys.stderr)
    return 0
