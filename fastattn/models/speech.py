"""WhisperModel: log-mel features in, token ids out (OpenAI's Whisper on fastattn's network).

The network is fastattn.nn's, composed as :class:`~fastattn.Seq2SeqTransformer` composes it
(and this class is one: its KV-cached decoding, int8, streaming load, state_dict and saved
folders are that class's):

- the encoder's stem (:class:`_AudioStem`): two :class:`~fastattn.nn.conv.Conv1d` (num_mel_bins
  -> d_model, kernel 3, padding 1; d_model -> d_model, kernel 3, stride 2, padding 1), each an
  im2col GEMM with the exact GELU fused, plus the checkpoint's sinusoidal position table;
- a pre-norm :class:`~fastattn.nn.TransformerEncoder` and :class:`~fastattn.nn.TransformerDecoder`
  with final LayerNorms (the attention's k_proj has no bias: its rows of ``in_proj_bias`` are
  zeros), a token :class:`~fastattn.nn.Embedding` with learned positions, and the output
  projection tied to the token embedding (``proj_out``).

``from_pretrained`` reads Hugging Face Whisper folders (``model_type: whisper``: openai/whisper-
tiny ... large-v3, distil-whisper) without torch: config.json (every field that changes the
numbers is read; an unknown one is a ValueError naming it), model.safetensors (sharded too,
streamed in layer by layer) and generation_config.json (Whisper's fields: lang_to_id,
task_to_id, no_timestamps_token_id, forced_decoder_ids, begin_suppress_tokens ...).
``generate`` follows transformers' ``WhisperForConditionalGeneration.generate`` for clips of at
most 30 s (the rules: :mod:`fastattn.generation.whisper`).
"""
import math

import numpy as np

from .._memory import check_plan
from .._quant import check_quantize
from .._validation import (check_option, check_positive_int, check_real_input, check_token_ids,
                           to_numpy)
from ..generation.whisper import WindowDecoder, prompt_rows, split_segments
from ..io.huggingface import canonical_activation
from ..nn._masks import _KernelMask
from ..nn._module import _Init, _Module
from ..nn.conv import Conv1d
from ..nn.embedding import Embedding
from . import _seq2seq_spec, registry
from .seq2seq import Seq2SeqTransformer
from .whisper import FIXED, check_alignment_heads, check_whisper_generation, read_generation

__all__ = ["WhisperModel", "whisper_sinusoids"]

