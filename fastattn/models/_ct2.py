"""CTranslate2 folders as a source format: a ``model.bin`` of one of the specs
``ct2-transformers-converter`` writes, mapped back onto what fastattn's families read (the
Hugging Face tensor names and the model keywords), so that every model class loads such a
folder where it loads a Hugging Face one.

- ``WhisperSpec`` (faster-whisper folders) -> :class:`fastattn.WhisperModel`;
- ``TransformerSpec`` (Marian / OPUS-MT, BART, mBART, M2M100 / NLLB, Pegasus) ->
  :class:`fastattn.Seq2SeqTransformer`;
- ``TransformerEncoderSpec`` (BERT, MiniLM, RoBERTa, DistilBERT) -> :class:`fastattn.EncoderModel`.

What the converter did is undone by name: the fused query / key / value (``linear_0`` of a
self-attention, 3 d rows; ``linear_1`` of a cross-attention, 2 d rows) become the row blocks of
``q_proj``, ``k_proj``, ``v_proj``; ``gamma`` / ``beta`` are a LayerNorm's weight and bias; the
position tables (``position_encodings/encodings``) are read as learned tables whatever they
were (a sinusoid, an offset table: the converter writes the rows the model reads, and
CTranslate2 computes with those rows); an alias of the token embedding is a tied projection.
Marian's pad, which the converter removes (its decoder starts from a zero embedding instead), is
put back as a last row of zeros with a logit bias of float32's minimum (a probability of exactly
0: the distribution over the other tokens is CTranslate2's), and decoding starts from it.

Every scalar of the spec is read and checked (an unknown one, or a value fastattn does not
compute, is a ValueError naming the variable), and every variable must be used: an option the
spec would need and fastattn does not have (relative positions, rotary embeddings, multi-query
attention, a missing final norm ...) is refused by the name of its variable. CTranslate2's
config.json is read the same way (unknown fields refused), and the vocabulary must have one
token per embedding row.

Storage: float32, float16 and bfloat16 read as float32 exactly; int8 (int8, int8_float32,
int8_float16, int8_bfloat16) keeps its integers: each linear weight and token table is built
from them (:meth:`fastattn._quant.Int8Weight.from_int8`, scale ``1 / scale`` of the file) and the
folder loads as ``quantize="int8"`` whatever ``quantize`` says, as a fastattn int8 folder does
(there is no float form to load); an int8 tensor fastattn keeps in float (a token-type table,
CTranslate2's BERT pooler is not used at all) reads as ``w_q / scale``.
"""
import math
import os

import numpy as np

from .._quant import MAX_K, Int8Rows, Int8Weight
from ..io.huggingface import canonical_activation
from ..io.ctranslate2 import (BINARY_VERSION, LEGACY_ATTRIBUTES, Block, MappedCheckpoint,
                              ModelBin, is_ct2_folder, read_config, read_vocabulary)
from . import registry
from .bert import EncoderConfig
from .family import KINDS

__all__ = ["is_ct2_folder", "spec_kind", "family", "read_seq2seq", "read_encoder",
           "folder_quantize", "place_int8", "alignment", "source_attention",
           "replace_unknowns"]

_KINDS = {"WhisperSpec": "speech", "TransformerSpec": "seq2seq",
          "TransformerEncoderSpec": "encoder"}
# CTranslate2's activation enum (common_spec.Activation) -> Hugging Face names fastattn reads
_ACTIVATIONS = {0: "relu", 1: "gelu_new", 2: "silu", 3: "gelu"}
_ACT_NAMES = {4: "GELUSigmoid", 5: "Tanh", 6: "Sigmoid"}
# CTranslate2's config.json fields read (the others are refused by name)
_SEQ2SEQ_CONFIG = {"unk_token", "bos_token", "eos_token", "decoder_start_token",
                   "add_source_bos", "add_source_eos", "layer_norm_epsilon",
                   "multi_query_attention"}
_ENCODER_CONFIG = {"unk_token", "bos_token", "eos_token", "layer_norm_epsilon",
                   "multi_query_attention"}
_WHISPER_CONFIG = {"suppress_ids", "suppress_ids_begin", "lang_ids", "alignment_heads"}
# CTranslate2's decoding defaults (translate_batch: beam_size=2, max_decoding_length=256,
# min_decoding_length=1), the generation settings of a translation folder without a
# generation_config.json
_CT2_BEAMS, _CT2_MAX_DECODING, _CT2_MIN_DECODING = 2, 256, 1
# rows of the built-in sinusoid table given to a spec without a position table (CTranslate2
# grows its own on demand; 1024 = its translate_batch's max_input_length)
_SINUSOID_ROWS = 1024


