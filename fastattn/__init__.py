"""fastattn: fused, tiled, numerically stable Transformer attention for the CPU.

The hot core is Cython + OpenMP (``fastattn._kernels``); everything public is a thin NumPy API
over it.
"""
from ._version import __version__

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

from ._threads import get_num_threads, set_num_threads, show_config
from .attention import scaled_dot_product_attention, softmax
from . import layers as _layers
from .layers import (FeedForward, LayerNorm, MultiHeadAttention, PositionalEncoding, Transformer,
                     TransformerDecoder, TransformerDecoderLayer, TransformerEncoder,
                     TransformerEncoderLayer, sinusoidal_positions)

__all__ = [
    "__version__",
    "scaled_dot_product_attention",
    "softmax",
    "get_num_threads",
    "set_num_threads",
    "show_config",
] + list(_layers.__all__)
