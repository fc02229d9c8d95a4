"""Translating a file: length-sorted batches (fastattn.Translator) against the same lines in
arrival order at the same batch size, and translate_iterable's peak memory against the number of
lines.

Model: a random Marian of the OPUS-MT base shape (fastattn.benchmark._checkpoints.write_marian:
d_model 512, 6 + 6 layers, vocab 32000) with a SentencePiece tokenizer trained here; lines:
made-up words, log-normal lengths (many short lines, a long tail; ~46 tokens on average, up to
~330). Random weights never choose EOS, so every line decodes exactly --max-new-tokens tokens:
the two runs differ only in the source padding (the encoder, the cross-attention keys / values
and each step's cross-attention). Arrival order = consecutive --batch-size lines padded to their
longest, through the same model.generate, tokenizer and decode. The file is timed in blocks of
--block lines, each block both ways in alternating order (wall and CPU seconds), so that other
processes' load falls on both alike; sorting happens within a block (as translate_iterable sorts
within its window).

Memory: peak RSS (VmHWM, reset after loading) of a child process that streams N synthetic lines
through Translator.translate_iterable into /dev/null, for N = 1,000 and 10,000, with a small
Marian (the memory under test is the text pipeline's, not the model's).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_translate_file.py \\
        --lines 10000 --json bench/results/bench_translate_file.json
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import fastattn
from fastattn.benchmark._checkpoints import synthetic_lines, write_marian, write_marian_tokenizer
from fastattn.text.batching import pad_batch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _common import cpu_line, fastattn_origin  # noqa: E402


def build(folder, **shape):
    if not os.path.exists(os.path.join(folder, "vocab.json")):
        write_marian(folder, **shape)
        write_marian_tokenizer(folder)
    return folder


def arrival_order(tr, lines, batch_size, kw):
    rows = tr.tokenizer.encode(lines, max_length=tr.max_source_length)
    out = []
    for i in range(0, len(rows), batch_size):
        ids, mask = pad_batch(rows[i:i + batch_size], tr.model.pad_id)
        gen = tr.model.generate(ids, mask, **kw)
        out += [tr.tokenizer.decode(r) for r in gen]
    return out


MEMORY_CHILD = r"""
import sys, fastattn
from fastattn.benchmark._checkpoints import synthetic_lines
path, n, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tr = fastattn.Translator(path, n_threads=threads)
tr.translate(["warm up"], max_new_tokens=4)
def status(key):
    for ln in open("/proc/self/status"):
        if ln.startswith(key):
            return int(ln.split()[1]) * 1024
def lines():                       # a generator: the input is never a list
    for i in range(0, n, 1000):
        yield from synthetic_lines(min(1000, n - i), seed=i)
open("/proc/self/clear_refs", "w").write("5")      # peak RSS := now (after loading)
base = status("VmRSS")
count = 0
with open("/dev/null", "w") as sink:
    for text in tr.translate_iterable(lines(), batch_size=32, max_new_tokens=16):
        sink.write(text + "\n")
        count += 1
print(base, status("VmHWM"), count)
"""


def memory(folder, n, threads):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(fastattn.__file__)))
    r = subprocess.run([sys.executable, "-c", MEMORY_CHILD, folder, str(n), str(threads)],
                       capture_output=True, text=True, env=env)
    if r.returncode:
        raise RuntimeError(r.stderr[-2000:])
    base, peak, count = map(int, r.stdout.split()[-3:])
    assert count == n
    return base, peak


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=10000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--block", type=int, default=1000,
                    help="lines per block: each block is timed both ways, alternately")
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "fastattn_bench_text"))
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    print(f"# {cpu_line()}")
    print(f"# {fastattn_origin()}; threads {args.threads}")
    result = {"settings": vars(args), "cpu": cpu_line()}
    if not args.skip_throughput:
        folder = build(os.path.join(args.dir, "base"))
        tr = fastattn.Translator(folder, n_threads=args.threads)
        lines = synthetic_lines(args.lines, seed=7)
        lens = np.array([len(r) for r in tr.tokenizer.encode(lines, max_length=512)])
        print(f"# {len(lines)} lines: source tokens mean {lens.mean():.1f}, median "
              f"{np.median(lens):.0f}, p90 {np.percentile(lens, 90):.0f}, max {lens.max()}; "
              f"batch {args.batch_size}; {args.max_new_tokens} new tokens a line (greedy)")
        kw = dict(max_new_tokens=args.max_new_tokens, n_threads=args.threads)
        tr.translate(lines[:64], **kw)                         # warm-up
        # the file in blocks, each translated both ways, in alternating order, so that load
        # from other processes falls on both alike; wall and CPU seconds are summed per way
        wall = {"sorted": 0.0, "arrival": 0.0}
        cpu = {"sorted": 0.0, "arrival": 0.0}
        same = 0
        runs = {"sorted": lambda blk: tr.translate(blk, batch_size=args.batch_size, **kw),
                "arrival": lambda blk: arrival_order(tr, blk, args.batch_size, kw)}
        for k in range(0, len(lines), args.block):
            blk = lines[k:k + args.block]
            order = ("sorted", "arrival") if (k // args.block) % 2 == 0 else ("arrival", "sorted")
            outs = {}
            for way in order:
                t0, c0 = time.perf_counter(), time.process_time()
                outs[way] = runs[way](blk)
                wall[way] += time.perf_counter() - t0
                cpu[way] += time.process_time() - c0
            same += sum(a == b for a, b in zip(outs["sorted"], outs["arrival"]))
            print(f"#   lines {k}-{k + len(blk) - 1}: sorted {wall['sorted']:.0f} s, arrival "
                  f"{wall['arrival']:.0f} s so far", flush=True)
        print(f"# load average after: {open('/proc/loadavg').read().split()[:3]}")
        print("| order | wall s | lines/s | CPU s | speed-up (wall) | speed-up (CPU) |")
        print("|---|---|---|---|---|---|")
        for way, label in (("arrival", "arrival (consecutive batches)"),
                           ("sorted", f"sorted by length (Translator.translate, "
                                      f"{args.block}-line blocks)")):
            print(f"| {label} | {wall[way]:.1f} | {len(lines) / wall[way]:.1f} | {cpu[way]:.1f} "
                  f"| {wall['arrival'] / wall[way]:.2f}x | {cpu['arrival'] / cpu[way]:.2f}x |")
        print(f"# identical translations in both orders: {same}/{len(lines)}")
        result["throughput"] = {"lines": len(lines), "wall_s": wall, "cpu_s": cpu,
                                "speedup_wall": wall["arrival"] / wall["sorted"],
                                "speedup_cpu": cpu["arrival"] / cpu["sorted"],
                                "identical": same, "mean_tokens": float(lens.mean())}
    if not args.skip_memory:
        small = build(os.path.join(args.dir, "small"), d_model=64, layers=2, heads=4, ffn=128)
        rows = []
        for n in (1000, 10000, 30000):
            base, peak = memory(small, n, args.threads)
            rows.append((n, base, peak))
        print("\n| lines streamed (translate_iterable) | RSS after loading | peak RSS | growth |")
        print("|---|---|---|---|")
        for n, base, peak in rows:
            print(f"| {n} | {base / 2**20:.1f} MiB | {peak / 2**20:.1f} MiB | "
                  f"+{(peak - base) / 2**20:.1f} MiB |")
        result["memory"] = [{"lines": n, "rss_after_load": b, "peak_rss": p} for n, b, p in rows]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
