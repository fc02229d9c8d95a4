"""Property-based tests (hypothesis) of scaled_dot_product_attention and softmax.

Each property draws a random case: shapes with 0 and 1 on every axis, primes and the tile sizes
+-1 (BQ = 64 query rows; 64 / 128 / 256 keys), float32 / float64 plus mixed float16 / int inputs,
leading dimensions that broadcast, grouped-query heads, bool and float masks of every broadcast
shape, causal, scale, and a memory layout per argument (Fortran order, transposed, sliced with
NaN-filled gaps, negative strides, read-only, non-aligned bytes, big-endian, zero-stride rows).

Properties: agreement with the float64 reference (tests/reference.py); weight rows sum to 1 or
are all zero (exactly when no key is allowed); outputs lie in the convex hull of the allowed
values; a constant added to every score changes nothing; permuting keys and values together
changes nothing; permuting queries permutes the output; inputs are never written to.

CI size: FASTATTN_HYPOTHESIS_EXAMPLES examples per property (default 200; ci/sanitize.sh uses
fewer). The number of examples each property actually ran is printed in the terminal summary.
"""
import os
from collections import Counter

import numpy as np
import pytest

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, note, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import fastattn  # noqa: E402
from reference import sdpa_ref  # noqa: E402

N_EXAMPLES = int(os.environ.get("FASTATTN_HYPOTHESIS_EXAMPLES", "200"))
PROFILE = settings(
    max_examples=N_EXAMPLES,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much],
)
EXAMPLES = Counter()          # property name -> examples run (includes shrinking)

SIZES_LS = [0, 1, 2, 3, 5, 7, 13, 31, 63, 64, 65, 127, 128, 129, 255, 256, 257]
SIZES_E = [0, 1, 2, 3, 5, 7, 8, 13, 16, 31, 32, 33, 63, 64, 65]
LAYOUTS = ["C", "F", "T", "leadT", "sliced", "rowsliced", "neg", "negrows", "readonly",
           "unaligned", "bigendian", "bcastrows"]
SANITIZED = bool(os.environ.get("FASTATTN_SANITIZED"))
COST_LIMIT = 1_500_000        # bound on N * L * S * (E + Ev + 1) for one example

f = fastattn.scaled_dot_product_attention


@pytest.fixture(scope="module", autouse=True)
def _report_examples(pytestconfig):
    yield
    total = sum(EXAMPLES.values())
    lines = [f"hypothesis examples run: {total} (max_examples={N_EXAMPLES} per property)"]
    lines += [f"  {name}: {n}" for name, n in sorted(EXAMPLES.items())]
    tr = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    cap = pytestconfig.pluginmanager.get_plugin("capturemanager")
    if tr is None or cap is None:  # pragma: no cover
        print("\n".join(lines))
        return
    with cap.global_and_fixture_disabled():
        tr.write_line("")
        for line in lines:
            tr.write_line(line)


# ---------------------------------------------------------------- helpers

def expected_dtype(*dtypes):
    dt = np.result_type(*dtypes)
    if dt.kind in "biu":
        return np.dtype(np.float64)
    if dt.itemsize < 4:
        return np.dtype(np.float32)
    return dt


def _fill_value(dtype):
    if dtype.kind == "f":
        return np.nan          # a read outside the view poisons the output
    if dtype.kind == "b":
        return True            # a read outside the view allows extra keys
    return np.iinfo(dtype).max


