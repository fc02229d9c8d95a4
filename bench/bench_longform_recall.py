"""Long-form word recall: does a system keep every word of a long file (issue 59)?

Long English files read by espeak-ng (several voices and speaking rates, pauses of 0.3 to 2 s
between sentences, passages read several times over: repeated text is the worst case of the
conditioning on the previous text), deterministic from --seed (several seeds: several files and
a pooled line), with the text read (and each sentence's time) written beside the WAV. Each
system transcribes each file in a child process of its own; per system, file and precision the
report gives the words of the reference, the word recall (jiwer's hits / (hits + substitutions +
deletions): the share of the words read that the transcript has), the WER (words lower-cased,
punctuation removed), the segments and the seconds (indicative only: a shared machine).

Systems (each at float32 and int8, beam 5, each system's default long-form options otherwise):

  fastattn                  Transcriber(hf, quantize=None | "int8").transcribe(wav, num_beams=5,
                            language=...)  (the sequential seek loop)
  fastattn-batched          the same with batch_size=8 (VAD windows of at most 30 s; the
                            Transcriber's default keeps the timestamps)
  fastattn-batched-nots     the same with without_timestamps=True (one segment a window: the
                            default of fastattn.compat.faster_whisper's BatchedInferencePipeline
                            and of faster-whisper's)
  faster-whisper            WhisperModel(ct2-float32 | ct2-int8, compute_type=float32 | int8)
                            .transcribe(wav, beam_size=5)
  faster-whisper-batched    BatchedInferencePipeline(model).transcribe(wav, batch_size=8,
                            beam_size=5)  (its default: without_timestamps=True)
  faster-whisper-batched-ts the same with without_timestamps=False
  openvino                  openvino_genai.WhisperPipeline(ov folder, "CPU").generate(samples,
                            return_timestamps=True, num_beams=5, language, task): its long form
                            (the folder exported by optimum-cli; int8: --weight-format int8).
                            Runs with --ov-python, the interpreter of an environment holding
                            openvino-genai and optimum-intel (they pin their own transformers),
                            and --ov / --ov-int8 folders, which it exports when missing.

Diagnostics (not in the default --systems): fastattn-nocond (condition_on_previous_text=False)
and fastattn-cut (the file cut at pauses into pieces of at most 28 s, each transcribed alone,
no conditioning: what the model hears when the long form loses nothing; the ceiling the
long-form lines are read against).

Models: a folder OUT as bench/fixtures/whisper_from_ct2.py writes it (OUT/hf, OUT/ct2-float32,
OUT/ct2-int8); --model-name names it in the report.

    python bench/fixtures/whisper_from_ct2.py /tmp/recall/tiny-en      # whisper-tiny.en
    python -m venv /tmp/recall/ovenv && /tmp/recall/ovenv/bin/pip install openvino-genai \\
        optimum-intel openvino nncf soundfile
    python bench/bench_longform_recall.py --model /tmp/recall/tiny-en --model-name tiny.en \\
        --minutes 2 --ov-python /tmp/recall/ovenv/bin/python --out REPORT.txt
    python bench/bench_longform_recall.py --model /tmp/recall/base --model-name base \\
        --language en --minutes 2 10 --systems fastattn,faster-whisper ...

Each child's segments are kept under --dir (hyp_<model>_<file>_<system>_<precision>.json) for
a look at what was dropped: compare them with the sentence times in the file's .json.
"""
import argparse
import datetime
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_whisper import PARAGRAPHS, SAMPLE_RATE, _resampled, _words  # noqa: E402

SYSTEMS = ("fastattn", "fastattn-batched", "fastattn-batched-nots", "faster-whisper",
           "faster-whisper-batched", "faster-whisper-batched-ts", "openvino")
VOICES = ("en", "en-us", "en+f3", "en-gb-x-rp", "en-us+f2", "en+m3")
RATES = (130, 175, 220)

