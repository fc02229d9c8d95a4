"""What Hugging Face checkpoints share across model types: JSON files, activation names, and
the weights (``model.safetensors`` or a sharded index), read by :class:`Checkpoint` one tensor
at a time, straight from the files (no torch, no whole-file copy; BF16 widened to float32 by
hand, NumPy having no bfloat16).

The model-specific readers (``fastattn/models/bert.py``, ``fastattn/models/marian.py``) map
config fields and weight names; both name activations through :func:`canonical_activation`.
"""

import json
import os

import numpy as np

__all__ = ["Checkpoint", "canonical_activation", "checkpoint_files", "read_json", "read_progress",
           "read_safetensors"]


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


# safetensors dtype codes -> NumPy dtypes (little-endian). BF16 has no NumPy dtype: it is read
# as its 16-bit patterns and widened to float32 (exactly: a bfloat16 is a float32's top half).
_ST_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8",
              "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}
_READ_BLOCK = 4 << 20           # bytes read and converted at a time (when converting)
_progress = []                  # callbacks given the bytes of each read (read_progress)


class read_progress:
    """``with read_progress(callback):`` calls ``callback(nbytes)`` after each read of tensor
    bytes from a checkpoint (a command's progress bar)."""

    def __init__(self, callback):
        self.callback = callback

    def __enter__(self):
        _progress.append(self.callback)
        return self

    def __exit__(self, *exc):
        _progress.remove(self.callback)


