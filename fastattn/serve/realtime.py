"""OpenAI's Realtime API transcription sessions over WebSocket: /v1/realtime?intent=transcription.

A client connects (``Authorization: Bearer KEY`` where the server has an API key), configures
the session (``session.update`` with ``session.type = "transcription"``, or the beta API's
``transcription_session.update``), streams base64 PCM16 (24 kHz mono, the API's format) with
``input_audio_buffer.append``, and receives ``input_audio_buffer.speech_started`` /
``speech_stopped`` / ``committed`` and ``conversation.item.input_audio_transcription.delta``
(each delta confirmed words, never retracted) / ``.completed`` (an utterance's whole text).
``input_audio_buffer.commit`` closes the utterance now (without turn detection: the only way),
``input_audio_buffer.clear`` drops the audio not yet transcribed. A bad frame (not JSON, an
unknown type, bad base64, odd PCM bytes, too much audio) gets an ``error`` event and the
connection stays; a client that vanishes is cleaned up.

Each live session is a :class:`fastattn.audio.live.LiveSession`; one worker thread per model
steps them all as a :class:`~fastattn.audio.live.LiveGroup`, so the concurrent sessions' decodings
share batches, each session's events bitwise what it gives alone.
"""
import asyncio
import base64
import binascii
import hmac
import itertools
import json
import sys
import threading

__all__ = ["RealtimeHub", "realtime_route", "INPUT_RATE"]

INPUT_RATE = 24000                       # the Realtime API's PCM16 rate
_ids = itertools.count(1)


def _id(prefix):
    return f"{prefix}_{next(_ids):08d}"


class _Conn:
    """One WebSocket's state, shared by its handler and the hub's thread."""

    def __init__(self, loop, out, options, model):
        self.loop, self.out = loop, out
        self.loop_thread = threading.get_ident()     # made in the event loop's thread
        self.options, self.model = options, model
        self.session = None                      # the LiveSession, made at the first audio
        self.item = None                         # the utterance's item id
        self.previous = None
        self.pending_bytes = 0
        self.queued = 0                          # commands the hub has not finished
        self.closed = False

    def emit(self, event):
        if not self.closed:
            event.setdefault("event_id", _id("event"))
            if threading.get_ident() == self.loop_thread:
                self.out.put_nowait(event)           # in order with the handler's own puts
            else:
                self.loop.call_soon_threadsafe(self.out.put_nowait, event)


class RealtimeHub:
    """The live sessions of one Transcriber: a thread applies their commands (audio, commit,
    clear, close) and steps them together (:class:`~fastattn.audio.live.LiveGroup`)."""

    def __init__(self, name, transcriber, *, max_sessions, metrics=None):
        """metrics: a prometheus Histogram of the decodings per batch, or None."""
        from ..audio.live import LiveGroup
        self.name, self.tr = name, transcriber
        self.group = LiveGroup(transcriber)
        self.max_sessions = max_sessions
        self.conns = set()
        self.commands = []
        self.cond = threading.Condition()
        self.metrics = metrics
        self.stopped = False
        self.thread = threading.Thread(target=self._loop, name=f"fastattn-realtime-{name}",
                                       daemon=True)
        self.thread.start()

    def _observe(self, n):
        if self.metrics is not None:
            self.metrics.observe(n)

    def open(self, conn):
        with self.cond:
            if len(self.conns) >= self.max_sessions:
                return False
            self.conns.add(conn)
        return True

    def send(self, kind, conn, *args):
        with self.cond:
            conn.queued += 1
            self.commands.append((kind, conn) + args)
            self.cond.notify()

    def close(self):
        with self.cond:
            self.stopped = True
            self.cond.notify()
        self.thread.join(timeout=30)

    def _loop(self):
        while True:
            with self.cond:
                while not self.commands and not self.stopped:
                    self.cond.wait()
                if self.stopped:
                    return
                commands, self.commands = self.commands, []
            for command in commands:
                if command[0] in ("commit", "clear"):
                    self._step_all()      # everyone's due steps batched before a commit
                try:
                    self._apply(*command)
                except Exception as exc:                  # noqa: BLE001: the session's error
                    conn = command[1]
                    code = "invalid_value" if isinstance(exc, (ValueError, TypeError)) \
                        else "server_error"
                    conn.emit(_error(str(exc), code=code))
                    if code == "server_error":
                        print(f"fastattn serve: realtime: {type(exc).__name__}: {exc}",
                              file=sys.stderr)
            self._step_all()
            with self.cond:
                for command in commands:
                    command[1].queued -= 1

    def _step_all(self):
        """Every open session's due steps, their decodings batched; events delivered."""
        live = [c for c in list(self.conns) if c.session is not None and not c.closed]
        by_session = {c.session: c for c in live}
        try:
            results = self.group.run([c.session for c in live], self._observe)
        except Exception as exc:                          # noqa: BLE001
            print(f"fastattn serve: realtime: {type(exc).__name__}: {exc}", file=sys.stderr)
            for c in live:
                c.emit(_error("internal server error", code="server_error"))
            return
        for session, events in results.items():
            conn = by_session[session]
            conn.pending_bytes = 2 * (session._fed - session._done) * INPUT_RATE // 16000
            _deliver(conn, events)

    def _apply(self, kind, conn, *args):
        if kind == "close":
            conn.closed = True
            with self.cond:
                self.conns.discard(conn)
            if conn.session is not None:
                self.group.close(conn.session)
            return
        if kind == "append":
            if conn.session is None:
                conn.session = self.group.session(**conn.options)
            conn.session.push(args[0], sample_rate=INPUT_RATE)
            return
        if conn.session is None:
            if kind == "commit":
                conn.emit(_error("the input audio buffer is empty: nothing to commit",
                                 code="input_audio_buffer_commit_empty"))
            else:
                conn.emit({"type": "input_audio_buffer.cleared"})
            return
        if kind == "commit":
            _deliver(conn, conn.session._run_alone())     # the audio's own turns first
            events = conn.session.commit()
            if not any(type(e).__name__ == "UtteranceEnd" for e in events):
                events.append(_Done(conn.session.seconds))
            _deliver(conn, events, committed_by_client=True)
        elif kind == "clear":
            conn.session.clear()
            conn.item = None
            conn.emit({"type": "input_audio_buffer.cleared"})


