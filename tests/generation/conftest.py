import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

# name -> make_checkpoint keywords; chosen so greedy outputs vary (tokens and lengths)
CONFIGS = {
    "relu_untied": dict(activation="relu", tied=False, eos_bias=1.5, seed=0),
    "swish_untied": dict(activation="swish", tied=False, eos_bias=1.0, seed=0),
    "relu_tied": dict(activation="relu", tied=True, emb_std=0.3, eos_bias=2.0, seed=0),
    "gelu_unshared": dict(activation="gelu", tied=False, shared=False, eos_bias=1.5, seed=3),
}


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """checkpoint(name, **extra) -> (path, transformers model); cached per session."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from marian_helpers import make_checkpoint
    cache = {}

    def get(name, **extra):
        key = (name, tuple(sorted((k, repr(v)) for k, v in extra.items())))
        if key not in cache:
            kw = dict(CONFIGS[name])
            kw.update(extra)
            path = tmp_path_factory.mktemp(name)
            cache[key] = (str(path), make_checkpoint(str(path), **kw))
        return cache[key]
    return get


@pytest.fixture
def src():
    from marian_helpers import sources
    return sources(np.random.default_rng(7), batch=6, length=12)


@pytest.fixture
def ids():
    """Three sources of 9 tokens, no padding (ids in [1, PAD))."""
    from marian_helpers import PAD
    return np.random.default_rng(3).integers(1, PAD, size=(3, 9))