def apply_layout(a, kind):
    """(logical values, physical array) with the same values in memory laid out as `kind`."""
    a = np.asarray(a)
    if a.ndim < 2 or a.size == 0:
        kind = {"unaligned": "unaligned", "readonly": "readonly"}.get(kind, "C")
    if kind == "C":
        p = a.copy(order="C")
    elif kind == "F":
        p = np.asfortranarray(a)
    elif kind == "T":
        p = np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2)
    elif kind == "leadT":
        if a.ndim >= 3:
            p = np.moveaxis(np.ascontiguousarray(np.moveaxis(a, -3, 0)), 0, -3)
        else:
            p = np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2)
    elif kind == "sliced":
        big = np.full(tuple(2 * s + 1 for s in a.shape), _fill_value(a.dtype), dtype=a.dtype)
        p = big[tuple(slice(1, 1 + 2 * s, 2) for s in a.shape)]
        p[...] = a
    elif kind == "rowsliced":
        shape = tuple(2 * s + 1 for s in a.shape[:-1]) + (a.shape[-1] + 5,)
        big = np.full(shape, _fill_value(a.dtype), dtype=a.dtype)
        p = big[tuple(slice(1, 1 + 2 * s, 2) for s in a.shape[:-1]) + (slice(3, 3 + a.shape[-1]),)]
        p[...] = a
    elif kind == "neg":
        p = np.flip(np.ascontiguousarray(np.flip(a)))
    elif kind == "negrows":
        axes = tuple(range(a.ndim - 1))
        p = np.flip(np.ascontiguousarray(np.flip(a, axis=axes)), axis=axes)
    elif kind == "readonly":
        p = a.copy()
        p.flags.writeable = False
    elif kind == "unaligned":
        buf = bytearray(a.nbytes + a.itemsize + 1)
        p = np.frombuffer(buf, dtype=a.dtype, count=a.size, offset=1).reshape(a.shape)
        p[...] = a
    elif kind == "bigendian":
        p = a.astype(a.dtype.newbyteorder(">")) if a.dtype.kind in "fiu" else a.copy()
    elif kind == "bcastrows":
        if a.shape[-2] > 0:
            p = np.broadcast_to(a[..., :1, :], a.shape)
            a = np.array(p)
        else:
            p = a.copy()
    else:  # pragma: no cover
        raise AssertionError(kind)
    assert np.array_equal(np.asarray(p), a, equal_nan=True)
    return a, p


class Case:
    """One drawn attention problem: logical (C, native) arrays for the reference, physical ones
    for fastattn, and the keyword arguments."""

    def __repr__(self):
        d = {k: (f"{v.dtype}{v.shape} strides={v.strides}" if isinstance(v, np.ndarray) else v)
             for k, v in vars(self).items() if not k.startswith("log_")}
        return f"Case({d})"


def _draw_lead_for(draw, lead, keep_head):
    """A leading shape that broadcasts to `lead`: some leading dims dropped, some set to 1."""
    n = len(lead)
    min_keep = 1 if keep_head else 0
    keep = draw(st.integers(min_keep, n)) if n else 0
    sub = list(lead[n - keep:])
    for i in range(len(sub) - (1 if keep_head else 0)):
        if draw(st.booleans()):
            sub[i] = 1
    return sub


