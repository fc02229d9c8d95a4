"""fastattn.nn blocks in bfloat16 (quantize='bfloat16' / quantize_('bfloat16')): the layers
compute with their weights rounded to bfloat16 (the bfloat16 GEMM's bits, tests/kernels/
test_bf16_gemm.py), state_dict gives those values, load_state_dict rounds new ones, and a
module quantized one way is not turned into another."""
import numpy as np
import pytest

import fastattn
import fastattn._ops as ops
from fastattn._quant import Bf16Weight, from_bfloat16, to_bfloat16
from fastattn.nn.conv import Conv1d


def test_linear_bf16_is_the_bf16_gemm_of_its_weight():
    rng = np.random.default_rng(0)
    lin = fastattn.Linear(40, 70, seed=1, quantize="bfloat16")
    assert lin.quantize == "bfloat16" and isinstance(lin._params["weight"], Bf16Weight)
    f = fastattn.Linear(40, 70, seed=1)
    x = rng.standard_normal((5, 3, 40)).astype(np.float32)
    want = ops.PackedLinear(f.weight, f.bias, quantize="bfloat16")(x)
    np.testing.assert_array_equal(lin(x), want)
    sd = lin.state_dict()
    np.testing.assert_array_equal(sd["weight"], from_bfloat16(to_bfloat16(f.weight)))
    # load_state_dict rounds the new float weights
    w2 = rng.standard_normal((70, 40)).astype(np.float32)
    lin.load_state_dict({"weight": w2, "bias": np.zeros(70, np.float32)})
    assert isinstance(lin._params["weight"], Bf16Weight)
    np.testing.assert_array_equal(lin.state_dict()["weight"], from_bfloat16(to_bfloat16(w2)))
    np.testing.assert_array_equal(lin(x), ops.PackedLinear(w2, quantize="bfloat16")(x))


def test_conv1d_bf16():
    rng = np.random.default_rng(1)
    conv = Conv1d(6, 10, 3, padding=1, seed=2, quantize="bfloat16")
    f = Conv1d(6, 10, 3, padding=1, seed=2)
    x = rng.standard_normal((2, 6, 17)).astype(np.float32)
    y, z = conv(x), f(x)
    assert y.shape == z.shape == (2, 10, 17)
    assert np.abs(y - z).max() < 0.02 * np.abs(z).max() and not np.array_equal(y, z)


def test_transformer_quantize_bf16_close_and_same_bits_for_threads():
    model = fastattn.Transformer(d_model=64, nhead=4, num_encoder_layers=2,
                                 num_decoder_layers=2, dim_feedforward=128, seed=0)
    rng = np.random.default_rng(3)
    src = rng.standard_normal((3, 11, 64)).astype(np.float32)
    tgt = rng.standard_normal((3, 7, 64)).astype(np.float32)
    want = model(src, tgt)
    model.quantize_("bfloat16")
    assert model.quantize == "bfloat16"
    got = model(src, tgt)
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
    try:
        fastattn.set_num_threads(1)
        np.testing.assert_array_equal(model(src, tgt), got)
    finally:
        fastattn.set_num_threads(None)
    np.testing.assert_array_equal(model(src[1:2], tgt[1:2])[0], got[1])


def test_one_mode_per_module():
    lin = fastattn.Linear(8, 4, seed=0, quantize="int8")
    with pytest.raises(ValueError, match="int8 already"):
        lin.quantize_("bfloat16")
    b = fastattn.Linear(8, 4, seed=0, quantize="bfloat16")
    with pytest.raises(ValueError, match="bfloat16 module cannot be turned back"):
        b.quantize_(None)
    assert b.quantize_("bfloat16") is b                 # the same mode again: nothing to do
    with pytest.raises(ValueError, match="float32"):
        fastattn.Linear(8, 4, dtype=np.float64, quantize="bfloat16")
