/* dispatch.h -- the one place that asks the running CPU which SIMD level it supports. Both
 * kernel families (fa_kernels.c for attention, gemm_kernels.c for the linear layers) select
 * their micro-kernels from this answer, so they always agree on what the CPU can do. */
#ifndef FASTATTN_DISPATCH_H
#define FASTATTN_DISPATCH_H

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#define FA_X86 1
#else
#define FA_X86 0
#endif
#if defined(__GNUC__) || defined(__clang__)
#define FA_GNU_VECTORS 1
#else
#define FA_GNU_VECTORS 0
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

/* Kernel sets, in increasing order of what they need from the CPU. */
enum {
    FA_ISA_SCALAR = 0,   /* plain C, any compiler */
    FA_ISA_BASE = 1,     /* generic vectors at the baseline ISA (SSE2 on x86-64) */
    FA_ISA_AVX2 = 2,     /* AVX2 + FMA */
    FA_ISA_AVX512 = 3,   /* AVX-512F */
    FA_ISA_AVX2_WIDE = 4 /* tests only: the AVX-512 kernel shapes compiled for AVX2 */
};

/* The best of FA_ISA_SCALAR .. FA_ISA_AVX512 this CPU (and compiler) supports. */
int fa_cpu_level(void);
/* The kernel set a request for `level` gets: the level itself when the CPU has it (the test-only
 * FA_ISA_AVX2_WIDE needs AVX2), else the CPU's best (a negative level asks for the best). */
int fa_select_level(int level);

#endif
