"""Concurrency and determinism.

- Many Python threads calling the kernel (and the fastattn.nn blocks) at once give the same
  bits as serial calls.
- The GIL is released while the kernel runs: a pure-Python counter thread keeps advancing.
- Use inside a user's own thread pool and under threadpoolctl limits neither deadlocks nor
  oversubscribes (OS threads counted from /proc/self/task), and leaks no OS threads; fastattn
  never changes OpenMP's or BLAS's global thread settings.
- Bitwise identical output for n_threads 1, 2, 3 and 8, for every micro-kernel set, and across
  repeated calls.
Hang guards use generous join timeouts; nothing asserts on speed.
"""
import os
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import fastattn
from fastattn._kernels import _attention as K
from fastattn._kernels import _simd

f = fastattn.scaled_dot_product_attention
HANG_TIMEOUT = 300          # seconds; only reached if something deadlocks
N_PY_THREADS = 8
ROUNDS = 4


def _problems():
    """A dozen varied problems: dtypes, tile edges, masks, causal, GQA, weights."""
    rng = np.random.default_rng(7)
    out = []
    for i, (dt, L, S, E, Ev) in enumerate([
            (np.float32, 65, 257, 16, 16), (np.float64, 64, 129, 8, 5), (np.float32, 1, 300, 64, 64),
            (np.float64, 130, 1, 3, 7), (np.float32, 200, 513, 33, 17), (np.float64, 63, 255, 1, 1),
            (np.float32, 129, 65, 65, 65), (np.float64, 257, 300, 16, 8), (np.float32, 7, 7, 7, 7),
            (np.float32, 100, 1000, 32, 32), (np.float64, 31, 31, 128, 9), (np.float32, 300, 64, 8, 80)]):
        H = 1 + i % 3
        q = rng.standard_normal((2, 2 * H, L, E)).astype(dt)
        k = rng.standard_normal((2, H, S, E)).astype(dt)
        v = rng.standard_normal((2, H, S, Ev)).astype(dt)
        kw = {"enable_gqa": True, "is_causal": bool(i % 2), "return_weights": i % 4 == 0}
        if i % 3 == 1:
            kw["attn_mask"] = rng.random((L, S)) < 0.7
        elif i % 3 == 2:
            m = rng.standard_normal((2, 1, L, S)).astype(dt)
            m[rng.random(m.shape) < 0.3] = -np.inf
            kw["attn_mask"] = m
        out.append(((q, k, v), kw))
    return out


PROBLEMS = _problems()


def _as_tuple(res):
    return res if isinstance(res, tuple) else (res,)


def _same_bits(a, b):
    return len(a) == len(b) and all(x.dtype == y.dtype and x.shape == y.shape and
                                    np.array_equal(x, y, equal_nan=True) for x, y in zip(a, b))


def _join_all(threads):
    for t in threads:
        t.join(HANG_TIMEOUT)
    alive = [t.name for t in threads if t.is_alive()]
    assert not alive, f"threads still running after {HANG_TIMEOUT} s (deadlock?): {alive}"


def test_many_python_threads_give_the_serial_bits():
    serial = [_as_tuple(f(*args, n_threads=1, **kw)) for args, kw in PROBLEMS]
    errors, calls = [], [0] * N_PY_THREADS

    def worker(tid):
        rnd = random.Random(tid)
        for _ in range(ROUNDS):
            order = list(range(len(PROBLEMS)))
            rnd.shuffle(order)
            for i in order:
                args, kw = PROBLEMS[i]
                res = _as_tuple(f(*args, n_threads=rnd.choice([None, 1, 2, 3]), **kw))
                calls[tid] += 1
                if not _same_bits(res, serial[i]):
                    errors.append((tid, i))

    threads = [threading.Thread(target=worker, args=(t,), name=f"w{t}") for t in range(N_PY_THREADS)]
    for t in threads:
        t.start()
    _join_all(threads)
    print(f"\nconcurrency: {N_PY_THREADS} Python threads, {sum(calls)} concurrent kernel calls")
    assert not errors, f"(thread, problem) pairs whose bits differ from the serial call: {errors[:10]}"
    assert sum(calls) == N_PY_THREADS * ROUNDS * len(PROBLEMS)


