"""`fastattn transcribe`: audio files in, transcripts (txt / srt / vtt / json) out.

Failures (a missing folder, an unreadable or empty audio file, a bad option) are one line on
stderr and exit status 2, never a traceback; every output is written to a temporary file beside
it and renamed when its transcript is complete, so a failed run leaves no partial file.
"""
import os
import shutil
import sys
import time

from .._cli import CommandError, Output, positive_int
from .formats import FORMATS, write_transcript

__all__ = ["add_arguments", "run"]


def add_arguments(p):
    p.add_argument("model", metavar="FOLDER", help="a Whisper folder (Hugging Face or "
                   "`fastattn convert`ed): openai/whisper-*, distil-whisper, fine-tunes")
    p.add_argument("--input", metavar="AUDIO", nargs="+", required=True,
                   help="audio files: WAV / FLAC, or anything FFmpeg reads (mp3, m4a, ogg, "
                        "video) with fastattn[audio]; with --live, - (standard input) or a "
                        "raw PCM file")
    p.add_argument("--output", metavar="FILE", help="the transcript of the one input (format "
                   "from its suffix, or --format); default stdout")
    p.add_argument("--output-dir", metavar="DIR", help="write INPUT_STEM.FORMAT here for "
                   "each input")
    p.add_argument("--format", choices=FORMATS, help="txt, srt, vtt or json (default: the "
                   "--output suffix, else txt)")
    p.add_argument("--language", help="the spoken language ('en', 'german', ...); default: "
                   "detected from the first 30 s")
    p.add_argument("--task", choices=("transcribe", "translate"), default="transcribe",
                   help="translate: English text of any language")
    p.add_argument("--beams", type=positive_int, default=5, metavar="N",
                   help="beam size (default 5)")
    p.add_argument("--temperature", type=float, nargs="+", metavar="T",
                   help="the fallback temperatures (default 0 0.2 0.4 0.6 0.8 1)")
    p.add_argument("--no-condition", action="store_true",
                   help="do not prompt each window with the text before it")
    p.add_argument("--initial-prompt", metavar="TEXT", help="text that prompts the first window")
    p.add_argument("--prefix", metavar="TEXT",
                   help="text the transcript begins with (the first window is forced to it)")
    p.add_argument("--hotwords", metavar="TEXT",
                   help="words or phrases shown to the model before every window")
    p.add_argument("--word-timestamps", action="store_true", help="per-word times (json)")
    p.add_argument("--hallucination-silence-threshold", type=float, metavar="SECONDS",
                   help="with --word-timestamps: drop a segment that looks hallucinated between "
                        "silences longer than this, and skip the silence")
    p.add_argument("--batch-size", type=positive_int, metavar="N",
                   help="decode N windows at once, cut at the silences a voice-activity "
                        "detector finds")
    p.add_argument("--vad", action="store_true", help="skip the stretches without speech")
    p.add_argument("--vad-model", choices=("silero", "webrtc"), default="silero",
                   help="the voice-activity detector (default silero)")
    p.add_argument("--quantize", choices=("int8", "bfloat16"), help="int8 or bfloat16 weights")
    p.add_argument("--threads", type=positive_int, metavar="N", help="threads (default: all)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    g = p.add_argument_group("live (--live: raw PCM as it arrives, text as it settles)")
    g.add_argument("--live", action="store_true",
                   help="live transcription of raw 16-bit little-endian mono PCM: --input - "
                        "reads standard input (arecord -f S16_LE -r 16000 -c 1, ffmpeg -f "
                        "s16le -ac 1 -); confirmed text is printed as it comes (partials too "
                        "on a terminal); --output writes the final srt / vtt / json / txt")
    g.add_argument("--input-rate", type=positive_int, default=16000, metavar="HZ",
                   help="the PCM's sample rate (default 16000; others are resampled)")
    g.add_argument("--min-chunk", type=float, default=1.0, metavar="SECONDS",
                   help="decode after this much new audio (default 1.0)")
    g.add_argument("--agreement", type=positive_int, default=2, metavar="N",
                   help="confirm what the last N decodings agree on (default 2)")
    g.add_argument("--silence-ms", type=positive_int, default=700, metavar="MS",
                   help="the pause that closes an utterance (default 700)")
    g.add_argument("--no-vad", action="store_true",
                   help="no voice-activity detection: decode everything, one utterance")


def _format(args, path):
    if args.format:
        return args.format
    if path:
        ext = os.path.splitext(path)[1].lower().lstrip(".")
        if ext in FORMATS:
            return ext
        if ext:
            raise CommandError(f"--output {path}: unknown suffix .{ext} (use one of "
                               f"{', '.join('.' + f for f in FORMATS)} or --format)")
    return "txt"


def _targets(args):
    """[(input, output path or None for stdout, format)]."""
    if args.output and args.output_dir:
        raise CommandError("give --output or --output-dir, not both")
    if args.output_dir:
        if not os.path.isdir(args.output_dir):
            raise CommandError(f"--output-dir {args.output_dir}: not a folder")
        fmt = args.format or "txt"
        out = []
        for src in args.input:
            stem = os.path.splitext(os.path.basename(src))[0] or "audio"
            out.append((src, os.path.join(args.output_dir, f"{stem}.{fmt}"), fmt))
        return out
    if len(args.input) > 1:
        raise CommandError("several inputs need --output-dir")
    return [(args.input[0], args.output, _format(args, args.output))]


def run(args):
    from .transcriber import Transcriber
    if args.live:
        return _run_live(args)
    targets = _targets(args)
    for src, _, _ in targets:                      # unreadable input: fail before loading
        if not os.path.isfile(src):
            raise CommandError(f"--input {src}: no such file")
    options = {"task": args.task, "num_beams": args.beams,
               "condition_on_previous_text": not args.no_condition,
               "initial_prompt": args.initial_prompt, "word_timestamps": args.word_timestamps}
    if args.language:
        options["language"] = args.language
    if args.hallucination_silence_threshold is not None:
        options["hallucination_silence_threshold"] = args.hallucination_silence_threshold
    for name in ("prefix", "hotwords"):
        if getattr(args, name):
            options[name] = getattr(args, name)
    if args.temperature:
        options["temperature"] = tuple(args.temperature)
    if args.batch_size:
        options["batch_size"] = args.batch_size
    if args.vad:
        options["vad_filter"] = True
    if args.vad or args.batch_size:
        options["vad_model"] = args.vad_model
    tr = Transcriber(args.model, quantize=args.quantize, n_threads=args.threads)
    for src, dst, fmt in targets:
        out = Output(dst)
        try:
            stream = tr.stream(src, **options)
            segments = []
            for seg in stream:
                segments.append(seg)
                if not args.quiet:
                    print(f"fastattn transcribe: {os.path.basename(src)}: "
                          f"{min(seg.end, stream.duration):.1f} / {stream.duration:.1f} s",
                          file=sys.stderr, flush=True)
            write_transcript(stream.result(segments), out.f, fmt)
            out.commit()
        finally:
            out.discard()
    return 0


def _read_pcm(src, block):
    """Blocks of at most `block` bytes of `src` ('-': standard input), an even count each."""
    f = sys.stdin.buffer if src == "-" else open(src, "rb")
    try:
        carry = b""
        while True:
            data = f.read1(block) if hasattr(f, "read1") else f.read(block)
            if not data:
                break
            data = carry + data
            n = len(data) // 2 * 2
            carry = data[n:]
            if n:
                yield data[:n]
        if carry:
            raise CommandError("--input: the PCM ends in half a sample (an odd byte count)")
    finally:
        if src != "-":
            f.close()


def _run_live(args):
    """--live: PCM in, confirmed text out as it comes, the final transcript to --output."""
    from .live import Confirmed, Partial, UtteranceEnd, transcription
    from .transcriber import Transcriber
    if len(args.input) != 1:
        raise CommandError("--live takes one --input: - (standard input) or a raw PCM file")
    src = args.input[0]
    if src != "-" and not os.path.isfile(src):
        raise CommandError(f"--input {src}: no such file")
    if args.output_dir or args.batch_size:
        raise CommandError("--live writes one transcript: give --output, not --output-dir / "
                           "--batch-size")
    if args.prefix or args.hotwords:
        raise CommandError("--prefix / --hotwords: not with --live (a live session is prompted "
                           "with its confirmed text; use --initial-prompt)")
    fmt = _format(args, args.output)
    out = Output(args.output) if args.output else None
    options = {"num_beams": args.beams, "min_chunk": args.min_chunk,
               "agreement": args.agreement, "silence_ms": args.silence_ms,
               "vad": None if args.no_vad else args.vad_model}
    if args.language:
        options["language"] = args.language
    if args.initial_prompt:
        options["initial_prompt"] = args.initial_prompt
    try:
        tr = Transcriber(args.model, quantize=args.quantize, n_threads=args.threads)
        session = tr.live(**options)
        tty = sys.stdout.isatty()
        events, line = [], ""

        def show(evs):
            nonlocal line
            for e in evs:
                events.append(e)
                if isinstance(e, Confirmed):
                    text = e.text.lstrip() if not line else e.text
                    line += text
                    if not tty:
                        sys.stdout.write(text)
                elif isinstance(e, Partial) and tty:
                    width = shutil.get_terminal_size().columns - 1
                    sys.stdout.write("\r" + e.text[-width:] + "\x1b[K")
                elif isinstance(e, UtteranceEnd) and (line or tty):
                    sys.stdout.write(("\r" + e.text + "\x1b[K" if tty else "") + "\n")
                    line = ""
            sys.stdout.flush()

        block = max(2, int(args.input_rate * 0.1) * 2)         # 0.1 s reads
        t0, warned = time.monotonic(), args.quiet
        for data in _read_pcm(src, block):
            show(session.feed(data, sample_rate=args.input_rate))
            lag = time.monotonic() - t0 - session.seconds
            if not warned and lag > max(5.0, 3 * args.min_chunk):
                warned = True            # live input read slower than it arrives
                print(f"fastattn transcribe: decoding runs {lag:.0f} s behind the audio; try "
                      "--min-chunk 2, --beams 1 or --quantize int8", file=sys.stderr,
                      flush=True)
        show(session.finish())
        if line:
            sys.stdout.write("\n")
            sys.stdout.flush()
        if out is not None:
            write_transcript(transcription(events, session.seconds,
                                           session.language or "en"), out.f, fmt)
            out.commit()
    finally:
        if out is not None:
            out.discard()
    return 0
