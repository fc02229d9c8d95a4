"""Argos Translate packages: what LibreTranslate installs and runs.

A package is a zip (``translate-en_de-1_9.argosmodel``) of one folder, or that folder once
installed (``~/.local/share/argos-translate/packages/translate-en_de-1_9``):

    metadata.json           from_code, to_code, from_name, to_name, package_version,
                            argos_version, type ("translate"), target_prefix (optional)
    model/                  a CTranslate2 TransformerSpec folder (OpenNMT-py's converter:
                            model.bin, config.json, shared_vocabulary.*)
    sentencepiece.model     the text's SentencePiece model (older packages: bpe.model)
    stanza/ or minisbd/     a sentence-boundary model (not read: see below)

:class:`fastattn.Translator` takes either (``Translator("translate-en_de-1_9.argosmodel")``)
and translates each input string as argostranslate's ``translate(q, from, to)`` does:

- the text is cut into paragraphs at ``\\n`` and each paragraph into sentences;
- each sentence is cut into pieces by the SentencePiece model (``out_type=str``), the pieces
  mapped onto the model's vocabulary (a piece it lacks is the unknown token);
- decoding is CTranslate2's beam search as argostranslate calls it: ``beam_size=4``,
  ``length_penalty=0.2``, one hypothesis, ``max_decoding_length=256``, ``replace_unknowns=True``
  (an unknown token in the output becomes the source piece the model's alignment head -- the
  spec's ``alignment_layer`` / ``alignment_heads``, OpenNMT-py's last layer's first head --
  attends to most), the package's ``target_prefix`` forced first when it has one;
- the hypotheses' pieces of a paragraph's sentences are joined and decoded by SentencePiece,
  then ``▁`` and ``_`` become spaces (argostranslate's ``SentencePieceTokenizer.decode``), the
  target prefix is removed from the start, then one leading space; paragraphs are joined with
  ``\\n`` and leading newlines removed.

Sentence boundaries: argostranslate finds them with a neural model (MiniSBD, or Stanza in older
packages), which needs onnxruntime / torch and a model download. fastattn splits with rules
(:func:`split_sentences`: ``. ! ? …`` and their CJK forms followed by a space and not closing an
abbreviation, an initial or a number), which agree with the neural splitters on ordinary prose;
where they disagree the sentences are translated in other pieces. The translation of each
sentence is argostranslate's (``tests/text/test_argos.py`` runs argostranslate's own pipeline on
the same sentences as the reference).

Not supported, each a ValueError naming the file: packages of another ``type`` (sentence
boundary packages), Moses + BPE packages (``bpe.model``), several source vocabularies.
"""
import json
import os
import re
import shutil
import tempfile
import zipfile


from ..io.ctranslate2 import read_config, read_vocabulary
from ..models import _ct2

__all__ = ["is_package", "ArgosPackage", "split_sentences"]

METADATA = "metadata.json"
SUFFIX = ".argosmodel"
# argostranslate's decoding (translate.apply_packaged_translation, settings' ARGOS_BEAM_SIZE)
DECODING = {"num_beams": 4, "length_penalty": 0.2, "beam_rule": "ctranslate2"}
MAX_DECODING_LENGTH = 256           # CTranslate2's translate_batch default
MAX_INPUT_LENGTH = 1024             # CTranslate2's translate_batch default
_MAX_UNZIPPED = 8 << 30             # a package bigger than this unzipped is refused


def _folder_of(path):
    """The package folder in `path` (itself, or its only sub-folder holding metadata.json)."""
    if os.path.isfile(os.path.join(path, METADATA)):
        return path
    subs = [os.path.join(path, d) for d in sorted(os.listdir(path))
            if os.path.isfile(os.path.join(path, d, METADATA))]
    return subs[0] if len(subs) == 1 else None


