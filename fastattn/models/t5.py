"""T5, T5 v1.1 / flan-T5 and mT5 checkpoints: a family with its own config reader and name map.

What transformers' T5 computes, against the BART-style models (:mod:`.bart`):

- no absolute positions: a learned bias per head and bucket of relative position
  (``relative_attention_num_buckets`` buckets, logarithmic up to
  ``relative_attention_max_distance``), bidirectional in the encoder and causal in the decoder,
  held by the first layer of each stack and added to every layer's self-attention scores
  (:class:`fastattn.nn.RelativePositionBias`); cross-attention has none;
- RMS norms without mean or bias (``layer_norm_epsilon``), pre-norm layers, a final norm per stack;
- no 1/sqrt(d) scaling of q k^T, and heads ``d_kv`` wide (``num_heads * d_kv`` need not be
  d_model); no biases anywhere;
- the FFN of ``feed_forward_proj``: "relu" (``wi``, ``wo``) or "gated-gelu" (T5 v1.1, flan-T5,
  mT5: ``gelu_new(x wi_0) * (x wi_1)``, then ``wo``), also "gated-relu" / "gated-silu" / "silu";
- the decoder output times d_model^-0.5 before the output projection where transformers scales
  it (``scale_decoder_outputs``, i.e. original T5 with its tied head; not T5 v1.1 / flan-T5 /
  mT5), the output projection tied to the shared embedding unless the checkpoint saves a
  different ``lm_head.weight``.

A field that would change the numbers and is missing or unknown is a ValueError naming it
(``relative_attention_max_distance`` included: transformers would assume 128).
"""
from .._validation import check_positive_int
from ..generation.config import GENERATION_FIELDS, single_id
from ..io.huggingface import canonical_activation
from .bart import IGNORED, BartFamily, checkpoint_state_dict, untie_differing_copies
from .family import Entry

T5_NAMES = ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
            "lm_head.weight")

__all__ = ["T5Family", "MT5Family", "T5", "MT5"]

_IGNORED = (IGNORED | {"dropout_rate", "initializer_factor", "n_positions", "is_gated_act",
                       "dense_act_fn", "output_past", "gradient_checkpointing"}) - {"bos_token_id"}
_REQUIRED = ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads",
             "relative_attention_num_buckets", "relative_attention_max_distance")


