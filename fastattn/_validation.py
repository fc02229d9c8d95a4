"""Input checks and conversions. Every error message fastattn raises about its inputs lives here.

The compiled kernels trust their inputs; everything they assume is established here first.

dtype table (applied to the arrays after ``np.result_type`` of all float inputs):

==========================  =====================
input dtype                 computed and returned
==========================  =====================
float32                     float32
float64                     float64
float16                     float32
bool, signed/unsigned int   float64
mixed                       ``np.result_type``, then this table (float32 + float64 -> float64)
longdouble                  TypeError (we would silently drop precision)
complex, object, str, ...   TypeError
==========================  =====================
"""
import math
import os
from numbers import Integral, Real

import numpy as np

from ._kernels._attention import MAX_LEAD_DIMS as _MAX_LEAD

_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def as_array(x, name):
    """np.asarray with a TypeError naming the argument for things that are not arrays of numbers."""
    if x is None:
        raise TypeError(f"{name} must be an array, got None")
    try:
        arr = np.asarray(x)
    except Exception as exc:  # ragged lists, objects whose __array__ fails, ...
        raise TypeError(f"{name} could not be converted to a numeric array: {exc}") from exc
    return arr


def _check_numeric_dtype(arr, name):
    kind = arr.dtype.kind
    if kind in "biu":
        return
    if kind == "f":
        if arr.dtype.itemsize > 8:
            raise TypeError(
                f"{name} has dtype {arr.dtype}, which fastattn does not support "
                "(extended precision would be silently rounded); convert to float64 first")
        return
    raise TypeError(f"{name} must be a real numeric array (float32 or float64), got dtype {arr.dtype}")


def result_dtype(*named_arrays):
    """The dtype the kernel computes in, per the module's table."""
    dt = named_arrays[0][1].dtype
    if dt in _KERNEL_DTYPES and all(a.dtype == dt for _, a in named_arrays):
        return dt                      # the common case, without np.result_type's cost
    for name, arr in named_arrays:
        _check_numeric_dtype(arr, name)
    dt = np.result_type(*[a.dtype for _, a in named_arrays])
    if dt.kind in "biu":
        return np.dtype(np.float64)
    if dt.itemsize < 4:
        return np.dtype(np.float32)
    return dt


def kernel_ready(arr, dtype):
    """arr in `dtype`, native byte order, aligned, last axis contiguous (copies only if needed)."""
    if arr.dtype != dtype:
        arr = arr.astype(dtype)
    if arr.ndim and arr.size:
        last_ok = arr.shape[-1] <= 1 or arr.strides[-1] == arr.itemsize
        if not (arr.flags.aligned and last_ok and arr.dtype.isnative):
            # a fresh C-ordered copy: np.ascontiguousarray would hand back an unaligned
            # C-contiguous array (a view at an odd byte offset) unchanged
            arr = np.array(arr, dtype=arr.dtype.newbyteorder("="), order="C", copy=True)
    return arr


