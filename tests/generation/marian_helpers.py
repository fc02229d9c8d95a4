"""Random Marian checkpoints written with transformers, for the parity tests.

Every weight, bias, LayerNorm and the final logits bias is random: matrices N(0, 1/fan_in) so
activations stay at unit scale, embeddings and the final logits bias N(0, 1), biases N(0, 0.04),
LayerNorm weights 1 + N(0, 0.09) (larger biases make every input decode to the same token); EOS
gets a bias so that rows end at different lengths. Tiny shapes: the tests run in seconds.
"""

import numpy as np

PAD = 63        # pad = decoder start = vocab - 1 (CTranslate2's convention too)
EOS = 0
VOCAB = 64


def make_checkpoint(path, *, d_model=32, layers=2, heads=4, ffn=64, vocab=VOCAB,
                    activation="relu", tied=True, shared=True, scale_embedding=True,
                    eos_bias=1.5, emb_std=1.0, gain=1.0, seed=0, generation=None, max_position_embeddings=128,
                    dtype="float32"):
    """Write a random MarianMTModel to `path`; returns the torch model (eval mode)."""
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    cfg = MarianConfig(
        vocab_size=vocab, decoder_vocab_size=vocab, d_model=d_model, encoder_layers=layers,
        decoder_layers=layers, encoder_attention_heads=heads, decoder_attention_heads=heads,
        encoder_ffn_dim=ffn, decoder_ffn_dim=ffn, max_position_embeddings=max_position_embeddings,
        pad_token_id=vocab - 1, decoder_start_token_id=vocab - 1, eos_token_id=EOS,
        forced_eos_token_id=EOS, activation_function=activation, scale_embedding=scale_embedding,
        share_encoder_decoder_embeddings=shared, tie_word_embeddings=tied)
    torch.manual_seed(seed)
    model = MarianMTModel(cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name:       # the fixed sinusoid table (not saved)
                continue
            if p.ndim == 2 and "embed" not in name and "shared" not in name:
                p.copy_(gain * torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
            elif "layer_norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            elif p.ndim == 1:                   # biases: small enough not to drown the input
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            else:                               # token embeddings
                p.copy_(emb_std * torch.randn(p.shape, generator=g))
        fb = torch.randn(model.final_logits_bias.shape, generator=g)
        fb[0, EOS] += eos_bias
        model.final_logits_bias.copy_(fb)
    model.save_pretrained(path)
    gen = {"decoder_start_token_id": vocab - 1, "eos_token_id": EOS, "pad_token_id": vocab - 1,
           "forced_eos_token_id": EOS}
    if generation:
        gen.update(generation)
    GenerationConfig(**gen).save_pretrained(path)
    if dtype == "float64":
        model = model.double()
    return model


def marian_like_generation(vocab=VOCAB, max_length=24, num_beams=4):
    """What OPUS-MT checkpoints ship in generation_config.json (scaled down)."""
    return {"bad_words_ids": [[vocab - 1]], "bos_token_id": 0, "max_length": max_length,
            "num_beams": num_beams, "renormalize_logits": True}


def sources(rng, batch=4, length=10, vocab=VOCAB, pad_rows=True):
    """Random source ids (B, S) without pad / EOS inside, some rows right-padded, EOS ended."""
    ids = rng.integers(1, vocab - 1, size=(batch, length))
    mask = np.ones_like(ids)
    for b in range(batch):
        n = length - (b * 3 % (length // 2)) if pad_rows else length
        ids[b, n - 1] = EOS
        ids[b, n:] = vocab - 1
        mask[b, n:] = 0
    return ids, mask


def hf_generate(model, ids, mask=None, **kw):
    import torch
    t = torch.as_tensor(ids)
    m = None if mask is None else torch.as_tensor(mask)
    with torch.no_grad():
        out = model.generate(input_ids=t, attention_mask=m, **kw)
    return out.numpy()


def small_model(**kw):
    """A tiny Seq2SeqTransformer built in code (random weights, seed 5); keywords override."""
    import fastattn
    cfg = dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
               encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
               decoder_ffn_dim=64, max_position_embeddings=64, seed=5)
    cfg.update(kw)
    return fastattn.Seq2SeqTransformer(**cfg)
