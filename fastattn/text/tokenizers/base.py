"""What every tokenizer shares: the :class:`Tokenizer` interface the text front ends use, the
checks of their arguments, and reading a folder's tokenizer_config.json /
special_tokens_map.json."""
import os

from ...io.huggingface import read_json

__all__ = ["Tokenizer", "check_texts", "clean_up_tokenization"]

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


def clean_up_tokenization(text):
    """transformers' ``clean_up_tokenization``: no space before . ? ! , and English clitics."""
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
                 (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"),
                 (" 're", "'re")):
        text = text.replace(a, b)
    return text


# -- the folder's configuration files -------------------------------------------------------------

def _optional_json(path, what):
    """The JSON object in the file `path`, {} when there is no such file."""
    return read_json(path, what, dict) if os.path.isfile(path) else {}


def _read_config(folder):
    """(tokenizer_config.json of `folder` ({} when missing), its path)."""
    cfg_path = os.path.join(folder, "tokenizer_config.json")
    return _optional_json(cfg_path, "tokenizer config"), cfg_path


def _read_configs(folder):
    """(tokenizer_config.json, its path, special_tokens_map.json) of `folder`, {} for a missing
    file."""
    cfg, cfg_path = _read_config(folder)
    smap = _optional_json(os.path.join(folder, "special_tokens_map.json"), "special tokens map")
    return cfg, cfg_path, smap


def _content(token):
    """A special token as tokenizer_config.json writes it: a str, or an AddedToken dict."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) and token else None


def _special(cfg, smap, name, default):
    """The special token `name` (``eos_token``, ...): tokenizer_config.json's, then
    special_tokens_map.json's, then `default`."""
    return _content(cfg.get(name)) or _content(smap.get(name)) or default


def _check_sp_model_kwargs(cfg, cfg_path):
    """ValueError for sp_model_kwargs that are not a JSON object or enable sampling."""
    kwargs = cfg.get("sp_model_kwargs") or {}
    if not isinstance(kwargs, dict) or kwargs.get("enable_sampling"):
        raise ValueError(f"{cfg_path}: sp_model_kwargs must be a JSON object without "
                         "enable_sampling (fastattn encodes deterministically only)")


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
