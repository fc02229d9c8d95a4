"""Hostile inputs: NaN / inf in every argument (masked and unmasked), values near the float
limits, denormals, all-False masks, masks holding NaN, wrong dtypes / ranks / shapes, objects
that are not arrays, absurd thread counts and scales. Each gets the documented result (the
float64 reference's, which follows PyTorch: NaN in an allowed score or value propagates to its
row; a masked-out key never reaches the output; a row with no allowed key is zeros) or a clear
ValueError / TypeError.

The last test is a fuzz harness: thousands of random hostile calls in child processes
(FASTATTN_FUZZ_CASES, default 4000), failing if any child dies by a signal (or exits non-zero),
or if a call raises anything other than ValueError / TypeError / MemoryError.
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fastattn
from reference import sdpa_ref

f = fastattn.scaled_dot_product_attention
DTYPES = [np.float32, np.float64]
# child interpreters run from here: `python -c` puts its working directory first on sys.path,
# and from a source checkout that would import the uncompiled fastattn/ folder
# the tests folder (child interpreters run there: see conftest.py)
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _data(dtype, L=70, S=300, E=8, Ev=5, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((L, E)).astype(dtype), rng.standard_normal((S, E)).astype(dtype),
            rng.standard_normal((S, Ev)).astype(dtype))


def _check(out, ref, dtype):
    """Same NaN / inf pattern as the reference, finite entries close."""
    out = np.asarray(out, dtype=np.float64)
    assert out.shape == ref.shape
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref), err_msg="NaN pattern differs")
    np.testing.assert_array_equal(np.isposinf(out), np.isposinf(ref), err_msg="+inf pattern differs")
    np.testing.assert_array_equal(np.isneginf(out), np.isneginf(ref), err_msg="-inf pattern differs")
    fin = np.isfinite(ref)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(out[fin], ref[fin], rtol=tol, atol=tol)


# ---------------------------------------------------------------- NaN / inf, unmasked



@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("val", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("where", ["query", "key", "value", "mask"])
def test_nonfinite_unmasked_propagates_like_reference(where, val, dtype):
    """One non-finite entry (in the second key tile, in a query row of the second block)."""
    q, k, v = _data(dtype)
    mask = None
    if where == "query":
        q[66, 3] = val
    elif where == "key":
        k[260, 2] = val
    elif where == "value":
        v[260, 1] = val
    else:
        mask = np.zeros((70, 300), dtype)
        mask[66, 260] = val
    out, w = f(q, k, v, mask, return_weights=True)
    ref, ref_w = sdpa_ref(q, k, v, mask)
    _check(out, ref, dtype)
    _check(w, ref_w, dtype)


@pytest.mark.parametrize("case", ["query_row_nan", "key_column_nan", "mask_row_nan", "single_key_nan"])
def test_all_scores_nan_gives_nan_not_zeros(case):
    """Regression: the row max once skipped NaN, so a row whose every score was NaN came out as
    zeros (as if fully masked) instead of NaN."""
    q, k, v = _data(np.float64, L=3, S=5, E=4, Ev=2)
    mask = None
    if case == "query_row_nan":
        q[1, 0] = np.nan
    elif case == "key_column_nan":
        k[:, 0] = np.nan
    elif case == "mask_row_nan":
        mask = np.zeros((3, 5))
        mask[1] = np.nan
    else:
        k, v = k[:1].copy(), v[:1].copy()
        k[0, 0] = np.nan
    out = f(q, k, v, mask)
    ref, _ = sdpa_ref(q, k, v, mask)
    _check(out, ref, np.float64)


# ---------------------------------------------------------------- NaN / inf, masked out

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("val", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("where", ["key", "value", "both"])
@pytest.mark.parametrize("how", ["bool", "float", "causal", "bool_broadcast"])
def test_masked_out_nonfinite_never_reaches_output(how, where, val, dtype):
    L, S = 70, 300
    q, k, v = _data(dtype, L=L, S=S)
    bad = [0, 63, 64, 65, 255, 256, 299]          # tile edges
    if how == "causal":
        bad = [j for j in bad if j >= L]           # above the diagonal for every query
    for j in bad:
        if where in ("key", "both"):
            k[j, j % k.shape[1]] = val
        if where in ("value", "both"):
            v[j, :] = val
    clean_k, clean_v = k.copy(), v.copy()
    clean_k[bad] = 0
    clean_v[bad] = 0
    kw = {}
    if how == "bool":
        mask = np.ones((L, S), bool)
        mask[:, bad] = False
    elif how == "bool_broadcast":
        mask = np.ones((1, S), bool)
        mask[:, bad] = False
    elif how == "float":
        mask = np.random.default_rng(1).standard_normal((L, S)).astype(dtype)
        mask[:, bad] = -np.inf
    else:
        mask = None
        kw["is_causal"] = True
    out, w = f(q, k, v, mask, return_weights=True, **kw)
    ref, ref_w = sdpa_ref(q, clean_k, clean_v, mask, **kw)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(w))
    assert np.all(w[:, bad] == 0)
    _check(out, ref, dtype)
    _check(w, ref_w, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_nonfinite_query_in_a_fully_masked_row_gives_zeros(dtype):
    q, k, v = _data(dtype, L=5, S=7)
    q[2] = np.nan
    q[3] = np.inf
    mask = np.ones((5, 7), bool)
    mask[2:4] = False
    out, w = f(q, k, v, mask, return_weights=True)
    assert np.all(out[2:4] == 0) and np.all(w[2:4] == 0)
    ref, _ = sdpa_ref(q, k, v, mask)
    _check(out, ref, dtype)


# ---------------------------------------------------------------- near the float limits, denormals

@pytest.mark.parametrize("dtype", DTYPES)
def test_value_near_float_max_single_key(dtype):
    big = np.finfo(dtype).max * 0.9
    q, k, v = _data(dtype, L=3, S=1, E=4, Ev=2)
    v[:] = [big, -big]
    out = f(q, k, v)
    np.testing.assert_array_equal(out, np.tile(v, (3, 1)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_values_near_float_max_uniform_weights_stay_finite(dtype):
    big = np.finfo(dtype).max * 0.9
    q = np.zeros((2, 4), dtype)
    k = np.ones((3, 4), dtype)
    v = np.full((3, 2), big, dtype)
    out = f(q, k, v)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, big, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_huge_but_finite_scores_give_one_hot_weights(dtype):
    # scores ~ 1e37 (float32) / 1e307 (float64): finite, softmax is one-hot on the largest
    big = np.sqrt(np.finfo(dtype).max) * 0.3
    q = np.array([[big], [-big]], dtype)
    k = np.array([[1.0], [0.5], [-1.0]], dtype) * big
    v = np.arange(6, dtype=dtype).reshape(3, 2)
    out, w = f(q, k, v, scale=1.0, return_weights=True)
    np.testing.assert_array_equal(w, [[1, 0, 0], [0, 0, 1]])
    np.testing.assert_array_equal(out, [v[0], v[2]])


@pytest.mark.parametrize("dtype", DTYPES)
def test_overflowing_scores_are_nan_or_reference(dtype):
    """q.k beyond the float max: either the reference's answer or NaN (the score overflowed to
    inf in the compute dtype, as in PyTorch) -- never a crash, never a wrong finite number."""
    big = np.finfo(dtype).max ** 0.5 * 4
    q = np.full((2, 3), big, dtype)
    k = np.full((4, 3), big, dtype)
    v = np.arange(8, dtype=dtype).reshape(4, 2)
    out = f(q, k, v, scale=1.0)
    ref, _ = sdpa_ref(q, k, v, scale=1.0)
    fin = np.isfinite(out)
    assert np.all(np.isnan(out[~fin]))
    np.testing.assert_allclose(out[fin], ref[fin], rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_denormal_inputs(dtype):
    tiny = np.finfo(dtype).smallest_subnormal
    rng = np.random.default_rng(3)
    q = (rng.integers(-50, 50, (9, 4)) * tiny).astype(dtype)
    k = (rng.integers(-50, 50, (70, 4)) * tiny).astype(dtype)
    v = (rng.integers(-50, 50, (70, 3)) * tiny).astype(dtype)
    assert np.any(v != 0)
    for scale in (None, 1.0, 1e30 if dtype == np.float32 else 1e300):
        out, w = f(q, k, v, scale=scale, return_weights=True)
        ref, ref_w = sdpa_ref(q, k, v, scale=scale)
        np.testing.assert_allclose(w, ref_w, rtol=1e-4, atol=1e-6)
        # outputs are subnormal themselves: a few subnormal steps of rounding per key
        np.testing.assert_allclose(out, ref, rtol=0, atol=70 * float(tiny) * 8)


@pytest.mark.parametrize("dtype", DTYPES)
def test_denormal_scale_and_mask(dtype):
    tiny = np.finfo(dtype).smallest_subnormal
    q, k, v = _data(dtype, L=4, S=9)
    out = f(q, k, v, scale=float(tiny))
    np.testing.assert_allclose(out, np.tile(v.mean(0, dtype=np.float64), (4, 1)), rtol=1e-5, atol=1e-6)
    mask = np.full((4, 9), tiny, dtype)
    np.testing.assert_allclose(f(q, k, v, mask), sdpa_ref(q, k, v, mask)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_extreme_finite_scales(dtype):
    q, k, v = _data(dtype, L=4, S=9)
    for scale in (1e-300, -1e-30, 0.0, -0.0):
        out = f(q, k, v, scale=scale)
        np.testing.assert_allclose(out, np.tile(v.mean(0, dtype=np.float64), (4, 1)),
                                   rtol=1e-5, atol=1e-6)
    for scale in (1e4, -1e4):          # one-hot on the largest (smallest) score
        out = f(q, k, v, scale=scale)
        ref, _ = sdpa_ref(q, k, v, scale=scale)
        _check(out, ref, dtype)


def test_scale_beyond_float32_range():
    """A scale the compute dtype cannot hold is a clear ValueError (documented), not a NaN row;
    the same scale in float64 is applied as given."""
    q, k, v = _data(np.float32, L=4, S=9)
    q[0] = 0                           # q.k == 0 exactly: the scale must not matter
    with pytest.raises(ValueError, match=r"scale 1e\+300 is outside the range of the compute dtype float32"):
        f(q, k, v, scale=1e300)
    out = f(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), scale=1e300)
    np.testing.assert_allclose(out[0], v.mean(0), rtol=1e-6)


# ---------------------------------------------------------------- all-False masks, NaN masks

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["bool", "float_inf", "causal_plus_mask", "broadcast_bool"])
def test_all_false_masks_give_zeros(kind, dtype):
    q, k, v = _data(dtype, L=70, S=130)
    k[5] = np.nan                      # nothing masked may leak, not even NaN
    kw = {}
    if kind == "bool":
        mask = np.zeros((70, 130), bool)
    elif kind == "broadcast_bool":
        mask = np.zeros((1, 1), bool)
    elif kind == "float_inf":
        mask = np.full((70, 130), -np.inf, dtype)
    else:
        mask = np.triu(np.ones((70, 130), bool), k=1)    # only keys j > i: causal forbids all
        kw["is_causal"] = True
    out, w = f(q, k, v, mask, return_weights=True, **kw)
    assert out.dtype == dtype and out.shape == (70, 5)
    assert np.all(out == 0) and np.all(w == 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_mask_with_some_nan_entries(dtype):
    """A NaN added to an allowed score makes that row NaN (as in PyTorch); other rows are fine."""
    q, k, v = _data(dtype, L=6, S=9)
    mask = np.zeros((6, 9), dtype)
    mask[2, 4] = np.nan
    mask[3, :] = -np.inf
    mask[3, 1] = np.nan                # NaN in an otherwise fully masked row
    out = f(q, k, v, mask)
    ref, _ = sdpa_ref(q, k, v, mask)
    _check(out, ref, dtype)
    assert np.all(np.isnan(out[2])) and np.all(np.isnan(out[3]))
    assert np.all(np.isfinite(np.delete(out, [2, 3], axis=0)))


# ---------------------------------------------------------------- unaligned memory

SANITIZED = bool(os.environ.get("FASTATTN_SANITIZED"))


def _unaligned(a):
    buf = bytearray(a.nbytes + a.itemsize + 1)
    p = np.frombuffer(buf, dtype=a.dtype, count=a.size, offset=1).reshape(a.shape)
    p[...] = a
    assert not p.flags.aligned or a.itemsize == 1
    return p


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_ready_returns_aligned_arrays(dtype):
    from fastattn import _validation
    a = _unaligned(np.arange(12, dtype=dtype).reshape(3, 4))
    r = _validation.kernel_ready(a, np.dtype(dtype))
    assert r.flags.aligned and r.ctypes.data % np.dtype(dtype).itemsize == 0
    np.testing.assert_array_equal(r, a)


_UNALIGNED_CHILD = textwrap.dedent("""
    import numpy as np, fastattn
    f = fastattn.scaled_dot_product_attention
    def unaligned(a):
        buf = bytearray(a.nbytes + a.itemsize + 1)
        p = np.frombuffer(buf, dtype=a.dtype, count=a.size, offset=1).reshape(a.shape)
        p[...] = a
        return p
    rng = np.random.default_rng(0)
    for dt in (np.float32, np.float64):
        for L in (3, 70):                      # the direct (small L) and the packed paths
            q = rng.standard_normal((2, L, 16)).astype(dt)
            k = rng.standard_normal((2, 40, 16)).astype(dt)
            v = rng.standard_normal((2, 40, 64)).astype(dt)
            m = rng.standard_normal((L, 40)).astype(dt)
            ref = f(q, k, v, m, return_weights=True)
            for which in range(4):
                args = [q, k, v, m]
                args[which] = unaligned(args[which])
                got = f(*args, return_weights=True)
                assert all(np.array_equal(a, b) for a, b in zip(got, ref)), (dt, L, which)
    print("UNALIGNED-OK")
