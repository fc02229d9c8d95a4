# cython: language_level=3
# The kernels' one ISA state and its Python face (simd.h, dispatch.c).
#
#   Every kernel family (attention, GEMM and activations, LayerNorm and the embedding, beam
#   search's rows) has a build per kernel set: plain C ('scalar'), generic vectors at the
#   baseline ISA ('baseline', SSE2 on x86-64), AVX2 + FMA ('avx2'), AVX-512F ('avx512') and, for
#   the tests on machines without AVX-512, the AVX-512 shapes compiled for AVX2 ('avx2-wide').
#   One C variable (dispatch.c, compiled into this extension only) says which set runs; the
#   other extensions read it through isa_now() (_simd.pxd) at each call. At import it is the
#   CPU's best; set_isa() forces another (a testing aid). Beam search has no 'scalar' and no
#   'avx2-wide' build: under those it runs its baseline / AVX2 build (every build of it gives
#   the same bits).

cdef extern from "simd.h" nogil:
    int FA_ISA_SCALAR, FA_ISA_BASE, FA_ISA_AVX2, FA_ISA_AVX512, FA_ISA_AVX2_WIDE
    int fa_cpu_level()
    int fa_isa_now()
    int fa_isa_select(int level)

ISA_NAMES = {FA_ISA_SCALAR: "scalar", FA_ISA_BASE: "baseline", FA_ISA_AVX2: "avx2",
             FA_ISA_AVX512: "avx512", FA_ISA_AVX2_WIDE: "avx2-wide"}
fa_isa_select(-1)


cdef int isa_now() noexcept nogil:
    return fa_isa_now()


def isa():
    """Name of the kernel set in use ('avx512', 'avx2', 'baseline', 'scalar' or 'avx2-wide')."""
    return ISA_NAMES[fa_isa_now()]


def isa_level():
    """The kernel set in use as a number (FA_ISA_*: 0 scalar ... 3 avx512, 4 avx2-wide)."""
    return fa_isa_now()


def cpu_isa():
    """Best kernel set the running CPU supports."""
    return ISA_NAMES[fa_cpu_level()]


def set_isa(name):
    """Select the kernel set of every kernel family by name (testing aid: clamped to what the
    CPU supports; 'avx2-wide' is the AVX-512 shapes compiled for AVX2). Returns the name
    selected. Weights packed under another set are repacked by their owner on next use. Not
    thread-safe against running kernels."""
    levels = {v: k for k, v in ISA_NAMES.items()}
    if name not in levels:
        raise ValueError(f"isa must be one of {sorted(levels)}, got {name!r}")
    return ISA_NAMES[fa_isa_select(levels[name])]
