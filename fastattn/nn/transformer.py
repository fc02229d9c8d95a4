"""The encoder-decoder Transformer of "Attention Is All You Need": layers, stacks, the model.

NumPy in, NumPy out, batch-first: activations are (batch, seq, d_model); unbatched (seq, d_model)
is accepted too, as in PyTorch. Inference only (no dropout, no gradients). Parameters carry
PyTorch's names and shapes (``torch.nn.Transformer(batch_first=True)``'s ``state_dict``), so
weights move both ways by name. Masks follow torch.nn (see :mod:`fastattn.nn._masks`) and are
converted once per stack, not once per layer.
"""
import copy

import numpy as np

from .._validation import (as_model_input, check_batch_pair, check_choice, check_dtype,
                           check_eps, check_option, check_positive_int)
from ..io.torch_state_dict import count_layers
from ._masks import _kernel_mask, _KernelMask
from ._module import _init_for, _Module
from .attention import MultiHeadAttention
from .feedforward import FeedForward
from .norm import Identity, LayerNorm, RMSNorm
from .positional import RelativePositionBias

__all__ = ["TransformerEncoderLayer", "TransformerDecoderLayer", "TransformerEncoder",
           "TransformerDecoder", "Transformer"]


def _make_norm(kind, d, eps, bias, dtype, init):
    if kind == "rms":
        return RMSNorm(d, eps, dtype=dtype, _init=init)
    return LayerNorm(d, eps, bias=bias, dtype=dtype, _init=init)


class _Layer(_Module):
    """What the encoder and decoder layers share: self-attention, (the decoder's cross-attention,)
    the feed-forward network, LayerNorms and one config. Parameters are drawn in this order."""

    def _common(self, d_model, nhead, dim_feedforward, activation, layer_norm_eps, norm_first,
                bias, dtype, seed, _init, cross, variant):
        dtype = check_dtype(dtype)
        bias = check_option(bias, "bias")
        layer_norm_eps = check_eps(layer_norm_eps, "layer_norm_eps")
        init = _init_for(seed, dtype, _init)
        # the variants the model families need (T5: RMS norms, no scaling of q k^T, heads whose
        # width is not d_model, gated FFN); the defaults are the paper's layer
        head_dim, attn_scale = variant.pop("head_dim", None), variant.pop("attn_scale", None)
        norm = check_choice(variant.pop("norm", "layer"), "norm", ("layer", "rms"))
        gated = check_option(variant.pop("gated", False), "gated")
        attn_norm = check_option(variant.pop("attn_norm", True), "attn_norm")
        if variant:
            raise TypeError(f"unexpected keyword argument {next(iter(variant))!r}")
        attn = dict(bias=bias, dtype=dtype, head_dim=head_dim, scale=attn_scale, _init=init)
        self.self_attn = MultiHeadAttention(d_model, nhead, **attn)
        if cross:
            self.multihead_attn = MultiHeadAttention(d_model, nhead, **attn)
        n_norms = 3 if cross else 2
        self.ff = FeedForward(d_model, dim_feedforward, activation, bias=bias, gated=gated,
                              dtype=dtype, _init=init)
        for i in range(1, n_norms + 1):
            setattr(self, f"norm{i}", _make_norm(norm, d_model, layer_norm_eps, bias, dtype, init)
                    if i > 1 or attn_norm else Identity(dtype=dtype))
        norm_first = check_option(norm_first, "norm_first")
        if norm == "rms" and not norm_first:
            raise ValueError("norm='rms' needs norm_first=True (a post-norm RMS norm is not "
                             "fused into the GEMMs)")
        self.d_model, self.nhead, self.norm_first = int(d_model), int(nhead), norm_first
        self._config = {"d_model": int(d_model), "nhead": int(nhead),
                        "dim_feedforward": int(dim_feedforward), "activation": activation,
                        "layer_norm_eps": check_eps(layer_norm_eps, "layer_norm_eps"),
                        "norm_first": norm_first, "bias": bool(bias), "dtype": dtype.name}
        if not attn_norm and not norm_first:
            raise ValueError("attn_norm=False (no norm before the attention) needs norm_first=True")
        for key, value, default in (("head_dim", head_dim, None), ("attn_scale", attn_scale, None),
                                    ("norm", norm, "layer"), ("gated", gated, False),
                                    ("attn_norm", attn_norm, True)):
            if value != default:
                self._config[key] = value
        self._params = {}
        return init

    def _ffn_children(self):
        ff = {"linear1": self.ff.linear1, "linear2": self.ff.linear2}
        if self.ff.gated:
            ff["gate"] = self.ff.gate
        return ff

    def _sublayers(self, x, sublayers, ln_threads=None):
        """Each (norm, f) in turn with a residual connection; f(h, residual, norm) returns
        norm(f(h) + residual), the addition and the LayerNorm (when given) fused into its last
        GEMM: post-LN (the paper's) x = norm(x + f(x)); pre-LN (norm_first) x = x + f(norm(x))."""
        for norm, f in sublayers:
            x = f(norm._forward(x, n_threads=ln_threads), x, None) if self.norm_first \
                else f(x, x, norm)
        return x

    def _prepack(self):
        """Pack every weight now (the models do, once their weights are in)."""
        self.self_attn._prepack()
        if hasattr(self, "multihead_attn"):
            self.multihead_attn._prepack(cross=True)
        self.ff._prepack()

    @classmethod
    def _config_from_state_dict(cls, sd, prefix, config):
        config = dict(config)
        if "nhead" not in config:
            raise TypeError("from_torch_state_dict needs nhead= (the head count is not in the shapes)")
        w1 = sd.get(prefix + "linear1.weight")
        if w1 is None:
            raise ValueError(f"state_dict has no {prefix}linear1.weight")
        config.setdefault("d_model", w1.shape[1])
        config.setdefault("dim_feedforward", w1.shape[0])
        config.setdefault("bias", prefix + "linear1.bias" in sd)
        return config



