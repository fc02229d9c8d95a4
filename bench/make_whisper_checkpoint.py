"""Write a random Whisper of a published shape (tiny or base), with a Whisper-shaped tokenizer and
its CTranslate2 conversions, for bench/bench_whisper.py. No download: the weights are random,
the tokenizer is a byte-level BPE trained here on made-up words.

    python bench/make_whisper_checkpoint.py OUT --shape tiny|base [--english-only] [--no-ct2]

OUT/hf             config.json, model.safetensors (float32), generation_config.json shaped as
                   openai/whisper-tiny's (whisper-tiny.en's with --english-only), tokenizer.json,
                   tokenizer_config.json, preprocessor_config.json: what fastattn's Transcriber
                   and transformers read
OUT/ct2-float32    TransformersConverter(OUT/hf).convert(..., quantization="float32")
OUT/ct2-int8       the same with quantization="int8"; both with tokenizer.json and
                   preprocessor_config.json, so that faster_whisper.WhisperModel(folder) loads them

The vocabulary is laid out as Whisper's: text tokens 0 .. 50255 (the first 256 are the bytes in
GPT-2's order, so that 220 is the blank " "), in the multilingual layout 50256 the empty token ""
(CTranslate2 tells a multilingual Whisper by it), then <|endoftext|>,
<|startoftranscript|>, the 99 languages, <|translate|>, <|transcribe|>, <|startoflm|>,
<|startofprev|>, <|nospeech|>, <|notimestamps|>, then the 1501 timestamps <|0.00|> .. <|30.00|>
(51865 tokens; 51864 English-only).

Weights: matrices and convolutions N(0, 1/fan_in), LayerNorm weights 1 + N(0, 0.09), biases
N(0, 0.04), the encoder's sinusoids as transformers makes them (as
tests/models/seq2seq_checkpoints.randomise). Unlike the small test models, a published shape
decodes the same token at every step with these alone (random biases and GELU's mean add one
vector at every position, and the encoder's frames all look alike), so: each residual branch's
output bias is shifted so that the residual stream has zero mean over the positions of a
calibration input (speech-like tones; random tokens), and the token-embedding and position scales
and the timestamp and <|endoftext|> logits are set per shape (SCALES) so that windows hold a few
segments and end (the raised logits: a row of the tied output projection moved along the final
LayerNorm's bias b by x * b / (b @ b) gets x more logit at every step, as in
tests/models/whisper_checkpoints.make_checkpoint).
"""
import argparse
import json
import os
import shutil
import sys
import time

import numpy as np

SHAPES = {   # the published configs' sizes
    "tiny": dict(d_model=384, encoder_layers=4, decoder_layers=4, encoder_attention_heads=6,
                 decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536),
    "base": dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                 decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048),
}
# generation_config.json's alignment_heads of openai/whisper-{tiny,base}[.en]
ALIGNMENT_HEADS = {
    ("tiny", True): [[2, 2], [3, 0], [3, 2], [3, 3], [3, 4], [3, 5]],
    ("tiny", False): [[1, 0], [2, 0], [2, 5], [3, 0], [3, 1], [3, 2], [3, 3], [3, 4]],
    ("base", True): [[3, 1], [4, 2], [4, 3], [4, 7], [5, 1], [5, 2], [5, 4], [5, 6]],
    ("base", False): [[3, 3], [4, 7], [5, 1], [5, 5], [5, 7]],
}
# Whisper's 99 language codes in token order (<|en|> first)
LANGUAGES = """en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu
ta no th ur hr bg lt la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw gl
mr pa si km sn yo so af oc ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl mg as tt
haw ln ha ba jw su""".split()
assert len(LANGUAGES) == 99
# the logits' spread (token embeddings N(0, logit_scale**2 / d_model): the output projection is
# tied to them), the decoder's positions N(0, position_scale**2), and logits added to every
# timestamp and to <|endoftext|>: found by trying, so that on a minute of espeak-ng speech the
# windows end after ~100-200 tokens (tiny: 144, 130, 72, 9 generated over 63 s; base: 220, 108,
# 141), hold a few segments each, and the text is not repetitive (compression ratio ~1.8; the
# average log-probability is near -1, so some windows take the temperature fallback)
SCALES = {"tiny": dict(logit_scale=5.9, position_scale=2.0, timestamp_logit=2.0, eot_logit=8.0),
          "base": dict(logit_scale=5.9, position_scale=2.0, timestamp_logit=2.0, eot_logit=10.0)}
