"""``ctranslate2.models`` over fastattn: ``Whisper`` (a faster-whisper / CTranslate2 Whisper
folder, :class:`fastattn.WhisperModel` and :class:`fastattn.generation.whisper.WindowDecoder`)
and ``WhisperGenerationResult``.

``generate(features, prompts)`` decodes each 30 s window after its prompt (token strings or ids:
``<|startoftranscript|>``, a language, a task, ``<|notimestamps|>``, a ``<|startofprev|>``
text before them) with CTranslate2's rules as fastattn implements them for transformers: the
timestamp rules when the prompt has no ``<|notimestamps|>``, the folder's suppress lists
(``suppress_tokens=[-1]``; ``suppress_blank`` the begin-suppress list), greedy or beam search
(CTranslate2's rule: :mod:`fastattn.generation.beam_ct2`), at most ``max_length / 2`` new
tokens.
``sequences`` / ``sequences_ids`` are the generated tokens without the prompt and EOS;
``scores`` (``return_scores``) CTranslate2's: the tokens' log-probabilities (EOS included)
summed and divided by ``len(tokens) ** length_penalty``; ``no_speech_prob`` the probability of
``<|nospeech|>`` at ``<|startoftranscript|>``. ``detect_language`` returns each clip's
(language token, probability) pairs, best first (a RuntimeError for an English-only model, as
CTranslate2's); ``encode`` the encoder output (NumPy float32, CTranslate2 a StorageView).

Refused by a ValueError naming it: ``num_hypotheses`` > 1, ``patience`` != 1,
``return_logits_vocab``, sampling (``sampling_topk`` != 1), ``max_initial_timestamp_index``
other than the folder's, ``asynchronous``, ``align`` (an AttributeError).
"""
import numpy as np

from ..generation.whisper import WindowDecoder
from ..models import WhisperModel
from ._ct2_common import LoadedModel, Vocabulary, _Result, check_options

__all__ = ["Whisper", "WhisperGenerationResult"]


class WhisperGenerationResult(_Result):
    """``sequences`` (token lists), ``sequences_ids`` (id lists), ``scores`` ([] without
    return_scores), ``no_speech_prob`` (0 without return_no_speech_prob), ``logits`` ([])."""
    _fields = ("sequences", "sequences_ids", "scores", "no_speech_prob", "logits")


_REFUSED = {
    "asynchronous": (False, "decoding runs in the calling thread"),
    "patience": (1, "beam search stops when beam_size hypotheses have finished"),
    "num_hypotheses": (1, "one hypothesis per clip"),
    "return_logits_vocab": (False, "the logits are not kept"),
    "sampling_topk": (1, "Whisper's sampling is the temperature fallback of "
                         "fastattn.audio.Transcriber"),
}


