"""Batch inference over a Dask cluster: ``fastattn.dask.generate`` / ``encode`` (token ids) and
``translate`` / ``embed`` (text, through the model folder's own tokenizer) and ``transcribe``
(audio files through a Whisper folder).

Not imported by ``import fastattn``; needs ``pip install "fastattn[dask]"`` (dask[distributed]).

    import dask.bag as db, fastattn.dask
    from distributed import Client, LocalCluster
    client = Client(LocalCluster(n_workers=2, threads_per_worker=1))   # one big machine
    bag = db.from_sequence(token_id_lists, npartitions=8)               # 1-D id sequences, no padding
    out = fastattn.dask.generate(bag, "path/to/marian", batch_size=32, num_beams=4)
    translations = out.compute()                                         # same order as `bag`

    lines = db.read_text("corpus-*.txt").map(str.rstrip)                 # text in, text out
    fastattn.dask.translate(lines, "opus-mt-en-de", batch_size=32).to_textfiles("out-*.txt")
    vectors = fastattn.dask.embed(lines, "all-MiniLM-L6-v2").compute()   # (dim,) float32 each

Design:
- Dask does the scheduling, retries and data movement; fastattn adds nothing of its own. Each
  partition is one task: its sequences are sorted by length (little work wasted on padding),
  cut into batches of `batch_size`, padded with the model's pad id, run through
  ``model.generate`` (``encode``) with an attention mask, and put back in their order with the
  padding removed. Item i of the result is ``model.generate([s_i], **kwargs)[0]`` without its
  trailing pad ids, bitwise, whatever the batching: fastattn's kernels compute every row the
  same way whatever else is in the batch (the GEMM and LayerNorm row by row; attention per key
  index, with sequences short enough for the kernel's in-place path batched among themselves),
  and tests/dask/test_dask.py checks it.
- A checkpoint path is loaded once per worker process and kept (a module-level cache); a model
  object is put into the graph once, as a single key every partition depends on, so each worker
  receives it once rather than once per task.
- Threads: a task uses as many threads as its worker was given (``threads_per_worker``), with
  the worker's BLAS pool limited to match, and the tasks of one worker take turns (a per-process
  lock) so that a worker never runs more threads than it was given. On one machine, give the
  cluster ``n_workers * threads_per_worker = cores``.
- Failures: tasks are pure functions of their partition, so when a worker dies Dask re-runs its
  tasks elsewhere and the result is unchanged.
"""
import os
import threading
import uuid

import numpy as np

from ._quant import check_quantize
from ._validation import check_folder, check_positive_int, check_token_ids

__all__ = ["generate", "encode", "translate", "embed", "transcribe"]

_MODELS = {}                 # (path, dtype) -> model, per worker process
_MODELS_LOCK = threading.Lock()
_COMPUTE_LOCK = threading.Lock()   # one fastattn task at a time per worker process


def _require_dask():
    try:
        import dask.bag  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError('fastattn.dask needs dask: pip install "fastattn[dask]"') from exc


def _check_sources(sources):
    import dask.bag as db
    if not isinstance(sources, db.Bag):
        raise TypeError("sources must be a dask.bag.Bag of 1-D token id sequences, got "
                        f"{type(sources).__name__}")


def _model_ref(model):
    """What a task receives for `model`: a path (loaded on the worker), or one Delayed object."""
    from .models import Seq2SeqTransformer
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"model: no checkpoint folder at {path!r}")
        return ("path", os.path.abspath(path), None)
    if isinstance(model, Seq2SeqTransformer):
        import dask
        # a named key: the object is pickled once into the graph, and each worker fetches it once
        # (pure=True would hash every weight to name it)
        return ("object", None, dask.delayed(model, name=f"fastattn-model-{uuid.uuid4().hex}"))
    raise TypeError("model must be a fastattn.models.Seq2SeqTransformer or the path of a checkpoint "
                    f"folder, got {type(model).__name__}")


def _load(kind, path, obj, dtype):
    if kind == "object":
        return obj
    key = (path, np.dtype(dtype).name)
    with _MODELS_LOCK:
        model = _MODELS.get(key)
        if model is None:
            from .models import Seq2SeqTransformer
            model = _MODELS[key] = Seq2SeqTransformer.from_pretrained(path, dtype=dtype)
    return model


def _worker_threads():
    """Threads this task may use: its worker's share of the machine, else fastattn's default."""
    try:
        from distributed import get_worker
        worker = get_worker()
    except (ImportError, ValueError):
        from ._threads import get_num_threads
        return get_num_threads()
    state = getattr(worker, "state", worker)
    return max(1, int(getattr(state, "nthreads", None) or getattr(worker, "nthreads", 1)))


