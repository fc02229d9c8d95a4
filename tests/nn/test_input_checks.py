"""The nn modules refuse what they cannot compute on (strings, complex, objects) and options of
the wrong type, instead of converting them silently; damaged saved files name the file."""
import json

import numpy as np
import pytest

import fastattn

BAD_INPUTS = [np.array([["1", "2", "3", "4"]]), np.ones((2, 4)) + 1j,
              np.array([[object()] * 4])]
if np.dtype(np.longdouble).itemsize > 8:      # where long double is just float64, it is fine
    BAD_INPUTS.append(np.ones((2, 4), np.longdouble))


@pytest.mark.parametrize("make", [
    lambda: fastattn.Linear(4, 3, seed=0),
    lambda: fastattn.FeedForward(4, 8, seed=0),
    lambda: fastattn.LayerNorm(4),
    lambda: fastattn.PositionalEncoding(4),
])
def test_modules_refuse_non_real_inputs(make):
    m = make()
    for x in BAD_INPUTS:
        with pytest.raises(TypeError, match="x must be a real numeric array"):
            m(x)
    # ints and bools are numbers: computed in the module's dtype, like floats
    y = m(np.ones((2, 4), np.int64))
    np.testing.assert_array_equal(y, m(np.ones((2, 4), np.float32)))


def test_options_must_have_their_type():
    with pytest.raises(TypeError, match="norm_first"):
        fastattn.TransformerEncoderLayer(8, 2, 16, norm_first="False", seed=0)
    # the integers 0 and 1 are accepted as flags (torch takes any truthy value)
    assert fastattn.TransformerEncoderLayer(8, 2, 16, norm_first=1, bias=0, seed=0).norm_first
    with pytest.raises(TypeError, match="norm_first"):
        fastattn.TransformerEncoderLayer(8, 2, 16, norm_first=2, seed=0)
    with pytest.raises(TypeError, match="seed"):
        fastattn.Linear(4, 3, seed="x")
    for bad in ("x", None, True, [2.0]):
        with pytest.raises(TypeError, match="scale must be a real number"):
            fastattn.PositionalEncoding(8, scale=bad)
    with pytest.raises(ValueError, match="scale must be finite"):
        fastattn.PositionalEncoding(8, scale=float("inf"))
    x = np.ones((1, 3, 8), np.float32)
    np.testing.assert_array_equal(fastattn.PositionalEncoding(8, scale=np.float32(2))(x),
                                  fastattn.PositionalEncoding(8)(2 * x))
    with pytest.raises(ValueError, match="seed"):
        fastattn.Linear(4, 3, seed=-1)
    with pytest.raises(TypeError, match="bias"):
        fastattn.TransformerEncoderLayer(8, 2, 16, bias="no", seed=0)
    for make in (lambda: fastattn.Linear(4, 3, bias="no", seed=0),
                 lambda: fastattn.LayerNorm(4, bias="no"),
                 lambda: fastattn.MultiHeadAttention(8, 2, bias="no", seed=0),
                 lambda: fastattn.FeedForward(4, 8, bias="no", seed=0)):
        with pytest.raises(TypeError, match="bias"):
            make()
    with pytest.raises(ValueError, match="layer_norm_eps"):
        fastattn.Transformer(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                             dim_feedforward=16, layer_norm_eps=-1.0, seed=0)
    with pytest.raises(TypeError, match="layer_norm_eps"):
        fastattn.TransformerEncoderLayer(8, 2, 16, layer_norm_eps="x", seed=0)
    with pytest.raises(ValueError, match="eps"):
        fastattn.LayerNorm(4, eps=float("nan"))
    mha = fastattn.MultiHeadAttention(8, 2, seed=0)
    x = np.ones((1, 3, 8), np.float32)
    with pytest.raises(TypeError, match="need_weights"):
        mha(x, x, x, need_weights="no")
    _, w = mha(x, x, x, need_weights=True)
    assert w.shape == (1, 3, 3)
    for bad in (2.7, "3", -1, True):
        with pytest.raises(ValueError, match="sz"):
            fastattn.Transformer.generate_square_subsequent_mask(bad)
    assert fastattn.Transformer.generate_square_subsequent_mask(np.int64(3)).shape == (3, 3)


def test_load_names_the_damaged_file(tmp_path):
    from safetensors.numpy import save_file
    layer = fastattn.LayerNorm(4)
    good = tmp_path / "ln.safetensors"
    layer.save(good)
    x = np.arange(8.0, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(fastattn.LayerNorm.load(good)(x), layer(x))
    data = good.read_bytes()
    bad = tmp_path / "bad.safetensors"
    for content in (data[:len(data) // 2], b"", b"\x00" * 40):
        bad.write_bytes(content)
        with pytest.raises(ValueError, match="bad.safetensors"):
            fastattn.LayerNorm.load(bad)
    tensors = {"weight": np.ones(4, np.float32), "bias": np.zeros(4, np.float32)}
    for meta in ("{not json", "[1, 2]",
                 json.dumps({"normalized_shape": 4, "eps": 1e-5, "bias": True,
                             "dtype": "float32", "evil": 1})):
        save_file(tensors, str(bad), metadata={"fastattn_class": "LayerNorm",
                                               "fastattn_config": meta})
        with pytest.raises(ValueError, match="bad.safetensors"):
            fastattn.LayerNorm.load(bad)
    save_file({"weight": np.ones(4, np.int32), "bias": np.zeros(4, np.float32)}, str(bad),
              metadata={"fastattn_class": "LayerNorm", "fastattn_config": json.dumps(
                  {"normalized_shape": 4, "eps": 1e-5, "bias": True, "dtype": "float32"})})
    with pytest.raises(ValueError, match="not a float"):
        fastattn.LayerNorm.load(bad)
