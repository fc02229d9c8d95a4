"""The Whisper family (``model_type: whisper``; openai/whisper-tiny ... large-v3,
distil-whisper): config.json and generation_config.json read and checked, the checkpoint's names
mapped onto :class:`fastattn.WhisperModel`'s network (the family interface:
:mod:`fastattn.models.family`; kind ``"speech"``; registered in :mod:`fastattn.models.registry`).

Every config.json field that changes the numbers is read; an unknown one is a ValueError naming
it. Whisper's generation fields (lang_to_id, task_to_id, no_timestamps_token_id,
forced_decoder_ids, begin_suppress_tokens ...) are checked here; the long-form / fallback knobs
are accepted only at their neutral values.
"""
import os

from ..generation.config import (GENERATION_FIELDS, check_generation_config,
                                 check_generation_ids, single_id)
from ..generation.processors import _token_list
from ..io.huggingface import canonical_activation, read_json
from . import bart as _bart
from .family import Entry, Family

__all__ = ["WhisperFamily", "WHISPER", "FIXED", "check_whisper_generation", "read_generation",
           "check_alignment_heads"]

# WhisperConfig's defaults (transformers 5.x) for the fields that shape the network
DEFAULTS = {
    "vocab_size": 51865, "num_mel_bins": 80, "d_model": 384, "encoder_layers": 4,
    "decoder_layers": 4, "encoder_attention_heads": 6, "decoder_attention_heads": 6,
    "encoder_ffn_dim": 1536, "decoder_ffn_dim": 1536, "activation_function": "gelu",
    "max_source_positions": 1500, "max_target_positions": 448, "tie_word_embeddings": True,
    "pad_token_id": 50256, "bos_token_id": 50256, "eos_token_id": 50256,
    "decoder_start_token_id": 50257,
}
_POSITIVE = ("vocab_size", "num_mel_bins", "d_model", "encoder_layers", "decoder_layers",
             "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim",
             "decoder_ffn_dim", "max_source_positions", "max_target_positions")
# config.json fields with no effect here: training (SpecAugment, layer drop), the audio-
# classification head, token-level timestamps' filter, and scale_embedding (transformers'
# Whisper computes embed_scale but never applies it)
IGNORED = _bart.IGNORED | {
    "apply_spec_augment", "mask_time_prob", "mask_time_length", "mask_time_min_masks",
    "mask_feature_prob", "mask_feature_length", "mask_feature_min_masks", "median_filter_width",
    "use_weighted_layer_sum", "classifier_proj_size", "scale_embedding", "layerdrop",
}
# Whisper's generation fields (beside transformers' generic ones), and what each must be
_WHISPER_GEN = ("lang_to_id", "task_to_id", "is_multilingual", "no_timestamps_token_id",
                "prev_sot_token_id", "max_initial_timestamp_index", "return_timestamps",
                "forced_decoder_ids", "begin_suppress_tokens", "language", "task",
                "_detect_timestamp_from_logprob", "alignment_heads")
_WHISPER_GEN_IGNORED = ("return_token_timestamps", "median_filter_width")
# the long-form / fallback knobs: only their neutral values (they never act on one window
# decoded without temperature fallback)
_WHISPER_GEN_NEUTRAL = {"condition_on_prev_tokens": (None, False), "no_speech_threshold": (None,),
                        "logprob_threshold": (None,), "compression_ratio_threshold": (None,),
                        "prompt_condition_type": (None, "first-segment")}
# Seq2SeqTransformer's architecture keywords a Whisper always has (its inherited methods read
# them from the config)
FIXED = {"model_type": "whisper", "head_dim": None, "gated_ffn": False,
         "relative_attention_num_buckets": None, "output_scale": 1.0}
# the checkpoint's token tables (shared, encoder copy, decoder copy, output projection)
EMBED_NAMES = ("model.shared.weight", "model.encoder.embed_tokens.weight",
               "model.decoder.embed_tokens.weight", "proj_out.weight")


def _int_or_none(v, field, where, low=0):
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ValueError(f"{where}: {field} must be an integer >= {low}, got {v!r}")
    return v


def _id_map(v, field, where, vocab, keys=None):
    if not isinstance(v, dict) or not v:
        raise ValueError(f"{where}: {field} must be a non-empty mapping of tokens to ids")
    for k, i in v.items():
        if not isinstance(k, str) or (keys is not None and k not in keys):
            raise ValueError(f"{where}: {field} has the key {k!r}"
                             + (f" (expected {keys})" if keys else ""))
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab:
            raise ValueError(f"{where}: {field}[{k!r}]={i!r} is not a token id in [0, {vocab})")
    return dict(v)


