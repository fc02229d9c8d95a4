"""Generation settings: transformers' defaults, a checkpoint's generation config, their resolution.

Three sources, in this order of precedence (transformers' ``GenerationConfig``): the arguments
of ``generate``, the checkpoint's ``generation_config.json`` (or the generation fields of an old
``config.json``), then transformers' global defaults (:data:`GENERATION_DEFAULTS`). Every field a
checkpoint may carry is read, ignored (no effect on the tokens), or, when it would change the
tokens and is not implemented, a ValueError naming the file and the field.

The search reaches a model only through the decoder interface (:mod:`fastattn.generation.search`);
what it needs from the model here: ``generation_config`` (the checked checkpoint dict),
``vocab_size``, ``eos_id``, ``pad_id``, ``decoder_start_id`` and ``max_decoder_positions``.
"""
import os

import numpy as np

from .._validation import check_generation_setting
from ..io.huggingface import read_json

__all__ = ["GENERATION_DEFAULTS", "check_generation_config", "check_generation_ids",
           "read_generation_config", "resolve_settings", "single_id"]

# generation settings and transformers' global defaults for them (GenerationConfig
# ``_get_default_generation_params``): what applies when neither the user nor the checkpoint
# says otherwise
GENERATION_DEFAULTS = {
    "max_length": 20, "max_new_tokens": None, "min_length": 0, "min_new_tokens": None,
    "do_sample": False, "early_stopping": False, "num_beams": 1, "temperature": 1.0,
    "top_k": 50, "top_p": 1.0, "length_penalty": 1.0, "bad_words_ids": None,
    "forced_eos_token_id": None, "suppress_tokens": None, "renormalize_logits": False,
    "num_return_sequences": 1, "repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0, "forced_bos_token_id": None,
}
# generation fields we read (special ids are read too); any other field must keep its neutral value
_SPECIAL_IDS = ("eos_token_id", "pad_token_id", "decoder_start_token_id", "bos_token_id",
                "forced_eos_token_id", "forced_bos_token_id")
_GEN_READ = set(GENERATION_DEFAULTS) | set(_SPECIAL_IDS)
# fields with no effect on the tokens generated
GEN_IGNORED = {
    "_from_model_config", "transformers_version", "use_cache", "output_attentions",
    "output_hidden_states", "output_scores", "output_logits", "return_dict_in_generate",
    "cache_implementation", "cache_config", "return_legacy_cache", "is_assistant",
    "compile_config", "disable_compile", "trust_remote_code", "max_time", "stop_strings",
    "low_memory", "num_assistant_tokens", "num_assistant_tokens_schedule",
    "assistant_confidence_threshold", "assistant_lookbehind", "target_lookbehind",
    "prompt_lookup_num_tokens", "max_matching_ngram_size", "assistant_early_exit",
    "token_healing", "dola_layers", "generation_kwargs", "decoder_end_token_id",
}
# fields that change the tokens and are not implemented: only their neutral values are accepted
GEN_NEUTRAL = {
    "remove_invalid_values": (False, None), "exponential_decay_length_penalty": (None,),
    "begin_suppress_tokens": (None,), "typical_p": (1.0, None), "epsilon_cutoff": (0.0, None),
    "eta_cutoff": (0.0, None), "diversity_penalty": (0.0, None), "num_beam_groups": (1, None),
    "encoder_repetition_penalty": (1.0, None), "guidance_scale": (None, 1.0),
    "sequence_bias": (None,), "min_p": (None,), "top_h": (None,), "constraints": (None,),
    "force_words_ids": (None,), "penalty_alpha": (None,), "watermarking_config": (None,),
    "suppress_tokens_at_begin": (None,), "output_logits": (None, False),
}
GENERATION_FIELDS = _GEN_READ | set(GEN_IGNORED) | set(GEN_NEUTRAL)


def single_id(value, field, where):
    """A special token id from a config file: an int >= 0, None, or a one-element list of it."""
    if isinstance(value, list):
        if len(value) != 1:
            raise ValueError(f"{where}: {field}={value!r}: only one token id is supported")
        value = value[0]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}: {field} must be a non-negative integer, got {value!r}")
    return value


def check_generation_config(gen, where, *, ignored=(), neutral=None):
    """Validate a generation-settings dict (from JSON, or a model's ``generation_config=``
    argument); returns the fields we use. `ignored` / `neutral` (field -> its accepted values,
    the first named in the message): a model's own fields beside :data:`GEN_IGNORED` /
    :data:`GEN_NEUTRAL` (WhisperModel's)."""
    neutral = GEN_NEUTRAL if not neutral else {**GEN_NEUTRAL, **neutral}
    out = {}
    for key, value in gen.items():
        if key in GEN_IGNORED or key in ignored:
            continue
        if key in neutral:
            if value not in neutral[key]:
                raise ValueError(f"{where}: {key}={value!r} is not supported "
                                 f"(only {neutral[key][0]!r})")
            continue
        if key not in _GEN_READ:
            raise ValueError(f"{where}: unknown generation field {key!r}")
        if key in _SPECIAL_IDS:
            value = single_id(value, key, where)
        elif key in ("bad_words_ids", "suppress_tokens"):
            pass                    # lists of ids: checked against the vocabulary when used
        else:
            check_generation_setting(key, value, where)
        out[key] = value
    return out


