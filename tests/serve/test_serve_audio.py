"""`fastattn serve` with a Whisper folder: OpenAI's /v1/audio/transcriptions and
/v1/audio/translations, through the official openai client and httpx, against a subprocess
server. Every answer equals what the in-process Transcriber gives for that file alone
(sequential long form by default; with --audio-batch-size, concurrent requests' windows are
decoded together and each answer is still bitwise its own batched transcription)."""
import concurrent.futures as cf
import io
import json

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
sf = pytest.importorskip("soundfile")
pytest.importorskip("multipart")
pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import whisper_checkpoints as W  # noqa: E402 (tests/models on sys.path: serve_helpers)
from fastattn.audio import Transcriber, write_transcript  # noqa: E402


@pytest.fixture(scope="module")
def whisper_folder(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("serve_whisper"))
    W.make_checkpoint(path, multilingual=True, seed=3)
    W.write_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def transcriber(whisper_folder):
    return Transcriber(whisper_folder, n_threads=1)


def _wav(seconds, seed, silence=None):
    audio = W.speech_like(seconds, seed=seed)
    if silence:
        a, b = (int(t * 16000) for t in silence)
        audio[a:b] = 0.001 * np.random.default_rng(seed).standard_normal(b - a)
    buf = io.BytesIO()
    sf.write(buf, audio, 16000, format="WAV", subtype="FLOAT")
    return audio, buf.getvalue()


def _post(srv, data, path="/v1/audio/transcriptions", **fields):
    return httpx.post(srv.url + path, files={"file": ("a.wav", data, "audio/wav")},
                      data=fields, headers=srv.headers, timeout=120)


@pytest.mark.whole_model
def test_transcriptions_equal_in_process(start_server, whisper_folder, transcriber):
    srv = start_server({"whisper": whisper_folder})
    audio, data = _wav(8.0, 1)
    want = transcriber.transcribe(audio)
    r = _post(srv, data, model="whisper")
    assert r.status_code == 200, r.text
    assert r.json() == {"text": want.text, "usage": {"type": "duration", "seconds": 8}}
    # every response format
    r = _post(srv, data, model="whisper", response_format="verbose_json")
    body = r.json()
    assert body["task"] == "transcribe" and body["duration"] == pytest.approx(8.0)
    assert body["language"] == {"en": "english", "zh": "chinese", "de": "german",
                                "es": "spanish", "fr": "french"}[want.language]
    assert [(x["start"], x["end"], x["tokens"]) for x in body["segments"]] == \
        [(x.start, x.end, x.tokens) for x in want.segments]
    for fmt in ("srt", "vtt"):
        f = io.StringIO()
        write_transcript(want, f, fmt)
        assert _post(srv, data, model="whisper", response_format=fmt).text == f.getvalue()
    assert _post(srv, data, model="whisper", response_format="text").text == want.text
    # language, prompt, temperature, translation
    got = _post(srv, data, model="whisper", language="de", prompt="w5 w6",
                temperature="0.4").json()["text"]
    assert got == transcriber.transcribe(audio, language="de", initial_prompt="w5 w6",
                                         temperature=(0.4,)).text
    got = _post(srv, data, "/v1/audio/translations", model="whisper").json()["text"]
    assert got == transcriber.transcribe(audio, task="translate").text
    # word timestamps
    body = _post(srv, data, model="whisper", response_format="verbose_json",
                 **{"timestamp_granularities[]": "word"}).json()
    words = transcriber.transcribe(audio, word_timestamps=True)
    assert body["words"] == [{"word": w.word, "start": w.start, "end": w.end}
                             for x in words.segments for w in x.words]


