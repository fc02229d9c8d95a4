"""Workspace memory safety: every case is the FIRST call of a fresh interpreter.

A per-thread workspace cache hides overruns: a larger buffer left by an earlier call absorbs a
write past the end of what the current call needs (the key-split path corrupted the heap for
months while the suite passed). So each case below runs alone in a new child process, checks
its values against the float64 reference and must exit 0. ci/sanitize.sh runs this file in an
AddressSanitizer build with FASTATTN_NO_WORKSPACE_CACHE=1, where every call allocates exactly
what its plan says, so a one-byte overrun is reported; there no buffer outlives its call, and
the cases share eight children (GROUPS).

The sweep covers the four workspace paths: decode (L <= DIRECT_MAX_L, K and V read in place),
key splits (decode with S > KEY_SPLIT), packed tiles (L > DIRECT_MAX_L) and the weights pass,
with L around 1, 16, 17, 96, 97, S around KEY_SPLIT +- 1, 4096, 8193, E from 1 to 256, both
dtypes, bool / float masks, causal, GQA and odd thread counts; and the one-block-per-head
scratch (L from BQ + 1 to BQ_ONE + 1 over many heads).
"""
import itertools
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from fastattn._kernels import _attention as _k

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)

# One child process per case: the cases are built from rotations over the option lists, so that
# every L x S pair meets several head sizes, dtypes, masks and layouts without a full product.
LS = [1, 2, 16, 17, 96, 97]
SS = [1, 2047, 2048, 2049, 4096, 8193]
ES = [(1, 1), (8, 8), (64, 64), (256, 256), (3, 5), (128, 64), (64, 200)]
MASKS = [None, "bool", "float", "bool-row"]
LAYOUTS = [(1, 1, 1), (3, 2, 2), (2, 4, 2), (1, 2, 1)]     # (B, Hq, Hkv): Hkv < Hq is GQA
THREADS = [1, 2, 3, 8]


