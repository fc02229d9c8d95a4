"""A digest of fastattn's outputs for a fixed set of calls: a refactor must leave it unchanged.

    python bench/tools/output_digest.py                 # one sha256 per call, then the whole digest
    python bench/tools/output_digest.py --threads 1     # the same digest (bitwise across threads)
    python bench/tools/output_digest.py --int8          # the int8 part alone (INT8 line)

Two digests: ALL, the float calls (the same on one kernel set: it changes with FASTATTN_ISA and
the CPU), and INT8, the int8 models' calls, which is the same on every CPU and kernel set,
x86-64 and AArch64 alike (docs/int8.md; ci/test_aarch64.sh compares the two architectures).

Every call is deterministic (fixed seeds, random weights written here with NumPy and
safetensors only, no torch or transformers): the attention kernel (float32 / float64, causal,
masked, GQA), nn.Transformer, Marian-layout Seq2SeqTransformer (encode, logits, greedy, beam,
sampling) and the BERT / RoBERTa EncoderModel (hidden state, embed), float32 and
float64. The hashes cover the output bytes, shape and dtype.
"""
import argparse
import hashlib
import json
import os
import sys
import tempfile

import numpy as np

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(_ROOT, "tests", "models"))
# the checkout's fastattn (built in place), not an installed copy: `python bench/...` puts only
# bench/ on sys.path; FASTATTN_DIGEST_INSTALLED=1 measures the installed one instead
if not os.environ.get("FASTATTN_DIGEST_INSTALLED"):
    sys.path.insert(0, _ROOT)


def h(a):
    a = np.ascontiguousarray(a)
    m = hashlib.sha256()
    m.update(str((a.shape, a.dtype.str)).encode())
    m.update(a.tobytes())
    return m.hexdigest()[:16]


def kernel_calls(fa, n_threads):
    rng = np.random.default_rng(1)
    out = {}
    for dt in (np.float32, np.float64):
        q = rng.standard_normal((2, 4, 37, 48)).astype(dt)
        k = rng.standard_normal((2, 4, 53, 48)).astype(dt)
        v = rng.standard_normal((2, 4, 53, 40)).astype(dt)
        m = rng.random((2, 1, 37, 53)) > 0.2
        kq = rng.standard_normal((2, 2, 53, 48)).astype(dt)
        n = np.dtype(dt).name
        out[f"sdpa/{n}"] = fa.scaled_dot_product_attention(q, k, v, n_threads=n_threads)
        out[f"sdpa/{n}/causal"] = fa.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                  n_threads=n_threads)
        out[f"sdpa/{n}/mask"] = fa.scaled_dot_product_attention(q, k, v, m, n_threads=n_threads)
        out[f"sdpa/{n}/gqa"] = fa.scaled_dot_product_attention(q, kq, kq, enable_gqa=True,
                                                               n_threads=n_threads)
        x = rng.standard_normal((7, 33)).astype(dt)
        out[f"softmax/{n}"] = fa.softmax(x)
        w = rng.standard_normal((19, 33)).astype(dt)
        out[f"linear/{n}/gelu"] = fa.linear(x, w, w[:, 0], activation="gelu", n_threads=n_threads)
    return out


def transformer_calls(fa, n_threads):
    fa.set_num_threads(n_threads)
    out = {}
    for dt in (np.float32, np.float64):
        for norm_first in (False, True):
            model = fa.Transformer(d_model=64, nhead=4, num_encoder_layers=2, num_decoder_layers=2,
                                   dim_feedforward=96, norm_first=norm_first, activation="gelu",
                                   dtype=dt, seed=3)
            rng = np.random.default_rng(4)
            src = rng.standard_normal((3, 11, 64)).astype(dt)
            tgt = rng.standard_normal((3, 9, 64)).astype(dt)
            pad = np.zeros((3, 11), bool)
            pad[1, 7:] = True
            y = model(src, tgt, tgt_is_causal=True, src_key_padding_mask=pad,
                      memory_key_padding_mask=pad)
            out[f"transformer/{np.dtype(dt).name}/norm_first={norm_first}"] = y
    fa.set_num_threads(None)
    return out


