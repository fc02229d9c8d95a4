"""Transformer blocks over the fused kernel: the architecture of "Attention Is All You Need".

NumPy in, NumPy out, batch-first: activations are (batch, seq, d_model); unbatched (seq, d_model)
is accepted too, as in PyTorch. Inference only (no dropout, no gradients).

Design:
- Parameters carry PyTorch's names and shapes (``torch.nn.Transformer(batch_first=True)``'s
  ``state_dict``), so weights move both ways by name. Linear weights are stored (out, in) like
  torch; ``x @ W.T`` hands BLAS the transposed view (one GEMM, no copy), the bias is added in
  place and ReLU runs in place.
- Inside a block every activation is a C-contiguous (batch * seq, d_model) matrix. Self-attention
  projects q, k and v with ONE GEMM against the packed ``in_proj_weight``; the heads are strided
  views (B, H, T, Dh) of that product, passed to :func:`fastattn.scaled_dot_product_attention` as
  they are (the kernel takes any strides with a contiguous last axis). The kernel's (B, H, L, Dh)
  output is transposed to (B, L, H * Dh) once and goes through W_O.
- Masks are converted once per stack (not per layer) from PyTorch's module convention to the
  kernel's, keeping broadcast dimensions: a key-padding mask becomes a (B, 1, 1, S) view, a causal
  mask becomes the kernel's ``is_causal`` flag (no L x S array at all).

Mask conventions, side by side:

========================  ==========================  ==============================
                          modules here (= torch.nn)   fastattn.scaled_dot_product_attention
========================  ==========================  ==============================
bool ``attn_mask``        True = NOT allowed          True = may attend
``key_padding_mask``      True = padding (ignored)    (none: pass a (B, 1, 1, S) mask)
float masks               added to the scores         added to the scores
========================  ==========================  ==============================

A query that may attend to no key at all (a fully masked row, e.g. every key padded) gets an
attention output of zeros (PyTorch gives NaN there, or zeros on its nested-tensor fast path).
"""
import copy
import json
import math
import threading

import numpy as np

from .attention import scaled_dot_product_attention

__all__ = [
    "MultiHeadAttention",
    "LayerNorm",
    "FeedForward",
    "PositionalEncoding",
    "sinusoidal_positions",
    "TransformerEncoderLayer",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerDecoder",
    "Transformer",
]

_DTYPES = {"float32": np.dtype(np.float32), "float64": np.dtype(np.float64)}


def _check_dtype(dtype):
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be float32 or float64, got {dtype!r}") from None
    if dt not in _DTYPES.values():
        raise TypeError(f"dtype must be float32 or float64, got {dt}")
    return dt


def _check_positive_int(n, name):
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"{name} must be a positive integer, got {n!r}")
    return int(n)


