"""FASTATTN_ISA, the cap on every kernel family (fastattn/_kernels/_simd.pyx, dispatch.c): read
once at import, it gives the expected float kernel set and int8 and bfloat16 variants; the int8
and bfloat16 layers give the same bits under every value, the float kernel sets agree within the
float tolerances; an unknown
value, or one the CPU cannot run, fails the import with one line (and `fastattn info` exits with
that line, no traceback). Each value runs in a fresh process."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from fastattn._kernels import _qgemm, _simd
from reference import sdpa_ref
from tolerances import BLOCK_TOL, assert_close

HERE = os.path.dirname(os.path.abspath(__file__))
CAPS = ["scalar", "sse2", "avx2", "avx2-vnni", "avx512", "avx512-vnni", "avx512-bf16"]
RUNNABLE = _simd.valid_caps()
CPU = set(_simd.cpu_features())             # as detected, whatever FASTATTN_ISA says
# the float kernel set each value gives (the CPU has it, or the value is refused)
FLOAT_SET = {"scalar": "scalar", "sse2": "baseline", "avx2": "avx2", "avx2-vnni": "avx2",
             "avx512": "avx512", "avx512-vnni": "avx512", "avx512-bf16": "avx512"}


def int8_variant(cap):
    """The int8 variant a value gives on this CPU: the best not above the cap."""
    bw, vnni512, vnni256 = "avx512bw" in CPU, "avx512_vnni" in CPU, "avx_vnni" in CPU
    best256 = "avx2-vnni" if vnni256 else "avx2"
    top = ("avx512-vnni" if vnni512 else "avx512") if bw else best256
    return {"scalar": "scalar", "sse2": "scalar", "avx2": "avx2", "avx2-vnni": best256,
            "avx512": "avx512" if bw else "avx2", "avx512-vnni": top, "avx512-bf16": top}[cap]


def bf16_variant(cap):
    """The bfloat16 variant a value gives on this CPU: vdpbf16ps only under avx512-bf16."""
    bw = "avx512bw" in CPU
    wide = "avx512" if bw else "avx2"
    return {"scalar": "scalar", "sse2": "scalar", "avx2": "avx2", "avx2-vnni": "avx2",
            "avx512": wide, "avx512-vnni": wide,
            "avx512-bf16": "avx512-bf16" if bw and "avx512_bf16" in CPU else wide}[cap]


def int8_variants(features):
    """The int8 variants a CPU with these features (by name) runs, lowest first."""
    avx2 = {"avx2", "fma"} <= features
    avx512 = {"avx2", "fma", "avx512f", "avx512bw"} <= features
    return ["scalar"] + ["avx2"] * avx2 + ["avx2-vnni"] * (avx2 and "avx_vnni" in features) + \
        ["avx512"] * avx512 + ["avx512-vnni"] * (avx512 and "avx512_vnni" in features)


def env_with(value):
    env = dict(os.environ)
    env.pop("FASTATTN_ISA", None)
    if value is not None:
        env["FASTATTN_ISA"] = value
    return env


_CHILD = r"""
import json, sys
import numpy as np
import fastattn
from fastattn._kernels import _qgemm, _simd
path, out = sys.argv[1:3]
rng = np.random.default_rng(0)
x = rng.standard_normal((37, 70)).astype(np.float32)
w = rng.standard_normal((130, 70)).astype(np.float32)
b = rng.standard_normal(130).astype(np.float32)
ids = rng.integers(1, 200, (2, 9))
ra = np.random.default_rng(1)
q, k, v = (ra.standard_normal((2, 3, 17, 16)).astype(np.float32) for _ in range(3))
arrays = {
    "linear": fastattn.PackedLinear(w, b, "gelu", quantize="int8")(x),
    "bf16": fastattn.PackedLinear(w, b, "gelu", quantize="bfloat16")(x),
    "attention": fastattn.scaled_dot_product_attention(q, k, v),
}
if path != "-":                               # "-": no model (no safetensors to write one)
    arrays["model"] = fastattn.EncoderModel.from_pretrained(path, quantize="int8")(ids)
np.savez(out, **arrays)
picks = {"isa": _simd.isa(), "int8": _qgemm.variant(), "cap": _simd.isa_cap(),
         "best": _simd.cpu_isa(), "variants": _qgemm.cpu_variants(),
         "bf16": _qgemm.bf16_variant(), "bf16_variants": _qgemm.bf16_cpu_variants()}
# the testing aids stay under the cap: set_isa clamps, set_variant refuses what is above it
picks["set_isa_avx512"] = _simd.set_isa("avx512")
refused = []
for name in _qgemm.VARIANTS:
    try:
        _qgemm.set_variant(name)
    except ValueError:
        refused.append(name)
picks["refused"] = refused
picks["bf16_refused"] = []
for name in _qgemm.BF16_VARIANTS:
    try:
        _qgemm.set_bf16_variant(name)
    except ValueError:
        picks["bf16_refused"].append(name)
