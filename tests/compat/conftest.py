import os
import sys

import pytest

# dense_folders (the sentence-transformers folders with Dense modules) lives in tests/text
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "text"))


@pytest.fixture(scope="session")
def st_minilm(minilm):
    """sentence-transformers' own SentenceTransformer on the real all-MiniLM-L6-v2 folder."""
    st = pytest.importorskip("sentence_transformers")
    pytest.importorskip("torch")
    return st.SentenceTransformer(minilm, device="cpu")


@pytest.fixture(scope="session")
def _compat_minilm(minilm):
    from fastattn.compat.sentence_transformers import SentenceTransformer
    return SentenceTransformer(minilm, device="cpu")


@pytest.fixture
def compat_minilm(_compat_minilm):
    """fastattn.compat's SentenceTransformer on the same folder, its attributes (prompts,
    truncate_dim, similarity_fn_name, max_seq_length) restored after each test."""
    m = _compat_minilm
    saved = (dict(m.prompts), m.default_prompt_name, m.truncate_dim, m._similarity_fn_name,
             m.max_seq_length)
    yield m
    m.prompts, m.default_prompt_name, m.truncate_dim, m._similarity_fn_name = saved[:4]
    m.max_seq_length = saved[4]
