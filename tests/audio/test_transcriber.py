"""Transcriber (audio of any length in, segments with timestamps out) against transformers.

Tiny random Whisper folders (tests/models/whisper_checkpoints.py: 3-s windows of 300 frames,
a word-level tokenizer.json) and speech-like audio of 8 to 13 s (several windows). The
reference is transformers' sequential long-form ``generate(..., return_segments=True)`` on the
same features: segment start / end (float64, bitwise) and tokens equal, greedy and beam,
with and without conditioning on the previous text, an initial prompt, a forced language /
translate, English-only. Then the temperature fallback and the no-speech skip, the same bits
for 1 and 2 threads (float32 and int8), the stream, language detection, the file formats and
the command, and bad input.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "models"))
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import whisper_checkpoints as W  # noqa: E402
from fastattn.audio import (Transcriber, format_timestamp, log_mel_spectrogram,  # noqa: E402
                            write_transcript)

transformers.logging.set_verbosity_error()
NO_FALLBACK = dict(temperature=0.0, compression_ratio_threshold=None, log_prob_threshold=None,
                   no_speech_threshold=None)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    made = {}

    def get(variant="multi"):
        if variant not in made:
            path = str(tmp_path_factory.mktemp(f"transcribe-{variant}"))
            W.make_checkpoint(path, multilingual=variant == "multi", seed=3)
            W.write_tokenizer(path)
            made[variant] = path
        return made[variant]
    return get


@pytest.fixture(scope="module")
def hf_models():
    cache = {}

    def get(path):
        if path not in cache:
            cache[path] = W.load_hf(path)
        return cache[path]
    return get


@pytest.fixture(scope="module")
def transcribers():
    cache = {}

    def get(path, **kw):
        key = (path, tuple(sorted(kw.items())))
        if key not in cache:
            cache[key] = Transcriber(path, **kw)
        return cache[key]
    return get


def _reference(hf, tr, audio, **kw):
    """transformers' long-form segments as (start, end, tokens), the empty ones left out (as
    the Transcriber leaves them out)."""
    feats = log_mel_spectrogram(audio, 80, padding="longest", truncation=False)
    if "prompt_ids" in kw:
        kw["prompt_ids"] = torch.as_tensor(kw["prompt_ids"])
    with torch.no_grad():
        out = hf.generate(torch.from_numpy(feats)[None], return_timestamps=True,
                          return_segments=True, **kw)
    ref = []
    for s in out["segments"][0]:
        toks = s["tokens"].numpy().astype(np.int64)
        text = tr.tokenizer.decode([int(t) for t in toks if t < W.EOT])
        if float(s["start"]) != float(s["end"]) and text.strip():
            ref.append((float(s["start"]), float(s["end"]), toks.tolist()))
    return ref


def _ours(res):
    return [(s.start, s.end, s.tokens) for s in res.segments]


CASES = [  # (audio seed, seconds, our options, transformers' options)
    (1, 12.0, dict(num_beams=1, condition_on_previous_text=False),
     dict(num_beams=1, condition_on_prev_tokens=False)),
    (1, 12.0, dict(num_beams=2, condition_on_previous_text=False),
     dict(num_beams=2, condition_on_prev_tokens=False)),
    (2, 12.0, dict(num_beams=1, condition_on_previous_text=True),
     dict(num_beams=1, condition_on_prev_tokens=True)),
    (4, 12.0, dict(num_beams=3, condition_on_previous_text=True),
     dict(num_beams=3, condition_on_prev_tokens=True)),
    (5, 8.5, dict(num_beams=1, condition_on_previous_text=False, language="de",
                  task="translate"),
     dict(num_beams=1, condition_on_prev_tokens=False, language="de", task="translate")),
]


@pytest.mark.parametrize("seed,seconds,ours,theirs", CASES,
                         ids=[f"case{i}" for i in range(len(CASES))])
def test_long_form_equals_transformers(folders, hf_models, transcribers, seed, seconds, ours,
                                       theirs):
    path = folders("multi")
    tr = transcribers(path)
    audio = W.speech_like(seconds, seed=seed)
    res = tr.transcribe(audio, **NO_FALLBACK, **ours)
    ref = _reference(hf_models(path), tr, audio, temperature=0.0, **theirs)
    assert _ours(res) == ref
    # the test means something: several windows, several segments, text of several words
    assert len({s.seek for s in res.segments}) >= 3 and len(res.segments) >= 5
    assert res.text == "".join(s.text for s in res.segments) and len(res.text.split()) > 10
    assert res.duration == pytest.approx(seconds)


def test_initial_prompt_equals_transformers_prompt_ids(folders, hf_models, transcribers):
    path = folders("multi")
    tr = transcribers(path)
    audio = W.speech_like(9.0, seed=7)
    prompt = "w5 w17 w33 w8"
    # the prompt starts the history that conditions every window (transformers' prompt_ids
    # with condition_on_prev_tokens and prompt_condition_type "first-segment")
    res = tr.transcribe(audio, initial_prompt=prompt, condition_on_previous_text=True,
                        num_beams=1, **NO_FALLBACK)
    ids = [W.STARTOFPREV] + [int(w[1:]) for w in prompt.split()]
    ref = _reference(hf_models(path), tr, audio, temperature=0.0, num_beams=1,
                     condition_on_prev_tokens=True, prompt_ids=np.array(ids))
    assert _ours(res) == ref
    plain = tr.transcribe(audio, condition_on_previous_text=True, num_beams=1, **NO_FALLBACK)
    assert _ours(plain) != _ours(res)               # the prompt changed the decoding
    # without conditioning, the prompt prompts the first window only (openai-whisper's and
    # faster-whisper's initial_prompt)
    first = tr.transcribe(audio, initial_prompt=prompt, condition_on_previous_text=False,
                          num_beams=1, **NO_FALLBACK)
    none = tr.transcribe(audio, condition_on_previous_text=False, num_beams=1, **NO_FALLBACK)
    later = [s for s in first.segments if s.seek > 0]
    assert _ours(first)[:1] == _ours(res)[:1] and _ours(first) != _ours(none)
    assert later == [s for s in none.segments if s.seek >= later[0].seek][:len(later)] or \
        later[0].seek not in {s.seek for s in none.segments}


def test_english_only_equals_transformers(folders, hf_models, transcribers):
    path = folders("en")
    tr = transcribers(path)
    audio = W.speech_like(10.0, seed=11)
    res = tr.transcribe(audio, num_beams=2, condition_on_previous_text=True, **NO_FALLBACK)
    ref = _reference(hf_models(path), tr, audio, temperature=0.0, num_beams=2,
                     condition_on_prev_tokens=True)
    assert _ours(res) == ref and len(res.segments) >= 3
    assert res.language == "en" and res.all_language_probs is None
    # faster-whisper's language="en" on an English-only model, and its beam_size
    assert tr.transcribe(audio, language="en", beam_size=2, condition_on_previous_text=True,
                         **NO_FALLBACK) == res
    with pytest.raises(TypeError, match="num_beams=3 and beam_size=2"):
        tr.transcribe(audio, num_beams=3, beam_size=2)
    with pytest.raises(ValueError, match="beam_rule"):
        tr.transcribe(audio, beam_rule="fairseq")
    assert tr.transcribe(audio, num_beams=2, condition_on_previous_text=True,
                         beam_rule="transformers", **NO_FALLBACK) == res
    with pytest.raises(ValueError, match="English-only"):
        tr.transcribe(audio, language="de")
    with pytest.raises(ValueError, match="English-only"):
        tr.detect_language(audio)


def test_detected_language_and_probabilities(folders, transcribers):
    path = folders("multi")
    tr = transcribers(path)
    audio = W.speech_like(5.0, seed=3)
    probs = tr.detect_language(audio)
    codes = [c for c, _ in probs]
    assert sorted(codes) == sorted(W.LANGS)
    assert sum(p for _, p in probs) == pytest.approx(1.0)
    assert [p for _, p in probs] == sorted((p for _, p in probs), reverse=True)
    feats = log_mel_spectrogram(audio, 80, padding="max_length", chunk_length=3)
    ids = tr.model.detect_language(feats[None])
    inv = {v: k for k, v in W.LANG_IDS.items()}
    assert inv[int(ids[0])] == f"<|{codes[0]}|>"
    stream = tr.stream(audio, **NO_FALLBACK)
    assert (stream.language, stream.language_probability) == probs[0]


def test_stream_yields_the_segments_in_order(folders, transcribers):
    tr = transcribers(folders("multi"))
    audio = W.speech_like(12.0, seed=1)
    stream = tr.stream(audio, num_beams=1, **NO_FALLBACK)
    assert stream.duration == pytest.approx(12.0)
    first = next(stream)
    rest = list(stream)
    whole = tr.transcribe(audio, num_beams=1, **NO_FALLBACK)
    assert [first] + rest == whole.segments
    assert [s.id for s in whole.segments] == list(range(len(whole.segments)))
    assert all(a.start <= b.start for a, b in zip(whole.segments, whole.segments[1:]))


def test_temperature_fallback_samples_reproducibly(folders, transcribers):
    tr = transcribers(folders("multi"))
    audio = W.speech_like(8.0, seed=2)
    # a ratio no text meets: every window is decoded at every temperature, then the most likely
    # result is kept (the beam's, by its renormalised log-probability, when 0 is among them);
    # no conditioning: with a fallback, a random model's repetitive text would not prompt
    # (test_longform_robust), without one it would, and `easy` compares the two
    kw = dict(temperature=(0.0, 0.5, 1.0), compression_ratio_threshold=0.1,
              log_prob_threshold=None, no_speech_threshold=None, num_beams=2, best_of=3,
              condition_on_previous_text=False)
    greedy = tr.transcribe(audio, **dict(kw, temperature=0.0))
    assert {s.temperature for s in greedy.segments} == {0.0}
    best = tr.transcribe(audio, **kw)
    for s in best.segments:
        assert s.avg_logprob <= 0 and s.compression_ratio > 0 and 0 <= s.no_speech_prob <= 1
    # sampled only: reproducible, driven by the seed
    hot = dict(kw, temperature=(0.5, 1.0))
    a = tr.transcribe(audio, **hot)
    b = tr.transcribe(audio, **hot)
    assert a.segments == b.segments and a.segments
    assert {s.temperature for s in a.segments} <= {0.5, 1.0}
    assert _ours(a) != _ours(greedy)
    other = tr.transcribe(audio, **dict(hot, seed=1))
    assert _ours(other) != _ours(a)                     # the seed drives the draws
    # a threshold every result passes: the first temperature is kept
    easy = tr.transcribe(audio, **dict(kw, compression_ratio_threshold=1e9))
    assert _ours(easy) == _ours(greedy)
    one = tr.transcribe(audio, **dict(hot, compression_ratio_threshold=1e9))
    assert {s.temperature for s in one.segments} == {0.5}


def test_avg_logprob_is_renormalised_after_the_rules(folders, transcribers):
    """avg_logprob: the chosen tokens' log-probabilities renormalised after the suppression
    and timestamp rules (what openai-whisper and CTranslate2 compute), recomputed here from
    teacher-forced logits, for beam search and greedy."""
    from fastattn.generation.processors import apply, history
    from fastattn.generation.whisper import WindowDecoder
    from fastattn.functional import log_softmax
    tr = transcribers(folders("multi"))
    audio = W.speech_like(3.0, seed=5)
    feats = log_mel_spectrogram(audio, 80, padding="longest", truncation=False)
    window = tr._window(feats, 0)
    mem = tr.model.encode(window)
    prefix = [W.SOT, W.LANG_IDS["<|de|>"], W.TRANSCRIBE]
    for beams in (1, 3):
        decoder = WindowDecoder(tr.model, {"num_beams": beams, "length_penalty": 1.0})
        p, procs = decoder.window(len(prefix))
        gen, total, _ = decoder.decode(mem, prefix, p, procs, scores=True)[0]
        # the Transcriber's first window is this decoding
        first = tr.transcribe(audio, num_beams=beams, language="de", **NO_FALLBACK).segments[0]
        assert first.seek == 0 and first.avg_logprob == total / (gen.size + 1)
        full = np.array([prefix + [int(t) for t in gen] + [W.EOT]])[:, :p["max_length"]]
        logits = tr.model.logits(window, full)[0].astype(np.float32)
        want = 0.0
        for t in range(len(prefix) - 1, full.shape[1] - 1):
            sc = apply(procs, history(full, np.arange(1), t + 1, procs), logits[t][None].copy(),
                       np.zeros(1, np.int64))
            want += float(log_softmax(sc.astype(np.float64))[0, full[0, t + 1]])
        assert gen.size > 5
        assert total == pytest.approx(want, rel=1e-4, abs=1e-3), beams
        # the raw (unrenormalised) beam score is lower: the rules removed probability mass
        if beams > 1:
            raw = 0.0
            for t in range(len(prefix) - 1, full.shape[1] - 1):
                lp = log_softmax(logits[t][None].astype(np.float64))
                raw += float(lp[0, full[0, t + 1]])
            assert raw <= want + 1e-6


def test_no_speech_windows_are_skipped(folders, transcribers):
    tr = transcribers(folders("multi"))
    audio = W.speech_like(8.0, seed=2)
    res = tr.transcribe(audio, temperature=0.0, no_speech_threshold=0.0, log_prob_threshold=0.0,
                        compression_ratio_threshold=None, num_beams=1)
    assert res.segments == [] and res.text == ""
    # the skip needs both: a likely decoding is kept however probable <|nospeech|> is
    kept = tr.transcribe(audio, temperature=0.0, no_speech_threshold=0.0,
                         log_prob_threshold=-1e9, compression_ratio_threshold=None, num_beams=1)
    assert kept.segments


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_same_bits_for_any_thread_count(folders, transcribers, quantize):
    path = folders("multi")
    audio = W.speech_like(9.0, seed=4)
    kw = dict(num_beams=2, temperature=(0.0, 1.0), compression_ratio_threshold=1.5, best_of=2)
    one = transcribers(path, quantize=quantize, n_threads=1).transcribe(audio, **kw)
    two = transcribers(path, quantize=quantize, n_threads=2).transcribe(audio, **kw)
    assert one == two and one.segments


def test_int8_close_to_float32(folders, transcribers):
    path = folders("multi")
    audio = W.speech_like(9.0, seed=4)
    f = transcribers(path).transcribe(audio, num_beams=1, **NO_FALLBACK)
    q = transcribers(path, quantize="int8").transcribe(audio, num_beams=1, **NO_FALLBACK)
    assert q.language == f.language
    a, b = f.segments[0].tokens, q.segments[0].tokens
    assert a[:4] == b[:4]                         # the first tokens agree on random weights


def test_files_and_arrays_agree(folders, transcribers, tmp_path):
    sf = pytest.importorskip("soundfile")
    tr = transcribers(folders("multi"))
    audio = W.speech_like(7.0, seed=6)
    wav = tmp_path / "a.wav"
    sf.write(wav, audio, 16000, subtype="FLOAT")
    assert tr.transcribe(str(wav), **NO_FALLBACK) == tr.transcribe(audio, **NO_FALLBACK)


def test_bad_input(folders, transcribers, tmp_path):
    path = folders("multi")
    tr = transcribers(path)
    audio = W.speech_like(2.0, seed=1)
    with pytest.raises(ValueError, match="empty array: no audio samples"):
        tr.transcribe(np.zeros(0, np.float32))
    with pytest.raises(ValueError, match="temperature"):
        tr.transcribe(audio, temperature=-1)
    with pytest.raises(TypeError, match="temperature"):
        tr.transcribe(audio, temperature="hot")
    with pytest.raises(TypeError, match="beam_width"):        # beam_size is num_beams' alias
        tr.transcribe(audio, beam_width=2)
    with pytest.raises(ValueError, match="num_beams"):
        tr.transcribe(audio, beam_size=0)
    with pytest.raises(ValueError, match="num_beams"):
        tr.transcribe(audio, num_beams=0)
    with pytest.raises(ValueError, match="task"):
        tr.transcribe(audio, task="summarise")
    with pytest.raises(ValueError, match="language"):
        tr.transcribe(audio, language="klingon")
    with pytest.raises(TypeError, match="compression_ratio_threshold"):
        tr.transcribe(audio, compression_ratio_threshold="2")
    with pytest.raises(ValueError, match="seed"):
        tr.transcribe(audio, seed=-1)
    with pytest.raises(TypeError, match="initial_prompt"):
        tr.transcribe(audio, initial_prompt=5)
    with pytest.raises(ValueError, match="NaN"):
        tr.transcribe(np.full(16000, np.nan, np.float32))
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        os.link(os.path.join(path, name), bare / name)
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Transcriber(str(bare))
    with pytest.raises(TypeError, match="model"):
        Transcriber(3)


class _Seg:
    def __init__(self, start, end, text):
        self.id, self.seek, self.start, self.end, self.text = 0, 0, start, end, text
        self.tokens, self.temperature, self.avg_logprob = [1], 0.0, -0.5
        self.compression_ratio, self.no_speech_prob, self.words = 1.0, 0.01, None


class _Res:
    text, language, language_probability, duration = " a b", "en", 0.9, 3725.5
    segments = [_Seg(0.0, 1.5, " a\n\nb"), _Seg(3723.0456, 3725.5, " c --> d")]


def test_formats():
    import io
    assert format_timestamp(3723.0456) == "01:02:03.046"
    assert format_timestamp(0.0004, ",") == "00:00:00,000"
    assert format_timestamp(59.9996) == "00:01:00.000"
    with pytest.raises(ValueError):
        format_timestamp(-1)
    out = {}
    for fmt in ("txt", "srt", "vtt", "json"):
        f = io.StringIO()
        write_transcript(_Res(), f, fmt)
        out[fmt] = f.getvalue()
    assert out["txt"] == "a\n\nb\nc --> d\n"
    assert out["srt"] == ("1\n00:00:00,000 --> 00:00:01,500\na b\n\n"
                          "2\n01:02:03,046 --> 01:02:05,500\nc -> d\n\n")
    assert out["vtt"] == ("WEBVTT\n\n00:00:00.000 --> 00:00:01.500\na b\n\n"
                          "01:02:03.046 --> 01:02:05.500\nc -> d\n\n")
    d = json.loads(out["json"])
    assert d["language"] == "en" and d["segments"][1]["start"] == 3723.0456
    with pytest.raises(ValueError, match="format"):
        write_transcript(_Res(), io.StringIO(), "docx")


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "fastattn", "transcribe", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=300)


def test_command(folders, transcribers, tmp_path):
    sf = pytest.importorskip("soundfile")
    path = folders("multi")
    audio = W.speech_like(9.0, seed=4)
    wav = tmp_path / "talk.wav"
    sf.write(wav, audio, 16000, subtype="FLOAT")
    opts = ["--beams", "1", "--temperature", "0"]
    r = _cli(path, "--input", str(wav), "--output", str(tmp_path / "talk.srt"), *opts,
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "/ 9.0 s" in r.stderr                                # progress in seconds
    tr = transcribers(path)
    res = tr.transcribe(audio, num_beams=1, temperature=0.0)
    import io
    f = io.StringIO()
    write_transcript(res, f, "srt")
    assert (tmp_path / "talk.srt").read_text() == f.getvalue()
    # json to a folder, several inputs
    wav2 = tmp_path / "other.wav"
    sf.write(wav2, W.speech_like(4.0, seed=9), 16000, subtype="FLOAT")
    outdir = tmp_path / "out"
    outdir.mkdir()
    r = _cli(path, "--input", str(wav), str(wav2), "--output-dir", str(outdir), "--format",
             "json", "--quiet", *opts, cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    d = json.loads((outdir / "talk.json").read_text())
    assert [s["tokens"] for s in d["segments"]] == [s.tokens for s in res.segments]
    assert (outdir / "other.json").exists()
    # stdout, txt
    r = _cli(path, "--input", str(wav), "--quiet", *opts, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == "".join(s.text.strip() + "\n" for s in res.segments)


def test_prefix_and_hotwords(folders, transcribers, tmp_path):
    """faster-whisper's ``prefix`` and ``hotwords`` (the prompts are checked token for token
    against faster-whisper's on the real tiny.en in tests/compat/test_faster_whisper_compat.py):
    the first window begins with <|0.00|> and the prefix's tokens and goes on from there;
    the hotwords follow <|startofprev|> in every window's prompt; batched windows ignore the
    prefix; the command line passes both."""
    from fastattn.audio._longform import plain_ids
    from fastattn.generation import whisper as gw
    path = folders("multi")
    tr = transcribers(path)
    audio = W.speech_like(9.0, seed=4)
    kw = dict(num_beams=2, temperature=0.0, language="en")
    ids = plain_ids(tr.tokenizer, " w5 w9", tr.eot)
    seen = []
    decode = gw.WindowDecoder.decode

    def record(self, encoder_output, prefix, p, procs, **k):
        seen.append((np.asarray(prefix).reshape(-1, np.asarray(prefix).shape[-1])[0].tolist(),
                     k.get("begin")))
        return decode(self, encoder_output, prefix, p, procs, **k)
    gw.WindowDecoder.decode = record
    try:
        res = tr.transcribe(audio, prefix="  w5 w9 ", **kw)
        prompt, begin = seen[0]
        sot = prompt.index(tr.sot)
        assert prompt[sot + 3:] == [tr.timestamp_begin] + ids and begin == sot + 3
        toks = [int(t) for t in res.segments[0].tokens]
        assert toks[:len(ids)] == ids or toks[1:1 + len(ids)] == ids
        assert res.text.lower().lstrip().startswith("w5 w9")
        # the same with two threads, bit for bit; another prefix decodes otherwise
        assert Transcriber(path, n_threads=2).transcribe(audio, prefix="w5 w9",
                                                         **kw).segments == res.segments
        seen.clear()
        hot = plain_ids(tr.tokenizer, " w11 w12", tr.eot)
        res_h = tr.transcribe(audio, hotwords="w11 w12", **kw)
        assert seen and all(p[:1 + len(hot)] == [tr.sot_prev] + hot for p, _ in seen)
        assert all(b == len(p) for p, b in seen)
        seen.clear()
        batched = tr.transcribe(audio, batch_size=2, prefix="w5 w9", hotwords="w11",
                                **kw)
        assert batched.segments == tr.transcribe(audio, batch_size=2, hotwords="w11",
                                                 **kw).segments
        assert all(p[:2] == [tr.sot_prev] + plain_ids(tr.tokenizer, " w11", tr.eot)
                   for p, _ in seen)
    finally:
        gw.WindowDecoder.decode = decode
    for bad, err in ((dict(prefix=3), TypeError), (dict(hotwords=b"x"), TypeError)):
        with pytest.raises(err, match=next(iter(bad))):
            tr.transcribe(audio, **bad)
    sf = pytest.importorskip("soundfile")
    wav = tmp_path / "talk.wav"
    sf.write(wav, audio, 16000, subtype="FLOAT")
    r = _cli(path, "--input", str(wav), "--quiet", "--beams", "2", "--temperature", "0",
             "--language", "en", "--prefix", "w5 w9", "--hotwords", "w11 w12",
             cwd=tmp_path)
    want = tr.transcribe(audio, prefix="w5 w9", hotwords="w11 w12", **kw)
    assert r.returncode == 0 and r.stdout == "".join(s.text.strip() + "\n"
                                                     for s in want.segments), r.stderr
    assert res_h.segments != res.segments


def test_language_detection_segments_multilingual_max_initial(folders, transcribers,
                                                            monkeypatch):
    """faster-whisper's language_detection_segments / _threshold (up to N windows, the first
    whose top language beats the threshold decides, else the language most often on top with
    its highest probability), multilingual=True (each window decoded in its own detected
    language) and max_initial_timestamp (the first timestamp at most this)."""
    from fastattn.generation import whisper as gw
    path = folders("multi")
    tr = Transcriber(path)
    audio = W.speech_like(70.0, seed=5)              # three windows
    script = []

    def probs(mem):                                  # the detector's answers, window by window
        code, p = script.pop(0)
        rest = [(c, (1 - p) / 2) for c in ("en", "de", "fr") if c != code][:2]
        return [(code, p)] + rest
    monkeypatch.setattr(tr, "_language_probs", probs)
    for answers, n, want in (
            ([("de", 0.4), ("fr", 0.45), ("de", 0.3)], 3, ("de", 0.4)),     # vote: de twice
            ([("de", 0.4), ("fr", 0.6)], 3, ("fr", 0.6)),                   # fr beats 0.5
            ([("de", 0.4)], 1, ("de", 0.4)),                                # one window
            ([("fr", 0.3), ("de", 0.3), ("en", 0.3)], 3, ("fr", 0.3))):     # ties: the first
        script[:] = list(answers)
        s = tr.stream(audio, language_detection_segments=n, temperature=0.0, num_beams=1)
        assert (s.language, s.language_probability) == want and not script
    script[:] = [("de", 0.9)]
    s = tr.stream(audio, language_detection_segments=3, language_detection_threshold=0.85,
                  temperature=0.0, num_beams=1)
    assert s.language == "de" and s.language_probability == 0.9   # 3 asked, 1 window read
    script[:] = [("de", 0.9), ("fr", 0.97), ("de", 0.8)]
    s = tr.stream(audio, language_detection_segments=3, language_detection_threshold=0.95,
                  temperature=0.0, num_beams=1)
    assert s.language == "fr" and s.language_probability == 0.97 and script == [("de", 0.8)]
    # multilingual: each window's prompt names the language detected on it
    seen = []
    decode = gw.WindowDecoder.decode

    def record(self, encoder_output, prefix, p, procs, **k):
        seen.append(list(np.asarray(prefix).reshape(-1, np.asarray(prefix).shape[-1])[0]))
        return decode(self, encoder_output, prefix, p, procs, **k)
    monkeypatch.setattr(gw.WindowDecoder, "decode", record)
    lang = tr.model.generation_config["lang_to_id"]
    script[:] = [("en", 0.9)] + [("de", 0.9), ("fr", 0.9)] * 200
    tr.transcribe(audio, multilingual=True, temperature=0.0, num_beams=1,
                  condition_on_previous_text=False)
    used = [next(t for t in row if t in lang.values()) for row in seen]
    assert len(used) >= 3 and used == [lang["<|de|>"], lang["<|fr|>"]] * (len(used) // 2) + \
        [lang["<|de|>"]] * (len(used) % 2)
    with pytest.raises(ValueError, match="multilingual"):
        tr.transcribe(audio, multilingual=True, batch_size=2)
    monkeypatch.undo()
    # max_initial_timestamp: the timestamp rules' limit (faster-whisper's round(t / 0.02))
    tr = transcribers(path)
    seen_limits = []
    rules = gw.TimestampRules.__init__

    def record_rules(self, *a, **k):
        seen_limits.append(a[3] if len(a) > 3 else k.get("max_initial_index"))
        return rules(self, *a, **k)
    monkeypatch.setattr(gw.TimestampRules, "__init__", record_rules)
    clip = audio[:16000 * 5]
    tr.transcribe(clip, language="en", temperature=0.0, num_beams=1, max_initial_timestamp=0.3)
    tr.transcribe(clip, language="en", temperature=0.0, num_beams=1)
    assert seen_limits[0] == 15
    assert seen_limits[-1] == tr.model.generation_config.get("max_initial_timestamp_index")
    first = tr.transcribe(clip, language="en", temperature=0.0, num_beams=1,
                          max_initial_timestamp=0.0).segments
    assert first and first[0].start == 0.0
    for bad in (-0.5, float("nan")):
        with pytest.raises((ValueError, TypeError), match="max_initial_timestamp"):
            tr.transcribe(clip, max_initial_timestamp=bad)
    with pytest.raises(ValueError, match="language_detection_segments"):
        tr.transcribe(clip, language_detection_segments=0)


@pytest.mark.parametrize("args,message", [
    (["--input", "{missing}"], "no such file"),
    (["--input", "{empty}", "--output", "{out}"], "empty.wav"),
    (["--input", "{junk}", "--output", "{out}"], "junk.wav"),
    (["--input", "{wav}", "--output", "{dir}/x.docx"], "unknown suffix"),
    (["--input", "{wav}", "{wav}"], "--output-dir"),
    (["--input", "{wav}", "--language", "klingon", "--output", "{out}"], "klingon"),
])
def test_command_failures_are_one_line(folders, tmp_path, args, message):
    sf = pytest.importorskip("soundfile")
    path = folders("multi")
    wav = tmp_path / "ok.wav"
    sf.write(wav, W.speech_like(2.0, seed=1), 16000)
    sf.write(tmp_path / "empty.wav", np.zeros(0, np.float32), 16000)
    (tmp_path / "junk.wav").write_bytes(b"RIFF\x00\x00junk" * 10)
    out = tmp_path / "out.txt"
    fmt = dict(missing=tmp_path / "nope.wav", empty=tmp_path / "empty.wav",
               junk=tmp_path / "junk.wav", wav=wav, out=out, dir=tmp_path)
    r = _cli(path, *[a.format(**fmt) for a in args], cwd=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastattn transcribe: error:"), r.stderr
    assert message in lines[0]
    assert not out.exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".fastattn-")]


# -- voice-activity detection and batched windows ------------------------------------------

def _with_silence(seconds, seed, gap=(5.0, 9.0)):
    audio = W.speech_like(seconds, seed=seed)
    a, b = (int(t * 16000) for t in gap)
    audio[a:b] = 0.001 * np.random.default_rng(seed).standard_normal(b - a)
    return audio


@pytest.mark.parametrize("model", ["webrtc", "silero"])
def test_vad_finds_the_silence(model):
    from fastattn.audio import vad
    pytest.importorskip({"webrtc": "webrtcvad", "silero": "onnxruntime"}[model])
    if model == "silero":
        import importlib.util
        if importlib.util.find_spec("silero_vad") is None:
            pytest.skip("silero-vad is not installed")
    audio = _with_silence(16.0, 1)
    probs = vad.speech_probabilities(audio, model)
    assert probs.shape == (-(-audio.size // 512),) and probs.min() >= 0 and probs.max() <= 1
    stretches = vad.speech_timestamps(audio, vad.VadOptions(min_silence_duration_ms=160,
                                                            speech_pad_ms=30), probs=probs)
    assert stretches and all(0 <= a < b <= audio.size for a, b in stretches)
    assert all(b1 <= a2 for (_, b1), (a2, _) in zip(stretches, stretches[1:]))
    inside = [(a, b) for a, b in stretches if a > 5.3 * 16000 and b < 8.7 * 16000]
    assert not inside                                   # nothing inside the silence
    if model == "webrtc":                               # the tones are speech to WebRTC
        covered = sum(b - a for a, b in stretches) / audio.size
        assert covered > 0.4


def test_vad_rules_on_given_probabilities():
    from fastattn.audio import vad
    sr, f = 16000, 512
    probs = np.zeros(200, np.float32)
    probs[10:40] = 0.9            # speech 0.32 .. 1.28 s
    probs[45:60] = 0.9            # after a 0.16 s pause
    probs[120:125] = 0.9          # a short burst
    audio = np.zeros(200 * f, np.float32)
    o = vad.VadOptions(min_silence_duration_ms=100, speech_pad_ms=0)
    assert vad.speech_timestamps(audio, o, probs=probs) == [(10 * f, 40 * f), (45 * f, 60 * f),
                                                             (120 * f, 125 * f)]
    # a pause shorter than min_silence joins; min_speech drops the burst; padding
    o = vad.VadOptions(min_silence_duration_ms=500, min_speech_duration_ms=250, speech_pad_ms=30)
    pad = int(0.03 * sr)
    assert vad.speech_timestamps(audio, o, probs=probs) == [(10 * f - pad, 60 * f + pad)]
    # too long: split
    probs2 = np.full(200, 0.9, np.float32)
    o = vad.VadOptions(max_speech_duration_s=1.0, speech_pad_ms=0)
    got = vad.speech_timestamps(audio, o, probs=probs2)
    assert len(got) > 1 and all(b - a <= sr for a, b in got)
    assert vad.collect_chunks([(0, 10), (10, 25), (30, 40), (50, 95)], 30) == \
        [[(0, 10), (10, 25)], [(30, 40)], [(50, 80)], [(80, 95)]]
    m = vad.TimeMap([(16000, 32000), (48000, 64000)])
    assert (m(0.0), m(0.5), m(1.0), m(1.0, is_end=True), m(1.5)) == (1.0, 1.5, 3.0, 2.0, 3.5)
    with pytest.raises(ValueError, match="threshold"):
        vad.VadOptions(threshold=1.5)


def test_batched_is_the_same_for_any_batch_size(folders, transcribers):
    pytest.importorskip("webrtcvad")
    tr = transcribers(folders("multi"))
    audio = _with_silence(30.0, 1)
    kw = dict(num_beams=2, vad_model="webrtc")
    runs = [tr.transcribe(audio, batch_size=n, **kw) for n in (1, 3, 8)]
    assert runs[0] == runs[1] == runs[2] and len(runs[0].segments) > 10
    # the same at temperature[0] alone (a window that loops is not decoded again)
    runs = [tr.transcribe(audio, batch_size=n, temperature=0.0, **kw) for n in (1, 3)]
    assert runs[0] == runs[1] and len(runs[0].segments) > 10
    assert runs[0].duration == pytest.approx(30.0)
    segs = runs[0].segments
    assert all(a.end <= b.start + 1e-9 for a, b in zip(segs, segs[1:]))
    assert not [s for s in segs if s.start > 5.5 and s.end < 8.5]       # the silence
    # one batched window is what the sequential loop decodes for that window alone
    from fastattn.audio import vad
    stretches = vad.speech_timestamps(audio, vad.VadOptions(max_speech_duration_s=3.0,
                                                            min_silence_duration_ms=160),
                                      model="webrtc")
    chunk = vad.collect_chunks(stretches, 48000)[0]
    piece = np.concatenate([audio[a:b] for a, b in chunk])
    padded = np.zeros(48000, np.float32)
    padded[:piece.size] = piece
    alone = tr.transcribe(padded, num_beams=2, temperature=0.0, condition_on_previous_text=False,
                          compression_ratio_threshold=None, log_prob_threshold=None,
                          no_speech_threshold=None)
    first_window = [s.tokens for s in alone.segments if s.seek == 0]
    got = [s.tokens for s in segs if s.seek == chunk[0][0] // 160]
    assert got[:len(first_window)] == first_window[:len(got)] and got


def test_vad_filter_sequential_maps_times_back(folders, transcribers):
    pytest.importorskip("webrtcvad")
    tr = transcribers(folders("multi"))
    audio = _with_silence(16.0, 2)
    res = tr.transcribe(audio, vad_filter=True, vad_model="webrtc", num_beams=1, **NO_FALLBACK)
    assert res.segments and res.duration == pytest.approx(16.0)
    starts = [s.start for s in res.segments]
    assert starts == sorted(starts) and max(s.end for s in res.segments) <= 16.0 + 1.0
    silent = np.zeros(32000, np.float32)
    none = tr.transcribe(silent, vad_filter=True, vad_model="webrtc")
    assert none.segments == [] and none.text == ""
    with pytest.raises(ValueError, match="vad_model"):
        tr.transcribe(audio, vad_filter=True, vad_model="energy")
    with pytest.raises(ValueError, match="max_speech_duration_s"):
        tr.transcribe(audio, batch_size=2, vad_parameters={"max_speech_duration_s": 60})
    with pytest.raises(TypeError, match="vad_parameters"):
        tr.transcribe(audio, vad_filter=True, vad_parameters={"loudness": 3})


def test_word_timestamps(folders, transcribers):
    """Words from the alignment heads (fastattn.audio.alignment, tested against transformers'
    token timestamps and faster-whisper's word rules in test_alignment.py), wired in: every
    window's words, ordered, inside the audio, the same bits for 1 and 2 threads."""
    path = folders("multi")
    audio = W.speech_like(12.0, seed=1)
    kw = dict(word_timestamps=True, num_beams=2, **NO_FALLBACK)
    one = transcribers(path, n_threads=1).transcribe(audio, **kw)
    two = transcribers(path, n_threads=2).transcribe(audio, **kw)
    assert one == two
    words = [w for s in one.segments for w in s.words]
    assert len(words) >= 5 and len({s.seek for s in one.segments}) >= 3
    assert all(0 <= w.start <= w.end <= 12.0 + 1.0 and 0 <= w.probability <= 1 for w in words)
    assert all(a.start <= b.start for a, b in zip(words, words[1:]))
    for s in one.segments:          # faster-whisper's rules move a start at most 0.5 s
        if s.words:
            assert abs(s.start - s.words[0].start) <= 0.5 + 1e-9
    # the words are the text's (this tokenizer's words carry no spaces: a window's text is
    # one word)
    flat = one.text.replace(" ", "")
    assert all(w.word.replace(" ", "") in flat for w in words)
    with pytest.raises(ValueError, match="word_timestamps"):
        transcribers(path).transcribe(audio, word_timestamps=True, batch_size=2)


def test_transcribe_batch_equals_each_alone(folders, transcribers):
    """Windows of several files decoded together: each file's result is bitwise its own
    batched transcription (greedy, beam, sampled first temperature; forced and detected
    languages)."""
    pytest.importorskip("webrtcvad")
    tr = transcribers(folders("multi"))
    audios = [_with_silence(12.0, 1, gap=(3.0, 5.0)), W.speech_like(4.0, seed=8),
              W.speech_like(7.5, seed=9)]
    for kw in (dict(num_beams=2), dict(num_beams=1, language="de"),
               dict(num_beams=1, temperature=0.7)):
        kw["vad_model"] = "webrtc"
        together = tr.transcribe_batch(audios, batch_size=4, **kw)
        alone = [tr.transcribe(a, batch_size=3, **kw) for a in audios]
        assert together == alone and all(r.segments for r in together)
    with pytest.raises(TypeError, match="list"):
        tr.transcribe_batch(audios[0])