N_TIMESTAMPS = 1501                      # <|0.00|> .. <|30.00|>
# the text-token ids of the real generation configs' suppress_tokens (punctuation, symbols);
# the special ids are appended per vocabulary
SUPPRESS_TEXT = {
    True: [1, 2, 7, 8, 9, 10, 14, 25, 26, 27, 28, 29, 31, 58, 59, 60, 61, 62, 63, 90, 91, 92, 93,
           359, 503, 522, 542, 873, 893, 902, 918, 922, 931, 1350, 1853, 1982, 2460, 2627, 3246,
           3253, 3268, 3536, 3846, 3961, 4183, 4667, 6585, 6647, 7273, 9061, 9383, 10428, 10929,
           11938, 12033, 12331, 12562, 13793, 14157, 14635, 15265, 15618, 16553, 16604, 18362,
           18956, 20075, 21675, 22520, 26130, 26161, 26435, 28279, 29464, 31650, 32302, 32470,
           36865, 42863, 47425, 49870, 50254],
    False: [1, 2, 7, 8, 9, 10, 14, 25, 26, 27, 28, 29, 31, 58, 59, 60, 61, 62, 63, 90, 91, 92,
            93, 357, 366, 438, 532, 685, 705, 796, 930, 1058, 1220, 1267, 1279, 1303, 1343, 1377,
            1391, 1635, 1782, 1875, 2162, 2361, 2488, 3467, 4008, 4211, 4600, 4808, 5299, 5855,
            6329, 7203, 9609, 9959, 10563, 10786, 11420, 11709, 11907, 13163, 13697, 13700, 14808,
            15306, 16410, 16791, 17992, 19203, 19510, 20724, 22305, 22935, 27007, 30109, 30420,
            33409, 34949, 40283, 40493, 40549, 47282, 49146],
}


def special_tokens(multilingual=True):
    """{id: string} of the special tokens, Whisper's order and ids."""
    eot = 50257 if multilingual else 50256
    names = ["<|endoftext|>", "<|startoftranscript|>"] + [f"<|{c}|>" for c in LANGUAGES] + [
        "<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>",
        "<|notimestamps|>"] + [f"<|{i * 0.02:.2f}|>" for i in range(N_TIMESTAMPS)]
    return {eot + i: n for i, n in enumerate(names)}


def ids(multilingual=True):
    """The special ids by name: eot, sot, translate, transcribe, ... and the vocabulary size."""
    inv = {n: i for i, n in special_tokens(multilingual).items()}
    out = {k: inv[f"<|{k}|>"] for k in ("endoftext", "startoftranscript", "translate",
                                        "transcribe", "startoflm", "startofprev", "nospeech",
                                        "notimestamps")}
    out["vocab_size"] = max(inv.values()) + 1
    out["lang_to_id"] = {f"<|{c}|>": inv[f"<|{c}|>"] for c in LANGUAGES}
    return out


def generation_config(shape, multilingual=True):
    """A generation_config.json dict shaped as openai/whisper-<shape>'s (or <shape>.en's)."""
    t = ids(multilingual)
    eot = t["endoftext"]
    g = {
        "alignment_heads": ALIGNMENT_HEADS[(shape, multilingual)],
        "begin_suppress_tokens": [220, eot],
        "bos_token_id": eot,
        "decoder_start_token_id": t["startoftranscript"],
        "eos_token_id": eot,
        "pad_token_id": eot,
        "max_initial_timestamp_index": 50,
        "max_length": 448,
        "no_timestamps_token_id": t["notimestamps"],
        "prev_sot_token_id": t["startofprev"],
        "return_timestamps": False,
        "suppress_tokens": SUPPRESS_TEXT[multilingual] + [
            t["startoftranscript"], t["translate"], t["transcribe"], t["startoflm"],
            t["startofprev"], t["nospeech"]],
        "is_multilingual": multilingual,
        "transformers_version": "4.31.0.dev0",
    }
    if multilingual:
        g["lang_to_id"] = t["lang_to_id"]
        g["task_to_id"] = {"transcribe": t["transcribe"], "translate": t["translate"]}
        g["forced_decoder_ids"] = [[1, None], [2, t["transcribe"]]]
    else:
        g["forced_decoder_ids"] = [[1, t["notimestamps"]]]
    return g


