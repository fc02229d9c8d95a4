"""The one ISA state (fastattn/_kernels/_simd.pyx, simd.h, dispatch.c): one kernel set for
every kernel family, switched in one place."""
import numpy as np
import pytest

from fastattn import _ops
from fastattn._kernels import _attention, _gemm, _search, _simd


def test_names_and_levels():
    cpu = _simd.cpu_isa()
    assert cpu in ("scalar", "baseline", "avx2", "avx512")
    assert _simd.isa() == cpu                       # the CPU's best unless a test forced another
    assert _simd.ISA_NAMES[_simd.isa_level()] == _simd.isa()
    with pytest.raises(ValueError, match="isa must be one of"):
        _simd.set_isa("sse9")


def test_one_state_for_every_family():
    # the other modules' names are the state's own functions, not copies of a state
    assert _gemm.isa is _simd.isa and _gemm.set_isa is _simd.set_isa
    assert _gemm.isa_level is _simd.isa_level and _attention.isa is _simd.isa
    before = _simd.isa()
    try:
        assert _simd.set_isa("scalar") == "scalar"
        assert _gemm.blocking(4) == (4, 4, 256)    # the GEMM's scalar set
        assert _simd.set_isa("baseline") == "baseline"
        assert _gemm.blocking(4) == (4, 8, 256)    # ... and its baseline one
        # attention follows the same state: the scalar set's exp is libm's, the vector sets'
        # a polynomial (within 2 ulp, not always the same bits)
        x = np.linspace(-80, 0, 4001)
        y = {}
        for name in ("scalar", "baseline"):
            _simd.set_isa(name)
            y[name] = np.empty_like(x)
            _attention.kernel_exp(x, y[name])
        assert not np.array_equal(y["scalar"], y["baseline"])
        # search runs under every level (its builds give the same bits)
        z = _search.log_softmax_rows(np.linspace(-3, 3, 64).reshape(2, 32))
        _simd.set_isa("scalar")
        assert np.array_equal(_search.log_softmax_rows(np.linspace(-3, 3, 64).reshape(2, 32)), z)
    finally:
        _simd.set_isa(before)


def test_packed_weights_follow_the_state(rng=np.random.default_rng(3)):
    w = rng.standard_normal((20, 33)).astype(np.float32)
    x = rng.standard_normal((5, 33)).astype(np.float32)
    layer = _ops.PackedLinear(w)
    before = _simd.isa()
    try:
        want = x @ w.T
        for name in ("scalar", "baseline", before):
            _simd.set_isa(name)
            np.testing.assert_allclose(layer(x), want, rtol=1e-5, atol=1e-5)
    finally:
        _simd.set_isa(before)
