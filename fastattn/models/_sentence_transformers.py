"""sentence-transformers folders for :class:`fastattn.EncoderModel`: modules.json (Transformer,
Pooling, Dense, Normalize), the Pooling config, the Dense modules, the truncation length; and
pooling itself (the modes sentence-transformers concatenates, then L2 normalisation)."""
import os

import numpy as np

from .._quant import Int8Weight
from .._validation import check_folder
from ..io.huggingface import checkpoint_files, read_safetensors
from ..io.huggingface import read_json as _read_json
from ..nn._module import _Init
from ..nn.linear import Linear

__all__ = ["POOLING_MODES", "read_folder", "pooling_from_config", "read_dense",
           "st_max_seq_length", "check_pooling", "pool", "l2_normalize"]

#: pooling modes in the order sentence-transformers concatenates them when several are set
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len")

# sentence-transformers' Pooling config flags -> our mode names
_POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
}


def pooling_from_config(path, hidden_size):
    """Pooling modes (tuple, POOLING_MODES order) from a sentence-transformers Pooling config."""
    cfg = _read_json(path, "sentence-transformers Pooling config", dict)
    dim = cfg.get("word_embedding_dimension", hidden_size)
    if dim != hidden_size:
        raise ValueError(f"Pooling config field word_embedding_dimension={dim!r} in {path} "
                         f"differs from the model's hidden size {hidden_size}")
    if cfg.get("include_prompt", True) is not True:
        raise ValueError(f"Pooling config field include_prompt={cfg['include_prompt']!r} in "
                         f"{path} is not supported (only true)")
    modes = set()
    mode = cfg.get("pooling_mode")         # newer writers may also store the mode by name
    if mode is not None:
        by_name = {"cls": "cls", "max": "max", "mean": "mean", "mean_sqrt_len_tokens":
                   "mean_sqrt_len", "mean_sqrt_len": "mean_sqrt_len"}
        if not isinstance(mode, str) or mode not in by_name:
            raise ValueError(f"Pooling config field pooling_mode={mode!r} in {path} is not "
                             f"supported; supported: cls, max, mean, mean_sqrt_len_tokens")
        modes.add(by_name[mode])
    for key, value in cfg.items():
        if not key.startswith("pooling_mode_"):
            continue
        if not isinstance(value, bool):
            raise ValueError(f"Pooling config field {key}={value!r} in {path} must be true "
                             "or false")
        if not value:
            continue
        if key not in _POOLING_FLAGS:
            raise ValueError(f"Pooling config field {key}=true in {path} is not supported; "
                             f"supported: {', '.join(_POOLING_FLAGS)}")
        modes.add(_POOLING_FLAGS[key])
    if not modes:
        raise ValueError(f"Pooling config {path} sets no pooling mode (one of "
                         f"{', '.join(_POOLING_FLAGS)} must be true)")
    return tuple(m for m in POOLING_MODES if m in modes)


def read_folder(path):
    """(transformer folder, pooling modes or the Pooling folder, normalize, Dense folders) for a
    model folder.

    A sentence-transformers folder has modules.json: its Transformer module names the folder
    of config.json + weights, its Pooling module the pooling config, and a Normalize module
    turns on L2 normalisation. Without modules.json: mean pooling, then normalisation.
    """
    root = check_folder(path)
    modules_path = os.path.join(root, "modules.json")
    if not os.path.exists(modules_path):
        return root, ("mean",), True, []
    modules = _read_json(modules_path, "sentence-transformers modules.json")
    if not isinstance(modules, list):
        raise ValueError(f"{modules_path} must hold a JSON list of modules")
    entries = []
    for i, m in enumerate(modules):
        if not isinstance(m, dict) or not isinstance(m.get("type"), str):
            raise ValueError(f"{modules_path}: module {i} has no 'type'")
        path_i = m.get("path") or ""
        if not isinstance(path_i, str):
            raise ValueError(f"{modules_path}: module {i} has a bad 'path' {path_i!r}")
        entries.append((m.get("idx", i), m["type"], os.path.join(root, path_i)))
    entries.sort(key=lambda e: e[0] if isinstance(e[0], int) else 0)
    kinds = [t.rsplit(".", 1)[-1] for _, t, _ in entries]
    n_dense = 0
    while 2 + n_dense < len(kinds) and kinds[2 + n_dense] == "Dense":
        n_dense += 1
    tail = kinds[2 + n_dense:]
    if kinds[:2] != ["Transformer", "Pooling"] or tail not in ([], ["Normalize"]):
        known = ("Transformer", "Pooling", "Dense", "Normalize")
        odd = next((t for (_, t, _), k in zip(entries, kinds) if k not in known), None)
        raise ValueError(
            f"{modules_path} lists the modules {[t for _, t, _ in entries]}"
            + (f"; module type {odd!r} is not supported" if odd else "")
            + "; supported: Transformer, Pooling, then optionally Dense modules, then "
              "optionally Normalize")
    dense = [e[2] for e in entries[2:2 + n_dense]]
    return entries[0][2], entries[1][2], bool(tail), dense


# sentence-transformers' Dense activations (torch class paths) -> NumPy
_DENSE_ACTIVATIONS = {
    "torch.nn.modules.activation.Tanh": np.tanh,
    "torch.nn.modules.linear.Identity": None,
    "torch.nn.modules.activation.ReLU": lambda x: np.maximum(x, 0),
    "torch.nn.modules.activation.Sigmoid": lambda x: 1 / (1 + np.exp(-x)),
}