class _Done:
    """A commit without an utterance in progress: an empty completed item."""

    def __init__(self, end):
        self.text, self.start, self.end = "", end, end


def _deliver(conn, events, committed_by_client=False):
    """The live session's events as the Realtime API's."""
    from ..audio.live import Confirmed, SpeechStart, UtteranceEnd
    for e in events:
        if isinstance(e, SpeechStart):
            conn.item = _id("item")
            conn.emit({"type": "input_audio_buffer.speech_started",
                       "audio_start_ms": int(round(e.start * 1000)), "item_id": conn.item})
        elif isinstance(e, Confirmed):
            if conn.item is None:
                conn.item = _id("item")
            conn.emit({"type": "conversation.item.input_audio_transcription.delta",
                       "item_id": conn.item, "content_index": 0, "delta": e.text})
        elif isinstance(e, (UtteranceEnd, _Done)):
            item = conn.item or _id("item")
            if conn.options.get("vad") is not None and not committed_by_client and \
                    isinstance(e, UtteranceEnd):
                conn.emit({"type": "input_audio_buffer.speech_stopped",
                           "audio_end_ms": int(round(e.end * 1000)), "item_id": item})
            conn.emit({"type": "input_audio_buffer.committed", "item_id": item,
                       "previous_item_id": conn.previous})
            conn.emit({"type": "conversation.item.input_audio_transcription.completed",
                       "item_id": item, "content_index": 0, "transcript": e.text,
                       "usage": {"type": "duration",
                                 "seconds": round(max(e.end - e.start, 0.0), 3)}})
            conn.previous, conn.item = item, None


def _error(message, *, code=None, param=None, event_id=None, type="invalid_request_error"):
    return {"type": "error", "error": {"type": type, "code": code, "message": message,
                                       "param": param, "event_id": event_id}}


def _session_json(conn, beta):
    o = conn.options
    td = None if o.get("vad") is None else {
        "type": "server_vad", "threshold": o.get("vad_threshold", 0.5),
        "prefix_padding_ms": o.get("speech_pad_ms", 300),
        "silence_duration_ms": o.get("silence_ms", 700)}
    tx = {"model": conn.model, "language": o.get("language"),
          "prompt": o.get("initial_prompt") or ""}
    if beta:
        return {"object": "realtime.transcription_session", "input_audio_format": "pcm16",
                "input_audio_transcription": tx, "turn_detection": td, "modalities": ["text"]}
    return {"type": "transcription", "object": "realtime.transcription_session",
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": INPUT_RATE},
                                "transcription": tx, "turn_detection": td,
                                "noise_reduction": None}}}


