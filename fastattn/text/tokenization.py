"""The tokenizers of published model folders, without transformers: text in, token ids out, and
back.

Each family's tokenizer is a small class over the folder's own files, encoding and decoding as
transformers' tokenizer for that folder does (its semantics re-derived from transformers'
sources, 5.x):

- :class:`MarianTokenizer` (``source.spm``, ``target.spm``, ``vocab.json``, optional
  ``target_vocab.json`` and ``tokenizer_config.json``; through ``sentencepiece``): the text is
  split on the added tokens first (``</s>``, ``<unk>``, ``<pad>`` and any others written in the
  text are those tokens), a leading ``>>xx<<`` language code of a chunk is kept whole, the rest is
  cut into pieces by the source SentencePiece model and looked up in ``vocab.json`` (a piece not
  there is ``<unk>``), then ``</s>`` is appended. Decoding maps ids back to pieces (special ids
  dropped with ``skip_special_tokens``), joins runs of pieces with SentencePiece (the source
  model when the vocabularies are shared, as transformers 5 does), writes special tokens as
  themselves followed by a space, turns ``▁`` into spaces and strips the ends.
- :class:`M2M100Tokenizer` (``sentencepiece.bpe.model``, ``vocab.json``; through
  ``sentencepiece``): transformers' slow M2M100Tokenizer, the ``__xx__`` language tokens after
  the vocabulary, a source written ``[__src__] pieces </s>``.
- :class:`JsonTokenizer` (``tokenizer.json``, through ``tokenizers``): what a transformers
  "fast" tokenizer runs, with transformers' per-call settings (no padding, truncation
  ``longest_first`` on the side the config names). BART, Pegasus, T5 use the file's own
  post-processor; for mBART, mBART-50 and NLLB (tokenizer_class in tokenizer_config.json) the
  source language token is placed as their transformers classes place it (mBART-50, NLLB:
  ``[src] $A </s>``; mBART, NLLB with ``legacy_behaviour``: ``$A </s> [src]``), the language
  codes being the file's added special tokens of the family's form (``en_XX``, ``eng_Latn``).
  transformers 5 rebuilds these classes' normalizer and pre-tokenizer from the vocabulary and
  keeps only the file's post-processor; fastattn runs the file as written, which is the same
  pipeline for files transformers wrote.
- :func:`spm_tokenizer` builds that pipeline for a T5 / mT5, Pegasus, mBART, mBART-50 or NLLB
  folder that ships only its SentencePiece model (``spiece.model`` /
  ``sentencepiece.bpe.model``), as transformers 5.25 builds it from the model file: the pieces and
  scores (read with ``sentencepiece``), the model's normalization table, the family's special
  tokens and id layout (T5 sentinels, Pegasus' offset, the fairseq mapping), run by
  ``tokenizers``.
- :func:`bert_wordpiece` builds that pipeline for a BERT-family folder that ships only
  ``vocab.txt`` (as transformers' converter does: BertNormalizer with the folder's
  ``do_lower_case`` / ``strip_accents`` / ``tokenize_chinese_chars``, BertPreTokenizer,
  WordPiece, ``[CLS] $A [SEP]``).

:func:`load_tokenizer` picks the class from the folder's files. Language codes: ``tgt_lang``
chooses a multilingual Marian model's target language (``>>fr<<`` written before the source
text, as those models expect); mBART / mBART-50 / NLLB / M2M100 write ``src_lang`` into the
source and give ``tgt_lang``'s id through ``target_language_id`` (the generation's
``forced_bos_token_id``); a model without language codes raises ValueError for either
``src_lang`` or ``tgt_lang``. Truncation: ``encode(..., max_length=n)`` keeps the first pieces
and the special tokens, ``n`` ids in all, what ``tokenizer(text, truncation=True,
max_length=n)`` gives.
"""
import os
import re
import threading

from .._validation import check_folder
from ..io.huggingface import read_json
from ._deps import require

__all__ = ["Tokenizer", "MarianTokenizer", "M2M100Tokenizer", "JsonTokenizer", "bert_wordpiece",
           "spm_tokenizer", "load_tokenizer"]

_UNDERLINE = "\u2581"                 # SentencePiece's word-boundary mark
_NO_LIMIT = 10 ** 9                   # transformers writes "no limit" as int(1e30)


def check_texts(texts, name="texts"):
    """A list of str from a str-or-sequence argument: TypeError naming the argument and the bad
    item."""
    if isinstance(texts, str):
        raise TypeError(f"{name} must be a sequence of strings (a list), got one str; wrap it "
                        f"in a list: [{texts[:20]!r}...]")
    try:
        out = list(texts)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of strings, got "
                        f"{type(texts).__name__}") from None
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(t).__name__}")
    return out


