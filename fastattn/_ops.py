"""Linear layers, activations and LayerNorm on fastattn's own kernels (no BLAS call).

``linear`` and ``PackedLinear`` compute ``act(x @ weight.T + bias) + residual`` with the
weight packed into the micro-kernel's panel layout (``fastattn/_kernels/gemm_tile.h``) and the
bias, activation and residual applied while each output tile is still in cache. They run on
the same OpenMP threads as the attention kernels, and their results are bitwise identical for
any thread count.

dtype rules: float32 stays float32, float64 stays float64. The floating-point arguments must
share one dtype (a float32 ``x`` with a float64 ``weight`` is a TypeError naming the argument;
convert explicitly). Integer and bool inputs are converted: to the dtype of the floating-point
arguments if there are any, to float64 (``_validation.result_dtype``) if there are none;
float16 counts as float32.

Activations: ``None``, ``"relu"``, ``"gelu"`` (exact, through erf), ``"gelu_tanh"``
(torch's ``approximate='tanh'``; aliases ``"gelu_new"``, ``"gelu_pytorch_tanh"``), ``"silu"``
(alias ``"swish"``). At the infinities they return their limits (``gelu(-inf) = -0``, where
torch returns NaN); NaN stays NaN.
"""
import math
import os
import sys
import threading

import numpy as np

from ._kernels import _gemm as _g
from ._kernels import _qgemm as _qg
from ._kernels import _simd
from ._quant import Bf16Weight, Int8Weight, check_quantize, weight_kind
from ._threads import _effective_n_threads
from ._validation import as_array, check_eps, check_out, kernel_ready, result_dtype

__all__ = ["linear", "PackedLinear", "gelu", "silu", "relu", "layer_norm"]

_ACT_ALIASES = {
    None: None, "none": None, "identity": None, "linear": None,
    "relu": "relu",
    "gelu": "gelu",
    "gelu_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
    "silu": "silu", "swish": "silu",
}


def _activation_code(activation):
    if activation is not None and not isinstance(activation, str):
        raise TypeError(f"activation must be a string or None, got {type(activation).__name__} "
                        f"{activation!r}")
    key = activation.lower() if isinstance(activation, str) else None
    if key not in _ACT_ALIASES:
        raise ValueError(f"activation must be one of None, 'relu', 'gelu', 'gelu_tanh', 'silu' "
                         f"(or an alias: {sorted(k for k in _ACT_ALIASES if k)}), "
                         f"got {activation!r}")
    return _g.ACTIVATIONS[_ACT_ALIASES[key]]


# Cache-line alignment of the buffers the GEMM streams with full-vector loads and stores: the
# packed weights (every micro-kernel step loads NR elements of a panel) and the output y (its
# tiles are loaded and stored whole between K blocks and in the epilogue). NumPy's large
# allocations start 16 bytes past a page boundary, so every 64-byte AVX-512 access to them
# straddles two cache lines; single-threaded at M = 1024-2048 that cost 2-19% of the GEMM time
# (bench/results/bench_gemm.txt). Alignment does not change the results (same kernels, same
# summation order). The aligned allocation costs a few microseconds more than np.empty, so a
# y under _ALIGN_MIN_BYTES (decode steps, where reading the weights is the work) keeps plain
# np.empty. Under ci/sanitize.sh (FASTATTN_SANITIZED) the buffers keep their exact size, so that
# ASan's redzone starts right after the last element and a small overrun is caught.
_ALIGN = 64
_ALIGN_MIN_BYTES = 1 << 18
_EXACT_ALLOC = bool(os.environ.get("FASTATTN_SANITIZED"))