class TransformerEncoderLayer(_Layer):
    """Self-attention then feed-forward, each with a residual connection and LayerNorm.

    ``norm_first=False`` (the paper's post-LN): x = norm1(x + sa(x)); x = norm2(x + ff(x)).
    ``norm_first=True`` (pre-LN): x = x + sa(norm1(x)); x = x + ff(norm2(x)).
    Parameter names as torch.nn.TransformerEncoderLayer: self_attn.*, linear1.*, linear2.*,
    norm1.*, norm2.*. Call ``layer(src, src_mask=None, src_key_padding_mask=None, is_causal=False)``.
    """

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.0, activation="relu",
                 layer_norm_eps=1e-5, norm_first=False, bias=True, *, dtype=np.float32, seed=None,
                 _init=None, **variant):
        self._common(d_model, nhead, dim_feedforward, activation, layer_norm_eps, norm_first,
                     bias, dtype, seed, _init, cross=False, variant=variant)
        self._children = {"self_attn": self.self_attn, **self._ffn_children(),
                          "norm1": self.norm1, "norm2": self.norm2}
        if isinstance(self.norm1, Identity):
            del self._children["norm1"]

    def _forward(self, x, B, T, kmask, keep=None, n_threads=None, attn_threads=None, rope=None):
        """x: (B*T, d_model) C-contiguous, owned (may be overwritten) -> (B*T, d_model); with
        `keep` (a RowSubset) x holds only those rows (the real tokens), and so does the result.
        attn_threads: the attention's thread count, when it differs from the GEMMs'; rope:
        (cos, sin) rotary tables (T, head_dim) for q and k."""
        return self._sublayers(x, (
            (self.norm1, lambda h, r, n: self.self_attn._forward(
                h, h, h, B, T, T, kmask, residual=r, norm=n, keep=keep, n_threads=n_threads,
                attn_threads=attn_threads, rope=rope)[0]),
            (self.norm2, lambda h, r, n: self.ff._forward(h, r, n, n_threads))), n_threads)

    def __call__(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        return _encoder_call(self, src, src_mask, "src_mask", src_key_padding_mask, is_causal)


class TransformerDecoderLayer(_Layer):
    """Masked self-attention, cross-attention over the encoder memory, feed-forward; each with a
    residual connection and LayerNorm (post-LN by default, pre-LN with ``norm_first=True``).

    Parameter names as torch.nn.TransformerDecoderLayer: self_attn.*, multihead_attn.*, linear1.*,
    linear2.*, norm1.*, norm2.*, norm3.*. Call ``layer(tgt, memory, tgt_mask=None,
    memory_mask=None, tgt_key_padding_mask=None, memory_key_padding_mask=None,
    tgt_is_causal=False, memory_is_causal=False)``.
    """

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.0, activation="relu",
                 layer_norm_eps=1e-5, norm_first=False, bias=True, *, dtype=np.float32, seed=None,
                 _init=None, **variant):
        self._common(d_model, nhead, dim_feedforward, activation, layer_norm_eps, norm_first,
                     bias, dtype, seed, _init, cross=True, variant=variant)
        self._children = {"self_attn": self.self_attn, "multihead_attn": self.multihead_attn,
                          **self._ffn_children(), "norm1": self.norm1, "norm2": self.norm2,
                          "norm3": self.norm3}

    def _forward(self, x, mem, B, T, S, tmask, mmask, n_threads=None, *, cache=None,
                 ln_threads=None):
        """x: (B*T, d) owned -> (B*T, d): T positions of B rows.

        Without `cache`, the whole target at once: mem (B*S, d) read only, tmask and mmask
        the self- and cross-attention's _KernelMask. With `cache` (incremental decoding: this
        layer's view of a :class:`fastattn.generation.KVCache`, ``cache.layer(i)``): x holds
        the positions [t0, t0 + T) of the B rows (the rows of one of ``cache.n_src`` sources
        consecutive); ``cache.append(k, v)`` stores their self-attention keys and values and
        returns every position's so far, ``cache.cross`` is the memory's keys and values
        computed once per source (MultiHeadAttention._cross_kv) and ``cache.memory_mask`` its
        padding; mem, S and mmask are unused, and tmask is an additive bias (1, H, T, t0 + T)
        on the self-attention scores (T5's positions) or None. ln_threads: the pre-norm
        LayerNorms' thread count there (a decode step's are microseconds of work).

        The sublayers are spelled out (not _sublayers' closures): a decode step runs this per
        layer and token, where every Python call counts (batch 1 is bound by reading the
        weights, ~2 ms a step)."""
        if cache is None:
            ln_threads = n_threads
        h, norm = self._norm_in(self.norm1, x, ln_threads)
        if cache is None:
            x = self.self_attn._forward(h, h, h, B, T, T, tmask, residual=x, norm=norm,
                                        n_threads=n_threads)[0]
        else:
            x = self.self_attn._step_self(h, B, T, cache.append, x, norm, n_threads, tmask)
        h, norm = self._norm_in(self.norm2, x, ln_threads)
        if cache is None:
            x = self.multihead_attn._forward(h, mem, mem, B, T, S, mmask, residual=x, norm=norm,
                                             n_threads=n_threads)[0]
        else:
            k, v = cache.cross
            x = self.multihead_attn._step_cross(h, k, v, cache.memory_mask, cache.n_src,
                                                B * T // cache.n_src, x, norm, n_threads,
                                                padded=T > 1)
        h, norm = self._norm_in(self.norm3, x, ln_threads)
        return self.ff._forward(h, x, norm, n_threads)

    def _norm_in(self, norm, x, n_threads):
        """A sublayer's input and the norm its last GEMM applies: pre-norm (norm(x), None),
        post-norm (x, norm) (x = norm(x + f(x)), the norm fused into f's output GEMM)."""
        if self.norm_first:
            return norm._forward(x, n_threads=n_threads), None
        return x, norm

    def __call__(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                 memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False):
        return _decoder_call(self, tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
                             memory_key_padding_mask, tgt_is_causal, memory_is_causal)