@st.composite
def cases(draw, causal=None, gqa=None, mask_kinds=("none", "bool", "float", "float_inf"),
          layouts=True, mixed=True, force_float_mask=False):
    c = Case()
    L = draw(st.sampled_from(SIZES_LS))
    S = draw(st.sampled_from(SIZES_LS))
    E = draw(st.sampled_from(SIZES_E))
    Ev = draw(st.sampled_from(SIZES_E))
    nlead = draw(st.integers(0, 3))
    lead = [draw(st.sampled_from([1, 1, 2, 3] + ([0] if draw(st.integers(0, 15)) == 0 else [])))
            for _ in range(nlead)]
    use_gqa = draw(st.booleans()) if gqa is None else gqa
    use_gqa = use_gqa and nlead >= 1
    hk = g = 1
    if use_gqa:
        hk = draw(st.sampled_from([1, 2]))
        g = draw(st.sampled_from([1, 2, 3]))
        lead[-1] = hk * g
    n = int(np.prod(lead)) if lead else 1
    while max(n, 1) * L * S * (E + Ev + 1) > COST_LIMIT:
        if L >= S:
            L //= 2
        else:
            S //= 2
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)

    base = draw(st.sampled_from([np.float32, np.float64]))
    dts = {"q": base, "k": base, "v": base}
    if mixed and draw(st.integers(0, 4)) == 0:
        who = draw(st.sampled_from(["q", "k", "v"]))
        dts[who] = draw(st.sampled_from([np.float16, np.int8, np.float64, np.float32, np.bool_]))

    q_lead = _draw_lead_for(draw, lead, use_gqa)
    k_lead = _draw_lead_for(draw, lead, use_gqa)
    v_lead = _draw_lead_for(draw, lead, use_gqa)
    if use_gqa:
        q_lead[-1] = hk * g
        k_lead[-1] = v_lead[-1] = hk
        # the non-head dims of k and v must agree where both are present (k/v broadcast
        # together); take v's from k's
        v_lead = k_lead[len(k_lead) - len(v_lead):] if len(v_lead) <= len(k_lead) else v_lead
        v_lead = list(v_lead[:-1]) + [hk]
    qmag = draw(st.sampled_from([0.1, 1.0, 3.0]))

    def values(shape, dt, mag=1.0):
        dt = np.dtype(dt)
        if dt.kind == "b":
            return rng.random(shape) < 0.5
        if dt.kind in "iu":
            return rng.integers(-3, 4, size=shape).astype(dt)
        return (rng.standard_normal(shape) * mag).astype(dt)

    q = values(tuple(q_lead) + (L, E), dts["q"], qmag)
    k = values(tuple(k_lead) + (S, E), dts["k"])
    v = values(tuple(v_lead) + (S, Ev), dts["v"], draw(st.sampled_from([1.0, 100.0])))

    kind = "float" if force_float_mask else draw(st.sampled_from(mask_kinds))
    mask = None
    if kind != "none":
        form = draw(st.sampled_from(["LS", "1S", "L1", "11", "S", "scalar"]))
        tail = {"LS": (L, S), "1S": (1, S), "L1": (L, 1), "11": (1, 1), "S": (S,), "scalar": ()}[form]
        mlead = []
        if len(tail) == 2:
            mlead = _draw_lead_for(draw, lead, False)
            if draw(st.integers(0, 5)) == 0:
                mlead = [2] + [1] * len(lead)      # a mask that adds a leading dimension
        shape = tuple(mlead) + tail
        if kind == "bool":
            p_allow = draw(st.sampled_from([0.0, 0.3, 0.8, 1.0]))
            mask = rng.random(shape) < p_allow
        else:
            mdt = draw(st.sampled_from([np.float32, np.float64, np.float16]))
            mask = np.asarray(rng.standard_normal(shape) * 2)
            if kind == "float_inf":
                p_inf = draw(st.sampled_from([0.2, 0.6, 1.0]))
                mask = np.where(rng.random(shape) < p_inf, -np.inf, mask)
            mask = np.asarray(mask).astype(mdt)
        n_out = int(np.prod(np.broadcast_shapes(tuple(lead), tuple(mlead)))) if mlead else n
        if max(n_out, 1) * L * S * (E + Ev + 1) > 4 * COST_LIMIT:
            mask = mask.reshape(-1)[:1].reshape(()) if mask.size else mask

    c.mask_kind = kind
    pick = (lambda: draw(st.sampled_from(LAYOUTS))) if layouts else (lambda: "C")
    c.layouts = (pick(), pick(), pick(), pick())
    c.log_q, c.q = apply_layout(q, c.layouts[0])
    c.log_k, c.k = apply_layout(k, c.layouts[1])
    c.log_v, c.v = apply_layout(v, c.layouts[2])
    c.log_mask, c.mask = (None, None) if mask is None else apply_layout(mask, c.layouts[3])
    c.is_causal = draw(st.booleans()) if causal is None else causal
    c.enable_gqa = use_gqa
    c.scale = draw(st.one_of(st.none(), st.sampled_from([0.0, 1e-3, 0.125, 2.5, -1.0]),
                             st.floats(-3, 3, allow_nan=False)))
    c.n_threads = draw(st.sampled_from([None, 1, 2, 3]))
    c.seed = seed
    return c


def run(c, **over):
    kw = dict(attn_mask=c.mask, is_causal=c.is_causal, scale=c.scale, enable_gqa=c.enable_gqa,
              n_threads=c.n_threads, return_weights=True)
    kw.update(over)
    return f(c.q, c.k, c.v, **kw)


