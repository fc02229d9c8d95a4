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

from ..io.huggingface import canonical_activation
from ..io.huggingface import read_json as _read_json

__all__ = ["EncoderConfig", "SUPPORTED_MODEL_TYPES", "load_config", "load_weights"]

_ROBERTA_LIKE = ("roberta", "xlm-roberta", "camembert")
SUPPORTED_MODEL_TYPES = ("bert",) + _ROBERTA_LIKE + ("distilbert",)


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

    @property
    def head_dim(self):
        return self.hidden_size // self.num_heads

    @property
    def max_tokens(self):
        """Longest sequence the position table allows."""
        if self.positions_after_padding:
            return self.max_position_embeddings - self.pad_token_id - 1
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


def _expected_shapes(cfg):
    H, I = cfg.hidden_size, cfg.intermediate_size
    top = {"word": (cfg.vocab_size, H), "position": (cfg.max_position_embeddings, H),
           "emb_ln_w": (H,), "emb_ln_b": (H,)}
    if cfg.type_vocab_size:
        top["token_type"] = (cfg.type_vocab_size, H)
    layer = {"q_w": (H, H), "q_b": (H,), "k_w": (H, H), "k_b": (H,), "v_w": (H, H),
             "v_b": (H,), "o_w": (H, H), "o_b": (H,), "ln1_w": (H,), "ln1_b": (H,),
             "i_w": (I, H), "i_b": (I,), "out_w": (H, I), "out_b": (H,), "ln2_w": (H,),
             "ln2_b": (H,)}
    return top, layer


def _safetensors_files(folder):
    """The checkpoint's safetensors file(s): model.safetensors or a sharded index."""
    single = os.path.join(folder, "model.safetensors")
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(single):
        return [single]
    if os.path.isfile(index):
        idx = _read_json(index, "safetensors index")
        wm = idx.get("weight_map") if isinstance(idx, dict) else None
        if not isinstance(wm, dict) or not wm:
            raise ValueError(f"{index} has no weight_map")
        files = []
        for name in dict.fromkeys(wm.values()):
            # a shard is a plain file name inside the folder (transformers writes them so)
            if not isinstance(name, str) or not name or os.path.basename(name) != name \
                    or name in (".", ".."):
                raise ValueError(f"{index}: weight_map lists {name!r}, not a file name inside "
                                 f"the model folder")
            p = os.path.join(folder, name)
            if not os.path.isfile(p):
                raise FileNotFoundError(f"checkpoint shard not found: {p} (listed in {index})")
            files.append(p)
        return files
    for other in ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5",
                  "model.onnx", "flax_model.msgpack"):
        if os.path.exists(os.path.join(folder, other)):
            raise ValueError(
                f"{folder} holds {other} but no model.safetensors: fastattn reads safetensors "
                "only (it never imports torch). Convert once, e.g. with transformers: "
                "AutoModel.from_pretrained(folder).save_pretrained(folder, "
                "safe_serialization=True)")
    raise FileNotFoundError(f"model weights not found: {single}")


