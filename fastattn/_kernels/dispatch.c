/* dispatch.c -- run-time CPU feature detection, the FASTATTN_ISA cap and the one ISA state (see
 * simd.h). x86-64: CPUID and XGETBV. AArch64: the kernel's HWCAP words on Linux (getauxval),
 * sysctlbyname's hw.optional.arm.FEAT_* on macOS. Compiled into the fastattn._kernels._simd extension only: every other extension reads
 * the state, and the features it may use, through it. The extensions are built for the baseline
 * ISA; the AVX2 / AVX-512 kernels are compiled with function-level target attributes and chosen
 * from the state at each call. */
#include "simd.h"

#if FA_X86
#include <cpuid.h>

/* XCR0, the state components the OS saves on a context switch (XGETBV needs CPUID.1:ECX.OSXSAVE,
 * checked by the caller). By its opcode: an assembler without the mnemonic still builds it. */
static unsigned long long fa_xgetbv0(void)
{
    unsigned int lo, hi;
    __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

/* CPUID, then XCR0: an extension counts only where the CPU reports it AND the OS saves its
 * registers (ymm: XCR0 bits 1-2; zmm and the opmasks: also bits 5-7; AMX tiles: bits 17-18). */
static unsigned fa_detect(void)
{
    unsigned a, b, c, d, f = FA_CPU_BASE;          /* SSE2: part of x86-64, and our baseline */
    unsigned max = __get_cpuid_max(0, 0);
    if (max < 1 || !__get_cpuid(1, &a, &b, &c, &d)) return f;
    if (!(c & (1u << 27))) return f;               /* OSXSAVE: no XGETBV, no AVX state */
    unsigned long long xcr0 = fa_xgetbv0();
    int ymm = (xcr0 & 0x6) == 0x6;
    int zmm = ymm && (xcr0 & 0xe0) == 0xe0;
    int tiles = (xcr0 & (3ull << 17)) == (3ull << 17);
    if (!ymm || !(c & (1u << 28))) return f;       /* AVX itself */
    if (c & (1u << 12)) f |= FA_CPU_FMA;
    if (c & (1u << 29)) f |= FA_CPU_F16C;
    if (max < 7) return f;
    __cpuid_count(7, 0, a, b, c, d);
    unsigned sub = a;                              /* the highest subleaf of leaf 7 */
    if (b & (1u << 5)) f |= FA_CPU_AVX2;
    if (zmm) {
        if (b & (1u << 16)) f |= FA_CPU_AVX512F;
        if (b & (1u << 30)) f |= FA_CPU_AVX512BW;
        if (b & (1u << 31)) f |= FA_CPU_AVX512VL;
        if (c & (1u << 11)) f |= FA_CPU_AVX512_VNNI;
    }
    if (tiles) {
        if (d & (1u << 24)) f |= FA_CPU_AMX_TILE;
        if (d & (1u << 25)) f |= FA_CPU_AMX_INT8;
    }
    if (sub >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        if (a & (1u << 4)) f |= FA_CPU_AVX_VNNI;
        if (zmm && (a & (1u << 5))) f |= FA_CPU_AVX512_BF16;
    }
    return f;
}
#endif

#if FA_ARM64 && defined(__linux__)
#include <sys/auxv.h>
/* the bits of <asm/hwcap.h>, spelled out: an older libc's headers may lack the newer ones */
#define FA_HWCAP_ASIMD (1ul << 1)
#define FA_HWCAP_ASIMDDP (1ul << 20)
#define FA_HWCAP2_I8MM (1ul << 13)
#define FA_HWCAP2_BF16 (1ul << 14)
static unsigned fa_detect(void)
{
    unsigned long h1 = getauxval(AT_HWCAP), h2 = getauxval(AT_HWCAP2);
    unsigned f = 0;
    if (!(h1 & FA_HWCAP_ASIMD)) return f;          /* no NEON: plain C only */
    f |= FA_CPU_BASE;
    if (h1 & FA_HWCAP_ASIMDDP) f |= FA_CPU_DOTPROD;
    if (h2 & FA_HWCAP2_I8MM) f |= FA_CPU_I8MM;
    if (h2 & FA_HWCAP2_BF16) f |= FA_CPU_ARM_BF16;
    return f;
}
#elif FA_ARM64 && defined(__APPLE__)
#include <sys/sysctl.h>
static int fa_sysctl_flag(const char *name)
{
    int v = 0;
    size_t n = sizeof v;
    return sysctlbyname(name, &v, &n, NULL, 0) == 0 && v != 0;
}
static unsigned fa_detect(void)
{
    unsigned f = FA_CPU_BASE;                      /* every Apple arm64 core has NEON */
    if (fa_sysctl_flag("hw.optional.arm.FEAT_DotProd")) f |= FA_CPU_DOTPROD;
    if (fa_sysctl_flag("hw.optional.arm.FEAT_I8MM")) f |= FA_CPU_I8MM;
    if (fa_sysctl_flag("hw.optional.arm.FEAT_BF16")) f |= FA_CPU_ARM_BF16;
    return f;
}
#endif

unsigned fa_cpu_features(void)
{
    static int done = 0;
    static unsigned features = 0;
    if (!done) {                       /* first called by _simd's import, under the GIL */
#if FA_X86 || (FA_ARM64 && (defined(__linux__) || defined(__APPLE__)))
        features = fa_detect();
#elif FA_GNU_VECTORS
        features = FA_CPU_BASE;
#endif
        done = 1;
    }
    return features;
}

/* the FASTATTN_ISA cap: the features the kernels may use (all unless _simd set one at import) */
static unsigned fa_cap_mask = ~0u;

unsigned fa_isa_features(void) { return fa_cpu_features() & fa_cap_mask; }

int fa_level_of(unsigned features)
{
    const unsigned avx2 = FA_CPU_BASE | FA_CPU_AVX2 | FA_CPU_FMA;
    if ((features & (avx2 | FA_CPU_AVX512F)) == (avx2 | FA_CPU_AVX512F)) return FA_ISA_AVX512;
    if ((features & avx2) == avx2) return FA_ISA_AVX2;
    if (features & FA_CPU_BASE) return FA_ISA_BASE;
    return FA_ISA_SCALAR;
}

int fa_cpu_level(void) { return fa_level_of(fa_isa_features()); }

int fa_select_level(int level)
{
    int best = fa_cpu_level();
    if (FA_HAVE_AVX2_WIDE && level == FA_ISA_AVX2_WIDE && best >= FA_ISA_AVX2) return level;
    if (level < 0 || level > best || level == FA_ISA_AVX2_WIDE) level = best;
    return level;
}

/* the kernel set every family runs; _simd sets it to the best one at import */
static int fa_isa_state = FA_ISA_SCALAR;

int fa_isa_now(void) { return fa_isa_state; }

int fa_isa_select(int level)
{
    fa_isa_state = fa_select_level(level);
    return fa_isa_state;
}

int fa_isa_cap(unsigned allowed)
{
    fa_cap_mask = allowed;
    return fa_isa_select(-1);
}
