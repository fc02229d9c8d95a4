"""fastattn.softmax against scipy.special.softmax (axis=-1 and every other axis)."""
import numpy as np
import pytest
from scipy.special import softmax as sp_softmax

import fastattn
from fastattn._kernels import _attention as _k
from tolerances import ATOL, RTOL


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, axis", [((7,), -1), ((3, 1), -1), ((4, 33), -1), ((4, 33), 0),
                                         ((2, 3, 100), 1), ((2, 3, 100), -3), ((5, 1000), -1)])
def test_matches_scipy(rng, dtype, shape, axis):
    x = (rng.standard_normal(shape) * 5).astype(dtype)
    y = fastattn.softmax(x, axis=axis)
    assert y.dtype == dtype and y.shape == x.shape
    np.testing.assert_allclose(y, sp_softmax(x.astype(np.float64), axis=axis),
                               rtol=RTOL[dtype] * 4, atol=ATOL[dtype])


def test_special_rows_match_scipy():
    x = np.array([[-np.inf, -np.inf, -np.inf],     # all -inf: NaN in scipy, NaN here
                  [0.0, -np.inf, 1.0],              # -inf entries get weight 0
                  [np.nan, 0.0, 1.0],               # NaN poisons the row
                  [np.inf, 0.0, 1.0],               # +inf: inf - inf = NaN, as in scipy
                  [1e30, -1e30, 0.0],
                  [-1e4, -1e4 - 1, -1e4 - 2]])
    with np.errstate(invalid="ignore"):
        expected = sp_softmax(x, axis=-1)
    np.testing.assert_allclose(fastattn.softmax(x), expected, rtol=1e-13, atol=1e-300, equal_nan=True)
    np.testing.assert_allclose(fastattn.softmax(x.astype(np.float32)), expected.astype(np.float32),
                               rtol=2e-6, atol=1e-30, equal_nan=True)


@pytest.mark.parametrize("dtype, x", [(np.float32, [0, -87, -88, -103]),
                                      (np.float64, [0, -700, -709, -745])])
def test_results_below_the_smallest_normal_are_zero(dtype, x):
    # documented in the README: where scipy returns a subnormal, the kernel's exp returns 0
    x = np.array(x, dtype)
    ours, ref = fastattn.softmax(x), sp_softmax(x)
    tiny = np.finfo(dtype).tiny
    normal = ref >= tiny
    np.testing.assert_allclose(ours[normal], ref[normal], rtol=4 * np.finfo(dtype).eps)
    assert (ref[~normal] > 0).all() and (ours[~normal] == 0).all()


def test_shift_invariance_and_sum(rng):
    x = rng.standard_normal((10, 50))
    y = fastattn.softmax(x)
    np.testing.assert_allclose(fastattn.softmax(x + 1234.5), y, rtol=1e-9)
    np.testing.assert_allclose(y.sum(-1), 1, rtol=1e-14)


def test_dtypes_and_empty():
    assert fastattn.softmax(np.array([1, 2, 3])).dtype == np.float64
    assert fastattn.softmax(np.array([1, 2], np.float16)).dtype == np.float32
    assert fastattn.softmax([1.0, 2.0]).dtype == np.float64
    assert fastattn.softmax(np.zeros((3, 0))).shape == (3, 0)
    assert fastattn.softmax(np.zeros((0, 4))).shape == (0, 4)
    np.testing.assert_allclose(fastattn.softmax([[1.0, 2.0], [3.0, 3.0]], axis=0),
                               sp_softmax([[1.0, 2.0], [3.0, 3.0]], axis=0))


@pytest.mark.parametrize("dtype, ulps", [(np.float32, 2), (np.float64, 2)])
def test_kernel_exp_accuracy(dtype, ulps, isa):
    """The vectorised exp of every micro-kernel set is within `ulps` units in the last place of
    exp (longdouble reference) over the range the softmax uses, and exact at the ends:
    exp(0) = 1, exp(-inf) = 0, NaN stays NaN. (The baseline set has no FMA and takes the
    Cody-Waite path, so both argument reductions are measured.)"""
    lo = -87.0 if dtype == np.float32 else -708.0
    x = np.concatenate([np.linspace(lo, 0, 200_001),
                        -np.geomspace(1e-30, 80, 10_001)]).astype(dtype)
    y = np.empty_like(x)
    _k.kernel_exp(x, y)
    ref = np.exp(x.astype(np.longdouble))
    ulp = np.spacing(ref.astype(dtype)).astype(np.longdouble)
    err = np.abs(y.astype(np.longdouble) - ref) / ulp
    assert err.max() <= ulps, float(err.max())
    special = np.array([0.0, -np.inf, np.nan, -1e6, -0.0], dtype)
    out = np.empty_like(special)
    _k.kernel_exp(special, out)
    assert out[0] == 1 and out[1] == 0 and np.isnan(out[2]) and out[3] == 0 and out[4] == 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unaligned_input(dtype):
    """A C-contiguous view at an odd byte offset (np.frombuffer) is copied to aligned memory
    before the kernel's vector loads (the sanitizer run checks the alignment; here the values)."""
    rng = np.random.default_rng(7)
    data = rng.standard_normal((5, 37)).astype(dtype)
    buf = bytearray(data.nbytes + 1)
    x = np.frombuffer(buf, dtype=dtype, offset=1, count=data.size).reshape(data.shape)
    assert not x.flags.aligned and x.flags.c_contiguous
    x[...] = data
    np.testing.assert_allclose(fastattn.softmax(x), sp_softmax(data, axis=-1),
                               rtol=1e-6 if dtype == np.float32 else 1e-13, atol=1e-7)
