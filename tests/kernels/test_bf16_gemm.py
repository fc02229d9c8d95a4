"""The bfloat16 linear layer (PackedLinear(quantize='bfloat16'), fastattn._kernels._qgemm's
gemm_bf16).

The sums are checked against two references written here in NumPy from the bfloat16-rounded
operands: float64 (within the bound of float32 accumulation), and an emulation of the documented
arithmetic (docs/bfloat16.md: the exact products added one at a time, odd element of each pair
first, each sum rounded to float32 with vdpbf16ps's flush to zero), equal to the bit. Every
variant the CPU can run (forced with set_bf16_variant) and every kernel set gives the same bits,
for any thread count and whatever else is in the batch, including sums at the flush threshold
(2^-126); the float epilogue is checked against float64 on the sums.
"""
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy.special import erf

import fastattn
import fastattn._ops as ops
from fastattn._kernels import _qgemm, _simd
from fastattn._quant import Bf16Weight, from_bfloat16, to_bfloat16

VARIANTS = _qgemm.bf16_cpu_variants()
SHAPES = [(1, 1, 1), (1, 3, 1), (5, 37, 100), (8, 64, 300), (12, 129, 64), (97, 200, 130),
          (200, 96, 520), (1, 1, 17), (50, 601, 70), (7, 2, 65)]
TINY = 2.0 ** -126


@pytest.fixture(autouse=True)
def _restore():
    yield
    _qgemm.set_bf16_variant(None)
    _simd.set_isa(_simd.cpu_isa())
    fastattn.set_num_threads(None)


def bf16(a):
    """a's values rounded to bfloat16, as float32 (the NumPy definition's)."""
    return from_bfloat16(to_bfloat16(a))


def emulate(x, w):
    """The documented sums of bf16(x) (M, K) by bf16(w) (N, K), float32: per element, from +0,
    for each pair (2i, 2i + 1) of k (K padded with a zero), acc = F(acc + x[2i+1] w[2i+1]) then
    acc = F(acc + x[2i] w[2i]); the product exact (float64 holds it), F the float32 rounding
    with a flush to zero below 2^-126 after rounding to 24 bits."""
    xb, wb = bf16(x).astype(np.float64), bf16(w).astype(np.float64)
    if xb.shape[1] % 2:
        xb, wb = np.pad(xb, ((0, 0), (0, 1))), np.pad(wb, ((0, 0), (0, 1)))
    acc = np.zeros((x.shape[0], w.shape[0]), np.float32)

    def step(acc, k):
        s = acc.astype(np.float64) + xb[:, k, None] * wb[None, :, k]   # rounded once: exact
        with np.errstate(over="ignore"):                               # to 53 bits, then 24
            r = s.astype(np.float32)
        small = np.abs(s) < TINY
        r[small] = np.where(np.abs(s[small]) >= TINY - 2.0 ** -151,
                            np.copysign(TINY, s[small]), np.copysign(0.0, s[small]))
        return r

    for i in range(0, xb.shape[1], 2):
        acc = step(step(acc, i + 1), i)
    return acc


