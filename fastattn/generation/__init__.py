"""Autoregressive decoding: KV cache, logits processors, greedy / beam / sampling search,
forced-decoding scores."""
from .kv_cache import KVCache
from .processors import build_processors
from .search import Decoder, DecoderState, beam_search, generate, greedy_search, score

__all__ = ["KVCache", "Decoder", "DecoderState", "build_processors", "generate", "greedy_search",
           "beam_search", "score"]
