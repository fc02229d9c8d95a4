"""What transformers' slow SentencePiece tokenizers with a ``vocab.json`` share (Marian,
M2M100): the vocabulary, the SentencePiece models, the added tokens (their ids and splitting
flags), cutting the text at them, and decoding runs of pieces with SentencePiece."""
import os
import re

from ...io.huggingface import read_json
from .base import Tokenizer, _content, _max_length, _read_configs, _special, \
    clean_up_tokenization


class _Added:
    """An added token's splitting behaviour (transformers' AddedToken flags)."""
    __slots__ = ("content", "id", "lstrip", "rstrip", "single_word", "special")

    def __init__(self, content, id, lstrip=False, rstrip=False, single_word=False, special=True):
        self.content, self.id = content, id
        self.lstrip, self.rstrip, self.single_word = bool(lstrip), bool(rstrip), bool(single_word)
        self.special = bool(special)


class _SpmVocabTokenizer(Tokenizer):
    """What transformers' slow SentencePiece tokenizers with a ``vocab.json`` share (Marian,
    M2M100): the vocabulary, the SentencePiece models, the added tokens, splitting the text at
    them, and decoding (the subclasses name the SentencePiece model and the pieces of ids)."""

    def _named_specials(self):
        """The special tokens the tokenizer names (eos_token, unk_token, ...), in transformers'
        order."""
        raise NotImplementedError

    def _vocab_id(self, token):
        """`token`'s id in the vocabulary, None when it has none."""
        return self.encoder.get(token)

    @property
    def max_id(self):
        return max(max(self.encoder.values()), max(self.added_by_id))

    # -- loading ------------------------------------------------------------------------------

    def _vocab(self, path):
        vocab = read_json(path, "vocabulary", dict)
        for k, v in vocab.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{path}: the id of {k!r} must be a non-negative integer, "
                                 f"got {v!r}")
        return vocab

    def _read_configs(self, path, classes, what):
        """(tokenizer_config.json, its path, special_tokens_map.json) of the folder `path`
        ({} for a missing file); a tokenizer_class not in `classes` is a ValueError."""
        self.path = os.fspath(path)
        cfg, cfg_path, smap = _read_configs(self.path)
        self._cfg_path = cfg_path
        cls = cfg.get("tokenizer_class")
        if cls is not None and cls not in classes:
            raise ValueError(f"{cfg_path}: tokenizer_class={cls!r} is not {what}")
        return cfg, cfg_path, smap

    def _read_specials(self, cfg, smap, cfg_path, max_length, extra=()):
        """The special tokens (tokenizer_config.json, then special_tokens_map.json, then the
        default), the length limit and the added tokens, and their ids."""
        for name, default in extra + (("eos_token", "</s>"), ("unk_token", "<unk>"),
                                      ("pad_token", "<pad>")):
            setattr(self, name, _special(cfg, smap, name, default))
        if self.unk_token not in self.encoder:
            raise ValueError(f"{os.path.join(self.path, 'vocab.json')} has no entry for the "
                             f"unknown token {self.unk_token!r}")
        self.model_max_length = _max_length(cfg.get("model_max_length", max_length), cfg_path)
        self.clean_up_tokenization_spaces = bool(cfg.get("clean_up_tokenization_spaces", False))
        self.split_special_tokens = bool(cfg.get("split_special_tokens", False))
        self._added_tokens(cfg, smap)
        self.unk_id = self._token_id(self.unk_token)
        self.eos_id = self._token_id(self.eos_token)
        self.pad_id = self._token_id(self.pad_token)
        self.special_ids = frozenset(self._token_id(t) for t in self.special_tokens)

    def _spm(self, spm, name):
        path = os.path.join(self.path, name)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"SentencePiece model not found: {path}")
        proc = spm.SentencePieceProcessor()
        try:
            proc.Load(path)
        except (OSError, RuntimeError) as exc:
            raise ValueError(f"{path} is not a SentencePiece model: {exc}") from None
        return proc

    def _added_tokens(self, cfg, smap):
        """The added tokens (special ones first, in transformers' order) with their ids and
        splitting flags: tokenizer_config.json's added_tokens_decoder, else the vocab's ids."""
        decl = cfg.get("added_tokens_decoder") or {}
        if not isinstance(decl, dict):
            raise ValueError(f"{self._cfg_path}: added_tokens_decoder must be a JSON object")
        added = {}
        for key, tok in decl.items():
            try:
                idx = int(key)
            except ValueError:
                raise ValueError(f"{self._cfg_path}: added_tokens_decoder key {key!r} is not "
                                 "an id") from None
            content = _content(tok)
            if content is None:
                raise ValueError(f"{self._cfg_path}: added_tokens_decoder[{key!r}] has no "
                                 "content")
            t = tok if isinstance(tok, dict) else {}
            added[content] = _Added(content, idx, t.get("lstrip"), t.get("rstrip"),
                                    t.get("single_word"), t.get("special", True))
        extra = []
        for name in ("additional_special_tokens", "extra_special_tokens"):
            for src in (cfg, smap):
                val = src.get(name)
                if isinstance(val, list):
                    extra += [c for c in map(_content, val) if c]
        specials = list(self._named_specials())
        specials += [t for t in dict.fromkeys(extra) if t not in specials]
        specials += [t.content for t in added.values() if t.special and t.content not in specials]
        vocab_size = len(self.encoder)
        for tok in specials:
            if tok not in added:        # transformers adds it: its vocab id, else a new one
                idx = self._vocab_id(tok)
                if idx is None:
                    idx = vocab_size
                    vocab_size += 1
                added[tok] = _Added(tok, idx)
        self.special_tokens = tuple(specials)
        self.added = added
        self.added_by_id = {t.id: t for t in added.values()}
        contents = sorted(added, key=len, reverse=True)     # leftmost, then longest match
        self._split_re = re.compile("(" + "|".join(map(re.escape, contents)) + ")") \
            if contents else None

    # -- encoding -----------------------------------------------------------------------------

    def _token_id(self, token):
        t = self.added.get(token)
        if t is not None:
            return t.id
        i = self._vocab_id(token)
        return self.encoder[self.unk_token] if i is None else i

    def _split(self, text):
        """The text cut at added tokens, their strip / single-word flags applied."""
        if self.split_special_tokens or self._split_re is None:
            return [(text, False)] if text else []
        parts = self._split_re.split(text)
        # re.split with one group alternates text, token, text, ...: odd indices are tokens
        toks = [(p, i % 2 == 1) for i, p in enumerate(parts)]
        for i, (p, is_tok) in enumerate(toks):
            if not is_tok:
                continue
            a = self.added[p]
            left = toks[i - 1][0] if i > 0 else None
            right = toks[i + 1][0] if i + 1 < len(toks) else None
            if a.rstrip and right:
                toks[i + 1] = (right.lstrip(), toks[i + 1][1])
            if a.lstrip and left:
                toks[i - 1] = (left.rstrip(), toks[i - 1][1])
            if a.single_word:
                if left and left[-1] != " ":
                    toks[i - 1] = (toks[i - 1][0] + p, False)
                    toks[i] = ("", False)
                elif right and right[0] != " ":
                    toks[i + 1] = (p + toks[i + 1][0], False)
                    toks[i] = ("", False)
        return [(p, is_tok) for p, is_tok in toks if p]

    # -- decoding -----------------------------------------------------------------------------

    _after_special = ""                 # what decoding writes after a special token

    def _decoding_spm(self):
        """The SentencePiece model that joins the pieces of a decoded sequence."""
        raise NotImplementedError

    def _piece(self, i, sp):
        """The token string of the id `i` that is not an added token."""
        raise NotImplementedError

    def _finish(self, text):
        """The decoded text from the joined pieces and special tokens."""
        return text.strip()

    def decode(self, ids, skip_special_tokens=True):
        """The text of a sequence of ids (transformers' ``decode``; ``skip_special_tokens``
        drops ``</s>``, ``<pad>``, ``<unk>`` and the other special ids): runs of pieces joined
        by SentencePiece, special tokens written as themselves."""
        sp = self._decoding_spm()
        tokens = []
        for i in ids:
            i = int(i)
            if skip_special_tokens and i in self.special_ids:
                continue
            a = self.added_by_id.get(i)
            tokens.append(a.content if a is not None else self._piece(i, sp))
        specials = set(self.special_tokens)
        run, text = [], ""
        for tok in tokens:
            if tok in specials:
                text += sp.decode_pieces(run) + tok + self._after_special
                run = []
            else:
                run.append(tok)
        text = self._finish(text + sp.decode_pieces(run))
        if self.clean_up_tokenization_spaces:
            text = clean_up_tokenization(text)
        return text
