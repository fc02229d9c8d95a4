"""sentence-transformers folders for :class:`fastattn.EncoderModel`: what each of their files
says, and the modules that run after the Transformer (pooling, Dense, L2 normalisation).

modules.json lists Transformer, Pooling, then Dense and Dropout modules in any order, then
optionally Normalize; any other module is refused by its type. Every field of the files these
modules read (sentence_bert_config.json, the Pooling, Dense and Normalize configs,
config_sentence_transformers.json) that changes sentence-transformers' ``encode`` is either
honoured or refused with its name and file: none is skipped.
"""
import os
from typing import NamedTuple

import numpy as np

from .._quant import Int8Weight
from .._validation import check_folder
from ..io.huggingface import checkpoint_files, read_safetensors
from ..io.huggingface import read_json as _read_json
from ..nn._module import _Init
from ..nn.linear import Linear

__all__ = ["POOLING_MODES", "Modules", "Dense", "read_folder", "pooling_from_config",
           "read_dense", "transformer_config", "check_pooling", "pool", "l2_normalize"]

#: pooling modes in the order sentence-transformers concatenates them when several are set by
#: its pooling_mode_* flags (a ``pooling_mode`` list is concatenated in its own order)
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len")

# sentence-transformers' Pooling config flags -> our mode names (None: not supported)
_POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_weightedmean_tokens": None,
    "pooling_mode_lasttoken": None,
}
# its ``pooling_mode`` names -> ours
_POOLING_NAMES = {"cls": "cls", "max": "max", "mean": "mean", "mean_sqrt_len_tokens":
                  "mean_sqrt_len", "mean_sqrt_len": "mean_sqrt_len"}
_POOLING_KEYS = {"embedding_dimension", "word_embedding_dimension", "pooling_mode",
                 "include_prompt", *_POOLING_FLAGS}

# the module types we run, by the last part of their sentence_transformers class path
_TRANSFORMER, _POOLING, _DENSE, _DROPOUT, _NORMALIZE = (
    "Transformer", "Pooling", "Dense", "Dropout", "Normalize")
_MODULE_TYPES = (_TRANSFORMER, _POOLING, _DENSE, _DROPOUT, _NORMALIZE)
# where sentence-transformers writes the sentence vector; a module reading or writing another
# feature (token embeddings, a second output) is not one we run
_SENTENCE = "sentence_embedding"


class Modules(NamedTuple):
    """What a model folder's sentence-transformers files say (:func:`read_folder`)."""
    model_dir: str          # the Transformer module's folder (config.json, weights, tokenizer)
    pooling: object         # pooling modes (a plain folder), or the Pooling config's path
    dense: list             # the Dense modules' folders, in order
    normalize: bool         # a Normalize module ends the list
    truncate_dim: object    # config_sentence_transformers.json's truncate_dim, or None
    prompt: object          # the default prompt prepended to every text, or None
    st_folder: bool         # the folder has modules.json


def _module_kind(type_name):
    """'Dense' for 'sentence_transformers.models.Dense' (or its 6.x path
    'sentence_transformers.base.modules.dense.Dense'); None for another library's module."""
    if not type_name.startswith("sentence_transformers."):
        return None
    kind = type_name.rsplit(".", 1)[-1]
    return kind if kind in _MODULE_TYPES else None


