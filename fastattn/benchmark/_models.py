"""`fastattn bench --models` (and the default run, after the kernel table): whole models against
their peers, each system in its own process.

Models (random weights, built here with NumPy and safetensors: :mod:`._checkpoints`):
- a Marian of the OPUS-MT base shape: greedy 8 x 128 -> 64 tokens, beam 4 (8 sources), greedy
  batch 1; EOS is blocked (min length = max length) so that every system makes exactly 64 tokens;
  outputs compared token for token with transformers';
- a BERT of the all-MiniLM-L6-v2 shape: the last hidden state of 32 x 128 and 1 x 16 tokens;
  outputs compared with transformers' (max |difference|).

Systems: fastattn, transformers (PyTorch), CTranslate2 (its converter on the same folder) and
ONNX Runtime (the encoder exported with torch.onnx; generation would need an ONNX export of the
decoder with its KV cache, which this benchmark does not build: skipped with that reason), when
installed; then the int8 ones: fastattn ``quantize="int8"`` (where the build has it),
CTranslate2 ``compute_type="int8"``, ONNX Runtime on ``quantize_dynamic``'s copy of the export.
An int8 system's outputs are compared with the same system's float32 outputs. Each system runs in a child process of its own (``python -m
fastattn.benchmark._models --child ...``), so that no library's threads, allocator or OpenMP
runtime touch another's numbers; a child warms up, then times ``repeats`` calls of each work and
writes its outputs for the comparison. Same thread budget everywhere (--threads).
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

__all__ = ["MODEL_SYSTEMS", "MODEL_WORKS", "run_models"]

MODEL_SYSTEMS = ("fastattn", "transformers", "ctranslate2", "onnxruntime", "fastattn-int8",
                 "ctranslate2-int8", "onnxruntime-int8")
LABELS = {"fastattn": "fastattn", "transformers": "transformers (PyTorch)",
          "ctranslate2": "CTranslate2", "onnxruntime": "ONNX Runtime",
          "fastattn-int8": "fastattn int8", "ctranslate2-int8": "CTranslate2 int8",
          "onnxruntime-int8": "ONNX Runtime int8"}
INT8 = ("fastattn-int8", "ctranslate2-int8", "onnxruntime-int8")
from ._model_child import MODEL_WORKS, NEW_TOKENS
from ._report import _ms, _table
TITLES = {"marian": "Marian base (d_model 512, 6+6 layers, vocab 32000), generation",
          "encoder": "MiniLM-shaped BERT (6 layers, hidden 384), last hidden state"}


def default_dir():
    return os.path.join(tempfile.gettempdir(), "fastattn_bench_models")


# --models-tiny (tests): the same pipeline on checkpoints small enough to run in seconds
TINY = {"marian": dict(d_model=32, layers=1, heads=2, ffn=64, vocab_size=200),
        "encoder": dict(hidden=32, layers=1, heads=2, intermediate=64)}


def build(folder, model, tiny=False):
    """The checkpoint folder of `model` under `folder` (written once, then reused)."""
    from ._checkpoints import write_bert, write_marian
    path = os.path.join(folder, model + ("_tiny" if tiny else ""))
    if not os.path.exists(os.path.join(path, "model.safetensors")):
        (write_marian if model == "marian" else write_bert)(path, **(TINY[model] if tiny else {}))
    return path


# ---------------------------------------------------------------------------------------------
# the parent: one child per (model, system), the tables

def _spawn(system, model, path, threads, repeats, workdir, timeout):
    env = dict(os.environ)
    # the folder holding the fastattn package (this file is fastattn/benchmark/_models.py)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if system.startswith("ctranslate2"):
        why = _convert_ct2(path, model, workdir)
        if why:
            return {"system": system, "model": model, "rows": [], "skipped": why}
    # the child runs by path, not as part of the fastattn package: a peer's process never
    # imports fastattn (whose OpenMP runtime and settings would then be loaded first)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_model_child.py")
    cmd = [sys.executable, script, "--child", system, "--model", model, "--path", path,
           "--threads", str(threads), "--repeats", str(repeats), "--workdir", workdir]
    if system.startswith("onnxruntime") and model == "encoder":
        prep = subprocess.run([*cmd[:2], "--prepare", *cmd[3:]], capture_output=True,
                              text=True, env=env, timeout=timeout)
        if prep.returncode:
            tail = " ".join(prep.stderr.strip().splitlines()[-1:]) or f"exit {prep.returncode}"
            return {"system": system, "model": model, "rows": [],
                    "skipped": f"the ONNX export failed: {tail}"}
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"system": system, "model": model, "rows": [],
                "skipped": f"did not finish within {timeout} s"}
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode or not lines:
        tail = " ".join((r.stderr or "").strip().splitlines()[-1:]) or f"exit {r.returncode}"
        return {"system": system, "model": model, "rows": [], "skipped": f"failed: {tail}"}
    return json.loads(lines[-1])


def _compare(model, ref, out):
    if ref is None:
        return None
    a, b = np.load(out), np.load(ref)
    if model == "marian":
        if a.shape != b.shape:
            return f"shape {a.shape} vs {b.shape}"
        return f"{int((a[:, 1:] == b[:, 1:]).sum())}/{b[:, 1:].size} tokens"
    return f"max abs diff {float(np.abs(a - b).max()):.1e}"


def _convert_ct2(path, model, workdir):
    """CTranslate2's conversion of the model's folder (in the parent: a child only times); the
    reason it cannot be made, or None."""
    try:
        import ctranslate2  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        return f"{exc.name} is not installed"
    from ._checkpoints import write_ct2_bert, write_ct2_marian
    out = os.path.join(workdir, f"{model}_ct2")
    stamp = os.path.join(out, "source.txt")
    if os.path.exists(stamp) and open(stamp).read() != path:     # another checkpoint's
        os.remove(os.path.join(out, "model.bin"))
    if not os.path.exists(os.path.join(out, "model.bin")):
        try:
            from transformers.utils import logging as hf_logging
            level = hf_logging.get_verbosity()
            hf_logging.set_verbosity_error()     # BertModel's pooler, absent here, is reported
            hf_logging.disable_progress_bar()
            try:
                (write_ct2_marian if model == "marian" else write_ct2_bert)(path, out)
            finally:
                hf_logging.set_verbosity(level)
                hf_logging.enable_progress_bar()
        except Exception as exc:     # the converter's own errors: report, go on without it
            return f"conversion failed: {type(exc).__name__}: {exc}"
        with open(stamp, "w") as f:
            f.write(path)
    return None


def run_model(model, path, systems, threads, repeats, workdir, bar=None):
    """{system: its child's result} for one model's checkpoint folder, one child per system."""
    runs = {}
    for system in systems:
        if bar is not None:
            bar.set_description(f"{model}: {system}")
        runs[system] = _spawn(system, model, path, threads, repeats, workdir, timeout=1800)
        if bar is not None:
            bar.update(1)
    return runs


def run_models(args, out=None, bar=None):
    """Time the models (see the module docstring); print the tables; return the results."""
    from ._report import progress_bar
    out = out or sys.stdout
    workdir = getattr(args, "models_dir", None) or default_dir()
    os.makedirs(workdir, exist_ok=True)
    repeats = args.repeats or (2 if args.quick else 5)
    systems = list(MODEL_SYSTEMS)
    models = list(MODEL_WORKS)
    own_bar = bar is None
    if own_bar:
        bar = progress_bar(len(models) * (1 + len(systems)), enabled=not args.no_progress)
    tiny = getattr(args, "models_tiny", False)
    results = {"threads": args.threads, "repeats": repeats, "new_tokens": NEW_TOKENS,
               "tiny": tiny, "models": {}}
    try:
        for model in models:
            bar.set_description(f"{model}: building the checkpoint")
            path = build(workdir, model, tiny=tiny)
            bar.update(1)
            results["models"][model] = run_model(model, path, systems, args.threads, repeats,
                                                 workdir, bar)
    finally:
        if own_bar:
            bar.close()
    _report(results, out)
    return results


def _report(results, out):
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p("")
    p(f"Models: median ms per call ({results['threads']} threads, {results['repeats']} timed "
      "calls after a warm-up, each system in its own process)")
    for model, runs in results["models"].items():
        p("")
        p(TITLES[model] + (" [tiny test shapes]" if results.get("tiny") else ""))
        p("")
        report_model(model, runs, out)


def _speedup(med, one, among):
    """min(median of `among` present) / median of `one`, as '1.23x'; None without both."""
    others = [med[s] for s in among if s in med and s != one]
    return f"{min(others) / med[one]:.2f}x" if one in med and others else None


def report_model(model, runs, out):
    """One model's table: median ms of each work and system (a float32 system's output checked
    against transformers', an int8 system's against its own float32 system's), the speed-up
    columns, then each system's version and peak RSS, or why it was skipped. Adds median_ms,
    min_ms and vs_transformers / vs_float32 to the rows."""
    p = lambda *a: print(*a, file=out)  # noqa: E731
    ok = [s for s in MODEL_SYSTEMS if runs.get(s, {}).get("rows")]
    floats = [s for s in ok if s not in INT8]
    int8s = [s for s in ok if s in INT8]
    ratios = []          # (header, function of the medians)
    if "fastattn" in floats and len(floats) > 1:
        ratios.append(("fastattn speed-up vs fastest other",
                       lambda med: _speedup(med, "fastattn", floats)))
    if "fastattn-int8" in int8s and len(int8s) > 1:
        ratios.append(("fastattn int8 speed-up vs fastest other int8",
                       lambda med: _speedup(med, "fastattn-int8", int8s)))
    if "fastattn-int8" in int8s and "fastattn" in floats:
        ratios.append(("fastattn int8 speed-up vs fastattn float32",
                       lambda med: _speedup(med, "fastattn-int8", ["fastattn"])))
    header = ["work"] + [LABELS[s] for s in ok] + [h for h, _ in ratios]
    ref = {i: r["output"] for i, r in enumerate(runs.get("transformers", {}).get("rows", []))}
    body = []
    for i, (title, _, _) in enumerate(MODEL_WORKS[model]):
        cells, med = [title], {}
        for s in ok:
            row = runs[s]["rows"][i]
            med[s] = float(np.median(row["samples_s"]))
            row["median_ms"] = 1e3 * med[s]
            row["min_ms"] = 1e3 * min(row["samples_s"])
            check = None
            if s in INT8:
                base = runs.get(s[:-len("-int8")], {}).get("rows")
                check = row["vs_float32"] = _compare(model, base[i]["output"] if base else None,
                                                     row["output"])
            elif s != "transformers":
                check = row["vs_transformers"] = _compare(model, ref.get(i), row["output"])
            cells.append(_ms(1e3 * med[s]) + (f" ({check})" if check else ""))
        cells += [f(med) or "" for _, f in ratios]
        body.append(cells)
    for line in _table(header, body, ["l"] + ["r"] * (len(header) - 1)):
        p(line)
    if int8s:
        p("  in brackets: a float32 system's output vs transformers', an int8 system's vs its "
          "own float32 output")
    for s8 in int8s:
        s32 = s8[:-len("-int8")]
        if s32 in floats:
            each = [float(np.median(a["samples_s"])) / float(np.median(b["samples_s"]))
                    for a, b in zip(runs[s32]["rows"], runs[s8]["rows"])]
            p(f"  {LABELS[s8]} speed-up vs its float32, per work: "
              + " / ".join(f"{x:.2f}x" for x in each))
    for s in MODEL_SYSTEMS:
        r = runs.get(s, {})
        if r.get("skipped"):
            why = r["skipped"]
            p(f"  {why}" if why.startswith(LABELS[s] + ":") else f"  {LABELS[s]} skipped: {why}")
        elif r.get("version"):
            p(f"  {LABELS[s]} {r['version']}: peak RSS {r['peak_rss'] / 2**20:.0f} MiB, "
              f"load {r['load_s']:.2f} s")


def plot_models(results, path):
    """One panel per model: median ms per work, a bar per system."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = list(results["models"])
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        runs = results["models"][model]
        ok = [s for s in MODEL_SYSTEMS if runs.get(s, {}).get("rows")]
        works = [w for w, _, _ in MODEL_WORKS[model]]
        width = 0.8 / max(1, len(ok))
        for j, s in enumerate(ok):
            ys = [float(np.median(r["samples_s"])) * 1e3 for r in runs[s]["rows"]]
            ax.bar(np.arange(len(works)) + j * width, ys, width, label=LABELS[s])
        ax.set_xticks(np.arange(len(works)) + width * (len(ok) - 1) / 2)
        ax.set_xticklabels(works, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("median ms per call")
        ax.set_title(TITLES[model], fontsize=9)
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"whole models, float32, {results['threads']} threads", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