class Checkpoint:
    """The tensors of one or more safetensors files, read from disk when asked for.

    A mapping ``name -> ndarray`` (float16 stays float16, bfloat16 is widened to float32, as
    the safetensors NumPy API and transformers' loading would give them), whose arrays are
    read only on access: holding a Checkpoint costs the headers, not the weights. Loaders read
    one tensor at a time (:meth:`copy_into` writes it straight into its destination, converting
    block by block), so that a model loads without the whole file in memory.

    The headers are checked when the files are opened: a truncated or corrupt file, an
    unknown dtype or a tensor whose bytes do not fit its shape is a ValueError naming the file
    and the tensor. Names may be aliased or dropped (:meth:`alias`, :meth:`discard`) and arrays
    added (``ckpt[name] = array``) without reading anything.
    """

    def __init__(self, files):
        self._entries = {}            # name -> (path, numpy dtype str, shape, offset, nbytes)
        self._arrays = {}             # name -> ndarray given in memory (overrides)
        self.files = [os.fspath(f) for f in files]
        for path in self.files:
            for name, entry in _read_header(path).items():
                self._entries[name] = entry

    # -- the mapping ------------------------------------------------------------------------
    def keys(self):
        return list(dict.fromkeys(list(self._entries) + list(self._arrays)))

    def __iter__(self):
        return iter(self.keys())

    def __len__(self):
        return len(self.keys())

    def __contains__(self, name):
        return name in self._arrays or name in self._entries

    def __getitem__(self, name):
        if name in self._arrays:
            return self._arrays[name]
        return self.read(name)

    def get(self, name, default=None):
        return self[name] if name in self else default

    def items(self):
        for name in self.keys():
            yield name, self[name]

    def __setitem__(self, name, array):
        self._arrays[name] = array
        self._entries.pop(name, None)

    def discard(self, name):
        """Forget `name` without reading it."""
        self._arrays.pop(name, None)
        self._entries.pop(name, None)

    def alias(self, new, old):
        """`new` reads the same tensor as `old` (nothing is read)."""
        if old in self._arrays:
            self._arrays[new] = self._arrays[old]
        else:
            self._entries[new] = self._entries[old]

    @classmethod
    def of_arrays(cls, arrays):
        """A Checkpoint over arrays already in memory (a state_dict): the same interface."""
        new = cls([])
        new._arrays = dict(arrays)
        return new

    def copy(self):
        """A new Checkpoint over the same files and names (nothing is read)."""
        new = Checkpoint.__new__(Checkpoint)
        new.files, new._entries, new._arrays = self.files, dict(self._entries), dict(self._arrays)
        return new

    # -- what a tensor is, without reading it ------------------------------------------------
    def shape(self, name):
        if name in self._arrays:
            return tuple(self._arrays[name].shape)
        return self._entries[name][2]

    def dtype(self, name):
        """The NumPy dtype the tensor reads as (bfloat16: float32)."""
        if name in self._arrays:
            return np.asarray(self._arrays[name]).dtype
        _, code, _, _, _, bf16 = self._entries[name]
        return np.dtype("<f4" if bf16 else code)

    def same_tensor(self, a, b):
        """True when a and b are the same bytes of the same file (an alias)."""
        ea, eb = self._entries.get(a), self._entries.get(b)
        return ea is not None and eb is not None and ea[0] == eb[0] and ea[3] == eb[3]

    # -- reading ---------------------------------------------------------------------------------
    def read(self, name, rows=None):
        """The tensor `name` (its rows [a, b) when given) as a new array."""
        if name in self._arrays:
            arr = np.asarray(self._arrays[name])
            return arr if rows is None else arr[rows[0]:rows[1]]
        path, code, shape, offset, nbytes, bf16 = self._entries[name]
        shape, offset, nbytes = _row_range(shape, offset, nbytes, np.dtype(code), rows)
        raw = np.empty(shape, code)
        _read_exact(path, offset, raw, name)
        if bf16:
            return (raw.astype(np.uint32) << 16).view(np.float32)
        return raw

    def copy_into(self, name, dst, rows=None):
        """Write tensor `name` (its rows [a, b)) into `dst` (same shape; converted to dst's
        dtype), reading at most a block of it at a time beyond dst itself."""
        if name in self._arrays:
            src = self.read(name, rows)
            dst[...] = src
            return
        path, code, shape, offset, nbytes, bf16 = self._entries[name]
        shape, offset, nbytes = _row_range(shape, offset, nbytes, np.dtype(code), rows)
        if tuple(shape) != tuple(dst.shape):
            raise ValueError(f"{path}: tensor {name!r} has shape {tuple(shape)}, expected "
                             f"{tuple(dst.shape)}")
        src_dt = np.dtype(code)
        if not bf16 and src_dt == dst.dtype and dst.flags.c_contiguous:
            _read_exact(path, offset, dst, name)          # straight into place
            return
        flat = dst.reshape(-1) if dst.flags.c_contiguous else None
        if flat is None or not shape:
            dst[...] = self.read(name, rows)
            return
        per = max(1, _READ_BLOCK // max(src_dt.itemsize, 1))
        n = flat.size
        raw = np.empty(min(n, per), src_dt)
        wide = np.empty(raw.size, np.uint32) if bf16 else None
        for a in range(0, n, per):
            b = min(n, a + per)
            _read_exact(path, offset + a * src_dt.itemsize, raw[:b - a], name)
            if bf16:                         # a bfloat16 is the top half of a float32
                np.left_shift(raw[:b - a], 16, out=wide[:b - a], dtype=np.uint32)
                flat[a:b] = wide[:b - a].view(np.float32)
            else:
                flat[a:b] = raw[:b - a]

    def equal(self, a, b):
        """Whether tensors a and b hold the same values (compared block by block)."""
        if self.shape(a) != self.shape(b):
            return False
        if self.same_tensor(a, b):
            return True
        shape = self.shape(a)
        n = shape[0] if shape else 0
        if not shape or a in self._arrays or b in self._arrays:
            return bool(np.array_equal(self[a], self[b]))
        row_bytes = max(1, int(np.prod(shape[1:], dtype=np.int64)) * 4)
        step = max(1, _READ_BLOCK // row_bytes)
        for r in range(0, n, step):
            rr = (r, min(n, r + step))
            if not np.array_equal(self.read(a, rr), self.read(b, rr)):
                return False
        return True


def _row_range(shape, offset, nbytes, dt, rows):
    if rows is None:
        return shape, offset, nbytes
    a, b = rows
    if not shape or not 0 <= a <= b <= shape[0]:
        raise ValueError(f"rows {rows} out of range for shape {shape}")
    row = int(np.prod(shape[1:], dtype=np.int64)) * dt.itemsize
    return (b - a,) + tuple(shape[1:]), offset + a * row, (b - a) * row


def _read_exact(path, offset, out, name):
    """Fill the C-contiguous array `out` with the file's bytes from `offset`."""
    view = memoryview(out.reshape(-1).view(np.uint8)) if out.size else None
    if view is None:
        return
    try:
        with open(path, "rb", buffering=0) as f:
            f.seek(offset)
            got = 0
            while got < len(view):
                n = f.readinto(view[got:])
                if not n:
                    raise ValueError(f"could not read the safetensors file {path}: tensor "
                                     f"{name!r} ends past the end of the file (truncated?)")
                got += n
    except OSError as exc:
        raise ValueError(f"could not read the safetensors file {path}: {exc}") from None
    for callback in _progress:
        callback(len(view))


def _read_header(path):
    """{name: (path, dtype, shape, data offset, nbytes, is_bf16)} of a safetensors file,
    checked against the file's size: ValueError naming the file otherwise."""
    def bad(why):
        return ValueError(f"could not read the safetensors file {path}: {why}")

    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise bad("it is shorter than a safetensors header (truncated or empty)")
            n = int.from_bytes(head, "little")
            if not 0 < n <= min(size - 8, 100_000_000):
                raise bad(f"its header length {n} does not fit the file's {size} bytes "
                          "(truncated, or not a safetensors file)")
            raw = fh.read(n)
    except OSError as exc:
        raise bad(exc) from None
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad(f"its header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise bad("its header is not a JSON object")
    base, data = 8 + n, size - 8 - n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            code = info["dtype"]
            if code not in _ST_DTYPES:
                raise ValueError(f"dtype {code!r} is not supported")
            dt = np.dtype(_ST_DTYPES[code])
            shape = tuple(int(s) for s in info["shape"])
            a, b = (int(x) for x in info["data_offsets"])
            if any(s < 0 for s in shape):
                raise ValueError(f"negative size in shape {shape}")
            if not 0 <= a <= b:
                raise ValueError(f"data offsets {[a, b]} are not an increasing range")
            if b - a != dt.itemsize * int(np.prod(shape, dtype=np.int64)):
                raise ValueError(f"its {b - a} bytes do not hold a {code} tensor of shape "
                                 f"{list(shape)}")
            if b > data:
                raise ValueError(f"its data ends at byte {base + b}, past the end of the file "
                                 f"({size} bytes): the file is truncated")
        except (KeyError, TypeError, ValueError) as exc:
            raise bad(f"tensor {name!r}: {exc}") from None
        out[name] = (path, _ST_DTYPES[code], shape, base + a, b - a, code == "BF16")
    return out


def read_safetensors(files):
    """The tensors of the safetensors files as a :class:`Checkpoint` (read on access)."""
    return Checkpoint(files)
