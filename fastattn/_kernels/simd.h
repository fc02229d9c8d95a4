/* simd.h -- the kernels' one SIMD header: what every kernel family (attention fa_*, the linear
 * layers gemm_*, LayerNorm norm_*, beam search search_*) shares about vectors and ISAs.
 *
 * Part 1 (once per translation unit, include-guarded):
 *   FA_X86, FA_GNU_VECTORS   what the compiler and target offer; <immintrin.h> on x86
 *   FA_ALWAYS_INLINE, FA_PREFETCH
 *   FA_TARGET_*              the function attributes of the ISA builds
 *   FA_ISA_*                 the kernel sets, the best one available (fa_cpu_level) and the clamp
 *                            of a request to it (fa_select_level); dispatch.c
 *   FA_CPU_*                 the CPU's features: the one detection (fa_cpu_features), the
 *                            FASTATTN_ISA cap (fa_isa_cap) and what is left (fa_isa_features)
 *   fa_isa_now, fa_isa_select   the one ISA state: the kernel set every family runs
 *   FA_KERNELS_FOR           a family's table for a level (the body of <family>_for(level))
 *
 * Part 2 (again for each kernel instance): the vector toolkit of one (dtype, ISA). The
 * includer defines
 *   FA_IS_DOUBLE  1 for double, 0 for float
 *   FA_VW         elements per vector (1: plain scalar C, only FA_T and FA_I are defined)
 *   FA_NAME(x)    name mangling, e.g. x##_f32_avx2
 *   FA_TARGET     the instance's function attribute (may be empty)
 *   FA_VMAX       optional: the intrinsic for a lane-wise max, (a > b) ? a : b
 *   FA_ANY        optional: the intrinsic "is any lane of this comparison true"
 * and includes this header; it gets
 *   FA_T, FA_I    the element type and the integer type of its width
 *   V, VI, VU     the vector types FA_NAME(vec) / (ivec) / (uvec) (float / signed / unsigned)
 *   VLOAD, VSTORE, VSPLAT, VSEL, VMAXSKIP, VANY
 *   FA_NAME(vexp_softmax)   exp for x <= 0 (softmax, log-softmax)          float and double
 *   FA_NAME(vexp_act)       exp over the whole range, no subnormal results  float
 *   FA_NAME(verf) and its pieces (verf_small, verfc_q1, verfc_q2, verfc_tail)  float
 * The instance ends with
 *   #define FA_SIMD_END
 *   #include "simd.h"
 * which undefines all of the above, the includer's parameters included. Vector code uses
 * GCC/Clang generic vectors, so one source serves SSE2, AVX2 and AVX-512: the compiler lowers
 * the same expressions for the ISA named in FA_TARGET (whether a * b + c is fused follows the
 * translation unit: the search kernels are compiled with contraction off, the others with the
 * compiler's default, so attention and search run the same exp source to different bits only
 * on FMA targets, as before these were one function). */
#ifndef FASTATTN_SIMD_H
#define FASTATTN_SIMD_H

#include <stddef.h>
#include <stdint.h>

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#define FA_X86 1
#else
#define FA_X86 0
#endif
#if (defined(__GNUC__) || defined(__clang__)) && defined(__aarch64__)
#define FA_ARM64 1         /* AArch64: the baseline vectors are NEON (ASIMD, part of ARMv8-A) */
#else
#define FA_ARM64 0
#endif
#if defined(__GNUC__) || defined(__clang__)
#define FA_GNU_VECTORS 1
#else
#define FA_GNU_VECTORS 0
#endif

#if FA_X86
#include <immintrin.h>     /* usable inside functions whose target attribute enables the ISA */
#endif
#if FA_ARM64
#include <arm_neon.h>      /* NEON everywhere; the dot-product / i8mm intrinsics inside functions
                            * whose target attribute enables them (FA_TARGET_DOTPROD / _I8MM) */
