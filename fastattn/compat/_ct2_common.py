"""What :mod:`fastattn.compat.ctranslate2`'s classes share: the constructor's arguments
(device, compute type, threads), CTranslate2's vocabularies and result objects."""
import json
import os

import numpy as np

from ..io.ctranslate2 import ModelBin, is_ct2_folder, read_vocabulary

# compute_type -> fastattn's quantize (None: the folder's storage, its int8 kept as int8)
_COMPUTE = {"default": None, "auto": None, "float32": None, "float16": None,
            "int8": "int8", "int8_float32": "int8", "int8_float16": "int8",
            "int8_bfloat16": "int8", "bfloat16": "bfloat16"}


def check_options(name, options, defaults):
    """A ValueError naming the first of `options` whose value differs from its default in
    `defaults` (what CTranslate2 does and fastattn does not)."""
    for key, why in defaults.items():
        default = why[0]
        value = options[key]
        if value is not default and value != default:
            raise ValueError(f"{name}: {key}={value!r} is not supported by fastattn "
                             f"({why[1]}); only {default!r}")


def load_settings(model_path, device, device_index, compute_type, intra_threads, flash_attention,
                  tensor_parallel, files, inter_threads=1, max_queued_batches=0):
    """Check the constructor's arguments -> (folder, quantize, n_threads)."""
    if files is not None:
        raise ValueError("files=: loading a model from memory is not supported; give the "
                         "folder's path")
    path = os.fspath(model_path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"model_path={path!r} is not a folder")
    if not is_ct2_folder(path):
        raise ValueError(f"model_path={path!r} is not a CTranslate2 folder (no model.bin): "
                         "for a Hugging Face folder use fastattn's own classes")
    if device not in ("cpu", "auto"):
        raise ValueError(f"device={device!r} is not supported: fastattn computes on the CPU "
                         "only (device='cpu')")
    if device_index not in (0, [0]):
        raise ValueError(f"device_index={device_index!r}: one CPU device, index 0")
    if isinstance(compute_type, dict):
        if "cpu" not in compute_type:
            raise ValueError(f"compute_type={compute_type!r} names no type for 'cpu'")
        compute_type = compute_type["cpu"]
    if compute_type not in _COMPUTE:
        raise ValueError(f"compute_type={compute_type!r} is not supported (one of "
                         f"{', '.join(sorted(_COMPUTE))}; int16 is not)")
    quantize = _COMPUTE[compute_type]
    if compute_type == "float32" and _folder_is_int8(path):
        raise ValueError(f"compute_type='float32': {path} holds int8 weights, which fastattn "
                         "computes in int8 (it does not dequantize them): use "
                         "compute_type='int8' or 'default'")
    for name, value in (("flash_attention", flash_attention),
                        ("tensor_parallel", tensor_parallel)):
        if value:
            raise ValueError(f"{name}=True is not supported: fastattn runs on one CPU device")
    for name, value, low in (("intra_threads", intra_threads, 0),
                             ("inter_threads", inter_threads, 1),
                             ("max_queued_batches", max_queued_batches, -1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return path, quantize, (int(intra_threads) or None)


class LoadedModel:
    """CTranslate2's constructor (the three classes share it): the folder loaded by the fastattn
    class `_loads` with the quantize its compute_type asks for; `model` is that model; then the
    class's own `_setup()`."""

    _loads = None            # the fastattn class whose from_pretrained reads the folder

    def __init__(self, model_path, device="cpu", *, device_index=0, compute_type="default",
                 inter_threads=1, intra_threads=0, max_queued_batches=0,
                 flash_attention=False, tensor_parallel=False, files=None):
        path, quantize, self._threads = load_settings(
            model_path, device, device_index, compute_type, intra_threads, flash_attention,
            tensor_parallel, files, inter_threads, max_queued_batches)
        self.model = self._loads.from_pretrained(path, quantize=quantize)
        self.model_path, self.device, self.device_index = path, "cpu", [0]
        self.compute_type = "int8_float32" if self.model.quantize == "int8" else (
            self.model.quantize or "float32")
        self.tensor_parallel = False
        self._inter_threads = int(inter_threads)
        self._setup()

    def _setup(self):
        """What a class reads from its folder beyond the model."""

    def __repr__(self):
        return f"{type(self).__name__}({self.model_path!r}, compute_type={self.compute_type!r})"

    # CTranslate2's state properties: the model stays loaded, nothing is queued (every call is
    # computed at once)
    model_is_loaded = True
    num_queued_batches = 0
    num_active_batches = 0


def _folder_is_int8(path):
    """Whether model.bin holds int8 weights (each with its ``weight_scale``)."""
    return ModelBin(os.path.join(path, "model.bin")).quantized


def read_config(path):
    where = os.path.join(path, "config.json")
    if not os.path.isfile(where):
        return {}
    with open(where, encoding="utf-8") as f:
        return json.load(f)


class Vocabulary:
    """A CTranslate2 vocabulary file: tokens <-> ids (an unknown token maps to the unknown
    token's id, as CTranslate2 does; the unknown token is added when the file lacks it)."""

    def __init__(self, path, name, unk="<unk>"):
        tokens = read_vocabulary(path, name)
        if tokens is None:
            raise FileNotFoundError(f"{path} has no {name}.json or {name}.txt")
        if unk is not None and unk not in tokens:
            tokens = tokens + [unk]
        self.tokens = tokens
        self.index = {t: i for i, t in enumerate(tokens)}
        self.unk = self.index.get(unk)

    def __len__(self):
        return len(self.tokens)

    def ids(self, tokens, name):
        if isinstance(tokens, str):
            raise TypeError(f"{name} must be a list of tokens (strings), got a string: "
                            "tokenize it first")
        out = []
        for t in tokens:
            if isinstance(t, str):
                i = self.index.get(t, self.unk)
                if i is None:
                    raise ValueError(f"{name}: token {t!r} is not in the vocabulary, which has "
                                     "no unknown token")
            elif isinstance(t, (int, np.integer)) and not isinstance(t, bool) and \
                    0 <= t < len(self.tokens):
                i = int(t)
            else:
                raise TypeError(f"{name} must hold token strings, got {t!r}")
            out.append(i)
        return out

    def to_tokens(self, ids):
        return [self.tokens[i] if i < len(self.tokens) else "<pad>" for i in ids]


def truncate(ids, max_length, eos):
    """CTranslate2's truncation of an input to `max_length` ids (0: none), its EOS (and a
    language code after it) kept in the last positions."""
    if not max_length or len(ids) <= max_length:
        return ids
    out = ids[:max_length]
    if ids[-1] == eos:
        out[-1] = eos
    elif len(ids) >= 2 and ids[-2] == eos and max_length >= 2:
        out[-2], out[-1] = eos, ids[-1]
    return out


class _Result:
    """A result object: the named fields, a repr, equality by value."""

    _fields = ()

    def __init__(self, **kw):
        for k in self._fields:
            setattr(self, k, kw.get(k))

    def __repr__(self):
        body = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._fields)
        return f"{type(self).__name__}({body})"

    def __eq__(self, other):
        return type(self) is type(other) and all(
            getattr(self, k) == getattr(other, k) for k in self._fields)

    def __getitem__(self, key):      # CTranslate2's results read as dicts in older code
        if key not in self._fields:
            raise KeyError(key)
        return getattr(self, key)


class AsyncResult:
    """CTranslate2's Async*Result: here already computed (fastattn has no worker queue);
    ``result()`` returns it, ``done()`` is True."""

    def __init__(self, value, error=None):
        self._value, self._error = value, error

    def result(self):
        """The result, or the error the computation raised (every call, as CTranslate2)."""
        if self._error is not None:
            raise self._error
        return self._value

    def done(self):
        return True


def batches(n, lengths, max_batch_size, batch_type):
    """Index lists of CTranslate2's rebatching: all at once, or sorted by length and cut in
    chunks of `max_batch_size` examples or tokens (fastattn's results do not depend on the
    batch, so this only bounds memory)."""
    if batch_type not in ("examples", "tokens"):
        raise ValueError(f"batch_type={batch_type!r}: 'examples' or 'tokens'")
    if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, (int, np.integer)) \
            or max_batch_size < 0:
        raise ValueError(f"max_batch_size must be an integer >= 0, got {max_batch_size!r}")
    if not max_batch_size or n == 0:
        return [list(range(n))]
    order = sorted(range(n), key=lambda i: -lengths[i])
    out, cur, longest = [], [], 0
    for i in order:
        longest2 = max(longest, lengths[i])
        size = (len(cur) + 1) * longest2 if batch_type == "tokens" else len(cur) + 1
        if cur and size > max_batch_size:
            out.append(cur)
            cur, longest2 = [], lengths[i]
        cur.append(i)
        longest = longest2
    out.append(cur)
    return out
