"""BART-style families: BART, mBART, Pegasus, M2M100 / NLLB (and Marian, :mod:`.marian`; T5,
:mod:`.t5`).

One config reader and one name map for the encoder-decoders that transformers writes with the
same weight names (``model.shared``, ``model.encoder.layers.N.self_attn.q_proj`` ...). Each
``model_type`` is a small subclass of :class:`BartFamily` stating what its transformers class
computes (the family interface: :mod:`fastattn.models.family`; registered in
:mod:`fastattn.models.registry`):

============  =========  ============  ====================  ==========================  =========
model_type    layers     final norms   layernorm_embedding   positions                   logits
                                                                                         bias
============  =========  ============  ====================  ==========================  =========
bart          post-norm  no            yes                   learned, offset 2           yes
mbart         pre-norm   yes           yes                   learned, offset 2           yes
pegasus       pre-norm   yes           no                    sinusoid, sin | cos halves  yes
m2m_100       pre-norm   yes           no                    sinusoid from the pad id    no
marian        post-norm  no            no                    sinusoid, sin | cos halves  yes
============  =========  ============  ====================  ==========================  =========

(NLLB-200 checkpoints are ``m2m_100``.) Token embeddings are scaled by sqrt(d_model) when
``scale_embedding``. Fields that older transformers honoured (``normalize_before``,
``add_final_layer_norm``, ``normalize_embedding``, ``static_position_embeddings``, ...) are
accepted only with the value the class implies; any other field that would change the numbers is
a ValueError naming it, and so is an unknown field. No torch, no transformers: the config files are
JSON, the weights safetensors (sharded or not, float16 / bfloat16 widened) read by
:mod:`fastattn.io.huggingface`.
"""
import warnings

import numpy as np

from .._validation import check_positive_int
from ..generation.config import GENERATION_FIELDS, single_id
from .family import Entry, Family

__all__ = ["BartFamily", "MBartFamily", "PegasusFamily", "M2M100Family", "BART", "MBART",
           "PEGASUS", "M2M100", "name_map"]

# config.json fields with no effect on inference (training knobs, bookkeeping)
IGNORED = {
    "_name_or_path", "architectures", "transformers_version", "dtype", "torch_dtype", "dropout",
    "attention_dropout", "activation_dropout", "encoder_layerdrop", "decoder_layerdrop",
    "init_std", "use_cache", "id2label", "label2id", "num_labels", "classif_dropout",
    "classifier_dropout", "num_hidden_layers", "gradient_checkpointing",
    "output_attentions", "output_hidden_states", "return_dict", "problem_type",
    "tokenizer_class", "prefix", "task_specific_params", "chunk_size_feed_forward",
    "pruned_heads", "torchscript", "output_scores", "return_dict_in_generate",
    "extra_pos_embeddings", "is_encoder_decoder", "tf_legacy_loss", "use_bfloat16",
    "finetuning_task", "sep_token_id", "cross_attention_hidden_size", "model_type",
    "add_cross_attention", "tie_encoder_decoder", "_attn_implementation_autoset",
    "_commit_hash", "decoder_vocab_size", "bos_token_id", "max_length", "num_beams",
    "early_stopping", "length_penalty", "no_repeat_ngram_size", "forced_bos_token_id",
    "min_length", "max_new_tokens", "num_return_sequences", "do_sample",
    "add_bias_logits", "normalize_before", "normalize_embedding", "add_final_layer_norm",
    "static_position_embeddings", "is_decoder", "scale_embedding",
}
IGNORED -= GENERATION_FIELDS        # read as the checkpoint's generation settings instead

_POSITIVE = ("vocab_size", "d_model", "encoder_layers", "decoder_layers",
             "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim",
             "decoder_ffn_dim", "max_position_embeddings")


