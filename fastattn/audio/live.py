"""Live transcription: audio in chunks of any size as it arrives, text as it settles.

:meth:`Transcriber.live` returns a :class:`LiveSession`; feed it samples and it returns
events:

- :class:`SpeechStart` -- the voice-activity detector heard speech begin (an utterance opens);
- :class:`Partial` -- the text of the utterance in progress (it may still change);
- :class:`Confirmed` -- words that will not change again, with their times;
- :class:`UtteranceEnd` -- the utterance closed (a pause of ``silence_ms``, or :meth:`finish`),
  with all its text.

The policy is whisper_streaming's LocalAgreement-n (Macháček et al., 2023), re-derived here:
after every ``min_chunk`` seconds of new audio the whole buffer of the utterance (at most
30 s) is decoded, prompted with the confirmed text that has left the buffer (this utterance's,
then the previous ones'), with word timestamps; a word is confirmed when the last
``agreement`` decodings agree on it and on every unconfirmed word before it (the same
normalised text, starts within ``match_s`` seconds). When the buffer passes ``buffer_trim``
seconds it is cut at the last confirmed segment or sentence end, so the decoded audio stays
short; it never exceeds 30 s. The voice-activity detector (Silero or WebRTC, as in
:mod:`.vad`) skips silence (nothing is decoded while nobody speaks) and closes an utterance
after ``silence_ms`` of non-speech: then its last decoding is confirmed whole.

The decode points depend only on the number of samples fed: the same samples give the same
events whatever the chunk sizes, the wall clock or the thread count. Several sessions step
together with :class:`LiveGroup` (:meth:`Transcriber.live_batch`): their decodings run as one
batch, each session's events bitwise what it gives alone.
"""
import collections
import re
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np

from .._validation import check_positive_int
from ..generation.whisper import WindowDecoder, language_token, window_segments
from ._live_input import _as_samples, _Resampler, _StreamVad  # noqa: F401 (re-exported)
from ._longform import plain_ids
from ._window_rules import compression_ratio
from .alignment import Word, add_word_timestamps
from .features import HOP_LENGTH, SAMPLE_RATE, log_mel_spectrogram

__all__ = ["LiveSession", "LiveGroup", "SpeechStart", "Partial", "Confirmed", "UtteranceEnd",
           "LIVE_DEFAULTS", "transcription"]

_STRIDE = 2                                   # mel frames per encoder position


@dataclass(frozen=True)
class SpeechStart:
    """Speech began at `start` seconds (an utterance opens)."""
    start: float


@dataclass(frozen=True)
class Partial:
    """The text of the utterance in progress: its confirmed words, then the latest decoding's
    unconfirmed ones (these may change)."""
    text: str


@dataclass(frozen=True)
class Confirmed:
    """Words confirmed for good (:class:`~fastattn.audio.Word`: start and end in seconds from
    the session's first sample) and their text (the words joined)."""
    words: tuple
    text: str


@dataclass(frozen=True)
class UtteranceEnd:
    """An utterance closed: all its confirmed text, and when it started and ended (seconds)."""
    text: str
    start: float
    end: float


LIVE_DEFAULTS = dict(min_chunk=1.0, agreement=2, buffer_trim=15.0, silence_ms=700,
                     vad="silero", vad_threshold=0.5, speech_pad_ms=300, num_beams=5,
                     language=None, initial_prompt=None, prompt_chars=200, match_s=1.0,
                     max_utterance_s=60.0, catch_up=False)


def _number(value, name, low, high=None, integer=False):
    ok = isinstance(value, Integral) if integer else isinstance(value, Real)
    if isinstance(value, bool) or not ok or value != value or value < low or \
            (high is not None and value > high):
        span = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be a {'whole ' if integer else ''}number {span}, got "
                         f"{value!r}")
    return value


