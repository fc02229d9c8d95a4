"""`fastattn serve` end to end: a subprocess on a loopback port, the official openai client and
httpx, every response compared with the in-process call for that request alone."""
import base64
import concurrent.futures as cf
import json
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from serve_helpers import API_KEY, mixed_sentences

import fastattn

httpx = pytest.importorskip("httpx")


@pytest.fixture(scope="module")
def encoder(bert_folder):
    return fastattn.SentenceEncoder(bert_folder)


@pytest.fixture(scope="module")
def translator(marian_folder):
    return fastattn.Translator(marian_folder)


def _bert_and_mt(start_server, bert_folder, marian_folder, *args):
    return start_server({"bert": bert_folder, "mt": marian_folder},
                        "--max-inputs", "64", "--max-batch-tokens", "512", *args)


@pytest.fixture
def server(start_server, bert_folder, marian_folder):
    return _bert_and_mt(start_server, bert_folder, marian_folder)


@pytest.fixture
def hostile_server(start_server, bert_folder, marian_folder):
    """As `server`, with a 2 s body timeout for the half-sent body. Only here: under load (48
    clients, a sanitizer build) a whole small body can take over a second to be read."""
    return _bert_and_mt(start_server, bert_folder, marian_folder, "--body-timeout", "2")


def alive(server):
    r = httpx.get(server.url + "/health", timeout=10)
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    r = httpx.post(server.url + "/v1/embeddings", headers=server.headers, timeout=30,
                   json={"model": "bert", "input": "still serving"})
    assert r.status_code == 200, r.text


def embed(server, inputs, **kw):
    r = httpx.post(server.url + "/v1/embeddings", headers=server.headers, timeout=60,
                   json={"model": "bert", "input": inputs, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def test_embeddings_openai_client(server, encoder):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0,
                           timeout=60)
    texts = mixed_sentences(0, 6)
    for fmt in ("float", "base64"):
        res = client.embeddings.create(model="bert", input=texts, encoding_format=fmt)
        assert [d.index for d in res.data] == list(range(len(texts)))
        for d, t in zip(res.data, texts):
            if isinstance(d.embedding, str):
                got = np.frombuffer(base64.b64decode(d.embedding), dtype="<f4")
            else:
                got = np.asarray(d.embedding, dtype=np.float32)
            np.testing.assert_array_equal(got, encoder.encode([t])[0])
        ids, _ = encoder.tokenize(texts)
        assert res.usage.prompt_tokens == res.usage.total_tokens == sum(map(len, ids))
        assert max(map(len, ids)) == encoder.max_seq_length          # one was truncated
    one = client.embeddings.create(model="bert", input=texts[0], encoding_format="float")
    np.testing.assert_array_equal(np.float32(one.data[0].embedding), encoder.encode([texts[0]])[0])


def test_embeddings_base64_and_token_ids(server, encoder):
    texts = mixed_sentences(1, 3)
    out = embed(server, texts, encoding_format="base64")
    for d, t in zip(out["data"], texts):
        got = np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4")
        np.testing.assert_array_equal(got, encoder.encode([t])[0])
    ids, _ = encoder.tokenize(texts)
    long = ids[0] * 20                                      # past max_seq_length: truncated
    out = embed(server, [ids[1], long])
    for d, row in zip(out["data"], [ids[1], long[:encoder.max_seq_length]]):
        np.testing.assert_array_equal(np.float32(d["embedding"]), encoder.embed_ids([row])[0])
    assert out["usage"]["prompt_tokens"] == len(ids[1]) + encoder.max_seq_length
    flat = embed(server, ids[2])                            # one token array
    np.testing.assert_array_equal(np.float32(flat["data"][0]["embedding"]),
                                  encoder.encode([texts[2]])[0])


def test_minilm_openai(start_server, minilm):
    openai = pytest.importorskip("openai")
    srv = start_server({"all-MiniLM-L6-v2": minilm}, key=None)
    enc = fastattn.SentenceEncoder(minilm)
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0,
                           timeout=60)
    texts = ["A man is eating food.", "A man rides a horse.", "Ein Satz auf Deutsch."]
    for fmt in ("float", "base64"):
        res = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts,
                                       encoding_format=fmt)
        for d, t in zip(res.data, texts):
            got = (np.frombuffer(base64.b64decode(d.embedding), dtype="<f4")
                   if isinstance(d.embedding, str) else np.float32(d.embedding))
            np.testing.assert_array_equal(got, enc.encode([t])[0])