def _content(token):
    """A special token as tokenizer_config.json writes it: a str, or an AddedToken dict."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) and token else None


def _max_length(value, where):
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: model_max_length={value!r} must be a positive integer")
    return None if value >= _NO_LIMIT else value


def _check_max_length(max_length, least=1):
    if max_length is None:
        return None
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < least:
        raise ValueError(f"max_length must be an integer >= {least} or None, got {max_length!r}")
    return max_length


class Tokenizer:
    """What the text front ends need from a folder's tokenizer.

    Attributes
    ----------
    path : str, the folder
    pad_id : int, the padding id the tokenizer writes
    model_max_length : int or None, the folder's limit on ids per text (tokenizer_config.json)
    source_languages, target_languages : tuple of str, the language codes ``src_lang`` /
        ``tgt_lang`` accept (empty: the model has none)
    """

    family = None
    source_languages = ()
    target_languages = ()
    default_src_lang = None

    def encode(self, texts, *, max_length=None, src_lang=None, tgt_lang=None):
        """list of str -> list of lists of int (special tokens included)."""
        raise NotImplementedError

    def decode(self, ids, skip_special_tokens=True):
        """A sequence of ids -> str."""
        raise NotImplementedError

    def batch_decode(self, rows, skip_special_tokens=True):
        return [self.decode(r, skip_special_tokens=skip_special_tokens) for r in rows]

    def check_languages(self, src_lang, tgt_lang):
        """ValueError for a language argument this model cannot take."""
        for name, value, known in (("src_lang", src_lang, self.source_languages),
                                   ("tgt_lang", tgt_lang, self.target_languages)):
            if value is None:
                continue
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a str language code, got {type(value).__name__}")
            if not known:
                raise ValueError(f"{name}={value!r}: the model in {self.path} has no "
                                 f"{'source' if name == 'src_lang' else 'target'} language codes "
                                 "(leave it out)")
            if self._language_token(value) not in known:
                shown = ", ".join(sorted(known)[:12]) + (" ..." if len(known) > 12 else "")
                raise ValueError(f"{name}={value!r} is not one of this model's language codes: "
                                 f"{shown}")

    def _language_token(self, code):
        return code

    def target_language_id(self, tgt_lang):
        """The id generation must start with for ``tgt_lang`` (``forced_bos_token_id``), or None
        when the model takes its target language another way (Marian: a code in the text) or
        ``tgt_lang`` is None."""
        return None

    @property
    def max_id(self):
        """The largest id encode can write (the model's embedding must have that row)."""
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}({self.path!r})"


# ---------------------------------------------------------------------------------------------
# Marian: SentencePiece models + vocab.json

class _Added:
    """An added token's splitting behaviour (transformers' AddedToken flags)."""
    __slots__ = ("content", "id", "lstrip", "rstrip", "single_word", "special")

    def __init__(self, content, id, lstrip=False, rstrip=False, single_word=False, special=True):
        self.content, self.id = content, id
        self.lstrip, self.rstrip, self.single_word = bool(lstrip), bool(rstrip), bool(single_word)
        self.special = bool(special)


class _SpmVocabTokenizer(Tokenizer):
    """What transformers' slow SentencePiece tokenizers with a ``vocab.json`` share (Marian,
    M2M100): the vocabulary, the SentencePiece models, the added tokens and splitting the text
    at them."""

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
        cfg_path = os.path.join(self.path, "tokenizer_config.json")
        cfg = read_json(cfg_path, "tokenizer config", dict) if os.path.isfile(cfg_path) else {}
        self._cfg_path = cfg_path
        smap_path = os.path.join(self.path, "special_tokens_map.json")
        smap = read_json(smap_path, "special tokens map", dict) if os.path.isfile(smap_path) \
            else {}
        cls = cfg.get("tokenizer_class")
        if cls is not None and cls not in classes:
            raise ValueError(f"{cfg_path}: tokenizer_class={cls!r} is not {what}")
        return cfg, cfg_path, smap

    def _read_specials(self, cfg, smap, cfg_path, max_length, extra=()):
        """The special tokens (tokenizer_config.json, then special_tokens_map.json, then the
        default), the length limit and the added tokens, and their ids."""
        def special(name, default):
            return _content(cfg.get(name)) or _content(smap.get(name)) or default
        for name, default in extra + (("eos_token", "</s>"), ("unk_token", "<unk>"),
                                      ("pad_token", "<pad>")):
            setattr(self, name, special(name, default))
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
        return self.encoder.get(token, self.encoder[self.unk_token])

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

    def decode(self, ids, skip_special_tokens=True):
        """The text of a sequence of ids (transformers' ``decode``; ``skip_special_tokens``
        drops ``</s>``, ``<pad>``, ``<unk>`` and the other special ids)."""
        sp = self.spm_target if self.separate_vocabs else self.spm_source
        tokens = []
        for i in ids:
            i = int(i)
            if skip_special_tokens and i in self.special_ids:
                continue
            a = self.added_by_id.get(i)
            if a is not None:
                tokens.append(a.content)
                continue
            tok = self.decoder.get(i)
            if tok is None:
                tok = sp.IdToPiece(i) if 0 <= i < sp.GetPieceSize() else ""
                tok = tok or self.unk_token
            tokens.append(tok)
        specials = set(self.special_tokens)
        run, text = [], ""
        for tok in tokens:
            if tok in specials:
                text += sp.decode_pieces(run) + tok + " "
                run = []
            else:
                run.append(tok)
        text += sp.decode_pieces(run)
        text = text.replace(_UNDERLINE, " ").strip()
        if self.clean_up_tokenization_spaces:
            text = clean_up_tokenization(text)
        return text