def out_lead(c, mask=None):
    hq = c.log_q.shape[-3] if c.log_q.ndim >= 3 else 1
    leads = [c.log_q.shape[:-2]]
    for a in (c.log_k, c.log_v):
        ld = a.shape[:-2]
        leads.append(ld[:-1] + (hq,) if c.enable_gqa else ld)
    if mask is not None and mask.ndim > 2:
        leads.append(mask.shape[:-2])
    return np.broadcast_shapes(*leads)


def reference(c, **over):
    kw = dict(attn_mask=c.log_mask, is_causal=c.is_causal, scale=c.scale,
              enable_gqa=c.enable_gqa)
    kw.update(over)
    # the reference broadcasts leading dims through q @ k.T only: give q the full leading shape
    q = np.broadcast_to(c.log_q, out_lead(c, kw["attn_mask"]) + c.log_q.shape[-2:])
    return sdpa_ref(q, c.log_k, c.log_v, **kw)


def tolerance(c, dtype):
    """Error bound for one output entry relative to max|value|: a few ulps of the dtype times
    the magnitude of the scores (their rounding error moves the weights)."""
    eps = np.finfo(dtype).eps
    q = np.abs(c.log_q.astype(np.float64))
    k = np.abs(c.log_k.astype(np.float64))
    E = q.shape[-1]
    scale = (1.0 / np.sqrt(E) if E else 1.0) if c.scale is None else c.scale
    smax = float(np.max(q.max(axis=-2, initial=0).sum(-1), initial=0)) * \
        float(np.max(k, initial=0)) * abs(scale)
    if c.log_mask is not None and c.log_mask.dtype.kind == "f":
        fin = np.abs(c.log_mask[np.isfinite(c.log_mask)].astype(np.float64))
        smax += float(fin.max(initial=0))
    return 64 * eps * (smax + 1)


def allowed_keys(c, shape):
    """bool (*lead, L, S): which keys each query may attend to."""
    L, S = shape[-2:]
    allowed = np.ones((L, S), dtype=bool)
    if c.is_causal:
        allowed = np.tril(allowed)
    if c.log_mask is not None:
        m = c.log_mask
        allowed = allowed & (m if m.dtype == bool else (m != -np.inf))
    return np.broadcast_to(allowed, shape)


def gqa_expand(c, a):
    if c.enable_gqa and a.shape[-3] != c.log_q.shape[-3]:
        return np.repeat(a, c.log_q.shape[-3] // a.shape[-3], axis=-3)
    return a


def inputs_snapshot(c):
    return [None if a is None else np.array(a, copy=True) for a in (c.q, c.k, c.v, c.mask)]


def assert_inputs_unchanged(c, snap):
    for a, s in zip((c.q, c.k, c.v, c.mask), snap):
        if a is not None:
            assert np.array_equal(np.asarray(a), s, equal_nan=True), "an input was modified"


# ---------------------------------------------------------------- properties

@PROFILE
@given(c=cases())
def test_matches_reference_and_invariants(c):
    """Output and weights agree with the float64 reference; dtype/shape/layout as documented;
    weight rows sum to 1 or are exactly zero; output in the convex hull of allowed values."""
    EXAMPLES["matches_reference"] += 1
    note(repr(c))
    snap = inputs_snapshot(c)
    out, w = run(c)
    assert_inputs_unchanged(c, snap)
    ref_out, ref_w = reference(c)
    dt = expected_dtype(c.q.dtype, c.k.dtype, c.v.dtype)
    assert out.dtype == dt and w.dtype == dt
    assert out.flags.c_contiguous and w.flags.c_contiguous
    assert out.shape == ref_out.shape, (out.shape, ref_out.shape)
    assert w.shape == ref_w.shape

    tol = tolerance(c, dt)
    vmax = float(np.max(np.abs(c.log_v.astype(np.float64)), initial=0)) + 1e-300
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(w))
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=tol * max(vmax, 1.0))
    np.testing.assert_allclose(w, ref_w, rtol=0, atol=tol)

    # rows sum to one, or are all zero exactly where no key is allowed
    allowed = allowed_keys(c, w.shape)
    none = ~allowed.any(axis=-1)
    sums = w.astype(np.float64).sum(axis=-1)
    S = w.shape[-1]
    np.testing.assert_allclose(sums[~none], 1.0, rtol=0, atol=4 * S * np.finfo(dt).eps + 1e-6)
    assert np.all(w[none] == 0) and np.all(out[none] == 0)
    assert np.all(w[~allowed] == 0), "a forbidden key got weight"
    assert np.all(w >= 0)

    # convex hull: per output column, between the min and max over the allowed keys' values
    if out.size and S:
        vv = np.broadcast_to(gqa_expand(c, c.log_v.astype(np.float64)),
                             out.shape[:-2] + (S, out.shape[-1]))
        a = allowed[..., :, :, None]
        lo = np.where(a, vv[..., None, :, :], np.inf).min(axis=-2)
        hi = np.where(a, vv[..., None, :, :], -np.inf).max(axis=-2)
        slack = 8 * np.finfo(dt).eps * max(vmax, 1.0) * (1 + S)
        o = out.astype(np.float64)
        ok = ~none[..., None]
        assert np.all(((o >= lo - slack) & (o <= hi + slack))[np.broadcast_to(ok, o.shape)])