#endif
#if FA_ARM64
/* "is any lane true" for a 64-byte mask (16 x 32 or 8 x 64 bits: VANY of the 16-float and
 * 8-double instances) in NEON: four q registers OR-ed, one UMAXV. GCC 12's generic lane loop on
 * such a vector (a non-inlined call taking it by value) left the GELU's erfc branch out for one
 * element of the neon int8 instance, which the loop must not (seen in tests/kernels/
 * test_int8_gemm.py under emulation; the other instances of the same source were right), so
 * the AArch64 instances of that width use this (qgemm_kernels.c, fa_portable.c). */
static inline int fa_any64_neon(const void *m)
{
    const uint32_t *p = (const uint32_t *)m;
    uint32x4_t a = vorrq_u32(vorrq_u32(vld1q_u32(p), vld1q_u32(p + 4)),
                             vorrq_u32(vld1q_u32(p + 8), vld1q_u32(p + 12)));
    return vmaxvq_u32(a) != 0;
}
#define FA_ANY64_NEON(m) ({ __typeof__(m) fa_m_ = (m); fa_any64_neon(&fa_m_); })
#endif

/* Portable spellings of two compiler extensions the kernel templates use on every ISA, the
 * plain-C ones included (those are what a compiler without GNU C, e.g. MSVC, builds):
 *   FA_ALWAYS_INLINE   force inlining (register blocks whose row count must be a constant)
 *   FA_PREFETCH(p, l)  a read prefetch of address p with locality l (0-3); nothing elsewhere */
#if FA_GNU_VECTORS
#define FA_ALWAYS_INLINE inline __attribute__((always_inline))
#define FA_PREFETCH(p, l) __builtin_prefetch((p), 0, (l))
#elif defined(_MSC_VER)
#define FA_ALWAYS_INLINE __forceinline
#define FA_PREFETCH(p, l) ((void)(p))
#else
#define FA_ALWAYS_INLINE inline
#define FA_PREFETCH(p, l) ((void)(p))
#endif

/* The extensions are built for the baseline ISA (no -march flag); the AVX2 and AVX-512 builds
 * of the kernels carry these function attributes (x86 only):
 *   FA_TARGET_AVX2, FA_TARGET_AVX512     attention, GEMM, LayerNorm (FMA allowed)
 *   FA_TARGET_AVX2_NOFMA, FA_TARGET_AVX512_NOFMA   beam search's row kernels, which promise
 *                                        the baseline build's bits (nothing fused anywhere) */
#if FA_X86
#define FA_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define FA_TARGET_AVX512 __attribute__((target("avx512f,avx2,fma")))
#define FA_TARGET_AVX2_NOFMA __attribute__((target("avx2")))
#define FA_TARGET_AVX512_NOFMA __attribute__((target("avx512f")))
#endif
/* AArch64: the int8 GEMM's dot-product (ARMv8.2 SDOT / UDOT) and i8mm (ARMv8.6 USDOT / SUDOT /
 * USMMLA) micro-kernels; everything else is NEON, the baseline. GCC 12 takes the extensions
 * only after an architecture ("+dotprod" alone fails to inline the intrinsics): ARMv8.2-A, the
 * first with either (a CPU with them has it); clang takes the extensions' names. */
#if FA_ARM64 && defined(__clang__)
#define FA_TARGET_DOTPROD __attribute__((target("dotprod")))
#define FA_TARGET_I8MM __attribute__((target("dotprod,i8mm")))
#elif FA_ARM64
#define FA_TARGET_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#define FA_TARGET_I8MM __attribute__((target("arch=armv8.2-a+dotprod+i8mm")))
#endif

/* Kernel sets, in increasing order of what they need from the CPU. */
enum {
    FA_ISA_SCALAR = 0,   /* plain C, any compiler */
    FA_ISA_BASE = 1,     /* generic vectors at the baseline ISA (SSE2 on x86-64, NEON on AArch64) */
    FA_ISA_AVX2 = 2,     /* AVX2 + FMA */
    FA_ISA_AVX512 = 3,   /* AVX-512F */
    FA_ISA_AVX2_WIDE = 4 /* tests only: the AVX-512 kernel shapes compiled for AVX2 */
};
/* A flag on a level (the attention driver's p->isa): the kernel set's *portable* attention
 * (fa_portable.c), whose bits do not depend on the ISA or the architecture: every instance runs
 * the same source at 16 float lanes with nothing fused (-ffp-contract=off) and its own exp, so
 * x86-64 (any kernel set) and AArch64 give the same bits. The int8 models run it (with the int8
 * layers, which are portable too): docs/int8.md. */