def clean_up_tokenization(text):
    """transformers' ``clean_up_tokenization``: no space before . ? ! , and English clitics."""
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
                 (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"),
                 (" 're", "'re")):
        text = text.replace(a, b)
    return text


# ---------------------------------------------------------------------------------------------
# M2M100: a SentencePiece model + vocab.json, language codes after the vocabulary

# The language codes of M2M100 checkpoints, in the order their ids follow the vocabulary
# (``language_codes`` in tokenizer_config.json picks the list; fairseq's order).
M2M100_LANGUAGES = {
    "m2m100": (
        "af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy ga gd "
        "gl gu ha he hi hr ht hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt lv mg "
        "mk ml mn mr ms my ne nl no ns oc or pa pl ps pt ro ru sd si sk sl so sq sr ss su sv "
        "sw ta th tl tn tr uk ur uz vi wo xh yi yo zh zu").split(),
    "wmt21": "en ha is ja cs ru zh de".split(),
}


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
        kwargs = cfg.get("sp_model_kwargs") or {}
        if not isinstance(kwargs, dict) or kwargs.get("enable_sampling"):
            raise ValueError(f"{cfg_path}: sp_model_kwargs must be a JSON object without "
                             "enable_sampling (fastattn encodes deterministically only)")
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

    def _token_id(self, token):
        t = self.added.get(token)
        if t is not None:
            return t.id
        i = self._vocab_id(token)
        return self.encoder[self.unk_token] if i is None else i

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

    def decode(self, ids, skip_special_tokens=True):
        """The text of a sequence of ids (transformers' ``decode``)."""
        tokens = []
        for i in ids:
            i = int(i)
            if skip_special_tokens and i in self.special_ids:
                continue
            a = self.added_by_id.get(i)
            if a is not None:
                tokens.append(a.content)
            elif i in self.id_to_lang_token:
                tokens.append(self.id_to_lang_token[i])
            else:
                tokens.append(self.decoder.get(i, self.unk_token))
        specials = set(self.special_tokens)
        run, text = [], ""
        for tok in tokens:
            if tok in specials:
                text += self.spm.decode_pieces(run) + tok
                run = []
            else:
                run.append(tok)
        text = (text + self.spm.decode_pieces(run)).strip()
        if self.clean_up_tokenization_spaces:
            text = clean_up_tokenization(text)
        return text


# ---------------------------------------------------------------------------------------------
# tokenizer.json (the `tokenizers` package)

# tokenizer_class -> (the form of its language codes, the default source language, where the
# source language token goes: "prefix", "suffix", or "legacy" = NllbTokenizer's
# legacy_behaviour setting, False (prefix) by default)
_LANGUAGE_SCHEMES = {}
for _names, _scheme in ((("MBartTokenizer", "MBartTokenizerFast"),
                         (r"[a-z]{2}_[A-Z]{2}", "en_XX", "suffix")),
                        (("MBart50Tokenizer", "MBart50TokenizerFast"),
                         (r"[a-z]{2}_[A-Z]{2}", "en_XX", "prefix")),
                        (("NllbTokenizer", "NllbTokenizerFast"),
                         (r"[a-z]{3}_[A-Z][a-z]{3}", "eng_Latn", "legacy"))):
    for _n in _names:
        _LANGUAGE_SCHEMES[_n] = _scheme


