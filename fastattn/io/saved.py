"""fastattn's own model folders: what ``save_pretrained`` writes and ``from_pretrained`` maps.

A folder holds, next to the source folder's own files (tokenizer, config.json, sentence-
transformers modules; its weight files are not copied):
  fastattn_model.json          {"format": "fastattn", "format_version": 1, "class": ...,
                                "quantize": "int8" or null, "dtype": ..., and the class's own
                                fields (the architecture, the generation defaults)}
  fastattn_model.safetensors   the parameters by fastattn.nn name, in the layout they are used
                                in: an int8 weight as its packed panels (``NAME.int8_panels``,
                                int8), scales (``NAME.int8_scale``, float32) and offset sums
                                (``NAME.int8_comp``, int32) -- no repacking at load --, an int8
                                embedding table as its rows (``NAME.int8_rows``) and scales
                                (``NAME.int8_row_scale``), a float linear weight as its packed
                                panels (``NAME.panels``, format_version 2: the kernel set and
                                blocking they were packed for in ``fastattn_panels``; read back
                                and repacked at load on a CPU whose kernel set differs), every
                                other parameter as its float array. A parameter shared by two
                                layers (a tied embedding) is stored once; the metadata's
                                ``fastattn_ties`` names the others, ``fastattn_int8`` each int8
                                weight's (N, K).
The tensors start on 64-byte boundaries (the int8 panels first, each a multiple of 64 bytes)
and are read through one read-only memory map: nothing is copied at load, and processes that
load the same folder share its pages (the operating system's page cache).
"""
import json
import os
import shutil

import numpy as np

from .._ops import _Packed
from .._quant import Bf16Weight, Int8Rows, Int8Weight

__all__ = ["FORMAT_VERSION", "MODEL_FILE", "WEIGHTS_FILE", "is_saved_folder", "write_folder",
           "read_folder", "read_meta", "assign"]

FORMAT_VERSION = 2          # 2: float panels; a folder without them is written as version 1
MODEL_FILE = "fastattn_model.json"
WEIGHTS_FILE = "fastattn_model.safetensors"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".onnx", ".ckpt")
_WEIGHT_NAMES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_DTYPES = {"F32": np.float32, "F64": np.float64, "I8": np.int8, "I32": np.int32,
           "F16": np.float16}        # F16: binary16 panels of float32 weights (_ops._Packed)
_CODES = {np.dtype(v): k for k, v in _DTYPES.items()}
_INT8_PARTS = ("int8_panels", "int8_scale", "int8_comp")
_ROWS_PARTS = ("int8_rows", "int8_row_scale")


def is_saved_folder(path):
    return os.path.isfile(os.path.join(path, MODEL_FILE))


def _copy_source(src, dst):
    """The source folder's files but its weights (tokenizer, configs, modules)."""
    for root, dirs, files in os.walk(src):
        rel = os.path.relpath(root, src)
        out = os.path.join(dst, rel) if rel != "." else dst
        os.makedirs(out, exist_ok=True)
        for f in files:
            if f.endswith(_WEIGHT_SUFFIXES) or f in _WEIGHT_NAMES or f in (MODEL_FILE,):
                continue
            shutil.copy2(os.path.join(root, f), os.path.join(out, f))


def _refuse_bf16(params):
    """A bfloat16 model is not written (ValueError, before anything is): its folder would hold
    nothing the float32 one does not, and rounding at load takes well under a second a layer."""
    names = [n for n, a in params.items() if isinstance(a, Bf16Weight)]
    if names:
        raise ValueError(f"a bfloat16 model cannot be saved ({len(names)} bfloat16 weights, "
                         f"{names[0]!r} first): save the float32 model and load it with "
                         f"quantize='bfloat16'")


