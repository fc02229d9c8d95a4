"""Reduced-precision weights: int8 (per-output-channel quantisation) and bfloat16, each in the
packed layout of its GEMM.

int8: a weight W (N, K) becomes ``Wq = round(W / s)`` in [-127, 127] with one scale per row,
``s[n] = max_k |W[n, k]| / 127`` (symmetric, no zero point), packed into 16-column panels of k-quads
(``fastattn/_kernels/qgemm_kernels.h``). bfloat16: each value rounded to nearest even
(:func:`to_bfloat16`), packed into 16-column panels of k-pairs (``bgemm_kernels.h``). The layouts
do not depend on the CPU: a packed weight made on one machine runs on any other. Everything here
is NumPy and gives the same bytes on every machine.
"""
import os

import numpy as np

from ._kernels import _qgemm as _qg
from ._threads import _effective_n_threads

__all__ = ["Int8Weight", "Int8Rows", "Bf16Weight", "QUANTIZE_MODES", "check_quantize",
           "to_bfloat16", "from_bfloat16", "weight_kind"]

QUANTIZE_MODES = (None, "int8", "bfloat16")
_PANEL = _qg.PANEL            # columns per panel
_GROUP = _qg.NGROUP           # N is padded to a multiple of this
MAX_K = _qg.MAX_K


def check_quantize(quantize, dtype=None, name="quantize"):
    """quantize itself (None, 'int8' or 'bfloat16'); ValueError for anything else, or for a
    mode with a dtype other than float32 (the int8 and bfloat16 layers compute in float32)."""
    if quantize is not None and not isinstance(quantize, str):
        raise TypeError(f"{name} must be None, 'int8' or 'bfloat16', got "
                        f"{type(quantize).__name__} {quantize!r}")
    if quantize not in QUANTIZE_MODES:
        raise ValueError(f"{name} must be None, 'int8' or 'bfloat16', got {quantize!r}")
    if quantize is not None and dtype is not None and np.dtype(dtype) != np.float32:
        raise ValueError(f"{name}={quantize!r} computes in float32: it cannot be combined with "
                         f"dtype={np.dtype(dtype).name}")
    return quantize


def weight_kind(quantize):
    """The class a linear weight of this mode is held as (Int8Weight, Bf16Weight)."""
    return {"int8": Int8Weight, "bfloat16": Bf16Weight}[quantize]


