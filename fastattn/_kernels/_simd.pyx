# cython: language_level=3
# The kernels' one ISA state, the FASTATTN_ISA cap and their Python face (simd.h, dispatch.c).
#
#   Every kernel family (attention, GEMM and activations, LayerNorm and the embedding, beam
#   search's rows) has a build per kernel set: plain C ('scalar'), generic vectors at the
#   baseline ISA ('baseline': SSE2 on x86-64, NEON on AArch64, where it is the best set), AVX2 + FMA ('avx2'), AVX-512F ('avx512') and, in
#   FASTATTN_DEBUG builds only (HAVE_AVX2_WIDE), for the tests on machines without AVX-512, the
#   AVX-512 shapes compiled for AVX2 ('avx2-wide').
#   One C variable (dispatch.c, compiled into this extension only) says which set runs; the
#   other extensions read it through isa_now() (_simd.pxd) at each call. At import it is the
#   best set available; set_isa() forces another (a testing aid). Beam search has no 'scalar'
#   and no 'avx2-wide' build: under those it runs its baseline / AVX2 build (every build of it
#   gives the same bits).
#
#   The CPU is detected in one place (dispatch.c: CPUID + XGETBV; on AArch64 the HWCAP words
#   or macOS's sysctl). FASTATTN_ISA, read once here
#   at import, caps what the kernels may use of it, as oneDNN's ONEDNN_MAX_CPU_ISA does: every
#   choice (the kernel set, the int8 GEMM's variant, set_isa's clamp, set_variant's check) sees
#   the CPU's features less those above the cap. A value the CPU cannot run (its kernel set is
#   missing) or an unknown one makes the import fail (ValueError, one line).

import os

cdef extern from "simd.h" nogil:
    int FA_ISA_SCALAR, FA_ISA_BASE, FA_ISA_AVX2, FA_ISA_AVX512, FA_ISA_AVX2_WIDE
    int FA_HAVE_AVX2_WIDE
    unsigned FA_CPU_BASE, FA_CPU_AVX2, FA_CPU_FMA, FA_CPU_AVX512F, FA_CPU_AVX512BW
    unsigned FA_CPU_AVX512VL, FA_CPU_AVX512_VNNI, FA_CPU_AVX_VNNI, FA_CPU_AMX_TILE
    unsigned FA_CPU_AMX_INT8, FA_CPU_F16C, FA_CPU_AVX512_BF16
    unsigned FA_CPU_DOTPROD, FA_CPU_I8MM, FA_CPU_ARM_BF16
    int FA_ARM64
    unsigned fa_cpu_features()
    unsigned fa_isa_features()
    int fa_isa_cap(unsigned allowed)
    int fa_level_of(unsigned features)
    int fa_cpu_level()
    int fa_isa_now()
    int fa_isa_select(int level)

ISA_NAMES = {FA_ISA_SCALAR: "scalar", FA_ISA_BASE: "baseline", FA_ISA_AVX2: "avx2",
             FA_ISA_AVX512: "avx512", FA_ISA_AVX2_WIDE: "avx2-wide"}
# whether this build has the test-only 'avx2-wide' set (FASTATTN_DEBUG builds on x86; elsewhere
# set_isa('avx2-wide') is clamped like a set the CPU lacks)
HAVE_AVX2_WIDE = bool(FA_HAVE_AVX2_WIDE)
# whether this build is for AArch64 (the baseline vectors are NEON; the caps below are ARM's)
ARM64 = bool(FA_ARM64)
# the CPU features, by the names Linux's /proc/cpuinfo gives them ('base': the baseline vectors,
# SSE2 on x86-64, NEON on AArch64)
if ARM64:
    FEATURE_NAMES = {FA_CPU_BASE: "base", FA_CPU_DOTPROD: "asimddp", FA_CPU_I8MM: "i8mm",
                     FA_CPU_ARM_BF16: "bf16"}
else:
    FEATURE_NAMES = {FA_CPU_BASE: "base", FA_CPU_AVX2: "avx2", FA_CPU_FMA: "fma",
                     FA_CPU_AVX512F: "avx512f", FA_CPU_AVX512BW: "avx512bw",
                     FA_CPU_AVX512VL: "avx512vl", FA_CPU_AVX512_VNNI: "avx512_vnni",
                     FA_CPU_AVX_VNNI: "avx_vnni", FA_CPU_AMX_TILE: "amx_tile",
                     FA_CPU_AMX_INT8: "amx_int8", FA_CPU_F16C: "f16c",
                     FA_CPU_AVX512_BF16: "avx512_bf16"}

