"""One worker thread per model, batching the work of concurrent requests.

A request becomes a :class:`Job` on its model's queue; the worker takes every job waiting when it
is free (the requests that came while it computed the last batch), runs them as one batch and
hands each job its own part of the result. fastattn computes each row the same way whatever else
is in its batch, so a request's result is bitwise what it gets alone.

- Embeddings: the rows of all waiting jobs are sorted by length and cut into forward passes of at
  most ``max_batch_tokens`` padded tokens (``SentenceEncoder.embed_ids``).
- Translation: the waiting jobs with the same decoding settings (and languages) are translated
  together (``Translator``'s length-sorted batches); a sampling job (its rows draw from the
  seed's streams by position) and a streaming job run alone.
- Transcription: with an audio batch size, the waiting jobs with the same options are
  transcribed together, their speech windows decoded in batches across the files; without,
  one file at a time.

Jobs whose client went away, or whose deadline passed, before the worker reached them are
dropped. The worker thread is the only one that touches its model (tokenizers included).
"""
import json
import queue
import threading
import time

__all__ = ["Job", "QueueFull", "EmbeddingWorker", "TranslationWorker", "TranscriptionWorker"]

_STOP = object()
# the most rows one batch of requests takes (it is then cut into forward passes)
MAX_GATHER_ROWS = 1024


class QueueFull(Exception):
    """The model's queue holds max_queue jobs."""


class Job:
    """One request's work. ``payload`` is the worker's to read; ``done(result, error)`` is called
    once from the worker thread (error: an exception, or None). ``cancel()`` (any thread) drops
    it if not started yet (streaming jobs: stops the generation)."""

    def __init__(self, payload, done, *, deadline=None, key=None, alone=False, on_text=None):
        self.payload, self.done = payload, done
        self.deadline, self.key, self.alone, self.on_text = deadline, key, alone, on_text
        self.cancelled = threading.Event()

    def cancel(self):
        self.cancelled.set()

    def expired(self):
        return self.cancelled.is_set() or (self.deadline is not None and
                                           time.monotonic() > self.deadline)


class _Worker:
    kind = None

    def __init__(self, name, model, *, max_queue=64, max_batch_tokens=8192, batching=True,
                 metrics=None):
        self.name, self.model = name, model
        self.max_queue, self.max_batch_tokens, self.batching = max_queue, max_batch_tokens, batching
        self.metrics = metrics
        self._q = queue.Queue()
        self._pending = []            # taken off the queue, not yet run (worker thread only)
        self._lock = threading.Lock()
        self._waiting = 0             # jobs submitted and not yet started
        self._thread = threading.Thread(target=self._loop, name=f"fastattn-serve-{name}",
                                        daemon=True)
        self._thread.start()

    def submit(self, job):
        with self._lock:
            if self._waiting >= self.max_queue:
                raise QueueFull(self.name)
            self._waiting += 1
            self._gauge()
        self._q.put(job)

    def close(self, timeout=10.0):
        self._q.put(_STOP)
        self._thread.join(timeout)

    def _gauge(self):
        if self.metrics is not None:
            self.metrics.queue_depth.labels(self.name).set(self._waiting)

    def _started(self, jobs):
        with self._lock:
            self._waiting -= len(jobs)
            self._gauge()

    def _take(self, block=True):
        """Pending jobs after waiting for at least one (block) or not; False at shutdown."""
        stop = False
        if not self._pending and block:
            item = self._q.get()
            if item is _STOP:
                return False
            self._pending.append(item)
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                stop = True
                continue
            self._pending.append(item)
        live = [j for j in self._pending if not j.expired()]
        self._started([j for j in self._pending if j.expired()])
        for j in self._pending:
            if j.expired():
                if self.metrics is not None:
                    self.metrics.dropped.labels(self.name).inc()
                _finish(j, None, Dropped())
        self._pending = live
        if stop:
            self._q.put(_STOP)
        return True

    def _loop(self):
        while self._take():
            if self._pending:
                self._batch_once()

    def _batch_once(self):
        """Run the next batch of waiting jobs (_select) and hand each job its result."""
        jobs = self._select()
        self._started(jobs)
        t0 = time.perf_counter()
        self._set_running(1)
        try:
            tokens = self._run(jobs)
        except Exception as exc:                # noqa: BLE001 (handed to the requests)
            for j in jobs:
                _finish(j, None, exc)
            return
        finally:
            self._set_running(0)
        self._observe(sum(len(j.payload["inputs"]) for j in jobs), len(jobs), tokens,
                      time.perf_counter() - t0)

    def _set_running(self, v):
        if self.metrics is not None:
            self.metrics.running.labels(self.name).set(v)

    def _observe(self, rows, requests, tokens, dt):
        if self.metrics is not None:
            self.metrics.batch_rows.labels(self.name).observe(rows)
            self.metrics.batch_requests.labels(self.name).observe(requests)
            self.metrics.tokens.labels(self.name).inc(tokens)
            if dt > 0:
                self.metrics.tokens_per_second.labels(self.name).set(tokens / dt)

    def _select(self):
        """The jobs of the next batch, removed from _pending (at least the first)."""
        first = self._pending[0]
        if not self.batching or first.alone:
            chosen = [first]
        else:
            chosen, rows = [], 0
            for j in self._pending:
                if j.alone or j.key != first.key:
                    continue
                if chosen and rows + len(j.payload["inputs"]) > MAX_GATHER_ROWS:
                    break
                chosen.append(j)
                rows += len(j.payload["inputs"])
        ids = {id(j) for j in chosen}
        self._pending = [j for j in self._pending if id(j) not in ids]
        return chosen


