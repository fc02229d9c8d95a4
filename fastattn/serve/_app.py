"""The ASGI application (Starlette): endpoints, limits, errors in OpenAI's shape, metrics."""
import asyncio
import base64
import hmac
import json
import sys
import time

from . import realtime
from ._scheduler import (Dropped, EmbeddingWorker, Job, QueueFull, TranscriptionWorker,
                         TranslationWorker)

__all__ = ["Settings", "app", "load_models"]


class Settings:
    """The server's limits (see docs/serve.md)."""

    def __init__(self, *, max_batch_tokens=8192, max_queue=64, max_inputs=2048,
                 max_body_bytes=4 << 20, timeout=60.0, body_timeout=10.0, api_key=None,
                 batching=True, max_num_beams=16, max_new_tokens=1024,
                 max_audio_bytes=25 << 20, audio_batch_size=None, vad_model="silero",
                 realtime_max_sessions=16, realtime_max_buffer_bytes=4 << 20,
                 realtime_idle_timeout=60.0):
        for name, v in (("max_batch_tokens", max_batch_tokens), ("max_queue", max_queue),
                        ("max_inputs", max_inputs), ("max_body_bytes", max_body_bytes),
                        ("max_num_beams", max_num_beams), ("max_new_tokens", max_new_tokens),
                        ("max_audio_bytes", max_audio_bytes),
                        ("realtime_max_sessions", realtime_max_sessions),
                        ("realtime_max_buffer_bytes", realtime_max_buffer_bytes)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        for name, v in (("timeout", timeout), ("body_timeout", body_timeout),
                        ("realtime_idle_timeout", realtime_idle_timeout)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {v!r}")
        if api_key is not None and (not isinstance(api_key, str) or not api_key):
            raise ValueError("api_key must be a non-empty string or None")
        self.max_batch_tokens, self.max_queue, self.max_inputs = (max_batch_tokens, max_queue,
                                                                  max_inputs)
        self.max_body_bytes, self.timeout, self.body_timeout = (max_body_bytes, float(timeout),
                                                                float(body_timeout))
        self.api_key, self.batching = api_key, bool(batching)
        self.max_num_beams, self.max_new_tokens = max_num_beams, max_new_tokens
        if audio_batch_size is not None and (isinstance(audio_batch_size, bool) or
                                             not isinstance(audio_batch_size, int) or
                                             audio_batch_size < 1):
            raise ValueError(f"audio_batch_size must be a positive integer or None, got "
                             f"{audio_batch_size!r}")
        if vad_model not in ("silero", "webrtc"):
            raise ValueError(f"vad_model must be 'silero' or 'webrtc', got {vad_model!r}")
        self.max_audio_bytes, self.audio_batch_size = max_audio_bytes, audio_batch_size
        self.vad_model = vad_model
        self.realtime_max_sessions = realtime_max_sessions
        self.realtime_max_buffer_bytes = realtime_max_buffer_bytes
        self.realtime_idle_timeout = float(realtime_idle_timeout)


# -- errors ------------------------------------------------------------------------------------

class ServeError(Exception):
    def __init__(self, status, message, *, type="invalid_request_error", param=None, code=None,
                 headers=None):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers


class _ClientGone(Exception):
    pass


def _bad(message, param=None, code=None):
    return ServeError(400, message, param=param, code=code)


def _error_response(err):
    from starlette.responses import JSONResponse
    return JSONResponse({"error": {"message": err.message, "type": err.type, "param": err.param,
                                   "code": err.code}}, status_code=err.status,
                        headers=err.headers)


# -- models ------------------------------------------------------------------------------------

def load_models(models, *, quantize=None, threads=None):
    """{name: SentenceEncoder, Translator or Transcriber} from {name: folder or loaded object}. The kind comes
    from the folder (``fastattn.models.convert.model_class``)."""
    from ..audio import Transcriber
    from ..models import EncoderModel, WhisperModel
    from ..models.convert import model_class
    from ..text import SentenceEncoder, Translator, argos
    if not isinstance(models, dict) or not models:
        raise ValueError("models must be a non-empty dict {name: folder}")
    out = {}
    for name, spec in models.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"a model name must be a non-empty string, got {name!r}")
        if isinstance(spec, (SentenceEncoder, Translator, Transcriber)):
            out[name] = spec
            continue
        if argos.is_package(spec) or str(spec).endswith(argos.SUFFIX):
            out[name] = Translator(spec, quantize=quantize, n_threads=threads)
            continue
        cls = model_class(spec)
        make = SentenceEncoder if cls is EncoderModel else \
            Transcriber if cls is WhisperModel else Translator
        out[name] = make(spec, quantize=quantize, n_threads=threads)
    return out


_MAX_ALTERNATIVES = 8


def _folder_beams(tr):
    """The beams a Translator decodes with by default (an Argos package: argostranslate's 4;
    else the folder's generation config)."""
    if getattr(tr, "package", None) is not None:
        return 4
    return int(tr.model.generation_config.get("num_beams") or 1)


def _translates(tr, src, tgt):
    """Whether the Translator `tr` has the codes `src` (None, "" or "auto": any) and `tgt`."""
    if not isinstance(tgt, str) or tgt not in tr.target_languages:
        return False
    return src in (None, "", "auto") or src in tr.source_languages


def _language_names(tr):
    """{code: name} of a Translator's languages (an Argos package's metadata names them)."""
    pkg = getattr(tr, "package", None)
    if pkg is None:
        return {}
    return {pkg.from_code: pkg.from_name, pkg.to_code: pkg.to_name}


class _Metrics:
    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        self.registry = r = CollectorRegistry()
        self.requests = Counter("fastattn_requests", "HTTP requests by endpoint and status code",
                                ["endpoint", "code"], registry=r)
        self.errors = Counter("fastattn_errors", "HTTP error responses (4xx, 5xx) by endpoint "
                              "and status code", ["endpoint", "code"], registry=r)
        self.latency = Histogram("fastattn_request_latency_seconds", "request latency",
                                 ["endpoint"], registry=r,
                                 buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5,
                                          5, 10, 30, 60))
        self.in_flight = Gauge("fastattn_requests_in_flight", "requests being handled",
                               ["endpoint"], registry=r)
        self.queue_depth = Gauge("fastattn_queue_depth", "jobs waiting for a model's worker",
                                 ["model"], registry=r)
        self.batch_rows = Histogram("fastattn_batch_rows", "inputs (rows) per batch of requests",
                                    ["model"], registry=r,
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))
        self.batch_requests = Histogram("fastattn_batch_requests", "requests per batch",
                                        ["model"], registry=r,
                                        buckets=(1, 2, 4, 8, 16, 32, 64, 128))
        self.running = Gauge("fastattn_batch_running", "1 while a model's worker runs a batch",
                             ["model"], registry=r)
        self.dropped = Counter("fastattn_dropped", "requests dropped before they ran (the "
                               "client left, or the deadline passed)", ["model"], registry=r)
        self.tokens = Counter("fastattn_tokens", "input tokens processed", ["model"], registry=r)
        self.tokens_per_second = Gauge("fastattn_tokens_per_second",
                                       "input tokens per second of the last batch", ["model"],
                                       registry=r)
        self.generated = Counter("fastattn_generated_tokens", "tokens decoded by continuous "
                                 "batching (greedy translation)", ["model"], registry=r)
        self.joined = Counter("fastattn_joined_rows", "rows that joined a running batch at a "
                              "step boundary (continuous batching)", ["model"], registry=r)