""")


def test_unaligned_inputs_in_a_child_process():
    """Non-aligned views (np.frombuffer(bytearray, offset=1)) give the aligned answer; run in a
    child so that a sanitizer abort does not take the test run down."""
    r = subprocess.run([sys.executable, "-c", _UNALIGNED_CHILD], capture_output=True, text=True,
                       timeout=300, cwd=HERE)
    assert r.returncode == 0 and "UNALIGNED-OK" in r.stdout, (r.returncode, r.stderr[-3000:])


# ---------------------------------------------------------------- wrong inputs: clear errors

q0, k0, v0 = _data(np.float32, L=4, S=5, E=3, Ev=2)


class _BadArray:
    def __array__(self, dtype=None, copy=None):
        raise RuntimeError("no array for you")


class _Weird:
    pass


BAD_ARRAYS = [
    (None, TypeError), ("abc", TypeError), (b"abc", TypeError), ({"a": 1}, TypeError),
    ({1, 2}, TypeError), (object(), TypeError), (_Weird(), TypeError), (_BadArray(), TypeError),
    ([[1.0, 2.0, 3.0], [4.0]], TypeError), ((x for x in range(3)), TypeError),
    (np.ones((4, 3), complex), TypeError), (np.ones((4, 3), np.complex64), TypeError),
    (np.array([["a"] * 3] * 4), TypeError), (np.ones((4, 3), "datetime64[s]"), TypeError),
    (np.ones((4, 3), "timedelta64[s]"), TypeError), (np.ones((4, 3), dtype="V8"), TypeError),
    (np.zeros((4, 3), dtype=[("a", "f4")]), TypeError),
    (np.ones((4, 3), object), TypeError),
    (np.float32(1.0), ValueError), (np.ones(3, np.float32), ValueError), (3.0, ValueError),
    (np.ones((4, 4), np.float32), ValueError),          # E mismatch (query) / S mismatch ...
]
if np.dtype(np.longdouble).itemsize > 8:
    BAD_ARRAYS.append((np.ones((4, 3), np.longdouble), TypeError))


@pytest.mark.parametrize("arg", ["query", "key", "value"])
@pytest.mark.parametrize("bad, err", BAD_ARRAYS, ids=lambda x: type(x).__name__ if not isinstance(x, np.ndarray) else f"{x.dtype}{x.shape}")
def test_bad_array_arguments_raise_clearly(arg, bad, err):
    args = {"query": q0, "key": k0, "value": v0}
    args[arg] = bad
    if arg == "value" and isinstance(bad, np.ndarray) and bad.shape == (4, 4):
        err = ValueError                      # S mismatch
    with pytest.raises(err) as info:
        f(args["query"], args["key"], args["value"])
    assert arg in str(info.value), f"the message should name {arg!r}: {info.value}"


@pytest.mark.parametrize("bad, err", [
    (np.ones((4, 5), np.int32), TypeError), (np.ones((4, 5), np.uint8), TypeError),
    (np.ones((4, 5), complex), TypeError), (np.array([["x"] * 5] * 4), TypeError),
    (np.ones((4, 5), object), TypeError), ("abc", TypeError), (_BadArray(), TypeError),
    (np.ones((4, 6), bool), ValueError), (np.ones((3, 5), bool), ValueError),
    (np.ones((2, 4, 5), bool), None),                           # adds a leading dim: fine
    (np.ones((5,), bool), None), (np.True_, None), (np.float32(0.0), None),
    (np.ones((7, 1, 4, 5), bool), None),
])
def test_bad_masks(bad, err):
    if err is None:
        out = f(q0, k0, v0, attn_mask=bad)
        ref, _ = sdpa_ref(q0, k0, v0, attn_mask=np.asarray(bad))
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
        return
    with pytest.raises(err, match="attn_mask"):
        f(q0, k0, v0, attn_mask=bad)


def test_32_leading_dims_work():
    out = f(np.ones((1,) * 32 + (4, 3), np.float32), k0, v0)
    assert out.shape == (1,) * 32 + (4, 2)
    np.testing.assert_allclose(out.reshape(4, 2), f(np.ones((4, 3), np.float32), k0, v0), rtol=1e-6)


@pytest.mark.parametrize("where", ["query", "attn_mask"])
def test_too_many_leading_dims_is_a_clear_error(where):
    big = (1,) * 33 + (4, 3)
    with pytest.raises(ValueError, match=where):
        if where == "query":
            f(np.ones(big, np.float32), k0, v0)
        else:
            f(q0, k0, v0, attn_mask=np.ones((1,) * 33 + (4, 5), bool))


def test_softmax_axis_past_the_limit_is_refused_before_any_copy():
    # a zero-stride view of 2**31 elements: refused at once (the check used to follow the
    # contiguous copy, an 8 GiB allocation)
    x = np.broadcast_to(np.float32(1), (2**31,))
    with pytest.raises(ValueError, match="softmax axis length 2147483648 exceeds"):
        fastattn.softmax(x)


def test_float64_mask_beyond_float32_range():
    # float32 inputs, a float64 mask: entries past float32's range give the float64 answer
    # (+1e300 used to become +inf in the cast, and +inf - +inf made the row NaN)
    rng = np.random.default_rng(5)
    q = rng.standard_normal((4, 8)).astype(np.float32)
    k = rng.standard_normal((6, 8)).astype(np.float32)
    v = rng.standard_normal((6, 3)).astype(np.float32)
    m = rng.standard_normal((4, 6))
    m[0, 1] = 1e300                  # one key gets all the weight
    m[1, 2] = -1e300                 # one key gets none
    m[2, :] = 1e300                  # every key equal: uniform weights
    m[3, 4] = -np.inf
    out = f(q, k, v, attn_mask=m)
    assert out.dtype == np.float32 and np.isfinite(out).all()
    ref = sdpa_ref(q, k, v, attn_mask=m)[0]
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out[0], v[1])


@pytest.mark.parametrize("which", ["S", "L", "E"])
@pytest.mark.parametrize("n", [2**31 - 1, 2**31 - 100, 2**31 - 2**20 + 1])
def test_sizes_near_the_32_bit_limit_are_a_clear_error(which, n):
    # zero-stride views of that length cost no memory; the key-block and split counts used to
    # overflow a 32-bit int there and the call returned its uninitialised output (L <= 16:
    # 3.6e15 for a mean of ones) instead of computing or refusing
    one = np.ones((1, 1), np.float32)
    q = np.broadcast_to(one, (n if which == "L" else 1, n if which == "E" else 1))
    k = np.broadcast_to(one, (n if which == "S" else 1, n if which == "E" else 1))
    v = np.broadcast_to(one, (n if which == "S" else 1, 1))
    with pytest.raises(ValueError, match=f"{which} = {n} is larger than the kernel's limit"):
        f(q, k, v)


@pytest.mark.parametrize("n, err", [(0, ValueError), (-1, ValueError), (-10**9, ValueError),
                                    (2.5, TypeError), (True, TypeError), (False, TypeError),
                                    ("2", TypeError), (np.float64(2.0), TypeError),
                                    ([2], TypeError), (2 + 0j, TypeError)])
def test_absurd_thread_counts_raise(n, err):
    with pytest.raises(err, match="n_threads"):
        f(q0, k0, v0, n_threads=n)
    with pytest.raises(err, match="n_threads"):
        fastattn.softmax(q0, n_threads=n)


@pytest.mark.parametrize("n", [10**9, 10**30, np.int64(3), np.uint8(8), 1])
def test_large_or_numpy_thread_counts_work(n):
    ref = f(q0, k0, v0, n_threads=1)
    assert np.array_equal(f(q0, k0, v0, n_threads=n), ref)
    assert np.array_equal(fastattn.softmax(q0, n_threads=n), fastattn.softmax(q0, n_threads=1))


def test_huge_thread_count_with_many_work_items_does_not_kill_the_process():
    """n_threads=10**9 with 50000 work items must not ask OpenMP for 50000 OS threads
    (libgomp then exits the process: 'Thread creation failed'). Run in a child."""
    code = textwrap.dedent("""
        import numpy as np, fastattn
        q = np.ones((50000, 1, 1), np.float32)
        out = fastattn.scaled_dot_product_attention(q, q, q, n_threads=10**9)
        assert out.shape == (50000, 1, 1) and np.all(out == 1)
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=HERE)
    assert r.returncode == 0 and "ok" in r.stdout, (r.returncode, r.stdout, r.stderr[-2000:])