class Dropped(Exception):
    """The job was dropped before it ran (its client left or its deadline passed)."""


def _finish(job, result, error):
    try:
        job.done(result, error)
    except Exception:                            # noqa: BLE001 (a closed event loop)
        pass


class EmbeddingWorker(_Worker):
    """Jobs: payload {"inputs": list of str or of id lists}; result (vectors (n, dim) float32,
    tokens used)."""
    kind = "embedding"

    def _rows(self, inputs):
        enc = self.model
        if inputs and isinstance(inputs[0], str):
            return enc.tokenize(inputs)
        ids = [list(r[:enc.max_seq_length]) for r in inputs]
        return ids, None

    def _run(self, jobs):
        enc = self.model
        ids, types, spans = [], [], []
        for j in jobs:
            i, t = self._rows(j.payload["inputs"])
            spans.append((len(ids), len(ids) + len(i)))
            ids.extend(i)
            types.extend(t if t is not None else [[0] * len(r) for r in i])
        if self.batching:
            out = enc.embed_ids(ids, types, batch_size=None,
                                max_batch_tokens=self.max_batch_tokens)
        else:
            out = enc.embed_ids(ids, types, batch_size=1)
        for j, (a, b) in zip(jobs, spans):
            _finish(j, (out[a:b], sum(len(r) for r in ids[a:b])), None)
        return sum(len(r) for r in ids)


class _Running:
    """The continuous batch of one decoding setting: the ContinuousGreedy, each row's job and
    index, each job's translations so far."""

    def __init__(self, key, cb):
        self.key, self.cb = key, cb
        self.owner = {}                  # handle -> (job, index of its input)
        self.out = {}                    # id(job) -> [job, texts, rows left, source tokens]

    def jobs(self):
        return [v[0] for v in self.out.values()]