# -- request parsing ---------------------------------------------------------------------------

async def _read_raw(request, s, limit):
    """The request body (bytes), at most `limit` bytes (413 beyond), within body_timeout."""
    cl = request.headers.get("content-length")
    if cl is not None and (not cl.isdigit() or int(cl) > 16 * limit):
        # far too large (or nonsense): answer without reading it
        raise ServeError(413, f"request body over {limit} bytes", code="body_too_large")

    async def collect():
        chunks, n = [], 0
        async for chunk in request.stream():
            n += len(chunk)
            if n <= limit:
                chunks.append(chunk)
            elif n > 16 * limit:
                break
        return b"".join(chunks), n

    from starlette.requests import ClientDisconnect
    try:
        raw, n = await asyncio.wait_for(collect(), s.body_timeout)
    except ClientDisconnect:                       # left halfway through its body
        raise _ClientGone() from None
    except asyncio.TimeoutError:
        raise ServeError(408, f"the request body did not arrive within {s.body_timeout:g} s",
                         code="request_timeout") from None
    if n > limit:
        raise ServeError(413, f"request body over {limit} bytes", code="body_too_large")
    return raw


async def _read_body(request, s):
    raw = await _read_raw(request, s, s.max_body_bytes)
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad(f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", code="invalid_json")
    return body


def _embedding_inputs(value, vocab, max_inputs):
    """list of str, or list of id lists."""
    def ids_ok(row):
        return (isinstance(row, list) and row and
                all(type(t) is int and 0 <= t < vocab for t in row))
    if isinstance(value, str):
        value = [value]
    elif isinstance(value, list) and value and all(type(t) is int for t in value):
        value = [value]
    if not isinstance(value, list):
        raise _bad("input must be a string, a list of strings, a token id array or a list of "
                   "them", param="input")
    if not value:
        raise _bad("input must not be empty", param="input")
    if len(value) > max_inputs:
        raise _bad(f"input has {len(value)} items; at most {max_inputs} per request",
                   param="input", code="too_many_inputs")
    if all(isinstance(t, str) for t in value):
        if any(not t for t in value):
            raise _bad("input must not contain empty strings", param="input")
        return value
    if all(isinstance(t, list) for t in value):
        for row in value:
            if not ids_ok(row):
                raise _bad(f"a token id array must be a non-empty list of integers in [0, "
                           f"{vocab})", param="input")
        return value
    raise _bad("input must be a string, a list of strings, a token id array or a list of them "
               "(not a mix)", param="input")


_GEN_KEYS = ("num_beams", "max_new_tokens", "min_new_tokens", "length_penalty",
             "early_stopping", "no_repeat_ngram_size", "repetition_penalty", "do_sample",
             "temperature", "top_k", "top_p", "seed")


def _generation_settings(body, s):
    from .._validation import check_generation_setting
    kw = {}
    for key in _GEN_KEYS:
        if body.get(key) is None:
            continue
        v = body[key]
        try:
            if key == "seed":
                if type(v) is not int or v < 0:
                    raise ValueError(f"seed must be an integer >= 0, got {v!r}")
            else:
                v = check_generation_setting(key, v)
        except (ValueError, TypeError) as exc:
            raise _bad(str(exc), param=key) from None
        kw[key] = v
    if kw.get("num_beams", 1) > s.max_num_beams:
        raise _bad(f"num_beams is at most {s.max_num_beams} here", param="num_beams")
    if kw.get("max_new_tokens", 1) > s.max_new_tokens:
        raise _bad(f"max_new_tokens is at most {s.max_new_tokens} here", param="max_new_tokens")
    return kw


# -- the application ---------------------------------------------------------------------------

def app(models, *, quantize=None, threads=None, settings=None, **limits):
    """The ASGI application serving `models` ({name: folder, or a loaded SentenceEncoder /
    Translator}). Limits: a :class:`Settings`, or its keywords (max_batch_tokens, max_queue,
    max_inputs, max_body_bytes, timeout, body_timeout, api_key, batching, ...). Each model gets
    a worker thread, started here and stopped at the application's lifespan shutdown."""
    import contextlib

    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    from ..audio import Transcriber
    from ..text import SentenceEncoder
    s = settings if settings is not None else Settings(**limits)
    loaded = load_models(models, quantize=quantize, threads=threads)
    metrics = _Metrics()
    created = int(time.time())
    workers = {}
    for name, m in loaded.items():
        kw = dict(max_queue=s.max_queue, max_batch_tokens=s.max_batch_tokens,
                  batching=s.batching, metrics=metrics)
        if isinstance(m, Transcriber):
            workers[name] = TranscriptionWorker(name, m, audio_batch_size=s.audio_batch_size,
                                                **kw)
            continue
        cls = EmbeddingWorker if isinstance(m, SentenceEncoder) else TranslationWorker
        workers[name] = cls(name, m, **kw)

    def worker(name, kind, param="model"):
        if name is None:
            names = [n for n, w in workers.items() if w.kind == kind]
            if len(names) == 1:
                return workers[names[0]]
            raise _bad(f"'model' is required (the {kind} models: {', '.join(names) or 'none'})",
                       param=param)
        if not isinstance(name, str):
            raise _bad("model must be a string", param=param)
        w = workers.get(name)
        if w is None or w.kind != kind:
            raise ServeError(404, f"the {kind} model {name!r} does not exist",
                             param=param, code="model_not_found")
        return w

    def authorize(request):
        if s.api_key is None:
            return
        auth = request.headers.get("authorization", "")
        scheme, _, key = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(),
                                                                 s.api_key.encode()):
            raise ServeError(401, "a valid API key is required (Authorization: Bearer KEY)",
                             type="authentication_error", code="invalid_api_key")

    def endpoint(path, fn, methods, open_=False):
        async def handle(request):
            t0 = time.perf_counter()
            metrics.in_flight.labels(path).inc()
            try:
                if not open_:
                    authorize(request)
                response = await fn(request)
            except ServeError as err:
                response = _error_response(err)
            except _ClientGone:
                response = Response(status_code=499)
            except Exception as exc:                       # noqa: BLE001: never a traceback
                print(f"fastattn serve: {path}: internal error: {type(exc).__name__}: {exc}",
                      file=sys.stderr)
                response = _error_response(ServeError(500, "internal server error",
                                                      type="server_error"))
            finally:
                metrics.in_flight.labels(path).dec()
            code = str(response.status_code)
            metrics.requests.labels(path, code).inc()
            if response.status_code >= 400:
                metrics.errors.labels(path, code).inc()
            metrics.latency.labels(path).observe(time.perf_counter() - t0)
            return response
        return Route(path, handle, methods=methods)

    async def run_job(request, w, payload, *, key=None, alone=False):
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def settle(result, error):
            if not fut.done():
                if error is not None:
                    fut.set_exception(error)
                else:
                    fut.set_result(result)

        job = Job(payload, lambda r, e: loop.call_soon_threadsafe(settle, r, e),
                  deadline=time.monotonic() + s.timeout, key=key, alone=alone)
        _submit(w, job)
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            finished, _ = await asyncio.wait({fut, gone}, timeout=s.timeout,
                                             return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if fut in finished:
            return _job_result(fut)
        job.cancel()
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())   # retrieve it
        if gone in finished:
            raise _ClientGone()
        raise _timeout(s)

    async def embeddings(request):
        body = await _read_body(request, s)
        w = worker(body.get("model"), "embedding")
        enc = w.model
        inputs = _embedding_inputs(body.get("input"), enc.model.config.vocab_size, s.max_inputs)
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise _bad("encoding_format must be 'float' or 'base64'", param="encoding_format")
        dims = body.get("dimensions")
        if dims is not None and (type(dims) is not int or dims != enc.dim):
            raise _bad(f"dimensions must be {enc.dim} for this model", param="dimensions")
        vectors, tokens = await run_job(request, w, {"inputs": inputs})
        data = []
        for i, v in enumerate(vectors):
            emb = (base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
                   if fmt == "base64" else v.tolist())
            data.append({"object": "embedding", "index": i, "embedding": emb})
        return JSONResponse({"object": "list", "data": data, "model": w.name,
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    def translation_worker(body):
        """The body's model; without one, the one translation model (or, among several, the
        one whose languages are the body's source and target, as LibreTranslate picks its
        package)."""
        name = body.get("model")
        ws = [w for w in workers.values() if w.kind == "translation"]
        if name is not None or len(ws) <= 1:
            return worker(name, "translation")
        src, tgt = body.get("source"), body.get("target")
        match = [w for w in ws if _translates(w.model, src, tgt)]
        if len(match) == 1:
            return match[0]
        if not match and isinstance(tgt, str) and tgt:
            pairs = ", ".join(f"{a}->{b}" for w in ws for a in w.model.source_languages
                              for b in w.model.target_languages) or "none"
            raise _bad(f"no model translates {src!r} to {tgt!r} (the language pairs: {pairs}); "
                       "or name one with 'model'", param="target", code="unsupported_language")
        return worker(None, "translation")

    def translate_request(body):
        w = translation_worker(body)
        tr = w.model
        q = body.get("q")
        if isinstance(q, list):
            if not q or not all(isinstance(t, str) for t in q):
                raise _bad("q must be a non-empty string or a non-empty list of strings",
                           param="q")
            if len(q) > s.max_inputs:
                raise _bad(f"q has {len(q)} items; at most {s.max_inputs} per request",
                           param="q", code="too_many_inputs")
        elif not isinstance(q, str) or not q:
            raise _bad("q must be a non-empty string or a non-empty list of strings", param="q")
        fmt = body.get("format", "text")
        if fmt != "text":
            raise _bad("only format 'text' is supported", param="format")
        langs = []
        for field, codes in (("source", tr.source_languages), ("target", tr.target_languages)):
            v = body.get(field)
            if v is not None and not isinstance(v, str):
                raise _bad(f"{field} must be a string", param=field)
            # a model without language codes (one pair) takes any source / target, as
            # LibreTranslate's clients always send them
            langs.append(None if v in (None, "", "auto") or not codes else v)
        try:
            src, tgt = tr._languages(*langs)
        except (ValueError, TypeError) as exc:
            raise _bad(str(exc), param="source" if "src" in str(exc) else "target") from None
        kw = _generation_settings(body, s)
        alt = body.get("alternatives")
        if alt is not None and alt != 0:
            # LibreTranslate's: the best translation and `alternatives` more, from one beam
            # search of at least alternatives + 1 beams
            if type(alt) is not int or not 0 <= alt <= _MAX_ALTERNATIVES:
                raise _bad(f"alternatives must be an integer in [0, {_MAX_ALTERNATIVES}], got "
                           f"{alt!r}", param="alternatives")
            if kw.get("do_sample"):
                raise _bad("alternatives come from beam search: leave do_sample out",
                           param="alternatives")
            beams = kw.get("num_beams") or _folder_beams(tr)
            kw["num_beams"] = max(beams, alt + 1)
            kw["num_return_sequences"] = alt + 1
        payload = {"inputs": [q] if isinstance(q, str) else q, "src_lang": src,
                   "tgt_lang": tgt, "kw": kw}
        return w, payload, q

    async def translate(request):
        body = await _read_body(request, s)
        if body.get("stream") is True:
            return await _stream(request, body)
        w, payload, q = translate_request(body)
        out, _ = await run_job(request, w, payload, key=TranslationWorker.job_key(payload),
                               alone=bool(payload["kw"].get("do_sample")))
        if payload["kw"].get("num_return_sequences", 1) > 1:
            best, alts = [o[0] for o in out], [o[1:] for o in out]
            if isinstance(q, str):
                return JSONResponse({"translatedText": best[0], "alternatives": alts[0]})
            return JSONResponse({"translatedText": best, "alternatives": alts})
        return JSONResponse({"translatedText": out[0] if isinstance(q, str) else out})

    async def translate_stream(request):
        return await _stream(request, await _read_body(request, s))

    async def _stream(request, body):
        w, payload, q = translate_request(body)
        if not isinstance(q, str):
            raise _bad("streaming translates one string: q must be a string", param="q")
        if getattr(w.model, "package", None) is not None:
            raise _bad("an Argos package translates whole sentences by beam search: use "
                       "/translate without stream", param="stream")
        if payload["kw"].get("num_return_sequences", 1) > 1:
            raise _bad("streaming follows one hypothesis: leave alternatives out",
                       param="alternatives")
        if payload["kw"].setdefault("num_beams", 1) != 1:
            raise _bad("streaming decodes one hypothesis: num_beams must be 1",
                       param="num_beams")
        return stream_job(w, payload, lambda piece: {"text": piece},
                          lambda r: {"done": True, "translatedText": r[0]},
                          lambda body: {"error": body})

    # -- speech: OpenAI's /v1/audio/transcriptions and /v1/audio/translations -------------

    async def audio_form(request):
        ctype = request.headers.get("content-type", "")
        if not ctype.startswith("multipart/form-data"):
            raise _bad("the request must be multipart/form-data (a 'file' part and fields)",
                       code="invalid_content_type")
        raw = await _read_raw(request, s, s.max_audio_bytes + (64 << 10))
        from starlette.formparsers import MultiPartException, MultiPartParser

        async def once():
            yield raw
            yield b""
        try:
            form = await MultiPartParser(request.headers, once(), max_files=1,
                                         max_fields=64).parse()
        except MultiPartException as exc:
            raise _bad(f"the multipart body does not parse: {exc.message}",
                       code="invalid_multipart") from None
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            raise _bad("'file' (the audio file) is required", param="file")
        data = await upload.read()
        if len(data) > s.max_audio_bytes:
            raise ServeError(413, f"the audio file is over {s.max_audio_bytes} bytes",
                             param="file", code="file_too_large")
        if not data:
            raise _bad("the audio file is empty", param="file")
        return form, data

    def audio_options(form, task):
        opts = {"task": task}
        if s.audio_batch_size is not None:
            opts["vad_model"] = s.vad_model
        lang = form.get("language")
        if lang and task == "transcribe":
            opts["language"] = lang
        prompt = form.get("prompt")
        if prompt:
            opts["initial_prompt"] = prompt
        t = form.get("temperature")
        if t not in (None, ""):
            try:
                t = float(t)
            except ValueError:
                raise _bad("temperature must be a number in [0, 1]", param="temperature") \
                    from None
            if not 0.0 <= t <= 1.0:
                raise _bad("temperature must be a number in [0, 1]", param="temperature")
            if t > 0:                     # 0 (the default): the fallback from 0 upwards
                opts["temperature"] = (t,)
        fmt = form.get("response_format") or "json"
        if fmt not in ("json", "text", "srt", "vtt", "verbose_json"):
            raise _bad("response_format must be one of json, text, srt, vtt, verbose_json",
                       param="response_format")
        grains = form.getlist("timestamp_granularities[]") + \
            form.getlist("timestamp_granularities")
        for g in grains:
            if g not in ("segment", "word"):
                raise _bad("timestamp_granularities must hold 'segment' and / or 'word'",
                           param="timestamp_granularities")
        if "word" in grains:
            if fmt != "verbose_json":
                raise _bad("word timestamps need response_format=verbose_json",
                           param="timestamp_granularities")
            if s.audio_batch_size is not None:
                raise _bad("word timestamps are not served with an audio batch size",
                           param="timestamp_granularities")
            opts["word_timestamps"] = True
        stream = (form.get("stream") or "false").lower()
        if stream not in ("true", "false"):
            raise _bad("stream must be true or false", param="stream")
        return opts, fmt, grains, stream == "true"

    def audio_response(result, task, fmt, grains):
        from starlette.responses import PlainTextResponse
        from ..audio.formats import write_transcript
        from ..generation.whisper import LANGUAGES
        if fmt == "text":
            return PlainTextResponse(result.text)
        if fmt in ("srt", "vtt"):
            import io
            f = io.StringIO()
            write_transcript(result, f, fmt)
            return PlainTextResponse(f.getvalue())
        usage = {"type": "duration", "seconds": int(-(-result.duration // 1))}
        if fmt == "json":
            return JSONResponse({"text": result.text, "usage": usage})
        body = {"task": task, "language": LANGUAGES.get(result.language, result.language),
                "duration": result.duration, "text": result.text,
                "segments": [_segment_json(x) for x in result.segments], "usage": usage}
        if "word" in grains:
            body["words"] = [{"word": w.word, "start": w.start, "end": w.end}
                             for x in result.segments for w in (x.words or ())]
        return JSONResponse(body)

    def audio_endpoint(task):
        async def handle(request):
            form, data = await audio_form(request)
            w = worker(form.get("model") or None, "transcription")
            opts, fmt, grains, stream = audio_options(form, task)
            payload = {"inputs": [data], "options": opts}
            if w.model.is_multilingual is False and (task == "translate" or
                                                     "language" in opts):
                opts.pop("language", None)
                if task == "translate":
                    raise _bad("this model is English-only: it does not translate",
                               param="model")
            if stream:
                return audio_stream(request, w, payload)
            result, _ = await run_job(request, w, payload,
                                      key=TranscriptionWorker.job_key(payload),
                                      alone=s.audio_batch_size is None)
            return audio_response(result, task, fmt, grains)
        return handle

    def audio_stream(request, w, payload):
        def piece(item):                    # ("start", stream) or ("segment", segment)
            kind, seg = item
            if kind == "segment":
                return {"type": "transcript.text.delta", "delta": seg.text,
                        "segment": _segment_json(seg)}
            return None
        return stream_job(w, payload, piece,
                          lambda r: {"type": "transcript.text.done", "text": r[0].text},
                          lambda body: {"type": "error", "error": body})

    def stream_job(w, payload, piece_event, done_event, error_event):
        """A job run alone whose on_text items become server-sent events: piece_event(item)
        (None: nothing sent), then done_event(result) or error_event(error body)."""
        loop = asyncio.get_running_loop()
        events = asyncio.Queue()

        def put(item):
            loop.call_soon_threadsafe(events.put_nowait, item)

        job = Job(payload, lambda r, e: put(("end", r, e)), alone=True,
                  deadline=time.monotonic() + s.timeout,
                  on_text=lambda item: put(("item", item, None)))
        _submit(w, job)

        async def gen():
            end = time.monotonic() + s.timeout
            try:
                while True:
                    try:
                        kind, value, err = await asyncio.wait_for(
                            events.get(), max(0.0, end - time.monotonic()))
                    except asyncio.TimeoutError:
                        yield _sse(error_event(_error_body(_timeout(s))))
                        return
                    if kind == "item":
                        ev = piece_event(value)
                        if ev is not None:
                            yield _sse(ev)
                        continue
                    if err is not None:
                        yield _sse(error_event(_error_body(_mapped(err))))
                    else:
                        yield _sse(done_event(value))
                    return
            finally:
                job.cancel()

        return StreamingResponse(gen(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    async def languages(request):
        """LibreTranslate's GET /languages: each source code, its name, the codes it goes to."""
        langs = {}
        for w in workers.values():
            if w.kind != "translation":
                continue
            names = _language_names(w.model)
            for a in w.model.source_languages:
                entry = langs.setdefault(a, {"code": a, "name": names.get(a, a), "targets": []})
                for b in w.model.target_languages:
                    if b not in entry["targets"]:
                        entry["targets"].append(b)
        return JSONResponse(list(langs.values()))

    async def list_models(request):
        return JSONResponse({"object": "list", "data": [
            {"id": n, "object": "model", "created": created, "owned_by": "fastattn",
             "kind": w.kind} for n, w in workers.items()]})

    async def health(request):
        return JSONResponse({"status": "ok"})

    async def prometheus(request):
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def http_error(request, exc):
        return _error_response(ServeError(exc.status_code, exc.detail or "error",
                                          code="not_found" if exc.status_code == 404 else None,
                                          headers=getattr(exc, "headers", None)))

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        for hub in hubs.values():
            await asyncio.get_running_loop().run_in_executor(None, hub.close)
        for w in workers.values():
            await asyncio.get_running_loop().run_in_executor(None, w.close)

    routes = [endpoint("/v1/embeddings", embeddings, ["POST"]),
              endpoint("/translate", translate, ["POST"]),
              endpoint("/translate/stream", translate_stream, ["POST"]),
              endpoint("/languages", languages, ["GET"], open_=True),
              endpoint("/v1/audio/transcriptions", audio_endpoint("transcribe"), ["POST"]),
              endpoint("/v1/audio/translations", audio_endpoint("translate"), ["POST"]),
              endpoint("/v1/models", list_models, ["GET"]),
              endpoint("/health", health, ["GET"], open_=True),
              endpoint("/metrics", prometheus, ["GET"])]
    hubs = realtime.hubs_for(workers, s, metrics)
    if hubs:
        routes.append(realtime.realtime_route(hubs, s, metrics))
    application = Starlette(routes=routes, lifespan=lifespan,
                            exception_handlers={HTTPException: http_error})
    application.state.fastattn_workers = workers
    application.state.fastattn_metrics = metrics
    return application


def _submit(w, job):
    try:
        w.submit(job)
    except QueueFull:
        raise ServeError(429, f"the queue of model {w.name!r} is full; retry later",
                         type="rate_limit_error", code="queue_full",
                         headers={"Retry-After": "1"}) from None


def _timeout(s):
    return ServeError(504, f"the request did not complete within {s.timeout:g} s",
                      type="timeout_error", code="timeout")


def _mapped(err):
    if isinstance(err, ServeError):
        return err
    if isinstance(err, Dropped):
        return ServeError(504, "the request was dropped before it ran", type="timeout_error",
                          code="timeout")
    if isinstance(err, (ValueError, TypeError)):
        return _bad(str(err))
    print(f"fastattn serve: internal error: {type(err).__name__}: {err}", file=sys.stderr)
    return ServeError(500, "internal server error", type="server_error")


def _job_result(fut):
    err = fut.exception()
    if err is not None:
        raise _mapped(err)
    return fut.result()


def _error_body(err):
    return {"message": err.message, "type": err.type, "param": err.param, "code": err.code}


def _segment_json(x):
    return {"id": x.id, "seek": x.seek, "start": x.start, "end": x.end, "text": x.text,
            "tokens": x.tokens, "temperature": x.temperature, "avg_logprob": x.avg_logprob,
            "compression_ratio": x.compression_ratio, "no_speech_prob": x.no_speech_prob}


def _sse(obj):
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _disconnected(request):
    """Returns when the client has gone (the body is read by then)."""
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return

