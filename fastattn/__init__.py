"""fastattn: fused, tiled, numerically stable Transformer attention for the CPU.

The hot core is Cython + OpenMP (``fastattn._kernels``); everything public is a thin NumPy API
over it.
"""
import os as _os

from ._version import __version__


def _running_as_command():
    """Whether this process is the `fastattn` command (its script, or `python -m fastattn`: the
    package is imported while -m locates its module, and sys.argv[0] is then '-m'), which
    reports an import error in one line rather than a traceback."""
    import sys
    argv0 = sys.argv[0] if sys.argv else ""
    return argv0 == "-m" or _os.path.splitext(_os.path.basename(argv0))[0] in (
        "fastattn", "fastattn-script")


# GNU libgomp spins ~300,000 pause iterations (several ms on AMD cores) after every parallel
# region before its threads sleep; on small machines that spinning steals the core NumPy's BLAS
# threads need for the next GEMM (a Transformer forward lost ~10% to it). libgomp reads
# GOMP_SPINCOUNT once, when it is loaded: set a short spin (~0.5 ms) just while our extension
# loads its (private, in wheels) runtime, then take the variable away again so that no other
# library sees it. A user's own GOMP_SPINCOUNT / OMP_WAIT_POLICY always wins.
_set_spin = "GOMP_SPINCOUNT" not in _os.environ and "OMP_WAIT_POLICY" not in _os.environ
if _set_spin:
    _os.environ["GOMP_SPINCOUNT"] = "20000"
try:
    from ._kernels import _attention as _kernels_attention  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "fastattn's compiled kernels could not be loaded. If you are running from a source "
        "checkout, build them first (`pip install -e .` or `python setup.py build_ext --inplace`). "
        "If the error mentions libgomp/libomp, install your compiler's OpenMP runtime "
        "(e.g. `apt-get install libgomp1`, `brew install libomp`) or rebuild with "
        f"FASTATTN_NO_OPENMP=1. Original error: {exc}"
    ) from exc
except ValueError as exc:  # FASTATTN_ISA (read by _kernels._simd): unknown, or above this CPU
    if _running_as_command():
        import sys as _sys
        print(f"fastattn: error: {exc}", file=_sys.stderr)
        raise SystemExit(2) from None
    raise
finally:
    if _set_spin:
        del _os.environ["GOMP_SPINCOUNT"]

from . import functional, models, nn
from ._config import show_config
from ._threads import get_num_threads, set_num_threads
from .functional import (PackedLinear, gelu, layer_norm, linear, relu, scaled_dot_product_attention,
                         silu, softmax)
from .nn import (FeedForward, LayerNorm, Linear, MultiHeadAttention, PositionalEncoding,
                 Transformer, TransformerDecoder, TransformerDecoderLayer, TransformerEncoder,
                 TransformerEncoderLayer, sinusoidal_positions)
from .models import EncoderModel, Seq2SeqTransformer, WhisperModel
from .text import SentenceEncoder, Translator
from .audio import Transcriber

__all__ = [
    "__version__",
    "functional",
    "nn",
    "get_num_threads",
    "set_num_threads",
    "show_config",
    "scaled_dot_product_attention",
    "softmax",
    "linear",
    "PackedLinear",
    "gelu",
    "silu",
    "relu",
    "layer_norm",
    *nn.__all__,                          # the blocks
    # whole models (fastattn.models)
    "models",
    "EncoderModel",
    "Seq2SeqTransformer",
    "WhisperModel",
    # text in, text out (fastattn.text)
    "Translator",
    "Transcriber",
    "SentenceEncoder",
]