print(json.dumps(picks))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{value (None: no cap): (what the child picked, its arrays)} for every value this CPU
    runs, each in a fresh process."""
    tmp = tmp_path_factory.mktemp("isa-cap")
    model = "-"
    try:
        import safetensors  # noqa: F401  (the checkpoint writer's)
    except ImportError:
        pass
    else:
        from fastattn.benchmark._checkpoints import write_bert
        model = str(tmp / "bert")
        write_bert(model, hidden=32, layers=1, heads=2, intermediate=64, vocab_size=200)
    got = {}
    for value in [None] + RUNNABLE:
        out = str(tmp / f"{value}.npz")
        r = subprocess.run([sys.executable, "-c", _CHILD, model, out], capture_output=True,
                           text=True, env=env_with(value), timeout=300, cwd=HERE)
        assert r.returncode == 0, (value, r.stderr)
        with np.load(out) as z:
            got[value] = json.loads(r.stdout.strip().splitlines()[-1]), dict(z)
    return got


def test_every_value_is_known_and_the_lowest_run_everywhere():
    assert list(_simd.CAPS) == CAPS
    assert RUNNABLE[:2] == ["scalar", "sse2"]           # x86-64: SSE2 is the baseline
    assert RUNNABLE == [c for c in CAPS if c in RUNNABLE]


@pytest.mark.parametrize("value", CAPS)
def test_value_gives_its_kernel_set_and_int8_variant(runs, value):
    if value not in RUNNABLE:
        pytest.skip(f"CPU runs up to {RUNNABLE[-1]}")      # (ci/expected_skips.txt)
    picks, _ = runs[value]
    assert picks["cap"] == value
    assert picks["isa"] == picks["best"] == FLOAT_SET[value]
    assert picks["int8"] == int8_variant(value)
    assert picks["set_isa_avx512"] == FLOAT_SET[value]         # clamped to the cap
    assert picks["int8"] in picks["variants"]
    assert sorted(picks["refused"]) == sorted(set(_qgemm.VARIANTS) - set(picks["variants"]))
    assert picks["bf16"] == bf16_variant(value) and picks["bf16"] in picks["bf16_variants"]
    assert sorted(picks["bf16_refused"]) == sorted(set(_qgemm.BF16_VARIANTS) -
                                                   set(picks["bf16_variants"]))


def test_no_value_is_the_cpu_best(runs):
    picks, _ = runs[None]
    assert picks["cap"] is None
    assert picks["isa"] == _simd.cpu_isa(capped=False)
    assert picks["int8"] == int8_variant(RUNNABLE[-1])
    # every variant the CPU has, and only those (AVX-512 VNNI without AVX-VNNI, as on Zen 4,
    # refuses avx2-vnni)
    assert picks["variants"] == int8_variants(CPU)
    assert sorted(picks["refused"]) == sorted(set(_qgemm.VARIANTS) - set(picks["variants"]))
    assert picks["bf16"] == bf16_variant(RUNNABLE[-1])
    assert sorted(picks["bf16_refused"]) == sorted(set(_qgemm.BF16_VARIANTS) -
                                                   set(picks["bf16_variants"]))


@pytest.mark.parametrize("layer", ["linear", "bf16"])
def test_int8_and_bf16_linear_same_bits_under_every_value(runs, layer):
    want = runs[None][1][layer].view(np.uint32)
    for value in RUNNABLE:
        np.testing.assert_array_equal(runs[value][1][layer].view(np.uint32), want, err_msg=value)


def test_int8_model_same_bits_wherever_the_float_set_is_the_same(runs):
    """The int8 layers give the same bits on every variant; the attention and the norms between
    them are float kernels, the same bits within one kernel set (avx2 and avx2-vnni, avx512,
    avx512-vnni and avx512-bf16 differ in the int8 / bfloat16 variants only) and within the float
    tolerance across sets."""
    pytest.importorskip("safetensors")
    by_set = {}
    for value in [None] + RUNNABLE:
        picks, arrays = runs[value]
        first = by_set.setdefault(picks["isa"], arrays["model"])
        np.testing.assert_array_equal(arrays["model"], first, err_msg=str(value))
        tol = BLOCK_TOL[np.float32]
        np.testing.assert_allclose(arrays["model"], runs[None][1]["model"], rtol=tol, atol=tol,
                                   err_msg=str(value))


def test_float_attention_under_every_value(runs):
    ra = np.random.default_rng(1)                      # the child's inputs
    q, k, v = (ra.standard_normal((2, 3, 17, 16)).astype(np.float32) for _ in range(3))
    want = sdpa_ref(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))[0]
    by_set = {}
    for value in [None] + RUNNABLE:
        picks, arrays = runs[value]
        assert_close(arrays["attention"], want, np.float32)
        np.testing.assert_array_equal(arrays["attention"],
                                      by_set.setdefault(picks["isa"], arrays["attention"]))


def test_one_detector_agrees_with_the_kernel():
    """dispatch.c's CPUID + XGETBV against Linux's flags (the kernel drops a flag whose register
    state it does not save), by the same names."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(ln for ln in f if ln.startswith("flags")).split(":", 1)[1].split()
    except (OSError, StopIteration):
        pytest.skip("no x86 /proc/cpuinfo")
    named = set(_simd.FEATURE_NAMES.values()) - {"base"}
    assert CPU - {"base"} == named & set(flags)


