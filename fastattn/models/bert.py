"""BERT-family checkpoints: ``config.json`` parsing and Hugging Face weight names.

Supported ``model_type`` values and what distinguishes them here:

- ``"bert"``: learned absolute positions ``0 .. S-1``, token-type embeddings.
- ``"roberta"``, ``"xlm-roberta"``, ``"camembert"``: the BERT network; position ids start after
  the padding id, ``pad_token_id + cumsum(input_ids != pad_token_id)`` for tokens and
  ``pad_token_id`` for padding tokens (transformers' ``create_position_ids_from_input_ids``).
- ``"distilbert"``: the same post-norm block under other names, no token types, LayerNorm eps
  fixed at 1e-12 (hard-coded in transformers).

Nothing here imports torch or transformers.
"""
import json
import os
from dataclasses import dataclass

import numpy as np

from ..io.huggingface import canonical_activation, checkpoint_files, read_safetensors
from ..io.huggingface import read_json as _read_json

__all__ = ["EncoderConfig", "SUPPORTED_MODEL_TYPES", "load_config", "load_weights", "name_map"]

_ROBERTA_LIKE = ("roberta", "xlm-roberta", "camembert")
SUPPORTED_MODEL_TYPES = ("bert",) + _ROBERTA_LIKE + ("distilbert", "mpnet", "modernbert")


