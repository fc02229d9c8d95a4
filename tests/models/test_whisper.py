"""WhisperModel against transformers' WhisperForConditionalGeneration, on random checkpoints.

Tiny random Whisper folders written by transformers (whisper_checkpoints.py: a multilingual and
an English-only variant with generation configs shaped as the real ones) and log-mel-like
features. Encoder output and teacher-forced logits within 1e-4 relative (float32); generate
token for token (greedy and beam search, forced or detected language, translate, timestamps,
prompts, per-clip languages, several windows of the seek loop); detect_language; Whisper's
timestamp rules against transformers' processor on random histories; the same bits for 1 and 2
threads and for a clip alone or in a batch (float32 and int8); int8 close to float32; config
errors by name; sharded, saved and state_dict round trips. Every comparison runs on clips that
decode differently (checked), so that a degenerate model cannot agree trivially.
"""
import json
import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import fastattn  # noqa: E402
import whisper_checkpoints as W  # noqa: E402
from fastattn.generation.whisper import SuppressAtBegin, TimestampRules  # noqa: E402

transformers.logging.set_verbosity_error()
N_CLIPS = 4
TOL = 1e-4                       # float32, relative to the largest reference value


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """(path, transformers model, fastattn model) per variant, made once."""
    made = {}

    def get(variant="multi", quantize=None, generation=None, **overrides):
        key = (variant, tuple(sorted(overrides.items())), tuple(sorted((generation or {}).items())))
        if key not in made:
            path = str(tmp_path_factory.mktemp(f"whisper-{variant}"))
            W.make_checkpoint(path, multilingual=variant == "multi", generation=generation,
                              **overrides)
            made[key] = {"path": path, "hf": W.load_hf(path)}
        entry = made[key]
        if quantize not in entry:
            entry[quantize] = fastattn.WhisperModel.from_pretrained(entry["path"],
                                                                    quantize=quantize)
        return entry["path"], entry["hf"], entry[quantize]
    return get


@pytest.fixture(scope="module")
def feats():
    return W.features(np.random.default_rng(1), N_CLIPS)


def _rel(a, b):
    return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30)


def _prefix(variant, lang="<|de|>"):
    if variant == "multi":
        return [W.SOT, W.LANG_IDS[lang], W.TRANSCRIBE, W.NOTIMESTAMPS]
    return [W.SOT, W.NOTIMESTAMPS]


def _hf_logits(hf, f, dec):
    with torch.no_grad():
        return hf(input_features=torch.from_numpy(f),
                  decoder_input_ids=torch.as_tensor(dec)).logits.numpy()


# ------------------------------------------------------------------------ the network


@pytest.mark.parametrize("variant", ["multi", "en"])
def test_encoder_and_logits_match_transformers(ckpt, feats, variant):
    path, hf, model = ckpt(variant)
    with torch.no_grad():
        want = hf.model.encoder(torch.from_numpy(feats)).last_hidden_state.numpy()
    got = model.encode(feats)
    assert got.shape == (N_CLIPS, W.SMALL["max_source_positions"], W.SMALL["d_model"])
    assert _rel(got, want) < TOL
    rng = np.random.default_rng(2)
    dec = np.array([_prefix(variant) + list(rng.integers(0, W.TEXT, 9)) for _ in range(N_CLIPS)])
    want = _hf_logits(hf, feats, dec)
    got = model.logits(feats, dec)
    assert got.shape == want.shape == (N_CLIPS, dec.shape[1], W.VOCAB)
    assert _rel(got, want) < TOL
    # the clips give different logits (a model that ignored its input would not)
    assert _rel(got[0], got[1]) > 1e-2