def _to_numpy(x):
    """np.asarray for arrays and anything array-like, torch tensors included (never imports torch)."""
    if hasattr(x, "detach") and hasattr(x, "cpu") and hasattr(x, "numpy"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


# --------------------------------------------------------------------------------------------
# numerics: linear, layer norm, exact (erf) GELU
# --------------------------------------------------------------------------------------------

def _linear(x, weight, bias, out=None):
    """(N, in) @ (out, in).T + bias -> (N, out): one GEMM on the transposed view, bias in place."""
    y = np.matmul(x, weight.T, out=out)
    if bias is not None:
        y += bias
    return y


def _layer_norm(x, weight, bias, eps, out=None):
    """Row-wise (x - mean) / sqrt(var + eps) * weight + bias over the last axis of a 2-D array.

    Biased variance like torch. A constant row gives x - mean == 0 exactly, hence 0 (then bias),
    never NaN: eps keeps the denominator positive.
    """
    mean = x.mean(axis=-1, keepdims=True)
    xc = np.subtract(x, mean, out=out)
    var = np.square(xc).mean(axis=-1, keepdims=True)   # pairwise sums, accurate in float32
    var += eps
    np.sqrt(var, out=var)
    np.divide(1.0, var, out=var)
    xc *= var
    if weight is not None:
        xc *= weight
    if bias is not None:
        xc += bias
    return xc


# Chebyshev coefficients of h(t) = log(erfc(z) * exp(z**2) / t) with t = 2 / (2 + z), z >= 0,
# in the variable y = 2 t - 1 on [-1, 1]. Computed by us with mpmath (40 digits) at 64 Chebyshev
# nodes; the series converges geometrically and the terms below 1e-18 are dropped. Then
# erfc(z) = t * exp(h(t) - z**2) has a relative error of a few ulp for every z >= 0 (the same idea
# as the Chebyshev erfc of Numerical Recipes, 3rd ed., section 6.2, fitted independently).
_ERFC_CHEB = (
    -0.6513268598908547, 0.6419697923564902, 0.019476473204185836, -0.009561514786808632,
    -0.0009465953444820369, 0.00036683949785276145, 4.252332480690777e-05,
    -2.0278578112534242e-05, -1.6242900046470256e-06, 1.3036558355805232e-06,
    1.5626441722066142e-08, -8.523809591492654e-08, 6.5290544390988515e-09,
    5.059343495551469e-09, -9.91364156493033e-10, -2.273651222931836e-10,
    9.646791102015527e-11, 2.3940380830391146e-12, -6.886027526497553e-12,
    8.944879273090725e-13, 3.130921399342958e-13, -1.1270822361367252e-13,
    3.810905255189232e-16, 7.106097613609237e-15, -1.5230282014571043e-15,
    -9.457494571291233e-17, 1.210237189224279e-16, -2.816663087747177e-17,
    5.003005559445904e-20, 2.3281042579529253e-18, -8.446077682509006e-19,
)
# float32 needs only the terms above ~1e-10 (relative error ~1e-9 before float32 rounding)
_N_CHEB = {np.dtype(np.float64): len(_ERFC_CHEB), np.dtype(np.float32): 17}
_GELU_CHUNK = 16384     # elements per chunk: the ~40 passes of the series stay in L1/L2


def _erfc_nonneg(z, out):
    """erfc(z) for z >= 0 (array), written into `out` (same shape, float dtype of z)."""
    coef = _ERFC_CHEB[:_N_CHEB[z.dtype]]
    t = 2.0 / (2.0 + z)
    y2 = 4.0 * t - 2.0                          # 2 * y, y = 2 t - 1
    # Clenshaw: b_k = c_k + 2 y b_{k+1} - b_{k+2};  h = c_0 + y b_1 - b_2
    b1 = np.zeros_like(z)
    b2 = np.zeros_like(z)
    tmp = np.empty_like(z)
    for c in coef[:0:-1]:
        np.multiply(y2, b1, out=tmp)
        tmp -= b2
        tmp += c
        b1, b2, tmp = tmp, b1, b2
    np.multiply(y2, b1, out=tmp)
    tmp *= 0.5
    tmp -= b2
    tmp += coef[0]                               # h
    np.square(z, out=b2)
    tmp -= b2
    np.exp(tmp, out=out)
    out *= t
    return out


def _gelu_(x):
    """Exact GELU in place, x * Phi(x) = x/2 * (1 + erf(x / sqrt(2))), torch's default 'gelu'.

    Phi(x) = 1 - erfc(z)/2 for x >= 0 and erfc(z)/2 for x < 0 with z = |x|/sqrt(2); erfc from the
    Chebyshev series above (no scipy at run time). float64 agrees with math.erf to ~1e-16.
    """
    flat = x.reshape(-1)
    inv_sqrt2 = 1.0 / math.sqrt(2.0)
    for start in range(0, flat.size, _GELU_CHUNK):
        xs = flat[start:start + _GELU_CHUNK]
        z = np.abs(xs)
        z *= inv_sqrt2
        e = _erfc_nonneg(z, out=z)              # erfc(|x|/sqrt 2), in place of z
        e *= 0.5
        phi = np.where(xs >= 0, 1.0 - e, e)
        xs *= phi
    return x


def _relu_(x):
    return np.maximum(x, 0, out=x)


_ACTIVATIONS = {"relu": _relu_, "gelu": _gelu_}


def _check_activation(activation):
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be 'relu' or 'gelu', got {activation!r}")
    return activation


# --------------------------------------------------------------------------------------------
# parameters, state dicts, safetensors
# --------------------------------------------------------------------------------------------

class _Init:
    """Random parameter initialisation shared down a model (one generator, one seed)."""

    def __init__(self, seed, dtype, empty=False):
        self.rng = None if empty else np.random.default_rng(seed)
        self.dtype = dtype

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


class _EmptyInit(threading.local):
    """Set while load()/from_torch_state_dict() build a model whose parameters are about to be
    overwritten: skip drawing random numbers. Thread-local, so concurrent construction is safe."""
    on = False


_EMPTY = _EmptyInit()


class _empty_init:
    def __enter__(self):
        _EMPTY.on = True

    def __exit__(self, *exc):
        _EMPTY.on = False


class _Module:
    """Parameters by PyTorch name, child modules, state_dict / from_torch_state_dict / save / load.

    Subclasses set ``self._params`` (name -> ndarray, own parameters), ``self._children``
    (name -> _Module, in order) and ``self._config`` (constructor keywords, JSON-serialisable).
    """

    _params: dict
    _children: dict
    _config: dict

    def _named_params(self, prefix=""):
        for name, arr in self._params.items():
            yield prefix + name, arr, self, name
        for cname, child in self._children.items():
            yield from child._named_params(f"{prefix}{cname}.")

    def state_dict(self):
        """A new dict of PyTorch parameter names -> copies of the arrays (the model's dtype)."""
        return {name: arr.copy() for name, arr, _, _ in self._named_params()}

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
                arr = _to_numpy(state_dict[name])
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
        return self

    @property
    def dtype(self):
        return np.dtype(self._config["dtype"])

    @property
    def config(self):
        """The constructor keywords that rebuild this module (dtype as a string)."""
        return dict(self._config)

    # -- PyTorch weights -----------------------------------------------------------------------
    @classmethod
    def from_torch_state_dict(cls, state_dict, **config):
        """Build from a PyTorch ``state_dict`` (NumPy arrays, tensors, anything np.asarray takes).

        Sizes are inferred from the shapes; what shapes cannot tell (number of heads,
        activation, norm_first, layer_norm_eps) comes from `config`, defaulting like torch.
        dtype defaults to the weights' dtype (float64 weights -> a float64 model, else float32).
        """
        sd = {k: _to_numpy(v) for k, v in state_dict.items()}
        if config.get("dtype") is None:
            first = next((a for a in sd.values() if a.dtype.kind == "f"), None)
            config["dtype"] = np.float64 if first is not None and first.dtype == np.float64 else np.float32
        kwargs = cls._config_from_state_dict(sd, "", config)
        with _empty_init():
            model = cls(**kwargs)
        return model.load_state_dict(sd)

    @classmethod
    def _config_from_state_dict(cls, sd, prefix, config):  # pragma: no cover - overridden
        raise NotImplementedError

    # -- safetensors -----------------------------------------------------------------------------
    def save(self, path):
        """Write the weights (PyTorch names) and the config (JSON in the metadata) as safetensors."""
        from safetensors.numpy import save_file
        meta = {"fastattn_class": type(self).__name__, "fastattn_config": json.dumps(self._config)}
        save_file({k: np.ascontiguousarray(v) for k, v in self.state_dict().items()}, str(path),
                  metadata=meta)

    @classmethod
    def load(cls, path):
        """Rebuild a module written by :meth:`save`. Wrong class, missing, unexpected or misshaped
        tensors: ValueError naming them."""
        config, tensors = _read_safetensors(path, cls.__name__)
        with _empty_init():
            model = cls(**config)
        return model.load_state_dict(tensors)


def _read_safetensors(path, class_name):
    """(config, tensors) of a file written by _Module.save, checked to hold a `class_name`."""
    from safetensors import safe_open
    with safe_open(str(path), framework="numpy") as f:
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    if "fastattn_config" not in meta:
        raise ValueError(f"{path} has no fastattn config in its metadata (not written by save())")
    if meta.get("fastattn_class") != class_name:
        raise ValueError(f"{path} holds a {meta.get('fastattn_class')}, not a {class_name}")
    return json.loads(meta["fastattn_config"]), tensors


def _init_for(seed, dtype, init):
    if init is not None:
        return init
    return _Init(seed, dtype, empty=_EMPTY.on)


class _Linear(_Module):
    """y = x @ weight.T + bias; weight (out_features, in_features) as in torch.nn.Linear."""

    def __init__(self, in_features, out_features, bias=True, *, dtype, init):
        self._config = {"in_features": in_features, "out_features": out_features, "bias": bias,
                        "dtype": np.dtype(dtype).name}
        self._params = {"weight": init.xavier((out_features, in_features))}
        if bias:
            self._params["bias"] = init.zeros((out_features,))
        self._children = {}

    @property
    def weight(self):
        return self._params["weight"]

    @property
    def bias(self):
        return self._params.get("bias")

    def _forward(self, x2d, out=None):
        return _linear(x2d, self._params["weight"], self._params.get("bias"), out)


# --------------------------------------------------------------------------------------------
# input handling and masks (PyTorch's module convention -> the kernel's)
# --------------------------------------------------------------------------------------------

def _as_input(x, name, d, dtype, owned=False):
    """(B, T, d) or unbatched (T, d) -> (C-contiguous (B*T, d) in `dtype`, B, T, batched).

    owned=True: the result never shares memory with `x` (the caller may overwrite it)."""
    arr = _to_numpy(x)
    if arr.dtype.kind not in "fiub":
        raise TypeError(f"{name} must be a real numeric array, got dtype {arr.dtype}")
    if arr.ndim not in (2, 3):
        raise ValueError(f"{name} must have shape (batch, seq, {d}) or unbatched (seq, {d}), got {arr.shape}")
    if arr.shape[-1] != d:
        raise ValueError(f"{name} has feature size {arr.shape[-1]} (last dimension), expected {d}; "
                         f"shape {arr.shape}")
    batched = arr.ndim == 3
    B, T = (arr.shape[0], arr.shape[1]) if batched else (1, arr.shape[0])
    if owned:
        flat = np.array(arr, dtype=dtype, order="C", copy=True).reshape(B * T, d)
    else:
        flat = np.ascontiguousarray(arr, dtype=dtype).reshape(B * T, d)
    return flat, B, T, batched


def _torch_mask(m, name, dtype):
    arr = _to_numpy(m)
    if arr.dtype.kind == "b":
        return arr
    if arr.dtype.kind == "f":
        if arr.dtype.itemsize > 8:
            raise TypeError(f"{name} has dtype {arr.dtype}, which fastattn does not support")
        return arr.astype(dtype, copy=False)
    raise TypeError(f"{name} must be a bool array (True = not allowed) or a float array "
                    f"(added to the scores), got dtype {arr.dtype}")


def _is_causal_pattern(m):
    """True if the (L, L) torch-convention mask m forbids exactly the keys after each query."""
    L, S = m.shape
    if L != S:
        return False
    upper = np.triu(np.ones((L, L), dtype=bool), k=1)
    if m.dtype.kind == "b":
        return bool(np.array_equal(m, upper))
    return bool(np.all(m[upper] == -np.inf) and np.all(m[~upper] == 0))


def _additive(m, dtype):
    if m.dtype.kind == "b":
        return np.where(m, dtype.type(-np.inf), dtype.type(0))
    return m


class _KernelMask:
    """A module-level mask set converted once to the kernel's form: (mask or None, is_causal)."""

    __slots__ = ("mask", "causal")

    def __init__(self, mask, causal):
        self.mask = mask
        self.causal = causal


def _kernel_mask(attn_mask, key_padding_mask, is_causal, B, H, L, S, dtype, batched,
                 attn_name="attn_mask", kpm_name="key_padding_mask"):
    """torch.nn.MultiheadAttention masks -> fastattn.scaled_dot_product_attention masks.

    attn_mask: (L, S), or (B*H, L, S) batched / (H, L, S) unbatched; bool True = not allowed,
    float added. key_padding_mask: (B, S) batched / (S,) unbatched; bool True = padding, float
    added. is_causal: the causal mask applies (together with attn_mask unless attn_mask is exactly
    the causal mask, which is then dropped). A causal attn_mask is recognised and run as the
    kernel's is_causal flag. Result broadcasts to (B, H, L, S) without materialising it unless a
    per-head mask forces it.
    """
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__} {is_causal!r}")
    causal = bool(is_causal)
    am = None
    if attn_mask is not None:
        am = _torch_mask(attn_mask, attn_name, dtype)
        if am.ndim == 2:
            if am.shape != (L, S):
                raise ValueError(f"{attn_name} of shape {am.shape} should be (L, S) = {(L, S)}")
            if _is_causal_pattern(am):
                causal, am = True, None
        elif am.ndim == 3:
            want = (B * H, L, S) if batched else (H, L, S)
            if am.shape != want:
                raise ValueError(f"{attn_name} of shape {am.shape} should be (L, S) = {(L, S)} or "
                                 f"{'(batch * num_heads, L, S)' if batched else '(num_heads, L, S)'} = {want}")
            am = am.reshape(B, H, L, S)
        else:
            raise ValueError(f"{attn_name} must be 2-D (L, S) or 3-D, got shape {am.shape}")
    kp = None
    if key_padding_mask is not None:
        kp = _torch_mask(key_padding_mask, kpm_name, dtype)
        want = (B, S) if batched else (S,)
        if kp.shape != want:
            raise ValueError(f"{kpm_name} of shape {kp.shape} should be "
                             f"{'(batch, S)' if batched else '(S,)'} = {want}")
        kp = kp.reshape(B, 1, 1, S)
    if am is None and kp is None:
        return _KernelMask(None, causal)
    if kp is None:
        return _KernelMask(np.logical_not(am) if am.dtype.kind == "b" else am, causal)
    if am is None:
        return _KernelMask(np.logical_not(kp) if kp.dtype.kind == "b" else kp, causal)
    if am.dtype.kind == "b" and kp.dtype.kind == "b":
        return _KernelMask(np.logical_not(np.logical_or(am, kp)), causal)   # (B, 1|H, L, S)
    return _KernelMask(_additive(am, dtype) + _additive(kp, dtype), causal)


