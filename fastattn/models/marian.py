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

import numpy as np

from ..io.huggingface import read_json as _read_json

__all__ = ["read_config", "read_generation_config", "read_weights", "GENERATION_DEFAULTS"]

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

# generation settings and transformers' global defaults for them (GenerationConfig
# ``_get_default_generation_params``): what applies when neither the user nor the checkpoint
# says otherwise
GENERATION_DEFAULTS = {
    "max_length": 20, "max_new_tokens": None, "min_length": 0, "min_new_tokens": None,
    "do_sample": False, "early_stopping": False, "num_beams": 1, "temperature": 1.0,
    "top_k": 50, "top_p": 1.0, "length_penalty": 1.0, "bad_words_ids": None,
    "forced_eos_token_id": None, "suppress_tokens": None, "renormalize_logits": False,
    "num_return_sequences": 1,
}
# generation fields we read (special ids are read too); any other field must keep its neutral value
_GEN_READ = set(GENERATION_DEFAULTS) | {
    "decoder_start_token_id", "eos_token_id", "pad_token_id", "bos_token_id"}
_GEN_IGNORED = {
    "_from_model_config", "transformers_version", "use_cache", "output_attentions",
    "output_hidden_states", "output_scores", "output_logits", "return_dict_in_generate",
    "cache_implementation", "cache_config", "return_legacy_cache", "is_assistant",
    "compile_config", "disable_compile", "trust_remote_code", "max_time", "stop_strings",
    "low_memory", "num_assistant_tokens", "num_assistant_tokens_schedule",
    "assistant_confidence_threshold", "assistant_lookbehind", "target_lookbehind",
    "prompt_lookup_num_tokens", "max_matching_ngram_size", "assistant_early_exit",
    "token_healing", "dola_layers", "generation_kwargs", "decoder_end_token_id",
}
_GEN_NEUTRAL = {
    "repetition_penalty": (1.0, None), "no_repeat_ngram_size": (0, None),
    "encoder_no_repeat_ngram_size": (0, None), "forced_bos_token_id": (None,),
    "remove_invalid_values": (False, None), "exponential_decay_length_penalty": (None,),
    "begin_suppress_tokens": (None,), "typical_p": (1.0, None), "epsilon_cutoff": (0.0, None),
    "eta_cutoff": (0.0, None), "diversity_penalty": (0.0, None), "num_beam_groups": (1, None),
    "encoder_repetition_penalty": (1.0, None), "guidance_scale": (None, 1.0),
    "sequence_bias": (None,), "min_p": (None,), "top_h": (None,), "constraints": (None,),
    "force_words_ids": (None,), "penalty_alpha": (None,), "watermarking_config": (None,),
    "suppress_tokens_at_begin": (None,), "output_logits": (None, False),
}


def _single_id(value, field, where):
    if isinstance(value, list):
        if len(value) != 1:
            raise ValueError(f"{where}: {field}={value!r}: only one token id is supported")
        value = value[0]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}: {field} must be a non-negative integer, got {value!r}")
    return value


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
        if key in _GEN_READ or key in _GEN_NEUTRAL or key in _GEN_IGNORED:
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
        "pad_token_id": _single_id(cfg["pad_token_id"], "pad_token_id", where),
        "eos_token_id": _single_id(cfg["eos_token_id"], "eos_token_id", where),
        "decoder_start_token_id": _single_id(cfg["decoder_start_token_id"],
                                             "decoder_start_token_id", where),
        "normalize_before": False,
        "positions": "marian",
        "layer_norm_eps": 1e-5,
    }
    fe = cfg["forced_eos_token_id"]
    if "forced_eos_token_id" in raw:
        legacy_gen["forced_eos_token_id"] = fe
    return out, legacy_gen


def check_generation_config(gen, where):
    """Validate a generation-settings dict (from JSON); returns the fields we use."""
    out = {}
    for key, value in gen.items():
        if key in _GEN_IGNORED:
            continue
        if key in _GEN_NEUTRAL:
            if value not in _GEN_NEUTRAL[key]:
                raise ValueError(f"{where}: {key}={value!r} is not supported "
                                 f"(only {_GEN_NEUTRAL[key][0]!r})")
            continue
        if key not in _GEN_READ:
            raise ValueError(f"{where}: unknown generation field {key!r}")
        if key in ("eos_token_id", "pad_token_id", "decoder_start_token_id", "bos_token_id",
                   "forced_eos_token_id"):
            value = _single_id(value, key, where)
        elif key == "num_return_sequences" and value not in (None, 1):
            raise ValueError(f"{where}: num_return_sequences={value!r} is not supported (only 1)")
        elif value is not None:
            _check_setting_type(key, value, where)
        out[key] = value
    return out


_INT_SETTINGS = {"max_length": 1, "max_new_tokens": 0, "min_length": 0, "min_new_tokens": 0,
                 "num_beams": 1, "top_k": 0}


def _check_setting_type(key, value, where):
    """The value range of one generation setting (the same rules generate() applies to its
    arguments), so that a bad file is named when it is read."""
    def bad(what):
        raise ValueError(f"{where}: {key}={value!r} must be {what}")
    is_bool = isinstance(value, (bool, np.bool_))
    is_int = isinstance(value, (int, np.integer)) and not is_bool
    is_num = (is_int or isinstance(value, (float, np.floating))) and not is_bool
    if key in _INT_SETTINGS:
        if not is_int or value < _INT_SETTINGS[key]:
            bad(f"an integer >= {_INT_SETTINGS[key]}")
    elif key in ("do_sample", "renormalize_logits"):
        if not is_bool:
            bad("true or false")
    elif key == "early_stopping":
        if not (is_bool or (isinstance(value, str) and value == "never")):
            bad('true, false or "never"')
    elif key == "temperature":
        if not is_num or not 0 < value < float("inf"):
            bad("a positive number")
    elif key == "top_p":
        if not is_num or not 0 <= value <= 1:
            bad("a number in [0, 1]")
    elif key == "length_penalty":
        if not is_num or value != value or value in (float("inf"), float("-inf")):
            bad("a finite number")


def check_generation_ids(gen, config, where):
    """The special token ids of a checked generation config must be ids of the target
    vocabulary (config: the model's keywords, with decoder_vocab_size)."""
    vocab = config.get("decoder_vocab_size") or config["vocab_size"]
    for key in ("eos_token_id", "pad_token_id", "decoder_start_token_id", "bos_token_id",
                "forced_eos_token_id"):
        v = gen.get(key)
        if v is not None and not 0 <= v < vocab:
            raise ValueError(f"{where}: {key}={v!r} is not a token id of the target vocabulary "
                             f"[0, {vocab})")


def read_generation_config(path, legacy):
    """``path/generation_config.json`` when present, else the generation fields of config.json
    (``legacy``), as transformers does (``GenerationConfig.from_model_config``)."""
    where = os.path.join(path, "generation_config.json")
    if os.path.exists(where):
        return check_generation_config(_read_json(where, os.path.basename(where), dict), where)
    return check_generation_config(legacy, os.path.join(path, "config.json"))


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
    try:
        import safetensors  # noqa: F401
    except ImportError as exc:      # pragma: no cover - depends on the installation
        raise ImportError("reading Marian checkpoints needs the 'safetensors' package") from exc
    from .bert import _read_tensors
    return _read_tensors([st])      # BF16 widened to float32; a damaged file is a ValueError


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
