"""BERT-family checkpoints: ``config.json`` parsing and Hugging Face weight names.

The families here (the interface: :mod:`fastattn.models.family`; registered in
:mod:`fastattn.models.registry`) and what distinguishes them:

- ``"bert"`` (:class:`BertFamily`): learned absolute positions ``0 .. S-1``, token-type
  embeddings.
- ``"roberta"``, ``"xlm-roberta"``, ``"camembert"`` (:class:`RobertaFamily`): the BERT network;
  position ids start after the padding id, ``pad_token_id + cumsum(input_ids != pad_token_id)``
  for tokens and ``pad_token_id`` for padding tokens (transformers'
  ``create_position_ids_from_input_ids``).
- ``"distilbert"`` (:class:`DistilBertFamily`): the same post-norm block under other names, no
  token types, LayerNorm eps fixed at 1e-12 (hard-coded in transformers).

:class:`EncoderConfig` is the spec every encoder family reads (MPNet's and ModernBERT's too:
:mod:`.mpnet`, :mod:`.modernbert`). Nothing here imports torch or transformers.
"""
from dataclasses import dataclass

import numpy as np

from ..io.huggingface import canonical_activation
from .family import Entry, Family

__all__ = ["EncoderConfig", "BertFamily", "RobertaFamily", "DistilBertFamily", "BERT",
           "ROBERTA", "DISTILBERT"]