def check_alignment_heads(heads, where, shape=None):
    """``alignment_heads`` (the cross-attention heads that follow the audio: word timestamps)
    checked -> a list of [layer, head] pairs; `shape` (decoder layers, decoder heads), when
    given, bounds them. None stays None (the model's default: every head of the second half
    of the decoder layers, openai-whisper's)."""
    if heads is None:
        return None
    ok = isinstance(heads, (list, tuple)) and len(heads) > 0 and all(
        isinstance(p, (list, tuple)) and len(p) == 2 and
        all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in p)
        for p in heads)
    if not ok:
        raise ValueError(f"{where}: alignment_heads must be a non-empty list of [layer, head] "
                         f"pairs of integers >= 0, got {heads!r}")
    if shape is not None:
        layers, n_heads = shape
        for layer, head in heads:
            if layer >= layers or head >= n_heads:
                raise ValueError(f"{where}: alignment_heads has [{layer}, {head}]: the decoder "
                                 f"has {layers} layers of {n_heads} heads")
    return [[int(layer), int(head)] for layer, head in heads]


def check_whisper_generation(gen, where, vocab):
    """A Whisper generation config (generation_config.json, or a model's generation_config=)
    checked: transformers' generic fields by :func:`check_generation_config`, Whisper's here
    (ids inside the vocabulary; alignment_heads a list of [layer, head] pairs: whether they
    are inside the decoder is checked where they are used, :attr:`WhisperModel.alignment_heads
    <fastattn.WhisperModel.alignment_heads>`, since distilled checkpoints ship their teacher's,
    out of range, and load and transcribe all the same); fields that would change the tokens
    and are not implemented are a ValueError naming them. Returns the dict the model keeps."""
    if not isinstance(gen, dict):
        raise TypeError(f"generation_config must be a dict, got {type(gen).__name__}")
    out = {k: v for k, v in gen.items() if k in _WHISPER_GEN}
    out.update(check_generation_config({k: v for k, v in gen.items() if k not in _WHISPER_GEN},
                                       where, ignored=_WHISPER_GEN_IGNORED,
                                       neutral=_WHISPER_GEN_NEUTRAL))
    check_generation_ids(out, vocab, where)
    for key in ("lang_to_id", "task_to_id"):
        if out.get(key) is not None:
            out[key] = _id_map(out[key], key, where, vocab,
                               ("transcribe", "translate") if key == "task_to_id" else None)
    for key in ("no_timestamps_token_id", "prev_sot_token_id"):
        v = single_id(out.get(key), key, where)
        if v is not None and v >= vocab:
            raise ValueError(f"{where}: {key}={v} is not a token id in [0, {vocab})")
        out[key] = v
    out["max_initial_timestamp_index"] = _int_or_none(out.get("max_initial_timestamp_index"),
                                                      "max_initial_timestamp_index", where)
    for key in ("is_multilingual", "return_timestamps", "_detect_timestamp_from_logprob"):
        if out.get(key) is not None and not isinstance(out[key], bool):
            raise ValueError(f"{where}: {key} must be true, false or null, got {out[key]!r}")
    for key in ("begin_suppress_tokens", "suppress_tokens"):
        if out.get(key) is not None:
            try:
                out[key] = _token_list(out[key], key, vocab)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{where}: {exc}") from None
    forced = out.get("forced_decoder_ids")
    if forced is not None:
        ok = isinstance(forced, list) and all(
            isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], int)
            and not isinstance(p[0], bool) and (p[1] is None or (
                isinstance(p[1], int) and not isinstance(p[1], bool) and 0 <= p[1] < vocab))
            for p in forced)
        if not ok:
            raise ValueError(f"{where}: forced_decoder_ids must be a list of [position, token "
                             f"id or null] pairs, got {forced!r}")
        out["forced_decoder_ids"] = [list(p) for p in forced]
    for key in ("language", "task"):
        if out.get(key) is not None and not isinstance(out[key], str):
            raise ValueError(f"{where}: {key} must be a string or null, got {out[key]!r}")
    if "alignment_heads" in out:
        out["alignment_heads"] = check_alignment_heads(out["alignment_heads"], where)
    return out


