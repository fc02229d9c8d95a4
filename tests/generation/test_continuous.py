"""Continuous batching (fastattn.generation.continuous.ContinuousGreedy): sources joining and
leaving one running batch give, row for row, the tokens ``generate`` gives each source alone,
for every family with absolute positions, with the decoding controls, int8, any thread count;
and the refusals (T5, beams, sampling) and errors."""
import os
import sys

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import fastattn  # noqa: E402
from fastattn.generation.continuous import ContinuousGreedy  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "models"))
from seq2seq_checkpoints import IDS, VOCAB, make_checkpoint  # noqa: E402

FAMILIES = ["marian", "bart", "mbart", "pegasus", "m2m_100"]
# added to the EOS logit's bias (M2M100, T5: its output row scaled) so that these random
# checkpoints end rows at many different lengths (measured on seed 3)
EOS_BIAS = {"marian": 5.0, "bart": 2.0, "mbart": 1.5, "pegasus": 2.5, "m2m_100": 3.5}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    import torch
    out = {}
    for fam in FAMILIES + ["t5"]:
        path = str(tmp_path_factory.mktemp(f"cb_{fam}"))
        model = make_checkpoint(path, fam, tied=False, seed=3)
        eos = IDS[fam]["eos_token_id"]
        bias = EOS_BIAS.get(fam, 2.5)
        with torch.no_grad():               # rows that end at different lengths
            if hasattr(model, "final_logits_bias"):
                model.final_logits_bias[0, eos] += bias
            else:
                model.lm_head.weight[eos] *= bias
        model.save_pretrained(path)
        out[fam] = path
    return out


def sources(fam, rng, n, lo=2, hi=40):
    ids = IDS[fam]
    special = {ids["pad_token_id"], ids["eos_token_id"], ids.get("bos_token_id"),
               ids["decoder_start_token_id"]}
    normal = np.array([t for t in range(VOCAB) if t not in special])
    out = []
    for _ in range(n):
        s = rng.choice(normal, int(rng.integers(lo, hi))).tolist()
        out.append(s + [ids["eos_token_id"]])
    return out


def alone(model, src, **kw):
    """generate on the source alone, without the padding after EOS."""
    out = model.generate(np.array([src]), **kw)[0]
    eos = np.flatnonzero(out[1:] == model.eos_id)       # (BART's start token is its EOS)
    return out[:eos[0] + 2] if eos.size else out


def run_schedule(cb, srcs, schedule):
    """Add srcs in the groups `schedule` gives (a group before each step, while any are left);
    -> {source index: tokens}, and the most rows that ran at once."""
    res, owner, nxt, step, most = {}, {}, 0, 0, 0
    while nxt < len(srcs) or cb.n:
        k = schedule(step)
        if nxt < len(srcs) and k:
            for h, i in zip(cb.add(srcs[nxt:nxt + k]), range(nxt, nxt + k)):
                owner[h] = i
            nxt += k
        most = max(most, cb.n)
        for h, toks in cb.step():
            res[owner[h]] = toks
        step += 1
    return res, most


@pytest.mark.parametrize("fam", FAMILIES)
def test_rows_joining_and_leaving_equal_generate_alone(folders, fam):
    m = fastattn.Seq2SeqTransformer.from_pretrained(folders[fam])
    rng = np.random.default_rng(len(fam))
    srcs = sources(fam, rng, 14)
    kw = dict(max_new_tokens=24, num_beams=1)
    want = [alone(m, s, **kw) for s in srcs]
    lengths = {len(w) for w in want}
    assert len(lengths) >= 3, "the checkpoint should end its rows at different lengths"
    cb = ContinuousGreedy(m, **kw)
    got, most = run_schedule(cb, srcs, lambda t: [3, 0, 2, 1, 0, 0, 4][t % 7])
    assert most >= 4
    for i, w in enumerate(want):
        np.testing.assert_array_equal(got[i], w, err_msg=f"{fam} source {i}")


@pytest.mark.parametrize("settings", [
    dict(min_new_tokens=6, max_new_tokens=16),
    dict(repetition_penalty=1.3, no_repeat_ngram_size=2, max_new_tokens=20),
    dict(bad_words_ids=[[5], [7, 8]], suppress_tokens=[9, 10], max_new_tokens=12),
    dict(forced_bos_token_id=11, max_new_tokens=10),
])
def test_decoding_controls_apply_per_row(folders, settings):
    """The processors read each row's own length and history: min_new_tokens, forced BOS and
    n-gram bans give each row what it gets alone although the rows' lengths differ."""
    m = fastattn.Seq2SeqTransformer.from_pretrained(folders["mbart"])
    srcs = sources("mbart", np.random.default_rng(7), 10)
    want = [alone(m, s, num_beams=1, **settings) for s in srcs]
    cb = ContinuousGreedy(m, num_beams=1, **settings)
    got, _ = run_schedule(cb, srcs, lambda t: 2 if t % 2 == 0 else 0)
    for i, w in enumerate(want):
        np.testing.assert_array_equal(got[i], w, err_msg=str(i))


