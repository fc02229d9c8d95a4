"""Seq2SeqTransformer's keywords: the architecture (what a family's config reader gives, what a
saved folder stores) checked one by one and together, into the model's config dict."""
from .._validation import (check_choice, check_dtype, check_eps, check_int, check_option,
                           check_positive_int, check_real)
from ..io.huggingface import canonical_activation
from ..nn.positional import POSITION_LAYOUTS
from . import registry

__all__ = ["KEYWORDS", "POSITIONS", "check_keywords", "model_dtype"]

POSITIONS = POSITION_LAYOUTS + ("fairseq", "learned", "none")

#: the architecture keywords of Seq2SeqTransformer (its config), in its signature's order
KEYWORDS = (
    "vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
    "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "activation_function",
    "scale_embedding", "normalize_before", "positions", "max_position_embeddings",
    "share_encoder_decoder_embeddings", "tie_word_embeddings", "decoder_vocab_size",
    "pad_token_id", "eos_token_id", "decoder_start_token_id", "layer_norm_eps",
    "layernorm_embedding", "position_offset", "model_type", "norm", "bias", "head_dim",
    "attention_scale", "gated_ffn", "relative_attention_num_buckets",
    "relative_attention_max_distance", "output_scale", "final_logits_bias",
)


def model_dtype(dtype):
    """float32 or float64 (TypeError otherwise; None too, which np.dtype would read as
    float64)."""
    if dtype is None:
        raise TypeError("dtype must be float32 or float64, got None")
    return check_dtype(dtype)


def _count(v, name):
    return check_int(v, name, 0, what="a non-negative integer")


def _id(v, name, vocab):
    return check_int(v, name, 0, vocab, f"a token id in [0, {vocab})")


def _optional(v, check, name):
    return None if v is None else check(v, name)


def check_keywords(kw):
    """The keywords `kw` (a dict of :data:`KEYWORDS`) checked -> (the model's config dict, the
    family of its model_type). ValueError / TypeError naming the keyword."""
    pos_int = check_positive_int
    V = pos_int(kw["vocab_size"], "vocab_size")
    shared = check_option(kw["share_encoder_decoder_embeddings"],
                          "share_encoder_decoder_embeddings")
    Vt = V if (shared or kw["decoder_vocab_size"] is None) else \
        pos_int(kw["decoder_vocab_size"], "decoder_vocab_size")
    d = pos_int(kw["d_model"], "d_model")
    cfg = {"vocab_size": V, "decoder_vocab_size": Vt, "d_model": d}
    for k in ("encoder_layers", "decoder_layers", "encoder_attention_heads",
              "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim"):
        cfg[k] = pos_int(kw[k], k)
    cfg.update({
        "activation_function": kw["activation_function"],
        "scale_embedding": check_option(kw["scale_embedding"], "scale_embedding"),
        "normalize_before": check_option(kw["normalize_before"], "normalize_before"),
        "positions": kw["positions"],
        "max_position_embeddings": pos_int(kw["max_position_embeddings"],
                                           "max_position_embeddings"),
        "share_encoder_decoder_embeddings": shared,
        "tie_word_embeddings": check_option(kw["tie_word_embeddings"], "tie_word_embeddings"),
        "layer_norm_eps": check_eps(kw["layer_norm_eps"], "layer_norm_eps"),
        "layernorm_embedding": check_option(kw["layernorm_embedding"], "layernorm_embedding"),
        "position_offset": _count(kw["position_offset"], "position_offset"),
        "model_type": kw["model_type"],
        "norm": check_choice(kw["norm"], "norm", ("layer", "rms")),
        "bias": check_option(kw["bias"], "bias"),
        "head_dim": _optional(kw["head_dim"], pos_int, "head_dim"),
        "attention_scale": _optional(kw["attention_scale"], check_real, "attention_scale"),
        "gated_ffn": check_option(kw["gated_ffn"], "gated_ffn"),
        "relative_attention_num_buckets": _optional(kw["relative_attention_num_buckets"],
                                                    pos_int, "relative_attention_num_buckets"),
        "relative_attention_max_distance": _optional(kw["relative_attention_max_distance"],
                                                     pos_int, "relative_attention_max_distance"),
        "output_scale": check_real(kw["output_scale"], "output_scale"),
        "final_logits_bias": check_option(kw["final_logits_bias"], "final_logits_bias"),
    })
    if (cfg["relative_attention_num_buckets"] is None) != (
            cfg["relative_attention_max_distance"] is None):
        raise ValueError("relative_attention_num_buckets and relative_attention_max_distance "
                         "go together (T5's position bias)")
    if cfg["norm"] == "rms" and not cfg["normalize_before"]:
        raise ValueError("norm='rms' needs normalize_before=True")
    family = registry.family(cfg["model_type"], "seq2seq")
    if family is None:
        raise ValueError(f"model_type must be one of {sorted(registry.model_types('seq2seq'))}, "
                         f"got {cfg['model_type']!r} (it selects the checkpoint's names)"
                         f"{registry.other_kind_hint(cfg['model_type'])}")
    canonical_activation(cfg["activation_function"], "activation_function")
    if cfg["positions"] not in POSITIONS:
        raise ValueError(f"positions must be one of {POSITIONS}, got {cfg['positions']!r}")
    for which in ("encoder", "decoder"):
        h = cfg[f"{which}_attention_heads"]
        if d % h and cfg["head_dim"] is None:
            raise ValueError(f"d_model={d} is not divisible by {which}_attention_heads={h}")
    pad = kw["pad_token_id"]
    pad = Vt - 1 if pad is None else _id(pad, "pad_token_id", min(V, Vt))
    cfg["pad_token_id"] = pad
    cfg["eos_token_id"] = _id(kw["eos_token_id"], "eos_token_id", Vt)
    start = kw["decoder_start_token_id"]
    cfg["decoder_start_token_id"] = pad if start is None else \
        _id(start, "decoder_start_token_id", Vt)
    return cfg, family
