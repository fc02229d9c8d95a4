"""Resource limits: a call's memory is planned before any of it is allocated.

Every model-level call whose allocations grow with its arguments (the KV cache, beam state,
logits, activations, kernel workspaces, padded batches) first adds up an upper bound of the bytes
it will hold at once (the models' ``_plan_*`` methods), and :func:`check_plan` compares it with the
memory this process can still get: the smallest of the system's available memory
(``MemAvailable``), the cgroup's limit less its usage, and ``RLIMIT_AS`` less the address space
in use. A plan larger than that is a ``MemoryError`` naming the arguments and the bytes, raised
before anything is allocated and before any time is spent: a request such as
``num_beams=100000`` no longer gets the process killed by the kernel's OOM killer (on a shared
server, after it has pushed other processes' memory out).

Plans under 16 MiB are not checked. ``FASTATTN_NO_MEMORY_CHECK=1`` (read at each call) turns
the check off for users who know better
(memory that will be freed by others in time, swap).
"""
import os
import resource

__all__ = ["available_bytes", "check_plan", "format_bytes", "proc_bytes"]

_OPT_OUT = "FASTATTN_NO_MEMORY_CHECK"
# plans below this are not checked: reading the limits costs ~50 us (a 1 x 16 sentence embeds
# in ~1.5 ms), and a process that cannot get 16 MiB more fails at its next import anyway
_SMALL_PLAN = 16 << 20


def _read_int(path):
    try:
        with open(path) as f:
            text = f.read().strip()
    except (OSError, ValueError):
        return None
    if not text or text == "max":
        return None
    try:
        return int(text.split()[0])
    except ValueError:
        return None


def proc_bytes(path, key):
    """The ``key:`` line of a /proc file in kB units (``/proc/meminfo``, ``/proc/self/status``)
    as bytes, or None when the file or the line cannot be read. fastattn's one reader of them
    (the memory plans here; the benchmarks' available memory and peak RSS)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _meminfo(key):
    return proc_bytes("/proc/meminfo", key)


def _vm_size():
    return proc_bytes("/proc/self/status", "VmSize")


def _cgroup_room():
    """The cgroup's memory limit less its usage (v2, then v1), or None without a limit."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":                                # cgroup v2
            base = os.path.join("/sys/fs/cgroup", path.lstrip("/"))
            limit = _read_int(os.path.join(base, "memory.max"))
            used = _read_int(os.path.join(base, "memory.current"))
        elif "memory" in controllers.split(","):              # cgroup v1
            base = os.path.join("/sys/fs/cgroup/memory", path.lstrip("/"))
            limit = _read_int(os.path.join(base, "memory.limit_in_bytes"))
            used = _read_int(os.path.join(base, "memory.usage_in_bytes"))
            if limit is not None and limit >= 1 << 60:        # v1's "no limit"
                limit = None
        else:
            continue
        if limit is not None:
            return max(0, limit - (used or 0))
    return None


def available_bytes():
    """The memory this process can still get, in bytes: the smallest of MemAvailable, the
    cgroup's limit less its usage and RLIMIT_AS less the address space in use (None when none
    of them is known)."""
    room = [r for r in (_meminfo("MemAvailable"), _cgroup_room()) if r is not None]
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        room.append(max(0, soft - (_vm_size() or 0)))
    return min(room) if room else None


def format_bytes(n):
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def check_plan(nbytes, what):
    """Raise MemoryError when a call planning `nbytes` cannot get them; `what` names the call
    and the arguments that set its size (e.g. "generate(input_ids (8, 128), num_beams=4,
    max_new_tokens=64)")."""
    if nbytes < _SMALL_PLAN or os.environ.get(_OPT_OUT, "") not in ("", "0"):
        return
    avail = available_bytes()
    if avail is not None and nbytes > avail:
        raise MemoryError(
            f"{what} needs about {format_bytes(nbytes)} ({nbytes} bytes) at once, more than the "
            f"{format_bytes(avail)} this process can get (available memory, cgroup limit, "
            f"RLIMIT_AS); nothing was allocated. Ask for less, or set {_OPT_OUT}=1 to skip this "
            "check")


_TRIM = []


def release_free_memory():
    """Give the C heap's free pages back to the system (glibc's malloc_trim; nothing elsewhere).

    Loading a model frees its float arrays once they are packed or quantized; many of those
    blocks sit below glibc's mmap threshold, and their pages stay in the process (a Marian base
    quantized at load kept 560 MiB resident for 90 MiB of parameters, 76 MiB after a trim)."""
    if not _TRIM:
        trim = None
        try:
            import ctypes
            import ctypes.util
            name = ctypes.util.find_library("c")
            lib = ctypes.CDLL(name) if name else None
            trim = getattr(lib, "malloc_trim", None)
        except (OSError, AttributeError):       # not glibc: nothing to do
            trim = None
        _TRIM.append(trim)
    if _TRIM[0] is not None:
        _TRIM[0](0)
