"""The portable attention (fa_portable.c): what the int8 models run, the same bits on every kernel
set and architecture. Against the float64 reference for its accuracy, and bit for bit across the
kernel sets this CPU has, thread counts and batch compositions (ci/test_aarch64.sh runs this file
under emulated AArch64 too; tests/kernels/test_int8_digest.py compares whole int8 models with the
digest recorded on x86)."""
import math

import numpy as np
import pytest

import fastattn
from fastattn import scaled_dot_product_attention as sdpa
from fastattn._kernels import _attention as _k
from fastattn._kernels import _simd
from reference import sdpa_ref

# every kernel set this CPU (and build) can run
SETS = [s for s in ("scalar", "baseline", "avx2", "avx2-wide", "avx512")
        if (s != "avx2-wide" or _simd.HAVE_AVX2_WIDE)
        and _simd.set_isa(s) == s]
_simd.set_isa(_simd.cpu_isa())

# (B, H, L, S, E, Ev, causal, mask): full-sequence passes (packed tiles, several key tiles past
# 512 keys), decode steps read in place, key splits past 2048 keys, ragged head sizes
CASES = [
    (2, 3, 37, 53, 48, 40, False, None),
    (1, 2, 130, 700, 64, 64, True, None),
    (2, 2, 20, 33, 24, 24, False, "bool"),
    (3, 4, 1, 77, 64, 64, False, "float"),
    (1, 2, 4, 2500, 32, 32, False, None),
    (1, 1, 9, 600, 80, 72, True, "bool"),
]


def _inputs(case, seed=0):
    B, H, L, S, E, Ev, causal, mask = case
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, L, E)).astype(np.float32)
    k = rng.standard_normal((B, H, S, E)).astype(np.float32)
    v = rng.standard_normal((B, H, S, Ev)).astype(np.float32)
    m = None
    if mask == "bool":
        m = rng.random((B, 1, L, S)) > 0.3
        m[..., 0] = True
    elif mask == "float":
        m = np.where(rng.random((B, 1, L, S)) > 0.3, 0.0, -np.inf).astype(np.float32)
        m[..., 0] = 0.0
    return q, k, v, m, causal


def _portable(q, k, v, m, causal, n_threads=None):
    return sdpa(q, k, v, m, is_causal=causal, n_threads=n_threads, _portable=True)


@pytest.mark.parametrize("case", CASES)
def test_close_to_float64_reference(case):
    q, k, v, m, causal = _inputs(case)
    got = _portable(q, k, v, m, causal)
    want = sdpa_ref(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), m,
                    is_causal=causal)[0]
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("case", CASES)
def test_same_bits_on_every_kernel_set_and_thread_count(case):
    q, k, v, m, causal = _inputs(case, seed=1)
    before = _simd.isa()
    try:
        _simd.set_isa(SETS[0])
        ref = _portable(q, k, v, m, causal, n_threads=1)
        for s in SETS:
            assert _simd.set_isa(s) == s
            for t in (1, 2, 3):
                got = _portable(q, k, v, m, causal, n_threads=t)
                assert got.tobytes() == ref.tobytes(), (s, t)
    finally:
        _simd.set_isa(before)


def test_batch_rows_are_their_own():
    """A sequence alone gives the bits it gives inside a batch (the promise of every path)."""
    q, k, v, m, causal = _inputs(CASES[0], seed=2)
    whole = _portable(q, k, v, m, causal)
    for b in range(q.shape[0]):
        alone = _portable(q[b:b + 1], k[b:b + 1], v[b:b + 1], m, causal)
        assert alone.tobytes() == whole[b:b + 1].tobytes()


def test_weights_output_matches_reference():
    q, k, v, m, causal = _inputs(CASES[2], seed=3)
    out, w = sdpa(q, k, v, m, return_weights=True, _portable=True)
    want_w = sdpa_ref(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), m)[1]
    np.testing.assert_allclose(w, want_w, rtol=2e-5, atol=2e-7)


def test_exp_det_against_libm():
    """fa_exp_det, the portable rescales' exp: within 4 ulp of libm's over its whole range,
    exp(0) = 1 exactly, 0 below the least subnormal and at -inf, NaN kept."""
    xs = np.concatenate([-np.logspace(-12, math.log10(740), 4000), np.linspace(-30, 0, 3001)])
    for x in xs:
        got, want = _k.exp_det(float(x)), math.exp(float(x))
        assert abs(got - want) <= 4 * math.ulp(want), (x, got, want)
    assert _k.exp_det(0.0) == 1.0 and _k.exp_det(-0.0) == 1.0
    assert _k.exp_det(-746.0) == 0.0 and _k.exp_det(-math.inf) == 0.0
    assert math.isnan(_k.exp_det(math.nan))


def test_nonfinite_inputs_propagate_like_the_float_kernels():
    q, k, v, m, causal = _inputs(CASES[0], seed=4)
    k[0, 0, 5, 3] = np.nan
    v[1, 2, 7, 0] = np.inf
    got = _portable(q, k, v, m, causal)
    ref = sdpa(q, k, v, m, is_causal=causal)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))


def test_int8_models_run_it():
    """An int8 model's attention is the portable one: its output is the same on every kernel
    set (a float32 model's is not required to be)."""
    model = fastattn.Transformer(d_model=32, nhead=4, num_encoder_layers=1, num_decoder_layers=1,
                                 dim_feedforward=48, norm_first=True, seed=1)
    model.quantize_("int8")
    rng = np.random.default_rng(5)
    src = rng.standard_normal((2, 9, 32)).astype(np.float32)
    tgt = rng.standard_normal((2, 7, 32)).astype(np.float32)
    before = _simd.isa()
    try:
        outs = []
        for s in SETS:
            _simd.set_isa(s)
            outs.append(model(src, tgt, tgt_is_causal=True).tobytes())
        assert len(set(outs)) == 1
    finally:
        _simd.set_isa(before)
