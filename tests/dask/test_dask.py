"""fastattn.dask on a real LocalCluster (2 worker processes x 1 thread): results equal to
single-process runs, item for item and bitwise; models loaded once per worker; a worker killed
mid-run loses nothing; bad inputs name the item."""
import os
import signal
import sys
import time

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
distributed = pytest.importorskip("distributed")
db = pytest.importorskip("dask.bag")

import fastattn.dask as fdask  # noqa: E402
from fastattn.models import Seq2SeqTransformer  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "generation"))
from marian_helpers import EOS, PAD, make_checkpoint, marian_like_generation  # noqa: E402

N_ITEMS = 23


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None)
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("marian")
    make_checkpoint(str(path), activation="relu", tied=False, eos_bias=1.5, seed=0,
                    generation=marian_like_generation(max_length=16, num_beams=2))
    return str(path)


@pytest.fixture(scope="module")
def corpus():
    rng = np.random.default_rng(11)
    items = []
    for i in range(N_ITEMS):
        n = int(rng.integers(2, 20))
        s = rng.integers(1, PAD, size=n)
        s[-1] = EOS
        items.append(s.tolist() if i % 2 else s)       # lists and arrays
    return items


def _single(model, items, **kw):
    out = []
    for s in items:
        row = model.generate(np.asarray(s)[None], **kw)[0]
        n = len(row)
        while n > 1 and row[n - 1] == model.pad_id:
            n -= 1
        out.append(row[:n])
    return out


def _assert_items_equal(got, want):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape and np.array_equal(g, w), (i, g, w)


def test_generate_by_path_equals_single_process(client, ckpt, corpus):
    model = Seq2SeqTransformer.from_pretrained(ckpt)
    want = _single(model, corpus, max_new_tokens=10)
    assert len({tuple(w) for w in want}) > N_ITEMS // 2          # outputs vary: the test can fail
    assert len({len(w) for w in want}) > 1
    bag = db.from_sequence(corpus, npartitions=4)
    got = fdask.generate(bag, ckpt, batch_size=3, max_new_tokens=10).compute()
    _assert_items_equal(got, want)
    # loaded once per worker process, not once per task
    loads = client.run(lambda: len(fdask._MODELS))
    assert sorted(loads.values()) in ([1, 1], [0, 1])


def test_generate_beam_by_object_sent_once(client, ckpt, corpus):
    model = Seq2SeqTransformer.from_pretrained(ckpt)
    want = _single(model, corpus, num_beams=3, max_new_tokens=8)
    bag = db.from_sequence(corpus, npartitions=5)
    out = fdask.generate(bag, model, batch_size=4, num_beams=3, max_new_tokens=8)
    keys = [k for k in dict(out.__dask_graph__()) if str(k).startswith("fastattn-model-")]
    assert len(keys) == 1                                        # one key, every partition uses it
    _assert_items_equal(out.compute(), want)


def test_encode_by_path_and_object(client, ckpt, corpus):
    model = Seq2SeqTransformer.from_pretrained(ckpt)
    want = [model.encode(np.asarray(s)[None])[0] for s in corpus]
    for m in (ckpt, model):
        got = fdask.encode(db.from_sequence(corpus, npartitions=3), m, batch_size=5).compute()
        _assert_items_equal(got, want)
        assert got[0].shape == (len(corpus[0]), model.d_model)


def test_worker_killed_mid_run_loses_nothing(client, ckpt, corpus):
    model = Seq2SeqTransformer.from_pretrained(ckpt)
    items = corpus * 3
    want = _single(model, items, num_beams=2, max_new_tokens=12)
    future = client.compute(fdask.generate(db.from_sequence(items, npartitions=12), ckpt,
                                           batch_size=2, num_beams=2, max_new_tokens=12))
    pids = client.run(os.getpid)
    deadline = time.time() + 60
    while not client.processing() or not any(client.processing().values()):
        assert time.time() < deadline
        time.sleep(0.02)
    victim = next(addr for addr, tasks in client.processing().items() if tasks)
    os.kill(pids[victim], signal.SIGKILL)
    _assert_items_equal(future.result(timeout=300), want)


def test_tasks_use_their_workers_threads(client):
    assert set(client.run(fdask._worker_threads).values()) == {1}


def test_bad_inputs(client, ckpt, corpus):
    with pytest.raises(TypeError, match="sources must be a dask.bag.Bag"):
        fdask.generate(list(corpus), ckpt)
    with pytest.raises(TypeError, match="model must be"):
        fdask.generate(db.from_sequence(corpus), 3.5)
    with pytest.raises(FileNotFoundError, match="model: no checkpoint folder"):
        fdask.generate(db.from_sequence(corpus), ckpt + "-missing")
    with pytest.raises(ValueError, match="batch_size"):
        fdask.generate(db.from_sequence(corpus), ckpt, batch_size=0)
    padded = [list(corpus[0]) + [PAD, PAD]]
    with pytest.raises(ValueError, match=r"item 0 of partition 0 contains the pad id"):
        fdask.generate(db.from_sequence(padded, npartitions=1), ckpt).compute()
    bad = [[1, 2, 3], [4, 10_000]]
    with pytest.raises(ValueError, match=r"item 1 of partition 0 holds token id 10000"):
        fdask.encode(db.from_sequence(bad, npartitions=1), ckpt).compute()
    with pytest.raises(TypeError, match=r"item 0 of partition 0 must hold integer"):
        fdask.encode(db.from_sequence([[1.5, 2.0]], npartitions=1), ckpt).compute()


def test_transcribe_equals_single_process(client, tmp_path_factory):
    """fastattn.dask.transcribe: item i is Transcriber(path).transcribe(audio_i), bitwise,
    for paths and arrays, float32 and int8."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    sf = pytest.importorskip("soundfile")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "models"))
    import whisper_checkpoints as W
    import fastattn.dask
    from fastattn.audio import Transcriber
    path = str(tmp_path_factory.mktemp("whisper"))
    W.make_checkpoint(path, multilingual=True, seed=3)
    W.write_tokenizer(path)
    items = []
    for i in range(5):
        audio = W.speech_like(2.0 + 1.5 * i, seed=i)
        if i % 2:
            wav = os.path.join(path, f"clip{i}.wav")
            sf.write(wav, audio, 16000, subtype="FLOAT")
            items.append(wav)
        else:
            items.append(audio)
    kw = dict(num_beams=2, temperature=(0.0, 1.0), compression_ratio_threshold=1.8, best_of=2)
    for quantize in (None, "int8", "bfloat16"):
        bag = db.from_sequence(items, npartitions=3)
        got = fastattn.dask.transcribe(bag, path, quantize=quantize, **kw).compute()
        tr = Transcriber(path, quantize=quantize, n_threads=2)
        want = [tr.transcribe(a, **kw) for a in items]
        assert got == want and all(r.segments for r in got)
    with pytest.raises(TypeError, match="beam_width"):      # beam_size is num_beams' alias
        fastattn.dask.transcribe(db.from_sequence(items), path, beam_width=2)
    with pytest.raises(TypeError, match="item 0"):
        fastattn.dask.transcribe(db.from_sequence([3]), path).compute()
