"""What every `fastattn` subcommand shares: the positive-integer option type, the one-line error,
and an output written in full or not at all.

It sits below the packages whose commands use it (text/, audio/, benchmark/), so that none of
them imports another's command line.
"""
import argparse
import os
import sys
import tempfile

__all__ = ["CommandError", "Output", "positive_int"]


class CommandError(Exception):
    """A failure to report as one line (exit status 2)."""


def positive_int(text):
    """argparse type: an integer >= 1 (anything else names the value it got)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n


class Output:
    """stdout (`path` None or "-"), or a temporary file beside `path` renamed to it by commit():
    a failed run leaves no partial output. ``f`` is the stream to write; discard() removes the
    temporary file if commit() was not reached."""

    def __init__(self, path, binary=False):
        self.path, self.tmp = path, None
        if path is None or path == "-":
            self.f = sys.stdout.buffer if binary else sys.stdout
            return
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise CommandError(f"cannot write {path}: folder {folder} does not exist")
        try:
            fd, self.tmp = tempfile.mkstemp(prefix=".fastattn-", suffix=".part", dir=folder)
        except OSError as exc:
            raise CommandError(f"cannot write {path}: {exc.strerror or exc}") from None
        self.f = os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8",
                                                              newline="\n")

    def commit(self):
        if self.tmp is None:
            self.f.flush()
            return
        self.f.close()
        try:
            os.replace(self.tmp, self.path)
        except OSError as exc:
            raise CommandError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        self.tmp = None

    def discard(self):
        if self.tmp is not None:
            self.f.close()
            try:
                os.remove(self.tmp)
            except OSError:
                pass
            self.tmp = None