class _Folder:
    """One CTranslate2 folder being mapped: its model.bin, config.json, the tensors mapped so
    far (a :class:`MappedCheckpoint`) and the variables used (every one must be)."""

    def __init__(self, path, kind=None):
        self.path = os.fspath(path)
        self.bin = ModelBin(os.path.join(self.path, "model.bin"))
        self.where = self.bin.path
        spec_kind_ = _KINDS[self.bin.spec]
        if kind is not None and spec_kind_ != kind:
            raise ValueError(f"{self.where} holds a {self.bin.spec}: load it with "
                             f"fastattn.{KINDS[spec_kind_]}, not fastattn.{KINDS[kind]}")
        self.config = read_config(self.path)
        self.ckpt = MappedCheckpoint(self.bin)
        self.used = set()

    # -- scalars and variables ----------------------------------------------------------------
    def scalar(self, name, allowed=None, default=None):
        """The scalar `name` (`default` when absent), checked against `allowed` (a tuple of
        values, or a function returning an error text or None)."""
        var = self.bin.resolve(name)
        if var is None:
            return default
        self.used.add(var)
        value = self.bin.scalar(name)
        if isinstance(allowed, tuple) and value not in allowed:
            raise ValueError(f"{self.where}: {name}={value!r} is not supported (fastattn reads "
                             f"{' or '.join(map(repr, allowed))})")
        if callable(allowed):
            why = allowed(value)
            if why:
                raise ValueError(f"{self.where}: {name}={value!r}: {why}")
        return value

    def has(self, name):
        return name in self.bin

    def shape(self, name):
        if name not in self.bin:
            raise ValueError(f"{self.where}: no variable {name!r}")
        return self.bin.shape(name)

    def put(self, hf, blocks, shape=None):
        """Map the Hugging Face name `hf` to `blocks` (variable names, Blocks)."""
        blocks = [b if isinstance(b, Block) else Block(b) for b in blocks]
        self.ckpt.add(hf, blocks, shape)
        for b in blocks:
            if b.var is not None:
                var = self.bin.resolve(b.var)
                self.used.add(var)
                scale = self.bin.scale_of(var)
                if scale is not None:
                    self.used.add(scale)

    def norm(self, hf, ct):
        self.put(f"{hf}.weight", [f"{ct}/gamma"])
        self.put(f"{hf}.bias", [f"{ct}/beta"])

    def linear(self, hf, ct, bias=True):
        self.put(f"{hf}.weight", [f"{ct}/weight"])
        if bias:
            self.bias(f"{hf}.bias", ct, None, self.shape(f"{ct}/weight")[0])

    def bias(self, hf, ct, rows, n):
        """``<ct>/bias`` (its rows), or zeros when the converter wrote none (an all-zero bias
        is left out of model.bin)."""
        if self.has(f"{ct}/bias"):
            self.put(hf, [Block(f"{ct}/bias", rows)])
        else:
            self.put(hf, [Block(None, n)])

    def split(self, hf_names, ct, d, biases=None):
        """The fused projection `ct` (len(hf_names) blocks of d rows) as one tensor per name;
        `biases`: which of them have a bias (default all); the others' bias rows must be 0."""
        w = self.shape(f"{ct}/weight")
        if w[0] != len(hf_names) * d:
            raise ValueError(f"{self.where}: {ct}/weight has {w[0]} rows, not "
                             f"{len(hf_names)} x d_model={d}")
        for j, hf in enumerate(hf_names):
            rows = (j * d, (j + 1) * d)
            self.put(f"{hf}.weight", [Block(f"{ct}/weight", rows)])
            if biases is None or biases[j]:
                self.bias(f"{hf}.bias", ct, rows, d)
            elif self.has(f"{ct}/bias"):
                b = self.ckpt.raw.read(self.bin.resolve(f"{ct}/bias"), rows)
                if np.any(b):
                    raise ValueError(f"{self.where}: {ct}/bias has non-zero rows {rows} where "
                                     f"the model has no bias ({hf})")

    def layers(self, side):
        """How many ``<side>/layer_N`` the file has (numbered from 0 without a gap)."""
        prefix = f"{side}/layer_"
        found = {int(n[len(prefix):].split("/")[0]) for n in self.bin.names()
                 if n.startswith(prefix) and n[len(prefix):].split("/")[0].isdigit()}
        if found != set(range(len(found))):
            raise ValueError(f"{self.where}: the {side} layers are numbered {sorted(found)}, "
                             "not 0 .. n-1")
        if not found:
            raise ValueError(f"{self.where}: no {side} layer")
        return len(found)

    def activation(self, name):
        act = self.scalar(name, lambda v: None if v in _ACTIVATIONS else
                          f"the activation {_ACT_NAMES.get(v, v)} is not supported",
                          default=0)             # absent (old revisions): CTranslate2's ReLU
        return _ACTIVATIONS[act]

    def config_fields(self, known):
        for key in self.config:
            if key not in known:
                raise ValueError(f"{os.path.join(self.path, 'config.json')}: field {key!r} is "
                                 "not supported")
        if self.config.get("multi_query_attention"):
            raise ValueError(f"{os.path.join(self.path, 'config.json')}: multi_query_attention"
                             "=true is not supported")

    def eps(self):
        eps = self.config.get("layer_norm_epsilon")
        if eps is None:
            return 1e-5                   # CTranslate2's default for a LayerNorm with a beta
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
            raise ValueError(f"{os.path.join(self.path, 'config.json')}: layer_norm_epsilon="
                             f"{eps!r} must be a positive number")
        return float(eps)

    def vocabulary(self, name, rows):
        """The tokens of the vocabulary file `name`, one per embedding row (CTranslate2 adds
        the unknown token when the file lacks it)."""
        tokens = read_vocabulary(self.path, name)
        if tokens is None:
            raise FileNotFoundError(f"{self.path} has no {name}.json or {name}.txt (CTranslate2's "
                                    "vocabulary)")
        unk = self.config.get("unk_token")
        if unk is not None and unk not in tokens:
            tokens = tokens + [unk]
        if len(tokens) != rows:
            raise ValueError(f"{self.path}: {name} has {len(tokens)} tokens, the embedding "
                             f"{rows} rows")
        return tokens

    def finish(self, ignored=()):
        """Every variable used (`ignored`: the ones fastattn has no use for)."""
        left = [n for n in self.bin.variables if n not in self.used and
                not any(n == i or n.startswith(i + "/") for i in ignored)]
        if left:
            raise ValueError(f"{self.where}: variable {left[0]!r} is not read by fastattn (a "
                             f"{self.bin.spec} option it does not support"
                             + (f"; {len(left) - 1} more" if len(left) > 1 else "") + ")")
        return self.ckpt