class _Stack(_Module):
    """``num_layers`` layers of `layer_class`, then an optional final LayerNorm. Names: layers.N.*,
    norm.*. Subclasses name the layer class and their call's arguments."""

    layer_class = None
    _layer_arg = None          # the constructor argument's name, for error messages

    def __init__(self, layer, num_layers, norm=None):
        if not isinstance(layer, self.layer_class):
            raise TypeError(f"{self._layer_arg} must be a {self.layer_class.__name__}")
        num_layers = check_positive_int(num_layers, "num_layers")
        if norm is not None and not isinstance(norm, LayerNorm):
            raise TypeError("norm must be a LayerNorm or None")
        self._init_common([layer] + [copy.deepcopy(layer) for _ in range(num_layers - 1)], norm)

    def _init_common(self, layers, norm, position_bias=None):
        self.layers, self.norm, self.position_bias = layers, norm, position_bias
        self.d_model, self.nhead = layers[0].d_model, layers[0].nhead
        self._config = dict(layers[0]._config, num_layers=len(layers), final_norm=norm is not None)
        self._params = {}
        self._children = {f"layers.{i}": lyr for i, lyr in enumerate(layers)}
        if norm is not None:
            self._children["norm"] = norm
        if position_bias is not None:
            self._children["position_bias"] = position_bias

    @classmethod
    def _of_layers(cls, layers, norm=None, position_bias=None):
        """The stack of the given layers (built by the caller: they may differ, e.g.
        ModernBERT's first layer has no norm before its attention), final norm and position
        bias."""
        self = cls.__new__(cls)
        self._init_common(list(layers), norm, position_bias)
        return self

    @classmethod
    def _build(cls, _init=None, *, num_layers, final_norm, seed=None, position_bias=None,
               **layer_cfg):
        """The stack from layer keywords; position_bias: None or the keywords of a
        RelativePositionBias (num_buckets, max_distance; T5), shared by every layer."""
        dtype = check_dtype(layer_cfg.pop("dtype"))
        init = _init_for(seed, dtype, _init)
        layers = [cls.layer_class(dtype=dtype, _init=init, **layer_cfg)
                  for _ in range(check_positive_int(num_layers, "num_layers"))]
        norm = (_make_norm(layer_cfg.get("norm", "layer"), layers[0].d_model,
                           layer_cfg.get("layer_norm_eps", 1e-5), layer_cfg.get("bias", True),
                           dtype, init)
                if final_norm else None)
        bias = None
        if position_bias is not None:
            bias = RelativePositionBias(**position_bias, num_heads=layers[0].nhead,
                                        bidirectional=cls is TransformerEncoder, dtype=dtype,
                                        _init=init)
        return cls._of_layers(layers, norm, bias)

    def _with_position_bias(self, kmask, L, S, offset=0):
        """kmask with this stack's position bias (1, H, L, S) added (kmask itself without one)."""
        if self.position_bias is None:
            return kmask
        bias = self.position_bias._forward(L, S, offset)
        m = kmask.mask
        if m is not None:
            m = np.where(m, 0.0, -np.inf).astype(bias.dtype) if m.dtype == np.bool_ else m
            bias = bias + m                                  # (B, H, L, S)
        return _KernelMask(bias, kmask.causal)

    @classmethod
    def _config_from_state_dict(cls, sd, prefix, config):
        config = dict(config)
        config.setdefault("num_layers", count_layers(sd, prefix + "layers."))
        config.setdefault("final_norm", prefix + "norm.weight" in sd)
        return cls.layer_class._config_from_state_dict(sd, prefix + "layers.0.", config)

    def _prepack(self):
        for layer in self.layers:
            layer._prepack()


