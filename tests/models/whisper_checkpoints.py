"""Random tiny Whisper checkpoints written by transformers' save_pretrained.

A small vocabulary laid out as Whisper's (text tokens, then <|endoftext|>, <|startoftranscript|>,
the languages, <|translate|>, <|transcribe|>, <|startoflm|>, <|startofprev|>, <|nospeech|>,
<|notimestamps|>, then the timestamps <|0.00|> ...), and a generation_config.json shaped as the
real ones (openai/whisper-tiny for the multilingual variant, whisper-tiny.en for the English-only
one): lang_to_id, task_to_id, no_timestamps_token_id, forced_decoder_ids, suppress_tokens,
begin_suppress_tokens, max_initial_timestamp_index, prev_sot_token_id ...

Weights at unit scale so that decoding varies (see seq2seq_checkpoints.randomise); the encoder's
sinusoidal position table is kept as transformers makes it. Tiny shapes (d_model 64, 2 + 2
layers, 4 heads) and a short source (max_source_positions 150: 300 mel frames) so that tests run
in seconds; one test uses the real 3000-frame input.
"""
import json
import os

import numpy as np

from seq2seq_checkpoints import randomise

TEXT = 120                      # text tokens 0 .. 119
EOT = TEXT                      # <|endoftext|>
SOT = TEXT + 1                  # <|startoftranscript|>
LANGS = ["en", "zh", "de", "es", "fr"]
LANG_IDS = {f"<|{code}|>": SOT + 1 + i for i, code in enumerate(LANGS)}
TRANSLATE = SOT + 1 + len(LANGS)
TRANSCRIBE = TRANSLATE + 1
STARTOFLM = TRANSCRIBE + 1
STARTOFPREV = STARTOFLM + 1
NOSPEECH = STARTOFPREV + 1
NOTIMESTAMPS = NOSPEECH + 1
N_TIMESTAMPS = 151              # <|0.00|> .. <|3.00|>
VOCAB = NOTIMESTAMPS + 1 + N_TIMESTAMPS
BLANK = 7                       # " " (begin_suppress_tokens, as 220 in the real vocabulary)

SMALL = dict(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2,
             encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=96,
             decoder_ffn_dim=96, num_mel_bins=80, max_source_positions=150,
             max_target_positions=64)


def generation_config(multilingual=True):
    """A generation_config.json dict shaped as openai/whisper-tiny's (or tiny.en's)."""
    g = {
        "begin_suppress_tokens": [BLANK, EOT],
        "bos_token_id": EOT,
        "decoder_start_token_id": SOT,
        "eos_token_id": EOT,
        "pad_token_id": EOT,
        "max_initial_timestamp_index": 50,
        "max_length": 64,
        "no_timestamps_token_id": NOTIMESTAMPS,
        "prev_sot_token_id": STARTOFPREV,
        "return_timestamps": False,
        "suppress_tokens": [1, 2, 9, 11, 30, 31, 58, TRANSLATE, TRANSCRIBE, STARTOFLM,
                            STARTOFPREV, NOSPEECH],
        "alignment_heads": [[1, 0], [1, 2]],
        "is_multilingual": multilingual,
        "transformers_version": "4.31.0.dev0",
    }
    if multilingual:
        g["lang_to_id"] = dict(LANG_IDS)
        g["task_to_id"] = {"transcribe": TRANSCRIBE, "translate": TRANSLATE}
        g["forced_decoder_ids"] = [[1, None], [2, TRANSCRIBE]]
    else:
        g["forced_decoder_ids"] = [[1, NOTIMESTAMPS]]
    return g