def test_real_window_128_mel_bins_and_float64(ckpt):
    """The real 30 s window (3000 frames, 1500 positions) with large-v3's 128 mel bins, in
    float32 and float64."""
    path, hf, model = ckpt("multi", num_mel_bins=128, max_source_positions=1500)
    f = W.features(np.random.default_rng(3), 2, n_mels=128, frames=3000)
    with torch.no_grad():
        want = hf.model.encoder(torch.from_numpy(f)).last_hidden_state.numpy()
    got = model.encode(f)
    assert got.shape == (2, 1500, W.SMALL["d_model"])
    assert _rel(got, want) < TOL
    kw = dict(language="en", max_new_tokens=10)
    assert np.array_equal(model.generate(f, **kw), W.hf_generate(hf, f, **kw))
    dec = np.array([_prefix("multi", "<|en|>") + [3, 4, 5]] * 2)
    m64 = fastattn.WhisperModel.from_pretrained(path, dtype=np.float64)
    hf64 = W.load_hf(path).double()
    with torch.no_grad():
        want64 = hf64(input_features=torch.from_numpy(f.astype(np.float64)),
                      decoder_input_ids=torch.as_tensor(dec)).logits.numpy()
    got64 = m64.logits(f, dec)
    assert got64.dtype == np.float64
    assert _rel(got64, want64) < 1e-10


# ------------------------------------------------------------------------ generation

MULTI_CASES = {
    "greedy, language detected": dict(max_new_tokens=20),
    "beam 4": dict(num_beams=4, max_new_tokens=20),
    "language": dict(language="de"),
    "a language per clip": dict(language=["de", "french", "<|en|>", "ZH"], max_new_tokens=16),
    "translate": dict(task="translate", max_new_tokens=16),
    "several windows": dict(language="fr", max_new_tokens=12),
    "timestamps": dict(return_timestamps=True),
    "timestamps, beam 4": dict(return_timestamps=True, num_beams=4),
    "timestamps, translate, beam 2": dict(language="german", task="translate",
                                          return_timestamps=True, num_beams=2),
    "prompt": dict(prompt_ids=[W.STARTOFPREV, 3, 4, 5], max_new_tokens=20),
    "prompt, timestamps, beam 3": dict(prompt_ids=[W.STARTOFPREV, 9, 8], num_beams=3,
                                       return_timestamps=True, max_new_tokens=16),
    "suppress_tokens, begin_suppress_tokens": dict(
        language="es", suppress_tokens=[5, 22, 46, 66], begin_suppress_tokens=[8, 141],
        max_new_tokens=16),
    "repetition controls": dict(language="de", repetition_penalty=1.5, no_repeat_ngram_size=2,
                                max_new_tokens=16),
    "beam, length_penalty, early_stopping": dict(language="de", num_beams=3,
                                                 length_penalty=0.5, early_stopping=True,
                                                 max_new_tokens=16),
}
EN_CASES = {
    "greedy": dict(max_new_tokens=20),
    "beam 4": dict(num_beams=4, max_new_tokens=20),
    "timestamps": dict(return_timestamps=True),
    "timestamps, beam 3": dict(return_timestamps=True, num_beams=3, max_new_tokens=20),
    "prompt": dict(prompt_ids=[W.STARTOFPREV, 3, 4, 5], max_new_tokens=16),
}


@pytest.mark.parametrize("variant, case", [("multi", c) for c in MULTI_CASES] +
                         [("en", c) for c in EN_CASES])
def test_generate_matches_transformers_token_for_token(ckpt, feats, variant, case):
    kw = (MULTI_CASES if variant == "multi" else EN_CASES)[case]
    path, hf, model = ckpt(variant)
    want = W.hf_generate(hf, feats, **kw)
    got = model.generate(feats, **kw)
    assert got.dtype == np.int64
    assert got.shape == want.shape and np.array_equal(got, want), (got, want)
    # the clips decode differently, and a batch of clips is right-padded with pad
    assert len({tuple(r) for r in got}) > 1
    if case == "several windows":
        # transformers continues a window that ends inside a timestamp pair from the pair's
        # timestamp: some clip got more than one window's max_new_tokens
        assert got.shape[1] > kw["max_new_tokens"]
    if "timestamps" in case:
        assert (got >= W.NOTIMESTAMPS + 1).any()


@pytest.mark.whole_model
def test_max_length_grows_window_after_window_as_in_transformers(ckpt, feats):
    """A checkpoint max_length below max_target_positions: transformers adds the prefix length
    to it before every window (its generation config is updated in place), up to
    max_target_positions."""
    path, hf, model = ckpt("multi", generation={"max_length": 24})
    for kw in (dict(language="de"), dict(language="de", num_beams=2),
               dict(prompt_ids=[W.STARTOFPREV, 3, 4, 5, 6, 7])):
        want = W.hf_generate(hf, feats, **kw)
        assert np.array_equal(model.generate(feats, **kw), want)
        assert want.shape[1] > 2 * 24                        # several windows


