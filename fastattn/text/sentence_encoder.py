"""SentenceEncoder: sentences in, embeddings out, for a BERT-family / sentence-transformers folder.

    import fastattn
    enc = fastattn.SentenceEncoder("all-MiniLM-L6-v2")
    vectors = enc.encode(["A man is eating food.", "A man rides a horse."])   # (2, 384) float32

Semantics: sentence-transformers' ``SentenceTransformer(path).encode(sentences)``: the folder's
tokenizer (``tokenizer.json`` through ``tokenizers``, or a BERT ``vocab.txt``), truncation to
the folder's ``max_seq_length`` (sentence_bert_config.json; else the tokenizer's
``model_max_length``; never past the model's position table), lower-cased first when
sentence_bert_config.json says ``do_lower_case``, then the folder's pooling and normalisation
(the modes of :meth:`fastattn.EncoderModel.embed`, over each sentence's own tokens). No torch, transformers or sentence-transformers at run
time.

Batching: sentences are sorted by length and cut into batches of ``batch_size``; the vectors
come back in input order and are bitwise identical whatever ``batch_size`` is (fastattn computes
each row the same way whatever else is in its batch; see :mod:`fastattn.text.batching`).
"""
import os

import numpy as np

from ..models import EncoderModel
from ..models._sentence_transformers import pool, read_folder, st_config
from .._quant import check_quantize
from ._common import check_folder, check_threads, model_family
from ._progress import progress_bar
from .batching import check_batching, length_batches, pad_batch
from .tokenizers import JsonTokenizer, check_texts, load_tokenizer

__all__ = ["SentenceEncoder"]


