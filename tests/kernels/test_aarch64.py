"""AArch64's detection, caps and kernel choice (ci/test_aarch64.sh runs them under emulation;
on x86-64 only the x86 side of the same switch is checked here)."""
import os
import subprocess
import tempfile
import sys

import pytest

from fastattn._kernels import _qgemm, _simd

arm = pytest.mark.skipif(not _simd.ARM64, reason="CPU has no aarch64")


def _run(code, cap):
    env = dict(os.environ)
    env.pop("FASTATTN_ISA", None)
    if cap is not None:
        env["FASTATTN_ISA"] = cap
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300, cwd=tempfile.gettempdir())   # `-c` imports from the cwd


@arm
def test_caps_and_features_are_arms():
    assert list(_simd.CAPS) == ["scalar", "neon", "dotprod", "i8mm"]
    assert _simd.cpu_features()[0] == "base"                 # NEON: part of ARMv8-A
    assert set(_simd.cpu_features()) <= {"base", "asimddp", "i8mm", "bf16"}
    assert _simd.cpu_isa() == "baseline"
    assert _simd.valid_caps()[:2] == ["scalar", "neon"]


@arm
@pytest.mark.parametrize("cap,variant", [("scalar", "scalar"), ("neon", "neon"),
                                         ("dotprod", "dotprod"), ("i8mm", "i8mm")])
def test_cap_picks_the_variant(cap, variant):
    have = _simd.cpu_features()
    need = {"dotprod": "asimddp", "i8mm": "i8mm"}.get(variant)
    if need is not None and need not in have:
        pytest.skip(f"this CPU has no {need}")
    out = _run("import fastattn; from fastattn._kernels import _qgemm, _simd; "
               "print(_simd.isa(), _qgemm.variant()); fastattn.show_config()", cap)
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0].split()
    assert first == ["scalar" if cap == "scalar" else "baseline", variant]
    assert f"int8_kernels  : {variant}" in out.stdout
    assert f"isa_cap       : {cap} (FASTATTN_ISA)" in out.stdout
    assert "cpu_int8      : asimddp" in out.stdout


@arm
def test_x86_cap_names_are_refused_by_name():
    out = _run("import fastattn", "avx2")
    assert out.returncode != 0
    assert "FASTATTN_ISA='avx2' is not a valid value; valid values: scalar, neon, dotprod, i8mm" \
        in out.stderr


@arm
def test_every_arm_variant_is_offered():
    """qemu's CPU (and every ARMv8.6 core) has both extensions: all four variants run."""
    assert set(_qgemm.cpu_variants()) >= {"scalar", "neon"}
    names = set(_qgemm.VARIANTS)
    assert {"neon", "dotprod", "i8mm"} <= names


def test_x86_build_offers_no_arm_variant():
    if _simd.ARM64:
        pytest.skip("CPU has no x86-64")
    assert "neon" not in _simd.CAPS and "i8mm" not in _simd.CAPS
    assert not {"neon", "dotprod", "i8mm"} & set(_qgemm.cpu_variants())
    for name in ("neon", "dotprod", "i8mm"):
        with pytest.raises(ValueError, match="cannot run the int8 kernel variant"):
            _qgemm.set_variant(name)
