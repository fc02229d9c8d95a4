"""Length-sorted batches: what the text front ends and fastattn.dask share.

Sorting sequences by length before cutting batches wastes little work on padding. fastattn
computes every row of a batch the same way whatever else is in it (the GEMM and LayerNorm row by
row, attention per key index), with one exception the batches respect: sequences of at most
``DIRECT_MAX_L`` tokens never share a batch with longer ones, because the attention kernel reads
keys in place for so few query rows and packs them for more, and the two paths round
differently. Within each group padding changes no bit of a row's result, so the results do not
depend on the batching.

``pad_batch`` (rows -> right-padded ids and their mask) is fastattn._validation's, below
generation/, whose continuous batching pads with it too.
"""
from .._validation import check_positive_int, pad_batch

__all__ = ["check_batching", "length_batches", "pad_batch"]


def _direct_max_l():
    from .._kernels._attention import DIRECT_MAX_L
    return int(DIRECT_MAX_L)


def check_batching(batch_size, max_batch_tokens):
    """(batch_size or None, max_batch_tokens or None), checked: positive integers; batch_size
    may be None only when max_batch_tokens is given."""
    if max_batch_tokens is not None:
        max_batch_tokens = check_positive_int(max_batch_tokens, "max_batch_tokens")
    if batch_size is None:
        if max_batch_tokens is None:
            raise ValueError("batch_size must be a positive integer (None only together with "
                             "max_batch_tokens)")
    else:
        batch_size = check_positive_int(batch_size, "batch_size")
    return batch_size, max_batch_tokens


def length_batches(lengths, batch_size=32, max_batch_tokens=None):
    """Batches of indices into `lengths`, sorted by length (ties by index).

    A batch holds at most `batch_size` sequences (None: no count limit) and, when
    `max_batch_tokens` is given, at most that many padded tokens (rows x longest row); a single
    sequence longer than that is a batch of its own. Sequences of at most DIRECT_MAX_L tokens
    and longer ones are never mixed (see the module docstring).
    """
    lengths = [int(n) for n in lengths]
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    cut = _direct_max_l()
    n_short = sum(lengths[i] <= cut for i in order)
    out = []
    for group in (order[:n_short], order[n_short:]):
        batch = []
        for i in group:
            # ascending lengths: the batch's longest row is the one being added
            rows = len(batch) + 1
            if batch and ((batch_size is not None and rows > batch_size) or
                          (max_batch_tokens is not None and rows * lengths[i] > max_batch_tokens)):
                out.append(batch)
                batch = []
            batch.append(i)
        if batch:
            out.append(batch)
    return out
