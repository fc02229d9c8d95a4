"""What Hugging Face checkpoints share across model types: JSON files, activation names, and
the weights (``model.safetensors`` or a sharded index, read with the safetensors NumPy API;
BF16 tensors widened to float32 by hand, NumPy having no bfloat16).

The model-specific readers (``fastattn/models/bert.py``, ``fastattn/models/marian.py``) map
config fields and weight names; both name activations through :func:`canonical_activation`.
"""

import json
import os

import numpy as np

__all__ = ["canonical_activation", "checkpoint_files", "read_json", "read_safetensors"]


def read_json(path, what="JSON file", expect=None):
    """The JSON value in `path` (checked to be an `expect` instance when given, e.g. dict):
    FileNotFoundError / ValueError naming `what` and the path."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} {path} is not valid JSON: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what} {path} is not UTF-8 text: {exc}") from None
    if expect is not None and not isinstance(data, expect):
        raise ValueError(f"{what} {path} must hold a JSON {expect.__name__}, got "
                         f"{type(data).__name__}")
    return data

# Hugging Face `hidden_act` / DistilBERT `activation` strings -> fastattn's activation names.
# Each alias has the same formula in transformers/activations.py (checked there): "gelu" and
# "gelu_python" are the erf GELU; "gelu_new", "gelu_pytorch_tanh", "gelu_python_tanh" and
# "gelu_accurate" the tanh approximation with c = sqrt(2/pi); "gelu_fast" writes c as
# 0.7978845608 (a relative difference of 3e-12, below float64's resolution of the result's
# rounding in practice); "swish" and "silu" are x * sigmoid(x).
_HF_NAMES = {
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_python_tanh": "gelu_tanh",
    "gelu_accurate": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}


def canonical_activation(name, field="hidden_act"):
    """Map a Hugging Face activation name to fastattn's ('gelu', 'gelu_tanh', 'relu', 'silu').

    Raises ValueError naming `field` for a name we do not implement (e.g. "quick_gelu").
    """
    if not isinstance(name, str) or name not in _HF_NAMES:
        raise ValueError(
            f"config field {field}={name!r} is not supported; supported: "
            f"{', '.join(sorted(_HF_NAMES))}")
    return _HF_NAMES[name]


def checkpoint_files(folder):
    """The checkpoint's safetensors file(s): model.safetensors or a sharded index."""
    single = os.path.join(folder, "model.safetensors")
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(single):
        return [single]
    if os.path.exists(single):
        raise ValueError(f"{single} is not a file")
    if os.path.isfile(index):
        idx = read_json(index, "safetensors index")
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
                raise ValueError(f"checkpoint shard not found: {p} (listed in {index})")
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


def read_safetensors(files):
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