class TransformerEncoder(_Stack):
    """A stack of ``num_layers`` copies of `encoder_layer`, then an optional final LayerNorm.

    Names: layers.N.*, norm.*. Call ``enc(src, mask=None, src_key_padding_mask=None,
    is_causal=False)``. Masks are converted once for the whole stack.
    """

    layer_class = TransformerEncoderLayer
    _layer_arg = "encoder_layer"

    def __init__(self, encoder_layer, num_layers, norm=None):
        super().__init__(encoder_layer, num_layers, norm)

    def _forward(self, x, B, T, kmask, n_threads=None, keep=None, attn_threads=None, rope=None):
        """x (B*T, d_model) owned -> (B*T, d_model); with `keep` (a RowSubset) x holds only
        those rows (the real tokens), and so does the result.

        kmask: the attention mask (a _KernelMask) of every layer, or a sequence of one per layer
        (ModernBERT's full and sliding-window layers); this stack's position bias (MPNet, T5)
        is added to each. rope: None, or a sequence of one (cos, sin) rotary table pair (T,
        head_dim) or None per layer. attn_threads: the attention's thread count, when it
        differs from the GEMMs'."""
        n = len(self.layers)
        masks = list(kmask) if isinstance(kmask, (list, tuple)) else [kmask] * n
        biased = {}                   # each distinct mask with the bias added once
        for m in masks:
            if id(m) not in biased:
                biased[id(m)] = self._with_position_bias(m, T, T)
        ropes = [None] * n if rope is None else rope
        for layer, m, r in zip(self.layers, masks, ropes):
            x = layer._forward(x, B, T, biased[id(m)], keep=keep, n_threads=n_threads,
                               attn_threads=attn_threads, rope=r)
        if self.norm is not None:
            x = self.norm._forward(x, n_threads=n_threads)
        return x

    def __call__(self, src, mask=None, src_key_padding_mask=None, is_causal=False):
        return _encoder_call(self, src, mask, "mask", src_key_padding_mask, is_causal)


