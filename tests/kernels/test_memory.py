"""Memory: no leaks over many calls, and allocation failures become MemoryError, not a crash.

- 10,000 calls of assorted small problems (FASTATTN_MEMORY_CALLS) after a warm-up leave the
  resident set (VmRSS, /proc/self/status) flat within RSS_BOUND_MIB, and tracemalloc's traced
  memory (NumPy reports its data buffers there) flat within TRACED_BOUND_KIB.
- Requests too big to allocate raise MemoryError: in-process for absurd sizes (petabytes), and
  in a child process with a lowered RLIMIT_AS for sizes that would otherwise be attempted.
"""
import gc
import json
import os
import subprocess
import sys
import textwrap
import tracemalloc

import numpy as np
import pytest

import fastattn
from fastattn._kernels import _attention as K

# child interpreters run from here: `python -c` puts its working directory first on sys.path,
# and from a source checkout that would import the uncompiled fastattn/ folder
# the tests folder (child interpreters run there: see conftest.py)
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

f = fastattn.scaled_dot_product_attention
N_CALLS = int(os.environ.get("FASTATTN_MEMORY_CALLS", "10000"))
WARMUP = 1000
RSS_BOUND_MIB = 8.0           # growth of VmRSS over N_CALLS calls after warm-up
TRACED_BOUND_KIB = 256.0      # growth of tracemalloc's traced memory over the same calls
SANITIZED = bool(os.environ.get("FASTATTN_SANITIZED")) or "asan" in os.environ.get("LD_PRELOAD", "")
linux_only = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")


def _vm(field):
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0     # MiB
    raise KeyError(field)


def _workload():
    """Assorted small calls: dtypes, masks, causal, GQA, weights, copies for odd layouts,
    softmax, and calls that fail validation (error paths must not leak either)."""
    rng = np.random.default_rng(0)
    calls = []
    for i, (L, S, E, Ev) in enumerate([(1, 1, 1, 1), (3, 5, 4, 2), (17, 33, 8, 8), (65, 65, 16, 16),
                                       (5, 0, 4, 4), (0, 5, 4, 4), (2, 300, 32, 1)]):
        for dt in (np.float32, np.float64):
            q = rng.standard_normal((2, 2, L, E)).astype(dt)
            k = rng.standard_normal((2, 1, S, E)).astype(dt)
            v = rng.standard_normal((2, 1, S, Ev)).astype(dt)
            mask = rng.random((L, S)) < 0.7 if i % 2 else \
                np.where(rng.random((1, L, S)) < 0.3, -np.inf, 0.0).astype(dt)
            nt = 2 if i == 1 else 1     # one multi-threaded problem; the rest stay cheap
            calls.append(lambda q=q, k=k, v=v: f(q, k, v, enable_gqa=True, n_threads=1))
            calls.append(lambda q=q, k=k, v=v, m=mask: f(q, k, v, m, enable_gqa=True, is_causal=True,
                                                         return_weights=True, n_threads=nt))
            calls.append(lambda q=q, k=k, v=v: f(np.asfortranarray(q[0, 0]), k[0, 0].T.copy().T,
                                                 v[0, 0][::-1], n_threads=nt))
    x = rng.standard_normal((40, 70))
    calls.append(lambda: fastattn.softmax(x))
    calls.append(lambda: fastattn.softmax(x.astype(np.float32), axis=0))

    def bad():
        try:
            f(np.ones((2, 3)), np.ones((4, 5)), np.ones((4, 2)))
        except ValueError:
            pass
        try:
            f(np.ones((2, 3)), np.ones((4, 3)), np.ones((4, 2)), scale="x")
        except TypeError:
            pass
    calls.append(bad)
    return calls


