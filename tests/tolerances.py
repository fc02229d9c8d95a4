"""Tolerances, per compute dtype: the one table every test reads (never inline numbers).

A plain module (``from tolerances import ...``), not conftest.py: with several conftest.py
files in the tree, ``from conftest import`` would find whichever was imported first."""
import numpy as np

# The kernel against the float64 reference:
ATOL = {np.float32: 2e-6, np.float64: 1e-12}
RTOL = {np.float32: 1e-5, np.float64: 1e-12}
# A whole block or model (several GEMMs, LayerNorms and attention calls) against float64 NumPy:
BLOCK_TOL = {np.float32: 2e-5, np.float64: 1e-12}
# ... and against PyTorch's own modules (torch computes float32 its own way):
TORCH_TOL = {np.float32: 1e-4, np.float64: 1e-10}
# One attention call in a child process, relative to 1 + |reference| (kernels/test_workspace.py):
CHILD_TOL = {"float32": 2e-5, "float64": 1e-11}


def assert_close(actual, expected, dtype):
    dtype = np.dtype(dtype).type
    np.testing.assert_allclose(actual, expected, rtol=RTOL[dtype], atol=ATOL[dtype])
