"""Word-level timestamps (fastattn.audio.alignment, WhisperModel.cross_attention_weights).

- dtw: the path of openai-whisper's loop (written out here) on random matrices, ties, zeros
  and NaN; a 448 x 1500 matrix in well under a second (~25 ms measured);
- median_filter: scipy.ndimage.median_filter with mode='mirror' (torch's 'reflect' padding,
  openai-whisper's) and transformers' _median_filter, exactly;
- cross_attention_weights: transformers' eager ``cross_attentions`` within 1e-5, the pass's
  logits WhisperModel.logits' bit for bit;
- token_times on our weights: transformers' ``generate(return_token_timestamps=True)``
  token_timestamps on a tiny random checkpoint (same rows: transformers times each generated
  token by the decoder row whose *input* it is, the prefix rows dropped before normalising);
- words: split_to_word_tokens and merge_punctuations against faster-whisper's on hand-made
  token lists with a byte-level BPE tokenizer (spaces, punctuation, a character split over
  two tokens, zh), and hand-written expectations;
- find_alignment / add_word_timestamps against faster-whisper's own add_word_timestamps, its
  CTranslate2 ``align`` replaced by openai-whisper's algorithm on transformers' attentions;
  the heuristics against faster-whisper's on random hand-made alignments;
- the same bits for n_threads 1 and 2; the errors.
"""
import copy
import os
import sys
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models"))

import fastattn  # noqa: E402
import whisper_checkpoints as W  # noqa: E402
from fastattn.audio import alignment as A  # noqa: E402

transformers.logging.set_verbosity_error()
FRAMES = 2 * W.SMALL["max_source_positions"]          # 300 mel frames, 150 positions
SOT_DE = [W.SOT, W.LANG_IDS["<|de|>"], W.TRANSCRIBE]
SOT_ZH = [W.SOT, W.LANG_IDS["<|zh|>"], W.TRANSCRIBE]


# ------------------------------------------------------------------------ a byte-level BPE

def _bytes_to_unicode():
    """GPT-2's byte -> printable character table (byte-level BPE vocabularies are in it)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


NI, JIE = "你".encode(), "界".encode()
PIECES = [" the", " cat", " sat", " on", " mat", ".", ",", " ", " hello", " world", "!", "?",
          " don", "'t", " (", ")", " \"", "\"", " -", "-", ":", " it", "'s", "ing", "s", " run",
          NI[:2], NI[2:], "好", "世", JIE[:1], JIE[1:], "。", "，", "、", "“", "”", " ¿", " [", "]",
          " “", "！", "？", "：", "'", " '", " a", " big", " dog", "ed", " 好"]
PIECES += [f" w{i}" for i in range(W.TEXT - len(PIECES))]
P = {(p if isinstance(p, str) else p.hex()): i for i, p in enumerate(PIECES)}


def byte_level_tokenizer():
    """A tokenizers.Tokenizer for the tiny checkpoints' vocabulary: text token i is PIECES[i]
    (bytes; some are parts of a UTF-8 character), decoded by the ByteLevel decoder, then the
    special tokens of whisper_checkpoints at their ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    table = _bytes_to_unicode()
    vocab = {}
    for i, p in enumerate(PIECES):
        b = p.encode() if isinstance(p, str) else p
        vocab["".join(table[c] for c in b)] = i
    assert len(vocab) == W.TEXT
    tk = Tokenizer(models.BPE(vocab, []))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    names = W.special_tokens()
    tk.add_special_tokens([AddedToken(names[i], special=True, normalized=False)
                           for i in sorted(names)])
    assert all(tk.token_to_id(n) == i for i, n in names.items())
    return tk


def fw_tokenizer(tk, language="de"):
    from faster_whisper.tokenizer import Tokenizer
    return Tokenizer(tk, True, task="transcribe", language=language)


