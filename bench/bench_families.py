"""The model families at full size: fastattn vs CTranslate2 (float32) vs transformers (issue 34).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE flock -x /tmp/fa-cpu.lock \
        python bench/bench_families.py [--repeats 5] [--threads 2] [--models t5,m2m100,mpnet]

Checkpoints (random, written once under --dir with transformers' ``save_pretrained``; nothing is
downloaded): every 2-D parameter (matrices, embeddings, T5's relative position bias table)
N(0, 1/last dim), T5's q also divided by sqrt(d_kv) (T5's own init: its attention does not scale
q k^T), norm weights 1 + N(0, 0.01), biases N(0, 0.01), so that activations stay at unit scale
and greedy decoding neither collapses onto one token nor turns chaotic (every system then makes
transformers' tokens):

- t5: the flan-T5-base shape (T5 v1.1: d_model 768, d_ff 2048, 12 + 12 layers, 12 heads, d_kv
  64, gated-gelu, untied head, vocab 32128);
- m2m100: the M2M100-418M shape (d_model 1024, FFN 4096, 12 + 12 layers, 16 heads, vocab
  128112, scale_embedding, sinusoidal positions);
- mpnet: the MPNet-base shape (hidden 768, 12 layers, 12 heads, intermediate 3072), the last
  hidden state of 32 x 128 tokens.

Works: greedy decoding of 8 sources x 128 tokens -> exactly 64 new tokens (EOS blocked: min
length = max length, the same settings for every system); the encoder's forward. Systems:
fastattn, CTranslate2 float32 (its TransformersConverter on the same folder; not for MPNet) and
transformers (PyTorch), each in a process of its own (``--child``), all with --threads threads;
a child warms up once, then times --repeats calls. Printed: the medians, ratios, fastattn's
tokens against transformers' (equal tokens) and its hidden state's max |difference|.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

NEW_TOKENS, SRC_LEN, BATCH = 64, 128, 8
EMB_BATCH = 32
MODELS = ("t5", "m2m100", "mpnet")
SYSTEMS = {"t5": ("fastattn", "ctranslate2", "transformers"),
           "m2m100": ("fastattn", "ctranslate2", "transformers"),
           "mpnet": ("fastattn", "transformers")}
TITLES = {"t5": "flan-T5-base shape (T5 v1.1, 768, 12+12 layers, vocab 32128), greedy 8x128->64",
          "m2m100": "M2M100-418M shape (1024, 12+12 layers, vocab 128112), greedy 8x128->64",
          "mpnet": "MPNet-base shape (768, 12 layers), last hidden state 32x128"}


# ---------------------------------------------------------------------------------------------
# checkpoints (a child process of their own: torch is loaded there)

def _hf_config(model):
    import transformers as tr
    if model == "t5":
        return tr.T5Config(vocab_size=32128, d_model=768, d_kv=64, d_ff=2048, num_layers=12,
                           num_decoder_layers=12, num_heads=12,
                           relative_attention_num_buckets=32, relative_attention_max_distance=128,
                           feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                           dropout_rate=0.0, pad_token_id=0, eos_token_id=1,
                           decoder_start_token_id=0), tr.T5ForConditionalGeneration
    if model == "m2m100":
        return tr.M2M100Config(vocab_size=128112, d_model=1024, encoder_layers=12,
                               decoder_layers=12, encoder_attention_heads=16,
                               decoder_attention_heads=16, encoder_ffn_dim=4096,
                               decoder_ffn_dim=4096, max_position_embeddings=1024,
                               scale_embedding=True, activation_function="relu", dropout=0.0,
                               attention_dropout=0.0, activation_dropout=0.0,
                               pad_token_id=1, bos_token_id=0, eos_token_id=2,
                               decoder_start_token_id=2), tr.M2M100ForConditionalGeneration
    return tr.MPNetConfig(vocab_size=30527, hidden_size=768, num_hidden_layers=12,
                          num_attention_heads=12, intermediate_size=3072,
                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0), tr.MPNetModel


def build(model, path, seed=0):
    """Write the random checkpoint of `model` into `path` (save_pretrained)."""
    import torch
    torch.manual_seed(seed)
    config, cls = _hf_config(model)
    m = cls(config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
                if model == "t5" and name.endswith(".q.weight"):
                    p /= config.d_kv ** 0.5          # T5 folds 1/sqrt(d_kv) into q (its init)
            elif "norm" in name.lower() and name.endswith("weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    m.save_pretrained(path)


class _Vocab:
    """What CTranslate2's converters read from a tokenizer: tokens t<id>, the special ones."""

    def __init__(self, size, pad, eos, unk):
        self.size, self.pad_token_id, self.eos_token_id, self.unk_token_id = size, pad, eos, unk
        self.pad_token, self.eos_token, self.unk_token = f"t{pad}", f"t{eos}", f"t{unk}"
        self.bos_token = "t0"
        self.special_tokens_map = {}
        self.num_madeup_words = 0

    def get_vocab(self):
        return {f"t{i}": i for i in range(self.size)}

    def convert_ids_to_tokens(self, i):
        return f"t{i}"


