"""EncoderModel: BERT-family encoders and sentence embeddings from a Hugging Face folder.

No torch, no transformers at run time: weights come from ``model.safetensors`` through the
``safetensors`` NumPy API (:mod:`fastattn.io.huggingface`), into fastattn.nn's network: an
:class:`~fastattn.nn.Embedding` (word + token type + position, LayerNorm, one C pass) and a
:class:`~fastattn.nn.TransformerEncoder` (post-norm layers, or ModernBERT's pre-norm ones and
final norm; MPNet's position bias), then pooling. The model computes the network's arguments
(position ids, the padding mask, ModernBERT's per-layer masks and rotary tables) and calls no
kernel. Beside it: ``_encoder_weights.py`` (config.json through the family of its model_type,
the checkpoint's tensors through its name map), ``_sentence_transformers.py`` (modules.json and
each module's config, pooling, Dense). :meth:`EncoderModel.embed` is the one path from the last
hidden state to a sentence vector: ``fastattn.SentenceEncoder``, ``fastattn embed`` and the
server's ``/v1/embeddings`` all go through it.
"""
import os

import numpy as np

from .._memory import check_plan, release_free_memory
from .._quant import check_quantize
from .._validation import check_dtype, check_token_ids, hf_attention_mask
from ..io import saved as _saved
from ..nn._masks import _KernelMask
from ..nn._module import _Init
from ..nn.attention import RowSubset
from ..nn.embedding import Embedding
from ..nn.norm import LayerNorm
from ..nn.positional import RelativePositionBias, counted_position_ids, rotary_tables
from ..nn.transformer import TransformerEncoder, TransformerEncoderLayer
from . import _ct2
from ._encoder_weights import load_config, load_weights
from ._sentence_transformers import (POOLING_MODES, check_pooling, l2_normalize, pool,
                                     pooling_from_config, read_dense, read_folder,
                                     transformer_config)

__all__ = ["EncoderModel", "POOLING_MODES", "pool"]

# below this many multiply-adds per score pass (B * heads * S * S * head_dim), attention runs
# on one thread
_ATTN_ONE_THREAD = 1 << 20


