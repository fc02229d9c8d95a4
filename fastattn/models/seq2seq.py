"""Seq2SeqTransformer: token ids in, token ids out (encoder-decoder with KV-cached decoding).

Design:
- Parameters carry Hugging Face Marian names (``model.encoder.layers.0.self_attn.q_proj.weight``,
  ``lm_head.weight``, ``final_logits_bias`` ...) and torch's (out, in) layout, so that a
  ``MarianMTModel.state_dict()`` / ``model.safetensors`` loads by name. Internally q, k and v of
  every self-attention are ONE packed (3 d, d) matrix (one GEMM per layer), and k, v of every
  cross-attention one packed (2 d, d) matrix; the per-name arrays are views into them.
- Activations are C-contiguous (rows, d_model) matrices; heads are strided views handed to
  :func:`fastattn.scaled_dot_product_attention` as they are, and it writes its output through a
  strided view of a (rows, d_model) matrix, the heads side by side (no transposing copy).
- Dense maths goes through ``_dense`` only (packed linear layers, layer_norm, log_softmax).
- Decoding keeps a :class:`fastattn.generation.KVCache`: self-attention keys / values written in
  place at the step's position of buffers sized for the longest output; cross-attention keys /
  values computed once per source. The beams of one source share that source's cross keys and
  values: their queries are stacked on the query axis of one attention call.
"""
import math
import os
import warnings

import numpy as np

from ..functional import scaled_dot_product_attention as _sdpa
from ..io.huggingface import canonical_activation
from .._ops import _new_output
from .._validation import check_eps, check_option, check_seed, hf_attention_mask, to_numpy
from . import _dense as ops
from . import marian as _marian

__all__ = ["Seq2SeqTransformer", "positions_table"]

_POSITIONS = ("marian", "interleaved", "learned")
_SMALL = 1 << 16          # elements below which an elementwise pass runs on one thread