def _token_id(tokens, token, field, where):
    if token is None:
        return None
    if not isinstance(token, str):
        raise ValueError(f"{where}: {field}={token!r} must be a token")
    try:
        return tokens.index(token)
    except ValueError:
        raise ValueError(f"{where}: {field}={token!r} is not in the vocabulary") from None


def spec_kind(folder):
    """"speech", "seq2seq" or "encoder": the model class of the folder's spec."""
    return _KINDS[ModelBin(os.path.join(folder, "model.bin")).spec]


def family(folder, kind=None):
    """The registered family a CTranslate2 folder loads as (its spec, then its options: see
    :func:`read_seq2seq`); a spec of another kind than `kind` names the class that loads it."""
    f = _Folder(folder, kind)
    if f.bin.spec == "WhisperSpec":
        return registry.family("whisper")
    if f.bin.spec == "TransformerEncoderSpec":
        return registry.family("bert")
    return registry.family(_seq2seq_label(f))


# -- the decoder-side stacks -----------------------------------------------------------------------

def _stack(f, side, hf, n, d, cross, key_bias=True):
    """The layers of one side: HF names under `hf` ("model.encoder"), CTranslate2's under
    `side`; `cross`: decoder layers (a cross-attention); key_bias=False: Whisper's keys."""
    kb = (True, key_bias, True)
    for i in range(n):
        S, L = f"{side}/layer_{i}", f"{hf}.layers.{i}"
        f.split([f"{L}.self_attn.{p}_proj" for p in "qkv"], f"{S}/self_attention/linear_0", d, kb)
        f.linear(f"{L}.self_attn.out_proj", f"{S}/self_attention/linear_1")
        f.norm(f"{L}.self_attn_layer_norm", f"{S}/self_attention/layer_norm")
        if cross:
            f.linear(f"{L}.encoder_attn.q_proj", f"{S}/attention/linear_0")
            f.split([f"{L}.encoder_attn.{p}_proj" for p in "kv"], f"{S}/attention/linear_1", d,
                    kb[1:])
            f.linear(f"{L}.encoder_attn.out_proj", f"{S}/attention/linear_2")
            f.norm(f"{L}.encoder_attn_layer_norm", f"{S}/attention/layer_norm")
        f.linear(f"{L}.fc1", f"{S}/ffn/linear_0")
        f.linear(f"{L}.fc2", f"{S}/ffn/linear_1")
        f.norm(f"{L}.final_layer_norm", f"{S}/ffn/layer_norm")


def _decoder_scalars(f, pre_norm, zero_start=(0,)):
    """The decoder's options that must be neutral (no ALiBi, no sliding window ...)."""
    f.scalar("decoder/pre_norm", pre_norm)
    f.scalar("decoder/alibi", (0,))
    f.scalar("decoder/alibi_use_positive_positions", (0, 1))
    f.scalar("decoder/scale_alibi", (0, 1))
    f.scalar("decoder/alignment_layer")          # CTranslate2's default alignment for
    f.scalar("decoder/alignment_heads")          # return_attention: not used here
    return f.scalar("decoder/start_from_zero_embedding", zero_start, 0)


