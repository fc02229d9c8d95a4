"""M2M100: ``sentencepiece.bpe.model`` + ``vocab.json``, through ``sentencepiece``;
transformers' slow M2M100Tokenizer, the ``__xx__`` language tokens after the vocabulary, a
source written ``[__src__] pieces </s>``."""
import os

from ..._deps import require
from ._spm_vocab import _SpmVocabTokenizer
from .base import _check_max_length, _check_sp_model_kwargs, check_texts
from .languages import M2M100_LANGUAGES

__all__ = ["M2M100Tokenizer"]


class M2M100Tokenizer(_SpmVocabTokenizer):
    """An M2M100 folder's tokenizer: ``sentencepiece.bpe.model`` + ``vocab.json``.

    Encodes and decodes as ``transformers.M2M100Tokenizer``: the text is split at the added
    tokens, the rest cut into pieces by the SentencePiece model and looked up in vocab.json (a
    piece not there is ``<unk>``); a source is ``[__src__] pieces [</s>]``. The language tokens
    ``__xx__`` take the ids after the vocabulary, in the order of ``M2M100_LANGUAGES``; they
    are special tokens (dropped by ``skip_special_tokens``, matched whole in the text) only when
    tokenizer_config.json lists them among its additional / extra special tokens, as in
    transformers 5. Decoding joins runs of pieces with SentencePiece, writes special tokens as
    themselves (no space added) and strips the ends.
    """

    family = "m2m_100"

    def __init__(self, path):
        spm = require("sentencepiece", "reading an M2M100 tokenizer (sentencepiece.bpe.model)")
        cfg, cfg_path, smap = self._read_configs(path, ("M2M100Tokenizer",),
                                                 "an M2M100 tokenizer")
        _check_sp_model_kwargs(cfg, cfg_path)
        codes = cfg.get("language_codes", "m2m100")
        if codes not in M2M100_LANGUAGES:
            raise ValueError(f"{cfg_path}: language_codes={codes!r} must be one of "
                             f"{', '.join(M2M100_LANGUAGES)}")
        self.encoder = self._vocab(os.path.join(self.path, "vocab.json"))
        self.decoder = {v: k for k, v in self.encoder.items()}
        self.spm = self._spm(spm, "sentencepiece.bpe.model")
        n = len(self.encoder)
        self.lang_token_to_id = {f"__{c}__": n + i for i, c in enumerate(M2M100_LANGUAGES[codes])}
        self.id_to_lang_token = {v: k for k, v in self.lang_token_to_id.items()}

        self._read_specials(cfg, smap, cfg_path, 1024,
                            (("bos_token", "<s>"), ("sep_token", "</s>")))
        self.source_languages = self.target_languages = tuple(self.lang_token_to_id)
        src = cfg.get("src_lang")
        self.default_src_lang = src if isinstance(src, str) else "en"
        if self._language_token(self.default_src_lang) not in self.lang_token_to_id:
            raise ValueError(f"{cfg_path}: src_lang={src!r} is not one of the model's "
                             "language codes")

    def _named_specials(self):
        return (self.bos_token, self.eos_token, self.unk_token, self.sep_token, self.pad_token)

    def _vocab_id(self, token):
        i = self.lang_token_to_id.get(token)
        return self.encoder.get(token) if i is None else i

    @property
    def max_id(self):
        return max(super().max_id, max(self.id_to_lang_token))

    def _language_token(self, code):
        return code if code.startswith("__") and code.endswith("__") else f"__{code}__"

    def target_language_id(self, tgt_lang):
        if tgt_lang is None:
            return None
        self.check_languages(None, tgt_lang)
        return self.lang_token_to_id[self._language_token(tgt_lang)]

    # -- encoding -----------------------------------------------------------------------------

    def tokenize(self, text):
        """The token strings of `text` (no language or end token), as transformers'
        ``tokenize``."""
        out = []
        for chunk, is_token in self._split(text):
            out.extend([chunk] if is_token else self.spm.encode(chunk, out_type=str))
        return out

    def encode(self, texts, *, max_length=None, src_lang=None, tgt_lang=None):
        """Token ids of each text: the source language token, the pieces, ``</s>``;
        ``max_length`` keeps the first ``max_length - 2`` pieces (``src_lang`` default: the
        folder's, else "en")."""
        texts = check_texts(texts)
        max_length = _check_max_length(max_length, least=3)
        self.check_languages(src_lang, tgt_lang)
        lang = self.lang_token_to_id[self._language_token(
            self.default_src_lang if src_lang is None else src_lang)]
        out = []
        for t in texts:
            ids = [self._token_id(p) for p in self.tokenize(t)]
            if max_length is not None:
                ids = ids[:max_length - 2]
            out.append([lang] + ids + [self.eos_id])
        return out

    # -- decoding -----------------------------------------------------------------------------

    def _decoding_spm(self):
        return self.spm

    def _piece(self, i, sp):
        tok = self.id_to_lang_token.get(i)
        return self.decoder.get(i, self.unk_token) if tok is None else tok
