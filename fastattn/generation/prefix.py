"""A forced decoder prefix fed to a decoding state before the search (the searches of
:mod:`.search` and :mod:`.beam_ct2`): in one chunk where the state can, one position a step
otherwise."""
import numpy as np

__all__ = ["feed_prefix"]


def feed_prefix(state, rows, on_logits=None):
    """Feed a forced prefix's positions rows (n_rows, T) (all of the prefix but its last
    position, whose logits start the search) into a fresh state. A state with ``prefill``
    (:class:`~fastattn.models.seq2seq.Seq2SeqTransformer`'s) takes them as one chunk, its
    logits computed only where `on_logits` asks for them (``on_logits.positions``, a
    collection of t); otherwise, or when `on_logits` names no positions, one position a step
    with on_logits(t, logits) after each."""
    rows = np.asarray(rows, np.int64)
    T = rows.shape[1]
    if T == 0:
        return
    prefill = getattr(state, "prefill", None)
    want = None if on_logits is None else getattr(on_logits, "positions", None)
    if prefill is not None and state.length == 0 and (on_logits is None or want is not None):
        for t, lg in prefill(rows, sorted(t for t in want if 0 <= t < T) if want else ()):
            on_logits(t, lg)
        return
    for t in range(T):
        lg = state.step(rows[:, t])
        if on_logits is not None:
            on_logits(t, lg)