def _embed_scale(f, side, d):
    """Whether the token embeddings are scaled by sqrt(d_model) (CTranslate2's
    ``scale_embeddings``: a flag, or the factor itself; absent: scaled)."""
    name = f"{side}/scale_embeddings"
    if not f.has(name):
        return True
    kind = f.bin.kind(name)
    value = f.scalar(name)
    if kind == "int8":
        return bool(value)
    if value == 1.0:
        return False
    if np.float32(value) == np.float32(math.sqrt(d)):
        return True
    raise ValueError(f"{f.where}: {name}={value!r}: only 1 or sqrt(d_model)="
                     f"{math.sqrt(d):.6g} is supported")


# -- Whisper ---------------------------------------------------------------------------------------

def _read_whisper(f):
    """WhisperSpec -> (WhisperModel's keywords, its generation settings, the tensors)."""
    f.config_fields(_WHISPER_CONFIG)
    V, d = f.shape("decoder/embeddings/weight")
    n_enc, n_dec = f.layers("encoder"), f.layers("decoder")
    _decoder_scalars(f, (1,))
    if _embed_scale(f, "decoder", d):
        raise ValueError(f"{f.where}: decoder/scale_embeddings: a Whisper's token embeddings "
                         "are not scaled")
    act = f.activation("decoder/activation")
    if act != "gelu":
        raise ValueError(f"{f.where}: decoder/activation is {act}, not Whisper's GELU")
    heads = {s: f.scalar(f"{s}/num_heads", lambda v: None if v > 0 else "not positive")
             for s in ("encoder", "decoder")}
    for c in ("conv1", "conv2"):
        f.linear(f"model.encoder.{c}", f"encoder/{c}")
    f.put("model.encoder.embed_positions.weight", ["encoder/position_encodings/encodings"])
    f.norm("model.encoder.layer_norm", "encoder/layer_norm")
    _stack(f, "encoder", "model.encoder", n_enc, d, False, key_bias=False)
    f.put("model.decoder.embed_tokens.weight", ["decoder/embeddings/weight"])
    f.put("model.decoder.embed_positions.weight", ["decoder/position_encodings/encodings"])
    f.norm("model.decoder.layer_norm", "decoder/layer_norm")
    _stack(f, "decoder", "model.decoder", n_dec, d, True, key_bias=False)
    tied = f.bin.resolve("decoder/projection/weight") == f.bin.resolve("decoder/embeddings/weight")
    if not tied:
        f.put("proj_out.weight", ["decoder/projection/weight"])
    if f.has("decoder/projection/bias"):
        raise ValueError(f"{f.where}: decoder/projection/bias: a Whisper's output projection "
                         "has no bias")
    tokens = f.vocabulary("vocabulary", V)
    config = {
        "vocab_size": V, "num_mel_bins": f.shape("encoder/conv1/weight")[1], "d_model": d,
        "encoder_layers": n_enc, "decoder_layers": n_dec,
        "encoder_attention_heads": heads["encoder"], "decoder_attention_heads": heads["decoder"],
        "encoder_ffn_dim": f.shape("encoder/layer_0/ffn/linear_0/weight")[0],
        "decoder_ffn_dim": f.shape("decoder/layer_0/ffn/linear_0/weight")[0],
        "activation_function": "gelu",
        "max_source_positions": f.shape("encoder/position_encodings/encodings")[0],
        "max_target_positions": f.shape("decoder/position_encodings/encodings")[0],
        "tie_word_embeddings": tied, "layer_norm_eps": 1e-5,
    }
    gen = _whisper_generation(f, tokens, config)
    for k in ("pad_token_id", "eos_token_id", "decoder_start_token_id"):
        config[k] = gen[k]
    return config, gen, f.finish()