def _bf16_entries(path):
    """{name: (shape, byte offset, count)} of the BF16 tensors of a safetensors file.

    NumPy has no bfloat16, so the safetensors NumPy API cannot return these; we read them
    from the file's JSON header (8-byte little-endian length, then the header, then data).
    """
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        if not 0 < n <= 100_000_000:
            return {}
        try:
            header = json.loads(fh.read(n))
        except ValueError:              # a bad header: safetensors' own reader says what is wrong
            return {}
    if not isinstance(header, dict):
        return {}
    out = {}
    for name, info in header.items():
        if name != "__metadata__" and isinstance(info, dict) and info.get("dtype") == "BF16":
            begin, end = info["data_offsets"]
            out[name] = (tuple(info["shape"]), 8 + n + begin, (end - begin) // 2)
    return out


def _read_bf16(path, shape, offset, count):
    """A BF16 tensor as float32 (exact: bfloat16 is the top half of a float32)."""
    raw = np.fromfile(path, dtype="<u2", count=count, offset=offset)
    if raw.size != count or count != int(np.prod(shape, dtype=np.int64)):
        raise ValueError(f"truncated BF16 tensor in {path}")
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(shape)


def _read_tensors(files):
    """name -> ndarray for every tensor in the safetensors files (numpy API, no torch;
    BF16 tensors are widened to float32 by hand)."""
    from safetensors import safe_open
    tensors = {}
    for path in files:
        try:
            bf16 = _bf16_entries(path)
            with safe_open(path, framework="numpy") as f:
                for name in f.keys():
                    tensors[name] = _read_bf16(path, *bf16[name]) if name in bf16 \
                        else f.get_tensor(name)
        except Exception as exc:            # the library raises its own error types
            if isinstance(exc, (MemoryError, KeyboardInterrupt)):
                raise
            raise ValueError(f"could not read the safetensors file {path}: {exc}") from exc
    return tensors


def _find_prefix(tensors, files):
    anchor = "embeddings.word_embeddings.weight"
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


def load_weights(folder, cfg, dtype):
    """Read the checkpoint in `folder` and return ``(top, layers)`` in `dtype`.

    top : dict with word (V, H), position (P, H), token_type (T, H) or None, emb_ln_w/b (H,)
    layers : list of dicts, one per layer: qkv_w (3H, H), qkv_b (3H,), o_w (H, H), o_b,
        ln1_w/b, i_w (I, H), i_b, out_w (H, I), out_b, ln2_w/b — C-contiguous.

    Tensors are found under any prefix ("bert.", "roberta.", "distilbert.", none); old
    TensorFlow-converted LayerNorm names (gamma / beta) are accepted. A missing tensor or a
    shape that disagrees with config.json is a ValueError naming the tensor.
    """
    files = _safetensors_files(folder)
    tensors = _read_tensors(files)
    prefix = _find_prefix(tensors, files)
    names = _DISTILBERT_NAMES if cfg.model_type == "distilbert" else _BERT_NAMES
    top_shapes, layer_shapes = _expected_shapes(cfg)
    where = ", ".join(files)

    def get(hf_name, shape):
        full = prefix + hf_name
        arr = tensors.get(full)
        if arr is None and full.endswith("LayerNorm.weight"):
            arr = tensors.get(full[:-len("weight")] + "gamma")
        elif arr is None and full.endswith("LayerNorm.bias"):
            arr = tensors.get(full[:-len("bias")] + "beta")
        if arr is None:
            raise ValueError(f"tensor {full!r} not found in {where}")
        if tuple(arr.shape) != shape:
            raise ValueError(f"tensor {full!r} in {where} has shape {tuple(arr.shape)}; "
                             f"config.json implies {shape}")
        if arr.dtype.kind != "f":
            raise ValueError(f"tensor {full!r} in {where} has dtype {arr.dtype}, not a float")
        return np.ascontiguousarray(arr, dtype=dtype)

    top = {key: get(names[key], shape) for key, shape in top_shapes.items()}
    top.setdefault("token_type", None)
    layers = []
    for i in range(cfg.num_layers):
        raw = {key: get(names["layer"][key].format(i=i), shape)
               for key, shape in layer_shapes.items()}
        layer = {k: v for k, v in raw.items() if k[0] not in "qkv"}
        layer["qkv_w"] = np.concatenate([raw["q_w"], raw["k_w"], raw["v_w"]], axis=0)
        layer["qkv_b"] = np.concatenate([raw["q_b"], raw["k_b"], raw["v_b"]], axis=0)
        layers.append(layer)
    extra = f"{prefix}encoder.layer.{cfg.num_layers}." if cfg.model_type != "distilbert" \
        else f"{prefix}transformer.layer.{cfg.num_layers}."
    if any(k.startswith(extra) for k in tensors):
        raise ValueError(f"{where} holds more layers than config.json's "
                         f"{cfg.num_layers}: found tensors under {extra!r}")
    return top, layers