# --------------------------------------------------------------------------------------------
# blocks
# --------------------------------------------------------------------------------------------

class MultiHeadAttention(_Module):
    """Multi-head attention, ``concat(head_1..head_h) @ W_O.T`` with
    ``head_i = softmax(q_i k_i^T / sqrt(d_k) + mask) v_i``; parameters as torch.nn.MultiheadAttention.

    Parameters
    ----------
    embed_dim, num_heads : int
        d_model and h; each head has d_k = embed_dim // num_heads features.
    kdim, vdim : int, optional
        Feature sizes of key and value inputs (default embed_dim). When both equal embed_dim
        the projections are packed in ``in_proj_weight`` (3*embed_dim, embed_dim), else
        ``q_proj_weight``, ``k_proj_weight``, ``v_proj_weight``.
    bias : bool
        ``in_proj_bias`` and ``out_proj.bias``.
    dtype : float32 or float64
    seed : int, optional
        Random initialisation: Xavier-uniform matrices, zero biases.
    dropout : float
        Accepted for signature compatibility; ignored (inference only).

    Call ``mha(query, key, value, *, key_padding_mask=None, attn_mask=None, is_causal=False,
    need_weights=False, average_attn_weights=True)`` with (B, L, E) / (B, S, kdim) / (B, S, vdim)
    or unbatched arrays; masks follow torch (bool True = not allowed / padding, float added).
    Returns the output (B, L, E), or ``(output, weights)`` with weights (B, L, S) averaged over
    heads or (B, H, L, S).
    """

    def __init__(self, embed_dim, num_heads, *, kdim=None, vdim=None, bias=True, dtype=np.float32,
                 seed=None, dropout=0.0, _init=None):
        embed_dim = _check_positive_int(embed_dim, "embed_dim")
        num_heads = _check_positive_int(num_heads, "num_heads")
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        kdim = embed_dim if kdim is None else _check_positive_int(kdim, "kdim")
        vdim = embed_dim if vdim is None else _check_positive_int(vdim, "vdim")
        dtype = _check_dtype(dtype)
        init = _init_for(seed, dtype, _init)
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.kdim, self.vdim = kdim, vdim
        self.packed = kdim == embed_dim and vdim == embed_dim
        self._config = {"embed_dim": embed_dim, "num_heads": num_heads, "kdim": kdim, "vdim": vdim,
                        "bias": bool(bias), "dtype": dtype.name}
        E = embed_dim
        if self.packed:
            self._params = {"in_proj_weight": init.xavier((3 * E, E))}
        else:
            self._params = {"q_proj_weight": init.xavier((E, E)),
                            "k_proj_weight": init.xavier((E, kdim)),
                            "v_proj_weight": init.xavier((E, vdim))}
        if bias:
            self._params["in_proj_bias"] = init.zeros((3 * E,))
        self.out_proj = _Linear(E, E, bias, dtype=dtype, init=init)
        self._children = {"out_proj": self.out_proj}

    @classmethod
    def _config_from_state_dict(cls, sd, prefix, config):
        config = dict(config)
        if "num_heads" not in config:
            raise TypeError("from_torch_state_dict needs num_heads= (the head count is not in the shapes)")
        if prefix + "in_proj_weight" in sd:
            E = sd[prefix + "in_proj_weight"].shape[1]
            kdim = vdim = E
        elif prefix + "q_proj_weight" in sd:
            E = sd[prefix + "q_proj_weight"].shape[0]
            kdim = sd[prefix + "k_proj_weight"].shape[1] if prefix + "k_proj_weight" in sd else E
            vdim = sd[prefix + "v_proj_weight"].shape[1] if prefix + "v_proj_weight" in sd else E
        else:
            raise ValueError(f"state_dict has neither {prefix}in_proj_weight nor {prefix}q_proj_weight")
        config.setdefault("embed_dim", E)
        config.setdefault("kdim", kdim)
        config.setdefault("vdim", vdim)
        config.setdefault("bias", prefix + "in_proj_bias" in sd)
        return config

    # -- projections ---------------------------------------------------------------------------
    def _w(self, which):
        """(weight, bias) of the q (0), k (1) or v (2) projection (views, no copies)."""
        E, p = self.embed_dim, self._params
        b = p.get("in_proj_bias")
        b = None if b is None else b[which * E:(which + 1) * E]
        if self.packed:
            return p["in_proj_weight"][which * E:(which + 1) * E], b
        return p[("q_proj_weight", "k_proj_weight", "v_proj_weight")[which]], b

    def _heads(self, x2d, B, T, col):
        """Columns [col, col + E) of the projected (B*T, n*E) matrix as a (B, H, T, Dh) view."""
        E, H, Dh = self.embed_dim, self.num_heads, self.head_dim
        return x2d[:, col:col + E].reshape(B, T, H, Dh).swapaxes(1, 2)

    def _forward(self, xq, xk, xv, B, L, S, kmask, need_weights=False, average=True):
        """xq (B*L, E), xk (B*S, kdim), xv (B*S, vdim) C-contiguous -> (B*L, E) [, weights]."""
        p = self._params
        E = self.embed_dim
        if self.packed and xq is xk and xk is xv:           # self-attention: one GEMM for q, k, v
            qkv = _linear(xq, p["in_proj_weight"], p.get("in_proj_bias"))
            q, k, v = self._heads(qkv, B, L, 0), self._heads(qkv, B, S, E), self._heads(qkv, B, S, 2 * E)
        elif self.packed and xk is xv:                      # cross-attention: one GEMM for k, v
            wq, bq = self._w(0)
            q = self._heads(_linear(xq, wq, bq), B, L, 0)
            bkv = p.get("in_proj_bias")
            kv = _linear(xk, p["in_proj_weight"][E:], None if bkv is None else bkv[E:])
            k, v = self._heads(kv, B, S, 0), self._heads(kv, B, S, E)
        else:
            q = self._heads(_linear(xq, *self._w(0)), B, L, 0)
            k = self._heads(_linear(xk, *self._w(1)), B, S, 0)
            v = self._heads(_linear(xv, *self._w(2)), B, S, 0)
        res = scaled_dot_product_attention(q, k, v, kmask.mask, is_causal=kmask.causal,
                                           return_weights=need_weights)
        o, w = res if need_weights else (res, None)
        # (B, H, L, Dh) -> (B, L, H, Dh) -> (B*L, E): the one copy that concatenates the heads
        concat = np.ascontiguousarray(o.swapaxes(1, 2)).reshape(B * L, E)
        out = self.out_proj._forward(concat)
        if need_weights and average:
            w = w.mean(axis=1)
        return out, w

    def __call__(self, query, key, value, *, key_padding_mask=None, attn_mask=None, is_causal=False,
                 need_weights=False, average_attn_weights=True):
        dt = self.dtype
        xq, B, L, batched = _as_input(query, "query", self.embed_dim, dt)
        same_kv = key is value
        self_attn = query is key and same_kv
        xk, Bk, S, kb = _as_input(key, "key", self.kdim, dt)
        if self_attn:
            xk = xv = xq
            Bv, Sv, vb = B, S, batched
        elif same_kv and self.kdim == self.vdim:
            xv, Bv, Sv, vb = xk, Bk, S, kb
        else:
            xv, Bv, Sv, vb = _as_input(value, "value", self.vdim, dt)
        if not (batched == kb == vb):
            raise ValueError("query, key and value must all be batched (3-D) or all unbatched (2-D), "
                             f"got query {np.shape(query)}, key {np.shape(key)}, value {np.shape(value)}")
        if not (B == Bk == Bv) or S != Sv:
            raise ValueError("query, key and value must share the batch size and key and value the "
                             f"sequence length, got query {np.shape(query)}, key {np.shape(key)}, "
                             f"value {np.shape(value)}")
        kmask = _kernel_mask(attn_mask, key_padding_mask, is_causal, B, self.num_heads, L, S, dt, batched)
        out, w = self._forward(xq, xk, xv, B, L, S, kmask, bool(need_weights), bool(average_attn_weights))
        out = out.reshape(B, L, self.embed_dim) if batched else out.reshape(L, self.embed_dim)
        if not need_weights:
            return out
        return out, (w if batched else w[0])


