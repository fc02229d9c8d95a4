"""Seq2SeqTransformer's parameters: their Hugging Face names, random initialisation, int8 /
packed conversion, state_dict in and out, and folders in and out (a Hugging Face checkpoint
streamed layer by layer; fastattn's own saved folders, memory-mapped).

:class:`Seq2SeqWeights` is a part of :class:`fastattn.Seq2SeqTransformer` (its base class): the
methods here read the network the model builds (``_layers``: the fastattn.nn layers by name)
through the name map of the model's family (:mod:`fastattn.models.registry`).
"""
import math
import os

import numpy as np

from .._memory import release_free_memory
from .._ops import _aligned_empty
from .._quant import check_quantize
from .._validation import check_seed
from ..generation.config import check_generation_ids, read_generation_config
from ..io import saved as _saved
from ..io.huggingface import Checkpoint, checkpoint_files, read_json, read_safetensors
from . import _ct2, registry

__all__ = ["Seq2SeqWeights", "EMPTY", "read_checkpoint"]

EMPTY = object()      # Seq2SeqTransformer(_state_dict=EMPTY): no weights (a saved folder's are
                      # mapped in)


class Seq2SeqWeights:
    """The parameter and folder methods of :class:`fastattn.Seq2SeqTransformer`."""

    def _map_params(self):
        """The parameters by Hugging Face name: views into the layers' float arrays
        (_params), and the int8 weights with their rows and shape (_qparams)."""
        arrays = {f"{lname}.{name}": arr for lname, layer in self._layers.items()
                  for name, arr, _, _ in layer._named_params()}
        params, qparams, order = {}, {}, []
        for hf, name, rows, shape, _ in self._family.name_map(self._config):
            order.append(hf)
            arr = arrays[name]
            if not isinstance(arr, np.ndarray):      # int8, or a float weight held packed
                qparams[hf] = (arr, rows, shape)
            else:
                params[hf] = (arr if rows is None else arr[rows[0]:rows[1]]).reshape(shape)
        self._params, self._qparams, self._order = params, qparams, order

    def _init_random(self, seed):
        rng = np.random.default_rng(check_seed(seed))
        for name, arr in self._params.items():
            if arr.ndim == 1 and name.endswith(".weight"):     # norms (layernorm_embedding too)
                arr[...] = 1.0
            elif name.endswith(".bias") or name == "final_logits_bias":
                arr[...] = 0.0
            else:                  # matrices and embeddings: unit-variance outputs
                arr[...] = rng.standard_normal(arr.shape) / math.sqrt(arr.shape[1])
        self._drop_packed()

    def _apply_quantize(self):
        """Quantize the linear layers (encoder, decoder, output projection) to int8 and release
        their float weights: the Hugging Face names of those weights move from _params (views)
        to _qparams (Int8Weight, rows, shape: dequantized by state_dict)."""
        memo = {}
        for layer in self._layers.values():
            layer.quantize_(self._quantize, _memo=memo)
        del memo                                 # (it holds the float arrays)
        self._map_params()
        self._drop_packed()

    def _apply_compact(self):
        """Keep each linear weight once, packed (float32 / float64 models): the Hugging Face
        names of those weights move to _qparams (read back from the panels by state_dict)."""
        for layer in (self.encoder, self.decoder, self.lm_head):
            layer.compact_()
        self._map_params()
        self._drop_packed()

    @property
    def quantize(self):
        """'int8' when the linear layers compute with int8 weights, else None."""
        return self._quantize

    def _drop_packed(self):
        """The layers pack their weights again, now (as when the model was built)."""
        for layer in self._layers.values():
            layer._drop_packed()
        self.encoder._prepack()
        self.decoder._prepack()
        self.lm_head._prepack()

    def state_dict(self):
        """Parameters by the checkpoint's Hugging Face names (the family's name map), read-only:
        views of the embeddings, norms and biases, and the linear layers' weights read back
        from the packed form they are held in (int8: the dequantized values the model computes
        with).

        Writing into them could not change the model: they are read-only (an assignment raises
        ``ValueError``). To change weights, build a new dict (``{k: v.copy() ...}``), edit it
        and pass it to :meth:`load_state_dict`.
        """
        out = {}
        for k, v in self._params.items():
            view = v.view()
            view.flags.writeable = False
            out[k] = view
        for k, (q, rows, shape) in self._qparams.items():      # the values computed with
            w = q.dequantize()
            w = (w if rows is None else w[rows[0]:rows[1]]).reshape(shape)
            w.flags.writeable = False
            out[k] = w
        return {k: out[k] for k in self._order}          # the checkpoint's order

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
        if self._quantize is not None or self._qparams or \
                not all(v.flags.writeable for v in self._params.values()):
            # weights held packed or int8, or a read-only map of a saved folder: a new model
            # from these float weights (a bad state_dict raises there and changes nothing)
            new = type(self)(**self.config, generation_config=self.generation_config,
                             dtype=self._dtype, quantize=self._quantize, _state_dict=state_dict)
            self.__dict__.update(new.__dict__)
            return
        sd = self._checked_state_dict(state_dict)
        for k, dst in self._params.items():
            sd.copy_into(k, dst)
        self._drop_packed()              # the layers' packed copies are of the old values

    def _checked_state_dict(self, state_dict):
        """`state_dict` (a mapping of arrays or tensors, or a Checkpoint read from disk) as a
        Checkpoint under the names of the model's name map, checked entry by entry without
        reading any tensor: every name present, none unexpected, shapes and float dtypes."""
        if isinstance(state_dict, Checkpoint):
            sd = state_dict
        else:
            sd = {}
            for k, v in state_dict.items():
                if hasattr(v, "detach") and hasattr(v, "numpy"):
                    v = v.detach().cpu().numpy()
                sd[k] = np.asarray(v)
            sd = Checkpoint.of_arrays(sd)
        sd = self._family.state_dict(sd, self._config)
        names = {e.checkpoint: e for e in self._family.name_map(self._config)}
        missing = [k for k in names if k not in sd]
        if missing:
            raise ValueError(f"state_dict is missing {len(missing)} parameter(s), e.g. "
                             f"{missing[:3]}")
        unexpected = [k for k in sd if k not in names]
        if unexpected:
            raise ValueError(f"state_dict has {len(unexpected)} unexpected key(s), e.g. "
                             f"{unexpected[:3]}")
        # every entry is checked before any is copied: a bad state_dict changes nothing
        for k, e in names.items():
            shape = e.shape
            if sd.shape(k) != tuple(shape):
                raise ValueError(f"{k}: shape {sd.shape(k)} does not match the model's "
                                 f"{tuple(shape)}")
            if sd.dtype(k).kind != "f":
                raise TypeError(f"{k}: expected floating-point values, got {sd.dtype(k)}")
        return sd

    def _load_streaming(self, state_dict, quantize):
        """Fill a newly built network from `state_dict` one layer at a time: each layer's
        tensors are read (from disk, for a Checkpoint) into its float arrays, then the layer is
        packed (float) or quantized (int8) and its float arrays let go before the next layer
        is read. The embeddings, output projection and final norms come last
        (_apply_quantize / _apply_compact convert them). The float model is never whole in
        memory: a load peaks at the loaded model plus one layer and the largest table."""
        sd = self._checked_state_dict(state_dict)
        names = {e.checkpoint: e for e in self._family.name_map(self._config)}
        owners = {f"{lname}.{name}": (owner, key) for lname, layer in self._layers.items()
                  for name, _, owner, key in layer._named_params()}
        units = {}
        for hf, e in names.items():
            parts = e.network.split(".")
            unit = (parts[0], int(parts[2])) if parts[1:2] == ["layers"] else ("rest",)
            units.setdefault(unit, []).append(hf)
        rest = units.pop(("rest",), [])
        arena = _Arena()
        for (stack, i), hfs in list(units.items()) + [(("rest", None), rest)]:
            layer = getattr(self, stack).layers[i] if stack != "rest" else None
            if layer is not None:
                arena.lend(layer)
            if quantize is not None:           # a CTranslate2 int8 folder's own integers
                placed = _ct2.place_int8(sd, [names[hf] for hf in hfs], owners)
                hfs = [hf for hf in hfs if hf not in placed]
            for hf in hfs:
                _, nn, rows, shape, _ = names[hf]
                owner, key = owners[nn]
                arr = owner._params[key]
                dst = (arr if rows is None else arr[rows[0]:rows[1]]).reshape(shape)
                sd.copy_into(hf, dst)
                del arr, dst
            if layer is None:
                break
            if quantize is not None:
                layer.quantize_(quantize)
            else:
                layer.compact_()
            arena.check_returned(layer)
            release_free_memory()


    @classmethod
    def from_state_dict(cls, state_dict, dtype=np.float32, quantize=None, **config):
        """Build from a PyTorch-style state_dict (the family's Hugging Face names) and the
        architecture keywords."""
        return cls(**config, dtype=dtype, quantize=quantize, _state_dict=state_dict)

    @classmethod
    def from_pretrained(cls, path, dtype=np.float32, quantize=None):
        """Load a Hugging Face encoder-decoder folder: config.json, model.safetensors (or a
        sharded index) and generation_config.json when present; ``model_type`` ``marian``,
        ``bart``, ``mbart``, ``pegasus``, ``m2m_100`` (NLLB), ``t5`` or ``mt5`` (WhisperModel:
        ``whisper``), or a folder written by :meth:`save_pretrained`. No torch or
        transformers needed. ``quantize='int8'``: the linear layers (and the output
        projection) compute with int8 weights, one scale per output channel, and int8
        activations quantized per row; float32 only."""
        check_quantize(quantize, dtype if dtype is not None else np.float32)
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"{path} is not a directory")
        if _saved.is_saved_folder(path):
            return cls._from_saved(path, dtype, quantize)
        config, legacy, weights = read_checkpoint(path, cls._KIND)
        quantize = _ct2.folder_quantize(weights, quantize, dtype, path)
        gen = cls._read_generation(path, legacy, config)
        model = cls(**config, generation_config=gen, dtype=dtype, quantize=quantize,
                    _state_dict=weights)
        model._source = path
        return model

    @classmethod
    def _read_generation(cls, path, legacy, config):
        """The checked generation config of a Hugging Face folder: generation_config.json, or
        config.json's generation fields `legacy` (from_pretrained's hook)."""
        gen = read_generation_config(path, legacy)
        check_generation_ids(gen, config["decoder_vocab_size"], os.path.join(
            path, "generation_config.json" if os.path.exists(
                os.path.join(path, "generation_config.json")) else "config.json"))
        return gen

    def save_pretrained(self, path, *, progress=None):
        """Write the model to the folder `path` in fastattn's own format (fastattn/io/saved.py):
        int8 weights as their packed panels and scales, so that :meth:`from_pretrained` maps
        them with no quantizing or repacking; the tokenizer and configuration files of the
        folder the model came from are copied along (a Translator can load the folder).
        ``progress(done_bytes, total_bytes)`` is called as the weights are written."""
        params = {f"{lname}.{name}": arr for lname, layer in self._layers.items()
                  for name, arr, _, _ in layer._named_params()}
        meta = {"class": type(self).__name__, "quantize": self._quantize,
                "dtype": self._dtype.name, "config": self.config,
                "generation_config": self.generation_config}
        _saved.write_folder(path, params, meta, source=getattr(self, "_source", None),
                            progress=progress)

    @classmethod
    def _from_saved(cls, path, dtype, quantize):
        """A folder written by save_pretrained: its arrays mapped, not copied."""
        meta = _saved.read_meta(path, cls.__name__)
        where = os.path.join(path, _saved.MODEL_FILE)
        saved_q, saved_dt = meta.get("quantize"), meta.get("dtype")
        if saved_q not in (None, "int8") or saved_dt not in ("float32", "float64"):
            raise ValueError(f"{where}: quantize={saved_q!r}, dtype={saved_dt!r} is not a "
                             f"model fastattn writes")
        check_quantize(quantize, dtype)
        if dtype is not None and np.dtype(dtype) != np.dtype(saved_dt):
            raise ValueError(f"dtype={np.dtype(dtype).name}: {where} holds a {saved_dt} model "
                             f"(load it with dtype={saved_dt}, or save it in that dtype)")
        if quantize is None and saved_q is not None:
            quantize = saved_q                  # an int8 folder loads as int8
        if quantize != saved_q and saved_q is not None:
            raise ValueError(f"quantize={quantize!r}: {where} holds a {saved_q} model")
        try:
            model = cls(**meta["config"], generation_config=meta.get("generation_config"),
                        dtype=saved_dt, _state_dict=EMPTY)
        except (TypeError, ValueError, KeyError) as exc:
            raise ValueError(f"{where}: its config does not describe a valid model: "
                             f"{exc}") from None
        _saved.assign(_saved.read_folder(path), model._layers.items(), path)
        model._quantize = saved_q
        model._map_params()
        if quantize is not None and saved_q is None:
            model._quantize = quantize          # a float folder quantized at load
            model._apply_quantize()
        elif saved_q is None:
            model._apply_compact()
        else:
            model._drop_packed()
        model._source = path
        return model