@pytest.mark.parametrize("scale, err", [
    (float("nan"), ValueError), (float("inf"), ValueError), (float("-inf"), ValueError),
    (np.float32("nan"), ValueError), ("x", TypeError), ([1.0], TypeError), (1j, TypeError),
    (True, TypeError), (np.bool_(True), TypeError), (object(), TypeError),
    (np.array([0.5, 0.5]), TypeError),
])
def test_absurd_scales_raise(scale, err):
    with pytest.raises(err, match="scale"):
        f(q0, k0, v0, scale=scale)


@pytest.mark.parametrize("scale", [None, 0, 1, np.float32(0.5), np.float64(-2.0), np.int64(3),
                                   10**6])
def test_unusual_but_valid_scales(scale):
    out = f(q0, k0, v0, scale=scale)
    ref, _ = sdpa_ref(q0, k0, v0, scale=None if scale is None else float(scale))
    _check(out, ref, np.float32)


@pytest.mark.parametrize("name", ["is_causal", "enable_gqa", "return_weights"])
@pytest.mark.parametrize("bad", [1, 0, None, "True", np.array(True), [True]])
def test_non_bool_flags_raise(name, bad):
    with pytest.raises(TypeError, match=name):
        f(q0, k0, v0, **{name: bad})


@pytest.mark.parametrize("dt, expect", [(np.float16, np.float32), (np.bool_, np.float64),
                                        (np.int8, np.float64), (np.uint64, np.float64),
                                        (np.int64, np.float64), (">f4", np.float32),
                                        (">f8", np.float64)])
