"""Translator: text in, text out, for a translation model folder (Marian / OPUS-MT, BART, mBART,
mBART-50, M2M100, NLLB, Pegasus, T5 / mT5).

    import fastattn
    tr = fastattn.Translator("opus-mt-en-de")              # config.json, model.safetensors, *.spm
    tr.translate(["Where is the bus stop?", "Thank you."])  # -> list of str, input order
    for line in tr.translate_iterable(open("big.txt", encoding="utf-8")):   # bounded memory
        ...

Semantics: transformers' ``tokenizer(texts, padding=True) -> model.generate(...) ->
tokenizer.batch_decode(out, skip_special_tokens=True)``, string for string, with no torch or
transformers at run time (the tokenizer: :mod:`fastattn.text.tokenizers`; the model:
:class:`fastattn.Seq2SeqTransformer`). Decoding settings come from the folder's
generation_config.json (OPUS-MT: beam 4, max_length 512) unless given as keywords
(``num_beams=``, ``max_new_tokens=`` ... as in ``Seq2SeqTransformer.generate``).

Batching: the lines are sorted by length and cut into batches of ``batch_size`` lines, or of at
most ``max_batch_tokens`` padded source tokens; results come back in input order. fastattn
computes each row the same way whatever else is in its batch, so a line's translation is
identical whatever the batching (batch size, token budget, its neighbours, translate vs
translate_iterable): bit for bit in the scores, hence string for string. (CTranslate2 does not
promise this: its batched kernels may round a row differently next to other rows.)

Language codes: mBART-50 and NLLB write ``[src_lang] tokens </s>``, mBART ``tokens </s>
[src_lang]``, M2M100 ``[__src__] tokens </s>`` (as transformers' tokenizers); the target
language is the first generated token (``forced_bos_token_id``). A multilingual Marian model
reads ``>>tgt<<`` before the text.

Long lines: a source longer than the model accepts is truncated to its first pieces plus the
special tokens, ``max_source_length`` ids in all (the smaller of the tokenizer's
``model_max_length`` and the model's ``max_position_embeddings``), which is what
``tokenizer(text, truncation=True, max_length=max_source_length)`` gives; transformers without
truncation would fail on such a line.
"""
import os
import queue
import threading

import numpy as np

from .._quant import check_quantize
from .._validation import check_positive_int
from ..models import Seq2SeqTransformer, _ct2
from ._common import check_folder, check_threads, model_family
from ._progress import progress_bar
from . import argos
from .batching import check_batching, length_batches, pad_batch
from .tokenizers import check_texts, load_tokenizer
from .tokenizers.base import Tokenizer

__all__ = ["Translator"]

_END = object()


class _Cancelled(Exception):
    """Raised from the streamer to stop a generation whose reader went away."""