def _whisper_generation(f, tokens, config):
    """openai/whisper-*'s generation_config.json from the vocabulary's special tokens and
    CTranslate2's config.json (its suppress lists and alignment heads, which the converter
    copied from that file). Multilingual: a vocabulary of at least 51865 tokens (openai-
    whisper's rule; English-only checkpoints have 51864)."""
    where = os.path.join(f.path, "config.json")

    def tok(name, *older):
        for n in (name,) + older:
            if n in tokens:
                return tokens.index(n)
        raise ValueError(f"{f.path}: the vocabulary has no {name} (not a Whisper vocabulary)")

    eot, sot = tok("<|endoftext|>"), tok("<|startoftranscript|>")
    ids = {k: tok(f"<|{k}|>") for k in ("translate", "transcribe", "startoflm", "startofprev",
                                        "notimestamps")}
    ids["nospeech"] = tok("<|nospeech|>", "<|nocaptions|>")
    multilingual = config["vocab_size"] >= 51865
    gen = {"bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot,
           "decoder_start_token_id": sot, "max_initial_timestamp_index": 50,
           "max_length": config["max_target_positions"],
           "no_timestamps_token_id": ids["notimestamps"],
           "prev_sot_token_id": ids["startofprev"], "return_timestamps": False,
           "is_multilingual": multilingual}
    for key, field in (("suppress_tokens", "suppress_ids"),
                       ("begin_suppress_tokens", "suppress_ids_begin")):
        if f.config.get(field) is not None:
            gen[key] = f.config[field]
    if f.config.get("alignment_heads") is not None:
        gen["alignment_heads"] = f.config["alignment_heads"]
    if multilingual:
        langs = f.config.get("lang_ids")
        if langs is None:
            langs = range(sot + 1, ids["translate"])
        if not isinstance(langs, (list, range)) or not all(
                isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(tokens)
                for i in langs):
            raise ValueError(f"{where}: lang_ids must be a list of token ids")
        gen["lang_to_id"] = {tokens[i]: i for i in langs}
        gen["task_to_id"] = {"transcribe": ids["transcribe"], "translate": ids["translate"]}
        gen["forced_decoder_ids"] = [[1, None], [2, ids["transcribe"]]]
    else:
        gen["forced_decoder_ids"] = [[1, ids["notimestamps"]]]
    return gen


# -- Transformer encoder-decoders ------------------------------------------------------------------

def _seq2seq_label(f):
    """The family a TransformerSpec reads as (its Translator's tokenizer, its repr; the
    network is the file's whatever the label): BART / mBART have an embedding LayerNorm (post- /
    pre-norm); the other post-norm models are Marian's; Pegasus starts from its pad; the other
    pre-norm models are M2M100 / NLLB."""
    pre = f.bin.scalar("decoder/pre_norm", 1)
    if f.has("decoder/layernorm_embedding/gamma"):
        return "mbart" if pre else "bart"
    if not pre:
        return "marian"
    return "pegasus" if f.config.get("decoder_start_token") == "<pad>" else "m2m_100"


