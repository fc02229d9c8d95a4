"""The module base: parameters by PyTorch name, child modules, state_dict, save / load.

A module holds ``_params`` (name -> ndarray, its own parameters), ``_children`` (name -> module, in
order) and ``_config`` (the constructor keywords that rebuild it, JSON-serialisable). Parameters are
created through an :class:`_Init` handed down from the outermost constructor: one generator, one
seed, or no random numbers at all when the weights are about to be loaded.
"""
import math

import numpy as np

from .._ops import PackedLinear, _Packed
from .._quant import Bf16Weight, Int8Rows, Int8Weight, check_quantize, weight_kind
from .._validation import check_seed, to_numpy
from ..io.safetensors import read_module, save_module
from ..io.torch_state_dict import as_numpy_state_dict, state_dict_dtype

__all__ = []


class _Init:
    """Random parameter initialisation shared down a model (one generator, one seed)."""

    def __init__(self, seed, dtype, empty=False):
        self.rng = None if empty else np.random.default_rng(check_seed(seed))
        self.dtype = np.dtype(dtype)

    @classmethod
    def empty(cls, dtype):
        """Uninitialised parameters, for a module whose weights are about to be loaded."""
        return cls(None, dtype, empty=True)

    def xavier(self, shape):
        """Glorot/Xavier uniform, U(-a, a) with a = sqrt(6 / (fan_in + fan_out)), like torch."""
        if self.rng is None:
            return np.empty(shape, self.dtype)
        fan_out, fan_in = shape
        a = math.sqrt(6.0 / (fan_in + fan_out))
        return self.rng.uniform(-a, a, size=shape).astype(self.dtype)

    def zeros(self, shape):
        return np.zeros(shape, self.dtype)

    def ones(self, shape):
        return np.ones(shape, self.dtype)


def _init_for(seed, dtype, init):
    """The initialiser a constructor uses: the one handed down, else a new one from `seed`."""
    return init if init is not None else _Init(seed, dtype)