def check_real(value, name, what="a real number"):
    """value as a float; a TypeError naming `name` for anything but a real number (bools too)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (Real, np.floating, np.integer)):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__} {value!r}")
    return float(value)


def check_scale(scale, E, dtype=np.float64):
    """The softmax scale: 1/sqrt(E) by default; otherwise any real number that is finite in the
    compute dtype (the kernel applies it in that precision)."""
    if scale is None:
        return 1.0 / math.sqrt(E) if E > 0 else 1.0
    scale = check_real(scale, "scale", "a real number or None")
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    limit = float(np.finfo(dtype).max)
    if abs(scale) > limit:
        raise ValueError(f"scale {scale} is outside the range of the compute dtype "
                         f"{np.dtype(dtype).name} (|scale| <= {limit:.4g})")
    return scale


def check_flag(value, name):
    """A bool argument of the functional API: True / False (NumPy's too), nothing else."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")


def check_option(value, name):
    """A bool option of a module or model: True / False or the integers 1 / 0 (torch.nn takes
    any truthy value there); strings and other values are a TypeError (a string such as
    'False' would otherwise count as true)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) \
            and value in (0, 1):
        return bool(value)
    return check_flag(value, name)


# The kernels index L, S, E, Ev and a softmax axis with 32-bit ints, and round them up to whole
# blocks (key tiles, query blocks, key splits of up to a few thousand): a size within 2**20 of
# 2**31 overflowed that rounding and the call silently did no work. Sizes stop 2**20 short.
DIM_MAX = 2**31 - 2**20


def check_qkv(q, k, v, enable_gqa):
    """Shapes of query (..., L, E), key (..., S, E), value (..., S, Ev).

    Returns (lead, L, S, E, Ev, head_group): `lead` the broadcast leading shape of the output,
    head_group > 1 when grouped-query attention maps several query heads to one key/value head.
    """
    for name, a, dims in (("query", q, "(..., L, E)"), ("key", k, "(..., S, E)"),
                          ("value", v, "(..., S, Ev)")):
        if a.ndim < 2:
            raise ValueError(f"{name} must have at least 2 dimensions {dims}, got shape {a.shape}")
    L, E = q.shape[-2:]
    S, Ek = k.shape[-2:]
    Sv, Ev = v.shape[-2:]
    if Ek != E:
        raise ValueError("query and key must have the same embedding size E (last dimension), "
                         f"got query.shape={q.shape}, key.shape={k.shape}")
    if Sv != S:
        raise ValueError("key and value must have the same sequence length S (dimension -2), "
                         f"got key.shape={k.shape}, value.shape={v.shape}")
    for name, a in (("query", q), ("key", k), ("value", v)):
        if a.ndim - 2 > _MAX_LEAD:
            raise ValueError(f"{name} has {a.ndim - 2} leading dimensions; at most {_MAX_LEAD} are "
                             f"supported, got shape {a.shape}")
    for name, n in (("L", L), ("S", S), ("E", E), ("Ev", Ev)):
        if n > DIM_MAX:
            raise ValueError(f"{name} = {n} is larger than the kernel's limit {DIM_MAX} "
                             "(32-bit indexes)")
    q_lead, k_lead, v_lead = q.shape[:-2], k.shape[:-2], v.shape[:-2]
    head_group = 1
    if enable_gqa:
        if q.ndim < 3 or k.ndim < 3 or v.ndim < 3:
            raise ValueError("enable_gqa=True needs a head dimension at -3 in query, key and value, "
                             f"got query.shape={q.shape}, key.shape={k.shape}, value.shape={v.shape}")
        hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
        if hk != hv:
            raise ValueError("with enable_gqa=True key and value must have the same number of heads "
                             f"(dimension -3), got key.shape={k.shape}, value.shape={v.shape}")
        if hk == 0 or hq % hk != 0:
            raise ValueError("with enable_gqa=True the query heads must be a multiple of the key/value "
                             f"heads (dimension -3), got query.shape={q.shape} ({hq} heads), "
                             f"key.shape={k.shape} ({hk} heads)")
        head_group = hq // hk
        k_lead = k_lead[:-1] + (hq,)
        v_lead = v_lead[:-1] + (hq,)
    try:
        lead = q_lead if q_lead == k_lead == v_lead else np.broadcast_shapes(q_lead, k_lead, v_lead)
    except ValueError:
        hint = ""
        if not enable_gqa and q.ndim >= 3 and k.ndim >= 3 and q.shape[-3] != k.shape[-3]:
            hint = " (for fewer key/value heads than query heads pass enable_gqa=True)"
        raise ValueError("the leading (batch, head) dimensions of query, key and value do not broadcast: "
                         f"query.shape={q.shape}, key.shape={k.shape}, value.shape={v.shape}{hint}") from None
    return lead, L, S, E, Ev, head_group


def narrow_float_mask(mask, dtype):
    """A float mask cast down to the compute dtype. A finite entry beyond its range becomes the
    largest finite value, not +inf: a score plus +inf is NaN after the max subtraction, where the
    wider mask gave that key all the weight (as the largest finite value does); -inf is kept
    (that key gets no weight either way)."""
    with np.errstate(over="ignore"):
        narrow = mask.astype(dtype)
    big = np.isposinf(narrow)
    if big.any():
        big &= np.isfinite(mask)
        narrow[big] = np.finfo(dtype).max
    return narrow


def check_mask(mask, L, S, lead):
    """attn_mask: bool (True = may attend) or float (added to the scores), broadcastable to
    (*lead, L, S). Returns (mask viewed with at least 2 dims, the new broadcast lead)."""
    if mask.dtype.kind not in "bf":
        raise TypeError("attn_mask must be a bool array (True = may attend) or a float array "
                        f"(added to the scores), got dtype {mask.dtype}")
    if mask.dtype.kind == "f" and mask.dtype.itemsize > 8:
        raise TypeError(f"attn_mask has dtype {mask.dtype}, which fastattn does not support")
    if mask.ndim - 2 > _MAX_LEAD:
        raise ValueError(f"attn_mask has {mask.ndim - 2} leading dimensions; at most {_MAX_LEAD} "
                         f"are supported, got shape {mask.shape}")
    if mask.ndim < 2:
        mask = mask.reshape((1,) * (2 - mask.ndim) + mask.shape)
    ml, ms = mask.shape[-2:]
    if ml not in (1, L) or ms not in (1, S):
        raise ValueError(f"attn_mask of shape {mask.shape} does not broadcast to the attention "
                         f"weights' shape {tuple(lead) + (L, S)} (its last two dimensions must be "
                         f"1 or L={L} and 1 or S={S})")
    try:
        lead = np.broadcast_shapes(lead, mask.shape[:-2])
        if len(lead) > _MAX_LEAD:
            raise ValueError
    except ValueError:
        raise ValueError(f"attn_mask of shape {mask.shape} does not broadcast to the attention "
                         f"weights' shape {tuple(lead) + (L, S)}") from None
    return mask, lead


# ---------------------------------------------------------------- threads

def check_n_threads(n, name="n_threads"):
    if type(n) is int and n >= 1:      # the common case first: every kernel call passes here
        return n
    if isinstance(n, bool) or not isinstance(n, Integral):
        raise TypeError(f"{name} must be a positive integer or None, got {type(n).__name__} {n!r}")
    if n < 1:
        raise ValueError(f"{name} must be a positive integer or None, got {n}")
    return int(n)


# ---------------------------------------------------------------- modules (fastattn.nn)

_MODEL_DTYPES = {"float32": np.dtype(np.float32), "float64": np.dtype(np.float64)}


def check_dtype(dtype, name="dtype"):
    """A model's dtype: float32 or float64 (anything np.dtype takes that names one of them)."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{name} must be float32 or float64, got {dtype!r}") from None
    if dt not in _MODEL_DTYPES.values():
        raise TypeError(f"{name} must be float32 or float64, got {dt}")
    return dt


def check_seed(seed, name="seed"):
    """A random seed: None or an integer >= 0 (what np.random.default_rng takes as a seed)."""
    if seed is None:
        return None
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"{name} must be None or an integer >= 0, got {type(seed).__name__} "
                        f"{seed!r}")
    if seed < 0:
        raise ValueError(f"{name} must be None or an integer >= 0, got {seed!r}")
    return int(seed)


