"""scaled_dot_product_attention against the float64 NumPy reference, SciPy's softmax and PyTorch."""
import numpy as np
import pytest
from scipy.special import softmax as sp_softmax

import fastattn
from fastattn import scaled_dot_product_attention as sdpa
from fastattn._kernels import _attention as _k
from tolerances import ATOL, RTOL, assert_close
from reference import sdpa_ref

DTYPES = [np.float32, np.float64]
BQ = _k.BQ
BK32 = _k.key_block(64, 64, 4)
# (B, H, L, S, E, Ev): ones, primes, one off the tile sizes, L != S, E != Ev, large heads
SHAPES = [
    (1, 1, 1, 1, 1, 1),
    (1, 1, 1, 7, 3, 5),
    (2, 3, 5, 1, 4, 4),
    (1, 2, 13, 17, 11, 7),
    (1, 1, BQ - 1, BQ + 1, 16, 16),
    (1, 1, BQ + 1, BQ - 1, 32, 8),
    (2, 2, 2 * BQ + 3, BK32 + 1, 64, 64),
    (1, 1, 3, BK32 - 1, 64, 48),
    (1, 1, 31, 2 * BK32 + 5, 64, 64),
    (1, 1, 70, 37, 129, 3),
    (1, 2, 9, 300, 256, 256),
    (1, 1, 5, 6, 1024, 33),
    (1, 1, 50, 2 * 2048 + 3, 16, 16),     # more keys than a decode key split, many queries
    (1, 2, 17, 2048 + 1, 8, 8),           # one row past the in-place (decode) path
]


def _qkv(rng, shape, dtype):
    B, H, L, S, E, Ev = shape
    q = rng.standard_normal((B, H, L, E)).astype(dtype)
    k = rng.standard_normal((B, H, S, E)).astype(dtype)
    v = rng.standard_normal((B, H, S, Ev)).astype(dtype)
    return q, k, v


def _check(q, k, v, dtype, **kw):
    out, w = sdpa(q, k, v, return_weights=True, **kw)
    ref_out, ref_w = sdpa_ref(q, k, v, **kw)
    assert out.dtype == dtype and w.dtype == dtype
    assert out.shape == ref_out.shape and w.shape == ref_w.shape
    assert_close(out, ref_out, dtype)
    assert_close(w, ref_w, dtype)
    # the output does not depend on asking for the weights
    np.testing.assert_array_equal(sdpa(q, k, v, **kw), out)
    return out, w


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True])
def test_matches_reference(rng, dtype, shape, causal):
    q, k, v = _qkv(rng, shape, dtype)
    _check(q, k, v, dtype, is_causal=causal)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_shape", [
    "LS", "1S", "L1", "BHLS", "B1LS", "B11S", "1HLS", "S"])
