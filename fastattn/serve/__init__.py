"""`fastattn serve`: an HTTP server for embedding, translation and Whisper model folders.

    fastattn serve --model minilm=all-MiniLM-L6-v2 --model en-de=opus-mt-en-de --model whisper=whisper-base

Endpoints: ``POST /v1/embeddings`` (OpenAI's schema), ``POST /translate`` and
``POST /translate/stream`` (LibreTranslate's fields plus fastattn's decoding controls; the stream
as server-sent events), ``POST /v1/audio/transcriptions`` and ``/v1/audio/translations``
(OpenAI's), ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus).
Concurrent requests are batched together by one worker thread per model; every response is what
the in-process call gives for that request alone (embeddings bit for bit, translations string
for string). :func:`app` returns the ASGI application, to embed in another one. See
docs/serve.md. Needs ``pip install "fastattn[serve]"`` (starlette, uvicorn, prometheus-client).
"""
import os
import sys

from ._app import Settings, app, load_models

__all__ = ["app", "Settings", "load_models", "add_arguments", "run"]


def add_arguments(p):
    p.add_argument("--model", action="append", required=True, metavar="NAME=FOLDER",
                   help="a model folder to serve under NAME (repeatable); the kind (embedding "
                        "or translation) comes from the folder. NAME defaults to the folder's "
                        "name")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--quantize", choices=["int8", "bfloat16"], default=None,
                   help="int8 or bfloat16 weights")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="OpenMP threads per model's forward passes (default: fastattn's)")
    p.add_argument("--max-batch-tokens", type=int, default=8192, metavar="N",
                   help="padded tokens per forward pass of a batch of requests (default 8192)")
    p.add_argument("--no-batching", action="store_true",
                   help="run each request alone, one input per forward pass (for comparison)")
    p.add_argument("--max-queue", type=int, default=64, metavar="N",
                   help="requests waiting per model before 429 (default 64)")
    p.add_argument("--max-inputs", type=int, default=2048, metavar="N",
                   help="inputs per request (default 2048)")
    p.add_argument("--max-body-bytes", type=int, default=4 << 20, metavar="N",
                   help="JSON body size limit (default 4 MiB)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                   help="per-request deadline (default 60)")
    p.add_argument("--body-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="time allowed for a request body to arrive (default 10)")
    p.add_argument("--max-audio-bytes", type=int, default=25 << 20, metavar="N",
                   help="audio file size limit (default 25 MiB, as OpenAI's)")
    p.add_argument("--audio-batch-size", type=int, default=None, metavar="N",
                   help="transcribe concurrent requests together, their speech windows "
                        "decoded N at a time (voice-activity detection cuts the windows); "
                        "default: one file at a time, sequential long form")
    p.add_argument("--vad-model", choices=("silero", "webrtc"), default="silero",
                   help="the voice-activity detector of --audio-batch-size (default silero)")
    p.add_argument("--realtime-max-sessions", type=int, default=16, metavar="N",
                   help="open /v1/realtime transcription sessions at most (default 16)")
    p.add_argument("--realtime-max-buffer-bytes", type=int, default=4 << 20, metavar="N",
                   help="PCM16 a realtime session may hold undecoded (default 4 MiB)")
    p.add_argument("--realtime-idle-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="close a realtime session silent this long (default 60)")
    p.add_argument("--api-key", default=None,
                   help="require Authorization: Bearer KEY (default: FASTATTN_API_KEY if set; "
                        "/health stays open)")


def _model_specs(values):
    out = {}
    for v in values:
        name, sep, folder = v.partition("=")
        if not sep:
            name, folder = os.path.basename(os.path.normpath(v)), v
            if name.endswith(".argosmodel"):               # an Argos package's file
                name = name[:-len(".argosmodel")]
        if not name or not folder:
            raise ValueError(f"--model {v!r}: expected NAME=FOLDER")
        if name in out:
            raise ValueError(f"--model: the name {name!r} is given twice")
        out[name] = folder
    return out


def run(args):
    """The `fastattn serve` command: load the models (a failure: one line on stderr, exit 2),
    then serve until SIGINT / SIGTERM (in-flight requests are answered first)."""
    try:
        import uvicorn
    except ImportError:
        print("fastattn serve: error: needs uvicorn, starlette and prometheus-client "
              "(pip install \"fastattn[serve]\")", file=sys.stderr)
        return 2
    key = args.api_key if args.api_key is not None else os.environ.get("FASTATTN_API_KEY")
    try:
        settings = Settings(max_batch_tokens=args.max_batch_tokens, max_queue=args.max_queue,
                            max_inputs=args.max_inputs, max_body_bytes=args.max_body_bytes,
                            timeout=args.timeout, body_timeout=args.body_timeout,
                            api_key=key or None, batching=not args.no_batching,
                            max_audio_bytes=args.max_audio_bytes,
                            audio_batch_size=args.audio_batch_size, vad_model=args.vad_model,
                            realtime_max_sessions=args.realtime_max_sessions,
                            realtime_max_buffer_bytes=args.realtime_max_buffer_bytes,
                            realtime_idle_timeout=args.realtime_idle_timeout)
        application = app(_model_specs(args.model), quantize=args.quantize,
                          threads=args.threads, settings=settings)
    except Exception as exc:                      # noqa: BLE001: one line, never a traceback
        msg = " ".join((str(exc) or type(exc).__name__).split())
        print(f"fastattn serve: error: {msg}", file=sys.stderr)
        return 2
    config = uvicorn.Config(application, host=args.host, port=args.port, log_level="warning",
                            access_log=False, lifespan="on",
                            timeout_graceful_shutdown=int(settings.timeout) + 5)
    server = uvicorn.Server(config)
    names = ", ".join(f"{n} ({w.kind})" for n, w in application.state.fastattn_workers.items())
    print(f"fastattn serve: http://{args.host}:{args.port} serving {names}", file=sys.stderr,
          flush=True)
    server.run()
    return 0
