"""Continuous batching for greedy decoding: sources join and leave one running batch at step
boundaries, over one KV cache whose rows hold different lengths.

``generate`` decodes a batch whose rows all start together, so a batch runs until its longest
row is done and a source that arrives meanwhile waits for all of it. :class:`ContinuousGreedy`
keeps a running set of rows instead (what a server's scheduler wants, vLLM's and TGI's
"continuous batching"): :meth:`~ContinuousGreedy.add` encodes new sources and gives each a row,
:meth:`~ContinuousGreedy.step` feeds every row one token and returns the rows that finished,
which leave; rows added between two steps join the next one.

Each row gets what ``generate`` gives its source alone, token for token and bit for bit (the
promise fastattn makes for any batch composition, here across time as well). The model keeps
the rows' cache, each row at its own length and positions, behind :class:`RowState` (what
``model.start_rows()`` returns; Seq2SeqTransformer's, in fastattn/models/_seq2seq_rows.py, says
why a row computes there what it computes alone). Here are the settings, each row's tokens and
length limit, and the choice of its next token: its processors see its own history (rows are
grouped by length, so ``min_new_tokens``, ``forced_bos_token_id`` and the like apply per row).
As the search, this module reaches the model only through interfaces and imports nothing from
fastattn.models.

Scope: greedy decoding (``num_beams=1``, no sampling) of a :class:`Seq2SeqTransformer` with
absolute positions (Marian, BART, mBART, M2M100 / NLLB, Pegasus); T5's relative position bias,
beam search and sampling are refused with a ValueError (``generate`` serves them).
"""
import numpy as np

from .._validation import check_token_ids, pad_batch
from .config import resolve_settings
from .processors import apply, build_processors, history

__all__ = ["ContinuousGreedy", "RowState"]

_F32 = np.dtype(np.float32)


class RowState:
    """Decoder rows that join and leave one running batch between steps, each at its own
    length: what continuous batching needs of a model besides the decoder interface
    (:class:`fastattn.generation.Decoder`). ``model.start_rows(n_threads=None)`` returns one,
    empty (Seq2SeqTransformer implements it; a model it cannot serve raises ValueError there).

    Attributes: ``n`` (running rows).

    Methods
    -------
    add(ids, mask) : the sources (B, S), as ``check_sources`` returns them, encoded; B rows
        join after the running ones, nothing fed yet.
    step(tokens) : tokens (n,) int64, each row's next token -> logits (n, vocab) in the model
        dtype; each row is fed at its own next position.
    remove(rows) -> order : these rows (indices) leave; returns the running rows' former
        indices in their new order, int64 (n,) (for the caller's own per-row arrays).
    """

    n: int

    def add(self, ids, mask):  # pragma: no cover - interface
        raise NotImplementedError

    def step(self, tokens):  # pragma: no cover - interface
        raise NotImplementedError

    def remove(self, rows):  # pragma: no cover - interface
        raise NotImplementedError