def test_documented_dtype_results(dt, expect):
    q = (q0 * 3).astype(dt)
    out = f(q, k0.astype(dt), v0.astype(dt))
    assert out.dtype == expect
    ref, _ = sdpa_ref(q, k0.astype(dt), v0.astype(dt))
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


def test_softmax_hostile():
    scipy_special = pytest.importorskip("scipy.special")
    x = np.array([[1.0, np.nan, 2.0], [-np.inf] * 3, [np.inf, 1.0, 2.0], [1e308, -1e308, 0.0],
                  [5e-324, 0.0, -5e-324]])
    with np.errstate(invalid="ignore", over="ignore"):
        ref = scipy_special.softmax(x, axis=-1)
    np.testing.assert_allclose(fastattn.softmax(x), ref, rtol=1e-12, atol=1e-300, equal_nan=True)
    for bad, err in [(None, TypeError), ("ab", TypeError), (np.ones(3, complex), TypeError),
                     (np.float64(1.0), ValueError)]:
        with pytest.raises(err):
            fastattn.softmax(bad)
    for axis, err in [(2, ValueError), (-3, ValueError), (1.0, TypeError), (True, TypeError),
                      (None, TypeError), ("0", TypeError)]:
        with pytest.raises(err, match="axis"):
            fastattn.softmax(np.zeros((2, 2)), axis=axis)


