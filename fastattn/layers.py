"""Kept for code written against earlier releases: the blocks live in :mod:`fastattn.nn`."""
from .nn import *  # noqa: F403
from .nn import __all__  # noqa: F401
from .nn._numerics import _gelu_, _layer_norm, _linear, _relu_  # noqa: F401
