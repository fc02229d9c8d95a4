"""ModernBERT checkpoints.

What transformers' ModernBERT computes, against BERT: no absolute positions but rotary ones on
q and k (base ``rope_theta`` of the layer's kind); pre-norm layers (the first without a norm
before its attention) and a final norm; layers of two kinds (``layer_types``, or every
``global_attn_every_n_layers``-th one global in older configs): full attention, and sliding-window
attention where a token sees the keys within ``local_attention // 2`` positions; a GeGLU FFN
(``Wi`` gives the activated half and the gate); no biases (``attention_bias``, ``mlp_bias``,
``norm_bias``); no token types.
"""
from ..io.huggingface import canonical_activation
from .bert import BertFamily, EncoderConfig, _float_field, _int_field
from .family import Entry

__all__ = ["ModernBertFamily", "MODERNBERT"]


def _bool(cfg, name, path, default):
    v = cfg.get(name, default)
    if not isinstance(v, bool):
        raise ValueError(f"config field {name}={v!r} in {path} must be true or false")
    return v


def _theta(value, name, path):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"config field {name}={value!r} in {path} must be a positive number")
    return float(value)


class ModernBertFamily(BertFamily):
    """ModernBERT: rotary positions, pre-norm GeGLU layers of two attention kinds (full and
    sliding window), no biases, a final norm."""

    model_types = ("modernbert",)
    title = "ModernBERT"
    anchor = "embeddings.tok_embeddings.weight"
    layer_prefix = "layers."

    def read_config(self, raw, where):
        """config.json (`raw`, read from `where`) -> EncoderConfig."""
        cfg, path = raw, where
        hidden = _int_field(cfg, "hidden_size", path, 768)
        heads = _int_field(cfg, "num_attention_heads", path, 12)
        if hidden % heads or (hidden // heads) % 2:
            raise ValueError(f"config in {path}: hidden size {hidden} over {heads} heads does not "
                             "give an even head size (rotary positions need one)")
        layers = _int_field(cfg, "num_hidden_layers", path, 22)
        biases = {k: _bool(cfg, k, path, False)
                  for k in ("attention_bias", "mlp_bias", "norm_bias")}
        if len(set(biases.values())) > 1:
            raise ValueError(f"config in {path}: attention_bias, mlp_bias and norm_bias differ "
                             f"({biases}); only all true or all false is supported")
        types = cfg.get("layer_types")
        if types is None:
            every = _int_field(cfg, "global_attn_every_n_layers", path, 3)
            types = ["full_attention" if i % every == 0 else "sliding_attention"
                     for i in range(layers)]
        if not isinstance(types, list) or len(types) != layers or any(
                t not in ("full_attention", "sliding_attention") for t in types):
            raise ValueError(f"config field layer_types={types!r} in {path} must list "
                             f"'full_attention' or 'sliding_attention' for each of the {layers} "
                             "layers")
        rope = cfg.get("rope_parameters")
        if rope is not None:
            try:
                for kind in ("full_attention", "sliding_attention"):
                    if rope[kind].get("rope_type", "default") != "default":
                        raise ValueError(f"config field rope_parameters in {path}: rope_type "
                                         f"{rope[kind]['rope_type']!r} is not supported (only "
                                         "'default')")
                thetas = (rope["full_attention"]["rope_theta"],
                          rope["sliding_attention"]["rope_theta"])
            except (KeyError, TypeError, AttributeError):
                raise ValueError(f"config field rope_parameters={rope!r} in {path} must give "
                                 "rope_theta for full_attention and sliding_attention") from None
        else:
            thetas = (cfg.get("global_rope_theta", 160000.0), cfg.get("local_rope_theta", 10000.0))
        thetas = tuple(_theta(t, "rope_theta", path) for t in thetas)
        act = cfg.get("hidden_activation", "gelu")
        vocab = _int_field(cfg, "vocab_size", path, 50368)
        pad = cfg.get("pad_token_id", 50283)
        if isinstance(pad, bool) or not isinstance(pad, int) or not 0 <= pad < vocab:
            raise ValueError(f"config field pad_token_id={pad!r} in {path} must be an integer id "
                             f"in [0, vocab_size={vocab})")
        return EncoderConfig(
            model_type="modernbert", vocab_size=vocab, hidden_size=hidden, num_layers=layers,
            num_heads=heads, intermediate_size=_int_field(cfg, "intermediate_size", path, 1152),
            activation=canonical_activation(act, "hidden_activation"), hidden_act=act,
            layer_norm_eps=_float_field(cfg, "norm_eps", path, 1e-5),
            max_position_embeddings=_int_field(cfg, "max_position_embeddings", path, 8192),
            type_vocab_size=0, pad_token_id=pad, positions_after_padding=False,
            learned_positions=False, norm_first=True, bias=biases["attention_bias"], gated=True,
            final_norm=True, first_attn_norm=False,
            layer_types=tuple("full" if t == "full_attention" else "sliding" for t in types),
            rope_theta=thetas, local_attention=_int_field(cfg, "local_attention", path, 128))

    def name_map(self, cfg):
        """ModernBERT's name map: ``Wi`` (2 I, H) fills the FFN's activated half (its rows
        [0, I)) and its gate (rows [I, 2 I))."""
        I = cfg.intermediate_size
        w = ("weight", "bias") if cfg.bias else ("weight",)
        m = [Entry("embeddings.tok_embeddings.weight", "embeddings.weight")]
        m += [Entry(f"embeddings.norm.{x}", f"embeddings.norm.{x}") for x in w]
        for i in range(cfg.num_layers):
            p, q = f"layers.{i}.", f"layers.{i}."
            for x in w:
                if i > 0:
                    m.append(Entry(f"{p}attn_norm.{x}", f"{q}norm1.{x}"))
                m += [Entry(f"{p}attn.Wqkv.{x}", f"{q}self_attn.in_proj_{x}"),
                      Entry(f"{p}attn.Wo.{x}", f"{q}self_attn.out_proj.{x}"),
                      Entry(f"{p}mlp_norm.{x}", f"{q}norm2.{x}"),
                      Entry(f"{p}mlp.Wi.{x}", f"{q}linear1.{x}", part=(0, I)),
                      Entry(f"{p}mlp.Wi.{x}", f"{q}gate.{x}", part=(I, 2 * I)),
                      Entry(f"{p}mlp.Wo.{x}", f"{q}linear2.{x}")]
        m += [Entry(f"final_norm.{x}", f"final_norm.{x}") for x in w]
        return m


MODERNBERT = ModernBertFamily()
