"""SentenceEncoder: sentences in, embeddings out, for a BERT-family / sentence-transformers folder.

    import fastattn
    enc = fastattn.SentenceEncoder("all-MiniLM-L6-v2")
    vectors = enc.encode(["A man is eating food.", "A man rides a horse."])   # (2, 384) float32

Semantics: sentence-transformers' ``SentenceTransformer(path).encode(sentences)``: the folder's
default prompt (config_sentence_transformers.json) before each sentence, the folder's tokenizer
(``tokenizer.json`` through ``tokenizers``, or a BERT ``vocab.txt``), truncation to the folder's
``max_seq_length`` (sentence_bert_config.json; else the tokenizer's ``model_max_length``; never
past the model's position table), lower-cased first when sentence_bert_config.json says
``do_lower_case``, then :meth:`fastattn.EncoderModel.embed`: the folder's pooling (over each
sentence's own tokens), Dense modules, normalisation and truncate_dim. No torch, transformers or
sentence-transformers at run time.

Batching: sentences are sorted by length and cut into batches of ``batch_size``; the vectors
come back in input order and are bitwise identical whatever ``batch_size`` is (fastattn computes
each row the same way whatever else is in its batch; see :mod:`fastattn.text.batching`).
"""
import numpy as np

from ..models import EncoderModel
from ..models._sentence_transformers import read_folder, transformer_config
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
        A sentence-transformers folder (modules.json: Transformer, Pooling, optional Dense and
        Dropout modules, optional Normalize) or a plain encoder folder of a family EncoderModel
        reads (BERT, RoBERTa, DistilBERT, MPNet, ModernBERT ...: mean pooling, not normalised,
        as sentence-transformers).
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
    dim : int, the embedding size (the last module's: a Dense module's out_features, the
        folder's truncate_dim)
    normalize : bool, whether encode L2-normalises by default
    prompt : str or None, the folder's default prompt, put before each sentence
    """

    def __init__(self, path, *, quantize=None, n_threads=None):
        path = check_folder(path)
        folder = read_folder(path)
        tdir = folder.model_dir               # the Transformer module's folder
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
        self.do_lower_case = folder.st_folder and transformer_config(
            tdir, self.model.config.max_tokens)["do_lower_case"]
        self.prompt = folder.prompt
        limit = self.model.max_seq_length or self.tokenizer.model_max_length
        top = self.model.config.max_tokens
        self.max_seq_length = top if limit is None else min(limit, top)
        vocab = self.model.config.vocab_size
        if self.tokenizer._tk.get_vocab_size(with_added_tokens=True) > vocab:
            raise ValueError(f"{tdir}: the tokenizer has "
                             f"{self.tokenizer._tk.get_vocab_size(with_added_tokens=True)} ids, "
                             f"more than the model's vocab_size {vocab}")
        self.dim = self.model.embedding_dim
        # sentence-transformers normalises only where a Normalize module says so: a plain
        # model folder (no modules.json) gets mean pooling without it (EncoderModel's default
        # for such a folder normalises: encode passes False)
        self.normalize = self.model.normalize and folder.st_folder
        self._folder_norm = None if folder.st_folder else False

    def __repr__(self):
        return f"SentenceEncoder({self.path!r}, model={self.model!r})"

    def tokenize(self, sentences, prompt=None):
        """(ids, type_ids): lists of token id lists, truncated to max_seq_length. `prompt`
        goes before each sentence: None, the folder's default prompt; a str ("": none) in
        its place."""
        prompt = _check_prompt(self.prompt if prompt is None else prompt)
        texts = [prompt + s for s in sentences] if prompt else list(sentences)
        if self.do_lower_case:
            texts = [s.lower() for s in texts]
        return self.tokenizer.encode(texts, max_length=self.max_seq_length, types=True)

    def encode(self, sentences, *, batch_size=32, normalize=None, progress=None,
               normalize_embeddings=None, show_progress_bar=None, prompt=None,
               truncate_dim="folder"):
        """Embeddings of sentences.

        Parameters
        ----------
        sentences : str or sequence of str
        batch_size : int
            Sentences per forward pass (after sorting by length); the result does not depend
            on it, bit for bit.
        normalize : bool, optional
            Default: the folder's modules, as sentence-transformers (a Normalize module in
            modules.json, before the folder's truncate_dim; a plain model folder is not
            normalised). True: each vector L2-normalised. False: none (a folder's Normalize
            module is turned off).
        normalize_embeddings : bool, optional
            sentence-transformers' name: True is ``normalize=True``; False keeps the folder's
            modules (its Normalize module stays on, as in sentence-transformers), unless
            ``normalize=False`` is given too. Giving both names with different truth values is
            a TypeError.
        progress, show_progress_bar : bool, optional
            A progress bar (sentences) on stderr (default none); the second is
            sentence-transformers' name (both given: they must agree).
        prompt : str, optional
            Put before each sentence in place of the folder's default prompt ("": none).
        truncate_dim : "folder", int or None
            As :meth:`fastattn.EncoderModel.embed`'s: the folder's (default), the first
            truncate_dim values, or all of them (None).

        Returns
        -------
        ndarray float32, shape (N, dim) — or (dim,) for a single str, as sentence-transformers.
        """
        single = isinstance(sentences, str)
        texts = [sentences] if single else check_texts(sentences, "sentences")
        batch_size, _ = check_batching(batch_size, None)
        for value, name in ((normalize, "normalize"),
                            (normalize_embeddings, "normalize_embeddings")):
            if value is not None and not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{name} must be True, False or None, got {value!r}")
        norm = _alias(normalize, normalize_embeddings, "normalize", "normalize_embeddings")
        if normalize is None and not normalize_embeddings:
            norm = None                       # normalize_embeddings=False: the folder's
        progress = bool(_alias(progress, show_progress_bar, "progress", "show_progress_bar"))
        dim = self.model.output_dim(truncate_dim)
        if not texts:
            return np.zeros((0, dim), dtype=np.float32)
        ids, types = self.tokenize(texts, prompt)
        bar = progress_bar(progress, total=len(texts), desc="embed", unit="sentence")
        try:
            out = self.embed_ids(ids, types, batch_size=batch_size, normalize=norm,
                                 truncate_dim=truncate_dim, on_batch=bar.update)
        finally:
            bar.close()
        return out[0] if single else out

    def embed_ids(self, ids, types=None, *, batch_size=32, max_batch_tokens=None,
                  normalize=None, truncate_dim="folder", on_batch=None):
        """Embeddings of sentences already tokenized (what :meth:`tokenize` gives: lists of
        ids, special tokens included, at most ``max_seq_length`` each; ``types``: token type
        ids, default zeros), through :meth:`fastattn.EncoderModel.embed` (``normalize`` and
        ``truncate_dim`` as :meth:`encode`'s). The rows are sorted by length and batched by
        ``batch_size`` and / or ``max_batch_tokens`` padded tokens; the result (N, dim)
        float32 is bitwise the same whatever the batching. ``on_batch(n)`` is called after
        each forward pass."""
        batch_size, max_batch_tokens = check_batching(batch_size, max_batch_tokens)
        if normalize is not None and not isinstance(normalize, (bool, np.bool_)):
            raise TypeError(f"normalize must be True, False or None, got {normalize!r}")
        norm = self._folder_norm if normalize is None else bool(normalize)
        out = np.zeros((len(ids), self.model.output_dim(truncate_dim)), dtype=np.float32)
        # every row's vector is the same bits whatever else is in its batch
        for idx, batch, mask, tt in self._batches(ids, types, batch_size, max_batch_tokens):
            out[idx] = self.model.embed(batch, mask, tt, normalize=norm,
                                        truncate_dim=truncate_dim)
            if on_batch is not None:
                on_batch(len(idx))
        return out

    def token_embeddings(self, sentences, *, batch_size=32, prompt=None):
        """The last hidden state of each sentence's tokens, special tokens and prompt
        included (sentence-transformers' ``encode(output_value="token_embeddings")``): a list
        of (n_tokens, hidden_size) float32 arrays, bitwise the same whatever the batching.
        `prompt` as :meth:`encode`'s."""
        texts = check_texts(sentences, "sentences")
        batch_size, _ = check_batching(batch_size, None)
        ids, types = self.tokenize(texts, prompt)
        out = [None] * len(ids)
        for idx, batch, mask, tt in self._batches(ids, types, batch_size, None):
            hidden = self.model(batch, mask, tt)
            for row, i in enumerate(idx):
                out[i] = hidden[row, :len(ids[i])].copy()
        return out

    def _batches(self, ids, types, batch_size, max_batch_tokens):
        """(row indices, padded ids, mask, token types or None) of each batch, sorted by
        length, under the n_threads limit."""
        if not len(ids):
            return
        from threadpoolctl import threadpool_limits
        limits = threadpool_limits(limits=self.n_threads) if self.n_threads else None
        try:
            for idx in length_batches([len(r) for r in ids], batch_size, max_batch_tokens):
                batch, mask = pad_batch([ids[i] for i in idx], self.tokenizer.pad_id)
                tt = None
                if types is not None and any(any(types[i]) for i in idx):
                    tt, _ = pad_batch([types[i] for i in idx], 0)
                yield idx, batch, mask, tt
        finally:
            if limits is not None:
                limits.restore_original_limits()


def _check_prompt(prompt):
    if prompt is not None and not isinstance(prompt, str):
        raise TypeError(f"prompt must be a str or None, got {type(prompt).__name__}")
    return prompt


def _alias(ours, theirs, our_name, their_name):
    """An option given under fastattn's name or sentence-transformers' (None: not given): its
    value; both given with different truth values: TypeError naming both."""
    if ours is not None and theirs is not None and bool(ours) != bool(theirs):
        raise TypeError(f"{our_name}={ours!r} and {their_name}={theirs!r} disagree: give one "
                        "of them")
    return theirs if ours is None else ours