def data(M, K, N, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    return x, w, rng


def bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("variant", list(_qgemm.BF16_VARIANTS))
@pytest.mark.parametrize("M,K,N", SHAPES)
def test_equals_the_documented_arithmetic_and_float64(variant, M, K, N):
    """Every variant, by name: one this CPU (as capped) cannot run is skipped saying so (the
    avx512-bf16 variant's vdpbf16ps needs AVX-512 BF16: Zen 4 / 5, Cooper Lake, Sapphire
    Rapids and later)."""
    if variant not in VARIANTS:
        pytest.skip(f"this CPU has no {variant}")            # (ci/expected_skips.txt)
    x, w, _ = data(M, K, N)
    lin = ops.PackedLinear(w, quantize="bfloat16")
    _qgemm.set_bf16_variant(variant)
    y = lin(x)
    np.testing.assert_array_equal(bits(y), bits(emulate(x, w)))
    # float64 on the rounded operands: the float32 accumulation's error only (2K roundings)
    xb, wb = bf16(x).astype(np.float64), bf16(w).astype(np.float64)
    exact = xb @ wb.T
    bound = 2 * K * 2.0 ** -24 * (np.abs(xb) @ np.abs(wb).T) + 2 * K * TINY
    assert (np.abs(y - exact) <= bound).all()


def test_rounding_to_bfloat16():
    """Nearest even (ties to the even neighbour), subnormals to a zero of their sign, NaN quiet,
    beyond the largest to inf; the kernels' row rounding gives the same values (an identity
    weight passes each rounded x through: the sums of one exact product and zeros)."""
    f = np.float32
    x = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8 + 2 ** -20), 2 ** -127, -2 ** -130,
                  3.3895314e38, 0.1, -0.0, 65504.0, 1.0, 3.3e38, -3.4e38, np.inf], f)
    want = np.array([1.0, 1 + 2 ** -6, -(1 + 2 ** -7), 0.0, -0.0, 3.3895314e38, 0.10009765625,
                     -0.0, 65536.0, 1.0, 1.9375 * 2.0 ** 127, -np.inf, np.inf], f)
    got = bf16(x)
    np.testing.assert_array_equal(bits(got), bits(want))
    nan = to_bfloat16(np.array([np.float32(np.nan), -np.float32(np.nan)]).astype(f))
    assert np.isnan(from_bfloat16(nan)).all() and (nan & 0x0040).all()
    fin = x[:-2]                        # (inf times the identity's zeros would be NaN)
    for v in VARIANTS:
        _qgemm.set_bf16_variant(v)
        eye = ops.PackedLinear(np.eye(fin.size, dtype=f), quantize="bfloat16")
        y = eye(fin[None])[0]
        np.testing.assert_array_equal(y, want[:-2], err_msg=v)   # (+0 and -0 compare equal)


@pytest.mark.parametrize("act", [None, "relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("with_res", [False, True])
def test_epilogue_against_float64(act, with_res):
    x, w, rng = data(33, 71, 90, seed=1)
    b = rng.standard_normal(90).astype(np.float32)
    res = rng.standard_normal((33, 90)).astype(np.float32) if with_res else None
    y = ops.PackedLinear(w, b, act, quantize="bfloat16")(x, res)
    z = emulate(x, w).astype(np.float64) + b
    if act == "relu":
        z = np.maximum(z, 0)
    elif act == "gelu":
        z = 0.5 * z * (1 + erf(z / np.sqrt(2)))
    elif act == "gelu_tanh":
        z = 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))
    elif act == "silu":
        z = z / (1 + np.exp(-z))
    if with_res:
        z = z + res
    np.testing.assert_allclose(y, z, rtol=2e-6, atol=2e-6)


def test_fused_layer_norm_against_float64():
    x, w, rng = data(20, 63, 48, seed=2)
    b, g, beta = (rng.standard_normal(48).astype(np.float32) for _ in range(3))
    res = rng.standard_normal((20, 48)).astype(np.float32)
    lin = ops.PackedLinear(w, b, quantize="bfloat16")
    y = lin._then_layer_norm(x, res, g, beta, 1e-5)
    s = (emulate(x, w) + b + res).astype(np.float64)
    z = (s - s.mean(1, keepdims=True)) / np.sqrt(s.var(1, keepdims=True) + 1e-5) * g + beta
    np.testing.assert_allclose(y, z, rtol=2e-5, atol=2e-5)


def _every_epilogue(x, lin, res, g, beta):
    return [lin(x), lin(x, res), lin._then_layer_norm(x, res, g, beta, 1e-5),
            lin._then_layer_norm(x, None, None, None, 1e-12)]


@pytest.mark.parametrize("N", [300, 512])
@pytest.mark.parametrize("act", [None, "relu", "gelu", "gelu_tanh", "silu"])
def test_same_bits_on_every_variant_and_kernel_set(act, N):
    """Every variant gives the scalar variant's bits (sums, epilogue, LayerNorm): N = 300
    takes the tails, 512 whole blocks; x scaled so that the GELU's erf tail and SiLU's exp
    saturation are reached."""
    x, w, rng = data(131, 201, N, seed=3)
    x *= 4.0
    x[5] = 0.0
    b, g, beta = (rng.standard_normal(N).astype(np.float32) for _ in range(3))
    res = rng.standard_normal((131, N)).astype(np.float32)
    lin = ops.PackedLinear(w, b, act, quantize="bfloat16")
    _qgemm.set_bf16_variant("scalar")
    want = _every_epilogue(x, lin, res, g, beta)
    for v in VARIANTS:
        _qgemm.set_bf16_variant(v)
        for got, ref in zip(_every_epilogue(x, lin, res, g, beta), want):
            np.testing.assert_array_equal(bits(got), bits(ref), err_msg=v)
    _qgemm.set_bf16_variant(None)
    for isa in ("scalar", "baseline", "avx2", "avx2-wide", "avx512"):
        if _simd.set_isa(isa) != isa:
            continue
        assert _qgemm.bf16_variant() in VARIANTS
        for got, ref in zip(_every_epilogue(x, lin, res, g, beta), want):
            np.testing.assert_array_equal(bits(got), bits(ref), err_msg=isa)


