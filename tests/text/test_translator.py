"""fastattn.Translator against transformers' tokenizer -> generate -> batch_decode, string for
string, on Marian folders whose SentencePiece models are trained here; the same strings whatever
the batching; bad input named."""
import os
import shutil
import sys

import numpy as np
import pytest

pytest.importorskip("sentencepiece")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from text_helpers import hf_tokenizer, sentences  # noqa: E402

import fastattn  # noqa: E402
from fastattn.text import TextStreamer, Translator  # noqa: E402

LONG = " ".join(["kato mi ren su"] * 60)          # ~ 240 pieces, past max_position_embeddings
TEXTS = sentences(5, 37) + ["", "kato", "  ", "ka</s>to", "ÉSSS ß é", LONG]


def hf_translate(path, model, texts, max_length, **kw):
    tok = hf_tokenizer(path)
    enc = tok(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, **kw)
    return tok.batch_decode(out, skip_special_tokens=True)


@pytest.fixture(scope="module")
def tr(marian):
    return Translator(marian[0])


@pytest.mark.parametrize("kw", [dict(max_new_tokens=24), dict(max_new_tokens=24, num_beams=3),
                                dict(max_new_tokens=12, num_beams=2, length_penalty=0.5)],
                         ids=["greedy", "beam3", "beam2_lp"])
def test_translations_equal_transformers(marian, tr, kw):
    path, model = marian
    want = hf_translate(path, model, TEXTS, tr.max_source_length, **kw)
    got = tr.translate(TEXTS, batch_size=8, **kw)
    assert got == want
    assert len(set(got)) > len(TEXTS) // 4            # outputs vary: the test can fail
    assert len({len(g) for g in got}) > 3


def test_long_line_truncated_to_the_model(marian, tr):
    path, _ = marian
    assert tr.max_source_length == 64                 # max_position_embeddings < 512
    ids = tr.tokenizer.encode([LONG], max_length=tr.max_source_length)[0]
    assert len(ids) == 64 and ids[-1] == tr.tokenizer.eos_id
    assert ids == hf_tokenizer(path)(LONG, truncation=True, max_length=64)["input_ids"]
    assert isinstance(tr.translate([LONG], max_new_tokens=4)[0], str)


@pytest.mark.parametrize("kw", [dict(max_new_tokens=16), dict(max_new_tokens=10, num_beams=3)],
                         ids=["greedy", "beam3"])
def test_same_strings_whatever_the_batching(tr, kw):
    texts = sentences(9, 61, lo=1, hi=30) + TEXTS
    ref = tr.translate(texts, **kw)
    assert tr.translate(texts, batch_size=1, **kw) == ref
    assert tr.translate(texts, batch_size=5, **kw) == ref
    assert tr.translate(texts, batch_size=None, max_batch_tokens=40, **kw) == ref
    assert tr.translate(texts, batch_size=3, max_batch_tokens=10, **kw) == ref
    assert list(tr.translate_iterable(iter(texts), batch_size=4, window=7, **kw)) == ref
    assert list(tr.translate_iterable(texts, **kw)) == ref
    # one line alone
    assert [tr.translate([t], **kw)[0] for t in texts[::9]] == ref[::9]


def test_translate_iterable_reads_lazily(tr):
    read = []

    def lines():
        for i, t in enumerate(sentences(4, 1000)):
            read.append(i)
            yield t
    it = tr.translate_iterable(lines(), batch_size=4, window=10, max_new_tokens=3)
    first = [next(it) for _ in range(10)]
    assert all(isinstance(s, str) for s in first)
    assert len(read) <= 30                            # this window, the next, one more at most
    it.close()                                        # the reader thread stops
    assert len(read) <= 40


def test_translate_iterable_errors_come_from_the_reader(tr):
    with pytest.raises(TypeError, match="iterable item 3 must be a str, got bytes"):
        list(tr.translate_iterable(["a", "b", "c", b"d"], max_new_tokens=2))
    with pytest.raises(TypeError, match="iterable must be an iterable of str, got one str"):
        tr.translate_iterable("kato")
    with pytest.raises(TypeError, match="got int"):
        tr.translate_iterable(5)
    with pytest.raises(ValueError, match="window must be a positive integer"):
        tr.translate_iterable(["a"], window=0)

    def boom():
        yield "kato"
        raise OSError("disk gone")
    with pytest.raises(OSError, match="disk gone"):
        list(tr.translate_iterable(boom(), max_new_tokens=2))


