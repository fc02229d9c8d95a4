"""Continuous batching for greedy decoding: sources join and leave one running batch at step
boundaries, over one KV cache whose rows hold different lengths.

``generate`` decodes a batch whose rows all start together, so a batch runs until its longest
row is done and a source that arrives meanwhile waits for all of it. :class:`ContinuousGreedy`
keeps a running set of rows instead (what a server's scheduler wants, vLLM's and TGI's
"continuous batching"): :meth:`~ContinuousGreedy.add` encodes new sources and gives each a row,
:meth:`~ContinuousGreedy.step` feeds every row one token and returns the rows that finished,
which leave; rows added between two steps join the next one.

Each row gets what ``generate`` gives its source alone, token for token and bit for bit (the
promise fastattn makes for any batch composition, here across time as well):

- a row's self-attention keys and values sit at positions 0 .. n - 1 of its own cache row, and
  a step attends over the batch's longest row with the positions past each row's own length
  masked: right padding, which the attention kernel computes exactly as the row alone (the
  masked keys add exact zeros, the tile boundaries stay where they are);
- its cross-attention keys and values are its source's, padded on the right to the batch's
  longest source and masked the same way;
- its positions are its own (the embedding takes one position per row), its processors see its
  own history (rows are grouped by length, so ``min_new_tokens``, ``forced_bos_token_id`` and the
  like apply per row), and every GEMM and norm computes a row on its own.

Scope: greedy decoding (``num_beams=1``, no sampling) of a :class:`Seq2SeqTransformer` with
absolute positions (Marian, BART, mBART, M2M100 / NLLB, Pegasus); T5's relative position bias,
beam search and sampling are refused with a ValueError (``generate`` serves them).
"""
import numpy as np

from .._threads import _effective_n_threads
from .._validation import check_token_ids
from .config import resolve_settings
from .processors import apply, build_processors, history

__all__ = ["ContinuousGreedy"]

_F32 = np.dtype(np.float32)


