"""CTranslate2 model folders (what ``ct2-transformers-converter`` writes, what faster-whisper
loads): ``model.bin``, CTranslate2's ``config.json``, the vocabularies.

``model.bin`` (CTranslate2's ``ModelSpec._serialize``, read by its ``src/models/model.cc``), all
integers little-endian::

    uint32 binary version                      (6 since CTranslate2 3.0; 2 to 5 read too)
    string spec name, uint32 spec revision     ("WhisperSpec", 3 ...)
    uint32 variable count, then per variable:
        string name                            ("decoder/layer_0/ffn/linear_0/weight")
        uint8 rank, uint32 dims[rank]
        uint8 type id                          (0 float32, 1 int8, 2 int16, 3 int32,
                                                4 float16, 5 bfloat16)
        uint32 byte count, the bytes           (row-major)
    uint32 alias count, then per alias: string alias, string variable name

where a string is a uint16 length (the trailing NUL counted) and its UTF-8 bytes then NUL.
An alias names a variable whose values equal another's (the converter aliases every such
duplicate: a tied output projection, equal LayerNorm weights); it brings the target's
``_scale`` along (``model.cc`` registers ``alias + "_scale"`` too). A weight quantized to int8
is ``w_q = round(w * scale)`` in [-127, 127] with one float32 ``scale`` per output row, stored
beside it as ``<name>_scale``; scalars (flags, head counts, the embedding scale) are variables of
rank 0.

:class:`ModelBin` reads the header only (names, shapes, types, offsets: the file's data is
skipped with seeks) and gives the variables as a :class:`~fastattn.io.huggingface.Checkpoint`
read one tensor at a time. :class:`MappedCheckpoint` presents them under other names (the
model's Hugging Face names): each tensor a stack of row blocks of the file's variables (or zero
rows), int8 blocks dequantized when read as float, or handed over as their integers and scales
(:meth:`MappedCheckpoint.int8`). What this module does not read is refused by name: another
binary version, spec or revision, int16 weights, a truncated file.
"""
import json
import os
import struct

import numpy as np

from .huggingface import Checkpoint, read_json

__all__ = ["BINARY_VERSION", "SPEC_REVISIONS", "ModelBin", "MappedCheckpoint", "Block",
           "is_ct2_folder", "read_config", "read_vocabulary", "legacy_config"]

#: the binary layout CTranslate2 >= 3.0 writes; versions 2 to 5 (CTranslate2 1.x and 2.x:
#: OPUS-MT conversions and Argos Translate packages of 2021-22) are read too -- item sizes for
#: types before version 4, no aliases before 3, tokens and flags as model.bin variables (not a
#: config.json) before 6 (:func:`legacy_config`)
BINARY_VERSION = 6
OLDEST_BINARY_VERSION = 2
#: the specs read and the revisions of their layout: (oldest, newest); TransformerSpec's
#: revisions before 5 keep num_heads, pre_norm, activation ... once at the top for both sides
#: (aliased here as CTranslate2 does), before 3 have no num_heads (the spec's name gives it)
SPEC_REVISIONS = {"WhisperSpec": (3, 3), "TransformerSpec": (2, 7),
                  "TransformerEncoderSpec": (1, 1)}
# the old spec names of a Transformer and their head counts (revisions before 3)
_OLD_TRANSFORMERS = {"TransformerBase": 8, "TransformerBig": 16}
# item size -> type of binary versions before 4 (no type id: float32, int16, int8)
_ITEM_TYPES = {4: 0, 2: 2, 1: 1}
# the top-level options of TransformerSpec revisions before 5, and the sides that read them
_TOP_OPTIONS = {"num_heads": ("encoder", "decoder"), "pre_norm": ("encoder", "decoder"),
                "activation": ("encoder", "decoder"), "embeddings_merge": ("encoder",),
                "alignment_layer": ("decoder",), "alignment_heads": ("decoder",)}
#: model.bin variables of binary versions before 6 that hold what config.json holds now
LEGACY_ATTRIBUTES = ("unk_token", "bos_token", "eos_token", "with_source_bos", "with_source_eos",
                     "with_target_bos", "user_decoder_start_tokens")
# CTranslate2's DataType enum (include/ctranslate2/types.h) -> (name, NumPy code); bfloat16 is
# read as its 16-bit patterns and widened to float32 (a bfloat16 is a float32's top half)
_TYPES = {0: ("float32", "<f4"), 1: ("int8", "i1"), 2: ("int16", "<i2"), 3: ("int32", "<i4"),
          4: ("float16", "<f2"), 5: ("bfloat16", "<u2")}
