"""An encoder checkpoint folder read into :class:`fastattn.EncoderModel`: its config.json through
the family of its ``model_type`` (:mod:`fastattn.models.registry`), its tensors through the
family's name map, one at a time from disk; a CTranslate2 folder's through
:mod:`fastattn.models._ct2`."""
import os

from ..io.huggingface import checkpoint_files, read_json, read_safetensors
from . import _ct2, registry

__all__ = ["load_config", "load_weights"]


def load_config(folder):
    """``(family, EncoderConfig)`` of ``folder/config.json``.

    Every field that changes the numbers is honoured or rejected with a ValueError naming it
    (``model_type``, then the family's own fields: :meth:`fastattn.models.bert.BertFamily.
    read_config` lists BERT's). A CTranslate2 folder: its spec's
    (:func:`fastattn.models._ct2.read_encoder`).
    """
    if _ct2.is_ct2_folder(folder):
        family, config, _ = _ct2.read_encoder(folder)
        return family, config
    path = os.path.join(folder, "config.json")
    cfg = read_json(path, "model config")
    if not isinstance(cfg, dict):
        raise ValueError(f"{path} must hold a JSON object")
    model_type = cfg.get("model_type")
    family = registry.family(model_type, "encoder")
    if family is None:
        raise ValueError(
            f"config field model_type={model_type!r} in {path} is not supported; supported: "
            f"{', '.join(registry.model_types('encoder'))}"
            f"{registry.other_kind_hint(model_type)}")
    return family, family.read_config(cfg, path)


def _tensor_name(tensors, full):
    """`full`, or its TensorFlow-era LayerNorm name (gamma / beta), whichever the checkpoint
    holds (None when neither)."""
    if full in tensors:
        return full
    for new, old in (("LayerNorm.weight", "LayerNorm.gamma"), ("LayerNorm.bias", "LayerNorm.beta")):
        if full.endswith(new) and full[:-len(new)] + old in tensors:
            return full[:-len(new)] + old
    return None


def _find_prefix(tensors, files, anchor):
    prefixes = sorted({k[:-len(anchor)] for k in tensors if k.endswith(anchor)})
    if not prefixes:
        raise ValueError(f"{', '.join(files)} has no tensor named '{anchor}' (with or without a "
                         "prefix such as 'bert.'): not a BERT-family checkpoint")
    if len(prefixes) > 1:
        raise ValueError(f"{', '.join(files)} holds several encoders (prefixes "
                         f"{prefixes}); expected one")
    p = prefixes[0]
    if p and not p.endswith("."):
        raise ValueError(f"unexpected weight name {p + anchor!r} in {', '.join(files)}")
    return p


def load_weights(folder, family, cfg, arrays, layer_done=None, model=None):
    """Read the checkpoint in `folder` into `arrays` (fastattn.nn name -> the model's array,
    written in place, converted to its dtype; a mapping, or a function of the name) through
    the family's name map (a tensor may fill several parameters: its row blocks), one tensor at
    a time from disk; ``layer_done(i)`` is called once layer i's tensors are all in (the caller
    packs or quantizes it then, so that the float model is never whole in memory).

    Tensors are found under any prefix ("bert.", "roberta.", "distilbert.", none); old
    TensorFlow-converted LayerNorm names (gamma / beta) are accepted. A missing tensor or a
    shape that disagrees with config.json is a ValueError naming the tensor. A CTranslate2
    int8 folder's linear weights and token table are put in place as their integers
    (:func:`fastattn.models._ct2.place_int8`; `model`: the EncoderModel whose parameters they
    replace).
    """
    if _ct2.is_ct2_folder(folder):
        tensors = _ct2.read_encoder(folder)[2]
        files = tensors.files
    else:
        files = checkpoint_files(folder)
        tensors = read_safetensors(files)
    get = arrays if callable(arrays) else arrays.__getitem__
    prefix = _find_prefix(tensors, files, family.anchor)
    where = ", ".join(files)
    entries = family.name_map(cfg)
    for hf_name, name, rows, _, hf_rows in entries:      # every tensor checked before any read
        full = _tensor_name(tensors, prefix + hf_name)
        if full is None:
            raise ValueError(f"tensor {prefix + hf_name!r} not found in {where}")
        shape = tensors.shape(full)
        if hf_rows is not None:
            shape = (hf_rows[1] - hf_rows[0],) + shape[1:]
        arr = get(name)
        want = arr.shape if rows is None else (rows[1] - rows[0],) + arr.shape[1:]
        del arr
        if tuple(shape) != tuple(want):
            raise ValueError(f"tensor {full!r} in {where} has shape {tuple(shape)}; "
                             f"config.json implies {tuple(want)}")
        if tensors.dtype(full).kind != "f":
            raise ValueError(f"tensor {full!r} in {where} has dtype {tensors.dtype(full)}, "
                             "not a float")
    placed = set()
    if model is not None and getattr(tensors, "quantized", False):
        placed = _ct2.place_int8(tensors, entries, _owners(model))
    current = None
    for hf_name, name, rows, _, hf_rows in entries:
        layer = int(name.split(".")[1]) if name.startswith("layers.") else None
        if layer_done is not None and current is not None and layer != current:
            layer_done(current)
        current = layer
        if hf_name in placed:
            continue
        arr = get(name)
        dst = arr if rows is None else arr[rows[0]:rows[1]]
        tensors.copy_into(_tensor_name(tensors, prefix + hf_name), dst, hf_rows)
        del arr, dst
    if layer_done is not None and current is not None:
        layer_done(current)
    extra = f"{prefix}{family.layer_prefix}{cfg.num_layers}."
    if any(k.startswith(extra) for k in tensors):
        raise ValueError(f"{where} holds more layers than config.json's "
                         f"{cfg.num_layers}: found tensors under {extra!r}")


def _owners(model):
    """fastattn.nn name -> (module, key) of an EncoderModel's parameters (its ``_arrays``)."""
    out = {f"embeddings.{n}": (o, k) for n, _, o, k in model.embeddings._named_params()}
    for i, layer in enumerate(model.layers):
        out.update((f"layers.{i}.{n}", (o, k)) for n, _, o, k in layer._named_params())
    return out
