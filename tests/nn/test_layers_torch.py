"""Parity of fastattn.nn with torch.nn (eval, dropout 0, batch_first=True), same weights.

Tolerances (max abs error): float32 1e-4, float64 1e-10. Where PyTorch has no defined value
(rows whose every key is masked: NaN on the slow path, zeros on the nested-tensor fast path) we
compare only the defined rows; fastattn returns zeros there (tested in test_layers.py).
"""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fastattn.nn import (MultiHeadAttention, Transformer, TransformerDecoder,  # noqa: E402
                             TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer)

from tolerances import TORCH_TOL as TOL  # noqa: E402
TDT = {np.float32: torch.float32, np.float64: torch.float64}
DTYPES = [np.float32, np.float64]

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _close(ours, theirs, dtype, where=None):
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    assert ours.shape == theirs.shape
    assert ours.dtype == np.dtype(dtype)
    if where is not None:
        ours, theirs = ours[where], theirs[where]
    if ours.size == 0:
        return
    err = np.abs(ours.astype(np.float64) - theirs.astype(np.float64)).max()
    assert err <= TOL[dtype], f"max abs error {err:.3g} > {TOL[dtype]}"


def _t(x):
    return None if x is None else torch.from_numpy(np.ascontiguousarray(x))


def _rand(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------------------------------------
# MultiHeadAttention vs nn.MultiheadAttention
# ---------------------------------------------------------------------------------------------

def _torch_mha(E, H, dtype, kdim=None, vdim=None, bias=True, seed=0):
    torch.manual_seed(seed)
    m = torch.nn.MultiheadAttention(E, H, kdim=kdim, vdim=vdim, bias=bias, batch_first=True,
                                    dropout=0.0).to(TDT[dtype]).eval()
    with torch.no_grad():                       # non-zero biases, so they are really tested
        for name, p in m.named_parameters():
            if name.endswith("bias"):
                p.normal_()
    return m


def _mask_cases(rng, B, H, L, S, dtype):
    pad = np.zeros((B, S), dtype=bool)
    pad[0, -2:] = True
    pad[-1, :1] = True
    bool_attn = rng.random((L, S)) < 0.3
    bool_attn[:, 0] = False                        # every row keeps a key
    float_attn = rng.standard_normal((L, S)).astype(dtype)
    float_attn[bool_attn] = -np.inf
    per_head = rng.standard_normal((B * H, L, S)).astype(dtype)
    float_pad = np.where(pad, -np.inf, rng.standard_normal((B, S))).astype(dtype)
    return {
        "none": {},
        "bool_attn": {"attn_mask": bool_attn},
        "float_attn": {"attn_mask": float_attn},
        "per_head_float": {"attn_mask": per_head},
        "per_head_bool": {"attn_mask": np.broadcast_to(bool_attn, (B * H, L, S)).copy()},
        "padding": {"key_padding_mask": pad},
        "float_padding": {"key_padding_mask": float_pad},
        "bool_attn+padding": {"attn_mask": bool_attn, "key_padding_mask": pad},
        "float_attn+padding": {"attn_mask": float_attn, "key_padding_mask": pad},
        "per_head+padding": {"attn_mask": per_head, "key_padding_mask": pad},
    }


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["none", "bool_attn", "float_attn", "per_head_float",
                                  "per_head_bool", "padding", "float_padding", "bool_attn+padding",
                                  "float_attn+padding", "per_head+padding"])
def test_mha_matches_torch_with_masks(dtype, case):
    rng = np.random.default_rng(1)
    B, L, S, E, H = 3, 5, 7, 16, 4
    m = _torch_mha(E, H, dtype)
    ours = MultiHeadAttention.from_torch_state_dict(m.state_dict(), num_heads=H)
    assert ours.dtype == np.dtype(dtype)
    q, kv = _rand(rng, (B, L, E), dtype), _rand(rng, (B, S, E), dtype)
    masks = _mask_cases(rng, B, H, L, S, dtype)[case]
    tmasks = {k: _t(v) for k, v in masks.items()}
    with torch.no_grad():
        ref_out, ref_w = m(_t(q), _t(kv), _t(kv), need_weights=True, **tmasks)
        _, ref_wh = m(_t(q), _t(kv), _t(kv), need_weights=True, average_attn_weights=False, **tmasks)
    out, w = ours(q, kv, kv, need_weights=True, **masks)
    _, wh = ours(q, kv, kv, need_weights=True, average_attn_weights=False, **masks)
    _close(out, ref_out, dtype)
    _close(w, ref_w, dtype)
    assert wh.shape == (B, H, L, S)
    _close(wh, ref_wh, dtype)
    _close(ours(q, kv, kv, **masks), ref_out, dtype)        # need_weights=False path


