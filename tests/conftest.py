import numpy as np
import pytest

import fastattn

# Tolerances against the float64 reference, per compute dtype (one place, never inline).
ATOL = {np.float32: 2e-6, np.float64: 1e-12}
RTOL = {np.float32: 1e-5, np.float64: 1e-12}


def pytest_report_header(config):
    import io
    buf = io.StringIO()
    fastattn.show_config(file=buf)
    return buf.getvalue().rstrip().splitlines()


@pytest.fixture
def rng():
    return np.random.default_rng(20261129)


def assert_close(actual, expected, dtype):
    dtype = np.dtype(dtype).type
    np.testing.assert_allclose(actual, expected, rtol=RTOL[dtype], atol=ATOL[dtype])