def _update(conn, session, beta, models, vad_model):
    """Apply a session update (GA or beta layout) to conn.options; ValueError on a bad field."""
    if not isinstance(session, dict):
        raise ValueError("session must be an object")
    if beta:
        fmt = session.get("input_audio_format", "pcm16")
        if fmt != "pcm16":
            raise ValueError(f"input_audio_format: only 'pcm16' (24 kHz) is supported, got "
                             f"{fmt!r}")
        tx, td = session.get("input_audio_transcription"), session.get("turn_detection", ...)
    else:
        if session.get("type", "transcription") != "transcription":
            raise ValueError("session.type: this endpoint serves 'transcription' sessions")
        audio = session.get("audio") or {}
        inp = audio.get("input") or {} if isinstance(audio, dict) else {}
        if not isinstance(inp, dict):
            raise ValueError("session.audio.input must be an object")
        fmt = inp.get("format")
        if fmt is not None and (not isinstance(fmt, dict) or
                                fmt.get("type", "audio/pcm") != "audio/pcm" or
                                fmt.get("rate", INPUT_RATE) != INPUT_RATE):
            raise ValueError(f"audio.input.format: only audio/pcm at {INPUT_RATE} Hz is "
                             f"supported, got {fmt!r}")
        tx, td = inp.get("transcription"), inp.get("turn_detection", ...)
    opts = dict(conn.options)
    if tx is not None:
        if not isinstance(tx, dict):
            raise ValueError("transcription must be an object")
        model = tx.get("model")
        if model is not None and model in models:
            conn.model = model
        if "language" in tx:
            opts["language"] = tx["language"] or None
        if "prompt" in tx:
            opts["initial_prompt"] = tx["prompt"] or None
    if td is None:
        opts["vad"] = None
    elif td is not ...:
        if not isinstance(td, dict) or td.get("type", "server_vad") != "server_vad":
            raise ValueError("turn_detection: only {'type': 'server_vad'} or null is supported")
        opts["vad"] = vad_model
        for key, name in (("silence_duration_ms", "silence_ms"),
                          ("prefix_padding_ms", "speech_pad_ms"), ("threshold", "vad_threshold")):
            if td.get(key) is not None:
                opts[name] = td[key]
    from ..audio.live import _Config
    _Config(models[conn.model], **opts)                  # checks every value
    conn.options = opts


def realtime_route(hubs, settings, metrics=None):
    """The Starlette WebSocketRoute of ``/v1/realtime`` over `hubs` ({model name:
    RealtimeHub}); settings: the app's :class:`~fastattn.serve.Settings`."""
    from starlette.routing import WebSocketRoute
    from starlette.websockets import WebSocketDisconnect
    gauge = counter = None
    if metrics is not None:
        from prometheus_client import Counter, Gauge
        gauge = Gauge("fastattn_realtime_sessions", "open realtime transcription sessions",
                      ["model"], registry=metrics.registry)
        counter = Counter("fastattn_realtime_errors", "error events sent to realtime clients",
                          ["code"], registry=metrics.registry)
    models = {name: hub.tr for name, hub in hubs.items()}

    async def handle(ws):
        await ws.accept()
        if settings.api_key is not None:
            auth = ws.headers.get("authorization", "")
            scheme, _, key = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                    key.strip().encode(), settings.api_key.encode()):
                await ws.send_json(_error("a valid API key is required (Authorization: Bearer "
                                          "KEY)", code="invalid_api_key",
                                          type="authentication_error"))
                await ws.close(code=1008)
                return
        name = ws.query_params.get("model")
        if name not in hubs:
            if len(hubs) != 1:
                await ws.send_json(_error(f"model: give one of {', '.join(hubs) or 'none'}",
                                          code="model_not_found", param="model"))
                await ws.close(code=1008)
                return
            name = next(iter(hubs))
        out = asyncio.Queue()
        conn = _Conn(asyncio.get_running_loop(), out,
                     {"vad": settings.vad_model, "silence_ms": 500}, name)
        hub = hubs[name]
        if not hub.open(conn):
            await ws.send_json(_error(f"too many realtime sessions (at most "
                                      f"{hub.max_sessions}); retry later",
                                      code="too_many_sessions", type="rate_limit_error"))
            await ws.close(code=1013)
            return
        if gauge is not None:
            gauge.labels(name).inc()
        sid = _id("sess")
        conn.emit({"type": "session.created", "session": dict(_session_json(conn, False),
                                                              id=sid)})
        conn.emit({"type": "transcription_session.created",
                   "session": dict(_session_json(conn, True), id=sid)})

        async def sender():
            while True:
                event = await out.get()
                if event is None:
                    return
                if event["type"] == "error" and counter is not None:
                    counter.labels(str(event["error"].get("code"))).inc()
                await ws.send_text(json.dumps(event, ensure_ascii=False))

        task = asyncio.ensure_future(sender())
        try:
            while True:
                try:
                    msg = await asyncio.wait_for(ws.receive(), settings.realtime_idle_timeout)
                except asyncio.TimeoutError:
                    if conn.queued:          # the client waits for its audio's transcription
                        continue
                    conn.emit(_error(f"no event for {settings.realtime_idle_timeout:g} s: "
                                     "closing the session", code="idle_timeout"))
                    break
                if msg["type"] == "websocket.disconnect":
                    break
                _receive(conn, hub, msg, settings, models)
        except WebSocketDisconnect:
            pass
        finally:
            hub.send("close", conn)
            if gauge is not None:
                gauge.labels(name).dec()
            out.put_nowait(None)
            try:
                await asyncio.wait_for(task, 5)
            except Exception:                           # noqa: BLE001: the client is gone
                task.cancel()
            try:
                await ws.close()
            except Exception:                           # noqa: BLE001: already closed
                pass

    return WebSocketRoute("/v1/realtime", handle)