def positions_table(n_positions, d_model, layout="marian", dtype=np.float32):
    """Sinusoidal position table (n_positions, d_model).

    ``"marian"``: sin(p * w_i) in columns [0, d/2), cos(p * w_i) in [d/2, d) with
    w_i = 10000 ** (-2 i / d) (transformers' MarianSinusoidalPositionalEmbedding, including its
    float32 rounding of the table); ``"interleaved"``: the paper's layout, sin in even columns,
    cos in odd ones (``fastattn.sinusoidal_positions``).
    """
    pos = np.arange(n_positions, dtype=np.float64)[:, None]
    j = np.arange(d_model)
    # p / 10000 ** (2 (j // 2) / d), evaluated like transformers (a division, in float64)
    angle = pos / np.power(10000, 2 * (j // 2) / d_model)
    if layout == "marian":
        half = d_model // 2 if d_model % 2 == 0 else d_model // 2 + 1
        out = np.empty((n_positions, d_model), np.float64)
        out[:, :half] = np.sin(angle[:, 0::2])
        out[:, half:] = np.cos(angle[:, 1::2])
        return out.astype(np.float32).astype(dtype)
    if layout == "interleaved":
        out = np.empty((n_positions, d_model), np.float64)
        out[:, 0::2] = np.sin(angle[:, 0::2])
        out[:, 1::2] = np.cos(angle[:, 1::2])
        return out.astype(dtype)
    raise ValueError(f"positions must be one of {_POSITIONS}, got {layout!r}")


def _pos_int(v, name):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"{name} must be a positive integer, got {v!r}")
    return int(v)


def _id(v, name, vocab, allow_none=False):
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < vocab:
        raise ValueError(f"{name} must be a token id in [0, {vocab}), got {v!r}")
    return int(v)


def _untie_differing_copies(config, weights, path):
    """Read tied weights as transformers (>= 5) does: a saved copy of a tied tensor that differs
    from its source is not tied to it (transformers warns and keeps the copy). The sources:
    model.shared for the encoder / decoder embeddings (share_encoder_decoder_embeddings), the
    decoder embedding for lm_head (tie_word_embeddings). Without tie_word_embeddings nothing is
    tied and each saved copy is used as it is."""
    def differs(name, ref):
        w = weights.get(name)
        return w is not None and ref is not None and (w.shape != ref.shape
                                                      or not np.array_equal(w, ref))

    tie = config["tie_word_embeddings"]
    untied = []
    sh = weights.get("model.shared.weight")
    if config["share_encoder_decoder_embeddings"]:
        stacks = [w for w in ("encoder", "decoder") if differs(f"model.{w}.embed_tokens.weight", sh)]
        if stacks:
            untied += [f"model.{w}.embed_tokens.weight" for w in stacks]
            config["share_encoder_decoder_embeddings"] = False
            for w in ("encoder", "decoder"):
                weights.setdefault(f"model.{w}.embed_tokens.weight", sh)
            if tie:
                # the output projection stays tied to model.shared
                config["tie_word_embeddings"] = False
                weights.setdefault("lm_head.weight", sh)
        out_src = sh
    else:
        out_src = weights.get("model.decoder.embed_tokens.weight")
    if tie and config["tie_word_embeddings"] and differs("lm_head.weight", out_src):
        untied.append("lm_head.weight")
        config["tie_word_embeddings"] = False
    if tie and untied:
        warnings.warn(f"{path}: the saved {', '.join(untied)} differ from the tensors they are "
                      "tied to although tie_word_embeddings is true; each is used as saved (as "
                      "transformers loads them)", stacklevel=3)


class _Attn:
    """One attention block: qkv (self, packed (3d, d)) or q + kv (cross, kv packed (2d, d)),
    the output projection o, and the block's layer norm."""
    __slots__ = ("qkv", "q", "kv", "o", "ln_g", "ln_b")


class _Layer:
    __slots__ = ("self_attn", "cross_attn", "fc1", "fc2", "ln_g", "ln_b")


class Seq2SeqTransformer:
    """Encoder-decoder Transformer for translation-style generation (Marian layout).

    Parameters
    ----------
    vocab_size : int
        Source (and, when shared, target) vocabulary.
    d_model, encoder_layers, decoder_layers, encoder_attention_heads, decoder_attention_heads,
    encoder_ffn_dim, decoder_ffn_dim : int
    activation_function : {'relu', 'gelu', 'swish', 'silu'}
    scale_embedding : bool
        Multiply token embeddings by sqrt(d_model).
    normalize_before : bool
        Pre-norm layers plus a final layer norm per stack (``model.encoder.layer_norm``,
        ``model.decoder.layer_norm``); Marian is post-norm (False).
    positions : {'marian', 'interleaved', 'learned'}
        Sinusoidal (Marian's half/half layout or the paper's interleaved one) or learned
        (``model.{encoder,decoder}.embed_positions.weight``).
    max_position_embeddings : int
    share_encoder_decoder_embeddings, tie_word_embeddings : bool
    decoder_vocab_size : int, optional
        Target vocabulary when the embeddings are not shared.
    pad_token_id, eos_token_id, decoder_start_token_id : int
        Defaults: pad = vocab_size - 1, eos = 0, start = pad (Marian's conventions).
    layer_norm_eps : float
    generation_config : dict, optional
        Generation defaults (transformers' names: num_beams, max_length, bad_words_ids,
        forced_eos_token_id, renormalize_logits, ...).
    seed : int
        Random initialisation (normal, std 1/sqrt(fan_in) for matrices and embeddings).
    dtype : float32 or float64

    Examples
    --------
    A translation round trip, offline, with the tokenizer of a local OPUS-MT directory
    (tokenisation stays with the user; ``sentencepiece`` or ``tokenizers`` both work)::

        import numpy as np, fastattn
        from transformers import MarianTokenizer        # or sentencepiece directly
        path = "opus-mt-en-de"                           # config.json, model.safetensors, ...
        tok = MarianTokenizer.from_pretrained(path)
        model = fastattn.Seq2SeqTransformer.from_pretrained(path)
        batch = tok(["Where is the bus stop?", "Thank you."], return_tensors="np", padding=True)
        ids = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"],
                             max_new_tokens=64)        # num_beams etc. from the checkpoint
        print(tok.batch_decode(ids, skip_special_tokens=True))

    Built in code (random weights):

    >>> m = Seq2SeqTransformer(vocab_size=50, d_model=16, encoder_layers=1, decoder_layers=1,
    ...                        encoder_attention_heads=2, decoder_attention_heads=2,
    ...                        encoder_ffn_dim=32, decoder_ffn_dim=32, seed=0)
    >>> out = m.generate(np.array([[5, 6, 7, 0]]), max_new_tokens=4)
    >>> out.shape[0], out[0, 0] == m.decoder_start_id, out.dtype
    (1, np.True_, dtype('int64'))
    """

    def __init__(self, vocab_size=32000, d_model=512, encoder_layers=6, decoder_layers=6,
                 encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
                 decoder_ffn_dim=2048, activation_function="relu", scale_embedding=True,
                 normalize_before=False, positions="marian", max_position_embeddings=512,
                 share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
                 decoder_vocab_size=None, pad_token_id=None, eos_token_id=0,
                 decoder_start_token_id=None, layer_norm_eps=1e-5, generation_config=None, *,
                 seed=0, dtype=np.float32, _state_dict=None):
        if dtype is None:              # np.dtype(None) would be float64
            raise TypeError("dtype must be float32 or float64, got None")
        try:
            dt = np.dtype(dtype)
        except TypeError:
            raise TypeError(f"dtype must be float32 or float64, got {dtype!r}") from None
        if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise TypeError(f"dtype must be float32 or float64, got {dt}")
        V = _pos_int(vocab_size, "vocab_size")
        shared = check_option(share_encoder_decoder_embeddings, "share_encoder_decoder_embeddings")
        Vt = V if (shared or decoder_vocab_size is None) else _pos_int(decoder_vocab_size,
                                                                       "decoder_vocab_size")
        d = _pos_int(d_model, "d_model")
        cfg = {
            "vocab_size": V, "decoder_vocab_size": Vt, "d_model": d,
            "encoder_layers": _pos_int(encoder_layers, "encoder_layers"),
            "decoder_layers": _pos_int(decoder_layers, "decoder_layers"),
            "encoder_attention_heads": _pos_int(encoder_attention_heads, "encoder_attention_heads"),
            "decoder_attention_heads": _pos_int(decoder_attention_heads, "decoder_attention_heads"),
            "encoder_ffn_dim": _pos_int(encoder_ffn_dim, "encoder_ffn_dim"),
            "decoder_ffn_dim": _pos_int(decoder_ffn_dim, "decoder_ffn_dim"),
            "activation_function": activation_function,
            "scale_embedding": check_option(scale_embedding, "scale_embedding"),
            "normalize_before": check_option(normalize_before, "normalize_before"),
            "positions": positions,
            "max_position_embeddings": _pos_int(max_position_embeddings, "max_position_embeddings"),
            "share_encoder_decoder_embeddings": shared,
            "tie_word_embeddings": check_option(tie_word_embeddings, "tie_word_embeddings"),
            "layer_norm_eps": check_eps(layer_norm_eps, "layer_norm_eps"),
        }
        canonical_activation(activation_function, "activation_function")
        if positions not in _POSITIONS:
            raise ValueError(f"positions must be one of {_POSITIONS}, got {positions!r}")
        for which in ("encoder", "decoder"):
            h = cfg[f"{which}_attention_heads"]
            if d % h:
                raise ValueError(f"d_model={d} is not divisible by {which}_attention_heads={h}")
        pad = Vt - 1 if pad_token_id is None else _id(pad_token_id, "pad_token_id", min(V, Vt))
        cfg["pad_token_id"] = pad
        cfg["eos_token_id"] = _id(eos_token_id, "eos_token_id", Vt)
        cfg["decoder_start_token_id"] = (pad if decoder_start_token_id is None else
                                         _id(decoder_start_token_id, "decoder_start_token_id", Vt))
        self._config = cfg
        if generation_config is not None and not isinstance(generation_config, dict):
            raise TypeError(f"generation_config must be a dict, got "
                            f"{type(generation_config).__name__}")
        gen = _marian.check_generation_config(dict(generation_config or {}), "generation_config")
        _marian.check_generation_ids(gen, cfg, "generation_config")
        self.generation_config = gen
        self._dtype = dt
        self._build(seed, _state_dict)

    # ---------------------------------------------------------------------------------------
    # parameters
    # ---------------------------------------------------------------------------------------

    def _param_shapes(self):
        """Every parameter name -> shape (HF Marian names)."""
        c = self._config
        d, V, Vt = c["d_model"], c["vocab_size"], c["decoder_vocab_size"]
        shapes = {}
        if c["share_encoder_decoder_embeddings"]:
            shapes["model.shared.weight"] = (V, d)
        else:
            shapes["model.encoder.embed_tokens.weight"] = (V, d)
            shapes["model.decoder.embed_tokens.weight"] = (Vt, d)
        if not c["tie_word_embeddings"]:
            shapes["lm_head.weight"] = (Vt, d)
        shapes["final_logits_bias"] = (1, Vt)
        if c["positions"] == "learned":
            P = c["max_position_embeddings"]
            shapes["model.encoder.embed_positions.weight"] = (P, d)
            shapes["model.decoder.embed_positions.weight"] = (P, d)
        for which in ("encoder", "decoder"):
            f = c[f"{which}_ffn_dim"]
            blocks = ["self_attn"] + (["encoder_attn"] if which == "decoder" else [])
            for i in range(c[f"{which}_layers"]):
                p = f"model.{which}.layers.{i}."
                for blk in blocks:
                    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                        shapes[f"{p}{blk}.{proj}.weight"] = (d, d)
                        shapes[f"{p}{blk}.{proj}.bias"] = (d,)
                    shapes[f"{p}{blk}_layer_norm.weight"] = (d,)
                    shapes[f"{p}{blk}_layer_norm.bias"] = (d,)
                shapes[f"{p}fc1.weight"] = (f, d)
                shapes[f"{p}fc1.bias"] = (f,)
                shapes[f"{p}fc2.weight"] = (d, f)
                shapes[f"{p}fc2.bias"] = (d,)
                shapes[f"{p}final_layer_norm.weight"] = (d,)
                shapes[f"{p}final_layer_norm.bias"] = (d,)
            if c["normalize_before"]:
                shapes[f"model.{which}.layer_norm.weight"] = (d,)
                shapes[f"model.{which}.layer_norm.bias"] = (d,)
        return shapes

    def _build(self, seed, sd):
        c, dt = self._config, self._dtype
        d = c["d_model"]
        shapes = self._param_shapes()
        params = {}
        # packed projections: the per-name arrays are row blocks (views) of these
        for which in ("encoder", "decoder"):
            for i in range(c[f"{which}_layers"]):
                p = f"model.{which}.layers.{i}."
                w = np.empty((3 * d, d), dt)
                b = np.empty((3 * d,), dt)
                for j, proj in enumerate(("q_proj", "k_proj", "v_proj")):
                    params[f"{p}self_attn.{proj}.weight"] = w[j * d:(j + 1) * d]
                    params[f"{p}self_attn.{proj}.bias"] = b[j * d:(j + 1) * d]
                if which == "decoder":
                    w = np.empty((2 * d, d), dt)
                    b = np.empty((2 * d,), dt)
                    for j, proj in enumerate(("k_proj", "v_proj")):
                        params[f"{p}encoder_attn.{proj}.weight"] = w[j * d:(j + 1) * d]
                        params[f"{p}encoder_attn.{proj}.bias"] = b[j * d:(j + 1) * d]
        for name, shape in shapes.items():
            if name not in params:
                params[name] = np.empty(shape, dt)
        self._params = params
        if sd is None:
            self._init_random(seed)
        else:
            self.load_state_dict(sd)
        self._bind()

    def _init_random(self, seed):
        rng = np.random.default_rng(check_seed(seed))
        for name, arr in self._params.items():
            if name.endswith("layer_norm.weight"):
                arr[...] = 1.0
            elif name.endswith(".bias") or name == "final_logits_bias":
                arr[...] = 0.0
            else:                  # matrices and embeddings: unit-variance outputs
                arr[...] = rng.standard_normal(arr.shape) / math.sqrt(arr.shape[1])

    def state_dict(self):
        """Parameters by HF Marian name, as read-only views.

        The linear layers run on packed copies of these arrays, so writing into them could not
        change the model: they are read-only (an assignment raises ``ValueError``). To change
        weights, build a new dict (``{k: v.copy() ...}``), edit it and pass it to
        :meth:`load_state_dict`.
        """
        out = {}
        for k, v in self._params.items():
            view = v.view()
            view.flags.writeable = False
            out[k] = view
        return out

    def load_state_dict(self, state_dict):
        """Copy parameters in by name; shapes must match, every parameter must be given (if
        any entry is missing, misshapen or not floating point, nothing is changed).

        Accepts NumPy arrays or torch tensors (converted with ``.detach().cpu().numpy()``).
        ``model.shared.weight`` may be given as the encoder / decoder ``embed_tokens`` copies,
        a tied ``lm_head.weight`` and saved position tables are ignored, a missing
        ``final_logits_bias`` is zeros (as transformers loads it).
        """
        if not hasattr(state_dict, "items"):
            raise TypeError("state_dict must be a mapping of names to arrays, got "
                            f"{type(state_dict).__name__}")
        sd = {}
        for k, v in state_dict.items():
            if hasattr(v, "detach") and hasattr(v, "numpy"):
                v = v.detach().cpu().numpy()
            sd[k] = np.asarray(v)
        sd = _marian.marian_state_dict(sd, self._config) if \
            self._config["positions"] != "learned" else self._learned_sd(sd)
        missing = [k for k in self._params if k not in sd]
        if missing:
            raise ValueError(f"state_dict is missing {len(missing)} parameter(s), e.g. "
                             f"{missing[:3]}")
        unexpected = [k for k in sd if k not in self._params]
        if unexpected:
            raise ValueError(f"state_dict has {len(unexpected)} unexpected key(s), e.g. "
                             f"{unexpected[:3]}")
        # every entry is checked before any is copied: a bad state_dict changes nothing
        for k, dst in self._params.items():
            src = sd[k]
            if src.shape != dst.shape:
                raise ValueError(f"{k}: shape {src.shape} does not match the model's {dst.shape}")
            if src.dtype.kind != "f":
                raise TypeError(f"{k}: expected floating-point values, got {src.dtype}")
        for k, dst in self._params.items():
            dst[...] = sd[k]
        if hasattr(self, "_layers"):
            self._bind()                 # the shim's layers may hold packed copies

    def _learned_sd(self, sd):
        pos = {k: sd.pop(k) for k in ("model.encoder.embed_positions.weight",
                                       "model.decoder.embed_positions.weight") if k in sd}
        sd = _marian.marian_state_dict(sd, self._config)
        sd.update(pos)
        return sd

    def _bind(self):
        """Resolve the parameter dict into per-layer objects used by the forward passes."""
        c, P = self._config, self._params
        d = c["d_model"]
        if c["share_encoder_decoder_embeddings"]:
            self._emb_enc = self._emb_dec = P["model.shared.weight"]
        else:
            self._emb_enc = P["model.encoder.embed_tokens.weight"]
            self._emb_dec = P["model.decoder.embed_tokens.weight"]
        self._w_out = self._emb_dec if c["tie_word_embeddings"] else P["lm_head.weight"]
        self._b_out = P["final_logits_bias"].reshape(-1)
        self._scale = self._dtype.type(math.sqrt(d) if c["scale_embedding"] else 1.0)
        if c["positions"] == "learned":
            self._pos_enc = P["model.encoder.embed_positions.weight"]
            self._pos_dec = P["model.decoder.embed_positions.weight"]
        else:
            try:
                self._pos_enc = self._pos_dec = positions_table(
                    c["max_position_embeddings"], d, c["positions"], self._dtype)
            except MemoryError:
                raise ValueError(
                    f"max_position_embeddings={c['max_position_embeddings']}: its "
                    f"({c['max_position_embeddings']}, {d}) position table does not fit in "
                    "memory") from None
        act = canonical_activation(c["activation_function"], "activation_function")
        self._out = ops.Linear(self._w_out, self._b_out)

        def attn(p, cross):
            a = _Attn()
            q = P[p + ".q_proj.weight"]
            if cross:
                a.q = ops.Linear(q, P[p + ".q_proj.bias"])
                a.kv = ops.Linear(P[p + ".k_proj.weight"].base, P[p + ".k_proj.bias"].base)
            else:
                a.qkv = ops.Linear(q.base, P[p + ".q_proj.bias"].base)
            a.o = ops.Linear(P[p + ".out_proj.weight"], P[p + ".out_proj.bias"])
            a.ln_g, a.ln_b = P[p + "_layer_norm.weight"], P[p + "_layer_norm.bias"]
            return a

        self._layers = {}
        for which in ("encoder", "decoder"):
            layers = []
            for i in range(c[f"{which}_layers"]):
                p = f"model.{which}.layers.{i}."
                L = _Layer()
                L.self_attn = attn(p + "self_attn", False)
                L.cross_attn = attn(p + "encoder_attn", True) if which == "decoder" else None
                L.fc1 = ops.Linear(P[p + "fc1.weight"], P[p + "fc1.bias"], activation=act)
                L.fc2 = ops.Linear(P[p + "fc2.weight"], P[p + "fc2.bias"])
                L.ln_g, L.ln_b = P[p + "final_layer_norm.weight"], P[p + "final_layer_norm.bias"]
                layers.append(L)
            self._layers[which] = layers
        if c["normalize_before"]:
            self._final_ln = {w: (P[f"model.{w}.layer_norm.weight"],
                                  P[f"model.{w}.layer_norm.bias"]) for w in ("encoder", "decoder")}

    # ---------------------------------------------------------------------------------------
    # construction
    # ---------------------------------------------------------------------------------------

    @classmethod
    def from_state_dict(cls, state_dict, dtype=np.float32, **config):
        """Build from a PyTorch-style state_dict (HF Marian names) and the architecture keywords."""
        return cls(**config, dtype=dtype, _state_dict=state_dict)

    @classmethod
    def from_pretrained(cls, path, dtype=np.float32):
        """Load a Hugging Face Marian directory (config.json, model.safetensors,
        generation_config.json when present). No torch or transformers needed."""
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"{path} is not a directory")
        config, legacy = _marian.read_config(path)
        gen = _marian.read_generation_config(path, legacy)
        weights = _marian.read_weights(path)
        _untie_differing_copies(config, weights, path)
        _marian.check_generation_ids(gen, config, os.path.join(
            path, "generation_config.json" if os.path.exists(
                os.path.join(path, "generation_config.json")) else "config.json"))
        return cls(**config, generation_config=gen, dtype=dtype, _state_dict=weights)

    # ---------------------------------------------------------------------------------------
    # attributes
    # ---------------------------------------------------------------------------------------

    @property
    def config(self):
        """The architecture keywords (a copy)."""
        return dict(self._config)

    @property
    def dtype(self):
        return self._dtype

    @property
    def vocab_size(self):
        """Target vocabulary (the logits' last dimension)."""
        return self._config["decoder_vocab_size"]

    @property
    def d_model(self):
        return self._config["d_model"]

    @property
    def pad_id(self):
        return self._config["pad_token_id"]

    @property
    def eos_id(self):
        return self._config["eos_token_id"]

    @property
    def decoder_start_id(self):
        g = self.generation_config.get("decoder_start_token_id")
        return self._config["decoder_start_token_id"] if g is None else g

    def __repr__(self):
        c = self._config
        return (f"Seq2SeqTransformer(d_model={c['d_model']}, layers={c['encoder_layers']}+"
                f"{c['decoder_layers']}, vocab={c['vocab_size']}, dtype={self._dtype})")

    # ---------------------------------------------------------------------------------------
    # input checks
    # ---------------------------------------------------------------------------------------

    def _check_ids(self, ids, name, vocab, ndim=2):
        if hasattr(ids, "detach") and hasattr(ids, "numpy"):
            ids = ids.detach().cpu().numpy()
        a = np.asarray(ids)
        if a.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold integer token ids, got dtype {a.dtype}")
        if a.ndim == ndim - 1:
            a = a[None]
        if a.ndim != ndim:
            raise ValueError(f"{name} must be {ndim}-D (batch, length), got shape {a.shape}")
        if a.size and (a.min() < 0 or a.max() >= vocab):
            bad = a[(a < 0) | (a >= vocab)].ravel()[0]
            raise ValueError(f"{name} holds token id {int(bad)} outside [0, {vocab})")
        return a.astype(np.int64, copy=False)

    def _check_source(self, input_ids, attention_mask):
        ids = self._check_ids(input_ids, "input_ids", self._config["vocab_size"])
        B, S = ids.shape
        if B == 0 or S == 0:
            raise ValueError(f"input_ids must have at least one row and one column, got "
                             f"{ids.shape}")
        if S > self._config["max_position_embeddings"]:
            raise ValueError(f"input_ids has {S} positions, more than max_position_embeddings="
                             f"{self._config['max_position_embeddings']}")
        if attention_mask is None:
            mask = ids != self.pad_id
            if self.pad_id == self.eos_id:
                mask[...] = True
        else:
            m = to_numpy(attention_mask)
            if m.ndim == 1 and ids.shape[0] == 1:
                m = m[None]
            mask = hf_attention_mask(m, ids.shape)
        return ids, mask

    # ---------------------------------------------------------------------------------------
    # forward passes
    # ---------------------------------------------------------------------------------------

    def _self_attention(self, a, x, B, T, H, kmask, causal, nthr, residual=None, norm=None):
        """x (B*T, d) -> attention output projected by W_O (+ residual), (B*T, d); with norm
        (gamma, beta, eps), its LayerNorm (post-norm, done inside the GEMM)."""
        d = x.shape[1]
        Dh = d // H
        heads = a.qkv(x, n_threads=nthr).reshape(B, T, 3, H, Dh)     # (B, T, 3, H, Dh)
        q = heads[:, :, 0].transpose(0, 2, 1, 3)                  # (B, H, T, Dh) views
        k = heads[:, :, 1].transpose(0, 2, 1, 3)
        v = heads[:, :, 2].transpose(0, 2, 1, 3)
        o = _new_output((B * T, d), x.dtype)    # the heads side by side, cache-line aligned
        _sdpa(q, k, v, kmask, is_causal=causal, n_threads=nthr,
              out=o.reshape(B, T, H, Dh).transpose(0, 2, 1, 3))
        return a.o(o, residual=residual, n_threads=nthr, norm=norm)

    def _ffn(self, L, x, nthr, residual=None, norm=None):
        return L.fc2(L.fc1(x, n_threads=nthr), residual=residual, n_threads=nthr, norm=norm)

    def _encode(self, ids, mask, nthr):
        """ids (B, S) int64, mask (B, S) bool (True = token) -> (B*S, d)."""
        c = self._config
        B, S = ids.shape
        d, H, eps = c["d_model"], c["encoder_attention_heads"], c["layer_norm_eps"]
        x = np.take(self._emb_enc, ids.reshape(-1), axis=0)      # (B*S, d)
        x *= self._scale
        x.reshape(B, S, d)[...] += self._pos_enc[:S]
        kmask = mask[:, None, None, :]                           # (B, 1, 1, S), True = attend
        pre = c["normalize_before"]
        for L in self._layers["encoder"]:
            a = L.self_attn
            if pre:
                h = ops.layer_norm(x, a.ln_g, a.ln_b, eps, n_threads=nthr)
                x = self._self_attention(a, h, B, S, H, kmask, False, nthr, residual=x)
                h = ops.layer_norm(x, L.ln_g, L.ln_b, eps, n_threads=nthr)
                x = self._ffn(L, h, nthr, residual=x)
            else:
                x = self._self_attention(a, x, B, S, H, kmask, False, nthr, residual=x,
                                         norm=(a.ln_g, a.ln_b, eps))
                x = self._ffn(L, x, nthr, residual=x, norm=(L.ln_g, L.ln_b, eps))
        if pre:
            g, b = self._final_ln["encoder"]
            x = ops.layer_norm(x, g, b, eps, n_threads=nthr)
        return x

    def encode(self, input_ids, attention_mask=None, *, n_threads=None):
        """Encoder output.

        Parameters
        ----------
        input_ids : int array (B, S)
        attention_mask : array (B, S), optional
            1/True = token, 0/False = padding; default: positions holding ``pad_id`` are padding.

        Returns
        -------
        ndarray (B, S, d_model) in the model dtype.
        """
        ids, mask = self._check_source(input_ids, attention_mask)
        return self._encode(ids, mask, n_threads).reshape(ids.shape[0], ids.shape[1], self.d_model)

    def _start_cache(self, memory, mask, group, max_len, nthr):
        """A KVCache for `group` rows per source, cross keys/values from memory (B*S, d)."""
        from ..generation.kv_cache import KVCache
        c = self._config
        B, S = mask.shape
        d, H = c["d_model"], c["decoder_attention_heads"]
        cache = KVCache(c["decoder_layers"], B * group, H, d // H, max_len, B, S, self._dtype)
        cache.n_threads = nthr
        for i, L in enumerate(self._layers["decoder"]):
            a = L.cross_attn
            kv = a.kv(memory, n_threads=nthr).reshape(B, S, 2, H, d // H)
            # one copy per source into (B, H, S, Dh) order: every step then reads each head's
            # keys and values as one contiguous block (the strided views of the GEMM output put
            # each 64-float key row 4 KiB from the next, ~20% slower per step)
            cache.set_cross(i, np.ascontiguousarray(kv[:, :, 0].transpose(0, 2, 1, 3)),
                            np.ascontiguousarray(kv[:, :, 1].transpose(0, 2, 1, 3)))
        cache.set_memory_mask(mask, group)
        return cache

    def _decode(self, cache, tokens, nthr):
        """Feed tokens (n, T) at positions [cache.length, cache.length + T) -> hidden (n*T, d).

        T > 1 only from an empty cache (teacher forcing: causal self-attention over the chunk).
        """
        c = self._config
        n, T = tokens.shape
        d, H, eps = c["d_model"], c["decoder_attention_heads"], c["layer_norm_eps"]
        Dh = d // H
        t0 = cache.length
        if t0 + T > cache.max_len:
            raise ValueError(f"the cache holds {cache.max_len} positions; cannot feed position "
                             f"{t0 + T - 1}")
        x = np.take(self._emb_dec, tokens.reshape(-1), axis=0)   # (n*T, d)
        x *= self._scale
        x.reshape(n, T, d)[...] += self._pos_dec[t0:t0 + T]
        pre = c["normalize_before"]
        n_src, g = cache.n_src, cache.group
        # a decode step's layer norms are microseconds of work: one thread, no hand-over to a
        # second one (which cost ~1 ms per call on the busy 2-core machine). Single-thread GEMMs
        # and attentions helped there only under heavy load and lost at load ~2: not done.
        ln_thr = 1 if n * T * d <= _SMALL else nthr
        for i, L in enumerate(self._layers["decoder"]):
            # -- self-attention over the cache ------------------------------------------------
            a = L.self_attn
            h = ops.layer_norm(x, a.ln_g, a.ln_b, eps, n_threads=ln_thr) if pre else x
            qkv = a.qkv(h, n_threads=nthr).reshape(n, T, 3, H, Dh)
            k_all, v_all = cache.append(i, qkv[:, :, 1], qkv[:, :, 2])   # (n, H, t0+T, Dh)
            q = qkv[:, :, 0].transpose(0, 2, 1, 3)                          # (n, H, T, Dh)
            o = _new_output((n * T, d), x.dtype)                          # heads side by side
            _sdpa(q, k_all, v_all, is_causal=T > 1, n_threads=nthr,
                  out=o.reshape(n, T, H, Dh).transpose(0, 2, 1, 3))
            x = a.o(o, residual=x, n_threads=nthr, norm=None if pre else (a.ln_g, a.ln_b, eps))
            # -- cross-attention: the g rows of one source share its keys / values ------------
            a = L.cross_attn
            h = ops.layer_norm(x, a.ln_g, a.ln_b, eps, n_threads=ln_thr) if pre else x
            q = a.q(h, n_threads=nthr)                # (n*T, d)
            q = q.reshape(n_src, g * T, H, Dh).transpose(0, 2, 1, 3)        # (B, H, g*T, Dh)
            ck, cv = cache.cross(i)                                          # (B, H, S, Dh)
            o = _new_output((n * T, d), x.dtype)
            _sdpa(q, ck, cv, cache.memory_mask, n_threads=nthr,
                  out=o.reshape(n_src, g * T, H, Dh).transpose(0, 2, 1, 3))
            x = a.o(o, residual=x, n_threads=nthr, norm=None if pre else (a.ln_g, a.ln_b, eps))
            # -- feed-forward -------------------------------------------------------------------
            h = ops.layer_norm(x, L.ln_g, L.ln_b, eps, n_threads=ln_thr) if pre else x
            x = self._ffn(L, h, nthr, residual=x, norm=None if pre else (L.ln_g, L.ln_b, eps))
        if pre:
            gm, bt = self._final_ln["decoder"]
            x = ops.layer_norm(x, gm, bt, eps, n_threads=ln_thr)
        cache.advance(T)
        return x

    def _project(self, hidden, nthr=None):
        """hidden (N, d) -> logits (N, vocab) = hidden @ W_out.T + final_logits_bias."""
        return self._out(hidden, n_threads=nthr)

    def logits(self, input_ids, decoder_input_ids, attention_mask=None, *, n_threads=None):
        """Teacher-forced logits.

        Parameters
        ----------
        input_ids : int array (B, S)
        decoder_input_ids : int array (B, T) (usually the start token then the target)
        attention_mask : array (B, S), optional

        Returns
        -------
        ndarray (B, T, vocab_size)
        """
        ids, mask = self._check_source(input_ids, attention_mask)
        dec = self._check_ids(decoder_input_ids, "decoder_input_ids", self.vocab_size)
        B, T = dec.shape
        if B != ids.shape[0]:
            raise ValueError(f"decoder_input_ids has {B} rows, input_ids {ids.shape[0]}")
        if T == 0 or T > self._config["max_position_embeddings"]:
            raise ValueError(f"decoder_input_ids length must be in [1, "
                             f"{self._config['max_position_embeddings']}], got {T}")
        memory = self._encode(ids, mask, n_threads)
        cache = self._start_cache(memory, mask, 1, T, n_threads)
        h = self._decode(cache, dec, n_threads)
        return self._project(h, n_threads).reshape(B, T, self.vocab_size)

    # ---------------------------------------------------------------------------------------
    # step API and generation
    # ---------------------------------------------------------------------------------------

    def start(self, input_ids=None, attention_mask=None, *, encoder_output=None, num_beams=1,
              max_length=None, n_threads=None):
        """Begin incremental decoding; returns a :class:`fastattn.generation.DecoderState`.

        Give either ``input_ids`` (encoded here) or ``encoder_output`` (B, S, d_model) with its
        ``attention_mask``. Each source gets ``num_beams`` decoder rows (row ``b * num_beams + j``
        is beam j of source b). ``max_length`` bounds the tokens fed (default
        max_position_embeddings).
        """
        from ..generation.search import DecoderState
        return DecoderState(self, input_ids, attention_mask, encoder_output, num_beams,
                            max_length, n_threads)

    def generate(self, input_ids, attention_mask=None, *, max_new_tokens=None, min_new_tokens=None,
                 num_beams=None, length_penalty=None, early_stopping=None, suppress_tokens=None,
                 bad_words_ids=None, do_sample=False, temperature=None, top_k=None, top_p=None,
                 seed=None, n_threads=None):
        """Generate target token ids (transformers' ``generate`` semantics).

        Parameters
        ----------
        input_ids : int array (B, S)
        attention_mask : array (B, S), optional
            Default: positions holding ``pad_id`` are padding.
        max_new_tokens : int, optional
            Default: the checkpoint's ``max_length`` (counting the start token), else 20 new
            tokens (capped by max_position_embeddings), as transformers.
        min_new_tokens : int, optional
            EOS is forbidden before this many new tokens. Default: the checkpoint's
            ``min_new_tokens``, else its ``min_length`` (counting the start token), else 0.
        num_beams, length_penalty, early_stopping : beam search (defaults from the checkpoint's
            generation config, then 1 / 1.0 / False). ``early_stopping`` may be "never".
        suppress_tokens, bad_words_ids : token ids never generated / token sequences never
            completed (defaults: the checkpoint's).
        do_sample, temperature, top_k, top_p, seed : multinomial sampling (top_k defaults to 50
            as in transformers; ``seed`` makes it reproducible; row b draws from stream b of the
            seed, so rows that finish early or come later in the batch do not change it).
        n_threads : int, optional

        Returns
        -------
        ndarray int64 (B, 1 + T): the start token, then the generated tokens, ``pad_id`` after a
        row's EOS; T is the longest row's length.
        """
        from ..generation.search import generate
        return generate(self, input_ids, attention_mask, max_new_tokens=max_new_tokens,
                        min_new_tokens=min_new_tokens, num_beams=num_beams,
                        length_penalty=length_penalty, early_stopping=early_stopping,
                        suppress_tokens=suppress_tokens, bad_words_ids=bad_words_ids,
                        do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
                        seed=seed, n_threads=n_threads)