class _Module:
    """Parameters by PyTorch name, child modules, state_dict / from_torch_state_dict / save / load.

    Subclasses set ``self._params`` (name -> ndarray, own parameters), ``self._children``
    (name -> _Module, in order) and ``self._config`` (constructor keywords, JSON-serialisable).
    """

    _params: dict
    _children: dict
    _config: dict
    # the parameters that are linear-layer weights (packed by _packed): what quantize replaces
    _LINEAR_PARAMS = ()
    # the embedding tables (looked up by row): quantize stores them as int8 rows
    _EMBED_PARAMS = ()

    def _named_params(self, prefix=""):
        for name, arr in self._params.items():
            yield prefix + name, arr, self, name
        for cname, child in self._children.items():
            yield from child._named_params(f"{prefix}{cname}.")

    def _drop_packed(self):
        """Forget every packed weight of this module and its children (after their parameter
        arrays were written in place): the next call packs the current values."""
        self.__dict__.pop("_pack_cache", None)
        self.__dict__.pop("_fast", None)
        for child in self._children.values():
            child._drop_packed()

    def _modules(self):
        yield self
        for child in self._children.values():
            yield from child._modules()

    @property
    def quantize(self):
        """'int8' or 'bfloat16' when the linear layers' weights are (:meth:`quantize_`), else
        None."""
        return self.__dict__.get("_quantize")

    def quantize_(self, quantize="int8", _memo=None):
        """Quantize every linear layer of this module and its children, in place (the float
        weights are released): 'int8', one scale per output channel, and the token embedding
        tables to int8 rows; 'bfloat16', the weights rounded to bfloat16 (the embedding tables
        stay float32). Norms, positions and attention stay float32. A float array shared by
        several parameters (a tied embedding) becomes one object per kind, shared the same way
        (`_memo`: id -> that object, across calls). Returns self."""
        check_quantize(quantize, self.dtype)
        if quantize is None:
            if self.quantize is not None:
                raise ValueError(f"quantize=None: a {self.quantize} module cannot be turned "
                                 f"back into a float one (load the float weights again)")
            return self
        if self.quantize not in (None, quantize):
            raise ValueError(f"quantize={quantize!r}: this module's weights are "
                             f"{self.quantize} already (load the float weights again)")
        memo = {} if _memo is None else _memo
        kinds = ((weight_kind(quantize), "_LINEAR_PARAMS"),) + (
            ((Int8Rows, "_EMBED_PARAMS"),) if quantize == "int8" else ())
        for module in self._modules():
            for kind, names in kinds:
                for name in getattr(module, names):
                    arr = module._params.get(name)
                    if isinstance(arr, _Packed):          # a compacted float weight
                        arr = arr.weight
                    if isinstance(arr, np.ndarray):
                        key = (id(arr), kind)
                        if key not in memo:
                            rows = memo.get((id(arr), Int8Rows))
                            # a table tied to an output projection is quantized once
                            q = Int8Weight.from_rows(rows[0], name) if rows is not None and \
                                kind is Int8Weight else kind.from_float(arr, name)
                            memo[key] = (q, arr)                   # (keep arr alive)
                        module._params[name] = memo[key][0]
            module.__dict__["_quantize"] = quantize
        self._drop_packed()
        return self

    def compact_(self):
        """Keep each linear weight once, packed: the arrays of this module's and its children's
        linear layers are replaced by their packed form (read back when asked for: state_dict,
        another kernel set). The same results, about half the memory. Returns self."""
        for module in self._modules():
            if module.quantize is not None:
                continue
            for name in module._LINEAR_PARAMS:
                arr = module._params.get(name)
                if isinstance(arr, np.ndarray):
                    module._params[name] = _Packed.alone(arr)
            module.__dict__["_compact"] = True
        self._drop_packed()
        return self

    def state_dict(self):
        """A new dict of PyTorch parameter names -> copies of the arrays (the model's dtype;
        an int8 or bfloat16 layer's weight dequantized: the values it computes with)."""
        return {name: arr.copy() if isinstance(arr, np.ndarray) else arr.dequantize()
                for name, arr, _, _ in self._named_params()}

    def load_state_dict(self, state_dict):
        """Copy weights in by PyTorch name. Missing, unexpected or misshaped entries: ValueError
        naming all of them (nothing is modified then)."""
        if not hasattr(state_dict, "keys"):
            raise TypeError(f"state_dict must be a mapping of names to arrays, got {type(state_dict).__name__}")
        expected = {name: (arr, owner, key) for name, arr, owner, key in self._named_params()}
        given = {}
        problems = []
        for name in state_dict.keys():
            if name not in expected:
                continue
            try:
                arr = to_numpy(state_dict[name])
            except Exception as exc:
                problems.append(f"{name!r} could not be converted to an array ({exc})")
                continue
            if arr.dtype.kind not in "fiu":
                problems.append(f"{name!r} has dtype {arr.dtype}, expected a real float array")
                continue
            if arr.shape != expected[name][0].shape:
                problems.append(f"{name!r} has shape {tuple(arr.shape)}, expected {expected[name][0].shape}")
                continue
            given[name] = arr
        missing = [n for n in expected if n not in state_dict.keys()]
        extra = [n for n in state_dict.keys() if n not in expected]
        if missing:
            problems.insert(0, f"missing {len(missing)}: {missing}")
        if extra:
            problems.insert(0, f"unexpected {len(extra)}: {extra}")
        if problems:
            raise ValueError(f"state_dict does not fit {type(self).__name__}: " + "; ".join(problems))
        dtype = self.dtype
        for name, arr in given.items():
            _, owner, key = expected[name]
            owner._params[key] = np.array(arr, dtype=dtype, order="C", copy=True)
            if owner.quantize is not None and key in owner._LINEAR_PARAMS:
                owner._params[key] = weight_kind(owner.quantize).from_float(
                    owner._params[key], name)
            elif owner.__dict__.get("_compact") and key in owner._LINEAR_PARAMS:
                owner._params[key] = _Packed.alone(owner._params[key])
            elif owner.quantize == "int8" and key in owner._EMBED_PARAMS:
                owner._params[key] = Int8Rows.from_float(owner._params[key], name)
        self._drop_packed()
        return self

    def _fast_packed(self, key, make):
        """The PackedLinear `make()` returns, kept under `key` until _drop_packed: the decode
        step's lookup (no key tuple, no identity checks of the parameters; every path that
        replaces or rewrites a parameter array drops these)."""
        fast = self.__dict__.get("_fast")
        if fast is None:
            fast = self.__dict__["_fast"] = {}
        lin = fast.get(key)
        if lin is None:
            lin = fast[key] = make()
        return lin

    @property
    def dtype(self):
        return np.dtype(self._config["dtype"])

    def _packed(self, weight, bias=None, rows=None, bias_rows=None, activation=None):
        """A PackedLinear over parameter `weight` (its rows [a, b) when `rows` is given) with
        parameter `bias` (its rows `bias_rows`, default `rows`) and the activation as the
        epilogue. Packed on first use and again whenever a parameter array is replaced
        (load_state_dict does that); an in-place edit of a weight array is not seen (assign a
        new array, or call load_state_dict)."""
        params = self._params
        w = params[weight]
        b = None if bias is None else params.get(bias)
        key = (weight, rows, bias, bias_rows, activation)
        cache = self.__dict__.setdefault("_pack_cache", {})
        hit = cache.get(key)
        if hit is None or hit[0] is not w or hit[1] is not b:
            bias_rows = rows if bias_rows is None else bias_rows
            if isinstance(w, (Int8Weight, Bf16Weight, _Packed)):
                w_rows = w if rows is None else w.rows(rows[0], rows[1])
            else:
                w_rows = w if rows is None else w[rows[0]:rows[1]]
            b_rows = b if b is None or bias_rows is None else b[bias_rows[0]:bias_rows[1]]
            hit = cache[key] = (w, b, PackedLinear(w_rows, b_rows, activation))
        return hit[2]

    @property
    def config(self):
        """The constructor keywords that rebuild this module (dtype as a string)."""
        return dict(self._config)

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def _build(cls, _init=None, **config):
        """The module described by `config` (its ``config`` property), parameters from `_init`."""
        return cls(_init=_init, **config)

    # -- PyTorch weights -----------------------------------------------------------------------
    @classmethod
    def from_torch_state_dict(cls, state_dict, **config):
        """Build from a PyTorch ``state_dict`` (NumPy arrays, tensors, anything np.asarray takes).

        Sizes are inferred from the shapes; what shapes cannot tell (number of heads,
        activation, norm_first, layer_norm_eps) comes from `config`, defaulting like torch.
        dtype defaults to the weights' dtype (float64 weights -> a float64 model, else float32).
        """
        sd = as_numpy_state_dict(state_dict)
        if config.get("dtype") is None:
            config["dtype"] = state_dict_dtype(sd)
        kwargs = cls._config_from_state_dict(sd, "", config)
        model = cls._build(_init=_Init.empty(kwargs["dtype"]), **kwargs)
        return model.load_state_dict(sd)

    @classmethod
    def _config_from_state_dict(cls, sd, prefix, config):  # pragma: no cover - overridden
        raise NotImplementedError

    # -- safetensors -----------------------------------------------------------------------------
    def save(self, path):
        """Write the weights (PyTorch names) and the config (JSON in the metadata) as safetensors."""
        save_module(path, type(self).__name__, self._config, self.state_dict())

    @classmethod
    def load(cls, path):
        """Rebuild a module written by :meth:`save`. Wrong class, missing, unexpected or misshaped
        tensors: ValueError naming them."""
        config, tensors = read_module(path, cls.__name__)
        try:
            model = cls._build(_init=_Init.empty(config.get("dtype", "float32")), **config)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: its fastattn_config does not describe a valid "
                             f"{cls.__name__}: {exc}") from exc
        for k, v in tensors.items():
            if v.dtype.kind != "f":
                raise ValueError(f"{path}: tensor {k!r} has dtype {v.dtype}, not a float")
        return model.load_state_dict(tensors)
