"""fastattn.nn against plain float64 NumPy references (no torch needed).

The references below loop over heads and build the full score matrix; they share no code with
fastattn (masks in PyTorch's module convention: bool True = not allowed, padding True = ignore).
"""
import math

import numpy as np
import pytest

from fastattn import functional
from fastattn.nn import _masks
from fastattn.nn import (FeedForward, LayerNorm, MultiHeadAttention, PositionalEncoding,
                             Transformer, TransformerDecoderLayer, TransformerEncoderLayer,
                             sinusoidal_positions)

from tolerances import ATOL, RTOL  # noqa: E402
from tolerances import BLOCK_TOL as TOL  # noqa: E402


# ---------------------------------------------------------------------------------------------
# float64 references
# ---------------------------------------------------------------------------------------------

def ln_ref(x, w, b, eps=1e-5):
    x = np.asarray(x, np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu_ref(x):
    """x * Phi(x) via math.erfc (no cancellation in the negative tail)."""
    return np.array([0.5 * v * math.erfc(-v / math.sqrt(2.0)) for v in np.ravel(x)]).reshape(np.shape(x))


def mha_ref(sd, H, q, k, v, attn_mask=None, key_padding_mask=None):
    """(out (B, L, E), per-head weights (B, H, L, S)) in float64; fully masked rows -> 0."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    E = sd["out_proj.weight"].shape[0]
    if "in_proj_weight" in sd:
        wq, wk, wv = np.split(np.asarray(sd["in_proj_weight"], np.float64), 3)
    else:
        wq, wk, wv = (np.asarray(sd[n], np.float64) for n in ("q_proj_weight", "k_proj_weight", "v_proj_weight"))
    bq, bk, bv = np.split(np.asarray(sd.get("in_proj_bias", np.zeros(3 * E)), np.float64), 3)
    Q, K, V = q @ wq.T + bq, k @ wk.T + bk, v @ wv.T + bv
    B, Lq, _ = Q.shape
    S = K.shape[1]
    Dh = E // H
    add = np.zeros((B, H, Lq, S))
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        m = np.where(m, -np.inf, 0.0) if m.dtype == bool else m.astype(np.float64)
        add = add + (m.reshape(B, H, Lq, S) if m.ndim == 3 else m)
    if key_padding_mask is not None:
        p = np.asarray(key_padding_mask)
        p = np.where(p, -np.inf, 0.0) if p.dtype == bool else p.astype(np.float64)
        add = add + p[:, None, None, :]
    heads, weights = [], np.zeros((B, H, Lq, S))
    for h in range(H):
        sl = slice(h * Dh, (h + 1) * Dh)
        s = Q[..., sl] @ K[..., sl].transpose(0, 2, 1) / math.sqrt(Dh) + add[:, h]
        for bi in range(B):
            for i in range(Lq):
                row = s[bi, i]
                if np.all(np.isneginf(row)):
                    continue
                e = np.exp(row - row.max())
                weights[bi, h, i] = e / e.sum()
        heads.append(weights[:, h] @ V[..., sl])
    out = np.concatenate(heads, -1) @ np.asarray(sd["out_proj.weight"], np.float64).T
    if "out_proj.bias" in sd:
        out = out + sd["out_proj.bias"]
    return out, weights


def _sub(sd, prefix):
    return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}


def ff_ref(sd, x, act):
    h = x @ np.asarray(sd["linear1.weight"], np.float64).T + sd["linear1.bias"]
    h = np.maximum(h, 0) if act == "relu" else gelu_ref(h)
    return h @ np.asarray(sd["linear2.weight"], np.float64).T + sd["linear2.bias"]


def enc_layer_ref(sd, H, x, norm_first, act, **mask):
    n1, n2 = _sub(sd, "norm1."), _sub(sd, "norm2.")
    sa = _sub(sd, "self_attn.")
    if norm_first:
        h = ln_ref(x, n1["weight"], n1["bias"])
        x = x + mha_ref(sa, H, h, h, h, **mask)[0]
        return x + ff_ref(sd, ln_ref(x, n2["weight"], n2["bias"]), act)
    x = ln_ref(x + mha_ref(sa, H, x, x, x, **mask)[0], n1["weight"], n1["bias"])
    return ln_ref(x + ff_ref(sd, x, act), n2["weight"], n2["bias"])


def dec_layer_ref(sd, H, x, mem, norm_first, act, tgt_mask=None, memory_key_padding_mask=None):
    n = [_sub(sd, f"norm{i}.") for i in (1, 2, 3)]
    sa, ca = _sub(sd, "self_attn."), _sub(sd, "multihead_attn.")
    if norm_first:
        h = ln_ref(x, n[0]["weight"], n[0]["bias"])
        x = x + mha_ref(sa, H, h, h, h, attn_mask=tgt_mask)[0]
        h = ln_ref(x, n[1]["weight"], n[1]["bias"])
        x = x + mha_ref(ca, H, h, mem, mem, key_padding_mask=memory_key_padding_mask)[0]
        return x + ff_ref(sd, ln_ref(x, n[2]["weight"], n[2]["bias"]), act)
    x = ln_ref(x + mha_ref(sa, H, x, x, x, attn_mask=tgt_mask)[0], n[0]["weight"], n[0]["bias"])
    x = ln_ref(x + mha_ref(ca, H, x, mem, mem, key_padding_mask=memory_key_padding_mask)[0],
               n[1]["weight"], n[1]["bias"])
    return ln_ref(x + ff_ref(sd, x, act), n[2]["weight"], n[2]["bias"])


def _randomise(model, seed):
    """Non-trivial biases and LayerNorm affine parameters (init gives 0 / 1)."""
    rng = np.random.default_rng(seed)
    sd = model.state_dict()
    for k in sd:
        if k.endswith("bias") or "norm" in k:
            sd[k] = sd[k] + rng.normal(0, 0.3, sd[k].shape)
    model.load_state_dict(sd)
    return model.state_dict()


# ---------------------------------------------------------------------------------------------
# numerics
# ---------------------------------------------------------------------------------------------

def test_gelu_matches_math_erf():
    x = np.concatenate([np.linspace(-12, 12, 4001), [0.0, -0.0, 1e-300, -1e-300, 40.0, -40.0, 7.5]])
    ref = gelu_ref(x)
    got = functional.gelu(x)
    np.testing.assert_allclose(got, ref, rtol=1e-13, atol=1e-300)   # relative, even in the tail
    got32 = functional.gelu(x.astype(np.float32))
    assert got32.dtype == np.float32
    assert np.max(np.abs(got32 - ref)) <= 2e-6


def test_gelu_special_values():
    x = np.array([np.inf, -np.inf, np.nan, 0.0])
    with np.errstate(invalid="ignore"):
        got = functional.gelu(x)
    assert got[0] == np.inf and np.isnan(got[2]) and got[3] == 0.0
    # -inf * Phi(-inf) = -inf * 0: NaN, as in torch
    assert np.isnan(got[1]) or got[1] == 0.0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm(dtype):
    rng = np.random.default_rng(0)
    ln = LayerNorm(12, eps=1e-5, dtype=dtype)
    sd = _randomise(ln, 1)
    x = (rng.standard_normal((3, 4, 12)) * 3 + 2).astype(dtype)
    out = ln(x)
    assert out.dtype == dtype and out.shape == x.shape
    np.testing.assert_allclose(out, ln_ref(x, sd["weight"], sd["bias"]), atol=TOL[dtype], rtol=0)
    assert not np.shares_memory(out, x)


def test_layer_norm_zero_variance_is_bias_not_nan():
    ln = LayerNorm(4)
    sd = _randomise(ln, 2)
    out = ln(np.full((2, 4), 5.0, dtype=np.float32))
    assert not np.isnan(out).any()
    np.testing.assert_array_equal(out, np.broadcast_to(sd["bias"], (2, 4)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rms_norm_against_float64_and_bitwise_across_threads_and_rows(dtype):
    from fastattn.nn.norm import RMSNorm
    rng = np.random.default_rng(7)
    norm = RMSNorm(77, eps=1e-6, dtype=dtype)
    w = (1 + 0.3 * rng.standard_normal(77)).astype(dtype)
    norm.load_state_dict({"weight": w})
    x = (rng.standard_normal((3, 5, 77)) * 4 + 1).astype(dtype)
    r = rng.standard_normal((15, 77)).astype(dtype)
    s = (x.reshape(15, 77) + r).astype(np.float64)        # the sum rounded to dtype first
    want = s / np.sqrt((s * s).mean(axis=1, keepdims=True) + 1e-6) * w.astype(np.float64)
    got = norm._forward(x.reshape(15, 77), r)
    np.testing.assert_allclose(got, want, atol=ATOL[dtype], rtol=RTOL[dtype])
    out = norm(x)                                          # the public call, no residual
    s = x.astype(np.float64)
    want = s / np.sqrt((s * s).mean(axis=-1, keepdims=True) + 1e-6) * w
    assert out.dtype == dtype and out.shape == x.shape
    np.testing.assert_allclose(out, want, atol=ATOL[dtype], rtol=RTOL[dtype])
    for t in (1, 2, 3):                                    # any thread count, any batch
        np.testing.assert_array_equal(norm._forward(x.reshape(15, 77), r, n_threads=t), got)
    np.testing.assert_array_equal(norm._forward(x.reshape(15, 77)[4:5], r[4:5]), got[4:5])
    np.testing.assert_array_equal(norm(np.zeros((2, 77), dtype)), 0)   # eps > 0: zeros
    with pytest.raises(ValueError, match="residual"):
        norm._forward(x.reshape(15, 77), r[:3])


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_feed_forward(activation):
    rng = np.random.default_rng(3)
    ff = FeedForward(8, 20, activation, dtype=np.float64, seed=4)
    sd = _randomise(ff, 5)
    x = rng.standard_normal((2, 3, 8))
    np.testing.assert_allclose(ff(x), ff_ref(sd, x, activation), atol=1e-12, rtol=0)


def test_sinusoidal_positions_formula():
    for d in (1, 6, 7, 16):
        pe = sinusoidal_positions(9, d, dtype=np.float64)
        ref = np.zeros((9, d))
        for pos in range(9):
            for i in range(d):
                angle = pos / 10000 ** ((i - i % 2) / d)
                ref[pos, i] = math.sin(angle) if i % 2 == 0 else math.cos(angle)
        np.testing.assert_allclose(pe, ref, atol=1e-15, rtol=0)
    assert sinusoidal_positions(3, 4).dtype == np.float32
    assert sinusoidal_positions(0, 4).shape == (0, 4)


def test_positional_encoding_adds_and_extends():
    pe = PositionalEncoding(6, max_len=4, dtype=np.float64)
    x = np.ones((2, 7, 6))
    out = pe(x)
    np.testing.assert_allclose(out, np.broadcast_to(1 + sinusoidal_positions(7, 6, np.float64), (2, 7, 6)),
                               atol=1e-15)
    assert np.all(x == 1)
    np.testing.assert_allclose(PositionalEncoding(4, scale=2.0, dtype=np.float64)(np.ones((3, 4))),
                               2 + sinusoidal_positions(3, 4, np.float64), atol=1e-15)


# ---------------------------------------------------------------------------------------------
# attention and blocks vs the float64 references
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("masks", ["none", "bool", "float", "padding", "bool+padding",
                                   "float+padding", "per_head"])
def test_mha_matches_reference(dtype, masks):
    rng = np.random.default_rng(6)
    B, Lq, S, E, H = 2, 5, 6, 12, 3
    mha = MultiHeadAttention(E, H, dtype=dtype, seed=7)
    sd = _randomise(mha, 8)
    q, kv = rng.standard_normal((B, Lq, E)).astype(dtype), rng.standard_normal((B, S, E)).astype(dtype)
    bm = rng.random((Lq, S)) < 0.4
    bm[:, 2] = False
    fm = np.where(bm, -np.inf, rng.standard_normal((Lq, S))).astype(dtype)
    pad = np.zeros((B, S), bool)
    pad[1, :2] = True
    kw = {"none": {}, "bool": {"attn_mask": bm}, "float": {"attn_mask": fm},
          "padding": {"key_padding_mask": pad},
          "bool+padding": {"attn_mask": bm, "key_padding_mask": pad},
          "float+padding": {"attn_mask": fm, "key_padding_mask": pad},
          "per_head": {"attn_mask": rng.standard_normal((B * H, Lq, S)).astype(dtype)}}[masks]
    ref, ref_w = mha_ref(sd, H, q, kv, kv, **kw)
    out, w = mha(q, kv, kv, need_weights=True, average_attn_weights=False, **kw)
    assert out.dtype == dtype and w.shape == (B, H, Lq, S)
    tol = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(out, ref, atol=tol, rtol=0)
    np.testing.assert_allclose(w, ref_w, atol=tol, rtol=0)
    np.testing.assert_allclose(mha(q, kv, kv, need_weights=True, **kw)[1], ref_w.mean(1), atol=tol, rtol=0)


def test_mha_fully_masked_row_gives_zero_attention():
    mha = MultiHeadAttention(4, 2, dtype=np.float64, seed=0)
    sd = _randomise(mha, 1)
    x = np.random.default_rng(2).standard_normal((1, 3, 4))
    mask = np.zeros((3, 3), bool)
    mask[1] = True                                        # query 1 may attend to nothing
    out, w = mha(x, x, x, attn_mask=mask, need_weights=True)
    np.testing.assert_array_equal(out[0, 1], sd["out_proj.bias"])
    assert np.all(w[0, 1] == 0) and np.isfinite(out).all()


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_matches_reference(norm_first, activation):
    rng = np.random.default_rng(9)
    layer = TransformerEncoderLayer(8, 2, 16, activation=activation, norm_first=norm_first,
                                    dtype=np.float64, seed=10)
    sd = _randomise(layer, 11)
    x = rng.standard_normal((2, 5, 8))
    pad = np.array([[False] * 5, [False, False, False, False, True]])
    x_before = x.copy()
    out = layer(x, src_key_padding_mask=pad)
    np.testing.assert_array_equal(x, x_before)            # input untouched
    ref = enc_layer_ref(sd, 2, x, norm_first, activation, key_padding_mask=pad)
    np.testing.assert_allclose(out, ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_matches_reference(norm_first):
    rng = np.random.default_rng(12)
    layer = TransformerDecoderLayer(8, 4, 12, norm_first=norm_first, dtype=np.float64, seed=13)
    sd = _randomise(layer, 14)
    tgt, mem = rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 3, 8))
    causal = np.triu(np.ones((4, 4), bool), 1)
    mpad = np.array([[False, False, True], [False, False, False]])
    ref = dec_layer_ref(sd, 4, tgt, mem, norm_first, "relu", tgt_mask=causal, memory_key_padding_mask=mpad)
    for kw in ({"tgt_mask": causal}, {"tgt_is_causal": True},
               {"tgt_mask": Transformer.generate_square_subsequent_mask(4, np.float64)}):
        out = layer(tgt, mem, memory_key_padding_mask=mpad, **kw)
        np.testing.assert_allclose(out, ref, atol=1e-12, rtol=0)


def test_transformer_matches_reference_float32_and_float64():
    rng = np.random.default_rng(15)
    m64 = Transformer(16, 4, 2, 2, 24, dtype=np.float64, seed=16)
    sd = _randomise(m64, 17)
    m32 = Transformer.from_torch_state_dict(sd, nhead=4, dtype=np.float32)
    src, tgt = rng.standard_normal((2, 5, 16)), rng.standard_normal((2, 4, 16))
    causal = np.triu(np.ones((4, 4), bool), 1)
    x = src
    for i in range(2):
        x = enc_layer_ref(_sub(sd, f"encoder.layers.{i}."), 4, x, False, "relu")
    mem = ln_ref(x, sd["encoder.norm.weight"], sd["encoder.norm.bias"])
    y = tgt
    for i in range(2):
        y = dec_layer_ref(_sub(sd, f"decoder.layers.{i}."), 4, y, mem, False, "relu", tgt_mask=causal)
    ref = ln_ref(y, sd["decoder.norm.weight"], sd["decoder.norm.bias"])
    out64 = m64(src, tgt, tgt_mask=causal)
    out32 = m32(src.astype(np.float32), tgt.astype(np.float32), tgt_is_causal=True)
    assert out64.dtype == np.float64 and out32.dtype == np.float32
    np.testing.assert_allclose(out64, ref, atol=1e-12, rtol=0)
    np.testing.assert_allclose(out32, ref, atol=1e-4, rtol=0)
    # inputs in another dtype are cast to the model's
    assert m32(src, tgt).dtype == np.float32


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bias", [True, False])
def test_post_norm_inside_the_gemm_gives_the_same_bits(monkeypatch, dtype, bias):
    # post-LN layers hand each LayerNorm to the GEMM of their sublayer's last linear layer:
    # the output is bit for bit that of the separate residual + LayerNorm pass
    from fastattn import _ops
    m = Transformer(d_model=48, nhead=4, num_encoder_layers=2, num_decoder_layers=2,
                    dim_feedforward=80, bias=bias, seed=3, dtype=dtype)
    rng = np.random.default_rng(4)
    src = rng.standard_normal((3, 101, 48)).astype(dtype)    # > one 96-row block per GEMM
    tgt = rng.standard_normal((3, 33, 48)).astype(dtype)
    calls = []
    fused = _ops.PackedLinear._then_layer_norm

    def counted(self, *a, **k):
        calls.append(1)
        return fused(self, *a, **k)

    monkeypatch.setattr(_ops.PackedLinear, "_then_layer_norm", counted)
    ours = m(src, tgt, tgt_is_causal=True,
             tgt_mask=Transformer.generate_square_subsequent_mask(33, dtype=dtype))
    assert len(calls) == 2 * 2 + 2 * 3

    def separate(self, x, residual, gamma, beta, eps, n_threads=None):
        return _ops.layer_norm(self(x, residual, n_threads), gamma, beta, eps)

    monkeypatch.setattr(_ops.PackedLinear, "_then_layer_norm", separate)
    ref = m(src, tgt, tgt_is_causal=True,
            tgt_mask=Transformer.generate_square_subsequent_mask(33, dtype=dtype))
    np.testing.assert_array_equal(ours, ref)


def test_unbatched_equals_batch_of_one():
    rng = np.random.default_rng(18)
    m = Transformer(8, 2, 1, 1, 16, dtype=np.float64, seed=19)
    src, tgt = rng.standard_normal((5, 8)), rng.standard_normal((3, 8))
    out = m(src, tgt, src_key_padding_mask=np.array([0, 0, 0, 1, 1], bool), tgt_is_causal=True)
    ref = m(src[None], tgt[None], src_key_padding_mask=np.array([[0, 0, 0, 1, 1]], bool),
            tgt_is_causal=True)[0]
    assert out.shape == (3, 8)
    np.testing.assert_allclose(out, ref, atol=1e-14, rtol=0)


def test_causal_flag_with_a_non_causal_mask_applies_both():
    rng = np.random.default_rng(20)
    mha = MultiHeadAttention(4, 1, dtype=np.float64, seed=21)
    x = rng.standard_normal((1, 4, 4))
    extra = np.zeros((4, 4), bool)
    extra[3, 0] = True
    both = extra | np.triu(np.ones((4, 4), bool), 1)
    np.testing.assert_allclose(mha(x, x, x, attn_mask=extra, is_causal=True),
                               mha(x, x, x, attn_mask=both), atol=1e-14, rtol=0)


def test_kernel_mask_keeps_padding_broadcast():
    pad = np.zeros((3, 5), bool)
    pad[0, 4] = True
    km = _masks._kernel_mask(None, pad, False, 3, 8, 5, 5, np.dtype(np.float32), True)
    assert km.mask.shape == (3, 1, 1, 5) and km.mask.dtype == bool and not km.causal
    assert km.mask[0, 0, 0, 4] == False and km.mask[1, 0, 0, 4] == True  # noqa: E712
    causal = Transformer.generate_square_subsequent_mask(5)
    km = _masks._kernel_mask(causal, pad, False, 3, 8, 5, 5, np.dtype(np.float32), True)
    assert km.causal and km.mask.shape == (3, 1, 1, 5)                     # no L x S array
    km = _masks._kernel_mask(causal, None, False, 3, 8, 5, 5, np.dtype(np.float32), True)
    assert km.causal and km.mask is None


# ---------------------------------------------------------------------------------------------
# weights: state_dict, save / load, errors
# ---------------------------------------------------------------------------------------------

def test_state_dict_names_and_shapes():
    m = Transformer(8, 2, 1, 2, 12, seed=0)
    sd = m.state_dict()
    assert sd["encoder.layers.0.self_attn.in_proj_weight"].shape == (24, 8)
    assert sd["encoder.layers.0.self_attn.out_proj.weight"].shape == (8, 8)
    assert sd["decoder.layers.1.multihead_attn.in_proj_bias"].shape == (24,)
    assert sd["decoder.layers.1.linear1.weight"].shape == (12, 8)
    assert sd["decoder.layers.1.norm3.weight"].shape == (8,)
    assert "encoder.norm.weight" in sd and "decoder.norm.bias" in sd
    assert not any(".layers.2." in k for k in sd)
    assert all(v.dtype == np.float32 for v in sd.values())
    # xavier-uniform matrices, zero biases, LayerNorm 1 / 0
    w = sd["encoder.layers.0.linear1.weight"]
    assert np.abs(w).max() <= math.sqrt(6 / (12 + 8)) and w.std() > 0
    assert np.all(sd["encoder.layers.0.linear1.bias"] == 0)
    assert np.all(sd["decoder.norm.weight"] == 1)


def test_seed_reproducible():
    a = Transformer(8, 2, 1, 1, 12, seed=3).state_dict()
    b = Transformer(8, 2, 1, 1, 12, seed=3).state_dict()
    c = Transformer(8, 2, 1, 1, 12, seed=4).state_dict()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["encoder.layers.0.linear1.weight"], c["encoder.layers.0.linear1.weight"])


@pytest.mark.parametrize("cls_args", [
    (Transformer, dict(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=2,
                       dim_feedforward=12, norm_first=True, activation="gelu", dtype=np.float64)),
    (TransformerEncoderLayer, dict(d_model=8, nhead=4, dim_feedforward=6)),
    (TransformerDecoderLayer, dict(d_model=8, nhead=2, dim_feedforward=6, bias=False)),
    (MultiHeadAttention, dict(embed_dim=8, num_heads=2, kdim=3, vdim=5)),
])
def test_save_load_round_trip(tmp_path, cls_args):
    pytest.importorskip("safetensors")
    cls, kw = cls_args
    m = cls(seed=1, **kw)
    _randomise(m, 2)
    path = tmp_path / "m.safetensors"
    m.save(path)
    m2 = cls.load(path)
    assert m2.config == m.config
    a, b = m.state_dict(), m2.state_dict()
    assert list(a) == list(b) and all(np.array_equal(a[k], b[k]) for k in a)
    # and the loaded model computes the same thing
    rng = np.random.default_rng(3)
    if cls is MultiHeadAttention:
        args = (rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 4, 5)))
    elif cls is TransformerEncoderLayer:
        args = (rng.standard_normal((2, 3, 8)),)
    else:
        args = (rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 4, 8)))
    np.testing.assert_array_equal(m(*args), m2(*args))


def test_load_wrong_file_errors(tmp_path):
    pytest.importorskip("safetensors")
    from safetensors.numpy import save_file
    m = TransformerEncoderLayer(8, 2, 6, seed=0)
    path = tmp_path / "layer.safetensors"
    m.save(path)
    with pytest.raises(ValueError, match="TransformerEncoderLayer, not a Transformer"):
        Transformer.load(path)
    sd = m.state_dict()
    del sd["linear2.bias"]
    sd["linear1.weight"] = np.zeros((7, 8), np.float32)
    sd["bogus"] = np.zeros(3, np.float32)
    import json
    save_file(sd, str(tmp_path / "bad.safetensors"),
              metadata={"fastattn_class": "TransformerEncoderLayer", "fastattn_config": json.dumps(m.config)})
    with pytest.raises(ValueError) as e:
        TransformerEncoderLayer.load(tmp_path / "bad.safetensors")
    msg = str(e.value)
    assert "linear2.bias" in msg and "bogus" in msg and "linear1.weight" in msg and "(7, 8)" in msg
    save_file(sd, str(tmp_path / "nometa.safetensors"))
    with pytest.raises(ValueError, match="metadata"):
        TransformerEncoderLayer.load(tmp_path / "nometa.safetensors")


def test_load_state_dict_errors_name_everything_and_change_nothing():
    m = MultiHeadAttention(8, 2, seed=0)
    before = m.state_dict()
    bad = dict(before)
    bad["in_proj_weight"] = np.zeros((8, 8))
    bad.pop("out_proj.bias")
    bad["bias_k"] = np.zeros((1, 1, 8))
    with pytest.raises(ValueError) as e:
        m.load_state_dict(bad)
    msg = str(e.value)
    assert "in_proj_weight" in msg and "(8, 8)" in msg and "(24, 8)" in msg
    assert "out_proj.bias" in msg and "bias_k" in msg
    after = m.state_dict()
    assert all(np.array_equal(before[k], after[k]) for k in before)
    with pytest.raises(TypeError, match="num_heads"):
        MultiHeadAttention.from_torch_state_dict(before)
    with pytest.raises(TypeError, match="nhead"):
        TransformerEncoderLayer.from_torch_state_dict(TransformerEncoderLayer(8, 2, 4).state_dict())


def test_from_torch_state_dict_infers_sizes_and_dtype():
    src = Transformer(12, 3, 2, 1, 20, dtype=np.float64, seed=5)
    m = Transformer.from_torch_state_dict(src.state_dict(), nhead=3)
    cfg = m.config
    assert (cfg["d_model"], cfg["num_encoder_layers"], cfg["num_decoder_layers"],
            cfg["dim_feedforward"], cfg["dtype"]) == (12, 2, 1, 20, "float64")
    m32 = Transformer.from_torch_state_dict(src.state_dict(), nhead=3, dtype=np.float32)
    assert m32.dtype == np.float32


def test_bad_arguments():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="activation"):
        FeedForward(4, 8, "tanh")
    with pytest.raises(TypeError, match="dtype"):
        LayerNorm(4, dtype=np.float16)
    m = Transformer(8, 2, 1, 1, 8, seed=0)
    x = np.zeros((2, 3, 8), np.float32)
    with pytest.raises(ValueError, match="feature size"):
        m(np.zeros((2, 3, 6)), x)
    with pytest.raises(ValueError, match="batch"):
        m(x, np.zeros((3, 3, 8)))
    with pytest.raises(ValueError, match="src_key_padding_mask"):
        m(x, x, src_key_padding_mask=np.zeros((2, 4), bool))
    with pytest.raises(ValueError, match="tgt_mask"):
        m(x, x, tgt_mask=np.zeros((3, 4), bool))
    with pytest.raises(TypeError, match="memory_mask"):
        m(x, x, memory_mask=np.zeros((3, 3), np.int64))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layers_attention_call_gives_the_checked_calls_bits(dtype):
    """The layers' direct attention call (functional._attention_into) against the public,
    checked one: the same bits on the direct path (decode-shaped calls, bool and float masks,
    causal) and on the fallbacks (a float64 mask for float32 queries, a broadcast lead); and
    both against a float64 reference."""
    rng = np.random.default_rng(11)
    q = rng.standard_normal((2, 3, 1, 16)).astype(dtype)
    kv = rng.standard_normal((2, 3, 2, 9, 16)).astype(dtype)
    k, v = kv[:, :, 0], kv[:, :, 1]                      # strided views, as the cache hands out
    bool_mask = rng.random((2, 1, 1, 9)) > 0.3
    bias = rng.standard_normal((1, 3, 1, 9)).astype(dtype)
    cases = [(q, None, False, None), (q, bool_mask, False, 0.5), (q, bias, False, 1.0),
             (rng.standard_normal((2, 3, 9, 16)).astype(dtype), None, True, None),
             (q, bias.astype(np.float64), False, None),            # fallback: wider mask
             (q[:1], None, False, None)]                           # fallback: broadcast lead
    for qq, mask, causal, scale in cases:
        want = functional.scaled_dot_product_attention(qq, k, v, mask, is_causal=causal,
                                                       scale=scale)
        out = np.empty(want.shape, dtype)
        got = functional._attention_into(qq, k, v, mask, out, causal, scale, None)
        assert got is out
        np.testing.assert_array_equal(got, want)
        kb = np.broadcast_to(k, (2,) + k.shape[1:]).astype(np.float64)
        vb = np.broadcast_to(v, (2,) + v.shape[1:]).astype(np.float64)
        s = np.einsum("bhle,bhse->bhls", np.broadcast_to(qq, (2,) + qq.shape[1:]), kb)
        s = s * (1 / 4 if scale is None else scale)
        if mask is not None:
            s = s + (np.where(mask, 0, -np.inf) if mask.dtype == bool else mask)
        if causal:
            s = s + np.triu(np.full(s.shape[-2:], -np.inf), 1)
        p = np.exp(s - s.max(-1, keepdims=True))
        ref = (p / p.sum(-1, keepdims=True)) @ vb
        np.testing.assert_allclose(got, ref[:got.shape[0]], atol=ATOL[dtype], rtol=RTOL[dtype])
