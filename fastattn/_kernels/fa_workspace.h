/* fa_workspace.h -- the kernels' workspace memory: exact-size, 64-byte aligned allocations, and
 * the debug-build check that every piece a kernel touches lies inside the piece it was given.
 *
 * Exact size matters for testing: AddressSanitizer reports a write one byte past an allocation,
 * so the workspace is never rounded up or over-allocated for alignment (the allocator aligns).
 * The driver (_attention.pyx) sizes everything in one function, _plan().
 */
#ifndef FASTATTN_FA_WORKSPACE_H
#define FASTATTN_FA_WORKSPACE_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#ifdef _WIN32
#include <malloc.h>
#endif

#define FA_WS_ALIGN 64

/* nbytes (> 0) of memory aligned to FA_WS_ALIGN bytes, or NULL */
static void *fa_ws_alloc(size_t nbytes)
{
    if (nbytes == 0) nbytes = 1;
#ifdef _WIN32
    return _aligned_malloc(nbytes, FA_WS_ALIGN);
#else
    void *p = NULL;
    return posix_memalign(&p, FA_WS_ALIGN, nbytes) == 0 ? p : NULL;
#endif
}

static void fa_ws_free(void *p)
{
#ifdef _WIN32
    _aligned_free(p);
#else
    free(p);
#endif
}

/* FA_ASSERT_IN(p, nbytes, lo, hi): in debug builds (FASTATTN_DEBUG, used by ci/sanitize.sh),
 * abort with a message unless [p, p + nbytes) lies inside [lo, hi). Free in release builds. */
#ifdef FASTATTN_DEBUG
static void fa_assert_in(const void *p, ptrdiff_t nbytes, const void *lo, const void *hi,
                         const char *what, int line)
{
    const char *a = (const char *)p, *l = (const char *)lo, *h = (const char *)hi;
    if (nbytes < 0 || a < l || a + nbytes > h) {
        fprintf(stderr, "fastattn: %s: [%p, +%td) lies outside its piece [%p, %p) (line %d)\n",
                what, p, nbytes, lo, hi, line);
        fflush(stderr);
        abort();
    }
}
#define FA_ASSERT_IN(p, nbytes, lo, hi, what) fa_assert_in((p), (nbytes), (lo), (hi), (what), __LINE__)
#else
#define FA_ASSERT_IN(p, nbytes, lo, hi, what) ((void)0)
#endif

#endif
