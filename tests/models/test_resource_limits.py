"""Resource limits at the model level: memory planned before it is allocated, hostile arguments.

Every case is the first call of a fresh interpreter (a cached workspace or a warmed-up model
would hide what a first call allocates): the child builds its model, makes one call and prints
what happened; the test reads that line. Nothing may kill the child: each call ends in a correct
result or a ValueError / TypeError / MemoryError naming the argument.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import fastattn
from fastattn._memory import available_bytes, check_plan

from encoder_checkpoints import write_numpy_bert

ROOT = os.path.dirname(os.path.dirname(fastattn.__file__))
SANITIZED = bool(os.environ.get("FASTATTN_SANITIZED"))

PRELUDE = textwrap.dedent(r'''
import json, os, sys, warnings
import numpy as np
import fastattn
def s2s():
    return fastattn.Seq2SeqTransformer(
        vocab_size=97, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
        decoder_ffn_dim=48, max_position_embeddings=64, tie_word_embeddings=False, seed=0)
def enc():
    return fastattn.EncoderModel.from_pretrained(os.environ["ENC_DIR"])
ids = np.array([[5, 6, 7, 8, 0], [9, 10, 11, 0, 96]])
def outcome(f):
    try:
        f()
    except (ValueError, TypeError, MemoryError) as exc:
        return type(exc).__name__, str(exc)
    return "ok", ""
''')


def run_child(code, env_extra=None, timeout=300):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra or {})
    res = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=env,
                         capture_output=True, text=True, timeout=timeout, cwd=os.path.dirname(
                             os.path.abspath(__file__)))
    assert res.returncode == 0, f"the child died (exit {res.returncode}):\n{res.stderr[-3000:]}"
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def enc_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("bert")
    write_numpy_bert(d, seed=3, max_position_embeddings=24)
    return str(d)


# -- the hostile-input suite ------------------------------------------------------------------
# (call, the exception expected or "ok", a word the message must hold)
HUGE_IDS = "np.ones((2_000_000, 60), np.int64)"
CASES = [
    # Seq2SeqTransformer.generate
    ("s2s().generate(np.array([[5, -1]]))", "ValueError", "input_ids"),
    ("s2s().generate(np.array([[5, 97]]))", "ValueError", "input_ids"),
    ("s2s().generate(np.array([[5.0, 6.0]]))", "TypeError", "input_ids"),
    ("s2s().generate(np.zeros((0, 5), int))", "ValueError", "input_ids"),
    ("s2s().generate(np.zeros((2, 3, 4), int))", "ValueError", "input_ids"),
    ("s2s().generate(np.ones((1, 65), int))", "ValueError", "max_position_embeddings"),
    ("s2s().generate(ids, np.ones((2, 4)))", "ValueError", "attention_mask"),
    ("s2s().generate(ids, np.full((2, 5), 2))", "ValueError", "attention_mask"),
    ("s2s().generate(ids, np.full((2, 5), np.nan))", "ValueError", "attention_mask"),
    ("s2s().generate(ids, max_new_tokens=0)", "ok", ""),
    ("s2s().generate(ids, max_new_tokens=-1)", "ValueError", "max_new_tokens"),
    ("s2s().generate(ids, max_new_tokens=10**12)", "ValueError", "max_new_tokens"),
    ("s2s().generate(ids, max_new_tokens=float('nan'))", "ValueError", "max_new_tokens"),
    ("s2s().generate(ids, max_new_tokens='5')", "ValueError", "max_new_tokens"),
    ("s2s().generate(ids, num_beams=0)", "ValueError", "num_beams"),
    ("s2s().generate(ids, num_beams=-1)", "ValueError", "num_beams"),
    ("s2s().generate(ids, num_beams=2.5)", "ValueError", "num_beams"),
    ("s2s().generate(ids, num_beams=10**9, max_new_tokens=2)", "MemoryError", "num_beams"),
    ("s2s().generate(np.ones((3, 60), int), num_beams=2**40)", "MemoryError", "num_beams"),
    (f"s2s().generate({HUGE_IDS}, max_new_tokens=3)", "MemoryError", "input_ids"),
    ("s2s().generate(ids, do_sample=True, temperature=0)", "ValueError", "temperature"),
    ("s2s().generate(ids, do_sample=True, temperature=-1.0)", "ValueError", "temperature"),
    ("s2s().generate(ids, do_sample=True, temperature=float('nan'))", "ValueError",
     "temperature"),
    ("s2s().generate(ids, do_sample=True, top_k=-1)", "ValueError", "top_k"),
    ("s2s().generate(ids, do_sample=True, top_p=1.5)", "ValueError", "top_p"),
    ("s2s().generate(ids, do_sample=True, top_p=float('nan'))", "ValueError", "top_p"),
    ("s2s().generate(ids, do_sample=True, seed=-1)", "ValueError", "seed"),
    ("s2s().generate(ids, length_penalty=float('nan'), num_beams=2)", "ValueError",
     "length_penalty"),
    ("s2s().generate(ids, early_stopping='sometimes', num_beams=2)", "ValueError",
     "early_stopping"),
    ("s2s().generate(ids, min_new_tokens=-1)", "ValueError", "min_new_tokens"),
    ("s2s().generate(ids, no_such_option=1)", "TypeError", "no_such_option"),
    ("s2s().generate(ids, n_threads=0)", "ValueError", "n_threads"),
    ("s2s().generate(ids, n_threads=-1)", "ValueError", "n_threads"),
    ("s2s().generate(ids, n_threads='2')", "TypeError", "n_threads"),
    ("s2s().generate(ids, bad_words_ids=[[200]])", "ValueError", "bad_words_ids"),
    ("s2s().generate(ids, suppress_tokens=list(range(97)))", "ValueError", "suppress_tokens"),
    # decoding controls
    ("s2s().generate(ids, do_sample=True, num_return_sequences=10**9, max_new_tokens=2)",
     "MemoryError", "num_return_sequences"),
    ("s2s().generate(ids, num_beams=2, num_return_sequences=3)", "ValueError",
     "num_return_sequences"),
    ("s2s().generate(ids, repetition_penalty=float('nan'))", "ValueError", "repetition_penalty"),
    ("s2s().generate(ids, no_repeat_ngram_size=10**12, encoder_no_repeat_ngram_size=10**12)",
     "ok", ""),
    ("s2s().generate(ids, decoder_input_ids=np.ones((2, 70), int))", "ValueError",
     "decoder_input_ids"),
    ("fastattn.generation.score(s2s(), ids, np.full((2, 70), 5))", "ValueError", "labels"),
    # encode / logits
    ("s2s().encode(np.array([[5, 200]]))", "ValueError", "input_ids"),
    (f"s2s().encode({HUGE_IDS})", "MemoryError", "input_ids"),
    ("s2s().logits(ids, np.array([[96, 5]]))", "ValueError", "decoder_input_ids"),
    ("s2s().logits(ids, np.zeros((2, 0), int))", "ValueError", "decoder_input_ids"),
    ("s2s().logits(ids, np.zeros((2, 65), int))", "ValueError", "decoder_input_ids"),
    ("s2s().logits(ids, np.array([[96, -5], [96, 5]]))", "ValueError", "decoder_input_ids"),
    ("s2s().logits(ids, np.array([[96, 5], [96, 6]]), n_threads=0)", "ValueError", "n_threads"),
    # the step API
    ("s2s().start(ids, num_beams=0)", "ValueError", "num_beams"),
    ("s2s().start(ids, max_length=0)", "ValueError", "max_length"),
    ("s2s().start(ids, max_length=10**9)", "ValueError", "max_length"),
    ("s2s().start(ids, num_beams=2**40)", "MemoryError", "num_beams"),
    ("s2s().start(ids).step(np.array([1]))", "ValueError", "tokens"),
    ("s2s().start(ids).step(np.array([1, 500]))", "ValueError", "tokens"),
    ("s2s().start(ids).step(np.array([1.0, 2.0]))", "TypeError", "tokens"),
    ("s2s().start(ids, num_beams=2).reorder(np.array([0, 0, 3, 7]))", "ValueError", "beam_idx"),
    ("s2s().start(ids).select_sources(np.array([1, 0]))", "ValueError", "keep"),
    ("s2s().start(encoder_output=np.full((2, 3, 32), np.nan, np.float32))", "ok", ""),
    ("s2s().start(encoder_output=np.ones((2, 3, 31), np.float32))", "ValueError",
     "encoder_output"),
    # EncoderModel
    ("enc()(np.array([[1, 2, 60]]))", "ValueError", "input_ids"),
    ("enc()(np.array([[1.5, 2.0]]))", "TypeError", "input_ids"),
    ("enc()(np.ones((1, 25), int))", "ValueError", "input_ids"),
    ("enc()(np.ones((2, 5), int), attention_mask=np.ones((2, 4)))", "ValueError",
     "attention_mask"),
    ("enc()(np.ones((2, 5), int), attention_mask=np.full((2, 5), -np.inf))", "ValueError",
     "attention_mask"),
    ("enc()(np.ones((2, 5), int), token_type_ids=np.full((2, 5), 7))", "ValueError",
     "token_type_ids"),
    ("enc()(np.zeros((0, 5), int))", "ok", ""),
    ("enc().embed(np.ones((2, 5), int), pooling='median')", "ValueError", "pooling"),
    ("enc().embed(np.ones((2, 5), int), normalize=2)", "TypeError", "normalize"),
    ("enc().embed(np.ones((2, 5), int), attention_mask=np.zeros((2, 5)))", "ok", ""),
    ("enc().embed(np.ones((3_000_000, 24), np.int64))", "MemoryError", "input_ids"),
    ("enc()(np.ones((3_000_000, 24), np.int64))", "MemoryError", "input_ids"),
]


@pytest.mark.parametrize("call,expect,word", CASES, ids=[c[0][:60] for c in CASES])
def test_hostile_call_in_a_fresh_process(enc_dir, call, expect, word):
    if SANITIZED and "MemoryError" == expect:
        # the plan is compared with available memory, which ASan's shadow makes meaningless
        pytest.skip("AddressSanitizer reserves terabytes of address space: the memory plan "
                    "is compared with available memory, which its shadow makes meaningless")
    got = run_child(f"print(json.dumps(outcome(lambda: {call})))", {"ENC_DIR": enc_dir})
    kind, msg = got
    assert kind == expect, f"{call}: {kind} {msg}"
    assert word in msg, f"{call}: the message does not name {word!r}: {msg}"
    if kind == "MemoryError":
        assert "bytes" in msg and "FASTATTN_NO_MEMORY_CHECK" in msg


def test_dask_hostile_arguments():
    pytest.importorskip("dask.bag")
    got = run_child('''
        import dask, dask.bag as db
        import fastattn.dask as fd
        dask.config.set(scheduler="synchronous")
        m = s2s()
        bag = db.from_sequence([np.array([5, 6, 0]), np.array([7, 0])], npartitions=1)
        res = [outcome(lambda: fd.generate([1, 2], m)),
               outcome(lambda: fd.generate(bag, m, batch_size=0)),
               outcome(lambda: fd.generate(bag, m, batch_size="8")),
               outcome(lambda: fd.generate(db.from_sequence([np.array([5.0])]), m).compute()),
               outcome(lambda: fd.generate(db.from_sequence([np.array([500])]), m).compute()),
               outcome(lambda: fd.generate(bag, m, num_beams=0).compute())]
        print(json.dumps(res))
    ''')
    kinds = [k for k, _ in got]
    assert kinds == ["TypeError", "ValueError", "ValueError", "TypeError", "ValueError",
                     "ValueError"], got
    assert "sources" in got[0][1] and "batch_size" in got[1][1] and "num_beams" in got[5][1]


# -- the plan --------------------------------------------------------------------------------

def test_check_plan_names_the_call_and_the_bytes():
    avail = available_bytes()
    assert avail is not None and avail > 0
    with pytest.raises(MemoryError, match=r"generate\(num_beams=7\) needs about .* bytes"):
        check_plan(avail + (1 << 30), "generate(num_beams=7)")
    check_plan(1 << 20, "small")                     # under the threshold: never checked


def test_opt_out_skips_the_check():
    got = run_child('''
        from fastattn._memory import check_plan
        print(json.dumps(outcome(lambda: check_plan(1 << 62, "x"))))
    ''', {"FASTATTN_NO_MEMORY_CHECK": "1"})
    assert got[0] == "ok"


@pytest.mark.skipif(SANITIZED, reason="AddressSanitizer reserves terabytes of address space")
def test_rlimit_as_is_honoured():
    """With 1 GiB of address space left under RLIMIT_AS, a 1.9 GiB encode plan is refused
    before it starts, and a small call still runs."""
    got = run_child('''
        import resource
        m = s2s()
        big = np.ones((20000, 60), int)
        vm = [int(ln.split()[1]) * 1024 for ln in open("/proc/self/status")
              if ln.startswith("VmSize")][0]
        resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))
        print(json.dumps([outcome(lambda: m.encode(big)), outcome(lambda: m.encode(ids))]))
    ''')
    assert got[0][0] == "MemoryError" and "RLIMIT_AS" in got[0][1], got
    assert got[1][0] == "ok"


PLAN_CHILD = '''
import resource
def rss(key):
    for ln in open("/proc/self/status"):
        if ln.startswith(key):
            return int(ln.split()[1]) * 1024
cfg = json.loads(sys.argv[1])
from fastattn.generation.search import _generate_plan
if cfg["kind"] == "encoder":
    m = fastattn.EncoderModel.from_pretrained(os.environ["ENC_DIR"])
    x = np.random.default_rng(0).integers(2, 60, size=(cfg["B"], cfg["S"]))
    plan = m._plan(cfg["B"], cfg["S"]) + cfg["B"] * m.hidden_size * 8
    call = lambda: m.embed(x)
else:
    m = fastattn.Seq2SeqTransformer(
        vocab_size=cfg["V"], d_model=cfg["d"], encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=2 * cfg["d"],
        decoder_ffn_dim=2 * cfg["d"], max_position_embeddings=256, tie_word_embeddings=False,
        seed=0)
    x = np.random.default_rng(0).integers(1, cfg["V"] - 1, size=(cfg["B"], cfg["S"]))
    K, T = cfg["beams"], cfg["new"] + 1
    if cfg["kind"] == "logits":
        y = np.random.default_rng(1).integers(0, cfg["V"], size=(cfg["B"], T))
        plan = m.plan_bytes(cfg["B"], cfg["S"], 1, T, chunk=T) + cfg["B"] * T * cfg["V"] * 4
        call = lambda: m.logits(x, y)
    else:
        kw = cfg.get("kw", {})
        plan = _generate_plan(m, cfg["B"], cfg["S"], T, K, kw.get("num_return_sequences", 1),
                              cfg.get("sample", False), kw.get("encoder_no_repeat_ngram_size", 0))
        call = lambda: m.generate(x, max_new_tokens=cfg["new"], min_new_tokens=cfg["new"],
                                  num_beams=K, do_sample=cfg.get("sample", False), seed=0, **kw)
before = rss("VmRSS")
open("/proc/self/clear_refs", "w").write("5")     # the peak := now
out = call()
grown = rss("VmHWM") - before
print(json.dumps([plan, grown]))
'''

PLAN_CASES = [
    {"kind": "encoder", "B": 256, "S": 24},
    {"kind": "encoder", "B": 3000, "S": 20},
    {"kind": "generate", "V": 8000, "d": 128, "B": 48, "S": 100, "beams": 1, "new": 40},
    {"kind": "generate", "V": 8000, "d": 128, "B": 16, "S": 100, "beams": 4, "new": 40},
    {"kind": "generate", "V": 20000, "d": 64, "B": 32, "S": 30, "beams": 1, "new": 30,
     "sample": True},
    {"kind": "generate", "V": 4000, "d": 256, "B": 8, "S": 200, "beams": 6, "new": 120},
    {"kind": "logits", "V": 16000, "d": 128, "B": 16, "S": 120, "beams": 1, "new": 100},
    # decoding controls: k samples per source are k rows; scores, penalties, n-gram bans
    {"kind": "generate", "V": 20000, "d": 64, "B": 8, "S": 30, "beams": 1, "new": 30,
     "sample": True, "kw": {"num_return_sequences": 4, "return_scores": True,
                            "repetition_penalty": 1.2, "no_repeat_ngram_size": 2}},
    {"kind": "generate", "V": 8000, "d": 128, "B": 16, "S": 100, "beams": 4, "new": 40,
     "kw": {"num_return_sequences": 2, "no_repeat_ngram_size": 3, "return_scores": True,
            "encoder_no_repeat_ngram_size": 2}},
]
SLACK = 24 << 20       # the interpreter's own: NumPy temporaries, OpenMP thread stacks


@pytest.mark.skipif(SANITIZED, reason="AddressSanitizer keeps freed memory in quarantine: "
                    "peak RSS says nothing about the plan")
@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's /proc")
@pytest.mark.parametrize("cfg", PLAN_CASES, ids=[json.dumps(c) for c in PLAN_CASES])
def test_plan_bounds_what_a_first_call_allocates(enc_dir, cfg):
    """Peak RSS growth of a fresh process's first call stays within the call's plan (+ a small
    constant), over shapes where the plan is tens to hundreds of MiB."""
    env = dict(os.environ, ENC_DIR=enc_dir, PYTHONPATH=ROOT + os.pathsep +
               os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-c", PRELUDE + PLAN_CHILD, json.dumps(cfg)], env=env,
                         capture_output=True, text=True, timeout=300,
                         cwd=os.path.dirname(os.path.abspath(__file__)))
    assert res.returncode == 0, res.stderr[-3000:]
    plan, grown = json.loads(res.stdout.strip().splitlines()[-1])
    assert plan > 8 << 20                    # a case that measures something
    assert grown <= plan + SLACK, f"grew {grown} bytes, planned {plan}"
