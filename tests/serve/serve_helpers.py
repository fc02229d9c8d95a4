"""`fastattn serve` as a subprocess on a free loopback port (every wait bounded), and the
sentences the tests send."""
import os
import signal
import socket
import subprocess
import sys
import time

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(_TESTS, "text"), os.path.join(_TESTS, "models")]

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
        # run outside the checkout: the installed fastattn, not the source tree (no kernels in CI)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self._err,
                                     cwd=str(tmp_path))
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