def read_folder(path):
    """The :class:`Modules` of a model folder.

    A sentence-transformers folder has modules.json: its Transformer module names the folder of
    config.json + weights, its Pooling module the pooling config; Dense modules follow (Dropout
    does nothing at inference) and a final Normalize module turns on L2 normalisation.
    Without modules.json: mean pooling, then normalisation.
    """
    root = check_folder(path)
    modules_path = os.path.join(root, "modules.json")
    if not os.path.exists(modules_path):
        return Modules(root, ("mean",), [], True, None, None, False)
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
    types = [t for _, t, _ in entries]
    kinds = [_module_kind(t) for t in types]
    odd = next((t for t, k in zip(types, kinds) if k is None), None)
    tail = kinds[2:-1] if kinds[-1:] == [_NORMALIZE] else kinds[2:]
    if odd is not None or kinds[:2] != [_TRANSFORMER, _POOLING] or \
            any(k not in (_DENSE, _DROPOUT) for k in tail):
        raise ValueError(
            f"{modules_path} lists the modules {types}"
            + (f"; module type {odd!r} is not supported" if odd else "")
            + "; supported: Transformer, Pooling, then optionally Dense and Dropout modules, "
              "then optionally Normalize")
    dense = [p for (_, _, p), k in zip(entries, kinds) if k == _DENSE]
    normalize = kinds[-1] == _NORMALIZE and len(kinds) > 2
    if normalize:
        _check_normalize(entries[-1][2])
    truncate_dim, prompt = _model_config(root)
    return Modules(entries[0][2], entries[1][2], dense, normalize, truncate_dim, prompt, True)


def _check_io_names(cfg, where, module):
    """A module must read and write the sentence vector (sentence-transformers' default)."""
    for key in ("module_input_name", "module_output_name"):
        value = cfg.get(key)
        if value is not None and value != _SENTENCE:
            raise ValueError(f"{module} config field {key}={value!r} in {where} is not "
                             f"supported (only {_SENTENCE!r})")


def _check_normalize(folder):
    where = os.path.join(folder, "config.json")
    if os.path.isfile(where):                  # written since sentence-transformers 5
        _check_io_names(_read_json(where, "sentence-transformers Normalize config", dict),
                        where, "Normalize")


def _model_config(root):
    """(truncate_dim, default prompt) from config_sentence_transformers.json."""
    where = os.path.join(root, "config_sentence_transformers.json")
    if not os.path.isfile(where):
        return None, None
    cfg = _read_json(where, "sentence-transformers config", dict)
    kind = cfg.get("model_type", "SentenceTransformer")
    if kind != "SentenceTransformer":
        raise ValueError(f"config field model_type={kind!r} in {where} is not supported (only "
                         "'SentenceTransformer')")
    dim = cfg.get("truncate_dim")
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int) or dim < 1):
        raise ValueError(f"config field truncate_dim={dim!r} in {where} must be a positive "
                         "integer")
    prompts = cfg.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(
            isinstance(v, str) or v is None for v in prompts.values()):
        raise ValueError(f"config field prompts={prompts!r} in {where} must map names to "
                         "strings")
    name = cfg.get("default_prompt_name")
    if name is not None and (not isinstance(name, str) or name not in prompts):
        raise ValueError(f"config field default_prompt_name={name!r} in {where} names no "
                         f"prompt of {sorted(prompts)}")
    return dim, (prompts[name] or None) if name is not None else None


def _check_dimension(cfg, path, hidden_size):
    for key in ("embedding_dimension", "word_embedding_dimension"):
        dim = cfg.get(key, hidden_size)
        if dim != hidden_size:
            raise ValueError(f"Pooling config field {key}={dim!r} in {path} differs from the "
                             f"model's hidden size {hidden_size}")


