"""PyTorch state dicts as NumPy: tensors or arrays in, never importing torch."""
import numpy as np

from .._validation import to_numpy

__all__ = ["as_numpy_state_dict", "state_dict_dtype", "count_layers"]


def as_numpy_state_dict(state_dict):
    """{name: ndarray} from a mapping of names to tensors or array-likes."""
    if not hasattr(state_dict, "items"):
        raise TypeError(f"state_dict must be a mapping of names to arrays, got {type(state_dict).__name__}")
    return {k: to_numpy(v) for k, v in state_dict.items()}


def state_dict_dtype(sd):
    """The dtype a model built from `sd` gets by default: float64 when its weights are, else float32."""
    first = next((a for a in sd.values() if a.dtype.kind == "f"), None)
    return np.float64 if first is not None and first.dtype == np.float64 else np.float32


def count_layers(sd, prefix):
    """How many numbered layers `prefix`N.* the state dict holds."""
    idx = set()
    for k in sd:
        if k.startswith(prefix):
            head = k[len(prefix):].split(".", 1)[0]
            if head.isdigit():
                idx.add(int(head))
    return len(idx)