def check_int(n, name, low=1, high=None, what="a positive integer"):
    """An integer (Python or NumPy, not bool) in [low, high) (high None: no bound) as an int;
    else a ValueError "`name` must be `what`, got `n`"."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < low or (
            high is not None and n >= high):
        raise ValueError(f"{name} must be {what}, got {n!r}")
    return int(n)


def check_positive_int(n, name):
    return check_int(n, name)


def check_choice(value, name, choices):
    """`value` if it is one of `choices`, else a ValueError listing them."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")
    return value


def _distinct_elements(a):
    """Whether no two elements of `a` share memory, for the layouts slicing, transposing and
    reshaping produce: sorted by stride, each axis steps over the whole extent of the ones
    inside it (a sufficient test; as_strided views that fold back on themselves fail it)."""
    dims = sorted((abs(st), n) for st, n in zip(a.strides, a.shape) if n > 1)
    extent = a.itemsize
    for st, n in dims:
        if st < extent:
            return False
        extent = st * n
    return True


def check_out(out, name, dtype, shape, *, aligned=False, rows=False):
    """A caller's output array: a NumPy array of exactly `dtype` and `shape`, writeable and
    C-contiguous; with `aligned`, also element-aligned in native byte order (vector stores).
    With `rows` (implies `aligned`) any strides are accepted whose last axis is contiguous and
    whose elements are distinct (a transposed or sliced view of a larger buffer)."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array or None, got {type(out).__name__}")
    if out.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {out.dtype}")
    if out.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {name}.shape={out.shape}")
    if rows:
        if not out.flags.writeable:
            raise ValueError(f"{name} must be writeable")
        if not (out.flags.aligned and out.dtype.isnative):
            raise ValueError(f"{name} must be element-aligned, in native byte order")
        if out.ndim and out.shape[-1] > 1 and out.strides[-1] != out.itemsize:
            raise ValueError(f"{name}'s last axis must be contiguous (stride {out.itemsize} "
                             f"bytes), got strides {out.strides}")
        if not _distinct_elements(out):
            raise ValueError(f"{name} must not overlap itself, got strides {out.strides} "
                             f"for shape {out.shape}")
        return
    ok = out.flags.c_contiguous and out.flags.writeable
    if aligned:
        ok = ok and out.flags.aligned and out.dtype.isnative
    if not ok:
        extra = ", aligned" if aligned else ""
        order = " in native byte order" if aligned else ""
        raise ValueError(f"{name} must be a writeable{extra} C-contiguous array{order}")


def to_numpy(x):
    """np.asarray for arrays and anything array-like, torch tensors included (never imports torch)."""
    if hasattr(x, "detach") and hasattr(x, "cpu") and hasattr(x, "numpy"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def as_model_input(x, name, d, dtype, owned=False):
    """(B, T, d) or unbatched (T, d) -> (C-contiguous (B*T, d) in `dtype`, B, T, batched).

    owned=True: the result never shares memory with `x` (the caller may overwrite it)."""
    arr = to_numpy(x)
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


def check_real_input(arr, name):
    """A module input must hold real numbers (bool, int or float up to float64): strings,
    complex, object and extended-precision arrays are a TypeError naming the argument."""
    kind = arr.dtype.kind
    if kind not in "fiub" or (kind == "f" and arr.dtype.itemsize > 8):
        raise TypeError(f"{name} must be a real numeric array (float32 or float64), got dtype "
                        f"{arr.dtype}")
    return arr


def check_eps(eps, name="eps"):
    """A LayerNorm epsilon: a real number, finite and >= 0."""
    eps = check_real(eps, name)
    if not (eps >= 0 and math.isfinite(eps)):
        raise ValueError(f"{name} must be finite and >= 0, got {eps}")
    return eps


def hf_attention_mask(mask, shape, name="attention_mask"):
    """A Hugging Face attention mask (1 = token, 0 = padding) of `shape`, int / bool / float
    holding only 0 and 1 (torch tensors accepted) -> bool array, True = token."""
    m = to_numpy(mask)
    if m.shape != tuple(shape):
        raise ValueError(f"{name} must have the shape of input_ids {tuple(shape)} (1 = token, "
                         f"0 = padding), got {m.shape}")
    if m.dtype.kind not in "biuf":
        raise TypeError(f"{name} must hold 0/1 (int, bool or float), got dtype {m.dtype}")
    if m.dtype.kind == "b":
        return np.array(m, dtype=bool, copy=True)    # the caller's array is never kept
    ok = (m == 0) | (m == 1)
    if not ok.all():
        bad = m[~ok].flat[0].item()
        raise ValueError(f"{name} must hold only 0 and 1 (Hugging Face convention: 1 = token, "
                         f"0 = padding), found {bad!r}"
                         + ("; an additive float mask (0 / -inf) is not accepted here"
                            if m.dtype.kind == "f" else ""))
    return m != 0


def check_last_dim(x, d, name="x"):
    """x as an array of real numbers whose last dimension is d."""
    arr = check_real_input(to_numpy(x), name)
    if arr.ndim < 1 or arr.shape[-1] != d:
        raise ValueError(f"{name} must have last dimension {d}, got shape {arr.shape}")
    return arr


def check_batch_pair(a, b, Ba, Bb, ab, bb, na, nb):
    """Two module inputs (e.g. src and tgt) must agree on being batched and on the batch size."""
    if ab != bb or Ba != Bb:
        raise ValueError(f"{na} and {nb} must both be batched with the same batch size or both "
                         f"unbatched, got {na} {np.shape(a)}, {nb} {np.shape(b)}")


def module_mask(m, name, dtype, padding=False):
    """A mask in torch.nn's module convention: bool (True = not allowed, or True = padding for a
    key-padding mask) or float (added to the scores, cast to `dtype`)."""
    arr = to_numpy(m)
    if arr.dtype.kind == "b":
        return arr
    if arr.dtype.kind == "f":
        if arr.dtype.itemsize > 8:
            raise TypeError(f"{name} has dtype {arr.dtype}, which fastattn does not support")
        return arr.astype(dtype, copy=False)
    meaning = "True = padding" if padding else "True = not allowed"
    raise TypeError(f"{name} must be a bool array ({meaning}) or a float array "
                    f"(added to the scores), got dtype {arr.dtype}")


# ---------------------------------------------------------------- models: token ids, generation

def check_token_ids(ids, name, vocab, ndim=2, what="(batch, length)", one_row=True):
    """Token ids as an int64 array of `ndim` dimensions (with ndim=2 and `one_row` a 1-D
    sequence is one batch row),
    every id in [0, vocab): a TypeError for non-integer ids, a ValueError naming `name` for
    another shape or an id outside the vocabulary. Torch tensors are converted."""
    a = np.asarray(to_numpy(ids))
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integer token ids, got dtype {a.dtype}")
    if ndim == 2 and a.ndim == 1 and one_row:
        a = a[None]
    if a.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D {what}, got shape {a.shape}")
    if a.size and (a.min() < 0 or a.max() >= vocab):
        bad = a[(a < 0) | (a >= vocab)].ravel()[0]
        raise ValueError(f"{name} holds token id {int(bad)} outside the vocabulary [0, {vocab})")
    return a.astype(np.int64, copy=False)


def pad_batch(rows, pad_id):
    """Token id rows of different lengths -> (ids (B, S) int64 right-padded with pad_id, mask
    (B, S) bool, True = token), S the longest row's length."""
    S = max(len(r) for r in rows)
    ids = np.full((len(rows), S), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), S), dtype=bool)
    for b, r in enumerate(rows):
        ids[b, :len(r)] = r
        mask[b, :len(r)] = True
    return ids, mask


