"""What Hugging Face checkpoints share across model types: JSON files, activation names.

The model-specific readers (``fastattn/models/bert.py``, ``fastattn/models/marian.py``) map
config fields and weight names; both name activations through :func:`canonical_activation`.
"""

import json
import os

__all__ = ["canonical_activation", "read_json"]


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