# -- the tokenizer ---------------------------------------------------------------------------------

def _byte_alphabet():
    """GPT-2's 256 byte characters in GPT-2's id order (printable bytes first, then the others
    mapped to U+0100 ...): id 220 is 'Ġ', the blank."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, n = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in printable] + [chars[b] for b in range(256) if b not in printable]


def _made_up_words(seed=0, n_words=400_000):
    """Lines of made-up words (syllables), Zipf-like counts: enough distinct words for a
    byte-level BPE to learn ~50000 merges."""
    rng = np.random.default_rng(seed)
    onsets = ("b c d f g h j k l m n p r s t v w y z bl br ch cl cr dr fl fr gl gr pl pr sc sh sk "
              "sl sm sn sp st str th tr wh").split()
    vowels = "a e i o u ai ea ee oo ou ie oa".split()
    codas = ["", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "st", "ck", "rt", "ll", "sh"]
    syllables = [o + v + c for o in onsets for v in vowels for c in codas]
    lengths = rng.integers(1, 4, n_words)
    words = ["".join(syllables[j] for j in rng.integers(0, len(syllables), k)) for k in lengths]
    counts = np.minimum((2000 / np.arange(1, n_words + 1) ** 0.9).astype(int) + 1, 50)
    line = []
    for w, c in zip(words, counts):
        line.extend([w] * int(c))
        if len(line) > 200:
            yield " ".join(line)
            line = []
    yield " ".join(line)


def write_tokenizer(folder, multilingual=True, corpus=()):
    """tokenizer.json (a byte-level BPE with Whisper's special tokens and ids) and a
    tokenizer_config.json naming WhisperTokenizer. `corpus`: lines of real text learnt before
    the made-up words (bench/train_whisper.py's English)."""
    import itertools
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    n_text = 50257 if multilingual else 50256
    alphabet = _byte_alphabet()
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=50256, initial_alphabet=alphabet,
                                  show_progress=False)
    tk.train_from_iterator(itertools.chain(corpus, _made_up_words()), trainer)
    learnt = json.loads(tk.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learnt["merges"]]
    # the bytes at GPT-2's ids, then the merged tokens in the order they were learnt
    vocab = {c: i for i, c in enumerate(alphabet)}
    for tok, _ in sorted(learnt["vocab"].items(), key=lambda kv: kv[1]):
        if tok not in vocab:
            vocab[tok] = len(vocab)
    if multilingual:
        # the multilingual vocabulary's last text token is the empty string: CTranslate2
        # (4.7 on) tells a multilingual Whisper by it (src/models/whisper.cc, to_id(""))
        vocab[""] = len(vocab)
    if len(vocab) != n_text:
        raise RuntimeError(f"the BPE learnt {len(vocab)} text tokens, not {n_text}")
    out = Tokenizer(models.BPE(vocab, merges))
    out.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    out.decoder = decoders.ByteLevel()
    names = special_tokens(multilingual)
    timestamps = {i for i, n in names.items() if n[2:-2].replace(".", "").isdigit()}
    # as openai/whisper-*'s tokenizer.json: the timestamps are added but not "special"
    out.add_tokens([AddedToken(names[i], special=i not in timestamps, normalized=False)
                    for i in sorted(names)])
    wrong = {i: n for i, n in names.items() if out.token_to_id(n) != i}
    if wrong:
        raise RuntimeError(f"special tokens at the wrong ids: {list(wrong.items())[:3]}")
    out.save(os.path.join(folder, "tokenizer.json"))
    eot = names[n_text]
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "WhisperTokenizer", "model_max_length": 1024,
                   "bos_token": eot, "eos_token": eot, "unk_token": eot, "pad_token": eot,
                   "add_prefix_space": False, "errors": "replace"}, f, indent=2)