def test_checkpoint_length_settings(ckpt, feats):
    """max_new_tokens and min_new_tokens from the checkpoint's generation config (counted
    after the whole prefix, prompt included)."""
    path, hf, model = ckpt("multi", generation={"max_new_tokens": 7, "min_new_tokens": 6})
    long_prompt = [W.STARTOFPREV] + list(range(10, 30))
    for kw in (dict(language="de"), dict(prompt_ids=[W.STARTOFPREV, 3, 4], num_beams=2),
               # EOS comes early here: min_new_tokens (not min_length) must hold it back
               dict(prompt_ids=long_prompt, return_timestamps=True, max_new_tokens=12)):
        want = W.hf_generate(hf, feats, **kw)
        assert np.array_equal(model.generate(feats, **kw), want)


def test_decoder_interface_runs_fastattn_search(ckpt, feats):
    """start / DecoderState: fastattn.generation's generic search and score run the model; the
    step API gives the teacher-forced logits."""
    from fastattn.generation import generate
    path, hf, model = ckpt("multi")
    prefix = np.array([_prefix("multi")] * N_CLIPS)
    out = generate(model, feats, decoder_input_ids=prefix, max_new_tokens=6)
    assert out.shape[0] == N_CLIPS and np.array_equal(out[:, :4], prefix)
    lg = model.logits(feats, out[:, :-1])
    live = np.cumsum(out[:, 4:] == W.EOT, axis=1) - (out[:, 4:] == W.EOT) == 0
    assert np.array_equal(np.argmax(lg[:, 3:], axis=-1)[live], out[:, 4:][live])
    state = model.start(feats, num_beams=2, max_length=8)
    step = state.step(np.repeat(prefix, 2, axis=0))
    assert np.allclose(step[::2], lg[:, 3], rtol=1e-5, atol=1e-5)
    labels = out[:, 1:]
    sc = model.score(feats, labels)
    z = lg.astype(np.float64)
    logp = z - z.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    ref = np.take_along_axis(logp, labels[:, :, None], axis=2)[:, :, 0]
    assert np.allclose(sc, ref, atol=1e-4)


def test_window_draws_sharing_an_encoding_equal_draws_alone(ckpt, feats):
    """WindowDecoder's sampling (the long form's temperature fallback): the best_of draws of a
    window decoded together over one encoder output (a row that ended waits for the others)
    are bitwise each draw decoded alone, tokens and float64 sums alike, and the draw kept is
    the one with the highest sum per token."""
    from fastattn.generation import greedy_search
    from fastattn.generation.whisper import WindowDecoder, fallback_streams, strip_generated
    _, _, model = ckpt("multi")
    mem = model.encode(feats[:1])
    prefix = [W.SOT, W.LANG_IDS["<|de|>"], W.TRANSCRIBE]
    decoder = WindowDecoder(model, {"num_beams": 1})
    p, procs = decoder.window(len(prefix))
    R, pad = 5, p["pad_token_id"]
    kw = dict(return_scores=True, draw_temperature=0.9, score_dtype=np.float64)
    state = model.start(encoder_output=mem, num_beams=R, max_length=p["max_length"])
    together, sums = greedy_search(state, procs, p, R, prefix=np.array([prefix] * R),
                                   streams=fallback_streams(3, 0, 1, R), **kw)
    lengths = set()
    for r, g in enumerate(fallback_streams(3, 0, 1, R)):
        alone = model.start(encoder_output=mem, max_length=p["max_length"])
        seq, total = greedy_search(alone, procs, p, 1, prefix=np.array([prefix]), streams=[g],
                                   **kw)
        n = seq.shape[1]
        assert np.array_equal(together[r, :n], seq[0]) and (together[r, n:] == pad).all()
        assert sums[r] == total[0] and sums.dtype == np.float64
        lengths.add(n)
    assert len(lengths) > 1                              # rows ended at different steps
    got = decoder.decode(mem, prefix, p, procs, temperature=0.9,
                         streams=[fallback_streams(3, 0, 1, R)], scores=True)[0]
    toks = [strip_generated(together[r, len(prefix):], pad, p["eos_token_id"]) for r in range(R)]
    best = int(np.argmax([sums[r] / max(toks[r].size, 1) for r in range(R)]))
    assert np.array_equal(got.tokens, toks[best]) and got.sum_logprob == sums[best]
    # the sum is over the processed scores before the temperature (openai-whisper's)
    from fastattn.functional import log_softmax
    from fastattn.generation.processors import apply, history
    full = np.array([prefix + toks[best].tolist() + [W.EOT]])[:, :p["max_length"]]
    logits = model.logits(feats[:1], full)[0].astype(np.float32)
    want = 0.0
    for t in range(len(prefix) - 1, full.shape[1] - 1):
        sc = apply(procs, history(full, np.arange(1), t + 1, procs), logits[t][None].copy(),
                   np.zeros(1, np.int64))
        want += float(log_softmax(sc.astype(np.float64))[0, full[0, t + 1]])
    assert got.sum_logprob == pytest.approx(want, rel=1e-4, abs=1e-3)


