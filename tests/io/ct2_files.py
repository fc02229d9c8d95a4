"""CTranslate2 model.bin files written byte by byte (the layout of CTranslate2's
``ModelSpec._serialize``), for tests that need a file no converter writes: another version,
spec or type, an extra variable, damage."""
import struct

import numpy as np

TYPE_IDS = {"float32": 0, "int8": 1, "int16": 2, "int32": 3, "float16": 4, "bfloat16": 5}


def _string(s):
    raw = s.encode("utf-8")
    return struct.pack("<H", len(raw) + 1) + raw + b"\0"


def model_bin(variables, aliases=(), spec="TransformerEncoderSpec", revision=1, version=6):
    """The bytes of a model.bin: `variables` (name, array) or (name, array, type name) for
    a type NumPy lacks ("bfloat16": the array's uint16 patterns), `aliases` (alias, name)."""
    out = [struct.pack("<I", version), _string(spec), struct.pack("<I", revision),
           struct.pack("<I", len(variables))]
    for var in variables:
        name, a = var[0], np.asarray(var[1])
        kind = var[2] if len(var) > 2 else a.dtype.name
        out += [_string(name), struct.pack("<B", a.ndim),
                struct.pack(f"<{a.ndim}I", *a.shape) if a.ndim else b"",
                struct.pack("<B", TYPE_IDS[kind]), struct.pack("<I", a.nbytes),
                np.ascontiguousarray(a).tobytes()]
    out.append(struct.pack("<I", len(aliases)))
    for alias, name in aliases:
        out += [_string(alias), _string(name)]
    return b"".join(out)


def variables_of(path):
    """[(name, array, type name)] and [(alias, name)] of an existing model.bin (to rewrite)."""
    from fastattn.io.ctranslate2 import ModelBin
    b = ModelBin(path)
    out = []
    for name, (kind, shape, offset, nbytes) in b.variables.items():
        with open(path, "rb") as f:
            f.seek(offset)
            raw = f.read(nbytes)
        dt = {"float32": "<f4", "int8": "i1", "int16": "<i2", "int32": "<i4", "float16": "<f2",
              "bfloat16": "<u2"}[kind]
        out.append((name, np.frombuffer(raw, dt).reshape(shape), kind))
    return out, sorted(b.aliases.items())