def convert_ct2(hf_path, out_path, model):
    import ctranslate2
    with open(os.path.join(hf_path, "config.json")) as f:
        c = json.load(f)
    pad, eos = c["pad_token_id"], c["eos_token_id"]
    vocab = _Vocab(c["vocab_size"], pad, eos, 2 if model == "t5" else 3)

    class _Converter(ctranslate2.converters.TransformersConverter):
        def load_tokenizer(self, *args, **kwargs):
            return vocab

    _Converter(hf_path).convert(out_path, force=True)


# ---------------------------------------------------------------------------------------------
# the child: one system, one model

def _inputs(model, vocab):
    rng = np.random.default_rng(0)
    if model == "mpnet":
        return rng.integers(5, vocab - 1, size=(EMB_BATCH, SRC_LEN))
    ids = rng.integers(4, vocab - 1, size=(BATCH, SRC_LEN))
    ids[:, -1] = 1 if model == "t5" else 2                          # EOS
    return ids


def _runner(system, model, path, ct2_path, threads):
    if system == "fastattn":
        import fastattn
        if model == "mpnet":
            m = fastattn.EncoderModel.from_pretrained(path)
            fastattn.set_num_threads(threads)
            return fastattn.__version__, lambda ids: m(ids, attention_mask=np.ones_like(ids))
        m = fastattn.Seq2SeqTransformer.from_pretrained(path)
        return fastattn.__version__, lambda ids: m.generate(
            ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, num_beams=1,
            do_sample=False, n_threads=threads)
    if system == "transformers":
        import torch
        import transformers
        torch.set_num_threads(threads)
        config, cls = _hf_config(model)
        m = cls.from_pretrained(path).eval()
        version = f"{transformers.__version__}, torch {torch.__version__}"
        if model == "mpnet":
            def run(ids):
                with torch.inference_mode():
                    t = torch.as_tensor(ids)
                    return m(input_ids=t, attention_mask=torch.ones_like(t)).last_hidden_state.numpy()
            return version, run

        def run(ids):
            with torch.inference_mode():
                return m.generate(torch.as_tensor(ids), max_new_tokens=NEW_TOKENS,
                                  min_new_tokens=NEW_TOKENS, num_beams=1, do_sample=False).numpy()
        return version, run
    import ctranslate2
    tr = ctranslate2.Translator(ct2_path, device="cpu", compute_type="float32", inter_threads=1,
                                intra_threads=threads)
    with open(os.path.join(path, "config.json")) as f:
        start = json.load(f)["decoder_start_token_id"]

    def run(ids):
        toks = [[f"t{i}" for i in row] for row in ids]
        res = tr.translate_batch(toks, beam_size=1, max_decoding_length=NEW_TOKENS,
                                 min_decoding_length=NEW_TOKENS, max_batch_size=0)
        body = np.array([[int(t[1:]) for t in r.hypotheses[0]] for r in res])
        return np.concatenate([np.full((len(ids), 1), start), body], axis=1)
    return ctranslate2.__version__, run


