"""Transcripts as files: plain text, SubRip (.srt), WebVTT (.vtt) and JSON.

The layouts are the ones openai-whisper's ``--output_format`` writes and subtitle players read:
SRT numbers its cues from 1 with ``HH:MM:SS,mmm`` times, WebVTT starts with ``WEBVTT`` and uses
``HH:MM:SS.mmm``; text has one segment a line; JSON holds the whole result (text, language,
duration, the segments with their tokens, log-probabilities and words).
"""
import json

__all__ = ["FORMATS", "format_timestamp", "write_transcript"]

FORMATS = ("txt", "srt", "vtt", "json")


def format_timestamp(seconds, sep="."):
    """HH:MM:SS.mmm (`sep` ',' for SRT), rounded to the millisecond."""
    if seconds < 0:
        raise ValueError(f"a timestamp cannot be negative, got {seconds!r}")
    ms = int(round(seconds * 1000.0))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def _cue_text(text):
    # a cue's text must not hold the blank line that ends a cue, nor "-->"
    return " ".join(text.split()).replace("-->", "->")


def _as_dict(result):
    d = {"text": result.text, "language": result.language,
         "language_probability": result.language_probability, "duration": result.duration,
         "segments": []}
    for s in result.segments:
        seg = {k: getattr(s, k) for k in ("id", "seek", "start", "end", "text", "tokens",
                                          "temperature", "avg_logprob", "compression_ratio",
                                          "no_speech_prob")}
        if s.words is not None:
            seg["words"] = [{"start": w.start, "end": w.end, "word": w.word,
                             "probability": w.probability} for w in s.words]
        d["segments"].append(seg)
    return d


def write_transcript(result, f, fmt):
    """Write a :class:`~fastattn.audio.transcriber.Transcription` to the text stream `f` in
    `fmt` (one of :data:`FORMATS`)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt == "txt":
        for s in result.segments:
            f.write(s.text.strip() + "\n")
    elif fmt == "json":
        json.dump(_as_dict(result), f, ensure_ascii=False, indent=1)
        f.write("\n")
    else:
        if fmt == "vtt":
            f.write("WEBVTT\n\n")
        sep = "," if fmt == "srt" else "."
        for i, s in enumerate(result.segments, 1):
            if fmt == "srt":
                f.write(f"{i}\n")
            f.write(f"{format_timestamp(s.start, sep)} --> {format_timestamp(s.end, sep)}\n"
                    f"{_cue_text(s.text)}\n\n")
