/* gemm_kernels.c -- instantiates gemm_tile.h per dtype and ISA, one table per kernel set
 * (gm_kernels_for: the driver takes the one of simd.h's ISA state at each call).
 * Built for the baseline ISA; AVX2 / AVX-512 versions carry function-level target attributes.
 *
 * Register blocks and K blocks per instance (NR = NV * VW columns):
 *   scalar     MR 4, NR 4,   KC 256   the reference: plain C, libm activations
 *   baseline   MR 4, NR 8/4 (2 SSE vectors), KC 256; on AArch64 (NEON, 32 registers) MR 6,
 *              NR 16/8 (4 q vectors), KC 256
 *   AVX2+FMA   MR 6, NR 16 floats / 8 doubles (12 ymm accumulators, 2 for the panel, 1 for the
 *              broadcast), KC 512 floats / 256 doubles: a row block's x sliver (6 x KC, 12 KiB)
 *              stays in L1 while the panels stream from L2 / L3 (KC 512 against 256: +2-8%
 *              at large M in an ad-hoc side-by-side harness; with the row-block order,
 *              +0-9% in bench/tools/ab_gemm.py, Zen 3)
 *   AVX-512F   MR 6, NR 64 floats / 32 doubles (24 zmm accumulators), KC 512 floats (128 KiB
 *              panels from L2, a 12 KiB x sliver in L1) / 128 doubles, and for floats the next
 *              K block's panels fetched into L2 while the current one runs (GM_L2_NEXT), or
 *              after the last K block the panels of the thread's next column block. AVX-512 +
 *              AMX Xeon, two threads, same process (bench/tools/ab_gemm.py,
 *              bench/results/ab_gemm_avx512.txt): KC 256 against 128 +1-3% at M >= 1024; KC 512
 *              with the next column block's panels fetched against KC 256: +2-4.4% at
 *              M >= 1024, +3-4% at M = 8, +4-10% at M = 32 (KC 512 alone was 5-7% slower at
 *              M = 32: one K block left nothing to fetch), the base forward +4.1% (median of
 *              five process pairs); KC 1024 -3% at K = 2048. In the base forward, where each
 *              layer's weights arrive cold, the L2 fetch took the item function's own samples
 *              (the first row block's waits on the panels) from 14.6% of the forward's to
 *              10.7-11.6%. Off for AVX2: the same code with nothing to fetch measured 4-7%
 *              slower there (the loop split alone).
 *   avx2-wide  tests only (FASTATTN_DEBUG builds): the AVX-512 shapes compiled for AVX2
 */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gemm_kernels.h"  /* and simd.h: FA_X86, FA_GNU_VECTORS, the targets, <immintrin.h> */

/* ---- plain scalar C */
#define FA_NAME(x) gm_##x##_f32_scalar
#define FA_IS_DOUBLE 0
#define FA_VW 1
#define GM_MR 4
#define GM_NV 4
#define GM_KC 256
#define FA_TARGET
#include "gemm_tile.h"

#define FA_NAME(x) gm_##x##_f64_scalar
#define FA_IS_DOUBLE 1
#define FA_VW 1
#define GM_MR 4
#define GM_NV 4
#define GM_KC 256
#define FA_TARGET
#include "gemm_tile.h"

#if FA_GNU_VECTORS
/* ---- generic vectors at the baseline ISA (SSE2 on x86-64, NEON on arm64). AArch64 has 32
 * vector registers (x86-64's SSE2 16): its register block is AVX2's shape in q registers,
 * 6 x 16 floats (24 accumulators, 4 panel vectors, the broadcast row values by lane) and
 * 6 x 8 doubles; the compiler contracts a * b + c into FMLA there (the translation unit's
 * default), as the AVX2 build does with FMA. */
#if FA_ARM64
#define GM_BASE_MR 6
#define GM_BASE_NV 4
#else
#define GM_BASE_MR 4
#define GM_BASE_NV 2
#endif
#define FA_NAME(x) gm_##x##_f32_base
#define FA_IS_DOUBLE 0
#define FA_VW 4
#define GM_MR GM_BASE_MR
#define GM_NV GM_BASE_NV
#define GM_KC 256
#define FA_TARGET
#if FA_X86
#define FA_ANY(m) _mm_movemask_ps((__m128)(m))
#elif FA_ARM64
#define FA_ANY(m) (vmaxvq_u32((uint32x4_t)(m)) != 0)
#endif
#include "gemm_tile.h"

#define FA_NAME(x) gm_##x##_f64_base
#define FA_IS_DOUBLE 1
#define FA_VW 2
#define GM_MR GM_BASE_MR
#define GM_NV GM_BASE_NV
#define GM_KC 256
#define FA_TARGET
#include "gemm_tile.h"
#undef GM_BASE_MR
#undef GM_BASE_NV
#endif

#if FA_X86
/* ---- AVX2 + FMA */
#define FA_NAME(x) gm_##x##_f32_avx2
#define FA_IS_DOUBLE 0
#define FA_VW 8
#define GM_MR 6
#define GM_NV 2
#define GM_KC 512
#define GM_WIDEN(v) _mm256_cvtps_pd((__m128)(v))
#define FA_TARGET FA_TARGET_AVX2
#define FA_ANY(m) _mm256_movemask_ps((__m256)(m))
#include "gemm_tile.h"

#define FA_NAME(x) gm_##x##_f64_avx2
#define FA_IS_DOUBLE 1
#define FA_VW 4
#define GM_MR 6
#define GM_NV 2
#define GM_KC 256
#define FA_TARGET FA_TARGET_AVX2
#include "gemm_tile.h"