class TransformerDecoder(_Stack):
    """A stack of ``num_layers`` copies of `decoder_layer`, then an optional final LayerNorm.

    Names: layers.N.*, norm.*. Call ``dec(tgt, memory, tgt_mask=None, memory_mask=None,
    tgt_key_padding_mask=None, memory_key_padding_mask=None, tgt_is_causal=False,
    memory_is_causal=False)``.
    """

    layer_class = TransformerDecoderLayer
    _layer_arg = "decoder_layer"

    def __init__(self, decoder_layer, num_layers, norm=None):
        super().__init__(decoder_layer, num_layers, norm)

    def _forward(self, x, mem, B, T, S, tmask, mmask, n_threads=None, *, cache=None,
                 ln_threads=None):
        """x (B*T, d_model) owned -> (B*T, d_model), through every layer (see
        TransformerDecoderLayer._forward). With `cache` (a :class:`fastattn.generation.KVCache`
        whose ``layer(i)`` is layer i's view) x holds the positions [cache.length,
        cache.length + T) of its B rows (the caller advances it afterwards); mem, S, tmask and
        mmask are unused. A cache whose rows hold different lengths (continuous batching:
        :class:`fastattn.generation.continuous.ContinuousGreedy`) gives the self-attention's key
        mask as ``cache.self_mask``."""
        if cache is None:
            tmask = self._with_position_bias(tmask, T, T)
            ln_threads = n_threads
        elif self.position_bias is None:
            tmask = getattr(cache, "self_mask", None)
        else:
            t0 = cache.length
            tmask = self.position_bias._forward(T, t0 + T, t0)
        for i, layer in enumerate(self.layers):
            x = layer._forward(x, mem, B, T, S, tmask, mmask, n_threads,
                               cache=None if cache is None else cache.layer(i),
                               ln_threads=ln_threads)
        if self.norm is not None:
            x = self.norm._forward(x, n_threads=ln_threads)
        return x

    def __call__(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                 memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False):
        return _decoder_call(self, tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
                             memory_key_padding_mask, tgt_is_causal, memory_is_causal)


def _encoder_call(module, src, mask, mask_name, src_key_padding_mask, is_causal):
    """An encoder (layer or stack) call: src (B, T, d) or (T, d) -> the same shape."""
    x, B, T, batched = as_model_input(src, "src", module.d_model, module.dtype, owned=True)
    kmask = _kernel_mask(mask, src_key_padding_mask, is_causal, B, module.nhead, T, T,
                         module.dtype, batched, mask_name, "src_key_padding_mask")
    out = module._forward(x, B, T, kmask)
    return out.reshape((B, T, module.d_model) if batched else (T, module.d_model))


def _decoder_call(module, tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
                  memory_key_padding_mask, tgt_is_causal, memory_is_causal):
    """A decoder (layer or stack) call: tgt (B, T, d) or (T, d) over memory -> tgt's shape."""
    x, B, T, batched = as_model_input(tgt, "tgt", module.d_model, module.dtype, owned=True)
    mem, Bm, S, mb = as_model_input(memory, "memory", module.d_model, module.dtype)
    check_batch_pair(tgt, memory, B, Bm, batched, mb, "tgt", "memory")
    tmask = _kernel_mask(tgt_mask, tgt_key_padding_mask, tgt_is_causal, B, module.nhead, T, T,
                         module.dtype, batched, "tgt_mask", "tgt_key_padding_mask")
    mmask = _kernel_mask(memory_mask, memory_key_padding_mask, memory_is_causal, B, module.nhead,
                         T, S, module.dtype, batched, "memory_mask", "memory_key_padding_mask")
    out = module._forward(x, mem, B, T, S, tmask, mmask)
    return out.reshape((B, T, module.d_model) if batched else (T, module.d_model))