def _random_seq2seq(fa, dt, **kw):
    cfg = dict(vocab_size=97, d_model=32, encoder_layers=2, decoder_layers=2,
               encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
               decoder_ffn_dim=48, max_position_embeddings=64, tie_word_embeddings=False,
               share_encoder_decoder_embeddings=True)
    quantize = kw.pop("quantize", None)
    cfg.update(kw)
    model = fa.Seq2SeqTransformer(**cfg, seed=5, dtype=dt)
    # unit-scale weights, so that decoding varies (a small init repeats one token)
    sd = model.state_dict()
    rng = np.random.default_rng(6)
    new = {}
    for name, w in sd.items():
        if name.endswith("layer_norm.weight"):
            new[name] = (1 + 0.2 * rng.standard_normal(w.shape)).astype(dt)
        elif name in ("lm_head.weight", "model.shared.weight") or "embed" in name:
            new[name] = rng.standard_normal(w.shape).astype(dt)
        elif w.ndim == 1 or name == "final_logits_bias":
            new[name] = (0.2 * rng.standard_normal(w.shape)).astype(dt)
        else:
            new[name] = (rng.standard_normal(w.shape) / np.sqrt(w.shape[-1]) * 1.5).astype(dt)
    return fa.Seq2SeqTransformer.from_state_dict(new, dtype=dt, quantize=quantize, **cfg)


def _seq2seq_model_calls(model, tag, n_threads, row1=True):
    """The digest's calls of one Seq2SeqTransformer: encode, logits, greedy, beam 4, sampling
    (and greedy on one padded row alone)."""
    rng = np.random.default_rng(7)
    ids = rng.integers(1, 95, size=(3, 10))
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    ids[1, 6:] = model.pad_id
    out = {f"{tag}/encode": model.encode(ids, mask, n_threads=n_threads)}
    dec = rng.integers(0, 95, size=(3, 8))
    out[f"{tag}/logits"] = model.logits(ids, dec, mask, n_threads=n_threads)
    out[f"{tag}/greedy"] = model.generate(ids, mask, max_new_tokens=12, num_beams=1,
                                          n_threads=n_threads)
    out[f"{tag}/beam4"] = model.generate(ids, mask, max_new_tokens=12, num_beams=4,
                                         n_threads=n_threads)
    out[f"{tag}/sample"] = model.generate(ids, mask, max_new_tokens=12, do_sample=True, top_k=20,
                                          top_p=0.9, temperature=0.8, seed=11,
                                          n_threads=n_threads)
    if row1:
        out[f"{tag}/greedy_row1"] = model.generate(ids[1:2], mask[1:2], max_new_tokens=12,
                                                   num_beams=1, n_threads=n_threads)
    return out


def seq2seq_calls(fa, n_threads):
    out = {}
    for dt in (np.float32, np.float64):
        for pre in (False, True):
            model = _random_seq2seq(fa, dt, normalize_before=pre,
                                    positions="marian" if pre else "learned")
            out.update(_seq2seq_model_calls(model, f"seq2seq/{np.dtype(dt).name}/pre={pre}",
                                            n_threads))
    return out


def encoder_calls(fa, n_threads, tmp):
    from encoder_checkpoints import write_numpy_bert
    fa.set_num_threads(n_threads)
    out = {}
    rng = np.random.default_rng(8)
    ids = rng.integers(2, 60, size=(3, 13))
    mask = np.ones_like(ids)
    mask[0, 9:] = 0
    ids[0, 9:] = 0
    for dt in (np.float32, np.float64):
        n = np.dtype(dt).name
        for model_type in ("bert", "roberta"):
            folder = os.path.join(tmp, f"{model_type}-{n}")
            if not os.path.exists(folder):
                write_numpy_bert(folder, seed=9, dtype=np.float32,
                                 config_overrides={"model_type": model_type}
                                 if model_type != "bert" else None)
            try:
                enc = fa.EncoderModel.from_pretrained(folder, dtype=dt)
            except (ValueError, TypeError) as exc:
                out[f"encoder/{model_type}/{n}/error"] = np.frombuffer(str(exc).encode(), np.uint8)
                continue
            out[f"encoder/{model_type}/{n}/hidden"] = enc(ids, attention_mask=mask)
            out[f"encoder/{model_type}/{n}/embed"] = enc.embed(ids, attention_mask=mask)
            out[f"encoder/{model_type}/{n}/embed_cls"] = enc.embed(ids, attention_mask=mask,
                                                                   pooling="cls", normalize=False)
    fa.set_num_threads(None)
    return out