class BartFamily(Family):
    """BART: post-norm layers, an embedding LayerNorm, learned positions offset by 2."""

    kind = "seq2seq"
    model_type = "bart"
    title = "BART"
    tokenizer = None          # the tokenizer files it insists on (load_tokenizer's family=)
    spm_tokenizer = None      # the SentencePiece pipeline of a folder without tokenizer.json
    # what the transformers class computes (Seq2SeqTransformer keywords)
    architecture = {"normalize_before": False, "layernorm_embedding": True,
                    "positions": "learned", "position_offset": 2}
    # old config fields: only the value the class implies
    fixed = {"normalize_before": False, "add_final_layer_norm": False,
             "normalize_embedding": True, "static_position_embeddings": False,
             "add_bias_logits": False, "is_decoder": False}
    # config.json defaults of the transformers config class
    defaults = {
        "vocab_size": 50265, "d_model": 1024, "encoder_layers": 12, "decoder_layers": 12,
        "encoder_attention_heads": 16, "decoder_attention_heads": 16, "encoder_ffn_dim": 4096,
        "decoder_ffn_dim": 4096, "activation_function": "gelu", "scale_embedding": False,
        "max_position_embeddings": 1024, "tie_word_embeddings": True, "pad_token_id": 1,
        "bos_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": 2,
    }
    extra_fields = ()         # further structure fields a subclass reads
    start_fallback = "bos_token_id"       # transformers' start token when the config names none

    @property
    def model_types(self):
        return (self.model_type,)

    def read_config(self, raw, where):
        """config.json (`raw`, read from `where`) -> the keywords of Seq2SeqTransformer, with
        the generation settings config.json itself holds as ``generation_config`` (used only
        without a generation_config.json)."""
        gen = {}
        for key, value in raw.items():
            if key in self.fixed:
                if value != self.fixed[key]:
                    raise ValueError(f"{where}: {key}={value!r} is not supported "
                                     f"({self.model_type} models use {key}={self.fixed[key]!r})")
            elif key in self.defaults or key in self.extra_fields or key in IGNORED:
                continue
            elif key in GENERATION_FIELDS:
                gen[key] = value
            else:
                raise ValueError(f"{where}: unknown config field {key!r}")
        cfg = {k: raw.get(k, d) for k, d in self.defaults.items()}
        for k in _POSITIVE:
            check_positive_int(cfg[k], f"{where}: {k}")
        for k in ("scale_embedding", "tie_word_embeddings"):
            if not isinstance(cfg[k], bool):
                raise ValueError(f"{where}: {k} must be true or false, got {cfg[k]!r}")
        ids = {k: single_id(cfg[k], k, where) for k in
               ("pad_token_id", "eos_token_id", "decoder_start_token_id", "bos_token_id")}
        if ids["decoder_start_token_id"] is None:
            ids["decoder_start_token_id"] = ids[self.start_fallback]
        for k in ("pad_token_id", "eos_token_id", "decoder_start_token_id"):
            if ids[k] is None:
                raise ValueError(f"{where}: {k} must be set for generation")
        out = {k: cfg[k] for k in _POSITIVE + ("activation_function", "scale_embedding",
                                                "tie_word_embeddings")}
        out.update(decoder_vocab_size=cfg["vocab_size"], share_encoder_decoder_embeddings=True,
                   pad_token_id=ids["pad_token_id"], eos_token_id=ids["eos_token_id"],
                   decoder_start_token_id=ids["decoder_start_token_id"], layer_norm_eps=1e-5,
                   model_type=self.model_type, **self.architecture)
        if "forced_eos_token_id" in raw:
            gen["forced_eos_token_id"] = raw["forced_eos_token_id"]
        out = self.adjust(raw, out, where)
        out["generation_config"] = gen
        return out

    def adjust(self, raw, config, where):
        """A subclass's own config fields."""
        return config

    # the checkpoint's names (module functions below; T5 has its own)
    @staticmethod
    def name_map(config):
        return name_map(config)

    @staticmethod
    def state_dict(weights, config):
        return checkpoint_state_dict(weights, config)

    @staticmethod
    def untie(config, weights, path):
        untie_differing_copies(config, weights, path)