class EncoderModel:
    """A BERT-family encoder (post-norm layers) with sentence-transformers pooling.

    Build one with :meth:`from_pretrained`. Calling it gives the last hidden state;
    :meth:`embed` gives pooled (and, as the folder says, L2-normalised) sentence vectors.

    Attributes
    ----------
    config : fastattn.models.bert.EncoderConfig
    dtype : numpy.dtype (float32 or float64)
    hidden_size : int
    pooling : tuple of str, the modes of :data:`POOLING_MODES` embed uses by default, in their
        order of concatenation
    dense : list of the folder's sentence-transformers Dense modules, applied in order
    normalize : bool, whether embed L2-normalises by default (a Normalize module)
    truncate_dim : int or None, the folder's truncate_dim (config_sentence_transformers.json):
        embed keeps the first truncate_dim values of each vector
    embedding_dim : int, the size of embed's vectors (the last module's)
    max_seq_length : int or None, a sentence-transformers folder's truncation length
        (sentence_bert_config.json): truncate token ids to it, as sentence-transformers does;
        the model itself accepts up to ``config.max_tokens``
    """

    def __init__(self, config, dtype=np.float32, pooling=("mean",), normalize=True):
        """The network for `config` (an EncoderConfig), its parameters uninitialised: use
        :meth:`from_pretrained`, which reads them in."""
        self.config = config
        self.dtype = np.dtype(dtype)
        self.hidden_size = config.hidden_size
        self.pooling = check_pooling(pooling)
        self.normalize = bool(normalize)
        self.max_seq_length = None
        self.dense = []          # sentence-transformers Dense modules
        self.truncate_dim = None
        self._quantize = None
        init = _Init.empty(self.dtype)
        c = config
        eps = c.layer_norm_eps
        self.embeddings = Embedding(c.vocab_size, c.hidden_size,
                                    positions="learned" if c.learned_positions else None,
                                    max_positions=c.max_position_embeddings,
                                    type_vocab_size=c.type_vocab_size, layer_norm_eps=eps,
                                    norm_bias=c.bias, dtype=self.dtype, _init=init)
        # BERT's post-norm blocks: q/k/v one GEMM, the activation fused into the first FFN
        # GEMM's epilogue, each residual and LayerNorm into the second GEMM of its sublayer;
        # ModernBERT's pre-norm ones (the first without a norm before its attention)
        layers = [TransformerEncoderLayer(c.hidden_size, c.num_heads, c.intermediate_size,
                                          activation=c.activation, layer_norm_eps=eps,
                                          norm_first=c.norm_first, bias=c.bias, gated=c.gated,
                                          attn_norm=i > 0 or c.first_attn_norm,
                                          dtype=self.dtype, _init=init)
                  for i in range(c.num_layers)]
        final_norm = LayerNorm(c.hidden_size, eps, bias=c.bias, dtype=self.dtype,
                               _init=init) if c.final_norm else None
        position_bias = RelativePositionBias(
            c.relative_attention_num_buckets, c.relative_attention_max_distance, c.num_heads,
            True, dtype=self.dtype, _init=init) if c.relative_attention_num_buckets else None
        self.encoder = TransformerEncoder._of_layers(layers, final_norm, position_bias)

    # the network's parts under the names the checkpoints' name maps and saved folders use
    # (``layers.N.*``, ``final_norm.*``, ``position_bias.*``)
    @property
    def layers(self):
        return self.encoder.layers

    @property
    def final_norm(self):
        return self.encoder.norm

    @property
    def position_bias(self):
        return self.encoder.position_bias

    def state_dict(self):
        """The parameters by fastattn.nn name (``embeddings.weight``, ``layers.0.self_attn.
        in_proj_weight`` ...; the family's name map (:mod:`fastattn.models.registry`) gives
        each checkpoint tensor's place), as read-only views: the layers run on packed copies of
        them."""
        out = {}
        for k, v in self._arrays().items():
            view = v.view() if isinstance(v, np.ndarray) else v.dequantize()
            view.flags.writeable = False
            out[k] = view
        return out

    @property
    def embedding_dim(self):
        return self.output_dim()

    def output_dim(self, truncate_dim="folder"):
        """The size of :meth:`embed`'s vectors with that `truncate_dim` (its argument)."""
        width = self.dense[-1].out_features if self.dense else \
            self.hidden_size * len(self.pooling)
        dim = check_truncate_dim(self.truncate_dim if truncate_dim == "folder" else truncate_dim)
        return width if dim is None else min(width, dim)

    @property
    def quantize(self):
        """'int8' when the linear layers compute with int8 weights, else None."""
        return self._quantize

    def _saved_params(self):
        out = dict(self._arrays())
        for i, d in enumerate(self.dense):
            out.update(d.named_arrays(f"dense.{i}."))
        return out

    def save_pretrained(self, path, *, progress=None):
        """Write the model to the folder `path` in fastattn's own format (fastattn/io/saved.py):
        int8 weights as their packed panels and scales, mapped by :meth:`from_pretrained` with
        no quantizing or repacking. The folder the model came from is copied along but its
        weight files (tokenizer, configs, sentence-transformers modules): a SentenceEncoder
        loads the new folder. ``progress(done_bytes, total_bytes)`` is called as the weights
        are written."""
        src = getattr(self, "_source", None)
        if src and _ct2.is_ct2_folder(self._model_dir):
            raise ValueError(f"{self._model_dir} is a CTranslate2 encoder folder: saving a model "
                             "loaded from it is not supported (save the Hugging Face folder it "
                             "was converted from)")
        rel = os.path.relpath(self._model_dir, src) if src else None
        meta = {"class": type(self).__name__, "quantize": self._quantize,
                "dtype": self.dtype.name}
        _saved.write_folder(path, self._saved_params(), meta, source=src,
                            model_dir=None if rel in (None, ".") else rel, progress=progress)

    def _assign_saved(self, saved, model_dir):
        """Put a saved folder's mapped arrays in place of the (empty) parameters."""
        modules = [("embeddings", self.embeddings)] + [
            (f"layers.{i}", layer) for i, layer in enumerate(self.layers)] + [
            (n, m) for n, m in (("final_norm", self.final_norm),
                                ("position_bias", self.position_bias)) if m is not None]
        _saved.assign(saved, modules, model_dir)

    def _plan(self, B, S):
        """An upper bound of the bytes a forward over B x S tokens holds at once: the
        embeddings, q/k/v (and their zero-padded scatter), the heads' output, the projections,
        the FFN's hidden, the attention workspace (packed K and V), the position ids and the
        result: (14 H + I) values and 32 bytes of ids a token."""
        cfg = self.config
        return B * S * ((14 * cfg.hidden_size + cfg.intermediate_size) * self.dtype.itemsize + 32)

    def _array(self, name):
        """The parameter array of fastattn.nn name `name` (see :meth:`_arrays`)."""
        head, _, rest = name.partition(".")
        if head == "layers":
            i, _, rest = rest.partition(".")
            module = self.layers[int(i)]
        else:
            module = getattr(self, head)
        for owner_name, arr, _, _ in module._named_params():
            if owner_name == rest:
                return arr
        raise KeyError(name)

    def _arrays(self):
        """fastattn.nn name -> parameter array (``embeddings.*``, ``layers.N.*``)."""
        out = {f"embeddings.{n}": a for n, a, _, _ in self.embeddings._named_params()}
        for i, layer in enumerate(self.layers):
            out.update((f"layers.{i}.{n}", a) for n, a, _, _ in layer._named_params())
        for name, module in (("final_norm", self.final_norm), ("position_bias", self.position_bias)):
            if module is not None:
                out.update((f"{name}.{n}", a) for n, a, _, _ in module._named_params())
        return out

    def __repr__(self):
        c = self.config
        return (f"EncoderModel(model_type={c.model_type!r}, layers={c.num_layers}, "
                f"hidden_size={c.hidden_size}, heads={c.num_heads}, "
                f"hidden_act={c.hidden_act!r}, dtype={self.dtype.name}, "
                f"pooling={self.pooling}, normalize={self.normalize}"
                + (f", quantize={self._quantize!r})" if self._quantize else ")"))

    @classmethod
    def from_pretrained(cls, path, dtype=np.float32, quantize=None):
        """Load a local Hugging Face / sentence-transformers model folder.

        Parameters
        ----------
        path : str or os.PathLike
            A folder with config.json and model.safetensors (or a sharded
            model.safetensors.index.json), or a sentence-transformers folder whose
            modules.json points at them (Transformer, Pooling, optional Dense and Dropout
            modules, optional Normalize; config_sentence_transformers.json's truncate_dim).
        dtype : numpy.float32 or numpy.float64
            Compute dtype; the weights are converted once, at load.
        quantize : None, 'int8' or 'bfloat16'
            'int8': the linear layers (attention projections, FFN, Dense modules) compute with
            int8 weights (one scale per output channel) and int8 activations quantized per
            row; embeddings, norms and attention stay float32. float32 only.

        Raises
        ------
        FileNotFoundError naming the missing file; ValueError naming the unsupported config
        field, module, or bad tensor (see :func:`fastattn.models._encoder_weights.load_config`
        and the families' ``read_config``).
        """
        try:
            if dtype is None:          # np.dtype(None) would be float64
                raise TypeError("dtype must be float32 or float64, got None")
            dt = check_dtype(dtype)
        except TypeError as exc:
            raise ValueError(str(exc)) from None
        check_quantize(quantize, dt)
        folder = read_folder(path)
        model_dir = folder.model_dir
        family, config = load_config(model_dir)
        quantize = _ct2.folder_quantize(model_dir, quantize, dt, model_dir)  # CTranslate2 int8
        pooling = folder.pooling if isinstance(folder.pooling, tuple) else \
            pooling_from_config(os.path.join(folder.pooling, "config.json"), config.hidden_size)
        saved = None
        if _saved.is_saved_folder(model_dir):    # written by save_pretrained: mapped
            meta = _saved.read_meta(model_dir, cls.__name__)
            if meta.get("dtype") != dt.name:
                raise ValueError(f"dtype={dt.name}: {os.path.join(model_dir, _saved.MODEL_FILE)}"
                                 f" holds a {meta.get('dtype')} model")
            saved = _saved.read_folder(model_dir)
            if quantize is None and meta.get("quantize") is not None:
                quantize = meta["quantize"]
        model = cls(config, dt, pooling, folder.normalize)
        model.pooling = pooling                  # the folder's order of concatenation
        if saved is None:                        # read layer by layer, each converted at once
            def layer_done(i):
                if quantize is not None:
                    model.layers[i].quantize_(quantize)
                else:
                    model.layers[i].compact_()
                release_free_memory()
            load_weights(model_dir, family, config, model._array, layer_done, model)
        else:
            model._assign_saved(saved, model_dir)
        width = config.hidden_size * len(pooling)
        for i, dense_dir in enumerate(folder.dense):     # sentence-transformers Dense modules
            model.dense.append(read_dense(dense_dir, width, dt, saved, f"dense.{i}."))
            width = model.dense[-1].out_features
        model._source, model._model_dir = os.fspath(path), model_dir
        dense_linears = [lin for d in model.dense for lin in d.linears()]
        if quantize is not None:
            model._quantize = quantize
            for module in [model.embeddings] + model.layers + dense_linears:
                module.quantize_(quantize)
        else:                                    # each linear weight held once, packed
            for module in model.layers + dense_linears:
                module.compact_()
        release_free_memory()                    # the float arrays just freed
        for layer in model.layers:
            layer._prepack()
        for d in model.dense:
            d.prepack()
        model.truncate_dim = folder.truncate_dim
        if folder.st_folder:
            model.max_seq_length = transformer_config(model_dir,
                                                      config.max_tokens)["max_seq_length"]
        return model

    # -- inputs --------------------------------------------------------------------------------

    def _check_ids(self, input_ids, attention_mask, token_type_ids):
        cfg = self.config
        ids = check_token_ids(input_ids, "input_ids", cfg.vocab_size, what="(batch, seq_len)",
                              one_row=False)
        B, S = ids.shape
        n, what, pad = S, "tokens per row", ""
        if cfg.positions_after_padding and S > cfg.max_tokens and ids.size:
            # RoBERTa's positions count the non-padding tokens (padding keeps the padding id's
            # position), so only those are limited, as in transformers
            n = int((ids != cfg.pad_token_id).sum(axis=1).max())
            what, pad = "non-padding tokens in a row", f", pad_token_id={cfg.pad_token_id}"
        if n > cfg.max_tokens:
            raise ValueError(
                f"input_ids has {n} {what}; this {cfg.model_type} model allows at most "
                f"{cfg.max_tokens} (config max_position_embeddings="
                f"{cfg.max_position_embeddings}{pad}); truncate the input")
        ids = ids.astype(np.intp, copy=False)

        mask = None if attention_mask is None else hf_attention_mask(attention_mask, ids.shape)

        if token_type_ids is None:
            tt = None
        else:
            tt = np.asarray(token_type_ids)
            if tt.dtype.kind not in "iu":
                raise TypeError(f"token_type_ids must be integers, got dtype {tt.dtype}")
            if tt.shape != ids.shape:
                raise ValueError(f"token_type_ids must have the shape of input_ids "
                                 f"{ids.shape}, got {tt.shape}")
            n_types = cfg.type_vocab_size
            if tt.size and (tt.min() < 0 or tt.max() >= max(n_types, 1)):
                bad = tt.min() if tt.min() < 0 else tt.max()
                if n_types == 0:
                    raise ValueError(f"token_type_ids holds {bad}, but this {cfg.model_type} "
                                     "model has no token types (pass zeros or None)")
                raise ValueError(f"token_type_ids holds {bad}, outside [0, type_vocab_size="
                                 f"{n_types})")
            tt = tt.astype(np.intp, copy=False) if n_types else None
        return ids, mask, tt

    # -- forward -------------------------------------------------------------------------------

    def _position_ids(self, ids):
        cfg = self.config
        S = ids.shape[1]
        if not cfg.positions_after_padding:
            return np.arange(S)[None, :]
        # RoBERTa: pad + cumulative count of non-padding ids; padding tokens get pad itself
        # (MPNet counts from its fixed padding_idx 1 but looks for the pad id)
        return counted_position_ids(ids, cfg.pad_token_id, cfg.padding_idx)

    def _embeddings(self, ids, tt, keep):
        """LN(word + token type + position) for the flat token positions `keep` (all: None);
        returns (N, H). One pass in C: the rows gathered, summed in that order and normalised
        (the same bits as gathering, adding and normalising array by array)."""
        return self.embeddings._forward(ids, position_ids=self._position_ids(ids),
                                        token_type_ids=tt, keep=keep)

    def _layer_args(self, S, kmask):
        """The network's per-layer arguments: (the attention mask(s), the rotary tables or
        None). ModernBERT: per layer, its kind's ("full", "sliding") mask (sliding: only the
        keys within local_attention // 2 positions) and rotary tables (cos, sin) of its base;
        the other families: kmask for every layer, no rotary tables."""
        cfg = self.config
        if not cfg.layer_types:
            return kmask, None
        pos = np.arange(S)
        ropes = {kind: rotary_tables(pos, cfg.head_dim, theta, self.dtype)
                 for kind, theta in zip(("full", "sliding"), cfg.rope_theta)}
        band = np.abs(pos[:, None] - pos[None, :]) <= cfg.local_attention // 2      # (S, S)
        local = band[None, None] if kmask.mask is None else np.logical_and(band, kmask.mask)
        masks = {"full": kmask, "sliding": _KernelMask(local, False)}
        return [masks[k] for k in cfg.layer_types], [ropes[k] for k in cfg.layer_types]

    def _forward(self, ids, mask, tt, packed=False):
        """(B, S, H) last hidden state. packed=True computes the real tokens only (the dense
        layers skip padding); padding positions of the result are then zeros."""
        cfg = self.config
        B, S = ids.shape
        H = self.hidden_size
        if B == 0 or S == 0:
            return np.zeros((B, S, H), dtype=self.dtype)
        padded = mask is not None and not mask.all()
        # key padding as an SDPA bool mask, True = may attend; none when nothing is padded (the
        # network adds MPNet's position bias to it)
        kmask = _KernelMask(mask[:, None, None, :] if padded else None, False)
        keep = RowSubset(np.flatnonzero(mask), B * S) if padded and packed else None
        x = self._embeddings(ids, tt, None if keep is None else keep.index)
        # tiny problems (a short query) run attention on one thread: waking a second OpenMP
        # thread costs more than the whole call (~0.1 ms for 1 x 16 tokens x 12 heads)
        attn_threads = 1 if B * cfg.num_heads * S * S * cfg.head_dim < _ATTN_ONE_THREAD else None
        masks, ropes = self._layer_args(S, kmask)
        x = self.encoder._forward(x, B, S, masks, keep=keep, attn_threads=attn_threads,
                                  rope=ropes)
        if keep is None:
            return x.reshape(B, S, H)
        out = np.zeros((B * S, H), dtype=self.dtype)
        out[keep.index] = x
        return out.reshape(B, S, H)

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None):
        """The last hidden state.

        Parameters
        ----------
        input_ids : array_like of int, shape (B, S)
            Token ids in [0, vocab_size); S at most the model's position limit.
        attention_mask : array_like of int / bool (or float 0/1), shape (B, S), optional
            Hugging Face convention: 1 (True) = real token, 0 (False) = padding. Padding keys
            are ignored by every query. None: no padding.
        token_type_ids : array_like of int, shape (B, S), optional
            Segment ids in [0, type_vocab_size); default zeros.

        Returns
        -------
        ndarray, shape (B, S, hidden_size), in the model's dtype. Rows of padding tokens hold
        finite values that mean nothing (as in transformers); a fully padded sequence gives
        finite values too.
        """
        ids, mask, tt = self._check_ids(input_ids, attention_mask, token_type_ids)
        check_plan(self._plan(*ids.shape), f"EncoderModel(input_ids {ids.shape})")
        return self._forward(ids, mask, tt)

    forward = __call__

    def embed(self, input_ids, attention_mask=None, token_type_ids=None, *, pooling=None,
              normalize=None, truncate_dim="folder"):
        """Sentence vectors: the last hidden state pooled over each sequence's tokens, then the
        folder's Dense modules, Normalize module and truncate_dim, as sentence-transformers'
        ``encode`` runs them.

        Parameters
        ----------
        input_ids, attention_mask, token_type_ids : as for :meth:`__call__`.
        pooling : str or sequence of str, optional
            Modes from :data:`POOLING_MODES` — "cls" (first position), "max" (element-wise max
            over tokens), "mean", "mean_sqrt_len" (sum / sqrt(token count)). Several modes are
            concatenated in that order, as sentence-transformers does. Default: the folder's.
            With Dense modules, the modes must give the width the first one takes.
        normalize : bool, optional
            Default (None): the folder's modules (a Normalize module normalises before
            truncate_dim, as in sentence-transformers). True: each returned vector is
            L2-normalised (after truncate_dim; sentence-transformers'
            ``normalize_embeddings=True``). False: no normalisation (a Normalize module is
            skipped). Zero vectors stay zero.
        truncate_dim : "folder", int or None
            "folder" (default): the folder's truncate_dim. An int: keep the first
            truncate_dim values of each vector (all of them when it has fewer), in place of
            the folder's; None: keep them all (sentence-transformers' ``encode(truncate_dim=)``
            and its model's ``truncate_dim``).

        Returns
        -------
        ndarray, shape (B, embedding_dim), in the model's dtype (with `pooling`: the width it
        gives, or the last Dense module's). A sequence with no token (mask all 0) gives a zero
        vector, or the Dense modules' value of one.

        Each row's vector is bitwise the same whatever else is in the batch.
        """
        modes = self.pooling if pooling is None else check_pooling(pooling)
        norm = None if normalize is None else _check_flag(normalize, "normalize")
        keep = check_truncate_dim(self.truncate_dim if truncate_dim == "folder"
                                  else truncate_dim)
        width = self.hidden_size * len(modes)
        if self.dense and width != self.dense[0].in_features:
            raise ValueError(f"pooling={pooling!r} gives {width} values per sentence; the "
                             f"folder's first Dense module takes {self.dense[0].in_features}")
        ids, mask, tt = self._check_ids(input_ids, attention_mask, token_type_ids)
        check_plan(self._plan(*ids.shape) + ids.shape[0] * width * 8,
                   f"embed(input_ids {ids.shape})")
        # pooling reads real tokens only, so the dense layers may skip padding (packed);
        # "cls" reads position 0, which must then be a real token
        packed = "cls" not in modes or mask is None or bool(mask[:, 0].all())
        hidden = self._forward(ids, mask, tt, packed=packed)
        x = pool(hidden, mask, modes, False)
        for dense in self.dense:              # each row alone through the GEMM
            x = dense(x)
        if norm is None and self.normalize:   # the Normalize module, where it stands
            x = l2_normalize(x)
        if keep is not None and keep < x.shape[1]:
            x = np.ascontiguousarray(x[:, :keep])
        return l2_normalize(x) if norm else x


def check_truncate_dim(value):
    """A truncate_dim argument (an int >= 1, or None: no truncation), else TypeError /
    ValueError naming it."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"truncate_dim must be a positive int, None or 'folder', got {value!r}")
    if value < 1:
        raise ValueError(f"truncate_dim must be a positive int, got {value}")
    return int(value)


def _check_flag(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)