def _items(partition, part_index, model):
    """The partition's items as int64 arrays, checked: 1-D, ids in range, no pad id inside."""
    vocab = model.vocab_size
    out = []
    for j, item in enumerate(partition):
        where = f"item {j} of partition {part_index}"
        a = check_token_ids(item, f"sources: {where}", vocab, ndim=1,
                            what="sequence of token ids")
        if a.size == 0:
            raise ValueError(f"sources: {where} must be a non-empty 1-D sequence of token ids, "
                             f"got shape {a.shape}")
        if model.pad_id != model.eos_id and np.any(a == model.pad_id):
            raise ValueError(f"sources: {where} contains the pad id {model.pad_id}: items are "
                             "unpadded sequences (fastattn.dask pads the batches itself)")
        out.append(a.astype(np.int64, copy=False))
    return out


def _batches(items, batch_size, pad_id):
    """(indices, ids (B, S), mask (B, S)) per batch of similar lengths (sorted by length).

    Sequences of at most DIRECT_MAX_L tokens never share a batch with longer ones: the attention
    kernel reads keys in place for so few query rows and packs them for more, and the two
    paths round differently, so a short sequence padded past that length would not get the bits
    it gets alone. Within each path, padding changes no bit of a row's result
    (:mod:`fastattn.text.batching`, which fastattn.Translator / SentenceEncoder use too)."""
    from .text.batching import length_batches, pad_batch
    for idx in length_batches([len(a) for a in items], batch_size):
        ids, mask = pad_batch([items[i] for i in idx], pad_id)
        yield idx, ids, mask


def _strip_trailing_pad(row, pad_id):
    """A generated row without the pad ids after its end (the start token always stays)."""
    n = len(row)
    while n > 1 and row[n - 1] == pad_id:
        n -= 1
    return row[:n].copy()


def _run_partition(partition, part_index, kind, path, obj, dtype, batch_size, what, kwargs):
    from threadpoolctl import threadpool_limits
    (part_index,) = part_index      # the matching partition of range(npartitions): one number
    model = _load(kind, path, obj, dtype)
    kwargs = dict(kwargs)           # shared by the partitions a worker runs: never modify it
    items = _items(partition, part_index, model)
    results = [None] * len(items)
    n_threads = kwargs.pop("n_threads", None) or _worker_threads()
    with _COMPUTE_LOCK, threadpool_limits(limits=n_threads, user_api="blas"):
        for idx, ids, mask in _batches(items, batch_size, model.pad_id):
            if what == "generate":
                out = model.generate(ids, mask, n_threads=n_threads, **kwargs)
                for r, i in enumerate(idx):
                    results[i] = _strip_trailing_pad(out[r], model.pad_id)
            else:
                out = model.encode(ids, mask, n_threads=n_threads)
                for r, i in enumerate(idx):
                    results[i] = np.ascontiguousarray(out[r, :len(items[i])])
    return results


def _map(sources, model, batch_size, what, kwargs, dtype):
    _require_dask()
    import dask.bag as db
    _check_sources(sources)
    batch_size = check_positive_int(batch_size, "batch_size")
    kind, path, obj = _model_ref(model)
    if kind == "object":
        dtype = None
    elif dtype is None:
        dtype = np.float32
    parts = db.from_sequence(range(sources.npartitions), npartitions=sources.npartitions)
    return sources.map_partitions(_run_partition, parts, kind, path, obj, dtype, batch_size, what,
                                  dict(kwargs))


def generate(sources, model, *, batch_size=32, dtype=None, **generate_kwargs):
    """Generate for every item of a Dask bag of token id sequences.

    Parameters
    ----------
    sources : dask.bag.Bag
        Items are 1-D sequences (lists or arrays) of token ids, without padding.
    model : Seq2SeqTransformer or path
        A model object (sent to each worker once) or a checkpoint folder (loaded once per
        worker process by ``Seq2SeqTransformer.from_pretrained``).
    batch_size : int
        Sequences per ``generate`` call inside a partition (sorted by length first).
    dtype : float32 or float64, optional
        For a path: the dtype it is loaded in (float32 by default).
    **generate_kwargs
        Passed to :meth:`Seq2SeqTransformer.generate` (``max_new_tokens``, ``num_beams``, ...).
        ``n_threads`` defaults to the threads of the worker running the task. Sampling
        (``do_sample=True, seed=...``) is reproducible for a fixed partitioning and batch size.

    Returns
    -------
    dask.bag.Bag
        Item i is the int64 array ``model.generate([s_i], **generate_kwargs)[0]`` without its
        trailing pad ids: the start token, then the generated tokens.
    """
    return _map(sources, model, batch_size, "generate", generate_kwargs, dtype)


def encode(sources, model, *, batch_size=32, dtype=None):
    """Encode every item of a Dask bag of token id sequences: item i becomes the (S_i, d_model)
    array ``model.encode([s_i])[0]``. Arguments as :func:`generate`."""
    return _map(sources, model, batch_size, "encode", {}, dtype)


# ---------------------------------------------------------------------------------------------
# text in, text out: fastattn.Translator / SentenceEncoder per worker

