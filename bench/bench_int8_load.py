"""Load time and resident size of int8 models: quantizing a float folder at load against mapping
a folder written by save_pretrained, each load in a fresh process (medians of 3), and the int8
kernel variants side by side (fastattn._kernels._qgemm.set_variant) on the base Marian's batch-1
greedy step and MiniLM's 32 x 128 forward, against float32 with the matching kernel set.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_int8_load.py
"""
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

_LOAD = r"""
import os, sys, time
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024
import fastattn
from fastattn.models import EncoderModel, Seq2SeqTransformer
cls = Seq2SeqTransformer if sys.argv[1] == "seq2seq" else EncoderModel
kw = {"quantize": "int8"} if sys.argv[3] == "int8" else {}
r0 = rss(); t0 = time.perf_counter()
m = cls.from_pretrained(sys.argv[2], **kw)
t = time.perf_counter() - t0
print(t, rss() - r0)
"""

_SPEED = r"""
import sys, time
import numpy as np
from fastattn._kernels import _qgemm, _simd
from fastattn.models import EncoderModel, Seq2SeqTransformer
kind, path, isa, variant = sys.argv[1:5]
_simd.set_isa(isa)
if variant != "float32":
    _qgemm.set_variant(variant)
q = None if variant == "float32" else "int8"
rng = np.random.default_rng(0)
if kind == "seq2seq":
    m = Seq2SeqTransformer.from_pretrained(path, quantize=q)
    ids = rng.integers(5, 30000, (1, 128)); ids[:, -1] = 0
    f = lambda: m.generate(ids, max_new_tokens=64, min_new_tokens=64)
    n = 3
else:
    m = EncoderModel.from_pretrained(path, quantize=q)
    ids = rng.integers(1000, 20000, (32, 128))
    f = lambda: m(ids)
    n = 5
f(); ts = []
for _ in range(n):
    t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
print(sorted(ts)[len(ts) // 2] * 1e3)
"""


def child(code, *args):
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], env=env,
                         capture_output=True, text=True, check=True)
    return [float(v) for v in out.stdout.split()]


def main():
    sys.path.insert(0, ROOT)
    from fastattn.benchmark._checkpoints import write_marian
    from fastattn.models import EncoderModel, Seq2SeqTransformer
    sys.path.insert(0, os.path.join(ROOT, "tests", "text"))
    from text_helpers import minilm_folder
    with open("/proc/cpuinfo") as f:
        flags = next(l for l in f if l.startswith("flags")).split()
    want = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8")
    print("# CPU flags:", " ".join(x for x in want if x in flags), "; cpus", os.cpu_count())
    work = tempfile.mkdtemp(prefix="fastattn_int8_load_")
    marian = os.path.join(work, "marian")
    write_marian(marian, seed=0)
    minilm = minilm_folder()
    saved = {}
    for name, cls, src in (("marian", Seq2SeqTransformer, marian), ("minilm", EncoderModel, minilm)):
        saved[name] = os.path.join(work, name + "-int8")
        cls.from_pretrained(src, quantize="int8").save_pretrained(saved[name])
    print("\n## load: seconds / MiB of resident size added (fresh process each, median of 3)")
    print("| model | float32 folder | float32 folder, quantize='int8' | saved int8 folder |")
    print("|---|---:|---:|---:|")
    for name, kind, src in (("Marian base", "seq2seq", marian), ("all-MiniLM-L6-v2", "encoder", minilm)):
        cells = []
        for path, q in ((src, "none"), (src, "int8"), (saved["marian" if kind == "seq2seq" else "minilm"], "none")):
            runs = [child(_LOAD, kind, path, q) for _ in range(3)]
            cells.append("%.3f s / %.0f MiB" % (statistics.median(r[0] for r in runs),
                                                 statistics.median(r[1] for r in runs)))
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    print("\n## int8 kernel variants, median ms (Marian greedy 1 x 128 -> 64; MiniLM 32 x 128 forward)")
    print("| kernel set | variant | Marian batch 1 | MiniLM 32 x 128 |")
    print("|---|---|---:|---:|")
    from fastattn._kernels import _qgemm
    have = _qgemm.cpu_variants()
    for isa, variant in (("avx512", "float32"), ("avx512", "avx512-vnni"), ("avx512", "avx512"),
                         ("avx2", "float32"), ("avx2", "avx2-vnni"), ("avx2", "avx2")):
        if variant != "float32" and variant not in have:
            continue
        a = child(_SPEED, "seq2seq", marian, isa, variant)[0]
        b = child(_SPEED, "encoder", minilm, isa, variant)[0]
        print(f"| {isa} | {variant} | {a:.1f} | {b:.1f} |", flush=True)


if __name__ == "__main__":
    main()