def check_labels(labels, n_rows, vocab, max_len, name="labels"):
    """Target ids to score: an int64 array (n_rows, T) (a 1-D sequence is one row when n_rows
    is 1) of ids in [0, vocab) or -100 (transformers' "ignore this position"), T <= max_len."""
    a = np.asarray(to_numpy(labels))
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integer token ids, got dtype {a.dtype}")
    if a.ndim == 1 and n_rows == 1:
        a = a[None]
    if a.ndim != 2:
        raise ValueError(f"{name} must be 2-D (batch, length), got shape {a.shape}")
    if a.shape[0] != n_rows:
        raise ValueError(f"{name} has {a.shape[0]} rows, input_ids {n_rows}")
    if a.shape[1] > max_len:
        raise ValueError(f"{name} has {a.shape[1]} positions, more than the decoder's "
                         f"max_position_embeddings={max_len}")
    bad = ((a < 0) & (a != -100)) | (a >= vocab)
    if bad.any():
        raise ValueError(f"{name} holds token id {int(a[bad].ravel()[0])} outside the vocabulary "
                         f"[0, {vocab}) (-100 marks ignored positions)")
    return a.astype(np.int64, copy=False)


# generation settings: name -> the rule its value must meet (transformers' meaning)
_INT_SETTINGS = {"max_length": 1, "max_new_tokens": 0, "min_length": 0, "min_new_tokens": 0,
                 "num_beams": 1, "top_k": 0, "seed": 0, "no_repeat_ngram_size": 0,
                 "encoder_no_repeat_ngram_size": 0, "num_return_sequences": 1}


