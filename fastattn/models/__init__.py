"""Whole models over fastattn's kernels, loaded from Hugging Face folders: token ids in.

- :class:`Seq2SeqTransformer` (``seq2seq.py``; ``_seq2seq_spec.py``, ``_seq2seq_weights.py``):
  encoder-decoder models (Marian / OPUS-MT, BART, mBART, Pegasus, M2M100 / NLLB, T5 / mT5),
  KV-cached greedy / beam / sampled generation (``fastattn.generation``).
- :class:`EncoderModel` (``encoder.py``; ``_encoder_weights.py``, ``_sentence_transformers.py``):
  BERT, RoBERTa, DistilBERT, MPNet, ModernBERT encoders, hidden states and sentence embeddings.
- :class:`WhisperModel` (``speech.py``): speech recognition, log-mel features in (a
  Seq2SeqTransformer with an audio encoder stem).
- The families, one module each (``bart.py``, ``marian.py``, ``t5.py``, ``bert.py``,
  ``mpnet.py``, ``modernbert.py``, ``whisper.py``; the interface in ``family.py``), registered
  once by config.json's ``model_type`` in ``registry.py``.
- ``convert.py``: ``fastattn convert``, a Hugging Face folder to fastattn's own.
"""
from .encoder import EncoderModel
from .seq2seq import Seq2SeqTransformer, positions_table
from .speech import WhisperModel

__all__ = ["EncoderModel", "Seq2SeqTransformer", "WhisperModel", "positions_table"]
