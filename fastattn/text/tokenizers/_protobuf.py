"""Reading a SentencePiece model file's protobuf (``ModelProto``) without the protobuf package:
only what :func:`~fastattn.text.tokenizers.spm_only.spm_tokenizer` needs that ``sentencepiece``
does not give, the normalization table."""

__all__ = ["precompiled_charsmap"]


def _varint(buf, i):
    out = shift = 0
    while True:
        if i >= len(buf):
            raise ValueError("truncated")
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return out, i


def _proto_field(buf, number):
    """The last length-delimited field `number` of a protobuf message (bytes), None if
    absent."""
    i, found = 0, None
    while i < len(buf):
        key, i = _varint(buf, i)
        wire = key & 7
        if wire == 0:
            _, i = _varint(buf, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            n, i = _varint(buf, i)
            if key >> 3 == number:
                found = buf[i:i + n]
            i += n
        else:
            raise ValueError(f"wire type {wire}")
        if i > len(buf):
            raise ValueError("truncated")
    return found


def precompiled_charsmap(blob):
    """NormalizerSpec.precompiled_charsmap (ModelProto field 3, its field 2) of a SentencePiece
    model, None when it has none."""
    spec = _proto_field(blob, 3)
    charsmap = _proto_field(spec, 2) if spec else None
    return bytes(charsmap) if charsmap else None