# ------------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("whisper-align"))
    W.make_checkpoint(path, multilingual=True, seed=0)
    from transformers import WhisperForConditionalGeneration
    hf = WhisperForConditionalGeneration.from_pretrained(path, attn_implementation="eager").eval()
    model = fastattn.WhisperModel.from_pretrained(path)
    tk = byte_level_tokenizer()
    tk.save(os.path.join(path, "tokenizer.json"))
    feats = W.features(np.random.default_rng(1), 6)
    return types.SimpleNamespace(path=path, hf=hf, model=model, tk=tk, feats=feats)


def _t(*names):
    return [P[n] for n in names]


# ------------------------------------------------------------------------ dtw, median filter

def _dtw_reference(x):
    """openai-whisper's dtw_cpu + backtrace, as a plain loop."""
    N, M = x.shape
    cost = np.full((N + 1, M + 1), np.inf, np.float32)
    trace = -np.ones((N + 1, M + 1), np.float32)
    cost[0, 0] = 0
    for j in range(1, M + 1):
        for i in range(1, N + 1):
            c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
            if c0 < c1 and c0 < c2:
                c, t = c0, 0
            elif c1 < c0 and c1 < c2:
                c, t = c1, 1
            else:
                c, t = c2, 2
            cost[i, j] = x[i - 1, j - 1] + c
            trace[i, j] = t
    trace[0, :] = 2
    trace[:, 0] = 1
    i, j, path = N, M, []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        t = trace[i, j]
        i, j = (i - 1, j - 1) if t == 0 else (i - 1, j) if t == 1 else (i, j - 1)
    path = np.array(path[::-1])
    return path[:, 0], path[:, 1]


def test_dtw_takes_openai_whispers_path():
    rng = np.random.default_rng(0)
    for it in range(300):
        N, M = (int(v) for v in rng.integers(1, 13, 2))
        x = rng.standard_normal((N, M))
        if it % 3 == 0:
            x = np.round(x)                     # ties everywhere
        if it % 5 == 0:
            x = np.zeros((N, M))
        if it % 7 == 0:
            x[rng.random((N, M)) < 0.2] = np.nan
        if it % 11 == 0:
            x = x.astype(np.float32)
        rows, cols = A.dtw(x)
        want_rows, want_cols = _dtw_reference(np.asarray(x, np.float64))
        assert rows.dtype == cols.dtype == np.int64
        assert np.array_equal(rows, want_rows) and np.array_equal(cols, want_cols), (N, M, it)
    # the path: from the corner to the corner, one step at a time
    rows, cols = A.dtw(rng.standard_normal((30, 70)))
    assert rows[0] == cols[0] == 0 and rows[-1] == 29 and cols[-1] == 69
    steps = np.stack([np.diff(rows), np.diff(cols)], 1)
    assert set(map(tuple, steps)) <= {(0, 1), (1, 0), (1, 1)}


def test_dtw_window_sized_input_and_errors():
    """A whole window's matrix (448 tokens x 1500 frames): a monotone path corner to corner
    whose cost is the reference's on its first rows (the reference loop would take seconds
    on all of it; speed is for bench/, not asserted here)."""
    x = np.random.default_rng(1).standard_normal((448, 1500)).astype(np.float32)
    rows, cols = A.dtw(x)
    assert (rows[0], cols[0], rows[-1], cols[-1]) == (0, 0, 447, 1499)
    steps = np.stack([np.diff(rows), np.diff(cols)], 1)
    assert {tuple(s) for s in steps} <= {(1, 0), (0, 1), (1, 1)}
    sub = x[:12, :40]
    assert [a.tolist() for a in A.dtw(sub)] == \
        [a.tolist() for a in _dtw_reference(np.asarray(sub, np.float64))]
    for bad in (np.zeros(5), np.zeros((0, 4)), np.zeros((3, 0))):
        with pytest.raises(ValueError, match="dtw"):
            A.dtw(bad)