def test_detect_language_matches_transformers(ckpt, feats):
    path, hf, model = ckpt("multi")
    want = hf.detect_language(torch.from_numpy(feats)).numpy()
    ids, probs = model.detect_language(feats, return_probs=True)
    assert np.array_equal(ids, want)
    assert len(set(ids.tolist())) > 1                     # the clips differ
    assert model.languages == list(W.LANG_IDS)
    assert np.allclose(probs.sum(axis=1), 1) and probs.shape == (N_CLIPS, len(W.LANG_IDS))
    order = np.array([W.LANG_IDS[t] for t in model.languages])
    assert np.array_equal(order[np.argmax(probs, axis=1)], ids)
    lg = _hf_logits(hf, feats, np.full((N_CLIPS, 1), W.SOT))[:, 0, order].astype(np.float64)
    ref = np.exp(lg - lg.max(axis=1, keepdims=True))
    assert np.allclose(probs, ref / ref.sum(axis=1, keepdims=True), atol=1e-4)
    with pytest.raises(ValueError, match="English-only|lang_to_id"):
        ckpt("en")[2].detect_language(feats)


def test_short_clips_are_padded_as_transformers_pads_them(ckpt, feats):
    """Fewer frames than a window: zero-padded (transformers pads each window)."""
    path, hf, model = ckpt("multi")
    f = np.ascontiguousarray(feats[:, :, :220])
    kw = dict(language="de", return_timestamps=True, max_new_tokens=20)
    assert np.array_equal(model.generate(f, **kw), W.hf_generate(hf, f, **kw))


# ------------------------------------------------------------------------ Whisper's rules


def test_timestamp_rules_match_transformers_processor():
    from transformers import GenerationConfig
    from transformers.generation.logits_process import (
        SuppressTokensAtBeginLogitsProcessor, WhisperTimeStampLogitsProcessor)
    rng = np.random.default_rng(4)
    tb = W.NOTIMESTAMPS + 1
    checked = 0
    for begin in (1, 3, 5):
        for max_init in (None, 0, 7):
            cfg = GenerationConfig(no_timestamps_token_id=W.NOTIMESTAMPS, eos_token_id=W.EOT,
                                   max_initial_timestamp_index=max_init)
            ref = WhisperTimeStampLogitsProcessor(cfg, begin_index=begin)
            ours = TimestampRules(W.NOTIMESTAMPS, W.EOT, begin, max_init)
            for length in range(begin, begin + 6):
                # histories mixing text and (non-decreasing, paired or not) timestamps
                seqs = rng.integers(0, W.TEXT, (16, length))
                ts = rng.random((16, length)) < 0.5
                seqs[ts] = tb + np.sort(rng.integers(0, 40, ts.sum()))
                scores = rng.standard_normal((16, W.VOCAB)).astype(np.float32) * 3
                scores[rng.random(scores.shape) < 0.05] = -np.inf
                # some rows where the timestamps carry most of the mass
                scores[::3, tb:] += 4
                want = ref(torch.as_tensor(seqs), torch.from_numpy(scores.copy())).numpy()
                got = ours(seqs, scores.copy())
                assert np.array_equal(got, want), (begin, max_init, length)
                checked += int((np.isinf(want) & ~np.isinf(scores)).sum())
    assert checked > 1000                                   # the rules did mask things
    ref = SuppressTokensAtBeginLogitsProcessor([W.BLANK, W.EOT], 3)
    ours = SuppressAtBegin([W.BLANK, W.EOT], 3, W.VOCAB)
    for length in (2, 3, 4):
        s = rng.standard_normal((2, W.VOCAB)).astype(np.float32)
        seqs = np.zeros((2, length), np.int64)
        want = ref(torch.as_tensor(seqs), torch.from_numpy(s.copy())).numpy()
        assert np.array_equal(ours(seqs, s.copy()), want)


