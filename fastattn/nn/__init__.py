"""The blocks of "Attention Is All You Need" as NumPy modules with PyTorch's names.

The one network under every model: ``nn.Transformer``, ``Seq2SeqTransformer`` and
``EncoderModel`` are compositions of these layers. One concern a file: the module base
(:mod:`._module`), mask conversion (:mod:`._masks`), :class:`Linear`, :class:`MultiHeadAttention`
(self / cross, cached decoding, row subsets), :class:`Embedding`, :class:`LayerNorm`,
:class:`FeedForward`, positional encodings, and the Transformer layers, stacks and model
(:mod:`.transformer`).
"""
from .attention import MultiHeadAttention
from .embedding import Embedding
from .feedforward import FeedForward
from .linear import Linear
from .norm import LayerNorm
from .positional import PositionalEncoding, sinusoidal_positions
from .transformer import (Transformer, TransformerDecoder, TransformerDecoderLayer,
                          TransformerEncoder, TransformerEncoderLayer)

__all__ = [
    "Embedding",
    "Linear",
    "MultiHeadAttention",
    "LayerNorm",
    "FeedForward",
    "PositionalEncoding",
    "sinusoidal_positions",
    "TransformerEncoderLayer",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerDecoder",
    "Transformer",
]