_CODES = dict(_TYPES.values())
_READ_BLOCK = 4 << 20              # bytes of float32 dequantized at a time
MODEL_FILE = "model.bin"
# config.json fields of a Hugging Face folder: a folder with model.bin and one of these is not
# CTranslate2's (fastattn reads its safetensors instead)
_HF_FIELDS = ("model_type", "architectures", "_name_or_path")


def is_ct2_folder(folder):
    """Whether `folder` is a CTranslate2 model folder: a model.bin whose first four bytes are a
    binary version (not a pickled PyTorch file) and no config.json of Hugging Face's
    (``model_type``)."""
    path = os.path.join(folder, MODEL_FILE)
    if not os.path.isfile(path):
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    if len(head) < 4 or head[:2] in (b"PK", b"\x80\x02") or \
            int.from_bytes(head, "little") > 1000:
        return False                      # a torch zip / pickle named model.bin
    cfg = os.path.join(folder, "config.json")
    if os.path.isfile(cfg):
        try:
            with open(cfg, encoding="utf-8") as f:
                raw = json.load(f)
        except (OSError, ValueError):
            return True                   # read_config names the problem
        if isinstance(raw, dict) and any(k in raw for k in _HF_FIELDS):
            return False
    return True


class _Reader:
    """Sequential reads of a model.bin's header fields, each failure naming the file and the
    field being read."""

    def __init__(self, f, path, size):
        self.f, self.path, self.size = f, path, size

    def bad(self, what):
        return ValueError(f"{self.path}: {what}")

    def take(self, fmt, field):
        n = struct.calcsize("<" + fmt)
        raw = self.f.read(n)
        if len(raw) != n:
            raise self.bad(f"the file ends in {field} (truncated, or not a CTranslate2 "
                           "model.bin)")
        return struct.unpack("<" + fmt, raw)

    def string(self, field):
        (n,) = self.take("H", field)
        if n == 0:
            raise self.bad(f"{field} has length 0 (a CTranslate2 string counts its NUL)")
        raw = self.f.read(n)
        if len(raw) != n:
            raise self.bad(f"the file ends in {field} (truncated)")
        if raw[-1:] != b"\0":
            raise self.bad(f"{field} does not end in NUL (not a CTranslate2 model.bin?)")
        try:
            return raw[:-1].decode("utf-8")
        except UnicodeDecodeError:
            raise self.bad(f"{field} is not UTF-8 text") from None


