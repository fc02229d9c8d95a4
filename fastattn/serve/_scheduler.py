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

    def _take(self):
        """Pending jobs after waiting for at least one; False at shutdown."""
        stop = False
        if not self._pending:
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
            if not self._pending:
                continue
            jobs = self._select()
            self._started(jobs)
            t0 = time.perf_counter()
            if self.metrics is not None:
                self.metrics.running.labels(self.name).set(1)
            try:
                tokens = self._run(jobs)
            except Exception as exc:            # noqa: BLE001 (handed to the requests)
                for j in jobs:
                    _finish(j, None, exc)
                continue
            finally:
                if self.metrics is not None:
                    self.metrics.running.labels(self.name).set(0)
            if self.metrics is not None:
                dt = time.perf_counter() - t0
                self.metrics.batch_rows.labels(self.name).observe(
                    sum(len(j.payload["inputs"]) for j in jobs))
                self.metrics.batch_requests.labels(self.name).observe(len(jobs))
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


class TranslationWorker(_Worker):
    """Jobs: payload {"inputs": list of str, "src_lang", "tgt_lang", "kw": generate settings};
    result (list of str, source tokens). A job with ``on_text`` streams (one input, one beam):
    on_text(piece) from the worker thread, result (full text, source tokens)."""
    kind = "translation"

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