def test_segments_and_seek_match_transformers():
    """What a window keeps and how far the seek moves: transformers' _retrieve_segment on
    random decodings (text, single timestamps, pairs, a single timestamp at the end)."""
    from transformers.models.whisper.generation_whisper import WhisperGenerationMixin
    from fastattn.generation.whisper import split_segments, strip_generated
    rng = np.random.default_rng(5)
    tb = W.NOTIMESTAMPS + 1
    kinds = set()
    for _ in range(300):
        n = int(rng.integers(0, 12))
        seq = rng.integers(0, W.TEXT, n)
        ts = rng.random(n) < 0.4
        seq[ts] = tb + np.sort(rng.integers(1, 140, ts.sum()))
        frames = int(rng.integers(50, 301))
        segs, offset = WhisperGenerationMixin._retrieve_segment(
            torch.as_tensor(seq), [None], torch.zeros(1, dtype=torch.float64), tb,
            torch.tensor([frames]), 0.02, 0.01, 2, 0, 0, False, torch.zeros((1, 4)))
        want = np.concatenate([s["tokens"].numpy() for s in segs]) if segs else seq[:0]
        kept, moved = split_segments(seq, tb, frames)
        assert np.array_equal(kept, want) and moved == int(offset), (seq, frames)
        kinds.add((len(segs), kept.size < seq.size, moved == frames))
    assert len(kinds) >= 4                       # pairs, cuts, whole windows, seek moves
    # the generated row as transformers keeps it: padding (pad == EOS) and EOS removed
    pad = eos = W.EOT
    assert strip_generated(np.array([5, 6, eos, pad, pad]), pad, eos).tolist() == [5, 6]
    assert strip_generated(np.array([5, 6, 7]), pad, eos).tolist() == [5, 6, 7]
    assert strip_generated(np.array([eos]), pad, eos).tolist() == []
    # pad != EOS: every pad token of the row counts (transformers), not only the trailing ones
    assert strip_generated(np.array([5, 1, 1, 9, 1, 1]), 1, 9).tolist() == [5, 1]


# ------------------------------------------------------------------------ bits and int8


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_same_bits_for_threads_and_for_a_clip_alone_or_in_a_batch(ckpt, feats, quantize):
    path, hf, model = ckpt("multi", quantize=quantize)
    enc = model.encode(feats, n_threads=1)
    assert np.array_equal(enc, model.encode(feats, n_threads=2))
    for b in range(N_CLIPS):
        assert np.array_equal(model.encode(feats[b:b + 1], n_threads=2)[0], enc[b])
    dec = np.array([_prefix("multi") + [3, 4, 5, 6]] * N_CLIPS)
    lg = model.logits(feats, dec, n_threads=1)
    assert np.array_equal(lg, model.logits(feats, dec, n_threads=2))
    for kw in (dict(max_new_tokens=16),
               dict(num_beams=3, return_timestamps=True, max_new_tokens=16)):
        out = model.generate(feats, n_threads=1, **kw)
        assert np.array_equal(out, model.generate(feats, n_threads=2, **kw))
        for b in range(N_CLIPS):
            alone = model.generate(feats[b:b + 1], **kw)[0]
            assert np.array_equal(out[b, :alone.size], alone)
            assert (out[b, alone.size:] == W.EOT).all()


