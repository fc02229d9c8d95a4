"""Which tokenizer a model folder gets: :func:`load_tokenizer` picks the class from the folder's
files."""
import os

from ..._validation import check_folder
from .base import _read_config
from .bert import bert_wordpiece
from .json_tokenizer import JsonTokenizer
from .m2m100 import M2M100Tokenizer
from .marian import MarianTokenizer
from .spm_only import SPM_FAMILIES, spm_tokenizer

__all__ = ["load_tokenizer"]


def load_tokenizer(path, family=None):
    """The tokenizer of a model folder: Marian's SentencePiece files; M2M100's
    ``sentencepiece.bpe.model`` + ``vocab.json``; else ``tokenizer.json``; else a T5 / Pegasus /
    mBART / mBART-50 / NLLB SentencePiece model (:func:`spm_tokenizer`, the family from
    tokenizer_class, else config.json's model_type); else a BERT ``vocab.txt``.
    ``family="marian"`` / ``"m2m_100"`` insists on that family's files (an ``m2m_100`` folder
    with a tokenizer.json is NLLB's and reads it).

    Raises FileNotFoundError naming what is missing, ImportError naming
    ``pip install "fastattn[text]"`` when sentencepiece / tokenizers is not installed.
    """
    path = check_folder(path)
    has = lambda name: os.path.isfile(os.path.join(path, name))  # noqa: E731
    cls = _read_config(path)[0].get("tokenizer_class")
    if family == "marian" or has("source.spm") or cls in ("MarianTokenizer",
                                                          "MarianTokenizerFast"):
        missing = [f for f in ("source.spm", "target.spm", "vocab.json") if not has(f)]
        if missing:
            raise FileNotFoundError(f"{path} has no Marian tokenizer: {', '.join(missing)} "
                                    "not found")
        return MarianTokenizer(path)
    m2m_files = ("sentencepiece.bpe.model", "vocab.json")
    spm_only = not has("tokenizer.json") and cls not in ("M2M100Tokenizer",) and \
        (cls in SPM_FAMILIES or has("spiece.model") or
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