@pytest.mark.parametrize("K", [2, 3, 40])
def test_flush_to_zero_at_the_threshold_on_every_variant(K):
    """Operands near 2^-63 make products and sums around 2^-126, where vdpbf16ps flushes
    (after rounding to 24 bits): every variant equals the emulation, and sums are flushed. The
    first row and columns make the cases that tell a flush after rounding to 24 bits from one
    after rounding to float32's subnormals: 2^-126 - 2^-151 rounds up to 2^-126 (a tie, to the
    even neighbour) and stays; 2^-126 - 2^-150 and 2^-126 - 0.75 * 2^-150 stay below and are
    flushed (a subnormal float32 would round both to 2^-126)."""
    rng = np.random.default_rng(K)
    x = (rng.uniform(1, 2, (64, K)) * rng.choice([-1, 1], (64, K)) * 2.0 ** -63).astype(np.float32)
    w = (rng.uniform(1, 2, (96, K)) * rng.choice([-1, 1], (96, K)) * 2.0 ** -63).astype(np.float32)
    x[0] = 0.0
    x[0, :2] = [2.0 ** -75, 2.0 ** -63]
    w[:3] = 0.0
    w[:3, :2] = [[-2.0 ** -76, 2.0 ** -63], [-2.0 ** -75, 2.0 ** -63],
                 [-1.5 * 2.0 ** -76, 2.0 ** -63]]
    want = emulate(x, w)
    np.testing.assert_array_equal(want[0, :3], [TINY, 0.0, 0.0])
    exact = bf16(x).astype(np.float64) @ bf16(w).astype(np.float64).T
    assert ((want == 0) & (exact != 0)).sum() > 10
    for v in VARIANTS:
        _qgemm.set_bf16_variant(v)
        lin = ops.PackedLinear(w, quantize="bfloat16")
        np.testing.assert_array_equal(bits(lin(x)), bits(want), err_msg=v)


def test_variant_follows_the_kernel_set():
    _simd.set_isa("scalar")
    assert _qgemm.bf16_variant() == "scalar"
    if _simd.set_isa("baseline") == "baseline":
        assert _qgemm.bf16_variant() == "scalar"
    if "avx2" in VARIANTS and _simd.set_isa("avx2") == "avx2":
        assert _qgemm.bf16_variant() == "avx2"
    if "avx512" in VARIANTS and _simd.set_isa("avx512") == "avx512":
        assert _qgemm.bf16_variant() == ("avx512-bf16" if "avx512-bf16" in VARIANTS
                                         else "avx512")


def test_cpu_variants_read_the_capped_features():
    f = set(_simd.cpu_features(capped=True))
    avx2, avx512 = {"avx2", "fma"} <= f, {"avx2", "fma", "avx512f", "avx512bw"} <= f
    want = ["scalar"] + ["avx2"] * avx2 + ["avx512"] * avx512 + \
        ["avx512-bf16"] * (avx512 and "avx512_bf16" in f)
    assert VARIANTS == want


@pytest.mark.parametrize("M", [1, 8, 96, 97, 300])
def test_same_bits_for_any_thread_count(M):
    x, w, rng = data(M, 97, 700, seed=4)
    b, g, beta = (rng.standard_normal(700).astype(np.float32) for _ in range(3))
    lin = ops.PackedLinear(w, b, "gelu", quantize="bfloat16")
    want = None
    for n in (1, 2, 3, 8):
        got = [lin(x, n_threads=n), lin._then_layer_norm(x, None, g, beta, 1e-5, n_threads=n)]
        if want is None:
            want = got
        for a, r in zip(got, want):
            np.testing.assert_array_equal(bits(a), bits(r), err_msg=f"{n} threads")


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_row_alone_equals_the_row_in_any_batch(variant):
    x, w, rng = data(150, 64, 200, seed=5)
    lin = ops.PackedLinear(w, rng.standard_normal(200).astype(np.float32), "relu",
                           quantize="bfloat16")
    _qgemm.set_bf16_variant(variant)
    full = lin(x)
    for i in (0, 7, 96, 149):
        np.testing.assert_array_equal(bits(lin(x[i:i + 1])), bits(full[i:i + 1]))
    np.testing.assert_array_equal(bits(lin(x[90:110])), bits(full[90:110]))
    np.testing.assert_array_equal(bits(lin(np.concatenate([x[3:4], x[140:150]]))),
                                  bits(np.concatenate([full[3:4], full[140:150]])))