def write_preprocessor(folder):
    """preprocessor_config.json as openai/whisper-tiny's (80 mel bins, 30 s windows)."""
    with open(os.path.join(folder, "preprocessor_config.json"), "w") as f:
        json.dump({"chunk_length": 30, "feature_extractor_type": "WhisperFeatureExtractor",
                   "feature_size": 80, "hop_length": 160, "n_fft": 400, "n_samples": 480000,
                   "nb_max_frames": 3000, "padding_side": "right", "padding_value": 0.0,
                   "processor_class": "WhisperProcessor", "return_attention_mask": False,
                   "sampling_rate": 16000}, f, indent=2)


# -- the weights -----------------------------------------------------------------------------------

def _calibration_audio(seconds=30.0, seed=0):
    """Speech-like audio (float32, 16 kHz): bursts of harmonic tones whose pitch glides, with
    pauses of noise between them (tests/models/whisper_checkpoints.speech_like)."""
    rng = np.random.default_rng(seed)
    n = int(seconds * 16000)
    out = 0.003 * rng.standard_normal(n)
    t = 0
    while t < n:
        burst = int(rng.uniform(0.3, 1.4) * 16000)
        f0, glide = rng.uniform(90, 260), rng.uniform(-60, 60)
        k = np.arange(min(burst, n - t)) / 16000
        phase = 2 * np.pi * (f0 * k + 0.5 * glide * k ** 2)
        env = np.sin(np.pi * np.arange(k.size) / max(k.size, 1)) ** 2
        out[t:t + k.size] += 0.3 * env * sum(rng.uniform(0.2, 1.0) / h * np.sin(h * phase)
                                             for h in range(1, 6))
        t += burst + int(rng.uniform(0.1, 0.8) * 16000)
    return out.astype(np.float32)


def _centre(layers, forward):
    """Run `forward` once with hooks that shift the output bias of every residual branch
    (self-attention, cross-attention, feed-forward) so that the residual stream after it has
    zero mean over the positions seen: random biases and GELU's positive mean otherwise add
    the same vector at every position, which swamps what varies (the audio, the tokens, the
    positions) and makes every step decode the same token."""
    import torch
    handles, residual = [], {}
    for layer in layers:
        branches = [("self_attn_layer_norm", layer.self_attn.out_proj),
                    ("encoder_attn_layer_norm", getattr(layer, "encoder_attn", None)),
                    ("final_layer_norm", layer.fc2)]
        for norm, out in branches:
            if out is None:
                continue
            out = getattr(out, "out_proj", out)
            key = id(out)

            def before(module, args, key=key):
                residual[key] = args[0]

            def after(module, args, output, key=key):
                shift = (residual[key] + output).mean(dim=(0, 1))
                with torch.no_grad():
                    module.bias.sub_(shift)
                return output - shift
            handles.append(getattr(layer, norm).register_forward_pre_hook(before))
            handles.append(out.register_forward_hook(after))
    try:
        with torch.no_grad():
            forward()
    finally:
        for h in handles:
            h.remove()