class SentenceEncoder:
    """A sentence-embedding model folder with its own tokenizer.

    Parameters
    ----------
    path : str or os.PathLike
        A sentence-transformers folder (modules.json: Transformer, Pooling, optional Dense,
        optional Normalize) or a plain encoder folder of a family EncoderModel reads (BERT,
        RoBERTa, DistilBERT, MPNet, ModernBERT ...: mean pooling, normalised).
    quantize : None, "int8" or "bfloat16"
        "int8": the linear layers compute with int8 weights (``EncoderModel.from_pretrained``'s
        quantize).
    n_threads : int, optional
        OpenMP threads for encode (applied with threadpoolctl's limit for the call; a global
        ``fastattn.set_num_threads`` takes precedence).

    Attributes
    ----------
    model : fastattn.EncoderModel
    tokenizer : fastattn.text.JsonTokenizer
    max_seq_length : int, the truncation length in tokens (special tokens included)
    dim : int, the embedding size
    normalize : bool, whether encode L2-normalises by default
    """

    def __init__(self, path, *, quantize=None, n_threads=None):
        path = check_folder(path)
        tdir = read_folder(path)[0]           # the Transformer module's folder
        model_family(tdir, "encoder")
        check_quantize(quantize)
        self.n_threads = check_threads(n_threads)
        self.path = path
        self.model = EncoderModel.from_pretrained(path, quantize=quantize)
        self.tokenizer = load_tokenizer(tdir)
        if not isinstance(self.tokenizer, JsonTokenizer):
            raise ValueError(f"{tdir}: a {self.tokenizer.family} tokenizer cannot feed an "
                             f"encoder")
        self.quantize = quantize
        cfg, cfg_path = st_config(path, tdir)
        lower = cfg.get("do_lower_case", False)
        if not isinstance(lower, bool):
            raise ValueError(f"{cfg_path}: do_lower_case={lower!r} must be true or false")
        self.do_lower_case = lower
        limit = self.model.max_seq_length or self.tokenizer.model_max_length
        top = self.model.config.max_tokens
        self.max_seq_length = top if limit is None else min(limit, top)
        vocab = self.model.config.vocab_size
        if self.tokenizer._tk.get_vocab_size(with_added_tokens=True) > vocab:
            raise ValueError(f"{tdir}: the tokenizer has "
                             f"{self.tokenizer._tk.get_vocab_size(with_added_tokens=True)} ids, "
                             f"more than the model's vocab_size {vocab}")
        self.dim = self.model.hidden_size * len(self.model.pooling)
        # sentence-transformers normalises only where a Normalize module says so: a plain
        # model folder (no modules.json) gets mean pooling without it
        self.normalize = self.model.normalize if os.path.isfile(
            os.path.join(path, "modules.json")) else False

    def __repr__(self):
        return f"SentenceEncoder({self.path!r}, model={self.model!r})"

    def tokenize(self, sentences):
        """(ids, type_ids): lists of token id lists, truncated to max_seq_length."""
        texts = [s.lower() for s in sentences] if self.do_lower_case else sentences
        return self.tokenizer.encode(texts, max_length=self.max_seq_length, types=True)

    def encode(self, sentences, *, batch_size=32, normalize=None, progress=False):
        """Embeddings of sentences.

        Parameters
        ----------
        sentences : str or sequence of str
        batch_size : int
            Sentences per forward pass (after sorting by length); the result does not depend
            on it, bit for bit.
        normalize : bool, optional
            L2-normalise each vector. Default: the folder's, as sentence-transformers (a
            Normalize module in modules.json; a plain model folder is not normalised).
            ``normalize=False`` turns a folder's Normalize module off (sentence-transformers'
            ``normalize_embeddings=False`` leaves the module on).
        progress : bool
            A progress bar (sentences) on stderr.

        Returns
        -------
        ndarray float32, shape (N, dim) — or (dim,) for a single str, as sentence-transformers.
        """
        single = isinstance(sentences, str)
        texts = [sentences] if single else check_texts(sentences, "sentences")
        batch_size, _ = check_batching(batch_size, None)
        if normalize is not None and not isinstance(normalize, (bool, np.bool_)):
            raise TypeError(f"normalize must be True, False or None, got {normalize!r}")
        norm = self.normalize if normalize is None else bool(normalize)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        ids, types = self.tokenize(texts)
        bar = progress_bar(progress, total=len(texts), desc="embed", unit="sentence")
        try:
            out = self.embed_ids(ids, types, batch_size=batch_size, normalize=norm,
                                 on_batch=bar.update)
        finally:
            bar.close()
        return out[0] if single else out

    def embed_ids(self, ids, types=None, *, batch_size=32, max_batch_tokens=None,
                  normalize=None, on_batch=None):
        """Embeddings of sentences already tokenized (what :meth:`tokenize` gives: lists of
        ids, special tokens included, at most ``max_seq_length`` each; ``types``: token type
        ids, default zeros). The rows are sorted by length and batched by ``batch_size`` and /
        or ``max_batch_tokens`` padded tokens; the result (N, dim) float32 is bitwise the same
        whatever the batching. ``on_batch(n)`` is called after each forward pass."""
        batch_size, max_batch_tokens = check_batching(batch_size, max_batch_tokens)
        norm = self.normalize if normalize is None else bool(normalize)
        out = np.zeros((len(ids), self.dim), dtype=np.float32)
        if not len(ids):
            return out
        from threadpoolctl import threadpool_limits
        limits = threadpool_limits(limits=self.n_threads) if self.n_threads else None
        try:
            for idx in length_batches([len(r) for r in ids], batch_size, max_batch_tokens):
                batch, mask = pad_batch([ids[i] for i in idx], self.tokenizer.pad_id)
                tt = None
                if types is not None and any(any(types[i]) for i in idx):
                    tt, _ = pad_batch([types[i] for i in idx], 0)
                # the last hidden state is row-invariant; pooling then runs on each row's
                # own tokens, so that no reduction's length depends on the padding (a
                # (1, S) @ (S, H) product's summation order does, with S)
                hidden = self.model(batch, mask, tt)
                for r, i in enumerate(idx):
                    rows = np.ascontiguousarray(hidden[r:r + 1, :len(ids[i])])
                    out[i] = pool(rows, None, self.model.pooling, norm)[0]
                if on_batch is not None:
                    on_batch(len(idx))
        finally:
            if limits is not None:
                limits.restore_original_limits()
        return out