class LayerNorm(_Module):
    """Layer normalisation over the last axis: (x - mean) / sqrt(var + eps) * weight + bias.

    A zero-variance row gives zeros (then + bias), never NaN. Parameters ``weight`` (ones) and
    ``bias`` (zeros) as torch.nn.LayerNorm.
    """

    def __init__(self, normalized_shape, eps=1e-5, *, bias=True, dtype=np.float32, _init=None):
        d = _check_positive_int(normalized_shape, "normalized_shape")
        eps = float(eps)
        if not eps >= 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        dtype = _check_dtype(dtype)
        init = _init_for(None, dtype, _init)
        self.normalized_shape, self.eps = d, eps
        self._config = {"normalized_shape": d, "eps": eps, "bias": bool(bias), "dtype": dtype.name}
        self._params = {"weight": init.ones((d,))}
        if bias:
            self._params["bias"] = init.zeros((d,))
        self._children = {}

    @classmethod
    def _config_from_state_dict(cls, sd, prefix, config):
        config = dict(config)
        config.setdefault("normalized_shape", sd[prefix + "weight"].shape[0])
        config.setdefault("bias", prefix + "bias" in sd)
        return config

    def _forward(self, x2d, out=None):
        return _layer_norm(x2d, self._params["weight"], self._params.get("bias"), self.eps, out)

    def __call__(self, x):
        arr = _to_numpy(x)
        if arr.ndim < 1 or arr.shape[-1] != self.normalized_shape:
            raise ValueError(f"x must have last dimension {self.normalized_shape}, got shape {arr.shape}")
        flat = np.ascontiguousarray(arr, dtype=self.dtype).reshape(-1, self.normalized_shape)
        return self._forward(flat, out=np.empty_like(flat)).reshape(arr.shape)


