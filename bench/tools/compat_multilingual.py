"""faster-whisper against fastattn.compat.faster_whisper on a multilingual CTranslate2 folder:
language detection (one window; several with a threshold) and ``multilingual=True`` (each
window decoded in the language detected on it), on espeak-ng speech: German, a pause, then the
English clip of tests/audio/data. Each system in a process of its own; prints both results
and the word error rate between the transcripts.

    python bench/tools/compat_multilingual.py --model FOLDER    # e.g. Systran/faster-whisper-base

The test suite checks the rules on random checkpoints (tests/audio/test_transcriber.py) and
the English-only tiny.en against faster-whisper (tests/compat); this is the check on a real
multilingual model, which the test extra does not carry.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ENGLISH = os.path.join(HERE, "..", "..", "tests", "audio", "data", "speech_en.flac")
GERMAN = ("Die Bibliothek öffnet um neun Uhr morgens und schließt um sechs Uhr abends. Im ersten "
          "Stock gibt es einen Lesesaal mit langen Holztischen, und auf jedem Tisch steht eine "
          "grüne Lampe. Die Studenten kommen früh, um einen Platz in der Nähe der Fenster zu "
          "finden.")


def run(system, model, wav):
    import numpy as np
    if system == "faster-whisper":
        import faster_whisper as module
    else:
        from fastattn.compat import faster_whisper as module
    from fastattn.audio import load_audio
    de = load_audio(wav)
    en = load_audio(ENGLISH)
    audio = np.concatenate([de, np.zeros(16000 * 3, np.float32), en[:16000 * 25]])
    m = module.WhisperModel(model, device="cpu", cpu_threads=2)
    one = m.detect_language(de)[:2]
    several = m.detect_language(audio, language_detection_segments=3,
                                language_detection_threshold=0.99)[:2]
    segs, info = m.transcribe(audio, beam_size=5, multilingual=True)
    return dict(detect=[one[0], float(one[1])], detect3=[several[0], float(several[1])],
                language=info.language, segments=[[round(s.start, 2), s.text] for s in segs])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a multilingual CTranslate2 Whisper folder")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--wav", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(run(args.child, args.model, args.wav)))
        return
    if not shutil.which("espeak-ng"):
        sys.exit("compat_multilingual: espeak-ng is needed (apt-get install espeak-ng)")
    import jiwer
    with tempfile.TemporaryDirectory() as tmp:
        wav = os.path.join(tmp, "de.wav")
        subprocess.run(["espeak-ng", "-v", "de", "-s", "150", "-w", wav, GERMAN], check=True)
        out = {}
        for system in ("faster-whisper", "fastattn.compat"):
            r = subprocess.run([sys.executable, __file__, "--model", args.model, "--child",
                                system, "--wav", wav], capture_output=True, text=True)
            if r.returncode:
                sys.exit(f"compat_multilingual: {system} failed: {r.stderr.strip()[-500:]}")
            out[system] = json.loads(r.stdout.strip().splitlines()[-1])
    for system, res in out.items():
        print(f"{system}: detect_language {res['detect']}, 3 windows at 0.99 {res['detect3']}, "
              f"info.language {res['language']}")
        for start, text in res["segments"]:
            print(f"  {start:7.2f} {text}")
    texts = [" ".join(t for _, t in out[s]["segments"]) for s in out]
    print(f"WER between the transcripts: {jiwer.wer(texts[0], texts[1]):.3f}")


if __name__ == "__main__":
    main()