class ModelBin:
    """The header of a CTranslate2 ``model.bin``: ``version``, ``spec``, ``revision``,
    ``variables`` (name -> (type name, shape, offset, byte count)), ``aliases`` (alias ->
    variable name). Nothing of the variables' data is read here (:meth:`checkpoint`,
    :meth:`scalar` read it).

    ValueError naming the file and the field for: a binary version other than
    :data:`BINARY_VERSION`, a spec or revision not in :data:`SPEC_REVISIONS`, a type id
    CTranslate2 does not define, an int16 / int32 array (int16 quantization), a byte count that
    does not fit the shape, data past the end of the file, bytes after the last alias, an alias
    of nothing.
    """

    def __init__(self, path):
        self.path = path = os.fspath(path)
        try:
            size = os.path.getsize(path)
            f = open(path, "rb")
        except OSError as exc:
            raise ValueError(f"could not read the CTranslate2 model {path}: {exc}") from None
        with f:
            r = _Reader(f, path, size)
            (self.version,) = r.take("I", "the binary version")
            if not OLDEST_BINARY_VERSION <= self.version <= BINARY_VERSION:
                raise r.bad(f"binary version {self.version} is not supported: this reads "
                            f"versions {OLDEST_BINARY_VERSION} to {BINARY_VERSION} (CTranslate2 "
                            "1.x to 4.x); convert the model again with a current "
                            "ct2-transformers-converter")
            self.spec = r.string("the spec name")
            (self.revision,) = r.take("I", "the spec revision")
            self.virtual = {}                 # scalars the file's spec implies (old revisions)
            if self.spec in _OLD_TRANSFORMERS or self.spec == "":
                heads = _OLD_TRANSFORMERS.get(self.spec, 8)
                self.spec = "TransformerSpec"
                if self.revision < 3:         # no num_heads variable yet: the name's
                    self.virtual["num_heads"] = heads
            if self.spec not in SPEC_REVISIONS:
                raise r.bad(f"spec {self.spec!r} is not supported (supported: "
                            f"{', '.join(SPEC_REVISIONS)})")
            low, high = SPEC_REVISIONS[self.spec]
            if not low <= self.revision <= high:
                raise r.bad(f"revision {self.revision} of {self.spec} is not supported: this "
                            f"reads revisions {low} to {high}; convert the model again with a "
                            "current ct2-transformers-converter")
            (count,) = r.take("I", "the variable count")
            self.variables = {}
            for i in range(count):
                name = r.string(f"the name of variable {i}")
                where = f"variable {name!r}"
                (rank,) = r.take("B", f"the rank of {where}")
                shape = r.take(f"{rank}I", f"the shape of {where}") if rank else ()
                if self.version >= 4:
                    type_id, nbytes = r.take("B", f"the type of {where}")[0], \
                        r.take("I", f"the byte count of {where}")[0]
                else:                         # an item size, then a count of items
                    item = r.take("B", f"the item size of {where}")[0]
                    if item not in _ITEM_TYPES:
                        raise r.bad(f"{where} has item size {item}, which CTranslate2 does not "
                                    "define")
                    type_id = _ITEM_TYPES[item]
                    nbytes = r.take("I", f"the item count of {where}")[0] * item
                if type_id not in _TYPES:
                    raise r.bad(f"{where} has type id {type_id}, which CTranslate2 does not "
                                "define")
                kind, code = _TYPES[type_id]
                if kind in ("int16", "int32") and rank:
                    raise r.bad(f"{where} is an {kind} array: int16 quantization is not "
                                "supported (convert with --quantization int8, float16 or "
                                "float32)")
                want = int(np.prod(shape, dtype=np.int64)) * np.dtype(code).itemsize
                if nbytes != want:
                    raise r.bad(f"{where}: its byte count {nbytes} does not hold a {kind} array "
                                f"of shape {list(shape)}")
                offset = f.tell()
                if offset + nbytes > size:
                    raise r.bad(f"{where} ends at byte {offset + nbytes}, past the end of the "
                                f"file ({size} bytes): the file is truncated")
                if name in self.variables:
                    raise r.bad(f"{where} is written twice")
                self.variables[name] = (kind, tuple(shape), offset, nbytes)
                f.seek(nbytes, os.SEEK_CUR)
            (n_alias,) = r.take("I", "the alias count") if self.version >= 3 else (0,)
            self.aliases = {}
            for i in range(n_alias):
                alias = r.string(f"the name of alias {i}")
                self.aliases[alias] = r.string(f"the target of alias {alias!r}")
            rest = size - f.tell()
            if rest:
                raise r.bad(f"{rest} bytes after the last alias (not a model.bin this reads)")
        for alias in self.aliases:
            self.resolve(alias)
        if self.spec == "TransformerSpec" and self.resolve("encoder/embeddings/weight") and \
                self.resolve("encoder/embeddings_0/weight") is None:
            # one source embedding under its old name (before source factors)
            self.aliases["encoder/embeddings_0/weight"] = "encoder/embeddings/weight"
            if self.resolve("encoder/embeddings/weight_scale"):
                self.aliases["encoder/embeddings_0/weight_scale"] = \
                    "encoder/embeddings/weight_scale"
        if self.spec == "TransformerSpec" and self.revision < 5:
            # the options once at the top, for both sides (CTranslate2's TransformerModel::
            # initialize registers these aliases)
            for name, sides in _TOP_OPTIONS.items():
                if name in self.variables or name in self.virtual:
                    for side in sides:
                        self.aliases.setdefault(f"{side}/{name}", name)

    @property
    def quantized(self):
        """Whether the file holds int8 weights (arrays; int8 scalars are flags, and an old
        file's tokens are int8 arrays of their bytes)."""
        return any(kind == "int8" and shape and name not in LEGACY_ATTRIBUTES
                   for name, (kind, shape, _, _) in self.variables.items())

    def resolve(self, name):
        """The variable `name` is (through its aliases), or None when there is none."""
        seen = set()
        while name not in self.variables and name not in self.virtual:
            if name not in self.aliases or name in seen:
                if seen:
                    raise ValueError(f"{self.path}: alias {sorted(seen)[0]!r} leads to "
                                     f"{name!r}, which is no variable")
                return None
            seen.add(name)
            name = self.aliases[name]
        return name

    def __contains__(self, name):
        return self.resolve(name) is not None

    def names(self):
        """Every variable and alias name."""
        return list(self.variables) + list(self.aliases)

    def kind(self, name):
        """The stored type: 'float32', 'float16', 'bfloat16', 'int8', 'int16', 'int32'."""
        return self.variables[self.resolve(name)][0]

    def shape(self, name):
        return self.variables[self.resolve(name)][1]

    def scale_of(self, name):
        """The variable holding the int8 scales of `name` (``<name>_scale``, or the scales of
        the variable it aliases), or None."""
        own = self.resolve(name + "_scale")
        if own is not None:
            return own
        target = self.resolve(name)
        return None if target is None else self.resolve(target + "_scale")

    def scalar(self, name, default=None):
        """The value of the rank-0 variable `name` (a Python int or float), or `default` when
        the file has none."""
        var = self.resolve(name)
        if var is None:
            return default
        if var in self.virtual:
            return self.virtual[var]
        kind, shape, offset, _ = self.variables[var]
        if shape:
            raise ValueError(f"{self.path}: variable {name!r} has shape {list(shape)}, not a "
                             "scalar")
        code = _CODES[kind]
        value = self._bytes(offset, np.dtype(code).itemsize).view(code)[0]
        if kind == "bfloat16":
            return float((np.uint32(value) << 16).view(np.float32))
        return value.item()

    def _bytes(self, offset, n):
        with open(self.path, "rb") as f:
            f.seek(offset)
            raw = f.read(n)
        if len(raw) != n:
            raise ValueError(f"{self.path}: the file ends before byte {offset + n} (truncated)")
        return np.frombuffer(raw, np.uint8)

    def checkpoint(self):
        """The variables (and aliases) by CTranslate2 name as a Checkpoint read from the file
        on access: float16 stays float16, bfloat16 is widened to float32, int8 stays int8."""
        ckpt = Checkpoint([])
        for name, (kind, shape, offset, nbytes) in self.variables.items():
            ckpt._entries[name] = (self.path, _CODES[kind], shape, offset, nbytes,
                                   kind == "bfloat16")
        for alias in self.aliases:
            target = self.resolve(alias)
            if target in self.variables:          # not a scalar the spec's name implies
                ckpt.alias(alias, target)
        ckpt.files = [self.path]
        return ckpt