def test_embeddings_dense_folders(start_server, dense_folders):
    """sentence-transformers folders with Dense modules (tests/text/dense_folders.py; compared
    with SentenceTransformer.encode in tests/text/test_sentence_encoder_dense.py): each
    request's vectors are SentenceEncoder's bits, of the last module's width."""
    from dense_folders import SENTENCES
    srv = start_server(dense_folders, "--max-batch-tokens", "256")
    texts = [t for t in SENTENCES if t]
    for name, folder in dense_folders.items():
        enc = fastattn.SentenceEncoder(folder)
        want = enc.encode(texts)
        r = httpx.post(srv.url + "/v1/embeddings", headers=srv.headers, timeout=60,
                       json={"model": name, "input": texts, "dimensions": enc.dim})
        assert r.status_code == 200, r.text
        got = np.float32([d["embedding"] for d in r.json()["data"]])
        assert got.shape == (len(texts), enc.dim) and enc.dim != enc.model.hidden_size
        np.testing.assert_array_equal(got, want)
        ids, _ = enc.tokenize(texts[:2])              # token ids: the same path
        r = httpx.post(srv.url + "/v1/embeddings", headers=srv.headers, timeout=60,
                       json={"model": name, "input": ids})
        np.testing.assert_array_equal(np.float32([d["embedding"] for d in r.json()["data"]]),
                                      want[:2])


def test_bf16_server(start_server, bert_folder):
    """--quantize bfloat16: each embedding is SentenceEncoder(quantize='bfloat16')'s of the
    input alone (and not the float32 one)."""
    srv = start_server({"bert": bert_folder}, "--quantize", "bfloat16")
    enc = fastattn.SentenceEncoder(bert_folder, quantize="bfloat16")
    texts = mixed_sentences(2, 4)
    out = embed(srv, texts)
    for d, t in zip(out["data"], texts):
        np.testing.assert_array_equal(np.float32(d["embedding"]), enc.encode([t])[0])
    assert not np.array_equal(np.float32(out["data"][0]["embedding"]),
                              fastattn.SentenceEncoder(bert_folder).encode([texts[0]])[0])


def test_translate(server, translator):
    texts = mixed_sentences(2, 4)
    post = lambda body: httpx.post(server.url + "/translate", headers=server.headers,  # noqa
                                   json={"source": "en", "target": "de", **body}, timeout=60)
    r = post({"q": texts[0]})
    assert r.status_code == 200, r.text
    assert r.json() == {"translatedText": translator.translate([texts[0]])[0]}
    r = post({"q": texts, "model": "mt"})
    assert r.json()["translatedText"] == [translator.translate([t])[0] for t in texts]
    r = post({"q": texts, "num_beams": 3, "max_new_tokens": 7, "length_penalty": 0.5})
    assert r.json()["translatedText"] == [
        translator.translate([t], num_beams=3, max_new_tokens=7, length_penalty=0.5)[0]
        for t in texts]
    r = post({"q": texts[:2], "do_sample": True, "seed": 5, "top_k": 10})
    assert r.json()["translatedText"] == [
        translator.translate([t], do_sample=True, seed=5, top_k=10)[0] for t in texts[:2]]


def _sse(response):
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            events.append(json.loads(line[6:]))
    return events


@pytest.mark.parametrize("path,extra", [("/translate/stream", {}), ("/translate",
                                                                    {"stream": True})])
