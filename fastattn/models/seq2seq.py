"""Seq2SeqTransformer: token ids in, token ids out (encoder-decoder with KV-cached decoding).

Design:
- The network is fastattn.nn's: an :class:`~fastattn.nn.Embedding` per side, a
  :class:`~fastattn.nn.TransformerEncoder` and :class:`~fastattn.nn.TransformerDecoder` (post-
  or pre-norm), a :class:`~fastattn.nn.Linear` output projection (tied to the decoder embedding
  or not; its bias is ``final_logits_bias``). This file composes them and calls no kernel.
- Parameters carry the checkpoint's Hugging Face names (Marian's
  ``model.encoder.layers.0.self_attn.q_proj.weight``, ``lm_head.weight``,
  ``final_logits_bias`` ...; T5's ``encoder.block.0.layer.0.SelfAttention.q.weight`` ...) and
  torch's (out, in) layout, so that the transformers model's ``state_dict()`` /
  ``model.safetensors`` loads by name: they are views into the layers' arrays, through the name
  map of the model_type's family (:mod:`fastattn.models.registry`; q, k and v of every
  attention are row blocks of its ``in_proj_weight``: one GEMM for q, k, v of a self-attention,
  one for k, v of a cross-attention).
- The rest lives beside this file: the keywords' checks in ``_seq2seq_spec.py``, the
  parameters, state_dict and folders in and out in ``_seq2seq_weights.py`` (the base class),
  the rows of continuous batching (``start_rows``) in ``_seq2seq_rows.py``.
- Decoding keeps a :class:`fastattn.generation.KVCache`: self-attention keys / values written in
  place at the step's position of buffers sized for the longest output; cross-attention keys /
  values computed once per source. The beams of one source share that source's cross keys and
  values: their queries are stacked on the query axis of one attention call.
"""
import math

import numpy as np

from .._memory import check_plan, release_free_memory
from .._quant import check_quantize
from .._validation import (check_positive_int, check_real_input, check_token_ids,
                           hf_attention_mask, to_numpy)
from ..generation.config import check_generation_config, check_generation_ids
from ..generation.kv_cache import KVCache
from ..generation.search import DecoderState, generate, score
from ..io.huggingface import canonical_activation
from ..nn._masks import _KernelMask
from ..nn._module import _Init
from ..nn.embedding import Embedding
from ..nn.linear import Linear
from ..nn.positional import counted_position_ids, fairseq_positions_table, positions_table
from ..nn.transformer import TransformerDecoder, TransformerEncoder
from . import _seq2seq_spec
from ._seq2seq_rows import Seq2SeqRows
from ._seq2seq_weights import EMPTY, Seq2SeqWeights

__all__ = ["Seq2SeqTransformer", "positions_table"]

_SMALL = 1 << 16          # elements below which an elementwise pass runs on one thread