def test_concurrent_softmax_same_bits():
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(s).astype(dt) for s, dt in
          [((300, 77), np.float32), ((5, 1000), np.float64), ((64, 65, 3), np.float32)]]
    serial = [fastattn.softmax(x, n_threads=1) for x in xs]
    with ThreadPoolExecutor(N_PY_THREADS) as ex:
        futs = [ex.submit(fastattn.softmax, xs[i % 3], n_threads=1 + i % 3) for i in range(48)]
        res = [fu.result(timeout=HANG_TIMEOUT) for fu in futs]
    assert all(np.array_equal(r, serial[i % 3]) for i, r in enumerate(res))


def test_layers_blocks_concurrently_give_the_serial_bits():
    from fastattn import nn as layers
    rng = np.random.default_rng(2)
    mha = layers.MultiHeadAttention(32, 4, seed=0)
    enc = layers.TransformerEncoderLayer(32, 4, 64, seed=1)
    dec = layers.TransformerDecoderLayer(32, 4, 64, seed=2, dtype=np.float64)
    x = rng.standard_normal((3, 70, 32)).astype(np.float32)
    mem = rng.standard_normal((3, 20, 32))
    tgt = rng.standard_normal((3, 9, 32))
    pad = np.zeros((3, 70), bool)
    pad[1, 50:] = True
    jobs = [
        lambda: mha(x, x, x, key_padding_mask=pad),
        lambda: mha(x, x, x, is_causal=True, attn_mask=np.triu(np.ones((70, 70), bool), 1),
                    need_weights=True),
        lambda: enc(x, src_key_padding_mask=pad),
        lambda: dec(tgt, mem, tgt_is_causal=True, tgt_mask=np.triu(np.ones((9, 9), bool), 1)),
    ]
    serial = [_as_tuple(j()) for j in jobs]
    with ThreadPoolExecutor(N_PY_THREADS) as ex:
        futs = [(i % len(jobs), ex.submit(jobs[i % len(jobs)])) for i in range(8 * len(jobs))]
        for i, fu in futs:
            assert _same_bits(_as_tuple(fu.result(timeout=HANG_TIMEOUT)), serial[i]), i


def _counter_progress_during(call):
    """How far a pure-Python counter thread advances while `call` runs on this thread."""
    state = {"n": 0, "stop": False, "started": threading.Event()}

    def count():
        state["started"].set()
        while not state["stop"]:
            state["n"] += 1

    t = threading.Thread(target=count, daemon=True)
    t.start()
    state["started"].wait()
    before = state["n"]
    # the call again and again for 0.3 s (less than the 1 s switch interval): on a loaded
    # machine one short call may end before the counter thread is scheduled at all
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.3:
        call()
    after = state["n"]
    state["stop"] = True
    t.join(HANG_TIMEOUT)
    return after - before


def test_gil_is_released_during_the_kernel():
    old = sys.getswitchinterval()
    sys.setswitchinterval(1.0)      # with the GIL held, the counter could not run at all
    try:
        q = np.random.default_rng(3).standard_normal((1, 2048, 64))
        progress = _counter_progress_during(lambda: f(q, q, q, n_threads=1))
        x = np.random.default_rng(4).standard_normal((3000, 1000))
        progress_sm = _counter_progress_during(lambda: fastattn.softmax(x, n_threads=1))
    finally:
        sys.setswitchinterval(old)
    print(f"\ncounter advanced {progress} during sdpa, {progress_sm} during softmax")
    # a GIL-holding call would allow ~0 increments (one switch interval is 1 s here)
    assert progress > 1000 and progress_sm > 1000


def _os_threads():
    return len(os.listdir("/proc/self/task"))


class _ThreadSampler:
    """Peak OS thread count of this process, sampled from a background thread."""

    def __enter__(self):
        self.peak, self._stop = _os_threads(), threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _os_threads())
            self._stop.wait(0.002)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def test_user_thread_pool_under_threadpoolctl_limits_no_oversubscription():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    args, kw = PROBLEMS[9]
    ref = _as_tuple(f(*args, n_threads=1, **kw))
    n_user = 4
    seen = []

    def job(_):
        with threadpoolctl.threadpool_limits(limits=1, user_api="openmp"):
            seen.append(fastattn.get_num_threads())
            return [_as_tuple(f(*args, **kw)) for _ in range(3)]

    baseline = _os_threads()
    with _ThreadSampler() as s:
        with ThreadPoolExecutor(n_user) as ex:
            results = [r for fu in [ex.submit(job, i) for i in range(2 * n_user)]
                       for r in fu.result(timeout=HANG_TIMEOUT)]
    assert seen and all(n == 1 for n in seen), seen
    assert all(_same_bits(r, ref) for r in results)
    # the user's threads + our sampler, and no OpenMP team on top (limit 1 per user thread)
    assert s.peak <= baseline + n_user + 2, (baseline, s.peak)


