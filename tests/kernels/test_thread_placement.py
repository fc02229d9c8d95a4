"""Worker placement (fa_team.h): a worker found on its master's CPU at the start of a parallel
region moves off it, within the master's affinity mask; nothing moves when the user bound the
threads, turned placement off, restricted the master to fewer CPUs than the team, or asked for
more threads than CPUs. The master's own mask is never changed.

Each case runs in a fresh interpreter with OpenBLAS single-threaded, so that the only threads
besides the main one are the OpenMP team's workers. A worker is forced onto the master's CPU
by setting its affinity to that one CPU, as the scheduler's wake-up placement can leave it."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
    reason="thread placement is Linux-only and needs two CPUs")

# The child: make the team's workers exist, then up to 30 times pin every worker to the CPU the
# main thread is on and make one call; report the masks seen after the first call that found a
# worker moved (or after the last). The main thread may migrate between the pinning and the
# call, so one try can miss; a worker that did move is the evidence.
CHILD = r"""
import json, os, sys, threading
import numpy as np
import fastattn
n_threads = int(sys.argv[1])
what = sys.argv[2]
rng = np.random.default_rng(0)
q = rng.standard_normal((2, 4, 64, 32), dtype=np.float32)
x = rng.standard_normal((256, 128), dtype=np.float32)
w = rng.standard_normal((192, 128), dtype=np.float32)
ref_attn = fastattn.scaled_dot_product_attention(q, q, q, n_threads=1)
ref_lin = fastattn.linear(x, w, n_threads=1)

def call():
    if what == "attention":
        out = fastattn.scaled_dot_product_attention(q, q, q, n_threads=n_threads)
        assert np.array_equal(out, ref_attn)
    else:
        out = fastattn.linear(x, w, n_threads=n_threads)
        assert np.array_equal(out, ref_lin)

main = threading.get_native_id()
main_mask = sorted(os.sched_getaffinity(0))
call()
def workers():
    return [int(t) for t in os.listdir("/proc/self/task") if int(t) != main]
moved = False
for attempt in range(30):
    with open("/proc/thread-self/stat") as f:       # field 39: the CPU it last ran on
        here = int(f.read().rsplit(")", 1)[1].split()[36])
    for t in workers():
        os.sched_setaffinity(t, {here})
    call()
    masks = {t: sorted(os.sched_getaffinity(t)) for t in workers()}
    if any(m != [here] for m in masks.values()):
        moved = True
        break
print(json.dumps({"main_before": main_mask, "main_after": sorted(os.sched_getaffinity(0)),
                  "cpu": here, "moved": moved, "workers": list(masks.values())}))
"""


def _child(n_threads, what, env=None, preexec=None):
    full = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    for k in ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "FASTATTN_THREAD_PLACEMENT"):
        full.pop(k, None)
    full.update(env or {})
    res = subprocess.run([sys.executable, "-c", CHILD, str(n_threads), what],
                         capture_output=True, text=True, env=full, cwd=HERE, timeout=120,
                         preexec_fn=preexec)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("what", ["attention", "linear"])
def test_worker_on_the_masters_cpu_moves_off_it(what):
    r = _child(2, what)
    assert r["main_after"] == r["main_before"]          # the master's mask is never changed
    assert r["moved"], r
    allowed = set(r["main_before"]) - {r["cpu"]}
    # the moved worker may use every CPU the master may, except the master's
    assert any(set(m) == allowed for m in r["workers"]), r


@pytest.mark.parametrize("env", [{"FASTATTN_THREAD_PLACEMENT": "0"}, {"OMP_PROC_BIND": "false"}])
def test_no_placement_when_turned_off_or_the_user_binds(env):
    r = _child(2, "linear", env=env)
    assert not r["moved"], r
    assert all(m == [r["cpu"]] for m in r["workers"]), r
    assert r["main_after"] == r["main_before"]


def test_no_placement_with_more_threads_than_cpus():
    n = len(os.sched_getaffinity(0)) + 1
    r = _child(n, "attention")
    assert not r["moved"], r


def test_master_restricted_to_one_cpu_keeps_its_workers_there():
    # the user pinned the process to one CPU: the workers inherit it, and fastattn never widens it
    cpu = min(os.sched_getaffinity(0))
    r = _child(2, "linear", preexec=lambda: os.sched_setaffinity(0, {cpu}))
    assert r["main_before"] == r["main_after"] == [cpu]
    assert not r["moved"]
    assert all(m == [cpu] for m in r["workers"]), r
