"""Kept for code written against earlier releases: the functions live in :mod:`fastattn.functional`."""
from .functional import scaled_dot_product_attention, softmax

__all__ = ["scaled_dot_product_attention", "softmax"]
