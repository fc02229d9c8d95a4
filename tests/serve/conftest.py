"""The small model folders `fastattn serve` is tested with, and servers stopped in teardown
(SIGTERM, then SIGKILL)."""
import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
pytest.importorskip("httpx")

from serve_helpers import Server  # noqa: E402 (puts tests/text and tests/models on sys.path)


@pytest.fixture
def start_server(tmp_path):
    """start_server(models, *extra_args, key=...) -> Server; all stopped in teardown."""
    servers = []

    def start(models, *args, **kw):
        s = Server(models, *args, tmp_path=tmp_path, **kw)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop(timeout=10.0)


@pytest.fixture(scope="session")
def bert_folder(tmp_path_factory, minilm):
    """A small random BERT with all-MiniLM-L6-v2's tokenizer, as a sentence-transformers folder
    (mean pooling, Normalize); 64 positions, so that long inputs are truncated."""
    from encoder_checkpoints import write_numpy_bert, write_st_folder
    folder = str(tmp_path_factory.mktemp("serve_bert"))
    write_numpy_bert(folder, seed=3, vocab_size=30522, max_position_embeddings=64)
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(os.path.join(minilm, f), folder)
    write_st_folder(folder)
    return folder


@pytest.fixture(scope="session")
def marian_folder(tmp_path_factory):
    """A Marian folder (trained SentencePiece models, random weights), as tests/text's."""
    from text_helpers import marian_fixture
    return marian_fixture(tmp_path_factory, "serve_marian", seed=2, eos_bias=1.0)[0]


@pytest.fixture(scope="session")
def marian_varied_folder(tmp_path_factory):
    """A Marian folder whose translations end at very different lengths (3 to 60+ tokens for
    mixed_sentences: an EOS bias of 3.5), for continuous batching."""
    from text_helpers import marian_fixture
    return marian_fixture(tmp_path_factory, "serve_marian_varied", seed=2, eos_bias=3.5)[0]
