"""CTranslate2's Python API over fastattn: ``Translator``, ``Encoder`` and ``models.Whisper``.

    from fastattn.compat import ctranslate2          # the only change (was: import ctranslate2)
    translator = ctranslate2.Translator("opus-mt-en-de-ct2", device="cpu", compute_type="int8")
    results = translator.translate_batch([["▁Hello", "▁world", "</s>"]], beam_size=2)
    print(results[0].hypotheses[0], results[0].scores)

The folders are CTranslate2's own (``model.bin``, ``config.json``, the vocabulary files), read
by :class:`fastattn.Seq2SeqTransformer`, :class:`fastattn.EncoderModel` and
:class:`fastattn.WhisperModel`; inputs and outputs are tokens of the folder's vocabulary, as
there (a token not in it is the unknown token). Semantics are CTranslate2 4.x's:

- ``translate_batch``: greedy search (``beam_size=1``) and beam search give CTranslate2's
  tokens: beam search runs CTranslate2's rule (``beam_rule="ctranslate2"``,
  :mod:`fastattn.generation.beam_ct2`: the processors on the logits, a source done when
  ``beam_size`` hypotheses have finished, CTranslate2's ranking and scores); a hypothesis may
  still differ where two beams are within float rounding of each other.
  ``target_prefix`` (ragged: rows are decoded in groups of one prefix length, which changes
  nothing, results being batch-independent), ``max_decoding_length`` / ``min_decoding_length``
  counting the prefix, ``num_hypotheses``, ``length_penalty``, ``repetition_penalty``,
  ``no_repeat_ngram_size``, ``disable_unk``, ``suppress_sequences``, ``end_token`` (the model's
  EOS only), ``return_end_token``, ``max_input_length`` (the EOS kept, as CTranslate2 truncates),
  ``max_batch_size`` / ``batch_type``, random sampling (``sampling_topk`` > 1, ``sampling_topp``,
  ``sampling_temperature``; fastattn's random streams, not CTranslate2's), ``asynchronous``
  (computed at once: ``result()`` returns it).
- ``scores`` (``return_scores=True``): CTranslate2's, the hypothesis' log-probabilities
  (log-softmax of the processed logits) of the generated tokens, EOS included, summed and
  divided by ``length ** length_penalty``, the length counting the target prefix (whose tokens
  are not scored) and EOS, beam search's and greedy search's alike.
- ``return_attention`` / ``replace_unknowns``: the spec's alignment head (``alignment_layer``,
  ``alignment_heads``: OpenNMT's last layer's first head by default) over each hypothesis in a
  teacher-forced pass (:meth:`fastattn.Seq2SeqTransformer.cross_attention`), one vector per
  hypothesis token over the source tokens (implicit BOS / EOS left out); an unknown token
  becomes the source token weighed most. It is each row's own: CTranslate2's attention of a row
  padded in a batch is not (its hypotheses are), so there the two may pick other tokens.
- ``score_batch``: teacher forcing (:meth:`fastattn.Seq2SeqTransformer.score`), CTranslate2's
  tokens (the target, then EOS) and ``offset``.
- ``Encoder.forward_batch``: ``last_hidden_state`` as a NumPy float32 array (CTranslate2 returns
  a StorageView; ``np.asarray`` reads both), ``pooler_output`` tanh(W h[CLS] + b) from the
  folder's pooler weights, None when it has none.
- ``compute_type``: int8 variants -> fastattn's int8 (an int8 folder keeps its integers);
  ``bfloat16`` -> bfloat16; ``default`` / ``auto`` -> the folder's storage (int8 stays int8,
  float16 / bfloat16 / float32 compute in float32); ``float32`` on a float folder -> float32,
  on an int8 folder a ValueError (fastattn does not dequantize); ``float16`` -> float32 (CPUs
  have no float16 arithmetic; the float16 weights are widened exactly). ``intra_threads`` is
  ``n_threads`` (0: fastattn's default); ``inter_threads`` and ``max_queued_batches`` are
  accepted (results do not depend on them).

Refused, each by a ValueError naming it: devices other than the CPU, ``files=``,
``flash_attention`` / ``tensor_parallel``, ``int16``; ``patience`` != 1, ``coverage_penalty``,
``prefix_bias_beta``, ``use_vmap``, ``return_logits_vocab``,
``return_alternatives``, ``min_alternative_expansion_prob``, ``callback``, an ``end_token`` other than the model's EOS, sampling with ``beam_size`` > 1.
Decoding stops at the model's last position (CTranslate2 raises there). Whisper:
:mod:`fastattn.compat._ct2_models`.
"""
import os