@pytest.mark.parametrize("kind", ["bool", "float", "float_inf"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("L", [5, 70])          # in-place (decode) path and packed path
def test_masks(rng, dtype, mask_shape, kind, causal, L):
    B, H, S, E, Ev = 2, 3, 300, 16, 8
    q, k, v = _qkv(rng, (B, H, L, S, E, Ev), dtype)
    dims = {"B": B, "H": H, "L": L, "S": S, "1": 1}
    shape = tuple(dims[c] for c in mask_shape)
    allowed = rng.random(shape) > 0.4
    if kind == "bool":
        mask = allowed
    elif kind == "float":
        mask = rng.standard_normal(shape).astype(dtype)
    else:
        mask = np.where(allowed, rng.standard_normal(shape), -np.inf).astype(dtype)
    _check(q, k, v, dtype, attn_mask=mask, is_causal=causal)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("L, S", [(5, 40), (40, 5), (300, 257), (257, 300), (1, 600)])
def test_causal_top_left(rng, dtype, L, S):
    """is_causal: query i sees keys j <= i, top-left aligned, for L < S and L > S."""
    q, k, v = _qkv(rng, (1, 2, L, S, 8, 8), dtype)
    _, w = _check(q, k, v, dtype, is_causal=True)
    i, j = np.indices((L, S))
    assert (w[..., j > i] == 0).all()
    np.testing.assert_allclose(w.sum(-1), 1, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("L", [1, 3, 16])
@pytest.mark.parametrize("causal", [False, True])
def test_decode_key_splits(rng, dtype, L, causal):
    """Few query rows over many keys: the keys are split into fixed chunks merged through their
    log-sum-exp; with masks, fully masked chunks, NaN in a masked-out value, GQA, weights."""
    S = 2 * _k.KEY_SPLIT + 37
    q = rng.standard_normal((2, 4, L, 16)).astype(dtype)
    k = rng.standard_normal((2, 2, S, 16)).astype(dtype)
    v = rng.standard_normal((2, 2, S, 8)).astype(dtype)
    _check(q, k, v, dtype, is_causal=causal, enable_gqa=True)
    mask = rng.random((2, 1, L, S)) > 0.5
    mask[0, :, :, : _k.KEY_SPLIT + 5] = False      # whole splits without any allowed key
    mask[1, :, 0] = False                           # a fully masked row
    v[:, :, 7] = np.nan
    mask[..., 7] = False
    out, _ = _check(q, k, v, dtype, attn_mask=mask, is_causal=causal, enable_gqa=True)
    assert not np.isnan(out).any() and (out[1, :, 0] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_fully_masked_rows_are_zero(rng, dtype):
    q, k, v = _qkv(rng, (1, 2, 70, 300, 16, 16), dtype)
    mask = rng.random((70, 300)) > 0.5
    mask[3] = False
    mask[64:] = False                      # a whole query block
    fmask = np.where(mask, 0.0, -np.inf).astype(dtype)
    for m in (mask, fmask):
        out, w = _check(q, k, v, dtype, attn_mask=m)
        assert np.all(out[:, :, 3] == 0) and np.all(out[:, :, 64:] == 0)
        assert np.all(w[:, :, 3] == 0) and not np.isnan(out).any()
    # S == 0: every row is fully masked
    out, w = sdpa(q, k[:, :, :0], v[:, :, :0], return_weights=True)
    assert out.shape == (1, 2, 70, 16) and (out == 0).all() and w.shape == (1, 2, 70, 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_causal_combined_with_mask(rng, dtype):
    q, k, v = _qkv(rng, (1, 1, 6, 6, 4, 4), dtype)
    mask = np.ones((6, 6), bool)
    mask[:, 0] = False                     # with causal, row 0 can then see nothing
    out, w = _check(q, k, v, dtype, attn_mask=mask, is_causal=True)
    assert (out[0, 0, 0] == 0).all() and (w[0, 0, 0] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq, hkv", [(8, 2), (6, 3), (4, 1), (4, 4)])
def test_gqa(rng, dtype, hq, hkv):
    q = rng.standard_normal((2, hq, 33, 16)).astype(dtype)
    k = rng.standard_normal((2, hkv, 70, 16)).astype(dtype)
    v = rng.standard_normal((2, hkv, 70, 12)).astype(dtype)
    out, _ = _check(q, k, v, dtype, enable_gqa=True, is_causal=True)
    # query head h uses kv head h // (hq // hkv)
    g = hq // hkv
    for h in range(hq):
        np.testing.assert_array_equal(out[:, h], sdpa(q[:, h], k[:, h // g], v[:, h // g], is_causal=True))


@pytest.mark.parametrize("dtype", DTYPES)
def test_leading_dims_and_broadcast(rng, dtype):
    # 2-D inputs
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in [(7, 5), (9, 5), (9, 3)])
    _check(q, k, v, dtype)
    # 3-D and 5-D
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in [(4, 7, 5), (4, 9, 5), (4, 9, 3)])
    _check(q, k, v, dtype)
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in [(2, 3, 2, 7, 5), (2, 3, 2, 9, 5), (2, 3, 2, 9, 3)])
    _check(q, k, v, dtype)
    # key/value shared across the batch (broadcast, no copy)
    q = rng.standard_normal((3, 2, 7, 5)).astype(dtype)
    k = rng.standard_normal((1, 2, 9, 5)).astype(dtype)
    v = rng.standard_normal((2, 9, 4)).astype(dtype)
    out, _ = _check(q, k, v, dtype)
    assert out.shape == (3, 2, 7, 4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_memory_layouts(rng, dtype):
    """C, Fortran, sliced, transposed-view and negative-stride inputs give the same answer."""
    q, k, v = _qkv(rng, (2, 3, 20, 30, 8, 6), dtype)
    ref = sdpa(q, k, v, is_causal=True)
    big = rng.standard_normal((4, 6, 40, 60, 16)).astype(dtype)
    variants = [
        (np.asfortranarray(q), np.asfortranarray(k), np.asfortranarray(v)),
        (q[::-1].copy()[::-1], k[:, ::-1].copy()[:, ::-1], v[..., ::-1, :].copy()[..., ::-1, :]),
        (q.swapaxes(1, 2).copy().swapaxes(1, 2), k.swapaxes(0, 1).copy().swapaxes(0, 1), v),
        (q.copy(order="K")[:, :, :, ::-1].copy()[:, :, :, ::-1], k, v[..., ::-1].copy()[..., ::-1]),
    ]
    for qq, kk, vv in variants:
        np.testing.assert_array_equal(sdpa(qq, kk, vv, is_causal=True), ref)
    # strided slices of a bigger array
    qs, ks, vs = big[::2, ::2, :20, 0, :8], big[1::2, 1::2, :30, 1, :8], big[::2, 1::2, 10:40, 2, 2:8]
    assert not qs.flags.c_contiguous
    _check(qs, ks, vs, dtype)
    # (B, L, H, E) projections viewed as (B, H, L, E) without a copy
    x = rng.standard_normal((2, 20, 3, 8)).astype(dtype)
    _check(x.swapaxes(1, 2), x.swapaxes(1, 2), x.swapaxes(1, 2), dtype, is_causal=True)


def _out_views(B, H, L, Ev, dtype):
    """Output arrays of shape (B, H, L, Ev) in other layouts, each the only thing in an
    exact-size, NaN-filled buffer (under the sanitizer a write past it is caught), and the
    buffer's elements that are not part of the view (a write there is a stray write)."""
    heads = np.full((B, L, H * Ev), np.nan, dtype)                 # heads side by side
    flipped = np.full((B, H, L, Ev), np.nan, dtype)                 # negative strides
    padded = np.full((H, B, L + 3, Ev + 5), np.nan, dtype)          # gaps between rows
    return [
        (heads.reshape(B, L, H, Ev).transpose(0, 2, 1, 3), heads, None),
        (flipped[::-1, ::-1, ::-1], flipped, None),
        (padded.transpose(1, 0, 2, 3)[:, :, 2:L + 2, 1:Ev + 1], padded,
         (slice(None), slice(None), slice(2, L + 2), slice(1, Ev + 1))),
    ]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, causal, masked", [
    ((2, 3, 20, 30, 8, 6), True, False),            # packed tiles
    ((2, 12, 128, 128, 32, 32), False, True),       # the encoder's heads, key padding
    ((1, 2, 3, 2 * 2048 + 5, 16, 8), False, False), # key splits (merged into out)
    ((3, 2, 1, 7, 4, 4), True, True),               # decode (keys in place)
    ((1, 1, 5, 6, 1024, 33), False, False),         # odd widths
], ids=str)
def test_out_argument_in_any_layout(rng, dtype, shape, causal, masked):
    """out= writes exactly the values sdpa returns, bit for bit, into views whose strides are not
    C-contiguous (heads side by side, negative, gaps), touches nothing else of their buffers, and
    is what the call returns."""
    B, H, L, S, E, Ev = shape
    q, k, v = _qkv(rng, shape, dtype)
    mask = rng.random((B, 1, 1, S)) < 0.8 if masked else None
    ref, ref_w = sdpa(q, k, v, mask, is_causal=causal, return_weights=True)
    assert_close(ref, sdpa_ref(q, k, v, mask, is_causal=causal)[0], dtype)
    for out, buf, window in _out_views(B, H, L, Ev, dtype):
        got = sdpa(q, k, v, mask, is_causal=causal, out=out)
        assert got is out
        np.testing.assert_array_equal(out, ref)
        if window is None:
            assert not np.isnan(buf).any()                  # the view covers the buffer
        else:
            untouched = np.ones(buf.shape, bool)
            untouched[window] = False
            assert np.isnan(buf[untouched]).all()
        out[...] = np.nan
        got, w = sdpa(q, k, v, mask, is_causal=causal, out=out, return_weights=True)
        assert got is out
        np.testing.assert_array_equal(out, ref)
        np.testing.assert_array_equal(w, ref_w)


@pytest.mark.parametrize("dtype", DTYPES)
def test_out_overlapping_the_inputs(rng, dtype):
    """out sharing memory with q, k or v (one projection buffer) still gives the values computed
    from the inputs as they were (the result goes through a temporary)."""
    B, H, L, Dh = 2, 3, 17, 8
    buf = rng.standard_normal((B, L, 3, H, Dh)).astype(dtype)
    q, k, v = (buf[:, :, j].transpose(0, 2, 1, 3) for j in range(3))
    ref = sdpa(q.copy(), k.copy(), v.copy(), is_causal=True)
    out = buf[:, :, 0].transpose(0, 2, 1, 3)                # write over the queries
    assert sdpa(q, k, v, is_causal=True, out=out) is out
    np.testing.assert_array_equal(out, ref)
    qq = rng.standard_normal((1, 2, 5, 4)).astype(dtype)
    ref = sdpa(qq, qq, qq)
    got = qq.copy()
    sdpa(got, got, got, out=got)                            # the very same array
    np.testing.assert_array_equal(got, ref)


def test_out_errors(rng):
    q, k, v = _qkv(rng, (2, 3, 4, 5, 8, 6), np.float32)
    good = np.empty((2, 3, 4, 6), np.float32)
    with pytest.raises(TypeError, match="out must be a NumPy array"):
        sdpa(q, k, v, out=good.tolist())
    with pytest.raises(TypeError, match="out must have dtype float32"):
        sdpa(q, k, v, out=good.astype(np.float64))
    with pytest.raises(ValueError, match=r"out must have shape \(2, 3, 4, 6\)"):
        sdpa(q, k, v, out=good[:, :, :3])
    with pytest.raises(ValueError, match="out must have shape"):
        sdpa(q, k, v, out=good[0])                          # no broadcasting into out
    ro = good.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out must be writeable"):
        sdpa(q, k, v, out=ro)
    with pytest.raises(ValueError, match="out's last axis must be contiguous"):
        sdpa(q, k, v, out=np.empty((2, 3, 4, 12), np.float32)[..., ::2])
    with pytest.raises(TypeError, match="out must have dtype float32, got >f4"):
        sdpa(q, k, v, out=good.astype(good.dtype.newbyteorder(">")))
    raw = np.empty(good.nbytes + 1, np.uint8)[1:]
    with pytest.raises(ValueError, match="element-aligned"):
        sdpa(q, k, v, out=raw.view(np.float32).reshape(good.shape))
    folded = np.lib.stride_tricks.as_strided(good, shape=good.shape,
                                             strides=(0,) + good.strides[1:])
    with pytest.raises(ValueError, match="out must not overlap itself"):
        sdpa(q, k, v, out=folded)
    rows = np.lib.stride_tricks.as_strided(good, shape=good.shape,
                                           strides=good.strides[:2] + (8, 4))
    with pytest.raises(ValueError, match="out must not overlap itself"):
        sdpa(q, k, v, out=rows)


def test_dtype_table(rng):
    q, k, v = _qkv(rng, (1, 1, 4, 5, 3, 2), np.float64)
    cases = [
        ((np.float32,) * 3, np.float32),
        ((np.float64,) * 3, np.float64),
        ((np.float32, np.float64, np.float32), np.float64),
        ((np.float16,) * 3, np.float32),
        ((np.int32, np.float32, np.float32), np.float64),
        ((np.int64,) * 3, np.float64),
        ((np.int8, np.float32, np.float32), np.float32),
    ]
    for dts, expect in cases:
        args = [a.astype(dt) if np.dtype(dt).kind == "f" else (a * 3).astype(dt) for a, dt in zip((q, k, v), dts)]
        out = sdpa(*args)
        assert out.dtype == expect, (dts, out.dtype)
        ref, _ = sdpa_ref(*args)
        np.testing.assert_allclose(out, ref, rtol=1e-3 if expect == np.float32 else 1e-12, atol=1e-3)
    out = sdpa([[1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]], [[1.0], [2.0]])   # nested lists
    assert out.dtype == np.float64 and out.shape == (1, 1)
    out = sdpa(np.ones((2, 2), bool), np.ones((2, 2), bool), np.ones((2, 2), bool))
    assert out.dtype == np.float64


@pytest.mark.parametrize("dtype", DTYPES)
def test_extreme_logits_stay_finite(rng, dtype):
    """Scores of order 1e4..1e7: finite, and correct to the conditioning of the problem (a score
    s carries an absolute rounding error of about eps * |s|, so weights agree to ~eps * max|s|)."""
    q, k, v = _qkv(rng, (1, 2, 40, 50, 8, 8), dtype)
    q = (np.sign(q) * 1e4 / 8).astype(dtype)
    eps = np.finfo(dtype).eps
    for scale in (None, 1e3, -1e3):
        out, w = sdpa(q, k, v, return_weights=True, scale=scale)
        ref_out, ref_w = sdpa_ref(q, k, v, scale=scale)
        assert np.isfinite(out).all() and np.isfinite(w).all()
        smax = np.abs(q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2)).max() * (scale or 8 ** -0.5)
        tol = 8 * eps * abs(smax)
        np.testing.assert_allclose(w, ref_w, atol=tol, rtol=0)
        np.testing.assert_allclose(out, ref_out, atol=tol * np.abs(v).max() * 2, rtol=0)
        np.testing.assert_allclose(w.sum(-1), 1, rtol=10 * eps * 50)
    big = np.full((3, 4), 1e4, dtype)
    out = sdpa(big, big, np.tile(np.arange(4, dtype=dtype), (3, 1)), scale=1e3)
    np.testing.assert_allclose(out, np.tile([1.0, 1.0, 1.0, 1.0], (3, 1)) * np.arange(4), rtol=1e-6)


def test_float64_agrees_to_1e12(rng):
    q, k, v = _qkv(rng, (2, 4, 300, 400, 64, 64), np.float64)
    out = sdpa(q, k, v, is_causal=True)
    ref, _ = sdpa_ref(q, k, v, is_causal=True)
    err = np.abs(out - ref).max()
    assert err < 1e-12, err


def test_scipy_softmax_cross_check(rng):
    """The weights are scipy.special.softmax(scores, axis=-1) of the scaled scores."""
    q, k, v = _qkv(rng, (2, 2, 30, 45, 16, 8), np.float64)
    _, w = sdpa(q, k, v, return_weights=True, scale=0.3)
    np.testing.assert_allclose(w, sp_softmax(q @ k.swapaxes(-1, -2) * 0.3, axis=-1), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("L, S", [(5, 6), (70, 300)])
def test_nan_propagates_unmasked(rng, dtype, L, S):
    q, k, v = _qkv(rng, (1, 1, L, S, 4, 3), dtype)
    q2 = q.copy()
    q2[0, 0, 2, 1] = np.nan
    out = sdpa(q2, k, v)
    assert np.isnan(out[0, 0, 2]).all() and np.isfinite(np.delete(out[0, 0], 2, axis=0)).all()
    v2 = v.copy()
    v2[0, 0, 4, 0] = np.nan   # key 4 is allowed for every row (causal off)
    out = sdpa(q, k, v2)
    assert np.isnan(out[..., 0]).all() and np.isfinite(out[..., 1:]).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("L", [3, 70])
def test_masked_nonfinite_never_reaches_output(rng, dtype, L):
    q, k, v = _qkv(rng, (1, 2, L, 300, 8, 8), dtype)
    k[..., 299, :] = np.nan
    v[..., 299, :] = np.inf
    v[..., 100, 3] = np.nan
    mask = np.ones((L, 300), bool)
    mask[:, 299] = False
    mask[:, 100] = False
    for m in (mask, np.where(mask, 0.0, -np.inf).astype(dtype)):
        out = sdpa(q, k, v, attn_mask=m)
        ref, _ = sdpa_ref(q, k, v, attn_mask=m)
        assert np.isfinite(out).all()
        assert_close(out, ref, dtype)
    # causal hides keys after the row index
    out = sdpa(q, k, v, is_causal=True)
    assert np.isfinite(out).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("L, S", [(23, 23), (24, 24), (25, 31), (48, 40), (97, 97), (128, 128),
                                  (130, 700), (200, 150)])
def test_causal_row_groups(rng, dtype, L, S):
    """Causal tiles crossing the diagonal run in groups of rows, each over the keys its last row
    sees: shapes around the group and block edges, with a key-padding mask, against the
    reference; a key only later rows see holds inf / NaN / huge values, which must reach
    exactly the rows that see it."""
    q, k, v = _qkv(rng, (2, 3, L, S, 16, 24), dtype)
    _check(q, k, v, dtype, is_causal=True)
    pad = np.ones((2, 1, 1, S), bool)
    pad[1, ..., S - S // 3:] = False
    _check(q, k, v, dtype, attn_mask=pad, is_causal=True)
    j = min(L, S) - 2                           # seen by rows j .. L-1 only
    v2 = v.copy()
    v2[..., j, 0] = np.inf
    v2[..., j, 1] = np.nan
    out = sdpa(q, k, v2, is_causal=True)
    assert np.isfinite(out[..., :j, :]).all()
    assert_close(out[..., :j, :], sdpa_ref(q, k, v, is_causal=True)[0][..., :j, :], dtype)
    assert np.isnan(out[..., j:, 1]).all() and not np.isfinite(out[..., j:, 0]).any()
    big = np.finfo(dtype).max / 4               # the pack flags |v| near the limit: P is
    v3 = np.full_like(v, big)                   # normalised before P @ V in that case
    v3[..., ::2, :] = -big
    out = sdpa(q, k, v3, is_causal=True)
    ref, _ = sdpa_ref(q.astype(np.float64), k.astype(np.float64), v3.astype(np.float64),
                      is_causal=True)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out / big, ref / big, rtol=0, atol=1e-4 if dtype == np.float32 else 1e-10)


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_parity(rng, dtype):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    tdt = torch.float32 if dtype == np.float32 else torch.float64
    cases = [
        dict(shape=(2, 3, 37, 53, 24, 16)),
        dict(shape=(1, 4, 65, 65, 64, 64), is_causal=True),
        dict(shape=(2, 2, 17, 300, 8, 8), mask="bool"),
        dict(shape=(2, 2, 17, 300, 8, 8), mask="float"),
        dict(shape=(1, 2, 40, 30, 16, 16), scale=0.05),
        dict(shape=(1, 8, 20, 40, 16, 16), gqa=2),
    ]
    for c in cases:
        B, H, L, S, E, Ev = c["shape"]
        hkv = H // c.get("gqa", 1)
        q = rng.standard_normal((B, H, L, E)).astype(dtype)
        k = rng.standard_normal((B, hkv, S, E)).astype(dtype)
        v = rng.standard_normal((B, hkv, S, Ev)).astype(dtype)
        mask = None
        if c.get("mask") == "bool":
            mask = rng.random((B, 1, L, S)) > 0.3
        elif c.get("mask") == "float":
            mask = rng.standard_normal((B, 1, L, S)).astype(dtype)
        kw = dict(is_causal=c.get("is_causal", False), scale=c.get("scale"), enable_gqa="gqa" in c)
        ours = sdpa(q, k, v, attn_mask=mask, **kw)
        theirs = F.scaled_dot_product_attention(
            torch.from_numpy(q).to(tdt), torch.from_numpy(k).to(tdt), torch.from_numpy(v).to(tdt),
            attn_mask=None if mask is None else torch.from_numpy(mask), **kw).numpy()
        tol = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(ours, theirs, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("S", [5, 130, 1100, 5000])
def test_key_padding_mask_trims_keys_exactly(rng, dtype, S):
    """A mask shared by every query row (B, 1, 1, S) lets the kernel leave out the keys after
    the last allowed one and skip applying an all-allowing mask: the result must equal the
    reference and, bit for bit, the result of dropping the padded keys altogether."""
    B, H, L, E = 3, 2, 7, 16
    q, k, v = _qkv(rng, (B, H, L, S, E, E), dtype)
    lens = [S, max(1, S // 3), 1]
    keep = np.arange(S)[None, :] < np.array(lens)[:, None]               # right padding
    v[1, :, -1, 0] = np.nan                # a padded NaN value never reaches the output
    bmask = keep[:, None, None, :]
    fmask = np.where(bmask, 0.0, -np.inf).astype(dtype)
    wmask = np.where(bmask, 0.25, -np.inf).astype(dtype)                  # not neutral
    hole = bmask.copy()
    hole[0, ..., S // 2] = False                                         # not a prefix
    for mask in (bmask, fmask, wmask, hole):
        out = sdpa(q, k, v, attn_mask=mask)
        vv = np.where(np.isnan(v), 0, v)
        ref = sdpa_ref(q, k, vv, attn_mask=mask)[0]
        assert_close(out, ref, dtype)
        for n in range(3):
            if mask is hole and n == 0:
                continue
            alone = sdpa(q[n:n + 1], k[n:n + 1, :, :lens[n]], v[n:n + 1, :, :lens[n]],
                         attn_mask=mask[n:n + 1, ..., :lens[n]])
            np.testing.assert_array_equal(out[n:n + 1], alone)
    # causal on top of a padding mask
    assert_close(sdpa(q, k, np.nan_to_num(v), attn_mask=bmask, is_causal=True),
                 sdpa_ref(q, k, np.nan_to_num(v), attn_mask=bmask, is_causal=True)[0], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_isa_agrees(rng, dtype, isa):
    """Each micro-kernel set the CPU supports matches the reference ("avx2-wide" is the AVX-512
    build's kernel shapes compiled for AVX2, so they are tested without AVX-512 too: in
    FASTATTN_DEBUG builds)."""
    for L in (70, 5, 133):
        q, k, v = _qkv(rng, (1, 2, L, 300, 24, 40), dtype)
        mask = rng.random((L, 300)) > 0.3
        _check(q, k, v, dtype, is_causal=True)
        _check(q, k, v, dtype, attn_mask=mask)
        _check(q, k, v, dtype, attn_mask=np.where(mask, 0.5, -np.inf).astype(dtype))
        v[0, 1, 17, 3] = np.nan            # masked-out NaN value: the skip-zero P @ V path
        m2 = mask.copy()
        m2[:, 17] = False
        _check(q, k, v, dtype, attn_mask=m2)
    # value widths that end on every panel width (the last value panel may be 1 to NV
    # vectors wide), with and without the skip-zero path
    for Ev in (8, 16, 24, 32, 48, 64, 80, 112):
        q, k, v = _qkv(rng, (1, 2, 40, 70, 32, Ev), dtype)
        _check(q, k, v, dtype)
        v[0, 0, 5, Ev - 1] = np.inf
        mask = np.ones((40, 70), bool)
        mask[:, 5] = False
        _check(q, k, v, dtype, attn_mask=mask)
    x = rng.standard_normal((5, 37)).astype(dtype)
    np.testing.assert_allclose(fastattn.softmax(x), sp_softmax(x, axis=-1), rtol=RTOL[dtype] * 10, atol=ATOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("E", [5, 8, 40, 64, 128])
@pytest.mark.parametrize("L, S, S_pad", [
    (1, 5, 16), (7, 7, 12), (3, 13, 100), (16, 2049, 4100),       # keys read in place (decode)
    (20, 20, 40), (17, 600, 1100), (97, 97, 200),                   # packed tiles
])
def test_padding_changes_no_bit_of_a_row(dtype, E, L, S, S_pad):
    """A row attends to its own keys alone, or as part of a batch padded to more keys with a key
    padding mask: the same bits (what batched inference relies on). Holds within each kernel
    path; fastattn.dask never batches a sequence with more query rows than DIRECT_MAX_L allows
    together with one that has fewer."""
    rng = np.random.default_rng(E * 1000 + S_pad)
    q = rng.standard_normal((2, 4, L, E)).astype(dtype)
    k = rng.standard_normal((2, 4, S_pad, E)).astype(dtype)
    v = rng.standard_normal((2, 4, S_pad, E)).astype(dtype)
    mask = np.ones((2, 1, 1, S_pad), bool)
    mask[0, ..., S:] = False
    alone = sdpa(q[:1], k[:1, :, :S], v[:1, :, :S])
    batched = sdpa(q, k, v, mask)[:1]
    assert np.array_equal(alone, batched)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_decode_rows_have_their_own_bits(dtype, isa):
    """The in-place (decode) path computes query rows in groups sharing each key and value load
    (beam search's rows of one source): every row must still get exactly the bits it gets alone,
    for any number of rows, head sizes with vector tails, key counts around the 4-key step, and
    masked-out keys (p == 0, here over a NaN value) skipped per row."""
    rng = np.random.default_rng(7)
    for E, Ev, S in ((5, 7, 9), (16, 16, 33), (40, 72, 130), (64, 64, 127)):
        for L in (2, 3, 4, 5, 6, 7, 8, 11, 13, 16):
            q = rng.standard_normal((2, 3, L, E)).astype(dtype)
            k = rng.standard_normal((2, 3, S, E)).astype(dtype)
            v = rng.standard_normal((2, 3, S, Ev)).astype(dtype)
            v[1, 2, S // 2, Ev - 1] = np.nan
            mask = rng.random((2, 3, L, S)) > 0.2
            mask[1, 2, :, S // 2] = False
            mask[0, 0, L - 1] = False                 # a row that allows no key
            out = sdpa(q, k, v, mask)
            assert np.isfinite(out).all()
            ref = sdpa_ref(q, k, np.nan_to_num(v), attn_mask=mask)[0]
            assert_close(out, ref, dtype)
            for r in range(L):
                alone = sdpa(q[:, :, r:r + 1], k, v, mask[:, :, r:r + 1])
                np.testing.assert_array_equal(out[:, :, r:r + 1], alone)
            # no mask (the row maximum comes from the dot-product pass itself), and a key
            # padding mask shared by the rows (Whisper's and the translators' cross-attention)
            vf = np.nan_to_num(v)
            for m in (None, np.ones((2, 1, 1, S), bool)):
                out = sdpa(q, k, vf, m)
                assert_close(out, sdpa_ref(q, k, vf, attn_mask=m)[0], dtype)
                for r in range(L):
                    np.testing.assert_array_equal(out[:, :, r:r + 1],
                                                  sdpa(q[:, :, r:r + 1], k, vf, m))
            # three more keys, masked out per row: every key before them moves between the
            # 4-key blocks' shared reduction and the one-key tail, with the same bits
            k3 = np.concatenate([k, rng.standard_normal((2, 3, 3, E)).astype(dtype)], axis=2)
            v3 = np.concatenate([vf, rng.standard_normal((2, 3, 3, Ev)).astype(dtype)],
                                axis=2)
            m3 = np.ones((2, 3, L, S + 3), bool)
            m3[..., S:] = False
            np.testing.assert_array_equal(sdpa(q, k3, v3, m3), sdpa(q, k, vf, m3[..., :S]))
    # a NaN score without a mask makes its row NaN, as it does alone
    q = rng.standard_normal((1, 2, 5, 64)).astype(dtype)
    k = rng.standard_normal((1, 2, 40, 64)).astype(dtype)
    v = rng.standard_normal((1, 2, 40, 64)).astype(dtype)
    k[0, 1, 21, 3] = np.nan
    out = sdpa(q, k, v)
    assert np.isnan(out[0, 1]).all() and np.isfinite(out[0, 0]).all()
    np.testing.assert_array_equal(out[:, :, 2:3], sdpa(q[:, :, 2:3], k, v))