def make_checkpoint(path, *, multilingual=True, seed=0, dtype="float32", generation=None,
                    **overrides):
    """Write a random Whisper to `path` (float32 safetensors unless `dtype`); returns the
    config keywords. On top of seq2seq_checkpoints.randomise, so that clips decode differently
    (languages detected, lengths, timestamp pairs): sharper and stronger cross-attention (its
    q_proj and out_proj x 3), token embeddings x 0.3 (with the tied output projection, the
    last token otherwise wins every step) and <|endoftext|> pushed up by ~3 logits along the
    final LayerNorm's bias. `generation`: fields of generation_config.json to change."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    kw = dict(SMALL, pad_token_id=EOT, bos_token_id=EOT, eos_token_id=EOT,
              decoder_start_token_id=SOT, begin_suppress_tokens=[BLANK, EOT],
              suppress_tokens=generation_config(multilingual)["suppress_tokens"])
    kw.update(overrides)
    cfg = WhisperConfig(**kw)
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(cfg).eval()
    randomise(model, EOT, seed)
    with torch.no_grad():
        for layer in model.model.decoder.layers:
            layer.encoder_attn.q_proj.weight.mul_(3.0)
            layer.encoder_attn.out_proj.weight.mul_(3.0)
        emb = model.model.decoder.embed_tokens.weight
        emb.mul_(0.3)
        b = model.model.decoder.layer_norm.bias
        emb[EOT] += 3.0 * b / (b @ b)
        if not kw.get("tie_word_embeddings", True):
            model.proj_out.weight.copy_(torch.randn(model.proj_out.weight.shape,
                                                    generator=torch.Generator().manual_seed(
                                                        seed + 1)) * 0.3)
    if dtype == "float16":
        model = model.half()
    model.save_pretrained(path)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump(dict(generation_config(multilingual), **(generation or {})), f, indent=2)
    return kw


def features(rng, batch, n_mels=80, frames=300):
    """Log-mel-like input features (B, n_mels, frames) float32: a per-clip spectral profile,
    slow per-bin oscillations and noise (white noise alone gives every clip the same encoder
    average: the same decoding)."""
    t = np.linspace(0, 1, frames)
    profile = 1.5 * rng.standard_normal((batch, n_mels, 1))
    wave = np.sin(2 * np.pi * (rng.uniform(0.5, 3, (batch, n_mels, 1)) * t
                               + rng.uniform(0, 1, (batch, n_mels, 1))))
    return (profile + wave + 0.5 * rng.standard_normal((batch, n_mels, frames))).astype(
        np.float32)


def load_hf(path):
    """transformers' model of the folder (eval), with the folder's generation config."""
    from transformers import WhisperForConditionalGeneration
    return WhisperForConditionalGeneration.from_pretrained(path).eval()


def hf_generate(model, feats, **kw):
    """transformers' WhisperForConditionalGeneration.generate on these features -> int64."""
    import torch
    if "prompt_ids" in kw and kw["prompt_ids"] is not None:
        kw["prompt_ids"] = torch.as_tensor(np.asarray(kw["prompt_ids"]), dtype=torch.long)
    with torch.no_grad():
        out = model.generate(torch.from_numpy(feats), **kw)
    if isinstance(out, dict) or hasattr(out, "sequences"):
        out = out["sequences"]
    return out.numpy().astype(np.int64)


def special_tokens():
    """The special tokens' strings by id (<|endoftext|> ... <|notimestamps|>, the timestamps)."""
    names = {EOT: "<|endoftext|>", SOT: "<|startoftranscript|>", TRANSLATE: "<|translate|>",
             TRANSCRIBE: "<|transcribe|>", STARTOFLM: "<|startoflm|>",
             STARTOFPREV: "<|startofprev|>", NOSPEECH: "<|nospeech|>",
             NOTIMESTAMPS: "<|notimestamps|>"}
    names.update({v: k for k, v in LANG_IDS.items()})
    for i in range(N_TIMESTAMPS):
        names[NOTIMESTAMPS + 1 + i] = f"<|{i * 0.02:.2f}|>"
    return names


def write_tokenizer(path):
    """A tokenizer.json for the small vocabulary: text token i is the word 'w<i>' (decoded
    with spaces between words), the special tokens as Whisper's (skipped when decoding)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    vocab = {f"w{i}": i for i in range(TEXT)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.decoder = decoders.WordPiece(prefix="##")          # words joined by spaces
    names = special_tokens()
    tk.add_special_tokens([AddedToken(names[i], special=True, normalized=False)
                           for i in sorted(names)])
    assert all(tk.token_to_id(n) == i for i, n in names.items())
    tk.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "WhisperTokenizer", "model_max_length": 1024}, f)


def speech_like(seconds, seed=0, sr=16000):
    """Audio (float32, 16 kHz) that the random tiny models decode into varied segments:
    bursts of harmonic tones whose pitch glides, with pauses of noise between them."""
    rng = np.random.default_rng(seed)
    n = int(seconds * sr)
    out = 0.003 * rng.standard_normal(n)
    t = 0
    while t < n:
        burst = int(rng.uniform(0.3, 1.4) * sr)
        f0 = rng.uniform(90, 260)
        glide = rng.uniform(-60, 60)
        k = np.arange(min(burst, n - t)) / sr
        phase = 2 * np.pi * (f0 * k + 0.5 * glide * k ** 2)
        env = np.sin(np.pi * np.arange(k.size) / max(k.size, 1)) ** 2
        sig = sum(rng.uniform(0.2, 1.0) / h * np.sin(h * phase) for h in range(1, 6))
        out[t:t + k.size] += 0.3 * env * sig
        t += burst + int(rng.uniform(0.1, 0.8) * sr)
    return out.astype(np.float32)