def int8_calls(fa, n_threads, tmp):
    """The int8 part: linear layers (every epilogue), nn.Transformer, the Marian-layout
    Seq2SeqTransformer (encode, logits, greedy, beam, sampling), BERT / RoBERTa (hidden, embed)
    and a Whisper-layout model (encode, logits, greedy from fixed features), all quantize='int8':
    the same bits on every CPU."""
    from encoder_checkpoints import write_numpy_bert
    fa.set_num_threads(n_threads)
    out = {}
    rng = np.random.default_rng(21)
    for (M, K, N) in ((1, 33, 17), (7, 64, 200), (37, 300, 64), (100, 96, 130)):
        x = rng.standard_normal((M, K)).astype(np.float32)
        res = rng.standard_normal((M, N)).astype(np.float32)
        lin = fa.nn.Linear(K, N, seed=M + K, quantize="int8")
        norm = fa.nn.LayerNorm(N)
        norm.quantize_("int8")
        out[f"int8/linear/{M}x{K}x{N}"] = lin(x)
        out[f"int8/linear_ln/{M}x{K}x{N}"] = norm._forward(lin(x), res)
    for norm_first in (False, True):
        model = fa.Transformer(d_model=64, nhead=4, num_encoder_layers=2, num_decoder_layers=2,
                               dim_feedforward=96, norm_first=norm_first, activation="gelu",
                               seed=3)
        model.quantize_("int8")
        r2 = np.random.default_rng(4)
        src = r2.standard_normal((3, 11, 64)).astype(np.float32)
        tgt = r2.standard_normal((3, 9, 64)).astype(np.float32)
        pad = np.zeros((3, 11), bool)
        pad[1, 7:] = True
        out[f"int8/transformer/norm_first={norm_first}"] = model(
            src, tgt, tgt_is_causal=True, src_key_padding_mask=pad, memory_key_padding_mask=pad)
    for pre in (False, True):
        model = _random_seq2seq(fa, np.float32, quantize="int8", normalize_before=pre,
                                positions="marian" if pre else "learned")
        out.update(_seq2seq_model_calls(model, f"int8/seq2seq/pre={pre}", n_threads,
                                        row1=False))
    r2 = np.random.default_rng(8)
    ids = r2.integers(2, 60, size=(3, 13))
    mask = np.ones_like(ids)
    mask[0, 9:] = 0
    ids[0, 9:] = 0
    for model_type in ("bert", "roberta"):
        folder = os.path.join(tmp, f"int8-{model_type}")
        if not os.path.exists(folder):
            write_numpy_bert(folder, seed=9, dtype=np.float32,
                             config_overrides={"model_type": model_type}
                             if model_type != "bert" else None)
        enc = fa.EncoderModel.from_pretrained(folder, quantize="int8")
        out[f"int8/encoder/{model_type}/hidden"] = enc(ids, attention_mask=mask)
        out[f"int8/encoder/{model_type}/embed"] = enc.embed(ids, attention_mask=mask)
    wcfg = dict(vocab_size=120, num_mel_bins=16, d_model=64, encoder_layers=2,
                decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                encoder_ffn_dim=96, decoder_ffn_dim=96, max_source_positions=50,
                max_target_positions=32, pad_token_id=119, eos_token_id=119,
                decoder_start_token_id=1, tie_word_embeddings=False)
    wm = fa.WhisperModel(**wcfg, seed=5,
                         _state_dict=_unit_scale(fa.WhisperModel(**wcfg, seed=5).state_dict()),
                         quantize="int8")
    feats = r2.standard_normal((2, 16, 100)).astype(np.float32)
    out["int8/whisper/encode"] = wm.encode(feats, n_threads=n_threads)
    out["int8/whisper/logits"] = wm.logits(feats, r2.integers(0, 119, size=(2, 6)),
                                           n_threads=n_threads)
    fa.set_num_threads(None)
    return out


def _unit_scale(sd, seed=12):
    """Unit-scale weights (decoding that varies), as _random_seq2seq."""
    rng = np.random.default_rng(seed)
    new = {}
    for name, w in sd.items():
        if w.ndim == 1:
            new[name] = (1 + 0.2 * rng.standard_normal(w.shape)).astype(w.dtype) \
                if "layer_norm.weight" in name else (0.2 * rng.standard_normal(w.shape)).astype(w.dtype)
        else:
            new[name] = (rng.standard_normal(w.shape) / np.sqrt(w.shape[-1]) * 1.5).astype(w.dtype)
    return new


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="write the per-call hashes here")
    ap.add_argument("--int8", action="store_true", help="the int8 part (INT8) alone")
    args = ap.parse_args(argv)
    import fastattn as fa
    print(f"# fastattn from {os.path.dirname(fa.__file__)}")
    results, int8 = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        if not args.int8:
            for part in (kernel_calls(fa, args.threads), transformer_calls(fa, args.threads),
                         seq2seq_calls(fa, args.threads), encoder_calls(fa, args.threads, tmp)):
                results.update({k: h(v) for k, v in part.items()})
        int8 = {k: h(v) for k, v in int8_calls(fa, args.threads, tmp).items()}
    for k in sorted(results) + sorted(int8):
        print(f"{results.get(k) or int8[k]}  {k}")
    if results:
        whole = hashlib.sha256(json.dumps(results, sort_keys=True).encode()).hexdigest()[:16]
        print(f"{whole}  ALL ({len(results)} calls)")
    whole8 = hashlib.sha256(json.dumps(int8, sort_keys=True).encode()).hexdigest()[:16]
    print(f"{whole8}  INT8 ({len(int8)} calls)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**results, **int8}, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