# more plain prose beside bench_whisper's (numbers left out: their spelling is a normaliser's
# question, not the long form's)
MORE = [
    "The museum opens its doors at noon on weekdays. Visitors usually start with the hall of "
    "old clocks, where every clock shows a different time. A guide explains how each one was "
    "made and who repaired it. Most people leave the gift shop with a postcard of the tower.",
    "Gardening teaches a person to wait. Seeds planted in the autumn sleep under the cold "
    "ground all winter. When the days grow longer, small green shoots push through the soil. "
    "By early summer the beds are full of beans, lettuce and bright yellow flowers.",
    "The river runs slowly past the mill and under the stone bridge. Children throw sticks from "
    "one side and race to the other to see which stick comes out first. Ducks paddle in the "
    "shallow water near the reeds. In the late afternoon the surface turns the colour of gold.",
    "Our neighbour keeps bees at the bottom of her garden. She wears a white suit and a hat with "
    "a veil when she opens the hives. The honey is dark and tastes of heather and clover. She "
    "sells it in small glass jars at the village fair every autumn.",
    "A good soup needs time more than it needs skill. Start by softening onions and carrots in "
    "butter over a low heat. Add the stock, the herbs and a little salt, then let it simmer "
    "while you read a book. Serve it with fresh bread and a piece of strong cheese.",
    "The old road over the mountains was closed for most of the winter. Snow drifted across it "
    "and buried the wooden posts that marked the edge. Travellers who tried to cross it were "
    "often turned back by the wind. In spring the workers cleared it with shovels and carts.",
    "Every village on the island has its own festival. There is music in the streets, long "
    "tables of food and dancing until late at night. Fishermen decorate their boats with flags "
    "and flowers. Visitors are always welcome, as long as they are willing to dance.",
    "The night train left the station just after dark. Passengers settled into their narrow "
    "beds and listened to the steady rhythm of the wheels. Somewhere in the middle of the night "
    "the train stopped at a quiet border town. By morning the fields outside were covered in "
    "frost.",
    "Writing a letter by hand has become a rare pleasure. It takes longer than a message on a "
    "phone, and mistakes cannot be deleted. Yet people keep such letters for years in boxes "
    "and drawers. A letter carries the shape of a hand and the mood of a moment.",
    "The carpenter chose each board with great care. He ran his fingers along the grain and "
    "listened to the sound the wood made when he tapped it. His tables were plain and heavy, "
    "without paint or polish. Families used them for generations and never needed a new one.",
    "On the edge of the forest there is a small wooden hut. Walkers shelter there from the rain "
    "and leave notes in a book on the shelf. Some write about the birds they have seen, others "
    "about the weather or their sore feet. The book is almost full after many years.",
    "The teacher asked the class to describe the sea without using the word blue. Some children "
    "wrote about the noise of the waves and the taste of salt. One girl wrote that the sea was "
    "a large animal that never slept. The teacher read her story aloud to the whole school.",
]

_NUMBER_WORDS = re.compile(r"\b(one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|"
                           r"twenty|thirty|forty|fifty|sixty|hundred|thousand|eighteen|"
                           r"centuries|o'clock)\b", re.I)


def sentence_pool():
    """The plain sentences read (those naming numbers left out), in a fixed order."""
    out = []
    for p in list(PARAGRAPHS) + MORE:
        for s in re.findall(r"[^.!?]+[.!?]", p):
            s = s.strip()
            if not _NUMBER_WORDS.search(s):
                out.append(s)
    return out


def script(seconds, seed):
    """What is read, deterministic from `seed`: [(sentence, voice, rate, pause after)], about
    at least `seconds` long (estimated from the rate; make_speech cuts it at the time read). Speakers take turns of 3 to
    6 sentences (one voice and rate each); about one sentence in six starts a passage of 2 or 3
    sentences read 3 or 4 times over (the same speaker)."""
    rng = random.Random(seed)
    pool = sentence_pool()
    order = list(range(len(pool)))
    rng.shuffle(order)
    out, t, k = [], 0.0, 0
    while t < seconds:
        voice, rate = rng.choice(VOICES), rng.choice(RATES)
        turn = rng.randint(3, 6)
        for _ in range(turn):
            if rng.random() < 1 / 6:
                n = rng.randint(2, 3)
                block = [pool[order[(k + j) % len(pool)]] for j in range(n)]
                k += n
                lines = block * rng.randint(3, 4)
            else:
                lines = [pool[order[k % len(pool)]]]
                k += 1
            for s in lines:
                pause = round(rng.uniform(0.3, 2.0), 2)
                out.append((s, voice, rate, pause))
                t += len(s.split()) / (rate / 60.0) + pause
            if t >= seconds:
                break
    return out