class JsonTokenizer(Tokenizer):
    """A folder's ``tokenizer.json`` run by the ``tokenizers`` package with transformers' call
    settings: special tokens added, no padding, truncation ``longest_first`` from the side
    ``tokenizer_config.json`` names (right by default) when ``max_length`` is given."""

    family = "tokenizers"

    def __init__(self, path, *, _tokenizer=None, _config=None):
        tk = require("tokenizers", "reading a tokenizer.json")
        self.path = os.fspath(path)
        cfg_path = os.path.join(self.path, "tokenizer_config.json")
        cfg = _config if _config is not None else \
            read_json(cfg_path, "tokenizer config", dict) if os.path.isfile(cfg_path) else {}
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
        scheme = _LANGUAGE_SCHEMES.get(cfg.get("tokenizer_class"))
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

    def encode(self, texts, *, max_length=None, src_lang=None, tgt_lang=None, types=False):
        """Token ids of each text (the post-processor's special tokens included), truncated to
        ``max_length`` ids; with ``types=True`` also the token type ids: (ids, type_ids)."""
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
            encs = self._tk.encode_batch(texts, add_special_tokens=True)
        ids = [e.ids for e in encs]
        if types:
            return ids, [e.type_ids for e in encs]
        return ids

    def decode(self, ids, skip_special_tokens=True):
        text = self._tk.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
        if self.clean_up_tokenization_spaces:
            text = clean_up_tokenization(text)
        return text


def bert_wordpiece(path):
    """A :class:`JsonTokenizer` for a BERT-family folder with ``vocab.txt`` and no
    ``tokenizer.json``, built as transformers converts the slow BERT tokenizer: BertNormalizer
    (clean text; Chinese characters split when ``tokenize_chinese_chars``; lower case and
    accents stripped per ``do_lower_case`` / ``strip_accents``), BertPreTokenizer, WordPiece
    (``##`` continuation, 100 characters a word at most), ``[CLS] $A [SEP]``."""
    tk = require("tokenizers", "reading a BERT vocab.txt")
    path = os.fspath(path)
    vocab_file = os.path.join(path, "vocab.txt")
    vocab = {}
    try:
        with open(vocab_file, encoding="utf-8") as f:
            for i, line in enumerate(f):
                vocab.setdefault(line.rstrip("\n"), i)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{vocab_file} is not UTF-8 text: {exc}") from None
    cfg_path = os.path.join(path, "tokenizer_config.json")
    cfg = read_json(cfg_path, "tokenizer config", dict) if os.path.isfile(cfg_path) else {}
    cls = cfg.get("tokenizer_class")
    if cls is not None and cls not in ("BertTokenizer", "BertTokenizerFast", "DistilBertTokenizer",
                                       "DistilBertTokenizerFast"):
        raise ValueError(f"{path} has no tokenizer.json, and its tokenizer_class={cls!r} is not "
                         "a BERT WordPiece tokenizer fastattn can build from vocab.txt")
    names = {k: _content(cfg.get(f"{k}_token")) or d for k, d in
             (("unk", "[UNK]"), ("sep", "[SEP]"), ("pad", "[PAD]"), ("cls", "[CLS]"),
              ("mask", "[MASK]"))}
    for k in ("unk", "sep", "cls"):
        if names[k] not in vocab:
            raise ValueError(f"{vocab_file} has no {names[k]!r} ({k} token)")
    lower = cfg.get("do_lower_case", True)
    model = tk.models.WordPiece(vocab, unk_token=names["unk"], max_input_chars_per_word=100)
    t = tk.Tokenizer(model)
    t.normalizer = tk.normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=cfg.get("tokenize_chinese_chars", True),
        strip_accents=cfg.get("strip_accents"), lowercase=lower)
    t.pre_tokenizer = tk.pre_tokenizers.BertPreTokenizer()
    cls_tok, sep_tok = names["cls"], names["sep"]
    t.post_processor = tk.processors.TemplateProcessing(
        single=f"{cls_tok}:0 $A:0 {sep_tok}:0",
        pair=f"{cls_tok}:0 $A:0 {sep_tok}:0 $B:1 {sep_tok}:1",
        special_tokens=[(cls_tok, vocab[cls_tok]), (sep_tok, vocab[sep_tok])])
    t.decoder = tk.decoders.WordPiece(prefix="##")
    t.add_special_tokens([tk.AddedToken(names[k], special=True, normalized=False)
                          for k in ("pad", "unk", "cls", "sep", "mask") if names[k] in vocab])
    return JsonTokenizer(path, _tokenizer=t)


# ---------------------------------------------------------------------------------------------
# A SentencePiece model without tokenizer.json (T5 / mT5, Pegasus, mBART, mBART-50, NLLB)

