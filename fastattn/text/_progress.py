"""A progress bar on stderr: tqdm when installed, else one plain line per update second."""
import sys
import time

from .._deps import optional


class _Plain:
    def __init__(self, total, desc, unit, file):
        self.total, self.desc, self.unit, self.file = total, desc, unit, file
        self.n, self.t0, self._last = 0, time.perf_counter(), 0.0

    def update(self, n=1):
        self.n += n
        now = time.perf_counter()
        if now - self._last >= 1.0 or (self.total is not None and self.n >= self.total):
            self._last = now
            of = f"/{self.total}" if self.total is not None else ""
            rate = self.n / max(now - self.t0, 1e-9)
            self.file.write(f"{self.desc}: {self.n}{of} {self.unit}s, {rate:.1f} {self.unit}s/s\n")
            self.file.flush()

    def close(self):
        pass


class _Off:
    def update(self, n=1):
        pass

    def close(self):
        pass


def progress_bar(enabled, total=None, desc="fastattn", unit="line"):
    """An object with update(n) and close(): tqdm on stderr when `enabled` (a plain line a
    second without tqdm), nothing otherwise."""
    if not enabled:
        return _Off()
    tqdm = optional("tqdm")
    if tqdm is None:
        return _Plain(total, desc, unit, sys.stderr)
    return tqdm.tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
                     leave=False)