def make_speech(folder, minutes, seed):
    """folder/longform_<minutes>min_seed<seed>.wav (16 kHz mono, 16-bit), .txt (the text read)
    and .json (each sentence: text, voice, rate, start, end in seconds). Made once."""
    import soundfile as sf
    wav = os.path.join(folder, f"longform_{minutes:g}min_seed{seed}.wav")
    txt, meta = wav[:-4] + ".txt", wav[:-4] + ".json"
    if all(os.path.exists(p) for p in (wav, txt, meta)):
        with open(txt) as f:
            return wav, f.read(), sf.info(wav).duration
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        sys.exit("espeak-ng is needed to make the speech: sudo apt-get install -y espeak-ng sox")
    os.makedirs(folder, exist_ok=True)
    pieces, timing, t = [], [], 0.0
    with tempfile.TemporaryDirectory() as tmp:
        raw, res = os.path.join(tmp, "raw.wav"), os.path.join(tmp, "16k.wav")
        for s, voice, rate, pause in script(minutes * 60 * 1.5, seed):
            if t >= minutes * 60:
                break
            subprocess.run([espeak, "-v", voice, "-s", str(rate), "-w", raw, s], check=True)
            x = _resampled(raw, res)
            timing.append({"text": s, "voice": voice, "rate": rate, "start": round(t, 3),
                           "end": round(t + x.size / SAMPLE_RATE, 3)})
            pieces += [x, np.zeros(int(pause * SAMPLE_RATE), np.float32)]
            t += (x.size + pieces[-1].size) / SAMPLE_RATE
    audio = np.concatenate(pieces)
    sf.write(wav, audio, SAMPLE_RATE, subtype="PCM_16")
    text = " ".join(d["text"] for d in timing)
    with open(txt, "w") as f:
        f.write(text)
    with open(meta, "w") as f:
        json.dump(timing, f, indent=1)
    return wav, text, audio.size / SAMPLE_RATE


# -- the child: one system, one precision, one file --------------------------------------------

def cut_points(timing, limit=28.0):
    """Sample indices cutting the file at pauses (the middle of the silence between two
    sentences) into pieces of at most `limit` seconds (a sentence longer than that alone)."""
    cuts, start = [0], 0.0
    for prev, nxt in zip(timing, timing[1:]):
        if nxt["end"] - start > limit:
            mid = (prev["end"] + nxt["start"]) / 2
            cuts.append(int(mid * SAMPLE_RATE))
            start = mid
    return cuts


def _fastattn(a, int8, batched, variant="", timestamps=None):
    from fastattn.audio import Transcriber, load_audio
    tr = Transcriber(a.hf, quantize="int8" if int8 else None)
    kw = dict(num_beams=5, language=a.language)
    if batched:
        kw["batch_size"] = a.batch_size
    if timestamps is not None:
        kw["without_timestamps"] = not timestamps
    if variant:                         # the diagnostics: no conditioning; cut at the pauses
        kw["condition_on_previous_text"] = False

    def segments(audio, offset=0.0):
        r = tr.transcribe(audio, **kw)
        return [dict(start=s.start + offset, end=s.end + offset, text=s.text,
                     temperature=s.temperature, avg_logprob=s.avg_logprob,
                     compression_ratio=s.compression_ratio, no_speech_prob=s.no_speech_prob,
                     seek=s.seek) for s in r.segments]

    def run():
        if variant != "cut":
            return segments(a.wav)
        with open(a.wav[:-4] + ".json") as f:
            cuts = cut_points(json.load(f))
        x = load_audio(a.wav)
        return [s for c0, c1 in zip(cuts, cuts[1:] + [x.size])
                for s in segments(x[c0:c1], c0 / SAMPLE_RATE)]
    return run


def _faster_whisper(a, int8, batched, timestamps=None):
    import faster_whisper
    model = faster_whisper.WhisperModel(a.ct2_int8 if int8 else a.ct2, device="cpu",
                                        compute_type="int8" if int8 else "float32")
    pipe = faster_whisper.BatchedInferencePipeline(model) if batched else model
    kw = dict(beam_size=5, language=a.language)
    if batched:
        kw["batch_size"] = a.batch_size
    if timestamps is not None:
        kw["without_timestamps"] = not timestamps

    def run():
        segments, _ = pipe.transcribe(a.wav, **kw)
        return [dict(start=s.start, end=s.end, text=s.text, temperature=s.temperature,
                     avg_logprob=s.avg_logprob, compression_ratio=s.compression_ratio,
                     no_speech_prob=s.no_speech_prob, seek=s.seek) for s in segments]
    return run


