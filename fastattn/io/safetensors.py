"""safetensors files of fastattn modules: the weights by PyTorch name, the config in the metadata."""
import json

import numpy as np

__all__ = ["save_module", "read_module"]


def save_module(path, class_name, config, state_dict):
    """Write `state_dict` and (class_name, config) as the file's metadata."""
    from safetensors.numpy import save_file
    meta = {"fastattn_class": class_name, "fastattn_config": json.dumps(config)}
    save_file({k: np.ascontiguousarray(v) for k, v in state_dict.items()}, str(path), metadata=meta)


def read_module(path, class_name):
    """(config, tensors) of a file written by save_module, checked to hold a `class_name`."""
    import os

    from safetensors import safe_open
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such file: {path}")
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:            # the library raises its own error types
        if isinstance(exc, (MemoryError, OSError)):
            raise
        raise ValueError(f"could not read the safetensors file {path}: {exc}") from exc
    if "fastattn_config" not in meta:
        raise ValueError(f"{path} has no fastattn config in its metadata (not written by "
                         f"{class_name}.save(); a Hugging Face checkpoint is read by from_pretrained)")
    if meta.get("fastattn_class") != class_name:
        raise ValueError(f"{path} holds a {meta.get('fastattn_class')}, not a {class_name}")
    try:
        config = json.loads(meta["fastattn_config"])
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: the fastattn_config metadata is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: the fastattn_config metadata must be a JSON object, got "
                         f"{type(config).__name__}")
    return config, tensors