class Transformer(_Module):
    """The encoder-decoder Transformer of "Attention Is All You Need" (batch-first, inference).

    Same constructor defaults and parameter names as ``torch.nn.Transformer`` (encoder.layers.N.*,
    encoder.norm.*, decoder.layers.N.*, decoder.norm.*); random init: Xavier-uniform matrices,
    zero biases, LayerNorm 1 / 0. Call ``model(src, tgt, *, src_mask=None, tgt_mask=None,
    memory_mask=None, src_key_padding_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, src_is_causal=False, tgt_is_causal=False,
    memory_is_causal=False)`` with src (B, S, d_model), tgt (B, T, d_model) (or unbatched);
    returns (B, T, d_model). Masks follow torch (bool True = not allowed / padding).
    """

    def __init__(self, d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6,
                 dim_feedforward=2048, dropout=0.0, activation="relu", layer_norm_eps=1e-5,
                 norm_first=False, bias=True, *, dtype=np.float32, seed=None, _init=None):
        dtype = check_dtype(dtype)
        init = _init_for(seed, dtype, _init)
        layer_cfg = dict(d_model=d_model, nhead=nhead, dim_feedforward=dim_feedforward,
                         activation=activation, layer_norm_eps=layer_norm_eps,
                         norm_first=norm_first, bias=bias, dtype=dtype)
        self.encoder = TransformerEncoder._build(
            init, num_layers=check_positive_int(num_encoder_layers, "num_encoder_layers"),
            final_norm=True, **layer_cfg)
        self.decoder = TransformerDecoder._build(
            init, num_layers=check_positive_int(num_decoder_layers, "num_decoder_layers"),
            final_norm=True, **layer_cfg)
        self.d_model, self.nhead = int(d_model), int(nhead)
        layer_config = {k: v for k, v in self.encoder.config.items()
                        if k not in ("num_layers", "final_norm")}
        self._config = dict(layer_config, num_encoder_layers=int(num_encoder_layers),
                            num_decoder_layers=int(num_decoder_layers))
        self._params = {}
        self._children = {"encoder": self.encoder, "decoder": self.decoder}

    @classmethod
    def _config_from_state_dict(cls, sd, prefix, config):
        config = dict(config)
        config.setdefault("nhead", 8)
        w1 = sd.get(prefix + "encoder.layers.0.linear1.weight")
        if w1 is None:
            w1 = sd.get(prefix + "decoder.layers.0.linear1.weight")
        if w1 is None:
            raise ValueError("state_dict has neither encoder.layers.0.linear1.weight nor "
                             "decoder.layers.0.linear1.weight")
        config.setdefault("d_model", w1.shape[1])
        config.setdefault("dim_feedforward", w1.shape[0])
        config.setdefault("bias", any(k.endswith("linear1.bias") for k in sd))
        config.setdefault("num_encoder_layers", count_layers(sd, prefix + "encoder.layers."))
        config.setdefault("num_decoder_layers", count_layers(sd, prefix + "decoder.layers."))
        return config

    @staticmethod
    def generate_square_subsequent_mask(sz, dtype=np.float32):
        """(sz, sz) float mask like torch's: 0 on and below the diagonal, -inf above (future)."""
        if isinstance(sz, (bool, np.bool_)) or not isinstance(sz, (int, np.integer)) or sz < 0:
            raise ValueError(f"sz must be an integer >= 0, got {sz!r}")
        sz = int(sz)
        return np.triu(np.full((sz, sz), -np.inf, dtype=check_dtype(dtype)), k=1)

    def __call__(self, src, tgt, *, src_mask=None, tgt_mask=None, memory_mask=None,
                 src_key_padding_mask=None, tgt_key_padding_mask=None,
                 memory_key_padding_mask=None, src_is_causal=False, tgt_is_causal=False,
                 memory_is_causal=False):
        dt = self.dtype
        x, B, S, batched = as_model_input(src, "src", self.d_model, dt, owned=True)
        y, Bt, T, tb = as_model_input(tgt, "tgt", self.d_model, dt, owned=True)
        check_batch_pair(src, tgt, B, Bt, batched, tb, "src", "tgt")
        H = self.nhead
        smask = _kernel_mask(src_mask, src_key_padding_mask, src_is_causal, B, H, S, S, dt, batched,
                             "src_mask", "src_key_padding_mask")
        tmask = _kernel_mask(tgt_mask, tgt_key_padding_mask, tgt_is_causal, B, H, T, T, dt, batched,
                             "tgt_mask", "tgt_key_padding_mask")
        mmask = _kernel_mask(memory_mask, memory_key_padding_mask, memory_is_causal, B, H, T, S, dt,
                             batched, "memory_mask", "memory_key_padding_mask")
        memory = self.encoder._forward(x, B, S, smask)
        out = self.decoder._forward(y, memory, B, T, S, tmask, mmask)
        return out.reshape((B, T, self.d_model) if batched else (T, self.d_model))