#define FA_ISA_PORTABLE 0x100
/* avx2-wide is built into FASTATTN_DEBUG builds only (ci/sanitize.sh's; not the wheel): the
 * AVX-512 build's template shapes run on an AVX2-only machine, where nothing else runs them. A
 * request for it elsewhere is clamped as one for a kernel set the CPU lacks. */
#if FA_X86 && defined(FASTATTN_DEBUG)
#define FA_HAVE_AVX2_WIDE 1
#else
#define FA_HAVE_AVX2_WIDE 0
#endif

/* The CPU's features, detected in one place (dispatch.c: CPUID, and XGETBV for what the OS
 * saves: an AVX extension counts only with the ymm state enabled, an AVX-512 one with the zmm
 * and opmask state, AMX with the tile state). FA_CPU_BASE is the baseline vector ISA the
 * extensions are built for (SSE2 on x86-64, NEON on AArch64; any target with GNU C vectors).
 * The AArch64 bits (dispatch.c: getauxval's HWCAP / HWCAP2 on Linux, sysctlbyname on macOS)
 * reuse no x86 bit, so one mask type serves both. */
enum {
    FA_CPU_BASE = 1 << 0,
    FA_CPU_AVX2 = 1 << 1,
    FA_CPU_FMA = 1 << 2,
    FA_CPU_AVX512F = 1 << 3,
    FA_CPU_AVX512BW = 1 << 4,
    FA_CPU_AVX512VL = 1 << 5,
    FA_CPU_AVX512_VNNI = 1 << 6,   /* vpdpbusd on zmm (EVEX) */
    FA_CPU_AVX_VNNI = 1 << 7,      /* vpdpbusd on ymm (VEX encoding) */
    FA_CPU_AMX_TILE = 1 << 8,      /* reported only: no kernel uses AMX */
    FA_CPU_AMX_INT8 = 1 << 9,
    FA_CPU_F16C = 1 << 10,         /* vcvtph2ps on xmm / ymm: the GEMM's binary16 panels */
    FA_CPU_AVX512_BF16 = 1 << 11,  /* vdpbf16ps on zmm: the bfloat16 GEMM (bgemm_kernels.h) */
    FA_CPU_DOTPROD = 1 << 12,      /* AArch64 SDOT / UDOT (FEAT_DotProd): the int8 GEMM */
    FA_CPU_I8MM = 1 << 13,         /* AArch64 USDOT / SUDOT / USMMLA (FEAT_I8MM): the int8 GEMM */
    FA_CPU_ARM_BF16 = 1 << 14      /* AArch64 BFDOT / BFMMLA (FEAT_BF16): reported only */
};
/* what the CPU (and OS, and compiler) offer: detected once */
unsigned fa_cpu_features(void);
/* The cap (FASTATTN_ISA, set by _simd at import): the features the kernels may use, the others
 * treated as absent by every choice below and by the int8 variants (qgemm_kernels.c). Sets the
 * mask and the ISA state to the best kernel set under it; returns that level. */
int fa_isa_cap(unsigned allowed);
/* fa_cpu_features() less what the cap takes away: what every kernel choice reads */
unsigned fa_isa_features(void);
/* The best kernel set of a feature set (FA_ISA_AVX512 needs AVX-512F + AVX2 + FMA, FA_ISA_AVX2
 * AVX2 + FMA, FA_ISA_BASE the baseline vectors). */
int fa_level_of(unsigned features);
/* The best of FA_ISA_SCALAR .. FA_ISA_AVX512 available: fa_level_of(fa_isa_features()). */
int fa_cpu_level(void);
/* The kernel set a request for `level` gets: the level itself when available (the test-only
 * FA_ISA_AVX2_WIDE needs AVX2 and FA_HAVE_AVX2_WIDE), else the best (a negative level asks for
 * the best). */
int fa_select_level(int level);