class FeedForward(_Module):
    """Position-wise feed-forward network, ``linear2(activation(linear1(x)))``.

    Parameters ``linear1.weight`` (dim_feedforward, d_model), ``linear1.bias``,
    ``linear2.weight`` (d_model, dim_feedforward), ``linear2.bias``. activation: 'relu' or
    'gelu' (exact, erf-based, like torch's default).
    """

    def __init__(self, d_model, dim_feedforward=2048, activation="relu", *, bias=True,
                 dtype=np.float32, seed=None, _init=None):
        d_model = _check_positive_int(d_model, "d_model")
        dim_feedforward = _check_positive_int(dim_feedforward, "dim_feedforward")
        activation = _check_activation(activation)
        dtype = _check_dtype(dtype)
        init = _init_for(seed, dtype, _init)
        self.d_model, self.dim_feedforward, self.activation = d_model, dim_feedforward, activation
        self._act = _ACTIVATIONS[activation]
        self._config = {"d_model": d_model, "dim_feedforward": dim_feedforward,
                        "activation": activation, "bias": bool(bias), "dtype": dtype.name}
        self.linear1 = _Linear(d_model, dim_feedforward, bias, dtype=dtype, init=init)
        self.linear2 = _Linear(dim_feedforward, d_model, bias, dtype=dtype, init=init)
        self._params = {}
        self._children = {"linear1": self.linear1, "linear2": self.linear2}

    @classmethod
    def _config_from_state_dict(cls, sd, prefix, config):
        config = dict(config)
        w1 = sd[prefix + "linear1.weight"]
        config.setdefault("d_model", w1.shape[1])
        config.setdefault("dim_feedforward", w1.shape[0])
        config.setdefault("bias", prefix + "linear1.bias" in sd)
        return config

    def _forward(self, x2d):
        h = self.linear1._forward(x2d)      # (N, d_ff), bias added in place
        self._act(h)                         # in place
        return self.linear2._forward(h)

    def __call__(self, x):
        arr = _to_numpy(x)
        if arr.ndim < 1 or arr.shape[-1] != self.d_model:
            raise ValueError(f"x must have last dimension {self.d_model}, got shape {arr.shape}")
        flat = np.ascontiguousarray(arr, dtype=self.dtype).reshape(-1, self.d_model)
        return self._forward(flat).reshape(arr.shape)


