"""Whole models over the fastattn blocks: token ids in, token ids out."""
from .seq2seq import Seq2SeqTransformer, positions_table

__all__ = ["Seq2SeqTransformer", "positions_table"]
