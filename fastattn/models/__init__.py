"""Whole models over fastattn's kernels, loaded from Hugging Face folders: token ids in.

- :class:`Seq2SeqTransformer` (``seq2seq.py``, Marian checkpoints in ``marian.py``): encoder-
  decoder translation models, KV-cached greedy / beam / sampled generation (``fastattn.generation``).
- :class:`EncoderModel` (``encoder.py``, BERT-family checkpoints in ``bert.py``): hidden states
  and sentence embeddings.
- :class:`WhisperModel` (``whisper.py``): speech recognition, log-mel features in.
"""
from .encoder import EncoderModel
from .seq2seq import Seq2SeqTransformer, positions_table
from .whisper import WhisperModel

__all__ = ["EncoderModel", "Seq2SeqTransformer", "WhisperModel", "positions_table"]
