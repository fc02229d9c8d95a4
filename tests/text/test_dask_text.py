"""fastattn.dask.translate / embed on a real LocalCluster (2 worker processes x 1 thread): item for
item equal to the single-process Translator / SentenceEncoder, whatever the partitioning."""
import numpy as np
import pytest

pytest.importorskip("sentencepiece")
distributed = pytest.importorskip("distributed")
db = pytest.importorskip("dask.bag")

import fastattn.dask as fdask  # noqa: E402
from fastattn import SentenceEncoder, Translator  # noqa: E402
from text_helpers import sentences  # noqa: E402


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None)
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()


def test_translate_equals_single_process(client, marian):
    path, _ = marian
    texts = sentences(12, 41, hi=25) + ["", "kato"]
    want = Translator(path).translate(texts, num_beams=2, max_new_tokens=10)
    for parts, kw in ((5, dict(batch_size=3)), (2, dict(batch_size=None, max_batch_tokens=25))):
        got = fdask.translate(db.from_sequence(texts, npartitions=parts), path, num_beams=2,
                              max_new_tokens=10, **kw).compute()
        assert got == want
    loads = client.run(lambda: sum(k[0] == "translate" for k in fdask._MODELS))
    assert sorted(loads.values()) in ([1, 1], [0, 1])


def test_embed_equals_single_process(client, minilm):
    texts = ["A man is eating food.", "", "x " * 300] + [f"sentence {i} " * (i % 5 + 1)
                                                         for i in range(20)]
    want = SentenceEncoder(minilm).encode(texts)
    got = fdask.embed(db.from_sequence(texts, npartitions=4), minilm, batch_size=3).compute()
    assert len(got) == len(texts)
    assert all(g.dtype == np.float32 and g.shape == (384,) for g in got)
    assert np.array_equal(np.stack(got), want)


def test_bad_inputs(client, marian, tmp_path):
    path, _ = marian
    with pytest.raises(TypeError, match="texts must be a dask.bag.Bag of str"):
        fdask.translate(["a"], path)
    with pytest.raises(FileNotFoundError, match="model folder not found"):
        fdask.translate(db.from_sequence(["a"]), str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        fdask.embed(db.from_sequence(["a"]), path, batch_size=0)
    with pytest.raises(TypeError, match=r"texts: item 1 of partition 0 must be a str, got int"):
        fdask.translate(db.from_sequence(["a", 3], npartitions=1), path).compute()
    with pytest.raises(ValueError, match="tgt_lang='xx'"):
        fdask.translate(db.from_sequence(["a"], npartitions=1), path, tgt_lang="xx").compute()
