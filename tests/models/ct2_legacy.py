"""A CTranslate2 TransformerSpec folder written again as CTranslate2 1.x / 2.x wrote it:
binary version 5, 4 or 3 (item sizes instead of type ids before 4; aliases from 3), the spec
revision 4 layout (num_heads, pre_norm, activation, alignment ... once at the top; revision 2:
no num_heads, the spec's name -- TransformerBase, TransformerBig -- gives it), the tokens
and flags of config.json as model.bin variables, no config.json, the vocabulary as text.

The layout is CTranslate2's own reader (src/models/model.cc, models/transformer.cc,
models/sequence_to_sequence.cc); a current CTranslate2 still loads these files, which is how the
tests check the writer: its translations of the rewritten folder are the original's."""
import json
import os
import struct

import numpy as np

from fastattn.io.ctranslate2 import ModelBin, read_vocabulary

_TYPE_IDS = {"float32": 0, "int8": 1, "int16": 2, "int32": 3, "float16": 4, "bfloat16": 5}
_MOVED = ("num_heads", "pre_norm", "activation", "embeddings_merge", "alignment_layer",
          "alignment_heads")


def _string(f, s):
    b = s.encode("utf-8")
    f.write(struct.pack("<H", len(b) + 1) + b + b"\0")


def write_legacy(src, dst, version=5, revision=4, spec="TransformerSpec", bare=False):
    """`bare`: as OpenNMT-tf's old conversions (CTranslate2's own test model): no position
    tables (CTranslate2's built-in sinusoids), ``encoder/embeddings``, no pre_norm / activation
    / alignment scalars (their defaults)."""
    mb = ModelBin(os.path.join(src, "model.bin"))
    assert mb.spec == "TransformerSpec"
    cfg = json.load(open(os.path.join(src, "config.json")))
    os.makedirs(dst, exist_ok=True)
    raw = open(os.path.join(src, "model.bin"), "rb").read()
    variables = []                                      # (name, kind, shape, bytes)
    aliases = dict(mb.aliases)
    for name, (kind, shape, off, n) in mb.variables.items():
        if bare and (name.endswith("position_encodings/encodings") or
                     name.split("/")[-1] in _MOVED[1:]):
            continue
        if bare and name.startswith("encoder/embeddings_0/"):
            name = name.replace("embeddings_0", "embeddings")
        if revision < 5 and name.count("/") == 1 and name.split("/")[1] in _MOVED:
            top = name.split("/")[1]
            if any(v[0] == top for v in variables) or (revision < 3 and top == "num_heads"):
                continue                                # once, at the top (both sides equal)
            name = top
        variables.append((name, kind, shape, raw[off:off + n]))
    # config.json -> variables (strings as int8 bytes, flags as int8 scalars)
    for key in ("unk_token", "bos_token", "eos_token"):
        b = cfg[key].encode("utf-8")
        variables.append((key, "int8", (len(b),), b))
    flags = {"with_source_bos": cfg.get("add_source_bos", False),
             "with_source_eos": cfg.get("add_source_eos", False),
             "with_target_bos": cfg.get("decoder_start_token") == cfg["bos_token"],
             "user_decoder_start_tokens": cfg.get("decoder_start_token") is None}
    for key, value in flags.items():
        variables.append((key, "int8", (), struct.pack("b", int(value))))
    if version < 3:                                     # no aliases: each its own copy
        for alias, target in aliases.items():
            if bare and "position_encodings" in alias:
                continue
            kind, shape, off, n = mb.variables[mb.resolve(target)]
            if bare and alias.startswith("encoder/embeddings_0/"):
                alias = alias.replace("embeddings_0", "embeddings")
            variables.append((alias, kind, shape, raw[off:off + n]))
        aliases = {}
    if bare:
        aliases = {a: (t.replace("embeddings_0", "embeddings") if t.startswith("encoder/") else t)
                   for a, t in aliases.items() if "position_encodings" not in a}
        aliases = {(a.replace("embeddings_0", "embeddings") if a.startswith("encoder/") else a): t
                   for a, t in aliases.items()}
    else:
        variables.append(("with_relative_position", "int8", (), b"\0"))
        variables.append(("layernorm_embedding", "int8", (), struct.pack(
            "b", int("encoder/layernorm_embedding/gamma" in mb.variables))))
    with open(os.path.join(dst, "model.bin"), "wb") as f:
        f.write(struct.pack("<I", version))
        _string(f, spec)
        f.write(struct.pack("<I", revision))
        f.write(struct.pack("<I", len(variables)))
        for name, kind, shape, data in variables:
            _string(f, name)
            f.write(struct.pack("<B", len(shape)))
            for d in shape:
                f.write(struct.pack("<I", d))
            item = np.dtype({"float32": "f4", "int8": "i1", "int16": "i2", "int32": "i4",
                             "float16": "f2", "bfloat16": "u2"}[kind]).itemsize
            if version >= 4:
                f.write(struct.pack("<BI", _TYPE_IDS[kind], len(data)))
            else:
                assert kind in ("float32", "int8", "int16"), kind
                f.write(struct.pack("<BI", item, len(data) // item))
            f.write(data)
        if version >= 3:
            f.write(struct.pack("<I", len(aliases)))
            for alias, target in aliases.items():
                _string(f, alias)
                _string(f, target)
    for name in ("shared_vocabulary", "source_vocabulary", "target_vocabulary"):
        tokens = read_vocabulary(src, name)
        if tokens is not None:
            with open(os.path.join(dst, name + ".txt"), "w", encoding="utf-8",
                      newline="\n") as f:
                f.write("".join(t + "\n" for t in tokens))
    return dst