@linux_only
def test_resident_memory_flat_over_many_calls():
    calls = _workload()
    for i in range(WARMUP):
        calls[i % len(calls)]()
    gc.collect()
    tracemalloc.start()
    rss0, traced0 = _vm("VmRSS"), tracemalloc.get_traced_memory()[0]
    samples = []
    for i in range(N_CALLS):
        calls[i % len(calls)]()
        if i % (N_CALLS // 10 or 1) == 0:
            samples.append(round(_vm("VmRSS") - rss0, 2))
    gc.collect()
    rss1, traced1 = _vm("VmRSS"), tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    growth, traced = rss1 - rss0, (traced1 - traced0) / 1024.0
    print(f"\nmemory: {N_CALLS} calls after {WARMUP} warm-up: VmRSS {rss0:.1f} -> {rss1:.1f} MiB "
          f"(growth {growth:+.2f} MiB, bound {RSS_BOUND_MIB}); traced {traced:+.1f} KiB "
          f"(bound {TRACED_BOUND_KIB}); RSS samples {samples}")
    assert traced < TRACED_BOUND_KIB
    if SANITIZED:
        return      # ASan's quarantine keeps freed memory resident: no RSS bound under it
    assert growth < RSS_BOUND_MIB


@pytest.mark.parametrize("what", ["weights", "output", "softmax"])
def test_absurd_allocation_raises_memory_error(what):
    """Petabyte requests (from tiny inputs through broadcasting) fail cleanly in-process."""
    q = np.ones((1 << 15, 1), np.float32)
    v = np.ones((1 << 15, 1), np.float32)
    big_lead = np.ones((1 << 20, 1, 1), bool)       # broadcasts the batch to 2**20
    with pytest.raises((MemoryError, ValueError)) as info:
        if what == "weights":                          # 2**20 * 2**30 * 4 bytes = 4 PiB
            f(q, q, v, attn_mask=big_lead, return_weights=True)
        elif what == "output":                         # 2**20 * 2**15 * 2**15 * 4 = 4 PiB
            f(q, q, np.broadcast_to(np.ones((1, 1), np.float32), (1 << 15, 1 << 15)),
              attn_mask=big_lead)
        else:
            fastattn.softmax(np.broadcast_to(np.float32(0), (1 << 25, 1 << 25)))
    if isinstance(info.value, ValueError):
        assert "too big" in str(info.value) or "allocate" in str(info.value)


_RLIMIT_CHILD = r"""
import json, resource, sys
import numpy as np, fastattn
f = fastattn.scaled_dot_product_attention
# warm up the OpenMP pool first: creating threads under a tight limit is a different failure
x = np.ones((4, 200, 8), np.float32)
f(x, x, x, n_threads=2)

def vm(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

limit = vm("VmSize") + (768 << 20)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
results = {}

def attempt(name, fn, check):
    try:
        out = fn()
    except MemoryError:
        results[name] = "MemoryError"
        return
    results[name] = "ok" if check(out) else "WRONG RESULT"

q = np.ones((50000, 4), np.float32)
v = np.ones((50000, 2), np.float32)
# 50000 x 50000 float32 weights: 9.3 GiB
attempt("weights 10 GB", lambda: f(q, q, v, return_weights=True, n_threads=2),
        lambda r: np.allclose(r[0], 1))
# output (4096, 50000, 2) float32 via a broadcasting mask: 1.5 GiB
attempt("output 1.5 GB", lambda: f(q, q, v, attn_mask=np.ones((4096, 1, 1), bool), n_threads=2),
        lambda r: r.shape == (4096, 50000, 2))
# value head size 2**24: per-thread scratch / accumulators scale with Ev
vv = np.ones((2, 1 << 24), np.float32)
attempt("Ev = 2**24", lambda: f(np.ones((300, 1), np.float32), np.ones((2, 1), np.float32), vv,
                               n_threads=2), lambda r: r.shape == (300, 1 << 24) and np.all(r == 1))
# key head size 2**22 with many queries (packed key tiles scale with E)
kk = np.ones((3, 1 << 22), np.float32) * 1e-3
qq = np.broadcast_to(np.full((1, 1 << 22), 1e-3, np.float32), (300, 1 << 22))   # zero row stride
attempt("E = 2**22", lambda: f(qq, kk, np.ones((3, 1), np.float32), n_threads=2),
        lambda r: r.shape == (300, 1) and np.allclose(r, 1))
# a normal call still works afterwards
attempt("after", lambda: f(x, x, x, n_threads=2), lambda r: np.allclose(r, 1))
print("RLIMIT-RESULT " + json.dumps(results))
"""


@linux_only
@pytest.mark.skipif(SANITIZED, reason="AddressSanitizer reserves terabytes of address space: "
                    "RLIMIT_AS cannot be lowered under it")
def test_too_big_requests_raise_memory_error_under_rlimit_as(tmp_path):
    script = tmp_path / "rlimit_child.py"
    script.write_text(_RLIMIT_CHILD)
    env = dict(os.environ, OMP_NUM_THREADS="2")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                       env=env)
    assert r.returncode == 0, f"child died (rc {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    line = [x for x in r.stdout.splitlines() if x.startswith("RLIMIT-RESULT ")]
    assert line, (r.stdout[-2000:], r.stderr[-2000:])
    res = json.loads(line[-1][len("RLIMIT-RESULT "):])
    print("\nunder RLIMIT_AS = VmSize + 768 MiB:", res)
    assert res["weights 10 GB"] == "MemoryError"
    assert res["output 1.5 GB"] == "MemoryError"
    assert res["after"] == "ok"
    assert all(v in ("MemoryError", "ok") for v in res.values()), res


@pytest.mark.parametrize("itemsize", [4, 8])
def test_key_block_does_not_overflow_for_huge_head_sizes(itemsize):
    sizes = [K.key_block(1 << p, 1, itemsize) for p in range(4, 28)]
    assert all(a >= b for a, b in zip(sizes, sizes[1:])), sizes     # non-increasing in E
    assert sizes[-1] == min(sizes)


@linux_only
def test_huge_head_size_memory_is_proportional(tmp_path):
    """A (1, 2**21) float32 query (8 MiB) must not need gigabytes: peak RSS in a child stays
    within a small multiple of the input size."""
    code = textwrap.dedent("""
        import resource, numpy as np, fastattn
        E = 1 << 21
        q = np.ones((1, E), np.float32); v = np.ones((1, 1), np.float32)
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out = fastattn.scaled_dot_product_attention(q, q, v, n_threads=1)
        assert out.shape == (1, 1) and out[0, 0] == 1
        print("PEAK-MIB", (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=HERE)
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    peak = float(r.stdout.split("PEAK-MIB")[1])
    print(f"\nE = 2**21: extra peak RSS {peak:.1f} MiB")
    assert peak < 200 + (0 if not SANITIZED else 1000)