def is_package(path):
    """Whether `path` is an Argos Translate package: a folder with metadata.json and
    model/model.bin, or a zip file (``.argosmodel``) holding one."""
    try:
        path = os.fspath(path)
    except TypeError:
        return False
    if os.path.isdir(path):
        return os.path.isfile(os.path.join(path, METADATA)) and \
            os.path.isfile(os.path.join(path, "model", "model.bin"))
    if os.path.isfile(path) and zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
        except (zipfile.BadZipFile, OSError):
            return False
        return any(n.rstrip("/").split("/")[-1] == METADATA and n.count("/") <= 1
                   for n in names)
    return False


def _extract(path, into):
    """Unzip the package `path` into the folder `into`, refusing members that would land
    outside it (absolute paths, ``..``), links and archives of more than 8 GiB -> the package
    folder."""
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
            if sum(i.file_size for i in infos) > _MAX_UNZIPPED:
                raise ValueError(f"{path}: the package unzips to more than "
                                 f"{_MAX_UNZIPPED >> 30} GiB")
            for info in infos:
                name = info.filename
                parts = name.replace("\\", "/").split("/")
                if name.startswith(("/", "\\")) or ".." in parts or ":" in parts[0]:
                    raise ValueError(f"{path}: member {name!r} would be written outside the "
                                     "package folder")
                if (info.external_attr >> 16) & 0o170000 == 0o120000:
                    raise ValueError(f"{path}: member {name!r} is a symbolic link")
            z.extractall(into)
    except zipfile.BadZipFile as exc:
        raise ValueError(f"{path} is not a valid .argosmodel (zip) file: {exc}") from None
    folder = _folder_of(into)
    if folder is None:
        raise ValueError(f"{path}: no {METADATA} at the top of the package (or in its one "
                         "folder)")
    return folder


def _string_field(meta, key, where, required=True):
    value = meta.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value):
        raise ValueError(f"{where}: field {key!r} must be a non-empty string, got {value!r}")
    return value


# -- sentences ---------------------------------------------------------------------------------

_ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "prof", "st", "sr", "jr", "vs", "etc", "e.g", "i.e", "no", "nr",
    "mt", "ft", "fig", "vol", "ca", "approx", "dept", "inc", "ltd", "co", "corp", "jan", "feb",
    "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "p", "pp", "a.m",
    "p.m", "u.s", "u.k", "z.b", "d.h", "bzw", "usw", "ggf", "vgl", "s", "sr", "sra", "mme",
    "mlle", "m",
}
# a sentence ends at . ! ? … (and runs of them), with closing quotes / brackets after it,
# before white space
_END = re.compile(r"([.!?\u2026]+[\"'\u201d\u2019\u00bb)\]]*)(\s+)")
_CJK_END = re.compile(r"([\u3002\uff01\uff1f\uff61]+[\u300d\u300f\uff09\u201d]*)")


def _closes_abbreviation(before):
    """Whether the period ending `before` closes an abbreviation, an initial or a number."""
    word = re.split(r"\s", before)[-1].lower().rstrip(".")
    word = word.lstrip("\"'(\u201c\u2018\u00ab[")
    if not word:
        return False
    return word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha()) or \
        bool(re.fullmatch(r"\d{1,3}", word))


