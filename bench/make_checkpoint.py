"""Write a random Hugging Face checkpoint of a published model's shape, of any size, in bounded
memory: the tensors are drawn and written one block at a time (never the whole model in
memory), as float32, float16 or bfloat16, in one file or in shards with an index, as
transformers' save_pretrained lays them out (the same names and config.json; tied copies not
saved). No download: the weights are random at unit scale (matrices N(0, 1/fan_in), LayerNorm
weights 1 + N(0, 0.09), biases N(0, 0.04), token embeddings N(0, 0.01/d_model), 0.1 once
scaled by sqrt(d_model): the layers, not the tied table, steer the output), so that greedy
decoding varies.

    python bench/make_checkpoint.py OUT --shape nllb-200-1.3b [--dtype bfloat16] [--shard-size 2GB]

Shapes: m2m100-418m, nllb-200-1.3b, nllb-200-3.3b, marian-base, tiny (a test size). The config
is written through transformers' config class (transformers needed, torch not).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

SHAPES = {
    # M2M100 / NLLB-200 (model_type m2m_100): the published configs' sizes
    "m2m100-418m": dict(model_type="m2m_100", d_model=1024, encoder_layers=12, decoder_layers=12,
                        encoder_attention_heads=16, decoder_attention_heads=16,
                        encoder_ffn_dim=4096, decoder_ffn_dim=4096, vocab_size=128112,
                        max_position_embeddings=1024),
    "nllb-200-1.3b": dict(model_type="m2m_100", d_model=1024, encoder_layers=24,
                          decoder_layers=24, encoder_attention_heads=16,
                          decoder_attention_heads=16, encoder_ffn_dim=8192, decoder_ffn_dim=8192,
                          vocab_size=256206, max_position_embeddings=1024),
    "nllb-200-3.3b": dict(model_type="m2m_100", d_model=2048, encoder_layers=24,
                          decoder_layers=24, encoder_attention_heads=16,
                          decoder_attention_heads=16, encoder_ffn_dim=8192, decoder_ffn_dim=8192,
                          vocab_size=256206, max_position_embeddings=1024),
    "tiny": dict(model_type="m2m_100", d_model=64, encoder_layers=2, decoder_layers=2,
                 encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                 decoder_ffn_dim=128, vocab_size=1000, max_position_embeddings=128),
}
IDS = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
_CODES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_BLOCK = 1 << 24                     # values drawn and written at a time


def tensors(c):
    """[(name, shape, kind)] in transformers' order for an M2M100-layout model (tied head)."""
    d = c["d_model"]
    out = [("model.shared.weight", (c["vocab_size"], d), "embed")]
    for which in ("encoder", "decoder"):
        f = c[f"{which}_ffn_dim"]
        for i in range(c[f"{which}_layers"]):
            p = f"model.{which}.layers.{i}."
            blocks = ["self_attn"] + (["encoder_attn"] if which == "decoder" else [])
            for b in blocks:
                for proj in ("k_proj", "v_proj", "q_proj", "out_proj"):
                    out += [(f"{p}{b}.{proj}.weight", (d, d), "matrix"),
                            (f"{p}{b}.{proj}.bias", (d,), "bias")]
                out += [(f"{p}{b}_layer_norm.weight", (d,), "norm"),
                        (f"{p}{b}_layer_norm.bias", (d,), "bias")]
            out += [(f"{p}fc1.weight", (f, d), "matrix"), (f"{p}fc1.bias", (f,), "bias"),
                    (f"{p}fc2.weight", (d, f), "matrix"), (f"{p}fc2.bias", (d,), "bias"),
                    (f"{p}final_layer_norm.weight", (d,), "norm"),
                    (f"{p}final_layer_norm.bias", (d,), "bias")]
        out += [(f"model.{which}.layer_norm.weight", (d,), "norm"),
                (f"model.{which}.layer_norm.bias", (d,), "bias")]
    return out


def _encode(x, dtype):
    if dtype == "float32":
        return x.astype("<f4", copy=False)
    if dtype == "float16":
        return x.astype("<f2")
    u = x.astype(np.float32, copy=False).view(np.uint32)          # round to nearest even
    return ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype("<u2")


def _draw(rng, n, kind, fan_in):
    x = rng.standard_normal(n, dtype=np.float32)
    if kind == "matrix":
        x *= np.float32(1 / np.sqrt(fan_in))
    elif kind == "embed":       # 0.1 once scaled by sqrt(d_model): the layers steer the output
        x *= np.float32(0.1 / np.sqrt(fan_in))
    elif kind == "norm":
        x = 1 + np.float32(0.3) * x
    elif kind == "bias":
        x *= np.float32(0.2)
    return x


def write(out, shape="tiny", dtype="float32", shard_bytes=None, seed=0, progress=True):
    """Write the checkpoint folder `out`; returns the list of files written."""
    from transformers import AutoConfig
    c = SHAPES[shape]
    os.makedirs(out, exist_ok=True)
    cfg = AutoConfig.for_model(**c, **IDS, scale_embedding=True, activation_function="relu",
                               tie_word_embeddings=True)
    cfg.save_pretrained(out)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({k: IDS[k] for k in ("bos_token_id", "decoder_start_token_id", "eos_token_id",
                                       "pad_token_id")}, f, indent=2)
    item = 4 if dtype == "float32" else 2
    ts = tensors(c)
    shards, cur, size = [], [], 0
    for t in ts:
        nbytes = int(np.prod(t[1])) * item
        if cur and shard_bytes and size + nbytes > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(t)
        size += nbytes
    shards.append(cur)
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    rng = np.random.default_rng(seed)
    total = sum(int(np.prod(t[1])) for t in ts) * item
    done, t0 = 0, time.time()
    weight_map = {}
    for fname, shard in zip(names, shards):
        header, off = {}, 0
        for name, shp, _ in shard:
            n = int(np.prod(shp)) * item
            header[name] = {"dtype": _CODES[dtype], "shape": list(shp), "data_offsets": [off, off + n]}
            off += n
            weight_map[name] = fname
        header["__metadata__"] = {"format": "pt"}
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)
        path = os.path.join(out, fname)
        with open(path + ".tmp", "wb") as f:
            f.write(len(blob).to_bytes(8, "little"))
            f.write(blob)
            for name, shp, kind in shard:
                n = int(np.prod(shp))
                for a in range(0, n, _BLOCK):
                    x = _draw(rng, min(_BLOCK, n - a), kind, shp[-1])
                    f.write(_encode(x, dtype).tobytes())
                    done += x.size * item
                if progress:
                    print(f"\r{done / 2**30:6.2f} / {total / 2**30:.2f} GiB, "
                          f"{time.time() - t0:5.1f} s", end="", file=sys.stderr)
        os.replace(path + ".tmp", path)
    if len(shards) > 1:
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    if progress:
        print(file=sys.stderr)
    return [os.path.join(out, n) for n in names]


def _size(text):
    text = text.strip().upper()
    for unit, mult in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if text.endswith(unit):
            return int(float(text[:-len(unit)]) * mult)
    return int(text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--dtype", choices=sorted(_CODES), default="float32")
    ap.add_argument("--shard-size", type=_size, default=None,
                    help="largest shard, e.g. 2GB (default: one file)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    files = write(a.out, a.shape, a.dtype, a.shard_size, a.seed)
    print(f"wrote {len(files)} file(s) to {a.out}")


if __name__ == "__main__":
    main()