def _ceil(a, b):
    return -(-a // b) * b


def _aligned_bytes(n):
    """n bytes (int8) starting on a 64-byte boundary (exactly sized, and not aligned, under
    the sanitizer: ci/sanitize.sh sets FASTATTN_SANITIZED, as for the float packed weights)."""
    if os.environ.get("FASTATTN_SANITIZED"):
        return np.empty(n, np.int8)
    raw = np.empty(n + 64, np.int8)
    off = -raw.ctypes.data % 64
    return raw[off:off + n]


class Int8Weight:
    """A weight (N, K) quantised to int8 per output channel and packed for the int8 GEMM.

    ``panels`` (Npad * Kp,) int8, ``scale`` (Npad,) float32, ``comp`` (Npad,) int32 (each row's
    sum: the activations' zero point times it is added back), N and K. Build with
    :meth:`from_float`, or from saved arrays with :meth:`from_arrays`.
    """

    __slots__ = ("panels", "scale", "comp", "N", "K")

    def __init__(self, panels, scale, comp, N, K):
        self.panels, self.scale, self.comp, self.N, self.K = panels, scale, comp, N, K

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_float(cls, weight, name="weight"):
        """Quantise a float (N, K) weight: one scale per row, round half to even."""
        w = np.asarray(weight)
        if w.ndim != 2:
            raise ValueError(f"{name} must be 2-D (out_features N, in_features K), got shape "
                             f"{w.shape}")
        if w.dtype.kind not in "fiu":
            raise TypeError(f"{name} must be a real array, got dtype {w.dtype}")
        N, K = w.shape
        if K > MAX_K:
            raise ValueError(f"{name} has in_features K={K}; int8 layers take K <= {MAX_K} (the "
                             f"int32 sums could overflow beyond)")
        npad, kp = _ceil(max(N, 1), _GROUP), _ceil(K, 4)
        panels = _aligned_bytes(npad * kp)
        panels[:] = 0
        comp = np.zeros(npad, np.int32)
        sc = np.zeros(npad, np.float32)
        if N and K:
            sc[:N] = _quantize_into(w, name, panels=panels, comp=comp)
        return cls(panels, sc, comp, N, K)

    @classmethod
    def from_rows(cls, rows, name="weight"):
        """The Int8Weight of an Int8Rows table (a tied output projection: the same numbers)."""
        if rows.q.shape[1] > MAX_K:
            raise ValueError(f"{name} has in_features K={rows.q.shape[1]}; int8 layers take "
                             f"K <= {MAX_K} (the int32 sums could overflow beyond)")
        return cls.from_int8(rows.q, rows.scale)

    @classmethod
    def from_int8(cls, q, scale):
        """Pack int8 rows q (N, K) with their scales (N,), a block of rows at a time."""
        N, K = q.shape
        npad, kp = _ceil(max(N, 1), _GROUP), _ceil(K, 4)
        panels = _aligned_bytes(npad * kp)
        tiles = panels.reshape(npad // _PANEL, kp // 4, _PANEL, 4)
        step = _row_block(kp, _GROUP)
        for a in range(0, npad, step):
            b = min(npad, a + step)
            block = np.zeros((b - a, kp), np.int8)
            if a < N:
                block[:min(N, b) - a, :K] = q[a:min(N, b)]
            tiles[a // _PANEL:b // _PANEL] = block.reshape(
                (b - a) // _PANEL, _PANEL, kp // 4, 4).transpose(0, 2, 1, 3)
        sc = np.zeros(npad, np.float32)
        sc[:N] = scale
        comp = np.zeros(npad, np.int32)
        comp[:N] = q.sum(axis=1, dtype=np.int32)
        return cls(panels, sc, comp, N, K)

    @classmethod
    def from_arrays(cls, panels, scale, comp, N, K, name="weight"):
        """Rebuild from saved arrays (a pre-quantized folder), checking their sizes."""
        N, K = int(N), int(K)
        npad, kp = _ceil(max(N, 1), _GROUP), _ceil(K, 4)
        for what, arr, size, dt in (("panels", panels, npad * kp, np.int8),
                                    ("scale", scale, npad, np.float32),
                                    ("comp", comp, npad, np.int32)):
            if arr.dtype != dt or arr.ndim != 1 or arr.size != size:
                raise ValueError(f"{name}: {what} must be a 1-D {np.dtype(dt).name} array of "
                                 f"{size} elements for an int8 weight of shape ({N}, {K}), got "
                                 f"{arr.dtype} {arr.shape}")
        if K > MAX_K:
            raise ValueError(f"{name}: in_features K={K} exceeds {MAX_K}")
        return cls(panels, scale, comp, N, K)

    # -- views --------------------------------------------------------------------------------
    @property
    def shape(self):
        return (self.N, self.K)

    @property
    def dtype(self):
        """The dtype the layer computes in (float32)."""
        return np.dtype(np.float32)

    @property
    def nbytes(self):
        return self.panels.nbytes + self.scale.nbytes + self.comp.nbytes

    def int8(self):
        """The quantised rows (N, K) int8, unpacked."""
        kp = _ceil(self.K, 4)
        npad = self.scale.size
        full = self.panels.reshape(npad // _PANEL, kp // 4, _PANEL, 4).transpose(0, 2, 1, 3)
        return np.ascontiguousarray(full.reshape(npad, kp)[:self.N, :self.K])

    def dequantize(self):
        """The weight the layer computes with, (N, K) float32: int8 rows times their scales."""
        return self.int8().astype(np.float32) * self.scale[:self.N, None]

    def rows(self, a, b):
        """Rows [a, b) as an Int8Weight: a view of the panels when a is a multiple of 16 and the
        kernel's reads (whole 64-column groups from a) stay inside these panels, else a copy."""
        if (a, b) == (0, self.N):
            return self
        n = b - a
        kp = _ceil(self.K, 4)
        if a % _PANEL == 0 and a + _ceil(max(n, 1), _GROUP) <= self.scale.size:
            p0 = a // _PANEL * kp * _PANEL
            npad = _ceil(max(n, 1), _GROUP)
            # the view's padding columns are the next rows' (computed by the kernel, dropped)
            return Int8Weight(self.panels[p0:p0 + npad * kp], self.scale[a:a + npad],
                              self.comp[a:a + npad], n, self.K)
        return Int8Weight.from_int8(self.int8()[a:b], self.scale[a:b])

    def __repr__(self):
        return f"Int8Weight(shape=({self.N}, {self.K}))"


def _row_block(row_len, multiple):
    """Rows handled at a time by the block loops here: ~4 MiB of float64 work, a multiple of
    `multiple` rows (the temporaries stay small whatever the table: a 256k-token vocabulary
    quantizes in the memory of its int8 result)."""
    return max(multiple, (1 << 19) // max(row_len, 1) // multiple * multiple)


def _quantize_rows_reference(w, name):
    """int8 rows and their scales, in NumPy (the definition; the loader's C version,
    _qgemm.quantize_rows, gives the same bytes: tests/kernels/test_int8_gemm.py)."""
    w = np.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {w.shape}")
    N, K = w.shape
    q = np.empty((N, K), np.int8)
    scale = np.zeros(N, np.float32)
    if K == 0:
        return q, scale
    step = _row_block(K, 1)
    for a in range(0, N, step):
        b = min(N, a + step)
        wb = w[a:b].astype(np.float32, copy=False)
        if not np.isfinite(wb).all():
            raise ValueError(f"{name} holds inf or NaN: it cannot be quantized to int8")
        sc = (np.abs(wb).max(axis=1) / np.float32(127)).astype(np.float32)
        safe = np.where(sc > 0, sc, np.float32(1)).astype(np.float64)
        q[a:b] = np.clip(np.rint(wb.astype(np.float64) / safe[:, None]), -127, 127)
        scale[a:b] = sc
    return q, scale


def _quantize_into(w, name, q=None, panels=None, comp=None):
    """_qgemm.quantize_rows on w (N, K) (converted to float32 a block of rows at a time when
    it is not already C-contiguous float32): returns the scales (N,)."""
    N, K = w.shape
    scale = np.zeros(N, np.float32)
    nthr = _effective_n_threads(None)
    ready = w.dtype == np.float32 and w.flags.c_contiguous
    step = N if ready else _row_block(K, _GROUP)
    for a in range(0, N, max(step, 1)):
        b = min(N, a + step)
        wb = w[a:b] if ready else np.ascontiguousarray(w[a:b], dtype=np.float32)
        bad = _qg.quantize_rows(
            wb, None if q is None else q[a:b], scale[a:b],
            None if panels is None else panels[a * _ceil(K, 4):], None if comp is None else comp[a:b],
            nthr)
        if bad:
            raise ValueError(f"{name} holds inf or NaN: it cannot be quantized to int8")
    return scale


def _quantize_rows(w, name):
    """int8 rows and their scales (the per-output-channel scheme of Int8Weight.from_float)."""
    w = np.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {w.shape}")
    if w.dtype.kind not in "fiu":
        raise TypeError(f"{name} must be a real array, got dtype {w.dtype}")
    q = np.empty(w.shape, np.int8)
    return q, _quantize_into(w, name, q=q)


class Int8Rows:
    """An embedding table (V, d) as int8 rows with one float32 scale per row (row-major: a
    lookup gathers whole rows). The same numbers as Int8Weight.from_float of the table: a tied
    output projection and its embedding dequantize to the same values."""

    __slots__ = ("q", "scale")

    def __init__(self, q, scale):
        self.q, self.scale = q, scale

    @classmethod
    def from_float(cls, table, name="weight"):
        return cls(*_quantize_rows(table, name))

    @classmethod
    def from_arrays(cls, q, scale, name="weight"):
        if q.dtype != np.int8 or q.ndim != 2 or scale.dtype != np.float32 or \
                scale.shape != (q.shape[0],):
            raise ValueError(f"{name}: int8 rows must be an int8 (V, d) array with a float32 (V,) "
                             f"scale, got {q.dtype} {q.shape} and {scale.dtype} {scale.shape}")
        return cls(q, scale)

    @property
    def shape(self):
        return self.q.shape

    @property
    def dtype(self):
        return np.dtype(np.float32)

    @property
    def nbytes(self):
        return self.q.nbytes + self.scale.nbytes

    def take(self, ids):
        """Rows `ids` (1-D intp) dequantized: (n, d) float32, each row on its own."""
        return self.q[ids].astype(np.float32) * self.scale[ids, None]

    def dequantize(self):
        return self.q.astype(np.float32) * self.scale[:, None]

    def __repr__(self):
        return f"Int8Rows(shape={self.shape})"


# ---------------------------------------------------------------- bfloat16

_BF16_CHUNK = 1 << 20         # values converted at a time (bounded temporaries)


def to_bfloat16(a):
    """float32 values -> bfloat16 bit patterns (uint16, a's shape): rounded to nearest even,
    zeros and subnormals to a zero of their sign (the GEMM reads subnormal inputs as zero), NaN
    to a quiet NaN of its sign, values beyond bfloat16's largest to inf. The integer arithmetic
    of the kernels' row rounding (bgemm_kernels.c: bg_round_row), bit for bit."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    out = np.empty(u.shape, np.uint16)
    flat, dst = u.reshape(-1), out.reshape(-1)
    for i in range(0, flat.size, _BF16_CHUNK):
        v = flat[i:i + _BF16_CHUNK]
        mag = v & np.uint32(0x7FFFFFFF)
        r = (v + np.uint32(0x7FFF) + ((v >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
        r = np.where(mag < np.uint32(0x00800000), (v >> np.uint32(16)) & np.uint32(0x8000), r)
        r = np.where(mag > np.uint32(0x7F800000), (v >> np.uint32(16)) | np.uint32(0x0040), r)
        dst[i:i + _BF16_CHUNK] = r
    return out


def from_bfloat16(bits):
    """bfloat16 bit patterns (uint16) -> their float32 values (exact)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


class Bf16Weight:
    """A weight (N, K) rounded to bfloat16 and packed for the bfloat16 GEMM.

    ``panels`` (Npad * Kp,) uint16 (bfloat16 bit patterns: Npad = N rounded up to 64, Kp = K
    rounded up to 2), N and K. Build with :meth:`from_float`, or from arrays with
    :meth:`from_arrays`.
    """

    __slots__ = ("panels", "N", "K")

    def __init__(self, panels, N, K):
        self.panels, self.N, self.K = panels, N, K

    @classmethod
    def from_float(cls, weight, name="weight"):
        """Round a float (N, K) weight to bfloat16 (:func:`to_bfloat16`). ValueError where a
        finite value lies beyond bfloat16's range (it would become inf)."""
        w = np.asarray(weight)
        if w.ndim != 2:
            raise ValueError(f"{name} must be 2-D (out_features N, in_features K), got shape "
                             f"{w.shape}")
        if w.dtype.kind not in "fiu":
            raise TypeError(f"{name} must be a real array, got dtype {w.dtype}")
        N, K = w.shape
        npad, kp = _ceil(max(N, 1), _GROUP), _ceil(K, 2)
        panels = _aligned_bytes(2 * npad * kp).view(np.uint16)
        tiles = panels.reshape(npad // _PANEL, kp // 2, _PANEL, 2)
        step = _row_block(kp, _GROUP)
        for a in range(0, npad, step):
            b = min(npad, a + step)
            block = np.zeros((b - a, kp), np.uint16)
            if a < N:
                src = w[a:min(N, b)].astype(np.float32, copy=False)
                bits = to_bfloat16(src)
                inf = (bits & np.uint16(0x7FFF)) == np.uint16(0x7F80)
                if inf.any() and np.isfinite(src[inf]).any():
                    raise ValueError(f"{name} holds values beyond bfloat16's range "
                                     f"(|w| > 3.39e38): they would become inf")
                block[:min(N, b) - a, :K] = bits
            tiles[a // _PANEL:b // _PANEL] = block.reshape(
                (b - a) // _PANEL, _PANEL, kp // 2, 2).transpose(0, 2, 1, 3)
        return cls(panels, N, K)

    @classmethod
    def from_arrays(cls, panels, N, K, name="weight"):
        """Rebuild from the panels array, checking its size."""
        N, K = int(N), int(K)
        size = _ceil(max(N, 1), _GROUP) * _ceil(K, 2)
        if panels.dtype != np.uint16 or panels.ndim != 1 or panels.size != size:
            raise ValueError(f"{name}: panels must be a 1-D uint16 array of {size} elements for a "
                             f"bfloat16 weight of shape ({N}, {K}), got {panels.dtype} "
                             f"{panels.shape}")
        return cls(panels, N, K)

    @property
    def shape(self):
        return (self.N, self.K)

    @property
    def dtype(self):
        """The dtype the layer computes in (float32)."""
        return np.dtype(np.float32)

    @property
    def nbytes(self):
        return self.panels.nbytes

    def bfloat16(self):
        """The rounded weight (N, K) as bfloat16 bit patterns (uint16), unpacked."""
        kp = _ceil(self.K, 2)
        npad = self.panels.size // kp if kp else _ceil(max(self.N, 1), _GROUP)
        if not kp:
            return np.zeros((self.N, 0), np.uint16)
        full = self.panels.reshape(npad // _PANEL, kp // 2, _PANEL, 2).transpose(0, 2, 1, 3)
        return np.ascontiguousarray(full.reshape(npad, kp)[:self.N, :self.K])

    def dequantize(self):
        """The weight the layer computes with, (N, K) float32 (exact bfloat16 values)."""
        return from_bfloat16(self.bfloat16())

    def rows(self, a, b):
        """Rows [a, b) as a Bf16Weight: a view of the panels when a is a multiple of 16 and the
        kernel's reads (whole 64-column groups from a) stay inside these panels, else a copy."""
        if (a, b) == (0, self.N):
            return self
        n = b - a
        kp = _ceil(self.K, 2)
        npad = _ceil(max(n, 1), _GROUP)
        if a % _PANEL == 0 and kp and (a + npad) * kp <= self.panels.size:
            p0 = a // _PANEL * kp * _PANEL
            # the view's padding columns are the next rows' (computed by the kernel, dropped)
            return Bf16Weight(self.panels[p0:p0 + npad * kp], n, self.K)
        return Bf16Weight.from_float(self.dequantize()[a:b])

    def __repr__(self):
        return f"Bf16Weight(shape=({self.N}, {self.K}))"