def test_int8_and_thread_counts(folders):
    m = fastattn.Seq2SeqTransformer.from_pretrained(folders["marian"], quantize="int8")
    srcs = sources("marian", np.random.default_rng(11), 9)
    want = [alone(m, s, max_new_tokens=20, num_beams=1) for s in srcs]
    for threads in (1, 2, 3):
        cb = ContinuousGreedy(m, n_threads=threads, max_new_tokens=20, num_beams=1)
        got, _ = run_schedule(cb, srcs, lambda t: 1)
        for i, w in enumerate(want):
            np.testing.assert_array_equal(got[i], w, err_msg=f"threads {threads} source {i}")


def test_drop_removes_rows_and_the_others_go_on(folders):
    m = fastattn.Seq2SeqTransformer.from_pretrained(folders["bart"])
    srcs = sources("bart", np.random.default_rng(5), 6)
    want = [alone(m, s, max_new_tokens=30, num_beams=1) for s in srcs]
    cb = ContinuousGreedy(m, max_new_tokens=30, num_beams=1)
    hs = cb.add(srcs)
    cb.step()
    cb.drop([hs[1], hs[4], 12345])                 # an unknown handle is ignored
    assert cb.n == 4
    got = {}
    while cb.n:
        for h, toks in cb.step():
            got[h] = toks
    assert set(got) == {hs[0], hs[2], hs[3], hs[5]}
    for i in (0, 2, 3, 5):
        np.testing.assert_array_equal(got[hs[i]], want[i])


def test_grows_past_its_first_capacity(folders):
    """Rows added one at a time (the buffers double), long sources after short ones (the
    cross-attention buffers widen), rows longer than the first time capacity."""
    m = fastattn.Seq2SeqTransformer.from_pretrained(folders["m2m_100"])
    rng = np.random.default_rng(2)
    srcs = sources("m2m_100", rng, 6, 2, 5) + sources("m2m_100", rng, 6, 40, 60)
    want = [alone(m, s, max_new_tokens=40, min_new_tokens=20, num_beams=1) for s in srcs]
    cb = ContinuousGreedy(m, max_new_tokens=40, min_new_tokens=20, num_beams=1)
    got, most = run_schedule(cb, srcs, lambda t: 1)
    assert most > 4
    for i, w in enumerate(want):
        np.testing.assert_array_equal(got[i], w, err_msg=str(i))


def test_refusals_and_errors(folders):
    t5 = fastattn.Seq2SeqTransformer.from_pretrained(folders["t5"])
    with pytest.raises(ValueError, match="relative position"):
        ContinuousGreedy(t5)
    m = fastattn.Seq2SeqTransformer.from_pretrained(folders["marian"])
    with pytest.raises(ValueError, match="num_beams"):
        ContinuousGreedy(m, num_beams=4)
    with pytest.raises(ValueError, match="do_sample"):
        ContinuousGreedy(m, num_beams=1, do_sample=True)
    with pytest.raises(TypeError, match="Seq2SeqTransformer"):
        ContinuousGreedy(object())
    cb = ContinuousGreedy(m, num_beams=1, max_new_tokens=5)
    assert cb.step() == [] and cb.add([]) == []
    with pytest.raises(ValueError, match=r"sources\[1\]"):
        cb.add([[3, 4], [3, VOCAB + 5]])
    with pytest.raises(ValueError, match="empty"):
        cb.add([[]])
    with pytest.raises(ValueError, match="max_position_embeddings|positions"):
        cb.add([[3] * 500])
    assert cb.n == 0                                # nothing was added by a failed call


@pytest.mark.parametrize("fam", ["bart", "marian"])
def test_rows_with_their_own_max_new_tokens(folders, fam):
    """Rows of different length limits share the batch; BART forces EOS at its row's own last
    position (forced_eos_token_id reads max_length)."""
    m = fastattn.Seq2SeqTransformer.from_pretrained(folders[fam])
    srcs = sources(fam, np.random.default_rng(21), 12)
    limits = [3, 17, 8, None, 30, 1] * 2
    base = dict(num_beams=1, max_new_tokens=11)
    want = [alone(m, s, **dict(base, **({} if k is None else {"max_new_tokens": k})))
            for s, k in zip(srcs, limits)]
    cb = ContinuousGreedy(m, **base)
    got, owner = {}, {}
    for step in range(200):
        if step < len(srcs):
            (h,) = cb.add([srcs[step]], max_new_tokens=limits[step])
            owner[h] = step
        for h, toks in cb.step():
            got[owner[h]] = toks
        if len(got) == len(srcs):
            break
    for i, w in enumerate(want):
        np.testing.assert_array_equal(got[i], w, err_msg=f"source {i} limit {limits[i]}")
    with pytest.raises(ValueError, match="max_new_tokens"):
        cb.add([srcs[0]], max_new_tokens=10 ** 6)
