"""Every model family fastattn runs, registered once, by config.json ``model_type``.

A family (:mod:`fastattn.models.family`) says which model class runs it (``kind``), reads its
config.json into that class's spec and maps its checkpoint's tensor names onto the network.
The model classes (:class:`~fastattn.Seq2SeqTransformer`, :class:`~fastattn.EncoderModel`,
:class:`~fastattn.WhisperModel`),
``fastattn.text`` (Translator, SentenceEncoder), ``fastattn convert`` and the commands ask this
module which family a folder is; nothing else looks at ``model_type``.

To add a family: write its module (a :class:`~fastattn.models.family.Family` subclass and an
instance of it), add the instance to :data:`FAMILIES` below, and test it
(docs/contributing.md).
"""
from .bart import BART, M2M100, MBART, PEGASUS
from .bert import BERT, DISTILBERT, ROBERTA
from .family import KINDS
from .marian import MARIAN
from .modernbert import MODERNBERT
from .mpnet import MPNET
from .t5 import MT5, T5
from .whisper import WHISPER

__all__ = ["FAMILIES", "KINDS", "family", "model_types", "other_kind_hint", "titles"]

#: the families, in the order their model types are listed in messages
FAMILIES = (
    # encoder-decoders: Seq2SeqTransformer
    MARIAN, BART, MBART, PEGASUS, M2M100, T5, MT5,
    # encoders: EncoderModel
    BERT, ROBERTA, DISTILBERT, MPNET, MODERNBERT,
    # speech: WhisperModel
    WHISPER,
)

_BY_TYPE = {}
for _family in FAMILIES:
    if _family.kind not in KINDS:
        raise TypeError(f"{_family!r}: kind must be one of {sorted(KINDS)}")
    for _type in _family.model_types:
        if _type in _BY_TYPE:
            raise ValueError(f"model_type {_type!r} is registered twice")
        _BY_TYPE[_type] = _family
del _family, _type


def family(model_type, kind=None):
    """The family registered for `model_type` (of `kind`, when given), or None."""
    found = _BY_TYPE.get(model_type) if isinstance(model_type, str) else None
    if found is None or (kind is not None and found.kind != kind):
        return None
    return found


def model_types(kind):
    """The model types of the families of `kind` (a key of KINDS: "seq2seq", "encoder",
    "speech"), in registration order."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
    return tuple(t for f in FAMILIES if f.kind == kind for t in f.model_types)


def titles(kind):
    """The names of the families of `kind`, for help texts: "Marian / OPUS-MT, BART, ..."."""
    model_types(kind)                               # checks kind
    return ", ".join(f.title for f in FAMILIES if f.kind == kind)


def other_kind_hint(model_type):
    """For a message rejecting `model_type` where one kind is expected: " (load it with
    fastattn.WhisperModel)", the class of its registered family, or "" when unregistered."""
    found = family(model_type)
    return "" if found is None else f" (load it with fastattn.{KINDS[found.kind]})"
