"""The seeds' architecture cells (worked examples) as tests of fastattn.nn.

Ex 4 single token -> attention output = V_1; Ex 6 cross-attention 2 decoder x 3 encoder tokens;
Ex 7 positional-encoding signs across the four quadrants; Ex 8 LayerNorm of a constant row;
Ex 9 base-model sizes (512 / 8 = 64, 8 heads x 6 layers = 48 score matrices); Ex 10 multi-head
split and concat (2 heads x d_k 4 -> 3 x 8 -> W_O -> 3 x 8); permutation equivariance without
positions.
"""
import math

import numpy as np
import pytest

from fastattn import nn as L
from fastattn.nn import attention as mha_module
from fastattn.nn import (LayerNorm, MultiHeadAttention, Transformer, TransformerEncoderLayer,
                             sinusoidal_positions)


def _project(mha, x, which):
    """The q (0), k (1) or v (2) projection of x in plain NumPy, from the module's parameters."""
    E = mha.embed_dim
    sd = mha.state_dict()
    rows = slice(which * E, (which + 1) * E)
    return x @ sd["in_proj_weight"][rows].T + sd["in_proj_bias"][rows]


def test_ex4_single_token_attention_is_its_value():
    """n = 1: the one weight is exp(s)/exp(s) = 1 for any score, so the heads output V_1."""
    rng = np.random.default_rng(0)
    mha = MultiHeadAttention(8, 2, dtype=np.float64, seed=1)
    sd = mha.state_dict()
    sd["in_proj_bias"] = rng.standard_normal(24)
    mha.load_state_dict(sd)
    x = rng.standard_normal((1, 1, 8)) * 50                   # huge scores change nothing
    out, w = mha(x, x, x, need_weights=True, average_attn_weights=False)
    assert w.shape == (1, 2, 1, 1) and np.all(w == 1.0)
    v1 = _project(mha, x[0], 2)                                # the token's value vector V_1
    np.testing.assert_allclose(out[0], v1 @ sd["out_proj.weight"].T + sd["out_proj.bias"],
                               rtol=1e-13, atol=1e-12)


def test_ex6_cross_attention_shapes_2_by_3():
    """Q from 2 decoder tokens, K, V from 3 encoder tokens: weights 2 x 3, rows sum to 1,
    output back at decoder length 2 x d."""
    rng = np.random.default_rng(2)
    d = 4
    mha = MultiHeadAttention(d, 1, dtype=np.float64, seed=3)
    dec, enc = rng.standard_normal((2, d)), rng.standard_normal((3, d))
    out, w = mha(dec, enc, enc, need_weights=True)
    assert w.shape == (2, 3) and out.shape == (2, d)
    np.testing.assert_allclose(w.sum(axis=-1), 1.0, rtol=0, atol=1e-15)
    # the same inside a decoder layer: memory of 3 tokens, target of 2
    m = Transformer(d, 1, 1, 1, 8, dtype=np.float64, seed=4)
    assert m(enc, dec).shape == (2, d)


def test_ex7_positional_encoding_signs_in_four_quadrants():
    """PE[pos, 0] = sin(pos): sin 1 = 0.8415, sin 2 = 0.9093, sin 4 = -0.7568, sin 5 = -0.9589;
    first negative at pos 4. The cos column (PE[pos, 1]) takes both signs too."""
    pe = sinusoidal_positions(6, 8, dtype=np.float64)
    np.testing.assert_allclose(pe[[1, 2, 4, 5], 0], [0.8415, 0.9093, -0.7568, -0.9589], atol=5e-5)
    assert [bool(s > 0) for s in pe[[1, 2, 4, 5], 0]] == [True, True, False, False]
    assert int(np.argmax(pe[:, 0] < 0)) == 4                  # first negative sine
    assert pe[0, 0] == 0 and pe[0, 1] == 1                     # position 0 first
    # cos(1) > 0, cos(2) < 0, cos(4) < 0, cos(5) > 0: quadrants I, II, III, IV
    assert [bool(c > 0) for c in pe[[1, 2, 4, 5], 1]] == [True, False, False, True]
    assert pe.min() < 0 < pe.max()