def pooling_from_config(path, hidden_size):
    """Pooling modes (tuple, in their order of concatenation) from a sentence-transformers
    Pooling config: ``pooling_mode`` (a name or a list, sentence-transformers 6) or the
    ``pooling_mode_*`` flags of earlier versions (ignored beside ``pooling_mode``, as
    sentence-transformers does); neither: mean."""
    cfg = _read_json(path, "sentence-transformers Pooling config", dict)
    unknown = sorted(set(cfg) - _POOLING_KEYS)
    if unknown:
        raise ValueError(f"Pooling config field {unknown[0]} in {path} is not supported; "
                         f"supported: {', '.join(sorted(_POOLING_KEYS))}")
    _check_dimension(cfg, path, hidden_size)
    if cfg.get("include_prompt", True) is not True:
        raise ValueError(f"Pooling config field include_prompt={cfg['include_prompt']!r} in "
                         f"{path} is not supported (only true)")
    mode = cfg.get("pooling_mode")
    if mode is not None:
        names = [mode] if isinstance(mode, str) else mode
        if not isinstance(names, list) or not names or len(set(map(str, names))) < len(names) \
                or any(not isinstance(n, str) or n not in _POOLING_NAMES for n in names):
            raise ValueError(f"Pooling config field pooling_mode={mode!r} in {path} is not "
                             "supported; supported: one or a list of distinct cls, max, mean, "
                             "mean_sqrt_len_tokens")
        return tuple(_POOLING_NAMES[n] for n in names)
    modes = set()
    for key in _POOLING_FLAGS:
        value = cfg.get(key, False)
        if not isinstance(value, bool):
            raise ValueError(f"Pooling config field {key}={value!r} in {path} must be true "
                             "or false")
        if value and _POOLING_FLAGS[key] is None:
            raise ValueError(f"Pooling config field {key}=true in {path} is not supported; "
                             f"supported: "
                             f"{', '.join(k for k, v in _POOLING_FLAGS.items() if v)}")
        if value:
            modes.add(_POOLING_FLAGS[key])
    if not modes and any(k in cfg for k in _POOLING_FLAGS):
        raise ValueError(f"Pooling config {path} sets no pooling mode (one of "
                         f"{', '.join(k for k, v in _POOLING_FLAGS.items() if v)} must be "
                         "true)")
    return tuple(m for m in POOLING_MODES if m in modes) or ("mean",)


# -- Dense --------------------------------------------------------------------------------------

def _sigmoid(x):
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-x))


def _softplus(x):               # torch's: beta 1, x itself past the threshold 20
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def _elu(x, alpha=1.0):
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946

# torch.nn activation classes as sentence-transformers writes them (their class path), built
# with no arguments as it loads them -> (the GEMM's fused epilogue, or a NumPy function of the
# GEMM's result); (None, None) is the identity
_DENSE_ACTIVATIONS = {
    "Identity": (None, None),
    "ReLU": ("relu", None),
    "GELU": ("gelu", None),
    "SiLU": ("silu", None),
    "Tanh": (None, np.tanh),
    "Sigmoid": (None, _sigmoid),
    "LeakyReLU": (None, lambda x: np.where(x >= 0, x, x * 0.01)),
    "ELU": (None, _elu),
    "CELU": (None, _elu),
    "SELU": (None, lambda x: _SELU_SCALE * _elu(x, _SELU_ALPHA)),
    "Softplus": (None, _softplus),
    "Mish": (None, lambda x: x * np.tanh(_softplus(x))),
    "Softsign": (None, lambda x: x / (1 + np.abs(x))),
    "Tanhshrink": (None, lambda x: x - np.tanh(x)),
    "LogSigmoid": (None, lambda x: np.minimum(x, 0) - np.log1p(np.exp(-np.abs(x)))),
    "Hardtanh": (None, lambda x: np.clip(x, -1, 1)),
    "ReLU6": (None, lambda x: np.clip(x, 0, 6)),
    "Hardsigmoid": (None, lambda x: np.clip(x / 6 + 0.5, 0, 1)),
    "Hardswish": (None, lambda x: x * np.clip(x + 3, 0, 6) / 6),
}
_DEFAULT_ACTIVATION = "torch.nn.modules.activation.Tanh"      # Dense's default


def _activation_name(act, where):
    """The class name of a Dense activation path: torch.nn.modules.activation.X (Identity:
    torch.nn.modules.linear.Identity), as torch names the class, or torch.nn.X."""
    name = act.rsplit(".", 1)[-1] if isinstance(act, str) else None
    module = "linear" if name == "Identity" else "activation"
    if name in _DENSE_ACTIVATIONS and act in (f"torch.nn.modules.{module}.{name}",
                                              f"torch.nn.{name}"):
        return name
    raise ValueError(f"Dense config field activation_function={act!r} in {where} is not "
                     f"supported; supported: torch.nn.{', torch.nn.'.join(_DENSE_ACTIVATIONS)}")