def _load_text(what, path, dtype):
    key = (what, path, dtype if what == "transcribe" or dtype is None else np.dtype(dtype).name)
    with _MODELS_LOCK:
        model = _MODELS.get(key)
        if model is None:
            from .text import SentenceEncoder, Translator
            if what == "transcribe":
                from .audio import Transcriber
                model = Transcriber(path, quantize=dtype)
            elif what == "translate":
                model = Translator(path, dtype=np.float32 if dtype is None else dtype)
            else:
                model = SentenceEncoder(path)
            _MODELS[key] = model
    return model


def _run_text_partition(partition, part_index, what, path, dtype, options, kwargs):
    from threadpoolctl import threadpool_limits
    (part_index,) = part_index
    texts = []
    for j, item in enumerate(partition):
        if what == "transcribe":
            if not isinstance(item, (str, os.PathLike, np.ndarray)):
                raise TypeError(f"audio: item {j} of partition {part_index} must be a path or "
                                f"a 1-D array of 16 kHz samples, got {type(item).__name__}")
        elif not isinstance(item, str):
            raise TypeError(f"texts: item {j} of partition {part_index} must be a str, got "
                            f"{type(item).__name__}")
        texts.append(item)
    model = _load_text(what, path, dtype)
    kwargs = dict(kwargs)
    n_threads = kwargs.pop("n_threads", None) or _worker_threads()
    with _COMPUTE_LOCK:
        if what == "transcribe":
            model.n_threads = n_threads
            return [model.transcribe(a, **options) for a in texts]
        if what == "translate":
            with threadpool_limits(limits=n_threads, user_api="blas"):
                return model.translate(texts, n_threads=n_threads, **options, **kwargs)
        # the encoder's kernels follow OpenMP's thread limit (threadpoolctl's, for this call)
        with threadpool_limits(limits=n_threads):
            out = model.encode(texts, **options)
        return [row.copy() for row in out]


def _map_text(texts, path, what, options, kwargs, dtype):
    _require_dask()
    import dask.bag as db
    if not isinstance(texts, db.Bag):
        raise TypeError(f"texts must be a dask.bag.Bag of str, got {type(texts).__name__}")
    path = check_folder(path)
    if what != "transcribe":
        from .text.batching import check_batching
        check_batching(options.get("batch_size", 32), options.get("max_batch_tokens"))
    parts = db.from_sequence(range(texts.npartitions), npartitions=texts.npartitions)
    return texts.map_partitions(_run_text_partition, parts, what, os.path.abspath(path), dtype,
                                dict(options), dict(kwargs))


def translate(texts, path, *, batch_size=32, max_batch_tokens=None, src_lang=None, tgt_lang=None,
              dtype=None, **generate_kwargs):
    """Translate every string of a Dask bag with a translation model folder.

    Each worker process loads ``fastattn.Translator(path)`` once; each partition is one task,
    translated with :meth:`fastattn.Translator.translate` (sorted by length, batches of
    ``batch_size`` lines or ``max_batch_tokens`` padded tokens) on the worker's threads.
    Item i of the result is ``Translator(path).translate([texts_i], **kw)[0]``, whatever the
    partitioning and batching (fastattn's row-invariance).

    Parameters
    ----------
    texts : dask.bag.Bag of str
    path : str or os.PathLike, a Marian (OPUS-MT) folder
    batch_size, max_batch_tokens, src_lang, tgt_lang : as Translator.translate
    dtype : float32 (default) or float64
    **generate_kwargs : Seq2SeqTransformer.generate settings (num_beams, max_new_tokens, ...)

    Returns
    -------
    dask.bag.Bag of str, in the order of `texts`.
    """
    options = {"batch_size": batch_size, "max_batch_tokens": max_batch_tokens,
               "src_lang": src_lang, "tgt_lang": tgt_lang}
    return _map_text(texts, path, "translate", options, generate_kwargs, dtype)


def embed(texts, path, *, batch_size=32, normalize=None):
    """Sentence embeddings of every string of a Dask bag: item i is the float32 vector
    ``SentenceEncoder(path).encode([texts_i])[0]``, bitwise, whatever the partitioning.
    Each worker process loads the folder once (see :func:`translate`)."""
    if normalize is not None and not isinstance(normalize, (bool, np.bool_)):
        raise TypeError(f"normalize must be True, False or None, got {normalize!r}")
    options = {"batch_size": batch_size, "normalize": normalize}
    return _map_text(texts, path, "embed", options, {}, None)


def transcribe(audio, path, *, quantize=None, **options):
    """Transcribe every audio file (path, or 1-D array of 16 kHz samples) of a Dask bag with
    a Whisper folder: item i is ``Transcriber(path, quantize=quantize).transcribe(audio_i,
    **options)`` (a :class:`fastattn.audio.Transcription`), bitwise, whatever the
    partitioning and the workers' thread counts. Each worker process loads the folder once."""
    from .audio.transcriber import TRANSCRIBE_DEFAULTS
    for key in options:
        if key not in TRANSCRIBE_DEFAULTS:
            raise TypeError(f"transcribe() got an unexpected keyword argument {key!r}")
    check_quantize(quantize)
    return _map_text(audio, path, "transcribe", options, {}, quantize)