def test_int8_is_close_to_float32(ckpt, feats):
    _, _, f32 = ckpt("multi")
    _, _, i8 = ckpt("multi", quantize="int8")
    assert i8.quantize == "int8" and f32.quantize is None
    dec = np.array([_prefix("multi") + [3, 4, 5, 6]] * N_CLIPS)
    assert _rel(i8.logits(feats, dec), f32.logits(feats, dec)) < 0.05
    assert _rel(i8.encode(feats), f32.encode(feats)) < 0.05
    assert np.array_equal(i8.detect_language(feats), f32.detect_language(feats))
    kw = dict(language="de", max_new_tokens=20)
    a, b = f32.generate(feats, **kw), i8.generate(feats, **kw)
    n = min(a.shape[1], b.shape[1])
    agreement = float((a[:, :n] == b[:, :n]).mean())
    print(f"int8 / float32 token agreement: {agreement:.3f} ({a.size} and {b.size} tokens)")
    assert agreement > 0.9


# ------------------------------------------------------------------------ loading


def test_config_fields_are_read_or_rejected_by_name(ckpt, feats, tmp_path):
    path, hf, model = ckpt("multi")
    assert model.config["num_mel_bins"] == 80 and model.n_frames == 300
    # transformers' Whisper never applies embed_scale: scale_embedding changes nothing
    _, hf_s, m_s = ckpt("multi", scale_embedding=True)
    dec = np.array([_prefix("multi") + [3, 4]] * N_CLIPS)
    assert _rel(m_s.logits(feats, dec), _hf_logits(hf_s, feats, dec)) < TOL
    # an untied proj_out is used as saved
    _, hf_u, m_u = ckpt("multi", tie_word_embeddings=False)
    assert _rel(m_u.logits(feats, dec), _hf_logits(hf_u, feats, dec)) < TOL

    def edited(fname, **changes):
        dst = tmp_path / f"edit{len(os.listdir(tmp_path))}"
        shutil.copytree(path, dst)
        with open(dst / fname) as f:
            d = json.load(f)
        d.update(changes)
        with open(dst / fname, "w") as f:
            json.dump(d, f)
        return dst

    # the fields of the real config.json files (openai/whisper-tiny's older one carries
    # generation fields too): read or known to change nothing; the result is the same model
    real = edited("config.json", _name_or_path="openai/whisper-tiny", apply_spec_augment=False,
                  architectures=["WhisperForConditionalGeneration"], classifier_proj_size=256,
                  decoder_layerdrop=0.0, encoder_layerdrop=0.0, init_std=0.02,
                  is_encoder_decoder=True, mask_feature_length=10, mask_feature_min_masks=0,
                  mask_feature_prob=0.0, mask_time_length=10, mask_time_min_masks=2,
                  mask_time_prob=0.05, max_length=448, median_filter_width=7,
                  num_hidden_layers=2, torch_dtype="float32", use_cache=True,
                  use_weighted_layer_sum=False, scale_embedding=False,
                  forced_decoder_ids=[[1, W.LANG_IDS["<|en|>"]], [2, W.TRANSCRIBE],
                                      [3, W.NOTIMESTAMPS]])
    assert np.array_equal(fastattn.WhisperModel.from_pretrained(real).logits(feats, dec),
                          model.logits(feats, dec))
    with pytest.raises(ValueError, match="unknown config field 'layer_norm_eps'"):
        fastattn.WhisperModel.from_pretrained(edited("config.json", layer_norm_eps=1e-6))
    with pytest.raises(ValueError, match="num_mel_bins"):
        fastattn.WhisperModel.from_pretrained(edited("config.json", num_mel_bins=0))
    with pytest.raises(ValueError, match="activation_function"):
        fastattn.WhisperModel.from_pretrained(edited("config.json",
                                                     activation_function="quick_gelu"))
    with pytest.raises(ValueError, match="no_speech_threshold"):
        fastattn.WhisperModel.from_pretrained(edited("generation_config.json",
                                                     no_speech_threshold=0.6))
    with pytest.raises(ValueError, match="unknown generation field 'foo'"):
        fastattn.WhisperModel.from_pretrained(edited("generation_config.json", foo=1))
    with pytest.raises(ValueError, match="lang_to_id"):
        fastattn.WhisperModel.from_pretrained(edited("generation_config.json",
                                                     lang_to_id={"<|xx|>": 10 ** 6}))
    # a shape the checkpoint does not have
    with pytest.raises(ValueError, match="shape"):
        fastattn.WhisperModel.from_pretrained(edited("config.json", max_target_positions=32))
    with pytest.raises(ValueError, match="WhisperModel"):
        fastattn.Seq2SeqTransformer.from_pretrained(path)
    with pytest.raises(ValueError, match="WhisperModel"):
        fastattn.Seq2SeqTransformer(model_type="whisper", vocab_size=50, d_model=16,
                                    encoder_attention_heads=2, decoder_attention_heads=2)


