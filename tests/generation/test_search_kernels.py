"""Beam search's C kernels (fastattn/_kernels/_search.pyx) against NumPy / SciPy references.

log_softmax_rows: against scipy.special.log_softmax in float64; the kernel's error is that of
rounding the result (and log s) to the dtype, plus a few ulp of its exp in the sum, so the
bound is 8 eps (1 + |ref|). topk_desc: exactly the indices of a full stable sort (np.lexsort)
by (NaN first, value descending, index ascending), and exactly the values there.
"""
import numpy as np
import pytest
from scipy.special import log_softmax as sp_log_softmax

from fastattn._kernels import _search, _simd
from fastattn.generation.search import _topk_desc
from fastattn.functional import log_softmax

DTYPES = [np.float32, np.float64]
THREADS = [1, 2, 3, 8]


def _eps(dtype):
    return float(np.finfo(dtype).eps)


def _ref_lsm(x):
    with np.errstate(invalid="ignore"):
        return sp_log_softmax(x.astype(np.float64), axis=1)


def _check_lsm(y, x):
    ref = _ref_lsm(x)
    fin = np.isfinite(ref)
    assert np.array_equal(np.isneginf(y), np.isneginf(ref))
    assert np.all(np.isfinite(y[fin]))
    err = np.abs(y[fin].astype(np.float64) - ref[fin])
    bound = 8 * _eps(x.dtype) * (1 + np.abs(ref[fin]))
    assert np.all(err <= bound), float((err / bound).max())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 2), (4, 7), (5, 8), (2, 9), (6, 17), (3, 33),
                                   (2, 1000), (4, 32000)])