def test_median_filter_matches_scipy_and_transformers():
    ndimage = pytest.importorskip("scipy.ndimage")
    from transformers.models.whisper.generation_whisper import _median_filter
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 5, 40)).astype(np.float32)
    x[0, 0, :10] = 1.0                          # ties
    for width in (1, 3, 7, 9):
        got = A.median_filter(x, width)
        assert got.dtype == x.dtype and got.shape == x.shape
        assert np.array_equal(got, ndimage.median_filter(x, size=(1, 1, width), mode="mirror"))
        assert np.array_equal(got, _median_filter(torch.from_numpy(x), width).numpy())
    assert np.array_equal(A.median_filter(x[0, 0], 7),
                          ndimage.median_filter(x[0, 0], size=7, mode="mirror"))
    # a long axis in chunks
    y = rng.standard_normal((7, 3000)).astype(np.float32)
    assert np.array_equal(A.median_filter(y, 7), ndimage.median_filter(y, (1, 7), mode="mirror"))
    # at most width // 2 values: as it is
    short = x[..., :3]
    assert np.array_equal(A.median_filter(short, 7), short)
    for width in (0, 2, 4, -1, 1.0, True):
        with pytest.raises(ValueError, match="odd"):
            A.median_filter(x, width)


# ------------------------------------------------------------------------ the weights

def _hf_forward(hf, feats, dec):
    with torch.no_grad():
        return hf(input_features=torch.from_numpy(feats), decoder_input_ids=torch.as_tensor(dec),
                  output_attentions=True)


def test_cross_attention_weights_match_transformers(setup):
    model, hf, f = setup.model, setup.hf, setup.feats[:4]
    rng = np.random.default_rng(3)
    dec = np.array([SOT_DE + [W.NOTIMESTAMPS] + list(rng.integers(0, W.TEXT, 12)) + [W.EOT]
                    for _ in range(4)])
    heads = [(0, 1), (1, 0), (1, 2), (1, 3), (0, 3)]
    out = _hf_forward(hf, f, dec)
    want = np.stack([out.cross_attentions[layer][:, h].numpy() for layer, h in heads], 1)
    got, logits = model.cross_attention_weights(f, dec, heads, return_logits=True)
    assert got.dtype == np.float32 and got.shape == (4, len(heads), dec.shape[1], 150)
    assert np.max(np.abs(got - want)) < 1e-5
    assert np.allclose(got.sum(-1), 1, atol=1e-5)
    # the clips' weights differ (a model that ignored the audio would not)
    assert np.max(np.abs(got[0] - got[1])) > 1e-2
    # the pass is logits' (the same hidden states, bit for bit)
    assert np.array_equal(logits, model.logits(f, dec))
    # from the encoder output, one clip as (S, d) too
    mem = model.encode(f)
    assert np.array_equal(model.cross_attention_weights(mem, dec, heads), got)
    assert np.array_equal(model.cross_attention_weights(mem[1], dec[1], heads), got[1:2])
    # the default heads: the checkpoint's alignment_heads
    assert model.alignment_heads == [(1, 0), (1, 2)]
    assert np.array_equal(model.cross_attention_weights(mem, dec), got[:, [1, 2]])
    # the same bits for 1 and 2 threads
    one = model.cross_attention_weights(mem, dec, heads, n_threads=1, return_logits=True)
    two = model.cross_attention_weights(mem, dec, heads, n_threads=2, return_logits=True)
    assert np.array_equal(one[0], two[0]) and np.array_equal(one[1], two[1])
    # int8: close to float32, the same bits for 1 and 2 threads
    q8 = fastattn.WhisperModel.from_pretrained(setup.path, quantize="int8")
    w8 = q8.cross_attention_weights(mem, dec, heads, n_threads=1)
    assert np.max(np.abs(w8 - got)) < 0.1
    assert np.array_equal(w8, q8.cross_attention_weights(mem, dec, heads, n_threads=2))
    with pytest.raises(ValueError, match="heads"):
        model.cross_attention_weights(mem, dec, [(2, 0)])
    with pytest.raises(ValueError, match="heads"):
        model.cross_attention_weights(mem, dec, [(0, 4)])
    with pytest.raises(ValueError, match="encoder output"):
        model.cross_attention_weights(np.zeros((1, 150, 32), np.float32), dec[:1])
    with pytest.raises(ValueError, match="rows"):
        model.cross_attention_weights(mem[:2], dec)