def _receive(conn, hub, msg, settings, models):
    """One client frame: commands for the hub, or an error event."""
    text = msg.get("text")
    if text is None:
        data = msg.get("bytes") or b""
        text = data.decode("utf-8", "replace")
    limit = settings.realtime_max_buffer_bytes * 4 // 3 + 4096
    if len(text) > limit:
        conn.emit(_error(f"the frame holds {len(text)} bytes, over {limit}",
                         code="frame_too_large"))
        return
    try:
        event = json.loads(text)
    except ValueError:
        conn.emit(_error("the frame is not JSON", code="invalid_json"))
        return
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        conn.emit(_error("an event must be a JSON object with a 'type'",
                         code="invalid_event"))
        return
    kind, eid = event["type"], event.get("event_id")
    if kind in ("session.update", "transcription_session.update"):
        beta = kind.startswith("transcription_session")
        if conn.session is not None:
            conn.emit(_error("the session has audio already: update it before the first "
                             "input_audio_buffer.append", code="session_started",
                             event_id=eid))
            return
        try:
            _update(conn, event.get("session"), beta, models, settings.vad_model)
        except (ValueError, TypeError) as exc:
            conn.emit(_error(str(exc), code="invalid_value", param="session", event_id=eid))
            return
        conn.emit({"type": "transcription_session.updated" if beta else "session.updated",
                   "session": _session_json(conn, beta)})
    elif kind == "input_audio_buffer.append":
        audio = event.get("audio")
        if not isinstance(audio, str):
            conn.emit(_error("audio must be a base64 string", code="invalid_value",
                             param="audio", event_id=eid))
            return
        try:
            pcm = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            conn.emit(_error("audio is not valid base64", code="invalid_value",
                             param="audio", event_id=eid))
            return
        if len(pcm) % 2:
            conn.emit(_error("audio: PCM16 needs an even number of bytes",
                             code="invalid_value", param="audio", event_id=eid))
            return
        if conn.pending_bytes + len(pcm) > settings.realtime_max_buffer_bytes:
            conn.emit(_error(f"the input audio buffer would exceed "
                             f"{settings.realtime_max_buffer_bytes} bytes",
                             code="input_audio_buffer_full", param="audio", event_id=eid))
            return
        conn.pending_bytes += len(pcm)
        if pcm:
            hub.send("append", conn, pcm)
    elif kind == "input_audio_buffer.commit":
        hub.send("commit", conn)
    elif kind == "input_audio_buffer.clear":
        hub.send("clear", conn)
    else:
        conn.emit(_error(f"unknown event type {kind!r}", code="unknown_event", param="type",
                         event_id=eid))


def hubs_for(workers, settings, metrics=None):
    """{name: RealtimeHub} for the Transcriber models among the app's workers."""
    from ..audio import Transcriber
    batch = None
    if metrics is not None:
        from prometheus_client import Histogram
        batch = Histogram("fastattn_realtime_batch_sessions", "live sessions' decodings per "
                          "batch (realtime transcription)", registry=metrics.registry,
                          buckets=(1, 2, 4, 8, 16, 32, 64))
    return {name: RealtimeHub(name, w.model, max_sessions=settings.realtime_max_sessions,
                              metrics=batch)
            for name, w in workers.items() if isinstance(getattr(w, "model", None),
                                                         Transcriber)}