def test_non_finite_inputs_stay_in_their_rows():
    x, w, _ = data(4, 32, 20, seed=6)
    x[1, 3] = np.nan
    x[2, 0] = np.inf
    x[3] = 0.0
    b = np.arange(20, dtype=np.float32)
    for v in VARIANTS:
        _qgemm.set_bf16_variant(v)
        y = ops.PackedLinear(w, b, quantize="bfloat16")(x)
        assert np.isnan(y[1]).all() and (~np.isfinite(y[2])).all()
        assert np.isfinite(y[0]).all()
        np.testing.assert_array_equal(y[3], b)          # a zero row: the bias alone


def test_weight_rounding_and_layout():
    _, w, _ = data(1, 51, 70, seed=7)
    w[3, 5] = 2.0 ** -130                               # a subnormal: zero
    q = Bf16Weight.from_float(w)
    assert q.panels.dtype == np.uint16 and q.panels.size == 128 * 52
    np.testing.assert_array_equal(q.bfloat16(), to_bfloat16(w))
    assert q.dequantize()[3, 5] == 0.0
    normal = np.abs(w) >= TINY                          # within half a unit of 8 bits
    assert (np.abs(q.dequantize() - w)[normal] <= np.abs(w)[normal] * 2.0 ** -8).all()
    assert q.nbytes * 2 >= w.nbytes and q.shape == (70, 51) and q.dtype == np.float32
    # the documented layout: panel p, k-pair, column j, k % 2
    kp = 52
    for n, k in ((0, 0), (17, 50), (69, 1), (33, 27)):
        assert q.panels[n // 16 * kp * 16 + k // 2 * 32 + n % 16 * 2 + k % 2] == \
            to_bfloat16(w[n, k])
    full = q.panels.reshape(8, 26, 16, 2).transpose(0, 2, 1, 3).reshape(128, 52)
    assert not full[70:].any() and not full[:, 51].any()          # the padding is zero


def test_rows_view_equals_copy():
    _, w, _ = data(1, 41, 300, seed=8)
    q = Bf16Weight.from_float(w)
    x = np.random.default_rng(0).standard_normal((3, 41)).astype(np.float32)
    whole = ops.PackedLinear(q)(x)
    for a, b in ((0, 100), (64, 192), (128, 300), (16, 40), (3, 70)):
        r = q.rows(a, b)
        np.testing.assert_array_equal(r.bfloat16(), q.bfloat16()[a:b])
        np.testing.assert_array_equal(bits(ops.PackedLinear(r)(x)), bits(whole[:, a:b]))


def test_bad_arguments():
    w = np.ones((4, 8), np.float32)
    with pytest.raises(ValueError, match="quantize"):
        ops.PackedLinear(w, quantize="bf16")
    with pytest.raises(ValueError, match="float32"):
        ops.PackedLinear(w.astype(np.float64), quantize="bfloat16")
    with pytest.raises(ValueError, match="bfloat16's range"):
        ops.PackedLinear(np.full((2, 2), 3.4e38, np.float32), quantize="bfloat16")
    with pytest.raises(ValueError, match="2-D"):
        Bf16Weight.from_float(np.ones(4, np.float32))
    with pytest.raises(TypeError, match="real"):
        Bf16Weight.from_float(np.ones((2, 2), complex))
    lin = ops.PackedLinear(w, quantize="bfloat16")
    assert lin.quantize == "bfloat16" and lin.int8_weight is None
    assert isinstance(lin.bf16_weight, Bf16Weight)
    with pytest.raises(TypeError, match="float32"):
        lin(np.ones((2, 8)))
    with pytest.raises(TypeError, match="float32"):
        lin.bias = np.ones(4)
    with pytest.raises(ValueError, match="in_features"):
        lin(np.ones((2, 7), np.float32))
    with pytest.raises(TypeError, match="Int8Weight"):
        lin.weight = ops.PackedLinear(w, quantize="int8").int8_weight
    with pytest.raises(ValueError, match="variant"):
        _qgemm.set_bf16_variant("avx1024")
    with pytest.raises(ValueError, match="panels"):
        q = Bf16Weight.from_float(w)
        Bf16Weight.from_arrays(q.panels[:-1], 4, 8)
    with pytest.raises(ValueError, match="panels"):
        Bf16Weight.from_arrays(q.panels.view(np.int16), 4, 8)
    assert Bf16Weight.from_arrays(q.panels, 4, 8).shape == (4, 8)
    # integer inputs are converted; the result is float32
    assert lin(np.ones((1, 8), np.int64)).dtype == np.float32


def test_functional_linear_nd_input_and_out_argument():
    x, w, rng = data(6, 16, 10, seed=9)
    b = rng.standard_normal(10).astype(np.float32)
    lin = ops.PackedLinear(w, b, "silu", quantize="bfloat16")
    y = lin(x.reshape(2, 3, 16))
    np.testing.assert_array_equal(y.reshape(6, 10), lin(x))
    np.testing.assert_array_equal(fastattn.linear(x, w, b, "silu", quantize="bfloat16"), lin(x))
    out = np.empty((6, 10), np.float32)
    assert lin(x, out=out) is out
    np.testing.assert_array_equal(out, lin(x))
    # K = 0: the bias alone
    empty = ops.PackedLinear(np.zeros((5, 0), np.float32), np.arange(5, dtype=np.float32),
                             quantize="bfloat16")
    np.testing.assert_array_equal(empty(np.zeros((3, 0), np.float32)),
                                  np.tile(np.arange(5, dtype=np.float32), (3, 1)))


_FRESH = r"""
import numpy as np, sys
import fastattn._ops as ops
from fastattn._kernels import _qgemm
v = sys.argv[1]
_qgemm.set_bf16_variant(v)
rng = np.random.default_rng(0)
M, K, N = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
x = rng.standard_normal((M, K)).astype(np.float32)
w = rng.standard_normal((N, K)).astype(np.float32)
y = ops.PackedLinear(w, rng.standard_normal(N).astype(np.float32), "gelu", quantize="bfloat16")(x)
print(y.view(np.uint32).astype(np.uint64).sum(), float(np.float64(y.astype(np.float64).sum())).hex())
"""


@pytest.mark.parametrize("M,K,N", [(1, 5, 3), (97, 131, 70)])
def test_first_call_in_a_fresh_process(M, K, N):
    """The first bfloat16 call of a process (its workspace's first allocation) on every
    variant: the same bits as in this process."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    want = ops.PackedLinear(w, rng.standard_normal(N).astype(np.float32), "gelu",
                            quantize="bfloat16")(x)
    line = f"{bits(want).astype(np.uint64).sum()} {float(want.astype(np.float64).sum()).hex()}"
    for v in VARIANTS:
        out = subprocess.run([sys.executable, "-c", _FRESH, v, str(M), str(K), str(N)],
                             capture_output=True, text=True, env=dict(os.environ), timeout=120,
                             cwd=os.path.dirname(__file__))   # (not a checkout's source folder)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == line, v


_SANITIZED = r"""
import numpy as np
from fastattn._quant import Bf16Weight
q = Bf16Weight.from_float(np.ones((70, 33), np.float32))
print(q.panels.nbytes, q.panels.base.nbytes)
"""


def test_panels_exact_size_under_the_sanitizer_else_aligned():
    """ci/sanitize.sh sets FASTATTN_SANITIZED: the panels are then allocated at their exact size
    (ASan's redzone right after the last value), else they start on a 64-byte boundary."""
    env = dict(os.environ, FASTATTN_SANITIZED="1")
    out = subprocess.run([sys.executable, "-c", _SANITIZED], capture_output=True, text=True,
                         env=env, timeout=120, cwd=os.path.dirname(__file__))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(128 * 34 * 2)] * 2
    if not os.environ.get("FASTATTN_SANITIZED"):
        q = Bf16Weight.from_float(np.ones((70, 33), np.float32))
        assert q.panels.ctypes.data % 64 == 0 and q.panels.nbytes == 128 * 34 * 2
