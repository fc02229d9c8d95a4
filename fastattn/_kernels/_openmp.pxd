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
    # keeps a team's workers off the master's CPU (Linux; see fa_team.h): fa_team_open before
    # each parallel region, fa_team_place first thing in it, on every thread
    ctypedef struct fa_team_t:
        int cpu
    fa_team_t fa_team_open(int n_threads)
    void fa_team_place(const fa_team_t *t)
