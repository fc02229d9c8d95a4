"""Helpers for the encoder tests: random checkpoints and sentence-transformers folders.

Two writers: `write_hf` saves a transformers model (BertModel, RobertaModel, ...) with every
weight randomised, `write_numpy_bert` writes a BERT folder with NumPy + safetensors alone (for
the tests that must not need transformers).
"""
import json
import os

import numpy as np


def randomise(model, seed=0):
    """Every parameter ~ unit-ish variance (LayerNorm weights around 1), so errors show."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
            if p.ndim == 1 and ("LayerNorm" in name or "layer_norm" in name) and \
                    name.endswith("weight"):
                p.copy_(1.0 + 0.3 * noise)
            elif p.ndim == 1:
                p.copy_(0.3 * noise)
            elif "embeddings" in name:
                p.copy_(noise)
            else:
                # keep pre-activations O(1): std 1/sqrt(fan_in) * 1.5
                p.copy_(noise * (1.5 / p.shape[1] ** 0.5))
    return model


def write_hf(folder, model_cls, config, dtype="float32", seed=0):
    """Save `model_cls(config)` with random weights to `folder`; returns the eval()'d model."""
    import torch
    model = model_cls(config).eval()
    randomise(model, seed)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(folder)
    return model


def hf_hidden(model, ids, mask=None, token_type_ids=None):
    """transformers' last hidden state as a NumPy array."""
    import torch
    kw = {"input_ids": torch.as_tensor(ids)}
    if mask is not None:
        kw["attention_mask"] = torch.as_tensor(mask)
    if token_type_ids is not None:
        kw["token_type_ids"] = torch.as_tensor(token_type_ids)
    with torch.no_grad():
        return model(**kw).last_hidden_state.numpy()


BERT_SMALL = dict(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=48, max_position_embeddings=24, type_vocab_size=2,
                  hidden_act="gelu", layer_norm_eps=1e-12, pad_token_id=0)


def write_numpy_bert(folder, seed=0, prefix="", dtype=np.float32, config_overrides=None,
                     drop=(), **cfg):
    """A BERT checkpoint written with NumPy + safetensors only (no torch). Returns config."""
    from safetensors.numpy import save_file
    c = dict(BERT_SMALL, **cfg)
    rng = np.random.default_rng(seed)
    H, I, L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    t = {}

    def put(name, shape, kind="w"):
        if kind == "ln":
            a = 1.0 + 0.3 * rng.standard_normal(shape)
        elif kind == "b":
            a = 0.3 * rng.standard_normal(shape)
        elif kind == "emb":
            a = rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape) * (1.5 / shape[1] ** 0.5)
        t[prefix + name] = a.astype(dtype)

    put("embeddings.word_embeddings.weight", (c["vocab_size"], H), "emb")
    put("embeddings.position_embeddings.weight", (c["max_position_embeddings"], H), "emb")
    put("embeddings.token_type_embeddings.weight", (c["type_vocab_size"], H), "emb")
    put("embeddings.LayerNorm.weight", (H,), "ln")
    put("embeddings.LayerNorm.bias", (H,), "b")
    for i in range(L):
        p = f"encoder.layer.{i}."
        for n in ("query", "key", "value"):
            put(p + f"attention.self.{n}.weight", (H, H))
            put(p + f"attention.self.{n}.bias", (H,), "b")
        put(p + "attention.output.dense.weight", (H, H))
        put(p + "attention.output.dense.bias", (H,), "b")
        put(p + "attention.output.LayerNorm.weight", (H,), "ln")
        put(p + "attention.output.LayerNorm.bias", (H,), "b")
        put(p + "intermediate.dense.weight", (I, H))
        put(p + "intermediate.dense.bias", (I,), "b")
        put(p + "output.dense.weight", (H, I))
        put(p + "output.dense.bias", (H,), "b")
        put(p + "output.LayerNorm.weight", (H,), "ln")
        put(p + "output.LayerNorm.bias", (H,), "b")
    for name in drop:
        del t[prefix + name]
    os.makedirs(folder, exist_ok=True)
    save_file(t, os.path.join(folder, "model.safetensors"))
    config = dict(c, model_type="bert", architectures=["BertModel"])
    config.update(config_overrides or {})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return config


def write_st_folder(root, pooling=("mean",), normalize=True, transformer_path="",
                    extra_flags=None, modules=None):
    """Add sentence-transformers files to `root` (whose transformer files are under
    `transformer_path`): modules.json, 1_Pooling/config.json, and 2_Normalize if asked."""
    with open(os.path.join(root, transformer_path, "config.json")) as f:
        cfg = json.load(f)
    hidden = cfg["dim"] if cfg.get("model_type") == "distilbert" else cfg["hidden_size"]
    flags = {
        "word_embedding_dimension": hidden,
        "pooling_mode_cls_token": "cls" in pooling,
        "pooling_mode_mean_tokens": "mean" in pooling,
        "pooling_mode_max_tokens": "max" in pooling,
        "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len" in pooling,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": False,
        "include_prompt": True,
    }
    flags.update(extra_flags or {})
    os.makedirs(os.path.join(root, "1_Pooling"), exist_ok=True)
    with open(os.path.join(root, "1_Pooling", "config.json"), "w") as f:
        json.dump(flags, f)
    if modules is None:
        modules = [{"idx": 0, "name": "0", "path": transformer_path,
                    "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling",
                    "type": "sentence_transformers.models.Pooling"}]
        if normalize:
            os.makedirs(os.path.join(root, "2_Normalize"), exist_ok=True)
            modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                            "type": "sentence_transformers.models.Normalize"})
    with open(os.path.join(root, "modules.json"), "w") as f:
        json.dump(modules, f)


def reference_pool(hidden, mask, modes, normalize):
    """Sentence-transformers pooling, written out row by row in float64.

    hidden (B, S, H); mask (B, S) of 0/1; modes in cls, max, mean, mean_sqrt_len order of
    concatenation. A row without tokens is all zeros.
    """
    hidden = np.asarray(hidden, dtype=np.float64)
    out = []
    for b in range(hidden.shape[0]):
        tokens = [hidden[b, s] for s in range(hidden.shape[1]) if mask[b, s]]
        parts = []
        for mode in modes:
            if not tokens:
                parts.append(np.zeros(hidden.shape[2]))
            elif mode == "cls":
                parts.append(hidden[b, 0])
            elif mode == "max":
                parts.append(np.max(np.stack(tokens), axis=0))
            elif mode == "mean":
                parts.append(sum(tokens) / len(tokens))
            elif mode == "mean_sqrt_len":
                parts.append(sum(tokens) / np.sqrt(len(tokens)))
        v = np.concatenate(parts)
        n = np.linalg.norm(v)
        if normalize and n > 0:
            v = v / n
        out.append(v)
    return np.array(out)


def padded_batch(rng, vocab, lengths, S, pad_id=0, low=3):
    """ids (B, S) with random tokens in [low, vocab) and pad_id after each row's length; mask."""
    B = len(lengths)
    ids = rng.integers(low, vocab, (B, S))
    mask = np.zeros((B, S), dtype=np.int64)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    ids[mask == 0] = pad_id
    return ids, mask
