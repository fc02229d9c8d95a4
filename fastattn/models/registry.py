"""Every model family fastattn runs, registered once, by config.json ``model_type``.

A family (:mod:`fastattn.models.family`) says which model class runs it (``kind``), reads its
config.json into that class's spec and maps its checkpoint's tensor names onto the network.
The model classes (:class:`~fastattn.Seq2SeqTransformer`, :class:`~fastattn.EncoderModel`),
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

__all__ = ["FAMILIES", "KINDS", "family", "model_types", "titles"]

#: the families, in the order their model types are listed in messages
FAMILIES = (
    # encoder-decoders: Seq2SeqTransformer
    MARIAN, BART, MBART, PEGASUS, M2M100, T5, MT5,
    # encoders: EncoderModel
    BERT, ROBERTA, DISTILBERT, MPNET, MODERNBERT,
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
    """The model types of the families of `kind` ("seq2seq" or "encoder"), in registration
    order."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
    return tuple(t for f in FAMILIES if f.kind == kind for t in f.model_types)


def titles(kind):
    """The names of the families of `kind`, for help texts: "Marian / OPUS-MT, BART, ..."."""
    model_types(kind)                               # checks kind
    return ", ".join(f.title for f in FAMILIES if f.kind == kind)