def test_generate_argument_errors(ckpt, feats):
    _, _, model = ckpt("multi")
    _, _, en = ckpt("en")
    with pytest.raises(ValueError, match="English-only"):
        en.generate(feats, language="en")
    with pytest.raises(ValueError, match="klingon"):
        model.generate(feats, language="klingon")
    with pytest.raises(ValueError, match="japanese|ja"):
        model.generate(feats, language="japanese")          # Whisper's, not this model's
    with pytest.raises(ValueError, match="task"):
        model.generate(feats, task="summarize")
    with pytest.raises(ValueError, match="4 clips"):
        model.generate(feats, language=["de", "fr"])
    with pytest.raises(ValueError, match="long-form"):
        model.generate(np.zeros((1, 80, 301), np.float32))
    with pytest.raises(ValueError, match="frames"):
        model.encode(feats[:, :, :200])
    with pytest.raises(ValueError, match="max_target_positions"):
        model.generate(feats, max_new_tokens=61)
    with pytest.raises(TypeError, match="do_sample"):
        model.generate(feats, do_sample=True)


def test_sharded_checkpoint_and_state_dict(ckpt, feats, tmp_path):
    path, hf, model = ckpt("multi")
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    shutil.copy(os.path.join(path, "generation_config.json"), tmp_path)
    assert os.path.exists(tmp_path / "model.safetensors.index.json")
    sharded = fastattn.WhisperModel.from_pretrained(tmp_path)
    dec = np.array([_prefix("multi") + [3, 4]] * N_CLIPS)
    assert np.array_equal(sharded.logits(feats, dec), model.logits(feats, dec))
    # state_dict: transformers' names (proj_out tied), the checkpoint's values
    want = {k: v.numpy() for k, v in hf.state_dict().items() if k != "proj_out.weight"}
    got = model.state_dict()
    assert list(got) and set(got) == set(want)
    for k, v in want.items():
        assert got[k].shape == v.shape and np.array_equal(got[k], v), k
    # load_state_dict from torch tensors: the same model
    other = fastattn.WhisperModel(**{k: v for k, v in model.config.items()
                                     if k not in ("model_type", "head_dim", "gated_ffn",
                                                  "relative_attention_num_buckets",
                                                  "output_scale", "decoder_vocab_size")},
                                  generation_config=model.generation_config, seed=3)
    assert not np.array_equal(other.logits(feats, dec), model.logits(feats, dec))
    other.load_state_dict(hf.state_dict())
    assert np.array_equal(other.logits(feats, dec), model.logits(feats, dec))


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_saved_folder_round_trip(ckpt, feats, tmp_path, quantize):
    path, hf, model = ckpt("multi", quantize=quantize)
    model.save_pretrained(tmp_path / "saved")
    back = fastattn.WhisperModel.from_pretrained(tmp_path / "saved")
    assert back.quantize == quantize
    assert os.path.exists(tmp_path / "saved" / "generation_config.json")
    dec = np.array([_prefix("multi") + [3, 4]] * N_CLIPS)
    assert np.array_equal(back.logits(feats, dec), model.logits(feats, dec))
    kw = dict(num_beams=2, return_timestamps=True, max_new_tokens=12)
    assert np.array_equal(back.generate(feats, **kw), model.generate(feats, **kw))
    with pytest.raises(ValueError, match="WhisperModel"):
        fastattn.Seq2SeqTransformer.from_pretrained(tmp_path / "saved")


def test_fastattn_convert_writes_a_whisper_folder(ckpt, feats, tmp_path):
    from fastattn.models.convert import convert
    path, hf, model = ckpt("multi", quantize="int8")
    assert convert(path, tmp_path / "out", "int8") == "WhisperModel"
    back = fastattn.WhisperModel.from_pretrained(tmp_path / "out")
    kw = dict(language="de", max_new_tokens=12)
    assert back.quantize == "int8"
    assert np.array_equal(back.generate(feats, **kw), model.generate(feats, **kw))
