"""MPNet checkpoints (all-mpnet-base-v2 and the other sentence-transformers MPNet models).

What transformers' MPNet computes, against BERT: no token types; learned absolute positions
counted past the padding id, which MPNet fixes at 1 whatever ``pad_token_id`` says (RoBERTa's
``pad + cumsum(ids != pad)``); and a learned relative position bias
(``relative_attention_num_buckets`` buckets, bidirectional, logarithmic up to a distance of 128:
T5's buckets) computed once and added to every layer's attention scores. Post-norm layers as
BERT's, under their own names.
"""
from ..io.huggingface import canonical_activation
from .bert import BertFamily, EncoderConfig, _float_field, _int_field
from .family import Entry

__all__ = ["MPNetFamily", "MPNET"]

MAX_DISTANCE = 128            # fixed in transformers' MPNet
PADDING_IDX = 1               # MPNetEmbeddings.padding_idx, fixed


def _buckets(cfg, path):
    # transformers' MPNet computes 32 buckets whatever the config says (compute_position_bias'
    # default), and indexes a table of relative_attention_num_buckets rows with them: only 32
    # is a model it can run
    n = _int_field(cfg, "relative_attention_num_buckets", path, 32)
    if n != 32:
        raise ValueError(f"config field relative_attention_num_buckets={n} in {path} is not "
                         "supported (MPNet computes 32 buckets)")
    return n


class MPNetFamily(BertFamily):
    """MPNet: BERT's block under its own names, RoBERTa's positions from the fixed padding
    index 1, T5's bidirectional buckets as a position bias shared by every layer."""

    model_types = ("mpnet",)
    title = "MPNet"

    def read_config(self, raw, where):
        """config.json (`raw`, read from `where`) -> EncoderConfig."""
        cfg, path = raw, where
        hidden = _int_field(cfg, "hidden_size", path, 768)
        heads = _int_field(cfg, "num_attention_heads", path, 12)
        if hidden % heads:
            raise ValueError(f"config in {path}: hidden size {hidden} is not a multiple of the "
                             f"number of attention heads {heads}")
        if cfg.get("is_decoder", False):
            raise ValueError(f"config field is_decoder=true in {path} is not supported")
        act = cfg.get("hidden_act", "gelu")
        vocab = _int_field(cfg, "vocab_size", path, 30527)
        max_pos = _int_field(cfg, "max_position_embeddings", path, 514)
        if PADDING_IDX + 1 >= max_pos:
            raise ValueError(f"config field max_position_embeddings={max_pos} in {path} leaves no "
                             "position")
        pad = cfg.get("pad_token_id", 1)
        if isinstance(pad, bool) or not isinstance(pad, int) or not 0 <= pad < vocab:
            raise ValueError(f"config field pad_token_id={pad!r} in {path} must be an integer id "
                             f"in [0, vocab_size={vocab})")
        return EncoderConfig(
            model_type="mpnet", vocab_size=vocab, hidden_size=hidden,
            num_layers=_int_field(cfg, "num_hidden_layers", path, 12), num_heads=heads,
            intermediate_size=_int_field(cfg, "intermediate_size", path, 3072),
            activation=canonical_activation(act, "hidden_act"), hidden_act=act,
            layer_norm_eps=_float_field(cfg, "layer_norm_eps", path, 1e-12),
            max_position_embeddings=max_pos, type_vocab_size=0, pad_token_id=pad,
            positions_after_padding=True, position_padding_idx=PADDING_IDX,
            relative_attention_num_buckets=_buckets(cfg, path),
            relative_attention_max_distance=MAX_DISTANCE)

    def name_map(self, cfg):
        """MPNet's name map (see :meth:`fastattn.models.bert.BertFamily.name_map`)."""
        H = cfg.hidden_size
        m = [Entry("embeddings.word_embeddings.weight", "embeddings.weight"),
             Entry("embeddings.position_embeddings.weight", "embeddings.position_weight"),
             Entry("embeddings.LayerNorm.weight", "embeddings.norm.weight"),
             Entry("embeddings.LayerNorm.bias", "embeddings.norm.bias"),
             Entry("encoder.relative_attention_bias.weight", "position_bias.weight")]
        for i in range(cfg.num_layers):
            p, q = f"encoder.layer.{i}.", f"layers.{i}."
            for j, x in enumerate("qkv"):
                for w in ("weight", "bias"):
                    m.append(Entry(f"{p}attention.attn.{x}.{w}", f"{q}self_attn.in_proj_{w}",
                                   (j * H, (j + 1) * H)))
            for hf, ours in (("attention.attn.o", "self_attn.out_proj"),
                             ("attention.LayerNorm", "norm1"), ("intermediate.dense", "linear1"),
                             ("output.dense", "linear2"), ("output.LayerNorm", "norm2")):
                for w in ("weight", "bias"):
                    m.append(Entry(f"{p}{hf}.{w}", f"{q}{ours}.{w}"))
        return m


MPNET = MPNetFamily()
