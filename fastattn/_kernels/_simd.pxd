# The one ISA state (simd.h, dispatch.c), for the other kernel modules: each reads it at every
# call with isa_now() and hands it to its kernels (`from fastattn._kernels._simd cimport isa_now`).
cdef int isa_now() noexcept nogil