class ContinuousGreedy:
    """Greedy decoding of a changing set of sources, all with the same settings.

    Parameters
    ----------
    model : Seq2SeqTransformer
        Absolute positions (not T5).
    n_threads : int, optional
    **settings
        ``generate`` settings shared by every source (``max_new_tokens``, ``min_new_tokens``,
        ``forced_bos_token_id``, ``repetition_penalty``, ``no_repeat_ngram_size``,
        ``bad_words_ids``, ``suppress_tokens``, ...; the checkpoint's generation config fills
        the rest, as in ``generate``). They must resolve to greedy decoding.

    ``add(sources, max_new_tokens=None)`` -> handles (``max_new_tokens`` overrides the
    settings' for these rows: rows of different lengths limits share the batch);
    ``step()`` -> [(handle, tokens)] of the rows that finished; ``drop(handles)`` removes rows
    (a client gone); ``check(max_new_tokens)`` raises what ``add`` would for that limit;
    ``n`` rows are running. Each finished row's tokens (start token first, EOS
    last unless ``max_new_tokens`` stopped it) are what ``model.generate(source[None],
    **settings)[0]`` gives (with its max_new_tokens), without its padding.
    """

    def __init__(self, model, *, n_threads=None, **settings):
        start_rows = getattr(model, "start_rows", None)
        if not callable(start_rows):
            raise TypeError(f"ContinuousGreedy decodes a Seq2SeqTransformer (a model with "
                            f"start_rows), got {type(model).__name__}")
        rows = start_rows(n_threads=n_threads)          # T5: a ValueError
        for key in ("num_return_sequences", "decoder_input_ids", "streamer", "return_scores",
                    "seed"):
            if settings.get(key) not in (None, 1, False) or (key == "num_return_sequences" and
                                                             settings.get(key, 1) != 1):
                raise ValueError(f"continuous batching does not take {key}")
        self.model, self.n_threads = model, n_threads
        self._settings = dict(settings)
        self._kinds, self._kind_of = [], {}     # (settings, processors) per max_new_tokens
        self.p = self._resolve(None)[0]
        self.max_len = model.max_decoder_positions       # the widest a row can grow
        self._rows = rows
        self._next_handle = 0
        self._alloc(0)

    @property
    def n(self):
        """Running rows: indices [0, n) of every per-row array, the model's rows' too."""
        return self._rows.n

    def check(self, max_new_tokens=None):
        """A ValueError / TypeError when rows with this max_new_tokens (None: the settings')
        cannot join, before any is added."""
        self._resolve(max_new_tokens)

    def _resolve(self, max_new_tokens):
        """(settings, processors, kind index) of rows with this max_new_tokens (None: the
        constructor's); a ValueError when they are not greedy."""
        k = self._kind_of.get(max_new_tokens)
        if k is not None:
            return self._kinds[k] + (k,)
        user = dict(self._settings)
        if max_new_tokens is not None:
            user["max_new_tokens"] = max_new_tokens
        p = resolve_settings(self.model, user, 1)
        if p["num_beams"] != 1 or p["do_sample"]:
            raise ValueError("continuous batching decodes greedily: num_beams must be 1 and "
                             "do_sample False (generate serves beam search and sampling)")
        if p["encoder_no_repeat_ngram_size"]:
            raise ValueError("continuous batching does not take encoder_no_repeat_ngram_size")
        procs = build_processors(p, self.model.vocab_size, p["eos_token_id"], 1, None)
        self._kinds.append((p, procs))
        self._kind_of[max_new_tokens] = len(self._kinds) - 1
        return p, procs, len(self._kinds) - 1

    # -- per-row arrays ------------------------------------------------------------------------

    _PER_ROW = ("seqs", "limit", "kind", "cur", "handles")

    def _alloc(self, R):
        self.seqs = np.full((R, self.max_len), self.p["pad_token_id"], np.int64)
        self.limit = np.zeros(R, np.int64)      # the row's max_length
        self.kind = np.zeros(R, np.int64)       # its settings (self._kinds)
        self.cur = np.zeros(R, np.int64)        # tokens in the row's sequence
        self.handles = np.zeros(R, np.int64)

    def _grow(self, rows):
        """Room for `rows` rows (at least double)."""
        R0 = self.cur.shape[0]
        if rows <= R0:
            return
        n, old = self.n, [getattr(self, a) for a in self._PER_ROW]
        self._alloc(max(rows, 2 * R0, 4))
        for name, a in zip(self._PER_ROW, old):
            getattr(self, name)[:n] = a[:n]

    # -- rows ------------------------------------------------------------------------------------

    def add(self, sources, max_new_tokens=None):
        """Encode `sources` (a list of 1-D token id sequences, no padding) and give each a row,
        decoded from the next step on (at most `max_new_tokens` tokens, default the
        settings'). Returns their handles (ints). A source the model cannot take (too long,
        an id out of the vocabulary) or a bad max_new_tokens is a ValueError naming it, and
        nothing is added."""
        if not sources:
            return []
        p, _, kind = self._resolve(max_new_tokens)
        rows = []
        for i, s in enumerate(sources):
            a = np.asarray(s)
            if a.size == 0:
                raise ValueError(f"sources[{i}] is empty")
            a = check_token_ids(a.reshape(1, -1), f"sources[{i}]", self.model.vocab_size)
            rows.append(a[0].tolist())
        ids, mask = pad_batch(rows, self.model.pad_id)
        ids, mask = self.model.check_sources(ids, mask)
        B, n = len(rows), self.n
        self._grow(n + B)
        self._rows.add(ids, mask)
        self.seqs[n:n + B] = self.p["pad_token_id"]
        self.seqs[n:n + B, 0] = self.p["decoder_start_token_id"]
        self.cur[n:n + B] = 1
        self.limit[n:n + B] = p["max_length"]
        self.kind[n:n + B] = kind
        handles = list(range(self._next_handle, self._next_handle + B))
        self._next_handle += B
        self.handles[n:n + B] = handles
        return handles

    def drop(self, handles):
        """Remove the rows of these handles (unknown ones are ignored)."""
        gone = np.isin(self.handles[:self.n], np.asarray(list(handles), np.int64))
        self._remove(np.flatnonzero(gone))

    def _remove(self, idx):
        """Remove rows idx; the model's rows say where the others now sit."""
        order = self._rows.remove(idx)
        moved = np.flatnonzero(order != np.arange(order.size))
        for name in self._PER_ROW:
            a = getattr(self, name)
            a[moved] = a[order[moved]]

    # -- a step -----------------------------------------------------------------------------------

    def step(self):
        """Feed every running row one token; returns [(handle, tokens int64 (m,))] of the rows
        that finished (EOS, or the length limit), which leave the batch."""
        n = self.n
        if n == 0:
            return []
        r = np.arange(n)
        cur = self.cur[:n]
        logits = self._rows.step(self.seqs[r, cur - 1])         # each row's last token
        scores = logits if logits.dtype == _F32 else logits.astype(_F32)
        nxt = np.empty(n, np.int64)
        # the processors per group of rows with the same length and settings: each sees what
        # it sees for a row alone (min_new_tokens, forced BOS / EOS read the length)
        group = cur * len(self._kinds) + self.kind[:n]
        if not any(procs for _, procs in self._kinds):
            group = group[:0]                        # no processors: one argmax for all
            nxt[:] = np.argmax(scores, axis=1)
        for gv in np.unique(group):
            g = np.flatnonzero(group == gv)
            c, procs = int(cur[g[0]]), self._kinds[int(self.kind[g[0]])][1]
            sc = apply(procs, history(self.seqs, g, c, procs), scores[g],
                       np.zeros(len(g), np.int64))
            nxt[g] = np.argmax(sc, axis=1)
        self.seqs[r, cur] = nxt
        self.cur[:n] += 1
        done = (nxt == self.p["eos_token_id"]) | (self.cur[:n] >= self.limit[:n])
        out = [(int(self.handles[i]), self.seqs[i, :self.cur[i]].copy())
               for i in np.flatnonzero(done)]
        if out:
            self._remove(np.flatnonzero(done))
        return out
