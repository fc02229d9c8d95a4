"""A T5 / mT5, Pegasus, mBART, mBART-50 or NLLB folder that ships only its SentencePiece model
(``spiece.model`` / ``sentencepiece.bpe.model``), no ``tokenizer.json``: the pipeline
transformers 5.25 builds from the model file (the pieces and scores, read with
``sentencepiece``; the model's normalization table; the family's special tokens and id layout:
T5 sentinels, Pegasus' offset, the fairseq mapping), run by ``tokenizers``."""
import os

from ...io.huggingface import read_json
from ...models import registry
from ..._deps import require
from ._protobuf import precompiled_charsmap
from .base import _UNDERLINE, _check_sp_model_kwargs, _content, _read_configs, _special
from .json_tokenizer import JsonTokenizer
from .languages import MBART50_CODES, MBART_CODES, NLLB_CODES

__all__ = ["spm_tokenizer", "SPM_FAMILIES"]

# tokenizer_class -> the SentencePiece family spm_tokenizer builds
SPM_FAMILIES = {"T5Tokenizer": "t5", "T5TokenizerFast": "t5", "MT5Tokenizer": "t5",
                "MT5TokenizerFast": "t5", "PegasusTokenizer": "pegasus",
                "PegasusTokenizerFast": "pegasus", "MBartTokenizer": "mbart",
                "MBartTokenizerFast": "mbart", "MBart50Tokenizer": "mbart50",
                "MBart50TokenizerFast": "mbart50", "NllbTokenizer": "nllb",
                "NllbTokenizerFast": "nllb"}


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
    cfg, cfg_path, smap = _read_configs(path)
    cls = cfg.get("tokenizer_class")
    kind = kind or SPM_FAMILIES.get(cls)
    if kind is None and cls is None and os.path.isfile(os.path.join(path, "config.json")):
        family = registry.family(read_json(os.path.join(path, "config.json"), "model config",
                                           dict).get("model_type"), "seq2seq")
        kind = None if family is None else family.spm_tokenizer
    if kind is None:
        raise ValueError(f"{path} has a SentencePiece model and no tokenizer.json, and its "
                         f"tokenizer_class={cls!r} is not one fastattn reads from the model "
                         "(T5 / mT5, Pegasus, mBART, mBART-50, NLLB)")
    name = "spiece.model" if kind in ("t5", "pegasus") else "sentencepiece.bpe.model"
    file = os.path.join(path, name)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{path} has no tokenizer.json and no {name}")
    _check_sp_model_kwargs(cfg, cfg_path)
    with open(file, "rb") as f:
        blob = f.read()
    proc = spm.SentencePieceProcessor()
    try:
        proc.LoadFromSerializedProto(blob)
        charsmap = precompiled_charsmap(blob)
    except (OSError, RuntimeError, ValueError) as exc:
        raise ValueError(f"{file} is not a SentencePiece model: {exc}") from None
    pieces = [(proc.IdToPiece(i), float(proc.GetScore(i))) for i in range(proc.GetPieceSize())]

    def special(key, default):
        return _special(cfg, smap, key, default)

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
        codes = MBART_CODES if kind == "mbart" else MBART50_CODES
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
            else list(NLLB_CODES)
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