class Dense:
    """A sentence-transformers Dense module: act(x W^T + b), plus x (or x R^T when the sizes
    differ) with use_residual."""

    def __init__(self, linear, activation, residual=None):
        self.linear, self.activation, self.residual = linear, activation, residual
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self._fused, self._act = _DENSE_ACTIVATIONS[activation]

    def __repr__(self):
        return (f"Dense({self.in_features} -> {self.out_features}, {self.activation}"
                + (", residual)" if self.residual is not None else ")"))

    def linears(self):
        return [self.linear] + ([self.residual] if isinstance(self.residual, Linear) else [])

    def named_arrays(self, prefix):
        """Parameter name -> array, for a saved folder."""
        out = {f"{prefix}{n}": a for n, a, _, _ in self.linear._named_params()}
        if isinstance(self.residual, Linear):
            out.update((f"{prefix}residual.{n}", a) for n, a, _, _ in
                       self.residual._named_params())
        return out

    def prepack(self):
        self.linear._prepack(self._fused)
        if isinstance(self.residual, Linear):
            self.residual._prepack()

    def __call__(self, x):
        """(N, in_features) -> (N, out_features), in one GEMM pass where the activation is one
        of the GEMM's epilogues."""
        res = None if self.residual is None else \
            x if self.residual is True else self.residual._forward(x)
        if self._act is None:
            return self.linear._forward(x, residual=res, activation=self._fused)
        y = self._act(self.linear._forward(x))
        if res is not None:
            y += res
        return y


_DENSE_KEYS = ("in_features", "out_features", "bias", "activation_function",
               "module_input_name", "module_output_name", "use_residual")


def _dense_tensors(folder):
    """A Dense folder's tensors: model.safetensors (sentence-transformers' pytorch_model.bin,
    written before its 2.3, is refused with the way to convert it)."""
    if not os.path.exists(os.path.join(folder, "model.safetensors")) and \
            os.path.exists(os.path.join(folder, "pytorch_model.bin")):
        raise ValueError(f"{folder} holds pytorch_model.bin but no model.safetensors: fastattn "
                         "reads safetensors only (it never imports torch). Convert the folder "
                         "once with sentence-transformers: SentenceTransformer(folder)"
                         ".save(folder)")
    return read_safetensors(checkpoint_files(folder))


def read_dense(folder, in_features, dtype, tensors=None, prefix=""):
    """A sentence-transformers Dense module (:class:`Dense`); its weights from the folder, or
    from `tensors` (a saved folder's, names under `prefix`)."""
    where = os.path.join(folder, "config.json")
    cfg = _read_json(where, "sentence-transformers Dense config", dict)
    unknown = sorted(set(cfg) - set(_DENSE_KEYS))
    if unknown:
        raise ValueError(f"Dense config field {unknown[0]} in {where} is not supported; "
                         f"supported: {', '.join(_DENSE_KEYS)}")
    n_in, n_out = cfg.get("in_features"), cfg.get("out_features")
    for name, v in (("in_features", n_in), ("out_features", n_out)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"Dense config field {name}={v!r} in {where} must be a positive "
                             "integer")
    if n_in != in_features:
        raise ValueError(f"Dense config field in_features={n_in} in {where} does not match the "
                         f"{in_features} features that reach it")
    act = _activation_name(cfg.get("activation_function", _DEFAULT_ACTIVATION), where)
    _check_io_names(cfg, where, "Dense")
    flags = {}
    for name, default in (("bias", True), ("use_residual", False)):
        flags[name] = cfg.get(name, default)
        if not isinstance(flags[name], bool):
            raise ValueError(f"Dense config field {name}={flags[name]!r} in {where} must be "
                             "true or false")
    bias = flags["bias"]
    lin = Linear(n_in, n_out, bias, dtype=dtype, _init=_Init.empty(dtype))
    residual = None
    if flags["use_residual"]:
        residual = True if n_in == n_out else \
            Linear(n_in, n_out, False, dtype=dtype, _init=_Init.empty(dtype))
    # ours -> (its tensor name in sentence-transformers' file, in a saved folder)
    names = [(lin, "weight", "linear.weight", "weight")]
    if bias:
        names.append((lin, "bias", "linear.bias", "bias"))
    if isinstance(residual, Linear):
        names.append((residual, "weight", "residual.weight", "residual.weight"))
    if tensors is not None:                      # a saved folder: mapped as they are
        for module, ours, _, saved_name in names:
            t = tensors.get(prefix + saved_name)
            if t is None or tuple(t.shape) != module._params[ours].shape:
                raise ValueError(f"{folder}: saved tensor {prefix + saved_name!r} is missing or "
                                 f"not of shape {module._params[ours].shape}")
            module._params[ours] = t
            if isinstance(t, Int8Weight):
                module.__dict__["_quantize"] = "int8"
        return Dense(lin, act, residual)
    tensors = _dense_tensors(folder)
    for module, ours, theirs, _ in names:
        t = tensors.get(theirs)
        dst = module._params[ours]
        if t is None or t.shape != dst.shape or t.dtype.kind != "f":
            raise ValueError(f"{folder}: tensor {theirs!r} is missing or not a float array of "
                             f"shape {dst.shape}")
        dst[...] = t
    return Dense(lin, act, residual)


