# The one ISA state (simd.h, dispatch.c), for the other kernel modules: each reads it at every
# call with isa_now() and hands it to its kernels (`from fastattn._kernels._simd cimport isa_now`);
# isa_features() is what they may use of the CPU (its features less the FASTATTN_ISA cap: the
# int8 GEMM picks its variant from them).
cdef int isa_now() noexcept nogil
cdef unsigned isa_features() noexcept nogil