def test_log_softmax_matches_scipy(rng, dtype, shape):
    # V around and off the vector widths (4 doubles, 8 floats, 16-element blocks)
    x = (rng.standard_normal(shape) * 6).astype(dtype)
    y = _search.log_softmax_rows(x)
    assert y.dtype == dtype and y.shape == shape
    _check_lsm(y, x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_log_softmax_large_spread(rng, dtype):
    # entries far below the maximum (exp underflows to 0) still get x - m - log s
    x = (rng.standard_normal((5, 300)) * 200).astype(dtype)
    _check_lsm(_search.log_softmax_rows(x), x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_log_softmax_neg_inf_entries(rng, dtype):
    x = rng.standard_normal((6, 131)).astype(dtype)
    x[rng.random(x.shape) < 0.4] = -np.inf
    x[:, 5] = 0.5                       # every row keeps a finite entry
    y = _search.log_softmax_rows(x)
    _check_lsm(y, x)
    assert np.array_equal(np.isneginf(y), np.isneginf(x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_log_softmax_special_rows(dtype):
    x = np.array([[-np.inf] * 9,
                  [1, np.inf, 2, 3, 4, 5, 6, 7, 8],
                  [1, np.nan, 2, 3, 4, 5, 6, 7, 8],
                  [-np.inf, np.nan, -np.inf, 0, 0, 0, 0, 0, 0],
                  [0, 0, 0, 0, 0, 0, 0, 0, 0]], dtype)
    y = _search.log_softmax_rows(x)
    assert np.all(np.isneginf(y[0]))            # every token forbidden: -inf, never NaN
    assert np.all(np.isnan(y[1]))               # +inf: inf - inf
    assert np.all(np.isnan(y[2])) and np.all(np.isnan(y[3]))
    np.testing.assert_allclose(y[4], -np.log(9), rtol=4 * _eps(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_log_softmax_threads_bitwise(rng, dtype):
    x = (rng.standard_normal((13, 4099)) * 4).astype(dtype)
    x[3, ::7] = -np.inf
    x[5] = -np.inf
    ys = [_search.log_softmax_rows(x, n_threads=t) for t in THREADS]
    for y in ys[1:]:
        assert np.array_equal(y.view(np.uint8), ys[0].view(np.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512"])
def test_row_kernel_builds_bitwise(rng, dtype, isa):
    # the AVX2 and AVX-512 builds run the same operations (nothing fused) on the same lanes as
    # the baseline one: log-softmax bit for bit, top-k the same indices and values; rows of
    # lengths around the 16-element blocks, -inf, NaN and a maximum of -0 among +0s. The kernel
    # set is the one ISA state of every kernel family (_simd); search has no scalar build and
    # runs its baseline one under it.
    before = _simd.isa()
    x = (rng.standard_normal((12, 1029)) * 5).astype(dtype)
    x[2, ::3] = -np.inf
    x[3, 7] = np.nan
    x[4] = -np.abs(x[4])
    x[4, 5], x[4, 900] = -0.0, 0.0
    x[5, :] = -np.inf
    x[6, 17] = np.inf
    add = np.array([[0.5, -1.0]] * 4, dtype)
    try:
        if _simd.set_isa(isa) != isa:
            pytest.skip(f"this CPU has no {isa}")
        got = {}
        for name in (isa, "baseline"):
            assert _simd.set_isa(name) == name
            for n in (1, 15, 16, 17, 31, 33, 1029):
                xs = np.ascontiguousarray(x[:, :n])
                y = _search.log_softmax_rows(xs)
                vals = np.empty((4, min(n, 9) if n > 1 else 1), dtype)
                idx = _search.topk_desc(xs[:8].reshape(4, 2 * n), vals.shape[1], add=add,
                                        out_val=vals)
                got.setdefault(n, []).append((y, idx, vals))
    finally:
        _simd.set_isa(before)
    for n, ((ya, ia, va), (yb, ib, vb)) in got.items():
        assert np.array_equal(ya.view(np.uint8), yb.view(np.uint8)), n
        assert np.array_equal(ia, ib), n
        assert np.array_equal(va.view(np.uint8), vb.view(np.uint8)), n
        if n == 1029:
            rows = [0, 1, 2, 4, 7]          # the others: NaN / -inf rows, checked elsewhere
            _check_lsm(yb[rows], x[rows])


@pytest.mark.parametrize("dtype", DTYPES)
def test_log_softmax_in_place_and_out(rng, dtype):
    x = rng.standard_normal((7, 70)).astype(dtype)
    want = _search.log_softmax_rows(x)
    out = np.full_like(x, 123)
    assert _search.log_softmax_rows(x, out) is out
    assert np.array_equal(out, want)
    xc = x.copy()
    assert _search.log_softmax_rows(xc, xc, n_threads=2) is xc
    assert np.array_equal(xc, want)
    # partial overlap (out is x shifted by one row): computed from a copy of x
    buf = np.concatenate([x, x[:1]])
    got = _search.log_softmax_rows(buf[:-1], buf[1:])
    assert np.array_equal(got, want)


def test_log_softmax_arguments(rng):
    x = rng.standard_normal((4, 10)).astype(np.float32)
    with pytest.raises(TypeError, match="x must be a float32 or float64"):
        _search.log_softmax_rows(np.arange(10).reshape(2, 5))
    with pytest.raises(ValueError, match="x must be 2-D"):
        _search.log_softmax_rows(x[0])
    with pytest.raises(TypeError, match="out must have dtype float32"):
        _search.log_softmax_rows(x, np.empty((4, 10), np.float64))
    with pytest.raises(ValueError, match="out must have shape"):
        _search.log_softmax_rows(x, np.empty((4, 11), np.float32))
    with pytest.raises(ValueError, match="out must be a writeable C-contiguous"):
        _search.log_softmax_rows(x, np.empty((10, 4), np.float32).T)
    with pytest.raises(ValueError, match="n_threads"):
        _search.log_softmax_rows(x, n_threads=0)
    # non-contiguous and byte-swapped x are converted
    big = rng.standard_normal((4, 20))
    want = _search.log_softmax_rows(np.ascontiguousarray(big[:, ::2]))
    assert np.array_equal(_search.log_softmax_rows(big[:, ::2]), want)
    assert np.array_equal(_search.log_softmax_rows(big.astype(">f8")), _search.log_softmax_rows(big))


def test_dense_log_softmax_wrapper(rng):
    x = rng.standard_normal((2, 3, 50)).astype(np.float32)
    y = log_softmax(x)
    assert y.shape == x.shape and y.dtype == np.float32
    assert np.array_equal(y.reshape(6, 50), _search.log_softmax_rows(x.reshape(6, 50)))
    assert log_softmax(x, out=x) is x and np.array_equal(x, y)
    ints = np.arange(12).reshape(3, 4)
    _check_lsm(log_softmax(ints), ints.astype(np.float64))
    assert log_softmax(np.zeros((2, 0, 3), np.float32)).shape == (2, 0, 3)
    out = np.empty((3, 4), np.float32)          # a dtype other than x's: filled by assignment
    assert log_softmax(ints, out=out) is out
    np.testing.assert_allclose(out, _ref_lsm(ints.astype(np.float64)), rtol=1e-6)


# ------------------------------------------------------------------------------------ top-k

def _ref_topk(x, k):
    """Full stable sort: NaN first, then value descending, then index ascending."""
    idx = np.arange(x.shape[1])
    out = np.empty((x.shape[0], k), np.int64)
    for r, row in enumerate(x):
        with np.errstate(invalid="ignore"):
            order = np.lexsort((idx, -row, ~np.isnan(row)))
        out[r] = order[:k]
    return out


def _old_topk(x, k):
    """The NumPy _topk_desc the kernel replaced (argpartition + lexsort)."""
    m = x.shape[1]
    if k < m:
        part = np.argpartition(x, m - k, axis=1)[:, m - k:]
    else:
        part = np.broadcast_to(np.arange(m), x.shape).copy()
    vals = np.take_along_axis(x, part, axis=1)
    out = np.empty_like(part)
    for r in range(x.shape[0]):
        out[r] = part[r][np.lexsort((part[r], -vals[r]))]
    return out


def _same(a, b):
    return np.array_equal(a, b, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 5, 16, 17, 100, 1000])
def test_topk_ties_neg_inf_nan(rng, dtype, m):
    x = rng.integers(-3, 4, size=(9, m)).astype(dtype)     # many ties
    x[rng.random(x.shape) < 0.15] = -np.inf
    x[rng.random(x.shape) < 0.05] = np.nan
    x[rng.random(x.shape) < 0.1] = -0.0
    x[0] = -np.inf
    x[1] = np.nan
    for k in sorted({1, min(2, m), min(3, m), m // 2, m - 1, m} - {0}):
        idx = _search.topk_desc(x, k)
        want = _ref_topk(x, k)
        assert idx.dtype == np.int64 and idx.shape == (9, k)
        assert np.array_equal(idx, want), (k, idx, want)
        assert np.array_equal(_topk_desc(x, k), want)
        vals = np.empty((9, k), dtype)
        _search.topk_desc(x, k, out_val=vals)
        assert _same(vals, np.take_along_axis(x, want, axis=1))


def test_topk_nan_ranks_first():
    x = np.array([[1, np.nan, 3, np.nan, 2, 0]], np.float32)
    assert _search.topk_desc(x, 3).tolist() == [[1, 3, 2]]
    assert _search.topk_desc(x, 6).tolist() == [[1, 3, 2, 4, 0, 5]]


@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_matches_old_numpy_without_ties(rng, dtype):
    # distinct values: the former argpartition + lexsort code is well defined, and agrees
    x = rng.permutation(8 * 3001).reshape(8, 3001).astype(dtype) / 7
    for k in (1, 8, 3001):
        assert np.array_equal(_search.topk_desc(x, k), _old_topk(x, k))


@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_fused_add(rng, dtype):
    # acc = lprobs.reshape(n, K, V) + run_score[:, :, None] in the dtype, never materialised
    n, K, V = 5, 4, 301
    lp = (rng.standard_normal((n * K, V)) * 3).astype(dtype)
    lp[rng.random(lp.shape) < 0.1] = -np.inf
    lp[:, 7] = lp[:, 11]                               # ties inside a beam
    run = (rng.standard_normal((n, K)) * 2).astype(dtype)
    run[:, 1:] = dtype(-1.0e9)                         # first step: beams 1.. masked
    run[2] = run[2, 0]                                 # ties across beams
    acc = (lp.reshape(n, K, V) + run[:, :, None]).reshape(n, K * V)
    for k in (1, 2 * K, K * V):
        vals = np.empty((n, k), dtype)
        idx = _search.topk_desc(lp.reshape(n, K * V), k, add=run, out_val=vals)
        want = _ref_topk(acc, k)
        assert np.array_equal(idx, want)
        assert _same(vals, np.take_along_axis(acc, want, axis=1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_threads_bitwise(rng, dtype):
    x = rng.integers(-50, 50, size=(11, 40000)).astype(dtype)
    add = rng.standard_normal((11, 4)).astype(dtype)
    res = [(_search.topk_desc(x, 8, n_threads=t), _search.topk_desc(x, 8, add=add, n_threads=t))
           for t in THREADS]
    for a, b in res[1:]:
        assert np.array_equal(a, res[0][0]) and np.array_equal(b, res[0][1])


def test_topk_arguments(rng):
    x = rng.standard_normal((3, 10)).astype(np.float32)
    with pytest.raises(ValueError, match=r"k must be in \[0, 10\]"):
        _search.topk_desc(x, 11)
    with pytest.raises(ValueError, match="k must be in"):
        _search.topk_desc(x, -1)
    with pytest.raises(TypeError, match="k must be an integer"):
        _search.topk_desc(x, 2.0)
    with pytest.raises(TypeError, match="k must be an integer"):
        _search.topk_desc(x, True)
    with pytest.raises(TypeError, match="x must be a float32 or float64"):
        _search.topk_desc(np.arange(10).reshape(2, 5), 1)
    with pytest.raises(ValueError, match="x must be 2-D"):
        _search.topk_desc(x[0], 1)
    with pytest.raises(TypeError, match="add must have x's dtype"):
        _search.topk_desc(x, 1, add=np.zeros((3, 2)))
    with pytest.raises(ValueError, match="add must have shape"):
        _search.topk_desc(x, 1, add=np.zeros((3, 3), np.float32))     # 3 does not divide 10
    with pytest.raises(TypeError, match="out_idx must have dtype int64"):
        _search.topk_desc(x, 2, np.empty((3, 2), np.int32))
    with pytest.raises(ValueError, match="out_val must have shape"):
        _search.topk_desc(x, 2, out_val=np.empty((3, 3), np.float32))
    assert _search.topk_desc(x, 0).shape == (3, 0)
    # non-contiguous x is converted: the same answer as its contiguous copy
    big = rng.integers(0, 5, size=(3, 40)).astype(np.float64)
    assert np.array_equal(_search.topk_desc(big[:, ::2], 7),
                          _search.topk_desc(np.ascontiguousarray(big[:, ::2]), 7))
    assert np.array_equal(_search.topk_desc(big[:, ::2], 7), _ref_topk(big[:, ::2], 7))
    out = np.empty((3, 4), np.int64)
    assert _search.topk_desc(x, 4, out) is out
    assert np.array_equal(out, _ref_topk(x, 4))
