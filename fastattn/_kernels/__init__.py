"""Compiled kernels (private)."""
