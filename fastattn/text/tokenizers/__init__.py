"""The tokenizers of published model folders, without transformers: text in, token ids out, and
back.

Each family's tokenizer is a small class over the folder's own files, encoding and decoding as
transformers' tokenizer for that folder does (its semantics re-derived from transformers'
sources, 5.x). One module per concern:

- :mod:`.base`: the :class:`Tokenizer` interface, argument checks, reading
  ``tokenizer_config.json`` / ``special_tokens_map.json``.
- :mod:`.marian`: :class:`MarianTokenizer` (``source.spm``, ``target.spm``, ``vocab.json``;
  through ``sentencepiece``).
- :mod:`.m2m100`: :class:`M2M100Tokenizer` (``sentencepiece.bpe.model``, ``vocab.json``;
  through ``sentencepiece``); what it shares with Marian's is in :mod:`._spm_vocab`.
- :mod:`.json_tokenizer`: :class:`JsonTokenizer` (``tokenizer.json``, through ``tokenizers``),
  what a transformers "fast" tokenizer runs; mBART / mBART-50 / NLLB source language tokens.
- :mod:`.spm_only`: :func:`spm_tokenizer`, a :class:`JsonTokenizer` built for a T5 / mT5,
  Pegasus, mBART, mBART-50 or NLLB folder that ships only its SentencePiece model
  (``spiece.model`` / ``sentencepiece.bpe.model``), as transformers 5.25 builds it; the model
  file's normalization table read by :mod:`._protobuf`.
- :mod:`.bert`: :func:`bert_wordpiece`, a :class:`JsonTokenizer` built for a BERT-family folder
  that ships only ``vocab.txt``.
- :mod:`.languages`: the language code tables (M2M100, mBART, mBART-50, NLLB) and where each
  tokenizer_class writes the source language token.
- :mod:`.loading`: :func:`load_tokenizer` picks the class from the folder's files.

Language codes: ``tgt_lang`` chooses a multilingual Marian model's target language (``>>fr<<``
written before the source text, as those models expect); mBART / mBART-50 / NLLB / M2M100 write
``src_lang`` into the source and give ``tgt_lang``'s id through ``target_language_id`` (the
generation's ``forced_bos_token_id``); a model without language codes raises ValueError for
either ``src_lang`` or ``tgt_lang``. Truncation: ``encode(..., max_length=n)`` keeps the first
pieces and the special tokens, ``n`` ids in all, what ``tokenizer(text, truncation=True,
max_length=n)`` gives.
"""
from .base import Tokenizer, check_texts, clean_up_tokenization
from .bert import bert_wordpiece
from .json_tokenizer import JsonTokenizer
from .loading import load_tokenizer
from .m2m100 import M2M100Tokenizer
from .marian import MarianTokenizer
from .spm_only import spm_tokenizer

__all__ = ["Tokenizer", "MarianTokenizer", "M2M100Tokenizer", "JsonTokenizer", "bert_wordpiece",
           "spm_tokenizer", "load_tokenizer", "check_texts", "clean_up_tokenization"]