def read_checkpoint(path, kind="seq2seq"):
    """``(keywords, generation settings in config.json, tensors)`` of a checkpoint folder, read
    by the family of config.json's model_type (:mod:`fastattn.models.registry`), which must be
    of `kind` (the model class's: a family of another kind names its class); a CTranslate2
    folder's through :mod:`fastattn.models._ct2`."""
    if _ct2.is_ct2_folder(path):
        return _ct2.read_seq2seq(path, kind)
    where = os.path.join(path, "config.json")
    raw = read_json(where, os.path.basename(where), dict)
    model_type = raw.get("model_type")
    family = registry.family(model_type, kind)
    if family is None:
        raise ValueError(f"{where}: model_type={model_type!r} is not supported; supported: "
                         f"{', '.join(sorted(registry.model_types(kind)))}"
                         f"{registry.other_kind_hint(model_type)}")
    config = family.read_config(raw, where)
    legacy = config.pop("generation_config")
    weights = read_safetensors(checkpoint_files(path))
    family.untie(config, weights, path)
    return config, legacy, weights


class _Arena:
    """One buffer reused for the linear weights of one layer after another while a model
    streams in: each layer's weights are read into it, packed or quantized out of it, and the
    next layer's take its place. The float weights then cost one layer's pages, touched once,
    instead of fresh pages for every layer (first-touch page faults were half the load time)."""

    def __init__(self):
        self.buf = None

    def lend(self, module):
        """Point the (not yet written) float linear weights of `module` into the buffer."""
        spots = [(m, key, m._params[key]) for m in module._modules() for key in m._LINEAR_PARAMS
                 if isinstance(m._params.get(key), np.ndarray)]
        sizes = [-(-a.nbytes // 64) * 64 for _, _, a in spots]
        if self.buf is None or self.buf.size < sum(sizes):
            self.buf = None
            self.buf = _aligned_empty((sum(sizes),), np.dtype(np.uint8))
        off = 0
        for (m, key, a), n in zip(spots, sizes):
            m._params[key] = self.buf[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
            off += n

    def check_returned(self, module):
        """After the layer was converted: none of its parameters may still be a view of the
        buffer (the next layer overwrites it)."""
        for m in module._modules():
            for key, a in m._params.items():
                if isinstance(a, np.ndarray) and np.may_share_memory(a, self.buf):
                    raise RuntimeError(f"{key} of {type(m).__name__} still points into the "
                                       "loading buffer")
