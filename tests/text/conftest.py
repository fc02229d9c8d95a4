import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
# (`minilm`, the real all-MiniLM-L6-v2 folder: tests/conftest.py)


@pytest.fixture(scope="session")
def marian(tmp_path_factory):
    """A Marian folder (trained SentencePiece models, random weights): (path, hf model)."""
    from text_helpers import marian_fixture
    return marian_fixture(tmp_path_factory, "marian_text")


@pytest.fixture(scope="session")
def marian_languages(tmp_path_factory):
    """A multilingual Marian folder (>>aa<< and >>bb<< in its vocab)."""
    pytest.importorskip("sentencepiece")
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from text_helpers import make_marian_folder
    path = str(tmp_path_factory.mktemp("marian_lang"))
    _, model = make_marian_folder(path, languages=True, seed=2, eos_bias=1.0)
    return path, model