def _randomise(model, t, seed, *, logit_scale, position_scale, timestamp_logit, eot_logit):
    """Unit-scale random weights, the residual branches centred on speech-like audio and random
    tokens (_centre), the token embeddings and decoder positions at the given scales, and the
    timestamp and <|endoftext|> logits raised by the given amounts (see SCALES)."""
    import torch
    from transformers import WhisperFeatureExtractor
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name and not p.requires_grad:
                continue                                     # the encoder's fixed sinusoids
            if p.ndim >= 2 and "embed" not in name:          # linear and conv weights
                p.copy_(torch.randn(p.shape, generator=g) / np.sqrt(p[0].numel()))
            elif "layer_norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            elif p.ndim == 1:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(logit_scale / np.sqrt(p.shape[1]) * torch.randn(p.shape, generator=g))
            else:                                            # the decoder's positions
                p.copy_(position_scale * torch.randn(p.shape, generator=g))
    feats = WhisperFeatureExtractor(feature_size=model.config.num_mel_bins)(
        _calibration_audio(), sampling_rate=16000, return_tensors="pt").input_features
    _centre(model.model.encoder.layers, lambda: model.model.encoder(feats))
    with torch.no_grad():
        memory = model.model.encoder(feats).last_hidden_state
    rng = np.random.default_rng(seed)
    n = model.config.max_target_positions
    tokens = torch.as_tensor(rng.integers(0, t["endoftext"], (4, n)))
    memory = memory.expand(len(tokens), -1, -1)
    _centre(model.model.decoder.layers,
            lambda: model.model.decoder(input_ids=tokens, encoder_hidden_states=memory))
    with torch.no_grad():
        # the output projection is tied to the embeddings; along the final LayerNorm's bias b,
        # a row moved by x * b / (b @ b) gets x more logit at every step
        b = model.model.decoder.layer_norm.bias
        emb = model.model.decoder.embed_tokens.weight
        emb[t["endoftext"]] += eot_logit * b / (b @ b)
        emb[t["notimestamps"] + 1:] += timestamp_logit * b / (b @ b)


def write_hf(folder, shape="tiny", multilingual=True, seed=0, tokenizer=True, **scales):
    """The Hugging Face folder: weights (save_pretrained, float32), generation config,
    tokenizer (unless tokenizer=False), preprocessor config. `scales`: _randomise's keywords,
    SCALES[shape] by default."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    os.makedirs(folder, exist_ok=True)
    t = ids(multilingual)
    gen = generation_config(shape, multilingual)
    eot = t["endoftext"]
    cfg = WhisperConfig(vocab_size=t["vocab_size"], num_mel_bins=80, max_source_positions=1500,
                        max_target_positions=448, pad_token_id=eot, bos_token_id=eot,
                        eos_token_id=eot, decoder_start_token_id=t["startoftranscript"],
                        begin_suppress_tokens=gen["begin_suppress_tokens"],
                        suppress_tokens=gen["suppress_tokens"], **SHAPES[shape])
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(cfg).eval()
    _randomise(model, t, seed, **dict(SCALES[shape], **scales))
    model.save_pretrained(folder)
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    if tokenizer:
        write_tokenizer(folder, multilingual)
    write_preprocessor(folder)


def write_ct2(hf_folder, out, quantization):
    """CTranslate2's conversion (what faster-whisper loads), with the tokenizer and the
    preprocessor config beside it."""
    from ctranslate2.converters import TransformersConverter
    TransformersConverter(hf_folder).convert(out, quantization=quantization, force=True)
    for name in ("tokenizer.json", "preprocessor_config.json"):
        shutil.copy(os.path.join(hf_folder, name), os.path.join(out, name))


def write(out, shape="tiny", multilingual=True, ct2=True, seed=0, log=print):
    """OUT/hf, and OUT/ct2-float32 + OUT/ct2-int8 unless ct2 is False; a folder that is
    already complete is kept."""
    hf = os.path.join(out, "hf")
    if not os.path.exists(os.path.join(hf, "preprocessor_config.json")):
        t0 = time.perf_counter()
        write_hf(hf, shape, multilingual, seed)
        log(f"# wrote {hf} ({time.perf_counter() - t0:.1f} s)")
    if ct2:
        for q in ("float32", "int8"):
            folder = os.path.join(out, f"ct2-{q}")
            if not os.path.exists(os.path.join(folder, "preprocessor_config.json")):
                t0 = time.perf_counter()
                write_ct2(hf, folder, q)
                log(f"# wrote {folder} ({time.perf_counter() - t0:.1f} s)")
    return hf


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--shape", choices=list(SHAPES), default="tiny")
    ap.add_argument("--english-only", action="store_true",
                    help="the .en layout (vocabulary 51864, no lang_to_id)")
    ap.add_argument("--no-ct2", action="store_true", help="skip the CTranslate2 conversions")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    write(args.out, args.shape, not args.english_only, not args.no_ct2, args.seed,
          log=lambda s: print(s, file=sys.stderr))


if __name__ == "__main__":
    main()