def _settled_os_threads(timeout=2.0):
    """The OS thread count once it has stopped changing for 0.1 s (or after `timeout`)."""
    deadline = time.monotonic() + timeout
    last = _os_threads()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = _os_threads()
        if now == last:
            return now
        last = now
    return last


def test_nested_default_threads_bounded_and_no_thread_leak():
    """Each user thread gets at most get_num_threads() OpenMP threads; the OpenMP pools of
    finished user threads go away (no OS-thread growth over rounds)."""
    args, kw = PROBLEMS[4]
    ref = _as_tuple(f(*args, n_threads=1, **kw))
    n_user, per_call = 3, 2
    counts = []
    peak = 0
    for _ in range(4):
        with _ThreadSampler() as s:
            with ThreadPoolExecutor(n_user) as ex:
                futs = [ex.submit(lambda: _as_tuple(f(*args, n_threads=per_call, **kw)))
                        for _ in range(3 * n_user)]
                assert all(_same_bits(fu.result(timeout=HANG_TIMEOUT), ref) for fu in futs)
        peak = max(peak, s.peak)
        counts.append(_settled_os_threads())
    base = counts[0]
    print(f"\nOS threads after each round: {counts}, peak {peak}")
    # finished user threads' OpenMP teams are torn down asynchronously: allow that much slack,
    # but no growth from round to round
    assert max(counts) <= base + 2 and counts[-1] <= max(counts[:2]) + 1, counts
    # this thread's pool (<= 8) + user threads with their teams + the sampler
    assert peak <= counts[0] + n_user * per_call + 2 + 8


def test_fastattn_never_changes_global_thread_settings():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    before = [(i["user_api"], i["num_threads"]) for i in threadpoolctl.threadpool_info()]
    omp_before = K.omp_max_threads()
    args, kw = PROBLEMS[0]
    for n in (1, 2, 3, 8, None):
        f(*args, n_threads=n, **kw)
        fastattn.softmax(args[0], n_threads=n)
    after = [(i["user_api"], i["num_threads"]) for i in threadpoolctl.threadpool_info()]
    assert before == after and K.omp_max_threads() == omp_before


ISAS = ["scalar", "baseline", "avx2", "avx512"]


@pytest.mark.parametrize("isa", ISAS)
def test_bitwise_identical_for_thread_counts_and_repeats(isa):
    old = _simd.isa()
    got = _simd.set_isa(isa)
    try:
        if got != isa:
            pytest.skip(f"{isa} not supported by this CPU (got {got})")
        for args, kw in PROBLEMS:
            ref = _as_tuple(f(*args, n_threads=1, **kw))
            for n in (1, 2, 3, 8, 1, 8):
                assert _same_bits(_as_tuple(f(*args, n_threads=n, **kw)), ref), (isa, n)
            x = args[0].reshape(-1, args[0].shape[-1])
            s1 = fastattn.softmax(x, n_threads=1)
            for n in (2, 3, 8):
                assert np.array_equal(fastattn.softmax(x, n_threads=n), s1)
    finally:
        _simd.set_isa(old)


_FORK_CHILD = """
import multiprocessing as mp, sys
import numpy as np, fastattn
q = np.random.default_rng(0).standard_normal((4, 200, 16)).astype(np.float32)
a = fastattn.scaled_dot_product_attention(q, q, q, n_threads=2)   # parent's OpenMP pool exists

def child(conn):
    conn.send(fastattn.scaled_dot_product_attention(q, q, q, n_threads=2))

if __name__ == "__main__":
    ctx = mp.get_context("fork")
    r, w = ctx.Pipe(False)
    p = ctx.Process(target=child, args=(w,))
    p.start()
    ok = r.poll(10) and np.array_equal(r.recv(), a)
    p.join(1)
    if p.is_alive():
        p.kill()
    print("FORK-OK" if ok else "FORK-HUNG")
"""


def test_forked_child_does_not_hang(tmp_path):
    import subprocess
    script = tmp_path / "fork_child.py"
    script.write_text(_FORK_CHILD)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=HANG_TIMEOUT)
    assert "FORK-OK" in r.stdout, (r.stdout, r.stderr[-2000:])