/* the same with binary16 panels (F16C's vcvtph2ps widens each panel vector as it is loaded) */
#define FA_NAME(x) gm_##x##_f32h_avx2
#define FA_IS_DOUBLE 0
#define FA_VW 8
#define GM_MR 6
#define GM_NV 2
#define GM_KC 512
#define GM_HALF 1
#define GM_PLOAD_HALF(p) ((V)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p))))
#define FA_TARGET __attribute__((target("avx2,fma,f16c")))
#define FA_ANY(m) _mm256_movemask_ps((__m256)(m))
#include "gemm_tile.h"

#if FA_HAVE_AVX2_WIDE
/* ---- test-only (FASTATTN_DEBUG builds): the AVX-512 shapes compiled for AVX2 (never selected
 * automatically) */
#define FA_NAME(x) gm_##x##_f32_avx2wide
#define FA_IS_DOUBLE 0
#define FA_VW 16
#define GM_MR 6
#define GM_NV 4
#define GM_KC 512
#define GM_L2_NEXT 1
#define FA_TARGET FA_TARGET_AVX2
#include "gemm_tile.h"

#define FA_NAME(x) gm_##x##_f64_avx2wide
#define FA_IS_DOUBLE 1
#define FA_VW 8
#define GM_MR 6
#define GM_NV 4
#define GM_KC 128
#define FA_TARGET FA_TARGET_AVX2
#include "gemm_tile.h"
#endif

/* ---- AVX-512F */
#define FA_NAME(x) gm_##x##_f32_avx512
#define FA_IS_DOUBLE 0
#define FA_VW 16
#define GM_MR 6
#define GM_NV 4
#define GM_KC 512
#define GM_WIDEN(v) _mm512_cvtps_pd((__m256)(v))
#define GM_L2_NEXT 1
#define FA_TARGET FA_TARGET_AVX512
#define FA_ANY(m) (_mm512_test_epi32_mask((__m512i)(m), (__m512i)(m)) != 0)
#include "gemm_tile.h"

/* the same with binary16 panels (AVX-512F's vcvtph2ps on zmm) */
#define FA_NAME(x) gm_##x##_f32h_avx512
#define FA_IS_DOUBLE 0
#define FA_VW 16
#define GM_MR 6
#define GM_NV 4
#define GM_KC 512
#define GM_L2_NEXT 1
#define GM_HALF 1
#define GM_PLOAD_HALF(p) ((V)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p))))
#define FA_TARGET FA_TARGET_AVX512
#define FA_ANY(m) (_mm512_test_epi32_mask((__m512i)(m), (__m512i)(m)) != 0)
#include "gemm_tile.h"

#define FA_NAME(x) gm_##x##_f64_avx512
#define FA_IS_DOUBLE 1
#define FA_VW 8
#define GM_MR 6
#define GM_NV 4
#define GM_KC 128
#define FA_TARGET FA_TARGET_AVX512
#include "gemm_tile.h"
#endif


/* ---- the tables, one per kernel set, filled once at import of _gemm (gm_setup). By code, not
 * by static initializers, and the way the former gm_init filled them: GCC's inliner works at
 * its unit-growth limit in this file (a share of the unit's size), so which of gemm_tile.h's
 * `static inline` helpers get inlined into the kernels depends on the size of everything here;
 * this keeps the kernels' machine code what it was (objdump-compared). */
#define GM_FILL(tab, sfx)                         \
    do {                                          \
        (tab).f32.mr = gm_mr_f32_##sfx;           \
        (tab).f32.nr = gm_nr_f32_##sfx;           \
        (tab).f32.kc = gm_kc_f32_##sfx;           \
        (tab).f32.pack = gm_pack_f32_##sfx;       \
        (tab).f32.item = gm_item_f32_##sfx;       \
        (tab).f32.act = gm_act_array_f32_##sfx;   \
        (tab).f32.ln = gm_ln_row_f32_##sfx;       \
        (tab).f64.mr = gm_mr_f64_##sfx;           \
        (tab).f64.nr = gm_nr_f64_##sfx;           \
        (tab).f64.kc = gm_kc_f64_##sfx;           \
        (tab).f64.pack = gm_pack_f64_##sfx;       \
        (tab).f64.item = gm_item_f64_##sfx;       \
        (tab).f64.act = gm_act_array_f64_##sfx;   \
        (tab).f64.ln = gm_ln_row_f64_##sfx;       \
    } while (0)

static gm_kernels gm_tables[FA_ISA_AVX2_WIDE + 1];

void gm_setup(void)
{
    GM_FILL(gm_tables[FA_ISA_SCALAR], scalar);
#if FA_GNU_VECTORS
    GM_FILL(gm_tables[FA_ISA_BASE], base);
#endif
#if FA_X86
    GM_FILL(gm_tables[FA_ISA_AVX2], avx2);
#if FA_HAVE_AVX2_WIDE
    GM_FILL(gm_tables[FA_ISA_AVX2_WIDE], avx2wide);
#endif
    GM_FILL(gm_tables[FA_ISA_AVX512], avx512);
    gm_tables[FA_ISA_AVX2].f32h.pack = gm_pack_f32h_avx2;
    gm_tables[FA_ISA_AVX2].f32h.item = gm_item_f32h_avx2;
    gm_tables[FA_ISA_AVX512].f32h.pack = gm_pack_f32h_avx512;
    gm_tables[FA_ISA_AVX512].f32h.item = gm_item_f32h_avx512;
#endif
}

/* (a level the build lacks never comes: simd.h's state holds only levels the CPU has) */
const gm_kernels *gm_kernels_for(int level) { return &gm_tables[level]; }

int gm_half_ok(int level) { return gm_tables[level].f32h.item != NULL; }
