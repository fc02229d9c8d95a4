"""The rules that judge a window's decoding by its text, for the long form
(:mod:`fastattn.audio._longform`) and live transcription (:mod:`fastattn.audio.live`): how
repetitive it is (:func:`compression_ratio`, openai-whisper's measure), whether it loops or is
speech said again (:func:`loops`), whether a prompt repeats itself (:func:`repeats`,
:func:`first_repeat`), and which segments are hallucinated (:func:`skip_hallucinations`)."""
import re
import zlib

from .alignment import APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS

def compression_ratio(text):
    """len(utf-8 bytes) / len(zlib-compressed bytes) (openai-whisper's repetition measure)."""
    b = text.encode("utf-8")
    return len(b) / len(zlib.compress(b)) if b else 0.0


_REPEAT_WORDS = 8
# a result saying more words a second of speech than this is a loop (speech: 3 to 5 words a
# second of its loud frames, 4 to 5 of a voice-activity detector's speech)
LOOP_WORDS_PER_S = 8.0
# a phrase of up to _STUTTER_WORDS words said _STUTTER_COPIES times back to back is a loop
_STUTTER_WORDS, _STUTTER_COPIES = 4, 4
# the same in letters, for loops without spaces ("nononono...") and scripts written without
# them: more than LOOP_CHARS_PER_S letters a second (LOOP_WORDS_PER_S words of six), or a run
# of up to four letters 16 times back to back
LOOP_CHARS_PER_S = 48.0
_CHAR_LOOP = re.compile(r"(\w{1,4}?)\1{15,}")


def _words(text):
    """`text`'s words, lower-cased, punctuation left out (what the repetition rules compare)."""
    return re.sub(r"[^\w' ]+", " ", text.lower()).split()


def loops(text, seconds):
    """Whether a decoding's `text` over `seconds` of speech is a loop, not speech said again:
    more than LOOP_WORDS_PER_S words a second (at least one second counted), or a phrase of up
    to _STUTTER_WORDS words _STUTTER_COPIES times back to back ("long long long long", "I'm
    sorry. I'm sorry. ..."); in letters (a loop without spaces, or a script written without
    them): more than LOOP_CHARS_PER_S letters a second, or up to four letters 16 times back to
    back ("Nononono..."). A sentence said again keeps the pace of speech and its copies are
    longer than that."""
    words = _words(text)
    if len(words) > LOOP_WORDS_PER_S * max(seconds, 1.0):
        return True
    letters = re.sub(r"\W+", "", text)
    if len(letters) > LOOP_CHARS_PER_S * max(seconds, 1.0) or _CHAR_LOOP.search(letters):
        return True
    for n in range(1, _STUTTER_WORDS + 1):
        run = 0                 # words so far that equal the word n before them
        for i in range(n, len(words)):
            run = run + 1 if words[i] == words[i - n] else 0
            if run >= (_STUTTER_COPIES - 1) * n:
                return True
    return False


def repeats(text, n=_REPEAT_WORDS):
    """Whether `text` holds a run of `n` words (lower-cased, punctuation left out) twice: a
    prompt like that makes Whisper skip the speech that says it again, or loop on it."""
    words = _words(text)
    seen = set()
    for i in range(len(words) - n + 1):
        gram = tuple(words[i:i + n])
        if gram in seen:
            return True
        seen.add(gram)
    return False


def first_repeat(texts):
    """The index of the first of `texts` whose words (lower-cased, punctuation left out) are
    those of an earlier one, or None."""
    seen = set()
    for i, t in enumerate(texts):
        words = tuple(_words(t))
        if words and words in seen:
            return i
        seen.add(words)
    return None


def _alike(a, b):
    """Whether two words are one heard twice: equal, or (four letters or more) one edit apart
    ("railing" / "railings", "skill" / "kill")."""
    if a == b:
        return True
    if max(len(a), len(b)) < 4 or abs(len(a) - len(b)) > 1:
        return False
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return a[i + 1:] == b[i + 1:] or a[i + 1:] == b[i:] or a[i:] == b[i + 1:]


def overlap(before, after):
    """How many words at the start of `after` say again the last words of `before` (texts):
    the longest run of k >= 2 words whose first words are equal, whose last words are alike
    (:func:`_alike`) and at most k // 3 of the rest not; 0 where none. What a window that
    starts inside speech the previous window's last segment already wrote says again
    ("... is mostly a matter" / "Learning to sail is mostly a matter of patience")."""
    a, b = _words(before), _words(after)
    for k in range(min(len(a), len(b)), 1, -1):
        head, tail = a[-k:], b[:k]
        if head[0] == tail[0] and _alike(head[-1], tail[-1]) and \
                sum(not _alike(x, y) for x, y in zip(head, tail)) <= k // 3:
            return k
    return 0


_PUNCTUATION = PREPEND_PUNCTUATIONS + APPEND_PUNCTUATIONS


def _anomaly(words):
    """Whether a segment's words look hallucinated: improbable (p < 0.15), too short
    (< 0.133 s) or too long (> 2 s), scored on its first 8 words (openai-whisper's rule)."""
    words = [w for w in words if w.word not in _PUNCTUATION][:8]
    if not words:
        return False
    score = 0.0
    for w in words:
        d = w.end - w.start
        score += (w.probability < 0.15) + max(0.0, 0.133 - d) * 15 + max(0.0, d - 2.0)
    return score >= 3 or score + 0.01 >= len(words)


def skip_hallucinations(segs, threshold, offset, window_s, segment_s, total_s, last_end):
    """hallucination_silence_threshold (openai-whisper's and faster-whisper's semantics): a
    window's segments [[tokens, start, end, words]] (times in seconds of the decoded audio)
    -> None (keep them all) or (how many to keep, where the seek goes on: a time, or None for
    the end of the audio).

    A hallucination is a segment whose words score as anomalous (:func:`_anomaly`). When the
    window's first segment with words is one and starts more than `threshold` s into the
    window, nothing is kept and the seek moves to it (the silence before it is skipped and it
    is decoded again from there). A hallucination with silence (over `threshold`, or the
    window's edge, or another hallucination) on both sides is dropped with what follows, and
    the seek moves to its start."""
    worded = [i for i, s in enumerate(segs) if s[3]]
    if not worded:
        return None
    first = segs[worded[0]]
    if _anomaly(first[3]) and first[1] - offset > threshold:
        return 0, first[1]
    prev_end = last_end
    for k, i in enumerate(worded):
        _, start, end, words = segs[i]
        if _anomaly(words):
            nxt = segs[worded[k + 1]] if k + 1 < len(worded) else None
            next_start = nxt[3][0].start if nxt is not None else offset + segment_s
            before = start - prev_end > threshold or start < threshold or start - offset < 2.0
            after = (next_start - end > threshold or (nxt is not None and _anomaly(nxt[3])) or
                     offset + window_s - end < 2.0)
            if before and after:
                if total_s - end < threshold:
                    return i, None
                return i, max(offset + 1, start)
        prev_end = end
    return None
