"""``tokenizer.json``, through ``tokenizers``: what a transformers "fast" tokenizer runs, with
transformers' per-call settings (no padding, truncation ``longest_first`` on the side the config
names).

BART, Pegasus, T5 use the file's own post-processor; for mBART, mBART-50 and NLLB
(tokenizer_class in tokenizer_config.json) the source language token is placed as their
transformers classes place it (mBART-50, NLLB: ``[src] $A </s>``; mBART, NLLB with
``legacy_behaviour``: ``$A </s> [src]``), the language codes being the file's added special
tokens of the family's form (``en_XX``, ``eng_Latn``). transformers 5 rebuilds these classes'
normalizer and pre-tokenizer from the vocabulary and keeps only the file's post-processor;
fastattn runs the file as written, which is the same pipeline for files transformers wrote.
"""
import os
import re
import threading

from ..._deps import require
from .base import (Tokenizer, _check_max_length, _content, _max_length, _optional_json,
                   check_texts, clean_up_tokenization)
from .languages import LANGUAGE_SCHEMES

__all__ = ["JsonTokenizer"]


class JsonTokenizer(Tokenizer):
    """A folder's ``tokenizer.json`` run by the ``tokenizers`` package with transformers' call
    settings: special tokens added, no padding, truncation ``longest_first`` from the side
    ``tokenizer_config.json`` names (right by default) when ``max_length`` is given."""

    family = "tokenizers"

    def __init__(self, path, *, _tokenizer=None, _config=None):
        tk = require("tokenizers", "reading a tokenizer.json")
        self.path = os.fspath(path)
        cfg_path = os.path.join(self.path, "tokenizer_config.json")
        cfg = _config if _config is not None else _optional_json(cfg_path, "tokenizer config")
        self._cfg = cfg
        if _tokenizer is None:
            file = os.path.join(self.path, "tokenizer.json")
            if not os.path.isfile(file):
                raise FileNotFoundError(f"tokenizer.json not found: {file}")
            try:
                _tokenizer = tk.Tokenizer.from_file(file)
            except Exception as exc:     # the Rust side raises plain Exception
                raise ValueError(f"{file} is not a tokenizer.json the tokenizers package can "
                                 f"read: {exc}") from None
        self._tk = _tokenizer
        self._tk.no_padding()
        self._tk.no_truncation()
        self._limit = None
        self._lock = threading.Lock()
        self.model_max_length = _max_length(cfg.get("model_max_length"), cfg_path)
        side = cfg.get("truncation_side", "right")
        if side not in ("left", "right"):
            raise ValueError(f"{cfg_path}: truncation_side={side!r} must be 'left' or 'right'")
        self.truncation_side = side
        self.clean_up_tokenization_spaces = bool(cfg.get("clean_up_tokenization_spaces", False))
        pad = _content(cfg.get("pad_token"))
        pad_id = self._tk.token_to_id(pad) if pad else None
        self.pad_id = 0 if pad_id is None else int(pad_id)
        added = self._tk.get_added_tokens_decoder()
        self.special_ids = frozenset(int(i) for i, t in added.items() if t.special)
        # transformers 5 skips the clean-up for BPE models unless told to corrupt them anyway
        if self.clean_up_tokenization_spaces and type(self._tk.model).__name__ == "BPE" and \
                not cfg.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_"
                            "output"):
            self.clean_up_tokenization_spaces = False
        self._languages(cfg, cfg_path, added)

    def _languages(self, cfg, cfg_path, added):
        """The language codes of an mBART / mBART-50 / NLLB tokenizer (its added special tokens
        of the family's form) and where the source language token goes."""
        scheme = LANGUAGE_SCHEMES.get(cfg.get("tokenizer_class"))
        self._post = {}
        if scheme is None:
            self.lang_position = None
            return
        pattern, default, position = scheme
        if position == "legacy":
            position = "suffix" if cfg.get("legacy_behaviour", False) else "prefix"
        self.lang_position = position
        codes = tuple(t.content for t in added.values()
                      if t.special and re.fullmatch(pattern, t.content))
        if not codes:
            raise ValueError(f"{cfg_path}: a {cfg['tokenizer_class']} without language codes "
                             "among the tokenizer.json added tokens")
        self.source_languages = self.target_languages = codes
        src = cfg.get("src_lang")
        self.default_src_lang = src if isinstance(src, str) else default
        self.check_languages(self.default_src_lang, None)
        eos = _content(cfg.get("eos_token")) or "</s>"
        if self._tk.token_to_id(eos) is None:
            raise ValueError(f"{cfg_path}: eos_token={eos!r} is not in tokenizer.json")
        self._eos = eos

    def _post_processor(self, src_lang):
        """transformers' TemplateProcessing for a source in `src_lang`: ``lang $A </s>``
        (mBART-50, NLLB) or ``$A </s> lang`` (mBART, NLLB with legacy_behaviour)."""
        post = self._post.get(src_lang)
        if post is None:
            tk = require("tokenizers", "reading a tokenizer.json")
            eos, lang = self._eos, src_lang
            if self.lang_position == "prefix":
                single, pair = [lang, "$A", eos], [lang, "$A", "$B", eos]
            else:
                single, pair = ["$A", eos, lang], ["$A", "$B", eos, lang]
            post = self._post[src_lang] = tk.processors.TemplateProcessing(
                single=single, pair=pair, special_tokens=[(eos, self._tk.token_to_id(eos)),
                                                          (lang, self._tk.token_to_id(lang))])
        return post

    def target_language_id(self, tgt_lang):
        if tgt_lang is None:
            return None
        self.check_languages(None, tgt_lang)
        return int(self._tk.token_to_id(tgt_lang))

    @property
    def max_id(self):
        return max(self._tk.get_vocab(with_added_tokens=True).values())

    def encode(self, texts, *, max_length=None, src_lang=None, tgt_lang=None, types=False,
               special_tokens=True):
        """Token ids of each text (the post-processor's special tokens included unless
        ``special_tokens=False``), truncated to ``max_length`` ids; with ``types=True`` also the
        token type ids: (ids, type_ids)."""
        texts = check_texts(texts)
        max_length = _check_max_length(max_length)
        self.check_languages(src_lang, tgt_lang)
        with self._lock:                   # truncation and the language token: tokenizer state
            if self.lang_position is not None:
                self._tk.post_processor = self._post_processor(
                    self.default_src_lang if src_lang is None else src_lang)
            if max_length != self._limit:
                if max_length is None:
                    self._tk.no_truncation()
                else:
                    self._tk.enable_truncation(max_length, strategy="longest_first",
                                               direction=self.truncation_side)
                self._limit = max_length
            encs = self._tk.encode_batch(texts, add_special_tokens=bool(special_tokens))
        ids = [e.ids for e in encs]
        if types:
            return ids, [e.type_ids for e in encs]
        return ids

    def decode(self, ids, skip_special_tokens=True):
        text = self._tk.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
        if self.clean_up_tokenization_spaces:
            text = clean_up_tokenization(text)
        return text
