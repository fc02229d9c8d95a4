"""What a model family is: the object :mod:`fastattn.models.registry` lists by ``model_type``.

A family turns a checkpoint folder of its ``model_type`` (transformers' config.json, its
safetensors) into the model class that runs it:

- ``kind``: the model class, ``"seq2seq"`` (:class:`fastattn.Seq2SeqTransformer`),
  ``"encoder"`` (:class:`fastattn.EncoderModel`) or ``"speech"`` (:class:`fastattn.WhisperModel`,
  a Seq2SeqTransformer with an audio encoder stem);
- ``model_types``: the config.json ``model_type`` values it reads; ``title``: its name in
  messages and help texts;
- ``read_config(raw, where)``: the parsed config.json (a dict read from the file `where`) ->
  the spec the model class takes (Seq2SeqTransformer: its keyword dict, with the generation
  settings config.json itself holds under ``generation_config``; EncoderModel: an
  :class:`~fastattn.models.bert.EncoderConfig`; WhisperModel: its keyword dict, as
  Seq2SeqTransformer's); a field that would change the numbers and is
  not supported is a ValueError naming it;
- ``name_map(spec)``: where each checkpoint tensor goes in the model's network, a list of
  :class:`Entry`;
- the hooks of its kind: a seq2seq (or speech) family's ``state_dict(weights, spec)`` (the checkpoint's
  tensors under the names of the name map: shared and tied tables resolved) and
  ``untie(spec, weights, path)`` (copies of tied tables that differ, read as transformers reads
  them); an encoder family's ``anchor`` / ``layer_prefix`` (the tensor that locates the
  checkpoint's prefix, and where its layers are numbered).

Families live one module each (``bart.py`` holds the BART-style ones, small subclasses of one
another; ``marian.py``, ``t5.py``, ``bert.py`` (BERT, RoBERTa, DistilBERT), ``mpnet.py``,
``modernbert.py``, ``whisper.py``), import nothing of the model classes, and are registered
once, in ``registry.py``.
"""
from collections import namedtuple

__all__ = ["Entry", "Family", "KINDS"]

#: a family's kind -> the model class that runs it
KINDS = {"seq2seq": "Seq2SeqTransformer", "encoder": "EncoderModel", "speech": "WhisperModel"}


class Entry(namedtuple("Entry", "checkpoint network rows shape part")):
    """One name-map entry: the checkpoint tensor ``checkpoint`` (its rows ``part`` = (a, b), or
    all of it: None) is rows ``rows`` = (a, b) (or all: None) of the network parameter
    ``network`` (a fastattn.nn name: ``encoder.layers.0.self_attn.in_proj_weight``), seen in the
    checkpoint's ``shape`` (None: the network block's own shape; Seq2SeqTransformer gives it
    always, e.g. ``final_logits_bias`` (1, V) of a (V,) bias)."""

    __slots__ = ()

    def __new__(cls, checkpoint, network, rows=None, shape=None, part=None):
        return super().__new__(cls, checkpoint, network, rows, shape, part)


class Family:
    """The interface (see the module docstring); subclasses set the attributes and methods."""

    kind = None              # a key of KINDS: "seq2seq", "encoder" or "speech"
    model_types = ()         # config.json model_type values
    title = None             # the family's name for people ("M2M100 / NLLB")

    def read_config(self, raw, where):
        raise NotImplementedError

    def name_map(self, spec):
        raise NotImplementedError

    def __repr__(self):
        return f"<{self.kind} family {'/'.join(self.model_types)}>"