class Seq2SeqTransformer(Seq2SeqWeights):
    """Encoder-decoder Transformer for translation-style generation: Marian, BART, mBART,
    Pegasus, M2M100 / NLLB, T5 / mT5 checkpoints (every ``seq2seq`` family of
    :mod:`fastattn.models.registry`), or built in code.

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
    positions : {'marian', 'interleaved', 'fairseq', 'learned'}
        Sinusoidal (Marian's and Pegasus's half/half layout, the paper's interleaved one, or
        M2M100's counted from the pad id, padding tokens at a zero vector) or learned
        (``model.{encoder,decoder}.embed_positions.weight``, ``max_position_embeddings +
        position_offset`` rows; BART and mBART: offset 2).
    layernorm_embedding : bool
        A LayerNorm over the embeddings (BART, mBART).
    model_type : str
        The checkpoint family whose weight names the model carries (``marian``, ``bart``,
        ``mbart``, ``pegasus``, ``m2m_100``); :meth:`from_pretrained` sets every keyword from
        the folder's config.json.
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
                 decoder_start_token_id=None, layer_norm_eps=1e-5, generation_config=None,
                 layernorm_embedding=False, position_offset=0, model_type="marian",
                 norm="layer", bias=True, head_dim=None, attention_scale=None, gated_ffn=False,
                 relative_attention_num_buckets=None, relative_attention_max_distance=None,
                 output_scale=1.0, final_logits_bias=True, *, seed=0, dtype=np.float32,
                 quantize=None, _state_dict=None):
        keywords = {k: v for k, v in locals().items() if k in _seq2seq_spec.KEYWORDS}
        dt = _seq2seq_spec.model_dtype(dtype)
        cfg, self._family = _seq2seq_spec.check_keywords(keywords)   # (_seq2seq_spec.py)
        Vt = cfg["decoder_vocab_size"]
        self._config = cfg
        if generation_config is not None and not isinstance(generation_config, dict):
            raise TypeError(f"generation_config must be a dict, got "
                            f"{type(generation_config).__name__}")
        gen = check_generation_config(dict(generation_config or {}), "generation_config")
        check_generation_ids(gen, Vt, "generation_config")
        self.generation_config = gen
        self._dtype = dt
        self._finish_init(seed, _state_dict, check_quantize(quantize, dt))

    _KIND = "seq2seq"         # the registry's kind of the families this class runs

    def _finish_init(self, seed, sd, quantize):
        """The end of a constructor (this class's and WhisperModel's), once _config,
        _family, generation_config and _dtype are set: build the network, stream the weights
        `sd` in (None: random from `seed`; EMPTY: a saved folder's, mapped in later), then
        pack or quantize (`quantize` checked)."""
        self._quantize = None                  # the float network first, then its int8 form
        self._qparams = {}
        self._build()
        if sd is None:
            self._map_params()
            self._init_random(seed)
        else:                   # weights to stream in (_load_streaming) or a saved folder's
            self._params, self._qparams, self._order = {}, {}, []
        given = sd is not None and sd is not EMPTY
        if given:
            self._load_streaming(sd, quantize)
        if quantize is not None:
            self._quantize = quantize
            self._apply_quantize()
        elif sd is not EMPTY:
            self._apply_compact()
        if given:
            release_free_memory()          # the float arrays just freed (docs/int8.md)

    # ---------------------------------------------------------------------------------------
    # parameters
    # ---------------------------------------------------------------------------------------

    def _build(self):
        """The network (fastattn.nn layers) in ``_layers``, not yet initialised (_finish_init
        then maps its parameters by Hugging Face name and fills them)."""
        c, dt = self._config, self._dtype
        d = c["d_model"]
        init = _Init.empty(dt)
        P = c["max_position_embeddings"] + c["position_offset"]
        if c["positions"] in ("learned", "none"):
            pos = None if c["positions"] == "none" else "learned"
        else:
            try:
                if c["positions"] == "fairseq":      # positions pad + 1 .. pad + P
                    pos = fairseq_positions_table(c["max_position_embeddings"] + c["pad_token_id"]
                                                  + 1, d, c["pad_token_id"], dt)
                else:
                    pos = positions_table(c["max_position_embeddings"], d, c["positions"], dt)
            except MemoryError:
                raise ValueError(
                    f"max_position_embeddings={c['max_position_embeddings']}: its "
                    f"({c['max_position_embeddings']}, {d}) position table does not fit in "
                    "memory") from None
        scale = math.sqrt(d) if c["scale_embedding"] else 1.0
        eps = c["layer_norm_eps"] if c["layernorm_embedding"] else None
        self.encoder_embed = Embedding(c["vocab_size"], d, positions=pos, max_positions=P,
                                       scale=scale, layer_norm_eps=eps, dtype=dt, _init=init)
        self.decoder_embed = Embedding(c["decoder_vocab_size"], d, positions=pos,
                                       max_positions=P, scale=scale, layer_norm_eps=eps,
                                       dtype=dt, _init=init)
        if c["share_encoder_decoder_embeddings"]:
            self.decoder_embed._params["weight"] = self.encoder_embed._params["weight"]
        variant = {k: v for k, v in (("head_dim", c["head_dim"]),
                                     ("attn_scale", c["attention_scale"]),
                                     ("norm", c["norm"]), ("gated", c["gated_ffn"])) if v}
        bias = None if c["relative_attention_num_buckets"] is None else {
            "num_buckets": c["relative_attention_num_buckets"],
            "max_distance": c["relative_attention_max_distance"]}
        self._build_stacks(init, c["normalize_before"], bias=c["bias"], position_bias=bias,
                           **variant)
        self._layers = {"encoder_embed": self.encoder_embed, "decoder_embed": self.decoder_embed,
                        "encoder": self.encoder, "decoder": self.decoder, "lm_head": self.lm_head}

    def _build_stacks(self, init, pre, **layer):
        """The encoder and decoder stacks (``encoder``, ``decoder``: pre-norm with a final
        LayerNorm where `pre`, else post-norm) from the config's layer counts, heads and widths
        and the layer keywords `layer`, then ``lm_head`` (decoder_vocab_size outputs, tied to
        the decoder's token embedding where tie_word_embeddings): this class's network and
        WhisperModel's."""
        c, dt = self._config, self._dtype
        d = c["d_model"]
        act = canonical_activation(c["activation_function"], "activation_function")
        for which, stack in (("encoder", TransformerEncoder), ("decoder", TransformerDecoder)):
            setattr(self, which, stack._build(
                init, num_layers=c[f"{which}_layers"], final_norm=pre, d_model=d,
                nhead=c[f"{which}_attention_heads"], dim_feedforward=c[f"{which}_ffn_dim"],
                activation=act, layer_norm_eps=c["layer_norm_eps"], norm_first=pre, dtype=dt,
                **layer))
        self.lm_head = Linear(d, c["decoder_vocab_size"], bias=c["final_logits_bias"], dtype=dt,
                              _init=init)
        if c["tie_word_embeddings"]:
            self.lm_head._params["weight"] = self.decoder_embed._params["weight"]

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
                f"{c['decoder_layers']}, vocab={c['vocab_size']}, dtype={self._dtype}"
                + (f", quantize={self._quantize!r})" if self._quantize else ")"))

    @property
    def max_decoder_positions(self):
        """The longest decoder input (start token included): max_position_embeddings."""
        return self._config["max_position_embeddings"]

    # ---------------------------------------------------------------------------------------
    # memory plans (fastattn._memory): upper bounds of the bytes a call holds at once
    # ---------------------------------------------------------------------------------------

    def _widths(self, which):
        """(the widest activation per token: d_model or the heads side by side, the FFN's
        hidden width: twice d_ff when gated, the head count)"""
        c = self._config
        H = c[f"{which}_attention_heads"]
        inner = H * c["head_dim"] if c["head_dim"] else c["d_model"]
        ffn = c[f"{which}_ffn_dim"] * (2 if c["gated_ffn"] else 1)
        return max(c["d_model"], inner), ffn, H

    def _plan_encode(self, B, S):
        """An encoder pass over B x S tokens: the embeddings, q/k/v, the heads' output, the
        output projection, the FFN's hidden and output, a LayerNorm's copy, the attention
        workspace (packed K and V) and the result: (11 d + ffn) values a token; with T5's
        position bias the (B, H, S, S) score bias and its padded copy too."""
        w, f, H = self._widths("encoder")
        bias = 2 * H * S if self._config["relative_attention_num_buckets"] else 0
        return B * S * (11 * w + f + bias) * self._dtype.itemsize

    def plan_bytes(self, n_sources, src_len, num_beams, max_length, chunk=1):
        """Decoding `num_beams` rows per source up to `max_length` positions, `chunk` positions
        a call (the decoder interface's plan, encoder included): the KV cache (twice for beams:
        the reorder's twin), the cross-attention keys and values, one call's activations and
        attention workspaces, its logits."""
        c = self._config
        isz = self._dtype.itemsize
        w, f, H = self._widths("decoder")
        L, V = c["decoder_layers"], self.vocab_size
        B, S, n, T = n_sources, src_len, n_sources * num_beams, max_length
        cache = L * 2 * n * T * w * isz * (2 if num_beams > 1 else 1)
        cross = (L * 2 + 2) * B * S * w * isz
        step = n * chunk * (11 * w + f + V) * isz + 2 * (n * T + B * S) * w * isz
        if c["relative_attention_num_buckets"]:
            step += 2 * H * chunk * T * isz
        return self._plan_encode(B, S) + cache + cross + step

    # ---------------------------------------------------------------------------------------
    # input checks
    # ---------------------------------------------------------------------------------------

    def check_sources(self, input_ids, attention_mask=None):
        """The checked source batch: (ids (B, S) int64, mask (B, S) bool, True = token).

        attention_mask defaults to ``input_ids != pad_id`` (all tokens when pad_id == eos_id).
        """
        ids = check_token_ids(input_ids, "input_ids", self._config["vocab_size"])
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
    # forward passes: compositions of the fastattn.nn layers
    # ---------------------------------------------------------------------------------------

    def _positions(self, ids, t0):
        """The embedding's position arguments for ids (B, T) fed at positions t0 ..: rows
        t0 + offset .. of the table, or (M2M100) ids counted from the pad id, a padding token
        at the pad id's zero row (transformers' create_position_ids_from_input_ids)."""
        c = self._config
        if c["positions"] != "fairseq":
            return {"start": t0 + c["position_offset"]}
        pad = c["pad_token_id"]
        return {"position_ids": counted_position_ids(ids, pad, pad, t0)}

    def _encode(self, ids, mask, nthr):
        """ids (B, S) int64, mask (B, S) bool (True = token) -> (B*S, d)."""
        B, S = ids.shape
        x = self.encoder_embed._forward(ids, **self._positions(ids, 0))   # (B*S, d)
        kmask = _KernelMask(mask[:, None, None, :], False)           # (B, 1, 1, S), True = attend
        return self.encoder._forward(x, B, S, kmask, n_threads=nthr)

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
        ids, mask = self.check_sources(input_ids, attention_mask)
        check_plan(self._plan_encode(*ids.shape), f"encode(input_ids {ids.shape})")
        return self._encode(ids, mask, n_threads).reshape(ids.shape[0], ids.shape[1], self.d_model)

    def _start_cache(self, memory, mask, group, max_len, nthr):
        """A KVCache for `group` rows per source, cross keys/values from memory (B*S, d)."""
        c = self._config
        B, S = mask.shape
        H = c["decoder_attention_heads"]
        Dh = self.decoder.layers[0].self_attn.head_dim
        cache = KVCache(c["decoder_layers"], B * group, H, Dh, max_len, B, S, self._dtype)
        cache.n_threads = nthr
        for i, layer in enumerate(self.decoder.layers):
            cache.set_cross(i, *layer.multihead_attn._cross_kv(memory, B, S, nthr))
        cache.set_memory_mask(mask, group)
        return cache

    def _decode(self, cache, tokens, nthr):
        """Feed tokens (n, T) at positions [cache.length, cache.length + T) -> hidden (n*T, d).

        T > 1 only from an empty cache (teacher forcing: causal self-attention over the chunk).
        """
        n, T = tokens.shape
        t0 = cache.length
        if t0 + T > cache.max_len:
            raise ValueError(f"the cache holds {cache.max_len} positions; cannot feed position "
                             f"{t0 + T - 1}")
        x = self.decoder_embed._forward(tokens, **self._positions(tokens, t0))  # (n*T, d)
        x = self._decoder_stack(x, n, T, nthr, cache)
        cache.advance(T)
        return x

    def _decoder_stack(self, x, n, T, nthr, cache):
        """The decoder layers over embedded x (n*T, d) at the cache's next positions (the
        caller advances the cache) -> hidden (n*T, d)."""
        return self.decoder._forward(x, None, n, T, None, None, None, nthr, cache=cache,
                                     ln_threads=self._ln_threads(n * T, nthr))

    def _ln_threads(self, rows, nthr):
        """Threads for the layer norms of `rows` decoder rows."""
        # a decode step's layer norms are microseconds of work: one thread, no hand-over to a
        # second one (which cost ~1 ms per call on the busy 2-core machine). Single-thread GEMMs
        # and attentions helped there only under heavy load and lost at load ~2: not done.
        return 1 if rows * self.d_model <= _SMALL else nthr

    def _project(self, hidden, nthr=None):
        """hidden (N, d) -> logits (N, vocab) = hidden @ W_out.T + final_logits_bias (T5's
        tied head: the hidden state times d_model^-0.5 first)."""
        if self._config["output_scale"] != 1.0:
            hidden = hidden * self._dtype.type(self._config["output_scale"])
        return self.lm_head._forward(hidden, n_threads=nthr)

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
        ids, mask = self.check_sources(input_ids, attention_mask)
        dec = check_token_ids(decoder_input_ids, "decoder_input_ids", self.vocab_size)
        B, T = dec.shape
        if B != ids.shape[0]:
            raise ValueError(f"decoder_input_ids has {B} rows, input_ids {ids.shape[0]}")
        if T == 0 or T > self._config["max_position_embeddings"]:
            raise ValueError(f"decoder_input_ids length must be in [1, "
                             f"{self._config['max_position_embeddings']}], got {T}")
        check_plan(self.plan_bytes(B, ids.shape[1], 1, T, chunk=T) + B * T * self.vocab_size *
                   self._dtype.itemsize, f"logits(input_ids {ids.shape}, decoder_input_ids "
                   f"{dec.shape})")
        memory = self._encode(ids, mask, n_threads)
        cache = self._start_cache(memory, mask, 1, T, n_threads)
        h = self._decode(cache, dec, n_threads)
        return self._project(h, n_threads).reshape(B, T, self.vocab_size)

    def cross_attention(self, input_ids, decoder_input_ids, attention_mask=None, *, layer=-1,
                        heads=(0,), n_threads=None):
        """Teacher-forced cross-attention probabilities of decoder layer `layer`, averaged
        over `heads`: where each target position looks in the source (CTranslate2's
        ``return_attention``: its alignment layer and heads, by default the last layer's first
        head; OpenNMT's word alignment).

        Parameters
        ----------
        input_ids : int array (B, S)
        decoder_input_ids : int array (B, T): the start token, then the target; position t's
            weights are the ones that predict target token t + 1
        attention_mask : array (B, S), optional (default: ``pad_id`` positions are padding)
        layer : int (negative counts from the last)
        heads : sequence of int, the heads averaged

        Returns
        -------
        ndarray float32 (B, T, S): softmax(q k^T * scale) over each row's source positions
        (0 at padding), the mean of the heads. The layers below `layer` run as in
        :meth:`logits` (the same bits).
        """
        ids, mask = self.check_sources(input_ids, attention_mask)
        dec = check_token_ids(decoder_input_ids, "decoder_input_ids", self.vocab_size)
        B, T = dec.shape
        S = ids.shape[1]
        if B != ids.shape[0]:
            raise ValueError(f"decoder_input_ids has {B} rows, input_ids {ids.shape[0]}")
        if T == 0 or T > self.max_decoder_positions:
            raise ValueError(f"decoder_input_ids length must be in [1, "
                             f"{self.max_decoder_positions}], got {T}")
        n_layers, H = self._config["decoder_layers"], self._config["decoder_attention_heads"]
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or \
                not -n_layers <= layer < n_layers:
            raise ValueError(f"layer must be an integer in [{-n_layers}, {n_layers}), got "
                             f"{layer!r}")
        heads = list(heads) if not isinstance(heads, (int, np.integer)) else [heads]
        if not heads or any(isinstance(h, bool) or not isinstance(h, (int, np.integer)) or
                            not 0 <= h < H for h in heads):
            raise ValueError(f"heads must be a non-empty list of head indices in [0, {H}), got "
                             f"{heads!r}")
        check_plan(self.plan_bytes(B, S, 1, T, chunk=T) + B * len(heads) * T * S * 4,
                   f"cross_attention(input_ids {ids.shape}, decoder_input_ids {dec.shape})")
        memory = self._encode(ids, mask, n_threads)
        cache = self._start_cache(memory, mask, 1, T, n_threads)
        stack = self.decoder
        x = self.decoder_embed._forward(dec, **self._positions(dec, 0))
        tmask = None if stack.position_bias is None else stack.position_bias._forward(T, T, 0)
        ln = self._ln_threads(B * T, n_threads)
        layer = int(layer) % n_layers
        for i in range(layer):
            x = stack.layers[i]._forward(x, None, B, T, None, tmask, None, n_threads,
                                         cache=cache.layer(i), ln_threads=ln)
        lyr, lc = stack.layers[layer], cache.layer(layer)
        # TransformerDecoderLayer._forward's self-attention, then the cross-attention's query
        h, norm = lyr._norm_in(lyr.norm1, x, ln)
        x = lyr.self_attn._step_self(h, B, T, lc.append, x, norm, n_threads, tmask)
        h, _ = lyr._norm_in(lyr.norm2, x, ln)
        attn = lyr.multihead_attn
        q = attn._proj(0)(h, None, n_threads)                    # (B * T, H * Dh)
        k = lc.cross[0]                                          # (B, H, S, Dh)
        Dh = attn.head_dim
        scale = attn.scale if attn.scale is not None else 1.0 / math.sqrt(Dh)
        out = np.zeros((B, T, S), np.float32)
        for hd in heads:
            qh = q[:, hd * Dh:(hd + 1) * Dh].reshape(B, T, Dh).astype(np.float32)
            z = np.matmul(qh, k[:, hd].astype(np.float32).swapaxes(1, 2)) * np.float32(scale)
            z = np.where(mask[:, None, :], z, -np.inf)
            z -= z.max(axis=-1, keepdims=True)
            np.exp(z, out=z)
            z /= z.sum(axis=-1, keepdims=True)
            out += z
        out /= np.float32(len(heads))
        return out

    # ---------------------------------------------------------------------------------------
    # the decoder interface (fastattn.generation.Decoder): step API and generation
    # ---------------------------------------------------------------------------------------

    def start(self, input_ids=None, attention_mask=None, *, encoder_output=None, num_beams=1,
              max_length=None, n_threads=None):
        """Begin incremental decoding; returns a :class:`fastattn.generation.DecoderState`.

        Give either ``input_ids`` (encoded here) or ``encoder_output`` (B, S, d_model) with its
        ``attention_mask``. Each source gets ``num_beams`` decoder rows (row ``b * num_beams + j``
        is beam j of source b). ``max_length`` bounds the tokens fed (default
        max_position_embeddings).
        """
        check_positive_int(num_beams, "num_beams")
        P = self.max_decoder_positions
        if max_length is None:
            max_length = P
        if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)) or \
                not 1 <= max_length <= P:
            raise ValueError(f"max_length must be an integer in [1, {P}], got {max_length!r}")
        if encoder_output is None:
            if input_ids is None:
                raise ValueError("give input_ids or encoder_output")
            ids, mask = self.check_sources(input_ids, attention_mask)
            check_plan(self.plan_bytes(*ids.shape, int(num_beams), int(max_length)),
                       f"start(input_ids {ids.shape}, num_beams={num_beams}, "
                       f"max_length={max_length})")
            memory = self._encode(ids, mask, n_threads)
        else:
            if input_ids is not None:
                raise ValueError("give input_ids or encoder_output, not both")
            mem = check_real_input(to_numpy(encoder_output), "encoder_output")
            if mem.ndim != 3 or mem.shape[2] != self.d_model:
                raise ValueError(f"encoder_output must be (B, S, {self.d_model}), got {mem.shape}")
            B, S, _ = mem.shape
            if B == 0 or S == 0:
                raise ValueError(f"encoder_output must have at least one source row and one "
                                 f"position, got shape {mem.shape}")
            if attention_mask is None:
                mask = np.ones((B, S), bool)
            else:
                m = to_numpy(attention_mask)
                if m.ndim == 1 and B == 1:
                    m = m[None]
                mask = hf_attention_mask(m, (B, S))
            check_plan(self.plan_bytes(B, S, int(num_beams), int(max_length)) - self._plan_encode(
                B, S), f"start(encoder_output {mem.shape}, num_beams={num_beams}, "
                f"max_length={max_length})")
            memory = np.ascontiguousarray(mem.reshape(B * S, -1), dtype=self._dtype)
        cache = self._start_cache(memory, mask, int(num_beams), int(max_length), n_threads)
        return _Seq2SeqState(self, cache, int(num_beams), n_threads)

    def start_rows(self, n_threads=None):
        """Empty rows for continuous batching (:class:`fastattn.generation.continuous.RowState`:
        sources join and leave one running decoder batch between steps); a ValueError for a
        relative position bias (T5)."""
        return Seq2SeqRows(self, n_threads)

    def score(self, input_ids, labels, attention_mask=None, *, n_threads=None):
        """Per-token log-probabilities (B, T) float64 of `labels` (B, T) given the sources
        (forced decoding, CTranslate2's ``score_batch``): see
        :func:`fastattn.generation.search.score` (a label of -100 is ignored and scores 0)."""
        return score(self, input_ids, labels, attention_mask, n_threads)

    def generate(self, input_ids, attention_mask=None, *, do_sample=False, **kwargs):
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
        repetition_penalty, no_repeat_ngram_size, encoder_no_repeat_ngram_size : transformers'
            repetition controls (defaults: the checkpoint's).
        forced_bos_token_id : the first generated token (mBART-50, M2M100, NLLB: the target
            language; default: the checkpoint's).
        num_return_sequences : rows per source (beam search: the best finished hypotheses,
            <= num_beams; sampling: independent samples), source-major as transformers.
        decoder_input_ids : int array (B, P), optional
            A forced prefix (CTranslate2's target_prefix): decoding continues after it; the
            start token is prepended when no row begins with it (a mix is a ValueError).
            max_new_tokens counts after the prefix.
        return_scores : bool
            Also return the scores (see below).
        streamer : object with put() and end(), optional
            transformers' streamer protocol (batch 1, one beam): put(prefix (1, P)), then
            put(token (1,)) for each new token, then end().
        n_threads : int, optional

        Returns
        -------
        ndarray int64 (B * num_return_sequences, P + T): the prefix (the start token, then any
        decoder_input_ids), then the generated tokens, ``pad_id`` after a row's EOS; T is the
        longest row's length. With ``return_scores=True``, ``(ids, scores)``: beam search's
        ``sequences_scores`` (the length-penalised score of each hypothesis), or for greedy
        search and sampling the sum of the generated tokens' log-probabilities (the log-softmax
        of the processed scores, up to and including EOS); float32. The full list of settings:
        :func:`fastattn.generation.search.generate`.
        """
        return generate(self, input_ids, attention_mask, do_sample=do_sample, **kwargs)


class _Seq2SeqState(DecoderState):
    """A Seq2SeqTransformer's decoding state: its KV cache and the rows' positions."""

    def __init__(self, model, cache, num_beams, n_threads):
        self.model, self.cache, self.num_beams, self.n_threads = model, cache, num_beams, n_threads

    @property
    def length(self):
        """Tokens fed so far."""
        return self.cache.length

    @property
    def n_rows(self):
        return self.cache.n_rows

    @property
    def n_sources(self):
        return self.cache.n_src

    def step(self, tokens):
        """tokens (n,): one position per row, or (n, T): T positions from an empty cache (a
        forced prefix) -> the last position's logits (n, vocab)."""
        t = np.asarray(to_numpy(tokens))
        t = check_token_ids(t if t.ndim == 2 else np.reshape(t, (-1, 1)), "tokens",
                            self.model.vocab_size, what="(rows, positions)", one_row=False)
        n, T = t.shape
        if n != self.cache.n_rows:
            raise ValueError(f"tokens must hold one id per row ({self.cache.n_rows}), got {n}")
        if T > 1 and self.cache.length:
            raise ValueError("several positions a step only from an empty cache (a prefix)")
        h = self.model._decode(self.cache, t, self.n_threads)
        if T > 1:
            h = np.ascontiguousarray(h.reshape(n, T, -1)[:, -1])
        return self.model._project(h, self.n_threads)

    def prefill(self, tokens, positions=()):
        """tokens (n_rows, T): positions [0, T) of every row from an empty cache (a forced
        prefix) as one chunk, logits computed only at `positions` -> [(t, logits (n_rows,
        vocab))]. Where every row of a source holds the same prefix (beam search's beams, a
        window's temperature draws), the source's positions are computed once and its rows
        copied: each row gets the bits a chunk of its own tokens gives."""
        t = np.asarray(to_numpy(tokens))
        t = check_token_ids(t, "tokens", self.model.vocab_size, what="(rows, positions)",
                            one_row=False)
        cache = self.cache
        n, T = t.shape
        if n != cache.n_rows:
            raise ValueError(f"tokens must hold {cache.n_rows} rows, got {n}")
        if cache.length:
            raise ValueError("prefill needs an empty cache")
        g, ns = cache.group, cache.n_src
        shared = g > 1 and bool((t.reshape(ns, g, T) == t[::g][:, None]).all())
        if shared:
            cache.n_rows, cache.group = ns, 1
            try:
                h = self.model._decode(cache, np.ascontiguousarray(t[::g]), self.n_threads)
            finally:
                cache.n_rows, cache.group = n, g
            cache.spread(g)
        else:
            h = self.model._decode(cache, t, self.n_threads)
        h = h.reshape(ns if shared else n, T, -1)
        out = []
        for p in positions:
            lg = self.model._project(np.ascontiguousarray(h[:, p]), self.n_threads)
            out.append((p, np.repeat(lg, g, axis=0) if shared else lg))
        return out

    def reorder(self, beam_idx):
        self.cache.reorder(beam_idx)

    def select_sources(self, keep):
        k = to_numpy(keep)
        if k.size and k.dtype.kind not in "iu":
            raise TypeError(f"keep must hold integer source indices, got dtype {k.dtype}")
        if k.ndim != 1:
            raise ValueError(f"keep must be a 1-D sequence of source indices, got shape {k.shape}")
        self.cache.select_sources(k.astype(np.int64, copy=False))