def test_target_language(marian_languages):
    path, model = marian_languages
    tr = Translator(path)
    assert tr.target_languages == (">>aa<<", ">>bb<<")
    texts = sentences(2, 9)
    for code in ("aa", "bb"):
        want = hf_translate(path, model, [f">>{code}<< {t}" for t in texts],
                            tr.max_source_length, max_new_tokens=10)
        assert tr.translate(texts, tgt_lang=code, max_new_tokens=10) == want
    assert tr.translate(texts, tgt_lang="aa", max_new_tokens=10) != \
        tr.translate(texts, tgt_lang="bb", max_new_tokens=10)
    with pytest.raises(ValueError, match="tgt_lang='fr' is not one of this model's language"):
        tr.translate(texts, tgt_lang="fr")


def test_languages_on_a_model_without_them(tr):
    with pytest.raises(ValueError, match="tgt_lang='de'.*has no target language codes"):
        tr.translate(["kato"], tgt_lang="de")
    with pytest.raises(ValueError, match="src_lang='en'.*has no source language codes"):
        tr.translate(["kato"], src_lang="en")
    with pytest.raises(ValueError, match="src_lang='en'"):
        tr.translate_iterable(["kato"], src_lang="en")


def test_bad_arguments(marian, tr, tmp_path, minilm):
    path, _ = marian
    with pytest.raises(ValueError, match="quantize must be None, 'int8' or 'bfloat16'"):
        Translator(path, quantize="int4")
    with pytest.raises(FileNotFoundError, match="model folder not found"):
        Translator(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="model_type='bert' is not a translation model.*"
                                         "SentenceEncoder"):
        Translator(minilm)
    with pytest.raises(TypeError, match="n_threads must be a positive integer"):
        Translator(path, n_threads=1.5)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        tr.translate(["kato"], batch_size=0)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        tr.translate(["kato"], batch_size=None)
    with pytest.raises(ValueError, match="max_batch_tokens must be a positive integer"):
        tr.translate(["kato"], max_batch_tokens=-3)
    with pytest.raises(TypeError, match="got an unexpected keyword argument 'beams'"):
        tr.translate(["kato"], beams=4)
    with pytest.raises(TypeError, match="got one str"):
        tr.translate("kato")
    with pytest.raises(TypeError, match=r"texts\[0\] must be a str, got NoneType"):
        tr.translate([None])
    assert tr.translate([]) == []
    # a vocab.json that does not belong to the model
    bad = tmp_path / "bad"
    shutil.copytree(path, bad)
    import json
    vocab = json.loads((bad / "vocab.json").read_text())
    vocab["extra"] = 10_000
    (bad / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(ValueError, match="ids go up to 10000, but the model's vocab_size"):
        Translator(str(bad))


def test_progress_bar_on_stderr(tr, capsys):
    tr.translate(sentences(1, 5), progress=True, max_new_tokens=2)
    err = capsys.readouterr().err
    assert "translate" in err and "5" in err


def test_float64_and_threads(marian):
    path, _ = marian
    texts = sentences(6, 6)
    t32 = Translator(path, n_threads=1).translate(texts, max_new_tokens=8)
    t64 = Translator(path, dtype=np.float64, n_threads=2).translate(texts, max_new_tokens=8)
    assert len(t64) == len(t32) and all(isinstance(s, str) for s in t64)


# --- streaming -----------------------------------------------------------------------------------

def _generate_takes_streamer():
    m = fastattn.Seq2SeqTransformer(vocab_size=8, d_model=8, encoder_layers=1, decoder_layers=1,
                                    encoder_attention_heads=1, decoder_attention_heads=1,
                                    encoder_ffn_dim=8, decoder_ffn_dim=8, max_position_embeddings=8)

    class Sink:
        def put(self, value):
            pass

        def end(self):
            pass
    try:
        m.generate(np.array([[1, 0]]), max_new_tokens=1, streamer=Sink())
    except TypeError:
        return False
    return True


needs_streamer = pytest.mark.skipif(not _generate_takes_streamer(),
                                    reason="Seq2SeqTransformer.generate does not take streamer= "
                                           "yet")


@needs_streamer
def test_translate_stream_joins_to_the_translation(tr):
    for text in TEXTS[:12] + [LONG]:
        pieces = list(tr.translate_stream(text, max_new_tokens=20))
        assert "".join(pieces) == tr.translate([text], max_new_tokens=20, num_beams=1)[0]
        assert all(p for p in pieces)


@needs_streamer
def test_translate_stream_closed_early_stops(tr):
    it = tr.translate_stream(LONG, max_new_tokens=60)
    next(it, None)
    it.close()


def test_translate_stream_plumbing(marian, monkeypatch):
    """translate_stream's thread and queue over a generate that speaks the streamer protocol
    (simulated: the real generate's tokens fed to the streamer one step at a time)."""
    tr = Translator(marian[0])
    real = tr.model.generate
    seen = {}

    def generate(ids, mask, *, streamer=None, **kw):
        out = real(ids, mask, **kw)
        if streamer is None:
            return out
        seen.update(kw)
        streamer.put(out[:, :1])
        for t in range(1, out.shape[1]):
            streamer.put(out[:, t])
        streamer.end()
        return out
    monkeypatch.setattr(tr.model, "generate", generate)
    for text in TEXTS[:10]:
        pieces = list(tr.translate_stream(text, max_new_tokens=20))
        assert "".join(pieces) == tr.translate([text], max_new_tokens=20, num_beams=1)[0]
    assert seen["num_beams"] == 1 and seen["max_new_tokens"] == 20

    def failing(ids, mask, *, streamer, **kw):
        raise RuntimeError("kernel failed")
    monkeypatch.setattr(tr.model, "generate", failing)
    with pytest.raises(RuntimeError, match="kernel failed"):
        list(tr.translate_stream("kato"))


def test_translate_stream_refuses_beams(tr):
    with pytest.raises(ValueError, match="num_beams must be 1"):
        tr.translate_stream("kato", num_beams=4)
    with pytest.raises(TypeError, match="text must be a str"):
        tr.translate_stream(["kato"])


def test_text_streamer_protocol(tr):
    """TextStreamer fed as generate feeds it (start token, then one token a step): the pieces
    join to the decoded text and break at word boundaries."""
    texts = sentences(8, 12)
    outs = tr.model.generate(*_padded(tr, texts), max_new_tokens=20)
    for row in outs:
        pieces = []
        s = TextStreamer(tr.tokenizer, pieces.append)
        s.put(np.array([[row[0]]]))
        for tok in row[1:]:
            s.put(np.array([tok]))
        s.end()
        full = tr.tokenizer.decode(row)
        assert "".join(pieces) == full
        assert all(p.endswith(" ") for p in pieces[:-1])
    with pytest.raises(ValueError, match="one sequence"):
        TextStreamer(tr.tokenizer, print).put(np.zeros((2, 1), np.int64))


def _padded(tr, texts):
    from fastattn.text.batching import pad_batch
    return pad_batch(tr.tokenizer.encode(texts), tr.model.pad_id)


def test_exported_at_top_level():
    assert fastattn.Translator is Translator
    assert "Translator" in fastattn.__all__ and "SentenceEncoder" in fastattn.__all__
    assert os.path.basename(sys.modules["fastattn.text"].__file__) == "__init__.py"


def test_num_return_sequences_gives_lists(tmp_path):
    """num_return_sequences=N: each item a list of N translations, best first -- the decoded
    rows of generate's N sequences of that source (not the neighbours' rows)."""
    import numpy as np
    from text_helpers import make_marian_folder
    folder = str(tmp_path / "m")
    make_marian_folder(folder)
    tr = fastattn.Translator(folder)
    texts = ["Hello world.", "A much longer sentence to translate here.", "Yes."]
    got = tr.translate(texts, num_beams=4, num_return_sequences=3, batch_size=2)
    assert [len(g) for g in got] == [3, 3, 3]
    for text, hyps in zip(texts, got):
        ids = np.array(tr._encode([text], None, None))
        gen = tr.model.generate(ids, np.ones_like(ids, bool), num_beams=4,
                                num_return_sequences=3)
        assert hyps == [tr.tokenizer.decode(g, skip_special_tokens=True) for g in gen]
    assert [g[0] for g in got] == tr.translate(texts, num_beams=4)
    with pytest.raises(ValueError, match="num_return_sequences"):
        next(tr.translate_stream("Hello", num_return_sequences=2))