def test_int8_variants_read_the_capped_features():
    assert _qgemm.cpu_variants() == int8_variants(set(_simd.cpu_features(capped=True)))


# --- refused values -----------------------------------------------------------------------------

def _bits(*names):
    inverse = {n: b for b, n in _simd.FEATURE_NAMES.items()}
    return sum(inverse[n] for n in names)


def test_message_for_a_value_above_the_cpu():
    avx2_cpu = _bits("base", "avx2", "fma")
    assert _simd.caps_for(avx2_cpu) == ["scalar", "sse2", "avx2", "avx2-vnni"]
    for value in ("avx512", "avx512-vnni", "avx512-bf16"):
        with pytest.raises(ValueError) as err:
            _simd._read_cap(value, avx2_cpu)
        msg = str(err.value)
        assert msg == (f"FASTATTN_ISA='{value}' is above what this CPU can run; valid values: "
                       "scalar, sse2, avx2, avx2-vnni, avx512, avx512-vnni, avx512-bf16 (on this "
                       "CPU: scalar, sse2, avx2, avx2-vnni)")
    # avx2-vnni on an AVX2 CPU without AVX-VNNI runs, with the int8 variant avx2
    assert _simd._read_cap("avx2-vnni", avx2_cpu)[0] == "avx2-vnni"
    assert _simd.caps_for(_bits("base")) == ["scalar", "sse2"]
    assert _simd._read_cap(" AVX512_VNNI ", _bits("base", "avx2", "fma", "avx512f"))[0] == \
        "avx512-vnni"
    assert _simd._read_cap("", 0) == _simd._read_cap(None, 0) == (None, 0xFFFFFFFF)
    # avx512-vnni is everything but vdpbf16ps; avx512-bf16 everything
    avx512 = _bits("base", "avx2", "fma", "avx512f", "avx512bw")
    assert _simd._read_cap("avx512-vnni", avx512)[1] & _bits("avx512_bf16") == 0
    assert _simd._read_cap("avx512-vnni", avx512)[1] & _bits("avx512_vnni", "avx_vnni")
    assert _simd._read_cap("avx512-bf16", avx512) == ("avx512-bf16", 0xFFFFFFFF)


def _import_fails(value):
    r = subprocess.run([sys.executable, "-c", "import fastattn"], capture_output=True,
                       text=True, env=env_with(value), timeout=120, cwd=HERE)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: FASTATTN_ISA=")
    assert repr(value) in last and all(c in last for c in CAPS)
    return last


def _command_fails(cmd, value):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env_with(value), timeout=120,
                       cwd=HERE)
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith(f"fastattn: error: FASTATTN_ISA={value!r} ")
    assert all(c in lines[0] for c in CAPS)


@pytest.mark.parametrize("value", ["avx1024", "sse4"])
def test_unknown_value_fails_the_import_in_one_line(value):
    assert "is not a valid value" in _import_fails(value)
    _command_fails([sys.executable, "-m", "fastattn", "info"], value)


def test_value_above_the_cpu_fails_the_import_in_one_line():
    """Every value this CPU cannot run (none on an AVX-512 VNNI CPU: test_message_for_a_value_
    above_the_cpu checks the message for an AVX2 CPU in this process)."""
    for value in (c for c in CAPS if c not in RUNNABLE):
        assert "is above what this CPU can run" in _import_fails(value)
        _command_fails([sys.executable, "-m", "fastattn", "info"], value)


def test_the_command_script_fails_in_one_line(tmp_path):
    # what pip writes as the `fastattn` console script (its name is what tells the package)
    script = tmp_path / "fastattn"
    script.write_text("import sys\nfrom fastattn.__main__ import main\nsys.exit(main())\n")
    _command_fails([sys.executable, str(script), "info"], "bogus")


def test_info_shows_the_kernels_and_the_cap():
    r = subprocess.run([sys.executable, "-m", "fastattn", "info"], capture_output=True,
                       text=True, env=env_with("sse2"), timeout=300, cwd=HERE)
    assert r.returncode == 0, r.stderr
    rows = dict(ln.strip().split(" : ", 1) for ln in r.stdout.splitlines() if " : " in ln)
    rows = {k.strip(): v for k, v in rows.items()}
    assert rows["simd"] == "baseline" and rows["int8_kernels"] == "scalar"
    assert rows["bf16_kernels"] == "scalar"
    assert rows["cpu_bf16"] == f"avx512_bf16 {'yes' if 'avx512_bf16' in CPU else 'no'}"
    assert rows["isa_cap"] == "sse2 (FASTATTN_ISA)"
    assert rows["cpu_simd"] == _simd.cpu_isa(capped=False)
    for flag in ("avx512_vnni", "avx_vnni", "amx_int8"):
        assert f"{flag} {'yes' if flag in CPU else 'no'}" in rows["cpu_int8"]
    assert "FASTATTN_ISA=sse2" in r.stdout                     # the env line
