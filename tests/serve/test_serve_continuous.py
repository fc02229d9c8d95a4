"""Continuous batching of greedy translation in the server's worker: rows join the running
batch at step boundaries and leave as they finish, so short requests are answered before a long
one that started first; every answer is what the request gets alone in-process."""
import concurrent.futures as cf
import threading

import numpy as np
import pytest
from serve_helpers import mixed_sentences

import fastattn
from fastattn.serve._scheduler import Job, TranslationWorker

httpx = pytest.importorskip("httpx")

KW = {"max_new_tokens": 60}


@pytest.fixture(scope="module")
def translator(marian_varied_folder):
    return fastattn.Translator(marian_varied_folder)


def lengths(tr, texts):
    """Tokens each text's translation has alone."""
    out = {}
    for t in texts:
        rows = tr._encode([t], None, None)
        kw = tr._gen_kwargs(KW, None)
        kw.pop("n_threads")
        g = tr.model.generate(np.array(rows), **kw)[0]
        e = np.flatnonzero(g[1:] == tr.model.eos_id)
        out[t] = int(e[0]) + 2 if e.size else len(g)
    return out


def test_short_requests_are_answered_before_a_long_one(translator):
    texts = mixed_sentences(9, 40)
    n = lengths(translator, texts)
    long = [t for t in texts if n[t] > 50]
    short = [t for t in texts if n[t] <= 5]
    assert long and len(short) >= 4, sorted(n.values())
    worker = TranslationWorker("mt", translator, batching=True)
    done, order, lock = {}, [], threading.Lock()

    def job(name, inputs):
        ev = threading.Event()

        def finish(result, error):
            with lock:
                order.append(name)
                done[name] = (result, error)
            ev.set()
        payload = {"inputs": inputs, "src_lang": None, "tgt_lang": None, "kw": dict(KW)}
        return Job(payload, finish, key=TranslationWorker.job_key(payload)), ev

    try:
        # the long request first: 48 copies of a long input, 60 steps
        big, big_done = job("long", [long[0]] * 48)
        worker.submit(big)
        events = [big_done]
        for i, t in enumerate(short[:6]):
            j, ev = job(f"short{i}", [t])
            worker.submit(j)
            events.append(ev)
        for ev in events:
            assert ev.wait(120)
    finally:
        worker.close()
    assert order[-1] == "long", order
    want_long = translator.translate([long[0]], **KW)[0]
    assert done["long"][1] is None and done["long"][0][0] == [want_long] * 48
    for i, t in enumerate(short[:6]):
        res, err = done[f"short{i}"]
        assert err is None and res[0] == translator.translate([t], **KW)
    assert not worker._thread.is_alive()


def run_jobs(worker, named_inputs, timeout=120):
    """Submit one job per (name, inputs) with the settings KW, wait for all, close the worker:
    {name: (result, error)}."""
    results, evs = {}, []
    try:
        for name, inputs in named_inputs:
            ev = threading.Event()

            def finish(result, error, name=name, ev=ev):
                results[name] = (result, error)
                ev.set()
            payload = {"inputs": inputs, "src_lang": None, "tgt_lang": None, "kw": dict(KW)}
            worker.submit(Job(payload, finish, key=TranslationWorker.job_key(payload)))
            evs.append(ev)
        for ev in evs:
            assert ev.wait(timeout)
    finally:
        worker.close()
    return results


def test_a_failing_request_fails_alone(translator):
    """A request whose input cannot be encoded (not text) fails alone; the requests beside it
    in the running batch are answered."""
    worker = TranslationWorker("mt", translator, batching=True)
    results = run_jobs(worker, [("ok", ["A man eats food."]), ("bad", [None]),
                                ("ok2", ["Two children ride horses."])])
    assert results["bad"][1] is not None
    assert results["ok"][0][0] == translator.translate(["A man eats food."], **KW)
    assert results["ok2"][0][0] == translator.translate(["Two children ride horses."], **KW)


def test_http_concurrent_greedy_equal_alone(start_server, marian_varied_folder, translator):
    """40 concurrent clients, each with its own max_new_tokens (rows of different limits share
    the running batch), every answer equal to translate alone."""
    srv = start_server({"mt": marian_varied_folder}, key=None)
    texts = mixed_sentences(11, 40)
    limits = {t: [5, 60, 17, 33, 2][i % 5] for i, t in enumerate(texts)}
    want = {t: translator.translate([t], max_new_tokens=limits[t])[0] for t in texts}

    def call(t):
        r = httpx.post(srv.url + "/translate", timeout=120,
                       json={"q": t, "max_new_tokens": limits[t]})
        assert r.status_code == 200, r.text
        return t, r.json()["translatedText"]

    with cf.ThreadPoolExecutor(40) as pool:
        for t, got in pool.map(call, texts, timeout=240):
            assert got == want[t]
    m = httpx.get(srv.url + "/metrics", timeout=10).text
    gen = [ln for ln in m.splitlines() if ln.startswith('fastattn_generated_tokens_total{model="mt"}')]
    assert gen and float(gen[0].split()[-1]) > 0, "continuous batching did not run"


def test_a_request_with_more_inputs_than_the_running_rows(translator, monkeypatch):
    """A request with more inputs than MAX_RUNNING_ROWS runs by length-sorted batches (its KV
    cache bounded by max_batch_tokens), beside continuous batches before and after it; every
    answer equals translate alone."""
    monkeypatch.setattr(TranslationWorker, "MAX_RUNNING_ROWS", 4)
    texts = mixed_sentences(13, 9)
    worker = TranslationWorker("mt", translator, batching=True, max_batch_tokens=64)
    results = run_jobs(worker, [("small", texts[:2]), ("big", texts), ("small2", texts[2:5])])
    assert worker._joins(Job({"inputs": texts[:4]}, None)) and \
        not worker._joins(Job({"inputs": texts[:5]}, None))
    assert results["big"][1] is None
    assert results["big"][0][0] == translator.translate(texts, **KW)
    for name, inputs in (("small", texts[:2]), ("small2", texts[2:5])):
        assert results[name][1] is None
        assert results[name][0][0] == translator.translate(inputs, **KW)