class _RowView:
    """Layer i's part of the batch, what a decoder layer reads from a cache during a step."""

    __slots__ = ("_b", "_i")

    def __init__(self, batch, i):
        self._b, self._i = batch, i

    def append(self, k_new, v_new):
        """k_new, v_new (n, 1, H, Dh): each row's key / value at its own next position ->
        every row's keys and values so far, (n, H, L, Dh) with L the longest row's length."""
        b, i = self._b, self._i
        n = b.n
        r, t = b._rows[:n], b.lens[:n]
        K, V = b.self_k[i], b.self_v[i]
        K[r, :, t] = k_new[:, 0]
        V[r, :, t] = v_new[:, 0]
        return K[:n, :, :b._L], V[:n, :, :b._L]

    @property
    def cross(self):
        b = self._b
        return b.cross_k[self._i][:b.n, :, :b.S], b.cross_v[self._i][:b.n, :, :b.S]

    @property
    def memory_mask(self):
        b = self._b
        return b.mmask[:b.n, :, :, :b.S]

    @property
    def n_src(self):
        return self._b.n


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
    (a client gone); ``n`` rows are running. Each finished row's tokens (start token first, EOS
    last unless ``max_new_tokens`` stopped it) are what ``model.generate(source[None],
    **settings)[0]`` gives (with its max_new_tokens), without its padding.
    """

    def __init__(self, model, *, n_threads=None, **settings):
        from ..models.seq2seq import Seq2SeqTransformer
        if not isinstance(model, Seq2SeqTransformer):
            raise TypeError(f"ContinuousGreedy decodes a Seq2SeqTransformer, got "
                            f"{type(model).__name__}")
        if model.decoder.position_bias is not None:
            raise ValueError("continuous batching needs absolute positions; this model (T5) "
                             "has a relative position bias: use generate")
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
        c = model._config
        self._fairseq = c["positions"] == "fairseq"
        self._offset = c.get("position_offset", 0)
        self._pad = c["pad_token_id"]
        layer = model.decoder.layers[0].self_attn
        self._H, self._Dh = c["decoder_attention_heads"], layer.head_dim
        self._n_layers = c["decoder_layers"]
        self._dt = model._dtype
        self.n = 0                       # running rows: indices [0, n) of every buffer
        self.S = 0                       # the longest running source
        self._L = 0                      # the longest row's length during a step
        self._next_handle = 0
        self.self_mask = None            # the self-attention's key mask during a step
        self._alloc(0, 0, 0)

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

    # -- buffers -------------------------------------------------------------------------------

    def _alloc(self, R, L, S):
        H, Dh, dt, nl = self._H, self._Dh, self._dt, self._n_layers
        self.self_k = [np.zeros((R, H, L, Dh), dt) for _ in range(nl)]
        self.self_v = [np.zeros((R, H, L, Dh), dt) for _ in range(nl)]
        self.cross_k = [np.zeros((R, H, S, Dh), dt) for _ in range(nl)]
        self.cross_v = [np.zeros((R, H, S, Dh), dt) for _ in range(nl)]
        self.mmask = np.zeros((R, 1, 1, S), bool)
        self.seqs = np.full((R, self.max_len), self.p["pad_token_id"], np.int64)
        self.limit = np.zeros(R, np.int64)      # the row's max_length
        self.kind = np.zeros(R, np.int64)       # its settings (self._kinds)
        self.lens = np.zeros(R, np.int64)       # positions fed (the cache length of each row)
        self.cur = np.zeros(R, np.int64)        # tokens in the row's sequence
        self.handles = np.zeros(R, np.int64)
        self._rows = np.arange(R)

    def _grow(self, rows, S, L):
        """Room for `rows` rows, sources of S positions and rows of L positions: each dimension
        that is short doubles (at least), and only the buffers it indexes are copied."""
        R0, L0, S0 = self.mmask.shape[0], self.self_k[0].shape[2], self.mmask.shape[3]
        if rows <= R0 and S <= S0 and L <= L0:
            return
        R1 = R0 if rows <= R0 else max(rows, 2 * R0, 4)
        L1 = L0 if L <= L0 else min(self.max_len, max(L, 2 * L0, 16))
        S1 = S0 if S <= S0 else min(self.max_len, max(S, 2 * S0, 16))   # (sources: as many)
        n = self.n

        def resized(a, shape):
            b = np.zeros(shape, a.dtype)
            if a.ndim == 1:
                b[:n] = a[:n]
            elif a.ndim == 2:
                b[:n, :a.shape[1]] = a[:n]
            else:
                b[:n, :, :a.shape[2]] = a[:n]
            return b

        H, Dh = self._H, self._Dh
        if R1 != R0 or L1 != L0:
            self.self_k = [resized(a, (R1, H, L1, Dh)) for a in self.self_k]
            self.self_v = [resized(a, (R1, H, L1, Dh)) for a in self.self_v]
        if R1 != R0 or S1 != S0:
            self.cross_k = [resized(a, (R1, H, S1, Dh)) for a in self.cross_k]
            self.cross_v = [resized(a, (R1, H, S1, Dh)) for a in self.cross_v]
            m = np.zeros((R1, 1, 1, S1), bool)
            m[:n, :, :, :S0] = self.mmask[:n]
            self.mmask = m
        if R1 != R0:
            seqs = np.full((R1, self.max_len), self.p["pad_token_id"], np.int64)
            seqs[:n] = self.seqs[:n]
            self.seqs = seqs
            for name in ("lens", "cur", "handles", "limit", "kind"):
                setattr(self, name, resized(getattr(self, name), (R1,)))
            self._rows = np.arange(R1)

    # -- the decoder-cache interface (TransformerDecoder._forward) -----------------------------

    def layer(self, i):
        return _RowView(self, i)

    @property
    def length(self):
        return self._L - 1

    # -- rows ------------------------------------------------------------------------------------

    def add(self, sources, max_new_tokens=None):
        """Encode `sources` (a list of 1-D token id sequences, no padding) and give each a row,
        decoded from the next step on (at most `max_new_tokens` tokens, default the
        settings'). Returns their handles (ints). A source the model cannot take (too long,
        an id out of the vocabulary) or a bad max_new_tokens is a ValueError naming it, and
        nothing is added."""
        from ..text.batching import pad_batch
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
        B, S = mask.shape
        nthr = _effective_n_threads(self.n_threads)
        memory = self.model._encode(ids, mask, nthr)
        n = self.n
        self._grow(n + B, S, 1)
        for i, layer in enumerate(self.model.decoder.layers):
            k, v = layer.multihead_attn._cross_kv(memory, B, S, nthr)
            self.cross_k[i][n:n + B, :, :S] = k
            self.cross_v[i][n:n + B, :, :S] = v
            self.cross_k[i][n:n + B, :, S:] = 0
            self.cross_v[i][n:n + B, :, S:] = 0
        self.mmask[n:n + B] = False
        self.mmask[n:n + B, 0, 0, :S] = mask
        self.seqs[n:n + B] = self.p["pad_token_id"]
        self.seqs[n:n + B, 0] = self.p["decoder_start_token_id"]
        self.lens[n:n + B] = 0
        self.cur[n:n + B] = 1
        self.limit[n:n + B] = p["max_length"]
        self.kind[n:n + B] = kind
        handles = list(range(self._next_handle, self._next_handle + B))
        self._next_handle += B
        self.handles[n:n + B] = handles
        self.n = n + B
        self.S = self._longest_source()
        return handles

    def _longest_source(self):
        """The running rows' longest source: its last real position + 1 (0 when none run)."""
        has = self.mmask[:self.n, 0, 0].any(axis=0)
        return int(np.flatnonzero(has)[-1]) + 1 if has.any() else 0

    def drop(self, handles):
        """Remove the rows of these handles (unknown ones are ignored)."""
        gone = np.isin(self.handles[:self.n], np.asarray(list(handles), np.int64))
        self._remove(np.flatnonzero(gone))

    def _remove(self, idx):
        """Remove rows idx: the last rows move into the holes (a row's computation does not
        depend on where it sits)."""
        for i in sorted((int(j) for j in idx), reverse=True):
            last = self.n - 1
            if i != last:
                t, S = int(self.lens[last]), self.S
                for buf in self.self_k + self.self_v:
                    buf[i, :, :t] = buf[last, :, :t]
                for buf in self.cross_k + self.cross_v:
                    buf[i, :, :S] = buf[last, :, :S]
                self.mmask[i] = self.mmask[last]
                for a in (self.seqs, self.lens, self.cur, self.handles, self.limit, self.kind):
                    a[i] = a[last]
            self.n = last
        self.S = self._longest_source()

    # -- a step -----------------------------------------------------------------------------------

    def step(self):
        """Feed every running row one token; returns [(handle, tokens int64 (m,))] of the rows
        that finished (EOS, or the length limit), which leave the batch."""
        n = self.n
        if n == 0:
            return []
        m = self.model
        nthr = _effective_n_threads(self.n_threads)
        self._L = int(self.lens[:n].max()) + 1
        self._grow(n, 0, self._L)
        r = self._rows[:n]
        lens = self.lens[:n]
        tok = self.seqs[r, lens][:, None]                         # (n, 1): each row's last token
        if self._fairseq:
            pos = (1 + lens[:, None]) * (tok != self._pad) + self._pad
        else:
            pos = lens[:, None] + self._offset
        x = m.decoder_embed._forward(tok, position_ids=pos)
        if int(lens.min()) + 1 == self._L:
            self.self_mask = None                                 # every row the same length
        else:
            self.self_mask = (np.arange(self._L)[None, :] <= lens[:, None])[:, None, None, :]
        from ..models.seq2seq import _SMALL
        ln_thr = 1 if n * m.d_model <= _SMALL else nthr
        h = m.decoder._forward(x, None, n, 1, None, None, None, nthr, cache=self,
                               ln_threads=ln_thr)
        self.self_mask = None
        self.lens[:n] += 1
        logits = m._project(h, nthr)
        scores = logits if logits.dtype == _F32 else logits.astype(_F32)
        nxt = np.empty(n, np.int64)
        cur = self.cur[:n]
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