@PROFILE
@given(c=cases(mask_kinds=("float", "float_inf"), force_float_mask=True),
       shift=st.one_of(st.sampled_from([-30.0, -1.0, 0.5, 7.0, 30.0]), st.floats(-30, 30)))
def test_constant_added_to_every_score_changes_nothing(c, shift):
    """softmax(s + c) == softmax(s): adding a constant through the float mask (keeping -inf)."""
    EXAMPLES["shift_invariance"] += 1
    note(repr(c))
    # both masks in the compute dtype, so that the shift is the only difference
    dt = expected_dtype(c.q.dtype, c.k.dtype, c.v.dtype).type
    shifted = c.log_mask.astype(dt) + dt(shift)
    base = shifted - dt(shift)
    out0, w0 = run(c, attn_mask=base)
    out1, w1 = run(c, attn_mask=shifted)
    dt = out0.dtype
    tol = tolerance(c, dt) + 64 * np.finfo(dt).eps * abs(shift)
    vmax = max(float(np.max(np.abs(c.log_v.astype(np.float64)), initial=0)), 1.0)
    np.testing.assert_allclose(out1, out0, rtol=0, atol=tol * vmax)
    np.testing.assert_allclose(w1, w0, rtol=0, atol=tol)


@PROFILE
@given(c=cases(causal=False), data=st.data())
def test_permuting_keys_and_values_together_changes_nothing(c, data):
    EXAMPLES["key_permutation"] += 1
    note(repr(c))
    S = c.log_k.shape[-2]
    perm = np.array(data.draw(st.permutations(range(S))), dtype=np.intp)
    k2 = np.take(c.log_k, perm, axis=-2)
    v2 = np.take(c.log_v, perm, axis=-2)
    m2 = c.log_mask
    if m2 is not None and m2.ndim >= 1 and m2.shape[-1] == S and S > 1:
        m2 = np.take(m2, perm, axis=-1)
    out0, w0 = run(c)
    out1, w1 = f(c.q, k2, v2, attn_mask=m2, is_causal=False, scale=c.scale,
                 enable_gqa=c.enable_gqa, return_weights=True, n_threads=c.n_threads)
    dt = out0.dtype
    tol = tolerance(c, dt)
    vmax = max(float(np.max(np.abs(c.log_v.astype(np.float64)), initial=0)), 1.0)
    np.testing.assert_allclose(out1, out0, rtol=0, atol=tol * vmax)
    if c.log_v.shape[-1]:       # Ev == 0: known weights bug, see test_weights_with_empty_value_dim
        np.testing.assert_allclose(w1, np.take(w0, perm, axis=-1), rtol=0, atol=tol)


