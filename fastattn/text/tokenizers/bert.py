"""A BERT-family folder that ships only ``vocab.txt``: the pipeline transformers' converter
builds (BertNormalizer with the folder's ``do_lower_case`` / ``strip_accents`` /
``tokenize_chinese_chars``, BertPreTokenizer, WordPiece, ``[CLS] $A [SEP]``), run by
``tokenizers``."""
import os

from ..._deps import require
from .base import _content, _read_config
from .json_tokenizer import JsonTokenizer

__all__ = ["bert_wordpiece"]


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
    cfg, _ = _read_config(path)
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
