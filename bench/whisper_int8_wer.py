"""How far int8 moves each system's transcripts from its own float32 ones, over several voices.

Issue 46's rule: fastattn's int8 transcripts are no further from its float32 transcripts than
faster-whisper's int8 are from faster-whisper's float32, by the word error rate between the
two. On one file the measure is noisy: a beam that flips at a near tie changes a segment, and
with conditioning on the previous text the next window too. So this runs bench_whisper.py
(float32 and int8 of each system, each in a process of its own) on several files, one per
espeak-ng voice, each starting at a different sentence, and pools the word errors:

    WER(int8 vs float32) = sum of (substitutions + deletions + insertions) / sum of float32 words

over all files, for each system, with each file's own figure beside it. The WER against the
text read is pooled the same way. No times: this measures accuracy (bench_whisper.py --repeats
3 is the speed figure), and it may run beside other work.

Then a deterministic measure on the same files (teacher_forced): along the same tokens, each
system's int8 next-token distribution against its own float32 one. A near tie that flips a beam
moves a transcript by a segment, and this measure by a hair.

    python bench/fixtures/whisper_from_ct2.py /tmp/tiny-en
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/whisper_int8_wer.py \\
        --checkpoint /tmp/tiny-en --out bench/results/whisper_int8_wer_$(date +%F).txt

(--isa avx2 caps every system at AVX2; --voices, --seconds, --systems as below.)
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _common import ISA_CAPS, ISA_HELP, apply_isa, cpu_line  # noqa: E402

apply_isa()

# espeak-ng's own English voices (no mbrola data needed), at two rates
VOICES = "en-us:160,en-gb-scotland:175,en-gb-x-rp:150,en-029:165,en-gb-x-gbclan:170,en:180"
SYSTEMS = "fastattn,faster-whisper,fastattn-batched,faster-whisper-batched"


def counts(reference, hypothesis):
    """(word errors, reference words) of hypothesis against reference, on the normalised words
    bench_whisper scores with."""
    import jiwer
    from bench_whisper import _normalise
    ref, hyp = _normalise(reference), _normalise(hypothesis)
    if not ref:
        return len(hyp.split()), 0
    o = jiwer.process_words(ref, hyp)
    return o.substitutions + o.deletions + o.insertions, len(ref.split())


def teacher_forced(hf, ct2_float32, ct2_int8, windows, threads=2,
                   systems=("fastattn", "ctranslate2")):
    """Each system's int8 against its own float32 along the same tokens: fastattn float32's
    greedy decoding (with timestamps) of each 30-s window in `windows` (n, n_mels, 3000), the
    forced prefix first and <|endoftext|> last, fed to both systems' float32 and int8 decoders
    (CTranslate2 takes the tokens after the prefix as a forced target prefix and returns its
    logits there). Compared at the positions whose next token is text, over the text tokens
    (ids below <|endoftext|>), the distributions renormalised there.

    Deterministic where the transcripts' WER is not: a near tie that flips a beam moves a
    transcript by a segment and these numbers by a hair. Returns {system: {"kl": mean
    KL(float32 || int8), "dlogp": mean |log p float32 - log p int8| of the next token, "top1":
    the share of positions where int8's most likely text token is float32's, "n": positions}}
    for each of `systems`. Positions where either distribution holds a masked (-inf) token
    (CTranslate2 applies the timestamp rules to the logits it returns) are left out, so the
    systems' counts can differ.
    """
    import ctranslate2
    import numpy as np
    from fastattn.generation.whisper import prompt_rows
    from fastattn.models import WhisperModel

    f32 = WhisperModel.from_pretrained(hf)
    i8 = WhisperModel.from_pretrained(hf, quantize="int8")
    gen = f32.generation_config
    eot = gen["eos_token_id"]
    english_only = gen.get("is_multilingual") is False
    language = None if english_only else "en"
    prefix = prompt_rows(gen, 1, language=language, task=None if english_only else "transcribe",
                         return_timestamps=True)[0]
    windows = np.ascontiguousarray(windows, dtype=np.float32)
    out = f32.generate(windows, num_beams=1, return_timestamps=True, language=language,
                       n_threads=threads)
    seqs = []
    for row in out:
        row = np.asarray(row)
        ends = np.flatnonzero(row == eot)
        seqs.append(np.array(list(prefix) + row[:ends[0] if ends.size else row.size].tolist()
                             + [eot]))

    def fastattn_logits(model, i, s):
        return model.logits(windows[i:i + 1], s[None, :-1],
                            n_threads=threads)[0][len(prefix) - 1:]

    ct = {c: ctranslate2.models.Whisper(path, device="cpu", compute_type=c, intra_threads=threads)
          for c, path in (("float32", ct2_float32), ("int8", ct2_int8))
          if "ctranslate2" in systems}

    def ct2_logits(model, i, s):
        enc = model.encode(ctranslate2.StorageView.from_array(windows[i:i + 1]))
        r = model.generate(enc, [s[:-1].tolist()], beam_size=1, max_length=448,
                           return_logits_vocab=True, suppress_blank=False, suppress_tokens=[],
                           max_initial_timestamp_index=10 ** 6)
        steps = r[0].logits[0][:len(s) - len(prefix)]
        return np.stack([np.array(x) for x in steps])

    def logp(z):
        z = z[:, :eot].astype(np.float64)
        z = z - z.max(axis=1, keepdims=True)
        return z - np.log(np.exp(z).sum(axis=1, keepdims=True))

    res = {}
    for name, fl, ql in (("fastattn", lambda i, s: fastattn_logits(f32, i, s),
                          lambda i, s: fastattn_logits(i8, i, s)),
                         ("ctranslate2", lambda i, s: ct2_logits(ct["float32"], i, s),
                          lambda i, s: ct2_logits(ct["int8"], i, s))):
        if name not in systems:
            continue
        kl, dl, top = [], [], []
        for i, s in enumerate(seqs):
            target = s[len(prefix):]
            a, b = fl(i, s), ql(i, s)
            assert a.shape == b.shape == (target.size, a.shape[1]), (name, a.shape, b.shape)
            text = target < eot
            la, lb = logp(a[text]), logp(b[text])
            t = target[text]
            ok = np.isfinite(la).all(axis=1) & np.isfinite(lb).all(axis=1)
            la, lb, t = la[ok], lb[ok], t[ok]
            kl += list((np.exp(la) * (la - lb)).sum(axis=1))
            dl += list(np.abs(la[np.arange(t.size), t] - lb[np.arange(t.size), t]))
            top += list(la.argmax(axis=1) == lb.argmax(axis=1))
        res[name] = {"kl": float(np.mean(kl)), "dlogp": float(np.mean(dl)),
                     "top1": float(np.mean(top)), "n": len(kl)}
    return res


def windows_of(wav, n_mels):
    """The 30-s windows of a 16 kHz file, back to back, as log-mel features (n, n_mels, 3000)."""
    import numpy as np
    from fastattn.audio import load_audio, log_mel_spectrogram
    x = load_audio(wav)
    return np.stack([log_mel_spectrogram(x[i:i + 480000], n_mels)
                     for i in range(0, x.size, 480000)])


def _kept(float_starts, int8_starts):
    """', k/n starts': how many of float32's segment start times int8's transcript has too
    (a window that ends at another timestamp moves every later window: from there on the two
    transcripts are two readings of differently cut audio)."""
    if not float_starts:
        return ""
    k = len(set(float_starts) & set(int8_starts or []))
    return f", {k}/{len(float_starts)} starts"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True,
                    help="OUT of bench/fixtures/whisper_from_ct2.py OUT (hf, ct2-float32, ct2-int8)")
    ap.add_argument("--voices", default=VOICES,
                    help=f"voice:words-a-minute, comma-separated (default {VOICES})")
    ap.add_argument("--seconds", type=float, default=300, help="audio a voice (default 300)")
    ap.add_argument("--systems", default=SYSTEMS, help=f"default {SYSTEMS}")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "fastattn_bench_whisper"))
    ap.add_argument("--out", help="also write the report here")
    ap.add_argument("--isa", choices=list(ISA_CAPS), help=ISA_HELP)
    a = ap.parse_args()
    voices = []
    for item in a.voices.split(","):
        voice, _, rate = item.partition(":")
        voices.append((voice, int(rate or 160)))
    systems = [s for s in a.systems.split(",") if s]

    from _common import isa_line
    source = os.path.join(a.checkpoint, "SOURCE.txt")
    what = open(source).read().strip() if os.path.exists(source) else a.checkpoint
    lines = [f"# int8 against float32, by voice: {what}",
             f"# {datetime.datetime.now().isoformat(timespec='seconds')}; CPU: {cpu_line()}",
             f"# {isa_line()}",
             f"# {len(voices)} files of {a.seconds:g} s (espeak-ng; voice:rate {a.voices}), "
             f"each from a different sentence; bench/bench_whisper.py --int8 --repeats "
             f"{a.repeats} --threads {a.threads} on each; beam 5, each system's defaults"]
    print("\n".join(lines), flush=True)
    # per system: [errors int8 vs f32, f32 words, errors f32 vs text, int8 vs text, text words]
    pooled = {s: [0, 0, 0, 0, 0] for s in systems}
    rows, forced, forced_rows = [], {}, []
    audio = 0.0
    with open(os.path.join(a.checkpoint, "hf", "config.json")) as f:
        n_mels = json.load(f)["num_mel_bins"]
    for i, (voice, rate) in enumerate(voices):
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tf:
            out = tf.name
        cmd = [sys.executable, os.path.join(HERE, "bench_whisper.py"), "--checkpoint",
               a.checkpoint, "--int8", "--repeats", str(a.repeats), "--threads",
               str(a.threads), "--voice", voice, "--rate", str(rate), "--first-sentence",
               str(6 * i), "--seconds", str(a.seconds), "--systems", ",".join(systems),
               "--dir", a.dir, "--json", out] + (["--isa", a.isa] if a.isa else [])
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            res = json.load(f)
        os.unlink(out)
        audio += res["duration_s"]
        tf_res = teacher_forced(os.path.join(a.checkpoint, "hf"),
                                os.path.join(a.checkpoint, "ct2-float32"),
                                os.path.join(a.checkpoint, "ct2-int8"),
                                windows_of(res["wav"], n_mels), a.threads)
        for name, r in tf_res.items():
            t = forced.setdefault(name, {"kl": 0.0, "dlogp": 0.0, "top1": 0.0, "n": 0})
            for k in ("kl", "dlogp", "top1"):
                t[k] += r[k] * r["n"]
            t["n"] += r["n"]
        forced_rows.append(f"| {voice} {rate} wpm | " + " | ".join(
            f"{r['kl']:.5f} / {r['dlogp']:.4f} / {r['top1']:.4f}" for r in tf_res.values())
            + " |")
        runs = {r["system"]: r for r in res["runs"]}
        cells = []
        for s in systems:
            f32, i8 = runs.get(s, {}), runs.get(s + "-int8", {})
            if not (f32.get("median_s") and i8.get("median_s")):
                cells.append("n/a")
                continue
            e, n = counts(f32["text"], i8["text"])
            ef, nt = counts(res["text"], f32["text"])
            ei, _ = counts(res["text"], i8["text"])
            p = pooled[s]
            p[0] += e; p[1] += n; p[2] += ef; p[3] += ei; p[4] += nt
            kept = _kept(f32.get("starts"), i8.get("starts"))
            cells.append(f"{e / max(n, 1):.3f} ({e}/{n}){kept}")
        rows.append(f"| {voice} {rate} wpm, {res['duration_s']:.0f} s | " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)
    table = ["", f"WER of int8 against float32 (word errors / float32 words; and how many of "
             f"float32's segment start times int8 has too), {audio:.0f} s in all:",
             "", "| file | " + " | ".join(systems) + " |",
             "|---|" + "---|" * len(systems)] + rows
    table.append("| **pooled** | " + " | ".join(
        f"**{p[0] / max(p[1], 1):.3f}** ({p[0]}/{p[1]})" for p in pooled.values()) + " |")
    table += ["", "Pooled over the files:", "",
              "| system | WER int8 vs float32 | WER vs text read, float32 / int8 |",
              "|---|---|---|"]
    for s, p in pooled.items():
        table.append(f"| {s} | {p[0] / max(p[1], 1):.3f} | {p[2] / max(p[4], 1):.3f} / "
                     f"{p[3] / max(p[4], 1):.3f} |")
    names = list(forced)
    table += ["", "Teacher-forced, the same tokens for both systems (fastattn float32's greedy "
              "decoding of each 30-s window): mean KL(float32 || int8) / mean |log p float32 - "
              "log p int8| of the next token / share of positions where int8's most likely "
              "text token is float32's; lower, lower, higher is closer:", "",
              "| file | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    table += forced_rows
    table.append("| **pooled** | " + " | ".join(
        f"**{t['kl'] / t['n']:.5f} / {t['dlogp'] / t['n']:.4f} / {t['top1'] / t['n']:.4f}** "
        f"({t['n']} positions)" for t in forced.values()) + " |")
    print("\n".join(table))
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines + table) + "\n")


if __name__ == "__main__":
    main()