@PROFILE
@given(c=cases(causal=False), data=st.data())
def test_permuting_queries_permutes_the_output(c, data):
    EXAMPLES["query_permutation"] += 1
    note(repr(c))
    L = c.log_q.shape[-2]
    perm = np.array(data.draw(st.permutations(range(L))), dtype=np.intp)
    q2 = np.take(c.log_q, perm, axis=-2)
    m2 = c.log_mask
    if m2 is not None and m2.ndim >= 2 and m2.shape[-2] == L and L > 1:
        m2 = np.take(m2, perm, axis=-2)
    out0, w0 = run(c)
    out1, w1 = f(q2, c.k, c.v, attn_mask=m2, is_causal=False, scale=c.scale,
                 enable_gqa=c.enable_gqa, return_weights=True, n_threads=c.n_threads)
    dt = out0.dtype
    tol = tolerance(c, dt)
    vmax = max(float(np.max(np.abs(c.log_v.astype(np.float64)), initial=0)), 1.0)
    np.testing.assert_allclose(out1, np.take(out0, perm, axis=-2), rtol=0, atol=tol * vmax)
    np.testing.assert_allclose(w1, np.take(w0, perm, axis=-2), rtol=0, atol=tol)  # zeros if Ev == 0


@PROFILE
@given(c=cases(mixed=False))
def test_layout_does_not_change_the_bits(c):
    """The same values in any memory layout give bitwise the same result as C order."""
    EXAMPLES["layout_bitwise"] += 1
    note(repr(c))
    out0, w0 = f(np.ascontiguousarray(c.log_q), np.ascontiguousarray(c.log_k),
                 np.ascontiguousarray(c.log_v),
                 attn_mask=None if c.log_mask is None else np.ascontiguousarray(c.log_mask),
                 is_causal=c.is_causal, scale=c.scale, enable_gqa=c.enable_gqa,
                 return_weights=True)
    out1, w1 = run(c)
    assert np.array_equal(out0, out1, equal_nan=True)
    assert np.array_equal(w0, w1, equal_nan=True)


@st.composite
def softmax_cases(draw):
    nd = draw(st.integers(1, 3))
    shape = tuple(draw(st.sampled_from([0, 1, 2, 3, 7, 63, 64, 65, 257])) for _ in range(nd))
    while int(np.prod(shape)) > 200_000:
        shape = tuple(max(1, s // 2) for s in shape)
    axis = draw(st.integers(-nd, nd - 1))
    dt = draw(st.sampled_from([np.float32, np.float64]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = (rng.standard_normal(shape) * draw(st.sampled_from([0.1, 1.0, 30.0]))).astype(dt)
    if x.size and draw(st.booleans()):
        x[rng.random(shape) < 0.3] = -np.inf
    logical, phys = apply_layout(x, draw(st.sampled_from(LAYOUTS)))
    return logical, phys, axis


@PROFILE
@given(case=softmax_cases(), n_threads=st.sampled_from([None, 1, 2, 3]))
def test_softmax_matches_scipy(case, n_threads):
    scipy_special = pytest.importorskip("scipy.special")
    EXAMPLES["softmax_vs_scipy"] += 1
    logical, phys, axis = case
    note(f"{phys.dtype}{phys.shape} strides={phys.strides} axis={axis}")
    y = fastattn.softmax(phys, axis=axis, n_threads=n_threads)
    assert y.dtype == logical.dtype and y.shape == logical.shape
    if logical.size == 0:
        return
    with np.errstate(invalid="ignore"):
        ref = scipy_special.softmax(logical.astype(np.float64), axis=axis)
    eps = np.finfo(logical.dtype).eps
    np.testing.assert_allclose(y, ref, rtol=0, atol=16 * eps * max(logical.shape[axis], 1) ** 0.5,
                               equal_nan=True)


def test_weights_with_empty_value_dim():
    q = np.ones((3, 4), np.float32)
    k = np.ones((5, 4), np.float32)
    v = np.ones((5, 0), np.float32)
    out, w = f(q, k, v, return_weights=True)
    assert out.shape == (3, 0)
    np.testing.assert_allclose(w, np.full((3, 5), 0.2), atol=1e-6)