def test_alignment_heads_in_the_generation_config(setup, tmp_path):
    model = setup.model
    assert model.generation_config["alignment_heads"] == [[1, 0], [1, 2]]
    cfg = {k: v for k, v in model.config.items()
           if k not in ("model_type", "head_dim", "gated_ffn", "relative_attention_num_buckets",
                        "output_scale", "decoder_vocab_size")}
    gen = {k: v for k, v in model.generation_config.items() if k != "alignment_heads"}
    # absent: openai-whisper's default, every head of the second half of the decoder layers
    m = fastattn.WhisperModel(**cfg, generation_config=gen)
    assert m.alignment_heads == [(1, 0), (1, 1), (1, 2), (1, 3)]
    m = fastattn.WhisperModel(**dict(cfg, decoder_layers=3), generation_config=gen)
    assert m.alignment_heads == [(1, h) for h in range(4)] + [(2, h) for h in range(4)]
    # malformed: an error naming the field when the model is made
    for bad in ("1,0", [[1]], [[1, -1]], [[1, 0.5]], [], [[True, 0]]):
        with pytest.raises(ValueError, match="alignment_heads"):
            fastattn.WhisperModel(**cfg, generation_config=dict(gen, alignment_heads=bad))
    # outside the decoder (distilled checkpoints ship their teacher's): loads, transcribes, and
    # is an error naming the field where the heads are used
    m = fastattn.WhisperModel(**cfg, generation_config=dict(gen, alignment_heads=[[7, 0]]))
    with pytest.raises(ValueError, match=r"alignment_heads has \[7, 0\]: the decoder has 2 "):
        m.alignment_heads
    with pytest.raises(ValueError, match="alignment_heads"):
        m.cross_attention_weights(setup.feats[:1], SOT_DE)
    m = fastattn.WhisperModel(**cfg, generation_config=dict(gen, alignment_heads=[[1, 4]]))
    with pytest.raises(ValueError, match="alignment_heads"):
        m.alignment_heads
    # kept by saved folders
    model.save_pretrained(tmp_path / "saved")
    back = fastattn.WhisperModel.from_pretrained(tmp_path / "saved")
    assert back.alignment_heads == [(1, 0), (1, 2)]


# ------------------------------------------------------------------------ token times