def write_folder(path, params, meta, source=None, model_dir=None, progress=None):
    """Write `params` (fastattn.nn name -> float ndarray or Int8Weight) and `meta` (JSON) to the
    folder `path` (made if missing); `source`: a folder whose non-weight files are copied first;
    `model_dir`: the subfolder (of `path`) the two files go to (default: `path` itself).

    The weights file is written one tensor at a time (a float weight held packed is read back
    from its panels just before it is written, then let go), to a temporary name renamed into
    place at the end; ``progress(done_bytes, total_bytes)`` is called as it goes."""
    path = os.fspath(path)
    _refuse_bf16(params)
    if source is not None and os.path.abspath(source) != os.path.abspath(path):
        _copy_source(source, path)
    target = os.path.join(path, model_dir) if model_dir else path
    os.makedirs(target, exist_ok=True)
    tensors, ties, int8, rows = [], {}, {}, []      # (name, shape, dtype, nbytes, get)
    panels = {}
    seen = {}

    def put(name, a):
        a = a if isinstance(a, np.ndarray) else np.asarray(a)
        tensors.append((name, a.shape, a.dtype, a.nbytes, lambda: np.ascontiguousarray(a)))

    for name, arr in params.items():
        key = id(arr)
        if key in seen:
            ties[name] = seen[key]
            continue
        seen[key] = name
        if isinstance(arr, Int8Weight):
            int8[name] = [arr.N, arr.K]
            for part, a in zip(_INT8_PARTS, (arr.panels, arr.scale, arr.comp)):
                put(f"{name}.{part}", a)
        elif isinstance(arr, Int8Rows):
            rows.append(name)
            for part, a in zip(_ROWS_PARTS, (arr.q, arr.scale)):
                put(f"{name}.{part}", a)
        elif isinstance(arr, _Packed):               # a float weight held packed: its panels
            arr.current()
            panels[name] = [arr.N, arr.K, arr.level, list(arr.blocking)]
            # binary16 panels (of a float32 weight) are stored as float16
            put(f"{name}.panels", arr.buf.view(np.float16) if arr.half else arr.buf)
        elif not isinstance(arr, np.ndarray):        # any other packed form: its values
            n = int(np.prod(arr.shape)) * np.dtype(arr.dtype).itemsize
            tensors.append((name, tuple(arr.shape), np.dtype(arr.dtype), n,
                            lambda arr=arr: np.ascontiguousarray(arr.dequantize())))
        else:
            put(name, arr)
    # the panels first (their sizes are multiples of 64 bytes: each starts 64-byte aligned),
    # then the rest
    tensors.sort(key=lambda t: (not t[0].endswith((".int8_panels", ".panels")),
                                t[3] % 64 != 0))
    header, offset = {}, 0
    for name, shape, dtype, nbytes, _ in tensors:
        if dtype not in _CODES:
            raise TypeError(f"{name}: dtype {dtype} cannot be saved")
        header[name] = {"dtype": _CODES[dtype], "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"format": "fastattn", "fastattn_ties": json.dumps(ties),
                              "fastattn_int8": json.dumps(int8),
                              "fastattn_int8_rows": json.dumps(rows),
                              "fastattn_panels": json.dumps(panels)}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-(8 + len(blob)) % 64)               # the data starts 64-byte aligned
    tmp = os.path.join(target, WEIGHTS_FILE + ".tmp")
    done = 0
    try:
        with open(tmp, "wb") as f:
            f.write(len(blob).to_bytes(8, "little"))
            f.write(blob)
            for name, shape, dtype, nbytes, get in tensors:
                a = get()
                if a.shape != tuple(shape) or a.nbytes != nbytes:
                    raise ValueError(f"{name}: its values are not of shape {tuple(shape)}")
                f.write(memoryview(a.reshape(-1).view(np.uint8)) if a.size else b"")
                done += nbytes
                del a
                if progress is not None:
                    progress(done, offset)
        os.replace(tmp, os.path.join(target, WEIGHTS_FILE))
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    doc = {"format": "fastattn", "format_version": FORMAT_VERSION if panels else 1, **meta}
    with open(os.path.join(target, MODEL_FILE + ".tmp"), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    os.replace(os.path.join(target, MODEL_FILE + ".tmp"), os.path.join(target, MODEL_FILE))


def read_meta(path, cls_name):
    """The folder's fastattn_model.json, checked: ValueError naming the file otherwise."""
    where = os.path.join(path, MODEL_FILE)
    try:
        with open(where, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where}: cannot read it as JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != "fastattn":
        raise ValueError(f"{where}: not a fastattn model file (no \"format\": \"fastattn\")")
    version = meta.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"{where}: format_version={version!r} is not a positive integer")
    if version > FORMAT_VERSION:
        raise ValueError(f"{where}: format_version {version} was written by a newer fastattn; "
                         f"this version reads format_version <= {FORMAT_VERSION} (upgrade "
                         f"fastattn, or save the model again from its float folder)")
    if meta.get("class") != cls_name:
        raise ValueError(f"{where}: holds a {meta.get('class')!r}, not a {cls_name}")
    return meta