def test_ex8_layer_norm_zero_variance_gives_zeros():
    """[5, 5, 5, 5]: mean 5, x - mu = 0, variance 0; 0 / sqrt(0 + 1e-5) = 0, not NaN."""
    assert math.isclose(math.sqrt(1e-5), 0.0031623, rel_tol=1e-4)
    for dtype in (np.float32, np.float64):
        out = LayerNorm(4, eps=1e-5, dtype=dtype)(np.array([5.0, 5.0, 5.0, 5.0]))
        assert out.dtype == dtype
        np.testing.assert_array_equal(out, np.zeros(4))
    # eps = 0 would divide 0 by 0; fastattn's eps is what keeps it finite, as the example says
    with np.errstate(divide="ignore", invalid="ignore"):
        out0 = LayerNorm(4, eps=0.0, dtype=np.float64)(np.full(4, 5.0))
    assert np.isnan(out0).all()


def test_ex9_base_model_sizes():
    """d_model 512, h 8 -> d_k 64; 6 encoder layers x 8 heads = 48 score matrices (3 x 3 each)."""
    layer = TransformerEncoderLayer(512, 8, 64, dtype=np.float32, seed=0)
    assert layer.self_attn.head_dim == 512 // 8 == 64
    enc = L.TransformerEncoder(layer, 6)
    x = np.random.default_rng(1).standard_normal((3, 512)).astype(np.float32)
    seen = []
    orig = mha_module._attention_into             # the layers' attention call

    def spy(q, k, v, *a, **kw):
        seen.append((q.shape, k.shape))
        return orig(q, k, v, *a, **kw)
    mha_module._attention_into = spy
    try:
        enc(x)
    finally:
        mha_module._attention_into = orig
    assert len(seen) == 6
    assert all(qs == (1, 8, 3, 64) and ks == (1, 8, 3, 64) for qs, ks in seen)
    n_heads = sum(qs[1] for qs, _ in seen)
    assert n_heads == 48                                      # 48 score matrices, each 3 x 3


def test_ex10_multi_head_split_and_concat():
    """d_model 8, 2 heads of d_k 4: each head 3 x 4, concat 3 x 8, W_O 8 x 8 -> 3 x 8."""
    rng = np.random.default_rng(5)
    mha = MultiHeadAttention(8, 2, dtype=np.float64, seed=6)
    assert mha.head_dim == 4 and mha.num_heads * mha.head_dim == 8
    x = rng.standard_normal((3, 8))
    q, k, v = (_project(mha, x, i) for i in range(3))
    heads = []
    for h in range(2):
        sl = slice(4 * h, 4 * h + 4)
        s = q[:, sl] @ k[:, sl].T / math.sqrt(4)
        p = np.exp(s - s.max(1, keepdims=True))
        heads.append((p / p.sum(1, keepdims=True)) @ v[:, sl])
        assert heads[-1].shape == (3, 4)
    concat = np.concatenate(heads, axis=1)
    assert concat.shape == (3, 8)
    wo = mha.state_dict()["out_proj.weight"]
    assert wo.shape == (8, 8)
    ref = concat @ wo.T
    out = mha(x, x, x)
    assert out.shape == (3, 8)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-14)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_permutation_equivariance_without_positions(dtype, tol):
    """No positional encoding, no mask: permuting the tokens permutes the encoder's output rows
    identically (the vectors themselves are unchanged)."""
    rng = np.random.default_rng(7)
    m = Transformer(16, 4, 2, 2, 32, dtype=dtype, seed=8)
    enc = m.encoder
    x = rng.standard_normal((2, 6, 16)).astype(dtype)
    perm = np.array([3, 0, 5, 1, 4, 2])
    np.testing.assert_allclose(enc(x[:, perm]), enc(x)[:, perm], rtol=0, atol=tol)
    # the decoder's output does not depend on the order of the memory tokens at all
    tgt = rng.standard_normal((2, 3, 16)).astype(dtype)
    np.testing.assert_allclose(m(x[:, perm], tgt), m(x, tgt), rtol=0, atol=tol)
    # adding positions breaks the symmetry
    pe = sinusoidal_positions(6, 16, dtype)
    assert not np.allclose(enc(x[:, perm] + pe), enc(x + pe)[:, perm], atol=1e-3)