# ---------------------------------------------------------------- the fuzz harness

FUZZ_CHILD = r'''
import json, os, sys, traceback, warnings
import numpy as np
import fastattn
from fastattn._kernels import _simd

seed, count, progress_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rng = np.random.default_rng(seed)
isa = ["scalar", "baseline", "avx2", "avx512"][seed % 4]
_simd.set_isa(isa)                     # clamped to what the CPU supports
warnings.simplefilter("ignore")
np.seterr(all="ignore")
SIZES = [0, 1, 2, 3, 5, 7, 13, 31, 63, 64, 65, 127, 129, 255, 256, 257]
ESIZES = [0, 1, 2, 3, 7, 8, 16, 17, 63, 64, 65]
GOOD_DT = [np.float32, np.float64, np.float32, np.float64, np.float16, np.int8, np.bool_,
           ">f4", ">f8", np.uint16]
BAD_DT = [np.complex64, np.complex128, object, "U3", "datetime64[s]", np.longdouble]
LAYOUT_KINDS = ["C", "C", "F", "T", "sliced", "neg", "ro", "unaligned", "bcast"]
SPECIAL = [np.nan, np.inf, -np.inf, 3.0e38, -3.0e38, 1.0e308, -1.0e308, 1e-40, 5e-324, 0.0, -0.0]


def pick(seq):
    return seq[rng.integers(len(seq))]


def values(shape, dt, specials):
    x = rng.standard_normal(shape) * pick([0.01, 1.0, 10.0, 1e3])
    if specials and x.size:
        n = int(rng.integers(1, 4))
        for _ in range(n):
            x.flat[rng.integers(x.size)] = pick(SPECIAL)
    try:
        return x.astype(dt)
    except Exception:
        return x.astype(np.float64).astype(object) if dt is object else np.asarray(x).astype(str)


def layout(a):
    kind = pick(LAYOUT_KINDS)
    if a.ndim < 2 or a.size == 0 or a.dtype.kind not in "biuf":
        return a
    if kind == "F":
        return np.asfortranarray(a)
    if kind == "T":
        return np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2)
    if kind == "sliced":
        big = np.zeros(tuple(2 * s for s in a.shape), a.dtype)
        p = big[tuple(slice(None, None, 2) for _ in a.shape)]
        p[...] = a
        return p
    if kind == "neg":
        return np.flip(np.ascontiguousarray(np.flip(a)))
    if kind == "ro":
        a = a.copy(); a.flags.writeable = False; return a
    if kind == "unaligned" and a.dtype.itemsize > 1:
        buf = bytearray(a.nbytes + 1)
        p = np.frombuffer(buf, a.dtype, count=a.size, offset=1).reshape(a.shape)
        p[...] = a
        return p
    if kind == "bcast" and a.shape[-2] > 0:
        return np.broadcast_to(a[..., :1, :], a.shape)
    return a


def one_case():
    hostile = rng.random() < 0.3                  # otherwise only valid arguments (odd values ok)
    L, S, E, Ev = pick(SIZES), pick(SIZES), pick(ESIZES), pick(ESIZES)
    nlead = int(rng.integers(0, 4))
    lead = [int(pick([0, 1, 1, 2, 3])) for _ in range(nlead)]
    n = int(np.prod(lead)) if lead else 1
    while max(n, 1) * L * S * (E + Ev + 1) > 400_000:
        L, S = max(L // 2, 1), max(S // 2, 1)
    gqa = nlead > 0 and rng.random() < 0.3
    kl, vl = list(lead), list(lead)
    if gqa and lead[-1] > 0:
        g = int(pick([1, 2, 3]))
        lead[-1] = lead[-1] * g
    shapes = [tuple(lead) + (L, E), tuple(kl) + (S, E), tuple(vl) + (S, Ev)]
    if hostile and rng.random() < 0.3:            # a deliberate shape error
        i, d = int(rng.integers(3)), int(rng.integers(len(shapes[0])))
        s = list(shapes[i]); s[d] = s[d] + int(pick([1, 2, -1])) if s[d] > 0 else 3
        shapes[i] = tuple(s)
    if hostile and rng.random() < 0.1:            # a wrong rank
        i = int(rng.integers(3)); shapes[i] = shapes[i][-1:]
    base = pick(GOOD_DT)
    dts = [base, base, base]
    if rng.random() < 0.2:
        dts[int(rng.integers(3))] = pick(GOOD_DT + (BAD_DT if hostile else []))
    specials = rng.random() < 0.5
    arrs = [layout(np.asarray(values(s, dt, specials))) for s, dt in zip(shapes, dts)]
    mask = None
    r = rng.random()
    if r < 0.25:
        mshape = tuple(pick([1, L]) for _ in range(1)) + (pick([1, S]),)
        if rng.random() < 0.2:
            mshape = (pick([1, 2]),) * int(rng.integers(1, 3)) + mshape
        if hostile and rng.random() < 0.2:
            mshape = (L + 1, S)                   # does not broadcast
        mask = layout(rng.random(mshape) < pick([0.0, 0.5, 1.0]))
    elif r < 0.5:
        mshape = (pick([1, L]), pick([1, S]))
        m = rng.standard_normal(mshape) * pick([1.0, 1e30])
        m[rng.random(mshape) < pick([0.0, 0.5, 1.0])] = -np.inf
        if rng.random() < 0.3 and m.size:
            m.flat[rng.integers(m.size)] = pick(SPECIAL)
        mask = layout(m.astype(pick([np.float32, np.float64, np.float16]
                                    + ([np.int32, complex] if hostile else []))))
    elif hostile and r < 0.6:
        mask = pick([[True, False], "x", 3, np.float64(0.0), object()])
    kw = {}
    bad = (lambda *xs: list(xs)) if hostile else (lambda *xs: [])
    if rng.random() < 0.4:
        kw["is_causal"] = pick([True, False] + bad(1, None))
    if rng.random() < 0.4:
        kw["scale"] = pick([None, 0.0, -1.0, 1e-30, 1e30, 1e300, 5e-324, 2, np.float32(0.3)]
                           + bad(np.nan, np.inf, "x", True))
    if gqa or rng.random() < 0.1:
        kw["enable_gqa"] = pick([True, True, False] + bad("yes"))
    if rng.random() < 0.3:
        kw["return_weights"] = pick([True, False] + bad(0))
    if rng.random() < 0.5:
        kw["n_threads"] = pick([None, 1, 2, 3, 8, 10**9] + bad(0, -1, 2.5, True))
    return arrs, mask, kw


def expected_finite(arrs, mask, kw):
    if any(not isinstance(a, np.ndarray) or a.dtype.kind not in "biuf" for a in arrs):
        return False
    for a in arrs:
        if a.size and (not np.all(np.isfinite(a)) or np.max(np.abs(a.astype(np.float64))) > 1e4):
            return False
    if mask is not None:
        m = np.asarray(mask)
        if m.dtype.kind == "f" and m.size and np.any(np.isnan(m) | (np.abs(m) > 1e4) & np.isfinite(m)):
            return False
        if m.dtype.kind == "f" and m.size and np.any(m == np.inf):
            return False
    sc = kw.get("scale")
    return sc is None or (isinstance(sc, (int, float)) and not isinstance(sc, bool) and abs(sc) <= 10)


counts = {"cases": 0, "ok": 0, "ValueError": 0, "TypeError": 0, "MemoryError": 0}
problems = []
for i in range(count):
    arrs, mask, kw = one_case()
    desc = {"i": i, "isa": isa,
            "args": [f"{getattr(a, 'dtype', type(a).__name__)}{getattr(a, 'shape', '')} "
                     f"strides={getattr(a, 'strides', None)}" for a in arrs],
            "mask": None if mask is None else f"{getattr(mask, 'dtype', type(mask).__name__)}"
                                              f"{getattr(mask, 'shape', '')}",
            "kw": {k: repr(v) for k, v in kw.items()}}
    with open(progress_path, "w") as fh:
        fh.write(json.dumps(desc))
    counts["cases"] += 1
    try:
        if rng.random() < 0.1:
            out = fastattn.softmax(arrs[0], axis=int(rng.integers(-3, 3)),
                                   n_threads=kw.get("n_threads"))
        else:
            res = fastattn.scaled_dot_product_attention(arrs[0], arrs[1], arrs[2], mask, **kw)
            out = res[0] if isinstance(res, tuple) else res
            if out.dtype not in (np.float32, np.float64) or not out.flags.c_contiguous:
                problems.append(["bad output array", desc, str(out.dtype)])
            elif expected_finite(arrs, mask, kw) and not np.all(np.isfinite(out)):
                problems.append(["non-finite output from finite moderate inputs", desc])
        counts["ok"] += 1
    except (ValueError, TypeError, MemoryError) as exc:
        counts[type(exc).__name__] = counts.get(type(exc).__name__, 0) + 1
    except Exception as exc:
        problems.append(["unexpected " + type(exc).__name__ + ": " + str(exc)[:300], desc])
print("FUZZ-RESULT " + json.dumps({"counts": counts, "problems": problems[:20]}))
'''