def sinusoidal_positions(length, d_model, dtype=np.float32):
    """The paper's positional encodings, (length, d_model), position 0 first:
    PE[pos, 2i] = sin(pos / 10000**(2i / d_model)), PE[pos, 2i + 1] = cos(same angle).

    Computed in float64, then cast to `dtype`.
    """
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 0:
        raise ValueError(f"length must be a non-negative integer, got {length!r}")
    d_model = _check_positive_int(d_model, "d_model")
    dtype = _check_dtype(dtype)
    pos = np.arange(length, dtype=np.float64)[:, None]
    inv_freq = np.exp(-math.log(10000.0) * np.arange(0, d_model, 2, dtype=np.float64) / d_model)
    angle = pos * inv_freq                                   # (length, ceil(d/2))
    pe = np.empty((length, d_model), dtype=np.float64)
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle[:, : d_model // 2])
    return pe.astype(dtype)


class PositionalEncoding:
    """Adds :func:`sinusoidal_positions` to (batch, seq, d_model) or (seq, d_model) inputs.

    ``scale`` optionally multiplies the input first (the paper scales embeddings by sqrt(d_model)).
    Returns a new array in `dtype`.
    """

    def __init__(self, d_model, max_len=5000, *, scale=1.0, dtype=np.float32):
        self.d_model = _check_positive_int(d_model, "d_model")
        self.dtype = _check_dtype(dtype)
        self.scale = float(scale)
        self.pe = sinusoidal_positions(_check_positive_int(max_len, "max_len"), self.d_model, self.dtype)

    def __call__(self, x):
        arr = _to_numpy(x)
        if arr.ndim < 2 or arr.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (..., seq, {self.d_model}), got {arr.shape}")
        T = arr.shape[-2]
        if T > self.pe.shape[0]:
            self.pe = sinusoidal_positions(T, self.d_model, self.dtype)
        out = np.array(arr, dtype=self.dtype, copy=True)
        if self.scale != 1.0:
            out *= self.scale
        out += self.pe[:T]
        return out


class TransformerEncoderLayer(_Module):
    """Self-attention then feed-forward, each with a residual connection and LayerNorm.

    ``norm_first=False`` (the paper's post-LN): x = norm1(x + sa(x)); x = norm2(x + ff(x)).
    ``norm_first=True`` (pre-LN): x = x + sa(norm1(x)); x = x + ff(norm2(x)).
    Parameter names as torch.nn.TransformerEncoderLayer: self_attn.*, linear1.*, linear2.*,
    norm1.*, norm2.*. Call ``layer(src, src_mask=None, src_key_padding_mask=None, is_causal=False)``.
    """

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.0, activation="relu",
                 layer_norm_eps=1e-5, norm_first=False, bias=True, *, dtype=np.float32, seed=None,
                 _init=None):
        dtype = _check_dtype(dtype)
        init = _init_for(seed, dtype, _init)
        self.self_attn = MultiHeadAttention(d_model, nhead, bias=bias, dtype=dtype, _init=init)
        self.ff = FeedForward(d_model, dim_feedforward, activation, bias=bias, dtype=dtype, _init=init)
        self.norm1 = LayerNorm(d_model, layer_norm_eps, bias=bias, dtype=dtype, _init=init)
        self.norm2 = LayerNorm(d_model, layer_norm_eps, bias=bias, dtype=dtype, _init=init)
        self.d_model, self.nhead, self.norm_first = int(d_model), int(nhead), bool(norm_first)
        self._config = {"d_model": int(d_model), "nhead": int(nhead),
                        "dim_feedforward": int(dim_feedforward), "activation": activation,
                        "layer_norm_eps": float(layer_norm_eps), "norm_first": bool(norm_first),
                        "bias": bool(bias), "dtype": dtype.name}
        self._params = {}
        self._children = {"self_attn": self.self_attn, "linear1": self.ff.linear1,
                          "linear2": self.ff.linear2, "norm1": self.norm1, "norm2": self.norm2}

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

    def _forward(self, x, B, T, kmask):
        """x: (B*T, d_model) C-contiguous, owned (may be overwritten) -> (B*T, d_model)."""
        if self.norm_first:
            h = self.norm1._forward(x, out=np.empty_like(x))
            a, _ = self.self_attn._forward(h, h, h, B, T, T, kmask)
            x += a
            h = self.norm2._forward(x, out=h)
            x += self.ff._forward(h)
            return x
        a, _ = self.self_attn._forward(x, x, x, B, T, T, kmask)
        a += x
        x = self.norm1._forward(a, out=a)
        f = self.ff._forward(x)
        f += x
        return self.norm2._forward(f, out=f)

    def __call__(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        x, B, T, batched = _as_input(src, "src", self.d_model, self.dtype, owned=True)
        kmask = _kernel_mask(src_mask, src_key_padding_mask, is_causal, B, self.nhead, T, T,
                             self.dtype, batched, "src_mask", "src_key_padding_mask")
        out = self._forward(x, B, T, kmask)
        return out.reshape((B, T, self.d_model) if batched else (T, self.d_model))


class TransformerDecoderLayer(_Module):
    """Masked self-attention, cross-attention over the encoder memory, feed-forward; each with a
    residual connection and LayerNorm (post-LN by default, pre-LN with ``norm_first=True``).

    Parameter names as torch.nn.TransformerDecoderLayer: self_attn.*, multihead_attn.*, linear1.*,
    linear2.*, norm1.*, norm2.*, norm3.*. Call ``layer(tgt, memory, tgt_mask=None,
    memory_mask=None, tgt_key_padding_mask=None, memory_key_padding_mask=None,
    tgt_is_causal=False, memory_is_causal=False)``.
    """

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.0, activation="relu",
                 layer_norm_eps=1e-5, norm_first=False, bias=True, *, dtype=np.float32, seed=None,
                 _init=None):
        dtype = _check_dtype(dtype)
        init = _init_for(seed, dtype, _init)
        self.self_attn = MultiHeadAttention(d_model, nhead, bias=bias, dtype=dtype, _init=init)
        self.multihead_attn = MultiHeadAttention(d_model, nhead, bias=bias, dtype=dtype, _init=init)
        self.ff = FeedForward(d_model, dim_feedforward, activation, bias=bias, dtype=dtype, _init=init)
        self.norm1 = LayerNorm(d_model, layer_norm_eps, bias=bias, dtype=dtype, _init=init)
        self.norm2 = LayerNorm(d_model, layer_norm_eps, bias=bias, dtype=dtype, _init=init)
        self.norm3 = LayerNorm(d_model, layer_norm_eps, bias=bias, dtype=dtype, _init=init)
        self.d_model, self.nhead, self.norm_first = int(d_model), int(nhead), bool(norm_first)
        self._config = {"d_model": int(d_model), "nhead": int(nhead),
                        "dim_feedforward": int(dim_feedforward), "activation": activation,
                        "layer_norm_eps": float(layer_norm_eps), "norm_first": bool(norm_first),
                        "bias": bool(bias), "dtype": dtype.name}
        self._params = {}
        self._children = {"self_attn": self.self_attn, "multihead_attn": self.multihead_attn,
                          "linear1": self.ff.linear1, "linear2": self.ff.linear2,
                          "norm1": self.norm1, "norm2": self.norm2, "norm3": self.norm3}

    _config_from_state_dict = TransformerEncoderLayer._config_from_state_dict

    def _forward(self, x, mem, B, T, S, tmask, mmask):
        """x: (B*T, d) owned; mem: (B*S, d) read only -> (B*T, d)."""
        if self.norm_first:
            h = self.norm1._forward(x, out=np.empty_like(x))
            a, _ = self.self_attn._forward(h, h, h, B, T, T, tmask)
            x += a
            h = self.norm2._forward(x, out=h)
            a, _ = self.multihead_attn._forward(h, mem, mem, B, T, S, mmask)
            x += a
            h = self.norm3._forward(x, out=h)
            x += self.ff._forward(h)
            return x
        a, _ = self.self_attn._forward(x, x, x, B, T, T, tmask)
        a += x
        x = self.norm1._forward(a, out=a)
        c, _ = self.multihead_attn._forward(x, mem, mem, B, T, S, mmask)
        c += x
        x = self.norm2._forward(c, out=c)
        f = self.ff._forward(x)
        f += x
        return self.norm3._forward(f, out=f)

    def __call__(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                 memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False):
        x, B, T, batched = _as_input(tgt, "tgt", self.d_model, self.dtype, owned=True)
        mem, Bm, S, mb = _as_input(memory, "memory", self.d_model, self.dtype)
        _check_pair(tgt, memory, B, Bm, batched, mb, "tgt", "memory")
        tmask = _kernel_mask(tgt_mask, tgt_key_padding_mask, tgt_is_causal, B, self.nhead, T, T,
                             self.dtype, batched, "tgt_mask", "tgt_key_padding_mask")
        mmask = _kernel_mask(memory_mask, memory_key_padding_mask, memory_is_causal, B, self.nhead,
                             T, S, self.dtype, batched, "memory_mask", "memory_key_padding_mask")
        out = self._forward(x, mem, B, T, S, tmask, mmask)
        return out.reshape((B, T, self.d_model) if batched else (T, self.d_model))


