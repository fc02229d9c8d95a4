"""Hugging Face Marian checkpoints: config.json + generation_config.json + model.safetensors.

Reads a local directory as ``transformers`` writes it (``MarianMTModel.save_pretrained``) without
importing torch or transformers: the config files are JSON, the weights are read with the
``safetensors`` package's NumPy API. Everything the model math depends on is checked; a value we
do not implement is a ``ValueError`` naming the field, never a silent difference.

Marian against the vanilla Transformer (what ``modeling_marian.py`` computes):
- post-norm layers (``LN(x + sublayer(x))``), no final layer norm, no embedding layer norm;
- token embeddings times sqrt(d_model) when ``scale_embedding``;
- sinusoidal positions with the sines in the first half of the vector and the cosines in the
  second (not interleaved), rounded to float32 whatever the model dtype (transformers builds the
  table with ``torch.FloatTensor``);
- logits = decoder output @ lm_head.T + ``final_logits_bias``;
- decoding starts from ``decoder_start_token_id`` (= the pad id); ``forced_eos_token_id`` and
  ``bad_words_ids = [[pad]]`` usually come with the checkpoint's generation config.
"""
import os
import warnings

import numpy as np

from ..generation.config import GENERATION_FIELDS, single_id
from ..io.huggingface import read_json as _read_json
from ..io.huggingface import read_safetensors

__all__ = ["read_config", "read_weights", "marian_state_dict", "name_map", "untie_differing_copies"]

# config.json fields with no effect on inference (training knobs, bookkeeping)
_IGNORED = {
    "_name_or_path", "architectures", "transformers_version", "dtype", "torch_dtype", "dropout",
    "attention_dropout", "activation_dropout", "encoder_layerdrop", "decoder_layerdrop",
    "init_std", "use_cache", "id2label", "label2id", "num_labels", "classif_dropout",
    "classifier_dropout", "num_hidden_layers", "gradient_checkpointing", "bos_token_id",
    "output_attentions", "output_hidden_states", "return_dict", "problem_type",
    "tokenizer_class", "prefix", "task_specific_params", "chunk_size_feed_forward",
    "pruned_heads", "torchscript", "output_scores", "return_dict_in_generate",
    "extra_pos_embeddings", "is_encoder_decoder", "tf_legacy_loss", "use_bfloat16",
    "finetuning_task", "sep_token_id", "cross_attention_hidden_size", "model_type",
    "add_cross_attention", "tie_encoder_decoder", "_attn_implementation_autoset",
    "_commit_hash", "decoder_vocab_size",
}
# config.json fields that older transformers honoured and Marian checkpoints still carry: only
# the value Marian's math implies is supported
_FIXED = {
    "normalize_before": False, "normalize_embedding": False, "add_final_layer_norm": False,
    "static_position_embeddings": True, "add_bias_logits": False, "is_decoder": False,
}
# config.json fields that are the model's structure
_STRUCTURE = {
    "vocab_size": 58101, "d_model": 1024, "encoder_layers": 12, "decoder_layers": 12,
    "encoder_attention_heads": 16, "decoder_attention_heads": 16, "encoder_ffn_dim": 4096,
    "decoder_ffn_dim": 4096, "activation_function": "gelu", "scale_embedding": False,
    "max_position_embeddings": 1024, "share_encoder_decoder_embeddings": True,
    "tie_word_embeddings": True, "pad_token_id": 58100, "eos_token_id": 0,
    "decoder_start_token_id": 58100, "forced_eos_token_id": 0,
}