def _aligned_empty(shape, dtype):
    """np.empty(shape, dtype) for a tuple shape and a np.dtype, C-contiguous, its data starting
    on a _ALIGN-byte boundary: a view into a slightly larger 1-D buffer (exactly sized, and not
    aligned, under the sanitizer)."""
    if _EXACT_ALLOC:
        return np.empty(shape, dtype=dtype)
    n = math.prod(shape)
    isz = dtype.itemsize
    raw = np.empty(n + _ALIGN // isz, dtype=dtype)
    off = (-raw.ctypes.data % _ALIGN) // isz
    return raw[off:off + n].reshape(shape)


# Outputs of 1 MiB and more come from a small pool per thread of buffers that no array uses
# any more. A fresh large array is fresh memory from the kernel, and glibc hands freed ones
# back: each layer's output then cost the kernel zeroing its (huge) pages, 3.5% of an int8
# MiniLM forward capped at AVX2 and ~1% in float32 (perf on an Intel Xeon, 2026-12-05). A pooled
# buffer is a 1-D uint8 array; every array made from it (the output, its reshapes and slices)
# holds it as its base, so its reference count says whether any is alive, and it is handed out
# again only when none is. Per thread (threading.local): no locks, and one thread's buffers
# never go to another. At most _POOL_BYTES are kept per thread; off under the sanitizer (exact
# sizes), with FASTATTN_NO_OUTPUT_POOL=1 (read at import), and where reference counts cannot be
# read. release_output_pool() drops the calling thread's buffers.
_POOL_MIN_BYTES = 1 << 20
_POOL_BYTES = 128 << 20
_pool = threading.local()


def release_output_pool():
    """Drop the calling thread's pooled output buffers (those no array uses are freed now, the
    others when their last array goes)."""
    _pool.bufs = []


def _pool_held():
    """(buffers, bytes) in the calling thread's pool (for the tests)."""
    bufs = getattr(_pool, "bufs", None) or []
    return len(bufs), sum(b.nbytes for b in bufs)


def _refs(bufs, i):
    """sys.getrefcount of bufs[i]: the one expression both the probe and the pool read."""
    return sys.getrefcount(bufs[i])


def _refs_probe():
    """_refs of a pooled buffer that no array uses; None where it cannot tell a used buffer
    from a free one."""
    if not hasattr(sys, "getrefcount"):
        return None
    bufs = [np.empty(8, np.uint8)]
    free = _refs(bufs, 0)
    view = bufs[0][1:]
    used = _refs(bufs, 0)
    del view
    return free if used > free else None


_POOL_FREE_REFS = (None if _EXACT_ALLOC or os.environ.get("FASTATTN_NO_OUTPUT_POOL")
                   else _refs_probe())


def _pooled_empty(shape, dtype, nbytes):
    """_aligned_empty(shape, dtype) from this thread's pool: a free buffer of nbytes + _ALIGN to
    twice that, else a new one (kept while the pool has room, the oldest free ones dropped to
    make it)."""
    need = nbytes + _ALIGN
    if need > _POOL_BYTES:                   # never pooled (and the pool left as it is)
        return _aligned_empty(shape, dtype)
    bufs = getattr(_pool, "bufs", None)
    if bufs is None:
        bufs = _pool.bufs = []
    raw = None
    for i in range(len(bufs)):
        if need <= bufs[i].nbytes <= 2 * need and _refs(bufs, i) == _POOL_FREE_REFS:
            raw = bufs.pop(i)
            break
    if raw is None:
        held = sum(b.nbytes for b in bufs)
        i = 0
        while held + need > _POOL_BYTES and i < len(bufs):
            if _refs(bufs, i) == _POOL_FREE_REFS:
                held -= bufs.pop(i).nbytes
            else:
                i += 1
        if held + need > _POOL_BYTES:        # the pool is full of buffers in use
            return _aligned_empty(shape, dtype)
        raw = np.empty(need, np.uint8)
    bufs.append(raw)                         # most recently used last
    off = -raw.ctypes.data % _ALIGN
    return raw[off:off + nbytes].view(dtype).reshape(shape)


def _new_output(shape, dtype):
    """A GEMM output: from the thread's pool from _POOL_MIN_BYTES up, cache-line aligned from
    _ALIGN_MIN_BYTES up, plain np.empty below."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes >= _POOL_MIN_BYTES and _POOL_FREE_REFS is not None:
        return _pooled_empty(tuple(shape), dtype, nbytes)
    if nbytes >= _ALIGN_MIN_BYTES:
        return _aligned_empty(shape, dtype)
    return np.empty(shape, dtype=dtype)


def _common_dtype(named):
    """The compute dtype of (name, array) pairs (None entries skipped), per the module rules."""
    named = [(n, a) for n, a in named if a is not None]
    dt = result_dtype(*named)             # also rejects complex, object, longdouble, ...
    floats = [(n, a) for n, a in named if a.dtype.kind == "f"]
    if not floats:
        return dt
    first_name, first = floats[0]

    def native(dt):   # float16 computes as float32; byte order does not matter
        return np.dtype(np.float32) if dt.itemsize < 4 else dt.newbyteorder("=")

    want = native(first.dtype)
    for name, a in floats[1:]:
        if native(a.dtype) != want:
            raise TypeError(f"{name} has dtype {a.dtype} but {first_name} has dtype "
                            f"{first.dtype}; fastattn does not mix float precisions, convert "
                            f"one of them (e.g. {name}.astype({first_name}.dtype))")
    return want


def _check_weight(weight, bias):
    if weight.ndim != 2:
        raise ValueError(f"weight must be 2-D (out_features N, in_features K), got shape "
                         f"{weight.shape}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must have shape (N,) = ({weight.shape[0]},) to match "
                         f"weight.shape={weight.shape}, got bias.shape={bias.shape}")


def _vector(arr, dtype):
    """1-D, contiguous, aligned, native, in dtype."""
    arr = kernel_ready(arr, dtype)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return arr


# Binary16 panels: a float32 weight whose every value is a binary16 number (checked bit for
# bit: the weights of checkpoints trained or stored in float16 and widened, e.g. OpenAI's
# Whisper) is packed as binary16 bit patterns where the kernel set can widen them as it loads
# (AVX2 with F16C, AVX-512): the same multiply-adds on the same float32 values, so the same
# bits, from half the memory and half the bytes streamed (a decode step's output projection
# reads its whole weight every step). FASTATTN_HALF_PANELS=0 (read at import) packs float32
# panels always, for A/B runs.
_HALF_PANELS = os.environ.get("FASTATTN_HALF_PANELS", "1") != "0"
_HALF_CHUNK = 1 << 20        # elements converted at a time by the check (bounded temporaries)


def _as_half(w):
    """w (N, K) float32 as binary16 bit patterns (uint16, C order) when every value converts
    exactly, bit for bit (-0.0, subnormals, infinities and the quiet NaN do; a NaN payload
    binary16 cannot hold does not), else None."""
    N, K = w.shape
    out = np.empty((N, K), np.uint16)
    rows = max(1, _HALF_CHUNK // max(K, 1))
    for a in range(0, N, rows):
        blk = w[a:a + rows]
        h = blk.astype(np.float16)
        if not np.array_equal(h.astype(np.float32).view(np.uint32), blk.view(np.uint32)):
            return None
        out[a:a + rows] = h.view(np.uint16)
    return out


class _Packed:
    """A weight (N, K) packed for the kernel set selected when it was packed.

    With the array kept (`_weight`), or alone (:meth:`drop_weight`: a model's parameter, held
    once): the array is then read back from the panels when asked for (`weight`, a new array of
    the same values) and to repack for another kernel set. A float32 weight of binary16 values
    is packed in binary16 panels where the kernel set has them (`buf` uint16: see _HALF_PANELS
    above)."""

    __slots__ = ("_weight", "buf", "N", "K", "level", "dtype", "blocking")

    def __init__(self, weight):
        # weight: 2-D, kernel-ready (last axis contiguous, aligned, native), float32/float64
        self._weight = weight
        self.N, self.K = weight.shape
        self.dtype = weight.dtype
        self.level = None
        self.buf = None
        self.repack()

    @classmethod
    def alone(cls, weight):
        """Packed from `weight` (any float array of the model's dtype), holding no array."""
        w = np.asarray(weight)
        return cls(kernel_ready(w, w.dtype)).drop_weight()

    @property
    def weight(self):
        """The (N, K) weight: the array given, or (dropped) one read back from the panels."""
        return self._weight if self._weight is not None else self.unpack()

    @property
    def shape(self):
        return (self.N, self.K)

    @property
    def nbytes(self):
        return self.buf.nbytes

    def drop_weight(self):
        self._weight = None
        return self

    @classmethod
    def from_panels(cls, buf, N, K, level, blocking):
        """A weight packed earlier (a saved folder's panels, mapped read-only) with the kernel
        set `level` and its `blocking`: used as it is while that set runs, read back and
        repacked once when another one does (another CPU, a forced ISA)."""
        self = cls.__new__(cls)
        dtype = buf.dtype
        if dtype == np.float16:               # binary16 panels of a float32 weight
            buf, dtype = buf.view(np.uint16), np.dtype(np.float32)
        self._weight, self.buf, self.N, self.K = None, buf, int(N), int(K)
        self.dtype, self.level, self.blocking = dtype, int(level), tuple(blocking)
        return self

    @property
    def half(self):
        """Whether the panels hold binary16 values (of a float32 weight)."""
        return self.buf.dtype == np.uint16

    def dequantize(self):
        """The values (a new array): the protocol state_dict reads parameters with."""
        return self.weight.copy() if self._weight is not None else self.unpack()

    def rows(self, a, b):
        """Rows [a, b) packed on their own (from the read-back array), holding no array."""
        return _Packed.alone(self.weight[a:b])

    def unpack(self):
        """W (N, K) from the panels (gemm_tile.h's layout with the blocking of `level`)."""
        nr, kc = self.blocking[1], self.blocking[2]
        N, K = self.N, self.K
        npad = -(-N // nr) * nr
        out = np.empty((npad, K), self.dtype)
        src = self.buf.view(np.float16) if self.half else self.buf
        for k0 in range(0, K, kc):
            kcb = min(kc, K - k0)
            blk = src[k0 * npad:(k0 + kcb) * npad].reshape(npad // nr, kcb, nr)
            out[:, k0:k0 + kcb] = blk.transpose(0, 2, 1).reshape(npad, kcb)
        return np.ascontiguousarray(out[:N])

    def repack(self):
        level = _simd.isa_level()
        w = self.weight                      # (read back under the old blocking if dropped)
        # cache-line aligned (exact size under the sanitizer: see _aligned_empty)
        size = _g.packed_size(self.N, self.K, self.dtype.itemsize)
        half = None
        if _HALF_PANELS and size and self.dtype == np.float32 and _g.half_panels():
            half = _as_half(w)
        if half is not None:
            buf = _aligned_empty((size,), np.dtype(np.uint16))
            _g.pack_weight_half(half, buf)
            del half
        else:
            buf = _aligned_empty((size,), self.dtype)
            if buf.size:
                _g.pack_weight(w, buf)
        self.buf, self.level = buf, level
        self.blocking = _g.blocking(self.dtype.itemsize)

    def current(self):
        if self.level != _simd.isa_level() or (self.half and not _g.half_panels()):
            self.repack()   # the kernel set changed (tests, another CPU): panel width differs
        return self.buf

    def buffers(self):
        return (self.buf,) if self._weight is None else (self._weight, self.buf)

    def gemm(self, x, bias, act, res, y, nthr, norm=None):
        _g.gemm(x, self.current(), self.N, bias, act, res, y, nthr, norm)


class _QPacked:
    """An Int8Weight in the _Packed interface (its layout is the same for every kernel set)."""

    __slots__ = ("q", "N", "K", "dtype")

    def __init__(self, q):
        self.q, self.N, self.K = q, q.N, q.K
        self.dtype = np.dtype(np.float32)

    @property
    def weight(self):
        return self.q.dequantize()

    def buffers(self):
        return (self.q.panels,)

    def gemm(self, x, bias, act, res, y, nthr, norm=None):
        q = self.q
        _qg.gemm_int8(x, q.panels, q.scale, q.comp, q.N, bias, act, res, y, nthr, norm)


class _BPacked(_QPacked):
    """A Bf16Weight in the _Packed interface (its layout is the same for every kernel set)."""

    __slots__ = ()

    def gemm(self, x, bias, act, res, y, nthr, norm=None):
        _qg.gemm_bf16(x, self.q.panels, self.q.N, bias, act, res, y, nthr, norm)


# the quantized weight classes and their _Packed interfaces
_QUANTIZED = {Int8Weight: ("int8", _QPacked), Bf16Weight: ("bfloat16", _BPacked)}


def _linear_packed(x, packed, bias, act, residual, n_threads, out, x_name="x"):
    """Shared body of linear() and PackedLinear.__call__: x already an array, dtype checked."""
    N, K = packed.N, packed.K
    dtype = packed.dtype
    if x.ndim < 1:
        raise ValueError(f"{x_name} must have at least 1 dimension (..., K), got shape {x.shape}")
    if x.shape[-1] != K:
        raise ValueError(f"{x_name}'s last dimension must equal weight's in_features K={K}, got "
                         f"{x_name}.shape={x.shape}, weight.shape={(N, K)}")
    lead = x.shape[:-1]
    out_shape = lead + (N,)
    M = int(np.prod(lead, dtype=np.int64)) if lead else 1
    nthr = _effective_n_threads(n_threads)
    if residual is not None and residual.shape != out_shape:
        raise ValueError(f"residual must have the output's shape {out_shape}, got "
                         f"residual.shape={residual.shape}")
    if out is not None:
        check_out(out, "out", dtype, out_shape, aligned=True)
        for name, a in ((x_name, x), ("bias", bias)) + tuple(("weight", w) for w in
                                                                 packed.buffers()):
            if a is not None and np.may_share_memory(out, a):
                raise ValueError(f"out must not overlap {name}")
        y = out
    else:
        y = _new_output(out_shape, dtype)
    if M == 0 or N == 0:
        return y
    x2 = kernel_ready(x, dtype).reshape(M, K)
    x2 = kernel_ready(x2, dtype)               # a reshape of a strided array may copy or not
    y2 = y.reshape(M, N)
    r2 = None
    if residual is not None:
        r2 = kernel_ready(residual, dtype)
        if np.may_share_memory(r2, y2):
            # the kernel keeps partial sums in y between K blocks: read the residual from a copy
            r2 = r2.copy()
        r2 = kernel_ready(r2.reshape(M, N), dtype)
    if K == 0:
        x2 = np.zeros((M, 1), dtype=dtype)[:, :0]   # never read; a valid pointer and stride
    packed.gemm(x2, bias, act, r2, y2, nthr)
    return y


def linear(x, weight, bias=None, activation=None, residual=None, *, n_threads=None, out=None,
           quantize=None):
    """``act(x @ weight.T + bias) + residual``, torch's ``Linear`` convention, no BLAS.

    Parameters
    ----------
    x : array_like, shape (..., K)
        Any layout (strided and transposed views are fine; the last axis is copied to
        contiguous only if it is not).
    weight : array_like, shape (N, K)
        Packed for this call only; reuse a ``PackedLinear`` to pack once.
    bias : array_like, shape (N,), optional
    activation : {None, 'relu', 'gelu', 'gelu_tanh', 'silu'}, optional
        Applied after the bias, before the residual.
    residual : array_like, shape (..., N), optional
        Added last (a transformer's skip connection).
    n_threads : int, optional
        Default ``fastattn.get_num_threads()``. The result does not depend on it.
    out : ndarray, shape (..., N), optional
        C-contiguous, the compute dtype; may be the residual array itself.
    quantize : {None, 'int8', 'bfloat16'}, optional
        Compute with the weight (and x) in reduced precision, as ``PackedLinear(...,
        quantize=...)`` does; float32 only.

    Returns
    -------
    ndarray, shape (..., N)

    Examples
    --------
    >>> import numpy as np, fastattn._ops as ops
    >>> x = np.ones((2, 3), np.float32); w = np.full((4, 3), 0.5, np.float32)
    >>> ops.linear(x, w, activation="relu")[0]
    array([1.5, 1.5, 1.5, 1.5], dtype=float32)
    """
    if check_quantize(quantize) is not None:
        return PackedLinear(weight, bias, activation, quantize)(x, residual, n_threads, out=out)
    x = as_array(x, "x")
    weight = as_array(weight, "weight")
    bias = None if bias is None else as_array(bias, "bias")
    residual = None if residual is None else as_array(residual, "residual")
    dtype = _common_dtype([("x", x), ("weight", weight), ("bias", bias), ("residual", residual)])
    act = _activation_code(activation)
    _check_weight(weight, bias)
    packed = _Packed(kernel_ready(weight, dtype))
    if bias is not None:
        bias = _vector(bias, dtype)
    return _linear_packed(x, packed, bias, act, residual, n_threads, out)


class PackedLinear:
    """A linear layer whose weight is packed once: ``act(x @ weight.T + bias) + residual``.

    Assigning ``.weight`` (a new array, or the same one after editing it in place) repacks;
    editing the array in place alone is not seen. ``.bias`` can be reassigned too.

    Parameters
    ----------
    weight : array_like, shape (N, K), float32 or float64 (integers become float64), or an
        ``Int8Weight`` / ``Bf16Weight`` (a weight quantized already)
    bias : array_like, shape (N,), optional
    activation : {None, 'relu', 'gelu', 'gelu_tanh', 'silu'}, optional
    quantize : {None, 'int8', 'bfloat16'}, optional
        'int8': the weight is quantized to int8 with one scale per output channel, each row of
        x to 8 bits over its own range at every call (a scale and a zero point), the products
        summed exactly in int32 and the result dequantized in float32 before the bias,
        activation and residual. 'bfloat16': the weight is rounded to bfloat16 (half the
        bytes), each row of x too at every call, the products (exact) accumulated in float32 in
        a fixed order (docs/bfloat16.md). Float32 only.
        Either way the result is the same bits on every CPU, for any thread count and batch.

    Examples
    --------
    >>> import numpy as np, fastattn._ops as ops
    >>> layer = ops.PackedLinear(np.eye(3, dtype=np.float32), activation="relu")
    >>> layer(np.array([[-1.0, 2.0, 3.0]], np.float32))
    array([[0., 2., 3.]], dtype=float32)
    """

    def __init__(self, weight, bias=None, activation=None, quantize=None):
        self._act = _activation_code(activation)
        self._activation = activation
        given = _QUANTIZED.get(type(weight))
        self._quantize = given[0] if given else check_quantize(quantize)
        self._bias = None
        if isinstance(weight, _Packed) and self._quantize is None:
            self._packed = weight       # a model's parameter, packed already (maybe no array)
        else:
            self._packed = None
            self.weight = weight
        self.bias = bias

    @property
    def weight(self):
        """The (N, K) weight as packed (the array given, or its conversion)."""
        return self._packed.weight

    @weight.setter
    def weight(self, value):
        if self._quantize:
            self._set_quantized_weight(value)
            return
        w = as_array(value, "weight")
        dtype = _common_dtype([("weight", w)])
        if w.ndim != 2:
            raise ValueError(f"weight must be 2-D (out_features N, in_features K), got shape "
                             f"{w.shape}")
        if self._bias is not None:
            if self._bias.dtype != dtype:
                raise TypeError(f"weight has dtype {w.dtype} but bias has dtype "
                                f"{self._bias.dtype}; set a bias of the new dtype first or "
                                f"convert the weight")
            if self._bias.shape != (w.shape[0],):
                raise ValueError(f"weight.shape={w.shape} does not match the bias's "
                                 f"{self._bias.shape}; set bias=None first to change N")
        self._packed = _Packed(kernel_ready(w, dtype))

    def _set_quantized_weight(self, value):
        kind = weight_kind(self._quantize)
        if isinstance(value, kind):
            q = value
        else:
            if isinstance(value, tuple(_QUANTIZED)):
                raise TypeError(f"a {self._quantize} layer's weight cannot be a "
                                f"{type(value).__name__}")
            w = as_array(value, "weight")
            if w.dtype.kind == "f" and w.dtype != np.float32:
                raise ValueError(f"quantize={self._quantize!r} computes in float32: weight has "
                                 f"dtype {w.dtype}, convert it first")
            q = kind.from_float(w)
        if self._bias is not None and self._bias.shape != (q.N,):
            raise ValueError(f"weight.shape={q.shape} does not match the bias's "
                             f"{self._bias.shape}; set bias=None first to change N")
        self._packed = _QUANTIZED[kind][1](q)

    @property
    def quantize(self):
        """'int8' or 'bfloat16' for a quantized layer, else None."""
        return self._quantize

    @property
    def int8_weight(self):
        """The Int8Weight of an int8 layer (None for any other)."""
        return self._packed.q if self._quantize == "int8" else None

    @property
    def bf16_weight(self):
        """The Bf16Weight of a bfloat16 layer (None for any other)."""
        return self._packed.q if self._quantize == "bfloat16" else None

    @property
    def bias(self):
        return self._bias

    @bias.setter
    def bias(self, value):
        if value is None:
            self._bias = None
            return
        b = as_array(value, "bias")
        if self._quantize:
            if b.dtype.kind == "f" and b.dtype != np.float32:
                raise TypeError(f"bias has dtype {b.dtype}; a {self._quantize} layer computes "
                                f"in float32")
            if b.shape != (self._packed.N,):
                raise ValueError(f"bias must have shape (N,) = ({self._packed.N},), got "
                                 f"bias.shape={b.shape}")
            self._bias = _vector(b, np.dtype(np.float32))
            return
        pk = self._packed
        if b.dtype.kind == "f":
            _common_dtype([("weight", np.empty((0, 0), pk.dtype)), ("bias", b)])
        if b.shape != (pk.N,):
            raise ValueError(f"bias must have shape (N,) = ({pk.N},) to match "
                             f"weight.shape={(pk.N, pk.K)}, got bias.shape={b.shape}")
        self._bias = _vector(b, pk.dtype)

    @property
    def activation(self):
        return self._activation

    @property
    def in_features(self):
        return self._packed.K

    @property
    def out_features(self):
        return self._packed.N

    @property
    def dtype(self):
        return self._packed.dtype

    def _kernel_ready(self, x, residual):
        """Whether x and residual go to the kernel as they are: what the models pass on every
        call (a decode step makes dozens), with nothing to convert or check beyond the tests
        here (the general path costs ~30 us a call, a third of an M = 8 decode-step GEMM)."""
        pk = self._packed
        return (type(x) is np.ndarray and x.ndim == 2 and x.dtype == pk.dtype
                and x.shape[0] > 0 and x.shape[1] == pk.K > 0 and pk.N > 0
                and x.flags.c_contiguous and x.flags.aligned
                and (residual is None
                     or (type(residual) is np.ndarray and residual.dtype == pk.dtype
                         and residual.shape == (x.shape[0], pk.N)
                         and residual.flags.c_contiguous and residual.flags.aligned)))

    def _then_layer_norm(self, x, residual, gamma, beta, eps, n_threads=None):
        """``layer_norm(self(x, residual), gamma, beta, eps)``, the post-norm of a transformer
        block, with the LayerNorm done inside the GEMM as each block of rows is finished (the
        same bits as the two calls). gamma and beta: the models' own (N,) arrays."""
        pk = self._packed
        if (self._kernel_ready(x, residual)
                and all(a is None or (type(a) is np.ndarray and a.dtype == pk.dtype
                                      and a.shape == (pk.N,) and a.flags.c_contiguous
                                      and a.flags.aligned) for a in (gamma, beta))):
            y = _new_output((x.shape[0], pk.N), pk.dtype)
            pk.gemm(x, self._bias, self._act, residual, y, _effective_n_threads(n_threads),
                    (gamma, beta, check_eps(eps)))
            return y
        if self._quantize:
            # the int8 / bfloat16 layers' LayerNorm is their own (the same bits on every CPU):
            # convert the operands and take the fused path
            def ready(a, shape, name):
                a = as_array(a, name)
                if a.dtype.kind == "f" and a.dtype != np.float32:
                    raise TypeError(f"{name} has dtype {a.dtype}; a {self._quantize} layer "
                                    f"computes in float32")
                a = np.ascontiguousarray(a, dtype=np.float32)
                if shape is not None and a.shape != shape:
                    raise ValueError(f"{name} must have shape {shape}, got {a.shape}")
                return a
            x2 = ready(x, None, "x")
            if x2.ndim != 2 or x2.shape[1] != pk.K or x2.shape[0] == 0:
                raise ValueError(f"x must have shape (M, {pk.K}) with M >= 1, got {x2.shape}")
            return self._then_layer_norm(
                x2, None if residual is None else ready(residual, (x2.shape[0], pk.N),
                                                        "residual"),
                None if gamma is None else ready(gamma, (pk.N,), "gamma"),
                None if beta is None else ready(beta, (pk.N,), "beta"), eps, n_threads)
        return layer_norm(self(x, residual, n_threads), gamma, beta, eps, n_threads=n_threads)

    def __call__(self, x, residual=None, n_threads=None, *, out=None):
        """``act(x @ weight.T + bias) + residual`` for x (..., K) -> (..., N)."""
        pk = self._packed
        if self._kernel_ready(x, residual):
            # and a caller's own output array that needs nothing done to it
            if out is None:
                y = _new_output((x.shape[0], pk.N), pk.dtype)
            elif (type(out) is np.ndarray and out.dtype == pk.dtype
                    and out.shape == (x.shape[0], pk.N) and out.flags.c_contiguous
                    and out.flags.aligned and out.flags.writeable
                    and not np.may_share_memory(out, x)
                    and not any(np.may_share_memory(out, b) for b in pk.buffers())
                    and (self._bias is None or not np.may_share_memory(out, self._bias))
                    and (residual is None or not np.may_share_memory(out, residual))):
                y = out
            else:
                y = None                        # the general path checks and explains
            if y is not None:
                pk.gemm(x, self._bias, self._act, residual, y, _effective_n_threads(n_threads))
                return y
        x = as_array(x, "x")
        residual = None if residual is None else as_array(residual, "residual")
        if self._quantize:
            _common_dtype([("x", x), ("residual", residual)])
            if x.dtype == np.float64 or (residual is not None and residual.dtype == np.float64):
                raise TypeError(f"a {self._quantize} layer computes in float32: x and residual "
                                f"must be float32 (convert them first)")
        else:
            _common_dtype([("weight", np.empty((0, 0), self._packed.dtype)), ("x", x),
                           ("residual", residual)])
        return _linear_packed(x, self._packed, self._bias, self._act, residual, n_threads, out)

    def __repr__(self):
        return (f"PackedLinear(in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self._bias is not None}, activation={self._activation!r}, "
                f"dtype={self.dtype}" + (f", quantize={self._quantize!r})" if self._quantize
                                         else ")"))


def _elementwise(x, act, n_threads, name="x"):
    x = as_array(x, name)
    dtype = _common_dtype([(name, x)])
    nthr = _effective_n_threads(n_threads)
    src = np.ascontiguousarray(kernel_ready(x, dtype))
    y = np.empty(x.shape, dtype=dtype)
    if y.size:
        _g.activation(src.reshape(-1), y.reshape(-1), act, nthr)
    return y


def gelu(x, approximate="none", *, n_threads=None):
    """GELU, x Phi(x): exact through erf (``approximate='none'``) or torch's tanh form
    (``approximate='tanh'``). Float32 uses a vectorised erf (<= 2 ulp); float64 libm's erfc."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return _elementwise(x, _g.ACTIVATIONS["gelu" if approximate == "none" else "gelu_tanh"],
                        n_threads)


def silu(x, *, n_threads=None):
    """SiLU (swish), x / (1 + exp(-x))."""
    return _elementwise(x, _g.ACTIVATIONS["silu"], n_threads)


def relu(x, *, n_threads=None):
    """ReLU, max(x, 0), NaN kept."""
    return _elementwise(x, _g.ACTIVATIONS["relu"], n_threads)


def _layer_norm_rows(x, g, b, eps, n_threads=None):
    """LayerNorm over the last axis of x (N, D) -> a new array: the models' call (a decode step
    makes dozens). Their own arrays go straight to the kernel; anything else through the checked
    :func:`layer_norm` (the same kernel, the same bits)."""
    if (type(x) is np.ndarray and x.ndim == 2 and x.size and x.flags.c_contiguous
            and x.flags.aligned and g is not None and b is not None
            and x.dtype == g.dtype == b.dtype and g.shape == b.shape == (x.shape[1],)
            and g.flags.c_contiguous and b.flags.c_contiguous):
        y = np.empty_like(x)
        _g.layer_norm(x, None, g, b, float(eps), y, _effective_n_threads(n_threads))
        return y
    return layer_norm(x, g, b, eps, n_threads=n_threads)


def layer_norm(x, weight=None, bias=None, eps=1e-5, residual=None, *, n_threads=None):
    """``LayerNorm(x + residual) * weight + bias`` over the last axis (torch's biased variance).

    x (..., C); weight, bias (C,) or None (1 and 0); residual x's shape or None. Mean and
    variance are accumulated in float64 for both dtypes.
    """
    x = as_array(x, "x")
    weight = None if weight is None else as_array(weight, "weight")
    bias = None if bias is None else as_array(bias, "bias")
    residual = None if residual is None else as_array(residual, "residual")
    dtype = _common_dtype([("x", x), ("weight", weight), ("bias", bias), ("residual", residual)])
    if x.ndim < 1:
        raise ValueError(f"x must have at least 1 dimension (..., C), got shape {x.shape}")
    C = x.shape[-1]
    for name, a in (("weight", weight), ("bias", bias)):
        if a is not None and a.shape != (C,):
            raise ValueError(f"{name} must have shape (C,) = ({C},) to match x.shape={x.shape}, "
                             f"got {name}.shape={a.shape}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual must have x's shape {x.shape}, got residual.shape="
                         f"{residual.shape}")
    eps = check_eps(eps)
    nthr = _effective_n_threads(n_threads)
    y = np.empty(x.shape, dtype=dtype)
    if y.size == 0:
        return y
    rows = y.size // C
    x2 = np.ascontiguousarray(kernel_ready(x, dtype)).reshape(rows, C)
    r2 = None
    if residual is not None:
        r2 = np.ascontiguousarray(kernel_ready(residual, dtype)).reshape(rows, C)
    g = None if weight is None else _vector(weight, dtype)
    b = None if bias is None else _vector(bias, dtype)
    _g.layer_norm(x2, r2, g, b, eps, y.reshape(rows, C), nthr)
    return y
