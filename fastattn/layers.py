"""Kept for code written against earlier releases: the blocks live in :mod:`fastattn.nn`."""
from .nn import *  # noqa: F403
from .nn import __all__  # noqa: F401