class MBartFamily(BartFamily):
    """mBART (and mBART-50): pre-norm layers with final LayerNorms, embedding LayerNorm."""

    model_type = "mbart"
    title = "mBART / mBART-50"
    spm_tokenizer = "mbart"
    architecture = dict(BartFamily.architecture, normalize_before=True)
    fixed = dict(BartFamily.fixed, normalize_before=True, add_final_layer_norm=True)
    defaults = dict(BartFamily.defaults, decoder_start_token_id=None)


class PegasusFamily(BartFamily):
    """Pegasus: pre-norm layers with final LayerNorms, Marian's sinusoids, no embedding norm."""

    model_type = "pegasus"
    title = "Pegasus"
    spm_tokenizer = "pegasus"
    architecture = {"normalize_before": True, "layernorm_embedding": False,
                    "positions": "marian", "position_offset": 0}
    fixed = dict(BartFamily.fixed, normalize_before=True, add_final_layer_norm=True,
                 normalize_embedding=False, static_position_embeddings=True)
    defaults = dict(BartFamily.defaults, pad_token_id=0, eos_token_id=1,
                    decoder_start_token_id=0, bos_token_id=None)


class M2M100Family(BartFamily):
    """M2M100 and NLLB-200: pre-norm layers with final LayerNorms, sinusoids counted from the
    pad id (padding tokens get a zero position vector), ReLU, scaled embeddings."""

    model_type = "m2m_100"
    title = "M2M100 / NLLB"
    tokenizer = "m2m_100"         # M2M100's files unless a tokenizer.json (NLLB's) is there
    spm_tokenizer = "nllb"
    architecture = {"normalize_before": True, "layernorm_embedding": False,
                    "positions": "fairseq", "position_offset": 0}
    fixed = {"is_decoder": False}
    defaults = dict(BartFamily.defaults, vocab_size=128112, activation_function="relu",
                    scale_embedding=True)


BART, MBART, PEGASUS, M2M100 = BartFamily(), MBartFamily(), PegasusFamily(), M2M100Family()


def name_map(c):
    """The name map (a list of :class:`~fastattn.models.family.Entry`) for the model's keywords
    `c`: each Hugging Face parameter's place in :class:`fastattn.Seq2SeqTransformer`'s network
    (``encoder_embed``, ``decoder_embed``, ``encoder``, ``decoder``, ``lm_head``), rows
    ``(a, b)`` of the nn parameter when the Hugging Face tensor is a block of it (q, k and v are
    one ``in_proj_weight``), and the Hugging Face shape (``final_logits_bias`` is (1, V)).

    The order is the one random initialisation draws in: the packed projections first, then
    every name in Hugging Face's order.
    """
    d, V, Vt = c["d_model"], c["vocab_size"], c["decoder_vocab_size"]
    qkv = ("q_proj", "k_proj", "v_proj")
    m = {}

    def proj(hf, nn, j):
        rows = (j * d, (j + 1) * d)
        m[f"{hf}.{qkv[j]}.weight"] = Entry(f"{hf}.{qkv[j]}.weight", f"{nn}.in_proj_weight",
                                           rows, (d, d))
        m[f"{hf}.{qkv[j]}.bias"] = Entry(f"{hf}.{qkv[j]}.bias", f"{nn}.in_proj_bias", rows, (d,))

    def put(hf, nn, shape):
        m.setdefault(hf, Entry(hf, nn, None, shape))

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
        P = c["max_position_embeddings"] + c.get("position_offset", 0)
        put("model.encoder.embed_positions.weight", "encoder_embed.position_weight", (P, d))
        put("model.decoder.embed_positions.weight", "decoder_embed.position_weight", (P, d))
    if c.get("layernorm_embedding"):
        for which in stacks:
            put(f"model.{which}.layernorm_embedding.weight", f"{which}_embed.norm.weight", (d,))
            put(f"model.{which}.layernorm_embedding.bias", f"{which}_embed.norm.bias", (d,))
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
    return list(m.values())