def _openvino(a, int8, batched):
    import openvino_genai
    import soundfile as sf
    pipe = openvino_genai.WhisperPipeline(a.ov_int8 if int8 else a.ov, "CPU")
    cfg = pipe.get_generation_config()
    cfg.return_timestamps = True
    cfg.num_beams = 5
    cfg.max_new_tokens = 448
    if a.language and getattr(cfg, "is_multilingual", False):
        cfg.language = f"<|{a.language}|>"
        cfg.task = "transcribe"

    def run():
        x, sr = sf.read(a.wav, dtype="float32")
        assert sr == SAMPLE_RATE
        r = pipe.generate(x.tolist(), cfg)
        chunks = r.chunks or []
        return [dict(start=c.start_ts, end=c.end_ts, text=c.text) for c in chunks] or \
            [dict(start=0.0, end=0.0, text=r.texts[0])]
    return run


def child(a):
    system, precision = a.child.rsplit(":", 1)
    int8 = precision == "int8"
    batched = "-batched" in system
    make = {"fastattn": _fastattn, "faster-whisper": _faster_whisper, "openvino": _openvino,
            "fastattn-nots": lambda *x: _fastattn(*x, timestamps=False),
            "faster-whisper-ts": lambda *x: _faster_whisper(*x, timestamps=True),
            "fastattn-nocond": lambda *x: _fastattn(*x, variant="nocond"),
            "fastattn-cut": lambda *x: _fastattn(*x, variant="cut")}[
        system.replace("-batched", "")]
    t0 = time.perf_counter()
    run = make(a, int8, batched)
    load = time.perf_counter() - t0
    t0 = time.perf_counter()
    segs = run()
    with open(a.child_out, "w") as f:
        json.dump({"load_s": load, "transcribe_s": time.perf_counter() - t0,
                   "segments": segs}, f)


# -- the parent --------------------------------------------------------------------------------

def scores(reference, hypothesis):
    """(words of the reference, recall, WER) on lower-cased punctuation-free words."""
    import jiwer
    ref, hyp = _words(reference), _words(hypothesis)
    o = jiwer.process_words(ref, hyp)
    n = o.hits + o.substitutions + o.deletions
    return n, o.hits / n, (o.substitutions + o.deletions + o.insertions) / n


def export_openvino(a, hf, out, int8):
    """optimum-cli export openvino of the Hugging Face folder (offline) -> out, once."""
    if os.path.exists(os.path.join(out, "openvino_encoder_model.xml")):
        return None
    cli = os.path.join(os.path.dirname(a.ov_python), "optimum-cli")
    cmd = [cli, "export", "openvino", "--model", hf, "--task",
           "automatic-speech-recognition-with-past"] + \
        (["--weight-format", "int8"] if int8 else ["--weight-format", "fp32"]) + [out]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode or not os.path.exists(os.path.join(out, "openvino_encoder_model.xml")):
        tail = (p.stderr or p.stdout).strip().splitlines()[-2:]
        return f"export failed (exit {p.returncode}): {' | '.join(tail)}"
    return None