/* The one ISA state: the kernel set (FA_ISA_*) that attention, GEMM, LayerNorm and search all
 * run, the best available unless a test forced another. It lives in dispatch.c, which only the
 * fastattn._kernels._simd extension compiles: the other extensions read it through _simd's
 * isa_now() (_simd.pxd, a Cython C-API import) at each call and hand it to their kernels
 * (<family>_for(level) below), so there is no other copy to keep in step.
 *   fa_isa_now()            the level in force
 *   fa_isa_select(level)    force a level (clamped by fa_select_level; negative: the best
 *                           available); returns the level in force. Not thread-safe against
 *                           running kernels (the callers hold the GIL). */
int fa_isa_now(void);
int fa_isa_select(int level);

/* A family's kernel table for `level`, given its tables per kernel set (those the build lacks
 * are never named: FA_X86 / FA_GNU_VECTORS / FA_HAVE_AVX2_WIDE leave their cases out). A family
 * without a set names the one it runs instead (search has no scalar and no avx2-wide build). */
#if FA_X86
#define FA_IF_X86(...) __VA_ARGS__
#else
#define FA_IF_X86(...)
#endif
#if FA_GNU_VECTORS
#define FA_IF_VECTORS(...) __VA_ARGS__
#else
#define FA_IF_VECTORS(...)
#endif
#if FA_HAVE_AVX2_WIDE
#define FA_IF_AVX2_WIDE(...) __VA_ARGS__
#else
#define FA_IF_AVX2_WIDE(...)
#endif
#define FA_KERNELS_FOR(level, scalar, base, avx2, avx2wide, avx512)                        \
    switch (level) {                                                                       \
    FA_IF_AVX2_WIDE(case FA_ISA_AVX2_WIDE: return &(avx2wide);)                            \
    FA_IF_X86(case FA_ISA_AVX512: return &(avx512);                                        \
              case FA_ISA_AVX2: return &(avx2);)                                           \
    FA_IF_VECTORS(case FA_ISA_BASE: return &(base);)                                       \
    default: return &(scalar);                                                             \
    }

#endif /* FASTATTN_SIMD_H */

/* ================================================================ part 2: one instance */
#if defined(FA_SIMD_END)

/* (a template may define VLOAD / VSTORE for its scalar instance: undefined here as well) */
#undef FA_T
#undef FA_I
#undef V
#undef VI
#undef VU
#undef VLOAD
#undef VSTORE
#undef VSPLAT
#undef VSEL
#undef VMAXSKIP
#undef VANY
#undef FA_IS_DOUBLE
#undef FA_VW
#undef FA_NAME
#undef FA_TARGET
#undef FA_VMAX
#undef FA_ANY
#undef FA_SIMD_END

#elif defined(FA_NAME)

#if FA_IS_DOUBLE
#define FA_T double
#define FA_I int64_t
#else
#define FA_T float
#define FA_I int32_t
#endif

#if FA_VW > 1
typedef FA_T FA_NAME(vec) __attribute__((vector_size(FA_VW * sizeof(FA_T)), aligned(sizeof(FA_T))));
typedef FA_I FA_NAME(ivec) __attribute__((vector_size(FA_VW * sizeof(FA_T)), aligned(sizeof(FA_T))));
#if FA_IS_DOUBLE
typedef uint64_t FA_NAME(uvec) __attribute__((vector_size(FA_VW * 8), aligned(8)));
#else
typedef uint32_t FA_NAME(uvec) __attribute__((vector_size(FA_VW * 4), aligned(4)));
#endif
#define V FA_NAME(vec)
#define VI FA_NAME(ivec)
#define VU FA_NAME(uvec)
#define VLOAD(p) (*(const V *)(p))
#define VSTORE(p, x) (*(V *)(p) = (x))
#define VSPLAT(c) ((V){0} + (FA_T)(c))
/* lane-wise m ? a : b, m a comparison result (all bits set where true) */
#define VSEL(m, a, b) ((V)(((VI)(m) & (VI)(a)) | (~(VI)(m) & (VI)(b))))
/* (x > m) ? x : m lane-wise, so a NaN x leaves m as it was: one vmaxps where the includer names
 * the intrinsic (FA_VMAX), a compare and select otherwise */
