"""Peers' APIs over fastattn: a user's script runs after changing only its import.

Each peer has one module, imported by its name (nothing is imported here, so that importing one
adapter costs nothing of the others):

- :mod:`fastattn.compat.sentence_transformers`: ``SentenceTransformer(folder).encode(...)``
  over :class:`fastattn.SentenceEncoder`.
- :mod:`fastattn.compat.faster_whisper`: ``WhisperModel(folder).transcribe(...)`` and
  ``BatchedInferencePipeline`` over :class:`fastattn.Transcriber`.
- :mod:`fastattn.compat.ctranslate2`: ``Translator``, ``Encoder`` and ``models.Whisper`` on
  CTranslate2 folders, over :class:`fastattn.Seq2SeqTransformer`, :class:`fastattn.EncoderModel`
  and :class:`fastattn.WhisperModel`.

An adapter is thin: it maps the peer's names and return types onto the one implementation, and
an option of the peer that fastattn cannot honour is a ValueError / TypeError naming it, never a
silently different result.
"""