def read_generation(path, legacy, vocab):
    """The checked generation config: generation_config.json when present, else config.json's
    generation fields (transformers' GenerationConfig.from_model_config); config.json's
    forced_decoder_ids serve when the former has none (transformers' fallback)."""
    where = os.path.join(path, "generation_config.json")
    if os.path.exists(where):
        gen = read_json(where, os.path.basename(where), dict)
        if gen.get("forced_decoder_ids") is None and legacy.get("forced_decoder_ids") is not None:
            gen = dict(gen, forced_decoder_ids=legacy["forced_decoder_ids"])
    else:
        where = os.path.join(path, "config.json")
        gen = legacy
    return check_whisper_generation(gen, where, vocab)


class WhisperFamily(Family):
    """Whisper: a pre-norm encoder-decoder whose encoder reads log-mel features through two
    convolutions (:class:`fastattn.WhisperModel`), BART's weight names otherwise."""

    kind = "speech"
    model_types = ("whisper",)
    title = "Whisper"
    fixed = FIXED

    def read_config(self, raw, where):
        """config.json (`raw`, read from `where`) -> the keywords of WhisperModel, with the
        generation fields config.json itself holds as ``generation_config`` (they serve
        without a generation_config.json, and its forced_decoder_ids when that file has none,
        as transformers: :func:`read_generation`)."""
        gen = {}
        for key, value in raw.items():
            if key in DEFAULTS or key in IGNORED:
                continue
            if key in GENERATION_FIELDS or key in _WHISPER_GEN or key in _WHISPER_GEN_IGNORED:
                gen[key] = value
            else:
                raise ValueError(f"{where}: unknown config field {key!r}")
        cfg = {k: raw.get(k, d) for k, d in DEFAULTS.items()}
        for k in _POSITIVE:
            v = cfg[k]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{where}: {k} must be a positive integer, got {v!r}")
        if not isinstance(cfg["tie_word_embeddings"], bool):
            raise ValueError(f"{where}: tie_word_embeddings must be true or false, got "
                             f"{cfg['tie_word_embeddings']!r}")
        if "scale_embedding" in raw and not isinstance(raw["scale_embedding"], bool):
            raise ValueError(f"{where}: scale_embedding must be true or false, got "
                             f"{raw['scale_embedding']!r}")
        canonical_activation(cfg["activation_function"], "activation_function")
        for k in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            cfg[k] = single_id(cfg[k], k, where)
        del cfg["bos_token_id"]
        for k in ("pad_token_id", "eos_token_id", "decoder_start_token_id"):
            if cfg[k] is None:
                raise ValueError(f"{where}: {k} must be set for generation")
        cfg["generation_config"] = gen
        return cfg

    def name_map(self, c):
        """The checkpoint's names on WhisperModel's network for its keywords `c` (a list of
        :class:`~fastattn.models.family.Entry`): BART's map (:func:`fastattn.models.bart.
        name_map`) of the Transformer, then Whisper's differences: the audio stem instead of
        an encoder token embedding, no k_proj bias, no final_logits_bias, ``proj_out``."""
        d = c["d_model"]
        base = _bart.name_map(dict(c, decoder_vocab_size=c["vocab_size"],
                                   share_encoder_decoder_embeddings=False, positions="learned",
                                   max_position_embeddings=c["max_target_positions"],
                                   position_offset=0, layernorm_embedding=False,
                                   normalize_before=True))
        out = [Entry(f"model.encoder.conv{i}.{p}", f"stem.conv{i}.{p}", None, shape)
               for i, cin in ((1, c["num_mel_bins"]), (2, d))
               for p, shape in (("weight", (d, cin, 3)), ("bias", (d,)))]
        out.append(Entry("model.encoder.embed_positions.weight", "stem.position_weight", None,
                         (c["max_source_positions"], d)))
        for e in base:
            hf = e.checkpoint
            if hf.endswith("k_proj.bias") or hf.startswith("model.encoder.embed") or \
                    hf == "final_logits_bias":
                continue
            out.append(e._replace(checkpoint="proj_out.weight") if hf == "lm_head.weight"
                       else e)
        return out

    @staticmethod
    def state_dict(weights, config):
        return _bart.checkpoint_state_dict(weights, config, EMBED_NAMES)

    @staticmethod
    def untie(config, weights, path):
        """proj_out read as transformers reads it: untied when its saved copy differs
        (config's tie_word_embeddings set to False then)."""
        tie = {"tie_word_embeddings": config["tie_word_embeddings"],
               "share_encoder_decoder_embeddings": False}
        _bart.untie_differing_copies(tie, weights, path, EMBED_NAMES)
        config["tie_word_embeddings"] = tie["tie_word_embeddings"]


WHISPER = WhisperFamily()
