"""Peak RSS of a long transcription: fastattn's Transcriber against faster-whisper, each in a
fresh process (VmHWM at the end), on a file made by repeating bench_whisper.py's speech.

    python bench/bench_whisper_memory.py --shape base --minutes 10 --int8

Needs bench_whisper.py's checkpoints and speech (--dir, made by a bench_whisper.py run). Peak
memory does not depend on the machine's load; the seconds printed do (not a speed figure).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time


def _hwm():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(system, folder, wav, int8):
    t = time.perf_counter()
    if system == "fastattn":
        from fastattn.audio import Transcriber
        tr = Transcriber(os.path.join(folder, "hf"), quantize="int8" if int8 else None,
                         n_threads=2)
        n = len(tr.transcribe(wav, language="en", max_new_tokens=224).segments)
    else:
        from faster_whisper import WhisperModel
        m = WhisperModel(os.path.join(folder, "ct2-int8" if int8 else "ct2-float32"),
                         device="cpu", compute_type="int8" if int8 else "float32",
                         cpu_threads=2)
        segs, _ = m.transcribe(wav, language="en", beam_size=5)
        n = len(list(segs))
    print(f"{system}{' int8' if int8 else ''}: {n} segments, peak RSS {_hwm():.0f} MiB "
          f"({time.perf_counter() - t:.0f} s)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="base")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--int8", action="store_true")
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "fastattn_bench_whisper"))
    ap.add_argument("--child", default=None)
    ap.add_argument("--wav", default=None)
    a = ap.parse_args()
    folder = os.path.join(a.dir, a.shape)
    if a.child:
        return child(a.child, folder, a.wav, a.int8)
    import numpy as np
    import soundfile as sf
    speech = [f for f in os.listdir(a.dir) if f.startswith("speech_") and f.endswith(".wav")]
    if not speech or not os.path.isdir(folder):
        sys.exit(f"run bench/bench_whisper.py --shape {a.shape} first (it makes {a.dir})")
    audio, sr = sf.read(os.path.join(a.dir, sorted(speech)[-1]), dtype="float32")
    n = int(a.minutes * 60 * sr)
    long = np.concatenate([audio] * (n // audio.size + 1))[:n]
    wav = os.path.join(a.dir, f"speech_{int(a.minutes * 60)}s_repeated.wav")
    sf.write(wav, long, sr)
    print(f"# {a.minutes:g} minutes ({wav}); whisper-{a.shape} random weights; beam 5; "
          f"2 threads; each system in a fresh process")
    for system in ("fastattn", "faster-whisper"):
        subprocess.run([sys.executable, __file__, "--child", system, "--wav", wav,
                        "--shape", a.shape, "--dir", a.dir] + (["--int8"] if a.int8 else []),
                       check=True)


if __name__ == "__main__":
    main()