#ifdef FA_VMAX
#define VMAXSKIP(x, m) ((V)FA_VMAX((x), (m)))
#else
#define VMAXSKIP(x, m) ((V)(((VI)(x) & (VI)((x) > (m))) | ((VI)(m) & ~(VI)((x) > (m)))))
#endif
/* VANY(m): is any lane of the comparison result m true? One movemask / test instruction where
 * the includer names it (FA_ANY), a lane loop otherwise */
#ifdef FA_ANY
#define VANY(m) FA_ANY(m)
#else
#define VANY(m) FA_NAME(any_lane)((VI)(m))
/* the instance's target too: a call that is not inlined (an -O0 build) must pass the vector the
 * way the callee reads it */
FA_TARGET static inline int FA_NAME(any_lane)(VI m)
{
    FA_I acc = 0;
    for (int t = 0; t < FA_VW; t++) acc |= m[t];
    return acc != 0;
}
#endif

/* ---------------------------------------------------------------- exp for the softmax
 * exp(x) for x <= 0 (the softmax and the log-softmax always subtract the row maximum first).
 * exp(x) = 2^n * 2^f with n = round(x log2 e) and f = x log2 e - n in [-1/2, 1/2]: the argument
 * x - n ln 2 reduced in Cody and Waite's two exact steps (so the accuracy does not depend on
 * whether the compiler fuses multiply-adds: -O0 does not), then times log2 e; 2^f by a minimax
 * polynomial (degree 6 for float: relative error 1.9e-9; degree 11 for double: 3.1e-18, both
 * well below half an ulp before rounding); 2^n built in the exponent bits by the rounding
 * constant itself (1.5 * 2^mant + bias puts n + bias in the low bits of t). x is first clamped
 * to -88 / -709, where 2^n's exponent field reaches 0, so -inf gives 0 and the result is 0
 * below about -87.9 / -708.9 (subnormal results flushed: nothing next to the row maximum's
 * exp(0) = 1); NaN propagates (max(lo, NaN) is NaN).
 * Measured error: tests/kernels/test_softmax.py::test_kernel_exp_accuracy (<= 2 ulp). */
FA_TARGET static inline V FA_NAME(vexp_softmax)(V x)
{
#if FA_IS_DOUBLE
    const FA_T lo = -709.0;
    const FA_T shift = 6755399441055744.0 + 1023.0;  /* 1.5 * 2^52 + exponent bias */
    const FA_T log2e = 1.4426950408889634;
    const int mbits = 52, bias = 1023;
#else
    const FA_T lo = -88.0f;
    const FA_T shift = 12582912.0f + 127.0f;         /* 1.5 * 2^23 + exponent bias */
    const FA_T log2e = 1.44269502f;
    const int mbits = 23, bias = 127;
#endif
    x = VMAXSKIP((V){0} + lo, x);
    V t = x * log2e + shift;                             /* n + bias in the low bits, rounded */
    V n = t - shift;
    /* Cody and Waite: r = x - n ln 2 in two steps that are exact whatever the compiler fuses
     * (ln2_hi has few significant bits), then f = r log2 e with |f| <= 1/2 */
#if FA_IS_DOUBLE
    V r = x - n * (FA_T)6.93147180369123816490e-01;
    r = r - n * (FA_T)1.90821492927058770002e-10;
#else
    V r = x - n * (FA_T)0.693359375f;
    r = r - n * (FA_T)-2.12194440e-4f;
#endif
    V f = r * log2e;
#if FA_IS_DOUBLE
    V y = f * (FA_T)4.4352809446103363e-10 + (FA_T)7.074105626245659e-09;
    y = y * f + (FA_T)1.0178198033328528e-07;
    y = y * f + (FA_T)1.321543308959463e-06;
    y = y * f + (FA_T)1.5252733489960805e-05;
    y = y * f + (FA_T)0.00015403530462514614;
    y = y * f + (FA_T)0.001333355814678995;
    y = y * f + (FA_T)0.009618129107588335;
    y = y * f + (FA_T)0.055504108664819925;
    y = y * f + (FA_T)0.24022650695910155;
    y = y * f + (FA_T)0.6931471805599453;
    y = y * f + (FA_T)1.0;
#else
    V y = f * (FA_T)0.00015345812158740183f + (FA_T)0.001339993120947414f;
    y = y * f + (FA_T)0.009618488956522791f;
    y = y * f + (FA_T)0.055503287769976636f;
    y = y * f + (FA_T)0.24022646890639573f;
    y = y * f + (FA_T)0.6931472057372526f;
    y = y * f + (FA_T)1.0f;
#endif
    /* n + bias is in [0, 2 bias]: mask it out of t's bits first, so the shift never overflows
     * a signed lane (undefined behaviour) */
    return y * (V)(((VI)t & (FA_I)(2 * bias + 1)) << mbits);
}

