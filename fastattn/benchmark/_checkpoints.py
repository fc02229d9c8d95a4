"""Random checkpoints the model benchmarks build locally (nothing is downloaded), written with
NumPy and safetensors only, as transformers writes them, so that every system (fastattn,
transformers, CTranslate2's converter, an ONNX export) reads the same weights:

- :func:`write_marian`: a Marian of the OPUS-MT base shape (d_model 512, 6 + 6 layers, 8 heads,
  FFN 2048, vocab 32000, tied embeddings, SiLU), matrices N(0, 1/fan_in) so activations stay at
  unit scale, LayerNorm weights 1 + N(0, 0.09), biases N(0, 0.04), embeddings N(0, 0.09), the pad
  row zero (CTranslate2 starts the decoder from zeros), final_logits_bias N(0, 1).
- :func:`write_marian_tokenizer`: source.spm / target.spm (one SentencePiece model trained here
  on made-up words) and a vocab.json of the model's size (the pieces, then filler entries), so
  that fastattn.Translator can read the folder as an OPUS-MT download.
- :func:`write_bert`: a BERT of the all-MiniLM-L6-v2 shape (6 layers, hidden 384, 12 heads,
  intermediate 1536, exact GELU, eps 1e-12).
- :func:`write_ct2_marian`, :func:`write_ct2_bert`: the CTranslate2 conversion of a folder
  written here (token names t<id>: the folders have no tokenizer).
"""
import io
import json
import os
import random

import numpy as np

__all__ = ["MARIAN_BASE", "MINILM", "write_marian", "write_marian_tokenizer", "write_bert",
           "write_ct2_marian", "write_ct2_bert", "synthetic_lines"]

MARIAN_BASE = dict(vocab_size=32000, d_model=512, layers=6, heads=8, ffn=2048,
                   max_position_embeddings=512)
MINILM = dict(vocab_size=30522, hidden=384, layers=6, heads=12, intermediate=1536,
              max_position_embeddings=512)
EOS = 0


def _save(path, tensors, config, generation=None):
    from safetensors.numpy import save_file
    os.makedirs(path, exist_ok=True)
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()},
              os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    if generation is not None:
        with open(os.path.join(path, "generation_config.json"), "w") as f:
            json.dump(generation, f, indent=1)


def _writers(t, rng, d, bias, gain):
    """lin(name, n_out, n_in), ln(name): random linear layers (N(0, 1/n_in) weights, N(0,
    bias^2) biases) and LayerNorms (1 + N(0, gain^2) weights) of width d, written into t."""
    def lin(name, n_out, n_in):
        t[f"{name}.weight"] = rng.standard_normal((n_out, n_in), np.float32) / np.sqrt(n_in)
        t[f"{name}.bias"] = bias * rng.standard_normal(n_out, np.float32)

    def ln(name):
        t[f"{name}.weight"] = 1.0 + gain * rng.standard_normal(d, np.float32)
        t[f"{name}.bias"] = bias * rng.standard_normal(d, np.float32)
    return lin, ln


def write_marian(path, seed=0, eos_bias=None, **shape):
    """A random Marian checkpoint of the base shape (keywords override MARIAN_BASE).
    eos_bias: added to EOS's final logits bias (random weights otherwise never end a line)."""
    s = dict(MARIAN_BASE, **shape)
    V, d, L, H, F = s["vocab_size"], s["d_model"], s["layers"], s["heads"], s["ffn"]
    pad = V - 1
    rng = np.random.default_rng(seed)
    t = {}
    lin, ln = _writers(t, rng, d, bias=0.2, gain=0.3)

    emb = 0.3 * rng.standard_normal((V, d), np.float32)
    emb[pad] = 0
    t["model.shared.weight"] = emb
    for side, n_att in (("encoder", ("self_attn",)), ("decoder", ("self_attn", "encoder_attn"))):
        for i in range(L):
            p = f"model.{side}.layers.{i}"
            for att in n_att:
                for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                    lin(f"{p}.{att}.{proj}", d, d)
                ln(f"{p}.{att}_layer_norm")
            lin(f"{p}.fc1", F, d)
            lin(f"{p}.fc2", d, F)
            ln(f"{p}.final_layer_norm")
    t["final_logits_bias"] = rng.standard_normal((1, V), np.float32)
    if eos_bias is not None:
        t["final_logits_bias"][0, EOS] += eos_bias
    config = {
        "model_type": "marian", "architectures": ["MarianMTModel"], "vocab_size": V,
        "decoder_vocab_size": V, "d_model": d, "encoder_layers": L, "decoder_layers": L,
        "encoder_attention_heads": H, "decoder_attention_heads": H, "encoder_ffn_dim": F,
        "decoder_ffn_dim": F, "max_position_embeddings": s["max_position_embeddings"],
        "activation_function": "swish", "scale_embedding": True,
        "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True,
        "pad_token_id": pad, "eos_token_id": EOS, "decoder_start_token_id": pad,
        "forced_eos_token_id": None, "dropout": 0.0, "attention_dropout": 0.0,
        "activation_dropout": 0.0, "init_std": 0.02, "is_encoder_decoder": True,
    }
    gen = {"decoder_start_token_id": pad, "eos_token_id": EOS, "pad_token_id": pad}
    _save(path, t, config, gen)
    return config


