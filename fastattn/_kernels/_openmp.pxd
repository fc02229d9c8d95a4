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