class Whisper(LoadedModel):
    """A CTranslate2 Whisper folder (faster-whisper's models) over
    :class:`fastattn.WhisperModel`."""

    _loads = WhisperModel

    def _setup(self):
        self._vocab = Vocabulary(self.model_path, "vocabulary", None)
        self.num_workers = self._inter_threads

    @property
    def is_multilingual(self):
        return bool(self.model.generation_config.get("is_multilingual"))

    @property
    def n_mels(self):
        return int(self.model.config["num_mel_bins"])

    @property
    def num_languages(self):
        return len(self.model.languages)

    def _features(self, features):
        f = np.asarray(features, np.float32)
        if f.ndim != 3:
            raise ValueError(f"features must be (batch, n_mels, frames), got shape {f.shape}")
        return f

    def _memory(self, features):
        """Encoder output (B, S, d): from features, or features already encoded."""
        f = self._features(features)
        d, S = self.model.d_model, self.model.config["max_source_positions"]
        if f.shape[1:] == (S, d):
            return f
        return np.asarray(self.model.encode(self.model._padded(f), n_threads=self._threads),
                          np.float32)

    def encode(self, features, to_cpu=False):
        """The encoder output (B, 1500, d_model), a NumPy float32 array."""
        f = self._features(features)
        return np.asarray(self.model.encode(self.model._padded(f), n_threads=self._threads),
                          np.float32)

    def detect_language(self, features):
        """For each clip, [(language token, probability)] best first."""
        if not self.is_multilingual:
            raise RuntimeError("detect_language: this model is not multilingual")
        _, probs = self.model.detect_language(encoder_output=self._memory(features),
                                              return_probs=True, n_threads=self._threads)
        langs = self.model.languages
        return [sorted(zip(langs, map(float, row)), key=lambda x: -x[1]) for row in probs]

    def _forced(self, row):
        """How many of a prompt's last tokens are a transcript prefix: those after the start
        sequence (<|startoftranscript|>, then language, task and <|notimestamps|> tokens), which
        CTranslate2 forces and returns at the head of the result."""
        gen = self.model.generation_config
        sot = gen["decoder_start_token_id"]
        if sot not in row:
            raise ValueError("prompts: a prompt without <|startoftranscript|>")
        k = len(row) - 1 - row[::-1].index(sot)
        special = set((gen.get("lang_to_id") or {}).values()) | \
            set((gen.get("task_to_id") or {}).values()) | {gen.get("no_timestamps_token_id")}
        k += 1
        while k < len(row) and row[k] in special:
            k += 1
        return len(row) - k

    def generate(self, features, prompts, *, asynchronous=False, beam_size=5, patience=1,
                 num_hypotheses=1, length_penalty=1, repetition_penalty=1,
                 no_repeat_ngram_size=0, max_length=448, return_scores=False,
                 return_logits_vocab=False, return_no_speech_prob=False,
                 max_initial_timestamp_index=50, suppress_blank=True, suppress_tokens=(-1,),
                 sampling_topk=1, sampling_temperature=1):
        """Decode each clip after its prompt -> [WhisperGenerationResult] (the module's
        docstring)."""
        check_options("generate", locals(), _REFUSED)
        gen = self.model.generation_config
        if isinstance(max_initial_timestamp_index, bool) or not isinstance(
                max_initial_timestamp_index, (int, np.integer)) or \
                max_initial_timestamp_index < 0:
            raise ValueError(f"max_initial_timestamp_index must be an integer >= 0, got "
                             f"{max_initial_timestamp_index!r}")
        if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)) or \
                max_length < 1:
            raise ValueError(f"max_length must be an integer >= 1, got {max_length!r}")
        memory = self._memory(features)
        rows = [self._vocab.ids(p, "prompts") for p in prompts]
        if len(rows) != memory.shape[0]:
            raise ValueError(f"prompts has {len(rows)} rows, features {memory.shape[0]}")
        sup = list(suppress_tokens or [])
        if -1 in sup:
            sup = sorted(set(gen.get("suppress_tokens") or []) | {t for t in sup if t != -1})
        settings = dict(num_beams=int(beam_size), length_penalty=float(length_penalty),
                        repetition_penalty=float(repetition_penalty),
                        no_repeat_ngram_size=int(no_repeat_ngram_size), suppress_tokens=sup,
                        beam_rule="ctranslate2",
                        max_initial_timestamp_index=int(max_initial_timestamp_index))
        if not suppress_blank:
            settings["begin_suppress_tokens"] = None
        notimestamps = gen.get("no_timestamps_token_id")
        limit = self.model.max_decoder_positions
        out = [None] * len(rows)
        groups = {}
        for i, r in enumerate(rows):
            groups.setdefault((len(r), notimestamps in r, self._forced(r)), []).append(i)
        want = bool(return_scores or return_no_speech_prob)
        for (P, no_stamps, forced), idx in groups.items():
            if P >= limit:
                raise ValueError(f"a prompt of {P} tokens leaves no room below "
                                 f"max_target_positions={limit}")
            # CTranslate2 decodes at most max_length / 2 tokens after the prompt's last one
            # (and max_length positions in all)
            dec = WindowDecoder(self.model, dict(settings, max_new_tokens=int(max(1, min(
                max_length // 2, max_length - P + 1, limit - P)))), timestamps=not no_stamps)
            p, procs = dec.window(P, P - forced)
            res = dec.decode(memory[idx], np.array([rows[i] for i in idx], np.int64), p, procs,
                             scores=want, n_threads=self._threads, begin=P - forced)
            for i, r in zip(idx, res):
                ids = [int(t) for t in r.tokens]
                scores = []
                if return_scores:
                    scores = [r.sum_logprob / max(len(ids), 1) ** float(length_penalty)]
                out[i] = WhisperGenerationResult(
                    sequences=[self._vocab.to_tokens(ids)], sequences_ids=[ids],
                    scores=scores, logits=[],
                    no_speech_prob=float(r.no_speech_prob) if return_no_speech_prob else 0.0)
        return out