def _check_pair(a, b, Ba, Bb, ab, bb, na, nb):
    if ab != bb or Ba != Bb:
        raise ValueError(f"{na} and {nb} must both be batched with the same batch size or both "
                         f"unbatched, got {na} {np.shape(a)}, {nb} {np.shape(b)}")


def _count_layers(sd, prefix):
    idx = set()
    for k in sd:
        if k.startswith(prefix):
            head = k[len(prefix):].split(".", 1)[0]
            if head.isdigit():
                idx.add(int(head))
    return len(idx)


class TransformerEncoder(_Module):
    """A stack of ``num_layers`` copies of `encoder_layer`, then an optional final LayerNorm.

    Names: layers.N.*, norm.*. Call ``enc(src, mask=None, src_key_padding_mask=None,
    is_causal=False)``. Masks are converted once for the whole stack.
    """

    def __init__(self, encoder_layer, num_layers, norm=None):
        if not isinstance(encoder_layer, TransformerEncoderLayer):
            raise TypeError("encoder_layer must be a TransformerEncoderLayer")
        num_layers = _check_positive_int(num_layers, "num_layers")
        if norm is not None and not isinstance(norm, LayerNorm):
            raise TypeError("norm must be a LayerNorm or None")
        self.layers = [encoder_layer] + [copy.deepcopy(encoder_layer) for _ in range(num_layers - 1)]
        self.norm = norm
        self._init_common(encoder_layer, num_layers, norm)

    def _init_common(self, layer, num_layers, norm):
        self.d_model, self.nhead = layer.d_model, layer.nhead
        self._config = dict(layer._config, num_layers=num_layers, final_norm=norm is not None)
        self._params = {}
        self._children = {f"layers.{i}": lyr for i, lyr in enumerate(self.layers)}
        if norm is not None:
            self._children["norm"] = norm

    @classmethod
    def _from_config(cls, layer_cls, num_layers, final_norm, init, **layer_cfg):
        layers = [layer_cls(_init=init, **layer_cfg) for _ in range(num_layers)]
        norm = (LayerNorm(layer_cfg["d_model"], layer_cfg.get("layer_norm_eps", 1e-5),
                          bias=layer_cfg.get("bias", True), dtype=layer_cfg["dtype"], _init=init)
                if final_norm else None)
        self = cls.__new__(cls)
        self.layers, self.norm = layers, norm
        self._init_common(layers[0], num_layers, norm)
        return self

    @classmethod
    def _config_from_state_dict(cls, sd, prefix, config):
        config = dict(config)
        config.setdefault("num_layers", _count_layers(sd, prefix + "layers."))
        config.setdefault("final_norm", prefix + "norm.weight" in sd)
        layer_cls = TransformerEncoderLayer if cls is TransformerEncoder else TransformerDecoderLayer
        return layer_cls._config_from_state_dict(sd, prefix + "layers.0.", config)

    @classmethod
    def _build(cls, **config):
        config = dict(config)
        dtype = _check_dtype(config.pop("dtype"))
        seed = config.pop("seed", None)
        init = _init_for(seed, dtype, None)
        layer_cls = TransformerEncoderLayer if cls is TransformerEncoder else TransformerDecoderLayer
        return cls._from_config(layer_cls, config.pop("num_layers"), config.pop("final_norm"), init,
                                dtype=dtype, **config)

    @classmethod
    def from_torch_state_dict(cls, state_dict, **config):
        sd = {k: _to_numpy(v) for k, v in state_dict.items()}
        if config.get("dtype") is None:
            first = next((a for a in sd.values() if a.dtype.kind == "f"), None)
            config["dtype"] = np.float64 if first is not None and first.dtype == np.float64 else np.float32
        kwargs = cls._config_from_state_dict(sd, "", config)
        with _empty_init():
            model = cls._build(**kwargs)
        return model.load_state_dict(sd)

    @classmethod
    def load(cls, path):
        config, tensors = _read_safetensors(path, cls.__name__)
        with _empty_init():
            model = cls._build(**config)
        return model.load_state_dict(tensors)

    def _forward(self, x, B, T, kmask):
        for layer in self.layers:
            x = layer._forward(x, B, T, kmask)
        if self.norm is not None:
            x = self.norm._forward(x, out=x)
        return x

    def __call__(self, src, mask=None, src_key_padding_mask=None, is_causal=False):
        x, B, T, batched = _as_input(src, "src", self.d_model, self.dtype, owned=True)
        kmask = _kernel_mask(mask, src_key_padding_mask, is_causal, B, self.nhead, T, T,
                             self.dtype, batched, "mask", "src_key_padding_mask")
        out = self._forward(x, B, T, kmask)
        return out.reshape((B, T, self.d_model) if batched else (T, self.d_model))


