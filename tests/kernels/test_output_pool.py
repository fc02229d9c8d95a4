"""The per-thread pool of large output buffers (fastattn/_ops.py, _new_output).

A buffer goes back into use only when no array made from it is alive: held outputs, their
reshapes, slices and transposes keep their memory and their values. Results are the same bits
with the pool on and off, in a fresh process too; each thread has its own pool; the pool stays
under its byte bound. Off under the sanitizer (exact-size allocations), where these tests that
need it on skip.
"""
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from fastattn import _ops

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
F32 = np.dtype(np.float32)
pool_on = pytest.mark.skipif(
    _ops._POOL_FREE_REFS is None,
    reason="the sanitizer's exact-size allocations: the output pool is off"
    if os.environ.get("FASTATTN_SANITIZED") else
    "the output pool is off (FASTATTN_NO_OUTPUT_POOL, or no sys.getrefcount)")
BIG = (512, 1024)                    # 2 MiB of float32: pooled


def _packed_linear(seed, N, M, count, K=256):
    """A PackedLinear of a random (N, K) weight, the weight, and `count` random (M, K) inputs."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((N, K)).astype(np.float32)
    xs = [rng.standard_normal((M, K)).astype(np.float32) for _ in range(count)]
    return _ops.PackedLinear(w), w, xs


@pool_on
def test_a_freed_buffer_is_reused_and_a_live_one_is_not():
    _ops.release_output_pool()
    a = _ops._new_output(BIG, F32)
    pa = a.ctypes.data
    assert pa % 64 == 0 and a.flags.c_contiguous and a.flags.writeable
    b = _ops._new_output(BIG, F32)
    assert b.ctypes.data != pa                       # a is alive
    del a
    c = _ops._new_output(BIG, F32)
    assert c.ctypes.data == pa                       # a's buffer, free again
    # every kind of array made from c keeps the buffer
    del b, c
    for keep in (lambda t: t.reshape(-1), lambda t: t[3:], lambda t: t.T, lambda t: t[:, ::2],
                 lambda t: t.view(np.int32)):
        _ops.release_output_pool()
        c = _ops._new_output(BIG, F32)
        pc = c.ctypes.data
        derived = keep(c)
        del c
        d = _ops._new_output(BIG, F32)
        pd = d.ctypes.data
        assert pd != pc                              # derived is alive
        del d, derived
        e = _ops._new_output(BIG, F32)               # both free now: one of them, no third
        assert e.ctypes.data in (pc, pd)
        del e
    _ops.release_output_pool()


@pool_on
def test_held_outputs_keep_their_values():
    lin, w, x = _packed_linear(0, 1536, 384, 6)
    held = [lin(xi) for xi in x[:3]]                 # 2.25 MiB each: pooled
    ptrs = {h.ctypes.data for h in held}
    assert len(ptrs) == 3
    for _ in range(4):                               # more calls, their outputs dropped
        for xi in x[3:]:
            y = lin(xi)
            assert y.ctypes.data not in ptrs
            np.testing.assert_allclose(y, (xi.astype(np.float64) @ w.T.astype(np.float64)),
                                       rtol=1e-4, atol=1e-3)
            del y
    for h, xi in zip(held, x[:3]):
        np.testing.assert_array_equal(h, lin(xi))    # unchanged, bit for bit


@pool_on
def test_the_pool_stays_under_its_bound():
    _ops.release_output_pool()
    for i in range(40):                              # 40 sizes, 1-26 MiB, each freed at once
        y = _ops._new_output((256 + 97 * i, 1024 + 17 * i), F32)
        y[...] = 1.0
        del y
        n, held = _ops._pool_held()
        assert held <= _ops._POOL_BYTES
    live = [_ops._new_output((4096, 4096), F32) for _ in range(10)]   # 64 MiB each, all alive
    assert _ops._pool_held()[1] <= _ops._POOL_BYTES
    assert len({a.ctypes.data for a in live}) == 10
    del live
    _ops.release_output_pool()
    assert _ops._pool_held() == (0, 0)
    # a request over the bound is never pooled, and leaves the pool as it was
    kept = _ops._new_output(BIG, F32)
    del kept
    before = _ops._pool_held()
    assert before[0] == 1
    huge = _ops._new_output((_ops._POOL_BYTES // 4 + 1024,), F32)
    assert huge.shape == (_ops._POOL_BYTES // 4 + 1024,) and huge.ctypes.data % 64 == 0
    assert _ops._pool_held() == before
    del huge
    _ops.release_output_pool()


@pool_on
@pytest.mark.parametrize("derive", ["memoryview", "frombuffer", "asarray", "as_strided",
                                    "pickle5"])
def test_other_holders_keep_the_buffer(derive):
    import pickle
    _ops.release_output_pool()
    y = _ops._new_output(BIG, F32)
    y[...] = 3.0
    p = y.ctypes.data
    if derive == "memoryview":
        h = memoryview(y)
    elif derive == "frombuffer":
        h = np.frombuffer(y, np.float32)
    elif derive == "asarray":
        h = np.asarray(y)
    elif derive == "as_strided":
        h = np.lib.stride_tricks.as_strided(y, shape=(4,), strides=(4,))
    else:
        bufs = []
        blob = pickle.dumps(y, protocol=5, buffer_callback=bufs.append)
        h = (blob, bufs)
    del y
    z = _ops._new_output(BIG, F32)
    assert z.ctypes.data != p
    z[...] = -1.0
    if derive == "pickle5":
        back = pickle.loads(h[0], buffers=h[1])
        assert (back == 3.0).all()
    else:
        assert (np.asarray(h) == 3.0).all()
    del h, z
    _ops.release_output_pool()


@pool_on
def test_threads_have_their_own_pools_and_the_same_results():
    lin, _, xs = _packed_linear(1, 2048, 512, 4)
    want = [lin(xi, n_threads=1).copy() for xi in xs]
    errors, ptrs = [], []
    done = threading.Barrier(4)

    def work(t):
        mine = set()
        for _ in range(25):
            for xi, wi in zip(xs, want):
                y = lin(xi, n_threads=1)
                mine.add(y.ctypes.data)
                if not np.array_equal(y, wi):
                    errors.append(t)
                del y
        ptrs.append(mine)
        done.wait()                  # every thread's pool alive until all have finished
        _ops.release_output_pool()

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i in range(4):
        for j in range(i + 1, 4):
            assert ptrs[i].isdisjoint(ptrs[j])       # no buffer shared between threads


_CHILD = textwrap.dedent("""
    import hashlib, sys
    import numpy as np
    import fastattn
    from fastattn import _ops
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 128, 384)).astype(np.float32)
    layer = fastattn.nn.TransformerEncoderLayer(384, 6, 1536, activation="gelu",
                                                seed=0)
    out = [layer(x).copy() for _ in range(3)]        # the first call in a fresh process
    assert all(np.array_equal(out[0], o) for o in out[1:])
    print(_ops._POOL_FREE_REFS is not None, hashlib.sha256(out[0].tobytes()).hexdigest())
""")


def test_the_same_bits_with_and_without_the_pool_in_fresh_processes():
    res = {}
    for off in ("", "1"):
        env = dict(os.environ)
        env.pop("FASTATTN_NO_OUTPUT_POOL", None)
        if off:
            env["FASTATTN_NO_OUTPUT_POOL"] = off
        r = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                           timeout=300, cwd=HERE, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        on, digest = r.stdout.split()
        res[off] = (on == "True", digest)
    assert res["1"][0] is False
    # on in the child without the switch, unless the sanitizer's exact sizes are in force
    assert res[""][0] is (not os.environ.get("FASTATTN_SANITIZED") and hasattr(sys, "getrefcount"))
    assert res[""][1] == res["1"][1]
