"""Fixtures of the kernel tests."""
import pytest

from fastattn._kernels import _simd

# the kernel sets (one state for every kernel family), in the order of what they need from the
# CPU; 'avx2-wide' (the AVX-512 shapes compiled for AVX2) where the build has it (FASTATTN_DEBUG)
GEMM_ISAS = ["scalar", "baseline", "avx2"] + ["avx2-wide"] * _simd.HAVE_AVX2_WIDE + ["avx512"]
_ORDER = ["scalar", "baseline", "avx2", "avx512"]


@pytest.fixture(params=GEMM_ISAS)
def isa(request):
    """Runs the test with each kernel set the CPU supports selected (skips the others)."""
    name = request.param
    cpu = _simd.cpu_isa()
    if name == "avx2-wide":
        if cpu not in ("avx2", "avx512"):
            pytest.skip("needs AVX2")
    elif _ORDER.index(name) > _ORDER.index(cpu):
        pytest.skip(f"CPU runs up to {cpu}")
    before = _simd.isa()
    assert _simd.set_isa(name) == name
    yield name
    _simd.set_isa(before)
