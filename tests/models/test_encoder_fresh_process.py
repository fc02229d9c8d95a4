"""The model as the very first thing a fresh interpreter runs (no warm-up by other tests)."""
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("safetensors")

from encoder_checkpoints import padded_batch, write_numpy_bert  # noqa: E402
import fastattn  # noqa: E402
from fastattn.models import EncoderModel  # noqa: E402

CHILD = r"""
import sys
import numpy as np
import fastattn
enc = fastattn.EncoderModel.from_pretrained(sys.argv[1])
ids = np.load(sys.argv[2]); mask = np.load(sys.argv[3])
np.save(sys.argv[4], enc(ids, attention_mask=mask))
np.save(sys.argv[5], enc.embed(ids, attention_mask=mask))
# torch-free: neither torch nor transformers was imported on the way
assert "torch" not in sys.modules and "transformers" not in sys.modules, "torch imported"
"""


def test_first_call_in_a_fresh_process(tmp_path):
    write_numpy_bert(tmp_path / "m", seed=11, dtype=np.float64)
    ids, mask = padded_batch(np.random.default_rng(0), 60, [8, 5, 0], 8)
    np.save(tmp_path / "ids.npy", ids)
    np.save(tmp_path / "mask.npy", mask)
    env = dict(os.environ)
    # the fastattn this process uses (an in-place build or the installed wheel)
    root = os.path.dirname(os.path.dirname(fastattn.__file__))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "m"), str(tmp_path / "ids.npy"),
         str(tmp_path / "mask.npy"), str(tmp_path / "h.npy"), str(tmp_path / "v.npy")],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    hidden, vec = np.load(tmp_path / "h.npy"), np.load(tmp_path / "v.npy")
    # reference: the same checkpoint in float64 in this process
    ref = EncoderModel.from_pretrained(tmp_path / "m", dtype=np.float64)
    expect_h = ref(ids, attention_mask=mask)
    expect_v = ref.embed(ids, attention_mask=mask)
    assert hidden.dtype == np.float32 and hidden.shape == (3, 8, 32)
    keep = [0, 1]
    assert np.abs(hidden[keep] - expect_h[keep]).max() / np.abs(expect_h[keep]).max() <= 1e-4
    np.testing.assert_allclose(vec, expect_v, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(vec[2], 0.0)