import numpy as np

from ..io.ctranslate2 import ModelBin, read_vocabulary
from ..models import EncoderModel, Seq2SeqTransformer, _ct2
from ._ct2_common import (AsyncResult, LoadedModel, Vocabulary, _Result, batches, check_options,
                          read_config, truncate)
from . import _ct2_models as models

__all__ = ["Translator", "Encoder", "TranslationResult", "ScoringResult",
           "EncoderForwardOutput", "models", "contains_model", "__version__"]

__version__ = "4.8.5"          # the CTranslate2 API these adapters follow (its signatures)


def contains_model(path):
    """Whether `path` holds a CTranslate2 model: a model.bin file (CTranslate2 checks no more;
    loading it checks the rest)."""
    return os.path.isfile(os.path.join(os.fspath(path), "model.bin"))


class TranslationResult(_Result):
    """``hypotheses`` (token lists, best first), ``scores`` (floats; [] without
    return_scores), ``attention`` (with return_attention / replace_unknowns... see the module)
    and ``logits`` ([]: not returned by fastattn). The previous result format reads too:
    ``len(result)`` hypotheses, ``result[i]`` a dict of its ``tokens`` (and ``score``,
    ``attention`` where returned)."""
    _fields = ("hypotheses", "scores", "attention", "logits")

    def __len__(self):
        return len(self.hypotheses)

    def __getitem__(self, key):
        if not isinstance(key, int):
            return super().__getitem__(key)
        out = {"tokens": self.hypotheses[key]}
        if self.scores:
            out["score"] = self.scores[key]
        if self.attention:
            out["attention"] = self.attention[key]
        return out


class ScoringResult(_Result):
    """``tokens`` (the target, then EOS) and ``log_probs`` (one per token)."""
    _fields = ("tokens", "log_probs")


class EncoderForwardOutput(_Result):
    """``last_hidden_state`` (B, S, d) and ``pooler_output`` (B, d) or None: NumPy arrays."""
    _fields = ("last_hidden_state", "pooler_output")


# translate_batch's options fastattn does not honour: (default, why)
_REFUSED = {
    "patience": (1, "beam search stops when beam_size hypotheses have finished"),
    "coverage_penalty": (0, "needs the attention weights"),
    "prefix_bias_beta": (0, "biased decoding is not implemented"),
    "use_vmap": (False, "vocabulary maps are not read"),
    "return_logits_vocab": (False, "the logits are not kept"),
    "return_alternatives": (False, "alternatives are not implemented"),
    "min_alternative_expansion_prob": (0, "alternatives are not implemented"),
    "callback": (None, "decoding is not streamed per step"),
}