# the language codes of the fairseq multilingual checkpoints, in the order their ids follow
# the vocabulary (mBART-50 extends mBART's list)
_MBART_CODES = (
    "ar_AR cs_CZ de_DE en_XX es_XX et_EE fi_FI fr_XX gu_IN hi_IN it_IT ja_XX kk_KZ ko_KR "
    "lt_LT lv_LV my_MM ne_NP nl_XX ro_RO ru_RU si_LK tr_TR vi_VN zh_CN "
).split()
_MBART50_CODES = _MBART_CODES + (
    "af_ZA az_AZ bn_IN fa_IR he_IL hr_HR id_ID ka_GE km_KH mk_MK ml_IN mn_MN mr_IN pl_PL "
    "ps_AF pt_XX sv_SE sw_KE ta_IN te_IN th_TH tl_XX uk_UA ur_PK xh_ZA gl_ES sl_SI "
).split()
_NLLB_CODES = (
    "ace_Arab ace_Latn acm_Arab acq_Arab aeb_Arab afr_Latn ajp_Arab aka_Latn amh_Ethi "
    "apc_Arab arb_Arab ars_Arab ary_Arab arz_Arab asm_Beng ast_Latn awa_Deva ayr_Latn "
    "azb_Arab azj_Latn bak_Cyrl bam_Latn ban_Latn bel_Cyrl bem_Latn ben_Beng bho_Deva "
    "bjn_Arab bjn_Latn bod_Tibt bos_Latn bug_Latn bul_Cyrl cat_Latn ceb_Latn ces_Latn "
    "cjk_Latn ckb_Arab crh_Latn cym_Latn dan_Latn deu_Latn dik_Latn dyu_Latn dzo_Tibt "
    "ell_Grek eng_Latn epo_Latn est_Latn eus_Latn ewe_Latn fao_Latn pes_Arab fij_Latn "
    "fin_Latn fon_Latn fra_Latn fur_Latn fuv_Latn gla_Latn gle_Latn glg_Latn grn_Latn "
    "guj_Gujr hat_Latn hau_Latn heb_Hebr hin_Deva hne_Deva hrv_Latn hun_Latn hye_Armn "
    "ibo_Latn ilo_Latn ind_Latn isl_Latn ita_Latn jav_Latn jpn_Jpan kab_Latn kac_Latn "
    "kam_Latn kan_Knda kas_Arab kas_Deva kat_Geor knc_Arab knc_Latn kaz_Cyrl kbp_Latn "
    "kea_Latn khm_Khmr kik_Latn kin_Latn kir_Cyrl kmb_Latn kon_Latn kor_Hang kmr_Latn "
    "lao_Laoo lvs_Latn lij_Latn lim_Latn lin_Latn lit_Latn lmo_Latn ltg_Latn ltz_Latn "
    "lua_Latn lug_Latn luo_Latn lus_Latn mag_Deva mai_Deva mal_Mlym mar_Deva min_Latn "
    "mkd_Cyrl plt_Latn mlt_Latn mni_Beng khk_Cyrl mos_Latn mri_Latn zsm_Latn mya_Mymr "
    "nld_Latn nno_Latn nob_Latn npi_Deva nso_Latn nus_Latn nya_Latn oci_Latn gaz_Latn "
    "ory_Orya pag_Latn pan_Guru pap_Latn pol_Latn por_Latn prs_Arab pbt_Arab quy_Latn "
    "ron_Latn run_Latn rus_Cyrl sag_Latn san_Deva sat_Beng scn_Latn shn_Mymr sin_Sinh "
    "slk_Latn slv_Latn smo_Latn sna_Latn snd_Arab som_Latn sot_Latn spa_Latn als_Latn "
    "srd_Latn srp_Cyrl ssw_Latn sun_Latn swe_Latn swh_Latn szl_Latn tam_Taml tat_Cyrl "
    "tel_Telu tgk_Cyrl tgl_Latn tha_Thai tir_Ethi taq_Latn taq_Tfng tpi_Latn tsn_Latn "
    "tso_Latn tuk_Latn tum_Latn tur_Latn twi_Latn tzm_Tfng uig_Arab ukr_Cyrl umb_Latn "
    "urd_Arab uzn_Latn vec_Latn vie_Latn war_Latn wol_Latn xho_Latn ydd_Hebr yor_Latn "
    "yue_Hant zho_Hans zho_Hant zul_Latn "
).split()

_SPM_FAMILIES = {"T5Tokenizer": "t5", "T5TokenizerFast": "t5", "MT5Tokenizer": "t5",
                 "MT5TokenizerFast": "t5", "PegasusTokenizer": "pegasus",
                 "PegasusTokenizerFast": "pegasus", "MBartTokenizer": "mbart",
                 "MBartTokenizerFast": "mbart", "MBart50Tokenizer": "mbart50",
                 "MBart50TokenizerFast": "mbart50", "NllbTokenizer": "nllb",
                 "NllbTokenizerFast": "nllb"}