def read_dense(folder, in_features, dtype, tensors=None, prefix=""):
    """A sentence-transformers Dense module: (Linear, activation or None); its weights from
    the folder, or from `tensors` (a saved folder's, names under `prefix`)."""
    cfg = _read_json(os.path.join(folder, "config.json"), "sentence-transformers Dense config",
                     dict)
    where = os.path.join(folder, "config.json")
    n_in, n_out = cfg.get("in_features"), cfg.get("out_features")
    for name, v in (("in_features", n_in), ("out_features", n_out)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"Dense config field {name}={v!r} in {where} must be a positive "
                             "integer")
    if n_in != in_features:
        raise ValueError(f"Dense config field in_features={n_in} in {where} does not match the "
                         f"{in_features} features that reach it")
    act = cfg.get("activation_function", "torch.nn.modules.activation.Tanh")
    if act not in _DENSE_ACTIVATIONS:
        raise ValueError(f"Dense config field activation_function={act!r} in {where} is not "
                         f"supported; supported: {', '.join(_DENSE_ACTIVATIONS)}")
    bias = cfg.get("bias", True)
    if not isinstance(bias, bool):
        raise ValueError(f"Dense config field bias={bias!r} in {where} must be true or false")
    lin = Linear(n_in, n_out, bias, dtype=dtype, _init=_Init.empty(dtype))
    if tensors is not None:                      # a saved folder: mapped as they are
        for ours in ("weight", "bias")[:1 + bias]:
            t = tensors.get(prefix + ours)
            if t is None or tuple(t.shape) != lin._params[ours].shape:
                raise ValueError(f"{folder}: saved tensor {prefix + ours!r} is missing or not "
                                 f"of shape {lin._params[ours].shape}")
            lin._params[ours] = t
            if isinstance(t, Int8Weight):
                lin.__dict__["_quantize"] = "int8"
        return lin, _DENSE_ACTIVATIONS[act]
    tensors = read_safetensors(checkpoint_files(folder))
    for ours, theirs in (("weight", "linear.weight"), ("bias", "linear.bias"))[:1 + bias]:
        t = tensors.get(theirs)
        dst = lin._params[ours]
        if t is None or t.shape != dst.shape or t.dtype.kind != "f":
            raise ValueError(f"{folder}: tensor {theirs!r} is missing or not a float array of "
                             f"shape {dst.shape}")
        dst[...] = t
    lin._prepack()
    return lin, _DENSE_ACTIVATIONS[act]


def st_config(root, model_dir):
    """(sentence_bert_config.json's fields, its path) from the Transformer module's folder or
    the root; ({}, None) without one."""
    for folder in dict.fromkeys((model_dir, root)):
        path = os.path.join(folder, "sentence_bert_config.json")
        if os.path.isfile(path):
            return _read_json(path, "sentence-transformers config", dict), path
    return {}, None


def st_max_seq_length(root, model_dir, config):
    """sentence-transformers' truncation length (sentence_bert_config.json), or None."""
    cfg, path = st_config(root, model_dir)
    n = cfg.get("max_seq_length")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"config field max_seq_length={n!r} in {path} must be a "
                         "positive integer")
    return None if n is None else min(n, config.max_tokens)


def check_pooling(pooling):
    try:
        modes = (pooling,) if isinstance(pooling, str) else tuple(pooling)
    except TypeError:
        modes = ()
    if not modes or any(m not in POOLING_MODES for m in modes):
        raise ValueError(f"pooling must be one of {POOLING_MODES} or a sequence of them, got "
                         f"{pooling!r}")
    return tuple(m for m in POOLING_MODES if m in modes)


def pool(hidden, mask, modes, normalize):
    """Pool a hidden state over its tokens.

    hidden : ndarray (B, S, H); mask : bool ndarray (B, S) or None (all tokens);
    modes : tuple in POOLING_MODES order; returns (B, H * len(modes)). Rows with no token are
    zeros.
    """
    B, S, H = hidden.shape
    m = np.ones((B, S), dtype=bool) if mask is None else mask
    counts = m.sum(axis=1).astype(hidden.dtype)[:, None]              # (B, 1)
    empty = counts[:, 0] == 0
    parts = []
    summed = None
    for mode in modes:
        if mode == "cls":
            v = hidden[:, 0, :].copy() if S else np.zeros((B, H), hidden.dtype)
        elif mode == "max":
            v = np.where(m[:, :, None], hidden, -np.inf).max(axis=1, initial=-np.inf)
        else:
            if summed is None:
                # each row's tokens added in their order, whatever padding follows them (a
                # masked matmul over S summed in an order that depended on S)
                summed = np.stack([hidden[b][m[b]].sum(axis=0) for b in range(B)]) if B \
                    else np.zeros((0, H), hidden.dtype)
            safe = np.maximum(counts, 1)
            v = summed / (safe if mode == "mean" else np.sqrt(safe))
        v[empty] = 0
        parts.append(v)
    out = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
    return l2_normalize(out) if normalize else out


def l2_normalize(out):
    """Each row over its L2 norm (in place); zero rows stay zero."""
    norms = np.sqrt(np.square(out).sum(axis=1, keepdims=True))
    out /= np.maximum(norms, np.finfo(out.dtype).tiny)
    return out
