"""Load time and peak memory of a model folder: fastattn against CTranslate2 and transformers,
each load in a fresh process of its own.

    python bench/fixtures/make_checkpoint.py /data/nllb13 --shape nllb-200-1.3b --shard-size 2GB
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_load.py /data/nllb13 \\
        --work /data/work [--systems ...] [--check 4]

For each system the child process imports what it needs, resets its peak-RSS mark
(/proc/self/clear_refs), notes its RSS, loads (or converts), and reports the seconds, the RSS
the load added ("resident") and the peak RSS above the starting point ("peak"). The page cache is
warmed (the files read once) before every child, so the figures are CPU and memory, not disk.

Systems (default: all that are installed):
  fastattn            Seq2SeqTransformer / EncoderModel.from_pretrained(FOLDER)           float32
  fastattn-int8       from_pretrained(FOLDER, quantize="int8")                            int8
  fastattn-convert    fastattn convert FOLDER WORK/fa-int8 --quantize int8                int8
  fastattn-saved      from_pretrained(WORK/fa-int8): the converted folder, memory-mapped  int8
  fastattn-convert-f32  fastattn convert FOLDER WORK/fa-f32 --quantize float32            float32
  fastattn-saved-f32  from_pretrained(WORK/fa-f32): packed float panels, memory-mapped    float32
  ct2-convert         ctranslate2 TransformersConverter(FOLDER).convert(WORK/ct2)         float32
  ct2                 ctranslate2.Translator(WORK/ct2)                                    float32
  ct2-int8            ctranslate2.Translator(WORK/ct2, compute_type="int8")               int8
  ct2-convert-int8    TransformersConverter(FOLDER).convert(WORK/ct2-int8, "int8")        int8
  ct2-saved-int8      ctranslate2.Translator(WORK/ct2-int8, compute_type="int8")          int8
  transformers        AutoModelForSeq2SeqLM.from_pretrained(FOLDER, dtype=float32)       float32

--check N: greedy tokens of N random sources (EOS blocked, 24 new tokens) from fastattn
float32 and transformers float32 (and fastattn int8 against its converted folder), each in its
own process, compared.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SYSTEMS = ("fastattn", "fastattn-int8", "fastattn-convert", "fastattn-saved",
           "fastattn-convert-f32", "fastattn-saved-f32", "ct2-convert",
           "ct2", "ct2-int8", "ct2-convert-int8", "ct2-saved-int8", "transformers")


# -- the child ------------------------------------------------------------------------------------

def _status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def child(system, folder, work, check):
    import numpy as np
    if system.startswith("fastattn"):
        import fastattn  # noqa: F401
        from fastattn.models.convert import convert, model_class
    elif system.startswith("ct2"):
        import ctranslate2
        if "convert" in system:
            from ctranslate2.converters import TransformersConverter
    else:
        import torch
        from transformers import AutoModelForSeq2SeqLM
        torch.set_num_threads(2)
    reset = _reset_peak()
    base = _status("VmRSS")
    t0 = time.perf_counter()
    model = None
    if system == "fastattn":
        model = model_class(folder).from_pretrained(folder)
    elif system == "fastattn-int8":
        model = model_class(folder).from_pretrained(folder, quantize="int8")
    elif system == "fastattn-convert":
        convert(folder, os.path.join(work, "fa-int8"), "int8", force=True)
    elif system == "fastattn-saved":
        model = model_class(folder).from_pretrained(os.path.join(work, "fa-int8"))
    elif system == "fastattn-convert-f32":
        convert(folder, os.path.join(work, "fa-f32"), None, force=True)
    elif system == "fastattn-saved-f32":
        model = model_class(folder).from_pretrained(os.path.join(work, "fa-f32"))
    elif system in ("ct2-convert", "ct2-convert-int8"):
        out = os.path.join(work, "ct2" if system == "ct2-convert" else "ct2-int8")
        converter = TransformersConverter
        if not any(os.path.exists(os.path.join(folder, f)) for f in (
                "tokenizer.json", "sentencepiece.bpe.model", "spm.model", "source.spm")):
            # a random checkpoint without a tokenizer: give the converter a vocabulary of
            # t<id> tokens (bench_families.py's), which changes nothing of the weights' work
            from bench_families import _Vocab
            with open(os.path.join(folder, "config.json")) as f:
                c = json.load(f)
            vocab = _Vocab(c["vocab_size"], c["pad_token_id"], c["eos_token_id"], 3)

            class converter(TransformersConverter):
                def load_tokenizer(self, *args, **kwargs):
                    return vocab
        converter(folder).convert(out, quantization=None if system == "ct2-convert"
                                  else "int8", force=True)
    elif system in ("ct2", "ct2-int8", "ct2-saved-int8"):
        out = os.path.join(work, "ct2-int8" if system == "ct2-saved-int8" else "ct2")
        model = ctranslate2.Translator(out, device="cpu", intra_threads=2, compute_type=(
            "default" if system == "ct2" else "int8"))
    elif system == "transformers":
        model = AutoModelForSeq2SeqLM.from_pretrained(folder, dtype=torch.float32).eval()
    seconds = time.perf_counter() - t0
    res = {"system": system, "seconds": seconds, "resident": _status("VmRSS") - base,
           "peak": (_status("VmHWM") - base) if reset else None}
    if check and model is not None:
        rng = np.random.default_rng(0)
        src = rng.integers(3, 1000, (check, 24))
        src[:, -1] = 2
        if system.startswith("fastattn"):
            out = model.generate(src, max_new_tokens=24, suppress_tokens=[2])
        elif system == "transformers":
            with torch.no_grad():
                out = model.generate(torch.tensor(src), max_new_tokens=24, num_beams=1,
                                     do_sample=False, suppress_tokens=[2]).numpy()
        else:
            out = None
        if out is not None:
            res["tokens"] = np.asarray(out).tolist()
    print("RESULT " + json.dumps(res), flush=True)


# -- the parent -----------------------------------------------------------------------------------

def _warm(folder):
    for root, _, files in os.walk(folder):
        for f in files:
            with open(os.path.join(root, f), "rb", buffering=0) as fh:
                while fh.read(64 << 20):
                    pass


def _installed(system):
    mod = {"ct2": "ctranslate2", "transformers": "transformers"}.get(system.split("-")[0])
    if mod is None:
        return True
    try:
        __import__(mod)
        return True
    except ImportError:
        return False


def _largest_tensor(folder):
    from fastattn.io.huggingface import Checkpoint, checkpoint_files
    ck = Checkpoint(checkpoint_files(folder))
    import numpy as np
    return max(int(np.prod(ck.shape(n))) * 4 for n in ck.keys())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--work", required=False, help="where converted folders go "
                    "(default: FOLDER.work)")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--check", type=int, default=0, metavar="N")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    work = a.work or a.folder.rstrip("/") + ".work"
    if a.child:
        child(a.child, a.folder, work, a.check)
        return
    os.makedirs(work, exist_ok=True)
    systems = [s for s in a.systems.split(",") if s]
    for s in systems:
        if s not in SYSTEMS:
            ap.error(f"unknown system {s!r}; choose from {', '.join(SYSTEMS)}")
    systems = [s for s in systems if _installed(s)]
    size = sum(os.path.getsize(os.path.join(a.folder, f)) for f in os.listdir(a.folder)
               if f.endswith(".safetensors"))
    largest = _largest_tensor(a.folder)
    with open("/proc/cpuinfo") as f:
        flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    isa = [x for x in flags if x.startswith(("avx", "amx")) or x in ("fma", "f16c")]
    print(f"# bench_load {a.folder}: weights {size / 1e9:.2f} GB, largest tensor "
          f"{largest / 2**20:.0f} MiB as float32; {time.strftime('%Y-%m-%d')}, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
          f"flags {' '.join(isa)}")
    print("| system | seconds | resident MiB | peak MiB | peak / (resident + largest) |")
    print("|---|---:|---:|---:|---:|")
    results = {}
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    for s in systems:
        _warm(a.folder)
        if "saved" in s or s in ("ct2", "ct2-int8"):
            _warm(work)
        cmd = [sys.executable, os.path.abspath(__file__), a.folder, "--work", work,
               "--child", s, "--check", str(a.check)]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if p.returncode or line is None:
            err = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
            print(f"| {s} | failed: {err} | | | |", flush=True)
            continue
        r = json.loads(line[7:])
        results[s] = r
        peak = r["peak"]
        ratio = f"{peak / (max(r['resident'], 0) + largest):.2f}" if peak is not None else "—"
        print(f"| {s} | {r['seconds']:.2f} | {r['resident'] / 2**20:.0f} | "
              f"{(peak or 0) / 2**20:.0f} | {ratio} |", flush=True)
    if a.check:
        ref = results.get("transformers", {}).get("tokens")
        for s in ("fastattn", "fastattn-saved-f32", "fastattn-int8", "fastattn-saved"):
            toks = results.get(s, {}).get("tokens")
            if toks is None:
                continue
            other = ref if s in ("fastattn", "fastattn-saved-f32") else \
                results.get("fastattn-int8", {}).get("tokens")
            if other is None or other is toks:
                continue
            same = sum(x == y for x, y in zip(toks, other))
            print(f"# greedy tokens, {s} vs "
                  f"{'transformers' if s in ('fastattn', 'fastattn-saved-f32') else 'fastattn-int8'}"
                  f": {same} of {len(toks)} sequences identical")


if __name__ == "__main__":
    main()