def split_sentences(text):
    """The sentences of one paragraph (stripped, none empty): cut after ``. ! ? …`` (and
    their closing quotes or brackets) followed by white space and a letter that is not lower
    case, a digit, a quote or a bracket, unless a lone period closes a known abbreviation, a
    one-letter initial or a number of up to three digits; and after the CJK full stops
    ``。 ！ ？``."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    out, start = [], 0
    for m in _END.finditer(text):
        end = m.end(1)
        nxt = text[m.end():m.end() + 1]
        if not nxt or nxt.islower():
            continue
        if m.group(1).rstrip("\"'\u201d\u2019\u00bb)]") == "." and \
                _closes_abbreviation(text[start:m.start(1)]):
            continue
        out.append(text[start:end])
        start = m.end()
    out.append(text[start:])
    sentences = []
    for piece in out:
        start = 0
        for m in _CJK_END.finditer(piece):
            sentences.append(piece[start:m.end()])
            start = m.end()
        sentences.append(piece[start:])
    return [s.strip() for s in sentences if s.strip()]


# -- the package -------------------------------------------------------------------------------

class ArgosPackage:
    """An Argos Translate package (folder or ``.argosmodel`` file): its metadata, its
    SentencePiece model, its CTranslate2 model folder and vocabulary.

    A zip is extracted into a temporary folder that lives as long as this object.

    Attributes
    ----------
    path : str, what was given; folder : str, the package folder; model_folder : str
    from_code, to_code, from_name, to_name, package_version, target_prefix : str
    """

    def __init__(self, path):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a package path (str or os.PathLike), got "
                            f"{type(path).__name__}")
        self.path = os.fspath(path)
        self._tmp = None
        if os.path.isdir(self.path):
            folder = self.path
        elif os.path.isfile(self.path):
            self._tmp = tempfile.mkdtemp(prefix="fastattn-argos-")
            try:
                folder = _extract(self.path, self._tmp)
            except BaseException:
                self.close()
                raise
        else:
            raise FileNotFoundError(f"Argos package not found: {self.path}")
        try:
            self._read(folder)
        except BaseException:
            self.close()
            raise

    def _read(self, folder):
        self.folder = folder
        where = os.path.join(folder, METADATA)
        try:
            with open(where, encoding="utf-8") as f:
                meta = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(f"{folder} is not an Argos package: no {METADATA}") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"{where} is not valid JSON: {exc}") from None
        if not isinstance(meta, dict):
            raise ValueError(f"{where} must hold a JSON object")
        kind = meta.get("type", "translate")
        if kind != "translate":
            raise ValueError(f"{where}: type={kind!r}: only translation packages ('translate') "
                             "are models fastattn runs")
        self.metadata = meta
        self.from_code = _string_field(meta, "from_code", where)
        self.to_code = _string_field(meta, "to_code", where)
        self.from_name = _string_field(meta, "from_name", where, False) or self.from_code
        self.to_name = _string_field(meta, "to_name", where, False) or self.to_code
        self.package_version = str(meta.get("package_version", ""))
        self.target_prefix = _string_field(meta, "target_prefix", where, False) or ""
        self.model_folder = os.path.join(folder, "model")
        if not os.path.isfile(os.path.join(self.model_folder, "model.bin")):
            raise FileNotFoundError(f"{folder}: no model/model.bin (the package's CTranslate2 "
                                    "model)")
        sp_path = os.path.join(folder, "sentencepiece.model")
        if not os.path.isfile(sp_path):
            if os.path.isfile(os.path.join(folder, "bpe.model")):
                raise ValueError(f"{os.path.join(folder, 'bpe.model')}: packages tokenized with "
                                 "Moses and BPE are not supported (only SentencePiece ones)")
            raise FileNotFoundError(f"{folder}: no sentencepiece.model")
        try:
            import sentencepiece as spm
        except ImportError:
            raise ImportError('Argos packages need sentencepiece: pip install '
                              '"fastattn[text]"') from None
        try:
            self.sp = spm.SentencePieceProcessor(model_file=sp_path)
        except (RuntimeError, OSError) as exc:
            raise ValueError(f"{sp_path} is not a SentencePiece model: {exc}") from None
        self._vocabularies()

    def _vocabularies(self):
        m = self.model_folder
        cfg = read_config(m)
        self.config = cfg
        shared = read_vocabulary(m, "shared_vocabulary")
        if shared is not None:
            src = tgt = shared
        else:
            src, tgt = read_vocabulary(m, "source_vocabulary"), read_vocabulary(
                m, "target_vocabulary")
            if src is None and read_vocabulary(m, "source_1_vocabulary") is not None:
                raise ValueError(f"{m}: several source vocabularies (source factors) are not "
                                 "supported")
            if src is None or tgt is None:
                raise FileNotFoundError(f"{m} has no shared_vocabulary (or source_ and "
                                        "target_vocabulary)")
        unk = cfg.get("unk_token", "<unk>")
        self.unk_token = unk
        self.src_tokens = src if unk in src else src + [unk]
        self.tgt_tokens = tgt if unk in tgt else tgt + [unk]
        self._src_index = {t: i for i, t in reversed(list(enumerate(self.src_tokens)))}
        self._tgt_index = {t: i for i, t in reversed(list(enumerate(self.tgt_tokens)))}
        self.src_unk = self._src_index[unk]
        self.tgt_unk = self._tgt_index[unk]
        self.add_source_bos = bool(cfg.get("add_source_bos", False))
        self.add_source_eos = bool(cfg.get("add_source_eos", False))
        self._src_bos = self._src_index.get(cfg.get("bos_token", "<s>"))
        self._src_eos = self._src_index.get(cfg.get("eos_token", "</s>"))
        if self.target_prefix:
            if self.target_prefix not in self._tgt_index:
                raise ValueError(f"{os.path.join(self.folder, METADATA)}: target_prefix="
                                 f"{self.target_prefix!r} is not a token of the model's "
                                 "target vocabulary")
            self.prefix_ids = [self._tgt_index[self.target_prefix]]
        else:
            self.prefix_ids = []

    # -- text ----------------------------------------------------------------------------------

    def paragraphs(self, text):
        """argostranslate's cut of one input: [paragraph: [sentence str]]."""
        return [split_sentences(p) for p in text.split("\n")]

    def source(self, sentence, max_length=MAX_INPUT_LENGTH):
        """(pieces, ids) of one sentence: the SentencePiece pieces, and the model's input ids
        (with the bos / eos the model's config.json asks for, truncated to `max_length` ids
        keeping the eos, as CTranslate2 does)."""
        pieces = self.sp.encode(sentence, out_type=str)
        ids = [self._src_index.get(p, self.src_unk) for p in pieces]
        if self.add_source_bos:
            ids = [self._src_bos] + ids
        if self.add_source_eos:
            ids = ids + [self._src_eos]
        if len(ids) > max_length:
            ids = ids[:max_length - 1] + [ids[-1]] if self.add_source_eos else ids[:max_length]
        return pieces, ids

    def target_tokens(self, ids):
        return [self.tgt_tokens[i] for i in ids]

    def replace_unknowns(self, tokens, pieces, attention):
        """CTranslate2's replace_unknowns on one hypothesis: each unknown token becomes the
        source piece its attention row (over the model's input positions) weighs most, the
        implicit bos / eos positions left out."""
        vectors = _ct2.source_attention(attention[:len(tokens)], len(pieces),
                                        self.add_source_bos, self.add_source_eos)
        return _ct2.replace_unknowns(tokens, pieces, vectors, self.unk_token)

    def decode(self, tokens):
        """argostranslate's SentencePieceTokenizer.decode of one paragraph's pieces, then its
        removal of the target prefix and of one leading space."""
        value = self.sp.decode_pieces(list(tokens)).replace("\u2581", " ").replace("_", " ")
        if self.target_prefix and value.startswith(self.target_prefix):
            value = value[len(self.target_prefix):]
        if value.startswith(" "):
            value = value[1:]
        return value

    def close(self):
        """Delete the temporary folder of an extracted zip (nothing for a folder)."""
        tmp, self._tmp = self._tmp, None
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

    def __del__(self):
        try:
            self.close()
        except Exception:     # interpreter shutdown
            pass

    def __repr__(self):
        return (f"ArgosPackage({self.path!r}, {self.from_code}->{self.to_code}, "
                f"version {self.package_version!r})")