def _read_transformer(f):
    """TransformerSpec -> (Seq2SeqTransformer's keywords, generation settings, tensors)."""
    f.config_fields(_SEQ2SEQ_CONFIG)
    model_type = _seq2seq_label(f)
    pre = f.scalar("encoder/pre_norm", (0, 1), default=1)    # absent: CTranslate2's pre-norm
    zero = _decoder_scalars(f, (pre,), (0, 1))
    f.scalar("encoder/multi_query_attention", (0,))
    f.scalar("encoder/embeddings_merge")             # one source embedding: nothing to merge
    if f.has("encoder/embeddings_1/weight"):
        raise ValueError(f"{f.where}: encoder/embeddings_1: source factors (several source "
                         "embeddings) are not supported")
    act = {s: f.activation(f"{s}/activation") for s in ("encoder", "decoder")}
    if act["encoder"] != act["decoder"]:
        raise ValueError(f"{f.where}: the encoder's activation ({act['encoder']}) differs from "
                         f"the decoder's ({act['decoder']})")
    heads = {s: f.scalar(f"{s}/num_heads", lambda v: None if v > 0 else "not positive")
             for s in ("encoder", "decoder")}
    emb = {"encoder": "encoder/embeddings_0/weight", "decoder": "decoder/embeddings/weight"}
    V, d = f.shape(emb["encoder"])
    Vt = f.shape(emb["decoder"])[0]
    scale = {s: _embed_scale(f, s, d) for s in ("encoder", "decoder")}
    if scale["encoder"] != scale["decoder"]:
        raise ValueError(f"{f.where}: encoder/scale_embeddings and decoder/scale_embeddings "
                         "differ")
    shared = f.bin.resolve(emb["encoder"]) == f.bin.resolve(emb["decoder"])
    tied = f.bin.resolve("decoder/projection/weight") == f.bin.resolve(emb["decoder"])
    pad_rows = [Block(None, 1)] if zero else []          # Marian's pad, put back
    if zero and V != Vt:
        raise ValueError(f"{f.where}: a Marian model with source and target vocabularies of "
                         f"different sizes ({V}, {Vt}) is not supported")
    V, Vt = V + len(pad_rows), Vt + len(pad_rows)
    if shared:
        f.put("model.shared.weight", [emb["decoder"]] + pad_rows)
    else:
        f.put("model.encoder.embed_tokens.weight", [emb["encoder"]] + pad_rows)
        f.put("model.decoder.embed_tokens.weight", [emb["decoder"]] + pad_rows)
    if not tied:
        f.put("lm_head.weight", ["decoder/projection/weight"] + pad_rows)
    # the pad's logit: float32's minimum, a probability of exactly 0
    bias = [Block("decoder/projection/bias")] if f.has("decoder/projection/bias") else \
        [Block(None, Vt - len(pad_rows))]
    f.put("final_logits_bias", bias + [Block(None, 1, float(np.finfo(np.float32).min))] *
          len(pad_rows), (1, Vt))
    P = {}
    for s in ("encoder", "decoder"):
        if not f.has(f"{s}/position_encodings/encodings"):
            # no table in the file: CTranslate2's built-in sinusoids (OpenNMT-tf's models)
            table = ct2_sinusoids(_SINUSOID_ROWS, d)
            f.ckpt[f"model.{s}.embed_positions.weight"] = table
            P[s] = table.shape[0]
            continue
        P[s] = f.shape(f"{s}/position_encodings/encodings")[0]
        f.put(f"model.{s}.embed_positions.weight", [f"{s}/position_encodings/encodings"])
    if P["encoder"] != P["decoder"]:
        raise ValueError(f"{f.where}: the encoder's and decoder's position tables differ in "
                         f"length ({P['encoder']}, {P['decoder']})")
    ln_emb = {s: f.has(f"{s}/layernorm_embedding/gamma") for s in ("encoder", "decoder")}
    if ln_emb["encoder"] != ln_emb["decoder"]:
        raise ValueError(f"{f.where}: only one side has an embedding LayerNorm")
    for s in ("encoder", "decoder"):
        if ln_emb[s]:
            f.norm(f"model.{s}.layernorm_embedding", f"{s}/layernorm_embedding")
        if pre:
            if not f.has(f"{s}/layer_norm/gamma"):
                raise ValueError(f"{f.where}: {s}/layer_norm: a pre-norm stack without a final "
                                 "LayerNorm is not supported")
            f.norm(f"model.{s}.layer_norm", f"{s}/layer_norm")
    n = {s: f.layers(s) for s in ("encoder", "decoder")}
    _stack(f, "encoder", "model.encoder", n["encoder"], d, False)
    _stack(f, "decoder", "model.decoder", n["decoder"], d, True)
    cfg_path = os.path.join(f.path, "config.json")
    src_tokens, tgt_tokens = _seq2seq_vocabularies(f, V - len(pad_rows), Vt - len(pad_rows))
    eos = _token_id(tgt_tokens, f.config.get("eos_token", "</s>"), "eos_token", cfg_path)
    if zero:
        pad = start = Vt - 1
    else:
        start = _token_id(tgt_tokens, f.config.get("decoder_start_token", "<s>"),
                          "decoder_start_token", cfg_path)
        if start is None:
            raise ValueError(f"{cfg_path}: decoder_start_token is null (the target prefix names "
                             "the start token): not supported")
        pad = tgt_tokens.index("<pad>") if "<pad>" in tgt_tokens else eos
    config = {
        "vocab_size": V, "decoder_vocab_size": Vt, "d_model": d,
        "encoder_layers": n["encoder"], "decoder_layers": n["decoder"],
        "encoder_attention_heads": heads["encoder"], "decoder_attention_heads": heads["decoder"],
        "encoder_ffn_dim": f.shape("encoder/layer_0/ffn/linear_0/weight")[0],
        "decoder_ffn_dim": f.shape("decoder/layer_0/ffn/linear_0/weight")[0],
        "activation_function": act["encoder"], "scale_embedding": scale["encoder"],
        "normalize_before": bool(pre), "positions": "learned",
        "max_position_embeddings": P["encoder"], "position_offset": 0,
        "share_encoder_decoder_embeddings": shared, "tie_word_embeddings": tied,
        "pad_token_id": pad, "eos_token_id": eos, "decoder_start_token_id": start,
        "layer_norm_eps": f.eps(), "layernorm_embedding": ln_emb["encoder"],
        "model_type": model_type, "final_logits_bias": True,
    }
    gen = {"num_beams": _CT2_BEAMS, "max_length": min(P["decoder"], _CT2_MAX_DECODING + 1),
           "min_new_tokens": _CT2_MIN_DECODING}
    ignored = ()
    if f.bin.version < BINARY_VERSION:
        # CTranslate2 1.x / 2.x: the options at the top (revisions < 5), the tokens and flags
        # config.json holds now (read by read_config)
        f.scalar("with_relative_position", (0,))
        f.scalar("layernorm_embedding", (int(ln_emb["encoder"]),))
        ignored = LEGACY_ATTRIBUTES
    return config, gen, f.finish(ignored)


# -- CTranslate2's alignment (return_attention, replace_unknowns) -----------------------------

def alignment(folder, n_layers, n_heads):
    """(layer, [heads]) of a TransformerSpec folder's alignment: ``decoder/alignment_layer``
    (default -1, the last) and the first ``decoder/alignment_heads`` heads (default 1; 0: all),
    as CTranslate2's TransformerDecoder reads them."""
    mb = ModelBin(os.path.join(folder, "model.bin"))
    layer = int(mb.scalar("decoder/alignment_layer", -1))
    heads = int(mb.scalar("decoder/alignment_heads", 1)) or n_heads
    return layer % n_layers, list(range(min(heads, n_heads)))


