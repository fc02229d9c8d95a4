"""Threads: bitwise identical results for any thread count, OMP_NUM_THREADS / threadpoolctl /
set_num_threads precedence, concurrency from Python threads."""
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import fastattn
from fastattn import scaled_dot_product_attention as sdpa

# child interpreters run from here: `python -c` puts its working directory first on sys.path,
# and from a source checkout that would import the uncompiled fastattn/ folder
# the tests folder (child interpreters run there: see conftest.py)
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [False, True])
def test_bitwise_identical_for_any_thread_count(rng, dtype, causal):
    q = rng.standard_normal((2, 3, 150, 32)).astype(dtype)
    k = rng.standard_normal((2, 3, 600, 32)).astype(dtype)
    v = rng.standard_normal((2, 3, 600, 24)).astype(dtype)
    mask = rng.random((150, 600)) > 0.2
    ref, wref = sdpa(q, k, v, attn_mask=mask, is_causal=causal, n_threads=1, return_weights=True)
    for n in (2, 3, 8):
        out, w = sdpa(q, k, v, attn_mask=mask, is_causal=causal, n_threads=n, return_weights=True)
        assert np.array_equal(out, ref) and np.array_equal(w, wref), n
    x = rng.standard_normal((300, 77)).astype(dtype)
    s1 = fastattn.softmax(x, n_threads=1)
    for n in (2, 3, 8):
        assert np.array_equal(fastattn.softmax(x, n_threads=n), s1)


def test_set_get_num_threads():
    default = fastattn.get_num_threads()
    assert default >= 1
    try:
        fastattn.set_num_threads(3)
        assert fastattn.get_num_threads() == 3
    finally:
        fastattn.set_num_threads(None)
    assert fastattn.get_num_threads() == default


def _run(code, **env):
    # the variables these tests set, cleared from the inherited environment first (CI's
    # sanitized run sets OMP_WAIT_POLICY)
    base = {k: v for k, v in os.environ.items()
            if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    full = dict(base, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full,
                          check=True, cwd=HERE).stdout.strip()


def test_omp_num_threads_is_respected():
    assert _run("import fastattn; print(fastattn.get_num_threads())", OMP_NUM_THREADS="3") == "3"
    assert _run("import fastattn; print(fastattn.get_num_threads())", OMP_NUM_THREADS="1") == "1"


def test_threadpoolctl_openmp_limit():
    pytest.importorskip("threadpoolctl")
    code = ("import fastattn, threadpoolctl\n"
            "with threadpoolctl.threadpool_limits(1, user_api='openmp'):\n"
            "    print(fastattn.get_num_threads())\n")
    assert _run(code, OMP_NUM_THREADS="2") == "1"


def test_concurrent_python_threads_same_bits(rng):
    q = rng.standard_normal((4, 2, 100, 16)).astype(np.float32)
    k = rng.standard_normal((4, 2, 300, 16)).astype(np.float32)
    v = rng.standard_normal((4, 2, 300, 16)).astype(np.float32)
    ref = sdpa(q, k, v, is_causal=True)
    with ThreadPoolExecutor(8) as ex:
        outs = list(ex.map(lambda _: sdpa(q, k, v, is_causal=True), range(32)))
    assert all(np.array_equal(o, ref) for o in outs)


def test_show_config_reports(capsys):
    fastattn.show_config()
    text = capsys.readouterr().out
    for field in ("version", fastattn.__version__, "openmp", "simd", "blas", "threads", "compile_flags"):
        assert field in text
    assert "-march=native" not in text and "-ffast-math" not in text


def test_import_leaves_openmp_environment_as_found():
    """fastattn shortens libgomp's spin only while its own runtime loads (GOMP_SPINCOUNT), then
    removes the variable; a user's setting is kept and wins."""
    code = ("import os, fastattn; print(os.environ.get('GOMP_SPINCOUNT', 'unset'), "
            "os.environ.get('OMP_WAIT_POLICY', 'unset'))")
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True, cwd=HERE).stdout.split()
    assert out == ["unset", "unset"]
    assert _run(code, GOMP_SPINCOUNT="1234").split() == ["1234", "unset"]
    assert _run(code, OMP_WAIT_POLICY="active").split() == ["unset", "active"]
