"""fastattn.dask throughput: sequences per second on one corpus, three ways, one machine.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_dask.py [--items 96] [--d-model 512]

1. plain single-process ``model.generate`` over the corpus in batches (the baseline),
2. ``fastattn.dask.generate`` on a LocalCluster of 1 worker x 2 threads,
3. the same on 2 workers x 1 thread.
A random Marian checkpoint (written with transformers into a temporary folder, EOS suppressed by
``min_new_tokens`` so every item makes the same number of tokens) is loaded by path. Each
figure is the median of --repeats runs after one warm-up run (which also loads the model on the
workers). Prints the CPU flags and the load average; the outputs of all three are checked equal.
"""
import argparse
import statistics
import sys
import tempfile
import time

import numpy as np
from _common import cpu_line


def write_checkpoint(path, d_model, layers, vocab, seed=0):
    import torch
    from transformers import MarianConfig, MarianMTModel
    cfg = MarianConfig(vocab_size=vocab, decoder_vocab_size=vocab, d_model=d_model,
                       encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=8,
                       decoder_attention_heads=8, encoder_ffn_dim=4 * d_model,
                       decoder_ffn_dim=4 * d_model, max_position_embeddings=512,
                       pad_token_id=vocab - 1, decoder_start_token_id=vocab - 1, eos_token_id=0,
                       forced_eos_token_id=0)
    torch.manual_seed(seed)
    model = MarianMTModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name:
                continue
            if p.ndim == 2 and "embed" not in name and "shared" not in name:
                p.copy_(torch.randn(p.shape) / p.shape[1] ** 0.5)
            elif p.ndim == 2:
                p.copy_(torch.randn(p.shape))
    model.save_pretrained(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=96)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import dask.bag as db
    from distributed import Client, LocalCluster

    import fastattn
    import fastattn.dask

    rng = np.random.default_rng(0)
    corpus = [rng.integers(1, args.vocab - 1, size=int(rng.integers(8, 48))) for _ in range(args.items)]
    kw = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens)
    print(f"CPU: {cpu_line()}")
    print(f"fastattn {fastattn.__version__}; random Marian d_model {args.d_model}, {args.layers}+"
          f"{args.layers} layers, vocab {args.vocab}; {args.items} sources of 8-47 tokens, "
          f"greedy, exactly {args.new_tokens} new tokens, batch_size {args.batch_size}; "
          f"median of {args.repeats}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        write_checkpoint(tmp, args.d_model, args.layers, args.vocab)
        model = fastattn.Seq2SeqTransformer.from_pretrained(tmp)

        def single():
            out = []
            order = sorted(range(len(corpus)), key=lambda i: len(corpus[i]))
            for s in range(0, len(order), args.batch_size):
                idx = order[s:s + args.batch_size]
                S = max(len(corpus[i]) for i in idx)
                ids = np.full((len(idx), S), model.pad_id)
                for r, i in enumerate(idx):
                    ids[r, :len(corpus[i])] = corpus[i]
                out.append(model.generate(ids, n_threads=2, **kw))
            return out

        def timed(fn):
            fn()                                         # warm-up (and model loading)
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                result = fn()
                times.append(time.perf_counter() - t0)
            return statistics.median(times), result

        t, _ = timed(single)
        rows.append(("single process, generate(n_threads=2)", t))
        reference = fastattn.dask.generate(db.from_sequence(corpus, npartitions=1), model,
                                           batch_size=args.batch_size, **kw).compute(scheduler="sync")
        for n_workers, threads in ((1, 2), (2, 1)):
            with LocalCluster(n_workers=n_workers, threads_per_worker=threads, processes=True,
                              dashboard_address=None) as cluster, Client(cluster):
                bag = db.from_sequence(corpus, npartitions=4 * n_workers)
                t, out = timed(lambda: fastattn.dask.generate(bag, tmp, batch_size=args.batch_size,
                                                              **kw).compute())
                same = all(np.array_equal(a, b) for a, b in zip(out, reference))
                rows.append((f"dask, {n_workers} worker(s) x {threads} thread(s)"
                             f"{'' if same else ' (OUTPUT DIFFERS)'}", t))
    print("| run | seconds | sequences / s |")
    print("|---|---|---|")
    for name, t in rows:
        print(f"| {name} | {t:.2f} | {args.items / t:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