# -- the Transformer module's config ------------------------------------------------------------

# the names sentence-transformers looks for, in its order (the others: written before its 2.0)
_TRANSFORMER_CONFIGS = ("sentence_bert_config.json", "sentence_roberta_config.json",
                        "sentence_distilbert_config.json", "sentence_camembert_config.json",
                        "sentence_albert_config.json", "sentence_xlm-roberta_config.json",
                        "sentence_xlnet_config.json")
# fields that change nothing here: unpadding (a speed choice) and the lengths and expansion of
# its query / document tasks (encode runs neither)
_TRANSFORMER_INERT = ("unpad_inputs", "query_length", "document_length", "query_expansion")
# fields that must hold their defaults (a non-empty dict of loading arguments changes the model
# or the tokenizer)
_TRANSFORMER_EMPTY = ("model_args", "tokenizer_args", "config_args", "model_kwargs",
                      "processor_kwargs", "config_kwargs", "processing_kwargs")
_TEXT_FORWARD = {"method": "forward", "method_output_name": "last_hidden_state"}


def transformer_config(model_dir, max_tokens):
    """{"max_seq_length": int or None (at most max_tokens), "do_lower_case": bool} from a
    sentence-transformers Transformer module's config (sentence_bert_config.json) in
    `model_dir`; the other fields it writes must keep the values under which encode computes
    the last hidden state of the text."""
    cfg, where = {}, None
    for name in _TRANSFORMER_CONFIGS:
        if os.path.isfile(os.path.join(model_dir, name)):
            where = os.path.join(model_dir, name)
            cfg = _read_json(where, "sentence-transformers config", dict)
            break

    def refuse(key, why):
        raise ValueError(f"config field {key}={cfg[key]!r} in {where} {why}")

    for key in cfg:
        if key in ("max_seq_length", "do_lower_case") + _TRANSFORMER_INERT:
            continue
        if key in _TRANSFORMER_EMPTY:
            if cfg[key]:
                refuse(key, "is not supported (only empty)")
        elif key == "transformer_task":
            if cfg[key] != "feature-extraction":
                refuse(key, "is not supported (only 'feature-extraction')")
        elif key == "module_output_name":
            if cfg[key] != "token_embeddings":
                refuse(key, "is not supported (only 'token_embeddings')")
        elif key == "modality_config":
            if not isinstance(cfg[key], dict) or cfg[key].get("text") != _TEXT_FORWARD:
                refuse(key, f"is not supported (its 'text' entry must be {_TEXT_FORWARD})")
        else:
            raise ValueError(f"config field {key} in {where} is not supported")
    n = cfg.get("max_seq_length")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        refuse("max_seq_length", "must be a positive integer")
    lower = cfg.get("do_lower_case", False)
    if not isinstance(lower, bool):
        refuse("do_lower_case", "must be true or false")
    return {"max_seq_length": None if n is None else min(n, max_tokens), "do_lower_case": lower}


# -- pooling ------------------------------------------------------------------------------------

def check_pooling(pooling):
    """A `pooling` argument as modes in POOLING_MODES order."""
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
    modes : tuple of POOLING_MODES, concatenated in its order; returns (B, H * len(modes)).
    Rows with no token are zeros.
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
