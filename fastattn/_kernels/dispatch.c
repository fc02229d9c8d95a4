/* dispatch.c -- run-time CPU feature detection and the one ISA state (see simd.h). Compiled
 * into the fastattn._kernels._simd extension only: every other extension reads the state
 * through it. The extensions are built for the baseline ISA; the AVX2 / AVX-512 kernels are
 * compiled with function-level target attributes and chosen from the state at each call. */
#include "simd.h"

int fa_cpu_level(void)
{
#if FA_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return FA_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return FA_ISA_AVX2;
    return FA_ISA_BASE;
#elif FA_GNU_VECTORS
    return FA_ISA_BASE;
#else
    return FA_ISA_SCALAR;
#endif
}

int fa_select_level(int level)
{
    int cpu = fa_cpu_level();
#if FA_X86
    if (level == FA_ISA_AVX2_WIDE && cpu >= FA_ISA_AVX2) return level;
#endif
    if (level < 0 || level > cpu || level == FA_ISA_AVX2_WIDE) level = cpu;
#if !FA_GNU_VECTORS
    level = FA_ISA_SCALAR;
#endif
    return level;
}

/* the kernel set every family runs; _simd sets it to the CPU's best at import */
static int fa_isa_state = FA_ISA_SCALAR;

int fa_isa_now(void) { return fa_isa_state; }

int fa_isa_select(int level)
{
    fa_isa_state = fa_select_level(level);
    return fa_isa_state;
}