class T5Family(BartFamily):
    model_type = "t5"
    title = "T5"
    spm_tokenizer = "t5"
    scales_output = True          # original T5's tied head: decoder output * d_model ** -0.5

    def read_config(self, raw, where):
        known = set(_REQUIRED) | {
            "num_decoder_layers", "layer_norm_epsilon", "feed_forward_proj", "pad_token_id",
            "eos_token_id", "decoder_start_token_id", "tie_word_embeddings",
            "scale_decoder_outputs", "bos_token_id", "is_decoder", "is_encoder_decoder"}
        gen = {}
        for key, value in raw.items():
            if key in known or key in _IGNORED:
                continue
            if key in GENERATION_FIELDS:
                gen[key] = value
                continue
            raise ValueError(f"{where}: unknown config field {key!r}")
        for key in _REQUIRED:
            v = raw.get(key)
            if v is None:
                raise ValueError(f"{where}: {key} is missing (a {self.model_type} model needs it)")
            check_positive_int(v, f"{where}: {key}")
        dec_layers = raw.get("num_decoder_layers")
        dec_layers = raw["num_layers"] if dec_layers is None else dec_layers
        check_positive_int(dec_layers, f"{where}: num_decoder_layers")
        if raw.get("is_decoder", False) is not False:
            raise ValueError(f"{where}: is_decoder={raw['is_decoder']!r} is not supported")
        proj = raw.get("feed_forward_proj", "relu")
        parts = proj.split("-") if isinstance(proj, str) else []
        if not parts or len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
            raise ValueError(f"{where}: feed_forward_proj={proj!r} is not supported; use "
                             "'relu', 'gated-gelu', 'gated-relu', 'gated-silu' or 'silu'")
        act = "gelu_new" if proj == "gated-gelu" else parts[-1]
        canonical_activation(act, "feed_forward_proj")
        eps = raw.get("layer_norm_epsilon", 1e-6)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
            raise ValueError(f"{where}: layer_norm_epsilon must be a positive number, got {eps!r}")
        tie = raw.get("tie_word_embeddings", True)
        if not isinstance(tie, bool):
            raise ValueError(f"{where}: tie_word_embeddings must be true or false, got {tie!r}")
        scale = raw.get("scale_decoder_outputs", tie is not False and self.scales_output)
        if not isinstance(scale, bool):
            raise ValueError(f"{where}: scale_decoder_outputs must be true or false, got "
                             f"{scale!r}")
        ids = {k: single_id(raw.get(k, d), k, where) for k, d in
               (("pad_token_id", 0), ("eos_token_id", 1), ("decoder_start_token_id", None))}
        if ids["decoder_start_token_id"] is None:
            ids["decoder_start_token_id"] = ids["pad_token_id"]     # T5 starts from pad
        if ids["pad_token_id"] is None or ids["eos_token_id"] is None:
            raise ValueError(f"{where}: pad_token_id and eos_token_id must be set")
        V, d = raw["vocab_size"], raw["d_model"]
        config = {
            "vocab_size": V, "decoder_vocab_size": V, "d_model": d,
            "encoder_layers": raw["num_layers"], "decoder_layers": dec_layers,
            "encoder_attention_heads": raw["num_heads"],
            "decoder_attention_heads": raw["num_heads"],
            "encoder_ffn_dim": raw["d_ff"], "decoder_ffn_dim": raw["d_ff"],
            "activation_function": act, "scale_embedding": False, "normalize_before": True,
            "positions": "none", "max_position_embeddings": raw.get("n_positions") or 512,
            "share_encoder_decoder_embeddings": True,
            # transformers ties lm_head to the shared embedding; a saved lm_head.weight that
            # differs unties it (untie_differing_copies)
            "tie_word_embeddings": True,
            "layer_norm_eps": float(eps), "layernorm_embedding": False, "position_offset": 0,
            "model_type": self.model_type, "norm": "rms", "bias": False,
            "head_dim": raw["d_kv"], "attention_scale": 1.0, "gated_ffn": parts[0] == "gated",
            "relative_attention_num_buckets": raw["relative_attention_num_buckets"],
            "relative_attention_max_distance": raw["relative_attention_max_distance"],
            "output_scale": d ** -0.5 if scale else 1.0, "final_logits_bias": False, **ids,
            "generation_config": gen}
        return config

    @staticmethod
    def name_map(c):
        """T5's name map (:class:`~fastattn.models.family.Entry` s), in the order random
        initialisation draws in."""
        d, V = c["d_model"], c["vocab_size"]
        inner = c["encoder_attention_heads"] * c["head_dim"]
        m = []

        def add(hf, nn, shape, rows=None):
            m.append(Entry(hf, nn, rows, shape))

        if c["share_encoder_decoder_embeddings"]:
            add("shared.weight", "encoder_embed.weight", (V, d))
        else:
            add("encoder.embed_tokens.weight", "encoder_embed.weight", (V, d))
            add("decoder.embed_tokens.weight", "decoder_embed.weight", (V, d))
        if not c["tie_word_embeddings"]:
            add("lm_head.weight", "lm_head.weight", (V, d))
        for which in ("encoder", "decoder"):
            f = c[f"{which}_ffn_dim"]
            blocks = ["SelfAttention"] + (["EncDecAttention"] if which == "decoder" else [])
            for i in range(c[f"{which}_layers"]):
                p, q = f"{which}.block.{i}.layer.", f"{which}.layers.{i}."
                for j, blk in enumerate(blocks):
                    nn = "self_attn" if j == 0 else "multihead_attn"
                    for r, proj in enumerate("qkv"):
                        add(f"{p}{j}.{blk}.{proj}.weight", f"{q}{nn}.in_proj_weight",
                            (inner, d), (r * inner, (r + 1) * inner))
                    add(f"{p}{j}.{blk}.o.weight", f"{q}{nn}.out_proj.weight", (d, inner))
                    if i == 0 and j == 0:
                        add(f"{p}0.SelfAttention.relative_attention_bias.weight",
                            f"{which}.position_bias.weight",
                            (c["relative_attention_num_buckets"], c[f"{which}_attention_heads"]))
                    add(f"{p}{j}.layer_norm.weight", f"{q}norm{j + 1}.weight", (d,))
                k = len(blocks)
                ffn = f"{p}{k}.DenseReluDense."
                if c["gated_ffn"]:
                    add(ffn + "wi_0.weight", f"{q}linear1.weight", (f, d))
                    add(ffn + "wi_1.weight", f"{q}gate.weight", (f, d))
                else:
                    add(ffn + "wi.weight", f"{q}linear1.weight", (f, d))
                add(ffn + "wo.weight", f"{q}linear2.weight", (d, f))
                add(f"{p}{k}.layer_norm.weight", f"{q}norm{k + 1}.weight", (d,))
            add(f"{which}.final_layer_norm.weight", f"{which}.norm.weight", (d,))
        return m

    @staticmethod
    def state_dict(weights, config):
        """The checkpoint's tensors by the names name_map lists (see bart.checkpoint_state_dict:
        copies of a shared table must agree with it; a tied lm_head.weight is dropped)."""
        return checkpoint_state_dict(weights, config, T5_NAMES)

    @staticmethod
    def untie(config, weights, path):
        """Each token table as transformers (>= 5) reads it: an ``encoder.embed_tokens`` /
        ``decoder.embed_tokens`` / ``lm_head`` saved with values of its own is used as saved
        (fine-tunes of T5 v1.1 / flan-T5 / mT5 under ``tie_word_embeddings: false`` keep them
        apart), one that is missing or equal to ``shared.weight`` is that table."""
        untie_differing_copies(config, weights, path, T5_NAMES, warn=False)


class MT5Family(T5Family):
    model_type = "mt5"
    title = "mT5"
    scales_output = False         # transformers' mT5 never scales the decoder output


T5, MT5 = T5Family(), MT5Family()
