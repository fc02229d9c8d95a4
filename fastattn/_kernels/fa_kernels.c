/* fa_kernels.c -- instantiates the tile micro-kernels of fa_tile.h per dtype and ISA, and picks
 * the best one the running CPU supports, once, at import (fa_init). The wheel is built for the
 * baseline x86-64 ISA; the AVX2 and AVX-512 versions are compiled with function-level target
 * attributes and selected at run time, so no -march flag is needed.
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
#define FA_IS_DOUBLE 0
#define FA_VW 1
#define FA_MR 1
#define FA_NV 1
#define FA_NAME(x) x##_f32_scalar
#define FA_TARGET
#include "fa_tile.h"

#define FA_IS_DOUBLE 1
#define FA_VW 1
#define FA_MR 1
#define FA_NV 1
#define FA_NAME(x) x##_f64_scalar
#define FA_TARGET
#include "fa_tile.h"

#if FA_GNU_VECTORS
/* ---- generic vectors at the baseline ISA (SSE2 on x86-64, NEON on arm64) */
#define FA_IS_DOUBLE 0
#define FA_VW 4
#define FA_MR 4
#define FA_NV 2
#define FA_NAME(x) x##_f32_base
#define FA_TARGET
#include "fa_tile.h"

#define FA_IS_DOUBLE 1
#define FA_VW 2
#define FA_MR 4
#define FA_NV 2
#define FA_NAME(x) x##_f64_base
#define FA_TARGET
#include "fa_tile.h"
#endif

#if FA_X86
/* ---- AVX2 + FMA: 16 ymm registers; a 6 x 2-vector block keeps 12 accumulators live */
#define FA_IS_DOUBLE 0
#define FA_VW 8
#define FA_MR 6
#define FA_NV 2
#define FA_NAME(x) x##_f32_avx2
#define FA_VMAX _mm256_max_ps
#define FA_TARGET FA_TARGET_AVX2
#include "fa_tile.h"

#define FA_IS_DOUBLE 1
#define FA_VW 4
#define FA_MR 6
#define FA_NV 2
#define FA_NAME(x) x##_f64_avx2
#define FA_VMAX _mm256_max_pd
#define FA_TARGET FA_TARGET_AVX2
#include "fa_tile.h"

/* ---- test-only: the AVX-512 shapes (16 floats / 8 doubles a vector, 6 x 4 blocks) compiled for
 * AVX2, so that the exact template instance the AVX-512 build uses is exercised by the test suite
 * on machines without AVX-512. Never selected automatically. */
#define FA_IS_DOUBLE 0
#define FA_VW 16
#define FA_MR 6
#define FA_NV 4
#define FA_NAME(x) x##_f32_avx2wide
#define FA_TARGET FA_TARGET_AVX2
#include "fa_tile.h"

#define FA_IS_DOUBLE 1
#define FA_VW 8
#define FA_MR 6
#define FA_NV 4
#define FA_NAME(x) x##_f64_avx2wide
#define FA_TARGET FA_TARGET_AVX2
#include "fa_tile.h"

/* ---- AVX-512F: 32 zmm registers; a 6 x 4-vector block keeps 24 accumulators live */
#define FA_IS_DOUBLE 0
#define FA_VW 16
#define FA_MR 6
#define FA_NV 4
#define FA_NAME(x) x##_f32_avx512
#define FA_VMAX _mm512_max_ps
#define FA_TARGET FA_TARGET_AVX512
#include "fa_tile.h"

#define FA_IS_DOUBLE 1
#define FA_VW 8
#define FA_MR 6
#define FA_NV 4
#define FA_NAME(x) x##_f64_avx512
#define FA_VMAX _mm512_max_pd
#define FA_TARGET FA_TARGET_AVX512
#include "fa_tile.h"
#endif

/* ---- dispatch tables */
#define FA_FILL(tab, sfx)                       \
    do {                                        \
        (tab).qk_tile = qk_tile_##sfx;          \
        (tab).pv_tile = pv_tile_##sfx;          \
        (tab).row_update = row_update_##sfx;    \
        (tab).row_weights = row_weights_##sfx;  \
        (tab).softmax_row = softmax_row_##sfx;  \
        (tab).exp_array = exp_array_##sfx;      \
        (tab).pack_k = pack_k_##sfx;            \
        (tab).pack_v = pack_v_##sfx;            \
        (tab).scale_rows = scale_rows_##sfx;    \
        (tab).store_rows = store_rows_##sfx;    \
        (tab).qk_direct = qk_direct_##sfx;      \
        (tab).pv_direct = pv_direct_##sfx;      \
    } while (0)

fa_ops_f32 fa_f32;
fa_ops_f64 fa_f64;
static int fa_isa_level = -1;

/* Select the kernels for `level` (clamped to what the CPU supports). Returns the level used. */
int fa_init(int level)
{
    level = fa_select_level(level);
    switch (level) {
#if FA_X86
    case FA_ISA_AVX2_WIDE:
        FA_FILL(fa_f32, f32_avx2wide);
        FA_FILL(fa_f64, f64_avx2wide);
        break;
    case FA_ISA_AVX512:
        FA_FILL(fa_f32, f32_avx512);
        FA_FILL(fa_f64, f64_avx512);
        break;
    case FA_ISA_AVX2:
        FA_FILL(fa_f32, f32_avx2);
        FA_FILL(fa_f64, f64_avx2);
        break;
#endif
#if FA_GNU_VECTORS
    case FA_ISA_BASE:
        FA_FILL(fa_f32, f32_base);
        FA_FILL(fa_f64, f64_base);
        break;
#endif
    default:
        level = FA_ISA_SCALAR;
        FA_FILL(fa_f32, f32_scalar);
        FA_FILL(fa_f64, f64_scalar);
        break;
    }
    fa_isa_level = level;
    return level;
}

int fa_current_level(void) { return fa_isa_level; }