class Block(tuple):
    """Rows of a mapped tensor: ``Block(var)`` all of variable `var`, ``Block(var, (a, b))``
    its rows [a, b), ``Block(None, n)`` n rows of zeros, ``Block(None, n, value)`` n rows of
    `value` (a bias entry no variable holds)."""

    def __new__(cls, var, rows=None, value=0.0):
        return super().__new__(cls, (var, rows, value))

    @property
    def var(self):
        return self[0]


class MappedCheckpoint(Checkpoint):
    """A :class:`~fastattn.io.huggingface.Checkpoint` over a model.bin's variables under other
    names: each tensor a stack of :class:`Block` rows (of variables, or of a constant) seen in a
    shape of the same size. Read as float32 (float16, bfloat16 and the dequantized int8 values
    ``w_q / scale``), one tensor at a time; :meth:`int8` gives an all-int8 tensor's integers and
    scales as they are stored. The mapping interface (aliases, discard, arrays set in memory)
    is the Checkpoint's."""

    def __init__(self, model_bin):
        super().__init__([])
        self.bin = model_bin              # the header; raw: the variables by their own names
        self.files = [model_bin.path]
        self.quantized = model_bin.quantized
        self.raw = model_bin.checkpoint()

    def add(self, name, blocks, shape=None):
        """Map `name` to the stack of `blocks` (Block), seen in `shape` (default: the stack's
        own)."""
        blocks = tuple(b if isinstance(b, Block) else Block(b) for b in blocks)
        rows, tail = 0, None
        for b in blocks:
            var, part, _ = b
            if var is None:
                rows += part
                continue
            if var not in self.bin:
                raise ValueError(f"{self.bin.path}: no variable {var!r} (expected for {name})")
            vshape = self.bin.shape(var)
            if not vshape:
                raise ValueError(f"{self.bin.path}: variable {var!r} is a scalar, not {name}")
            a, b_ = part if part is not None else (0, vshape[0])
            if not 0 <= a <= b_ <= vshape[0]:
                raise ValueError(f"{self.bin.path}: rows {part} of {var!r} (shape "
                                 f"{list(vshape)}) do not exist")
            if tail is not None and vshape[1:] != tail:
                raise ValueError(f"{self.bin.path}: {var!r} (shape {list(vshape)}) does not "
                                 f"stack with the other parts of {name}")
            tail = vshape[1:]
            rows += b_ - a
        tail = tail if tail is not None else ()
        stacked = (rows,) + tail
        shape = stacked if shape is None else tuple(shape)
        if int(np.prod(shape)) != int(np.prod(stacked)):
            raise ValueError(f"{self.bin.path}: {name} is {list(stacked)} in the file, not "
                             f"{list(shape)}")
        self._entries[name] = (blocks, stacked, shape)
        self._arrays.pop(name, None)

    def copy(self):
        new = MappedCheckpoint.__new__(MappedCheckpoint)
        new.__dict__.update(self.__dict__)
        new._entries, new._arrays = dict(self._entries), dict(self._arrays)
        return new

    # -- what a tensor is ---------------------------------------------------------------------
    def shape(self, name):
        if name in self._arrays:
            return tuple(self._arrays[name].shape)
        return self._entries[name][2]

    def dtype(self, name):
        if name in self._arrays:
            return np.asarray(self._arrays[name]).dtype
        return np.dtype(np.float32)

    def same_tensor(self, a, b):
        ea, eb = self._entries.get(a), self._entries.get(b)
        return ea is not None and ea == eb

    def int8(self, name):
        """``(q, s)`` of an int8 tensor: its integers (the stacked rows, int8, C-contiguous) and
        one float32 scale per row such that ``q * s`` is the weight (``s = 1 / scale`` of the
        file; 0 for zero rows); None when a block is not int8."""
        if name in self._arrays or name not in self._entries:
            return None
        blocks, stacked, _ = self._entries[name]
        if not any(b.var is not None for b in blocks):
            return None
        for var, _, value in blocks:
            if var is None and value != 0:
                return None
            if var is not None and (self.bin.kind(var) != "int8" or
                                    self.bin.scale_of(var) is None):
                return None
        q = np.zeros(stacked, np.int8)
        s = np.zeros(stacked[0], np.float32)
        at = 0
        for var, part, _ in blocks:
            if var is None:
                at += part
                continue
            a, b = part if part is not None else (0, self.bin.shape(var)[0])
            self.raw.copy_into(var, q[at:at + b - a], None if part is None else part)
            s[at:at + b - a] = _inverse(self._scales(var, (a, b)), self.bin.path, var)
            at += b - a
        return q, s

    def _scales(self, var, rows):
        scale = self.bin.scale_of(var)
        if scale is None:
            raise ValueError(f"{self.bin.path}: the int8 variable {var!r} has no scale "
                             f"({var}_scale)")
        if self.bin.shape(scale) != self.bin.shape(var)[:1]:
            raise ValueError(f"{self.bin.path}: {scale!r} has shape "
                             f"{list(self.bin.shape(scale))}: not one scale per row of {var!r}")
        return np.asarray(self.raw.read(scale, rows), np.float32)

    # -- reading ------------------------------------------------------------------------------
    def read(self, name, rows=None):
        if name in self._arrays:
            return super().read(name, rows)
        _, stacked, shape = self._entries[name]
        if rows is not None and shape != stacked:
            return self.read(name).reshape(shape)[rows[0]:rows[1]]
        n = stacked[0] if rows is None else rows[1] - rows[0]
        out = np.empty((n,) + stacked[1:], np.float32)
        self._fill(name, out, 0 if rows is None else rows[0])
        return out if rows is not None else out.reshape(shape)

    def copy_into(self, name, dst, rows=None):
        if name in self._arrays:
            return super().copy_into(name, dst, rows)
        _, stacked, shape = self._entries[name]
        want = shape if rows is None else (rows[1] - rows[0],) + shape[1:]
        if tuple(dst.shape) != tuple(want):
            raise ValueError(f"{self.bin.path}: {name} has shape {tuple(want)}, expected "
                             f"{tuple(dst.shape)}")
        if shape != stacked or not dst.flags.c_contiguous:
            dst[...] = self.read(name, rows)
            return
        self._fill(name, dst, 0 if rows is None else rows[0])

    def _fill(self, name, out, start):
        """out[i] = row start + i of the stack, block by block (converted to out's dtype)."""
        blocks = self._entries[name][0]
        at = 0                         # the stack's row where the current block starts
        for var, part, value in blocks:
            n = part if var is None else \
                (part[1] - part[0] if part is not None else self.bin.shape(var)[0])
            a, b = max(start, at), min(start + out.shape[0], at + n)
            if a < b:
                dst = out[a - start:b - start]
                if var is None:
                    dst[...] = value
                else:
                    base = 0 if part is None else part[0]
                    rr = (base + a - at, base + b - at)
                    self._read_rows(var, rr, dst)
            at += n

    def _read_rows(self, var, rows, dst):
        if self.bin.kind(var) != "int8":
            self.raw.copy_into(var, dst, rows)
            return
        # w = w_q / scale, as CTranslate2 dequantizes; a block of rows at a time
        row = max(1, int(np.prod(self.bin.shape(var)[1:])))
        step = max(1, _READ_BLOCK // (4 * row))
        for a in range(rows[0], rows[1], step):
            b = min(rows[1], a + step)
            q = self.raw.read(var, (a, b))
            scale = self._scales(var, (a, b)).reshape((-1,) + (1,) * (q.ndim - 1))
            dst[a - rows[0]:b - rows[0]] = q.astype(np.float32) / scale


def _inverse(scale, path, var):
    if not np.all(np.isfinite(scale) & (scale > 0)):
        raise ValueError(f"{path}: the scales of {var!r} are not all positive finite numbers")
    return (np.float32(1) / scale).astype(np.float32)


def read_config(folder):
    """CTranslate2's config.json of `folder` (a dict; {} when the folder has none); a model.bin
    of binary version < 6 without one: :func:`legacy_config`."""
    path = os.path.join(folder, "config.json")
    if not os.path.exists(path):
        model = os.path.join(folder, MODEL_FILE)
        if os.path.isfile(model):
            mb = ModelBin(model)
            if mb.version < BINARY_VERSION and mb.spec == "TransformerSpec":
                return legacy_config(mb)
        return {}
    return read_json(path, "CTranslate2 config", dict)


def legacy_config(mb):
    """The config.json fields a model.bin of binary version < 6 holds as variables (as
    CTranslate2's SequenceToSequenceModel::initialize reads them): the special tokens (int8
    arrays of their UTF-8 bytes; default ``<unk>``, ``<s>``, ``</s>``), ``with_source_bos`` /
    ``with_source_eos`` -> ``add_source_bos`` / ``_eos``, and the decoder's start token (none
    with ``user_decoder_start_tokens``, else BOS with ``with_target_bos`` (default), else EOS)."""
    def text(name, default):
        var = mb.resolve(name)
        if var is None:
            return default
        kind, shape, offset, nbytes = mb.variables[var]
        if kind != "int8" or len(shape) != 1:
            raise ValueError(f"{mb.path}: variable {name!r} is not a token (int8 bytes)")
        try:
            return bytes(mb._bytes(offset, nbytes)).decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{mb.path}: variable {name!r} is not UTF-8") from None

    def flag(name, default):
        value = mb.scalar(name)
        return default if value is None else bool(value)

    cfg = {"unk_token": text("unk_token", "<unk>"), "bos_token": text("bos_token", "<s>"),
           "eos_token": text("eos_token", "</s>"),
           "add_source_bos": flag("with_source_bos", False),
           "add_source_eos": flag("with_source_eos", False)}
    if flag("user_decoder_start_tokens", False):
        cfg["decoder_start_token"] = None
    elif flag("with_target_bos", True):
        cfg["decoder_start_token"] = cfg["bos_token"]
    else:
        cfg["decoder_start_token"] = cfg["eos_token"]
    return cfg


def read_vocabulary(folder, name):
    """The tokens of ``folder/<name>.json`` (a JSON list) or ``<name>.txt`` (a token a line),
    as CTranslate2 reads them (the JSON file first; a text file's carriage returns dropped only
    when every line ends in one), or None when neither exists."""
    path = os.path.join(folder, name + ".json")
    if os.path.isfile(path):
        tokens = read_json(path, "CTranslate2 vocabulary", list)
        if not all(isinstance(t, str) for t in tokens):
            raise ValueError(f"{path}: a vocabulary must be a JSON list of strings")
        return tokens
    path = os.path.join(folder, name + ".txt")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text: {exc}") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if lines and all(line.endswith("\r") for line in lines):
        lines = [line[:-1] for line in lines]
    return lines