def _cases():
    cases = []
    for i, (L, S) in enumerate(itertools.product(LS, SS)):
        for rot in range(2):
            j = 2 * i + rot
            E, Ev = ES[j % len(ES)]
            B, Hq, Hkv = LAYOUTS[(j // 2) % len(LAYOUTS)]
            if S * E * Hkv * B > 4_000_000:      # keep each child well under a second
                B, Hq, Hkv = 1, 1, 1
            cases.append(dict(L=L, S=S, E=E, Ev=Ev, B=B, Hq=Hq, Hkv=Hkv,
                              dtype="float32" if j % 2 == 0 else "float64",
                              mask=MASKS[(j // 3) % len(MASKS)], causal=bool((j // 5) % 2),
                              weights=(j % 7 == 0) and L * S <= 200_000,
                              threads=THREADS[j % len(THREADS)], seed=j))
    return cases


CASES = _cases()
# one query block per leading index (fa_query_block: BQ < L <= BQ_ONE with BQ_ONE_N or more
# leading indices and short key tiles): its scratch holds L rows instead of BQ
# and items that pack their own head's key and value tile (one query block, one key tile, no
# GQA or broadcast keys): the packed tiles sit at the end of the thread's scratch
for _j, (_L, _S, _E, _lay) in enumerate([(97, 128, (64, 64), (2, 4, 4)), (128, 128, (64, 64), (8, 8, 8)),
                                         (_k.BQ_ONE, 256, (32, 32), (1, 8, 2)),
                                         (_k.BQ_ONE, 100, (3, 5), (2, 4, 2)),
                                         (_k.BQ_ONE + 1, 128, (64, 64), (1, 8, 8)),
                                         (150, 129, (128, 64), (3, 4, 4)),
                                         (17, 512, (64, 64), (1, 2, 2)), (96, 256, (1, 1), (3, 1, 1)),
                                         (50, 255, (256, 256), (1, 1, 1)),
                                         (18, 513, (64, 64), (2, 2, 2))]):
    for _rot in range(2):
        _i = 2 * _j + _rot
        CASES.append(dict(L=_L, S=_S, E=_E[0], Ev=_E[1], B=_lay[0], Hq=_lay[1], Hkv=_lay[2],
                          dtype="float32" if _rot == 0 else "float64",
                          mask=MASKS[_i % len(MASKS)], causal=bool(_i % 3 == 1),
                          weights=_i % 4 == 0, threads=THREADS[_i % len(THREADS)], seed=1000 + _i))

CHILD = r"""
import json, sys
import numpy as np
import fastattn
from reference import sdpa_ref
for c in json.loads(sys.argv[1]):
    dt = np.dtype(c["dtype"])
    rng = np.random.default_rng(c["seed"])
    q = rng.standard_normal((c["B"], c["Hq"], c["L"], c["E"])).astype(dt)
    k = rng.standard_normal((c["B"], c["Hkv"], c["S"], c["E"])).astype(dt)
    v = rng.standard_normal((c["B"], c["Hkv"], c["S"], c["Ev"])).astype(dt)
    mask = None
    if c["mask"] == "bool":
        mask = rng.random((c["L"], c["S"])) < 0.8
        mask[:, 0] = True         # every row keeps a key (all-masked rows: tested elsewhere)
    elif c["mask"] == "float":
        mask = np.where(rng.random((c["B"], 1, c["L"], c["S"])) < 0.2, -np.inf,
                        rng.standard_normal((c["B"], 1, c["L"], c["S"]))).astype(dt)
        mask[..., 0] = 0.0
    elif c["mask"] == "bool-row":
        mask = rng.random((c["B"], 1, 1, c["S"])) < 0.5   # padding-style, broadcast over rows
        mask[..., 0] = True
    gqa = c["Hkv"] != c["Hq"]
    res = fastattn.scaled_dot_product_attention(q, k, v, mask, is_causal=c["causal"],
                                                enable_gqa=gqa, return_weights=c["weights"],
                                                n_threads=c["threads"])
    out, w = res if c["weights"] else (res, None)
    ref, wref = sdpa_ref(q, k, v, mask, is_causal=c["causal"], enable_gqa=gqa)
    err = float(np.max(np.abs(out - ref) / (1.0 + np.abs(ref))))
    werr = float(np.max(np.abs(w - wref))) if w is not None else 0.0
    print(json.dumps({"err": err, "werr": werr}), flush=True)
"""

from tolerances import CHILD_TOL as TOL  # noqa: E402


def _run(cases):
    return subprocess.run([sys.executable, "-c", CHILD, json.dumps(cases)], cwd=TESTS,
                          capture_output=True, text=True, timeout=600)


# Under FASTATTN_NO_WORKSPACE_CACHE=1 (ci/sanitize.sh) no call reuses another's buffer: each
# allocates exactly its plan, so an overrun shows at its first byte whatever ran before it in the
# process, and the cases share GROUPS children (one first call each; the sanitized interpreter
# takes seconds to start, 92 of them took 3 minutes). With the cache on, one case a child.
GROUPS = 8


@pytest.fixture(scope="module")
def results():
    """(case index) -> (exit status, stderr, the case's result line or None)."""
    if _k.workspace_cache_enabled():
        groups = [[i] for i in range(len(CASES))]
    else:
        groups = [list(range(len(CASES)))[g::GROUPS] for g in range(GROUPS)]
    # two children at a time: the machine this runs on may have two cores
    with ThreadPoolExecutor(max_workers=2) as pool:
        procs = list(pool.map(lambda g: _run([CASES[i] for i in g]), groups))
    out = {}
    for g, proc in zip(groups, procs):
        lines = proc.stdout.strip().splitlines()
        for k, i in enumerate(g):
            out[i] = (proc.returncode, proc.stderr, lines[k] if k < len(lines) else None)
    return out


@pytest.mark.parametrize("i", range(len(CASES)),
                         ids=[f"L{c['L']}-S{c['S']}-E{c['E']}x{c['Ev']}-{c['dtype']}-{c['mask']}"
                              f"{'-causal' if c['causal'] else ''}-B{c['B']}H{c['Hq']}/{c['Hkv']}"
                              f"-t{c['threads']}{'-w' if c['weights'] else ''}" for c in CASES])
def test_first_call_in_fresh_process(results, i):
    case, (rc, stderr, line) = CASES[i], results[i]
    assert line is not None and rc == 0, (
        f"child died (exit {rc}) on {case} or before it\nstderr:\n{stderr[-3000:]}")
    got = json.loads(line)
    assert got["err"] <= TOL[case["dtype"]], (case, got)
    assert got["werr"] <= TOL[case["dtype"]], (case, got)


def test_sweep_covers_every_workspace_path():
    """The case list reaches each path and each boundary (a guard against shrinking it)."""
    decode = [c for c in CASES if c["L"] <= _k.DIRECT_MAX_L]
    assert any(c["S"] > _k.KEY_SPLIT for c in decode)                 # key splits
    assert any(c["S"] == _k.KEY_SPLIT for c in decode)                # exactly one split
    assert any(c["L"] > _k.DIRECT_MAX_L and c["S"] > 1 for c in CASES)  # packed tiles
    assert any(c["weights"] for c in CASES)
    assert any(c["weights"] and c["L"] > _k.DIRECT_MAX_L for c in CASES)
    assert any(c["Hkv"] < c["Hq"] for c in CASES)
    assert {c["L"] for c in CASES} >= {1, 16, 17, 96, 97}
    assert {c["E"] for c in CASES} >= {1, 256}
    assert {c["dtype"] for c in CASES} == {"float32", "float64"}
    assert {c["mask"] for c in CASES} == set(MASKS)
    one = [c for c in CASES if _k.query_block(c["L"], c["B"] * c["Hq"], c["E"], c["Ev"], c["S"],
                                              4 if c["dtype"] == "float32" else 8) == c["L"] > _k.BQ]
    assert {c["dtype"] for c in one} == {"float32", "float64"}
    assert any(c["weights"] for c in one) and any(c["causal"] for c in one)
    assert any(c["L"] == _k.BQ_ONE for c in one)
    own = [c for c in CASES if _fused(c)]
    assert {c["dtype"] for c in own} == {"float32", "float64"}
    assert any(c["weights"] for c in own) and any(c["causal"] for c in own)
    assert {c["mask"] for c in own} == set(MASKS)
    assert any(c["L"] > _k.BQ for c in own)


def _fused(c):
    dt = np.dtype(c["dtype"])
    q = np.zeros((c["B"], c["Hq"], c["L"], c["E"]), dt)
    k = np.zeros((c["B"], c["Hkv"], c["S"], c["E"]), dt)
    v = np.zeros((c["B"], c["Hkv"], c["S"], c["Ev"]), dt)
    if c["Hkv"] != c["Hq"]:
        return False                 # GQA: several query heads share a packed key tile
    return _k.plan(q, k, v, (c["B"], c["Hq"]), 2)["fused_pack"]


@pytest.mark.parametrize("L, S, N, E, expected", [
    (128, 128, 64, 64, 128),            # the base model's self-attention: one block per head
    (128, 128, 7, 64, _k.BQ),           # too few heads to keep the threads busy
    (_k.BQ, 128, 64, 64, _k.BQ),        # fits FA_BQ already
    (_k.BQ_ONE, 256, 8, 32, _k.BQ_ONE),
    (_k.BQ_ONE + 1, 128, 64, 64, _k.BQ),
    (128, 4096, 64, 64, _k.BQ),         # 512-key tiles: a 128-row score tile would outgrow BQ's
])
def test_query_block_rule(L, S, N, E, expected):
    assert _k.query_block(L, N, E, E, S, 4) == expected
    q = np.zeros((1, N, L, E), np.float32)
    k = np.zeros((1, N, S, E), np.float32)
    plan = _k.plan(q, k, k, (1, N), 2)
    assert plan["query_block"] == expected
    # the score tile never outgrows BQ rows over the widest key tile; with the accumulator and
    # row state of up to BQ_ONE rows the scratch stays within 10% of what BQ rows may need
    item_scratch = plan["scratch_stride"] - plan["own_pack_bytes"]
    assert item_scratch <= 1.1 * _k.scratch_bytes(E, E, 1 << 20, 4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [False, True])
def test_one_block_per_head_is_bitwise_the_blocked_result(dtype, causal):
    """A row's result does not depend on the query block it is computed in: 8 heads of 128 rows
    (one block each) equal the same heads computed one at a time (blocks of BQ rows)."""
    import fastattn
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((1, 8, 128, 64)).astype(dtype) for _ in range(3))
    mask = rng.random((1, 1, 128, 128)) < 0.9
    mask[..., 0] = True
    assert _k.query_block(128, 8, 64, 64, 128, np.dtype(dtype).itemsize) == 128
    assert _k.query_block(128, 1, 64, 64, 128, np.dtype(dtype).itemsize) == _k.BQ
    for m in (None, mask):
        whole = fastattn.scaled_dot_product_attention(q, k, v, m, is_causal=causal)
        for h in range(8):
            one = fastattn.scaled_dot_product_attention(q[:, h:h + 1], k[:, h:h + 1],
                                                        v[:, h:h + 1], m, is_causal=causal)
            assert np.array_equal(one, whole[:, h:h + 1])


@pytest.mark.parametrize("L, S, E", [(1, 8192, 64), (1, 2049, 1), (16, 8193, 256), (17, 4096, 64),
                                     (97, 2049, 3), (1, 1, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_plan_pieces_are_disjoint_and_inside(L, S, E, dtype):
    """The plan: pieces in order, 64-byte aligned, non-overlapping, and the total ends exactly
    where the last used piece ends (no slack an overrun could hide in)."""
    q = np.zeros((2, 3, L, E), dtype)
    k = np.zeros((2, 3, S, E), dtype)
    plan = _k.plan(q, k, k, (2, 3), 2)
    end = 0
    last = 0
    for name, (off, size) in plan["pieces"].items():
        assert off % 64 == 0, name
        if size:
            assert off >= end, name
            end = off + size
            last = end
    assert plan["total"] == last
    assert plan["pieces"]["scratch"][1] == plan["threads"] * plan["scratch_stride"]
    if L <= _k.DIRECT_MAX_L:
        assert plan["pieces"]["kpack"][1] == 0
        assert plan["key_splits"] == max(1, -(-S // _k.KEY_SPLIT)) if S > _k.KEY_SPLIT else 1
    else:
        assert plan["pieces"]["kpack"][1] > 0


@pytest.mark.parametrize("L, S, asked, expected", [
    (1, 1 << 14, 8, 8),       # 8 key splits of one sequence: 8 items
    (1, 1 << 18, 2, 2),       # 128 splits: every thread asked for
    (1, 64, 8, 1),            # one item
    (17, 512, 8, 1),          # one query block and one key tile: the item packs its own
    (17, 513, 8, 4),          # two key tiles: 2 + 2 tiles to pack in pass 1
    (200, 4096, 8, 16),       # packing 8 + 8 tiles beats 3 query blocks
])
def test_thread_cap_counts_key_splits_and_packing(L, S, asked, expected):
    """A call uses as many threads as its busiest pass has items: a single-sequence decode with
    long keys runs on every thread (its key splits are the items)."""
    q = np.zeros((1, 1, L, 64), np.float32)
    k = np.zeros((1, 1, S, 64), np.float32)
    assert _k.plan(q, k, k, (1, 1), asked)["threads"] == min(asked, expected)


def test_key_split_decode_bitwise_across_threads():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 2, 1, 64)).astype(np.float32)
    k = rng.standard_normal((1, 2, 5 * _k.KEY_SPLIT + 11, 64)).astype(np.float32)
    v = rng.standard_normal((1, 2, 5 * _k.KEY_SPLIT + 11, 64)).astype(np.float32)
    import fastattn
    outs = [fastattn.scaled_dot_product_attention(q, k, v, n_threads=t) for t in (1, 2, 3, 8)]
    for o in outs[1:]:
        assert np.array_equal(o, outs[0])


def test_workspace_cache_switch():
    """FASTATTN_NO_WORKSPACE_CACHE=1 turns the per-thread cache off (read at import)."""
    code = ("from fastattn._kernels import _attention as k; import numpy as np, fastattn;"
            "x = np.ones((1, 1, 3, 4), np.float32); fastattn.scaled_dot_product_attention(x, x, x);"
            "print(k.workspace_cache_enabled(), getattr(k._local, 'buf', None) is None)")
    env = dict(os.environ, FASTATTN_NO_WORKSPACE_CACHE="1")
    out = subprocess.run([sys.executable, "-c", code], cwd=TESTS, env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["False", "True"]
    env.pop("FASTATTN_NO_WORKSPACE_CACHE")
    out = subprocess.run([sys.executable, "-c", code], cwd=TESTS, env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["True", "False"]