def test_translate_stream(server, translator, path, extra):
    text = mixed_sentences(3, 1)[0]
    with httpx.stream("POST", server.url + path, headers=server.headers, timeout=60,
                      json={"q": text, "max_new_tokens": 30, **extra}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = _sse(r)
    want = translator.translate([text], num_beams=1, max_new_tokens=30)[0]
    assert events[-1] == {"done": True, "translatedText": want}
    assert "".join(e["text"] for e in events[:-1]) == want
    r = httpx.post(server.url + path, headers=server.headers, timeout=30,
                   json={"q": text, "num_beams": 2, **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] == "num_beams"


def test_models_health_metrics(server):
    r = httpx.get(server.url + "/v1/models", headers=server.headers, timeout=10)
    assert r.status_code == 200
    assert {(m["id"], m["kind"]) for m in r.json()["data"]} == {("bert", "embedding"),
                                                                 ("mt", "translation")}
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200   # no key
    embed(server, ["a b c"])
    r = httpx.get(server.url + "/metrics", headers=server.headers, timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    for name in ('fastattn_requests_total{code="200",endpoint="/v1/embeddings"}',
                 "fastattn_request_latency_seconds_bucket", 'fastattn_queue_depth{model="bert"}',
                 'fastattn_batch_rows_count{model="bert"}', 'fastattn_tokens_total{model="bert"}',
                 'fastattn_tokens_per_second{model="bert"}'):
        assert name in text, name


def _metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def test_concurrent_embeddings_equal_alone(server, encoder):
    texts = mixed_sentences(4, 48)
    want = {t: encoder.encode([t])[0] for t in texts}

    def call(i):
        chunk = texts[i:i + 1 + i % 3]
        return chunk, embed(server, chunk, encoding_format="base64" if i % 2 else "float")

    with cf.ThreadPoolExecutor(48) as pool:
        results = list(pool.map(call, range(len(texts)), timeout=120))
    for chunk, out in results:
        for d, t in zip(out["data"], chunk):
            e = d["embedding"]
            got = (np.frombuffer(base64.b64decode(e), dtype="<f4") if isinstance(e, str)
                   else np.float32(e))
            np.testing.assert_array_equal(got, want[t])
    text = httpx.get(server.url + "/metrics", headers=server.headers, timeout=10).text
    one = _metric(text, 'fastattn_batch_requests_bucket{le="1.0",model="bert"}')
    count = _metric(text, 'fastattn_batch_requests_count{model="bert"}')
    assert count is not None and one < count, "no batch held more than one request"


def test_concurrent_translations_equal_alone(server, translator):
    texts = mixed_sentences(5, 32)
    want = {t: translator.translate([t], max_new_tokens=12)[0] for t in texts}

    def call(t):
        r = httpx.post(server.url + "/translate", headers=server.headers, timeout=120,
                       json={"q": t, "source": "en", "target": "de", "max_new_tokens": 12})
        assert r.status_code == 200, r.text
        return t, r.json()["translatedText"]

    with cf.ThreadPoolExecutor(32) as pool:
        for t, got in pool.map(call, texts, timeout=180):
            assert got == want[t]


def _raw(server, data, timeout=10.0):
    """Send raw bytes; the status line's code (None when the server closed without one)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as s:
        s.sendall(data)
        buf = b""
        try:
            while b"\r\n" not in buf:
                chunk = s.recv(4096)
                if not chunk:
                    break
                buf += chunk
        except socket.timeout:
            return "timeout"
    return int(buf.split()[1]) if buf.startswith(b"HTTP/") else None


def test_hostile_requests(hostile_server):
    server = hostile_server
    url, h = server.url, server.headers

    def post(path, **kw):
        return httpx.post(url + path, headers={**h, **kw.pop("headers", {})}, timeout=30, **kw)

    cases = [
        (post("/v1/embeddings", content=b"{not json"), 400, "invalid_json"),
        (post("/v1/embeddings", content=b"[1, 2]"), 400, "invalid_json"),
        (post("/v1/embeddings", json={"model": "bert", "input": 5}), 400, None),
        (post("/v1/embeddings", json={"model": "bert", "input": [1.5]}), 400, None),
        (post("/v1/embeddings", json={"model": "bert", "input": [[10 ** 9]]}), 400, None),
        (post("/v1/embeddings", json={"model": "bert", "input": ["a", 3]}), 400, None),
        (post("/v1/embeddings", json={"model": "bert", "input": []}), 400, None),
        (post("/v1/embeddings", json={"model": "bert", "input": ""}), 400, None),
        (post("/v1/embeddings", json={"model": "bert", "input": ["x"] * 65}), 400,
         "too_many_inputs"),
        (post("/v1/embeddings", json={"model": "bert", "input": "a", "encoding_format": "x"}),
         400, None),
        (post("/v1/embeddings", json={"model": 7, "input": "a"}), 400, None),
        (post("/v1/embeddings", json={"model": "nope", "input": "a"}), 404, "model_not_found"),
        (post("/v1/embeddings", json={"model": "mt", "input": "a"}), 404, "model_not_found"),
        (post("/v1/embeddings", content=b"x" * (10 << 20)), 413, "body_too_large"),
        (post("/v1/embeddings", json={"model": "bert", "input": "a"},
              headers={"Authorization": "Bearer wrong"}), 401, "invalid_api_key"),
        (httpx.post(url + "/v1/embeddings", json={"model": "bert", "input": "a"}, timeout=30),
         401, "invalid_api_key"),
        (httpx.get(url + "/metrics", timeout=30), 401, "invalid_api_key"),
        (post("/translate", json={"q": 3}), 400, None),
        (post("/translate", json={"q": ""}), 400, None),
        (post("/translate", json={"q": []}), 400, None),
        (post("/translate", json={"q": "a", "num_beams": "four"}), 400, None),
        (post("/translate", json={"q": "a", "num_beams": 0}), 400, None),
        (post("/translate", json={"q": "a", "max_new_tokens": 10 ** 9}), 400, None),
        (post("/translate", json={"q": "a", "format": "html"}), 400, None),
        (post("/translate", json={"q": "a", "model": "bert"}), 404, "model_not_found"),
        (post("/translate/stream", json={"q": ["a", "b"]}), 400, None),
        (post("/nothing", json={}), 404, None),
        (httpx.get(url + "/v1/embeddings", headers=h, timeout=30), 405, None),
    ]
    for i, (r, status, code) in enumerate(cases):
        assert r.status_code == status, (i, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}, (i, err)
        assert "Traceback" not in r.text
        if code is not None:
            assert err["code"] == code, (i, err)
        alive(server)
    # half a body, then silence: 408 after --body-timeout (2 s); others are served meanwhile
    with cf.ThreadPoolExecutor(1) as pool:
        hung = pool.submit(_raw, server, b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n"
                           b"Content-Type: application/json\r\nContent-Length: 1000\r\n"
                           b"Authorization: Bearer " + API_KEY.encode() + b"\r\n\r\n{\"inp")
        alive(server)
        assert hung.result(timeout=30) == 408
    alive(server)
    assert "Traceback" not in server.stderr()


def test_queue_full_429(start_server, marian_folder):
    srv = start_server({"mt": marian_folder}, "--max-queue", "1", key=None)
    body = {"q": mixed_sentences(6, 8), "num_beams": 4, "max_new_tokens": 60}

    def call(_):
        r = httpx.post(srv.url + "/translate", json=body, timeout=120)
        return r.status_code, r.headers.get("retry-after"), r.json()

    with cf.ThreadPoolExecutor(12) as pool:
        results = list(pool.map(call, range(12), timeout=240))
    codes = [c for c, _, _ in results]
    assert set(codes) <= {200, 429} and 429 in codes and 200 in codes, codes
    for c, retry, j in results:
        if c == 429:
            assert retry == "1" and j["error"]["code"] == "queue_full"
    assert httpx.get(srv.url + "/health", timeout=10).status_code == 200


def test_deadline_504(start_server, bert_folder):
    srv = start_server({"bert": bert_folder}, "--timeout", "0.01", key=None)
    texts = [" ".join(["word"] * 60)] * 2000
    r = httpx.post(srv.url + "/v1/embeddings", json={"model": "bert", "input": texts},
                   timeout=60)
    assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
    assert httpx.get(srv.url + "/health", timeout=10).status_code == 200


def test_client_gone_is_dropped(start_server, bert_folder):
    """A request whose client leaves while it waits is dropped, not computed."""
    srv = start_server({"bert": bert_folder}, key=None)
    busy = {"model": "bert", "input": [" ".join(["word"] * 60)] * 2000}
    with cf.ThreadPoolExecutor(1) as pool:
        first = pool.submit(httpx.post, srv.url + "/v1/embeddings", json=busy, timeout=60)
        end = time.monotonic() + 60                        # until the worker is on it
        while time.monotonic() < end and _metric(
                httpx.get(srv.url + "/metrics", timeout=10).text,
                'fastattn_batch_running{model="bert"}') != 1.0:
            time.sleep(0.01)
        body = json.dumps({"model": "bert", "input": ["left early"] * 500}).encode()
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\nContent-Length: " +
                      str(len(body)).encode() + b"\r\n\r\n" + body)
            time.sleep(0.05)
        assert first.result(timeout=60).status_code == 200
    end = time.monotonic() + 10
    while time.monotonic() < end:
        text = httpx.get(srv.url + "/metrics", timeout=10).text
        if _metric(text, 'fastattn_dropped_total{model="bert"}') == 1.0:
            break
        time.sleep(0.1)
    assert _metric(text, 'fastattn_dropped_total{model="bert"}') == 1.0
    assert _metric(text, 'fastattn_batch_requests_count{model="bert"}') == 1.0
    assert httpx.post(srv.url + "/v1/embeddings", json={"model": "bert", "input": "a"},
                      timeout=30).status_code == 200


def test_sigterm_drains(start_server, bert_folder, encoder):
    """SIGTERM with 24 requests in flight: each is answered (and right); new connections are
    refused."""
    srv = start_server({"bert": bert_folder}, "--no-batching", key=None)
    texts = [s + " " + " ".join(["word"] * 60) for s in mixed_sentences(7, 24)]

    def call(t):
        return t, httpx.post(srv.url + "/v1/embeddings", timeout=60,
                             json={"model": "bert", "input": [t] * 300})

    with cf.ThreadPoolExecutor(24) as pool:
        futures = [pool.submit(call, t) for t in texts]
        # SIGTERM once every request has reached the server and most are still in flight
        flight = 'fastattn_requests_in_flight{endpoint="/v1/embeddings"}'
        done = 'fastattn_requests_total{code="200",endpoint="/v1/embeddings"}'
        end = time.monotonic() + 20
        while time.monotonic() < end:
            text = httpx.get(srv.url + "/metrics", timeout=10).text
            n_flight, n_done = _metric(text, flight) or 0, _metric(text, done) or 0
            if n_flight + n_done == 24:
                break
            time.sleep(0.01)
        assert n_flight + n_done == 24 and n_flight >= 8, (n_flight, n_done)
        srv.proc.terminate()
        time.sleep(0.3)
        with pytest.raises(httpx.ConnectError):
            httpx.get(srv.url + "/health", timeout=5)
        results = [f.result(timeout=120) for f in futures]
    # uvicorn re-raises the signal once it has drained: the exit is SIGTERM's
    assert srv.proc.wait(60) in (0, -15)
    assert "Traceback" not in srv.stderr()
    for t, r in results:
        assert r.status_code == 200, r.text
        np.testing.assert_array_equal(np.float32(r.json()["data"][299]["embedding"]),
                                      encoder.encode([t])[0])


def test_load_failure_exits(tmp_path):
    r = subprocess.run([sys.executable, "-m", "fastattn", "serve", "--model",
                        f"x={tmp_path / 'missing'}", "--port", "1"], capture_output=True,
                       text=True, timeout=120, cwd=str(tmp_path))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastattn serve: error:"), r.stderr


def test_client_leaving_mid_body_is_not_an_error(start_server, bert_folder):
    """Half a body, then the client closes: the request is dropped (499), never a 500, and the
    server keeps serving."""
    srv = start_server({"bert": bert_folder}, key=None)
    body = json.dumps({"model": "bert", "input": ["half a body"] * 200}).encode()
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\nContent-Length: " +
                      str(len(body)).encode() + b"\r\n\r\n" + body[:len(body) // 2])
            time.sleep(0.2)
    end = time.monotonic() + 10
    while time.monotonic() < end:
        text = httpx.get(srv.url + "/metrics", timeout=10).text
        if _metric(text, 'fastattn_requests_total{code="499",endpoint="/v1/embeddings"}') == 3:
            break
        time.sleep(0.1)
    assert _metric(text, 'fastattn_requests_total{code="499",endpoint="/v1/embeddings"}') == 3
    assert _metric(text, 'fastattn_requests_total{code="500",endpoint="/v1/embeddings"}') is None
    assert "internal error" not in srv.stderr()
    assert httpx.post(srv.url + "/v1/embeddings", json={"model": "bert", "input": "a"},
                      timeout=30).status_code == 200
