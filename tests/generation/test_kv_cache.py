"""KVCache: append in place, reorder by beam index, drop sources."""
import numpy as np
import pytest

from fastattn.generation import KVCache


def _filled(rng, n_src=3, group=4, t=5):
    c = KVCache(2, n_src * group, 2, 3, 8, n_src, 6, np.float32)
    for _ in range(t):
        for layer in range(2):
            k = rng.standard_normal((n_src * group, 1, 2, 3)).astype(np.float32)
            c.append(layer, k, k + 1)
        c.advance(1)
    c.set_memory_mask(np.ones((n_src, 6), bool), group)
    for layer in range(2):
        x = rng.standard_normal((n_src, 2, 6, 3)).astype(np.float32)
        c.set_cross(layer, x, x)
    return c


def test_reorder_matches_gather():
    rng = np.random.default_rng(0)
    for _ in range(20):
        c = _filled(rng)
        before = [k[:12, :, :5].copy() for k in c.self_k]
        idx = np.concatenate([g * 4 + rng.integers(0, 4, 4) for g in range(3)])
        c.reorder(idx)
        for layer in range(2):
            np.testing.assert_array_equal(c.self_k[layer][:12, :, :5], before[layer][idx])
            np.testing.assert_array_equal(c.self_v[layer][:12, :, :5], before[layer][idx] + 1)


@pytest.mark.parametrize("n_threads", [1, 2, 3, 8])
def test_reorder_any_thread_count_and_positions_past_length_untouched(n_threads):
    rng = np.random.default_rng(2)
    c = _filled(rng, t=5)
    c.n_threads = n_threads
    for k in c.self_k + c.self_v:
        k[:, :, 5:] = 7.0                      # beyond the fed positions: must stay as they are
    before = [k.copy() for k in c.self_k + c.self_v]
    for _ in range(5):
        idx = np.concatenate([g * 4 + rng.integers(0, 4, 4) for g in range(3)])
        c.reorder(idx)
        before = [b[idx] for b in before]
        for b, k in zip(before, c.self_k + c.self_v):
            np.testing.assert_array_equal(k[:12, :, :5], b[:, :, :5])
            assert (k[:, :, 5:] == 7.0).all()


def test_copy_cache_rows_rejects_bad_arguments():
    from fastattn._kernels import _kv_cache
    buf = np.zeros((4, 2, 6, 3), np.float32)
    i64 = lambda *v: np.array(v, np.int64)
    with pytest.raises(ValueError, match="row indices"):
        _kv_cache.copy_cache_rows([buf], [None], i64(), i64(0), i64(4), np.zeros(1, np.uint8), 3, 1)
    with pytest.raises(ValueError, match="max_len"):
        _kv_cache.copy_cache_rows([buf], [None], i64(), i64(0), i64(1), np.zeros(1, np.uint8), 7, 1)
    with pytest.raises(ValueError, match="twin"):
        _kv_cache.copy_cache_rows([buf], [None], i64(1), i64(0), i64(1), np.ones(1, np.uint8), 3, 1)
    with pytest.raises(ValueError, match="shape and dtype"):
        _kv_cache.copy_cache_rows([buf, buf.astype(np.float64)], [None, None], i64(), i64(0),
                                i64(1), np.zeros(1, np.uint8), 3, 1)


def test_reorder_checks_and_select_sources():
    rng = np.random.default_rng(1)
    c = _filled(rng)
    with pytest.raises(ValueError, match="source"):
        c.reorder(np.arange(12)[::-1])
    with pytest.raises(ValueError, match="beam_idx"):
        c.reorder(np.arange(5))
    before = c.self_k[0][:12, :, :5].copy()
    cross = c.cross_k[0].copy()
    c.select_sources([0, 2])
    assert (c.n_src, c.n_rows) == (2, 8)
    np.testing.assert_array_equal(c.self_k[0][:8, :, :5], before[[0, 1, 2, 3, 8, 9, 10, 11]])
    np.testing.assert_array_equal(c.cross(0)[0], cross[[0, 2]])
    with pytest.raises(ValueError, match="keep"):
        c.select_sources([1, 0])
    with pytest.raises(ValueError, match="positions"):
        for _ in range(4):
            c.append(0, np.zeros((8, 1, 2, 3), np.float32), np.zeros((8, 1, 2, 3), np.float32))
            c.advance(1)