class TranslationWorker(_Worker):
    """Jobs: payload {"inputs": list of str, "src_lang", "tgt_lang", "kw": generate settings};
    result (list of str, source tokens). A job with ``on_text`` streams (one input, one beam):
    on_text(piece) from the worker thread, result (full text, source tokens).

    With batching on, greedy jobs (the settings resolve to ``num_beams=1`` without sampling, on
    a model with absolute positions) run by continuous batching
    (:class:`fastattn.generation.continuous.ContinuousGreedy`): their rows join the running
    batch at the next step boundary and leave it as they finish, so a short request never
    waits for a long one; a job is answered when its last row is done. Jobs join while the
    oldest waiting job has the running batch's settings (else the batch drains first, then the
    next settings run), up to MAX_RUNNING_ROWS rows (a request with more inputs runs by
    length-sorted batches, as beam search does). The last settings' batch keeps its
    buffers (the KV cache grown to the load) for the next requests. Beam search, sampling and
    streaming jobs run as before (the waiting jobs of one setting batched together, then the
    next)."""
    kind = "translation"
    MAX_RUNNING_ROWS = 128

    @staticmethod
    def job_key(payload):
        return json.dumps([payload["src_lang"], payload["tgt_lang"], payload["kw"]],
                          sort_keys=True)

    def _run(self, jobs):
        tr = self.model
        first = jobs[0]
        p = first.payload
        kw = tr._gen_kwargs(p["kw"], p["tgt_lang"])
        if first.on_text is not None:
            return self._stream(first, kw)
        rows, spans = [], []
        for j in jobs:
            r = tr._encode(j.payload["inputs"], p["src_lang"], p["tgt_lang"])
            spans.append((len(rows), len(rows) + len(r)))
            rows.extend(r)
        # a sampling job (alone) runs each input alone: row b of a batch draws from stream b
        # of the seed, so each input gets what translate([text]) gives it
        bs = None if self.batching and not first.alone else 1
        mbt = self.max_batch_tokens if bs is None else None
        try:
            out = tr._run(rows, bs, mbt, kw, _NoBar)
        except (ValueError, TypeError) as exc:
            if len(jobs) == 1:
                raise
            # a setting one request got wrong: each request alone, so that only it fails
            del exc
            for j, (a, b) in zip(jobs, spans):
                try:
                    _finish(j, (tr._run(rows[a:b], bs, mbt, kw, _NoBar),
                                sum(len(x) for x in rows[a:b])), None)
                except (ValueError, TypeError) as e:
                    _finish(j, None, e)
            return sum(len(r) for r in rows)
        for j, (a, b) in zip(jobs, spans):
            _finish(j, (out[a:b], sum(len(x) for x in rows[a:b])), None)
        return sum(len(r) for r in rows)

    # -- continuous batching -------------------------------------------------------------------

    def _greedy(self, job):
        """A new ContinuousGreedy for the job's settings, or None when it cannot run so."""
        from ..generation.continuous import ContinuousGreedy
        if not self._joins(job):
            return None
        p = job.payload
        key = self._ckey(job)
        try:
            kw = self.model._gen_kwargs(p["kw"], p["tgt_lang"])
            nthr = kw.pop("n_threads", None)
            mnt = kw.pop("max_new_tokens", None)
            last = getattr(self, "_last_batcher", None)
            # the last settings' batcher again: its buffers (grown to the load) are reused
            cb = last[1] if last is not None and last[0] == key else \
                ContinuousGreedy(self.model.model, n_threads=nthr, **kw)
            cb.check(mnt)                        # this job's length limit
        except (ValueError, TypeError):
            return None
        self._last_batcher = (key, cb)
        return cb

    def _joins(self, job):
        """Whether the job may run in a continuous batch: not streaming, not alone (sampling),
        and at most MAX_RUNNING_ROWS inputs (a larger request runs by length-sorted batches
        of max_batch_tokens, as with beams: its KV cache stays bounded)."""
        return (job.on_text is None and not job.alone and
                getattr(self.model, "package", None) is None and      # Argos: sentences
                len(job.payload["inputs"]) <= self.MAX_RUNNING_ROWS)

    @staticmethod
    def _ckey(job):
        """The settings a running batch shares: the job's, less max_new_tokens (each row
        keeps its own)."""
        p = job.payload
        kw = {k: v for k, v in p["kw"].items() if k != "max_new_tokens"}
        return json.dumps([p["src_lang"], p["tgt_lang"], kw], sort_keys=True)

    def _loop(self):
        if not self.batching:
            return super()._loop()
        run = None
        while True:
            busy = run is not None and run.cb.n > 0
            if not self._take(block=not busy):
                break
            if busy:
                self._drop_gone(run)
            if run is None or run.cb.n == 0:
                run = None
                if not self._pending:
                    continue
                cb = self._greedy(self._pending[0])
                if cb is None:                      # beams, sampling, streaming: as before
                    self._batch_once()
                    continue
                run = _Running(self._ckey(self._pending[0]), cb)
            self._admit(run)
            if run.cb.n:
                self._step(run)

    def _admit(self, run):
        """Move the waiting jobs of the running batch's settings into it, oldest first, while
        the oldest waiting job has those settings (FIFO across settings) and rows are free."""
        tr, cb = self.model, run.cb
        take = []
        rows = cb.n
        for j in self._pending:
            if not self._joins(j) or self._ckey(j) != run.key:
                break
            n = len(j.payload["inputs"])
            if take and rows + n > self.MAX_RUNNING_ROWS:
                break
            take.append(j)
            rows += n
        if not take:
            return
        running_before = cb.n > 0
        ids = {id(j) for j in take}
        self._pending = [j for j in self._pending if id(j) not in ids]
        self._started(take)
        encoded = []
        for j in take:
            p = j.payload
            try:
                encoded.append((j, tr._encode(p["inputs"], p["src_lang"], p["tgt_lang"])))
            except (ValueError, TypeError) as exc:
                _finish(j, None, exc)
        # the new rows encoded together, in length-sorted groups of at most max_batch_tokens
        # padded tokens; a group that fails is retried job by job, so that only a bad one fails
        flat = [(j, i, r) for j, rows_ in encoded for i, r in enumerate(rows_)]
        for j, rows_ in encoded:
            run.out[id(j)] = [j, [None] * len(rows_), len(rows_), sum(len(r) for r in rows_)]
        mnt = lambda t: t[0].payload["kw"].get("max_new_tokens")   # noqa: E731
        flat.sort(key=lambda t: (-1 if mnt(t) is None else mnt(t), len(t[2])))
        group, width = [], 0
        for item in flat + [None]:
            if item is not None and (not group or mnt(item) == mnt(group[0]) and (
                    len(group) + 1) * max(width, len(item[2])) <= self.max_batch_tokens):
                group.append(item)
                width = max(width, len(item[2]))
                continue
            if group:
                self._add(run, group)
            group, width = ([item], len(item[2])) if item is not None else ([], 0)
        for key in [k for k, v in run.out.items() if v[2] == 0]:   # jobs with no inputs
            v = run.out.pop(key)
            _finish(v[0], (v[1], v[3]), None)
        if self.metrics is not None:
            self.metrics.tokens.labels(self.name).inc(sum(len(r) for _, _, r in flat))
            if running_before:
                self.metrics.joined.labels(self.name).inc(len(flat))

    def _add(self, run, group):
        """Add rows (job, index, ids) of one max_new_tokens; a failure is retried job by job."""
        mnt = group[0][0].payload["kw"].get("max_new_tokens")
        try:
            handles = run.cb.add([r for _, _, r in group], mnt)
        except (ValueError, TypeError):
            by_job = {}
            for item in group:
                by_job.setdefault(id(item[0]), []).append(item)
            for items in by_job.values():
                j = items[0][0]
                if id(j) not in run.out:
                    continue                        # failed already
                try:
                    hs = run.cb.add([r for _, _, r in items], mnt)
                except (ValueError, TypeError) as exc:
                    self._fail(run, j, exc)
                    continue
                for h, (_, i, _) in zip(hs, items):
                    run.owner[h] = (j, i)
            return
        for h, (j, i, _) in zip(handles, group):
            run.owner[h] = (j, i)

    def _fail(self, run, job, exc):
        """The job fails: its rows leave the batch."""
        gone = [h for h, (j, _) in run.owner.items() if j is job]
        run.cb.drop(gone)
        for h in gone:
            del run.owner[h]
        if run.out.pop(id(job), None) is not None:
            _finish(job, None, exc)

    def _drop_gone(self, run):
        """Jobs whose client went away (or whose deadline passed) leave the running batch."""
        for j in run.jobs():
            if j.expired():
                if self.metrics is not None:
                    self.metrics.dropped.labels(self.name).inc()
                self._fail(run, j, Dropped())

    def _step(self, run):
        tr, cb = self.model, run.cb
        rows, requests = cb.n, len(run.out)
        self._set_running(1)
        try:
            finished = cb.step()
        except Exception as exc:                # noqa: BLE001 (handed to the requests)
            for j in run.jobs():
                _finish(j, None, exc)
            cb.drop(run.owner)
            run.out.clear()
            run.owner.clear()
            return
        finally:
            if cb.n == 0:
                self._set_running(0)
        for h, toks in finished:
            j, i = run.owner.pop(h)
            v = run.out[id(j)]
            v[1][i] = tr.tokenizer.decode(toks, skip_special_tokens=True)
            v[2] -= 1
            if v[2] == 0:
                del run.out[id(j)]
                _finish(j, (v[1], v[3]), None)
        if self.metrics is not None:
            self.metrics.batch_rows.labels(self.name).observe(rows)
            self.metrics.batch_requests.labels(self.name).observe(requests)
            self.metrics.generated.labels(self.name).inc(rows)

    def _stream(self, job, kw):
        from ..text.batching import pad_batch
        from ..text.translator import TextStreamer, _Cancelled
        tr = self.model
        p = job.payload
        kw.setdefault("num_beams", 1)
        if kw["num_beams"] != 1:
            raise ValueError(f"streaming decodes one hypothesis: num_beams must be 1, got "
                             f"{kw['num_beams']!r}")
        rows = tr._encode(p["inputs"], p["src_lang"], p["tgt_lang"])
        ids, mask = pad_batch(rows, tr.model.pad_id)
        pieces = []

        def on_text(piece):
            pieces.append(piece)
            job.on_text(piece)

        streamer = TextStreamer(tr.tokenizer, on_text, job.cancelled)
        try:
            tr.model.generate(ids, mask, streamer=streamer, **kw)
        except _Cancelled:
            _finish(job, None, Dropped())
            return len(rows[0])
        _finish(job, ("".join(pieces), len(rows[0])), None)
        return len(rows[0])


