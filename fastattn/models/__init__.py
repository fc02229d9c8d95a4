"""Pretrained-model front ends over fastattn's blocks (BERT-family encoders)."""
from .encoder import EncoderModel

__all__ = ["EncoderModel"]