#if !FA_IS_DOUBLE
/* ---------------------------------------------------------------- exp for the activations
 * exp for float vectors over the whole range. exp(x) = 2^n e^r, n = round(x log2 e),
 * r = x - n ln 2 in Cody and Waite's two steps (ln2_hi has 11 significant bits, so n * ln2_hi
 * is exact for |n| <= 2^13 and the step is exact whether or not the compiler fuses it);
 * e^r for |r| <= 0.347 by its Taylor series to degree 7 (truncation < 6e-9, under a tenth of
 * an ulp); 2^n applied in two halves, 2^(n/2) 2^(n - n/2), so that n from -150 to 128 gives
 * overflow to +inf with one rounding. x is clamped to [-87, 89] first: below, the result is
 * exp(-87) ~ 1.6e-38, the smallest normal value it returns; above, +inf. NaN propagates (the
 * clamps compare false and keep it). No subnormal results: each one made the multiplications
 * take a microcode assist (GELU-tanh of a 4M-element array 3.4 ms at |x| <= 3, 10.8 ms at
 * |x| ~ 10, where half the lanes underflowed), and no caller can tell the difference: SiLU and
 * GELU-tanh add the result to 1 (1 + e is 1 for every e below 2^-24), erfc's tail takes exp of
 * arguments above -45 only. A function of its own, not vexp_softmax: that one is exact to
 * 2 ulp for x <= 0 only, flushes to 0 below -87.9 and has no overflow path. */
FA_TARGET static inline V FA_NAME(vexp_act)(V x)
{
    const V lo = VSPLAT(-87.0f), hi = VSPLAT(89.0f);
    x = VSEL(x < lo, lo, x);
    x = VSEL(x > hi, hi, x);
    const FA_T shift = 12582912.0f;                    /* 1.5 * 2^23: rounds to an integer */
    V n = (x * 1.44269504f + shift) - shift;
    V r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    V p = VSPLAT(1.0f / 5040.0f);
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    VI ni = __builtin_convertvector(n, VI);
    VI n1 = ni >> 1, n2 = ni - (ni >> 1);
    /* the exponent field by an unsigned shift (a NaN lane's n is garbage, never UB) */
    V s1 = (V)((VU)(n1 + 127) << 23), s2 = (V)((VU)(n2 + 127) << 23);
    return p * s1 * s2;
}

/* ---------------------------------------------------------------- erf, erfc
 * erfc(a) for a >= 1 (a may be NaN or +inf), two near-minimax fits (Chebyshev nodes with
 * Lawson reweighting, computed for this file against mpmath at 40 digits):
 *   1 <= a < 2:    erfc itself, a polynomial of degree 10 in a - 1.5 (relative fit error
 *                  3e-9): no exp, and it covers |x| < 2.83 of GELU's inputs with x / sqrt 2;
 *   2 <= a <= 6.5: exp of a degree-11 polynomial in a - 4.25 fitted to log erfc(a) (absolute
 *                  fit error 5e-9 in the logarithm); beyond 6.5 erfc < 4e-20 and the result
 *                  is 0.
 * The second interval, the expensive one, is evaluated only when some lane needs it (a NaN
 * lane does: it takes that interval, which propagates it). Fitting erfc rather than erf keeps
 * its relative accuracy (~8 float32 eps) where GELU's negative tail needs it. */