def read_config(path):
    """Parse ``path/config.json`` of a Marian checkpoint.

    Returns ``(config, legacy_generation)``: ``config`` is the keyword set of
    :class:`fastattn.Seq2SeqTransformer`, ``legacy_generation`` the generation settings found in
    config.json itself (used only when the folder has no generation_config.json).
    """
    where = os.path.join(path, "config.json")
    raw = _read_json(where, os.path.basename(where), dict)
    model_type = raw.get("model_type")
    if model_type != "marian":
        raise ValueError(f"{where}: model_type={model_type!r} is not supported (only 'marian')")
    legacy_gen = {}
    for key, value in raw.items():
        if key in _STRUCTURE or key in _IGNORED:
            continue
        if key in _FIXED:
            if value != _FIXED[key]:
                raise ValueError(f"{where}: {key}={value!r} is not supported (Marian models use "
                                 f"{key}={_FIXED[key]!r})")
            continue
        if key in GENERATION_FIELDS:
            legacy_gen[key] = value
            continue
        raise ValueError(f"{where}: unknown config field {key!r}")
    cfg = {k: raw.get(k, d) for k, d in _STRUCTURE.items()}
    for k in ("vocab_size", "d_model", "encoder_layers", "decoder_layers",
              "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim",
              "decoder_ffn_dim", "max_position_embeddings"):
        v = cfg[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{where}: {k} must be a positive integer, got {v!r}")
    for k in ("scale_embedding", "share_encoder_decoder_embeddings", "tie_word_embeddings"):
        if not isinstance(cfg[k], bool):
            raise ValueError(f"{where}: {k} must be true or false, got {cfg[k]!r}")
    dv = raw.get("decoder_vocab_size")
    if dv is not None and (isinstance(dv, bool) or not isinstance(dv, int) or dv < 1):
        raise ValueError(f"{where}: decoder_vocab_size must be a positive integer, got {dv!r}")
    out = {
        "vocab_size": cfg["vocab_size"],
        "decoder_vocab_size": cfg["vocab_size"] if cfg["share_encoder_decoder_embeddings"]
        else (dv or cfg["vocab_size"]),
        "d_model": cfg["d_model"],
        "encoder_layers": cfg["encoder_layers"],
        "decoder_layers": cfg["decoder_layers"],
        "encoder_attention_heads": cfg["encoder_attention_heads"],
        "decoder_attention_heads": cfg["decoder_attention_heads"],
        "encoder_ffn_dim": cfg["encoder_ffn_dim"],
        "decoder_ffn_dim": cfg["decoder_ffn_dim"],
        "activation_function": cfg["activation_function"],
        "scale_embedding": cfg["scale_embedding"],
        "max_position_embeddings": cfg["max_position_embeddings"],
        "share_encoder_decoder_embeddings": cfg["share_encoder_decoder_embeddings"],
        "tie_word_embeddings": cfg["tie_word_embeddings"],
        "pad_token_id": single_id(cfg["pad_token_id"], "pad_token_id", where),
        "eos_token_id": single_id(cfg["eos_token_id"], "eos_token_id", where),
        "decoder_start_token_id": single_id(cfg["decoder_start_token_id"],
                                             "decoder_start_token_id", where),
        "normalize_before": False,
        "positions": "marian",
        "layer_norm_eps": 1e-5,
    }
    fe = cfg["forced_eos_token_id"]
    if "forced_eos_token_id" in raw:
        legacy_gen["forced_eos_token_id"] = fe
    return out, legacy_gen


def read_weights(path):
    """The tensors of ``path/model.safetensors`` as a dict of NumPy arrays (HF Marian names)."""
    st = os.path.join(path, "model.safetensors")
    if not os.path.exists(st):
        if os.path.exists(os.path.join(path, "model.safetensors.index.json")):
            raise ValueError(f"{path}: sharded checkpoints (model.safetensors.index.json) are not "
                             "supported; save the model unsharded")
        for name in ("pytorch_model.bin", "tf_model.h5", "flax_model.msgpack"):
            if os.path.exists(os.path.join(path, name)):
                raise ValueError(f"{path} holds {name} but no model.safetensors: only safetensors "
                                 "checkpoints are read (re-save with safe_serialization=True)")
        raise FileNotFoundError(f"{st} does not exist")
    if not os.path.isfile(st):
        raise ValueError(f"{st} is not a file")
    return read_safetensors([st])      # BF16 widened to float32; a damaged file is a ValueError


def marian_state_dict(weights, config):
    """Map the tensors of a Marian checkpoint to the names Seq2SeqTransformer loads.

    Handles the tied / shared variants: with ``share_encoder_decoder_embeddings`` the token
    embeddings are ``model.shared.weight`` (encoder and decoder copies, when given, must agree:
    a ValueError otherwise; from_pretrained unties copies that differ, as transformers does);
    with ``tie_word_embeddings`` the output projection is the decoder embedding.
    """
    sd = {}
    skip = {"model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"}
    for k, v in weights.items():
        if k in skip:
            continue
        sd[k] = v
    shared = config["share_encoder_decoder_embeddings"]
    if shared:
        emb = sd.pop("model.shared.weight", None)
        enc = sd.pop("model.encoder.embed_tokens.weight", None)
        dec = sd.pop("model.decoder.embed_tokens.weight", None)
        ref_name = "model.shared.weight" if emb is not None else "model.encoder.embed_tokens.weight"
        for name, copy in (("model.encoder.embed_tokens.weight", enc),
                           ("model.decoder.embed_tokens.weight", dec)):
            ref = emb if emb is not None else enc
            if copy is not None and ref is not None and copy is not ref and (
                    copy.shape != ref.shape or not np.array_equal(copy, ref)):
                raise ValueError(f"{name} differs from {ref_name}: with "
                                 "share_encoder_decoder_embeddings the copies must agree (build "
                                 "with share_encoder_decoder_embeddings=False for separate ones)")
        emb = emb if emb is not None else (enc if enc is not None else dec)
        if emb is None:
            raise ValueError("model.safetensors has no token embedding (model.shared.weight)")
        sd["model.shared.weight"] = emb
    else:
        sd.pop("model.shared.weight", None)
    if config["tie_word_embeddings"]:
        sd.pop("lm_head.weight", None)
    if "final_logits_bias" not in sd:
        sd["final_logits_bias"] = np.zeros((1, config["decoder_vocab_size"]), np.float32)
    return sd


def name_map(c):
    """Hugging Face Marian parameter name -> (fastattn.nn name, rows, shape) for the model's
    keywords `c`: the names of :class:`fastattn.Seq2SeqTransformer`'s network
    (``encoder_embed``, ``decoder_embed``, ``encoder``, ``decoder``, ``lm_head``), rows ``(a, b)``
    of the nn parameter when the Hugging Face tensor is a block of it (q, k and v are one
    ``in_proj_weight``), and the Hugging Face shape (``final_logits_bias`` is (1, V)).

    The order is the one random initialisation draws in: the packed projections first, then
    every name in Hugging Face's order.
    """
    d, V, Vt = c["d_model"], c["vocab_size"], c["decoder_vocab_size"]
    qkv = ("q_proj", "k_proj", "v_proj")
    m = {}

    def proj(hf, nn, j):
        rows = (j * d, (j + 1) * d)
        m[f"{hf}.{qkv[j]}.weight"] = (f"{nn}.in_proj_weight", rows, (d, d))
        m[f"{hf}.{qkv[j]}.bias"] = (f"{nn}.in_proj_bias", rows, (d,))

    def put(hf, nn, shape):
        m.setdefault(hf, (nn, None, shape))

    stacks = ("encoder", "decoder")
    for which in stacks:                          # pass 1: the packed projections
        for i in range(c[f"{which}_layers"]):
            for j in range(3):
                proj(f"model.{which}.layers.{i}.self_attn", f"{which}.layers.{i}.self_attn", j)
            if which == "decoder":
                for j in (1, 2):
                    proj(f"model.decoder.layers.{i}.encoder_attn",
                         f"decoder.layers.{i}.multihead_attn", j)
    if c["share_encoder_decoder_embeddings"]:     # pass 2: everything, Hugging Face's order
        put("model.shared.weight", "encoder_embed.weight", (V, d))
    else:
        put("model.encoder.embed_tokens.weight", "encoder_embed.weight", (V, d))
        put("model.decoder.embed_tokens.weight", "decoder_embed.weight", (Vt, d))
    if not c["tie_word_embeddings"]:
        put("lm_head.weight", "lm_head.weight", (Vt, d))
    put("final_logits_bias", "lm_head.bias", (1, Vt))
    if c["positions"] == "learned":
        P = c["max_position_embeddings"]
        put("model.encoder.embed_positions.weight", "encoder_embed.position_weight", (P, d))
        put("model.decoder.embed_positions.weight", "decoder_embed.position_weight", (P, d))
    for which in stacks:
        f = c[f"{which}_ffn_dim"]
        blocks = [("self_attn", "self_attn", "norm1")]
        if which == "decoder":
            blocks.append(("encoder_attn", "multihead_attn", "norm2"))
        for i in range(c[f"{which}_layers"]):
            p, q = f"model.{which}.layers.{i}.", f"{which}.layers.{i}."
            for hf, nn, norm in blocks:
                for j in range(3):
                    if f"{p}{hf}.{qkv[j]}.weight" not in m:
                        proj(p + hf, q + nn, j)
                put(f"{p}{hf}.out_proj.weight", f"{q}{nn}.out_proj.weight", (d, d))
                put(f"{p}{hf}.out_proj.bias", f"{q}{nn}.out_proj.bias", (d,))
                put(f"{p}{hf}_layer_norm.weight", f"{q}{norm}.weight", (d,))
                put(f"{p}{hf}_layer_norm.bias", f"{q}{norm}.bias", (d,))
            put(f"{p}fc1.weight", f"{q}linear1.weight", (f, d))
            put(f"{p}fc1.bias", f"{q}linear1.bias", (f,))
            put(f"{p}fc2.weight", f"{q}linear2.weight", (d, f))
            put(f"{p}fc2.bias", f"{q}linear2.bias", (d,))
            last = "norm3" if which == "decoder" else "norm2"
            put(f"{p}final_layer_norm.weight", f"{q}{last}.weight", (d,))
            put(f"{p}final_layer_norm.bias", f"{q}{last}.bias", (d,))
        if c["normalize_before"]:
            put(f"model.{which}.layer_norm.weight", f"{which}.norm.weight", (d,))
            put(f"model.{which}.layer_norm.bias", f"{which}.norm.bias", (d,))
    return m


def untie_differing_copies(config, weights, path):
    """Read tied weights as transformers (>= 5) does: a saved copy of a tied tensor that differs
    from its source is not tied to it (transformers warns and keeps the copy). The sources:
    model.shared for the encoder / decoder embeddings (share_encoder_decoder_embeddings), the
    decoder embedding for lm_head (tie_word_embeddings). Without tie_word_embeddings nothing is
    tied and each saved copy is used as it is."""
    def differs(name, ref):
        w = weights.get(name)
        return w is not None and ref is not None and (w.shape != ref.shape
                                                      or not np.array_equal(w, ref))

    tie = config["tie_word_embeddings"]
    untied = []
    sh = weights.get("model.shared.weight")
    if config["share_encoder_decoder_embeddings"]:
        stacks = [w for w in ("encoder", "decoder") if differs(f"model.{w}.embed_tokens.weight", sh)]
        if stacks:
            untied += [f"model.{w}.embed_tokens.weight" for w in stacks]
            config["share_encoder_decoder_embeddings"] = False
            for w in ("encoder", "decoder"):
                weights.setdefault(f"model.{w}.embed_tokens.weight", sh)
            if tie:
                # the output projection stays tied to model.shared
                config["tie_word_embeddings"] = False
                weights.setdefault("lm_head.weight", sh)
        out_src = sh
    else:
        out_src = weights.get("model.decoder.embed_tokens.weight")
    if tie and config["tie_word_embeddings"] and differs("lm_head.weight", out_src):
        untied.append("lm_head.weight")
        config["tie_word_embeddings"] = False
    if tie and untied:
        warnings.warn(f"{path}: the saved {', '.join(untied)} differ from the tensors they are "
                      "tied to although tie_word_embeddings is true; each is used as saved (as "
                      "transformers loads them)", stacklevel=3)