@pytest.mark.parametrize("dtype", DTYPES)
def test_mha_self_attention_and_causal(dtype):
    rng = np.random.default_rng(2)
    B, L, E, H = 2, 9, 24, 3
    m = _torch_mha(E, H, dtype)
    ours = MultiHeadAttention.from_torch_state_dict(m.state_dict(), num_heads=H)
    x = _rand(rng, (B, L, E), dtype)
    causal = np.triu(np.ones((L, L), dtype=bool), k=1)
    with torch.no_grad():
        ref, ref_w = m(_t(x), _t(x), _t(x), attn_mask=_t(causal))
    out, w = ours(x, x, x, attn_mask=causal, need_weights=True)
    _close(out, ref, dtype)
    _close(w, ref_w, dtype)
    _close(ours(x, x, x, is_causal=True), ref, dtype)
    _close(ours(x, x, x, attn_mask=causal, is_causal=True), ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kdim,vdim", [(10, 6), (16, 7), (5, 16)])
def test_mha_kdim_vdim(dtype, kdim, vdim):
    rng = np.random.default_rng(3)
    B, L, S, E, H = 2, 4, 6, 16, 2
    m = _torch_mha(E, H, dtype, kdim=kdim, vdim=vdim)
    sd = m.state_dict()
    assert "q_proj_weight" in sd
    ours = MultiHeadAttention.from_torch_state_dict(sd, num_heads=H)
    assert (ours.kdim, ours.vdim) == (kdim, vdim)
    q, k, v = _rand(rng, (B, L, E), dtype), _rand(rng, (B, S, kdim), dtype), _rand(rng, (B, S, vdim), dtype)
    pad = np.zeros((B, S), dtype=bool)
    pad[1, 3:] = True
    with torch.no_grad():
        ref, ref_w = m(_t(q), _t(k), _t(v), key_padding_mask=_t(pad))
    out, w = ours(q, k, v, key_padding_mask=pad, need_weights=True)
    _close(out, ref, dtype)
    _close(w, ref_w, dtype)
    assert set(ours.state_dict()) == set(sd)


@pytest.mark.parametrize("dtype", DTYPES)
def test_mha_unbatched_and_no_bias(dtype):
    rng = np.random.default_rng(4)
    L, S, E, H = 3, 5, 8, 2
    m = _torch_mha(E, H, dtype, bias=False)
    ours = MultiHeadAttention.from_torch_state_dict(m.state_dict(), num_heads=H)
    assert not ours.config["bias"]
    q, k, v = _rand(rng, (L, E), dtype), _rand(rng, (S, E), dtype), _rand(rng, (S, E), dtype)
    mask3 = rng.standard_normal((H, L, S)).astype(dtype)
    pad = np.array([False, False, True, False, True])
    with torch.no_grad():
        ref, ref_w = m(_t(q), _t(k), _t(v), attn_mask=_t(mask3), key_padding_mask=_t(pad),
                       average_attn_weights=False)
    out, w = ours(q, k, v, attn_mask=mask3, key_padding_mask=pad, need_weights=True,
                  average_attn_weights=False)
    assert out.shape == (L, E) and w.shape == (H, L, S)
    _close(out, ref, dtype)
    _close(w, ref_w, dtype)


def test_mha_fully_masked_rows_are_zero_where_torch_is_nan():
    rng = np.random.default_rng(5)
    B, L, S, E, H = 2, 3, 4, 8, 2
    m = _torch_mha(E, H, np.float64)
    ours = MultiHeadAttention.from_torch_state_dict(m.state_dict(), num_heads=H)
    q, kv = _rand(rng, (B, L, E), np.float64), _rand(rng, (B, S, E), np.float64)
    pad = np.zeros((B, S), dtype=bool)
    pad[1] = True                                   # batch 1: every key is padding
    with torch.no_grad():
        ref, _ = m(_t(q), _t(kv), _t(kv), key_padding_mask=_t(pad))
    out, w = ours(q, kv, kv, key_padding_mask=pad, need_weights=True)
    _close(out[0], ref[0], np.float64)
    # attention output is 0 there, so the module output is the out_proj bias; weights are 0
    np.testing.assert_allclose(out[1], np.broadcast_to(ours.out_proj.bias, (L, E)), atol=0)
    assert np.all(w[1] == 0) and not np.isnan(out).any()


# ---------------------------------------------------------------------------------------------
# encoder / decoder layers and the full model vs torch
# ---------------------------------------------------------------------------------------------

def _torch_model(dtype, norm_first, activation, n_enc=2, n_dec=2, d=32, H=4, ff=48, seed=0):
    torch.manual_seed(seed)
    m = torch.nn.Transformer(d_model=d, nhead=H, num_encoder_layers=n_enc, num_decoder_layers=n_dec,
                             dim_feedforward=ff, dropout=0.0, activation=activation,
                             norm_first=norm_first, batch_first=True).to(TDT[dtype]).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
            elif "norm" in name:
                p.normal_(1, 0.3)
    return m


def _model_masks(rng, kind, B, S, T, dtype):
    """(ours kwargs, rows of the output that torch defines) for each mask kind."""
    src_pad = np.zeros((B, S), dtype=bool)
    src_pad[0, -3:] = True
    tgt_pad = np.zeros((B, T), dtype=bool)
    tgt_pad[1, -2:] = True
    causal_f = Transformer.generate_square_subsequent_mask(T, dtype=dtype)
    causal_b = np.triu(np.ones((T, T), dtype=bool), k=1)
    mem_bool = rng.random((T, S)) < 0.3
    mem_bool[:, 0] = False
    src_float = rng.standard_normal((S, S)).astype(dtype)
    cases = {
        "none": {},
        "causal_flag": {"tgt_mask": causal_f, "tgt_is_causal": True},
        "causal_float_mask": {"tgt_mask": causal_f},
        "causal_bool_mask": {"tgt_mask": causal_b},
        "src_float_mask": {"src_mask": src_float},
        "memory_bool_mask": {"memory_mask": mem_bool},
        "padding": {"src_key_padding_mask": src_pad, "memory_key_padding_mask": src_pad,
                    "tgt_key_padding_mask": tgt_pad},
        "everything": {"src_mask": src_float, "tgt_mask": causal_f, "memory_mask": mem_bool,
                       "src_key_padding_mask": src_pad, "memory_key_padding_mask": src_pad,
                       "tgt_key_padding_mask": tgt_pad},
    }
    return cases[kind]


MASK_KINDS = ["none", "causal_flag", "causal_float_mask", "causal_bool_mask", "src_float_mask",
              "memory_bool_mask", "padding", "everything"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("kind", MASK_KINDS)
def test_transformer_matches_torch(dtype, norm_first, activation, kind):
    rng = np.random.default_rng(6)
    B, S, T = 3, 7, 6
    m = _torch_model(dtype, norm_first, activation)
    ours = Transformer.from_torch_state_dict(m.state_dict(), nhead=4, activation=activation,
                                             norm_first=norm_first)
    assert ours.dtype == np.dtype(dtype)
    src, tgt = _rand(rng, (B, S, 32), dtype), _rand(rng, (B, T, 32), dtype)
    kw = _model_masks(rng, kind, B, S, T, dtype)
    # torch's encoder fast path (eval) returns NaN for a float src_mask (pytorch#118628):
    # take its slow path for those cases
    slow = "src_mask" in kw
    prev = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(not slow and prev)
    try:
        with torch.no_grad():
            ref = m(_t(src), _t(tgt), **{k: (_t(v) if isinstance(v, np.ndarray) else v)
                                         for k, v in kw.items()})
    finally:
        torch.backends.mha.set_fastpath_enabled(prev)
    assert not torch.isnan(ref).any()
    out = ours(src, tgt, **kw)
    _close(out, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_matches_torch(dtype, norm_first):
    rng = np.random.default_rng(7)
    torch.manual_seed(1)
    tl = torch.nn.TransformerEncoderLayer(24, 3, 40, dropout=0.0, activation="gelu",
                                          norm_first=norm_first, batch_first=True).to(TDT[dtype]).eval()
    ours = TransformerEncoderLayer.from_torch_state_dict(tl.state_dict(), nhead=3, activation="gelu",
                                                         norm_first=norm_first)
    x = _rand(rng, (2, 5, 24), dtype)
    pad = np.array([[False] * 5, [False, False, False, True, True]])
    with torch.no_grad():
        ref_plain = tl(_t(x))
        ref_pad = tl(_t(x), src_key_padding_mask=_t(pad))
        ref_unb = tl(_t(x[0]))
    _close(ours(x), ref_plain, dtype)
    # torch's fast path may zero the padded positions: compare the real tokens
    _close(ours(x, src_key_padding_mask=pad), ref_pad, dtype, where=~pad)
    _close(ours(x[0]), ref_unb, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shapes", [((0, 5), (0, 3)), ((2, 0), (2, 3)), ((2, 5), (2, 0)),
                                    ((0, 0), (0, 0))])
def test_empty_batch_or_sequence_matches_torch(dtype, shapes):
    # a batch of 0, or a source / target of 0 tokens: torch returns empty outputs (and, with no
    # source tokens, the decoder's cross-attention contributes zeros); the reshape of the heads
    # used to fail here with NumPy's "cannot reshape array of size 0"
    (B, S), (Bt, T) = shapes
    rng = np.random.default_rng(9)
    m = _torch_model(dtype, False, "relu", n_enc=1, n_dec=1)
    ours = Transformer.from_torch_state_dict(m.state_dict(), nhead=4)
    src, tgt = _rand(rng, (B, S, 32), dtype), _rand(rng, (Bt, T, 32), dtype)
    with torch.no_grad():
        ref = m(_t(src), _t(tgt))
        ref_enc = m.encoder.layers[0](_t(src))
        ref_mha = m.encoder.layers[0].self_attn(_t(tgt), _t(src), _t(src))[0]
    _close(ours(src, tgt), ref, dtype)
    _close(ours.encoder.layers[0](src), ref_enc, dtype)
    mha = MultiHeadAttention.from_torch_state_dict(m.encoder.layers[0].self_attn.state_dict(),
                                                   num_heads=4)
    if B == Bt:
        _close(mha(tgt, src, src), ref_mha, dtype)
        out, w = mha(tgt, src, src, need_weights=True)
        assert w.shape == (B, T, S)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_matches_torch(dtype, norm_first):
    rng = np.random.default_rng(8)
    torch.manual_seed(2)
    tl = torch.nn.TransformerDecoderLayer(16, 2, 32, dropout=0.0, norm_first=norm_first,
                                          batch_first=True).to(TDT[dtype]).eval()
    ours = TransformerDecoderLayer.from_torch_state_dict(tl.state_dict(), nhead=2, norm_first=norm_first)
    tgt, mem = _rand(rng, (2, 4, 16), dtype), _rand(rng, (2, 6, 16), dtype)
    causal = np.triu(np.ones((4, 4), dtype=bool), k=1)
    mpad = np.zeros((2, 6), dtype=bool)
    mpad[1, 4:] = True
    with torch.no_grad():
        ref = tl(_t(tgt), _t(mem), tgt_mask=_t(causal), memory_key_padding_mask=_t(mpad),
                 tgt_is_causal=True)
    _close(ours(tgt, mem, tgt_mask=causal, memory_key_padding_mask=mpad, tgt_is_causal=True), ref, dtype)
    _close(ours(tgt, mem, tgt_is_causal=True, memory_key_padding_mask=mpad), ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_stacks_match_torch(dtype):
    rng = np.random.default_rng(9)
    torch.manual_seed(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        enc = torch.nn.TransformerEncoder(
            torch.nn.TransformerEncoderLayer(16, 4, 24, dropout=0.0, batch_first=True), 3,
            norm=torch.nn.LayerNorm(16)).to(TDT[dtype]).eval()
        dec = torch.nn.TransformerDecoder(
            torch.nn.TransformerDecoderLayer(16, 4, 24, dropout=0.0, batch_first=True), 2).to(TDT[dtype]).eval()
    fenc = TransformerEncoder.from_torch_state_dict(enc.state_dict(), nhead=4)
    fdec = TransformerDecoder.from_torch_state_dict(dec.state_dict(), nhead=4)
    assert len(fenc.layers) == 3 and fenc.norm is not None
    assert len(fdec.layers) == 2 and fdec.norm is None
    src, tgt = _rand(rng, (2, 5, 16), dtype), _rand(rng, (2, 3, 16), dtype)
    with torch.no_grad():
        mem = enc(_t(src))
        ref = dec(_t(tgt), mem, tgt_mask=torch.nn.Transformer.generate_square_subsequent_mask(3).to(TDT[dtype]))
    _close(fenc(src), mem, dtype)
    _close(fdec(tgt, mem.numpy(), tgt_is_causal=True), ref, dtype)


def test_generate_square_subsequent_mask_matches_torch():
    for n in (1, 4, 9):
        ref = torch.nn.Transformer.generate_square_subsequent_mask(n).numpy()
        ours = Transformer.generate_square_subsequent_mask(n)
        assert ours.dtype == np.float32
        np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_unbatched_model_and_state_dict_names(dtype):
    rng = np.random.default_rng(10)
    m = _torch_model(dtype, False, "relu", n_enc=1, n_dec=3)
    ours = Transformer.from_torch_state_dict(m.state_dict(), nhead=4)
    assert ours.config["num_encoder_layers"] == 1 and ours.config["num_decoder_layers"] == 3
    sd = ours.state_dict()
    tsd = m.state_dict()
    assert list(sd) == list(tsd)
    for k in sd:
        assert sd[k].shape == tuple(tsd[k].shape)
        np.testing.assert_array_equal(sd[k], tsd[k].numpy())
    src, tgt = _rand(rng, (5, 32), dtype), _rand(rng, (4, 32), dtype)
    with torch.no_grad():
        ref = m(_t(src), _t(tgt))
    _close(ours(src, tgt), ref, dtype)


def test_torch_tensors_accepted_directly():
    m = _torch_model(np.float32, False, "relu", n_enc=1, n_dec=1)
    ours = Transformer.from_torch_state_dict(m.state_dict(), nhead=4)   # tensors, not arrays
    x = torch.randn(2, 3, 32)
    with torch.no_grad():
        ref = m(x, x)
    _close(ours(x, x), ref, np.float32)                                # tensors as inputs too


_ORDER_CHILD = r"""
import sys
order = sys.argv[1]
if order == "torch-first":
    import torch
    import fastattn
else:
    import fastattn
    import torch
import numpy as np
model = fastattn.Transformer(d_model=64, nhead=4, num_encoder_layers=2, num_decoder_layers=2,
                             dim_feedforward=128, seed=0)
rng = np.random.default_rng(1)
src = rng.standard_normal((3, 37, 64)).astype(np.float32)
tgt = rng.standard_normal((3, 29, 64)).astype(np.float32)
out = [model(src, tgt, tgt_is_causal=True) for _ in range(2)]
fastattn.set_num_threads(1)
out.append(model(src, tgt, tgt_is_causal=True))
np.save(sys.argv[2], np.stack(out))
"""


def test_forward_bitwise_independent_of_import_order_and_threads(tmp_path):
    """torch's wheel brings its own libgomp: whichever library is imported first decides the
    OpenMP runtime both use. fastattn's forward (own GEMM, no BLAS) is bitwise the same either
    way, and for 1 or 2 threads."""
    import os
    import subprocess
    import sys
    results = []
    for order in ("torch-first", "fastattn-first"):
        path = tmp_path / f"{order}.npy"
        subprocess.run([sys.executable, "-c", _ORDER_CHILD, order, str(path)], check=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       env=dict(os.environ, OMP_NUM_THREADS="2"))
        results.append(np.load(path))
    for r in results:
        assert np.array_equal(r[0], r[1]) and np.array_equal(r[0], r[2])
    assert np.array_equal(results[0], results[1])