def child(system, model, path, ct2_path, threads, repeats, out_npy):
    with open(os.path.join(path, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    t0 = time.perf_counter()
    version, run = _runner(system, model, path, ct2_path, threads)
    load = time.perf_counter() - t0
    ids = _inputs(model, vocab)
    out = np.asarray(run(ids))                       # warm-up, and the output compared
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        run(ids)
        samples.append(time.perf_counter() - t)
    np.save(out_npy, out)
    peak = 0
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            peak = int(line.split()[1]) * 1024
    return {"system": system, "model": model, "version": version, "load_s": load,
            "samples_s": samples, "output": out_npy, "peak_rss": peak}


# ---------------------------------------------------------------------------------------------
# the parent

def _spawn(args, *extra, timeout=3600):
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, os.path.abspath(__file__), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd="/")
    if r.returncode:
        raise SystemExit(f"{' '.join(extra)} failed:\n{r.stderr[-3000:]}")
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def cpu_flags():
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            return sorted(f for f in line.split(":", 1)[1].split()
                          if f.startswith(("avx", "amx", "fma")))
    return []


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--systems", default="fastattn,ctranslate2,transformers")
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "fastattn_families"))
    ap.add_argument("--child", nargs=2, metavar=("SYSTEM", "MODEL"), help=argparse.SUPPRESS)
    ap.add_argument("--build", metavar="MODEL", help=argparse.SUPPRESS)
    ap.add_argument("--convert", metavar="MODEL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    d = args.dir
    if args.build:
        build(args.build, os.path.join(d, args.build))
        return
    if args.convert:
        convert_ct2(os.path.join(d, args.convert), os.path.join(d, args.convert + "_ct2"),
                    args.convert)
        return
    if args.child:
        system, model = args.child
        res = child(system, model, os.path.join(d, model), os.path.join(d, model + "_ct2"),
                    args.threads, args.repeats, os.path.join(d, f"out_{model}_{system}.npy"))
        print(json.dumps(res))
        return

    os.makedirs(d, exist_ok=True)
    print("CPU flags:", " ".join(cpu_flags()))
    print(f"{args.threads} threads, float32, each system in a process of its own, median of "
          f"{args.repeats} timed calls after one warm-up call")
    wanted = args.systems.split(",")
    for model in args.models.split(","):
        path = os.path.join(d, model)
        if not os.path.exists(os.path.join(path, "config.json")):
            _spawn(args, "--build", model, "--dir", d)
        systems = [s for s in SYSTEMS[model] if s in wanted]
        if "ctranslate2" in systems and not os.path.exists(os.path.join(path + "_ct2",
                                                                        "model.bin")):
            _spawn(args, "--convert", model, "--dir", d)
        runs = {s: _spawn(args, "--child", s, model, "--dir", d, "--threads", str(args.threads),
                          "--repeats", str(args.repeats)) for s in systems}
        print(f"\n{TITLES[model]}")
        med = {s: 1e3 * statistics.median(r["samples_s"]) for s, r in runs.items()}
        for s, r in runs.items():
            line = (f"  {s:13s} {med[s]:9.1f} ms  (min {1e3 * min(r['samples_s']):.1f}, "
                    f"peak RSS {r['peak_rss'] / 2**20:.0f} MiB, {r['version']})")
            if s != "fastattn" and "fastattn" in med:
                line += f"  fastattn speed-up {med[s] / med['fastattn']:.2f}x"
            print(line, flush=True)
        if "fastattn" in runs and "transformers" in runs:
            a, b = np.load(runs["fastattn"]["output"]), np.load(runs["transformers"]["output"])
            if model == "mpnet":
                print(f"  fastattn vs transformers: max |diff| {float(np.abs(a - b).max()):.1e}")
            elif a.shape == b.shape:
                print(f"  fastattn vs transformers: {int((a == b).sum())}/{b.size} tokens equal")
            else:
                print(f"  fastattn vs transformers: shapes {a.shape} vs {b.shape}")
            if "ctranslate2" in runs:
                c = np.load(runs["ctranslate2"]["output"])
                if c.shape == b.shape:
                    print(f"  ctranslate2 vs transformers: {int((c == b).sum())}/{b.size} "
                          "tokens equal")


if __name__ == "__main__":
    main()