_SPM_MODEL_TYPES = {"t5": "t5", "mt5": "t5", "pegasus": "pegasus", "mbart": "mbart",
                    "m2m_100": "nllb"}


def _varint(buf, i):
    out = shift = 0
    while True:
        if i >= len(buf):
            raise ValueError("truncated")
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return out, i


def _proto_field(buf, number):
    """The last length-delimited field `number` of a protobuf message (bytes), None if
    absent."""
    i, found = 0, None
    while i < len(buf):
        key, i = _varint(buf, i)
        wire = key & 7
        if wire == 0:
            _, i = _varint(buf, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            n, i = _varint(buf, i)
            if key >> 3 == number:
                found = buf[i:i + n]
            i += n
        else:
            raise ValueError(f"wire type {wire}")
        if i > len(buf):
            raise ValueError("truncated")
    return found


def _precompiled_charsmap(blob):
    """NormalizerSpec.precompiled_charsmap (ModelProto field 3, its field 2) of a SentencePiece
    model, None when it has none."""
    spec = _proto_field(blob, 3)
    charsmap = _proto_field(spec, 2) if spec else None
    return bytes(charsmap) if charsmap else None


def spm_tokenizer(path, kind=None):
    """A :class:`JsonTokenizer` for a T5 / mT5, Pegasus, mBART, mBART-50 or NLLB folder with its
    SentencePiece model (``spiece.model`` / ``sentencepiece.bpe.model``) and no
    ``tokenizer.json``: the pipeline transformers 5.25 builds from the model for that class, read
    through ``sentencepiece`` (pieces, scores; the normalization table from the model file) and
    run by ``tokenizers``.

    - T5: the SentencePiece ids as they are (``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2), then
      ``extra_ids`` sentinels ``<extra_id_N>`` from N = extra_ids - 1 down to 0; ``$A </s>``.
    - Pegasus: ``<pad>`` 0, ``</s>`` 1, the mask tokens (``mask_token`` 2, ``mask_token_sent``
      3, as transformers 5 orders them from a SentencePiece file), ``<unk_2>`` ...
      ``<unk_{offset-1}>``, then the pieces from SentencePiece id 2 on (id + offset);
      ``$A </s>``.
    - mBART / mBART-50 / NLLB: the fairseq mapping (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2,
      ``<unk>`` 3, SentencePiece ids + 1); mBART / mBART-50: the language codes after the
      pieces, then ``<mask>``; NLLB (a BPE model, merges read from the vocabulary as
      transformers does): ``<mask>`` then the language codes (the config's list, else
      NLLB-200's). The source language token is placed as for a tokenizer.json.
    """
    tk = require("tokenizers", "reading a SentencePiece tokenizer")
    spm = require("sentencepiece", "reading a SentencePiece tokenizer")
    path = os.fspath(path)
    cfg_path = os.path.join(path, "tokenizer_config.json")
    cfg = read_json(cfg_path, "tokenizer config", dict) if os.path.isfile(cfg_path) else {}
    smap_path = os.path.join(path, "special_tokens_map.json")
    smap = read_json(smap_path, "special tokens map", dict) if os.path.isfile(smap_path) else {}
    cls = cfg.get("tokenizer_class")
    kind = kind or _SPM_FAMILIES.get(cls)
    if kind is None and cls is None and os.path.isfile(os.path.join(path, "config.json")):
        kind = _SPM_MODEL_TYPES.get(read_json(os.path.join(path, "config.json"), "model config",
                                              dict).get("model_type"))
    if kind is None:
        raise ValueError(f"{path} has a SentencePiece model and no tokenizer.json, and its "
                         f"tokenizer_class={cls!r} is not one fastattn reads from the model "
                         "(T5 / mT5, Pegasus, mBART, mBART-50, NLLB)")
    name = "spiece.model" if kind in ("t5", "pegasus") else "sentencepiece.bpe.model"
    file = os.path.join(path, name)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{path} has no tokenizer.json and no {name}")
    kwargs = cfg.get("sp_model_kwargs") or {}
    if not isinstance(kwargs, dict) or kwargs.get("enable_sampling"):
        raise ValueError(f"{cfg_path}: sp_model_kwargs must be a JSON object without "
                         "enable_sampling (fastattn encodes deterministically only)")
    with open(file, "rb") as f:
        blob = f.read()
    proc = spm.SentencePieceProcessor()
    try:
        proc.LoadFromSerializedProto(blob)
        charsmap = _precompiled_charsmap(blob)
    except (OSError, RuntimeError, ValueError) as exc:
        raise ValueError(f"{file} is not a SentencePiece model: {exc}") from None
    pieces = [(proc.IdToPiece(i), float(proc.GetScore(i))) for i in range(proc.GetPieceSize())]

    def special(key, default):
        return _content(cfg.get(key)) or _content(smap.get(key)) or default

    pad, eos, unk = special("pad_token", "<pad>"), special("eos_token", "</s>"), \
        special("unk_token", "<unk>")
    added = []                          # (content, lstrip, normalized), in transformers' order
    metaspace = tk.pre_tokenizers.Metaspace(replacement=_UNDERLINE, prepend_scheme="always",
                                            split=True)
    squeeze = tk.normalizers.Replace(tk.Regex(" {2,}"), " ")
    precompiled = [tk.normalizers.Precompiled(charsmap)] if charsmap else []
    pre, norm = metaspace, tk.normalizers.Sequence(precompiled + [squeeze])
    if kind == "t5":
        n = cfg.get("extra_ids", 100)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"{cfg_path}: extra_ids={n!r} must be a non-negative integer")
        vocab = pieces + [(f"<extra_id_{i}>", 0.0) for i in range(n - 1, -1, -1)]
        model = tk.models.Unigram(vocab, proc.unk_id(), byte_fallback=False)
        norm = precompiled[0] if precompiled else None
        pre = tk.pre_tokenizers.Sequence([tk.pre_tokenizers.WhitespaceSplit(), metaspace])
        added = [(t, False, False) for t in (pad, eos, unk)] + \
            [(f"<extra_id_{i}>", False, False) for i in range(n)]
    elif kind == "pegasus":
        offset = cfg.get("offset", 103)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 2:
            raise ValueError(f"{cfg_path}: offset={offset!r} must be an integer >= 2")
        mask, mask_sent = special("mask_token", "<mask_1>"), special("mask_token_sent",
                                                                     "<mask_2>")
        vocab = [(pad, 0.0), (eos, 0.0), (mask, 0.0)] + \
            ([(mask_sent, 0.0)] if mask_sent != mask else []) + \
            [(f"<unk_{i}>", -100.0) for i in range(2, offset)] + pieces[2:]
        try:
            unk_id = vocab.index((unk, 0.0), 1)
        except ValueError:
            raise ValueError(f"{file}: no {unk!r} piece with score 0 (the unknown "
                             "token)") from None
        model = tk.models.Unigram(vocab, unk_id, byte_fallback=False)
        if not precompiled:
            norm = tk.normalizers.Sequence([tk.normalizers.Replace(tk.Regex("\n"), " "),
                                            squeeze])
        added = [(t, False, False) for t, _ in vocab[:len(vocab) - len(pieces) + 2]] + \
            [(unk, False, False)]
    elif kind in ("mbart", "mbart50"):
        bos = special("bos_token" if kind == "mbart" else "cls_token", "<s>")
        mask = special("mask_token", "<mask>")
        codes = _MBART_CODES if kind == "mbart" else _MBART50_CODES
        vocab = [(bos, 0.0), (pad, 0.0), (eos, 0.0), (unk, 0.0)] + pieces[3:] + \
            [(c, 0.0) for c in codes] + [(mask, 0.0)]
        model = tk.models.Unigram(vocab, 3, byte_fallback=False)
        # transformers >= 5.25: trailing whitespace stripped; mBART's runs of spaces become one
        # U+2581, mBART-50's one space (its Metaspace then splits there as well)
        strip = tk.normalizers.Strip(left=False, right=True)
        if kind == "mbart":
            norm = tk.normalizers.Sequence(
                precompiled + [strip, tk.normalizers.Replace(tk.Regex(" {2,}"), _UNDERLINE)])
            pre = tk.pre_tokenizers.Sequence([tk.pre_tokenizers.WhitespaceSplit(), metaspace])
        else:
            norm = tk.normalizers.Sequence(precompiled + [strip, squeeze])
        added = [(t, False, False) for t in (bos, pad, eos, unk) + tuple(codes)] + \
            [(mask, True, False)]
    else:                               # nllb: BPE, merges from the vocabulary order
        bos, mask = special("bos_token", "<s>"), special("mask_token", "<mask>")
        raw = {p: i for i, (p, _) in enumerate(pieces)}
        vocab = {bos: 0, pad: 1, eos: 2, unk: 3}
        for p, _ in pieces:
            vocab.setdefault(p, len(vocab))
        model = tk.models.BPE(vocab=vocab, merges=_merges(raw), dropout=None, unk_token=unk,
                              fuse_unk=True, byte_fallback=False)
        if not precompiled:
            norm = None
        codes = cfg.get("extra_special_tokens")
        if not isinstance(codes, list) or not codes:
            codes = cfg.get("additional_special_tokens") or \
                smap.get("additional_special_tokens")
        codes = [c for c in map(_content, codes)] if isinstance(codes, list) and codes \
            else list(_NLLB_CODES)
        added = [(t, False, False) for t in (bos, pad, eos, unk)] + [(mask, True, True)] + \
            [(c, False, False) for c in codes if c]
    t = tk.Tokenizer(model)
    if norm is not None:
        t.normalizer = norm
    t.pre_tokenizer = pre
    t.decoder = tk.decoders.Metaspace(replacement=_UNDERLINE, prepend_scheme="always",
                                      split=True)
    seen = set()
    tokens = []
    for content, lstrip, normalized in added:
        if content in seen:
            continue
        seen.add(content)
        tokens.append(tk.AddedToken(content, lstrip=lstrip, rstrip=False, single_word=False,
                                    normalized=normalized, special=True))
    t.add_special_tokens(tokens)
    eos_id = t.token_to_id(eos)
    if eos_id is None:
        raise ValueError(f"{file}: eos_token={eos!r} has no id")
    t.post_processor = tk.processors.TemplateProcessing(
        single=["$A", eos], pair=["$A", "$B", eos], special_tokens=[(eos, eos_id)])
    if kind in ("mbart", "mbart50", "nllb") and cls is None:
        cfg = dict(cfg, tokenizer_class={"mbart": "MBartTokenizer",
                                         "mbart50": "MBart50Tokenizer",
                                         "nllb": "NllbTokenizer"}[kind])
    return JsonTokenizer(path, _tokenizer=t, _config=cfg)