def check_generation_setting(key, value, where=None):
    """One generation setting (an argument of generate, or a field of a generation config file
    when `where` names it): its value, or a ValueError naming the argument (or file and field).
    None is returned as it is (not set)."""
    if value is None:
        return None

    def bad(what):
        name = key if where is None else f"{where}: {key}={value!r}"
        raise ValueError(f"{name} must be {what}" + ("" if where else f", got {value!r}"))

    is_bool = isinstance(value, (bool, np.bool_))
    is_int = isinstance(value, (int, np.integer)) and not is_bool
    is_num = (is_int or isinstance(value, (float, np.floating))) and not is_bool
    if key in _INT_SETTINGS:
        if not is_int or value < _INT_SETTINGS[key]:
            bad(f"an integer >= {_INT_SETTINGS[key]}")
        return int(value)
    if key in ("do_sample", "renormalize_logits"):
        if not is_bool:
            bad("True or False")
        return bool(value)
    if key == "early_stopping":
        if not (is_bool or (isinstance(value, str) and value == "never")):
            bad("True, False or 'never'")
        return value if isinstance(value, str) else bool(value)
    if key == "temperature":
        if not is_num or not 0 < value < math.inf:
            bad("a positive float")
        return float(value)
    if key == "top_p":
        if not is_num or not 0 <= value <= 1:
            bad("a float in [0, 1]")
        return float(value)
    if key == "length_penalty":
        if not is_num or not math.isfinite(value):
            bad("a finite float")
        return float(value)
    if key == "repetition_penalty":
        # applied in float32 (the scores' dtype): it must stay a positive finite float32 there
        ok = is_num and 0 < value < math.inf
        if ok:
            with np.errstate(over="ignore", under="ignore"):
                ok = 0 < np.float32(value) < np.inf
        if not ok:
            bad("a positive float (finite and non-zero in float32)")
        return float(value)
    if key == "return_scores":
        if not is_bool:
            raise TypeError(f"return_scores must be True or False, got {type(value).__name__} "
                            f"{value!r}")
        return bool(value)
    return value


def check_folder(path, name="path"):
    """A model folder: an existing directory given as str or os.PathLike -> its str path
    (TypeError / FileNotFoundError naming the argument and the path)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name} must be a folder path (str or os.PathLike), got "
                        f"{type(path).__name__}")
    folder = os.fspath(path)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"model folder not found: {folder}")
    return folder