@dataclass(frozen=True)
class EncoderConfig:
    """What EncoderModel needs from a ``config.json``: the spec every encoder family's
    ``read_config`` gives."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    activation: str              # fastattn's name: gelu, gelu_tanh, relu or silu
    hidden_act: str              # the name as the config spells it
    layer_norm_eps: float
    max_position_embeddings: int
    type_vocab_size: int         # 0: no token-type embeddings (distilbert)
    pad_token_id: int            # -1 if the config has none (bert allows null)
    positions_after_padding: bool
    # the other families' variants (mpnet.py, modernbert.py); the defaults are BERT's
    position_padding_idx: int = -1    # the id positions count from (RoBERTa: pad; MPNet: 1)
    learned_positions: bool = True    # False: no absolute positions (ModernBERT's rotary)
    norm_first: bool = False          # pre-norm layers
    bias: bool = True                 # biases in the projections and norms
    gated: bool = False               # GeGLU FFN
    final_norm: bool = False          # a norm after the last layer
    first_attn_norm: bool = True      # False: layer 0 has no norm before its attention
    relative_attention_num_buckets: int = 0   # MPNet's position bias
    relative_attention_max_distance: int = 0  # (its buckets' largest distance)
    layer_types: tuple = ()           # ModernBERT: "full" / "sliding" per layer
    rope_theta: tuple = ()            # ModernBERT: (full, sliding) rotary bases
    local_attention: int = 0          # ModernBERT: the sliding window's width

    @property
    def head_dim(self):
        return self.hidden_size // self.num_heads

    @property
    def padding_idx(self):
        return self.position_padding_idx if self.position_padding_idx >= 0 else self.pad_token_id

    @property
    def max_tokens(self):
        """Longest sequence the position table allows."""
        if self.positions_after_padding:
            return self.max_position_embeddings - self.padding_idx - 1
        return self.max_position_embeddings


def _int_field(cfg, name, path, default=None, minimum=1):
    value = cfg.get(name, default)
    if value is None or isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"config field {name}={value!r} in {path} must be an integer")
    if value < minimum:
        raise ValueError(f"config field {name}={value!r} in {path} must be >= {minimum}")
    return value


def _float_field(cfg, name, path, default):
    value = cfg.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or not np.isfinite(value):
        raise ValueError(f"config field {name}={value!r} in {path} must be a positive number")
    return float(value)


# Our names -> Hugging Face names (after the checkpoint's prefix, e.g. "bert." or none).
# Layer names hold "{i}".
_BERT_NAMES = {
    "word": "embeddings.word_embeddings.weight",
    "position": "embeddings.position_embeddings.weight",
    "token_type": "embeddings.token_type_embeddings.weight",
    "emb_ln_w": "embeddings.LayerNorm.weight",
    "emb_ln_b": "embeddings.LayerNorm.bias",
    "layer": {
        "q_w": "encoder.layer.{i}.attention.self.query.weight",
        "q_b": "encoder.layer.{i}.attention.self.query.bias",
        "k_w": "encoder.layer.{i}.attention.self.key.weight",
        "k_b": "encoder.layer.{i}.attention.self.key.bias",
        "v_w": "encoder.layer.{i}.attention.self.value.weight",
        "v_b": "encoder.layer.{i}.attention.self.value.bias",
        "o_w": "encoder.layer.{i}.attention.output.dense.weight",
        "o_b": "encoder.layer.{i}.attention.output.dense.bias",
        "ln1_w": "encoder.layer.{i}.attention.output.LayerNorm.weight",
        "ln1_b": "encoder.layer.{i}.attention.output.LayerNorm.bias",
        "i_w": "encoder.layer.{i}.intermediate.dense.weight",
        "i_b": "encoder.layer.{i}.intermediate.dense.bias",
        "out_w": "encoder.layer.{i}.output.dense.weight",
        "out_b": "encoder.layer.{i}.output.dense.bias",
        "ln2_w": "encoder.layer.{i}.output.LayerNorm.weight",
        "ln2_b": "encoder.layer.{i}.output.LayerNorm.bias",
    },
}

_DISTILBERT_NAMES = {
    "word": "embeddings.word_embeddings.weight",
    "position": "embeddings.position_embeddings.weight",
    "emb_ln_w": "embeddings.LayerNorm.weight",
    "emb_ln_b": "embeddings.LayerNorm.bias",
    "layer": {
        "q_w": "transformer.layer.{i}.attention.q_lin.weight",
        "q_b": "transformer.layer.{i}.attention.q_lin.bias",
        "k_w": "transformer.layer.{i}.attention.k_lin.weight",
        "k_b": "transformer.layer.{i}.attention.k_lin.bias",
        "v_w": "transformer.layer.{i}.attention.v_lin.weight",
        "v_b": "transformer.layer.{i}.attention.v_lin.bias",
        "o_w": "transformer.layer.{i}.attention.out_lin.weight",
        "o_b": "transformer.layer.{i}.attention.out_lin.bias",
        "ln1_w": "transformer.layer.{i}.sa_layer_norm.weight",
        "ln1_b": "transformer.layer.{i}.sa_layer_norm.bias",
        "i_w": "transformer.layer.{i}.ffn.lin1.weight",
        "i_b": "transformer.layer.{i}.ffn.lin1.bias",
        "out_w": "transformer.layer.{i}.ffn.lin2.weight",
        "out_b": "transformer.layer.{i}.ffn.lin2.bias",
        "ln2_w": "transformer.layer.{i}.output_layer_norm.weight",
        "ln2_b": "transformer.layer.{i}.output_layer_norm.bias",
    },
}



class BertFamily(Family):
    """BERT: learned absolute positions from 0, token types, post-norm layers."""

    kind = "encoder"
    model_types = ("bert",)
    title = "BERT"
    names = _BERT_NAMES
    # the tensor that locates the checkpoint's prefix ("bert.", "roberta.", none), and where
    # its layers are numbered (a layer past config.json's count is an error)
    anchor = "embeddings.word_embeddings.weight"
    layer_prefix = "encoder.layer."
    positions_after_padding = False       # RoBERTa's position ids

    def read_config(self, raw, where):
        """config.json (`raw`, read from `where`) -> :class:`EncoderConfig`.

        Every field that changes the numbers is honoured or rejected with a ValueError naming
        it: ``hidden_act`` / ``activation``, ``layer_norm_eps``, ``position_embedding_type``
        (only "absolute"), ``type_vocab_size``, ``pad_token_id``, ``max_position_embeddings``,
        ``is_decoder`` (must be false: a decoder is causal).
        """
        cfg, path = raw, where
        is_decoder = cfg.get("is_decoder", False)
        if not isinstance(is_decoder, bool):
            raise ValueError(f"config field is_decoder={is_decoder!r} in {path} must be true or "
                             "false")
        if is_decoder:
            raise ValueError(f"config field is_decoder=true in {path}: a causal (decoder) model "
                             "is not an encoder; only is_decoder=false is supported")
        act_field, hidden, layers, heads, inter, act, eps, type_vocab = self._sizes(cfg, path)
        positions_after_padding = self.positions_after_padding
        canonical = canonical_activation(act, act_field)
        if hidden % heads:
            raise ValueError(f"config in {path}: hidden size {hidden} is not a multiple of the "
                             f"number of attention heads {heads}")
        vocab = _int_field(cfg, "vocab_size", path, 30522)
        max_pos = _int_field(cfg, "max_position_embeddings", path, 512)
        pad = cfg.get("pad_token_id", 1 if positions_after_padding else 0)
        if pad is None and not positions_after_padding:
            pad = -1
        if isinstance(pad, bool) or not isinstance(pad, int) or pad < -1 or pad >= vocab \
                or (positions_after_padding and pad < 0):
            raise ValueError(f"config field pad_token_id={pad!r} in {path} must be an integer id "
                             f"in [0, vocab_size={vocab})")
        if positions_after_padding and pad + 1 >= max_pos:
            raise ValueError(f"config in {path}: pad_token_id={pad} leaves no position in "
                             f"max_position_embeddings={max_pos}")
        return EncoderConfig(
            model_type=cfg.get("model_type"), vocab_size=vocab, hidden_size=hidden,
            num_layers=layers, num_heads=heads, intermediate_size=inter, activation=canonical,
            hidden_act=act, layer_norm_eps=eps, max_position_embeddings=max_pos,
            type_vocab_size=type_vocab, pad_token_id=pad,
            positions_after_padding=positions_after_padding)

    def _sizes(self, cfg, path):
        """(the activation's field name, hidden, layers, heads, intermediate, activation, eps,
        type_vocab_size) under BERT's field names."""
        pet = cfg.get("position_embedding_type", "absolute")
        if pet != "absolute":
            raise ValueError(
                f"config field position_embedding_type={pet!r} in {path} is not supported; "
                "only 'absolute' is")
        hidden = _int_field(cfg, "hidden_size", path, 768)
        sizes = ("hidden_act", hidden, _int_field(cfg, "num_hidden_layers", path, 12),
                 _int_field(cfg, "num_attention_heads", path, 12),
                 _int_field(cfg, "intermediate_size", path, 3072), cfg.get("hidden_act", "gelu"),
                 _float_field(cfg, "layer_norm_eps", path, 1e-12),
                 _int_field(cfg, "type_vocab_size", path, 2))
        if "embedding_size" in cfg and cfg["embedding_size"] not in (None, hidden):
            raise ValueError(f"config field embedding_size={cfg['embedding_size']!r} in {path} "
                             f"differs from hidden_size={hidden}; factorised embeddings are "
                             "not supported")
        return sizes

    def name_map(self, cfg):
        """Where each tensor of a checkpoint (its name after the checkpoint's prefix) goes in
        :class:`fastattn.EncoderModel`'s network (``embeddings``: a
        :class:`fastattn.nn.Embedding`; ``layers.N``: :class:`fastattn.nn.TransformerEncoderLayer`),
        a list of :class:`~fastattn.models.family.Entry`. q, k and v are row blocks of a layer's
        ``self_attn.in_proj_weight`` (one GEMM)."""
        names = self.names
        H = cfg.hidden_size
        m = [Entry(names["word"], "embeddings.weight"),
             Entry(names["position"], "embeddings.position_weight"),
             Entry(names["emb_ln_w"], "embeddings.norm.weight"),
             Entry(names["emb_ln_b"], "embeddings.norm.bias")]
        if cfg.type_vocab_size:
            m.append(Entry(names["token_type"], "embeddings.token_type_weight"))
        ours = {"o_w": "self_attn.out_proj.weight", "o_b": "self_attn.out_proj.bias",
                "ln1_w": "norm1.weight", "ln1_b": "norm1.bias", "i_w": "linear1.weight",
                "i_b": "linear1.bias", "out_w": "linear2.weight", "out_b": "linear2.bias",
                "ln2_w": "norm2.weight", "ln2_b": "norm2.bias"}
        for i in range(cfg.num_layers):
            for key, hf in names["layer"].items():
                hf = hf.format(i=i)
                if key[0] in "qkv":
                    j = "qkv".index(key[0])
                    which = "weight" if key.endswith("_w") else "bias"
                    m.append(Entry(hf, f"layers.{i}.self_attn.in_proj_{which}",
                                   (j * H, (j + 1) * H)))
                else:
                    m.append(Entry(hf, f"layers.{i}.{ours[key]}"))
        return m


class RobertaFamily(BertFamily):
    """RoBERTa, XLM-RoBERTa, CamemBERT: BERT with position ids counted past the padding id."""

    model_types = ("roberta", "xlm-roberta", "camembert")
    title = "RoBERTa / XLM-RoBERTa / CamemBERT"
    positions_after_padding = True


class DistilBertFamily(BertFamily):
    """DistilBERT: BERT's block under other names, no token types, eps fixed at 1e-12."""

    model_types = ("distilbert",)
    title = "DistilBERT"
    names = _DISTILBERT_NAMES
    layer_prefix = "transformer.layer."

    def _sizes(self, cfg, path):
        return ("activation", _int_field(cfg, "dim", path, 768),
                _int_field(cfg, "n_layers", path, 6), _int_field(cfg, "n_heads", path, 12),
                _int_field(cfg, "hidden_dim", path, 4 * 768), cfg.get("activation", "gelu"),
                1e-12,                     # fixed in transformers' DistilBERT
                0)


BERT, ROBERTA, DISTILBERT = BertFamily(), RobertaFamily(), DistilBertFamily()