def test_token_times_match_transformers_token_timestamps(setup):
    """transformers' generate(return_token_timestamps=True): the cross-attention rows of the
    generated tokens (the row whose input is the token, the prefix rows dropped before the
    normalisation; the last token repeats the one before), the first num_frames // 2
    positions, normalised, median filtered (its config's width, 7), averaged, DTW. The same
    quantity from our teacher-forced weights and alignment_matrix / token_times."""
    model, hf, feats = setup.model, setup.hf, setup.feats
    sup = W.generation_config()["suppress_tokens"] + list(range(W.NOTIMESTAMPS + 1, W.VOCAB))
    distinct = 0
    for b, (nf, lang) in enumerate([(300, "de"), (250, "en"), (173, "fr"), (300, "de"),
                                    (222, "en"), (299, "fr")]):
        mask = np.zeros((1, FRAMES), np.int64)
        mask[0, :nf] = 1
        with torch.no_grad():
            out = hf.generate(torch.from_numpy(feats[b:b + 1]),
                              attention_mask=torch.from_numpy(mask), language=lang,
                              return_token_timestamps=True, max_new_tokens=40,
                              suppress_tokens=sup, return_dict_in_generate=True)
        seq = out["sequences"][0].numpy()
        want = out["token_timestamps"][0].numpy().astype(np.float64)
        n_prefix = 4                               # sot, language, task, notimestamps
        w = model.cross_attention_weights(feats[b:b + 1], seq)[0]
        rows = w[:, n_prefix:len(seq) - 1, :nf // 2]
        times = A.token_times(A.alignment_matrix(rows, 7))
        got = np.concatenate([np.zeros(n_prefix), times, times[-1:]])
        assert got.shape == want.shape
        assert np.allclose(got, want, atol=1e-6), (b, got, want)
        distinct += np.unique(want).size
    assert distinct > 6 * 4                       # times that vary


# ------------------------------------------------------------------------ words

def test_split_to_word_tokens_matches_faster_whisper(setup, tmp_path):
    tk = setup.tk
    fw = fw_tokenizer(tk, "de")
    fw_zh = fw_tokenizer(tk, "zh")
    cases = [
        _t(" the", " cat", " sat", " on", " the", " mat", "."),
        _t(" hello", ",", " world", "!", " don", "'t", " run", "ing", "?"),
        _t(" (", " it", "'s", ")", " \"", " big", "\"", " -", " dog", "s", ":"),
        [P[NI[:2].hex()], P[NI[2:].hex()], P["好"], P["世"], P[JIE[:1].hex()],
         P[JIE[1:].hex()], P["。"], P["“"], P["好"], P["”"], P["，"]],
        _t(" hello") + [P[NI[:2].hex()], P[NI[2:].hex()]] + _t(" world", "ed", " ¿", " a", "?"),
        [P[NI[:2].hex()]] + _t(" cat"),             # a character never completed
        _t("s", "ing", " a"),                        # no space first
    ]
    rng = np.random.default_rng(4)
    cases += [list(rng.integers(0, W.TEXT, int(rng.integers(1, 25)))) for _ in range(40)]
    from fastattn.text import JsonTokenizer
    folder = JsonTokenizer(setup.path)              # what Transcriber reads
    for toks in cases:
        toks = [int(t) for t in toks] + [W.EOT]
        for lang, ref in (("de", fw), ("zh", fw_zh)):
            want = ref.split_to_word_tokens(list(toks))
            got = A.split_to_word_tokens(toks, tk, W.EOT, lang)
            assert got == want, (toks, lang)
            assert A.split_to_word_tokens(toks, lambda ids: tk.decode(ids), W.EOT, lang) == want
            assert A.split_to_word_tokens(toks, folder, W.EOT, lang) == want
    # spelled out
    words, groups = A.split_to_word_tokens(cases[1] + [W.EOT], tk, W.EOT, "en")
    assert words == [" hello", ",", " world", "!", " don't", " runing", "?", ""]
    assert groups[4] == _t(" don", "'t") and groups[-1] == [W.EOT]
    words, groups = A.split_to_word_tokens(cases[3] + [W.EOT], tk, W.EOT, "zh")
    assert words == ["你", "好", "世", "界", "。", "“", "好", "”", "，", ""]
    assert groups[0] == [P[NI[:2].hex()], P[NI[2:].hex()]]


def _timings(words):
    out = []
    for k, (w, toks) in enumerate(words):
        out.append(A.WordTiming(w, list(toks), 0.1 * k, 0.1 * k + 0.1, 0.5))
    return out


def test_merge_punctuations_matches_faster_whisper():
    from faster_whisper.transcribe import merge_punctuations as fw_merge
    fixed = [(" (", [1]), (" it", [2]), ("'s", [3]), (")", [4]), (" \"", [5]), (" big", [6]),
             ("\"", [7]), (",", [8]), (" dog", [9]), (".", [10])]
    al = _timings(fixed)
    A.merge_punctuations(al)
    assert [w.word for w in al] == ["", " ( it", "'s)", "", "", " \" big\",", "", "", " dog.", ""]
    assert [w.tokens for w in al] == [[], [1, 2], [3, 4], [], [], [5, 6, 7, 8], [], [], [9, 10],
                                      []]
    assert al[1].start == 0.1 and al[5].end == 0.6     # the merged word keeps its own times
    marks = [" (", ")", " \"", "\"", ".", ",", " [", "]", "?", "!", " “", "”", "。", "，", "、",
             " ¿", " -", "-", ":", "'", " '"]
    plain = [" the", " cat", "s", " dog", "ing", " a "]
    rng = np.random.default_rng(5)
    for _ in range(300):
        n = int(rng.integers(1, 12))
        words = [(str(rng.choice(marks if rng.random() < 0.5 else plain)), [k])
                 for k in range(n)]
        ours = _timings(words)
        theirs = [dict(word=w.word, tokens=list(w.tokens), start=w.start, end=w.end,
                       probability=w.probability) for w in ours]
        A.merge_punctuations(ours, A.PREPEND_PUNCTUATIONS, A.APPEND_PUNCTUATIONS)
        fw_merge(theirs, A.PREPEND_PUNCTUATIONS, A.APPEND_PUNCTUATIONS)
        assert [(w.word, w.tokens) for w in ours] == [(d["word"], d["tokens"]) for d in theirs]


# ------------------------------------------------------------------------ against faster-whisper

def _reference_align(hf, feats, heads):
    """CTranslate2's Whisper align (which faster-whisper calls) as openai-whisper computes it,
    on transformers' eager attentions: the weights over the first num_frames // 2 positions
    softmaxed again (w / sum: the softmax of the scores there), normalised over tokens,
    transformers' median filter and DTW; the text tokens' probabilities."""
    from transformers.models.whisper.generation_whisper import (_dynamic_time_warping,
                                                                _median_filter)

    def align(encoder_output, sot_sequence, text_tokens, num_frames, median_filter_width=7):
        results = []
        if isinstance(num_frames, int):
            num_frames = [num_frames] * len(text_tokens)
        for toks, nf in zip(text_tokens, num_frames):
            dec = [list(sot_sequence) + [W.NOTIMESTAMPS] + list(toks) + [W.EOT]]
            out = _hf_forward(hf, feats, np.array(dec))
            w = torch.stack([out.cross_attentions[layer][0, h] for layer, h in heads])
            w = w[:, :, :nf // 2]
            w = w / w.sum(-1, keepdim=True)
            std, mean = torch.std_mean(w, dim=-2, keepdim=True, unbiased=False)
            w = _median_filter((w - mean) / std, median_filter_width)
            matrix = w.mean(0)[len(sot_sequence):-1]
            rows, cols = _dynamic_time_warping(-matrix.double().numpy())
            L, n = len(sot_sequence), len(toks)
            probs = out.logits[0, L:L + n, :W.EOT].softmax(-1)[torch.arange(n),
                                                                torch.as_tensor(toks)]
            results.append(types.SimpleNamespace(alignments=list(zip(rows, cols)),
                                                 text_token_probs=probs.tolist()))
        return results
    return align


def _faster_whisper(align, find=None):
    from faster_whisper.transcribe import WhisperModel as FW
    fake = types.SimpleNamespace(model=types.SimpleNamespace(align=align),
                                 frames_per_second=100, tokens_per_second=50)
    fake.find_alignment = find or (lambda *a, **k: FW.find_alignment(fake, *a, **k))
    return fake, FW


def _window_segments(rng, text, seek, window_s):
    """The window's text cut into segments with timestamp tokens, start / end absolute."""
    cuts = sorted(rng.choice(np.arange(1, len(text)), size=min(2, len(text) - 1),
                             replace=False).tolist()) if len(text) > 2 else []
    pieces = np.split(np.array(text), cuts)
    segs, t = [], seek / 100
    for piece in pieces:
        start = round(t + float(rng.uniform(0, 0.6)), 2)
        end = round(start + float(rng.uniform(0.2, window_s / len(pieces))), 2)
        toks = [W.NOTIMESTAMPS + 1 + int((start - seek / 100) / 0.02) % 150] + \
            [int(x) for x in piece] + [W.NOTIMESTAMPS + 1 + int((end - seek / 100) / 0.02) % 150]
        segs.append({"seek": seek, "start": start, "end": end, "tokens": toks})
        t = end
    return segs


@pytest.mark.parametrize("lang", ["de", "zh"])
def test_word_timestamps_match_faster_whisper(setup, lang):
    model, hf, tk = setup.model, setup.hf, setup.tk
    sot = SOT_DE if lang == "de" else SOT_ZH
    fw_tok = fw_tokenizer(tk, lang)
    assert fw_tok.sot_sequence == sot
    texts = [
        _t(" the", " cat", " sat", " on", " the", " mat", ".", " hello", ",", " world", "!"),
        _t(" (", " it", "'s", ")", " \"", " big", "\"", " dog", "s", ".", " don", "'t", " run",
           "ing", "?", " ¿", " a", "?"),
        [P[NI[:2].hex()], P[NI[2:].hex()], P["好"], P["，"], P["世"], P[JIE[:1].hex()],
         P[JIE[1:].hex()], P["。"], P["“"], P["好"], P["”"]],
    ]
    rng = np.random.default_rng(6)
    texts += [[int(t) for t in rng.integers(0, W.TEXT, int(rng.integers(3, 30)))]
              for _ in range(3)]
    moved, distinct = 0, set()
    for k, text in enumerate(texts):
        b = k % len(setup.feats)
        f = setup.feats[b:b + 1]
        nf = int(rng.integers(60, FRAMES + 1))
        mem = model.encode(f)
        align = _reference_align(hf, f, model.alignment_heads)
        fake, FW = _faster_whisper(align)
        # find_alignment: word, tokens, start, end, probability
        want = FW.find_alignment(fake, fw_tok, [text], None, nf)[0]
        got = A.find_alignment(model, mem, sot, text, nf, tk)
        assert len(got) == len(want) > 0
        for g, w in zip(got, want):
            assert (g.word, g.tokens, g.start, g.end) == (w["word"], w["tokens"], w["start"],
                                                          w["end"])
            assert abs(g.probability - w["probability"]) < 1e-5
        distinct.update(g.start for g in got)
        # the window's (S, d) encoder output, the features, 1 or 2 threads: the same
        for other in (A.find_alignment(model, mem[0], sot, text, nf, tk, n_threads=1),
                      A.find_alignment(model, mem, sot, text, nf, tk, n_threads=2),
                      A.find_alignment(model, f, sot, text, nf, tk),
                      A.find_alignment(model, mem, sot + [W.NOTIMESTAMPS], text, nf, tk)):
            assert other == got
        # add_word_timestamps, after a pause or not
        for last in (0.0, 7.5, 100.0):
            seek = int(rng.integers(0, 5000))
            segs = _window_segments(rng, text, seek, nf / 100)
            theirs = [dict(s) for s in segs]
            fw_last = FW.add_word_timestamps(fake, [theirs], fw_tok, None, nf,
                                             A.PREPEND_PUNCTUATIONS, A.APPEND_PUNCTUATIONS,
                                             last)
            results, our_last = A.add_word_timestamps(model, segs, mem, sot, tk, nf, seek / 100,
                                                       last_speech_timestamp=last)
            assert our_last == fw_last
            assert len(results) == len(theirs)
            for (start, end, words), s, orig in zip(results, theirs, segs):
                assert (start, end) == (s["start"], s["end"])
                moved += (start, end) != (orig["start"], orig["end"])
                assert len(words) == len(s["words"])
                for ours, ref in zip(words, s["words"]):
                    assert (ours.start, ours.end, ours.word) == (ref["start"], ref["end"],
                                                                 ref["word"])
                    assert abs(ours.probability - ref["probability"]) < 1e-5
    assert moved > 0                              # segment boundaries moved to the words
    assert len(distinct) > 5                      # words at varied times


def test_word_heuristics_match_faster_whisper(monkeypatch):
    """add_word_timestamps' heuristics (sentence-end clipping, punctuation merging, the words
    after a pause, segment boundaries) against faster-whisper's on random hand-made
    alignments of words with long, short and zero durations."""
    vocab = [" the", " cat", ".", ",", "!", "?", " (", ")", " \"", "\"", "。", " dog", "s"]
    rng = np.random.default_rng(7)
    fake_model = types.SimpleNamespace(generation_config={"eos_token_id": W.EOT,
                                                          "no_timestamps_token_id":
                                                              W.NOTIMESTAMPS})
    for _ in range(400):
        n = int(rng.integers(1, 14))
        words, t = [], float(rng.uniform(0, 3))
        tok = 0
        for _ in range(n):
            k = int(rng.integers(1, 3))
            d = float(rng.choice([0.0, rng.uniform(0.02, 0.4), rng.uniform(0.5, 4.0)]))
            words.append(A.WordTiming(str(rng.choice(vocab)), list(range(tok, tok + k)),
                                      round(t, 2), round(t + d, 2), float(rng.uniform())))
            tok += k
            t += d + float(rng.choice([0.0, rng.uniform(0, 2)]))
        text = list(range(tok))
        cuts = sorted(set(int(c) for c in rng.integers(1, tok, int(rng.integers(0, 3))))) \
            if tok > 1 else []
        seek = int(rng.integers(0, 9000))
        segs = []
        for piece in np.split(np.array(text), cuts):
            a = round(seek / 100 + float(rng.uniform(0, 25)), 2)
            segs.append({"seek": seek, "start": a, "end": round(a + float(rng.uniform(0, 5)), 2),
                         "tokens": [W.NOTIMESTAMPS + 1] + piece.tolist() + [W.NOTIMESTAMPS + 2]})
        last = float(rng.choice([0.0, seek / 100, seek / 100 + float(rng.uniform(0, 10))]))

        def ours_find(*a, **k):
            return copy.deepcopy(words)

        def theirs_find(tokenizer, text_tokens, encoder_output, num_frames):
            return [[dict(word=w.word, tokens=list(w.tokens), start=w.start, end=w.end,
                          probability=w.probability) for w in words]]
        monkeypatch.setattr(A, "find_alignment", ours_find)
        fake, FW = _faster_whisper(None, theirs_find)
        theirs = [dict(s) for s in segs]
        fw_last = FW.add_word_timestamps(fake, [theirs], types.SimpleNamespace(eot=W.EOT), None,
                                         3000, A.PREPEND_PUNCTUATIONS, A.APPEND_PUNCTUATIONS,
                                         last)
        results, our_last = A.add_word_timestamps(fake_model, segs, None, SOT_DE, None, 3000,
                                                  seek / 100, last_speech_timestamp=last)
        assert our_last == fw_last
        for (start, end, ws), s in zip(results, theirs):
            assert (start, end) == (s["start"], s["end"])
            assert [(w.start, w.end, w.word, w.probability) for w in ws] == [
                (d["start"], d["end"], d["word"], d["probability"]) for d in s["words"]]


def test_alignment_errors(setup):
    model, tk = setup.model, setup.tk
    mem = model.encode(setup.feats[:2])
    text = _t(" the", " cat")
    assert A.find_alignment(model, mem[:1], SOT_DE, [], 300, tk) == []
    assert A.add_word_timestamps(model, [], mem[:1], SOT_DE, tk, 300, 0.0) == ([], 0.0)
    with pytest.raises(ValueError, match="one window"):
        A.find_alignment(model, mem, SOT_DE, text, 300, tk)
    for nf in (0, 1, 301, 2.5, None):
        with pytest.raises(ValueError, match="num_frames"):
            A.find_alignment(model, mem[:1], SOT_DE, text, nf, tk)
    with pytest.raises(ValueError, match="text tokens"):
        A.find_alignment(model, mem[:1], SOT_DE, text + [W.NOTIMESTAMPS + 3], 300, tk)
    with pytest.raises(ValueError, match="text_tokens"):
        A.find_alignment(model, mem[:1], SOT_DE, [-1], 300, tk)
    with pytest.raises(ValueError, match="odd"):
        A.find_alignment(model, mem[:1], SOT_DE, text, 300, tk, medfilt_width=6)
    with pytest.raises(ValueError, match="max_target_positions"):
        A.find_alignment(model, mem[:1], SOT_DE, text * 40, 300, tk)
    with pytest.raises(TypeError, match="tokenizer"):
        A.find_alignment(model, mem[:1], SOT_DE, text, 300, 42)