def read_folder(path):
    """The parameters of `path`'s fastattn_model.safetensors (name -> read-only ndarray, a view
    of one memory map, or Int8Weight over such views), ties resolved."""
    where = os.path.join(path, WEIGHTS_FILE)
    if not os.path.isfile(where):
        raise FileNotFoundError(f"{where} not found (the weights of a folder written by "
                                f"save_pretrained)")
    size = os.path.getsize(where)
    try:
        with open(where, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 0 < n <= size - 8:
                raise ValueError("the header length does not fit the file")
            header = json.loads(f.read(n))
        meta = header.pop("__metadata__", {})
        ties = json.loads(meta.get("fastattn_ties", "{}"))
        int8 = json.loads(meta.get("fastattn_int8", "{}"))
        int8_rows = json.loads(meta.get("fastattn_int8_rows", "[]"))
        packed = json.loads(meta.get("fastattn_panels", "{}"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{where}: not a readable fastattn weights file ({exc})") from None
    data = np.memmap(where, dtype=np.uint8, mode="r") if size > 8 + n else np.zeros(0, np.uint8)
    base = 8 + n
    raw = {}
    for name, info in header.items():
        try:
            dt = np.dtype(_DTYPES[info["dtype"]])
            a, b = info["data_offsets"]
            shape = tuple(int(s) for s in info["shape"])
            if not (0 <= a <= b <= size - base) or b - a != dt.itemsize * int(np.prod(shape)):
                raise ValueError("its data offsets do not fit its shape or the file")
            if dt == np.float16 and not name.endswith(".panels"):
                raise ValueError("float16 is only written for packed panels")
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: tensor {name!r}: {exc}") from None
        raw[name] = np.ndarray(shape, dt, buffer=data, offset=base + a)
    params = {}
    for name, (N, K) in int8.items():
        try:
            parts = [raw.pop(f"{name}.{p}") for p in _INT8_PARTS]
        except KeyError as exc:
            raise ValueError(f"{where}: int8 weight {name!r} has no {exc.args[0]!r}") from None
        params[name] = Int8Weight.from_arrays(*parts, N, K, name=f"{where}: {name}")
    for name in int8_rows:
        try:
            parts = [raw.pop(f"{name}.{p}") for p in _ROWS_PARTS]
        except KeyError as exc:
            raise ValueError(f"{where}: int8 rows {name!r} have no {exc.args[0]!r}") from None
        params[name] = Int8Rows.from_arrays(*parts, name=f"{where}: {name}")
    for name, info in packed.items():
        try:
            buf = raw.pop(f"{name}.panels")
            N, K, level, blocking = info
            nr = int(blocking[1])
            if buf.ndim != 1 or buf.dtype.kind != "f" or nr < 1 or \
                    buf.size != K * (-(-N // nr) * nr):
                raise ValueError(f"its panels hold {buf.size} values, not those of ({N}, {K}) "
                                 f"in {nr}-wide panels")
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ValueError(f"{where}: packed weight {name!r}: {exc}") from None
        params[name] = _Packed.from_panels(buf, N, K, level, blocking)
    params.update(raw)
    for alias, name in ties.items():
        if name not in params:
            raise ValueError(f"{where}: {alias!r} is tied to {name!r}, which is not in the file")
        params[alias] = params[name]
    return params


def assign(params, modules, path):
    """Put read_folder's `params` in place of the parameters of `modules` ((prefix, module)
    pairs: a parameter's name in the file is prefix.name); a module holding an int8 parameter
    is marked int8 with its children. ValueError naming a missing or misshaped parameter."""
    where = os.path.join(path, WEIGHTS_FILE)
    for prefix, module in modules:
        for name, arr, owner, key in list(module._named_params()):
            got = params.get(f"{prefix}.{name}")
            if got is None or tuple(got.shape) != tuple(arr.shape):
                raise ValueError(f"{where}: parameter {prefix}.{name} is missing or not of "
                                 f"shape {arr.shape}")
            owner._params[key] = got
            if isinstance(got, (Int8Weight, Int8Rows)):
                for m in module._modules():
                    m.__dict__["_quantize"] = "int8"
            elif isinstance(got, _Packed):
                owner.__dict__["_compact"] = True