class _NoBar:
    @staticmethod
    def update(n):
        pass


class TranscriptionWorker(_Worker):
    """Jobs: payload {"inputs": [audio bytes], "options": Transcriber options}; result (a
    :class:`fastattn.audio.Transcription`, tokens decoded). With ``audio_batch_size`` N the
    waiting jobs with the same options are transcribed together, their speech windows decoded
    N at a time across the files (``Transcriber.transcribe_batch``: each file's result is
    bitwise what it gets alone); without, one file at a time (the sequential long form). A job
    with ``on_text`` streams its segments: on_text(segment) from the worker thread."""
    kind = "transcription"

    def __init__(self, name, model, *, audio_batch_size=None, **kw):
        self.audio_batch_size = audio_batch_size
        super().__init__(name, model, **kw)

    @staticmethod
    def job_key(payload):
        return json.dumps(payload["options"], sort_keys=True)

    def _run(self, jobs):
        from ..audio import load_audio
        tr = self.model
        opts = dict(jobs[0].payload["options"])
        audios, live = [], []
        for j in jobs:                              # a file that does not decode fails alone
            try:
                audios.append(load_audio(j.payload["inputs"][0]))
                live.append(j)
            except (ValueError, TypeError) as exc:
                _finish(j, None, exc)
        if not live:
            return 0
        n = self.audio_batch_size
        if live[0].on_text is not None:
            return self._stream(live[0], audios[0], opts)
        if n is not None:
            opts["batch_size"] = n
            try:
                results = tr.transcribe_batch(audios, **opts)
            except (ValueError, TypeError) as exc:
                if len(live) == 1:
                    raise
                del exc
                results = []
                for j, a in zip(live, audios):
                    try:
                        results.append(tr.transcribe(a, **opts))
                    except (ValueError, TypeError) as e:
                        results.append(e)
        else:
            results = []
            for a in audios:
                try:
                    results.append(tr.transcribe(a, **opts))
                except (ValueError, TypeError) as e:
                    results.append(e)
        total = 0
        for j, r in zip(live, results):
            if isinstance(r, Exception):
                _finish(j, None, r)
                continue
            toks = sum(len(s.tokens) for s in r.segments)
            total += toks
            _finish(j, (r, toks), None)
        return total

    def _stream(self, job, audio, opts):
        tr = self.model
        stream = tr.stream(audio, **opts)
        job.on_text(("start", stream))
        segments = []
        for seg in stream:
            if job.cancelled.is_set():
                _finish(job, None, Dropped())
                return sum(len(s.tokens) for s in segments)
            segments.append(seg)
            job.on_text(("segment", seg))
        toks = sum(len(s.tokens) for s in segments)
        _finish(job, (stream.result(segments), toks), None)
        return toks
