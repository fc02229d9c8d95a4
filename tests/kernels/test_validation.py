"""One test per validation branch: a clear ValueError/TypeError naming the argument and shapes."""
import numpy as np
import pytest

import fastattn
from fastattn import scaled_dot_product_attention as sdpa

q = np.zeros((2, 3, 4, 8), np.float32)
k = np.zeros((2, 3, 5, 8), np.float32)
v = np.zeros((2, 3, 5, 6), np.float32)


def test_rank_too_small():
    with pytest.raises(ValueError, match=r"query must have at least 2 dimensions .* got shape \(8,\)"):
        sdpa(np.zeros(8), k, v)
    with pytest.raises(ValueError, match=r"key must have at least 2 dimensions"):
        sdpa(q, np.zeros(8), v)
    with pytest.raises(ValueError, match=r"value must have at least 2 dimensions"):
        sdpa(q, k, np.float32(1))


def test_embedding_mismatch():
    with pytest.raises(ValueError, match=r"query and key must have the same embedding size E.*"
                                         r"query.shape=\(2, 3, 4, 8\), key.shape=\(2, 3, 5, 7\)"):
        sdpa(q, np.zeros((2, 3, 5, 7)), v)


def test_sequence_mismatch():
    with pytest.raises(ValueError, match=r"key and value must have the same sequence length S.*"
                                         r"value.shape=\(2, 3, 6, 6\)"):
        sdpa(q, k, np.zeros((2, 3, 6, 6)))


def test_leading_dims_do_not_broadcast():
    with pytest.raises(ValueError, match=r"leading .* do not broadcast.*enable_gqa=True"):
        sdpa(q, np.zeros((2, 2, 5, 8)), np.zeros((2, 2, 5, 6)))
    with pytest.raises(ValueError, match=r"do not broadcast"):
        sdpa(q, np.zeros((3, 3, 5, 8)), v)


def test_gqa_errors():
    with pytest.raises(ValueError, match=r"multiple of the key/value heads.*\(3 heads\).*\(2 heads\)"):
        sdpa(q, np.zeros((2, 2, 5, 8)), np.zeros((2, 2, 5, 6)), enable_gqa=True)
    with pytest.raises(ValueError, match=r"key and value must have the same number of heads"):
        sdpa(q, np.zeros((2, 1, 5, 8)), np.zeros((2, 3, 5, 6)), enable_gqa=True)
    with pytest.raises(ValueError, match=r"enable_gqa=True needs a head dimension"):
        sdpa(q[0, 0], k[0, 0], v[0, 0], enable_gqa=True)


def test_mask_errors():
    with pytest.raises(ValueError, match=r"attn_mask of shape \(4, 4\) does not broadcast .*\(2, 3, 4, 5\)"):
        sdpa(q, k, v, attn_mask=np.ones((4, 4), bool))
    with pytest.raises(ValueError, match=r"attn_mask of shape \(5, 4, 5\) does not broadcast"):
        sdpa(q, k, v, attn_mask=np.ones((5, 4, 5), bool))
    with pytest.raises(TypeError, match=r"attn_mask must be a bool array .* got dtype int64"):
        sdpa(q, k, v, attn_mask=np.ones((4, 5), np.int64))
    with pytest.raises(TypeError, match=r"attn_mask must be"):
        sdpa(q, k, v, attn_mask=np.ones((4, 5), complex))


@pytest.mark.parametrize("bad, err, msg", [
    (np.ones((4, 8), complex), TypeError, r"query must be a real numeric array .* complex128"),
    (np.array([["a"] * 8] * 4), TypeError, r"query must be a real numeric array"),
    (np.array([[object()] * 8] * 4), TypeError, r"query must be a real numeric array .* object"),
    (np.ones((4, 8), np.longdouble), TypeError, r"query has dtype float128"),
    (None, TypeError, r"query must be an array, got None"),
    ([[1.0, 2.0], [3.0]], TypeError, r"query could not be converted"),
])
def test_query_dtype_errors(bad, err, msg):
    if isinstance(bad, np.ndarray) and bad.dtype == np.longdouble and np.dtype(np.longdouble).itemsize <= 8:
        pytest.skip("longdouble is float64 on this platform")
    with pytest.raises(err, match=msg):
        sdpa(bad, k[0, 0], v[0, 0])


@pytest.mark.parametrize("scale, err, msg", [
    (float("nan"), ValueError, r"scale must be finite, got nan"),
    (float("inf"), ValueError, r"scale must be finite"),
    ("x", TypeError, r"scale must be a real number or None, got str"),
    (True, TypeError, r"scale must be a real number"),
    (1j, TypeError, r"scale must be a real number"),
])
def test_scale_errors(scale, err, msg):
    with pytest.raises(err, match=msg):
        sdpa(q, k, v, scale=scale)


@pytest.mark.parametrize("name", ["is_causal", "enable_gqa", "return_weights"])
def test_flag_errors(name):
    with pytest.raises(TypeError, match=rf"{name} must be a bool, got str"):
        sdpa(q, k, v, **{name: "yes"})


@pytest.mark.parametrize("n, err", [(0, ValueError), (-1, ValueError), (2.5, TypeError),
                                    (True, TypeError), ("2", TypeError)])
def test_thread_count_errors(n, err):
    with pytest.raises(err, match=r"n_threads must be a positive integer or None"):
        sdpa(q, k, v, n_threads=n)
    with pytest.raises(err, match=r"must be a positive integer or None"):
        fastattn.set_num_threads(n)
    with pytest.raises(err, match=r"n_threads must be a positive integer"):
        fastattn.softmax(q, n_threads=n)


def test_softmax_errors():
    with pytest.raises(ValueError, match=r"axis 2 is out of bounds for x of shape \(2, 2\)"):
        fastattn.softmax(np.zeros((2, 2)), axis=2)
    with pytest.raises(TypeError, match=r"axis must be an int, got float"):
        fastattn.softmax(np.zeros((2, 2)), axis=1.0)
    with pytest.raises(ValueError, match=r"at least one dimension"):
        fastattn.softmax(np.float64(3))
    with pytest.raises(TypeError, match=r"x must be a real numeric array"):
        fastattn.softmax(np.zeros(3, complex))


def test_huge_thread_count_is_fine():
    """More threads than work items is not an error: the kernel caps them."""
    out = sdpa(q, k, v, n_threads=10**6)
    np.testing.assert_array_equal(out, sdpa(q, k, v, n_threads=1))