class _Config:
    """The checked options of a live session (:data:`LIVE_DEFAULTS`)."""

    def __init__(self, tr, **options):
        for key in options:
            if key not in LIVE_DEFAULTS:
                raise TypeError(f"live() got an unexpected keyword argument {key!r}")
        o = dict(LIVE_DEFAULTS, **options)
        self.min_chunk = float(_number(o["min_chunk"], "min_chunk", 0.1, 10.0))
        self.step = int(round(self.min_chunk * SAMPLE_RATE))
        self.agreement = int(_number(o["agreement"], "agreement", 1, 10, integer=True))
        self.buffer_trim = float(_number(o["buffer_trim"], "buffer_trim", 2.0, 28.0))
        # the buffer before a step adds its audio: one window (30 s), less that step
        window = tr.n_frames * HOP_LENGTH / SAMPLE_RATE
        self.max_buffer = window - self.min_chunk - 0.1
        if self.max_buffer < 1.0:
            raise ValueError(f"min_chunk={self.min_chunk:g} s leaves no room in the model's "
                             f"{window:g} s window")
        self.buffer_trim = min(self.buffer_trim, self.max_buffer / 2)
        self.silence = int(_number(o["silence_ms"], "silence_ms", 100, 60000, integer=True)
                           * SAMPLE_RATE // 1000)
        if o["vad"] not in (None, "silero", "webrtc"):
            raise ValueError(f"vad must be 'silero', 'webrtc' or None, got {o['vad']!r}")
        self.vad = o["vad"]
        self.threshold = float(_number(o["vad_threshold"], "vad_threshold", 0.01, 0.99))
        self.pad = int(_number(o["speech_pad_ms"], "speech_pad_ms", 0, 2000, integer=True)
                       * SAMPLE_RATE // 1000)
        self.pad = min(self.pad, self.silence)
        self.num_beams = check_positive_int(o["num_beams"], "num_beams")
        self.prompt_chars = int(_number(o["prompt_chars"], "prompt_chars", 0, 2000,
                                        integer=True))
        self.match_s = float(_number(o["match_s"], "match_s", 0.0, 30.0))
        self.max_utterance = float(_number(o["max_utterance_s"], "max_utterance_s", 1.0))
        if not isinstance(o["catch_up"], bool):
            raise TypeError(f"catch_up must be True or False, got {o['catch_up']!r}")
        self.catch_up = o["catch_up"]
        self.window = tr.n_frames * HOP_LENGTH
        if o["initial_prompt"] is not None and not isinstance(o["initial_prompt"], str):
            raise TypeError(f"initial_prompt must be a string, got "
                            f"{type(o['initial_prompt']).__name__}")
        self.initial_prompt = o["initial_prompt"] or ""
        gen = tr.model.generation_config
        lang = o["language"]
        if lang is not None:
            if not gen.get("lang_to_id"):
                if lang != "en":
                    raise ValueError(f"language: this is an English-only Whisper; got "
                                     f"{lang!r}, only 'en' applies")
                lang = None
            else:
                inv = {v: k for k, v in gen["lang_to_id"].items()}
                lang = inv[language_token(lang, gen["lang_to_id"])][2:-2]
        self.language = lang
        if self.vad is not None:                     # fail now, not at the first chunk
            _StreamVad(self.vad)


# -- decoding ---------------------------------------------------------------------------------

@dataclass
class _Request:
    """One decoding a session asks for: its buffer, where it starts, the prompt."""
    samples: np.ndarray
    offset: float                    # seconds of the buffer's first sample
    prompt: str
    last_end: float                  # the end of the last confirmed word (alignment's rule)
    session: object = None


def _norm(word):
    return re.sub(r"[^\w']", "", word.lower())


def _decode(tr, cfg_of, requests):
    """The requests (of one or several sessions) decoded together -> for each, its segments
    [(start, end, [Word])] (seconds of the session). The encoder runs on all the windows at
    once and the decoder on the windows of equal prefix length at once (each window's result
    does not depend on the rest of its batch)."""
    model = tr.model
    gen = model.generation_config
    feats = []
    for r in requests:
        f = log_mel_spectrogram(r.samples, tr.n_mels, padding="longest", truncation=False)
        feats.append(f[:, :tr.n_frames])
    windows = np.zeros((len(requests), tr.n_mels, tr.n_frames), np.float32)
    for i, f in enumerate(feats):
        windows[i, :, :f.shape[1]] = f
    mem = tr._encode(windows)
    cut = model.max_decoder_positions // 2 - 1
    sots, rows = [], []
    for i, r in enumerate(requests):
        cfg = cfg_of(r)
        sot = [tr.sot]
        if tr.is_multilingual:
            lang = cfg.language
            if lang is None:
                lang = r.session._detect(mem[i:i + 1])
            sot += [gen["lang_to_id"][f"<|{lang}|>"], gen["task_to_id"]["transcribe"]]
        sots.append(sot)
        rows.append(_prefix(tr, r.prompt, sot, cut))
    results = _decode_rows(tr, cfg_of, requests, mem, rows)
    redo = [i for i, (toks, avg, cr, _) in enumerate(results)
            if len(rows[i]) > len(sots[i]) and cr > 2.4]
    if redo:                      # looping under the prompt: once more without it
        again = _decode_rows(tr, cfg_of, [requests[i] for i in redo], mem[redo],
                             [sots[i] for i in redo])
        for i, res in zip(redo, again):
            results[i] = res
    out = []
    tb = tr.timestamp_begin
    for i, (r, (tokens, avg, cr, no_speech)) in enumerate(zip(requests, results)):
        if no_speech > 0.6 and avg < -1.0:
            out.append([])                                  # silence
            continue
        frames = feats[i].shape[1]
        pieces, _ = window_segments(tokens, tb, frames, _STRIDE, tail=True)
        segs = [{"tokens": t, "start": r.offset + a * 0.02, "end": r.offset + b * 0.02}
                for t, a, b in pieces]
        lang = cfg_of(r).language or getattr(r.session, "language", None)
        timed, _ = add_word_timestamps(model, segs, mem[i:i + 1], sots[i], tr.tokenizer,
                                       frames, r.offset, language=lang,
                                       last_speech_timestamp=r.last_end,
                                       n_threads=tr.n_threads)
        end = r.offset + r.samples.size / SAMPLE_RATE
        hyp = []
        for a, b, words in timed:
            words = [Word(min(max(w.start, r.offset), end), min(max(w.end, r.offset), end),
                          w.word, w.probability) for w in words if w.word.strip()]
            if words:
                hyp.append((words[0].start, words[-1].end, words))
        out.append(hyp)
    return out


def _prefix(tr, prompt, sot, cut):
    if not prompt or tr.sot_prev is None:
        return list(sot)
    return [tr.sot_prev] + plain_ids(tr.tokenizer, " " + prompt.strip(), tr.eot)[-cut:] + sot


def _decode_rows(tr, cfg_of, requests, mem, rows):
    """[(tokens, avg_logprob, compression_ratio, no_speech_prob)] of windows `mem` decoded
    after `rows`, those of one length and beam count together."""
    groups = collections.defaultdict(list)
    for i, (r, row) in enumerate(zip(requests, rows)):
        groups[len(row), cfg_of(r).num_beams].append(i)
    out = [None] * len(requests)
    for (plen, beams), idx in groups.items():
        decoder = WindowDecoder(tr.model, {"num_beams": beams})
        p, procs = decoder.window(plen)
        res = decoder.decode(mem[idx], np.asarray([rows[i] for i in idx], np.int64), p,
                             procs, scores=True, n_threads=tr.n_threads)
        for i, (tokens, total, no_speech) in zip(idx, res):
            text = tr.tokenizer.decode([int(t) for t in tokens if t < tr.eot])
            out[i] = (tokens, total / (tokens.size + 1), compression_ratio(text.strip()),
                      no_speech)
    return out


# -- the session ------------------------------------------------------------------------------

class LiveSession:
    """A live transcription (see the module's notes; :meth:`Transcriber.live` makes one).

    Options (:data:`LIVE_DEFAULTS`)
    -------------------------------
    min_chunk : float, seconds (1.0)
        Decode after every this much new audio: lower is faster to confirm, more work.
    agreement : int (2)
        LocalAgreement-n: confirm what the last n decodings agree on (1: every decoding's
        words at once, fastest and least stable).
    buffer_trim : float, seconds (15)
        Past this, the buffer is cut at its last confirmed segment or sentence end (it never
        exceeds 30 s: past ~29 s it is cut at the last confirmed word, or, without one, the
        decoding's words before ``buffer_trim`` from its end are confirmed).
    silence_ms : int (700)
        Non-speech that closes an utterance (with a voice-activity detector).
    vad : "silero" (default), "webrtc" or None
        The voice-activity detector (:mod:`fastattn.audio.vad`'s models); None decodes
        everything and closes the utterance only at :meth:`finish`.
    vad_threshold : float (0.5)
        Speech probability that opens an utterance (non-speech: under it less 0.15).
    speech_pad_ms : int (300)
        Audio kept before speech begins and after it ends.
    num_beams : int (5)
        Beam search as the file transcriber's default; 1 (greedy) decodes faster and
        confirms less accurately.
    language : str, optional
        A multilingual model's language (default: detected at the first decoding).
    initial_prompt : str, optional
        Text that prompts the first decodings (names, spelling).
    prompt_chars : int (200)
        The confirmed text that has left the buffer, at most this many characters, prompts
        each decoding.
    match_s : float (1.0)
        Two decodings' words agree when their normalised text is the same and their starts
        are at most this far apart.
    max_utterance_s : float (60)
        An utterance longer than this (speech without a pause, or no detector) is closed at
        the next buffer cut (an :class:`UtteranceEnd`, then a :class:`SpeechStart` where
        there is a detector): the events and the session's state stay bounded.
    catch_up : bool (False)
        False: a decoding at every ``min_chunk`` of audio, however it was chunked (the
        events are the same for any chunking). True: a feed that brings several steps'
        worth decodes once, at the last of them (as far as the window holds the buffer), so
        that a session slower than real time catches up instead of falling further behind;
        the decode points then follow the chunking.
    """

    def __init__(self, transcriber, _cfg=None, **options):
        self._tr = transcriber
        self._cfg = _cfg if _cfg is not None else _Config(transcriber, **options)
        cfg = self._cfg
        self.language = cfg.language
        self._rate = None
        self._resampler = None
        self._vad = _StreamVad(cfg.vad) if cfg.vad else None
        self._fed = 0                          # 16 kHz samples received
        self._done = 0                         # ... processed (a step boundary)
        self._queue = []                       # samples [_done, _fed)
        self._audio = np.zeros(0, np.float32)  # the buffer: samples [_a0, _done)
        self._a0 = 0
        self._finished = False
        # the utterance
        self._open = cfg.vad is None           # without a detector: always open
        self._utt_start = 0
        self._silence_from = None
        self._history = collections.deque(maxlen=max(cfg.agreement - 1, 0))
        self._committed_end = 0.0
        self._utt_words = []                   # confirmed words of this utterance
        self._tail = collections.deque(maxlen=5)   # the last confirmed words
        self._in_buffer = []                   # ... of them still in the buffer
        self._context = cfg.initial_prompt     # confirmed text that left the buffer
        self._partial = None

    def __repr__(self):
        return f"LiveSession({self._fed / SAMPLE_RATE:.1f} s fed)"

    @property
    def seconds(self):
        """Seconds of audio fed so far (at 16 kHz)."""
        return self._fed / SAMPLE_RATE

    # -- input ----------------------------------------------------------------------------

    def push(self, samples, sample_rate=SAMPLE_RATE):
        """Queue a chunk without decoding (a :class:`LiveGroup` decodes it): `samples` 1-D
        float32 (or float16/64, int16, or bytes of 16-bit little-endian PCM) at
        `sample_rate` Hz (the first chunk's rate holds for the session; another rate is
        resampled to 16 kHz)."""
        if self._finished:
            raise ValueError("samples: this live session is finished")
        x = _as_samples(samples, sample_rate)
        if self._rate is None:
            self._rate = int(sample_rate)
            if self._rate != SAMPLE_RATE:
                self._resampler = _Resampler(self._rate)
        elif sample_rate != self._rate:
            raise ValueError(f"sample_rate changed from {self._rate} to {sample_rate} within "
                             "the session")
        if self._resampler is not None:
            x = self._resampler.push(x)
        if x.size:
            self._queue.append(x)
            self._fed += x.size

    def feed(self, samples, sample_rate=SAMPLE_RATE):
        """Take a chunk and return the events it brings ([] until a step's worth of audio
        is in): a list of :class:`SpeechStart`, :class:`Partial`, :class:`Confirmed`,
        :class:`UtteranceEnd`."""
        self.push(samples, sample_rate)
        return self._run_alone()

    def finish(self):
        """The end of the audio: the rest decoded, the open utterance confirmed whole and
        closed. Returns the last events; the session takes no more audio."""
        if self._finished:
            return []
        if self._resampler is not None:
            x = self._resampler.push(np.zeros(0, np.float32), flush=True)
            if x.size:
                self._queue.append(x)
                self._fed += x.size
        events = self.commit()
        self._finished = True
        return events

    def commit(self):
        """Close the utterance now (the audio so far decoded, the open utterance confirmed
        whole: an :class:`UtteranceEnd`), without waiting for a pause; the session goes on
        (the next decode points count from here). Returns the events."""
        if self._finished:
            return []
        events = self._run_alone()
        return events + _drive(self._tr, [(self, self._steps(self._fed, final=True))])[self]

    def clear(self):
        """Drop the audio not yet confirmed and the utterance in progress (no events)."""
        if self._finished:
            return
        self._queue, self._done = [], self._fed
        self._audio, self._a0 = np.zeros(0, np.float32), self._fed
        self._in_buffer, self._utt_words = [], []
        self._tail.clear()
        self._history.clear()
        self._partial, self._silence_from = None, None
        self._open = self._cfg.vad is None
        self._utt_start = self._fed
        if self._vad is not None:                  # the detector starts afresh here
            self._vad = _StreamVad(self._cfg.vad)
            self._vad.pos = self._fed

    def _run_alone(self):
        out = []
        while self.due():
            out += _drive(self._tr, [(self, self._step())])[self]
        return out

    def due(self):
        """Whether a step's worth of audio waits to be decoded."""
        return not self._finished and self._fed >= self._done + self._cfg.step

    def _step(self):
        """The next decode point: one step on, or (catch_up) the last whole step that has
        arrived, as far as the model's window holds the buffer."""
        cfg, n = self._cfg, 1
        if cfg.catch_up:
            room = cfg.window - cfg.step // 10 - self._audio.size
            n = max(1, min((self._fed - self._done) // cfg.step, room // cfg.step))
        return self._steps(self._done + n * cfg.step)

    def _take(self, end):
        """The queued samples up to absolute sample `end`, appended to the buffer."""
        need = end - self._done
        parts, got = [], 0
        while got < need:
            q = self._queue[0]
            k = min(q.size, need - got)
            parts.append(q[:k])
            got += k
            if k == q.size:
                self._queue.pop(0)
            else:
                self._queue[0] = q[k:]
        new = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        self._audio = np.concatenate([self._audio, new])
        self._done = end
        return new

    def _cut(self, at):
        """Drop the buffer's samples before absolute sample `at`."""
        at = min(max(at, self._a0), self._done)
        self._audio = self._audio[at - self._a0:].copy()
        self._a0 = at

    def _detect(self, mem):
        if self.language is None:
            self.language = self._tr._language_probs(mem)[0][0]
        return self.language

    # -- one step: a generator that yields _Requests and gets their hypotheses -----------

    def _steps(self, end, final=False):
        cfg, events = self._cfg, []
        new = self._take(end) if end > self._done else np.zeros(0, np.float32)
        if self._vad is not None:
            first, probs = self._vad.push(new)
            neg = max(cfg.threshold - 0.15, 0.01)
            for k, p in enumerate(probs):
                f0 = first + k * self._vad.frame
                f1 = f0 + self._vad.frame
                if p >= cfg.threshold:
                    self._silence_from = None
                    if not self._open:
                        self._open = True
                        self._utt_start = f0
                        self._cut(f0 - cfg.pad)
                        events.append(SpeechStart(round(f0 / SAMPLE_RATE, 3)))
                elif p < neg and self._open:
                    if self._silence_from is None:
                        self._silence_from = f0
                    if f1 - self._silence_from >= cfg.silence:
                        stop = self._silence_from + cfg.pad
                        events += yield from self._close(stop, self._silence_from)
            if not self._open:
                self._cut(self._done - cfg.pad)            # silence: keep a lead-in only
        if self._open:
            if final:
                stop = self._done if self._silence_from is None else \
                    min(self._done, self._silence_from + cfg.pad)
                events += yield from self._close(stop, stop if self._silence_from is None
                                                 else self._silence_from)
            elif self._done - max(self._a0, self._utt_start) >= cfg.step // 2:
                events += yield from self._advance()
        return events

    def _request(self, stop=None):
        stop = self._done if stop is None else stop
        samples = self._audio[:max(stop - self._a0, 0)]
        prompt = self._context[-self._cfg.prompt_chars:] if self._cfg.prompt_chars else ""
        return _Request(samples, self._a0 / SAMPLE_RATE, prompt, self._committed_end, self)

    def _fresh(self, hyp):
        """A decoding's words not yet confirmed (whisper_streaming's rule: those starting
        after the last confirmed end, less a repeat of the last confirmed words)."""
        words = [w for _, _, ws in hyp for w in ws if w.start > self._committed_end - 0.1]
        if words and self._tail and abs(words[0].start - self._committed_end) < 1.0:
            tail = [_norm(w.word) for w in self._tail]
            for n in range(min(len(tail), len(words), 5), 0, -1):
                if tail[-n:] == [_norm(w.word) for w in words[:n]]:
                    words = words[n:]
                    break
        return words

    def _confirm(self, words):
        if not words:
            return []
        self._committed_end = words[-1].end
        self._utt_words += words
        self._tail.extend(words)
        self._in_buffer += words
        return [Confirmed(tuple(words), "".join(w.word for w in words))]

    def _advance(self):
        """Decode the buffer, confirm what the last decodings agree on, trim the buffer."""
        cfg = self._cfg
        if self._done - self._a0 < 400:
            return []
        hyp = yield self._request()
        fresh = self._fresh(hyp)
        if cfg.agreement == 1:
            agreed = fresh
        elif len(self._history) < cfg.agreement - 1:
            agreed = []
        else:
            others = [self._fresh(h) for h in self._history]
            n = 0
            while n < len(fresh) and all(
                    n < len(o) and _norm(o[n].word) == _norm(fresh[n].word) and
                    abs(o[n].start - fresh[n].start) <= cfg.match_s for o in others):
                n += 1
            agreed = fresh[:n]
        events = self._confirm(agreed)
        if cfg.agreement > 1:
            self._history.append(hyp)
        rest = fresh[len(agreed):]
        text = ("".join(w.word for w in self._utt_words + rest)).strip()
        if text and text != self._partial:
            self._partial = text
            events.append(Partial(text))
        events += self._trim(hyp)
        return events

    def _trim(self, hyp):
        """Cut the buffer at the last confirmed segment / sentence end once it passes
        buffer_trim; keep it under 30 s whatever it takes."""
        cfg = self._cfg
        length = (self._done - self._a0) / SAMPLE_RATE
        events = []
        if length <= cfg.buffer_trim:
            return events
        limit = self._committed_end + 0.005
        ends = [e for _, e, _ in hyp if e <= limit]
        ends += [w.end for w in self._in_buffer if w.word.rstrip().endswith((".", "?", "!"))]
        ends = [e for e in ends if e > self._a0 / SAMPLE_RATE]
        cut = max(ends) if ends else None
        now = self._done / SAMPLE_RATE
        if length > cfg.max_buffer and (cut is None or now - cut > cfg.max_buffer):
            if self._a0 / SAMPLE_RATE < self._committed_end >= now - cfg.max_buffer:
                cut = self._committed_end
            else:                    # nothing confirmed for ~30 s: confirm the older part
                cut = now - cfg.buffer_trim
                events += self._confirm([w for w in self._fresh(hyp) if w.end <= cut])
        if cut is not None:
            gone = [w for w in self._in_buffer if w.end <= cut + 0.005]
            self._in_buffer = self._in_buffer[len(gone):]
            self._add_context(gone)
            self._cut(int(round(cut * SAMPLE_RATE)))
            self._history.clear()          # their times are those of another buffer
            if cut - self._utt_start / SAMPLE_RATE > cfg.max_utterance:
                events += self._split(cut)
        return events

    def _split(self, cut):
        """A long utterance closed with its confirmed words at a buffer cut (seconds); the
        next one opens after them."""
        done, self._utt_words = self._utt_words, []
        start = self._utt_start / SAMPLE_RATE
        if self._cfg.vad is None and done:
            start = done[0].start
        end = max(cut, self._committed_end)              # all its confirmed words
        events = [UtteranceEnd("".join(w.word for w in done).strip(), round(start, 3),
                               round(end, 3))]
        self._utt_start = int(round(end * SAMPLE_RATE))
        self._partial = None
        if self._cfg.vad is not None:
            events.append(SpeechStart(round(cut, 3)))
        return events

    def _add_context(self, words):
        if words:
            self._context = (self._context + "".join(w.word for w in words))[-2000:]

    def _close(self, stop, speech_end):
        """The utterance ends at absolute sample `stop`: its last decoding confirmed whole."""
        events = []
        if stop - self._a0 >= 400:
            hyp = yield self._request(stop)
            events += self._confirm(self._fresh(hyp))
        text = "".join(w.word for w in self._utt_words).strip()
        start = self._utt_start / SAMPLE_RATE
        if self._cfg.vad is None and self._utt_words:
            start = self._utt_words[0].start
        if self._cfg.vad is not None or self._utt_words:
            events.append(UtteranceEnd(text, round(start, 3),
                                       round(max(speech_end, self._utt_start) / SAMPLE_RATE,
                                             3)))
        self._add_context(self._in_buffer)
        self._in_buffer, self._utt_words = [], []
        self._tail.clear()
        self._history.clear()
        self._partial = None
        self._silence_from = None
        self._open = self._cfg.vad is None
        self._utt_start = stop
        self._cut(stop)
        return events


def _drive(tr, steps, on_batch=None):
    """Run step generators [(session, generator)] to their ends, each round's requests
    decoded as one batch (its size passed to `on_batch`) -> {session: events}."""
    out = {s: [] for s, _ in steps}
    live = []
    for s, g in steps:
        try:
            live.append((s, g, next(g)))
        except StopIteration as stop:
            out[s] += stop.value
    while live:
        if on_batch is not None:
            on_batch(len(live))
        hyps = _decode(tr, lambda r: r.session._cfg, [req for _, _, req in live])
        nxt = []
        for (s, g, _), h in zip(live, hyps):
            try:
                nxt.append((s, g, g.send(h)))
            except StopIteration as stop:
                out[s] += stop.value
        live = nxt
    return out


class LiveGroup:
    """Live sessions stepped together (:meth:`Transcriber.live_batch`): :meth:`session` opens
    one (options as :class:`LiveSession`'s, the group's by default), ``session.push(...)``
    queues its audio, :meth:`run` decodes every session's due steps, the sessions' decodings
    of a round as one batch, and returns ``{session: events}``. Each session's events are
    bitwise those it gives alone (:meth:`LiveSession.feed`)."""

    def __init__(self, transcriber, **options):
        self._tr = transcriber
        self._options = options
        _Config(transcriber, **options)
        self.sessions = []

    def session(self, **options):
        s = LiveSession(self._tr, **dict(self._options, **options))
        self.sessions.append(s)
        return s

    def close(self, session):
        """Take `session` out of the group (after its :meth:`~LiveSession.finish`)."""
        self.sessions = [s for s in self.sessions if s is not session]

    def run(self, sessions=None, on_batch=None):
        """Decode all due steps of `sessions` (default: the group's) -> {session: events}.
        on_batch(n): called with the number of decodings of each batch."""
        sessions = list(self.sessions if sessions is None else sessions)
        out = {s: [] for s in sessions}
        while True:
            due = [s for s in sessions if s.due()]
            if not due:
                return out
            for s, ev in _drive(self._tr, [(s, s._step()) for s in due], on_batch).items():
                out[s] += ev


def transcription(events, duration, language="en", max_segment_s=12.0):
    """A :class:`~fastattn.audio.Transcription` of a live session's events (what
    :func:`~fastattn.audio.write_transcript` writes: SRT / VTT / JSON): its confirmed words,
    one segment per sentence (cut at sentence ends, at utterance ends and before
    `max_segment_s`), with their words."""
    from ._longform import Segment, Transcription
    segments, cur = [], []

    def close():
        if cur:
            text = "".join(w.word for w in cur)
            segments.append(Segment(id=len(segments), seek=0, start=cur[0].start,
                                    end=cur[-1].end, text=text, tokens=[], temperature=0.0,
                                    avg_logprob=0.0, compression_ratio=compression_ratio(text),
                                    no_speech_prob=0.0, words=list(cur)))
            cur.clear()

    for e in events:
        if isinstance(e, Confirmed):
            for w in e.words:
                if cur and w.end - cur[0].start > max_segment_s:
                    close()
                cur.append(w)
                if w.word.rstrip().endswith((".", "?", "!")):
                    close()
        elif isinstance(e, UtteranceEnd):
            close()
    close()
    return Transcription(text="".join(s.text for s in segments), segments=segments,
                         language=language, language_probability=1.0, duration=duration)