class Translator:
    """A translation model folder with its own tokenizer.

    Parameters
    ----------
    path : str or os.PathLike
        An Argos Translate package (its ``.argosmodel`` file or installed folder: each input
        string is then translated as argostranslate does, paragraph by paragraph and sentence
        by sentence, see :mod:`fastattn.text.argos`), or a translation model folder: config.json, model.safetensors, generation_config.json
        (when present) and the tokenizer transformers saves for it: Marian (source.spm,
        target.spm, vocab.json), M2M100 (sentencepiece.bpe.model, vocab.json), or the
        tokenizer.json of BART, mBART, mBART-50, NLLB, Pegasus, T5 / mT5 (tokenizer_config.json
        when present), or for T5 / mT5, Pegasus, mBART, mBART-50, NLLB without tokenizer.json
        their spiece.model / sentencepiece.bpe.model (as transformers 5.25 builds it).
    src_lang, tgt_lang : str, optional
        The default language codes of :meth:`translate` (mBART / mBART-50 "en_XX", M2M100 "en"
        or "__en__", NLLB "eng_Latn"; a multilingual Marian model's target "fr" or ">>fr<<").
        Default source: the folder's tokenizer_config.json ``src_lang``, else transformers'
        default for the family; default target: none (the checkpoint's
        ``forced_bos_token_id``, if any, decides).
    quantize : None, "int8" or "bfloat16"
        "int8": the linear layers compute with int8 weights (``Seq2SeqTransformer.
        from_pretrained``'s quantize; float32 only).
    dtype : numpy.float32 or numpy.float64
    n_threads : int, optional
        Threads for each generate call (default: fastattn's, see ``fastattn.get_num_threads``).

    Attributes
    ----------
    model : fastattn.Seq2SeqTransformer
    tokenizer : fastattn.text.Tokenizer (MarianTokenizer, M2M100Tokenizer or JsonTokenizer)
    package : fastattn.text.argos.ArgosPackage, or None for a model folder
    max_source_length : int, the longest source (in tokens, special tokens included) fed to the
        model
    """

    def __init__(self, path, *, src_lang=None, tgt_lang=None, quantize=None, dtype=np.float32,
                 n_threads=None):
        check_quantize(quantize)
        self.n_threads = check_threads(n_threads)
        self.package = None
        if argos.is_package(path) or (isinstance(path, (str, os.PathLike)) and
                                      os.fspath(path).endswith(argos.SUFFIX)):
            self.package = argos.ArgosPackage(path)
            self.path = self.package.path
            model_path = self.package.model_folder
            model_family(model_path, "seq2seq")
            self.tokenizer = _ArgosTokenizer(self.package)
        else:
            path = check_folder(path)
            family = model_family(path, "seq2seq")
            self.path = model_path = path
            self.tokenizer = load_tokenizer(path, family=family.tokenizer)
        self.tokenizer.check_languages(src_lang, tgt_lang)
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        self.model = Seq2SeqTransformer.from_pretrained(model_path, dtype=dtype,
                                                        quantize=quantize)
        self.quantize = quantize
        cfg = self.model.config
        # every id the tokenizer can write must be a row of the model's embedding
        top = self.tokenizer.max_id
        if top >= cfg["vocab_size"]:
            raise ValueError(f"{path}: the tokenizer's ids go up to {top}, but the model's "
                             f"vocab_size is {cfg['vocab_size']} (the tokenizer files and "
                             "config.json do not belong together)")
        limit = cfg["max_position_embeddings"]
        if self.tokenizer.model_max_length is not None:
            limit = min(limit, self.tokenizer.model_max_length)
        self.max_source_length = limit
        if self.package is not None and self.package.prefix_ids and \
                max(self.package.prefix_ids) >= cfg.get("decoder_vocab_size", cfg["vocab_size"]):
            raise ValueError(f"{self.path}: the target prefix is not a row of the model's output")

    def __repr__(self):
        return f"Translator({self.path!r}, model={self.model!r})"

    @property
    def source_languages(self):
        """The language codes ``src_lang`` accepts (empty: the model has none)."""
        return self.tokenizer.source_languages

    @property
    def target_languages(self):
        """The language codes ``tgt_lang`` accepts (empty for a one-pair model)."""
        return self.tokenizer.target_languages

    # -- internals ----------------------------------------------------------------------------

    def _languages(self, src_lang, tgt_lang):
        """The call's language codes (the constructor's where not given), checked."""
        src = self.src_lang if src_lang is None else src_lang
        tgt = self.tgt_lang if tgt_lang is None else tgt_lang
        self.tokenizer.check_languages(src, tgt)
        return src, tgt

    def _encode(self, texts, src_lang, tgt_lang):
        if self.package is not None:
            return [_ArgosDocument(self.package, t, self.max_source_length) for t in texts]
        return self.tokenizer.encode(texts, max_length=self.max_source_length,
                                     src_lang=src_lang, tgt_lang=tgt_lang)

    def _gen_kwargs(self, generate_kwargs, tgt_lang):
        kw = dict(generate_kwargs)
        if "streamer" in kw:
            raise TypeError("translate() does not take streamer=; use translate_stream()")
        kw.setdefault("n_threads", self.n_threads)
        if self.package is not None:
            if "decoder_input_ids" in kw:
                raise TypeError("decoder_input_ids: an Argos package's target prefix is its "
                                "metadata's")
            for key, value in argos.DECODING.items():
                kw.setdefault(key, value)
            n = len(self.package.prefix_ids)
            if kw.get("max_new_tokens") is None and kw.get("max_length") is None:
                kw["max_new_tokens"] = argos.MAX_DECODING_LENGTH - n
            kw.setdefault("min_new_tokens", max(1 - n, 0))
        bos = self.tokenizer.target_language_id(tgt_lang)
        if bos is not None:
            given = kw.get("forced_bos_token_id")
            if given is not None and given != bos:
                raise ValueError(f"forced_bos_token_id={given!r} contradicts tgt_lang="
                                 f"{tgt_lang!r} (id {bos}); give one of them")
            kw["forced_bos_token_id"] = bos
        return kw

    def _run(self, rows, batch_size, max_batch_tokens, kw, bar):
        """Translations of encoded rows (lists of ids), in their order."""
        if self.package is not None:
            return self._run_documents(rows, batch_size, max_batch_tokens, kw, bar)
        out = [None] * len(rows)
        pad = self.model.pad_id
        R = _returned(kw)
        for idx in length_batches([len(r) for r in rows], batch_size, max_batch_tokens):
            ids, mask = pad_batch([rows[i] for i in idx], pad)
            gen = self.model.generate(ids, mask, **kw)
            for r, i in enumerate(idx):
                texts = [self.tokenizer.decode(gen[r * R + k], skip_special_tokens=True)
                         for k in range(R)]
                out[i] = texts[0] if R == 1 else texts
            bar.update(len(idx))
        return out

    def _run_documents(self, docs, batch_size, max_batch_tokens, kw, bar):
        """An Argos package's translations of documents (:class:`_ArgosDocument`): every
        sentence of every document decoded in length-sorted batches, its unknown tokens
        replaced, each document assembled (see :mod:`fastattn.text.argos`)."""
        pkg, m = self.package, self.model
        sents = [s for d in docs for s in d.sentences]
        live = [i for i, s in enumerate(sents) if s.ids]
        start, eos, pad = m.decoder_start_id, m.eos_id, m.pad_id
        head = [start] + pkg.prefix_ids
        L = len(pkg.prefix_ids)
        R = _returned(kw)
        layer, heads = _ct2.alignment(pkg.model_folder, m.config["decoder_layers"],
                                      m.config["decoder_attention_heads"])
        for idx in length_batches([len(sents[i].ids) for i in live], batch_size,
                                  max_batch_tokens):
            rows = [sents[live[i]] for i in idx]
            ids, mask = pad_batch([s.ids for s in rows], pad)
            gkw = dict(kw)
            if pkg.prefix_ids:
                gkw["decoder_input_ids"] = np.array([head] * len(rows), np.int64)
            gen = m.generate(ids, mask, **gkw)
            for r, s in enumerate(rows):
                s.outputs = []
                for k in range(R):
                    seq = gen[r * R + k].tolist()[1:]
                    if eos in seq[L:]:
                        seq = seq[:L + seq[L:].index(eos)]
                    else:
                        while len(seq) > L and seq[-1] == pad:
                            seq.pop()
                    s.outputs.append(seq)
        for s in sents:
            if not s.ids:
                s.outputs = [[] for _ in range(R)]
            s.tokens = []
            for out in s.outputs:
                tokens = pkg.target_tokens(out)
                if pkg.tgt_unk in out:
                    att = m.cross_attention(np.array([s.ids], np.int64),
                                            np.array([[start] + out], np.int64),
                                            layer=layer, heads=heads,
                                            n_threads=kw.get("n_threads"))[0]
                    tokens = pkg.replace_unknowns(tokens, s.pieces, att)
                s.tokens.append(tokens)
        out = [[d.text(k) for k in range(R)] for d in docs]
        bar.update(len(docs))
        return [o[0] for o in out] if R == 1 else out

    # -- the API ------------------------------------------------------------------------------

    def translate(self, texts, *, batch_size=32, max_batch_tokens=None, src_lang=None,
                  tgt_lang=None, progress=False, **generate_kwargs):
        """Translate a list of strings; returns a list of str in input order.

        Parameters
        ----------
        texts : sequence of str
        batch_size : int, or None with max_batch_tokens
            Lines per generate call (after sorting by length).
        max_batch_tokens : int, optional
            Also cap each batch at this many padded source tokens (rows x longest row).
        src_lang, tgt_lang : str, optional
            Language codes (default: the constructor's). mBART / mBART-50 / NLLB / M2M100:
            ``src_lang`` is the language token of the source (where transformers' tokenizer
            puts it), ``tgt_lang`` becomes ``forced_bos_token_id``. A multilingual Marian
            model: ``tgt_lang`` ("fr" or ">>fr<<") is written before the source text; Marian
            models have no source codes. A code the model does not have, or a code for a model
            without codes (BART, Pegasus, T5), raises ValueError;
            :attr:`source_languages` / :attr:`target_languages` list the valid ones.
        progress : bool
            A progress bar (lines) on stderr.
        **generate_kwargs
            ``Seq2SeqTransformer.generate`` settings: num_beams, max_new_tokens, length_penalty,
            do_sample, seed, n_threads, ... With ``num_return_sequences=N`` > 1 each item of the
            result is a list of N translations, best first.

        The result does not depend on ``batch_size`` / ``max_batch_tokens`` (see the module
        docstring).
        """
        texts = check_texts(texts)
        batch_size, max_batch_tokens = check_batching(batch_size, max_batch_tokens)
        src_lang, tgt_lang = self._languages(src_lang, tgt_lang)
        kw = self._gen_kwargs(generate_kwargs, tgt_lang)
        rows = self._encode(texts, src_lang, tgt_lang)
        if not rows:
            return []
        bar = progress_bar(progress, total=len(rows), desc="translate")
        try:
            return self._run(rows, batch_size, max_batch_tokens, kw, bar)
        finally:
            bar.close()

    def translate_iterable(self, iterable, *, batch_size=32, max_batch_tokens=None,
                           src_lang=None, tgt_lang=None, progress=False, window=None,
                           **generate_kwargs):
        """Translate the strings of any iterable (e.g. a file's lines: trailing newlines are not
        removed here), yielding one str per item, in input order.

        Memory stays bounded whatever the input's length: the items are read ``window`` at a
        time (default 16 batches' worth: ``16 * batch_size``, or 1024 lines when batching by
        tokens alone), each window is sorted by length and batched as :meth:`translate` does,
        and its translations are yielded in order. A background thread reads and tokenizes the
        next window while the current one is translated. Arguments as :meth:`translate`.
        """
        batch_size, max_batch_tokens = check_batching(batch_size, max_batch_tokens)
        src_lang, tgt_lang = self._languages(src_lang, tgt_lang)
        if window is None:
            window = 16 * batch_size if batch_size is not None else 1024
        else:
            window = check_positive_int(window, "window")
        try:
            it = iter(iterable)
        except TypeError:
            raise TypeError(f"iterable must be an iterable of str, got "
                            f"{type(iterable).__name__}") from None
        if isinstance(iterable, str):
            raise TypeError("iterable must be an iterable of str, got one str")
        kw = self._gen_kwargs(generate_kwargs, tgt_lang)
        return self._iterate(it, window, batch_size, max_batch_tokens, src_lang, tgt_lang,
                             progress, kw)

    def _iterate(self, it, window, batch_size, max_batch_tokens, src_lang, tgt_lang, progress,
                 kw):
        q = queue.Queue(maxsize=1)
        stop = threading.Event()

        def put(item):
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def produce():
            base = 0
            try:
                while not stop.is_set():
                    chunk = []
                    for t in it:
                        if not isinstance(t, str):
                            raise TypeError(f"iterable item {base + len(chunk)} must be a str, "
                                            f"got {type(t).__name__}")
                        chunk.append(t)
                        if len(chunk) == window:
                            break
                    if not chunk:
                        break
                    if not put(self._encode(chunk, src_lang, tgt_lang)):
                        return
                    base += len(chunk)
                    if len(chunk) < window:
                        break
                put(_END)
            except BaseException as exc:     # handed to the reader, raised there
                put(exc)

        worker = threading.Thread(target=produce, name="fastattn-translate-reader", daemon=True)
        worker.start()
        bar = progress_bar(progress, total=None, desc="translate")
        try:
            for item in _drain(q):
                yield from self._run(item, batch_size, max_batch_tokens, kw, bar)
        finally:
            stop.set()
            bar.close()
            worker.join(timeout=5)

    def translate_stream(self, text, *, src_lang=None, tgt_lang=None, **generate_kwargs):
        """Translate one string, yielding pieces of the translation as they are generated.

        The pieces join to ``translate([text], ...)[0]`` (same settings). Text is released
        when it is stable: up to the last space while decoding goes on (a word is emitted when
        the next one starts), everything at a newline, after a CJK character, and at the end.
        Streaming follows one hypothesis, so it decodes greedily (or samples) unless told
        otherwise: ``num_beams`` must be 1 (the default here, whatever the checkpoint's
        generation config says). Needs ``generate(..., streamer=)`` (transformers' streamer
        protocol). Closing the iterator early stops the generation.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if self.package is not None:
            raise ValueError("translate_stream: an Argos package translates whole sentences "
                             "by beam search, as argostranslate does; use translate()")
        src_lang, tgt_lang = self._languages(src_lang, tgt_lang)
        kw = self._gen_kwargs(generate_kwargs, tgt_lang)
        if kw.get("num_return_sequences") not in (None, 1):
            raise ValueError("translate_stream follows one hypothesis: num_return_sequences "
                             "must be 1")
        beams = kw.setdefault("num_beams", 1)
        if beams != 1:
            raise ValueError(f"translate_stream decodes one hypothesis: num_beams must be 1, "
                             f"got {beams!r} (use translate() for beam search)")
        ids, mask = pad_batch(self._encode([text], src_lang, tgt_lang), self.model.pad_id)
        return self._stream(ids, mask, kw)

    def _stream(self, ids, mask, kw):
        q = queue.Queue()
        cancel = threading.Event()
        streamer = TextStreamer(self.tokenizer, q.put, cancel)

        def run():
            try:
                self.model.generate(ids, mask, streamer=streamer, **kw)
            except _Cancelled:
                pass
            except BaseException as exc:
                q.put(exc)
            finally:
                q.put(_END)

        worker = threading.Thread(target=run, name="fastattn-translate-stream", daemon=True)
        worker.start()
        try:
            yield from _drain(q)
        finally:
            cancel.set()
            worker.join()


class _ArgosTokenizer(Tokenizer):
    """The tokenizer interface of an Argos package (its languages, the ids it writes); the
    text itself goes through :class:`_ArgosDocument`."""

    family = "argos"
    model_max_length = argos.MAX_INPUT_LENGTH

    def __init__(self, package):
        self.package = package
        self.path = package.path
        self.source_languages = (package.from_code,)
        self.target_languages = (package.to_code,)

    @property
    def max_id(self):
        return len(self.package.src_tokens) - 1

    def encode(self, texts, *, max_length=None, src_lang=None, tgt_lang=None):
        """Each text's sentences' ids, concatenated (the translation cuts them apart)."""
        texts = check_texts(texts)
        return [[i for p in self.package.paragraphs(t) for s in p
                 for i in self.package.source(s, max_length or self.model_max_length)[1]]
                for t in texts]

    def decode(self, ids, skip_special_tokens=True):
        toks = self.package.target_tokens([int(i) for i in ids])
        if skip_special_tokens:
            special = {self.package.config.get(k, d) for k, d in
                       (("bos_token", "<s>"), ("eos_token", "</s>"))} | {"<blank>", "<pad>"}
            toks = [t for t in toks if t not in special]
        return self.package.decode(toks)


class _ArgosSentence:
    """One sentence: its pieces, ids; after decoding, each hypothesis' ids (``outputs``) and
    tokens (unknowns replaced)."""
    __slots__ = ("pieces", "ids", "outputs", "tokens")

    def __init__(self, pieces, ids):
        self.pieces, self.ids, self.outputs, self.tokens = pieces, ids, None, None


class _ArgosDocument:
    """One input string of an Argos package: its paragraphs of sentences, each sentence's
    pieces and ids; ``len()`` is its source tokens (the server counts them)."""

    def __init__(self, package, text, max_length):
        self.package = package
        self.paragraphs = [[_ArgosSentence(*package.source(s, max_length)) for s in p]
                           for p in package.paragraphs(text)]
        self.sentences = [s for p in self.paragraphs for s in p]

    def __len__(self):
        return sum(len(s.ids) for s in self.sentences)

    def text(self, k=0):
        """Hypothesis `k` of the translation: each paragraph's sentences' hypothesis `k` tokens
        decoded together, the paragraphs joined by newlines, leading newlines removed
        (argostranslate's hypotheses)."""
        paras = [self.package.decode([t for s in p for t in s.tokens[k]])
                 for p in self.paragraphs]
        return "\n".join(paras).lstrip("\n")


def _returned(kw):
    """How many hypotheses a row's generation returns (``num_return_sequences``)."""
    R = kw.get("num_return_sequences", 1)
    return 1 if R is None else int(R)


def _drain(q):
    """The items a worker thread puts on `q` until _END; an exception it puts is raised here."""
    while True:
        item = q.get()
        if item is _END:
            return
        if isinstance(item, BaseException):
            raise item
        yield item


def _is_cjk(cp):
    """transformers' TextStreamer test for a CJK ideograph (text after one is stable)."""
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or
            0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or
            0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


class TextStreamer:
    """transformers' streamer protocol over a fastattn tokenizer: ``put(ids)`` with the start
    token(s) first, then each step's new token(s) (int arrays, one row), ``end()`` once.

    Text goes to ``on_text(str)`` as it becomes stable (as transformers' TextStreamer decides:
    at the last space, a newline, a CJK character, or the end); special tokens (the start
    token, the end token) are not text. ``cancel`` (a threading.Event), when set, makes the
    next put raise, which stops the generation.
    """

    def __init__(self, tokenizer, on_text, cancel=None):
        self.tokenizer, self.on_text, self.cancel = tokenizer, on_text, cancel
        self._ids, self._printed = [], 0

    def put(self, value):
        if self.cancel is not None and self.cancel.is_set():
            raise _Cancelled()
        arr = np.asarray(value)
        if arr.ndim > 1:
            if arr.shape[0] != 1:
                raise ValueError(f"the streamer follows one sequence; got ids of shape "
                                 f"{arr.shape}")
            arr = arr[0]
        self._ids.extend(int(i) for i in np.reshape(arr, -1))
        text = self.tokenizer.decode(self._ids, skip_special_tokens=True)
        if text.endswith("\n"):
            piece = text[self._printed:]
            self._ids, self._printed = [], 0
        elif text and _is_cjk(ord(text[-1])):
            piece = text[self._printed:]
            self._printed += len(piece)
        else:
            piece = text[self._printed:text.rfind(" ") + 1]
            self._printed += len(piece)
        if piece:
            self.on_text(piece)

    def end(self):
        if self._ids:
            text = self.tokenizer.decode(self._ids, skip_special_tokens=True)
            piece = text[self._printed:]
        else:
            piece = ""
        self._ids, self._printed = [], 0
        if piece:
            self.on_text(piece)