FA_TARGET static inline V FA_NAME(verfc_q1)(V a)
{
    V t1 = a - 1.5f;
    V q1 = VSPLAT(1.331209019e-04f);
    q1 = q1 * t1 + -1.558088806e-03f;
    q1 = q1 * t1 + 2.320772957e-03f;
    q1 = q1 * t1 + 4.710950396e-03f;
    q1 = q1 * t1 + -1.931624308e-02f;
    q1 = q1 * t1 + 1.486904639e-02f;
    q1 = q1 * t1 + 4.459797990e-02f;
    q1 = q1 * t1 + -1.387520858e-01f;
    q1 = q1 * t1 + 1.783954596e-01f;
    q1 = q1 * t1 + -1.189302889e-01f;
    q1 = q1 * t1 + 3.389485341e-02f;
    return q1;
}

/* erfc(a) for 2 <= a (a may be NaN or +inf), given q1 = verfc_q1(a) for the lanes below 2 */
FA_TARGET static inline V FA_NAME(verfc_q2)(V a, V q1)
{
    V ac = VSEL(a > 6.5f, VSPLAT(6.5f), a);            /* NaN stays NaN */
    V t2 = ac - 4.25f;
    V q2 = VSPLAT(-4.627353082e-10f);
    q2 = q2 * t2 + 4.614634414e-09f;
    q2 = q2 * t2 + -3.171049716e-08f;
    q2 = q2 * t2 + 2.272791618e-07f;
    q2 = q2 * t2 + -1.605983862e-06f;
    q2 = q2 * t2 + 1.088644338e-05f;
    q2 = q2 * t2 + -7.238122687e-05f;
    q2 = q2 * t2 + 4.805206234e-04f;
    q2 = q2 * t2 + -3.263743236e-03f;
    q2 = q2 * t2 + -9.760845730e-01f;
    q2 = q2 * t2 + -8.723775716e+00f;
    q2 = q2 * t2 + -2.010776990e+01f;
    V e = FA_NAME(vexp_act)(q2);
    e = VSEL(a > 6.5f, VSPLAT(0.0f), e);
    return VSEL(a < 2.0f, q1, e);
}

FA_TARGET static inline V FA_NAME(verfc_tail)(V a)
{
    V q1 = FA_NAME(verfc_q1)(a);
    if (!VANY(~(VI)(a < 2.0f)))
        return q1;
    return FA_NAME(verfc_q2)(a, q1);
}

/* erf(a) - a = a * S(a^2) for 0 <= a < 1: S of degree 8 (near-minimax as above, relative fit
 * error 4e-11). Writing erf = a + a S keeps the leading term exact: 2/sqrt(pi) itself would
 * be rounded to float. */
FA_TARGET static inline V FA_NAME(verf_small)(V a)
{
    V t = a * a;
    V s = VSPLAT(1.056302159e-06f);
    s = s * t + -1.389871761e-05f;
    s = s * t + 1.195482155e-04f;
    s = s * t + -8.542489198e-04f;
    s = s * t + 5.223776419e-03f;
    s = s * t + -2.686613141e-02f;
    s = s * t + 1.128379129e-01f;
    s = s * t + -3.761263889e-01f;
    s = s * t + 1.283791671e-01f;
    return a + a * s;
}

/* erf(x), <= 2 ulp (tests/kernels/test_activations.py sweeps it against scipy.special.erf):
 * odd, so computed on |x| and the sign copied back (erf(-0) = -0, erf(NaN) = NaN). */
FA_TARGET static inline V FA_NAME(verf)(V x)
{
    const VI signbit = (VI){0} + (FA_I)(-2147483647 - 1);
    V a = (V)((VI)x & ~signbit);
    V tail = VANY(~(VI)(a < 1.0f)) ? FA_NAME(verfc_tail)(a) : VSPLAT(0.0f);
    V r = VSEL(a < 1.0f, FA_NAME(verf_small)(a), 1.0f - tail);
    return (V)((VI)r | ((VI)x & signbit));
}
#endif /* !FA_IS_DOUBLE */
#endif /* FA_VW > 1 */

#endif /* part 2 */
