"""Random encoder-decoder checkpoints of every family, written by transformers' save_pretrained.

Weights at unit scale so that decoding varies (matrices N(0, 1/fan_in), LayerNorm weights
1 + N(0, 0.09), biases N(0, 0.04), embeddings N(0, 1)), an EOS bias in the final logits bias
(where the family has one) so that rows end at different lengths. Tiny shapes: tests run in
seconds.
"""
import numpy as np

VOCAB = 80
SMALL = dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
             encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
             decoder_ffn_dim=48, max_position_embeddings=64)
# special ids per family: transformers' conventions
IDS = {
    "marian": dict(pad_token_id=VOCAB - 1, eos_token_id=0, decoder_start_token_id=VOCAB - 1),
    "bart": dict(pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                 forced_eos_token_id=2),
    "mbart": dict(pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                  forced_eos_token_id=2),
    "pegasus": dict(pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                    forced_eos_token_id=1),
    "m2m_100": dict(pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2),
    "t5": dict(pad_token_id=0, eos_token_id=1, decoder_start_token_id=0),
    "mt5": dict(pad_token_id=0, eos_token_id=1, decoder_start_token_id=0),
}
# T5's names for the sizes; d_kv * num_heads != d_model, as in T5 v1.1
T5_SMALL = dict(vocab_size=VOCAB, d_model=32, d_kv=12, d_ff=40, num_layers=2,
                num_decoder_layers=2, num_heads=4, relative_attention_num_buckets=8,
                relative_attention_max_distance=20)


def randomise(model, eos_id, seed=0, eos_bias=1.0):
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name and p.ndim == 2 and not p.requires_grad:
                continue                          # fixed sinusoids
            if p.ndim == 2 and "embed" not in name and "shared" not in name:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
            elif ("layer_norm" in name or "layernorm" in name) and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            elif p.ndim == 1:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g))
        if hasattr(model, "final_logits_bias"):
            fb = torch.randn(model.final_logits_bias.shape, generator=g)
            fb[0, eos_id] += eos_bias
            model.final_logits_bias.copy_(fb)
    return model


def make_checkpoint(path, model_type, *, tied=True, dtype="float32", seed=0, **overrides):
    """Write a random `model_type` encoder-decoder to `path`; returns the torch model (eval)."""
    import torch
    from transformers import AutoConfig, AutoModelForSeq2SeqLM, GenerationConfig
    t5 = model_type in ("t5", "mt5")
    kw = dict(T5_SMALL if t5 else SMALL, **IDS[model_type], tie_word_embeddings=tied)
    kw.update(overrides)
    cfg = AutoConfig.for_model(model_type, **kw)
    torch.manual_seed(seed)
    model = AutoModelForSeq2SeqLM.from_config(cfg).eval()
    if t5 and not tied:
        # transformers ties T5's head to the shared embedding: give it weights of its own
        # (T5 v1.1 / flan-T5 / mT5 checkpoints save a different lm_head.weight)
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    randomise(model, kw["eos_token_id"], seed)
    model.save_pretrained(path)
    gen = {k: kw[k] for k in ("decoder_start_token_id", "eos_token_id", "pad_token_id",
                              "forced_eos_token_id", "bos_token_id") if k in kw}
    GenerationConfig(**gen).save_pretrained(path)
    if dtype == "float64":
        model = model.double()
    return model


def padded_sources(model_type, rng, lengths, vocab=VOCAB):
    """Random source rows of the given lengths ending in EOS, right-padded with the pad id."""
    ids = IDS[model_type]
    pad, eos = ids["pad_token_id"], ids["eos_token_id"]
    special = {pad, eos, ids.get("bos_token_id"), ids["decoder_start_token_id"]}
    normal = np.array([t for t in range(vocab) if t not in special])
    S = max(lengths)
    out = np.full((len(lengths), S), pad, np.int64)
    mask = np.zeros((len(lengths), S), np.int64)
    for i, n in enumerate(lengths):
        out[i, :n - 1] = rng.choice(normal, n - 1)
        out[i, n - 1] = eos
        mask[i, :n] = 1
    return out, mask