@dataclass(frozen=True)
class EncoderConfig:
    """What the forward pass needs from a ``config.json`` (read by :func:`load_config`)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    activation: str              # fastattn's name: gelu, gelu_tanh, relu or silu
    hidden_act: str              # the name as the config spells it
    layer_norm_eps: float
    max_position_embeddings: int
    type_vocab_size: int         # 0: no token-type embeddings (distilbert)
    pad_token_id: int            # -1 if the config has none (bert allows null)
    positions_after_padding: bool
    # the other families' variants (mpnet.py, modernbert.py); the defaults are BERT's
    position_padding_idx: int = -1    # the id positions count from (RoBERTa: pad; MPNet: 1)
    learned_positions: bool = True    # False: no absolute positions (ModernBERT's rotary)
    norm_first: bool = False          # pre-norm layers
    bias: bool = True                 # biases in the projections and norms
    gated: bool = False               # GeGLU FFN
    final_norm: bool = False          # a norm after the last layer
    first_attn_norm: bool = True      # False: layer 0 has no norm before its attention
    relative_attention_num_buckets: int = 0   # MPNet's position bias (max distance 128)
    layer_types: tuple = ()           # ModernBERT: "full" / "sliding" per layer
    rope_theta: tuple = ()            # ModernBERT: (full, sliding) rotary bases
    local_attention: int = 0          # ModernBERT: the sliding window's width

    @property
    def head_dim(self):
        return self.hidden_size // self.num_heads

    @property
    def padding_idx(self):
        return self.position_padding_idx if self.position_padding_idx >= 0 else self.pad_token_id

    @property
    def max_tokens(self):
        """Longest sequence the position table allows."""
        if self.positions_after_padding:
            return self.max_position_embeddings - self.padding_idx - 1
        return self.max_position_embeddings


def _int_field(cfg, name, path, default=None, minimum=1):
    value = cfg.get(name, default)
    if value is None or isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"config field {name}={value!r} in {path} must be an integer")
    if value < minimum:
        raise ValueError(f"config field {name}={value!r} in {path} must be >= {minimum}")
    return value


def _float_field(cfg, name, path, default):
    value = cfg.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or not np.isfinite(value):
        raise ValueError(f"config field {name}={value!r} in {path} must be a positive number")
    return float(value)


def load_config(folder):
    """Parse ``folder/config.json`` into an :class:`EncoderConfig`.

    Every field that changes the numbers is honoured or rejected with a ValueError naming it:
    ``model_type``, ``hidden_act`` / ``activation``, ``layer_norm_eps``,
    ``position_embedding_type`` (only "absolute"), ``type_vocab_size``, ``pad_token_id``,
    ``max_position_embeddings``, ``is_decoder`` (must be false: a decoder is causal).
    """
    path = os.path.join(folder, "config.json")
    cfg = _read_json(path, "model config")
    if not isinstance(cfg, dict):
        raise ValueError(f"{path} must hold a JSON object")
    model_type = cfg.get("model_type")
    if model_type == "mpnet":
        from .mpnet import read_config
        return read_config(cfg, path)
    if model_type == "modernbert":
        from .modernbert import read_config
        return read_config(cfg, path)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"config field model_type={model_type!r} in {path} is not supported; supported: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    is_decoder = cfg.get("is_decoder", False)
    if not isinstance(is_decoder, bool):
        raise ValueError(f"config field is_decoder={is_decoder!r} in {path} must be true or false")
    if is_decoder:
        raise ValueError(f"config field is_decoder=true in {path}: a causal (decoder) model is "
                         "not an encoder; only is_decoder=false is supported")

    if model_type == "distilbert":
        act_field = "activation"
        hidden = _int_field(cfg, "dim", path, 768)
        layers = _int_field(cfg, "n_layers", path, 6)
        heads = _int_field(cfg, "n_heads", path, 12)
        inter = _int_field(cfg, "hidden_dim", path, 4 * 768)
        act = cfg.get("activation", "gelu")
        eps = 1e-12                       # fixed in transformers' DistilBERT
        type_vocab = 0
        positions_after_padding = False
    else:
        act_field = "hidden_act"
        pet = cfg.get("position_embedding_type", "absolute")
        if pet != "absolute":
            raise ValueError(
                f"config field position_embedding_type={pet!r} in {path} is not supported; "
                "only 'absolute' is")
        hidden = _int_field(cfg, "hidden_size", path, 768)
        layers = _int_field(cfg, "num_hidden_layers", path, 12)
        heads = _int_field(cfg, "num_attention_heads", path, 12)
        inter = _int_field(cfg, "intermediate_size", path, 3072)
        act = cfg.get("hidden_act", "gelu")
        eps = _float_field(cfg, "layer_norm_eps", path, 1e-12)
        type_vocab = _int_field(cfg, "type_vocab_size", path, 2)
        positions_after_padding = model_type in _ROBERTA_LIKE
        if "embedding_size" in cfg and cfg["embedding_size"] not in (None, hidden):
            raise ValueError(f"config field embedding_size={cfg['embedding_size']!r} in {path} "
                             f"differs from hidden_size={hidden}; factorised embeddings are "
                             "not supported")
    canonical = canonical_activation(act, act_field)
    if hidden % heads:
        raise ValueError(f"config in {path}: hidden size {hidden} is not a multiple of the "
                         f"number of attention heads {heads}")
    vocab = _int_field(cfg, "vocab_size", path, 30522)
    max_pos = _int_field(cfg, "max_position_embeddings", path, 512)
    pad = cfg.get("pad_token_id", 1 if positions_after_padding else 0)
    if pad is None and not positions_after_padding:
        pad = -1
    if isinstance(pad, bool) or not isinstance(pad, int) or pad < -1 or pad >= vocab \
            or (positions_after_padding and pad < 0):
        raise ValueError(f"config field pad_token_id={pad!r} in {path} must be an integer id "
                         f"in [0, vocab_size={vocab})")
    if positions_after_padding and pad + 1 >= max_pos:
        raise ValueError(f"config in {path}: pad_token_id={pad} leaves no position in "
                         f"max_position_embeddings={max_pos}")
    return EncoderConfig(
        model_type=model_type, vocab_size=vocab, hidden_size=hidden, num_layers=layers,
        num_heads=heads, intermediate_size=inter, activation=canonical, hidden_act=act,
        layer_norm_eps=eps, max_position_embeddings=max_pos, type_vocab_size=type_vocab,
        pad_token_id=pad, positions_after_padding=positions_after_padding)


# --------------------------------------------------------------------------------------------
# weights
# --------------------------------------------------------------------------------------------

# Our names -> Hugging Face names (after the checkpoint's prefix, e.g. "bert." or none).
# Layer names hold "{i}".
_BERT_NAMES = {
    "word": "embeddings.word_embeddings.weight",
    "position": "embeddings.position_embeddings.weight",
    "token_type": "embeddings.token_type_embeddings.weight",
    "emb_ln_w": "embeddings.LayerNorm.weight",
    "emb_ln_b": "embeddings.LayerNorm.bias",
    "layer": {
        "q_w": "encoder.layer.{i}.attention.self.query.weight",
        "q_b": "encoder.layer.{i}.attention.self.query.bias",
        "k_w": "encoder.layer.{i}.attention.self.key.weight",
        "k_b": "encoder.layer.{i}.attention.self.key.bias",
        "v_w": "encoder.layer.{i}.attention.self.value.weight",
        "v_b": "encoder.layer.{i}.attention.self.value.bias",
        "o_w": "encoder.layer.{i}.attention.output.dense.weight",
        "o_b": "encoder.layer.{i}.attention.output.dense.bias",
        "ln1_w": "encoder.layer.{i}.attention.output.LayerNorm.weight",
        "ln1_b": "encoder.layer.{i}.attention.output.LayerNorm.bias",
        "i_w": "encoder.layer.{i}.intermediate.dense.weight",
        "i_b": "encoder.layer.{i}.intermediate.dense.bias",
        "out_w": "encoder.layer.{i}.output.dense.weight",
        "out_b": "encoder.layer.{i}.output.dense.bias",
        "ln2_w": "encoder.layer.{i}.output.LayerNorm.weight",
        "ln2_b": "encoder.layer.{i}.output.LayerNorm.bias",
    },
}

_DISTILBERT_NAMES = {
    "word": "embeddings.word_embeddings.weight",
    "position": "embeddings.position_embeddings.weight",
    "emb_ln_w": "embeddings.LayerNorm.weight",
    "emb_ln_b": "embeddings.LayerNorm.bias",
    "layer": {
        "q_w": "transformer.layer.{i}.attention.q_lin.weight",
        "q_b": "transformer.layer.{i}.attention.q_lin.bias",
        "k_w": "transformer.layer.{i}.attention.k_lin.weight",
        "k_b": "transformer.layer.{i}.attention.k_lin.bias",
        "v_w": "transformer.layer.{i}.attention.v_lin.weight",
        "v_b": "transformer.layer.{i}.attention.v_lin.bias",
        "o_w": "transformer.layer.{i}.attention.out_lin.weight",
        "o_b": "transformer.layer.{i}.attention.out_lin.bias",
        "ln1_w": "transformer.layer.{i}.sa_layer_norm.weight",
        "ln1_b": "transformer.layer.{i}.sa_layer_norm.bias",
        "i_w": "transformer.layer.{i}.ffn.lin1.weight",
        "i_b": "transformer.layer.{i}.ffn.lin1.bias",
        "out_w": "transformer.layer.{i}.ffn.lin2.weight",
        "out_b": "transformer.layer.{i}.ffn.lin2.bias",
        "ln2_w": "transformer.layer.{i}.output_layer_norm.weight",
        "ln2_b": "transformer.layer.{i}.output_layer_norm.bias",
    },
}


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


def name_map(cfg):
    """[(Hugging Face name (after the checkpoint's prefix), its rows, fastattn.nn name, rows)]:
    where each tensor of a checkpoint goes in :class:`fastattn.EncoderModel`'s network
    (``embeddings``: a :class:`fastattn.nn.Embedding`; ``layers.N``:
    :class:`fastattn.nn.TransformerEncoderLayer`). q, k and v are row blocks of a layer's
    ``self_attn.in_proj_weight`` (one GEMM). Dispatched on cfg.model_type."""
    if cfg.model_type == "mpnet":
        from .mpnet import name_map as family
        return family(cfg)
    if cfg.model_type == "modernbert":
        from .modernbert import name_map as family
        return family(cfg)
    names = _DISTILBERT_NAMES if cfg.model_type == "distilbert" else _BERT_NAMES
    H = cfg.hidden_size
    m = [(names["word"], None, "embeddings.weight", None),
         (names["position"], None, "embeddings.position_weight", None),
         (names["emb_ln_w"], None, "embeddings.norm.weight", None),
         (names["emb_ln_b"], None, "embeddings.norm.bias", None)]
    if cfg.type_vocab_size:
        m.append((names["token_type"], None, "embeddings.token_type_weight", None))
    ours = {"o_w": "self_attn.out_proj.weight", "o_b": "self_attn.out_proj.bias",
            "ln1_w": "norm1.weight", "ln1_b": "norm1.bias", "i_w": "linear1.weight",
            "i_b": "linear1.bias", "out_w": "linear2.weight", "out_b": "linear2.bias",
            "ln2_w": "norm2.weight", "ln2_b": "norm2.bias"}
    for i in range(cfg.num_layers):
        for key, hf in names["layer"].items():
            hf = hf.format(i=i)
            if key[0] in "qkv":
                j = "qkv".index(key[0])
                which = "weight" if key.endswith("_w") else "bias"
                m.append((hf, None, f"layers.{i}.self_attn.in_proj_{which}", (j * H, (j + 1) * H)))
            else:
                m.append((hf, None, f"layers.{i}.{ours[key]}", None))
    return m


# the name that locates a checkpoint's prefix, and where its layers are numbered
_ANCHORS = {"distilbert": ("embeddings.word_embeddings.weight", "transformer.layer."),
            "modernbert": ("embeddings.tok_embeddings.weight", "layers.")}
_DEFAULT_ANCHOR = ("embeddings.word_embeddings.weight", "encoder.layer.")


def load_weights(folder, cfg, arrays, layer_done=None):
    """Read the checkpoint in `folder` into `arrays` (fastattn.nn name -> the model's array,
    written in place, converted to its dtype; a mapping, or a function of the name) through
    :func:`name_map` (a tensor may fill several parameters: its row blocks), one tensor at a
    time from disk; ``layer_done(i)`` is called once layer i's tensors are all in (the caller
    packs or quantizes it then, so that the float model is never whole in memory).

    Tensors are found under any prefix ("bert.", "roberta.", "distilbert.", none); old
    TensorFlow-converted LayerNorm names (gamma / beta) are accepted. A missing tensor or a
    shape that disagrees with config.json is a ValueError naming the tensor.
    """
    files = checkpoint_files(folder)
    tensors = read_safetensors(files)
    get = arrays if callable(arrays) else arrays.__getitem__
    anchor, layer_prefix = _ANCHORS.get(cfg.model_type, _DEFAULT_ANCHOR)
    prefix = _find_prefix(tensors, files, anchor)
    where = ", ".join(files)
    entries = name_map(cfg)
    for hf_name, hf_rows, name, rows in entries:       # every tensor checked before any read
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
    current = None
    for hf_name, hf_rows, name, rows in entries:
        layer = int(name.split(".")[1]) if name.startswith("layers.") else None
        if layer_done is not None and current is not None and layer != current:
            layer_done(current)
        current = layer
        arr = get(name)
        dst = arr if rows is None else arr[rows[0]:rows[1]]
        tensors.copy_into(_tensor_name(tensors, prefix + hf_name), dst, hf_rows)
        del arr, dst
    if layer_done is not None and current is not None:
        layer_done(current)
    extra = f"{prefix}{layer_prefix}{cfg.num_layers}."
    if any(k.startswith(extra) for k in tensors):
        raise ValueError(f"{where} holds more layers than config.json's "
                         f"{cfg.num_layers}: found tensors under {extra!r}")