def check_generation_ids(gen, vocab, where):
    """The special token ids of a checked generation config must be ids of the target
    vocabulary [0, vocab)."""
    for key in _SPECIAL_IDS:
        v = gen.get(key)
        if v is not None and not 0 <= v < vocab:
            raise ValueError(f"{where}: {key}={v!r} is not a token id of the target vocabulary "
                             f"[0, {vocab})")


def read_generation_config(path, legacy):
    """``path/generation_config.json`` when present, else the generation fields of config.json
    (``legacy``), as transformers does (``GenerationConfig.from_model_config``)."""
    where = os.path.join(path, "generation_config.json")
    if os.path.exists(where):
        return check_generation_config(read_json(where, os.path.basename(where), dict), where)
    return check_generation_config(legacy, os.path.join(path, "config.json"))


def resolve_settings(model, user, prefix_len=1):
    """Merge the arguments of generate (`user`), the checkpoint's generation config and
    transformers' defaults into one checked dict.

    `prefix_len` is the length of the decoder's forced prefix (1: the start token alone; P with
    ``decoder_input_ids``). As in transformers, ``max_length`` counts the whole decoder sequence
    (prefix included): ``max_new_tokens + prefix_len`` when max_new_tokens is given, else the
    checkpoint's ``max_length``, else ``20 + prefix_len`` capped by the model's positions;
    ``min_new_tokens`` likewise counts after the prefix. A ``max_length`` that leaves no room
    after the prefix is a ValueError (as transformers), except ``max_new_tokens=0``, which
    returns the prefix."""
    ckpt = model.generation_config
    p = {}
    for k, default in GENERATION_DEFAULTS.items():
        v = user.get(k)
        if v is None:
            v = ckpt.get(k)
        if v is None:
            v = default
        p[k] = v
    limit = model.max_decoder_positions
    # length: max_new_tokens (user, then checkpoint) > checkpoint max_length > 20 new tokens
    mnt = user.get("max_new_tokens")
    if mnt is None:
        mnt = ckpt.get("max_new_tokens")
    if mnt is not None:
        p["max_length"] = check_generation_setting("max_new_tokens", mnt) + prefix_len
    elif ckpt.get("max_length") is not None:
        p["max_length"] = check_generation_setting("max_length", ckpt["max_length"])
        if p["max_length"] <= prefix_len:
            raise ValueError(f"decoder_input_ids has {prefix_len} positions (the start token "
                             f"included), but the checkpoint's max_length is {p['max_length']}: "
                             "no room for new tokens; pass max_new_tokens")
    else:
        p["max_length"] = min(GENERATION_DEFAULTS["max_length"] + prefix_len, limit)
    if p["max_length"] > limit:
        what = "max_new_tokens / max_length" if prefix_len == 1 else \
            f"decoder_input_ids ({prefix_len} positions) + max_new_tokens / max_length"
        raise ValueError(f"{what} ask for {p['max_length']} decoder positions, more than "
                         f"max_position_embeddings={limit}")
    if p["max_length"] <= prefix_len and mnt is None:
        raise ValueError(f"decoder_input_ids has {prefix_len} positions (the start token "
                         f"included), more than max_position_embeddings={limit} allows before "
                         "a new token")
    mn = user.get("min_new_tokens")
    if mn is None:
        mn = ckpt.get("min_new_tokens")
    if mn is not None:
        p["min_length"] = check_generation_setting("min_new_tokens", mn) + prefix_len
    else:
        p["min_length"] = check_generation_setting("min_length", p["min_length"])
    for key in ("num_beams", "renormalize_logits", "early_stopping", "length_penalty",
                "do_sample", "temperature", "top_p", "top_k", "repetition_penalty",
                "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
                "num_return_sequences"):
        p[key] = check_generation_setting(key, p[key])
    if p["num_beams"] > 1 and model.vocab_size < 2:
        raise ValueError(f"num_beams={p['num_beams']} needs a target vocabulary of at least 2 "
                         f"tokens, this model has {model.vocab_size}")
    # transformers' GenerationConfig.validate
    nrs = p["num_return_sequences"]
    if nrs > 1 and p["num_beams"] == 1 and not p["do_sample"]:
        raise ValueError(f"num_return_sequences={nrs}: greedy decoding (do_sample=False, "
                         "num_beams=1) returns one sequence per source; use num_beams >= "
                         "num_return_sequences or do_sample=True")
    if p["num_beams"] > 1 and nrs > p["num_beams"]:
        raise ValueError(f"num_return_sequences={nrs} must be <= num_beams={p['num_beams']} "
                         "(beam search returns its best finished hypotheses)")
    fb = p["forced_bos_token_id"]
    if fb is not None and (isinstance(fb, (bool, np.bool_)) or not isinstance(fb, (int, np.integer))
                           or not 0 <= fb < model.vocab_size):
        raise ValueError(f"forced_bos_token_id must be a token id in [0, {model.vocab_size}), "
                         f"got {fb!r}")
    for key, own in (("eos_token_id", model.eos_id), ("pad_token_id", model.pad_id)):
        p[key] = ckpt.get(key, own)
        if p[key] is None:
            p[key] = own
    p["decoder_start_token_id"] = model.decoder_start_id
    return p
