import numpy as np
import pytest

import fastattn


def pytest_report_header(config):
    import io
    buf = io.StringIO()
    fastattn.show_config(file=buf)
    return buf.getvalue().rstrip().splitlines()


@pytest.fixture
def rng():
    return np.random.default_rng(20261129)