def run_child(a, system, precision, wav, dump):
    python = a.ov_python if system == "openvino" else sys.executable
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tf:
        out = tf.name
    cmd = [python, os.path.abspath(__file__), "--child", f"{system}:{precision}",
           "--child-out", out, "--wav", wav, "--batch-size", str(a.batch_size),
           "--hf", os.path.join(a.model, "hf"), "--ct2", os.path.join(a.model, "ct2-float32"),
           "--ct2-int8", os.path.join(a.model, "ct2-int8"), "--ov", a.ov, "--ov-int8",
           a.ov_int8] + (["--language", a.language] if a.language else [])
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    try:
        if p.returncode:
            tail = (p.stderr or p.stdout).strip().splitlines()[-2:]
            return {"why": f"child failed (exit {p.returncode}): {' | '.join(tail)}"}
        with open(out) as f:
            r = json.load(f)
        r["wall_s"] = wall
        with open(dump, "w") as f:
            json.dump(r, f, indent=1)
        return r
    finally:
        os.unlink(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a folder with hf/, ct2-float32/, ct2-int8/ "
                    "(bench/fixtures/whisper_from_ct2.py OUT)")
    ap.add_argument("--model-name", default=None)
    ap.add_argument("--language", default=None, help="e.g. en (multilingual models)")
    ap.add_argument("--minutes", type=float, nargs="+", default=[2.0])
    ap.add_argument("--seed", type=int, nargs="+", default=[59],
                    help="one file per seed and length; with several files a pooled line per "
                         "system and precision (all words together) ends the report")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--precisions", default="float32,int8")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--dir", default="/tmp/fastattn_longform_recall")
    ap.add_argument("--ov-python", default=None, help="python of an environment with "
                    "openvino-genai and optimum-intel (else the openvino line is skipped)")
    ap.add_argument("--ov", default=None, help="OpenVINO export folder (default: under --dir)")
    ap.add_argument("--ov-int8", default=None)
    ap.add_argument("--out", default=None, help="append the report to this file")
    ap.add_argument("--make-only", action="store_true", help="write the speech files and stop")
    # the child's
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--wav", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--hf", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ct2", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ct2-int8", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)
    files = [make_speech(a.dir, m, seed) for m in a.minutes for seed in a.seed]
    if a.make_only:
        for wav, text, dur in files:
            print(f"{wav}: {dur:.1f} s, {len(_words(text).split())} words")
        return
    if not a.model:
        ap.error("--model is needed")
    name = a.model_name or os.path.basename(os.path.normpath(a.model))
    a.ov = a.ov or os.path.join(a.dir, f"ov_{name}_fp32")
    a.ov_int8 = a.ov_int8 or os.path.join(a.dir, f"ov_{name}_int8")
    systems = [s for s in a.systems.split(",") if s]
    precisions = [p for p in a.precisions.split(",") if p]
    lines = []

    def say(line):
        print(line, flush=True)
        lines.append(line)

    skip = {}
    if "openvino" in systems:
        if not a.ov_python:
            skip["openvino"] = "no --ov-python (an environment with openvino-genai)"
        else:
            for p in precisions:
                why = export_openvino(a, os.path.join(a.model, "hf"),
                                      a.ov_int8 if p == "int8" else a.ov, p == "int8")
                if why:
                    skip["openvino", p] = why
    say(f"# model {name} ({a.model}), language {a.language or '-'}, beam 5, batch_size "
        f"{a.batch_size}, seed {' '.join(map(str, a.seed))}; {datetime.date.today()}")
    say(f"# {'file':>18} {'system':>25} {'prec':>7} {'words':>6} {'recall':>7} {'WER':>7} "
        f"{'segs':>5} {'secs':>7}")
    pooled = {}
    for wav, text, dur in files:
        tag = os.path.basename(wav)[:-4]
        for system in systems:
            for p in precisions:
                why = skip.get(system) or skip.get((system, p))
                head = f"  {tag[9:]:>18} {system:>25} {p:>7}"
                if why:
                    say(f"{head}  not run: {why}")
                    continue
                dump = os.path.join(a.dir, f"hyp_{name}_{tag}_{system}_{p}.json")
                r = run_child(a, system, p, wav, dump)
                if "why" in r:
                    say(f"{head}  not run: {r['why']}")
                    continue
                hyp = " ".join(s["text"] for s in r["segments"])
                n, rec, w = scores(text, hyp)
                say(f"{head} {n:6d} {rec:7.4f} {w:7.4f} {len(r['segments']):5d} "
                    f"{r['transcribe_s']:7.1f}")
                t = pooled.setdefault((system, p), [0, 0.0, 0.0, 0, 0.0, 0])
                t[0] += n
                t[1] += rec * n
                t[2] += w * n
                t[3] += len(r["segments"])
                t[4] += r["transcribe_s"]
                t[5] += 1
    if len(files) > 1:
        # every file's words together: hits / words and errors / words over all of them
        for (system, p), (n, hits, errors, segs, secs, k) in pooled.items():
            say(f"  {'pooled ' + str(k) + ' files':>18} {system:>25} {p:>7} {n:6d} "
                f"{hits / n:7.4f} {errors / n:7.4f} {segs:5d} {secs:7.1f}")
    if a.out:
        with open(a.out, "a") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
