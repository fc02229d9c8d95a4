"""The build: OpenMP really on (unless explicitly skipped), no unportable flags."""
import os

import pytest

import fastattn
from fastattn import _config
from fastattn._kernels import _attention as _k


def test_openmp_enabled():
    if os.environ.get("FASTATTN_SKIP_OPENMP_TEST"):
        pytest.skip("FASTATTN_SKIP_OPENMP_TEST is set")
    assert _k.openmp_enabled(), "fastattn was built without OpenMP (see the build log)"
    assert _config.config()["openmp"] is True


def test_no_unportable_flags():
    flags = _config.config()["compile_flags"]
    assert "-march=native" not in flags and "-ffast-math" not in flags and "-Ofast" not in flags


def test_simd_dispatch_reported():
    from fastattn._kernels import _qgemm, _simd
    cfg = _config.config()
    assert cfg["simd"] in ("avx512", "avx2", "baseline", "scalar")
    assert cfg["simd"] == _simd.cpu_isa()          # the best set available is in use ...
    if _simd.isa_cap() is None:                    # ... the CPU's best, without FASTATTN_ISA
        assert cfg["isa_cap"] == "none" and cfg["simd"] == cfg["cpu_simd"]
    assert cfg["int8_kernels"] == _qgemm.variant()
    assert set(cfg["cpu_int8"].split(", ")) <= {f"{f} {yn}" for f in ("avx512_vnni", "avx_vnni",
                                                                       "amx_int8")
                                                 for yn in ("yes", "no")}


def test_version_single_source():
    from fastattn._version import __version__
    assert fastattn.__version__ == __version__
