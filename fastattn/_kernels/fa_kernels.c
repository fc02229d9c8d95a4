/* fa_kernels.c -- instantiates the tile micro-kernels of fa_tile.h per dtype and ISA, one table
 * per kernel set (fa_kernels_for: the driver takes the one of simd.h's ISA state at each call).
 * The wheel is built for the baseline x86-64 ISA; the AVX2 and AVX-512 versions are compiled
 * with function-level target attributes and selected at run time, so no -march flag is needed.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fa_kernels.h"    /* and simd.h: FA_X86, FA_GNU_VECTORS, the targets, <immintrin.h> */

/* Each instance below defines the template's parameters (FA_IS_DOUBLE selects the dtype) and
 * includes fa_tile.h, which undefines them again at its end. */

/* ---- plain scalar C: any compiler, and the reference the vector versions are tested against */
#define FA_NAME(x) x##_f32_scalar
#define FA_IS_DOUBLE 0
#define FA_VW 1
#define FA_MR 1
#define FA_NV 1
#define FA_TARGET
#include "fa_tile.h"

#define FA_NAME(x) x##_f64_scalar
#define FA_IS_DOUBLE 1
#define FA_VW 1
#define FA_MR 1
#define FA_NV 1
#define FA_TARGET
#include "fa_tile.h"

#if FA_GNU_VECTORS
/* ---- generic vectors at the baseline ISA (SSE2 on x86-64, NEON on arm64). AArch64's 32
 * vector registers take AVX2's block in q registers: 6 rows x 16 floats / 8 doubles. */
#if FA_ARM64
#define FA_BASE_MR 6
#define FA_BASE_NV 4
#define FA_BASE_ANY(m) (vmaxvq_u32((uint32x4_t)(m)) != 0)
#else
#define FA_BASE_MR 4
#define FA_BASE_NV 2
#endif
#define FA_NAME(x) x##_f32_base
#define FA_IS_DOUBLE 0
#define FA_VW 4
#define FA_MR FA_BASE_MR
#define FA_NV FA_BASE_NV
#define FA_TARGET
#ifdef FA_BASE_ANY
#define FA_ANY(m) FA_BASE_ANY(m)
#endif
#include "fa_tile.h"

#define FA_NAME(x) x##_f64_base
#define FA_IS_DOUBLE 1
#define FA_VW 2
#define FA_MR FA_BASE_MR
#define FA_NV FA_BASE_NV
#define FA_TARGET
#ifdef FA_BASE_ANY
#define FA_ANY(m) FA_BASE_ANY(m)
#endif
#include "fa_tile.h"
#undef FA_BASE_MR
#undef FA_BASE_NV
#undef FA_BASE_ANY
#endif

#if FA_X86
/* ---- AVX2 + FMA: 16 ymm registers; a 6 x 2-vector block keeps 12 accumulators live */
#define FA_NAME(x) x##_f32_avx2
#define FA_IS_DOUBLE 0
#define FA_VW 8
#define FA_MR 6
#define FA_NV 2
#define FA_VMAX _mm256_max_ps
#define FA_TARGET FA_TARGET_AVX2
#include "fa_tile.h"

#define FA_NAME(x) x##_f64_avx2
#define FA_IS_DOUBLE 1
#define FA_VW 4
#define FA_MR 6
#define FA_NV 2
#define FA_VMAX _mm256_max_pd
#define FA_TARGET FA_TARGET_AVX2
#include "fa_tile.h"

#if FA_HAVE_AVX2_WIDE
/* ---- test-only (FASTATTN_DEBUG builds): the AVX-512 shapes (16 floats / 8 doubles a vector,
 * 6 x 4 blocks) compiled for AVX2, so that the template instance the AVX-512 build uses is
 * exercised by the test suite on machines without AVX-512. Never selected automatically. */
#define FA_NAME(x) x##_f32_avx2wide
#define FA_IS_DOUBLE 0
#define FA_VW 16
#define FA_MR 6
#define FA_NV 4
#define FA_TARGET FA_TARGET_AVX2
#include "fa_tile.h"

#define FA_NAME(x) x##_f64_avx2wide
#define FA_IS_DOUBLE 1
#define FA_VW 8
#define FA_MR 6
#define FA_NV 4
#define FA_TARGET FA_TARGET_AVX2
#include "fa_tile.h"
#endif

/* ---- AVX-512F: 32 zmm registers; a 6 x 4-vector block keeps 24 accumulators live */
#define FA_NAME(x) x##_f32_avx512
#define FA_IS_DOUBLE 0
#define FA_VW 16
#define FA_MR 6
#define FA_NV 4
#define FA_VMAX _mm512_max_ps
#define FA_TARGET FA_TARGET_AVX512
#include "fa_tile.h"

#define FA_NAME(x) x##_f64_avx512
#define FA_IS_DOUBLE 1
#define FA_VW 8
#define FA_MR 6
#define FA_NV 4
#define FA_VMAX _mm512_max_pd
#define FA_TARGET FA_TARGET_AVX512
#include "fa_tile.h"
#endif

/* ---- the tables, one per kernel set */

FA_TABLE(fa_scalar, scalar)
FA_IF_VECTORS(FA_TABLE(fa_base, base))
FA_IF_X86(FA_TABLE(fa_avx2, avx2) FA_TABLE(fa_avx512, avx512))
FA_IF_AVX2_WIDE(FA_TABLE(fa_avx2wide, avx2wide))

const fa_kernels *fa_kernels_for(int level)
{
    if (level & FA_ISA_PORTABLE) return fa_portable_kernels_for(level & ~FA_ISA_PORTABLE);
    FA_KERNELS_FOR(level, fa_scalar, fa_base, fa_avx2, fa_avx2wide, fa_avx512)
}
