"""A forced decoder prefix fed as one chunk (DecoderState.prefill, generation.prefix.feed_prefix):
the logits of the stepwise path (to rounding), float64's to 1e-12, a source's shared prefix
computed once with each row's bits those of the chunk of its own tokens, for any thread count."""
import numpy as np
import pytest

from fastattn.generation.prefix import feed_prefix
from marian_helpers import small_model


def _stepwise(model, memory_ids, rows, group, n_threads=None):
    st = model.start(memory_ids, num_beams=group, n_threads=n_threads)
    out = [st.step(rows[:, t]) for t in range(rows.shape[1])]
    return st, out


@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-5), (np.float64, 1e-12)])
def test_prefill_logits_match_the_stepwise_path(ids, dtype, tol):
    model = small_model(dtype=dtype)
    rng = np.random.default_rng(0)
    K, T = 3, 7
    prefix = rng.integers(2, model.vocab_size, (ids.shape[0], T))
    rows = np.repeat(prefix, K, axis=0)
    st_a, steps = _stepwise(model, ids, rows, K)
    st_b = model.start(ids, num_beams=K)
    got = st_b.prefill(rows[:, :-1], positions=range(T - 1))
    assert [t for t, _ in got] == list(range(T - 1))
    for (t, lg), ref in zip(got, steps):
        assert lg.shape == ref.shape == (rows.shape[0], model.vocab_size)
        np.testing.assert_allclose(lg, ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(st_b.step(rows[:, -1]), steps[-1], rtol=tol, atol=tol)
    assert st_b.length == st_a.length == T
    # the decoding goes on from the prefilled cache as from the stepwise one
    nxt = rng.integers(2, model.vocab_size, rows.shape[0])
    np.testing.assert_allclose(st_b.step(nxt), st_a.step(nxt), rtol=tol, atol=tol)


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_a_shared_prefix_gives_each_row_the_bits_of_its_own_chunk(ids, n_threads):
    model = small_model()
    rng = np.random.default_rng(1)
    K, T = 4, 6
    prefix = rng.integers(2, model.vocab_size, (ids.shape[0], T))
    shared = np.repeat(prefix, K, axis=0)
    # the same rows, but one row of the last source differs: the unshared path (every row
    # computed) for the whole batch
    mixed = shared.copy()
    mixed[-1, 2] = (mixed[-1, 2] + 1) % model.vocab_size
    last = np.repeat(rng.integers(2, model.vocab_size, ids.shape[0]), K)
    res = []
    for rows, thr in ((shared, n_threads), (mixed, n_threads), (shared, 1)):
        st = model.start(ids, num_beams=K, n_threads=thr)
        st.prefill(rows)
        res.append(st.step(last))
    n_same = (ids.shape[0] - 1) * K                 # the sources whose rows are the same
    np.testing.assert_array_equal(res[0][:n_same], res[1][:n_same])
    np.testing.assert_array_equal(res[0], res[2])
    # a source's rows are copies: the same logits in every row of a source
    for b in range(ids.shape[0]):
        for j in range(1, K):
            np.testing.assert_array_equal(res[0][b * K + j], res[0][b * K])


def test_prefill_checks_its_arguments(ids):
    model = small_model()
    st = model.start(ids, num_beams=2)
    with pytest.raises(ValueError, match="rows"):
        st.prefill(np.ones((ids.shape[0], 3), np.int64))
    st.prefill(np.ones((2 * ids.shape[0], 3), np.int64))
    with pytest.raises(ValueError, match="empty cache"):
        st.prefill(np.ones((2 * ids.shape[0], 3), np.int64))
    st = model.start(ids, num_beams=2)
    with pytest.raises(ValueError, match="tokens"):
        st.prefill(np.full((2 * ids.shape[0], 3), model.vocab_size, np.int64))


def test_feed_prefix_reports_the_positions_asked_for(ids):
    model = small_model()
    rng = np.random.default_rng(2)
    K, T = 2, 5
    rows = np.repeat(rng.integers(2, model.vocab_size, (ids.shape[0], T)), K, axis=0)
    _, steps = _stepwise(model, ids, rows, K)
    seen = {}

    def on_logits(t, lg):
        seen[t] = lg
    on_logits.positions = (3, 1, 99)               # out of range: ignored
    st = model.start(ids, num_beams=K)
    feed_prefix(st, rows[:, :T - 1], on_logits)
    assert sorted(seen) == [1, 3] and st.length == T - 1
    for t in (1, 3):
        np.testing.assert_allclose(seen[t], steps[t], rtol=2e-5, atol=2e-5)
    # a callback naming no positions sees every position, fed one a step (the old path):
    # bitwise the stepwise logits
    seen.clear()
    st = model.start(ids, num_beams=K)
    feed_prefix(st, rows[:, :T - 1], lambda t, lg: seen.__setitem__(t, lg))
    assert sorted(seen) == list(range(T - 1))
    for t in range(T - 1):
        np.testing.assert_array_equal(seen[t], steps[t])