# FASTATTN_ISA's values, lowest first, and the features each lets the kernels use: kernel set
# scalar / baseline / avx2 / avx512, the int8 GEMM's VNNI variants only under the -vnni values
# and up, the bfloat16 GEMM's vdpbf16ps variant only under avx512-bf16
# On AArch64: scalar, neon (the baseline kernel set; the int8 GEMM on widening NEON multiplies),
# dotprod (the int8 GEMM on SDOT), i8mm (on USMMLA / SUDOT); the float kernels are NEON's under
# all three.
_AVX2 = FA_CPU_BASE | FA_CPU_AVX2 | FA_CPU_FMA | FA_CPU_F16C
_AVX512 = _AVX2 | FA_CPU_AVX512F | FA_CPU_AVX512BW | FA_CPU_AVX512VL
if ARM64:
    CAPS = {"scalar": 0, "neon": FA_CPU_BASE, "dotprod": FA_CPU_BASE | FA_CPU_DOTPROD,
            "i8mm": FA_CPU_BASE | FA_CPU_DOTPROD | FA_CPU_I8MM | FA_CPU_ARM_BF16}
else:
    CAPS = {"scalar": 0, "sse2": FA_CPU_BASE, "avx2": _AVX2, "avx2-vnni": _AVX2 | FA_CPU_AVX_VNNI,
            "avx512": _AVX512, "avx512-vnni": 0xFFFFFFFF & ~FA_CPU_AVX512_BF16,
            "avx512-bf16": 0xFFFFFFFF}


def caps_for(features):
    """The FASTATTN_ISA values a CPU with these features (FA_CPU_* bits, as cpu_features gives
    them by name: FEATURE_NAMES) can run: those whose kernel set it has."""
    return [n for n, m in CAPS.items() if fa_level_of(features & m) == fa_level_of(m)]


def valid_caps():
    """The FASTATTN_ISA values this CPU can run, lowest first."""
    return caps_for(fa_cpu_features())


def _read_cap(value, features):
    """FASTATTN_ISA's value -> (its name, the features it allows), for a CPU with `features`;
    ValueError (one line, naming the variable, the value and the valid values) for an unknown
    value or one the CPU cannot run. Unset or empty: no cap. Case and '_' for '-' are free."""
    if value is None or not value.strip():
        return None, 0xFFFFFFFF
    name = value.strip().lower().replace("_", "-")
    here = caps_for(features)
    valid = f"valid values: {', '.join(CAPS)}"
    if len(here) < len(CAPS):
        valid += f" (on this CPU: {', '.join(here)})"
    if name not in CAPS:
        raise ValueError(f"FASTATTN_ISA={value!r} is not a valid value; {valid}")
    if name not in here:
        raise ValueError(f"FASTATTN_ISA={value!r} is above what this CPU can run; {valid}")
    return name, CAPS[name]


_cap_name, _cap_mask = _read_cap(os.environ.get("FASTATTN_ISA"), fa_cpu_features())
fa_isa_cap(_cap_mask)


cdef int isa_now() noexcept nogil:
    return fa_isa_now()


cdef unsigned isa_features() noexcept nogil:
    return fa_isa_features()


def isa():
    """Name of the kernel set in use ('avx512', 'avx2', 'baseline', 'scalar' or 'avx2-wide')."""
    return ISA_NAMES[fa_isa_now()]


def isa_level():
    """The kernel set in use as a number (FA_ISA_*: 0 scalar ... 3 avx512, 4 avx2-wide)."""
    return fa_isa_now()


def cpu_isa(capped=True):
    """Best kernel set available: the running CPU's best not above the FASTATTN_ISA cap
    (capped=False: the CPU's best)."""
    return ISA_NAMES[fa_cpu_level() if capped else fa_level_of(fa_cpu_features())]


def isa_cap():
    """The FASTATTN_ISA value in force (x86-64: 'scalar', 'sse2', 'avx2', 'avx2-vnni', 'avx512',
    'avx512-vnni', 'avx512-bf16'; AArch64: 'scalar', 'neon', 'dotprod', 'i8mm'), or None: no
    cap."""
    return _cap_name


def cpu_features(capped=False):
    """The CPU's features as detected (CPUID, and XGETBV for what the OS enables), by name:
    'base' (the baseline vectors: SSE2 on x86-64), 'avx2', 'fma', 'avx512f', 'avx512bw',
    'avx512vl', 'avx512_vnni', 'avx_vnni', 'amx_tile', 'amx_int8', 'f16c', 'avx512_bf16'
    (AArch64: 'base' for NEON, 'asimddp', 'i8mm', 'bf16'). capped=True: only those the FASTATTN_ISA cap lets the kernels use."""
    f = fa_isa_features() if capped else fa_cpu_features()
    return [name for bit, name in FEATURE_NAMES.items() if f & bit]


def set_isa(name):
    """Select the kernel set of every kernel family by name (testing aid: clamped to what the
    CPU supports under the FASTATTN_ISA cap; 'avx2-wide' is the AVX-512 shapes compiled for
    AVX2, built only by FASTATTN_DEBUG builds: HAVE_AVX2_WIDE). Returns the name selected.
    Weights packed under another set are repacked by their owner on next use. Not thread-safe
    against running kernels."""
    levels = {v: k for k, v in ISA_NAMES.items()}
    if name not in levels:
        raise ValueError(f"isa must be one of {sorted(levels)}, got {name!r}")
    return ISA_NAMES[fa_isa_select(levels[name])]