def test_a_cache_is_freed_without_the_cyclic_collector():
    """A cache (its arrays: megabytes a layer) goes when its last reference does: no reference
    cycle, so it never waits for gc.collect, which large arrays do not prompt (a transcription
    of many windows grew RSS by every window's cache)."""
    import gc
    import weakref
    cache = KVCache(3, 4, 2, 8, 16, 2, 5, np.float32)
    for i in range(3):
        cache.set_cross(i, np.zeros((2, 2, 5, 8), np.float32), np.zeros((2, 2, 5, 8), np.float32))
    view = cache.layer(1)
    assert view.n_src == 2 and view.cross[0].shape == (2, 2, 5, 8)
    ref = weakref.ref(cache)
    gc.disable()
    try:
        del cache, view
        assert ref() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("n_threads", [1, 3])
def test_spread_then_reorder_copies_only_after_the_shared_prefix(n_threads):
    """spread gives each source's rows its first row's positions; a reorder then copies only
    the positions after them (the same in every row of a source), with the result of a full
    gather, and positions past the length untouched."""
    rng = np.random.default_rng(5)
    n_src, group, t_pre = 3, 4, 4
    c = KVCache(2, n_src * group, 2, 3, 9, n_src, 6, np.float32)
    c.n_threads = n_threads
    for k in c.self_k + c.self_v:
        k[...] = 7.0
    # the prefix, fed once per source into the first n_src rows, then spread
    c.n_rows, c.group = n_src, 1
    for layer in range(2):
        k = rng.standard_normal((n_src, t_pre, 2, 3)).astype(np.float32)
        c.append(layer, k, k - 1)
    c.advance(t_pre)
    c.n_rows, c.group = n_src * group, group
    c.spread(group)
    assert c.shared == t_pre
    for buf in c.self_k + c.self_v:
        for b in range(n_src):
            for j in range(group):
                np.testing.assert_array_equal(buf[b * group + j, :, :t_pre], buf[b * group, :, :t_pre])
    for _ in range(3):                              # positions after the prefix differ per row
        for layer in range(2):
            k = rng.standard_normal((n_src * group, 1, 2, 3)).astype(np.float32)
            c.append(layer, k, k + 1)
        c.advance(1)
        before = [b.copy() for b in c.self_k + c.self_v]
        idx = np.concatenate([g * group + rng.integers(0, group, group) for g in range(n_src)])
        c.reorder(idx)
        for b, k in zip(before, c.self_k + c.self_v):
            np.testing.assert_array_equal(k[:, :, :c.length], b[idx][:, :, :c.length])
            assert (k[:, :, c.length:] == 7.0).all()


def test_copy_cache_rows_checks_t0():
    from fastattn._kernels import _kv_cache
    buf = np.zeros((4, 2, 6, 3), np.float32)
    i64 = lambda *v: np.array(v, np.int64)
    for t0 in (-1, 4):
        with pytest.raises(ValueError, match="t0"):
            _kv_cache.copy_cache_rows([buf], [None], i64(), i64(0), i64(1), np.zeros(1, np.uint8),
                                      3, 1, t0)
    buf[1] = 5.0
    _kv_cache.copy_cache_rows([buf], [None], i64(), i64(0), i64(1), np.zeros(1, np.uint8), 3, 1, 2)
    assert (buf[0, :, 2] == 5.0).all() and (buf[0, :, :2] == 0).all() and (buf[0, :, 3:] == 0).all()
