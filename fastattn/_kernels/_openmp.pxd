# Run-time OpenMP helpers that also compile without OpenMP (the sklearn pattern): when the
# extension is built without -fopenmp, _OPENMP is undefined and these fall back to one thread.
cdef extern from *:
    """
    #ifdef _OPENMP
    #include <omp.h>
    #define FASTATTN_OPENMP_ENABLED 1
    #else
    #define FASTATTN_OPENMP_ENABLED 0
    #define omp_get_max_threads() 1
    #define omp_get_thread_num() 0
    #endif
    """
    bint FASTATTN_OPENMP_ENABLED
    int omp_get_max_threads() nogil
    int omp_get_thread_num() nogil

cdef extern from "fa_team.h" nogil:
    # launching an OpenMP team (see fa_team.h), the one way every parallel region starts:
    #     cdef fa_team_t team = fa_team_open(n_threads, items)   # team.n = clamp(n_threads, 1, items)
    #     with nogil, parallel(num_threads=team.n):
    #         fa_team_place(&team)                              # keeps workers off the master's CPU
    ctypedef struct fa_team_t:
        int n
    int fa_team_size(Py_ssize_t n_threads, Py_ssize_t items)
    fa_team_t fa_team_open(Py_ssize_t n_threads, Py_ssize_t items)
    void fa_team_place(const fa_team_t *t)