@pytest.mark.whole_model
def test_openai_client(start_server, whisper_folder, transcriber):
    openai = pytest.importorskip("openai")
    srv = start_server({"whisper": whisper_folder})
    audio, data = _wav(6.0, 2)
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key=srv.key)
    out = client.audio.transcriptions.create(model="whisper", file=("a.wav", data))
    assert out.text == transcriber.transcribe(audio).text
    out = client.audio.transcriptions.create(model="whisper", file=("a.wav", data),
                                             response_format="verbose_json",
                                             timestamp_granularities=["segment"])
    assert [s.start for s in out.segments] == [s.start for s in transcriber.transcribe(
        audio).segments]
    out = client.audio.translations.create(model="whisper", file=("a.wav", data))
    assert out.text == transcriber.transcribe(audio, task="translate").text


def test_streamed_segments(start_server, whisper_folder, transcriber):
    srv = start_server({"whisper": whisper_folder})
    audio, data = _wav(9.0, 3)
    want = transcriber.transcribe(audio)
    with httpx.stream("POST", srv.url + "/v1/audio/transcriptions", headers=srv.headers,
                      files={"file": ("a.wav", data)}, data={"stream": "true"},
                      timeout=120) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "transcript.text.delta"]
    assert [e["delta"] for e in deltas] == [s.text for s in want.segments]
    assert events[-1] == {"type": "transcript.text.done", "text": want.text}


def test_concurrent_requests_batched_equal_alone(start_server, whisper_folder):
    pytest.importorskip("webrtcvad")
    srv = start_server({"whisper": whisper_folder}, "--audio-batch-size", "4",
                       "--vad-model", "webrtc")
    tr = Transcriber(whisper_folder)
    clips = [_wav(3.0 + 1.7 * i, 10 + i, silence=(1.0, 2.0)) for i in range(8)]
    with cf.ThreadPoolExecutor(8) as pool:
        futs = [pool.submit(_post, srv, data, model="whisper", response_format="verbose_json")
                for _, data in clips]
        got = [f.result() for f in futs]
    for (audio, _), r in zip(clips, got):
        assert r.status_code == 200, r.text
        want = tr.transcribe(audio, batch_size=4, vad_model="webrtc")
        assert [(x["start"], x["end"], x["tokens"]) for x in r.json()["segments"]] == \
            [(x.start, x.end, x.tokens) for x in want.segments]
    metrics = httpx.get(srv.url + "/metrics", headers=srv.headers, timeout=10).text
    line = [x for x in metrics.splitlines()
            if x.startswith('fastattn_batch_requests_count{model="whisper"}')][0]
    assert float(line.split()[-1]) < 8                   # some requests were batched together


@pytest.mark.parametrize("case", ["no_file", "empty", "junk", "format", "temperature",
                                  "json_body", "too_big", "words_need_verbose", "model"])
def test_bad_requests_are_4xx_and_the_server_keeps_serving(start_server, whisper_folder, case):
    srv = start_server({"whisper": whisper_folder}, "--max-audio-bytes", "200000")
    _, data = _wav(2.0, 4)
    url = srv.url + "/v1/audio/transcriptions"
    h = srv.headers
    if case == "no_file":
        r = httpx.post(url, data={"model": "whisper"}, files={"x": ("a", b"1")}, headers=h)
    elif case == "empty":
        r = _post(srv, b"")
    elif case == "junk":
        r = _post(srv, b"RIFF\x00\x00junk" * 100)
    elif case == "format":
        r = _post(srv, data, response_format="docx")
    elif case == "temperature":
        r = _post(srv, data, temperature="hot")
    elif case == "json_body":
        r = httpx.post(url, json={"file": "a.wav"}, headers=h)
    elif case == "too_big":
        r = _post(srv, b"\x00" * 300000)
    elif case == "words_need_verbose":
        r = _post(srv, data, **{"timestamp_granularities[]": "word"})
    else:
        r = _post(srv, data, model="nope")
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    err = r.json()["error"]
    assert err["message"] and "Traceback" not in r.text
    ok = _post(srv, data)
    assert ok.status_code == 200 and "text" in ok.json()
    assert srv.proc.poll() is None