# the token tables' names: (shared, encoder copy, decoder copy, output projection)
EMBED_NAMES = ("model.shared.weight", "model.encoder.embed_tokens.weight",
               "model.decoder.embed_tokens.weight", "lm_head.weight")


def checkpoint_state_dict(weights, config, names=EMBED_NAMES):
    """Map the tensors of a checkpoint (a :class:`~fastattn.io.huggingface.Checkpoint`: nothing
    is read here but the copies compared) to the names Seq2SeqTransformer loads; returns a new
    Checkpoint.

    Handles the tied / shared variants: with ``share_encoder_decoder_embeddings`` the token
    embeddings are ``model.shared.weight`` (encoder and decoder copies, when given, must agree:
    a ValueError otherwise; from_pretrained unties copies that differ, as transformers does);
    with ``tie_word_embeddings`` the output projection is the decoder embedding. Fixed
    (sinusoidal) position tables are not parameters and are dropped; a missing
    ``final_logits_bias`` is zeros (as transformers loads it; M2M100 has none).
    """
    sd = weights.copy()
    if config["positions"] != "learned":
        for k in ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight",
                  "model.encoder.embed_positions.weights", "model.decoder.embed_positions.weights"):
            sd.discard(k)
    head = names[3]
    names = names[:3]
    if config["share_encoder_decoder_embeddings"]:
        given = [n for n in names if n in sd]
        if not given:
            raise ValueError(f"the checkpoint has no token embedding ({names[0]})")
        ref = given[0]
        for name in given[1:]:
            if name != names[0] and not sd.equal(name, ref):
                raise ValueError(f"{name} differs from {ref}: with "
                                 "share_encoder_decoder_embeddings the copies must agree (build "
                                 "with share_encoder_decoder_embeddings=False for separate ones)")
        if ref != names[0]:
            sd.alias(names[0], ref)
        for name in names[1:]:
            sd.discard(name)
    else:
        sd.discard(names[0])
    if config["tie_word_embeddings"]:
        sd.discard(head)
    if config["final_logits_bias"] and "final_logits_bias" not in sd:
        sd["final_logits_bias"] = np.zeros((1, config["decoder_vocab_size"]), np.float32)
    return sd


def untie_differing_copies(config, weights, path, names=EMBED_NAMES, warn=True):
    """Read tied weights as transformers (>= 5) does: a saved copy of a tied tensor that differs
    from its source is not tied to it (transformers warns and keeps the copy). The sources:
    model.shared for the encoder / decoder embeddings (share_encoder_decoder_embeddings), the
    decoder embedding for lm_head (tie_word_embeddings). Without tie_word_embeddings nothing is
    tied and each saved copy is used as it is. `weights`: a Checkpoint (names aliased, tensors
    compared block by block, nothing else read); `names`: the checkpoint's (shared, encoder
    copy, decoder copy, output projection)."""
    shared, enc, dec, head = names
    def differs(name, ref):
        return name in weights and ref is not None and ref in weights and \
            not weights.equal(name, ref)

    tie = config["tie_word_embeddings"]
    untied = []
    sh = shared if shared in weights else None
    if config["share_encoder_decoder_embeddings"]:
        copies = [n for n in (enc, dec) if differs(n, sh)]
        if copies:
            untied += copies
            config["share_encoder_decoder_embeddings"] = False
            for n in (enc, dec):
                if n not in weights:
                    weights.alias(n, sh)
            if tie:
                # the output projection stays tied to the shared table
                config["tie_word_embeddings"] = False
                if head not in weights:
                    weights.alias(head, sh)
        out_src = sh
    else:
        out_src = dec
    if tie and config["tie_word_embeddings"] and differs(head, out_src):
        untied.append(head)
        config["tie_word_embeddings"] = False
    if warn and tie and untied:
        warnings.warn(f"{path}: the saved {', '.join(untied)} differ from the tensors they are "
                      "tied to although tie_word_embeddings is true; each is used as saved (as "
                      "transformers loads them)", stacklevel=3)
