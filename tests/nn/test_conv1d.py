"""fastattn.nn.conv.Conv1d (im2col + the packed GEMM) against torch.nn.Conv1d."""
import numpy as np
import pytest

from fastattn.nn.conv import Conv1d

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("cin, cout, k, stride, padding, length", [
    (80, 64, 3, 1, 1, 300),        # Whisper's conv1
    (64, 64, 3, 2, 1, 300),        # Whisper's conv2
    (5, 7, 4, 3, 0, 17),
    (3, 2, 1, 1, 0, 1),
])
def test_matches_torch(cin, cout, k, stride, padding, length):
    torch.manual_seed(0)
    ref = torch.nn.Conv1d(cin, cout, k, stride=stride, padding=padding)
    conv = Conv1d.from_torch_state_dict(ref.state_dict(), stride=stride, padding=padding)
    x = np.random.default_rng(0).standard_normal((2, cin, length)).astype(np.float32)
    with torch.no_grad():
        want = ref(torch.from_numpy(x)).numpy()
    got = conv(x)
    assert got.shape == want.shape == (2, cout, conv.output_length(length))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(conv(x[0]), want[0], rtol=1e-5, atol=1e-5)   # unbatched
    sd = conv.state_dict()
    assert sd["weight"].shape == (cout, cin, k)
    np.testing.assert_array_equal(sd["weight"], ref.weight.detach().numpy())
    # channels-last input and a fused activation: the model's path
    h = conv._forward(np.ascontiguousarray(x.transpose(0, 2, 1)), True, "gelu", None, 2)
    np.testing.assert_allclose(h.reshape(2, -1, cout).transpose(0, 2, 1),
                               torch.nn.functional.gelu(torch.from_numpy(want)).numpy(),
                               rtol=1e-5, atol=1e-5)
    assert np.array_equal(conv._forward(x, n_threads=1), conv._forward(x, n_threads=2))
    conv.quantize_("int8")
    assert np.max(np.abs(conv(x) - want)) < 0.05 * np.max(np.abs(want))


def test_bad_inputs():
    conv = Conv1d(4, 2, 3)
    with pytest.raises(ValueError, match="shape"):
        conv(np.zeros((1, 5, 10), np.float32))
    with pytest.raises(ValueError, match="fewer than the kernel"):
        conv(np.zeros((1, 4, 2), np.float32))
    with pytest.raises(ValueError, match="padding"):
        Conv1d(4, 2, 3, padding=-1)