def _merges(vocab):
    """BPE merges read from a SentencePiece BPE vocabulary (piece -> id) as transformers does:
    every split of a piece into two pieces of the vocabulary, ordered by the merged piece's id,
    then the lengths of the left and right parts, then the parts' ids."""
    merges = []
    for merge, rank in vocab.items():
        local = [(merge[:k], merge[k:], rank) for k in range(1, len(merge))
                 if merge[:k] in vocab and merge[k:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])))
    return [(a, b) for a, b, _ in merges]


def load_tokenizer(path, family=None):
    """The tokenizer of a model folder: Marian's SentencePiece files; M2M100's
    ``sentencepiece.bpe.model`` + ``vocab.json``; else ``tokenizer.json``; else a T5 / Pegasus /
    mBART / mBART-50 / NLLB SentencePiece model (:func:`spm_tokenizer`, the family from
    tokenizer_class, else config.json's model_type); else a BERT ``vocab.txt``. ``family="marian"`` / ``"m2m_100"`` insists on that family's files (an
    ``m2m_100`` folder with a tokenizer.json is NLLB's and reads it).

    Raises FileNotFoundError naming what is missing, ImportError naming
    ``pip install "fastattn[text]"`` when sentencepiece / tokenizers is not installed.
    """
    path = check_folder(path)
    has = lambda name: os.path.isfile(os.path.join(path, name))  # noqa: E731
    cls = None
    if has("tokenizer_config.json"):
        cls = read_json(os.path.join(path, "tokenizer_config.json"), "tokenizer config",
                        dict).get("tokenizer_class")
    if family == "marian" or has("source.spm") or cls in ("MarianTokenizer",
                                                          "MarianTokenizerFast"):
        missing = [f for f in ("source.spm", "target.spm", "vocab.json") if not has(f)]
        if missing:
            raise FileNotFoundError(f"{path} has no Marian tokenizer: {', '.join(missing)} "
                                    "not found")
        return MarianTokenizer(path)
    m2m_files = ("sentencepiece.bpe.model", "vocab.json")
    spm_only = not has("tokenizer.json") and cls not in ("M2M100Tokenizer",) and \
        (cls in _SPM_FAMILIES or has("spiece.model") or
         (has("sentencepiece.bpe.model") and not has("vocab.json") and family != "m2m_100"))
    if not spm_only and (cls == "M2M100Tokenizer" or
                         (family == "m2m_100" and not has("tokenizer.json")) or
                         (not has("tokenizer.json") and all(map(has, m2m_files)))):
        missing = [f for f in m2m_files if not has(f)]
        if missing:
            raise FileNotFoundError(f"{path} has no M2M100 tokenizer: {', '.join(missing)} "
                                    "not found")
        return M2M100Tokenizer(path)
    if has("tokenizer.json"):
        return JsonTokenizer(path)
    if spm_only:
        return spm_tokenizer(path)
    if has("vocab.txt"):
        return bert_wordpiece(path)
    raise FileNotFoundError(f"{path} has no tokenizer: none of source.spm (Marian), "
                            "sentencepiece.bpe.model + vocab.json (M2M100), tokenizer.json, "
                            "spiece.model / sentencepiece.bpe.model (T5, Pegasus, mBART, NLLB) "
                            "or vocab.txt (BERT) was found")
