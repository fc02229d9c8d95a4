"""Marian (OPUS-MT): ``source.spm``, ``target.spm``, ``vocab.json``, optional
``target_vocab.json`` and ``tokenizer_config.json``; through ``sentencepiece``.

The text is split on the added tokens first (``</s>``, ``<unk>``, ``<pad>`` and any others
written in the text are those tokens), a leading ``>>xx<<`` language code of a chunk is kept
whole, the rest is cut into pieces by the source SentencePiece model and looked up in
``vocab.json`` (a piece not there is ``<unk>``), then ``</s>`` is appended. Decoding maps ids
back to pieces (special ids dropped with ``skip_special_tokens``), joins runs of pieces with
SentencePiece (the source model when the vocabularies are shared, as transformers 5 does),
writes special tokens as themselves followed by a space, turns ``▁`` into spaces and strips the
ends. ``tgt_lang`` chooses a multilingual model's target language (``>>fr<<`` written before the
source text, as those models expect).
"""
import os

from ..._deps import require
from ._spm_vocab import _SpmVocabTokenizer
from .base import _UNDERLINE, _check_max_length, check_texts

__all__ = ["MarianTokenizer"]


class MarianTokenizer(_SpmVocabTokenizer):
    """A Marian (OPUS-MT) folder's tokenizer: ``source.spm`` / ``target.spm`` / ``vocab.json``.

    Encodes and decodes as ``transformers.MarianTokenizer`` does for the folder (see the module
    docstring); ``tgt_lang`` picks the target language of a multilingual model (one whose vocab
    holds ``>>xx<<`` codes).
    """

    family = "marian"

    def __init__(self, path):
        spm = require("sentencepiece", "reading a Marian tokenizer (source.spm / target.spm)")
        cfg, cfg_path, smap = self._read_configs(path, ("MarianTokenizer", "MarianTokenizerFast"),
                                                 "a Marian tokenizer")
        kwargs = cfg.get("sp_model_kwargs") or {}
        if not isinstance(kwargs, dict):
            raise ValueError(f"{cfg_path}: sp_model_kwargs must be a JSON object")
        if kwargs.get("enable_sampling"):
            raise ValueError(f"{cfg_path}: sp_model_kwargs enables sampling (random "
                             "segmentations); fastattn encodes deterministically only")

        self.separate_vocabs = bool(cfg.get("separate_vocabs", False))
        self.encoder = self._vocab(os.path.join(self.path, "vocab.json"))
        if self.separate_vocabs:
            tv = cfg.get("target_vocab_file") or "target_vocab.json"
            self.target_encoder = self._vocab(os.path.join(self.path, os.path.basename(tv)))
            self.decoder = {v: k for k, v in self.target_encoder.items()}
        else:
            self.target_encoder = None
            self.decoder = {v: k for k, v in self.encoder.items()}
        self.spm_source = self._spm(spm, "source.spm")
        self.spm_target = self._spm(spm, "target.spm")

        self._read_specials(cfg, smap, cfg_path, 512)
        self.target_languages = tuple(k for k in self.encoder
                                      if k.startswith(">>") and k.endswith("<<")) \
            if not self.separate_vocabs else ()

    def tokenize(self, text):
        """The token strings of `text` (no end token), as transformers' ``tokenize``."""
        out = []
        for chunk, is_token in self._split(text):
            if is_token:
                out.append(chunk)
                continue
            if chunk.startswith(">>"):
                end = chunk.find("<<")
                if end != -1:
                    out.append(chunk[:end + 2])
                    chunk = chunk[end + 2:]
            out.extend(self.spm_source.encode(chunk, out_type=str))
        return out

    def encode_one(self, text, max_length=None):
        ids = [self._token_id(t) for t in self.tokenize(text)]
        if max_length is not None and len(ids) + 1 > max_length:
            ids = ids[:max(max_length - 1, 0)]
        ids.append(self.eos_id)
        return ids

    def encode(self, texts, *, max_length=None, src_lang=None, tgt_lang=None):
        """Token ids of each text, ``</s>`` last; ``max_length`` keeps the first
        ``max_length - 1`` pieces and the end token; ``tgt_lang`` writes the target language
        code before the text."""
        texts = check_texts(texts)
        max_length = _check_max_length(max_length, least=2)
        self.check_languages(src_lang, tgt_lang)
        prefix = "" if tgt_lang is None else self._language_token(tgt_lang) + " "
        return [self.encode_one(prefix + t, max_length) for t in texts]

    def _language_token(self, code):
        return code if code.startswith(">>") and code.endswith("<<") else f">>{code}<<"

    def _named_specials(self):
        return (self.eos_token, self.unk_token, self.pad_token)

    # -- decoding -----------------------------------------------------------------------------

    _after_special = " "

    def _decoding_spm(self):
        return self.spm_target if self.separate_vocabs else self.spm_source

    def _piece(self, i, sp):
        tok = self.decoder.get(i)
        if tok is None:
            tok = sp.IdToPiece(i) if 0 <= i < sp.GetPieceSize() else ""
            tok = tok or self.unk_token
        return tok

    def _finish(self, text):
        return text.replace(_UNDERLINE, " ").strip()