class TransformerDecoder(TransformerEncoder):
    """A stack of ``num_layers`` copies of `decoder_layer`, then an optional final LayerNorm.

    Names: layers.N.*, norm.*. Call ``dec(tgt, memory, tgt_mask=None, memory_mask=None,
    tgt_key_padding_mask=None, memory_key_padding_mask=None, tgt_is_causal=False,
    memory_is_causal=False)``.
    """

    def __init__(self, decoder_layer, num_layers, norm=None):
        if not isinstance(decoder_layer, TransformerDecoderLayer):
            raise TypeError("decoder_layer must be a TransformerDecoderLayer")
        num_layers = _check_positive_int(num_layers, "num_layers")
        if norm is not None and not isinstance(norm, LayerNorm):
            raise TypeError("norm must be a LayerNorm or None")
        self.layers = [decoder_layer] + [copy.deepcopy(decoder_layer) for _ in range(num_layers - 1)]
        self.norm = norm
        self._init_common(decoder_layer, num_layers, norm)

    def _forward(self, x, mem, B, T, S, tmask, mmask):
        for layer in self.layers:
            x = layer._forward(x, mem, B, T, S, tmask, mmask)
        if self.norm is not None:
            x = self.norm._forward(x, out=x)
        return x

    def __call__(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                 memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False):
        x, B, T, batched = _as_input(tgt, "tgt", self.d_model, self.dtype, owned=True)
        mem, Bm, S, mb = _as_input(memory, "memory", self.d_model, self.dtype)
        _check_pair(tgt, memory, B, Bm, batched, mb, "tgt", "memory")
        tmask = _kernel_mask(tgt_mask, tgt_key_padding_mask, tgt_is_causal, B, self.nhead, T, T,
                             self.dtype, batched, "tgt_mask", "tgt_key_padding_mask")
        mmask = _kernel_mask(memory_mask, memory_key_padding_mask, memory_is_causal, B, self.nhead,
                             T, S, self.dtype, batched, "memory_mask", "memory_key_padding_mask")
        out = self._forward(x, mem, B, T, S, tmask, mmask)
        return out.reshape((B, T, self.d_model) if batched else (T, self.d_model))


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
                 norm_first=False, bias=True, *, dtype=np.float32, seed=None):
        dtype = _check_dtype(dtype)
        init = _init_for(seed, dtype, None)
        layer_cfg = dict(d_model=d_model, nhead=nhead, dim_feedforward=dim_feedforward,
                         activation=activation, layer_norm_eps=layer_norm_eps,
                         norm_first=norm_first, bias=bias, dtype=dtype)
        self.encoder = TransformerEncoder._from_config(
            TransformerEncoderLayer, _check_positive_int(num_encoder_layers, "num_encoder_layers"),
            True, init, **layer_cfg)
        self.decoder = TransformerDecoder._from_config(
            TransformerDecoderLayer, _check_positive_int(num_decoder_layers, "num_decoder_layers"),
            True, init, **layer_cfg)
        self.d_model, self.nhead = int(d_model), int(nhead)
        self._config = {"d_model": int(d_model), "nhead": int(nhead),
                        "num_encoder_layers": int(num_encoder_layers),
                        "num_decoder_layers": int(num_decoder_layers),
                        "dim_feedforward": int(dim_feedforward), "activation": activation,
                        "layer_norm_eps": float(layer_norm_eps), "norm_first": bool(norm_first),
                        "bias": bool(bias), "dtype": dtype.name}
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
        config.setdefault("num_encoder_layers", _count_layers(sd, prefix + "encoder.layers."))
        config.setdefault("num_decoder_layers", _count_layers(sd, prefix + "decoder.layers."))
        return config

    @staticmethod
    def generate_square_subsequent_mask(sz, dtype=np.float32):
        """(sz, sz) float mask like torch's: 0 on and below the diagonal, -inf above (future)."""
        sz = int(sz)
        return np.triu(np.full((sz, sz), -np.inf, dtype=_check_dtype(dtype)), k=1)

    def __call__(self, src, tgt, *, src_mask=None, tgt_mask=None, memory_mask=None,
                 src_key_padding_mask=None, tgt_key_padding_mask=None,
                 memory_key_padding_mask=None, src_is_causal=False, tgt_is_causal=False,
                 memory_is_causal=False):
        dt = self.dtype
        x, B, S, batched = _as_input(src, "src", self.d_model, dt, owned=True)
        y, Bt, T, tb = _as_input(tgt, "tgt", self.d_model, dt, owned=True)
        _check_pair(src, tgt, B, Bt, batched, tb, "src", "tgt")
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