def source_attention(rows, n_original, bos, eos):
    """CTranslate2's attention vectors of a hypothesis: each row (over the model's input
    positions) without the implicit BOS / EOS positions, cut or zero-padded to the original
    source length (its ``run_translation``)."""
    out = []
    for row in rows:
        v = np.asarray(row, np.float32)
        v = v[1:] if bos else v
        v = v[:-1] if eos else v
        out.append(np.concatenate([v[:n_original],
                                   np.zeros(max(n_original - v.size, 0), np.float32)]))
    return out


def replace_unknowns(tokens, source, vectors, unk):
    """CTranslate2's replace_unknowns: each `unk` of `tokens` becomes the `source` token its
    attention vector weighs most (the first of equal weights)."""
    return [source[int(np.argmax(vectors[t]))] if tok == unk and source else tok
            for t, tok in enumerate(tokens)]


def ct2_sinusoids(n, d):
    """CTranslate2's built-in position table (layers/common.cc, for a spec without one):
    row i is ``[sin((i + 1) t), cos((i + 1) t)]``, ``t_j = exp(-j log(10000) / (d / 2 - 1))``,
    in float32 as it computes it."""
    f32 = np.float32
    inc = f32(np.log(f32(10000.0)) / f32(d // 2 - 1))
    ts = np.exp((-inc) * np.arange(d // 2, dtype=f32)).astype(f32)
    t = (np.arange(1, n + 1, dtype=f32)[:, None] * ts[None, :]).astype(f32)
    return np.concatenate([np.sin(t), np.cos(t)], axis=1).astype(f32)


def _seq2seq_vocabularies(f, V, Vt):
    """(source tokens, target tokens): shared_vocabulary, else source_ and target_vocabulary."""
    shared = read_vocabulary(f.path, "shared_vocabulary")
    if shared is not None:
        if V != Vt:
            raise ValueError(f"{f.path}: one shared vocabulary for embeddings of {V} and {Vt} "
                             "rows")
        tokens = f.vocabulary("shared_vocabulary", V)
        return tokens, tokens
    if read_vocabulary(f.path, "source_vocabulary") is None:
        raise FileNotFoundError(f"{f.path} has no shared_vocabulary.json (or .txt, or source_ "
                                "and target_vocabulary): CTranslate2's vocabulary")
    return f.vocabulary("source_vocabulary", V), f.vocabulary("target_vocabulary", Vt)


def read_seq2seq(path, kind):
    """``(keywords, generation settings, tensors)`` of a CTranslate2 folder for the model class
    of `kind` ("seq2seq": Seq2SeqTransformer, "speech": WhisperModel), as
    :func:`fastattn.models._seq2seq_weights.read_checkpoint` gives them for a Hugging Face one;
    the tensors are a :class:`~fastattn.io.ctranslate2.MappedCheckpoint` under the Hugging
    Face names (read one at a time)."""
    f = _Folder(path, kind)
    return _read_whisper(f) if kind == "speech" else _read_transformer(f)


# -- encoders --------------------------------------------------------------------------------------

def read_encoder(path):
    """``(family, EncoderConfig, tensors)`` of a CTranslate2 TransformerEncoderSpec folder
    (BERT's network: post-norm layers, learned positions, an embedding LayerNorm, token types
    when the file has a second embedding; its pooler is not used: fastattn pools the hidden
    states). RoBERTa's and XLM-R's position tables were cut by the converter to start at the
    first token's row, so they read as BERT's (positions 0 .. S-1), as CTranslate2 computes
    them."""
    f = _Folder(path, "encoder")
    f.config_fields(_ENCODER_CONFIG)
    f.scalar("encoder/pre_norm", (0,))
    f.scalar("encoder/multi_query_attention", (0,))
    act = f.activation("encoder/activation")
    heads = f.scalar("encoder/num_heads", lambda v: None if v > 0 else "not positive")
    V, d = f.shape("encoder/embeddings_0/weight")
    if _embed_scale(f, "encoder", d):
        raise ValueError(f"{f.where}: encoder/scale_embeddings: scaled token embeddings are not "
                         "an encoder fastattn reads")
    types = 0
    if f.has("encoder/embeddings_1/weight"):
        f.scalar("encoder/embeddings_merge", (1,))        # the token types are added
        types = f.shape("encoder/embeddings_1/weight")[0]
        f.put("embeddings.token_type_embeddings.weight", ["encoder/embeddings_1/weight"])
    else:
        f.scalar("encoder/embeddings_merge")
    if f.has("encoder/embeddings_2/weight"):
        raise ValueError(f"{f.where}: encoder/embeddings_2: more than two source embeddings")
    f.put("embeddings.word_embeddings.weight", ["encoder/embeddings_0/weight"])
    f.put("embeddings.position_embeddings.weight", ["encoder/position_encodings/encodings"])
    f.norm("embeddings.LayerNorm", "encoder/layernorm_embedding")
    n = f.layers("encoder")
    for i in range(n):
        S, L = f"encoder/layer_{i}", f"encoder.layer.{i}"
        f.split([f"{L}.attention.self.{p}" for p in ("query", "key", "value")],
                f"{S}/self_attention/linear_0", d)
        f.linear(f"{L}.attention.output.dense", f"{S}/self_attention/linear_1")
        f.norm(f"{L}.attention.output.LayerNorm", f"{S}/self_attention/layer_norm")
        f.linear(f"{L}.intermediate.dense", f"{S}/ffn/linear_0")
        f.linear(f"{L}.output.dense", f"{S}/ffn/linear_1")
        f.norm(f"{L}.output.LayerNorm", f"{S}/ffn/layer_norm")
    f.vocabulary("vocabulary", V)
    cfg = EncoderConfig(
        model_type="bert", vocab_size=V, hidden_size=d, num_layers=n, num_heads=heads,
        intermediate_size=f.shape("encoder/layer_0/ffn/linear_0/weight")[0],
        activation=canonical_activation(act), hidden_act=act, layer_norm_eps=f.eps(),
        max_position_embeddings=f.shape("encoder/position_encodings/encodings")[0],
        type_vocab_size=types, pad_token_id=-1, positions_after_padding=False)
    if d % heads:
        raise ValueError(f"{f.where}: d_model={d} is not a multiple of encoder/num_heads="
                         f"{heads}")
    f.scalar("pooler_activation")
    return registry.family("bert"), cfg, f.finish(ignored=("pooler_dense",))


# -- loading hooks ---------------------------------------------------------------------------------

def folder_quantize(source, quantize, dtype, where):
    """The quantize a folder loads with: 'int8' for a CTranslate2 int8 folder (its integers
    are the model; ValueError for dtype float64 or another quantize), else `quantize`. `source`: the folder, or
    the tensors read from it."""
    if isinstance(source, (str, os.PathLike)):
        int8 = is_ct2_folder(source) and ModelBin(os.path.join(source, "model.bin")).quantized
    else:
        int8 = getattr(source, "quantized", False)
    if not int8:
        return quantize
    if quantize not in (None, "int8"):
        raise ValueError(f"quantize={quantize!r}: {where} holds int8 weights (CTranslate2 int8), "
                         "which load as int8 only (quantize=None or 'int8')")
    if dtype is not None and np.dtype(dtype) != np.float32:
        raise ValueError(f"dtype={np.dtype(dtype).name}: {where} holds int8 weights "
                         "(CTranslate2 int8), which compute in float32")
    return "int8"


def place_int8(tensors, entries, params):
    """Put the int8 weights of a CTranslate2 folder in place, keeping their integers: for each
    network parameter of `entries` (name-map Entries) that is a linear weight or a token table
    and whose every row comes from an int8 tensor of `tensors`, an Int8Weight / Int8Rows built
    from the stored integers and scales replaces the float parameter (and every parameter tied
    to it). `params`: network name -> (owner module, key) for the whole model. Returns the
    checkpoint names now in place (not to be read as float)."""
    if not hasattr(tensors, "int8"):
        return set()
    groups = {}
    for e in entries:
        groups.setdefault(e.network, []).append(e)
    done = set()
    for net, group in groups.items():
        owner, key = params[net]
        arr = owner._params[key]
        if not isinstance(arr, np.ndarray) or any(e.part is not None for e in group):
            continue
        linear = key in owner._LINEAR_PARAMS
        if not linear and key not in owner._EMBED_PARAMS:
            continue
        N, K = arr.shape[0], int(np.prod(arr.shape[1:]))
        q, s = np.zeros((N, K), np.int8), np.zeros(N, np.float32)
        filled = 0
        for e in group:
            got = tensors.int8(e.checkpoint)
            if got is None:
                break
            a, b = e.rows if e.rows is not None else (0, N)
            q[a:b] = got[0].reshape(b - a, K)
            s[a:b] = got[1]
            filled += b - a
        if filled != N:
            continue
        if linear and K > MAX_K:
            raise ValueError(f"{net} has in_features K={K}; int8 layers take K <= {MAX_K}")
        obj = Int8Weight.from_int8(q, s) if linear else Int8Rows(q, s)
        for o, k in params.values():                     # the parameter and its ties
            if o._params.get(k) is arr:
                if (k in o._LINEAR_PARAMS) == linear:
                    o._params[k] = obj
                elif linear:
                    o._params[k] = Int8Rows(obj.int8(), obj.scale[:N].copy())
                else:
                    o._params[k] = Int8Weight.from_rows(obj, net)
        done.update(e.checkpoint for e in group)
    return done