@pytest.mark.slow
def test_fuzz_hostile_cases_in_child_processes(tmp_path):
    """Random hostile calls in child processes; any child killed by a signal (or exiting
    non-zero) fails the test with the case it was running."""
    total = int(os.environ.get("FASTATTN_FUZZ_CASES", "4000"))
    batch = 250
    n_batches = max(1, -(-total // batch))
    script = tmp_path / "fuzz_child.py"
    script.write_text(FUZZ_CHILD)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "2")
    results, deaths, problems = [], [], []
    running = []
    seeds = list(range(n_batches))
    parallel = 2

    def finish(p, seed, prog):
        out, err = p.communicate(timeout=600)
        if p.returncode != 0:
            last = prog.read_text() if prog.exists() else "?"
            kind = f"signal {-p.returncode}" if p.returncode < 0 else f"exit {p.returncode}"
            deaths.append(f"batch seed {seed}: {kind} during case {last}\n{err[-3000:]}")
            return
        line = [x for x in out.splitlines() if x.startswith("FUZZ-RESULT ")]
        assert line, (out[-2000:], err[-2000:])
        res = json.loads(line[-1][len("FUZZ-RESULT "):])
        results.append(res["counts"])
        problems.extend(res["problems"])

    while seeds or running:
        while seeds and len(running) < parallel:
            seed = seeds.pop(0)
            prog = tmp_path / f"progress_{seed}.json"
            p = subprocess.Popen([sys.executable, str(script), str(seed + 1000), str(batch), str(prog)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            running.append((p, seed, prog))
        p, seed, prog = running.pop(0)
        finish(p, seed, prog)

    tried = sum(r["cases"] for r in results)
    summary = {k: sum(r.get(k, 0) for r in results) for k in ("cases", "ok", "ValueError",
                                                               "TypeError", "MemoryError")}
    print(f"\nfuzz: {n_batches} child processes, {tried} hostile cases completed, "
          f"{len(deaths)} children died; outcomes {summary}")
    assert not deaths, "a child process died:\n" + "\n".join(deaths)
    assert not problems, json.dumps(problems[:5], indent=1)
    assert tried >= total