class Translator(LoadedModel):
    """A CTranslate2 translation folder (TransformerSpec: Marian / OPUS-MT, BART, M2M100 /
    NLLB ...) over :class:`fastattn.Seq2SeqTransformer`."""

    _loads = Seq2SeqTransformer

    def _setup(self):
        path = self.model_path
        self.num_translators = self._inter_threads
        cfg = read_config(path)
        unk = cfg.get("unk_token", "<unk>")
        if read_vocabulary(path, "shared_vocabulary") is not None:
            self._src = self._tgt = Vocabulary(path, "shared_vocabulary", unk)
        else:
            self._src = Vocabulary(path, "source_vocabulary", unk)
            self._tgt = Vocabulary(path, "target_vocabulary", unk)
        self._cfg = cfg
        self._eos = self.model.eos_id
        self._start = self.model.decoder_start_id
        self._src_eos = self._src.index.get(cfg.get("eos_token", "</s>"))
        self._src_bos = self._src.index.get(cfg.get("bos_token", "<s>"))

    # -- inputs --------------------------------------------------------------------------------

    def _sources(self, source, max_input_length):
        if not isinstance(source, (list, tuple)):
            raise TypeError(f"source must be a list of token lists, got {type(source).__name__}")
        out = []
        for row in source:
            ids = self._src.ids(row, "source")
            if self._cfg.get("add_source_bos"):
                ids = [self._src_bos] + ids
            if self._cfg.get("add_source_eos"):
                ids = ids + [self._src_eos]
            out.append(truncate(ids, max_input_length, self._src_eos))
        return out

    def _check_end_token(self, end_token):
        if end_token is None:
            return
        ends = [end_token] if isinstance(end_token, (str, int)) else list(end_token)
        ids = {self._tgt.index.get(t) if isinstance(t, str) else t for t in ends}
        if ids != {self._eos}:
            raise ValueError(f"end_token={end_token!r} is not supported: decoding ends on the "
                             f"model's EOS only ({self._tgt.tokens[self._eos]!r})")

    # -- translation ---------------------------------------------------------------------------

    def translate_batch(self, source, target_prefix=None, *, max_batch_size=0,
                        batch_type="examples", asynchronous=False, beam_size=2, patience=1,
                        num_hypotheses=1, length_penalty=1, coverage_penalty=0,
                        repetition_penalty=1, no_repeat_ngram_size=0, disable_unk=False,
                        suppress_sequences=None, end_token=None, return_end_token=False,
                        prefix_bias_beta=0, max_input_length=1024, max_decoding_length=256,
                        min_decoding_length=1, use_vmap=False, return_scores=False,
                        return_logits_vocab=False, return_attention=False,
                        return_alternatives=False, min_alternative_expansion_prob=0,
                        sampling_topk=1, sampling_topp=1, sampling_temperature=1,
                        replace_unknowns=False, callback=None):
        """Translate a batch of token lists -> [TranslationResult] (CTranslate2's
        ``Translator.translate_batch``; what is honoured and refused: the module's
        docstring)."""
        if asynchronous:
            # CTranslate2 raises a bad option from result(), not from the call
            options = {k: v for k, v in locals().items() if k not in ("self", "source")}
            options["asynchronous"] = False
            try:
                out = self.translate_batch(source, **options)
            except ValueError as exc:
                return [AsyncResult(None, exc) for _ in source]
            return [AsyncResult(r) for r in out]
        check_options("translate_batch", locals(), _REFUSED)
        self._check_end_token(end_token)
        for name, v, low in (("beam_size", beam_size, 1), ("num_hypotheses", num_hypotheses, 1),
                             ("max_decoding_length", max_decoding_length, 1),
                             ("min_decoding_length", min_decoding_length, 0),
                             ("no_repeat_ngram_size", no_repeat_ngram_size, 0),
                             ("max_input_length", max_input_length, 0),
                             ("sampling_topk", sampling_topk, 0)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
        if min_decoding_length > max_decoding_length:
            raise ValueError(f"min_decoding_length={min_decoding_length} is greater than "
                             f"max_decoding_length={max_decoding_length}")
        sampled = sampling_topk != 1 and sampling_temperature != 0
        if sampled and beam_size > 1:
            raise ValueError(f"sampling_topk={sampling_topk} with beam_size={beam_size}: random "
                             "beam search is not supported (use beam_size=1)")
        if not 0 < sampling_topp <= 1:
            raise ValueError(f"sampling_topp must be in (0, 1], got {sampling_topp!r}")
        if num_hypotheses > 1 and beam_size > 1 and num_hypotheses > beam_size:
            raise ValueError(f"num_hypotheses={num_hypotheses} must be <= beam_size={beam_size}")
        if num_hypotheses > 1 and beam_size == 1 and not sampled:
            raise ValueError(f"num_hypotheses={num_hypotheses}: greedy search returns one "
                             "hypothesis (use beam_size >= num_hypotheses or sampling)")
        src = self._sources(source, max_input_length)
        if target_prefix is None:
            prefixes = [[] for _ in src]
        else:
            if len(target_prefix) != len(src):
                raise ValueError(f"target_prefix has {len(target_prefix)} rows, source "
                                 f"{len(src)}")
            prefixes = [[] if p is None else self._tgt.ids(p, "target_prefix")
                        for p in target_prefix]
        kw = dict(num_beams=int(beam_size), num_return_sequences=int(num_hypotheses),
                  length_penalty=float(length_penalty),
                  repetition_penalty=float(repetition_penalty),
                  no_repeat_ngram_size=int(no_repeat_ngram_size), n_threads=self._threads)
        if beam_size > 1:
            kw["beam_rule"] = "ctranslate2"
        if disable_unk and self._tgt.unk is not None:
            kw["suppress_tokens"] = [self._tgt.unk]
        if suppress_sequences:
            kw["bad_words_ids"] = [self._tgt.ids(s, "suppress_sequences")
                                   for s in suppress_sequences]
        if sampled:
            kw.update(do_sample=True, top_k=int(sampling_topk), top_p=float(sampling_topp),
                      temperature=float(sampling_temperature))
        opts = dict(max_len=int(max_decoding_length), min_len=int(min_decoding_length),
                    scores=bool(return_scores), end=bool(return_end_token),
                    lp=float(length_penalty), attention=bool(return_attention),
                    replace=bool(replace_unknowns), source=source)
        out = [None] * len(src)
        lengths = [len(s) for s in src]
        for chunk in batches(len(src), lengths, max_batch_size, batch_type):
            groups = {}
            for i in chunk:
                groups.setdefault(len(prefixes[i]), []).append(i)
            for rows in groups.values():
                for i, r in zip(rows, self._decode([src[i] for i in rows],
                                                   [prefixes[i] for i in rows], kw, opts)):
                    if opts["attention"] or opts["replace"]:
                        self._attend(r, src[i], list(opts["source"][i]), opts)
                    out[i] = r
        return out

    def _decode(self, src, prefixes, kw, o):
        """Rows with prefixes of one length -> [TranslationResult]."""
        results = [None] * len(src)
        live = [i for i, s in enumerate(src) if s]
        for i, s in enumerate(src):          # an empty source: CTranslate2's empty result
            if not s:
                results[i] = TranslationResult(hypotheses=[[]] * kw["num_return_sequences"],
                                               scores=[0.0] * o["scores"] *
                                               kw["num_return_sequences"],
                                               attention=[], logits=[])
        if not live:
            return results
        m = self.model
        L = len(prefixes[0])
        S = max(len(src[i]) for i in live)
        ids = np.full((len(live), S), m.pad_id, np.int64)
        mask = np.zeros((len(live), S), bool)
        for r, i in enumerate(live):
            ids[r, :len(src[i])] = src[i]
            mask[r, :len(src[i])] = True
        room = m.max_decoder_positions - 1 - L
        new = max(min(o["max_len"] - L, room), 0)
        dec = np.array([[self._start] + prefixes[i] for i in live], np.int64)
        got = m.generate(ids, mask, decoder_input_ids=dec, max_new_tokens=new,
                         min_new_tokens=min(max(o["min_len"] - L, 0), new),
                         return_scores=o["scores"], **kw)
        seqs, sc = got if o["scores"] else (got, None)
        R = kw["num_return_sequences"]
        beam = kw["num_beams"] > 1
        for r, i in enumerate(live):
            hyps, scores = [], []
            for k in range(R):
                row = seqs[r * R + k].tolist()[1:]
                gen = row[L:]
                ended = self._eos in gen
                gen = gen[:gen.index(self._eos) + 1] if ended else gen
                while gen and gen[-1] == m.pad_id and not ended:
                    gen.pop()
                toks = row[:L] + gen
                if o["scores"]:
                    total = float(sc[r * R + k])
                    if not beam:   # CTranslate2's rule gives its score; greedy: the sum
                        total /= max(len(toks), 1) ** o["lp"]
                    scores.append(total)
                if ended and not o["end"]:
                    toks = toks[:-1]
                hyps.append(self._tgt.to_tokens(toks))
            if o["scores"] and R > 1:      # CTranslate2 sorts by the final score
                order = sorted(range(R), key=lambda k: -scores[k])
                hyps, scores = [hyps[k] for k in order], [scores[k] for k in order]
            results[i] = TranslationResult(hypotheses=hyps, scores=scores, attention=[],
                                           logits=[])
        return results

    def _attend(self, result, src, original, o):
        """CTranslate2's return_attention / replace_unknowns on one row's result (in place)."""
        if not src:
            return
        bos, eos = bool(self._cfg.get("add_source_bos")), bool(self._cfg.get("add_source_eos"))
        unk = self._tgt.tokens[self._tgt.unk] if self._tgt.unk is not None else None
        if not hasattr(self, "_align"):
            c = self.model.config
            self._align = _ct2.alignment(self.model_path, c["decoder_layers"],
                                         c["decoder_attention_heads"])
        layer, heads = self._align
        att_all = []
        for k, toks in enumerate(result.hypotheses):
            # row t of a teacher-forced pass over the start token and the hypothesis is the
            # attention that predicted token t
            dec = [self._start] + (self._tgt.ids(toks, "hypothesis") if toks else [])
            att = self.model.cross_attention(np.array([src], np.int64),
                                             np.array([dec], np.int64), layer=layer,
                                             heads=heads, n_threads=self._threads)[0]
            vectors = _ct2.source_attention(att[:len(toks), :len(src)], len(original), bos,
                                            eos)
            if o["replace"] and unk is not None:
                result.hypotheses[k] = toks = _ct2.replace_unknowns(toks, original, vectors,
                                                                    unk)
            att_all.append([v.tolist() for v in vectors])
        if o["attention"]:
            result.attention = att_all

    def translate_iterable(self, source, target_prefix=None, max_batch_size=32,
                           batch_type="examples", **kwargs):
        """Translate an iterable of token lists, yielding TranslationResults in order, read
        `max_batch_size` examples (or tokens) at a time."""
        if kwargs.get("asynchronous"):
            raise ValueError("asynchronous=True: translate_iterable is synchronous")
        it = iter(source)
        pit = iter(target_prefix) if target_prefix is not None else None
        while True:
            chunk, prefix, tokens = [], [], 0
            for row in it:
                row = list(row)
                chunk.append(row)
                if pit is not None:
                    try:
                        prefix.append(next(pit))
                    except StopIteration:
                        raise ValueError("target_prefix does not have the same length as "
                                         "source") from None
                tokens = max(tokens, len(row))
                size = len(chunk) * (tokens if batch_type == "tokens" else 1)
                if size >= max(max_batch_size, 1):
                    break
            if not chunk:
                return
            yield from self.translate_batch(chunk, prefix if pit is not None else None,
                                            batch_type=batch_type, **kwargs)

    def score_batch(self, source, target, *, max_batch_size=0, batch_type="examples",
                    max_input_length=1024, offset=0, asynchronous=False):
        """Log-probabilities of `target` given `source` under teacher forcing ->
        [ScoringResult] (tokens: the target then EOS; the first `offset` tokens not scored
        and not returned)."""
        if len(target) != len(source):
            raise ValueError(f"target has {len(target)} rows, source {len(source)}")
        if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or offset < 0:
            raise ValueError(f"offset must be an integer >= 0, got {offset!r}")
        src = self._sources(source, max_input_length)
        tgt = []
        for row in target:
            ids = [self._start] + self._tgt.ids(row, "target") + [self._eos]
            tgt.append(truncate(ids, max_input_length + 1 if max_input_length else 0,
                                self._eos))
        out = [None] * len(src)
        for chunk in batches(len(src), [len(s) for s in src], max_batch_size, batch_type):
            for i in chunk:
                if not src[i]:
                    toks = tgt[i][1 + offset:]
                    out[i] = ScoringResult(tokens=self._tgt.to_tokens(toks),
                                           log_probs=[0.0] * len(toks))
            live = [i for i in chunk if src[i]]
            if not live:
                continue
            S, T = max(len(src[i]) for i in live), max(len(tgt[i]) for i in live)
            m = self.model
            ids = np.full((len(live), S), m.pad_id, np.int64)
            mask = np.zeros((len(live), S), bool)
            labels = np.full((len(live), T - 1), -100, np.int64)
            for r, i in enumerate(live):
                ids[r, :len(src[i])], mask[r, :len(src[i])] = src[i], True
                labels[r, :len(tgt[i]) - 1] = tgt[i][1:]
            lp = m.score(ids, labels, mask, n_threads=self._threads)
            for r, i in enumerate(live):
                n = len(tgt[i]) - 1
                out[i] = ScoringResult(tokens=self._tgt.to_tokens(tgt[i][1 + offset:]),
                                       log_probs=[float(v) for v in lp[r, offset:n]])
        return [AsyncResult(r) for r in out] if asynchronous else out


class Encoder(LoadedModel):
    """A CTranslate2 encoder folder (TransformerEncoderSpec: BERT, MiniLM ...) over
    :class:`fastattn.EncoderModel`."""

    _loads = EncoderModel

    def _setup(self):
        path = self.model_path
        cfg = read_config(path)
        self._vocab = Vocabulary(path, "vocabulary", cfg.get("unk_token", "<unk>"))
        self._pooler = _pooler(path)

    def forward_batch(self, inputs, lengths=None, token_type_ids=None):
        """Encode a batch: token strings, token ids, or an int array (B, S) with `lengths`
        (B,) -> EncoderForwardOutput (NumPy float32 arrays; positions past a row's length
        are those of padding, as CTranslate2's)."""
        arr = None
        if isinstance(inputs, np.ndarray) or hasattr(inputs, "__array_interface__") or \
                type(inputs).__module__.startswith("torch"):
            if lengths is None:
                raise ValueError("lengths is required when inputs is an array")
            arr = np.asarray(inputs)
            if arr.ndim != 2 or arr.dtype.kind not in "iu":
                raise ValueError(f"inputs must be an int array (batch, length), got "
                                 f"{arr.dtype} {arr.shape}")
            n = np.asarray(lengths).reshape(-1)
            if n.shape[0] != arr.shape[0] or (n > arr.shape[1]).any() or (n < 0).any():
                raise ValueError(f"lengths {n.tolist()} do not fit inputs {arr.shape}")
            rows = [arr[b, :int(n[b])].tolist() for b in range(arr.shape[0])]
        else:
            if lengths is not None:
                raise ValueError("lengths is only for an array of inputs")
            rows = [self._vocab.ids(r, "inputs") for r in inputs]
        B = len(rows)
        S = max((len(r) for r in rows), default=0)
        if B == 0 or S == 0:
            raise ValueError("inputs must hold at least one non-empty sequence")
        ids = np.zeros((B, S), np.int64)
        mask = np.zeros((B, S), bool)
        for b, r in enumerate(rows):
            ids[b, :len(r)], mask[b, :len(r)] = r, True
        types = None
        if token_type_ids is not None:
            types = np.zeros((B, S), np.int64)
            if len(token_type_ids) != B:
                raise ValueError(f"token_type_ids has {len(token_type_ids)} rows, inputs {B}")
            for b, r in enumerate(token_type_ids):
                if len(r) != len(rows[b]):
                    raise ValueError(f"token_type_ids row {b} has {len(r)} ids, inputs "
                                     f"{len(rows[b])}")
                types[b, :len(r)] = r
        h = np.asarray(self.model(ids, mask, types), np.float32)
        pooled = None
        if self._pooler is not None:
            w, bias = self._pooler
            pooled = np.tanh(h[:, 0].astype(np.float64) @ w.T + bias).astype(np.float32)
        return EncoderForwardOutput(last_hidden_state=h, pooler_output=pooled)


def _pooler(path):
    """The folder's BERT pooler (W (d, d), b (d,)) in float64 (an int8 W as w_q / scale),
    or None."""
    b = ModelBin(os.path.join(path, "model.bin"))
    w, bias = "pooler_dense/weight", "pooler_dense/bias"
    if w not in b:
        return None
    ck = b.checkpoint()
    weight = ck.read(w).astype(np.float64)
    scale = b.scale_of(w)
    if b.kind(w) == "int8" and scale is not None:
        weight /= ck.read(scale).astype(np.float64).reshape(-1, 1)
    return weight, ck.read(bias).astype(np.float64)