def whisper_sinusoids(length, channels, dtype=np.float32):
    """Whisper's encoder position table (length, channels): sin | cos halves of
    t * exp(-log(10000) / (channels / 2 - 1) * i) (what transformers initialises it to)."""
    inc = math.log(10000) / (channels // 2 - 1)
    t = np.arange(length, dtype=np.float64)[:, None] * np.exp(-inc * np.arange(channels // 2))
    return np.concatenate([np.sin(t), np.cos(t)], axis=1).astype(dtype)


class _AudioStem(_Module):
    """Whisper's encoder input: gelu(conv1(x)), gelu(conv2(.)) (stride 2), plus the position
    table (parameter ``position_weight``, (max_source_positions, d_model))."""

    def __init__(self, num_mel_bins, d_model, max_source_positions, *, dtype=np.float32,
                 _init=None):
        init = _init or _Init(0, dtype)
        self.conv1 = Conv1d(num_mel_bins, d_model, 3, padding=1, dtype=dtype, _init=init)
        self.conv2 = Conv1d(d_model, d_model, 3, stride=2, padding=1, dtype=dtype, _init=init)
        self._params = {"position_weight": init.xavier((max_source_positions, d_model))}
        self._children = {"conv1": self.conv1, "conv2": self.conv2}
        self._config = {"num_mel_bins": num_mel_bins, "d_model": d_model,
                        "max_source_positions": max_source_positions,
                        "dtype": np.dtype(dtype).name}

    def _forward(self, feats, n_threads=None):
        """feats (B, num_mel_bins, 2 * S) C-contiguous in the model dtype -> (B * S, d)."""
        B = feats.shape[0]
        h = self.conv1._forward(feats, False, "gelu", None, n_threads)       # (B * 2S, d)
        h = self.conv2._forward(h.reshape(B, -1, h.shape[1]), True, "gelu", None, n_threads)
        pos = self._params["position_weight"]
        h.reshape(B, pos.shape[0], -1)[...] += pos
        return h


class WhisperModel(Seq2SeqTransformer):
    """Whisper (speech recognition and translation): log-mel features in, token ids out.

    Parameters
    ----------
    vocab_size, num_mel_bins, d_model, encoder_layers, decoder_layers, encoder_attention_heads,
    decoder_attention_heads, encoder_ffn_dim, decoder_ffn_dim : int
        transformers' WhisperConfig fields (defaults: whisper-tiny's shapes).
    activation_function : str
        The layers' activation ('gelu'); the convolutions always use the exact GELU.
    max_source_positions : int
        Encoder positions (1500): the input is 2 * max_source_positions mel frames (30 s).
    max_target_positions : int
        Decoder positions (448), prompt and prefix included.
    tie_word_embeddings : bool
        proj_out is the token embedding (Whisper's checkpoints), else its own weight.
    pad_token_id, eos_token_id, decoder_start_token_id : int
    generation_config : dict, optional
        The checkpoint's generation settings (Whisper's fields included: lang_to_id,
        task_to_id, no_timestamps_token_id, forced_decoder_ids, suppress_tokens,
        begin_suppress_tokens, max_initial_timestamp_index ...).
    seed : int
        Random initialisation (the encoder's position table: Whisper's sinusoids).
    dtype : float32 or float64
    quantize : None, 'int8' or 'bfloat16'
        int8 linear layers (the convolutions' GEMMs and the output projection too).

    Examples
    --------
    Transcribing a clip with a local openai/whisper-* folder (features from transformers'
    WhisperFeatureExtractor, the text from its tokenizer)::

        import fastattn
        from transformers import WhisperProcessor
        proc = WhisperProcessor.from_pretrained("whisper-tiny")
        model = fastattn.WhisperModel.from_pretrained("whisper-tiny")
        feats = proc(audio, sampling_rate=16000, return_tensors="np").input_features
        ids = model.generate(feats, language="en")
        print(proc.batch_decode(ids, skip_special_tokens=True))

    Built in code (random weights):

    >>> m = WhisperModel(vocab_size=60, num_mel_bins=8, d_model=16, encoder_layers=1,
    ...                  decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
    ...                  encoder_ffn_dim=32, decoder_ffn_dim=32, max_source_positions=10,
    ...                  max_target_positions=16, pad_token_id=50, eos_token_id=50,
    ...                  decoder_start_token_id=51, seed=0)
    >>> m.encode(np.zeros((2, 8, 20), np.float32)).shape
    (2, 10, 16)
    """

    def __init__(self, vocab_size=51865, num_mel_bins=80, d_model=384, encoder_layers=4,
                 decoder_layers=4, encoder_attention_heads=6, decoder_attention_heads=6,
                 encoder_ffn_dim=1536, decoder_ffn_dim=1536, activation_function="gelu",
                 max_source_positions=1500, max_target_positions=448, tie_word_embeddings=True,
                 pad_token_id=50256, eos_token_id=50256, decoder_start_token_id=50257,
                 layer_norm_eps=1e-5, generation_config=None, *, seed=0, dtype=np.float32,
                 quantize=None, _state_dict=None, **fixed):
        for key, value in fixed.items():        # what config and saved folders carry back
            if key == "decoder_vocab_size" and value == vocab_size:
                continue
            if key not in FIXED:
                raise TypeError(f"WhisperModel() got an unexpected keyword argument {key!r}")
            if value != FIXED[key]:
                raise ValueError(f"{key}={value!r}: a Whisper has {key}={FIXED[key]!r}")
        dt = _seq2seq_spec.model_dtype(dtype)
        V = check_positive_int(vocab_size, "vocab_size")
        cfg = {k: check_positive_int(v, k) for k, v in (
            ("num_mel_bins", num_mel_bins), ("d_model", d_model),
            ("encoder_layers", encoder_layers), ("decoder_layers", decoder_layers),
            ("encoder_attention_heads", encoder_attention_heads),
            ("decoder_attention_heads", decoder_attention_heads),
            ("encoder_ffn_dim", encoder_ffn_dim), ("decoder_ffn_dim", decoder_ffn_dim),
            ("max_source_positions", max_source_positions),
            ("max_target_positions", max_target_positions))}
        for which in ("encoder", "decoder"):
            if cfg["d_model"] % cfg[f"{which}_attention_heads"]:
                raise ValueError(f"d_model={cfg['d_model']} is not divisible by "
                                 f"{which}_attention_heads={cfg[f'{which}_attention_heads']}")
        canonical_activation(activation_function, "activation_function")
        cfg.update(vocab_size=V, decoder_vocab_size=V, activation_function=activation_function,
                   tie_word_embeddings=check_option(tie_word_embeddings, "tie_word_embeddings"),
                   layer_norm_eps=float(layer_norm_eps), **FIXED,
                   share_encoder_decoder_embeddings=False, final_logits_bias=False,
                   positions="learned")
        for k, v in (("pad_token_id", pad_token_id), ("eos_token_id", eos_token_id),
                     ("decoder_start_token_id", decoder_start_token_id)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < V:
                raise ValueError(f"{k} must be a token id in [0, {V}), got {v!r}")
            cfg[k] = int(v)
        self._config = cfg
        gen = check_whisper_generation(dict(generation_config or {}), "generation_config", V)
        gen.setdefault("decoder_start_token_id", cfg["decoder_start_token_id"])
        self.generation_config = gen
        self._dtype = dt
        self._family = registry.family(cfg["model_type"], self._KIND)
        self._finish_init(seed, _state_dict, check_quantize(quantize, dt))

    _KIND = "speech"          # the registry's kind of the families this class runs
    # the keys of _config that are not constructor keywords (derived for inherited methods)
    _DERIVED = ("share_encoder_decoder_embeddings", "final_logits_bias", "positions")

    # ---------------------------------------------------------------------------------------
    # the network
    # ---------------------------------------------------------------------------------------

    def _build(self):
        c, dt = self._config, self._dtype
        d = c["d_model"]
        init = _Init.empty(dt)
        self.stem = _AudioStem(c["num_mel_bins"], d, c["max_source_positions"], dtype=dt,
                               _init=init)
        self.decoder_embed = Embedding(c["vocab_size"], d, positions="learned",
                                       max_positions=c["max_target_positions"], dtype=dt,
                                       _init=init)
        self._build_stacks(init, True)
        for stack in (self.encoder, self.decoder):            # k_proj has no bias
            for layer in stack.layers:
                for attn in (layer.self_attn, getattr(layer, "multihead_attn", None)):
                    if attn is not None:
                        attn._params["in_proj_bias"][d:2 * d] = 0
        self._layers = {"stem": self.stem, "decoder_embed": self.decoder_embed,
                        "encoder": self.encoder, "decoder": self.decoder, "lm_head": self.lm_head}

    def _init_random(self, seed):
        super()._init_random(seed)
        c = self._config
        self._params["model.encoder.embed_positions.weight"][...] = whisper_sinusoids(
            c["max_source_positions"], c["d_model"], self._dtype)
        self._drop_packed()

    def _apply_compact(self):
        self.stem.compact_()
        super()._apply_compact()

    def _positions(self, ids, t0):
        return {"start": t0}

    # ---------------------------------------------------------------------------------------
    # construction
    # ---------------------------------------------------------------------------------------

    @classmethod
    def _read_generation(cls, path, legacy, config):
        """The checked generation config of a Hugging Face folder (from_pretrained's hook):
        generation_config.json, or config.json's fields (:func:`fastattn.models.whisper.
        read_generation`)."""
        return read_generation(path, legacy, config["vocab_size"])

    @property
    def config(self):
        """The constructor's keywords (a copy)."""
        return {k: v for k, v in self._config.items() if k not in self._DERIVED}

    def __repr__(self):
        c = self._config
        return (f"WhisperModel(d_model={c['d_model']}, layers={c['encoder_layers']}+"
                f"{c['decoder_layers']}, vocab={c['vocab_size']}, n_mels={c['num_mel_bins']}, "
                f"dtype={self._dtype}" + (f", quantize={self._quantize!r})" if self._quantize
                                          else ")"))

    # ---------------------------------------------------------------------------------------
    # attributes
    # ---------------------------------------------------------------------------------------

    @property
    def max_decoder_positions(self):
        """The longest decoder input (prompt and prefix included): max_target_positions."""
        return self._config["max_target_positions"]

    @property
    def n_frames(self):
        """Mel frames of one 30 s window: 2 * max_source_positions (3000)."""
        return 2 * self._config["max_source_positions"]

    @property
    def alignment_heads(self):
        """The cross-attention heads whose weights follow the audio (word timestamps): a list
        of (decoder layer, head), generation_config's ``alignment_heads`` (checked here: a pair
        outside the decoder is a ValueError naming the field), else openai-whisper's default,
        every head of the second half of the decoder layers."""
        c = self._config
        L, H = c["decoder_layers"], c["decoder_attention_heads"]
        heads = self.generation_config.get("alignment_heads")
        if heads is None:
            return [(layer, h) for layer in range(L // 2, L) for h in range(H)]
        return [tuple(p) for p in check_alignment_heads(heads, "generation_config", (L, H))]

    @property
    def languages(self):
        """The language tokens of a multilingual model ('<|en|>' ...), in token id order ([]
        for an English-only one)."""
        lang = self.generation_config.get("lang_to_id") or {}
        return sorted(lang, key=lang.get)

    # ---------------------------------------------------------------------------------------
    # memory plans and input checks
    # ---------------------------------------------------------------------------------------

    def _plan_encode(self, B, S):
        """The stem (conv1's windows and output, conv2's windows) and the Transformer
        encoder's activations (Seq2SeqTransformer's plan) for B clips of S positions."""
        c = self._config
        stem = B * 2 * S * (3 * c["num_mel_bins"] + c["d_model"]) + B * S * 3 * c["d_model"]
        return super()._plan_encode(B, S) + stem * self._dtype.itemsize

    def check_sources(self, input_features, attention_mask=None, *, frames=None):
        """The checked features (B, num_mel_bins, n_frames) in the model dtype, and an all-True
        (B, max_source_positions) mask (Whisper's encoder does not mask: attention_mask is
        ignored, as in transformers). `frames`: the frame counts accepted (default exactly
        n_frames)."""
        f = check_real_input(np.asarray(to_numpy(input_features)), "input_features")
        n_mels = self._config["num_mel_bins"]
        if f.ndim == 2:
            f = f[None]
        if f.ndim != 3 or f.shape[1] != n_mels or f.shape[0] == 0:
            raise ValueError(f"input_features must be (batch, {n_mels}, {self.n_frames}) log-mel "
                             f"features, got shape {f.shape}")
        ok = f.shape[2] == self.n_frames if frames is None else 0 < f.shape[2] <= frames
        if not ok:
            raise ValueError(f"input_features has {f.shape[2]} frames; Whisper's encoder takes "
                             f"{self.n_frames} (2 x max_source_positions: 30 s, padded)"
                             + ("" if frames is None else "; longer (long-form) audio is not "
                                "supported"))
        if not np.isfinite(f).all():
            raise ValueError("input_features holds NaN or infinite values")
        f = np.ascontiguousarray(f, dtype=self._dtype)
        return f, np.ones((f.shape[0], self._config["max_source_positions"]), bool)

    # ---------------------------------------------------------------------------------------
    # forward passes
    # ---------------------------------------------------------------------------------------

    def _encode(self, feats, mask=None, nthr=None):
        """feats (B, n_mels, n_frames) checked -> (B * S, d)."""
        B = feats.shape[0]
        S = self._config["max_source_positions"]
        x = self.stem._forward(feats, nthr)
        return self.encoder._forward(x, B, S, _KernelMask(None, False), n_threads=nthr)

    def encode(self, input_features, *, n_threads=None):
        """Encoder output (B, max_source_positions, d_model) of features (B, num_mel_bins,
        2 * max_source_positions)."""
        f, _ = self.check_sources(input_features)
        S = self._config["max_source_positions"]
        check_plan(self._plan_encode(f.shape[0], S), f"encode(input_features {f.shape})")
        return self._encode(f, None, n_threads).reshape(f.shape[0], S, self.d_model)

    def logits(self, input_features, decoder_input_ids, *, n_threads=None):
        """Teacher-forced logits (B, T, vocab_size) of decoder_input_ids (B, T) (the prefix
        <|startoftranscript|> ... first) given the features."""
        f, mask = self.check_sources(input_features)
        dec = check_token_ids(decoder_input_ids, "decoder_input_ids", self.vocab_size)
        B, T = dec.shape
        if B != f.shape[0]:
            raise ValueError(f"decoder_input_ids has {B} rows, input_features {f.shape[0]}")
        if not 1 <= T <= self.max_decoder_positions:
            raise ValueError(f"decoder_input_ids length must be in [1, "
                             f"{self.max_decoder_positions}], got {T}")
        S = mask.shape[1]
        check_plan(self.plan_bytes(B, S, 1, T, chunk=T) + B * T * self.vocab_size *
                   self._dtype.itemsize, f"logits(input_features {f.shape}, "
                   f"decoder_input_ids {dec.shape})")
        cache = self._start_cache(self._encode(f, mask, n_threads), mask, 1, T, n_threads)
        h = self._decode(cache, dec, n_threads)
        return self._project(h, n_threads).reshape(B, T, self.vocab_size)

    def cross_attention_weights(self, encoder_output, tokens, heads=None, *, n_threads=None,
                                return_logits=False, softmax=True):
        """The cross-attention weights of alignment heads in a teacher-forced pass.

        Parameters
        ----------
        encoder_output : array (B, max_source_positions, d_model), or features
            The encoder output (:meth:`encode`), or log-mel features (B, num_mel_bins,
            n_frames), encoded here (a shape that is both is taken as an encoder output).
        tokens : int array (B, T) (or (T,))
            The whole decoder input: the prefix (<|startoftranscript|> ...), the text, EOT.
        heads : list of (layer, head), optional
            Default :attr:`alignment_heads`.
        n_threads : int, optional
        return_logits : bool
            Also return the pass's logits (B, T, vocab_size).
        softmax : bool
            False: the scores q k^T * scale before the softmax (word alignment softmaxes
            them over the window's own audio positions).

        Returns
        -------
        ndarray float32 (B, len(heads), T, max_source_positions): softmax(q k^T * scale) of
        each head, q from the layer's cross-attention query projection of its (pre-norm)
        input, keys from the encoder output; transformers' ``output_attentions=True``
        ``cross_attentions[layer][:, head]``. The pass is :meth:`logits`' (the same hidden
        states, bit for bit).
        """
        return_logits = check_option(return_logits, "return_logits")
        softmax = check_option(softmax, "softmax")
        memory, B = self._memory_or_features(encoder_output, n_threads)
        dec = check_token_ids(tokens, "tokens", self.vocab_size)        # (T,): one row
        heads = self._check_heads(heads)
        z, logits = self._alignment_scores(memory, dec, heads, n_threads)
        if softmax:
            z -= z.max(axis=-1, keepdims=True)
            np.exp(z, out=z)
            z /= z.sum(axis=-1, keepdims=True)
        if return_logits:
            return z, logits.reshape(dec.shape + (self.vocab_size,))
        return z

    def _check_heads(self, heads):
        if heads is None:
            return self.alignment_heads
        if isinstance(heads, np.ndarray):
            heads = heads.tolist()
        c = self._config
        return [tuple(p) for p in check_alignment_heads(
            heads, "heads", (c["decoder_layers"], c["decoder_attention_heads"]))]

    def _memory_or_features(self, x, n_threads):
        """(encoder output (B * S, d) C-contiguous in the model dtype, B) of an encoder
        output (B, S, d) / (S, d) or of features (B, n_mels, n_frames)."""
        S, d = self._config["max_source_positions"], self.d_model
        a = np.asarray(to_numpy(x))
        if a.ndim == 2 and a.shape == (S, d):
            a = a[None]
        if a.ndim == 3 and a.shape[1:] == (S, d) and a.shape[0] > 0:
            a = check_real_input(a, "encoder_output")
            if not np.isfinite(a).all():
                raise ValueError("encoder_output holds NaN or infinite values")
            return np.ascontiguousarray(a.reshape(-1, d), dtype=self._dtype), a.shape[0]
        if a.ndim == 3 and a.shape[1:] == (self._config["num_mel_bins"], self.n_frames):
            f, _ = self.check_sources(a)
            check_plan(self._plan_encode(f.shape[0], S), f"encode(input_features {f.shape})")
            return self._encode(f, None, n_threads), f.shape[0]
        raise ValueError(f"expected an encoder output (batch, {S}, {d}) or features (batch, "
                         f"{self._config['num_mel_bins']}, {self.n_frames}), got shape "
                         f"{a.shape}")

    def _alignment_scores(self, memory, tokens, heads, nthr=None):
        """memory (B * S, d), tokens (B, T) checked, heads [(layer, head)] -> (scores (B,
        len(heads), T, S) float32: q k^T * scale of each head, before the softmax; logits
        (B * T, vocab)). The decoder runs over an empty cache as :meth:`_decode` does (the
        same bits); the layers holding a head are spelled out (TransformerDecoderLayer.
        _forward's cached pre-norm path) to read their cross-attention queries."""
        B, T = tokens.shape
        S = self._config["max_source_positions"]
        if memory.shape[0] != B * S:
            raise ValueError(f"tokens has {B} rows, the encoder output {memory.shape[0] // S}")
        if not 1 <= T <= self.max_decoder_positions:
            raise ValueError(f"tokens length must be in [1, {self.max_decoder_positions}], "
                             f"got {T}")
        check_plan(self.plan_bytes(B, S, 1, T, chunk=T) + B * T * (self.vocab_size +
                   len(heads) * S) * 4, f"cross_attention_weights(tokens {tokens.shape})")
        want = {}
        for j, (layer, h) in enumerate(heads):
            want.setdefault(layer, []).append((j, h))
        cache = self._start_cache(memory, np.ones((B, S), bool), 1, T, nthr)
        dec = self.decoder
        x = self.decoder_embed._forward(tokens, **self._positions(tokens, 0))
        ln = self._ln_threads(B * T, nthr)
        scores = np.empty((B, len(heads), T, S), np.float32)
        for i, layer in enumerate(dec.layers):
            lc = cache.layer(i)
            if i not in want:
                x = layer._forward(x, None, B, T, None, None, None, nthr, cache=lc,
                                   ln_threads=ln)
                continue
            assert layer.norm_first and dec.position_bias is None      # Whisper's layers
            h = layer.norm1._forward(x, n_threads=ln)
            x = layer.self_attn._step_self(h, B, T, lc.append, x, None, nthr, None)
            h = layer.norm2._forward(x, n_threads=ln)
            attn = layer.multihead_attn
            k, v = lc.cross
            q = attn._proj(0)(h, None, nthr)                             # (B * T, H * Dh)
            x = attn._step_cross(h, k, v, lc.memory_mask, lc.n_src, T, x, None, nthr,
                                 padded=T > 1)
            h = layer.norm3._forward(x, n_threads=ln)
            x = layer.ff._forward(h, x, None, nthr)
            Dh = attn.head_dim
            scale = attn.scale if attn.scale is not None else 1.0 / math.sqrt(Dh)
            for j, hd in want[i]:
                qh = q[:, hd * Dh:(hd + 1) * Dh].reshape(B, T, Dh)
                scores[:, j] = np.matmul(qh, k[:, hd].swapaxes(1, 2)) * qh.dtype.type(scale)
        x = dec.norm._forward(x, n_threads=ln)
        cache.advance(T)
        return scores, self._project(x, nthr)

    def start(self, input_features=None, attention_mask=None, *, encoder_output=None,
              num_beams=1, max_length=None, n_threads=None):
        """Begin incremental decoding (the decoder interface): features (encoded here) or
        ``encoder_output`` (B, max_source_positions, d_model); ``num_beams`` rows per clip,
        at most ``max_length`` positions (default max_target_positions). Returns a
        :class:`fastattn.generation.DecoderState`."""
        if input_features is not None:
            if encoder_output is not None:
                raise ValueError("give input_features or encoder_output, not both")
            f, _ = self.check_sources(input_features)
            S = self._config["max_source_positions"]
            check_plan(self._plan_encode(f.shape[0], S), f"start(input_features {f.shape})")
            encoder_output = self._encode(f, None, n_threads).reshape(f.shape[0], S, -1)
        elif encoder_output is None:
            raise ValueError("give input_features or encoder_output")
        return super().start(encoder_output=encoder_output, num_beams=num_beams,
                             max_length=max_length, n_threads=n_threads)

    # ---------------------------------------------------------------------------------------
    # language detection and generation
    # ---------------------------------------------------------------------------------------

    def _detect(self, memory, B, n_threads):
        """Language ids (B,) and the language logits (B, n_langs) from the encoder output."""
        lang = self.generation_config.get("lang_to_id")
        if not lang:
            raise ValueError("this model has no languages to detect (no lang_to_id in its "
                             "generation config: an English-only Whisper)")
        S = self._config["max_source_positions"]
        cache = self._start_cache(memory, np.ones((B, S), bool), 1, 1, n_threads)
        start = np.full((B, 1), self.generation_config["decoder_start_token_id"], np.int64)
        logits = self._project(self._decode(cache, start, n_threads), n_threads)
        ids = np.array(sorted(lang.values()), np.int64)
        masked = np.full(logits.shape, -np.inf, logits.dtype)
        masked[:, ids] = logits[:, ids]
        return np.argmax(masked, axis=1).astype(np.int64), logits[:, ids]

    def detect_language(self, input_features=None, *, encoder_output=None, return_probs=False,
                        n_threads=None):
        """The language token id of each clip (B,) int64, as transformers' detect_language:
        the most likely language token after <|startoftranscript|>. With ``return_probs``,
        also the probabilities (B, len(languages)) float64 (a softmax over the language
        tokens' logits; columns in the order of :attr:`languages`). Features of fewer than
        n_frames frames are padded with zeros; or give the clips' ``encoder_output`` (B,
        max_source_positions, d_model) (:meth:`encode`) instead of their features."""
        S = self._config["max_source_positions"]
        if encoder_output is not None:
            if input_features is not None:
                raise ValueError("give input_features or encoder_output, not both")
            memory, B = self._memory_or_features(encoder_output, n_threads)
            check_plan(self.plan_bytes(B, S, 1, 1) - self._plan_encode(B, S),
                       f"detect_language(encoder_output ({B}, {S}, {self.d_model}))")
        elif input_features is None:
            raise ValueError("give input_features or encoder_output")
        else:
            f, _ = self.check_sources(input_features, frames=self.n_frames)
            f = self._padded(f)
            B = f.shape[0]
            check_plan(self.plan_bytes(B, S, 1, 1), f"detect_language(input_features "
                       f"{f.shape})")
            memory = self._encode(f, None, n_threads)
        ids, lg = self._detect(memory, B, n_threads)
        if not return_probs:
            return ids
        z = lg.astype(np.float64)
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return ids, z / z.sum(axis=1, keepdims=True)

    def _padded(self, f, start=None):
        """Windows of n_frames frames: f[b, :, start[b]:] zero-padded (start default 0)."""
        N = self.n_frames
        if start is None and f.shape[2] == N:
            return f
        out = np.zeros(f.shape[:2] + (N,), self._dtype)
        for b in range(f.shape[0]):
            s = 0 if start is None else int(start[b])
            out[b, :, :f.shape[2] - s] = f[b, :, s:]
        return out

    def generate(self, input_features, *, language=None, task=None, return_timestamps=None,
                 prompt_ids=None, n_threads=None, **settings):
        """Transcribe (or translate) clips of at most 30 s: transformers'
        ``WhisperForConditionalGeneration.generate`` token for token (greedy or beam search).

        Parameters
        ----------
        input_features : array (B, num_mel_bins, frames), frames <= n_frames (3000)
            Log-mel features (WhisperFeatureExtractor's); fewer frames are zero-padded.
        language : str or list of str, optional
            'de', 'german' or '<|de|>' (one for all clips or one per clip). Default: the
            checkpoint's; a multilingual model without one detects each clip's language
            (:meth:`detect_language`).
        task : 'transcribe' or 'translate', optional
        return_timestamps : bool, optional
            Timestamp tokens in the output (Whisper's timestamp rules); default the
            checkpoint's return_timestamps.
        prompt_ids : int array (P,), optional
            A previous-text prompt, ``<|startofprev|>`` first (WhisperProcessor.get_prompt_ids):
            decoding is conditioned on it; it is not part of the output.
        max_new_tokens, num_beams, length_penalty, early_stopping, suppress_tokens,
        begin_suppress_tokens, repetition_penalty, no_repeat_ngram_size :
            As transformers (defaults from the checkpoint's generation config).
        n_threads : int, optional

        Returns
        -------
        ndarray int64 (B, T): each clip's generated tokens (without the prefix
        <|startoftranscript|><|lang|><|task|>..., the prompt and EOS), window after window
        (a decoding that ends inside a timestamp pair continues from its last timestamp, as
        transformers does), right-padded with pad_token_id.
        """
        for key in settings:
            if key not in WindowDecoder.SETTINGS:
                raise TypeError(f"generate() got an unexpected keyword argument {key!r}")
        gen = self.generation_config
        f, _ = self.check_sources(input_features, frames=self.n_frames)
        B, frames = f.shape[0], f.shape[2]
        if return_timestamps is None:
            return_timestamps = bool(gen.get("return_timestamps") or False)
        return_timestamps = check_option(return_timestamps, "return_timestamps")
        notimestamps = gen.get("no_timestamps_token_id")
        if return_timestamps and notimestamps is None:
            raise ValueError("return_timestamps=True needs no_timestamps_token_id in the "
                             "model's generation config")
        V, S = self.vocab_size, self._config["max_source_positions"]
        memory = {}                                  # the first window's encoder output

        def detect():
            first = self._encode(self._padded(f), None, n_threads)
            memory["first"] = first
            return self._detect(first, B, n_threads)[0]

        rows = prompt_rows(gen, B, language=language, task=task,
                           return_timestamps=return_timestamps, detect=detect)
        prefix = np.array(rows, np.int64).reshape(B, -1)
        if prompt_ids is not None:
            prompt = check_token_ids(prompt_ids, "prompt_ids", V, ndim=1, what="(length,)")
            prefix = np.concatenate([np.broadcast_to(prompt, (B, prompt.size)), prefix], 1)
        P = prefix.shape[1]
        decoder = WindowDecoder(self, settings, timestamps=return_timestamps)
        p = decoder.settings(P)
        procs = decoder.processors(p, P)
        tb = notimestamps + 1 if notimestamps is not None else V + 1
        K = p["num_beams"]
        check_plan(self.plan_bytes(B, S, K, self.max_decoder_positions),
                   f"generate(input_features {f.shape}, num_beams={K})")
        seek = np.zeros(B, np.int64)
        out = [[] for _ in range(B)]
        windows = 0
        while True:
            active = np.flatnonzero(seek < frames)
            if not active.size:
                break
            window = np.minimum(frames - seek[active], self.n_frames)
            if "first" in memory and not seek.any() and active.size == B:
                mem = memory.pop("first")
            else:
                mem = self._encode(self._padded(f[active], seek[active]), None, n_threads)
            windows += 1                        # transformers grows max_length each window
            step = dict(p, max_length=decoder.max_length(p, P, windows))
            results = decoder.decode(mem.reshape(active.size, S, -1), prefix[active], step,
                                     procs, n_threads=n_threads)
            for r, b, w in zip(results, active, window):
                kept, moved = split_segments(r.tokens, tb, int(w))
                out[b].append(kept)
                # a seek that does not move would decode the same window forever (transformers
                # does): the clip ends there
                seek[b] = seek[b] + moved if moved > 0 else frames
        toks = [np.concatenate(o) if o else np.zeros(0, np.int64) for o in out]
        T = max(t.size for t in toks)
        res = np.full((B, T), p["pad_token_id"], np.int64)
        for b, t in enumerate(toks):
            res[b, :t.size] = t
        return res
