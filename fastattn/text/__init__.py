"""Text in, text out: the model folders' own tokenizers in front of fastattn's models.

- :class:`Translator` (translation folders: Marian / OPUS-MT, BART, M2M100 / NLLB, T5 ...,
  CTranslate2 folders, Argos Translate packages: :mod:`fastattn.text.argos`): ``translate``,
  ``translate_iterable`` (any number of lines, bounded memory), ``translate_stream``.
- :class:`SentenceEncoder` (BERT / RoBERTa / DistilBERT and sentence-transformers folders):
  ``encode`` -> (N, dim) float32, as sentence-transformers' encode.
- :mod:`fastattn.text.tokenizers`: one small tokenizer class per family (Marian's and
  M2M100's SentencePiece files; ``tokenizer.json``; a SentencePiece model alone; BERT
  ``vocab.txt``), equal to transformers'.

Needs ``sentencepiece`` and ``tokenizers`` (``pip install "fastattn[text]"``), imported only
when a folder's tokenizer is read; no torch or transformers at run time.
"""
from . import argos
from .batching import length_batches
from .sentence_encoder import SentenceEncoder
from .tokenizers import (JsonTokenizer, M2M100Tokenizer, MarianTokenizer, Tokenizer,
                         load_tokenizer)
from .translator import TextStreamer, Translator

__all__ = ["Translator", "SentenceEncoder", "TextStreamer", "Tokenizer", "MarianTokenizer",
           "M2M100Tokenizer", "JsonTokenizer", "load_tokenizer", "length_batches"]
