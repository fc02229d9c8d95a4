"""Kernels placed by what they do: the embedding layer in fastattn._kernels._embedding, the KV
cache's row copy in fastattn._kernels._kv_cache; the former names in _gemm and _search still
work (the model code calling them moves over separately)."""
import numpy as np
import pytest

from fastattn._kernels import _embedding, _gemm, _kv_cache, _search, _simd


def _idx(*v):
    return np.array(v, np.intp)


def test_embed_layer_norm_at_its_home_and_the_former_name():
    rng = np.random.default_rng(0)
    word = rng.standard_normal((10, 24)).astype(np.float32)
    types = rng.standard_normal((2, 24)).astype(np.float32)
    posn = rng.standard_normal((8, 24)).astype(np.float32)
    g = rng.standard_normal(24).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    args = (word, _idx(3, 9, 0), types, _idx(0, 1, 1), posn, _idx(0, 1, 2), g, b, 1e-5)
    y = np.empty((3, 24), np.float32)
    _embedding.embed_layer_norm(*args, y, 2)
    # the step-by-step reference: gather, sums in float32 in that order, the LayerNorm kernel
    s = (word[[3, 9, 0]] + types[[0, 1, 1]])
    ref = np.empty_like(s)
    _gemm.layer_norm(np.ascontiguousarray(s), np.ascontiguousarray(posn[[0, 1, 2]]), g, b, 1e-5,
                     ref, 1)
    assert np.array_equal(y, ref)
    y2 = np.empty_like(y)
    _embedding.embed_layer_norm(*args, y2, 1)           # one thread: the same bits
    assert np.array_equal(y2, y)
    assert not hasattr(_gemm, "embed_layer_norm")        # one home
    with pytest.raises(ValueError, match="intp"):
        _embedding.embed_layer_norm(word, _idx(1).astype(np.int32), None, None, posn, _idx(0), g, b,
                               1e-5, np.empty((1, 24), np.float32), 1)


def test_embedding_follows_the_isa_state():
    rng = np.random.default_rng(1)
    word = rng.standard_normal((5, 40))
    posn = rng.standard_normal((5, 40))
    out = {}
    before = _simd.isa()
    try:
        for name in ("scalar", "baseline", before):
            _simd.set_isa(name)
            y = np.empty((4, 40))
            _embedding.embed_layer_norm(word, _idx(4, 3, 2, 1), None, None, posn, _idx(0, 1, 2, 3),
                                        None, None, 1e-12, y, 2)
            out[name] = y
    finally:
        _simd.set_isa(before)
    for y in out.values():
        np.testing.assert_allclose(y, out["scalar"], rtol=1e-12, atol=1e-12)


def test_copy_cache_rows_at_its_home():
    assert not hasattr(_search, "copy_cache_rows")
    buf = np.arange(4 * 2 * 5 * 3, dtype=np.float32).reshape(4, 2, 5, 3)
    alt = np.zeros_like(buf)
    want = buf.copy()
    want[1, :, :4], want[3, :, :4] = buf[2, :, :4], buf[1, :, :4]
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    _kv_cache.copy_cache_rows([buf], [alt], i64(1), i64(1, 3), i64(2, 1), np.array([0, 1], np.uint8),
                              4, 2)
    assert np.array_equal(buf, want)
