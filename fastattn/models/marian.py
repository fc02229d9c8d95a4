"""Hugging Face Marian checkpoints (OPUS-MT): a BART-style family (:mod:`.bart`) with Marian's
differences.

What ``modeling_marian.py`` computes, against BART: post-norm layers, no final layer norm and
no embedding layer norm; sinusoidal positions with the sines in the first half of the vector and
the cosines in the second (not interleaved), rounded to float32 whatever the model dtype
(transformers builds the table with ``torch.FloatTensor``); token embeddings times sqrt(d_model)
when ``scale_embedding``; encoder and decoder embeddings shared or not
(``share_encoder_decoder_embeddings``, then ``decoder_vocab_size``); decoding starts from
``decoder_start_token_id`` (= the pad id); ``forced_eos_token_id`` and ``bad_words_ids = [[pad]]``
usually come with the checkpoint's generation config.
"""
from .._validation import check_positive_int
from .bart import BartFamily

__all__ = ["MarianFamily", "MARIAN"]


class MarianFamily(BartFamily):
    model_type = "marian"
    title = "Marian / OPUS-MT"
    tokenizer = "marian"              # source.spm, target.spm, vocab.json
    # against BART: no embedding norm, Marian's sinusoids (the old fields say so)
    architecture = dict(BartFamily.architecture, layernorm_embedding=False, positions="marian",
                        position_offset=0)
    fixed = dict(BartFamily.fixed, normalize_embedding=False, static_position_embeddings=True)
    defaults = dict(BartFamily.defaults, vocab_size=58101, pad_token_id=58100, eos_token_id=0,
                    decoder_start_token_id=58100, bos_token_id=None)
    extra_fields = ("share_encoder_decoder_embeddings", "decoder_vocab_size")
    start_fallback = "pad_token_id"       # no decoder_start_token_id: start from pad

    def adjust(self, raw, config, where):
        shared = raw.get("share_encoder_decoder_embeddings", True)
        if not isinstance(shared, bool):
            raise ValueError(f"{where}: share_encoder_decoder_embeddings must be true or false, "
                             f"got {shared!r}")
        dv = raw.get("decoder_vocab_size")
        if dv is not None:
            check_positive_int(dv, f"{where}: decoder_vocab_size")
        config["share_encoder_decoder_embeddings"] = shared
        config["decoder_vocab_size"] = config["vocab_size"] if shared else (dv or config["vocab_size"])
        return config


MARIAN = MarianFamily()