def synthetic_lines(n, seed=0, mean_words=14.0, max_words=120):
    """`n` lines of made-up words, their lengths log-normal (many short lines, a long tail), as
    in real corpora."""
    r = random.Random(seed)
    syll = ["ka", "to", "mi", "ren", "su", "la", "po", "ne", "gi", "ba", "dor", "vel", "ish",
            "an", "ku", "re", "so", "tha", "mo", "li"]
    words = ["".join(r.choice(syll) for _ in range(r.randint(1, 4))) for _ in range(2000)]
    sigma = 0.8
    mu = np.log(mean_words) - sigma ** 2 / 2
    out = []
    for _ in range(n):
        k = int(min(max_words, max(1, round(r.lognormvariate(mu, sigma)))))
        out.append(" ".join(r.choice(words) for _ in range(k)) + r.choice([".", "?", "", ","]))
    return out


def write_marian_tokenizer(path, vocab_size=None, pieces=2000, seed=0):
    """source.spm = target.spm (trained here on synthetic_lines) and a vocab.json of
    `vocab_size` entries (the model's; default: config.json's): </s> = 0, <unk> = 1, the pieces,
    fillers, <pad> last."""
    import sentencepiece as spm
    if vocab_size is None:
        with open(os.path.join(path, "config.json")) as f:
            vocab_size = json.load(f)["vocab_size"]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(synthetic_lines(20000, seed + 1)),
                                   model_writer=buf, vocab_size=pieces, model_type="unigram",
                                   minloglevel=2, hard_vocab_limit=False)
    proc = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    vocab = {"</s>": 0, "<unk>": 1}
    for i in range(proc.GetPieceSize()):
        if not (proc.IsControl(i) or proc.IsUnknown(i)):
            vocab.setdefault(proc.IdToPiece(i), len(vocab))
    i = 0
    while len(vocab) < vocab_size - 1:
        vocab.setdefault(f"<filler_{i}>", len(vocab))
        i += 1
    vocab["<pad>"] = len(vocab)
    for name in ("source.spm", "target.spm"):
        with open(os.path.join(path, name), "wb") as f:
            f.write(buf.getvalue())
    with open(os.path.join(path, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "MarianTokenizer", "model_max_length": 512,
                   "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
                   "separate_vocabs": False}, f, indent=1)
    return vocab


def write_bert(path, seed=0, **shape):
    """A random BERT checkpoint of the all-MiniLM-L6-v2 shape (keywords override MINILM)."""
    s = dict(MINILM, **shape)
    V, H, L, I = s["vocab_size"], s["hidden"], s["layers"], s["intermediate"]
    rng = np.random.default_rng(seed)
    t = {}
    lin, ln = _writers(t, rng, H, bias=0.02, gain=0.1)

    t["embeddings.word_embeddings.weight"] = 0.5 * rng.standard_normal((V, H), np.float32)
    t["embeddings.position_embeddings.weight"] = 0.1 * rng.standard_normal(
        (s["max_position_embeddings"], H), np.float32)
    t["embeddings.token_type_embeddings.weight"] = 0.1 * rng.standard_normal((2, H), np.float32)
    ln("embeddings.LayerNorm")
    for i in range(L):
        p = f"encoder.layer.{i}"
        for proj in ("query", "key", "value"):
            lin(f"{p}.attention.self.{proj}", H, H)
        lin(f"{p}.attention.output.dense", H, H)
        ln(f"{p}.attention.output.LayerNorm")
        lin(f"{p}.intermediate.dense", I, H)
        lin(f"{p}.output.dense", H, I)
        ln(f"{p}.output.LayerNorm")
    config = {"model_type": "bert", "architectures": ["BertModel"], "vocab_size": V,
              "hidden_size": H, "num_hidden_layers": L, "num_attention_heads": s["heads"],
              "intermediate_size": I, "hidden_act": "gelu", "layer_norm_eps": 1e-12,
              "max_position_embeddings": s["max_position_embeddings"], "type_vocab_size": 2,
              "pad_token_id": 0, "position_embedding_type": "absolute",
              "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    _save(path, t, config)
    return config


def _ct2_convert(hf_path, out_path, names):
    """CTranslate2's TransformersConverter on a folder without a tokenizer: the vocabulary it
    asks the tokenizer for is made of token names t<id> (`names` maps the special ones)."""
    import ctranslate2
    with open(os.path.join(hf_path, "config.json")) as f:
        V = json.load(f)["vocab_size"]

    class _Vocab:
        """The converter reads special tokens and the vocabulary from a tokenizer."""
        eos_token, unk_token = names.get(0, "t0"), "t1"

        def get_vocab(self):
            v = {f"t{i}": i for i in range(V)}
            for i, name in names.items():
                del v[f"t{i}"]
                v[name] = i
            return v

    class _Converter(ctranslate2.converters.TransformersConverter):
        def load_tokenizer(self, *args, **kwargs):
            return _Vocab()

    _Converter(hf_path).convert(out_path, force=True)


def write_ct2_marian(hf_path, out_path):
    """CTranslate2's conversion of a Marian folder written by write_marian (tokens t<id>, the
    last one <pad>)."""
    with open(os.path.join(hf_path, "config.json")) as f:
        V = json.load(f)["vocab_size"]
    _ct2_convert(hf_path, out_path, {V - 1: "<pad>"})


def write_ct2_bert(hf_path, out_path):
    """CTranslate2's conversion of a BERT folder written by write_bert (tokens t<id>); an
    Encoder of it takes token ids."""
    _ct2_convert(hf_path, out_path, {})
