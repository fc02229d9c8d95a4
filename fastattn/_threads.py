"""Thread control: how many OpenMP threads a kernel call uses (and only that).

Precedence for a call: its `n_threads=` argument, then `set_num_threads()`, then what OpenMP
itself would use now (`omp_get_max_threads()`, which follows OMP_NUM_THREADS and threadpoolctl's
`threadpool_limits(..., user_api="openmp")`), capped by the CPUs this process may run on unless
OMP_NUM_THREADS is set explicitly. We never call omp_set_num_threads: that state is shared with
every other library using the same OpenMP runtime.
"""
import functools
import os

from ._kernels import _attention as _k
from ._validation import check_n_threads

__all__ = ["get_num_threads", "set_num_threads"]

_override = None
# GNU libgomp is not fork-safe: a child fork()ed after the parent ran a parallel region hangs in
# its first one. Children therefore run fastattn's kernels on one thread (as PyTorch does).
_in_forked_child = False


def _after_fork_in_child():
    global _in_forked_child
    _in_forked_child = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@functools.lru_cache(maxsize=None)
def _cpu_count():
    """CPUs this process may use (read once: affinity changes after import are not followed)."""
    if hasattr(os, "process_cpu_count"):
        n = os.process_cpu_count()
    elif hasattr(os, "sched_getaffinity"):
        n = len(os.sched_getaffinity(0))
    else:
        n = os.cpu_count()
    return max(1, n or 1)


def set_num_threads(n):
    """Set the default number of threads for fastattn's kernels (None: back to OpenMP's)."""
    global _override
    _override = None if n is None else check_n_threads(n, "n")


def get_num_threads():
    """Number of threads a kernel call will use by default."""
    if _override is not None:
        return _override
    n = _k.omp_max_threads()
    if "OMP_NUM_THREADS" not in os.environ:
        n = min(n, _cpu_count())
    return max(1, n)


def _effective_n_threads(n_threads):
    """Threads for one call. Requests beyond 4 x the usable CPUs are capped there (threads past
    that only add overhead, and a request like 10**6 would exhaust the process), and a fork()ed
    child runs serially (libgomp is not fork-safe); the result does not depend on the thread
    count, so neither changes an answer."""
    n = get_num_threads() if n_threads is None else check_n_threads(n_threads)
    if _in_forked_child:
        return 1
    return min(n, 4 * _cpu_count())
