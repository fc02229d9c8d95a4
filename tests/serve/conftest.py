"""`fastattn serve` as a subprocess on a free loopback port, and the small model folders it serves.

Every wait is bounded; every server is killed in teardown (SIGTERM, then SIGKILL).
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(_TESTS, "text"), os.path.join(_TESTS, "models")]

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
pytest.importorskip("httpx")

API_KEY = "test-key"


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A running `fastattn serve`: .url, .port, .proc, .stderr() (its stderr so far)."""

    def __init__(self, models, *args, tmp_path, key=API_KEY, start_timeout=90.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.key = key
        cmd = [sys.executable, "-m", "fastattn", "serve", "--port", str(self.port),
               "--threads", "1"]
        for name, folder in models.items():
            cmd += ["--model", f"{name}={folder}"]
        if key:
            cmd += ["--api-key", key]
        cmd += [str(a) for a in args]
        self._err_path = os.path.join(str(tmp_path), f"serve-{self.port}.stderr")
        self._err = open(self._err_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self._err)
        self._wait_ready(start_timeout)

    def _wait_ready(self, timeout):
        import httpx
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}): "
                                   f"{self.stderr()}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the server did not start within {timeout} s: {self.stderr()}")

    @property
    def headers(self):
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def stderr(self):
        self._err.flush()
        with open(self._err_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def stop(self, sig=signal.SIGTERM, timeout=30.0):
        """Stop it (sig first, SIGKILL after timeout); returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._err.close()
        return self.proc.returncode


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
    pytest.importorskip("sentencepiece")
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from text_helpers import make_marian_folder
    path = str(tmp_path_factory.mktemp("serve_marian"))
    make_marian_folder(path, seed=2, eos_bias=1.0)
    return path


def mixed_sentences(seed, n):
    """Sentences of mixed lengths: short ones, ones around 16 tokens, and ones past 64 tokens
    (truncated)."""
    import random

    from text_helpers import sentences
    r = random.Random(seed)
    out = []
    for i, s in enumerate(sentences(seed, n, lo=1, hi=20)):
        if i % 7 == 3:
            s = " ".join([s] * r.randint(4, 8))
        out.append(s)
    return out
